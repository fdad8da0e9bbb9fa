//! Writing checkpoints: safetensors files whose tensors are produced one at a time while the file
//! is written (so a 9B model never has to be in memory twice), single-file or sharded like HF
//! (`model-0000i-of-0000n.safetensors` + index), and directories that appear whole or not at all.
//!
//! The writer is our own (the format is a length, a JSON header and the raw data) so that the
//! output is deterministic: tensors and metadata keys in sorted order, the same bytes every run.

use super::error::{Error, Result};
use super::weights::{dtype_size, INDEX_FILE, SINGLE_FILE};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Shards of at most this size, as mlx-lm and transformers write them.
pub const MAX_SHARD_BYTES: u64 = 5 << 30;

type Producer<'a> = Box<dyn Fn() -> Result<Vec<u8>> + 'a>;

/// A tensor to be written: its header facts now, its bytes when the writer gets to it.
struct PendingTensor<'a> {
    dtype: String,
    shape: Vec<usize>,
    produce: Producer<'a>,
}

impl PendingTensor<'_> {
    fn nbytes(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64 * dtype_size(&self.dtype).unwrap_or(0)
    }
}

/// Collects tensors for one checkpoint and writes them.
#[derive(Default)]
pub struct CheckpointWriter<'a> {
    tensors: BTreeMap<String, PendingTensor<'a>>,
}

impl<'a> CheckpointWriter<'a> {
    pub fn new() -> Self {
        Self { tensors: BTreeMap::new() }
    }

    /// Adds a tensor (safetensors dtype name, shape) whose bytes `produce` returns when its turn to
    /// be written comes.
    pub fn add(
        &mut self,
        name: impl Into<String>,
        dtype: &str,
        shape: Vec<usize>,
        produce: impl Fn() -> Result<Vec<u8>> + 'a,
    ) -> Result<()> {
        if dtype_size(dtype).is_none() {
            return Err(Error::Usage(format!("cannot write dtype {dtype}")));
        }
        let tensor = PendingTensor { dtype: dtype.into(), shape, produce: Box::new(produce) };
        self.tensors.insert(name.into(), tensor);
        Ok(())
    }

    pub fn total_bytes(&self) -> u64 {
        self.tensors.values().map(PendingTensor::nbytes).sum()
    }

    /// Writes one safetensors file at `path` with `metadata`: into a temp file beside it, renamed
    /// into place once complete.
    pub fn write_file(self, path: &Path, metadata: &BTreeMap<String, String>) -> Result<()> {
        let mut header = Map::new();
        if !metadata.is_empty() {
            header.insert("__metadata__".into(), json!(metadata));
        }
        let mut offset = 0u64;
        for (name, t) in &self.tensors {
            let end = offset + t.nbytes();
            header.insert(name.clone(), json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, end]}));
            offset = end;
        }
        let mut header = serde_json::to_vec(&Value::Object(header)).expect("JSON values serialise");
        // Data starts 8-byte aligned, padded with spaces as the format allows.
        header.resize(header.len().div_ceil(8) * 8, b' ');

        let mut temp = partial_file(path)?;
        let at = temp.path().to_path_buf();
        let result = (|| -> Result<()> {
            let io = |e| Error::io(&at, e);
            let mut out = std::io::BufWriter::with_capacity(1 << 20, temp.as_file_mut());
            out.write_all(&(header.len() as u64).to_le_bytes()).map_err(io)?;
            out.write_all(&header).map_err(io)?;
            for (name, t) in &self.tensors {
                let bytes = (t.produce)()?;
                if bytes.len() as u64 != t.nbytes() {
                    return Err(Error::Usage(format!(
                        "internal: tensor `{name}` produced {} bytes, expected {}",
                        bytes.len(),
                        t.nbytes()
                    )));
                }
                out.write_all(&bytes).map_err(io)?;
            }
            out.flush().map_err(io)
        })();
        // Dropped unfinished, the partial file removes itself.
        result.and_then(|()| persist(temp, path))
    }

    /// Writes `model.safetensors` into `dir`, or shards + index when larger than `max_shard`.
    pub fn write_dir(self, dir: &Path, max_shard: u64) -> Result<()> {
        let total = self.total_bytes();
        let mut format = BTreeMap::new();
        format.insert("format".to_string(), "mlx".to_string());
        if total <= max_shard {
            return self.write_file(&dir.join(SINGLE_FILE), &format);
        }
        let mut shards: Vec<CheckpointWriter<'a>> = vec![CheckpointWriter::new()];
        let mut size = 0;
        for (name, t) in self.tensors {
            let len = t.nbytes();
            if size > 0 && size + len > max_shard {
                shards.push(CheckpointWriter::new());
                size = 0;
            }
            size += len;
            shards.last_mut().expect("one shard at least").tensors.insert(name, t);
        }
        let n = shards.len();
        let mut weight_map = Map::new();
        for (i, shard) in shards.into_iter().enumerate() {
            let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
            for name in shard.tensors.keys() {
                weight_map.insert(name.clone(), file.clone().into());
            }
            shard.write_file(&dir.join(&file), &format)?;
        }
        let index = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
        let path = dir.join(INDEX_FILE);
        std::fs::write(&path, serde_json::to_string_pretty(&index).expect("JSON")).map_err(|e| Error::io(&path, e))
    }
}

