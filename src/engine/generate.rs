//! The generate loop: chunked prefill, then sample → forward one token → repeat, with stop
//! conditions, timing and (optionally) every distribution the tokens were drawn from.

use super::cache::{Checkpoint, ModelCache};
use super::encoder::{Encoder, PendingRead};
use super::step_profile::{self, timed, Part};
use super::prefix_cache::Trail;
use super::error::{Error, Result};
use super::fixed_step::FixedSteps;
use super::logprobs::TokenLogprobs;
use super::model::{LanguageModel, Logits};
use super::ops::to_vec_f32;
use super::device_sampler::{draw_rows, DrawRow, SequenceDraws};
use super::grammar::TokenMask;
use super::logprobs::Queued;
use super::sampler::Sampler;
use mlx_rs::{transforms::eval, Array};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Instant;

/// Prompt tokens per forward pass by default: a chunk of 4096 rows shares each dequantized weight
/// copy of the GPU's prompt products between twice the rows of 2048 (eval/results/kernel-notes.md).
pub const PREFILL_STEP: usize = 4096;

/// [`PREFILL_STEP`] on CUDA, whose memory is the GPU's own: 8192 rows share each weight copy
/// again, and a 1M-token SALA prompt still peaks under 24 GB (eval/results/kernel-notes.md).
/// Metal's unified memory keeps 4096 (not measured there).
pub const CUDA_PREFILL_STEP: usize = 8192;

/// The prompt tokens per forward pass of this build: [`CUDA_PREFILL_STEP`] where libmlx runs on
/// CUDA, else [`PREFILL_STEP`].
pub fn default_prefill_step() -> usize {
    if super::device::gpu_backend() == Some("cuda") {
        CUDA_PREFILL_STEP
    } else {
        PREFILL_STEP
    }
}

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    /// Keep going past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Prompt tokens per forward call during prefill.
    pub prefill_step: usize,
    /// Keep a host copy of every logits row a token was drawn from.
    pub keep_logits: bool,
    /// Self-speculative decoding.
    pub draft: Option<Draft>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self { max_tokens: 512, ignore_eos: false, prefill_step: default_prefill_step(), keep_logits: false, draft: None }
    }
}

/// Self-speculative decoding: the model's first `layers` layers and its output head guess up to
/// `tokens` tokens ahead (greedily), then one forward call of the whole model over all of them
/// checks the guesses. Each position's token is drawn from the full model's distribution with
/// the caller's sampler, and guesses are kept while they equal those draws, so the output is what
/// plain decoding gives (the same tokens when greedy); rejected guesses are rolled back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draft {
    pub layers: usize,
    pub tokens: usize,
}

impl Draft {
    /// Checks the draft against `model` and its cache.
    pub fn validate(self, model: &dyn LanguageModel, cache: &ModelCache) -> Result<Self> {
        let layers = model.info().num_layers;
        if self.layers == 0 || self.layers >= layers {
            return Err(Error::Usage(format!(
                "--draft-layers {}: the draft must run between 1 and {} of the model's {layers} layers",
                self.layers,
                layers - 1
            )));
        }
        if self.tokens == 0 {
            return Err(Error::Usage("--num-draft 0: draft at least one token ahead (or leave out --draft-layers)".into()));
        }
        if cache.is_windowed() {
            return Err(Error::Usage(
                "--draft-layers cannot be used with --context-size: a cache that drops tokens cannot be rolled back".into(),
            ));
        }
        Ok(self)
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
    /// Speculative decoding: tokens the draft guessed, and how many of them the model kept.
    pub draft_tokens: usize,
    pub accepted_tokens: usize,
}

impl Stats {
    pub fn prompt_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_seconds.max(1e-9)
    }
    pub fn decode_tps(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode_seconds.max(1e-9)
    }
    /// Fraction of drafted tokens accepted (`None` without speculative decoding).
    pub fn acceptance(&self) -> Option<f64> {
        (self.draft_tokens > 0).then(|| self.accepted_tokens as f64 / self.draft_tokens as f64)
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
    // What the prompt's chunks freed is not what the steps reuse (a chat keeps running).
    super::memory::trim_cached();
    while let Some(token) = decoding.next(model, cache, sampler)? {
        if let Flow::Stop = on_token(token) {
            decoding.cancel(model, cache)?;
            break;
        }
    }
    Ok(decoding.finish())
}

/// One sequence being generated a token at a time, so a caller can interleave several (the
/// server) or stop whenever it likes. The cache is passed to each call rather than owned, so
/// callers keep their own state layout (a chat session, a server slot).
///
/// Tokens are drawn on the device ([`device_sampler`]) for every sampler setting, and the model
/// runs ahead of the host: the step after a token is queued before the token is read, so the
/// device never waits for the host to read a token and pick the next. A token found to end the
/// answer (end of sequence, a stop string, a cancel) after its successors went in rolls the cache
/// back to the checkpoint taken before it. Under a grammar the token must be read before the next
/// draw (the grammar's mask depends on it), so only its forward runs ahead while the host works
/// out the next mask. Speculative decoding, kept logits rows and windowed caches draw on the host.
pub struct Decoding {
    /// The distribution the next token is drawn from, on the device and not drawn yet: the
    /// prompt's last, or, under a grammar, the one a queued step makes.
    undrawn: Option<Array>,
    history: Vec<u32>,
    generation: Generation,
    opts: GenerateOptions,
    started: Instant,
    done: bool,
    /// The last token handed out, not yet run through the model: it is fed at the next call, so
    /// the cache never holds a token the caller stopped on.
    pending: Option<u32>,
    /// Prompt tokens run through the model so far.
    prefilled: usize,
    /// Tokens drawn on the host but not handed out yet (a speculative round draws several).
    ready: VecDeque<Drawn>,
    /// Tokens drawn on the device and not read yet, oldest first; those already run through the
    /// model carry the cache's checkpoint from before they went in.
    in_flight: VecDeque<InFlight>,
    /// This sequence's state for drawing on the device (made at its first draw).
    draws: Option<SequenceDraws>,
    /// The next device step must be built on this thread (see [`Encoder::starting`]): the
    /// sequence is new to the device loop, and what it holds may be lazy on this thread.
    restart: bool,
    /// The cache before the token handed out last went in, when it ran ahead: a stop on that
    /// token goes back to it.
    rewind: Option<Checkpoint>,
    /// Whether the token handed out last is already in the cache (run ahead or an accepted guess).
    last_in_cache: bool,
    /// Log-probabilities to keep (see [`Decoding::with_logprobs`]).
    logprobs: LogprobOptions,
    /// Per generated token, with `logprobs.generated`.
    token_logprobs: Vec<TokenLogprobs>,
    /// Per prompt token after the first, with `logprobs.prompt`.
    prompt_logprobs: Vec<TokenLogprobs>,
}

/// Which log-probabilities a [`Decoding`] keeps: `Some(n)` keeps each token's with the `n` most
/// likely alternatives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogprobOptions {
    pub generated: Option<usize>,
    pub prompt: Option<usize>,
}

