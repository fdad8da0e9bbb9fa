//! Rotary position embeddings, and a dense attention layer's decode step before attention: the
//! query and key heads of the stacked q/k/v projection's row through the per-head norm (Qwen3)
//! and RoPE at each sequence's position, and the keys and values written behind each sequence's
//! recent tokens, in one launch for the batch (`cuda/rope.cu`). In MLX operations that is a
//! slice, reshape, norm, transpose and rope for q and for k, and slice updates for the keys and
//! values, of every sequence, and a decode step is bound by the host's work per operation.
//! Elsewhere (the CPU, Metal) and as the test oracle the same runs in MLX operations.

use super::custom::{apply, backend, device_counts, in_pieces, shape_args, slot_source, Backend, KernelSource, Launch, SlotKernel, TemplateArg, MAX_SHAPE_ARGS};
use super::kv::{append_token_mlx, with_device_places, KvColumns, RecentSlot};
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

    /// [`RopeAngles::apply`] with the offsets in a device array `[B]` (int32; one entry for all).
    pub fn apply_at(&self, x: &Array, offsets: &Array) -> Result<Array> {
        let x = if self.mscale != 1.0 { x.multiply(scalar(self.mscale, x.dtype())?)? } else { x.clone() };
        let base = if self.periods.is_some() { None } else { Some(self.base) };
        fast::rope_dynamic(&x, self.dims, false, base, self.position_scale, offsets, self.periods.as_ref())
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

/// The row `rows` `[B, 1, W]` (a view is fine) of B sequences' decoding tokens, `[q | k | v]`, with
/// the q and k heads normed (if the layer has norms) and rotated, sequence b at `positions[b]`:
/// the queries `[B, 1, Hq·d]`, and for each slot its recent buffers with the token's keys and
/// values at `at` (new arrays; positions before `at` as they were, after it unspecified).
pub fn rope_append(rows: &Array, heads: QkHeads, angles: &RopeAngles, positions: &[usize], slots: &[RecentSlot]) -> Result<(Array, Vec<(Array, Array)>)> {
    let d = heads.head_dim;
    let fits = backend() == Backend::Cuda
        && rows.ndim() == 3
        && rows.shape()[1] == 1
        && rows.shape()[0] as usize == positions.len()
        && slots.len() == positions.len()
        && d % 32 == 0
        && d <= 1024
        && (d * rows.item_size() as i32) % 16 == 0
        && angles.dims % 2 == 0
        // Float constants travel as the bit patterns of template ints, which must not be negative.
        && angles.mscale > 0.0
        && angles.position_scale > 0.0
        && (angles.periods.is_some() || angles.base > 1.0)
        && angles.dims <= d
        && rows.shape()[2] >= (heads.heads + 2 * heads.kv_heads) * d
        && angles.periods.as_ref().is_none_or(|p| p.dtype() == Dtype::Float32 && p.size() as i32 == angles.dims / 2)
        && heads.norms.is_none_or(|(q, k, _)| q.dtype() == rows.dtype() && k.dtype() == rows.dtype())
        && slots.iter().all(|s| {
            s.keys.dtype() == rows.dtype()
                && s.values.dtype() == rows.dtype()
                && s.keys.shape() == s.values.shape()
                && s.keys.shape() == [1, heads.kv_heads, s.keys.shape()[2], d]
                && s.at < s.keys.shape()[2] as usize
                && s.counts.is_some() == slots[0].counts.is_some()
        })
        && selfcheck::enabled(&ROPE_APPEND_CHECK);
    if !fits {
        return rope_append_mlx(rows, heads, angles, positions, slots);
    }
    let mut pieces = in_pieces(rows, slots, MAX_SHAPE_ARGS, |rows, start, slots| {
        rope_append_cuda(rows, heads, angles, &positions[start..start + slots.len()], slots)
    })?;
    if pieces.len() == 1 {
        return Ok(pieces.remove(0));
    }
    let q = ops::concatenate(&pieces.iter().map(|p| p.0.clone()).collect::<Vec<_>>(), 0)?;
    Ok((q, pieces.into_iter().flat_map(|p| p.1).collect()))
}

/// The MLX-ops version of [`rope_append`].
pub fn rope_append_mlx(rows: &Array, heads: QkHeads, angles: &RopeAngles, positions: &[usize], slots: &[RecentSlot]) -> Result<(Array, Vec<(Array, Array)>)> {
    let (b, d) = (rows.shape()[0], heads.head_dim);
    // In a fixed decode step the positions are the device's.
    let device_positions = device_counts(slots.iter().map(|s| s.counts.as_ref().map(|c| &c.position)))?;
    // Heads `[B, n, 1, d]` from column `start · d`, normed and rotated.
    let part = |start: i32, n: i32, norm: Option<&Array>| -> Result<Array> {
        let x = rows.try_index((.., .., start * d..(start + n) * d))?.reshape(&[b, 1, n, d])?;
        let x = match (norm, heads.norms) {
            (Some(w), Some((_, _, eps))) => fast::rms_norm(&x, Some(w), eps)?,
            _ => x,
        };
        let x = x.swap_axes(1, 2)?;
        match &device_positions {
            Some(at) => angles.apply_at(&x, at),
            None => angles.apply(&x, positions),
        }
    };
    let q = part(0, heads.heads, heads.norms.map(|n| n.0))?.swap_axes(1, 2)?.reshape(&[b, 1, heads.heads * d])?;
    let k = part(heads.heads, heads.kv_heads, heads.norms.map(|n| n.1))?.reshape(&[b, 1, heads.kv_heads * d])?;
    let v = rows.try_index((.., .., (heads.heads + heads.kv_heads) * d..(heads.heads + 2 * heads.kv_heads) * d))?;
    let kv = ops::concatenate(&[k, v], 2)?;
    let columns = KvColumns { keys: 0, values: heads.kv_heads * d, kv_heads: heads.kv_heads, head_dim: d };
    Ok((q, append_token_mlx(&kv, columns, slots)?))
}

/// The kernel against [`rope_append_mlx`] in bfloat16: two sequences at their own positions and
/// recent-buffer fills (one empty), the row a view of wider ones; with QK-norm, a period table and
/// an attention factor, and without. Positions after each token's are not compared (unspecified).
pub static ROPE_APPEND_CHECK: KernelCheck = KernelCheck { name: "rope_append", backends: CUDA_ONLY, run: check_rope_append };

fn check_rope_append() -> Verdict {
    let (hq, hkv, d, capacity) = (4, 2, 64, 16);
    let positions = [3, 1000];
    let at = [0, 9];
    let bf16 = Dtype::Bfloat16;
    let periods: Vec<f32> = (0..d / 2).map(|i| 10000f32.powf(2.0 * i as f32 / d as f32) * (1.0 + i as f32 / 8.0)).collect();
    let plain = RopeAngles { dims: d, base: 500000.0, periods: None, position_scale: 1.0, mscale: 1.0 };
    let scaled = RopeAngles { dims: d, base: 0.0, periods: Some(Array::from_slice(&periods, &[d / 2])), position_scale: 0.5, mscale: 1.2 };
    let outputs = |(q, written): (Array, Vec<(Array, Array)>)| -> Result<Vec<Array>> {
        let mut out = vec![q];
        for ((k, v), at) in written.into_iter().zip(at) {
            out.push(k.try_index((.., .., ..=at as i32, ..))?);
            out.push(v.try_index((.., .., ..=at as i32, ..))?);
        }
        Ok(out)
    };
    for (angles, normed) in [(&plain, true), (&scaled, false)] {
        verify(
            || {
                let rows = sample(&[2, 1, (hq + 2 * hkv) * d + 8], 71, bf16)?.try_index((.., .., 8..))?;
                let norm = |seed| sample(&[d], seed, bf16)?.multiply(Array::from_f32(0.5))?.add(Array::from_f32(1.0))?.as_dtype(bf16);
                let slots = (0..2)
                    .map(|i| {
                        let buffer = |seed| sample(&[1, hkv, capacity, d], seed, bf16);
                        Ok(RecentSlot::at(buffer(74 + 2 * i as u64)?, buffer(75 + 2 * i as u64)?, at[i]))
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok((rows, norm(72)?, norm(73)?, slots))
            },
            // Positions and places given by the host, then as the device's counts (a fixed step).
            |(rows, qn, kn, slots)| {
                let heads = QkHeads { heads: hq, kv_heads: hkv, head_dim: d, norms: normed.then_some((qn, kn, 1e-6)) };
                let mut out = outputs(rope_append_cuda(rows, heads, angles, &positions, slots)?)?;
                out.extend(outputs(rope_append_cuda(rows, heads, angles, &[0; 2], &with_device_places(slots, &positions)?)?)?);
                Ok(out)
            },
            |(rows, qn, kn, slots)| {
                let heads = QkHeads { heads: hq, kv_heads: hkv, head_dim: d, norms: normed.then_some((qn, kn, 1e-6)) };
                let once = outputs(rope_append_mlx(rows, heads, angles, &positions, slots)?)?;
                Ok(once.iter().chain(&once).cloned().collect())
            },
        )
        .map_err(|e| if normed { format!("with QK-norm: {e}") } else { format!("with a period table: {e}") })?;
    }
    Ok(())
}

/// At most [`MAX_SHAPE_ARGS`] sequences.
fn rope_append_cuda(rows: &Array, heads: QkHeads, angles: &RopeAngles, positions: &[usize], slots: &[RecentSlot]) -> Result<(Array, Vec<(Array, Array)>)> {
    const THREADS: i32 = 128;
    let (n, b, d) = (slots.len(), rows.shape()[0], heads.head_dim);
    let (hq, hkv) = (heads.heads, heads.kv_heads);
    let buffer = slots[0].keys.shape().to_vec();
    // A fixed step's positions and places are the device's: its grid covers the whole buffer.
    let device_at = device_counts(slots.iter().map(|s| s.counts.as_ref().map(|c| &c.recent_at)))?;
    let device_positions = device_counts(slots.iter().map(|s| s.counts.as_ref().map(|c| &c.position)))?;
    let longest = match device_at {
        Some(_) => buffer[2],
        None => slots.iter().map(|s| s.at).max().unwrap_or(0) as i32,
    };
    let pieces = 2 * hkv * longest * d / (16 / rows.item_size() as i32);
    let copy_blocks = ((pieces + THREADS - 1) / THREADS).clamp(1, 32);
    // As `sala_rope_head_blocks` in cuda/rope.cu: a warp per q, k and v head, 4 warps a block.
    let head_blocks = (hq + 2 * hkv + 3) / 4;
    let in_data = device_at.is_some();
    let (positions, at) = match (device_positions, device_at) {
        (Some(positions), Some(at)) => (positions, at),
        _ => (shape_args(positions)?, shape_args(&slots.iter().map(|s| s.at).collect::<Vec<_>>())?),
    };
    let unused = scalar(0.0, Dtype::Float32)?;
    let (q_norm, k_norm, eps) = heads.norms.unwrap_or((rows, rows, 0.0));
    let mut inputs = vec![rows, q_norm, k_norm, angles.periods.as_ref().unwrap_or(&unused), &positions, &at];
    inputs.extend(slots.iter().map(|s| &s.keys));
    inputs.extend(slots.iter().map(|s| &s.values));
    let bits = |x: f32| TemplateArg::Int(x.to_bits() as i32);
    let mut outputs = vec![(vec![b, 1, hq * d], rows.dtype())];
    outputs.extend(std::iter::repeat_n((buffer, rows.dtype()), 2 * n));
    let out = apply(
        rope_append_source(n),
        &inputs,
        Launch {
            grid: (THREADS * (head_blocks + copy_blocks), b, 1),
            threads: (THREADS, 1, 1),
            outputs,
            template: vec![
                ("T", TemplateArg::Type(rows.dtype())),
                ("D", TemplateArg::Int(d)),
                ("DIMS", TemplateArg::Int(angles.dims)),
                ("HQ", TemplateArg::Int(hq)),
                ("HKV", TemplateArg::Int(hkv)),
                ("NORM", TemplateArg::Bool(heads.norms.is_some())),
                ("TABLE", TemplateArg::Bool(angles.periods.is_some())),
                ("EPS_BITS", bits(eps)),
                ("MSCALE_BITS", bits(angles.mscale)),
                ("POS_SCALE_BITS", bits(angles.position_scale)),
                // As MLX's RoPE: inv_freq = 2^(−(i/(dims/2))·log₂base), log₂base computed on the host.
                ("LOG2_BASE_BITS", bits(if angles.periods.is_some() { 0.0 } else { (angles.base as f64).log2() as f32 })),
                ("COUNTS_IN_DATA", TemplateArg::Bool(in_data)),
            ],
            init: None,
        },
    )?;
    let mut out = out.into_iter();
    let q = out.next().expect("the queries");
    let keys: Vec<Array> = out.by_ref().take(n).collect();
    Ok((q, keys.into_iter().zip(out).collect()))
}

/// The kernel for `n` sequences (1 ..= [`MAX_SHAPE_ARGS`]): inputs rows, the norms, the period
/// table, positions and fills (shape_args broadcasts, or with `COUNTS_IN_DATA` the device's),
/// k0 … k(n−1), v0 … v(n−1); outputs q,
/// ko0 …, vo0 …. CUDA only, as the decode attention it feeds: Metal runs the MLX operations. The
/// rows are read through their strides; the norms, the table and the buffers are whole arrays.
fn rope_append_source(n: usize) -> &'static KernelSource {
    static SOURCES: std::sync::OnceLock<Vec<KernelSource>> = std::sync::OnceLock::new();
    slot_source(&SOURCES, n, |n| {
        let mut inputs: Vec<String> = ["rows", "q_norm", "k_norm", "periods", "positions", "at"].map(String::from).into();
        inputs.extend((0..n).map(|i| format!("k{i}")));
        inputs.extend((0..n).map(|i| format!("v{i}")));
        let mut outputs = vec!["q".to_string()];
        outputs.extend((0..n).map(|i| format!("ko{i}")));
        outputs.extend((0..n).map(|i| format!("vo{i}")));
        let cases: String = (0..n).map(|i| format!("case {i}: kr = k{i}; vr = v{i}; ko = ko{i}; vo = vo{i}; break; ")).collect();
        SlotKernel {
            name: format!("sala_rope_append{n}"),
            inputs,
            outputs,
            cuda_header: concat!(include_str!("../../cuda/round.cu"), include_str!("../../cuda/rope.cu")),
            cuda_body: format!(
                "const T *kr = k0, *vr = v0; T *ko = ko0, *vo = vo0; switch (blockIdx.y) {{ {cases}}} \
                 sala_rope_append<T, D, DIMS, HQ, HKV, NORM, TABLE, EPS_BITS, MSCALE_BITS, POS_SCALE_BITS, LOG2_BASE_BITS>(\
                 rows + blockIdx.y * rows_strides[0], rows_strides[2], q_norm, k_norm, periods, \
                 COUNTS_IN_DATA ? positions[blockIdx.y] : positions_shape[blockIdx.y] - 1, kr, vr, k0_shape[2], \
                 COUNTS_IN_DATA ? at[blockIdx.y] : at_shape[blockIdx.y] - 1, \
                 q + (size_t)blockIdx.y * HQ * D, ko, vo);"
            ),
        }
    })
}

static ROPE_PROMPT: KernelSource = KernelSource {
    name: "sala_rope_prompt",
    inputs: &["rows", "q_norm", "k_norm", "periods", "positions"],
    outputs: &["q", "k", "v"],
    cuda_header: concat!(include_str!("../../cuda/round.cu"), include_str!("../../cuda/rope.cu")),
    cuda_body: "sala_rope_prompt<T, D, DIMS, HQ, HKV, NORM, TABLE, EPS_BITS, MSCALE_BITS, POS_SCALE_BITS, LOG2_BASE_BITS>(\
                rows, rows_strides[0], rows_strides[1], rows_strides[2], q_norm, k_norm, periods, positions, \
                positions_shape[0], rows_shape[1], q, k, v);",
    metal_header: "",
    metal_body: "",
    // The rows are read through their strides (a view of the projection's output); the norms,
    // the table and the positions are whole arrays.
    contiguous_inputs: false,
    shared_memory: 0,
};

/// A prompt chunk's heads from the stacked projection's rows `rows` `[B, T, W]` (a view is fine),
/// `[q | k | v | …]`: q `[B, Hq, T, d]`, k and v `[B, Hkv, T, d]`, q and k normed (when the layer
/// has norms) and rotated by `angles` (none: not rotated), token t of sequence b at
/// `positions[b] + t` (`positions`: int32, one for all or one per sequence). On CUDA one kernel
/// writes the three in the layout attention and GLA read; elsewhere MLX operations.
pub fn prompt_heads(rows: &Array, heads: QkHeads, angles: Option<&RopeAngles>, positions: &Array) -> Result<[Array; 3]> {
    let (d, positions) = (heads.head_dim, positions.reshape(&[-1])?);
    let fits = backend() == Backend::Cuda
        && rows.ndim() == 3
        // Tokens and sequences are grid dimensions.
        && rows.shape()[1] <= 65535
        && rows.shape()[0] <= 65535
        && matches!(rows.dtype(), Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32)
        && positions.dtype() == Dtype::Int32
        && (positions.size() == 1 || positions.size() as i32 == rows.shape()[0])
        && d % 32 == 0
        && d <= 1024
        && rows.shape()[2] >= (heads.heads + 2 * heads.kv_heads) * d
        && heads.norms.is_none_or(|(q, k, _)| q.dtype() == rows.dtype() && k.dtype() == rows.dtype() && q.size() as i32 == d && k.size() as i32 == d)
        && angles.is_none_or(|a| {
            a.dims % 2 == 0
                && a.dims <= d
                // Float constants travel as the bit patterns of template ints, which must not be negative.
                && a.mscale > 0.0
                && a.position_scale > 0.0
                && (a.periods.is_some() || a.base > 1.0)
                && a.periods.as_ref().is_none_or(|p| p.dtype() == Dtype::Float32 && p.size() as i32 == a.dims / 2)
        })
        && selfcheck::enabled(&ROPE_PROMPT_CHECK);
    if !fits {
        return prompt_heads_mlx(rows, heads, angles, &positions);
    }
    prompt_heads_cuda(rows, heads, angles, &positions)
}

/// The MLX-ops version of [`prompt_heads`]: the slices, norms, transposes and rotations the
/// kernel replaces (v a transposed view, not a copy).
pub fn prompt_heads_mlx(rows: &Array, heads: QkHeads, angles: Option<&RopeAngles>, positions: &Array) -> Result<[Array; 3]> {
    let (b, t, d) = (rows.shape()[0], rows.shape()[1], heads.head_dim);
    let part = |start: i32, n: i32, norm: Option<&Array>, rotate: bool| -> Result<Array> {
        let x = rows.try_index((.., .., start * d..(start + n) * d))?.reshape(&[b, t, n, d])?;
        let x = match (norm, heads.norms) {
            (Some(w), Some((_, _, eps))) => fast::rms_norm(&x, Some(w), eps)?,
            _ => x,
        };
        let x = x.swap_axes(1, 2)?;
        match angles.filter(|_| rotate) {
            Some(angles) => angles.apply_at(&x, positions),
            None => Ok(x),
        }
    };
    let (hq, hkv) = (heads.heads, heads.kv_heads);
    Ok([part(0, hq, heads.norms.map(|n| n.0), true)?, part(hq, hkv, heads.norms.map(|n| n.1), true)?, part(hq + hkv, hkv, None, false)?])
}

fn prompt_heads_cuda(rows: &Array, heads: QkHeads, angles: Option<&RopeAngles>, positions: &Array) -> Result<[Array; 3]> {
    const THREADS: i32 = 128;
    let (b, t, d) = (rows.shape()[0], rows.shape()[1], heads.head_dim);
    let (hq, hkv) = (heads.heads, heads.kv_heads);
    let unused = scalar(0.0, Dtype::Float32)?;
    let (q_norm, k_norm, eps) = heads.norms.unwrap_or((rows, rows, 0.0));
    let periods = angles.and_then(|a| a.periods.as_ref()).unwrap_or(&unused);
    let bits = |x: f32| TemplateArg::Int(x.to_bits() as i32);
    // No angles: no dimension turns (DIMS 0).
    let (dims, mscale, position_scale) = angles.map_or((0, 1.0, 1.0), |a| (a.dims, a.mscale, a.position_scale));
    let log2_base = angles.filter(|a| a.periods.is_none()).map_or(0.0, |a| (a.base as f64).log2() as f32);
    let out = apply(
        &ROPE_PROMPT,
        &[rows, q_norm, k_norm, periods, positions],
        Launch {
            // As `sala_rope_head_blocks` in cuda/rope.cu: a warp per q, k and v head, 4 warps a block.
            grid: (THREADS * ((hq + 2 * hkv + 3) / 4), t, b),
            threads: (THREADS, 1, 1),
            outputs: vec![(vec![b, hq, t, d], rows.dtype()), (vec![b, hkv, t, d], rows.dtype()), (vec![b, hkv, t, d], rows.dtype())],
            template: vec![
                ("T", TemplateArg::Type(rows.dtype())),
                ("D", TemplateArg::Int(d)),
                ("DIMS", TemplateArg::Int(dims)),
                ("HQ", TemplateArg::Int(hq)),
                ("HKV", TemplateArg::Int(hkv)),
                ("NORM", TemplateArg::Bool(heads.norms.is_some())),
                ("TABLE", TemplateArg::Bool(angles.is_some_and(|a| a.periods.is_some()))),
                ("EPS_BITS", bits(eps)),
                ("MSCALE_BITS", bits(mscale)),
                ("POS_SCALE_BITS", bits(position_scale)),
                ("LOG2_BASE_BITS", bits(log2_base)),
            ],
            init: None,
        },
    )?;
    let [q, k, v]: [Array; 3] = out.try_into().unwrap_or_else(|_| unreachable!("three outputs"));
    Ok([q, k, v])
}

/// The prompt kernel against [`prompt_heads_mlx`] in bfloat16: two sequences at their own
/// positions from a view of wider rows, with QK-norm, grouped KV heads and MLX's base angles; one
/// sequence at one position with a period table, an attention factor, a position scale and a
/// partial rotation; and neither norm nor rotation.
pub static ROPE_PROMPT_CHECK: KernelCheck = KernelCheck { name: "rope_prompt", backends: CUDA_ONLY, run: check_rope_prompt };

fn check_rope_prompt() -> Verdict {
    let bf16 = Dtype::Bfloat16;
    let periods: Vec<f32> = (0..16).map(|i| 10000f32.powf(i as f32 / 16.0) * (1.0 + i as f32 / 8.0)).collect();
    let plain = RopeAngles { dims: 64, base: 1e6, periods: None, position_scale: 1.0, mscale: 1.0 };
    let model = RopeAngles { dims: 128, base: 1e6, periods: None, position_scale: 1.0, mscale: 1.0 };
    let scaled = RopeAngles { dims: 32, base: 0.0, periods: Some(Array::from_slice(&periods, &[16])), position_scale: 0.5, mscale: 1.2 };
    // (what, [B, T, Hq, Hkv, d], QK-norm, angles, positions).
    type Case<'a> = (&'a str, [i32; 5], bool, Option<&'a RopeAngles>, &'a [i32]);
    let cases: [Case; 4] = [
        ("QK-norm and base angles", [2, 9, 4, 2, 64], true, Some(&plain), &[3, 1000]),
        // The models' heads: 128 wide, all of them rotated (SALA's lightning layers, Qwen3).
        ("128-wide heads", [1, 33, 4, 2, 128], true, Some(&model), &[4095]),
        ("a period table", [1, 70, 3, 3, 64], false, Some(&scaled), &[517]),
        ("no norm, no rotation", [2, 5, 2, 1, 32], false, None, &[0]),
    ];
    for (what, [b, t, hq, hkv, d], normed, angles, at) in cases {
        verify(
            || {
                let width = (hq + 2 * hkv) * d;
                let rows = sample(&[b, t, width + 8 + d], 81, bf16)?.try_index((.., .., 8..8 + width + d))?;
                let norm = |seed| sample(&[d], seed, bf16)?.multiply(Array::from_f32(0.5))?.add(Array::from_f32(1.0))?.as_dtype(bf16);
                Ok((rows, norm(82)?, norm(83)?, Array::from_slice(at, &[at.len() as i32])))
            },
            |(rows, qn, kn, positions)| {
                let heads = QkHeads { heads: hq, kv_heads: hkv, head_dim: d, norms: normed.then_some((qn, kn, 1e-6)) };
                Ok(prompt_heads_cuda(rows, heads, angles, positions)?.into())
            },
            |(rows, qn, kn, positions)| {
                let heads = QkHeads { heads: hq, kv_heads: hkv, head_dim: d, norms: normed.then_some((qn, kn, 1e-6)) };
                Ok(prompt_heads_mlx(rows, heads, angles, positions)?.into())
            },
        )
        .map_err(|e| format!("{what}: {e}"))?;
    }
    Ok(())
}
