//! Every GPU kernel against its MLX-ops version on fresh random inputs, and the kernels'
//! self-check on the device: every kernel passes it, and deliberately broken variants of a real
//! kernel (one computing a wrong value, one that does not compile) are switched off, their caller
//! getting the MLX-ops version's values. These need a GPU build of MLX (CUDA or Metal), so they are
//! `#[ignore]`d and show as ignored in a plain `cargo test`; `eval/device-tests.sh` runs them on
//! a GPU with `--include-ignored` (one test thread: MLX's default device is process-wide).
//! Included without a GPU, they fail.

use mlx_rs::{ops, ops::indexing::TryIndexOp, random, Array, Dtype};
use sala::engine::cache::{KvCache, KvFormat, KvParts};
use sala::engine::device::{select, DeviceKind};
use sala::engine::ops::{to_vec_f32, to_vec_i32};
use sala::kernels::custom::{apply, backend, Backend, KernelSource, Launch, TemplateArg};
use sala::kernels::selfcheck::{self, verify, KernelCheck, Status, Verdict, CUDA_AND_METAL};
use sala::kernels::gla::{alibi_slopes, simple_gla, simple_gla_mlx, simple_gla_recurrent, simple_gla_step};
use sala::kernels::kv::{append_token, append_token_mlx, KvColumns, RecentSlot};
use sala::kernels::lightning::{decode_step, decode_step_mlx, norm_gate, norm_gate_mlx, StepParams};
use sala::kernels::qmv::{
    epilogue_mlx, quantized_matmul_t, quantized_matmul_t_mlx, quantized_matmul_t_normed, quantized_matmul_t_then, with_tiling, Epilogue,
    GateIn, MmaTiling, QmvTiling, RmsNormIn,
};
use sala::kernels::rope::{rope_append, rope_append_mlx, QkHeads, RopeAngles};
use sala::kernels::sparse::{
    block_sparse_attention_gpu, block_sparse_prefill_cuda, decode_attention, decode_attention_mlx, heads_to_rows, reads_codes_in_place,
    with_decode_kernel, BlockSelection, DecodeKernel, DecodeQuery,
};
use sala::models::sala::infllm::{block_sparse_attention, block_sparse_attention_mlx, select_blocks_chunked, select_blocks_mlx, select_blocks_scored};

const NEEDS_GPU: &str = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored";

/// Makes the GPU the default device; a run without one fails (it would test nothing). Every kernel
/// must have passed its self-check, else the tests below would compare its MLX-ops version with
/// itself.
fn use_gpu() {
    assert!(select(Some(DeviceKind::Gpu)).is_ok() && backend() != Backend::Cpu, "{NEEDS_GPU}");
    let failed: Vec<String> = sala::models::kernel_checks()
        .into_iter()
        .filter_map(|check| {
            selfcheck::enabled(check);
            match selfcheck::status(check) {
                Status::Verified | Status::NotUsed => None,
                other => Some(format!("{}: {other:?}", check.name)),
            }
        })
        .collect();
    assert!(failed.is_empty(), "kernels that failed their self-check: {failed:#?}");
}

/// The GPU without the kernels' self-checks (which compile every kernel first: minutes on a fresh
/// machine, for nothing in a test of one kernel or of MLX's allocator): false, with `skipped:
/// why`, where it is not CUDA.
fn on_cuda_unchecked(why: &str) -> bool {
    assert!(select(Some(DeviceKind::Gpu)).is_ok() && backend() != Backend::Cpu, "{NEEDS_GPU}");
    if backend() != Backend::Cuda {
        eprintln!("skipped: {why}");
        return false;
    }
    true
}

fn randn(shape: &[i32], seed: u64, dtype: Dtype) -> Array {
    let key = random::key(seed).unwrap();
    random::normal::<f32>(shape, None, None, &key).unwrap().as_dtype(dtype).unwrap()
}

