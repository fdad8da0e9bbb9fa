//! InfLLM-V2 block selection and block-sparse attention on the GPU (`cuda/select_blocks.cu`,
//! `cuda/block_sparse_attention.cu` and their Metal twins; `cuda/select_mma.cu` (bf16 stage 1)
//! and `cuda/block_sparse_prefill.cu` (prefill attention), the tensor-core forms on CUDA, have no
//! Metal twins: Metal runs the general kernels there), and dense decode attention. Their MLX-ops
//! versions, the CPU path and test oracle, are `models::sala::infllm` (the math as in the paper).
//!
//! Shapes: queries `[B, Hq, T, d]` at absolute positions `first_pos ..`, keys/values
//! `[B, Hkv, L, d]`, level-1/level-2 compressed keys `[B, Hkv, n, d]`. The `Hq / Hkv` query heads of
//! a KV group share one block selection.

use super::custom::{
    apply, backend, device_counts, hopper, in_pieces, pow2_floor, shape_args, slot_source, with_setting, Backend, KernelSource, Launch, SlotKernel, TemplateArg,
    MAX_SHAPE_ARGS,
};
use super::selfcheck::{self, sample, verify, KernelCheck, Verdict, CUDA_ONLY};
use crate::engine::cache::{KvParts, KvScales, StepCounts};
use crate::engine::device;
use mlx_rs::{error::Result, ops, ops::indexing::TryIndexOp, Array, Dtype};

/// Geometry of the block selection.
#[derive(Debug, Clone, Copy)]
pub struct BlockSelection {
    /// Tokens per selectable block (64).
    pub block: usize,
    /// Level-1 compression window and stride (32, 16).
    pub kernel: usize,
    pub stride: usize,
    /// Level-2 compression window and stride (128, 64).
    pub kernel2: usize,
    pub stride2: usize,
    /// Always-selected leading blocks (1).
    pub init_blocks: usize,
    /// Always-selected blocks before the query's own block (window / block = 32).
    pub local_blocks: usize,
    /// Blocks per query in total (topk + local_blocks = 96).
    pub topk: usize,
}

impl BlockSelection {
    /// Groups of the level-1 windows that start in one block, among `windows`: the tensor-core
    /// stage 1 keeps two numbers a group (`SalaWindowMaxima` in cuda/select_blocks.cu).
    pub fn window_groups(&self, windows: usize) -> usize {
        windows.div_ceil(self.block / self.stride)
    }
}

/// The chosen blocks per KV head and query: `[B, Hkv, T, topk]` int32, ascending, −1 = none,
/// and the pooled block scores fed to top-k `[B, Hkv, T, n_blocks]` (float32, ±inf for
/// forced/absent blocks).
pub struct Selected {
    pub blocks: Array,
    pub scores: Array,
}

/// Whether the tensor-core stage 1 of the selection (`cuda/select_mma.cu`, [`select_blocks_fused`])
/// takes these queries: CUDA, bf16 queries, at most 16 query heads per KV head, and InfLLM-V2's
/// window geometry (windows twice their stride, 2, 4 or 8 starting in a block), for which it
/// keeps only each block's window maxima.
pub fn fused_stage1(q: &Array, hkv: i32, sel: &BlockSelection) -> bool {
    let (hq, d) = (q.shape()[1], q.shape()[3]);
    backend() == Backend::Cuda
        && sel.kernel == 2 * sel.stride
        && sel.block.is_multiple_of(sel.stride)
        && matches!(sel.block / sel.stride, 2 | 4 | 8)
        && q.shape()[0] == 1
        && q.dtype() == Dtype::Bfloat16
        && hq / hkv <= 16
        && d % 32 == 0
        && d <= 128
}

/// An attention output `[B, Hq, T, d]` as the output projection reads it, `[B, T, Hq·d]`, times
/// σ(`gate`) (`[B, T, Hq·d]`, the sparse layers' output gate) when given: MLX operations, the
/// kernels' reference.
pub fn heads_to_rows(o: &Array, gate: Option<&Array>) -> Result<Array> {
    let (b, hq, t, d) = (o.shape()[0], o.shape()[1], o.shape()[2], o.shape()[3]);
    let rows = o.swap_axes(1, 2)?.reshape(&[b, t, hq * d])?;
    match gate {
        Some(gate) => rows.multiply(ops::sigmoid(gate)?),
        None => Ok(rows),
    }
}

static SELECT_BLOCKS: KernelSource = KernelSource {
    name: "sala_select_blocks",
    inputs: &["l1", "l2", "params"],
    outputs: &["blocks", "scores", "window_scores"],
    cuda_header: include_str!("../../cuda/select_blocks.cu"),
    cuda_body: "sala_select_blocks<R, G, KERNEL, STRIDE, KERNEL2, STRIDE2, BLOCK, INIT, LOCAL, TOPK, SCALE_BITS>(\
                l1, l2, params_shape[0] - 1, params_shape[1] - 1, blocks, scores, window_scores, l1_shape[1] / G, \
                l1_shape[2], l2_shape[2]);",
    metal_header: include_str!("../../metal/select_blocks.metal"),
    metal_body: "threadgroup float lse[G]; threadgroup atomic_uint hist[256]; threadgroup ulong prefix; \
                 threadgroup int remaining; threadgroup int warp_counts[32]; \
                 sala_select_blocks<R, G, KERNEL, STRIDE, KERNEL2, STRIDE2, BLOCK, INIT, LOCAL, TOPK, SCALE_BITS>(\
                 l1, l2, int(params_shape[0]) - 1, int(params_shape[1]) - 1, blocks, scores, window_scores, \
                 int(l1_shape[1]) / G, int(l1_shape[2]), \
                 int(l2_shape[2]), threadgroup_position_in_grid, thread_index_in_threadgroup, \
                 threads_per_threadgroup.x, thread_index_in_simdgroup, simdgroup_index_in_threadgroup, \
                 lse, hist, &prefix, &remaining, warp_counts);",
    // `params` is a shape_args broadcast; the other inputs are made contiguous by the caller.
    contiguous_inputs: false,
    shared_memory: 0,
};

static SELECT_WINDOWS: KernelSource = KernelSource {
    name: "sala_select_windows",
    inputs: &["l1", "l2", "params"],
    outputs: &["window_scores"],
    cuda_header: include_str!("../../cuda/select_blocks.cu"),
    cuda_body: "sala_select_windows<R, G, KERNEL, STRIDE, KERNEL2, STRIDE2, SCALE_BITS, CHUNK>(\
                l1, l2, params_shape[0] - 1, window_scores, l1_shape[2], l2_shape[2]);",
    metal_header: include_str!("../../metal/select_blocks.metal"),
    metal_body: "threadgroup float lse[G]; \
                 sala_select_windows<R, G, KERNEL, STRIDE, KERNEL2, STRIDE2, SCALE_BITS, CHUNK>(\
                 l1, l2, int(params_shape[0]) - 1, window_scores, int(l1_shape[2]), int(l2_shape[2]), \
                 threadgroup_position_in_grid, thread_index_in_threadgroup, threads_per_threadgroup.x, \
                 thread_index_in_simdgroup, simdgroup_index_in_threadgroup, lse);",
    contiguous_inputs: false,
    shared_memory: 0,
};

static SELECT_TOPK: KernelSource = KernelSource {
    name: "sala_select_topk",
    inputs: &["window_scores", "params"],
    outputs: &["blocks", "scores"],
    cuda_header: include_str!("../../cuda/select_blocks.cu"),
    cuda_body: "sala_select_topk<KERNEL, STRIDE, BLOCK, INIT, LOCAL, TOPK, CANDIDATES, MAXIMA>(\
                window_scores, params_shape[0] - 1, params_shape[1] - 1, blocks, scores, window_scores_shape[2]);",
    metal_header: include_str!("../../metal/select_blocks.metal"),
    metal_body: "threadgroup atomic_uint hist[256]; threadgroup ulong prefix; threadgroup int remaining; \
                 threadgroup int warp_counts[32]; \
                 sala_select_topk<KERNEL, STRIDE, BLOCK, INIT, LOCAL, TOPK>(\
                 window_scores, int(params_shape[0]) - 1, int(params_shape[1]) - 1, blocks, scores, \
                 int(window_scores_shape[2]), threadgroup_position_in_grid, thread_index_in_threadgroup, \
                 threads_per_threadgroup.x, thread_index_in_simdgroup, simdgroup_index_in_threadgroup, \
                 hist, &prefix, &remaining, warp_counts);",
    contiguous_inputs: false,
    shared_memory: 0,
};

static SELECT_TOPK_CHUNK: KernelSource = KernelSource {
    name: "sala_select_topk_chunk",
    inputs: &["window_scores", "params"],
    outputs: &["candidates", "scores"],
    cuda_header: include_str!("../../cuda/select_blocks.cu"),
    cuda_body: "sala_select_topk_chunk<KERNEL, STRIDE, BLOCK, INIT, LOCAL, TOPK, CHUNK, HELD, MAXIMA>(\
                window_scores, params_shape[0] - 1, params_shape[1] - 1, \
                reinterpret_cast<unsigned long long*>(candidates), scores, window_scores_shape[2]);",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: false,
    shared_memory: 0,
};

static SELECT_TOPK_MERGE: KernelSource = KernelSource {
    name: "sala_select_topk_merge",
    inputs: &["candidates", "params"],
    outputs: &["blocks"],
    cuda_header: include_str!("../../cuda/select_blocks.cu"),
    cuda_body: "sala_select_topk_merge<BLOCK, TOPK, HELD>(\
                reinterpret_cast<const unsigned long long*>(candidates), params_shape[0] - 1, params_shape[1] - 1, \
                blocks, candidates_shape[2] / 2);",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: false,
    shared_memory: 0,
};

/// Threads per thread block of the sparse kernels.
const THREADS: i32 = 256;
/// Compute units assumed where the device does not say how many it has.
const DEFAULT_COMPUTE_UNITS: u32 = 64;

/// Thread blocks that fill the GPU: two per compute unit (streaming multiprocessor, GPU core).
fn fill_blocks() -> i32 {
    2 * device::gpu_compute_units().unwrap_or(DEFAULT_COMPUTE_UNITS) as i32
}