/// Prompt tokens per forward call when the prompt is scored: every position's logits are
/// computed, `[chunk, vocab]` float32 at once.
const SCORING_CHUNK: usize = 512;

/// Forward steps a sequence has queued when it reads a token: token n is read with n and n+1
/// already gone in, so the next step is built while the evaluator thread (engine::encoder) still
/// encodes the one before (eval/results/kernel-notes.md). Under a grammar it is 1.
const RUN_AHEAD: usize = 2;

/// A token drawn on the device, not read yet.
struct InFlight {
    token: DeviceToken,
    /// Its log-probabilities, when they are kept.
    logprobs: Option<Queued>,
    /// Set once the token was run through the model: the cache before it went in.
    fed: Option<Checkpoint>,
}

/// Row `row` of a step's draws (`[rows]` int32 on the device), shared by the sequences drawn
/// together so a batch reads them once and feeds them on without a copy.
#[derive(Clone)]
struct DeviceToken {
    batch: Rc<Array>,
    row: usize,
}

impl DeviceToken {
    /// A token known on the host (one handed out and not run through the model yet).
    fn known(id: u32) -> Self {
        Self { batch: Rc::new(Array::from_slice(&[id as i32], &[1])), row: 0 }
    }

    /// `[1]` int32.
    fn single(&self) -> Result<Array> {
        use mlx_rs::ops::indexing::TryIndexOp;
        if self.batch.shape()[0] == 1 {
            return Ok((*self.batch).clone());
        }
        Ok(self.batch.try_index(self.row as i32..self.row as i32 + 1)?)
    }
}

