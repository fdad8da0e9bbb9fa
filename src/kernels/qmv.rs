//! Quantized matrix-vector product for decode: x `[…, K]` (a few rows) times an MLX-quantized
//! `[N, K]` matrix, transposed, optionally finishing with the SwiGLU or residual step that follows
//! it. On CUDA, bf16/f16 inputs of 2 to [`MAX_MMA_ROWS`] rows go through the tensor cores
//! (`cuda/qmv_mma.cu`), whose time hardly grows with the rows (a decode batch); other GPU cases of
//! up to [`MAX_ROWS`] rows take the general kernel (`cuda/qmv.cu`, `metal/qmv.metal`), which
//! streams each packed row once at full memory width (on CUDA it has a tensor-core form for 4-bit
//! products in 16-bit types, [`MMA_ROWS_PER_WARP`]); elsewhere MLX's quantized matmul and MLX
//! operations run.

use super::custom::{apply, backend, pow2_floor, with_setting, Backend, KernelSource, Launch, TemplateArg};
use super::selfcheck::{self, sample, verify, KernelCheck, Verdict, CUDA_AND_METAL, CUDA_ONLY};
use crate::engine::ops::scalar;
use mlx_rs::{error::Result, ops, Array, Dtype};

/// Input rows up to which the kernel is used: it beats MLX's quantized matmul up to here, and
/// from 8 rows MLX's matrix kernel is faster (eval/results/kernel-notes.md).
pub const MAX_ROWS: i32 = 4;
/// Warps per thread block.
const WARPS: i32 = 8;
/// Weight rows per warp by default (each chunk of x is loaded once for all of them; a SwiGLU warp
/// takes at least one gate row and its up row): the fastest in 9B decode
/// (eval/results/kernel-notes.md). On CUDA, `general_tiling` departs from it per matrix.
fn rows_per_warp(bits: i32) -> i32 {
    if bits == 4 {
        2
    } else {
        1
    }
}

/// What follows the product, fused into the kernel's store (a decode step is bound by the host's
/// work per operation, so each operation folded in saves a few microseconds per layer).
#[derive(Clone, Copy)]
pub enum Epilogue<'a> {
    /// y = x · Wᵀ.
    Plain,
    /// W is a stacked `[gate; up]` matrix of 2F rows: y = silu(x · W_gateᵀ) ⊙ (x · W_upᵀ), `[…, F]`.
    SwiGlu,
    /// y = residual + alpha · (x · Wᵀ), alpha rounded to x's dtype (the kernels take it as a
    /// compile-time constant).
    Residual { residual: &'a Array, alpha: f32 },
}

/// The general kernel's CUDA source with the 16-byte unpacking it reads x with, the cp.async
/// helpers of mma.cu and the epilogues' rounding of round.cu.
const QMV_HEADER: &str = concat!(
    include_str!("../../cuda/round.cu"),
    include_str!("../../cuda/mma.cu"),
    include_str!("../../cuda/unpack.cu"),
    include_str!("../../cuda/qmv_rows_mma.cu"),
    include_str!("../../cuda/qmv.cu")
);

const fn qmv_source(
    name: &'static str,
    inputs: &'static [&'static str],
    cuda_body: &'static str,
    metal_body: &'static str,
) -> KernelSource {
    KernelSource {
        name,
        inputs,
        outputs: &["y"],
        cuda_header: QMV_HEADER,
        cuda_body,
        metal_header: include_str!("../../metal/qmv.metal"),
        metal_body,
        contiguous_inputs: true,
        shared_memory: 0,
    }
}

static QMV: KernelSource = qmv_source(
    "sala_qmv",
    &["x", "w", "scales", "biases"],
    "sala_qmv<T, BITS, GROUP, ROWS, WARPS, NR, SPLIT, U, ASYNC, PAIRS>(x, w, scales, biases, y, w_shape[0], w_shape[1] * 32 / BITS);",
    "sala_qmv<T, BITS, GROUP, ROWS, NR>(x, w, scales, biases, y, int(w_shape[0]), int(w_shape[1]) * 32 / BITS, \
     thread_index_in_simdgroup, threadgroup_position_in_grid.x * WARPS + simdgroup_index_in_threadgroup);",
);

static QMV_SWIGLU: KernelSource = qmv_source(
    "sala_qmv_swiglu",
    &["x", "w", "scales", "biases"],
    "sala_qmv_swiglu<T, BITS, GROUP, ROWS, WARPS, NR, SPLIT, U, ASYNC, PAIRS>(x, w, scales, biases, y, w_shape[0] / 2, w_shape[1] * 32 / BITS);",
    "sala_qmv_swiglu<T, BITS, GROUP, ROWS, NR>(x, w, scales, biases, y, int(w_shape[0]) / 2, int(w_shape[1]) * 32 / BITS, \
     thread_index_in_simdgroup, threadgroup_position_in_grid.x * WARPS + simdgroup_index_in_threadgroup);",
);

static QMV_RESIDUAL: KernelSource = qmv_source(
    "sala_qmv_residual",
    &["x", "w", "scales", "biases", "residual"],
    "sala_qmv_residual<T, BITS, GROUP, ROWS, WARPS, NR, SPLIT, U, ASYNC, PAIRS, ALPHA_BITS>(x, w, scales, biases, residual, y, w_shape[0], \
     w_shape[1] * 32 / BITS);",
    "sala_qmv_residual<T, BITS, GROUP, ROWS, NR, ALPHA_BITS>(x, w, scales, biases, residual, y, int(w_shape[0]), \
     int(w_shape[1]) * 32 / BITS, thread_index_in_simdgroup, \
     threadgroup_position_in_grid.x * WARPS + simdgroup_index_in_threadgroup);",
);

