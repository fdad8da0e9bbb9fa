//! `sala bench`: llama-bench's test matrix on one or more models. A test is prompt processing
//! (`pp512`: 512 tokens in prefill chunks) or text generation (`tg128`: 128 single-token steps),
//! each at a depth (`@ d4096`: tokens already in the cache, put there untimed). Every test runs
//! once to warm up, then `repetitions` times on a fresh cache; only the forward passes and the
//! device synchronisation after each are timed — no tokenization, no sampling (random token ids
//! go in). Generation can also be measured for several sequences decoded together (`tg128 x8`,
//! aggregate tokens/s), as `sala serve` and a sampled `sala run` generate (`tg128 served x8`:
//! tokens drawn on the device at temperature 0.8 and top-p 0.95, read back and checked for a
//! stop), and as real greedy generation, plain or self-speculative (`tg128 greedy`,
//! `tg128 draft 8/4`). The served rows are what users get; the pipelined rows are the engine's
//! ceiling, and the table gives each served row as a share of it.
//!
//! The grammar suite measures what constrained decoding costs: sequences decoded as the server
//! does it, free (`tg128 served x8`) and under a JSON grammar (`tg128 grammar x8`).
//!
//! The prefix-cache suite measures what a long document asked many questions costs: the time to
//! first token of a short follow-up after a `depth`-token prefix (`ttft64 @ d131072`), with the
//! prefix's state prefilled on the spot (cold), kept in memory by a [`PrefixCache`] (warm), and
//! read back from a prompt cache file with the page cache dropped (disk).

use crate::engine::error::{Error, Result};
use crate::engine::cache::ModelCache;
use crate::engine::step_profile::{self, DeviceTimes, HostTimes};
use crate::engine::generate::{decode_pipelined, extend, generate, next_batch, Decoding, Draft, Flow, GenerateOptions, Step};
use crate::engine::grammar::{Grammar, GrammarCompiler, Reasoning};
use crate::engine::prefix_cache::{PrefixCache, Start, Trail};
use crate::engine::state_file::{self, Fingerprint, StateFile};
use crate::engine::sampler::{Sampler, SamplingParams};
use crate::engine::model::LanguageModel;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::time::Instant;

/// What a benchmark measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Test {
    Prompt(usize),
    Generate(usize, Decode),
    /// The first token of a follow-up of this many tokens after the depth's prefix.
    FollowUp(usize, Prefix),
}

/// Where a follow-up's prefix state comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Prefix {
    /// Prefilled with the follow-up (no cache): what every request costs without one.
    Cold,
    /// Kept in memory by the prefix cache after a first question.
    Warm,
    /// Read from a prompt cache file, the file's pages dropped from the OS page cache first.
    Disk,
    /// Read from a prompt cache file still in the OS page cache (read recently).
    DiskCached,
}

impl Prefix {
    pub fn name(self) -> &'static str {
        match self {
            Prefix::Cold => "cold",
            Prefix::Warm => "warm",
            Prefix::Disk => "disk",
            Prefix::DiskCached => "disk-cached",
        }
    }
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
    /// `seqs` sequences decoded together as `sala serve` does ([`SERVED_SAMPLING`], drawn on the
    /// device, every token read back and checked for a stop), each held to [`bench_grammar`]
    /// when `constrained`: the cost of the token masks is the difference between the two.
    Served { seqs: usize, constrained: bool },
}