/// The selection's general kernels (one query chunk of `models::sala::infllm::select_blocks`, which
/// picks between them, [`select_blocks_fused`] and its MLX-ops version).
pub fn select_blocks_gpu(
    q: &Array,
    c1: &Array,
    c2: &Array,
    first_pos: usize,
    kv_len: usize,
    sel: &BlockSelection,
    score_dtype: Dtype,
) -> Result<Selected> {
    let (hq, t, d) = (q.shape()[1], q.shape()[2], q.shape()[3]);
    let hkv = c1.shape()[1];
    let g = hq / hkv;
    let scale_bits = (d as f32).powf(-0.5).to_bits() as i32;
    // Both score products as float32 matrix products, one per KV group: [Hkv, G·T, n] (the
    // kernel applies the scale).
    let qg = q.as_dtype(Dtype::Float32)?.reshape(&[hkv, g * t, d])?;
    let dot = |c: &Array| -> Result<Array> {
        let ct = c.as_dtype(Dtype::Float32)?.reshape(&[hkv, -1, d])?.swap_axes(1, 2)?;
        qg.matmul(ct)
    };
    let (l1, l2) = (dot(c1)?.contiguous()?, dot(c2)?.contiguous()?);
    let n1 = c1.shape()[2];
    let nb = kv_len.div_ceil(sel.block) as i32;
    let int = |v: usize| TemplateArg::Int(v as i32);
    let template = vec![
        ("R", TemplateArg::Type(score_dtype)),
        ("G", TemplateArg::Int(g)),
        ("KERNEL", int(sel.kernel)),
        ("STRIDE", int(sel.stride)),
        ("KERNEL2", int(sel.kernel2)),
        ("STRIDE2", int(sel.stride2)),
        ("BLOCK", int(sel.block)),
        ("INIT", int(sel.init_blocks)),
        ("LOCAL", int(sel.local_blocks)),
        ("TOPK", int(sel.topk)),
        // Scales as bit patterns: compile-time constants, no upload per call.
        ("SCALE_BITS", TemplateArg::Int(scale_bits)),
    ];
    let params = shape_args(&[first_pos, nb as usize])?;
    if t == 1 && n1 >= SPLIT_WINDOWS {
        return select_blocks_decode(&l1, &l2, &params, nb, hkv, sel, template);
    }
    let out = apply(
        &SELECT_BLOCKS,
        &[&l1, &l2, &params],
        Launch {
            grid: (THREADS, t, hkv),
            threads: (THREADS, 1, 1),
            outputs: vec![
                (vec![1, hkv, t, sel.topk as i32], Dtype::Int32),
                (vec![1, hkv, t, nb], Dtype::Float32),
                (vec![hkv, t, n1], Dtype::Float32),
            ],
            template,
            init: None,
        },
    )?;
    let mut out = out.into_iter();
    let (blocks, scores) = (out.next().expect("3 outputs"), out.next().expect("3 outputs"));
    Ok(Selected { blocks, scores })
}

/// Level-1 windows from which one decoding query's selection runs as two kernels: the window
/// scores spread over many thread blocks, then pooling and top-k (one thread block per KV head
/// slows down as the context grows: eval/results/kernel-notes.md).
const SPLIT_WINDOWS: i32 = 2048;
/// Level-1 windows per thread block of the split form's first kernel.
const WINDOWS_PER_BLOCK: i32 = 512;

