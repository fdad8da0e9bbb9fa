//! The key/value cache's two parts (history + recent tokens, `SeqBuffer`): whatever mix of
//! appends, flushes and rollbacks, every reader sees the positions in order, and the pooled keys
//! are those of a cache filled the plain way; an 8-bit buffer (`QuantizedSeqBuffer`) reads back
//! what MLX dequantizes, in lockstep through the same edits.

use mlx_rs::Array;
use sala::engine::cache::{KvCache, KvFormat, QuantizedSeqBuffer, SeqBuffer};
use sala::engine::ops::to_vec_f32;
use sala::kernels::kv::{append_token_mlx, KvColumns, RecentSlot};
use sala::models::sala::infllm::compressed_keys;

/// `[1, 1, t, 1]` holding the token positions `from..from+t`.
fn positions(from: usize, t: usize) -> Array {
    let v: Vec<f32> = (from..from + t).map(|p| p as f32).collect();
    Array::from_slice(&v, &[1, 1, t as i32, 1])
}

fn expected(len: usize) -> Vec<f32> {
    (0..len).map(|p| p as f32).collect()
}

/// Reads the cache back through `parts` (what the kernels get) and checks it holds 0..len.
fn assert_holds_positions(cache: &mut KvCache, len: usize) {
    assert_eq!(cache.len(), len);
    let parts = cache.parts().unwrap().expect("not empty");
    assert_eq!(parts.len, len);
    assert!(parts.settled <= len && (parts.recent.is_some() || parts.settled == len));
    let (keys, values) = parts.filled().unwrap();
    assert_eq!(to_vec_f32(&keys).unwrap(), expected(len), "keys at length {len}");
    assert_eq!(to_vec_f32(&values).unwrap(), expected(len), "values at length {len}");
}

#[test]
fn recent_tokens_follow_the_history_in_every_reader() {
    let recent = SeqBuffer::RECENT;
    let mut cache = KvCache::default();
    // A prefill chunk (to the history), single tokens past one flush of the recent buffer, then
    // a verify-sized chunk that does not fit the recent room left.
    let mut len = 0;
    for t in std::iter::once(300).chain(std::iter::repeat_n(1, recent + 10)).chain([7, recent - 3, recent + 5]) {
        cache.append_recent(&positions(len, t), &positions(len, t)).unwrap();
        len += t;
        assert_holds_positions(&mut cache, len);
    }
    // A mixed-up cache and a plain one give the same pooled keys, at both levels.
    let mut plain = KvCache::default();
    plain.append(&positions(0, len), &positions(0, len)).unwrap();
    for (kernel, stride) in [(32, 16), (128, 64)] {
        let got = to_vec_f32(&compressed_keys(&mut cache, kernel, stride).unwrap().unwrap()).unwrap();
        let want = to_vec_f32(&compressed_keys(&mut plain, kernel, stride).unwrap().unwrap()).unwrap();
        assert_eq!(got, want, "pooled keys {kernel}/{stride}");
    }
    // The contiguous reader (dense attention) moves the recent tokens into the history.
    cache.append_recent(&positions(len, 1), &positions(len, 1)).unwrap();
    len += 1;
    let (keys, _) = cache.append(&positions(len, 1), &positions(len, 1)).unwrap();
    len += 1;
    assert_eq!(to_vec_f32(&keys).unwrap(), expected(len));
    assert_eq!(cache.parts().unwrap().unwrap().settled, len);
}

#[test]
fn rollback_inside_the_recent_tokens_and_inside_the_history() {
    let mut cache = KvCache::default();
    cache.append(&positions(0, 500), &positions(0, 500)).unwrap();
    for p in 500..520 {
        cache.append_recent(&positions(p, 1), &positions(p, 1)).unwrap();
    }
    // Inside the recent tokens: the history stays, the recent part shrinks.
    cache.truncate(510);
    assert_holds_positions(&mut cache, 510);
    assert_eq!(cache.parts().unwrap().unwrap().settled, 500);
    // Writing again after a rollback overwrites the dropped positions.
    for p in 510..515 {
        cache.append_recent(&positions(p, 1), &positions(p, 1)).unwrap();
    }
    assert_holds_positions(&mut cache, 515);
    // Inside the history: the recent tokens go too.
    cache.truncate(450);
    assert_holds_positions(&mut cache, 450);
    cache.append_recent(&positions(450, 3), &positions(450, 3)).unwrap();
    assert_holds_positions(&mut cache, 453);
    assert_eq!(to_vec_f32(&compressed_keys(&mut cache, 32, 16).unwrap().unwrap()).unwrap().len(), (453 - 32) / 16 + 1);
}