/// ‖a − b‖ / ‖b‖ over float32 copies.
fn rel_err(a: &Array, b: &Array) -> f32 {
    let (a, b) = (to_vec_f32(&a.as_dtype(Dtype::Float32).unwrap()).unwrap(), to_vec_f32(&b.as_dtype(Dtype::Float32).unwrap()).unwrap());
    assert_eq!(a.len(), b.len());
    assert!(a.iter().all(|x| x.is_finite()), "kernel output holds NaN/inf");
    let num: f64 = a.iter().zip(&b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt() as f32
}

#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn qmv_matches_mlx_quantized_matmul() {
    use_gpu();
    let mut seed = 10;
    for bits in [8, 4] {
        for (n, k) in [(4100, 4096), (256, 16384), (1000, 384), (1001, 384)] {
            // One input row in f16 and groups of 32 and 128 too (4 bits: the tensor-core form).
            let cases = [1, 3, 8, 13, 16]
                .into_iter()
                .flat_map(|rows| [(rows, Dtype::Bfloat16, 64), (rows, Dtype::Float32, 64)])
                .chain([(1, Dtype::Float16, 64), (1, Dtype::Bfloat16, 32), (1, Dtype::Bfloat16, 128)])
                // The tensor-core form with groups that span part of a 64-byte step and several.
                .chain([5, 16].into_iter().flat_map(|rows| [(rows, Dtype::Bfloat16, 32), (rows, Dtype::Bfloat16, 128)]));
            for (rows, dtype, group) in cases {
                seed += 3;
                let w = randn(&[n, k], seed, Dtype::Float32);
                let (packed, scales, biases) = ops::quantize(&w, group, bits).unwrap();
                let (scales, biases) = (scales.as_dtype(dtype).unwrap(), biases.as_dtype(dtype).unwrap());
                let x = randn(&[rows, k], seed + 1, dtype);
                let got = quantized_matmul_t(&x, &packed, &scales, &biases, group, bits).unwrap();
                // The oracle in float32 throughout.
                let f = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
                let want = quantized_matmul_t_mlx(&f(&x), &packed, &f(&scales), &f(&biases), group, bits).unwrap();
                assert_eq!(got.shape(), &[rows, n]);
                let err = rel_err(&got, &want);
                let tol = if dtype == Dtype::Float32 { 1e-5 } else { 8e-3 };
                assert!(err < tol, "q{bits} {n}x{k} rows {rows} {dtype:?} group {group}: relative error {err}");
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn qmv_epilogues_match_mlx_operations() {
    use_gpu();
    let f = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
    let mut seed = 500;
    for bits in [8, 4] {
        // (rows of W, K): the SwiGLU form reads W as [gate; up], 2F rows.
        for (n, k) in [(2 * 2048, 4096), (4096, 16384), (2 * 136, 384)] {
            for rows in [1, 3, 11] {
                for dtype in [Dtype::Bfloat16, Dtype::Float32] {
                    seed += 5;
                    let w = randn(&[n, k], seed, Dtype::Float32);
                    let (packed, scales, biases) = ops::quantize(&w, 64, bits).unwrap();
                    let (s, b) = (scales.as_dtype(dtype).unwrap(), biases.as_dtype(dtype).unwrap());
                    let x = randn(&[rows, k], seed + 1, dtype);
                    let residual = randn(&[rows, n], seed + 2, dtype);
                    // The oracle takes alpha as the kernels do: rounded to the dtype.
                    let alpha = 0.183;
                    let alpha_t = to_vec_f32(&f(&Array::from_f32(alpha).as_dtype(dtype).unwrap())).unwrap()[0];
                    let tol = if dtype == Dtype::Float32 { 1e-5 } else { 1e-2 };
                    let cases = [
                        ("swiglu", Epilogue::SwiGlu, Epilogue::SwiGlu, n / 2),
                        (
                            "residual",
                            Epilogue::Residual { residual: &residual, alpha },
                            Epilogue::Residual { residual: &f(&residual), alpha: alpha_t },
                            n,
                        ),
                    ];
                    for (name, epilogue, oracle_epilogue, width) in cases {
                        let got = quantized_matmul_t_then(&x, &packed, &s, &b, 64, bits, epilogue).unwrap();
                        // The oracle: MLX's product and operations in float32 throughout.
                        let product = quantized_matmul_t_mlx(&f(&x), &packed, &f(&s), &f(&b), 64, bits).unwrap();
                        let want = epilogue_mlx(&product, oracle_epilogue).unwrap();
                        assert_eq!(got.shape(), &[rows, width]);
                        assert_eq!(got.dtype(), dtype);
                        let err = rel_err(&got, &want);
                        assert!(err < tol, "{name} q{bits} {n}x{k} rows {rows} {dtype:?}: relative error {err}");
                    }
                }
            }
        }
    }
}

/// The tilings other than the defaults (the kernel benchmark's sweep picks among them): each
/// split of K, number of outputs per warp and of loads in flight gives MLX's product, for K that does and that
/// does not divide evenly among the warps. One test a width and shape, as each compiles a kernel
/// per tiling: eval/device-tests.sh runs the tests as processes side by side, where in one
/// process the two widths outlast a device call.
macro_rules! qmv_tiling_tests {
    ($($name:ident: $bits:expr, $n:expr, $k:expr, seed $seed:expr;)*) => {$(
        #[test]
        #[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
        fn $name() {
            qmv_tilings_match_mlx_quantized_matmul($bits, $n, $k, $seed);
        }
    )*};
}

// The seeds each case took when one test ran them all.
qmv_tiling_tests! {
    qmv_tilings_match_mlx_quantized_matmul_q8_1030x4096: 8, 1030, 4096, seed 907;
    qmv_tilings_match_mlx_quantized_matmul_q8_512x16384: 8, 512, 16384, seed 914;
    qmv_tilings_match_mlx_quantized_matmul_q8_260x1408: 8, 260, 1408, seed 921;
    qmv_tilings_match_mlx_quantized_matmul_q4_1030x4096: 4, 1030, 4096, seed 928;
    qmv_tilings_match_mlx_quantized_matmul_q4_512x16384: 4, 512, 16384, seed 935;
    qmv_tilings_match_mlx_quantized_matmul_q4_260x1408: 4, 260, 1408, seed 942;
}

/// A quantized product's inputs (weights in groups of 64) for the kernels' epilogue checks.
struct QuantizedProduct<'a> {
    x: &'a Array,
    packed: &'a Array,
    scales: &'a Array,
    biases: &'a Array,
    bits: i32,
    residual: &'a Array,
    alpha: f32,
}

impl QuantizedProduct<'_> {
    /// The plain product, its residual form and its SwiGLU under the tilings given, each against
    /// MLX's float32 `product` and the MLX epilogue.
    fn assert_every_epilogue_matches(&self, product: &Array, general: Option<QmvTiling>, mma: Option<MmaTiling>, what: &str) {
        let f = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
        let (x, p, s, b, bits) = (self.x, self.packed, self.scales, self.biases, self.bits);
        let got = with_tiling(general, mma, || quantized_matmul_t(x, p, s, b, 64, bits).unwrap());
        assert!(rel_err(&got, product) < 8e-3, "plain {what}");
        let add = Epilogue::Residual { residual: self.residual, alpha: self.alpha };
        let got = with_tiling(general, mma, || quantized_matmul_t_then(x, p, s, b, 64, bits, add).unwrap());
        let want = epilogue_mlx(product, Epilogue::Residual { residual: &f(self.residual), alpha: self.alpha }).unwrap();
        assert!(rel_err(&got, &want) < 1e-2, "residual {what}");
        // SwiGLU too, its warps sharing rows where K is split.
        let got = with_tiling(general, mma, || quantized_matmul_t_then(x, p, s, b, 64, bits, Epilogue::SwiGlu).unwrap());
        let want = epilogue_mlx(product, Epilogue::SwiGlu).unwrap();
        assert!(rel_err(&got, &want) < 1e-2, "swiglu {what}");
    }
}

fn qmv_tilings_match_mlx_quantized_matmul(bits: i32, n: i32, k: i32, seed: u64) {
    use_gpu();
    let start = std::time::Instant::now();
    let f = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
    let w = randn(&[n, k], seed, Dtype::Float32);
    let (packed, scales, biases) = ops::quantize(&w, 64, bits).unwrap();
    let (s, b) = (scales.as_dtype(Dtype::Bfloat16).unwrap(), biases.as_dtype(Dtype::Bfloat16).unwrap());
    let residual = randn(&[1, n], seed + 2, Dtype::Bfloat16);
    let alpha = 0.5; // exact in bf16
    for rows in [1, 8, 16] {
        let x = randn(&[rows, k], seed + 1, Dtype::Bfloat16);
        let residual = ops::broadcast_to(&residual, &[rows, n]).unwrap();
        let product = quantized_matmul_t_mlx(&f(&x), &packed, &f(&s), &f(&b), 64, bits).unwrap();
        // (outputs per warp, split, in flight): each value of each, a kernel compile per tiling.
        // At 4 bits, 16 outputs a warp (SwiGLU 8 gate rows, or 16 in two tiles) is the
        // tensor-core form (on the CUDA cores so many rows would not fit in registers).
        let tensor_cores: &[(i32, i32, i32)] = if bits == 4 { &[(16, 1, 4), (16, 8, 4), (16, 4, 1), (8, 1, 2), (16, 2, 8)] } else { &[] };
        let general =
            [(1, 1, 1), (1, 4, 4), (1, 8, 2), (2, 2, 4), (2, 8, 1), (4, 4, 2), (4, 1, 1), (2, 1, 2), (2, 1, 4), (4, 1, 2)]
                .into_iter()
                .chain(tensor_cores.iter().copied());
        let tilings: Vec<(Option<QmvTiling>, Option<MmaTiling>)> = if rows == 1 {
            general.map(|(o, split, u)| (Some(QmvTiling::new(8, o, split, u, false)), None)).collect()
        } else {
            // (The last four through the cp.async ring, (2, 3) the 16-row sweep's best for down;
            // the 4 × 4 one takes fewer warps to fit it.)
            [(1, 1, 8192, false), (1, 2, 16384, false), (2, 2, 8192, false), (2, 4, 4096, false), (4, 1, 16384, false)]
                .into_iter()
                .chain([(1, 3, 8192, true), (2, 2, 8192, true), (2, 3, 8192, true), (4, 4, 16384, true)])
                .map(|(t, u, g, a)| (None, Some(MmaTiling { out_tiles: t, in_flight: u, grid_warps: g, async_copy: a })))
                .collect()
        };
        for (general, mma) in tilings {
            let what = format!("q{bits} {n}x{k} rows {rows} {general:?} {mma:?}");
            let product_of = QuantizedProduct { x: &x, packed: &packed, scales: &s, biases: &b, bits, residual: &residual, alpha };
            product_of.assert_every_epilogue_matches(&product, general, mma, &what);
            // Progress, for a run stopped at a device call's limit.
            eprintln!("{:.0} s: {what} passes", start.elapsed().as_secs_f64());
        }
    }
}

/// The tensor-core kernel past one 16-row tile of input rows (a busy server's decode batch, a
/// short prompt): every epilogue against MLX's product, for row counts that fill their last tile
/// and that leave it partly empty, with the default tiling and through the cp.async ring, for K
/// that does and that does not divide evenly among the warps.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn qmm_past_one_tile_matches_mlx_quantized_matmul() {
    use_gpu();
    let f = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
    let mut seed = 1200;
    for bits in [8, 4] {
        for (n, k) in [(1030, 4096), (260, 1408)] {
            seed += 3;
            let (packed, scales, biases) = ops::quantize(randn(&[n, k], seed, Dtype::Float32), 64, bits).unwrap();
            let (s, b) = (scales.as_dtype(Dtype::Bfloat16).unwrap(), biases.as_dtype(Dtype::Bfloat16).unwrap());
            for rows in [17, 30, 33, 64] {
                let x = randn(&[rows, 1, k], seed + 1, Dtype::Bfloat16);
                let residual = randn(&[rows, 1, n], seed + 2, Dtype::Bfloat16);
                let product = quantized_matmul_t_mlx(&f(&x), &packed, &f(&s), &f(&b), 64, bits).unwrap();
                let ring = MmaTiling { out_tiles: 2, in_flight: 3, grid_warps: 8192, async_copy: true };
                let product_of = QuantizedProduct { x: &x, packed: &packed, scales: &s, biases: &b, bits, residual: &residual, alpha: 0.5 };
                for mma in [None, Some(ring)] {
                    product_of.assert_every_epilogue_matches(&product, None, mma, &format!("q{bits} {n}x{k} rows {rows} {mma:?}"));
                }
            }
        }
    }
}

/// The general kernel with its weights copied through a cp.async ring: every epilogue, the norm
/// folded in, in bf16, f16 and f32 (several input rows), for ring depths of 2 to 8 and K that
/// does and that does not divide evenly among the warps (1408: lanes with no chunk at all).
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn qmv_async_copies_match_mlx_operations() {
    use_gpu();
    let f = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
    let mut seed = 1300;
    for bits in [8, 4] {
        for (n, k) in [(1030, 4096), (512, 16384), (260, 1408)] {
            seed += 7;
            let w = randn(&[n, k], seed, Dtype::Float32);
            let (packed, scales, biases) = ops::quantize(&w, 64, bits).unwrap();
            let norm = randn(&[k], seed + 3, Dtype::Float32).multiply(Array::from_f32(0.5)).unwrap().add(Array::from_f32(1.0)).unwrap();
            // (rows, dtype, tilings as (outputs per warp, split, ring slots)).
            let cases = [
                (1, Dtype::Bfloat16, vec![(1, 1, 2), (2, 4, 4), (1, 8, 3), (4, 1, 2), (1, 2, 8)]),
                (1, Dtype::Float16, vec![(2, 2, 2)]),
                (3, Dtype::Float32, vec![(1, 1, 4)]),
            ];
            for (rows, dtype, tilings) in cases {
                let (s, b) = (scales.as_dtype(dtype).unwrap(), biases.as_dtype(dtype).unwrap());
                let x = randn(&[rows, k], seed + 1, dtype);
                let residual = randn(&[rows, n], seed + 2, dtype);
                let weight = norm.as_dtype(dtype).unwrap();
                let alpha = 0.5; // exact in every dtype
                let tol = if dtype == Dtype::Float32 { 1e-5 } else { 1e-2 };
                let product = quantized_matmul_t_mlx(&f(&x), &packed, &f(&s), &f(&b), 64, bits).unwrap();
                let normed = mlx_rs::fast::rms_norm(&x, Some(&weight), 1e-6).unwrap();
                let normed_product = quantized_matmul_t_mlx(&f(&normed), &packed, &f(&s), &f(&b), 64, bits).unwrap();
                for (o, split, u) in tilings {
                    let t = Some(QmvTiling::new(8, o, split, u, true));
                    let what = format!("q{bits} {n}x{k} rows {rows} {dtype:?} {t:?}");
                    let got = with_tiling(t, None, || quantized_matmul_t(&x, &packed, &s, &b, 64, bits).unwrap());
                    let err = rel_err(&got, &product);
                    assert!(err < tol, "plain {what}: relative error {err}");
                    let residual_epilogue = Epilogue::Residual { residual: &residual, alpha };
                    let got = with_tiling(t, None, || quantized_matmul_t_then(&x, &packed, &s, &b, 64, bits, residual_epilogue).unwrap());
                    let want = epilogue_mlx(&product, Epilogue::Residual { residual: &f(&residual), alpha }).unwrap();
                    let err = rel_err(&got, &want);
                    assert!(err < tol, "residual {what}: relative error {err}");
                    let got = with_tiling(t, None, || quantized_matmul_t_then(&x, &packed, &s, &b, 64, bits, Epilogue::SwiGlu).unwrap());
                    let err = rel_err(&got, &epilogue_mlx(&product, Epilogue::SwiGlu).unwrap());
                    assert!(err < tol, "swiglu {what}: relative error {err}");
                    // The norm is folded into one-row products.
                    let rms = RmsNormIn { weight: &weight, eps: 1e-6, gate: None };
                    let got = with_tiling(t, None, || quantized_matmul_t_normed(&x, rms, &packed, &s, &b, 64, bits, Epilogue::Plain).unwrap());
                    let err = rel_err(&got, &normed_product);
                    assert!(err < tol, "normed {what}: relative error {err}");
                }
            }
        }
    }
}

/// The general kernel with an RMSNorm folded in, at `bits`, against MLX's norm and product; each
/// width a test of its own, since every case compiles a kernel (NVRTC) and together they outlast
/// a device call.
fn qmv_with_rms_norm_folded_in(bits: i32, mut seed: u64) {
    use_gpu();
    let f = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
    // (8704 and 16384 rows: the 4-bit tilings of larger matrices, through a cp.async ring where
    // the staged input leaves room for one.)
    for (n, k) in [(2 * 2048, 4096), (8704, 4096), (16384, 4096), (2 * 136, 384)] {
        // The general kernel with the norm folded in: one row in bf16 and f32, two and four
        // in f32 (the largest staged input). Half-precision batches (3, 8 and 16 rows) take a
        // separate norm and the tensor-core kernel.
        let cases = [
            (1, Dtype::Bfloat16),
            (1, Dtype::Float32),
            (2, Dtype::Float32),
            (4, Dtype::Float32),
            (3, Dtype::Bfloat16),
            (8, Dtype::Bfloat16),
            (16, Dtype::Float16),
        ];
        for (rows, dtype) in cases {
            seed += 5;
            let w = randn(&[n, k], seed, Dtype::Float32);
            let (packed, scales, biases) = ops::quantize(&w, 64, bits).unwrap();
            let (s, b) = (scales.as_dtype(dtype).unwrap(), biases.as_dtype(dtype).unwrap());
            // Inputs far from unit RMS and a norm weight far from 1, so that a norm left out or
            // applied twice shows.
            let x = randn(&[rows, k], seed + 1, Dtype::Float32).multiply(Array::from_f32(7.0)).unwrap().as_dtype(dtype).unwrap();
            let weight = randn(&[k], seed + 2, Dtype::Float32).multiply(Array::from_f32(0.5)).unwrap().add(Array::from_f32(1.0)).unwrap();
            let weight = weight.as_dtype(dtype).unwrap();
            let eps = 1e-6;
            let tol = if dtype == Dtype::Float32 { 1e-5 } else { 1e-2 };
            // The oracle: MLX's RMSNorm in x's dtype, then MLX's product in float32.
            let normed = mlx_rs::fast::rms_norm(&x, Some(&weight), eps).unwrap();
            for (name, epilogue, width) in [("plain", Epilogue::Plain, n), ("swiglu", Epilogue::SwiGlu, n / 2)] {
                let norm = RmsNormIn { weight: &weight, eps, gate: None };
                let got = quantized_matmul_t_normed(&x, norm, &packed, &s, &b, 64, bits, epilogue).unwrap();
                let product = quantized_matmul_t_mlx(&f(&normed), &packed, &f(&s), &f(&b), 64, bits).unwrap();
                let want = epilogue_mlx(&product, epilogue).unwrap();
                assert_eq!(got.shape(), &[rows, width]);
                assert_eq!(got.dtype(), dtype);
                let err = rel_err(&got, &want);
                assert!(err < tol, "{name} q{bits} {n}x{k} rows {rows} {dtype:?}: relative error {err}");
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn qmv_with_rms_norm_folded_in_matches_mlx_operations_q8() {
    qmv_with_rms_norm_folded_in(8, 900);
}

#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn qmv_with_rms_norm_folded_in_matches_mlx_operations_q4() {
    qmv_with_rms_norm_folded_in(4, 1040);
}

/// A lightning layer's output norm and gate folded into its o_proj (residual form): against MLX's
/// norm-gate operations, then MLX's product in float32. The gate columns sit inside a wider
/// stacked projection, as z does in qkvz.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn qmv_with_norm_gate_folded_in_matches_mlx_operations() {
    use_gpu();
    let f = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
    let mut seed = 1700;
    for bits in [8, 4] {
        // (rows of W, K = width of o, columns of the stacked projection, z's offset in it)
        for (n, k, width, offset) in [(4096, 4096, 16384, 12288), (520, 384, 1536, 1152), (300, 384, 800, 8)] {
            for (rows, dtype) in [(1, Dtype::Bfloat16), (1, Dtype::Float32), (3, Dtype::Float32)] {
                seed += 5;
                let w = randn(&[n, k], seed, Dtype::Float32);
                let (packed, scales, biases) = ops::quantize(&w, 64, bits).unwrap();
                let (s, b) = (scales.as_dtype(dtype).unwrap(), biases.as_dtype(dtype).unwrap());
                let o = randn(&[rows, 1, k], seed + 1, Dtype::Float32).multiply(Array::from_f32(5.0)).unwrap().as_dtype(dtype).unwrap();
                let src = randn(&[rows, 1, width], seed + 2, Dtype::Float32).multiply(Array::from_f32(2.0)).unwrap().as_dtype(dtype).unwrap();
                let weight = randn(&[k], seed + 3, Dtype::Float32).multiply(Array::from_f32(0.5)).unwrap().add(Array::from_f32(1.0)).unwrap();
                let weight = weight.as_dtype(dtype).unwrap();
                let residual = randn(&[rows, 1, n], seed + 4, dtype);
                let alpha = 0.5; // exact in every dtype
                let eps = 1e-6;
                let norm = RmsNormIn { weight: &weight, eps, gate: Some(GateIn { src: &src, offset }) };
                let epilogue = Epilogue::Residual { residual: &residual, alpha };
                let got = quantized_matmul_t_normed(&o, norm, &packed, &s, &b, 64, bits, epilogue).unwrap();
                // The oracle: norm and gate in MLX operations in o's dtype, the product in float32.
                let gated = norm_gate_mlx(&o, &src, offset, &weight, eps).unwrap();
                let product = quantized_matmul_t_mlx(&f(&gated), &packed, &f(&s), &f(&b), 64, bits).unwrap();
                let want = epilogue_mlx(&product, Epilogue::Residual { residual: &f(&residual), alpha }).unwrap();
                assert_eq!(got.shape(), &[rows, 1, n]);
                assert_eq!(got.dtype(), dtype);
                let err = rel_err(&got, &want);
                let tol = if dtype == Dtype::Float32 { 1e-5 } else { 1e-2 };
                assert!(err < tol, "q{bits} {n}x{k} z at {offset} of {width}, rows {rows} {dtype:?}: relative error {err}");
                // Without the product's residual, the gate still reaches the output (a gate read
                // from the wrong columns or left out shows here, the residual being small).
                let ungated = mlx_rs::fast::rms_norm(&o, Some(&weight), eps).unwrap();
                let wrong = epilogue_mlx(
                    &quantized_matmul_t_mlx(&f(&ungated), &packed, &f(&s), &f(&b), 64, bits).unwrap(),
                    Epilogue::Residual { residual: &f(&residual), alpha },
                )
                .unwrap();
                assert!(rel_err(&got, &wrong) > 10.0 * tol, "q{bits} {n}x{k} rows {rows} {dtype:?}: the gate made no difference");
            }
        }
    }
}

/// 4-bit weights unpacked two at a time through half2 (`half_pairs`) must not change a bit: in
/// every form, the result with it equals the result without, bit for bit, and MLX's operations'
/// values; through registers and a ring, with K split, and with a last thread block that holds
/// fewer rows than the others (1030 rows).
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn qmv_half_pairs_keep_the_bits() {
    use_gpu();
    let f = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
    let (n, k) = (1030, 4096);
    let (bits, seed) = (4, 2110);
    let w = randn(&[n, k], seed, Dtype::Float32);
    let (packed, scales, biases) = ops::quantize(&w, 64, bits).unwrap();
    let (s, b) = (scales.as_dtype(Dtype::Bfloat16).unwrap(), biases.as_dtype(Dtype::Bfloat16).unwrap());
    let x = randn(&[1, 1, k], seed + 1, Dtype::Float32).multiply(Array::from_f32(3.0)).unwrap().as_dtype(Dtype::Bfloat16).unwrap();
    let weight = randn(&[k], seed + 2, Dtype::Float32).multiply(Array::from_f32(0.5)).unwrap().add(Array::from_f32(1.0)).unwrap();
    let weight = weight.as_dtype(Dtype::Bfloat16).unwrap();
    let src = randn(&[1, 1, 2 * k], seed + 3, Dtype::Bfloat16);
    let residual = randn(&[1, 1, n], seed + 4, Dtype::Bfloat16);
    let product = quantized_matmul_t_mlx(&f(&x), &packed, &f(&s), &f(&b), 64, bits).unwrap();
    let normed = mlx_rs::fast::rms_norm(&x, Some(&weight), 1e-6).unwrap();
    let normed_product = quantized_matmul_t_mlx(&f(&normed), &packed, &f(&s), &f(&b), 64, bits).unwrap();
    let gated = norm_gate_mlx(&x, &src, k, &weight, 1e-6).unwrap();
    let gated_product = quantized_matmul_t_mlx(&f(&gated), &packed, &f(&s), &f(&b), 64, bits).unwrap();
    let residual_epilogue = Epilogue::Residual { residual: &residual, alpha: 0.5 };
    let with_residual = |p: &Array| epilogue_mlx(p, Epilogue::Residual { residual: &f(&residual), alpha: 0.5 }).unwrap();
    let rms = || RmsNormIn { weight: &weight, eps: 1e-6, gate: None };
    // (form, its result under the tiling in force, MLX's)
    type Form<'a> = (&'a str, Box<dyn Fn() -> Array + 'a>, Array);
    let forms: [Form; 6] = [
        ("plain", Box::new(|| quantized_matmul_t(&x, &packed, &s, &b, 64, bits).unwrap()), product.clone()),
        (
            "residual",
            Box::new(|| quantized_matmul_t_then(&x, &packed, &s, &b, 64, bits, residual_epilogue).unwrap()),
            with_residual(&product),
        ),
        (
            "swiglu",
            Box::new(|| quantized_matmul_t_then(&x, &packed, &s, &b, 64, bits, Epilogue::SwiGlu).unwrap()),
            epilogue_mlx(&product, Epilogue::SwiGlu).unwrap(),
        ),
        (
            "normed",
            Box::new(|| quantized_matmul_t_normed(&x, rms(), &packed, &s, &b, 64, bits, Epilogue::Plain).unwrap()),
            normed_product.clone(),
        ),
        (
            "swiglu normed",
            Box::new(|| quantized_matmul_t_normed(&x, rms(), &packed, &s, &b, 64, bits, Epilogue::SwiGlu).unwrap()),
            epilogue_mlx(&normed_product, Epilogue::SwiGlu).unwrap(),
        ),
        (
            "norm-gated residual",
            Box::new(|| {
                let norm = RmsNormIn { weight: &weight, eps: 1e-6, gate: Some(GateIn { src: &src, offset: k }) };
                quantized_matmul_t_normed(&x, norm, &packed, &s, &b, 64, bits, residual_epilogue).unwrap()
            }),
            with_residual(&gated_product),
        ),
    ];
    // (outputs per warp, split, in flight, ring)
    for (o, split, u, ring) in [(2, 1, 2, true), (1, 2, 2, false), (4, 1, 2, false)] {
        let base = QmvTiling::new(8, o, split, u, ring);
        for (name, run, want) in &forms {
            let plain = with_tiling(Some(base), None, run);
            let what = format!("{name} q{bits} {n}x{k} o{o} s{split} u{u} ring {ring}, half pairs");
            let got = with_tiling(Some(QmvTiling { half_pairs: true, ..base }), None, run);
            assert_eq!(to_vec_f32(&plain).unwrap(), to_vec_f32(&got).unwrap(), "{what}: not the same bits as without");
            let err = rel_err(&got, want);
            assert!(err < 1e-2, "{what}: relative error {err}");
        }
    }
}

#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn gla_decode_step_matches_the_recurrence() {
    use_gpu();
    // Batch 1 and a batch of sequences (each head's decay found from b·H + h).
    for (b, h, d, seed) in [(1, 32, 128, 1u64), (1, 4, 32, 2), (1, 3, 8, 3), (5, 32, 128, 4), (3, 3, 8, 5)] {
        let slopes = Array::from_slice(&alibi_slopes(h as usize), &[h]);
        let q = randn(&[b, h, 1, d], seed, Dtype::Float32);
        let k = randn(&[b, h, 1, d], seed + 10, Dtype::Float32);
        let v = randn(&[b, h, 1, d], seed + 20, Dtype::Float32);
        let s0 = randn(&[b, h, d, d], seed + 30, Dtype::Float32);
        for state in [None, Some(&s0)] {
            let (o, s) = simple_gla_step(&q, &k, &v, &slopes, state, 0.125).unwrap();
            let (o_ref, s_ref) = simple_gla_recurrent(&q, &k, &v, &slopes, state, 0.125).unwrap();
            let (eo, es) = (rel_err(&o, &o_ref), rel_err(&s, &s_ref));
            assert!(eo < 1e-5 && es < 1e-6, "B={b} H={h} d={d} state={}: output {eo}, state {es}", state.is_some());
        }
        // Inputs in bfloat16 (as the model passes them): the same float32 arithmetic on the
        // converted values, the output rounded to bfloat16.
        let bf = |a: &Array| a.as_dtype(Dtype::Bfloat16).unwrap();
        let (o, s) = simple_gla_step(&bf(&q), &bf(&k), &bf(&v), &slopes, Some(&s0), 0.125).unwrap();
        let f32 = |a: &Array| bf(a).as_dtype(Dtype::Float32).unwrap();
        let (o_ref, s_ref) = simple_gla_recurrent(&f32(&q), &f32(&k), &f32(&v), &slopes, Some(&s0), 0.125).unwrap();
        assert_eq!(o.dtype(), Dtype::Bfloat16);
        let (eo, es) = (rel_err(&o, &bf(&o_ref)), rel_err(&s, &s_ref));
        assert!(eo < 1e-2 && es < 1e-6, "bfloat16 B={b} H={h} d={d}: output {eo}, state {es}");
    }
}

/// The prompt's GLA on tensor cores (`cuda/gla_prefill.cu`) against the float32 chunked form on
/// the CPU (no TF32 there), on the same bfloat16 inputs: one and several chunks, a partial last
/// chunk, a batch, with and without a carried state, SALA-9B's 32 heads of 128, and heads of 32
/// and 96 (32-column tiles).
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn gla_prefill_kernels_match_the_float32_chunked_form() {
    use_gpu();
    for (b, h, t, d, seed) in [(1, 32, 2048, 128, 1u64), (1, 2, 100, 64, 2), (2, 3, 64, 128, 3), (1, 4, 65, 128, 4), (1, 2, 7, 64, 5), (1, 4, 200, 32, 6), (1, 2, 130, 96, 7)] {
        let slopes = Array::from_slice(&alibi_slopes(h as usize), &[h]);
        let [q, k, v] = [0, 10, 20].map(|s| randn(&[b, h, t, d], seed + s, Dtype::Bfloat16));
        let s0 = randn(&[b, h, d, d], seed + 30, Dtype::Float32);
        for state in [None, Some(&s0)] {
            let (o, s) = simple_gla(&q, &k, &v, &slopes, state, 0.088).unwrap();
            assert_eq!((o.shape(), o.dtype()), (&[b, h, t, d][..], Dtype::Bfloat16));
            select(Some(DeviceKind::Cpu)).unwrap();
            let (o_ref, s_ref) = simple_gla_mlx(&q, &k, &v, &slopes, state, 0.088).unwrap();
            let (eo, es) = (rel_err(&o, &o_ref.as_dtype(Dtype::Bfloat16).unwrap()), rel_err(&s, &s_ref));
            select(Some(DeviceKind::Gpu)).unwrap();
            // The output is rounded to bfloat16 (2⁻⁹); the state stays float32, its products' float32
            // operands split into two bfloat16 parts (2⁻¹⁷).
            assert!(eo < 4e-3 && es < 2e-5, "B={b} H={h} T={t} d={d} state={}: output {eo}, state {es}", state.is_some());
        }
    }
}

#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn lightning_decode_step_matches_mlx_operations() {
    use_gpu();
    // (B, H, d, extra columns after q/k/v (a gate), positions per sequence, seed): positions in
    // the launch's shape for up to 8 sequences (8 at about 1M: the shape's element count
    // overflows, never used), in an array for more.
    for (b, h, d, extra, positions, seed) in [
        (1, 32, 128, 32 * 128, vec![4100], 600u64),
        (1, 4, 32, 0, vec![0], 610),
        (3, 32, 128, 32 * 128, vec![7, 300, 70000], 620),
        (2, 3, 8, 24, vec![5, 5], 630),
        (8, 4, 64, 0, vec![1 << 20, 3, 999_999, 17, 1 << 19, 40_000, 8, 1_048_000], 640),
        (11, 2, 32, 64, (0..11).map(|i| 100 * i + 1).collect(), 650),
    ] {
        let slopes = Array::from_slice(&alibi_slopes(h as usize), &[h]);
        let q_norm = randn(&[d], seed, Dtype::Float32).add(Array::from_f32(1.0)).unwrap();
        let k_norm = randn(&[d], seed + 1, Dtype::Float32).add(Array::from_f32(1.0)).unwrap();
        let qkv = randn(&[b, 1, 3 * h * d + extra], seed + 2, Dtype::Float32);
        // A first step's state: zeros as MLX makes them (a broadcast), read through its strides.
        let state = if seed == 650 { Array::zeros::<f32>(&[b, h, d, d]).unwrap() } else { randn(&[b, h, d, d], seed + 3, Dtype::Float32) };
        let pos = sala::kernels::lightning::positions_array(&positions);
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            let c = |a: &Array| a.as_dtype(dtype).unwrap();
            let (qn, kn) = (c(&q_norm), c(&k_norm));
            let params = StepParams {
                heads: h,
                head_dim: d,
                qk_norm: Some((&qn, &kn, 1e-6)),
                rope_theta: Some(10000.0),
                slopes: &slopes,
                scale: (d as f32).powf(-0.5),
            };
            for keep_kv in [false, true] {
                let got = decode_step(&params, &c(&qkv), &positions, &state, keep_kv).unwrap();
                let want = decode_step_mlx(&params, &c(&qkv), &pos, &state, keep_kv).unwrap();
                assert_eq!(got.o.shape(), &[b, 1, h * d]);
                assert_eq!(got.o.dtype(), dtype);
                let tol = if dtype == Dtype::Float32 { 2e-5 } else { 1e-2 };
                let what = format!("B={b} H={h} d={d} {dtype:?} keep_kv={keep_kv}");
                let (eo, es) = (rel_err(&got.o, &want.o), rel_err(&got.state, &want.state));
                assert!(eo < tol && es < tol, "{what}: output {eo}, state {es}");
                assert_eq!(got.kv.is_some(), keep_kv, "{what}");
                if let (Some((k, v)), Some((k_ref, v_ref))) = (&got.kv, &want.kv) {
                    assert_eq!(k.shape(), &[b, h, 1, d]);
                    let (ek, ev) = (rel_err(k, k_ref), rel_err(v, v_ref));
                    assert!(ek < tol && ev == 0.0, "{what}: rotated keys {ek}, values {ev}");
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn norm_gate_matches_mlx_operations() {
    use_gpu();
    for (b, t, dim, offset, seed) in [(1, 1, 4096, 3 * 4096, 700u64), (3, 1, 4096, 3 * 4096, 710), (2, 5, 256, 40, 720)] {
        let o = randn(&[b, t, dim], seed, Dtype::Float32);
        let src = randn(&[b, t, offset + dim + 8], seed + 1, Dtype::Float32);
        let w = randn(&[dim], seed + 2, Dtype::Float32);
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            let c = |a: &Array| a.as_dtype(dtype).unwrap();
            let got = norm_gate(&c(&o), &c(&src), offset, &c(&w), 1e-6).unwrap();
            let want = norm_gate_mlx(&c(&o), &c(&src), offset, &c(&w), 1e-6).unwrap();
            assert_eq!(got.shape(), &[b, t, dim]);
            let tol = if dtype == Dtype::Float32 { 1e-5 } else { 1e-2 };
            let err = rel_err(&got, &want);
            assert!(err < tol, "B={b} T={t} D={dim} {dtype:?}: relative error {err}");
        }
    }
}

fn sel_9b() -> BlockSelection {
    BlockSelection { block: 64, kernel: 32, stride: 16, kernel2: 128, stride2: 64, init_blocks: 1, local_blocks: 32, topk: 96 }
}

fn windows(len: usize, kernel: usize, stride: usize) -> i32 {
    ((len - kernel) / stride + 1) as i32
}

/// A SALA-9B-shaped selection: `t` random queries (32 heads, d 128) ending `back` positions before
/// `kv_len`, and both levels of pooled keys (2 KV heads), from seeds `seed`, `seed + 1`, `seed + 2`.
struct SelectionCase {
    sel: BlockSelection,
    q: Array,
    c1: Array,
    c2: Array,
    first: usize,
    kv_len: usize,
}

impl SelectionCase {
    fn new(kv_len: usize, back: usize, t: i32, seed: u64) -> Self {
        let (sel, hkv, d) = (sel_9b(), 2, 128);
        let q = randn(&[1, 32, t, d], seed, Dtype::Bfloat16);
        let c1 = randn(&[1, hkv, windows(kv_len, sel.kernel, sel.stride), d], seed + 1, Dtype::Bfloat16);
        let c2 = randn(&[1, hkv, windows(kv_len, sel.kernel2, sel.stride2), d], seed + 2, Dtype::Bfloat16);
        SelectionCase { sel, q, c1, c2, first: kv_len - back, kv_len }
    }

    /// The fused selection's chosen blocks and pooled scores.
    fn select(&self, score_type: Dtype) -> (Vec<i32>, Vec<f32>) {
        let s = sala::kernels::sparse::select_blocks_fused(&self.q, &self.c1, &self.c2, self.first, self.kv_len, &self.sel, score_type)
            .unwrap();
        (to_vec_i32(&s.blocks).unwrap(), to_vec_f32(&s.scores).unwrap())
    }
}

#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn block_selection_kernel_matches_mlx() {
    use_gpu();
    // The 9B geometry (G = 16) at decode and prefill positions, and golden C's small one. Decode
    // with ≥ 2048 level-1 windows takes the two-kernel form.
    let small = BlockSelection { block: 64, kernel: 32, stride: 16, kernel2: 128, stride2: 64, init_blocks: 1, local_blocks: 2, topk: 6 };
    let cases = [
        (sel_9b(), 32, 2, 128, 20000usize, 19999usize, 1i32),
        (sel_9b(), 32, 2, 128, 131072, 131071, 1),
        // Decode past kernels::sparse::SPLIT_WINDOWS (two kernels), the last chunk partial.
        (sel_9b(), 32, 2, 128, 40000, 39999, 1),
        // Decode past two chunks of blocks (the top-k over many thread blocks): a partial last
        // chunk; 1M tokens (32 chunks, 3072 candidates, all held in registers); 1.5M (46 chunks,
        // 4416 candidates, some read back from memory).
        (sel_9b(), 32, 2, 128, 300_000, 299_999, 1),
        (sel_9b(), 32, 2, 128, 1_048_576, 1_048_575, 1),
        (sel_9b(), 32, 2, 128, 1_500_000, 1_499_999, 1),
        // A speculative check's few queries (one per thread block, windows split into ranges).
        (sel_9b(), 32, 2, 128, 70000, 69997, 3),
        (sel_9b(), 32, 2, 128, 9000, 8900, 100),
        // A prompt chunk's part at a long context (on Hopper, warpgroups of four queries on wgmma).
        // Both end 8 and 10 tokens into a block: the last block overlaps no complete window and
        // the group of windows before it lacks its last (the edges of the window maxima).
        (sel_9b(), 32, 2, 128, 69_960, 69_448, 512),
        (small, 32, 2, 8, 1290, 990, 300),
    ];
    for (i, &(sel, hq, hkv, d, kv_len, first, t)) in cases.iter().enumerate() {
        let seed = 500 + 10 * i as u64;
        let n1 = windows(kv_len, sel.kernel, sel.stride);
        let n2 = windows(kv_len, sel.kernel2, sel.stride2);
        let q = randn(&[1, hq, t, d], seed, Dtype::Float32);
        let c1 = randn(&[1, hkv, n1, d], seed + 1, Dtype::Float32);
        let c2 = randn(&[1, hkv, n2, d], seed + 2, Dtype::Float32);
        // Float32 scores: the selections must agree exactly.
        let got = select_blocks_scored(&q, &c1, &c2, first, kv_len, &sel, Dtype::Float32).unwrap();
        let want = select_blocks_mlx(&q, &c1, &c2, first, kv_len, &sel, Dtype::Float32).unwrap();
        assert_eq!(to_vec_i32(&got.blocks).unwrap(), to_vec_i32(&want.blocks).unwrap(), "case {i}: blocks");
        let (gs, ws) = (to_vec_f32(&got.scores).unwrap(), to_vec_f32(&want.scores).unwrap());
        for (j, (g, w)) in gs.iter().zip(&ws).enumerate() {
            assert!(g == w || (g - w).abs() <= 1e-4 * w.abs().max(1e-3), "case {i}: score {j}: {g} vs {w}");
        }
        // bf16-rounded scores (the model's setting): ties are frequent, the rule must hold too.
        let got = select_blocks_scored(&q, &c1, &c2, first, kv_len, &sel, Dtype::Bfloat16).unwrap();
        let want = select_blocks_mlx(&q, &c1, &c2, first, kv_len, &sel, Dtype::Bfloat16).unwrap();
        let (gb, wb) = (to_vec_i32(&got.blocks).unwrap(), to_vec_i32(&want.blocks).unwrap());
        let same = gb.iter().zip(&wb).filter(|(a, b)| a == b).count();
        assert!(same as f64 >= 0.999 * wb.len() as f64, "case {i}: bf16 blocks agree on {same} of {}", wb.len());
        // Half-precision queries: bf16 ones take the tensor-core stage 1 on CUDA, with float32
        // pooled keys (products float32-accurate) and with bf16 ones (the cache's form for a bf16
        // model: exact products), summed in another order than the oracle's.
        for (qdtype, key_dtype) in [(Dtype::Bfloat16, Dtype::Float32), (Dtype::Bfloat16, Dtype::Bfloat16), (Dtype::Float16, Dtype::Float32)] {
            let qh = q.as_dtype(qdtype).unwrap();
            let (c1, c2) = (c1.as_dtype(key_dtype).unwrap(), c2.as_dtype(key_dtype).unwrap());
            for score_dtype in [Dtype::Float32, Dtype::Bfloat16] {
                let got = select_blocks_scored(&qh, &c1, &c2, first, kv_len, &sel, score_dtype).unwrap();
                let want = select_blocks_mlx(&qh, &c1, &c2, first, kv_len, &sel, score_dtype).unwrap();
                let (gb, wb) = (to_vec_i32(&got.blocks).unwrap(), to_vec_i32(&want.blocks).unwrap());
                let same = gb.iter().zip(&wb).filter(|(a, b)| a == b).count();
                assert!(same as f64 >= 0.999 * wb.len() as f64, "case {i} {qdtype:?}/{key_dtype:?}/{score_dtype:?}: blocks agree on {same} of {}", wb.len());
                if t >= 32 {
                    // In query chunks (as at long context), the scores dropped part by part.
                    let (blocks, _) = select_blocks_chunked(&qh, &c1, &c2, first, kv_len, &sel, score_dtype, 32, false).unwrap();
                    assert_eq!(to_vec_i32(&blocks).unwrap(), gb, "case {i} {qdtype:?}/{key_dtype:?}/{score_dtype:?}: blocks in chunks of 32");
                }
                if score_dtype == Dtype::Float32 {
                    let (gs, ws) = (to_vec_f32(&got.scores).unwrap(), to_vec_f32(&want.scores).unwrap());
                    for (j, (g, w)) in gs.iter().zip(&ws).enumerate() {
                        assert!(g == w || (g - w).abs() <= 1e-3 * w.abs().max(1e-3), "case {i} {qdtype:?}/{key_dtype:?}: score {j}: {g} vs {w}");
                    }
                }
            }
        }
    }
}

/// On Hopper the selection's stage 1 scores bf16 keys with wgmma, four queries a warpgroup: the
/// same blocks and scores as its mma.sync form (only the order of the float32 sums may differ),
/// for a prompt chunk's part whose last thread block is partly past the queries.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn block_selection_on_wgmma_matches_mma_sync() {
    use_gpu();
    if !sala::kernels::custom::hopper() {
        eprintln!("skipped: wgmma needs a Hopper GPU (compute capability 9)");
        return;
    }
    let case = SelectionCase::new(140_000, 2000, 298, 900);
    let run = || case.select(Dtype::Float32);
    let (blocks, scores) = run();
    let (want_blocks, want_scores) = sala::kernels::sparse::with_selection_on_mma_sync(run);
    let same = blocks.iter().zip(&want_blocks).filter(|(a, b)| a == b).count();
    assert!(same as f64 >= 0.999 * want_blocks.len() as f64, "blocks agree on {same} of {}", want_blocks.len());
    let mut worst = 0f32;
    for (j, (g, w)) in scores.iter().zip(&want_scores).enumerate() {
        assert!(g == w || (g - w).abs() <= 1e-4 * w.abs().max(1e-3), "score {j}: {g} vs {w}");
        if g.is_finite() && w.is_finite() {
            worst = worst.max((g - w).abs() / w.abs().max(1e-3));
        }
    }
    eprintln!("wgmma vs mma.sync: blocks {same} of {} equal, largest relative score difference {worst:.2e}", want_blocks.len());
}

/// A prompt chunk's top-k through the candidates kept in shared memory (the model's form past 1024
/// blocks), with caps of 128 (about what passes with random scores, so some queries fall back to
/// every key and some do not), 1024 and the default, against no candidates (every key through the
/// radix passes): the same blocks and pooled scores, for bfloat16 window scores (the model's, with
/// ties) and float32 ones.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn top_k_through_candidates_equals_every_key() {
    use_gpu();
    if backend() != Backend::Cuda {
        eprintln!("skipped: the candidates are CUDA's");
        return;
    }
    let case = SelectionCase::new(300_000, 5000, 96, 930);
    for score_type in [Dtype::Bfloat16, Dtype::Float32] {
        let run = || case.select(score_type);
        let (want_blocks, want_scores) = sala::kernels::sparse::with_topk_candidates(0, run);
        assert!(want_blocks.iter().any(|&b| b >= 4096), "the case reaches past 4096 blocks");
        for cap in [128, 1024] {
            let (blocks, scores) = sala::kernels::sparse::with_topk_candidates(cap, run);
            assert_eq!(blocks, want_blocks, "{score_type:?} scores, cap {cap}: chosen blocks");
            let same = scores.iter().zip(&want_scores).all(|(g, w)| g.to_bits() == w.to_bits());
            assert!(same, "{score_type:?} scores, cap {cap}: pooled scores");
        }
        let (blocks, _) = run();
        assert_eq!(blocks, want_blocks, "{score_type:?} scores, the default cap: chosen blocks");
    }
}

/// Pooling and top-k in 512-block chunks, then a merge of their candidates (decode's form past
/// 2048 blocks, here for a prompt chunk's many queries): exactly the blocks and scores of one
/// thread block a query (the keys are unique, and the pooled scores come from the same window scores).
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn many_queries_top_k_in_chunks_equals_one_block_a_query() {
    use_gpu();
    if backend() != Backend::Cuda {
        eprintln!("skipped: the chunked top-k is CUDA's");
        return;
    }
    let case = SelectionCase::new(200_000, 3000, 96, 910);
    let run = || case.select(Dtype::Float32);
    let (want_blocks, want_scores) = run();
    let (blocks, scores) = sala::kernels::sparse::with_topk_in_chunks(run);
    assert_eq!(blocks, want_blocks, "chosen blocks");
    assert!(scores.iter().zip(&want_scores).all(|(g, w)| g == w || (g.is_nan() && w.is_nan())), "pooled scores");
    assert!(blocks.iter().any(|&b| b >= 2048), "the case reaches past 2048 blocks");
}

/// `filled` followed by 100 positions of junk (1e4), like a cache buffer with spare capacity.
fn poison_from(filled: &Array, hkv: i32, d: i32, dtype: Dtype) -> Array {
    let junk = ops::full::<f32>(&[1, hkv, 100, d], Array::from_f32(1e4)).unwrap().as_dtype(dtype).unwrap();
    ops::concatenate(&[filled, &junk], 2).unwrap()
}

#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn block_sparse_attention_kernel_matches_mlx() {
    use_gpu();
    // (Hq, Hkv, d, kv_len, first query, queries, dtype): decode (split) and prefill shapes.
    let cases = [
        (32, 2, 128, 20000usize, 19999usize, 1i32, Dtype::Bfloat16),
        (32, 2, 128, 9000, 8900, 100, Dtype::Bfloat16),
        (32, 2, 128, 9000, 8990, 10, Dtype::Float32),
        (32, 2, 8, 1300, 1000, 300, Dtype::Float32),
        (4, 2, 32, 700, 699, 1, Dtype::Float32),
        // Half-precision decode on the tensor-core decode kernel too (the other cases run their
        // default kernel twice).
        (16, 2, 64, 5000, 4999, 1, Dtype::Float16),
        // Half-precision prefill takes the tensor-core kernel on CUDA: 16 heads per group, fewer
        // (padded rows), half, queries from position 0, and a recent part inside the queries.
        (32, 2, 128, 4000, 3500, 500, Dtype::Bfloat16),
        (8, 2, 64, 5000, 4900, 100, Dtype::Float16),
        (16, 1, 128, 300, 0, 300, Dtype::Bfloat16),
        // Past 6144 tokens the 96 selected blocks differ between neighbouring queries, so a
        // thread block's union is longer than its lists (the ring walks the union); 37 queries
        // leave the last thread block one query.
        (32, 2, 128, 20000, 18000, 200, Dtype::Bfloat16),
        (32, 2, 128, 12000, 11000, 37, Dtype::Bfloat16),
    ];
    for (i, &(hq, hkv, d, kv_len, first, t, dtype)) in cases.iter().enumerate() {
        let seed = 900 + 10 * i as u64;
        let sel = if d == 128 { sel_9b() } else { BlockSelection { local_blocks: 2, topk: 6, ..sel_9b() } };
        let n1 = windows(kv_len, sel.kernel, sel.stride);
        let n2 = windows(kv_len, sel.kernel2, sel.stride2);
        let q = randn(&[1, hq, t, d], seed, dtype);
        // Cache buffers with spare room after kv_len, poisoned: the kernel must not read it.
        let k = poison_from(&randn(&[1, hkv, kv_len as i32, d], seed + 1, dtype), hkv, d, dtype);
        let v = poison_from(&randn(&[1, hkv, kv_len as i32, d], seed + 2, dtype), hkv, d, dtype);
        let c1 = randn(&[1, hkv, n1, d], seed + 3, Dtype::Float32);
        let c2 = randn(&[1, hkv, n2, d], seed + 4, Dtype::Float32);
        let blocks = select_blocks_mlx(&q, &c1, &c2, first, kv_len, &sel, Dtype::Float32).unwrap().blocks;
        let scale = (d as f32).powf(-0.5);
        let filled = |a: &Array| a.try_index((.., .., ..kv_len as i32, ..)).unwrap();
        // Even cases with the output gate, as the projection hands it over (a slice of wider rows).
        let gate_source = randn(&[1, t, 2 * hq * d], seed + 5, dtype);
        let gate = (i % 2 == 0).then(|| gate_source.try_index((.., .., hq * d..)).unwrap());
        let want = block_sparse_attention_mlx(&q, &filled(&k), &filled(&v), &blocks, first, sel.block, scale).unwrap();
        let want = heads_to_rows(&want, gate.as_ref()).unwrap();
        // As one history buffer, then as a cache holds it after pipelined decode steps: the last
        // 40 positions in a recent-token buffer (both poisoned past what they hold).
        let settled = kv_len - 40;
        let split = |x: &Array| {
            let history = poison_from(&x.try_index((.., .., ..settled as i32, ..)).unwrap(), hkv, d, dtype);
            let recent = poison_from(&x.try_index((.., .., settled as i32..kv_len as i32, ..)).unwrap(), hkv, d, dtype);
            (history, recent)
        };
        let ((kh, kr), (vh, vr)) = (split(&k), split(&v));
        let views = [
            KvParts::history(&k, &v, kv_len),
            KvParts { keys: kh, values: vh, recent: Some((kr, vr)), settled, len: kv_len, scales: None, counts: None },
        ];
        for (layout, kv) in ["history", "history + recent"].iter().zip(&views) {
            let got = block_sparse_attention(&q, kv, &blocks, first, sel.block, scale, gate.as_ref()).unwrap();
            let tensor_cores =
                with_decode_kernel(DecodeKernel::TensorCores, || block_sparse_attention(&q, kv, &blocks, first, sel.block, scale, gate.as_ref()).unwrap());
            // The prefill kernel's earlier form (every block through the shared walk), which the
            // kernels bench times.
            let union_walk = sala::kernels::sparse::with_union_prefill_walk(|| {
                block_sparse_attention(&q, kv, &blocks, first, sel.block, scale, gate.as_ref()).unwrap()
            });
            for (kernel, got) in [("default", &got), ("tensor cores where they fit", &tensor_cores), ("union walk", &union_walk)] {
                assert_eq!(got.shape(), want.shape());
                assert_eq!(got.dtype(), dtype);
                let err = rel_err(got, &want);
                let tol = if dtype == Dtype::Float32 { 1e-5 } else { 1e-2 };
                assert!(err < tol, "case {i} ({layout}, {kernel}): relative error {err}");
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn block_sparse_attention_reads_an_8_bit_cache_in_place() {
    use_gpu();
    // (Hq, Hkv, d, kv_len, first query, queries): the 9B's heads (groups of 64 values) decoding,
    // in a prefill chunk (tensor cores) and a few queries (the general kernel), then heads of 64
    // and of 32 values (groups of 32).
    let cases = [
        (32, 2, 128, 9000, 8999, 1),
        (32, 2, 128, 4000, 3500, 500),
        (32, 2, 128, 3000, 2995, 5),
        (8, 2, 64, 5000, 4900, 100),
        (4, 2, 32, 700, 699, 1),
    ];
    let dtype = Dtype::Bfloat16;
    for (i, &(hq, hkv, d, kv_len, first, t)) in cases.iter().enumerate() {
        let seed = 3000 + 10 * i as u64;
        let sel = if d == 128 { sel_9b() } else { BlockSelection { local_blocks: 2, topk: 6, ..sel_9b() } };
        let (n1, n2) = (windows(kv_len, sel.kernel, sel.stride), windows(kv_len, sel.kernel2, sel.stride2));
        let q = randn(&[1, hq, t, d], seed, dtype);
        let (k, v) = (randn(&[1, hkv, kv_len as i32, d], seed + 1, dtype), randn(&[1, hkv, kv_len as i32, d], seed + 2, dtype));
        let c1 = randn(&[1, hkv, n1, d], seed + 3, Dtype::Float32);
        let c2 = randn(&[1, hkv, n2, d], seed + 4, Dtype::Float32);
        let blocks = select_blocks_mlx(&q, &c1, &c2, first, kv_len, &sel, Dtype::Float32).unwrap().blocks;
        let scale = (d as f32).powf(-0.5);
        let gate_source = randn(&[1, t, 2 * hq * d], seed + 5, dtype);
        let gate = (i % 2 == 0).then(|| gate_source.try_index((.., .., hq * d..)).unwrap());
        // An 8-bit cache holding the history, then its last 40 positions behind the recent tokens
        // (as decode steps leave them).
        let mut cache = KvCache::new(KvFormat::quantized(8, d).unwrap(), None);
        let settled = kv_len - 40;
        let span = |x: &Array, from: usize, to: usize| x.try_index((.., .., from as i32..to as i32, ..)).unwrap();
        cache.append(&span(&k, 0, settled), &span(&v, 0, settled)).unwrap();
        cache.append_recent(&span(&k, settled, kv_len), &span(&v, settled, kv_len)).unwrap();
        let kv = cache.parts().unwrap().unwrap();
        assert_eq!((kv.keys.dtype(), kv.keys.shape()[3], kv.settled, kv.len), (Dtype::Uint32, d / 4, settled, kv_len), "case {i}: codes in place");
        assert!(kv.recent.is_some() && kv.scales.as_ref().is_some_and(|s| s.recent.is_some()) && reads_codes_in_place(&kv), "case {i}");
        // The oracle: MLX's attention over the rows dequantized.
        let (kf, vf) = kv.filled().unwrap();
        let want = block_sparse_attention_mlx(&q, &kf, &vf, &blocks, first, sel.block, scale).unwrap();
        let want = heads_to_rows(&want, gate.as_ref()).unwrap();
        let general = block_sparse_attention_gpu(&q, &kv, &blocks, first, sel.block, scale, gate.as_ref()).unwrap();
        let chosen = block_sparse_attention(&q, &kv, &blocks, first, sel.block, scale, gate.as_ref()).unwrap();
        let mut runs = vec![("general kernel", general), ("as the model calls it", chosen)];
        if t >= 16 {
            let prefill = block_sparse_prefill_cuda(&q, &kv, &blocks, first, sel.block, scale).unwrap();
            runs.push(("tensor-core prefill", heads_to_rows(&prefill, gate.as_ref()).unwrap()));
        }
        for (kernel, got) in &runs {
            assert_eq!((got.shape(), got.dtype()), (want.shape(), dtype), "case {i} ({kernel})");
            let err = rel_err(got, &want);
            assert!(err < 1e-2, "case {i} ({kernel}): relative error {err}");
        }
        println!("case {i} (Hq {hq}, d {d}, {t} queries at {first}): {} runs agree", runs.len());
    }
}

/// Sequence `j`'s random keys and values, `[1, hkv, len, d]` each, from `seed`.
fn cache_keys_values(hkv: i32, len: i32, d: i32, seed: u64, j: usize, dtype: Dtype) -> (Array, Array) {
    (randn(&[1, hkv, len, d], seed + 1 + 2 * j as u64, dtype), randn(&[1, hkv, len, d], seed + 2 + 2 * j as u64, dtype))
}

/// Decoding queries (and gates) of `b` sequences as the model hands them over: in the
/// projection's rows `[b, 1, 3·Hq·d]`, a view of wider ones.
fn projected_rows(b: i32, hq: i32, d: i32, seed: u64, dtype: Dtype) -> Array {
    randn(&[b, 1, 3 * hq * d + 8], seed, dtype).try_index((.., .., 8..)).unwrap()
}

/// [`decode_attention`]'s oracle: MLX's attention in float32 over each cache's filled rows
/// (dequantized, for an 8-bit cache), times σ(gate) when there is one.
fn decode_oracle(q: &Array, gate: Option<&Array>, parts: &[KvParts], scale: f32) -> Array {
    let f = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
    let filled: Vec<_> = parts.iter().map(|p| p.filled().unwrap()).map(|(k, v)| (f(&k), f(&v))).collect();
    let rows: Vec<_> = filled.iter().zip(parts).map(|((k, v), p)| KvParts::history(k, v, p.len)).collect();
    heads_to_rows(&decode_attention_mlx(&f(q), &rows, scale).unwrap(), gate.map(f).as_ref()).unwrap()
}

#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn decode_attention_of_a_batch_matches_mlx() {
    use_gpu();
    // (Hq, Hkv, d, dtype, cache lengths): one sequence, a batch of different lengths, more
    // sequences than one launch takes, and lengths that are no whole number of blocks.
    // Every case on both kernels (the tensor-core one takes half precision: 16 heads a group,
    // Qwen3's 4, 1).
    let cases: [(i32, i32, i32, Dtype, &[usize]); 7] = [
        (32, 2, 128, Dtype::Bfloat16, &[4096]),
        (32, 2, 128, Dtype::Bfloat16, &[4096, 1, 3000, 6143, 65, 64, 700, 2048]),
        (32, 2, 128, Dtype::Float16, &[100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100]),
        (32, 8, 128, Dtype::Bfloat16, &[131072, 33]),
        (8, 8, 64, Dtype::Bfloat16, &[1, 5000, 129]),
        (8, 8, 64, Dtype::Float32, &[33, 5000, 129]),
        (4, 2, 32, Dtype::Float32, &[1, 2, 3]),
    ];
    for (i, &(hq, hkv, d, dtype, lens)) in cases.iter().enumerate() {
        let seed = 2000 + 10 * i as u64;
        let b = lens.len() as i32;
        let projected = projected_rows(b, hq, d, seed, dtype);
        let query = DecodeQuery { rows: &projected, heads: hq, head_dim: d, q_col: 0, gate_col: (i % 2 == 1).then_some(2 * hq * d) };
        let (q, gate) = (query.heads().unwrap(), query.gate().unwrap());
        // Each cache as a poisoned history buffer, and, for odd rows, as a history plus its last
        // few positions in a poisoned recent-token buffer.
        let caches: Vec<_> = lens
            .iter()
            .enumerate()
            .map(|(j, &len)| {
                let (k, v) = cache_keys_values(hkv, len as i32, d, seed, j, dtype);
                let settled = if j % 2 == 1 { len - len.min(1 + j * 7) } else { len };
                let part = |x: &Array, from: usize, to: usize| poison_from(&x.try_index((.., .., from as i32..to as i32, ..)).unwrap(), hkv, d, dtype);
                let recent = (settled < len).then(|| (part(&k, settled, len), part(&v, settled, len)));
                (part(&k, 0, settled), part(&v, 0, settled), recent, settled, len)
            })
            .collect();
        let parts: Vec<KvParts> = caches
            .iter()
            .map(|(k, v, recent, settled, len)| KvParts {
                keys: k.clone(),
                values: v.clone(),
                recent: recent.clone(),
                settled: *settled,
                len: *len,
                scales: None,
                counts: None,
            })
            .collect();
        let scale = (d as f32).powf(-0.5);
        let on_tensor_cores = with_decode_kernel(DecodeKernel::TensorCores, || decode_attention(&query, &parts, scale).unwrap());
        let on_cuda_cores = with_decode_kernel(DecodeKernel::CudaCores, || decode_attention(&query, &parts, scale).unwrap());
        let want = decode_oracle(&q, gate.as_ref(), &parts, scale);
        for (kernel, got) in [("tensor cores where they fit", &on_tensor_cores), ("CUDA cores", &on_cuda_cores)] {
            assert_eq!(got.shape(), &[b, 1, hq * d]);
            assert_eq!(got.dtype(), dtype);
            let err = rel_err(got, &want);
            let tol = if dtype == Dtype::Float32 { 1e-5 } else { 1e-2 };
            assert!(err < tol, "case {i} ({kernel}): relative error {err}");
        }
    }
}

#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn decode_attention_reads_8_bit_caches_in_place() {
    use_gpu();
    // (Hq, Hkv, d, dtype, cache lengths): Qwen3-8B's groups at 128K, SALA-9B's 16 heads a group
    // (below dense_len), more sequences than one launch takes, 64-value heads in float32.
    let cases: [(i32, i32, i32, Dtype, &[usize]); 4] = [
        (32, 8, 128, Dtype::Bfloat16, &[131072, 33]),
        (32, 2, 128, Dtype::Bfloat16, &[4096, 1, 3000, 65]),
        (32, 2, 128, Dtype::Float16, &[100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1100]),
        (8, 8, 64, Dtype::Float32, &[1, 5000, 129]),
    ];
    for (i, &(hq, hkv, d, dtype, lens)) in cases.iter().enumerate() {
        let seed = 4000 + 10 * i as u64;
        let b = lens.len() as i32;
        let projected = projected_rows(b, hq, d, seed, dtype);
        let query = DecodeQuery { rows: &projected, heads: hq, head_dim: d, q_col: 0, gate_col: (i % 2 == 0).then_some(2 * hq * d) };
        let (q, gate) = (query.heads().unwrap(), query.gate().unwrap());
        // 8-bit caches: a history, and for odd rows its last few positions behind the recent tokens.
        let mut caches: Vec<KvCache> = lens
            .iter()
            .enumerate()
            .map(|(j, &len)| {
                let (k, v) = cache_keys_values(hkv, len as i32, d, seed, j, dtype);
                let settled = if j % 2 == 1 { len - len.min(1 + j * 7) } else { len };
                let span = |x: &Array, from: usize, to: usize| x.try_index((.., .., from as i32..to as i32, ..)).unwrap();
                let mut cache = KvCache::new(KvFormat::quantized(8, d).unwrap(), None);
                if settled > 0 {
                    cache.append(&span(&k, 0, settled), &span(&v, 0, settled)).unwrap();
                }
                if settled < len {
                    cache.append_recent(&span(&k, settled, len), &span(&v, settled, len)).unwrap();
                }
                cache
            })
            .collect();
        let parts: Vec<KvParts> = caches.iter_mut().map(|c| c.parts().unwrap().unwrap()).collect();
        assert!(parts.iter().all(reads_codes_in_place), "case {i}: codes in place");
        let scale = (d as f32).powf(-0.5);
        let got = decode_attention(&query, &parts, scale).unwrap();
        // The oracle reads the rows dequantized.
        let want = decode_oracle(&q, gate.as_ref(), &parts, scale);
        assert_eq!((got.shape(), got.dtype()), (&[b, 1, hq * d][..], dtype), "case {i}");
        let err = rel_err(&got, &want);
        let tol = if dtype == Dtype::Float32 { 1e-4 } else { 1e-2 };
        assert!(err < tol, "case {i}: relative error {err}");
        println!("case {i} (Hq {hq}, Hkv {hkv}, d {d}, {b} sequences): relative error {err:.2e}");
    }
}

#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn kv_append_matches_slice_updates() {
    use_gpu();
    // (Hq, Hkv, d, dtype, positions): one sequence; a batch at different fills, the first and the
    // last slot of a buffer among them; more sequences than one launch takes.
    let cases: [(i32, i32, i32, Dtype, &[usize]); 4] = [
        (32, 2, 128, Dtype::Bfloat16, &[17]),
        (32, 2, 128, Dtype::Bfloat16, &[0, 255, 3, 128, 64, 1, 200, 9]),
        (8, 4, 64, Dtype::Float32, &[5, 0, 31, 7, 7, 12, 2, 30, 1, 4, 19]),
        (4, 2, 32, Dtype::Float16, &[1, 2]),
    ];
    for (i, &(hq, hkv, d, dtype, positions)) in cases.iter().enumerate() {
        let seed = 5000 + 10 * i as u64;
        let b = positions.len() as i32;
        let capacity = if d == 128 { 256 } else { 32 };
        // The projection's rows as the model hands them over (q, k, v, gate side by side), and a
        // view of wider rows, so that the kernel must read them through their strides.
        let width = (2 * hq + 2 * hkv) * d;
        let wide = randn(&[b, 1, 2 * width], seed, dtype);
        let rows = wide.try_index((.., .., 3..3 + width)).unwrap();
        let columns = KvColumns { keys: hq * d, values: (hq + hkv) * d, kv_heads: hkv, head_dim: d };
        let slots: Vec<RecentSlot> = positions
            .iter()
            .enumerate()
            .map(|(j, &at)| {
                let (keys, values) = cache_keys_values(hkv, capacity, d, seed, j, dtype);
                RecentSlot::at(keys, values, at)
            })
            .collect();
        let got = append_token(&rows, columns, &slots).unwrap();
        let want = append_token_mlx(&rows, columns, &slots).unwrap();
        assert_eq!(got.len(), slots.len());
        for (j, (((gk, gv), (wk, wv)), slot)) in got.iter().zip(&want).zip(&slots).enumerate() {
            // Positions up to the token's: a copy, so exactly equal (later ones are unspecified).
            let filled = |a: &Array| to_vec_f32(&a.try_index((.., .., ..=slot.at as i32, ..)).unwrap().as_dtype(Dtype::Float32).unwrap()).unwrap();
            assert_eq!(gk.shape(), slot.keys.shape());
            assert_eq!(gk.dtype(), dtype);
            assert!(filled(gk) == filled(wk), "case {i}, slot {j} (at {}): keys differ", slot.at);
            assert!(filled(gv) == filled(wv), "case {i}, slot {j} (at {}): values differ", slot.at);
        }
    }
}

/// (Hq, Hkv, d, rotated dims, dtype, positions, QK-norm, period table).
type RopeCase = (i32, i32, i32, i32, Dtype, &'static [usize], bool, bool);

#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn rope_append_matches_mlx_operations() {
    use_gpu();
    // (Hq, Hkv, d, rotated dims, dtype, positions, QK-norm, period table with position and
    // attention scaling): Qwen3-8B's shape; Llama's with a table; partial rotation; more
    // sequences than one launch takes; float32 and float16.
    let cases: [RopeCase; 5] = [
        (32, 8, 128, 128, Dtype::Bfloat16, &[4096], true, false),
        (32, 8, 128, 128, Dtype::Bfloat16, &[0, 1, 131072, 77, 32767], false, true),
        (8, 2, 64, 32, Dtype::Float16, &[5, 9000], true, true),
        (4, 4, 32, 32, Dtype::Bfloat16, &[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], true, false),
        (12, 4, 64, 64, Dtype::Float32, &[100, 200, 300], false, false),
    ];
    const CAPACITY: usize = 64;
    for (i, &(hq, hkv, d, dims, dtype, positions, normed, table)) in cases.iter().enumerate() {
        let seed = 7000 + 10 * i as u64;
        let b = positions.len() as i32;
        let width = (hq + 2 * hkv) * d;
        // The projection's rows as a view of wider ones: the kernel reads them through their strides.
        let rows = randn(&[b, 1, width + 16], seed, dtype).try_index((.., .., 16..)).unwrap();
        let weight = |s| randn(&[d], s, Dtype::Float32).multiply(Array::from_f32(0.3)).unwrap().add(Array::from_f32(1.0)).unwrap().as_dtype(dtype).unwrap();
        let (qn, kn) = (weight(seed + 1), weight(seed + 2));
        let periods: Vec<f32> = (0..dims / 2).map(|j| 10000f32.powf(2.0 * j as f32 / dims as f32) * (1.0 + j as f32 / 4.0)).collect();
        let angles = if table {
            RopeAngles { dims, base: 0.0, periods: Some(Array::from_slice(&periods, &[dims / 2])), position_scale: 0.25, mscale: 1.1 }
        } else {
            RopeAngles { dims, base: 1_000_000.0, periods: None, position_scale: 1.0, mscale: 1.0 }
        };
        // Recent buffers at different fills: empty, the last place, and between.
        let fills: Vec<usize> = (0..positions.len()).map(|j| [0, CAPACITY - 1, 17, 1][j % 4]).collect();
        let slots: Vec<RecentSlot> = fills
            .iter()
            .enumerate()
            .map(|(j, &at)| {
                let buffer = |s| randn(&[1, hkv, CAPACITY as i32, d], s, dtype);
                RecentSlot::at(buffer(seed + 3 + 2 * j as u64), buffer(seed + 4 + 2 * j as u64), at)
            })
            .collect();
        let heads = QkHeads { heads: hq, kv_heads: hkv, head_dim: d, norms: normed.then_some((&qn, &kn, 1e-6)) };
        let (got_q, got_kv) = rope_append(&rows, heads, &angles, positions, &slots).unwrap();
        let (want_q, want_kv) = rope_append_mlx(&rows, heads, &angles, positions, &slots).unwrap();
        assert_eq!(got_q.shape(), &[b, 1, hq * d]);
        assert_eq!(got_q.dtype(), dtype);
        assert_eq!(got_kv.len(), slots.len());
        let tol = if dtype == Dtype::Float32 { 1e-5 } else { 1e-2 };
        let err = rel_err(&got_q, &want_q);
        assert!(err < tol, "case {i}, q: relative error {err}");
        let f = |a: Array| to_vec_f32(&a.as_dtype(Dtype::Float32).unwrap()).unwrap();
        for (j, (((gk, gv), (wk, wv)), &at)) in got_kv.iter().zip(&want_kv).zip(&fills).enumerate() {
            // Positions up to the token's are specified; after it they are not.
            let filled = |a: &Array| a.try_index((.., .., ..=at as i32, ..)).unwrap();
            // The earlier tokens and the values are copied exactly.
            if at > 0 {
                let earlier = |a: &Array| f(a.try_index((.., .., ..at as i32, ..)).unwrap());
                assert!(earlier(gk) == earlier(&slots[j].keys), "case {i}, sequence {j}: earlier keys changed");
                assert!(earlier(gv) == earlier(&slots[j].values), "case {i}, sequence {j}: earlier values changed");
            }
            assert!(f(filled(gv)) == f(filled(wv)), "case {i}, sequence {j}: the values differ");
            let err = rel_err(&filled(gk), &filled(wk));
            assert!(err < tol, "case {i}, sequence {j}, keys: relative error {err}");
        }
    }
}

/// The prompt form (`sala_rope_prompt`): a chunk's q, k and v heads in the layout attention and
/// GLA read, against MLX's slices, norms, transposes and rotations. SALA-9B's lightning layer and
/// Qwen3-8B's attention on a 2048-token chunk deep in a context; two sequences at their own
/// positions with a period table, scaling and partial rotation; float16 and float32 without norm or
/// rotation. The values are copied exactly; q and k within the self-checks' tolerance.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn rope_prompt_heads_match_mlx_operations() {
    use sala::kernels::rope::{prompt_heads, prompt_heads_mlx, ROPE_PROMPT_CHECK};
    if !on_cuda_unchecked("the kernel is CUDA's") {
        return;
    }
    assert!(selfcheck::enabled(&ROPE_PROMPT_CHECK), "self-check: {:?}", selfcheck::status(&ROPE_PROMPT_CHECK));
    // (Hq, Hkv, d, rotated dims (0: none), dtype, tokens, positions, QK-norm, period table).
    type Case = (i32, i32, i32, i32, Dtype, i32, &'static [i32], bool, bool);
    let cases: [Case; 5] = [
        (32, 32, 128, 128, Dtype::Bfloat16, 2048, &[30720], true, false),
        (32, 8, 128, 128, Dtype::Bfloat16, 2048, &[131072], true, false),
        (8, 2, 64, 32, Dtype::Bfloat16, 300, &[5, 9000], true, true),
        (4, 2, 64, 0, Dtype::Float16, 77, &[0], false, false),
        (6, 6, 32, 32, Dtype::Float32, 65, &[12, 1], false, false),
    ];
    for (i, &(hq, hkv, d, dims, dtype, t, at, normed, table)) in cases.iter().enumerate() {
        let seed = 7500 + 10 * i as u64;
        let b = at.len() as i32;
        let width = (hq + 2 * hkv) * d;
        // A view of wider rows (SALA's carry the output gate's columns after v).
        let rows = randn(&[b, t, width + 16 + d], seed, dtype).try_index((.., .., 16..16 + width + d)).unwrap();
        let weight = |s| randn(&[d], s, Dtype::Float32).multiply(Array::from_f32(0.3)).unwrap().add(Array::from_f32(1.0)).unwrap().as_dtype(dtype).unwrap();
        let (qn, kn) = (weight(seed + 1), weight(seed + 2));
        let periods: Vec<f32> = (0..dims / 2).map(|j| 10000f32.powf(2.0 * j as f32 / dims as f32) * (1.0 + j as f32 / 4.0)).collect();
        let angles = match (dims, table) {
            (0, _) => None,
            (_, true) => Some(RopeAngles { dims, base: 0.0, periods: Some(Array::from_slice(&periods, &[dims / 2])), position_scale: 0.25, mscale: 1.1 }),
            (_, false) => Some(RopeAngles { dims, base: 1_000_000.0, periods: None, position_scale: 1.0, mscale: 1.0 }),
        };
        let heads = QkHeads { heads: hq, kv_heads: hkv, head_dim: d, norms: normed.then_some((&qn, &kn, 1e-6)) };
        let positions = Array::from_slice(at, &[b]);
        let got = prompt_heads(&rows, heads, angles.as_ref(), &positions).unwrap();
        let want = prompt_heads_mlx(&rows, heads, angles.as_ref(), &positions).unwrap();
        let tol = if dtype == Dtype::Float32 { 1e-5 } else { 1e-2 };
        for (name, g, w) in [("q", &got[0], &want[0]), ("k", &got[1], &want[1])] {
            assert_eq!((g.shape(), g.dtype()), (w.shape(), w.dtype()), "case {i}, {name}");
            let err = rel_err(g, w);
            assert!(err < tol, "case {i}, {name}: relative error {err}");
        }
        let f = |a: &Array| to_vec_f32(&a.as_dtype(Dtype::Float32).unwrap()).unwrap();
        assert_eq!(got[2].shape(), &[b, hkv, t, d]);
        assert!(f(&got[2]) == f(&want[2]), "case {i}: the values differ");
    }
}

/// Every kernel passes its self-check on this device; CUDA-only kernels are not used on Metal.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn every_kernel_passes_its_self_check() {
    assert!(select(Some(DeviceKind::Gpu)).is_ok() && backend() != Backend::Cpu, "{NEEDS_GPU}");
    for check in sala::models::kernel_checks() {
        let start = std::time::Instant::now();
        let ran = selfcheck::recheck(check);
        let status = selfcheck::status(check);
        eprintln!("{:<24} {status:?} ({:.2} s)", check.name, start.elapsed().as_secs_f64());
        if check.backends.contains(&backend()) {
            assert!(ran && status == Status::Verified, "{}: {status:?}", check.name);
        } else {
            assert!(!ran && status == Status::NotUsed, "{}: {status:?}", check.name);
        }
    }
}