impl Decode {
    fn seqs(self) -> usize {
        match self {
            Decode::Pipelined { seqs } | Decode::Served { seqs, .. } => seqs,
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
    /// The prefix-cache suite: a follow-up of each prompt length after each depth above 0, each
    /// run cold, warm and from disk (instead of the pp/tg matrix).
    pub follow_ups: bool,
    /// The grammar suite: each generation length and sequence count decoded as the server does,
    /// free and under a grammar (instead of the pp/tg matrix).
    pub grammar: bool,
    /// Generation tests also report where the host's time went per step ([`StepHost`]).
    pub profile: bool,
}

impl BenchPlan {
    /// Every test in the order llama-bench runs them: all pp, then all tg, each across depths.
    pub fn tests(&self) -> Vec<(Test, usize)> {
        if self.follow_ups {
            let prompts = self.prompts.iter().filter(|&&p| p > 0);
            let depths = || self.depths.iter().filter(|&&d| d > 0);
            return prompts.flat_map(|&p| depths().map(move |&d| (Test::FollowUp(p, Prefix::Cold), d))).collect();
        }
        if self.grammar {
            let decodes: Vec<Decode> = self.seqs.iter().flat_map(|&seqs| [false, true].map(|constrained| Decode::Served { seqs, constrained })).collect();
            let generations = self.generations.iter().filter(|&&n| n > 0);
            let tests: Vec<Test> = generations.flat_map(|&n| decodes.iter().map(move |&d| Test::Generate(n, d))).collect();
            return tests.into_iter().flat_map(|t| self.depths.iter().map(move |&d| (t, d))).collect();
        }
        let decodes: Vec<Decode> = self
            .seqs
            .iter()
            .flat_map(|&seqs| [Decode::Pipelined { seqs }, Decode::Served { seqs, constrained: false }])
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
    /// The test's name in tables and progress: `pp512`, `tg128 @ d4096`, `tg128 x8`, `tg128
    /// served x8`, `tg128 greedy`, `tg128 draft 8/4`, `tg128 grammar x8`, `ttft64 @ d4096 warm`.
    pub fn name(self, depth: usize) -> String {
        let base = match self {
            Test::Prompt(p) => format!("pp{p}"),
            Test::Generate(n, Decode::Pipelined { seqs: 1 }) => format!("tg{n}"),
            Test::Generate(n, Decode::Pipelined { seqs }) => format!("tg{n} x{seqs}"),
            Test::Generate(n, Decode::Greedy { draft_layers: 0, .. }) => format!("tg{n} greedy"),
            Test::Generate(n, Decode::Greedy { draft_layers, num_draft }) => format!("tg{n} draft {draft_layers}/{num_draft}"),
            Test::Generate(n, Decode::Served { seqs, constrained }) => {
                format!("tg{n} {}{}", if constrained { "grammar" } else { "served" }, if seqs > 1 { format!(" x{seqs}") } else { String::new() })
            }
            Test::FollowUp(p, _) => format!("ttft{p}"),
        };
        let base = if depth > 0 { format!("{base} @ d{depth}") } else { base };
        match self {
            Test::FollowUp(_, from) => format!("{base} {}", from.name()),
            _ => base,
        }
    }

    /// Tokens each sequence goes through.
    fn tokens(self) -> usize {
        match self {
            Test::Prompt(p) | Test::FollowUp(p, _) => p,
            Test::Generate(n, _) => n,
        }
    }

    fn seqs(self) -> usize {
        match self {
            Test::Prompt(_) | Test::FollowUp(..) => 1,
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
    /// Follow-up tests: prompt tokens taken from the kept state, and what keeping it costs.
    pub reuse: Option<Reuse>,
    /// Profiled generation tests: the host's time per step.
    pub host: Option<StepHost>,
}

/// Where one decode step's time went on the host (a step advances every sequence of the test by
/// a token), over the timed runs; see `engine::step_profile`. The builder thread's time is its
/// building, its encoding where it encodes itself (included in `encode`), its other work
/// (drawing on the host, handing tokens out, grammar masks) and its waits, so `build + other`
/// near the wall time means the builder bounds the step, `encode` near it the evaluator, and
/// otherwise the device does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepHost {
    pub build_ms: f64,
    pub encode_ms: f64,
    pub other_ms: f64,
    pub blocked_ms: f64,
    /// The evaluator waiting for the device to compute a read (without one, the builder's
    /// waits are in `blocked_ms`).
    pub device_wait_ms: f64,
    /// Operations in a step's graphs, counted in the warm-up run.
    pub ops: f64,
    /// The device's own clock (CUDA; `None` elsewhere): its time a step from the step's first
    /// kernel to its last, and between one step's last kernel and the next one's first (idle,
    /// or running work outside the steps).
    pub device_ms: Option<f64>,
    pub device_gaps_ms: Option<f64>,
    /// The part of `device_ms` spent drawing tokens (served rows; `None` where nothing is drawn).
    pub device_draw_ms: Option<f64>,
}

impl StepHost {
    /// `spent` over `steps` steps of `wall_ns` in all; `counted` the warm-up run's totals over
    /// `warm_steps`.
    fn new(spent: HostTimes, device: Option<DeviceTimes>, wall_ns: u64, steps: usize, counted: HostTimes, warm_steps: usize) -> Self {
        let ms = |ns: u64| ns as f64 / 1e6 / steps.max(1) as f64;
        let other = wall_ns.saturating_sub(spent.build_ns + spent.blocked_ns + spent.builder_encode_ns);
        StepHost {
            build_ms: ms(spent.build_ns),
            encode_ms: ms(spent.encode_ns),
            other_ms: ms(other),
            blocked_ms: ms(spent.blocked_ns),
            device_wait_ms: ms(spent.device_wait_ns),
            ops: counted.ops as f64 / warm_steps.max(1) as f64,
            device_ms: device.map(|d| ms(d.busy_ns)),
            device_gaps_ms: device.map(|d| ms(d.gaps_ns)),
            device_draw_ms: device.filter(|d| d.tails > 0).map(|d| ms(d.tail_ns)),
        }
    }
}

/// What a follow-up reused.
#[derive(Debug, Clone, Copy)]
pub struct Reuse {
    /// Prompt tokens the kept state held (the rest were prefilled).
    pub cached_tokens: usize,
    /// Warm: bytes the prefix cache counts as held; disk: bytes of the file.
    pub kept_bytes: u64,
    /// Warm: growth of MLX's active memory while the prefix cache holds the state.
    pub measured_bytes: Option<u64>,
}

impl BenchRow {
    pub fn n_prompt(&self) -> usize {
        match self.test {
            Test::Prompt(p) | Test::FollowUp(p, _) => p,
            Test::Generate(..) => 0,
        }
    }

    pub fn n_gen(&self) -> usize {
        match self.test {
            Test::Prompt(_) | Test::FollowUp(..) => 0,
            Test::Generate(n, _) => n,
        }
    }

    /// The prefix state a follow-up test started from.
    pub fn prefix(&self) -> Option<Prefix> {
        match self.test {
            Test::FollowUp(_, from) => Some(from),
            _ => None,
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

    /// Pipelined decoding (llama-bench's tg, random tokens in).
    pub fn is_pipelined(&self) -> bool {
        matches!(self.test, Test::Generate(_, Decode::Pipelined { .. }))
    }

    /// Served tests: whether the decoding was held to the grammar.
    pub fn grammar(&self) -> Option<bool> {
        match self.test {
            Test::Generate(_, Decode::Served { constrained, .. }) => Some(constrained),
            _ => None,
        }
    }

    /// `pp512`, `tg128 @ d4096`, `tg128 x8`, `tg128 served x8`, `tg128 greedy`, `tg128 draft 8/4`, `tg128 grammar x8`.
    pub fn name(&self) -> String {
        self.test.name(self.depth)
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
/// `grammar`: what the grammar suite's constrained tests compile [`bench_grammar`] with.
pub fn run_test(
    model: &dyn LanguageModel,
    meta: &ModelMeta,
    plan: &BenchPlan,
    test: Test,
    depth: usize,
    grammar: Option<&GrammarCompiler>,
    mut on_run: impl FnMut(),
) -> Result<BenchRow> {
    let info = model.info();
    // A served sequence also holds its one-token prompt.
    let needed = depth + test.tokens() + usize::from(matches!(test, Test::Generate(_, Decode::Served { .. })));
    if needed > info.max_context {
        return Err(Error::ContextOverflow { prompt_tokens: needed, limit: info.max_context });
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5a1a);
    let mut random = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..info.vocab_size as u32)).collect() };
    let mut samples_ns = Vec::with_capacity(plan.repetitions);
    let mut peak_mem = 0u64;
    let (mut drafted, mut accepted) = (0, 0);
    let profiled = plan.profile && matches!(test, Test::Generate(..));
    let (mut spent, mut counted) = (HostTimes::default(), HostTimes::default());
    let mut device: Option<DeviceTimes> = None;
    for run in 0..=plan.repetitions {
        let mut caches = Vec::with_capacity(test.seqs());
        for _ in 0..test.seqs() {
            let mut cache = model.new_cache();
            // Allocated for the whole test, as llama-bench allocates its context.
            cache.reserve(needed);
            extend(model, &mut cache, &random(depth), plan.prefill_step)?;
            caches.push(cache);
        }
        let tokens = random((needed - depth) * test.seqs());
        // Served sequences start (their prompts prefilled, their grammars compiled) before the
        // clock does: prompt processing is the pp tests' business, and the rate is the one a
        // client sees from the first token on.
        let mut served = match test {
            Test::Generate(n, Decode::Served { seqs, constrained }) => {
                let grammar = match (constrained, grammar) {
                    (false, _) => None,
                    (true, Some(g)) => Some(g),
                    (true, None) => return Err(Error::Usage("the grammar suite needs a tokenizer to compile its grammar with".into())),
                };
                Some(ServedStart::new(model, &mut caches, &tokens[..seqs], n, grammar)?)
            }
            _ => None,
        };
        let _ = mlx_rs::memory::reset_peak_memory();
        // The warm-up run counts its graphs' operations (slow), the timed runs only time.
        step_profile::count_ops(profiled && run == 0);
        // The timed runs mark the device's clock around each step (a kernel launch before and
        // after one, on CUDA).
        step_profile::time_device(profiled && run > 0)?;
        let before = step_profile::totals();
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
            Test::Generate(_, Decode::Served { .. }) => {
                decode_served(model, &mut caches, served.take().ok_or_else(|| Error::Usage("internal: a served test not started".into()))?)?;
            }
            Test::FollowUp(..) => return Err(Error::Usage("internal: a follow-up test runs through run_follow_up".into())),
        }
        let elapsed = start.elapsed().as_nanos() as u64;
        step_profile::count_ops(false);
        step_profile::time_device(false)?;
        let host = step_profile::totals() - before;
        if profiled {
            // Every marked step is queued by now; the marks are read once the evaluator is idle.
            crate::engine::encoder::Encoder::for_this_thread().wait()?;
            if let Some(t) = step_profile::device_times()? {
                device = Some(device.unwrap_or_default() + t);
            }
        }
        // Run 0 warms up (kernel compilation, allocator) and is not counted.
        if run == 0 {
            counted = host;
        } else {
            spent = spent + host;
            samples_ns.push(elapsed);
            peak_mem = peak_mem.max(mlx_rs::memory::peak_memory().unwrap_or(0) as u64);
        }
        on_run();
    }
    let acceptance = (drafted > 0).then(|| accepted as f64 / drafted as f64);
    let steps = test.tokens();
    let host = profiled.then(|| StepHost::new(spent, device, samples_ns.iter().sum(), steps * samples_ns.len(), counted, steps));
    Ok(BenchRow { model: meta.clone(), test, depth, n_batch: plan.prefill_step, samples_ns, peak_mem, acceptance, reuse: None, host })
}

/// What the grammar suite's constrained tests generate: JSON objects (strings, integers, lists),
/// one after another without end, so every step has a real mask to compute.
pub fn bench_grammar() -> Grammar {
    let item = serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}, "count": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "count", "tags"]});
    Grammar::Lark(format!("start: item (\", \" item)*\nitem: {}\n", crate::engine::grammar::lark_json(&item)))
}

