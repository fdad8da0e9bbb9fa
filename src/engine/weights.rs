//! Checkpoint tensors: `model.safetensors` or a sharded `model.safetensors.index.json`.
//!
//! Every file's header is validated before MLX touches it (truncated or corrupt files give a typed
//! error instead of a crash), and a model checks its full list of expected names and shapes before
//! anything runs: loading must never silently skip a misnamed tensor.

use super::error::{Error, Result};
use mlx_rs::{Array, Dtype};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One expected tensor.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<i32>,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, shape: &[usize]) -> Self {
        Self { name: name.into(), shape: shape.iter().map(|&d| d as i32).collect() }
    }
}

/// Header facts of one tensor in a safetensors file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub dtype: String,
    pub shape: Vec<i32>,
    pub file: PathBuf,
}

pub struct Weights {
    /// The directory or file the user named, for messages.
    pub source: PathBuf,
    infos: BTreeMap<String, TensorInfo>,
    loaded: HashMap<PathBuf, HashMap<String, Array>>,
}

impl Weights {
    /// Opens the checkpoint in `dir` (validating headers only; data loads lazily).
    pub fn open(dir: &Path) -> Result<Self> {
        let index = dir.join(INDEX_FILE);
        let single = dir.join(SINGLE_FILE);
        let files: Vec<PathBuf> = if index.is_file() {
            shard_files(&index)?
        } else if single.is_file() {
            vec![single]
        } else {
            return Err(Error::BadWeights {
                path: dir.to_path_buf(),
                message: format!("no {SINGLE_FILE} or {INDEX_FILE} in this directory"),
            });
        };
        let mut infos = BTreeMap::new();
        for file in &files {
            for (name, info) in read_header(file)? {
                if let Some(previous) = infos.insert(name.clone(), info) {
                    return Err(Error::BadWeights {
                        path: file.clone(),
                        message: format!("tensor `{name}` also appears in {}", previous.file.display()),
                    });
                }
            }
        }
        Ok(Self { source: dir.to_path_buf(), infos, loaded: HashMap::new() })
    }

    pub fn infos(&self) -> &BTreeMap<String, TensorInfo> {
        &self.infos
    }

    /// The floating-point dtype most tensors are stored in (the checkpoint's own dtype).
    pub fn storage_dtype(&self) -> Option<Dtype> {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for info in self.infos.values() {
            *counts.entry(info.dtype.as_str()).or_default() += 1;
        }
        counts
            .into_iter()
            .filter_map(|(d, n)| float_dtype(d).map(|dt| (n, dt)))
            .max_by_key(|(n, _)| *n)
            .map(|(_, dt)| dt)
    }

    /// Checks that the checkpoint holds exactly `specs` (names and shapes), naming the first problem.
    pub fn check(&self, specs: &[TensorSpec], model_type: &str) -> Result<()> {
        for spec in specs {
            let Some(info) = self.infos.get(&spec.name) else {
                return Err(Error::MissingTensor {
                    path: self.source.clone(),
                    name: spec.name.clone(),
                    expected: spec.shape.clone(),
                });
            };
            if info.shape != spec.shape {
                return Err(Error::TensorShape {
                    path: info.file.clone(),
                    name: spec.name.clone(),
                    expected: spec.shape.clone(),
                    found: info.shape.clone(),
                });
            }
            if float_dtype(&info.dtype).is_none() {
                return Err(Error::BadWeights {
                    path: info.file.clone(),
                    message: format!(
                        "tensor `{}` is stored as {}; expected F32, F16 or BF16",
                        spec.name, info.dtype
                    ),
                });
            }
        }
        let expected: std::collections::HashSet<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        if let Some(extra) = self.infos.keys().find(|k| !expected.contains(k.as_str())) {
            return Err(Error::UnexpectedTensor {
                path: self.infos[extra].file.clone(),
                name: extra.clone(),
                model_type: model_type.into(),
            });
        }
        Ok(())
    }

    /// Loads one tensor (after [`Weights::check`]) and casts it to `dtype`.
    pub fn get(&mut self, name: &str, dtype: Dtype) -> Result<Array> {
        let info = self.infos.get(name).ok_or_else(|| Error::MissingTensor {
            path: self.source.clone(),
            name: name.into(),
            expected: vec![],
        })?;
        let file = info.file.clone();
        if !self.loaded.contains_key(&file) {
            let arrays = Array::load_safetensors(&file)?;
            self.loaded.insert(file.clone(), arrays);
        }
        let array = self.loaded[&file].get(name).ok_or_else(|| Error::BadWeights {
            path: file.clone(),
            message: format!("MLX could not read tensor `{name}`"),
        })?;
        Ok(if array.dtype() == dtype { array.clone() } else { array.as_dtype(dtype)? })
    }
}

