//! A lightning layer's decode step in two kernels (`cuda/lightning_decode.cu`,
//! `metal/lightning_decode.metal`): [`decode_step`] takes the stacked q/k/v projection row through
//! QK-norm, RoPE and the GLA recurrence, [`norm_gate`] applies the output norm and gate. In MLX
//! operations that is ≈ 15 operations per layer and token, and a decode step is bound by the
//! host's work per operation (eval/results/2026-11-22-h100-6453092). Elsewhere, and as the test
//! oracle, the same computation runs in MLX operations.

use super::custom::{apply, backend, shape_args, Backend, KernelSource, Launch, TemplateArg, MAX_SHAPE_ARGS};
use super::gla;
use super::rope::{self, QkHeads, RopeAngles};
use super::selfcheck::{self, sample, verify, KernelCheck, Verdict, CUDA_AND_METAL};
use mlx_rs::{error::Result, fast, ops, ops::indexing::TryIndexOp, Array, Dtype};

/// What a decode step of one lightning layer computes, beyond its inputs.
pub struct StepParams<'a> {
    pub heads: i32,
    pub head_dim: i32,
    /// QK-norm weights `[head_dim]` and ε, when the layer normalises q and k.
    pub qk_norm: Option<(&'a Array, &'a Array, f32)>,
    /// RoPE base θ, when the layer rotates q and k.
    pub rope_theta: Option<f32>,
    /// Per-head decay rates `[H]` (γ_h = exp(−slope_h)).
    pub slopes: &'a Array,
    /// Multiplier on q inside GLA.
    pub scale: f32,
}

/// The outputs of [`decode_step`].
pub struct StepOutput {
    /// `[B, 1, H·d]` in the model's dtype.
    pub o: Array,
    /// The new float32 states `[B, H, d, d]`.
    pub state: Array,
    /// The rotated keys and the values `[B, H, 1, d]` (when asked for: a rollback refolds them).
    pub kv: Option<(Array, Array)>,
}

/// One token of B sequences: `qkv` `[B, 1, W]` holds q, k and v (`H·d` columns each, in that order,
/// from column 0; more columns may follow), `positions` is one shared position or one per
/// sequence, `state` the float32 states `[B, H, d, d]`.
pub fn decode_step(p: &StepParams, qkv: &Array, positions: &[usize], state: &Array, keep_kv: bool) -> Result<StepOutput> {
    if !decode_kernel_fits(p, qkv, positions.len(), state) {
        return decode_step_mlx(p, qkv, &positions_array(positions), state, keep_kv);
    }
    decode_step_kernel(p, qkv, StepPositions::Host(positions), state, keep_kv)
}

/// [`decode_step`] with the positions held by the device (`[B]` int32, or `[1]` for all): a
/// fixed decode step's (`engine::fixed_step`).
pub fn decode_step_at(p: &StepParams, qkv: &Array, positions: &Array, state: &Array, keep_kv: bool) -> Result<StepOutput> {
    if !decode_kernel_fits(p, qkv, positions.size(), state) {
        return decode_step_mlx(p, qkv, positions, state, keep_kv);
    }
    decode_step_kernel(p, qkv, StepPositions::Device(positions), state, keep_kv)
}

/// Whether [`decode_step`]'s kernel takes this step (`n` positions).
fn decode_kernel_fits(p: &StepParams, qkv: &Array, n: usize, state: &Array) -> bool {
    let (b, d, dtype) = (qkv.shape()[0], p.head_dim, qkv.dtype());
    backend() != Backend::Cpu
        && qkv.shape()[1] == 1
        && p.qk_norm.is_some_and(|(q, k, _)| q.dtype() == dtype && k.dtype() == dtype)
        && p.slopes.dtype() == Dtype::Float32
        && state.dtype() == Dtype::Float32
        && (2..=1024).contains(&d)
        && d % 2 == 0
        && (n == 1 || n == b as usize)
        && p.rope_theta.is_some()
        && selfcheck::enabled(&DECODE_STEP_CHECK)
}

