//! The worker that owns the model and serves every request (continuous batching): new requests
//! are admitted between decode steps (up to `parallel` at once, and while their caches, grown to
//! the prompt and `max_tokens`, fit in the memory the requests share: the rest wait in order),
//! their prompts go in chunks that share a budget of tokens per round, and every round runs one
//! batched forward that advances each request whose prompt is in by a token, whatever its length. A long answer never blocks a short
//! one; a request whose client went away is dropped before the next round, freeing its slot and
//! cache at once. A [`PrefixCache`] keeps the state of each prompt and each answer with restart
//! points along it, so a request that shares the start of an earlier one (a document asked again,
//! a conversation's next turn) prefills only what is new. A request that shares its start with a
//! prompt still going in waits for it (its kept state is looked up once that one is in), so
//! requests arriving together over one document prefill it once; any other goes in beside it, so a
//! short prompt is not held behind a long one.

use super::metrics::Metrics;
use crate::engine::cache::ModelCache;
use crate::engine::grammar::{Constraint, Grammar, GrammarCompiler, Reasoning};
use crate::engine::encoder::Encoder;
use crate::engine::generate::{next_batch_with_chunks, Chunk, Decoding, GenerateOptions, LogprobOptions, Step, StopReason};
use crate::engine::logprobs::TokenLogprobs;
use crate::engine::model::LanguageModel;
use crate::engine::prefix_cache::{PrefixCache, Start, Trail};
use crate::engine::sampler::{Sampler, SamplingParams};
use crate::engine::step_profile;
use crate::engine::tokenizer::{StreamDecoder, TextTokenizer};
use std::collections::VecDeque;
use crate::engine::distributed::TensorParallel;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::time::Instant;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

/// A request as the worker sees it.
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// What the answer is held to (response_format, a forced tool call).
    pub constraint: Option<Constraint>,
    pub max_tokens: usize,
    /// Go on past end-of-sequence tokens (vLLM's `ignore_eos`, for measuring at a fixed length).
    pub ignore_eos: bool,
    /// Strings that end the answer (not included in it).
    pub stop: Vec<String>,
    /// Log-probabilities to report: of generated tokens (with [`Event::Text`]) and of the
    /// prompt's (one [`Event::PromptLogprobs`]; such a prompt is run whole, not from the prefix cache).
    pub logprobs: LogprobOptions,
    /// When the request arrived (time to first token and latency are measured from it).
    pub received: Instant,
    pub events: UnboundedSender<Event>,
    /// Keeps the model loaded while the job runs (set by `submit`).
    pub lease: Option<super::pool::Lease>,
}

/// A generated token's log-probabilities and where its text starts in the answer (bytes).
#[derive(Debug, Clone)]
pub struct AnswerToken {
    pub logprobs: TokenLogprobs,
    pub offset: usize,
}

#[derive(Debug, Clone)]
pub enum Event {
    /// More answer text, with the log-probabilities of the tokens it completes (when asked for):
    /// a token whose text straddles a piece goes with the piece that ends it.
    Text { text: String, logprobs: Vec<AnswerToken> },
    /// The request is admitted: its kept state is looked up, and this many prompt tokens come
    /// from it (sent before anything else, so a stream's first event can report the split).
    Started { cached_tokens: usize },
    /// The log-probability of each prompt token after the first, once the prompt is in.
    PromptLogprobs(Vec<TokenLogprobs>),
    Done {
        finish_reason: &'static str,
        /// The stop string that ended the answer, if one did.
        stop_sequence: Option<String>,
        prompt_tokens: usize,
        completion_tokens: usize,
        cached_tokens: usize,
        /// From the request's arrival to its first generated token (`None`: it generated none).
        first_token: Option<std::time::Duration>,
    },
    Error(String),
    /// Ended unfinished: the server is shutting down.
    Shutdown,
}

struct Active {
    /// The request's number in this worker (the same on every rank of a tensor-parallel group).
    id: u64,
    job: Job,
    cache: ModelCache,
    /// Restart points kept along the way.
    trail: Trail,
    sampler: Sampler,
    decoding: Decoding,
    decoder: StreamDecoder,
    /// Text produced but held back because it could be the start of a stop string.
    held: String,
    /// Bytes of answer text produced and sent so far.
    produced: usize,
    sent: usize,
    /// Log-probabilities of tokens whose text is not all sent yet, with where it starts and
    /// ends in the answer (bytes).
    pending: VecDeque<(TokenLogprobs, usize, usize)>,
    /// Bytes of cache memory held for it (see [`CacheMemory`]).
    reserved: u64,
    /// Prompt tokens taken from the prefix cache.
    cached_tokens: usize,
    /// When the first token came (time to first token is measured once).
    answered: Option<std::time::Duration>,
}

/// How the worker batches.
#[derive(Clone, Copy)]
pub struct Batching<'a> {
    /// Prompt tokens per forward pass during prefill.
    pub prefill_step: usize,
    /// Requests decoded together.
    pub parallel: usize,
    /// The memory the requests' caches share; `None` where the device's is unknown.
    pub memory: Option<CacheMemory<'a>>,
}

/// The memory the requests' caches may take together. A request is admitted only while its cache,
/// grown to its prompt and `max_tokens`, fits beside those of the requests already in; else it
/// waits in order (one that could not fit alone is refused).
#[derive(Clone, Copy)]
pub struct CacheMemory<'a> {
    /// Bytes for all the requests' caches together.
    pub budget: u64,
    /// Bytes one request's cache of so many tokens takes.
    pub per_request: &'a dyn Fn(usize) -> u64,
}

impl CacheMemory<'_> {
    /// What a request of `prompt` tokens and `max_tokens` more reserves.
    fn need(&self, prompt: usize, max_tokens: usize) -> u64 {
        (self.per_request)(prompt.saturating_add(max_tokens))
    }
}

