//! MLX affine quantization: the config section that describes it and the operations on it.
//!
//! A quantized `[out, in]` matrix is stored as `weight` (uint32 `[out, in·bits/32]`, element j of a
//! word in bits `j·bits..`), `scales` and `biases` (`[out, in/group_size]`): w = scale·q + bias per
//! group. This is the layout of mlx-lm checkpoints; the config says
//! `"quantization": {"group_size": 64, "bits": 4, "<module path>": false | {...}}`.

use super::config::ConfigFile;
use super::error::{Error, Result};
use mlx_rs::{ops, Array, Dtype};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantFormat {
    pub group_size: i32,
    pub bits: i32,
}

impl QuantFormat {
    pub const GROUP_SIZES: [i32; 3] = [32, 64, 128];
    pub const BITS: [i32; 6] = [2, 3, 4, 5, 6, 8];

    pub fn validate(self) -> std::result::Result<Self, String> {
        if !Self::BITS.contains(&self.bits) {
            return Err(format!("{} bits is not supported (use one of {:?})", self.bits, Self::BITS));
        }
        if !Self::GROUP_SIZES.contains(&self.group_size) {
            return Err(format!(
                "group size {} is not supported (use one of {:?})",
                self.group_size,
                Self::GROUP_SIZES
            ));
        }
        Ok(self)
    }
}

/// The `quantization` section: a default format plus per-module overrides (`None` = not quantized).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantConfig {
    pub default: QuantFormat,
    pub overrides: BTreeMap<String, Option<QuantFormat>>,
}

impl QuantConfig {
    /// Reads `quantization` (or mlx-lm's duplicate `quantization_config`); `None` when absent.
    pub fn from_config(cfg: &ConfigFile) -> Result<Option<Self>> {
        let key = if cfg.opt("quantization").is_some() { "quantization" } else { "quantization_config" };
        let Some(section) = cfg.opt(key) else { return Ok(None) };
        let object = section.as_object().ok_or_else(|| cfg.invalid(key, "expected an object"))?;
        if object.contains_key("quant_method") {
            return Err(cfg.invalid(
                &format!("{key}.quant_method"),
                "this is a transformers quantization (GPTQ/AWQ/bitsandbytes...); only MLX affine \
                 checkpoints are supported — start from the float checkpoint and run `sala quantize`",
            ));
        }
        if let Some(mode) = object.get("mode").and_then(Value::as_str) {
            if mode != "affine" {
                return Err(cfg.invalid(&format!("{key}.mode"), format!("`{mode}`: only `affine` is supported")));
            }
        }
        let format = |path: &str, v: &Value| -> Result<QuantFormat> {
            let int = |k: &str| {
                v.get(k)
                    .and_then(Value::as_i64)
                    .map(|n| n as i32)
                    .ok_or_else(|| cfg.invalid(&format!("{path}.{k}"), "expected an integer"))
            };
            QuantFormat { group_size: int("group_size")?, bits: int("bits")? }
                .validate()
                .map_err(|m| cfg.invalid(path, m))
        };
        let default = format(key, section)?;
        let mut overrides = BTreeMap::new();
        for (name, value) in object {
            match value {
                Value::Bool(false) => {
                    overrides.insert(name.clone(), None);
                }
                Value::Object(_) => {
                    overrides.insert(name.clone(), Some(format(&format!("{key}.{name}"), value)?));
                }
                _ => {}
            }
        }
        Ok(Some(Self { default, overrides }))
    }

    /// The format of the module at `path` (`model.layers.0.self_attn.q_proj`).
    pub fn for_module(&self, path: &str) -> Option<QuantFormat> {
        match self.overrides.get(path) {
            Some(format) => *format,
            None => Some(self.default),
        }
    }

    /// The section as written into `config.json`.
    pub fn to_json(&self) -> Value {
        let mut map = Map::new();
        map.insert("group_size".into(), json!(self.default.group_size));
        map.insert("bits".into(), json!(self.default.bits));
        for (name, format) in &self.overrides {
            let value = match format {
                Some(f) => json!({ "group_size": f.group_size, "bits": f.bits }),
                None => Value::Bool(false),
            };
            map.insert(name.clone(), value);
        }
        Value::Object(map)
    }
}

