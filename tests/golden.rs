//! Parity with the official reference implementation: every case in ../shared/golden, through the
//! public engine API (prefill logits, hidden states, InfLLM-V2 block selections, decode logits,
//! multi-turn extension) and through `sala run`.
//!
//! SALA_TEST_DEVICE=gpu runs them on the GPU. MLX's CUDA backend runs f32 matmuls in TF32 unless
//! MLX_ENABLE_TF32=0; with TF32 on, f32 is held to the bf16-style tolerances.

mod common;

use common::*;
use mlx_rs::{Array, Dtype};
use sala::engine::device::{self, DeviceKind};
use sala::engine::model::{LanguageModel, Logits, Trace};
use sala::engine::ops::{to_vec_f32, to_vec_i32};
use std::collections::HashMap;
use std::sync::Mutex;

/// MLX's default device is process-global: run the cases one at a time.
static LOCK: Mutex<()> = Mutex::new(());

fn on_gpu() -> bool {
    std::env::var("SALA_TEST_DEVICE").is_ok_and(|d| d == "gpu")
}

/// Full float32 arithmetic (the CPU, or a GPU with TF32 switched off).
fn exact_f32(dtype: &str) -> bool {
    dtype == "f32" && (!on_gpu() || std::env::var("MLX_ENABLE_TF32").is_ok_and(|v| v == "0"))
}

/// Largest allowed |Δlogit| (and, scaled, hidden-state error).
fn tolerance(dtype: &str, sparse: bool) -> f64 {
    match (exact_f32(dtype), on_gpu()) {
        (true, false) => 1e-4,
        // Other kernels, other summation order.
        (true, true) => 1e-3,
        // Rounding points differ between implementations in bf16 (README: "a few 1e-2"); in the
        // sparse regime a bf16 near-tie can also flip one block (the case's own bf16-vs-f32
        // logits differ by 2.15), which moved one prefill row by 0.18 here.
        _ if sparse => 0.25,
        _ => 0.15,
    }
}

fn dtype_of(name: &str) -> Dtype {
    if name == "f32" {
        Dtype::Float32
    } else {
        Dtype::Bfloat16
    }
}

struct Run {
    model: Box<dyn LanguageModel>,
    cache: sala::engine::cache::ModelCache,
}

impl Run {
    fn new(case: &str, dtype: &str) -> Self {
        device::select(Some(if on_gpu() { DeviceKind::Gpu } else { DeviceKind::Cpu })).unwrap();
        let model = sala::models::load(&golden(case), Some(dtype_of(dtype))).unwrap();
        let cache = model.new_cache();
        Self { model, cache }
    }

    /// One forward call over `ids`; all logits rows and the trace.
    fn forward(&mut self, ids: &[u32], logits: Logits) -> (Vec<Vec<f64>>, Trace) {
        let input: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
        let input = Array::from_slice(&input, &[1, input.len() as i32]);
        let mut trace = Trace::default();
        let out = self.model.forward(&input, &mut self.cache, logits, Some(&mut trace)).unwrap();
        let vocab = out.shape()[1] as usize;
        let flat: Vec<f64> = to_vec_f32(&out).unwrap().into_iter().map(f64::from).collect();
        (flat.chunks(vocab).map(<[f64]>::to_vec).collect(), trace)
    }
}

fn check_rows(what: &str, got: &[Vec<f64>], want: &Tensor, rows: &[usize], tol: f64) {
    for (i, &r) in rows.iter().enumerate() {
        let (g, w) = (&got[r], want.row(i));
        let diff = max_abs_diff(g, w);
        assert!(diff <= tol, "{what}: row {i} (position {r}) differs by {diff} > {tol}");
        if top2_gap(w) > 2.0 * tol {
            assert_eq!(argmax(g), argmax(w), "{what}: row {i}: argmax differs");
        }
    }
}

