//! The "minicpm4" layer: NoPE GQA softmax attention with a sigmoid output gate
//! (docs/sala-model.md, Sparse layer).
//!
//!   q = x·Wq [T, Hq, d];  k, v = x·Wk, x·Wv [T, Hkv, d]      no RoPE, no QK-norm
//!   append k, v to the cache;  L = P + T
//!   L <  dense_len:  causal softmax attention (bottom-right aligned), query head g reads KV head g/(Hq/Hkv)
//!   L ≥ dense_len:   InfLLM-V2 — per KV group choose `topk` 64-token blocks per query from the
//!                    compressed keys (level 1: mean of 32 keys every 16; level 2: 128 every 64),
//!                    block 0 and the local window always included; attend to those blocks only
//!   y = (o ⊙ σ(x·W_ogate))·Wo
//!
//! HF picks dense or sparse per forward call from L, so every query of a call that reaches
//! dense_len is sparse (for queries before 6144 tokens both are the same).

use super::SalaConfig;
use crate::engine::cache::KvCache;
use crate::engine::config::ConfigFile;
use crate::engine::distributed::TensorParallel;
use crate::engine::error::Result;
use crate::engine::model::Trace;
use crate::engine::weights::{TensorSpec, Weights};
use crate::kernels::kv::{append_to_caches, KvColumns};
use crate::kernels::sparse::{decode_attention, heads_to_rows, BlockSelection, DecodeQuery};
use super::infllm::{block_sparse_attention, compressed_keys, select_blocks, select_blocks_across, select_blocks_scored};
use crate::models::layers::{per_sequence, prompt_attention, HeadRows, Input, Linear, QkvGate};
use mlx_rs::{ops, ops::indexing::TryIndexOp, Array, Dtype};

/// The level-2 compressed keys use 4× the level-1 window and stride (hard-coded in the reference).
const LEVEL2_FACTOR: usize = 4;
#[derive(Debug, Clone)]
pub struct SparseConfig {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub use_output_gate: bool,
    pub dense_len: usize,
    pub selection: BlockSelection,
}

impl SparseConfig {
    pub fn from_file(cfg: &ConfigFile) -> Result<Self> {
        if cfg.bool("attn_use_rope")? {
            return Err(cfg.invalid("attn_use_rope", "must be false: the minicpm4 layers are NoPE"));
        }
        let heads = cfg.dim("num_attention_heads")?;
        let kv_heads = cfg.dim("num_key_value_heads")?;
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(cfg.invalid("num_key_value_heads", format!("must divide num_attention_heads ({heads})")));
        }
        let s = cfg.section("sparse_config")?;
        let block = s.dim("block_size")?;
        let kernel = s.dim("kernel_size")?;
        let stride = s.dim("kernel_stride")?;
        let window = s.usize("window_size")?;
        let dense_len = s.usize("dense_len")?;
        s.bool("use_nope")?; // Only matters with RoPE in these layers, which they never have.
        let bad = |key: &str, msg: &str| cfg.invalid(&format!("sparse_config.{key}"), msg);
        if stride == 0 || kernel % stride != 0 || block % stride != 0 {
            return Err(bad("kernel_stride", "kernel_size and block_size must be multiples of kernel_stride"));
        }
        if block == 0 || window % block != 0 {
            return Err(bad("window_size", "must be a multiple of block_size"));
        }
        if dense_len < kernel * LEVEL2_FACTOR {
            return Err(bad("dense_len", "must be at least 4 × kernel_size (one level-2 window)"));
        }
        let local_blocks = window / block;
        Ok(Self {
            heads,
            kv_heads,
            head_dim: cfg.head_dim("head_dim")?,
            use_output_gate: cfg.bool("attn_use_output_gate")?,
            dense_len,
            selection: BlockSelection {
                block,
                kernel,
                stride,
                kernel2: kernel * LEVEL2_FACTOR,
                stride2: stride * LEVEL2_FACTOR,
                init_blocks: s.usize("init_blocks")?,
                local_blocks,
                topk: s.usize("topk")? + local_blocks,
            },
        })
    }

    pub fn tensor_specs(&self, prefix: &str, hidden: usize) -> Result<Vec<TensorSpec>> {
        let (q, kv) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let mut specs = vec![
            TensorSpec::new(format!("{prefix}.q_proj.weight"), &[q, hidden])?,
            TensorSpec::new(format!("{prefix}.k_proj.weight"), &[kv, hidden])?,
            TensorSpec::new(format!("{prefix}.v_proj.weight"), &[kv, hidden])?,
            TensorSpec::new(format!("{prefix}.o_proj.weight"), &[hidden, q])?,
        ];
        if self.use_output_gate {
            specs.push(TensorSpec::new(format!("{prefix}.o_gate.weight"), &[q, hidden])?);
        }
        Ok(specs)
    }
}

