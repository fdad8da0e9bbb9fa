//! Prompt states reused across requests (`engine::prefix_cache`, issue 29): a prompt started from
//! a kept state gives the reference's logits, as a fresh run does — golden SALA case C with the
//! state ending before, at and after dense_len, a kept prompt that diverges inside a sparse block,
//! and eviction under a tiny budget; then `sala serve` (SmolLM2, real weights) answering a
//! conversation about a document the same with and without it, and across a restart with its
//! states saved to a folder.

mod common;

use common::*;
use mlx_rs::Array;
use sala::engine::cache::ModelCache;
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

/// A prompt run as the server runs it: started from what `kept` holds, prefilled in chunks of
/// `step` along its trail (which takes points every few thousand tokens, where it leaves a kept
/// sequence and before its last token), then kept. Returns the length it started from and the
/// logits after it.
fn run_prompt(model: &dyn LanguageModel, kept: &mut PrefixCache, prompt: &[u32], step: usize) -> (usize, Vec<f64>) {
    let start = kept.start(prompt, model.new_cache()).unwrap();
    let (mut cache, mut trail) = (start.cache, start.trail);
    assert_eq!(cache.len(), start.tokens);
    let mut logits = Vec::new();
    while cache.len() < prompt.len() {
        let end = trail.chunk_end(cache.len(), step).min(prompt.len());
        let from = cache.len();
        logits = last_logits(model, &mut cache, &prompt[from..end]);
        trail.observe(&cache).unwrap();
    }
    kept.insert(prompt, &cache, &mut trail).unwrap();
    (start.tokens, logits)
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
    let check = |from: usize, got: &[f64]| {
        let (to_reference, to_fresh) = (max_abs_diff(got, want), max_abs_diff(got, &fresh));
        assert!(to_reference <= TOL && to_fresh <= TOL, "from {from}: {to_reference} from the reference, {to_fresh} from a fresh run");
        assert_eq!(argmax(got), argmax(want));
    };

    // dense_len is 256 and blocks are 64 tokens: kept prompts ending before, at and after it,
    // and inside a block. Each is a kept sequence's end; the prompt restarts from the longest.
    let ends = [200, 256, 700, 1499];
    for (i, &k) in ends.iter().enumerate() {
        let mut kept = PrefixCache::new(u64::MAX);
        for &s in ends.iter().take(i + 1) {
            run_prompt(model, &mut kept, &prompt[..s], 512);
        }
        let (from, got) = run_prompt(model, &mut kept, &prompt, 512);
        assert_eq!(from, k);
        check(from, &got);
    }

    // A kept prompt sharing 900 tokens with ours, then diverging inside block 14. Recurrent
    // layers cannot be cut back, so ours restarts from the last point at or before 900 (points
    // are 2048 tokens apart: none here), runs a chunk ending at 900 and keeps a point there.
    let mut other = prompt[..1000].to_vec();
    for t in &mut other[900..] {
        *t = (*t + 1) % 256;
    }
    let mut kept = PrefixCache::new(u64::MAX);
    run_prompt(model, &mut kept, &other, 512);
    let (from, got) = run_prompt(model, &mut kept, &prompt, 512);
    assert_eq!(from, 0, "no point before the divergence yet");
    check(from, &got);
    // The same prompt again restarts before its last token.
    let (from, got) = run_prompt(model, &mut kept, &prompt, 512);
    assert_eq!(from, prompt.len() - 1);
    check(from, &got);
    // A third prompt leaving ours at 900 (as the other did) restarts exactly there, and gives
    // what a fresh run of it gives.
    let mut third = prompt[..1300].to_vec();
    for t in &mut third[900..] {
        *t = (*t + 3) % 256;
    }
    let (from, got) = run_prompt(model, &mut kept, &third, 512);
    assert_eq!(from, 900);
    let third_fresh = last_logits(model, &mut model.new_cache(), &third);
    assert!(max_abs_diff(&got, &third_fresh) <= TOL);
    // The states handed out were copies: the kept ones still restart where they did.
    assert_eq!(run_prompt(model, &mut kept, &prompt, 512).0, prompt.len() - 1);
    // A prompt is never started from its own end (one token must run for the next logits).
    let mut alone = PrefixCache::new(u64::MAX);
    run_prompt(model, &mut alone, &prompt[..300], 512);
    assert_eq!(alone.start(&prompt[..300], model.new_cache()).unwrap().tokens, 299);
}

