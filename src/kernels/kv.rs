//! A decode token's keys and values written into the sequences' recent-token buffers (see
//! `engine::cache::SeqBuffer`): `cuda/kv_append.cu` for a whole batch in one launch, MLX's slice
//! updates per sequence otherwise (the CPU, Metal, and the kernel's test oracle).
//!
//! In MLX ops this is a slice, a reshape, a transpose and a slice update for the keys and again for
//! the values of every sequence; a decode step is bound by the host's work per operation, and
//! a batch of 8 made 112 of them per sparse layer.

use super::custom::{apply, backend, device_counts, in_pieces, shape_args, slot_source, Backend, KernelSource, Launch, SlotKernel, TemplateArg, MAX_SHAPE_ARGS};
use super::selfcheck::{self, sample, verify, KernelCheck, Verdict, CUDA_ONLY};
use crate::engine::cache::{KvCache, StepCounts};
use mlx_rs::{error::Result, ops::indexing::TryIndexMutOp, ops::indexing::TryIndexOp, Array, Dtype};

/// Where a token's keys and values are in the stacked projection's rows, and how many there are.
#[derive(Debug, Clone, Copy)]
pub struct KvColumns {
    /// Column of the first key.
    pub keys: i32,
    /// Column of the first value.
    pub values: i32,
    pub kv_heads: i32,
    pub head_dim: i32,
}

/// One sequence's recent-token buffers `[1, Hkv, capacity, d]` (whole, contiguous arrays) and
/// the position in them the token goes to: `at`, or in a fixed decode step the device's
/// `counts` (then `at` is the host's count when the step was traced, not to be read).
pub struct RecentSlot {
    pub keys: Array,
    pub values: Array,
    pub at: usize,
    pub counts: Option<StepCounts>,
}

impl RecentSlot {
    /// A slot written at `at`, known on the host.
    pub fn at(keys: Array, values: Array, at: usize) -> Self {
        Self { keys, values, at, counts: None }
    }
}

/// The buffers of every slot with row b's keys and values (`rows` `[B, 1, W]`, a view of the
/// projection's output is fine) at position `at`, positions before it as they were: new arrays,
/// one (keys, values) pair per slot. Positions after `at` are unspecified.
pub fn append_token(rows: &Array, columns: KvColumns, slots: &[RecentSlot]) -> Result<Vec<(Array, Array)>> {
    let fits = backend() == Backend::Cuda
        && rows.shape().len() == 3
        && rows.shape()[0] as usize == slots.len()
        && rows.shape()[1] == 1
        && (columns.head_dim * rows.item_size() as i32) % 16 == 0
        && slots.iter().all(|s| {
            s.keys.dtype() == rows.dtype()
                && s.values.dtype() == rows.dtype()
                && s.keys.shape() == s.values.shape()
                && s.keys.shape() == slots[0].keys.shape()
                && s.keys.shape().len() == 4
                && s.keys.shape()[0] == 1
                && s.keys.shape()[1] == columns.kv_heads
                && s.keys.shape()[3] == columns.head_dim
                && s.at < s.keys.shape()[2] as usize
                && s.counts.is_some() == slots[0].counts.is_some()
        })
        && selfcheck::enabled(&APPEND_CHECK);
    if !fits {
        return append_token_mlx(rows, columns, slots);
    }
    let pieces = in_pieces(rows, slots, MAX_SHAPE_ARGS, |rows, _, slots| append_token_cuda(rows, columns, slots))?;
    Ok(pieces.into_iter().flatten().collect())
}

/// Appends each sequence's decode token (row b of `rows`, at `columns`) to `caches[b]` behind its
/// recent tokens, through [`append_token`]. The caches must not be empty.
pub fn append_to_caches(rows: &Array, columns: KvColumns, caches: &mut [&mut KvCache]) -> Result<()> {
    append_with(caches, |slots| Ok(((), append_token(rows, columns, slots)?)))
}

