//! Decode steps encoded on the evaluator thread (engine::encoder) compute what steps evaluated on
//! the calling thread compute — for SALA (lightning states, dense and InfLLM-V2 sparse attention,
//! decoding across `dense_len`) and a dense Llama (SmolLM2) — and a failure there comes back as
//! an error, once, without spoiling the next run. Greedy decoding on the device, which runs two
//! steps ahead through the evaluator, is checked against host greedy decoding, stops included,
//! in tests/speculative.rs.

mod common;

use common::*;
use mlx_rs::{Array, Dtype, Stream};
use sala::engine::encoder::{own_stream, Encoder};
use sala::engine::generate::{decode_pipelined, extend};
use sala::engine::model::{LanguageModel, Logits};
use sala::engine::ops::to_vec_f32;

/// Logits of `token` run on top of `cache` (a clone: the cache is left alone).
fn next_logits(model: &dyn LanguageModel, cache: &sala::engine::cache::ModelCache, token: u32) -> Vec<f32> {
    let mut cache = cache.clone();
    to_vec_f32(&model.forward(&Array::from_slice(&[token as i32], &[1, 1]), &mut cache, Logits::Last, None).unwrap()).unwrap()
}

/// `prompt`, then `steps` decoded by `decode_pipelined` (on the evaluator thread) on one cache and
/// one evaluated forward call per token on another: both caches continue the same way.
fn assert_pipelined_matches(model: &dyn LanguageModel, prompt: &[u32], steps: &[u32], label: &str) {
    assert!(Encoder::for_this_thread().is_threaded(), "on the CPU steps go to the evaluator thread");
    let mut pipelined = model.new_cache();
    extend(model, &mut pipelined, prompt, 512).unwrap();
    let step_rows: Vec<[u32; 1]> = steps.iter().map(|&t| [t]).collect();
    let step_refs: Vec<&[u32]> = step_rows.iter().map(|r| &r[..]).collect();
    decode_pipelined(model, &mut [&mut pipelined], &step_refs).unwrap();

    let mut plain = model.new_cache();
    extend(model, &mut plain, prompt, 512).unwrap();
    for &t in steps {
        extend(model, &mut plain, &[t], 1).unwrap();
    }
    assert_eq!(pipelined.len(), plain.len(), "{label}");
    let (a, b) = (next_logits(model, &pipelined, 7), next_logits(model, &plain, 7));
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
    assert!(diff <= 1e-6, "{label}: the caches differ by {diff} in the next logits");
}

#[test]
fn sala_steps_on_the_evaluator_thread_match_steps_on_this_thread() {
    let case = "C_sparse_prefill";
    let model = sala::models::load(&golden(case), Some(Dtype::Float32)).unwrap();
    let prompt = ids(&tokens(case), "prompt_ids");
    // First, from an empty cache on the model as loading left it: the first step reads weights
    // that are still lazy on this thread's own stream.
    assert_pipelined_matches(model.as_ref(), &[], &prompt[..8], "the model's first step");
    // Dense, crossing dense_len = 256 while decoding, and sparse (1500 tokens in).
    assert_pipelined_matches(model.as_ref(), &prompt[..40], &prompt[40..52], "dense");
    assert_pipelined_matches(model.as_ref(), &prompt[..250], &prompt[250..262], "across dense_len");
    assert_pipelined_matches(model.as_ref(), &prompt[..1490], &prompt[1490..1500], "sparse");
}

#[test]
fn dense_steps_on_the_evaluator_thread_match_steps_on_this_thread() {
    let model = sala::models::load(&smollm2_gguf(), Some(Dtype::Float32)).unwrap();
    let prompt: Vec<u32> = (300..340).collect();
    assert_pipelined_matches(model.as_ref(), &[], &[17, 900, 4, 4], "smollm2, its first step");
    assert_pipelined_matches(model.as_ref(), &prompt, &[17, 900, 4, 4, 31, 2000, 5, 8], "smollm2");
}

#[test]
fn a_build_runs_on_the_shared_stream_and_first_use_evaluations_on_the_threads_own() {
    let encoder = Encoder::for_this_thread();
    assert!(encoder.is_threaded());
    let own = Stream::new();
    encoder.build(|| {
        assert!(Stream::new() != own, "a step is built on the evaluator's shared stream");
        own_stream(|| assert!(Stream::new() == own, "a first-use evaluation runs on the thread's own stream"));
        assert!(Stream::new() != own, "and the build goes on on the shared stream");
        // A constant made on first use inside a build, in a step the evaluator computes.
        let three = sala::engine::ops::scalar(3.0, Dtype::Int32).unwrap();
        let tripled = Array::from_slice(&[1i32, 2, 5], &[3]).multiply(&three).unwrap();
        encoder.queue(vec![tripled.clone()]).unwrap();
        assert_eq!(encoder.read_i32(&tripled).unwrap(), vec![3, 6, 15]);
    });
    assert!(Stream::new() == own, "the thread's own stream is the default again");
}

#[test]
fn a_failed_step_is_reported_once_and_the_next_run_goes_on() {
    let encoder = Encoder::for_this_thread();
    assert!(encoder.is_threaded());
    // Made lazily on this thread's own stream, which the evaluator cannot encode.
    let stray = Array::from_slice(&[1i32, 2], &[2]).multiply(Array::from_int(2)).unwrap();
    encoder.queue(vec![stray]).unwrap();
    // Later in the same run: skipped by the evaluator, or refused here once the failure is known.
    let later = encoder.build(|| Array::from_slice(&[4i32], &[1]).add(Array::from_int(1)).unwrap());
    let mut errors = vec![encoder.read_i32(&later).expect_err("the run failed before this read")];
    errors.extend(encoder.wait().err());
    assert!(errors.iter().any(|e| e.to_string().contains("Stream")), "an error names the stream: {errors:?}");
    assert!(encoder.wait().is_ok(), "a failure is reported once");
    // The next run works.
    let next = encoder.build(|| Array::from_slice(&[4i32, 9], &[2]).add(Array::from_int(1)).unwrap());
    encoder.queue(vec![next.clone()]).unwrap();
    assert_eq!(encoder.read_i32(&next).unwrap(), vec![5, 10]);
    encoder.wait().unwrap();
}

