//! The standard pre-norm GQA transformer that the dense families share (Llama, Mistral, SmolLM,
//! Qwen2, Qwen3, dense MiniCPM). Each family's file reads its config into a [`DecoderConfig`],
//! whose knobs say what differs: projection biases, per-head q/k norms, muP scales, RoPE scaling.
//!
//!   h = Embed[ids] · scale_emb
//!   per layer:  h += α · Attn(RMSNorm(h));  h += α · MLP(RMSNorm(h))
//!   logits = RMSNorm(h) · logit_scale · W_lmᵀ

use crate::engine::cache::{layer_caches, layer_outputs, KvCache, KvFormat, LayerCache, ModelCache, Window};
use crate::engine::config::{size_product, ConfigFile, MAX_HEAD_DIM};
use crate::engine::distributed::TensorParallel;
use crate::engine::error::{Error, Result};
use crate::engine::ops::Pacer;
use crate::engine::model::{check_batch, LanguageModel, Logits, ModelInfo, Trace};
use crate::engine::weights::{TensorSpec, Weights};
use crate::kernels::kv::append_with;
use crate::kernels::rope::{prompt_heads, rope_append, QkHeads, RopeAngles};
use crate::kernels::sparse::{decode_attention, launch_decode_variants, DecodeQuery, DecodeShape};
use crate::models::layers::{per_sequence, prompt_attention, scale, Embedding, HeadRows, Input, Linear, LmHead, Mlp, Projections, RmsNorm};
use crate::models::rope::Rope;
use crate::models::PromptStep;
use mlx_rs::{ops, ops::indexing::TryIndexOp, Array, Dtype};

#[derive(Clone)]
pub struct DecoderConfig {
    pub model_type: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// The config does not say; the checkpoint decides (no `lm_head.weight` = tied).
    pub tie_unspecified: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub rope: Rope,
    /// q/k/v projections carry a bias (Qwen2, `attention_bias`).
    pub qkv_bias: bool,
    /// o_proj carries a bias (`attention_bias` in Llama-style configs).
    pub o_bias: bool,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Multiplies the embeddings (MiniCPM's scale_emb).
    pub embedding_scale: f32,
    /// Multiplies each residual branch (MiniCPM's scale_depth/√L).
    pub residual_scale: f32,
    /// Multiplies the final hidden state before the output projection (MiniCPM's dim_model_base/hidden).
    pub logit_scale: f32,
}

/// How `tie_word_embeddings` is settled when the file leaves it out (`Fallback::Computed`).
pub const TIE_FALSE: &str = "false in the class; sala follows the checkpoint: no lm_head.weight means tied";
pub const TIE_TRUE: &str = "true in the class; sala follows the checkpoint: an lm_head.weight means untied";

/// Refuses sliding-window attention that would cut the context short (it is not implemented):
/// `sliding_window` set, not switched off by `use_sliding_window: false`, and shorter than
/// `max_position_embeddings`.
pub fn refuse_sliding_window(cfg: &ConfigFile) -> Result<()> {
    if cfg.opt("sliding_window").is_none() || cfg.opt("use_sliding_window").and_then(|v| v.as_bool()) == Some(false) {
        return Ok(());
    }
    let window = cfg.usize("sliding_window")?;
    let max = cfg.usize("max_position_embeddings")?;
    if window < max {
        return Err(cfg.invalid(
            "sliding_window",
            format!("sliding-window attention ({window} < max_position_embeddings {max}) is not supported"),
        ));
    }
    Ok(())
}

impl DecoderConfig {
    /// The keys every HF-layout dense config has, after the family filled in its defaults; the
    /// caller sets the family's knobs.
    pub fn common(cfg: &ConfigFile) -> Result<Self> {
        let hidden_size = cfg.dim("hidden_size")?;
        let heads = cfg.dim("num_attention_heads")?;
        let kv_heads = match cfg.opt("num_key_value_heads") {
            Some(_) => cfg.dim("num_key_value_heads")?,
            None => heads,
        };
        if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
            return Err(cfg.invalid(
                "num_key_value_heads",
                format!("{kv_heads} must divide num_attention_heads ({heads})"),
            ));
        }
        let head_dim = match cfg.opt("head_dim") {
            Some(_) => cfg.head_dim("head_dim")?,
            None if hidden_size % heads == 0 && hidden_size / heads <= MAX_HEAD_DIM => hidden_size / heads,
            None if hidden_size % heads == 0 => {
                return Err(cfg.invalid("hidden_size", format!("{hidden_size} / {heads} heads is a head width over {MAX_HEAD_DIM}")))
            }
            None => return Err(cfg.invalid("num_attention_heads", format!("{heads} does not divide hidden_size {hidden_size}; set head_dim"))),
        };
        if let Some(act) = cfg.opt("hidden_act") {
            if act.as_str() != Some("silu") {
                return Err(cfg.invalid("hidden_act", format!("{act}: only `silu` (SwiGLU) is supported")));
            }
        }
        let eos_token_ids = match cfg.opt("eos_token_id") {
            Some(_) => cfg.token_ids("eos_token_id")?,
            None => Vec::new(),
        };
        let bos_token_id = match cfg.opt("bos_token_id") {
            Some(_) => Some(cfg.usize("bos_token_id")? as u32),
            None => None,
        };
        Ok(Self {
            model_type: cfg.str("model_type")?.to_string(),
            hidden_size,
            intermediate_size: cfg.dim("intermediate_size")?,
            num_layers: cfg.layers("num_hidden_layers")?,
            heads,
            kv_heads,
            head_dim,
            vocab_size: cfg.dim("vocab_size")?,
            rms_norm_eps: cfg.f64("rms_norm_eps")? as f32,
            max_position_embeddings: cfg.dim("max_position_embeddings")?,
            tie_word_embeddings: match cfg.opt("tie_word_embeddings") {
                Some(_) => cfg.bool("tie_word_embeddings")?,
                None => false,
            },
            tie_unspecified: cfg.opt("tie_word_embeddings").is_none(),
            bos_token_id,
            eos_token_ids,
            rope: Rope::from_config(cfg, head_dim)?,
            qkv_bias: false,
            o_bias: false,
            qk_norm: false,
            embedding_scale: 1.0,
            residual_scale: 1.0,
            logit_scale: 1.0,
        })
    }

