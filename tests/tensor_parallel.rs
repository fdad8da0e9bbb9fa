//! Tensor parallelism on this machine's CPU: `sala run --tp N` starts N ranks that talk over MLX's
//! ring backend on 127.0.0.1, and what they compute together must be what one process computes
//! alone — the golden SALA cases (dense, chunk boundary, sparse, two-turn) within their float32
//! tolerance, a quantized model, and SmolLM2 from its GGUF file; over more ranks than KV heads
//! (held whole, one per rank), the sparse golden cases and a small decoder. Setups that cannot be
//! split are refused before anything runs.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// SALA_TEST_DEVICE=gpu runs the cases on GPUs (one per rank, NCCL), with `sala` from SALA_BIN
/// where the build folder is not there (a device machine).
fn on_gpu() -> bool {
    std::env::var("SALA_TEST_DEVICE").is_ok_and(|d| d == "gpu")
}

fn sala_bin() -> PathBuf {
    std::env::var_os("SALA_BIN").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_sala")), PathBuf::from)
}

/// The float32 tolerance of the golden cases (tests/golden.rs): the CPU's, or a GPU's with TF32
/// off (other kernels, other summation order).
fn golden_tol() -> f64 {
    if on_gpu() {
        assert_eq!(std::env::var("MLX_ENABLE_TF32").as_deref(), Ok("0"), "the GPU tolerance holds with TF32 off");
        1e-3
    } else {
        1e-4
    }
}

/// `sala run` of `model` on the CPU in float32, greedy, over `--tp tp` ranks: the generated ids
/// and every logits row.
struct Generated {
    ids: Vec<u32>,
    logits: Tensor,
}

fn run_ids(model: &Path, prompt: &[u32], max_tokens: usize, tp: usize, extra: &[&str]) -> Generated {
    let out_dir = std::env::temp_dir().join(format!("sala-tp-{}-{}", std::process::id(), unique()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let out_file = out_dir.join("logits.safetensors");
    let output = sala_run(model, prompt, max_tokens, tp, extra, Some(&out_file));
    assert!(output.status.success(), "--tp {tp} {}: {}", model.display(), String::from_utf8_lossy(&output.stderr));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("--tp {tp}: stdout is not one JSON answer ({e}): {}", String::from_utf8_lossy(&output.stdout)));
    let ids = json["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let logits = read_safetensors(&out_file).remove("logits").unwrap();
    let _ = std::fs::remove_dir_all(&out_dir);
    Generated { ids, logits }
}

fn sala_run(model: &Path, prompt: &[u32], max_tokens: usize, tp: usize, extra: &[&str], logits_out: Option<&Path>) -> Output {
    let ids = prompt.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    let mut cmd = Command::new(sala_bin());
    cmd.args(["run", "--model"]).arg(model);
    let device = if on_gpu() { "gpu" } else { "cpu" };
    cmd.args(["--input-ids", &ids, "--temperature", "0", "--ignore-eos", "--json", "--dtype", "f32", "--device", device]);
    cmd.args(["--max-tokens", &max_tokens.to_string(), "--tp", &tp.to_string()]).args(extra);
    if let Some(file) = logits_out {
        cmd.arg("--logits-out").arg(file);
    }
    cmd.output().unwrap()
}

fn unique() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Largest |Δ| between the same rows of two logits tensors.
fn rows_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape, b.shape);
    (0..a.shape[0]).map(|i| max_abs_diff(a.row(i), b.row(i))).fold(0.0, f64::max)
}

