//! eval/serving/workloads.sh, the workloads eval/device-serving.sh measures `sala serve` and
//! llama-server with, run by guidellm against `sala serve` on the CPU at small sizes (a tiny
//! model, small counts), so the harness stays runnable: every request succeeds, the server's own
//! request log counts what guidellm made, a shared prefix is served from the prefix cache, and
//! eval/serving/summary.py reads the reports. guidellm 0.3.1 comes from PyPI in a venv cached under
//! `$SALA_TEST_ASSETS` (the last release without PyTorch among its requirements).

mod common;

use common::server::Server;
use std::path::{Path, PathBuf};
use std::process::Command;

const GUIDELLM: &[&str] = &["guidellm==0.3.1"];

/// A synthetic model's folder: golden case A's layers at 8 bits, the MiniCPM4 tokenizer.
fn tiny_folder(dir: &Path) -> PathBuf {
    let model = dir.join("tiny");
    common::synthetic_folder(&model, &serde_json::json!({"config": common::tiny_synthetic_config(73_472), "bits": 8}), true);
    model
}

/// The server's request log lines for completions, as (prompt_tokens, cached_tokens, generated_tokens).
fn completions_logged(log: &str) -> Vec<(u64, u64, u64)> {
    let field = |line: &str, key: &str| -> u64 {
        let at = line.find(&format!(" {key}=")).unwrap_or_else(|| panic!("no {key} in {line}")) + key.len() + 2;
        line[at..].split(' ').next().unwrap().parse().unwrap()
    };
    log.lines()
        .filter(|l| l.contains("path=/v1/completions status=200"))
        .map(|l| (field(l, "prompt_tokens"), field(l, "cached_tokens"), field(l, "generated_tokens")))
        .collect()
}

