//! Synthetic models: a real model's shapes with random weights, built in memory so speed can be
//! measured anywhere without downloading it (`sala bench --synthetic`, or any command given a
//! folder holding a `synthetic.json`). Presets are released configs (`eval/synthetic/*.json`); any
//! `config.json` works too. `bits` quantizes as `sala quantize` does by default (every projection
//! in groups of 64; embeddings and norms stay float).
//!
//! Only one random matrix is drawn per distinct shape (drawing 9B normals takes minutes on a CPU);
//! every tensor then gets its own buffer — that matrix times a random factor — so the memory used
//! and read per token are the real model's. Draws are seeded: two loads give the same model.

use crate::engine::config::ConfigFile;
use crate::engine::error::{Error, Result};
use crate::engine::quant::{QuantConfig, QuantFormat, QuantizedMatrix};
use crate::engine::source::{self, ModelSource, CONFIG_FILE};
use crate::engine::tokenizer::{TextTokenizer, TokenizerFiles};
use crate::engine::weights::{dtype_name, TensorSpec, Weights};
use crate::models;
use mlx_rs::{Array, Dtype};
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Built-in presets: name and the released `config.json`.
pub const PRESETS: [(&str, &str); 2] = [
    ("minicpm-sala-9b", include_str!("../../eval/synthetic/minicpm-sala-9b.json")),
    ("qwen3-8b", include_str!("../../eval/synthetic/qwen3-8b.json")),
];

/// `sala quantize`'s default group size.
pub const GROUP_SIZE: i32 = 64;

/// The file that makes a folder a synthetic model.
pub const SYNTHETIC_FILE: &str = "synthetic.json";

/// The seed of the draws unless `synthetic.json` names another.
pub const DEFAULT_SEED: u64 = 0x5a1a;

/// `synthetic.json`: a preset or an inline config, and how to store it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SyntheticFile {
    /// A built-in preset's name.
    preset: Option<String>,
    /// A whole `config.json` object (tests use tiny ones).
    config: Option<serde_json::Value>,
    /// Quantize the projections to this many bits.
    bits: Option<i32>,
    seed: Option<u64>,
    /// What reports call it (default: the preset's name, else the folder's).
    name: Option<String>,
}

/// Whether `dir` is a synthetic model's folder.
pub fn is_synthetic(dir: &Path) -> bool {
    dir.is_dir() && dir.join(SYNTHETIC_FILE).is_file()
}

