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

        let temp = path.with_file_name(format!(
            ".{}.partial-{}",
            path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
            std::process::id()
        ));
        let result = (|| -> Result<()> {
            let file = std::fs::File::create(&temp).map_err(|e| Error::io(&temp, e))?;
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            let io = |e| Error::io(&temp, e);
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
            out.into_inner().map_err(|e| Error::io(&temp, e.into_error()))?.sync_all().map_err(io)?;
            std::fs::rename(&temp, path).map_err(|e| Error::io(path, e))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        result
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

/// A directory built beside its final place and renamed into it once complete, so an interrupted
/// run never leaves a half-written model where a finished one is expected.
pub struct StagingDir {
    pub staging: PathBuf,
    target: PathBuf,
    finished: bool,
}

impl StagingDir {
    /// Refuses an existing `target` (nothing is ever overwritten).
    pub fn new(target: &Path) -> Result<Self> {
        if target.exists() {
            return Err(Error::Usage(format!(
                "{} already exists; remove it or choose another --output",
                target.display()
            )));
        }
        let name = target.file_name().ok_or_else(|| Error::Usage(format!("{}: not a directory name", target.display())))?;
        let parent = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
        let staging = parent.join(format!(".{}.partial-{}", name.to_string_lossy(), std::process::id()));
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(|e| Error::io(&staging, e))?;
        }
        std::fs::create_dir(&staging).map_err(|e| Error::io(&staging, e))?;
        Ok(Self { staging, target: target.into(), finished: false })
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
        self.finished = true;
        Ok(self.target.clone())
    }
}

impl Drop for StagingDir {
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_dir_all(&self.staging);
        }
    }
}
