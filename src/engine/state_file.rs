//! Prompt caches on disk: a sequence's token ids and model state (attention keys, values and
//! pooled keys after all of them, recurrent states at each restart point), so a document
//! processed once can be asked again after the process is gone.
//!
//! The file is a safetensors file (readable by any safetensors tool) whose metadata says what
//! made it: a digest of the model (config, tensor names, shapes and dtypes, every tensor's bytes
//! through [`super::tensor_digests`], the dtype it ran in) and of the tokenizer files, so a state
//! is never continued by a model it does not belong to. Each tensor's xxh3 digests and a checksum
//! of the header are in the metadata, so a corrupted file is refused rather than continued from;
//! and since digests can be forged, what is read is checked too: every layer's state there, in
//! the model's shapes, token ids in its vocabulary, no NaN or infinity. It is written beside its
//! place ([`super::checkpoint::partial_file`]) and renamed into it once complete. Only what a
//! prompt restarts from is read: the attention buffers and one restart point's recurrent states.

use super::cache::{Checkpoint, KeyWindowsState, KvFormat, LayerState, ModelCache, RecurrentState};
use super::error::{Error, Result};
use super::model::{LanguageModel, Logits};
use super::prefix_cache::{common_prefix, Trail};
use super::source::ModelSource;
use super::weights::{dtype_name, read_range, stored_dtype, Weights, READ_PIECE};
use mlx_rs::{Array, Dtype};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const FORMAT: &str = "sala-prompt-cache";
/// Version 5 is a state of a quantized KV cache (`--kv-bits`, its format in metadata `kv`):
/// only those files are written as 5, so a build that reads only plain states refuses them by
/// version. 4 and 5 added the header's checksum and a model digest of every tensor's bytes; 2
/// and 3 (before them) are refused by version.
const VERSION: &str = "4";
const VERSION_QUANTIZED_KV: &str = "5";
/// Tensors up to this size go into the layout fingerprint with their bytes, up to a total.
const LAYOUT_DIGEST_TENSOR_BYTES: u64 = 1 << 20;
const LAYOUT_DIGEST_TOTAL_BYTES: u64 = 64 << 20;

/// What made a state: digests of the model (as it runs) and of its tokenizer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fingerprint {
    pub model: String,
    pub tokenizer: String,
    /// Whether `model` covers every byte of every tensor ([`Fingerprint::of`]); only such a
    /// fingerprint may write or read a state file.
    pub every_byte: bool,
}

impl Fingerprint {
    /// The digests of `source` run in `dtype`, over every byte of every tensor (their digests
    /// are cached beside the user's other caches): what state files are checked against.
    pub fn of(source: &ModelSource, dtype: Dtype) -> Result<Self> {
        let digests = super::tensor_digests::of(&source.weights)?;
        Ok(Self::with(source, dtype, |name| digests.get(name).cloned().unwrap_or_default()))
    }

    /// The digests of `source` run in `dtype` over its config, tensor names, dtypes and shapes,
    /// and the bytes of its small tensors (norms, biases, small tables: what random or retrained
    /// weights differ in): enough for ranks to agree on the model, without reading gigabytes at
    /// each load.
    pub fn of_layout(source: &ModelSource, dtype: Dtype) -> Result<Self> {
        let mut budget = LAYOUT_DIGEST_TOTAL_BYTES;
        let mut small = BTreeMap::new();
        for (name, info) in source.weights.infos() {
            if info.nbytes() <= LAYOUT_DIGEST_TENSOR_BYTES && info.nbytes() <= budget {
                budget -= info.nbytes();
                small.insert(name.as_str(), format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&source.weights.bytes(name)?)));
            }
        }
        Ok(Self { every_byte: false, ..Self::with(source, dtype, |name| small.get(name).cloned().unwrap_or_default()) })
    }

    fn with(source: &ModelSource, dtype: Dtype, digest: impl Fn(&str) -> String) -> Self {
        let mut model = Sha256::new();
        model.update(format!("{dtype:?}\n"));
        if let Some(config) = source.files.get(super::source::CONFIG_FILE) {
            model.update(config.as_bytes());
        }
        for (name, info) in source.weights.infos() {
            model.update(format!("\n{name} {} {:?} {}", info.dtype, info.shape, digest(name)));
        }
        let mut tokenizer = Sha256::new();
        for (name, text) in &source.files {
            if name.starts_with("tokenizer") || name.starts_with("special_tokens") || name.contains("chat_template") {
                tokenizer.update(format!("{name}\n{}\n", text.len()));
                tokenizer.update(text.as_bytes());
            }
        }
        Self { model: hex(&model.finalize()[..16]), tokenizer: hex(&tokenizer.finalize()[..16]), every_byte: true }
    }

    /// Refuses a fingerprint that does not cover every tensor's bytes for a state file.
    fn check_every_byte(&self) -> Result<()> {
        match self.every_byte {
            true => Ok(()),
            false => Err(Error::Usage("internal: prompt states need the model's fingerprint over every tensor (load it with LoadOptions::keeps_states)".into())),
        }
    }

    /// The model digest as whole numbers (the first 16 hex digits in two halves), for ranks to
    /// compare through a collective.
    pub fn digest_words(&self) -> [i64; 2] {
        let word = |at: usize| self.model.get(at..at + 8).and_then(|h| i64::from_str_radix(h, 16).ok()).unwrap_or(0);
        [word(0), word(8)]
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The checksum of a state file's header (metadata `checksum`): xxh3-128 of every metadata entry
/// but itself (`key\0value\0`, keys in order), then each tensor's name, dtype and shape (names in
/// order). The data is covered by the piece digests in metadata `xxh3`, so this covers the file.
fn header_checksum<'a>(metadata: &BTreeMap<String, String>, tensors: impl Iterator<Item = (&'a str, &'a str, &'a [i32])>) -> String {
    let mut text = Vec::new();
    for (key, value) in metadata.iter().filter(|(k, _)| *k != "checksum") {
        text.extend_from_slice(format!("{key}\0{value}\0").as_bytes());
    }
    for (name, dtype, shape) in tensors {
        text.extend_from_slice(format!("\n{name}\0{dtype}\0{shape:?}").as_bytes());
    }
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&text))
}

