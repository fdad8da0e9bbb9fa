//! The HuggingFace hub cache, as `huggingface_hub` and `hf-hub` lay it out, is sala's model store:
//!
//!   $HF_HUB_CACHE (or $HF_HOME/hub, or ~/.cache/huggingface/hub)
//!     models--{org}--{name}/
//!       refs/{revision}            → the commit hash that revision points to
//!       snapshots/{commit}/{file}  → symlinks into blobs/
//!       blobs/{etag}               → the file contents
//!
//! A model is named by its repo id (`org/name`, optionally `@revision`). A snapshot counts once a
//! ref names it: `sala pull` writes the ref last, after every file is verified, so an
//! interrupted or failed pull is neither listed nor resolved.

use crate::engine::error::{Error, Result};
use crate::engine::source::ModelSource;
use std::path::{Path, PathBuf};

/// The hub cache directory from the environment (the same rules as `huggingface_hub`).
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(dir);
    }
    if let Some(home) = std::env::var_os("HF_HOME") {
        return PathBuf::from(home).join("hub");
    }
    user_cache_dir().join("huggingface").join("hub")
}

/// `$XDG_CACHE_HOME`, or `~/.cache`.
pub fn user_cache_dir() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"))
}

/// The longest repo or organisation name the hub accepts.
pub const MAX_NAME_CHARS: usize = 96;

/// The longest revision taken: it becomes a file name under `refs/`.
pub const MAX_REVISION_BYTES: usize = 255;

/// Why a model name was refused, before it touches the disk or the network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The `org/name` part breaks the hub's rules for repo ids.
    #[error("`{}` is not a model name ({why}); expected `org/name` or `org/name@revision`, each part of letters, digits, `-`, `_` and `.`, as the hub names repos", .name.escape_debug())]
    Repo { name: String, why: String },
    /// The revision breaks git's rules for ref names (which the hub's branches and tags follow).
    #[error("`{}` is not a revision ({why}); expected a branch, tag or commit as git names them, e.g. `main`, `v1.0` or a commit hash", .revision.escape_debug())]
    Revision { revision: String, why: String },
}

impl From<NameError> for Error {
    fn from(e: NameError) -> Self {
        Error::Usage(e.to_string())
    }
}

/// A repo id with an optional revision: `org/name[@revision]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    pub repo: String,
    pub revision: String,
}

/// Why `part` (an organisation or a repo name) is no name the hub gives out; the hub's rules
/// make `models--{org}--{name}` name one repo only, since neither part can hold `--`.
fn name_problem(part: &str) -> Option<String> {
    if part.is_empty() {
        return Some("an empty part".into());
    }
    if part.chars().count() > MAX_NAME_CHARS {
        return Some(format!("a part longer than {MAX_NAME_CHARS} characters"));
    }
    if let Some(c) = part.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))) {
        return Some(format!("{:?} is not a letter, digit, `-`, `_` or `.`", c));
    }
    if part.contains("--") || part.contains("..") {
        return Some("`--` and `..` are not allowed".into());
    }
    if part.starts_with(['-', '.']) || part.ends_with(['-', '.']) {
        return Some("a part may not start or end with `-` or `.`".into());
    }
    None
}

/// Why `revision` is no ref name by git's rules (`git check-ref-format --allow-onelevel`), or
/// holds `%` (the hub would read `%2e%2e` in its URL as `..`).
pub fn revision_problem(revision: &str) -> Option<String> {
    if revision.is_empty() {
        return Some("it is empty".into());
    }
    if revision.len() > MAX_REVISION_BYTES {
        return Some(format!("longer than {MAX_REVISION_BYTES} bytes"));
    }
    if let Some(c) = revision.chars().find(|c| c.is_control() || c.is_whitespace()) {
        return Some(format!("it holds {c:?}; control characters and spaces are not allowed"));
    }
    if let Some(c) = revision.chars().find(|c| matches!(c, '~' | '^' | ':' | '?' | '*' | '[' | '\\' | '%')) {
        return Some(format!("`{c}` is not allowed"));
    }
    if revision.contains("..") || revision.contains("@{") || revision == "@" {
        return Some("`..`, `@{` and a lone `@` are not allowed".into());
    }
    if revision.starts_with('/') || revision.ends_with('/') || revision.ends_with('.') {
        return Some("it may not start or end with `/`, nor end with `.`".into());
    }
    if revision.split('/').any(|part| part.is_empty() || part.starts_with('.') || part.ends_with(".lock")) {
        return Some("no part between `/` may be empty, start with `.` or end with `.lock`".into());
    }
    None
}

