//! Decoding that runs ahead of the caller gives exactly what plain decoding gives: the same greedy
//! tokens, the same seeded samples, the same distributions (within float tolerance), and a cache
//! that holds the same tokens when generation stops (end of sequence, max tokens, the caller
//! cancelling). Self-speculative decoding — for SALA (lightning states rolled back inside a verified
//! chunk, dense and InfLLM-V2 sparse attention, a chunk crossing `dense_len`) and for a dense Llama
//! (SmolLM2) — and plain greedy decoding pipelined on the device.

mod common;

use common::*;
use mlx_rs::{Array, Dtype};
use sala::engine::cache::{LayerCache, ModelCache};
use sala::engine::generate::{generate, Draft, GenerateOptions, Generation};
use sala::engine::model::{LanguageModel, Logits};
use sala::engine::ops::to_vec_f32;
use sala::engine::sampler::{Sampler, SamplingParams};

fn sampler(temperature: f32) -> Sampler {
    Sampler::new(SamplingParams { temperature, seed: Some(11), ..Default::default() })
}

/// Generates `steps` tokens after `prompt` (prefilled in 512-token chunks); returns the generation
/// and the cache it left.
fn decode(model: &dyn LanguageModel, prompt: &[u32], steps: usize, draft: Option<Draft>, temperature: f32) -> (Generation, ModelCache) {
    let opts = GenerateOptions { max_tokens: steps, ignore_eos: true, prefill_step: 512, keep_logits: true, draft };
    decode_with(model, prompt, &opts, temperature, usize::MAX)
}

/// [`decode`] with any options, the caller cancelling after `cancel_after` tokens.
fn decode_with(model: &dyn LanguageModel, prompt: &[u32], opts: &GenerateOptions, temperature: f32, cancel_after: usize) -> (Generation, ModelCache) {
    let mut cache = model.new_cache();
    let g = generate(model, &mut cache, prompt, &mut sampler(temperature), opts, |_, _| {}, stop_after(cancel_after)).unwrap();
    (g, cache)
}

