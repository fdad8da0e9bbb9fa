//! Prompt products in FP8 (`cuda/fp8_gemm.cu`; Hopper's warpgroup tensor cores, wgmma on e4m3):
//! y = x · Wᵀ with x and W each rounded to float8 e4m3 under one scale a row ([`RowsE4m3`]), the
//! sums in float32 at twice bf16's rate. Not the exact product, so the models take it only when
//! asked (`--prompt-fp8`; the loss is measured in eval/results). [`rows_to_e4m3_mlx`],
//! [`quantized_to_e4m3_mlx`] and [`product_mlx`] are the same arithmetic in MLX ops: the kernels'
//! oracles and the form that runs everywhere else.

use super::custom::{apply, backend, hopper, Backend, KernelSource, Launch, TemplateArg};
use super::selfcheck::{self, sample, verify, KernelCheck, Verdict, CUDA_ONLY};
use crate::engine::ops::{from_fp8, to_fp8};
use mlx_rs::{error::Result, ops, Array, Dtype};

const HEADER: &str = concat!(include_str!("../../cuda/mma.cu"), include_str!("../../cuda/wgmma.cu"), include_str!("../../cuda/fp8_gemm.cu"));

/// e4m3's largest finite value: a row's largest magnitude maps to it.
const E4M3_MAX: f32 = 448.0;

static ROWS: KernelSource = KernelSource {
    name: "sala_rows_to_e4m3",
    inputs: &["x"],
    outputs: &["q", "s"],
    cuda_header: HEADER,
    cuda_body: "sala_rows_to_e4m3<T, TILE_ROWS>(x, x_shape[0], x_shape[1], q, s);",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: true,
    shared_memory: 0,
};

static QUANTIZED: KernelSource = KernelSource {
    name: "sala_quantized_to_e4m3",
    inputs: &["packed", "scales", "biases"],
    outputs: &["q", "s"],
    cuda_header: HEADER,
    cuda_body: "sala_quantized_to_e4m3<T, GROUP, BITS, TILE_ROWS>(packed, scales, biases, packed_shape[0], scales_shape[1] * GROUP, q, s);",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: true,
    shared_memory: 0,
};

/// How the product tiles its outputs: 128 rows of x by 256 rows of W a block of two warpgroups,
/// over a ring of 4 k tiles of 128 bytes (`cuda/fp8_gemm.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tiling {
    /// x and W in the tiled layout ([`RowsE4m3::tile_rows`]), each stage two bulk copies by a
    /// producer warp: the models' form.
    Bulk,
    /// Row-major x and W, copied by every thread (cp.async), with a barrier a k tile: slower, the
    /// bench's comparison (eval/results/2026-12-04-h200-fp8-prompt).
    Wide,
}

impl Tiling {
    fn source(self) -> &'static KernelSource {
        match self {
            Tiling::Bulk => &PRODUCT_BULK,
            Tiling::Wide => &PRODUCT_WIDE,
        }
    }

    /// Threads a block: the bulk form's producer warp besides the two warpgroups.
    fn threads(self) -> i32 {
        match self {
            Tiling::Bulk => 288,
            Tiling::Wide => 256,
        }
    }
}

/// The rows of x and of W a block takes, and the ring's stages.
const TILE_M: i32 = 128;
const TILE_N: i32 = 256;
const STAGES: i32 = 4;

/// Shared memory of the product: its stages of 128 + 256 rows of 128 bytes, 1024 to align them,
/// and two barriers of 8 bytes a stage.
const SHARED_BYTES: i32 = STAGES * (TILE_M + TILE_N) * 128 + 1024 + 16 * STAGES;

