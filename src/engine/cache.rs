//! Per-sequence model state, one entry per layer, model-agnostic:
//! * [`KvCache`]: keys/values of softmax-attention layers, growing along the sequence axis, with
//!   optional mean-pooled key summaries (compressed keys for block-sparse attention) kept up to date
//!   incrementally;
//! * [`RecurrentState`]: the fixed-size state of a linear-attention/recurrent layer.
//!
//! Everything is an MLX array, so cloning a cache is cheap and gives an independent snapshot
//! (arrays are immutable; the next write makes a new buffer).

use crate::engine::ops::scalar;
use mlx_rs::{error::Result, ops, ops::indexing::TryIndexMutOp, ops::indexing::TryIndexOp, Array, Dtype};

/// An array `[B, H, capacity, D]` that grows along axis 2 with room to spare, so appending a
/// token does not copy the whole history.
#[derive(Clone, Default)]
pub struct SeqBuffer {
    data: Option<Array>,
    len: usize,
}

impl SeqBuffer {
    const MIN_STEP: usize = 256;

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn append(&mut self, x: &Array) -> Result<()> {
        let t = x.shape()[2] as usize;
        let capacity = self.data.as_ref().map_or(0, |d| d.shape()[2] as usize);
        if self.len + t > capacity {
            // Grow by at least 1/8 of the length: amortised O(1) copies, ≤ 12.5% slack.
            let step = Self::MIN_STEP.max(self.len / 8);
            let new_capacity = (self.len + t).div_ceil(step) * step;
            let s = x.shape();
            let fresh = ops::zeros_dtype(&[s[0], s[1], (new_capacity - self.len) as i32, s[3]], x.dtype())?;
            self.data = Some(match &self.data {
                Some(d) if self.len > 0 => {
                    ops::concatenate(&[d.try_index((.., .., ..self.len as i32, ..))?, fresh], 2)?
                }
                _ => fresh,
            });
        }
        let data = self.data.as_mut().expect("allocated above");
        let range = self.len as i32..(self.len + t) as i32;
        data.try_index_mut((.., .., range, ..), x)?;
        self.len += t;
        Ok(())
    }

    /// The filled part `[B, H, len, D]`.
    pub fn view(&self) -> Result<Option<Array>> {
        match &self.data {
            Some(d) if self.len > 0 => Ok(Some(d.try_index((.., .., ..self.len as i32, ..))?)),
            _ => Ok(None),
        }
    }

    /// The whole buffer `[B, H, capacity, D]`, of which the first `len` positions are filled
    /// (kernels read it in place rather than a copy of the filled part).
    pub fn storage(&self) -> Option<&Array> {
        self.data.as_ref().filter(|_| self.len > 0)
    }

    /// Keeps only the first `len` entries (speculative-decoding rollback).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Drops entries `start..end`, closing the gap (one copy of what is kept).
    pub fn remove(&mut self, start: usize, end: usize) -> Result<()> {
        let (Some(data), true) = (&self.data, start < end && end <= self.len) else { return Ok(()) };
        let head = data.try_index((.., .., ..start as i32, ..))?;
        let tail = data.try_index((.., .., end as i32..self.len as i32, ..))?;
        self.data = Some(ops::concatenate(&[head, tail], 2)?);
        self.len -= end - start;
        Ok(())
    }

    pub fn nbytes(&self) -> usize {
        self.data.as_ref().map_or(0, |d| d.nbytes())
    }
}

/// Means of the key windows `[stride·c, stride·c + kernel)`, for every complete window.
#[derive(Clone)]
pub struct PooledKeys {
    pub kernel: usize,
    pub stride: usize,
    windows: SeqBuffer,
}

impl PooledKeys {
    /// Number of complete windows in `len` keys.
    pub fn count_for(&self, len: usize) -> usize {
        if len < self.kernel {
            0
        } else {
            (len - self.kernel) / self.stride + 1
        }
    }

    fn update(&mut self, keys: &Array, len: usize) -> Result<()> {
        let done = self.windows.len();
        let wanted = self.count_for(len);
        if wanted <= done {
            return Ok(());
        }
        let new = wanted - done;
        let (start, ratio) = (done * self.stride, self.kernel / self.stride);
        let chunks = new - 1 + ratio;
        let span = keys.try_index((.., .., start as i32..(start + chunks * self.stride) as i32, ..))?;
        let s = span.shape();
        // Sum each stride-long chunk in f32, then add `ratio` neighbouring chunks per window.
        let sums = span
            .as_dtype(Dtype::Float32)?
            .reshape(&[s[0], s[1], chunks as i32, self.stride as i32, s[3]])?
            .sum_axis(3, false)?;
        let mut total = sums.try_index((.., .., 0..new as i32, ..))?;
        for j in 1..ratio {
            total = total.add(sums.try_index((.., .., j as i32..(j + new) as i32, ..))?)?;
        }
        // Rounded to the keys' dtype (as the reference stores them), kept in float32: every use
        // scores them in float32, and converting the whole history each step would cost more.
        let means = total.multiply(scalar(1.0 / self.kernel as f32, Dtype::Float32)?)?.as_dtype(keys.dtype())?;
        let means = means.as_dtype(Dtype::Float32)?;
        self.windows.append(&means)
    }
}

