//! GGUF files (llama.cpp's single-file format): header, metadata, tensor directory, and the
//! conversion of its tensor types into MLX arrays.
//!
//! Every type whose blocks are affine in groups of 32 is repacked into MLX's affine quantization
//! (group 32) rather than expanded: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the 32-weight sub-blocks of
//! Q4_K and Q5_K (w = d·q + m becomes scale d, bias m). Q3_K, IQ4_NL and IQ4_XS are not affine at
//! their own width, but each weight is a per-32 scale times an integer that fits 8 bits, so they
//! are exact as 8-bit codes. Q2_K and Q6_K (scales per 16 weights, too wide for 8-bit codes) are
//! expanded to f16; F32, F16 and BF16 load as they are; every other type is refused by name
//! ([`GgmlType::storage`] says which is which). Every length and offset is checked against the
//! file size before use, so a truncated or corrupt file gives a typed error. `tests/gguf.rs`
//! checks every block type against gguf-py's dequantizers.

use super::error::{Error, Result};
use super::quant::{QuantFormat, QuantizedMatrix};
use half::f16;
use mlx_rs::{Array, Dtype};
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// Memory the metadata may take once read (a 256K-token vocabulary with its merges takes ~40 MB).
pub const MAX_METADATA_BYTES: u64 = 256 << 20;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    Int(i64),
    Uint(u64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<MetaValue>),
}

impl MetaValue {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            MetaValue::Uint(v) => Some(v),
            MetaValue::Int(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::Float(v) => Some(v),
            MetaValue::Uint(v) => Some(v as f64),
            MetaValue::Int(v) => Some(v as f64),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::Str(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetaValue::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[MetaValue]> {
        match self {
            MetaValue::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// Every ggml tensor type gguf-py 0.19.0 lists: (id, name, weights per block, bytes per block).
/// The sizes let the directory be bounds-checked even for types that are then refused by name.
const GGML_TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
    (40, "NVFP4", 64, 36),
    (41, "Q1_0", 128, 18),
];

/// The ggml tensor types this reader converts; any other is `Other(id)` and refused by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Iq4Nl,
    Iq4Xs,
    Bf16,
    Other(u32),
}

/// The supported types with their ids, in the order messages list them.
const SUPPORTED: [(u32, GgmlType); 15] = [
    (0, GgmlType::F32),
    (1, GgmlType::F16),
    (30, GgmlType::Bf16),
    (2, GgmlType::Q4_0),
    (3, GgmlType::Q4_1),
    (6, GgmlType::Q5_0),
    (7, GgmlType::Q5_1),
    (8, GgmlType::Q8_0),
    (10, GgmlType::Q2K),
    (11, GgmlType::Q3K),
    (12, GgmlType::Q4K),
    (13, GgmlType::Q5K),
    (14, GgmlType::Q6K),
    (20, GgmlType::Iq4Nl),
    (23, GgmlType::Iq4Xs),
];

/// How a GGML type is held once loaded (what `sala show` reports per type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// F32, F16 and BF16 load as they are.
    AsStored,
    /// Repacked exactly into MLX's affine quantization, group size 32; `note` says why it is
    /// exact when that is not plain (a codebook or 16-weight scales held as 8-bit codes).
    Affine { bits: i32, note: Option<&'static str> },
    /// Dequantized to f16: `reason` says why MLX's layout cannot hold the blocks.
    Expanded { reason: &'static str },
    Unsupported,
}

impl std::fmt::Display for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Storage::AsStored => write!(f, "loaded as stored"),
            Storage::Affine { bits, note: None } => write!(f, "kept as {bits}-bit affine, group 32 (exact)"),
            Storage::Affine { bits, note: Some(note) } => write!(f, "kept as {bits}-bit affine, group 32 (exact: {note})"),
            Storage::Expanded { reason } => write!(f, "expanded to f16 ({reason})"),
            Storage::Unsupported => write!(f, "not supported"),
        }
    }
}

/// Every type this reader converts, for messages.
pub fn supported_type_names() -> String {
    SUPPORTED.iter().map(|(_, t)| t.name()).collect::<Vec<_>>().join(", ")
}

/// "`what` not supported", the supported types and the fix.
fn not_supported(what: &str) -> String {
    format!(
        "{what} not supported (supported: {}); re-quantize the model to one of those \
         (e.g. llama.cpp's `llama-quantize model-f16.gguf out.gguf Q4_K_M`) or use its safetensors release",
        supported_type_names()
    )
}

impl GgmlType {
    pub fn from_id(id: u32) -> Self {
        SUPPORTED.iter().find(|(i, _)| *i == id).map_or(GgmlType::Other(id), |&(_, t)| t)
    }

    pub fn id(self) -> u32 {
        match self {
            GgmlType::Other(id) => id,
            t => SUPPORTED.iter().find(|(_, s)| *s == t).expect("every named type is in SUPPORTED").0,
        }
    }

    fn known(self) -> Option<&'static (u32, &'static str, u64, u64)> {
        GGML_TYPES.iter().find(|k| k.0 == self.id())
    }

    /// (elements per block, bytes per block) of the types whose size is known.
    fn block(self) -> Option<(u64, u64)> {
        self.known().map(|&(_, _, elements, bytes)| (elements, bytes))
    }