/// The prefix cache saved to a folder and read back (`serve --prompt-cache-dir`) restarts where
/// it did, from the restart points read back: golden C from before its last token, and a third
/// prompt from the point where another prompt left it inside a sparse block (900), within the
/// golden tolerance of the reference and of fresh runs. Sequences already on disk are not written
/// again; a budget reads back only what fits.
#[test]
fn kept_states_saved_to_a_folder_restart_exactly_after_reading_back() {
    use sala::engine::state_file::{Fingerprint, StateDir};
    sala::engine::device::select(Some(sala::engine::device::DeviceKind::Cpu)).unwrap();
    let case = "C_sparse_prefill";
    let want = read_safetensors(&golden(case).join("expected.safetensors"))["f32.prefill.last_logits"].data.clone();
    let prompt = ids(&tokens(case), "prompt_ids");
    let fingerprint = Fingerprint::of(&sala::models::open(&golden(case)).unwrap(), mlx_rs::Dtype::Float32).unwrap();
    let model = sala::models::load(&golden(case), Some(mlx_rs::Dtype::Float32)).unwrap();
    let model = model.as_ref();
    let leaving_at_900 = |len: usize, shift: u32| -> Vec<u32> {
        let mut p = prompt[..len].to_vec();
        for t in &mut p[900..] {
            *t = (*t + shift) % 256;
        }
        p
    };
    let mut kept = PrefixCache::new(u64::MAX);
    run_prompt(model, &mut kept, &leaving_at_900(1000, 1), 512);
    run_prompt(model, &mut kept, &prompt, 512);

    let dir = std::env::temp_dir().join(format!("sala-kept-states-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let store = StateDir::new(&dir, &fingerprint).unwrap();
    assert_eq!(store.save(kept.kept(), &mut |_, _| {}).unwrap(), 2);
    assert_eq!(store.save(kept.kept(), &mut |_, _| {}).unwrap(), 0, "both are on disk already");
    let (states, skipped) = store.load(model, u64::MAX, &mut |_, _| {}).unwrap();
    assert!(skipped.is_empty() && states.len() == 2);
    let mut back = PrefixCache::new(u64::MAX);
    for mut state in states {
        back.insert(&state.tokens, &state.cache, &mut state.trail).unwrap();
    }
    let (from, got) = run_prompt(model, &mut back, &prompt, 512);
    assert_eq!(from, prompt.len() - 1);
    assert!(max_abs_diff(&got, &want) <= TOL && argmax(&got) == argmax(&want));
    let third = leaving_at_900(1300, 3);
    let (from, got) = run_prompt(model, &mut back, &third, 512);
    assert_eq!(from, 900, "restarts from the branch point read back");
    assert!(max_abs_diff(&got, &last_logits(model, &mut model.new_cache(), &third)) <= TOL);

    // A budget of the largest file reads back one state.
    let largest = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).max().unwrap();
    assert_eq!(store.load(model, largest, &mut |_, _| {}).unwrap().0.len(), 1);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_least_recently_used_state_goes_first_under_the_budget() {
    sala::engine::device::select(Some(sala::engine::device::DeviceKind::Cpu)).unwrap();
    let case = "C_sparse_prefill";
    let prompt = ids(&tokens(case), "prompt_ids");
    let model = sala::models::load(&golden(case), Some(mlx_rs::Dtype::Float32)).unwrap();
    let model = model.as_ref();
    // Three prompts sharing no first token, so no state serves another.
    let (a, b, c) = (&prompt[..300], &prompt[10..310], &prompt[20..320]);
    assert!(a[0] != b[0] && b[0] != c[0] && a[0] != c[0]);
    let mut one = PrefixCache::new(u64::MAX);
    run_prompt(model, &mut one, c, 512);
    let size = one.held_bytes();
    // Attention buffers of 300 tokens and two points (before the last token, at the end).
    assert!(size > 0);
    // Room for two such states.
    let mut kept = PrefixCache::new(2 * size);
    run_prompt(model, &mut kept, a, 512);
    run_prompt(model, &mut kept, b, 512);
    assert!(kept.held_bytes() <= 2 * size && kept.len() == 2);
    // Using the first makes the second the least recently used.
    let longer = |p: &[u32]| [p, &[7, 8]].concat();
    assert_eq!(kept.start(&longer(a), model.new_cache()).unwrap().tokens, 300);
    run_prompt(model, &mut kept, c, 512);
    assert_eq!(kept.len(), 2);
    assert!(kept.held_bytes() <= 2 * size);
    assert_eq!(kept.start(&longer(b), model.new_cache()).unwrap().tokens, 0, "the second was dropped");
    assert_eq!(kept.start(&longer(a), model.new_cache()).unwrap().tokens, 300);
    assert_eq!(kept.start(&longer(c), model.new_cache()).unwrap().tokens, 300);
    // A budget of 0 keeps nothing.
    let mut none = PrefixCache::new(0);
    run_prompt(model, &mut none, a, 512);
    assert!(none.is_empty() && none.start(&longer(a), model.new_cache()).unwrap().tokens == 0);
}

/// A conversation about a document: the system message holding it.
fn document_conversation() -> Vec<serde_json::Value> {
    let document = "The quick brown fox jumps over the lazy dog. ".repeat(12);
    vec![serde_json::json!({"role": "system", "content": format!("Answer from this document.\n{document}")})]
}

/// Asks `question` after `messages` (both kept in `messages`, with the greedy answer); returns
/// the answer and the `cached_tokens` it reports.
fn ask(port: u16, messages: &mut Vec<serde_json::Value>, question: &str) -> (String, u64) {
    messages.push(serde_json::json!({"role": "user", "content": question}));
    let body = serde_json::json!({"messages": messages, "max_tokens": 8, "temperature": 0}).to_string();
    let r = server::request(port, "POST", "/v1/chat/completions", Some(&body), &[]).unwrap();
    let v = r.json();
    assert_eq!(r.status, 200, "{}", r.body);
    let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    messages.push(serde_json::json!({"role": "assistant", "content": text}));
    (text, v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap())
}

/// Greedy answers of a server to `questions` about one document, asked in turn, with the
/// `cached_tokens` each answer reports.
fn ask_in_turn(cache_memory: &str, questions: &[&str]) -> Vec<(String, u64)> {
    let server = server::Server::start(&smollm2_gguf(), &["--device", "cpu", "--cache-memory", cache_memory], 200);
    let mut messages = document_conversation();
    questions.iter().map(|q| ask(server.port, &mut messages, q)).collect()
}

/// `serve --prompt-cache-dir`: the conversation's state, kept when the first server stops, is
/// read back by the next one, whose next turn starts from it and answers as a server without a
/// cache does. A damaged file in the folder is skipped with a warning and moved into `rejected/`
/// (the folder then holds what the cache held).
#[test]
fn serve_keeps_prompt_states_across_restarts() {
    let dir = std::env::temp_dir().join(format!("sala-prompt-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let files = || -> Vec<std::path::PathBuf> {
        let mut f: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect();
        f.sort();
        f
    };
    let args = ["--device", "cpu", "--cache-memory", "1GB", "--prompt-cache-dir", dir.to_str().unwrap()];
    let stop = |mut server: server::Server| -> String {
        server.terminate();
        assert!(server.child.wait().unwrap().success());
        server.stderr()
    };

    let mut messages = document_conversation();
    let first = server::Server::start(&smollm2_gguf(), &args, 200);
    let (_, cached) = ask(first.port, &mut messages, "Who jumps?");
    assert_eq!(cached, 0);
    let log = stop(first);
    assert!(log.contains("prompt cache: 1 kept states in") && log.contains("(1 written)"), "{log}");
    let saved = files();
    assert!(saved.len() == 1 && saved[0].extension().unwrap() == "prompt-cache", "{saved:?}");
    // A damaged copy under a name of this model's files.
    let name = saved[0].file_name().unwrap().to_str().unwrap();
    let damaged = dir.join(format!("{}{}.prompt-cache", &name[..name.len() - 29], "0123456789abcdef"));
    let mut bytes = std::fs::read(&saved[0]).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&damaged, bytes).unwrap();

    let second = server::Server::start(&smollm2_gguf(), &args, 200);
    let (answer, cached) = ask(second.port, &mut messages.clone(), "Over what?");
    let log = stop(second);
    assert!(log.contains("prompt cache: 1 kept states read from") && log.contains(&format!("skipped {}", damaged.display())), "{log}");
    assert!(cached > 120, "the second turn starts from the first one's saved state: {cached} cached");
    let fresh = server::Server::start(&smollm2_gguf(), &["--device", "cpu", "--cache-memory", "0"], 200);
    let (want, none) = ask(fresh.port, &mut messages.clone(), "Over what?");
    assert_eq!((answer, none), (want, 0), "an answer from a state read back differs from a fresh one");
    // The folder holds what the second server kept: the second turn (and the first where the
    // second does not cover it), not the damaged file.
    let now = files();
    assert!(!now.contains(&damaged) && now.iter().any(|f| !saved.contains(f)) && now.len() <= 2, "{now:?}");
    assert!(dir.join("rejected").join(damaged.file_name().unwrap()).is_file());
    std::fs::remove_dir_all(dir).unwrap();
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

/// Golden case D through the prefix cache: the first turn (prompt and five answer tokens) kept
/// as the server keeps an answer, the second turn's 20 tokens run from it in one forward, then
/// five decode steps: the reference's logits throughout.
#[test]
fn a_conversations_second_turn_continues_from_the_first_as_the_reference() {
    sala::engine::device::select(Some(sala::engine::device::DeviceKind::Cpu)).unwrap();
    let case = "D_two_turn";
    let exp = read_safetensors(&golden(case).join("expected.safetensors"));
    let toks = tokens(case);
    let model = sala::models::load(&golden(case), Some(mlx_rs::Dtype::Float32)).unwrap();
    let model = model.as_ref();
    let first: Vec<u32> = [ids(&toks, "prompt_ids"), ids(&toks, "decode_input_ids")].concat();
    let mut kept = PrefixCache::new(u64::MAX);
    run_prompt(model, &mut kept, &first, 512);
    let extension = ids(&toks, "extension_ids");
    let start = kept.start(&[first.clone(), extension.clone()].concat(), model.new_cache()).unwrap();
    assert_eq!(start.tokens, first.len());
    let mut cache = start.cache;
    let input: Vec<i32> = extension.iter().map(|&i| i as i32).collect();
    let out = model.forward(&Array::from_slice(&input, &[1, input.len() as i32]), &mut cache, Logits::All, None).unwrap();
    let rows: Vec<f64> = to_vec_f32(&out).unwrap().into_iter().map(f64::from).collect();
    let want = &exp["f32.extension.logits"];
    assert!(max_abs_diff(&rows, &want.data) <= TOL, "extension logits");
    let want = &exp["f32.decode2.logits"];
    for (i, &t) in ids(&toks, "decode2_input_ids").iter().enumerate() {
        let row = last_logits(model, &mut cache, &[t]);
        assert!(max_abs_diff(&row, want.row(i)) <= TOL, "decode2 step {i}");
    }
}

/// The answers and cached-token counts `tests/reference/openai_prefix.py` gets from a server.
fn openai_prefix_answers(cache_memory: &str) -> Vec<serde_json::Value> {
    let python = venv_python("openai-venv", "SALA_OPENAI_PYTHON", "openai", &["openai==1.109.1"]);
    let server = server::Server::start(&smollm2_gguf(), &["--device", "cpu", "--cache-memory", cache_memory, "--parallel", "2"], 200);
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference/openai_prefix.py");
    let out = std::process::Command::new(python).arg(script).arg(format!("http://127.0.0.1:{}", server.port)).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap().as_array().unwrap().clone()
}

/// Through the official `openai` client: two questions in turn over one system prompt and
/// document, then two sent at once over another; with the cache each later request reports
/// the shared start as cached, and every answer is the one a server without the cache gives.
#[test]
fn openai_client_requests_sharing_a_document_reuse_it_and_answer_the_same() {
    let fresh = openai_prefix_answers("0");
    let reused = openai_prefix_answers("1GB");
    println!("without the cache: {fresh:?}\nwith it: {reused:?}");
    let texts = |a: &[serde_json::Value]| a.iter().map(|r| r["text"].clone()).collect::<Vec<_>>();
    assert_eq!(texts(&reused), texts(&fresh), "answers with the prefix cache differ from fresh ones");
    assert!(fresh.iter().all(|r| r["cached_tokens"] == 0 && r["text"] != ""), "{fresh:?}");
    let cached = |i: usize| reused[i]["cached_tokens"].as_u64().unwrap();
    let prompt = |i: usize| reused[i]["prompt_tokens"].as_u64().unwrap();
    // The first request of each document starts cold only if it shares nothing: the system
    // prompt is shared by all four.
    assert_eq!(cached(0), 0);
    // The second question shares everything up to "Question: ".
    assert!(cached(1) > 100 && cached(1) < prompt(1), "{reused:?}");
    // Of the two sent together, one is prefilled first and the other starts from it.
    assert!(cached(2).min(cached(3)) > 0 && cached(2).max(cached(3)) > 100, "{reused:?}");
}
