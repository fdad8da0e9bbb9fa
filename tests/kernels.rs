//! The kernels on random inputs: chunked GLA against the token-by-token recurrence (with and
//! without a carried state, full and partial chunks), and the InfLLM-V2 block selection and
//! block-sparse attention against straightforward host-side implementations of the spec. And the
//! kernels' self-check (`kernels::selfcheck`) driven by stand-in kernels on the CPU: a wrong one,
//! one that fails to compile, one returning NaN and one whose check panics are switched off with
//! one warning each and their callers get the MLX-ops version's values; every registered check
//! runs all but its kernel here. (A real broken kernel on a GPU: tests/gpu_kernels.rs.)

mod common;

use mlx_rs::{ops::indexing::TryIndexOp, random, Array, Dtype};
use sala::engine::cache::KvParts;
use sala::engine::ops::{to_vec_f32, to_vec_i32};
use sala::kernels::gla::{alibi_slopes, simple_gla, simple_gla_chunked, simple_gla_recurrent};
use sala::kernels::sparse::BlockSelection;
use sala::models::sala::infllm::{block_sparse_attention, select_blocks_chunked, select_blocks_scored};

fn randn(shape: &[i32], seed: u64) -> Array {
    let key = random::key(seed).unwrap();
    random::normal::<f32>(shape, None, None, &key).unwrap()
}