    /// llama.cpp's name (`Q4_K`, `IQ2_XXS`), or `type N` for an id it does not list.
    pub fn name(self) -> String {
        self.known().map_or_else(|| format!("type {}", self.id()), |k| k.1.to_string())
    }

    /// How tensors of this type are held in MLX.
    pub fn storage(self) -> Storage {
        use GgmlType::*;
        match self {
            F32 | F16 | Bf16 => Storage::AsStored,
            Q4_0 | Q4_1 | Q4K => Storage::Affine { bits: 4, note: None },
            Q5_0 | Q5_1 | Q5K => Storage::Affine { bits: 5, note: None },
            Q8_0 => Storage::Affine { bits: 8, note: None },
            Q3K => Storage::Affine { bits: 8, note: Some("16-weight scales times 3-bit codes are d times an integer in -124..128") },
            Iq4Nl | Iq4Xs => Storage::Affine { bits: 8, note: Some("the 16 codebook values are 16 of the 256 8-bit codes") },
            Q2K => Storage::Expanded { reason: "scales and minimums per 16 weights; MLX groups are 32 or more" },
            Q6K => Storage::Expanded {
                reason: "scales per 16 weights; MLX groups are 32 or more, and one scale per 32 would need 13-bit codes",
            },
            Other(_) => Storage::Unsupported,
        }
    }

    /// Why a type is refused and what to do instead.
    pub fn refusal(self) -> String {
        not_supported(&format!("tensor type {} is", self.name()))
    }
}

/// One entry of the tensor directory.
#[derive(Debug, Clone)]
pub struct GgufTensor {
    pub name: String,
    /// ggml order: `dims[0]` is the contiguous (row) dimension.
    pub dims: Vec<u64>,
    pub kind: GgmlType,
    /// Absolute offset of the data in the file.
    pub offset: u64,
    pub nbytes: u64,
}

impl GgufTensor {
    /// The row-major (numpy/HF) shape: ggml's dims reversed.
    pub fn shape(&self) -> Vec<i32> {
        self.dims.iter().rev().map(|&d| d as i32).collect()
    }
}

/// A tensor converted for MLX.
pub enum Converted {
    Float(Array),
    Quantized(QuantizedMatrix),
}

pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, MetaValue>,
    pub tensors: Vec<GgufTensor>,
}

/// Bounds-checked little-endian reader over the header.
struct HeaderReader<R> {
    inner: R,
    path: PathBuf,
    file_len: u64,
    pos: u64,
    /// Memory the metadata read so far takes ([`MAX_METADATA_BYTES`] at most).
    metadata_bytes: u64,
}

impl<R: Read> HeaderReader<R> {
    fn bad(&self, message: impl Into<String>) -> Error {
        Error::BadWeights { path: self.path.clone(), message: format!("GGUF: {}", message.into()) }
    }

    fn bytes(&mut self, n: u64) -> Result<Vec<u8>> {
        if self.pos + n > self.file_len {
            return Err(self.bad(format!(
                "truncated: the header needs {} bytes at offset {} but the file has {}",
                n, self.pos, self.file_len
            )));
        }
        let mut buf = vec![0u8; n as usize];
        self.inner.read_exact(&mut buf).map_err(|e| Error::io(&self.path, e))?;
        self.pos += n;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        Ok(self.bytes(N as u64)?.try_into().expect("N bytes"))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count that must fit in what is left of the file (`min_size` bytes per item).
    fn count(&mut self, what: &str, min_size: u64) -> Result<u64> {
        let n = self.u64()?;
        if n.saturating_mul(min_size.max(1)) > self.file_len - self.pos {
            return Err(self.bad(format!(
                "corrupt or truncated: {what} count {n} cannot fit in the {}-byte file",
                self.file_len
            )));
        }
        Ok(n)
    }

    /// Counts `bytes` of memory against the metadata's budget.
    fn charge(&mut self, bytes: u64) -> Result<()> {
        self.metadata_bytes = self.metadata_bytes.saturating_add(bytes);
        if self.metadata_bytes > MAX_METADATA_BYTES {
            return Err(self.bad(format!(
                "the metadata would take more than {} MiB of memory; the file is corrupt or hostile",
                MAX_METADATA_BYTES >> 20
            )));
        }
        Ok(())
    }

    fn string(&mut self) -> Result<String> {
        let n = self.count("string length", 1)?;
        let bytes = self.bytes(n)?;
        String::from_utf8(bytes).map_err(|_| self.bad(format!("corrupt: a string at offset {} is not UTF-8", self.pos)))
    }

    fn value(&mut self, kind: u32, depth: usize) -> Result<MetaValue> {
        self.charge(std::mem::size_of::<MetaValue>() as u64)?;
        Ok(match kind {
            0 => MetaValue::Uint(self.array::<1>()?[0] as u64),
            1 => MetaValue::Int(self.array::<1>()?[0] as i8 as i64),
            2 => MetaValue::Uint(u16::from_le_bytes(self.array()?) as u64),
            3 => MetaValue::Int(i16::from_le_bytes(self.array()?) as i64),
            4 => MetaValue::Uint(self.u32()? as u64),
            5 => MetaValue::Int(i32::from_le_bytes(self.array()?) as i64),
            6 => MetaValue::Float(f32::from_le_bytes(self.array()?) as f64),
            7 => MetaValue::Bool(self.array::<1>()?[0] != 0),
            8 => {
                let s = self.string()?;
                self.charge(s.len() as u64)?;
                MetaValue::Str(s)
            }
            9 if depth < 2 => {
                let item_kind = self.u32()?;
                let n = self.count("array", 1)?;
                let mut items = Vec::with_capacity(n.min(1 << 20) as usize);
                for _ in 0..n {
                    items.push(self.value(item_kind, depth + 1)?);
                }
                MetaValue::Array(items)
            }
            10 => MetaValue::Uint(self.u64()?),
            11 => MetaValue::Int(i64::from_le_bytes(self.array()?)),
            12 => MetaValue::Float(f64::from_le_bytes(self.array()?)),
            other => return Err(self.bad(format!("corrupt: unknown metadata value type {other}"))),
        })
    }
}

impl GgufFile {
    /// Reads and validates the header and tensor directory (no tensor data).
    pub fn open(path: &Path) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
        let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        Self::from_reader(std::io::BufReader::new(file), file_len, path)
    }