fn check_tensor(what: &str, got: &Array, want: &Tensor, tol: f64) {
    let g: Vec<f64> = to_vec_f32(got).unwrap().into_iter().map(f64::from).collect();
    assert_eq!(g.len(), want.data.len(), "{what}: size");
    let scale = want.data.iter().fold(1.0f64, |m, x| m.max(x.abs()));
    let diff = max_abs_diff(&g, &want.data);
    assert!(diff <= tol * scale, "{what}: differs by {diff} (values up to {scale}, tolerance {tol} relative)");
}

/// Compares block selections row by row (as sets); returns the number of differing rows.
fn selection_mismatches(got: &[i32], want: &[f64], k: usize) -> usize {
    got.chunks(k)
        .zip(want.chunks(k))
        .filter(|(g, w)| {
            let mut g: Vec<i64> = g.iter().map(|&x| x as i64).collect();
            let mut w: Vec<i64> = w.iter().map(|&x| x as i64).collect();
            g.sort();
            w.sort();
            g != w
        })
        .count()
}

fn check_block_scores(what: &str, got: &[f32], want: &[f64], tol: f64) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            continue;
        }
        if w.is_infinite() {
            assert_eq!(g as f64, w, "{what}[{i}]");
        } else {
            assert!((g as f64 - w).abs() <= tol * w.abs().max(1e-3), "{what}[{i}]: {g} vs {w}");
        }
    }
}

