//! Checkpoint tensors: `model.safetensors`, a sharded `model.safetensors.index.json`, a single
//! safetensors/`.sala` file, or tensors already in memory (converted from GGUF).
//!
//! Every file's header is validated before any data is read (truncated or corrupt files give a typed
//! error instead of a crash), and a model checks its full list of expected names and shapes before
//! anything runs: loading must never silently skip a misnamed tensor. A projection may be stored
//! quantized (MLX affine layout: packed `.weight` + `.scales` + `.biases`); its bits and group size
//! follow from the shapes and must agree with the config's `quantization` section.

use super::error::{Error, Result};
use super::quant::{QuantConfig, QuantFormat};
use mlx_rs::{ops::indexing::TryIndexOp, Array, Dtype};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
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
    /// Refuses a dimension MLX cannot hold (an i32), naming the tensor.
    pub fn new(name: impl Into<String>, shape: &[usize]) -> Result<Self> {
        let name = name.into();
        let dims: Option<Vec<i32>> = shape.iter().map(|&d| i32::try_from(d).ok()).collect();
        match dims {
            Some(shape) => Ok(Self { name, shape }),
            None => Err(Error::Usage(format!(
                "the config makes tensor `{name}` {shape:?}, larger than MLX's limit of {} per dimension; is the config corrupt?",
                i32::MAX
            ))),
        }
    }
}

/// Where a tensor's bytes are.
#[derive(Debug, Clone)]
enum Location {
    /// Absolute byte range in `TensorInfo::file`.
    File { offset: u64, len: u64 },
    Memory(Array),
}

/// Which part of a tensor to load: all of it, a block of its rows (first axis), or a block of its
/// columns (last axis).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    Whole,
    Rows(std::ops::Range<usize>),
    Cols(std::ops::Range<usize>),
}

/// Header facts of one tensor.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// Safetensors dtype name (`F32`, `BF16`, `U32`, ...).
    pub dtype: String,
    pub shape: Vec<i32>,
    /// The file it lives in (or was converted from), for messages.
    pub file: PathBuf,
    location: Location,
}

impl TensorInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product()
    }

    /// Stored size in bytes.
    pub fn nbytes(&self) -> u64 {
        self.numel() as u64 * dtype_size(&self.dtype).unwrap_or(0)
    }
}

pub struct Weights {
    /// The directory or file the user named, for messages.
    pub source: PathBuf,
    infos: BTreeMap<String, TensorInfo>,
    /// `__metadata__` of a single-file checkpoint (where `.sala` files keep config and tokenizer).
    metadata: BTreeMap<String, String>,
    quantization: Option<QuantConfig>,
    /// Quantized modules found by [`Weights::check`], by module name (`….q_proj`).
    quantized: HashMap<String, QuantFormat>,
    /// Non-persistent buffers some exporters save, which [`Weights::check`] set aside.
    skipped_buffers: Vec<String>,
    /// Moved by the bytes read from files, so a long load shows its progress.
    read_progress: Option<indicatif::ProgressBar>,
}

/// Last name parts of the buffers HF registers as non-persistent (rotary tables): derived from
/// the config, never trained, and skipped on load as transformers, vLLM and SGLang skip them.
const BUFFER_NAMES: &[&str] = &["inv_freq", "cos_cached", "sin_cached", "_cos_cached", "_sin_cached"];

/// Whether `name` is a non-persistent buffer rather than a weight.
pub fn is_buffer(name: &str) -> bool {
    name.rsplit('.').next().is_some_and(|last| BUFFER_NAMES.contains(&last))
}