/// The general kernel with an RMSNorm of x folded in (CUDA; elsewhere the norm runs first).
const fn qmv_normed_source(name: &'static str, cuda_body: &'static str) -> KernelSource {
    KernelSource {
        name,
        inputs: &["x", "norm", "w", "scales", "biases"],
        outputs: &["y"],
        cuda_header: QMV_HEADER,
        cuda_body,
        metal_header: "",
        metal_body: "",
        contiguous_inputs: true,
        shared_memory: 0,
    }
}

static QMV_NORMED: KernelSource = qmv_normed_source(
    "sala_qmv_normed",
    "sala_qmv_normed<T, BITS, GROUP, ROWS, WARPS, NR, SPLIT, U, ASYNC, PAIRS, K, EPS_BITS>(x, norm, w, scales, biases, y, w_shape[0]);",
);

static QMV_SWIGLU_NORMED: KernelSource = qmv_normed_source(
    "sala_qmv_swiglu_normed",
    "sala_qmv_swiglu_normed<T, BITS, GROUP, ROWS, WARPS, NR, SPLIT, U, ASYNC, PAIRS, K, EPS_BITS>(x, norm, w, scales, biases, y, w_shape[0] / 2);",
);

static QMV_RESIDUAL_NORM_GATED: KernelSource = KernelSource {
    name: "sala_qmv_residual_norm_gated",
    inputs: &["x", "norm", "gate_src", "w", "scales", "biases", "residual"],
    outputs: &["y"],
    cuda_header: QMV_HEADER,
    cuda_body: "sala_qmv_residual_norm_gated<T, BITS, GROUP, ROWS, WARPS, NR, SPLIT, U, ASYNC, PAIRS, ALPHA_BITS, K, EPS_BITS, Z_OFF>(x, \
                norm, gate_src, gate_src_shape[gate_src_ndim - 1], w, scales, biases, residual, y, w_shape[0]);",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: true,
    shared_memory: 0,
};

/// An RMSNorm applied to a product's input `[…, K]`: weight `[K]`, epsilon, and optionally a
/// σ-gate after it.
#[derive(Clone, Copy)]
pub struct RmsNormIn<'a> {
    pub weight: &'a Array,
    pub eps: f32,
    pub gate: Option<GateIn<'a>>,
}

/// The gate of a normalised input `[B, T, K]`: RMSNorm(x) ⊙ σ(z), z the columns `offset..offset + K`
/// of `src` `[B, T, W]` (the stacked projection z came out of).
#[derive(Clone, Copy)]
pub struct GateIn<'a> {
    pub src: &'a Array,
    pub offset: i32,
}

impl RmsNormIn<'_> {
    /// The normalised (and gated) input, by MLX's RMSNorm or the lightning layer's norm-gate kernel.
    pub fn apply(&self, x: &Array) -> Result<Array> {
        match self.gate {
            None => mlx_rs::fast::rms_norm(x, Some(self.weight), self.eps),
            Some(g) => super::lightning::norm_gate(x, g.src, g.offset, self.weight, self.eps),
        }
    }

    /// Whether the general kernel can read the gate as it is: z rows in x's dtype beside x's rows,
    /// whole 16-byte pieces.
    fn gate_fits(&self, x: &Array) -> bool {
        let Some(g) = self.gate else { return true };
        let (k, lead) = (x.shape()[x.ndim() - 1], &x.shape()[..x.ndim() - 1]);
        let w = g.src.shape()[g.src.ndim() - 1];
        g.src.dtype() == x.dtype()
            && &g.src.shape()[..g.src.ndim() - 1] == lead
            && g.offset >= 0
            && g.offset + k <= w
            && g.offset % 8 == 0
            && w % 8 == 0
    }
}

/// A CUDA thread block's static shared memory (the custom kernels declare theirs statically).
const STATIC_SHARED_BYTES: usize = 48 * 1024;

/// Bytes of normalised input rows a thread block stages in shared memory (`cuda/qmv.cu`): the 9B's
/// hidden size (4096) in bf16 for the general kernel's 4 rows.
const NORMED_STAGE_BYTES: usize = 32 * 1024;

/// [`quantized_matmul_t_then`] of `RMSNorm(x)` (gated or not): one kernel where the general kernel
/// takes the product on CUDA (without a gate plain or SwiGLU, with one the residual form of
/// o_proj), else the norm first. (Folded into the tensor-core kernel of a decode batch, the norm
/// slowed its products by more than the norm kernels it saved: eval/results/kernel-notes.md.)
#[allow(clippy::too_many_arguments)]
pub fn quantized_matmul_t_normed(
    x: &Array,
    norm: RmsNormIn,
    packed: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
    epilogue: Epilogue,
) -> Result<Array> {
    let k = x.shape()[x.ndim() - 1];
    let rows: i32 = x.shape()[..x.ndim() - 1].iter().product();
    let n = packed.shape()[0];
    let epilogue_fits = match (epilogue, norm.gate) {
        (Epilogue::Plain, None) => true,
        (Epilogue::SwiGlu, None) => n % 2 == 0,
        (Epilogue::Residual { residual, .. }, Some(_)) => residual.shape() == output_shape(x, n, epilogue) && residual.dtype() == x.dtype(),
        _ => false,
    };
    let fused = backend() == Backend::Cuda
        && epilogue_fits
        && norm.gate_fits(x)
        && !mma_fits(x, scales, biases, group_size, bits)
        && fits(x, scales, biases, group_size, bits)
        && norm.weight.shape() == [k]
        && norm.weight.dtype() == x.dtype()
        && rows as usize * k as usize * x.item_size() <= NORMED_STAGE_BYTES
        && selfcheck::enabled(&QMV_NORMED_CHECK);
    if !fused {
        return quantized_matmul_t_then(&norm.apply(x)?, packed, scales, biases, group_size, bits, epilogue);
    }
    quantized_matmul_t_general(x, packed, scales, biases, group_size, bits, epilogue, output_shape(x, n, epilogue), Some(norm))
}