/// [`select_blocks_gpu`]'s two-kernel form for one query; the same blocks and scores.
fn select_blocks_decode(
    l1: &Array,
    l2: &Array,
    params: &Array,
    nb: i32,
    hkv: i32,
    sel: &BlockSelection,
    template: Vec<(&'static str, TemplateArg)>,
) -> Result<Selected> {
    let n1 = l1.shape()[2];
    let pick = |names: &[&str]| template.iter().filter(|(n, _)| names.contains(n)).cloned().collect::<Vec<_>>();
    let mut windows_template = pick(&["R", "G", "KERNEL", "STRIDE", "KERNEL2", "STRIDE2", "SCALE_BITS"]);
    windows_template.push(("CHUNK", TemplateArg::Int(WINDOWS_PER_BLOCK)));
    let window_scores = apply(
        &SELECT_WINDOWS,
        &[l1, l2, params],
        Launch {
            grid: (THREADS, (n1 + WINDOWS_PER_BLOCK - 1) / WINDOWS_PER_BLOCK, hkv),
            threads: (THREADS, 1, 1),
            outputs: vec![(vec![hkv, 1, n1], Dtype::Float32)],
            template: windows_template,
            init: None,
        },
    )?
    .into_iter()
    .next()
    .expect("one output");
    pool_topk(&window_scores, false, params, nb, sel)
}

/// Blocks per thread block of [`pool_topk_in_chunks`]'s first kernel.
const TOPK_CHUNK: i32 = 512;
/// Blocks past which one query's top-k runs in chunks (128K tokens): not swept below it
/// (eval/results/kernel-notes.md).
const TOPK_CHUNKED_PAST: i32 = 2048;
/// Keys a thread of [`pool_topk_in_chunks`] keeps in registers: a whole chunk at [`THREADS`]
/// threads in the first kernel, the candidates of 42 chunks (1.3M tokens) at 1024 in the second.
const TOPK_CHUNK_HELD: i32 = TOPK_CHUNK / THREADS;
const TOPK_MERGE_HELD: i32 = 4;

/// Pooling and top-k from the window scores `[Hkv, T, n1]` (float32), or with `maxima` from the
/// tensor-core stage 1's window maxima `[Hkv, T, 2·groups]` (`SalaWindowMaxima` in
/// cuda/select_blocks.cu, in the score type; CUDA only): `sala_select_topk`, one thread block
/// per query and KV head, the second kernel of both split forms. On CUDA few queries over many
/// blocks (decode at long context) take [`pool_topk_in_chunks`]; a prompt chunk's many queries
/// fill the GPU as they are, and one block a query was faster than the chunks up to 1M tokens.
fn pool_topk(window_scores: &Array, maxima: bool, params: &Array, nb: i32, sel: &BlockSelection) -> Result<Selected> {
    let (hkv, t) = (window_scores.shape()[0], window_scores.shape()[1]);
    // Few queries (decode) leave most of the GPU idle: give each thread block more threads (on
    // CUDA; Metal's limit per threadgroup depends on the kernel), or past 128K tokens split the
    // blocks over thread blocks.
    let cuda = backend() == Backend::Cuda;
    let few = cuda && t * hkv < fill_blocks() / 2;
    let in_chunks = TOPK_IN_CHUNKS.with(|o| o.get()).unwrap_or(false);
    if cuda && nb > TOPK_CHUNKED_PAST && (few || in_chunks) {
        return pool_topk_in_chunks(window_scores, maxima, params, nb, sel);
    }
    let threads = if few { 1024 } else { THREADS };
    let mut template = pooling_template(sel);
    if cuda {
        let candidates = TOPK_CANDIDATES_OVERRIDE.with(|o| o.get()).unwrap_or(TOPK_CANDIDATES);
        template.extend([("CANDIDATES", TemplateArg::Int(candidates)), ("MAXIMA", TemplateArg::Bool(maxima))]);
    }
    let out = apply(
        &SELECT_TOPK,
        &[window_scores, params],
        Launch {
            grid: (threads, t, hkv),
            threads: (threads, 1, 1),
            outputs: vec![(vec![1, hkv, t, sel.topk as i32], Dtype::Int32), (vec![1, hkv, t, nb], Dtype::Float32)],
            template,
            init: None,
        },
    )?;
    let mut out = out.into_iter();
    Ok(Selected { blocks: out.next().expect("2 outputs"), scores: out.next().expect("2 outputs") })
}

thread_local! {
    static TOPK_IN_CHUNKS: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
    static TOPK_CANDIDATES_OVERRIDE: std::cell::Cell<Option<i32>> = const { std::cell::Cell::new(None) };
}

/// Keys of a query's top-k past 4 blocks a thread kept in shared memory (`CANDIDATES` of
/// `sala_topk_from_candidates` in cuda/select_blocks.cu): those at or above the k-th largest of the
/// threads' largest keys, about 120 of 16,384 at 1M for independent scores (by their order
/// statistics); where more pass, the top-k falls back to every key.
const TOPK_CANDIDATES: i32 = 1024;

/// Runs `f` with the top-k's candidates in shared memory capped at `n` (0: every key takes the
/// radix passes, the form before the candidates), for the kernels bench and the GPU test that
/// cross-checks the forms and the fallback.
#[doc(hidden)]
pub fn with_topk_candidates<R>(n: i32, f: impl FnOnce() -> R) -> R {
    with_setting(&TOPK_CANDIDATES_OVERRIDE, Some(n), f)
}

/// Runs `f` with many queries' pooling and top-k in chunks past [`TOPK_CHUNKED_PAST`] blocks, as
/// decode takes it, for the kernels bench's comparison and the GPU test that cross-checks the forms.
#[doc(hidden)]
pub fn with_topk_in_chunks<R>(f: impl FnOnce() -> R) -> R {
    with_setting(&TOPK_IN_CHUNKS, Some(true), f)
}

/// The template arguments of the pooling and top-k kernels: the selection's geometry.
fn pooling_template(sel: &BlockSelection) -> Vec<(&'static str, TemplateArg)> {
    let int = |v: usize| TemplateArg::Int(v as i32);
    vec![
        ("KERNEL", int(sel.kernel)),
        ("STRIDE", int(sel.stride)),
        ("BLOCK", int(sel.block)),
        ("INIT", int(sel.init_blocks)),
        ("LOCAL", int(sel.local_blocks)),
        ("TOPK", int(sel.topk)),
    ]
}

/// [`pool_topk`] over [`TOPK_CHUNK`]-block chunks, one thread block each (`sala_select_topk_chunk`:
/// pooled scores and the chunk's own top-k), then the top-k of those candidates per query and KV
/// head (`sala_select_topk_merge`): the same blocks and scores. One thread block per KV head grows
/// with the context: 33 µs a layer at 128K tokens on an H100 (eval/results/kernel-notes.md).
fn pool_topk_in_chunks(window_scores: &Array, maxima: bool, params: &Array, nb: i32, sel: &BlockSelection) -> Result<Selected> {
    let (hkv, t) = (window_scores.shape()[0], window_scores.shape()[1]);
    let int = |v: usize| TemplateArg::Int(v as i32);
    let chunks = (nb + TOPK_CHUNK - 1) / TOPK_CHUNK;
    let mut chunk_template = pooling_template(sel);
    chunk_template.extend([
        ("CHUNK", TemplateArg::Int(TOPK_CHUNK)),
        ("HELD", TemplateArg::Int(TOPK_CHUNK_HELD)),
        ("MAXIMA", TemplateArg::Bool(maxima)),
    ]);
    // Candidates are 64-bit keys, carried as pairs of 32-bit words.
    let mut chunked = apply(
        &SELECT_TOPK_CHUNK,
        &[window_scores, params],
        Launch {
            grid: (THREADS * chunks, t, hkv),
            threads: (THREADS, 1, 1),
            outputs: vec![(vec![hkv, t, chunks * sel.topk as i32 * 2], Dtype::Uint32), (vec![1, hkv, t, nb], Dtype::Float32)],
            template: chunk_template,
            init: None,
        },
    )?
    .into_iter();
    let (candidates, scores) = (chunked.next().expect("2 outputs"), chunked.next().expect("2 outputs"));
    let merge_threads = 1024;
    let blocks = apply(
        &SELECT_TOPK_MERGE,
        &[&candidates, params],
        Launch {
            grid: (merge_threads, t, hkv),
            threads: (merge_threads, 1, 1),
            outputs: vec![(vec![1, hkv, t, sel.topk as i32], Dtype::Int32)],
            template: vec![("BLOCK", int(sel.block)), ("TOPK", int(sel.topk)), ("HELD", TemplateArg::Int(TOPK_MERGE_HELD))],
            init: None,
        },
    )?
    .into_iter()
    .next()
    .expect("one output");
    Ok(Selected { blocks, scores })
}

/// The decode attention's CUDA source with the 16-byte unpacking it reads keys and values with.
const BLOCK_SPARSE_ATTENTION_HEADER: &str =
    concat!(include_str!("../../cuda/unpack.cu"), include_str!("../../cuda/block_sparse_attention.cu"));

static BLOCK_SPARSE_ATTENTION: KernelSource = KernelSource {
    name: "sala_block_sparse_attention",
    inputs: &["q", "k", "v", "k_recent", "v_recent", "blocks", "params"],
    outputs: &["out", "lse"],
    cuda_header: BLOCK_SPARSE_ATTENTION_HEADER,
    cuda_body: "sala_block_sparse_attention<T, D, G, BLOCK, NSPLIT, SCALE_BITS>(\
                q, k, v, k_recent, v_recent, blocks, params_shape[0] - 1, params_shape[1] - 1, params_shape[2] - 1, \
                out, lse, q_shape[1], k_shape[2], k_recent_shape[2], blocks_shape[3]);",
    metal_header: include_str!("../../metal/block_sparse_attention.metal"),
    metal_body: "threadgroup float qs[G * D]; threadgroup T ks[32 * (D + 1)]; threadgroup T vs[32 * (D + 1)]; \
                 sala_block_sparse_attention<T, D, G, BLOCK, NSPLIT, SCALE_BITS>(\
                 q, k, v, k_recent, v_recent, blocks, int(params_shape[0]) - 1, int(params_shape[1]) - 1, \
                 int(params_shape[2]) - 1, out, lse, int(q_shape[1]), int(k_shape[2]), \
                 int(k_recent_shape[2]), int(blocks_shape[3]), \
                 threadgroup_position_in_grid, thread_index_in_threadgroup, threads_per_threadgroup.x, \
                 threadgroups_per_grid.z, thread_index_in_simdgroup, simdgroup_index_in_threadgroup, qs, ks, vs);",
    // `params` is a shape_args broadcast; the other inputs are made contiguous by the caller.
    contiguous_inputs: false,
    shared_memory: 0,
};

/// The `SalaKvScales` (cuda/unpack.cu) a kernel body over [`Q8_INPUTS`] passes.
macro_rules! q8_scales {
    () => {
        "SalaKvScales<T>{k_scales, k_biases, v_scales, v_biases, kr_scales, kr_biases, vr_scales, vr_biases, \
         int(k_scales_shape[2]), int(kr_scales_shape[2])}"
    };
}

static BLOCK_SPARSE_ATTENTION_Q8: KernelSource = KernelSource {
    name: "sala_block_sparse_attention_q8",
    inputs: &Q8_INPUTS,
    outputs: &["out", "lse"],
    cuda_header: BLOCK_SPARSE_ATTENTION_HEADER,
    cuda_body: concat!(
        "sala_block_sparse_attention_q8<T, D, G, BLOCK, NSPLIT, SCALE_BITS, QGROUP>(\
         q, k, v, k_recent, v_recent, ",
        q8_scales!(),
        ", blocks, params_shape[0] - 1, params_shape[1] - 1, params_shape[2] - 1, \
         out, lse, q_shape[1], k_shape[2], k_recent_shape[2], blocks_shape[3]);"
    ),
    // CUDA only: Metal reads an 8-bit cache's rows dequantized.
    metal_header: "",
    metal_body: "",
    contiguous_inputs: false,
    shared_memory: 0,
};

/// The inputs of a kernel reading an 8-bit cache in place: the codes' four buffers as
/// [`kv_buffers`] gives them, then their scales and biases as [`kv_scale_buffers`] does.
const Q8_INPUTS: [&str; 15] = [
    "q", "k", "v", "k_recent", "v_recent", "k_scales", "k_biases", "v_scales", "v_biases", "kr_scales", "kr_biases",
    "vr_scales", "vr_biases", "blocks", "params",
];

/// The eight scale and bias buffers of an 8-bit cache's parts, in [`Q8_INPUTS`]' order (the
/// history's stand in for absent recent tokens, as in [`kv_buffers`]).
fn kv_scale_buffers(scales: &KvScales) -> [Array; 8] {
    let [ks, kb, vs, vb] = &scales.history;
    let [rks, rkb, rvs, rvb] = scales.recent.as_ref().unwrap_or(&scales.history);
    [ks, kb, vs, vb, rks, rkb, rvs, rvb].map(Array::clone)
}

/// Launches a block-sparse attention kernel on `q`, the cache's buffers, `blocks` and `params`:
/// `sources[0]` over plain rows, or `sources[1]` over an 8-bit cache's codes ([`Q8_INPUTS`], with
/// the template's `QGROUP` set to its group).
fn apply_over_cache(
    sources: [&'static KernelSource; 2],
    q: &Array,
    kv: &KvParts,
    blocks: &Array,
    params: &Array,
    mut launch: Launch<'static>,
) -> Result<Vec<Array>> {
    let [k, v, recent_k, recent_v] = kv_buffers(kv);
    let scales = kv.scales.as_ref().map(|s| (s.group, kv_scale_buffers(s)));
    let mut inputs = vec![q, &k, &v, &recent_k, &recent_v];
    let source = match &scales {
        Some((group, buffers)) => {
            launch.template.push(("QGROUP", TemplateArg::Int(*group)));
            inputs.extend(buffers);
            sources[1]
        }
        None => sources[0],
    };
    inputs.extend([blocks, params]);
    apply(source, &inputs, launch)
}

/// Whether the CUDA kernels reading an 8-bit cache in place take these parts: 8-bit codes, and
/// groups that hold whole 16-code pieces.
pub fn reads_codes_in_place(kv: &KvParts) -> bool {
    kv.scales.as_ref().is_some_and(|s| backend() == Backend::Cuda && s.bits == 8 && s.group % 16 == 0)
}

/// The block-sparse attention's general kernel (`models::sala::infllm::block_sparse_attention`
/// picks between it, [`block_sparse_prefill_cuda`] and its MLX-ops version). Reads an 8-bit
/// cache in place on CUDA ([`reads_codes_in_place`]).
#[allow(clippy::too_many_arguments)]
pub fn block_sparse_attention_gpu(
    q: &Array,
    kv: &KvParts,
    blocks: &Array,
    first_pos: usize,
    block: usize,
    scale: f32,
    gate: Option<&Array>,
) -> Result<Array> {
    let (hq, t, d) = (q.shape()[1], q.shape()[2], q.shape()[3]);
    let hkv = kv.keys.shape()[1];
    let nsel = blocks.shape()[3];
    // Few queries (decode) split the selected blocks among thread blocks to fill the GPU
    // (eval/results/kernel-notes.md).
    let nsplit = splits_of_selected_blocks((fill_blocks() / (t * hkv)).max(1), nsel);
    let params = shape_args(&[first_pos, kv.len, kv.settled])?;
    let q3 = q.reshape(&[hq, t, d])?.contiguous()?;
    let launch = split_attention_launch(q.dtype(), t, hq, hkv, d, block as i32, nsplit, scale);
    let sources = [&BLOCK_SPARSE_ATTENTION, &BLOCK_SPARSE_ATTENTION_Q8];
    let out = apply_over_cache(sources, &q3, kv, &blocks.contiguous()?, &params, launch)?;
    merge_splits(&out[0], &out[1], vec![1, t, hq * d], q.dtype(), gate)
}

static BLOCK_SPARSE_DECODE_MMA: KernelSource = KernelSource {
    name: "sala_block_sparse_decode_mma",
    inputs: &["q", "k", "v", "k_recent", "v_recent", "blocks", "params"],
    outputs: &["out", "lse"],
    cuda_header: DECODE_ATTENTION_MMA_HEADER,
    cuda_body: "sala_decode_attention_mma<T, D, G, NSPLIT, SCALE_BITS>(q, 1, k, v, k_recent, v_recent, \
                params_shape[0] - 1, params_shape[1] - 1, k_shape[2], k_recent_shape[2], blocks, blocks_shape[3], out, lse);",
    // CUDA only (mma.sync, cp.async); Metal takes BLOCK_SPARSE_ATTENTION.
    metal_header: "",
    metal_body: "",
    // `params` is a shape_args broadcast; the other inputs are made contiguous by the caller.
    contiguous_inputs: false,
    shared_memory: 0,
};

/// Whether [`block_sparse_decode_cuda`] takes this attention: one half-precision query at the
/// cache's last position, a group's heads in one tile ([`decode_mma_fits`]), 64-token blocks, and
/// chosen with [`with_decode_kernel`]: not by default until it is shown faster than the general
/// kernel (eval/results/kernel-notes.md).
pub fn block_sparse_decode_fits(q: &Array, kv: &KvParts, first_pos: usize, block: usize) -> bool {
    let (hq, t, d) = (q.shape()[1], q.shape()[2], q.shape()[3]);
    let chosen = DECODE_KERNEL.with(|o| o.get()) == Some(DecodeKernel::TensorCores);
    chosen
        && kv.scales.is_none()
        && q.shape()[0] == 1
        && t == 1
        && first_pos + 1 == kv.len
        && block == MMA_TILE as usize
        && decode_mma_fits(hq, kv.keys.shape()[1], d, q.dtype())
}

/// InfLLM-V2's attention of one decoding query over its selected blocks on tensor cores
/// (`cuda/decode_attention_mma.cu` with a block list): the blocks split among thread blocks,
/// then the usual merge, times σ(`gate`) when given (`[1, 1, Hq·d]`).
pub fn block_sparse_decode_cuda(q: &Array, kv: &KvParts, blocks: &Array, scale: f32, gate: Option<&Array>) -> Result<Array> {
    let (hq, d) = (q.shape()[1], q.shape()[3]);
    let hkv = kv.keys.shape()[1];
    let nsel = blocks.shape()[3];
    // Room for four thread blocks a compute unit.
    let room = DECODE_SPLITS_OVERRIDE.with(|o| o.get()).unwrap_or(2 * fill_blocks() / hkv).max(1);
    let nsplit = splits_of_selected_blocks(room, nsel);
    let params = shape_args(&[kv.len, kv.settled])?;
    let q3 = q.reshape(&[hq, 1, d])?.contiguous()?;
    let [k, v, recent_k, recent_v] = kv_buffers(kv);
    let out = apply(
        &BLOCK_SPARSE_DECODE_MMA,
        &[&q3, &k, &v, &recent_k, &recent_v, &blocks.contiguous()?, &params],
        Launch {
            grid: (128 * nsplit, 1, hkv),
            threads: (128, 1, 1),
            outputs: vec![(vec![1, hq, nsplit, d], Dtype::Float32), (vec![1, hq, nsplit], Dtype::Float32)],
            template: vec![
                ("T", TemplateArg::Type(q.dtype())),
                ("D", TemplateArg::Int(d)),
                ("G", TemplateArg::Int(hq / hkv)),
                ("NSPLIT", TemplateArg::Int(nsplit)),
                ("SCALE_BITS", TemplateArg::Int(scale.to_bits() as i32)),
            ],
            init: None,
        },
    )?;
    merge_splits(&out[0], &out[1], vec![1, 1, hq * d], q.dtype(), gate)
}

/// Splits of `nsel` selected blocks among thread blocks when the GPU has `room` for that many a
/// query and KV head: one split per block where they fit, else a power of two (few compiled
/// variants).
fn splits_of_selected_blocks(room: i32, nsel: i32) -> i32 {
    if room >= nsel {
        nsel.max(1)
    } else {
        pow2_floor(room)
    }
}

/// The splits' partial outputs `[R, H, NSPLIT, d]` and log-sum-exps `[R, H, NSPLIT]` (R rows: the
/// queries of one sequence, or one query per sequence) merged into `shape` (`[B, T, H·d]` with
/// B·T = R) in `dtype`, times σ(`gate`) (of that shape, read through its strides) when given: the
/// gate multiply, the sigmoid and the transposing copy would be three more launches a sparse layer.
fn merge_splits(partial: &Array, lse: &Array, shape: Vec<i32>, dtype: Dtype, gate: Option<&Array>) -> Result<Array> {
    let (h, nsplit, d) = (partial.shape()[1], partial.shape()[2], partial.shape()[3]);
    let total = partial.shape()[0] * h * d;
    // The gate as [R, H·d] rows (a view of the projection's output stays one).
    let gate = gate.map(|g| g.reshape(&[-1, h * d])).transpose()?;
    let (source, inputs): (&'static KernelSource, Vec<&Array>) = match &gate {
        Some(g) => (&MERGE_SPLITS_GATED, vec![partial, lse, g]),
        None => (&MERGE_SPLITS, vec![partial, lse]),
    };
    let merged = apply(
        source,
        &inputs,
        Launch {
            grid: (total, 1, 1),
            threads: (THREADS, 1, 1),
            outputs: vec![(shape, dtype)],
            template: vec![
                ("T", TemplateArg::Type(dtype)),
                ("D", TemplateArg::Int(d)),
                ("NSPLIT", TemplateArg::Int(nsplit)),
                ("HQ", TemplateArg::Int(h)),
            ],
            init: None,
        },
    )?;
    Ok(merged.into_iter().next().expect("one output"))
}

/// Decoding queries where the projection left them: row b of `rows` `[B, 1, W]` (a view is fine)
/// holds sequence b's query heads from column `q_col` on, `head_dim` values each, and, when the
/// layer gates its output, as many gate values from column `gate_col` on.
#[derive(Clone, Copy)]
pub struct DecodeQuery<'a> {
    pub rows: &'a Array,
    pub heads: i32,
    pub head_dim: i32,
    pub q_col: i32,
    pub gate_col: Option<i32>,
}

impl DecodeQuery<'_> {
    /// The query heads `[B, Hq, 1, d]` (a view).
    pub fn heads(&self) -> Result<Array> {
        let (b, n) = (self.rows.shape()[0], self.heads * self.head_dim);
        self.rows.try_index((.., .., self.q_col..self.q_col + n))?.reshape(&[b, 1, self.heads, self.head_dim])?.swap_axes(1, 2)
    }

    /// The gate `[B, 1, Hq·d]` (a view), when there is one.
    pub fn gate(&self) -> Result<Option<Array>> {
        let n = self.heads * self.head_dim;
        self.gate_col.map(|c| self.rows.try_index((.., .., c..c + n))).transpose()
    }
}

