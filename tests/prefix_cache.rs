//! Prompt states reused across requests (`engine::prefix_cache`, issue 29): a prompt started from
//! a kept state gives the reference's logits, as a fresh run does — golden SALA case C with the
//! state ending before, at and after dense_len, a kept prompt that diverges inside a sparse block,
//! and eviction under a tiny budget; then `sala serve` (SmolLM2, real weights) answering a
//! conversation about a document the same with and without it.

mod common;

use common::*;
use mlx_rs::Array;
use sala::engine::cache::ModelCache;
use sala::engine::generate::extend;
use sala::engine::model::{LanguageModel, Logits};
use sala::engine::ops::to_vec_f32;
use sala::engine::prefix_cache::PrefixCache;

/// Golden case C's tolerance for f32 sparse logits (tests/golden.rs).
const TOL: f64 = 1e-3;

fn last_logits(model: &dyn LanguageModel, cache: &mut ModelCache, ids: &[u32]) -> Vec<f64> {
    let input: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
    let out = model.forward(&Array::from_slice(&input, &[1, input.len() as i32]), cache, Logits::Last, None).unwrap();
    to_vec_f32(&out).unwrap().into_iter().map(f64::from).collect()
}

#[test]
fn a_kept_state_continues_exactly_across_dense_len_and_sparse_blocks() {
    sala::engine::device::select(Some(sala::engine::device::DeviceKind::Cpu)).unwrap();
    let case = "C_sparse_prefill";
    let exp = read_safetensors(&golden(case).join("expected.safetensors"));
    let want = &exp["f32.prefill.last_logits"].data;
    let prompt = ids(&tokens(case), "prompt_ids");
    let model = sala::models::load(&golden(case), Some(mlx_rs::Dtype::Float32)).unwrap();
    let model = model.as_ref();
    let fresh = last_logits(model, &mut model.new_cache(), &prompt);
    assert!(max_abs_diff(&fresh, want) <= TOL);

    // dense_len is 256 and blocks are 64 tokens: states ending before, at and after it, and
    // inside a block; and a prompt sharing 900 tokens, then diverging inside block 14 (longer
    // than most start points, never a start for ours).
    let starts = [200, 256, 700, 1499];
    let states: Vec<ModelCache> = starts.iter().map(|&k| cache_of(model, &prompt[..k])).collect();
    let mut other = prompt[..1000].to_vec();
    for t in &mut other[900..] {
        *t = (*t + 1) % 256;
    }
    let other_state = cache_of(model, &other);
    for (i, &k) in starts.iter().enumerate() {
        let mut kept = PrefixCache::new(u64::MAX);
        for (&s, state) in starts.iter().zip(&states).take(i + 1) {
            kept.insert(&prompt[..s], state);
        }
        kept.insert(&other, &other_state);
        let hit = kept.lookup(&prompt).expect("a kept prefix");
        assert_eq!(hit.tokens, k);
        let mut cache = hit.cache;
        let got = last_logits(model, &mut cache, &prompt[k..]);
        let (to_reference, to_fresh) = (max_abs_diff(&got, want), max_abs_diff(&got, &fresh));
        assert!(to_reference <= TOL && to_fresh <= TOL, "from {k}: {to_reference} from the reference, {to_fresh} from a fresh run");
        assert_eq!(argmax(&got), argmax(want));
        // The state handed out was a copy: the kept one still holds exactly its tokens.
        let again = kept.lookup(&prompt).unwrap();
        assert_eq!((again.tokens, again.cache.len()), (k, k));
    }
    // The whole prompt is never a start for itself (one token must run for the next logits).
    let mut alone = PrefixCache::new(u64::MAX);
    alone.insert(&prompt, &cache_of(model, &prompt));
    assert!(alone.lookup(&prompt).is_none());
}

fn cache_of(model: &dyn LanguageModel, ids: &[u32]) -> ModelCache {
    let mut cache = model.new_cache();
    extend(model, &mut cache, ids, 512).unwrap();
    cache
}

#[test]
fn the_least_recently_used_state_goes_first_under_the_budget() {
    sala::engine::device::select(Some(sala::engine::device::DeviceKind::Cpu)).unwrap();
    let case = "C_sparse_prefill";
    let prompt = ids(&tokens(case), "prompt_ids");
    let model = sala::models::load(&golden(case), Some(mlx_rs::Dtype::Float32)).unwrap();
    let model = model.as_ref();
    let (a, b, c) = (cache_of(model, &prompt[..300]), cache_of(model, &prompt[..310]), cache_of(model, &prompt[..320]));
    let one = a.nbytes() as u64;
    assert!(one > 0 && b.nbytes() as u64 >= one);
    // Room for two states of this size.
    let mut kept = PrefixCache::new(2 * c.nbytes() as u64);
    kept.insert(&prompt[..300], &a);
    kept.insert(&prompt[..310], &b);
    // Using the 300-token state makes the 310-token one the least recently used.
    assert_eq!(kept.lookup(&prompt[..305]).unwrap().tokens, 300);
    kept.insert(&prompt[..320], &c);
    assert_eq!(kept.len(), 2);
    assert!(kept.held_bytes() <= 2 * c.nbytes() as u64);
    assert_eq!(kept.lookup(&prompt[..315]).unwrap().tokens, 300, "the 310-token state was dropped");
    assert_eq!(kept.lookup(&prompt).unwrap().tokens, 320);
    // A budget of 0 keeps nothing.
    let mut none = PrefixCache::new(0);
    none.insert(&prompt[..300], &a);
    assert!(none.is_empty() && none.lookup(&prompt).is_none());
}

/// Greedy answers of a server to `questions` about one document, asked in turn, with the
/// `cached_tokens` each answer reports.
fn ask_in_turn(cache_memory: &str, questions: &[&str]) -> Vec<(String, u64)> {
    let server = server::Server::start(&smollm2_gguf(), &["--device", "cpu", "--cache-memory", cache_memory], 200);
    let document = "The quick brown fox jumps over the lazy dog. ".repeat(12);
    let mut messages = vec![serde_json::json!({"role": "system", "content": format!("Answer from this document.\n{document}")})];
    let mut answers = Vec::new();
    for q in questions {
        messages.push(serde_json::json!({"role": "user", "content": q}));
        let body = serde_json::json!({"messages": messages, "max_tokens": 8, "temperature": 0}).to_string();
        let r = server::request(server.port, "POST", "/v1/chat/completions", Some(&body), &[]).unwrap();
        let v = r.json();
        assert_eq!(r.status, 200, "{}", r.body);
        let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        answers.push((text.clone(), v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()));
        messages.push(serde_json::json!({"role": "assistant", "content": text}));
    }
    answers
}

#[test]
fn serve_reuses_a_document_across_requests_and_answers_the_same() {
    let questions = ["Who jumps?", "Over what?", "What colour is the fox?"];
    let fresh = ask_in_turn("0", &questions);
    let reused = ask_in_turn("1GB", &questions);
    println!("without the cache: {fresh:?}\nwith it: {reused:?}");
    assert!(fresh.iter().all(|(text, cached)| *cached == 0 && !text.is_empty()), "{fresh:?}");
    let texts = |a: &[(String, u64)]| a.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>();
    assert_eq!(texts(&reused), texts(&fresh), "answers with the prefix cache differ from fresh ones");
    assert_eq!(reused[0].1, 0);
    // Each later turn starts from the previous turn's prompt at least (the document included).
    assert!(reused[1].1 > 120 && reused[2].1 > reused[1].1, "{reused:?}");
}
