//! Digests of every tensor of a model (xxh3-128 of its stored bytes), for the fingerprint a prompt
//! cache is checked against ([`super::state_file::Fingerprint`]): a state is refused by a model
//! that differs in any byte of any tensor.
//!
//! Reading a 9B model's gigabytes at every start would be slow, so each weights file's digests are
//! kept in the user's cache folder (`$XDG_CACHE_HOME/sala/tensor-digests/`, else
//! `~/.cache/sala/…`), one small JSON file per weights file. An entry is used only when it names
//! the file's real path and its identity now: device, inode, size, and modification and change
//! times in nanoseconds. A file rewritten, replaced or touched (even with its modification time
//! set back: the change time cannot be) is read again; an entry that is unreadable, of another
//! layout or lacks a tensor is ignored and rewritten. The folder is the user's own: whoever can
//! write it can already change what this user runs.
//!
//! Tensors converted into memory (a GGUF file) have no bytes of their own in a file: the digest
//! of the whole file they came from stands for each of them.

use super::error::{Error, Result};
use super::weights::Weights;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Bytes hashed per read.
const CHUNK: usize = 8 << 20;

/// Entries kept before those of files that are gone are pruned.
const MAX_ENTRIES: usize = 256;

/// A tensor's name and its bytes' range in its file (`None`: converted from the whole file).
type Ranged = (String, Option<(u64, u64)>);

/// The digest of every tensor of `weights` by name, using and refreshing the user's cache folder.
pub fn of(weights: &Weights) -> Result<BTreeMap<String, String>> {
    of_with_cache(weights, default_cache_dir().as_deref())
}

/// `$XDG_CACHE_HOME/sala/tensor-digests`, else `~/.cache/sala/tensor-digests`.
fn default_cache_dir() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("sala").join("tensor-digests"))
}

/// [`of`] with its cache in `cache` (`None`: nothing is kept, every byte is read).
pub fn of_with_cache(weights: &Weights, cache: Option<&Path>) -> Result<BTreeMap<String, String>> {
    // The tensors of each file, by where their bytes are; `None`: converted from the file.
    let mut by_file: BTreeMap<PathBuf, Vec<Ranged>> = BTreeMap::new();
    let mut digests = BTreeMap::new();
    for (name, info) in weights.infos() {
        match weights.file_range(name) {
            Ok((file, offset, len)) => by_file.entry(file).or_default().push((name.clone(), Some((offset, len)))),
            Err(_) if info.file.is_file() => by_file.entry(info.file.clone()).or_default().push((name.clone(), None)),
            // Made in memory from no file: its bytes are all there is.
            Err(_) => {
                digests.insert(name.clone(), hex(xxhash_rust::xxh3::xxh3_128(&weights.bytes(name)?)));
            }
        }
    }
    for (file, tensors) in by_file {
        digests.extend(file_digests(&file, &tensors, cache)?);
    }
    Ok(digests)
}

fn hex(digest: u128) -> String {
    format!("{digest:032x}")
}

/// What identifies a file's contents without reading them.
fn identity(meta: &std::fs::Metadata) -> String {
    format!("dev={} ino={} size={} mtime={}.{:09} ctime={}.{:09}", meta.dev(), meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec(), meta.ctime(), meta.ctime_nsec())
}

