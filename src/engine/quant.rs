//! MLX affine quantization: the config section that describes it and the operations on it.
//!
//! A quantized `[out, in]` matrix is stored as `weight` (uint32 `[out, in·bits/32]`, element j of a
//! word in bits `j·bits..`), `scales` and `biases` (`[out, in/group_size]`): w = scale·q + bias per
//! group. This is the layout of mlx-lm checkpoints; the config says
//! `"quantization": {"group_size": 64, "bits": 4, "<module path>": false | {...}}`.

use super::config::ConfigFile;
use super::error::{Error, Result};
use mlx_rs::{ops, Array};
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

    /// x · Wᵀ.
    pub fn matmul_t(&self, x: &Array) -> Result<Array> {
        Ok(ops::quantized_matmul(
            x,
            &self.packed,
            &self.scales,
            &self.biases,
            true,
            self.format.group_size,
            self.format.bits,
        )?)
    }

    pub fn dequantize(&self) -> Result<Array> {
        Ok(ops::dequantize(&self.packed, &self.scales, &self.biases, self.format.group_size, self.format.bits)?)
    }

    /// The float rows `ids` (an embedding lookup), without dequantizing the rest.
    pub fn rows(&self, ids: &Array) -> Result<Array> {
        let pick = |a: &Array| a.take_axis(ids, 0);
        Ok(ops::dequantize(
            pick(&self.packed)?,
            pick(&self.scales)?,
            &pick(&self.biases)?,
            self.format.group_size,
            self.format.bits,
        )?)
    }
}
