//! `sala bench` end to end on a golden SALA model and SmolLM2, on the smallest grid: the rows of
//! the test matrix, every output format, appending to a results file, the side-by-side table, and
//! the refusals. Formats and counts are checked, not speeds.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sala")).arg("bench").args(args).output().unwrap()
}

fn ok(out: &std::process::Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn temp(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("sala-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn results_in_every_format_and_appended() {
    let sala = common::golden("A_dense_f32");
    let smol = common::smollm2_gguf();
    let csv = temp("results.csv");
    let grid = ["-p", "16", "-n", "4", "-d", "0,24", "-r", "2"];
    for _ in 0..2 {
        let mut args = vec!["-m", path(&sala), "-m", path(&smol), "-o", "csv", "--output-file", path(&csv)];
        args.extend(grid);
        // Cells are padded to line up: compare with single spaces.
        let table = ok(&bench(&args)).split(' ').filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" ");
        // The printed table: 6 tests × 2 models (served decoding beside pipelined, as a share
        // of it), then the comparison with a ratio column.
        assert!(table.contains("| A_dense_f32 |") && table.contains("| pp16 @ d24 |") && table.contains("| tg4 |"), "{table}");
        assert!(table.contains("| tg4 served @ d24 |") && table.contains("| of pipelined |") && table.contains("×"), "{table}");
        assert!(table.contains("SmolLM2-135M-Instruct.Q4_1.gguf / A_dense_f32"), "{table}");
    }
    let mut reader = csv::Reader::from_path(&csv).unwrap();
    let headers = reader.headers().unwrap().clone();
    let column = |name: &str| headers.iter().position(|h| h == name).unwrap_or_else(|| panic!("no column {name}"));
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 24, "two runs of 12 rows, one header");
    // Each run: per model (in -m order) the pp tests, then the tg tests pipelined and served
    // (grammar false), each at every depth.
    let tests: Vec<(String, String, String, String, String)> = rows[..12]
        .iter()
        .map(|r| {
            let field = |name| r[column(name)].to_string();
            (field("model_filename"), field("n_prompt"), field("n_gen"), field("n_depth"), field("grammar"))
        })
        .collect();
    let want: Vec<(String, String, String, String, String)> = ["A_dense_f32", "SmolLM2-135M-Instruct.Q4_1.gguf"]
        .iter()
        .flat_map(|m| {
            [("16", "0", "0", ""), ("16", "0", "24", ""), ("0", "4", "0", ""), ("0", "4", "24", ""), ("0", "4", "0", "false"), ("0", "4", "24", "false")]
                .map(|(p, n, d, g)| (m.to_string(), p.into(), n.into(), d.into(), g.into()))
        })
        .collect();
    assert_eq!(tests, want);
    for r in &rows {
        let samples: Vec<f64> = r[column("samples_ts")].split(' ').map(|s| s.parse().unwrap()).collect();
        let avg: f64 = r[column("avg_ts")].parse().unwrap();
        assert_eq!(samples.len(), 2, "-r 2 gives two samples");
        assert!((avg - samples.iter().sum::<f64>() / 2.0).abs() < 1e-6 * avg && avg > 0.0);
        assert!(r[column("peak_mem")].parse::<u64>().unwrap() > 0);
        assert_eq!(&r[column("backend")], "cpu");
    }
    assert_eq!(&rows[0][column("model_type")], "minicpm_sala");
    assert_eq!(&rows[6][column("model_type")], "llama");
    assert_eq!(rows[6][column("n_params")].parse::<u64>().unwrap(), 134_515_008);

    // JSON lines on stdout; a JSON results file stays one array as it grows.
    let lines = ok(&bench(&["-m", path(&sala), "-p", "8", "-n", "0", "-r", "1", "-o", "jsonl"]));
    let v: serde_json::Value = serde_json::from_str(lines.trim()).unwrap();
    assert_eq!((v["n_prompt"].as_u64(), v["n_gen"].as_u64(), v["samples_ns"].as_array().map(Vec::len)), (Some(8), Some(0), Some(1)));
    let json = temp("results.json");
    for _ in 0..2 {
        ok(&bench(&["-m", path(&sala), "-p", "8", "-n", "2", "-r", "1", "-o", "json", "--output-file", path(&json)]));
    }
    let all: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(all.len(), 6, "pp8, tg2 and tg2 served, twice");

    // Refusals: nothing to measure, a depth past the context, a results file of another shape.
    let out = bench(&["-m", path(&sala), "-p", "0", "-n", "0"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("nothing to measure"));
    let out = bench(&["-m", path(&smol), "-p", "8", "-n", "0", "-d", "100000"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("100008") && stderr.contains("8192"), "{stderr}");
    std::fs::write(&csv, "a,b\n1,2\n").unwrap();
    let out = bench(&["-m", path(&sala), "-p", "8", "-n", "0", "-r", "1", "-o", "csv", "--output-file", path(&csv)]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("other columns"));
    std::fs::write(&json, "{}").unwrap();
    let out = bench(&["-m", path(&sala), "-p", "8", "-n", "0", "-r", "1", "-o", "json", "--output-file", path(&json)]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("not a JSON array"), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&json).unwrap(), "{}", "a file it cannot extend is left as it was");
    for f in [csv, json] {
        let _ = std::fs::remove_file(f);
    }
}

#[test]
fn synthetic_presets_have_the_released_shapes() {
    use sala::store::synthetic::SyntheticModel;
    // Parameter counts of the released checkpoints (spec §1.4; Qwen3-8B's model card: 8.19 B).
    assert_eq!(SyntheticModel::new("minicpm-sala-9b", None).unwrap().n_params(), 9_477_203_968);
    assert_eq!(SyntheticModel::new("qwen3-8b", None).unwrap().n_params(), 8_190_735_360);
    // bf16: 2 bytes a parameter. Quantized: the packed weights (1 or ½ byte each) plus a bf16
    // scale and bias per group of 64; the embeddings (73448 × 4096) and norms stay bf16.
    let bytes = |bits| SyntheticModel::new("minicpm-sala-9b", bits).unwrap().weights_bytes(mlx_rs::Dtype::Bfloat16);
    let params = 9_477_203_968u64;
    assert_eq!(bytes(None), 2 * params);
    let quantized = 2 * (bytes(Some(8)) - bytes(Some(4)));
    let float = params - quantized;
    let embeddings = 73448 * 4096;
    assert!(float > embeddings && float < embeddings + 1_000_000, "{float} float parameters");
    assert_eq!(bytes(Some(8)), quantized + quantized / 16 + 2 * float);
    let err = SyntheticModel::new("llama-70b", None).err().unwrap().to_string();
    assert!(err.contains("minicpm-sala-9b, qwen3-8b"), "{err}");
}

#[test]
fn synthetic_model_matches_the_real_ones_shapes() {
    // The golden checkpoint and a synthetic model of its config.json, side by side: same
    // architecture and parameter count; the 8-bit one is smaller.
    let golden = common::golden("C_sparse_prefill");
    let config = golden.join("config.json");
    let out = ok(&bench(&["-m", path(&golden), "--synthetic", path(&config), "--bits", "8", "-p", "16", "-n", "2", "-r", "1", "-o", "json"]));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(rows.len(), 6, "{out}");
    let (real, synthetic) = (&rows[0], &rows[3]);
    assert_eq!(synthetic["model_filename"], "C_sparse_prefill-q8 (synthetic)");
    assert_eq!(synthetic["model_type"], real["model_type"]);
    assert_eq!(synthetic["n_params"], real["n_params"]);
    let size = |r: &serde_json::Value| r["model_size"].as_u64().unwrap();
    assert!(size(synthetic) < size(real) / 2, "8-bit {} vs f32 {}", size(synthetic), size(real));
    assert!(synthetic["avg_ts"].as_f64().unwrap() > 0.0);
    // A preset that does not fit is refused before anything is built, with the fix named.
    let out = Command::new(env!("CARGO_BIN_EXE_sala"))
        .args(["bench", "--synthetic", "minicpm-sala-9b", "-p", "16", "-n", "0"])
        .env("SALA_AVAILABLE_MEMORY", "8000000000")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--bits 8 or 4") && err.contains("8.00 GB is available"), "{err}");
}

/// Reads a JSONL file into objects.
fn jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn quality_suite_on_smollm2() {
    let smol = common::smollm2_gguf();
    let (csv, samples) = (temp("quality.csv"), temp("quality-samples.jsonl"));
    let args = ["--suite", "quality", "-m", path(&smol), "--limit", "1", "--max-tokens", "48", "-o", "csv"];
    let mut args = args.to_vec();
    args.extend(["--output-file", path(&csv), "--samples", path(&samples)]);
    let out = bench(&args);
    let table = ok(&out);
    assert!(table.contains("| category | questions | answered | correct | think loops | accuracy |"), "{table}");
    // One question per category, every answer recorded with its verdict.
    let samples = jsonl(&samples);
    // Each verdict is reported on stderr as it comes, the same as recorded.
    let err = String::from_utf8_lossy(&out.stderr);
    for s in &samples {
        let line = format!("SmolLM2-135M-Instruct.Q4_1.gguf {}: {}", s["id"].as_str().unwrap(), if s["correct"] == true { "correct" } else { "" });
        assert!(err.contains(&line), "no `{line}` in {err}");
    }
    let ids: Vec<&str> = samples.iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["arithmetic-01", "algebra-01", "word-problems-01", "logic-01", "sequences-01"]);
    for s in &samples {
        assert_eq!(s["model_filename"], "SmolLM2-135M-Instruct.Q4_1.gguf");
        let ending = s["ending"].as_str().unwrap();
        assert!(["finished", "cap", "loop"].contains(&ending), "{s}");
        assert!(s["gen_tokens"].as_u64().unwrap() <= 48);
        if ending == "cap" {
            assert_eq!(s["gen_tokens"], 48, "{s}");
        }
        // A verdict follows from the extracted answer (SmolLM2 does not think: no reasoning).
        assert_eq!(s["reasoning"], "");
        if s["correct"] == true {
            assert_eq!(ending, "finished");
            assert!(s["extracted"].as_str().unwrap().to_lowercase().contains(s["expected"].as_str().unwrap()), "{s}");
        }
    }
    // The summary: a row per category and the total, consistent with the samples.
    let mut reader = csv::Reader::from_path(&csv).unwrap();
    assert_eq!(
        reader.headers().unwrap().iter().collect::<Vec<_>>(),
        ["model_filename", "category", "questions", "answered", "correct", "think_loops", "accuracy", "avg_gen_tokens"]
    );
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 6);
    let total = &rows[5];
    assert_eq!((&total[1], &total[2]), ("total", "5"));
    let correct = samples.iter().filter(|s| s["correct"] == true).count();
    let answered = samples.iter().filter(|s| s["ending"] == "finished" && s["answer"] != "").count();
    assert_eq!((total[3].parse::<usize>().unwrap(), total[4].parse::<usize>().unwrap()), (answered, correct));
    assert_eq!(total[6].parse::<f64>().unwrap(), correct as f64 / 5.0);
    std::fs::remove_file(csv).unwrap();
}