/// A state read back from a file.
pub struct SavedState {
    pub tokens: Vec<u32>,
    /// The state after all `tokens` (recurrent layers empty: the trail's points hold them).
    pub cache: ModelCache,
    pub trail: Trail,
}

/// A tensor to write.
struct Out {
    name: String,
    array: Array,
}

/// Writes the state of `tokens` (`cache` holds exactly them; `trail` its restart points, the
/// last at its end for a model with recurrent layers) to `path`, for `model`. `progress` is
/// told the bytes written and the total. Returns the bytes of the file.
pub fn save(
    path: &Path,
    fingerprint: &Fingerprint,
    tokens: &[u32],
    cache: &ModelCache,
    trail: &Trail,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<u64> {
    fingerprint.check_every_byte()?;
    if cache.len() != tokens.len() {
        return Err(Error::Usage(format!("internal: a state of {} tokens saved with {} token ids", cache.len(), tokens.len())));
    }
    if tokens.is_empty() {
        return Err(Error::Usage("internal: a state of no tokens has nothing to save (a one-token prompt leaves none)".into()));
    }
    let mut tensors = vec![Out { name: "tokens".into(), array: Array::from_slice(tokens, &[tokens.len() as i32]) }];
    let mut pooled_layout = Map::new();
    for (i, layer) in cache.export()?.into_iter().enumerate() {
        if let LayerState::Attention { rows, pooled } = layer {
            for (name, array) in rows {
                tensors.push(Out { name: format!("layer.{i}.{name}"), array });
            }
            let mut shapes = Vec::new();
            for (j, p) in pooled.into_iter().enumerate() {
                shapes.push(json!([p.kernel, p.stride, p.heads, p.dim]));
                tensors.push(Out { name: format!("layer.{i}.pooled.{j}"), array: p.windows });
            }
            pooled_layout.insert(i.to_string(), Value::Array(shapes));
        }
    }
    let mut point_lens = Vec::new();
    for (j, point) in trail.points().iter().enumerate() {
        point_lens.push(point.len());
        for (i, state) in point.checkpoint.recurrent_states().enumerate() {
            if let Some(state) = state.and_then(|r| r.state().ok().flatten()) {
                tensors.push(Out { name: format!("point.{j}.layer.{i}"), array: state });
            }
        }
    }
    let arrays: Vec<Array> = tensors.iter().map(|t| t.array.clone()).collect();
    mlx_rs::transforms::eval(&arrays)?;

    let mut metadata = BTreeMap::new();
    metadata.insert("format".to_string(), FORMAT.to_string());
    let kv = cache.kv_format();
    metadata.insert("version".to_string(), if kv == KvFormat::Plain { VERSION } else { VERSION_QUANTIZED_KV }.to_string());
    if kv != KvFormat::Plain {
        metadata.insert("kv".to_string(), kv.name());
    }
    metadata.insert("model".to_string(), fingerprint.model.clone());
    metadata.insert("tokenizer".to_string(), fingerprint.tokenizer.clone());
    metadata.insert("layers".to_string(), cache.layers.len().to_string());
    metadata.insert("points".to_string(), json!(point_lens).to_string());
    metadata.insert("pooled".to_string(), Value::Object(pooled_layout).to_string());
    // Digests are written once the data is (same length, so the header does not move).
    let placeholder: Map<String, Value> =
        tensors.iter().map(|t| (t.name.clone(), json!(vec!["0".repeat(16); t.array.nbytes().div_ceil(READ_PIECE)]))).collect();
    let mut described = Vec::new();
    for t in &tensors {
        let dtype = dtype_name(t.array.dtype()).ok_or_else(|| Error::Usage(format!("cannot save dtype {:?}", t.array.dtype())))?;
        described.push((t.name.as_str(), dtype, t.array.shape().to_vec()));
    }
    described.sort();
    let header_with = |digests: &Map<String, Value>| -> Result<Vec<u8>> {
        let mut meta = metadata.clone();
        meta.insert("xxh3".to_string(), Value::Object(digests.clone()).to_string());
        let checksum = header_checksum(&meta, described.iter().map(|(n, d, s)| (*n, *d, &s[..])));
        meta.insert("checksum".to_string(), checksum);
        let mut header = Map::new();
        header.insert("__metadata__".into(), json!(meta));
        let mut offset = 0u64;
        for t in &tensors {
            let dtype = dtype_name(t.array.dtype()).ok_or_else(|| Error::Usage(format!("cannot save dtype {:?}", t.array.dtype())))?;
            let end = offset + t.array.nbytes() as u64;
            header.insert(t.name.clone(), json!({"dtype": dtype, "shape": t.array.shape(), "data_offsets": [offset, end]}));
            offset = end;
        }
        let mut bytes = serde_json::to_vec(&Value::Object(header)).expect("JSON values serialise");
        bytes.resize(bytes.len().div_ceil(8) * 8, b' ');
        Ok(bytes)
    };
    let header = header_with(&placeholder)?;
    let total = 8 + header.len() as u64 + tensors.iter().map(|t| t.array.nbytes() as u64).sum::<u64>();

    let mut temp = super::checkpoint::partial_file(path)?;
    let at = temp.path().to_path_buf();
    let io = |e| Error::io(&at, e);
    let mut out = std::io::BufWriter::with_capacity(8 << 20, temp.as_file_mut());
    out.write_all(&(header.len() as u64).to_le_bytes()).map_err(io)?;
    out.write_all(&header).map_err(io)?;
    let mut written = 8 + header.len() as u64;
    let mut digests = Map::new();
    for t in &tensors {
        let bytes = super::ops::to_bytes(&t.array)?;
        digests.insert(t.name.clone(), json!(bytes.chunks(READ_PIECE).map(piece_digest).collect::<Vec<_>>()));
        out.write_all(&bytes).map_err(io)?;
        written += bytes.len() as u64;
        progress(written, total);
    }
    let final_header = header_with(&digests)?;
    debug_assert_eq!(final_header.len(), header.len());
    let file = out.into_inner().map_err(|e| Error::io(&at, e.into_error()))?;
    file.seek(SeekFrom::Start(8)).map_err(io)?;
    file.write_all(&final_header).map_err(io)?;
    // An error above drops `temp`, which removes the partial file.
    super::checkpoint::persist(temp, path)?;
    Ok(total)
}

/// A tensor of a prompt cache file: where its bytes are, and the digests of their pieces.
struct Located {
    name: String,
    file: PathBuf,
    offset: u64,
    len: u64,
    digests: Vec<String>,
    /// Its safetensors dtype: float values must be finite.
    dtype: String,
}

impl Located {
    /// Its bytes, each piece checked against its digest, and float values for being finite, by
    /// the thread that read it.
    fn read(&self) -> Result<Vec<u8>> {
        read_range(&self.file, self.offset, self.len, &|i, piece| {
            if self.digests.get(i).is_none_or(|d| *d != piece_digest(piece)) {
                Err(bad(&self.file, format!("tensor `{}` does not match its digest: the file is corrupt; delete it", self.name)))
            } else if !all_finite(&self.dtype, piece) {
                Err(bad(
                    &self.file,
                    format!("tensor `{}` holds NaN or infinite values, which no model state has: the file is corrupt; delete it", self.name),
                ))
            } else {
                Ok(())
            }
        })
    }
}

/// Whether every value of `bytes` (little-endian, of safetensors dtype `dtype`) is finite: no
/// exponent of all ones. Integers (token ids, a quantized cache's codes) are.
fn all_finite(dtype: &str, bytes: &[u8]) -> bool {
    match dtype {
        "F64" => bytes.chunks_exact(8).all(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()) & 0x7ff0_0000_0000_0000 != 0x7ff0_0000_0000_0000),
        "F32" => bytes.chunks_exact(4).all(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x7f80_0000 != 0x7f80_0000),
        "BF16" => bytes.chunks_exact(2).all(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7f80 != 0x7f80),
        "F16" => bytes.chunks_exact(2).all(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7c00 != 0x7c00),
        _ => true,
    }
}

