//! The "lightning-attn" layer: Simple GLA linear attention (docs/sala-model.md, Lightning layer).
//!
//!   q, k, v = x·Wq, x·Wk, x·Wv                       [T, H, d]
//!   q, k    = RMSNorm_d(q), RMSNorm_d(k)              (qk_norm; one weight shared by all heads)
//!   q, k    = RoPE(q, k) at positions P…P+T−1         (lightning_use_rope; rotate-half, θ)
//!   S_t     = γ_h S_{t−1} + k_tᵀ v_t,  o_t = (q_t/√d) S_t     in float32, γ_h = exp(−ALiBi slope_h)
//!   o       = RMSNorm_{H·d}(o) ⊙ σ(x·Wz)               (use_output_norm, use_output_gate)
//!   y       = o·Wo                                    (added to the residual by the caller)
//!
//! The state S is float32 `[B, H, d, d]` and is carried across calls; prefill uses the chunked
//! form, decode the recurrent step (both exact, see kernels::gla).

use super::SalaConfig;
use crate::engine::cache::{RecurrentState, Replay};
use crate::engine::config::ConfigFile;
use crate::engine::distributed::TensorParallel;
use crate::engine::error::{Error, Result};
use crate::engine::ops::scalar;
use crate::engine::weights::{Part, TensorSpec, Weights};
use crate::kernels::{gla, lightning};
use crate::models::layers::{per_sequence, sigmoid_gate, Input, Linear, MixerOutput, HeadRows, QkvGate, RmsNorm};
use mlx_rs::{ops, ops::indexing::TryIndexOp, Array, Dtype};

#[derive(Debug, Clone)]
pub struct LightningConfig {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Multiplier applied to q inside GLA (`lightning_scale`).
    pub q_scale: f32,
    pub use_rope: bool,
    pub rope_theta: f32,
    pub qk_norm: bool,
    pub use_output_norm: bool,
    pub use_output_gate: bool,
}

impl LightningConfig {
    pub fn from_file(cfg: &ConfigFile) -> Result<Self> {
        // The reference sizes these layers from num_attention_heads/head_dim; the lightning_* keys
        // must agree with them.
        let heads = cfg.dim("num_attention_heads")?;
        let head_dim = cfg.head_dim("head_dim")?;
        for (key, want) in [("lightning_nh", heads), ("lightning_nkv", heads), ("lightning_head_dim", head_dim)] {
            let got = cfg.usize(key)?;
            if got != want {
                return Err(cfg.invalid(key, format!("is {got}, but only {want} is supported (num_attention_heads/head_dim)")));
            }
        }
        let q_scale = match cfg.str("lightning_scale")? {
            "1/sqrt(d)" => (head_dim as f32).powf(-0.5),
            "1/d" => 1.0 / head_dim as f32,
            _ => 1.0,
        };
        Ok(Self {
            heads,
            kv_heads: heads,
            head_dim,
            q_scale,
            use_rope: cfg.bool("lightning_use_rope")?,
            rope_theta: crate::models::rope::theta(cfg)?,
            qk_norm: cfg.bool("qk_norm")?,
            use_output_norm: cfg.bool("use_output_norm")?,
            use_output_gate: cfg.bool("use_output_gate")?,
        })
    }

    pub fn tensor_specs(&self, prefix: &str, hidden: usize) -> Result<Vec<TensorSpec>> {
        let inner = self.heads * self.head_dim;
        let mut specs = vec![
            TensorSpec::new(format!("{prefix}.q_proj.weight"), &[inner, hidden])?,
            TensorSpec::new(format!("{prefix}.k_proj.weight"), &[self.kv_heads * self.head_dim, hidden])?,
            TensorSpec::new(format!("{prefix}.v_proj.weight"), &[self.kv_heads * self.head_dim, hidden])?,
            TensorSpec::new(format!("{prefix}.o_proj.weight"), &[hidden, inner])?,
        ];
        if self.use_output_gate {
            specs.push(TensorSpec::new(format!("{prefix}.z_proj.weight"), &[inner, hidden])?);
        }
        if self.qk_norm {
            specs.push(TensorSpec::new(format!("{prefix}.q_norm.weight"), &[self.head_dim])?);
            specs.push(TensorSpec::new(format!("{prefix}.k_norm.weight"), &[self.head_dim])?);
        }
        if self.use_output_norm {
            specs.push(TensorSpec::new(format!("{prefix}.o_norm.weight"), &[inner])?);
        }
        Ok(specs)
    }
}

/// The sequences' positions for the lightning layers' RoPE, on the host. A decode step passes
/// them to the kernel as a shape; prefill makes one device array per forward call, shared by
/// every lightning layer (on CUDA each array the host writes costs the GPU a page fault where a
/// kernel reads it).
pub struct Positions {
    pub host: Vec<usize>,
    device: std::cell::OnceCell<Array>,
}

impl Positions {
    pub fn new(host: Vec<usize>) -> Self {
        Self { host, device: std::cell::OnceCell::new() }
    }

    /// The positions as an int32 array (a scalar for one sequence, `[B]` for several).
    pub fn device(&self) -> &Array {
        self.device.get_or_init(|| lightning::positions_array(&self.host))
    }
}