static PRODUCT_BULK: KernelSource = KernelSource {
    name: "sala_gemm_e4m3_bulk",
    inputs: &["xq", "xs", "wq", "ws"],
    outputs: &["y"],
    cuda_header: HEADER,
    // The tiled inputs' shapes count tiles: M and N are the scales' lengths, and x's tiles are
    // its bands of 128 rows times its k tiles.
    cuda_body: "sala_gemm_e4m3_bulk<T, BN, STAGES>(xq, xs, wq, ws, xs_shape[0], ws_shape[0], xq_shape[0] / ((xs_shape[0] + 127) / 128) * 128, y);",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: true,
    shared_memory: SHARED_BYTES,
};

static PRODUCT_WIDE: KernelSource = KernelSource {
    name: "sala_gemm_e4m3",
    inputs: &["xq", "xs", "wq", "ws"],
    outputs: &["y"],
    cuda_header: HEADER,
    cuda_body: "sala_gemm_e4m3<T, BN, STAGES>(xq, xs, wq, ws, xq_shape[0], wq_shape[0], xq_shape[1], y);",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: true,
    shared_memory: SHARED_BYTES,
};

/// Rows of a matrix rounded to e4m3: row r ≈ `s[r]` · `q[r, :]`.
pub struct RowsE4m3 {
    /// e4m3 bits (uint8): `[rows, k]`, or in tiles (`tile_rows`).
    pub q: Array,
    /// `[rows]` float32: the row's largest magnitude over 448.
    pub s: Array,
    pub rows: i32,
    pub k: i32,
    /// `None`: `q` is row-major. `Some(t)`: `q` is `[tiles, t · 128]`, tiles of t rows by 128 bytes
    /// (rows and k padded with zeros), each the image of shared memory the bulk product copies
    /// whole (`cuda/fp8_gemm.cu`, sala_e4m3_offset).
    pub tile_rows: Option<i32>,
}

impl RowsE4m3 {
    /// The rounded rows as values of `dtype` `[rows, k]`, scales applied.
    pub fn values(&self, dtype: Dtype) -> Result<Array> {
        from_fp8(&self.row_major()?, Dtype::Float32)?.multiply(self.s.reshape(&[-1, 1])?)?.as_dtype(dtype)
    }

    /// `q` row-major `[rows, k]` (gathered from its tiles if tiled).
    pub fn row_major(&self) -> Result<Array> {
        let Some(t) = self.tile_rows else { return Ok(self.q.clone()) };
        let (rows, k) = (self.rows as usize, self.k as usize);
        let k_tiles = k.div_ceil(128);
        let mut index = Vec::with_capacity(rows * k);
        for row in 0..rows {
            let (band, r) = (row / t as usize, row % t as usize);
            for col in 0..k {
                let chunk = (col & 127) >> 4;
                index.push(((band * k_tiles + (col >> 7)) * t as usize * 128 + r * 128 + ((chunk ^ (r & 7)) << 4) + (col & 15)) as u32);
            }
        }
        self.q.reshape(&[-1])?.take_axis(Array::from_slice(&index, &[rows as i32, k as i32]), 0)
    }

    /// Rows and k of `q` as its kernels lay it out.
    fn q_shape(rows: i32, k: i32, tile_rows: Option<i32>) -> Vec<i32> {
        match tile_rows {
            None => vec![rows, k],
            Some(t) => vec![(rows + t - 1) / t * ((k + 127) / 128), t * 128],
        }
    }
}

/// Whether this process multiplies on the FP8 kernels: a CUDA GPU of compute capability 9 (wgmma
/// is Hopper's alone) whose self-check passed.
pub fn available() -> bool {
    backend() == Backend::Cuda && hopper() && selfcheck::enabled(&FP8_CHECK)
}


/// Whether the kernels take a product of inner size `k` into `n` outputs: k a multiple of 16
/// (16-byte copies of e4m3 rows), n even (outputs stored in pairs).
pub fn supports(k: i32, n: i32) -> bool {
    k > 0 && k % 16 == 0 && n > 0 && n % 2 == 0
}

/// The layout the models' product wants for W: tiles of 256 rows ([`Tiling::Bulk`]) where the
/// kernels run, row-major elsewhere.
pub fn weight_tile_rows() -> Option<i32> {
    available().then_some(TILE_N)
}