fn run_case(case: &str, dt: &str) {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let exp = read_safetensors(&golden(case).join("expected.safetensors"));
    let toks = tokens(case);
    let sparse_case = exp.keys().any(|k| k.contains(".sparse."));
    let tol = tolerance(dt, sparse_case);
    let key = |k: &str| format!("{dt}.{k}");
    let mut run = Run::new(case, dt);

    // Prefill: the whole prompt in one forward call, as the reference did.
    let prompt = ids(&toks, "prompt_ids");
    let (logits, trace) = run.forward(&prompt, Logits::All);
    if let Some(want) = exp.get(&key("prefill.logits")) {
        check_rows("prefill.logits", &logits, want, &(0..prompt.len()).collect::<Vec<_>>(), tol);
    }
    if let Some(want) = exp.get(&key("prefill.logits_at_positions")) {
        let positions: Vec<usize> = exp["prefill.positions"].data.iter().map(|&p| p as usize).collect();
        check_rows("prefill.logits_at_positions", &logits, want, &positions, tol);
    }
    let last = exp[&key("prefill.last_logits")].data.clone();
    let last = Tensor { shape: vec![1, last.len()], data: last };
    check_rows("prefill.last_logits", &logits, &last, &[prompt.len() - 1], tol);

    // Hidden states (where the case stores them).
    if let Some(want) = exp.get(&key("hidden.embeddings")) {
        check_tensor("hidden.embeddings", trace.get("hidden.embeddings").unwrap(), want, tol);
        check_tensor("hidden.final_norm", trace.get("hidden.final_norm").unwrap(), &exp[&key("hidden.final_norm")], tol);
        for name in ["layer_out", "mixer_out"] {
            let want = &exp[&key(&format!("hidden.{name}"))];
            let per_layer: usize = want.shape[1..].iter().product();
            for layer in 0..want.shape[0] {
                let w = Tensor { shape: want.shape[1..].to_vec(), data: want.data[layer * per_layer..(layer + 1) * per_layer].to_vec() };
                check_tensor(&format!("hidden.{name}[{layer}]"), trace.get(&format!("hidden.{name}.{layer}")).unwrap(), &w, tol);
            }
        }
    }

    // InfLLM-V2 block selection of the prefill (sparse cases).
    let sparse_layers: Vec<usize> = (0..64).filter(|l| exp.contains_key(&key(&format!("sparse.layer{l}.prefill_topk_idx")))).collect();
    // f32 must pick exactly the reference's blocks; bf16 scores tie far more often (they are
    // stored in bf16), so a few rows may break a near-tie the other way.
    let allowed_mismatch = |rows: usize| if exact_f32(dt) { 0 } else { rows / 20 };
    for &l in &sparse_layers {
        let want = &exp[&key(&format!("sparse.layer{l}.prefill_topk_idx"))];
        let k = want.shape[2];
        // Recorded per forward call as [1, Hkv, t, K]: put the calls side by side per head.
        let chunks: Vec<Array> = trace.all(&format!("sparse.layer{l}.blocks")).into_iter().cloned().collect();
        assert!(!chunks.is_empty(), "layer {l}: no sparse path ran");
        let got = to_vec_i32(&mlx_rs::ops::concatenate(&chunks, 2).unwrap()).unwrap();
        let bad = selection_mismatches(&got, &want.data, k);
        let rows = want.data.len() / k;
        assert!(bad <= allowed_mismatch(rows), "layer {l}: {bad} of {rows} prefill selections differ");

        let scores = trace.all(&format!("sparse.layer{l}.block_scores"));
        let last_chunk = scores.last().unwrap();
        let t = last_chunk.shape()[2];
        let last_row = last_chunk.index_last_query(t);
        check_block_scores(&format!("layer {l} prefill_last_block_score"), &last_row, &exp[&key(&format!("sparse.layer{l}.prefill_last_block_score"))].data, if exact_f32(dt) { 1e-4 } else { 6e-2 });
    }

    // Decode steps, teacher-forced with the reference's greedy tokens.
    let decode = ids(&toks, "decode_input_ids");
    let want = &exp[&key("decode.logits")];
    // Per sparse layer, per decode step: (selected blocks, block scores).
    type Selections = HashMap<usize, Vec<(Vec<i32>, Vec<f32>)>>;
    let mut decode_selections: Selections = HashMap::new();
    for (i, &id) in decode.iter().enumerate() {
        let (got, trace) = run.forward(&[id], Logits::Last);
        let row = Tensor { shape: vec![1, want.shape[1]], data: want.row(i).to_vec() };
        check_rows(&format!("decode step {i}"), &got, &row, &[0], tol);
        for &l in &sparse_layers {
            let blocks = to_vec_i32(trace.get(&format!("sparse.layer{l}.blocks")).unwrap()).unwrap();
            let scores = to_vec_f32(trace.get(&format!("sparse.layer{l}.block_scores")).unwrap()).unwrap();
            decode_selections.entry(l).or_default().push((blocks, scores));
        }
    }
    for &l in &sparse_layers {
        let steps: Vec<usize> = exp[&key("sparse.decode_steps")].data.iter().map(|&s| s as usize).collect();
        let want_idx = &exp[&key(&format!("sparse.layer{l}.decode_topk_idx"))];
        let want_scores = &exp[&key(&format!("sparse.layer{l}.decode_block_score"))];
        let k = want_idx.shape[2];
        let mut bad = 0;
        for (j, &step) in steps.iter().enumerate() {
            let (blocks, scores) = &decode_selections[&l][step];
            bad += selection_mismatches(blocks, want_idx.row(j), k);
            let per_head = want_scores.shape[2];
            let nb = scores.len() / want_idx.shape[1];
            for h in 0..want_idx.shape[1] {
                let w = &want_scores.row(j)[h * per_head..h * per_head + nb];
                check_block_scores(&format!("layer {l} decode {step} head {h} block scores"), &scores[h * nb..(h + 1) * nb], w, if exact_f32(dt) { 1e-4 } else { 6e-2 });
            }
        }
        assert!(bad <= allowed_mismatch(steps.len() * want_idx.shape[1]), "layer {l}: {bad} decode selections differ");
    }

    // Second turn: a multi-token forward on a non-empty cache, then more decode steps.
    if let Some(want) = exp.get(&key("extension.logits")) {
        let extension = ids(&toks, "extension_ids");
        let (got, _) = run.forward(&extension, Logits::All);
        check_rows("extension.logits", &got, want, &(0..extension.len()).collect::<Vec<_>>(), tol);
        let want = &exp[&key("decode2.logits")];
        for (i, &id) in ids(&toks, "decode2_input_ids").iter().enumerate() {
            let (got, _) = run.forward(&[id], Logits::Last);
            let row = Tensor { shape: vec![1, want.shape[1]], data: want.row(i).to_vec() };
            check_rows(&format!("decode2 step {i}"), &got, &row, &[0], tol);
        }
    }
}