/// Dense attention of one decoding query per sequence over that sequence's whole cache: `kvs[b]`
/// the cache of row b (lengths may differ; the query is each cache's last position). Returns
/// `[B, 1, Hq·d]`, times σ(gate) when the query has one (as [`heads_to_rows`]). On CUDA one launch
/// serves up to [`DECODE_SLOTS`] sequences (a call per sequence and layer costs the host more than
/// the GPU spends on the step) and reads the query where the projection wrote it; the gate is
/// applied as the splits are merged. Groups of more heads than a CUDA-core thread block takes
/// ([`MAX_HEADS_PER_BLOCK`]; up to 16, half precision) run on tensor cores
/// (`cuda/decode_attention_mma.cu`), the rest on CUDA cores (`cuda/decode_attention.cu`), each
/// the other's fallback. Elsewhere MLX's attention runs per sequence.
/// 8-bit caches' codes are read in place by the CUDA-core kernel (`QGROUP`), where every cache of
/// the call is one, of one group size, and that kernel passed its check; otherwise each layer's
/// rows are dequantized for the step.
pub fn decode_attention(query: &DecodeQuery, kvs: &[KvParts], scale: f32) -> Result<Array> {
    let (rows, hq, d) = (query.rows, query.heads, query.head_dim);
    let hkv = kvs.first().map_or(1, |kv| kv.keys.shape()[1]);
    // The dtype the cache's rows are computed in (an 8-bit cache's: its scales').
    let row_dtype = |kv: &KvParts| kv.scales.as_ref().map_or(kv.keys.dtype(), |s| s.history[0].dtype());
    let fits = backend() == Backend::Cuda
        && rows.ndim() == 3
        && rows.shape()[1] == 1
        && rows.shape()[0] as usize == kvs.len()
        && rows.shape()[2] >= query.q_col + hq * d
        && query.gate_col.is_none_or(|c| rows.shape()[2] >= c + hq * d)
        && kvs.iter().all(|kv| kv.len > 0 && kv.keys.shape()[1] == hkv && row_dtype(kv) == rows.dtype() && kv.counts.is_some() == kvs[0].counts.is_some());
    if kvs.iter().any(|kv| kv.scales.is_some()) {
        let group = kvs.first().and_then(|kv| kv.scales.as_ref()).map(|s| s.group);
        let in_place = fits
            && kvs.iter().all(|kv| reads_codes_in_place(kv) && kv.scales.as_ref().map(|s| s.group) == group)
            && decode_kernel_fits(hq, d, rows.item_size() as i32, hkv)
            && selfcheck::enabled(&DECODE_ATTENTION_Q8_CHECK);
        if !in_place {
            let rows = kvs.iter().map(KvParts::dequantized).collect::<Result<Vec<_>>>()?;
            return decode_attention(query, &rows, scale);
        }
        return decode_in_pieces(query, kvs, scale, false);
    }
    // The preferred kernel where it fits and passed its self-check, else the other one.
    let usable = |kernel: DecodeKernel| match kernel {
        DecodeKernel::TensorCores => decode_mma_fits(hq, hkv, d, rows.dtype()) && selfcheck::enabled(&DECODE_ATTENTION_MMA_CHECK),
        DecodeKernel::CudaCores => decode_kernel_fits(hq, d, rows.item_size() as i32, hkv) && selfcheck::enabled(&DECODE_ATTENTION_CHECK),
    };
    let preferred = DECODE_KERNEL.with(|o| o.get()).unwrap_or(if hq / hkv > MAX_HEADS_PER_BLOCK { DecodeKernel::TensorCores } else { DecodeKernel::CudaCores });
    let other = match preferred {
        DecodeKernel::TensorCores => DecodeKernel::CudaCores,
        DecodeKernel::CudaCores => DecodeKernel::TensorCores,
    };
    let Some(kernel) = [preferred, other].into_iter().find(|&k| fits && usable(k)) else {
        return heads_to_rows(&decode_attention_mlx(&query.heads()?, kvs, scale)?, query.gate()?.as_ref());
    };
    decode_in_pieces(query, kvs, scale, kernel == DecodeKernel::TensorCores)
}

/// Launches, without evaluating, [`decode_attention`] over 1 to [`DECODE_SLOTS`] sequences at every
/// split count their lengths can reach, queries as `shape` lays them out in rows of `width` columns
/// of `dtype`, over `kv_heads` KV heads: on CUDA their variants then compile on the module cache's
/// pool side by side, once per machine, instead of one a round (every stream waiting) as a
/// server's batch grows and its contexts lengthen. Nothing is evaluated, so the lazily zero
/// caches are never allocated. Returns how many variants were launched for the first time.
pub fn launch_decode_variants(shape: DecodeShape, width: i32, kv_heads: i32, dtype: Dtype, scale: f32) -> Result<usize> {
    if backend() != Backend::Cuda {
        return Ok(0);
    }
    let before = super::custom::variants_launched();
    for sequences in 1..=DECODE_SLOTS as i32 {
        let rows = ops::zeros_dtype(&[sequences, 1, width], dtype)?;
        let query = DecodeQuery { rows: &rows, heads: shape.heads, head_dim: shape.head_dim, q_col: shape.q_col, gate_col: shape.gate_col };
        // Lengths of 1, 2, 4, … blocks reach every power-of-two split count up to the most any
        // batch gets (two thread blocks per compute unit over its heads).
        let mut blocks = 1;
        while blocks <= 2 * fill_blocks() {
            let len = blocks as usize * DECODE_BLOCK;
            let kv = || -> Result<KvParts> {
                let keys = ops::zeros_dtype(&[1, kv_heads, len as i32, shape.head_dim], dtype)?;
                Ok(KvParts { values: keys.clone(), keys, recent: None, settled: len, len, scales: None, counts: None })
            };
            let kvs = (0..sequences).map(|_| kv()).collect::<Result<Vec<_>>>()?;
            drop(decode_attention(&query, &kvs, scale)?);
            blocks *= 2;
        }
    }
    Ok(super::custom::variants_launched() - before)
}

/// Where a [`DecodeQuery`]'s heads sit in its rows, without the rows.
#[derive(Clone, Copy, Debug)]
pub struct DecodeShape {
    pub heads: i32,
    pub head_dim: i32,
    pub q_col: i32,
    pub gate_col: Option<i32>,
}

/// [`decode_attention_cuda`] over at most [`DECODE_SLOTS`] sequences a launch.
fn decode_in_pieces(query: &DecodeQuery, kvs: &[KvParts], scale: f32, mma: bool) -> Result<Array> {
    let mut outputs = in_pieces(query.rows, kvs, DECODE_SLOTS, |rows, _, kvs| decode_attention_cuda(&DecodeQuery { rows, ..*query }, kvs, scale, mma))?;
    if outputs.len() == 1 {
        return Ok(outputs.remove(0));
    }
    ops::concatenate(&outputs, 0)
}

