//! `sala pull`: fetch a model repo into the hub cache (laid out as huggingface_hub does, see
//! [`super::cache`]), then verify every file against what the hub says it is — its size, and the
//! sha256 of LFS files — fetching a corrupt file once more before giving up.
//!
//! A small client of the hub's file protocol on the agent of [`super::http`] (timeouts on every
//! wait):
//!
//!   GET {endpoint}/api/models/{repo}/revision/{revision}?blobs=true   the commit and the files
//!   GET {endpoint}/{repo}/resolve/{revision}/{file}                   the file, or a redirect to
//!       a CDN; either way with X-Repo-Commit, ETag / X-Linked-Etag (the blob's name) and
//!       X-Linked-Size headers
//!
//! A file downloads into `blobs/{etag}.part` (never through a symlink planted there); a dropped,
//! stalled or dripping connection is retried 5 times with backoff, each time continuing with
//! `Range: bytes=N-`, and a later run continues the same way. A body may not run past the size
//! the hub lists (or, for a file it gives no size for, the one the response states, else
//! [`HubConfig::unsized_limit`]). A finished file is renamed to `blobs/{etag}` and linked from
//! `snapshots/{commit}/{file}`; `refs/{revision}` names the commit, written last, so the store
//! lists the snapshot only once everything is in and verified. Cancelling the pull's
//! [`PullProgress`] stops it between files or chunks (or after a read that timed out), keeping
//! the `.part` file. HF_HOME /
//! HF_HUB_CACHE, HF_ENDPOINT, HF_TOKEN, HF_HUB_OFFLINE and HF_HUB_DOWNLOAD_TIMEOUT are honoured.

use super::cache::{cache_dir, ModelRef};
use super::http;
use crate::engine::error::{Error, Result};
use crate::engine::memory::human;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The repository `sala pull` fetches when none is named.
pub const DEFAULT_REPO: &str = "moxin-org/MiniCPM4-SALA-9B-8bit-mlx";

/// The hub when HF_ENDPOINT is not set.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Attempts after the first for one request or download (as huggingface_hub and hf-hub).
const RETRIES: u32 = 5;

/// Bytes asked of the network between two checks for cancellation.
const CHUNK: usize = 256 << 10;

/// The most a repo listing may take (thousands of files are a few MB).
const LISTING_LIMIT: u64 = 256 << 20;

/// The most a file may take when neither the hub nor the response gives its size. The hub lists
/// the size of every file, and stores any above 10 MB in LFS with a size and a sha256, so only a
/// hub that leaves sizes out reaches this.
pub const UNSIZED_LIMIT: u64 = 256 << 20;

/// Relative redirects followed to reach the hub's answer for a file (renamed repos).
const MAX_REDIRECTS: usize = 10;

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
    /// Files the hub gave neither a size nor a sha256 for, so nothing could be checked.
    pub unchecked: usize,
}

/// Whether HF_HUB_OFFLINE asks for the store only (the values huggingface_hub accepts).
pub fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE").is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

/// Counters another thread can watch while a pull runs (the server's download status), and the
/// switch that cancels it.
#[derive(Debug, Default)]
pub struct PullProgress {
    pub total_bytes: AtomicU64,
    pub done_bytes: AtomicU64,
    pub files_total: AtomicUsize,
    pub files_done: AtomicUsize,
    pub cancelled: AtomicBool,
}

impl PullProgress {
    /// Asks the pull to stop at its next check: between files, between chunks of a download, or
    /// after a read that timed out (so within one chunk or HF_HUB_DOWNLOAD_TIMEOUT). It returns
    /// an error saying it was cancelled and keeps the `.part` file for a later pull to resume.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Relaxed);
    }

    /// Whether [`PullProgress::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }
}

/// Where a pull finds the hub and the store, and how long it waits for the network (no `Debug`:
/// it holds the token).
#[derive(Clone)]
pub struct HubConfig {
    /// Without a trailing `/`.
    pub endpoint: String,
    /// Sent as `Authorization: Bearer` to the hub (not to a CDN it redirects to).
    pub token: Option<String>,
    /// The store, see [`cache_dir`].
    pub cache: PathBuf,
    /// Connect timeout, and the longest wait for a response or for each read of it.
    pub timeout: Duration,
    /// Use the store only.
    pub offline: bool,
    /// The most a file may take when neither the hub nor the response gives its size.
    pub unsized_limit: u64,
}