    /// Reads the header from `inner`, which holds a file of `file_len` bytes named `path`.
    pub fn from_reader(inner: impl Read, file_len: u64, path: &Path) -> Result<Self> {
        let mut r = HeaderReader { inner, path: path.into(), file_len, pos: 0, metadata_bytes: 0 };
        if r.bytes(4).ok().as_deref() != Some(MAGIC) {
            return Err(r.bad("not a GGUF file (bad magic)"));
        }
        let version = r.u32()?;
        if !(2..=3).contains(&version) {
            return Err(r.bad(format!("version {version} is not supported (2 or 3)")));
        }
        let n_tensors = r.count("tensor", 24)?;
        let n_kv = r.count("metadata", 12)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = r.string()?;
            r.charge(key.len() as u64)?;
            let kind = r.u32()?;
            let value = r.value(kind, 0)?;
            metadata.insert(key, value);
        }
        // The count is bounded by the file's size, not by memory: grow as entries are read.
        let mut raw = Vec::with_capacity(n_tensors.min(1 << 12) as usize);
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()?;
            if !(1..=4).contains(&n_dims) {
                return Err(r.bad(format!("tensor `{name}` has {n_dims} dimensions")));
            }
            let dims = (0..n_dims).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
            // MLX shapes are i32, and a matrix's rows are the product of the outer dimensions.
            if dims.iter().any(|&d| d == 0 || d > i32::MAX as u64) || dims[1..].iter().try_fold(1u64, |a, &d| a.checked_mul(d)).is_none_or(|rows| rows > i32::MAX as u64) {
                return Err(r.bad(format!("tensor `{name}` has dimensions {dims:?}, outside 1..2^31 (corrupt)")));
            }
            let kind = GgmlType::from_id(r.u32()?);
            let offset = r.u64()?;
            raw.push((name, dims, kind, offset));
        }
        let alignment = metadata.get("general.alignment").and_then(MetaValue::as_u64).unwrap_or(DEFAULT_ALIGNMENT);
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(r.bad(format!("general.alignment {alignment} is not a power of two")));
        }
        let data_start = r.pos.div_ceil(alignment) * alignment;
        let mut tensors = Vec::with_capacity(raw.len());
        for (name, dims, kind, offset) in raw {
            let nbytes = match kind.block() {
                Some((per_block, bytes)) => {
                    if dims[0] % per_block != 0 {
                        return Err(r.bad(format!(
                            "tensor `{name}`: row length {} is not a multiple of the {} block size {per_block}",
                            dims[0],
                            kind.name()
                        )));
                    }
                    dims.iter()
                        .try_fold(1u64, |a, &d| a.checked_mul(d))
                        .and_then(|n| (n / per_block).checked_mul(bytes))
                        .ok_or_else(|| r.bad(format!("tensor `{name}` has dimensions {dims:?} whose size overflows (corrupt)")))?
                }
                // Unknown sizes are only an error if the tensor is used (see `convert`).
                None => 0,
            };
            if offset % alignment != 0 {
                return Err(r.bad(format!("tensor `{name}`: offset {offset} is not a multiple of the alignment {alignment} (corrupt)")));
            }
            let end = data_start.checked_add(offset).and_then(|start| start.checked_add(nbytes));
            let start = data_start.saturating_add(offset);
            if end.is_none_or(|end| end > file_len) {
                return Err(r.bad(format!(
                    "truncated: tensor `{name}` needs {nbytes} bytes at offset {start} but the file has {file_len}"
                )));
            }
            tensors.push(GgufTensor { name, dims, kind, offset: start, nbytes });
        }
        Ok(Self { path: path.into(), version, metadata, tensors })
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata.get(key)
    }

    fn missing(&self, key: &str, what: &str) -> Error {
        Error::BadWeights { path: self.path.clone(), message: format!("GGUF metadata `{key}`: missing or not {what}") }
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        self.get(key).and_then(MetaValue::as_str).ok_or_else(|| self.missing(key, "a string"))
    }
    pub fn u64(&self, key: &str) -> Result<u64> {
        self.get(key).and_then(MetaValue::as_u64).ok_or_else(|| self.missing(key, "an integer"))
    }
    pub fn f64(&self, key: &str) -> Result<f64> {
        self.get(key).and_then(MetaValue::as_f64).ok_or_else(|| self.missing(key, "a number"))
    }
    pub fn strings(&self, key: &str) -> Result<Vec<&str>> {
        self.get(key)
            .and_then(MetaValue::as_array)
            .and_then(|items| items.iter().map(MetaValue::as_str).collect())
            .ok_or_else(|| self.missing(key, "a list of strings"))
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    fn read(&self, t: &GgufTensor) -> Result<Vec<u8>> {
        let mut file = std::fs::File::open(&self.path).map_err(|e| Error::io(&self.path, e))?;
        let mut bytes = vec![0u8; t.nbytes as usize];
        file.seek(SeekFrom::Start(t.offset))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(|e| Error::io(&self.path, e))?;
        Ok(bytes)
    }

    /// Reads tensor `t` and converts it to MLX (quantized types stay quantized).
    pub fn convert(&self, t: &GgufTensor) -> Result<Converted> {
        let shape = t.shape();
        let bytes = self.read(t)?;
        convert_bytes(&bytes, t.kind, &shape).map_err(|message| Error::BadWeights {
            path: self.path.clone(),
            message: format!("GGUF tensor `{}`: {message}", t.name),
        })
    }

    /// How many tensors the file holds of each type, in type order.
    pub fn type_counts(&self) -> Vec<(GgmlType, usize)> {
        let mut counts: BTreeMap<GgmlType, usize> = BTreeMap::new();
        for t in &self.tensors {
            *counts.entry(t.kind).or_default() += 1;
        }
        counts.into_iter().collect()
    }

    /// Refuses a file holding any tensor type this reader does not convert, naming each such type
    /// (with a tensor of it) before anything is read.
    pub fn check_types(&self) -> Result<()> {
        let refused: Vec<String> = self
            .type_counts()
            .into_iter()
            .filter(|(kind, _)| kind.storage() == Storage::Unsupported)
            .map(|(kind, n)| {
                let example = self.tensors.iter().find(|t| t.kind == kind).map_or("", |t| t.name.as_str());
                format!("{} ({n} tensor{}, e.g. `{example}`)", kind.name(), if n == 1 { "" } else { "s" })
            })
            .collect();
        if refused.is_empty() {
            return Ok(());
        }
        let what = match refused.len() {
            1 => format!("GGUF tensor type {} is", refused[0]),
            _ => format!("GGUF tensor types {} are", refused.join(", ")),
        };
        Err(Error::BadWeights { path: self.path.clone(), message: not_supported(&what) })
    }
}