/// Input rows up to which the tensor-core kernel runs: four 16-row mma tiles, a busy server's
/// decode batch (MLX's quantized matmul is slower there: eval/results/kernel-notes.md).
pub const MAX_MMA_ROWS: i32 = 64;
/// Input rows from which it does: for one row the general kernel is faster, for a batch of 8 the
/// tensor cores (eval/results/kernel-notes.md).
const MIN_MMA_ROWS: i32 = 2;

const QMM_HEADER: &str = concat!(
    include_str!("../../cuda/round.cu"),
    include_str!("../../cuda/mma.cu"),
    include_str!("../../cuda/unpack.cu"),
    include_str!("../../cuda/qmv_rows_mma.cu"),
    include_str!("../../cuda/qmv.cu"),
    include_str!("../../cuda/qmv_mma.cu")
);

const fn qmm_source(name: &'static str, inputs: &'static [&'static str], cuda_body: &'static str) -> KernelSource {
    // CUDA only (mma.sync); Metal takes the general kernel.
    KernelSource { name, inputs, outputs: &["y"], cuda_header: QMM_HEADER, cuda_body, metal_header: "", metal_body: "", contiguous_inputs: true, shared_memory: 0 }
}

static QMM: KernelSource = qmm_source(
    "sala_qmm",
    &["x", "w", "scales", "biases"],
    "int rows = 1; for (int i = 0; i + 1 < x_ndim; ++i) rows *= x_shape[i]; \
     sala_qmm<T, BITS, GROUP, HALVES, WARPS, NT, U, ASYNC, 0, 0>(x, w, scales, biases, nullptr, y, rows, w_shape[0], \
     w_shape[1] * 32 / BITS);",
);

static QMM_SWIGLU: KernelSource = qmm_source(
    "sala_qmm_swiglu",
    &["x", "w", "scales", "biases"],
    "int rows = 1; for (int i = 0; i + 1 < x_ndim; ++i) rows *= x_shape[i]; \
     sala_qmm<T, BITS, GROUP, HALVES, WARPS, NT, U, ASYNC, 2, 0>(x, w, scales, biases, nullptr, y, rows, w_shape[0], \
     w_shape[1] * 32 / BITS);",
);

static QMM_RESIDUAL: KernelSource = qmm_source(
    "sala_qmm_residual",
    &["x", "w", "scales", "biases", "residual"],
    "int rows = 1; for (int i = 0; i + 1 < x_ndim; ++i) rows *= x_shape[i]; \
     sala_qmm<T, BITS, GROUP, HALVES, WARPS, NT, U, ASYNC, 1, ALPHA_BITS>(x, w, scales, biases, residual, y, rows, w_shape[0], \
     w_shape[1] * 32 / BITS);",
);

/// How the tensor-core kernel divides a product (`cuda/qmv_mma.cu`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MmaTiling {
    /// Tiles of 8 outputs per thread block (SwiGLU: gate tiles, each with its up tile).
    pub out_tiles: i32,
    /// 64-byte steps of loads a warp has in flight.
    pub in_flight: i32,
    /// Warps the grid should hold: K is split over a block's warps (at most 8) to reach it.
    pub grid_warps: i32,
    /// The weights through a cp.async ring of `in_flight` steps per warp (`in_flight - 1` always
    /// in flight) rather than register loads.
    pub async_copy: bool,
}

impl MmaTiling {
    /// Static shared memory of a block of `warps` warps over `nt` tiles of weights and
    /// `input_tiles` of input rows: the warps' partial sums, and the ring when `async_copy`.
    fn shared_bytes(&self, warps: i32, nt: i32, input_tiles: i32) -> usize {
        let lanes = (warps * nt) as usize * 32;
        let partial = if warps > 1 { lanes * input_tiles as usize * 4 * 4 } else { 0 };
        let ring = if self.async_copy { lanes * self.in_flight as usize * 16 } else { 0 };
        partial + ring
    }
}

/// The tensor-core kernel's default tiling (SwiGLU: a gate tile and its up tile per block), each
/// field the fastest in a sweep at 8 rows on the 9B's shapes (eval/results/kernel-notes.md).
const MMA_TILING: MmaTiling = MmaTiling { out_tiles: 1, in_flight: 2, grid_warps: 8192, async_copy: false };

/// The tensor-core kernel's tiling for a product of `n` weight rows of `k` values and `rows` input
/// rows: at 8 bits, the fastest per product in sweeps at 8 and at 16 rows
/// (eval/results/kernel-notes.md); 4 bits was not swept and takes the default.
fn mma_tiling(n: i32, k: i32, bits: i32, swiglu: bool, rows: i32) -> MmaTiling {
    // Past 8 rows each step loads twice the input (both halves of the mma tile).
    let wide = rows > 8;
    match (bits, swiglu) {
        // Past one tile of input rows each weight tile costs a product per input tile: one
        // weight tile a block keeps the accumulators in registers (not swept: kernel-notes.md).
        _ if rows > 16 => MmaTiling { in_flight: 2, ..MMA_TILING },
        (8, true) if wide => MmaTiling { in_flight: 1, ..MMA_TILING },
        // The MLP's down product (K = 16384) through the cp.async ring, the fastest in the 16-row
        // sweep (eval/results/kernel-notes.md); o_proj (K = 4096) was not swept so.
        (8, false) if wide && n <= 4096 && k >= 16384 => MmaTiling { out_tiles: 2, in_flight: 3, grid_warps: 8192, async_copy: true },
        (8, false) if wide && n <= 4096 => MmaTiling { out_tiles: 2, ..MMA_TILING },
        (8, false) if wide && n <= 16384 => MmaTiling { out_tiles: 4, ..MMA_TILING },
        (8, false) if n <= 16384 => MmaTiling { in_flight: 1, ..MMA_TILING },
        (8, false) => MmaTiling { out_tiles: 4, in_flight: 1, grid_warps: 16384, async_copy: false },
        _ => MMA_TILING,
    }
}

