//! `sala chat`: the session reuses model state exactly (golden SALA, recurrent + sparse layers),
//! and the REPL works in a pseudo-terminal (tests/pty/drive.py) on SmolLM2 and a golden SALA model:
//! streaming, /retry and follow-ups prefilling only new tokens, multi-line input, /save and
//! /load, Ctrl-C stopping an answer without leaving, Ctrl-D leaving. In a terminal set up as a
//! user's (rexpect, TERM=xterm, so the line editor runs in raw mode): Ctrl-C and kill -INT stop an
//! answer within a second, the partial answer is kept and the next turn sees it, type-ahead becomes
//! the next message, Ctrl-C at the prompt says how to leave.

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
    // Float32 and a prompt without repeats: repeated blocks have equal keys, whose selection scores
    // tie, and last-bit rounding (resumed vs chunked, one BLAS kernel vs another) then picks between
    // them; bfloat16 scores, rounded as the reference rounds them, tie as often.
    let model = sala::models::load(&common::golden("C_sparse_prefill"), Some(mlx_rs::Dtype::Float32)).unwrap();
    let mut rng = common::Lcg(12345);
    let ids: Vec<u32> = (0..900).map(|_| rng.below(256) as u32).collect();
    let opts = GenerateOptions { max_tokens: 6, ignore_eos: true, prefill_step: 256, keep_logits: true, ..Default::default() };
    let same = |got: &sala::engine::generate::Generation, want: &sala::engine::generate::Generation| {
        assert_eq!(got.tokens, want.tokens);
        assert!(got.logits.len() == got.tokens.len() && want.logits.len() == want.tokens.len(), "a row of logits per token");
        for (g, w) in got.logits.iter().zip(&want.logits) {
            let diff = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(diff < 1e-4, "a session's logits differ from a fresh run's by {diff}");
        }
    };
    let mut session = ChatSession::new(model.as_ref());

    // Turn 1, then turn 2 = turn 1 + its answer + more text (crosses the sparse threshold).
    let first = session.turn(model.as_ref(), &ids[..500], &mut greedy(), &opts, |_, _| Flow::Continue, |_| Flow::Continue).unwrap();
    assert_eq!(first.prefilled, 500);
    let mut second_prompt = ids[..500].to_vec();
    second_prompt.extend(&first.generation.tokens);
    second_prompt.extend(&ids[500..]);
    let second = session.turn(model.as_ref(), &second_prompt, &mut greedy(), &opts, |_, _| Flow::Continue, |_| Flow::Continue).unwrap();
    assert_eq!(second.prefilled, second_prompt.len() - 500 - (first.generation.tokens.len() - 1));

    // The same prompt from scratch gives the same answer.
    let mut cache = model.new_cache();
    let fresh = generate(model.as_ref(), &mut cache, &second_prompt, &mut greedy(), &opts, |_, _| {}, |_| Flow::Continue).unwrap();
    same(&second.generation, &fresh);

    // Regenerating restores the state saved before the prompt's last token: one token prefilled.
    let again = session.turn(model.as_ref(), &second_prompt, &mut greedy(), &opts, |_, _| Flow::Continue, |_| Flow::Continue).unwrap();
    assert_eq!(again.prefilled, 1);
    same(&again.generation, &fresh);

    // Editing the last message falls back to the end of turn 1.
    let mut edited = ids[..500].to_vec();
    edited.extend(&first.generation.tokens);
    edited.extend(&ids[600..700]);
    let edit = session.turn(model.as_ref(), &edited, &mut greedy(), &opts, |_, _| Flow::Continue, |_| Flow::Continue).unwrap();
    assert_eq!(edit.prefilled, edited.len() - 500 - (first.generation.tokens.len() - 1));
    let mut cache = model.new_cache();
    let fresh = generate(model.as_ref(), &mut cache, &edited, &mut greedy(), &opts, |_, _| {}, |_| Flow::Continue).unwrap();
    same(&edit.generation, &fresh);
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

/// `sala chat` in a pseudo-terminal set up as a user's (TERM=xterm, echo on), so the line editor
/// runs in raw mode and Ctrl-C (byte 3) becomes SIGINT through the terminal driver while an answer
/// is written. (The TERM=dumb runs above never leave cooked mode.)
struct Terminal {
    session: rexpect::session::PtySession,
    /// Everything read so far, escape codes stripped.
    seen: String,
}