/// Converts raw GGUF tensor data of `kind` with row-major `shape` to MLX, as [`GgmlType::storage`]
/// says: affine types are repacked into MLX's layout (group 32), Q2_K and Q6_K expanded to f16.
///
/// Exactness: every product below (an f16 d times a small integer, then times a code) fits in
/// f32's 24-bit significand, so MLX's `scale·code + bias` gives gguf-py's values bit for bit.
/// Scales and biases are stored in f16 when every one of them is exact there, else in f32.
pub fn convert_bytes(bytes: &[u8], kind: GgmlType, shape: &[i32]) -> std::result::Result<Converted, String> {
    if kind.storage() == Storage::Unsupported {
        return Err(kind.refusal());
    }
    // Every MLX array below is made from `bytes` with `shape`: they must agree exactly.
    let numel = shape.iter().try_fold(1u64, |a, &d| u64::try_from(d).ok().filter(|&d| d > 0).and_then(|d| a.checked_mul(d)));
    if let (Some((per_block, block_bytes)), Some(n)) = (kind.block(), numel) {
        let cols = shape.last().map_or(0, |&c| c as u64);
        if !cols.is_multiple_of(per_block) || (n / per_block).checked_mul(block_bytes) != Some(bytes.len() as u64) {
            return Err(format!("{} bytes of {} do not make shape {shape:?}", bytes.len(), kind.name()));
        }
    } else if kind.block().is_some() {
        return Err(format!("shape {shape:?} is not a valid tensor shape"));
    }
    let float = |dtype| {
        // SAFETY: the directory check made `bytes` exactly numel × itemsize long.
        Converted::Float(unsafe { Array::from_raw_data(bytes.as_ptr().cast(), shape, dtype) })
    };
    let Some(&cols) = shape.last() else { return Err("has no dimensions".into()) };
    let rows = (shape.iter().map(|&d| d as i64).product::<i64>() / cols as i64) as i32;
    let matrix = |g: AffineGroups, bits: i32| {
        let packed = pack_codes(&g.codes, bits);
        // SAFETY: `packed` holds rows × cols·bits/8 bytes, i.e. the u32 words of the shape.
        let packed = unsafe { Array::from_raw_data(packed.as_ptr().cast(), &[rows, cols * bits / 32], Dtype::Uint32) };
        let group_shape = [rows, cols / 32];
        let f16_exact = g.scales.iter().chain(&g.biases).all(|&v| f16::from_f32(v).to_f32() == v);
        let (scales, biases) = if f16_exact {
            let half = |v: &[f32]| Array::from_slice(&v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>(), &group_shape);
            (half(&g.scales), half(&g.biases))
        } else {
            (Array::from_slice(&g.scales, &group_shape), Array::from_slice(&g.biases, &group_shape))
        };
        Converted::Quantized(QuantizedMatrix { packed, scales, biases, format: QuantFormat { group_size: 32, bits } })
    };
    let expanded = |values: Vec<f32>| {
        let values: Vec<f16> = values.into_iter().map(f16::from_f32).collect();
        Converted::Float(Array::from_slice(&values, shape))
    };
    let bits = match kind.storage() {
        Storage::Affine { bits, .. } => bits,
        _ => 0,
    };
    Ok(match kind {
        GgmlType::F32 => float(Dtype::Float32),
        GgmlType::F16 => float(Dtype::Float16),
        GgmlType::Bf16 => float(Dtype::Bfloat16),
        GgmlType::Q8_0 => matrix(q8_0(bytes), bits),
        GgmlType::Q4_0 | GgmlType::Q4_1 => matrix(q4_legacy(bytes, kind == GgmlType::Q4_1), bits),
        GgmlType::Q5_0 | GgmlType::Q5_1 => matrix(q5_legacy(bytes, kind == GgmlType::Q5_1), bits),
        GgmlType::Q4K => matrix(q4_k(bytes), bits),
        GgmlType::Q5K => matrix(q5_k(bytes), bits),
        GgmlType::Q3K => matrix(q3_k(bytes), bits),
        GgmlType::Iq4Nl => matrix(iq4_nl(bytes), bits),
        GgmlType::Iq4Xs => matrix(iq4_xs(bytes), bits),
        GgmlType::Q6K => expanded(q6_k(bytes)),
        GgmlType::Q2K => expanded(q2_k(bytes)),
        GgmlType::Other(_) => return Err(kind.refusal()),
    })
}

