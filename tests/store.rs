//! The model store (HuggingFace hub cache layout): names resolve to snapshots for every command,
//! `list` / `show` / `rm`, bad names refused, and the memory preflight refusing with the numbers.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// A hub cache holding golden case A as `test-org/tiny-sala`, laid out like huggingface_hub does
/// (snapshot files are symlinks into blobs/).
fn store(name: &str) -> PathBuf {
    let cache = std::env::temp_dir().join(format!("sala-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let repo = cache.join("models--test-org--tiny-sala");
    let snapshot = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), COMMIT).unwrap();
    for (i, f) in ["config.json", "model.safetensors"].iter().enumerate() {
        let blob = repo.join("blobs").join(format!("blob{i}"));
        std::fs::copy(common::golden("A_dense_f32").join(f), &blob).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/blob{i}"), snapshot.join(f)).unwrap();
    }
    cache
}

fn sala(cache: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sala"));
    cmd.args(args).env("HF_HUB_CACHE", cache).env_remove("SALA_AVAILABLE_MEMORY");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).to_string(), String::from_utf8_lossy(&o.stderr).to_string())
}

#[test]
fn store_names_list_show_run_and_rm() {
    let cache = store("names");
    let (out, err) = text(&sala(&cache, &["list"], &[]));
    assert!(out.contains("test-org/tiny-sala") && out.contains("minicpm_sala") && out.contains("none"), "{out}{err}");

    // A store name works wherever a path does.
    let shown = sala(&cache, &["show", "test-org/tiny-sala", "--context", "1000", "--json"], &[]);
    let (out, err) = text(&shown);
    let json: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    assert_eq!(json["model_type"], "minicpm_sala");
    assert_eq!(json["memory"]["context"], 1000);
    // Golden A: 2 sparse layers × (2·1000 + 1000/16 + 1000/64) rows × 2 KV heads × 32 × 4 bytes
    // + 2 lightning layers × 4 heads × 32 × 32 × 4 bytes.
    let expected = 2 * (2 * 1000 + 1000 / 16 + 1000 / 64) * 2 * 32 * 4 + 2 * 4 * 32 * 32 * 4;
    assert_eq!(json["memory"]["cache_bytes"], expected);
    let ran = sala(&cache, &["run", "--model", "test-org/tiny-sala", "--input-ids", "1,2,3", "--max-tokens", "2", "--temperature", "0", "--json"], &[]);
    assert!(ran.status.success(), "{}", text(&ran).1);

    // Unknown names say how to get them; unsafe names are refused before touching the disk.
    let (_, err) = text(&sala(&cache, &["run", "--model", "test-org/other", "--input-ids", "1"], &[]));
    assert!(err.contains("not in the model store") && err.contains("sala pull test-org/other"), "{err}");
    for bad in ["../tiny-sala", "test-org/../x", "/etc/passwd-like/x", "a/b/c"] {
        let o = sala(&cache, &["rm", bad], &[]);
        assert!(!o.status.success(), "{bad} accepted");
    }

    let removed = sala(&cache, &["rm", "test-org/tiny-sala"], &[]);
    assert!(removed.status.success(), "{}", text(&removed).1);
    assert!(!cache.join("models--test-org--tiny-sala").exists());
    let (out, _) = text(&sala(&cache, &["list"], &[]));
    assert!(out.contains("no models"), "{out}");
    std::fs::remove_dir_all(cache).unwrap();
}

#[test]
fn the_pulled_default_model_runs_without_a_path() {
    let cache = store("default");
    let args = ["run", "--input-ids", "1,2,3", "--max-tokens", "2", "--temperature", "0", "--json"];
    // Not pulled yet, and told not to pull: the error says how to get it.
    let missing = sala(&cache, &[&args[..], &["--no-pull"]].concat(), &[]);
    let (_, err) = text(&missing);
    assert!(!missing.status.success());
    assert!(err.contains("no model given") && err.contains("--no-pull") && err.contains("sala pull") && err.contains("moxin-org/MiniCPM4-SALA-9B-8bit-mlx"), "{err}");
    // Pulled (here: golden case A stored under the default name): used without --model, and the
    // same answer as naming it.
    std::fs::rename(cache.join("models--test-org--tiny-sala"), cache.join("models--moxin-org--MiniCPM4-SALA-9B-8bit-mlx")).unwrap();
    let by_default = sala(&cache, &args, &[]);
    assert!(by_default.status.success(), "{}", text(&by_default).1);
    let mut named = args.to_vec();
    named.extend(["--model", "moxin-org/MiniCPM4-SALA-9B-8bit-mlx"]);
    let (expected, _) = text(&sala(&cache, &named, &[]));
    let direct = sala(&cache, &["run", "--model", common::golden("A_dense_f32").to_str().unwrap(), "--input-ids", "1,2,3", "--max-tokens", "2", "--temperature", "0", "--json"], &[]);
    assert_eq!(text(&by_default).0, expected);
    assert_eq!(expected, text(&direct).0);
    assert!(expected.contains("token_ids"), "{expected}");
    std::fs::remove_dir_all(cache).unwrap();
}