/// One decode token as the sparse layers append it: written into the recent-token buffers that
/// [`KvCache::recent_slot`] hands out (by the kernel's MLX-ops version) and committed back.
fn append_decoded(cache: &mut KvCache, position: usize) {
    let (keys, values, at) = cache.recent_slot().unwrap().expect("not empty");
    // The projection's row: an unrelated column, then the key, then the value.
    let row = Array::from_slice(&[-1.0f32, position as f32, position as f32], &[1, 1, 3]);
    let columns = KvColumns { keys: 1, values: 2, kv_heads: 1, head_dim: 1 };
    let written = append_token_mlx(&row, columns, &[RecentSlot::at(keys, values, at)]).unwrap();
    let (keys, values) = written.into_iter().next().unwrap();
    cache.commit_recent(keys, values).unwrap();
}

#[test]
fn decode_tokens_written_into_recent_slots_follow_the_history() {
    let mut cache = KvCache::default();
    assert!(cache.recent_slot().unwrap().is_none(), "an empty cache has no slot");
    cache.append(&positions(0, 40), &positions(0, 40)).unwrap();
    // Past two flushes of the recent buffer, mixed with appends of several tokens.
    let mut len = 40;
    for round in 0..2 * SeqBuffer::RECENT + 30 {
        if round % 97 == 5 {
            cache.append_recent(&positions(len, 3), &positions(len, 3)).unwrap();
            len += 3;
        }
        append_decoded(&mut cache, len);
        len += 1;
        assert_holds_positions(&mut cache, len);
    }
    // Rolled back inside the recent tokens, then written again.
    cache.truncate(len - 4);
    len -= 4;
    for _ in 0..6 {
        append_decoded(&mut cache, len);
        len += 1;
    }
    assert_holds_positions(&mut cache, len);
    let mut plain = KvCache::default();
    plain.append(&positions(0, len), &positions(0, len)).unwrap();
    let got = to_vec_f32(&compressed_keys(&mut cache, 32, 16).unwrap().unwrap()).unwrap();
    assert_eq!(got, to_vec_f32(&compressed_keys(&mut plain, 32, 16).unwrap().unwrap()).unwrap());
}

#[test]
fn a_cache_of_recent_tokens_only_is_read_from_its_history() {
    let mut cache = KvCache::default();
    cache.append_recent(&positions(0, 5), &positions(0, 5)).unwrap();
    // Kernels read the history buffer first, so it is started from the recent tokens.
    let parts = cache.parts().unwrap().unwrap();
    assert_eq!((parts.settled, parts.len, parts.recent.is_none()), (5, 5, true));
    assert_holds_positions(&mut cache, 5);
}

#[test]
fn pooled_keys_are_the_windows_means_in_the_keys_dtype() {
    // bf16 keys: each window's mean is summed in float32 and rounded once to bf16, as the
    // reference stores it (CUDA's stage 1 reads these bf16 values as they are).
    let len = 200;
    let keys = positions(0, len).multiply(Array::from_f32(1.0 / 3.0)).unwrap().as_dtype(mlx_rs::Dtype::Bfloat16).unwrap();
    let stored = to_vec_f32(&keys).unwrap();
    let mut cache = KvCache::default();
    cache.append(&keys, &keys).unwrap();
    for (kernel, stride) in [(32usize, 16usize), (128, 64)] {
        let pooled = compressed_keys(&mut cache, kernel, stride).unwrap().unwrap();
        assert_eq!(pooled.dtype(), mlx_rs::Dtype::Bfloat16, "{kernel}/{stride}");
        let got = to_vec_f32(&pooled).unwrap();
        let want: Vec<f32> = (0..(len - kernel) / stride + 1)
            .map(|w| {
                let mean = stored[w * stride..w * stride + kernel].iter().sum::<f32>() / kernel as f32;
                half::bf16::from_f32(mean).to_f32()
            })
            .collect();
        assert_eq!(got, want, "pooled keys {kernel}/{stride}");
    }
}