/// Each golden `case` over `ranks` ranks: the reference's greedy ids and logits, and one rank's.
fn golden_over(ranks: usize, cases: &[&str]) {
    for &case in cases {
        let toks = tokens(case);
        let exp = read_safetensors(&golden(case).join("expected.safetensors"));
        let (prompt, decode) = (ids(&toks, "prompt_ids"), ids(&toks, "decode_input_ids"));
        let one = run_ids(&golden(case), &prompt, decode.len() + 1, 1, &[]);
        let split = run_ids(&golden(case), &prompt, decode.len() + 1, ranks, &[]);
        assert_eq!(&split.ids[..decode.len()], &decode[..], "{case}: greedy ids over {ranks} ranks");
        assert_eq!(split.ids, one.ids, "{case}: {ranks} ranks generate what one does");
        // Row 0 is the prefill's last position (the sparse regime in C), the rest decode steps.
        let prefill = max_abs_diff(split.logits.row(0), &exp["f32.prefill.last_logits"].data);
        assert!(prefill <= golden_tol(), "{case}: prefill logits over {ranks} ranks differ from the reference by {prefill}");
        for i in 0..decode.len() {
            let diff = max_abs_diff(split.logits.row(i + 1), exp["f32.decode.logits"].row(i));
            assert!(diff <= golden_tol(), "{case}: decode step {i} over {ranks} ranks differs from the reference by {diff}");
        }
        let vs_one = rows_diff(&split.logits, &one.logits);
        assert!(vs_one <= golden_tol(), "{case}: {ranks} ranks differ from one by {vs_one}");
        eprintln!("{case}: {ranks} ranks vs one: max |Δlogit| {vs_one:.2e}");
    }
}

#[test]
fn golden_cases_over_two_ranks_match_the_reference_and_one_rank() {
    golden_over(2, &["A_dense_f32", "B_chunk_boundary", "C_sparse_prefill", "D_two_turn"]);
}

/// An 8-bit copy of golden A: its packed matrices are split as stored, by rows and by columns.
fn quantized_golden(bits: u32, group_size: u32) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sala-tp-q{bits}g{group_size}-{}", std::process::id()));
    if !dir.join("config.json").is_file() {
        let output = Command::new(sala_bin())
            .args(["quantize", "--bits", &bits.to_string(), "--group-size", &group_size.to_string(), "--model"])
            .arg(golden("A_dense_f32"))
            .arg("--output")
            .arg(&dir)
            .output()
            .unwrap();
        assert!(output.status.success(), "quantize: {}", String::from_utf8_lossy(&output.stderr));
    }
    dir
}

#[test]
fn a_quantized_model_over_two_ranks_matches_one_rank() {
    let model = quantized_golden(8, 64);
    let prompt = ids(&tokens("A_dense_f32"), "prompt_ids");
    let one = run_ids(&model, &prompt, 8, 1, &[]);
    let two = run_ids(&model, &prompt, 8, 2, &[]);
    assert_eq!(two.ids, one.ids);
    let diff = rows_diff(&two.logits, &one.logits);
    assert!(diff <= golden_tol(), "8-bit golden A: two ranks differ from one by {diff}");
    let _ = std::fs::remove_dir_all(&model);
}