/// Whether the tensor-core kernel runs this product.
fn mma_fits(x: &Array, scales: &Array, biases: &Array, group_size: i32, bits: i32) -> bool {
    let k = x.shape()[x.ndim() - 1];
    let rows: i32 = x.shape()[..x.ndim() - 1].iter().product();
    backend() == Backend::Cuda
        && matches!(x.dtype(), Dtype::Bfloat16 | Dtype::Float16)
        && matches!(bits, 4 | 8)
        && matches!(group_size, 32 | 64 | 128)
        && (MIN_MMA_ROWS..=MAX_MMA_ROWS).contains(&rows)
        && scales.dtype() == x.dtype()
        && biases.dtype() == x.dtype()
        && k % 128 == 0
        && selfcheck::enabled(&QMM_CHECK)
}

/// Whether the general kernel runs this product on the current backend.
fn fits(x: &Array, scales: &Array, biases: &Array, group_size: i32, bits: i32) -> bool {
    let k = x.shape()[x.ndim() - 1];
    let rows: i32 = x.shape()[..x.ndim() - 1].iter().product();
    backend() != Backend::Cpu
        && matches!(bits, 4 | 8)
        && matches!(group_size, 32 | 64 | 128)
        && rows <= MAX_ROWS
        && scales.dtype() == x.dtype()
        && biases.dtype() == x.dtype()
        && k % 128 == 0
        && selfcheck::enabled(&QMV_CHECK)
}

/// x · Wᵀ for W given as MLX's (packed, scales, biases) with `group_size` and `bits`.
pub fn quantized_matmul_t(
    x: &Array,
    packed: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    quantized_matmul_t_then(x, packed, scales, biases, group_size, bits, Epilogue::Plain)
}

/// [`quantized_matmul_t`] followed by `epilogue`: one kernel where one fits (the tensor-core
/// kernel, else the general one), MLX's quantized matmul and [`epilogue_mlx`] otherwise.
pub fn quantized_matmul_t_then(
    x: &Array,
    packed: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
    epilogue: Epilogue,
) -> Result<Array> {
    let n = packed.shape()[0];
    let shape = output_shape(x, n, epilogue);
    let residual_fits = match epilogue {
        Epilogue::Residual { residual, .. } => residual.shape() == shape && residual.dtype() == x.dtype(),
        _ => true,
    };
    let swiglu = matches!(epilogue, Epilogue::SwiGlu);
    if residual_fits && (!swiglu || n % 2 == 0) {
        if mma_fits(x, scales, biases, group_size, bits) {
            return quantized_matmul_t_mma(x, packed, scales, biases, group_size, bits, epilogue, shape);
        }
        if fits(x, scales, biases, group_size, bits) {
            return quantized_matmul_t_general(x, packed, scales, biases, group_size, bits, epilogue, shape, None);
        }
    }
    let y = quantized_matmul_t_mlx(x, packed, scales, biases, group_size, bits)?;
    epilogue_mlx(&y, epilogue)
}

/// y's shape for x `[…, K]` times a matrix of `n` rows followed by `epilogue` (SwiGLU halves it).
fn output_shape(x: &Array, n: i32, epilogue: Epilogue) -> Vec<i32> {
    let mut shape = x.shape().to_vec();
    let last = shape.len() - 1;
    shape[last] = if matches!(epilogue, Epilogue::SwiGlu) { n / 2 } else { n };
    shape
}

/// The kernel for `epilogue` of a family (plain, SwiGLU, residual) and its inputs.
fn kernel_for<'a>(
    family: [&'static KernelSource; 3],
    epilogue: Epilogue<'a>,
    x: &'a Array,
    packed: &'a Array,
    scales: &'a Array,
    biases: &'a Array,
) -> (&'static KernelSource, Vec<&'a Array>) {
    match epilogue {
        Epilogue::Plain => (family[0], vec![x, packed, scales, biases]),
        Epilogue::SwiGlu => (family[1], vec![x, packed, scales, biases]),
        Epilogue::Residual { residual, .. } => (family[2], vec![x, packed, scales, biases, residual]),
    }
}

/// How the general kernel divides a product among warps (`cuda/qmv.cu`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QmvTiling {
    /// Warps per thread block.
    pub warps: i32,
    /// Outputs per warp (SwiGLU: gate rows, each with its up row).
    pub outputs_per_warp: i32,
    /// Warps sharing a group of outputs, each over a part of K (plain and residual forms).
    pub split: i32,
    /// 16-byte chunks of each weight row a lane has in flight (with `async_copy`, the depth of its
    /// ring: one fewer in flight while it uses one).
    pub in_flight: i32,
    /// Whether the chunks land in shared memory through cp.async (CUDA) rather than in registers.
    pub async_copy: bool,
    /// Whether 4-bit weights on the CUDA cores are unpacked two at a time through half2 (the same
    /// values in fewer ALU instructions); other widths and the tensor-core form ignore it.
    pub half_pairs: bool,
}

impl QmvTiling {
    /// A tiling with 4-bit weights unpacked one at a time (`half_pairs` off).
    pub fn new(warps: i32, outputs_per_warp: i32, split: i32, in_flight: i32, async_copy: bool) -> Self {
        Self { warps, outputs_per_warp, split, in_flight, async_copy, half_pairs: false }
    }