/// The digest of one [`READ_PIECE`] of a tensor (pieces are checked by the threads reading them).
fn piece_digest(piece: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(piece))
}

fn bad(path: &Path, message: impl std::fmt::Display) -> Error {
    Error::PromptCache { path: path.to_path_buf(), message: message.to_string() }
}

/// An opened prompt cache file: its header checked against the model that is to continue it.
pub struct StateFile {
    path: PathBuf,
    weights: Weights,
    digests: Map<String, Value>,
    pub tokens: Vec<u32>,
    points: Vec<usize>,
    pooled: Map<String, Value>,
    /// How the KV cache that made it kept its rows ([`KvFormat::name`]).
    kv: String,
    /// The model's layers when it was saved (metadata `layers`).
    layers: usize,
}

impl StateFile {
    /// Opens `path` for a model with `fingerprint`: refuses a file that is not a prompt cache,
    /// is truncated, or was made by another model or tokenizer.
    pub fn open(path: &Path, fingerprint: &Fingerprint) -> Result<Self> {
        fingerprint.check_every_byte()?;
        let weights = Weights::open(path).map_err(|e| match e {
            Error::Io { .. } => e,
            other => bad(path, format!("not a readable prompt cache ({other}); delete it and a new one is made")),
        })?;
        let meta = weights.metadata();
        let field = |key: &str| meta.get(key).map(String::as_str).unwrap_or("");
        if field("format") != FORMAT {
            return Err(bad(path, "not a sala prompt cache (no `format: sala-prompt-cache` in its metadata)"));
        }
        if ![VERSION, VERSION_QUANTIZED_KV].contains(&field("version")) {
            return Err(bad(
                path,
                format!("prompt cache version {} is not {VERSION} or {VERSION_QUANTIZED_KV}, the ones this sala reads; delete it", field("version")),
            ));
        }
        let tensors = weights.infos().iter().map(|(name, info)| (name.as_str(), info.dtype.as_str(), &info.shape[..]));
        if field("checksum") != header_checksum(meta, tensors) {
            return Err(bad(path, "its header does not match its checksum: the file is corrupt; delete it"));
        }
        if field("model") != fingerprint.model {
            return Err(bad(
                path,
                format!(
                    "made by another model or dtype (model digest {}, this one is {}); use it with the model that made it, or delete it",
                    field("model"),
                    fingerprint.model
                ),
            ));
        }
        if field("tokenizer") != fingerprint.tokenizer {
            return Err(bad(
                path,
                format!("made with another tokenizer (digest {}, this one is {}); delete it", field("tokenizer"), fingerprint.tokenizer),
            ));
        }
        let json = |key: &str| -> Result<Value> {
            serde_json::from_str(field(key)).map_err(|e| bad(path, format!("metadata `{key}` is not valid JSON: {e}; the file is corrupt")))
        };
        let digests = match json("xxh3")? {
            Value::Object(m) => m,
            _ => return Err(bad(path, "metadata `xxh3` is not a map of digests; the file is corrupt")),
        };
        let points: Vec<usize> =
            serde_json::from_value(json("points")?).map_err(|e| bad(path, format!("metadata `points`: {e}; the file is corrupt")))?;
        let pooled = match json("pooled")? {
            Value::Object(m) => m,
            _ => return Err(bad(path, "metadata `pooled` is not a map; the file is corrupt")),
        };
        let kv = meta.get("kv").cloned().unwrap_or_else(|| KvFormat::Plain.name());
        let layers = field("layers").parse().map_err(|_| bad(path, "metadata `layers` is not a count of layers; the file is corrupt"))?;
        let mut file = Self { path: path.to_path_buf(), weights, digests, tokens: Vec::new(), points, pooled, kv, layers };
        let info = file.weights.infos().get("tokens").ok_or_else(|| bad(path, "tensor `tokens` is missing; the file is corrupt"))?;
        if info.dtype != "U32" || info.shape.len() != 1 {
            return Err(bad(path, "tensor `tokens` is not a list of u32 token ids; the file is corrupt"));
        }
        if info.shape[0] == 0 {
            return Err(bad(path, "it holds no tokens (tensor `tokens` is empty), so there is no state to continue; the file is corrupt; delete it"));
        }
        let bytes = file.located("tokens")?.read()?;
        file.tokens = bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        if file.points.iter().any(|&p| p == 0 || p > file.tokens.len()) || !file.points.is_sorted() {
            return Err(bad(path, "metadata `points` names lengths the file does not hold; the file is corrupt"));
        }
        Ok(file)
    }

