//! Tokens drawn on the device, as `sala run`, `chat` and `serve` draw them, against the host
//! sampler they replaced: every adjustment (repetition penalty over a window, frequency and
//! presence penalties, logit bias, a grammar's mask) picks the host's token when greedy, over a
//! real model's distributions, while the next steps already run ahead; log-probabilities match the
//! host's; a seeded sampled sequence draws the same tokens alone, run to run, and in a batch
//! beside others; and a sampled generation stopped mid-flight leaves the cache plain decoding
//! leaves.

mod common;

use common::*;
use mlx_rs::{Array, Dtype};
use sala::engine::cache::ModelCache;
use sala::engine::generate::{generate, Decoding, GenerateOptions, Generation, LogprobOptions};
use sala::engine::grammar::{Constraint, Grammar, Reasoning};
use sala::engine::model::{LanguageModel, Logits};
use sala::engine::ops::to_vec_f32;
use sala::engine::sampler::{Sampler, SamplingParams};

fn smollm2() -> (Box<dyn LanguageModel>, Vec<u32>) {
    let model = sala::models::load(&smollm2_gguf(), Some(Dtype::Float32)).unwrap();
    let case = smollm2_expected()["cases"].as_array().unwrap().iter().find(|c| c["mode"] == "raw").unwrap().clone();
    (model, ids(&case, "prompt_ids"))
}

/// `steps` tokens after `prompt`: drawn on the host (every logits row read back, the reference)
/// or on the device; with `logprobs`, each token's with that many alternatives.
fn decode(model: &dyn LanguageModel, prompt: &[u32], sampler: Sampler, steps: usize, on_host: bool, logprobs: Option<usize>) -> (Generation, Vec<sala::engine::logprobs::TokenLogprobs>) {
    let opts = GenerateOptions { max_tokens: steps, ignore_eos: true, prefill_step: 512, keep_logits: on_host, draft: None };
    let mut cache = model.new_cache();
    let mut sampler = sampler;
    let mut decoding = Decoding::start(model, &mut cache, prompt, &opts, |_, _| {}).unwrap().with_logprobs(LogprobOptions { generated: logprobs, prompt: None });
    while decoding.next(model, &mut cache, &mut sampler).unwrap().is_some() {}
    let logprobs = decoding.token_logprobs().to_vec();
    (decoding.finish(), logprobs)
}

fn json_constraint(tokenizer: &sala::engine::tokenizer::TextTokenizer, vocab: usize) -> Constraint {
    let schema = serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}}, "required": ["name", "n"]});
    tokenizer.grammar_compiler(vocab, &[2]).unwrap().compile(&Grammar::JsonSchema(schema), Reasoning::Off).unwrap()
}

fn smollm2_tokenizer(model: &dyn LanguageModel) -> sala::engine::tokenizer::TextTokenizer {
    sala::load::open(&smollm2_gguf()).unwrap().tokenizer(model.info().bos_token_id).unwrap().unwrap()
}

fn settings_window_2() -> SamplingParams {
    SamplingParams { temperature: 0.0, repetition_penalty: 1.5, repetition_window: 2, ..Default::default() }
}

