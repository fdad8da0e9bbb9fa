//! Prompt-cache files taken apart and put back together as an attacker would: tensors and
//! metadata changed at will, then sealed with valid digests (each 16 MiB piece's xxh3 in metadata
//! `xxh3`) and header checksum (metadata `checksum`, see `engine::state_file`), so only the
//! reader's own checks of shapes, ranges and values stand between them and the model.

use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// A state file's parts.
#[derive(Clone)]
pub struct Parts {
    pub metadata: BTreeMap<String, String>,
    /// By name: dtype, shape, bytes.
    pub tensors: BTreeMap<String, (String, Vec<usize>, Vec<u8>)>,
}

impl Parts {
    pub fn parse(bytes: &[u8]) -> Self {
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        let data = &bytes[8 + n..];
        let mut parts = Parts { metadata: BTreeMap::new(), tensors: BTreeMap::new() };
        for (name, v) in header {
            if name == "__metadata__" {
                parts.metadata = serde_json::from_value(v).unwrap();
                continue;
            }
            let range = v["data_offsets"].as_array().unwrap();
            let (a, b) = (range[0].as_u64().unwrap() as usize, range[1].as_u64().unwrap() as usize);
            let shape = v["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
            parts.tensors.insert(name, (v["dtype"].as_str().unwrap().to_string(), shape, data[a..b].to_vec()));
        }
        parts
    }

    /// The file, with digests and checksum made for what it now holds.
    pub fn seal(&self) -> Vec<u8> {
        let mut metadata = self.metadata.clone();
        let digests: Map<String, Value> = self
            .tensors
            .iter()
            .map(|(name, (_, _, bytes))| {
                let pieces: Vec<String> = bytes.chunks(sala::engine::weights::READ_PIECE).map(|p| format!("{:016x}", xxhash_rust::xxh3::xxh3_64(p))).collect();
                (name.clone(), json!(pieces))
            })
            .collect();
        metadata.insert("xxh3".into(), Value::Object(digests).to_string());
        let mut text = Vec::new();
        for (key, value) in metadata.iter().filter(|(k, _)| *k != "checksum") {
            text.extend_from_slice(format!("{key}\0{value}\0").as_bytes());
        }
        for (name, (dtype, shape, _)) in &self.tensors {
            text.extend_from_slice(format!("\n{name}\0{dtype}\0{shape:?}").as_bytes());
        }
        metadata.insert("checksum".into(), format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&text)));
        self.with_metadata(metadata)
    }

    /// The file with `metadata` as given (digests and checksum as they are there).
    pub fn with_metadata(&self, metadata: BTreeMap<String, String>) -> Vec<u8> {
        let mut header = Map::new();
        header.insert("__metadata__".into(), json!(metadata));
        let mut offset = 0;
        for (name, (dtype, shape, bytes)) in &self.tensors {
            header.insert(name.clone(), json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes.len()]}));
            offset += bytes.len();
        }
        let mut header = serde_json::to_vec(&Value::Object(header)).unwrap();
        header.resize(header.len().div_ceil(8) * 8, b' ');
        let mut out = (header.len() as u64).to_le_bytes().to_vec();
        out.extend(header);
        for (_, _, bytes) in self.tensors.values() {
            out.extend(bytes);
        }
        out
    }

    /// Sets the f32 value at `index` of tensor `name`.
    pub fn set_f32(&mut self, name: &str, index: usize, value: f32) {
        let (dtype, _, bytes) = self.tensors.get_mut(name).unwrap_or_else(|| panic!("no tensor {name}"));
        assert_eq!(dtype, "F32");
        bytes[4 * index..4 * index + 4].copy_from_slice(&value.to_le_bytes());
    }

    /// The names of the tensors starting with `prefix`.
    pub fn names(&self, prefix: &str) -> Vec<String> {
        self.tensors.keys().filter(|n| n.starts_with(prefix)).cloned().collect()
    }
}

/// The ways a valid state file (of a model whose layer `attention` keeps keys and values) is
/// crafted into one that must be refused, by what the refusal names: tokens of shape [0], pooled
/// keys of extreme sizes, NaN or infinite values in keys, values and recurrent states, a token
/// outside the vocabulary, only `tokens`, one layer's keys gone, and a header changed without
/// its checksum.
pub fn crafted(valid: &[u8], attention: usize) -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let parts = Parts::parse(valid);
    let keys = format!("layer.{attention}.keys");
    let mut out = Vec::new();

    let mut p = parts.clone();
    p.tensors.insert("tokens".into(), ("U32".into(), vec![0], Vec::new()));
    p.metadata.insert("points".into(), "[]".into());
    out.push(("empty tokens", p.seal(), "holds no tokens"));

    for facts in [json!([i64::MAX, 1, i64::MAX, i64::MAX]), json!([i64::MIN, -1, 2, 32]), json!([1, 0, 0, 0]), json!([i64::MAX, i64::MAX, 2, 32])] {
        let mut p = parts.clone();
        p.metadata.insert("pooled".into(), json!({attention.to_string(): [facts]}).to_string());
        p.tensors.insert(format!("layer.{attention}.pooled.0"), ("F32".into(), vec![1, 1, 1, 64], vec![0; 256]));
        out.push(("extreme pooled keys", p.seal(), "pooled keys"));
    }

    for (what, value) in [("NaN in keys", f32::NAN), ("infinity in keys", f32::INFINITY)] {
        let mut p = parts.clone();
        p.set_f32(&keys, 3, value);
        out.push((what, p.seal(), "NaN or infinite"));
    }
    let mut p = parts.clone();
    p.set_f32(&format!("layer.{attention}.values"), 0, f32::NEG_INFINITY);
    out.push(("infinity in values", p.seal(), "NaN or infinite"));
    if let Some(point) = parts.names("point.").last().cloned() {
        let mut p = parts.clone();
        p.set_f32(&point, 1, f32::NAN);
        out.push(("NaN in a recurrent state", p.seal(), "NaN or infinite"));
    }

    let mut p = parts.clone();
    let (_, _, tokens) = p.tensors.get_mut("tokens").unwrap();
    tokens[..4].copy_from_slice(&100_000u32.to_le_bytes());
    out.push(("a token outside the vocabulary", p.seal(), "outside this model's vocabulary"));

    let mut p = parts.clone();
    p.tensors.retain(|name, _| name == "tokens");
    p.metadata.insert("pooled".into(), "{}".into());
    out.push(("only tokens", p.seal(), "missing"));

    let mut p = parts.clone();
    p.tensors.remove(&keys);
    out.push(("one layer's keys missing", p.seal(), "are missing"));

    let mut metadata = Parts::parse(valid).metadata;
    metadata.insert("layers".into(), "7".into());
    out.push(("a header changed without its checksum", parts.with_metadata(metadata), "checksum"));

    let mut p = parts.clone();
    p.metadata.insert("layers".into(), "7".into());
    out.push(("another count of layers", p.seal(), "layers"));
    out
}