#[test]
fn smollm2_over_three_ranks_matches_one_rank() {
    let model = smollm2_gguf();
    let expected = smollm2_expected();
    for case in expected["cases"].as_array().unwrap().iter().take(2) {
        let ids: Vec<u32> = case["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let one = run_ids(&model, &ids, 24, 1, &[]);
        let three = run_ids(&model, &ids, 24, 3, &[]);
        assert_eq!(three.ids, one.ids, "SmolLM2: three ranks generate what one does");
        let diff = rows_diff(&three.logits, &one.logits);
        assert!(diff <= 1e-3, "SmolLM2 (Q4_1): three ranks differ from one by {diff}");
        eprintln!("SmolLM2: three ranks vs one: max |Δlogit| {diff:.2e}");
    }
}

/// Four ranks over SALA's two KV heads: each rank holds one KV head whole and 8 of its 16 query
/// heads, and the two ranks of a group sum their block-selection scores (the group shares one
/// selection). The sparse case C (selection in the prefill and in every decode step) and the
/// dense case A, against the reference and one rank.
#[test]
fn golden_cases_over_more_ranks_than_kv_heads_match_the_reference_and_one_rank() {
    golden_over(4, &["C_sparse_prefill", "A_dense_f32"]);
}

/// A Qwen3-shaped decoder (8 query heads over 2 KV heads, QK-norm) of random weights over four
/// ranks: each rank's 2 query heads read its one KV head, held whole on two ranks.
#[test]
fn a_decoder_over_more_ranks_than_kv_heads_matches_one_rank() {
    let dir = std::env::temp_dir().join(format!("sala-tp-kv-replicas-{}", std::process::id()));
    let config = serde_json::json!({
        "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 73_472,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 512,
        "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2
    });
    synthetic_folder(&dir, &serde_json::json!({ "config": config }), true);
    let prompt: Vec<u32> = (3..60).collect();
    let one = run_ids(&dir, &prompt, 8, 1, &[]);
    let four = run_ids(&dir, &prompt, 8, 4, &[]);
    assert_eq!(four.ids, one.ids, "four ranks generate what one does");
    let diff = rows_diff(&four.logits, &one.logits);
    assert!(diff <= golden_tol(), "four ranks differ from one by {diff}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn heads_that_do_not_divide_are_refused_before_loading() {
    // SmolLM2 has 9 query heads: two ranks cannot share them.
    let output = sala_run(&smollm2_gguf(), &[1, 2, 3], 1, 2, &[], None);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("splits the attention heads (num_attention_heads) between them, and 9 is not divisible by 2"), "{stderr}");
    // SALA's sparse layers have 2 KV heads: three ranks can neither split them nor hold one each.
    let output = sala_run(&golden("A_dense_f32"), &[1, 2, 3], 1, 3, &[], None);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("and 2 heads over 3 ranks allow neither: choose a --tp that divides 2 or is a multiple of it"),
        "{stderr}"
    );
    // Golden A's o_proj has 128 input columns: two ranks get 64 each, half of a 128-wide
    // quantization group, which cannot be split as stored (layer 0's is the first loaded).
    let model = quantized_golden(8, 128);
    let output = sala_run(&model, &[1, 2, 3], 1, 2, &[], None);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("gives each rank 64 of `model.layers.0.self_attn.o_proj`'s input columns, not a multiple of its quantization group size 128"), "{stderr}");
    let _ = std::fs::remove_dir_all(&model);
}

#[test]
fn ranks_that_loaded_different_models_are_refused() {
    // Started by hand, as a launcher on several machines starts them: rank 1 names another
    // checkpoint of the same shapes.
    let ports: Vec<u16> = (0..2).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()).collect();
    let hostfile = std::env::temp_dir().join(format!("sala-tp-hosts-{}.json", std::process::id()));
    let hosts: Vec<Vec<String>> = ports.iter().map(|p| vec![format!("127.0.0.1:{p}")]).collect();
    std::fs::write(&hostfile, serde_json::to_string(&hosts).unwrap()).unwrap();
    let prompt = ids(&tokens("A_dense_f32"), "prompt_ids");
    let ranks: Vec<_> = ["A_dense_f32", "B_chunk_boundary"]
        .iter()
        .enumerate()
        .map(|(rank, case)| {
            let ids = prompt.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            let child = Command::new(sala_bin())
                .args(["run", "--model"])
                .arg(golden(case))
                .args(["--input-ids", &ids, "--temperature", "0", "--json", "--device", "cpu", "--max-tokens", "2", "--tp", "2"])
                .env("MLX_RANK", rank.to_string())
                .env("MLX_HOSTFILE", &hostfile)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            std::thread::spawn(move || child.wait_with_output().unwrap())
        })
        .collect();
    for (rank, out) in ranks.into_iter().map(|r| r.join().unwrap()).enumerate() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "rank {rank} ran a model its peer does not have: {stderr}");
        assert!(stderr.contains("ranks disagree on the model they loaded"), "rank {rank}: {stderr}");
    }
    std::fs::remove_file(hostfile).unwrap();
}

