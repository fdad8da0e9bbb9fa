//! The generate loop: chunked prefill, then sample → forward one token → repeat, with stop
//! conditions, timing and (optionally) every distribution the tokens were drawn from.

use super::cache::ModelCache;
use super::error::{Error, Result};
use super::model::{LanguageModel, Logits};
use super::ops::to_vec_f32;
use super::sampler::Sampler;
use mlx_rs::{transforms::eval, Array};
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Prompt tokens per forward call during prefill.
    pub prefill_step: usize,
    /// Keep a host copy of every logits row a token was drawn from.
    pub keep_logits: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self { max_tokens: 512, ignore_eos: false, prefill_step: 2048, keep_logits: false }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    EndOfSequence,
    MaxTokens,
    ContextLimit,
    Cancelled,
}

#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub prompt_seconds: f64,
    pub generated_tokens: usize,
    /// Time of the decode steps (every generated token after the first).
    pub decode_seconds: f64,
    pub peak_memory_bytes: usize,
}

impl Stats {
    pub fn prompt_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_seconds.max(1e-9)
    }
    pub fn decode_tps(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_seconds.max(1e-9)
    }
}

pub struct Generation {
    pub tokens: Vec<u32>,
    /// Row i: the float32 distribution token i was drawn from (with `keep_logits`).
    pub logits: Vec<Vec<f32>>,
    pub stop: StopReason,
    pub stats: Stats,
}

/// What the caller wants after seeing a token.
pub enum Flow {
    Continue,
    Stop,
}

/// Runs `prompt` through `model` on top of `cache`, then generates. `on_token` sees each token as
/// soon as it is sampled; `on_prefill(done, total)` reports prefill progress.
pub fn generate(
    model: &dyn LanguageModel,
    cache: &mut ModelCache,
    prompt: &[u32],
    sampler: &mut Sampler,
    opts: &GenerateOptions,
    mut on_prefill: impl FnMut(usize, usize),
    mut on_token: impl FnMut(u32) -> Flow,
) -> Result<Generation> {
    let info = model.info();
    if prompt.is_empty() {
        return Err(Error::Usage("the prompt is empty: give at least one token".into()));
    }
    if let Some(&id) = prompt.iter().find(|&&id| id as usize >= info.vocab_size) {
        return Err(Error::TokenOutOfRange { id, vocab: info.vocab_size });
    }
    let total = cache.len() + prompt.len();
    if total > info.max_context {
        return Err(Error::ContextOverflow { prompt_tokens: total, limit: info.max_context });
    }
    let _ = mlx_rs::memory::reset_peak_memory();
    let mut stats = Stats { prompt_tokens: prompt.len(), ..Default::default() };
    let mut history: Vec<u32> = prompt.to_vec();

    let start = Instant::now();
    let mut last = None;
    let step = opts.prefill_step.max(1);
    for (i, chunk) in prompt.chunks(step).enumerate() {
        let logits = forward_eval(model, cache, chunk)?;
        last = Some(logits);
        on_prefill((i * step + chunk.len()).min(prompt.len()), prompt.len());
    }
    let mut logits = to_vec_f32(&last.expect("prompt is not empty"))?;
    stats.prompt_seconds = start.elapsed().as_secs_f64();

    let mut generation = Generation { tokens: Vec::new(), logits: Vec::new(), stop: StopReason::MaxTokens, stats: Stats::default() };
    let decode_start = Instant::now();
    while generation.tokens.len() < opts.max_tokens {
        let token = sampler.sample(&logits, &history);
        if opts.keep_logits {
            generation.logits.push(std::mem::take(&mut logits));
        }
        generation.tokens.push(token);
        history.push(token);
        if let Flow::Stop = on_token(token) {
            generation.stop = StopReason::Cancelled;
            break;
        }
        if !opts.ignore_eos && info.eos_token_ids.contains(&token) {
            generation.stop = StopReason::EndOfSequence;
            break;
        }
        if generation.tokens.len() >= opts.max_tokens {
            break;
        }
        if cache.len() + 1 > info.max_context {
            generation.stop = StopReason::ContextLimit;
            break;
        }
        logits = to_vec_f32(&forward_eval(model, cache, &[token])?)?;
    }
    stats.generated_tokens = generation.tokens.len();
    stats.decode_seconds = decode_start.elapsed().as_secs_f64();
    stats.peak_memory_bytes = mlx_rs::memory::peak_memory().unwrap_or(0);
    generation.stats = stats;
    Ok(generation)
}

/// Runs `tokens` into `cache` in chunks of `step` without sampling (a chat turn's history).
pub fn extend(model: &dyn LanguageModel, cache: &mut ModelCache, tokens: &[u32], step: usize) -> Result<()> {
    let info = model.info();
    if let Some(&id) = tokens.iter().find(|&&id| id as usize >= info.vocab_size) {
        return Err(Error::TokenOutOfRange { id, vocab: info.vocab_size });
    }
    if cache.len() + tokens.len() > info.max_context {
        return Err(Error::ContextOverflow { prompt_tokens: cache.len() + tokens.len(), limit: info.max_context });
    }
    for chunk in tokens.chunks(step.max(1)) {
        forward_eval(model, cache, chunk)?;
    }
    Ok(())
}

/// One forward call over `tokens` returning the last position's logits, evaluated together with
/// the cache so the lazy graph never outlives the step.
fn forward_eval(model: &dyn LanguageModel, cache: &mut ModelCache, tokens: &[u32]) -> Result<Array> {
    let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    let input = Array::from_slice(&ids, &[1, ids.len() as i32]);
    let logits = model.forward(&input, cache, Logits::Last, None)?;
    let state = cache.arrays();
    eval(std::iter::once(&logits).chain(state.iter()))?;
    Ok(logits)
}
