//! Shared helpers for the integration tests: paths into ../shared and safetensors reading.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

/// `../shared` beside the repository (override with SALA_SHARED).
pub fn shared() -> PathBuf {
    let dir = std::env::var_os("SALA_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    assert!(dir.join("golden").is_dir(), "{} has no golden/ (set SALA_SHARED)", dir.display());
    dir
}

pub fn golden(case: &str) -> PathBuf {
    shared().join("golden").join(case)
}

/// A tensor from a safetensors file, widened to f64.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Tensor {
    pub fn row(&self, i: usize) -> &[f64] {
        let n: usize = self.shape[1..].iter().product();
        &self.data[i * n..(i + 1) * n]
    }
}

pub fn read_safetensors(path: &std::path::Path) -> HashMap<String, Tensor> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid safetensors");
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        let raw = view.data();
        let data: Vec<f64> = match view.dtype() {
            safetensors::Dtype::F32 => raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            safetensors::Dtype::I64 => raw.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            safetensors::Dtype::I32 => raw.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
            other => panic!("{name}: unexpected dtype {other:?}"),
        };
        out.insert(name.to_string(), Tensor { shape: view.shape().to_vec(), data });
    }
    out
}

pub fn tokens(case: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(golden(case).join("tokens.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

pub fn ids(v: &serde_json::Value, key: &str) -> Vec<u32> {
    v[key].as_array().unwrap_or_else(|| panic!("tokens.json has no {key}")).iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// Largest |a − b|.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

pub fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// Gap between the two largest values (how robust the argmax is).
pub fn top2_gap(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| b.total_cmp(a));
    s[0] - s[1]
}