impl Terminal {
    fn chat(model: &std::path::Path, extra: &[&str]) -> Self {
        // rexpect turns echo off in the child; `stty echo` gives the program a terminal as one opens.
        let mut command = Command::new("sh");
        command.args(["-c", "stty echo && exec \"$0\" \"$@\"", env!("CARGO_BIN_EXE_sala"), "chat", "--model"]);
        command.arg(model).args(extra).env("TERM", "xterm");
        let options = rexpect::reader::Options::new().timeout_ms(Some(60_000)).strip_ansi_escape_codes(true);
        Self { session: rexpect::session::spawn_with_options(command, options).unwrap(), seen: String::new() }
    }

    /// Waits for `regex`; returns the text before it and the match.
    fn expect(&mut self, regex: &str) -> (String, String) {
        match self.session.exp_regex(regex) {
            Ok((before, found)) => {
                self.seen += &before;
                self.seen += &found;
                (before, found)
            }
            Err(e) => panic!("expected /{regex}/: {e}\n--- transcript:\n{}", self.seen),
        }
    }

    fn send(&mut self, text: &str) {
        self.session.send(text).unwrap();
        self.session.flush().unwrap();
    }
}

/// The stats line of a stopped answer: (prefilled, prompt tokens, generated tokens).
const STOPPED: &str = r"\[prefilled (\d+) of (\d+) prompt tokens \| (\d+) tokens, [\d.]+ tok/s, stopped\]";

fn numbers(stats: &str) -> Vec<usize> {
    regex::Regex::new(STOPPED).unwrap().captures(stats).unwrap().iter().skip(1).map(|c| c.unwrap().as_str().parse().unwrap()).collect()
}

#[test]
fn ctrl_c_in_a_real_terminal_stops_the_answer_and_keeps_it() {
    let model = common::smollm2_gguf();
    let saved = std::env::temp_dir().join(format!("sala-chat-pty-{}.json", std::process::id()));
    let mut t = Terminal::chat(&model, &["--temperature", "0", "--max-tokens", "100000"]);
    t.expect(">>> ");
    t.send("Write a very long story about a dragon who loves books.\r");
    t.expect(r"books\.\r?\n");
    let start = t.seen.len();
    // Type-ahead while the answer is written: not echoed into the answer, not lost.
    t.expect(r"(?s).{40}");
    t.send("What was the dragon called");
    t.expect(r"(?s).{40}");
    let sent = std::time::Instant::now();
    t.send("\u{3}");
    let (_, stats) = t.expect(STOPPED);
    // rexpect hands each byte over as a char: put the UTF-8 back together.
    let answer = String::from_utf8(t.seen[start..t.seen.len() - stats.len()].chars().map(|c| c as u8).collect()).unwrap();
    let waited = sent.elapsed();
    assert!(waited < std::time::Duration::from_secs(1), "the answer went on for {waited:?} after Ctrl-C");
    let first = numbers(&stats);
    // The prompt comes back with the type-ahead already on its line.
    t.expect(r">>> \r?What was the dragon called");
    t.send("?\r");
    t.expect(r"\?\r?\n(?s).{20}");
    t.send("\u{3}");
    let (_, stats) = t.expect(STOPPED);
    let second = numbers(&stats);
    t.send(&format!("/save {}\r", saved.display()));
    t.expect("saved 4 messages");
    t.send("/help\r");
    // Each key below waits for the prompt: the line editor turns the terminal raw before it
    // prints one, and a Ctrl-C or Ctrl-D sent earlier is taken by the cooked terminal instead.
    t.expect(r"/bye, /quit +leave(?s).*>>> ");
    // Ctrl-C at the prompt does not leave; a second one in a row says more.
    t.send("\u{3}");
    t.expect(r"\(Ctrl-D or /bye leaves\)(?s).*>>> ");
    t.send("\u{3}");
    t.expect(r"Ctrl-C does not leave the chat.*press Ctrl-D on an empty line or type /bye\)(?s).*>>> ");
    t.send("\u{4}");
    t.session.exp_eof().unwrap();
    assert!(matches!(t.session.process().wait().unwrap(), rexpect::process::WaitStatus::Exited(_, 0)));

    let conversation: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    std::fs::remove_file(&saved).unwrap();
    let messages = conversation["messages"].as_array().unwrap();
    let content = |i: usize| messages[i]["content"].as_str().unwrap().to_string();
    assert_eq!(messages.iter().map(|m| m["role"].as_str().unwrap()).collect::<Vec<_>>(), ["user", "assistant", "user", "assistant"]);
    assert_eq!(content(2), "What was the dragon called?");
    // The stopped answer is kept as it was printed, and the typed text never showed inside it.
    let printed = answer.replace("\r\n", "\n");
    assert_eq!(printed.trim_end_matches('\n'), content(1), "printed answer vs the saved one");
    assert!(content(1).split_whitespace().count() >= 8, "{}", content(1));
    assert!(!printed.contains("dragon called"), "type-ahead echoed into the answer: {printed}");

    // The second turn's prompt is the conversation with the stopped answer in it, and the model
    // state the first turn left (its prompt and every answer token but the last) was reused.
    let source = sala::models::gguf::import(&model).unwrap();
    let bos = source.config().unwrap().opt("bos_token_id").and_then(|v| v.as_u64()).map(|b| b as u32);
    let tokenizer = source.tokenizer(bos).unwrap().unwrap();
    let history: Vec<sala::engine::tokenizer::Message> = serde_json::from_value(json!(messages[..3])).unwrap();
    let prompt = tokenizer.encode(&tokenizer.apply_chat_template(&history, true).unwrap()).unwrap();
    assert_eq!(second[1], prompt.len());
    assert_eq!(second[0], second[1] - (first[1] + first[2] - 1), "first turn {first:?}, second {second:?}");
}