/// Unsigned codes per weight and, per group of 32, w = scale·code + bias.
#[derive(Default)]
struct AffineGroups {
    codes: Vec<u8>,
    scales: Vec<f32>,
    biases: Vec<f32>,
}

impl AffineGroups {
    fn push(&mut self, codes: impl IntoIterator<Item = u8>, scale: f32, bias: f32) {
        self.codes.extend(codes);
        self.scales.push(scale);
        self.biases.push(bias);
    }
}

/// MLX's packing: each row a little-endian bit stream of `bits`-bit codes, read as u32 words.
fn pack_codes(codes: &[u8], bits: i32) -> Vec<u8> {
    let bits = bits as usize;
    let mut out = vec![0u8; codes.len() * bits / 8];
    for (i, &c) in codes.iter().enumerate() {
        let at = i * bits;
        let word = (c as u16) << (at % 8);
        out[at / 8] |= word as u8;
        if at % 8 + bits > 8 {
            out[at / 8 + 1] |= (word >> 8) as u8;
        }
    }
    out
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Q8_0: f16 d, 32 × i8; w = d·q (code q+128, bias −128d).
fn q8_0(bytes: &[u8]) -> AffineGroups {
    let mut g = AffineGroups::default();
    for block in bytes.chunks_exact(34) {
        let d = f16_at(block, 0);
        g.push(block[2..].iter().map(|&q| (q as i8 as i16 + 128) as u8), d, -128.0 * d);
    }
    g
}

/// Q4_0 (f16 d; w = d·(q−8)) and Q4_1 (f16 d, f16 m; w = d·q + m): byte j holds weight j in its
/// low nibble and weight j+16 in its high nibble.
fn q4_legacy(bytes: &[u8], with_min: bool) -> AffineGroups {
    let size = if with_min { 20 } else { 18 };
    let mut g = AffineGroups::default();
    for block in bytes.chunks_exact(size) {
        let d = f16_at(block, 0);
        let qs = &block[size - 16..];
        g.push((0..32).map(|e| nibble(qs, e)), d, if with_min { f16_at(block, 2) } else { -8.0 * d });
    }
    g
}

/// Weight `e` (0..32) of a 32-weight block whose 16 bytes hold weight j in the low nibble of
/// byte j and weight j+16 in its high nibble (Q4_0, Q4_1, Q5_*, IQ4_NL, IQ4_XS sub-blocks).
fn nibble(qs: &[u8], e: usize) -> u8 {
    if e < 16 {
        qs[e] & 0x0f
    } else {
        qs[e - 16] >> 4
    }
}

/// Q5_0 (f16 d, u32 qh, 16 nibble bytes; w = d·(q−16)) and Q5_1 (f16 d, f16 m, then the same;
/// w = d·q + m): bit e of qh is the fifth bit of weight e.
fn q5_legacy(bytes: &[u8], with_min: bool) -> AffineGroups {
    let size = if with_min { 24 } else { 22 };
    let mut g = AffineGroups::default();
    for block in bytes.chunks_exact(size) {
        let d = f16_at(block, 0);
        let qh = u32::from_le_bytes(block[size - 20..size - 16].try_into().expect("4 bytes"));
        let qs = &block[size - 16..];
        let codes = (0..32).map(|e| nibble(qs, e) | ((((qh >> e) & 1) as u8) << 4));
        g.push(codes, d, if with_min { f16_at(block, 2) } else { -16.0 * d });
    }
    g
}

/// IQ4_NL / IQ4_XS codebook (ggml's `kvalues_iq4nl`).
const IQ4_VALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// A codebook nibble as an unsigned 8-bit code: value + 128 (bias −128·scale).
fn iq4_code(nib: u8) -> u8 {
    (IQ4_VALUES[nib as usize] as i16 + 128) as u8
}

/// IQ4_NL: f16 d, 16 nibble bytes; w = d·kvalues[nibble].
fn iq4_nl(bytes: &[u8]) -> AffineGroups {
    let mut g = AffineGroups::default();
    for block in bytes.chunks_exact(18) {
        let (d, qs) = (f16_at(block, 0), &block[2..]);
        g.push((0..32).map(|e| iq4_code(nibble(qs, e))), d, -128.0 * d);
    }
    g
}

/// IQ4_XS: 256 weights = 8 sub-blocks of 32; f16 d, u16 high scale bits, 4 bytes of low scale
/// nibbles, 8 × 16 nibble bytes; w = d·(ls−32)·kvalues[nibble] with a 6-bit ls per sub-block.
fn iq4_xs(bytes: &[u8]) -> AffineGroups {
    let mut g = AffineGroups::default();
    for block in bytes.chunks_exact(136) {
        let (d, scales_h, scales_l, qs) = (f16_at(block, 0), u16::from_le_bytes([block[2], block[3]]), &block[4..8], &block[8..]);
        for ib in 0..8 {
            let ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f) | ((((scales_h >> (2 * ib)) & 3) as u8) << 4);
            let scale = d * (ls as f32 - 32.0);
            let sub = &qs[16 * ib..16 * ib + 16];
            g.push((0..32).map(|e| iq4_code(nibble(sub, e))), scale, -128.0 * scale);
        }
    }
    g
}