/// x `[rows, K]` rounded to e4m3 a row, row-major or in tiles of `tile_rows`: the kernel on CUDA;
/// elsewhere [`rows_to_e4m3_mlx`], row-major.
pub fn rows_to_e4m3(x: &Array, tile_rows: Option<i32>) -> Result<RowsE4m3> {
    let k = x.shape()[1];
    let fits = matches!(x.dtype(), Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32) && k % 16 == 0;
    if !(fits && available()) {
        return rows_to_e4m3_mlx(x);
    }
    rows_to_e4m3_cuda(x, tile_rows)
}

fn rows_to_e4m3_cuda(x: &Array, tile_rows: Option<i32>) -> Result<RowsE4m3> {
    let (rows, k) = (x.shape()[0], x.shape()[1]);
    let blocks = tile_rows.map_or(rows, |t| (rows + t - 1) / t * t);
    let out = apply(
        &ROWS,
        &[x],
        Launch {
            grid: (blocks * 256, 1, 1),
            threads: (256, 1, 1),
            outputs: vec![(RowsE4m3::q_shape(rows, k, tile_rows), Dtype::Uint8), (vec![rows], Dtype::Float32)],
            template: vec![("T", TemplateArg::Type(x.dtype())), ("TILE_ROWS", TemplateArg::Int(tile_rows.unwrap_or(0)))],
            init: None,
        },
    )?;
    let mut out = out.into_iter();
    Ok(RowsE4m3 { q: out.next().expect("two outputs"), s: out.next().expect("two outputs"), rows, k, tile_rows })
}

/// [`rows_to_e4m3`] in MLX ops: each value times 448 / (its row's largest magnitude), to e4m3.
pub fn rows_to_e4m3_mlx(x: &Array) -> Result<RowsE4m3> {
    let v = x.as_dtype(Dtype::Float32)?;
    let amax = ops::abs(&v)?.max_axis(-1, true)?;
    scaled_to_e4m3(&v, &amax)
}

/// `v` `[rows, K]` (float32) over `amax` `[rows, 1]`, as the kernels round it: inv = 448 / amax (0
/// for a row of zeros), then e4m3 of v · inv.
fn scaled_to_e4m3(v: &Array, amax: &Array) -> Result<RowsE4m3> {
    let zero = Array::from_f32(0.0);
    let positive = ops::gt(amax, &zero)?;
    let inv = ops::select(&positive, &Array::from_f32(E4M3_MAX).divide(ops::select(&positive, amax, Array::from_f32(1.0))?)?, &zero)?;
    let (rows, k) = (v.shape()[0], v.shape()[1]);
    Ok(RowsE4m3 { q: to_fp8(&v.multiply(&inv)?)?, s: amax.divide(Array::from_f32(E4M3_MAX))?.reshape(&[-1])?, rows, k, tile_rows: None })
}

/// An MLX `bits`-bit matrix (`packed` `[N, K · bits / 32]`, `scales` and `biases` `[N, K /
/// group]`) rounded to e4m3 a row straight from its packed form, row-major or in tiles of
/// `tile_rows`: the kernel on CUDA; elsewhere [`quantized_to_e4m3_mlx`], row-major.
pub fn quantized_to_e4m3(packed: &Array, scales: &Array, biases: &Array, group: i32, bits: i32, tile_rows: Option<i32>) -> Result<RowsE4m3> {
    let fits = matches!(bits, 4 | 8)
        && matches!(group, 32 | 64 | 128)
        && packed.dtype() == Dtype::Uint32
        && matches!(scales.dtype(), Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32)
        && biases.dtype() == scales.dtype()
        && packed.ndim() == 2
        && scales.shape()[1] * group * bits / 32 == packed.shape()[1];
    if !(fits && available()) {
        return quantized_to_e4m3_mlx(packed, scales, biases, group, bits);
    }
    quantized_to_e4m3_cuda(packed, scales, biases, group, bits, tile_rows)
}