/// Paces prompt chunks against the decode steps beside them. While requests decode, a round is
/// its prompt chunks and then a step for every decoding request, so the chunks delay each of
/// their next tokens by their whole time: a round's chunks are sized to cost three quarters of a
/// decode step, so the streams' time between tokens grows by at most 1.75× while a long prompt
/// goes in (the field's mark is 2×, with room left for noise). With nothing decoding, prompts go
/// in at the full `--prefill-step`. The costs are measured as the server runs:
/// - a decode step's by the rows it decodes (64 rows cost several times 16): a round at a row
///   count with no recent measurement near it runs no chunk and measures it;
/// - a prompt token's from chunks with nothing decoding beside them;
/// - and what a chunk beside decoding costs beyond its tokens (a forward's fixed costs, on CUDA
///   planning each new attention shape among them), which a chunk is made at least as long as:
///   costed per token instead, small chunks would look dear and shrink the next ones to the
///   smallest.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
struct Pace {
    /// Seconds of a round with a decode step and no chunk, by the rows it decoded.
    decode: std::collections::BTreeMap<usize, Measured>,
    /// Seconds a prompt token takes (a moving average).
    token: Option<f64>,
    /// `token` was measured with nothing decoding; until then it is a chunk's whole cost beside
    /// decoding over its tokens.
    token_alone: bool,
    /// Seconds a chunk beside a decode step adds beyond its tokens' own (a moving average).
    overhead: Option<f64>,
    /// Rounds observed, the clock that ages the decode measurements.
    rounds: u64,
}

/// A moving average of a round's seconds, and the round it was last fed.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct Measured {
    seconds: f64,
    round: u64,
}

impl Pace {
    /// The smallest paced chunk: below it a chunk's fixed cost would starve the prompt
    /// (eval/results/kernel-notes.md).
    const MIN_CHUNK: usize = 512;
    /// Paced chunks are whole attention blocks.
    const ALIGN: usize = 64;
    /// Weight of the newest round in the moving averages.
    const NEWEST: f64 = 0.25;
    /// A paced chunk's cost, in decode steps.
    const SHARE: f64 = 0.75;
    /// A decode measurement serves row counts up to a quarter away from its own.
    const NEAR: usize = 4;
    /// Rounds after which a decode measurement is taken again (the streams' contexts grow).
    const STALE: u64 = 256;

    /// Prompt tokens for the next chunk, of at most `step`, beside a decode step of `rows`; none
    /// when that step's cost must be measured first.
    fn chunk(&self, rows: usize, step: usize) -> usize {
        if rows == 0 {
            return step;
        }
        let Some(decode) = self.decode_step(rows) else { return 0 };
        let overhead = self.overhead.unwrap_or(0.0);
        let seconds = (Self::SHARE * decode - overhead).max(overhead);
        let paced = match self.token {
            Some(token) if token > 0.0 => (seconds / token) as usize / Self::ALIGN * Self::ALIGN,
            // Not measured yet: a small chunk measures it at little cost to the streams.
            _ => Self::MIN_CHUNK,
        };
        paced.clamp(Self::MIN_CHUNK.min(step), step)
    }

    /// A decode step of `rows`, from fresh measurements near it (between the nearest below and
    /// above, where both are near).
    fn decode_step(&self, rows: usize) -> Option<f64> {
        let near = rows / Self::NEAR;
        let fresh = |(&n, m): (&usize, &Measured)| self.is_fresh(m).then_some((n, m.seconds));
        let below = self.decode.range(rows.saturating_sub(near)..=rows).rev().find_map(fresh);
        let above = self.decode.range(rows..=rows + near).find_map(fresh);
        match (below, above) {
            (Some((lo, a)), Some((hi, b))) if hi > lo => Some(a + (b - a) * (rows - lo) as f64 / (hi - lo) as f64),
            (Some((_, seconds)), _) | (None, Some((_, seconds))) => Some(seconds),
            (None, None) => None,
        }
    }

    /// Whether a decode measurement is recent enough to stand for its rows.
    fn is_fresh(&self, m: &Measured) -> bool {
        self.rounds.saturating_sub(m.round) <= Self::STALE
    }

    /// Takes one round's time: `chunk` prompt tokens run, and a decode step of `rows` (0: none).
    fn observe(&mut self, seconds: f64, chunk: usize, rows: usize) {
        self.rounds += 1;
        let average = |old: Option<f64>, new: f64| old.map_or(new, |old| old + Self::NEWEST * (new - old));
        match (chunk, rows) {
            (0, 0) => {}
            (0, rows) => {
                let old = self.decode.get(&rows).filter(|m| self.is_fresh(m)).map(|m| m.seconds);
                self.decode.insert(rows, Measured { seconds: average(old, seconds), round: self.rounds });
            }
            // A chunk's fixed cost is spread thin only over a chunk of some length.
            (n, 0) if n >= Self::MIN_CHUNK => {
                self.token = Some(average(self.token.filter(|_| self.token_alone), seconds / n as f64));
                self.token_alone = true;
            }
            (_, 0) => {}
            (n, rows) => {
                let Some(decode) = self.decode_step(rows) else { return };
                match self.token {
                    Some(token) if self.token_alone => self.overhead = Some(average(self.overhead, (seconds - decode - n as f64 * token).max(0.0))),
                    _ => self.token = Some(average(self.token, (seconds - decode).max(0.0) / n as f64)),
                }
            }
        }
    }
}

/// Where each round's new requests, cancellations and shutdown come from.
pub enum Intake {
    /// The server's channel (one device).
    Channel(Receiver<Job>),
    /// Rank 0 of a tensor-parallel group: the server's channel, each round handed to the other
    /// ranks, which must run the same rounds.
    Leader(Receiver<Job>, TensorParallel),
    /// Another rank of the group: rank 0's rounds (its answers go nowhere).
    Follower(Follower),
}

/// A rank other than 0 of a tensor-parallel group serving alongside rank 0.
pub struct Follower {
    tp: TensorParallel,
    /// Compiles the grammars of rank 0's requests (made at the first one).
    compiler: Option<GrammarCompiler>,
    /// The other ends of the requests' event channels, kept open and emptied.
    sinks: Vec<UnboundedReceiver<Event>>,
}

impl Follower {
    pub fn new(tp: TensorParallel) -> Self {
        Self { tp, compiler: None, sinks: Vec::new() }
    }
}

/// What a round starts from: the requests that arrived (numbered, as [`Job`]s; as [`JobSpec`]s
/// where rank 0 hands the round to the other ranks).
#[derive(serde::Serialize, serde::Deserialize)]
struct Round<J> {
    arrived: Vec<J>,
    /// Requests whose client went away.
    gone: Vec<u64>,
    /// End every request held (the shutdown deadline passed).
    abort: bool,
    /// Nothing left to do and no more requests can come: return.
    end: bool,
    /// Rank 0's pace, handed to the other ranks while prompts may go in: their chunks must be
    /// rank 0's, which their own clocks would not give.
    pace: Option<Pace>,
}

