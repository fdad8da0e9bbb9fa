//! The dense decoder families (Llama, Qwen2, Qwen3, MiniCPM) and their RoPE scalings against an
//! independent float64 numpy forward written from the HF modeling code
//! (tests/reference/dense_forward.py). Each case is a tiny random checkpoint (seeded LCG) written
//! to a temp dir as config.json + model.safetensors; the model's float32 logits must match the
//! reference's to 1e-3 on every position of a 40-token prompt.
//!
//! Needs `python3` (or $PYTHON) with numpy; if numpy is missing the test tries
//! `python3 -m pip install --user numpy` (then without `--user`, for a virtualenv) once.
//!
//! SALA_TEST_DEVICE=gpu runs them on the GPU (with MLX_ENABLE_TF32=0: the tolerance is float32's),
//! where a decoding token goes through the kernels (kernels::rope, kv, sparse::decode_attention).

mod common;

use common::fixed_steps::compare_fixed_steps;
use common::Lcg;

use mlx_rs::Array;
use sala::engine::device::DeviceKind;
use sala::engine::model::{LanguageModel, Logits};
use sala::engine::ops::to_vec_f32;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const TOLERANCE: f64 = 1e-3;
const PROMPT_LEN: usize = 40;
const VOCAB: usize = 128;

/// A scratch model directory, removed on drop.
struct ModelDir(PathBuf);

impl Drop for ModelDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A base config: hidden 64, 2 layers, 4 heads over 2 KV heads of 16, vocab 128, MLP 96.
fn base(model_type: &str) -> Value {
    json!({
        "model_type": model_type,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 64,
        "tie_word_embeddings": false,
        "bos_token_id": 1,
        "eos_token_id": 2
    })
}

fn with(mut cfg: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        cfg[k] = v.clone();
    }
    cfg
}

fn usize_key(cfg: &Value, key: &str) -> usize {
    cfg[key].as_u64().unwrap_or_else(|| panic!("config has no {key}")) as usize
}

/// Writes `cfg` and random float32 weights of the shapes it implies (HF tensor names).
fn write_model(name: &str, cfg: &Value, seed: u64) -> ModelDir {
    let dir = std::env::temp_dir().join(format!("sala-dense-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let model_type = cfg["model_type"].as_str().unwrap();
    let (h, f, v, layers) =
        (usize_key(cfg, "hidden_size"), usize_key(cfg, "intermediate_size"), usize_key(cfg, "vocab_size"), usize_key(cfg, "num_hidden_layers"));
    let heads = usize_key(cfg, "num_attention_heads");
    let kv_heads = usize_key(cfg, "num_key_value_heads");
    let head_dim = cfg.get("head_dim").and_then(Value::as_u64).map_or(h / heads, |d| d as usize);
    let attention_bias = cfg.get("attention_bias").and_then(Value::as_bool).unwrap_or(false);
    let qkv_bias = model_type == "qwen2" || attention_bias;
    let o_bias = model_type != "qwen2" && attention_bias;
    let tied = cfg.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false);

    let mut rng = Lcg(seed);
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut add = |name: String, shape: &[usize], norm: bool, rng: &mut Lcg| {
        let n: usize = shape.iter().product();
        let data: Vec<u8> = (0..n)
            .map(|_| if norm { 1.0 + rng.noise(0.1) } else { rng.noise(0.1) })
            .flat_map(f32::to_le_bytes)
            .collect();
        tensors.push((name, shape.to_vec(), data));
    };
    add("model.embed_tokens.weight".into(), &[v, h], false, &mut rng);
    add("model.norm.weight".into(), &[h], true, &mut rng);
    if !tied {
        add("lm_head.weight".into(), &[v, h], false, &mut rng);
    }
    let (q, kv) = (heads * head_dim, kv_heads * head_dim);
    for i in 0..layers {
        let p = format!("model.layers.{i}");
        let a = format!("{p}.self_attn");
        add(format!("{p}.input_layernorm.weight"), &[h], true, &mut rng);
        add(format!("{p}.post_attention_layernorm.weight"), &[h], true, &mut rng);
        for (proj, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            add(format!("{a}.{proj}.weight"), &[rows, h], false, &mut rng);
            if qkv_bias {
                add(format!("{a}.{proj}.bias"), &[rows], false, &mut rng);
            }
        }
        add(format!("{a}.o_proj.weight"), &[h, q], false, &mut rng);
        if o_bias {
            add(format!("{a}.o_proj.bias"), &[h], false, &mut rng);
        }
        if model_type == "qwen3" {
            add(format!("{a}.q_norm.weight"), &[head_dim], true, &mut rng);
            add(format!("{a}.k_norm.weight"), &[head_dim], true, &mut rng);
        }
        add(format!("{p}.mlp.gate_proj.weight"), &[f, h], false, &mut rng);
        add(format!("{p}.mlp.up_proj.weight"), &[f, h], false, &mut rng);
        add(format!("{p}.mlp.down_proj.weight"), &[h, f], false, &mut rng);
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(name, shape, data)| {
            (name.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data).unwrap())
        })
        .collect();
    std::fs::write(dir.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(cfg).unwrap()).unwrap();
    ModelDir(dir)
}