/// A quantized `[out, in]` matrix.
#[derive(Clone)]
pub struct QuantizedMatrix {
    pub packed: Array,
    pub scales: Array,
    pub biases: Array,
    pub format: QuantFormat,
}

impl QuantizedMatrix {
    /// Quantizes a float `[out, in]` matrix (in must be a multiple of the group size).
    pub fn quantize(w: &Array, format: QuantFormat) -> Result<Self> {
        let inner = w.shape()[w.ndim() - 1];
        if inner % format.group_size != 0 {
            return Err(Error::Usage(format!(
                "cannot quantize a matrix with {inner} columns in groups of {}",
                format.group_size
            )));
        }
        let (packed, scales, biases) = ops::quantize(w, format.group_size, format.bits)?;
        Ok(Self { packed, scales, biases, format })
    }

    /// Input features (columns of the unpacked matrix).
    pub fn in_features(&self) -> i32 {
        self.packed.shape()[1] * 32 / self.format.bits
    }

    /// Scales and biases in `dtype`, or in float32 when running on the CPU (MLX's CPU kernel
    /// accumulates in the input dtype, which loses ~4% in bf16; see models::layers).
    pub fn for_device(mut self, dtype: Dtype) -> Result<Self> {
        let dtype = if super::device::on_cpu() { Dtype::Float32 } else { dtype };
        self.scales = self.scales.as_dtype(dtype)?;
        self.biases = self.biases.as_dtype(dtype)?;
        Ok(self)
    }

    pub fn dequantize(&self) -> Result<Array> {
        Ok(ops::dequantize(&self.packed, &self.scales, &self.biases, self.format.group_size, self.format.bits)?)
    }

    /// The float rows `ids` (an embedding lookup) in `dtype`, without dequantizing the rest.
    pub fn rows(&self, ids: &Array, dtype: Dtype) -> Result<Array> {
        let pick = |a: &Array| a.take_axis(ids, 0);
        let rows = ops::dequantize(
            pick(&self.packed)?,
            pick(&self.scales)?,
            &pick(&self.biases)?,
            self.format.group_size,
            self.format.bits,
        )?;
        Ok(if rows.dtype() == dtype { rows } else { rows.as_dtype(dtype)? })
    }
}

/// What `sala quantize` was asked for.
#[derive(Debug, Clone)]
pub struct QuantizeRequest {
    pub format: QuantFormat,
    pub quantize_embeddings: bool,
    /// Float dtype of the scales, biases and the tensors left unquantized.
    pub dtype: mlx_rs::Dtype,
}