/// What a chat answer says: its text, each token's log-probability, and its prompt tokens taken
/// from the prefix cache.
fn answer(server: &common::server::Server, body: &serde_json::Value) -> (String, Vec<f64>, u64) {
    let response = common::server::request(server.port, "POST", "/v1/chat/completions", Some(&body.to_string()), &[]).expect("an answer");
    let json = response.json();
    let choice = &json["choices"][0];
    assert!(choice["message"]["content"].is_string(), "{json}");
    let logprobs = choice["logprobs"]["content"].as_array().map_or_else(Vec::new, |c| c.iter().map(|t| t["logprob"].as_f64().unwrap()).collect());
    let cached = json["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
    (choice["message"]["content"].as_str().unwrap().to_string(), logprobs, cached)
}

#[test]
fn serving_over_two_ranks_answers_as_one_rank() {
    use serde_json::json;
    let model = golden_with_tokenizer("A_dense_f32", "tp-serve", None);
    let device = if on_gpu() { "gpu" } else { "cpu" };
    let args = ["--device", device, "--dtype", "f32", "--log-level", "debug", "--log-format", "json", "--prefill-step", "8192"];
    let start = |tp: &str| {
        let mut cmd = Command::new(sala_bin());
        cmd.env_remove("MLX_RANK");
        let mut extra = args.to_vec();
        extra.extend(["--tp", tp]);
        common::server::Server::start_with(cmd, &model, &extra, 200)
    };
    let (one, two) = (start("1"), start("2"));
    let greedy = json!({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 12, "temperature": 0, "logprobs": true});
    // Sampled under a grammar: every rank compiles rank 0's grammar and draws with its seed.
    let schema = json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let structured = json!({"messages": [{"role": "user", "content": "a number"}], "max_tokens": 24, "temperature": 0.9, "seed": 7,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}});
    // The same document twice: the second prefills only what is new.
    let document = "the quick brown fox jumps over the lazy dog ".repeat(6);
    let first = json!({"messages": [{"role": "user", "content": format!("{document} first?")}], "max_tokens": 4, "temperature": 0});
    let second = json!({"messages": [{"role": "user", "content": format!("{document} second?")}], "max_tokens": 4, "temperature": 0});
    for body in [&greedy, &structured, &first, &second] {
        let (a, b) = (answer(&one, body), answer(&two, body));
        assert_eq!(b.0, a.0, "two ranks answer {body} as one does");
        assert_eq!(b.2, a.2, "two ranks take as much from the prefix cache as one");
        assert_eq!(b.1.len(), a.1.len());
        let diff = b.1.iter().zip(&a.1).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(diff <= golden_tol(), "log-probabilities over two ranks differ by {diff}");
    }
    assert!(answer(&two, &second).2 > 0, "the prefix cache served the document again");
    let parsed: serde_json::Value = serde_json::from_str(&answer(&two, &structured).0).expect("the structured answer parses");
    assert!(parsed["n"].is_i64(), "{parsed}");
    // Requests at once are batched; one without a seed gets rank 0's, so the ranks stay in step.
    let unseeded = json!({"messages": [{"role": "user", "content": "anything"}], "max_tokens": 16, "temperature": 1.0});
    let answers: Vec<_> = [&greedy, &unseeded, &structured, &greedy]
        .into_iter()
        .map(|body| {
            let (port, body) = (two.port, body.to_string());
            std::thread::spawn(move || common::server::request(port, "POST", "/v1/chat/completions", Some(&body), &[]).expect("an answer"))
        })
        .collect();
    let answers: Vec<_> = answers.into_iter().map(|t| t.join().unwrap()).collect();
    for response in &answers {
        assert!(response.json()["choices"][0]["message"]["content"].is_string(), "{}", response.json());
    }
    // And the ranks are still in step afterwards.
    assert_eq!(answer(&two, &greedy).0, answer(&one, &greedy).0);
    // A long prompt going in beside a stream: its chunks are paced by rank 0's clock, which the
    // other ranks follow. (On the CPU both ranks' paces give the smallest chunk here, so this
    // checks the answers, not that a follower's own clock would have differed.)
    let stream = {
        let body = json!({"prompt": "count on", "max_tokens": 200, "ignore_eos": true, "temperature": 0}).to_string();
        let port = two.port;
        std::thread::spawn(move || common::server::request(port, "POST", "/v1/completions", Some(&body), &[]).expect("the stream's answer"))
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let items: Vec<String> = (0..120).map(|i| format!("item {i} is {}", i * 7 % 13)).collect();
    let long = json!({"messages": [{"role": "user", "content": format!("{} which?", items.join(", "))}], "max_tokens": 6, "temperature": 0, "logprobs": true});
    let (beside, alone) = (answer(&two, &long), answer(&one, &long));
    let stream = stream.join().unwrap().json();
    assert_eq!(stream["usage"]["completion_tokens"], 200, "{stream}");
    assert_eq!(beside.0, alone.0, "a long prompt beside a stream over two ranks answers as one rank alone");
    let diff = beside.1.iter().zip(&alone.1).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    assert!(diff <= golden_tol(), "log-probabilities differ by {diff}");
    // It went in paced, in rounds that also decoded the stream.
    let log = two.log_so_far();
    let rounds: Vec<serde_json::Value> =
        log.lines().filter(|l| l.starts_with('{')).filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).filter(|v| v["message"] == "round").collect();
    let paced = |r: &&serde_json::Value| r["decoded"].as_u64() > Some(0) && r["prompt_tokens"].as_u64() > Some(0) && r["budget"].as_u64() < Some(8192);
    assert!(rounds.iter().any(|r| paced(&r)), "no paced chunk beside the stream: {log}");
    // SIGTERM drains rank 0; the others end when it says so, and the whole group exits cleanly.
    let mut two = two;
    two.terminate();
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = two.child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "the group did not stop: {}", two.log_so_far());
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(status.success(), "{status}: {}", two.log_so_far());
}

