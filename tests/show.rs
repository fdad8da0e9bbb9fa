//! `sala show` describes what is there, for each kind of source, checked against the files
//! themselves: a GGUF file read independently by gguf-py (tensor count and types as stored, the
//! bytes its weights take as sala holds them), a safetensors folder and its `.sala` pack (files
//! that exist, tensors in the header, where the tokenizer and template come from).

mod common;

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn show(model: &Path, extra: &[&str]) -> (Value, String) {
    let json = Command::new(env!("CARGO_BIN_EXE_sala")).arg("show").arg(model).arg("--json").args(extra).output().unwrap();
    assert!(json.status.success(), "{}", String::from_utf8_lossy(&json.stderr));
    let text = Command::new(env!("CARGO_BIN_EXE_sala")).arg("show").arg(model).output().unwrap();
    assert!(text.status.success(), "{}", String::from_utf8_lossy(&text.stderr));
    (serde_json::from_slice(&json.stdout).unwrap(), String::from_utf8_lossy(&text.stdout).to_string())
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sala-show-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn gguf_is_shown_as_the_file_stores_it() {
    let gguf = common::smollm2_gguf();
    let python = common::venv_python("gguf-venv", "SALA_GGUF_PYTHON", "gguf", &["gguf==0.19.0"]);
    let script = "import json, sys\nfrom gguf import GGUFReader\nr = GGUFReader(sys.argv[1])\n\
        print(json.dumps({'tensors': [[t.name, t.tensor_type.name, int(t.n_elements)] for t in r.tensors], \
        'template': 'tokenizer.chat_template' in r.fields, 'tokenizer': str(r.fields['tokenizer.ggml.model'].contents())}))";
    let out = Command::new(python).args(["-c", script]).arg(&gguf).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let facts: Value = serde_json::from_slice(&out.stdout).unwrap();
    let tensors: Vec<(String, String, u64)> = serde_json::from_value(facts["tensors"].clone()).unwrap();
    let mut types: BTreeMap<String, usize> = BTreeMap::new();
    for (_, kind, _) in &tensors {
        *types.entry(kind.clone()).or_default() += 1;
    }
    assert_eq!(tensors.len(), 272, "SmolLM2-135M Q4_1 stores 272 tensors");

    let (json, text) = show(&gguf, &["--tensors"]);
    assert_eq!(json["layout"], "GGUF");
    assert_eq!(json["tensors"], tensors.len());
    assert_eq!(json["dtypes"], serde_json::to_value(&types).unwrap());
    let listed: BTreeMap<String, String> =
        json["tensor_list"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v["dtype"].as_str().unwrap().to_string())).collect();
    assert_eq!(listed, tensors.iter().map(|(n, k, _)| (n.clone(), k.clone())).collect::<BTreeMap<_, _>>());
    // No invented files: the GGUF file is all there is; config and tokenizer come from its metadata.
    assert_eq!(json["files"], serde_json::json!([gguf.file_name().unwrap().to_str().unwrap()]));
    assert_eq!(json["config_source"], "GGUF metadata");
    assert_eq!(json["tokenizer_source"], format!("GGUF metadata (tokenizer.ggml.model `{}`)", facts["tokenizer"].as_str().unwrap()));
    assert_eq!(json["chat_template_source"].is_string(), facts["template"].as_bool().unwrap());
    // (The sampling line says no generation_config.json exists, which is true.)
    let claims = text.replace("no generation_config.json settings", "");
    for invented in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        assert!(!claims.contains(invented), "{invented} named though the GGUF has no such file:\n{text}");
    }
    assert!(text.contains("tensors      272 in the file (F32 ×61, Q4_1 ×210, Q8_0 ×1)"), "{text}");

    // As held: the 4-bit and 8-bit matrices stay quantized (packed codes + a scale and a bias per
    // 32 weights in the float dtype), the rest is in the float dtype.
    let dtype = json["memory"]["dtype"].as_str().unwrap();
    let float = match dtype {
        "Float32" => 4,
        "Float16" | "Bfloat16" => 2,
        other => panic!("dtype {other}"),
    };
    assert_eq!(json["memory"]["held"], format!("4-bit affine group 32 ×210, 8-bit affine group 32 ×1, {dtype} ×61"));
    let held: u64 = tensors
        .iter()
        .map(|(_, kind, n)| match kind.as_str() {
            "F32" => n * float,
            "Q4_1" => n / 2 + 2 * (n / 32) * float,
            "Q8_0" => n + 2 * (n / 32) * float,
            other => panic!("type {other}"),
        })
        .sum();
    assert_eq!(json["memory"]["weights_bytes"], held);
    assert!(text.contains("held as      4-bit affine group 32 ×210"), "{text}");
}

#[test]
fn folder_and_sala_pack_list_only_what_is_there() {
    let dir = temp("folder");
    let golden = common::golden("A_dense_f32");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(golden.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("tokenizer.json"), common::byte_tokenizer().to_string()).unwrap();
    std::fs::write(dir.join("chat_template.jinja"), "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
    std::fs::write(dir.join("README.md"), "a note").unwrap();
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let header = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut dtypes: BTreeMap<String, usize> = BTreeMap::new();
    for (_, view) in header.tensors() {
        *dtypes.entry(format!("{:?}", view.dtype())).or_default() += 1;
    }

    let (json, text) = show(&dir, &[]);
    assert_eq!(json["layout"], "directory");
    assert_eq!(json["tensors"], header.len());
    assert_eq!(json["dtypes"], serde_json::to_value(&dtypes).unwrap());
    let files: Vec<String> = serde_json::from_value(json["files"].clone()).unwrap();
    assert_eq!(files, ["README.md", "chat_template.jinja", "config.json", "model.safetensors", "tokenizer.json"]);
    assert!(files.iter().all(|f| dir.join(f).is_file()));
    assert_eq!(json["config_source"], "config.json");
    assert_eq!(json["tokenizer_source"], "tokenizer.json");
    assert_eq!(json["chat_template_source"], "chat_template.jinja");
    assert_eq!(json["memory"]["held"], format!("{} ×{}", json["memory"]["dtype"].as_str().unwrap(), header.len()));
    assert!(text.contains("template     chat_template.jinja"), "{text}");

    // Packed: the side files it carries in its metadata, and nothing else.
    let packed = dir.join("model.sala");
    let out = Command::new(env!("CARGO_BIN_EXE_sala")).args(["pack", "--model"]).arg(&dir).arg("--output").arg(&packed).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&packed).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let carried: Vec<String> =
        meta.metadata().as_ref().unwrap().keys().filter_map(|k| k.strip_prefix("sala.file.")).map(str::to_string).collect();
    let (json, text) = show(&packed, &[]);
    assert_eq!(json["layout"], "single file");
    let mut files: Vec<String> = serde_json::from_value(json["files"].clone()).unwrap();
    files.sort();
    let mut carried = carried;
    carried.sort();
    assert_eq!(files, carried);
    assert!(files.contains(&"tokenizer.json".to_string()) && files.contains(&"config.json".to_string()), "{files:?}");
    assert_eq!(json["tensors"], header.len());
    assert_eq!(json["tokenizer_source"], "tokenizer.json inside model.sala");
    assert_eq!(json["config_source"], "config.json inside model.sala");
    assert!(text.contains("stops at") && text.contains("(config.json inside model.sala)"), "{text}");
    std::fs::remove_dir_all(dir).unwrap();
}
