//! `sala serve`'s other APIs against official clients (PyPI, in a venv cached under
//! `$SALA_TEST_ASSETS`), on SmolLM2: `/v1/completions` and chat `logprobs` with `openai`, checked
//! against a reference computed another way (tests/reference/openai_completions.py); Anthropic's
//! `/v1/messages` with `anthropic` (tests/reference/anthropic_client.py), its structured output
//! (tests/reference/anthropic_structured.py); a parallel call cut by `max_tokens` with both
//! (tests/reference/cut_calls.py); one split of the prompt across an Anthropic stream's events
//! (tests/reference/anthropic_stream_usage.py); `/metrics` read with
//! `prometheus_client`'s parser on a fresh server, its counts checked against the requests made
//! (tests/reference/metrics_check.py).

mod common;

use common::server::Server;
use sala::engine::model::Logits;
use std::path::{Path, PathBuf};
use std::process::Command;

const CLIENTS: &[&str] = &["openai==1.109.1", "anthropic==0.99.0", "prometheus_client==0.26.0"];

fn python() -> PathBuf {
    common::venv_python("api-clients-venv", "SALA_API_CLIENTS_PYTHON", "openai, anthropic, prometheus_client", CLIENTS)
}

/// Runs `tests/reference/<script>` against the server; its transcript must end in `passed`.
fn run_script(script: &str, port: u16, extra: &[&str], passed: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference").join(script);
    let out = Command::new(python()).arg(path).arg(format!("http://127.0.0.1:{port}")).arg("test-key").args(extra).output().unwrap();
    let transcript = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{transcript}");
    assert!(out.status.success() && transcript.contains(passed), "{transcript}");
}

/// Log-probability of `token` under `logits` (f64 log-softmax) and the `top` most likely
/// tokens as `[text, logprob]`.
fn scored(tokenizer: &sala::engine::tokenizer::TextTokenizer, logits: &[f32], token: u32, top: usize) -> serde_json::Value {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max + logits.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let text = |id: u32| String::from_utf8_lossy(&tokenizer.token_bytes(id)).to_string();
    let top: Vec<serde_json::Value> = order[..top].iter().map(|&i| serde_json::json!([text(i as u32), logits[i] as f64 - lse])).collect();
    serde_json::json!({"logprob": logits[token as usize] as f64 - lse, "top": top})
}

/// The reference the completions script checks against: the prompt's ids and, for each prompt
/// position after the first, the log-softmax of a forward over just that prefix; and the greedy
/// answer from `sala run --temperature 0` with the logits it drew each token from.
fn reference(gguf: &Path, prompt: &str, max_tokens: usize) -> serde_json::Value {
    // float32 everywhere (the server and `sala run` are given --dtype f32): the same numbers on any device.
    let (model, tokenizer) = sala::models::load_with_tokenizer(gguf, Some(mlx_rs::Dtype::Float32)).unwrap();
    let tokenizer = tokenizer.unwrap();
    let ids = tokenizer.encode(prompt).unwrap();
    let prompt_logprobs: Vec<serde_json::Value> = (1..ids.len())
        .map(|i| {
            let mut cache = model.new_cache();
            let input: Vec<i32> = ids[..i].iter().map(|&t| t as i32).collect();
            let logits = model.forward(&mlx_rs::Array::from_slice(&input, &[1, i as i32]), &mut cache, Logits::Last, None).unwrap();
            scored(&tokenizer, &sala::engine::ops::to_vec_f32(&logits).unwrap(), ids[i], 5)
        })
        .collect();

    let logits_file = std::env::temp_dir().join(format!("sala-serve-apis-logits-{}.safetensors", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_sala"))
        .args(["run", "--model"])
        .arg(gguf)
        .args(["--dtype", "f32", "--raw", "--temperature", "0", "--max-tokens", &max_tokens.to_string(), "--json", "--logits-out"])
        .arg(&logits_file)
        .arg(prompt)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let greedy: Vec<u32> = run["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    assert_eq!(greedy.len(), max_tokens, "the reference answer should run to max_tokens (no end-of-sequence): {run}");
    let logits = common::read_safetensors(&logits_file)["logits"].clone();
    std::fs::remove_file(&logits_file).unwrap();
    let greedy_logprobs: Vec<serde_json::Value> = greedy
        .iter()
        .enumerate()
        .map(|(i, &t)| scored(&tokenizer, &logits.row(i).iter().map(|&x| x as f32).collect::<Vec<_>>(), t, 5))
        .collect();
    let token_texts: serde_json::Map<String, serde_json::Value> =
        ids.iter().chain(&greedy).map(|&id| (id.to_string(), serde_json::json!(String::from_utf8_lossy(&tokenizer.token_bytes(id))))).collect();
    serde_json::json!({
        "prompt": prompt, "prompt_ids": ids, "prompt_logprobs": prompt_logprobs,
        "greedy_ids": greedy, "greedy_text": run["text"], "greedy_logprobs": greedy_logprobs, "token_texts": token_texts,
    })
}

#[test]
fn completions_and_logprobs_with_the_openai_client() {
    let gguf = common::smollm2_gguf();
    python();
    let reference = reference(&gguf, "The capital of France is", 8);
    let file = std::env::temp_dir().join(format!("sala-serve-apis-reference-{}.json", std::process::id()));
    std::fs::write(&file, reference.to_string()).unwrap();
    let server = Server::start(&gguf, &["--api-key", "test-key", "--dtype", "f32"], 200);
    run_script("openai_completions.py", server.port, &[file.to_str().unwrap()], "completions and logprobs checks passed");
    std::fs::remove_file(file).unwrap();
}

#[test]
fn messages_with_the_anthropic_client() {
    python();
    let server = Server::start(&common::smollm2_gguf(), &["--api-key", "test-key"], 200);
    run_script("anthropic_client.py", server.port, &[], "anthropic client checks passed");
}

#[test]
fn anthropic_stream_usage_is_one_split_of_the_prompt() {
    python();
    let server = Server::start(&common::smollm2_gguf(), &["--api-key", "test-key"], 200);
    run_script("anthropic_stream_usage.py", server.port, &[], "anthropic stream usage checks passed");
}

#[test]
fn structured_output_with_the_anthropic_client() {
    python();
    let server = Server::start(&common::smollm2_gguf(), &["--api-key", "test-key"], 200);
    run_script("anthropic_structured.py", server.port, &[], "anthropic structured output checks passed");
}

#[test]
fn a_call_cut_by_max_tokens_with_both_clients() {
    python();
    let server = Server::start(&common::smollm2_gguf(), &["--api-key", "test-key"], 200);
    run_script("cut_calls.py", server.port, &[], "cut call checks passed");
}

#[test]
fn metrics_count_the_requests_made() {
    python();
    let server = Server::start(&common::smollm2_gguf(), &["--api-key", "test-key"], 200);
    run_script("metrics_check.py", server.port, &[], "metrics checks passed");
}