/// The MLX-ops version of [`decode_attention`]: MLX's attention per sequence.
pub fn decode_attention_mlx(q: &Array, kvs: &[KvParts], scale: f32) -> Result<Array> {
    let rows = kvs
        .iter()
        .enumerate()
        .map(|(i, kv)| {
            let qi = q.try_index(i as i32..i as i32 + 1)?;
            if let (Some(counts), Some((recent_k, recent_v))) = (&kv.counts, &kv.recent) {
                // A fixed step: the whole recent buffer, its unfilled positions masked by the
                // device's count.
                let join = |history: &Array, recent: &Array| ops::concatenate(&[history.try_index((.., .., ..kv.settled as i32, ..))?, recent.clone()], 2);
                let (k, v) = (join(&kv.keys, recent_k)?, join(&kv.values, recent_v)?);
                let width = k.shape()[2];
                let recent_index = crate::engine::ops::arange_i32(0, width as usize)?.subtract(Array::from_int(kv.settled as i32))?;
                let mask = recent_index.lt(&counts.recent_filled)?.reshape(&[1, 1, 1, width])?;
                return mlx_rs::fast::scaled_dot_product_attention(&qi, &k, &v, scale, &mask, None);
            }
            let (k, v) = kv.filled()?;
            mlx_rs::fast::scaled_dot_product_attention(&qi, &k, &v, scale, None, None)
        })
        .collect::<Result<Vec<_>>>()?;
    match rows.len() {
        1 => Ok(rows.into_iter().next().expect("one row")),
        _ => ops::concatenate(&rows, 0),
    }
}

/// The decode attention kernel against [`decode_attention_mlx`] in float32, for two bfloat16
/// sequences of different lengths (one with recent tokens), q and the gate in the projection's
/// rows.
pub static DECODE_ATTENTION_CHECK: KernelCheck = KernelCheck { name: "decode_attention", backends: CUDA_ONLY, run: || check_decode_attention(false, false) };

/// The tensor-core decode attention kernel likewise.
pub static DECODE_ATTENTION_MMA_CHECK: KernelCheck =
    KernelCheck { name: "decode_attention_mma", backends: CUDA_ONLY, run: || check_decode_attention(true, false) };

/// The CUDA-core decode attention kernel over 8-bit caches' codes (groups of 32) likewise, against
/// the rows dequantized.
pub static DECODE_ATTENTION_Q8_CHECK: KernelCheck =
    KernelCheck { name: "decode_attention_q8", backends: CUDA_ONLY, run: || check_decode_attention(false, true) };

fn check_decode_attention(mma: bool, quantized: bool) -> Verdict {
    let (hq, hkv, d) = (4, 2, 32);
    let bf16 = Dtype::Bfloat16;
    let scale = (d as f32).powf(-0.5);
    // (buffer length, filled length, settled length: the rest is in a recent-token buffer).
    let caches = [(96, 70, 70), (160, 130, 120)];
    verify(
        || {
            let projected = sample(&[2, 1, 3 * hq * d], 61, bf16)?;
            let mut buffers = Vec::new();
            for (i, &(capacity, _, _)) in caches.iter().enumerate() {
                let seed = 62 + 4 * i as u64;
                let kv = [seed, seed + 1, seed + 2, seed + 3].map(|s| sample(&[1, hkv, capacity, d], s, bf16));
                let [k, v, kr, vr] = kv;
                buffers.push([k?, v?, kr?, vr?]);
            }
            Ok((projected, buffers))
        },
        // Plain caches' lengths given by the host, then as a fixed step's device counts.
        |(projected, buffers)| {
            let parts = check_parts(buffers, &caches, quantized)?;
            let query = check_query(projected, hq, d);
            let mut out = vec![decode_attention_cuda(&query, &parts, scale, mma)?];
            if !quantized {
                out.push(decode_attention_cuda(&query, &with_device_lens(&parts)?, scale, mma)?);
            }
            Ok(out)
        },
        |(projected, buffers)| {
            let query = check_query(projected, hq, d);
            let (q, gate) = (query.heads()?, query.gate()?.expect("gated"));
            let f = |a: &Array| a.as_dtype(Dtype::Float32);
            let filled = check_parts(buffers, &caches, quantized)?.iter().map(|p| p.filled()).collect::<Result<Vec<_>>>()?;
            let filled = filled.iter().map(|(k, v)| Ok((f(k)?, f(v)?))).collect::<Result<Vec<_>>>()?;
            let parts: Vec<_> = filled.iter().zip(&caches).map(|((k, v), &(_, len, _))| KvParts::history(k, v, len)).collect();
            let rows = heads_to_rows(&decode_attention_mlx(&f(&q)?, &parts, scale)?, Some(&f(&gate)?))?;
            Ok(if quantized { vec![rows] } else { vec![rows.clone(), rows] })
        },
    )
}

/// `parts` with their lengths as a fixed step's device counts (for the kernels' checks; the
/// host's `len` is then wrong on purpose).
pub fn with_device_lens(parts: &[KvParts]) -> Result<Vec<KvParts>> {
    parts
        .iter()
        .map(|p| {
            let position = p.len - 1;
            let counts = StepCounts::new(&Array::from_slice(&[position as i32], &[1]), p.settled.min(position))?;
            Ok(KvParts { len: 1, counts: Some(counts), ..p.clone() })
        })
        .collect()
}

/// q and the gate in the projection's rows `[q | k | gate]`.
fn check_query(projected: &Array, hq: i32, d: i32) -> DecodeQuery<'_> {
    DecodeQuery { rows: projected, heads: hq, head_dim: d, q_col: 0, gate_col: Some(2 * hq * d) }
}

/// The check's caches: their four buffers as they are, or `quantized` to 8 bits in groups of 32.
fn check_parts(buffers: &[[Array; 4]], caches: &[(i32, usize, usize)], quantized: bool) -> Result<Vec<KvParts>> {
    buffers
        .iter()
        .zip(caches)
        .map(|([k, v, kr, vr], &(_, len, settled))| check_kv_parts([k, v, kr, vr], settled, len, quantized))
        .collect()
}

/// A kernel check's buffers (history keys, values, recent keys, values; recent tokens when
/// `settled < len`) as a cache holds them: as they are, or `quantized` to 8 bits in groups of 32
/// (MLX's affine format, as `--kv-bits 8` keeps them).
pub fn check_kv_parts([k, v, kr, vr]: [&Array; 4], settled: usize, len: usize, quantized: bool) -> Result<KvParts> {
    let recent = settled < len;
    if !quantized {
        return Ok(KvParts { keys: k.clone(), values: v.clone(), recent: recent.then(|| (kr.clone(), vr.clone())), settled, len, scales: None, counts: None });
    }
    let (group, bits) = (32, 8);
    let quantize = |x: &Array| ops::quantize(x, group, bits);
    let ((k, ks, kb), (v, vs, vb)) = (quantize(k)?, quantize(v)?);
    let ((kr, krs, krb), (vr, vrs, vrb)) = (quantize(kr)?, quantize(vr)?);
    let scales = KvScales { bits, group, history: [ks, kb, vs, vb], recent: recent.then_some([krs, krb, vrs, vrb]) };
    Ok(KvParts { keys: k, values: v, recent: recent.then_some((kr, vr)), settled, len, scales: Some(scales), counts: None })
}

/// Sequences per launch of the decode attention kernel: each brings four buffers as kernel
/// arguments, and their lengths come as the shape of one [`shape_args`] broadcast.
const DECODE_SLOTS: usize = MAX_SHAPE_ARGS;

/// Whether the attention kernel (`cuda/block_sparse_attention.cu` and its Metal twin) takes
/// queries `q` `[B, Hq, T, d]` over `hkv` KV heads: it reads keys and values in 16-byte pieces,
/// and its tiles must fit a thread block's shared memory: G query rows as float, and a 32-token
/// tile of keys and of values (CUDA: float, 48 KB; Metal: the keys' own type, 32 KB).
pub fn attention_kernel_fits(q: &Array, hkv: i32) -> bool {
    let (hq, d, item) = (q.shape()[1], q.shape()[3], q.item_size() as i32);
    if (d * item) % 16 != 0 || hq % hkv != 0 {
        return false;
    }
    let (g, tile) = (hq / hkv, 2 * 32 * (d + 1));
    match backend() {
        Backend::Metal => 4 * g * d + tile * item <= 32 * 1024,
        _ => 4 * (g * d + tile) <= 48 * 1024,
    }
}

/// The four buffers an attention kernel reads: the history's keys and values, then the recent
/// tokens' (the history stands in when there are none: settled = len, never read). They are
/// whole, contiguous arrays ([`KvParts`]): a `contiguous()` here would share them, but cost the
/// host an operation each, four per sequence and layer of a decode step.
fn kv_buffers(kv: &KvParts) -> [Array; 4] {
    let (recent_k, recent_v) = kv.recent.as_ref().map_or((&kv.keys, &kv.values), |(k, v)| (k, v));
    [kv.keys.clone(), kv.values.clone(), recent_k.clone(), recent_v.clone()]
}

/// The launch of the split attention kernel for `rows` queries (or sequences) of `hq` heads over
/// `hkv` KV heads: one thread block per (split, row, KV head), partial outputs and log-sum-exps
/// per split for [`merge_splits`].
#[allow(clippy::too_many_arguments)]
fn split_attention_launch(dtype: Dtype, rows: i32, hq: i32, hkv: i32, d: i32, block: i32, nsplit: i32, scale: f32) -> Launch<'static> {
    Launch {
        grid: (THREADS * nsplit, rows, hkv),
        threads: (THREADS, 1, 1),
        outputs: vec![(vec![rows, hq, nsplit, d], Dtype::Float32), (vec![rows, hq, nsplit], Dtype::Float32)],
        template: vec![
            ("T", TemplateArg::Type(dtype)),
            ("D", TemplateArg::Int(d)),
            ("G", TemplateArg::Int(hq / hkv)),
            ("BLOCK", TemplateArg::Int(block)),
            ("NSPLIT", TemplateArg::Int(nsplit)),
            ("SCALE_BITS", TemplateArg::Int(scale.to_bits() as i32)),
        ],
        init: None,
    }
}

/// Whether `cuda/decode_attention.cu` takes `hq` query heads of `d` values of `item` bytes over
/// `hkv` KV heads: a row of d values must be a power-of-two number of 16-byte pieces, at most one
/// per lane of a warp.
fn decode_kernel_fits(hq: i32, d: i32, item: i32, hkv: i32) -> bool {
    let row = d * item;
    hkv > 0 && hq % hkv == 0 && row % 16 == 0 && (row as u32 / 16).is_power_of_two() && row / 16 <= 32
}

