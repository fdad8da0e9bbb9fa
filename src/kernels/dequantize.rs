//! The expanded copy of an MLX affine-quantized matrix (`cuda/dequantize.cu`): what a prompt
//! chunk's product multiplies on a GPU. The same values as MLX's `dequantize`, to the bit, at
//! memory speed: MLX's CUDA kernel expands one byte per thread, and its copies were much of a
//! prompt chunk's product time (eval/results/2026-12-02-h200-dequantize). MLX's `dequantize`
//! elsewhere (the CPU, Metal, other bit widths) and as the oracle.

use super::custom::{apply, backend, Backend, KernelSource, Launch, TemplateArg};
use super::selfcheck::{self, sample, verify, KernelCheck, Verdict, CUDA_ONLY};
use mlx_rs::{error::Result, ops, Array, Dtype};

static DEQUANTIZE: KernelSource = KernelSource {
    name: "sala_dequantize",
    inputs: &["packed", "scales", "biases"],
    outputs: &["w"],
    cuda_header: include_str!("../../cuda/dequantize.cu"),
    cuda_body: "sala_dequantize<T, BITS, GROUP>(packed, scales, biases, (size_t)scales_shape[0] * scales_shape[1] * GROUP * sizeof(T) / 16, w);",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: true,
    shared_memory: 0,
};

const THREADS: i32 = 256;

/// The matrix `packed` `[N, K · bits / 32]` (uint32) with `scales` and `biases` `[N, K / group]`
/// expanded to `[N, K]` in the scales' dtype, as `ops::dequantize` gives it.
pub fn dequantize(packed: &Array, scales: &Array, biases: &Array, group: i32, bits: i32) -> Result<Array> {
    if !fits(packed, scales, biases, group, bits) {
        return dequantize_mlx(packed, scales, biases, group, bits);
    }
    dequantize_cuda(packed, scales, biases, group, bits)
}

/// MLX's own dequantize: the oracle, and the path where the kernel does not run.
pub fn dequantize_mlx(packed: &Array, scales: &Array, biases: &Array, group: i32, bits: i32) -> Result<Array> {
    ops::dequantize(packed, scales, biases, group, bits)
}

fn fits(packed: &Array, scales: &Array, biases: &Array, group: i32, bits: i32) -> bool {
    let words_per_group = group * bits / 32;
    backend() == Backend::Cuda
        && matches!(bits, 4 | 8)
        && matches!(group, 32 | 64 | 128)
        && packed.dtype() == Dtype::Uint32
        && packed.ndim() == 2
        && scales.ndim() == 2
        && matches!(scales.dtype(), Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32)
        && biases.dtype() == scales.dtype()
        && biases.shape() == scales.shape()
        && scales.shape()[0] == packed.shape()[0]
        && scales.shape()[1] * words_per_group == packed.shape()[1]
        // The grid counts them in an i32.
        && copy_pieces(packed, scales, bits) < (i32::MAX - THREADS) as usize
        && selfcheck::enabled(&DEQUANTIZE_CHECK)
}

/// The 16-byte pieces of the expanded copy: one thread each.
fn copy_pieces(packed: &Array, scales: &Array, bits: i32) -> usize {
    packed.size() * 32 / bits as usize / (16 / scales.item_size())
}

fn dequantize_cuda(packed: &Array, scales: &Array, biases: &Array, group: i32, bits: i32) -> Result<Array> {
    let (n, words) = (packed.shape()[0], packed.shape()[1]);
    let pieces = copy_pieces(packed, scales, bits) as i32;
    let out = apply(
        &DEQUANTIZE,
        &[packed, scales, biases],
        Launch {
            grid: ((pieces + THREADS - 1) / THREADS * THREADS, 1, 1),
            threads: (THREADS, 1, 1),
            outputs: vec![(vec![n, words * 32 / bits], scales.dtype())],
            template: vec![("T", TemplateArg::Type(scales.dtype())), ("BITS", TemplateArg::Int(bits)), ("GROUP", TemplateArg::Int(group))],
            init: None,
        },
    )?;
    Ok(out.into_iter().next().expect("one output"))
}

/// The kernel against MLX's dequantize: 8 and 4 bits, groups of 32, 64 and 128, bf16, f16 and
/// float32 scales.
pub static DEQUANTIZE_CHECK: KernelCheck = KernelCheck { name: "dequantize", backends: CUDA_ONLY, run: check_dequantize };

fn check_dequantize() -> Verdict {
    for (bits, group, dtype) in [(8, 64, Dtype::Bfloat16), (4, 32, Dtype::Bfloat16), (8, 128, Dtype::Float32), (4, 128, Dtype::Float16)] {
        verify(
            || {
                let (p, s, b) = ops::quantize(&sample(&[48, 512], 90 + bits as u64, Dtype::Float32)?, group, bits)?;
                Ok((p, s.as_dtype(dtype)?, b.as_dtype(dtype)?))
            },
            |(p, s, b)| Ok(vec![dequantize_cuda(p, s, b, group, bits)?]),
            |(p, s, b)| Ok(vec![dequantize_mlx(p, s, b, group, bits)?]),
        )
        .map_err(|reason| format!("{bits} bits, groups of {group}, {dtype:?}: {reason}"))?;
    }
    Ok(())
}
