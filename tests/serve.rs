//! `sala serve` against the official `openai` Python client (PyPI, in a venv cached under
//! `$SALA_TEST_ASSETS`): answers, streaming with usage, stop sequences, max_tokens, logit_bias,
//! a tools round trip (parsed and streamed calls, the result sent back), OpenAI-schema errors, the API key, a client leaving mid-stream, concurrent requests, oversized
//! and malformed bodies (tests/reference/openai_client.py); structured output, response_format and
//! tool_choice="required" (tests/reference/openai_structured.py); then 16 concurrent streaming clients for
//! 60 s and a bounded fuzz of bad requests (tests/reference/openai_load.py). Real weights: SmolLM2.
//! Then the model endpoints (list, background download, delete) against a local hub.

mod common;

use common::server::{request, Server};
use std::process::Command;
use std::time::{Duration, Instant};

/// One request: the status and the JSON body (Null if none), or `None` when nothing answered.
fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> Option<(u16, serde_json::Value)> {
    request(port, method, path, body, &[]).map(|r| (r.status, r.json()))
}

#[test]
fn openai_client_against_sala_serve() {
    let python = common::venv_python("openai-venv", "SALA_OPENAI_PYTHON", "openai", &["openai==1.109.1"]);
    let mut server = Server::spawn(Command::new(env!("CARGO_BIN_EXE_sala")), &common::smollm2_gguf(), &["--api-key", "test-key"]);
    let port = server.port;
    // /health says 503 while loading, then 200.
    let before_ready = server.wait_for_health(200);
    assert!(before_ready.contains(&503), "/health never reported loading: {before_ready:?}");
    let health = request(port, "GET", "/health", None, &[]).unwrap().json();
    assert!(health["status"] == "ok" && health.get("synthetic").is_none(), "trained weights are not called synthetic: {health}");
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference/openai_client.py");
    let out = Command::new(&python).arg(script).arg(format!("http://127.0.0.1:{port}")).arg("test-key").output().unwrap();
    let transcript = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && transcript.contains("all checks passed"), "{transcript}");

    // Structured output: response_format (pydantic through parse()) and tool_choice="required".
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference/openai_structured.py");
    let out = Command::new(&python).arg(script).arg(format!("http://127.0.0.1:{port}")).arg("test-key").output().unwrap();
    let transcript = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{transcript}");
    assert!(out.status.success() && transcript.contains("structured output checks passed"), "{transcript}");

    // 16 concurrent streaming clients for 60 s, then 300 malformed requests: zero failures, no 5xx.
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference/openai_load.py");
    let python = common::venv_python("openai-venv", "SALA_OPENAI_PYTHON", "openai", &["openai==1.109.1"]);
    let out = Command::new(python)
        .arg(script)
        .arg(format!("http://127.0.0.1:{port}"))
        .args(["test-key", "16", "60", "16"])
        .output()
        .unwrap();
    let transcript = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{transcript}");
    assert!(out.status.success() && transcript.contains("server healthy after load and fuzz"), "{transcript}");
}