/// The 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes of Q4_K / Q5_K.
fn k_scale_min(scales: &[u8], j: usize) -> (f32, f32) {
    let (sc, m) = if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        ((scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4), (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))
    };
    (sc as f32, m as f32)
}

/// Q4_K: 256 weights = 8 groups of 32; f16 d, dmin, 12 scale bytes, 128 nibble bytes (each 32
/// bytes: low nibbles one group, high nibbles the next); w = d·sc·q − dmin·m.
fn q4_k(bytes: &[u8]) -> AffineGroups {
    let mut g = AffineGroups::default();
    for block in bytes.chunks_exact(144) {
        let (d, dmin, scales, qs) = (f16_at(block, 0), f16_at(block, 2), &block[4..16], &block[16..]);
        for j in 0..8 {
            let (sc, m) = k_scale_min(scales, j);
            let chunk = &qs[32 * (j / 2)..32 * (j / 2) + 32];
            let shift = 4 * (j % 2);
            g.push(chunk.iter().map(|&q| (q >> shift) & 0x0f), d * sc, -dmin * m);
        }
    }
    g
}

/// Q5_K: as Q4_K plus 32 bytes of fifth bits (bit j of byte l belongs to weight l of group j).
fn q5_k(bytes: &[u8]) -> AffineGroups {
    let mut g = AffineGroups::default();
    for block in bytes.chunks_exact(176) {
        let (d, dmin, scales) = (f16_at(block, 0), f16_at(block, 2), &block[4..16]);
        let (qh, qs) = (&block[16..48], &block[48..]);
        for j in 0..8 {
            let (sc, m) = k_scale_min(scales, j);
            let chunk = &qs[32 * (j / 2)..32 * (j / 2) + 32];
            let shift = 4 * (j % 2);
            let codes = chunk.iter().zip(qh).map(|(&q, &h)| ((q >> shift) & 0x0f) | (((h >> j) & 1) << 4));
            g.push(codes, d * sc, -dmin * m);
        }
    }
    g
}

/// Q6_K: 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales (one per 16
/// weights), f16 d; w = d·sc·(q − 32).
fn q6_k(bytes: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(bytes.len() / 210 * 256);
    for block in bytes.chunks_exact(210) {
        let (ql, qh, sc, d) = (&block[..128], &block[128..192], &block[192..208], f16_at(block, 208));
        let mut y = [0f32; 256];
        for half in 0..2 {
            let (ql, qh, sc) = (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..]);
            for l in 0..32 {
                let is = l / 16;
                let q = [
                    (ql[l] & 0x0f) | ((qh[l] & 3) << 4),
                    (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                ];
                for (k, &q) in q.iter().enumerate() {
                    y[128 * half + l + 32 * k] = d * (sc[is + 2 * k] as i8) as f32 * (q as i32 - 32) as f32;
                }
            }
        }
        out.extend_from_slice(&y);
    }
    out
}