/// How the served rows draw: `sala run`'s default temperature with a common top-p.
pub const SERVED_SAMPLING: (f32, f32) = (0.8, 0.95);

/// Sequences started as the server starts requests, for [`decode_served`]: each of `firsts` its
/// one-token prompt, prefilled, with its sampler ([`SERVED_SAMPLING`], a seed each, under
/// [`bench_grammar`] when `grammar` is given). They are to generate `n` tokens after the one the
/// prompt gives, so that decoding them runs `n` forward steps as `tg n` does.
struct ServedStart {
    decodings: Vec<Decoding>,
    samplers: Vec<Sampler>,
}

impl ServedStart {
    fn new(model: &dyn LanguageModel, caches: &mut [ModelCache], firsts: &[u32], n: usize, grammar: Option<&GrammarCompiler>) -> Result<Self> {
        let opts = GenerateOptions { max_tokens: n + 1, ignore_eos: true, ..Default::default() };
        let (temperature, top_p) = SERVED_SAMPLING;
        let mut start = ServedStart { decodings: Vec::with_capacity(firsts.len()), samplers: Vec::with_capacity(firsts.len()) };
        for (seed, (cache, &first)) in caches.iter_mut().zip(firsts).enumerate() {
            let mut decoding = Decoding::begin(model, cache, &[first], &opts)?;
            decoding.prefill_step(model, cache)?;
            start.decodings.push(decoding);
            let sampler = Sampler::new(SamplingParams { temperature, top_p, seed: Some(seed as u64), ..Default::default() });
            start.samplers.push(match grammar {
                Some(g) => sampler.constrained(g.compile(&bench_grammar(), Reasoning::Off)?),
                None => sampler,
            });
        }
        Ok(start)
    }
}

