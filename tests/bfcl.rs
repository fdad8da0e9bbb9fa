//! Verdict parity with the official BFCL checker.
//!
//! Runs `tests/reference/bfcl_perturb.py` to produce answers for every
//! non-live entry (ground-truth renderings and systematic perturbations),
//! scores them with the official checker through
//! `tests/reference/bfcl_official_check.py`, scores them again with our
//! decoder + checker, and requires the same `valid` for every line, the
//! same error type, and (for raw prompt-mode text) the same decoded calls.
//! Done twice: prompt mode, and FC mode with `underscore_to_dot`.
//!
//! A second test compares the prompt-mode messages and FC tools of every
//! entry with the official harness's (`tests/reference/bfcl_official_prompts.py`).
//!
//! The pinned `bfcl-eval` wheel comes from PyPI into sala's cache (as `sala bfcl` fetches it); the
//! checker's few dependencies go into a venv under target/test-assets (`SALA_BFCL_PYTHON` names
//! another Python that has them).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

mod common;

use sala::eval::bfcl::{
    calls_from_json, calls_to_json, decode_prompt, evaluate, load, prompt, Category, Entry,
    Language,
};

/// The unpacked wheel (the folder holding `bfcl_eval/`) and a Python that runs its checker.
fn official() -> (PathBuf, PathBuf) {
    let python = common::venv_python(
        "bfcl-venv",
        "SALA_BFCL_PYTHON",
        "tree_sitter_javascript",
        &["filelock==3.20.0", "tenacity", "tree_sitter==0.21.3", "tree-sitter-java==0.21.0", "tree-sitter-javascript==0.21.4"],
    );
    let package = sala::eval::pypi::files(&sala::eval::pypi::BFCL_EVAL, "bfcl_eval", &|_, _| {}).expect("the bfcl-eval wheel");
    (package.parent().unwrap().to_path_buf(), python)
}

fn run(python: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new(python)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {}", python.display(), e));
    let input = stdin.unwrap_or_default().to_string();
    let mut pipe = child.stdin.take().expect("piped stdin");
    let writer = std::thread::spawn(move || pipe.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("python output");
    writer.join().expect("stdin writer").expect("write stdin");
    assert!(out.status.success(), "{:?} failed", args);
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// JSON lines; Python's non-finite `Infinity`/`NaN` become `null`, as our
/// `PyValue::to_json` writes them.
fn parse_lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l).unwrap_or_else(|_| {
                let cleaned = l
                    .replace("-Infinity", "null")
                    .replace("Infinity", "null")
                    .replace("NaN", "null");
                serde_json::from_str(&cleaned)
                    .unwrap_or_else(|e| panic!("bad JSON line {}: {}", l, e))
            })
        })
        .collect()
}

#[derive(Default)]
struct Tally {
    lines: usize,
    valid_agree: usize,
    error_type_agree: usize,
    raw_lines: usize,
    decoded_agree: usize,
    /// Raw lines of the java/javascript categories (our tree-sitter decoders).
    raw_source_lines: usize,
    source_decoded_agree: usize,
    differences: Vec<String>,
}

