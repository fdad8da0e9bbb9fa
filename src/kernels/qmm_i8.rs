//! The 8-bit prompt product on int8 tensor cores (`cuda/qmm_i8.cu`, CUDA only): y = x · Wᵀ for
//! many rows of x (a prompt chunk) and an MLX 8-bit matrix, with x first rounded to 8 bits per row
//! and group of the matrix's group size ([`quantize_rows_i8`]). Not the exact product: x's
//! rounding departs from it (the weights' arithmetic, the bias term and the sums are exact to
//! float32). [`quantized_matmul_t_i8_mlx`] is the same arithmetic in MLX ops, the kernel's oracle
//! and its CPU form. Not used by the models: slower than their dequantize + bf16 matmul
//! (eval/results/2026-12-02-h200-qmm-i8).

use super::custom::{apply, backend, Backend, KernelSource, Launch, TemplateArg};
use mlx_rs::{error::Result, ops, Array, Dtype};

const HEADER: &str = concat!(include_str!("../../cuda/mma.cu"), include_str!("../../cuda/qmm_i8.cu"));

static QUANTIZE_ROWS: KernelSource = KernelSource {
    name: "sala_quantize_rows_i8",
    inputs: &["x"],
    outputs: &["xq", "xs", "sum_hi", "sum_lo"],
    cuda_header: HEADER,
    cuda_body: "sala_quantize_rows_i8<T, GROUP>(x, (size_t)x_shape[0] * x_shape[1] / GROUP, xq, xs, sum_hi, sum_lo);",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: true,
    shared_memory: 0,
};

static PRODUCT: KernelSource = KernelSource {
    name: "sala_qmm_i8",
    inputs: &["xq", "xs", "sum_hi", "sum_lo", "w", "scales", "biases"],
    outputs: &["y"],
    cuda_header: HEADER,
    cuda_body: "sala_qmm_i8<T, GROUP>(xq, xs, sum_hi, sum_lo, w, scales, biases, xq_shape[0], w_shape[0], xq_shape[1], y);",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: true,
    shared_memory: 0,
};

/// x `[rows, K]` rounded to 8 bits per row and group: x ≈ `xs` · `xq`, with the groups' sums of
/// x (for the biases' term) as `sum_hi` + `sum_lo` in x's dtype.
pub struct RowsI8 {
    /// `[rows, K]` int8, in −127 ..= 127.
    pub xq: Array,
    /// `[rows, K / group]` float32: the group's largest magnitude over 127.
    pub xs: Array,
    /// `[rows, K / group]` in x's dtype: each group's sum of x, rounded.
    pub sum_hi: Array,
    /// `[rows, K / group]` in x's dtype: what that rounding left out.
    pub sum_lo: Array,
}

/// Rows per block of the product and weight rows per block (`cuda/qmm_i8.cu`).
const TILE: i32 = 128;

/// Whether the int8 product takes x `[rows, K]` (bf16 or f16) and an MLX `bits`-bit matrix of
/// `group`-sized groups packed as `packed` `[N, K / 4]`: 8 bits, MLX's group sizes, K a multiple
/// of 64 with an even number of groups, and an even N.
pub fn supports(x: &Array, packed: &Array, group: i32, bits: i32) -> bool {
    let k = x.shape()[x.ndim() - 1];
    bits == 8
        && matches!(group, 32 | 64 | 128)
        && matches!(x.dtype(), Dtype::Bfloat16 | Dtype::Float16)
        && k % 64 == 0
        && (k / group) % 2 == 0
        && packed.ndim() == 2
        && packed.shape()[1] * 4 == k
        && packed.shape()[0] % 2 == 0
}

/// x `[rows, K]` rounded to 8 bits per row and `group` ([`RowsI8`]): the kernel on CUDA, MLX ops
/// elsewhere.
pub fn quantize_rows_i8(x: &Array, group: i32) -> Result<RowsI8> {
    if backend() != Backend::Cuda {
        return quantize_rows_i8_mlx(x, group);
    }
    let (rows, k) = (x.shape()[0], x.shape()[1]);
    let groups = k / group;
    let threads = rows * k / 8;
    let out = apply(
        &QUANTIZE_ROWS,
        &[x],
        Launch {
            grid: ((threads + 255) / 256 * 256, 1, 1),
            threads: (256, 1, 1),
            outputs: vec![
                (vec![rows, k], Dtype::Int8),
                (vec![rows, groups], Dtype::Float32),
                (vec![rows, groups], x.dtype()),
                (vec![rows, groups], x.dtype()),
            ],
            template: vec![("T", TemplateArg::Type(x.dtype())), ("GROUP", TemplateArg::Int(group))],
            init: None,
        },
    )?;
    let mut out = out.into_iter();
    let mut next = || out.next().expect("four outputs");
    Ok(RowsI8 { xq: next(), xs: next(), sum_hi: next(), sum_lo: next() })
}

