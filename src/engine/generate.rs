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
    on_prefill: impl FnMut(usize, usize),
    mut on_token: impl FnMut(u32) -> Flow,
) -> Result<Generation> {
    let mut decoding = Decoding::start(model, cache, prompt, opts, on_prefill)?;
    while let Some(token) = decoding.next(model, cache, sampler)? {
        if let Flow::Stop = on_token(token) {
            decoding.cancel();
            break;
        }
    }
    Ok(decoding.finish())
}

/// One sequence being generated a token at a time, so a caller can interleave several (the
/// server) or stop whenever it likes. The cache is passed to each call rather than owned, so
/// callers keep their own state layout (a chat session, a server slot).
pub struct Decoding {
    /// The distribution the next token is drawn from.
    logits: Vec<f32>,
    history: Vec<u32>,
    generation: Generation,
    opts: GenerateOptions,
    started: Instant,
    done: bool,
    /// The last token sampled, not yet run through the model: it is fed at the next call, so the
    /// cache never holds a token the caller stopped on.
    pending: Option<u32>,
    /// Prompt tokens run through the model so far.
    prefilled: usize,
}

impl Decoding {
    /// Prefills `prompt` (in `opts.prefill_step` chunks) and readies the first token.
    pub fn start(
        model: &dyn LanguageModel,
        cache: &mut ModelCache,
        prompt: &[u32],
        opts: &GenerateOptions,
        mut on_prefill: impl FnMut(usize, usize),
    ) -> Result<Self> {
        let mut decoding = Self::begin(model, cache, prompt, opts)?;
        while !decoding.prefill_step(model, cache)? {
            on_prefill(decoding.prefilled, prompt.len());
        }
        on_prefill(prompt.len(), prompt.len());
        Ok(decoding)
    }

    /// Checks `prompt` against the model and the cache; the prompt then goes in through
    /// [`Decoding::prefill_step`] (a caller can interleave those with other work).
    pub fn begin(model: &dyn LanguageModel, cache: &ModelCache, prompt: &[u32], opts: &GenerateOptions) -> Result<Self> {
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
        let stats = Stats { prompt_tokens: prompt.len(), ..Default::default() };
        Ok(Self {
            logits: Vec::new(),
            history: prompt.to_vec(),
            generation: Generation { tokens: Vec::new(), logits: Vec::new(), stop: StopReason::MaxTokens, stats },
            opts: opts.clone(),
            started: Instant::now(),
            done: false,
            pending: None,
            prefilled: 0,
        })
    }

    /// Runs the next `opts.prefill_step` prompt tokens; `true` once the whole prompt is in.
    pub fn prefill_step(&mut self, model: &dyn LanguageModel, cache: &mut ModelCache) -> Result<bool> {
        let total = self.generation.stats.prompt_tokens;
        if self.prefilled < total {
            let start = Instant::now();
            let end = (self.prefilled + self.opts.prefill_step.max(1)).min(total);
            let logits = forward_eval(model, cache, &self.history[self.prefilled..end])?;
            if end == total {
                self.logits = to_vec_f32(&logits)?;
                self.started = Instant::now();
            }
            self.prefilled = end;
            self.generation.stats.prompt_seconds += start.elapsed().as_secs_f64();
        }
        Ok(self.is_prefilled())
    }

    pub fn is_prefilled(&self) -> bool {
        self.prefilled == self.generation.stats.prompt_tokens
    }

    /// Runs the previous token through the model and samples the next; `None` once a stop
    /// condition (end of sequence, max tokens, context limit, cancel) was met. The cache holds the
    /// prompt and every returned token but the last.
    pub fn next(&mut self, model: &dyn LanguageModel, cache: &mut ModelCache, sampler: &mut Sampler) -> Result<Option<u32>> {
        if self.done {
            return Ok(None);
        }
        if !self.is_prefilled() {
            return Err(Error::Usage("Decoding::next before the prompt was prefilled".into()));
        }
        if let Some(previous) = self.pending.take() {
            self.logits = to_vec_f32(&forward_eval(model, cache, &[previous])?)?;
        }
        let info = model.info();
        let token = sampler.sample_with(&self.logits, &self.history, self.generation.tokens.len());
        if self.opts.keep_logits {
            self.generation.logits.push(std::mem::take(&mut self.logits));
        }
        self.generation.tokens.push(token);
        self.history.push(token);
        if !self.opts.ignore_eos && info.eos_token_ids.contains(&token) {
            self.stop(StopReason::EndOfSequence);
        } else if self.generation.tokens.len() >= self.opts.max_tokens {
            self.stop(StopReason::MaxTokens);
        } else if cache.len() + 1 > info.max_context {
            self.stop(StopReason::ContextLimit);
        } else {
            self.pending = Some(token);
        }
        Ok(Some(token))
    }

