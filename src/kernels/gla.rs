//! Simple GLA (gated linear attention with a constant per-head decay), fla's `g_gamma` semantics:
//!
//!   S_t = γ_h · S_{t−1} + k_tᵀ v_t,   o_t = (scale · q_t) · S_t        (γ_h = exp(−slope_h))
//!
//! Inputs are `[B, H, T, d]`, the state is float32 `[B, H, d_k, d_v]`, everything is computed in
//! float32. No normaliser. The decode step has a GPU kernel (`cuda/gla_decode.cu`,
//! `metal/gla_decode.metal`) that reads the inputs and writes the output in the model's dtype,
//! so a decode step makes no conversion operations (decode is bound by the host's work per
//! operation, see eval/results/2026-11-22-h100-6453092).

use super::custom::{apply, backend, Backend, KernelSource, Launch, TemplateArg};
use super::selfcheck::{self, sample, verify, KernelCheck, Verdict, CUDA_AND_METAL, CUDA_ONLY};
use crate::engine::ops::{arange_f32, scalar};
use mlx_rs::{error::Result, ops, Array, Dtype};

/// Chunk length of the parallel form.
pub const CHUNK: usize = 64;

/// Runs GLA over the new tokens on top of `state` (zero when `None`); returns (output in q's
/// dtype, new float32 state). One token takes the recurrent step, more take the chunked parallel
/// form; both are exact.
pub fn simple_gla(
    q: &Array,
    k: &Array,
    v: &Array,
    slopes: &Array,
    state: Option<&Array>,
    scale: f32,
) -> Result<(Array, Array)> {
    if q.shape()[2] == 1 {
        simple_gla_step(q, k, v, slopes, state, scale)
    } else if chunk_kernels_take(q, k, v) {
        simple_gla_chunked_cuda(q, k, v, slopes, state, scale)
    } else {
        simple_gla_mlx(q, k, v, slopes, state, scale)
    }
}

/// [`simple_gla`] over several tokens in MLX operations only, in float32: the CPU and Metal path,
/// and the chunk kernels' oracle.
pub fn simple_gla_mlx(q: &Array, k: &Array, v: &Array, slopes: &Array, state: Option<&Array>, scale: f32) -> Result<(Array, Array)> {
    in_float32(q, k, v, |q, k, v| simple_gla_chunked(q, k, v, slopes, state, scale))
}

/// Whether the chunk kernels (`cuda/gla_prefill.cu`) take these inputs: CUDA, bfloat16 (the
/// float32 parts of the products are split into two bfloat16 values, which float16's range would
/// not hold), head sizes in whole tiles.
fn chunk_kernels_take(q: &Array, k: &Array, v: &Array) -> bool {
    let (dk, dv) = (q.shape()[3], v.shape()[3]);
    backend() == Backend::Cuda
        && [q, k, v].iter().all(|a| a.dtype() == Dtype::Bfloat16)
        && dk % 32 == 0
        && dv % 32 == 0
        && dk <= 256
        && selfcheck::enabled(&GLA_PREFILL_CHECK)
}

/// Columns of the state's dk axis per block of `sala_gla_chunk_states`.
const STATE_TILE_DK: i32 = 32;

/// Columns of dv per block of both kernels: 64, or 32 for heads of 32 · odd.
fn value_tile(dv: i32) -> i32 {
    if dv % 64 == 0 {
        64
    } else {
        32
    }
}