/// The model endpoints against a local hub: the list with metadata, a background download whose
/// progress can be watched, deletion, and ids that try to leave the store.
#[test]
fn model_endpoints_download_list_delete() {
    use common::hub::*;
    let hub = start_hub(Faults::default());
    let cache = temp_cache("serve-models");
    let served = common::smollm2_gguf();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sala"));
    hub_env(&mut cmd, &cache, &hub);
    let server = Server::start_with(cmd, &served, &[], 200);
    let port = server.port;
    let start = Instant::now();
    // Concurrent listings describe the served GGUF once (each read the whole file: 16 calls took
    // the server from 0.55 to 2.3 GB).
    let rss = |pid: u32| -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status.lines().find_map(|l| l.strip_prefix("VmHWM:")).unwrap().trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() * 1024
    };
    let before = rss(server.child.id());
    std::thread::scope(|scope| {
        for _ in 0..16 {
            scope.spawn(|| assert_eq!(http(port, "GET", "/v1/models", None).unwrap().0, 200));
        }
    });
    let grown = rss(server.child.id()) - before;
    let gguf_bytes = std::fs::metadata(&served).unwrap().len();
    assert!(grown < 3 * gguf_bytes, "16 listings grew the server by {grown} bytes (the GGUF is {gguf_bytes})");
    let (status, list) = http(port, "GET", "/v1/models", None).unwrap();
    // Listed by its file's stem; the path stays accepted (tests/serve_tokenizer.rs).
    let served_id = served.file_stem().unwrap().to_string_lossy().to_string();
    assert_eq!(status, 200);
    assert_eq!(list["data"].as_array().unwrap().len(), 1, "{list}");
    let model = &list["data"][0];
    assert_eq!((model["id"].as_str(), model["loaded"].as_bool()), (Some(served_id.as_str()), Some(true)), "{model}");
    assert!(model["quantization"].as_str().is_some_and(|q| q.contains("4-bit")), "{model}");
    assert_eq!(model["architecture"], "llama");
    assert!(model["size"].as_u64().unwrap() > 0 && model["path"].is_string(), "{model}");

    // A background download, watched until it completes.
    let (status, started) = http(port, "POST", "/v1/models/download", Some(&format!("{{\"model\": \"{REPO}\"}}"))).unwrap();
    assert!(status == 202 && started["id"] == REPO, "{status} {started}");
    let total: u64 = hub.files.iter().map(|f| f.data.len() as u64).sum();
    let done = loop {
        let (_, downloads) = http(port, "GET", "/v1/models/download", None).unwrap();
        let d = downloads["data"][0].clone();
        assert_ne!(d["status"], "failed", "{d}");
        if d["status"] == "completed" {
            break d;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "download never finished: {d}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!((done["downloaded_bytes"].as_u64(), done["total_bytes"].as_u64()), (Some(total), Some(total)), "{done}");
    assert_eq!((done["files_done"].as_u64(), done["files_total"].as_u64()), (Some(3), Some(3)), "{done}");
    let snapshot = cache.join("models--test-org--tiny-sala/snapshots").join(COMMIT);
    for f in &hub.files {
        assert!(std::fs::read(snapshot.join(f.name)).unwrap() == f.data, "{} differs", f.name);
    }
    let (_, list) = http(port, "GET", "/v1/models", None).unwrap();
    let stored = list["data"].as_array().unwrap().iter().find(|m| m["id"] == REPO).expect("downloaded model listed").clone();
    assert_eq!((stored["loaded"].as_bool(), stored["size"].as_u64()), (Some(false), Some(total)), "{stored}");

    // Ids that are not store names are refused before touching the disk; unknown ones are 404.
    for (path, want) in [
        ("/v1/models/..%2F..%2Fetc", 400),
        ("/v1/models/%2Fetc%2Fpasswd", 400),
        ("/v1/models//etc/passwd", 400),
        ("/v1/models/test-org/../../x", 400),
        ("/v1/models/a/b/c", 400),
        ("/v1/models/test-org/absent", 404),
    ] {
        let (status, body) = http(port, "DELETE", path, None).unwrap();
        assert!(status == want && body["error"]["message"].is_string(), "{path}: {status} {body}");
    }
    let encoded: String = served_id.bytes().map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") }).collect();
    assert_eq!(http(port, "DELETE", &format!("/v1/models/{encoded}"), None).unwrap().0, 409, "the served model is in use");
    let (status, body) = http(port, "POST", "/v1/models/download", Some("{\"model\": \"../../etc\"}")).unwrap();
    assert!(status == 400 && body["error"]["param"] == "model", "{status} {body}");

    let (status, body) = http(port, "DELETE", &format!("/v1/models/{REPO}"), None).unwrap();
    assert!(status == 200 && body["deleted"] == true && body["id"] == REPO, "{status} {body}");
    assert!(!cache.join("models--test-org--tiny-sala").exists());
    let (_, list) = http(port, "GET", "/v1/models", None).unwrap();
    assert_eq!(list["data"].as_array().unwrap().len(), 1, "{list}");
    assert!(served.is_file(), "the served model is untouched");
    std::fs::remove_dir_all(cache).unwrap();
}
