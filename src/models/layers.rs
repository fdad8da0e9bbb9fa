//! Building blocks shared by the model families.

use crate::engine::error::Result;
use crate::engine::ops::scalar;
use crate::engine::weights::Weights;
use mlx_rs::{fast, ops, Array, Dtype};

/// y = x · Wᵀ with W stored `[out, in]`.
pub struct Linear {
    pub weight: Array,
}

impl Linear {
    pub fn load(weights: &mut Weights, name: &str, dtype: Dtype) -> Result<Self> {
        Ok(Self { weight: weights.get(&format!("{name}.weight"), dtype)? })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(x.matmul(self.weight.t())?)
    }
}

pub struct RmsNorm {
    pub weight: Array,
    pub eps: f32,
}

impl RmsNorm {
    pub fn load(weights: &mut Weights, name: &str, eps: f32, dtype: Dtype) -> Result<Self> {
        Ok(Self { weight: weights.get(&format!("{name}.weight"), dtype)?, eps })
    }

    /// RMS over the last axis in float32, then the weight.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }
}

/// SwiGLU feed-forward: down(silu(gate(x)) ⊙ up(x)).
pub struct Mlp {
    pub gate: Linear,
    pub up: Linear,
    pub down: Linear,
}

impl Mlp {
    pub fn load(weights: &mut Weights, prefix: &str, dtype: Dtype) -> Result<Self> {
        Ok(Self {
            gate: Linear::load(weights, &format!("{prefix}.gate_proj"), dtype)?,
            up: Linear::load(weights, &format!("{prefix}.up_proj"), dtype)?,
            down: Linear::load(weights, &format!("{prefix}.down_proj"), dtype)?,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let gate = self.gate.forward(x)?;
        let act = gate.multiply(ops::sigmoid(&gate)?)?;
        self.down.forward(&act.multiply(self.up.forward(x)?)?)
    }
}

/// x ⊙ σ(gate) — the output gates of both SALA layer types.
pub fn sigmoid_gate(x: &Array, gate: &Array) -> Result<Array> {
    Ok(x.multiply(ops::sigmoid(gate)?)?)
}

/// x · c with c in x's dtype (a float scalar would promote bf16 to f32).
pub fn scale(x: &Array, c: f32) -> Result<Array> {
    Ok(x.multiply(scalar(c, x.dtype())?)?)
}