#[test]
fn preflight_refuses_what_does_not_fit() {
    let cache = store("preflight");
    let model = common::golden("A_dense_f32");
    // Golden A's weights are ~1 MB in f32; 100 kB of memory cannot hold them.
    let o = sala(&cache, &["run", "--model", model.to_str().unwrap(), "--input-ids", "1,2"], &[("SALA_AVAILABLE_MEMORY", "100000")]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("needs") && err.contains("weights") && err.contains("only 0.1 MB is available"), "{err}");
    // Enough for the weights but not for a long generation's cache.
    let o = sala(
        &cache,
        &["run", "--model", model.to_str().unwrap(), "--input-ids", "1,2", "--max-tokens", "100000"],
        &[("SALA_AVAILABLE_MEMORY", "20000000")],
    );
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("cache") && err.contains("100000 tokens"), "{err}");
    std::fs::remove_dir_all(cache).unwrap();
}

#[test]
fn names_follow_the_hubs_rules_and_map_to_one_folder_each() {
    use sala::store::cache::ModelRef;
    // `a--b/c` and `a/b--c` both became models--a--b--c.
    for bad in ["a--b/c", "a/b--c", "a/b..c", "-a/b", "a/b-", ".a/b", "a/b.", "a/", "/b", "a/b/c", "a/b c", "a/é"] {
        let e = ModelRef::parse(bad).expect_err(bad).to_string();
        assert!(e.contains("is not a model name"), "{bad}: {e}");
    }
    let long = format!("a/{}", "x".repeat(97));
    assert!(ModelRef::parse(&long).is_err());
    for good in ["a/b", "HuggingFaceTB/SmolLM2-135M-Instruct", "org_1/name.v2", "a-b/c_d", &format!("a/{}", "x".repeat(96))] {
        assert!(ModelRef::parse(good).is_ok(), "{good}");
    }
    let cache = std::env::temp_dir().join("sala-store-names");
    let (one, two) = (ModelRef::parse("a-b/c").unwrap(), ModelRef::parse("a/b-c").unwrap());
    assert_ne!(one.repo_dir(&cache), two.repo_dir(&cache));
}

#[test]
fn revisions_follow_gits_rules_for_ref_names() {
    use sala::store::cache::ModelRef;
    // These were written as ref names (`refs/.`, `refs/%2e%2e`, a name with a line break).
    for bad in [
        ".", "..", "%2e%2e", "main\r\nX", "main\0", "ma in", "a~1", "a^", "a:b", "a?", "a*", "a[", "a\\b", "a..b", "a@{1}", "@",
        "/main", "main/", "main.", ".hidden", "a/.b", "a//b", "v1.lock", "a/b.lock/c", "",
    ] {
        let e = ModelRef::parse(&format!("a/b@{bad}")).expect_err(bad).to_string();
        assert!(e.contains("is not a revision") && !e.contains('\n') && !e.contains('\r'), "{bad:?}: {e}");
    }
    assert!(ModelRef::parse(&format!("a/b@{}", "x".repeat(256))).is_err());
    for good in ["main", "v1.0", "refs/pr/1", "release/2024-01", "0123456789abcdef0123456789abcdef01234567", "a@b", "feature_x.y"] {
        assert_eq!(ModelRef::parse(&format!("a/b@{good}")).unwrap().revision, good);
    }
    // The command line says so before touching the network.
    let cache = store("revisions");
    let o = sala(&cache, &["pull", "a/b", "--revision", "."], &[("HF_ENDPOINT", "http://127.0.0.1:9")]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("`.` is not a revision"), "{err}");
    let o = sala(&cache, &["show", "test-org/tiny-sala@%2e%2e"], &[]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("is not a revision"), "{err}");
    std::fs::remove_dir_all(cache).unwrap();
}

