//! InfLLM-V2, the sparse attention of SALA's "minicpm4" layers, as MLX operations: the CPU path
//! and the oracle of the GPU kernels in `kernels::sparse` (docs/sala-model.md, "InfLLM-V2").
//!
//! For keys K of one KV head (tokens 0..L) and a query q at position i:
//!
//!   compression   C¹_c = mean(K[s₁·c .. s₁·c + k₁])        k₁ = 32, s₁ = 16   (level 1)
//!                 C²_c = mean(K[s₂·c .. s₂·c + k₂])        k₂ = 128, s₂ = 64  (level 2)
//!                 a window is visible to i when it ends at or before i
//!   stage 1       lse  = logsumexp_c (q·C²_c / √d)         over visible level-2 windows
//!                 p_c  = Σ_heads of the group exp(q·C¹_c / √d − lse)
//!   max-pool      score_b = max{ p_c : window c overlaps block b }    64-token blocks
//!   forced        score_b = +∞ for b < init_blocks and for the local blocks up to i's own
//!   top-k         the `topk` best blocks per query and KV group (ties: the lower block)
//!   attention     o = softmax(q·K_Sᵀ / √d) · V_S   over the tokens S of the chosen blocks, ≤ i
//!
//! Shapes: queries `[B, Hq, T, d]` at absolute positions `first_pos ..`, keys/values
//! `[B, Hkv, L, d]`, compressed keys `[B, Hkv, n, d]`. The `Hq / Hkv` query heads of a KV group
//! share one block selection.

use crate::engine::cache::{KvCache, KvParts};
use crate::engine::ops::{arange_i32, scalar, Pacer};
use crate::kernels::custom::{backend, Backend};
use crate::kernels::selfcheck::{self, sample, sample_quarters, verify, KernelCheck, Verdict, CUDA_AND_METAL, CUDA_ONLY};
use crate::kernels::sparse::{self, heads_to_rows, BlockSelection, Selected};
use mlx_rs::{error::Result, ops, ops::indexing::{IntoStrideBy, TryIndexOp}, Array, Dtype};

/// The compressed keys C `[B, Hkv, n, d]` of the windows of `kernel` keys, `stride` apart, kept in
/// the cache and brought up to date with it (`None` while no window is complete).
pub fn compressed_keys(cache: &mut KvCache, kernel: usize, stride: usize) -> Result<Option<Array>> {
    cache.key_windows(kernel, stride, mean_of_windows)
}

/// C_c = mean(K[stride·c .. stride·c + kernel]) for `windows` consecutive windows of `span`
/// (summed in float32, stored in the keys' dtype as the reference stores them).
fn mean_of_windows(span: &Array, kernel: usize, stride: usize, windows: usize) -> Result<Array> {
    let s = span.shape();
    let (chunks, ratio) = (windows - 1 + kernel / stride, kernel / stride);
    // Sum each stride-long chunk, then add `ratio` neighbouring chunks per window.
    let sums = span
        .as_dtype(Dtype::Float32)?
        .reshape(&[s[0], s[1], chunks as i32, stride as i32, s[3]])?
        .sum_axis(3, false)?;
    let mut total = sums.try_index((.., .., 0..windows as i32, ..))?;
    for j in 1..ratio {
        total = total.add(sums.try_index((.., .., j as i32..(j + windows) as i32, ..))?)?;
    }
    total.multiply(scalar(1.0 / kernel as f32, Dtype::Float32)?)?.as_dtype(span.dtype())
}

/// Stage 1 (compressed-key relevance with the level-2 LSE), max-pooling to blocks, forced init
/// and local blocks, and the per-group top-k (exact ties: the lower block index wins): the
/// chosen blocks `[B, Hkv, T, topk]`. Queries are taken in chunks whose working memory stays
/// within [`SELECTION_CHUNK_BYTES`], at most two chunks in flight.
pub fn select_blocks(
    q: &Array,
    c1: &Array,
    c2: &Array,
    first_pos: usize,
    kv_len: usize,
    sel: &BlockSelection,
    score_dtype: Dtype,
) -> Result<Array> {
    let chunk = selection_chunk(q, c1, sel, score_dtype);
    Ok(select_blocks_chunked(q, c1, c2, first_pos, kv_len, sel, score_dtype, chunk, false)?.0)
}