impl HubConfig {
    /// HF_ENDPOINT, HF_TOKEN, HF_HUB_CACHE / HF_HOME, HF_HUB_DOWNLOAD_TIMEOUT and HF_HUB_OFFLINE.
    pub fn from_env() -> Result<Self> {
        let endpoint = std::env::var("HF_ENDPOINT").ok().filter(|e| !e.trim().is_empty());
        Ok(Self {
            endpoint: endpoint.as_deref().unwrap_or(DEFAULT_ENDPOINT).trim().trim_end_matches('/').to_string(),
            token: std::env::var("HF_TOKEN").ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty()),
            cache: cache_dir(),
            timeout: http::timeout_from_env()?,
            offline: offline(),
            unsized_limit: UNSIZED_LIMIT,
        })
    }
}

/// Pulls `reference` with the settings of the environment ([`HubConfig::from_env`]).
pub fn pull(reference: &ModelRef, bars: &indicatif::MultiProgress, progress: Arc<PullProgress>) -> Result<Pulled> {
    pull_with(&HubConfig::from_env()?, reference, bars, progress)
}

/// Pulls `reference` from `config`'s hub into its store: per-file bars in `bars`, counters in
/// `progress` (whose [`PullProgress::cancel`] stops it).
pub fn pull_with(config: &HubConfig, reference: &ModelRef, bars: &indicatif::MultiProgress, progress: Arc<PullProgress>) -> Result<Pulled> {
    let cache = &config.cache;
    if config.offline {
        let snapshot = reference.snapshot(cache).ok_or_else(|| {
            Error::Usage(format!("HF_HUB_OFFLINE is set and {} is not in the model store ({})", reference.repo, cache.display()))
        })?;
        return Ok(Pulled { snapshot, files: 0, bytes: 0, reused: 0, unchecked: 0 });
    }
    let client = Client { config, agent: http::agent(config.timeout), reference, progress: &progress, bars };
    let (commit, files) = client.list_files()?;
    let repo_dir = reference.repo_dir(cache);
    let snapshot = repo_dir.join("snapshots").join(&commit);
    let mut pulled = Pulled { snapshot: snapshot.clone(), files: files.len(), bytes: 0, reused: 0, unchecked: 0 };
    let total: u64 = files.iter().filter_map(|f| f.size).sum();
    progress.files_total.store(files.len(), Ordering::Relaxed);
    progress.total_bytes.store(total, Ordering::Relaxed);
    let announce = format!("{}@{}: {} files, {}", reference.repo, reference.revision, files.len(), human(total));
    if bars.is_hidden() {
        eprintln!("{announce}");
    } else {
        let _ = bars.println(announce);
    }
    for file in &files {
        client.check_cancelled()?;
        if !safe_name(&file.name) {
            return Err(Error::Usage(format!(
                "{}: the hub lists a file `{}` that is not a safe relative path",
                reference.repo, file.name
            )));
        }
        let local = snapshot.join(&file.name);
        let done_before = progress.done_bytes.load(Ordering::Relaxed);
        let (bytes, reused, checked) = if local.is_file() && verify(&local, file).is_ok() {
            (file.size.unwrap_or(0), true, file.size.is_some() || file.sha256.is_some())
        } else {
            client.fetch_file(&commit, file, &repo_dir, &local, done_before)?
        };
        pulled.bytes += bytes;
        pulled.reused += usize::from(reused);
        pulled.unchecked += usize::from(!checked);
        // A resumed download counts the bytes it had already.
        progress.done_bytes.store(done_before + bytes, Ordering::Relaxed);
        progress.files_done.fetch_add(1, Ordering::Relaxed);
    }
    std::fs::create_dir_all(&snapshot).map_err(|e| Error::io(&snapshot, e))?;
    // Last: the ref is what makes the snapshot count as a model (see `cache::ModelRef::snapshot`).
    write_ref(&repo_dir, &reference.revision, &commit)?;
    Ok(pulled)
}

/// Why one attempt at a request failed.
enum Failure {
    /// Another attempt may succeed (a timeout, a dropped connection, a busy server); whether it
    /// timed out.
    Transient(String, bool),
    /// The hub will answer the same again.
    Fatal(String),
    /// Stop with this error: cancelled, or the disk failed.
    Stop(Error),
}

