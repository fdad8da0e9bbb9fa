//! MiniCPM-SALA: a pre-norm decoder whose layers mix InfLLM-V2 sparse softmax attention
//! ([`sparse`], "minicpm4") with Simple-GLA linear attention ([`lightning`], "lightning-attn"),
//! using MiniCPM's muP scalings (docs/sala-model.md, Layer order and Forward pass).
//!
//!   h = Embed[ids] · scale_emb
//!   per layer:  h += α · Mixer(RMSNorm(h));  h += α · MLP(RMSNorm(h))      α = scale_depth/√L
//!   (each branch's last projection adds itself into h: Linear::forward_residual)
//!   logits = (RMSNorm(h) / (hidden/dim_model_base)) · W_lmᵀ

pub mod infllm;
pub mod lightning;
pub mod sparse;

use crate::engine::cache::{layer_caches, layer_outputs, KvCache, KvFormat, LayerCache, ModelCache, RecurrentState};
use crate::engine::config::{size_product, ConfigFile, Fallback::*, KeyDefault};
use crate::engine::distributed::TensorParallel;
use crate::engine::error::{Error, Result};
use crate::engine::ops::Pacer;
use crate::engine::model::{check_batch, LanguageModel, Logits, ModelInfo, Trace};
use crate::engine::weights::{TensorSpec, Weights};
use crate::models::layers::{scale, Embedding, Input, LmHead, MixerOutput, Mlp, RmsNorm};
use crate::models::PromptStep;
use lightning::{LightningAttention, LightningConfig, Positions};
use mlx_rs::{Array, Dtype};
use sparse::{SparseAttention, SparseConfig};

pub const MODEL_TYPE: &str = "minicpm_sala";

/// vLLM's Hugging Face-compatible `MiniCPMSALAConfig`, which follows OpenBMB's remote-code one.
const CLASS: &str = "MiniCPMSALAConfig (vllm-project/vllm vllm/transformers_utils/configs/minicpm_sala.py @2278730)";
/// The reference modeling code reads `sparse_config` with `.get(key, default)`; the class keeps it `{}` when absent.
const SPARSE: &str = "modeling_minicpm_sala.py, MiniCPMInfLLMv2Attention (sparse_config.get)";
/// The reference sizes its lightning layers from these keys, whatever the lightning_* ones say.
const LIGHTNING: &str = "modeling_minicpm_sala.py builds the lightning layers from num_attention_heads and head_dim";