    /// `attention_bias: true` (Llama-style configs) puts a bias on all four projections.
    pub fn with_attention_bias(mut self, cfg: &ConfigFile) -> Result<Self> {
        if cfg.opt("attention_bias").is_some() && cfg.bool("attention_bias")? {
            self.qkv_bias = true;
            self.o_bias = true;
        }
        if cfg.opt("mlp_bias").is_some() && cfg.bool("mlp_bias")? {
            return Err(cfg.invalid("mlp_bias", "MLP biases are not supported"));
        }
        Ok(self)
    }

    /// A config silent about `tie_word_embeddings` is tied when the checkpoint has no `lm_head`.
    pub fn resolve_tie(&mut self, weights: &Weights) {
        if self.tie_unspecified {
            self.tie_word_embeddings = !weights.infos().contains_key("lm_head.weight");
        }
    }

    /// Bytes of the per-sequence cache after `context` tokens on each of `ranks` tensor-parallel
    /// ranks: keys and values of every layer, stored in `format` (a KV head per rank at least).
    pub fn cache_bytes(&self, context: usize, dtype_bytes: usize, format: KvFormat, ranks: usize) -> u64 {
        size_product(&[self.num_layers, 2, self.kv_heads.div_ceil(ranks.max(1)), context]).saturating_mul(format.row_bytes(self.head_dim, dtype_bytes))
    }

    /// Bytes one prompt step holds beyond the weights and the cache (see [`PromptStep`]): the
    /// layer's common terms, its queries, keys, values and attention output, and the scores
    /// where attention is not fused.
    pub fn prompt_step_bytes(&self, step: &PromptStep) -> u64 {
        let ranks = step.ranks.max(1);
        let heads = self.heads.div_ceil(ranks);
        let projections = size_product(&[step.rows, 2 * heads + 2 * self.kv_heads.div_ceil(ranks), self.head_dim, step.dtype_bytes]);
        let (q, kv) = (heads * self.head_dim, self.kv_heads.div_ceil(ranks) * self.head_dim);
        let layer_weights = size_product(&[self.hidden_size, 3 * self.intermediate_size.div_ceil(ranks) + 2 * q + 2 * kv]);
        let counted = step
            .common_bytes(self.hidden_size, self.intermediate_size)
            .saturating_add(step.dequantized_bytes(layer_weights, PromptStep::PEAK_DEQUANTIZED_LAYERS))
            .saturating_add(projections)
            .saturating_add(step.held_scores_bytes(heads));
        PromptStep::with_margin(counted)
    }