/// A token drawn from the model, waiting to be handed out.
struct Drawn {
    token: u32,
    /// Already run through the model (an accepted draft token): rolled back if generation stops
    /// before it is handed out.
    in_cache: bool,
    /// The distribution it was drawn from.
    logits: Vec<f32>,
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
            undrawn: None,
            history: prompt.to_vec(),
            generation: Generation { tokens: Vec::new(), logits: Vec::new(), stop: StopReason::MaxTokens, stats },
            opts: opts.clone(),
            started: Instant::now(),
            done: false,
            pending: None,
            prefilled: 0,
            ready: VecDeque::new(),
            in_flight: VecDeque::new(),
            draws: None,
            restart: true,
            rewind: None,
            last_in_cache: false,
            logprobs: LogprobOptions::default(),
            token_logprobs: Vec::new(),
            prompt_logprobs: Vec::new(),
        })
    }

    /// Keeps log-probabilities of the model's distribution (log-softmax of the raw logits, before
    /// any sampling setting): of each generated token, and of each prompt token after the first
    /// (the prompt is then run with every position's logits, in chunks of at most
    /// [`SCORING_CHUNK`]). Set before the prompt goes in.
    pub fn with_logprobs(mut self, logprobs: LogprobOptions) -> Self {
        if logprobs.prompt.is_some() {
            self.opts.prefill_step = self.opts.prefill_step.clamp(1, SCORING_CHUNK);
        }
        self.logprobs = logprobs;
        self
    }

    /// Each generated token's log-probability (with [`LogprobOptions::generated`]), in order.
    pub fn token_logprobs(&self) -> &[TokenLogprobs] {
        &self.token_logprobs
    }

    /// Each prompt token's log-probability after the first (with [`LogprobOptions::prompt`]),
    /// once the prompt is in.
    pub fn prompt_logprobs(&self) -> &[TokenLogprobs] {
        &self.prompt_logprobs
    }

    /// Runs the next `opts.prefill_step` prompt tokens; `true` once the whole prompt is in.
    pub fn prefill_step(&mut self, model: &dyn LanguageModel, cache: &mut ModelCache) -> Result<bool> {
        self.prefill_until(model, cache, usize::MAX)
    }

    /// [`Decoding::prefill_step`] along `trail`, at most `budget` tokens: the chunk ends at the
    /// trail's next stop, and the trail keeps its point after it.
    pub fn prefill_along(&mut self, model: &dyn LanguageModel, cache: &mut ModelCache, trail: &mut Trail, budget: usize) -> Result<bool> {
        let until = self.prefilled + self.chunk_along(cache, trail, budget);
        let done = self.prefill_until(model, cache, until)?;
        trail.observe(cache)?;
        Ok(done)
    }

    /// The prompt tokens [`Decoding::prefill_along`] would run next (none once the prompt is in).
    pub fn chunk_along(&self, cache: &ModelCache, trail: &Trail, budget: usize) -> usize {
        // The cache held `cache.len() - self.prefilled` tokens before the prompt.
        let step = self.opts.prefill_step.min(budget).max(1);
        let until = trail.chunk_end(cache.len(), step) - (cache.len() - self.prefilled);
        self.chunk_end(until) - self.prefilled
    }

    /// Where the next chunk ends: a step on, at `until` at most, at the prompt's end at most, and
    /// at least a token on.
    fn chunk_end(&self, until: usize) -> usize {
        let total = self.generation.stats.prompt_tokens;
        (self.prefilled + self.opts.prefill_step.max(1)).min(total).min(until.max(self.prefilled + 1))
    }

    /// Whether the next chunk of the prompt may run in a decode step's forward call
    /// ([`next_batch_with_chunks`]): the prompt is not scored (that needs every position's
    /// logits) and the answer is drawn on the device.
    pub fn may_ride(&self, cache: &ModelCache) -> bool {
        !self.is_prefilled() && self.logprobs.prompt.is_none() && !self.draws_on_host(cache)
    }

    /// The ids of the next `tokens` prompt tokens, `[1, tokens]`.
    fn chunk_ids(&self, tokens: usize) -> Array {
        let ids: Vec<i32> = self.history[self.prefilled..self.prefilled + tokens].iter().map(|&t| t as i32).collect();
        Array::from_slice(&ids, &[1, tokens as i32])
    }

    /// Takes a chunk of `tokens` that ran in a decode step's forward call; `logits` is the
    /// prompt's last row when the chunk ended it.
    fn took_chunk(&mut self, tokens: usize, logits: Option<Array>) {
        self.prefilled += tokens;
        if self.is_prefilled() {
            self.undrawn = logits;
            self.started = Instant::now();
            // Its cache and logits were built for the evaluator, as the step's were: its first
            // step needs no start of its own on this thread (engine::encoder).
            self.restart = false;
        }
    }

    /// [`Decoding::prefill_step`], ending the chunk once `until` prompt tokens are in.
    fn prefill_until(&mut self, model: &dyn LanguageModel, cache: &mut ModelCache, until: usize) -> Result<bool> {
        let total = self.generation.stats.prompt_tokens;
        if self.prefilled < total {
            let start = Instant::now();
            let end = self.chunk_end(until);
            let logits = match self.logprobs.prompt {
                None => forward_eval(model, cache, &self.history[self.prefilled..end], Logits::Last)?,
                Some(top) => {
                    // Row i predicts prompt token prefilled + i + 1; the last row of the prompt
                    // predicts the first generated token.
                    let all = forward_eval(model, cache, &self.history[self.prefilled..end], Logits::All)?;
                    let next = &self.history[self.prefilled + 1..(end + 1).min(total)];
                    self.prompt_logprobs.extend(super::logprobs::for_rows(&all, next, top)?);
                    use mlx_rs::ops::indexing::TryIndexOp;
                    let last = all.try_index(((end - self.prefilled - 1) as i32.., ..))?;
                    eval([&last])?;
                    last
                }
            };
            if end == total {
                self.undrawn = Some(logits);
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
        if self.draws_on_host(cache) {
            return self.next_on_host(model, cache, sampler);
        }
        let mut step = Step { decoding: self, cache, sampler };
        Ok(device_round(model, &mut [&mut step], &mut [])?.pop().flatten())
    }

    /// Whether tokens are drawn on the host: speculative decoding (its rounds check guesses
    /// against host draws), kept logits rows (they come to the host anyway), and a windowed
    /// cache (it may drop tokens, so it is never rolled back and nothing runs ahead).
    fn draws_on_host(&self, cache: &ModelCache) -> bool {
        self.opts.draft.is_some() || self.opts.keep_logits || cache.is_windowed()
    }

    /// Checks that a token may be drawn now.
    fn check_ready(&self) -> Result<()> {
        if !self.is_prefilled() {
            return Err(Error::Usage("Decoding::next before the prompt was prefilled".into()));
        }
        Ok(())
    }

    /// [`Decoding::next`] with the token drawn on the host from the logits row read back.
    fn next_on_host(&mut self, model: &dyn LanguageModel, cache: &mut ModelCache, sampler: &mut Sampler) -> Result<Option<u32>> {
        if self.done {
            return Ok(None);
        }
        self.check_ready()?;
        if self.ready.is_empty() {
            match (self.pending.take(), self.opts.draft) {
                (Some(previous), Some(draft)) => self.speculate(model, cache, sampler, previous, draft)?,
                (previous, _) => {
                    let row = match previous {
                        Some(previous) => {
                            let logits = forward_queued(model, cache, &[previous])?;
                            sampler.prepare()?;
                            logits
                        }
                        None => self.undrawn.take().ok_or_else(|| Error::Usage("internal: no logits to draw from".into()))?,
                    };
                    let logits = timed(Part::Blocked, || to_vec_f32(&row))?;
                    let token = sampler.sample_with(&logits, &self.history, self.generation.tokens.len())?;
                    self.ready.push_back(Drawn { token, in_cache: false, logits });
                }
            }
        }
        let Drawn { token, in_cache, logits } = self.ready.pop_front().expect("drawn above");
        let logprobs = self.logprobs.generated.map(|top| super::logprobs::from_row(&logits, token, top));
        if self.opts.keep_logits {
            self.generation.logits.push(logits);
        }
        self.hand_out(model, cache, token, in_cache, logprobs)
    }

    /// Hands out `token` (`in_cache`: already run through the model) and checks the stop
    /// conditions.
    fn hand_out(&mut self, model: &dyn LanguageModel, cache: &mut ModelCache, token: u32, in_cache: bool, logprobs: Option<TokenLogprobs>) -> Result<Option<u32>> {
        self.token_logprobs.extend(logprobs);
        self.generation.tokens.push(token);
        self.history.push(token);
        self.last_in_cache = in_cache;
        if !in_cache {
            self.rewind = None;
        }
        let info = model.info();
        if !self.opts.ignore_eos && info.eos_token_ids.contains(&token) {
            self.stop(model, cache, StopReason::EndOfSequence)?;
        } else if self.generation.tokens.len() >= self.opts.max_tokens {
            self.stop(model, cache, StopReason::MaxTokens)?;
        } else if cache.len() - self.ahead() + 1 > info.max_context {
            self.stop(model, cache, StopReason::ContextLimit)?;
        } else if !in_cache {
            self.pending = Some(token);
        }
        Ok(Some(token))
    }

    /// Tokens in the cache that plain decoding would not have fed yet: the last one handed out
    /// (plain decoding feeds it at the next call), those drawn but not handed out, and tokens run
    /// ahead and not read yet.
    fn ahead(&self) -> usize {
        self.last_in_cache as usize
            + self.ready.iter().filter(|d| d.in_cache).count()
            + self.in_flight.iter().filter(|f| f.fed.is_some()).count()
    }

    /// Stops; the cache is rolled back to what plain decoding would hold (the prompt and every
    /// token handed out but the last).
    fn stop(&mut self, model: &dyn LanguageModel, cache: &mut ModelCache, reason: StopReason) -> Result<()> {
        let ahead = self.ahead();
        if !self.in_flight.is_empty() || self.undrawn.is_some() {
            // Nothing may evaluate on this thread while the evaluator still encodes a step.
            Encoder::for_this_thread().wait()?;
            self.in_flight.clear();
            self.undrawn = None;
        }
        if let Some(checkpoint) = self.rewind.take() {
            cache.restore(checkpoint);
        } else if ahead > 0 {
            model.truncate_cache(cache, cache.len() - ahead)?;
        }
        self.ready.clear();
        self.generation.stop = reason;
        self.done = true;
        Ok(())
    }

    /// Stops on the caller's behalf, after the last token handed out.
    pub fn cancel(&mut self, model: &dyn LanguageModel, cache: &mut ModelCache) -> Result<()> {
        if self.done {
            return Ok(());
        }
        self.stop(model, cache, StopReason::Cancelled)
    }

    /// Whether a step may run this sequence's newest drawn token through the model now: it is not
    /// in yet, fewer than the run-ahead are in and unread, it is not the last token allowed, and
    /// the context has room.
    fn may_feed(&self, model: &dyn LanguageModel, cache: &ModelCache, constrained: bool) -> bool {
        let Some(back) = self.in_flight.back() else { return false };
        let fed = self.in_flight.iter().filter(|f| f.fed.is_some()).count();
        // The number the newest token will have once handed out.
        let number = self.generation.tokens.len() + self.in_flight.len();
        let limit = if constrained { 1 } else { RUN_AHEAD };
        back.fed.is_none() && self.undrawn.is_none() && fed < limit && number < self.opts.max_tokens && cache.len() + 1 < model.info().max_context
    }

    /// The token leaving the repetition window of the draw about to be made (`[1]` uint32), when
    /// the window is full: on the host if it was read, else still in flight.
    fn leaving(&self, window: usize) -> Result<Option<Array>> {
        // The draw's token takes this place in the history.
        let at = self.history.len() + self.in_flight.len();
        let Some(leaves) = at.checked_sub(window) else { return Ok(None) };
        Ok(Some(match self.history.get(leaves) {
            Some(&id) => Array::from_slice(&[id], &[1]),
            None => self.in_flight[leaves - self.history.len()].token.single()?,
        }))
    }

    /// One speculative round after `first` (drawn, not yet in the cache): the draft guesses up to
    /// `draft.tokens` tokens, the whole model runs over `first` and the guesses in one call, and
    /// tokens are drawn from its distributions while they agree with the guesses. Leaves the
    /// accepted guesses in the cache and every drawn token in `ready`.
    fn speculate(
        &mut self,
        model: &dyn LanguageModel,
        cache: &mut ModelCache,
        sampler: &mut Sampler,
        first: u32,
        draft: Draft,
    ) -> Result<()> {
        let generated = self.generation.tokens.len();
        // No guesses past max_tokens or the context limit.
        let room = (model.info().max_context - cache.len() - 1).min(self.opts.max_tokens.saturating_sub(generated + 1));
        let guesses = draft.tokens.min(room);
        let start = cache.len();
        let guessed = if guesses == 0 { Vec::new() } else { draft_guesses(model, cache, first, draft.layers, guesses)? };

        let mut input: Vec<u32> = vec![first];
        input.extend(&guessed);
        let rows = with_replay(cache, |cache| forward_eval(model, cache, &input, Logits::All))?;
        let rows = timed(Part::Blocked, || to_vec_f32(&rows))?;
        let vocab = rows.len() / input.len();

        // Draw from the full model position by position; the guess at i+1 stands while it equals
        // the token drawn at i (the history grows as plain decoding's would).
        let base = self.history.len();
        let mut accepted = 0;
        for (i, row) in rows.chunks(vocab).enumerate() {
            let token = sampler.sample_with(row, &self.history, generated + i)?;
            self.history.push(token);
            let agrees = guessed.get(i) == Some(&token);
            self.ready.push_back(Drawn { token, in_cache: agrees, logits: row.to_vec() });
            if !agrees {
                break;
            }
            accepted += 1;
        }
        self.history.truncate(base);
        // Keep `first` and the accepted guesses.
        model.truncate_cache(cache, start + 1 + accepted)?;
        self.generation.stats.draft_tokens += guessed.len();
        self.generation.stats.accepted_tokens += accepted;
        Ok(())
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
        let mut generation = std::mem::replace(
            &mut self.generation,
            Generation { tokens: Vec::new(), logits: Vec::new(), stop: StopReason::Cancelled, stats: Stats::default() },
        );
        let stats = &mut generation.stats;
        stats.generated_tokens = generation.tokens.len();
        stats.decode_seconds = self.started.elapsed().as_secs_f64();
        stats.peak_memory_bytes = mlx_rs::memory::peak_memory().unwrap_or(0);
        generation
    }
}

impl Drop for Decoding {
    /// A decoding dropped with steps in flight (its caller gave up on an error) waits for the
    /// evaluator: this thread may evaluate again only once it is idle (engine::encoder).
    fn drop(&mut self) {
        if !self.in_flight.is_empty() || self.undrawn.is_some() {
            let _ = Encoder::for_this_thread().wait();
        }
    }
}

/// One sequence's part in a batched decode step.
pub struct Step<'a> {
    pub decoding: &'a mut Decoding,
    pub cache: &'a mut ModelCache,
    pub sampler: &'a mut Sampler,
}