fn prompt(seed: u64) -> Vec<u32> {
    let mut rng = Lcg(seed ^ 0x9e37_79b9_7f4a_7c15);
    (0..PROMPT_LEN).map(|_| rng.below(VOCAB) as u32).collect()
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Makes sure the reference's interpreter can import numpy (installing it with pip once if not).
fn ensure_numpy() {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    let ready = READY.get_or_init(|| {
        let python = python();
        let importable = || {
            Command::new(&python).args(["-c", "import numpy"]).output().is_ok_and(|o| o.status.success())
        };
        if importable() {
            return Ok(());
        }
        // `--user` first; inside a virtualenv (where `--user` is refused) a plain install.
        let mut install = Command::new(&python).args(["-m", "pip", "install", "--user", "-q", "numpy"]).output();
        if importable() {
            return Ok(());
        }
        if install.as_ref().is_ok_and(|o| !o.status.success()) {
            install = Command::new(&python).args(["-m", "pip", "install", "-q", "numpy"]).output();
            if importable() {
                return Ok(());
            }
        }
        let detail = match install {
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => e.to_string(),
        };
        Err(format!(
            "the dense-family parity tests need `{python}` with numpy (tests/reference/dense_forward.py); \
             `{python} -m pip install --user numpy` failed: {detail}. Install numpy or set PYTHON."
        ))
    });
    if let Err(message) = ready {
        panic!("{message}");
    }
}

/// The reference logits `[T, vocab]` for `ids` on the model in `dir`.
fn reference(dir: &Path, ids: &[u32]) -> Vec<Vec<f64>> {
    ensure_numpy();
    // From the repository root when the test binary runs on another machine (a lent GPU).
    let script = [Path::new(env!("CARGO_MANIFEST_DIR")), Path::new(".")]
        .map(|root| root.join("tests/reference/dense_forward.py"))
        .into_iter()
        .find(|p| p.exists())
        .expect("tests/reference/dense_forward.py (run from the repository root)");
    let out = dir.join("reference-logits.f32");
    let list = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let output = Command::new(python()).arg(&script).arg(dir).arg(&list).arg(&out).output().unwrap();
    assert!(output.status.success(), "{} failed:\n{}", script.display(), String::from_utf8_lossy(&output.stderr));
    let bytes = std::fs::read(&out).unwrap();
    assert_eq!(bytes.len(), ids.len() * VOCAB * 4, "reference wrote {} bytes", bytes.len());
    let flat: Vec<f64> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect();
    flat.chunks(VOCAB).map(<[f64]>::to_vec).collect()
}

/// Loads the model in `dir` on the device SALA_TEST_DEVICE names (the CPU by default).
fn load(dir: &Path) -> Box<dyn LanguageModel> {
    let gpu = std::env::var("SALA_TEST_DEVICE").is_ok_and(|d| d == "gpu");
    sala::engine::device::select(Some(if gpu { DeviceKind::Gpu } else { DeviceKind::Cpu })).unwrap();
    sala::models::load(dir, None).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Our logits `[len, vocab]` for `ids` fed in one call on `cache`.
fn run(model: &dyn LanguageModel, cache: &mut sala::engine::cache::ModelCache, ids: &[u32]) -> Vec<Vec<f64>> {
    let input = Array::from_slice(&ids.iter().map(|&i| i as i32).collect::<Vec<_>>(), &[1, ids.len() as i32]);
    let logits = to_vec_f32(&model.forward(&input, cache, Logits::All, None).unwrap()).unwrap();
    assert_eq!(logits.len(), ids.len() * VOCAB);
    logits.chunks(VOCAB).map(|row| row.iter().map(|&x| x as f64).collect()).collect()
}

/// Largest |Δ| over all rows, and the row where it is.
fn max_diff(ours: &[Vec<f64>], theirs: &[Vec<f64>]) -> (f64, usize) {
    assert_eq!(ours.len(), theirs.len());
    let mut worst = (0.0f64, 0);
    for (t, (a, b)) in ours.iter().zip(theirs).enumerate() {
        for (x, y) in a.iter().zip(b) {
            let d = (x - y).abs();
            assert!(d.is_finite(), "row {t}: non-finite logit ({x} vs {y})");
            if d > worst.0 {
                worst = (d, t);
            }
        }
    }
    worst
}

fn logit_range(rows: &[Vec<f64>]) -> f64 {
    rows.iter().flatten().fold(0.0f64, |m, x| m.max(x.abs()))
}

/// Full-prompt forward of the model `cfg` describes against the reference.
fn check(name: &str, cfg: Value, seed: u64) {
    let dir = write_model(name, &cfg, seed);
    let ids = prompt(seed);
    let want = reference(&dir.0, &ids);
    let model = load(&dir.0);
    assert_eq!(model.info().vocab_size, VOCAB);
    let got = run(model.as_ref(), &mut model.new_cache(), &ids);
    let (diff, row) = max_diff(&got, &want);
    println!("{name}: max |Δlogit| = {diff:.3e} (row {row}; |logit| ≤ {:.2})", logit_range(&want));
    assert!(diff < TOLERANCE, "{name}: max |Δlogit| {diff:.3e} at position {row} (tolerance {TOLERANCE:e})");
}

fn llama3_scaling(original: usize) -> Value {
    json!({
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": original
        }
    })
}

fn qwen3_yarn() -> Value {
    // factor = max_position_embeddings / original, so HF 4.5x (which derives the factor from that
    // ratio) and HF 5 (which reads `factor`) agree.
    with(
        qwen3(),
        json!({ "rope_scaling": { "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16 } }),
    )
}

fn qwen2() -> Value {
    // Qwen2's own configs carry a sliding_window that is off (use_sliding_window false).
    with(base("qwen2"), json!({ "tie_word_embeddings": true, "sliding_window": 16, "use_sliding_window": false, "rope_theta": 1000000.0 }))
}

fn qwen3() -> Value {
    // head_dim 16 with hidden 48: the projections are not square.
    with(base("qwen3"), json!({ "hidden_size": 48, "head_dim": 16, "num_hidden_layers": 3, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0 }))
}

fn minicpm_longrope() -> Value {
    // Long and short factors differ everywhere, so picking the wrong list shows.
    let long: Vec<f64> = (0..8).map(|i| 1.0 + 0.9 * i as f64).collect();
    let short: Vec<f64> = (0..8).map(|i| 1.0 + 0.05 * i as f64).collect();
    with(
        base("minicpm"),
        json!({
            "num_hidden_layers": 3,
            "tie_word_embeddings": true,
            "scale_emb": 12,
            "scale_depth": 1.4,
            "dim_model_base": 16,
            "max_position_embeddings": 64,
            "rope_scaling": {
                "rope_type": "longrope",
                "long_factor": long,
                "short_factor": short,
                "original_max_position_embeddings": 16
            }
        }),
    )
}

#[test]
fn llama_plain() {
    check("llama_plain", base("llama"), 1);
}

#[test]
fn llama_rope_llama3() {
    // original 16: the fastest pair (wavelength 2π) falls in the smoothed band, the rest are scaled.
    check("llama_rope_llama3", with(base("llama"), llama3_scaling(16)), 2);
}

#[test]
fn llama_rope_llama3_all_bands() {
    // original 64: pair 0 unchanged (wavelength < 16), pairs 1-2 smoothed, the rest scaled.
    check("llama_rope_llama3_all_bands", with(with(base("llama"), llama3_scaling(64)), json!({ "max_position_embeddings": 512 })), 3);
}

#[test]
fn llama_attention_bias() {
    check("llama_attention_bias", with(base("llama"), json!({ "attention_bias": true, "num_hidden_layers": 3 })), 4);
}

#[test]
fn llama_rope_linear() {
    check("llama_rope_linear", with(base("llama"), json!({ "rope_scaling": { "type": "linear", "factor": 2.5 } })), 5);
}

#[test]
fn llama_rope_yarn_ramp() {
    // original 4096: the yarn correction range is pairs 2..6, so the ramp is not degenerate.
    let cfg = with(
        base("llama"),
        json!({
            "max_position_embeddings": 16384,
            "rope_scaling": { "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096 }
        }),
    );
    check("llama_rope_yarn_ramp", cfg, 6);
}

#[test]
fn qwen2_tied_with_qkv_bias() {
    check("qwen2_tied_with_qkv_bias", qwen2(), 7);
}

#[test]
fn qwen3_qk_norm() {
    check("qwen3_qk_norm", qwen3(), 8);
}

#[test]
fn qwen3_rope_yarn() {
    check("qwen3_rope_yarn", qwen3_yarn(), 9);
}

#[test]
fn minicpm_mup_longrope() {
    check("minicpm_mup_longrope", minicpm_longrope(), 10);
}

#[test]
fn minicpm_untied() {
    let cfg = with(
        base("minicpm"),
        json!({ "scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 16, "tie_word_embeddings": false }),
    );
    check("minicpm_untied", cfg, 11);
}

/// Prefill, then a multi-token chunk at an offset, then one token at a time through the cache:
/// every row matches the reference's full-sequence logits at that position.
#[test]
fn cached_decode_matches_the_full_sequence() {
    let cases = [
        ("cache_llama3", with(base("llama"), llama3_scaling(16))),
        ("cache_qwen2", qwen2()),
        ("cache_qwen3_yarn", qwen3_yarn()),
        ("cache_minicpm_longrope", minicpm_longrope()),
        // Heads 32 wide, which the decode kernels take (a GPU run goes through them).
        ("cache_qwen3_d32", with(qwen3(), json!({ "head_dim": 32 }))),
        ("cache_qwen3_yarn_d32", with(qwen3_yarn(), json!({ "head_dim": 32 }))),
        ("cache_llama3_d32", with(with(base("llama"), llama3_scaling(16)), json!({ "hidden_size": 128, "num_attention_heads": 4 }))),
    ];
    let mut failures = Vec::new();
    for (i, (name, cfg)) in cases.into_iter().enumerate() {
        let seed = 100 + i as u64;
        let dir = write_model(name, &cfg, seed);
        let ids = prompt(seed);
        let want = reference(&dir.0, &ids);
        let model = load(&dir.0);
        let mut cache = model.new_cache();
        let (prefill, chunk) = (12, 9);
        let mut got = run(model.as_ref(), &mut cache, &ids[..prefill]);
        got.extend(run(model.as_ref(), &mut cache, &ids[prefill..prefill + chunk]));
        for t in prefill + chunk..ids.len() {
            got.extend(run(model.as_ref(), &mut cache, &ids[t..t + 1]));
        }
        let (diff, row) = max_diff(&got, &want);
        let (decode_diff, _) = max_diff(&got[prefill + chunk..], &want[prefill + chunk..]);
        println!("{name}: max |Δlogit| = {diff:.3e} (row {row}); decode rows only {decode_diff:.3e}");
        if diff >= TOLERANCE {
            failures.push(format!("{name}: max |Δlogit| {diff:.3e} at position {row}"));
        }
    }
    assert!(failures.is_empty(), "cached decode differs from the full-sequence reference:\n{}", failures.join("\n"));
}

fn load_error(name: &str, cfg: Value) -> String {
    let dir = write_model(name, &cfg, 50);
    match sala::models::load(&dir.0, None) {
        Ok(_) => panic!("{name}: loaded, but the config must be refused"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unsupported_configs_are_refused() {
    let dynamic = with(base("llama"), json!({ "rope_scaling": { "rope_type": "dynamic", "factor": 2.0 } }));
    let message = load_error("refuse_dynamic", dynamic);
    assert!(message.contains("rope_scaling") && message.contains("dynamic"), "{message}");

    let legacy_dynamic = with(base("qwen2"), json!({ "rope_scaling": { "type": "dynamic", "factor": 2.0 } }));
    let message = load_error("refuse_dynamic_legacy", legacy_dynamic);
    assert!(message.contains("rope_scaling"), "{message}");

    let mistral = with(base("mistral"), json!({ "sliding_window": 16 }));
    let message = load_error("refuse_sliding_window", mistral);
    assert!(message.contains("sliding_window"), "{message}");

    let qwen2 = with(qwen2(), json!({ "use_sliding_window": true }));
    let message = load_error("refuse_qwen2_sliding_window", qwen2);
    assert!(message.contains("sliding_window"), "{message}");
}

/// Each key a family's table defaults (as its HF config class does), removed in turn, behaves as
/// the default written out (tests/common/config_defaults.rs); a transformers 5 config, which keeps
/// rope_theta in `rope_parameters`, reads the same.
#[test]
fn keys_left_out_take_the_class_defaults() {
    use sala::models::{llama, minicpm, qwen2, qwen3};
    let explicit = json!({ "hidden_act": "silu", "attention_bias": false, "mlp_bias": false, "rope_scaling": null });
    let cases = [
        ("defaults_llama", with(base("llama"), explicit.clone()), llama::LLAMA_DEFAULTS),
        ("defaults_mistral", with(base("mistral"), json!({ "hidden_act": "silu", "sliding_window": null, "attention_bias": false })), llama::MISTRAL_DEFAULTS),
        ("defaults_qwen2", qwen2(), qwen2::DEFAULTS),
        ("defaults_qwen3", with(qwen3(), json!({ "attention_bias": false, "hidden_act": "silu" })), qwen3::DEFAULTS),
        ("defaults_minicpm", with(minicpm_longrope(), json!({ "attention_bias": false, "hidden_act": "silu" })), minicpm::DEFAULTS),
    ];
    for (i, (name, cfg, table)) in cases.into_iter().enumerate() {
        let dir = write_model(name, &cfg, 60 + i as u64);
        let (by_logits, by_outcome, _) = common::config_defaults::check_each_key(&dir.0, &cfg, table, &prompt(60 + i as u64));
        println!("{name}: {by_logits} keys give the same logits removed, {by_outcome} the same outcome as their default written in");
        assert!(by_logits + by_outcome >= 12, "{name}: too few keys checked");
    }

    let v4 = with(qwen3(), json!({ "rope_theta": 1000000.0 }));
    let dir = write_model("defaults_rope_parameters", &v4, 70);
    let mut v5 = v4.clone();
    v5.as_object_mut().unwrap().remove("rope_theta");
    v5["rope_parameters"] = json!({ "rope_type": "default", "rope_theta": 1000000.0 });
    let logits = |cfg: &Value| common::config_defaults::outcome(&dir.0, cfg, &prompt(70)).unwrap();
    assert_eq!(logits(&v4), logits(&v5), "rope_parameters.rope_theta is not read as rope_theta");
}

/// Decode steps traced once and replayed (`engine::fixed_step`) give each family's logits of the
/// same steps built afresh: plain RoPE past a flush of the recent-token buffer (256 tokens), the
/// llama3 and YaRN scalings, Qwen2's biases, Qwen3's q/k norms, MiniCPM's scaled residuals (its
/// longrope keeps one set of factors), and a Llama's longrope, which switches from the short to
/// the long factors once the sequence passes position 16 (a new graph there).
#[test]
fn fixed_steps_match_steps_built_afresh_in_every_family() {
    let long = json!({ "max_position_embeddings": 512 });
    let switching = with(base("llama"), json!({ "rope_scaling": minicpm_longrope()["rope_scaling"].clone() }));
    let cases = [
        ("fixed_llama", with(base("llama"), long.clone()), 40, 300),
        ("fixed_llama3", with(with(base("llama"), llama3_scaling(64)), long.clone()), 40, 300),
        ("fixed_qwen2", with(qwen2(), long), 40, 300),
        ("fixed_qwen3_yarn", qwen3_yarn(), 8, 56),
        ("fixed_minicpm_longrope", minicpm_longrope(), 8, 56),
        ("fixed_llama_longrope", switching, 8, 56),
    ];
    for (name, cfg, prompt, steps) in cases {
        let dir = write_model(name, &cfg, 11);
        let model = load(&dir.0);
        assert_eq!(compare_fixed_steps(model.as_ref(), prompt, steps, 1e-4), steps, "{name}: every step a fixed one");
    }
}