    pub fn tensor_specs(&self) -> Result<Vec<TensorSpec>> {
        let (h, f, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let mut specs = vec![TensorSpec::new("model.embed_tokens.weight", &[v, h])?, TensorSpec::new("model.norm.weight", &[h])?];
        if !self.tie_word_embeddings {
            specs.push(TensorSpec::new("lm_head.weight", &[v, h])?);
        }
        for i in 0..self.num_layers {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            specs.push(TensorSpec::new(format!("{p}.input_layernorm.weight"), &[h])?);
            specs.push(TensorSpec::new(format!("{p}.post_attention_layernorm.weight"), &[h])?);
            specs.push(TensorSpec::new(format!("{p}.mlp.gate_proj.weight"), &[f, h])?);
            specs.push(TensorSpec::new(format!("{p}.mlp.up_proj.weight"), &[f, h])?);
            specs.push(TensorSpec::new(format!("{p}.mlp.down_proj.weight"), &[h, f])?);
            for (name, rows) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
                specs.push(TensorSpec::new(format!("{a}.{name}.weight"), &[rows, h])?);
                if self.qkv_bias {
                    specs.push(TensorSpec::new(format!("{a}.{name}.bias"), &[rows])?);
                }
            }
            specs.push(TensorSpec::new(format!("{a}.o_proj.weight"), &[h, q])?);
            if self.o_bias {
                specs.push(TensorSpec::new(format!("{a}.o_proj.bias"), &[h])?);
            }
            if self.qk_norm {
                specs.push(TensorSpec::new(format!("{a}.q_norm.weight"), &[self.head_dim])?);
                specs.push(TensorSpec::new(format!("{a}.k_norm.weight"), &[self.head_dim])?);
            }
        }
        Ok(specs)
    }
}

struct Attention {
    /// q, k and v in one stacked projection.
    qkv_proj: Projections<3>,
    o_proj: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    heads: i32,
    kv_heads: i32,
    head_dim: i32,
}

impl Attention {
    /// This rank's heads: their q, k, v rows and o_proj columns (KV heads replicated where the
    /// ranks outnumber them: each query head's attention needs only its own KV head).
    fn load(weights: &Weights, prefix: &str, c: &DecoderConfig, dtype: Dtype, tp: &TensorParallel) -> Result<Self> {
        let heads = tp.part(c.heads, "the attention heads (num_attention_heads)")?;
        let kv = tp.kv_heads(c.kv_heads, c.heads, "the key-value heads (num_key_value_heads)")?;
        let rows = HeadRows::of(tp, &heads, &kv.range, c.head_dim);
        let (heads, kv_heads) = (heads.len(), kv.range.len());
        let name = |n: &str| format!("{prefix}.{n}");
        let norm = |n: &str| RmsNorm::load(weights, &name(n), c.rms_norm_eps, dtype);
        Ok(Self {
            qkv_proj: Projections::load_rows(weights, ["q_proj", "k_proj", "v_proj"].map(name), vec![rows.q, rows.kv.clone(), rows.kv], dtype, c.qkv_bias)?,
            o_proj: Linear::row_parallel(weights, &name("o_proj"), dtype, c.o_bias, tp)?,
            q_norm: if c.qk_norm { Some(norm("q_norm")?) } else { None },
            k_norm: if c.qk_norm { Some(norm("k_norm")?) } else { None },
            heads: heads as i32,
            kv_heads: kv_heads as i32,
            head_dim: c.head_dim as i32,
        })
    }