/// Sums a KV group's stage-1 scores `[B, 1, T, windows]` (float32, before their rounding to the
/// score dtype) over the tensor-parallel ranks that hold its query heads, where the ranks
/// outnumber the KV heads (`TensorParallel::kv_heads`): the group shares one selection.
pub type GroupSum<'a> = &'a dyn Fn(&Array) -> Result<Array>;

/// [`select_blocks`] where this rank holds part of its KV head's query heads (`group_sum` adds the
/// other ranks' share of the scores): the MLX-ops form, whose scores can be summed before the
/// top-k; the pooled scores kept if `keep_scores`.
#[allow(clippy::too_many_arguments)]
pub fn select_blocks_across(
    q: &Array,
    c1: &Array,
    c2: &Array,
    first_pos: usize,
    kv_len: usize,
    sel: &BlockSelection,
    score_dtype: Dtype,
    group_sum: GroupSum,
    keep_scores: bool,
) -> Result<(Array, Option<Array>)> {
    let chunk = chunk_of_rows(q.shape()[1] as usize, c1);
    select_in_chunks(q, first_pos, chunk, keep_scores, |q, first_pos| select_blocks_summed(q, c1, c2, first_pos, kv_len, sel, score_dtype, Some(group_sum)))
}

/// [`select_blocks`] with the pooled block scores kept (for tracing and tests: at long context
/// and many queries they are the larger part of the result).
pub fn select_blocks_scored(
    q: &Array,
    c1: &Array,
    c2: &Array,
    first_pos: usize,
    kv_len: usize,
    sel: &BlockSelection,
    score_dtype: Dtype,
) -> Result<Selected> {
    let chunk = selection_chunk(q, c1, sel, score_dtype);
    let (blocks, scores) = select_blocks_chunked(q, c1, c2, first_pos, kv_len, sel, score_dtype, chunk, true)?;
    Ok(Selected { blocks, scores: scores.expect("kept") })
}

/// Working memory of one query chunk of the selection: the float32 stage-1 scores of every query
/// head and level-1 window, or for the tensor-core form only each KV head's window maxima and
/// pooled scores per block: 4096 queries a call up to a 1M context on the tensor-core form (1 GiB
/// at bf16 scores), whose launches then fill the GPU, and the 1M prompt's peak stays under 24 GB
/// (eval/results/kernel-notes.md).
const SELECTION_CHUNK_BYTES: usize = 1 << 30;

/// Queries per chunk of the selection, within [`SELECTION_CHUNK_BYTES`].
fn selection_chunk(q: &Array, c1: &Array, sel: &BlockSelection, score_dtype: Dtype) -> usize {
    let hkv = c1.shape()[1] as usize;
    let tensor_cores = selection_kernel(q, hkv as i32, sel) == Some(SelectionKernel::TensorCores);
    let bytes = selection_query_bytes(tensor_cores, q.shape()[1] as usize, hkv, c1.shape()[2] as usize, sel, crate::engine::memory::dtype_bytes(score_dtype));
    selection_chunk_queries(bytes)
}

/// Working memory of one query of the selection over `windows` level-1 windows: on tensor cores
/// each KV head's two window maxima per group of windows in the score type and its float32 pooled
/// score; otherwise a float32 stage-1 score per query head (`heads`) and window.
pub fn selection_query_bytes(tensor_cores: bool, heads: usize, kv_heads: usize, windows: usize, sel: &BlockSelection, score_bytes: usize) -> usize {
    if tensor_cores {
        (2 * score_bytes + 4) * kv_heads * sel.window_groups(windows).max(1)
    } else {
        4 * heads * windows.max(1)
    }
}

/// Queries per chunk of the selection when each takes `query_bytes`: within
/// [`SELECTION_CHUNK_BYTES`], at most two chunks in flight.
pub fn selection_chunk_queries(query_bytes: usize) -> usize {
    (SELECTION_CHUNK_BYTES / query_bytes.max(1)).clamp(16, 4096)
}

/// Queries per chunk when each holds `rows` float32 scores per level-1 window of `c1`.
fn chunk_of_rows(rows: usize, c1: &Array) -> usize {
    selection_chunk_queries(4 * rows * (c1.shape()[2] as usize).max(1))
}

