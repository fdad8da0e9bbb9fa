//! A local server that speaks the HuggingFace hub's file protocol, for `sala pull` and the
//! server's download endpoint: the repo API with `blobs=true`, `resolve` URLs answering with a
//! redirect and the X-Repo-Commit / ETag / X-Linked-Etag / X-Linked-Size headers, a "CDN" serving
//! Range requests — and faults on request: a connection cut mid-file, a corrupted byte, a
//! connection that stalls mid-file, a slow trickle, a drip of single bytes, a wrong sha256 in
//! the listing, files listed without a size and sent without a length (endlessly, if asked); and
//! an endpoint that accepts connections and never answers.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

pub const COMMIT: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678";
pub const REPO: &str = "test-org/tiny-sala";

pub struct File {
    pub name: &'static str,
    pub data: Vec<u8>,
    pub lfs: bool,
}

#[derive(Default)]
pub struct Faults {
    /// The first full download of these files stops halfway (connection closed).
    pub cut_once: HashSet<&'static str>,
    /// The first full download of these files has one byte flipped.
    pub corrupt_once: HashSet<&'static str>,
    /// The first full download of these files sends half the body, then holds the connection open
    /// without a byte more until the client hangs up.
    pub stall_once: HashSet<&'static str>,
    /// Every download of these files trickles: 4 KiB every 20 ms.
    pub slow: HashSet<&'static str>,
    /// The first full download of these files drips: one byte every 100 ms (each read well
    /// within any timeout), until the client hangs up.
    pub drip_once: HashSet<&'static str>,
    /// The listing gives these files a sha256 their bytes do not have.
    pub bad_sha: HashSet<&'static str>,
    /// These files are listed without a size or sha256 and sent without a length (no
    /// Content-Length or Content-Range: the body ends when the connection closes).
    pub no_size: HashSet<&'static str>,
    /// Of the files without a size, these are sent as garbage without end.
    pub endless: HashSet<&'static str>,
}

#[derive(Default)]
pub struct Log {
    /// (file, first byte asked for) of every data request to the CDN.
    pub data_requests: Vec<(String, u64)>,
    pub authorization: Vec<String>,
}

pub struct Hub {
    /// The one repo it serves (org/name).
    pub repo: String,
    pub files: Vec<File>,
    pub faults: Mutex<Faults>,
    pub log: Mutex<Log>,
    pub port: u16,
}

fn etag(f: &File) -> String {
    if f.lfs { super::sha256_hex(&f.data) } else { super::sha256_hex(&f.data)[..40].to_string() }
}

impl Hub {
    pub fn file(&self, name: &str) -> Option<&File> {
        self.files.iter().find(|f| f.name == name)
    }