/// A cache told how long it will get allocates its history at exactly that length, where one that
/// is not rounds its growth up (by up to an eighth of its length); both hold the same positions.
/// Filled as a benchmark fills it: 2048-token chunks to 20480, then decode tokens through the
/// recent buffer past two flushes into the history.
#[test]
fn a_reserved_cache_is_allocated_at_the_length_it_was_told() {
    let (prompt, decoded) = (20480, 2 * SeqBuffer::RECENT + 20);
    let total = prompt + decoded;
    let fill = |cache: &mut KvCache| {
        for start in (0..prompt).step_by(2048) {
            cache.append(&positions(start, 2048), &positions(start, 2048)).unwrap();
        }
        for p in prompt..total {
            append_decoded(cache, p);
        }
        assert_holds_positions(cache, total);
    };
    let mut reserved = KvCache::default();
    reserved.reserve(total);
    fill(&mut reserved);
    let mut grown = KvCache::default();
    fill(&mut grown);
    // Keys and values, one float each per position: the history, plus the recent-token buffers.
    let bytes = |history: usize| 2 * 4 * (history + SeqBuffer::RECENT);
    assert_eq!(reserved.nbytes(), bytes(total));
    assert!(grown.nbytes() > bytes(total), "an unreserved cache rounds its growth up ({} bytes)", grown.nbytes());
    // A reservation shorter than what arrives is outgrown the usual way.
    let mut short = KvCache::default();
    short.reserve(1000);
    fill(&mut short);
    assert_eq!(short.nbytes(), grown.nbytes());
}

/// `[1, 2, t, d]` rows of distinct values in about [-1, 1) for the tokens `from..from+t`.
fn rows(from: usize, t: usize, d: usize) -> Array {
    let v: Vec<f32> = (0..2 * t * d)
        .map(|i| {
            let (head, token, j) = (i / (t * d), from + i / d % t, i % d);
            ((token * 7919 + head * 104_729 + j * 613) % 2000) as f32 / 1000.0 - 1.0
        })
        .collect();
    // Head-major: the flat index above is (head, token, j).
    Array::from_slice(&v, &[1, 2, t as i32, d as i32])
}

/// What MLX makes of `rows(0, len, d)` quantized and dequantized in one piece.
fn quantized_rows(len: usize, d: usize) -> Vec<f32> {
    let (codes, scales, biases) = mlx_rs::ops::quantize(rows(0, len, d), 64, 8).unwrap();
    to_vec_f32(&mlx_rs::ops::dequantize(&codes, &scales, &biases, 64, 8).unwrap()).unwrap()
}

/// Tokens `start..end` of `[1, 2, len, d]` values laid out head-major.
fn tokens(all: &[f32], len: usize, d: usize, start: usize, end: usize) -> Vec<f32> {
    (0..2).flat_map(|h| all[(h * len + start) * d..(h * len + end) * d].iter().copied()).collect()
}

#[test]
fn a_quantized_buffer_reads_back_mlx_dequantized_rows_whichever_way_they_came() {
    let d = 128;
    let mut buffer = QuantizedSeqBuffer::new(8, 64);
    let mut len = 0;
    // A prefill chunk, single tokens past a flush of the recent buffer, a chunk too large for it.
    for (t, recent) in std::iter::once((300, false))
        .chain(std::iter::repeat_n((1, true), SeqBuffer::RECENT + 10))
        .chain([(7, true), (SeqBuffer::RECENT + 5, true), (3, false)])
    {
        let x = rows(len, t, d);
        if recent {
            buffer.append_recent(&x).unwrap();
        } else {
            buffer.append(&x).unwrap();
        }
        len += t;
    }
    assert_eq!(buffer.len(), len);
    let want = quantized_rows(len, d);
    // Quantized for real: off by no more than a step of its group (range / 255), and not exact.
    let exact = to_vec_f32(&rows(0, len, d)).unwrap();
    let off = exact.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(off > 0.0 && off <= 2.0 / 255.0 * 1.01, "quantization error {off}");
    // Ranges inside the history, across history and recent tokens, inside the recent tokens.
    for (start, end) in [(0, 300), (290, len), (len - 4, len), (0, len)] {
        let got = to_vec_f32(&buffer.range(start, end).unwrap()).unwrap();
        assert_eq!(got, tokens(&want, len, d, start, end), "positions {start}..{end}");
    }
    let view = buffer.view().unwrap().unwrap();
    assert_eq!(view.dtype(), mlx_rs::Dtype::Float32);
    assert_eq!(to_vec_f32(&view).unwrap(), want);
}