#[test]
fn greedy_device_draws_take_the_host_samplers_token_under_every_adjustment() {
    let (model, prompt) = smollm2();
    let model = model.as_ref();
    let greedy = SamplingParams { temperature: 0.0, ..Default::default() };
    let settings = [
        // A window of 2: the token leaving it is one still in flight when the draw is queued.
        settings_window_2(),
        SamplingParams { repetition_penalty: 1.3, repetition_window: 16, ..greedy.clone() },
        SamplingParams { frequency_penalty: 2.0, presence_penalty: 2.0, ..greedy.clone() },
        SamplingParams { logit_bias: vec![(28, 4.0), (260, -100.0), (30, 2.5)], ..greedy.clone() },
        SamplingParams { repetition_penalty: 1.2, frequency_penalty: 0.4, presence_penalty: -0.3, logit_bias: vec![(28, 3.0)], ..greedy.clone() },
    ];
    let (plain, _) = decode(model, &prompt, Sampler::new(greedy.clone()), 24, false, None);
    let mut outputs = Vec::new();
    for params in settings {
        let (want, _) = decode(model, &prompt, Sampler::new(params.clone()), 24, true, None);
        let (got, _) = decode(model, &prompt, Sampler::new(params.clone()), 24, false, None);
        assert_eq!(got.tokens, want.tokens, "{params:?}");
        outputs.push(got.tokens);
    }
    // Each adjustment mattered (plain greedy goes elsewhere), and so did the window's size: a
    // token leaving the short window is penalised no more.
    for (i, tokens) in outputs.iter().enumerate().skip(1) {
        assert_ne!(tokens, &plain.tokens, "case {i} changed nothing: it tests nothing");
    }
    let (wide, _) = decode(model, &prompt, Sampler::new(SamplingParams { repetition_window: 64, ..settings_window_2() }), 24, false, None);
    assert_ne!(outputs[0], wide.tokens, "the window of 2 let nothing back in");
    // Under a grammar: the mask for each step is worked out on the host and applied on the device.
    let tokenizer = smollm2_tokenizer(model);
    let vocab = model.info().vocab_size;
    let constrained = || Sampler::new(greedy.clone()).constrained(json_constraint(&tokenizer, vocab));
    let (want, _) = decode(model, &prompt, constrained(), 30, true, None);
    let (got, _) = decode(model, &prompt, constrained(), 30, false, None);
    assert_eq!(got.tokens, want.tokens);
    let text = tokenizer.decode(&got.tokens).unwrap();
    assert!(text.starts_with('{') && text.contains("\"name\""), "{text:?}");
}

#[test]
fn logprobs_computed_on_the_device_match_the_host_row() {
    let (model, prompt) = smollm2();
    let model = model.as_ref();
    let params = SamplingParams { temperature: 0.0, repetition_penalty: 1.3, ..Default::default() };
    let (want_gen, want) = decode(model, &prompt, Sampler::new(params.clone()), 12, true, Some(5));
    let (got_gen, got) = decode(model, &prompt, Sampler::new(params), 12, false, Some(5));
    assert_eq!(got_gen.tokens, want_gen.tokens);
    assert_eq!(got.len(), 12);
    // MLX's CPU exp is an approximation: a 49k-token log-sum-exp lands within ~3e-4 of the
    // host's float64 sum.
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.token, w.token, "step {i}");
        assert!((g.logprob - w.logprob).abs() < 1e-3, "step {i}: {g:?} vs {w:?}");
        assert_eq!(g.top.iter().map(|t| t.0).collect::<Vec<_>>(), w.top.iter().map(|t| t.0).collect::<Vec<_>>(), "step {i}");
        for (a, b) in g.top.iter().zip(&w.top) {
            assert!((a.1 - b.1).abs() < 1e-3, "step {i}: {g:?} vs {w:?}");
        }
    }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        top_k: 40,
        min_p: 0.02,
        repetition_penalty: 1.1,
        repetition_window: 4,
        frequency_penalty: 0.2,
        seed: Some(seed),
        ..Default::default()
    }
}

/// Each prompt with its sampler decoded together, the server's way (a prefill chunk a round,
/// then one batched step for those whose prompt is in); the tokens of each.
fn batched(model: &dyn LanguageModel, runs: Vec<(Vec<u32>, Sampler)>, steps: usize) -> Vec<Vec<u32>> {
    let opts = GenerateOptions { max_tokens: steps, ignore_eos: true, prefill_step: 7, keep_logits: false, draft: None };
    let (prompts, mut samplers): (Vec<Vec<u32>>, Vec<Sampler>) = runs.into_iter().unzip();
    let mut caches: Vec<ModelCache> = prompts.iter().map(|_| model.new_cache()).collect();
    let mut decodings: Vec<Decoding> = prompts.iter().zip(&caches).map(|(p, c)| Decoding::begin(model, c, p, &opts).unwrap()).collect();
    while decodings.iter().any(|d| !d.is_done()) {
        server_round(model, &mut decodings, &mut caches, &mut samplers);
    }
    decodings.into_iter().map(|d| d.finish().tokens).collect()
}

