//! A conversation's model state across turns. Each turn's prompt (the whole chat rendered by the
//! template) usually extends what the cache already holds, so only the new tokens are prefilled.
//! When it does not — the last answer is regenerated, the last message edited, the template
//! re-renders an earlier turn — the longest saved state that is a prefix of the new prompt is
//! restored instead of re-prefilling from scratch. States are saved at message boundaries: before
//! each prompt's last token and after each answer. Saving is cheap (MLX arrays are immutable;
//! a snapshot shares them), and restoring is exact for every layer type, including recurrent
//! state that cannot be rolled back by truncation.

use super::cache::ModelCache;
use super::error::{Error, Result};
use super::generate::{extend, generate, Flow, GenerateOptions, Generation, StopReason};
use super::model::LanguageModel;
use super::sampler::Sampler;

/// Saved states kept (oldest dropped first).
const MAX_SNAPSHOTS: usize = 6;

pub struct ChatSession {
    cache: ModelCache,
    /// The token ids `cache` holds, in order.
    tokens: Vec<u32>,
    snapshots: Vec<(Vec<u32>, ModelCache)>,
}

/// What one turn did.
pub struct Turn {
    pub generation: Generation,
    /// Prompt tokens that had to be run through the model (the rest were reused).
    pub prefilled: usize,
    pub prompt_tokens: usize,
}

impl ChatSession {
    pub fn new(model: &dyn LanguageModel) -> Self {
        Self { cache: model.new_cache(), tokens: Vec::new(), snapshots: Vec::new() }
    }

    /// Tokens the model state holds.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Continues from `cache`, which holds exactly `tokens` (a state read from a prompt cache).
    pub fn resume(&mut self, cache: ModelCache, tokens: Vec<u32>) {
        self.cache = cache;
        self.tokens = tokens;
        self.save();
    }

    /// Forgets everything (a new conversation).
    pub fn reset(&mut self, model: &dyn LanguageModel) {
        *self = Self::new(model);
    }

    fn save(&mut self) {
        if self.snapshots.iter().any(|(t, _)| *t == self.tokens) {
            return;
        }
        if self.snapshots.len() == MAX_SNAPSHOTS {
            self.snapshots.remove(0);
        }
        self.snapshots.push((self.tokens.clone(), self.cache.clone()));
    }

    /// Makes the state hold exactly `target`, starting from the longest held or saved prefix of it,
    /// telling `on_prefill` the new tokens run through so far (of all) after each chunk; it may stop
    /// there, leaving the state holding the chunks done. Returns the tokens run through and whether
    /// all of `target` is held.
    fn reach(&mut self, model: &dyn LanguageModel, target: &[u32], step: usize, mut on_prefill: impl FnMut(usize, usize) -> Flow) -> Result<(usize, bool)> {
        let is_prefix = |held: &[u32]| held.len() <= target.len() && target[..held.len()] == *held;
        if !is_prefix(&self.tokens) {
            let best = self.snapshots.iter().filter(|(t, _)| is_prefix(t)).max_by_key(|(t, _)| t.len());
            match best {
                Some((tokens, cache)) => {
                    self.tokens = tokens.clone();
                    self.cache = cache.clone();
                }
                None => {
                    self.tokens.clear();
                    self.cache = model.new_cache();
                }
            }
        }
        let new = &target[self.tokens.len()..];
        let mut done = 0;
        for chunk in new.chunks(step.max(1)) {
            extend(model, &mut self.cache, chunk, step)?;
            self.tokens.extend_from_slice(chunk);
            done += chunk.len();
            if let Flow::Stop = on_prefill(done, new.len()) {
                return Ok((done, done == new.len()));
            }
        }
        Ok((done, true))
    }

    /// Runs one turn: `prompt` is the whole conversation as the template renders it, ending with
    /// the assistant's generation prompt. `on_prefill(done, total)` follows the new prompt tokens
    /// and may stop the turn before it answers (a `Cancelled` generation with no tokens).
    pub fn turn(
        &mut self,
        model: &dyn LanguageModel,
        prompt: &[u32],
        sampler: &mut Sampler,
        opts: &GenerateOptions,
        on_prefill: impl FnMut(usize, usize) -> Flow,
        on_token: impl FnMut(u32) -> Flow,
    ) -> Result<Turn> {
        let Some((&last, history)) = prompt.split_last() else {
            return Err(Error::Usage("the prompt is empty".into()));
        };
        let (prefilled, whole) = self.reach(model, history, opts.prefill_step, on_prefill)?;
        if !whole {
            // Stopped in the prompt: nothing generated; the state holds the chunks read.
            let generation = Generation { tokens: Vec::new(), logits: Vec::new(), stop: StopReason::Cancelled, stats: Default::default() };
            return Ok(Turn { generation, prefilled, prompt_tokens: prompt.len() });
        }
        let prefilled = prefilled + 1;
        self.save();
        let generation = generate(model, &mut self.cache, &[last], sampler, opts, |_, _| {}, on_token)?;
        // The cache now holds the prompt and every generated token but the last (never fed back).
        self.tokens.push(last);
        self.tokens.extend_from_slice(&generation.tokens[..generation.tokens.len().saturating_sub(1)]);
        self.save();
        Ok(Turn { generation, prefilled, prompt_tokens: prompt.len() })
    }
}
