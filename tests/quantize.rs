//! Quantization: the MLX affine round trip, GGUF block conversion against hand-made blocks,
//! `sala quantize` on real (SmolLM2) and golden SALA weights, and its refusals.

mod common;

use half::f16;
use mlx_rs::{Array, Dtype};
use sala::engine::generate::{generate, Flow, GenerateOptions};
use sala::engine::gguf::{convert_bytes, Converted, GgmlType};
use sala::engine::model::LanguageModel;
use sala::engine::ops::to_vec_f32;
use sala::engine::quant::{QuantFormat, QuantizedMatrix};
use sala::engine::sampler::{Sampler, SamplingParams};
use sala::models::layers::Matrix;
use std::path::{Path, PathBuf};
use std::process::Command;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sala-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn sala(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sala")).args(args).output().unwrap()
}

fn random_matrix(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    // Roughly uniform in [-1, 1), with some large values.
    let mut rng = common::Lcg(seed);
    (0..rows * cols)
        .map(|i| {
            let u = rng.next_signed();
            if i % 97 == 0 { u * 8.0 } else { u }
        })
        .collect()
}

#[test]
fn dequantize_quantize_error_is_within_one_step_per_group() {
    let (rows, cols) = (64, 256);
    let w = random_matrix(rows, cols, 7);
    let array = Array::from_slice(&w, &[rows as i32, cols as i32]);
    for (bits, group_size, max_mean_rel) in [(8, 64, 0.01), (8, 32, 0.01), (4, 64, 0.15), (4, 128, 0.2)] {
        let format = QuantFormat { group_size, bits };
        let q = QuantizedMatrix::quantize(&array, format).unwrap();
        assert_eq!(q.packed.shape(), &[rows as i32, (cols * bits as usize / 32) as i32]);
        assert_eq!(q.packed.dtype(), Dtype::Uint32);
        let back = to_vec_f32(&q.dequantize().unwrap()).unwrap();
        let scales = to_vec_f32(&q.scales).unwrap();
        let groups = cols / group_size as usize;
        let (mut err_sum, mut ref_sum) = (0.0f64, 0.0f64);
        for r in 0..rows {
            for c in 0..cols {
                let step = scales[r * groups + c / group_size as usize].abs();
                let err = (w[r * cols + c] - back[r * cols + c]).abs();
                // MLX snaps the scale so that zero is exact and clamps the far end, so the bound is
                // one step rather than half of one.
                assert!(err <= step * 1.0 + 1e-6, "{bits}-bit g{group_size}: error {err} exceeds one step {step}");
                err_sum += err as f64;
                ref_sum += w[r * cols + c].abs() as f64;
            }
        }
        let rel = err_sum / ref_sum;
        assert!(rel < max_mean_rel, "{bits}-bit g{group_size}: mean relative error {rel}");
    }
}

/// One ggml block: f16 header values then the payload.
fn block(header: &[f32], payload: &[u8]) -> Vec<u8> {
    let mut out: Vec<u8> = header.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect();
    out.extend_from_slice(payload);
    out
}

fn dequantized(bytes: &[u8], kind: GgmlType, cols: i32) -> Vec<f32> {
    let rows = 1;
    match convert_bytes(bytes, kind, &[rows, cols]).unwrap() {
        Converted::Quantized(q) => {
            assert_eq!(q.format.group_size, 32);
            to_vec_f32(&q.dequantize().unwrap()).unwrap()
        }
        Converted::Float(_) => panic!("{kind:?} must stay quantized"),
    }
}