impl Weights {
    /// Opens the checkpoint at `path`: a directory (single or sharded safetensors) or one
    /// safetensors file (any extension, e.g. `.sala`). Headers are validated; data loads on `get`.
    pub fn open(path: &Path) -> Result<Self> {
        let files: Vec<PathBuf> = if path.is_file() {
            vec![path.to_path_buf()]
        } else {
            let index = path.join(INDEX_FILE);
            let single = path.join(SINGLE_FILE);
            if index.is_file() {
                shard_files(&index)?
            } else if single.is_file() {
                vec![single]
            } else {
                return Err(Error::BadWeights {
                    path: path.to_path_buf(),
                    message: format!("no {SINGLE_FILE} or {INDEX_FILE} in this directory"),
                });
            }
        };
        let mut infos = BTreeMap::new();
        let mut metadata = BTreeMap::new();
        for file in &files {
            let header = read_header(file)?;
            if files.len() == 1 {
                metadata = header.metadata;
            }
            for (name, info) in header.tensors {
                if let Some(previous) = infos.insert(name.clone(), info) {
                    return Err(Error::BadWeights {
                        path: file.clone(),
                        message: format!("tensor `{name}` also appears in {}", previous.file.display()),
                    });
                }
            }
        }
        Ok(Self::new(path, infos, metadata))
    }

    /// Tensors already in memory (e.g. converted from a GGUF file at `source`).
    pub fn from_arrays(source: &Path, arrays: Vec<(String, Array)>) -> Result<Self> {
        let mut infos = BTreeMap::new();
        for (name, array) in arrays {
            let dtype = dtype_name(array.dtype()).ok_or_else(|| Error::BadWeights {
                path: source.into(),
                message: format!("tensor `{name}` has unsupported dtype {:?}", array.dtype()),
            })?;
            let info = TensorInfo {
                dtype: dtype.into(),
                shape: array.shape().to_vec(),
                file: source.into(),
                location: Location::Memory(array),
            };
            infos.insert(name, info);
        }
        Ok(Self::new(source, infos, BTreeMap::new()))
    }

    fn new(source: &Path, infos: BTreeMap<String, TensorInfo>, metadata: BTreeMap<String, String>) -> Self {
        Self { source: source.into(), infos, metadata, quantization: None, quantized: HashMap::new(), skipped_buffers: Vec::new(), read_progress: None }
    }

    pub fn infos(&self) -> &BTreeMap<String, TensorInfo> {
        &self.infos
    }

    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The config's `quantization` section, checked against the tensors by [`Weights::check`].
    pub fn set_quantization(&mut self, quantization: Option<QuantConfig>) {
        self.quantization = quantization;
    }

    /// The floating-point dtype most tensors are stored in (the checkpoint's own dtype).
    pub fn storage_dtype(&self) -> Option<Dtype> {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for (name, info) in &self.infos {
            if !name.ends_with(".scales") && !name.ends_with(".biases") {
                *counts.entry(info.dtype.as_str()).or_default() += 1;
            }
        }
        counts
            .into_iter()
            .filter_map(|(d, n)| float_dtype(d).map(|dt| (n, dt)))
            .max_by_key(|(n, _)| *n)
            .map(|(_, dt)| dt)
            .or_else(|| self.infos.values().find_map(|i| float_dtype(&i.dtype)))
    }

    /// The non-persistent buffers [`Weights::check`] skipped (they are no longer listed).
    pub fn skipped_buffers(&self) -> &[String] {
        &self.skipped_buffers
    }

