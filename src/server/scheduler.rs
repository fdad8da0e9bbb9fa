//! The worker that owns the model and serves every request (continuous batching): new requests
//! are admitted between decode steps (up to `parallel` at once, the rest wait in order), their
//! prompts go in a chunk per round, and every round runs one batched forward that advances each
//! request whose prompt is in by a token, whatever its length. A long answer never blocks a short
//! one; a request whose client went away is dropped before the next round, freeing its slot and
//! cache at once. A [`PrefixCache`] keeps the state of each prompt and each answer with restart
//! points along it, so a request that shares the start of an earlier one (a document asked again,
//! a conversation's next turn) prefills only what is new. A request is started (its kept state
//! looked up) only once the prompt before it is in, so requests arriving together over one
//! document prefill it once.

use crate::engine::cache::ModelCache;
use crate::engine::grammar::Constraint;
use crate::engine::generate::{next_batch, Decoding, GenerateOptions, Step, StopReason};
use crate::engine::model::LanguageModel;
use crate::engine::prefix_cache::{PrefixCache, Trail};
use crate::engine::sampler::{Sampler, SamplingParams};
use crate::engine::tokenizer::{StreamDecoder, TextTokenizer};
use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, TryRecvError};
use tokio::sync::mpsc::UnboundedSender;

/// A request as the worker sees it.
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    /// What the answer is held to (response_format, a forced tool call).
    pub constraint: Option<Constraint>,
    pub max_tokens: usize,
    /// Strings that end the answer (not included in it).
    pub stop: Vec<String>,
    pub events: UnboundedSender<Event>,
}