/// Query heads of a KV group per thread block of the CUDA-core decode attention: the largest
/// divisor of the group size up to [`MAX_HEADS_PER_BLOCK`] (each head holds its query and output
/// slice in registers).
fn heads_per_block(group: i32) -> i32 {
    (1..=group.min(MAX_HEADS_PER_BLOCK)).rev().find(|n| group % n == 0).unwrap_or(1)
}

/// Query heads a thread block of the CUDA-core decode attention takes at most. A larger group is
/// split over thread blocks that each read its keys, so it goes to the tensor-core kernel, which
/// reads them once: SALA-9B's 16 heads a group (eval/results/kernel-notes.md). Smaller groups
/// (Qwen3-8B's 4) keep the CUDA-core kernel their decode goals were measured with.
const MAX_HEADS_PER_BLOCK: i32 = 8;

/// The two kernels of the dense decode attention (and of InfLLM-V2's decode over selected blocks:
/// tensor cores only when chosen, [`block_sparse_decode_fits`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DecodeKernel {
    /// `cuda/decode_attention_mma.cu`.
    TensorCores,
    /// `cuda/decode_attention.cu` (and `cuda/block_sparse_attention.cu` over selected blocks).
    CudaCores,
}

/// Whether the tensor-core decode attention (`cuda/decode_attention_mma.cu`) takes `hq` query
/// heads of `d` values over `hkv` KV heads in `dtype`: CUDA, half precision, a group's heads
/// in one 16-row tile, whole 32-column steps, and at most 128 columns (its query and output
/// fragments live in registers).
pub fn decode_mma_fits(hq: i32, hkv: i32, d: i32, dtype: Dtype) -> bool {
    let half = matches!(dtype, Dtype::Bfloat16 | Dtype::Float16);
    backend() == Backend::Cuda && half && hkv > 0 && hq % hkv == 0 && hq / hkv <= 16 && d % 32 == 0 && d <= 128
}

/// The decode attention kernel for at most [`DECODE_SLOTS`] sequences (`cuda/decode_attention_mma.cu`
/// on tensor cores when `mma`, else `cuda/decode_attention.cu`), then the usual merge of the splits.
fn decode_attention_cuda(query: &DecodeQuery, kvs: &[KvParts], scale: f32, mma: bool) -> Result<Array> {
    let (rows, hq, d) = (query.rows, query.heads, query.head_dim);
    let b = rows.shape()[0];
    let hkv = kvs[0].keys.shape()[1];
    let (group, gb) = (hq / hkv, if mma { hq / hkv } else { heads_per_block(hq / hkv) });
    let block = if mma { MMA_TILE } else { DECODE_BLOCK as i32 };
    // Splits: enough thread blocks for four per compute unit (each holds few registers' worth of
    // loads in flight), at least one unit of `block` tokens each; a power of two (few compiled
    // variants, as the lengths change every step).
    // A fixed step's lengths are the device's: its splits are those of the longest its graph
    // can reach (the recent buffers full).
    let device_lens = device_counts(kvs.iter().map(|kv| kv.counts.as_ref().map(|c| &c.len)))?;
    let longest = match device_lens {
        Some(_) => kvs.iter().map(|kv| kv.settled + kv.recent.as_ref().map_or(0, |r| r.0.shape()[2] as usize)).max(),
        None => kvs.iter().map(|kv| kv.len).max(),
    }
    .unwrap_or(1) as i32;
    let room = (2 * fill_blocks() / (b * hq / gb)).max(1);
    let nsplit = pow2_floor(DECODE_SPLITS_OVERRIDE.with(|o| o.get()).unwrap_or(room).min((longest + block - 1) / block));
    let lens: Vec<usize> = kvs.iter().map(|kv| kv.len).collect();
    let settled: Vec<usize> = kvs.iter().map(|kv| kv.settled).collect();
    let quantized = kvs[0].scales.as_ref();
    let buffers: Vec<Array> = kvs
        .iter()
        .flat_map(|kv| {
            let scales = kv.scales.as_ref().map(kv_scale_buffers);
            kv_buffers(kv).into_iter().chain(scales.into_iter().flatten())
        })
        .collect();
    let in_data = device_lens.is_some();
    let (lens, settled) = (device_lens.map_or_else(|| shape_args(&lens), Ok)?, shape_args(&settled)?);
    let mut inputs: Vec<&Array> = vec![rows];
    inputs.extend(buffers.iter());
    inputs.extend([&lens, &settled]);
    const THREADS: i32 = 128;
    let mut template = vec![
        ("T", TemplateArg::Type(rows.dtype())),
        ("D", TemplateArg::Int(d)),
        ("G", TemplateArg::Int(group)),
        ("NSPLIT", TemplateArg::Int(nsplit)),
        ("SCALE_BITS", TemplateArg::Int(scale.to_bits() as i32)),
        ("Q_COL", TemplateArg::Int(query.q_col)),
        ("COUNTS_IN_DATA", TemplateArg::Bool(in_data)),
    ];
    if !mma {
        template.push(("GB", TemplateArg::Int(gb)));
    }
    if let Some(scales) = quantized {
        template.push(("QGROUP", TemplateArg::Int(scales.group)));
    }
    let launch = Launch {
        grid: (THREADS * nsplit, b, hq / gb),
        threads: (THREADS, 1, 1),
        outputs: vec![(vec![b, hq, nsplit, d], Dtype::Float32), (vec![b, hq, nsplit], Dtype::Float32)],
        template,
        init: None,
    };
    let source = match (mma, quantized.is_some()) {
        (true, _) => decode_attention_mma_source(kvs.len()),
        (false, false) => decode_attention_source(kvs.len()),
        (false, true) => decode_attention_q8_source(kvs.len()),
    };
    let out = apply(source, &inputs, launch)?;
    merge_splits(&out[0], &out[1], vec![b, 1, hq * d], rows.dtype(), query.gate()?.as_ref())
}

thread_local! {
    static DECODE_SPLITS_OVERRIDE: std::cell::Cell<Option<i32>> = const { std::cell::Cell::new(None) };
    static DECODE_KERNEL: std::cell::Cell<Option<DecodeKernel>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the decode attentions on `kernel` where it fits (dense decode, and InfLLM-V2's
/// decode over selected blocks), rather than their defaults: the kernel benchmark's comparisons
/// and the tests of both kernels.
#[doc(hidden)]
pub fn with_decode_kernel<R>(kernel: DecodeKernel, f: impl FnOnce() -> R) -> R {
    with_setting(&DECODE_KERNEL, Some(kernel), f)
}

/// Runs `f` with the decode attention's splits per (sequence, KV head) capped at `splits` rather
/// than what fills the GPU, for the kernel benchmark's sweep (`kernels decode-attention`); the
/// model always uses the default.
#[doc(hidden)]
pub fn with_decode_splits<R>(splits: i32, f: impl FnOnce() -> R) -> R {
    with_setting(&DECODE_SPLITS_OVERRIDE, Some(splits), f)
}

/// Tokens per split unit of the decode attention (a split takes at least this many).
const DECODE_BLOCK: usize = 64;

/// [`decode_attention`]'s kernel for `n` sequences (1 ..= [`DECODE_SLOTS`]): inputs the rows with
/// the queries (and gates), then k, v, k_recent, v_recent of each, then their lengths and settled
/// lengths; the body picks
/// thread block row y's buffers. CUDA only: Metal takes at most 31 buffers per kernel; it runs
/// MLX's attention. `lens` and `settled` are shape_args broadcasts, the rows are read through
/// their strides; the buffers are contiguous.
fn decode_attention_source(n: usize) -> &'static KernelSource {
    static SOURCES: std::sync::OnceLock<Vec<KernelSource>> = std::sync::OnceLock::new();
    slot_source(&SOURCES, n, |n| {
        let mut kernel = decode_slot_kernel(n, false);
        kernel.cuda_body = format!(
            "{} const int hq = gridDim.z * GB; \
             sala_decode_attention_split<T, D, G, GB, NSPLIT, SCALE_BITS>(row + Q_COL * rows_strides[2], \
             rows_strides[2], k, v, kr, vr, (COUNTS_IN_DATA ? lens[blockIdx.y] : lens_shape[blockIdx.y] - 1), settled_shape[blockIdx.y] - 1, cap, rcap, \
             out + (size_t)blockIdx.y * hq * NSPLIT * D, lse + (size_t)blockIdx.y * hq * NSPLIT);",
            kernel.cuda_body
        );
        kernel
    })
}

/// [`decode_attention_source`] over 8-bit caches' codes: after each sequence's four buffers (of
/// codes), their eight scale and bias buffers ([`kv_scale_buffers`]).
fn decode_attention_q8_source(n: usize) -> &'static KernelSource {
    static SOURCES: std::sync::OnceLock<Vec<KernelSource>> = std::sync::OnceLock::new();
    slot_source(&SOURCES, n, |n| {
        let mut kernel = decode_slot_kernel(n, true);
        kernel.name = format!("sala_decode_attention_q8_{n}");
        kernel.cuda_body = format!(
            "{} const int hq = gridDim.z * GB; \
             sala_decode_attention_split_q8<T, D, G, GB, NSPLIT, SCALE_BITS, QGROUP>(row + Q_COL * rows_strides[2], \
             rows_strides[2], k, v, kr, vr, qsb, (COUNTS_IN_DATA ? lens[blockIdx.y] : lens_shape[blockIdx.y] - 1), settled_shape[blockIdx.y] - 1, cap, rcap, \
             out + (size_t)blockIdx.y * hq * NSPLIT * D, lse + (size_t)blockIdx.y * hq * NSPLIT);",
            kernel.cuda_body
        );
        kernel
    })
}

/// The slot kernel the decode attention kernels share for `n` sequences: its inputs and outputs,
/// and a body that picks thread block row y's buffers (k, v, kr, vr, cap, rcap; with `codes`, u32
/// words, and their scales and biases `qsb`) and query row (`row`); the caller appends the
/// kernel's call.
fn decode_slot_kernel(n: usize, codes: bool) -> SlotKernel {
    let mut inputs = vec!["rows".to_string()];
    let mut cases = String::new();
    for i in 0..n {
        inputs.extend([format!("k{i}"), format!("v{i}"), format!("kr{i}"), format!("vr{i}")]);
        cases += &format!("case {i}: k = k{i}; v = v{i}; kr = kr{i}; vr = vr{i}; cap = k{i}_shape[2]; rcap = kr{i}_shape[2]; ");
        if codes {
            let planes = ["ks", "kb", "vs", "vb", "krs", "krb", "vrs", "vrb"].map(|p| format!("{p}{i}"));
            inputs.extend(planes.iter().cloned());
            cases += &format!(
                "qsb = SalaKvScales<T>{{{}, int(ks{i}_shape[2]), int(krs{i}_shape[2])}}; ",
                planes.join(", ")
            );
        }
        cases += "break; ";
    }
    inputs.extend(["lens".into(), "settled".into()]);
    let (storage, scales) = if codes { ("uint32_t", "SalaKvScales<T> qsb{}; ") } else { ("T", "") };
    SlotKernel {
        name: format!("sala_decode_attention{n}"),
        inputs,
        outputs: vec!["out".into(), "lse".into()],
        cuda_header: concat!(include_str!("../../cuda/unpack.cu"), include_str!("../../cuda/decode_attention.cu")),
        cuda_body: format!(
            "const {storage} *k = k0, *v = v0, *kr = kr0, *vr = vr0; int cap = k0_shape[2], rcap = kr0_shape[2]; {scales}\
             switch (blockIdx.y) {{ {cases}}} \
             const T* row = rows + blockIdx.y * rows_strides[0];"
        ),
    }
}