/// Hands `write` each cache's [`RecentSlot`] and takes the buffers it returns, one (keys, values)
/// pair per cache with the token written, as the caches' recent tokens. The caches must not be
/// empty.
pub fn append_with<T>(caches: &mut [&mut KvCache], write: impl FnOnce(&[RecentSlot]) -> Result<(T, Vec<(Array, Array)>)>) -> Result<T> {
    let slots = caches
        .iter_mut()
        .map(|c| {
            let (keys, values, at) = c.recent_slot()?.expect("the caller checks that every cache holds tokens");
            Ok(RecentSlot { keys, values, at, counts: c.step_counts().cloned() })
        })
        .collect::<Result<Vec<_>>>()?;
    let (result, written) = write(&slots)?;
    for (cache, (keys, values)) in caches.iter_mut().zip(written) {
        cache.commit_recent(keys, values)?;
    }
    Ok(result)
}

/// The MLX-ops version of [`append_token`]: a slice update of each buffer.
pub fn append_token_mlx(rows: &Array, columns: KvColumns, slots: &[RecentSlot]) -> Result<Vec<(Array, Array)>> {
    let KvColumns { keys, values, kv_heads: h, head_dim: d } = columns;
    slots
        .iter()
        .enumerate()
        .map(|(b, slot)| {
            let b = b as i32;
            let token = |col: i32| -> Result<Array> {
                rows.try_index((b..b + 1, .., col..col + h * d))?.reshape(&[1, 1, h, d])?.swap_axes(1, 2)
            };
            if let Some(counts) = &slot.counts {
                let write = |buffer: &Array, col: i32| crate::engine::ops::slice_update_dynamic(buffer, &token(col)?, &counts.recent_at, &[2]);
                return Ok((write(&slot.keys, keys)?, write(&slot.values, values)?));
            }
            let at = slot.at as i32;
            let mut k = slot.keys.clone();
            k.try_index_mut((.., .., at..at + 1, ..), &token(keys)?)?;
            let mut v = slot.values.clone();
            v.try_index_mut((.., .., at..at + 1, ..), &token(values)?)?;
            Ok((k, v))
        })
        .collect()
}

/// The append kernel against [`append_token_mlx`] in bfloat16: two sequences at different fills,
/// their rows a view of wider ones, the places given by the host and by the device. Positions
/// after each token's are not compared (unspecified).
pub static APPEND_CHECK: KernelCheck = KernelCheck { name: "kv_append", backends: CUDA_ONLY, run: check_append };

