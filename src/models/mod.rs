//! Model families, one module each, and the loader that picks one from the config's `model_type`.

pub mod decoder;
pub mod gguf;
pub mod layers;
pub mod llama;
pub mod minicpm;
pub mod qwen2;
pub mod qwen3;
pub mod rope;
pub mod sala;

use crate::engine::cache::KvFormat;
use crate::engine::config::{size_product, ConfigFile, KeyDefault};
use crate::engine::distributed::TensorParallel;
use crate::engine::error::{Error, Result};
use crate::engine::model::LanguageModel;
use crate::engine::quant::QuantConfig;
use crate::engine::source::ModelSource;
use crate::engine::tokenizer::TextTokenizer;
use crate::engine::tools::ToolFormat;
use crate::engine::weights::{TensorSpec, Weights};
use crate::kernels::selfcheck::KernelCheck;
use decoder::{DecoderConfig, DecoderModel};
use mlx_rs::Dtype;
use std::path::Path;

/// Every custom kernel's self-check (`kernels::selfcheck`), for `sala doctor` and the GPU tests.
pub fn kernel_checks() -> Vec<&'static KernelCheck> {
    crate::kernels::KERNEL_CHECKS.iter().chain(&sala::infllm::KERNEL_CHECKS).copied().collect()
}

/// The batch sizes and prompt lengths a GPU server of up to `parallel` sequences a step meets
/// before its first request (engine::generate::warm_up), as its kernels specialise: every count
/// of sequences up to the most a kernel takes as inputs of its own (a form per count), the first
/// count of each class of rows the quantized products compile a form for, and the most; prompts
/// at both ends of the lengths MLX's quantized product runs, and the first the dequantized
/// weights do.
pub fn warm_shapes(parallel: usize) -> (Vec<usize>, Vec<usize>) {
    let mut batches: Vec<usize> = (1..=crate::kernels::custom::MAX_SHAPE_ARGS).collect();
    batches.extend(crate::kernels::qmv::product_row_classes().into_iter().map(|r| r as usize));
    batches.push(parallel);
    batches.retain(|&b| b <= parallel);
    batches.sort_unstable();
    batches.dedup();
    let mlx_rows = crate::kernels::qmv::MAX_MMA_ROWS as usize + 1;
    let dequantized = layers::GPU_DEQUANTIZE_ROWS as usize;
    (batches, vec![mlx_rows, dequantized - 1, dequantized])
}

/// Every `model_type` this build runs.
pub fn supported_model_types() -> Vec<&'static str> {
    let mut types = vec![sala::MODEL_TYPE, minicpm::MODEL_TYPE, qwen2::MODEL_TYPE, qwen3::MODEL_TYPE];
    types.extend(llama::MODEL_TYPES);
    types
}

/// What each config key of `model_type` is when a file leaves it out, following the family's
/// Hugging Face config class (`None` for types this build does not run).
pub fn config_defaults(model_type: &str) -> Option<&'static [KeyDefault]> {
    Some(match model_type {
        sala::MODEL_TYPE => sala::DEFAULTS,
        minicpm::MODEL_TYPE => minicpm::DEFAULTS,
        qwen2::MODEL_TYPE => qwen2::DEFAULTS,
        qwen3::MODEL_TYPE => qwen3::DEFAULTS,
        "mistral" => llama::MISTRAL_DEFAULTS,
        "llama" => llama::LLAMA_DEFAULTS,
        _ => return None,
    })
}

/// `cfg` with what it leaves out filled in as its family's class does (each key filled is in
/// `defaulted`); unchanged for a type this build does not run.
pub fn complete_config(cfg: &ConfigFile) -> Result<ConfigFile> {
    match config_defaults(cfg.str("model_type")?) {
        Some(table) => cfg.with_defaults(table),
        None => Ok(cfg.clone()),
    }
}

/// The syntax a model writes tool calls in: what its chat template shows, else its family's.
pub fn tool_format(model_type: &str, chat_template: &str) -> ToolFormat {
    ToolFormat::from_template(chat_template).unwrap_or(match model_type {
        sala::MODEL_TYPE | minicpm::MODEL_TYPE => ToolFormat::MiniCpmXml,
        "mistral" => ToolFormat::Mistral,
        _ => ToolFormat::Hermes,
    })
}

/// Finds the model at `path`: a directory, a `.sala`/`.safetensors` single file, or a `.gguf` file.
/// (Store names are resolved to a path by the loading path, `load::open`.)
pub fn open(path: &Path) -> Result<ModelSource> {
    if path.is_dir() {
        ModelSource::from_dir(path)
    } else if gguf::is_gguf(path) {
        gguf::import(path)
    } else {
        ModelSource::from_packed(path)
    }
}