trait LastQuery {
    fn index_last_query(&self, t: i32) -> Vec<f32>;
}

impl LastQuery for Array {
    /// Scores `[1, Hkv, t, nb]` of the last query, head-major.
    fn index_last_query(&self, t: i32) -> Vec<f32> {
        use mlx_rs::ops::indexing::TryIndexOp;
        to_vec_f32(&self.try_index((.., .., t - 1, ..)).unwrap()).unwrap()
    }
}

#[test]
fn a_dense_f32() {
    run_case("A_dense_f32", "f32");
}

#[test]
fn b_chunk_boundary_f32() {
    run_case("B_chunk_boundary", "f32");
}

#[test]
fn b_chunk_boundary_bf16() {
    run_case("B_chunk_boundary", "bf16");
}

#[test]
fn c_sparse_prefill_f32() {
    run_case("C_sparse_prefill", "f32");
}

#[test]
fn c_sparse_prefill_bf16() {
    run_case("C_sparse_prefill", "bf16");
}

#[test]
fn d_two_turn_f32() {
    run_case("D_two_turn", "f32");
}

/// `sala run --input-ids … --temperature 0 --ignore-eos --logits-out` reproduces each case's
/// greedy ids and its prefill + decode logits (the primary f32 run).
#[test]
fn sala_run_reproduces_golden_logits() {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::temp_dir().join(format!("sala-golden-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for case in ["A_dense_f32", "B_chunk_boundary", "C_sparse_prefill", "D_two_turn"] {
        let toks = tokens(case);
        let exp = read_safetensors(&golden(case).join("expected.safetensors"));
        let prompt = ids(&toks, "prompt_ids");
        let decode = ids(&toks, "decode_input_ids");
        let out_file = dir.join(format!("{case}.safetensors"));
        let ids_arg = prompt.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let device = if on_gpu() { "gpu" } else { "cpu" };
        // SALA_BIN: the binary beside a test binary carried to a lent GPU.
        let sala = std::env::var_os("SALA_BIN").map_or_else(|| std::path::PathBuf::from(env!("CARGO_BIN_EXE_sala")), std::path::PathBuf::from);
        let output = std::process::Command::new(sala)
            .args(["run", "--model"])
            .arg(golden(case))
            .args(["--input-ids", &ids_arg, "--temperature", "0", "--ignore-eos", "--json", "--dtype", "f32", "--device", device])
            .args(["--max-tokens", &(decode.len() + 1).to_string(), "--logits-out"])
            .arg(&out_file)
            .output()
            .unwrap();
        assert!(output.status.success(), "{case}: {}", String::from_utf8_lossy(&output.stderr));
        let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let generated: Vec<u32> = json["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(&generated[..decode.len()], &decode[..], "{case}: greedy ids");
        let got = &read_safetensors(&out_file)["logits"];
        assert_eq!(got.shape, vec![decode.len() + 1, exp["f32.decode.logits"].shape[1]], "{case}: logits shape");
        let tol = tolerance("f32", true);
        assert!(max_abs_diff(got.row(0), &exp["f32.prefill.last_logits"].data) <= tol, "{case}: row 0 (prefill)");
        for i in 0..decode.len() {
            let diff = max_abs_diff(got.row(i + 1), exp["f32.decode.logits"].row(i));
            assert!(diff <= tol, "{case}: row {} differs by {diff}", i + 1);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Rows of `logits` (positions `offset..`) that the case stores, checked against the reference.
fn check_stored_positions(exp: &HashMap<String, Tensor>, logits: &[Vec<f64>], offset: usize, tol: f64) -> usize {
    let positions: Vec<usize> = exp["prefill.positions"].data.iter().map(|&p| p as usize).collect();
    let want = &exp["f32.prefill.logits_at_positions"];
    let mut checked = 0;
    for (i, &p) in positions.iter().enumerate() {
        if p >= offset && p < offset + logits.len() {
            let diff = max_abs_diff(&logits[p - offset], want.row(i));
            assert!(diff <= tol, "position {p}: differs by {diff}");
            checked += 1;
        }
    }
    checked
}

/// The sparse prompt prefilled in three calls (the second and third on a non-empty cache, as
/// `sala run --prefill-step` does) gives the reference's one-shot logits.
#[test]
fn c_sparse_prefill_in_chunks_matches_one_shot() {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let exp = read_safetensors(&golden("C_sparse_prefill").join("expected.safetensors"));
    let prompt = ids(&tokens("C_sparse_prefill"), "prompt_ids");
    let mut run = Run::new("C_sparse_prefill", "f32");
    let mut checked = 0;
    let mut offset = 0;
    for len in [600, 400, 500] {
        let (logits, _) = run.forward(&prompt[offset..offset + len], Logits::All);
        checked += check_stored_positions(&exp, &logits, offset, tolerance("f32", true));
        offset += len;
    }
    assert_eq!(checked, 49);
}

/// The sparse prompt through the paths users take, in 256-token chunks: `generate` (`sala run`,
/// `serve`): the distribution the first token is drawn from is the reference's last prefill row;
/// `extend` (the bench's and a chat history's path): the first decode step after it gives the
/// reference's logits.
#[test]
fn c_sparse_prompt_through_generate_and_extend_matches_the_reference() {
    use sala::engine::generate::{extend, generate, Flow, GenerateOptions};
    use sala::engine::sampler::{Sampler, SamplingParams};
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let exp = read_safetensors(&golden("C_sparse_prefill").join("expected.safetensors"));
    let prompt = ids(&tokens("C_sparse_prefill"), "prompt_ids");
    let mut run = Run::new("C_sparse_prefill", "f32");
    let opts = GenerateOptions { max_tokens: 1, ignore_eos: true, prefill_step: 256, keep_logits: true, draft: None };
    let mut greedy = Sampler::new(SamplingParams { temperature: 0.0, ..Default::default() });
    let g = generate(run.model.as_ref(), &mut run.cache, &prompt, &mut greedy, &opts, |_, _| {}, |_| Flow::Continue).unwrap();
    let got: Vec<f64> = g.logits[0].iter().map(|&x| f64::from(x)).collect();
    let diff = max_abs_diff(&got, &exp["f32.prefill.last_logits"].data);
    assert!(diff <= tolerance("f32", true), "first token's distribution differs by {diff}");

    let mut extended = run.model.new_cache();
    extend(run.model.as_ref(), &mut extended, &prompt, 256).unwrap();
    let mut after = Run { model: run.model, cache: extended };
    let next = ids(&tokens("C_sparse_prefill"), "decode_input_ids")[0];
    let (row, _) = after.forward(&[next], Logits::Last);
    let diff = max_abs_diff(&row[0], exp["f32.decode.logits"].row(0));
    assert!(diff <= tolerance("f32", true), "the step after extend differs from the reference by {diff}");
}

/// Token-by-token decoding across dense_len: the first sparse step compresses the whole cache,
/// later ones extend it; logits match the reference at the stored positions up to 449.
#[test]
fn c_decode_crossing_dense_len() {
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let exp = read_safetensors(&golden("C_sparse_prefill").join("expected.safetensors"));
    let prompt = ids(&tokens("C_sparse_prefill"), "prompt_ids");
    let mut run = Run::new("C_sparse_prefill", "f32");
    let (first, _) = run.forward(&prompt[..200], Logits::All); // dense: 200 < dense_len 256
    let mut logits = first;
    for &id in &prompt[200..450] {
        let (row, trace) = run.forward(&[id], Logits::Last);
        let sparse_ran = !trace.all("sparse.layer0.blocks").is_empty();
        assert_eq!(sparse_ran, logits.len() + 1 >= 256, "position {}", logits.len());
        logits.extend(row);
    }
    assert_eq!(check_stored_positions(&exp, &logits, 0, tolerance("f32", true)), 15);
}

/// The opt-in FP8 prompt products (`--prompt-fp8`) on case C's 1500-token sparse prefill in bf16,
/// against the reference at its 49 stored positions: every product's operands rounded to e4m3, so
/// not held to the exact path's tolerance; the departure is printed (eval/results records it) and
/// bounded, and must be a departure (the products did run in FP8). Needs a Hopper GPU
/// (SALA_TEST_DEVICE=gpu); skipped elsewhere.
#[test]
fn c_sparse_prefill_in_fp8_prompt_products() {
    if !on_gpu() {
        eprintln!("skipped: FP8 prompt products run on Hopper GPUs (SALA_TEST_DEVICE=gpu)");
        return;
    }
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    device::select(Some(DeviceKind::Gpu)).unwrap();
    if !sala::kernels::fp8::available() {
        eprintln!("skipped: FP8 prompt products need a Hopper GPU (compute capability 9)");
        return;
    }
    let case = "C_sparse_prefill";
    let exp = read_safetensors(&golden(case).join("expected.safetensors"));
    let prompt = ids(&tokens(case), "prompt_ids");
    let positions: Vec<usize> = exp["prefill.positions"].data.iter().map(|&p| p as usize).collect();
    let want = &exp["bf16.prefill.logits_at_positions"];
    let logits = |fp8: bool| {
        sala::models::layers::set_prompt_fp8(fp8);
        let (logits, _) = Run::new(case, "bf16").forward(&prompt, Logits::All);
        sala::models::layers::set_prompt_fp8(false);
        logits
    };
    let (exact, fp8) = (logits(false), logits(true));
    let stats = |got: &[Vec<f64>]| {
        let (mut worst, mut sum, mut same) = (0f64, 0f64, 0usize);
        for (i, &p) in positions.iter().enumerate() {
            let (g, w) = (&got[p], want.row(i));
            worst = worst.max(max_abs_diff(g, w));
            sum += g.iter().zip(w).map(|(a, b)| (a - b).abs()).sum::<f64>() / g.len() as f64;
            same += usize::from(argmax(g) == argmax(w));
        }
        (worst, sum / positions.len() as f64, same)
    };
    let ((e_max, e_mean, e_same), (f_max, f_mean, f_same)) = (stats(&exact), stats(&fp8));
    let n = positions.len();
    eprintln!("exact products: max |Δlogit| {e_max:.4}, mean {e_mean:.4}, argmax as the reference's at {e_same} of {n} positions");
    eprintln!("FP8 products:   max |Δlogit| {f_max:.4}, mean {f_mean:.4}, argmax as the reference's at {f_same} of {n} positions");
    assert!(e_max <= tolerance("bf16", true), "the exact path left its tolerance: {e_max}");
    let moved = exact.iter().zip(&fp8).map(|(a, b)| max_abs_diff(a, b)).fold(0f64, f64::max);
    assert!(moved > 1e-3, "--prompt-fp8 changed nothing: the products did not run in FP8");
    // Measured 1.16 (mean 0.17, argmax kept at 35 of 49) on an H200, against 0.13 exact.
    assert!(f_max < 1.5, "FP8 prompt products moved a logit by {f_max}");
}