/// A prompt chunk to run beside a batched decode step ([`next_batch_with_chunks`]).
pub struct Chunk<'a> {
    pub decoding: &'a mut Decoding,
    pub cache: &'a mut ModelCache,
    /// Prompt tokens it runs ([`Decoding::chunk_along`]).
    pub tokens: usize,
}

impl Chunk<'_> {
    /// Whether the chunk ends its prompt (its last row's logits are then wanted).
    fn ends_prompt(&self) -> bool {
        self.decoding.prefilled + self.tokens == self.decoding.generation.stats.prompt_tokens
    }
}

/// Runs each of `chunks` in a forward call of its own, on this thread once `encoder`'s evaluator
/// is idle (the device steps' evaluator must be: this thread evaluates them).
fn run_alone(model: &dyn LanguageModel, encoder: &Encoder, chunks: &mut [Chunk]) -> Result<()> {
    if chunks.is_empty() {
        return Ok(());
    }
    encoder.wait()?;
    for chunk in chunks.iter_mut() {
        let until = chunk.decoding.prefilled + chunk.tokens;
        chunk.decoding.prefill_until(model, chunk.cache, until)?;
    }
    Ok(())
}

/// Advances several sequences by a token each, like [`Decoding::next`] for every one, with one
/// batched forward call a step over all of them (they may be at different lengths) and their
/// tokens drawn together on the device. Sequences that are done give `None`.
pub fn next_batch(model: &dyn LanguageModel, steps: &mut [Step]) -> Result<Vec<Option<u32>>> {
    next_batch_with_chunks(model, steps, &mut [])
}