fn quantized_to_e4m3_cuda(packed: &Array, scales: &Array, biases: &Array, group: i32, bits: i32, tile_rows: Option<i32>) -> Result<RowsE4m3> {
    let (n, k) = (packed.shape()[0], scales.shape()[1] * group);
    let blocks = tile_rows.map_or(n, |t| (n + t - 1) / t * t);
    let out = apply(
        &QUANTIZED,
        &[packed, scales, biases],
        Launch {
            grid: (blocks * 256, 1, 1),
            threads: (256, 1, 1),
            outputs: vec![(RowsE4m3::q_shape(n, k, tile_rows), Dtype::Uint8), (vec![n], Dtype::Float32)],
            template: vec![
                ("T", TemplateArg::Type(scales.dtype())),
                ("GROUP", TemplateArg::Int(group)),
                ("BITS", TemplateArg::Int(bits)),
                ("TILE_ROWS", TemplateArg::Int(tile_rows.unwrap_or(0))),
            ],
            init: None,
        },
    )?;
    let mut out = out.into_iter();
    Ok(RowsE4m3 { q: out.next().expect("two outputs"), s: out.next().expect("two outputs"), rows: n, k, tile_rows })
}

/// [`quantized_to_e4m3`] in MLX ops: a row's largest magnitude taken over its groups' ends (bias,
/// and scale · (2^bits − 1) + bias: MLX's quantization puts each group's extremes there), the
/// dequantized values in float32 rounded under it.
pub fn quantized_to_e4m3_mlx(packed: &Array, scales: &Array, biases: &Array, group: i32, bits: i32) -> Result<RowsE4m3> {
    let (s, b) = (scales.as_dtype(Dtype::Float32)?, biases.as_dtype(Dtype::Float32)?);
    let top = s.multiply(Array::from_f32(((1 << bits) - 1) as f32))?.add(&b)?;
    let amax = ops::maximum(ops::abs(&b)?, ops::abs(&top)?)?.max_axis(-1, true)?;
    scaled_to_e4m3(&ops::dequantize(packed, &s, &b, group, bits)?, &amax)
}

/// y `[M, N]` in `dtype` = xs · ws · (xq · wqᵀ) on the FP8 tensor cores, for rows that
/// [`supports`] takes: tiled x and W (tiles of 128 and 256 rows) in [`Tiling::Bulk`], row-major
/// ones in [`Tiling::Wide`].
pub fn product(x: &RowsE4m3, w: &RowsE4m3, dtype: Dtype) -> Result<Array> {
    let tiling = match (x.tile_rows, w.tile_rows) {
        (None, None) => Tiling::Wide,
        (Some(TILE_M), Some(TILE_N)) => Tiling::Bulk,
        (a, b) => {
            return Err(mlx_rs::error::Exception::custom(format!("FP8 product of x in tiles of {a:?} rows and W in tiles of {b:?}: no kernel")))
        }
    };
    let (m, n) = (x.rows, w.rows);
    let out = apply(
        tiling.source(),
        &[&x.q, &x.s, &w.q, &w.s],
        Launch {
            grid: ((n + TILE_N - 1) / TILE_N * tiling.threads(), (m + TILE_M - 1) / TILE_M, 1),
            threads: (tiling.threads(), 1, 1),
            outputs: vec![(vec![m, n], dtype)],
            template: vec![("T", TemplateArg::Type(dtype)), ("BN", TemplateArg::Int(TILE_N)), ("STAGES", TemplateArg::Int(STAGES))],
            init: None,
        },
    )?;
    Ok(out.into_iter().next().expect("one output"))
}