/// Compiling the checks' kernels ahead reaches every variant their full runs launch: after it,
/// the checks (all passing) launch no variant for the first time, so none waits for a compile of
/// its own. Meaningful in a process of its own (eval/device-serving.sh's gputests step): one
/// that has launched every check's kernels before reports itself skipped.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn compiling_ahead_reaches_every_kernel_variant_the_checks_launch() {
    use sala::kernels::custom::{variants_from, variants_launched};
    assert!(select(Some(DeviceKind::Gpu)).is_ok() && backend() != Backend::Cpu, "{NEEDS_GPU}");
    let checks = sala::models::kernel_checks();
    let before = variants_launched();
    let mut reports = 0;
    let launched = selfcheck::compile_ahead(&checks, true, |_, _| reports += 1);
    let ahead = variants_launched() - before;
    if backend() != Backend::Cuda {
        assert_eq!((launched, ahead), (0, 0), "only CUDA compiles ahead");
        eprintln!("skipped: only CUDA compiles kernels ahead");
        return;
    }
    assert_eq!(launched, checks.iter().filter(|c| c.backends.contains(&Backend::Cuda)).count());
    if ahead == 0 {
        eprintln!("skipped: this process had launched every check's kernels already (run the test alone)");
        return;
    }
    assert!(reports >= 1);
    for check in &checks {
        assert!(selfcheck::recheck(check), "{}: {:?}", check.name, selfcheck::status(check));
    }
    let during = variants_from(before + ahead);
    assert!(during.is_empty(), "{ahead} variants launched ahead; the checks then met these too: {during:?}");
}

