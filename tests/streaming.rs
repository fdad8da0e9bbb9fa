//! StreamingLLM windows: the cache keeps the sink tokens and the most recent ones, positions keep
//! counting, generation runs past the window, and SALA refuses the flags.

mod common;

use mlx_rs::Array;
use sala::engine::cache::{KvCache, Window};
use sala::engine::ops::to_vec_f32;

/// `[1, 1, t, 1]` holding the token positions `from..from+t`, so the survivors can be read back.
fn positions(from: usize, t: usize) -> Array {
    let v: Vec<f32> = (from..from + t).map(|p| p as f32).collect();
    Array::from_slice(&v, &[1, 1, t as i32, 1])
}

#[test]
fn window_keeps_sinks_and_the_most_recent_tokens() {
    let window = Window { capacity: 32, sinks: 4 }.validate().unwrap();
    let mut cache = KvCache::windowed(window);
    let mut seen = 0;
    let mut evictions = 0;
    // A 20-token prefill chunk, then 100 single tokens.
    for t in std::iter::once(20).chain(std::iter::repeat_n(1, 100)) {
        let p = positions(seen, t);
        let (keys, _) = cache.append(&p, &p).unwrap();
        assert_eq!(keys.shape()[2] as usize, cache.len());
        seen += t;
        let before = cache.len();
        cache.evict().unwrap();
        evictions += usize::from(cache.len() < before);
        assert_eq!(cache.position(), seen);
        assert!(cache.len() <= window.capacity, "{} tokens kept", cache.len());
    }
    let (keys, _) = cache.append(&positions(seen, 1), &positions(seen, 1)).unwrap();
    let kept = to_vec_f32(&keys).unwrap();
    assert_eq!(&kept[..4], &[0.0, 1.0, 2.0, 3.0], "sink tokens must survive");
    let recent = &kept[4..];
    let expected: Vec<f32> = (seen + 1 - recent.len()..=seen).map(|p| p as f32).collect();
    assert_eq!(recent, &expected[..], "the rest must be the most recent tokens, in order");
    // Eviction happens in batches ((32 − 4)/8 = 3 tokens), not one token per step.
    assert!(evictions > 0 && evictions <= 100 / 3 + 1, "{evictions} evictions in 100 steps");

    assert!(Window { capacity: 8, sinks: 4 }.validate().is_err());
}

fn sala(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_sala")).args(args).output().unwrap()
}

#[test]
fn dense_model_generates_past_the_window() {
    let gguf = common::smollm2_gguf();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--model", gguf.to_str().unwrap(), "--raw", "Once upon a time", "--temperature", "0", "--ignore-eos", "--json"];
        args.extend_from_slice(extra);
        let out = sala(&args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        json["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect::<Vec<_>>()
    };
    // A window larger than the whole run changes nothing.
    let plain = run(&["--max-tokens", "30"]);
    assert_eq!(run(&["--max-tokens", "30", "--context-size", "64"]), plain);
    // A 40-token window with 4 sinks carries 70 tokens; until the first eviction it agrees.
    let streamed = run(&["--max-tokens", "70", "--context-size", "40", "--num-sink-tokens", "4"]);
    assert_eq!(streamed.len(), 70);
    assert_eq!(streamed[..30], plain[..], "before the window fills the output must not change");
}

#[test]
fn sala_refuses_streaming_flags() {
    let out = sala(&["run", "--model", common::golden("A_dense_f32").to_str().unwrap(), "--input-ids", "1,2", "--context-size", "64"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("sparse layers") && err.contains("whole history"), "{err}");
}