/// A name that stays inside the directory it is joined to: one component, no separator, not `.`
/// or `..`, no leading dot (hidden files and `..` alike), no control characters.
pub fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && !name.chars().any(|c| c == '/' || c == '\\' || c.is_control())
        && std::path::Path::new(name).components().count() == 1
}

/// What marks a file or folder being written beside its final place: `.NAME.partial-PID-…`.
const PARTIAL: &str = ".partial-";

/// A partial file or folder of a process that is gone is swept only once it has not changed for
/// this long (a writer in another PID namespace sharing the folder looks gone but keeps writing).
const QUIET_FOR: std::time::Duration = std::time::Duration::from_secs(60);

/// One not changed for this long is swept whatever its process (its PID may have been reused).
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The folder `path` is in (`.` for a bare name) and its file name.
fn folder_and_name(path: &Path) -> Result<(PathBuf, String)> {
    let name = path.file_name().ok_or_else(|| Error::Usage(format!("{}: not a file name", path.display())))?;
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((folder, name.to_string_lossy().into_owned()))
}

fn partial_prefix(name: &str) -> String {
    format!(".{name}{PARTIAL}{}-", std::process::id())
}

/// A file to write `path` through: created beside it as `.NAME.partial-PID-XXXXXX`, exclusively
/// (`O_EXCL`: a name already there, a planted symlink included, is never opened), removed if it
/// is dropped unfinished; [`persist`] renames it into place. Partial files that earlier processes
/// left beside `path` are swept first ([`sweep_partials`]).
pub fn partial_file(path: &Path) -> Result<tempfile::NamedTempFile> {
    use std::os::unix::fs::PermissionsExt;
    let (folder, name) = folder_and_name(path)?;
    sweep_partials(&folder, Some(&name));
    // 0666 less the umask, as `File::create` gives (tempfile's default is 0600).
    tempfile::Builder::new()
        .prefix(&partial_prefix(&name))
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(&folder)
        .map_err(|e| Error::io(&folder, e))
}

/// Flushes `temp` ([`partial_file`]) to disk and renames it to `path` (a symlink there is
/// replaced, not followed).
pub fn persist(temp: tempfile::NamedTempFile, path: &Path) -> Result<()> {
    temp.as_file().sync_all().map_err(|e| Error::io(temp.path(), e))?;
    temp.persist(path).map_err(|e| Error::io(path, e.error))?;
    Ok(())
}

/// Writes `bytes` as the whole of `path` through a [`partial_file`]: a reader (another process
/// too) sees the old file or the new one, never a part.
pub fn write_whole(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut temp = partial_file(path)?;
    temp.write_all(bytes).map_err(|e| Error::io(temp.path(), e))?;
    persist(temp, path)
}

