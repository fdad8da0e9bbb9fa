//! `sala doctor`: each check's status and fix under controlled settings (a store with one model,
//! offline, little memory, a store that is a file, a token file, kernels switched off), and the
//! kernels' self-checks (on a GPU, each kernel's line).

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sala-doctor-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A hub-cache layout holding golden case A as `test/tiny` (snapshot `abc`, refs/main → abc).
fn store_with_one_model(root: &Path) -> PathBuf {
    let hub = root.join("hub");
    let repo = hub.join("models--test--tiny");
    let snapshot = repo.join("snapshots/abc");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), "abc").unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(common::golden("A_dense_f32").join(file), repo.join("blobs").join(file)).unwrap();
        std::fs::copy(common::golden("A_dense_f32").join(file), snapshot.join(file)).unwrap();
    }
    hub
}

fn doctor(args: &[&str], env: &[(&str, &Path)], extra: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sala"));
    cmd.arg("doctor").args(args);
    for var in ["HF_TOKEN", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_ENDPOINT", "SALA_KERNELS", "SALA_AVAILABLE_MEMORY"] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn checks(out: &Output) -> Vec<Value> {
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    v["checks"].as_array().unwrap().clone()
}

fn check<'a>(checks: &'a [Value], name: &str) -> &'a Value {
    checks.iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no {name} check in {checks:?}"))
}

#[test]
fn doctor_reports_each_part_of_the_setup() {
    let root = temp("setup");
    let hub = store_with_one_model(&root);
    let home = root.join("hf-home");
    let out = doctor(&["--json"], &[("HF_HUB_CACHE", &hub), ("HF_HOME", &home)], &[("HF_HUB_OFFLINE", "1"), ("SALA_AVAILABLE_MEMORY", "4000000000")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let all = checks(&out);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true);

    let mlx = check(&all, "mlx");
    assert_eq!(mlx["status"], "ok", "{mlx}");
    assert!(mlx["found"].as_str().unwrap().starts_with("MLX 0.32.2, backend "), "{mlx}");

    let gpu = check(&all, "gpu");
    if sala::engine::device::gpu_available() {
        assert_eq!(gpu["status"], "ok", "{gpu}");
    } else {
        assert_eq!(gpu["status"], "warn", "{gpu}");
        assert!(gpu["fix"].as_str().unwrap().contains("mlx-cuda-13") || cfg!(target_os = "macos"), "{gpu}");
    }

    let memory = check(&all, "memory");
    assert_eq!(memory["status"], "warn", "{memory}");
    assert!(memory["found"].as_str().unwrap().starts_with("4.00 GB available"), "{memory}");
    assert!(memory["fix"].as_str().unwrap().contains("--bits 4"), "{memory}");

    let store = check(&all, "store");
    let found = store["found"].as_str().unwrap();
    assert!(found.contains(&hub.display().to_string()) && found.contains("(HF_HUB_CACHE)") && found.contains("1 model(s)"), "{store}");
    let model = check(&all, "model");
    assert_eq!(model["status"], "ok", "{model}");
    assert!(model["found"].as_str().unwrap().starts_with("test/tiny: minicpm_sala"), "{model}");

    assert_eq!(check(&all, "token")["status"], "ok");
    let hub_check = check(&all, "hub");
    assert_eq!(hub_check["status"], "warn", "{hub_check}");
    assert!(hub_check["found"].as_str().unwrap().contains("HF_HUB_OFFLINE"), "{hub_check}");
    // sala's kernels: on a GPU each has run its self-check (one line each), elsewhere one line.
    let kernel_names: Vec<&str> = sala::models::kernel_checks().iter().map(|c| c.name).collect();
    if sala::engine::device::gpu_available() {
        let kernels: Vec<&Value> = all.iter().filter(|c| c["name"] == "kernel").collect();
        assert_eq!(kernels.len(), kernel_names.len(), "{kernels:?}");
        for (line, name) in kernels.iter().zip(&kernel_names) {
            let found = line["found"].as_str().unwrap();
            assert_eq!(line["status"], "ok", "{line}");
            assert!(found.starts_with(&format!("{name}: verified on ")) || found.starts_with(&format!("{name}: not used on metal")), "{line}");
        }
    } else {
        let kernels = check(&all, "kernels");
        assert_eq!(kernels["status"], "ok", "{kernels}");
        assert_eq!(kernels["found"], format!("not used on cpu, the MLX-ops versions run ({})", kernel_names.join(", ")));
    }

    // The same checks as lines: status, name, what was found, and the fix below.
    let out = doctor(&[], &[("HF_HUB_CACHE", &hub), ("HF_HOME", &home)], &[("HF_HUB_OFFLINE", "1"), ("SALA_AVAILABLE_MEMORY", "4000000000")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.lines().any(|l| l.starts_with("OK    mlx       MLX 0.32.2")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("WARN  memory    4.00 GB available")), "{text}");
    let kernels_line = if sala::engine::device::gpu_available() { "OK    kernel    gla_decode: " } else { "OK    kernels   not used on cpu" };
    assert!(text.lines().any(|l| l.starts_with(kernels_line)), "{text}");
    assert!(text.contains("fix: unset HF_HUB_OFFLINE to download"), "{text}");
}

#[test]
fn doctor_fails_on_a_store_that_is_a_file_and_names_the_fix() {
    let root = temp("file-store");
    let file = root.join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let out = doctor(&[], &[("HF_HUB_CACHE", &file)], &[("HF_HUB_OFFLINE", "1")]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("FAIL  store     {} (HF_HUB_CACHE) is not a directory", file.display())), "{text}");
    assert!(text.contains("fix: set HF_HUB_CACHE (or HF_HOME) to a directory"), "{text}");
    let out = doctor(&["--json"], &[("HF_HUB_CACHE", &file)], &[("HF_HUB_OFFLINE", "1")]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
}

#[test]
fn doctor_points_at_a_token_file_and_disabled_kernels() {
    let root = temp("token");
    let home = root.join("hf-home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("token"), "hf_abc").unwrap();
    let out = doctor(&["--json"], &[("HF_HOME", &home)], &[("HF_HUB_OFFLINE", "1"), ("SALA_KERNELS", "off")]);
    let all = checks(&out);
    let token = check(&all, "token");
    assert_eq!(token["status"], "warn", "{token}");
    assert_eq!(token["fix"], format!("export HF_TOKEN=$(cat {})", home.join("token").display()));
    // The store defaults to $HF_HOME/hub and is empty: pull something.
    let store = check(&all, "store");
    assert!(store["found"].as_str().unwrap().starts_with(&format!("{} (HF_HOME): 0 model(s)", home.join("hub").display())), "{store}");
    assert_eq!(store["status"], "warn");
    assert!(store["fix"].as_str().unwrap().contains("sala pull"), "{store}");
    assert_eq!(check(&all, "kernels")["status"], "warn");
    let out = doctor(&["--json"], &[("HF_HOME", &home)], &[("HF_HUB_OFFLINE", "1"), ("HF_TOKEN", "hf_x")]);
    assert_eq!(check(&checks(&out), "token")["status"], "ok");
}
