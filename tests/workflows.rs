//! The GitHub Actions workflow for Apple-silicon macOS (`.github/workflows/macos.yml`) cannot run
//! here; this holds it to what it must do: parse as YAML, run on an Apple-silicon runner with the
//! crate's Rust version, pin every action, and run test targets that exist — the golden tests on
//! the CPU and on the GPU and the Metal kernel tests (which are ignored without a GPU).

use std::path::Path;
use yaml_rust2::{Yaml, YamlLoader};

fn workflow() -> Yaml {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(".github/workflows/macos.yml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut docs = YamlLoader::load_from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(docs.len(), 1);
    docs.remove(0)
}

fn steps(job: &Yaml) -> &Vec<Yaml> {
    job["steps"].as_vec().expect("a job has steps")
}

/// The `cargo test` commands of a job: (test target, arguments after `--`, step environment).
fn cargo_tests(job: &Yaml) -> Vec<(String, String, Yaml)> {
    let mut found = Vec::new();
    for step in steps(job) {
        let Some(run) = step["run"].as_str() else { continue };
        for line in run.lines().filter(|l| l.trim_start().starts_with("cargo test")) {
            let words: Vec<&str> = line.split_whitespace().collect();
            let target = words.iter().position(|w| *w == "--test").map(|i| words[i + 1].to_string()).expect("cargo test names its target");
            let after = line.split_once(" -- ").map(|(_, a)| a.to_string()).unwrap_or_default();
            found.push((target, after, step["env"].clone()));
        }
    }
    found
}

#[test]
fn macos_workflow_runs_golden_and_metal_kernel_tests_on_apple_silicon() {
    let doc = workflow();
    assert!(!doc["on"].is_badvalue(), "the workflow has no triggers");
    let jobs = doc["jobs"].as_hash().expect("jobs");
    assert!(!jobs.is_empty());
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    let rust_version = manifest.lines().find_map(|l| l.strip_prefix("rust-version = ")).unwrap().trim_matches('"');
    for (name, job) in jobs {
        let runner = job["runs-on"].as_str().unwrap_or_else(|| panic!("job {name:?} has no runs-on"));
        // GitHub's macos-14 and later hosted runners are Apple silicon (macos-13 was Intel).
        let version: u32 = runner.strip_prefix("macos-").and_then(|v| v.split('-').next()?.parse().ok()).unwrap_or(0);
        assert!(version >= 14, "job {name:?} runs on {runner}, not an Apple-silicon macOS runner");
        for step in steps(job) {
            if let Some(action) = step["uses"].as_str() {
                let (_, version) = action.split_once('@').unwrap_or_else(|| panic!("{action} is not pinned"));
                assert!(version.starts_with('v') && version[1..].chars().all(|c| c.is_ascii_digit() || c == '.'), "{action}");
            }
            if let Some(run) = step["run"].as_str() {
                if run.contains("rustup toolchain install") {
                    assert!(run.contains(&format!("install {rust_version} ")), "toolchain is not rust-version {rust_version}: {run}");
                }
            }
        }
        let tests = cargo_tests(job);
        for (target, _, _) in &tests {
            assert!(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(format!("{target}.rs")).is_file(),
                "the workflow runs --test {target}, which does not exist"
            );
        }
        let on_gpu = |env: &Yaml| env["SALA_TEST_DEVICE"].as_str() == Some("gpu");
        assert!(tests.iter().any(|(t, _, env)| t == "golden" && !on_gpu(env)), "no golden run on the CPU");
        assert!(tests.iter().any(|(t, _, env)| t == "golden" && on_gpu(env)), "no golden run on the GPU");
        assert!(
            tests.iter().any(|(t, after, _)| t == "gpu_kernels" && after.contains("--include-ignored")),
            "the Metal kernel tests are ignored unless asked for"
        );
        assert!(
            tests.iter().all(|(_, after, _)| !after.contains("--include-ignored") || after.contains("--test-threads=1")),
            "GPU tests share MLX's process-wide default device: one thread"
        );
    }
}