pub struct LightningAttention {
    /// The layer's shapes with this rank's heads (all of them on one device).
    cfg: LightningConfig,
    /// The ranks this layer's heads are split over: o_norm's RMS is over every rank's heads.
    tp: TensorParallel,
    /// Width of o_norm over all heads (H·d).
    norm_width: usize,
    /// q, k, v and z (the output gate) in one stacked projection.
    qkvz_proj: QkvGate,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    o_norm: Option<RmsNorm>,
    /// Per-head decay rates s_h (γ_h = exp(−s_h)), the same in every layer.
    slopes: Array,
}

impl LightningAttention {
    /// The layer, or under tensor parallelism this rank's heads of it: their q, k, v, z rows,
    /// o_norm weights, decay rates and o_proj columns.
    pub fn load(weights: &mut Weights, prefix: &str, config: &SalaConfig, dtype: Dtype, tp: &TensorParallel) -> Result<Self> {
        let all = &config.lightning;
        let heads = tp.part(all.heads, "the lightning layers' heads (num_attention_heads)")?;
        let cfg = LightningConfig { heads: heads.len(), kv_heads: heads.len(), ..all.clone() };
        let eps = config.rms_norm_eps;
        let norm = |w: &mut Weights, name: &str| RmsNorm::load(w, &format!("{prefix}.{name}"), eps, dtype);
        let d = all.head_dim;
        let o_norm = Part::Rows(heads.start * d..heads.end * d);
        Ok(Self {
            qkvz_proj: QkvGate::load(weights, prefix, cfg.use_output_gate.then_some("z_proj"), dtype, &HeadRows::of(tp, &heads, &heads, d))?,
            o_proj: Linear::row_parallel(weights, &format!("{prefix}.o_proj"), dtype, false, tp)?,
            q_norm: if cfg.qk_norm { Some(norm(weights, "q_norm")?) } else { None },
            k_norm: if cfg.qk_norm { Some(norm(weights, "k_norm")?) } else { None },
            o_norm: if cfg.use_output_norm { Some(RmsNorm::load_part(weights, &format!("{prefix}.o_norm"), eps, dtype, o_norm)?) } else { None },
            // The decay rate is the global head's.
            slopes: Array::from_slice(&gla::alibi_slopes(all.heads)[heads.clone()], &[heads.len() as i32]),
            tp: tp.clone(),
            norm_width: all.heads * d,
            cfg,
        })
    }

