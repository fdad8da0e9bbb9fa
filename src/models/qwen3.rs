//! Qwen3: the Llama decoder with a per-head RMSNorm on q and k (over head_dim, before RoPE) and an
//! explicit `head_dim`; biases only if `attention_bias` says so.

use super::decoder::{refuse_sliding_window, DecoderConfig};
use crate::engine::config::{ConfigFile, Fallback::*, KeyDefault};
use crate::engine::error::Result;

pub const MODEL_TYPE: &str = "qwen3";

const QWEN3: &str = "Qwen3Config (transformers 4.57, configuration_qwen3.py)";

/// What `Qwen3Config` gives a key the file leaves out.
pub const DEFAULTS: &[KeyDefault] = &[
    KeyDefault { key: "vocab_size", fallback: Json("151936"), source: QWEN3 },
    KeyDefault { key: "hidden_size", fallback: Json("4096"), source: QWEN3 },
    KeyDefault { key: "intermediate_size", fallback: Json("22016"), source: QWEN3 },
    KeyDefault { key: "num_hidden_layers", fallback: Json("32"), source: QWEN3 },
    KeyDefault { key: "num_attention_heads", fallback: Json("32"), source: QWEN3 },
    KeyDefault { key: "num_key_value_heads", fallback: Json("32"), source: QWEN3 },
    // Not hidden_size / num_attention_heads: Qwen3's heads are 128 wide whatever the width.
    KeyDefault { key: "head_dim", fallback: Json("128"), source: QWEN3 },
    KeyDefault { key: "hidden_act", fallback: Json("\"silu\""), source: QWEN3 },
    KeyDefault { key: "max_position_embeddings", fallback: Json("32768"), source: QWEN3 },
    KeyDefault { key: "rms_norm_eps", fallback: Json("1e-06"), source: QWEN3 },
    KeyDefault { key: "bos_token_id", fallback: Off, source: QWEN3 },
    KeyDefault { key: "eos_token_id", fallback: Off, source: QWEN3 },
    KeyDefault { key: "tie_word_embeddings", fallback: Computed(super::decoder::TIE_FALSE), source: QWEN3 },
    KeyDefault { key: "rope_theta", fallback: Computed(super::rope::THETA_DEFAULT), source: QWEN3 },
    KeyDefault { key: "rope_scaling", fallback: Off, source: QWEN3 },
    KeyDefault { key: "attention_bias", fallback: Json("false"), source: QWEN3 },
    KeyDefault { key: "use_sliding_window", fallback: Json("false"), source: QWEN3 },
    KeyDefault { key: "sliding_window", fallback: Json("4096"), source: QWEN3 },
];

/// Reads `cfg`, its defaults filled in (`super::complete_config`).
pub fn config(cfg: &ConfigFile) -> Result<DecoderConfig> {
    refuse_sliding_window(cfg)?;
    Ok(DecoderConfig { qk_norm: true, ..DecoderConfig::common(cfg)?.with_attention_bias(cfg)? })
}