#[test]
fn gguf_blocks_convert_to_exact_mlx_quantization() {
    // Q8_0: w = d · q with q signed; two blocks with different scales.
    let q: Vec<i8> = (0..32).map(|i| (i * 9 - 140).clamp(-128, 127) as i8).collect();
    let mut bytes = block(&[0.25], &q.iter().map(|&v| v as u8).collect::<Vec<_>>());
    bytes.extend(block(&[-2.0], &q.iter().rev().map(|&v| v as u8).collect::<Vec<_>>()));
    let got = dequantized(&bytes, GgmlType::Q8_0, 64);
    let want: Vec<f32> = q.iter().map(|&v| 0.25 * v as f32).chain(q.iter().rev().map(|&v| -2.0 * v as f32)).collect();
    assert_eq!(got, want);

    // Q4_0: byte j holds weight j (low nibble) and weight j+16 (high nibble); w = d · (nibble − 8).
    let nibbles: Vec<u8> = (0..32).map(|i| ((i * 7 + 3) % 16) as u8).collect();
    let packed: Vec<u8> = (0..16).map(|j| nibbles[j] | (nibbles[j + 16] << 4)).collect();
    let got = dequantized(&block(&[0.5], &packed), GgmlType::Q4_0, 32);
    let want: Vec<f32> = nibbles.iter().map(|&n| 0.5 * (n as f32 - 8.0)).collect();
    assert_eq!(got, want);

    // Q4_1: w = d · nibble + m.
    let got = dequantized(&block(&[0.125, -1.5], &packed), GgmlType::Q4_1, 32);
    let want: Vec<f32> = nibbles.iter().map(|&n| 0.125 * n as f32 - 1.5).collect();
    assert_eq!(got, want);

    // Float types pass through; unsupported types name themselves and the fix.
    let f: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    match convert_bytes(&f, GgmlType::F32, &[2]).unwrap() {
        Converted::Float(a) => assert_eq!(to_vec_f32(&a).unwrap(), vec![1.5, -2.0]),
        _ => panic!("F32 is float"),
    }
    let err = convert_bytes(&[0u8; 66], GgmlType::Other(16), &[1, 256]).err().unwrap();
    assert!(err.contains("tensor type IQ2_XXS is not supported") && err.contains("Q8_0") && err.contains("re-quantize"), "{err}");
}

fn greedy(model: &dyn LanguageModel, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut cache = model.new_cache();
    let mut sampler = Sampler::new(SamplingParams { temperature: 0.0, ..Default::default() });
    let opts = GenerateOptions { max_tokens: n, ..Default::default() };
    generate(model, &mut cache, prompt, &mut sampler, &opts, |_, _| {}, |_| Flow::Continue).unwrap().tokens
}

fn check_quantized_layout(dir: &Path, bits: i64) {
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization"]["bits"], bits);
    assert_eq!(config["quantization"]["group_size"], 64);
    assert_eq!(config["quantization"], config["quantization_config"]);
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let q = st.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.dtype(), safetensors::Dtype::U32);
    assert!(st.tensor("model.layers.0.self_attn.q_proj.scales").is_ok());
    assert!(st.tensor("model.layers.0.self_attn.q_proj.biases").is_ok());
    // Norms and (by default) embeddings stay float.
    assert_ne!(st.tensor("model.norm.weight").unwrap().dtype(), safetensors::Dtype::U32);
    assert_ne!(st.tensor("model.embed_tokens.weight").unwrap().dtype(), safetensors::Dtype::U32);
}

