//! Prompt caches on disk (`engine::state_file`, `--prompt-cache`, issue 29): a state written
//! and read back continues exactly as a fresh run (golden SALA case C restarted inside and at
//! the end of a saved prompt; case D's second turn from its first turn's saved state), a file
//! made by another model or tokenizer is refused, a corrupted or truncated one is refused, and
//! `sala run --prompt-cache` reuses a saved document and answers as it does without one.

mod common;

use common::*;
use mlx_rs::Array;
use sala::engine::cache::ModelCache;
use sala::engine::generate::extend_along;
use sala::engine::model::{LanguageModel, Logits};
use sala::engine::ops::to_vec_f32;
use sala::engine::prefix_cache::Trail;
use sala::engine::state_file::{self, Fingerprint, StateFile};
use std::path::{Path, PathBuf};

const TOL: f64 = 1e-3;

fn logits(model: &dyn LanguageModel, cache: &mut ModelCache, ids: &[u32], which: Logits) -> Vec<Vec<f64>> {
    let input: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
    let out = model.forward(&Array::from_slice(&input, &[1, input.len() as i32]), cache, which, None).unwrap();
    let vocab = out.shape()[1] as usize;
    let flat: Vec<f64> = to_vec_f32(&out).unwrap().into_iter().map(f64::from).collect();
    flat.chunks(vocab).map(<[f64]>::to_vec).collect()
}