/// [`quantize_rows_i8`] in MLX ops: the kernel's rounding (x · (127 / max), to nearest even,
/// within ±127).
pub fn quantize_rows_i8_mlx(x: &Array, group: i32) -> Result<RowsI8> {
    let (rows, k) = (x.shape()[0], x.shape()[1]);
    let groups = k / group;
    let v = x.as_dtype(Dtype::Float32)?.reshape(&[rows, groups, group])?;
    let amax = ops::abs(&v)?.max_axis(-1, true)?;
    let zero = Array::from_f32(0.0);
    let positive = ops::gt(&amax, &zero)?;
    let inv = ops::select(&positive, &Array::from_f32(127.0).divide(ops::select(&positive, &amax, Array::from_f32(1.0))?)?, &zero)?;
    let q = ops::clip(&ops::round(v.multiply(&inv)?, None)?, (-127.0f32, 127.0f32))?;
    let sum = v.sum_axis(-1, false)?;
    let sum_hi = sum.as_dtype(x.dtype())?;
    let sum_lo = sum.subtract(sum_hi.as_dtype(Dtype::Float32)?)?.as_dtype(x.dtype())?;
    Ok(RowsI8 {
        xq: q.as_dtype(Dtype::Int8)?.reshape(&[rows, k])?,
        xs: amax.divide(Array::from_f32(127.0))?.reshape(&[rows, groups])?,
        sum_hi,
        sum_lo,
    })
}

/// y = x · Wᵀ with x rounded to 8 bits ([`quantize_rows_i8`]), for x `[rows, K]` and an MLX 8-bit
/// matrix (`packed` `[N, K / 4]`, `scales` and `biases` `[N, K / group]`) that [`supports`]
/// takes; y in x's dtype. The int8 kernel on CUDA, [`quantized_matmul_t_i8_mlx`] elsewhere.
pub fn quantized_matmul_t_i8(x: &Array, packed: &Array, scales: &Array, biases: &Array, group: i32) -> Result<Array> {
    if backend() != Backend::Cuda {
        return quantized_matmul_t_i8_mlx(x, packed, scales, biases, group);
    }
    let rows = quantize_rows_i8(x, group)?;
    product(&rows, packed, scales, biases, group, x.dtype())
}

/// The product's kernel on rows already rounded.
pub fn product(rows: &RowsI8, packed: &Array, scales: &Array, biases: &Array, group: i32, dtype: Dtype) -> Result<Array> {
    let (m, n) = (rows.xq.shape()[0], packed.shape()[0]);
    let packed = packed.as_dtype(Dtype::Uint32)?;
    let out = apply(
        &PRODUCT,
        &[&rows.xq, &rows.xs, &rows.sum_hi, &rows.sum_lo, &packed, scales, biases],
        Launch {
            grid: ((n + TILE - 1) / TILE * 256, (m + TILE - 1) / TILE, 1),
            threads: (256, 1, 1),
            outputs: vec![(vec![m, n], dtype)],
            template: vec![("T", TemplateArg::Type(dtype)), ("GROUP", TemplateArg::Int(group))],
            init: None,
        },
    )?;
    Ok(out.into_iter().next().expect("one output"))
}

/// [`quantized_matmul_t_i8`] in MLX ops: x rounded as the kernel rounds it, then
/// [`product_mlx`], rounded to x's dtype.
pub fn quantized_matmul_t_i8_mlx(x: &Array, packed: &Array, scales: &Array, biases: &Array, group: i32) -> Result<Array> {
    product_mlx(&quantize_rows_i8_mlx(x, group)?, packed, scales, biases, group)?.as_dtype(x.dtype())
}