/// Decodes the started sequences together to the end as the server's rounds do ([`next_batch`]).
fn decode_served(model: &dyn LanguageModel, caches: &mut [ModelCache], start: ServedStart) -> Result<()> {
    let ServedStart { mut decodings, mut samplers } = start;
    while decodings.iter().any(|d| !d.is_done()) {
        let mut steps: Vec<Step> = decodings
            .iter_mut()
            .zip(caches.iter_mut())
            .zip(samplers.iter_mut())
            .filter(|((d, _), _)| !d.is_done())
            .map(|((decoding, cache), sampler)| Step { decoding, cache, sampler })
            .collect();
        next_batch(model, &mut steps)?;
    }
    Ok(())
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

/// Where the disk test keeps its file, and the budget of the warm test's prefix cache.
pub struct FollowUpPlan<'a> {
    /// The model's digests, written into the prompt cache file.
    pub fingerprint: &'a Fingerprint,
    /// A folder for the prompt cache file (removed when the test ends).
    pub dir: &'a std::path::Path,
    /// Bytes the prefix cache may keep (as `sala serve --cache-memory`).
    pub budget: u64,
}

/// The first token of a `prompt`-token follow-up after `depth` tokens, three ways: cold (the
/// whole prompt prefilled, as each request is without a cache), warm (from the state a first
/// question left in a [`PrefixCache`]) and disk (from that state saved to a prompt cache file,
/// the file's pages dropped from the page cache before each run where the OS allows). Each way
/// goes through the path `sala serve` takes: the start from the kept state, prefill chunks ending
/// at restart points, the first token drawn. Every follow-up asks a different question (its
/// first token differs), so it shares exactly the prefix with the state kept; the follow-ups
/// are not kept. Each way runs once uncounted first (kernels compiled, graphs captured for the
/// prompt's chunk shapes), as llama-bench warms up.
pub fn run_follow_up(
    model: &dyn LanguageModel,
    meta: &ModelMeta,
    plan: &BenchPlan,
    keep: &FollowUpPlan,
    depth: usize,
    prompt: usize,
    mut on_run: impl FnMut(),
) -> Result<Vec<BenchRow>> {
    let info = model.info();
    if depth + prompt > info.max_context {
        return Err(Error::ContextOverflow { prompt_tokens: depth + prompt, limit: info.max_context });
    }
    let vocab = info.vocab_size as u32;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5a1a);
    let mut random = |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..vocab)).collect() };
    let document = random(depth);
    let mut asked = 0u32;
    let mut follow_up = || {
        let mut q = random(prompt.max(1));
        q[0] = asked % vocab;
        asked += 1;
        [&document[..], &q[..]].concat()
    };
    let step = plan.prefill_step;
    let row = |from, timings: Timings, kept_bytes, measured_bytes| BenchRow {
        model: meta.clone(),
        test: Test::FollowUp(prompt, from),
        depth,
        n_batch: step,
        samples_ns: timings.samples_ns,
        peak_mem: timings.peak_mem,
        acceptance: None,
        reuse: Some(Reuse { cached_tokens: timings.cached_tokens, kept_bytes, measured_bytes }),
        host: None,
    };

    let (mut cold, mut before) = (Timings::default(), 0);
    let mut kept = None;
    for run in 0..=plan.repetitions {
        // The last run's state goes before this one runs (a million-token state is gigabytes).
        drop(kept.take());
        if run == 1 {
            // What the model holds after a first request (buffers made once), nothing kept.
            before = mlx_rs::memory::active_memory().unwrap_or(0) as u64;
        }
        let tokens = follow_up();
        let mut prefixes = PrefixCache::new(keep.budget);
        let state = cold.time(run, || {
            let start = prefixes.start(&tokens, model.new_cache())?;
            Ok((first_token(model, start, &tokens, step, Some(&mut prefixes))?, 0))
        })?;
        kept = Some((prefixes, state, tokens));
        on_run();
    }
    let (mut prefixes, (cache, trail), tokens) = kept.expect("at least one repetition");
    let path = keep.dir.join(format!(".sala-bench-{}-{depth}.prompt-cache", std::process::id()));
    let _remove = RemoveOnDrop(path.clone());
    let file_bytes = state_file::save(&path, keep.fingerprint, &tokens, &cache, &trail, &mut |_, _| {})?;
    drop((cache, trail));
    let measured = (mlx_rs::memory::active_memory().unwrap_or(0) as u64).saturating_sub(before);
    let held = prefixes.held_bytes();

    // Follow-ups from a kept state: one uncounted run, then the timed ones.
    let mut follow_ups = |before_each: &dyn Fn(), start: &mut dyn FnMut(&[u32]) -> Result<Start>| -> Result<Timings> {
        let mut timings = Timings::default();
        for run in 0..=plan.repetitions {
            let tokens = follow_up();
            before_each();
            timings.time(run, || {
                let start = start(&tokens)?;
                let cached = start.tokens;
                first_token(model, start, &tokens, step, None)?;
                Ok(((), cached))
            })?;
            on_run();
        }
        Ok(timings)
    };
    let warm = follow_ups(&|| {}, &mut |tokens| prefixes.start(tokens, model.new_cache()))?;
    drop(prefixes);
    let mut from_file = |tokens: &[u32]| {
        let file = StateFile::open(&path, keep.fingerprint)?;
        state_file::start_from(&file, model, tokens, model.new_cache(), &mut |_, _| {})
    };
    let disk = follow_ups(&|| drop_page_cache(&path), &mut from_file)?;
    let disk_cached = follow_ups(&|| {}, &mut from_file)?;
    Ok(vec![
        row(Prefix::Cold, cold, 0, None),
        row(Prefix::Warm, warm, held, Some(measured)),
        row(Prefix::Disk, disk, file_bytes, None),
        row(Prefix::DiskCached, disk_cached, file_bytes, None),
    ])
}