#[test]
fn smollm2_q8_keeps_the_reference_greedy_answer() {
    let gguf = common::smollm2_gguf();
    let out = temp_dir("smollm2-q8");
    let result = sala(&["quantize", "--model", gguf.to_str().unwrap(), "--bits", "8", "--dtype", "bf16", "--output", out.to_str().unwrap()]);
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    check_quantized_layout(&out, 8);
    assert!(out.join("tokenizer.json").is_file() && out.join("tokenizer_config.json").is_file());

    let (model, tokenizer) = sala::models::load_with_tokenizer(&out, Some(Dtype::Float32)).unwrap();
    let expected = common::smollm2_expected();
    let case = &expected["cases"][0];
    let ids = |v: &serde_json::Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
    let prompt = ids(&case["prompt_ids"]);
    assert_eq!(tokenizer.unwrap().encode(case["prompt_text"].as_str().unwrap()).unwrap(), prompt);
    let want = ids(&case["greedy_ids"]);
    assert_eq!(greedy(model.as_ref(), &prompt, want.len()), want, "q8 greedy answer differs from the bf16 reference");

    // The output directory is never overwritten, and a quantized model is not quantized again.
    let again = sala(&["quantize", "--model", gguf.to_str().unwrap(), "--bits", "4", "--output", out.to_str().unwrap()]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"), "{}", String::from_utf8_lossy(&again.stderr));
    let twice = sala(&["quantize", "--model", out.to_str().unwrap(), "--bits", "4", "--output", temp_dir("twice").to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&twice.stderr).contains("already quantized"), "{}", String::from_utf8_lossy(&twice.stderr));
    std::fs::remove_dir_all(out).unwrap();
}

#[test]
fn sala_golden_model_quantizes_and_reports() {
    let src = common::golden("A_dense_f32");
    let before: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| (p.clone(), std::fs::read(&p).unwrap()))
        .collect();
    let out = temp_dir("sala-q8");
    let csv = std::env::temp_dir().join(format!("sala-q8-report-{}.csv", std::process::id()));
    let result = sala(&[
        "quantize", "--model", src.to_str().unwrap(), "--bits", "8", "--output", out.to_str().unwrap(),
        "--report", "--csv", csv.to_str().unwrap(),
    ]);
    assert!(result.status.success(), "{}", String::from_utf8_lossy(&result.stderr));
    check_quantized_layout(&out, 8);
    for (path, bytes) in &before {
        assert!(std::fs::read(path).unwrap() == *bytes, "{} changed", path.display());
    }
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(stdout.contains("top-1 agreement"), "{stdout}");

    // The CSV has one row per layer and one for the logits, with real measurements.
    let mut reader = csv::Reader::from_path(&csv).unwrap();
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 4 + 1);
    let logits = rows.last().unwrap();
    assert_eq!(&logits[0], "logits");
    let kl: f64 = logits[4].parse().unwrap();
    let top1: f64 = logits[6].trim_end_matches('%').parse().unwrap();
    assert!(kl > 0.0 && kl < 0.01, "8-bit KL {kl}");
    assert!(top1 >= 90.0, "8-bit top-1 agreement {top1}%");
    let layer0_rel: f64 = rows[0][3].parse().unwrap();
    assert!(layer0_rel > 0.0 && layer0_rel < 0.02, "layer 0 relative error {layer0_rel}");

    // The quantized SALA model runs through the CLI, and its prefill logits stay close to f32.
    let golden = common::read_safetensors(&src.join("expected.safetensors"));
    let prompt = common::ids(&common::tokens("A_dense_f32"), "prompt_ids");
    let model = sala::models::load(&out, None).unwrap();
    let input = Array::from_slice(&prompt.iter().map(|&i| i as i32).collect::<Vec<_>>(), &[1, prompt.len() as i32]);
    let mut cache = model.new_cache();
    let logits = to_vec_f32(&model.forward(&input, &mut cache, sala::engine::model::Logits::All, None).unwrap()).unwrap();
    let reference = &golden["f32.prefill.logits"];
    let diff = common::max_abs_diff(&logits.iter().map(|&v| v as f64).collect::<Vec<_>>(), &reference.data);
    assert!(diff < 0.25, "8-bit SALA logits differ from the f32 reference by {diff}");
    let vocab = 512;
    for (t, (row, want)) in logits.chunks(vocab).zip(reference.data.chunks(vocab)).enumerate() {
        if common::top2_gap(want) > 0.5 {
            let got = common::argmax(&row.iter().map(|&v| v as f64).collect::<Vec<_>>());
            assert_eq!(got, common::argmax(want), "8-bit SALA changes the top token at position {t}");
        }
    }
    std::fs::remove_dir_all(out).unwrap();
    std::fs::remove_file(csv).unwrap();
}