fn load(case: &str) -> (Box<dyn LanguageModel>, Fingerprint) {
    sala::engine::device::select(Some(sala::engine::device::DeviceKind::Cpu)).unwrap();
    let source = sala::models::open(&golden(case)).unwrap();
    let fingerprint = Fingerprint::of(&source, mlx_rs::Dtype::Float32).unwrap();
    (sala::models::load(&golden(case), Some(mlx_rs::Dtype::Float32)).unwrap(), fingerprint)
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sala-prompt-cache-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Runs `tokens` along a trail (points every few thousand tokens and at `stops`) and saves the state.
fn save(model: &dyn LanguageModel, fingerprint: &Fingerprint, tokens: &[u32], stops: &[usize], path: &Path) {
    let mut cache = model.new_cache();
    let mut trail = Trail::new(&cache);
    for &s in stops {
        trail.stop_at(s);
    }
    extend_along(model, &mut cache, &mut trail, tokens, 512, |_| {}).unwrap();
    trail.mark_end(&cache).unwrap();
    let bytes = state_file::save(path, fingerprint, tokens, &cache, &trail, &mut |_, _| {}).unwrap();
    assert_eq!(bytes, std::fs::metadata(path).unwrap().len());
}

#[test]
fn a_saved_state_continues_exactly_and_only_where_it_can() {
    let case = "C_sparse_prefill";
    let (model, fingerprint) = load(case);
    let model = model.as_ref();
    let exp = read_safetensors(&golden(case).join("expected.safetensors"));
    let want = &exp["f32.prefill.last_logits"].data;
    let prompt = ids(&tokens(case), "prompt_ids");
    let path = temp("c.cache");
    // The first 1200 tokens, with a point at 900 (inside sparse block 14, past dense_len).
    save(model, &fingerprint, &prompt[..1200], &[900], &path);
    let file = StateFile::open(&path, &fingerprint).unwrap();
    assert_eq!(file.tokens, prompt[..1200]);

    // The whole prompt restarts at the file's end; a prompt leaving it at 1000 restarts at 900.
    let start = state_file::start_from(&file, model, &prompt, model.new_cache(), &mut |_, _| {}).unwrap();
    assert_eq!((start.tokens, start.cache.len()), (1200, 1200));
    let mut cache = start.cache;
    let got = logits(model, &mut cache, &prompt[1200..], Logits::Last).remove(0);
    assert!(max_abs_diff(&got, want) <= TOL, "{}", max_abs_diff(&got, want));
    assert_eq!(argmax(&got), argmax(want));

    let mut other = prompt[..1100].to_vec();
    other[1000] = (other[1000] + 1) % 256;
    let start = state_file::start_from(&file, model, &other, model.new_cache(), &mut |_, _| {}).unwrap();
    assert_eq!(start.tokens, 900);
    let mut cache = start.cache;
    let got = logits(model, &mut cache, &other[900..], Logits::Last).remove(0);
    let fresh = logits(model, &mut model.new_cache(), &other, Logits::Last).remove(0);
    assert!(max_abs_diff(&got, &fresh) <= TOL);
    // The points up to the restart come back with it (to be saved again).
    assert_eq!(start.trail.points().iter().map(|p| p.len()).collect::<Vec<_>>(), vec![900]);

    // A prompt sharing fewer tokens than the first point has nothing to start from.
    let mut early = prompt[..600].to_vec();
    early[500] = (early[500] + 1) % 256;
    let start = state_file::start_from(&file, model, &early, model.new_cache(), &mut |_, _| {}).unwrap();
    assert_eq!((start.tokens, start.cache.len()), (0, 0));
    let _ = std::fs::remove_file(&path);
}

/// Case D: the first turn (prompt and five answer tokens) saved, the second turn's 20 tokens
/// run in one forward from the state read back, then five more decode steps.
#[test]
fn a_conversation_saved_after_its_first_turn_continues_as_the_reference() {
    let case = "D_two_turn";
    let (model, fingerprint) = load(case);
    let model = model.as_ref();
    let exp = read_safetensors(&golden(case).join("expected.safetensors"));
    let toks = tokens(case);
    let first: Vec<u32> = [ids(&toks, "prompt_ids"), ids(&toks, "decode_input_ids")].concat();
    let path = temp("d.cache");
    save(model, &fingerprint, &first, &[], &path);
    let file = StateFile::open(&path, &fingerprint).unwrap();
    let extension = ids(&toks, "extension_ids");
    let second = [first.clone(), extension.clone()].concat();
    let start = state_file::start_from(&file, model, &second, model.new_cache(), &mut |_, _| {}).unwrap();
    assert_eq!(start.tokens, first.len());
    let mut cache = start.cache;
    let rows = logits(model, &mut cache, &extension, Logits::All);
    let want = &exp["f32.extension.logits"];
    for (i, row) in rows.iter().enumerate() {
        assert!(max_abs_diff(row, want.row(i)) <= TOL, "extension row {i}");
    }
    let decode2 = ids(&toks, "decode2_input_ids");
    let want = &exp["f32.decode2.logits"];
    for (i, &t) in decode2.iter().enumerate() {
        let row = logits(model, &mut cache, &[t], Logits::Last).remove(0);
        assert!(max_abs_diff(&row, want.row(i)) <= TOL, "decode2 step {i}");
        assert_eq!(argmax(&row) as i64, exp["f32.decode2.greedy_next_ids"].data[i] as i64);
    }
    let _ = std::fs::remove_file(&path);
}

#[test]
fn files_from_another_model_or_tokenizer_and_damaged_files_are_refused() {
    let (model, fingerprint) = load("C_sparse_prefill");
    let model = model.as_ref();
    let prompt = ids(&tokens("C_sparse_prefill"), "prompt_ids");
    let path = temp("refused.cache");
    save(model, &fingerprint, &prompt[..300], &[], &path);
    let refused = |path: &Path, fingerprint: &Fingerprint| match StateFile::open(path, fingerprint) {
        Ok(_) => panic!("{} was accepted", path.display()),
        Err(e) => e.to_string(),
    };
    // Another model (case D's weights and config), another tokenizer.
    let (_, other) = load("D_two_turn");
    assert_ne!(other.model, fingerprint.model);
    let message = refused(&path, &other);
    assert!(message.contains("another model") && message.contains("delete it"), "{message}");
    let retokenized = Fingerprint { tokenizer: "0".repeat(32), ..fingerprint.clone() };
    assert!(refused(&path, &retokenized).contains("another tokenizer"));

    // One byte flipped in the data: the digest catches it when the tensor is read.
    let bytes = std::fs::read(&path).unwrap();
    let mut flipped = bytes.clone();
    let at = bytes.len() - 100;
    flipped[at] ^= 0x40;
    let damaged = temp("flipped.cache");
    std::fs::write(&damaged, &flipped).unwrap();
    let message = match StateFile::open(&damaged, &fingerprint) {
        Ok(file) => match state_file::start_from(&file, model, &prompt, model.new_cache(), &mut |_, _| {}) {
            Ok(_) => panic!("a corrupted file was read"),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    };
    assert!(message.contains("corrupt"), "{message}");
    // Truncated, empty, and not a prompt cache at all.
    std::fs::write(&damaged, &bytes[..bytes.len() / 2]).unwrap();
    assert!(refused(&damaged, &fingerprint).contains("prompt cache"));
    std::fs::write(&damaged, b"").unwrap();
    assert!(refused(&damaged, &fingerprint).contains("prompt cache"));
    let message = refused(&golden("C_sparse_prefill").join("model.safetensors"), &fingerprint);
    assert!(message.contains("not a sala prompt cache"), "{message}");
    // A refused file is left as it was.
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    // Only its own files: the folder is shared with the tests running beside it.
    for file in [&path, &damaged] {
        let _ = std::fs::remove_file(file);
    }
}

/// `sala run --prompt-cache`: the first run saves the prompt's state, a second run with a
/// different last question starts from it, and both answer exactly as runs without the file.
#[test]
fn sala_run_keeps_a_document_on_disk_and_answers_the_same() {
    let case = "C_sparse_prefill";
    let prompt = ids(&tokens(case), "prompt_ids");
    let path = temp("run.cache");
    let _ = std::fs::remove_file(&path);
    let run = |ids: &[u32], cache: bool| {
        let list = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_sala"));
        command.args(["run", "--model"]).arg(golden(case));
        command.args(["--input-ids", &list, "--temperature", "0", "--ignore-eos", "--json", "--device", "cpu", "--max-tokens", "4"]);
        command.args(["--prefill-step", "256"]);
        if cache {
            command.arg("--prompt-cache").arg(&path);
        }
        let out = command.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{stderr}");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (json["token_ids"].clone(), stderr)
    };
    let document = &prompt[..1000];
    let ask = |q: &[u32]| [document, q].concat();
    let (first, second) = (ask(&prompt[1000..1100]), ask(&prompt[1200..1260]));
    let (ids, log) = run(&first, true);
    assert!(log.contains("prompt cache: 0 of 1100") && log.contains("saved 1099 tokens"), "{log}");
    assert_eq!(ids, run(&first, false).0);
    // The recurrent layers cannot be cut back to the document's end, and the first run kept no
    // point there (it could not know where its prompt would be left): the second run prefills
    // again, keeping a point where it leaves the first prompt.
    let (ids, log) = run(&second, true);
    assert!(log.contains("prompt cache: 0 of 1060") && log.contains("saved 1059 tokens"), "{log}");
    assert_eq!(ids, run(&second, false).0);
    // A third question restarts at the document's end; the same prompt again, before its last
    // token (nothing new to save).
    let (_, log) = run(&ask(&prompt[1300..1340]), true);
    assert!(log.contains("prompt cache: 1000 of 1040"), "{log}");
    let (_, log) = run(&ask(&prompt[1300..1340]), true);
    assert!(log.contains("prompt cache: 1039 of 1040") && !log.contains("saved"), "{log}");
    let _ = std::fs::remove_file(&path);
}

/// A folder of its own for one test (others remove theirs when done).
fn scratch(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sala-prompt-cache-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Every point of a state file (by its metadata), for reading all it holds as a server does.
fn all_points(path: &Path) -> Vec<usize> {
    let parts = common::state_files::Parts::parse(&std::fs::read(path).unwrap());
    let points: Vec<usize> = serde_json::from_str(&parts.metadata["points"]).unwrap_or_default();
    (0..points.len()).collect()
}

/// A valid state of golden A (attention layers 0 and 3, recurrent 1 and 2) for `fingerprint`.
fn golden_a_state(model: &dyn LanguageModel, fingerprint: &Fingerprint, path: &Path) {
    save(model, fingerprint, &ids(&tokens("A_dense_f32"), "prompt_ids")[..30], &[16], path);
}

/// Files whose digests are valid but whose contents are not a state the model could have made
/// (issue 54): tokens of shape [0] and pooled keys of extreme sizes panicked, NaN keys and a
/// file of only `tokens` or without one layer's keys were continued from. Each is refused, by
/// what is wrong with it, and nothing panics.
#[test]
fn crafted_state_files_are_refused_by_name_without_a_panic() {
    let (model, fingerprint) = load("A_dense_f32");
    let model = model.as_ref();
    let dir = scratch("crafted");
    let valid = dir.join("valid.cache");
    golden_a_state(model, &fingerprint, &valid);
    let file = StateFile::open(&valid, &fingerprint).unwrap();
    file.read(model, &all_points(&valid), &mut |_, _| {}).unwrap();
    let mut failures = Vec::new();
    for (i, (what, bytes, says)) in common::state_files::crafted(&std::fs::read(&valid).unwrap(), 0).into_iter().enumerate() {
        let path = dir.join(format!("crafted-{i}.cache"));
        std::fs::write(&path, &bytes).unwrap();
        let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            StateFile::open(&path, &fingerprint).and_then(|file| file.read(model, &all_points(&path), &mut |_, _| {}).map(|_| ()))
        }));
        match read {
            Err(_) => failures.push(format!("{what}: panicked")),
            Ok(Ok(())) => failures.push(format!("{what}: accepted")),
            Ok(Err(e)) if !e.to_string().contains(says) => failures.push(format!("{what}: refused, but not for `{says}`: {e}")),
            Ok(Err(e)) => println!("{what}: {e}"),
        }
        let _ = std::fs::remove_file(&path);
    }
    assert!(failures.is_empty(), "{failures:#?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `serve --prompt-cache-dir`: each crafted file is skipped with a warning and moved into
/// `rejected/`, the valid one is read back, what interrupted saves left is swept, and the server
/// becomes ready and answers (a panic reading a file left it `503 loading` for good).
#[test]
fn a_server_skips_crafted_state_files_and_becomes_ready() {
    use common::server::{request, Server};
    let model = common::golden_with_tokenizer("A_dense_f32", "prompt-cache-serve", Some(100000));
    let dir = scratch("served");
    let args = ["--device", "cpu", "--cache-memory", "1GB", "--prompt-cache-dir", dir.to_str().unwrap()];
    let chat = r#"{"messages": [{"role": "user", "content": "tell me about foxes"}], "max_tokens": 3, "temperature": 0}"#;
    let mut first = Server::start(&model, &args, 200);
    let r = request(first.port, "POST", "/v1/chat/completions", Some(chat), &[]).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    first.terminate();
    assert!(first.child.wait().unwrap().success());
    let saved: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(saved.len(), 1, "{}", first.stderr());
    let name = saved[0].file_name().unwrap().to_str().unwrap().to_string();
    // This model's files are `<model>-<tokenizer>-<tokens>.prompt-cache`.
    let prefix = &name[..name.len() - "0123456789abcdef.prompt-cache".len()];
    let crafted = common::state_files::crafted(&std::fs::read(&saved[0]).unwrap(), 0);
    let mut planted = Vec::new();
    for (i, (what, bytes, _)) in crafted.iter().enumerate() {
        let path = dir.join(format!("{prefix}{i:016x}.prompt-cache"));
        std::fs::write(&path, bytes).unwrap();
        planted.push((what, path));
    }
    // What a save killed by SIGKILL leaves: a partial file of a process that is gone.
    let partial = dir.join(format!(".{name}.partial-999999999-x1y2z3"));
    std::fs::write(&partial, b"half a file").unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options().write(true).open(&partial).unwrap().set_modified(hour_ago).unwrap();

    let mut second = Server::start(&model, &args, 200);
    let r = request(second.port, "POST", "/v1/chat/completions", Some(chat), &[]).unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0), "the valid state is used: {}", r.body);
    second.terminate();
    assert!(second.child.wait().unwrap().success());
    let log = second.stderr();
    assert!(!log.contains("panicked"), "{log}");
    assert!(log.contains("prompt cache: 1 kept states read from"), "{log}");
    for (what, path) in &planted {
        let moved = dir.join("rejected").join(path.file_name().unwrap());
        assert!(log.contains(&format!("warning: skipped {}", path.display())), "{what} was not skipped: {log}");
        assert!(!path.exists() && moved.is_file(), "{what} was not moved into rejected/");
    }
    assert!(!partial.exists(), "the partial file was not swept");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Golden A with a vocabulary of 2560 (its embedding and output matrices 1.3 MB each, where only
/// tensors up to 1 MiB were digested), the rows past A's own small and distinct, in `dir`.
fn large_vocabulary_model(dir: &Path) {
    use safetensors::tensor::TensorView;
    let golden = golden("A_dense_f32");
    let bytes = std::fs::read(golden.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let vocab = 2560;
    let mut data: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        let mut shape = view.shape().to_vec();
        let mut raw = view.data().to_vec();
        if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
            let extra: Vec<u8> = (0..(vocab - shape[0]) * shape[1]).flat_map(|i| ((i % 97) as f32 * 1e-3).to_le_bytes()).collect();
            raw.extend(extra);
            shape[0] = vocab;
        }
        data.push((name, shape, raw));
    }
    let views: Vec<(String, TensorView)> = data.iter().map(|(n, s, b)| (n.clone(), TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap())).collect();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(golden.join("config.json")).unwrap()).unwrap();
    config["vocab_size"] = vocab.into();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

/// Changes one f32 of the embedding (row 2000, past A's own rows) in place.
fn change_embedding(dir: &Path) {
    let path = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let start = 8 + n + header["model.embed_tokens.weight"]["data_offsets"][0].as_u64().unwrap() as usize;
    let at = start + 4 * (2000 * 128 + 3);
    bytes[at..at + 4].copy_from_slice(&0.5f32.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
}

/// A state made by a model is refused by one that differs in a single value of a tensor larger
/// than 1 MiB (such tensors were left out of the model's digest), whether the change is a copy
/// elsewhere or the same file rewritten with its modification time set back.
#[test]
fn a_model_changed_in_one_large_tensor_refuses_the_state() {
    sala::engine::device::select(Some(sala::engine::device::DeviceKind::Cpu)).unwrap();
    let dir = scratch("large-tensor");
    let (one, other) = (dir.join("one"), dir.join("other"));
    large_vocabulary_model(&one);
    large_vocabulary_model(&other);
    change_embedding(&other);
    let fingerprint = |m: &Path| Fingerprint::of(&sala::models::open(m).unwrap(), mlx_rs::Dtype::Float32).unwrap();
    let model = sala::models::load(&one, Some(mlx_rs::Dtype::Float32)).unwrap();
    let mine = fingerprint(&one);
    let path = dir.join("state.cache");
    golden_a_state(model.as_ref(), &mine, &path);
    StateFile::open(&path, &mine).unwrap();
    assert_ne!(fingerprint(&other).model, mine.model, "a changed embedding went unnoticed");
    let message = StateFile::open(&path, &fingerprint(&other)).err().expect("accepted by another model").to_string();
    assert!(message.contains("another model"), "{message}");

    // The same file changed in place, its modification time set back: digests kept from before
    // the change are not trusted (its change time moved).
    let weights = one.join("model.safetensors");
    let modified = std::fs::metadata(&weights).unwrap().modified().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    change_embedding(&one);
    std::fs::File::options().write(true).open(&weights).unwrap().set_modified(modified).unwrap();
    assert_eq!(std::fs::metadata(&weights).unwrap().modified().unwrap(), modified);
    assert_ne!(fingerprint(&one).model, mine.model, "digests of the file before its change were used");
    assert!(StateFile::open(&path, &fingerprint(&one)).is_err());
    // A plain load fingerprints only the layout (it reads no weights twice), which cannot tell the
    // two apart; state files refuse such a fingerprint outright.
    let layout = |m: &Path| Fingerprint::of_layout(&sala::models::open(m).unwrap(), mlx_rs::Dtype::Float32).unwrap();
    assert_eq!(layout(&one).model, layout(&other).model);
    let message = StateFile::open(&path, &layout(&one)).err().expect("opened with a layout fingerprint").to_string();
    assert!(message.contains("every tensor"), "{message}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The digests of a model's tensors are kept in a cache folder: an entry is written, used while
/// the file is unchanged, and one damaged or of another file is read past (digests made afresh).
#[test]
fn tensor_digests_are_kept_and_a_bad_entry_is_not_trusted() {
    use sala::engine::tensor_digests::of_with_cache;
    let dir = scratch("digest-cache");
    let model = dir.join("model");
    large_vocabulary_model(&model);
    let cache = dir.join("cache");
    let weights = sala::engine::weights::Weights::open(&model).unwrap();
    let fresh = of_with_cache(&weights, None).unwrap();
    assert_eq!(fresh.len(), weights.infos().len());
    assert!(fresh.values().all(|d| d.len() == 32));
    assert_eq!(of_with_cache(&weights, Some(&cache)).unwrap(), fresh);
    let entries: Vec<PathBuf> = std::fs::read_dir(&cache).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    // The entry is what a second call reads: changed digests in it are what comes back.
    let entry = &entries[0];
    let text = std::fs::read_to_string(entry).unwrap();
    let first = fresh.values().next().unwrap();
    std::fs::write(entry, text.replace(first.as_str(), &"e".repeat(32))).unwrap();
    assert!(of_with_cache(&weights, Some(&cache)).unwrap().values().any(|d| *d == "e".repeat(32)), "the kept digests were not used");
    // Damaged, or naming another file or identity: read past and rewritten.
    for bad in ["{not json".to_string(), text.replace("\"file\":\"", "\"file\":\"/elsewhere"), text.replace("ino=", "ino=1")] {
        std::fs::write(entry, bad).unwrap();
        assert_eq!(of_with_cache(&weights, Some(&cache)).unwrap(), fresh);
        assert_eq!(std::fs::read_to_string(entry).unwrap(), text);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sala run --prompt-cache` with a one-token prompt (whose state to keep, all but its last
/// token, is empty) panicked while saving; it answers, and an existing file is left as it was.
#[test]
fn sala_run_with_a_one_token_prompt_answers_and_keeps_the_file() {
    let dir = scratch("one-token");
    let path = dir.join("one.cache");
    let run = |list: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sala"))
            .args(["run", "--model"])
            .arg(golden("A_dense_f32"))
            .args(["--input-ids", list, "--temperature", "0", "--ignore-eos", "--json", "--device", "cpu", "--max-tokens", "3", "--prompt-cache"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{stderr}");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(json["token_ids"].as_array().map(Vec::len), Some(3), "{json}");
        stderr
    };
    let log = run("5");
    assert!(log.contains("a one-token prompt leaves no state to keep") && !path.exists(), "{log}");
    assert!(std::fs::read_dir(&dir).unwrap().next().is_none(), "a partial file was left");
    let log = run("5,6,7,8");
    assert!(log.contains("saved 3 tokens"), "{log}");
    let saved = std::fs::read(&path).unwrap();
    let log = run("5");
    assert!(log.contains("prompt cache: 0 of 1 prompt tokens"), "{log}");
    assert_eq!(std::fs::read(&path).unwrap(), saved, "the document's state was overwritten");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A symlink planted where a save writes aside (`.NAME.partial-PID`, the name earlier versions
/// used) is never written through: the file it points to is unchanged, and the state lands as a
/// file of its own.
#[test]
fn a_planted_symlink_beside_a_prompt_cache_is_not_followed() {
    let (model, fingerprint) = load("A_dense_f32");
    let dir = scratch("symlink");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    let path = dir.join("doc.cache");
    let planted = dir.join(format!(".doc.cache.partial-{}", std::process::id()));
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    golden_a_state(model.as_ref(), &fingerprint, &path);
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_file());
    StateFile::open(&path, &fingerprint).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// What interrupted saves left in a `--prompt-cache-dir` (partial files of processes that are
/// gone) is swept when the folder is opened, and beside a `--prompt-cache` file when it is
/// written; this process's own, one being written now, and other files stay. A symlink is
/// removed, not what it points to.
#[test]
fn partial_files_of_interrupted_saves_are_swept() {
    use sala::engine::state_file::StateDir;
    let (model, fingerprint) = load("A_dense_f32");
    let dir = scratch("sweep");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    let ago = |secs: u64| std::time::SystemTime::now() - std::time::Duration::from_secs(secs);
    let plant = |name: &str, age: u64| {
        let path = dir.join(name);
        std::fs::write(&path, b"half").unwrap();
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(ago(age)).unwrap();
        path
    };
    let gone = 999_999_999; // above any pid_max
    let swept = [
        plant(&format!(".a.prompt-cache.partial-{gone}-Xy12Zq"), 3600),
        plant(&format!(".b.prompt-cache.partial-{gone}"), 3600),
        // A running process's (init), untouched for two days: stale.
        plant(".c.prompt-cache.partial-1-aaaaaa", 2 * 86400),
    ];
    let link = dir.join(format!(".d.prompt-cache.partial-{gone}-bbbbbb"));
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    set_symlink_mtime(&link, 3600);
    let kept = [
        plant(&format!(".e.prompt-cache.partial-{}-cccccc", std::process::id()), 3600),
        plant(&format!(".f.prompt-cache.partial-{gone}-dddddd"), 0),
        plant(".g.prompt-cache.partial-1-eeeeee", 3600),
        plant("notes.partial-999999999", 3600),
    ];
    StateDir::new(&dir, &fingerprint).unwrap();
    for path in swept.iter().chain([&link]) {
        assert!(std::fs::symlink_metadata(path).is_err(), "{} was not swept", path.display());
    }
    for path in &kept {
        assert!(path.exists(), "{} was swept", path.display());
    }
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");

    // Beside a file being written: its own partial files only.
    let mine = plant(&format!(".doc.cache.partial-{gone}-ffffff"), 3600);
    let other = plant(&format!(".other.cache.partial-{gone}-gggggg"), 3600);
    golden_a_state(model.as_ref(), &fingerprint, &dir.join("doc.cache"));
    assert!(!mine.exists() && other.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Sets a symlink's own modification time `secs` in the past.
fn set_symlink_mtime(path: &Path, secs: i64) {
    use std::os::unix::ffi::OsStrExt;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let time = libc::timespec { tv_sec: now - secs, tv_nsec: 0 };
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string and two timespecs, as utimensat takes.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), [time, time].as_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
    assert_eq!(rc, 0, "utimensat: {}", std::io::Error::last_os_error());
}

/// A `--prompt-cache-dir` read back by the library: crafted files are skipped and moved into
/// `rejected/` (never read again), a file of an 8-bit KV cache (`--kv-bits 8`) is skipped but
/// left where it is, for a run with that flag, and the valid one is read.
#[test]
fn a_state_dir_moves_crafted_files_aside_and_reads_the_rest() {
    use sala::engine::state_file::StateDir;
    let (model, fingerprint) = load("A_dense_f32");
    let model = model.as_ref();
    let dir = scratch("state-dir");
    let name = |i: usize| dir.join(format!("{}-{}-{i:016x}.prompt-cache", &fingerprint.model[..16], &fingerprint.tokenizer[..16]));
    golden_a_state(model, &fingerprint, &name(0));
    let crafted = common::state_files::crafted(&std::fs::read(name(0)).unwrap(), 3);
    for (i, (_, bytes, _)) in crafted.iter().enumerate() {
        std::fs::write(name(i + 1), bytes).unwrap();
    }
    let mut quantized = sala::models::load(&golden("A_dense_f32"), Some(mlx_rs::Dtype::Float32)).unwrap();
    quantized.set_kv_bits(8).unwrap();
    let eight_bit = name(999);
    golden_a_state(quantized.as_ref(), &fingerprint, &eight_bit);
    let store = StateDir::new(&dir, &fingerprint).unwrap();
    let (states, mut skipped) = store.load(model, u64::MAX, &mut |_, _| {}).unwrap();
    assert_eq!(states.len(), 1);
    assert_eq!(skipped.len(), crafted.len() + 1);
    let left = skipped.iter().position(|s| s.path == eight_bit).unwrap();
    let left = skipped.remove(left);
    assert!(left.moved_to.is_none() && eight_bit.is_file() && left.error.to_string().contains("--kv-bits"), "{}", left.error);
    for s in &skipped {
        assert!(!s.error.to_string().contains("panicked"), "{}", s.error);
        let to = dir.join("rejected").join(s.path.file_name().unwrap());
        assert_eq!(s.moved_to.as_deref(), Some(to.as_path()), "{}", s.error);
        assert!(to.is_file() && !s.path.exists());
    }
    let (states, skipped) = store.load(model, u64::MAX, &mut |_, _| {}).unwrap();
    assert!(states.len() == 1 && skipped.len() == 1, "rejected files are not read again");
    let _ = std::fs::remove_dir_all(&dir);
}