/// The digests of `tensors` of `file` (a byte range each, or `None` for the whole file's), from
/// the cache entry when it still holds for the file, else read and kept there.
fn file_digests(file: &Path, tensors: &[Ranged], cache: Option<&Path>) -> Result<BTreeMap<String, String>> {
    let real = std::fs::canonicalize(file).map_err(|e| Error::io(file, e))?;
    let before = identity(&std::fs::metadata(&real).map_err(|e| Error::io(&real, e))?);
    let entry = cache.map(|dir| dir.join(format!("{:016x}.json", xxhash_rust::xxh3::xxh3_64(real.as_os_str().as_encoded_bytes()))));
    let key = |range: &Option<(u64, u64)>| match range {
        Some((offset, len)) => format!("{offset}+{len}"),
        None => "whole".to_string(),
    };
    let kept: Map<String, Value> = entry
        .as_ref()
        .and_then(|e| std::fs::read(e).ok())
        .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
        .filter(|v| v["file"].as_str() == real.to_str() && v["identity"].as_str() == Some(&before))
        .and_then(|v| v["ranges"].as_object().cloned())
        .unwrap_or_default();
    let held = |range: &Option<(u64, u64)>| kept.get(&key(range)).and_then(Value::as_str).filter(|d| d.len() == 32).map(String::from);
    if let Some(all) = tensors.iter().map(|(name, range)| held(range).map(|d| (name.clone(), d))).collect::<Option<BTreeMap<_, _>>>() {
        return Ok(all);
    }
    let mut ranges: Vec<Option<(u64, u64)>> = tensors.iter().map(|(_, r)| *r).collect();
    ranges.sort();
    ranges.dedup();
    let whole = std::fs::metadata(&real).map_err(|e| Error::io(&real, e))?.len();
    let computed = hash_ranges(&real, &ranges.iter().map(|r| r.unwrap_or((0, whole))).collect::<Vec<_>>())?;
    let by_range: Map<String, Value> = ranges.iter().zip(&computed).map(|(r, d)| (key(r), json!(d))).collect();
    // Kept only if the file did not change while it was read.
    let after = std::fs::metadata(&real).map(|m| identity(&m)).ok();
    if let (Some(entry), Some(after)) = (&entry, after) {
        if after == before {
            keep(entry, &json!({"file": real.to_str(), "identity": before, "ranges": by_range}));
        }
    }
    Ok(tensors.iter().map(|(name, r)| (name.clone(), by_range[&key(r)].as_str().unwrap_or_default().to_string())).collect())
}

/// The xxh3-128 digest of each byte range of `file`, read by up to 8 threads.
fn hash_ranges(file: &Path, ranges: &[(u64, u64)]) -> Result<Vec<String>> {
    let handle = std::fs::File::open(file).map_err(|e| Error::io(file, e))?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8).min(ranges.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let out = std::sync::Mutex::new(vec![String::new(); ranges.len()]);
    // Once per file (then cached), but a large checkpoint takes a while.
    let label = format!("digesting {}", file.file_name().unwrap_or_default().to_string_lossy());
    let bar = crate::progress::bytes_progress(&label, ranges.iter().map(|r| r.1).sum());
    let work = || -> Result<()> {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(&(offset, len)) = ranges.get(i) else { return Ok(()) };
            let mut hasher = xxhash_rust::xxh3::Xxh3::new();
            let mut done = 0u64;
            while done < len {
                let n = CHUNK.min((len - done) as usize);
                handle.read_exact_at(&mut buf[..n], offset + done).map_err(|e| Error::io(file, e))?;
                hasher.update(&buf[..n]);
                done += n as u64;
                bar.inc(n as u64);
            }
            out.lock().unwrap_or_else(|e| e.into_inner())[i] = hex(hasher.digest128());
        }
    };
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads).map(|_| scope.spawn(work)).collect();
        workers.into_iter().try_for_each(|w| w.join().unwrap_or_else(|_| Err(Error::Usage("internal: a hashing thread panicked".into()))))
    })?;
    bar.finish_and_clear();
    Ok(out.into_inner().unwrap_or_else(|e| e.into_inner()))
}

/// Writes a cache entry (aside, then renamed); a folder that cannot be written is left alone
/// (the digests are read again next time). Past [`MAX_ENTRIES`], entries of files that are gone
/// are removed.
fn keep(entry: &Path, value: &Value) {
    let Some(dir) = entry.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    if super::checkpoint::write_whole(entry, value.to_string().as_bytes()).is_err() {
        return;
    }
    let Ok(listing) = std::fs::read_dir(dir) else { return };
    let entries: Vec<PathBuf> = listing.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "json")).collect();
    if entries.len() > MAX_ENTRIES {
        for path in entries {
            let file = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice::<Value>(&b).ok()).and_then(|v| v["file"].as_str().map(PathBuf::from));
            if file.is_none_or(|f| !f.exists()) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}
