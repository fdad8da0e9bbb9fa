//! What a model on disk is: architecture, size, quantization, files — for `sala show`.

use crate::engine::config::DefaultedKey;
use crate::engine::error::Result;
use crate::engine::generation_config::GenerationDefaults;
use crate::engine::gguf::GgufFile;
use crate::engine::source::ModelSource;
use crate::engine::memory;
use crate::models;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone, Serialize)]
pub struct ModelSummary {
    pub path: String,
    /// `directory`, `single file` or `GGUF`.
    pub layout: String,
    pub model_type: String,
    pub parameters: usize,
    pub layers: Option<u64>,
    pub hidden_size: Option<u64>,
    pub vocab_size: Option<u64>,
    pub context_length: Option<u64>,
    /// `none`, or each quantized format with how many matrices use it.
    pub quantization: String,
    /// Tensor count by stored dtype.
    pub dtypes: BTreeMap<String, usize>,
    /// GGUF files: each tensor type in the file, how many tensors have it and how it is held.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gguf_types: Vec<GgufTypeCount>,
    pub tensors: usize,
    pub disk_bytes: u64,
    pub files: Vec<String>,
    pub has_tokenizer: bool,
    pub has_chat_template: bool,
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
    pub dtype: String,
    pub weights_bytes: u64,
    pub context: usize,
    pub cache_bytes: u64,
}

/// Describes the model at `path` (or store name); the memory estimate is for `context` tokens
/// (default: the model's context length, at most 4096).
pub fn summarize(path: &Path, context: Option<usize>) -> Result<(ModelSummary, ModelSource)> {
    let mut source = super::cache::open(path)?;
    let path = &source.path.clone();
    let cfg = source.config()?;
    models::check(&cfg, &mut source.weights)?;
    let weights = &source.weights;
    let mut formats: BTreeMap<(i32, i32), usize> = BTreeMap::new();
    let mut dtypes: BTreeMap<String, usize> = BTreeMap::new();
    for (name, info) in weights.infos() {
        *dtypes.entry(info.dtype.clone()).or_default() += 1;
        if let Some(f) = name.strip_suffix(".weight").and_then(|m| weights.quantized(m)) {
            *formats.entry((f.bits, f.group_size)).or_default() += 1;
        }
    }
    let quantization = if formats.is_empty() {
        "none".to_string()
    } else {
        formats.iter().map(|((b, g), n)| format!("{b}-bit group {g} ×{n}")).collect::<Vec<_>>().join(", ")
    };
    let layout = if path.is_dir() {
        "directory"
    } else if models::gguf::is_gguf(path) {
        "GGUF"
    } else {
        "single file"
    };
    let gguf_types = if layout == "GGUF" {
        GgufFile::open(path)?
            .type_counts()
            .into_iter()
            .map(|(kind, tensors)| GgufTypeCount { ggml_type: kind.name(), tensors, stored: kind.storage().to_string() })
            .collect()
    } else {
        Vec::new()
    };
    let disk_bytes = if path.is_dir() {
        crate::store::cache::dir_size(path)
    } else {
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
    };
    let tokenizer = source.tokenizer_files()?;
    let has_chat_template = tokenizer.as_ref().is_some_and(|t| t.chat_template.is_some() || t.config.get("chat_template").is_some());
    let completed = models::complete_config(&cfg)?;
    let key = |k: &str| completed.opt(k).and_then(|v| v.as_u64());
    let dtype = weights.storage_dtype().unwrap_or(mlx_rs::Dtype::Bfloat16);
    let context = context.unwrap_or_else(|| key("max_position_embeddings").map_or(4096, |m| m.min(4096) as usize));
    let memory = MemoryEstimate {
        dtype: format!("{dtype:?}"),
        weights_bytes: memory::weights_bytes(&source, dtype),
        context,
        cache_bytes: models::cache_bytes(&cfg, context, memory::dtype_bytes(dtype), None)?,
    };
    let summary = ModelSummary {
        path: path.display().to_string(),
        layout: layout.into(),
        model_type: cfg.str("model_type")?.to_string(),
        parameters: weights.n_params(),
        layers: key("num_hidden_layers"),
        hidden_size: key("hidden_size"),
        vocab_size: key("vocab_size"),
        context_length: key("max_position_embeddings"),
        quantization,
        dtypes,
        gguf_types,
        tensors: weights.infos().len(),
        disk_bytes,
        files: source.files.keys().cloned().collect(),
        has_tokenizer: tokenizer.is_some(),
        has_chat_template,
        memory,
        config_defaults: completed.defaulted.clone(),
        skipped_buffers: weights.skipped_buffers().to_vec(),
        config_eos_token_ids: match completed.opt("eos_token_id") {
            Some(_) => completed.token_ids("eos_token_id")?,
            None => Vec::new(),
        },
        generation: source.generation_defaults()?,
    };
    Ok((summary, source))
}