#[test]
fn a_quantized_buffer_rolls_back_and_drops_tokens_in_lockstep() {
    let d = 64;
    let mut buffer = QuantizedSeqBuffer::new(8, 64);
    buffer.append(&rows(0, 500, d)).unwrap();
    for p in 500..520 {
        buffer.append_recent(&rows(p, 1, d)).unwrap();
    }
    let all = quantized_rows(520, d);
    // Inside the recent tokens, then inside the history.
    buffer.truncate(510);
    assert_eq!(to_vec_f32(&buffer.range(0, 510).unwrap()).unwrap(), tokens(&all, 520, d, 0, 510));
    buffer.truncate(400);
    assert_eq!(buffer.len(), 400);
    // Appending after a rollback overwrites what was dropped.
    buffer.append_recent(&rows(400, 2, d)).unwrap();
    assert_eq!(to_vec_f32(&buffer.range(0, 402).unwrap()).unwrap(), tokens(&all, 520, d, 0, 402));
    // Dropping tokens 10..100 (a sliding window) keeps codes, scales and biases of the rest aligned.
    buffer.remove(10, 100).unwrap();
    let kept: Vec<f32> = (0..2)
        .flat_map(|h| {
            let head = &all[h * 520 * d..(h * 520 + 402) * d];
            head[..10 * d].iter().chain(&head[100 * d..]).copied().collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(buffer.len(), 312);
    assert_eq!(to_vec_f32(&buffer.view().unwrap().unwrap()).unwrap(), kept);
}

#[test]
fn a_quantized_row_takes_136_bytes_of_a_bf16_rows_256() {
    let (d, t) = (128, 1024);
    let x = rows(0, t, d).as_dtype(mlx_rs::Dtype::Bfloat16).unwrap();
    let mut plain = SeqBuffer::default();
    let mut quantized = QuantizedSeqBuffer::new(8, 64);
    plain.reserve(t);
    quantized.reserve(t);
    plain.append(&x).unwrap();
    quantized.append(&x).unwrap();
    // Two heads of 1024 tokens: codes 128 B, two groups' bf16 scale and bias 8 B, a row.
    assert_eq!(plain.nbytes(), 2 * t * 256);
    assert_eq!(quantized.nbytes(), 2 * t * 136);
    assert_eq!(quantized.view().unwrap().unwrap().dtype(), mlx_rs::Dtype::Bfloat16);
}

#[test]
fn a_head_dimension_that_is_not_whole_groups_is_refused_by_name() {
    let mut buffer = QuantizedSeqBuffer::new(8, 64);
    let err = buffer.append(&rows(0, 4, 48)).unwrap_err().to_string();
    assert!(err.contains("head dimension is 48") && err.contains("groups of 64") && err.contains("--kv-bits"), "{err}");
    assert!(buffer.is_empty());
}

#[test]
fn an_8_bit_caches_parts_are_its_codes_in_place_and_read_back_its_rows() {
    let d = 128;
    let mut cache = KvCache::new(KvFormat::quantized(8, d as i32).unwrap(), None);
    // A prefill chunk into the history, then decoded tokens behind the recent tokens.
    cache.append(&rows(0, 300, d), &rows(0, 300, d)).unwrap();
    for p in 300..310 {
        cache.append_recent(&rows(p, 1, d), &rows(p, 1, d)).unwrap();
    }
    let parts = cache.parts().unwrap().expect("not empty");
    // What kernels read: u32 codes, 4 a word, and per 64 values a scale and a bias, in both parts.
    assert_eq!((parts.settled, parts.len), (300, 310));
    assert_eq!((parts.keys.dtype(), parts.keys.shape()[3]), (mlx_rs::Dtype::Uint32, d as i32 / 4));
    let scales = parts.scales.as_ref().expect("quantized");
    assert_eq!((scales.bits, scales.group, scales.history[0].shape()[3]), (8, 64, 2));
    let (recent_keys, recent_scales) = (&parts.recent.as_ref().expect("recent tokens").0, scales.recent.as_ref().expect("their scales"));
    assert_eq!((recent_keys.dtype(), recent_scales[3].shape()[3]), (mlx_rs::Dtype::Uint32, 2));
    // Read back, it is MLX's dequantization of the rows in one piece, as is what plain readers get.
    let want = quantized_rows(310, d);
    let (keys, values) = parts.filled().unwrap();
    assert_eq!((to_vec_f32(&keys).unwrap(), to_vec_f32(&values).unwrap()), (want.clone(), want.clone()));
    let plain = parts.dequantized().unwrap();
    assert!(plain.scales.is_none() && plain.recent.is_none() && plain.settled == 310);
    assert_eq!(to_vec_f32(&plain.filled().unwrap().0).unwrap(), want);
}
