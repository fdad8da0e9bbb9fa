//! `sala serve` at its edges (issue 28): sizes from requests in checked arithmetic, every error
//! as OpenAI-schema JSON whichever layer makes it, a failed load said as such, a public bind
//! without a key, clients that stall, SIGTERM mid-stream; then a soak of bad requests among good
//! ones under concurrency that ends with SIGTERM. Model: golden case A (random weights) with a
//! byte tokenizer, on the CPU.

mod common;

use common::server::{raw, raw_in_pieces, request, Server};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn model() -> PathBuf {
    common::golden_with_tokenizer("A_dense_f32", "serve-edges", Some(100000))
}

fn chat(messages: &str, extra: &str) -> String {
    format!("{{\"messages\": {messages}{extra}}}")
}

const HI: &str = r#"[{"role": "user", "content": "hi"}]"#;

fn post(port: u16, body: &str) -> common::server::Response {
    request(port, "POST", "/v1/chat/completions", Some(body), &[]).expect("an answer")
}

#[test]
fn request_sizes_are_checked_arithmetic() {
    let server = Server::start(&model(), &["--device", "cpu"], 200);
    // prompt + 2^64 - 1 wrapped to a small number in release builds, and ran past the context.
    for max in [u64::MAX.to_string(), (u64::MAX - 3).to_string(), (1u64 << 63).to_string(), "524288".into()] {
        let r = post(server.port, &chat(HI, &format!(", \"max_tokens\": {max}")));
        assert!(r.status == 400 && r.is_api_error() && r.json()["error"]["code"] == "context_length_exceeded", "{max}: {} {}", r.status, r.body);
    }
    let r = post(server.port, &chat(HI, ", \"max_tokens\": 3, \"temperature\": 0"));
    assert!(r.status == 200 && r.json()["usage"]["completion_tokens"].as_u64() <= Some(3), "{}", r.body);
}