/// StreamingLLM: keep the first `sinks` tokens plus the most recent ones, at most `capacity` in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub capacity: usize,
    pub sinks: usize,
}

impl Window {
    pub fn validate(self) -> std::result::Result<Self, String> {
        if self.capacity < 16 || self.sinks + 8 > self.capacity {
            return Err(format!(
                "--context-size {} with --num-sink-tokens {}: the window must hold at least 16 tokens and 8 more than the sinks",
                self.capacity, self.sinks
            ));
        }
        Ok(self)
    }

    /// Tokens dropped at once when the window overflows, so eviction (a copy of the cache) happens
    /// once every `batch` decode steps rather than every step.
    fn batch(self) -> usize {
        ((self.capacity - self.sinks) / 8).max(1)
    }
}

#[derive(Clone, Default)]
pub struct KvCache {
    keys: SeqBuffer,
    values: SeqBuffer,
    pooled: Vec<PooledKeys>,
    window: Option<Window>,
    /// Tokens dropped by the window so far (positions keep counting past them).
    evicted: usize,
}

impl KvCache {
    pub fn windowed(window: Window) -> Self {
        Self { window: Some(window), ..Self::default() }
    }

    /// Tokens stored.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Position of the next token: everything seen, including evicted tokens.
    pub fn position(&self) -> usize {
        self.keys.len() + self.evicted
    }

    /// With a window, drops the oldest non-sink tokens once the cache is over capacity. Called after
    /// attention, so the tokens of one forward pass all saw each other.
    pub fn evict(&mut self) -> Result<()> {
        let Some(w) = self.window else { return Ok(()) };
        let len = self.len();
        if len <= w.capacity {
            return Ok(());
        }
        let drop = (len - w.capacity + w.batch()).min(len - w.sinks);
        self.keys.remove(w.sinks, w.sinks + drop)?;
        self.values.remove(w.sinks, w.sinks + drop)?;
        self.evicted += drop;
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Appends `[B, Hkv, T, d]` keys and values; returns all keys and values so far.
    pub fn append(&mut self, k: &Array, v: &Array) -> Result<(Array, Array)> {
        self.keys.append(k)?;
        self.values.append(v)?;
        Ok((self.keys.view()?.expect("just appended"), self.values.view()?.expect("just appended")))
    }

    /// The key and value buffers `[B, Hkv, capacity, d]` (filled up to [`KvCache::len`]).
    pub fn storage(&self) -> Option<(&Array, &Array)> {
        Some((self.keys.storage()?, self.values.storage()?))
    }

    /// Mean-pooled keys `[B, Hkv, n, d]` (float32 holding values rounded to the keys' dtype) over windows of `kernel` with `stride` (kernel must be a
    /// multiple of stride), brought up to date with the cache: computed in full on first use,
    /// incrementally afterwards. `None` while no window is complete.
    pub fn pooled_keys(&mut self, kernel: usize, stride: usize) -> Result<Option<Array>> {
        let i = match self.pooled.iter().position(|p| p.kernel == kernel && p.stride == stride) {
            Some(i) => i,
            None => {
                self.pooled.push(PooledKeys { kernel, stride, windows: SeqBuffer::default() });
                self.pooled.len() - 1
            }
        };
        let len = self.len();
        if let Some(keys) = self.keys.view()? {
            self.pooled[i].update(&keys, len)?;
        }
        self.pooled[i].windows.view()
    }

    /// Whether it keeps a StreamingLLM window (and may drop tokens).
    pub fn is_windowed(&self) -> bool {
        self.window.is_some()
    }

    /// Rolls back to `len` tokens stored.
    pub fn truncate(&mut self, len: usize) {
        self.keys.truncate(len);
        self.values.truncate(len);
        for p in &mut self.pooled {
            let keep = p.count_for(len);
            p.windows.truncate(keep);
        }
    }

    pub fn nbytes(&self) -> usize {
        self.keys.nbytes() + self.values.nbytes() + self.pooled.iter().map(|p| p.windows.nbytes()).sum::<usize>()
    }
}

/// The state of a recurrent (linear-attention) layer after `len` tokens.
#[derive(Clone, Default)]
pub struct RecurrentState {
    pub state: Option<Array>,
    pub len: usize,
    /// Set while speculative decoding verifies a draft: the layer then keeps `replay` for its
    /// next forward call, so the state can be rolled back to any length inside that call.
    pub record_replay: bool,
    /// The last forward call's starting point and inputs (only while `record_replay`; a call
    /// without it clears this, so a replay never describes anything but the last call).
    pub replay: Option<Replay>,
}

/// What a recurrent layer needs to recompute its state at any length inside one forward call:
/// the state before it and the call's per-token inputs (layer-specific, `[B, H, T, ·]`).
#[derive(Clone)]
pub struct Replay {
    pub state: Option<Array>,
    pub len: usize,
    pub inputs: Vec<Array>,
}

#[derive(Clone)]
pub enum LayerCache {
    Attention(KvCache),
    Recurrent(RecurrentState),
}

impl LayerCache {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        match self {
            LayerCache::Attention(kv) => kv.position(),
            LayerCache::Recurrent(r) => r.len,
        }
    }