/// What MiniCPM-SALA's config class (and, inside `sparse_config`, its modeling code) gives a key
/// the file leaves out.
pub const DEFAULTS: &[KeyDefault] = &[
    KeyDefault { key: "mixer_types", fallback: Required, source: "MiniCPMSALAConfig raises without it" },
    KeyDefault { key: "vocab_size", fallback: Json("73448"), source: CLASS },
    KeyDefault { key: "hidden_size", fallback: Json("4096"), source: CLASS },
    KeyDefault { key: "intermediate_size", fallback: Json("16384"), source: CLASS },
    KeyDefault { key: "num_hidden_layers", fallback: Json("32"), source: CLASS },
    KeyDefault { key: "num_attention_heads", fallback: Json("32"), source: CLASS },
    KeyDefault { key: "num_key_value_heads", fallback: SameAs("num_attention_heads"), source: CLASS },
    KeyDefault { key: "head_dim", fallback: Json("128"), source: CLASS },
    KeyDefault { key: "hidden_act", fallback: Json("\"silu\""), source: CLASS },
    KeyDefault { key: "max_position_embeddings", fallback: Json("524288"), source: CLASS },
    KeyDefault { key: "rms_norm_eps", fallback: Json("1e-06"), source: CLASS },
    KeyDefault { key: "rope_theta", fallback: Computed(crate::models::rope::THETA_DEFAULT), source: CLASS },
    KeyDefault { key: "rope_scaling", fallback: Off, source: CLASS },
    KeyDefault { key: "attention_bias", fallback: Json("false"), source: CLASS },
    KeyDefault { key: "scale_emb", fallback: Json("12.0"), source: CLASS },
    KeyDefault { key: "dim_model_base", fallback: Json("256"), source: CLASS },
    KeyDefault { key: "scale_depth", fallback: Json("1.4"), source: CLASS },
    KeyDefault { key: "bos_token_id", fallback: Json("1"), source: CLASS },
    KeyDefault { key: "eos_token_id", fallback: Json("[2, 73440]"), source: CLASS },
    KeyDefault { key: "tie_word_embeddings", fallback: Computed(crate::models::decoder::TIE_FALSE), source: CLASS },
    KeyDefault { key: "attn_use_rope", fallback: Json("false"), source: CLASS },
    KeyDefault { key: "attn_use_output_gate", fallback: Json("true"), source: CLASS },
    KeyDefault { key: "lightning_use_rope", fallback: Json("true"), source: CLASS },
    KeyDefault { key: "qk_norm", fallback: Json("true"), source: CLASS },
    KeyDefault { key: "use_output_norm", fallback: Json("true"), source: CLASS },
    KeyDefault { key: "use_output_gate", fallback: Json("true"), source: CLASS },
    KeyDefault { key: "lightning_scale", fallback: Json("\"1/sqrt(d)\""), source: CLASS },
    KeyDefault { key: "lightning_nh", fallback: SameAs("num_attention_heads"), source: LIGHTNING },
    // vLLM's class falls back to num_key_value_heads here, which the reference never reads.
    KeyDefault { key: "lightning_nkv", fallback: SameAs("num_attention_heads"), source: LIGHTNING },
    KeyDefault { key: "lightning_head_dim", fallback: SameAs("head_dim"), source: LIGHTNING },
    KeyDefault { key: "sparse_config.kernel_size", fallback: Json("32"), source: SPARSE },
    KeyDefault { key: "sparse_config.kernel_stride", fallback: Json("16"), source: SPARSE },
    KeyDefault { key: "sparse_config.init_blocks", fallback: Json("1"), source: SPARSE },
    KeyDefault { key: "sparse_config.block_size", fallback: Json("64"), source: SPARSE },
    KeyDefault { key: "sparse_config.window_size", fallback: Json("2048"), source: SPARSE },
    KeyDefault { key: "sparse_config.topk", fallback: Json("64"), source: SPARSE },
    KeyDefault { key: "sparse_config.dense_len", fallback: Json("8192"), source: SPARSE },
    KeyDefault { key: "sparse_config.use_nope", fallback: Json("false"), source: SPARSE },
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mixer {
    /// "minicpm4": NoPE GQA softmax attention, dense below `dense_len`, InfLLM-V2 above.
    Sparse,
    /// "lightning-attn": Simple GLA with RoPE, QK-norm, output norm and gate.
    Lightning,
}

#[derive(Debug, Clone)]
pub struct SalaConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// The config does not say; the checkpoint decides (no `lm_head.weight` = tied).
    pub tie_unspecified: bool,
    pub scale_emb: f32,
    pub scale_depth: f32,
    pub dim_model_base: f32,
    pub bos_token_id: u32,
    pub eos_token_ids: Vec<u32>,
    pub mixers: Vec<Mixer>,
    pub sparse: SparseConfig,
    pub lightning: LightningConfig,
}