/// `sala run` of a prompt piped to rank 0's stdin, sampled: the other ranks get the prompt and the
/// seed from rank 0, so two ranks write what one does with the same seed, and stay in step without one.
#[test]
fn a_piped_prompt_and_sampling_over_two_ranks() {
    use std::io::Write;
    let model = golden_with_tokenizer("A_dense_f32", "tp-run", Some(100000));
    let run = |tp: &str, seed: Option<&str>| {
        let mut cmd = Command::new(sala_bin());
        cmd.args(["run", "--model"]).arg(&model);
        cmd.args(["--device", if on_gpu() { "gpu" } else { "cpu" }, "--dtype", "f32", "--max-tokens", "24", "--temperature", "0.9", "--json", "--tp", tp]);
        if let Some(seed) = seed {
            cmd.args(["--seed", seed]);
        }
        let mut child = cmd.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(b"tell me a story about a fox").unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "--tp {tp}: {}", String::from_utf8_lossy(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        json["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect::<Vec<_>>()
    };
    let one = run("1", Some("3"));
    assert_eq!(one.len(), 24);
    assert_eq!(run("2", Some("3")), one, "two ranks sample what one does with the same seed");
    assert_eq!(run("2", None).len(), 24, "without a seed the ranks share rank 0's");
}

/// On CUDA GPUs a group's sums up to a slot go through each other's memory (kernels::all_reduce,
/// issue 61): `doctor --tp 2` over NCCL says so beside NCCL's own times, its sums and chains check out,
/// and no rank fell back to NCCL. The golden cases above then run through it too. On the CPU
/// there is no such path.
#[test]
fn sums_go_through_peer_memory_on_gpus() {
    if !on_gpu() {
        eprintln!("skipped: peer memory needs CUDA GPUs (SALA_TEST_DEVICE=gpu, two of them)");
        return;
    }
    let out = Command::new(sala_bin()).args(["doctor", "--tp", "2"]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("2 ranks over nccl: all_sum of rank+1 = 3, all_gather = [0, 1]"), "{stdout}");
    assert!(stdout.contains("; sums through peer memory where it takes them (through nccl alone: 88 × 8 KiB bf16 all_sum "), "{stdout}");
    assert!(!stderr.contains("stay on NCCL"), "a rank fell back: {stderr}");
}