/// [`product`] in MLX ops, in float32: the e4m3 values multiplied exactly (3-bit mantissas are
/// exact in TF32 too), the row scales applied after.
pub fn product_mlx(x: &RowsE4m3, w: &RowsE4m3) -> Result<Array> {
    let sums = from_fp8(&x.row_major()?, Dtype::Float32)?.matmul(from_fp8(&w.row_major()?, Dtype::Float32)?.t())?;
    sums.multiply(x.s.reshape(&[-1, 1])?)?.multiply(w.s.reshape(&[1, -1])?)
}

/// x `[…, K]` · Wᵀ for W already rounded: x rounded a row (in W's layout's companion: tiles of
/// 128 rows when W is tiled), then [`product`] where the kernels run, [`product_mlx`]
/// elsewhere; y in x's dtype.
pub fn matmul_t(x: &Array, w: &RowsE4m3) -> Result<Array> {
    let k = x.shape()[x.ndim() - 1];
    let mut out_shape = x.shape().to_vec();
    *out_shape.last_mut().expect("x has a last axis") = w.rows;
    let kernels = available() && supports(k, w.rows) && matches!(x.dtype(), Dtype::Bfloat16 | Dtype::Float16);
    let rows = rows_to_e4m3(&x.reshape(&[-1, k])?, w.tile_rows.map(|_| TILE_M).filter(|_| kernels))?;
    let y = if kernels && rows.tile_rows.is_some() == w.tile_rows.is_some() {
        product(&rows, w, x.dtype())?
    } else {
        product_mlx(&rows, w)?.as_dtype(x.dtype())?
    };
    y.reshape(&out_shape)
}

/// The kernels against their MLX-ops versions: x in bf16 a partial tile of rows, an 8-bit
/// matrix in groups of 64 and a 4-bit one in groups of 32 (a partial tile of outputs), four k
/// tiles (past the ring of stages), row-major and tiled; the rounded values compared as values,
/// then the product.
pub static FP8_CHECK: KernelCheck = KernelCheck { name: "fp8_gemm", backends: CUDA_ONLY, run: check_fp8 };

