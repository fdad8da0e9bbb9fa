//! The HuggingFace hub cache, as `huggingface_hub` and `hf-hub` lay it out, is sala's model store:
//!
//!   $HF_HUB_CACHE (or $HF_HOME/hub, or ~/.cache/huggingface/hub)
//!     models--{org}--{name}/
//!       refs/{revision}            → the commit hash that revision points to
//!       snapshots/{commit}/{file}  → symlinks into blobs/
//!       blobs/{etag}               → the file contents
//!
//! A model is named by its repo id (`org/name`, optionally `@revision`).

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

/// A repo id with an optional revision: `org/name[@revision]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    pub repo: String,
    pub revision: String,
}

impl ModelRef {
    /// Parses and validates a name: two path-safe parts (no `..`, no absolute paths, no extra `/`).
    pub fn parse(name: &str) -> Result<Self> {
        let (repo, revision) = match name.split_once('@') {
            Some((r, rev)) => (r, rev),
            None => (name, "main"),
        };
        let bad = |why: &str| {
            Error::Usage(format!("`{name}` is not a model name ({why}); expected `org/name` or `org/name@revision`"))
        };
        let parts: Vec<&str> = repo.split('/').collect();
        if parts.len() != 2 {
            return Err(bad("one `/` between organisation and name"));
        }
        let safe = |s: &str| {
            !s.is_empty()
                && s != "."
                && s != ".."
                && !s.starts_with('.')
                && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        if !parts.iter().all(|p| safe(p)) {
            return Err(bad("letters, digits, `-`, `_` and `.` only"));
        }
        if revision.is_empty() || revision.contains("..") || revision.starts_with('/') || revision.contains('\\') {
            return Err(bad("bad revision"));
        }
        Ok(Self { repo: repo.to_string(), revision: revision.to_string() })
    }

    /// `models--org--name` under the cache.
    pub fn repo_dir(&self, cache: &Path) -> PathBuf {
        cache.join(format!("models--{}", self.repo.replace('/', "--")))
    }

    /// The snapshot directory for this revision, if it is in the cache.
    pub fn snapshot(&self, cache: &Path) -> Option<PathBuf> {
        let dir = self.repo_dir(cache);
        let commit = std::fs::read_to_string(dir.join("refs").join(&self.revision))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| self.revision.clone());
        let snapshot = dir.join("snapshots").join(commit);
        snapshot.is_dir().then_some(snapshot)
    }
}

/// One cached model.
#[derive(Debug, Clone)]
pub struct CachedModel {
    pub repo: String,
    /// The snapshot `refs/main` points to (or the newest one).
    pub snapshot: PathBuf,
    /// Bytes of every blob of the repo.
    pub size: u64,
}

/// Every model repo in the cache, sorted by name.
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
        let Ok(reference) = ModelRef::parse(&repo) else { continue };
        let snapshot = reference.snapshot(cache).or_else(|| newest_snapshot(&entry.path()));
        let Some(snapshot) = snapshot else { continue };
        out.push(CachedModel { repo, snapshot, size: dir_size(&entry.path().join("blobs")) });
    }
    out.sort_by(|a, b| a.repo.cmp(&b.repo));
    Ok(out)
}

fn newest_snapshot(repo_dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(repo_dir.join("snapshots"))
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
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
    let Ok(reference) = ModelRef::parse(&text) else {
        return Err(Error::Usage(format!("{}: no such file or directory", name.display())));
    };
    let cache = cache_dir();
    reference.snapshot(&cache).ok_or_else(|| {
        Error::Usage(format!(
            "{text}: no such file or directory, and not in the model store ({}); fetch it with `sala pull {}`",
            cache.display(),
            reference.repo
        ))
    })
}

/// Opens the model that `name` names: a path, or a store name resolved to its snapshot.
pub fn open(name: &Path) -> Result<ModelSource> {
    crate::models::open(&resolve(name)?)
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