/// The selection in chunks of `chunk` queries, at most two in flight: the blocks, and the scores
/// if `keep_scores` (otherwise dropped part by part). Public for the test that chunking changes
/// nothing.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn select_blocks_chunked(
    q: &Array,
    c1: &Array,
    c2: &Array,
    first_pos: usize,
    kv_len: usize,
    sel: &BlockSelection,
    score_dtype: Dtype,
    chunk: usize,
    keep_scores: bool,
) -> Result<(Array, Option<Array>)> {
    let kernel = selection_kernel(q, c1.shape()[1], sel);
    let one = |q: &Array, first_pos: usize| match kernel {
        Some(SelectionKernel::TensorCores) => sparse::select_blocks_fused(q, c1, c2, first_pos, kv_len, sel, score_dtype),
        Some(SelectionKernel::General) => sparse::select_blocks_gpu(q, c1, c2, first_pos, kv_len, sel, score_dtype),
        None => select_blocks_mlx(q, c1, c2, first_pos, kv_len, sel, score_dtype),
    };
    select_in_chunks(q, first_pos, chunk, keep_scores, one)
}

/// `one` over the queries of `q` in chunks of `chunk`, at most two in flight, joined.
fn select_in_chunks(q: &Array, first_pos: usize, chunk: usize, keep_scores: bool, one: impl Fn(&Array, usize) -> Result<Selected>) -> Result<(Array, Option<Array>)> {
    let t = q.shape()[2] as usize;
    if t <= chunk {
        let whole = one(q, first_pos)?;
        return Ok((whole.blocks, keep_scores.then_some(whole.scores)));
    }
    let mut pacer = Pacer::new(t);
    let (mut blocks, mut scores) = (Vec::new(), Vec::new());
    for start in (0..t).step_by(chunk) {
        let end = (start + chunk).min(t);
        let part = one(&q.try_index((.., .., start as i32..end as i32, ..))?, first_pos + start)?;
        pacer.step(|| vec![part.blocks.clone(), part.scores.clone()])?;
        blocks.push(part.blocks);
        if keep_scores {
            scores.push(part.scores);
        }
    }
    let blocks = ops::concatenate(&blocks, 2)?;
    // Scores not kept are freed as each part has run.
    let scores = if keep_scores { Some(ops::concatenate(&scores, 2)?) } else { None };
    Ok((blocks, scores))
}

/// The selection's kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SelectionKernel {
    /// `sparse::select_blocks_fused` (CUDA, stage 1 on tensor cores).
    TensorCores,
    /// `sparse::select_blocks_gpu`.
    General,
}

/// Which kernel selects the blocks of queries `q` over `hkv` KV heads: the tensor-core one where it
/// fits, else the general one, each once it has passed its self-check; `None`: the MLX-ops
/// version (the CPU, a batch of sequences, or both kernels switched off).
fn selection_kernel(q: &Array, hkv: i32, sel: &BlockSelection) -> Option<SelectionKernel> {
    if backend() == Backend::Cpu || q.shape()[0] != 1 {
        None
    } else if sparse::fused_stage1(q, hkv, sel) && selfcheck::enabled(&SELECT_MMA_CHECK) {
        Some(SelectionKernel::TensorCores)
    } else if selfcheck::enabled(&SELECT_CHECK) {
        Some(SelectionKernel::General)
    } else {
        None
    }
}

/// The kernels' self-checks whose oracles are here (the InfLLM-V2 math): `models::kernel_checks`
/// lists them with the kernels' own.
pub static KERNEL_CHECKS: [&KernelCheck; 7] =
    [&SELECT_CHECK, &SELECT_MMA_CHECK, &ATTENTION_CHECK, &PREFILL_CHECK, &DECODE_CHECK, &ATTENTION_Q8_CHECK, &PREFILL_Q8_CHECK];

/// The selection's general kernels against [`select_blocks_mlx`]: five queries over a short context
/// (one kernel), and one decoding query past `SPLIT_WINDOWS` level-1 windows and two chunks of
/// blocks (the split forms of the window scores and of the top-k).
pub static SELECT_CHECK: KernelCheck = KernelCheck { name: "select_blocks", backends: CUDA_AND_METAL, run: check_select };

/// The tensor-core stage 1 and the pooling kernel against [`select_blocks_mlx`] (bfloat16 queries
/// and keys): sixteen queries over a short context (d = 32 and 64: mma.sync, and wgmma on Hopper),
/// one decoding query over a long one.
pub static SELECT_MMA_CHECK: KernelCheck = KernelCheck { name: "select_blocks_mma", backends: CUDA_ONLY, run: check_select_mma };

