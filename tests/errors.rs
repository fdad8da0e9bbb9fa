//! Bad input gets a typed error that names the problem — never a panic.

mod common;

use common::golden;
use sala::engine::error::Error;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A scratch copy of golden case A with `edit` applied to its config.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str, edit: impl FnOnce(&mut Value)) -> Self {
        let dir = std::env::temp_dir().join(format!("sala-errors-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let src = golden("A_dense_f32");
        let mut config: Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
        edit(&mut config);
        std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
        std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
        Scratch(dir)
    }

    fn weights(&self) -> PathBuf {
        self.0.join("model.safetensors")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn load_err(dir: &Path) -> Error {
    match sala::models::load(dir, None) {
        Ok(_) => panic!("{} loaded but should not", dir.display()),
        Err(e) => e,
    }
}

/// Runs `sala` and returns (exit code, stderr); asserts it did not panic.
fn sala(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sala")).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "sala panicked: {stderr}");
    (out.status.code().unwrap_or(-1), stderr)
}

#[test]
fn missing_weights_file() {
    let s = Scratch::new("missing", |_| {});
    std::fs::remove_file(s.weights()).unwrap();
    let e = load_err(&s.0);
    assert!(matches!(e, Error::BadWeights { .. }), "{e}");
    assert!(e.to_string().contains("no model.safetensors"), "{e}");
}

#[test]
fn corrupt_weights_header() {
    let s = Scratch::new("corrupt", |_| {});
    let mut bytes = std::fs::read(s.weights()).unwrap();
    bytes[8] = b'#'; // the JSON header's opening brace
    std::fs::write(s.weights(), &bytes).unwrap();
    let e = load_err(&s.0);
    assert!(matches!(e, Error::BadWeights { .. }) && e.to_string().contains("corrupt header"), "{e}");
    std::fs::write(s.weights(), [1u8, 2, 3]).unwrap();
    let e = load_err(&s.0);
    assert!(e.to_string().contains("too short"), "{e}");
}

#[test]
fn truncated_weights() {
    let s = Scratch::new("truncated", |_| {});
    let bytes = std::fs::read(s.weights()).unwrap();
    std::fs::write(s.weights(), &bytes[..bytes.len() - 1000]).unwrap();
    let e = load_err(&s.0);
    assert!(matches!(e, Error::BadWeights { .. }) && e.to_string().contains("truncated"), "{e}");
    let (code, stderr) = sala(&["run", "--model", s.0.to_str().unwrap(), "--input-ids", "1,2", "--device", "cpu"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("truncated"), "{stderr}");
}

#[test]
fn wrong_tensor_shape_names_the_tensor() {
    let s = Scratch::new("shape", |c| c["intermediate_size"] = 128.into());
    match load_err(&s.0) {
        Error::TensorShape { name, expected, found, .. } => {
            assert_eq!(name, "model.layers.0.mlp.gate_proj.weight");
            assert_eq!((expected, found), (vec![128, 128], vec![256, 128]));
        }
        e => panic!("unexpected error {e}"),
    }
}

#[test]
fn misnamed_tensor_is_missing_not_ignored() {
    let s = Scratch::new("misnamed", |_| {});
    let bytes = std::fs::read(s.weights()).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let renamed: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (if n == "model.norm.weight" { "model.final_norm.weight".to_string() } else { n }, v))
        .collect();
    let out = safetensors::serialize(renamed, None).unwrap();
    std::fs::write(s.weights(), out).unwrap();
    match load_err(&s.0) {
        Error::MissingTensor { name, .. } => assert_eq!(name, "model.norm.weight"),
        e => panic!("unexpected error {e}"),
    }
}

#[test]
fn unknown_mixer_type() {
    let s = Scratch::new("mixer", |c| c["mixer_types"][1] = "mamba".into());
    match load_err(&s.0) {
        Error::InvalidKey { key, message, .. } => {
            assert_eq!(key, "mixer_types[1]");
            assert!(message.contains("mamba"));
        }
        e => panic!("unexpected error {e}"),
    }
}

#[test]
fn missing_config_key_is_named() {
    // Only a key the family's class has no default for is refused (docs/config-defaults.md);
    // the others load, tests/config_defaults.rs checks with what.
    let s = Scratch::new("key-mixer_types", |c| {
        c.as_object_mut().unwrap().remove("mixer_types");
    });
    match load_err(&s.0) {
        Error::MissingKey { key, .. } => assert_eq!(key, "mixer_types"),
        e => panic!("unexpected error {e}"),
    }
    assert!(load_err(&s.0).to_string().contains("no default"));
    for key in ["scale_emb", "lightning_scale"] {
        let s = Scratch::new(&format!("key-{key}"), |c| {
            c.as_object_mut().unwrap().remove(key);
        });
        assert!(sala::models::load(&s.0, None).is_ok(), "{key} has a default");
    }
}

#[test]
fn unknown_model_type() {
    let s = Scratch::new("type", |c| c["model_type"] = "gpt_neox".into());
    assert!(matches!(load_err(&s.0), Error::UnsupportedModel { model_type, .. } if model_type == "gpt_neox"));
}

#[test]
fn prompt_over_the_context_limit() {
    let s = Scratch::new("context", |c| c["max_position_embeddings"] = 16.into());
    let ids: Vec<String> = (1..=20).map(|i| i.to_string()).collect();
    let (code, stderr) = sala(&["run", "--model", s.0.to_str().unwrap(), "--input-ids", &ids.join(","), "--device", "cpu"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("prompt has 20 tokens but the context limit is 16"), "{stderr}");
}

#[test]
fn token_outside_the_vocabulary() {
    let (code, stderr) = sala(&["run", "--model", golden("A_dense_f32").to_str().unwrap(), "--input-ids", "1,512", "--device", "cpu"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("token id 512 is outside the vocabulary (size 512)"), "{stderr}");
}

#[test]
fn cli_usage_errors() {
    let (code, stderr) = sala(&["run", "--no-pull", "hello"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("pass --model PATH"), "{stderr}");
    // serve's store settings: a duration or `never`, at least one model.
    let (code, stderr) = sala(&["serve", "--keep-alive", "soon"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("--keep-alive") && stderr.contains("give a duration such as 30s, 5m or 1h, or `never`"), "{stderr}");
    let (code, stderr) = sala(&["serve", "--max-models", "0"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("--max-models") && stderr.contains("0 is not in 1.."), "{stderr}");
    let case = golden("A_dense_f32");
    let (code, stderr) = sala(&["run", "--model", case.to_str().unwrap(), "hello", "--device", "cpu"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("has no tokenizer") && stderr.contains("--input-ids"), "{stderr}");
    let (code, stderr) = sala(&["run", "--model", case.to_str().unwrap(), "--input-ids", "1", "--top-p", "0"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("--top-p"), "{stderr}");
    if !sala::engine::device::gpu_available() {
        let (code, stderr) = sala(&["run", "--model", case.to_str().unwrap(), "--input-ids", "1", "--device", "gpu"]);
        assert_eq!(code, 1);
        assert!(stderr.contains("no usable GPU"), "{stderr}");
    }
}

/// A tiny llama GGUF's metadata (32 hidden, one layer) for the files below.
fn llama_gguf_meta() -> Vec<(&'static str, common::gguf_file::Meta)> {
    use common::gguf_file::Meta;
    vec![
        ("general.architecture", Meta::Str("llama")),
        ("llama.block_count", Meta::U32(1)),
        ("llama.context_length", Meta::U32(64)),
        ("llama.embedding_length", Meta::U32(32)),
        ("llama.feed_forward_length", Meta::U32(64)),
        ("llama.attention.head_count", Meta::U32(4)),
        ("llama.attention.head_count_kv", Meta::U32(2)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
    ]
}

/// Errors about a model file name it once: they read "opening X: X: GGUF tensor …", the path
/// added again by each layer the error passed through.
#[test]
fn model_file_errors_name_the_file_once() {
    use common::gguf_file::gguf_bytes;
    let dir = std::env::temp_dir().join(format!("sala-errors-{}-once", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let embed = ("token_embd.weight".to_string(), vec![32u64, 64], 0u32, vec![0u8; 32 * 64 * 4]);
    let iq2 = ("blk.0.attn_q.weight".to_string(), vec![256u64, 1], 16u32, vec![0u8; 66]);
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let full = gguf_bytes(&llama_gguf_meta(), std::slice::from_ref(&embed));
    let corrupt = Scratch::new("once-corrupt", |_| {});
    let mut bytes = std::fs::read(corrupt.weights()).unwrap();
    bytes[8] = b'#';
    std::fs::write(corrupt.weights(), &bytes).unwrap();
    let cases: Vec<(PathBuf, &str)> = vec![
        (write("iq2.gguf", &gguf_bytes(&llama_gguf_meta(), &[embed.clone(), iq2])), "IQ2_XXS"),
        (write("truncated.gguf", &full[..full.len() - 100]), "truncated"),
        (write("missing.gguf", &full), "missing tensor"),
        (corrupt.0.clone(), "corrupt header"),
        (dir.join("absent.gguf"), "no such file"),
    ];
    let out = dir.join("out.sala");
    for (path, problem) in &cases {
        let p = path.to_str().unwrap();
        for args in [
            vec!["run", "--model", p, "--input-ids", "1,2", "--device", "cpu"],
            vec!["show", p],
            vec!["pack", "--model", p, "--output", out.to_str().unwrap()],
        ] {
            let (code, stderr) = sala(&args);
            assert_eq!(code, 1, "{args:?}: {stderr}");
            assert!(stderr.contains(problem), "{args:?}: {stderr}");
            assert_eq!(stderr.matches(p).count(), 1, "{args:?} names {p} once: {stderr}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `sala show … | head` that stops reading: sala ends quietly (SIGPIPE, as Unix tools do), with
/// no panic from writing to the closed pipe.
#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_sala"))
        .args(["show", common::golden("A_dense_f32").to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader is gone before sala writes
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{stderr}");
    use std::os::unix::process::ExitStatusExt;
    assert!(out.status.success() || out.status.signal() == Some(libc::SIGPIPE), "{:?}: {stderr}", out.status);
}