/// Runs, and waits for, a decode step of each batch size in `batches` (each sequence over a
/// one-token history) and a prompt of each length in `prompts`, then drops all they made. A GPU
/// compiles the kernels a shape needs the first time it meets it (up to seconds each, while every
/// stream waits); a server meets its batch sizes here, before its first request. `done` is
/// called after each shape.
pub fn warm_up(model: &dyn LanguageModel, batches: &[usize], prompts: &[usize], mut done: impl FnMut()) -> Result<()> {
    for &rows in batches {
        let mut caches: Vec<ModelCache> = (0..rows).map(|_| model.new_cache()).collect();
        let mut refs: Vec<&mut ModelCache> = caches.iter_mut().collect();
        let tokens = Array::from_slice(&vec![0i32; rows], &[rows as i32, 1]);
        eval([&model.forward_batch(&tokens, &mut refs, Logits::Last, None)?])?;
        eval([&model.forward_batch(&tokens, &mut refs, Logits::Last, None)?])?;
        done();
    }
    for &length in prompts {
        let tokens = Array::from_slice(&vec![0i32; length], &[1, length as i32]);
        eval([&model.forward(&tokens, &mut model.new_cache(), Logits::Last, None)?])?;
        done();
    }
    Ok(())
}

/// [`next_batch`], with prompt `chunks` run in the same forward call as the decode step where
/// the model mixes them ([`LanguageModel::mixes_chunks`]) and every sequence draws on the device:
/// a chunk then costs its rows in the step's products, not a forward call of its own that the
/// streams wait through (its host work, and the decode pipeline drained around it). Elsewhere
/// each chunk runs alone first, as [`Decoding::prefill_along`] runs it.
pub fn next_batch_with_chunks(model: &dyn LanguageModel, steps: &mut [Step], chunks: &mut [Chunk]) -> Result<Vec<Option<u32>>> {
    let on_host: Vec<bool> = steps.iter().map(|s| s.decoding.draws_on_host(s.cache)).collect();
    let mixed = model.mixes_chunks() && !on_host.contains(&true) && chunks.iter().all(|c| c.decoding.may_ride(c.cache) && c.tokens > 0);
    if !mixed {
        run_alone(model, &Encoder::for_this_thread(), chunks)?;
    }
    let chunks: &mut [Chunk] = if mixed { chunks } else { &mut [] };
    let mut tokens = vec![None; steps.len()];
    if on_host.contains(&true) {
        // Host draws evaluate on this thread: the device steps' evaluator must be idle.
        Encoder::for_this_thread().wait()?;
        for (s, token) in steps.iter_mut().zip(tokens.iter_mut()).zip(&on_host).filter(|(_, &h)| h).map(|(st, _)| st) {
            *token = s.decoding.next_on_host(model, s.cache, s.sampler)?;
        }
    }
    let (mut device, places): (Vec<&mut Step>, Vec<usize>) =
        steps.iter_mut().enumerate().filter(|(i, _)| !on_host[*i]).map(|(i, s)| (s, i)).unzip();
    for (token, place) in device_round(model, &mut device, chunks)?.into_iter().zip(places) {
        tokens[place] = token;
    }
    Ok(tokens)
}