impl<J> Default for Round<J> {
    fn default() -> Self {
        Self { arrived: Vec::new(), gone: Vec::new(), abort: false, end: false, pace: None }
    }
}

impl<J> Round<J> {
    /// Nothing happened (rank 0 hands the others no bytes for it, unless prompts may go in).
    fn is_empty(&self) -> bool {
        self.arrived.is_empty() && self.gone.is_empty() && !self.abort && !self.end
    }
}

/// What every rank needs to run a request as rank 0 does (the seed included, so every rank draws
/// the same tokens).
#[derive(serde::Serialize, serde::Deserialize)]
struct JobSpec {
    id: u64,
    prompt: Vec<u32>,
    sampling: SamplingParams,
    grammar: Option<(Grammar, Reasoning)>,
    max_tokens: usize,
    ignore_eos: bool,
    stop: Vec<String>,
    logprobs: LogprobOptions,
}

/// How long rank 0 waits for a request before it hands the others an empty round: they wait in
/// a collective, which on a GPU spins.
const IDLE_ROUND: std::time::Duration = std::time::Duration::from_millis(100);

impl Intake {
    /// The next round; blocks for a request when `idle`. `closed`: the requests held whose
    /// client went away; `next_id` numbers arrivals. Rank 0 hands `pace` on with a round in
    /// which a prompt may go in (`prompts`: one is held or queued; or one arrived); a follower's
    /// round returns rank 0's.
    #[allow(clippy::too_many_arguments)]
    fn round(
        &mut self,
        idle: bool,
        closed: Vec<u64>,
        abort: bool,
        next_id: &mut u64,
        pace: &Pace,
        prompts: bool,
        model: &dyn LanguageModel,
        tokenizer: &TextTokenizer,
    ) -> crate::engine::error::Result<Round<(u64, Job)>> {
        let mut take = |jobs: &Receiver<Job>, wait: Option<std::time::Duration>| {
            let mut round = Round { abort, ..Round::default() };
            let mut disconnected = false;
            if idle {
                let first = match wait {
                    None => jobs.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    Some(w) => jobs.recv_timeout(w),
                };
                match first {
                    Ok(job) => round.arrived.push((std::mem::replace(next_id, *next_id + 1), job)),
                    Err(RecvTimeoutError::Disconnected) => disconnected = true,
                    Err(RecvTimeoutError::Timeout) => {}
                }
            }
            while !disconnected {
                match jobs.try_recv() {
                    Ok(job) => round.arrived.push((std::mem::replace(next_id, *next_id + 1), job)),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => disconnected = true,
                }
            }
            round.end = disconnected && idle && round.arrived.is_empty();
            round.gone = closed.clone();
            round.gone.extend(round.arrived.iter().filter(|(_, j)| j.events.is_closed()).map(|(id, _)| *id));
            round
        };
        match self {
            Intake::Channel(jobs) => Ok(take(jobs, None)),
            Intake::Leader(jobs, tp) => {
                let mut round = take(jobs, Some(IDLE_ROUND));
                for (_, job) in &mut round.arrived {
                    job.sampling.seed.get_or_insert_with(rand::random);
                }
                tp.share_bytes(|| {
                    let prompts = prompts || !round.arrived.is_empty();
                    if round.is_empty() && !prompts {
                        return Ok(Vec::new());
                    }
                    let spec = Round {
                        arrived: round.arrived.iter().map(|(id, job)| JobSpec::of(*id, job)).collect(),
                        gone: round.gone.clone(),
                        abort: round.abort,
                        end: round.end,
                        pace: prompts.then(|| pace.clone()),
                    };
                    Ok::<_, crate::engine::error::Error>(serde_json::to_vec(&spec).expect("a round serialises"))
                })?;
                Ok(round)
            }
            Intake::Follower(f) => {
                for sink in &mut f.sinks {
                    while sink.try_recv().is_ok() {}
                }
                f.sinks.retain(|s| !s.is_closed() || !s.is_empty());
                let bytes = f.tp.share_bytes(|| Ok::<_, crate::engine::error::Error>(Vec::new()))?;
                let spec: Round<JobSpec> = if bytes.is_empty() {
                    Round::default()
                } else {
                    serde_json::from_slice(&bytes).map_err(|e| crate::engine::error::Error::Usage(format!("internal: rank 0's round does not parse: {e}")))?
                };
                let mut arrived = Vec::with_capacity(spec.arrived.len());
                for job in spec.arrived {
                    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                    f.sinks.push(rx);
                    let constraint = match &job.grammar {
                        None => None,
                        Some((grammar, reasoning)) => {
                            if f.compiler.is_none() {
                                let info = model.info();
                                f.compiler = Some(tokenizer.grammar_compiler(info.vocab_size, &info.eos_token_ids)?);
                            }
                            Some(f.compiler.as_ref().expect("made above").compile(grammar, *reasoning)?)
                        }
                    };
                    let received = Instant::now();
                    let id = job.id;
                    let job = Job { prompt: job.prompt, sampling: job.sampling, constraint, max_tokens: job.max_tokens, ignore_eos: job.ignore_eos, stop: job.stop, logprobs: job.logprobs, received, events: tx, lease: None };
                    arrived.push((id, job));
                }
                Ok(Round { arrived, gone: spec.gone, abort: spec.abort, end: spec.end, pace: spec.pace })
            }
        }
    }
}

impl JobSpec {
    fn of(id: u64, job: &Job) -> Self {
        Self {
            id,
            prompt: job.prompt.clone(),
            sampling: job.sampling.clone(),
            grammar: job.constraint.as_ref().map(|c| c.source().clone()),
            max_tokens: job.max_tokens,
            ignore_eos: job.ignore_eos,
            stop: job.stop.clone(),
            logprobs: job.logprobs,
        }
    }
}