/// A commit as a ref file holds it (hex; the hub's are 40 characters).
fn is_commit(text: &str) -> bool {
    !text.is_empty() && text.len() <= 64 && text.chars().all(|c| c.is_ascii_alphanumeric())
}

/// The commit in the ref file at `path`, if it holds one (read no further than a commit and a
/// line end can take, whatever the file is).
fn read_ref(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(path).ok()?.take(80).read_to_string(&mut text).ok()?;
    let commit = text.trim();
    is_commit(commit).then(|| commit.to_string())
}

/// Every `refs/{revision}` of a repo folder with the commit it names, sorted by revision (a
/// revision with `/` is a file in folders).
fn refs(repo_dir: &Path) -> Vec<(String, String)> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<(String, String)>, depth: usize) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            let revision = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
            match entry.file_type() {
                Ok(t) if t.is_dir() && depth < 8 => walk(&entry.path(), &revision, out, depth + 1),
                Ok(t) if t.is_file() && revision_problem(&revision).is_none() => {
                    if let Some(commit) = read_ref(&entry.path()) {
                        out.push((revision, commit));
                    }
                }
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo_dir.join("refs"), "", &mut out, 0);
    out.sort();
    out
}

/// How the store names the snapshot of `commit`: `org/name` when `refs/main` points to it,
/// else `org/name@{its first ref}`, else `org/name@{commit}`.
fn snapshot_name(repo: &str, refs: &[(String, String)], commit: &str) -> String {
    let mut names = refs.iter().filter(|(_, c)| c == commit).map(|(r, _)| r.as_str());
    if refs.iter().any(|(r, c)| r == "main" && c == commit) {
        return repo.to_string();
    }
    format!("{repo}@{}", names.next().unwrap_or(commit))
}

impl ModelRef {
    /// Parses and checks a name by the hub's rules: `org/name` (letters, digits, `-`, `_`, `.`;
    /// no `--` or `..`; neither starting nor ending with `-` or `.`; at most 96 characters
    /// each), then optionally `@revision` by git's rules for ref names.
    pub fn parse(name: &str) -> Result<Self, NameError> {
        let (repo, revision) = match name.split_once('@') {
            Some((r, rev)) => (r, rev),
            None => (name, "main"),
        };
        let bad = |why: String| NameError::Repo { name: repo.to_string(), why };
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.len() != 2 {
            return Err(bad("one `/` between organisation and name".into()));
        }
        if let Some(why) = parts.iter().find_map(|p| name_problem(p)) {
            return Err(bad(why));
        }
        if let Some(why) = revision_problem(revision) {
            return Err(NameError::Revision { revision: revision.to_string(), why });
        }
        Ok(Self { repo: repo.to_string(), revision: revision.to_string() })
    }

    /// `models--org--name` under the cache: one folder per repo, since names hold no `--`.
    pub fn repo_dir(&self, cache: &Path) -> PathBuf {
        cache.join(format!("models--{}", self.repo.replace('/', "--")))
    }

    /// The commit this revision names in the store: `refs/{revision}`, or the revision itself
    /// when it is a commit that some ref names. A ref is written only once a pull has verified
    /// every file, so a snapshot no ref names is an unfinished pull and does not count.
    fn commit(&self, repo_dir: &Path) -> Option<String> {
        read_ref(&repo_dir.join("refs").join(&self.revision))
            .or_else(|| (is_commit(&self.revision) && refs(repo_dir).iter().any(|(_, c)| *c == self.revision)).then(|| self.revision.clone()))
    }

    /// The snapshot directory for this revision, if a finished pull put it in the cache.
    pub fn snapshot(&self, cache: &Path) -> Option<PathBuf> {
        let dir = self.repo_dir(cache);
        let snapshot = dir.join("snapshots").join(self.commit(&dir)?);
        snapshot.is_dir().then_some(snapshot)
    }

    /// How `sala list` and `GET /v1/models` name the snapshot this revision resolves to (so
    /// `org/name` and `org/name@main` are one model), if it is in the store.
    pub fn listed_name(&self, cache: &Path) -> Option<String> {
        let dir = self.repo_dir(cache);
        let commit = self.commit(&dir)?;
        dir.join("snapshots").join(&commit).is_dir().then(|| snapshot_name(&self.repo, &refs(&dir), &commit))
    }
}