fn max_diff(a: &Array, b: &Array) -> f32 {
    let (a, b) = (to_vec_f32(a).unwrap(), to_vec_f32(b).unwrap());
    assert_eq!(a.len(), b.len());
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn chunked_gla_equals_recurrent_gla() {
    let (b, h, d) = (1, 4, 16);
    let slopes = Array::from_slice(&alibi_slopes(h as usize), &[h]);
    for (i, t) in [2, 37, 64, 65, 150, 200].into_iter().enumerate() {
        let seed = 100 + i as u64 * 10;
        let q = randn(&[b, h, t, d], seed);
        let k = randn(&[b, h, t, d], seed + 1).multiply(Array::from_f32(0.3)).unwrap();
        let v = randn(&[b, h, t, d], seed + 2);
        let s0 = randn(&[b, h, d, d], seed + 3);
        for state in [None, Some(&s0)] {
            let (o_ref, s_ref) = simple_gla_recurrent(&q, &k, &v, &slopes, state, 0.25).unwrap();
            let (o, s) = simple_gla_chunked(&q, &k, &v, &slopes, state, 0.25).unwrap();
            let (eo, es) = (max_diff(&o, &o_ref), max_diff(&s, &s_ref));
            assert!(eo < 1e-4 && es < 1e-4, "T={t} state={}: output {eo}, state {es}", state.is_some());
        }
    }
}

#[test]
fn gla_split_across_calls_equals_one_call() {
    // A prefill cut at a partial chunk must carry exactly the state of the uncut run.
    let (b, h, t, d) = (1, 2, 150, 8);
    let slopes = Array::from_slice(&alibi_slopes(h as usize), &[h]);
    let q = randn(&[b, h, t, d], 7);
    let k = randn(&[b, h, t, d], 8);
    let v = randn(&[b, h, t, d], 9);
    let (o_all, s_all) = simple_gla_chunked(&q, &k, &v, &slopes, None, 0.5).unwrap();
    use mlx_rs::ops::indexing::TryIndexOp;
    let part = |x: &Array, r: std::ops::Range<i32>| x.try_index((.., .., r, ..)).unwrap();
    let (o1, s1) = simple_gla_chunked(&part(&q, 0..70), &part(&k, 0..70), &part(&v, 0..70), &slopes, None, 0.5).unwrap();
    let (o2, s2) =
        simple_gla_chunked(&part(&q, 70..t), &part(&k, 70..t), &part(&v, 70..t), &slopes, Some(&s1), 0.5).unwrap();
    assert!(max_diff(&s2, &s_all) < 1e-4);
    assert!(max_diff(&o1, &part(&o_all, 0..70)) < 1e-4);
    assert!(max_diff(&o2, &part(&o_all, 70..t)) < 1e-4);
}

#[test]
fn alibi_slopes_follow_the_power_of_two_schedule() {
    let s = alibi_slopes(32);
    for (h, &x) in s.iter().enumerate() {
        assert!((x - 2f32.powf(-((h + 1) as f32) / 4.0)).abs() < 1e-7);
    }
    assert_eq!(alibi_slopes(4), vec![0.25, 0.0625, 0.015625, 0.00390625]);
}

/// The spec's block selection, written out with loops over host data.
#[allow(clippy::too_many_arguments)]
fn naive_select(
    q: &[f32], c1: &[f32], c2: &[f32], dims: (usize, usize, usize, usize, usize, usize),
    first: usize, kv_len: usize, sel: &BlockSelection,
) -> (Vec<i32>, Vec<f32>) {
    let (hq, hkv, t, d, n1, n2) = dims;
    let g = hq / hkv;
    let scale = (d as f32).powf(-0.5);
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>() * scale;
    let nb = kv_len.div_ceil(sel.block);
    let k = sel.topk.min(nb);
    let mut blocks = vec![-1i32; hkv * t * sel.topk];
    let mut scores_out = vec![0f32; hkv * t * nb];
    for kv in 0..hkv {
        for ti in 0..t {
            let i = first + ti;
            let mut score = vec![0f32; n1];
            for hh in 0..g {
                let head = kv * g + hh;
                let qv = &q[(head * t + ti) * d..(head * t + ti + 1) * d];
                let vis2: Vec<f32> = (0..n2)
                    .filter(|&j| j * sel.stride2 + sel.kernel2 - 1 <= i)
                    .map(|j| dot(qv, &c2[(kv * n2 + j) * d..(kv * n2 + j + 1) * d]))
                    .collect();
                if vis2.is_empty() {
                    continue;
                }
                let m = vis2.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let lse = m + vis2.iter().map(|x| (x - m).exp()).sum::<f32>().ln();
                for (c, s) in score.iter_mut().enumerate() {
                    if c * sel.stride + sel.kernel - 1 <= i {
                        *s += (dot(qv, &c1[(kv * n1 + c) * d..(kv * n1 + c + 1) * d]) - lse).exp();
                    }
                }
            }
            let r = sel.block / sel.stride;
            let left = sel.kernel / sel.stride - 1;
            let qb = i / sel.block;
            let mut pooled = vec![f32::NEG_INFINITY; nb];
            for (b, p) in pooled.iter_mut().enumerate() {
                let lo = (r * b) as i64 - left as i64;
                for c in lo.max(0)..((r * b + r) as i64).min(n1 as i64) {
                    *p = p.max(score[c as usize]);
                }
                if b < sel.init_blocks || (b + sel.local_blocks >= qb && b <= qb) {
                    *p = f32::INFINITY;
                }
            }
            let mut order: Vec<usize> = (0..nb).collect();
            order.sort_by(|&a, &b| pooled[b].total_cmp(&pooled[a]).then(a.cmp(&b)));
            let mut chosen: Vec<usize> = order[..k].to_vec();
            chosen.sort();
            for (j, &b) in chosen.iter().enumerate() {
                blocks[(kv * t + ti) * sel.topk + j] = if b > qb { -1 } else { b as i32 };
            }
            scores_out[(kv * t + ti) * nb..(kv * t + ti + 1) * nb].copy_from_slice(&pooled);
        }
    }
    (blocks, scores_out)
}

fn selection() -> BlockSelection {
    BlockSelection { block: 64, kernel: 32, stride: 16, kernel2: 128, stride2: 64, init_blocks: 1, local_blocks: 2, topk: 6 }
}

#[test]
fn block_selection_matches_the_spec_on_random_inputs() {
    let sel = selection();
    let (hq, hkv, d) = (8usize, 2usize, 8usize);
    for (case, (first, t, kv_len)) in [(0usize, 40usize, 900usize), (700, 5, 1100), (1299, 1, 1300)].into_iter().enumerate() {
        let n1 = (kv_len - sel.kernel) / sel.stride + 1;
        let n2 = (kv_len - sel.kernel2) / sel.stride2 + 1;
        let seed = 1000 + case as u64 * 7;
        let q = randn(&[1, hq as i32, t as i32, d as i32], seed);
        let c1 = randn(&[1, hkv as i32, n1 as i32, d as i32], seed + 1);
        let c2 = randn(&[1, hkv as i32, n2 as i32, d as i32], seed + 2);
        // Quantise the level-1 keys so exact score ties (and the tie rule) really occur.
        let c1 = c1.multiply(Array::from_f32(2.0)).unwrap().round(None).unwrap().multiply(Array::from_f32(0.5)).unwrap();
        let got = select_blocks_scored(&q, &c1, &c2, first, kv_len, &sel, Dtype::Float32).unwrap();
        let (want_blocks, want_scores) = naive_select(
            &to_vec_f32(&q).unwrap(), &to_vec_f32(&c1).unwrap(), &to_vec_f32(&c2).unwrap(),
            (hq, hkv, t, d, n1, n2), first, kv_len, &sel,
        );
        assert_eq!(to_vec_i32(&got.blocks).unwrap(), want_blocks, "case {case}: blocks");
        let scores = to_vec_f32(&got.scores).unwrap();
        for (i, (g, w)) in scores.iter().zip(&want_scores).enumerate() {
            assert!(g == w || (g - w).abs() <= 1e-4 * w.abs().max(1.0), "case {case}: score {i}: {g} vs {w}");
        }
        // In query chunks (as at long context), with and without the scores: the same result.
        for keep_scores in [true, false] {
            let (blocks, kept) = select_blocks_chunked(&q, &c1, &c2, first, kv_len, &sel, Dtype::Float32, 16, keep_scores).unwrap();
            assert_eq!(to_vec_i32(&blocks).unwrap(), want_blocks, "case {case}: blocks in chunks of 16");
            assert_eq!(kept.is_some(), keep_scores, "case {case}: scores kept only when asked");
            if let Some(kept) = kept {
                assert_eq!(to_vec_f32(&kept).unwrap(), scores, "case {case}: scores in chunks of 16");
            }
        }
    }
}

#[test]
fn block_sparse_attention_matches_masked_dense_attention() {
    let (hq, hkv, d, kv_len, first) = (4i32, 2i32, 8i32, 300usize, 290usize);
    let t = 10i32;
    let q = randn(&[1, hq, t, d], 1);
    let k = randn(&[1, hkv, kv_len as i32, d], 2);
    let v = randn(&[1, hkv, kv_len as i32, d], 3);
    // Per KV head: blocks {0, 2, 4} and {1, 3, 4}; the last slot unused.
    let pattern = [[0, 2, 4, -1], [1, 3, 4, -1]];
    let mut idx = Vec::new();
    for p in &pattern {
        for _ in 0..t {
            idx.extend_from_slice(p);
        }
    }
    let blocks = Array::from_slice(&idx, &[1, hkv, t, 4]);
    // The output gate, given as the projection's output hands it over: a slice of wider rows.
    let gate_source = randn(&[1, t, 3 * hq * d], 4);
    let gate = gate_source.try_index((.., .., hq * d..2 * hq * d)).unwrap();
    let got = block_sparse_attention(&q, &KvParts::history(&k, &v, kv_len), &blocks, first, 64, 0.3, Some(&gate)).unwrap();
    // Heads side by side per query.
    assert_eq!(got.shape(), &[1, t, hq * d]);
    let (got, gate) = (to_vec_f32(&got).unwrap(), to_vec_f32(&gate).unwrap());
    let (qh, kh, vh) = (to_vec_f32(&q).unwrap(), to_vec_f32(&k).unwrap(), to_vec_f32(&v).unwrap());
    let (d, t) = (d as usize, t as usize);
    for head in 0..hq as usize {
        let kv = head / 2;
        for ti in 0..t {
            let i = first + ti;
            let allowed: Vec<usize> =
                (0..kv_len).filter(|&p| pattern[kv][..3].contains(&((p / 64) as i32)) && p <= i).collect();
            let qv = &qh[(head * t + ti) * d..(head * t + ti + 1) * d];
            let logits: Vec<f32> = allowed
                .iter()
                .map(|&p| qv.iter().zip(&kh[(kv * kv_len + p) * d..]).map(|(a, b)| a * b).sum::<f32>() * 0.3)
                .collect();
            let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let w: Vec<f32> = logits.iter().map(|l| (l - m).exp()).collect();
            let z: f32 = w.iter().sum();
            for j in 0..d {
                let attended: f32 = allowed.iter().zip(&w).map(|(&p, wi)| wi / z * vh[(kv * kv_len + p) * d + j]).sum();
                let at = (ti * hq as usize + head) * d + j;
                let want = attended / (1.0 + (-gate[at]).exp());
                let g = got[at];
                assert!((g - want).abs() < 1e-4, "head {head} query {ti} dim {j}: {g} vs {want}");
            }
        }
    }
}

#[test]
fn gla_takes_the_models_dtype_and_computes_in_float32() {
    let (b, h, d) = (1, 4, 16);
    let slopes = Array::from_slice(&alibi_slopes(h as usize), &[h]);
    let s0 = randn(&[b, h, d, d], 7);
    for t in [1, 5] {
        let [q, k, v] = [1, 2, 3].map(|s| randn(&[b, h, t, d], 10 * t as u64 + s).as_dtype(Dtype::Bfloat16).unwrap());
        let (o, s) = simple_gla(&q, &k, &v, &slopes, Some(&s0), 0.25).unwrap();
        assert_eq!((o.dtype(), s.dtype()), (Dtype::Bfloat16, Dtype::Float32), "T={t}");
        let f32 = |a: &Array| a.as_dtype(Dtype::Float32).unwrap();
        let (o_ref, s_ref) = simple_gla_recurrent(&f32(&q), &f32(&k), &f32(&v), &slopes, Some(&s0), 0.25).unwrap();
        // The output is the float32 result rounded once to bfloat16 (within a rounding step of
        // the recurrence's; the chunked form sums in another order).
        let o_ref = o_ref.as_dtype(Dtype::Bfloat16).unwrap();
        let scale = to_vec_f32(&f32(&o_ref)).unwrap().iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(max_diff(&f32(&o), &f32(&o_ref)) <= scale / 128.0, "T={t}: output");
        assert!(max_diff(&s, &s_ref) < 1e-4, "T={t}: state");
    }
}

/// The quantized product's epilogues as the CPU runs them (MLX operations; on a GPU the decode
/// kernel, tests/gpu_kernels.rs): SwiGLU of a stacked [gate; up] matrix and a scaled residual add,
/// against the same arithmetic on the host from the dequantized weights.
#[test]
fn quantized_product_epilogues_follow_their_definitions() {
    use sala::kernels::qmv::{quantized_matmul_t_then, Epilogue};
    let (f, k, rows) = (48usize, 128usize, 2usize);
    let w = randn(&[2 * f as i32, k as i32], 71);
    let (packed, scales, biases) = mlx_rs::ops::quantize(&w, 64, 8).unwrap();
    let wq = to_vec_f32(&mlx_rs::ops::dequantize(&packed, &scales, &biases, 64, 8).unwrap()).unwrap();
    let x = randn(&[rows as i32, k as i32], 72);
    let xs = to_vec_f32(&x).unwrap();
    let dot = |r: usize, n: usize| -> f64 { (0..k).map(|i| xs[r * k + i] as f64 * wq[n * k + i] as f64).sum() };

    let got = to_vec_f32(&quantized_matmul_t_then(&x, &packed, &scales, &biases, 64, 8, Epilogue::SwiGlu).unwrap()).unwrap();
    assert_eq!(got.len(), rows * f);
    for r in 0..rows {
        for n in 0..f {
            let (g, u) = (dot(r, n), dot(r, f + n));
            let want = g / (1.0 + (-g).exp()) * u;
            let have = got[r * f + n] as f64;
            assert!((have - want).abs() < 1e-3 * (1.0 + want.abs()), "swiglu row {r} col {n}: {have} vs {want}");
        }
    }

    let residual = randn(&[rows as i32, 2 * f as i32], 73);
    let res = to_vec_f32(&residual).unwrap();
    let got = quantized_matmul_t_then(&x, &packed, &scales, &biases, 64, 8, Epilogue::Residual { residual: &residual, alpha: 0.25 });
    let got = to_vec_f32(&got.unwrap()).unwrap();
    for r in 0..rows {
        for n in 0..2 * f {
            let want = res[r * 2 * f + n] as f64 + 0.25 * dot(r, n);
            let have = got[r * 2 * f + n] as f64;
            assert!((have - want).abs() < 1e-3 * (1.0 + want.abs()), "residual row {r} col {n}: {have} vs {want}");
        }
    }
}

mod self_check {
    use mlx_rs::{error::Exception, error::Result, Array, Dtype};
    use sala::engine::ops::to_vec_f32;
    use sala::kernels::custom::Backend;
    use sala::kernels::selfcheck::{self, verify, KernelCheck, Memo, Registry, Status, Verdict, CUDA_AND_METAL, CUDA_ONLY};
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicUsize, Ordering};

    thread_local! {
        // Each test has its own thread and registry.
        static WARNINGS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    }

    fn record(message: &str) {
        WARNINGS.with(|w| w.borrow_mut().push(message.to_string()));
    }

    fn warnings() -> Vec<String> {
        WARNINGS.with(|w| w.borrow().clone())
    }

    fn input() -> Result<Array> {
        selfcheck::sample(&[4, 64], 1, Dtype::Float32)
    }

    /// The MLX-ops version of the stand-in kernels: 2x + 1.
    fn oracle(x: &Array) -> Result<Array> {
        x.multiply(Array::from_f32(2.0))?.add(Array::from_f32(1.0))
    }

    /// Off by 0.5 everywhere: a kernel with a bug.
    fn wrong(x: &Array) -> Result<Array> {
        oracle(x)?.add(Array::from_f32(0.5))
    }

    /// What MLX reports when a kernel's source does not compile (a Metal compiler's log).
    fn not_compiling(_: &Array) -> Result<Array> {
        Err(Exception::custom(
            "[metal::Device] Unable to build metal library from source\nprogram_source:12:5: error: unknown type name 'flaot'\n    flaot y = x[i];\n    ^",
        ))
    }

    /// One NaN among right values.
    fn nan(x: &Array) -> Result<Array> {
        let mut values = to_vec_f32(&oracle(x)?)?;
        values[17] = f32::NAN;
        Ok(Array::from_slice(&values, x.shape()))
    }

    /// Right within the tolerance, but not bit for bit: its callers' results show which ran.
    fn close(x: &Array) -> Result<Array> {
        oracle(x)?.multiply(Array::from_f32(1.0 + 1e-4))
    }

    /// A stand-in kernel.
    type StandIn = fn(&Array) -> Result<Array>;

    fn check_with(kernel: StandIn) -> Verdict {
        verify(input, |x| Ok(vec![kernel(x)?]), |x| Ok(vec![oracle(x)?]))
    }

    /// `$check`, a check of the stand-in `$kernel` against the oracle on `$backends`, counting
    /// its runs in `$runs`.
    macro_rules! counted_check {
        ($check:ident, $runs:ident, $name:literal, $backends:expr, $kernel:expr) => {
            static $runs: AtomicUsize = AtomicUsize::new(0);
            static $check: KernelCheck = KernelCheck {
                name: $name,
                backends: $backends,
                run: || {
                    $runs.fetch_add(1, Ordering::SeqCst);
                    check_with($kernel)
                },
            };
        };
    }

    counted_check!(WRONG, WRONG_RUNS, "test_wrong", CUDA_AND_METAL, wrong);
    static NOT_COMPILING: KernelCheck = KernelCheck { name: "test_not_compiling", backends: CUDA_AND_METAL, run: || check_with(not_compiling) };
    static NAN: KernelCheck = KernelCheck { name: "test_nan", backends: CUDA_AND_METAL, run: || check_with(nan) };
    static PANICKING: KernelCheck = KernelCheck { name: "test_panicking", backends: CUDA_AND_METAL, run: || panic!("index out of bounds") };
    counted_check!(CLOSE, CLOSE_RUNS, "test_close", CUDA_ONLY, close);

    /// A kernel's public function as the real ones are written: the kernel once it has passed its
    /// check, the MLX-ops version otherwise.
    fn product(registry: &Registry, check: &KernelCheck, backend: Backend, kernel: StandIn, x: &Array) -> Vec<f32> {
        let y = if registry.enabled(check, backend) { kernel(x) } else { oracle(x) };
        to_vec_f32(&y.unwrap()).unwrap()
    }

    #[test]
    fn a_failing_kernel_is_switched_off_once_with_one_warning_and_its_callers_get_the_mlx_ops_values() {
        let registry = Registry::new(record);
        let x = input().unwrap();
        let want = to_vec_f32(&oracle(&x).unwrap()).unwrap();
        let cases: [(&KernelCheck, StandIn, &str); 4] = [
            (&WRONG, wrong, ", tolerance 1e-2"),
            (&NOT_COMPILING, not_compiling, "the kernel failed: [metal::Device] Unable to build metal library from source | program_source:12:5: error: unknown type name 'flaot'"),
            (&NAN, nan, "element 17 is NaN"),
            (&PANICKING, wrong, "its check panicked: index out of bounds"),
        ];
        for (i, (check, kernel, reason)) in cases.into_iter().enumerate() {
            assert_eq!(registry.status(check, Backend::Metal), Status::Unchecked);
            // Called three times: checked once, warned once, the MLX-ops version's values each time.
            for _ in 0..3 {
                assert_eq!(product(&registry, check, Backend::Metal, kernel, &x), want, "{}", check.name);
            }
            let Status::Disabled(why) = registry.status(check, Backend::Metal) else { panic!("{} not switched off", check.name) };
            assert!(why.contains(reason) && !why.contains('\n'), "{}: {why}", check.name);
            let warned = warnings();
            assert_eq!(warned.len(), i + 1, "{warned:?}");
            assert_eq!(
                warned[i],
                format!("kernel `{}` failed its self-check on metal ({why}); switched off for this process, its MLX-ops version runs instead", check.name)
            );
            // Per backend: on CUDA it is checked again, and switched off again.
            assert_eq!(registry.status(check, Backend::Cuda), Status::Unchecked);
        }
        assert_eq!(WRONG_RUNS.load(Ordering::SeqCst), 1);
        assert_eq!(product(&registry, &WRONG, Backend::Cuda, wrong, &x), want);
        assert_eq!(WRONG_RUNS.load(Ordering::SeqCst), 2);
        assert_eq!(warnings().len(), 5);
    }

    counted_check!(MEMO_GOOD, MEMO_GOOD_RUNS, "test_memo_good", CUDA_AND_METAL, close);
    counted_check!(MEMO_BAD, MEMO_BAD_RUNS, "test_memo_bad", CUDA_AND_METAL, wrong);

    /// A check passed is remembered on disk for later processes (registries) of the same binary on
    /// the same GPU, driver and MLX; a failed one never is; another backend or setting, or a
    /// recheck (`sala doctor`), runs the check again.
    #[test]
    fn a_passed_check_is_remembered_for_later_processes_in_the_same_setting() {
        let dir = std::env::temp_dir().join(format!("sala-kernel-memo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sala").join("kernel-checks");
        let memo = |setting: &str| Memo::new(path.clone(), setting.to_string());
        let runs = || (MEMO_GOOD_RUNS.load(Ordering::SeqCst), MEMO_BAD_RUNS.load(Ordering::SeqCst));

        let first = Registry::with_memo(record, memo("binary=1 mlx=0.32.2 gpu=G driver=13000"));
        assert!(first.enabled(&MEMO_GOOD, Backend::Cuda));
        assert!(!first.enabled(&MEMO_BAD, Backend::Cuda));
        assert_eq!(runs(), (1, 1));

        let later = Registry::with_memo(record, memo("binary=1 mlx=0.32.2 gpu=G driver=13000"));
        assert!(later.enabled(&MEMO_GOOD, Backend::Cuda), "remembered as passed");
        assert_eq!(later.status(&MEMO_GOOD, Backend::Cuda), Status::Verified);
        assert!(!later.enabled(&MEMO_BAD, Backend::Cuda), "a failure is checked again, and fails again");
        assert_eq!(runs(), (1, 2));
        assert!(later.enabled(&MEMO_GOOD, Backend::Metal));
        assert_eq!(runs(), (2, 2), "another backend is checked");
        for other in ["binary=2 mlx=0.32.2 gpu=G driver=13000", "binary=1 mlx=0.32.2 gpu=G driver=13010", "binary=1 mlx=0.32.3 gpu=G driver=13000"] {
            let registry = Registry::with_memo(record, memo(other));
            assert!(registry.enabled(&MEMO_GOOD, Backend::Cuda));
        }
        assert_eq!(runs(), (5, 2), "another binary, driver or MLX is checked");
        assert!(later.recheck(&MEMO_GOOD, Backend::Cuda));
        assert_eq!(runs(), (6, 2), "a recheck runs the check whatever is remembered");

        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(lines.iter().all(|l| l.starts_with("test_memo_good ")), "{text}");
        assert!(!dir.join("sala").read_dir().unwrap().any(|e| e.unwrap().file_name().to_string_lossy().contains(".part")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_kernel_that_agrees_runs_and_one_without_a_source_for_the_backend_is_never_checked() {
        let registry = Registry::new(record);
        let x = input().unwrap();
        let close_values = to_vec_f32(&close(&x).unwrap()).unwrap();
        assert_ne!(close_values, to_vec_f32(&oracle(&x).unwrap()).unwrap());
        // CUDA only: not on Metal or the CPU, and its check never runs there.
        for backend in [Backend::Metal, Backend::Cpu] {
            assert_eq!(registry.status(&CLOSE, backend), Status::NotUsed);
            assert!(!registry.enabled(&CLOSE, backend));
        }
        assert_eq!(CLOSE_RUNS.load(Ordering::SeqCst), 0);
        for _ in 0..3 {
            assert_eq!(product(&registry, &CLOSE, Backend::Cuda, close, &x), close_values);
        }
        assert_eq!(registry.status(&CLOSE, Backend::Cuda), Status::Verified);
        assert_eq!(CLOSE_RUNS.load(Ordering::SeqCst), 1);
        assert!(warnings().is_empty(), "{:?}", warnings());
    }

    static AHEAD_REGISTRY: Registry = Registry::new(record);
    static AHEAD_LAUNCHES: AtomicUsize = AtomicUsize::new(0);
    static AHEAD_ORACLES: AtomicUsize = AtomicUsize::new(0);
    counted_check!(NESTED, NESTED_RUNS, "test_nested", CUDA_ONLY, close);
    static NESTED_ANSWERS: std::sync::Mutex<Vec<bool>> = std::sync::Mutex::new(Vec::new());
    /// A wrong kernel (so a comparison would fail) checked on two inputs, whose check also asks
    /// for another kernel through its public function, as some real checks do.
    static AHEAD: KernelCheck = KernelCheck {
        name: "test_ahead",
        backends: CUDA_ONLY,
        run: || {
            NESTED_ANSWERS.lock().unwrap().push(AHEAD_REGISTRY.enabled(&NESTED, Backend::Cuda));
            for _ in 0..2 {
                verify(
                    input,
                    |x| {
                        AHEAD_LAUNCHES.fetch_add(1, Ordering::SeqCst);
                        Ok(vec![wrong(x)?])
                    },
                    |x| {
                        AHEAD_ORACLES.fetch_add(1, Ordering::SeqCst);
                        Ok(vec![oracle(x)?])
                    },
                )?;
            }
            Ok(())
        },
    };

    /// Compiling ahead runs each due check launching its kernels only: every launch is reached,
    /// no oracle runs, nothing is compared, decided, warned or remembered, and a kernel asked for
    /// meanwhile gets its MLX-ops version without its check running. The full check then runs at
    /// the kernel's first use as before; a settled or remembered check is not run ahead again
    /// (unless afresh, as `sala doctor` asks), and only CUDA compiles ahead.
    #[test]
    fn checks_run_ahead_only_launch_their_kernels_and_decide_nothing() {
        let counts = || (AHEAD_LAUNCHES.load(Ordering::SeqCst), AHEAD_ORACLES.load(Ordering::SeqCst), NESTED_RUNS.load(Ordering::SeqCst));
        let mut progress = Vec::new();
        assert_eq!(AHEAD_REGISTRY.compile_ahead(&[&AHEAD, &NESTED], Backend::Metal, false, |d, t| progress.push((d, t))), 0);
        assert_eq!(AHEAD_REGISTRY.compile_ahead(&[&AHEAD], Backend::Cpu, false, |d, t| progress.push((d, t))), 0);
        assert_eq!((counts(), progress.len()), ((0, 0, 0), 0), "nothing runs off CUDA");

        assert_eq!(AHEAD_REGISTRY.compile_ahead(&[&AHEAD], Backend::Cuda, false, |d, t| progress.push((d, t))), 1);
        assert_eq!(counts(), (2, 0, 0), "both launches, no oracle, the nested check not run");
        assert_eq!(*NESTED_ANSWERS.lock().unwrap(), [false], "the nested kernel's MLX-ops version while launching ahead");
        assert_eq!(AHEAD_REGISTRY.status(&AHEAD, Backend::Cuda), Status::Unchecked);
        assert_eq!(AHEAD_REGISTRY.status(&NESTED, Backend::Cuda), Status::Unchecked);
        assert!(warnings().is_empty(), "{:?}", warnings());
        // Nothing was queued on the pool here (no GPU kernel launched): it reports none to wait for.
        assert_eq!(progress, [(0, 0)]);

        // The first use runs the check in full: the wrong kernel is caught, the nested one checked.
        assert!(!AHEAD_REGISTRY.enabled(&AHEAD, Backend::Cuda));
        assert_eq!(counts(), (3, 1, 1), "stopped at the first comparison; the nested check ran");
        assert_eq!(*NESTED_ANSWERS.lock().unwrap(), [false, true]);
        assert!(matches!(AHEAD_REGISTRY.status(&AHEAD, Backend::Cuda), Status::Disabled(_)));
        assert_eq!(warnings().len(), 1, "{:?}", warnings());

        // Settled checks are not run ahead again, unless afresh.
        assert_eq!(AHEAD_REGISTRY.compile_ahead(&[&AHEAD, &NESTED], Backend::Cuda, false, |_, _| {}), 0);
        assert_eq!(counts(), (3, 1, 1));
        assert_eq!(AHEAD_REGISTRY.compile_ahead(&[&AHEAD, &NESTED], Backend::Cuda, true, |_, _| {}), 2);
        assert_eq!(counts(), (5, 1, 2), "afresh: both run ahead; the nested one launches its kernel only");
        assert!(matches!(AHEAD_REGISTRY.status(&AHEAD, Backend::Cuda), Status::Disabled(_)), "still as decided");

        // A check this binary passed here before (the memo) is not run ahead.
        let dir = std::env::temp_dir().join(format!("sala-kernel-ahead-{}", std::process::id()));
        let memo = || Memo::new(dir.join("kernel-checks"), "binary=1".into());
        assert!(Registry::with_memo(record, memo()).enabled(&NESTED, Backend::Cuda));
        assert_eq!(counts().2, 3);
        assert_eq!(Registry::with_memo(record, memo()).compile_ahead(&[&NESTED], Backend::Cuda, false, |_, _| {}), 0);
        assert_eq!(counts().2, 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn outputs_are_compared_by_shape_value_and_tolerance() {
        let ints = |v: &[i32]| Array::from_slice(v, &[v.len() as i32]);
        let floats = |v: &[f32]| Array::from_slice(v, &[v.len() as i32]);
        let compare = |got: Vec<Array>, want: Vec<Array>| verify(|| Ok(()), |_| Ok(got), |_| Ok(want));
        // Integer outputs (block indices) must be equal.
        assert_eq!(compare(vec![ints(&[1, 2, 3])], vec![ints(&[1, 2, 3])]), Ok(()));
        assert_eq!(
            compare(vec![ints(&[1, 2, 3])], vec![ints(&[1, 2, 4])]),
            Err("output 1 of 1: element 2 is 3 where its MLX-ops version gives 4".into())
        );
        // Infinities (forced blocks' scores) in the same places; the rest within 1e-2 relative.
        let inf = f32::INFINITY;
        assert_eq!(compare(vec![floats(&[inf, -inf, 1.0, 2.0])], vec![floats(&[inf, -inf, 1.001, 2.0])]), Ok(()));
        assert_eq!(
            compare(vec![floats(&[inf, 5.0, 1.0])], vec![floats(&[inf, inf, 1.0])]),
            Err("output 1 of 1: element 1 is 5 where its MLX-ops version gives inf".into())
        );
        assert_eq!(compare(vec![floats(&[1.0, 1.05])], vec![floats(&[1.0, 1.0])]), Err("output 1 of 1: relative error 3.54e-2, tolerance 1e-2".into()));
        // A bfloat16 output against a float32 oracle: the values count, not the dtype.
        let bf16 = floats(&[0.3, -1.7]).as_dtype(Dtype::Bfloat16).unwrap();
        assert_eq!(compare(vec![bf16], vec![floats(&[0.3, -1.7])]), Ok(()));
        // Shapes and the number of outputs.
        assert_eq!(
            compare(vec![floats(&[1.0, 2.0]).reshape(&[1, 2]).unwrap()], vec![floats(&[1.0, 2.0])]),
            Err("output 1 of 1: shape [1, 2] where its MLX-ops version gives [2]".into())
        );
        assert_eq!(compare(vec![floats(&[1.0])], vec![floats(&[1.0]), floats(&[2.0])]), Err("1 outputs where its MLX-ops version gives 2".into()));
        // All zero on both sides agrees; anything against all zero does not.
        assert_eq!(compare(vec![floats(&[0.0, 0.0])], vec![floats(&[0.0, 0.0])]), Ok(()));
        assert!(compare(vec![floats(&[0.0, 1e-9])], vec![floats(&[0.0, 0.0])]).is_err());
    }

    /// Every kernel is registered, once; on the CPU none runs (its check is never started), and
    /// each check, run by hand, makes its inputs and runs its MLX-ops version, failing only where
    /// it launches the kernel.
    #[test]
    fn every_kernel_has_a_self_check_that_runs_all_but_the_kernel_on_the_cpu() {
        let checks = sala::models::kernel_checks();
        let names: Vec<&str> = checks.iter().map(|c| c.name).collect();
        assert_eq!(
            names,
            [
                "dequantize",
                "draw",
                "epilogue",
                "fp8_gemm",
                "gla_decode",
                "gla_prefill",
                "lightning_decode",
                "norm_gate",
                "kv_append",
                "qmv",
                "qmv_mma",
                "qmv_normed",
                "decode_attention",
                "decode_attention_mma",
                "decode_attention_q8",
                "rope_append",
                "rope_prompt",
                "select_blocks",
                "select_blocks_mma",
                "block_sparse_attention",
                "block_sparse_prefill",
                "block_sparse_decode",
                "block_sparse_attention_q8",
                "block_sparse_prefill_q8"
            ]
        );
        for check in &checks {
            assert!(!selfcheck::enabled(check), "{}", check.name);
            assert_eq!(selfcheck::status(check), Status::NotUsed, "{}", check.name);
            let Err(reason) = (check.run)() else { panic!("{}: a kernel ran on the CPU", check.name) };
            assert!(reason.contains("the kernel failed: kernel `sala_") && reason.contains("no GPU backend"), "{}: {reason}", check.name);
        }
    }
}

/// Off CUDA the decode attention's variants are not launched ahead (Metal compiles its kernels
/// itself, the CPU has none): nothing is launched and the model's load says nothing of it. A
/// decoder model asks for them with its own attention's shape (the GPU test checks they are all
/// a server meets).
#[test]
fn decode_variants_are_launched_ahead_on_cuda_only() {
    use sala::kernels::custom::variants_launched;
    use sala::kernels::sparse::{launch_decode_variants, DecodeShape};
    let before = variants_launched();
    let shape = DecodeShape { heads: 32, head_dim: 128, q_col: 0, gate_col: None };
    assert_eq!(launch_decode_variants(shape, 32 * 128, 8, Dtype::Bfloat16, 0.088).unwrap(), 0);
    let loaded = sala::load::load(&sala::load::LoadOptions { model: Some(common::smollm2_gguf()), ..Default::default() }, 64).unwrap();
    assert_eq!(loaded.model.launch_kernels_ahead().unwrap(), 0);
    assert_eq!(variants_launched(), before);
}

/// The padded shapes: queries to a multiple of 64, keys to 4096 or one of four lengths an octave,
/// never fewer than given and at most a quarter more.
#[test]
fn prompt_attention_pads_to_a_few_shapes() {
    use sala::models::layers::padded_attention_shape;
    assert_eq!(padded_attention_shape(1, 1), (64, 4096));
    assert_eq!(padded_attention_shape(64, 4096), (64, 4096));
    assert_eq!(padded_attention_shape(65, 4097), (128, 5120));
    assert_eq!(padded_attention_shape(256, 8192), (256, 8192));
    assert_eq!(padded_attention_shape(256, 8193), (256, 10240));
    assert_eq!(padded_attention_shape(300, 33024), (320, 40960));
    let mut widths = std::collections::BTreeSet::new();
    for len in 1..=140_000 {
        let (_, width) = padded_attention_shape(256, len);
        assert!(width >= len && (len <= 4096 || width as f64 <= len as f64 * 1.25), "{len} keys padded to {width}");
        widths.insert(width);
    }
    // 4096, then four an octave up to 2^17, and the first past it.
    assert_eq!(widths.len(), 1 + 5 * 4 + 1, "{widths:?}");
}

/// A prompt chunk's attention padded to repeating shapes (the path MLX-CUDA takes) against MLX's
/// causal attention over the same keys: chunks of 1 to 300 queries at offsets on and across the
/// padded lengths' steps, grouped heads, keys read from a cache buffer with room to spare.
#[test]
fn prompt_attention_padded_equals_causal_attention() {
    use mlx_rs::fast::{scaled_dot_product_attention, ScaledDotProductAttentionMask};
    use sala::models::layers::prompt_attention_padded;
    let (hq, hkv, d) = (4, 2, 32);
    let scale = 1.0 / (d as f32).sqrt();
    let buffer_k = randn(&[1, hkv, 6000, d], 31);
    let buffer_v = randn(&[1, hkv, 6000, d], 32);
    for (t, len) in [(2, 2), (7, 100), (64, 4096), (65, 4097), (300, 4200), (128, 5120), (1, 5121), (33, 5900)] {
        // Twice a shape, as a forward's layers call it (the second call reuses the mask).
        for layer in 0..2u64 {
            let q = randn(&[1, hq, t, d], 33 + t as u64 + 1000 * layer);
            let (k, v) = (buffer_k.try_index((.., .., ..len, ..)).unwrap(), buffer_v.try_index((.., .., ..len, ..)).unwrap());
            let mask = (t > 1).then_some(ScaledDotProductAttentionMask::Causal);
            let expected = scaled_dot_product_attention(&q, &k, &v, scale, mask, None).unwrap();
            let padded = prompt_attention_padded(&q, &k, &v, scale).unwrap();
            assert_eq!(padded.shape(), expected.shape());
            let diff = max_diff(&padded, &expected);
            assert!(diff < 1e-5, "{t} queries over {len} keys (layer {layer}): off by {diff}");
        }
    }
}
