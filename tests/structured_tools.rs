//! Structured tool calls against the official clients (PyPI, in the venv tests/serve_apis.rs
//! uses): strict schemas on SmolLM2 (tests/reference/openai_strict_tools.py), and forced calls in
//! MiniCPM-SALA's own XML syntax on a tiny random MiniCPM-SALA with the MiniCPM4 tokenizer,
//! sampled, through `openai` and `anthropic` (tests/reference/xml_tool_calls.py).

mod common;

use common::server::Server;
use std::path::PathBuf;
use std::process::Command;

const CLIENTS: &[&str] = &["openai==1.109.1", "anthropic==0.99.0", "prometheus_client==0.26.0"];

/// Runs `tests/reference/<script>` against the server; its transcript must end in `passed`.
fn run_script(script: &str, port: u16, passed: &str) {
    let python = common::venv_python("api-clients-venv", "SALA_API_CLIENTS_PYTHON", "openai, anthropic, prometheus_client", CLIENTS);
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/reference").join(script);
    let out = Command::new(python).arg(path).arg(format!("http://127.0.0.1:{port}")).arg("test-key").output().unwrap();
    let transcript = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{transcript}");
    assert!(out.status.success() && transcript.contains(passed), "{transcript}");
}

/// The weather tool under `tool_choice: "required"` wandered into repeated undeclared
/// keys until `max_tokens`; strict, it is one valid call within 80 tokens.
#[test]
fn a_schema_without_additional_properties_gives_only_its_keys() {
    let server = Server::start(&common::smollm2_gguf(), &["--api-key", "test-key"], 200);
    run_script("openai_strict_tools.py", server.port, "strict tool checks passed");
}

/// A string value in `minicpm4_xml` ran to `max_tokens`; now every sampled answer of a random
/// model is a call valid under the schema.
#[test]
fn random_minicpm_sala_calls_are_valid_in_its_own_syntax() {
    let model = common::tiny_sala_minicpm4("xml-calls");
    let server = Server::start(&model, &["--api-key", "test-key"], 200);
    run_script("xml_tool_calls.py", server.port, "xml tool call checks passed");
    drop(server);
    let _ = std::fs::remove_dir_all(model);
}