#[test]
fn every_error_is_openai_json_and_names_the_field() {
    let server = Server::start(&model(), &["--device", "cpu"], 200);
    let port = server.port;
    // Made by the HTTP layers, not the handlers: were text/plain.
    let big = format!("{{\"model\": \"{}\"}}", "x".repeat(3 << 20));
    let r = request(port, "POST", "/v1/models/download", Some(&big), &[]).unwrap();
    assert!(r.status == 413 && r.is_api_error(), "{} {:?} {}", r.status, r.header("content-type"), r.body);
    let r = request(port, "DELETE", "/v1/models/%FF%FE/x", None, &[]).unwrap();
    assert!(r.status == 400 && r.is_api_error(), "{} {}", r.status, r.body);
    let r = request(port, "PUT", "/v1/chat/completions", Some("{}"), &[]).unwrap();
    assert!(r.status == 405 && r.is_api_error(), "{} {}", r.status, r.body);
    let r = raw(port, b"GET /%zz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    assert!(r.status >= 400 && r.is_api_error(), "{} {}", r.status, r.body);
    // Answered by hyper itself, with empty bodies: a URI over 64 KiB, headers over its buffer or
    // over 100 of them, a request line or length that is not HTTP.
    let long_uri = [b"GET /".as_slice(), &[b'a'; 70_000], b" HTTP/1.1\r\nHost: x\r\n\r\n"].concat();
    let big_header = [b"GET /health HTTP/1.1\r\nHost: x\r\nX: ".as_slice(), &[b'a'; 500_000], b"\r\n\r\n"].concat();
    let many_headers = format!("GET /health HTTP/1.1\r\nHost: x\r\n{}\r\n", (0..200).map(|i| format!("X{i}: a\r\n")).collect::<String>());
    for (bytes, status) in [
        (long_uri, 414),
        (big_header, 431),
        (many_headers.into_bytes(), 431),
        (b"GARBAGE\r\n\r\n".to_vec(), 400),
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n".to_vec(), 400),
    ] {
        let r = raw_in_pieces(port, &bytes, 16 << 10).unwrap();
        let head = String::from_utf8_lossy(&bytes[..bytes.len().min(40)]).to_string();
        assert!(r.status == status && r.is_api_error(), "{head:?} ({} bytes): {} {:?} {}", bytes.len(), r.status, r.header("content-type"), r.body);
    }
    // Sampling errors name the request field (were `--top-p` and param "sampling").
    for (extra, field) in [(", \"top_p\": -0.5", "top_p"), (", \"temperature\": 9", "temperature"), (", \"min_p\": 2", "min_p")] {
        let r = post(port, &chat(HI, extra));
        let e = &r.json()["error"];
        assert!(r.status == 400 && e["param"] == field && !e["message"].as_str().unwrap().contains("--"), "{extra}: {}", r.body);
    }
    // top_p 0 is OpenAI's "only the most likely token", not an error.
    let r = post(port, &chat(HI, ", \"top_p\": 0, \"max_tokens\": 2"));
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn a_failed_load_is_reported_without_paths() {
    let dir = std::env::temp_dir().join(format!("sala-serve-broken-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), "{\"model_type\": \"llama\"}").unwrap();
    std::fs::write(dir.join("model.safetensors"), [0u8; 8]).unwrap();
    let server = Server::start(&dir, &["--api-key", "k"], 500);
    let dir_text = dir.display().to_string();
    let health = request(server.port, "GET", "/health", None, &[]).unwrap();
    assert!(health.json()["status"] == "error" && !health.body.contains(&dir_text), "{}", health.body);
    let detailed = request(server.port, "GET", "/health", None, &["Authorization: Bearer k"]).unwrap();
    assert!(detailed.body.contains(&dir_text), "the key holder sees why: {}", detailed.body);
    // Chat said "still loading; retry shortly" forever.
    let r = request(server.port, "POST", "/v1/chat/completions", Some(&chat(HI, "")), &["Authorization: Bearer k"]).unwrap();
    assert!(r.status == 500 && r.is_api_error() && r.json()["error"]["code"] == "model_load_failed", "{} {}", r.status, r.body);
    drop(server);
    // A public server without a key showed the path in the chat 500 and the model list.
    let server = Server::start(&dir, &["--host", "0.0.0.0"], 500);
    let r = request(server.port, "POST", "/v1/chat/completions", Some(&chat(HI, "")), &[]).unwrap();
    assert!(r.status == 500 && r.json()["error"]["code"] == "model_load_failed" && !r.body.contains(&dir_text), "{} {}", r.status, r.body);
    let list = request(server.port, "GET", "/v1/models", None, &[]).unwrap();
    assert!(list.status == 200 && !list.body.contains(&dir_text) && list.json()["data"][0]["error"].is_string(), "{}", list.body);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_public_server_without_a_key_warns_and_refuses_management() {
    let model = model();
    let mut server = Server::start(&model, &["--device", "cpu", "--host", "0.0.0.0"], 200);
    let port = server.port;
    let path = model.display().to_string();
    let r = request(port, "POST", "/v1/models/download", Some("{\"model\": \"a/b\"}"), &[]).unwrap();
    assert!(r.status == 403 && r.is_api_error() && r.body.contains("--api-key"), "{} {}", r.status, r.body);
    let r = request(port, "DELETE", "/v1/models/a/b", None, &[]).unwrap();
    assert!(r.status == 403 && r.is_api_error(), "{} {}", r.status, r.body);
    let list = request(port, "GET", "/v1/models", None, &[]).unwrap();
    assert!(list.status == 200 && !list.body.contains(&path) && list.json()["data"][0]["path"].is_null(), "{}", list.body);
    let health = request(port, "GET", "/health", None, &[]).unwrap();
    assert!(health.status == 200 && !health.body.contains(&path), "{}", health.body);
    server.terminate();
    assert!(server.child.wait().unwrap().success());
    assert!(server.stderr().contains("WARNING: listening on 0.0.0.0"), "no warning");
    // With a key, the wrong key is refused and the right one accepted.
    let server = Server::start(&model, &["--device", "cpu", "--host", "0.0.0.0", "--api-key", "secret"], 200);
    let r = request(server.port, "GET", "/v1/models", None, &["Authorization: Bearer secreT"]).unwrap();
    assert!(r.status == 401 && r.is_api_error());
    let r = request(server.port, "GET", "/v1/models", None, &["Authorization: Bearer secret"]).unwrap();
    assert!(r.status == 200 && r.json()["data"][0]["path"].is_string(), "{}", r.body);
}

#[test]
fn clients_that_stall_are_dropped() {
    let server = Server::start(&model(), &["--device", "cpu", "--timeout", "1"], 200);
    let port = server.port;
    let started = Instant::now();
    // Headers never finished: the connection is closed (it was held forever).
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le").unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(started.elapsed() < Duration::from_secs(10), "a stalled header was held {:?}", started.elapsed());
    // A body that stops halfway: 408 as JSON.
    let started = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 100\r\n\r\n{\"messages\"").unwrap();
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let r = common::server::parse(&answer).expect("an answer");
    assert!(r.status == 408 && r.is_api_error(), "{} {}", r.status, r.body);
    assert!(started.elapsed() < Duration::from_secs(10));
    // The server is still there.
    assert_eq!(post(port, &chat(HI, ", \"max_tokens\": 1")).status, 200);
}

#[test]
fn large_prompts_do_not_stall_other_requests() {
    let server = Server::start(&model(), &["--device", "cpu"], 200);
    let port = server.port;
    // Four ~7 MB prompts tokenize at once (they then exceed the context: 400). They ran on the
    // async threads, and /health waited behind them for seconds.
    let words = "lorem ipsum dolor sit amet ".repeat(7 << 20 >> 5);
    let body = chat(&json!([{"role": "user", "content": words}]).to_string(), "");
    let (busy, slowest) = (std::sync::atomic::AtomicBool::new(true), std::sync::Mutex::new(Duration::ZERO));
    std::thread::scope(|scope| {
        let senders: Vec<_> = (0..4).map(|_| scope.spawn(|| post(port, &body))).collect();
        scope.spawn(|| {
            while busy.load(Ordering::SeqCst) {
                let asked = Instant::now();
                assert_eq!(common::server::get_status(port, "/health"), Some(200));
                let took = asked.elapsed();
                let mut slowest = slowest.lock().unwrap();
                *slowest = (*slowest).max(took);
                drop(slowest);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        for sender in senders {
            let r = sender.join().unwrap();
            assert!(r.status == 400 && r.json()["error"]["code"] == "context_length_exceeded", "{}", &r.body[..r.body.len().min(300)]);
        }
        busy.store(false, Ordering::SeqCst);
    });
    let slowest = *slowest.lock().unwrap();
    assert!(slowest < Duration::from_millis(1000), "/health took {slowest:?} while prompts tokenized");
}

#[test]
fn a_download_that_hangs_can_be_cancelled_by_deleting_it() {
    // A hub that accepts and never answers: the download stayed `downloading` forever and
    // DELETE answered 409.
    let silent = common::hub::start_silent_endpoint();
    let cache = common::hub::temp_cache("serve-cancel");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sala"));
    cmd.env("HF_HUB_CACHE", &cache).env("HF_ENDPOINT", format!("http://127.0.0.1:{silent}")).env("HF_HUB_DOWNLOAD_TIMEOUT", "3");
    let server = Server::start_with(cmd, &model(), &["--device", "cpu"], 200);
    let port = server.port;
    let r = request(port, "POST", "/v1/models/download", Some("{\"model\": \"test-org/hangs\"}"), &[]).unwrap();
    assert!(r.status == 202 && r.json()["status"] == "downloading", "{} {}", r.status, r.body);
    std::thread::sleep(Duration::from_millis(500));
    // Cancelled within one read timeout, long before its retries would have run out (~26 s).
    let asked = Instant::now();
    let r = request(port, "DELETE", "/v1/models/test-org/hangs", None, &[]).unwrap();
    assert!(r.status == 200 && r.json()["cancelled_download"] == true, "{} {}", r.status, r.body);
    assert!(asked.elapsed() < Duration::from_secs(12), "cancelling took {:?}", asked.elapsed());
    let list = request(port, "GET", "/v1/models/download", None, &[]).unwrap();
    assert_eq!(list.json()["data"][0]["status"], "cancelled", "{}", list.body);
    assert!(!cache.join("models--test-org--hangs").exists());
    let _ = std::fs::remove_dir_all(cache);
}

/// An object schema of `n` string properties (all required, or all optional), as
/// `response_format` sends it.
fn wide_response_format(n: usize, required: bool) -> String {
    let properties: serde_json::Map<String, Value> = (0..n).map(|i| (format!("field_{i}"), json!({"type": "string"}))).collect();
    let mut schema = json!({"type": "object", "properties": properties, "additionalProperties": false});
    if required {
        schema["required"] = (0..n).map(|i| json!(format!("field_{i}"))).collect();
    }
    format!(", \"max_tokens\": 14, \"response_format\": {}", json!({"type": "json_schema", "json_schema": {"name": "wide", "schema": schema}}))
}

#[test]
fn a_schema_too_large_to_enforce_is_a_400_and_the_server_stays_up() {
    // The config's own end token: constrained decoding needs one within the vocabulary.
    let mut server = Server::start(&common::golden_with_tokenizer("A_dense_f32", "serve-schema", None), &["--device", "cpu"], 200);
    let port = server.port;
    // 10,000 properties (292 KiB) overflowed the stack of the thread compiling it: SIGABRT.
    for required in [false, true] {
        let r = post(port, &chat(HI, &wide_response_format(10_000, required)));
        assert!(r.status == 400 && r.is_api_error() && r.json()["error"]["param"] == "response_format", "{} {}", r.status, &r.body[..r.body.len().min(300)]);
        assert!(r.body.contains("10000 object properties") && r.body.contains("5000"), "{}", r.body);
    }
    // Spread over tools, they count together.
    let tool = |i: usize| {
        let properties: serde_json::Map<String, Value> = (0..2000).map(|j| (format!("a{j}"), json!({"type": "integer"}))).collect();
        json!({"type": "function", "function": {"name": format!("f{i}"), "parameters": {"type": "object", "properties": properties}}})
    };
    let tools = format!(", \"tool_choice\": \"required\", \"tools\": {}", json!([tool(0), tool(1), tool(2)]));
    let r = post(port, &chat(HI, &tools));
    assert!(r.status == 400 && r.json()["error"]["param"] == "tools" && r.body.contains("6000 object properties"), "{} {}", r.status, &r.body[..r.body.len().min(300)]);
    // The widest allowed compiles and is enforced; as many optional properties compile too, but
    // offer more choices at a step than llguidance weighs (2000 items): a 400 when generating.
    let r = post(port, &chat(HI, &wide_response_format(5000, true)));
    assert!(r.status == 200 && r.json()["choices"][0]["message"]["content"].as_str().is_some_and(|c| c.starts_with("{\"field_0\": ")), "{}", &r.body[..r.body.len().min(300)]);
    let r = post(port, &chat(HI, &wide_response_format(5000, false)));
    assert!(r.status == 400 && r.is_api_error(), "{} {}", r.status, &r.body[..r.body.len().min(300)]);
    let r = post(port, &chat(HI, ", \"max_tokens\": 2"));
    assert!(r.status == 200 && r.json()["choices"][0]["message"]["role"] == "assistant", "{} {}", r.status, r.body);
    assert!(server.child.try_wait().unwrap().is_none(), "the server exited");
}

#[test]
fn an_empty_api_key_is_refused_at_start() {
    // `--api-key "$KEY"` with KEY unset served everyone, downloads and deletions included.
    for key in ["", "   ", " padded", "line\nbreak"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sala"))
            .args(["serve", "--device", "cpu", "--port", "0", "--host", "0.0.0.0", "--api-key", key, "--model"])
            .arg(model())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains("--api-key"), "{key:?}: {:?} {stderr}", out.status);
        assert!(!stderr.contains("listening on"), "{key:?}: {stderr}");
    }
}

#[test]
fn prompts_far_past_the_context_are_refused_before_tokenizing() {
    // Six 7.8 MB bodies of distinct words at once took +3.5 GB and seconds of CPU to tokenize
    // before their 400 (one alone +2.0 GB). The byte-level vocabulary here has 1-byte tokens, so
    // 7.8 MB of text is at least ~2M tokens, far past the context.
    let server = Server::start(&model(), &["--device", "cpu"], 200);
    let port = server.port;
    assert_eq!(post(port, &chat(HI, ", \"max_tokens\": 2")).status, 200);
    let before = server.peak_rss();
    let words: String = (0..780_000u32).map(|i| format!("word{i:05x} ")).collect();
    let body = chat(&json!([{"role": "user", "content": words}]).to_string(), "");
    assert!(body.len() > 7_000_000);
    let completion = json!({"prompt": words, "max_tokens": 2}).to_string();
    std::thread::scope(|scope| {
        let chats: Vec<_> = (0..5).map(|_| scope.spawn(|| post(port, &body))).collect();
        let text = scope.spawn(|| request(port, "POST", "/v1/completions", Some(&completion), &[]).unwrap());
        for r in chats.into_iter().map(|c| c.join().unwrap()).chain([text.join().unwrap()]) {
            let e = &r.json()["error"];
            assert!(r.status == 400 && e["code"] == "context_length_exceeded" && e["message"].as_str().unwrap_or("").contains("at least"), "{} {}", r.status, &r.body[..r.body.len().min(300)]);
        }
    });
    let grew = server.peak_rss().saturating_sub(before);
    assert!(grew < 400 << 20, "the server's peak memory grew by {} MB", grew >> 20);
    assert_eq!(post(port, &chat(HI, ", \"max_tokens\": 2")).status, 200);
}

/// Sends `body` to `path` without reading the answer, waits `wait`, then hangs up.
fn abandon(port: u16, path: &str, body: &str, wait: Duration) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let head = format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len());
    s.write_all((head + body).as_bytes()).unwrap();
    std::thread::sleep(wait);
    drop(s);
}

#[test]
fn an_abandoned_non_streamed_request_frees_its_slot() {
    // One slot: while a request holds it, the next waits. A client that hung up on a 1,500-token
    // answer kept it busy to the end (the next tiny request waited 91.6 s).
    let server = Server::start(&model(), &["--device", "cpu", "--parallel", "1"], 200);
    let port = server.port;
    let long = |extra: &str| format!("\"max_tokens\": 50000, \"temperature\": 0{extra}");
    let chat_body = format!("{{\"messages\": {HI}, {}}}", long(""));
    let messages_body = format!("{{\"model\": \"m\", \"messages\": {HI}, {}}}", long(""));
    let completion_body = format!("{{\"prompt\": \"Once upon\", {}}}", long(""));
    for (path, body) in [("/v1/chat/completions", chat_body), ("/v1/messages", messages_body), ("/v1/completions", completion_body)] {
        abandon(port, path, &body, Duration::from_millis(1500));
        let asked = Instant::now();
        let r = post(port, &chat(HI, ", \"max_tokens\": 2"));
        let took = asked.elapsed();
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert!(took < Duration::from_secs(3), "{path}: the next request waited {took:?} behind an abandoned one");
    }
}

/// A streamed answer: the `data:` payloads, in order.
fn stream_events(s: &mut TcpStream) -> Vec<String> {
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
}

fn start_stream(port: u16, max_tokens: u64) -> TcpStream {
    let body = chat(HI, &format!(", \"stream\": true, \"max_tokens\": {max_tokens}, \"temperature\": 0"));
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n", body.len());
    s.write_all((head + &body).as_bytes()).unwrap();
    // Wait for the first chunk, so the request is running when the signal comes.
    let mut first = [0u8; 1];
    s.read_exact(&mut first).unwrap();
    s
}

#[test]
fn sigterm_drains_streams_and_exits_cleanly() {
    // Within the deadline: the stream finishes normally.
    let mut server = Server::start(&model(), &["--device", "cpu"], 200);
    let mut s = start_stream(server.port, 40);
    server.terminate();
    let events = stream_events(&mut s);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    let finish = events.iter().filter_map(|e| serde_json::from_str::<Value>(e).ok()).find_map(|v| v["choices"][0]["finish_reason"].as_str().map(str::to_string));
    assert_eq!(finish.as_deref(), Some("length"), "{events:?}");
    assert_eq!(server.child.wait().unwrap().code(), Some(0), "exit 0 after draining (was 143)");
    // Past the deadline: the stream is ended with an error event and [DONE], and the server exits.
    let mut server = Server::start(&model(), &["--device", "cpu", "--shutdown-timeout", "1"], 200);
    let mut s = start_stream(server.port, 400_000);
    server.terminate();
    let events = stream_events(&mut s);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    assert!(events.iter().any(|e| e.contains("server_shutting_down")), "{events:?}");
    assert_eq!(server.child.wait().unwrap().code(), Some(0));
}

/// What the soak's clients send, good and bad (coprime to the step of 7 between a client's
/// requests, so each client goes through every kind).
const KINDS: usize = 15;

#[test]
fn soak_bad_requests_among_good_ones_then_sigterm() {
    let seconds: u64 = std::env::var("SALA_SOAK_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    let mut server = Server::start(&model(), &["--device", "cpu", "--timeout", "2", "--parallel", "4"], 200);
    let port = server.port;
    let (requests, good, failures) = (AtomicU64::new(0), AtomicU64::new(0), std::sync::Mutex::new(Vec::<String>::new()));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    std::thread::scope(|scope| {
        for client in 0..8usize {
            let (requests, good, failures) = (&requests, &good, &failures);
            scope.spawn(move || {
                let mut n = client;
                while Instant::now() < deadline {
                    n += 7;
                    let kind = n % KINDS;
                    if let Err(problem) = soak_request(port, kind) {
                        failures.lock().unwrap().push(format!("kind {kind}: {problem}"));
                    } else if kind < 2 {
                        good.fetch_add(1, Ordering::Relaxed);
                    }
                    requests.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    let peak = server.peak_rss();
    // SIGTERM mid-stream at the end.
    let mut s = start_stream(port, 40);
    server.terminate();
    let events = stream_events(&mut s);
    let exit = server.child.wait().unwrap();
    let failures = failures.into_inner().unwrap();
    println!(
        "soak: {} requests in {seconds} s ({} good answered), {} failures, server peak RSS {:.1} MB, exit {:?}",
        requests.load(Ordering::Relaxed),
        good.load(Ordering::Relaxed),
        failures.len(),
        peak as f64 / 1e6,
        exit.code()
    );
    assert!(failures.is_empty(), "{:#?}", &failures[..failures.len().min(20)]);
    assert!(good.load(Ordering::Relaxed) > 0);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(exit.code(), Some(0));
}

/// One soak request of `kind`; `Err` says what was wrong with the answer.
fn soak_request(port: u16, kind: usize) -> Result<(), String> {
    let expect_error = |r: Option<common::server::Response>, status: u16| -> Result<(), String> {
        let r = r.ok_or("no answer")?;
        if r.status == status && r.is_api_error() {
            Ok(())
        } else {
            Err(format!("expected a {status} JSON error, got {} {}", r.status, &r.body[..r.body.len().min(200)]))
        }
    };
    match kind {
        0 => {
            let r = request(port, "POST", "/v1/chat/completions", Some(&chat(HI, ", \"max_tokens\": 4")), &[]).ok_or("no answer")?;
            let v = r.json();
            if r.status == 200 && v["choices"][0]["message"]["role"] == "assistant" { Ok(()) } else { Err(format!("{} {}", r.status, r.body)) }
        }
        1 => {
            let r = request(port, "POST", "/v1/chat/completions", Some(&chat(HI, ", \"max_tokens\": 4, \"stream\": true")), &[]).ok_or("no answer")?;
            if r.status == 200 && r.body.trim_end().ends_with("data: [DONE]") { Ok(()) } else { Err(format!("{} {}", r.status, r.body)) }
        }
        2 => expect_error(request(port, "POST", "/v1/chat/completions", Some("{\"messages\": [{\"role\": "), &[]), 400),
        3 => expect_error(request(port, "POST", "/v1/chat/completions", Some(&chat("\"hi\"", "")), &[]), 400),
        4 => expect_error(request(port, "POST", "/v1/chat/completions", Some(&chat(HI, &format!(", \"max_tokens\": {}", u64::MAX))), &[]), 400),
        5 => {
            // Over the 8 MB limit: a 413 JSON error, unless the server answered and closed while
            // the client was still writing (the client then sees its write fail: also a refusal).
            let body = "x".repeat(9 << 20);
            let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
            let head = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n", body.len());
            if s.write_all(head.as_bytes()).and_then(|_| s.write_all(body.as_bytes())).is_err() {
                return Ok(());
            }
            let mut answer = Vec::new();
            let _ = s.read_to_end(&mut answer);
            expect_error(common::server::parse(&answer), 413)
        }
        6 => expect_error(request(port, "DELETE", "/v1/models/%FF%FE/x", None, &[]), 400),
        7 => expect_error(request(port, "GET", "/v1/nothing", None, &[]), 404),
        8 => expect_error(request(port, "POST", "/v1/chat/completions", Some(&chat(HI, ", \"n\": 3, \"logit_bias\": {\"x\": 1}")), &[]), 400),
        9 => {
            // A client that hangs mid-body: 408 after the server's timeout.
            let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
            s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 50\r\n\r\n{\"mess").map_err(|e| e.to_string())?;
            let mut answer = Vec::new();
            let _ = s.read_to_end(&mut answer);
            expect_error(common::server::parse(&answer), 408)
        }
        10 => {
            // Not HTTP at all: any answer must be a 4xx; a closed connection is fine too.
            match raw(port, b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03garbage\r\n\r\n") {
                Some(r) if r.status < 400 || r.status >= 500 => Err(format!("{} {}", r.status, r.body)),
                _ => Ok(()),
            }
        }
        12 => expect_error(request(port, "POST", "/v1/chat/completions", Some(&chat(HI, &wide_response_format(10_000, false))), &[]), 400),
        13 | 14 => {
            // A long non-streamed answer abandoned: cancelled when the client hangs up, so it
            // cannot hold a slot the good requests wait for.
            let (path, body) = match kind {
                13 => ("/v1/chat/completions", chat(HI, ", \"max_tokens\": 20000")),
                _ => ("/v1/messages", format!("{{\"model\": \"m\", \"max_tokens\": 20000, \"messages\": {HI}}}")),
            };
            abandon(port, path, &body, Duration::from_millis(300));
            Ok(())
        }
        _ => {
            let r = request(port, "GET", "/health", None, &[]).ok_or("no answer")?;
            if r.status == 200 && r.json()["status"] == "ok" { Ok(()) } else { Err(format!("{} {}", r.status, r.body)) }
        }
    }
}

#[test]
fn json_helpers_see_what_they_should() {
    // The soak's checks must be able to fail: a text/plain error is not an API error.
    let r = common::server::parse(b"HTTP/1.1 413 Payload Too Large\r\ncontent-type: text/plain\r\n\r\nlength limit exceeded").unwrap();
    assert!(!r.is_api_error());
    let body = json!({"error": {"message": "m", "type": "t", "param": null, "code": "c"}}).to_string();
    let r = common::server::parse(format!("HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\r\n{body}").as_bytes()).unwrap();
    assert!(r.is_api_error());
}

#[test]
fn a_cache_size_that_is_not_a_size_is_refused() {
    for value in ["lots", "-1GB", "8 parsecs"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sala")).args(["serve", "--model", "x", &format!("--cache-memory={value}")]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.code() == Some(2) && stderr.contains("--cache-memory") && stderr.contains("give a size such as 8GB"), "{value}: {stderr}");
    }
}

#[test]
fn a_prompt_cache_dir_that_cannot_be_written_is_refused_before_loading() {
    let file = std::env::temp_dir().join(format!("sala-not-a-folder-{}", std::process::id()));
    std::fs::write(&file, b"a file").unwrap();
    for dir in [file.clone(), file.join("below")] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sala"))
            .args(["serve", "--device", "cpu", "--port", "0", "--model"])
            .arg(model())
            .arg("--prompt-cache-dir")
            .arg(&dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains("--prompt-cache-dir") && stderr.contains("pass a folder this user can write"), "{}: {stderr}", dir.display());
        assert!(!stderr.contains("listening on"), "{stderr}");
    }
    let _ = std::fs::remove_file(file);
}

/// A MiniCPM-SALA model (random weights) calls in its own syntax when it must: under the
/// minicpm4_xml grammar every answer is a `<function>` call the parser reads back, arguments typed
/// by the schema, whole or streamed.
#[test]
fn sala_required_calls_come_back_from_its_xml_syntax() {
    // The config's own end token (the shared fixture's lies past the vocabulary: it never ends).
    let sala = common::golden_with_tokenizer("A_dense_f32", "serve-xml", None);
    let mut server = Server::start(&sala, &["--device", "cpu"], 200);
    let tools = json!([{"type": "function", "function": {"name": "forecast", "parameters": {"type": "object",
        "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["unit", "days"]}}}]);
    let valid = |call: &Value| {
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap_or("")).unwrap_or(Value::Null);
        call["function"]["name"] == "forecast"
            && ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap_or(""))
            && args["days"].as_u64().is_some_and(|d| (1..=7).contains(&d))
    };
    for seed in 0..3 {
        let body = json!({"messages": [{"role": "user", "content": "weather?"}], "tools": tools, "tool_choice": "required",
                          "parallel_tool_calls": false, "temperature": 1.0, "seed": seed, "max_tokens": 300});
        let r = post(server.port, &body.to_string());
        let v = r.json();
        assert!(r.status == 200 && v["choices"][0]["finish_reason"] == "tool_calls" && valid(&v["choices"][0]["message"]["tool_calls"][0]), "{}", r.body);
    }
    let body = json!({"messages": [{"role": "user", "content": "weather?"}], "tools": tools, "tool_choice": "required",
                      "parallel_tool_calls": false, "temperature": 0, "max_tokens": 300, "stream": true});
    let r = post(server.port, &body.to_string());
    let calls: Vec<Value> = r.body.lines().filter_map(|l| l.strip_prefix("data: ")).filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .flat_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned().unwrap_or_default()).collect();
    assert!(calls.len() == 1 && valid(&calls[0]), "{}", r.body);
    server.terminate();
    assert!(server.stderr().contains("tool calls: minicpm4_xml"));
}

/// vLLM's `ignore_eos`: with the end token forced by `logit_bias`, an answer stops at once, unless
/// the request says to go on past it to `max_tokens` (chat and completions).
#[test]
fn ignore_eos_goes_on_to_max_tokens() {
    let model = common::golden_with_tokenizer("A_dense_f32", "ignore-eos", Some(7));
    let server = Server::start(&model, &["--device", "cpu"], 200);
    let forced = r#", "max_tokens": 12, "logit_bias": {"7": 100}"#;
    let r = post(server.port, &chat(HI, forced));
    assert_eq!((r.json()["usage"]["completion_tokens"].as_u64(), r.json()["choices"][0]["finish_reason"].as_str()), (Some(1), Some("stop")), "{}", r.body);
    let r = post(server.port, &chat(HI, &format!("{forced}, \"ignore_eos\": true")));
    assert_eq!((r.json()["usage"]["completion_tokens"].as_u64(), r.json()["choices"][0]["finish_reason"].as_str()), (Some(12), Some("length")), "{}", r.body);
    let body = format!(r#"{{"prompt": "hi"{forced}, "ignore_eos": true}}"#);
    let r = request(server.port, "POST", "/v1/completions", Some(&body), &[]).expect("an answer");
    assert_eq!(r.json()["usage"]["completion_tokens"].as_u64(), Some(12), "{}", r.body);
    let r = post(server.port, &chat(HI, r#", "ignore_eos": "yes""#));
    assert!(r.status == 400 && r.body.contains("ignore_eos"), "{} {}", r.status, r.body);
}

/// A value of the server's `/metrics` (0 when not there yet).
fn metric(port: u16, name: &str) -> f64 {
    let text = request(port, "GET", "/metrics", None, &[]).expect("metrics").body;
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).map(|v| v.trim().parse().unwrap())).unwrap_or(0.0)
}

fn greedy_completion(port: u16, prompt: &str, max_tokens: usize) -> Value {
    let body = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true}).to_string();
    let r = request(port, "POST", "/v1/completions", Some(&body), &[]).expect("an answer");
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// A server that chunks prompts of up to 4096 tokens whole when nothing decodes, keeps no prompt
/// states (a prompt sent again runs whole), and takes 4 requests at once.
fn chunking_server() -> Server {
    Server::start(&model(), &["--device", "cpu", "--prefill-step", "4096", "--cache-memory", "0", "--parallel", "4"], 200)
}

/// A greedy stream of `tokens` tokens on `port`, started and past its short prompt on return.
fn stream_decoding(port: u16, tokens: usize) -> std::thread::JoinHandle<Value> {
    let stream = std::thread::spawn(move || greedy_completion(port, "tell me a long story", tokens));
    let started = Instant::now();
    while metric(port, "sala_batch_size") < 1.0 {
        assert!(started.elapsed() < Duration::from_secs(60), "the stream never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its short prompt is in after a few rounds of milliseconds.
    std::thread::sleep(Duration::from_millis(500));
    stream
}

/// A prompt of `n` letters with no run the tokenizer merges much.
fn letters(n: usize) -> String {
    (0..n).map(|i| char::from(b'a' + (i * 7 % 26) as u8)).collect()
}

/// A long prompt arriving while another request decodes goes in chunks paced to the decode
/// steps beside it (several, though it fits one `--prefill-step`), and answers as it does alone.
#[test]
fn a_long_prompt_beside_a_stream_goes_in_paced_chunks_and_answers_as_alone() {
    // No prefix cache: the second time the prompt runs whole again.
    let server = chunking_server();
    let port = server.port;
    let long = letters(3000);
    let alone = greedy_completion(port, &long, 8);
    // Alone it goes in whole, but for the restart point the trail keeps before its last token.
    let chunks_alone = metric(port, "sala_prefill_chunk_tokens_count");
    assert!(chunks_alone <= 2.0, "with nothing decoding a prompt under the step goes in whole: {chunks_alone} chunks");

    let stream = stream_decoding(port, 2000);
    let before = metric(port, "sala_prefill_chunk_tokens_count");
    let beside = greedy_completion(port, &long, 8);
    let chunks = metric(port, "sala_prefill_chunk_tokens_count") - before;
    let tokens = alone["usage"]["prompt_tokens"].as_f64().unwrap();
    assert!(chunks > chunks_alone + 1.0, "{chunks} chunk(s) for {tokens} prompt tokens beside a decoding stream, {chunks_alone} alone");
    assert_eq!(beside["choices"][0]["text"], alone["choices"][0]["text"], "{beside} vs {alone}");
    assert_eq!(stream.join().unwrap()["usage"]["completion_tokens"], 2000);
}

/// A short prompt sent while a long one goes in (in paced chunks, beside a stream) is admitted at
/// once, not after the long one is in: it answers before the long prompt's first token, and as it
/// answers alone.
#[test]
fn a_short_prompt_is_not_held_behind_a_long_one_going_in() {
    let server = chunking_server();
    let port = server.port;
    let alone = greedy_completion(port, "hi there", 4);
    let started = Instant::now();
    let stream = stream_decoding(port, 1500);
    let (done, finished) = std::sync::mpsc::channel();
    let chunks = metric(port, "sala_prefill_chunk_tokens_count");
    let long = letters(4800);
    let long_done = done.clone();
    let long = std::thread::spawn(move || {
        let r = greedy_completion(port, &long, 1);
        long_done.send("long").unwrap();
        r
    });
    // Once the long prompt's first chunk has run, the short one arrives.
    while metric(port, "sala_prefill_chunk_tokens_count") <= chunks {
        assert!(started.elapsed() < Duration::from_secs(120), "the long prompt never went in");
        std::thread::sleep(Duration::from_millis(2));
    }
    let short = std::thread::spawn(move || {
        let r = greedy_completion(port, "hi there", 4);
        done.send("short").unwrap();
        r
    });
    assert_eq!(finished.recv().unwrap(), "short", "the short prompt waited for the long one to go in");
    let short = short.join().unwrap();
    assert_eq!(short["choices"][0]["text"], alone["choices"][0]["text"], "{short} vs {alone}");
    let long = long.join().unwrap();
    assert!(long["usage"]["prompt_tokens"].as_u64().unwrap() > 4000, "{long}");
    assert_eq!(stream.join().unwrap()["usage"]["completion_tokens"], 1500);
}

/// `ttft_ms` and `total_ms` of each finished completion in a server's request log.
fn completion_times(log: &str) -> Vec<(f64, f64)> {
    let field = |line: &str, name: &str| line.split_whitespace().find_map(|w| w.strip_prefix(name)).and_then(|v| v.parse::<f64>().ok());
    log.lines()
        .filter(|l| l.contains("path=/v1/completions") && l.contains("status=200"))
        .filter_map(|l| Some((field(l, "ttft_ms=")?, field(l, "total_ms=")?)))
        .collect()
}

/// Requests whose caches do not fit together in `--kv-memory` take turns: with room for one and a
/// half, of two sent at once the second reaches its first token only after the first is done,
/// while with room for both they run together; one that could not fit even alone is refused
/// with the sizes and what to change. The gauges show the budget and what a request holds.
#[test]
fn requests_whose_caches_do_not_fit_together_take_turns() {
    let (prompts, max_tokens) = ([letters(400), (0..400).map(|i| char::from(b'a' + (i * 11 % 26) as u8)).collect::<String>()], 48);
    let args = |memory: &str| -> Vec<String> {
        ["--device", "cpu", "--cache-memory", "0", "--parallel", "4", "--kv-memory", memory].iter().map(|s| s.to_string()).collect()
    };
    let start = |memory: &str| {
        let args = args(memory);
        Server::start(&model(), &args.iter().map(String::as_str).collect::<Vec<_>>(), 200)
    };
    // What one request's cache takes, read while it runs alone. The budget is on /metrics once
    // the server says it is ready.
    let probe = start("100GB");
    assert_eq!(metric(probe.port, "sala_kv_budget_bytes"), 100e9);
    let need = {
        let (port, prompt) = (probe.port, prompts[0].clone());
        let answer = std::thread::spawn(move || greedy_completion(port, &prompt, max_tokens));
        let (mut need, started) = (0.0, Instant::now());
        while need == 0.0 && !answer.is_finished() {
            assert!(started.elapsed() < Duration::from_secs(120), "the request never ran");
            need = metric(port, "sala_kv_reserved_bytes");
            std::thread::sleep(Duration::from_millis(5));
        }
        answer.join().unwrap();
        need as u64
    };
    assert!(need > 0, "no cache memory was held for the request");
    drop(probe);
    let both = |server: &Server| {
        let runs: Vec<_> = prompts
            .iter()
            .map(|p| {
                let (port, prompt) = (server.port, p.clone());
                std::thread::spawn(move || greedy_completion(port, &prompt, max_tokens))
            })
            .collect();
        for run in runs {
            assert_eq!(run.join().unwrap()["usage"]["completion_tokens"], max_tokens);
        }
        // A request's log line is written as it ends, which may be just after its answer arrived.
        let logged = Instant::now();
        let mut times = completion_times(&server.log_so_far());
        while times.len() < 2 && logged.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(20));
            times = completion_times(&server.log_so_far());
        }
        assert_eq!(times.len(), 2, "{}", server.log_so_far());
        times.sort_by(|a, b| a.1.total_cmp(&b.1));
        (times[0], times[1])
    };
    // Room for one and a half: the second goes in once the first is done (both were sent at
    // once, so the first's whole time is the least the second waits, less their arrivals' gap).
    let tight = start(&(need * 3 / 2).to_string());
    let (first, second) = both(&tight);
    assert!(second.0 + 100.0 >= first.1, "the second started beside the first: {first:?} {second:?}");
    // Alone too big: refused, naming the sizes and what to change.
    let body = json!({"prompt": prompts[0], "max_tokens": 40000, "ignore_eos": true}).to_string();
    let r = request(tight.port, "POST", "/v1/completions", Some(&body), &[]).expect("an answer");
    assert_eq!(r.status, 400, "{}", r.body);
    let message = r.json()["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("max_tokens 40000") && message.contains("more than the") && message.contains("fewer tokens"), "{message}");
    drop(tight);
    // Room for both: they run side by side.
    let roomy = start(&(need * 3).to_string());
    let (first, second) = both(&roomy);
    assert!(second.0 < first.1, "with room for both, the second still waited: {first:?} {second:?}");
}

/// Prompts arriving together beside a stream share a round's prompt budget (each its own chunk):
/// short and long ones, and one only scored (`max_tokens` 0, which leaves as its prompt goes
/// in), each answer as they do alone, and the stream is not disturbed.
#[test]
fn prompts_arriving_together_beside_a_stream_each_answer_as_alone() {
    let server = Server::start(&model(), &["--device", "cpu", "--prefill-step", "4096", "--cache-memory", "0", "--parallel", "6"], 200);
    let port = server.port;
    let scored = |port: u16| {
        let body = json!({"prompt": "the cat sat on the mat", "max_tokens": 0, "echo": true, "logprobs": 1, "temperature": 0}).to_string();
        let r = request(port, "POST", "/v1/completions", Some(&body), &[]).expect("an answer");
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["choices"][0]["logprobs"]["token_logprobs"].clone()
    };
    let prompts = ["hi there".to_string(), "what is two and two".to_string(), letters(700)];
    let alone: Vec<Value> = prompts.iter().map(|p| greedy_completion(port, p, 6)["choices"][0]["text"].clone()).collect();
    let scored_alone = scored(port);
    assert!(scored_alone.as_array().is_some_and(|l| l.len() > 3), "{scored_alone}");

    let stream = stream_decoding(port, 1500);
    let together: Vec<_> = prompts.iter().cloned().map(|p| std::thread::spawn(move || greedy_completion(port, &p, 6)["choices"][0]["text"].clone())).collect();
    let scored_together = std::thread::spawn(move || scored(port));
    for (i, (answer, alone)) in together.into_iter().zip(&alone).enumerate() {
        assert_eq!(&answer.join().unwrap(), alone, "prompt {i}");
    }
    assert_eq!(scored_together.join().unwrap(), scored_alone);
    assert_eq!(stream.join().unwrap()["usage"]["completion_tokens"], 1500);
}