/// The chunked form on tensor cores: one kernel walks the chunks and writes the state entering
/// each, a second computes every chunk's output from it in parallel. The output is a `[B, H, T,
/// dv]` view of rows `[B, T, H, dv]`, so the caller's transpose back to rows copies nothing.
fn simple_gla_chunked_cuda(
    q: &Array,
    k: &Array,
    v: &Array,
    slopes: &Array,
    state: Option<&Array>,
    scale: f32,
) -> Result<(Array, Array)> {
    let (b, h, t, dk) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let dv = v.shape()[3];
    let chunks = (t as usize).div_ceil(CHUNK) as i32;
    let state = match state {
        Some(s) => s.clone(),
        None => zero_state(q, v)?,
    };
    let vt = value_tile(dv);
    let dims = |extra: Vec<(&'static str, TemplateArg)>| {
        let mut template = vec![("DK", TemplateArg::Int(dk)), ("DV", TemplateArg::Int(dv)), ("VT", TemplateArg::Int(vt))];
        template.extend(extra);
        template
    };
    let mut states = apply(
        &GLA_CHUNK_STATES,
        &[k, v, slopes, &state],
        Launch {
            // 16 state rows a warp.
            grid: (dv / vt * 2 * vt, dk / STATE_TILE_DK, b * h),
            threads: (2 * vt, 1, 1),
            outputs: vec![(vec![b * h, chunks, dv / 8, dk / 16, 256], Dtype::Bfloat16), (vec![b, h, dk, dv], Dtype::Float32)],
            template: dims(vec![("BN", TemplateArg::Int(STATE_TILE_DK))]),
            init: None,
        },
    )?
    .into_iter();
    let (entering, next_state) = (states.next().expect("2 outputs"), states.next().expect("2 outputs"));
    let out = apply(
        &GLA_CHUNK_OUTPUT,
        &[q, k, v, slopes, &entering],
        Launch {
            grid: (chunks * 128, b * h, dv / vt),
            threads: (128, 1, 1),
            outputs: vec![(vec![b, t, h, dv], Dtype::Bfloat16)],
            template: dims(vec![("SCALE_BITS", TemplateArg::Int(scale.to_bits() as i32))]),
            init: None,
        },
    )?
    .pop()
    .expect("1 output");
    Ok((out.swap_axes(1, 2)?, next_state))
}

const GLA_PREFILL_HEADER: &str = concat!(
    include_str!("../../cuda/mma.cu"),
    include_str!("../../cuda/attention_mma.cu"),
    include_str!("../../cuda/gla_prefill.cu")
);

static GLA_CHUNK_STATES: KernelSource = KernelSource {
    name: "sala_gla_chunk_states",
    inputs: &["k", "v", "slopes", "state"],
    outputs: &["entering", "next_state"],
    cuda_header: GLA_PREFILL_HEADER,
    cuda_body: "sala_gla_chunk_states<DK, DV, BN, VT>(k, v, slopes, state, entering, next_state, k_shape[1], k_shape[2]);",
    // CUDA only (mma.sync); Metal takes the MLX operations.
    metal_header: "",
    metal_body: "",
    contiguous_inputs: true,
    shared_memory: 0,
};

static GLA_CHUNK_OUTPUT: KernelSource = KernelSource {
    name: "sala_gla_chunk_output",
    inputs: &["q", "k", "v", "slopes", "entering"],
    outputs: &["out"],
    cuda_header: GLA_PREFILL_HEADER,
    cuda_body: "sala_gla_chunk_output<DK, DV, VT, SCALE_BITS>(q, k, v, slopes, entering, out, q_shape[1], q_shape[2]);",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: true,
    shared_memory: 0,
};

/// The chunk kernels against the float32 MLX form: two heads, a carried state, a partial last
/// chunk, bfloat16 inputs.
pub static GLA_PREFILL_CHECK: KernelCheck = KernelCheck { name: "gla_prefill", backends: CUDA_ONLY, run: check_gla_prefill };

fn check_gla_prefill() -> Verdict {
    let (b, h, t, d) = (1, 2, 100, 64);
    verify(
        || {
            let qkv = [1, 2, 3].map(|seed| sample(&[b, h, t, d], seed, Dtype::Bfloat16));
            let [q, k, v] = qkv;
            Ok((q?, k?, v?, Array::from_slice(&alibi_slopes(h as usize), &[h]), sample(&[b, h, d, d], 4, Dtype::Float32)?))
        },
        |(q, k, v, slopes, state)| {
            let (o, s) = simple_gla_chunked_cuda(q, k, v, slopes, Some(state), 0.125)?;
            Ok(vec![o, s])
        },
        |(q, k, v, slopes, state)| {
            let (o, s) = simple_gla_mlx(q, k, v, slopes, Some(state), 0.125)?;
            Ok(vec![o, s])
        },
    )
}

/// Runs a float32 form on `q, k, v` converted to float32 and gives its output back in q's dtype.
fn in_float32(
    q: &Array,
    k: &Array,
    v: &Array,
    form: impl FnOnce(&Array, &Array, &Array) -> Result<(Array, Array)>,
) -> Result<(Array, Array)> {
    let f32 = |a: &Array| a.as_dtype(Dtype::Float32);
    let (o, state) = form(&f32(q)?, &f32(k)?, &f32(v)?)?;
    Ok((o.as_dtype(q.dtype())?, state))
}

