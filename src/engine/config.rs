//! `config.json` access with errors that name the file and the key.
//! Each model family parses its own typed config from a [`ConfigFile`].
//!
//! Configs come from the internet, so every integer read here is bounded: at most
//! [`MAX_CONFIG_INT`] (an MLX dimension is an i32, and the product of two such values still fits
//! in 64 bits), sizes that shape or divide something at least 1, and layer counts at most
//! [`MAX_LAYERS`], so no size computed from a config can overflow or allocate without bound.

use super::error::{Error, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The largest integer a config may hold (MLX's shapes are i32).
pub const MAX_CONFIG_INT: u64 = i32::MAX as u64;
/// The most layers a model may have (released models have at most ~130).
pub const MAX_LAYERS: usize = 1024;
/// The widest attention head (released models use 64–256): RoPE tables are sized by it before
/// any weight is read.
pub const MAX_HEAD_DIM: usize = 4096;

/// The product of sizes read from a config, saturating at `u64::MAX` (a memory check then refuses
/// it) instead of overflowing.
pub fn size_product(factors: &[usize]) -> u64 {
    factors.iter().fold(1u64, |a, &d| a.saturating_mul(d as u64))
}

/// A parsed JSON config file plus its path, for error messages.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    pub path: PathBuf,
    pub json: Value,
    /// Keys the file left out and [`ConfigFile::with_defaults`] filled in, in table order.
    pub defaulted: Vec<DefaultedKey>,
}

/// What a config key is when the file leaves it out, and who says so: each model family keeps a
/// table of these that follows its Hugging Face config class (docs/config-defaults.md lists them).
#[derive(Debug, Clone, Copy)]
pub struct KeyDefault {
    /// The key; `outer.inner` for a key inside a nested object.
    pub key: &'static str,
    pub fallback: Fallback,
    /// Where the default comes from (the class and file that sets it).
    pub source: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fallback {
    /// This value, as JSON text (`1e-06`, `[2, 73440]`, `"silu"`).
    Json(&'static str),
    /// The value of another key, after that key's own default.
    SameAs(&'static str),
    /// Worked out by the family's code from other keys or the checkpoint; the text says how.
    Computed(&'static str),
    /// Left out, the feature it describes is off (`rope_scaling`, `sliding_window`).
    Off,
    /// There is no default: a config without it is refused, naming it.
    Required,
}

/// A key the file left out, with the value it was given and who says so.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DefaultedKey {
    pub key: String,
    pub value: Value,
    pub source: &'static str,
}

impl ConfigFile {
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self> {
        let json: Value = serde_json::from_str(text)
            .map_err(|e| Error::Json { path: path.to_path_buf(), message: e.to_string() })?;
        Self::from_value(path, json)
    }

    pub fn from_value(path: &Path, json: Value) -> Result<Self> {
        if !json.is_object() {
            return Err(Error::Json { path: path.into(), message: "top level is not an object".into() });
        }
        Ok(Self { path: path.to_path_buf(), json, defaulted: Vec::new() })
    }

    /// The config with every key that `table` gives a value to and the file leaves out filled
    /// in (an explicit `null` is kept: in the HF classes it means "none", not "the default").
    /// Idempotent; each key filled is listed in [`ConfigFile::defaulted`].
    pub fn with_defaults(&self, table: &[KeyDefault]) -> Result<Self> {
        let mut out = self.clone();
        for entry in table {
            let value = match entry.fallback {
                Fallback::Json(text) => serde_json::from_str(text)
                    .map_err(|e| Error::Usage(format!("built-in default of `{}` is not JSON ({e}); this is a bug", entry.key)))?,
                Fallback::SameAs(other) => match lookup(&out.json, other) {
                    Some(v) => v.clone(),
                    None => continue,
                },
                Fallback::Computed(_) | Fallback::Off | Fallback::Required => continue,
            };
            let (parent, leaf) = match entry.key.split_once('.') {
                Some((outer, inner)) => {
                    let root = out.json.as_object_mut().expect("a config is an object");
                    match root.entry(outer).or_insert_with(|| Value::Object(Default::default())) {
                        Value::Object(section) => (section, inner),
                        // Not an object: the family's reader names the key.
                        _ => continue,
                    }
                }
                None => (out.json.as_object_mut().expect("a config is an object"), entry.key),
            };
            if !parent.contains_key(leaf) {
                parent.insert(leaf.to_string(), value.clone());
                out.defaulted.push(DefaultedKey { key: entry.key.to_string(), value, source: entry.source });
            }
        }
        Ok(out)
    }

    /// A view of a nested object (e.g. `sparse_config`) that reports keys as `outer.inner`.
    pub fn section(&self, key: &str) -> Result<Section<'_>> {
        let value = self.required(key)?;
        if !value.is_object() {
            return Err(self.invalid(key, "expected an object"));
        }
        Ok(Section { file: self, prefix: format!("{key}."), value })
    }

    pub fn root(&self) -> Section<'_> {
        Section { file: self, prefix: String::new(), value: &self.json }
    }

    pub fn required(&self, key: &str) -> Result<&Value> {
        self.root().required(key)
    }

    pub fn invalid(&self, key: &str, message: impl Into<String>) -> Error {
        Error::InvalidKey { path: self.path.clone(), key: key.into(), message: message.into() }
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        self.root().usize(key)
    }
    pub fn dim(&self, key: &str) -> Result<usize> {
        self.root().dim(key)
    }
    pub fn layers(&self, key: &str) -> Result<usize> {
        self.root().layers(key)
    }
    pub fn head_dim(&self, key: &str) -> Result<usize> {
        self.root().head_dim(key)
    }
    pub fn f64(&self, key: &str) -> Result<f64> {
        self.root().f64(key)
    }
    pub fn bool(&self, key: &str) -> Result<bool> {
        self.root().bool(key)
    }
    pub fn str(&self, key: &str) -> Result<&str> {
        self.root().str(key)
    }
    pub fn opt(&self, key: &str) -> Option<&Value> {
        self.json.get(key).filter(|v| !v.is_null())
    }

    /// `eos_token_id` may be a number or a list of numbers.
    pub fn token_ids(&self, key: &str) -> Result<Vec<u32>> {
        match self.required(key)? {
            Value::Number(n) => n
                .as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .map(|id| vec![id])
                .ok_or_else(|| self.invalid(key, "expected a token id")),
            Value::Array(items) => items
                .iter()
                .map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| self.invalid(key, "expected a list of token ids")),
            _ => Err(self.invalid(key, "expected a token id or a list of them")),
        }
    }
}

/// `key`, or `outer.inner`, in `json`; `null` counts as absent.
fn lookup<'a>(json: &'a Value, key: &str) -> Option<&'a Value> {
    let value = match key.split_once('.') {
        Some((outer, inner)) => json.get(outer)?.get(inner)?,
        None => json.get(key)?,
    };
    (!value.is_null()).then_some(value)
}