    /// Whether this tiling's cp.async ring (16 bytes per lane, weight row and slot) fits a thread
    /// block's static shared memory beside `staged` bytes of normalised input and 1 KB for the
    /// kernel's other arrays; a tiling whose ring does not takes register loads.
    pub fn ring_fits(&self, swiglu: bool, staged: usize) -> bool {
        let rows = if swiglu { 2 * self.outputs_per_warp } else { self.outputs_per_warp };
        let ring = (self.warps * self.in_flight * rows) as usize * 32 * 16;
        staged + ring + 1024 <= STATIC_SHARED_BYTES
    }
}

/// Weight rows a warp of the general kernel's tensor-core form takes (`cuda/qmv_rows_mma.cu`: 4
/// bits, 16-bit inputs on CUDA): one m16n8k16 tile. A tiling of this many outputs a warp (SwiGLU:
/// half as many gate rows) selects it; the defaults below do not yet, as it has not beaten them on
/// one machine (eval/results/2026-11-27-h100-sala-decode).
pub const MMA_ROWS_PER_WARP: i32 = 16;

/// The general kernel's tiling for `n` weight rows of `chunks` 16-byte chunks, beside `staged`
/// bytes of normalised input (public for the kernel benchmark's sweep).
#[doc(hidden)]
pub fn general_tiling(n: i32, chunks: i32, bits: i32, swiglu: bool, staged: usize) -> QmvTiling {
    // 4 bits on CUDA: more rows a warp (x loaded once for all) and more loads in flight were the
    // fastest (eval/results/kernel-notes.md).
    if bits == 4 && backend() == Backend::Cuda {
        // The SwiGLU and the products of 8192–16384 rows are bound by unpacking 4-bit weights, and
        // faster with them unpacked two at a time; the others are slower so
        // (eval/results/kernel-notes.md).
        let pairs = |t: QmvTiling| QmvTiling { half_pairs: true, ..t };
        if swiglu {
            return pairs(QmvTiling::new(WARPS, 4, 1, 2, false));
        }
        if n > 16384 {
            return QmvTiling::new(WARPS, 4, 1, 2, false);
        }
        if n >= 8192 {
            // Through a cp.async ring of 2 slots where it fits beside the staged input: faster
            // there (eval/results/kernel-notes.md).
            let ring = QmvTiling::new(WARPS, if n >= 16384 { 4 } else { 2 }, 1, 2, true);
            if ring.ring_fits(swiglu, staged) {
                return pairs(ring);
            }
            return pairs(QmvTiling::new(WARPS, 2, 1, 4, false));
        }
    }
    // 8 bits on CUDA: the weights through a cp.async ring of 2 slots, with fewer warps than the
    // register loads want (about 4096 for the smaller matrices, each lane with at least 8 chunks of
    // a row): the faster in a sweep but for the head, which keeps register loads
    // (eval/results/kernel-notes.md).
    if bits == 8 && backend() == Backend::Cuda && (swiglu || n <= 16384) {
        let ring = |outputs_per_warp, split| QmvTiling::new(WARPS, outputs_per_warp, split, 2, true);
        if swiglu {
            return ring(1, 1);
        }
        if n >= 8192 {
            return ring(2, 1);
        }
        let outputs_per_warp = if chunks > 256 { 2 } else { 1 };
        return ring(outputs_per_warp, pow2_floor((4096 * outputs_per_warp / n).min(chunks / 256).min(WARPS)));
    }
    // 8 bits on CUDA past the ring's matrices (only the head comes here): two rows a warp, with the
    // split below the fastest in a sweep (eval/results/kernel-notes.md).
    let wide = bits == 8 && backend() == Backend::Cuda;
    let outputs_per_warp = if wide {
        2
    } else if swiglu {
        (rows_per_warp(bits) / 2).max(1)
    } else {
        rows_per_warp(bits)
    };
    // Warps sharing a group of output rows, each over a part of K (CUDA, plain and residual forms):
    // a matrix of 4096 rows has one warp per row otherwise, each with many loads in a row, far
    // below the memory bandwidth (eval/results/kernel-notes.md).
    let split = if backend() == Backend::Cuda && !swiglu {
        pow2_floor((16384 * outputs_per_warp / n).min(chunks / 64).min(WARPS))
    } else {
        1
    };
    QmvTiling::new(WARPS, outputs_per_warp, split, 2, false)
}

