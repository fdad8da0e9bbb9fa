//! `sala serve` without `--model` serves every model of the store by its name: a model loads on
//! its first request (which waits for it and gets the answer a server of that one model gives,
//! log-probabilities included), at most
//! `--max-models` stay loaded (the least recently used idle one makes room), a model idle for
//! `--keep-alive` is unloaded, and `/health` and `/v1/models` say which are loaded.

mod common;

use common::server::{request, Server};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
const PROMPT: &str = "The quick brown fox";

/// A store (hub cache layout) holding three models as test-org/alpha, test-org/beta and
/// test-org/gamma, and their snapshot folders: golden case A with a byte tokenizer, made three
/// different models by its embedding scale.
fn store(label: &str) -> (PathBuf, Vec<(&'static str, PathBuf)>) {
    let cache = std::env::temp_dir().join(format!("sala-serve-models-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    // An end-of-sequence id the random weights may draw: answers can end early, the same way everywhere.
    let dir = common::golden_with_tokenizer("A_dense_f32", &format!("store-{label}"), Some(300));
    let mut dirs = Vec::new();
    for (name, scale_emb) in [("test-org/alpha", 12), ("test-org/beta", 6), ("test-org/gamma", 20)] {
        let repo = cache.join(format!("models--{}", name.replace('/', "--")));
        let snapshot = repo.join("snapshots").join(COMMIT);
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), COMMIT).unwrap();
        for f in ["model.safetensors", "tokenizer.json"] {
            std::fs::copy(dir.join(f), snapshot.join(f)).unwrap();
        }
        let mut config: Value = serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        config["scale_emb"] = json!(scale_emb);
        std::fs::write(snapshot.join("config.json"), config.to_string()).unwrap();
        dirs.push((name, snapshot));
    }
    (cache, dirs)
}

fn serve_store(cache: &Path, extra: &[&str]) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sala"));
    cmd.env("HF_HUB_CACHE", cache).env("HF_HUB_OFFLINE", "1").env_remove("SALA_AVAILABLE_MEMORY");
    Server::start_serving_store(cmd, &[&["--dtype", "f32"][..], extra].concat())
}

/// The greedy completion of PROMPT by `model` (`None`: the one a --model server serves): its
/// choice, text and per-token log-probabilities (the byte tokenizer names few of the random
/// models' tokens, so the numbers tell answers apart).
fn complete_port(port: u16, model: Option<&str>) -> Value {
    let mut body = json!({"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 1});
    if let Some(model) = model {
        body["model"] = json!(model);
    }
    let r = request(port, "POST", "/v1/completions", Some(&body.to_string()), &[]).expect("an answer");
    assert_eq!(r.status, 200, "{model:?}: {}", r.body);
    let mut choice = r.json()["choices"][0].clone();
    choice.as_object_mut().unwrap().remove("index");
    choice
}

fn complete(server: &Server, model: &str) -> Value {
    complete_port(server.port, Some(model))
}

/// What a server of just the model in `dir` answers.
fn answer_of(dir: &Path) -> Value {
    let server = Server::start(dir, &["--dtype", "f32"], 200);
    complete_port(server.port, None)
}

/// The same text and tokens, and log-probabilities within 1e-4: a request decoded beside others
/// may differ from a lone run in the last bits (a BLAS need not compute a row alike in every batch).
fn assert_same_answer(got: &Value, want: &Value, what: &str) {
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() < 1e-4,
            (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y)),
            (Value::Object(x), Value::Object(y)) => x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w))),
            _ => a == b,
        }
    }
    assert!(same(got, want), "{what}: {got} against {want}");
}

fn health(server: &Server) -> Vec<(String, String)> {
    let r = request(server.port, "GET", "/health", None, &[]).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["models"].as_array().unwrap().iter().map(|m| (m["model"].as_str().unwrap().to_string(), m["status"].as_str().unwrap().to_string())).collect()
}

fn loaded(server: &Server) -> Vec<String> {
    health(server).into_iter().filter(|(_, s)| s == "ready").map(|(m, _)| m).collect()
}

