//! `sala chat`: the session reuses model state exactly (golden SALA, recurrent + sparse layers),
//! and the REPL works in a pseudo-terminal (tests/pty/drive.py) on SmolLM2 and a golden SALA model:
//! streaming, /retry and follow-ups prefilling only new tokens, multi-line input, /save and
//! /load, Ctrl-C stopping an answer without leaving, Ctrl-D leaving.

mod common;

use sala::engine::generate::{generate, Flow, GenerateOptions};
use sala::engine::sampler::{Sampler, SamplingParams};
use sala::engine::session::ChatSession;
use serde_json::json;
use std::path::PathBuf;
use std::process::Command;

fn greedy() -> Sampler {
    Sampler::new(SamplingParams { temperature: 0.0, ..Default::default() })
}

#[test]
fn session_turns_equal_a_fresh_run_and_reuse_state() {
    let model = sala::models::load(&common::golden("C_sparse_prefill"), None).unwrap();
    let ids: Vec<u32> = (0..900u32).map(|i| (i * 37 + 11) % 256).collect();
    let opts = GenerateOptions { max_tokens: 6, ignore_eos: true, prefill_step: 256, ..Default::default() };
    let mut session = ChatSession::new(model.as_ref());

    // Turn 1, then turn 2 = turn 1 + its answer + more text (crosses the sparse threshold).
    let first = session.turn(model.as_ref(), &ids[..500], &mut greedy(), &opts, |_| Flow::Continue).unwrap();
    assert_eq!(first.prefilled, 500);
    let mut second_prompt = ids[..500].to_vec();
    second_prompt.extend(&first.generation.tokens);
    second_prompt.extend(&ids[500..]);
    let second = session.turn(model.as_ref(), &second_prompt, &mut greedy(), &opts, |_| Flow::Continue).unwrap();
    assert_eq!(second.prefilled, second_prompt.len() - 500 - (first.generation.tokens.len() - 1));

    // The same prompt from scratch gives the same answer.
    let mut cache = model.new_cache();
    let fresh = generate(model.as_ref(), &mut cache, &second_prompt, &mut greedy(), &opts, |_, _| {}, |_| Flow::Continue).unwrap();
    assert_eq!(second.generation.tokens, fresh.tokens);

    // Regenerating restores the state saved before the prompt's last token: one token prefilled.
    let again = session.turn(model.as_ref(), &second_prompt, &mut greedy(), &opts, |_| Flow::Continue).unwrap();
    assert_eq!(again.prefilled, 1);
    assert_eq!(again.generation.tokens, fresh.tokens);

    // Editing the last message falls back to the end of turn 1.
    let mut edited = ids[..500].to_vec();
    edited.extend(&first.generation.tokens);
    edited.extend(&ids[600..700]);
    let edit = session.turn(model.as_ref(), &edited, &mut greedy(), &opts, |_| Flow::Continue).unwrap();
    assert_eq!(edit.prefilled, edited.len() - 500 - (first.generation.tokens.len() - 1));
    let mut cache = model.new_cache();
    let fresh = generate(model.as_ref(), &mut cache, &edited, &mut greedy(), &opts, |_, _| {}, |_| Flow::Continue).unwrap();
    assert_eq!(edit.generation.tokens, fresh.tokens);
}

fn drive(cmd: &[String], steps: serde_json::Value) -> (i32, String) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/pty/drive.py");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(python)
        .arg(script)
        .arg(serde_json::to_string(cmd).unwrap())
        .arg(steps.to_string())
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

fn chat_cmd(model: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let mut cmd = vec![env!("CARGO_BIN_EXE_sala").to_string(), "chat".into(), "--model".into(), model.display().to_string()];
    cmd.extend(extra.iter().map(|s| s.to_string()));
    cmd
}

