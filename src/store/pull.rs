//! `sala pull`: fetch a model repo into the hub cache with the `hf-hub` crate, then verify every
//! file against what the hub says it is — its size, and the sha256 of LFS files — re-fetching a
//! corrupt file once before giving up. hf-hub resumes interrupted downloads from their `.part`
//! files (Range requests) and retries dropped connections; HF_HOME / HF_HUB_CACHE, HF_ENDPOINT,
//! HF_TOKEN and HF_HUB_OFFLINE are honoured.

use super::cache::{cache_dir, ModelRef};
use crate::engine::error::{Error, Result};
use hf_hub::api::sync::{ApiBuilder, ApiRepo};
use hf_hub::{Repo, RepoType};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// The repository `sala pull` fetches when none is named.
pub const DEFAULT_REPO: &str = "moxin-org/MiniCPM4-SALA-9B-8bit-mlx";

/// One file of the repo as the hub lists it.
#[derive(Debug, Clone)]
pub struct RemoteFile {
    pub name: String,
    pub size: Option<u64>,
    /// LFS files only.
    pub sha256: Option<String>,
}

/// What a pull did.
pub struct Pulled {
    pub snapshot: PathBuf,
    pub files: usize,
    pub bytes: u64,
    /// Files that were already complete in the cache.
    pub reused: usize,
}

/// Whether HF_HUB_OFFLINE asks for the store only (the values huggingface_hub accepts).
pub fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

fn hub_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Usage(format!("{what}: {e}"))
}

/// Counters another thread can watch while a pull runs (the server's download status).
#[derive(Debug, Default)]
pub struct PullProgress {
    pub total_bytes: AtomicU64,
    pub done_bytes: AtomicU64,
    pub files_total: AtomicUsize,
    pub files_done: AtomicUsize,
    pub cancelled: std::sync::atomic::AtomicBool,
}

impl PullProgress {
    /// Asks the pull to stop.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }
}

/// A per-file progress bar (bytes, rate, ETA) in `bars`, mirrored into the counters.
struct FileBar(indicatif::ProgressBar, Arc<PullProgress>);

impl hf_hub::api::Progress for FileBar {
    fn init(&mut self, size: usize, filename: &str) {
        self.0.set_length(size as u64);
        self.0.set_message(filename.to_string());
    }
    fn update(&mut self, size: usize) {
        self.0.inc(size as u64);
        self.1.done_bytes.fetch_add(size as u64, Ordering::Relaxed);
    }
    fn finish(&mut self) {}
}