impl SalaConfig {
    /// Reads the config after filling in what it leaves out ([`DEFAULTS`]).
    pub fn from_file(cfg: &ConfigFile) -> Result<Self> {
        let model_type = cfg.str("model_type")?;
        if model_type != MODEL_TYPE {
            return Err(Error::UnsupportedModel {
                path: cfg.path.clone(),
                model_type: model_type.into(),
                supported: MODEL_TYPE.into(),
            });
        }
        let cfg = &super::complete_config(cfg)?;
        let num_layers = cfg.layers("num_hidden_layers")?;
        let mixers = cfg
            .root()
            .strings("mixer_types")?
            .iter()
            .enumerate()
            .map(|(i, m)| match *m {
                "minicpm4" => Ok(Mixer::Sparse),
                "lightning" | "lightning_attn" | "lightning-attn" => Ok(Mixer::Lightning),
                other => Err(cfg.invalid(
                    &format!("mixer_types[{i}]"),
                    format!("unknown mixer type `{other}` (expected `minicpm4` or `lightning-attn`)"),
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        if mixers.len() != num_layers {
            return Err(cfg.invalid(
                "mixer_types",
                format!("has {} entries but num_hidden_layers is {num_layers}", mixers.len()),
            ));
        }
        if mixers[0] != Mixer::Sparse {
            return Err(cfg.invalid("mixer_types[0]", "layer 0 must be `minicpm4` (as in the reference)"));
        }
        if cfg.opt("rope_scaling").is_some() {
            return Err(cfg.invalid("rope_scaling", "must be null: MiniCPM-SALA uses plain RoPE"));
        }
        if cfg.opt("rope_parameters").and_then(|p| p.get("rope_type")).is_some_and(|t| t.as_str() != Some("default")) {
            return Err(cfg.invalid("rope_parameters.rope_type", "must be `default`: MiniCPM-SALA uses plain RoPE"));
        }
        if cfg.bool("attention_bias")? {
            return Err(cfg.invalid("attention_bias", "must be false: MiniCPM-SALA's projections have no biases"));
        }
        if cfg.str("hidden_act")? != "silu" {
            return Err(cfg.invalid("hidden_act", "only `silu` (SwiGLU) is supported"));
        }
        let hidden_size = cfg.dim("hidden_size")?;
        let config = Self {
            hidden_size,
            intermediate_size: cfg.dim("intermediate_size")?,
            num_layers,
            vocab_size: cfg.dim("vocab_size")?,
            rms_norm_eps: cfg.f64("rms_norm_eps")? as f32,
            max_position_embeddings: cfg.dim("max_position_embeddings")?,
            tie_word_embeddings: match cfg.opt("tie_word_embeddings") {
                Some(_) => cfg.bool("tie_word_embeddings")?,
                None => false,
            },
            tie_unspecified: cfg.opt("tie_word_embeddings").is_none(),
            scale_emb: cfg.f64("scale_emb")? as f32,
            scale_depth: cfg.f64("scale_depth")? as f32,
            dim_model_base: cfg.f64("dim_model_base")? as f32,
            bos_token_id: cfg.usize("bos_token_id")? as u32,
            eos_token_ids: cfg.token_ids("eos_token_id")?,
            mixers,
            sparse: SparseConfig::from_file(cfg)?,
            lightning: LightningConfig::from_file(cfg)?,
        };
        Ok(config)
    }

    /// A config silent about `tie_word_embeddings` is tied when the checkpoint has no `lm_head`.
    pub fn resolve_tie(&mut self, weights: &Weights) {
        if self.tie_unspecified {
            self.tie_word_embeddings = !weights.infos().contains_key("lm_head.weight");
        }
    }

    /// α = scale_depth / √num_layers.
    pub fn residual_scale(&self) -> f32 {
        self.scale_depth / (self.num_layers as f32).sqrt()
    }

    /// Bytes of the per-sequence state after `context` tokens on each of `ranks` tensor-parallel
    /// ranks: keys and values (stored in `format`) and both levels of pooled keys (in the compute
    /// dtype) of the sparse layers (a KV head per rank at least), plus the fixed float32 state of
    /// the lightning layers.
    pub fn cache_bytes(&self, context: usize, dtype_bytes: usize, format: KvFormat, ranks: usize) -> u64 {
        let ranks = ranks.max(1);
        let s = &self.sparse;
        let sel = &s.selection;
        let pooled = size_product(&[(context / sel.stride).saturating_add(context / sel.stride2), s.head_dim, dtype_bytes]);
        let rows = size_product(&[2, context]).saturating_mul(format.row_bytes(s.head_dim, dtype_bytes)).saturating_add(pooled);
        let sparse = rows.saturating_mul(s.kv_heads.div_ceil(ranks) as u64);
        let l = &self.lightning;
        let lightning = size_product(&[l.heads.div_ceil(ranks), l.head_dim, l.head_dim, 4]);
        self.mixers
            .iter()
            .map(|m| match m {
                Mixer::Sparse => sparse,
                Mixer::Lightning => lightning,
            })
            .fold(0u64, u64::saturating_add)
    }

    /// Bytes one prompt step holds beyond the weights and the cache (see [`PromptStep`]): the
    /// common terms, the larger of the two kinds of layer, and the dequantized copies or, past
    /// `dense_len`, two chunks of the block selection beside fewer copies, whichever is larger.
    /// A sparse layer holds its projections and, below `dense_len`, dense attention's scores where
    /// it is not fused; past it, on MLX's ops, two pieces of gathered keys and values. A lightning
    /// layer holds its projections, and on MLX's ops one state a 64-token chunk.
    pub fn prompt_step_bytes(&self, step: &PromptStep) -> u64 {
        let ranks = step.ranks.max(1);
        let (rows, db) = (step.rows, step.dtype_bytes);
        let s = &self.sparse;
        let (hq, hkv) = (s.heads.div_ceil(ranks), s.kv_heads.div_ceil(ranks));
        let gate = if s.use_output_gate { hq } else { 0 };
        let mut sparse = size_product(&[rows, 2 * hq + 2 * hkv + gate, s.head_dim, db]);
        let mut selection = 0;
        if step.context < s.dense_len {
            sparse = sparse.saturating_add(step.held_scores_bytes(hq));
        } else {
            let sel = &s.selection;
            let query = infllm::selection_query_bytes(step.tensor_cores, hq, hkv, step.context / sel.stride, sel, db);
            let queries = rows.min(2 * infllm::selection_chunk_queries(query));
            selection = size_product(&[queries, query]);
            if !step.fused {
                let queries = rows.min(2 * infllm::GATHER_QUERIES as usize);
                sparse = sparse.saturating_add(size_product(&[2, queries, hkv, sel.topk * sel.block, s.head_dim, 4]));
            }
        }
        let l = &self.lightning;
        let lh = l.heads.div_ceil(ranks);
        let mut lightning = size_product(&[rows, 5 * lh, l.head_dim, db]);
        if !step.fused {
            lightning = lightning.saturating_add(size_product(&[rows.div_ceil(crate::kernels::gla::CHUNK), lh, l.head_dim, l.head_dim, 4]));
        }
        // The largest layer's matrices: the MLP and a lightning layer's q, k, v, gate and output.
        let mlp = size_product(&[3, self.intermediate_size.div_ceil(ranks), self.hidden_size]);
        let mixer = size_product(&[5, lh * l.head_dim, self.hidden_size]).max(size_product(&[3 * hq + 2 * hkv, s.head_dim, self.hidden_size]));
        let layer = self
            .mixers
            .iter()
            .map(|m| match m {
                Mixer::Sparse => sparse,
                Mixer::Lightning => lightning,
            })
            .max()
            .unwrap_or(0);
        let weights = mlp.saturating_add(mixer);
        let copies = step
            .dequantized_bytes(weights, PromptStep::PEAK_DEQUANTIZED_LAYERS)
            .max(step.dequantized_bytes(weights, PromptStep::SELECTION_DEQUANTIZED_LAYERS).saturating_add(selection));
        let counted = step.common_bytes(self.hidden_size, self.intermediate_size).saturating_add(copies);
        PromptStep::with_margin(counted.saturating_add(layer))
    }

    /// Every tensor the checkpoint must hold, with its shape.
    pub fn tensor_specs(&self) -> Result<Vec<TensorSpec>> {
        let (h, f, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let mut specs = vec![TensorSpec::new("model.embed_tokens.weight", &[v, h])?, TensorSpec::new("model.norm.weight", &[h])?];
        if !self.tie_word_embeddings {
            specs.push(TensorSpec::new("lm_head.weight", &[v, h])?);
        }
        for (i, mixer) in self.mixers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            specs.push(TensorSpec::new(format!("{p}.input_layernorm.weight"), &[h])?);
            specs.push(TensorSpec::new(format!("{p}.post_attention_layernorm.weight"), &[h])?);
            specs.push(TensorSpec::new(format!("{p}.mlp.gate_proj.weight"), &[f, h])?);
            specs.push(TensorSpec::new(format!("{p}.mlp.up_proj.weight"), &[f, h])?);
            specs.push(TensorSpec::new(format!("{p}.mlp.down_proj.weight"), &[h, f])?);
            let attn = format!("{p}.self_attn");
            match mixer {
                Mixer::Sparse => specs.extend(self.sparse.tensor_specs(&attn, h)?),
                Mixer::Lightning => specs.extend(self.lightning.tensor_specs(&attn, h)?),
            }
        }
        Ok(specs)
    }
}

enum MixerLayer {
    Sparse(SparseAttention),
    Lightning(LightningAttention),
}

struct DecoderLayer {
    input_norm: RmsNorm,
    post_norm: RmsNorm,
    mixer: MixerLayer,
    mlp: Mlp,
}

pub struct SalaModel {
    pub config: SalaConfig,
    info: ModelInfo,
    embed_tokens: Embedding,
    layers: Vec<DecoderLayer>,
    head: LmHead,
    kv_format: KvFormat,
    /// This rank's part under tensor parallelism.
    tensor_parallel: bool,
}

impl SalaModel {
    /// The model, or under tensor parallelism this rank's part of it (`tp`).
    pub fn load(cfg: &ConfigFile, weights: &mut Weights, dtype: Option<Dtype>, tp: &TensorParallel) -> Result<Self> {
        let mut config = SalaConfig::from_file(cfg)?;
        config.resolve_tie(weights);
        let specs = config.tensor_specs()?;
        weights.check(&specs, MODEL_TYPE)?;
        let dtype = dtype.or_else(|| weights.storage_dtype()).unwrap_or(Dtype::Bfloat16);
        let eps = config.rms_norm_eps;
        let mut layers = Vec::with_capacity(config.num_layers);
        for (i, mixer) in config.mixers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            let attn = format!("{p}.self_attn");
            layers.push(DecoderLayer {
                input_norm: RmsNorm::load(weights, &format!("{p}.input_layernorm"), eps, dtype)?,
                post_norm: RmsNorm::load(weights, &format!("{p}.post_attention_layernorm"), eps, dtype)?,
                mixer: match mixer {
                    Mixer::Sparse => MixerLayer::Sparse(SparseAttention::load(weights, &attn, &config, dtype, tp)?),
                    Mixer::Lightning => {
                        MixerLayer::Lightning(LightningAttention::load(weights, &attn, &config, dtype, tp)?)
                    }
                },
                mlp: Mlp::load(weights, &format!("{p}.mlp"), dtype, tp)?,
            });
        }
        let n_params = weights.n_params();
        let info = ModelInfo {
            model_type: MODEL_TYPE.into(),
            vocab_size: config.vocab_size,
            max_context: config.max_position_embeddings,
            bos_token_id: Some(config.bos_token_id),
            eos_token_ids: config.eos_token_ids.clone(),
            dtype,
            n_params,
            num_layers: config.num_layers,
        };
        Ok(Self {
            embed_tokens: Embedding::load(weights, "model.embed_tokens", dtype)?,
            // logits = lm_head(h / (hidden/dim_model_base))
            head: LmHead::load(weights, eps, config.tie_word_embeddings, config.dim_model_base / config.hidden_size as f32, dtype)?,
            layers,
            config,
            info,
            kv_format: KvFormat::Plain,
            tensor_parallel: tp.size > 1,
        })
    }
}

impl LanguageModel for SalaModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn info_mut(&mut self) -> &mut ModelInfo {
        &mut self.info
    }

    fn new_cache(&self) -> ModelCache {
        let layers = self
            .config
            .mixers
            .iter()
            .map(|m| match m {
                Mixer::Sparse => LayerCache::Attention(KvCache::new(self.kv_format, None)),
                Mixer::Lightning => LayerCache::Recurrent(RecurrentState::default()),
            })
            .collect();
        ModelCache { layers }
    }

    fn set_window(&mut self, _window: crate::engine::cache::Window) -> Result<()> {
        Err(Error::Usage(
            "MiniCPM-SALA cannot use --context-size/--num-sink-tokens: its sparse layers choose which blocks of \
             the whole history to attend to and its lightning layers fold every token into their state, so \
             evicting tokens would change what the model computes. It supports long contexts natively \
             (max_position_embeddings); drop these flags."
                .into(),
        ))
    }

    fn set_kv_bits(&mut self, bits: i32) -> Result<()> {
        self.kv_format = KvFormat::quantized(bits, self.config.sparse.head_dim as i32).map_err(Error::Usage)?;
        Ok(())
    }

    fn forward_batch(
        &self,
        tokens: &Array,
        caches: &mut [&mut ModelCache],
        logits: Logits,
        trace: Option<&mut Trace>,
    ) -> Result<Array> {
        self.run(tokens, caches, logits, trace, self.layers.len())
    }

    fn forward_draft(&self, tokens: &Array, cache: &mut ModelCache, layers: usize) -> Result<Array> {
        self.run(tokens, &mut [cache], Logits::Last, None, layers)
    }

    /// One sequence with plain caches on one device, while the sparse layers attend densely: a
    /// step that reaches `dense_len` (InfLLM-V2 from there) is built afresh.
    fn fixed_step_variant(&self, caches: &[&ModelCache]) -> Option<u64> {
        let [cache] = caches else { return None };
        let dense = cache.len() + 1 < self.config.sparse.dense_len;
        (dense && !self.tensor_parallel && self.kv_format == KvFormat::Plain).then_some(0)
    }

    fn truncate_cache(&self, cache: &mut ModelCache, len: usize) -> Result<()> {
        cache.truncate_attention(len)?;
        for (layer, state) in self.layers.iter().zip(&mut cache.layers) {
            if let (MixerLayer::Lightning(attn), LayerCache::Recurrent(state)) = (&layer.mixer, state) {
                attn.rollback(state, len)?;
            }
        }
        Ok(())
    }
}

impl SalaModel {
    /// The forward pass through the first `depth` layers, then the output head.
    fn run(
        &self,
        tokens: &Array,
        caches: &mut [&mut ModelCache],
        logits: Logits,
        mut trace: Option<&mut Trace>,
        depth: usize,
    ) -> Result<Array> {
        check_batch(tokens, caches)?;
        let alpha = self.config.residual_scale();
        let mut h = scale(&self.embed_tokens.forward(tokens)?, self.config.scale_emb)?;
        let positions = Positions::new(caches.iter().map(|c| c.len()).collect());
        if let Some(t) = trace.as_deref_mut() {
            t.record("hidden.embeddings", &h);
        }
        let mut pacer = Pacer::new(tokens.size());
        for (i, layer) in self.layers.iter().enumerate().take(depth) {
            // x = RMSNorm(h), applied inside the products that read x (layers::Input).
            let x = Input::Normed(&h, &layer.input_norm);
            let (o, o_proj) = match &layer.mixer {
                MixerLayer::Sparse(attn) => (
                    MixerOutput::done(attn.attend(x, &mut layer_caches(caches, i, LayerCache::as_attention)?, i, trace.as_deref_mut())?),
                    attn.o_proj(),
                ),
                MixerLayer::Lightning(attn) => {
                    (attn.attend(x, &mut layer_caches(caches, i, LayerCache::as_recurrent)?, &positions)?, attn.o_proj())
                }
            };
            // h = h + α · o·Woᵀ: the projection adds itself into h (one kernel when quantized).
            h = o_proj.forward_residual(o.input(), &h, alpha)?;
            if let Some(t) = trace.as_deref_mut() {
                t.record(format!("hidden.mixer_out.{i}"), &o_proj.forward(&o.input().array()?)?);
            }
            pacer.step(|| layer_outputs(&h, caches, i))?;
            // h = h + α · MLP(RMSNorm(h))
            h = layer.mlp.forward_residual(Input::Normed(&h, &layer.post_norm), &h, alpha)?;
            if let Some(t) = trace.as_deref_mut() {
                t.record(format!("hidden.layer_out.{i}"), &h);
            }
            pacer.step(|| layer_outputs(&h, caches, i))?;
        }
        self.head.forward(&h, &self.embed_tokens, logits, trace)
    }
}