    /// The attention output `[B, T, Hq·d]` before o_proj; `x` `[B, T, hidden]`, row b continuing
    /// `caches[b]`.
    fn attend(&self, x: Input, caches: &mut [&mut KvCache], rope: &Rope) -> Result<Array> {
        if x.shape()[1] == 1 && caches.iter().all(|c| !c.is_empty()) {
            return self.attend_decode(x, caches, rope);
        }
        let rows = self.qkv_proj.forward_joined(x)?;
        self.attend_prompt(&rows, caches, rope)
    }

    /// The query, key and value heads as the layer feeds them to attention and the decode
    /// kernels: where they sit in the stacked projection, and the QK-norm's weights.
    fn qk_heads(&self) -> QkHeads<'_> {
        QkHeads {
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            norms: self.q_norm.as_ref().zip(self.k_norm.as_ref()).map(|(q, k)| (&q.weight, &k.weight, q.eps)),
        }
    }

    /// [`Attention::attend`] of a prompt's stacked projection rows `[B, T, (Hq + 2·Hkv)·d]`.
    fn attend_prompt(&self, rows: &Array, caches: &mut [&mut KvCache], rope: &Rope) -> Result<Array> {
        let (b, t) = (rows.shape()[0], rows.shape()[1]);
        let positions: Vec<i32> = caches.iter().map(|c| c.position() as i32).collect();
        let angles: Vec<&RopeAngles> = positions.iter().map(|&p| rope.angles(p as usize + t as usize)).collect();
        let [q, k, v] = if angles.iter().all(|a| std::ptr::eq(*a, angles[0])) {
            prompt_heads(rows, self.qk_heads(), Some(angles[0]), &Array::from_slice(&positions, &[b]))?
        } else {
            // longrope with sequences on both sides of the original context: one call each.
            let mut each = [vec![], vec![], vec![]];
            for (i, (&position, angles)) in positions.iter().zip(&angles).enumerate() {
                let row = rows.try_index(i as i32..i as i32 + 1)?;
                let heads = prompt_heads(&row, self.qk_heads(), Some(angles), &Array::from_slice(&[position], &[1]))?;
                each.iter_mut().zip(heads).for_each(|(all, one)| all.push(one));
            }
            let [q, k, v] = each.map(|parts| ops::concatenate(&parts, 0));
            [q?, k?, v?]
        };
        let o = per_sequence(&[&q, &k, &v], caches, |qkv, cache| {
            let (keys, values) = cache.append(&qkv[1], &qkv[2])?;
            let o = prompt_attention(&qkv[0], &keys, &values, self.scale())?;
            cache.evict()?;
            Ok(o)
        })?;
        Ok(o.swap_axes(1, 2)?.reshape(&[b, t, self.heads * self.head_dim])?)
    }

    /// One new token for each of the (non-empty) caches, as the kernels take it: q, k and v side
    /// by side from the stacked projection; q and k normed and rotated, and the keys and values
    /// written behind each cache's recent tokens (no copy of a history the device still reads),
    /// in one launch; then one attention call over every cache's whole history (split over its
    /// length, the query heads of a KV group together).
    fn attend_decode(&self, x: Input, caches: &mut [&mut KvCache], rope: &Rope) -> Result<Array> {
        let rows = self.qkv_proj.forward_joined(x)?;
        self.attend_decode_rows(&rows, caches, rope)
    }

    /// [`Attention::attend_decode`] of the stacked projection's rows `[B, 1, (Hq + 2·Hkv)·d]`.
    fn attend_decode_rows(&self, rows: &Array, caches: &mut [&mut KvCache], rope: &Rope) -> Result<Array> {
        let b = rows.shape()[0];
        let (hq, d) = (self.heads, self.head_dim);
        let positions: Vec<usize> = caches.iter().map(|c| c.position()).collect();
        let heads = self.qk_heads();
        let angles: Vec<&RopeAngles> = positions.iter().map(|&p| rope.angles(p + 1)).collect();
        let q = append_with(caches, |slots| {
            if angles.iter().all(|a| std::ptr::eq(*a, angles[0])) {
                return rope_append(rows, heads, angles[0], &positions, slots);
            }
            // longrope with sequences on both sides of the original context: one call each.
            let (mut q, mut written) = (Vec::with_capacity(slots.len()), Vec::with_capacity(slots.len()));
            for (i, slot) in slots.iter().enumerate() {
                let row = rows.try_index(i as i32..i as i32 + 1)?;
                let (qi, wi) = rope_append(&row, heads, angles[i], &positions[i..=i], std::slice::from_ref(slot))?;
                q.push(qi);
                written.extend(wi);
            }
            Ok((ops::concatenate(&q, 0)?, written))
        })?;
        debug_assert_eq!(q.shape(), &[b, 1, hq * d]);
        let parts = caches.iter_mut().map(|c| Ok(c.parts()?.expect("keys were just appended"))).collect::<Result<Vec<_>>>()?;
        let query = DecodeQuery { rows: &q, heads: hq, head_dim: d, q_col: 0, gate_col: None };
        let o = decode_attention(&query, &parts, self.scale())?;
        for cache in caches.iter_mut() {
            cache.evict()?;
        }
        Ok(o)
    }

    /// The attention outputs `[1, B + ΣT, Hq·d]` of a decode step and prompt chunks riding with it
    /// (see [`LanguageModel::forward_mixed`]): `x` `[1, B + ΣT, hidden]` holds the B decode rows
    /// (row b continuing `decode[b]`), then each chunk's `lens[i]` rows (continuing `chunks[i]`).
    /// One stacked projection for all of them; attention per part, as each runs alone.
    fn attend_mixed(&self, x: Input, b: i32, lens: &[i32], decode: &mut [&mut KvCache], chunks: &mut [&mut KvCache], rope: &Rope) -> Result<Array> {
        let rows = self.qkv_proj.forward_joined(x)?;
        let width = rows.shape()[2];
        let q_width = self.heads * self.head_dim;
        let mut outputs = Vec::with_capacity(1 + lens.len());
        if b > 0 {
            let step = rows.try_index((.., ..b, ..))?.reshape(&[b, 1, width])?;
            outputs.push(self.attend_decode_rows(&step, decode, rope)?.reshape(&[1, b, q_width])?);
        }
        let mut at = b;
        for (&len, cache) in lens.iter().zip(chunks.iter_mut()) {
            outputs.push(self.attend_prompt(&rows.try_index((.., at..at + len, ..))?, std::slice::from_mut(cache), rope)?);
            at += len;
        }
        Ok(ops::concatenate(&outputs, 1)?)
    }

    fn scale(&self) -> f32 {
        (self.head_dim as f32).powf(-0.5)
    }
}

