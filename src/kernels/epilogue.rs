//! The step after a product of many rows (`cuda/epilogue.cu`): SwiGLU of a stacked `[gate | up]`
//! product and the residual branch's `residual + α · y`, one pass over memory each where MLX's
//! operations take three and two (they were about a tenth of a prompt chunk on an H200:
//! eval/results/2026-12-03-h200-epilogue). Rounded as those operations round, so the values are
//! theirs. A decode step's products fuse the same steps into their kernels ([`super::qmv`]);
//! elsewhere (the CPU, Metal) and as the oracle: [`epilogue_mlx`].

use super::custom::{apply, backend, Backend, KernelSource, Launch, TemplateArg};
use super::qmv::{alpha_template, epilogue_mlx, Epilogue};
use super::selfcheck::{self, sample, verify, KernelCheck, Verdict, CUDA_ONLY};
use crate::engine::ops::scalar;
use mlx_rs::{error::Result, Array, Dtype};

const HEADER: &str = concat!(include_str!("../../cuda/round.cu"), include_str!("../../cuda/epilogue.cu"));

static SWIGLU: KernelSource = KernelSource {
    name: "sala_swiglu_rows",
    inputs: &["y"],
    outputs: &["out"],
    cuda_header: HEADER,
    cuda_body: "sala_swiglu_rows<T>(y, out, y_shape[1] / 2, (size_t)y_shape[0] * (y_shape[1] / 2) / (16 / sizeof(T)));",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: true,
    shared_memory: 0,
};

static RESIDUAL: KernelSource = KernelSource {
    name: "sala_residual_rows",
    inputs: &["y", "residual"],
    outputs: &["out"],
    cuda_header: HEADER,
    cuda_body: "sala_residual_rows<T, ALPHA_BITS>(y, residual, out, (size_t)y_shape[0] * y_shape[1] / (16 / sizeof(T)));",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: true,
    shared_memory: 0,
};

const THREADS: i32 = 256;

/// The product `y` `[…, N]` followed by `epilogue` (SwiGLU gives `[…, N / 2]`).
pub fn apply_epilogue(y: &Array, epilogue: Epilogue) -> Result<Array> {
    match epilogue {
        Epilogue::Plain => Ok(y.clone()),
        Epilogue::SwiGlu if fits(y, epilogue) => swiglu_cuda(y),
        Epilogue::Residual { residual, alpha } if fits(y, epilogue) => residual_cuda(y, residual, alpha),
        _ => epilogue_mlx(y, epilogue),
    }
}

/// Values in one 16-byte piece.
fn piece(dtype: Dtype) -> i32 {
    if dtype == Dtype::Float32 {
        4
    } else {
        8
    }
}

fn fits(y: &Array, epilogue: Epilogue) -> bool {
    let dtype = y.dtype();
    let Some(&n) = y.shape().last() else { return false };
    // A piece lies in one half of a row, and every row-contiguous view starts on 16 bytes.
    let width = if matches!(epilogue, Epilogue::SwiGlu) { n / 2 } else { n };
    let same_as_residual = match epilogue {
        Epilogue::Residual { residual, .. } => residual.shape() == y.shape() && residual.dtype() == dtype,
        _ => true,
    };
    backend() == Backend::Cuda
        && matches!(dtype, Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32)
        && n % 2 == 0
        && width % piece(dtype) == 0
        && same_as_residual
        // The grid counts threads in an i32.
        && y.size() / (piece(dtype) as usize) < (i32::MAX - THREADS) as usize
        && selfcheck::enabled(&EPILOGUE_CHECK)
}

/// A launch of one thread per 16-byte piece of `out_shape`.
fn launch<'a>(out_shape: Vec<i32>, dtype: Dtype, template: Vec<(&'a str, TemplateArg)>) -> Launch<'a> {
    let pieces = out_shape.iter().product::<i32>() / piece(dtype);
    Launch {
        grid: ((pieces + THREADS - 1) / THREADS * THREADS, 1, 1),
        threads: (THREADS, 1, 1),
        outputs: vec![(out_shape, dtype)],
        template: [("T", TemplateArg::Type(dtype))].into_iter().chain(template).collect(),
        init: None,
    }
}

/// `y` as `[rows, N]`, the form the kernels index.
fn as_rows(y: &Array) -> Result<Array> {
    y.reshape(&[-1, *y.shape().last().expect("fits checked the last axis")])
}

fn swiglu_cuda(y: &Array) -> Result<Array> {
    let mut shape = y.shape().to_vec();
    *shape.last_mut().expect("fits checked the last axis") /= 2;
    let out = apply(&SWIGLU, &[&as_rows(y)?], launch(shape.clone(), y.dtype(), vec![]))?;
    out.into_iter().next().expect("one output").reshape(&shape)
}

fn residual_cuda(y: &Array, residual: &Array, alpha: f32) -> Result<Array> {
    let epilogue = Epilogue::Residual { residual, alpha };
    let alpha = alpha_template(epilogue, y.dtype()).into_iter().collect();
    let out = apply(&RESIDUAL, &[&as_rows(y)?, &as_rows(residual)?], launch(y.shape().to_vec(), y.dtype(), alpha))?;
    out.into_iter().next().expect("one output").reshape(y.shape())
}

/// Both kernels against [`epilogue_mlx`]: bf16, f16 and float32, rows of several widths, values
/// out to where the sigmoid saturates, α below and at 1.
pub static EPILOGUE_CHECK: KernelCheck = KernelCheck { name: "epilogue", backends: CUDA_ONLY, run: check_epilogue };

fn check_epilogue() -> Verdict {
    for (shape, dtype, alpha) in [(vec![2, 7, 80], Dtype::Bfloat16, 0.3), (vec![13, 32], Dtype::Float32, 1.0), (vec![3, 48], Dtype::Float16, 1.4)] {
        let scaled = |seed: u64| -> Result<Array> { sample(&shape, seed, dtype)?.multiply(scalar(12.0, dtype)?) };
        verify(|| scaled(60), |y| Ok(vec![swiglu_cuda(y)?]), |y| Ok(vec![epilogue_mlx(y, Epilogue::SwiGlu)?]))
            .map_err(|reason| format!("SwiGLU of {shape:?} {dtype:?}: {reason}"))?;
        verify(
            || Ok((scaled(61)?, scaled(62)?)),
            |(y, residual)| Ok(vec![residual_cuda(y, residual, alpha)?]),
            |(y, residual)| Ok(vec![epilogue_mlx(y, Epilogue::Residual { residual, alpha })?]),
        )
        .map_err(|reason| format!("residual of {shape:?} {dtype:?}, α {alpha}: {reason}"))?;
    }
    Ok(())
}
