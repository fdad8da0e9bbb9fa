//! The Llama family (Llama 2/3, Mistral, TinyLlama, SmolLM...): the plain decoder, optional
//! `attention_bias`, RoPE scaling as the config names it.

use super::decoder::DecoderConfig;
use crate::engine::config::ConfigFile;
use crate::engine::error::Result;

pub const MODEL_TYPES: &[&str] = &["llama", "mistral"];

pub fn config(cfg: &ConfigFile) -> Result<DecoderConfig> {
    DecoderConfig::common(cfg)?.with_attention_bias(cfg)
}