pub struct SparseAttention {
    cfg: SparseConfig,
    /// q, k, v and the output gate in one stacked projection.
    qkv_gate_proj: QkvGate,
    o_proj: Linear,
    /// Where this rank holds only part of its KV head's query heads (more ranks than KV heads).
    split_group: Option<SplitGroup>,
}

/// A KV group whose query heads are shared between ranks, each holding the KV head whole: the
/// group's one block selection needs the scores of all its heads, summed over those ranks.
struct SplitGroup {
    tp: TensorParallel,
    /// This rank's KV head, of `total`.
    head: usize,
    total: usize,
}

impl SplitGroup {
    /// This rank's part of its group's scores `[B, 1, T, windows]` plus the other ranks' parts:
    /// placed at its KV head among all of them, summed over every rank (the ranks of the other
    /// heads add zeros there), and taken back out.
    fn sum(&self, score: &Array) -> mlx_rs::error::Result<Array> {
        let zeros = ops::zeros_like(score)?;
        let slots: Vec<&Array> = (0..self.total).map(|h| if h == self.head { score } else { &zeros }).collect();
        let all = self.tp.all_sum(&ops::concatenate(&slots, 1)?).map_err(|e| mlx_rs::error::Exception::custom(e.to_string()))?;
        let head = self.head as i32;
        all.try_index((.., head..head + 1, .., ..))
    }
}

impl SparseAttention {
    /// The layer, or under tensor parallelism this rank's KV groups of it (their query heads and
    /// KV heads): block selection is per KV group, so it needs nothing from the other ranks,
    /// except where the ranks outnumber the KV heads: each rank then holds its KV head whole and
    /// part of its query heads, and the ranks of a group sum their selection scores.
    pub fn load(weights: &mut Weights, prefix: &str, config: &SalaConfig, dtype: Dtype, tp: &TensorParallel) -> Result<Self> {
        let all = &config.sparse;
        let kv = tp.kv_heads(all.kv_heads, all.heads, "the sparse layers' key-value heads (num_key_value_heads)")?;
        let heads = tp.part(all.heads, "the sparse layers' query heads (num_attention_heads)")?;
        let cfg = SparseConfig { heads: heads.len(), kv_heads: kv.range.len(), ..all.clone() };
        let rows = HeadRows::of(tp, &heads, &kv.range, all.head_dim);
        Ok(Self {
            qkv_gate_proj: QkvGate::load(weights, prefix, cfg.use_output_gate.then_some("o_gate"), dtype, &rows)?,
            o_proj: Linear::row_parallel(weights, &format!("{prefix}.o_proj"), dtype, false, tp)?,
            split_group: kv.replicated().then(|| SplitGroup { tp: tp.clone(), head: kv.range.start, total: kv.total }),
            cfg,
        })
    }

    /// `x`: the (normed) hidden state `[B, T, hidden]`, row b continuing `caches[b]`. Records the
    /// block selection under `sparse.layer{i}.blocks` / `.block_scores` when tracing. Returns the
    /// (gated) attention output `[B, T, Hq·d]` before [`SparseAttention::o_proj`]: the attention
    /// kernels apply the gate as they merge their splits.
    pub fn attend(&self, x: Input, caches: &mut [&mut KvCache], layer: usize, mut trace: Option<&mut Trace>) -> Result<Array> {
        if x.shape()[1] == 1 && caches.iter().all(|c| !c.is_empty()) {
            return self.attend_decode(x, caches, layer, trace);
        }
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let (hq, hkv, d) = (self.cfg.heads as i32, self.cfg.kv_heads as i32, self.cfg.head_dim as i32);
        let ([q, k, v], gate) = self.qkv_gate_proj.forward(x)?;
        let heads = |x: Array, h: i32| x.reshape(&[b, t, h, d])?.swap_axes(1, 2);
        let (q, k, v) = (heads(q, hq)?, heads(k, hkv)?, heads(v, hkv)?);
        let scale = (d as f32).powf(-0.5);
        let mut inputs = vec![&q, &k, &v];
        inputs.extend(gate.as_ref());
        per_sequence(&inputs, caches, |qkvg, cache| {
            let gate = qkvg.get(3);
            let past = cache.len();
            if past + (t as usize) < self.cfg.dense_len {
                let (keys, values) = cache.append(&qkvg[1], &qkvg[2])?;
                let o = prompt_attention(&qkvg[0], &keys, &values, scale)?;
                Ok(heads_to_rows(&o, gate)?)
            } else {
                cache.append_recent(&qkvg[1], &qkvg[2])?;
                self.sparse_attention(&qkvg[0], gate, cache, past, layer, trace.as_deref_mut())
            }
        })
    }