#[test]
fn quality_suite_counts_think_loops() {
    // Golden SALA (random weights) whose template opens a think block and whose end-of-sequence
    // id is outside the vocabulary: every answer rambles inside <think> until the cap or a loop.
    let dir = common::golden_with_tokenizer("A_dense_f32", "quality", Some(100000));
    let template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n<think>\n";
    std::fs::write(dir.join("tokenizer_config.json"), serde_json::json!({ "chat_template": template }).to_string()).unwrap();
    let samples = temp("loops.jsonl");
    let out = ok(&bench(&["--suite", "quality", "-m", path(&dir), "--limit", "1", "--max-tokens", "40", "-o", "jsonl", "--samples", path(&samples)]));
    let rows: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let total = rows.last().unwrap();
    assert_eq!((total["category"].as_str(), total["questions"].as_u64(), total["answered"].as_u64()), (Some("total"), Some(5), Some(0)));
    assert_eq!((total["correct"].as_u64(), total["think_loops"].as_u64()), (Some(0), Some(5)));
    for s in jsonl(&samples) {
        assert!(s["ending"] == "cap" || s["ending"] == "loop", "{s}");
        assert_eq!(s["answer"], "", "all of it is reasoning");
        assert!(!s["reasoning"].as_str().unwrap().is_empty());
    }
    // Synthetic models have random weights: no quality suite for them.
    let out = bench(&["--suite", "quality", "--synthetic", "qwen3-8b"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("random"));
    std::fs::remove_dir_all(dir).unwrap();
}

/// The grammar suite: decoding as the server does it, free and under the JSON grammar, one and
/// two sequences, with the time relative to the free decoding in the table.
#[test]
fn grammar_suite_times_decoding_with_and_without_masks() {
    let smol = common::smollm2_gguf();
    let out = ok(&bench(&["--suite", "grammar", "-m", path(&smol), "-n", "6", "--n-seq", "1,2", "-r", "1", "-o", "jsonl"]));
    let rows: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let got: Vec<(u64, u64, bool)> = rows.iter().map(|r| (r["n_gen"].as_u64().unwrap(), r["n_seq"].as_u64().unwrap(), r["grammar"].as_bool().unwrap())).collect();
    assert_eq!(got, [(6, 1, false), (6, 1, true), (6, 2, false), (6, 2, true)], "{out}");
    // Without --profile the host's times are not measured.
    assert!(rows.iter().all(|r| r["build_ms"].is_null() && r["ops"].is_null()), "{out}");
    let table = ok(&bench(&["--suite", "grammar", "-m", path(&smol), "-n", "4", "-r", "1", "--profile"]));
    assert!(table.contains("time vs free") && table.contains("tg4 served") && table.contains("tg4 grammar"), "{table}");
    assert!(table.contains("| step ms |") && table.contains("| read wait |") && table.contains("| ops |") && table.contains("| gaps |"), "{table}");
    // A synthetic model has no tokenizer to compile the grammar with unless given one.
    let out = bench(&["--suite", "grammar", "--synthetic", "qwen3-8b", "--bits", "4", "-n", "4"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--tokenizer DIR"), "{stderr}");
}

#[test]
fn batched_and_speculative_generation_tests() {
    let sala = common::golden("C_sparse_prefill");
    let out = ok(&bench(&[
        "-m", path(&sala), "-p", "0", "-n", "6", "-d", "0,300", "--n-seq", "1,3", "--draft-layers", "0,3", "--num-draft", "2", "-r", "1", "-o", "jsonl", "--profile",
    ]));
    let rows: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // (depth, sequences, grammar: served rows false, draft layers, draft tokens)
    type Shape = (u64, u64, Option<bool>, Option<u64>, Option<u64>);
    let got: Vec<Shape> = rows
        .iter()
        .map(|r| (r["n_depth"].as_u64().unwrap(), r["n_seq"].as_u64().unwrap(), r["grammar"].as_bool(), r["draft_layers"].as_u64(), r["n_draft"].as_u64()))
        .collect();
    // Per depth: pipelined and served x1, x3, then greedy plain, greedy with a 3-layer draft of
    // 2 tokens.
    let want: Vec<_> = [(1u64, None, None, None), (1, Some(false), None, None), (3, None, None, None), (3, Some(false), None, None), (1, None, Some(0), Some(0)), (1, None, Some(3), Some(2))]
        .iter()
        .flat_map(|&(s, g, l, k)| [0u64, 300].map(move |d| (d, s, g, l, k)))
        .collect();
    assert_eq!(got, want, "{out}");
    for r in &rows {
        let (ns, ts) = (r["samples_ns"][0].as_f64().unwrap(), r["avg_ts"].as_f64().unwrap());
        // t/s counts every sequence's tokens.
        let tokens = 6.0 * r["n_seq"].as_f64().unwrap();
        assert!((ts - tokens * 1e9 / ns).abs() < 1e-6 * ts, "{r}");
        // --profile: where each step's host time went, and its graph's operations.
        let ms = |f: &str| r[f].as_f64().unwrap_or_else(|| panic!("{f} in {r}"));
        assert!(ms("build_ms") > 0.0 && ms("encode_ms") > 0.0 && ms("other_ms") >= 0.0 && ms("blocked_ms") >= 0.0 && ms("ops") > 10.0, "{r}");
        // The CPU has no clock of its own to mark: the device's columns stay empty.
        assert!(r["device_ms"].is_null() && r["device_gaps_ms"].is_null() && r.get("device_ms").is_some(), "{r}");
        assert!(r["device_draw_ms"].is_null() && r.get("device_draw_ms").is_some(), "{r}");
        match r["draft_layers"].as_u64() {
            Some(l) if l > 0 => {
                let a = r["acceptance"].as_f64().unwrap();
                assert!((0.0..=1.0).contains(&a), "{r}");
            }
            _ => assert!(r["acceptance"].is_null(), "{r}"),
        }
    }
    // A served step also draws its tokens: more operations than the pipelined step beside it.
    for served in rows.iter().filter(|r| r["grammar"] == false) {
        let same = |r: &&serde_json::Value| r["grammar"].is_null() && r["draft_layers"].is_null() && r["n_depth"] == served["n_depth"] && r["n_seq"] == served["n_seq"];
        let pipelined = rows.iter().find(same).unwrap();
        assert!(served["ops"].as_f64() > pipelined["ops"].as_f64(), "{served}\n{pipelined}");
    }
    // A draft as deep as the model is refused before anything runs.
    let out = bench(&["-m", path(&sala), "-p", "0", "-n", "4", "--draft-layers", "4"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("between 1 and 3 of the model's 4 layers"), "{stderr}");
    // No sequences, or a draft size without a draft: refused by name.
    let out = bench(&["-m", path(&sala), "-p", "0", "-n", "4", "--n-seq", "0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--n-seq"), "{stderr}");
    let out = bench(&["-m", path(&sala), "-p", "0", "-n", "4", "--num-draft", "3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--draft-layers"), "{stderr}");
}

#[test]
fn prefix_cache_suite_times_follow_ups_cold_warm_and_from_disk() {
    // Golden SALA (hybrid: restarts at kept points; 4096 is one) and SmolLM2 (attention alone:
    // restarts anywhere).
    let sala = common::golden("C_sparse_prefill");
    let smol = common::smollm2_gguf();
    let dir = temp("prefix-dir");
    std::fs::create_dir_all(&dir).unwrap();
    let run = |model: &Path, depth: &str| -> Vec<serde_json::Value> {
        let out = ok(&bench(&["--suite", "prefix-cache", "-m", path(model), "-p", "5", "-d", depth, "-r", "2", "-o", "jsonl", "--cache-dir", path(&dir)]));
        out.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    for (model, depth) in [(&sala, 4096u64), (&smol, 300)] {
        let rows = run(model, &depth.to_string());
        let got: Vec<(&str, u64, u64, u64)> = rows
            .iter()
            .map(|r| (r["prefix"].as_str().unwrap(), r["n_prompt"].as_u64().unwrap(), r["n_depth"].as_u64().unwrap(), r["n_cached"].as_u64().unwrap()))
            .collect();
        // Cold prefills everything; warm and disk (the file's pages dropped or not) start from
        // the whole prefix.
        let want = [("cold", 5, depth, 0), ("warm", 5, depth, depth), ("disk", 5, depth, depth), ("disk-cached", 5, depth, depth)];
        assert_eq!(got, want, "{rows:?}");
        for r in &rows {
            assert_eq!(r["samples_ns"].as_array().unwrap().len(), 2, "{r}");
            for (ns, ts) in r["samples_ns"].as_array().unwrap().iter().zip(r["samples_ts"].as_array().unwrap()) {
                let (ns, ts) = (ns.as_f64().unwrap(), ts.as_f64().unwrap());
                assert!(ns > 0.0 && (ts - 5e9 / ns).abs() < 1e-6 * ts, "t/s is follow-up tokens over the time to first token: {r}");
            }
        }
        // The bytes the prefix cache counts are the bytes MLX holds for them (within 10%).
        let (held, measured) = (rows[1]["prefix_bytes"].as_f64().unwrap(), rows[1]["prefix_mem"].as_f64().unwrap());
        assert!(held > 0.0 && (measured - held).abs() <= 0.1 * held + 1e6, "held {held}, measured {measured}");
        // The file holds the state's data (the cache holds whole allocation steps of it).
        assert!(rows[2]["prefix_bytes"].as_f64().unwrap() > 0.4 * held, "{:?}", rows[2]);
        assert_eq!(rows[3]["prefix_bytes"], rows[2]["prefix_bytes"]);
        assert!(rows[2]["prefix_mem"].is_null() && rows[0]["prefix_bytes"] == 0);
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the prompt cache file is removed");
    // The markdown table: time to first token and the ratio to cold.
    let table = ok(&bench(&["--suite", "prefix-cache", "-m", path(&smol), "-p", "5", "-d", "64", "-r", "1", "--cache-dir", path(&dir)]));
    assert!(table.contains("| ttft5 @ d64 warm |") && table.contains("| vs cold |") && table.contains("measured)"), "{table}");
    // Nothing to reuse without a prefix; nowhere to write the file without a folder.
    let out = bench(&["--suite", "prefix-cache", "-m", path(&sala), "-p", "5", "-d", "0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("-d above 0"), "{stderr}");
    let missing = dir.join("missing");
    let out = bench(&["--suite", "prefix-cache", "-m", path(&sala), "-p", "5", "-d", "64", "--cache-dir", path(&missing)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--cache-dir") && stderr.contains("not a folder"), "{stderr}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// On a terminal, `sala bench` shows its progress (the test at hand, runs done of all, time spent
/// and left) on stderr; stdout gets only results, each row as soon as its test finishes; on a
/// pipe nothing is drawn.
#[test]
fn progress_on_a_terminal_and_rows_as_they_finish() {
    let smol = common::smollm2_gguf();
    let args = ["bench", "-m", path(&smol), "-p", "8", "-n", "24", "-r", "2", "-o", "csv"];
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sala"));
    cmd.args(args).stdout(std::process::Stdio::piped());
    let (mut child, screen) = common::terminal::spawn_with_stderr_on_terminal(&mut cmd);
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(stdout) {
            let _ = tx.send((line.unwrap(), std::time::Instant::now()));
        }
    });
    let status = child.wait().unwrap();
    let exited = std::time::Instant::now();
    assert!(status.success(), "{}", screen.text());
    let lines: Vec<(String, std::time::Instant)> = rx.iter().collect();
    // A header and one row per test (pp8, tg24, tg24 served): the pp row came while the tg
    // tests (three runs each) still ran.
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(lines[0].0.starts_with("model_filename,") && lines.iter().all(|(l, _)| !l.contains('\x1b')), "{lines:?}");
    let early = exited.duration_since(lines[1].1);
    assert!(early > std::time::Duration::from_millis(200), "the pp8 row came only {early:?} before the end");
    // Give the reader a moment to drain what the terminal shows.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let shown = screen.text();
    for part in ["bench", "runs", "elapsed", "eta", "SmolLM2-135M-Instruct.Q4_1.gguf tg24"] {
        assert!(shown.contains(part), "no `{part}` on the terminal: {shown:?}");
    }
    assert!(shown.contains("/9 runs"), "runs done of all nine (three tests, a warm-up and two timed each): {shown:?}");

    // To a pipe: the same results and no bar.
    let out = bench(&args[1..]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains('\x1b') && !err.contains("elapsed"), "{err:?}");
    assert_eq!(String::from_utf8(out.stdout).unwrap().lines().count(), 4);
}