/// Where a decode step's positions are.
enum StepPositions<'a> {
    Host(&'a [usize]),
    Device(&'a Array),
}

/// [`decode_step`]'s kernel, for a layer with QK-norm (weights in qkv's dtype) and RoPE.
fn decode_step_kernel(p: &StepParams, qkv: &Array, positions: StepPositions, state: &Array, keep_kv: bool) -> Result<StepOutput> {
    let (Some((q_norm, k_norm, eps)), Some(theta)) = (p.qk_norm, p.rope_theta) else {
        return Err(mlx_rs::error::Exception::custom("the lightning decode kernel needs QK-norm and RoPE"));
    };
    let b = qkv.shape()[0];
    let d = p.head_dim;
    let dtype = qkv.dtype();
    // Up to MAX_SHAPE_ARGS positions from the host travel as a shape (nothing for the GPU to
    // fetch); more as an array the host writes; the device's as they are.
    let (positions, in_shape, per_seq) = match positions {
        StepPositions::Host(host) if host.len() <= MAX_SHAPE_ARGS => (shape_args(host)?, true, host.len() > 1),
        StepPositions::Host(host) => (positions_array(host), false, true),
        StepPositions::Device(device) => (device.clone(), false, device.size() > 1),
    };
    let h = p.heads;
    let mut outputs = vec![(vec![b, 1, h * d], dtype), (vec![b, h, d, d], Dtype::Float32)];
    if keep_kv {
        outputs.extend([(vec![b, h, 1, d], dtype), (vec![b, h, 1, d], dtype)]);
    }
    let bits = |x: f32| TemplateArg::Int(x.to_bits() as i32);
    // CUDA spreads a head's state over d / 32 thread blocks of 32 columns, whose 4·d threads split
    // the rows: fewer threads leave the step latency-bound (cuda/lightning_decode.cu;
    // eval/results/kernel-notes.md).
    let (column_blocks, threads) = if backend() == Backend::Cuda && d % 32 == 0 { (d / 32, (4 * d).min(1024)) } else { (1, d) };
    let out = apply(
        if keep_kv { &STEP_KEEP_KV } else { &STEP },
        &[qkv, q_norm, k_norm, &positions, p.slopes, state],
        Launch {
            grid: (threads * column_blocks, b * h, 1),
            threads: (threads, 1, 1),
            outputs,
            template: vec![
                ("T", TemplateArg::Type(dtype)),
                ("H", TemplateArg::Int(h)),
                ("D", TemplateArg::Int(d)),
                ("SCALE_BITS", bits(p.scale)),
                ("EPS_BITS", bits(eps)),
                // As MLX's RoPE: inv_freq = 2^(−(i/(d/2))·log₂θ), log₂θ computed on the host.
                ("LOG2_THETA_BITS", bits((theta as f64).log2() as f32)),
                ("PER_SEQ", TemplateArg::Bool(per_seq)),
                ("POS_IN_SHAPE", TemplateArg::Bool(in_shape)),
            ],
            init: None,
        },
    )?;
    let mut out = out.into_iter();
    let (o, state) = (out.next().expect("outputs"), out.next().expect("outputs"));
    let kv = if keep_kv { Some((out.next().expect("outputs"), out.next().expect("outputs"))) } else { None };
    Ok(StepOutput { o, state, kv })
}

/// The decode step's kernel (and the form keeping the rotated keys and values) against
/// [`decode_step_mlx`], in bfloat16, for two sequences at their own positions, given by the
/// host and by the device.
pub static DECODE_STEP_CHECK: KernelCheck = KernelCheck { name: "lightning_decode", backends: CUDA_AND_METAL, run: check_decode_step };

fn check_decode_step() -> Verdict {
    let (b, h, d) = (2, 2, 32);
    let positions = [5, 70];
    for keep_kv in [false, true] {
        verify(
            || {
                let bf16 = Dtype::Bfloat16;
                let norm = |seed| sample(&[d], seed, bf16)?.multiply(Array::from_f32(0.5))?.add(Array::from_f32(1.0))?.as_dtype(bf16);
                // q, k, v and a gate's columns after them, as the stacked projection gives them.
                let qkv = sample(&[b, 1, 3 * h * d + 16], 11, bf16)?;
                Ok((qkv, norm(12)?, norm(13)?, Array::from_slice(&gla::alibi_slopes(h as usize), &[h]), sample(&[b, h, d, d], 14, Dtype::Float32)?))
            },
            |(qkv, q_norm, k_norm, slopes, state)| {
                let p = check_params(h, d, q_norm, k_norm, slopes);
                let mut out = outputs(decode_step_kernel(&p, qkv, StepPositions::Host(&positions), state, keep_kv)?)?;
                out.extend(outputs(decode_step_kernel(&p, qkv, StepPositions::Device(&positions_array(&positions)), state, keep_kv)?)?);
                Ok(out)
            },
            |(qkv, q_norm, k_norm, slopes, state)| {
                let p = check_params(h, d, q_norm, k_norm, slopes);
                let once = outputs(decode_step_mlx(&p, qkv, &positions_array(&positions), state, keep_kv)?)?;
                Ok(once.iter().chain(&once).cloned().collect())
            },
        )
        .map_err(|e| if keep_kv { format!("keeping the keys and values: {e}") } else { e })?;
    }
    Ok(())
}

fn check_params<'a>(h: i32, d: i32, q_norm: &'a Array, k_norm: &'a Array, slopes: &'a Array) -> StepParams<'a> {
    StepParams { heads: h, head_dim: d, qk_norm: Some((q_norm, k_norm, 1e-6)), rope_theta: Some(10000.0), slopes, scale: (d as f32).powf(-0.5) }
}