    /// `x`: the (normed) hidden state `[B, T, hidden]`, row b continuing `states[b]` at
    /// `positions` (made once per forward call for all lightning layers). Returns the output
    /// `[B, T, H·d]` before [`LightningAttention::o_proj`], with its norm and gate still to apply:
    /// the caller adds o_proj of it into the residual stream in one step, which folds them in.
    pub fn attend(&self, x: Input, states: &mut [&mut RecurrentState], positions: &Positions) -> Result<MixerOutput<'_>> {
        let inner = (self.cfg.heads * self.cfg.head_dim) as i32;
        // q, k, v, z side by side: the kernels read them from the one stacked product.
        let qkvz = self.qkvz_proj.forward_joined(x)?;
        debug_assert!(states.iter().zip(&positions.host).all(|(s, &p)| s.len == p), "lightning states at other positions");
        let o = if x.shape()[1] == 1 { self.decode(&qkvz, states, positions)? } else { self.prefill(&qkvz, states, positions)? };
        let z = || qkvz.try_index((.., .., 3 * inner..4 * inner));
        Ok(match (&self.o_norm, self.cfg.use_output_gate) {
            // Split over ranks, the RMS spans every rank's heads: no single kernel sees them all.
            (Some(norm), gate) if !self.tp.is_single() => {
                let o = self.sharded_rms_norm(&o, norm)?;
                MixerOutput::done(if gate { sigmoid_gate(&o, &z()?)? } else { o })
            }
            (Some(norm), true) => MixerOutput::normed(o, norm, Some((qkvz, 3 * inner))),
            (Some(norm), false) => MixerOutput::normed(o, norm, None),
            (None, true) => MixerOutput::done(sigmoid_gate(&o, &z()?)?),
            (None, false) => MixerOutput::done(o),
        })
    }

    /// One token for every sequence at once (`qkvz` `[B, 1, W]`): QK-norm, RoPE and the GLA
    /// step in one kernel on a GPU, the states stacked into one `[B, H, d, d]` array.
    fn decode(&self, qkvz: &Array, states: &mut [&mut RecurrentState], positions: &Positions) -> Result<Array> {
        let (h, d) = (self.cfg.heads as i32, self.cfg.head_dim as i32);
        let zero = || Array::zeros::<f32>(&[1, h, d, d]);
        let own = |s: &RecurrentState| s.state().and_then(|st| st.map_or_else(zero, Ok));
        let state = match RecurrentState::stacked(states) {
            Some(stacked) => stacked,
            None if states.len() == 1 => own(states[0])?,
            None => ops::concatenate(&states.iter().map(|s| own(s)).collect::<std::result::Result<Vec<_>, _>>()?, 0)?,
        };
        let keep_kv = states.iter().any(|s| s.record_replay);
        // A fixed decode step's position is the device's.
        let step = match states.first().and_then(|s| s.step_counts()) {
            Some(counts) if states.len() == 1 => lightning::decode_step_at(&self.step_params(), qkvz, &counts.position, &state, keep_kv)?,
            _ => lightning::decode_step(&self.step_params(), qkvz, &positions.host, &state, keep_kv)?,
        };
        let several = states.len() > 1;
        for (i, s) in states.iter_mut().enumerate() {
            let row = |a: &Array| if several { a.try_index(i as i32..i as i32 + 1) } else { Ok(a.clone()) };
            s.replay = match (&step.kv, s.record_replay) {
                (Some((k, v)), true) => Some(Replay { state: s.state()?, len: s.len, inputs: vec![row(k)?, row(v)?] }),
                _ => None,
            };
            s.len += 1;
        }
        if several {
            RecurrentState::set_stacked(states, &step.state);
        } else {
            states[0].set_state(Some(step.state));
        }
        Ok(step.o)
    }

    /// Several tokens (prefill), each sequence on its own (its own position and state): the
    /// chunked GLA form.
    fn prefill(&self, qkvz: &Array, states: &mut [&mut RecurrentState], positions: &Positions) -> Result<Array> {
        let (b, t) = (qkvz.shape()[0], qkvz.shape()[1]);
        // One sequence: the shared position; several: each its own.
        let offsets = if b == 1 {
            positions.device().clone()
        } else {
            Array::from_slice(&states.iter().map(|s| s.len as i32).collect::<Vec<_>>(), &[b])
        };
        let [q, k, v] = lightning::prompt_heads(&self.step_params(), qkvz, &offsets)?;
        let o = per_sequence(&[&q, &k, &v], states, |qkv, cache| {
            let [q, k, v] = [&qkv[0], &qkv[1], &qkv[2]];
            let before = cache.state()?;
            let (o, state) = gla::simple_gla(q, k, v, &self.slopes, before.as_ref(), self.cfg.q_scale)?;
            cache.replay = cache.record_replay.then(|| Replay { state: before, len: cache.len, inputs: vec![k.clone(), v.clone()] });
            cache.set_state(Some(state));
            cache.len += t as usize;
            Ok(o)
        })?;
        Ok(o.swap_axes(1, 2)?.reshape(&[b, t, (self.cfg.heads * self.cfg.head_dim) as i32])?)
    }

    /// RMSNorm over all H·d outputs of a token when this rank holds only its heads' `o`: the
    /// ranks sum their squares (in float32), then each scales its own block.
    fn sharded_rms_norm(&self, o: &Array, norm: &RmsNorm) -> Result<Array> {
        let o32 = o.as_dtype(Dtype::Float32)?;
        let squares = self.tp.all_sum(&o32.square()?.sum_axis(-1, true)?)?;
        let mean = squares.multiply(scalar(1.0 / self.norm_width as f32, Dtype::Float32)?)?;
        let inv_rms = ops::rsqrt(&mean.add(scalar(norm.eps, Dtype::Float32)?)?)?;
        Ok(o32.multiply(&inv_rms)?.as_dtype(o.dtype())?.multiply(&norm.weight)?)
    }

    /// The output projection Wo.
    pub fn o_proj(&self) -> &Linear {
        &self.o_proj
    }

    /// The layer's shapes, QK-norm, RoPE and decay for kernels::lightning.
    fn step_params(&self) -> lightning::StepParams<'_> {
        lightning::StepParams {
            heads: self.cfg.heads as i32,
            head_dim: self.cfg.head_dim as i32,
            qk_norm: match (&self.q_norm, &self.k_norm) {
                (Some(qn), Some(kn)) => Some((&qn.weight, &kn.weight, qn.eps)),
                _ => None,
            },
            rope_theta: self.cfg.use_rope.then_some(self.cfg.rope_theta),
            slopes: &self.slopes,
            scale: self.cfg.q_scale,
        }
    }

    /// Rolls the state back to `len` tokens, inside the last forward call (recorded with
    /// `record_replay`): the state before that call folded over its first keys and values.
    pub fn rollback(&self, cache: &mut RecurrentState, len: usize) -> Result<()> {
        if cache.len == len {
            return Ok(());
        }
        let replay = cache.replay.as_ref().filter(|r| r.len <= len && len <= cache.len).ok_or_else(|| {
            Error::Usage(format!(
                "lightning layer: cannot roll back from {} to {len} tokens: its last forward call was not recorded \
                 (ModelCache::record_replay) or does not cover that length",
                cache.len
            ))
        })?;
        let kept = (len - replay.len) as i32;
        let state = if kept == 0 {
            replay.state.clone()
        } else {
            let [k, v] = [&replay.inputs[0], &replay.inputs[1]].map(|a| a.try_index((.., .., ..kept, ..)));
            Some(gla::fold_state(&k?, &v?, &self.slopes, replay.state.as_ref())?)
        };
        cache.set_state(state);
        cache.len = len;
        Ok(())
    }
}
