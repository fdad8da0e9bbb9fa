//! The Llama family (Llama 2/3, Mistral, TinyLlama, SmolLM...): the plain decoder, optional
//! `attention_bias`, RoPE scaling as the config names it. Mistral adds sliding-window attention,
//! which runs here only when the window covers the whole context.

use super::decoder::{refuse_sliding_window, DecoderConfig};
use crate::engine::config::{ConfigFile, Fallback::*, KeyDefault};
use crate::engine::error::Result;

pub const MODEL_TYPES: &[&str] = &["llama", "mistral"];

const LLAMA: &str = "LlamaConfig (transformers 4.57, configuration_llama.py)";
const MISTRAL: &str = "MistralConfig (transformers 4.57, configuration_mistral.py)";

/// What `LlamaConfig` gives a key the file leaves out.
pub const LLAMA_DEFAULTS: &[KeyDefault] = &[
    KeyDefault { key: "vocab_size", fallback: Json("32000"), source: LLAMA },
    KeyDefault { key: "hidden_size", fallback: Json("4096"), source: LLAMA },
    KeyDefault { key: "intermediate_size", fallback: Json("11008"), source: LLAMA },
    KeyDefault { key: "num_hidden_layers", fallback: Json("32"), source: LLAMA },
    KeyDefault { key: "num_attention_heads", fallback: Json("32"), source: LLAMA },
    KeyDefault { key: "num_key_value_heads", fallback: SameAs("num_attention_heads"), source: LLAMA },
    KeyDefault { key: "head_dim", fallback: Computed("hidden_size / num_attention_heads"), source: LLAMA },
    KeyDefault { key: "hidden_act", fallback: Json("\"silu\""), source: LLAMA },
    KeyDefault { key: "max_position_embeddings", fallback: Json("2048"), source: LLAMA },
    KeyDefault { key: "rms_norm_eps", fallback: Json("1e-06"), source: LLAMA },
    KeyDefault { key: "bos_token_id", fallback: Json("1"), source: LLAMA },
    KeyDefault { key: "eos_token_id", fallback: Json("2"), source: LLAMA },
    KeyDefault { key: "tie_word_embeddings", fallback: Computed(super::decoder::TIE_FALSE), source: LLAMA },
    KeyDefault { key: "rope_theta", fallback: Computed(super::rope::THETA_DEFAULT), source: LLAMA },
    KeyDefault { key: "rope_scaling", fallback: Off, source: LLAMA },
    KeyDefault { key: "attention_bias", fallback: Json("false"), source: LLAMA },
    KeyDefault { key: "mlp_bias", fallback: Json("false"), source: LLAMA },
];

/// What `MistralConfig` gives a key the file leaves out.
pub const MISTRAL_DEFAULTS: &[KeyDefault] = &[
    KeyDefault { key: "vocab_size", fallback: Json("32000"), source: MISTRAL },
    KeyDefault { key: "hidden_size", fallback: Json("4096"), source: MISTRAL },
    KeyDefault { key: "intermediate_size", fallback: Json("14336"), source: MISTRAL },
    KeyDefault { key: "num_hidden_layers", fallback: Json("32"), source: MISTRAL },
    KeyDefault { key: "num_attention_heads", fallback: Json("32"), source: MISTRAL },
    // Only an explicit null means "as many as the query heads".
    KeyDefault { key: "num_key_value_heads", fallback: Json("8"), source: MISTRAL },
    KeyDefault { key: "head_dim", fallback: Computed("hidden_size / num_attention_heads"), source: MISTRAL },
    KeyDefault { key: "hidden_act", fallback: Json("\"silu\""), source: MISTRAL },
    KeyDefault { key: "max_position_embeddings", fallback: Json("131072"), source: MISTRAL },
    KeyDefault { key: "rms_norm_eps", fallback: Json("1e-06"), source: MISTRAL },
    KeyDefault { key: "bos_token_id", fallback: Json("1"), source: MISTRAL },
    KeyDefault { key: "eos_token_id", fallback: Json("2"), source: MISTRAL },
    KeyDefault { key: "tie_word_embeddings", fallback: Computed(super::decoder::TIE_FALSE), source: MISTRAL },
    KeyDefault { key: "rope_theta", fallback: Computed(super::rope::THETA_DEFAULT), source: MISTRAL },
    KeyDefault { key: "rope_scaling", fallback: Off, source: MISTRAL },
    // An explicit null turns the window off (Mistral 7B v0.2 and later write that).
    KeyDefault { key: "sliding_window", fallback: Json("4096"), source: MISTRAL },
    KeyDefault { key: "attention_bias", fallback: Json("false"), source: "not in MistralConfig: its attention has no biases" },
    KeyDefault { key: "mlp_bias", fallback: Json("false"), source: "not in MistralConfig: its MLP has no biases" },
];

/// Reads `cfg`, its defaults filled in (`super::complete_config`).
pub fn config(cfg: &ConfigFile) -> Result<DecoderConfig> {
    if cfg.str("model_type")? == "mistral" {
        refuse_sliding_window(cfg)?;
    }
    DecoderConfig::common(cfg)?.with_attention_bias(cfg)
}