    /// One new token for each of the (non-empty) caches. Its keys and values go behind each
    /// cache's recent tokens, all sequences in one call: appending to a history the device still
    /// reads (the previous step's attention) would copy it, and per-sequence slice updates would
    /// cost the host 14 operations per sequence and layer. Then one attention call for the
    /// batch while every cache is dense, else InfLLM-V2 per sequence.
    fn attend_decode(&self, x: Input, caches: &mut [&mut KvCache], layer: usize, mut trace: Option<&mut Trace>) -> Result<Array> {
        let (hq, hkv, d) = (self.cfg.heads as i32, self.cfg.kv_heads as i32, self.cfg.head_dim as i32);
        // q, k, v and the gate side by side: the kernels read them from the one projection.
        let qkvg = self.qkv_gate_proj.forward_joined(x)?;
        let gate_col = self.cfg.use_output_gate.then_some((hq + 2 * hkv) * d);
        let columns = KvColumns { keys: hq * d, values: (hq + hkv) * d, kv_heads: hkv, head_dim: d };
        append_to_caches(&qkvg, columns, caches)?;
        let scale = (d as f32).powf(-0.5);
        if caches.iter().all(|c| c.len() < self.cfg.dense_len) {
            let parts = caches.iter_mut().map(|c| Ok(c.parts()?.expect("keys were just appended"))).collect::<Result<Vec<_>>>()?;
            let query = DecodeQuery { rows: &qkvg, heads: hq, head_dim: d, q_col: 0, gate_col };
            return Ok(decode_attention(&query, &parts, scale)?);
        }
        per_sequence(&[&qkvg], caches, |row, cache| {
            let query = DecodeQuery { rows: &row[0], heads: hq, head_dim: d, q_col: 0, gate_col };
            let past = cache.len() - 1;
            if cache.len() < self.cfg.dense_len {
                let kv = cache.parts()?.expect("keys were just appended");
                Ok(decode_attention(&query, &[kv], scale)?)
            } else {
                self.sparse_attention(&query.heads()?, query.gate()?.as_ref(), cache, past, layer, trace.as_deref_mut())
            }
        })
    }

    /// The output projection Wo.
    pub fn o_proj(&self) -> &Linear {
        &self.o_proj
    }

    /// InfLLM-V2 for one sequence's queries: block selection, then attention over the chosen
    /// blocks, gated (`[1, T, Hq·d]`).
    #[allow(clippy::too_many_arguments)]
    fn sparse_attention(
        &self,
        q: &Array,
        gate: Option<&Array>,
        cache: &mut KvCache,
        past: usize,
        layer: usize,
        trace: Option<&mut Trace>,
    ) -> Result<Array> {
        let sel = &self.cfg.selection;
        let c1 = compressed_keys(cache, sel.kernel, sel.stride)?;
        let c2 = compressed_keys(cache, sel.kernel2, sel.stride2)?;
        let (Some(c1), Some(c2)) = (c1, c2) else {
            unreachable!("dense_len ≥ one level-2 window, so both levels exist here")
        };
        let kv = cache.parts()?.expect("keys were just appended");
        let kv_len = kv.len;
        let scale = (q.shape()[3] as f32).powf(-0.5);
        // The selection and the attention kernels both read q contiguous: one copy for both.
        let q = &q.contiguous()?;
        // One call each for all queries (select_blocks bounds its own working memory; attention
        // calls of few queries at a time leave the GPU half idle at long context;
        // eval/results/kernel-notes.md).
        let blocks = match (trace, &self.split_group) {
            (Some(tr), split) => {
                let (blocks, scores) = match split {
                    Some(group) => {
                        let (blocks, scores) = select_blocks_across(q, &c1, &c2, past, kv_len, sel, q.dtype(), &|s| group.sum(s), true)?;
                        (blocks, scores.expect("kept"))
                    }
                    None => {
                        let selected = select_blocks_scored(q, &c1, &c2, past, kv_len, sel, q.dtype())?;
                        (selected.blocks, selected.scores)
                    }
                };
                tr.record(format!("sparse.layer{layer}.blocks"), &blocks);
                tr.record(format!("sparse.layer{layer}.block_scores"), &scores);
                blocks
            }
            (None, Some(group)) => select_blocks_across(q, &c1, &c2, past, kv_len, sel, q.dtype(), &|s| group.sum(s), false)?.0,
            (None, None) => select_blocks(q, &c1, &c2, past, kv_len, sel, q.dtype())?,
        };
        Ok(block_sparse_attention(q, &kv, &blocks, past, sel.block, scale, gate)?)
    }
}