/// Runs until no more requests can come (every sender of the intake's channel is gone, or rank 0
/// says so) and nothing is left to do, then returns the prompt states it kept (starting from
/// `prefixes`); once `abort` is set, every request held or queued is ended with
/// [`Event::Shutdown`]. `metrics` are kept up to date as it goes. Every rank of a tensor-parallel
/// group runs the same rounds: what could differ between them (arrivals, clients gone, the
/// shutdown) comes from rank 0's intake.
pub fn run(
    model: &dyn LanguageModel,
    tokenizer: std::sync::Arc<TextTokenizer>,
    batching: Batching,
    mut intake: Intake,
    abort: std::sync::Arc<std::sync::atomic::AtomicBool>,
    mut prefixes: PrefixCache,
    metrics: &Metrics,
) -> PrefixCache {
    let Batching { prefill_step, parallel, memory } = batching;
    let mut active: Vec<Active> = Vec::new();
    let mut waiting: VecDeque<(u64, Job)> = VecDeque::new();
    let mut next_id = 0u64;
    let mut pace = Pace::default();
    let mut prefill_turn = false;
    let (mut variants, mut last_round) = (crate::kernels::custom::variants_launched(), Instant::now());
    loop {
        metrics.observe_memory();
        // Kernel variants met for the first time are compiled as the round that met them runs
        // unless an earlier process left them on disk (seconds each on CUDA, every stream
        // waits): the log names them beside that round's time and where their code came from.
        let launched = crate::kernels::custom::variants_launched();
        if launched > variants {
            let met = crate::kernels::custom::variants_from(variants).join(" ");
            let round_ms = last_round.elapsed().as_secs_f64() * 1e3;
            let (from_disk, compiled, left_to_mlx) = crate::kernels::module_cache::counts();
            tracing::info!(new = launched - variants, round_ms, from_disk, compiled, left_to_mlx, variants = met, "kernel variants met for the first time");
            metrics.kernel_variants.set(launched as i64);
            variants = launched;
        }
        // Take what is queued; block for the next request only when there is nothing to do.
        let idle = active.is_empty() && waiting.is_empty();
        if idle {
            metrics.queue_depth.set(0);
            metrics.batch_size.set(0);
            metrics.kv_reserved.set(0);
        }
        let closed: Vec<u64> =
            waiting.iter().filter(|(_, j)| j.events.is_closed()).map(|(id, _)| *id).chain(active.iter().filter(|a| a.job.events.is_closed()).map(|a| a.id)).collect();
        let aborting = abort.load(std::sync::atomic::Ordering::SeqCst);
        let prompts = !waiting.is_empty() || active.iter().any(|a| !a.decoding.is_prefilled());
        let mut round = match intake.round(idle, closed, aborting, &mut next_id, &pace, prompts, model, &tokenizer) {
            Ok(round) => round,
            Err(e) => {
                eprintln!("error: the worker stops: {e}");
                return prefixes;
            }
        };
        // The round's work starts once its intake is in (an idle server blocks there).
        last_round = Instant::now();
        if round.end {
            return prefixes;
        }
        if let Some(leaders) = round.pace.take() {
            pace = leaders;
        }
        waiting.extend(round.arrived);
        if round.abort {
            for events in active.drain(..).map(|a| a.job.events).chain(waiting.drain(..).map(|(_, j)| j.events)) {
                let _ = events.send(Event::Shutdown);
            }
            continue;
        }
        waiting.retain(|(id, _)| !round.gone.contains(id));
        active.retain(|a| !round.gone.contains(&a.id));
        // Oldest first, but one that shares its start with a prompt still going in waits for it
        // (then starts from the state it leaves) while later ones that share none go in.
        while active.len() < parallel.max(1) {
            let going_in: Vec<&[u32]> = active.iter().filter(|a| !a.decoding.is_prefilled()).map(|a| a.job.prompt.as_slice()).collect();
            let Some(next) = waiting.iter().position(|(_, job)| !going_in.iter().any(|p| shares_start(p, &job.prompt))) else { break };
            let Some((id, job)) = waiting.remove(next) else { break };
            let reserved = memory.map_or(0, |m| m.need(job.prompt.len(), job.max_tokens));
            if let Some(m) = memory {
                if reserved > m.budget {
                    let _ = job.events.send(Event::Error(too_big_alone(&job, reserved, m.budget)));
                    continue;
                }
                let held: u64 = active.iter().map(|a| a.reserved).sum();
                if held.saturating_add(reserved) > m.budget {
                    // Its turn stays: it goes in once enough of the others are done.
                    waiting.insert(next, (id, job));
                    break;
                }
            }
            // The running requests' steps may still be encoding; a kept state is read on this
            // thread only once the evaluator is idle (engine::encoder).
            if let Err(e) = Encoder::for_this_thread().wait() {
                let _ = job.events.send(Event::Error(e.to_string()));
                continue;
            }
            if let Some(a) = admit(model, id, job, prefill_step, &mut prefixes, metrics) {
                active.push(Active { reserved, ..a });
            }
        }
        metrics.queue_depth.set(waiting.len() as i64);
        metrics.batch_size.set(active.len() as i64);
        metrics.kv_reserved.set(active.iter().map(|a| a.reserved).sum::<u64>().min(i64::MAX as u64) as i64);
        // The pace's costs are of the chunk and the decode step alone (not of admissions).
        crate::engine::memory::trim_cached();
        let stepped = Instant::now();
        let host_before = step_profile::totals();
        // A round's prompt budget is shared by the prompts going in, each a chunk (a forward) of
        // its own: many short prompts arriving together go in over a few rounds, not one a
        // round. The order alternates between the fewest tokens left (a short prompt answers at
        // once) and the oldest, so neither kind starves.
        prefill_turn = !prefill_turn;
        let rows = active.iter().filter(|a| a.decoding.is_prefilled()).count();
        let mut budget = PromptBudget::new(pace.chunk(rows, prefill_step));
        let given = budget.left;
        let order = prefill_order(&active, prefill_turn);
        let (going_in, mut chunks, mut prompt_tokens) = (order.len(), 0, 0);
        let mut gone = Vec::new();
        // With requests decoding and SALA_MIXED_ROUNDS=on, a chunk rides their step's forward call
        // where the model runs them together (engine::generate::next_batch_with_chunks):
        // (request, tokens). Off by default until it is faster on a GPU than chunks alone (it was
        // not: eval/results/2026-12-01-h200-mixed-rounds).
        let mixing = rows > 0 && model.mixes_chunks() && mixed_rounds();
        let mut riders: Vec<(usize, usize)> = Vec::new();
        for i in order {
            let a = &mut active[i];
            let Some(offer) = budget.offer(a.job.prompt.len().saturating_sub(a.cache.len())) else { continue };
            if mixing && a.decoding.may_ride(&a.cache) {
                let tokens = a.decoding.chunk_along(&a.cache, &a.trail, offer);
                budget.spend(tokens);
                chunks += 1;
                prompt_tokens += tokens;
                metrics.prefill_chunk_tokens.observe(tokens as f64);
                riders.push((i, tokens));
                continue;
            }
            // A prompt that rode a step before holds what the evaluator may still be encoding,
            // and a long chunk's pacing evaluates on this thread.
            if mixed_rounds() {
                if let Err(e) = Encoder::for_this_thread().wait() {
                    let _ = a.job.events.send(Event::Error(e.to_string()));
                    gone.push(i);
                    continue;
                }
            }
            let before = a.cache.len();
            let step = a.decoding.prefill_along(model, &mut a.cache, &mut a.trail, offer);
            let ran = a.cache.len().saturating_sub(before);
            budget.spend(ran);
            chunks += 1;
            prompt_tokens += ran;
            if ran > 0 {
                metrics.prefill_chunk_tokens.observe(ran as f64);
            }
            if !step.and_then(|done| chunk_ran(a, done, &mut prefixes, metrics)).unwrap_or_else(|e| failed(a, e)) {
                gone.push(i);
            }
        }
        let chunk = budget.charged();
        let chunks_ms = stepped.elapsed().as_secs_f64() * 1e3;
        gone.sort_unstable();
        for (r, _) in riders.iter_mut() {
            *r -= gone.iter().filter(|&&g| g < *r).count();
        }
        for i in gone.into_iter().rev() {
            active.remove(i);
        }
        // One batched step for every request whose prompt is in.
        let ready: Vec<usize> = (0..active.len()).filter(|&i| active[i].decoding.is_prefilled()).collect();
        // What each round did, for `--log-level debug`: how the prompts going in shared it, and
        // the memory MLX holds for arrays and keeps cached for reuse.
        let round = |decoded: usize| {
            let ms = stepped.elapsed().as_secs_f64() * 1e3;
            if tracing::enabled!(tracing::Level::DEBUG) {
                let mib = |bytes: Result<usize, _>| bytes.map_or(0, |b| b >> 20);
                let (active_mib, cached_mib) = (mib(mlx_rs::memory::active_memory()), mib(mlx_rs::memory::cache_memory()));
                // Where the round's host time went (engine::step_profile), the chunks' part first.
                let host = step_profile::totals() - host_before;
                let (build_ms, encode_ms, blocked_ms, read_wait_ms) = (host.build_ns as f64 / 1e6, host.encode_ns as f64 / 1e6, host.blocked_ns as f64 / 1e6, host.device_wait_ns as f64 / 1e6);
                let riding = riders.len();
                tracing::debug!(decoded, going_in, waiting = waiting.len(), budget = given, chunks, riding, prompt_tokens, ms, chunks_ms, build_ms, encode_ms, blocked_ms, read_wait_ms, active_mib, cached_mib, "round");
            }
        };
        if ready.is_empty() {
            round(0);
            pace.observe(stepped.elapsed().as_secs_f64(), chunk, 0);
            continue;
        }
        let tokens = {
            let (mut steps, mut riding) = (Vec::new(), Vec::new());
            for (i, a) in active.iter_mut().enumerate() {
                if a.decoding.is_prefilled() {
                    steps.push(Step { decoding: &mut a.decoding, cache: &mut a.cache, sampler: &mut a.sampler });
                } else if let Some(&(_, tokens)) = riders.iter().find(|(r, _)| *r == i) {
                    riding.push(Chunk { decoding: &mut a.decoding, cache: &mut a.cache, tokens });
                }
            }
            next_batch_with_chunks(model, &mut steps, &mut riding)
        };
        let mut keep = vec![true; active.len()];
        for &(i, _) in &riders {
            let a = &mut active[i];
            if tokens.is_err() {
                keep[i] = false;
                continue;
            }
            let done = a.decoding.is_prefilled();
            let observed = a.trail.observe(&a.cache).map_err(crate::engine::error::Error::from);
            keep[i] = observed.and_then(|()| chunk_ran(a, done, &mut prefixes, metrics)).unwrap_or_else(|e| failed(a, e));
        }
        match tokens {
            Ok(tokens) => {
                for (&i, token) in ready.iter().zip(tokens) {
                    keep[i] = emit(model, &tokenizer, &mut active[i], token, metrics);
                    if !keep[i] {
                        // The answer is over: keep the conversation so far for its next turn.
                        let a = &mut active[i];
                        let _ = a.decoding.cancel(model, &mut a.cache);
                        let generated = a.decoding.tokens();
                        let held: Vec<u32> = a.job.prompt.iter().chain(&generated[..generated.len().saturating_sub(1)]).copied().collect();
                        if let Err(e) = prefixes.insert(&held, &a.cache, &mut a.trail) {
                            eprintln!("warning: the answer's state was not kept: {e}");
                        }
                    }
                }
            }
            Err(e) => {
                for i in ready.iter().copied().chain(riders.iter().map(|&(i, _)| i)) {
                    let _ = active[i].job.events.send(Event::Error(e.to_string()));
                    keep[i] = false;
                }
            }
        }
        let mut keep = keep.into_iter();
        active.retain(|_| keep.next().unwrap_or(true));
        metrics.batch_size.set(active.len() as i64);
        round(ready.len());
        pace.observe(stepped.elapsed().as_secs_f64(), chunk, ready.len());
    }
}