/// Removes what interrupted writes (a crash, SIGKILL, a full disk) left in `dir`: the partial
/// files and folders of `name` (`.NAME.partial-PID…`), or of any name when `None`, whose
/// process is no longer running and that have not changed for a minute, or that have not
/// changed for a day. This process's own are never touched. Symlinks are removed, not followed.
/// Returns how many were removed; what cannot be read or removed is left alone.
pub fn sweep_partials(dir: &Path, name: Option<&str>) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = partial_pid(&file_name, name) else { continue };
        // `DirEntry::metadata` does not follow a symlink.
        let Ok(meta) = entry.metadata() else { continue };
        let quiet = meta.modified().ok().and_then(|m| m.elapsed().ok()).unwrap_or_default();
        let stale = pid != std::process::id() && ((!process_runs(pid) && quiet >= QUIET_FOR) || quiet >= STALE_AFTER);
        if stale {
            let path = entry.path();
            let gone = if meta.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
            removed += gone.is_ok() as usize;
        }
    }
    removed
}

/// The PID in a partial file's name `.NAME.partial-PID` or `.NAME.partial-PID-…` (of `name`
/// when given); `None` for anything else.
fn partial_pid(file_name: &str, name: Option<&str>) -> Option<u32> {
    let rest = match name {
        Some(name) => file_name.strip_prefix(&format!(".{name}{PARTIAL}"))?,
        None => {
            let at = file_name.strip_prefix('.')?.rfind(PARTIAL)?;
            &file_name[1 + at + PARTIAL.len()..]
        }
    };
    rest.split('-').next()?.parse().ok()
}

/// Whether a process `pid` exists (one of another user counts).
fn process_runs(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return false };
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    pid > 0 && (unsafe { libc::kill(pid, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM))
}

/// A directory built beside its final place and renamed into it once complete, so an interrupted
/// run never leaves a half-written model where a finished one is expected.
pub struct StagingDir {
    pub staging: PathBuf,
    target: PathBuf,
    /// Removes the staging folder when dropped unfinished.
    dir: Option<tempfile::TempDir>,
}

impl StagingDir {
    /// Refuses an existing `target` (nothing is ever overwritten). The staging folder
    /// `.NAME.partial-PID-XXXXXX` is made afresh (never an existing one, nor through a symlink);
    /// those earlier processes left are swept first.
    pub fn new(target: &Path) -> Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        if target.symlink_metadata().is_ok() {
            return Err(Error::Usage(format!(
                "{} already exists; remove it or choose another --output",
                target.display()
            )));
        }
        let (parent, name) = folder_and_name(target).map_err(|_| Error::Usage(format!("{}: not a directory name", target.display())))?;
        std::fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
        sweep_partials(&parent, Some(&name));
        let dir = tempfile::Builder::new()
            .prefix(&partial_prefix(&name))
            .permissions(std::fs::Permissions::from_mode(0o777))
            .tempdir_in(&parent)
            .map_err(|e| Error::io(&parent, e))?;
        Ok(Self { staging: dir.path().to_path_buf(), target: target.into(), dir: Some(dir) })
    }

    /// Writes a side file; `name` often comes from a downloaded file, so anything but a plain
    /// file name (a path that could leave the directory) is refused here, for every writer.
    pub fn write(&self, name: &str, text: &str) -> Result<()> {
        if !is_plain_file_name(name) {
            return Err(Error::Usage(format!(
                "refusing to write a side file `{}` into {}: not a plain file name (the model's metadata is corrupt or hostile)",
                name.escape_debug(),
                self.target.display()
            )));
        }
        let path = self.staging.join(name);
        std::fs::write(&path, text).map_err(|e| Error::io(&path, e))
    }

    pub fn finish(mut self) -> Result<PathBuf> {
        std::fs::rename(&self.staging, &self.target).map_err(|e| Error::io(&self.target, e))?;
        // Renamed away: nothing is left to remove.
        if let Some(dir) = self.dir.take() {
            let _ = dir.keep();
        }
        Ok(self.target.clone())
    }
}
