//! Qwen2 / Qwen2.5: the Llama decoder with biases on the q, k and v projections (not on o_proj).

use super::decoder::{refuse_sliding_window, DecoderConfig};
use crate::engine::config::{ConfigFile, Fallback::*, KeyDefault};
use crate::engine::error::Result;

pub const MODEL_TYPE: &str = "qwen2";

const QWEN2: &str = "Qwen2Config (transformers 4.57, configuration_qwen2.py)";

/// What `Qwen2Config` gives a key the file leaves out.
pub const DEFAULTS: &[KeyDefault] = &[
    KeyDefault { key: "vocab_size", fallback: Json("151936"), source: QWEN2 },
    KeyDefault { key: "hidden_size", fallback: Json("4096"), source: QWEN2 },
    KeyDefault { key: "intermediate_size", fallback: Json("22016"), source: QWEN2 },
    KeyDefault { key: "num_hidden_layers", fallback: Json("32"), source: QWEN2 },
    KeyDefault { key: "num_attention_heads", fallback: Json("32"), source: QWEN2 },
    KeyDefault { key: "num_key_value_heads", fallback: Json("32"), source: QWEN2 },
    KeyDefault { key: "head_dim", fallback: Computed("hidden_size / num_attention_heads"), source: QWEN2 },
    KeyDefault { key: "hidden_act", fallback: Json("\"silu\""), source: QWEN2 },
    KeyDefault { key: "max_position_embeddings", fallback: Json("32768"), source: QWEN2 },
    KeyDefault { key: "rms_norm_eps", fallback: Json("1e-06"), source: QWEN2 },
    KeyDefault { key: "bos_token_id", fallback: Off, source: QWEN2 },
    KeyDefault { key: "eos_token_id", fallback: Off, source: QWEN2 },
    KeyDefault { key: "tie_word_embeddings", fallback: Computed(super::decoder::TIE_FALSE), source: QWEN2 },
    KeyDefault { key: "rope_theta", fallback: Computed(super::rope::THETA_DEFAULT), source: QWEN2 },
    KeyDefault { key: "rope_scaling", fallback: Off, source: QWEN2 },
    KeyDefault { key: "use_sliding_window", fallback: Json("false"), source: QWEN2 },
    KeyDefault { key: "sliding_window", fallback: Json("4096"), source: QWEN2 },
];

/// Reads `cfg`, its defaults filled in (`super::complete_config`).
pub fn config(cfg: &ConfigFile) -> Result<DecoderConfig> {
    refuse_sliding_window(cfg)?;
    Ok(DecoderConfig { qkv_bias: true, ..DecoderConfig::common(cfg)? })
}
