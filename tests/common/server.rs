//! `sala serve` as a child process, and raw HTTP/1.1 requests to it (what a client sends is
//! exactly what the test says, bad bytes included).

use std::io::{BufRead, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running server, killed when dropped.
pub struct Server {
    pub child: Child,
    pub port: u16,
    log: Arc<Mutex<String>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts `sala serve --model model extra…` and waits until `/health` answers `ready_status`
    /// (200 once loaded; 500 for a model that cannot load).
    pub fn start(model: &Path, extra: &[&str], ready_status: u16) -> Self {
        Self::start_with(Command::new(env!("CARGO_BIN_EXE_sala")), model, extra, ready_status)
    }

    pub fn start_with(cmd: Command, model: &Path, extra: &[&str], ready_status: u16) -> Self {
        let mut server = Self::spawn(cmd, model, extra);
        server.wait_for_health(ready_status);
        server
    }

    /// Starts the server on a port the system picks (`--port 0`) and returns once it has said
    /// where it listens. A port chosen by the test could be taken by another socket before the
    /// server binds it.
    pub fn spawn(mut cmd: Command, model: &Path, extra: &[&str]) -> Self {
        cmd.args(["serve", "--model"]).arg(model);
        Self::launch(cmd, extra)
    }

    /// Starts `sala serve extra…` without a model (serving the store `cmd`'s environment names)
    /// and waits until `/health` answers 200.
    pub fn start_serving_store(mut cmd: Command, extra: &[&str]) -> Self {
        cmd.arg("serve");
        let mut server = Self::launch(cmd, extra);
        server.wait_for_health(200);
        server
    }

    fn launch(mut cmd: Command, extra: &[&str]) -> Self {
        let mut child = cmd
            .args(["--port", "0"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (port_tx, port_rx) = std::sync::mpsc::channel();
        let reader = {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                    let port = line.strip_prefix("listening on http://").and_then(|a| a.rsplit(':').next()).and_then(|p| p.parse::<u16>().ok());
                    if let Some(port) = port {
                        let _ = port_tx.send(port);
                    }
                    let mut log = log.lock().unwrap();
                    log.push_str(&line);
                    log.push('\n');
                }
            })
        };
        let mut server = Server { child, port: 0, log, reader: Some(reader) };
        match port_rx.recv_timeout(Duration::from_secs(120)) {
            Ok(port) => server.port = port,
            Err(_) => server.fail("never said where it listens"),
        }
        server
    }

    /// Polls `/health` until it answers `ready_status`; the statuses it answered before.
    pub fn wait_for_health(&mut self, ready_status: u16) -> Vec<u16> {
        let start = Instant::now();
        let mut seen = Vec::new();
        loop {
            match get_status(self.port, "/health") {
                Some(s) if s == ready_status => return seen,
                Some(s) => seen.push(s),
                None => {}
            }
            if seen.last() == Some(&500) {
                self.fail("failed to load (/health answered 500)");
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                self.fail(&format!("exited ({status}) before /health answered {ready_status}"));
            }
            if start.elapsed() > Duration::from_secs(120) {
                self.fail(&format!("not ready after 120 s (/health answered {seen:?})"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn fail(&mut self, what: &str) -> ! {
        let _ = self.child.kill();
        let _ = self.child.wait();
        panic!("server {what}; its stderr:\n{}", self.stderr())
    }

    /// What the server has written on stderr so far.
    pub fn log_so_far(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Everything the server wrote on stderr (after it exited or was killed).
    pub fn stderr(&mut self) -> String {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.log.lock().unwrap().clone()
    }

    /// The most memory the server has held (VmHWM), in bytes.
    pub fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }

    /// Sends SIGTERM, as a service manager would.
    pub fn terminate(&self) {
        let status = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status().unwrap();
        assert!(status.success());
    }
}

/// A raw response: status, headers (lower-case names) and body.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// An OpenAI-schema error: `{"error": {"message", "type", "param", "code"}}` as JSON.
    pub fn is_api_error(&self) -> bool {
        let v = self.json();
        self.header("content-type").is_some_and(|c| c.starts_with("application/json"))
            && v["error"]["message"].is_string()
            && v["error"]["type"].is_string()
            && v["error"]["code"].is_string()
            && v["error"].get("param").is_some()
    }
}

/// Sends raw bytes and reads the whole response (`Connection: close`); `None` when the server
/// closed the connection without answering.
pub fn raw(port: u16, bytes: &[u8]) -> Option<Response> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(120))).ok()?;
    s.write_all(bytes).ok()?;
    let mut response = Vec::new();
    s.read_to_end(&mut response).ok()?;
    parse(&response)
}

/// [`raw`] written in pieces of `piece` bytes a millisecond apart, as a slow client sends: the
/// server reads what has come so far each time, so a limit on what it buffers is met before the
/// request ends (sent at once, a request over the limit may arrive in one read and pass). Writing
/// stops when the server closes; what it answered before closing is read all the same.
pub fn raw_in_pieces(port: u16, bytes: &[u8], piece: usize) -> Option<Response> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(120))).ok()?;
    for part in bytes.chunks(piece) {
        if s.write_all(part).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut response = Vec::new();
    let _ = s.read_to_end(&mut response);
    parse(&response)
}

pub fn parse(response: &[u8]) -> Option<Response> {
    let text = String::from_utf8_lossy(response);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers = lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string())).collect();
    let mut response = Response { status, headers, body: body.to_string() };
    if response.header("transfer-encoding") == Some("chunked") {
        response.body = dechunk(body);
    }
    Some(response)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else { break };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// One request with a JSON (or any) body and optional extra header lines.
pub fn request(port: u16, method: &str, path: &str, body: Option<&str>, headers: &[&str]) -> Option<Response> {
    let body = body.unwrap_or("");
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n", body.len());
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    raw(port, (head + body).as_bytes())
}

pub fn get_status(port: u16, path: &str) -> Option<u16> {
    request(port, "GET", path, None, &[]).map(|r| r.status)
}