/// The timed runs of one way of starting a follow-up (run 0 warms up and is not counted).
#[derive(Default)]
struct Timings {
    samples_ns: Vec<u64>,
    peak_mem: u64,
    /// Prompt tokens the last timed run took from the kept state.
    cached_tokens: usize,
}

impl Timings {
    /// Runs `f` (which returns its result and the prompt tokens it reused) as run `run`, timed.
    fn time<T>(&mut self, run: usize, f: impl FnOnce() -> Result<(T, usize)>) -> Result<T> {
        let _ = mlx_rs::memory::reset_peak_memory();
        let start = Instant::now();
        let (value, cached) = f()?;
        let elapsed = start.elapsed().as_nanos() as u64;
        if run > 0 {
            self.samples_ns.push(elapsed);
            self.peak_mem = self.peak_mem.max(mlx_rs::memory::peak_memory().unwrap_or(0) as u64);
            self.cached_tokens = cached;
        }
        Ok(value)
    }
}

/// What `sala serve` does before a request's first token: prefill from `start` in chunks that end
/// at the trail's stops (keeping its points), keep the prompt's state in `prefixes`, draw the
/// token. Returns the state and the trail.
fn first_token(
    model: &dyn LanguageModel,
    start: Start,
    prompt: &[u32],
    step: usize,
    prefixes: Option<&mut PrefixCache>,
) -> Result<(ModelCache, Trail)> {
    let Start { tokens: cached, mut cache, mut trail } = start;
    // keep_logits: the token is drawn from the prompt's logits on the host, as a server's first
    // token is, not run ahead on the device.
    let opts = GenerateOptions { max_tokens: 1, ignore_eos: true, prefill_step: step, keep_logits: true, ..Default::default() };
    let mut decoding = Decoding::begin(model, &cache, &prompt[cached..], &opts)?;
    while !decoding.prefill_along(model, &mut cache, &mut trail, usize::MAX)? {}
    if let Some(prefixes) = prefixes {
        prefixes.insert(prompt, &cache, &mut trail)?;
    }
    let mut sampler = Sampler::new(SamplingParams { temperature: 0.0, ..Default::default() });
    decoding.next(model, &mut cache, &mut sampler)?;
    Ok((cache, trail))
}

/// Deletes a file when dropped (the bench's prompt cache, on success or error).
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Asks the OS to forget the file's cached pages, so the next read comes from the disk (Linux;
/// the file was synced when written, so its pages are clean and can go).
fn drop_page_cache(path: &std::path::Path) {
    #[cfg(target_os = "linux")]
    if let Ok(file) = std::fs::File::open(path) {
        use std::os::fd::AsRawFd;
        // SAFETY: a plain syscall on an open descriptor; it only advises the kernel.
        unsafe {
            libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = path;
}