/// Writes a quantized copy of `source` (already validated by its architecture) into `output`:
/// every 2-D `*.weight` projection (and the embeddings if asked) whose input size is a multiple
/// of the group size becomes packed weight + scales + biases; `config.json` gains the
/// `quantization` section (and mlx-lm's duplicate `quantization_config`). Source tensors that are
/// already quantized (GGUF) are dequantized first. `progress(bytes)` reports source bytes done.
pub fn quantize_checkpoint(
    source: &super::source::ModelSource,
    request: &QuantizeRequest,
    output: &std::path::Path,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<std::path::PathBuf> {
    use super::checkpoint::{CheckpointWriter, StagingDir, MAX_SHARD_BYTES};
    use super::weights::{dtype_name, float_dtype};
    let weights = &source.weights;
    let cfg = source.config()?;
    if QuantConfig::from_config(&cfg)?.is_some() {
        return Err(Error::Usage(format!(
            "{} is already quantized; quantize the float checkpoint it came from",
            source.path.display()
        )));
    }
    let dtype = request.dtype;
    let float_name = dtype_name(dtype).expect("float dtype");
    let format = request.format;
    let mut overrides = BTreeMap::new();
    // The writer asks for a module's packed weight, scales and biases one at a time; quantize once
    // and keep the parts not yet written.
    let pending: std::cell::RefCell<std::collections::HashMap<String, [Option<Array>; 3]>> = Default::default();
    let pending = &pending;
    let mut writer = CheckpointWriter::new();
    for (name, info) in weights.infos() {
        let module = name.strip_suffix(".weight");
        if let Some(m) = name.strip_suffix(".scales").or_else(|| name.strip_suffix(".biases")) {
            if weights.quantized(m).is_some() {
                continue; // written (dequantized or requantized) with its `.weight`
            }
        }
        let source_format = module.and_then(|m| weights.quantized(m));
        // The float matrix this tensor stands for, in the output dtype.
        let load = move || -> Result<Array> {
            match (source_format, module) {
                (Some(f), Some(m)) => QuantizedMatrix {
                    packed: weights.raw(name)?,
                    scales: weights.get(&format!("{m}.scales"), dtype)?,
                    biases: weights.get(&format!("{m}.biases"), dtype)?,
                    format: f,
                }
                .dequantize(),
                _ => weights.get(name, dtype),
            }
        };
        let shape: Vec<usize> = match source_format {
            Some(f) => vec![info.shape[0] as usize, info.shape[1] as usize * 32 / f.bits as usize],
            None => info.shape.iter().map(|&d| d as usize).collect(),
        };
        let source_bytes = info.nbytes();
        let is_float = source_format.is_some() || float_dtype(&info.dtype).is_some();
        let is_matrix = module.is_some() && shape.len() == 2 && is_float;
        let is_embedding = module.is_some_and(|m| m.ends_with("embed_tokens"));
        let module = module.unwrap_or_default().to_string();
        if is_matrix && (!is_embedding || request.quantize_embeddings) && shape[1].is_multiple_of(format.group_size as usize) {
            let (rows, cols) = (shape[0], shape[1]);
            let groups = cols / format.group_size as usize;
            let key = module.clone();
            let part = move |which: usize| {
                let key = key.clone();
                move || -> Result<Vec<u8>> {
                    let mut pending = pending.borrow_mut();
                    if !pending.contains_key(&key) {
                        let q = QuantizedMatrix::quantize(&load()?, format)?;
                        mlx_rs::transforms::eval([&q.packed, &q.scales, &q.biases])?;
                        progress(source_bytes);
                        pending.insert(key.clone(), [Some(q.packed), Some(q.scales), Some(q.biases)]);
                    }
                    let parts = pending.get_mut(&key).expect("inserted above");
                    let a = parts[which].take().ok_or_else(|| Error::Usage(format!("internal: {key} part {which} written twice")))?;
                    if parts.iter().all(Option::is_none) {
                        pending.remove(&key);
                    }
                    Ok(super::ops::to_bytes(&a)?)
                }
            };
            let packed_cols = cols * format.bits as usize / 32;
            writer.add(format!("{module}.weight"), "U32", vec![rows, packed_cols], part(0))?;
            writer.add(format!("{module}.scales"), float_name, vec![rows, groups], part(1))?;
            writer.add(format!("{module}.biases"), float_name, vec![rows, groups], part(2))?;
        } else {
            if is_matrix {
                overrides.insert(module.clone(), None);
            }
            let stored = if is_float { float_name.to_string() } else { info.dtype.clone() };
            writer.add(name.clone(), &stored, shape, move || {
                let a = if is_float { load()? } else { weights.raw(name)? };
                progress(source_bytes);
                Ok(super::ops::to_bytes(&a)?)
            })?;
        }
    }
    let staging = StagingDir::new(output)?;
    writer.write_dir(&staging.staging, MAX_SHARD_BYTES)?;
    let quantization = QuantConfig { default: format, overrides }.to_json();
    let mut config = cfg.json.clone();
    config["quantization"] = quantization.clone();
    config["quantization_config"] = quantization;
    for (file, text) in &source.files {
        let text = if file == super::source::CONFIG_FILE {
            serde_json::to_string_pretty(&config).expect("JSON values serialise")
        } else {
            text.clone()
        };
        staging.write(file, &text)?;
    }
    staging.finish()
}