/// Every workload of eval/serving/workloads.sh at small sizes, against the server on `port`.
fn workloads(python: &Path, port: u16, tokenizer: &Path, results: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("eval/serving/workloads.sh");
    let sizes = [
        ("PROMPT", "64"), ("OUTPUT", "8"), ("CONCURRENCY", "1 4"), ("LONG_PROMPT", "256"), ("STREAMS", "4"),
        ("QUESTIONS", "4"), ("PREFIX_OUTPUT", "4"), ("MIXED_STREAMS", "4"), ("MIXED_OUTPUT", "16"),
        ("MIXED_PROMPT", "1024"), ("MIXED_LONG", "2"), ("MIXED_EVERY", "1"),
    ];
    let out = Command::new("bash")
        .arg(script)
        .arg(format!("http://127.0.0.1:{port}"))
        .args(["sala", "tiny"])
        .arg(results)
        .args(["random", "prompt4k", "prefix2100", "mixed"])
        .env("GUIDELLM", format!("{} -m guidellm", python.display()))
        .env("TOKENIZER", tokenizer)
        .env("HF_HUB_OFFLINE", "1")
        .envs(sizes)
        .output()
        .unwrap();
    let logs: String = std::fs::read_dir(results.join("logs")).map(|d| d.flatten().map(|f| std::fs::read_to_string(f.path()).unwrap_or_default()).collect()).unwrap_or_default();
    assert!(out.status.success(), "workloads.sh: {}{}\n{logs}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

#[test]
fn guidellm_runs_every_workload_against_the_server_and_the_summary_reads_them() {
    let python = common::venv_python("guidellm-venv", "SALA_GUIDELLM_PYTHON", "guidellm", GUIDELLM);
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_folder(dir.path());
    let results = dir.path().join("results");
    let server = Server::start(&model, &["--device", "cpu", "--parallel", "4"], 200);
    workloads(&python, server.port, &model, &results);

    let summary = Command::new("python3").arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("eval/serving/summary.py")).arg(&results).arg("--json").arg(dir.path().join("rows.json")).output().unwrap();
    assert!(summary.status.success(), "summary: {}{}", String::from_utf8_lossy(&summary.stdout), String::from_utf8_lossy(&summary.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(dir.path().join("rows.json")).unwrap()).unwrap();
    let table = String::from_utf8_lossy(&summary.stdout).to_string();
    let expected = [
        ("mixed-long", "constant", 2, 16.0),
        ("mixed-streams", "concurrent", 8, 16.0),
        ("prefix2100", "synchronous", 4, 4.0),
        ("prompt4k", "concurrent", 8, 8.0),
        ("random-c1", "concurrent", 8, 8.0),
        ("random-c4", "concurrent", 8, 8.0),
    ];
    assert_eq!(rows.len(), expected.len(), "a row per workload and rate, the warm-up left out: {table}");
    for (row, (workload, strategy, requests, output)) in rows.iter().zip(expected) {
        assert_eq!((row["workload"].as_str(), row["strategy"].as_str()), (Some(workload), Some(strategy)), "{table}");
        assert_eq!((row["ok"].as_u64(), row["errored"].as_u64(), row["incomplete"].as_u64()), (Some(requests), Some(0), Some(0)), "{table}");
        // ignore_eos holds every answer to its length.
        assert_eq!(row["output_tokens"].as_f64(), Some(output), "{table}");
        assert!(row["output_tok_s"].as_f64().unwrap() > 0.0 && row["ttft_p50_ms"].as_f64().unwrap() > 0.0, "{table}");
    }
    assert!(rows[2]["first_over_later"].as_f64().unwrap() > 0.0, "the prefix row compares its first request with the rest: {table}");
    // eval/results keeps the reports xz-compressed: the summary reads them the same.
    let packed = dir.path().join("packed");
    std::fs::create_dir(&packed).unwrap();
    for f in std::fs::read_dir(&results).unwrap().flatten().filter(|f| f.path().extension().is_some_and(|e| e == "json")) {
        let mut xz = f.path().into_os_string();
        xz.push(".xz");
        let to = packed.join(Path::new(&xz).file_name().unwrap());
        let ok = Command::new("python3").args(["-c", "import lzma, sys; open(sys.argv[2], 'wb').write(lzma.compress(open(sys.argv[1], 'rb').read()))"]).arg(f.path()).arg(&to).status().unwrap();
        assert!(ok.success());
    }
    let again = Command::new("python3").arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("eval/serving/summary.py")).arg(&packed).arg("--json").arg(dir.path().join("rows-xz.json")).output().unwrap();
    assert!(again.status.success(), "summary of .json.xz: {}", String::from_utf8_lossy(&again.stderr));
    let rows_xz: Vec<serde_json::Value> = serde_json::from_slice(&std::fs::read(dir.path().join("rows-xz.json")).unwrap()).unwrap();
    assert_eq!(rows_xz, rows);

    // The server answered every request guidellm made (its probes of one token aside), the
    // warm-up's 16 included.
    let started = std::time::Instant::now();
    let mut logged = completions_logged(&server.log_so_far());
    let measured = |logged: &[(u64, u64, u64)]| logged.iter().filter(|(_, _, generated)| *generated > 1).count();
    // A stream's line is written as it ends, which may be just after the client has read it.
    while measured(&logged) < 54 && started.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        logged = completions_logged(&server.log_so_far());
    }
    assert_eq!(measured(&logged), 16 + 8 + 8 + 8 + 4 + 8 + 2, "{logged:?}");
    // The model has recurrent layers, so a state restarts only at a point: every 2048 tokens,
    // and where a prompt parts from a kept one. guidellm opens each question with a token taken
    // from the vocabulary in the tokenizer's hash order (another in every process), which the
    // server's tokenizer may merge with the prefix's last token: such a question shares a little
    // less than the whole prefix and restarts at the point 2048 (CI met one; tests/prefix_cache.rs
    // checks the restarts where prompts part). Every question after the first restarts at 2048
    // at least; the first pays the prefix.
    let prefix: Vec<_> = logged.iter().filter(|(prompt, _, generated)| *generated == 4 && *prompt > 2100).collect();
    assert_eq!(prefix.len(), 4, "{logged:?}");
    assert!(prefix[0].1 < 16, "the first question pays the prefix: {prefix:?}");
    for (_, cached, _) in &prefix[1..] {
        assert!(*cached >= 2048, "a later question restarts at the first's point at least: {prefix:?}");
    }
}
