//! Model families, one module each, and the loader that picks one from `config.json`.

pub mod layers;
pub mod sala;

use crate::engine::config::ConfigFile;
use crate::engine::error::{Error, Result};
use crate::engine::model::LanguageModel;
use crate::engine::weights::Weights;
use mlx_rs::Dtype;
use std::path::Path;

/// Loads the model in `dir` (`config.json` + safetensors), in `dtype` or the checkpoint's own.
pub fn load(dir: &Path, dtype: Option<Dtype>) -> Result<Box<dyn LanguageModel>> {
    let config_path = dir.join("config.json");
    if !config_path.is_file() {
        return Err(Error::Usage(format!(
            "{}: no config.json; --model must name a model directory (config.json + model.safetensors)",
            dir.display()
        )));
    }
    let cfg = ConfigFile::read(&config_path)?;
    let model_type = cfg.str("model_type")?;
    match model_type {
        sala::MODEL_TYPE => {
            let mut weights = Weights::open(dir)?;
            Ok(Box::new(sala::SalaModel::load(&cfg, &mut weights, dtype)?))
        }
        other => Err(Error::UnsupportedModel {
            path: config_path.clone(),
            model_type: other.into(),
            supported: sala::MODEL_TYPE.into(),
        }),
    }
}