/// The norm-gate kernel's source with another body (see `kernels::lightning`'s own).
const fn norm_gate_variant(name: &'static str, cuda_body: &'static str, metal_body: &'static str) -> KernelSource {
    KernelSource {
        name,
        inputs: &["o", "gate_src", "weight"],
        outputs: &["out"],
        cuda_header: concat!(include_str!("../cuda/round.cu"), include_str!("../cuda/lightning_decode.cu")),
        cuda_body,
        metal_header: include_str!("../metal/lightning_decode.metal"),
        metal_body,
        contiguous_inputs: true,
        shared_memory: 0,
    }
}

/// The real body, under another name: the launch below is right.
static NORM_GATE_AS_IS: KernelSource = norm_gate_variant(
    "test_norm_gate_as_is",
    "sala_norm_gate<T, D, Z_OFF, EPS_BITS, NT>(o, gate_src, gate_src_shape[2], weight, out);",
    "threadgroup float partial[NT / 32]; \
     sala_norm_gate<T, D, Z_OFF, EPS_BITS, NT>(o, gate_src, int(gate_src_shape[2]), weight, out, partial, \
     thread_position_in_threadgroup.x, threadgroup_position_in_grid.y, thread_index_in_simdgroup, \
     simdgroup_index_in_threadgroup);",
);