/// Float32 queries (the general kernels also take them on CUDA).
fn check_select() -> Verdict {
    check_selection(Dtype::Float32, sparse::select_blocks_gpu)
}

fn check_select_mma() -> Verdict {
    check_selection(Dtype::Bfloat16, sparse::select_blocks_fused)
}

type SelectionFn = fn(&Array, &Array, &Array, usize, usize, &BlockSelection, Dtype) -> Result<Selected>;

/// `kernel` against [`select_blocks_mlx`] on queries in `dtype`, 4 heads over 2 KV heads;
/// the second head of each group is twice the first, and all values are multiples of 1/4, so the
/// scores are exact and their order the same in both (see `selfcheck::sample_quarters`).
fn check_selection(dtype: Dtype, kernel: SelectionFn) -> Verdict {
    let sel = BlockSelection { block: 64, kernel: 32, stride: 16, kernel2: 128, stride2: 64, init_blocks: 1, local_blocks: 2, topk: 6 };
    let hkv = 2;
    let windows = |len: usize, kernel: usize, stride: usize| ((len - kernel) / stride + 1) as i32;
    // (queries, context length, head size): a chunk of queries, and a decoding query with 8436
    // windows and 2110 blocks (the split forms of the window scores and of the top-k); bf16 also
    // a chunk at d = 64, which Hopper scores with wgmma.
    let chunk = if dtype == Dtype::Float32 { 5 } else { 16 };
    let cases: &[(i32, usize, i32)] =
        if dtype == Dtype::Float32 { &[(chunk, 1300, 32), (1, 135_000, 32)] } else { &[(chunk, 1300, 32), (chunk, 1300, 64), (1, 135_000, 32)] };
    for &(t, kv_len, d) in cases {
        let first = kv_len - t as usize;
        verify(
            || {
                let half = sample_quarters(&[1, hkv, 1, t, d], 71, Dtype::Float32)?;
                let q = ops::concatenate(&[&half, &half.multiply(Array::from_f32(2.0))?], 2)?.reshape(&[1, 2 * hkv, t, d])?.as_dtype(dtype)?;
                let c1 = sample_quarters(&[1, hkv, windows(kv_len, sel.kernel, sel.stride), d], 72, dtype)?;
                let c2 = sample_quarters(&[1, hkv, windows(kv_len, sel.kernel2, sel.stride2), d], 73, dtype)?;
                q.eval()?;
                Ok((q, c1, c2))
            },
            |(q, c1, c2)| {
                let got = kernel(q, c1, c2, first, kv_len, &sel, Dtype::Float32)?;
                Ok(vec![got.blocks, got.scores])
            },
            |(q, c1, c2)| {
                let want = select_blocks_mlx(q, c1, c2, first, kv_len, &sel, Dtype::Float32)?;
                Ok(vec![want.blocks, want.scores])
            },
        )
        .map_err(|reason| format!("{t} queries over {kv_len} tokens, d = {d}: {reason}"))?;
    }
    Ok(())
}

/// Stage 1, max-pooling, forced blocks and top-k as MLX operations: the CPU path of
/// [`select_blocks`] and the oracle of its kernels.
pub fn select_blocks_mlx(
    q: &Array,
    c1: &Array,
    c2: &Array,
    first_pos: usize,
    kv_len: usize,
    sel: &BlockSelection,
    score_dtype: Dtype,
) -> Result<Selected> {
    select_blocks_summed(q, c1, c2, first_pos, kv_len, sel, score_dtype, None)
}

