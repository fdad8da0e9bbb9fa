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
        assert_eq!(client.join().unwrap(), answers[i % 3], "client {i}");
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
