//! `sala serve` against the official `openai` Python client (PyPI, in a venv cached under
//! `$SALA_TEST_ASSETS`): answers, streaming with usage, stop sequences, max_tokens, logit_bias,
//! OpenAI-schema errors, the API key, a client leaving mid-stream, concurrent requests, oversized
//! and malformed bodies (tests/reference/openai_client.py); then 16 concurrent streaming clients for
//! 20 s and a bounded fuzz of bad requests (tests/reference/openai_load.py). Real weights: SmolLM2.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// GET `path` on 127.0.0.1:`port`; the status code, if the server answered.
fn get_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).ok()?;
    let mut head = String::new();
    s.read_to_string(&mut head).ok()?;
    head.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn openai_client_against_sala_serve() {
    let python = common::venv_python("openai-venv", "SALA_OPENAI_PYTHON", "openai", &["openai==1.109.1"]);
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_sala"))
        .args(["serve", "--model"])
        .arg(common::smollm2_gguf())
        .args(["--port", &port.to_string(), "--api-key", "test-key"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _server = Server(child);
    // /health says 503 while loading, then 200.
    let start = Instant::now();
    let mut seen_loading = false;
    loop {
        match get_status(port, "/health") {
            Some(200) => break,
            Some(503) => seen_loading = true,
            _ => {}
        }
        assert!(start.elapsed() < Duration::from_secs(120), "server not ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(seen_loading, "/health never reported loading");
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference/openai_client.py");
    let out = Command::new(python).arg(script).arg(format!("http://127.0.0.1:{port}")).arg("test-key").output().unwrap();
    let transcript = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && transcript.contains("all checks passed"), "{transcript}");

    // 16 concurrent streaming clients for 20 s, then 300 malformed requests: zero failures, no 5xx.
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference/openai_load.py");
    let python = common::venv_python("openai-venv", "SALA_OPENAI_PYTHON", "openai", &["openai==1.109.1"]);
    let out = Command::new(python)
        .arg(script)
        .arg(format!("http://127.0.0.1:{port}"))
        .args(["test-key", "16", "20"])
        .output()
        .unwrap();
    let transcript = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{transcript}");
    assert!(out.status.success() && transcript.contains("server healthy after load and fuzz"), "{transcript}");
}