/// The state after folding the keys and values `[B, H, T, d]` into `state`, computed as
/// [`simple_gla`] computes it (the output, not asked for, is never evaluated).
pub fn fold_state(k: &Array, v: &Array, slopes: &Array, state: Option<&Array>) -> Result<Array> {
    Ok(simple_gla(k, k, v, slopes, state, 1.0)?.1)
}

/// `slopes` [H] → `[1, H, 1, 1]` decay factors exp(−slope · x) for a scalar exponent x.
fn decay(slopes: &Array, exponent: f32) -> Result<Array> {
    slopes.multiply(scalar(-exponent, Dtype::Float32)?)?.exp()?.reshape(&[1, -1, 1, 1])
}

fn zero_state(q: &Array, v: &Array) -> Result<Array> {
    let (b, h, dk, dv) = (q.shape()[0], q.shape()[1], q.shape()[3], v.shape()[3]);
    Array::zeros::<f32>(&[b, h, dk, dv])
}

/// One decode step (T = 1): the fused kernel on a GPU (`cuda/gla_decode.cu`), reading and
/// writing the state once; the recurrence in MLX ops otherwise. The output is in q's dtype.
pub fn simple_gla_step(
    q: &Array,
    k: &Array,
    v: &Array,
    slopes: &Array,
    state: Option<&Array>,
    scale: f32,
) -> Result<(Array, Array)> {
    if backend() == Backend::Cpu || q.shape()[2] != 1 || !selfcheck::enabled(&GLA_DECODE_CHECK) {
        return simple_gla_step_mlx(q, k, v, slopes, state, scale);
    }
    simple_gla_step_kernel(q, k, v, slopes, state, scale)
}

/// [`simple_gla_step`] in MLX operations only, in float32: the CPU path and an oracle (which must
/// not reach a kernel a check is judging).
pub fn simple_gla_step_mlx(q: &Array, k: &Array, v: &Array, slopes: &Array, state: Option<&Array>, scale: f32) -> Result<(Array, Array)> {
    in_float32(q, k, v, |q, k, v| simple_gla_recurrent(q, k, v, slopes, state, scale))
}

/// [`simple_gla_step`]'s kernel.
fn simple_gla_step_kernel(
    q: &Array,
    k: &Array,
    v: &Array,
    slopes: &Array,
    state: Option<&Array>,
    scale: f32,
) -> Result<(Array, Array)> {
    let (b, h, dk, dv) = (q.shape()[0], q.shape()[1], q.shape()[3], v.shape()[3]);
    let state = match state {
        Some(s) => s.clone(),
        None => zero_state(q, v)?,
    };
    let threads = dv.min(128);
    let out = apply(
        &GLA_DECODE,
        &[q, k, v, slopes, &state],
        Launch {
            grid: (dv, b * h, 1),
            threads: (threads, 1, 1),
            outputs: vec![(vec![b, h, 1, dv], q.dtype()), (vec![b, h, dk, dv], Dtype::Float32)],
            // The scale as its bit pattern: a compile-time constant, no upload per step.
            template: vec![
                ("T", TemplateArg::Type(q.dtype())),
                ("H", TemplateArg::Int(h)),
                ("DK", TemplateArg::Int(dk)),
                ("DV", TemplateArg::Int(dv)),
                ("SCALE_BITS", TemplateArg::Int(scale.to_bits() as i32)),
            ],
            init: None,
        },
    )?;
    let mut out = out.into_iter();
    Ok((out.next().expect("2 outputs"), out.next().expect("2 outputs")))
}

static GLA_DECODE: KernelSource = KernelSource {
    name: "sala_gla_decode",
    inputs: &["q", "k", "v", "slopes", "state"],
    outputs: &["out", "next_state"],
    cuda_header: include_str!("../../cuda/gla_decode.cu"),
    cuda_body: "sala_gla_decode<T, H, DK, DV, SCALE_BITS>(q, k, v, slopes, state, out, next_state);",
    metal_header: include_str!("../../metal/gla_decode.metal"),
    metal_body: "sala_gla_decode<T, H, DK, DV, SCALE_BITS>(q, k, v, slopes, state, out, next_state, \
                 thread_position_in_grid.x, thread_position_in_grid.y);",
    contiguous_inputs: true,
    shared_memory: 0,
};