    /// Checks that the checkpoint holds exactly `specs` (names and shapes), naming the first
    /// problem; non-persistent buffers (rotary `inv_freq`, cached cos/sin) are set aside.
    /// A 2-D `*.weight` may instead be stored quantized (packed weight + scales + biases); as in
    /// mlx-lm, the presence of `.scales` decides, and the config must agree on its format.
    pub fn check(&mut self, specs: &[TensorSpec], model_type: &str) -> Result<()> {
        let mut expected: HashSet<String> = HashSet::new();
        self.quantized.clear();
        for spec in specs {
            expected.insert(spec.name.clone());
            let module = spec.name.strip_suffix(".weight").filter(|_| spec.shape.len() == 2);
            if let Some(module) = module.filter(|m| self.infos.contains_key(&format!("{m}.scales"))) {
                let format = self.check_quantized(module, &spec.shape)?;
                self.quantized.insert(module.to_string(), format);
                expected.insert(format!("{module}.scales"));
                expected.insert(format!("{module}.biases"));
                continue;
            }
            let info = self.info(&spec.name, &spec.shape)?;
            if info.shape != spec.shape {
                return Err(Error::TensorShape {
                    path: info.file.clone(),
                    name: spec.name.clone(),
                    expected: spec.shape.clone(),
                    found: info.shape.clone(),
                });
            }
            if float_dtype(&info.dtype).is_none() {
                return Err(self.bad(
                    &spec.name,
                    format!("is stored as {}; expected F32, F16 or BF16", info.dtype),
                ));
            }
        }
        let buffers: Vec<String> = self.infos.keys().filter(|k| !expected.contains(k.as_str()) && is_buffer(k)).cloned().collect();
        for name in buffers {
            self.infos.remove(&name);
            self.skipped_buffers.push(name);
        }
        if let Some(extra) = self.infos.keys().find(|k| !expected.contains(k.as_str())) {
            return Err(Error::UnexpectedTensor {
                path: self.infos[extra].file.clone(),
                name: extra.clone(),
                model_type: model_type.into(),
            });
        }
        Ok(())
    }

    fn info(&self, name: &str, expected: &[i32]) -> Result<&TensorInfo> {
        self.infos.get(name).ok_or_else(|| Error::MissingTensor {
            path: self.source.clone(),
            name: name.into(),
            expected: expected.to_vec(),
        })
    }

    fn bad(&self, name: &str, message: String) -> Error {
        let path = self.infos.get(name).map_or(self.source.clone(), |i| i.file.clone());
        Error::BadWeights { path, message: format!("tensor `{name}` {message}") }
    }

    /// Validates a quantized `[out, in]` projection and returns its bits and group size.
    fn check_quantized(&self, module: &str, shape: &[i32]) -> Result<QuantFormat> {
        let (out, inner) = (shape[0], shape[1]);
        let weight_name = format!("{module}.weight");
        let scales_name = format!("{module}.scales");
        let biases_name = format!("{module}.biases");
        let weight = self.info(&weight_name, shape)?;
        let scales = self.info(&scales_name, &[])?;
        let biases = self.infos.get(&biases_name).ok_or_else(|| {
            self.bad(&scales_name, format!("has no `{biases_name}`: only MLX affine quantization is supported"))
        })?;
        if weight.dtype != "U32" || weight.shape.len() != 2 || weight.shape[0] != out {
            return Err(self.bad(
                &weight_name,
                format!(
                    "is quantized (has `.scales`) so it must be U32 [{out}, in·bits/32], found {} {:?}",
                    weight.dtype, weight.shape
                ),
            ));
        }
        // In i64: 32 × a stored dimension overflows i32.
        let packed = weight.shape[1] as i64;
        let bits = if inner > 0 { packed * 32 / inner as i64 } else { 0 };
        if inner == 0 || packed * 32 % inner as i64 != 0 || ![2, 3, 4, 5, 6, 8].contains(&bits) {
            return Err(self.bad(
                &weight_name,
                format!("packs {packed} words per row for {inner} inputs: not a supported bit width"),
            ));
        }
        if scales.shape.len() != 2 || scales.shape[0] != out || scales.shape[1] == 0 || inner % scales.shape[1] != 0 {
            return Err(self.bad(&scales_name, format!("has shape {:?}, expected [{out}, {inner}/group_size]", scales.shape)));
        }
        let group_size = inner / scales.shape[1];
        if biases.shape != scales.shape || float_dtype(&scales.dtype).is_none() || float_dtype(&biases.dtype).is_none() {
            return Err(self.bad(
                &biases_name,
                format!("must be a float tensor shaped like `{scales_name}` {:?}", scales.shape),
            ));
        }
        let found = QuantFormat { group_size, bits: bits as i32 };
        if let Some(config) = &self.quantization {
            if config.for_module(module) != Some(found) {
                return Err(self.bad(
                    &weight_name,
                    format!(
                        "is quantized with {bits} bits, group size {group_size}, but the config's `quantization` says {}",
                        config.for_module(module).map_or("not quantized".into(), |f| format!(
                            "{} bits, group size {}",
                            f.bits, f.group_size
                        ))
                    ),
                ));
            }
        }
        Ok(found)
    }

