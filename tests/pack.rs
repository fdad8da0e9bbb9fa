//! Single-file models: `sala pack` → `.sala` → `sala run`, `pack --extract` restoring the directory
//! byte for byte, `sala show`, and the refusals.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn sala(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sala")).args(args).output().unwrap()
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

fn temp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("sala-pack-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    let _ = std::fs::remove_file(&p);
    p
}

/// Golden case A plus a tokenizer, as a model directory.
fn model_dir() -> PathBuf {
    let dir = temp("src");
    std::fs::create_dir_all(&dir).unwrap();
    let golden = common::golden("A_dense_f32");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(golden.join(f), dir.join(f)).unwrap();
    }
    let tok = common::shared().join("assets/minicpm4-tokenizer");
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tok.join(f), dir.join(f)).unwrap();
    }
    dir
}

fn tensors(file: &Path) -> Vec<(String, String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, format!("{:?}", v.dtype()), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn run_ids(model: &Path) -> String {
    let ids = common::ids(&common::tokens("A_dense_f32"), "prompt_ids");
    let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    ok(&sala(&[
        "run", "--model", model.to_str().unwrap(), "--input-ids", &ids.join(","), "--temperature", "0",
        "--ignore-eos", "--max-tokens", "6", "--json", "--device", "cpu",
    ]))
}

#[test]
fn pack_extract_round_trip_is_byte_identical() {
    let dir = model_dir();
    let packed = temp("a.sala");
    ok(&sala(&["pack", "--model", dir.to_str().unwrap(), "--output", packed.to_str().unwrap()]));

    // The single file runs like the directory.
    assert_eq!(run_ids(&packed), run_ids(&dir));

    // `show` (and `pack --info`) describe it.
    let info = ok(&sala(&["pack", "--info", packed.to_str().unwrap()]));
    assert!(info.contains("single file") && info.contains("minicpm_sala"), "{info}");
    let name = packed.file_name().unwrap().to_str().unwrap();
    assert!(info.contains(&format!("template     tokenizer_config.json inside {name}")), "{info}");

    // Extracting restores every side file byte for byte and every tensor bit for bit.
    let extracted = temp("extracted");
    ok(&sala(&["pack", "--extract", packed.to_str().unwrap(), "--output", extracted.to_str().unwrap()]));
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        assert_eq!(std::fs::read(dir.join(f)).unwrap(), std::fs::read(extracted.join(f)).unwrap(), "{f} changed");
    }
    assert_eq!(tensors(&dir.join("model.safetensors")), tensors(&extracted.join("model.safetensors")));

    // Packing the extracted directory again gives the identical file.
    let again = temp("b.sala");
    ok(&sala(&["pack", "--model", extracted.to_str().unwrap(), "--output", again.to_str().unwrap()]));
    assert!(std::fs::read(&packed).unwrap() == std::fs::read(&again).unwrap(), "re-packing is not byte-identical");

    // Nothing is overwritten.
    let out = sala(&["pack", "--model", dir.to_str().unwrap(), "--output", packed.to_str().unwrap()]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("already exists"));
    let out = sala(&["pack", "--extract", packed.to_str().unwrap(), "--output", extracted.to_str().unwrap()]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("already exists"));

    for p in [&dir, &extracted] {
        std::fs::remove_dir_all(p).unwrap();
    }
    for p in [&packed, &again] {
        std::fs::remove_file(p).unwrap();
    }
}

#[test]
fn a_plain_safetensors_file_is_not_a_model() {
    let out = sala(&["run", "--model", common::golden("A_dense_f32").join("model.safetensors").to_str().unwrap(), "--input-ids", "1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("carries no config") && err.contains("sala pack"), "{err}");
}

#[test]
fn gguf_packs_into_a_runnable_single_file() {
    let packed = temp("smollm2.sala");
    let gguf = common::smollm2_gguf();
    ok(&sala(&["pack", "--model", gguf.to_str().unwrap(), "--output", packed.to_str().unwrap()]));
    let show = ok(&sala(&["show", packed.to_str().unwrap(), "--json"]));
    let show: serde_json::Value = serde_json::from_str(&show).unwrap();
    assert_eq!(show["model_type"], "llama");
    assert_eq!(show["quantization"], "4-bit group 32 ×210, 8-bit group 32 ×1");
    assert_eq!(show["layers"], 30);
    let answer = ok(&sala(&["run", "--model", packed.to_str().unwrap(), "What is the capital of France?", "--temperature", "0"]));
    assert_eq!(answer, "The capital of France is Paris.\n");
    std::fs::remove_file(packed).unwrap();
}

#[test]
fn extract_refuses_side_file_names_that_leave_the_directory() {
    let file = temp("evil.sala");
    let mut metadata = std::collections::BTreeMap::new();
    let config = std::fs::read_to_string(common::golden("A_dense_f32").join("config.json")).unwrap();
    metadata.insert("sala.file.config.json".to_string(), config);
    metadata.insert("sala.file.../escaped.txt".to_string(), "x".to_string());
    let mut writer = sala::engine::checkpoint::CheckpointWriter::new();
    writer.add("t", "F32", vec![1], || Ok(vec![0; 4])).unwrap();
    writer.write_file(&file, &metadata).unwrap();
    let out = temp("evil-out");
    let result = sala(&["pack", "--extract", file.to_str().unwrap(), "--output", out.to_str().unwrap()]);
    assert!(!result.status.success());
    let err = String::from_utf8_lossy(&result.stderr);
    assert!(err.contains("`../escaped.txt`") && err.contains("not a plain file name"), "{err}");
    assert!(!out.exists() && !out.parent().unwrap().join("escaped.txt").exists());
    std::fs::remove_file(file).unwrap();
}