fn listed_status(server: &Server, model: &str) -> String {
    let v = request(server.port, "GET", "/v1/models", None, &[]).unwrap().json();
    let entry = v["data"].as_array().unwrap().iter().find(|m| m["id"] == model).unwrap_or_else(|| panic!("{model} not listed: {v}")).clone();
    entry["status"].as_str().unwrap().to_string()
}

#[test]
fn one_model_at_a_time_loads_on_demand_and_unloads_when_idle() {
    let (cache, dirs) = store("one");
    let mut server = serve_store(&cache, &["--max-models", "1", "--keep-alive", "3s"]);
    assert!(loaded(&server).is_empty(), "nothing loads before it is asked for");
    assert_eq!(listed_status(&server, "test-org/alpha"), "unloaded");

    // Each model answers as `sala run` does with it, loading on its first request.
    for (name, dir) in &dirs[..2] {
        let answer = complete(&server, name);
        assert_eq!(answer, answer_of(dir), "{name}");
        assert_eq!(loaded(&server), vec![name.to_string()], "--max-models 1 keeps only the last one used");
        assert_eq!(listed_status(&server, name), "loaded");
    }
    assert!(server.log_so_far().contains("model unloaded: test-org/alpha"), "{}", server.log_so_far());
    assert_eq!(listed_status(&server, "test-org/alpha"), "unloaded");

    // Asked again, alpha loads again and still answers the same.
    assert_eq!(complete(&server, "test-org/alpha"), answer_of(&dirs[0].1));

    // Idle past --keep-alive: unloaded without a request.
    let idle = Instant::now();
    while !loaded(&server).is_empty() {
        assert!(idle.elapsed() < Duration::from_secs(30), "still loaded after 30 s idle: {:?}", health(&server));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(idle.elapsed() >= Duration::from_secs(2), "unloaded before --keep-alive");

    // Requests that name no model, or one not in the store, are refused with the reason.
    let r = request(server.port, "POST", "/v1/completions", Some(&json!({"prompt": "x"}).to_string()), &[]).unwrap();
    assert!(r.status == 400 && r.is_api_error() && r.body.contains("`model` is required"), "{}", r.body);
    let r = request(server.port, "POST", "/v1/chat/completions", Some(&json!({"model": "test-org/absent", "messages": [{"role": "user", "content": "x"}]}).to_string()), &[]).unwrap();
    assert!(r.status == 404 && r.is_api_error() && r.body.contains("not in the store"), "{}", r.body);
    server.terminate();
    let _ = server.child.wait();
    let log = server.stderr();
    assert!(log.contains("model unloaded: test-org/alpha"), "{log}");
    std::fs::remove_dir_all(cache).unwrap();
}

#[test]
fn the_least_recently_used_model_makes_room() {
    let (cache, dirs) = store("lru");
    let server = serve_store(&cache, &["--max-models", "2", "--keep-alive", "never"]);
    let answers: Vec<Value> = dirs.iter().map(|(_, dir)| answer_of(dir)).collect();
    // Different models, different answers: a request served by the wrong model would show.
    assert!(answers[0] != answers[1] && answers[1] != answers[2] && answers[0] != answers[2], "{answers:?}");
    assert_eq!(complete(&server, "test-org/alpha"), answers[0]);
    assert_eq!(complete(&server, "test-org/beta"), answers[1]);
    // alpha used after beta: beta is now the least recently used.
    assert_eq!(complete(&server, "test-org/alpha"), answers[0]);
    assert_eq!(complete(&server, "test-org/gamma"), answers[2]);
    let mut now = loaded(&server);
    now.sort();
    assert_eq!(now, vec!["test-org/alpha".to_string(), "test-org/gamma".to_string()]);

    // Several clients at once, for models loaded and not: each gets its own model's answer.
    let port = server.port;
    let clients: Vec<_> = (0..6)
        .map(|i| {
            let name = dirs[i % 3].0;
            std::thread::spawn(move || complete_port(port, Some(name)))
        })
        .collect();
    for (i, client) in clients.into_iter().enumerate() {
        assert_same_answer(&client.join().unwrap(), &answers[i % 3], &format!("client {i}"));
    }
    assert!(loaded(&server).len() <= 2, "{:?}", health(&server));

    // Deleting an idle loaded model unloads it first.
    let name = loaded(&server)[0].clone();
    let r = request(server.port, "DELETE", &format!("/v1/models/{name}"), None, &[]).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!loaded(&server).contains(&name));
    drop(server);
    std::fs::remove_dir_all(cache).unwrap();
}