/// A bug: the gate read one column too far right.
static NORM_GATE_WRONG: KernelSource = norm_gate_variant(
    "test_norm_gate_wrong",
    "sala_norm_gate<T, D, Z_OFF + 1, EPS_BITS, NT>(o, gate_src, gate_src_shape[2], weight, out);",
    "threadgroup float partial[NT / 32]; \
     sala_norm_gate<T, D, Z_OFF + 1, EPS_BITS, NT>(o, gate_src, int(gate_src_shape[2]), weight, out, partial, \
     thread_position_in_threadgroup.x, threadgroup_position_in_grid.y, thread_index_in_simdgroup, \
     simdgroup_index_in_threadgroup);",
);

/// A body that does not compile (a function that does not exist).
static NORM_GATE_NOT_COMPILING: KernelSource = norm_gate_variant(
    "test_norm_gate_not_compiling",
    "sala_norm_gate_missing<T, D>(o, gate_src, weight, out);",
    "sala_norm_gate_missing<T, D>(o, gate_src, weight, out);",
);

/// Launches a norm-gate variant as `kernels::lightning::norm_gate` launches its kernel.
fn launch_norm_gate(source: &'static KernelSource, o: &Array, src: &Array, offset: i32, weight: &Array) -> mlx_rs::error::Result<Array> {
    let (b, t, dim) = (o.shape()[0], o.shape()[1], o.shape()[2]);
    let out = apply(
        source,
        &[o, src, weight],
        Launch {
            grid: (1024, b * t, 1),
            threads: (1024, 1, 1),
            outputs: vec![(vec![b, t, dim], o.dtype())],
            template: vec![
                ("T", TemplateArg::Type(o.dtype())),
                ("D", TemplateArg::Int(dim)),
                ("Z_OFF", TemplateArg::Int(offset)),
                ("EPS_BITS", TemplateArg::Int(1e-6f32.to_bits() as i32)),
                ("NT", TemplateArg::Int(1024)),
            ],
            init: None,
        },
    )?;
    Ok(out.into_iter().next().expect("one output"))
}

