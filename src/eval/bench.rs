//! `sala bench`: llama-bench's test matrix on one or more models. A test is prompt processing
//! (`pp512`: 512 tokens in prefill chunks) or text generation (`tg128`: 128 single-token steps),
//! each at a depth (`@ d4096`: tokens already in the cache, put there untimed). Every test runs
//! once to warm up, then `repetitions` times on a fresh cache; only the forward passes and the
//! device synchronisation after each are timed — no tokenization, no sampling (random token ids
//! go in). Generation can also be measured for several sequences decoded together (`tg128 x8`,
//! aggregate tokens/s) and as real greedy generation, plain or self-speculative (`tg128 greedy`,
//! `tg128 draft 8/4`), where every token is read back and checked for a stop as `sala run` does.

use crate::engine::error::{Error, Result};
use crate::engine::cache::ModelCache;
use crate::engine::generate::{decode_pipelined, extend, generate, Draft, Flow, GenerateOptions};
use crate::engine::sampler::{Sampler, SamplingParams};
use crate::engine::model::LanguageModel;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use std::time::Instant;

/// What a benchmark measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Test {
    Prompt(usize),
    Generate(usize, Decode),
}

/// How a generation test decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Decode {
    /// `seqs` sequences decoded together (one batched forward a step), random tokens in, the
    /// next step's graph built while the device runs the last: llama-bench's tg.
    Pipelined { seqs: usize },
    /// Greedy generation as `sala run` does it (every token read back and checked for a stop;
    /// plain greedy picks tokens on the device and runs one step ahead), self-speculative with
    /// a draft of `draft_layers` layers guessing `num_draft` tokens ahead when `draft_layers` > 0.
    Greedy { draft_layers: usize, num_draft: usize },
}

impl Decode {
    fn seqs(self) -> usize {
        match self {
            Decode::Pipelined { seqs } => seqs,
            Decode::Greedy { .. } => 1,
        }
    }
}

#[derive(Debug, Clone)]
pub struct BenchPlan {
    pub prompts: Vec<usize>,
    pub generations: Vec<usize>,
    pub depths: Vec<usize>,
    pub repetitions: usize,
    pub prefill_step: usize,
    /// Sequences decoded together in the pipelined generation tests.
    pub seqs: Vec<usize>,
    /// Greedy generation tests: draft layers (0 = plain greedy generation).
    pub draft_layers: Vec<usize>,
    pub num_draft: usize,
}

impl BenchPlan {
    /// Every test in the order llama-bench runs them: all pp, then all tg, each across depths.
    pub fn tests(&self) -> Vec<(Test, usize)> {
        let decodes: Vec<Decode> = self
            .seqs
            .iter()
            .map(|&seqs| Decode::Pipelined { seqs })
            .chain(self.draft_layers.iter().map(|&draft_layers| Decode::Greedy { draft_layers, num_draft: self.num_draft }))
            .collect();
        let tests = self.prompts.iter().filter(|&&p| p > 0).map(|&p| Test::Prompt(p));
        let generations = self.generations.iter().filter(|&&n| n > 0);
        let tests = tests.chain(generations.flat_map(|&n| decodes.iter().map(move |&d| Test::Generate(n, d))));
        tests.flat_map(|t| self.depths.iter().map(move |&d| (t, d))).collect()
    }

    /// The most tokens any test puts in one sequence's cache.
    pub fn max_tokens(&self) -> usize {
        self.tests().iter().map(|&(t, d)| d + t.tokens()).max().unwrap_or(0)
    }

    /// The most tokens any test keeps in its caches together (batched tests hold several).
    pub fn max_cached_tokens(&self) -> usize {
        self.tests().iter().map(|&(t, d)| (d + t.tokens()) * t.seqs()).max().unwrap_or(0)
    }
}

impl Test {
    /// Tokens each sequence goes through.
    fn tokens(self) -> usize {
        match self {
            Test::Prompt(p) => p,
            Test::Generate(n, _) => n,
        }
    }

    fn seqs(self) -> usize {
        match self {
            Test::Prompt(_) => 1,
            Test::Generate(_, d) => d.seqs(),
        }
    }
}

/// The model a row is about (llama-bench's model columns).
#[derive(Debug, Clone, Serialize)]
pub struct ModelMeta {
    pub model_filename: String,
    pub model_type: String,
    /// Bytes of the weights as loaded.
    pub model_size: u64,
    pub n_params: usize,
    pub backend: String,
    pub dtype: String,
}

/// One test's result.
#[derive(Debug, Clone)]
pub struct BenchRow {
    pub model: ModelMeta,
    pub test: Test,
    pub depth: usize,
    pub n_batch: usize,
    pub samples_ns: Vec<u64>,
    /// Peak device memory during the timed runs.
    pub peak_mem: u64,
    /// Speculative tests: the fraction of drafted tokens accepted over the timed runs.
    pub acceptance: Option<f64>,
}

impl BenchRow {
    pub fn n_prompt(&self) -> usize {
        match self.test {
            Test::Prompt(p) => p,
            Test::Generate(..) => 0,
        }
    }

    pub fn n_gen(&self) -> usize {
        match self.test {
            Test::Prompt(_) => 0,
            Test::Generate(n, _) => n,
        }
    }

    /// Sequences decoded together.
    pub fn n_seq(&self) -> usize {
        self.test.seqs()
    }

    /// The speculative draft (layers, tokens ahead) of a greedy test; (0, 0) for plain greedy.
    pub fn draft(&self) -> Option<(usize, usize)> {
        match self.test {
            Test::Generate(_, Decode::Greedy { draft_layers: 0, .. }) => Some((0, 0)),
            Test::Generate(_, Decode::Greedy { draft_layers, num_draft }) => Some((draft_layers, num_draft)),
            _ => None,
        }
    }

