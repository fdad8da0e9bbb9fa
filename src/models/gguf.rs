//! GGUF import for the Llama and Qwen families: llama.cpp's metadata becomes an HF-style
//! `config.json`, its tensor names become HF names, and the q/k row permutation that llama.cpp's
//! converter applies to Llama-architecture models (interleaved RoPE) is undone, so the shared
//! decoder runs them with rotate-half RoPE like any safetensors checkpoint.

use crate::engine::error::{Error, Result};
use crate::engine::gguf::{Converted, GgufFile, MetaValue};
use crate::engine::quant::QuantizedMatrix;
use crate::engine::source::{ModelSource, CONFIG_FILE};
use crate::engine::tokenizer::TokenizerFiles;
use crate::engine::weights::Weights;
use mlx_rs::Array;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;

/// (GGUF architecture, HF model_type, rows permuted by the converter).
const ARCHITECTURES: &[(&str, &str, bool)] = &[("llama", "llama", true), ("qwen2", "qwen2", false), ("qwen3", "qwen3", false)];

/// A `.gguf` file, or any file starting with the GGUF magic.
pub fn is_gguf(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    path.is_file()
        && (path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
            || std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic)).is_ok()
                && &magic == b"GGUF")
}

pub fn import(path: &Path) -> Result<ModelSource> {
    let file = GgufFile::open(path)?;
    file.check_types()?;
    let arch = file.str("general.architecture")?;
    let Some(&(_, model_type, permuted)) = ARCHITECTURES.iter().find(|(a, _, _)| *a == arch) else {
        return Err(Error::UnsupportedModel {
            path: path.into(),
            model_type: format!("{arch} (GGUF architecture)"),
            supported: ARCHITECTURES.iter().map(|a| a.0).collect::<Vec<_>>().join(", "),
        });
    };
    let key = |k: &str| format!("{arch}.{k}");
    let heads = file.u64(&key("attention.head_count"))? as usize;
    let kv_heads = match file.get(&key("attention.head_count_kv")) {
        Some(v) => v.as_u64().ok_or_else(|| bad(path, "attention.head_count_kv is not an integer"))? as usize,
        None => heads,
    };
    // Head counts split tensors below, before the config is checked: bounded here.
    for (what, n) in [("attention.head_count", heads), ("attention.head_count_kv", kv_heads)] {
        if !(1..=1 << 16).contains(&n) {
            return Err(bad(path, &format!("{arch}.{what} is {n}; expected 1 to 65536")));
        }
    }
    let hidden = file.u64(&key("embedding_length"))? as usize;
    let head_dim = match file.get(&key("attention.key_length")) {
        Some(v) => v.as_u64().unwrap_or(0) as usize,
        None => hidden / heads.max(1),
    };
    if let Some(rot) = file.get(&key("rope.dimension_count")).and_then(MetaValue::as_u64) {
        if rot as usize != head_dim {
            return Err(bad(path, &format!("partial RoPE ({rot} of {head_dim} dims) is not supported")));
        }
    }
    let embed = file.tensor("token_embd.weight").ok_or_else(|| bad(path, "no token_embd.weight tensor"))?;
    let vocab = match file.get(&key("vocab_size")).and_then(MetaValue::as_u64) {
        Some(v) => v as usize,
        None => embed.dims.get(1).copied().unwrap_or(0) as usize,
    };
    let mut eos: Vec<u64> = Vec::new();
    for k in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = file.get(k).and_then(MetaValue::as_u64) {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    let mut config = json!({
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": file.u64(&key("feed_forward_length"))?,
        "num_hidden_layers": file.u64(&key("block_count"))?,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "rms_norm_eps": file.f64(&key("attention.layer_norm_rms_epsilon"))?,
        "rope_theta": file.get(&key("rope.freq_base")).and_then(MetaValue::as_f64).unwrap_or(10000.0),
        "max_position_embeddings": file.u64(&key("context_length"))?,
        "tie_word_embeddings": file.tensor("output.weight").is_none(),
        "eos_token_id": eos,
    });
    if let Some(bos) = file.get("tokenizer.ggml.bos_token_id").and_then(MetaValue::as_u64) {
        config["bos_token_id"] = json!(bos);
    }
    match file.get(&key("rope.scaling.type")).and_then(MetaValue::as_str) {
        None | Some("none") => {}
        Some("linear") => config["rope_scaling"] = json!({"type": "linear", "factor": file.f64(&key("rope.scaling.factor"))?}),
        Some("yarn") => {
            config["rope_scaling"] = json!({
                "type": "yarn",
                "factor": file.f64(&key("rope.scaling.factor"))?,
                "original_max_position_embeddings": file.u64(&key("rope.scaling.original_context_length"))?,
            })
        }
        Some(other) => return Err(bad(path, &format!("{arch}.rope.scaling.type `{other}` is not supported"))),
    }

    let mut arrays: Vec<(String, Array)> = Vec::new();
    let bar = crate::progress::bytes_progress(&format!("reading {}", path.file_name().unwrap_or_default().to_string_lossy()), file.tensors.iter().map(|t| t.nbytes).sum());
    for t in &file.tensors {
        bar.inc(t.nbytes);
        if t.name == "rope_freqs.weight" {
            // Llama 3.1-style frequency divisors: periods × factor.
            let Converted::Float(f) = file.convert(t)? else { return Err(bad(path, "rope_freqs.weight is quantized")) };
            let factors = crate::engine::ops::to_vec_f32(&f)?;
            config["rope_scaling"] = json!({"type": "freq_factors", "factors": factors});
            continue;
        }
        let name = hf_name(&t.name).ok_or_else(|| Error::UnexpectedTensor {
            path: path.into(),
            name: t.name.clone(),
            model_type: format!("{arch} (GGUF)"),
        })?;
        let unpermute_heads = match t.name.rsplit('.').nth(1) {
            Some("attn_q") if permuted => Some(heads),
            Some("attn_k") if permuted => Some(kv_heads),
            _ => None,
        };
        let (module, suffix) = name.rsplit_once('.').expect("HF names have a suffix");
        match file.convert(t)? {
            Converted::Float(a) => {
                let a = match unpermute_heads {
                    Some(n) => unpermute(&a, n)?,
                    None => a,
                };
                arrays.push((name.clone(), a));
            }
            Converted::Quantized(QuantizedMatrix { packed, scales, biases, .. }) => {
                if suffix != "weight" {
                    return Err(bad(path, &format!("tensor `{}` is quantized but is not a weight matrix", t.name)));
                }
                for (part, a) in [("weight", packed), ("scales", scales), ("biases", biases)] {
                    let a = match unpermute_heads {
                        Some(n) => unpermute(&a, n)?,
                        None => a,
                    };
                    arrays.push((format!("{module}.{part}"), a));
                }
            }
        }
    }
    bar.finish_and_clear();
    let mut files = BTreeMap::new();
    files.insert(CONFIG_FILE.to_string(), serde_json::to_string_pretty(&config).expect("JSON values serialise"));
    if let Some(tok) = file.tokenizer_files()? {
        files.insert(TokenizerFiles::TOKENIZER.into(), tok.tokenizer_json);
        files.insert(TokenizerFiles::CONFIG.into(), serde_json::to_string_pretty(&tok.config).expect("JSON values serialise"));
    }
    Ok(ModelSource { path: path.into(), files, weights: Weights::from_arrays(path, arrays)? })
}

fn bad(path: &Path, message: &str) -> Error {
    Error::BadWeights { path: path.into(), message: format!("GGUF: {message}") }
}

/// llama.cpp tensor name → HF name.
fn hf_name(gguf: &str) -> Option<String> {
    let (stem, suffix) = gguf.rsplit_once('.')?;
    let global = match stem {
        "token_embd" => Some("model.embed_tokens"),
        "output_norm" => Some("model.norm"),
        "output" => Some("lm_head"),
        _ => None,
    };
    if let Some(g) = global {
        return Some(format!("{g}.{suffix}"));
    }
    let rest = stem.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// Undoes llama.cpp's `permute`: within each of `heads` row blocks, row 2j+c came from row
/// c·(d/2)+j. Works on float rows, packed quantized rows and their scales alike.
pub fn unpermute(a: &Array, heads: usize) -> Result<Array> {
    let shape = a.shape().to_vec();
    let rows = shape.first().copied().unwrap_or(0);
    let n = i32::try_from(heads).unwrap_or(0);
    if n == 0 || rows % (2 * n) != 0 {
        return Err(Error::Usage(format!("GGUF: {rows} rows cannot be split into {heads} heads of RoPE pairs (corrupt head count?)")));
    }
    let mut split = vec![n, rows / n / 2, 2];
    split.extend_from_slice(&shape[1..]);
    Ok(a.reshape(&split)?.swap_axes(1, 2)?.reshape(&shape)?)
}