    fn stop(&mut self, reason: StopReason) {
        self.generation.stop = reason;
        self.done = true;
    }

    /// Stops on the caller's behalf.
    pub fn cancel(&mut self) {
        self.stop(StopReason::Cancelled);
    }

    pub fn tokens(&self) -> &[u32] {
        &self.generation.tokens
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Why it stopped (meaningful once [`Decoding::is_done`]).
    pub fn stop_reason(&self) -> StopReason {
        self.generation.stop
    }

    /// The finished generation with its timings.
    pub fn finish(mut self) -> Generation {
        let stats = &mut self.generation.stats;
        stats.generated_tokens = self.generation.tokens.len();
        stats.decode_seconds = self.started.elapsed().as_secs_f64();
        stats.peak_memory_bytes = mlx_rs::memory::peak_memory().unwrap_or(0);
        self.generation
    }
}

/// One sequence's part in a batched decode step.
pub struct Step<'a> {
    pub decoding: &'a mut Decoding,
    pub cache: &'a mut ModelCache,
    pub sampler: &'a mut Sampler,
}

/// Advances several sequences by a token each, like [`Decoding::next`] for every one, but runs
/// their previous tokens through the model in a single batched forward (the sequences may be at
/// different lengths). Sequences that are done give `None`.
pub fn next_batch(model: &dyn LanguageModel, steps: &mut [Step]) -> Result<Vec<Option<u32>>> {
    let mut fed: Vec<&mut Step> = steps.iter_mut().filter(|s| !s.decoding.done && s.decoding.pending.is_some()).collect();
    if !fed.is_empty() {
        let ids: Vec<i32> = fed.iter().map(|s| s.decoding.pending.expect("filtered above") as i32).collect();
        let input = Array::from_slice(&ids, &[ids.len() as i32, 1]);
        let mut caches: Vec<&mut ModelCache> = fed.iter_mut().map(|s| &mut *s.cache).collect();
        let rows = to_vec_f32(&forward_eval_batch(model, &input, &mut caches)?)?;
        let vocab = rows.len() / fed.len();
        for (s, row) in fed.iter_mut().zip(rows.chunks(vocab)) {
            s.decoding.logits = row.to_vec();
            s.decoding.pending = None;
        }
    }
    steps.iter_mut().map(|s| s.decoding.next(model, s.cache, s.sampler)).collect()
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

/// Decodes known `tokens` one forward call each, building step n+1 while the device still runs
/// step n (`async_eval`, as mlx-lm's generate loop does), so graph construction on the host
/// overlaps the device's work. For measuring decode speed (`sala bench`).
pub fn decode_pipelined(model: &dyn LanguageModel, cache: &mut ModelCache, tokens: &[u32]) -> Result<()> {
    let mut last = None;
    for &token in tokens {
        let input = Array::from_slice(&[token as i32], &[1, 1]);
        let logits = model.forward_batch(&input, &mut [&mut *cache], Logits::Last, None)?;
        let state = cache.arrays();
        mlx_rs::transforms::async_eval(std::iter::once(&logits).chain(state.iter()))?;
        last = Some((logits, state));
    }
    if let Some((logits, state)) = last {
        eval(std::iter::once(&logits).chain(state.iter()))?;
    }
    Ok(())
}

/// One forward call over `tokens` returning the last position's logits, evaluated together with
/// the cache so the lazy graph never outlives the step.
fn forward_eval(model: &dyn LanguageModel, cache: &mut ModelCache, tokens: &[u32]) -> Result<Array> {
    let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    forward_eval_batch(model, &Array::from_slice(&ids, &[1, ids.len() as i32]), &mut [cache])
}

/// [`forward_eval`] for a batch: `input` `[B, T]`, row b on `caches[b]`; logits `[B, vocab]`.
fn forward_eval_batch(model: &dyn LanguageModel, input: &Array, caches: &mut [&mut ModelCache]) -> Result<Array> {
    let logits = model.forward_batch(input, caches, Logits::Last, None)?;
    let state: Vec<Array> = caches.iter().flat_map(|c| c.arrays()).collect();
    eval(std::iter::once(&logits).chain(state.iter()))?;
    Ok(logits)
}
