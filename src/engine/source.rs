//! A model as found on disk, before any architecture looks at it: its tensors plus its side files
//! (`config.json`, `tokenizer.json`, `tokenizer_config.json`, chat template...) as texts.
//!
//! Three layouts give the same thing: a directory (HF/mlx-lm layout), a single-file `.sala`
//! (safetensors whose metadata carries the side files under `sala.file.<name>`), and a GGUF file
//! (converted by the model family that knows its tensor names, see `models::gguf`).

use super::config::ConfigFile;
use super::error::{Error, Result};
use super::generation_config::{GenerationDefaults, GENERATION_CONFIG_FILE};
use super::tokenizer::{TextTokenizer, TokenizerFiles};
use super::weights::{Weights, INDEX_FILE};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const CONFIG_FILE: &str = "config.json";
/// Metadata key prefix under which a `.sala` file keeps each side file.
pub const PACKED_FILE_PREFIX: &str = "sala.file.";
/// Side files larger than this are not carried (they are not configs or tokenizers).
const MAX_SIDE_FILE: u64 = 64 << 20;

pub struct ModelSource {
    /// What the user named.
    pub path: PathBuf,
    /// Side files by name.
    pub files: BTreeMap<String, String>,
    pub weights: Weights,
}

/// Every small UTF-8 file of model directory `dir` but its weights, by name.
pub fn side_files(dir: &Path) -> Result<BTreeMap<String, String>> {
    let mut files = BTreeMap::new();
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().to_string();
        // Follows symlinks: hub-cache snapshots link every file into blobs/.
        let meta = std::fs::metadata(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
        if !meta.is_file() || name.starts_with('.') || name.ends_with(".safetensors") || name == INDEX_FILE || meta.len() > MAX_SIDE_FILE {
            continue;
        }
        let bytes = std::fs::read(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
        if let Ok(text) = String::from_utf8(bytes) {
            files.insert(name, text);
        }
    }
    Ok(files)
}

impl ModelSource {
    /// A model directory: safetensors + every small UTF-8 side file.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        if !dir.join(CONFIG_FILE).is_file() {
            return Err(Error::Usage(format!(
                "{}: no config.json; --model must name a model directory (config.json + model.safetensors), \
                 a .sala file or a .gguf file",
                dir.display()
            )));
        }
        Ok(Self { path: dir.into(), weights: Weights::open(dir)?, files: side_files(dir)? })
    }

    /// A single safetensors file whose metadata holds the side files (`sala pack`).
    pub fn from_packed(file: &Path) -> Result<Self> {
        let weights = Weights::open(file)?;
        let files: BTreeMap<String, String> = weights
            .metadata()
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(PACKED_FILE_PREFIX)?.to_string(), v.clone())))
            .collect();
        if let Some(name) = files.keys().find(|n| !super::checkpoint::is_plain_file_name(n)) {
            return Err(Error::BadWeights {
                path: file.into(),
                message: format!(
                    "metadata `{PACKED_FILE_PREFIX}{0}` names a side file `{0}` that is not a plain file name; the file is corrupt or hostile",
                    name.escape_debug()
                ),
            });
        }
        if !files.contains_key(CONFIG_FILE) {
            return Err(Error::BadWeights {
                path: file.into(),
                message: format!(
                    "this safetensors file carries no config (metadata `{PACKED_FILE_PREFIX}{CONFIG_FILE}`); \
                     pass the directory it came from, or make a single-file model with `sala pack`"
                ),
            });
        }
        Ok(Self { path: file.into(), files, weights })
    }

    pub fn config(&self) -> Result<ConfigFile> {
        let path = self.side_path(CONFIG_FILE);
        let text = self.files.get(CONFIG_FILE).ok_or_else(|| Error::Usage(format!("{}: missing", path.display())))?;
        ConfigFile::parse(&path, text)
    }

    /// The sampling defaults and extra end tokens of `generation_config.json`, if it ships one.
    pub fn generation_defaults(&self) -> Result<GenerationDefaults> {
        match self.files.get(GENERATION_CONFIG_FILE) {
            Some(text) => GenerationDefaults::parse(&ConfigFile::parse(&self.side_path(GENERATION_CONFIG_FILE), text)?),
            None => Ok(GenerationDefaults::default()),
        }
    }

    pub fn tokenizer_files(&self) -> Result<Option<TokenizerFiles>> {
        TokenizerFiles::from_texts(&self.path, &self.files)
    }

    /// The model's tokenizer, if it ships one; `bos_fallback` is the model config's bos id.
    pub fn tokenizer(&self, bos_fallback: Option<u32>) -> Result<Option<TextTokenizer>> {
        self.tokenizer_files()?.map(|files| TextTokenizer::new(&files, bos_fallback)).transpose()
    }

    /// How to name a side file in messages.
    fn side_path(&self, name: &str) -> PathBuf {
        if self.path.is_dir() {
            self.path.join(name)
        } else {
            PathBuf::from(format!("{}[{name}]", self.path.display()))
        }
    }
}