#[test]
fn a_seeded_sequence_draws_the_same_tokens_alone_and_in_any_batch() {
    let (model, prompt) = smollm2();
    let model = model.as_ref();
    let alone = decode(model, &prompt, Sampler::new(sampled(5)), 20, false, None).0.tokens;
    assert_eq!(decode(model, &prompt, Sampler::new(sampled(5)), 20, false, None).0.tokens, alone, "run to run");
    assert_ne!(decode(model, &prompt, Sampler::new(sampled(6)), 20, false, None).0.tokens, alone, "another seed draws otherwise");
    // Beside a greedy sequence, a constrained one and another sampled one, joining at other
    // rounds (prompts of other lengths go in a chunk a round).
    let tokenizer = smollm2_tokenizer(model);
    let vocab = model.info().vocab_size;
    let runs = vec![
        (prompt[..3].to_vec(), Sampler::new(SamplingParams { temperature: 0.0, ..Default::default() })),
        (prompt.clone(), Sampler::new(sampled(5))),
        (prompt[1..].to_vec(), Sampler::new(sampled(9)).constrained(json_constraint(&tokenizer, vocab))),
        (vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15], Sampler::new(sampled(3))),
    ];
    let tokens = batched(model, runs, 20);
    assert_eq!(tokens[1], alone, "in a batch of four");
    let text = tokenizer.decode(&tokens[2]).unwrap();
    assert!(text.starts_with('{'), "the constrained row follows its grammar: {text:?}");
}

#[test]
fn a_sampled_generation_stopped_mid_flight_leaves_the_cache_plain_decoding_leaves() {
    // SALA (lightning states, sparse attention past dense_len): cancelled after k tokens with
    // more already run ahead, the cache holds the prompt and the tokens handed out but the last,
    // and carries on as a cache fed exactly those.
    let case = "C_sparse_prefill";
    let model = sala::models::load(&golden(case), Some(Dtype::Float32)).unwrap();
    let model = model.as_ref();
    let prompt = ids(&tokens(case), "prompt_ids")[..250].to_vec();
    for cancel_after in [1, 5, 9] {
        let mut cache = model.new_cache();
        let opts = GenerateOptions { max_tokens: 40, ignore_eos: true, prefill_step: 512, keep_logits: false, draft: None };
        let g = generate(model, &mut cache, &prompt, &mut Sampler::new(sampled(2)), &opts, |_, _| {}, stop_after(cancel_after)).unwrap();
        assert_eq!(g.tokens.len(), cancel_after);
        let fed: Vec<u32> = prompt.iter().chain(&g.tokens[..cancel_after - 1]).copied().collect();
        assert_eq!(cache.len(), fed.len(), "cancel after {cancel_after}");
        let mut fresh = model.new_cache();
        let input = Array::from_slice(&fed.iter().map(|&t| t as i32).collect::<Vec<_>>(), &[1, fed.len() as i32]);
        model.forward(&input, &mut fresh, Logits::Last, None).unwrap();
        let last = Array::from_slice(&[*g.tokens.last().unwrap() as i32], &[1, 1]);
        let a = to_vec_f32(&model.forward(&last, &mut cache, Logits::Last, None).unwrap()).unwrap();
        let b = to_vec_f32(&model.forward(&last, &mut fresh, Logits::Last, None).unwrap()).unwrap();
        let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(diff <= 1e-4, "cancel after {cancel_after}: the caches differ by {diff} in the next logits");
    }
}
