//! The key/value cache's two parts (history + recent tokens, `SeqBuffer`): whatever mix of
//! appends, flushes and rollbacks, every reader sees the positions in order, and the pooled keys
//! are those of a cache filled the plain way.

use mlx_rs::Array;
use sala::engine::cache::{KvCache, SeqBuffer};
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
    let written = append_token_mlx(&row, columns, &[RecentSlot { keys, values, at }]).unwrap();
    let (keys, values) = written.into_iter().next().unwrap();
    cache.commit_recent(keys, values);
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