/// After a chunk of `a`'s prompt ran (`done`: the prompt is all in): keeps the prompt's state,
/// sends its prompt log-probabilities when asked for, and finishes a request that only scores it;
/// `false` once the request is over.
fn chunk_ran(a: &mut Active, done: bool, prefixes: &mut PrefixCache, metrics: &Metrics) -> crate::engine::error::Result<bool> {
    if !done {
        return Ok(true);
    }
    prefixes.insert(&a.job.prompt, &a.cache, &mut a.trail)?;
    if a.job.logprobs.prompt.is_some() {
        let _ = a.job.events.send(Event::PromptLogprobs(a.decoding.prompt_logprobs().to_vec()));
    }
    // Scoring only (max_tokens 0): the prompt was all there was to run.
    if a.job.max_tokens == 0 {
        finish(a, "length", None, metrics);
        return Ok(false);
    }
    Ok(true)
}

/// Tells `a`'s client why its request failed; `false` (the request is over).
fn failed(a: &Active, e: crate::engine::error::Error) -> bool {
    let _ = a.job.events.send(Event::Error(e.to_string()));
    false
}

/// Whether prompt chunks ride the decode step's forward call (`SALA_MIXED_ROUNDS=on`).
fn mixed_rounds() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("SALA_MIXED_ROUNDS").is_ok_and(|v| v == "on"))
}

/// Prompt tokens two prompts must share at their start for the later one to wait for the
/// earlier's state rather than prefill them again beside it (a chat template's opening is shorter).
const SHARED_START: usize = 64;