/// Q3_K: 32 bytes of high bits (set = no −4), 64 bytes of 2-bit codes, 12 bytes of 6-bit scales
/// (offset 32), f16 d; w = d·(sc−32)·(q − 4·!high), 16 weights per scale. With one d per 256
/// weights, w = d·k for an integer k in −124..128: 8-bit code 128 − k, scale −d, bias 128·d.
fn q3_k(bytes: &[u8]) -> AffineGroups {
    let mut g = AffineGroups::default();
    for block in bytes.chunks_exact(110) {
        let (hmask, qs, packed, d) = (&block[..32], &block[32..96], &block[96..108], f16_at(block, 108));
        let scale = |i: usize| -> i32 {
            let low = if i < 8 { packed[i] & 0x0f } else { packed[i - 8] >> 4 };
            let high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
            (low | (high << 4)) as i32 - 32
        };
        let mut k = Vec::with_capacity(256);
        let mut is = 0;
        let mut bit = 0;
        for half in 0..2 {
            let q = &qs[32 * half..];
            for shift in (0..8).step_by(2) {
                for part in 0..2 {
                    let sc = scale(is);
                    is += 1;
                    for l in 16 * part..16 * part + 16 {
                        let code = ((q[l] >> shift) & 3) as i32 - if hmask[l] & (1 << bit) != 0 { 0 } else { 4 };
                        k.push(sc * code);
                    }
                }
                bit += 1;
            }
        }
        for group in k.chunks_exact(32) {
            g.push(group.iter().map(|&k| (128 - k) as u8), -d, 128.0 * d);
        }
    }
    g
}

/// Q2_K: 16 scale bytes (low nibble scale, high nibble min), 64 bytes of 2-bit codes, f16 d and
/// dmin; w = d·sc·q − dmin·m, 16 weights per scale.
fn q2_k(bytes: &[u8]) -> Vec<f32> {
    let mut out = Vec::with_capacity(bytes.len() / 84 * 256);
    for block in bytes.chunks_exact(84) {
        let (scales, qs, d, dmin) = (&block[..16], &block[16..80], f16_at(block, 80), f16_at(block, 82));
        let mut is = 0;
        for half in 0..2 {
            let q = &qs[32 * half..];
            for shift in (0..8).step_by(2) {
                for part in 0..2 {
                    let sc = scales[is];
                    is += 1;
                    let (dl, ml) = (d * (sc & 0x0f) as f32, dmin * (sc >> 4) as f32);
                    out.extend(q[16 * part..16 * part + 16].iter().map(|&b| dl * ((b >> shift) & 3) as f32 - ml));
                }
            }
        }
    }
    out
}

/// Pre-tokenizer regexes by llama.cpp's `tokenizer.ggml.pre` name (the HF tokenizers forms).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

impl GgufFile {
    /// The tokenizer stored in the metadata, as `tokenizer.json` + `tokenizer_config.json` texts;
    /// `None` when the file has no vocabulary.
    pub fn tokenizer_files(&self) -> Result<Option<super::tokenizer::TokenizerFiles>> {
        use serde_json::json;
        let Some(model) = self.get("tokenizer.ggml.model").and_then(MetaValue::as_str) else { return Ok(None) };
        let unsupported = |what: String| Error::Tokenizer(format!("{}: {what}", self.path.display()));
        let tokens = self.strings("tokenizer.ggml.tokens")?;
        let types: Vec<i64> = match self.get("tokenizer.ggml.token_type").and_then(MetaValue::as_array) {
            Some(items) => items.iter().map(|v| v.as_f64().unwrap_or(1.0) as i64).collect(),
            None => vec![1; tokens.len()],
        };
        let (tokenizer, default_add_bos) = match model {
            "gpt2" => (self.byte_level_bpe(&tokens, &types)?, false),
            "llama" => {
                let scores: Vec<f32> = self
                    .get("tokenizer.ggml.scores")
                    .and_then(MetaValue::as_array)
                    .and_then(|items| items.iter().map(|v| v.as_f64().map(|f| f as f32)).collect())
                    .ok_or_else(|| self.missing("tokenizer.ggml.scores", "a list of numbers"))?;
                let prefix = self.get("tokenizer.ggml.add_space_prefix").and_then(MetaValue::as_bool).unwrap_or(true);
                (sentencepiece_bpe(&tokens, &scores, &types, prefix).map_err(unsupported)?, true)
            }
            other => {
                return Err(unsupported(format!(
                    "tokenizer.ggml.model `{other}` is not supported (supported: `gpt2` byte-level BPE, \
                     `llama` SentencePiece BPE); use the model's safetensors release with its tokenizer.json"
                )))
            }
        };
        let default_add_bos = default_add_bos
            || matches!(self.get("tokenizer.ggml.pre").and_then(MetaValue::as_str), Some("llama3" | "llama-v3" | "llama-bpe"));
        let token = |key: &str| {
            self.get(key).and_then(MetaValue::as_u64).and_then(|id| tokens.get(id as usize)).map(|t| t.to_string())
        };
        let mut config = json!({
            "add_bos_token": self.get("tokenizer.ggml.add_bos_token").and_then(MetaValue::as_bool).unwrap_or(default_add_bos),
        });
        for (key, meta) in [("bos_token", "tokenizer.ggml.bos_token_id"), ("eos_token", "tokenizer.ggml.eos_token_id")] {
            if let Some(t) = token(meta) {
                config[key] = json!(t);
            }
        }
        if let Some(template) = self.get("tokenizer.chat_template").and_then(MetaValue::as_str) {
            config["chat_template"] = json!(template);
        }
        Ok(Some(super::tokenizer::TokenizerFiles {
            source: self.path.clone(),
            tokenizer_json: serde_json::to_string(&tokenizer).expect("JSON values serialise"),
            config,
            chat_template: None,
        }))
    }

