//! `sala bench`: llama-bench's test matrix on one or more models. A test is prompt processing
//! (`pp512`: 512 tokens in prefill chunks) or text generation (`tg128`: 128 single-token steps),
//! each at a depth (`@ d4096`: tokens already in the cache, put there untimed). Every test runs
//! once to warm up, then `repetitions` times on a fresh cache; only the forward passes and the
//! device synchronisation after each are timed — no tokenization, no sampling (random token ids
//! go in).

use crate::engine::error::{Error, Result};
use crate::engine::generate::{decode_pipelined, extend};
use crate::engine::model::LanguageModel;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use std::time::Instant;

/// What a benchmark measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Test {
    Prompt(usize),
    Generate(usize),
}

#[derive(Debug, Clone)]
pub struct BenchPlan {
    pub prompts: Vec<usize>,
    pub generations: Vec<usize>,
    pub depths: Vec<usize>,
    pub repetitions: usize,
    pub prefill_step: usize,
}

impl BenchPlan {
    /// Every test in the order llama-bench runs them: all pp, then all tg, each across depths.
    pub fn tests(&self) -> Vec<(Test, usize)> {
        let tests = self.prompts.iter().filter(|&&p| p > 0).map(|&p| Test::Prompt(p));
        let tests = tests.chain(self.generations.iter().filter(|&&n| n > 0).map(|&n| Test::Generate(n)));
        tests.flat_map(|t| self.depths.iter().map(move |&d| (t, d))).collect()
    }

    /// The most tokens any test puts in the cache.
    pub fn max_tokens(&self) -> usize {
        self.tests()
            .iter()
            .map(|&(t, d)| d + match t {
                Test::Prompt(p) => p,
                Test::Generate(n) => n,
            })
            .max()
            .unwrap_or(0)
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
}

impl BenchRow {
    pub fn n_prompt(&self) -> usize {
        match self.test {
            Test::Prompt(p) => p,
            Test::Generate(_) => 0,
        }
    }

    pub fn n_gen(&self) -> usize {
        match self.test {
            Test::Prompt(_) => 0,
            Test::Generate(n) => n,
        }
    }

    /// `pp512`, `tg128 @ d4096`.
    pub fn name(&self) -> String {
        let base = match self.test {
            Test::Prompt(p) => format!("pp{p}"),
            Test::Generate(n) => format!("tg{n}"),
        };
        if self.depth > 0 {
            format!("{base} @ d{}", self.depth)
        } else {
            base
        }
    }

    pub fn samples_ts(&self) -> Vec<f64> {
        let tokens = (self.n_prompt() + self.n_gen()) as f64;
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
    let needed = depth + match test {
        Test::Prompt(p) => p,
        Test::Generate(n) => n,
    };
    if needed > info.max_context {
        return Err(Error::ContextOverflow { prompt_tokens: needed, limit: info.max_context });
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5a1a);
    let mut random = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..info.vocab_size as u32)).collect() };
    let mut samples_ns = Vec::with_capacity(plan.repetitions);
    let mut peak_mem = 0u64;
    for run in 0..=plan.repetitions {
        let mut cache = model.new_cache();
        extend(model, &mut cache, &random(depth), plan.prefill_step)?;
        let tokens = random(needed - depth);
        let _ = mlx_rs::memory::reset_peak_memory();
        let start = Instant::now();
        match test {
            Test::Prompt(_) => extend(model, &mut cache, &tokens, plan.prefill_step)?,
            // One forward per token; the next step's graph is built while the device runs the
            // previous one, as mlx-lm's generate loop does.
            Test::Generate(_) => decode_pipelined(model, &mut cache, &tokens)?,
        }
        let elapsed = start.elapsed().as_nanos() as u64;
        // Run 0 warms up (kernel compilation, allocator) and is not counted.
        if run > 0 {
            samples_ns.push(elapsed);
            peak_mem = peak_mem.max(mlx_rs::memory::peak_memory().unwrap_or(0) as u64);
        }
        on_run();
    }
    Ok(BenchRow { model: meta.clone(), test, depth, n_batch: plan.prefill_step, samples_ns, peak_mem })
}