/// A streamed completion of many tokens by `model` (its end-of-sequence id barred), read up to
/// its first bytes so it is running; it runs until the stream is closed.
fn start_long_stream(port: u16, model: &str) -> std::net::TcpStream {
    use std::io::{Read, Write};
    let body = json!({"model": model, "prompt": PROMPT, "max_tokens": 100000, "stream": true, "logit_bias": {"300": -100}}).to_string();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = format!("POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len());
    s.write_all((head + &body).as_bytes()).unwrap();
    let mut first = [0u8; 16];
    s.read_exact(&mut first).unwrap();
    assert!(first.starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&first));
    s
}

#[test]
fn names_of_one_model_load_it_once_and_a_model_in_use_is_not_deleted() {
    let (cache, dirs) = store("alias");
    let server = serve_store(&cache, &["--max-models", "3", "--keep-alive", "never"]);
    // `org/name`, `org/name@main` and the commit main names: one snapshot, loaded once (it was
    // loaded once per name).
    let answer = complete(&server, "test-org/alpha");
    assert_eq!(complete(&server, "test-org/alpha@main"), answer);
    assert_eq!(complete(&server, &format!("test-org/alpha@{COMMIT}")), answer);
    assert_eq!(health(&server), vec![("test-org/alpha".to_string(), "ready".to_string())]);
    assert_eq!(server.log_so_far().matches("model ready:").count(), 1, "{}", server.log_so_far());
    assert_eq!(listed_status(&server, "test-org/alpha"), "loaded");

    // A request running under another name of the model: DELETE refuses (it removed the files
    // under it, having unloaded only the idle slot of the first name).
    let stream = start_long_stream(server.port, "test-org/alpha@main");
    for id in ["test-org/alpha", "test-org/alpha@main"] {
        let r = request(server.port, "DELETE", &format!("/v1/models/{id}"), None, &[]).unwrap();
        assert!(r.status == 409 && r.is_api_error(), "{id}: {} {}", r.status, r.body);
        let error = &r.json()["error"];
        assert_eq!(error["code"], "model_in_use");
        assert!(error["message"].as_str().unwrap().contains("answering requests") && error["message"].as_str().unwrap().contains("retry"), "{error}");
    }
    assert!(dirs[0].1.join("model.safetensors").is_file());
    assert_eq!(loaded(&server), vec!["test-org/alpha".to_string()]);

    // Once the request ends (its client went away), the delete goes through.
    drop(stream);
    let asked = Instant::now();
    let deleted = loop {
        let r = request(server.port, "DELETE", "/v1/models/test-org/alpha", None, &[]).unwrap();
        if r.status != 409 {
            break r;
        }
        assert!(asked.elapsed() < Duration::from_secs(30), "still in use 30 s after its client left: {}", r.body);
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(deleted.status == 200 && deleted.json()["deleted"] == true, "{}", deleted.body);
    assert!(!cache.join("models--test-org--alpha").exists());
    assert!(loaded(&server).is_empty());
    let r = request(server.port, "POST", "/v1/completions", Some(&json!({"model": "test-org/alpha@main", "prompt": "x"}).to_string()), &[]).unwrap();
    assert!(r.status == 404 && r.is_api_error(), "{} {}", r.status, r.body);
    drop(server);
    std::fs::remove_dir_all(cache).unwrap();
}

/// A store server that may download (from `endpoint`), with `timeout` as HF_HUB_DOWNLOAD_TIMEOUT.
fn serve_store_online(cache: &Path, endpoint: &str, timeout: &str) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sala"));
    cmd.env("HF_HUB_CACHE", cache)
        .env("HF_ENDPOINT", endpoint)
        .env("HF_HUB_DOWNLOAD_TIMEOUT", timeout)
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("SALA_AVAILABLE_MEMORY");
    Server::start_serving_store(cmd, &["--dtype", "f32"])
}