/// [`select_blocks_mlx`], the group's scores summed over ranks by `group_sum` when given.
#[allow(clippy::too_many_arguments)]
fn select_blocks_summed(
    q: &Array,
    c1: &Array,
    c2: &Array,
    first_pos: usize,
    kv_len: usize,
    sel: &BlockSelection,
    score_dtype: Dtype,
    group_sum: Option<GroupSum>,
) -> Result<Selected> {
    let (b, hq, t, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let hkv = c1.shape()[1];
    let g = hq / hkv;
    let scale = (d as f32).powf(-0.5);
    let f32s = |x: f32| scalar(x, Dtype::Float32);
    let i32s = |x: i32| Array::from_int(x);

    // Query positions [T,1] and visibility of each compressed window (it must end at or before i).
    let pos = arange_i32(first_pos, t as usize)?.reshape(&[-1, 1])?;
    let visible = |n: i32, kernel: usize, stride: usize| -> Result<Array> {
        let ends = arange_i32(0, n as usize)?
            .multiply(i32s(stride as i32))?
            .add(i32s(kernel as i32 - 1))?
            .reshape(&[1, -1])?;
        ends.le(&pos) // [T, n]
    };
    let n1 = c1.shape()[2];
    let n2 = c2.shape()[2];
    let qg = q.as_dtype(Dtype::Float32)?.reshape(&[b, hkv, g, t, d])?;
    let dot = |c: &Array| -> Result<Array> {
        let ct = c.as_dtype(Dtype::Float32)?.swap_axes(2, 3)?.reshape(&[b, hkv, 1, d, -1])?;
        qg.matmul(ct)?.multiply(f32s(scale)?)
    };
    let neg_inf = f32s(f32::NEG_INFINITY)?;

    let vis2 = visible(n2, sel.kernel2, sel.stride2)?;
    let lse = ops::select(&vis2, dot(c2)?, &neg_inf)?.logsumexp_axis(-1, true)?; // [B,Hkv,G,T,1]
    let vis1 = visible(n1, sel.kernel, sel.stride)?;
    let p = dot(c1)?.subtract(&lse)?.exp()?;
    // Rows without any visible level-2 key score 0 (the kernel exits early there).
    let has_lse = lse.is_finite()?;
    let p = ops::select(vis1.logical_and(&has_lse)?, p, f32s(0.0)?)?;
    let score = p.sum_axis(2, false)?; // [B,Hkv,T,n1]
    let score = match group_sum {
        Some(sum) => sum(&score)?,
        None => score,
    };
    let score = ops::select(score.is_nan()?, f32s(0.0)?, &score)?.as_dtype(score_dtype)?.as_dtype(Dtype::Float32)?;

    // Max-pool level-1 windows onto blocks: window c overlaps block b iff r·b − (k/s − 1) ≤ c ≤ r·b + r − 1.
    let r = (sel.block / sel.stride) as i32;
    let left = (sel.kernel / sel.stride) as i32 - 1;
    let width = r + left;
    let nb = kv_len.div_ceil(sel.block) as i32;
    let right = (r * nb + width - left - n1).max(0);
    let padded = ops::pad(&score, &[(0, 0), (0, 0), (0, 0), (left, right)], Some(neg_inf.clone()), None)?;
    let mut pooled: Option<Array> = None;
    for o in 0..width {
        let strided = padded.try_index((.., .., .., (o..o + r * nb).stride_by(r)))?;
        pooled = Some(match pooled {
            None => strided,
            Some(m) => ops::maximum(&m, &strided)?,
        });
    }
    let pooled = pooled.expect("pooling width is at least 1");

    // Forced blocks: b < init_blocks, or qb − local ≤ b ≤ qb.
    let blk = arange_i32(0, nb as usize)?.reshape(&[1, -1])?;
    let qb = pos.floor_divide(i32s(sel.block as i32))?;
    let forced = blk
        .lt(i32s(sel.init_blocks as i32))?
        .logical_or(blk.ge(qb.subtract(i32s(sel.local_blocks as i32))?)?.logical_and(blk.le(&qb)?)?)?;
    let scores = ops::select(&forced, f32s(f32::INFINITY)?, &pooled)?; // [B,Hkv,T,nb]

    // Top-k with ties to the lower index: sort on a u64 key (order-preserving score bits above,
    // reversed block index below). Scores are −inf, or in [0, +inf].
    let k = (sel.topk as i32).min(nb);
    let bits = scores.view::<u32>()?.as_dtype(Dtype::Uint64)?;
    let ordered = ops::select(
        scores.eq(&neg_inf)?,
        Array::from_slice(&[0u64], &[1]),
        bits.add(Array::from_slice(&[1u64], &[1]))?,
    )?;
    let low = Array::from_slice(&[u32::MAX as u64], &[1]).subtract(blk.as_dtype(Dtype::Uint64)?)?;
    let key = ordered.multiply(Array::from_slice(&[1u64 << 32], &[1]))?.add(&low)?;
    let top = ops::indexing::topk_axis(&key, k, -1)?;
    let chosen = Array::from_slice(&[u32::MAX as u64], &[1])
        .subtract(top.remainder(Array::from_slice(&[1u64 << 32], &[1]))?)?
        .as_dtype(Dtype::Int32)?;
    let chosen = ops::sort_axis(&chosen, -1)?;
    // Blocks after the query's own block are dropped; pad to `topk` columns with −1.
    let mut blocks = ops::select(chosen.gt(qb.reshape(&[1, 1, -1, 1])?)?, i32s(-1), &chosen)?;
    if (k as usize) < sel.topk {
        blocks = ops::pad(&blocks, &[(0, 0), (0, 0), (0, 0), (0, sel.topk as i32 - k)], Some(i32s(-1)), None)?;
    }
    Ok(Selected { blocks, scores })
}

/// Softmax attention of each query over its group's selected blocks, causally clipped to
/// positions ≤ the query's own. `kv`: the cache's keys and values as stored (history buffers
/// with spare capacity, then recent tokens), read in place; `blocks`: `[B, Hkv, T, K]` (−1 = none).
/// Returns the heads side by side, `[B, T, Hq·d]`, times σ(`gate`) `[B, T, Hq·d]` when given (see
/// `heads_to_rows`; the kernels' merge of their splits applies it).
#[allow(clippy::too_many_arguments)]
pub fn block_sparse_attention(
    q: &Array,
    kv: &KvParts,
    blocks: &Array,
    first_pos: usize,
    block: usize,
    scale: f32,
    gate: Option<&Array>,
) -> Result<Array> {
    let hkv = kv.keys.shape()[1];
    let kernel_fits = backend() != Backend::Cpu && q.shape()[0] == 1 && sparse::attention_kernel_fits(q, hkv);
    if kernel_fits && sparse::reads_codes_in_place(kv) {
        // An 8-bit cache read in place: its codes are never copied out whole (a 1M-token layer's
        // rows would be 1 GiB a step), and the checks compare these kernels with dequantized rows.
        if sparse::prefill_fits(q, hkv, block, blocks, kv) && selfcheck::enabled(&PREFILL_Q8_CHECK) {
            return heads_to_rows(&sparse::block_sparse_prefill_cuda(q, kv, blocks, first_pos, block, scale)?, gate);
        }
        if selfcheck::enabled(&ATTENTION_Q8_CHECK) {
            return sparse::block_sparse_attention_gpu(q, kv, blocks, first_pos, block, scale, gate);
        }
    }
    let rows;
    let kv = if kv.scales.is_some() && kernel_fits {
        rows = kv.dequantized()?;
        &rows
    } else {
        kv
    };
    if kernel_fits && sparse::prefill_fits(q, hkv, block, blocks, kv) && selfcheck::enabled(&PREFILL_CHECK) {
        return heads_to_rows(&sparse::block_sparse_prefill_cuda(q, kv, blocks, first_pos, block, scale)?, gate);
    }
    if kernel_fits && sparse::block_sparse_decode_fits(q, kv, first_pos, block) && selfcheck::enabled(&DECODE_CHECK) {
        return sparse::block_sparse_decode_cuda(q, kv, blocks, scale, gate);
    }
    if kernel_fits && selfcheck::enabled(&ATTENTION_CHECK) {
        return sparse::block_sparse_attention_gpu(q, kv, blocks, first_pos, block, scale, gate);
    }
    let (k, v) = kv.filled()?;
    heads_to_rows(&block_sparse_attention_mlx(q, &k, &v, blocks, first_pos, block, scale)?, gate)
}

/// The general attention kernel against [`block_sparse_attention_mlx`] in bfloat16: one decoding
/// query with the output gate over a cache whose last tokens are in a recent-token buffer, and five
/// queries over one history buffer.
pub static ATTENTION_CHECK: KernelCheck = KernelCheck { name: "block_sparse_attention", backends: CUDA_AND_METAL, run: check_attention };

/// The tensor-core prefill kernel likewise, for sixteen queries.
pub static PREFILL_CHECK: KernelCheck = KernelCheck { name: "block_sparse_prefill", backends: CUDA_ONLY, run: check_prefill };

/// The tensor-core decode kernel over a block list likewise, for one gated decoding query.
pub static DECODE_CHECK: KernelCheck = KernelCheck { name: "block_sparse_decode", backends: CUDA_ONLY, run: check_decode };

/// The general kernel and the prefill kernel over an 8-bit cache's codes likewise, against
/// [`block_sparse_attention_mlx`] over the rows dequantized.
pub static ATTENTION_Q8_CHECK: KernelCheck = KernelCheck { name: "block_sparse_attention_q8", backends: CUDA_ONLY, run: check_attention_q8 };

/// See [`ATTENTION_Q8_CHECK`].
pub static PREFILL_Q8_CHECK: KernelCheck = KernelCheck { name: "block_sparse_prefill_q8", backends: CUDA_ONLY, run: check_prefill_q8 };

fn check_decode() -> Verdict {
    check_sparse_attention(1, true, 280, false, |q, kv, blocks, _first, scale, gate| sparse::block_sparse_decode_cuda(q, kv, blocks, scale, gate))
}

fn check_attention() -> Verdict {
    check_general_attention(false)
}

fn check_attention_q8() -> Verdict {
    check_general_attention(true)
}

fn check_general_attention(quantized: bool) -> Verdict {
    let general: AttentionFn = |q, kv, blocks, first, scale, gate| sparse::block_sparse_attention_gpu(q, kv, blocks, first, 64, scale, gate);
    check_sparse_attention(1, true, 280, quantized, general)?;
    check_sparse_attention(5, false, 300, quantized, general)
}

fn check_prefill() -> Verdict {
    check_prefill_kernel(false)
}

fn check_prefill_q8() -> Verdict {
    check_prefill_kernel(true)
}

fn check_prefill_kernel(quantized: bool) -> Verdict {
    check_sparse_attention(16, true, 290, quantized, |q, kv, blocks, first, scale, gate| {
        heads_to_rows(&sparse::block_sparse_prefill_cuda(q, kv, blocks, first, 64, scale)?, gate)
    })
}

type AttentionFn = fn(&Array, &KvParts, &Array, usize, f32, Option<&Array>) -> Result<Array>;

/// `kernel` against [`block_sparse_attention_mlx`] for `t` bfloat16 queries at the end of 300
/// tokens (4 heads over 2 KV heads, d = 32, 64-token blocks), the first `settled` in a history
/// buffer and the rest in a recent-token buffer, both with junk past what they hold; each query
/// attends to blocks 0, 2, 4 (KV head 0) or 1, 3, 4 (KV head 1), then none (−1). `quantized`:
/// the buffers as an 8-bit cache holds them (codes, scales and biases in groups of 32).
fn check_sparse_attention(t: i32, gated: bool, settled: usize, quantized: bool, kernel: AttentionFn) -> Verdict {
    let (hq, hkv, d, len) = (4, 2, 32, 300usize);
    let first = len - t as usize;
    let scale = (d as f32).powf(-0.5);
    let bf16 = Dtype::Bfloat16;
    verify(
        || {
            let q = sample(&[1, hq, t, d], 81, bf16)?;
            let gate_rows = sample(&[1, t, 2 * hq * d], 82, bf16)?;
            // Each buffer with 20 positions of junk after what it holds.
            let buffer = |seed: u64, positions: usize| sample(&[1, hkv, positions as i32 + 20, d], seed, bf16);
            let (k, v, kr, vr) = (buffer(83, settled)?, buffer(84, settled)?, buffer(85, len - settled)?, buffer(86, len - settled)?);
            let per_head: Vec<i32> = [[0, 2, 4, -1], [1, 3, 4, -1]].iter().flat_map(|b| b.repeat(t as usize)).collect();
            let blocks = Array::from_slice(&per_head, &[1, hkv, t, 4]);
            Ok((q, gate_rows, k, v, kr, vr, blocks))
        },
        |(q, gate_rows, k, v, kr, vr, blocks)| {
            let gate = gated.then(|| gate_rows.try_index((.., .., hq * d..))).transpose()?;
            let kv = sparse::check_kv_parts([k, v, kr, vr], settled, len, quantized)?;
            Ok(vec![kernel(q, &kv, blocks, first, scale, gate.as_ref())?])
        },
        |(q, gate_rows, k, v, kr, vr, blocks)| {
            let gate = gated.then(|| gate_rows.try_index((.., .., hq * d..))).transpose()?;
            let kv = sparse::check_kv_parts([k, v, kr, vr], settled, len, quantized)?;
            let (k, v) = kv.filled()?;
            Ok(vec![heads_to_rows(&block_sparse_attention_mlx(q, &k, &v, blocks, first, 64, scale)?, gate.as_ref())?])
        },
    )
    .map_err(|reason| format!("{t} queries: {reason}"))
}

/// Queries per piece of [`block_sparse_attention_mlx`] (the 9B's gathered keys and values of
/// 128 queries: 1.1 GB in float32).
pub const GATHER_QUERIES: i32 = 128;

/// The MLX-ops version of [`block_sparse_attention`], over filled keys/values `[B, Hkv, L, d]`.
pub fn block_sparse_attention_mlx(
    q: &Array,
    k: &Array,
    v: &Array,
    blocks: &Array,
    first_pos: usize,
    block: usize,
    scale: f32,
) -> Result<Array> {
    let (b, hq, t, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    if t > GATHER_QUERIES {
        // The gathered keys and values take [B, Hkv, T, blocks·block, d] floats: bound T. Lazily
        // built pieces would all be gathered before any is reduced (a 4096-token step of the 9B:
        // 34 GB), so at most two are in flight.
        let mut outputs = Vec::new();
        let mut pacer = Pacer::new(t as usize);
        for start in (0..t).step_by(GATHER_QUERIES as usize) {
            let end = (start + GATHER_QUERIES).min(t);
            let (qs, bs) = (q.try_index((.., .., start..end, ..))?, blocks.try_index((.., .., start..end, ..))?);
            let piece = block_sparse_attention_mlx(&qs, k, v, &bs, first_pos + start as usize, block, scale)?;
            pacer.step(|| vec![piece.clone()])?;
            outputs.push(piece);
        }
        return ops::concatenate(&outputs, 2);
    }
    let (hkv, kv_len) = (k.shape()[1], k.shape()[2]);
    let g = hq / hkv;
    let nsel = blocks.shape()[3];
    let s = nsel * block as i32;
    let i32s = |x: i32| Array::from_int(x);

    // Token positions of the selected blocks [B,Hkv,T,S] and which of them may be attended.
    let offsets = arange_i32(0, block)?.reshape(&[1, 1, 1, 1, -1])?;
    let tok = blocks.expand_dims(-1)?.multiply(i32s(block as i32))?.add(&offsets)?.reshape(&[b, hkv, t, s])?;
    let pos = arange_i32(first_pos, t as usize)?.reshape(&[1, 1, -1, 1])?;
    let valid = blocks
        .expand_dims(-1)?
        .ge(i32s(0))?
        .reshape(&[b, hkv, t, nsel, 1])?;
    let valid = ops::broadcast_to(&valid, &[b, hkv, t, nsel, block as i32])?
        .reshape(&[b, hkv, t, s])?
        .logical_and(tok.le(&pos)?)?
        .logical_and(tok.lt(i32s(kv_len))?)?;
    let tok = ops::clip(&tok, (i32s(0), i32s(kv_len - 1)))?;

    let gather = |x: &Array| -> Result<Array> {
        let idx = tok.reshape(&[b, hkv, t * s, 1])?;
        x.take_along_axis(&idx, 2)?.reshape(&[b, hkv, t, s, d])
    };
    let kg = gather(&k.as_dtype(Dtype::Float32)?)?;
    let vg = gather(&v.as_dtype(Dtype::Float32)?)?;
    let qg = q.as_dtype(Dtype::Float32)?.reshape(&[b, hkv, g, t, d])?.swap_axes(2, 3)?; // [B,Hkv,T,G,d]
    let logits = qg.matmul(kg.swap_axes(3, 4)?)?.multiply(scalar(scale, Dtype::Float32)?)?; // [B,Hkv,T,G,S]
    let logits = ops::select(
        valid.reshape(&[b, hkv, t, 1, s])?,
        logits,
        scalar(f32::NEG_INFINITY, Dtype::Float32)?,
    )?;
    let probs = ops::softmax_axis(&logits, -1, None)?;
    let out = probs.matmul(&vg)?; // [B,Hkv,T,G,d]
    out.swap_axes(2, 3)?.reshape(&[b, hq, t, d])?.as_dtype(q.dtype())
}
