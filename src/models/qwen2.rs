//! Qwen2 / Qwen2.5: the Llama decoder with biases on the q, k and v projections (not on o_proj).

use super::decoder::DecoderConfig;
use crate::engine::config::ConfigFile;
use crate::engine::error::Result;

pub const MODEL_TYPE: &str = "qwen2";

pub fn config(cfg: &ConfigFile) -> Result<DecoderConfig> {
    Ok(DecoderConfig { qkv_bias: true, ..DecoderConfig::common(cfg)? })
}