/// An object inside a config file.
pub struct Section<'a> {
    file: &'a ConfigFile,
    prefix: String,
    value: &'a Value,
}

impl<'a> Section<'a> {
    fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    pub fn required(&self, key: &str) -> Result<&'a Value> {
        self.value
            .get(key)
            .filter(|v| !v.is_null())
            .ok_or_else(|| Error::MissingKey { path: self.file.path.clone(), key: self.full(key) })
    }

    fn invalid(&self, key: &str, message: &str) -> Error {
        self.file.invalid(&self.full(key), message)
    }

    /// An integer in `range`, or an error saying it must be `what` in that range.
    fn bounded(&self, key: &str, range: std::ops::RangeInclusive<u64>, what: &str) -> Result<usize> {
        self.required(key)?
            .as_u64()
            .filter(|v| range.contains(v))
            .map(|v| v as usize)
            .ok_or_else(|| self.invalid(key, &format!("expected {what} from {} to {}", range.start(), range.end())))
    }
    /// A non-negative integer of at most [`MAX_CONFIG_INT`].
    pub fn usize(&self, key: &str) -> Result<usize> {
        self.bounded(key, 0..=MAX_CONFIG_INT, "an integer")
    }
    /// A size: an integer from 1 to [`MAX_CONFIG_INT`].
    pub fn dim(&self, key: &str) -> Result<usize> {
        self.bounded(key, 1..=MAX_CONFIG_INT, "a size")
    }
    /// A head width: an integer from 1 to [`MAX_HEAD_DIM`].
    pub fn head_dim(&self, key: &str) -> Result<usize> {
        self.bounded(key, 1..=MAX_HEAD_DIM as u64, "a head width")
    }
    /// A layer count: an integer from 1 to [`MAX_LAYERS`].
    pub fn layers(&self, key: &str) -> Result<usize> {
        self.bounded(key, 1..=MAX_LAYERS as u64, "a layer count")
    }
    pub fn f64(&self, key: &str) -> Result<f64> {
        self.required(key)?.as_f64().ok_or_else(|| self.invalid(key, "expected a number"))
    }
    pub fn bool(&self, key: &str) -> Result<bool> {
        self.required(key)?.as_bool().ok_or_else(|| self.invalid(key, "expected true or false"))
    }
    pub fn str(&self, key: &str) -> Result<&'a str> {
        self.required(key)?.as_str().ok_or_else(|| self.invalid(key, "expected a string"))
    }
    pub fn strings(&self, key: &str) -> Result<Vec<&'a str>> {
        self.required(key)?
            .as_array()
            .and_then(|items| items.iter().map(|v| v.as_str()).collect::<Option<Vec<_>>>())
            .ok_or_else(|| self.invalid(key, "expected a list of strings"))
    }
}
