//! Rotary position embeddings, and a dense attention layer's decode step before attention: the
//! query and key heads of the stacked q/k/v projection's row through the per-head norm (Qwen3)
//! and RoPE at each sequence's position, in one launch for the batch (`cuda/rope.cu`). In MLX
//! operations that is a slice, reshape, norm, transpose and rope for q and for k of every
//! sequence, and a decode step is bound by the host's work per operation. Elsewhere (the CPU,
//! Metal) and as the test oracle the same runs in MLX operations.

use super::custom::{apply, backend, shape_args, Backend, KernelSource, Launch, TemplateArg, MAX_SHAPE_ARGS};
use super::lightning::positions_array;
use super::selfcheck::{self, sample, verify, KernelCheck, Verdict, CUDA_ONLY};
use crate::engine::ops::scalar;
use mlx_rs::{error::Result, fast, ops, ops::indexing::TryIndexOp, Array, Dtype};

/// RoPE as MLX's `fast::rope` takes it (rotate-half layout): the first `dims` dimensions of a head
/// turn pair by pair, pair i by the angle position · `position_scale` / period_i, after the head
/// is multiplied by `mscale`.
#[derive(Clone)]
pub struct RopeAngles {
    pub dims: i32,
    /// period_i = base^(2i/dims), unless `periods` gives them.
    pub base: f32,
    /// Periods per pair `[dims/2]` (float32).
    pub periods: Option<Array>,
    pub position_scale: f32,
    pub mscale: f32,
}

impl RopeAngles {
    /// Rotates `x` `[B, H, T, D]`: row t of sequence b at position `offsets[b] + t` (one offset for
    /// all, or one per sequence).
    pub fn apply(&self, x: &Array, offsets: &[usize]) -> Result<Array> {
        let x = if self.mscale != 1.0 { x.multiply(scalar(self.mscale, x.dtype())?)? } else { x.clone() };
        let base = if self.periods.is_some() { None } else { Some(self.base) };
        match offsets {
            [one] => fast::rope(&x, self.dims, false, base, self.position_scale, *one as i32, self.periods.as_ref()),
            many => fast::rope_dynamic(&x, self.dims, false, base, self.position_scale, positions_array(many), self.periods.as_ref()),
        }
    }
}

/// Where the heads are in the stacked projection's row `[q | k | v]` (each head `head_dim` wide),
/// and the per-head norms of q and k (weights `[head_dim]` in the row's dtype, ε) when the layer
/// has them.
#[derive(Clone, Copy)]
pub struct QkHeads<'a> {
    pub heads: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
    pub norms: Option<(&'a Array, &'a Array, f32)>,
}

/// The row `rows` `[B, 1, W]` (a view is fine) of B sequences' decoding tokens with the q and k
/// heads normed (if the layer has norms) and rotated, sequence b at `positions[b]`: the queries
/// as attention reads them, `[B, Hq, 1, d]`, and the rest of the row `[B, 1, W − Hq·d]` (the
/// rotated keys, then the values as they were), both new and contiguous.
pub fn rope_qk(rows: &Array, heads: QkHeads, angles: &RopeAngles, positions: &[usize]) -> Result<(Array, Array)> {
    let d = heads.head_dim;
    let fits = backend() == Backend::Cuda
        && rows.ndim() == 3
        && rows.shape()[1] == 1
        && rows.shape()[0] as usize == positions.len()
        && d % 32 == 0
        && d <= 1024
        && angles.dims % 2 == 0
        // Float constants travel as the bit patterns of template ints, which must not be negative.
        && angles.mscale > 0.0
        && angles.position_scale > 0.0
        && (angles.periods.is_some() || angles.base > 1.0)
        && angles.dims <= d
        && rows.shape()[2] % d == 0
        && rows.shape()[2] >= (heads.heads + 2 * heads.kv_heads) * d
        && angles.periods.as_ref().is_none_or(|p| p.dtype() == Dtype::Float32 && p.size() as i32 == angles.dims / 2)
        && heads.norms.is_none_or(|(q, k, _)| q.dtype() == rows.dtype() && k.dtype() == rows.dtype())
        && selfcheck::enabled(&ROPE_QK_CHECK);
    if !fits {
        return rope_qk_mlx(rows, heads, angles, positions);
    }
    rope_qk_cuda(rows, heads, angles, positions)
}

/// The MLX-ops version of [`rope_qk`].
pub fn rope_qk_mlx(rows: &Array, heads: QkHeads, angles: &RopeAngles, positions: &[usize]) -> Result<(Array, Array)> {
    let (b, d) = (rows.shape()[0], heads.head_dim);
    // Heads `[B, n, 1, d]` from column `start · d`, normed and rotated.
    let part = |start: i32, n: i32, norm: Option<&Array>| -> Result<Array> {
        let x = rows.try_index((.., .., start * d..(start + n) * d))?.reshape(&[b, 1, n, d])?;
        let x = match (norm, heads.norms) {
            (Some(w), Some((_, _, eps))) => fast::rms_norm(&x, Some(w), eps)?,
            _ => x,
        };
        angles.apply(&x.swap_axes(1, 2)?, positions)
    };
    let q = part(0, heads.heads, heads.norms.map(|n| n.0))?;
    let k = part(heads.heads, heads.kv_heads, heads.norms.map(|n| n.1))?.reshape(&[b, 1, heads.kv_heads * d])?;
    let rest = rows.try_index((.., .., (heads.heads + heads.kv_heads) * d..))?;
    Ok((q, ops::concatenate(&[k, rest], 2)?))
}