    fn handle(&self, mut stream: TcpStream) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).is_err() {
            return;
        }
        let mut range: Option<(u64, Option<u64>)> = None;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            let (key, value) = line.split_once(':').unwrap_or(("", ""));
            let value = value.trim();
            match key.to_ascii_lowercase().as_str() {
                "range" => {
                    let spec = value.trim_start_matches("bytes=");
                    let (a, b) = spec.split_once('-').unwrap();
                    range = Some((a.parse().unwrap(), b.parse().ok()));
                }
                "authorization" => self.log.lock().unwrap().authorization.push(value.to_string()),
                _ => {}
            }
        }
        let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_string();
        let path = path.split('?').next().unwrap();
        let send = |stream: &mut TcpStream, status: &str, headers: &[(String, String)], body: &[u8]| {
            let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
            for (k, v) in headers {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body);
        };
        let repo = &self.repo;
        if path == format!("/api/models/{repo}/revision/main") {
            let faults = self.faults.lock().unwrap();
            let siblings: Vec<serde_json::Value> = self
                .files
                .iter()
                .map(|f| {
                    if faults.no_size.contains(f.name) {
                        return serde_json::json!({"rfilename": f.name, "blobId": etag(f)});
                    }
                    let mut s = serde_json::json!({"rfilename": f.name, "size": f.data.len(), "blobId": etag(f)});
                    if f.lfs {
                        let sha = if faults.bad_sha.contains(f.name) { "0".repeat(64) } else { super::sha256_hex(&f.data) };
                        s["lfs"] = serde_json::json!({"sha256": sha, "size": f.data.len(), "pointerSize": 134});
                    }
                    s
                })
                .collect();
            drop(faults);
            let body = serde_json::json!({"id": repo, "sha": COMMIT, "siblings": siblings}).to_string();
            send(&mut stream, "200 OK", &[("Content-Type".into(), "application/json".into()), ("Content-Length".into(), body.len().to_string())], body.as_bytes());
        } else if let Some(name) = path.strip_prefix(&format!("/{repo}/resolve/main/")) {
            let Some(f) = self.file(name) else { return send(&mut stream, "404 Not Found", &[("Content-Length".into(), "0".into())], b"") };
            let mut headers = vec![
                ("Location".to_string(), format!("http://127.0.0.1:{}/cdn/{name}", self.port)),
                ("X-Repo-Commit".to_string(), COMMIT.to_string()),
                ("ETag".to_string(), format!("\"{}\"", etag(f))),
                ("Content-Length".to_string(), "0".to_string()),
            ];
            if f.lfs {
                headers.push(("X-Linked-Etag".into(), format!("\"{}\"", super::sha256_hex(&f.data))));
                if !self.faults.lock().unwrap().no_size.contains(f.name) {
                    headers.push(("X-Linked-Size".into(), f.data.len().to_string()));
                }
            }
            send(&mut stream, "302 Found", &headers, b"");
        } else if let Some(name) = path.strip_prefix("/cdn/") {
            let Some(f) = self.file(name) else { return send(&mut stream, "404 Not Found", &[("Content-Length".into(), "0".into())], b"") };
            let total = f.data.len() as u64;
            let (start, end) = match range {
                Some((a, b)) => (a, b.unwrap_or(total - 1).min(total - 1)),
                None => (0, total - 1),
            };
            let probe = range == Some((0, Some(0)));
            let mut body = f.data[start as usize..=end as usize].to_vec();
            let (mut cut, mut stall, mut slow, mut drip, mut no_size, mut endless) = (false, false, false, false, false, false);
            if !probe {
                self.log.lock().unwrap().data_requests.push((name.to_string(), start));
                let mut faults = self.faults.lock().unwrap();
                if start == 0 && faults.corrupt_once.remove(f.name) {
                    let at = body.len() / 3;
                    body[at] ^= 0x5a;
                }
                if start == 0 && faults.cut_once.remove(f.name) {
                    cut = true;
                }
                if start == 0 && faults.stall_once.remove(f.name) {
                    stall = true;
                }
                slow = faults.slow.contains(f.name);
                if start == 0 && faults.drip_once.remove(f.name) {
                    drip = true;
                }
                no_size = faults.no_size.contains(f.name);
                endless = faults.endless.contains(f.name);
            }
            let headers = vec![
                ("Content-Range".to_string(), format!("bytes {start}-{end}/{total}")),
                ("Content-Length".to_string(), (end + 1 - start).to_string()),
                ("Accept-Ranges".to_string(), "bytes".to_string()),
            ];
            let status = if range.is_some() { "206 Partial Content" } else { "200 OK" };
            if no_size {
                // No length at all: the body is what comes before the connection closes.
                send(&mut stream, "200 OK", &[], b"");
                if endless {
                    let garbage = vec![0x5au8; 64 << 10];
                    while stream.write_all(&garbage).is_ok() {}
                } else {
                    let _ = stream.write_all(&body);
                }
            } else if drip {
                send(&mut stream, status, &headers, b"");
                for byte in body.chunks(1) {
                    if stream.write_all(byte).is_err() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            } else if cut {
                // Promise the whole body, send half, hang up.
                send(&mut stream, status, &headers, &body[..body.len() / 2]);
                let _ = stream.shutdown(std::net::Shutdown::Both);
            } else if stall {
                // Promise the whole body, send half, then nothing until the client gives up.
                send(&mut stream, status, &headers, &body[..body.len() / 2]);
                let mut sink = [0u8; 64];
                while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
            } else if slow {
                send(&mut stream, status, &headers, b"");
                for piece in body.chunks(4096) {
                    if stream.write_all(piece).is_err() {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
            } else {
                send(&mut stream, status, &headers, &body);
            }
        } else {
            send(&mut stream, "404 Not Found", &[("Content-Length".into(), "0".into())], b"");
        }
    }
}

pub fn start_hub(faults: Faults) -> Arc<Hub> {
    let golden = super::golden("A_dense_f32");
    let files = vec![
        File { name: "config.json", data: std::fs::read(golden.join("config.json")).unwrap(), lfs: false },
        File { name: "model.safetensors", data: std::fs::read(golden.join("model.safetensors")).unwrap(), lfs: true },
        File { name: "extra/notes.bin", data: (0..200_000u32).flat_map(|i| (i * 7919).to_le_bytes()).collect(), lfs: true },
    ];
    start_hub_serving(REPO, files, faults)
}

/// A hub serving `files` as the repo `repo`.
pub fn start_hub_serving(repo: &str, files: Vec<File>, faults: Faults) -> Arc<Hub> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hub = Arc::new(Hub { repo: repo.to_string(), files, faults: Mutex::new(faults), log: Mutex::new(Log::default()), port });
    let server = hub.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let hub = server.clone();
            std::thread::spawn(move || hub.handle(stream));
        }
    });
    hub
}

/// An endpoint that accepts every connection and never answers (nor closes); returns its port.
pub fn start_silent_endpoint() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    port
}

/// Runs `cmd` to its end, or kills it at `limit`; the output and how long it ran.
pub fn output_within(cmd: &mut Command, limit: std::time::Duration) -> (std::process::Output, std::time::Duration) {
    let start = std::time::Instant::now();
    let mut child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    while child.try_wait().unwrap().is_none() && start.elapsed() < limit {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = child.kill();
    (child.wait_with_output().unwrap(), start.elapsed())
}

/// Points a command at `hub` with the store in `cache` (and a token the hub records).
pub fn hub_env<'a>(cmd: &'a mut Command, cache: &Path, hub: &Hub) -> &'a mut Command {
    cmd.env("HF_HUB_CACHE", cache)
        .env("HF_HOME", cache.join("hf-home"))
        .env("HF_ENDPOINT", format!("http://127.0.0.1:{}", hub.port))
        .env("HF_TOKEN", "test-token")
        .env_remove("HF_HUB_OFFLINE")
}

pub fn sala(cache: &Path, hub: &Hub, args: &[&str], extra_env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sala"));
    hub_env(&mut cmd, cache, hub).args(args);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

pub fn temp_cache(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sala-pull-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