/// The hub's answer for one file, before any redirect to a CDN.
struct FileHead {
    /// The blob's name: X-Linked-Etag (LFS files: their sha256), else ETag, unquoted.
    etag: String,
    commit: Option<String>,
    /// X-Linked-Size (LFS files).
    size: Option<u64>,
}

struct Client<'a> {
    config: &'a HubConfig,
    agent: ureq::Agent,
    reference: &'a ModelRef,
    progress: &'a PullProgress,
    bars: &'a indicatif::MultiProgress,
}

impl Client<'_> {
    fn check_cancelled(&self) -> Result<()> {
        if self.progress.is_cancelled() {
            return Err(Error::Usage(format!("download of {} cancelled", self.reference.repo)));
        }
        Ok(())
    }

    /// A GET with the token; `Accept-Encoding: identity` so that byte ranges count the file's bytes.
    fn get(&self, url: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        let request = self.agent.get(url).header("Accept-Encoding", "identity");
        match &self.config.token {
            Some(token) => request.header("Authorization", format!("Bearer {token}")),
            None => request,
        }
    }

    /// A failed request as a [`Failure`], with the fix where the hub's answer implies one.
    fn failure(&self, url: &str, error: ureq::Error) -> Failure {
        let problem = http::describe(url, &error, self.config.timeout);
        if http::is_transient(&error) {
            return Failure::Transient(problem, matches!(error, ureq::Error::Timeout(_)));
        }
        let fix = match error {
            ureq::Error::StatusCode(401) => {
                "; the repo is private, gated or absent: set HF_TOKEN to a token that can read it, and check the name"
            }
            ureq::Error::StatusCode(403) => "; HF_TOKEN may not read it (a gated model: accept its terms on the hub first)",
            ureq::Error::StatusCode(404) => "; check the repo id, the revision and HF_ENDPOINT",
            ureq::Error::HostNotFound => "; check the network and HF_ENDPOINT",
            _ => "",
        };
        Failure::Fatal(format!("{problem}{fix}"))
    }

    /// Runs `attempt` until it succeeds, retrying transient failures with backoff; `resumable`
    /// when a later pull continues what the attempts fetched.
    fn retrying<T>(&self, what: &str, resumable: bool, mut attempt: impl FnMut() -> Result<T, Failure>) -> Result<T> {
        let mut retries = 0;
        loop {
            self.check_cancelled()?;
            let (problem, timed_out) = match attempt() {
                Ok(value) => return Ok(value),
                Err(Failure::Stop(e)) => return Err(e),
                Err(Failure::Fatal(problem)) => return Err(Error::Usage(format!("{what}: {problem}"))),
                Err(Failure::Transient(problem, timed_out)) => (problem, timed_out),
            };
            self.check_cancelled()?;
            if retries == RETRIES {
                let slow = if timed_out { format!(", or raise {} for a slow link", http::TIMEOUT_VAR) } else { String::new() };
                let resume = if resumable { "; `sala pull` again resumes where this stopped" } else { "" };
                return Err(Error::Usage(format!(
                    "{what}: {problem}; gave up after {} attempts. Check the network and HF_ENDPOINT ({}){slow}{resume}",
                    RETRIES + 1,
                    self.config.endpoint
                )));
            }
            retries += 1;
            self.bars.suspend(|| eprintln!("{what}: {problem}; retrying ({retries} of {RETRIES})"));
            self.pause(backoff(retries))?;
        }
    }

    /// Sleeps, waking early to stop when cancelled.
    fn pause(&self, wait: Duration) -> Result<()> {
        let until = Instant::now() + wait;
        while let Some(left) = until.checked_duration_since(Instant::now()).filter(|d| !d.is_zero()) {
            self.check_cancelled()?;
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
        self.check_cancelled()
    }

    /// The commit the revision resolves to and the repo's files (`/api/models/{repo}/revision/{rev}?blobs=true`).
    fn list_files(&self) -> Result<(String, Vec<RemoteFile>)> {
        let (repo, revision) = (&self.reference.repo, &self.reference.revision);
        let url = format!("{}/api/models/{repo}/revision/{}?blobs=true", self.config.endpoint, encode(revision, false));
        let info: Value = self.retrying(&format!("looking up {repo}@{revision}"), false, || {
            let mut response = self.get(&url).call().map_err(|e| self.failure(&url, e))?;
            let mut body = Vec::new();
            let reader = response.body_mut().with_config().limit(LISTING_LIMIT).reader();
            http::Paced::new(reader, self.config.timeout).read_to_end(&mut body).map_err(|e| self.read_failure(&url, e))?;
            serde_json::from_slice(&body).map_err(|e| {
                Failure::Fatal(format!("{url} answered with something that is not JSON ({e}); is HF_ENDPOINT a hub?"))
            })
        })?;
        let bad = |what: &str| Error::Usage(format!("{repo}: the hub's answer {what}"));
        let commit = info
            .get("sha")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric()))
            .ok_or_else(|| bad("has no commit (`sha`)"))?
            .to_string();
        let siblings = info.get("siblings").and_then(Value::as_array).ok_or_else(|| bad("lists no files (`siblings`)"))?;
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

    /// A failed read of a body as a [`Failure`]: one too slow ([`http::TooSlow`]) may go faster
    /// on another attempt.
    fn read_failure(&self, url: &str, error: std::io::Error) -> Failure {
        match http::TooSlow::within(&error) {
            Some(slow) => Failure::Transient(format!("{url}: {slow}"), true),
            None => self.failure(url, error.into()),
        }
    }

    /// Brings one file into its blob and links it at `link`; a file that fails verification is
    /// fetched once more from the start. Returns its size, whether its blob was there already, and
    /// whether the hub gave a size or sha256 to check it by.
    fn fetch_file(&self, commit: &str, file: &RemoteFile, repo_dir: &Path, link: &Path, done_before: u64) -> Result<(u64, bool, bool)> {
        let (repo, revision) = (&self.reference.repo, &self.reference.revision);
        let url = format!("{}/{repo}/resolve/{}/{}", self.config.endpoint, encode(revision, false), encode(&file.name, true));
        let what = format!("downloading {repo}/{}", file.name);
        let head = self.retrying(&what, false, || self.head(&url))?;
        if let Some(served) = head.commit.as_deref().filter(|c| *c != commit) {
            return Err(Error::Usage(format!(
                "{what}: the hub serves it from commit {served}, but listed `{revision}` at {commit} (the revision moved); run `sala pull` again"
            )));
        }
        // The listing's numbers win; the headers fill in what it lacks.
        let expected = RemoteFile { size: file.size.or(head.size), ..file.clone() };
        let checked = expected.size.is_some() || expected.sha256.is_some();
        let blobs = repo_dir.join("blobs");
        std::fs::create_dir_all(&blobs).map_err(|e| Error::io(&blobs, e))?;
        let blob = blobs.join(&head.etag);
        let depth = file.name.split('/').count();
        if blob.is_file() && verify(&blob, &expected).is_ok() {
            link_blob(&head.etag, depth, link)?;
            return Ok((file_len(&blob), true, checked));
        }
        let part = blobs.join(format!("{}.part", head.etag));
        let style = indicatif::ProgressStyle::with_template("{msg:30!} {bar:30} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("valid template");
        let mut fetched_again = false;
        loop {
            let bar = self.bars.add(indicatif::ProgressBar::new(expected.size.unwrap_or(0)).with_style(style.clone()));
            bar.set_message(file.name.clone());
            let downloaded = self.retrying(&what, true, || self.download(&url, &part, &expected, &bar, done_before));
            bar.finish_and_clear();
            downloaded?;
            match verify(&part, &expected) {
                Ok(()) => break,
                Err(problem) => {
                    // Never keep a corrupt file: drop it and fetch it once more from the start.
                    let _ = std::fs::remove_file(&part);
                    if fetched_again {
                        return Err(Error::Usage(format!(
                            "{repo}/{}: {problem} again after a fresh download; the hub's copy may be damaged",
                            file.name
                        )));
                    }
                    self.bars.suspend(|| eprintln!("{}: {problem}; fetching it again", file.name));
                    fetched_again = true;
                }
            }
        }
        std::fs::rename(&part, &blob).map_err(|e| Error::io(&blob, e))?;
        link_blob(&head.etag, depth, link)?;
        Ok((file_len(&blob), false, checked))
    }

    /// The hub's headers for a file: its answer to `resolve` (one byte asked for), following only
    /// relative redirects (a renamed repo); an absolute one leads to the CDN and is not followed.
    fn head(&self, url: &str) -> Result<FileHead, Failure> {
        let mut url = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            let response = self
                .get(&url)
                .header("Range", "bytes=0-0")
                .config()
                .max_redirects(0)
                .build()
                .call()
                .map_err(|e| self.failure(&url, e))?;
            let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::trim);
            if response.status().is_redirection() {
                if let Some(location) = header("location").filter(|l| l.starts_with('/') && !l.starts_with("//")) {
                    url = format!("{}{location}", origin(&url));
                    continue;
                }
            }
            let etag = header("x-linked-etag")
                .or_else(|| header("etag"))
                .map(|e| e.trim_start_matches("W/").trim_matches('"').to_string())
                .filter(|e| safe_blob_name(e))
                .ok_or_else(|| {
                    Failure::Fatal(format!("{url} answered without a usable ETag header (the file's blob name); is HF_ENDPOINT a hub?"))
                })?;
            let commit = header("x-repo-commit").map(str::to_string);
            let size = header("x-linked-size").and_then(|s| s.parse().ok());
            return Ok(FileHead { etag, commit, size });
        }
        Err(Failure::Fatal(format!("{url}: more than {MAX_REDIRECTS} redirects")))
    }

    /// One attempt at the bytes `part` lacks: `Range: bytes={its length}-`, written as they come,
    /// never past the size the hub lists (else the one the response states, else
    /// [`HubConfig::unsized_limit`]), and no slower than [`http::Paced`] allows.
    fn download(&self, url: &str, part: &Path, expected: &RemoteFile, bar: &indicatif::ProgressBar, done_before: u64) -> Result<(), Failure> {
        let disk = |e| Failure::Stop(Error::io(part, e));
        let mut start = match std::fs::symlink_metadata(part) {
            Ok(m) if m.file_type().is_file() => m.len(),
            Ok(_) => return Err(Failure::Stop(planted(part))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(disk(e)),
        };
        if expected.size.is_some_and(|size| start >= size) {
            // Complete already (or longer than the file, which verification reports).
            return Ok(());
        }
        let mut response = match self.get(url).header("Range", format!("bytes={start}-")).call() {
            Ok(response) => response,
            Err(ureq::Error::StatusCode(416)) if start > 0 => {
                let _ = std::fs::remove_file(part);
                return Err(Failure::Transient(format!("{url} will not continue the download from byte {start}; starting over"), false));
            }
            Err(e) => return Err(self.failure(url, e)),
        };
        let mut out = open_part(part)?;
        let range = response.headers().get("content-range").and_then(|v| v.to_str().ok()).and_then(parse_content_range);
        if response.status().as_u16() == 206 {
            if range.is_none_or(|(first, _)| first != start) {
                out.set_len(0).map_err(disk)?;
                return Err(Failure::Transient(format!("{url} sent a different range than asked for (from byte {start}); starting over"), false));
            }
        } else if start > 0 {
            // A 200 is the whole file, from its first byte.
            out.set_len(0).map_err(disk)?;
            start = 0;
        }
        let stated = range.and_then(|(_, total)| total).or_else(|| response.body().content_length().map(|n| start + n));
        let total = expected.size.or(stated);
        // The most this file may take, and who said so.
        let (limit, by) = match (expected.size, stated) {
            (Some(size), _) => (size, "the size the hub lists"),
            (None, Some(size)) => (size, "the size the response states"),
            (None, None) => (self.config.unsized_limit, "the cap for a file the hub gives no size for"),
        };
        bar.set_length(total.unwrap_or(0));
        bar.set_position(start);
        self.progress.done_bytes.store(done_before + start, Ordering::Relaxed);
        let mut reader = http::Paced::new(response.body_mut().as_reader(), self.config.timeout);
        let mut buf = vec![0u8; CHUNK];
        let mut offset = start;
        loop {
            self.check_cancelled().map_err(Failure::Stop)?;
            // One byte past the limit is enough to know the body is too long.
            let room = (limit.saturating_sub(offset) + 1).min(CHUNK as u64) as usize;
            let n = match reader.read(&mut buf[..room]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    self.check_cancelled().map_err(Failure::Stop)?;
                    return Err(self.read_failure(url, e));
                }
            };
            if offset + n as u64 > limit {
                // Never kept: the next pull starts this file over.
                drop(out);
                let _ = std::fs::remove_file(part);
                return Err(Failure::Fatal(format!(
                    "{url} sent more than {limit} bytes ({by}); the file was dropped. Is HF_ENDPOINT ({}) a hub you trust?",
                    self.config.endpoint
                )));
            }
            out.write_all(&buf[..n]).map_err(disk)?;
            offset += n as u64;
            bar.inc(n as u64);
            self.progress.done_bytes.fetch_add(n as u64, Ordering::Relaxed);
        }
        match total {
            Some(total) if offset < total => {
                Err(Failure::Transient(format!("{url}: the connection closed after {offset} of {total} bytes"), false))
            }
            _ => Ok(()),
        }
    }
}