/// Why a request that cannot fit even alone is refused, and what would let it.
fn too_big_alone(job: &Job, need: u64, budget: u64) -> String {
    use crate::engine::memory::human;
    format!(
        "the prompt ({} tokens) with max_tokens {} needs {} of cache, more than the {} this server's requests share: \
         ask for fewer tokens or a shorter prompt (or serve with --kv-bits 8, which halves the cache)",
        job.prompt.len(),
        job.max_tokens,
        human(need),
        human(budget)
    )
}

/// Whether `b` starts with at least [`SHARED_START`] tokens of `a` (or all of a shorter `b`'s).
fn shares_start(a: &[u32], b: &[u32]) -> bool {
    let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    common >= SHARED_START.min(b.len()).max(1)
}

/// The requests whose prompts are going in, in the order this round's budget reaches them: on a
/// `shortest` turn fewest prompt tokens left first, else oldest first (their order in `active`).
fn prefill_order(active: &[Active], shortest: bool) -> Vec<usize> {
    let mut going_in: Vec<usize> = (0..active.len()).filter(|&i| !active[i].decoding.is_prefilled()).collect();
    if shortest {
        going_in.sort_by_key(|&i| active[i].job.prompt.len().saturating_sub(active[i].cache.len()));
    }
    going_in
}

/// The prompt tokens one round runs, shared by the prompts going in. Each chunk is a forward of
/// its own, whose fixed cost is counted as a block of tokens at least, so a crowd of tiny prompts
/// cannot make a round a crowd of forwards.
#[derive(Debug)]
struct PromptBudget {
    left: usize,
    charged: usize,
}

impl PromptBudget {
    fn new(tokens: usize) -> Self {
        PromptBudget { left: tokens, charged: 0 }
    }

    /// The most tokens a prompt with `remaining` still to go in may run now; `None` when the round
    /// is spent, or when what is left of it is a sliver of a prompt it cannot finish (a forward
    /// for a few tokens of a long prompt would cost more than it moves it). A prompt within a
    /// block of the budget finishes (a 257-token prompt in a 256-token round would otherwise take
    /// a second forward, and a second round, for its last token).
    fn offer(&self, remaining: usize) -> Option<usize> {
        let finishes = remaining <= self.left + Pace::ALIGN;
        let sliver = self.charged > 0 && !finishes && self.left < Pace::MIN_CHUNK;
        (self.left > 0 && !sliver).then_some(if finishes { remaining.max(self.left) } else { self.left })
    }

    /// Takes a chunk of `ran` tokens (none if it failed before running) out of the round.
    fn spend(&mut self, ran: usize) {
        let cost = ran.max(Pace::ALIGN);
        self.left = self.left.saturating_sub(cost);
        self.charged += cost;
    }

    /// The tokens the round's chunks count for, as the pace measures them.
    fn charged(&self) -> usize {
        self.charged
    }
}

/// Checks a request's prompt, starting from the longest kept state it extends; `None` (after
/// telling the client) when it cannot run.
fn admit(model: &dyn LanguageModel, id: u64, mut job: Job, prefill_step: usize, prefixes: &mut PrefixCache, metrics: &Metrics) -> Option<Active> {
    let opts = GenerateOptions { max_tokens: job.max_tokens, ignore_eos: job.ignore_eos, prefill_step, ..Default::default() };
    let start = if job.logprobs.prompt.is_some() {
        // Every prompt position's distribution is needed: none of it comes from a kept state.
        let cache = model.new_cache();
        let mut trail = Trail::new(&cache);
        trail.stop_at(job.prompt.len().saturating_sub(1));
        Ok(Start { tokens: 0, cache, trail })
    } else {
        metrics.prefix_cache_lookups.inc();
        prefixes.start(&job.prompt, model.new_cache())
    };
    let started = start.and_then(|start| {
        let decoding = Decoding::begin(model, &start.cache, &job.prompt[start.tokens..], &opts)?.with_logprobs(job.logprobs);
        Ok((start, decoding))
    });
    if let Ok((start, _)) = &started {
        if start.tokens > 0 {
            metrics.prefix_cache_hits.inc();
            metrics.prefix_cache_hit_tokens.inc_by(start.tokens as u64);
        }
    }
    if let Ok((start, _)) = &started {
        let _ = job.events.send(Event::Started { cached_tokens: start.tokens });
    }
    match started {
        Ok((start, decoding)) => Some(Active {
            id,
            sampler: match job.constraint.take() {
                Some(constraint) => Sampler::new(job.sampling.clone()).constrained(constraint),
                None => Sampler::new(job.sampling.clone()),
            },
            job,
            cache: start.cache,
            trail: start.trail,
            reserved: 0,
            cached_tokens: start.tokens,
            decoding,
            decoder: StreamDecoder::default(),
            held: String::new(),
            produced: 0,
            sent: 0,
            pending: VecDeque::new(),
            answered: None,
        }),
        Err(e) => {
            let _ = job.events.send(Event::Error(e.to_string()));
            None
        }
    }
}

/// Sends what a request's new token adds to its answer; `false` when it is finished.
fn emit(model: &dyn LanguageModel, tokenizer: &TextTokenizer, a: &mut Active, token: Option<u32>, metrics: &Metrics) -> bool {
    if token.is_some() && a.answered.is_none() {
        let first = a.job.received.elapsed();
        a.answered = Some(first);
        metrics.time_to_first_token.observe(first.as_secs_f64());
    }
    let eos = model.info().eos_token_ids.contains(&token.unwrap_or(u32::MAX));
    if let Some(token) = token.filter(|_| !eos) {
        let start = a.produced;
        if let Ok(piece) = a.decoder.push(tokenizer, token) {
            a.produced += piece.len();
            a.held.push_str(&piece);
        }
        if a.job.logprobs.generated.is_some() {
            if let Some(lp) = a.decoding.token_logprobs().last() {
                a.pending.push_back((lp.clone(), start, a.produced));
            }
        }
    }
    if a.decoding.is_done() {
        let rest = a.decoder.finish(tokenizer).unwrap_or_default();
        a.produced += rest.len();
        a.held.push_str(&rest);
        // A dangling partial character belongs to the tokens that made it.
        if let Some(last) = a.pending.back_mut() {
            last.2 = a.produced;
        }
    }
    // A stop string ends the answer before it.
    if let Some((at, stop)) = a.job.stop.iter().filter_map(|s| a.held.find(s.as_str()).map(|at| (at, s))).min_by_key(|(at, _)| *at) {
        let stop = stop.clone();
        a.held.truncate(at);
        flush(a, a.held.len(), true);
        finish(a, "stop", Some(stop), metrics);
        return false;
    }
    if a.decoding.is_done() {
        flush(a, a.held.len(), true);
        let reason = match a.decoding.stop_reason() {
            StopReason::EndOfSequence | StopReason::Cancelled => "stop",
            StopReason::MaxTokens | StopReason::ContextLimit => "length",
        };
        finish(a, reason, None, metrics);
        return false;
    }
    // Keep back what could still become a stop string.
    let keep = a.job.stop.iter().map(|s| s.len().saturating_sub(1)).max().unwrap_or(0);
    let mut cut = a.held.len().saturating_sub(keep);
    while !a.held.is_char_boundary(cut) {
        cut -= 1;
    }
    flush(a, cut, false);
    true
}

