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
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
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
