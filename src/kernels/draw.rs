//! A token drawn for every row of a batch's logits (`cuda/draw.cu`): the grammar's mask,
//! temperature, top-k, top-p, min-p and the Gumbel-max draw of `engine::device_sampler`. In MLX
//! operations that draw is a sort, a softmax, a cumulative sum and some fifty small operations a
//! step; the kernels find the thresholds without sorting, each row's work spread over slices of
//! the vocabulary (three launches, five with top-k or top-p). Elsewhere (the CPU, Metal) and as the
//! test oracle the MLX operations run ([`draw_mlx`]).

use super::custom::{apply, backend, shape_args, Backend, KernelSource, Launch, TemplateArg};
use super::selfcheck::{self, sample, verify, KernelCheck, Verdict, CUDA_ONLY};
use crate::engine::device_sampler::{self, RowDraw};
use crate::engine::error::Result;
use mlx_rs::{Array, Dtype};
use std::cell::RefCell;

/// One of the draw's kernels: every one reads the logits, the mask's words and the rows' settings.
const fn draw_kernel(name: &'static str, inputs: &'static [&'static str], outputs: &'static [&'static str], cuda_body: &'static str) -> KernelSource {
    KernelSource { name, inputs, outputs, cuda_header: include_str!("../../cuda/draw.cu"), cuda_body, metal_header: "", metal_body: "", contiguous_inputs: true, shared_memory: 0 }
}

static KEYS: KernelSource = KernelSource {
    name: "sala_draw_keys",
    inputs: &["params", "advance"],
    outputs: &["keys"],
    cuda_header: include_str!("../../cuda/draw.cu"),
    cuda_body: "sala_draw_keys(params, keys, params_shape[0], advance_shape[0] - 1);",
    metal_header: "",
    metal_body: "",
    // `advance` is a shape_args broadcast (a copy would write it out).
    contiguous_inputs: false,
    shared_memory: 0,
};

static SCAN: KernelSource = draw_kernel(
    "sala_draw_scan",
    &["logits", "words", "params"],
    &["part_v", "part_i"],
    "sala_draw_scan<T, MASK, THREADS>(logits, words, params, part_v, part_i, logits_shape[1], words_shape[1]);",
);

static BINS: KernelSource = draw_kernel(
    "sala_draw_bins",
    &["logits", "words", "params", "part_v", "part_i"],
    &["hist"],
    "sala_draw_bins<T, MASK, THREADS>(logits, words, params, part_v, part_i, hist, logits_shape[1], words_shape[1]);",
);

static FLOOR: KernelSource = draw_kernel(
    "sala_draw_floor",
    &["logits", "words", "params", "part_v", "part_i", "hist"],
    &["floors"],
    "sala_draw_floor<T, MASK, THREADS>(logits, words, params, part_v, part_i, hist, floors, logits_shape[1], words_shape[1]);",
);

static PICK: KernelSource = draw_kernel(
    "sala_draw_pick",
    &["logits", "words", "params", "keys", "part_v", "part_i", "floors"],
    &["token", "best_v", "best_i"],
    "sala_draw_pick<T, MASK, THREADS, FLOORED>(logits, words, params, keys, part_v, part_i, floors, token, best_v, best_i, \
     logits_shape[1], words_shape[1]);",
);

/// Slices a row is cut into (`SALA_DRAW_SLICES`), a thread block of [`SLICE_THREADS`] each.
const SLICES: i32 = 32;
const SLICE_THREADS: i32 = 256;
/// Threads of the block that finds a row's thresholds.
const ROW_THREADS: i32 = 1024;
/// Words of a row's parameters (`SALA_DRAW_PARAMS`).
const PARAM_WORDS: i32 = 8;
/// Words of a slice's first histogram (`SALA_DRAW_HIST`: 1025 bins' counts and masses' halves).
const HIST_WORDS: i32 = 3 * 1025;
/// Words a row of the keys' output (`SALA_DRAW_KEY_WORDS`: the key, the pick's count of finished
/// slices, two unused).
const KEY_WORDS: i32 = 4;
/// Rows the floors' output has at least: MLX on CUDA keeps arrays of 8 bytes or less in a pool of
/// managed memory, which the host's writes of other small arrays move off the GPU.
const MIN_ROWS: i32 = 4;

/// One token per row of `logits` `[rows, vocab]` (float32, bfloat16 or float16) under the packed
/// mask `words` `[rows, ⌈vocab/32⌉]` (if any) and each row's settings: `[rows]` uint32 on the
/// device, as [`device_sampler::draw`] of the masked logits.
pub fn draw(logits: &Array, words: Option<&Array>, rows: &[RowDraw]) -> Result<Array> {
    let shape = logits.shape();
    let fits = backend() == Backend::Cuda
        && !rows.is_empty()
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

/// The rows' parameters as the kernels read them (`SALA_DRAW_PARAMS` words a row: temperature's
/// bits, top-k, top-p's bits, ln(min-p)'s bits (−∞ when off, as the MLX ops compute it), the seed
/// and the draw), and how many draws every row has made since they were written, as a
/// [`shape_args`] array. The last array stays in use while the rows keep their settings and seeds
/// and advance together, as a batch's rows do from step to step: an array the host writes would
/// cost the GPU a page fault each step (eval/results/kernel-notes.md).
fn params(rows: &[RowDraw]) -> mlx_rs::error::Result<(Array, Array)> {
    // A row's words but its draw's two.
    type Fixed = [u32; PARAM_WORDS as usize - 2];
    struct Kept {
        fixed: Vec<Fixed>,
        draws: Vec<u64>,
        array: Array,
    }
    thread_local! {
        static KEPT: RefCell<Option<Kept>> = const { RefCell::new(None) };
    }
    let fixed: Vec<Fixed> = rows
        .iter()
        .map(|r| {
            let ln_min_p = if r.min_p > 0.0 { r.min_p.ln() } else { f32::NEG_INFINITY };
            let top_k = r.top_k.min(u32::MAX as usize) as u32;
            [r.temperature.to_bits(), top_k, r.top_p.to_bits(), ln_min_p.to_bits(), r.key.seed as u32, (r.key.seed >> 32) as u32]
        })
        .collect();
    let draws: Vec<u64> = rows.iter().map(|r| r.key.draw).collect();
    let kept = KEPT.with(|k| {
        let k = k.borrow();
        let k = k.as_ref().filter(|k| k.fixed == fixed)?;
        let advance = draws.first()?.checked_sub(*k.draws.first()?)?;
        let together = draws.iter().zip(&k.draws).all(|(now, then)| now.checked_sub(*then) == Some(advance));
        (together && advance < 1 << 30).then(|| (k.array.clone(), advance))
    });
    let (array, advance) = match kept {
        Some(kept) => kept,
        None => {
            let words: Vec<u32> = fixed.iter().zip(&draws).flat_map(|(f, &d)| f.iter().copied().chain([d as u32, (d >> 32) as u32])).collect();
            let array = Array::from_slice(&words, &[rows.len() as i32, PARAM_WORDS]);
            KEPT.with(|k| *k.borrow_mut() = Some(Kept { fixed, draws, array: array.clone() }));
            (array, 0)
        }
    };
    Ok((array, shape_args(&[advance as usize])?))
}

fn draw_cuda(logits: &Array, words: Option<&Array>, rows: &[RowDraw]) -> mlx_rs::error::Result<Array> {
    let n = rows.len() as i32;
    let vocab = logits.shape()[1];
    let run = |source: &'static KernelSource, inputs: &[&Array], grid, threads, outputs, template, init| {
        apply(source, inputs, Launch { grid, threads: (threads, 1, 1), outputs, template, init })
    };
    let (params, advance) = params(rows)?;
    let keys = run(&KEYS, &[&params, &advance], ((n + 31) / 32 * 32, 1, 1), 32, vec![(vec![n, KEY_WORDS], Dtype::Uint32)], vec![], None)?;
    // Without a mask the kernels never read `words`: the parameters stand in.
    let words_in = words.unwrap_or(&params);
    let types = |threads: i32| vec![("T", TemplateArg::Type(logits.dtype())), ("MASK", TemplateArg::Bool(words.is_some())), ("THREADS", TemplateArg::Int(threads))];
    let sliced = (n * SLICES * SLICE_THREADS, 1, 1);
    let scan_outputs = vec![(vec![n * SLICES], Dtype::Float32), (vec![n * SLICES], Dtype::Int32)];
    let parts = run(&SCAN, &[logits, words_in, &params], sliced, SLICE_THREADS, scan_outputs, types(SLICE_THREADS), None)?;
    let (part_v, part_i) = (&parts[0], &parts[1]);
    let thresholds = rows.iter().any(|r| r.temperature > 0.0 && ((r.top_k > 0 && r.top_k < vocab as usize) || r.top_p < 1.0));
    let floors = if thresholds {
        let hist_output = vec![(vec![n, SLICES, HIST_WORDS], Dtype::Uint32)];
        let hist = run(&BINS, &[logits, words_in, &params, part_v, part_i], sliced, SLICE_THREADS, hist_output, types(SLICE_THREADS), None)?;
        let inputs = [logits, words_in, &params, part_v, part_i, &hist[0]];
        let floors_output = vec![(vec![n.max(MIN_ROWS)], Dtype::Uint32)];
        let floors = run(&FLOOR, &inputs, (n * ROW_THREADS, 1, 1), ROW_THREADS, floors_output, types(ROW_THREADS), None)?;
        floors.into_iter().next()
    } else {
        None
    };
    let mut template = types(SLICE_THREADS);
    template.push(("FLOORED", TemplateArg::Bool(floors.is_some())));
    let outputs = vec![(vec![n], Dtype::Uint32), (vec![n * SLICES], Dtype::Float32), (vec![n * SLICES], Dtype::Int32)];
    // The pick counts each row's finished slices in `keys`, where the keys' launch zeroed them.
    let inputs = [logits, words_in, &params, &keys[0], part_v, part_i, floors.as_ref().unwrap_or(&params)];
    let picked = run(&PICK, &inputs, sliced, SLICE_THREADS, outputs, template, None)?;
    picked.into_iter().next().ok_or_else(|| mlx_rs::error::Exception::custom("the draw kernel gave no output"))
}

/// The draw kernel against [`draw_mlx`] on bfloat16 logits spread over ±8 (vocabulary 3000, so
/// the thresholds fall inside histogram bins): greedy, each filter alone and together, and
/// under a mask. Tokens must match exactly.
pub static DRAW_CHECK: KernelCheck = KernelCheck { name: "draw", backends: CUDA_ONLY, run: check_draw };

fn check_draw() -> Verdict {
    let vocab = 3000;
    let base = RowDraw { temperature: 0.8, top_k: 0, top_p: 1.0, min_p: 0.0, key: device_sampler::DrawKey::default() };
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
    .map(|(i, r)| RowDraw { key: device_sampler::DrawKey::new(11, i as u64), ..r })
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

#[cfg(test)]
mod tests {
    use super::{params, PARAM_WORDS};
    use crate::engine::device_sampler::{DrawKey, RowDraw};

    /// The parameters' array as written (`PARAM_WORDS` a row) and the draws since, from the shape
    /// of `advance`.
    fn written(rows: &[RowDraw]) -> (Vec<u32>, usize) {
        let (array, advance) = params(rows).unwrap();
        assert_eq!(array.shape(), [rows.len() as i32, PARAM_WORDS]);
        (array.as_slice::<u32>().to_vec(), advance.shape()[0] as usize - 1)
    }

    /// Each row's draw as written (its last two words).
    fn draws(words: &[u32]) -> Vec<u64> {
        words.chunks(PARAM_WORDS as usize).map(|w| (w[7] as u64) << 32 | w[6] as u64).collect()
    }

    #[test]
    fn parameters_stay_while_rows_advance_together() {
        let base = RowDraw { temperature: 0.7, top_k: 5, top_p: 0.9, min_p: 0.0, key: DrawKey::default() };
        let mut rows = vec![RowDraw { key: DrawKey::new(3, 0), ..base }, RowDraw { key: DrawKey::new(u64::MAX, 1 << 40), ..base }];
        let (first, advance) = written(&rows);
        assert_eq!((draws(&first), advance), (vec![0, 1 << 40], 0));
        // Each row's settings and seed where the kernels read them.
        assert_eq!(&first[..6], &[0.7f32.to_bits(), 5, 0.9f32.to_bits(), f32::NEG_INFINITY.to_bits(), 3, 0]);
        assert_eq!(&first[8 + 4..8 + 6], &[u32::MAX, u32::MAX]);
        // Every row one draw further, twice: the same array, so many draws on.
        for step in 1..=2 {
            rows.iter_mut().for_each(|r| r.key.draw += 1);
            assert_eq!(written(&rows), (first.clone(), step));
        }
        // A row ahead of the others, a seed or a setting changed, draws going back, fewer rows:
        // written anew.
        rows[0].key.draw += 2;
        rows[1].key.draw += 1;
        let (words, advance) = written(&rows);
        assert_eq!((draws(&words), advance), (vec![4, (1 << 40) + 3], 0));
        rows[1].key.seed = 9;
        let (words, advance) = written(&rows);
        assert_eq!((&words[8 + 4..8 + 6], advance), (&[9, 0][..], 0));
        rows[0].top_p = 0.8;
        let (words, advance) = written(&rows);
        assert_eq!((words[2], advance), (0.8f32.to_bits(), 0));
        rows.iter_mut().for_each(|r| r.key.draw -= 1);
        let (words, advance) = written(&rows);
        assert_eq!((draws(&words), advance), (vec![3, (1 << 40) + 2], 0));
        let (words, advance) = written(&rows[..1]);
        assert_eq!((draws(&words), advance), (vec![3], 0));
    }
}