/// The dense families' configs by `model_type` (`None` for other types), read after filling in
/// what the file leaves out.
pub fn decoder_config(cfg: &ConfigFile) -> Result<Option<DecoderConfig>> {
    let cfg = &complete_config(cfg)?;
    let model_type = cfg.str("model_type")?;
    Ok(Some(match model_type {
        t if llama::MODEL_TYPES.contains(&t) => llama::config(cfg)?,
        qwen2::MODEL_TYPE => qwen2::config(cfg)?,
        qwen3::MODEL_TYPE => qwen3::config(cfg)?,
        minicpm::MODEL_TYPE => minicpm::config(cfg)?,
        _ => return Ok(None),
    }))
}

/// Validates `weights` against the architecture `cfg` describes (every name, shape and quantized
/// format), without loading any data.
pub fn check(cfg: &ConfigFile, weights: &mut Weights) -> Result<()> {
    weights.set_quantization(QuantConfig::from_config(cfg)?);
    if let Some(mut config) = decoder_config(cfg)? {
        config.resolve_tie(weights);
        return weights.check(&config.tensor_specs()?, &config.model_type);
    }
    match cfg.str("model_type")? {
        sala::MODEL_TYPE => {
            let mut config = sala::SalaConfig::from_file(cfg)?;
            config.resolve_tie(weights);
            weights.check(&config.tensor_specs()?, sala::MODEL_TYPE)
        }
        other => Err(unsupported(cfg, other)),
    }
}

/// Every tensor of the architecture `cfg` describes, unquantized (a config silent about
/// `tie_word_embeddings` counts as untied).
pub fn tensor_specs(cfg: &ConfigFile) -> Result<Vec<TensorSpec>> {
    if let Some(config) = decoder_config(cfg)? {
        return config.tensor_specs();
    }
    match cfg.str("model_type")? {
        sala::MODEL_TYPE => sala::SalaConfig::from_file(cfg)?.tensor_specs(),
        other => Err(unsupported(cfg, other)),
    }
}

/// Bytes of one sequence's cache after `context` tokens, for the architecture `cfg` describes,
/// its keys and values quantized to `kv_bits` if given (`--kv-bits`).
pub fn cache_bytes(cfg: &ConfigFile, context: usize, dtype_bytes: usize, kv_bits: Option<i32>) -> Result<u64> {
    cache_bytes_per_rank(cfg, context, dtype_bytes, kv_bits, 1)
}

/// [`cache_bytes`] on each of `ranks` tensor-parallel ranks: heads are split between them, and
/// KV heads fewer than the ranks are held whole, one on each (`TensorParallel::kv_heads`).
pub fn cache_bytes_per_rank(cfg: &ConfigFile, context: usize, dtype_bytes: usize, kv_bits: Option<i32>, ranks: usize) -> Result<u64> {
    // Heads that cannot be quantized are refused when the model is built; counted plain here.
    let format = |head_dim: usize| kv_bits.and_then(|bits| KvFormat::quantized(bits, head_dim as i32).ok()).unwrap_or_default();
    if let Some(config) = decoder_config(cfg)? {
        return Ok(config.cache_bytes(context, dtype_bytes, format(config.head_dim), ranks));
    }
    match cfg.str("model_type")? {
        sala::MODEL_TYPE => {
            let config = sala::SalaConfig::from_file(cfg)?;
            Ok(config.cache_bytes(context, dtype_bytes, format(config.sparse.head_dim), ranks))
        }
        other => Err(unsupported(cfg, other)),
    }
}

/// One prompt step, for the memory it holds while it runs beyond the weights and the cache
/// ([`prompt_step_bytes`]).
#[derive(Clone, Copy, Debug)]
pub struct PromptStep {
    /// Tokens the step takes (at most `--prefill-step`).
    pub rows: usize,
    /// Tokens in the cache once it has run.
    pub context: usize,
    /// Bytes of an element in the compute dtype.
    pub dtype_bytes: usize,
    /// The GPU's fused attention and block-selection kernels run it; MLX's CPU ops instead hold
    /// every query head's scores.
    pub fused: bool,
    /// SALA's block selection runs on tensor cores (CUDA), which keep window maxima, not scores.
    pub tensor_cores: bool,
    /// Quantized weights: each prompt product multiplies by a dequantized copy of its matrix.
    pub quantized: bool,
    /// Tensor-parallel ranks the heads and the MLP are split over.
    pub ranks: usize,
}

impl PromptStep {
    /// What every family's layer holds: the residual stream with its norm and branch outputs,
    /// and the MLP's gate, up and their product.
    pub fn common_bytes(&self, hidden: usize, intermediate: usize) -> u64 {
        size_product(&[self.rows, 4 * hidden + 3 * intermediate.div_ceil(self.ranks.max(1)), self.dtype_bytes])
    }

    /// Layers whose dequantized copies (quantized weights) a prompt step's peak holds: two are in
    /// flight under pacing, yet MLX's CUDA peaks of identical runs differed by up to 1.4 GB and the
    /// highest reached four layers' worth (eval/results/2026-12-07-h100-issue60-table).
    pub const PEAK_DEQUANTIZED_LAYERS: u64 = 4;