/// Two generations handed out the same tokens and left caches of the same length that carry on
/// the same way.
fn assert_same_outcome(model: &dyn LanguageModel, label: &str, want: (&Generation, &ModelCache), got: (&Generation, &ModelCache)) {
    assert_eq!(got.0.tokens, want.0.tokens, "{label}");
    assert_eq!(got.0.stop, want.0.stop, "{label}");
    assert_eq!(got.1.len(), want.1.len(), "{label}: cache lengths");
    let last = *got.0.tokens.last().unwrap();
    let diff = max_diff(&next_logits(model, want.1, last), &next_logits(model, got.1, last));
    assert!(diff <= 1e-4, "{label}: the caches differ by {diff} in the next logits");
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Logits of `token` run on top of `cache` (a clone: the caller's cache is left alone).
fn next_logits(model: &dyn LanguageModel, cache: &ModelCache, token: u32) -> Vec<f32> {
    let mut cache = cache.clone();
    to_vec_f32(&model.forward(&Array::from_slice(&[token as i32], &[1, 1]), &mut cache, Logits::Last, None).unwrap()).unwrap()
}

/// Speculative decoding with `draft` matches plain decoding: tokens, every distribution, the
/// cache length and what the cache computes next. Returns the acceptance rate.
fn assert_matches_plain(model: &dyn LanguageModel, prompt: &[u32], steps: usize, draft: Draft, temperature: f32, tolerance: f32) -> f64 {
    let (want, want_cache) = decode(model, prompt, steps, None, temperature);
    let (got, got_cache) = decode(model, prompt, steps, Some(draft), temperature);
    let label = format!("{draft:?}, prompt of {} tokens, temperature {temperature}", prompt.len());
    assert_eq!(got.tokens, want.tokens, "{label}");
    assert_eq!(got.logits.len(), steps, "{label}");
    for (i, (a, b)) in want.logits.iter().zip(&got.logits).enumerate() {
        let diff = max_diff(a, b);
        assert!(diff <= tolerance, "{label}: step {i}: logits differ by {diff}");
    }
    // The cache holds the prompt and every token but the last, as after plain decoding, and
    // carries on the same way.
    assert_eq!(got_cache.len(), prompt.len() + steps - 1, "{label}");
    let last = *got.tokens.last().unwrap();
    let diff = max_diff(&next_logits(model, &want_cache, last), &next_logits(model, &got_cache, last));
    assert!(diff <= tolerance, "{label}: after generation, the caches differ by {diff} in the next logits");
    let s = &got.stats;
    assert!(s.draft_tokens > 0 && s.accepted_tokens <= s.draft_tokens, "{label}: {} of {} accepted", s.accepted_tokens, s.draft_tokens);
    s.acceptance().unwrap()
}

fn sala_case() -> (Box<dyn LanguageModel>, Vec<u32>) {
    let case = "C_sparse_prefill";
    let model = sala::models::load(&golden(case), Some(Dtype::Float32)).unwrap();
    (model, ids(&tokens(case), "prompt_ids"))
}

#[test]
fn sala_speculative_matches_plain_decoding() {
    let (model, prompt) = sala_case();
    let model = model.as_ref();
    // Dense (40 tokens), crossing dense_len = 256 while generating (250), sparse (1500).
    for prompt in [&prompt[700..740], &prompt[..250], &prompt[..]] {
        for draft in [Draft { layers: 1, tokens: 3 }, Draft { layers: 3, tokens: 5 }] {
            assert_matches_plain(model, prompt, 13, draft, 0.0, 1e-4);
        }
    }
    // Seeded sampling draws one sample per token handed out, in the same order: same tokens.
    assert_matches_plain(model, &prompt[..250], 13, Draft { layers: 2, tokens: 4 }, 0.9, 1e-4);
}

#[test]
fn full_depth_draft_accepts_its_guesses() {
    // A "draft" of all four layers guesses what the model then computes, so (almost) every guess
    // stands: rounds end on accepted tokens, generation stops inside a round (13 is not a
    // multiple of 4 + 1) and the accepted tail is rolled back.
    let (model, prompt) = sala_case();
    let rate = assert_matches_plain(model.as_ref(), &prompt[..250], 13, Draft { layers: 4, tokens: 4 }, 0.0, 1e-4);
    assert!(rate >= 0.9, "acceptance {rate}");
}

#[test]
fn rollback_inside_a_chunk_equals_the_shorter_chunk() {
    // 250 tokens in, then 10 more in one call (crossing dense_len = 256) recorded for rollback,
    // rolled back to 3 of them: the same state as running only those 3.
    let (model, prompt) = sala_case();
    let model = model.as_ref();
    let input = |ids: &[u32]| Array::from_slice(&ids.iter().map(|&t| t as i32).collect::<Vec<_>>(), &[1, ids.len() as i32]);
    let mut cache = model.new_cache();
    model.forward(&input(&prompt[..250]), &mut cache, Logits::Last, None).unwrap();
    let mut short = cache.clone();
    model.forward(&input(&prompt[250..253]), &mut short, Logits::Last, None).unwrap();

    cache.record_replay(true);
    model.forward(&input(&prompt[250..260]), &mut cache, Logits::Last, None).unwrap();
    cache.record_replay(false);
    model.truncate_cache(&mut cache, 253).unwrap();
    assert_eq!(cache.len(), 253);
    for (i, (a, b)) in cache.layers.iter().zip(&short.layers).enumerate() {
        if let (LayerCache::Recurrent(a), LayerCache::Recurrent(b)) = (a, b) {
            assert_eq!(a.len, b.len, "layer {i}");
            let (a, b) = (to_vec_f32(&a.state().unwrap().unwrap()).unwrap(), to_vec_f32(&b.state().unwrap().unwrap()).unwrap());
            assert!(max_diff(&a, &b) <= 1e-4, "layer {i}: states differ by {}", max_diff(&a, &b));
        }
    }
    let diff = max_diff(&next_logits(model, &cache, prompt[253]), &next_logits(model, &short, prompt[253]));
    assert!(diff <= 1e-4, "next logits differ by {diff}");

    // Outside the recorded call the state cannot be recomputed: a clear error, not a wrong state.
    let err = model.truncate_cache(&mut cache, 249).unwrap_err().to_string();
    assert!(err.contains("cannot roll back"), "{err}");
}

#[test]
fn smollm2_speculative_matches_plain_decoding() {
    let model = sala::models::load(&smollm2_gguf(), Some(Dtype::Float32)).unwrap();
    let model = model.as_ref();
    // A raw-text case of the reference.
    let expected = smollm2_expected();
    let cases: Vec<&serde_json::Value> = expected["cases"].as_array().unwrap().iter().filter(|c| c["mode"] == "raw").collect();
    for case in cases.iter().filter(|c| c["prompt"] == "The quick brown fox") {
        let prompt = ids(case, "prompt_ids");
        for draft in [Draft { layers: 10, tokens: 3 }, Draft { layers: 24, tokens: 4 }] {
            let rate = assert_matches_plain(model, &prompt, 24, draft, 0.0, 1e-3);
            eprintln!("SmolLM2 {:?} {draft:?}: {:.0}% of drafted tokens accepted", case["prompt"], rate * 100.0);
        }
    }
}

/// With an 8-bit KV cache (`--kv-bits 8`) too: rows are quantized as they are appended, so a
/// rolled-back draft leaves the same codes as plain decoding (within 1e-3: a chunk's keys come
/// from a many-row product, whose last float bit may round a value onto the next code).
#[test]
fn speculative_decoding_with_an_8_bit_cache_matches_plain_decoding() {
    let mut model = sala::models::load(&golden("A_dense_f32"), Some(Dtype::Float32)).unwrap();
    model.set_kv_bits(8).unwrap();
    let prompt = ids(&tokens("A_dense_f32"), "prompt_ids");
    for draft in [Draft { layers: 1, tokens: 3 }, Draft { layers: 3, tokens: 5 }] {
        assert_matches_plain(model.as_ref(), &prompt, 13, draft, 0.0, 1e-3);
    }
}

#[test]
fn draft_settings_are_checked() {
    let (model, _) = sala_case();
    let cache = model.new_cache();
    for (draft, want) in [
        (Draft { layers: 0, tokens: 4 }, "--draft-layers 0"),
        (Draft { layers: 4, tokens: 4 }, "between 1 and 3 of the model's 4 layers"),
        (Draft { layers: 2, tokens: 0 }, "--num-draft 0"),
    ] {
        let err = draft.validate(model.as_ref(), &cache).unwrap_err().to_string();
        assert!(err.contains(want), "{draft:?}: {err}");
    }
    assert!(Draft { layers: 3, tokens: 1 }.validate(model.as_ref(), &cache).is_ok());
}

#[test]
fn stops_leave_the_cache_as_plain_decoding_does() {
    // End of sequence (the golden model's EOS comes early after these prompts), max tokens and the
    // caller cancelling mid-round: greedy on the device and speculative decoding hand out the same
    // tokens as host-side greedy decoding and leave the same cache.
    let (model, prompt) = sala_case();
    let model = model.as_ref();
    let host = GenerateOptions { max_tokens: 40, prefill_step: 512, keep_logits: true, ..Default::default() };
    let on_device = GenerateOptions { keep_logits: false, ..host.clone() };
    let speculative = GenerateOptions { draft: Some(Draft { layers: 4, tokens: 4 }), ..host.clone() };
    let mut ends = Vec::new();
    for (prompt, cancel_after) in [(&[1u32, 2, 3][..], usize::MAX), (&prompt[..250], usize::MAX), (&prompt[..250], 6), (&prompt[..40], 3)] {
        let want = decode_with(model, prompt, &host, 0.0, cancel_after);
        ends.push(want.0.stop);
        for (name, opts) in [("on device", &on_device), ("speculative", &speculative)] {
            let got = decode_with(model, prompt, opts, 0.0, cancel_after);
            let label = format!("{name}, prompt of {} tokens, cancel after {cancel_after}", prompt.len());
            assert_same_outcome(model, &label, (&want.0, &want.1), (&got.0, &got.1));
        }
    }
    use sala::engine::generate::StopReason::*;
    for reason in [EndOfSequence, Cancelled] {
        assert!(ends.contains(&reason), "no case ended with {reason:?}: {ends:?}");
    }
    // Greedy on the device for many steps (ignore_eos, max tokens): same tokens as on the host.
    let long = GenerateOptions { ignore_eos: true, max_tokens: 30, ..host.clone() };
    let want = decode_with(model, &prompt[..250], &long, 0.0, usize::MAX);
    let got = decode_with(model, &prompt[..250], &GenerateOptions { keep_logits: false, ..long }, 0.0, usize::MAX);
    assert_same_outcome(model, "on device, 30 tokens", (&want.0, &want.1), (&got.0, &got.1));
}
