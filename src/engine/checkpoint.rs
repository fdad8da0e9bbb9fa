//! Writing checkpoints: safetensors files whose tensors are produced one at a time while the file
//! is written (so a 9B model never has to be in memory twice), single-file or sharded like HF
//! (`model-0000i-of-0000n.safetensors` + index), and directories that appear whole or not at all.

use super::error::{Error, Result};
use super::weights::{SINGLE_FILE, INDEX_FILE};
use safetensors::tensor::View;
use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Shards of at most this size, as mlx-lm and transformers write them.
pub const MAX_SHARD_BYTES: u64 = 5 << 30;

type Producer<'a> = Box<dyn Fn() -> Result<Vec<u8>> + 'a>;

/// A tensor to be written: its header facts now, its bytes when the writer gets to it.
pub struct PendingTensor<'a> {
    pub dtype: safetensors::Dtype,
    pub shape: Vec<usize>,
    produce: Producer<'a>,
    failure: &'a RefCell<Option<Error>>,
}

impl View for PendingTensor<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        let len = self.data_len();
        match (self.produce)() {
            Ok(bytes) if bytes.len() == len => Cow::Owned(bytes),
            Ok(bytes) => {
                self.fail(Error::Usage(format!("internal: produced {} bytes for a {len}-byte tensor", bytes.len())));
                Cow::Owned(vec![0; len])
            }
            Err(e) => {
                // The View trait cannot fail: remember the error, write filler, and let the
                // caller discard the file.
                self.fail(e);
                Cow::Owned(vec![0; len])
            }
        }
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

impl PendingTensor<'_> {
    fn fail(&self, e: Error) {
        self.failure.borrow_mut().get_or_insert(e);
    }
}

/// Collects tensors for one checkpoint and writes them.
pub struct CheckpointWriter<'a> {
    tensors: Vec<(String, PendingTensor<'a>)>,
    failure: &'a RefCell<Option<Error>>,
}

impl<'a> CheckpointWriter<'a> {
    /// `failure` outlives the writer and receives the first error a producer hits.
    pub fn new(failure: &'a RefCell<Option<Error>>) -> Self {
        Self { tensors: Vec::new(), failure }
    }

    /// Adds a tensor whose bytes `produce` returns when its turn to be written comes.
    pub fn add(
        &mut self,
        name: impl Into<String>,
        dtype: &str,
        shape: Vec<usize>,
        produce: impl Fn() -> Result<Vec<u8>> + 'a,
    ) -> Result<()> {
        let dtype = safetensors_dtype(dtype).ok_or_else(|| Error::Usage(format!("cannot write dtype {dtype}")))?;
        let tensor = PendingTensor { dtype, shape, produce: Box::new(produce), failure: self.failure };
        self.tensors.push((name.into(), tensor));
        Ok(())
    }

    pub fn total_bytes(&self) -> u64 {
        self.tensors.iter().map(|(_, t)| t.data_len() as u64).sum()
    }

    /// Writes one safetensors file at `path` (atomically) with `metadata`.
    pub fn write_file(self, path: &Path, metadata: BTreeMap<String, String>) -> Result<()> {
        let metadata: HashMap<String, String> = metadata.into_iter().collect();
        let failure = self.failure;
        safetensors::serialize_to_file(self.tensors, Some(metadata), path)
            .map_err(|e| Error::BadWeights { path: path.into(), message: format!("writing: {e}") })?;
        if let Some(e) = failure.borrow_mut().take() {
            let _ = std::fs::remove_file(path);
            return Err(e);
        }
        // The writer's temp file is private (0600); a model file is as readable as any other.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).map_err(|e| Error::io(path, e))?;
        }
        Ok(())
    }

    /// Writes `model.safetensors` into `dir`, or shards + index when larger than `max_shard`.
    pub fn write_dir(self, dir: &Path, max_shard: u64) -> Result<()> {
        let total = self.total_bytes();
        let failure = self.failure;
        let mut format = BTreeMap::new();
        format.insert("format".to_string(), "mlx".to_string());
        if total <= max_shard {
            let writer = Self { tensors: self.tensors, failure };
            return writer.write_file(&dir.join(SINGLE_FILE), format);
        }
        let mut shards: Vec<Vec<(String, PendingTensor<'a>)>> = vec![Vec::new()];
        let mut size = 0;
        for (name, t) in self.tensors {
            let len = t.data_len() as u64;
            if size > 0 && size + len > max_shard {
                shards.push(Vec::new());
                size = 0;
            }
            size += len;
            shards.last_mut().expect("one shard at least").push((name, t));
        }
        let n = shards.len();
        let mut weight_map = serde_json::Map::new();
        for (i, shard) in shards.into_iter().enumerate() {
            let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
            for (name, _) in &shard {
                weight_map.insert(name.clone(), file.clone().into());
            }
            Self { tensors: shard, failure }.write_file(&dir.join(&file), format.clone())?;
        }
        let index = serde_json::json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
        let path = dir.join(INDEX_FILE);
        std::fs::write(&path, serde_json::to_string_pretty(&index).expect("JSON")).map_err(|e| Error::io(&path, e))
    }
}

fn safetensors_dtype(name: &str) -> Option<safetensors::Dtype> {
    use safetensors::Dtype as D;
    Some(match name {
        "BOOL" => D::BOOL,
        "U8" => D::U8,
        "I8" => D::I8,
        "U16" => D::U16,
        "I16" => D::I16,
        "F16" => D::F16,
        "BF16" => D::BF16,
        "U32" => D::U32,
        "I32" => D::I32,
        "F32" => D::F32,
        "U64" => D::U64,
        "I64" => D::I64,
        "F64" => D::F64,
        _ => return None,
    })
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

    pub fn write(&self, name: &str, text: &str) -> Result<()> {
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