struct Layer {
    input_norm: RmsNorm,
    post_norm: RmsNorm,
    attn: Attention,
    mlp: Mlp,
}

pub struct DecoderModel {
    pub config: DecoderConfig,
    info: ModelInfo,
    embed_tokens: Embedding,
    layers: Vec<Layer>,
    head: LmHead,
    window: Option<Window>,
    kv_format: KvFormat,
    /// This rank's part under tensor parallelism.
    tensor_parallel: bool,
}

impl DecoderModel {
    /// The model, or under tensor parallelism this rank's part of it (`tp`).
    pub fn load(mut config: DecoderConfig, weights: &mut Weights, dtype: Option<Dtype>, tp: &TensorParallel) -> Result<Self> {
        config.resolve_tie(weights);
        weights.check(&config.tensor_specs()?, &config.model_type)?;
        let dtype = dtype.or_else(|| weights.storage_dtype()).unwrap_or(Dtype::Bfloat16);
        let eps = config.rms_norm_eps;
        let layers = (0..config.num_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                Ok(Layer {
                    input_norm: RmsNorm::load(weights, &format!("{p}.input_layernorm"), eps, dtype)?,
                    post_norm: RmsNorm::load(weights, &format!("{p}.post_attention_layernorm"), eps, dtype)?,
                    attn: Attention::load(weights, &format!("{p}.self_attn"), &config, dtype, tp)?,
                    mlp: Mlp::load(weights, &format!("{p}.mlp"), dtype, tp)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let info = ModelInfo {
            model_type: config.model_type.clone(),
            vocab_size: config.vocab_size,
            max_context: config.max_position_embeddings,
            bos_token_id: config.bos_token_id,
            eos_token_ids: config.eos_token_ids.clone(),
            dtype,
            n_params: weights.n_params(),
            num_layers: config.num_layers,
        };
        Ok(Self {
            embed_tokens: Embedding::load(weights, "model.embed_tokens", dtype)?,
            head: LmHead::load(weights, eps, config.tie_word_embeddings, config.logit_scale, dtype)?,
            layers,
            config,
            info,
            window: None,
            kv_format: KvFormat::Plain,
            tensor_parallel: tp.size > 1,
        })
    }
}

impl LanguageModel for DecoderModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn info_mut(&mut self) -> &mut ModelInfo {
        &mut self.info
    }

    fn new_cache(&self) -> ModelCache {
        let kv = || KvCache::new(self.kv_format, self.window);
        ModelCache { layers: (0..self.config.num_layers).map(|_| LayerCache::Attention(kv())).collect() }
    }

    fn set_window(&mut self, window: Window) -> Result<()> {
        window.validate().map_err(Error::Usage)?;
        self.window = Some(window);
        Ok(())
    }

    fn set_kv_bits(&mut self, bits: i32) -> Result<()> {
        self.kv_format = KvFormat::quantized(bits, self.config.head_dim as i32).map_err(Error::Usage)?;
        Ok(())
    }

    fn forward_batch(&self, tokens: &Array, caches: &mut [&mut ModelCache], logits: Logits, trace: Option<&mut Trace>) -> Result<Array> {
        self.run(tokens, caches, logits, trace, self.layers.len())
    }

    fn forward_draft(&self, tokens: &Array, cache: &mut ModelCache, layers: usize) -> Result<Array> {
        self.run(tokens, &mut [cache], Logits::Last, None, layers)
    }

    /// Every dense decoder but one keeping a window (its caches draw on the host, step by step).
    fn mixes_chunks(&self) -> bool {
        self.window.is_none()
    }

    fn forward_mixed(&self, tokens: &Array, caches: &mut [&mut ModelCache], chunks: &[Array], chunk_caches: &mut [&mut ModelCache], chunk_logits: &[bool]) -> Result<Array> {
        self.run_mixed(tokens, caches, chunks, chunk_caches, chunk_logits)
    }

    /// The decode attention's variants (the rest of a step's kernels meet few shapes, and a
    /// quantized cache's attention takes other kernels, not launched here).
    fn launch_kernels_ahead(&self) -> Result<usize> {
        let Some(layer) = self.layers.first() else { return Ok(0) };
        if self.kv_format != KvFormat::Plain {
            return Ok(0);
        }
        let a = &layer.attn;
        let shape = DecodeShape { heads: a.heads, head_dim: a.head_dim, q_col: 0, gate_col: None };
        Ok(launch_decode_variants(shape, a.heads * a.head_dim, a.kv_heads, self.info.dtype, a.scale())?)
    }

    /// One sequence with plain, unwindowed caches on one device; the variant is the RoPE table
    /// the next position takes (longrope switches tables past the original context).
    fn fixed_step_variant(&self, caches: &[&ModelCache]) -> Option<u64> {
        let [cache] = caches else { return None };
        if self.tensor_parallel || self.window.is_some() || self.kv_format != KvFormat::Plain {
            return None;
        }
        let rope = &self.config.rope;
        Some(u64::from(!std::ptr::eq(rope.angles(cache.len() + 1), rope.angles(0))))
    }
}

impl DecoderModel {
    /// The forward pass through the first `depth` layers, then the output head.
    fn run(&self, tokens: &Array, caches: &mut [&mut ModelCache], logits: Logits, mut trace: Option<&mut Trace>, depth: usize) -> Result<Array> {
        let c = &self.config;
        check_batch(tokens, caches)?;
        let mut h = self.embed_tokens.forward(tokens)?;
        if c.embedding_scale != 1.0 {
            h = scale(&h, c.embedding_scale)?;
        }
        if let Some(t) = trace.as_deref_mut() {
            t.record("hidden.embeddings", &h);
        }
        let mut pacer = Pacer::new(tokens.size());
        for (i, layer) in self.layers.iter().enumerate().take(depth) {
            let mut kv = layer_caches(caches, i, LayerCache::as_attention)?;
            // x = RMSNorm(h), applied inside the products that read x (layers::Input).
            let o = layer.attn.attend(Input::Normed(&h, &layer.input_norm), &mut kv, &c.rope)?;
            // h = h + α · o·Woᵀ: the projection adds itself into h (one kernel when quantized).
            h = layer.attn.o_proj.forward_residual(Input::Plain(&o), &h, c.residual_scale)?;
            if let Some(t) = trace.as_deref_mut() {
                t.record(format!("hidden.mixer_out.{i}"), &layer.attn.o_proj.forward(&o)?);
            }
            pacer.step(|| layer_outputs(&h, caches, i))?;
            h = layer.mlp.forward_residual(Input::Normed(&h, &layer.post_norm), &h, c.residual_scale)?;
            if let Some(t) = trace.as_deref_mut() {
                t.record(format!("hidden.layer_out.{i}"), &h);
            }
            pacer.step(|| layer_outputs(&h, caches, i))?;
        }
        self.head.forward(&h, &self.embed_tokens, logits, trace)
    }

    /// [`LanguageModel::forward_mixed`]: the rows of the decode step and of every chunk side by
    /// side as one sequence of `B + ΣT` rows for the norms, projections and MLPs. Paced as a
    /// prompt chunk is ([`Pacer`]): past its first rows the products multiply expanded copies of
    /// the weights, a layer's worth each.
    fn run_mixed(&self, tokens: &Array, caches: &mut [&mut ModelCache], chunks: &[Array], chunk_caches: &mut [&mut ModelCache], wanted: &[bool]) -> Result<Array> {
        let c = &self.config;
        let b = tokens.shape()[0];
        if tokens.shape() != [b, 1] || b as usize != caches.len() || caches.iter().any(|c| c.is_empty()) {
            return Err(Error::Usage(format!("forward_mixed: decode tokens of shape {:?} for {} caches: expected [B, 1], one row per non-empty cache", tokens.shape(), caches.len())));
        }
        if chunks.len() != chunk_caches.len() || chunks.len() != wanted.len() || chunks.iter().any(|t| t.ndim() != 2 || t.shape()[0] != 1 || t.shape()[1] == 0) {
            return Err(Error::Usage("forward_mixed: each prompt chunk is [1, T ≥ 1] with a cache and a logits flag of its own".into()));
        }
        let lens: Vec<i32> = chunks.iter().map(|t| t.shape()[1]).collect();
        let mut ids = vec![tokens.reshape(&[1, b])?];
        ids.extend(chunks.iter().cloned());
        let mut h = self.embed_tokens.forward(&ops::concatenate(&ids, 1)?)?;
        if c.embedding_scale != 1.0 {
            h = scale(&h, c.embedding_scale)?;
        }
        let mut pacer = Pacer::new(h.shape()[1] as usize);
        let branch = |h: &Array, caches: &[&mut ModelCache], chunk_caches: &[&mut ModelCache], i: usize| {
            let mut arrays = layer_outputs(h, caches, i);
            arrays.extend(chunk_caches.iter().flat_map(|c| c.layer_arrays(i)));
            arrays
        };
        for (i, layer) in self.layers.iter().enumerate() {
            let mut kv = layer_caches(caches, i, LayerCache::as_attention)?;
            let mut chunk_kv = layer_caches(chunk_caches, i, LayerCache::as_attention)?;
            let o = layer.attn.attend_mixed(Input::Normed(&h, &layer.input_norm), b, &lens, &mut kv, &mut chunk_kv, &c.rope)?;
            h = layer.attn.o_proj.forward_residual(Input::Plain(&o), &h, c.residual_scale)?;
            pacer.step(|| branch(&h, caches, chunk_caches, i))?;
            h = layer.mlp.forward_residual(Input::Normed(&h, &layer.post_norm), &h, c.residual_scale)?;
            pacer.step(|| branch(&h, caches, chunk_caches, i))?;
        }
        // The decode rows, then the last row of each chunk that asks for its logits.
        let mut rows: Vec<i32> = (0..b).collect();
        let mut end = b;
        for (&len, &want) in lens.iter().zip(wanted) {
            end += len;
            if want {
                rows.push(end - 1);
            }
        }
        let h = h.take_axis(Array::from_slice(&rows, &[rows.len() as i32]), 1)?;
        self.head.forward(&h, &self.embed_tokens, Logits::All, None)
    }
}
