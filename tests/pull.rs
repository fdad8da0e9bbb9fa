//! `sala pull` against a local server that speaks the hub's file protocol: the repo API with
//! `blobs=true`, `resolve` URLs answering with a redirect and the X-Repo-Commit / ETag /
//! X-Linked-Etag / X-Linked-Size headers, a "CDN" serving Range requests — and faults: a
//! connection cut mid-file, a corrupted byte, a half-finished download left by an earlier run.

mod common;

use common::hub::*;

#[test]
fn pull_survives_a_cut_and_a_corrupt_byte_and_verifies_everything() {
    let faults = Faults {
        cut_once: ["model.safetensors"].into_iter().collect(),
        corrupt_once: ["extra/notes.bin"].into_iter().collect(),
    };
    let hub = start_hub(faults);
    let cache = temp_cache("faults");
    let out = sala(&cache, &hub, &["pull", REPO], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("3 files"), "{stderr}");

    // Every file is in the snapshot, byte for byte.
    let snapshot = cache.join("models--test-org--tiny-sala/snapshots").join(COMMIT);
    for f in &hub.files {
        assert!(std::fs::read(snapshot.join(f.name)).unwrap() == f.data, "{} differs", f.name);
    }
    assert_eq!(std::fs::read_to_string(cache.join("models--test-org--tiny-sala/refs/main")).unwrap().trim(), COMMIT);
    {
        let log = hub.log.lock().unwrap();
        // The cut download was resumed with a Range request from where it stopped...
        let model_len = hub.file("model.safetensors").unwrap().data.len() as u64;
        let model: Vec<u64> = log.data_requests.iter().filter(|(n, _)| n == "model.safetensors").map(|r| r.1).collect();
        assert!(model.len() >= 2 && model[0] == 0 && model[1] > 0 && model[1] < model_len, "{model:?}");
        // ...and the corrupted file was fetched again from scratch.
        let notes: Vec<u64> = log.data_requests.iter().filter(|(n, _)| n == "extra/notes.bin").map(|r| r.1).collect();
        assert_eq!(notes, vec![0, 0], "corrupt file must be re-fetched once");
        assert!(stderr.contains("sha256"), "the corruption is reported: {stderr}");
        assert!(log.authorization.iter().all(|a| a == "Bearer test-token") && !log.authorization.is_empty());
    }

    // The pulled model runs by name.
    let run = sala(&cache, &hub, &["run", "--model", REPO, "--input-ids", "1,2,3", "--max-tokens", "2", "--temperature", "0", "--json"], &[]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));

    // Pulling again downloads nothing; offline mode uses the store.
    let before = hub.log.lock().unwrap().data_requests.len();
    let again = sala(&cache, &hub, &["pull", REPO], &[]);
    assert!(again.status.success() && String::from_utf8_lossy(&again.stderr).contains("3 already here"));
    assert_eq!(hub.log.lock().unwrap().data_requests.len(), before);
    let offline = sala(&cache, &hub, &["pull", REPO], &[("HF_HUB_OFFLINE", "1")]);
    assert!(offline.status.success());
    let missing = sala(&cache, &hub, &["pull", "test-org/absent"], &[("HF_HUB_OFFLINE", "1")]);
    assert!(String::from_utf8_lossy(&missing.stderr).contains("HF_HUB_OFFLINE is set"));
    std::fs::remove_dir_all(cache).unwrap();
}

#[test]
fn an_interrupted_pull_resumes_from_its_part_file() {
    let hub = start_hub(Faults::default());
    let cache = temp_cache("resume");
    // What an interrupted run leaves: the first 40% of the blob in `<etag>.part`.
    let model = hub.file("model.safetensors").unwrap();
    let blobs = cache.join("models--test-org--tiny-sala/blobs");
    std::fs::create_dir_all(&blobs).unwrap();
    let done = model.data.len() * 2 / 5;
    std::fs::write(blobs.join(format!("{}.part", common::sha256_hex(&model.data))), &model.data[..done]).unwrap();
    let out = sala(&cache, &hub, &["pull", REPO], &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let requests: Vec<u64> = hub.log.lock().unwrap().data_requests.iter().filter(|(n, _)| n == "model.safetensors").map(|r| r.1).collect();
    assert_eq!(requests, vec![done as u64], "must ask only for the missing bytes");
    let snapshot = cache.join("models--test-org--tiny-sala/snapshots").join(COMMIT);
    assert!(std::fs::read(snapshot.join("model.safetensors")).unwrap() == model.data);
    std::fs::remove_dir_all(cache).unwrap();
}