fn check_fp8() -> Verdict {
    if backend() == Backend::Cuda && !hopper() {
        return Err("wgmma needs compute capability 9 (Hopper)".into());
    }
    for (bits, tiles) in [(8, None), (4, Some((TILE_M, TILE_N)))] {
        let group = if bits == 8 { 64 } else { 32 };
        verify(
            || {
                let x = sample(&[40, 512], 70, Dtype::Bfloat16)?;
                let (p, s, b) = ops::quantize(&sample(&[200, 512], 71, Dtype::Float32)?, group, bits)?;
                Ok((x, p, s.as_dtype(Dtype::Bfloat16)?, b.as_dtype(Dtype::Bfloat16)?))
            },
            |(x, p, s, b)| {
                let rows = rows_to_e4m3_cuda(x, tiles.map(|t| t.0))?;
                let w = quantized_to_e4m3_cuda(p, s, b, group, bits, tiles.map(|t| t.1))?;
                Ok(vec![rows.values(Dtype::Float32)?, w.values(Dtype::Float32)?, product(&rows, &w, Dtype::Bfloat16)?])
            },
            |(x, p, s, b)| {
                let (rows, w) = (rows_to_e4m3_mlx(x)?, quantized_to_e4m3_mlx(p, s, b, group, bits)?);
                Ok(vec![rows.values(Dtype::Float32)?, w.values(Dtype::Float32)?, product_mlx(&rows, &w)?])
            },
        )
        .map_err(|reason| format!("{bits} bits, groups of {group}, tiles {tiles:?}: {reason}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ops::{to_vec_f32, to_vec_i32};

    #[test]
    fn rows_round_to_e4m3_with_their_largest_value_at_448() {
        let key = mlx_rs::random::key(5).unwrap();
        let x = mlx_rs::random::normal::<f32>(&[3, 96], None, None, &key).unwrap();
        let x = ops::concatenate(&[x, Array::zeros::<f32>(&[1, 96]).unwrap()], 0).unwrap();
        let rows = rows_to_e4m3_mlx(&x).unwrap();
        assert_eq!(rows.q.dtype(), Dtype::Uint8);
        let (v, got, s) = (to_vec_f32(&x).unwrap(), to_vec_f32(&rows.values(Dtype::Float32).unwrap()).unwrap(), to_vec_f32(&rows.s).unwrap());
        let codes = to_vec_i32(&rows.q).unwrap();
        for r in 0..4 {
            let row = &v[r * 96..(r + 1) * 96];
            let amax = row.iter().fold(0f32, |a, &e| a.max(e.abs()));
            assert_eq!(s[r], amax / 448.0);
            for (i, &e) in row.iter().enumerate() {
                let g = got[r * 96 + i];
                if amax == 0.0 {
                    assert_eq!(g, 0.0);
                    continue;
                }
                // Three mantissa bits: within 2^-4 of the value (normal range), or of an e4m3
                // subnormal step (2^-9 of 448 / amax) near zero.
                let bound = (e.abs() / 16.0).max(amax / 448.0 * 2f32.powi(-10)) * 1.0001;
                assert!((g - e).abs() <= bound, "{e} → {g}");
                if e.abs() == amax {
                    // 0x7e: 448, the largest finite e4m3 (0xfe for negative values).
                    assert_eq!(codes[r * 96 + i] & 0x7f, 0x7e);
                }
            }
        }
    }

    #[test]
    fn an_8_bit_matrix_rounds_to_e4m3_under_its_row_maximum() {
        let key = mlx_rs::random::key(6).unwrap();
        let w = mlx_rs::random::normal::<f32>(&[5, 256], None, None, &key).unwrap();
        let (p, s, b) = ops::quantize(&w, 64, 8).unwrap();
        let dequantized = ops::dequantize(&p, &s, &b, 64, 8).unwrap();
        let rows = quantized_to_e4m3_mlx(&p, &s, &b, 64, 8).unwrap();
        let direct = rows_to_e4m3_mlx(&dequantized).unwrap();
        // The groups' ends are where MLX puts each group's extremes: the row maximum taken from
        // them is the dequantized row's own, to a rounding.
        let (a, d) = (to_vec_f32(&rows.s).unwrap(), to_vec_f32(&direct.s).unwrap());
        for (x, y) in a.iter().zip(&d) {
            assert!((x - y).abs() <= 1e-5 * y, "row scale {x} against {y}");
        }
        let err = rel(&rows.values(Dtype::Float32).unwrap(), &dequantized);
        assert!(err > 0.0 && err < 0.05, "e4m3 of the dequantized matrix off by {err}");
    }

    #[test]
    fn the_fp8_form_stays_near_the_exact_product() {
        // Both factors rounded to three mantissa bits: a few percent of the product's size.
        let (m, n, k) = (6, 8, 512);
        let x = mlx_rs::random::normal::<f32>(&[m, k], None, None, &mlx_rs::random::key(8).unwrap()).unwrap();
        let w = mlx_rs::random::normal::<f32>(&[n, k], None, None, &mlx_rs::random::key(9).unwrap()).unwrap();
        let (p, s, b) = ops::quantize(&w, 64, 8).unwrap();
        let exact = x.matmul(ops::dequantize(&p, &s, &b, 64, 8).unwrap().t()).unwrap();
        let fp8 = matmul_t(&x, &quantized_to_e4m3(&p, &s, &b, 64, 8, None).unwrap()).unwrap();
        assert_eq!(fp8.shape(), &[m, n]);
        let err = rel(&fp8, &exact);
        assert!(err > 0.0 && err < 0.06, "FP8 product off by {err}");
    }

    fn rel(a: &Array, b: &Array) -> f32 {
        let (a, b) = (to_vec_f32(a).unwrap(), to_vec_f32(b).unwrap());
        let diff: f32 = a.iter().zip(&b).map(|(x, y)| (x - y).powi(2)).sum();
        (diff / b.iter().map(|y| y * y).sum::<f32>()).sqrt()
    }
}