    /// Layers whose dequantized copies are alive beside the block selection's chunks, which were no
    /// higher at the peak of a 1M-token SALA prompt (2 GB of chunks) than at 32K.
    pub const SELECTION_DEQUANTIZED_LAYERS: u64 = 2;

    /// The dequantized copies a prompt product multiplies by (quantized weights) of `layers` layers
    /// of `layer_weights` elements on one rank.
    pub fn dequantized_bytes(&self, layer_weights: u64, layers: u64) -> u64 {
        if self.quantized {
            layer_weights.saturating_mul(layers * self.dtype_bytes as u64)
        } else {
            0
        }
    }

    /// The scores `heads` query heads hold over the context, and the causal mask, where attention
    /// is not fused (MLX's CPU attention materialises them, one row a query).
    pub fn held_scores_bytes(&self, heads: usize) -> u64 {
        if self.fused {
            return 0;
        }
        size_product(&[heads + 1, self.rows, self.context, self.dtype_bytes])
    }

    /// `counted` with an eighth more for what the terms leave out (norm statistics, kernels'
    /// scratch, index arrays): within it of the peaks measured (eval/results/2026-12-07-prompt-memory).
    pub fn with_margin(counted: u64) -> u64 {
        counted.saturating_add(counted / 8)
    }
}

/// Bytes one prompt step holds on one rank beyond the weights and the cache, for the
/// architecture `cfg` describes: what a memory check must leave room for, or a long prompt that
/// fits by weights and cache runs out of memory midway.
pub fn prompt_step_bytes(cfg: &ConfigFile, step: &PromptStep) -> Result<u64> {
    if let Some(config) = decoder_config(cfg)? {
        return Ok(config.prompt_step_bytes(step));
    }
    match cfg.str("model_type")? {
        sala::MODEL_TYPE => Ok(sala::SalaConfig::from_file(cfg)?.prompt_step_bytes(step)),
        other => Err(unsupported(cfg, other)),
    }
}

/// Builds the model that `cfg` describes from `weights`, in `dtype` or the checkpoint's own; under
/// tensor parallelism, this rank's part of it.
pub fn build(cfg: &ConfigFile, weights: &mut Weights, dtype: Option<Dtype>, tp: &TensorParallel) -> Result<Box<dyn LanguageModel>> {
    weights.set_quantization(QuantConfig::from_config(cfg)?);
    if let Some(config) = decoder_config(cfg)? {
        return Ok(Box::new(DecoderModel::load(config, weights, dtype, tp)?));
    }
    match cfg.str("model_type")? {
        sala::MODEL_TYPE => Ok(Box::new(sala::SalaModel::load(cfg, weights, dtype, tp)?)),
        other => Err(unsupported(cfg, other)),
    }
}

fn unsupported(cfg: &ConfigFile, model_type: &str) -> Error {
    Error::UnsupportedModel {
        path: cfg.path.clone(),
        model_type: model_type.into(),
        supported: supported_model_types().join(", "),
    }
}

/// Loads the model at `path` (see [`open`]).
pub fn load(path: &Path, dtype: Option<Dtype>) -> Result<Box<dyn LanguageModel>> {
    Ok(load_with_tokenizer(path, dtype)?.0)
}

/// Loads the model at `path` and its tokenizer, if it has one.
pub fn load_with_tokenizer(path: &Path, dtype: Option<Dtype>) -> Result<(Box<dyn LanguageModel>, Option<TextTokenizer>)> {
    let mut source = open(path)?;
    let cfg = source.config()?;
    let mut model = build(&cfg, &mut source.weights, dtype, &TensorParallel::single())?;
    model.info_mut().add_eos_tokens(&source.generation_defaults()?.eos_token_ids);
    let tokenizer = source.tokenizer(model.info().bos_token_id)?;
    Ok((model, tokenizer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_warms_each_kernel_form_its_batches_reach() {
        let (batches, prompts) = warm_shapes(80);
        assert_eq!(batches, vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 33, 65, 80]);
        assert_eq!(prompts, vec![65, 255, 256]);
        // No batch larger than the server decodes.
        assert_eq!(warm_shapes(4).0, vec![1, 2, 3, 4]);
        assert_eq!(warm_shapes(20).0, vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 20]);
    }

    #[test]
    fn tool_format_follows_the_template_then_the_family() {
        assert_eq!(tool_format(sala::MODEL_TYPE, "{{ messages }}"), ToolFormat::MiniCpmXml);
        assert_eq!(tool_format(minicpm::MODEL_TYPE, "<|im_start|>"), ToolFormat::MiniCpmXml);
        assert_eq!(tool_format("mistral", ""), ToolFormat::Mistral);
        assert_eq!(tool_format("llama", "<|im_start|>"), ToolFormat::Hermes);
        assert_eq!(tool_format("llama", "{{ '<|python_tag|>' }}"), ToolFormat::Llama3Json);
        assert_eq!(tool_format("qwen2", "x <function name=\"f\"> y"), ToolFormat::MiniCpmXml);
    }
}