    /// How `module` is quantized (after [`Weights::check`]), `None` if it is stored in float.
    pub fn quantized(&self, module: &str) -> Option<QuantFormat> {
        self.quantized.get(module).copied()
    }

    /// Parameters of the model as trained (a quantized matrix counts its unpacked elements).
    pub fn n_params(&self) -> usize {
        self.infos
            .iter()
            .filter(|(name, _)| !name.ends_with(".scales") && !name.ends_with(".biases"))
            .map(|(name, info)| {
                let module = name.strip_suffix(".weight").unwrap_or(name);
                match self.quantized.get(module) {
                    Some(f) => info.numel() * 32 / f.bits as usize,
                    None => info.numel(),
                }
            })
            .sum()
    }

    /// Bytes of the tensors still in their files (what loading reads).
    pub fn file_bytes(&self) -> u64 {
        self.infos.values().filter_map(|i| match i.location {
            Location::File { len, .. } => Some(len),
            Location::Memory(_) => None,
        }).sum()
    }

    /// Moves `bar` (while set) by the bytes of each tensor read from its file.
    pub fn report_reads(&mut self, bar: Option<indicatif::ProgressBar>) {
        self.read_progress = bar;
    }

    fn read_done(&self, bytes: &[u8]) {
        if let Some(bar) = &self.read_progress {
            bar.inc(bytes.len() as u64);
        }
    }

    /// Loads one tensor in its stored dtype.
    pub fn raw(&self, name: &str) -> Result<Array> {
        let info = self.info(name, &[])?;
        match &info.location {
            Location::Memory(array) => Ok(array.clone()),
            Location::File { .. } => {
                let bytes = self.bytes(name)?;
                self.read_done(&bytes);
                self.array_of(name, info, &bytes, &info.shape)
            }
        }
    }

    /// `bytes` of tensor `name` (stored as `info` says) as an array of `shape`.
    fn array_of(&self, name: &str, info: &TensorInfo, bytes: &[u8], shape: &[i32]) -> Result<Array> {
        let dtype = stored_dtype(&info.dtype).ok_or_else(|| self.bad(name, format!("has dtype {} which MLX cannot load", info.dtype)))?;
        let numel: usize = shape.iter().map(|&d| d as usize).product();
        if bytes.len() as u64 != numel as u64 * dtype_size(&info.dtype).unwrap_or(0) {
            return Err(self.bad(name, format!("read {} bytes for shape {shape:?}", bytes.len())));
        }
        // SAFETY: `bytes` holds exactly numel × itemsize bytes (checked just above).
        Ok(unsafe { Array::from_raw_data(bytes.as_ptr().cast(), shape, dtype) })
    }

