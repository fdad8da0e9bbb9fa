//! The worker that owns the model and serves every request: new requests are admitted between
//! decode steps and each active request advances one token per round (continuous scheduling), so
//! a long answer never blocks a short one. A request whose client went away is dropped at its
//! next step, freeing its slot and cache at once.
//!
//! Today each active sequence runs its own forward per step; batching those steps into one
//! forward (sequences of different lengths) is the performance work of issue 6.

use crate::engine::cache::ModelCache;
use crate::engine::generate::{Decoding, GenerateOptions, StopReason};
use crate::engine::model::LanguageModel;
use crate::engine::sampler::{Sampler, SamplingParams};
use crate::engine::tokenizer::{StreamDecoder, TextTokenizer};
use std::sync::mpsc::{Receiver, TryRecvError};
use tokio::sync::mpsc::UnboundedSender;

/// A request as the worker sees it.
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    /// Strings that end the answer (not included in it).
    pub stop: Vec<String>,
    pub events: UnboundedSender<Event>,
}

#[derive(Debug, Clone)]
pub enum Event {
    /// More answer text.
    Text(String),
    Done { finish_reason: &'static str, prompt_tokens: usize, completion_tokens: usize },
    Error(String),
}

struct Active {
    job: Job,
    cache: ModelCache,
    sampler: Sampler,
    decoding: Decoding,
    decoder: StreamDecoder,
    /// Text produced but held back because it could be the start of a stop string.
    held: String,
}

/// Runs until every sender of `jobs` is gone.
pub fn run(model: Box<dyn LanguageModel>, tokenizer: std::sync::Arc<TextTokenizer>, prefill_step: usize, jobs: Receiver<Job>) {
    let model = model.as_ref();
    let mut active: Vec<Active> = Vec::new();
    loop {
        // Admit new requests: wait for one when idle, take whatever is queued otherwise.
        let mut incoming = Vec::new();
        if active.is_empty() {
            match jobs.recv() {
                Ok(job) => incoming.push(job),
                Err(_) => return,
            }
        }
        loop {
            match jobs.try_recv() {
                Ok(job) => incoming.push(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) if active.is_empty() && incoming.is_empty() => return,
                Err(TryRecvError::Disconnected) => break,
            }
        }
        for job in incoming {
            if job.events.is_closed() {
                continue;
            }
            let mut cache = model.new_cache();
            let opts = GenerateOptions { max_tokens: job.max_tokens, prefill_step, ..Default::default() };
            match Decoding::start(model, &mut cache, &job.prompt, &opts, |_, _| {}) {
                Ok(decoding) => active.push(Active {
                    sampler: Sampler::new(job.sampling.clone()),
                    job,
                    cache,
                    decoding,
                    decoder: StreamDecoder::default(),
                    held: String::new(),
                }),
                Err(e) => {
                    let _ = job.events.send(Event::Error(e.to_string()));
                }
            }
        }
        // One step for every active request.
        active.retain_mut(|a| step(model, &tokenizer, a));
    }
}

/// Advances one request by a token; `false` when it is finished (or its client left).
fn step(model: &dyn LanguageModel, tokenizer: &TextTokenizer, a: &mut Active) -> bool {
    if a.job.events.is_closed() {
        return false;
    }
    let token = match a.decoding.next(model, &mut a.cache, &mut a.sampler) {
        Ok(t) => t,
        Err(e) => {
            let _ = a.job.events.send(Event::Error(e.to_string()));
            return false;
        }
    };
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
    });
}