/// One token for each sequence drawing on the device, in three parts:
/// 1. draws from distributions already computed: the prompt's, and, under a grammar, the last
///    step's, whose mask the host worked out while that step ran;
/// 2. one batched forward over every sequence's newest token that may go in (two while the
///    pipeline fills), each unconstrained row's next token drawn in the same graph;
/// 3. each sequence's oldest token read (a batch's draws in one read) and handed out.
///
/// `chunks` run in the first forward call of part 2 (alone, on this thread, if there is none).
fn device_round(model: &dyn LanguageModel, steps: &mut [&mut Step], chunks: &mut [Chunk]) -> Result<Vec<Option<u32>>> {
    let live: Vec<usize> = (0..steps.len()).filter(|&i| !steps[i].decoding.done).collect();
    for &i in &live {
        steps[i].decoding.check_ready()?;
    }
    let mut encoder = Encoder::for_this_thread();
    if live.iter().any(|&i| steps[i].decoding.restart) {
        encoder = encoder.starting()?;
        live.iter().for_each(|&i| steps[i].decoding.restart = false);
    }
    for &i in &live {
        let decoding = &mut *steps[i].decoding;
        if let Some(token) = decoding.pending.take() {
            decoding.in_flight.push_back(InFlight { token: DeviceToken::known(token), logprobs: None, fed: None });
        }
    }

    // The tokens to hand out that are computed already (drawn a step or more ago, not under a
    // grammar) are asked for before this round's step is queued, so reading them never waits for
    // that step's encoding.
    let mut reads = Reads::default();
    for &i in &live {
        if !steps[i].sampler.is_constrained() {
            if let Some(front) = steps[i].decoding.in_flight.front() {
                reads.request(&encoder, front)?;
            }
        }
    }

    let drawing: Vec<usize> = live.iter().copied().filter(|&i| steps[i].decoding.undrawn.is_some() && steps[i].decoding.in_flight.is_empty()).collect();
    if !drawing.is_empty() {
        // The masks are independent: worked out at once, or sixteen sequences under grammars
        // would take sixteen masks' time while the device waits for the draw.
        for_constrained(steps, &drawing, |sampler, _| sampler.prepare())?;
        let masks = drawing.iter().map(|&i| steps[i].sampler.take_mask()).collect::<Result<Vec<_>>>()?;
        let rows: Vec<Array> = drawing.iter().filter_map(|&i| steps[i].decoding.undrawn.take()).collect();
        let outputs = encoder.build(|| -> Result<Vec<Array>> {
            let logits = if rows.len() == 1 { rows[0].clone() } else { mlx_rs::ops::concatenate(&rows, 0)? };
            let mut outputs = draw_into(model, steps, &drawing, &step_profile::stretch_start(&logits)?, &masks)?;
            outputs.extend(step_profile::stretch_end(&outputs[0])?);
            Ok(outputs)
        })?;
        encoder.queue(outputs)?;
    }

    // The chunks' ids, which of them end their prompts, and (once they ran) those ones' logits.
    let chunk_ids: Vec<Array> = chunks.iter().map(|c| c.decoding.chunk_ids(c.tokens)).collect();
    let ends: Vec<bool> = chunks.iter().map(Chunk::ends_prompt).collect();
    let mut chunk_logits: Option<Vec<Array>> = None;
    loop {
        let feeding: Vec<usize> =
            live.iter().copied().filter(|&i| steps[i].decoding.may_feed(model, steps[i].cache, steps[i].sampler.is_constrained())).collect();
        if feeding.is_empty() {
            break;
        }
        let mut inputs = Vec::with_capacity(feeding.len());
        for &i in &feeding {
            let checkpoint = steps[i].cache.checkpoint();
            let back = steps[i].decoding.in_flight.back_mut().expect("may_feed checked it");
            back.fed = Some(checkpoint);
            inputs.push(back.token.clone());
        }
        let constrained: Vec<bool> = feeding.iter().map(|&i| steps[i].sampler.is_constrained()).collect();
        let riding = chunk_logits.is_none() && !chunks.is_empty();
        let outputs = encoder.build(|| -> Result<Vec<Array>> {
            use mlx_rs::ops::indexing::TryIndexOp;
            let input = step_profile::stretch_start(&batch_input(&inputs)?)?;
            let mut caches: Vec<&mut ModelCache> =
                steps.iter_mut().enumerate().filter(|(i, _)| feeding.contains(i)).map(|(_, s)| &mut *s.cache).collect();
            let (logits, mut outputs) = if riding {
                let mut chunk_caches: Vec<&mut ModelCache> = chunks.iter_mut().map(|c| &mut *c.cache).collect();
                let all = model.forward_mixed(&input, &mut caches, &chunk_ids, &mut chunk_caches, &ends)?;
                let b = caches.len() as i32;
                let ended = (b..b + ends.iter().filter(|&&e| e).count() as i32).map(|r| all.try_index(r..r + 1)).collect::<std::result::Result<Vec<_>, _>>()?;
                let mut state: Vec<Array> = caches.iter().chain(&chunk_caches).flat_map(|c| c.arrays()).collect();
                state.extend(ended.iter().cloned());
                chunk_logits = Some(ended);
                (all.try_index(..b)?, state)
            } else {
                forward_batch_lazy(model, &input, &mut caches, Logits::Last)?
            };
            // What the step computes last: its draws, else its logits (a grammar row's).
            let mut last = logits.clone();
            for (row, &i) in feeding.iter().enumerate().filter(|(row, _)| constrained[*row]) {
                let undrawn = logits.try_index(row as i32..row as i32 + 1)?;
                outputs.push(undrawn.clone());
                steps[i].decoding.undrawn = Some(undrawn);
            }
            let free: Vec<usize> = feeding.iter().zip(&constrained).filter(|(_, &c)| !c).map(|(&i, _)| i).collect();
            if !free.is_empty() {
                let rows = if free.len() == feeding.len() {
                    logits
                } else {
                    let at: Vec<i32> = (0..feeding.len() as i32).filter(|&r| !constrained[r as usize]).collect();
                    logits.take_axis(Array::from_slice(&at, &[at.len() as i32]), 0)?
                };
                let masks: Vec<Option<TokenMask>> = free.iter().map(|_| None).collect();
                let rows = step_profile::stretch_tail(&rows)?;
                let drawn = draw_into(model, steps, &free, &rows, &masks)?;
                last = drawn[0].clone();
                outputs.extend(drawn);
            }
            outputs.extend(step_profile::stretch_end(&last)?);
            Ok(outputs)
        })?;
        encoder.queue(outputs)?;
    }

    match chunk_logits {
        Some(ended) => {
            let mut ended = ended.into_iter();
            for (chunk, &end) in chunks.iter_mut().zip(&ends) {
                chunk.decoding.took_chunk(chunk.tokens, if end { ended.next() } else { None });
            }
        }
        // No step went in this round.
        None => run_alone(model, &encoder, chunks)?,
    }

    let mut fronts = Vec::with_capacity(live.len());
    for &i in &live {
        let decoding = &mut *steps[i].decoding;
        let front = decoding.in_flight.pop_front().ok_or_else(|| Error::Usage("internal: no token in flight".into()))?;
        reads.request(&encoder, &front)?;
        let token = reads.take(&front.token.batch)?[front.token.row] as u32;
        let logprobs = match &front.logprobs {
            Some(queued) => Some(queued.unpack(token, reads.take(queued.array())?)),
            None => None,
        };
        fronts.push((i, token, front.fed, logprobs));
    }
    let (rows, drawn): (Vec<usize>, Vec<u32>) = fronts.iter().map(|&(i, token, ..)| (i, token)).unzip();
    for_constrained(steps, &rows, |sampler, at| sampler.commit(drawn[at]))?;
    let mut tokens = vec![None; steps.len()];
    for (i, token, fed, logprobs) in fronts {
        let Step { decoding, cache, .. } = &mut *steps[i];
        let in_cache = fed.is_some();
        decoding.rewind = fed;
        tokens[i] = decoding.hand_out(model, cache, token, in_cache, logprobs)?;
    }
    Ok(tokens)
}