    /// Where tensor `name` is and the digests of its pieces.
    fn located(&self, name: &str) -> Result<Located> {
        let info = self.weights.infos().get(name).ok_or_else(|| bad(&self.path, format!("tensor `{name}` is missing; the file is corrupt")))?;
        let (file, offset, len) = self.weights.file_range(name)?;
        let digests: Vec<String> =
            self.digests.get(name).and_then(Value::as_array).map(|d| d.iter().filter_map(Value::as_str).map(String::from).collect()).unwrap_or_default();
        if digests.len() != (info.nbytes() as usize).div_ceil(READ_PIECE) {
            return Err(bad(&self.path, format!("tensor `{name}` has no digest for each piece; the file is corrupt; delete it")));
        }
        Ok(Located { name: name.to_string(), file, offset, len, digests, dtype: info.dtype.clone() })
    }

    /// Tensor `name` made from its checked bytes.
    fn array(&self, name: &str, bytes: &[u8]) -> Result<Array> {
        let info = &self.weights.infos()[name];
        let dtype = stored_dtype(&info.dtype).ok_or_else(|| bad(&self.path, format!("tensor `{name}` has dtype {}", info.dtype)))?;
        array_from_bytes(bytes, &info.shape, dtype)
    }

    /// Runs `body` with a reader of the tensors `names`, which must ask for them in that order:
    /// the next one is read (and checked) on another thread while the last becomes an array, so
    /// the disk and the copy into MLX overlap. `progress` is told the bytes read and the total.
    fn read_ahead<T>(
        &self,
        names: Vec<String>,
        progress: &mut dyn FnMut(u64, u64),
        body: impl FnOnce(&mut dyn FnMut(&str) -> Result<Array>) -> Result<T>,
    ) -> Result<T> {
        let located = names.iter().map(|n| self.located(n)).collect::<Result<Vec<_>>>()?;
        let total: u64 = located.iter().map(|l| l.len).sum();
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Result<(String, Vec<u8>)>>(1);
            scope.spawn(move || {
                for l in located {
                    let read = l.read().map(|bytes| (l.name, bytes));
                    let failed = read.is_err();
                    if tx.send(read).is_err() || failed {
                        return;
                    }
                }
            });
            let mut done = 0u64;
            let mut next = |name: &str| -> Result<Array> {
                let (got, bytes) = rx.recv().map_err(|_| Error::Usage(format!("internal: tensor `{name}` was not read ahead")))??;
                if got != name {
                    return Err(Error::Usage(format!("internal: tensor `{name}` asked for where `{got}` was read ahead")));
                }
                done += bytes.len() as u64;
                progress(done, total);
                self.array(name, &bytes)
            };
            body(&mut next)
        })
    }

    fn has(&self, name: &str) -> bool {
        self.weights.infos().contains_key(name)
    }

    /// The longest length up to `limit` a prompt can restart from (`None`: none).
    pub fn restart_at(&self, limit: usize, recurrent: bool) -> Option<usize> {
        let limit = limit.min(self.tokens.len());
        if recurrent {
            self.points.iter().copied().filter(|&p| p <= limit).max()
        } else {
            (limit > 0).then_some(limit)
        }
    }

    /// The error for a file whose states were not kept as a KV cache of format `kv` keeps them
    /// (another `--kv-bits`), naming the flag; `None` when they were.
    fn kv_refusal(&self, kv: KvFormat) -> Option<Error> {
        if self.kv == kv.name() {
            return None;
        }
        let made = if self.kv == KvFormat::Plain.name() { "without --kv-bits".to_string() } else { format!("with its KV cache quantized ({}, --kv-bits)", self.kv) };
        let fix = if kv == KvFormat::Plain { "with --kv-bits as it was made" } else { "without --kv-bits, as it was made" };
        Some(bad(&self.path, format!("made {made}, and this run's KV cache is {}; run {fix}, or delete it", kv.name())))
    }

    /// Reads the state for `model`: the attention buffers, and the recurrent states of the
    /// points named by `points` (indices into the file's; the last is where the cache stands),
    /// checked against the shapes the model's own states have: every layer's state must be there,
    /// token ids within the vocabulary, float values finite. `progress` is told bytes read.
    pub fn read(&self, model: &dyn LanguageModel, points: &[usize], progress: &mut dyn FnMut(u64, u64)) -> Result<SavedState> {
        let kv = model.new_cache().kv_format();
        if let Some(refusal) = self.kv_refusal(kv) {
            return Err(refusal);
        }
        let probe = probe_shapes(model)?;
        if self.layers != probe.len() {
            return Err(self.mismatch(format!("metadata `layers` ({})", self.layers)));
        }
        let vocab = model.info().vocab_size;
        if let Some(at) = self.tokens.iter().position(|&t| t as usize >= vocab) {
            return Err(bad(&self.path, format!("token id {} (at {at}) is outside this model's vocabulary of {vocab}; the file is corrupt or from another model; delete it", self.tokens[at])));
        }
        let n = self.tokens.len();
        let recurrent = probe.iter().any(|p| matches!(p, Probe::Recurrent(..)));
        // A recurrent layer's state after all the tokens is the last restart point's.
        if recurrent && self.points.last() != Some(&n) {
            return Err(bad(&self.path, format!("it holds no recurrent state at its end ({n} tokens; metadata `points` {:?}); the file is corrupt; delete it", self.points)));
        }
        // The tensors in the order the loops below ask for them; every attention layer's rows
        // must be there.
        let mut names = Vec::new();
        for (i, shape) in probe.iter().enumerate() {
            if let Probe::Attention(rows) = shape {
                for (name, ..) in rows {
                    let tensor = format!("layer.{i}.{name}");
                    if !self.has(&tensor) {
                        return Err(bad(&self.path, format!("layer {i}'s {name} (tensor `{tensor}`) are missing: it does not hold every layer's state; the file is corrupt; delete it")));
                    }
                    names.push(tensor);
                }
                names.extend((0..self.pooled_layout(i).len()).map(|j| format!("layer.{i}.pooled.{j}")));
            }
        }
        names.extend(point_names(&probe, points));
        self.read_ahead(names, progress, |read| {
            let mut layers = Vec::new();
            for (i, shape) in probe.iter().enumerate() {
                layers.push(match shape {
                    Probe::Attention(planes) => {
                        let mut rows = Vec::new();
                        for (name, want, dtype) in planes {
                            let a = read(&format!("layer.{i}.{name}"))?;
                            let s = a.shape();
                            if s.len() != 4 || s[0] != 1 || s[1] != want[1] || s[3] != want[3] || s[2] as usize != n || a.dtype() != *dtype {
                                return Err(self.mismatch(format!("layer {i} {name}: shape {s:?} {:?}", a.dtype())));
                            }
                            rows.push((name.clone(), a));
                        }
                        // The heads, head dim and dtype the pooled keys must have: the keys'
                        // (quantized: the codes' heads, 32 / bits values a u32, the scales' dtype).
                        let (want, dtype) = match kv {
                            KvFormat::Plain => (planes[0].1.clone(), planes[0].2),
                            KvFormat::Quantized { bits, .. } => (vec![1, planes[0].1[1], 1, planes[0].1[3] * 32 / bits], planes[1].2),
                        };
                        let mut pooled = Vec::new();
                        for (j, p) in self.pooled_layout(i).iter().enumerate() {
                            let windows = read(&format!("layer.{i}.pooled.{j}"))?;
                            let facts: Vec<i64> = p.as_array().map(|a| a.iter().filter_map(Value::as_i64).collect()).unwrap_or_default();
                            let [kernel, stride, heads, dim] = facts[..] else {
                                return Err(bad(&self.path, format!("metadata `pooled` for layer {i} is malformed; the file is corrupt")));
                            };
                            // Windows of at most the whole sequence, each starting `stride` after the
                            // last; heads and dim the keys': every product below is then small.
                            let fits = 0 < stride && stride <= kernel && kernel % stride == 0 && kernel as u64 <= n as u64;
                            if !fits || heads != i64::from(want[1]) || dim != i64::from(want[3]) {
                                return Err(self.mismatch(format!("layer {i} pooled keys (kernel {kernel}, stride {stride}, heads {heads}, dim {dim})")));
                            }
                            let count = (n as i64 - kernel) / stride + 1;
                            let s = windows.shape();
                            if s != [1, 1, count as i32, want[1] * want[3]] || windows.dtype() != dtype {
                                return Err(self.mismatch(format!("layer {i} pooled keys: shape {s:?}")));
                            }
                            pooled.push(KeyWindowsState { kernel: kernel as usize, stride: stride as usize, heads: want[1], dim: want[3], windows });
                        }
                        LayerState::Attention { rows, pooled }
                    }
                    Probe::Recurrent(..) => LayerState::Recurrent { state: None, len: n },
                });
            }
            let cache = ModelCache::import(model.new_cache(), layers).map_err(|m| self.mismatch(m))?;
            let checkpoints = self.checkpoints(&probe, points, read)?;
            Ok(SavedState { tokens: self.tokens.clone(), trail: Trail::from_points(&cache, checkpoints), cache })
        })
    }

    /// Metadata `pooled` for layer `i`: one `[kernel, stride, heads, dim]` per set of pooled keys.
    fn pooled_layout(&self, i: usize) -> Vec<Value> {
        self.pooled.get(&i.to_string()).and_then(Value::as_array).cloned().unwrap_or_default()
    }

    /// The recurrent states of the file's restart points shorter than `len` (a state read from
    /// it at `len` and saved again keeps them). `progress` is told bytes read.
    pub fn points_before(&self, model: &dyn LanguageModel, len: usize, progress: &mut dyn FnMut(u64, u64)) -> Result<Vec<Checkpoint>> {
        let probe = probe_shapes(model)?;
        let points: Vec<usize> = (0..self.points.len()).filter(|&j| self.points[j] < len).collect();
        self.read_ahead(point_names(&probe, &points), progress, |read| self.checkpoints(&probe, &points, read))
    }

    /// The recurrent states of the restart points `points` (indices into the file's), each
    /// checked against the model's.
    fn checkpoints(&self, probe: &[Probe], points: &[usize], read: &mut dyn FnMut(&str) -> Result<Array>) -> Result<Vec<Checkpoint>> {
        let mut checkpoints = Vec::new();
        for &j in points {
            let len = *self.points.get(j).ok_or_else(|| bad(&self.path, format!("no restart point {j}")))?;
            let mut states = Vec::new();
            for (i, shape) in probe.iter().enumerate() {
                states.push(match shape {
                    Probe::Recurrent(want, dtype) => {
                        let state = read(&format!("point.{j}.layer.{i}"))?;
                        if state.shape() != &want[..] || state.dtype() != *dtype {
                            return Err(self.mismatch(format!("layer {i} recurrent state: shape {:?}", state.shape())));
                        }
                        let mut r = RecurrentState::default();
                        r.set_state(Some(state));
                        r.len = len;
                        Some(r)
                    }
                    Probe::Attention(..) => None,
                });
            }
            checkpoints.push(Checkpoint::from_states(len, states));
        }
        Ok(checkpoints)
    }

    fn mismatch(&self, what: impl std::fmt::Display) -> Error {
        bad(&self.path, format!("{what} does not fit this model's state; the file is corrupt or from another model; delete it"))
    }
}

