//! Configs as published leave keys out; the HF config classes fill them in. For each family,
//! every key its table (`models::config_defaults`) gives a default to is removed in turn and the
//! model must behave exactly as with that default written out (tests/common/config_defaults.rs):
//! MiniCPM-SALA on golden cases A–D, Llama on SmolLM2, and the tables themselves against the
//! transformers classes (tests/reference/hf_config_defaults.py). Also: non-persistent buffers in a
//! checkpoint are skipped (and reported), a stray real tensor is still refused, and a
//! `generation_config.json` sets `run`'s and `serve`'s sampling defaults.

mod common;

use common::config_defaults::check_each_key;
use serde_json::Value;

fn golden_ids(case: &str, limit: usize) -> Vec<u32> {
    let ids = common::ids(&common::tokens(case), "prompt_ids");
    ids[..ids.len().min(limit)].to_vec()
}

fn read_config(dir: &std::path::Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

/// Golden cases A–D: every SALA key the table defaults, removed in turn.
#[test]
fn minicpm_sala_keys_left_out_take_the_class_defaults() {
    // C's prompt is cut to 400 tokens: past its dense_len (256), so the sparse path still runs.
    for (case, limit) in [("A_dense_f32", 64), ("B_chunk_boundary", 150), ("C_sparse_prefill", 400), ("D_two_turn", 64)] {
        let dir = common::golden(case);
        let (by_logits, by_outcome, required) = check_each_key(&dir, &read_config(&dir), sala::models::sala::DEFAULTS, &golden_ids(case, limit));
        println!("{case}: {by_logits} keys give the same logits removed, {by_outcome} the same outcome as their default written in, {required} required");
        assert!(by_logits >= 20 && by_outcome >= 5 && required == 1, "{case}: too few keys checked ({by_logits}, {by_outcome}, {required})");
    }
}

/// SmolLM2 (a real Llama-family checkpoint, as a GGUF whose config the import writes): each key
/// LlamaConfig defaults, removed in turn.
#[test]
fn llama_keys_left_out_on_smollm2() {
    let gguf = common::smollm2_gguf();
    let config: Value = serde_json::from_str(&sala::models::open(&gguf).unwrap().files["config.json"]).unwrap();
    let ids: Vec<u32> = vec![1, 504, 3458, 282, 4649, 314];
    let (by_logits, by_outcome, _) = check_each_key(&gguf, &config, sala::models::llama::LLAMA_DEFAULTS, &ids);
    println!("SmolLM2: {by_logits} keys give the same logits removed, {by_outcome} the same outcome as their default written in");
    assert!(by_logits + by_outcome >= 10, "too few keys checked ({by_logits}, {by_outcome})");
}

/// Golden A's checkpoint plus `extra` tensors (float32, given shapes), in a scratch directory.
fn golden_a_with(label: &str, extra: &[(&str, &[usize])]) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sala-config-defaults-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let golden = common::golden("A_dense_f32");
    std::fs::copy(golden.join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(golden.join("model.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let extra_data: Vec<(String, Vec<usize>, Vec<u8>)> =
        extra.iter().map(|(name, shape)| (name.to_string(), shape.to_vec(), vec![0u8; shape.iter().product::<usize>() * 4])).collect();
    let mut views: Vec<(String, safetensors::tensor::TensorView)> = tensors.tensors().into_iter().collect();
    for (name, shape, data) in &extra_data {
        views.push((name.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data).unwrap()));
    }
    std::fs::write(dir.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    dir
}

fn golden_a_logits(dir: &std::path::Path) -> Result<Vec<f32>, String> {
    common::config_defaults::outcome(dir, &read_config(dir), &golden_ids("A_dense_f32", 64))
}

/// Rotary buffers some exporters save are skipped, named by `sala show`, and change nothing; a
/// stray real tensor is still refused by name.
#[test]
fn buffers_are_skipped_and_stray_tensors_refused() {
    let plain = golden_a_logits(&common::golden("A_dense_f32")).unwrap();
    let buffers = golden_a_with(
        "buffers",
        &[
            ("model.layers.1.self_attn.rotary_emb.inv_freq", &[16]),
            ("model.layers.1.self_attn.rotary_emb.cos_cached", &[64, 32]),
            ("model.layers.2.self_attn.rotary_emb.sin_cached", &[64, 32]),
        ],
    );
    assert_eq!(golden_a_logits(&buffers).as_ref(), Ok(&plain), "a checkpoint with buffers must load and give the same logits");
    let show = std::process::Command::new(env!("CARGO_BIN_EXE_sala")).args(["show", "--json"]).arg(&buffers).output().unwrap();
    assert!(show.status.success(), "{}", String::from_utf8_lossy(&show.stderr));
    let summary: Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(summary["skipped_buffers"].as_array().map(Vec::len), Some(3), "{summary}");
    // The file's 52 tensors are counted as stored; the 3 buffers among them are named as not loaded.
    assert_eq!(summary["tensors"], 52, "{summary}");
    assert_eq!(summary["memory"]["held"], format!("{} ×49", summary["memory"]["dtype"].as_str().unwrap()), "buffers are not held: {summary}");
    let text = std::process::Command::new(env!("CARGO_BIN_EXE_sala")).arg("show").arg(&buffers).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("skipped      3 buffer(s)") && text.contains("rotary_emb"), "{text}");

    let stray = golden_a_with("stray", &[("model.layers.0.mlp.extra_proj.weight", &[8, 128])]);
    let message = golden_a_logits(&stray).unwrap_err();
    assert!(message.contains("unexpected tensor `model.layers.0.mlp.extra_proj.weight`"), "{message}");
    for dir in [buffers, stray] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// The Llama, Mistral, Qwen2 and Qwen3 tables against the transformers classes they cite
/// (transformers 4.57.1 from PyPI, no torch needed for configs).
#[test]
fn dense_tables_match_the_transformers_classes() {
    use sala::engine::config::Fallback;
    let python = common::venv_python("transformers-venv", "SALA_TRANSFORMERS_PYTHON", "transformers", &["transformers==4.57.1"]);
    let mut entries = Vec::new();
    for family in ["llama", "mistral", "qwen2", "qwen3"] {
        for entry in sala::models::config_defaults(family).unwrap() {
            let (kind, value) = match entry.fallback {
                Fallback::Json(text) => ("json", serde_json::from_str(text).unwrap()),
                Fallback::SameAs(other) => ("same_as", Value::from(other)),
                Fallback::Computed(rule) => ("computed", Value::from(rule)),
                Fallback::Off => ("off", Value::Null),
                Fallback::Required => ("required", Value::Null),
            };
            entries.push(serde_json::json!({"family": family, "key": entry.key, "kind": kind, "value": value, "source": entry.source}));
        }
    }
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/hf_config_defaults.py");
    let mut child = std::process::Command::new(python)
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(Value::from(entries).to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let transcript = String::from_utf8_lossy(&out.stdout).to_string();
    println!("{transcript}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && transcript.trim_end().ends_with("passed"), "{transcript}");
}

fn run_json(model: &std::path::Path, flags: &[&str]) -> Value {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sala"))
        .args(["run", "--model"])
        .arg(model)
        .args(["--input-ids", "1,2,3", "--max-tokens", "24", "--json", "--seed", "5"])
        .args(flags)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A chat answer's text from `port` for `fields` added to a fixed request (seeded).
fn chat(port: u16, fields: Value) -> String {
    let mut body = serde_json::json!({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 24, "seed": 3});
    for (k, v) in fields.as_object().unwrap() {
        body[k] = v.clone();
    }
    let response = common::server::request(port, "POST", "/v1/chat/completions", Some(&body.to_string()), &[]).expect("an answer");
    assert_eq!(response.status, 200, "{}", response.body);
    response.json()["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

/// generation_config.json's temperature 0.6 / top_p 0.9 become `run`'s and `serve`'s defaults
/// (the same draws as those values given explicitly), `show` says so, and a flag or request
/// field still wins; its eos list joins the config's.
#[test]
fn generation_config_sets_the_sampling_defaults() {
    let model = common::golden_with_tokenizer("A_dense_f32", "generation-config", None);
    let generation = model.join("generation_config.json");
    let _ = std::fs::remove_file(&generation);
    let explicit = run_json(&model, &["--temperature", "0.6", "--top-p", "0.9"]);
    let ours = run_json(&model, &[]);
    let unset_server = common::server::Server::start(&model, &[], 200);
    let api_default = chat(unset_server.port, serde_json::json!({}));
    let api_explicit = chat(unset_server.port, serde_json::json!({"temperature": 0.6, "top_p": 0.9}));
    drop(unset_server);

    std::fs::write(&generation, r#"{"temperature": 0.6, "top_p": 0.9, "eos_token_id": [2, 300]}"#).unwrap();
    let from_file = run_json(&model, &[]);
    assert_eq!(from_file["sampling"], serde_json::json!({"temperature": 0.6, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.0}));
    assert_eq!(from_file["token_ids"], explicit["token_ids"], "the file's defaults must draw as the same flags do");
    assert_ne!(from_file["token_ids"], ours["token_ids"], "sala's own defaults (0.8 / 0.95) should draw differently");
    let flag = run_json(&model, &["--temperature", "0.2"]);
    assert_eq!((flag["sampling"]["temperature"].as_f64(), flag["sampling"]["top_p"].as_f64()), (Some(0.2), Some(0.9)), "a flag wins over the file");

    let show = std::process::Command::new(env!("CARGO_BIN_EXE_sala")).arg("show").arg(&model).output().unwrap();
    let show = String::from_utf8_lossy(&show.stdout).to_string();
    assert!(show.contains("temperature 0.6, top_p 0.9 (generation_config.json)") && show.contains("2, 300 (generation_config.json)"), "{show}");

    let server = common::server::Server::start(&model, &[], 200);
    let served = chat(server.port, serde_json::json!({}));
    assert_eq!(served, api_explicit, "a request without sampling fields must draw with the file's defaults");
    assert_ne!(served, api_default, "the API's own default (temperature 1) should draw differently");
    assert_eq!(chat(server.port, serde_json::json!({"temperature": 0})), chat(server.port, serde_json::json!({"temperature": 0, "seed": 9})), "a request's temperature wins (0 is greedy, whatever the seed)");
    drop(server);
    let _ = std::fs::remove_file(&generation);
}

/// docs/config-defaults.md carries the tables as the code has them (between its markers);
/// `SALA_UPDATE_GENERATED=1` rewrites them.
#[test]
fn the_documented_tables_are_the_code_tables() {
    use sala::engine::config::Fallback;
    let mut tables = String::new();
    for (family, class) in [
        ("minicpm_sala", "MiniCPM-SALA"),
        ("minicpm", "MiniCPM (dense)"),
        ("llama", "Llama"),
        ("mistral", "Mistral"),
        ("qwen2", "Qwen2 / Qwen2.5"),
        ("qwen3", "Qwen3"),
    ] {
        tables.push_str(&format!("\n### {class} (`model_type: {family}`)\n\n| key | left out | source |\n|---|---|---|\n"));
        for entry in sala::models::config_defaults(family).unwrap() {
            let fallback = match entry.fallback {
                Fallback::Json(text) => format!("`{text}`"),
                Fallback::SameAs(other) => format!("as `{other}`"),
                Fallback::Computed(rule) => rule.to_string(),
                Fallback::Off => "off (none)".to_string(),
                Fallback::Required => "**required**: refused, naming it".to_string(),
            };
            tables.push_str(&format!("| `{}` | {fallback} | {} |\n", entry.key, entry.source));
        }
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/config-defaults.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = ("<!-- tables: generated from models::config_defaults -->\n", "<!-- end of tables -->");
    let start = doc.find(begin).expect("the begin marker") + begin.len();
    let stop = doc.find(end).expect("the end marker");
    if std::env::var("SALA_UPDATE_GENERATED").is_ok_and(|v| v == "1") {
        std::fs::write(&path, format!("{}{tables}\n{}", &doc[..start], &doc[stop..])).unwrap();
        return;
    }
    assert_eq!(doc[start..stop].trim(), tables.trim(), "docs/config-defaults.md is out of date: SALA_UPDATE_GENERATED=1 cargo test --test config_defaults");
}