#[test]
fn smollm2_chat_in_a_terminal() {
    let saved = std::env::temp_dir().join(format!("sala-chat-{}.json", std::process::id()));
    let saved_s = saved.display().to_string();
    let steps = json!([
        {"expect": ">>> ", "timeout": 120},
        {"send": "What is the capital of France?\r"},
        {"expect": "The capital of France is Paris."},
        {"expect": r"prefilled 37 of 37 prompt tokens"},
        {"expect": ">>> "},
        {"send": "/retry\r"},
        {"expect": "The capital of France is Paris."},
        {"expect": r"prefilled 1 of 37 prompt tokens"},
        {"send": "And of Germany?\r"},
        {"expect": "Berlin"},
        {"expect": r"prefilled 15 of 59 prompt tokens"},
        {"send": "/save ".to_string() + &saved_s + "\r"},
        {"expect": "saved 4 messages"},
        {"send": "/clear\r"},
        {"expect": "new conversation"},
        {"send": "/load ".to_string() + &saved_s + "\r"},
        {"expect": "loaded 4 messages"},
        // A multi-line message continues the loaded conversation (its history is re-read once).
        {"send": "\"\"\"Reply with one word.\r"},
        {"expect": r"\.\.\. "},
        {"send": "What is the capital of Italy?\"\"\"\r"},
        {"expect": "Rome"},
        {"expect": r"prefilled \d+ of \d+ prompt tokens"},
        {"send": "/help\r"},
        {"expect": "/retry"},
        {"send": "/quit\r"},
    ]);
    let (code, transcript) = drive(&chat_cmd(&common::smollm2_gguf(), &["--temperature", "0"]), steps);
    assert_eq!(code, 0, "{transcript}");
    let conversation: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    assert_eq!(conversation["messages"][3]["content"], "The capital of Germany is Berlin.");
    std::fs::remove_file(saved).unwrap();
}

#[test]
fn ctrl_c_stops_an_answer_without_leaving() {
    // Golden SALA case A (vocabulary 512) with a byte-level tokenizer that fits in it: random
    // weights ramble until stopped.
    // An end-of-sequence id outside the vocabulary, so the rambling only ends when stopped.
    let dir = common::golden_with_tokenizer("A_dense_f32", "chat", Some(100000));
    let steps = json!([
        {"expect": ">>> ", "timeout": 60},
        {"send": "1 2 3\r"},
        // Wait until the answer is being written, then stop it.
        {"expect": r"(?s)1 2 3\r?\n.{8}"},
        {"send": "\u{3}"},
        {"expect": r"\[prefilled 24 of 24 prompt tokens \| \d+ tokens, [\d.]+ tok/s, stopped\]"},
        {"expect": ">>> "},
        // The next turn reuses the stopped answer's state.
        {"send": "4\r"},
        {"expect": r"(?s)4\r?\n.{8}"},
        {"send": "\u{3}"},
        {"expect": r"\[prefilled \d+ of \d+ prompt tokens \| \d+ tokens, [\d.]+ tok/s, stopped\]"},
        {"send": "\u{4}"},
    ]);
    let (code, transcript) = drive(&chat_cmd(&dir, &["--max-tokens", "100000", "--temperature", "0"]), steps);
    assert_eq!(code, 0, "{transcript}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// Two sequences advanced a token at a time in turn (as the server interleaves requests) give
/// what each gives alone, and a stopped sequence's cache holds every token but the last.
#[test]
fn interleaved_decodings_match_separate_runs() {
    use sala::engine::generate::Decoding;
    let model = sala::models::load(&common::golden("B_chunk_boundary"), None).unwrap();
    let opts = GenerateOptions { max_tokens: 12, ignore_eos: true, ..Default::default() };
    let prompts: [Vec<u32>; 2] = [(1..90).collect(), (5..40).map(|i| i * 3).collect()];
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let mut cache = model.new_cache();
            generate(model.as_ref(), &mut cache, p, &mut greedy(), &opts, |_, _| {}, |_| Flow::Continue).unwrap().tokens
        })
        .collect();
    let mut caches = [model.new_cache(), model.new_cache()];
    let mut samplers = [greedy(), greedy()];
    let mut runs: Vec<Decoding> = Vec::new();
    for (p, c) in prompts.iter().zip(caches.iter_mut()) {
        runs.push(Decoding::start(model.as_ref(), c, p, &opts, |_, _| {}).unwrap());
    }
    while runs.iter().any(|r| !r.is_done()) {
        for (i, run) in runs.iter_mut().enumerate() {
            run.next(model.as_ref(), &mut caches[i], &mut samplers[i]).unwrap();
        }
    }
    for (i, run) in runs.into_iter().enumerate() {
        let tokens = run.finish().tokens;
        assert_eq!(tokens, alone[i], "sequence {i}");
        assert_eq!(caches[i].len(), prompts[i].len() + tokens.len() - 1);
    }
}
