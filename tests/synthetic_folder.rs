//! A synthetic model's folder (`synthetic.json` + a tokenizer): random weights drawn at load by
//! the one loading path, so `serve`, `run`, `show` and `bench -m` take it like a checkpoint. A
//! tiny inline config (golden case A's layers) with the MiniCPM4 tokenizer keeps it fast on a CPU;
//! its vocab_size is above the tokenizer's, as Qwen3-8B's preset is with that tokenizer.

mod common;

use common::server::{request, Server};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// More rows than the tokenizer's 73,448 tokens: ids past it are drawn and decode to nothing.
const VOCAB: u64 = 73_472;

fn sala(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sala")).args(args).output().unwrap()
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn failed(out: &Output) -> String {
    assert!(!out.status.success(), "succeeded: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).to_string()
}

fn tiny_config() -> serde_json::Value {
    common::tiny_synthetic_config(VOCAB)
}

/// A folder `label` with `synthetic` as its synthetic.json and, with `tokenizer`, the MiniCPM4
/// tokenizer's files.
fn folder(label: &str, synthetic: &serde_json::Value, tokenizer: bool) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sala-synthetic-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    common::synthetic_folder(&dir, synthetic, tokenizer);
    dir
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Greedy `sala run` on the CPU: the generated ids and the logits file's bytes.
fn greedy(dir: &Path, out: &str) -> (Vec<u64>, Vec<u8>) {
    let logits = std::env::temp_dir().join(format!("sala-synthetic-{out}-{}.safetensors", std::process::id()));
    let args = ["run", "-m", path(dir), "--device", "cpu", "--temperature", "0", "--max-tokens", "8", "--ignore-eos", "--json", "--logits-out", path(&logits), "Hello"];
    let json: serde_json::Value = serde_json::from_str(&ok(&sala(&args))).unwrap();
    let ids = json["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let bytes = std::fs::read(&logits).unwrap();
    let _ = std::fs::remove_file(&logits);
    (ids, bytes)
}

#[test]
fn run_draws_the_same_model_every_load() {
    let dir = folder("run", &serde_json::json!({"config": tiny_config()}), true);
    let (ids, logits) = greedy(&dir, "first");
    assert_eq!(ids.len(), 8, "{ids:?}");
    // Another load: the same weights, so the same tokens from the same logits, bit for bit.
    assert_eq!(greedy(&dir, "second"), (ids.clone(), logits.clone()));
    // Another seed: another model.
    let other = folder("run-seed", &serde_json::json!({"config": tiny_config(), "seed": 7}), true);
    let (_, other_logits) = greedy(&other, "seed");
    assert_ne!(other_logits, logits);
    // `show` says what will be drawn, without drawing it.
    let shown = ok(&sala(&["show", path(&dir)]));
    assert!(shown.contains("synthetic (random weights drawn when loaded, from inline config)"), "{shown}");
    assert!(shown.contains(&format!("vocab {VOCAB}")) && shown.contains("tokenizer    tokenizer.json"), "{shown}");
    // Commands that need weights on disk say why they have none.
    let err = failed(&sala(&["pack", "-m", path(&dir), "-o", path(&dir.join("x.sala"))]));
    assert!(err.contains("a synthetic model (synthetic.json"), "{err}");
    for d in [dir, other] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn serve_answers_a_chat_completion() {
    let dir = folder("serve", &serde_json::json!({"config": tiny_config(), "bits": 8}), true);
    let server = Server::start(&dir, &["--device", "cpu"], 200);
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 6, "temperature": 0, "ignore_eos": true,
    });
    let r = request(server.port, "POST", "/v1/chat/completions", Some(&body.to_string()), &[]).expect("an answer");
    let json = r.json();
    assert_eq!(r.status, 200, "{json}");
    assert_eq!(json["usage"]["completion_tokens"], 6, "{json}");
    assert!(json["usage"]["prompt_tokens"].as_u64().unwrap() > 3, "{json}");
    assert_eq!(json["choices"][0]["message"]["role"], "assistant", "{json}");
    // The model list describes it as what it is: every projection of the golden checkpoint it
    // has the shapes of (2-D, rows in whole groups of 64; not the embeddings) at 8 bits.
    let golden = common::read_safetensors(&common::golden("A_dense_f32").join("model.safetensors"));
    let projections = golden.iter().filter(|(n, t)| t.shape.len() == 2 && t.shape[1] % 64 == 0 && !n.contains("embed_tokens")).count();
    let models = request(server.port, "GET", "/v1/models", None, &[]).unwrap().json();
    assert_eq!(models["data"][0]["quantization"], format!("8-bit group 64 ×{projections}"), "{models}");
    // Random weights are said to be so where clients and probes look.
    assert_eq!(models["data"][0]["synthetic"], true, "{models}");
    let health = request(server.port, "GET", "/health", None, &[]).unwrap().json();
    assert_eq!((health["status"].as_str(), health["synthetic"].as_bool()), (Some("ok"), Some(true)), "{health}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_names_a_folder_as_synthetic_does() {
    let dir = folder("bench", &serde_json::json!({"config": tiny_config(), "bits": 8, "name": "tiny"}), true);
    let config = std::env::temp_dir().join(format!("sala-synthetic-bench-{}/tiny.json", std::process::id()));
    std::fs::write(&config, tiny_config().to_string()).unwrap();
    let out = ok(&sala(&[
        "bench", "-m", path(&dir), "--synthetic", path(&config), "--bits", "8", "--device", "cpu", "-p", "8", "-n", "0", "-r", "1", "-o", "json",
    ]));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(rows.len(), 2, "{out}");
    for key in ["model_filename", "model_size", "n_params", "model_type"] {
        assert_eq!(rows[0][key], rows[1][key], "{key}: {out}");
    }
    assert_eq!(rows[0]["model_filename"], "tiny-q8 (synthetic)");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_synthetic_folders_say_what_to_fix() {
    let mut small = tiny_config();
    small["vocab_size"] = 512.into();
    let cases = [
        ("preset", serde_json::json!({"preset": "llama-70b"}), true, vec!["synthetic.json: key `preset`: `llama-70b` is not a preset", "minicpm-sala-9b, qwen3-8b"]),
        ("bits", serde_json::json!({"preset": "qwen3-8b", "bits": 7}), true, vec!["synthetic.json: key `bits`: 7 bits is not supported"]),
        ("neither", serde_json::json!({"bits": 8}), true, vec!["synthetic.json: key `preset`: missing", "`config` object"]),
        ("both", serde_json::json!({"preset": "qwen3-8b", "config": tiny_config()}), true, vec!["keep one"]),
        ("unknown", serde_json::json!({"preset": "qwen3-8b", "bitz": 8}), true, vec!["unknown field `bitz`"]),
        ("tokenizer", serde_json::json!({"preset": "qwen3-8b"}), false, vec!["needs a tokenizer beside synthetic.json", "eval/synthetic-folder.sh"]),
        ("vocab", serde_json::json!({"config": small}), true, vec!["its tokenizer has 73448 tokens but the model's vocab_size is 512"]),
    ];
    for (label, synthetic, tokenizer, wanted) in cases {
        let dir = folder(&format!("bad-{label}"), &synthetic, tokenizer);
        // Refused before anything is drawn, by every command that takes a model.
        for command in [vec!["run", "-m", path(&dir), "--device", "cpu", "hi"], vec!["show", path(&dir)]] {
            let err = failed(&sala(&command));
            for w in &wanted {
                assert!(err.contains(w), "{label}, {}: {err}", command[0]);
            }
            assert!(!err.contains("panicked"), "{err}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    // A preset too large for the memory is refused before anything is drawn, with the fix named.
    let dir = folder("too-large", &serde_json::json!({"preset": "minicpm-sala-9b"}), true);
    let out = Command::new(env!("CARGO_BIN_EXE_sala")).args(["run", "-m", path(&dir), "hi"]).env("SALA_AVAILABLE_MEMORY", "8000000000").output().unwrap();
    let err = failed(&out);
    assert!(err.contains("8.00 GB is available") && err.contains(&format!("set \"bits\": 8 or 4 in {}", dir.join("synthetic.json").display())), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