    /// `pp512`, `tg128 @ d4096`, `tg128 x8`, `tg128 greedy`, `tg128 draft 8/4`.
    pub fn name(&self) -> String {
        let base = match self.test {
            Test::Prompt(p) => format!("pp{p}"),
            Test::Generate(n, Decode::Pipelined { seqs: 1 }) => format!("tg{n}"),
            Test::Generate(n, Decode::Pipelined { seqs }) => format!("tg{n} x{seqs}"),
            Test::Generate(n, Decode::Greedy { draft_layers: 0, .. }) => format!("tg{n} greedy"),
            Test::Generate(n, Decode::Greedy { draft_layers, num_draft }) => format!("tg{n} draft {draft_layers}/{num_draft}"),
        };
        if self.depth > 0 {
            format!("{base} @ d{}", self.depth)
        } else {
            base
        }
    }

    /// Tokens per second, all sequences together.
    pub fn samples_ts(&self) -> Vec<f64> {
        let tokens = ((self.n_prompt() + self.n_gen()) * self.n_seq()) as f64;
        self.samples_ns.iter().map(|&ns| tokens * 1e9 / ns.max(1) as f64).collect()
    }

    pub fn avg_ts(&self) -> f64 {
        mean(&self.samples_ts())
    }

    pub fn stddev_ts(&self) -> f64 {
        stddev(&self.samples_ts())
    }

    pub fn avg_ns(&self) -> f64 {
        mean(&self.samples_ns.iter().map(|&n| n as f64).collect::<Vec<_>>())
    }

    pub fn stddev_ns(&self) -> f64 {
        stddev(&self.samples_ns.iter().map(|&n| n as f64).collect::<Vec<_>>())
    }
}

pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Sample standard deviation (n − 1), 0 for fewer than two samples — as llama-bench.
pub fn stddev(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let m = mean(xs);
    (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (xs.len() - 1) as f64).sqrt()
}

/// Runs one test: a warm-up, then `plan.repetitions` timed runs. `on_run` is called after each run.
pub fn run_test(
    model: &dyn LanguageModel,
    meta: &ModelMeta,
    plan: &BenchPlan,
    test: Test,
    depth: usize,
    mut on_run: impl FnMut(),
) -> Result<BenchRow> {
    let info = model.info();
    let needed = depth + test.tokens();
    if needed > info.max_context {
        return Err(Error::ContextOverflow { prompt_tokens: needed, limit: info.max_context });
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5a1a);
    let mut random = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..info.vocab_size as u32)).collect() };
    let mut samples_ns = Vec::with_capacity(plan.repetitions);
    let mut peak_mem = 0u64;
    let (mut drafted, mut accepted) = (0, 0);
    for run in 0..=plan.repetitions {
        let mut caches = Vec::with_capacity(test.seqs());
        for _ in 0..test.seqs() {
            let mut cache = model.new_cache();
            extend(model, &mut cache, &random(depth), plan.prefill_step)?;
            caches.push(cache);
        }
        let tokens = random((needed - depth) * test.seqs());
        let _ = mlx_rs::memory::reset_peak_memory();
        let start = Instant::now();
        match test {
            Test::Prompt(_) => extend(model, &mut caches[0], &tokens, plan.prefill_step)?,
            // One forward per token; the next step's graph is built while the device runs the
            // previous one, as mlx-lm's generate loop does.
            Test::Generate(_, Decode::Pipelined { seqs }) => {
                let steps: Vec<&[u32]> = tokens.chunks(seqs).collect();
                decode_pipelined(model, &mut caches.iter_mut().collect::<Vec<_>>(), &steps)?;
            }
            Test::Generate(n, Decode::Greedy { draft_layers, num_draft }) => {
                let (d, a) = generate_greedy(model, &mut caches[0], tokens[0], n, draft_layers, num_draft)?;
                if run > 0 {
                    (drafted, accepted) = (drafted + d, accepted + a);
                }
            }
        }
        let elapsed = start.elapsed().as_nanos() as u64;
        // Run 0 warms up (kernel compilation, allocator) and is not counted.
        if run > 0 {
            samples_ns.push(elapsed);
            peak_mem = peak_mem.max(mlx_rs::memory::peak_memory().unwrap_or(0) as u64);
        }
        on_run();
    }
    let acceptance = (drafted > 0).then(|| accepted as f64 / drafted as f64);
    Ok(BenchRow { model: meta.clone(), test, depth, n_batch: plan.prefill_step, samples_ns, peak_mem, acceptance })
}

/// Greedy generation of `n` tokens after `first` (its forward call included), self-speculative
/// when `draft_layers` > 0; returns the tokens drafted and accepted.
fn generate_greedy(
    model: &dyn LanguageModel,
    cache: &mut ModelCache,
    first: u32,
    n: usize,
    draft_layers: usize,
    num_draft: usize,
) -> Result<(usize, usize)> {
    let draft = (draft_layers > 0).then_some(Draft { layers: draft_layers, tokens: num_draft });
    let opts = GenerateOptions { max_tokens: n, ignore_eos: true, draft, ..Default::default() };
    let mut sampler = Sampler::new(SamplingParams { temperature: 0.0, ..Default::default() });
    let g = generate(model, cache, &[first], &mut sampler, &opts, |_, _| {}, |_| Flow::Continue)?;
    Ok((g.stats.draft_tokens, g.stats.accepted_tokens))
}