fn compare(
    inputs: &[Value],
    official: &[Value],
    entries: &HashMap<String, Entry>,
    underscore_to_dot: bool,
) -> Tally {
    assert_eq!(inputs.len(), official.len(), "one verdict per input line");
    let mut tally = Tally::default();
    for (input, theirs) in inputs.iter().zip(official) {
        let id = input["id"].as_str().expect("id");
        assert_eq!(theirs["id"], input["id"]);
        let entry = &entries[id];
        let category = entry.category;
        let decoded = match input.get("raw") {
            Some(raw) => {
                // The runner decodes irrelevance replies as Python.
                let language = if category == Category::Irrelevance {
                    Language::Python
                } else {
                    category.language()
                };
                decode_prompt(raw.as_str().expect("raw text"), language)
            }
            None => calls_from_json(&input["decoded"]),
        };
        let ours = evaluate(
            category,
            &entry.functions,
            &decoded,
            entry.ground_truth.as_ref(),
            underscore_to_dot,
        );
        tally.lines += 1;
        let their_valid = theirs["valid"].as_bool().expect("valid");
        let their_error = theirs["error_type"].as_str();
        let mut problems = Vec::new();
        if ours.valid == their_valid {
            tally.valid_agree += 1;
        } else {
            problems.push(format!("valid {} vs official {}", ours.valid, their_valid));
        }
        if ours.error_type.as_deref() == their_error {
            tally.error_type_agree += 1;
        } else {
            problems.push(format!(
                "error_type {:?} vs official {:?}",
                ours.error_type, their_error
            ));
        }
        if input.get("raw").is_some() {
            tally.raw_lines += 1;
            let source = matches!(category, Category::SimpleJava | Category::SimpleJavascript);
            tally.raw_source_lines += usize::from(source);
            let ours_decoded = decoded
                .as_ref()
                .map(|c| calls_to_json(c))
                .unwrap_or(Value::Null);
            // No calls: the official decoder raised (null), or its Java one returned `{}` and its
            // JavaScript one `None`; ours returns an error for all three, told apart (failed or
            // wrong format) by the error_type compared above.
            let theirs_decoded = match &theirs["decoded"] {
                calls @ Value::Array(_) => calls.clone(),
                _ => Value::Null,
            };
            if ours_decoded == theirs_decoded {
                tally.decoded_agree += 1;
                tally.source_decoded_agree += usize::from(source);
            } else {
                problems.push(format!(
                    "decoded {} vs official {}",
                    ours_decoded, theirs["decoded"]
                ));
            }
        }
        if !problems.is_empty() {
            tally.differences.push(format!(
                "{} [{}] {}: {}",
                id,
                input["variant"].as_str().unwrap_or(""),
                input.get("raw").unwrap_or(&input["decoded"]),
                problems.join("; ")
            ));
        }
    }
    tally
}