/// Sends the first `upto` bytes held, with the log-probabilities of the tokens they complete;
/// `last`: the answer ends there, and a token cut by a stop string goes with it.
fn flush(a: &mut Active, upto: usize, last: bool) {
    let text: String = a.held.drain(..upto).collect();
    a.sent += upto;
    let mut logprobs = Vec::new();
    while let Some((_, start, end)) = a.pending.front() {
        if !(*end <= a.sent || (last && *start < a.sent)) {
            break;
        }
        let (logprobs_of, offset, _) = a.pending.pop_front().expect("looked at above");
        logprobs.push(AnswerToken { logprobs: logprobs_of, offset });
    }
    if last {
        a.pending.clear();
    }
    if !text.is_empty() || !logprobs.is_empty() {
        let _ = a.job.events.send(Event::Text { text, logprobs });
    }
}

fn finish(a: &mut Active, finish_reason: &'static str, stop_sequence: Option<String>, metrics: &Metrics) {
    let (prompt_tokens, completion_tokens) = (a.job.prompt.len(), a.decoding.tokens().len());
    metrics.prompt_tokens.inc_by(prompt_tokens as u64);
    metrics.generated_tokens.inc_by(completion_tokens as u64);
    metrics.request_duration.observe(a.job.received.elapsed().as_secs_f64());
    let _ = a.job.events.send(Event::Done { finish_reason, stop_sequence, prompt_tokens, completion_tokens, cached_tokens: a.cached_tokens, first_token: a.answered });
}

#[cfg(test)]
mod tests {
    use super::{shares_start, Pace, PromptBudget, Round, SHARED_START};

    #[test]
    fn a_prompt_waits_only_for_one_it_shares_a_real_start_with() {
        let document: Vec<u32> = (0..500).collect();
        let question = |q: u32| document.iter().copied().chain([10_000 + q]).collect::<Vec<_>>();
        assert!(shares_start(&question(1), &question(2)));
        assert!(shares_start(&document, &question(2)));
        // A chat template's opening in common is not a reason to wait.
        let opening: Vec<u32> = (0..20).collect();
        let other: Vec<u32> = opening.iter().copied().chain(1000..1400).collect();
        assert!(!shares_start(&question(1), &other));
        let just: Vec<u32> = (0..SHARED_START as u32).chain([7, 7]).collect();
        assert!(shares_start(&document, &just));
        assert!(!shares_start(&document, &just[1..]));
        // A prompt shorter than the mark that is all a start of the other waits for it.
        assert!(shares_start(&document, &document[..10]));
        assert!(!shares_start(&document, &[]));
    }

    #[test]
    fn a_chunk_beside_decoding_costs_about_one_decode_step() {
        let mut pace = Pace::default();
        // Nothing decoding: the whole step; a decode step not measured yet: no chunk, so that
        // this round measures it; then, the prompt token's cost not known, the smallest chunk.
        assert_eq!(pace.chunk(0, 2048), 2048);
        assert_eq!(pace.chunk(4, 2048), 0);
        pace.observe(0.020, 0, 4);
        assert_eq!(pace.chunk(4, 2048), Pace::MIN_CHUNK);
        // A decode step of 20 ms; a round with a 512-token chunk took 30 ms: 10 ms for 512 tokens,
        // so a chunk of 15 ms (3/4 of a step) is 768 tokens.
        pace.observe(0.030, 512, 4);
        assert_eq!(pace.chunk(4, 2048), 768);
        // Never more than the step, never fewer than the smallest chunk (nor than a smaller step).
        assert_eq!(pace.chunk(4, 300), 300);
        pace.observe(0.5, 0, 4);
        assert!(pace.chunk(4, 2048) > 768);
        let mut slow = Pace::default();
        slow.observe(0.001, 0, 4);
        slow.observe(1.0, 512, 0);
        assert_eq!(slow.chunk(4, 2048), Pace::MIN_CHUNK);
        assert_eq!(slow.chunk(4, 100), 100);
        // Chunks come in whole blocks of 64.
        let mut odd = Pace::default();
        odd.observe(0.0333, 0, 4);
        odd.observe(0.0001, 1, 0);
        assert_eq!(odd.chunk(4, 4096) % Pace::ALIGN, 0);
    }

    #[test]
    fn the_decode_step_is_measured_by_the_rows_it_decodes() {
        // A prompt token costs 0.1 ms; 16 rows decode in 20 ms, 64 in 100 ms.
        let mut pace = Pace::default();
        pace.observe(0.1, 1000, 0);
        pace.observe(0.020, 0, 16);
        assert_eq!(pace.chunk(16, 4096), Pace::MIN_CHUNK, "3/4 of 20 ms is 150 tokens: the smallest chunk");
        // 17–20 rows are near enough to 16's measurement; 64 rows are not: that round measures them.
        assert_eq!(pace.chunk(20, 4096), pace.chunk(16, 4096));
        assert_eq!(pace.chunk(64, 4096), 0);
        pace.observe(0.100, 0, 64);
        assert_eq!(pace.chunk(64, 4096), 704, "3/4 of 100 ms at 0.1 ms a token, in blocks of 64");
        // A chunk beside 64 rows is costed against 64 rows' step, not 16's: 100 ms of decode and
        // 704 tokens of 0.1 ms in 170.4 ms leave nothing over.
        pace.observe(0.1704, 704, 64);
        assert!(pace.overhead.unwrap().abs() < 1e-9, "{pace:?}");
        // Between two measurements near enough, the step is read off the line between them.
        pace.observe(0.060, 0, 48);
        assert!((pace.decode_step(56).unwrap() - 0.080).abs() < 1e-9);
        assert_eq!(pace.decode_step(40), Some(0.060));
        assert_eq!(pace.decode_step(30), None);
        // A measurement grows stale: after that many rounds its rows are measured again.
        for _ in 0..Pace::STALE {
            pace.observe(0.1, 1000, 0);
        }
        assert_eq!(pace.chunk(16, 4096), 0);
        assert_eq!(pace.decode_step(48), Some(0.060), "measured more recently");
        // A stale measurement is replaced, not averaged with what it was.
        for _ in 0..=Pace::STALE {
            pace.observe(0.1, 1000, 0);
        }
        pace.observe(0.040, 0, 16);
        assert_eq!(pace.decode_step(16), Some(0.040));
    }

