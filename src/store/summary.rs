//! What a model on disk is: architecture, size, quantization, files — for `sala show`.

use crate::engine::config::{ConfigFile, DefaultedKey};
use crate::engine::device;
use crate::engine::error::{Error, Result};
use crate::engine::generation_config::GenerationDefaults;
use crate::engine::gguf::GgufFile;
use crate::engine::source::{ModelSource, CONFIG_FILE};
use crate::engine::tokenizer::TokenizerFiles;
use crate::engine::memory;
use crate::models;
use super::synthetic::{SyntheticModel, SYNTHETIC_FILE};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, Serialize)]
pub struct ModelSummary {
    pub path: String,
    /// `directory`, `single file` (`.sala`), `GGUF` or `synthetic (random weights …)`.
    pub layout: String,
    pub model_type: String,
    pub parameters: usize,
    pub layers: Option<u64>,
    pub hidden_size: Option<u64>,
    pub vocab_size: Option<u64>,
    pub context_length: Option<u64>,
    /// `none`, or each quantized format with how many matrices use it.
    pub quantization: String,
    /// Tensor count by dtype as the file stores them (a GGUF file's tensor types).
    pub dtypes: BTreeMap<String, usize>,
    /// GGUF files: each tensor type in the file, how many tensors have it and how it is held.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gguf_types: Vec<GgufTypeCount>,
    /// Tensors the file(s) store, skipped buffers included (a GGUF file's own count, not the
    /// tensors its quantized matrices become).
    pub tensors: usize,
    pub disk_bytes: u64,
    /// Files that are there: a directory's files, the side files a `.sala` file carries in its
    /// metadata, a GGUF file itself (its config and tokenizer are read from its metadata).
    pub files: Vec<String>,
    /// Where the config comes from: `config.json`, `config.json inside the .sala file`, or `GGUF metadata`.
    pub config_source: String,
    pub has_tokenizer: bool,
    pub has_chat_template: bool,
    /// Where the tokenizer comes from (`tokenizer.json`, GGUF metadata), if there is one.
    pub tokenizer_source: Option<String>,
    /// Where the chat template comes from (`chat_template.jinja`, `tokenizer_config.json`, GGUF
    /// metadata), if there is one.
    pub chat_template_source: Option<String>,
    /// Memory to run it: weights in the default dtype, plus one sequence's cache at `context`.
    pub memory: MemoryEstimate,
    /// Config keys the file leaves out, with the value the family's class gives them.
    pub config_defaults: Vec<DefaultedKey>,
    /// Tensors in the checkpoint that are non-persistent buffers, not weights (not loaded).
    pub skipped_buffers: Vec<String>,
    /// End-of-sequence tokens the config names.
    pub config_eos_token_ids: Vec<u32>,
    /// `generation_config.json`: sampling defaults and more end tokens (empty without the file).
    pub generation: GenerationDefaults,
    /// Every tensor as stored: name, dtype (or GGUF type) and shape (`show --tensors`).
    #[serde(skip)]
    pub stored: Vec<StoredTensor>,
}