thread_local! {
    static TILING_OVERRIDE: std::cell::Cell<Option<QmvTiling>> = const { std::cell::Cell::new(None) };
    static MMA_TILING_OVERRIDE: std::cell::Cell<Option<MmaTiling>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the general and the tensor-core kernel's tilings forced (where given), for the
/// kernel benchmark's tiling sweep (`kernels qmv-tiling`); the model always uses the defaults.
#[doc(hidden)]
pub fn with_tiling<R>(general: Option<QmvTiling>, mma: Option<MmaTiling>, f: impl FnOnce() -> R) -> R {
    with_setting(&TILING_OVERRIDE, general, || with_setting(&MMA_TILING_OVERRIDE, mma, f))
}

/// The general kernel (`cuda/qmv.cu`, `metal/qmv.metal`), with x normalised first when `norm`
/// is given (CUDA, plain or SwiGLU); `shape` is y's.
#[allow(clippy::too_many_arguments)]
fn quantized_matmul_t_general(
    x: &Array,
    packed: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
    epilogue: Epilogue,
    shape: Vec<i32>,
    norm: Option<RmsNormIn>,
) -> Result<Array> {
    let (n, last) = (packed.shape()[0], shape.len() - 1);
    let swiglu = matches!(epilogue, Epilogue::SwiGlu);
    let rows: i32 = x.shape()[..last].iter().product();
    let (mut source, mut inputs) = kernel_for([&QMV, &QMV_SWIGLU, &QMV_RESIDUAL], epilogue, x, packed, scales, biases);
    let mut template = Vec::new();
    if let Some(norm) = norm {
        source = if swiglu { &QMV_SWIGLU_NORMED } else { &QMV_NORMED };
        inputs = vec![x, norm.weight, packed, scales, biases];
        if let (Some(gate), Epilogue::Residual { residual, .. }) = (norm.gate, epilogue) {
            source = &QMV_RESIDUAL_NORM_GATED;
            inputs = vec![x, norm.weight, gate.src, packed, scales, biases, residual];
            template.push(("Z_OFF", TemplateArg::Int(gate.offset)));
        }
        template.push(("K", TemplateArg::Int(x.shape()[last])));
        // Epsilon as its bit pattern: a compile-time constant.
        template.push(("EPS_BITS", TemplateArg::Int(norm.eps.to_bits() as i32)));
    }
    let staged = if norm.is_some() { rows as usize * x.shape()[last] as usize * x.item_size() } else { 0 };
    let t = TILING_OVERRIDE.with(|o| o.get()).unwrap_or_else(|| general_tiling(n, packed.shape()[1] / 4, bits, swiglu, staged));
    // Weight rows per warp (SwiGLU: gate rows and as many up rows).
    let per_warp = if swiglu { 2 * t.outputs_per_warp } else { t.outputs_per_warp };
    let async_copy = t.async_copy && backend() == Backend::Cuda && t.ring_fits(swiglu, staged);
    let groups_per_block = t.warps / t.split;
    let n_blocks = (shape[last] + groups_per_block * t.outputs_per_warp - 1) / (groups_per_block * t.outputs_per_warp);
    let y = apply(
        source,
        &inputs,
        Launch {
            grid: (n_blocks * 32 * t.warps, 1, 1),
            threads: (32 * t.warps, 1, 1),
            outputs: vec![(shape, x.dtype())],
            template: [
                ("T", TemplateArg::Type(x.dtype())),
                ("BITS", TemplateArg::Int(bits)),
                ("GROUP", TemplateArg::Int(group_size)),
                ("ROWS", TemplateArg::Int(rows)),
                ("WARPS", TemplateArg::Int(t.warps)),
                ("NR", TemplateArg::Int(per_warp)),
                ("SPLIT", TemplateArg::Int(t.split)),
                ("U", TemplateArg::Int(t.in_flight)),
                ("ASYNC", TemplateArg::Bool(async_copy)),
                ("PAIRS", TemplateArg::Bool(t.half_pairs)),
            ]
            .into_iter()
            .chain(template)
            .chain(alpha_template(epilogue, x.dtype()))
            .collect(),
            init: None,
        },
    )?;
    Ok(y.into_iter().next().expect("one output"))
}

/// The tensor-core kernel (`cuda/qmv_mma.cu`) on x `[…, K]` (its leading axes are the rows, as
/// the kernel reads them: no reshape operations around the launch); `shape` is y's.
#[allow(clippy::too_many_arguments)]
fn quantized_matmul_t_mma(
    x: &Array,
    packed: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
    epilogue: Epilogue,
    shape: Vec<i32>,
) -> Result<Array> {
    let k = x.shape()[x.ndim() - 1];
    let rows: i32 = x.shape()[..x.ndim() - 1].iter().product();
    let width = shape[shape.len() - 1];
    let (source, inputs) = kernel_for([&QMM, &QMM_SWIGLU, &QMM_RESIDUAL], epilogue, x, packed, scales, biases);
    let swiglu = matches!(epilogue, Epilogue::SwiGlu);
    let t = MMA_TILING_OVERRIDE.with(|o| o.get()).unwrap_or_else(|| mma_tiling(packed.shape()[0], k, bits, swiglu, rows));
    let blocks = (width + 8 * t.out_tiles - 1) / (8 * t.out_tiles);
    // 64-byte steps along K; split over the block's warps so that the grid has about
    // `grid_warps` warps (small matrices fill the GPU with loads too), each with a few steps;
    // at most 8 warps a block (16 × 32 threads run out of registers for 4 bits and > 8 rows).
    let steps = k * bits / 8 / 64;
    let nt = if swiglu { 2 * t.out_tiles } else { t.out_tiles };
    let halves = input_halves(rows);
    let input_tiles = (halves + 1) / 2;
    let mut warps = pow2_floor((t.grid_warps / blocks).min(8).min(steps / t.in_flight));
    // Fewer warps where the partial sums or a ring do not fit the block's static shared memory.
    while warps > 1 && t.shared_bytes(warps, nt, input_tiles) > STATIC_SHARED_BYTES {
        warps /= 2;
    }
    let async_copy = t.async_copy && t.shared_bytes(warps, nt, input_tiles) <= STATIC_SHARED_BYTES;
    let y = apply(
        source,
        &inputs,
        Launch {
            grid: (blocks * 32 * warps, 1, 1),
            threads: (32 * warps, 1, 1),
            outputs: vec![(shape, x.dtype())],
            template: vec![
                ("T", TemplateArg::Type(x.dtype())),
                ("BITS", TemplateArg::Int(bits)),
                ("GROUP", TemplateArg::Int(group_size)),
                ("HALVES", TemplateArg::Int(halves)),
                ("WARPS", TemplateArg::Int(warps)),
                ("NT", TemplateArg::Int(nt)),
                ("U", TemplateArg::Int(t.in_flight)),
                ("ASYNC", TemplateArg::Bool(async_copy)),
            ]
            .into_iter()
            .chain(alpha_template(epilogue, x.dtype()))
            .collect(),
            init: None,
        },
    )?;
    Ok(y.into_iter().next().expect("one output"))
}

/// The input row counts at which a GPU's quantized product changes form (a kernel of its own to
/// compile): one row, the tensor-core kernel's first count and each of its tile classes, and
/// past it MLX's product.
pub fn product_row_classes() -> Vec<i32> {
    let mut classes = vec![1, MIN_MMA_ROWS];
    classes.extend((MIN_MMA_ROWS + 1..=MAX_MMA_ROWS).filter(|&r| input_halves(r) != input_halves(r - 1)));
    classes.push(MAX_MMA_ROWS + 1);
    classes
}

/// The 8-row halves of 16-row mma tiles the tensor-core kernel takes `rows` input rows in: 1, 2,
/// 4 or 8 (rounded up to a power of two, so that few forms are compiled).
fn input_halves(rows: i32) -> i32 {
    (((rows + 7) / 8) as u32).next_power_of_two() as i32
}

/// The general kernel against MLX's product and [`epilogue_mlx`] in float32, for each epilogue:
/// one bfloat16 row at 4 bits, three at 8 bits.
pub static QMV_CHECK: KernelCheck = KernelCheck { name: "qmv", backends: CUDA_AND_METAL, run: check_qmv };

/// The tensor-core kernel likewise: 3 rows at 4 bits, 11 at 8 bits (the two halves of its tile),
/// and past one tile 21 at 4 bits and 45 at 8 (rows left over in the last tile).
pub static QMM_CHECK: KernelCheck = KernelCheck { name: "qmv_mma", backends: CUDA_ONLY, run: check_qmm };

/// The general kernel with the RMSNorm folded in (plain and SwiGLU at 8 bits) and with the
/// norm-gate folded into the residual form (4 bits), against MLX's norm, product and epilogue.
pub static QMV_NORMED_CHECK: KernelCheck = KernelCheck { name: "qmv_normed", backends: CUDA_ONLY, run: check_qmv_normed };

/// A check's product: W `[272, 384]` (SwiGLU: 136 gate rows and their up rows) quantized in
/// groups of 64, scales and biases in bfloat16, x `[rows, 384]` and the residual in bfloat16.
struct CheckProduct {
    x: Array,
    packed: Array,
    scales: Array,
    biases: Array,
    residual: Array,
    bits: i32,
}

const CHECK_N: i32 = 272;
const CHECK_K: i32 = 384;
const CHECK_GROUP: i32 = 64;
/// Exact in every dtype.
const CHECK_ALPHA: f32 = 0.5;
const CHECK_EPS: f32 = 1e-6;

impl CheckProduct {
    fn new(rows: i32, bits: i32, seed: u64) -> Result<Self> {
        let (packed, scales, biases) = ops::quantize(&sample(&[CHECK_N, CHECK_K], seed, Dtype::Float32)?, CHECK_GROUP, bits)?;
        let (scales, biases) = (scales.as_dtype(Dtype::Bfloat16)?, biases.as_dtype(Dtype::Bfloat16)?);
        mlx_rs::transforms::eval([&packed, &scales, &biases])?;
        let x = sample(&[rows, CHECK_K], seed + 1, Dtype::Bfloat16)?;
        Ok(Self { x, packed, scales, biases, residual: sample(&[rows, CHECK_N], seed + 2, Dtype::Bfloat16)?, bits })
    }

    /// Plain, SwiGLU or residual (`which` 0, 1, 2), the residual read as `residual`.
    fn epilogue<'a>(which: usize, residual: &'a Array) -> Epilogue<'a> {
        [Epilogue::Plain, Epilogue::SwiGlu, Epilogue::Residual { residual, alpha: CHECK_ALPHA }][which]
    }

    /// The kernel's output for `x`: the general kernel, with `norm` folded in when given.
    fn general(&self, x: &Array, norm: Option<RmsNormIn>, epilogue: Epilogue) -> Result<Vec<Array>> {
        let shape = output_shape(x, CHECK_N, epilogue);
        Ok(vec![quantized_matmul_t_general(x, &self.packed, &self.scales, &self.biases, CHECK_GROUP, self.bits, epilogue, shape, norm)?])
    }

    /// The oracle for `x` (already normalised): MLX's product and `epilogue` in float32.
    fn oracle(&self, x: &Array, epilogue: Epilogue) -> Result<Vec<Array>> {
        let f = |a: &Array| a.as_dtype(Dtype::Float32);
        let y = quantized_matmul_t_mlx(&f(x)?, &self.packed, &f(&self.scales)?, &f(&self.biases)?, CHECK_GROUP, self.bits)?;
        Ok(vec![match epilogue {
            Epilogue::Residual { residual, alpha } => epilogue_mlx(&y, Epilogue::Residual { residual: &f(residual)?, alpha })?,
            other => epilogue_mlx(&y, other)?,
        }])
    }
}