    #[test]
    fn a_chunk_beside_decoding_is_long_enough_to_be_worth_its_fixed_cost() {
        // Prompt tokens cost 0.1 ms alone; 64 rows decode in 40 ms; a 256-token chunk beside them
        // made a round of 154 ms: 88.4 ms more than the step and its tokens.
        let mut pace = Pace::default();
        pace.observe(0.2048, 2048, 0);
        pace.observe(0.040, 0, 64);
        assert_eq!(pace.chunk(64, 4096), Pace::MIN_CHUNK, "3/4 of 40 ms is 300 tokens: the smallest chunk");
        pace.observe(0.154, 256, 64);
        assert!((pace.overhead.unwrap() - 0.0884).abs() < 1e-9, "{pace:?}");
        // Costed per token that chunk would be 0.45 ms a token and the next the smallest; as
        // it is, the next runs 88.4 ms of tokens beside its fixed cost.
        assert_eq!(pace.chunk(64, 4096), 832);
        assert_eq!(pace.chunk(64, 512), 512);
        // With a small fixed cost the step's share rules again.
        let mut cheap = Pace::default();
        cheap.observe(0.2048, 2048, 0);
        cheap.observe(0.080, 0, 64);
        cheap.observe(0.080 + 0.0256 + 0.002, 256, 64);
        assert_eq!(cheap.chunk(64, 4096), 576, "(60 - 2) ms of tokens: 580, in blocks of 64");
        // Before any chunk alone, a chunk's whole cost beside decoding stands for its tokens';
        // the first measured alone replaces it, and a few-token chunk alone teaches nothing.
        let mut beside = Pace::default();
        beside.observe(0.040, 0, 64);
        beside.observe(0.140, 256, 64);
        assert!((beside.token.unwrap() - 0.1 / 256.0).abs() < 1e-12 && beside.overhead.is_none(), "{beside:?}");
        beside.observe(0.010, 3, 0);
        assert!(!beside.token_alone);
        beside.observe(0.1024, 1024, 0);
        assert!(beside.token_alone && (beside.token.unwrap() - 1e-4).abs() < 1e-12, "{beside:?}");
    }

    #[test]
    fn rank_zeros_pace_travels_with_its_round() {
        let mut pace = Pace::default();
        pace.observe(0.1, 1000, 0);
        pace.observe(0.020, 0, 16);
        let round: Round<u64> = Round { pace: Some(pace.clone()), ..Round::default() };
        let back: Round<u64> = serde_json::from_slice(&serde_json::to_vec(&round).unwrap()).unwrap();
        let got = back.pace.expect("the pace came with the round");
        assert_eq!((got.chunk(16, 4096), got.chunk(64, 4096), got.rounds), (pace.chunk(16, 4096), pace.chunk(64, 4096), pace.rounds));
    }

    #[test]
    fn a_rounds_prompt_budget_is_shared_until_spent() {
        // 1000 tokens: three prompts of 100 left go in whole, then the oldest long prompt takes
        // the rest of the round.
        let mut budget = PromptBudget::new(1000);
        for _ in 0..3 {
            assert_eq!(budget.offer(100), Some(1000 - budget.charged()));
            budget.spend(100);
        }
        assert_eq!(budget.offer(30_000), Some(700));
        budget.spend(700);
        assert_eq!(budget.offer(5), None, "the round is spent");
        assert_eq!(budget.charged(), 1000);
        // A forward's fixed cost counts a block at least: 1-token prompts take 64 each.
        let mut tiny = PromptBudget::new(256);
        let mut forwards = 0;
        while tiny.offer(1).is_some() {
            tiny.spend(1);
            forwards += 1;
        }
        assert_eq!(forwards, 256 / Pace::ALIGN);
        // A sliver left over is not spent on a long prompt it cannot finish, but still finishes
        // a short one; a round's first chunk is never refused.
        let mut sliver = PromptBudget::new(1200);
        sliver.spend(1000);
        assert_eq!(sliver.offer(30_000), None);
        assert_eq!(sliver.offer(150), Some(200));
        assert_eq!(PromptBudget::new(100).offer(30_000), Some(100));
        // A chunk that failed before running still counts its fixed cost.
        let mut failed = PromptBudget::new(1024);
        failed.spend(0);
        assert_eq!(failed.offer(2000), Some(1024 - Pace::ALIGN));
        // A prompt within a block of the round finishes in it; one longer takes the round.
        assert_eq!(PromptBudget::new(256).offer(257), Some(257));
        assert_eq!(PromptBudget::new(256).offer(256 + Pace::ALIGN), Some(256 + Pace::ALIGN));
        assert_eq!(PromptBudget::new(256).offer(257 + Pace::ALIGN), Some(256));
        let mut after = PromptBudget::new(512);
        after.spend(300);
        assert_eq!(after.offer(260), Some(260), "finishes in what is left of the round");
        assert_eq!(after.offer(400), None, "a sliver of a prompt it cannot finish");
    }

    #[test]
    fn the_averages_follow_the_rounds() {
        let mut pace = Pace::default();
        pace.observe(0.010, 0, 8);
        for _ in 0..40 {
            pace.observe(0.040, 0, 8);
        }
        assert!((pace.decode_step(8).unwrap() - 0.040).abs() < 1e-4, "{pace:?}");
        // A chunk round before any decode step of its rows cannot be split, so it teaches nothing
        // but the time of a prompt token with no decode beside it.
        let mut fresh = Pace::default();
        fresh.observe(0.5, 1000, 8);
        assert_eq!((fresh.decode.len(), fresh.token), (0, None));
        fresh.observe(0.5, 1000, 0);
        assert_eq!(fresh.token, Some(0.0005));
    }
}