#[derive(Debug, Clone, Serialize)]
pub struct StoredTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<i64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GgufTypeCount {
    /// llama.cpp's name (`Q4_K`).
    #[serde(rename = "type")]
    pub ggml_type: String,
    pub tensors: usize,
    /// Kept quantized (bits), loaded as stored, or expanded and why.
    pub stored: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemoryEstimate {
    /// The dtype float tensors are held in on `device` by default.
    pub dtype: String,
    /// `cpu` or `gpu`: the device a load picks by default.
    pub device: String,
    /// How the weights are held once loaded: quantized matrices by format, other tensors in `dtype`.
    pub held: String,
    pub weights_bytes: u64,
    pub context: usize,
    pub cache_bytes: u64,
}

impl MemoryEstimate {
    /// For weights of `weights_bytes` held as `held` in `dtype` on `device`, with a cache of
    /// `context` tokens for `cfg`.
    fn new(cfg: &ConfigFile, dtype: mlx_rs::Dtype, device: device::DeviceKind, held: &[String], weights_bytes: u64, context: usize) -> Result<Self> {
        Ok(Self {
            dtype: format!("{dtype:?}"),
            device: match device {
                device::DeviceKind::Cpu => "cpu",
                device::DeviceKind::Gpu => "gpu",
            }
            .into(),
            held: held.join(", "),
            weights_bytes,
            context,
            cache_bytes: models::cache_bytes(cfg, context, memory::dtype_bytes(dtype), None)?,
        })
    }
}

/// Describes the model at `path` (or store name); the memory estimate is for `context` tokens
/// (default: the model's context length, at most 4096).
pub fn summarize(path: &Path, context: Option<usize>) -> Result<(ModelSummary, ModelSource)> {
    if let Some(synthetic) = SyntheticModel::in_folder(path)? {
        return summarize_synthetic(&synthetic, context);
    }
    let mut source = super::cache::open(path)?;
    let path = &source.path.clone();
    let layout = if path.is_dir() {
        Layout::Directory
    } else if models::gguf::is_gguf(path) {
        Layout::Gguf
    } else {
        Layout::Packed
    };
    // What the file stores, before the model's check sets buffers aside (or, for GGUF, before
    // quantized blocks became packed codes, scales and biases).
    let gguf = match layout {
        Layout::Gguf => Some(GgufFile::open(path)?),
        _ => None,
    };
    let stored: Vec<StoredTensor> = match &gguf {
        Some(file) => file
            .tensors
            .iter()
            .map(|t| StoredTensor { name: t.name.clone(), dtype: t.kind.name(), shape: t.shape().iter().map(|&d| d as i64).collect() })
            .collect(),
        None => source
            .weights
            .infos()
            .iter()
            .map(|(n, i)| StoredTensor { name: n.clone(), dtype: i.dtype.clone(), shape: i.shape.iter().map(|&d| d as i64).collect() })
            .collect(),
    };
    let mut dtypes: BTreeMap<String, usize> = BTreeMap::new();
    for t in &stored {
        *dtypes.entry(t.dtype.clone()).or_default() += 1;
    }
    let cfg = source.config()?;
    models::check(&cfg, &mut source.weights)?;
    let weights = &source.weights;
    let mut formats: BTreeMap<(i32, i32), usize> = BTreeMap::new();
    for name in weights.infos().keys() {
        if let Some(f) = name.strip_suffix(".weight").and_then(|m| weights.quantized(m)) {
            *formats.entry((f.bits, f.group_size)).or_default() += 1;
        }
    }
    let quantization = quantization_label(&formats);
    let gguf_types = match &gguf {
        Some(file) => file
            .type_counts()
            .into_iter()
            .map(|(kind, tensors)| GgufTypeCount { ggml_type: kind.name(), tensors, stored: kind.storage().to_string() })
            .collect(),
        None => Vec::new(),
    };
    let disk_bytes = if path.is_dir() {
        crate::store::cache::dir_size(path)
    } else {
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
    };
    let file_name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().to_string());
    let files = match layout {
        Layout::Directory => files_in(path)?,
        Layout::Packed => source.files.keys().cloned().collect(),
        Layout::Gguf => vec![file_name.clone()],
    };
    // A side file as the user finds it: in the folder, or carried inside the .sala file.
    let side = |name: &str| match layout {
        Layout::Packed => format!("{name} inside {file_name}"),
        _ => name.to_string(),
    };
    let tokenizer = source.tokenizer_files()?;
    let has_chat_template = tokenizer.as_ref().and_then(template_file).is_some();
    let (config_source, tokenizer_source, chat_template_source) = match &gguf {
        Some(file) => (
            "GGUF metadata".to_string(),
            tokenizer.as_ref().map(|_| {
                let model = file.get("tokenizer.ggml.model").and_then(|v| v.as_str()).unwrap_or("?");
                format!("GGUF metadata (tokenizer.ggml.model `{model}`)")
            }),
            has_chat_template.then(|| "GGUF metadata (tokenizer.chat_template)".to_string()),
        ),
        None => (
            side(CONFIG_FILE),
            tokenizer.as_ref().map(|_| side(TokenizerFiles::TOKENIZER)),
            tokenizer.as_ref().and_then(template_file).map(side),
        ),
    };
    let completed = models::complete_config(&cfg)?;
    let key = |k: &str| config_number(&completed, k);
    let device = device::or_default(None);
    let context = estimate_context(&completed, context);
    let dtype = device::compute_dtype(None, device, weights.storage_dtype());
    let quantized_parts = |name: &str| {
        let module = name.rsplit_once('.').map_or(name, |(m, _)| m);
        weights.quantized(module).is_some()
    };
    let plain = weights.infos().keys().filter(|n| !quantized_parts(n)).count();
    let held = held_as(&formats, dtype, plain);
    let memory = MemoryEstimate::new(&cfg, dtype, device, &held, memory::weights_bytes(&source, dtype), context)?;
    let summary = ModelSummary {
        path: path.display().to_string(),
        layout: layout.label().into(),
        model_type: cfg.str("model_type")?.to_string(),
        parameters: weights.n_params(),
        layers: key("num_hidden_layers"),
        hidden_size: key("hidden_size"),
        vocab_size: key("vocab_size"),
        context_length: key("max_position_embeddings"),
        quantization,
        dtypes,
        gguf_types,
        tensors: stored.len(),
        disk_bytes,
        files,
        config_source,
        has_tokenizer: tokenizer.is_some(),
        has_chat_template,
        tokenizer_source,
        chat_template_source,
        memory,
        config_defaults: completed.defaulted.clone(),
        skipped_buffers: weights.skipped_buffers().to_vec(),
        config_eos_token_ids: config_eos(&completed)?,
        generation: source.generation_defaults()?,
        stored,
    };
    Ok((summary, source))
}

