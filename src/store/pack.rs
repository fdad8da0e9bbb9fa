//! Single-file models (`.sala`): a safetensors file holding every tensor as stored (quantized or
//! not) plus the model's side files — `config.json`, `tokenizer.json`, `tokenizer_config.json`,
//! chat template... — as metadata strings under `sala.file.<name>`. Any safetensors reader can
//! open it; `sala run --model x.sala` runs it; `extract` gives back the directory, byte for byte.

use crate::engine::checkpoint::{CheckpointWriter, StagingDir, MAX_SHARD_BYTES};
use crate::engine::error::{Error, Result};
use crate::engine::source::{ModelSource, PACKED_FILE_PREFIX};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "sala";
pub const FORMAT_VERSION: &str = "1";

/// Adds every tensor of `source`, as stored, to a writer.
fn add_tensors<'a>(source: &'a ModelSource, writer: &mut CheckpointWriter<'a>, progress: &'a dyn Fn(u64)) -> Result<()> {
    for (name, info) in source.weights.infos() {
        let shape = info.shape.iter().map(|&d| d as usize).collect();
        let bytes = info.nbytes();
        writer.add(name.clone(), &info.dtype, shape, move || {
            let data = source.weights.bytes(name)?;
            progress(bytes);
            Ok(data)
        })?;
    }
    Ok(())
}

/// Writes `source` (already validated) as one file at `output` (which must not exist).
pub fn pack(source: &ModelSource, output: &Path, progress: &dyn Fn(u64)) -> Result<()> {
    if output.exists() {
        return Err(Error::Usage(format!("{} already exists; remove it or choose another --output", output.display())));
    }
    let mut metadata = BTreeMap::new();
    metadata.insert("format".to_string(), FORMAT.to_string());
    metadata.insert("sala.format_version".to_string(), FORMAT_VERSION.to_string());
    for (name, text) in &source.files {
        metadata.insert(format!("{PACKED_FILE_PREFIX}{name}"), text.clone());
    }
    let mut writer = CheckpointWriter::new();
    add_tensors(source, &mut writer, progress)?;
    writer.write_file(output, &metadata)
}

/// Restores the model directory a `.sala` file was made from into `output` (which must not exist).
pub fn extract(packed: &Path, output: &Path, progress: &dyn Fn(u64)) -> Result<PathBuf> {
    let source = ModelSource::from_packed(packed)?;
    let staging = StagingDir::new(output)?;
    let mut writer = CheckpointWriter::new();
    add_tensors(&source, &mut writer, progress)?;
    writer.write_dir(&staging.staging, MAX_SHARD_BYTES)?;
    for (name, text) in &source.files {
        staging.write(name, text)?;
    }
    staging.finish()
}