    /// Loads `part` of one tensor in its stored dtype, reading only that part from its file:
    /// a rank's shard of a matrix split for tensor parallelism.
    pub fn raw_part(&self, name: &str, part: &Part) -> Result<Array> {
        let info = self.info(name, &[])?;
        let (axis, range) = match part {
            Part::Whole => return self.raw(name),
            Part::Rows(r) => (0, r.clone()),
            Part::Cols(r) => (info.shape.len().saturating_sub(1), r.clone()),
        };
        let Some(&dim) = info.shape.get(axis) else {
            return Err(self.bad(name, "is a scalar; it cannot be split".into()));
        };
        if range.start > range.end || range.end > dim as usize {
            return Err(self.bad(name, format!("has {dim} entries along axis {axis}; part {range:?} is outside them")));
        }
        let mut shape = info.shape.clone();
        shape[axis] = range.len() as i32;
        match &info.location {
            Location::Memory(array) => {
                let slice = if axis == 0 {
                    array.try_index(range.start as i32..range.end as i32)?
                } else {
                    array.try_index((.., range.start as i32..range.end as i32))?
                };
                // Adding zero gives the part a buffer of its own, so the whole tensor can be freed.
                Ok(slice.add(crate::engine::ops::scalar(0.0, slice.dtype())?)?)
            }
            Location::File { offset, .. } => {
                let item = dtype_size(&info.dtype).unwrap_or(0);
                // Bytes of one entry along `axis`: a row of the rest, or one element.
                let inner: u64 = info.shape[axis + 1..].iter().map(|&d| d as u64).product::<u64>() * item;
                let outer: usize = info.shape[..axis].iter().map(|&d| d as usize).product();
                let stride = dim as u64 * inner;
                let (start, len) = (range.start as u64 * inner, range.len() as u64 * inner);
                let bytes = if outer == 1 {
                    read_range(&info.file, offset + start, len, &|_, _| Ok(()))?
                } else {
                    // A column block: one read per row, only this part's columns.
                    use std::os::unix::fs::FileExt;
                    let file = std::fs::File::open(&info.file).map_err(|e| Error::io(&info.file, e))?;
                    let mut buf = vec![0u8; outer * len as usize];
                    for (row, piece) in buf.chunks_mut(len as usize).enumerate() {
                        file.read_exact_at(piece, offset + row as u64 * stride + start).map_err(|e| Error::io(&info.file, e))?;
                    }
                    buf
                };
                self.read_done(&bytes);
                self.array_of(name, info, &bytes, &shape)
            }
        }
    }

    /// The stored bytes of a file-backed tensor (little-endian, as in the file).
    pub fn bytes(&self, name: &str) -> Result<Vec<u8>> {
        let info = self.info(name, &[])?;
        match &info.location {
            Location::File { offset, len } => read_range(&info.file, *offset, *len, &|_, _| Ok(())),
            Location::Memory(array) => {
                let array = array.clone();
                array.eval()?;
                Ok(crate::engine::ops::to_bytes(&array)?)
            }
        }
    }

    /// Where a file-backed tensor's bytes are: the file, the offset and the length.
    pub fn file_range(&self, name: &str) -> Result<(PathBuf, u64, u64)> {
        let info = self.info(name, &[])?;
        match &info.location {
            Location::File { offset, len } => Ok((info.file.clone(), *offset, *len)),
            Location::Memory(_) => Err(Error::Usage(format!("internal: tensor `{name}` is not in a file"))),
        }
    }

    /// Loads one tensor (after [`Weights::check`]) and casts it to `dtype`.
    pub fn get(&self, name: &str, dtype: Dtype) -> Result<Array> {
        self.get_part(name, &Part::Whole, dtype)
    }

    /// [`Weights::raw_part`] cast to `dtype`.
    pub fn get_part(&self, name: &str, part: &Part, dtype: Dtype) -> Result<Array> {
        let array = self.raw_part(name, part)?;
        Ok(if array.dtype() == dtype { array } else { array.as_dtype(dtype)? })
    }
}

/// The pieces a large tensor is read in, by several threads at once.
pub const READ_PIECE: usize = 16 << 20;

/// Reads `len` bytes of the file at `path` from `offset`, [`READ_PIECE`]s at a time by up to 8
/// threads (one thread reads a fast SSD, or the page cache, at a fraction of its speed), each
/// piece handed to `check` (its index and bytes) by the thread that read it.
pub fn read_range(path: &Path, offset: u64, len: u64, check: &(dyn Fn(usize, &[u8]) -> Result<()> + Sync)) -> Result<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut buf = vec![0u8; len as usize];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8).min((len as usize).div_ceil(READ_PIECE)).max(1);
    let pieces = std::sync::Mutex::new(buf.chunks_mut(READ_PIECE).enumerate());
    let work = || -> Result<()> {
        loop {
            let next = pieces.lock().unwrap_or_else(|e| e.into_inner()).next();
            let Some((i, piece)) = next else { return Ok(()) };
            file.read_exact_at(piece, offset + (i * READ_PIECE) as u64).map_err(|e| Error::io(path, e))?;
            check(i, piece)?;
        }
    };
    if threads == 1 {
        work()?;
    } else {
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads).map(|_| scope.spawn(work)).collect();
            workers
                .into_iter()
                .try_for_each(|w| w.join().unwrap_or_else(|_| Err(Error::Usage("internal: a reading thread panicked".into()))))
        })?;
    }
    Ok(buf)
}

