//! Dense MiniCPM (MiniCPM 1/2/4): the Llama decoder with muP scalings —
//! embeddings × scale_emb, each residual branch × scale_depth/√L, and the final hidden state ÷
//! (hidden_size/dim_model_base) before the output projection (tied or not, as in the reference
//! modeling code). Longrope picks its factors once, from max_position_embeddings.

use super::decoder::DecoderConfig;
use crate::engine::config::{ConfigFile, Fallback::*, KeyDefault};
use crate::engine::error::Result;

pub const MODEL_TYPE: &str = "minicpm";

const MINICPM: &str = "MiniCPMConfig (OpenBMB's remote code, configuration_minicpm.py)";

/// What MiniCPM's remote-code `MiniCPMConfig` gives a key the file leaves out.
pub const DEFAULTS: &[KeyDefault] = &[
    KeyDefault { key: "vocab_size", fallback: Json("32000"), source: MINICPM },
    KeyDefault { key: "hidden_size", fallback: Json("4096"), source: MINICPM },
    KeyDefault { key: "intermediate_size", fallback: Json("11008"), source: MINICPM },
    KeyDefault { key: "num_hidden_layers", fallback: Json("32"), source: MINICPM },
    KeyDefault { key: "num_attention_heads", fallback: Json("32"), source: MINICPM },
    KeyDefault { key: "num_key_value_heads", fallback: SameAs("num_attention_heads"), source: MINICPM },
    KeyDefault { key: "head_dim", fallback: Computed("hidden_size / num_attention_heads"), source: MINICPM },
    KeyDefault { key: "hidden_act", fallback: Json("\"silu\""), source: MINICPM },
    KeyDefault { key: "max_position_embeddings", fallback: Json("2048"), source: MINICPM },
    KeyDefault { key: "rms_norm_eps", fallback: Json("1e-06"), source: MINICPM },
    KeyDefault { key: "bos_token_id", fallback: Json("1"), source: MINICPM },
    KeyDefault { key: "eos_token_id", fallback: Json("2"), source: MINICPM },
    KeyDefault { key: "tie_word_embeddings", fallback: Computed(super::decoder::TIE_TRUE), source: MINICPM },
    KeyDefault { key: "rope_theta", fallback: Computed(super::rope::THETA_DEFAULT), source: MINICPM },
    KeyDefault { key: "rope_scaling", fallback: Off, source: MINICPM },
    KeyDefault { key: "attention_bias", fallback: Json("false"), source: MINICPM },
    KeyDefault { key: "scale_emb", fallback: Json("1"), source: MINICPM },
    KeyDefault { key: "dim_model_base", fallback: Json("1"), source: MINICPM },
    KeyDefault { key: "scale_depth", fallback: Json("1"), source: MINICPM },
];

/// Reads `cfg`, its defaults filled in (`super::complete_config`).
pub fn config(cfg: &ConfigFile) -> Result<DecoderConfig> {
    let mut c = DecoderConfig::common(cfg)?.with_attention_bias(cfg)?;
    c.embedding_scale = cfg.f64("scale_emb")? as f32;
    c.residual_scale = cfg.f64("scale_depth")? as f32 / (c.num_layers as f32).sqrt();
    c.logit_scale = cfg.f64("dim_model_base")? as f32 / c.hidden_size as f32;
    c.rope.fix_longrope_choice(c.max_position_embeddings);
    Ok(c)
}