/// The norm-gate inputs of a check: o `[2, 3, 256]`, z at column 40 of wider rows, in bfloat16.
fn norm_gate_inputs() -> mlx_rs::error::Result<(Array, Array, Array)> {
    let bf16 = Dtype::Bfloat16;
    Ok((selfcheck::sample(&[2, 3, 256], 1, bf16)?, selfcheck::sample(&[2, 3, 304], 2, bf16)?, selfcheck::sample(&[256], 3, bf16)?))
}

fn check_norm_gate_variant(source: &'static KernelSource) -> Verdict {
    verify(
        norm_gate_inputs,
        |(o, src, weight)| Ok(vec![launch_norm_gate(source, o, src, 40, weight)?]),
        |(o, src, weight)| Ok(vec![norm_gate_mlx(o, src, 40, weight, 1e-6)?]),
    )
}

static AS_IS_CHECK: KernelCheck = KernelCheck { name: "test_norm_gate_as_is", backends: CUDA_AND_METAL, run: || check_norm_gate_variant(&NORM_GATE_AS_IS) };
static WRONG_CHECK: KernelCheck = KernelCheck { name: "test_norm_gate_wrong", backends: CUDA_AND_METAL, run: || check_norm_gate_variant(&NORM_GATE_WRONG) };
static NOT_COMPILING_CHECK: KernelCheck =
    KernelCheck { name: "test_norm_gate_not_compiling", backends: CUDA_AND_METAL, run: || check_norm_gate_variant(&NORM_GATE_NOT_COMPILING) };

/// A caller written as the kernels' public functions are: the variant once it passed its check,
/// the MLX-ops version otherwise.
fn gated_rows(check: &KernelCheck, source: &'static KernelSource, o: &Array, src: &Array, weight: &Array) -> Array {
    if selfcheck::enabled(check) {
        launch_norm_gate(source, o, src, 40, weight).unwrap()
    } else {
        norm_gate_mlx(o, src, 40, weight, 1e-6).unwrap()
    }
}

/// The acceptance test of the self-check on a device: a real kernel with a bug and one that does
/// not compile are switched off (once: a second call does not check again), and their caller
/// returns exactly the MLX-ops version's values; the same kernel as it is passes and runs; and
/// after the failed compile the real kernels still run and agree.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn broken_kernels_are_switched_off_and_the_mlx_ops_version_runs() {
    use_gpu();
    let (o, src, weight) = norm_gate_inputs().unwrap();
    let want = to_vec_f32(&norm_gate_mlx(&o, &src, 40, &weight, 1e-6).unwrap()).unwrap();
    for (check, source, reason) in [
        (&WRONG_CHECK, &NORM_GATE_WRONG, "relative error"),
        (&NOT_COMPILING_CHECK, &NORM_GATE_NOT_COMPILING, "the kernel failed: "),
    ] {
        for _ in 0..2 {
            let got = to_vec_f32(&gated_rows(check, source, &o, &src, &weight)).unwrap();
            assert!(got == want, "{}: the caller did not get the MLX-ops version's values", check.name);
        }
        let status = selfcheck::status(check);
        eprintln!("{}: {status:?}", check.name);
        assert!(matches!(&status, Status::Disabled(why) if why.contains(reason) && !why.contains('\n')), "{}: {status:?}", check.name);
    }
    // The wrong variant does compute something else: launched regardless, it is far off.
    let wrong = launch_norm_gate(&NORM_GATE_WRONG, &o, &src, 40, &weight).unwrap();
    let oracle = Array::from_slice(&want, o.shape());
    assert!(rel_err(&wrong, &oracle) > 0.1, "the wrong variant is not wrong: {}", rel_err(&wrong, &oracle));
    // The real body passes, and its caller gets the kernel's values.
    let got = gated_rows(&AS_IS_CHECK, &NORM_GATE_AS_IS, &o, &src, &weight);
    assert_eq!(selfcheck::status(&AS_IS_CHECK), Status::Verified);
    let kernel = launch_norm_gate(&NORM_GATE_AS_IS, &o, &src, 40, &weight).unwrap();
    assert!(to_vec_f32(&got).unwrap() == to_vec_f32(&kernel).unwrap());
    assert!(rel_err(&got, &oracle) < selfcheck::TOLERANCE as f32);
    // MLX runs on after the failed compile: the real kernel at the model's width.
    let (o, src, weight) = (randn(&[1, 1, 4096], 1, Dtype::Bfloat16), randn(&[1, 1, 4 * 4096], 2, Dtype::Bfloat16), randn(&[4096], 3, Dtype::Bfloat16));
    let err = rel_err(&norm_gate(&o, &src, 3 * 4096, &weight, 1e-6).unwrap(), &norm_gate_mlx(&o, &src, 3 * 4096, &weight, 1e-6).unwrap());
    assert!(err < 1e-2, "norm_gate after a failed compile: relative error {err}");
}

/// The draw keeps its rows' parameters on the device from step to step and works out each
/// step's keys itself: over consecutive steps of a batch (every row one draw further), then with a
/// row's seed changed, a row that skipped a draw, and rows in another order, the tokens equal
/// the MLX operations' with the keys computed on the host.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn draws_step_after_step_keep_their_keys() {
    use sala::engine::device_sampler::{DrawKey, RowDraw};
    use sala::kernels::draw::{draw, draw_mlx};
    use_gpu();
    let vocab = 5000;
    let base = RowDraw { temperature: 0.9, top_k: 0, top_p: 1.0, min_p: 0.0, key: DrawKey::default() };
    let mut rows = vec![
        RowDraw { key: DrawKey::new(1, 0), ..base },
        RowDraw { top_p: 0.9, key: DrawKey::new(u64::MAX - 3, 41), ..base },
        RowDraw { top_k: 30, min_p: 0.02, key: DrawKey::new(7 << 40, 1 << 33), ..base },
    ];
    let logits = randn(&[rows.len() as i32, vocab], 31, Dtype::Float32).multiply(Array::from_f32(2.0)).unwrap().as_dtype(Dtype::Bfloat16).unwrap();
    let check_on = |logits: &Array, rows: &[RowDraw], what: &str| {
        let got = draw(logits, None, rows).unwrap().as_slice::<u32>().to_vec();
        let want = draw_mlx(logits, None, rows).unwrap().as_slice::<u32>().to_vec();
        assert_eq!(got, want, "{what}");
        got
    };
    let check = |rows: &[RowDraw], what: &str| check_on(&logits, rows, what);
    let mut drawn = Vec::new();
    for step in 0..6 {
        drawn.push(check(&rows, &format!("step {step}")));
        rows.iter_mut().for_each(|r| r.key.draw += 1);
    }
    // Six steps of different keys give different tokens somewhere.
    assert!(drawn.windows(2).any(|w| w[0] != w[1]), "the same tokens every step: {drawn:?}");
    rows[0].key.seed = 2;
    check(&rows, "a seed changed");
    rows[1].key.draw += 1;
    check(&rows, "a row a draw ahead");
    rows.iter_mut().for_each(|r| r.key.draw += 1);
    check(&rows, "the step after");
    rows.swap(0, 2);
    check(&rows, "the rows in another order");
    // One row a draw, as one served stream draws: every array of one value a row.
    for (r, row) in rows.iter().enumerate() {
        check_on(&logits.try_index(r as i32..r as i32 + 1).unwrap(), std::slice::from_ref(row), &format!("row {r} alone"));
    }
}

/// Tokens drawn on the GPU are the CPU's, seed for seed: every filter alone and combined, with
/// penalties, a logit bias and a grammar mask, over SALA-sized rows spread as a trained model's
/// and as random weights' (flat: many ties where a threshold falls) (the CPU run of the same MLX
/// ops is the reference, as the distribution tests check it on the CPU).
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn device_draws_on_the_gpu_equal_the_cpus() {
    use sala::engine::device_sampler::{draw_rows, DrawKey, DrawRow, SequenceDraws};
    use sala::engine::sampler::SamplingParams;
    let (rows, vocab) = (48usize, 73448usize);
    let base = SamplingParams { temperature: 0.8, seed: Some(1), ..Default::default() };
    let settings = [
        SamplingParams { temperature: 0.0, ..base.clone() },
        base.clone(),
        SamplingParams { top_k: 40, ..base.clone() },
        SamplingParams { top_p: 0.9, ..base.clone() },
        SamplingParams { min_p: 0.05, ..base.clone() },
        SamplingParams { temperature: 1.3, top_k: 100, top_p: 0.95, min_p: 0.01, ..base.clone() },
        SamplingParams { repetition_penalty: 1.3, frequency_penalty: 0.5, presence_penalty: 0.4, logit_bias: vec![(7, 3.0), (70000, -5.0)], top_p: 0.95, ..base.clone() },
    ];
    let history: Vec<u32> = (0..64).map(|i| (i * 977 % vocab) as u32).collect();
    // Every other row under a mask allowing one token in three.
    let mask: Vec<u32> = (0..vocab.div_ceil(32)).map(|w| 0x4924_9249u32.rotate_left(w as u32 % 3)).collect();
    let draw = |logits: &Array| -> Vec<u32> {
        let mut states: Vec<SequenceDraws> = (0..rows).map(|r| SequenceDraws::new(&settings[r % settings.len()], &history, vocab).unwrap()).collect();
        let mut batch: Vec<DrawRow> = states
            .iter_mut()
            .enumerate()
            .map(|(r, state)| DrawRow { state, key: DrawKey::new(r as u64, 3), mask: (r % 2 == 1).then_some(mask.as_slice()), leaving: None })
            .collect();
        draw_rows(logits, &mut batch).unwrap().as_slice::<u32>().to_vec()
    };
    use_gpu();
    // Through the fused kernel (kernels::draw) on the GPU, its MLX operations on the CPU.
    sala::engine::device_sampler::use_draw_kernel(sala::kernels::draw::draw);
    for (dtype, scale) in [(Dtype::Bfloat16, 0.3), (Dtype::Bfloat16, 3.0), (Dtype::Bfloat16, 12.0)] {
        let logits = randn(&[rows as i32, vocab as i32], 9, Dtype::Float32).multiply(Array::from_f32(scale)).unwrap().as_dtype(dtype).unwrap();
        let gpu = draw(&logits);
        select(Some(DeviceKind::Cpu)).unwrap();
        let cpu = draw(&logits);
        select(Some(DeviceKind::Gpu)).unwrap();
        assert_eq!(gpu, cpu, "{dtype:?} logits, scale {scale}");
    }
    let logits = randn(&[rows as i32, vocab as i32], 9, Dtype::Float32).multiply(Array::from_f32(3.0)).unwrap();
    let gpu = draw(&logits);
    for (r, &t) in gpu.iter().enumerate().filter(|(r, _)| r % 2 == 1) {
        assert_eq!(mask[t as usize / 32] >> (t % 32) & 1, 1, "row {r} drew {t}, which its mask forbids");
    }
}