    /// `tokenizer.ggml.model = gpt2`: byte-level BPE with the pre-tokenizer `tokenizer.ggml.pre` names.
    fn byte_level_bpe(&self, tokens: &[&str], types: &[i64]) -> Result<serde_json::Value> {
        use serde_json::json;
        let unsupported = |what: String| Error::Tokenizer(format!("{}: {what}", self.path.display()));
        let pre = self.get("tokenizer.ggml.pre").and_then(MetaValue::as_str).unwrap_or("default");
        let byte_level = |use_regex: bool, trim_offsets: bool| {
            json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": trim_offsets, "use_regex": use_regex})
        };
        let split = |regex: &str| {
            json!({"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false})
        };
        let pre_tokenizer = match pre {
            "default" | "gpt2" | "gpt-2" => byte_level(true, true),
            "smollm" | "starcoder" | "refact" => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true}, byte_level(true, true)]}),
            "llama3" | "llama-v3" | "llama-bpe" => {
                json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX), byte_level(false, true)]})
            }
            "qwen2" | "deepseek-r1-qwen" => {
                json!({"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), byte_level(false, false)]})
            }
            other => {
                return Err(unsupported(format!(
                    "pre-tokenizer `{other}` is not supported (supported: default, gpt2, smollm, llama3/llama-bpe, qwen2)"
                )))
            }
        };
        let merges = self.strings("tokenizer.ggml.merges")?;
        let vocab: serde_json::Map<String, serde_json::Value> =
            tokens.iter().enumerate().map(|(i, t)| (t.to_string(), json!(i))).collect();
        if vocab.len() != tokens.len() {
            return Err(unsupported("tokenizer.ggml.tokens has duplicate entries".into()));
        }
        Ok(json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": added_tokens(tokens, types, true),
            "normalizer": null, "pre_tokenizer": pre_tokenizer, "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": matches!(pre, "llama3" | "llama-v3" | "llama-bpe"),
                      "vocab": vocab, "merges": merges},
        }))
    }
}

/// Tokens matched whole, before the BPE model: control tokens (type 3), and for byte-level
/// vocabularies also user-defined ones (4). A SentencePiece vocabulary's user-defined pieces stay
/// ordinary pieces (score 0: merged first), as transformers converts them — made separate segments
/// they would each get their own `▁` prefix.
fn added_tokens(tokens: &[&str], types: &[i64], user_defined: bool) -> Vec<serde_json::Value> {
    tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|(_, (_, &ty))| ty == 3 || (ty == 4 && user_defined))
        .map(|(id, (t, &ty))| {
            serde_json::json!({"id": id, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                               "normalized": false, "special": ty == 3})
        })
        .collect()
}

/// A SentencePiece BPE vocabulary (pieces, scores, types; `▁` for spaces, `<0xNN>` byte pieces) as
/// an HF `tokenizer.json`, built the way transformers converts Llama's `tokenizer.model`: every
/// split of a piece into two pieces is a merge, merges ranked by the merged piece's score (highest
/// first; ties keep piece order, then the split's piece ids), byte fallback for unknown bytes,
/// `▁` prepended to the text when `add_space_prefix`.
pub fn sentencepiece_bpe(
    tokens: &[&str],
    scores: &[f32],
    types: &[i64],
    add_space_prefix: bool,
) -> std::result::Result<serde_json::Value, String> {
    use serde_json::json;
    if scores.len() != tokens.len() || types.len() != tokens.len() {
        return Err(format!(
            "{} tokens but {} scores and {} token types",
            tokens.len(),
            scores.len(),
            types.len()
        ));
    }
    let ids: std::collections::HashMap<&str, usize> = tokens.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let mut merges: Vec<(f32, usize, usize)> = Vec::new();
    for (piece, &score) in tokens.iter().zip(scores) {
        let mut local: Vec<(usize, usize)> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| Some((*ids.get(&piece[..at])?, *ids.get(&piece[at..])?)))
            .collect();
        local.sort();
        merges.extend(local.into_iter().map(|(l, r)| (score, l, r)));
    }
    // Stable: equal scores keep the order built above.
    merges.sort_by(|a, b| b.0.total_cmp(&a.0));
    let merges: Vec<serde_json::Value> = merges.iter().map(|&(_, l, r)| json!([tokens[l], tokens[r]])).collect();
    let vocab: serde_json::Map<String, serde_json::Value> =
        tokens.iter().enumerate().map(|(i, t)| (t.to_string(), json!(i))).collect();
    let unk = types.iter().position(|&t| t == 2).map(|i| tokens[i]);
    let mut normalizers = Vec::new();
    if add_space_prefix {
        normalizers.push(json!({"type": "Prepend", "prepend": "▁"}));
    }
    normalizers.push(json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}));
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_space_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    Ok(json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added_tokens(tokens, types, false),
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": null, "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": merges},
    }))
}