pub fn float_dtype(name: &str) -> Option<Dtype> {
    match name {
        "F32" => Some(Dtype::Float32),
        "F16" => Some(Dtype::Float16),
        "BF16" => Some(Dtype::Bfloat16),
        _ => None,
    }
}

fn dtype_size(name: &str) -> Option<u64> {
    Some(match name {
        "BOOL" | "U8" | "I8" | "F8_E4M3" | "F8_E5M2" => 1,
        "U16" | "I16" | "F16" | "BF16" => 2,
        "U32" | "I32" | "F32" => 4,
        "U64" | "I64" | "F64" => 8,
        _ => return None,
    })
}

fn shard_files(index: &Path) -> Result<Vec<PathBuf>> {
    let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
    let json: Value = serde_json::from_str(&text)
        .map_err(|e| Error::Json { path: index.into(), message: e.to_string() })?;
    let map = json.get("weight_map").and_then(Value::as_object).ok_or_else(|| Error::MissingKey {
        path: index.into(),
        key: "weight_map".into(),
    })?;
    let dir = index.parent().unwrap_or(Path::new("."));
    let mut files: Vec<PathBuf> = Vec::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| Error::InvalidKey {
            path: index.into(),
            key: format!("weight_map.{name}"),
            message: "expected a file name".into(),
        })?;
        if file.contains('/') || file.contains('\\') || file.contains("..") {
            return Err(Error::InvalidKey {
                path: index.into(),
                key: format!("weight_map.{name}"),
                message: format!("`{file}` is not a plain file name"),
            });
        }
        let path = dir.join(file);
        if !files.contains(&path) {
            if !path.is_file() {
                return Err(Error::BadWeights {
                    path: index.into(),
                    message: format!("shard `{file}` (holding `{name}`) is missing"),
                });
            }
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Reads and validates a safetensors header against the file's real size.
pub fn read_header(path: &Path) -> Result<Vec<(String, TensorInfo)>> {
    let bad = |message: String| Error::BadWeights { path: path.into(), message };
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut len_bytes = [0u8; 8];
    file.read_exact(&mut len_bytes)
        .map_err(|_| bad(format!("truncated: {file_len} bytes is too short for a safetensors file")))?;
    let header_len = u64::from_le_bytes(len_bytes);
    if header_len > 100 << 20 || 8 + header_len > file_len {
        return Err(bad(format!(
            "corrupt or truncated: header length {header_len} does not fit in a {file_len}-byte file"
        )));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(|e| Error::io(path, e))?;
    let json: Value = serde_json::from_slice(&header)
        .map_err(|e| bad(format!("corrupt header (not JSON: {e})")))?;
    let entries = json.as_object().ok_or_else(|| bad("corrupt header (not a JSON object)".into()))?;
    let data_len = file_len - 8 - header_len;
    let mut out = Vec::new();
    for (name, entry) in entries {
        if name == "__metadata__" {
            continue;
        }
        let dtype = entry.get("dtype").and_then(Value::as_str).unwrap_or("");
        let size = dtype_size(dtype)
            .ok_or_else(|| bad(format!("tensor `{name}` has unknown dtype `{dtype}`")))?;
        let shape: Vec<u64> = entry
            .get("shape")
            .and_then(Value::as_array)
            .and_then(|s| s.iter().map(Value::as_u64).collect())
            .ok_or_else(|| bad(format!("tensor `{name}` has no valid shape")))?;
        let offsets: Vec<u64> = entry
            .get("data_offsets")
            .and_then(Value::as_array)
            .and_then(|s| s.iter().map(Value::as_u64).collect())
            .filter(|o: &Vec<u64>| o.len() == 2)
            .ok_or_else(|| bad(format!("tensor `{name}` has no valid data_offsets")))?;
        let count = shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        let expected = count.and_then(|c| c.checked_mul(size));
        if offsets[1] < offsets[0] || Some(offsets[1] - offsets[0]) != expected {
            return Err(bad(format!(
                "tensor `{name}`: data_offsets {offsets:?} do not match shape {shape:?} of {dtype}"
            )));
        }
        if offsets[1] > data_len {
            return Err(bad(format!(
                "truncated: tensor `{name}` needs {} data bytes but the file holds {data_len}",
                offsets[1]
            )));
        }
        if shape.iter().any(|&d| d > i32::MAX as u64) {
            return Err(bad(format!("tensor `{name}` has a dimension too large for MLX")));
        }
        out.push((
            name.clone(),
            TensorInfo {
                dtype: dtype.to_string(),
                shape: shape.iter().map(|&d| d as i32).collect(),
                file: path.to_path_buf(),
            },
        ));
    }
    Ok(out)
}