/// [`decode_attention_source`]'s tensor-core twin (`cuda/decode_attention_mma.cu`, the whole
/// cache: no block list), with the same inputs.
fn decode_attention_mma_source(n: usize) -> &'static KernelSource {
    static SOURCES: std::sync::OnceLock<Vec<KernelSource>> = std::sync::OnceLock::new();
    slot_source(&SOURCES, n, |n| {
        let mut kernel = decode_slot_kernel(n, false);
        kernel.name = format!("sala_decode_attention_mma{n}");
        kernel.cuda_header = DECODE_ATTENTION_MMA_HEADER;
        kernel.cuda_body = format!(
            "{} const int hq = gridDim.z * G; \
             sala_decode_attention_mma<T, D, G, NSPLIT, SCALE_BITS>(row + Q_COL * rows_strides[2], rows_strides[2], \
             k, v, kr, vr, (COUNTS_IN_DATA ? lens[blockIdx.y] : lens_shape[blockIdx.y] - 1), settled_shape[blockIdx.y] - 1, cap, rcap, (const int32_t*)nullptr, 0, \
             out + (size_t)blockIdx.y * hq * NSPLIT * D, lse + (size_t)blockIdx.y * hq * NSPLIT);",
            kernel.cuda_body
        );
        kernel
    })
}

/// The tensor-core decode attention's CUDA source with the mma helpers and attention steps it uses.
const DECODE_ATTENTION_MMA_HEADER: &str =
    concat!(include_str!("../../cuda/mma.cu"), include_str!("../../cuda/attention_mma.cu"), include_str!("../../cuda/decode_attention_mma.cu"));

/// Tokens per tile of the tensor-core decode attention (`SALA_MMA_TILE`).
const MMA_TILE: i32 = 64;

static MERGE_SPLITS: KernelSource = KernelSource {
    name: "sala_merge_splits",
    inputs: &["partial", "lse"],
    outputs: &["out"],
    cuda_header: BLOCK_SPARSE_ATTENTION_HEADER,
    cuda_body: "sala_merge_splits<T, D, NSPLIT, false>(partial, lse, (const T*)nullptr, 0, 0, out, partial_shape[0], HQ);",
    metal_header: include_str!("../../metal/block_sparse_attention.metal"),
    metal_body: "sala_merge_splits<T, D, NSPLIT, false>(partial, lse, (const device T*)nullptr, 0, 0, out, \
                 int(partial_shape[0]), HQ, thread_position_in_grid.x);",
    contiguous_inputs: true,
    shared_memory: 0,
};

static MERGE_SPLITS_GATED: KernelSource = KernelSource {
    name: "sala_merge_splits_gated",
    inputs: &["partial", "lse", "gate"],
    outputs: &["out"],
    cuda_header: BLOCK_SPARSE_ATTENTION_HEADER,
    cuda_body: "sala_merge_splits<T, D, NSPLIT, true>(partial, lse, gate, gate_strides[0], gate_strides[1], out, \
                partial_shape[0], HQ);",
    metal_header: include_str!("../../metal/block_sparse_attention.metal"),
    metal_body: "sala_merge_splits<T, D, NSPLIT, true>(partial, lse, gate, int64_t(gate_strides[0]), \
                 int64_t(gate_strides[1]), out, int(partial_shape[0]), HQ, thread_position_in_grid.x);",
    // The gate is read through its strides; the partial results are a kernel's fresh outputs.
    contiguous_inputs: false,
    shared_memory: 0,
};

/// Queries from which a half-precision call takes the tensor-core kernel: it gives each query one
/// warp and does not split the selected blocks, which only fills the GPU with many queries.
const MMA_QUERIES: i32 = 16;
/// Queries (warps) per thread block of the tensor-core kernel, sharing each staged tile: the
/// fastest in a sweep (eval/results/kernel-notes.md).
const MMA_QUERIES_PER_BLOCK: i32 = 4;
/// Selected blocks per query the tensor-core kernel over rows takes at most (its lists and their
/// union live in shared memory); SALA selects 96.
const PREFILL_MAX_SELECTED: i32 = 128;
/// Blocks in flight in that kernel's ring of staged tiles: a block's keys and values are requested
/// one step of the walk before they are used. Two stages leave room for three thread blocks an SM,
/// faster than three stages at two (eval/results/2026-12-04-h200-three-blocks).
const PREFILL_STAGES: i32 = 2;
/// Its dynamic shared memory, as `sala_prefill_ring_bytes` counts it for the largest launch
/// (bf16/f16 heads of 128, MMA_QUERIES_PER_BLOCK queries): the ring, then the lists, their owned
/// counts, the union and two counters a query. About 74 KB.
const fn prefill_ring_bytes() -> i32 {
    let qpb = MMA_QUERIES_PER_BLOCK;
    PREFILL_STAGES * 2 * 64 * (128 + 8) * 2 + (3 * qpb * PREFILL_MAX_SELECTED + 2 * qpb) * 4
}

/// The tensor-core prefill attention over rows, compiled for three thread blocks of 128 threads an
/// SM (at most 168 registers; ptxas spills a little). Template `PRIVATE`: each warp streams the
/// blocks only its query selected on its own (`cuda/block_sparse_prefill.cu`); the model's form.
static BLOCK_SPARSE_PREFILL: KernelSource = KernelSource {
    name: "sala_block_sparse_prefill",
    inputs: &["q", "k", "v", "k_recent", "v_recent", "blocks", "params"],
    outputs: &["out"],
    cuda_header: concat!(
        include_str!("../../cuda/unpack.cu"),
        include_str!("../../cuda/mma.cu"),
        include_str!("../../cuda/attention_mma.cu"),
        include_str!("../../cuda/block_sparse_prefill.cu"),
        include_str!("../../cuda/three_blocks_an_sm.cu")
    ),
    cuda_body: "sala_block_sparse_attention_mma<T, D, G, BLOCK, SCALE_BITS, QPB, NSEL, STAGES, PRIVATE>(\
                q, k, v, k_recent, v_recent, blocks, params_shape[0] - 1, params_shape[1] - 1, params_shape[2] - 1, \
                out, q_shape[1], k_shape[2], k_recent_shape[2], blocks_shape[3]);",
    // CUDA only (mma.sync); Metal takes BLOCK_SPARSE_ATTENTION.
    metal_header: "",
    metal_body: "",
    contiguous_inputs: false,
    shared_memory: prefill_ring_bytes(),
};