/// Marks of the device's clock bracket the work queued between them (`sala bench --profile`'s
/// device column): a mark after eight large products reads a later clock than the one before
/// them, by at least what the products take at the H200's peak. Off CUDA there is no clock.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn clock_marks_bracket_the_device_work_between_them() {
    use sala::engine::ops::depends;
    use sala::kernels::stamp::stamp;
    use_gpu();
    let x = random::normal::<f32>(&[4096, 4096], None, None, None).unwrap().as_dtype(Dtype::Bfloat16).unwrap();
    x.eval().unwrap();
    let Some(before) = stamp(&x).unwrap() else {
        assert_ne!(backend(), Backend::Cuda, "CUDA has a clock to read");
        return;
    };
    let mut y = depends(&x, &before).unwrap();
    for _ in 0..8 {
        y = ops::matmul(&y, &x).unwrap().multiply(Array::from_f32(1e-2)).unwrap().as_dtype(Dtype::Bfloat16).unwrap();
    }
    let after = stamp(&y).unwrap().expect("a second mark");
    mlx_rs::transforms::eval([&after, &before, &y]).unwrap();
    let read = |a: &Array| u64::from_le_bytes(sala::engine::ops::to_bytes(a).unwrap()[..8].try_into().unwrap());
    let (t0, t1) = (read(&before), read(&after));
    // 8 × 2 × 4096³ flops = 1.1 TFLOP: at least ~1.1 ms at 1 PFLOP/s of bf16, and well under a
    // minute.
    assert!(t1 > t0 + 1_000_000 && t1 < t0 + 60_000_000_000, "marks {t0} and {t1}");
}

/// A kernel of its own for the disk cache's test: y = K·x over N values.
static SCALED: KernelSource = KernelSource {
    name: "test_module_cache_scaled",
    inputs: &["x"],
    outputs: &["y"],
    cuda_header: "",
    cuda_body: "int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < N) { y[i] = x[i] * (float)K; }",
    metal_header: "",
    metal_body: "uint i = thread_position_in_grid.x; if (i < N) { y[i] = x[i] * float(K); }",
    contiguous_inputs: true,
    shared_memory: 0,
};

#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn mlx_keeps_a_bounded_share_of_a_cuda_gpu_in_freed_buffers() {
    if !on_cuda_unchecked("the bound applies on CUDA only") {
        return;
    }
    let total = sala::engine::device::gpu_info().and_then(|g| g.memory_bytes).expect("CUDA reports its memory");
    let bound = total / 100 * sala::engine::device::CUDA_BUFFER_CACHE_SHARE;
    assert_eq!(sala::engine::device::buffer_cache_bound(), Some(bound));
    let gib = 1u64 << 30;
    let buffers = |count: u64, value: f32| -> Vec<Array> {
        (0..count)
            .map(|i| {
                let a = ops::full::<f32>(&[1 << 28], Array::from_f32(value + i as f32)).unwrap();
                a.eval().unwrap();
                a
            })
            .collect()
    };
    // Buffers of a GiB each, more than the bound in all, freed together: the cache keeps some, and
    // at most one buffer past the bound (MLX recycles a freed buffer while the cache is below it).
    drop(buffers(bound / gib + 4, 0.0));
    let cached = mlx_rs::memory::cache_memory().unwrap() as u64;
    assert!(cached > 0 && cached <= bound + gib, "MLX keeps {cached} bytes of freed buffers; the bound is {bound}");
    // Trimmed: the buffers freed first go, down to a quarter of the bound, and the bound stands.
    let hot = buffers(2, 100.0);
    drop(hot);
    sala::engine::memory::trim_cached();
    let trimmed = mlx_rs::memory::cache_memory().unwrap() as u64;
    assert!(trimmed >= 2 * gib && trimmed <= bound / 4 + gib, "after trimming MLX keeps {trimmed} bytes; a quarter of the bound is {}", bound / 4);
    // The two freed last are among those kept: allocating them again adds nothing to the GPU's use.
    let active = mlx_rs::memory::active_memory().unwrap() as u64;
    let again = buffers(2, 200.0);
    // (Within a MiB: the fill values are small arrays of their own.)
    let (cached_now, active_now) = (mlx_rs::memory::cache_memory().unwrap() as u64, mlx_rs::memory::active_memory().unwrap() as u64);
    assert!(cached_now.abs_diff(trimmed - 2 * gib) < 1 << 20, "the last freed buffers were reused: {cached_now} cached, {trimmed} before");
    assert!(active_now.abs_diff(active + 2 * gib) < 1 << 20, "{active_now} active, {active} before");
    drop(again);
    drop(buffers(bound / gib + 4, 0.0));
    assert!(mlx_rs::memory::cache_memory().unwrap() as u64 > bound / 2, "the bound is back after trimming");
}

/// A kernel variant is compiled once per machine: its first launch in a process has the module
/// compiled (in the background) where MLX's disk cache looks (the same source, NVRTC and GPU as
/// MLX's own compile), its values are right, and MLX loads it from there: a module made
/// unloadable there stops the evaluation with MLX's own error. (CUDA only: Metal compiles in
/// milliseconds and MLX keeps no such cache.)
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn a_kernel_variant_is_compiled_once_into_mlx_disk_cache() {
    use sala::kernels::module_cache::{counts, settle, Module};
    if !on_cuda_unchecked("only CUDA keeps compiled kernels on disk") {
        return;
    }
    // A template argument no earlier run has used: a variant that cannot be in the cache yet.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    let unique = 1000 + ((nanos ^ std::process::id()) % 1_000_000) as i32 * 2;
    let x = Array::from_slice(&[1.0f32, 2.0, -3.0], &[3]);
    let launch = |k: i32| {
        let launch = Launch {
            grid: (32, 1, 1),
            threads: (32, 1, 1),
            outputs: vec![(vec![3], Dtype::Float32)],
            template: vec![("N", TemplateArg::Int(3)), ("K", TemplateArg::Int(k))],
            init: None,
        };
        apply(&SCALED, &[&x], launch).unwrap().remove(0)
    };
    let (_, compiled_before, left_before) = counts();
    let y = launch(unique);
    settle();
    let module = Module::of(&y).expect("the output of a custom kernel");
    let image = module.image_path();
    assert!(image.is_file(), "{} was not written", image.display());
    let names = std::fs::read_to_string(image.with_extension("txt")).unwrap();
    assert!(names.starts_with(&format!("mlx::core::cu::custom_kernel_test_module_cache_scaled_3_{unique}\t")), "{names}");
    let (_, compiled, left) = counts();
    assert_eq!((compiled, left), (compiled_before + 1, left_before), "compiled here once, nothing left to MLX");
    let k = unique as f32;
    assert_eq!(to_vec_f32(&y).unwrap(), [k, 2.0 * k, -3.0 * k]);

    let z = launch(unique + 1);
    settle();
    let image_z = Module::of(&z).unwrap().image_path();
    std::fs::write(&image_z, b"not a module").unwrap();
    let error = z.eval().expect_err("MLX loaded the module from the cache file");
    assert!(error.to_string().contains("Failed to load compiled"), "{error}");
    for path in [image.clone(), image.with_extension("txt"), image_z.clone(), image_z.with_extension("txt")] {
        std::fs::remove_file(path).unwrap();
    }
}

/// Launching the decode attention's variants ahead (as a server does at load) reaches every
/// variant that batches of 1 to 8 sequences at lengths from one token to 64K then meet: after it,
/// real decode steps at those sizes launch nothing new, and match MLX. Meaningful in a process of
/// its own (eval/device-serving.sh's gputests step).
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn decode_variants_launched_ahead_are_all_a_server_meets() {
    use sala::kernels::custom::{variants_from, variants_launched};
    use sala::kernels::sparse::{launch_decode_variants, DecodeShape};
    assert!(select(Some(DeviceKind::Gpu)).is_ok() && backend() != Backend::Cpu, "{NEEDS_GPU}");
    // Qwen3-8B's attention: 32 query heads over 8 KV heads of 128.
    let (hq, hkv, d, dtype) = (32, 8, 128, Dtype::Bfloat16);
    let scale = (d as f32).powf(-0.5);
    let shape = DecodeShape { heads: hq, head_dim: d, q_col: 0, gate_col: None };
    let new = launch_decode_variants(shape, hq * d, hkv, dtype, scale).unwrap();
    if backend() != Backend::Cuda {
        assert_eq!(new, 0, "only CUDA launches ahead");
        eprintln!("skipped: only CUDA compiles kernels ahead");
        return;
    }
    let after = variants_launched();
    for (i, lens) in [vec![1], vec![65_536], vec![700, 3], vec![5000, 1, 20_000], (1..=8).map(|j| 900 * j).collect::<Vec<usize>>(), vec![30_000; 8]].iter().enumerate() {
        let seed = 9000 + 10 * i as u64;
        let b = lens.len() as i32;
        let rows = projected_rows(b, hq, d, seed, dtype);
        let query = DecodeQuery { rows: &rows, heads: hq, head_dim: d, q_col: 0, gate_col: None };
        let parts: Vec<KvParts> = lens
            .iter()
            .enumerate()
            .map(|(j, &len)| {
                let (keys, values) = cache_keys_values(hkv, len as i32, d, seed, j, dtype);
                KvParts { keys, values, recent: None, settled: len, len, scales: None, counts: None }
            })
            .collect();
        let got = decode_attention(&query, &parts, scale).unwrap();
        let want = decode_oracle(&query.heads().unwrap(), None, &parts, scale);
        let err = rel_err(&got, &want);
        assert!(err < 1e-2, "lengths {lens:?}: relative error {err}");
    }
    let met = variants_from(after);
    assert!(met.is_empty(), "{new} variants launched ahead; decode steps then met these too: {met:?}");
}

/// MLX-CUDA plans each prefill attention shape with cuDNN and, by default, throws "Cache
/// thrashing" for every new shape once it has missed its plan cache more than 512 times in a
/// process: a server then failed every prompt. With `sala`'s MLX settings (made before MLX's first
/// call, as `sala` does) prefill chunks at 600 key lengths all answer, and still as attention does.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn prefill_attention_at_more_shapes_than_mlx_plans_keeps_answering() {
    use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
    sala::engine::device::configure_runtime();
    assert!(select(Some(DeviceKind::Gpu)).is_ok() && backend() != Backend::Cpu, "{NEEDS_GPU}");
    if backend() != Backend::Cuda {
        eprintln!("skipped: only MLX-CUDA caches attention plans");
        return;
    }
    let (heads, queries, d) = (8, 16, 64);
    let q = randn(&[1, heads, queries, d], 1, Dtype::Bfloat16);
    let scale = 1.0 / (d as f32).sqrt();
    for extra in 0..600 {
        let n = queries + extra;
        let (k, v) = (randn(&[1, heads, n, d], 2, Dtype::Bfloat16), randn(&[1, heads, n, d], 3, Dtype::Bfloat16));
        let o = scaled_dot_product_attention(&q, &k, &v, scale, ScaledDotProductAttentionMask::Causal, None)
            .and_then(|o| o.eval().map(|_| o))
            .unwrap_or_else(|e| panic!("attention over {n} keys: {e}"));
        if extra % 150 == 149 {
            let err = rel_err(&o, &causal_attention_reference(&q, &k, &v, scale));
            assert!(err < 2e-2, "attention over {n} keys is off by {err}");
        }
    }
}

/// Causal attention in float32 by masked softmax, query i of t seeing keys up to L − t + i (query
/// heads in groups over the key heads).
fn causal_attention_reference(q: &Array, k: &Array, v: &Array, scale: f32) -> Array {
    let (t, n) = (q.shape()[2], k.shape()[2]);
    let groups = q.shape()[1] / k.shape()[1];
    let f32_of = |a: &Array| ops::repeat_axis::<f32>(a.as_dtype(Dtype::Float32).unwrap(), groups, 1).unwrap();
    let scores = ops::multiply(ops::matmul(q.as_dtype(Dtype::Float32).unwrap(), f32_of(k).swap_axes(2, 3).unwrap()).unwrap(), Array::from_f32(scale)).unwrap();
    let rows = Array::from_iter(0..t, &[t, 1]);
    let cols = Array::from_iter(0..n, &[1, n]);
    let visible = ops::le(&cols, ops::add(&rows, Array::from_int(n - t)).unwrap()).unwrap();
    let masked = ops::select(&visible, &scores, Array::from_f32(f32::NEG_INFINITY)).unwrap();
    ops::matmul(ops::softmax_axis(&masked, -1, None).unwrap(), f32_of(v)).unwrap()
}

/// A prompt chunk's attention as the models call it: on CUDA, padded to repeating shapes with an
/// explicit mask through cuDNN. Chunks of 1 to 300 queries at offsets on and across the padded
/// lengths' steps, Qwen3-8B's grouped heads, keys read from a cache buffer with room to spare.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn prompt_attention_padded_through_cudnn_matches_masked_softmax() {
    sala::engine::device::configure_runtime();
    assert!(select(Some(DeviceKind::Gpu)).is_ok() && backend() != Backend::Cpu, "{NEEDS_GPU}");
    let (hq, hkv, d) = (32, 8, 128);
    let scale = 1.0 / (d as f32).sqrt();
    let (buffer_k, buffer_v) = (randn(&[1, hkv, 9000, d], 41, Dtype::Bfloat16), randn(&[1, hkv, 9000, d], 42, Dtype::Bfloat16));
    for (t, len) in [(2, 2), (7, 100), (64, 4096), (65, 4097), (300, 4200), (256, 8192), (256, 8193), (33, 8900)] {
        let q = randn(&[1, hq, t, d], 43 + t as u64, Dtype::Bfloat16);
        let (k, v) = (buffer_k.try_index((.., .., ..len, ..)).unwrap(), buffer_v.try_index((.., .., ..len, ..)).unwrap());
        let o = sala::models::layers::prompt_attention(&q, &k, &v, scale).unwrap();
        let err = rel_err(&o, &causal_attention_reference(&q, &k, &v, scale));
        assert!(err < 2e-2, "{t} queries over {len} keys: off by {err}");
    }
}

/// The int8 prompt product (`cuda/qmm_i8.cu`) against its MLX-ops oracle: x rounded to 8 bits
/// as the oracle rounds it (the same integers, the same scales), the product within the output's
/// rounding, at shapes past the 128 × 128 tiles, MLX's three group sizes, bf16 and f16. Its
/// departure from the exact product (x not rounded) is printed and bounded.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn int8_prompt_product_matches_its_oracle() {
    use sala::kernels::qmm_i8::{product, product_mlx, quantize_rows_i8, quantize_rows_i8_mlx, supports};
    if !on_cuda_unchecked("the int8 product is CUDA's") {
        return;
    }
    let f = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
    let cases = [
        (300, 200, 1024, 64, Dtype::Bfloat16),
        (128, 256, 4096, 128, Dtype::Bfloat16),
        (77, 130, 1024, 32, Dtype::Float16),
        (1, 2, 2048, 64, Dtype::Bfloat16),
        (2048, 1024, 4096, 64, Dtype::Bfloat16),
    ];
    for (seed, (m, n, k, group, dtype)) in cases.into_iter().enumerate() {
        let seed = 500 + 7 * seed as u64;
        let w = randn(&[n, k], seed, Dtype::Float32);
        let (packed, scales, biases) = ops::quantize(&w, group, 8).unwrap();
        let (scales, biases) = (scales.as_dtype(dtype).unwrap(), biases.as_dtype(dtype).unwrap());
        // Rows of different sizes, one of them all zeros.
        let x = randn(&[m, k], seed + 1, Dtype::Float32).multiply(randn(&[m, 1], seed + 2, Dtype::Float32)).unwrap();
        let x = if m > 3 { ops::concatenate(&[x.try_index(..m - 1).unwrap(), ops::zeros::<f32>(&[1, k]).unwrap()], 0).unwrap() } else { x };
        let x = x.as_dtype(dtype).unwrap();
        assert!(supports(&x, &packed, group, 8), "{m}×{k}·{n} group {group}");
        let (got, want) = (quantize_rows_i8(&x, group).unwrap(), quantize_rows_i8_mlx(&x, group).unwrap());
        let name = format!("{m}×{k}·{k}×{n} group {group} {dtype:?}");
        assert_eq!(to_vec_i32(&got.xq.as_dtype(Dtype::Int32).unwrap()).unwrap(), to_vec_i32(&want.xq.as_dtype(Dtype::Int32).unwrap()).unwrap(), "{name}: xq");
        assert_eq!(to_vec_f32(&got.xs).unwrap(), to_vec_f32(&want.xs).unwrap(), "{name}: xs");
        let sums = |r: &sala::kernels::qmm_i8::RowsI8| f(&r.sum_hi).add(f(&r.sum_lo)).unwrap();
        assert!(rel_err(&sums(&got), &sums(&want)) < 1e-5, "{name}: group sums");
        let y = product(&got, &packed, &scales, &biases, group, dtype).unwrap();
        assert_eq!(y.shape(), &[m, n]);
        let oracle = product_mlx(&want, &packed, &scales, &biases, group).unwrap();
        let err = rel_err(&y, &oracle);
        // The kernel's output is rounded to 16 bits (bf16: 2^-9 of each value at most).
        let tol = if dtype == Dtype::Float16 { 1e-3 } else { 4e-3 };
        assert!(err < tol, "{name}: relative error {err} against the oracle");
        // Dequantized, not MLX's float32 quantized matmul: that cannot launch in groups of 128.
        let exact = f(&x).matmul(ops::dequantize(&packed, f(&scales), &f(&biases), group, 8).unwrap().t()).unwrap();
        let departure = rel_err(&y, &exact);
        eprintln!("{name}: against the oracle {err:.2e}, against the exact product {departure:.2e}");
        // 1.4–2.4e-2 on an H200 (the most for one row of two outputs, where no norm averages).
        assert!(departure < 3e-2, "{name}: {departure} from the exact product");
    }
}