pub fn pull(reference: &ModelRef, bars: &indicatif::MultiProgress, progress: Arc<PullProgress>) -> Result<Pulled> {
    let cache = cache_dir();
    if offline() {
        let snapshot = reference.snapshot(&cache).ok_or_else(|| {
            Error::Usage(format!("HF_HUB_OFFLINE is set and {} is not in the model store ({})", reference.repo, cache.display()))
        })?;
        return Ok(Pulled { snapshot, files: 0, bytes: 0, reused: 0 });
    }
    let mut builder = ApiBuilder::from_env().with_cache_dir(cache.clone()).with_progress(false).with_retries(5);
    if let Ok(token) = std::env::var("HF_TOKEN") {
        builder = builder.with_token(Some(token));
    }
    let api = builder.build().map_err(|e| hub_error("setting up the hub client", e))?;
    let repo = api.repo(Repo::with_revision(reference.repo.clone(), RepoType::Model, reference.revision.clone()));
    let (commit, files) = list_files(&repo, reference)?;
    let snapshot = reference.repo_dir(&cache).join("snapshots").join(&commit);
    let mut pulled = Pulled { snapshot: snapshot.clone(), files: files.len(), bytes: 0, reused: 0 };
    progress.files_total.store(files.len(), Ordering::Relaxed);
    progress.total_bytes.store(files.iter().filter_map(|f| f.size).sum(), Ordering::Relaxed);
    for file in &files {
        if !safe_name(&file.name) {
            return Err(hub_error(&reference.repo, format!("the hub lists a file `{}` that is not a safe relative path", file.name)));
        }
        let local = snapshot.join(&file.name);
        if local.is_file() && verify(&local, file).is_ok() {
            pulled.reused += 1;
            pulled.bytes += file.size.unwrap_or(0);
            progress.done_bytes.fetch_add(file.size.unwrap_or(0), Ordering::Relaxed);
            progress.files_done.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let style = indicatif::ProgressStyle::with_template("{msg:30!} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("valid template");
        let mut attempt = 0;
        let done_before = progress.done_bytes.load(Ordering::Relaxed);
        loop {
            progress.done_bytes.store(done_before, Ordering::Relaxed);
            let bar = bars.add(indicatif::ProgressBar::new(file.size.unwrap_or(0)).with_style(style.clone()));
            let path = repo
                .download_with_progress(&file.name, FileBar(bar.clone(), progress.clone()))
                .map_err(|e| hub_error(&format!("downloading {}/{}", reference.repo, file.name), e))?;
            bar.finish_and_clear();
            match verify(&path, file) {
                Ok(()) => break,
                Err(problem) if attempt == 0 => {
                    // Never keep a corrupt file: drop the blob and its link, fetch once more.
                    bars.suspend(|| eprintln!("{}: {problem}; fetching it again", file.name));
                    discard(&path);
                    attempt += 1;
                }
                Err(problem) => {
                    discard(&path);
                    return Err(hub_error(&format!("{}/{}", reference.repo, file.name), problem));
                }
            }
        }
        pulled.bytes += file.size.unwrap_or(0);
        // A resumed download counts the bytes it had already.
        progress.done_bytes.store(done_before + file.size.unwrap_or(0), Ordering::Relaxed);
        progress.files_done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(pulled)
}

/// The commit the revision resolves to and the repo's files (`/api/models/{repo}/revision/{rev}?blobs=true`).
fn list_files(repo: &ApiRepo, reference: &ModelRef) -> Result<(String, Vec<RemoteFile>)> {
    let mut response = repo
        .info_request()
        .query("blobs", "true")
        .call()
        .map_err(|e| hub_error(&format!("looking up {}@{}", reference.repo, reference.revision), e))?;
    let info: Value = response
        .body_mut()
        .read_json()
        .map_err(|e| hub_error(&format!("reading the hub's answer for {}", reference.repo), e))?;
    let commit = info
        .get("sha")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric()))
        .ok_or_else(|| hub_error(&reference.repo, "the hub's answer has no commit (`sha`)"))?
        .to_string();
    let siblings = info
        .get("siblings")
        .and_then(Value::as_array)
        .ok_or_else(|| hub_error(&reference.repo, "the hub's answer lists no files (`siblings`)"))?;
    let mut files: Vec<RemoteFile> = siblings
        .iter()
        .filter_map(|s| {
            let lfs = s.get("lfs");
            Some(RemoteFile {
                name: s.get("rfilename")?.as_str()?.to_string(),
                size: lfs.and_then(|l| l.get("size")).or_else(|| s.get("size")).and_then(Value::as_u64),
                sha256: lfs.and_then(|l| l.get("sha256")).and_then(Value::as_str).map(str::to_string),
            })
        })
        .collect();
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((commit, files))
}

fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('/')
        && !name.contains('\\')
        && name.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
}

/// Checks size and (LFS) sha256; the error says what differs.
pub fn verify(path: &Path, file: &RemoteFile) -> std::result::Result<(), String> {
    let len = std::fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?.len();
    if let Some(size) = file.size {
        if len != size {
            return Err(format!("size {len} bytes, the hub says {size}"));
        }
    }
    if let Some(expected) = &file.sha256 {
        let mut hasher = Sha256::new();
        let mut f = std::fs::File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).map_err(|e| format!("cannot read it: {e}"))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        let got: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
        if &got != expected {
            return Err(format!("sha256 {got}, the hub says {expected}"));
        }
    }
    Ok(())
}

/// Removes a snapshot link and the blob behind it.
fn discard(link: &Path) {
    if let Ok(blob) = std::fs::canonicalize(link) {
        let _ = std::fs::remove_file(blob);
    }
    let _ = std::fs::remove_file(link);
}