/// The decode step's kernel against the recurrence on bfloat16 inputs (as the model passes them)
/// and a carried state.
pub static GLA_DECODE_CHECK: KernelCheck = KernelCheck { name: "gla_decode", backends: CUDA_AND_METAL, run: check_gla_decode };

fn check_gla_decode() -> Verdict {
    let (b, h, d) = (2, 3, 32);
    verify(
        || {
            let qkv = [1, 2, 3].map(|seed| sample(&[b, h, 1, d], seed, Dtype::Bfloat16));
            let [q, k, v] = qkv;
            Ok((q?, k?, v?, Array::from_slice(&alibi_slopes(h as usize), &[h]), sample(&[b, h, d, d], 4, Dtype::Float32)?))
        },
        |(q, k, v, slopes, state)| {
            let (o, s) = simple_gla_step_kernel(q, k, v, slopes, Some(state), 0.125)?;
            Ok(vec![o, s])
        },
        |(q, k, v, slopes, state)| {
            let (o, s) = in_float32(q, k, v, |q, k, v| simple_gla_recurrent(q, k, v, slopes, Some(state), 0.125))?;
            Ok(vec![o, s])
        },
    )
}

/// The recurrent form in MLX ops, one token at a time (the CPU decode step; the test oracle).
pub fn simple_gla_recurrent(
    q: &Array,
    k: &Array,
    v: &Array,
    slopes: &Array,
    state: Option<&Array>,
    scale: f32,
) -> Result<(Array, Array)> {
    let mut s = match state {
        Some(s) => s.clone(),
        None => zero_state(q, v)?,
    };
    let gamma = decay(slopes, 1.0)?;
    let q = q.multiply(scalar(scale, Dtype::Float32)?)?;
    let t_len = q.shape()[2];
    let mut outputs = Vec::with_capacity(t_len as usize);
    for t in 0..t_len {
        let range = t..t + 1;
        let kt = slice_t(k, range.clone())?;
        let vt = slice_t(v, range.clone())?;
        let qt = slice_t(&q, range)?;
        s = s.multiply(&gamma)?.add(kt.swap_axes(2, 3)?.matmul(&vt)?)?;
        outputs.push(qt.matmul(&s)?);
    }
    let o = if outputs.len() == 1 { outputs.pop().unwrap() } else { ops::concatenate(&outputs, 2)? };
    Ok((o, s))
}

fn slice_t(a: &Array, range: std::ops::Range<i32>) -> Result<Array> {
    use mlx_rs::ops::indexing::TryIndexOp;
    a.try_index((.., .., range, ..))
}