#[derive(Debug, Clone)]
pub enum Event {
    /// More answer text.
    Text(String),
    Done { finish_reason: &'static str, prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize },
    Error(String),
    /// Ended unfinished: the server is shutting down.
    Shutdown,
}

struct Active {
    job: Job,
    cache: ModelCache,
    /// Restart points kept along the way.
    trail: Trail,
    sampler: Sampler,
    decoding: Decoding,
    decoder: StreamDecoder,
    /// Text produced but held back because it could be the start of a stop string.
    held: String,
    /// Prompt tokens taken from the prefix cache.
    cached_tokens: usize,
}

/// Runs until every sender of `jobs` is gone, then returns the prompt states it kept (starting
/// from `prefixes`); once `abort` is set, every request held or queued is ended with
/// [`Event::Shutdown`].
pub fn run(
    model: &dyn LanguageModel,
    tokenizer: std::sync::Arc<TextTokenizer>,
    prefill_step: usize,
    parallel: usize,
    jobs: Receiver<Job>,
    abort: std::sync::Arc<std::sync::atomic::AtomicBool>,
    mut prefixes: PrefixCache,
) -> PrefixCache {
    let mut active: Vec<Active> = Vec::new();
    let mut waiting: VecDeque<Job> = VecDeque::new();
    loop {
        // Take what is queued; block for the next request only when there is nothing to do.
        if active.is_empty() && waiting.is_empty() {
            match jobs.recv() {
                Ok(job) => waiting.push_back(job),
                Err(_) => return prefixes,
            }
        }
        loop {
            match jobs.try_recv() {
                Ok(job) => waiting.push_back(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if active.is_empty() && waiting.is_empty() => return prefixes,
                Err(TryRecvError::Disconnected) => break,
            }
        }
        if abort.load(std::sync::atomic::Ordering::SeqCst) {
            for events in active.drain(..).map(|a| a.job.events).chain(waiting.drain(..).map(|j| j.events)) {
                let _ = events.send(Event::Shutdown);
            }
            continue;
        }
        waiting.retain(|job| !job.events.is_closed());
        active.retain(|a| !a.job.events.is_closed());
        // Prompts go in one at a time, oldest first: the next request starts once the one before
        // it is in, from the state that one left if they share a start.
        while active.len() < parallel.max(1) && active.iter().all(|a| a.decoding.is_prefilled()) {
            let Some(job) = waiting.pop_front() else { break };
            if let Some(a) = admit(model, job, prefill_step, &mut prefixes) {
                active.push(a);
            }
        }
        // One prefill chunk per round (the oldest waiting prompt), so a long prompt delays the
        // others' next tokens by a chunk at a time instead of all at once.
        if let Some(i) = active.iter().position(|a| !a.decoding.is_prefilled()) {
            let a = &mut active[i];
            let step = a.decoding.prefill_along(model, &mut a.cache, &mut a.trail).and_then(|done| {
                if done {
                    prefixes.insert(&a.job.prompt, &a.cache, &mut a.trail)?;
                }
                Ok(done)
            });
            match step {
                Ok(_) => {}
                Err(e) => {
                    let _ = a.job.events.send(Event::Error(e.to_string()));
                    active.remove(i);
                }
            }
        }
        // One batched step for every request whose prompt is in.
        let ready: Vec<usize> = (0..active.len()).filter(|&i| active[i].decoding.is_prefilled()).collect();
        if ready.is_empty() {
            continue;
        }
        let tokens = {
            let mut steps: Vec<Step> = active
                .iter_mut()
                .filter(|a| a.decoding.is_prefilled())
                .map(|a| Step { decoding: &mut a.decoding, cache: &mut a.cache, sampler: &mut a.sampler })
                .collect();
            next_batch(model, &mut steps)
        };
        let mut keep = vec![true; active.len()];
        match tokens {
            Ok(tokens) => {
                for (&i, token) in ready.iter().zip(tokens) {
                    keep[i] = emit(model, &tokenizer, &mut active[i], token);
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
                for &i in &ready {
                    let _ = active[i].job.events.send(Event::Error(e.to_string()));
                    keep[i] = false;
                }
            }
        }
        let mut keep = keep.into_iter();
        active.retain(|_| keep.next().unwrap_or(true));
    }
}

/// Checks a request's prompt, starting from the longest kept state it extends; `None` (after
/// telling the client) when it cannot run.
fn admit(model: &dyn LanguageModel, mut job: Job, prefill_step: usize, prefixes: &mut PrefixCache) -> Option<Active> {
    let opts = GenerateOptions { max_tokens: job.max_tokens, prefill_step, ..Default::default() };
    let started = prefixes.start(&job.prompt, model.new_cache()).and_then(|start| {
        let decoding = Decoding::begin(model, &start.cache, &job.prompt[start.tokens..], &opts)?;
        Ok((start, decoding))
    });
    match started {
        Ok((start, decoding)) => Some(Active {
            sampler: match job.constraint.take() {
                Some(constraint) => Sampler::new(job.sampling.clone()).constrained(constraint),
                None => Sampler::new(job.sampling.clone()),
            },
            job,
            cache: start.cache,
            trail: start.trail,
            cached_tokens: start.tokens,
            decoding,
            decoder: StreamDecoder::default(),
            held: String::new(),
        }),
        Err(e) => {
            let _ = job.events.send(Event::Error(e.to_string()));
            None
        }
    }
}

/// Sends what a request's new token adds to its answer; `false` when it is finished.
fn emit(model: &dyn LanguageModel, tokenizer: &TextTokenizer, a: &mut Active, token: Option<u32>) -> bool {
    let eos = model.info().eos_token_ids.contains(&token.unwrap_or(u32::MAX));
    if let Some(token) = token.filter(|_| !eos) {
        if let Ok(piece) = a.decoder.push(tokenizer, token) {
            a.held.push_str(&piece);
        }
    }
    if a.decoding.is_done() {
        a.held.push_str(&a.decoder.finish(tokenizer).unwrap_or_default());
    }
    // A stop string ends the answer before it.
    if let Some(at) = a.job.stop.iter().filter_map(|s| a.held.find(s.as_str())).min() {
        a.held.truncate(at);
        flush(a, a.held.len());
        finish(a, "stop");
        return false;
    }
    if a.decoding.is_done() {
        flush(a, a.held.len());
        let reason = match a.decoding.stop_reason() {
            StopReason::EndOfSequence | StopReason::Cancelled => "stop",
            StopReason::MaxTokens | StopReason::ContextLimit => "length",
        };
        finish(a, reason);
        return false;
    }
    // Keep back what could still become a stop string.
    let keep = a.job.stop.iter().map(|s| s.len().saturating_sub(1)).max().unwrap_or(0);
    let mut cut = a.held.len().saturating_sub(keep);
    while !a.held.is_char_boundary(cut) {
        cut -= 1;
    }
    flush(a, cut);
    true
}

fn flush(a: &mut Active, upto: usize) {
    if upto > 0 {
        let text: String = a.held.drain(..upto).collect();
        let _ = a.job.events.send(Event::Text(text));
    }
}

fn finish(a: &mut Active, finish_reason: &'static str) {
    let _ = a.job.events.send(Event::Done {
        finish_reason,
        prompt_tokens: a.job.prompt.len(),
        completion_tokens: a.decoding.tokens().len(),
        cached_tokens: a.cached_tokens,
    });
}
