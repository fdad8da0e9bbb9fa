//! What the engine needs from a model: run tokens on top of a cache, give logits.

use super::cache::{LayerCache, ModelCache, Window};
use super::error::{Error, Result};
use mlx_rs::{Array, Dtype};

/// Facts about a loaded model that the generate loop and the CLI need.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub model_type: String,
    pub vocab_size: usize,
    /// Longest sequence (prompt + generated) the model supports.
    pub max_context: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Activation/weight dtype the model runs in.
    pub dtype: Dtype,
    pub n_params: usize,
    /// Decoder layers (a self-speculative draft runs the first few of them).
    pub num_layers: usize,
}

impl ModelInfo {
    /// Also stops at `ids` (a `generation_config.json`'s `eos_token_id`), keeping the order.
    pub fn add_eos_tokens(&mut self, ids: &[u32]) {
        for &id in ids {
            if !self.eos_token_ids.contains(&id) {
                self.eos_token_ids.push(id);
            }
        }
    }
}

/// Which positions to compute logits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    Last,
    All,
}

/// Named intermediate tensors recorded during a forward pass (for parity tests and debugging).
#[derive(Default)]
pub struct Trace {
    pub tensors: Vec<(String, Array)>,
}

impl Trace {
    pub fn record(&mut self, name: impl Into<String>, value: &Array) {
        self.tensors.push((name.into(), value.clone()));
    }

    /// All recordings under `name`, in order.
    pub fn all(&self, name: &str) -> Vec<&Array> {
        self.tensors.iter().filter(|(n, _)| n == name).map(|(_, a)| a).collect()
    }

    pub fn get(&self, name: &str) -> Option<&Array> {
        self.tensors.iter().rev().find(|(n, _)| n == name).map(|(_, a)| a)
    }
}

pub trait LanguageModel: Send {
    fn info(&self) -> &ModelInfo;

    /// For what the loading path learns beside the config (`generation_config.json`'s end tokens).
    fn info_mut(&mut self) -> &mut ModelInfo;

    /// A fresh, empty per-sequence state.
    fn new_cache(&self) -> ModelCache;

    /// Makes new caches keep a StreamingLLM window (sink tokens + recent tokens) instead of the
    /// whole history. Models that need the whole history refuse.
    fn set_window(&mut self, window: Window) -> Result<()> {
        let _ = window;
        Err(Error::Usage(format!("{}: --context-size/--num-sink-tokens are not supported for this model", self.info().model_type)))
    }

    /// Makes new caches keep their keys and values quantized to `bits` bits (`--kv-bits`).
    /// Models without a KV cache, or whose heads cannot be quantized in groups, refuse.
    fn set_kv_bits(&mut self, bits: i32) -> Result<()> {
        let _ = bits;
        Err(Error::Usage(format!("{}: --kv-bits is not supported for this model", self.info().model_type)))
    }

    /// Runs `tokens` (`[1, T]` int32) on top of `cache` and returns float32 logits `[T, vocab]`
    /// (or `[1, vocab]` for [`Logits::Last`]).
    fn forward(&self, tokens: &Array, cache: &mut ModelCache, logits: Logits, trace: Option<&mut Trace>) -> Result<Array> {
        self.forward_batch(tokens, &mut [cache], logits, trace)
    }

    /// Runs `tokens` (`[B, T]` int32), row b on top of `caches[b]`, and returns float32 logits
    /// `[B·T, vocab]` (or `[B, vocab]` for [`Logits::Last`]). The histories may differ in length:
    /// projections and MLPs run once for the whole batch (one read of the weights, which is what
    /// decode time is spent on), attention runs per sequence against its own cache.
    fn forward_batch(
        &self,
        tokens: &Array,
        caches: &mut [&mut ModelCache],
        logits: Logits,
        trace: Option<&mut Trace>,
    ) -> Result<Array>;

    /// Whether [`LanguageModel::forward_mixed`] runs for this model (no by default).
    fn mixes_chunks(&self) -> bool {
        false
    }

    /// A batched decode step and prompt chunks in one forward call, as a server round runs them:
    /// `tokens` `[B, 1]` with row b on `caches[b]` (each holding a history), and `chunks[i]`
    /// `[1, T_i]` on `chunk_caches[i]` (which may be empty). The projections and MLPs run once
    /// over every row, so the chunks share the step's read of the weights and its host work,
    /// instead of a forward call of their own; attention runs per sequence as in
    /// [`LanguageModel::forward_batch`]. Returns float32 logits: the B decode rows, then the last
    /// row of each chunk whose `chunk_logits` is set, in order.
    fn forward_mixed(
        &self,
        tokens: &Array,
        caches: &mut [&mut ModelCache],
        chunks: &[Array],
        chunk_caches: &mut [&mut ModelCache],
        chunk_logits: &[bool],
    ) -> Result<Array> {
        let _ = (tokens, caches, chunks, chunk_caches, chunk_logits);
        Err(Error::Usage(format!("internal: {} does not run prompt chunks beside a decode step", self.info().model_type)))
    }

    /// Runs `tokens` (`[1, T]`) through only the first `layers` layers and the output head, on
    /// top of `cache` (whose first `layers` layers it extends): the draft of self-speculative
    /// decoding. Returns float32 logits `[1, vocab]` for the last position.
    fn forward_draft(&self, tokens: &Array, cache: &mut ModelCache, layers: usize) -> Result<Array> {
        let _ = (tokens, cache, layers);
        Err(Error::Usage(format!("{}: self-speculative decoding (--draft-layers) is not supported for this model", self.info().model_type)))
    }

    /// Launches, without evaluating, the GPU kernels its decode steps meet as batches grow and
    /// contexts lengthen, so that they compile together before serving rather than one a step
    /// while requests wait; how many kernel variants were new. None by default.
    fn launch_kernels_ahead(&self) -> Result<usize> {
        Ok(0)
    }

    /// Whether a decode step of this model can keep its per-token integers (positions, write
    /// places) on the device, so that the step's graph is the same at every token
    /// (`engine::fixed_step`), and if so which variant of the step `caches` need: steps of one
    /// variant share a graph. `None`: it cannot (the default).
    fn fixed_step_variant(&self, caches: &[&ModelCache]) -> Option<u64> {
        let _ = caches;
        None
    }

    /// Rolls `cache` back to its first `len` tokens (speculative decoding drops rejected draft
    /// tokens). Attention layers keep every key, so any shorter length works; a recurrent layer
    /// can only go back inside the forward call it recorded (see [`ModelCache::record_replay`]).
    fn truncate_cache(&self, cache: &mut ModelCache, len: usize) -> Result<()> {
        cache.truncate_attention(len)?;
        if cache.layers.iter().any(|l| matches!(l, LayerCache::Recurrent(r) if r.len != len)) {
            return Err(Error::Usage(format!("{}: cannot roll back its recurrent state", self.info().model_type)));
        }
        Ok(())
    }
}

/// `tokens` must be `[B, T]` with one cache per row.
pub fn check_batch(tokens: &Array, caches: &[&mut ModelCache]) -> Result<()> {
    match tokens.shape() {
        [b, t] if *b as usize == caches.len() && *t > 0 => Ok(()),
        shape => Err(Error::Usage(format!(
            "forward: token ids have shape {shape:?}, expected [{}, T ≥ 1] (one row per cache)",
            caches.len()
        ))),
    }
}