const EPILOGUE_NAMES: [&str; 3] = ["plain", "swiglu", "residual"];

/// `kernel` (a launch function) against the oracle for each epilogue, with (rows, bits) as given.
fn check_products(cases: &[(i32, i32)], kernel: fn(&CheckProduct, Epilogue) -> Result<Array>) -> Verdict {
    for (i, &(rows, bits)) in cases.iter().enumerate() {
        for (which, name) in EPILOGUE_NAMES.iter().enumerate() {
            verify(
                || CheckProduct::new(rows, bits, 40 + 4 * i as u64),
                |p| Ok(vec![kernel(p, CheckProduct::epilogue(which, &p.residual))?]),
                |p| p.oracle(&p.x, CheckProduct::epilogue(which, &p.residual)),
            )
            .map_err(|reason| format!("{rows} rows, {bits} bits, {name}: {reason}"))?;
        }
    }
    Ok(())
}

fn check_qmv() -> Verdict {
    check_products(&[(1, 4), (3, 8)], |p, epilogue| Ok(p.general(&p.x, None, epilogue)?.remove(0)))
}

fn check_qmm() -> Verdict {
    check_products(&[(3, 4), (11, 8), (21, 4), (45, 8)], |p, epilogue| {
        let shape = output_shape(&p.x, CHECK_N, epilogue);
        quantized_matmul_t_mma(&p.x, &p.packed, &p.scales, &p.biases, CHECK_GROUP, p.bits, epilogue, shape)
    })
}