fn outputs(step: StepOutput) -> Result<Vec<Array>> {
    let mut out = vec![step.o, step.state];
    out.extend(step.kv.into_iter().flat_map(|(k, v)| [k, v]));
    Ok(out)
}

/// Positions as an int32 array: a scalar for one, `[B]` for several.
pub fn positions_array(positions: &[usize]) -> Array {
    match positions {
        [one] => Array::from_int(*one as i32),
        _ => Array::from_slice(&positions.iter().map(|&p| p as i32).collect::<Vec<_>>(), &[positions.len() as i32]),
    }
}

/// The MLX-ops version of [`decode_step`] (`positions` as [`positions_array`] makes them): no
/// kernel, as it is the check's oracle (and the GLA kernel's variant it would launch was not
/// compiled ahead with the checks).
pub fn decode_step_mlx(p: &StepParams, qkv: &Array, positions: &Array, state: &Array, keep_kv: bool) -> Result<StepOutput> {
    let b = qkv.shape()[0];
    let (q, k, v) = split_heads(p, qkv)?;
    let (q, k) = rotate(p, &q, &k, positions)?;
    let (o, state) = gla::simple_gla_step_mlx(&q, &k, &v, p.slopes, Some(state), p.scale)?;
    // One token's [B, H, 1, d] is already the memory layout of [B, 1, H·d].
    Ok(StepOutput { o: o.reshape(&[b, 1, p.heads * p.head_dim])?, state, kv: keep_kv.then_some((k, v)) })
}

/// q, k and v `[B, H, T, d]` from the stacked projection `qkv` `[B, T, W]` (q and k through the
/// QK-norm when the layer has one), in MLX operations: the first step of [`decode_step_mlx`].
pub fn split_heads(p: &StepParams, qkv: &Array) -> Result<(Array, Array, Array)> {
    let (b, t) = (qkv.shape()[0], qkv.shape()[1]);
    let (h, d) = (p.heads, p.head_dim);
    let part = |i: i32, norm: Option<&Array>| -> Result<Array> {
        let mut y = qkv.try_index((.., .., i * h * d..(i + 1) * h * d))?.reshape(&[b, t, h, d])?;
        if let (Some(weight), Some((_, _, eps))) = (norm, p.qk_norm) {
            y = fast::rms_norm(&y, Some(weight), eps)?;
        }
        y.swap_axes(1, 2)
    };
    Ok((part(0, p.qk_norm.map(|n| n.0))?, part(1, p.qk_norm.map(|n| n.1))?, part(2, None)?))
}

