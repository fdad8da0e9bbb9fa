//! A decode step whose graph is the same at every token, replayed instead of built.
//!
//! A decode step normally bakes host integers into its graph: the token's position, the place
//! its keys and values go in the recent-token buffers, the number of positions attention reads.
//! Here the device holds them instead ([`StepCounts`]): the step takes the position as an input
//! array, derives the rest from it, and returns the next position with the logits. The cache's
//! host-side bookkeeping happens around the step: [`ModelCache::fixed_step_inputs`] readies the
//! buffers before it (a full recent buffer goes to the history, which changes the graph once
//! per [`SeqBuffer::RECENT`](crate::engine::cache::SeqBuffer::RECENT) tokens) and
//! [`ModelCache::finish_fixed_step`] takes its outputs after.
//!
//! Steps of one graph are traced once by MLX's compile ([`Compiled`]) and replayed. The step of
//! a new graph runs eagerly first: constants a forward makes on first use are evaluated when
//! made, which a trace does not allow.

use crate::engine::cache::{ModelCache, StepCounts};
use crate::engine::compiled::Compiled;
use crate::engine::error::Result;
use crate::engine::model::{LanguageModel, Logits};
use mlx_rs::{error::Exception, Array};

/// The fixed decode steps of one sequence.
#[derive(Default)]
pub struct FixedSteps {
    /// The graph in use: the model's variant and the history length it was made for, and
    /// whether it has run once (eagerly).
    graph: Option<((u64, usize), Compiled, bool)>,
    /// The device's position for the next token, and the host's count it stands for.
    position: Option<(Array, usize)>,
}

impl FixedSteps {
    pub fn new() -> Self {
        Self::default()
    }

    /// One decode step of `token` (`[1, 1]` int32) on `cache`: the float32 logits `[1, vocab]`
    /// and the device's position for the next step, with the cache one token longer. The caller
    /// evaluates the position with the logits and the cache (the next step reads it, perhaps on
    /// another thread). `None` (nothing done) where the model or the cache cannot take a fixed
    /// step; the caller then runs the forward as usual.
    pub fn decode(&mut self, model: &dyn LanguageModel, token: &Array, cache: &mut ModelCache) -> Result<Option<(Array, Array)>> {
        let Some(variant) = model.fixed_step_variant(&[&*cache]) else { return Ok(None) };
        let Some((arrays, settled)) = cache.fixed_step_inputs()? else { return Ok(None) };
        let len = cache.len();
        let position = match &self.position {
            Some((p, at)) if *at == len => p.clone(),
            _ => Array::from_slice(&[len as i32], &[1]),
        };
        let key = (variant, settled);
        if self.graph.as_ref().is_none_or(|(k, _, _)| *k != key) {
            self.graph = Some((key, Compiled::new(), false));
        }
        let (_, compiled, ran) = self.graph.as_mut().expect("set above");
        let view_of: &ModelCache = cache;
        let body = |inputs: &[Array]| -> std::result::Result<Vec<Array>, Exception> {
            let counts = StepCounts::new(&inputs[1], settled)?;
            let mut view = view_of.fixed_step_view(&inputs[2..], &counts);
            let logits = model.forward_batch(&inputs[0], &mut [&mut view], Logits::Last, None).map_err(|e| Exception::custom(e.to_string()))?;
            Ok([logits, counts.len].into_iter().chain(view.fixed_step_outputs()).collect())
        };
        let inputs: Vec<Array> = [token.clone(), position].into_iter().chain(arrays).collect();
        let outputs = if *ran {
            compiled.call(&inputs.iter().collect::<Vec<_>>(), body)?
        } else {
            *ran = true;
            body(&inputs)?
        };
        cache.finish_fixed_step(&outputs[2..])?;
        self.position = Some((outputs[1].clone(), len + 1));
        TAKEN.with(|t| t.set(t.get() + 1));
        Ok(Some((outputs[0].clone(), outputs[1].clone())))
    }
}

thread_local! {
    static TAKEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How many fixed steps this thread has run: for tests that a path takes them.
pub fn taken_on_this_thread() -> u64 {
    TAKEN.with(|t| t.get())
}