/// `work` for the sampler of each sequence `rows[at]` that is under a grammar (given `at`), on
/// rayon's pool when there are several: llguidance's matchers are independent. The first error
/// in the steps' order is returned.
fn for_constrained(steps: &mut [&mut Step], rows: &[usize], work: impl Fn(&mut Sampler, usize) -> Result<()> + Sync) -> Result<()> {
    use rayon::prelude::*;
    let mut constrained: Vec<(usize, &mut Sampler)> = steps
        .iter_mut()
        .enumerate()
        .filter_map(|(i, s)| rows.iter().position(|&r| r == i).map(|at| (at, &mut *s.sampler)))
        .filter(|(_, sampler)| sampler.is_constrained())
        .collect();
    if constrained.len() > 1 {
        constrained.par_iter_mut().map(|(at, sampler)| work(sampler, *at)).collect::<Vec<_>>().into_iter().collect()
    } else {
        constrained.into_iter().try_for_each(|(at, sampler)| work(sampler, at))
    }
}

/// Reads asked of the evaluator, one per array (a batch's draws are read once for all its rows).
#[derive(Default)]
struct Reads(Vec<(Rc<Array>, Option<PendingRead>, Vec<i32>)>);

impl Reads {
    /// Asks for `token`'s draws (and its log-probabilities) unless that was done already.
    fn request(&mut self, encoder: &Encoder, token: &InFlight) -> Result<()> {
        let mut arrays = vec![token.token.batch.clone()];
        arrays.extend(token.logprobs.as_ref().map(|q| q.array().clone()));
        for array in arrays {
            if !self.0.iter().any(|(a, _, _)| Rc::ptr_eq(a, &array)) {
                let pending = encoder.request_i32(&array)?;
                self.0.push((array, Some(pending), Vec::new()));
            }
        }
        Ok(())
    }

    /// The values of `array`, asked for before.
    fn take(&mut self, array: &Rc<Array>) -> Result<&[i32]> {
        let at = self.0.iter().position(|(a, _, _)| Rc::ptr_eq(a, array)).ok_or_else(|| Error::Usage("internal: a read never asked for".into()))?;
        let entry = &mut self.0[at];
        if let Some(pending) = entry.1.take() {
            entry.2 = pending.wait()?;
        }
        Ok(&entry.2)
    }
}

/// Draws a token for each sequence `which[r]` from row r of `logits` under its settings (and
/// `masks[r]`), as its newest token in flight; returns what to evaluate with the draws.
fn draw_into(model: &dyn LanguageModel, steps: &mut [&mut Step], which: &[usize], logits: &Array, masks: &[Option<TokenMask>]) -> Result<Vec<Array>> {
    let vocab = model.info().vocab_size;
    let mut extras = Vec::with_capacity(which.len());
    for &i in which {
        let Step { decoding, sampler, .. } = &mut *steps[i];
        if decoding.draws.is_none() {
            decoding.draws = Some(SequenceDraws::new(sampler.params(), &decoding.history, vocab)?);
        }
        let leaving = match decoding.draws.as_ref().and_then(SequenceDraws::window) {
            Some(window) => decoding.leaving(window)?,
            None => None,
        };
        extras.push((sampler.next_key(), leaving));
    }
    let batch = {
        let mut rows: Vec<DrawRow> = steps
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| which.contains(i))
            .zip(extras.into_iter().zip(masks))
            .map(|((_, s), ((key, leaving), mask))| DrawRow {
                state: s.decoding.draws.as_mut().expect("made above"),
                key,
                mask: mask.as_ref().map(TokenMask::words),
                leaving,
            })
            .collect();
        Rc::new(draw_rows(logits, &mut rows)?.as_dtype(mlx_rs::Dtype::Int32)?)
    };
    let mut outputs = vec![(*batch).clone()];
    for (row, &i) in which.iter().enumerate() {
        let decoding = &mut *steps[i].decoding;
        let token = DeviceToken { batch: batch.clone(), row };
        let logprobs = match decoding.logprobs.generated {
            Some(top) => {
                use mlx_rs::ops::indexing::TryIndexOp;
                let queued = Queued::new(&logits.try_index(row as i32..row as i32 + 1)?, &token.single()?, top)?;
                outputs.push((**queued.array()).clone());
                Some(queued)
            }
            None => None,
        };
        outputs.extend(decoding.draws.as_ref().into_iter().flat_map(SequenceDraws::arrays).cloned());
        decoding.in_flight.push_back(InFlight { token, logprobs, fed: None });
    }
    Ok(outputs)
}

/// The tokens to run through the model, `[rows, 1]` int32: one step's draws as they are when
/// they are exactly its rows in order (a batch going on unchanged), else gathered.
fn batch_input(tokens: &[DeviceToken]) -> Result<Array> {
    let n = tokens.len() as i32;
    let first = &tokens[0].batch;
    if first.shape()[0] == n && tokens.iter().enumerate().all(|(row, t)| Rc::ptr_eq(&t.batch, first) && t.row == row) {
        return Ok(first.reshape(&[n, 1])?);
    }
    let parts = tokens.iter().map(DeviceToken::single).collect::<Result<Vec<_>>>()?;
    Ok(mlx_rs::ops::concatenate(&parts, 0)?.reshape(&[n, 1])?)
}

/// The draft's greedy guesses of the `count` tokens after `first`, from the first `layers`
/// layers; the cache is left as it was. The guesses stay on the device until all are made.
fn draft_guesses(model: &dyn LanguageModel, cache: &mut ModelCache, first: u32, layers: usize, count: usize) -> Result<Vec<u32>> {
    let checkpoint = cache.checkpoint();
    let mut token = Array::from_slice(&[first as i32], &[1, 1]);
    let mut guesses = Vec::with_capacity(count);
    for _ in 0..count {
        let logits = timed(Part::Build, || model.forward_draft(&token, cache, layers))?;
        token = queue_argmax(&logits, &cache.arrays())?;
        guesses.push(token.clone());
    }
    let guesses = mlx_rs::ops::concatenate(&guesses, 1)?;
    timed(Part::Blocked, || eval([&guesses]))?;
    let ids = guesses.as_slice::<i32>().iter().map(|&t| t as u32).collect();
    cache.restore(checkpoint);
    Ok(ids)
}