fn check_qmv_normed() -> Verdict {
    // Inputs far from unit RMS and a norm weight far from 1, so that a norm left out shows.
    let far = |shape: &[i32], seed: u64, scale: f32| -> Result<Array> {
        sample(shape, seed, Dtype::Float32)?.multiply(Array::from_f32(scale))?.as_dtype(Dtype::Bfloat16)
    };
    let weight = || -> Result<Array> {
        sample(&[CHECK_K], 47, Dtype::Float32)?.multiply(Array::from_f32(0.5))?.add(Array::from_f32(1.0))?.as_dtype(Dtype::Bfloat16)
    };
    for which in [0, 1] {
        verify(
            || Ok((CheckProduct::new(1, 8, 48)?, far(&[1, CHECK_K], 49, 7.0)?, weight()?)),
            |(p, x, weight)| p.general(x, Some(RmsNormIn { weight, eps: CHECK_EPS, gate: None }), CheckProduct::epilogue(which, &p.residual)),
            |(p, x, weight)| p.oracle(&mlx_rs::fast::rms_norm(x, Some(weight), CHECK_EPS)?, CheckProduct::epilogue(which, &p.residual)),
        )
        .map_err(|reason| format!("{}: {reason}", EPILOGUE_NAMES[which]))?;
    }
    // A lightning layer's o_proj: the norm-gate folded in, z at column 8 of 800-wide rows.
    let (offset, width) = (8, 800);
    verify(
        || {
            let p = CheckProduct::new(1, 4, 52)?;
            let residual = p.residual.reshape(&[1, 1, CHECK_N])?;
            Ok((p, far(&[1, 1, CHECK_K], 53, 5.0)?, far(&[1, 1, width], 54, 2.0)?, weight()?, residual))
        },
        |(p, o, src, weight, residual)| {
            let norm = RmsNormIn { weight, eps: CHECK_EPS, gate: Some(GateIn { src, offset }) };
            p.general(o, Some(norm), CheckProduct::epilogue(2, residual))
        },
        |(p, o, src, weight, residual)| {
            p.oracle(&super::lightning::norm_gate_mlx(o, src, offset, weight, CHECK_EPS)?, CheckProduct::epilogue(2, residual))
        },
    )
    .map_err(|reason| format!("norm-gated residual: {reason}"))
}

/// The residual epilogue's alpha as a compile-time constant: the bit pattern of its value
/// rounded to `dtype`, as MLX's multiply by a scalar of that dtype rounds it.
pub(super) fn alpha_template(epilogue: Epilogue, dtype: Dtype) -> Option<(&'static str, TemplateArg)> {
    let Epilogue::Residual { alpha, .. } = epilogue else { return None };
    let rounded = match dtype {
        Dtype::Bfloat16 => half::bf16::from_f32(alpha).to_f32(),
        Dtype::Float16 => half::f16::from_f32(alpha).to_f32(),
        _ => alpha,
    };
    Some(("ALPHA_BITS", TemplateArg::Int(rounded.to_bits() as i32)))
}

/// The epilogue in MLX operations on the product `y` (the fallback and the kernels' reference).
pub fn epilogue_mlx(y: &Array, epilogue: Epilogue) -> Result<Array> {
    match epilogue {
        Epilogue::Plain => Ok(y.clone()),
        Epilogue::SwiGlu => {
            let halves = ops::split_equal(y, 2, -1)?;
            swiglu_mlx(&halves[0], &halves[1])
        }
        Epilogue::Residual { residual, alpha } => residual.add(y.multiply(scalar(alpha, y.dtype())?)?),
    }
}

/// silu(gate) ⊙ up.
pub fn swiglu_mlx(gate: &Array, up: &Array) -> Result<Array> {
    gate.multiply(ops::sigmoid(gate)?)?.multiply(up)
}

/// MLX's own quantized matmul (the fallback, and the reference the kernel is tested against).
pub fn quantized_matmul_t_mlx(
    x: &Array,
    packed: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    // As one [rows, K] matrix: given a decode batch as [B, 1, K], MLX multiplies B separate
    // vectors (B reads of the weights); as [B, K] it runs its matrix kernel, read once
    // (eval/results/kernel-notes.md).
    let k = x.shape()[x.ndim() - 1];
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("x has a last axis") = packed.shape()[0];
    let x = x.reshape(&[-1, k])?;
    let in_float32 = x.dtype() == Dtype::Float32 || scales.dtype() == Dtype::Float32;
    if in_float32 && group_size >= 128 && x.shape()[0] > MLX_CUDA_FLOAT32_G128_MAX_ROWS && backend() == Backend::Cuda {
        let w = ops::dequantize(packed, scales, biases, group_size, bits)?.as_dtype(Dtype::Float32)?;
        return x.as_dtype(Dtype::Float32)?.matmul(w.t())?.reshape(&shape);
    }
    ops::quantized_matmul(&x, packed, scales, biases, true, group_size, bits)?.reshape(&shape)
}

/// Rows up to which MLX 0.32's CUDA quantized matmul launches a float32 product in groups of 128:
/// past them its fallback kernel (`qmm_naive`) asks for 64 KiB of shared memory without raising
/// CUDA's 48 KiB default and the graph refuses the launch, so the matrix is dequantized instead.
const MLX_CUDA_FLOAT32_G128_MAX_ROWS: i32 = 32;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn product_forms_change_at_each_tile_class() {
        assert_eq!(product_row_classes(), vec![1, 2, 9, 17, 33, 65]);
        assert_eq!([2, 8, 9, 16, 17, 32, 33, 64].map(input_halves), [1, 1, 2, 2, 4, 4, 8, 8]);
    }
}