/// The kernel against [`rope_qk_mlx`] in bfloat16: two sequences at their own positions, the row a
/// view of wider ones; with QK-norm, a period table and an attention factor, and without.
pub static ROPE_QK_CHECK: KernelCheck = KernelCheck { name: "rope_qk", backends: CUDA_ONLY, run: check_rope_qk };

fn check_rope_qk() -> Verdict {
    let (hq, hkv, d) = (4, 2, 64);
    let positions = [3, 1000];
    let bf16 = Dtype::Bfloat16;
    let periods: Vec<f32> = (0..d / 2).map(|i| 10000f32.powf(2.0 * i as f32 / d as f32) * (1.0 + i as f32 / 8.0)).collect();
    let plain = RopeAngles { dims: d, base: 500000.0, periods: None, position_scale: 1.0, mscale: 1.0 };
    let scaled = RopeAngles { dims: d, base: 0.0, periods: Some(Array::from_slice(&periods, &[d / 2])), position_scale: 0.5, mscale: 1.2 };
    for (angles, normed) in [(&plain, true), (&scaled, false)] {
        verify(
            || {
                let rows = sample(&[2, 1, (hq + 2 * hkv) * d + 8], 71, bf16)?.try_index((.., .., 8..))?;
                let norm = |seed| sample(&[d], seed, bf16)?.multiply(Array::from_f32(0.5))?.add(Array::from_f32(1.0))?.as_dtype(bf16);
                Ok((rows, norm(72)?, norm(73)?))
            },
            |(rows, qn, kn)| {
                let heads = QkHeads { heads: hq, kv_heads: hkv, head_dim: d, norms: normed.then_some((qn, kn, 1e-6)) };
                let (q, rest) = rope_qk_cuda(rows, heads, angles, &positions)?;
                Ok(vec![q, rest])
            },
            |(rows, qn, kn)| {
                let heads = QkHeads { heads: hq, kv_heads: hkv, head_dim: d, norms: normed.then_some((qn, kn, 1e-6)) };
                let (q, rest) = rope_qk_mlx(rows, heads, angles, &positions)?;
                Ok(vec![q, rest])
            },
        )
        .map_err(|e| if normed { format!("with QK-norm: {e}") } else { format!("with a period table: {e}") })?;
    }
    Ok(())
}

fn rope_qk_cuda(rows: &Array, heads: QkHeads, angles: &RopeAngles, positions: &[usize]) -> Result<(Array, Array)> {
    let (b, width) = (rows.shape()[0], rows.shape()[2]);
    let d = heads.head_dim;
    // Up to MAX_SHAPE_ARGS positions travel as a shape (nothing for the GPU to fetch); more as an
    // array the host writes.
    let in_shape = positions.len() <= MAX_SHAPE_ARGS;
    let positions = if in_shape { shape_args(positions)? } else { positions_array(positions) };
    let unused = scalar(0.0, Dtype::Float32)?;
    let (q_norm, k_norm, eps) = heads.norms.unwrap_or((rows, rows, 0.0));
    let bits = |x: f32| TemplateArg::Int(x.to_bits() as i32);
    let out = apply(
        &ROPE_QK,
        &[rows, q_norm, k_norm, angles.periods.as_ref().unwrap_or(&unused), &positions],
        Launch {
            grid: (32 * 4 * ((width / d + 3) / 4), b, 1),
            threads: (32 * 4, 1, 1),
            outputs: vec![(vec![b, heads.heads, 1, d], rows.dtype()), (vec![b, 1, width - heads.heads * d], rows.dtype())],
            template: vec![
                ("T", TemplateArg::Type(rows.dtype())),
                ("D", TemplateArg::Int(d)),
                ("DIMS", TemplateArg::Int(angles.dims)),
                ("HQ", TemplateArg::Int(heads.heads)),
                ("HKV", TemplateArg::Int(heads.kv_heads)),
                ("NORM", TemplateArg::Bool(heads.norms.is_some())),
                ("TABLE", TemplateArg::Bool(angles.periods.is_some())),
                ("EPS_BITS", bits(eps)),
                ("MSCALE_BITS", bits(angles.mscale)),
                ("POS_SCALE_BITS", bits(angles.position_scale)),
                // As MLX's RoPE: inv_freq = 2^(−(i/(dims/2))·log₂base), log₂base computed on the host.
                ("LOG2_BASE_BITS", bits(if angles.periods.is_some() { 0.0 } else { (angles.base as f64).log2() as f32 })),
                ("POS_IN_SHAPE", TemplateArg::Bool(in_shape)),
            ],
            init: None,
        },
    )?;
    let mut out = out.into_iter();
    Ok((out.next().expect("two outputs"), out.next().expect("two outputs")))
}

static ROPE_QK: KernelSource = KernelSource {
    name: "sala_rope_qk",
    inputs: &["rows", "q_norm", "k_norm", "periods", "positions"],
    outputs: &["q_out", "rest_out"],
    cuda_header: concat!(include_str!("../../cuda/round.cu"), include_str!("../../cuda/rope.cu")),
    cuda_body: "sala_rope_heads<T, D, DIMS, HQ, HKV, NORM, TABLE, EPS_BITS, MSCALE_BITS, POS_SCALE_BITS, LOG2_BASE_BITS, \
                POS_IN_SHAPE>(rows, rows_strides, q_norm, k_norm, periods, positions, positions_shape, q_out, rest_out, rows_shape[2]);",
    // CUDA only, as the decode attention and KV append it feeds: Metal runs the MLX operations.
    metal_header: "",
    metal_body: "",
    // `positions` may be a shape_args broadcast and the row is read through its strides; the
    // norms and the period table are whole arrays.
    contiguous_inputs: false,
};
