//! Quantized matrix-vector product for decode: x `[…, K]` (at most [`MAX_ROWS`] rows) times an
//! MLX-quantized `[N, K]` matrix, transposed. On a GPU the kernel streams each packed row once at
//! full memory width (`cuda/qmv.cu`, `metal/qmv.metal`); elsewhere MLX's quantized matmul runs.

use super::custom::{apply, backend, Backend, KernelSource, Launch, TemplateArg};
use mlx_rs::{error::Result, ops, Array};

/// Input rows up to which the kernel is used: measured on an H200 (benches/kernels.rs) it beats
/// MLX's quantized matmul by 1.15–1.4× at one row and 1.9–2.2× at four on the 9B's large
/// matrices (the 4096² one is even at one row); from 8 rows MLX's matrix kernel is faster (2.3× at
/// 8 rows on an H100).
pub const MAX_ROWS: i32 = 4;
/// Output rows per thread block (one warp each).
const WARPS: i32 = 8;

static QMV: KernelSource = KernelSource {
    name: "sala_qmv",
    inputs: &["x", "w", "scales", "biases"],
    outputs: &["y"],
    cuda_header: include_str!("../../cuda/qmv.cu"),
    cuda_body: "sala_qmv<T, BITS, GROUP, ROWS, WARPS>(x, w, scales, biases, y, w_shape[0], w_shape[1] * 32 / BITS);",
    metal_header: include_str!("../../metal/qmv.metal"),
    metal_body: "sala_qmv<T, BITS, GROUP, ROWS>(x, w, scales, biases, y, int(w_shape[0]), int(w_shape[1]) * 32 / BITS, \
                 thread_index_in_simdgroup, threadgroup_position_in_grid.x * WARPS + simdgroup_index_in_threadgroup);",
    contiguous_inputs: true,
};

/// x · Wᵀ for W given as MLX's (packed, scales, biases) with `group_size` and `bits`.
pub fn quantized_matmul_t(
    x: &Array,
    packed: &Array,
    scales: &Array,
    biases: &Array,
    group_size: i32,
    bits: i32,
) -> Result<Array> {
    let k = x.shape()[x.ndim() - 1];
    let rows: i32 = x.shape()[..x.ndim() - 1].iter().product();
    let fits = matches!(bits, 4 | 8)
        && matches!(group_size, 32 | 64 | 128)
        && rows <= MAX_ROWS
        && scales.dtype() == x.dtype()
        && biases.dtype() == x.dtype()
        && k % 128 == 0;
    if backend() == Backend::Cpu || !fits {
        return quantized_matmul_t_mlx(x, packed, scales, biases, group_size, bits);
    }
    let n = packed.shape()[0];
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("x has a last axis") = n;
    let n_blocks = (n + WARPS - 1) / WARPS;
    let y = apply(
        &QMV,
        &[x, packed, scales, biases],
        Launch {
            grid: (n_blocks * 32 * WARPS, 1, 1),
            threads: (32 * WARPS, 1, 1),
            outputs: vec![(shape, x.dtype())],
            template: vec![
                ("T", TemplateArg::Type(x.dtype())),
                ("BITS", TemplateArg::Int(bits)),
                ("GROUP", TemplateArg::Int(group_size)),
                ("ROWS", TemplateArg::Int(rows)),
                ("WARPS", TemplateArg::Int(WARPS)),
            ],
            init: None,
        },
    )?;
    Ok(y.into_iter().next().expect("one output"))
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
    // vectors (B reads of the weights); as [B, K] it runs its matrix kernel (2.3× faster at 8 rows,
    // benches/kernels.rs on an H100).
    let k = x.shape()[x.ndim() - 1];
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("x has a last axis") = packed.shape()[0];
    ops::quantized_matmul(x.reshape(&[-1, k])?, packed, scales, biases, true, group_size, bits)?.reshape(&shape)
}