/// A lightning layer's q, k and v `[B, H, T, d]` for a prompt chunk from its stacked projection
/// `qkv` `[B, T, W]`: q and k through the QK-norm and RoPE when the layer has them, token t of
/// sequence b at `offsets[b] + t` (a scalar or `[1]` for all). One kernel on CUDA
/// ([`rope::prompt_heads`]).
pub fn prompt_heads(p: &StepParams, qkv: &Array, offsets: &Array) -> Result<[Array; 3]> {
    let heads = QkHeads { heads: p.heads, kv_heads: p.heads, head_dim: p.head_dim, norms: p.qk_norm };
    let angles = p.rope_theta.map(|theta| RopeAngles { dims: p.head_dim, base: theta, periods: None, position_scale: 1.0, mscale: 1.0 });
    rope::prompt_heads(qkv, heads, angles.as_ref(), offsets)
}

/// q and k `[B, H, T, d]` with RoPE from the positions in `offset` (a scalar, or one per
/// sequence) when the layer rotates them.
pub fn rotate(p: &StepParams, q: &Array, k: &Array, offset: &Array) -> Result<(Array, Array)> {
    let Some(theta) = p.rope_theta else { return Ok((q.clone(), k.clone())) };
    let rope = |x: &Array| fast::rope_dynamic(x, p.head_dim, false, theta, 1.0, offset, None);
    Ok((rope(q)?, rope(k)?))
}

/// RMSNorm(o) · w ⊙ σ(z) per row: `o` `[B, T, D]`, z the columns `z_offset..z_offset + D` of
/// `gate_src` `[B, T, W]` (the stacked projection it came out of).
pub fn norm_gate(o: &Array, gate_src: &Array, z_offset: i32, weight: &Array, eps: f32) -> Result<Array> {
    let fits = backend() != Backend::Cpu
        && gate_src.dtype() == o.dtype()
        && weight.dtype() == o.dtype()
        && selfcheck::enabled(&NORM_GATE_CHECK);
    if !fits {
        return norm_gate_mlx(o, gate_src, z_offset, weight, eps);
    }
    norm_gate_kernel(o, gate_src, z_offset, weight, eps)
}

/// [`norm_gate`]'s kernel.
fn norm_gate_kernel(o: &Array, gate_src: &Array, z_offset: i32, weight: &Array, eps: f32) -> Result<Array> {
    let (b, t, dim) = (o.shape()[0], o.shape()[1], o.shape()[2]);
    // One thread block per row: as many threads as a block takes, so each loads few elements
    // (with fewer it was one of the layer's largest kernels: eval/results/kernel-notes.md).
    const THREADS: i32 = 1024;
    let out = apply(
        &NORM_GATE,
        &[o, gate_src, weight],
        Launch {
            grid: (THREADS, b * t, 1),
            threads: (THREADS, 1, 1),
            outputs: vec![(vec![b, t, dim], o.dtype())],
            template: vec![
                ("T", TemplateArg::Type(o.dtype())),
                ("D", TemplateArg::Int(dim)),
                ("Z_OFF", TemplateArg::Int(z_offset)),
                ("EPS_BITS", TemplateArg::Int(eps.to_bits() as i32)),
                ("NT", TemplateArg::Int(THREADS)),
            ],
            init: None,
        },
    )?;
    Ok(out.into_iter().next().expect("one output"))
}

/// The norm-gate kernel against [`norm_gate_mlx`] in bfloat16, z inside wider rows.
pub static NORM_GATE_CHECK: KernelCheck = KernelCheck { name: "norm_gate", backends: CUDA_AND_METAL, run: check_norm_gate };

fn check_norm_gate() -> Verdict {
    let (b, t, dim, z_offset) = (2, 3, 256, 40);
    let bf16 = Dtype::Bfloat16;
    verify(
        || {
            // Far from unit RMS and a weight far from 1, so that a norm left out shows.
            let o = sample(&[b, t, dim], 21, Dtype::Float32)?.multiply(Array::from_f32(5.0))?.as_dtype(bf16)?;
            let weight = sample(&[dim], 23, Dtype::Float32)?.multiply(Array::from_f32(0.5))?.add(Array::from_f32(1.0))?.as_dtype(bf16)?;
            Ok((o, sample(&[b, t, z_offset + dim + 8], 22, bf16)?, weight))
        },
        |(o, src, weight)| Ok(vec![norm_gate_kernel(o, src, z_offset, weight, 1e-6)?]),
        |(o, src, weight)| Ok(vec![norm_gate_mlx(o, src, z_offset, weight, 1e-6)?]),
    )
}