/// The argmax of `logits` `[1, vocab]` as a `[1, 1]` int32 token id, not evaluated.
fn argmax_token(logits: &Array) -> Result<Array> {
    Ok(mlx_rs::ops::indexing::argmax_axis(logits, -1, false)?.as_dtype(mlx_rs::Dtype::Int32)?.reshape(&[1, 1])?)
}

/// [`argmax_token`], queued for evaluation together with `state` (the caches it depends on), so
/// the device computes it while the host goes on.
fn queue_argmax(logits: &Array, state: &[Array]) -> Result<Array> {
    let token = argmax_token(logits)?;
    step_profile::encode(std::iter::once(&token).chain(state))?;
    Ok(token)
}

/// Runs `forward` with the cache's recurrent layers recording a replay of it (so the cache can be
/// rolled back to any length inside the call), and recording off again afterwards.
fn with_replay<T>(cache: &mut ModelCache, forward: impl FnOnce(&mut ModelCache) -> Result<T>) -> Result<T> {
    cache.record_replay(true);
    let result = forward(cache);
    cache.record_replay(false);
    result
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
        forward_eval(model, cache, chunk, Logits::Last)?;
    }
    Ok(())
}

/// [`extend`] along `trail`: chunks end at its stops, and it keeps its points on the way.
/// `progress` is told the tokens in so far.
pub fn extend_along(
    model: &dyn LanguageModel,
    cache: &mut ModelCache,
    trail: &mut Trail,
    tokens: &[u32],
    step: usize,
    mut progress: impl FnMut(usize),
) -> Result<()> {
    let (start, end) = (cache.len(), cache.len() + tokens.len());
    while cache.len() < end {
        let upto = trail.chunk_end(cache.len(), step).min(end);
        extend(model, cache, &tokens[cache.len() - start..upto - start], step)?;
        trail.observe(cache)?;
        progress(cache.len() - start);
    }
    Ok(())
}

/// Decodes known tokens, `steps[i]` holding step i's token for each sequence (row b on
/// `caches[b]`), one batched forward call a step, building step n+1 while the evaluator thread
/// encodes step n and the device runs the steps before (engine::encoder), so the host's work
/// overlaps the device's. For measuring decode speed (`sala bench`).
pub fn decode_pipelined(model: &dyn LanguageModel, caches: &mut [&mut ModelCache], steps: &[&[u32]]) -> Result<()> {
    let encoder = Encoder::for_this_thread().starting()?;
    let mut last = None;
    // SALA_FIXED_STEP=on: one sequence's steps as fixed steps where they apply (engine::fixed_step),
    // for measuring them against steps built afresh while they are not yet what users run.
    let mut fixed = (caches.len() == 1 && std::env::var("SALA_FIXED_STEP").is_ok_and(|v| v == "on")).then(FixedSteps::new);
    let queued = steps.iter().try_for_each(|step| -> Result<()> {
        let ids: Vec<i32> = step.iter().map(|&t| t as i32).collect();
        let input = Array::from_slice(&ids, &[ids.len() as i32, 1]);
        let (logits, state, end) = encoder.build(|| -> Result<_> {
            let input = step_profile::stretch_start(&input)?;
            let stepped = match (&mut fixed, &mut *caches) {
                (Some(fixed), [cache]) => fixed.decode(model, &input, cache)?.map(|(logits, position)| {
                    let state: Vec<Array> = cache.arrays().into_iter().chain([position]).collect();
                    (logits, state)
                }),
                _ => None,
            };
            let (logits, state) = match stepped {
                Some(done) => done,
                None => forward_batch_lazy(model, &input, caches, Logits::Last)?,
            };
            let end = step_profile::stretch_end(&logits)?;
            Ok((logits, state, end))
        })?;
        encoder.queue(std::iter::once(logits.clone()).chain(state.iter().cloned()).chain(end).collect())?;
        last = Some((logits, state));
        Ok(())
    });
    // Also after a failure: the caller may evaluate on this thread once the evaluator is idle.
    let waited = encoder.wait();
    queued?;
    waited?;
    if let Some((logits, state)) = last {
        eval(std::iter::once(&logits).chain(state.iter()))?;
    }
    Ok(())
}

/// One forward call, not evaluated: the logits and every array the caches hold.
fn forward_batch_lazy(model: &dyn LanguageModel, input: &Array, caches: &mut [&mut ModelCache], which: Logits) -> Result<(Array, Vec<Array>)> {
    let logits = model.forward_batch(input, caches, which, None)?;
    Ok((logits, caches.iter().flat_map(|c| c.arrays()).collect()))
}

/// One forward call over `tokens` returning the logits `which` asks for, evaluated together with
/// the cache so the lazy graph never outlives the step.
fn forward_eval(model: &dyn LanguageModel, cache: &mut ModelCache, tokens: &[u32], which: Logits) -> Result<Array> {
    let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    forward_eval_batch(model, &Array::from_slice(&ids, &[1, ids.len() as i32]), &mut [cache], which)
}

/// [`forward_eval`] for one token, queued on the device (`async_eval`) and returned unread, so
/// the host can do other work before reading the logits.
fn forward_queued(model: &dyn LanguageModel, cache: &mut ModelCache, tokens: &[u32]) -> Result<Array> {
    let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
    let (logits, state) = timed(Part::Build, || forward_batch_lazy(model, &Array::from_slice(&ids, &[1, ids.len() as i32]), &mut [cache], Logits::Last))?;
    step_profile::encode(std::iter::once(&logits).chain(state.iter()))?;
    Ok(logits)
}

/// [`forward_eval`] for a batch: `input` `[B, T]`, row b on `caches[b]`.
fn forward_eval_batch(model: &dyn LanguageModel, input: &Array, caches: &mut [&mut ModelCache], which: Logits) -> Result<Array> {
    let (logits, state) = timed(Part::Build, || forward_batch_lazy(model, input, caches, which))?;
    // Other sequences' decode steps may still be encoding (a server round): this thread
    // evaluates only once the evaluator is idle.
    Encoder::for_this_thread().wait()?;
    step_profile::encode(std::iter::once(&logits).chain(state.iter()))?;
    timed(Part::Blocked, || eval(std::iter::once(&logits).chain(state.iter())))?;
    Ok(logits)
}