/// The product's arithmetic on rows already rounded, in float32: Σ_g xs · s · (xq · q) +
/// (sum_hi + sum_lo) · b.
pub fn product_mlx(rows: &RowsI8, packed: &Array, scales: &Array, biases: &Array, group: i32) -> Result<Array> {
    let (m, k) = (rows.xq.shape()[0], rows.xq.shape()[1]);
    let groups = k / group;
    let x_rounded = rows
        .xq
        .as_dtype(Dtype::Float32)?
        .reshape(&[m, groups, group])?
        .multiply(rows.xs.reshape(&[m, groups, 1])?)?
        .reshape(&[m, k])?;
    let (s, b) = (scales.as_dtype(Dtype::Float32)?, biases.as_dtype(Dtype::Float32)?);
    // s · q exactly (a 16-bit scale times an 8-bit integer fits float32's mantissa).
    let scaled = ops::dequantize(packed, &s, &ops::zeros_like(&s)?, group, 8)?;
    let sums = rows.sum_hi.as_dtype(Dtype::Float32)?.add(rows.sum_lo.as_dtype(Dtype::Float32)?)?;
    x_rounded.matmul(scaled.t())?.add(sums.matmul(b.t())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::ops::indexing::IndexOp;

    #[test]
    fn rows_round_to_eight_bits_within_half_a_step() {
        let key = mlx_rs::random::key(7).unwrap();
        let x = mlx_rs::random::normal::<f32>(&[3, 256], None, None, &key).unwrap();
        // One group of zeros: its scale and values are 0.
        let x = ops::concatenate(&[x.index((.., ..192)), Array::zeros::<f32>(&[3, 64]).unwrap()], 1).unwrap();
        let rows = quantize_rows_i8_mlx(&x, 64).unwrap();
        assert_eq!(rows.xq.dtype(), Dtype::Int8);
        let q: Vec<i8> = rows.xq.as_slice::<i8>().to_vec();
        let xs: Vec<f32> = rows.xs.as_slice::<f32>().to_vec();
        let v: Vec<f32> = x.as_slice::<f32>().to_vec();
        let (hi, lo) = (rows.sum_hi.as_slice::<f32>().to_vec(), rows.sum_lo.as_slice::<f32>().to_vec());
        for r in 0..3 {
            for g in 0..4 {
                let group = &v[r * 256 + g * 64..r * 256 + (g + 1) * 64];
                let amax = group.iter().fold(0f32, |a, &e| a.max(e.abs()));
                assert_eq!(xs[r * 4 + g], amax / 127.0);
                let sum: f32 = group.iter().sum();
                assert!((hi[r * 4 + g] + lo[r * 4 + g] - sum).abs() <= 1e-5 * (1.0 + sum.abs()));
                for (i, &e) in group.iter().enumerate() {
                    let qi = q[r * 256 + g * 64 + i];
                    assert_ne!(qi, i8::MIN, "within ±127");
                    if amax == 0.0 {
                        assert_eq!(qi, 0);
                    } else {
                        // Within half a step of the value, and the largest magnitude exactly ±127.
                        assert!((qi as f32 * amax / 127.0 - e).abs() <= amax / 254.0 * 1.0001, "{e} → {qi}");
                        if e.abs() == amax {
                            assert_eq!(qi.abs(), 127);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_int8_form_stays_near_the_exact_product() {
        // x rounded to 8 bits per group moves each term by at most 1/254 of its group's largest
        // value: the product moves, by far less than its size.
        let key = mlx_rs::random::key(11).unwrap();
        let (m, n, k) = (5, 6, 256);
        let x = mlx_rs::random::normal::<f32>(&[m, k], None, None, &key).unwrap();
        let w = mlx_rs::random::normal::<f32>(&[n, k], None, None, &mlx_rs::random::key(12).unwrap()).unwrap();
        let (p, s, b) = ops::quantize(&w, 64, 8).unwrap();
        let exact = x.matmul(ops::dequantize(&p, &s, &b, 64, 8).unwrap().t()).unwrap();
        let int8 = quantized_matmul_t_i8_mlx(&x, &p, &s, &b, 64).unwrap();
        let (e, i): (Vec<f32>, Vec<f32>) = (exact.as_slice::<f32>().to_vec(), int8.as_slice::<f32>().to_vec());
        let scale = e.iter().fold(0f32, |a, &v| a.max(v.abs()));
        let worst = e.iter().zip(&i).fold(0f32, |a, (x, y)| a.max((x - y).abs()));
        assert!(worst > 0.0 && worst < 0.02 * scale, "worst {worst} of {scale}");
    }
}