fn check_append() -> Verdict {
    let (hq, hkv, d, capacity) = (4, 2, 64, 16);
    let columns = KvColumns { keys: hq * d, values: (hq + hkv) * d, kv_heads: hkv, head_dim: d };
    let width = (2 * hq + 2 * hkv) * d;
    let at = [3, 15];
    let filled = |pairs: Vec<(Array, Array)>| -> Result<Vec<Array>> {
        let mut out = Vec::new();
        for ((k, v), at) in pairs.into_iter().zip(at) {
            out.push(k.try_index((.., .., ..=at as i32, ..))?);
            out.push(v.try_index((.., .., ..=at as i32, ..))?);
        }
        Ok(out)
    };
    verify(
        || {
            let bf16 = Dtype::Bfloat16;
            let rows = sample(&[2, 1, width + 8], 31, bf16)?.try_index((.., .., 8..))?;
            let slots = (0..2)
                .map(|i| {
                    let buffer = |seed| sample(&[1, hkv, capacity, d], seed, bf16);
                    Ok(RecentSlot::at(buffer(32 + 2 * i as u64)?, buffer(33 + 2 * i as u64)?, at[i]))
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((rows, slots))
        },
        // Each place given as host integers, then as the device's counts (a fixed step).
        |(rows, slots)| {
            let mut out = filled(append_token_cuda(rows, columns, slots)?)?;
            out.extend(filled(append_token_cuda(rows, columns, &with_device_places(slots, &at)?)?)?);
            Ok(out)
        },
        |(rows, slots)| {
            let once = filled(append_token_mlx(rows, columns, slots)?)?;
            Ok(once.iter().chain(&once).cloned().collect())
        },
    )
}

/// `slots` with their places `at`, and the tokens' `positions` (each at least its `at`), as a
/// fixed step's device counts (for the kernels' checks; the host's `at` is then wrong on purpose).
pub fn with_device_places(slots: &[RecentSlot], positions: &[usize]) -> Result<Vec<RecentSlot>> {
    slots
        .iter()
        .zip(positions)
        .map(|(s, &p)| {
            let counts = StepCounts::new(&Array::from_slice(&[p as i32], &[1]), p - s.at)?;
            Ok(RecentSlot { keys: s.keys.clone(), values: s.values.clone(), at: 0, counts: Some(counts) })
        })
        .collect()
}

/// At most [`MAX_SHAPE_ARGS`] slots: thread block row y = slot, z = keys (0) or values (1).
fn append_token_cuda(rows: &Array, columns: KvColumns, slots: &[RecentSlot]) -> Result<Vec<(Array, Array)>> {
    const THREADS: i32 = 256;
    let n = slots.len();
    let shape = slots[0].keys.shape().to_vec();
    let dtype = rows.dtype();
    let vec = 16 / rows.item_size() as i32;
    // A fixed step's places are the device's: its grid covers the whole buffer.
    let device = device_counts(slots.iter().map(|s| s.counts.as_ref().map(|c| &c.recent_at)))?;
    let longest = match device {
        Some(_) => shape[2],
        None => slots.iter().map(|s| s.at).max().unwrap_or(0) as i32 + 1,
    };
    let pieces = columns.kv_heads * longest * columns.head_dim / vec;
    let blocks = ((pieces + THREADS - 1) / THREADS).clamp(1, 32);
    let at = match &device {
        Some(at) => at.clone(),
        None => shape_args(&slots.iter().map(|s| s.at).collect::<Vec<_>>())?,
    };
    let mut inputs: Vec<&Array> = vec![rows];
    inputs.extend(slots.iter().map(|s| &s.keys));
    inputs.extend(slots.iter().map(|s| &s.values));
    inputs.push(&at);
    let out = apply(
        append_source(n),
        &inputs,
        Launch {
            grid: (blocks * THREADS, n as i32, 2),
            threads: (THREADS, 1, 1),
            outputs: vec![(shape, dtype); 2 * n],
            template: vec![
                ("T", TemplateArg::Type(dtype)),
                ("HKV", TemplateArg::Int(columns.kv_heads)),
                ("D", TemplateArg::Int(columns.head_dim)),
                ("K_OFF", TemplateArg::Int(columns.keys)),
                ("V_OFF", TemplateArg::Int(columns.values)),
                ("COUNTS_IN_DATA", TemplateArg::Bool(device.is_some())),
            ],
            init: None,
        },
    )?;
    let (keys, values) = out.split_at(n);
    Ok(keys.iter().cloned().zip(values.iter().cloned()).collect())
}

/// The kernel for `n` slots (1 ..= [`MAX_SHAPE_ARGS`]): inputs rows, k0 … k(n−1), v0 … v(n−1),
/// at; outputs ko0 …, vo0 …. CUDA only, as the batched decode attention it feeds (Metal takes at
/// most 31 buffers a kernel): Metal runs the slice updates. `at` is a shape_args broadcast, or with
/// `COUNTS_IN_DATA` the device's places (a fixed step); the rows are read through their strides;
/// the buffers are whole arrays.
fn append_source(n: usize) -> &'static KernelSource {
    static SOURCES: std::sync::OnceLock<Vec<KernelSource>> = std::sync::OnceLock::new();
    slot_source(&SOURCES, n, |n| {
        let mut inputs = vec!["rows".to_string()];
        inputs.extend((0..n).map(|i| format!("k{i}")));
        inputs.extend((0..n).map(|i| format!("v{i}")));
        inputs.push("at".into());
        let mut outputs: Vec<String> = (0..n).map(|i| format!("ko{i}")).collect();
        outputs.extend((0..n).map(|i| format!("vo{i}")));
        let cases: String =
            (0..n).map(|i| format!("case {i}: recent = blockIdx.z ? v{i} : k{i}; out = blockIdx.z ? vo{i} : ko{i}; break; ")).collect();
        SlotKernel {
            name: format!("sala_kv_append{n}"),
            inputs,
            outputs,
            cuda_header: include_str!("../../cuda/kv_append.cu"),
            cuda_body: format!(
                "const T* recent = k0; T* out = ko0; switch (blockIdx.y) {{ {cases}}} \
                 sala_kv_append_seq<T, HKV, D>(rows + blockIdx.y * rows_strides[0], rows_strides[2], \
                 blockIdx.z ? V_OFF : K_OFF, recent, out, k0_shape[2], COUNTS_IN_DATA ? at[blockIdx.y] : at_shape[blockIdx.y] - 1);"
            ),
        }
    })
}