#[test]
fn only_snapshots_a_ref_names_are_models() {
    let cache = store("complete");
    let repo = cache.join("models--test-org--tiny-sala");
    // An unfinished pull of another repo: files in a snapshot, no ref. It was listed (the newest
    // snapshot stood in for a missing ref) and resolved by its commit.
    let half = cache.join("models--test-org--half/snapshots").join(COMMIT);
    std::fs::create_dir_all(&half).unwrap();
    std::fs::copy(common::golden("A_dense_f32").join("config.json"), half.join("config.json")).unwrap();
    // A folder no hub name maps to (`a--b/c` or `a/b--c`): not listed.
    let clash = cache.join("models--a--b--c");
    std::fs::create_dir_all(clash.join("refs")).unwrap();
    std::fs::create_dir_all(clash.join("snapshots").join(COMMIT)).unwrap();
    std::fs::write(clash.join("refs/main"), COMMIT).unwrap();
    // A second revision of the listed repo, finished: listed by its ref.
    let other = "89abcdef0123456789abcdef0123456789abcdef";
    std::fs::create_dir_all(repo.join("snapshots").join(other)).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(common::golden("A_dense_f32").join(f), repo.join("snapshots").join(other).join(f)).unwrap();
    }
    std::fs::create_dir_all(repo.join("refs/release")).unwrap();
    std::fs::write(repo.join("refs/release/v2"), other).unwrap();
    // A ref whose content is a path: ignored, never followed.
    std::fs::write(repo.join("refs/evil"), "../../../../etc").unwrap();

    let (out, err) = text(&sala(&cache, &["list", "--json"], &[]));
    let list: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    let names: Vec<&str> = list.as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["test-org/tiny-sala", "test-org/tiny-sala@release/v2"]);
    for name in ["test-org/half", &format!("test-org/half@{COMMIT}"), "test-org/tiny-sala@evil", "a/b--c", "a--b/c"] {
        let o = sala(&cache, &["show", name], &[]);
        assert!(!o.status.success(), "{name} resolved: {}", text(&o).0);
    }
    for name in ["test-org/tiny-sala@release/v2", &format!("test-org/tiny-sala@{other}"), &format!("test-org/tiny-sala@{COMMIT}")] {
        let o = sala(&cache, &["show", name, "--json"], &[]);
        assert!(o.status.success(), "{name}: {}", text(&o).1);
    }
    std::fs::remove_dir_all(cache).unwrap();
}

/// A name that is neither a path nor in the store says where names come from, and names the
/// store's models that contain it; a store name shows the snapshot's real files.
#[test]
fn unknown_names_point_to_list_and_pull() {
    let cache = store("unknown");
    let o = sala(&cache, &["show", "tiny-sala"], &[]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("tiny-sala: no such file or directory, and not in the model store"), "{err}");
    assert!(err.contains("it has test-org/tiny-sala") && err.contains("`sala list`") && err.contains("`sala pull ORG/tiny-sala`"), "{err}");
    let (_, err) = text(&sala(&cache, &["show", "SmolLM2"], &[]));
    assert!(err.contains("`sala list`") && err.contains("`sala pull ORG/SmolLM2`") && !err.contains("it has"), "{err}");
    let (_, err) = text(&sala(&cache, &["show", "test-org/other"], &[]));
    assert!(err.contains("`sala list`") && err.contains("`sala pull test-org/other`"), "{err}");
    // A missing file stays a missing file.
    let (_, err) = text(&sala(&cache, &["show", "SmolLM2.gguf"], &[]));
    assert!(err.contains("SmolLM2.gguf: no such file or directory") && !err.contains("sala pull"), "{err}");

    let (out, err) = text(&sala(&cache, &["show", "test-org/tiny-sala", "--json"], &[]));
    let json: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    assert_eq!(json["files"], serde_json::json!(["config.json", "model.safetensors"]));
    assert_eq!(json["tokenizer_source"], serde_json::Value::Null);
    std::fs::remove_dir_all(cache).unwrap();
}