thread_local! {
    static UNION_PREFILL_WALK: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the tensor-core prefill attention over rows in its earlier form (every block
/// through the shared walk, `PRIVATE` off), for the kernels bench's comparison.
#[doc(hidden)]
pub fn with_union_prefill_walk<R>(f: impl FnOnce() -> R) -> R {
    with_setting(&UNION_PREFILL_WALK, Some(true), f)
}

static BLOCK_SPARSE_PREFILL_Q8: KernelSource = KernelSource {
    name: "sala_block_sparse_prefill_q8",
    inputs: &Q8_INPUTS,
    outputs: &["out"],
    cuda_header: BLOCK_SPARSE_PREFILL_HEADER,
    cuda_body: concat!(
        "sala_block_sparse_attention_mma_q8<T, D, G, BLOCK, SCALE_BITS, QPB, QGROUP>(q, k, v, k_recent, v_recent, ",
        q8_scales!(),
        ", blocks, params_shape[0] - 1, params_shape[1] - 1, params_shape[2] - 1, \
         out, q_shape[1], k_shape[2], k_recent_shape[2], blocks_shape[3]);"
    ),
    metal_header: "",
    metal_body: "",
    contiguous_inputs: false,
    shared_memory: 0,
};

const BLOCK_SPARSE_PREFILL_HEADER: &str = concat!(
    include_str!("../../cuda/unpack.cu"),
    include_str!("../../cuda/mma.cu"),
    include_str!("../../cuda/attention_mma.cu"),
    include_str!("../../cuda/block_sparse_prefill.cu")
);

/// Whether [`block_sparse_prefill_cuda`] takes these queries `[1, Hq, T, d]` over `hkv` KV heads
/// and block lists `[1, Hkv, T, K]` on `kv`: CUDA, half precision, many queries, at most 16 query
/// heads per KV head, 64-token blocks; over a cache of rows (the ring kernel) at most
/// [`PREFILL_MAX_SELECTED`] blocks a query and block numbers in 24 bits (the union's entries keep
/// the takers above them). The 8-bit cache's kernel reads the lists in place and has neither limit.
pub fn prefill_fits(q: &Array, hkv: i32, block: usize, blocks: &Array, kv: &KvParts) -> bool {
    let (hq, t, d) = (q.shape()[1], q.shape()[2], q.shape()[3]);
    let half = matches!(q.dtype(), Dtype::Bfloat16 | Dtype::Float16);
    backend() == Backend::Cuda
        && half
        && t >= MMA_QUERIES
        && hq / hkv <= 16
        && d % 32 == 0
        && d <= 128
        && block == 64
        && (reads_codes_in_place(kv) || (blocks.shape()[3] <= PREFILL_MAX_SELECTED && kv.len.div_ceil(block) < 1 << 24))
}

/// The block-sparse attention for many half-precision queries on CUDA's tensor cores
/// (`cuda/block_sparse_prefill.cu`): the same attention, with the probabilities rounded to the
/// model's dtype before they weight the values, as flash attention rounds them. Heads
/// `[1, Hq, T, d]` (see [`heads_to_rows`]). Reads an 8-bit cache in place ([`reads_codes_in_place`]).
pub fn block_sparse_prefill_cuda(q: &Array, kv: &KvParts, blocks: &Array, first_pos: usize, block: usize, scale: f32) -> Result<Array> {
    let (hq, t, d) = (q.shape()[1], q.shape()[2], q.shape()[3]);
    let hkv = kv.keys.shape()[1];
    if !reads_codes_in_place(kv) && blocks.shape()[3] > PREFILL_MAX_SELECTED {
        return Err(mlx_rs::error::Exception::custom(format!("{} blocks a query: the prefill kernel takes at most {PREFILL_MAX_SELECTED}", blocks.shape()[3])));
    }
    let params = shape_args(&[first_pos, kv.len, kv.settled])?;
    let q3 = q.reshape(&[hq, t, d])?.contiguous()?;
    let private = !UNION_PREFILL_WALK.with(|o| o.get()).unwrap_or(false);
    let qpb = MMA_QUERIES_PER_BLOCK;
    let launch = Launch {
        grid: (32 * qpb, (t + qpb - 1) / qpb, hkv),
        threads: (32 * qpb, 1, 1),
        outputs: vec![(vec![1, hq, t, d], q.dtype())],
        template: vec![
            ("T", TemplateArg::Type(q.dtype())),
            ("D", TemplateArg::Int(d)),
            ("G", TemplateArg::Int(hq / hkv)),
            ("BLOCK", TemplateArg::Int(block as i32)),
            ("SCALE_BITS", TemplateArg::Int(scale.to_bits() as i32)),
            ("QPB", TemplateArg::Int(qpb)),
            ("NSEL", TemplateArg::Int(PREFILL_MAX_SELECTED)),
            ("STAGES", TemplateArg::Int(PREFILL_STAGES)),
            ("PRIVATE", TemplateArg::Bool(private)),
        ],
        init: None,
    };
    let sources = [&BLOCK_SPARSE_PREFILL, &BLOCK_SPARSE_PREFILL_Q8];
    let out = apply_over_cache(sources, &q3, kv, &blocks.contiguous()?, &params, launch)?;
    Ok(out.into_iter().next().expect("one output"))
}

static SELECT_LSE_MMA: KernelSource = KernelSource {
    name: "sala_select_lse_mma",
    inputs: &["q", "c2", "params"],
    outputs: &["partial"],
    cuda_header: SELECT_MMA_HEADER,
    cuda_body: "sala_select_lse_mma<K, D, G, KERNEL2, STRIDE2, SCALE_BITS, QPB, WGMMA>(\
                q, c2, params_shape[0] - 1, partial, q_shape[1], c2_shape[0]);",
    // CUDA only (mma.sync, cp.async); Metal takes SELECT_BLOCKS / SELECT_WINDOWS.
    metal_header: "",
    metal_body: "",
    contiguous_inputs: false,
    shared_memory: 0,
};

static SELECT_WINDOWS_MMA: KernelSource = KernelSource {
    name: "sala_select_windows_mma",
    inputs: &["q", "c1", "partial", "params"],
    outputs: &["maxima"],
    cuda_header: SELECT_MMA_HEADER,
    cuda_body: "sala_select_windows_mma<R, K, D, G, KERNEL, STRIDE, BLOCK, SCALE_BITS, QPB>(\
                q, c1, partial, params_shape[0] - 1, maxima, q_shape[1], c1_shape[0], partial_shape[2]);",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: false,
    shared_memory: 0,
};

const SELECT_MMA_HEADER: &str = concat!(
    include_str!("../../cuda/unpack.cu"),
    include_str!("../../cuda/select_blocks.cu"),
    include_str!("../../cuda/mma.cu"),
    include_str!("../../cuda/attention_mma.cu"),
    include_str!("../../cuda/block_sparse_prefill.cu"),
    include_str!("../../cuda/wgmma.cu"),
    include_str!("../../cuda/select_mma.cu")
);

/// [`SELECT_WINDOWS_MMA`] on Hopper (`sala_select_windows_wgmma`: keys by queries on wgmma).
static SELECT_WINDOWS_WGMMA: KernelSource = KernelSource {
    name: "sala_select_windows_wgmma",
    inputs: &["q", "c1", "partial", "params"],
    outputs: &["maxima"],
    cuda_header: SELECT_MMA_HEADER,
    cuda_body: "sala_select_windows_wgmma<R, D, G, KERNEL, STRIDE, BLOCK, SCALE_BITS>(\
                q, c1, partial, params_shape[0] - 1, maxima, q_shape[1], c1_shape[0], partial_shape[2]);",
    metal_header: "",
    metal_body: "",
    contiguous_inputs: false,
    // Two key tiles and two warpgroups' query rows of 64 × 128 bf16, their lse, 1024 to align
    // them to the swizzle's atoms.
    shared_memory: 4 * 64 * 128 * 2 + 2 * 64 * 4 + 1024,
};

/// Level-1 window tiles per thread block of the tensor-core window scores, at most, for queries
/// taken one per thread block (eval/results/kernel-notes.md).
const WINDOW_TILES_PER_RANGE: i32 = 4;

thread_local! {
    static WINDOW_TILES_OVERRIDE: std::cell::Cell<Option<i32>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with [`WINDOW_TILES_PER_RANGE`] set to `tiles`, for the kernel benchmark's sweep
/// (`kernels sparse-profile`); the model always uses the default.
#[doc(hidden)]
pub fn with_window_tiles<R>(tiles: i32, f: impl FnOnce() -> R) -> R {
    with_setting(&WINDOW_TILES_OVERRIDE, Some(tiles), f)
}

thread_local! {
    static SELECT_ON_MMA_SYNC: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the tensor-core stage 1 on mma.sync even on Hopper (its form before wgmma), for
/// the kernels bench's comparison and the test that both forms agree; the model uses wgmma there.
#[doc(hidden)]
pub fn with_selection_on_mma_sync<R>(f: impl FnOnce() -> R) -> R {
    with_setting(&SELECT_ON_MMA_SYNC, Some(true), f)
}

/// Queries (warps) per thread block of the tensor-core stage 1 when there are many queries (the
/// faster in a sweep: eval/results/kernel-notes.md); one query per thread block below
/// [`MMA_QUERIES`].
const SELECT_QUERIES_PER_BLOCK: i32 = 8;

/// [`select_blocks_gpu`] for bf16 queries on CUDA (`cuda/select_mma.cu`): the level-2
/// log-sum-exp and the window scores on tensor cores straight from the pooled keys (no float32
/// score matrices; bf16 keys scored as the reference scores them, float32 keys with ≈ 2⁻¹⁷
/// relative error), then the pooling and top-k kernel, one thread block per query. Few queries
/// (decode) split the windows into ranges over many thread blocks. On Hopper many queries' bf16
/// keys are scored by wgmma, four queries a warpgroup.
pub fn select_blocks_fused(
    q: &Array,
    c1: &Array,
    c2: &Array,
    first_pos: usize,
    kv_len: usize,
    sel: &BlockSelection,
    score_dtype: Dtype,
) -> Result<Selected> {
    let (hq, t, d) = (q.shape()[1], q.shape()[2], q.shape()[3]);
    let hkv = c1.shape()[1];
    let n1 = c1.shape()[2];
    let nb = kv_len.div_ceil(sel.block) as i32;
    let int = |v: usize| TemplateArg::Int(v as i32);
    let qpb = if t >= MMA_QUERIES { SELECT_QUERIES_PER_BLOCK } else { 1 };
    let query_blocks = (t + qpb - 1) / qpb;
    // Ranges of 64-window tiles: enough thread blocks to fill the GPU, and for one query a thread
    // block at least every WINDOW_TILES_PER_RANGE level-1 tiles (its single warp streams them).
    let tiles = |n: i32| ((n + 63) / 64).max(1);
    let ranges = |n: i32| (fill_blocks() / (query_blocks * hkv)).clamp(1, tiles(n));
    let per_range = WINDOW_TILES_OVERRIDE.with(|o| o.get()).unwrap_or(WINDOW_TILES_PER_RANGE);
    let key_type = if c1.dtype() == Dtype::Bfloat16 { Dtype::Bfloat16 } else { Dtype::Float32 };
    // Warpgroups of four queries score bf16 keys with wgmma on Hopper; float32 keys (two products
    // each) and one query a block take mma.sync.
    let wgmma = qpb == SELECT_QUERIES_PER_BLOCK
        && key_type == Dtype::Bfloat16
        && d % 64 == 0
        && hopper()
        && !SELECT_ON_MMA_SYNC.with(|o| o.get()).unwrap_or(false);
    let window_ranges = if qpb == 1 { ranges(n1).max(tiles(n1) / per_range) } else { ranges(n1) };
    // Window-major `[n, Hkv, d]`: the cache's pooled keys as stored (no copy; see PooledKeys).
    let keys = |c: &Array| -> Result<Array> { c.as_dtype(key_type)?.swap_axes(1, 2)?.reshape(&[-1, hkv, d])?.contiguous() };
    let q3 = q.reshape(&[hq, t, d])?.contiguous()?;
    let params = shape_args(&[first_pos, nb as usize])?;
    let common = [
        ("K", TemplateArg::Type(key_type)),
        ("D", TemplateArg::Int(d)),
        ("G", TemplateArg::Int(hq / hkv)),
        ("SCALE_BITS", TemplateArg::Int((d as f32).powf(-0.5).to_bits() as i32)),
        ("QPB", TemplateArg::Int(qpb)),
        ("WGMMA", TemplateArg::Bool(wgmma)),
    ];
    let launch = |ranges: i32, output: (Vec<i32>, Dtype), own: Vec<(&'static str, TemplateArg)>| Launch {
        grid: (32 * qpb * ranges, query_blocks, hkv),
        threads: (32 * qpb, 1, 1),
        outputs: vec![output],
        template: common.iter().cloned().chain(own).collect(),
        init: None,
    };
    let r2 = ranges(c2.shape()[2]);
    let partial = apply(
        &SELECT_LSE_MMA,
        &[&q3, &keys(c2)?, &params],
        launch(r2, (vec![hkv, t, r2, 32], Dtype::Float32), vec![("KERNEL2", int(sel.kernel2)), ("STRIDE2", int(sel.stride2))]),
    )?;
    let own = vec![
        ("R", TemplateArg::Type(score_dtype)),
        ("KERNEL", int(sel.kernel)),
        ("STRIDE", int(sel.stride)),
        ("BLOCK", int(sel.block)),
    ];
    let groups = sel.window_groups(n1 as usize) as i32;
    let mut windows = launch(window_ranges, (vec![hkv, t, 2 * groups], score_dtype), own);
    let source = if wgmma {
        // Its kernel takes only the window geometry and the shapes.
        windows.template.retain(|(name, _)| !matches!(*name, "K" | "QPB" | "WGMMA"));
        &SELECT_WINDOWS_WGMMA
    } else {
        windows.template.retain(|(name, _)| *name != "WGMMA");
        &SELECT_WINDOWS_MMA
    };
    let maxima = apply(source, &[&q3, &keys(c1)?, &partial[0], &params], windows)?;
    pool_topk(&maxima[0], true, &params, nb, sel)
}