fn listed_ids(port: u16) -> Vec<String> {
    let r = request(port, "GET", "/v1/models", None, &[]).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_string()).collect()
}

#[test]
fn a_failed_download_is_not_listed_nor_served() {
    use common::hub::{start_hub, Faults, REPO};
    let hub = start_hub(Faults { bad_sha: ["model.safetensors"].into_iter().collect(), ..Default::default() });
    let (cache, _) = store("failed-download");
    let server = serve_store_online(&cache, &format!("http://127.0.0.1:{}", hub.port), "5");
    let r = request(server.port, "POST", "/v1/models/download", Some(&json!({"model": REPO}).to_string()), &[]).unwrap();
    assert_eq!(r.status, 202, "{}", r.body);
    let start = Instant::now();
    let status = loop {
        let d = request(server.port, "GET", "/v1/models/download", None, &[]).unwrap().json()["data"][0].clone();
        if d["status"] != "downloading" {
            break d;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "still downloading: {d}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status["status"] == "failed" && status["error"].as_str().unwrap().contains("sha256"), "{status}");
    // What did pass is on disk for the next pull, but it is no model yet.
    assert!(cache.join("models--test-org--tiny-sala/snapshots").join(common::hub::COMMIT).join("config.json").is_file());
    assert_eq!(listed_ids(server.port), vec!["test-org/alpha", "test-org/beta", "test-org/gamma"]);
    let r = request(server.port, "POST", "/v1/completions", Some(&json!({"model": REPO, "prompt": "x"}).to_string()), &[]).unwrap();
    assert!(r.status == 404 && r.is_api_error() && r.json()["error"]["code"] == "model_not_found", "{} {}", r.status, r.body);
    drop(server);
    std::fs::remove_dir_all(cache).unwrap();
}

#[test]
fn downloads_beyond_the_cap_and_bad_names_are_refused() {
    // 150 downloads against a hub that never answers held 150 threads.
    let silent = common::hub::start_silent_endpoint();
    let (cache, _) = store("download-cap");
    let server = serve_store_online(&cache, &format!("http://127.0.0.1:{silent}"), "3");
    let port = server.port;
    let download = |model: &str| request(port, "POST", "/v1/models/download", Some(&json!({"model": model}).to_string()), &[]).unwrap();
    for i in 0..4 {
        let r = download(&format!("test-org/hangs-{i}"));
        assert!(r.status == 202 && r.json()["status"] == "downloading", "{i}: {} {}", r.status, r.body);
    }
    let r = download("test-org/one-too-many");
    assert!(r.status == 429 && r.is_api_error() && r.json()["error"]["code"] == "too_many_downloads", "{} {}", r.status, r.body);
    assert!(r.body.contains("retry when one has finished"), "{}", r.body);
    // Asking again for one that runs is its status, not another download.
    let r = download("test-org/hangs-0@main");
    assert!(r.status == 200 && r.json()["status"] == "downloading", "{} {}", r.status, r.body);
    // Cancelling one makes room.
    let r = request(port, "DELETE", "/v1/models/test-org/hangs-0", None, &[]).unwrap();
    assert!(r.status == 200 && r.json()["cancelled_download"] == true, "{} {}", r.status, r.body);
    assert_eq!(download("test-org/one-too-many").status, 202);

    // Names that would share a folder, and revisions git would not take, are refused as JSON.
    for (model, revision, says) in [
        ("a--b/c", None, "`--` and `..` are not allowed"),
        ("a/b--c", None, "`--` and `..` are not allowed"),
        ("test-org/x", Some("main\r\nX"), "not a revision"),
        ("test-org/x", Some("%2e%2e"), "not a revision"),
        ("test-org/x", Some("."), "not a revision"),
        ("test-org/x", Some("v1.lock"), "not a revision"),
    ] {
        let mut body = json!({"model": model});
        if let Some(revision) = revision {
            body["revision"] = json!(revision);
        }
        let r = request(port, "POST", "/v1/models/download", Some(&body.to_string()), &[]).unwrap();
        assert!(r.status == 400 && r.is_api_error() && r.body.contains(says), "{model} {revision:?}: {} {}", r.status, r.body);
    }
    let r = request(port, "DELETE", "/v1/models/a--b/c", None, &[]).unwrap();
    assert!(r.status == 400 && r.is_api_error(), "{} {}", r.status, r.body);
    assert!(!cache.join("models--a--b--c").exists() && !cache.join("models--test-org--x").exists());
    drop(server);
    std::fs::remove_dir_all(cache).unwrap();
}

/// A store model may be named without its organisation when one model has that name; two are
/// refused naming both. `--model` given a store snapshot lists it by its store name.
#[test]
fn short_names_pick_one_store_model_and_refuse_an_ambiguous_one() {
    let (cache, dirs) = store("short");
    // A second `alpha`, from another organisation.
    let twin = cache.join("models--other-org--alpha");
    std::fs::create_dir_all(twin.join("refs")).unwrap();
    std::fs::write(twin.join("refs/main"), COMMIT).unwrap();
    let copy = twin.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&copy).unwrap();
    for entry in std::fs::read_dir(&dirs[0].1).unwrap().map(Result::unwrap) {
        std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
    }
    let server = serve_store(&cache, &[]);
    let body = |model: &str| json!({"model": model, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}).to_string();
    let r = request(server.port, "POST", "/v1/completions", Some(&body("beta")), &[]).unwrap();
    assert_eq!((r.status, r.json()["model"].as_str()), (200, Some("beta")), "{}", r.body);
    assert_eq!(loaded(&server), ["test-org/beta"]);
    let r = request(server.port, "POST", "/v1/completions", Some(&body("alpha")), &[]).unwrap();
    let message = r.json()["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(r.status == 400 && message.contains("other-org/alpha") && message.contains("test-org/alpha"), "{}", r.body);
    assert_eq!(request(server.port, "POST", "/v1/completions", Some(&body("other-org/alpha")), &[]).unwrap().status, 200);
    // The tokenizer endpoints name the model too: by a query on /tokenizer_info.
    let r = request(server.port, "GET", "/tokenizer_info", None, &[]).unwrap();
    assert_eq!((r.status, r.json()["error"]["param"].as_str()), (400, Some("model")), "{}", r.body);
    let r = request(server.port, "GET", "/tokenizer_info?model=beta", None, &[]).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["model_max_length"].as_u64().is_some_and(|n| n > 0), "{}", r.body);
    let r = request(server.port, "POST", "/tokenize", Some(&json!({"model": "beta", "prompt": "ab"}).to_string()), &[]).unwrap();
    assert_eq!((r.status, r.json()["count"].as_u64()), (200, Some(2)), "{}", r.body);
    drop(server);

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sala"));
    cmd.env("HF_HUB_CACHE", &cache).env("HF_HUB_OFFLINE", "1");
    let server = Server::start_with(cmd, &dirs[1].1, &["--dtype", "f32"], 200);
    let list = request(server.port, "GET", "/v1/models", None, &[]).unwrap().json();
    assert_eq!(list["data"][0]["id"], "test-org/beta", "{list}");
    for name in ["test-org/beta", "beta"] {
        assert_eq!(request(server.port, "POST", "/v1/completions", Some(&body(name)), &[]).unwrap().status, 200, "{name}");
    }
    drop(server);
    std::fs::remove_dir_all(cache).unwrap();
}
