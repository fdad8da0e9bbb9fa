//! GGUF files written by hand for the tests: metadata, a tensor directory (dims in ggml order)
//! and 32-byte aligned data, as llama.cpp's writer lays them out.

pub enum Meta {
    U32(u32),
    F32(f32),
    Str(&'static str),
    /// An array of strings (`tokenizer.ggml.tokens`, `tokenizer.ggml.merges`).
    Strs(Vec<String>),
    /// An array of i32 (`tokenizer.ggml.token_type`).
    I32s(Vec<i32>),
}

/// A GGUF v3 file: `meta`, then `tensors` as (name, ggml dims, ggml type id, data).
pub fn gguf_bytes(meta: &[(&str, Meta)], tensors: &[(String, Vec<u64>, u32, Vec<u8>)]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    let string = |out: &mut Vec<u8>, s: &str| {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    };
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((meta.len() as u64).to_le_bytes());
    for (key, value) in meta {
        string(&mut out, key);
        match value {
            Meta::U32(v) => {
                out.extend(4u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::F32(v) => {
                out.extend(6u32.to_le_bytes());
                out.extend(v.to_le_bytes());
            }
            Meta::Str(s) => {
                out.extend(8u32.to_le_bytes());
                string(&mut out, s);
            }
            Meta::Strs(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(8u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for s in items {
                    string(&mut out, s);
                }
            }
            Meta::I32s(items) => {
                out.extend(9u32.to_le_bytes());
                out.extend(5u32.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for v in items {
                    out.extend(v.to_le_bytes());
                }
            }
        }
    }
    let mut offset = 0u64;
    let mut offsets = Vec::new();
    for (name, dims, kind, data) in tensors {
        string(&mut out, name);
        out.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            out.extend(d.to_le_bytes());
        }
        out.extend(kind.to_le_bytes());
        out.extend(offset.to_le_bytes());
        offsets.push(offset);
        offset += (data.len() as u64).div_ceil(32) * 32;
    }
    out.resize(out.len().div_ceil(32) * 32, 0);
    let start = out.len();
    for ((_, _, _, data), off) in tensors.iter().zip(offsets) {
        out.resize(start + off as usize, 0);
        out.extend(data);
    }
    out
}