/// A checkpoint laid out like mlx-lm's mixed-precision output: 8-bit by default, one module at
/// 4 bits named in the config, one left in float (no `.scales`), embeddings quantized.
#[test]
fn mixed_precision_checkpoints_load_and_mismatches_are_named() {
    let src = common::golden("A_dense_f32");
    let dir = temp_dir("mixed");
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut arrays: Vec<(String, Array)> = Vec::new();
    let four_bit = "model.layers.0.mlp.down_proj";
    let float = "model.layers.1.mlp.up_proj";
    for (name, view) in st.tensors() {
        let data: Vec<f32> = view.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        let shape: Vec<i32> = view.shape().iter().map(|&d| d as i32).collect();
        let a = Array::from_slice(&data, &shape);
        let module = name.strip_suffix(".weight").unwrap_or(&name).to_string();
        if shape.len() == 2 && module != float {
            let bits = if module == four_bit { 4 } else { 8 };
            let q = QuantizedMatrix::quantize(&a, QuantFormat { group_size: 32, bits }).unwrap();
            arrays.push((format!("{module}.weight"), q.packed));
            arrays.push((format!("{module}.scales"), q.scales));
            arrays.push((format!("{module}.biases"), q.biases));
        } else {
            arrays.push((name.clone(), a));
        }
    }
    Array::save_safetensors(arrays.iter().map(|(n, a)| (n.as_str(), a)), None, dir.join("model.safetensors")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["quantization"] = serde_json::json!({"group_size": 32, "bits": 8, four_bit: {"group_size": 32, "bits": 4}});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();

    let model = sala::models::load(&dir, None).unwrap();
    let prompt = common::ids(&common::tokens("A_dense_f32"), "prompt_ids");
    let input = Array::from_slice(&prompt.iter().map(|&i| i as i32).collect::<Vec<_>>(), &[1, prompt.len() as i32]);
    let logits = to_vec_f32(&model.forward(&input, &mut model.new_cache(), sala::engine::model::Logits::Last, None).unwrap()).unwrap();
    let reference = &common::read_safetensors(&src.join("expected.safetensors"))["f32.prefill.last_logits"];
    let diff = common::max_abs_diff(&logits.iter().map(|&v| v as f64).collect::<Vec<_>>(), &reference.data);
    assert!(diff < 0.5, "mixed 8/4-bit logits differ from f32 by {diff}");
    let show = sala(&["show", dir.to_str().unwrap()]);
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(show.contains("4-bit group 32 ×1") && show.contains("8-bit group 32"), "{show}");

    // The config disagreeing with the tensors is an error that names the module and both formats.
    config["quantization"][four_bit] = serde_json::json!({"group_size": 32, "bits": 8});
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let err = sala::models::load(&dir, None).err().unwrap().to_string();
    assert!(err.contains(four_bit) && err.contains("4 bits") && err.contains("8 bits"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// MLX's quantized matmul against a plain matmul with the dequantized weights, for every format
/// we write or read, both for one row (decode, qmv) and many (prefill, qmm). Runs on the default
/// device, so on a GPU build it checks the GPU kernels.
#[test]
fn quantized_matmul_matches_dequantized_matmul() {
    // Square-ish, a single group per row, and an odd output count (a vocabulary).
    let mut failures = Vec::new();
    for (out_features, in_features) in [(256, 512), (200, 64), (1001, 128), (73448, 64)] {
        check_quantized_matmul(out_features, in_features, &mut failures);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn check_quantized_matmul(out_features: usize, in_features: usize, failures: &mut Vec<String>) {
    let w = Array::from_slice(&random_matrix(out_features, in_features, 3), &[out_features as i32, in_features as i32]);
    for rows in [1, 24] {
        let x = Array::from_slice(&random_matrix(rows, in_features, 5), &[rows as i32, in_features as i32]);
        for (bits, group_size) in [(4, 32), (4, 64), (4, 128), (8, 32), (8, 64), (5, 32)] {
            if !in_features.is_multiple_of(group_size as usize) {
                continue;
            }
            let q = QuantizedMatrix::quantize(&w, QuantFormat { group_size, bits }).unwrap();
            let want = to_vec_f32(&x.matmul(q.dequantize().unwrap().t()).unwrap()).unwrap();
            let got = to_vec_f32(&Matrix::Quantized(q.clone()).matmul_t(&x).unwrap()).unwrap();
            let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            if diff > 1e-3 * scale {
                failures.push(format!(
                    "[{out_features}, {in_features}] {bits}-bit g{group_size}, {rows} rows: quantized matmul differs by {diff} (values up to {scale})"
                ));
            }
            // Embedding lookups dequantize only the rows asked for.
            let ids = Array::from_slice(&[3i32, out_features as i32 - 1, 3, 17], &[1, 4]);
            let rows_got = to_vec_f32(&q.rows(&ids, Dtype::Float32).unwrap()).unwrap();
            let rows_want = to_vec_f32(&q.dequantize().unwrap().take_axis(&ids, 0).unwrap()).unwrap();
            if rows_got != rows_want {
                failures.push(format!("[{out_features}, {in_features}] {bits}-bit g{group_size}: embedding rows differ"));
            }
        }
    }
}

#[test]
fn unsupported_formats_are_refused_before_any_work() {
    let src = common::golden("A_dense_f32");
    for (args, message) in [
        (["--bits", "7", "--group-size", "64"], "7 bits is not supported"),
        (["--bits", "4", "--group-size", "48"], "group size 48 is not supported"),
    ] {
        let out = temp_dir("refused");
        let mut cmd = vec!["quantize", "--model", src.to_str().unwrap(), "--output", out.to_str().unwrap()];
        cmd.extend(args);
        let result = sala(&cmd);
        assert!(!result.status.success());
        let err = String::from_utf8_lossy(&result.stderr);
        assert!(err.contains(message), "{err}");
        assert!(!out.exists(), "nothing may be written");
    }
}