/// The MLX-ops version of [`norm_gate`].
pub fn norm_gate_mlx(o: &Array, gate_src: &Array, z_offset: i32, weight: &Array, eps: f32) -> Result<Array> {
    let dim = o.shape()[2];
    let z = gate_src.try_index((.., .., z_offset..z_offset + dim))?;
    fast::rms_norm(o, Some(weight), eps)?.multiply(ops::sigmoid(&z)?)
}

const LIGHTNING_HEADER: &str = concat!(include_str!("../../cuda/round.cu"), include_str!("../../cuda/lightning_decode.cu"));

const fn source(name: &'static str, outputs: &'static [&'static str], cuda_body: &'static str, metal_body: &'static str) -> KernelSource {
    KernelSource {
        name,
        inputs: &["qkv", "q_norm", "k_norm", "positions", "slopes", "state"],
        outputs,
        cuda_header: LIGHTNING_HEADER,
        cuda_body,
        metal_header: include_str!("../../metal/lightning_decode.metal"),
        metal_body,
        // `positions` may be a shape_args broadcast; qkv and state are read through their strides,
        // the norms and slopes are whole weights.
        contiguous_inputs: false,
        shared_memory: 0,
    }
}

static STEP: KernelSource = source(
    "sala_lightning_step",
    &["out", "next_state"],
    "sala_lightning_step<T, H, D, SCALE_BITS, EPS_BITS, LOG2_THETA_BITS, PER_SEQ, POS_IN_SHAPE>(qkv, qkv_strides, \
     q_norm, k_norm, positions, positions_shape, slopes, state, state_strides, out, next_state, (T*)nullptr, (T*)nullptr);",
    "threadgroup float qs[D]; threadgroup float ks[D]; \
     sala_lightning_step<T, H, D, SCALE_BITS, EPS_BITS, LOG2_THETA_BITS, PER_SEQ, POS_IN_SHAPE>(qkv, qkv_strides, \
     q_norm, k_norm, positions, positions_shape, slopes, state, state_strides, out, next_state, (device T*)nullptr, \
     (device T*)nullptr, qs, ks, thread_position_in_threadgroup.x, threadgroup_position_in_grid.y);",
);

static STEP_KEEP_KV: KernelSource = source(
    "sala_lightning_step_kv",
    &["out", "next_state", "k_out", "v_out"],
    "sala_lightning_step<T, H, D, SCALE_BITS, EPS_BITS, LOG2_THETA_BITS, PER_SEQ, POS_IN_SHAPE>(qkv, qkv_strides, \
     q_norm, k_norm, positions, positions_shape, slopes, state, state_strides, out, next_state, k_out, v_out);",
    "threadgroup float qs[D]; threadgroup float ks[D]; \
     sala_lightning_step<T, H, D, SCALE_BITS, EPS_BITS, LOG2_THETA_BITS, PER_SEQ, POS_IN_SHAPE>(qkv, qkv_strides, \
     q_norm, k_norm, positions, positions_shape, slopes, state, state_strides, out, next_state, k_out, v_out, qs, ks, \
     thread_position_in_threadgroup.x, threadgroup_position_in_grid.y);",
);

static NORM_GATE: KernelSource = KernelSource {
    name: "sala_norm_gate",
    inputs: &["o", "gate_src", "weight"],
    outputs: &["out"],
    cuda_header: LIGHTNING_HEADER,
    cuda_body: "sala_norm_gate<T, D, Z_OFF, EPS_BITS, NT>(o, gate_src, gate_src_shape[2], weight, out);",
    metal_header: include_str!("../../metal/lightning_decode.metal"),
    metal_body: "threadgroup float partial[NT / 32]; \
                 sala_norm_gate<T, D, Z_OFF, EPS_BITS, NT>(o, gate_src, int(gate_src_shape[2]), weight, out, partial, \
                 thread_position_in_threadgroup.x, threadgroup_position_in_grid.y, thread_index_in_simdgroup, \
                 simdgroup_index_in_threadgroup);",
    contiguous_inputs: true,
    shared_memory: 0,
};
