//! Model files built as an attacker would (issue 28): each gives a typed error naming the problem,
//! never a write outside the output, a panic, or an allocation the file's size does not justify.
//! GGUF cases are in tests/gguf.rs; arbitrary bytes in tests/fuzz.rs.

mod common;

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn temp(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("sala-hostile-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// Runs `sala`: (exit code, stderr), asserting it neither panicked nor died of a signal.
fn sala(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sala")).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "sala panicked: {stderr}");
    let code = out.status.code().unwrap_or_else(|| panic!("sala was killed by a signal: {stderr}"));
    assert_ne!(code, 101, "sala panicked: {stderr}");
    (code, stderr)
}

/// A safetensors file of zero-filled tensors `(name, dtype, shape)` with `metadata`.
fn write_safetensors(path: &Path, tensors: &[(&str, Dtype, Vec<usize>)], metadata: Option<HashMap<String, String>>) {
    let data: Vec<Vec<u8>> = tensors.iter().map(|(_, d, s)| vec![0u8; s.iter().product::<usize>() * d.bitsize() / 8]).collect();
    let views: Vec<(String, TensorView)> =
        tensors.iter().zip(&data).map(|((n, d, s), bytes)| (n.to_string(), TensorView::new(*d, s.clone(), bytes).unwrap())).collect();
    std::fs::write(path, safetensors::serialize(views, metadata).unwrap()).unwrap();
}

/// Golden case A's tensors and config, packed as a `.sala` file with extra side files `extra`.
fn crafted_sala(path: &Path, extra: &[(&str, &str)]) {
    let golden = common::golden("A_dense_f32");
    let bytes = std::fs::read(golden.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut metadata = HashMap::new();
    metadata.insert("sala.file.config.json".to_string(), std::fs::read_to_string(golden.join("config.json")).unwrap());
    for (name, text) in extra {
        metadata.insert(format!("sala.file.{name}"), text.to_string());
    }
    std::fs::write(path, safetensors::serialize(st.tensors(), Some(metadata)).unwrap()).unwrap();
}

#[test]
fn side_file_names_from_a_sala_file_never_leave_the_output() {
    let dir = temp("escape");
    let escape = dir.join("escaped.txt");
    let absolute = dir.join("absolute.txt");
    let relative = format!("../../{}", escape.file_name().unwrap().to_str().unwrap());
    for name in [relative.as_str(), absolute.to_str().unwrap(), "..", ".hidden", "a\\b"] {
        let model = dir.join("crafted.sala");
        crafted_sala(&model, &[(name, "owned")]);
        // `out/deeper/q`: `../../escaped.txt` from its staging directory is `dir/escaped.txt`.
        let out = dir.join("out/deeper/q");
        for args in [
            vec!["quantize", "-m", model.to_str().unwrap(), "--bits", "8", "-o", out.to_str().unwrap()],
            vec!["pack", "--extract", model.to_str().unwrap(), "--output", out.to_str().unwrap()],
            vec!["show", model.to_str().unwrap()],
        ] {
            let (code, stderr) = sala(&args);
            assert!(code != 0 && stderr.contains("not a plain file name"), "{name:?} {args:?}: {stderr}");
            assert!(!escape.exists() && !absolute.exists(), "{name:?} {args:?} wrote outside its output");
            assert!(!out.exists(), "{name:?} {args:?} left an output behind");
        }
    }
    // The one check every writer goes through.
    let staging = sala::engine::checkpoint::StagingDir::new(&dir.join("staged")).unwrap();
    for bad in ["../x", "/etc/x", "a/b", "..", ".", "", ".x", "a\0b"] {
        assert!(staging.write(bad, "x").is_err(), "{bad:?} was written");
    }
    staging.write("tokenizer.json", "{}").unwrap();
    assert!(staging.finish().unwrap().join("tokenizer.json").is_file());
    std::fs::remove_dir_all(dir).unwrap();
}

/// A one-layer Llama config (hidden 64) with `edit` applied, and checkpoint tensors whose
/// embedding is stored 8-bit quantized, as the config's sizes say.
fn quantized_dense(dir: &Path, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let model = dir.join("dense");
    std::fs::create_dir_all(&model).unwrap();
    let mut config = json!({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "vocab_size": 64, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 256, "tie_word_embeddings": true,
        "quantization": {"group_size": 64, "bits": 8},
    });
    edit(&mut config);
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    let mut tensors = vec![
        ("model.embed_tokens.weight", Dtype::U32, vec![64, 16]),
        ("model.embed_tokens.scales", Dtype::F32, vec![64, 1]),
        ("model.embed_tokens.biases", Dtype::F32, vec![64, 1]),
        ("model.norm.weight", Dtype::F32, vec![64]),
    ];
    tensors.push(("model.layers.0.input_layernorm.weight", Dtype::F32, vec![64]));
    write_safetensors(&model.join("model.safetensors"), &tensors, None);
    model
}

#[test]
fn config_sizes_that_divide_by_zero_or_overflow_are_refused() {
    let dir = temp("config");
    let cases: Vec<(&str, Value, &str)> = vec![
        // Divided by in the quantized-shape check (was a panic, rc 101).
        ("hidden_size", json!(0), "hidden_size"),
        // Was accepted: an i32 truncation in the shape check.
        ("vocab_size", json!((1u64 << 32) + 49152), "vocab_size"),
        // Built ~10^10 tensor specs before any check (13.7 GB, then abort).
        ("num_hidden_layers", json!(1_000_000_000u64), "num_hidden_layers"),
        ("num_attention_heads", json!(0), "num_attention_heads"),
        ("max_position_embeddings", json!(u64::MAX), "max_position_embeddings"),
        ("eos_token_id", json!(1u64 << 40), "eos_token_id"),
        // RoPE tables were sized by hidden_size / heads before any weight was read (325 MB here).
        ("hidden_size", json!(325_489_892u64), "hidden_size"),
    ];
    for (key, value, named) in cases {
        let model = quantized_dense(&dir, |c| c[key] = value.clone());
        for command in ["show", "quantize"] {
            let out = dir.join("q");
            let args: Vec<&str> = match command {
                "show" => vec!["show", model.to_str().unwrap()],
                _ => vec!["quantize", "-m", model.to_str().unwrap(), "--bits", "4", "-o", out.to_str().unwrap()],
            };
            let (code, stderr) = sala(&args);
            assert!(code == 1 && stderr.contains(named), "{key} = {value}, {command}: rc {code}: {stderr}");
            assert!(!out.exists());
        }
        std::fs::remove_dir_all(&model).unwrap();
    }
    // Heads × head_dim past MLX's i32 limit: named, not truncated.
    let model = quantized_dense(&dir, |c| {
        c["num_attention_heads"] = json!(1 << 20);
        c["num_key_value_heads"] = json!(1 << 20);
        c["head_dim"] = json!(4096);
    });
    let (code, stderr) = sala(&["show", model.to_str().unwrap()]);
    assert!(code == 1 && stderr.contains("q_proj") && stderr.contains("limit"), "{stderr}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn safetensors_headers_that_lie_about_sizes_are_refused() {
    let dir = temp("safetensors");
    let path = dir.join("model.safetensors");
    // A shape whose element count overflows u64, with offsets that wrap to match it.
    let huge = 1u64 << 33;
    let header = json!({"w": {"dtype": "F32", "shape": [huge, huge, huge], "data_offsets": [0, 0]}}).to_string();
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    std::fs::write(&path, &bytes).unwrap();
    let e = sala::engine::weights::read_header(&path).err().expect("must fail");
    assert!(e.to_string().contains("do not match shape"), "{e}");
    // A header length past the end of the file.
    let mut bytes = (u64::MAX - 4).to_le_bytes().to_vec();
    bytes.extend(b"{}");
    std::fs::write(&path, &bytes).unwrap();
    let e = sala::engine::weights::read_header(&path).err().expect("must fail");
    assert!(e.to_string().contains("does not fit"), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_chat_template_that_never_ends_is_stopped() {
    let mut files = std::collections::BTreeMap::new();
    files.insert("tokenizer.json".to_string(), common::byte_tokenizer().to_string());
    let endless = "{% for a in range(100000) %}{% for b in range(100000) %}{{ b }}{% endfor %}{% endfor %}";
    files.insert("tokenizer_config.json".to_string(), json!({"chat_template": endless}).to_string());
    let tokenizer_files = sala::engine::tokenizer::TokenizerFiles::from_texts(Path::new("hostile"), &files).unwrap().unwrap();
    let tokenizer = sala::engine::tokenizer::TextTokenizer::new(&tokenizer_files, None).unwrap();
    let started = std::time::Instant::now();
    let e = tokenizer.apply_chat_template(&[sala::engine::tokenizer::Message::new("user", "hi")], true).expect_err("must stop");
    assert!(matches!(e, sala::engine::error::Error::Template(_)) && e.to_string().contains("fuel"), "{e}");
    println!("stopped after {:?}", started.elapsed());
}

#[test]
fn a_tokenizer_json_that_panics_the_tokenizers_crate_is_an_error() {
    // Found by tests/fuzz.rs: a syntax error inside `decoder` made the tokenizers crate panic
    // (it `expect`s its own parse of that object).
    let dir = temp("tokenizer");
    let golden = common::golden("A_dense_f32");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(golden.join(f), dir.join(f)).unwrap();
    }
    let good = common::byte_tokenizer().to_string();
    let bad = good.replacen("\"trim_offsets\":true", "\"trim_offsets\":tr+e", 1);
    assert_ne!(good, bad);
    std::fs::write(dir.join("tokenizer.json"), bad).unwrap();
    let (code, stderr) = sala(&["run", "-m", dir.to_str().unwrap(), "--device", "cpu", "--max-tokens", "1", "hi"]);
    assert!(code == 1 && stderr.contains("tokenizer.json is not valid JSON"), "rc {code}: {stderr}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// `sala pack` writes its `.sala` through `CheckpointWriter::write_file`, aside and renamed into
/// place (issue 54): a symlink planted at the name earlier versions wrote through
/// (`.NAME.partial-PID`) made it overwrite the file it points to, and the output became that
/// symlink. The file is now made afresh under a random
/// name, the planted link left alone; a partial file of a process that is gone is swept.
#[test]
fn a_planted_symlink_beside_a_packed_file_is_not_followed() {
    let dir = temp("pack-symlink");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    let output = dir.join("a.sala");
    // In this process: the name it would have written through.
    let planted = dir.join(format!(".a.sala.partial-{}", std::process::id()));
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let leftover = dir.join(".a.sala.partial-999999999-q7w8e9");
    std::fs::write(&leftover, b"half").unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options().write(true).open(&leftover).unwrap().set_modified(hour_ago).unwrap();
    let mut writer = sala::engine::checkpoint::CheckpointWriter::new();
    writer.add("w", "F32", vec![4], || Ok(vec![1u8; 16])).unwrap();
    writer.write_file(&output, &std::collections::BTreeMap::new()).unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(&output).unwrap().file_type().is_file());
    assert_eq!(sala::engine::weights::read_header(&output).unwrap().tensors.len(), 1);
    assert!(!leftover.exists(), "the partial file of a process that is gone was not swept");
    std::fs::remove_dir_all(dir).unwrap();
}
