//! `sala bench --synthetic`: a model with a real model's shapes and random weights, built in memory
//! so speed can be measured anywhere without downloading it. Presets are released configs
//! (`eval/synthetic/*.json`); any `config.json` works too. `--bits` quantizes as `sala quantize`
//! does by default (every projection in groups of 64; embeddings and norms stay float).
//!
//! Only one random matrix is drawn per distinct shape (drawing 9B normals takes minutes on a CPU);
//! every tensor then gets its own buffer — that matrix times a random factor — so the memory used
//! and read per token are the real model's.

use crate::engine::config::ConfigFile;
use crate::engine::error::{Error, Result};
use crate::engine::quant::{QuantConfig, QuantFormat, QuantizedMatrix};
use crate::engine::source::{ModelSource, CONFIG_FILE};
use crate::engine::weights::{TensorSpec, Weights};
use crate::models;
use mlx_rs::{Array, Dtype};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Built-in presets: name and the released `config.json`.
pub const PRESETS: [(&str, &str); 2] = [
    ("minicpm-sala-9b", include_str!("../../eval/synthetic/minicpm-sala-9b.json")),
    ("qwen3-8b", include_str!("../../eval/synthetic/qwen3-8b.json")),
];

/// `sala quantize`'s default group size.
pub const GROUP_SIZE: i32 = 64;

pub struct SyntheticModel {
    /// What reports call it: `minicpm-sala-9b-q4 (synthetic)`.
    pub name: String,
    pub cfg: ConfigFile,
    specs: Vec<TensorSpec>,
    quantization: Option<QuantConfig>,
}

impl SyntheticModel {
    /// `preset`: a preset name or a path to a `config.json`; `bits`: quantize to 4 or 8 bits.
    pub fn new(preset: &str, bits: Option<i32>) -> Result<Self> {
        let (name, path, text) = match PRESETS.iter().find(|(n, _)| *n == preset) {
            Some((n, text)) => (n.to_string(), PathBuf::from(format!("{n} (built-in preset)")), text.to_string()),
            None => {
                let path = Path::new(preset);
                if !path.is_file() {
                    let names: Vec<&str> = PRESETS.iter().map(|(n, _)| *n).collect();
                    return Err(Error::Usage(format!(
                        "--synthetic {preset}: neither a preset ({}) nor a config.json file",
                        names.join(", ")
                    )));
                }
                let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
                // `dir/config.json` goes by the directory's name.
                let stem = match path.file_stem().map(|s| s.to_string_lossy().to_string()) {
                    Some(s) if s != "config" => Some(s),
                    _ => path.canonicalize().ok().and_then(|p| p.parent()?.file_name().map(|n| n.to_string_lossy().to_string())),
                };
                (stem.unwrap_or_else(|| "model".into()), path.to_path_buf(), text)
            }
        };
        let mut cfg = ConfigFile::parse(&path, &text)?;
        // The shapes come from the config; how the weights are stored is --bits' business.
        let object = cfg.json.as_object_mut().expect("ConfigFile holds an object");
        object.remove("quantization");
        object.remove("quantization_config");
        let specs = models::tensor_specs(&cfg)?;
        let quantization = match bits {
            None => None,
            Some(bits) => {
                let default = QuantFormat { group_size: GROUP_SIZE, bits }
                    .validate()
                    .map_err(|m| Error::Usage(format!("--bits {bits}: {m}")))?;
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
        Ok(Self { name: format!("{name}{suffix} (synthetic)"), cfg, specs, quantization })
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
        let key = mlx_rs::random::key(0x5a1a)?;
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5a1a);
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
        let config = serde_json::to_string_pretty(&self.cfg.json).expect("JSON values serialise");
        Ok(ModelSource {
            path: PathBuf::from(&self.name),
            files: BTreeMap::from([(CONFIG_FILE.to_string(), config)]),
            weights: Weights::from_arrays(Path::new(&self.name), arrays)?,
        })
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