fn preset_names() -> String {
    PRESETS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

pub struct SyntheticModel {
    /// What reports call it: `minicpm-sala-9b-q4 (synthetic)`.
    pub name: String,
    pub cfg: ConfigFile,
    specs: Vec<TensorSpec>,
    quantization: Option<QuantConfig>,
    seed: u64,
    /// The folder it was described in, and the side files there (its tokenizer).
    folder: Option<(PathBuf, BTreeMap<String, String>)>,
    /// What the shapes came from, for `sala show`: `preset minicpm-sala-9b` or `inline config`.
    pub origin: String,
}

impl SyntheticModel {
    /// `preset`: a preset name or a path to a `config.json`; `bits`: quantize to 4 or 8 bits
    /// (`sala bench --synthetic PRESET --bits N`).
    pub fn new(preset: &str, bits: Option<i32>) -> Result<Self> {
        let (name, path, text, origin) = match PRESETS.iter().find(|(n, _)| *n == preset) {
            Some((n, text)) => (n.to_string(), PathBuf::from(format!("{n} (built-in preset)")), text.to_string(), format!("preset {n}")),
            None => {
                let path = Path::new(preset);
                if !path.is_file() {
                    return Err(Error::Usage(format!("--synthetic {preset}: neither a preset ({}) nor a config.json file", preset_names())));
                }
                let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
                // `dir/config.json` goes by the directory's name.
                let stem = match path.file_stem().map(|s| s.to_string_lossy().to_string()) {
                    Some(s) if s != "config" => Some(s),
                    _ => path.canonicalize().ok().and_then(|p| p.parent()?.file_name().map(|n| n.to_string_lossy().to_string())),
                };
                (stem.unwrap_or_else(|| "model".into()), path.to_path_buf(), text, format!("config {}", path.display()))
            }
        };
        let cfg = ConfigFile::parse(&path, &text)?;
        Self::from_config(name, cfg, bits, origin, |m| Error::Usage(format!("--bits {}: {m}", bits.unwrap_or_default())))
    }

    /// The synthetic model `dir/synthetic.json` describes, with the tokenizer beside it; `None`
    /// when `dir` is not a synthetic model's folder.
    pub fn in_folder(dir: &Path) -> Result<Option<Self>> {
        if !is_synthetic(dir) {
            return Ok(None);
        }
        let path = dir.join(SYNTHETIC_FILE);
        let invalid = |key: &str, message: String| Error::InvalidKey { path: path.clone(), key: key.into(), message };
        if dir.join(CONFIG_FILE).is_file() {
            return Err(Error::Usage(format!(
                "{}: holds both {SYNTHETIC_FILE} (random weights) and {CONFIG_FILE} (a checkpoint); remove one",
                dir.display()
            )));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let file: SyntheticFile = serde_json::from_str(&text).map_err(|e| Error::Json {
            path: path.clone(),
            message: format!("{e} (expected {{\"preset\": NAME or \"config\": {{…}}, \"bits\": 8, \"seed\": N, \"name\": TEXT}}, all but one of preset/config optional)"),
        })?;
        let folder_name = dir.canonicalize().ok().and_then(|p| p.file_name().map(|n| n.to_string_lossy().to_string())).unwrap_or_else(|| "model".into());
        let (name, cfg, origin) = match (file.preset, file.config) {
            (Some(preset), None) => {
                let Some((n, text)) = PRESETS.iter().find(|(n, _)| *n == preset) else {
                    return Err(invalid("preset", format!("`{preset}` is not a preset (presets: {}); name one, or give the shapes as a `config` object", preset_names())));
                };
                (n.to_string(), ConfigFile::parse(&path, text)?, format!("preset {n}"))
            }
            (None, Some(config)) => (folder_name, ConfigFile::from_value(&path, config)?, "inline config".to_string()),
            (Some(_), Some(_)) => return Err(invalid("preset", "and `config` both given; keep one (a preset's name, or a config object)".into())),
            (None, None) => return Err(invalid("preset", format!("missing: name a preset ({}) or give a `config` object", preset_names()))),
        };
        let name = file.name.unwrap_or(name);
        let mut model = Self::from_config(name, cfg, file.bits, origin, |m| invalid("bits", format!("{m}; 8 or 4 quantize as `sala quantize` does")))?;
        model.seed = file.seed.unwrap_or(DEFAULT_SEED);
        let files = source::side_files(dir)?;
        // Text in and out needs a tokenizer, and it must not write ids the model has no row for.
        let Some(tokenizer) = TokenizerFiles::from_texts(dir, &files)? else {
            return Err(Error::Usage(format!(
                "{}: a synthetic model needs a tokenizer beside {SYNTHETIC_FILE}: copy tokenizer.json and tokenizer_config.json \
                 (its chat template) from a model's folder into it (eval/synthetic-folder.sh does)",
                dir.display()
            )));
        };
        let tokens = TextTokenizer::new(&tokenizer, None)?.vocab_size();
        let vocab = models::complete_config(&model.cfg)?.opt("vocab_size").and_then(|v| v.as_u64()).unwrap_or(0) as usize;
        if tokens > vocab {
            return Err(Error::Usage(format!(
                "{}: its tokenizer has {tokens} tokens but the model's vocab_size is {vocab}; use a tokenizer with at most {vocab} tokens or a larger vocab_size",
                dir.display()
            )));
        }
        model.folder = Some((dir.to_path_buf(), files));
        Ok(Some(model))
    }

    /// The model of `cfg`'s shapes, quantized to `bits`; `bad_bits` says what is wrong with them.
    fn from_config(name: String, mut cfg: ConfigFile, bits: Option<i32>, origin: String, bad_bits: impl Fn(String) -> Error) -> Result<Self> {
        // The shapes come from the config; how the weights are stored is `bits`' business.
        let object = cfg.json.as_object_mut().expect("ConfigFile holds an object");
        object.remove("quantization");
        object.remove("quantization_config");
        let specs = models::tensor_specs(&cfg)?;
        let quantization = match bits {
            None => None,
            Some(bits) => {
                let default = QuantFormat { group_size: GROUP_SIZE, bits }.validate().map_err(bad_bits)?;
                let overrides = specs
                    .iter()
                    .filter(|s| is_matrix(s) && !quantizable(s))
                    .map(|s| (module(s).to_string(), None))
                    .collect();
                Some(QuantConfig { default, overrides })
            }
        };
        if let Some(q) = &quantization {
            cfg.json["quantization"] = q.to_json();
        }
        let suffix = bits.map_or(String::new(), |b| format!("-q{b}"));
        Ok(Self { name: format!("{name}{suffix} (synthetic)"), cfg, specs, quantization, seed: DEFAULT_SEED, folder: None, origin })
    }

    /// The bits its projections are quantized to (`None`: float).
    pub fn bits(&self) -> Option<i32> {
        self.quantization.as_ref().map(|q| q.default.bits)
    }

    /// The folder it was described in (`None`: `sala bench --synthetic`).
    pub fn folder(&self) -> Option<&Path> {
        self.folder.as_ref().map(|(dir, _)| dir.as_path())
    }

    /// Its folder's side files with its config and no tensors: what `sala show` describes
    /// before anything is drawn.
    pub fn described(&self) -> Result<ModelSource> {
        let path = self.source_path();
        Ok(ModelSource { weights: Weights::from_arrays(&path, Vec::new())?, files: self.files(), path })
    }

    fn source_path(&self) -> PathBuf {
        self.folder().map_or_else(|| PathBuf::from(&self.name), Path::to_path_buf)
    }

    fn files(&self) -> BTreeMap<String, String> {
        let mut files = self.folder.as_ref().map(|(_, files)| files.clone()).unwrap_or_default();
        files.remove(SYNTHETIC_FILE);
        files.insert(CONFIG_FILE.to_string(), serde_json::to_string_pretty(&self.cfg.json).expect("JSON values serialise"));
        files
    }

    /// Every tensor as built in `dtype`: name, dtype and shape (a quantized matrix's packed
    /// codes, scales and biases).
    pub fn built_tensors(&self, dtype: Dtype) -> Vec<(String, &'static str, Vec<i32>)> {
        let float = dtype_name(dtype).unwrap_or("?");
        let mut tensors = Vec::new();
        for spec in &self.specs {
            match self.format(spec) {
                Some(f) => {
                    let (rows, cols) = (spec.shape[0], spec.shape[1]);
                    let m = module(spec);
                    tensors.push((format!("{m}.weight"), "U32", vec![rows, cols * f.bits / 32]));
                    tensors.push((format!("{m}.scales"), float, vec![rows, cols / f.group_size]));
                    tensors.push((format!("{m}.biases"), float, vec![rows, cols / f.group_size]));
                }
                None => tensors.push((spec.name.clone(), float, spec.shape.clone())),
            }
        }
        tensors
    }

    /// The quantized formats and how many matrices have each.
    pub fn formats(&self) -> BTreeMap<(i32, i32), usize> {
        let mut formats = BTreeMap::new();
        for f in self.specs.iter().filter_map(|s| self.format(s)) {
            *formats.entry((f.bits, f.group_size)).or_default() += 1;
        }
        formats
    }

    pub fn n_params(&self) -> usize {
        self.specs.iter().map(numel).sum()
    }

    /// Bytes of the weights once built in `dtype` (scales and biases in `dtype` too).
    pub fn weights_bytes(&self, dtype: Dtype) -> u64 {
        let size = crate::engine::memory::dtype_bytes(dtype);
        let bytes = |s: &TensorSpec| match self.format(s) {
            Some(f) => numel(s) * f.bits as usize / 8 + 2 * numel(s) / f.group_size as usize * size,
            None => numel(s) * size,
        };
        self.specs.iter().map(bytes).sum::<usize>() as u64
    }

    fn format(&self, spec: &TensorSpec) -> Option<QuantFormat> {
        let q = self.quantization.as_ref()?;
        if quantizable(spec) {
            q.for_module(module(spec))
        } else {
            None
        }
    }

    /// Draws the weights in `dtype` on the default device; `progress` gets each tensor's bytes.
    pub fn build(&self, dtype: Dtype, progress: impl Fn(u64)) -> Result<ModelSource> {
        let std = self.cfg.opt("initializer_range").and_then(|v| v.as_f64()).unwrap_or(0.02) as f32;
        let key = mlx_rs::random::key(self.seed)?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(self.seed);
        let mut floats: HashMap<Vec<i32>, Array> = HashMap::new();
        let mut quantized: HashMap<(Vec<i32>, i32), QuantizedMatrix> = HashMap::new();
        let mut arrays = Vec::new();
        for spec in &self.specs {
            let factor = Array::from_f32(rng.random_range(0.5f32..1.5)).as_dtype(dtype)?;
            let mut made: Vec<(String, Array)> = Vec::new();
            if spec.shape.len() < 2 {
                // Norm weights: a scale around 1, as trained ones are.
                made.push((spec.name.clone(), mlx_rs::ops::ones::<f32>(&spec.shape)?.as_dtype(dtype)?.multiply(&factor)?));
            } else if let Some(format) = self.format(spec) {
                let base = match quantized.entry((spec.shape.clone(), format.bits)) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        let w = mlx_rs::random::normal::<f32>(&spec.shape[..], 0.0, std, &key)?.as_dtype(dtype)?;
                        e.insert(QuantizedMatrix::quantize(&w, format)?)
                    }
                };
                let m = module(spec);
                // Adding 0 gives the packed codes a buffer of their own.
                made.push((format!("{m}.weight"), base.packed.add(Array::from_slice(&[0u32], &[]))?));
                made.push((format!("{m}.scales"), base.scales.multiply(&factor)?));
                made.push((format!("{m}.biases"), base.biases.multiply(&factor)?));
            } else {
                let base = match floats.entry(spec.shape.clone()) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(mlx_rs::random::normal::<f32>(&spec.shape[..], 0.0, std, &key)?.as_dtype(dtype)?)
                    }
                };
                made.push((spec.name.clone(), base.multiply(&factor)?));
            }
            mlx_rs::transforms::eval(made.iter().map(|(_, a)| a))?;
            progress(made.iter().map(|(_, a)| a.nbytes() as u64).sum());
            arrays.extend(made);
        }
        let path = self.source_path();
        Ok(ModelSource { weights: Weights::from_arrays(&path, arrays)?, files: self.files(), path })
    }
}

fn numel(spec: &TensorSpec) -> usize {
    spec.shape.iter().map(|&d| d as usize).product()
}

fn module(spec: &TensorSpec) -> &str {
    spec.name.strip_suffix(".weight").unwrap_or(&spec.name)
}

fn is_matrix(spec: &TensorSpec) -> bool {
    spec.shape.len() == 2 && spec.name.ends_with(".weight")
}

/// What `sala quantize` quantizes by default: projections whose rows split into whole groups.
fn quantizable(spec: &TensorSpec) -> bool {
    is_matrix(spec) && !module(spec).ends_with("embed_tokens") && spec.shape[1] % GROUP_SIZE == 0
}
