//! Qwen3: the Llama decoder with a per-head RMSNorm on q and k (over head_dim, before RoPE) and an
//! explicit `head_dim`; biases only if `attention_bias` says so.

use super::decoder::DecoderConfig;
use crate::engine::config::ConfigFile;
use crate::engine::error::Result;

pub const MODEL_TYPE: &str = "qwen3";

pub fn config(cfg: &ConfigFile) -> Result<DecoderConfig> {
    Ok(DecoderConfig { qk_norm: true, ..DecoderConfig::common(cfg)?.with_attention_bias(cfg)? })
}
