//! lm-evaluation-harness against `sala serve` with no set-up: its `local-completions` model with
//! `tokenizer_backend` left at its default finds the server's tokenizer endpoints and runs small
//! tasks (written here, with their data: no hub) on the SmolLM2 GGUF: multiple choice, rolling
//! log-likelihood and generation. The choices' log-likelihoods are checked against a forward
//! pass of the model made here, the accuracy against the choices those pick; the rolling
//! log-likelihoods against the same forward after the BOS token lm-eval reads from the server;
//! the generations against the server's own greedy completions with the end token lm-eval reads
//! as a stop; and the server's request log says every request it made succeeded. lm-eval comes from PyPI (pinned) in a venv cached under `$SALA_TEST_ASSETS`:
//! `lm_eval[api]` alone (no torch or transformers: the API models import neither).

mod common;

use common::server::Server;
use sala::engine::model::Logits;
use serde_json::{json, Value};
use std::process::Command;

const LM_EVAL: &[&str] = &["lm_eval[api]==0.4.13"];

/// The task's questions, choices and the index of the right one.
const DOCS: &[(&str, &[&str], usize)] = &[
    ("The capital of France is", &["Paris", "London", "Berlin"], 0),
    ("Two plus two equals", &["five", "four", "seven"], 1),
    ("The sky on a clear day is", &["green", "red", "blue"], 2),
    ("Water freezes at zero degrees", &["Celsius", "Kelvin", "Newton"], 0),
];

/// Texts the rolling task scores whole.
const TEXTS: &[&str] = &["The quick brown fox jumps over the lazy dog.", "Paris is the capital and largest city of France."];

/// The log-likelihood of `continuation` after `context` as lm-eval's causal models split it (the
/// whole text tokenized, the context's tokens taken off its front), and whether each of its
/// tokens is the most likely one.
fn reference(model: &dyn sala::engine::model::LanguageModel, tokenizer: &sala::engine::tokenizer::TextTokenizer, context: &str, continuation: &str) -> (f64, bool) {
    let whole = tokenizer.encode_plain(&format!("{context}{continuation}")).unwrap();
    let context_len = tokenizer.encode_plain(context).unwrap().len();
    scored(model, &whole, context_len)
}

/// The log-likelihood of `whole[from..]` after what comes before it, and whether each of those
/// tokens is the most likely one; from one forward over `whole` in float32.
fn scored(model: &dyn sala::engine::model::LanguageModel, whole: &[u32], context_len: usize) -> (f64, bool) {
    let input: Vec<i32> = whole.iter().map(|&t| t as i32).collect();
    let logits = model.forward(&mlx_rs::Array::from_slice(&input, &[1, input.len() as i32]), &mut model.new_cache(), Logits::All, None).unwrap();
    let logits = sala::engine::ops::to_vec_f32(&logits).unwrap();
    let vocab = logits.len() / whole.len();
    let (mut sum, mut greedy) = (0.0, true);
    for i in context_len..whole.len() {
        let row = &logits[(i - 1) * vocab..i * vocab];
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = max + row.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
        sum += row[whole[i] as usize] as f64 - lse;
        greedy &= common::argmax(&row.iter().map(|&l| l as f64).collect::<Vec<_>>()) == whole[i] as usize;
    }
    (sum, greedy)
}