/// An array of `shape` and `dtype` from `bytes`, which must hold exactly its elements (callers
/// pass a tensor's bytes, checked against the file's header). A large one is copied into MLX's
/// memory in pieces by several threads (on CUDA that memory is managed, and one thread filling
/// it runs far below memory speed), then joined.
fn array_from_bytes(bytes: &[u8], shape: &[i32], dtype: Dtype) -> Result<Array> {
    let numel: usize = shape.iter().map(|&d| d as usize).product();
    let item = bytes.len() / numel.max(1);
    let pieces = (bytes.len() / READ_PIECE).clamp(1, 8);
    if pieces == 1 || !numel.is_multiple_of(pieces) {
        // SAFETY: `bytes` holds exactly numel × itemsize bytes (the caller's contract).
        return Ok(unsafe { Array::from_raw_data(bytes.as_ptr().cast(), shape, dtype) });
    }
    let per = numel / pieces;
    let parts: Vec<Array> = std::thread::scope(|scope| {
        let workers: Vec<_> = bytes
            .chunks(per * item)
            .map(|chunk| {
                // SAFETY: each chunk holds exactly `per` elements of `dtype`.
                scope.spawn(move || unsafe { Array::from_raw_data(chunk.as_ptr().cast(), &[per as i32], dtype) })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("copying a piece does not panic")).collect()
    });
    Ok(mlx_rs::ops::concatenate(&parts, 0)?.reshape(shape)?)
}

/// The tensors of the recurrent states at the restart points `points`, in the order
/// [`StateFile::checkpoints`] reads them.
fn point_names(probe: &[Probe], points: &[usize]) -> Vec<String> {
    let recurrent: Vec<usize> = (0..probe.len()).filter(|&i| matches!(probe[i], Probe::Recurrent(..))).collect();
    points.iter().flat_map(|j| recurrent.iter().map(move |i| format!("point.{j}.layer.{i}"))).collect()
}

/// The shape and dtype of each layer's state, from one token run through the model.
enum Probe {
    /// The rows' arrays by name (see [`LayerState::Attention`]), each `[1, Hkv, 1, ·]`.
    Attention(Vec<(String, Vec<i32>, Dtype)>),
    Recurrent(Vec<i32>, Dtype),
}

fn probe_shapes(model: &dyn LanguageModel) -> Result<Vec<Probe>> {
    let mut cache = model.new_cache();
    model.forward(&Array::from_slice(&[0i32], &[1, 1]), &mut cache, Logits::Last, None)?;
    cache
        .export()?
        .into_iter()
        .map(|layer| {
            Ok(match layer {
                LayerState::Attention { rows, .. } if !rows.is_empty() => {
                    Probe::Attention(rows.into_iter().map(|(name, a)| (name, a.shape().to_vec(), a.dtype())).collect())
                }
                LayerState::Recurrent { state: Some(s), .. } => Probe::Recurrent(s.shape().to_vec(), s.dtype()),
                _ => return Err(Error::Usage("internal: a layer kept no state after a token".into())),
            })
        })
        .collect()
}

/// Where `prompt` starts from the state in `file` (as [`super::prefix_cache::PrefixCache::start`]
/// does from memory): the longest restart length that leaves at least one prompt token to run,
/// else from `fresh`. The trail takes a point where the prompt stops sharing tokens with the file's, so a
/// state saved after it restarts there.
pub fn start_from(
    file: &StateFile,
    model: &dyn LanguageModel,
    prompt: &[u32],
    fresh: ModelCache,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<super::prefix_cache::Start> {
    let shared = common_prefix(&file.tokens, prompt).min(prompt.len().saturating_sub(1));
    let recurrent = fresh.has_recurrent();
    let (tokens, cache, mut trail) = match file.restart_at(shared, recurrent) {
        Some(len) => {
            // Only the point it restarts from: the earlier ones matter only to a state saved
            // again ([`StateFile::points_before`]), and reading them would delay the first token.
            let points: Vec<usize> = if recurrent { file.points.iter().rposition(|&p| p == len).into_iter().collect() } else { Vec::new() };
            let saved = file.read(model, &points, progress)?;
            let mut cache = saved.cache;
            match saved.trail.points().last() {
                Some(point) if recurrent => cache.restore(point.checkpoint.clone()),
                _ => cache.truncate_attention(len)?,
            }
            let mut trail = saved.trail;
            trail.restart_from(&cache);
            (len, cache, trail)
        }
        None => {
            let trail = Trail::new(&fresh);
            (0, fresh, trail)
        }
    };
    if shared > tokens {
        trail.stop_at(shared);
    }
    Ok(super::prefix_cache::Start { tokens, cache, trail })
}

/// A folder of prompt cache files holding what a prefix cache kept (`sala serve
/// --prompt-cache-dir`): one file per kept sequence, named by the model's digest and a digest of
/// its token ids, so several models share a folder and a sequence already on disk is not
/// written again.
pub struct StateDir {
    dir: PathBuf,
    fingerprint: Fingerprint,
}

/// A file of a [`StateDir`] that could not be read back.
pub struct Skipped {
    pub path: PathBuf,
    pub error: Error,
    /// Where it was moved (`DIR/rejected/`): a file whose contents are wrong. A file that could
    /// not be read (an I/O error, say) or was made with another `--kv-bits` stays where it was.
    pub moved_to: Option<PathBuf>,
}

/// The subfolder of a [`StateDir`] that files found corrupt or crafted are moved into, kept for
/// a look rather than deleted, and never read again.
pub const REJECTED_DIR: &str = "rejected";

impl StateDir {
    /// Makes `dir` if missing and checks that files can be written there, so a folder that
    /// cannot keep states is refused before a model loads rather than at shutdown.
    pub fn check_writable(dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        // A new file of a random name (never an existing one), removed when dropped.
        tempfile::Builder::new().prefix(".sala-write-check-").tempfile_in(dir).map_err(|e| Error::io(dir, e))?;
        Ok(())
    }

    /// The folder `dir` (made if missing) for the model of `fingerprint`; what interrupted saves
    /// left there is swept ([`super::checkpoint::sweep_partials`]).
    pub fn new(dir: &Path, fingerprint: &Fingerprint) -> Result<Self> {
        fingerprint.check_every_byte()?;
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        super::checkpoint::sweep_partials(dir, None);
        Ok(Self { dir: dir.to_path_buf(), fingerprint: fingerprint.clone() })
    }

    fn prefix(&self) -> String {
        let short = |digest: &str| digest.chars().take(16).collect::<String>();
        format!("{}-{}-", short(&self.fingerprint.model), short(&self.fingerprint.tokenizer))
    }

    fn file_for(&self, tokens: &[u32]) -> PathBuf {
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        self.dir.join(format!("{}{:016x}.prompt-cache", self.prefix(), xxhash_rust::xxh3::xxh3_64(&bytes)))
    }

    /// This model's files, newest first, with their sizes.
    fn files(&self) -> Result<Vec<(PathBuf, u64)>> {
        let prefix = self.prefix();
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| Error::io(&self.dir, e))? {
            let entry = entry.map_err(|e| Error::io(&self.dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) && name.ends_with(".prompt-cache") {
                let meta = entry.metadata().map_err(|e| Error::io(entry.path(), e))?;
                files.push((entry.path(), meta.len(), meta.modified().ok()));
            }
        }
        files.sort_by_key(|f| std::cmp::Reverse(f.2));
        Ok(files.into_iter().map(|(path, len, _)| (path, len)).collect())
    }

    /// Reads back this model's states, newest first, as many as fit in `budget` bytes of files;
    /// returns them oldest first (the order to keep them in, so the newest is dropped last) with
    /// the files that could not be read: those whose contents are wrong are moved into
    /// [`REJECTED_DIR`]. A file whose reading panics (a bug) is skipped like a corrupt one rather
    /// than stopping the caller (a server's start). `progress` is told bytes read and the total.
    pub fn load(&self, model: &dyn LanguageModel, budget: u64, progress: &mut dyn FnMut(u64, u64)) -> Result<(Vec<SavedState>, Vec<Skipped>)> {
        let mut chosen = Vec::new();
        let mut total = 0u64;
        for (path, len) in self.files()? {
            if total + len <= budget {
                total += len;
                chosen.push((path, len));
            }
        }
        let (mut states, mut skipped) = (Vec::new(), Vec::new());
        let mut done = 0u64;
        for (path, len) in chosen.into_iter().rev() {
            let base = done;
            // What became of the file: read, rejected (its contents are wrong), or left (it could
            // not be read now, or is for other --kv-bits).
            enum Outcome {
                Read(SavedState),
                Left(Error),
                Rejected(Error),
            }
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let file = match StateFile::open(&path, &self.fingerprint) {
                    Ok(file) => file,
                    Err(error @ Error::PromptCache { .. }) => return Outcome::Rejected(error),
                    Err(error) => return Outcome::Left(error),
                };
                if let Some(refusal) = file.kv_refusal(model.new_cache().kv_format()) {
                    return Outcome::Left(refusal);
                }
                let points: Vec<usize> = (0..file.points.len()).collect();
                match file.read(model, &points, &mut |d, _| progress(base + d, total)) {
                    Ok(state) => Outcome::Read(state),
                    Err(error @ Error::PromptCache { .. }) => Outcome::Rejected(error),
                    Err(error) => Outcome::Left(error),
                }
            }));
            done += len;
            let (error, reject) = match outcome {
                Ok(Outcome::Read(state)) => {
                    states.push(state);
                    continue;
                }
                Ok(Outcome::Left(error)) => (error, false),
                Ok(Outcome::Rejected(error)) => (error, true),
                Err(panic) => {
                    let what = super::contain::panic_message(panic.as_ref()).unwrap_or_default();
                    (bad(&path, format!("reading it panicked ({what}), a bug in sala; please report it")), true)
                }
            };
            let moved_to = if reject { self.reject(&path) } else { None };
            skipped.push(Skipped { path, error, moved_to });
        }
        Ok((states, skipped))
    }

    /// Moves `path` into [`REJECTED_DIR`] (replacing a file of its name there); `None` if it
    /// could not be moved.
    fn reject(&self, path: &Path) -> Option<PathBuf> {
        let rejected = self.dir.join(REJECTED_DIR);
        let _ = std::fs::create_dir(&rejected);
        // A real folder, not a symlink leading elsewhere.
        if !std::fs::symlink_metadata(&rejected).is_ok_and(|m| m.is_dir()) {
            return None;
        }
        let to = rejected.join(path.file_name()?);
        std::fs::rename(path, &to).ok().map(|()| to)
    }

    /// Makes the folder hold exactly `kept` for this model: writes the sequences not on disk yet
    /// and removes this model's files of sequences no longer kept. Returns the files written.
    /// `progress` is told bytes written and the total of the files to write.
    pub fn save<'a>(&self, kept: impl IntoIterator<Item = (&'a [u32], &'a ModelCache, &'a Trail)>, progress: &mut dyn FnMut(u64, u64)) -> Result<usize> {
        let kept: Vec<_> = kept.into_iter().map(|(tokens, cache, trail)| (self.file_for(tokens), tokens, cache, trail)).collect();
        let keep: std::collections::HashSet<&PathBuf> = kept.iter().map(|k| &k.0).collect();
        for (path, _) in self.files()? {
            if !keep.contains(&path) {
                std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
            }
        }
        let mut written = 0;
        for (path, tokens, cache, trail) in kept.iter().filter(|k| !k.0.exists()) {
            save(path, &self.fingerprint, tokens, cache, trail, progress)?;
            written += 1;
        }
        Ok(written)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tensor large enough to be read by several threads and copied into MLX in pieces comes
    /// back exactly, and a flipped byte in any piece is caught by the thread that reads it.
    #[test]
    fn large_tensors_read_in_pieces_come_back_exactly() {
        // Five pieces and a ragged end: read by several threads, copied by five.
        let numel = 5 * READ_PIECE / 4 + 5 * 1024;
        let values: Vec<f32> = (0..numel).map(|i| i as f32 * 0.5 - 7.0).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert!(bytes.len() > 4 * READ_PIECE);
        let path = std::env::temp_dir().join(format!("sala-pieces-{}", std::process::id()));
        let offset = 24u64;
        std::fs::write(&path, [vec![9u8; offset as usize], bytes.clone()].concat()).unwrap();
        let digests: Vec<String> = bytes.chunks(READ_PIECE).map(piece_digest).collect();
        let located = Located { name: "t".into(), file: path.clone(), offset, len: bytes.len() as u64, digests, dtype: "F32".into() };
        let read = located.read().unwrap();
        assert!(read == bytes);
        let shape = [2, (numel / 2) as i32];
        let array = array_from_bytes(&read, &shape, Dtype::Float32).unwrap();
        array.eval().unwrap();
        assert_eq!(array.shape(), &shape);
        assert!(array.as_slice::<f32>() == &values[..]);
        // The third piece damaged.
        let mut damaged = std::fs::read(&path).unwrap();
        damaged[offset as usize + 2 * READ_PIECE + 5] ^= 1;
        std::fs::write(&path, damaged).unwrap();
        let err = located.read().unwrap_err().to_string();
        assert!(err.contains("does not match its digest"), "{err}");
        std::fs::remove_file(path).unwrap();
    }
}
