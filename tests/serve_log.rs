//! `sala serve`'s request log: one line per request on stderr, as text or JSON
//! (`--log-format json`), its fields checked against the requests made and their answers
//! (status, model, prompt/cached/generated tokens, time to first token, total time); a stream's
//! line when it ends, a stream whose client left marked cancelled; `--log-level warn` quiet, and
//! `debug` adding a line per scheduler round.

mod common;

use common::server::{request, Server};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

fn post(port: u16, path: &str, body: Value) -> (u16, Value) {
    let r = request(port, "POST", path, Some(&body.to_string()), &[]).unwrap();
    (r.status, r.json())
}

/// The request lines the server has written, as field → value.
fn text_lines(log: &str) -> Vec<HashMap<String, String>> {
    log.lines()
        .filter_map(|l| l.split_once(" request "))
        .map(|(_, fields)| fields.split_whitespace().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect())
        .collect()
}

fn json_lines(log: &str) -> Vec<HashMap<String, String>> {
    log.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<Value>(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .filter(|v| v["message"] == "request")
        .map(|v| v.as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_string))).collect())
        .collect()
}

/// Waits until `lines` of the log hold `n` lines for `path`, and returns those.
fn wait_for(server: &Server, parse: fn(&str) -> Vec<HashMap<String, String>>, path: &str, n: usize) -> Vec<HashMap<String, String>> {
    let start = Instant::now();
    loop {
        let found: Vec<_> = parse(&server.log_so_far()).into_iter().filter(|f| f.get("path").map(String::as_str) == Some(path)).collect();
        if found.len() >= n || start.elapsed() > Duration::from_secs(20) {
            assert_eq!(found.len(), n, "lines for {path}:\n{}", server.log_so_far());
            return found;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A streaming request on its own connection, once its first chunk has come: dropping the socket
/// is the client leaving.
fn stream_started(port: u16, path: &str, request: &Value) -> std::net::TcpStream {
    let mut socket = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let body = request.to_string();
    write!(socket, "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("data: ") {
        let mut buf = [0u8; 512];
        let n = socket.read(&mut buf).unwrap();
        assert!(n > 0, "{path}: closed before the first chunk");
        seen.extend_from_slice(&buf[..n]);
    }
    socket
}

fn number(f: &HashMap<String, String>, key: &str) -> f64 {
    f.get(key).unwrap_or_else(|| panic!("no {key} in {f:?}")).parse().unwrap()
}

/// The line's fields against a completion's `usage`.
fn check_tokens(f: &HashMap<String, String>, usage: &Value) {
    assert_eq!(number(f, "prompt_tokens"), usage["prompt_tokens"].as_f64().unwrap(), "{f:?} {usage}");
    assert_eq!(number(f, "generated_tokens"), usage["completion_tokens"].as_f64().unwrap(), "{f:?} {usage}");
    let cached = usage["prompt_tokens_details"]["cached_tokens"].as_f64().unwrap_or(0.0);
    assert_eq!(number(f, "cached_tokens"), cached, "{f:?} {usage}");
    let (ttft, total) = (number(f, "ttft_ms"), number(f, "total_ms"));
    assert!(ttft > 0.0 && ttft <= total, "{f:?}");
}

#[test]
fn each_request_logs_one_text_line_with_its_status_and_tokens() {
    let server = Server::start(&common::smollm2_gguf(), &["--alias", "smollm2"], 200);
    let port = server.port;
    // A prompt of ids: the tokens it has are known.
    let body = json!({"model": "smollm2", "prompt": [1, 9690, 198, 2683, 359, 253, 5356, 5646], "max_tokens": 4, "temperature": 0, "stop": []});
    let (status, first) = post(port, "/v1/completions", body.clone());
    assert_eq!(status, 200, "{first}");
    // The same prompt again starts from the state the first one left.
    let (_, second) = post(port, "/v1/completions", body);
    assert!(second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0, "{second}");
    let lines = wait_for(&server, text_lines, "/v1/completions", 2);
    for (f, answer) in lines.iter().zip([&first, &second]) {
        assert_eq!((f["method"].as_str(), f["status"].as_str(), f["model"].as_str()), ("POST", "200", "smollm2"), "{f:?}");
        check_tokens(f, &answer["usage"]);
    }
    assert!(!lines[0].contains_key("cancelled"), "{:?}", lines[0]);

    // Streamed: the line comes when the stream ends, with what its usage chunk says.
    let chat = json!({"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 6, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}});
    let r = request(port, "POST", "/v1/chat/completions", Some(&chat.to_string()), &[]).unwrap();
    let usage = r.body.lines().filter_map(|l| l.strip_prefix("data: ")).filter_map(|d| serde_json::from_str::<Value>(d).ok()).find(|v| v["usage"].is_object()).unwrap()["usage"].clone();
    let f = &wait_for(&server, text_lines, "/v1/chat/completions", 1)[0];
    assert_eq!((f["status"].as_str(), f["model"].as_str()), ("200", "smollm2"), "{f:?}");
    check_tokens(f, &usage);

    // Refused: the status and no tokens.
    let (status, _) = post(port, "/v1/completions", json!({"model": "other", "prompt": "x"}));
    assert_eq!(status, 404);
    let (status, _) = post(port, "/v1/messages", json!({"max_tokens": 5}));
    assert_eq!(status, 400);
    let lines = wait_for(&server, text_lines, "/v1/completions", 3);
    assert_eq!(lines[2]["status"], "404");
    assert!(!lines[2].contains_key("prompt_tokens"), "{:?}", lines[2]);
    assert_eq!(wait_for(&server, text_lines, "/v1/messages", 1)[0]["status"], "400");

    // A stream whose client leaves is logged when the server notices, as cancelled.
    let long = json!({"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 2000, "stream": true});
    drop(stream_started(port, "/v1/chat/completions", &long));
    let f = &wait_for(&server, text_lines, "/v1/chat/completions", 2)[1];
    assert_eq!((f["status"].as_str(), f.get("cancelled").map(String::as_str)), ("200", Some("true")), "{f:?}");
    assert!(number(f, "ttft_ms") > 0.0, "{f:?}");
}

#[test]
fn json_lines_parse_and_warn_level_is_quiet() {
    let server = Server::start(&common::smollm2_gguf(), &["--log-format", "json"], 200);
    let (status, answer) = post(server.port, "/v1/completions", json!({"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0}));
    assert_eq!(status, 200);
    let (status, _) = post(server.port, "/tokenize", json!({"prompt": "Hello world"}));
    assert_eq!(status, 200);
    let f = &wait_for(&server, json_lines, "/v1/completions", 1)[0];
    assert_eq!((f["level"].as_str(), f["method"].as_str(), f["status"].as_str()), ("INFO", "POST", "200"), "{f:?}");
    assert_eq!(f["model"], "SmolLM2-135M-Instruct.Q4_1");
    assert!(f["timestamp"].contains('T'), "{f:?}");
    check_tokens(f, &answer["usage"]);
    let t = &wait_for(&server, json_lines, "/tokenize", 1)[0];
    assert_eq!((t["status"].as_str(), number(t, "prompt_tokens")), ("200", 2.0), "{t:?}");
    drop(server);

    let server = Server::start(&common::smollm2_gguf(), &["--log-level", "warn"], 200);
    for _ in 0..2 {
        assert_eq!(post(server.port, "/v1/completions", json!({"prompt": "Hi", "max_tokens": 2})).0, 200);
    }
    assert_eq!(post(server.port, "/v1/completions", json!({"model": "other", "prompt": "Hi"})).0, 404);
    std::thread::sleep(Duration::from_millis(300));
    let log = server.log_so_far();
    assert!(text_lines(&log).is_empty() && log.contains("listening on"), "{log}");
}

/// `--log-level debug` adds a line per scheduler round: the prompt tokens the rounds ran add up to
/// the prompt's (none was cached), and the answer's tokens came from rounds that decoded it (its
/// first token drawn from the prompt's own logits, in the round its last chunk ran); each round's
/// host time is split into its parts.
#[test]
fn debug_level_logs_each_round() {
    let server = Server::start(&common::smollm2_gguf(), &["--log-level", "debug", "--log-format", "json", "--cache-memory", "0"], 200);
    let (status, answer) = post(server.port, "/v1/completions", json!({"prompt": "Once upon a time there was", "max_tokens": 4, "temperature": 0}));
    assert_eq!(status, 200);
    wait_for(&server, json_lines, "/v1/completions", 1);
    let log = server.log_so_far();
    let rounds: Vec<Value> = log.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str::<Value>(l).unwrap()).filter(|v| v["message"] == "round").collect();
    let sum = |key: &str| rounds.iter().map(|r| r[key].as_u64().unwrap_or_else(|| panic!("no {key} in {r}"))).sum::<u64>();
    assert_eq!(sum("prompt_tokens"), answer["usage"]["prompt_tokens"].as_u64().unwrap(), "{log}");
    assert!(sum("decoded") >= answer["usage"]["completion_tokens"].as_u64().unwrap() - 1, "{log}");
    for r in &rounds {
        assert_eq!(r["level"], "DEBUG", "{r}");
        assert!(r["ms"].as_f64().is_some_and(|ms| ms >= 0.0) && r["budget"].as_u64().is_some() && r["waiting"].as_u64().is_some(), "{r}");
        // The round's host time by part: the chunks' share and the builder thread's parts lie
        // within the round (the evaluator's encoding runs beside it).
        let ms = r["ms"].as_f64().unwrap();
        for part in ["chunks_ms", "build_ms", "blocked_ms"] {
            assert!(r[part].as_f64().is_some_and(|p| (0.0..=ms + 0.5).contains(&p)), "{part} in {r}");
        }
        assert!(r["encode_ms"].as_f64().is_some_and(|p| p >= 0.0) && r["read_wait_ms"].as_f64().is_some_and(|p| p >= 0.0), "{r}");
    }
    let chunk_round = rounds.iter().find(|r| r["chunks"].as_u64() > Some(0) && r["going_in"].as_u64() > Some(0)).unwrap_or_else(|| panic!("{log}"));
    // The prompt's forward was built in that round, within its chunks' part.
    let (chunks_ms, build_ms) = (chunk_round["chunks_ms"].as_f64().unwrap(), chunk_round["build_ms"].as_f64().unwrap());
    assert!(build_ms > 0.0 && chunks_ms > 0.0, "{chunk_round}");
}

/// With `SALA_MIXED_ROUNDS=on`, prompts arriving beside a decoding stream ride its steps' forward
/// calls (the round lines count them), and every answer is the one it gets alone.
#[test]
fn prompts_riding_a_streams_steps_answer_as_alone() {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sala"));
    cmd.env("SALA_MIXED_ROUNDS", "on");
    let server = Server::start_with(cmd, &common::smollm2_gguf(), &["--log-level", "debug", "--log-format", "json", "--cache-memory", "0", "--device", "cpu"], 200);
    let port = server.port;
    let ask = move |prompt: String, max_tokens: u64| {
        let (status, answer) = post(port, "/v1/completions", json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true}));
        assert_eq!(status, 200, "{answer}");
        answer["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let prompts: Vec<String> = ["hi there".to_string(), "the cat sat on the mat and then".to_string(), "a b c d e f g ".repeat(60)].to_vec();
    let alone: Vec<String> = prompts.iter().map(|p| ask(p.clone(), 6)).collect();
    // A stream far longer than the others take, whose client leaves once they have answered: the
    // prompts arrive while it decodes however slowly this machine runs (a 400-token stream once
    // ended before them on 2 busy cores).
    let long = json!({"prompt": "tell me a long story", "max_tokens": 8000, "temperature": 0, "ignore_eos": true, "stream": true});
    let socket = stream_started(port, "/v1/completions", &long);
    let started = std::time::Instant::now();
    while !server.log_so_far().lines().any(|l| l.contains("\"message\":\"round\"") && l.contains("\"decoded\":1")) {
        assert!(started.elapsed() < std::time::Duration::from_secs(60), "the stream never decoded");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let together: Vec<_> = prompts.iter().cloned().map(|p| std::thread::spawn(move || ask(p, 6))).collect();
    for (i, (answer, alone)) in together.into_iter().zip(&alone).enumerate() {
        assert_eq!(&answer.join().unwrap(), alone, "prompt {i}");
    }
    // A request's line is written when it ends: the six short ones', not yet the stream's.
    let ended = wait_for(&server, json_lines, "/v1/completions", 6);
    assert!(ended.iter().all(|f| number(f, "generated_tokens") == 6.0), "the stream ended before the prompts beside it answered: {ended:?}");
    drop(socket);
    let rode: u64 = server
        .log_so_far()
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["message"] == "round")
        .map(|r| r["riding"].as_u64().unwrap_or_else(|| panic!("no riding in {r}")))
        .sum();
    assert!(rode >= 1, "no chunk rode a decode step");
}