#[test]
fn verdicts_match_official_checker() {
    let (wheel, python) = official();
    let reference = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference");
    let perturb = reference.join("bfcl_perturb.py");
    let driver = reference.join("bfcl_official_check.py");
    let (perturb, driver, wheel_arg) = (
        perturb.to_str().unwrap(),
        driver.to_str().unwrap(),
        wheel.to_str().unwrap(),
    );

    let data_dir = wheel.join("bfcl_eval/data");
    let mut entries = HashMap::new();
    for category in Category::ALL {
        for entry in load(&data_dir, category, None).expect("load BFCL data") {
            entries.insert(entry.id.clone(), entry);
        }
    }

    let mut failures = Vec::new();
    for (mode, underscore_to_dot) in [("prompt", false), ("fc", true)] {
        let mut perturb_args = vec![perturb, wheel_arg];
        let mut driver_args = vec![driver, wheel_arg];
        if underscore_to_dot {
            perturb_args.push("--fc");
            driver_args.push("--underscore-to-dot");
        }
        let inputs_text = run(&python, &perturb_args, None);
        let official = parse_lines(&run(&python, &driver_args, Some(&inputs_text)));
        let inputs = parse_lines(&inputs_text);
        let tally = compare(&inputs, &official, &entries, underscore_to_dot);
        eprintln!(
            "BFCL parity ({} mode): {} lines; valid agrees on {}, error_type on {}; decoded calls agree on {}/{} raw lines, {}/{} of them java/javascript",
            mode, tally.lines, tally.valid_agree, tally.error_type_agree, tally.decoded_agree, tally.raw_lines,
            tally.source_decoded_agree, tally.raw_source_lines
        );
        if mode == "prompt" {
            // The java/javascript raw lines exist (the tree-sitter decoders are exercised).
            assert!(tally.raw_source_lines > 1000, "{} java/javascript raw lines", tally.raw_source_lines);
        }
        for d in tally.differences.iter().take(40) {
            eprintln!("  {}", d);
        }
        if !tally.differences.is_empty() {
            failures.push(format!(
                "{} mode: {} lines differ",
                mode,
                tally.differences.len()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("; "));
}

/// The prompt-mode messages and FC tools of every non-live entry equal the
/// official harness's (`tests/reference/bfcl_official_prompts.py`).
#[test]
fn prompts_and_tools_match_official_harness() {
    let (wheel, python) = official();
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/bfcl_official_prompts.py");
    let official = parse_lines(&run(
        &python,
        &[script.to_str().unwrap(), wheel.to_str().unwrap()],
        None,
    ));
    let data_dir = wheel.join("bfcl_eval/data");
    let mut ours = HashMap::new();
    for category in Category::ALL {
        for entry in load(&data_dir, category, None).expect("load BFCL data") {
            let hinted = prompt::hinted_functions(&entry.functions, category);
            let messages =
                serde_json::to_value(prompt::messages(&entry)).expect("messages as JSON");
            ours.insert(
                entry.id.clone(),
                (messages, Value::Array(prompt::tools(&hinted))),
            );
        }
    }
    assert_eq!(official.len(), ours.len(), "one official line per entry");
    let mut differences = Vec::new();
    for theirs in &official {
        let id = theirs["id"].as_str().expect("id");
        let (messages, tools) = &ours[id];
        if *messages != theirs["messages"] {
            differences.push(format!("{id}: messages differ"));
        }
        // Compared as text, so that key order counts too.
        let as_text = |v: &Value| serde_json::to_string(v).expect("JSON text");
        if as_text(tools) != as_text(&theirs["tools"]) {
            differences.push(format!(
                "{id}: tools differ:\n  ours   {tools}\n  theirs {}",
                theirs["tools"]
            ));
        }
    }
    eprintln!(
        "BFCL prompt parity: {} entries; {} differences",
        official.len(),
        differences.len()
    );
    for d in differences.iter().take(10) {
        eprintln!("  {d}");
    }
    assert!(differences.is_empty());
}

fn sala_bfcl(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sala")).arg("bfcl").args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{err}");
    // Table cells are padded to line up: compare with single spaces.
    let table = String::from_utf8(out.stdout).unwrap().split(' ').filter(|w| !w.is_empty()).collect::<Vec<_>>().join(" ");
    (table, err)
}

fn temp(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("sala-bfcl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// `sala bfcl --limit 3` on SmolLM2 in prompt mode: every category, the leaderboard CSV, and
/// per-sample JSONL whose raw replies the official checker scores exactly as we did.
#[test]
fn prompt_mode_on_smollm2_scores_like_the_official_checker() {
    let smol = common::smollm2_gguf();
    let (csv, samples) = (temp("data_non_live.csv"), temp("samples.jsonl"));
    let (table, _) = sala_bfcl(&["-m", smol.to_str().unwrap(), "--limit", "3", "--max-tokens", "32", "--csv", csv.to_str().unwrap(), "--samples", samples.to_str().unwrap()]);
    assert!(table.contains("| category | entries | correct | accuracy |"), "{table}");
    assert!(table.contains("| Rank | Model | Non-Live Overall Acc | AST Summary |"), "{table}");
    let lines = parse_lines(&std::fs::read_to_string(&samples).unwrap());
    assert_eq!(lines.len(), 21, "3 entries × 7 categories");
    for (line, category) in lines.iter().zip(Category::ALL.iter().flat_map(|c| [c; 3])) {
        assert_eq!(line["category"], category.name());
        assert_eq!((line["model"].as_str(), line["mode"].as_str()), (Some("SmolLM2-135M-Instruct.Q4_1.gguf"), Some("prompt")));
        assert!(line["gen_tokens"].as_u64().unwrap() <= 32);
    }
    // The official decoder and checker on the same replies.
    let (wheel, python) = official();
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/bfcl_official_check.py");
    let inputs: String = lines.iter().map(|l| serde_json::json!({"id": l["id"], "category": l["category"], "raw": l["raw"]}).to_string() + "\n").collect();
    let theirs = parse_lines(&run(&python, &[driver.to_str().unwrap(), wheel.to_str().unwrap()], Some(&inputs)));
    for (ours, theirs) in lines.iter().zip(&theirs) {
        assert_eq!((&ours["id"], &ours["valid"], &ours["error_type"]), (&theirs["id"], &theirs["valid"], &theirs["error_type"]), "{ours}");
    }
    // data_non_live.csv: the leaderboard header, one ranked row, cells from the sample verdicts.
    let text = std::fs::read_to_string(&csv).unwrap();
    let mut rows = text.lines();
    assert_eq!(rows.next().unwrap(), sala::eval::bfcl::score::NON_LIVE_CSV_HEADER);
    let row: Vec<&str> = rows.next().unwrap().split(',').collect();
    assert_eq!(&row[..2], ["1", "SmolLM2-135M-Instruct.Q4_1.gguf"]);
    let accuracy = |c: &str| {
        let valid = lines.iter().filter(|l| l["category"] == c && l["valid"] == true).count();
        valid as f64 / 3.0
    };
    let cell = |v: f64| format!("{:.2}%", v * 100.0);
    let simple = (accuracy("simple_python") + accuracy("simple_java") + accuracy("simple_javascript")) / 3.0;
    let overall = (simple + accuracy("multiple") + accuracy("parallel") + accuracy("parallel_multiple")) / 4.0;
    assert_eq!(row[2], cell(overall));
    assert_eq!(row[4], cell(simple));
    assert_eq!(row[5], cell(accuracy("simple_python")));
    assert_eq!(row[11], cell(accuracy("irrelevance")));
    std::fs::remove_file(csv).unwrap();
    std::fs::remove_file(samples).unwrap();
}

/// FC mode on a golden SALA model (random weights): no reply is a tool call, so every simple
/// entry fails to decode and every irrelevance entry is right.
#[test]
fn fc_mode_on_golden_sala() {
    let sala = common::golden_with_tokenizer("A_dense_f32", "bfcl", None);
    let samples = temp("fc.jsonl");
    let args = ["-m", sala.to_str().unwrap(), "--mode", "fc", "--limit", "3", "--categories", "simple_python,irrelevance", "--max-tokens", "12", "--samples", samples.to_str().unwrap()];
    let (table, _) = sala_bfcl(&args);
    assert!(table.contains("| simple_python | 3 | 0 | 0.00% |") && table.contains("| irrelevance | 3 | 3 | 100.00% |"), "{table}");
    let lines = parse_lines(&std::fs::read_to_string(&samples).unwrap());
    assert_eq!(lines.len(), 6);
    for l in &lines[..3] {
        // Text without a call fails to decode; an empty reply is no call at all (BFCL's `[]`).
        let want = if l["raw"] == "" { ("simple_function_checker:wrong_count", serde_json::json!([])) } else { ("ast_decoder:decoder_failed", Value::Null) };
        assert_eq!((l["mode"].as_str(), l["error_type"].as_str(), &l["decoded"]), (Some("fc"), Some(want.0), &want.1), "{l}");
    }
    std::fs::remove_file(&samples).unwrap();
    // --constrain asks every entry twice, freely and with calls held to the grammar, in the model's
    // own syntax (minicpm4_xml for SALA), and reports both.
    let args = ["-m", sala.to_str().unwrap(), "--mode", "fc", "--constrain", "--limit", "2", "--categories", "simple_python", "--max-tokens", "12", "--samples", samples.to_str().unwrap()];
    let (table, _) = sala_bfcl(&args);
    assert!(table.contains("A_dense_f32-") && table.contains(" (fc mode, minicpm4_xml tool calls)") && table.contains(" +grammar (fc+grammar mode, minicpm4_xml tool calls)"), "{table}");
    let lines = parse_lines(&std::fs::read_to_string(&samples).unwrap());
    let modes: Vec<&str> = lines.iter().map(|l| l["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["fc", "fc", "fc+grammar", "fc+grammar"]);
    for l in &lines[2..] {
        // Under the grammar no call opens unless it is a complete one.
        assert!(!l["raw"].as_str().unwrap().contains("<function") || l["error_type"] != "ast_decoder:decoder_failed", "{l}");
    }
    std::fs::remove_file(&samples).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sala")).args(["bfcl", "-m", sala.to_str().unwrap(), "--constrain"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--constrain") && err.contains("--mode fc"), "{err}");
    // An unknown category is named with the known ones.
    let out = Command::new(env!("CARGO_BIN_EXE_sala")).args(["bfcl", "-m", sala.to_str().unwrap(), "--categories", "live_simple"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("unknown category `live_simple`") && err.contains("parallel_multiple"), "{err}");
    // A --data folder without BFCL's files names the file it looked for.
    let out = Command::new(env!("CARGO_BIN_EXE_sala")).args(["bfcl", "-m", sala.to_str().unwrap(), "--data", "/nonexistent"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("/nonexistent/BFCL_v4_simple_python.json") && err.contains("--data names the bfcl_eval/data folder"), "{err}");
    std::fs::remove_dir_all(sala).unwrap();
}