pub fn float_dtype(name: &str) -> Option<Dtype> {
    match name {
        "F32" => Some(Dtype::Float32),
        "F16" => Some(Dtype::Float16),
        "BF16" => Some(Dtype::Bfloat16),
        _ => None,
    }
}

/// MLX dtype of a safetensors dtype name.
pub fn stored_dtype(name: &str) -> Option<Dtype> {
    Some(match name {
        "BOOL" => Dtype::Bool,
        "U8" => Dtype::Uint8,
        "I8" => Dtype::Int8,
        "U16" => Dtype::Uint16,
        "I16" => Dtype::Int16,
        "U32" => Dtype::Uint32,
        "I32" => Dtype::Int32,
        "U64" => Dtype::Uint64,
        "I64" => Dtype::Int64,
        other => return float_dtype(other),
    })
}

/// Safetensors dtype name of an MLX dtype.
pub fn dtype_name(dtype: Dtype) -> Option<&'static str> {
    Some(match dtype {
        Dtype::Bool => "BOOL",
        Dtype::Uint8 => "U8",
        Dtype::Int8 => "I8",
        Dtype::Uint16 => "U16",
        Dtype::Int16 => "I16",
        Dtype::Uint32 => "U32",
        Dtype::Int32 => "I32",
        Dtype::Uint64 => "U64",
        Dtype::Int64 => "I64",
        Dtype::Float32 => "F32",
        Dtype::Float16 => "F16",
        Dtype::Bfloat16 => "BF16",
        _ => return None,
    })
}

/// Bytes per element of a safetensors dtype.
pub fn dtype_size(name: &str) -> Option<u64> {
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

/// A safetensors header as the format defines it (the crate's tensor entries), before checking.
#[derive(serde::Deserialize)]
struct SafetensorsHeader {
    #[serde(rename = "__metadata__")]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(flatten)]
    tensors: BTreeMap<String, safetensors::tensor::TensorInfo>,
}

/// A validated safetensors header.
pub struct Header {
    pub tensors: Vec<(String, TensorInfo)>,
    pub metadata: BTreeMap<String, String>,
}

/// Reads and validates a safetensors header against the file's real size.
pub fn read_header(path: &Path) -> Result<Header> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    parse_header(file, file_len, path)
}

/// Reads and validates the header of a safetensors file of `file_len` bytes from `file`, which
/// is at its start; `path` names it in messages.
pub fn parse_header(mut file: impl Read, file_len: u64, path: &Path) -> Result<Header> {
    let bad = |message: String| Error::BadWeights { path: path.into(), message };
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
    let header: SafetensorsHeader = serde_json::from_slice(&header).map_err(|e| bad(format!("corrupt header ({e})")))?;
    let data_start = 8 + header_len;
    let data_len = file_len - data_start;
    let mut out = Header { tensors: Vec::new(), metadata: header.metadata.unwrap_or_default() };
    for (name, entry) in header.tensors {
        let dtype = entry.dtype.to_string();
        let size = dtype_size(&dtype).ok_or_else(|| bad(format!("tensor `{name}` has dtype `{dtype}`, which sala does not read")))?;
        let shape: Vec<u64> = entry.shape.iter().map(|&d| d as u64).collect();
        let offsets = [entry.data_offsets.0 as u64, entry.data_offsets.1 as u64];
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
        out.tensors.push((
            name,
            TensorInfo {
                dtype,
                shape: shape.iter().map(|&d| d as i32).collect(),
                file: path.to_path_buf(),
                location: Location::File { offset: data_start + offsets[0], len: offsets[1] - offsets[0] },
            },
        ));
    }
    Ok(out)
}