    pub fn nbytes(&self) -> usize {
        match self {
            LayerCache::Attention(kv) => kv.nbytes(),
            LayerCache::Recurrent(r) => r.state.as_ref().map_or(0, |s| s.nbytes()),
        }
    }
}

/// The whole state of one sequence.
#[derive(Clone)]
pub struct ModelCache {
    pub layers: Vec<LayerCache>,
}

/// A point a [`ModelCache`] can go back to after a draft ran on it: each layer's length and the
/// recurrent states (holding them is free: arrays are immutable and a step makes a new state,
/// whereas a clone of the whole cache would make the next key write copy the key buffer).
pub struct Checkpoint {
    lens: Vec<usize>,
    recurrent: Vec<Option<RecurrentState>>,
}

impl ModelCache {
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            lens: self.layers.iter().map(LayerCache::len).collect(),
            recurrent: self
                .layers
                .iter()
                .map(|l| match l {
                    LayerCache::Recurrent(r) => Some(r.clone()),
                    LayerCache::Attention(_) => None,
                })
                .collect(),
        }
    }

    /// Goes back to `checkpoint` (taken from this cache, with no tokens evicted since).
    pub fn restore(&mut self, checkpoint: Checkpoint) {
        for ((layer, len), recurrent) in self.layers.iter_mut().zip(checkpoint.lens).zip(checkpoint.recurrent) {
            match (layer, recurrent) {
                (LayerCache::Attention(kv), _) => kv.truncate(len),
                (LayerCache::Recurrent(r), Some(saved)) => *r = saved,
                (LayerCache::Recurrent(_), None) => {}
            }
        }
    }

    /// Makes recurrent layers record (or stop recording) a [`Replay`] of their next forward call.
    pub fn record_replay(&mut self, on: bool) {
        for layer in &mut self.layers {
            if let LayerCache::Recurrent(r) = layer {
                r.record_replay = on;
            }
        }
    }

    /// Rolls every attention layer back to `len` tokens (recurrent layers are the model's job).
    pub fn truncate_attention(&mut self, len: usize) -> crate::engine::error::Result<()> {
        for layer in &mut self.layers {
            if let LayerCache::Attention(kv) = layer {
                if kv.evicted > 0 {
                    return Err(crate::engine::error::Error::Usage(
                        "cannot roll back a cache that dropped tokens (--context-size window)".into(),
                    ));
                }
                kv.truncate(len);
            }
        }
        Ok(())
    }

    /// Whether any layer keeps a StreamingLLM window.
    pub fn is_windowed(&self) -> bool {
        self.layers.iter().any(|l| matches!(l, LayerCache::Attention(kv) if kv.is_windowed()))
    }

    /// Tokens processed so far.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, LayerCache::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn nbytes(&self) -> usize {
        self.layers.iter().map(LayerCache::nbytes).sum()
    }

    /// Every array the cache holds, for evaluating them together with the logits.
    pub fn arrays(&self) -> Vec<Array> {
        let mut out = Vec::new();
        for layer in &self.layers {
            match layer {
                LayerCache::Attention(kv) => {
                    out.extend(kv.keys.data.clone());
                    out.extend(kv.values.data.clone());
                    out.extend(kv.pooled.iter().filter_map(|p| p.windows.data.clone()));
                }
                LayerCache::Recurrent(r) => out.extend(r.state.clone()),
            }
        }
        out
    }
}

/// Layer `layer`'s caches of every sequence in a batch, all of the kind `pick` accepts; an error
/// names the layer when a cache belongs to another model.
pub fn layer_caches<'a, T>(
    caches: &'a mut [&mut ModelCache],
    layer: usize,
    pick: impl Fn(&mut LayerCache) -> Option<&mut T>,
) -> crate::engine::error::Result<Vec<&'a mut T>> {
    caches
        .iter_mut()
        .map(|c| {
            c.layers
                .get_mut(layer)
                .and_then(&pick)
                .ok_or_else(|| crate::engine::error::Error::Usage(format!("layer {layer}: cache does not belong to this model")))
        })
        .collect()
}

impl LayerCache {
    pub fn as_attention(&mut self) -> Option<&mut KvCache> {
        match self {
            LayerCache::Attention(kv) => Some(kv),
            LayerCache::Recurrent(_) => None,
        }
    }

    pub fn as_recurrent(&mut self) -> Option<&mut RecurrentState> {
        match self {
            LayerCache::Recurrent(r) => Some(r),
            LayerCache::Attention(_) => None,
        }
    }
}