/// One finished snapshot in the store.
#[derive(Debug, Clone)]
pub struct CachedModel {
    /// `org/name`.
    pub repo: String,
    /// How to ask for it: `org/name` for the snapshot `refs/main` names, else
    /// `org/name@revision`.
    pub name: String,
    pub snapshot: PathBuf,
    /// Bytes of its files.
    pub size: u64,
}

/// Every finished snapshot in the store (one a ref names), sorted by name. A repo folder whose
/// name is not `models--{org}--{name}` by the hub's rules is skipped.
pub fn list(cache: &Path) -> Result<Vec<CachedModel>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(cache) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io(cache, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(cache, e))?;
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(rest) = name.strip_prefix("models--") else { continue };
        let Some((org, model)) = rest.split_once("--") else { continue };
        let repo = format!("{org}/{model}");
        if ModelRef::parse(&repo).is_err() {
            continue;
        }
        let refs = refs(&entry.path());
        let mut commits: Vec<&str> = refs.iter().map(|(_, c)| c.as_str()).collect();
        commits.sort();
        commits.dedup();
        for commit in commits {
            let snapshot = entry.path().join("snapshots").join(commit);
            if snapshot.is_dir() {
                let size = dir_size(&snapshot);
                out.push(CachedModel { repo: repo.clone(), name: snapshot_name(&repo, &refs, commit), snapshot, size });
            }
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Bytes of the regular files in `dir` and its folders (symlinks followed); 0 for what cannot be
/// read.
pub fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match std::fs::metadata(e.path()) {
            Ok(m) if m.is_dir() => dir_size(&e.path()),
            Ok(m) if m.is_file() => m.len(),
            _ => 0,
        })
        .sum()
}

/// Resolves what the user typed as `--model`: an existing path wins; otherwise a cached repo id.
pub fn resolve(name: &Path) -> Result<PathBuf> {
    if name.exists() {
        return Ok(name.to_path_buf());
    }
    let text = name.to_string_lossy();
    let cache = cache_dir();
    let not_found = |pull: String| {
        // Store names that contain what was typed, case aside (`SmolLM2` → `…/SmolLM2-135M`).
        let wanted = text.split('@').next().unwrap_or_default().to_lowercase();
        let similar: Vec<String> = list(&cache).unwrap_or_default().into_iter().map(|m| m.name).filter(|n| n.to_lowercase().contains(&wanted)).collect();
        let similar = if similar.is_empty() { String::new() } else { format!("; it has {}", similar.join(", ")) };
        Error::ModelNotFound { name: text.to_string(), store: cache.clone(), similar, pull }
    };
    let reference = match ModelRef::parse(&text) {
        Ok(reference) => reference,
        // Looks like a store name but breaks its rules: say which.
        Err(e @ NameError::Revision { .. }) => return Err(Error::Usage(format!("{}: no such file or directory, and {e}", name.display()))),
        // A bare word (`SmolLM2`) is meant as a model name: say where names come from.
        Err(_) if !text.is_empty() && !text.contains(['/', '\\']) && !is_model_file_name(name) => return Err(not_found(format!("ORG/{text}"))),
        Err(_) => return Err(Error::Usage(format!("{}: no such file or directory", name.display()))),
    };
    reference.snapshot(&cache).ok_or_else(|| not_found(reference.repo.clone()))
}

/// Whether `name` ends like a model file (`.gguf`, `.sala`, `.safetensors`): a missing one is a
/// missing file, not a store name.
fn is_model_file_name(name: &Path) -> bool {
    name.extension().is_some_and(|e| ["gguf", "sala", "safetensors"].iter().any(|m| e.eq_ignore_ascii_case(m)))
}

/// Opens the model that `name` names: a path, or a store name resolved to its snapshot.
pub fn open(name: &Path) -> Result<ModelSource> {
    let path = resolve(name)?;
    if super::synthetic::is_synthetic(&path) {
        return Err(Error::Usage(format!(
            "{}: a synthetic model ({}: random weights, drawn when it is loaded); this needs weights on disk \
             (`sala run`, `chat`, `serve`, `bench` and `show` take a synthetic model)",
            path.display(),
            super::synthetic::SYNTHETIC_FILE
        )));
    }
    crate::models::open(&path)
}

/// Deletes a cached model; returns the bytes freed.
pub fn remove(cache: &Path, name: &str) -> Result<u64> {
    let reference = ModelRef::parse(name)?;
    let dir = reference.repo_dir(cache);
    if !dir.is_dir() {
        return Err(Error::Usage(format!("{}: not in the model store ({}); see `sala list`", reference.repo, cache.display())));
    }
    let size = dir_size(&dir.join("blobs"));
    std::fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    Ok(size)
}
