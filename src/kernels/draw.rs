//! A token drawn for every row of a batch's logits in one launch (`cuda/draw.cu`): the grammar's
//! mask, temperature, top-k, top-p, min-p and the Gumbel-max draw of `engine::device_sampler`.
//! In MLX operations that draw is a sort, a softmax, a cumulative sum and some fifty small
//! operations a step, each costing the host its building and encoding while a decode step is
//! bound by that work; the kernel finds the thresholds without sorting. Elsewhere (the CPU,
//! Metal) and as the test oracle the MLX operations run ([`draw_mlx`]).

use super::custom::{apply, backend, Backend, KernelSource, Launch, TemplateArg};
use super::selfcheck::{self, sample, verify, KernelCheck, Verdict, CUDA_ONLY};
use crate::engine::device_sampler::{self, RowDraw};
use crate::engine::error::Result;
use mlx_rs::{Array, Dtype};

static DRAW: KernelSource = KernelSource {
    name: "sala_draw",
    inputs: &["logits", "words", "params"],
    outputs: &["token"],
    cuda_header: include_str!("../../cuda/draw.cu"),
    cuda_body: "sala_draw<T, MASK, THREADS>(logits, words, params, token, logits_shape[1], words_shape[1]);",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: true,
};

/// Threads of the block that draws one row.
const THREADS: i32 = 1024;

/// One token per row of `logits` `[rows, vocab]` (float32, bfloat16 or float16) under the packed
/// mask `words` `[rows, ⌈vocab/32⌉]` (if any) and each row's settings: `[rows]` uint32 on the
/// device, as [`device_sampler::draw`] of the masked logits.
pub fn draw(logits: &Array, words: Option<&Array>, rows: &[RowDraw]) -> Result<Array> {
    let shape = logits.shape();
    let fits = backend() == Backend::Cuda
        && shape.len() == 2
        && shape[0] as usize == rows.len()
        && matches!(logits.dtype(), Dtype::Float32 | Dtype::Bfloat16 | Dtype::Float16)
        && words.is_none_or(|w| w.shape() == [shape[0], (shape[1] + 31) / 32] && w.dtype() == Dtype::Uint32)
        && selfcheck::enabled(&DRAW_CHECK);
    if !fits {
        return draw_mlx(logits, words, rows);
    }
    Ok(draw_cuda(logits, words, rows)?)
}

/// The MLX-ops version of [`draw`]: the mask applied, then `device_sampler::draw`.
pub fn draw_mlx(logits: &Array, words: Option<&Array>, rows: &[RowDraw]) -> Result<Array> {
    let masked = device_sampler::adjust(logits, words, None, None, None, &[])?;
    device_sampler::draw(&masked, rows)
}

/// Each row's settings as the kernel reads them: temperature's bits, top-k, top-p's bits,
/// ln(min-p)'s bits (−∞ when off, as the MLX ops compute it) and the key.
fn params(rows: &[RowDraw]) -> Array {
    let values: Vec<u32> = rows
        .iter()
        .flat_map(|r| {
            let ln_min_p = if r.min_p > 0.0 { r.min_p.ln() } else { f32::NEG_INFINITY };
            [r.temperature.to_bits(), r.top_k.min(u32::MAX as usize) as u32, r.top_p.to_bits(), ln_min_p.to_bits(), r.key]
        })
        .collect();
    Array::from_slice(&values, &[rows.len() as i32, 5])
}

fn draw_cuda(logits: &Array, words: Option<&Array>, rows: &[RowDraw]) -> mlx_rs::error::Result<Array> {
    let n = rows.len() as i32;
    let params = params(rows);
    // Without a mask the kernel never reads `words`: the parameters stand in.
    let words_in = words.unwrap_or(&params);
    let out = apply(
        &DRAW,
        &[logits, words_in, &params],
        Launch {
            grid: (n * THREADS, 1, 1),
            threads: (THREADS, 1, 1),
            outputs: vec![(vec![n], Dtype::Uint32)],
            template: vec![("T", TemplateArg::Type(logits.dtype())), ("MASK", TemplateArg::Bool(words.is_some())), ("THREADS", TemplateArg::Int(THREADS))],
            init: None,
        },
    )?;
    out.into_iter().next().ok_or_else(|| mlx_rs::error::Exception::custom("the draw kernel gave no output"))
}

/// The draw kernel against [`draw_mlx`] on bfloat16 logits spread over ±8 (vocabulary 3000, so
/// the thresholds fall inside histogram bins): greedy, each filter alone and together, and
/// under a mask. Tokens must match exactly.
pub static DRAW_CHECK: KernelCheck = KernelCheck { name: "draw", backends: CUDA_ONLY, run: check_draw };

fn check_draw() -> Verdict {
    let vocab = 3000;
    let base = RowDraw { temperature: 0.8, top_k: 0, top_p: 1.0, min_p: 0.0, key: 0 };
    let rows: Vec<RowDraw> = [
        RowDraw { temperature: 0.0, ..base },
        base,
        RowDraw { top_k: 40, ..base },
        RowDraw { top_p: 0.9, ..base },
        RowDraw { min_p: 0.05, ..base },
        RowDraw { top_k: 200, top_p: 0.7, min_p: 0.01, temperature: 1.3, ..base },
    ]
    .into_iter()
    .enumerate()
    .map(|(i, r)| RowDraw { key: device_sampler::draw_key(11, i as u64), ..r })
    .collect();
    let n = rows.len() as i32;
    let width = (vocab + 31) / 32;
    let inputs = || -> mlx_rs::error::Result<(Array, Array)> {
        let logits = sample(&[n, vocab], 41, Dtype::Float32)?.multiply(Array::from_f32(8.0))?.as_dtype(Dtype::Bfloat16)?;
        // Every other row allows a pseudo-random half of the vocabulary.
        let words: Vec<u32> = (0..n * width).map(|i| if (i / width) % 2 == 0 { u32::MAX } else { (i as u32).wrapping_mul(0x9E37_79B1) }).collect();
        Ok((logits, Array::from_slice(&words, &[n, width])))
    };
    let oracle = |w: Option<&Array>, logits: &Array| draw_mlx(logits, w, &rows).map_err(|e| mlx_rs::error::Exception::custom(e.to_string()));
    verify(
        inputs,
        |(logits, words)| Ok(vec![draw_cuda(logits, None, &rows)?, draw_cuda(logits, Some(words), &rows)?]),
        |(logits, words)| Ok(vec![oracle(None, logits)?, oracle(Some(words), logits)?]),
    )
}