#[test]
fn kill_int_stops_an_answer() {
    let mut t = Terminal::chat(&common::smollm2_gguf(), &["--temperature", "0", "--max-tokens", "100000"]);
    t.expect(">>> ");
    t.send("Write a very long story about a dragon who loves books.\r");
    t.expect(r"books\.\r?\n(?s).{40}");
    t.session.process_mut().signal(nix::sys::signal::Signal::SIGINT).unwrap();
    t.expect(STOPPED);
    t.expect(">>> ");
    t.send("/bye\r");
    t.session.exp_eof().unwrap();
}

/// A long message shows its prefill on the terminal, and Ctrl-C there stops it between chunks:
/// the message is taken back, and the next one reuses the chunks already read and answers as a
/// chat that was never stopped does.
#[test]
fn ctrl_c_while_reading_a_long_message_takes_it_back() {
    // Golden SALA case A with a byte-level tokenizer (a token a byte): quick to read, and the
    // answers of random weights run to --max-tokens.
    let model = common::golden_with_tokenizer("A_dense_f32", "prefill", Some(100000));
    let system = "The quick brown fox jumps over the lazy dog near the river bank. ".repeat(72);
    let args = ["--temperature", "0", "--max-tokens", "8", "--prefill-step", "64", "--system", system.as_str()];
    let saved = |name: &str| std::env::temp_dir().join(format!("sala-chat-prefill-{name}-{}.json", std::process::id()));
    let answer_of = |file: &PathBuf| -> String {
        let conversation: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        std::fs::remove_file(file).unwrap();
        let messages = conversation["messages"].as_array().unwrap().clone();
        assert_eq!(messages.len(), 2, "{messages:?}");
        messages[1]["content"].as_str().unwrap().to_string()
    };

    let mut t = Terminal::chat(&model, &args);
    t.expect(">>> ");
    t.send("Summarise.\r");
    // The prefill bar (the prompt is over 4096 tokens), then Ctrl-C in the middle of it.
    t.expect(r"prefill .*\d+/\d+ tokens");
    let sent = std::time::Instant::now();
    t.send("\u{3}");
    t.expect(r"\(stopped while reading the message; it was not kept\)");
    let waited = sent.elapsed();
    assert!(waited < std::time::Duration::from_secs(1), "the prefill went on for {waited:?} after Ctrl-C");
    t.expect(">>> ");
    t.send("Summarise.\r");
    let (_, stats) = t.expect(r"\[prefilled (\d+) of (\d+) prompt tokens");
    let counts: Vec<usize> = regex::Regex::new(r"(\d+) of (\d+)").unwrap().captures(&stats).unwrap().iter().skip(1).map(|c| c.unwrap().as_str().parse().unwrap()).collect();
    assert!(counts[0] < counts[1] && counts[1] > 4096, "the second try reads only what the stopped one had not: {counts:?}");
    let stopped_first = saved("stopped");
    t.send(&format!("/save {}\r", stopped_first.display()));
    t.expect("saved 2 messages");
    t.send("/bye\r");
    t.session.exp_eof().unwrap();

    let mut fresh = Terminal::chat(&model, &args);
    fresh.expect(">>> ");
    fresh.send("Summarise.\r");
    fresh.expect(r"\[prefilled \d+ of \d+ prompt tokens");
    let unstopped = saved("fresh");
    fresh.send(&format!("/save {}\r", unstopped.display()));
    fresh.expect("saved 2 messages");
    fresh.send("/bye\r");
    fresh.session.exp_eof().unwrap();
    assert_eq!(answer_of(&stopped_first), answer_of(&unstopped));
    std::fs::remove_dir_all(model).unwrap();
}