#[test]
fn lm_eval_local_completions_runs_on_a_gguf_with_its_default_tokenizer() {
    let python = common::venv_python("lm-eval-venv", "SALA_LM_EVAL_PYTHON", "lm_eval, aiohttp, requests, tenacity", LM_EVAL);
    let gguf = common::smollm2_gguf();
    // float32: the server and the reference here compute the same numbers.
    let server = Server::start(&gguf, &["--dtype", "f32", "--alias", "smollm2"], 200);

    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.jsonl");
    let lines: Vec<String> = DOCS.iter().map(|(q, choices, answer)| json!({"question": q, "choices": choices, "answer": answer}).to_string()).collect();
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    let task = format!(
        "task: sala_tiny_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {}\ntest_split: test\noutput_type: multiple_choice\n\
         doc_to_text: \"{{{{question}}}}\"\ndoc_to_choice: choices\ndoc_to_target: answer\nmetric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n",
        data.display()
    );
    std::fs::write(dir.path().join("sala_tiny_mc.yaml"), task).unwrap();
    // The rolling task scores each text whole; the generation task asks each question, stopping at a full stop.
    let texts = dir.path().join("texts.jsonl");
    std::fs::write(&texts, TEXTS.iter().map(|t| json!({"text": t}).to_string() + "\n").collect::<String>()).unwrap();
    let rolling = format!(
        "task: sala_tiny_rolling\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {}\ntest_split: test\noutput_type: loglikelihood_rolling\n\
         doc_to_text: \"\"\ndoc_to_target: \"{{{{text}}}}\"\nmetric_list:\n  - metric: word_perplexity\n",
        texts.display()
    );
    std::fs::write(dir.path().join("sala_tiny_rolling.yaml"), rolling).unwrap();
    let generation = format!(
        "task: sala_tiny_gen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {}\ntest_split: test\noutput_type: generate_until\n\
         doc_to_text: \"{{{{question}}}}\"\ndoc_to_target: \"{{{{choices[answer]}}}}\"\ngeneration_kwargs:\n  until: [\".\"]\n  max_gen_toks: 8\n  do_sample: false\n\
         metric_list:\n  - metric: exact_match\n",
        data.display()
    );
    std::fs::write(dir.path().join("sala_tiny_gen.yaml"), generation).unwrap();
    let out_dir = dir.path().join("out");
    let base_url = format!("base_url=http://127.0.0.1:{}/v1/completions,model=smollm2,max_retries=1", server.port);
    let run = Command::new(&python)
        .args(["-m", "lm_eval", "--model", "local-completions", "--model_args", &base_url, "--tasks", "sala_tiny_mc,sala_tiny_rolling,sala_tiny_gen", "--include_path"])
        .arg(dir.path())
        .arg("--output_path")
        .arg(&out_dir)
        .arg("--log_samples")
        // Nothing from the hub: the data is a local file, the tokenizer the server's.
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_DATASETS_OFFLINE", "1")
        .env("HF_HOME", dir.path().join("hf"))
        .output()
        .unwrap();
    let transcript = String::from_utf8_lossy(&run.stdout).to_string() + &String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "lm_eval failed:\n{transcript}\nserver:\n{}", server.log_so_far());
    assert!(transcript.contains("Using remote tokenizer backend"), "lm-eval did not find the server's tokenizer:\n{transcript}");

    // Its files: results_*.json and samples_sala_tiny_mc_*.jsonl under a folder named for the model.
    let files: Vec<std::path::PathBuf> = walk(&out_dir);
    let find = |prefix: &str| files.iter().find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix}* in {files:?}")).clone();
    let results: Value = serde_json::from_str(&std::fs::read_to_string(find("results_")).unwrap()).unwrap();
    let samples: Vec<Value> = std::fs::read_to_string(find("samples_sala_tiny_mc")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(samples.len(), DOCS.len());

    let (model, tokenizer) = sala::models::load_with_tokenizer(&gguf, Some(mlx_rs::Dtype::Float32)).unwrap();
    let tokenizer = tokenizer.unwrap();
    let mut right = 0;
    for sample in &samples {
        let (question, choices, answer) = DOCS[sample["doc_id"].as_u64().unwrap() as usize];
        let scored = sample["filtered_resps"].as_array().unwrap();
        assert_eq!(scored.len(), choices.len(), "{sample}");
        let mut lls = Vec::new();
        for (choice, got) in choices.iter().zip(scored) {
            // lm-eval writes each (log-likelihood, is_greedy) pair as strings.
            let ll: f64 = got[0].as_str().unwrap().parse().unwrap();
            let greedy = got[1].as_str().unwrap() == "True";
            let (want, want_greedy) = reference(model.as_ref(), &tokenizer, question, &format!(" {choice}"));
            assert!((ll - want).abs() < 2e-3, "{question} {choice}: lm-eval got {ll}, the model gives {want}");
            assert_eq!(greedy, want_greedy, "{question} {choice}");
            lls.push(want);
        }
        let picked = (0..lls.len()).max_by(|&a, &b| lls[a].total_cmp(&lls[b])).unwrap();
        assert_eq!(sample["acc"].as_f64(), Some(f64::from(picked == answer)), "{sample}");
        right += usize::from(picked == answer);
    }
    let acc = results["results"]["sala_tiny_mc"]["acc,none"].as_f64().unwrap();
    assert_eq!(acc, right as f64 / DOCS.len() as f64, "{results}");

    // Rolling: each text after the prefix token lm-eval took from /tokenizer_info's bos_token
    // (SmolLM2's <|im_start|>, id 1), all in one window.
    let samples: Vec<Value> = std::fs::read_to_string(find("samples_sala_tiny_rolling")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(samples.len(), TEXTS.len());
    for sample in &samples {
        let text = TEXTS[sample["doc_id"].as_u64().unwrap() as usize];
        let ll: f64 = sample["filtered_resps"][0].as_str().unwrap().parse().unwrap();
        let whole: Vec<u32> = std::iter::once(1).chain(tokenizer.encode_plain(text).unwrap()).collect();
        let (want, _) = scored(model.as_ref(), &whole, 1);
        assert!((ll - want).abs() < 2e-3, "{text}: lm-eval got {ll}, the model gives {want}");
    }

    // Generation: what the server's greedy completion of the question gives, stopped at the full
    // stop or at the end token lm-eval added from /tokenizer_info's eos_token.
    let samples: Vec<Value> = std::fs::read_to_string(find("samples_sala_tiny_gen")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(samples.len(), DOCS.len());
    for sample in &samples {
        let question = DOCS[sample["doc_id"].as_u64().unwrap() as usize].0;
        let body = json!({"prompt": question, "max_tokens": 8, "temperature": 0, "stop": [".", "<|im_end|>"]});
        let answer = common::server::request(server.port, "POST", "/v1/completions", Some(&body.to_string()), &[]).unwrap().json();
        let text = answer["choices"][0]["text"].as_str().unwrap();
        assert!(!text.trim().is_empty(), "{answer}");
        assert_eq!(sample["filtered_resps"][0].as_str(), Some(text), "{question}: {sample}");
    }

    // Every request lm-eval made succeeded: the tokenizer's, and one completion per choice.
    // One completion per choice, per text, per question (and one more per question here).
    let completions = DOCS.iter().map(|d| d.1.len()).sum::<usize>() + TEXTS.len() + 2 * DOCS.len();
    // A request's line is written as its answer goes out: the last may trail lm-eval's exit.
    let waited = std::time::Instant::now();
    while server.log_so_far().matches("path=/v1/completions ").count() < completions && waited.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let log = server.log_so_far();
    let requests: Vec<&str> = log.lines().filter(|l| l.contains(" request ")).collect();
    let count = |path: &str| requests.iter().filter(|l| l.contains(&format!("path={path} "))).count();
    assert!(requests.iter().all(|l| l.contains("status=200 ")), "a request failed:\n{log}");
    assert!(count("/tokenizer_info") >= 1 && count("/tokenize") >= DOCS.len(), "{log}");
    assert_eq!(count("/v1/completions"), completions, "{log}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}