/// The error for a `.part` file that is a symlink or no plain file: never written through.
fn planted(part: &Path) -> Error {
    Error::Usage(format!(
        "{}: a download's temporary file is a symbolic link or not a plain file; sala does not write through it. Remove it and pull again",
        part.display()
    ))
}

/// Opens `part` to append, refusing a symlink put in its place (`O_NOFOLLOW`), so the download
/// never writes to a file elsewhere.
fn open_part(part: &Path) -> Result<std::fs::File, Failure> {
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NOFOLLOW);
    let file = options.open(part).map_err(|e| match e.raw_os_error() {
        #[cfg(unix)]
        Some(libc::ELOOP) => Failure::Stop(planted(part)),
        _ => Failure::Stop(Error::io(part, e)),
    })?;
    // O_NOFOLLOW leaves a FIFO or device in its place: only a plain file is written.
    match file.metadata() {
        Ok(m) if m.is_file() => Ok(file),
        Ok(_) => Err(Failure::Stop(planted(part))),
        Err(e) => Err(Failure::Stop(Error::io(part, e))),
    }
}

/// Waits before retry `n` (from 1): 0.25 s doubling to 4 s, plus up to 0.25 s so that many
/// clients do not come back at once.
fn backoff(n: u32) -> Duration {
    let base = Duration::from_millis(250).saturating_mul(1 << n.saturating_sub(1).min(4));
    base + Duration::from_millis(rand::random_range(0..250))
}