/// The chunked parallel form. Chunk c (length C, the last one possibly shorter) computes
///   intra: ((Q̃ Kᵀ) ⊙ D) V with D[i,j] = γ^{i−j} (j ≤ i)
///   inter: γ^{i+1} · Q̃ S_c, with S_c the state entering the chunk,
/// where S_c = γ^{cC} S_0 + Σ_{c'<c} γ^{C(c−1−c')} U_{c'} and U_c = Σ_j γ^{C−1−j} K_jᵀ V_j (all
/// chunks before the last are full). The returned state uses the true token count T, so a partial
/// last chunk is not over-decayed.
pub fn simple_gla_chunked(
    q: &Array,
    k: &Array,
    v: &Array,
    slopes: &Array,
    state: Option<&Array>,
    scale: f32,
) -> Result<(Array, Array)> {
    let shape = q.shape();
    let (b, h, t, dk) = (shape[0], shape[1], shape[2] as usize, shape[3]);
    let dv = v.shape()[3];
    let c = CHUNK;
    let n = t.div_ceil(c);
    let padded = n * c;
    let pad = |x: &Array| -> Result<Array> {
        if padded == t {
            Ok(x.clone())
        } else {
            ops::pad(x, &[(0, 0), (0, 0), (0, (padded - t) as i32), (0, 0)], None, None)
        }
    };
    let f32s = |x: f32| scalar(x, Dtype::Float32);
    let (ci, ni) = (c as i32, n as i32);
    let neg_slopes = slopes.negative()?.reshape(&[-1, 1, 1])?; // [H,1,1]

    let qc = pad(&q.multiply(f32s(scale)?)?)?.reshape(&[b, h, ni, ci, dk])?;
    let kc = pad(k)?.reshape(&[b, h, ni, ci, dk])?;
    let vc = pad(v)?.reshape(&[b, h, ni, ci, dv])?;

    // Intra-chunk decay mask D [1,H,1,C,C].
    let idx = arange_f32(c)?;
    let diff = idx.reshape(&[-1, 1])?.subtract(idx.reshape(&[1, -1])?)?; // i − j
    let causal = diff.ge(f32s(0.0)?)?;
    let d = ops::select(&causal, neg_slopes.multiply(&diff)?.exp()?, f32s(0.0)?)?
        .reshape(&[1, h, 1, ci, ci])?;
    let scores = qc.matmul(kc.swap_axes(3, 4)?)?.multiply(&d)?;
    let mut out = scores.matmul(&vc)?; // [B,H,n,C,dv]

    // Chunk summaries U_c [B,H,n,dk·dv] and the states entering each chunk.
    let w = neg_slopes.multiply(f32s((c - 1) as f32)?.subtract(&idx)?.reshape(&[1, 1, -1])?)?.exp()?; // [H,1,C]
    let kw = kc.multiply(w.reshape(&[1, h, 1, ci, 1])?)?;
    let u = kw.swap_axes(3, 4)?.matmul(&vc)?.reshape(&[b, h, ni, dk * dv])?;
    let ch = arange_f32(n)?;
    let cdiff = ch.reshape(&[-1, 1])?.subtract(ch.reshape(&[1, -1])?)?; // c − c'
    let before = cdiff.ge(f32s(1.0)?)?;
    let m = ops::select(
        &before,
        neg_slopes.multiply(cdiff.subtract(f32s(1.0)?)?.multiply(f32s(c as f32)?)?)?.exp()?,
        f32s(0.0)?,
    )?
    .reshape(&[1, h, ni, ni])?;
    let mut entering = m.matmul(&u)?; // [B,H,n,dk·dv]
    if let Some(s0) = state {
        let carry = neg_slopes.multiply(ch.multiply(f32s(c as f32)?)?.reshape(&[1, 1, -1])?)?.exp()?; // [H,1,n]
        let carried = carry.reshape(&[1, h, ni, 1])?.multiply(s0.reshape(&[b, h, 1, dk * dv])?)?;
        entering = entering.add(carried)?;
    }
    let entering = entering.reshape(&[b, h, ni, dk, dv])?;
    let inter_decay = neg_slopes.multiply(idx.add(f32s(1.0)?)?.reshape(&[1, 1, -1])?)?.exp()?; // [H,1,C]
    let inter = qc.matmul(&entering)?.multiply(inter_decay.reshape(&[1, h, 1, ci, 1])?)?;
    out = out.add(inter)?.reshape(&[b, h, padded as i32, dv])?;
    if padded != t {
        use mlx_rs::ops::indexing::TryIndexOp;
        out = out.try_index((.., .., 0..t as i32, ..))?;
    }

    // Final state over exactly T tokens: γ^T S_0 + Σ_t γ^{T−1−t} k_tᵀ v_t.
    let tpos = arange_f32(t)?;
    let wt = neg_slopes
        .multiply(f32s((t - 1) as f32)?.subtract(&tpos)?.reshape(&[1, 1, -1])?)?
        .exp()?
        .reshape(&[1, h, t as i32, 1])?;
    let mut new_state = k.multiply(&wt)?.swap_axes(2, 3)?.matmul(v)?;
    if let Some(s0) = state {
        new_state = new_state.add(s0.multiply(decay(slopes, t as f32)?)?)?;
    }
    Ok((out, new_state))
}

/// ALiBi slopes for `heads` heads (the power-of-two schedule, interleaved for other counts).
pub fn alibi_slopes(heads: usize) -> Vec<f32> {
    fn power_of_two(n: usize) -> Vec<f64> {
        let start = 2f64.powf(-(2f64.powf(-((n as f64).log2() - 3.0))));
        (0..n).map(|i| start.powi(i as i32 + 1)).collect()
    }
    let slopes = if heads.is_power_of_two() {
        power_of_two(heads)
    } else {
        let closest = 1usize << heads.ilog2();
        let mut s = power_of_two(closest);
        s.extend(power_of_two(2 * closest).into_iter().step_by(2).take(heads - closest));
        s
    };
    slopes.into_iter().map(|s| s as f32).collect()
}