/// Float32 products of 8-bit matrices in groups of 128 past 32 rows, which MLX 0.32's CUDA
/// quantized matmul cannot launch (its fallback kernel asks for 64 KiB of shared memory without
/// raising CUDA's 48 KiB default): a model layer gives the dequantized product at every size, and
/// the row counts on either side of each path's bound agree with it.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn float32_products_in_groups_of_128_take_a_path_that_launches() {
    use sala::engine::quant::{QuantFormat, QuantizedMatrix};
    use sala::models::layers::Matrix;
    if !on_cuda_unchecked("MLX's quantized matmul launches these on Metal") {
        return;
    }
    let (n, k) = (256, 1024);
    let q = QuantizedMatrix::quantize(&randn(&[n, k], 800, Dtype::Float32), QuantFormat { group_size: 128, bits: 8 }).unwrap();
    let dequantized = q.dequantize().unwrap().as_dtype(Dtype::Float32).unwrap();
    for rows in [4, 5, 32, 33, 64, 255, 256] {
        let x = randn(&[rows, k], 801 + rows as u64, Dtype::Float32);
        let want = x.matmul(dequantized.t()).unwrap();
        let got = Matrix::Quantized(q.clone()).matmul_t(&x).unwrap();
        let direct = quantized_matmul_t_mlx(&x, &q.packed, &q.scales, &q.biases, 128, 8).unwrap();
        // bf16 input, float32 scales: the product runs in float32.
        let x_bf16 = x.as_dtype(Dtype::Bfloat16).unwrap();
        let mixed = quantized_matmul_t_mlx(&x_bf16, &q.packed, &q.scales, &q.biases, 128, 8).unwrap();
        let mixed_want = x_bf16.as_dtype(Dtype::Float32).unwrap().matmul(dequantized.t()).unwrap();
        // Within TF32's rounding, which MLX's float32 matmul may use on CUDA.
        for (path, got, want) in [("model", &got, &want), ("MLX call", &direct, &want), ("bf16 x, float32 scales", &mixed, &mixed_want)] {
            let err = rel_err(got, want);
            assert!(err < 3e-3, "{rows} rows, {path}: {err} from the dequantized product");
        }
    }
}

/// The epilogue kernels (`cuda/epilogue.cu`) after a prompt chunk's products: SwiGLU of SALA-9B's
/// stacked gate/up product and the residual branch at its α, on 2048 rows, and on a size whose
/// pieces do not fill the last thread block. SwiGLU rounds σ(g), g·σ(g) and the product once each
/// to the model's dtype, as the decode kernels do (cuda/round.cu): against that arithmetic in
/// float32 MLX operations each value is within its last bit (exp is not pinned) and nearly all are
/// equal (float32: within 1e-5); MLX's own sigmoid in bf16 rounds each of its steps, so against
/// `epilogue_mlx` only the relative error is bounded. The residual step is MLX's to the last bit.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn epilogue_kernels_match_mlxs_operations() {
    use sala::kernels::epilogue::{apply_epilogue, EPILOGUE_CHECK};
    use sala::kernels::qmv::{epilogue_mlx, Epilogue};
    if !on_cuda_unchecked("the kernels are CUDA's") {
        return;
    }
    assert!(selfcheck::enabled(&EPILOGUE_CHECK), "self-check: {:?}", selfcheck::status(&EPILOGUE_CHECK));
    let compare = |what: &str, got: &Array, want: &Array| {
        assert_eq!((got.shape(), got.dtype()), (want.shape(), want.dtype()), "{what}");
        let (g, w) = (to_vec_f32(got).unwrap(), to_vec_f32(want).unwrap());
        if got.dtype() == Dtype::Float32 {
            // No rounding to a narrower type to hide exp's and the division's last bits.
            let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs() / b.abs().max(1e-30)).fold(0f32, f32::max);
            assert!(worst < 1e-5, "{what}: a value {worst} (relative) from the oracle's");
            return;
        }
        // Neighbouring values of a 16-bit type (as float32 bits) are 2^16 apart.
        let steps = |(a, b): (&f32, &f32)| (a.to_bits() as i64 - b.to_bits() as i64).abs() >> 16;
        let worst = g.iter().zip(&w).map(steps).max().unwrap();
        let differing = g.iter().zip(&w).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert!(worst <= 1, "{what}: a value {worst} steps from the oracle's");
        assert!(differing * 100 <= g.len(), "{what}: {differing} of {} values differ from the oracle's", g.len());
    };
    // σ(g), g·σ(g) and the product each rounded to y's dtype, computed in float32.
    let swiglu_rounded = |y: &Array| {
        let dtype = y.dtype();
        let round = |a: Array| a.as_dtype(dtype).unwrap().as_dtype(Dtype::Float32).unwrap();
        let halves = ops::split_equal(y.as_dtype(Dtype::Float32).unwrap(), 2, -1).unwrap();
        let (g, up) = (&halves[0], &halves[1]);
        let act = round(g.multiply(round(ops::sigmoid(g).unwrap())).unwrap());
        act.multiply(up).unwrap().as_dtype(dtype).unwrap()
    };
    for (rows, width, dtype) in [(2048, 16384, Dtype::Bfloat16), (2048, 4096, Dtype::Bfloat16), (37, 264, Dtype::Float16), (5, 4100, Dtype::Float32)] {
        let y = randn(&[1, rows, 2 * width], 70 + rows as u64, dtype).multiply(Array::from_f32(4.0)).unwrap().as_dtype(dtype).unwrap();
        let got = apply_epilogue(&y, Epilogue::SwiGlu).unwrap();
        compare(&format!("SwiGLU {rows}×{width} {dtype:?}"), &got, &swiglu_rounded(&y));
        let mlx = to_vec_f32(&epilogue_mlx(&y, Epilogue::SwiGlu).unwrap()).unwrap();
        let g = to_vec_f32(&got).unwrap();
        let (diff, norm) = g.iter().zip(&mlx).fold((0f64, 0f64), |(d, n), (a, b)| (d + ((a - b) as f64).powi(2), n + (*b as f64).powi(2)));
        assert!((diff / norm).sqrt() < 1e-2, "SwiGLU {rows}×{width} {dtype:?}: relative error {} from MLX's operations", (diff / norm).sqrt());
        let y = randn(&[1, rows, width], 71, dtype);
        let residual = randn(&[1, rows, width], 72, dtype).multiply(Array::from_f32(30.0)).unwrap().as_dtype(dtype).unwrap();
        for alpha in [1.4 / 32f32.sqrt(), 1.0] {
            let epilogue = Epilogue::Residual { residual: &residual, alpha };
            compare(&format!("residual {rows}×{width} {dtype:?} α {alpha}"), &apply_epilogue(&y, epilogue).unwrap(), &epilogue_mlx(&y, epilogue).unwrap());
        }
    }
}

/// The dequantize kernel (`cuda/dequantize.cu`) gives MLX's `dequantize` to the bit: 4 and 8
/// bits, groups of 32, 64 and 128, bf16, f16 and float32 scales, on a 9B layer's widths and on a
/// matrix whose pieces do not fill the last thread block.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn dequantize_kernel_gives_mlxs_values_to_the_bit() {
    use sala::kernels::dequantize::{dequantize, dequantize_mlx, DEQUANTIZE_CHECK};
    if !on_cuda_unchecked("the kernel is CUDA's") {
        return;
    }
    assert!(selfcheck::enabled(&DEQUANTIZE_CHECK), "self-check: {:?}", selfcheck::status(&DEQUANTIZE_CHECK));
    for (n, k) in [(4096, 4096), (272, 384), (3, 128)] {
        for bits in [4, 8] {
            for group in [32, 64, 128] {
                for dtype in [Dtype::Bfloat16, Dtype::Float16, Dtype::Float32] {
                    let w = randn(&[n, k], 900 + n as u64, Dtype::Float32).multiply(Array::from_f32(0.05)).unwrap();
                    let (p, s, b) = ops::quantize(&w, group, bits).unwrap();
                    let (s, b) = (s.as_dtype(dtype).unwrap(), b.as_dtype(dtype).unwrap());
                    let got = dequantize(&p, &s, &b, group, bits).unwrap();
                    let want = dequantize_mlx(&p, &s, &b, group, bits).unwrap();
                    assert_eq!((got.shape(), got.dtype()), (want.shape(), want.dtype()));
                    let (g, w) = (to_vec_f32(&got).unwrap(), to_vec_f32(&want).unwrap());
                    let differing = g.iter().zip(&w).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                    let first = g.iter().zip(&w).position(|(a, b)| a.to_bits() != b.to_bits());
                    assert_eq!(differing, 0, "{n}×{k}, {bits} bits, groups of {group}, {dtype:?}: first at {first:?}: {:?}", first.map(|i| (g[i], w[i])));
                }
            }
        }
    }
}

/// The FP8 prompt product (`cuda/fp8_gemm.cu`, wgmma e4m3) against its MLX-ops oracle: x and W
/// rounded to e4m3 as the oracle rounds them (codes equal but for rare last-bit ties of a scale
/// computed with an fma), row-major and in the bulk product's tiles; the product within its
/// output's rounding in both forms, at partial tiles of rows and outputs, K past the ring of
/// stages and K not a multiple of the 128-byte tile, from 8- and 4-bit matrices and from a dense
/// one; its departure from the exact product printed and bounded.
#[test]
#[ignore = "needs a GPU build of MLX: eval/device-tests.sh runs it with --include-ignored"]
fn fp8_prompt_product_matches_its_oracle() {
    use sala::kernels::fp8::{
        available, product, product_mlx, quantized_to_e4m3, quantized_to_e4m3_mlx, rows_to_e4m3, rows_to_e4m3_mlx, RowsE4m3,
    };
    if !on_cuda_unchecked("the FP8 product is CUDA's") {
        return;
    }
    if !sala::kernels::custom::hopper() {
        eprintln!("skipped: wgmma needs compute capability 9 (Hopper)");
        return;
    }
    assert!(available(), "the FP8 kernels failed their self-check on a Hopper GPU");
    let f = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
    // (rows, outputs, K, weights: bits and group, or 0 for dense, x's dtype)
    let cases = [
        (300, 200, 1024, (8, 64), Dtype::Bfloat16),
        (128, 256, 4096, (8, 128), Dtype::Bfloat16),
        (77, 130, 1024, (4, 32), Dtype::Float16),
        (50, 576, 576, (0, 0), Dtype::Bfloat16),
        (1, 2, 2048, (8, 64), Dtype::Bfloat16),
        (2048, 1024, 4096, (8, 64), Dtype::Bfloat16),
    ];
    let codes_agree = |got: &RowsE4m3, want: &RowsE4m3, what: &str| {
        let (g, w) = (to_vec_i32(&got.row_major().unwrap()).unwrap(), to_vec_i32(&want.q).unwrap());
        assert_eq!(g.len(), w.len(), "{what}");
        let differ = g.iter().zip(&w).filter(|(a, b)| a != b).count();
        assert!(differ * 1000 <= g.len(), "{what}: {differ} of {} e4m3 codes differ from the oracle's", g.len());
        assert!(rel_err(&got.s, &want.s) < 1e-6, "{what}: row scales");
        assert!(rel_err(&got.values(Dtype::Float32).unwrap(), &want.values(Dtype::Float32).unwrap()) < 1e-3, "{what}: values");
    };
    for (seed, (m, n, k, (bits, group), dtype)) in cases.into_iter().enumerate() {
        let seed = 900 + 7 * seed as u64;
        let name = format!("{m}×{k}·{k}×{n} {bits} bits groups of {group} {dtype:?}");
        let x = randn(&[m, k], seed, Dtype::Float32).multiply(randn(&[m, 1], seed + 1, Dtype::Float32)).unwrap().as_dtype(dtype).unwrap();
        let w = randn(&[n, k], seed + 2, Dtype::Float32);
        let dense = w.as_dtype(dtype).unwrap();
        let quantized = (bits > 0).then(|| {
            let (p, s, b) = ops::quantize(&w, group, bits).unwrap();
            (p, s.as_dtype(dtype).unwrap(), b.as_dtype(dtype).unwrap())
        });
        let round_w = |tiles: Option<i32>| match &quantized {
            None => rows_to_e4m3(&dense, tiles).unwrap(),
            Some((p, s, b)) => quantized_to_e4m3(p, s, b, group, bits, tiles).unwrap(),
        };
        let (w_oracle, exact_w) = match &quantized {
            None => (rows_to_e4m3_mlx(&dense).unwrap(), f(&dense)),
            Some((p, s, b)) => (quantized_to_e4m3_mlx(p, s, b, group, bits).unwrap(), ops::dequantize(p, f(s), &f(b), group, bits).unwrap()),
        };
        let x_oracle = rows_to_e4m3_mlx(&x).unwrap();
        let oracle = product_mlx(&x_oracle, &w_oracle).unwrap();
        let mut y = None;
        // The bulk form's tiles, then row-major x and W.
        for tiles in [Some((128, 256)), None] {
            let what = format!("{name}, tiles {tiles:?}");
            let (x_rounded, w_rounded) = (rows_to_e4m3(&x, tiles.map(|t| t.0)).unwrap(), round_w(tiles.map(|t| t.1)));
            assert_eq!(w_rounded.tile_rows, tiles.map(|t| t.1), "{what}: W's layout");
            codes_agree(&w_rounded, &w_oracle, &format!("{what}: W"));
            codes_agree(&x_rounded, &x_oracle, &format!("{what}: x"));
            let got = product(&x_rounded, &w_rounded, dtype).unwrap();
            assert_eq!(got.shape(), &[m, n]);
            // Against the oracle's product of the kernels' own roundings.
            let err = rel_err(&got, &product_mlx(&x_rounded, &w_rounded).unwrap());
            let tol = if dtype == Dtype::Float16 { 1e-3 } else { 4e-3 };
            assert!(err < tol, "{what}: relative error {err} against the oracle");
            eprintln!("{what}: against the oracle {err:.2e}, against the oracle's roundings {:.2e}", rel_err(&got, &oracle));
            y.get_or_insert(got);
        }
        let departure = rel_err(&y.unwrap(), &f(&x).matmul(exact_w.t()).unwrap());
        eprintln!("{name}: against the exact product {departure:.2e}");
        // 3.7e-2 on an H200, 0.13 for one row of two outputs (no norm averages the rounding).
        let bound = if n < 8 { 0.25 } else { 5e-2 };
        assert!(departure < bound, "{name}: {departure} from the exact product");
    }
}
