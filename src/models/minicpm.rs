//! Dense MiniCPM (MiniCPM 1/2/4): the Llama decoder with muP scalings —
//! embeddings × scale_emb, each residual branch × scale_depth/√L, and the final hidden state ÷
//! (hidden_size/dim_model_base) before the output projection (tied or not, as in the reference
//! modeling code). Longrope picks its factors once, from max_position_embeddings.

use super::decoder::DecoderConfig;
use crate::engine::config::ConfigFile;
use crate::engine::error::Result;

pub const MODEL_TYPE: &str = "minicpm";

pub fn config(cfg: &ConfigFile) -> Result<DecoderConfig> {
    let mut c = DecoderConfig::common(cfg)?;
    c.embedding_scale = cfg.f64("scale_emb")? as f32;
    c.residual_scale = cfg.f64("scale_depth")? as f32 / (c.num_layers as f32).sqrt();
    c.logit_scale = cfg.f64("dim_model_base")? as f32 / c.hidden_size as f32;
    c.rope.fix_longrope_choice(c.max_position_embeddings);
    Ok(c)
}