/// [`summarize`] for a synthetic model's folder: the model as it will be drawn (nothing is).
fn summarize_synthetic(synthetic: &SyntheticModel, context: Option<usize>) -> Result<(ModelSummary, ModelSource)> {
    let source = synthetic.described()?;
    let dir = &source.path;
    let completed = models::complete_config(&synthetic.cfg)?;
    let key = |k: &str| config_number(&completed, k);
    let context = estimate_context(&completed, context);
    let device = device::or_default(None);
    let dtype = device::compute_dtype(None, device, Some(mlx_rs::Dtype::Bfloat16));
    let formats = synthetic.formats();
    let quantization = quantization_label(&formats);
    let stored: Vec<StoredTensor> = synthetic
        .built_tensors(dtype)
        .into_iter()
        .map(|(name, dtype, shape)| StoredTensor { name, dtype: dtype.into(), shape: shape.iter().map(|&d| d as i64).collect() })
        .collect();
    let mut dtypes: BTreeMap<String, usize> = BTreeMap::new();
    for t in &stored {
        *dtypes.entry(t.dtype.clone()).or_default() += 1;
    }
    let plain = stored.len() - 3 * formats.values().sum::<usize>();
    let held = held_as(&formats, dtype, plain);
    let tokenizer = source.tokenizer_files()?;
    let has_chat_template = tokenizer.as_ref().and_then(template_file).is_some();
    let summary = ModelSummary {
        path: dir.display().to_string(),
        layout: format!("synthetic (random weights drawn when loaded, from {})", synthetic.origin),
        model_type: synthetic.cfg.str("model_type")?.to_string(),
        parameters: synthetic.n_params(),
        layers: key("num_hidden_layers"),
        hidden_size: key("hidden_size"),
        vocab_size: key("vocab_size"),
        context_length: key("max_position_embeddings"),
        quantization,
        dtypes,
        gguf_types: Vec::new(),
        tensors: stored.len(),
        disk_bytes: crate::store::cache::dir_size(dir),
        files: files_in(dir)?,
        config_source: SYNTHETIC_FILE.into(),
        has_tokenizer: tokenizer.is_some(),
        has_chat_template,
        tokenizer_source: tokenizer.as_ref().map(|_| TokenizerFiles::TOKENIZER.to_string()),
        chat_template_source: tokenizer.as_ref().and_then(template_file).map(str::to_string),
        memory: MemoryEstimate::new(&synthetic.cfg, dtype, device, &held, synthetic.weights_bytes(dtype), context)?,
        config_defaults: completed.defaulted.clone(),
        skipped_buffers: Vec::new(),
        config_eos_token_ids: config_eos(&completed)?,
        generation: source.generation_defaults()?,
        stored,
    };
    Ok((summary, source))
}

/// `none`, or each quantized format (bits, group size) with how many matrices use it.
fn quantization_label(formats: &BTreeMap<(i32, i32), usize>) -> String {
    if formats.is_empty() {
        return "none".to_string();
    }
    formats.iter().map(|((b, g), n)| format!("{b}-bit group {g} ×{n}")).collect::<Vec<_>>().join(", ")
}

/// How the weights are held once loaded: each quantized format, then the `plain` other tensors in
/// `dtype`.
fn held_as(formats: &BTreeMap<(i32, i32), usize>, dtype: mlx_rs::Dtype, plain: usize) -> Vec<String> {
    let mut held: Vec<String> = formats.iter().map(|((b, g), n)| format!("{b}-bit affine group {g} ×{n}")).collect();
    if plain > 0 {
        held.push(format!("{dtype:?} ×{plain}"));
    }
    held
}

/// The side file the chat template comes from, if the tokenizer has one.
fn template_file(tokenizer: &TokenizerFiles) -> Option<&'static str> {
    if tokenizer.chat_template.is_some() {
        Some(TokenizerFiles::TEMPLATE)
    } else {
        tokenizer.config.get("chat_template").map(|_| TokenizerFiles::CONFIG)
    }
}

/// A number the completed config gives.
fn config_number(completed: &ConfigFile, key: &str) -> Option<u64> {
    completed.opt(key).and_then(|v| v.as_u64())
}

/// The context a memory estimate is for: the one asked, else the model's up to 4096 tokens.
fn estimate_context(completed: &ConfigFile, asked: Option<usize>) -> usize {
    asked.unwrap_or_else(|| config_number(completed, "max_position_embeddings").map_or(4096, |m| m.min(4096) as usize))
}

/// The end-of-sequence ids the completed config names.
fn config_eos(completed: &ConfigFile) -> Result<Vec<u32>> {
    match completed.opt("eos_token_id") {
        Some(_) => completed.token_ids("eos_token_id"),
        None => Ok(Vec::new()),
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    Directory,
    /// A `.sala` file (safetensors carrying its side files).
    Packed,
    Gguf,
}

impl Layout {
    fn label(self) -> &'static str {
        match self {
            Layout::Directory => "directory",
            Layout::Packed => "single file",
            Layout::Gguf => "GGUF",
        }
    }
}

/// The regular files in `dir` (symlinks followed, as hub snapshots link into blobs/), sorted.
fn files_in(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.starts_with('.') && std::fs::metadata(entry.path()).is_ok_and(|m| m.is_file()) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}