/// `bytes {first}-{last}/{total}` as (first, total); the total is `*` when unknown.
fn parse_content_range(value: &str) -> Option<(u64, Option<u64>)> {
    let (range, total) = value.trim().strip_prefix("bytes ")?.split_once('/')?;
    let first = range.split_once('-')?.0.trim().parse().ok()?;
    Some((first, total.trim().parse().ok()))
}

/// `scheme://host[:port]` of a URL.
fn origin(url: &str) -> &str {
    let host = url.find("://").map_or(0, |i| i + 3);
    url[host..].find('/').map_or(url, |i| &url[..host + i])
}

/// Percent-encodes `text` for a URL path, keeping unreserved characters, and `/` when `keep_slash`
/// (a file in a folder; a revision's `/` is encoded, as the hub expects).
fn encode(text: &str, keep_slash: bool) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            b'/' if keep_slash => "/".to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('/')
        && !name.contains('\\')
        && name.split('/').all(|part| !part.is_empty() && part != "." && part != "..")
}

/// An ETag that can name a file in `blobs/` (the hub's are hex digests).
fn safe_blob_name(etag: &str) -> bool {
    !etag.is_empty()
        && etag.len() <= 128
        && !etag.starts_with('.')
        && etag.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Points `link` (`snapshots/{commit}/{file}`, `depth` parts in the file's name) at
/// `blobs/{etag}` with a relative symlink, as huggingface_hub does.
fn link_blob(etag: &str, depth: usize, link: &Path) -> Result<()> {
    let dir = link.parent().ok_or_else(|| Error::Usage(format!("{}: not a file in a snapshot", link.display())))?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    match std::fs::remove_file(link) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io(link, e)),
        _ => {}
    }
    let target = format!("{}blobs/{etag}", "../".repeat(depth + 1));
    #[cfg(unix)]
    std::os::unix::fs::symlink(&target, link).map_err(|e| Error::io(link, e))?;
    #[cfg(not(unix))]
    std::fs::copy(dir.join(&target), link).map_err(|e| Error::io(link, e))?;
    Ok(())
}

/// `refs/{revision}`: the commit the revision pointed to (a revision with `/` makes folders),
/// written aside and renamed into place, so the ref is whole or absent and a symlink planted at
/// its name is replaced, not written through.
fn write_ref(repo_dir: &Path, revision: &str, commit: &str) -> Result<()> {
    let path = repo_dir.join("refs").join(revision);
    let dir = path.parent().ok_or_else(|| Error::Usage(format!("{}: not a ref file", path.display())))?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    crate::engine::checkpoint::write_whole(&path, commit.as_bytes())
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
