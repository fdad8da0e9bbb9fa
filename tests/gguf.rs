//! GGUF import on hand-built files: a tiny Llama written the way llama.cpp's converter writes it
//! (q/k rows permuted, ggml dimension order, one Q8_0 matrix) must give the same logits as the
//! HF-layout checkpoint it came from; damaged files must give typed errors.

mod common;

use common::gguf_file::{gguf_bytes, Meta};
use mlx_rs::Array;
use sala::engine::error::Error;
use sala::engine::gguf::{convert_bytes, Converted, GgmlType};
use sala::engine::model::Logits;
use sala::engine::ops::to_vec_f32;
use std::path::{Path, PathBuf};

const HIDDEN: usize = 32;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 8;
const FFN: usize = 64;
const VOCAB: usize = 64;

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// llama.cpp's `permute`: within each head, row c·(d/2)+j moves to row 2j+c.
fn permute_rows(w: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let rows = w.len() / cols;
    let hd = rows / heads;
    let mut out = vec![0.0; w.len()];
    for h in 0..heads {
        for c in 0..2 {
            for j in 0..hd / 2 {
                let from = h * hd + c * (hd / 2) + j;
                let to = h * hd + 2 * j + c;
                out[to * cols..(to + 1) * cols].copy_from_slice(&w[from * cols..(from + 1) * cols]);
            }
        }
    }
    out
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Q8_0 rows whose values are exactly d·q, and the float values they stand for.
fn q8_matrix(rows: usize, cols: usize, rng: &mut Lcg) -> (Vec<f32>, Vec<(f32, Vec<i8>)>) {
    let mut values = Vec::new();
    let mut blocks = Vec::new();
    for _ in 0..rows * cols / 32 {
        // f16-representable scales so that d·q is exactly what the GGUF block holds.
        let d = half::f16::from_f32(0.002 + 0.002 * rng.next().abs()).to_f32();
        let q: Vec<i8> = (0..32).map(|_| (rng.next() * 127.0) as i8).collect();
        values.extend(q.iter().map(|&x| d * x as f32));
        blocks.push((d, q));
    }
    (values, blocks)
}

fn q8_bytes(blocks: &[(f32, Vec<i8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (d, q) in blocks {
        out.extend(half::f16::from_f32(*d).to_le_bytes());
        out.extend(q.iter().map(|&x| x as u8));
    }
    out
}

/// Rows of `blocks` reordered like `permute_rows` (each row is `cols/32` whole blocks).
fn permute_blocks(blocks: &[(f32, Vec<i8>)], heads: usize, cols: usize) -> Vec<(f32, Vec<i8>)> {
    let per_row = cols / 32;
    let rows = blocks.len() / per_row;
    let index: Vec<f32> = (0..rows).map(|r| r as f32).collect();
    let order = permute_rows(&index, heads, 1);
    order.iter().flat_map(|&r| blocks[r as usize * per_row..(r as usize + 1) * per_row].to_vec()).collect()
}

/// Writes the same random one-layer Llama as an HF directory and as a GGUF file.
fn build(dir: &Path) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let mut rng = Lcg(42);
    let mut matrix = |rows: usize, cols: usize, scale: f32| -> Vec<f32> { (0..rows * cols).map(|_| rng.next() * scale).collect() };
    let embed = matrix(VOCAB, HIDDEN, 0.5);
    let k = matrix(KV_HEADS * HEAD_DIM, HIDDEN, 0.3);
    let v = matrix(KV_HEADS * HEAD_DIM, HIDDEN, 0.3);
    let o = matrix(HIDDEN, HEADS * HEAD_DIM, 0.2);
    let gate = matrix(FFN, HIDDEN, 0.2);
    let up = matrix(FFN, HIDDEN, 0.2);
    let down = matrix(HIDDEN, FFN, 0.2);
    let head = matrix(VOCAB, HIDDEN, 0.3);
    let norm: Vec<f32> = matrix(1, HIDDEN, 0.1).iter().map(|x| 1.0 + x).collect();
    let mut rng = Lcg(7);
    let (q, q_blocks) = q8_matrix(HEADS * HEAD_DIM, HIDDEN, &mut rng);

    // HF directory.
    let hf = dir.join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    let named: Vec<(&str, Vec<usize>, &Vec<f32>)> = vec![
        ("model.embed_tokens.weight", vec![VOCAB, HIDDEN], &embed),
        ("model.layers.0.self_attn.q_proj.weight", vec![HEADS * HEAD_DIM, HIDDEN], &q),
        ("model.layers.0.self_attn.k_proj.weight", vec![KV_HEADS * HEAD_DIM, HIDDEN], &k),
        ("model.layers.0.self_attn.v_proj.weight", vec![KV_HEADS * HEAD_DIM, HIDDEN], &v),
        ("model.layers.0.self_attn.o_proj.weight", vec![HIDDEN, HEADS * HEAD_DIM], &o),
        ("model.layers.0.mlp.gate_proj.weight", vec![FFN, HIDDEN], &gate),
        ("model.layers.0.mlp.up_proj.weight", vec![FFN, HIDDEN], &up),
        ("model.layers.0.mlp.down_proj.weight", vec![HIDDEN, FFN], &down),
        ("model.layers.0.input_layernorm.weight", vec![HIDDEN], &norm),
        ("model.layers.0.post_attention_layernorm.weight", vec![HIDDEN], &norm),
        ("model.norm.weight", vec![HIDDEN], &norm),
        ("lm_head.weight", vec![VOCAB, HIDDEN], &head),
    ];
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = named.iter().map(|(n, s, d)| (n.to_string(), s.clone(), f32_bytes(d))).collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = bytes
        .iter()
        .map(|(n, s, b)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(hf.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    let config = serde_json::json!({
        "model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": 1,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "vocab_size": VOCAB,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": false,
    });
    std::fs::write(hf.join("config.json"), config.to_string()).unwrap();

    // GGUF: ggml dims reversed, q (Q8_0) and k rows permuted.
    let dims = |rows: usize, cols: usize| vec![cols as u64, rows as u64];
    let tensors = vec![
        ("token_embd.weight".to_string(), dims(VOCAB, HIDDEN), 0, f32_bytes(&embed)),
        ("blk.0.attn_q.weight".into(), dims(HEADS * HEAD_DIM, HIDDEN), 8, q8_bytes(&permute_blocks(&q_blocks, HEADS, HIDDEN))),
        ("blk.0.attn_k.weight".into(), dims(KV_HEADS * HEAD_DIM, HIDDEN), 0, f32_bytes(&permute_rows(&k, KV_HEADS, HIDDEN))),
        ("blk.0.attn_v.weight".into(), dims(KV_HEADS * HEAD_DIM, HIDDEN), 0, f32_bytes(&v)),
        ("blk.0.attn_output.weight".into(), dims(HIDDEN, HEADS * HEAD_DIM), 0, f32_bytes(&o)),
        ("blk.0.ffn_gate.weight".into(), dims(FFN, HIDDEN), 0, f32_bytes(&gate)),
        ("blk.0.ffn_up.weight".into(), dims(FFN, HIDDEN), 0, f32_bytes(&up)),
        ("blk.0.ffn_down.weight".into(), dims(HIDDEN, FFN), 0, f32_bytes(&down)),
        ("blk.0.attn_norm.weight".into(), vec![HIDDEN as u64], 0, f32_bytes(&norm)),
        ("blk.0.ffn_norm.weight".into(), vec![HIDDEN as u64], 0, f32_bytes(&norm)),
        ("output_norm.weight".into(), vec![HIDDEN as u64], 0, f32_bytes(&norm)),
        ("output.weight".into(), dims(VOCAB, HIDDEN), 0, f32_bytes(&head)),
    ];
    let gguf = dir.join("tiny.gguf");
    std::fs::write(&gguf, gguf_bytes(&llama_meta("llama"), &tensors)).unwrap();
    (hf, gguf)
}

fn llama_meta(arch: &'static str) -> Vec<(&'static str, Meta)> {
    let key = |k: &str| -> &'static str { Box::leak(format!("{arch}.{k}").into_boxed_str()) };
    vec![
        ("general.architecture", Meta::Str(arch)),
        (key("block_count"), Meta::U32(1)),
        (key("context_length"), Meta::U32(256)),
        (key("embedding_length"), Meta::U32(HIDDEN as u32)),
        (key("feed_forward_length"), Meta::U32(FFN as u32)),
        (key("attention.head_count"), Meta::U32(HEADS as u32)),
        (key("attention.head_count_kv"), Meta::U32(KV_HEADS as u32)),
        (key("attention.layer_norm_rms_epsilon"), Meta::F32(1e-5)),
        (key("rope.freq_base"), Meta::F32(10000.0)),
    ]
}

fn logits(path: &Path) -> Vec<f32> {
    let model = sala::models::load(path, None).unwrap();
    let ids: Vec<i32> = (0..24).map(|i| (i * 37 + 5) % VOCAB as i32).collect();
    let input = Array::from_slice(&ids, &[1, ids.len() as i32]);
    to_vec_f32(&model.forward(&input, &mut model.new_cache(), Logits::All, None).unwrap()).unwrap()
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sala-gguf-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn gguf_with_permuted_rows_matches_its_hf_checkpoint() {
    let d = dir("match");
    let (hf, gguf) = build(&d);
    let (a, b) = (logits(&hf), logits(&gguf));
    let diff = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
    assert!(diff < 1e-4, "GGUF vs HF logits differ by {diff}");
    let spread = a.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    assert!(spread > 0.5, "logits too flat ({spread}) for the comparison to mean anything");
    std::fs::remove_dir_all(d).unwrap();
}

fn load_err(path: &Path) -> Error {
    sala::models::load(path, None).err().expect("must fail")
}

#[test]
fn damaged_gguf_files_give_typed_errors() {
    let d = dir("damaged");
    let (_, gguf) = build(&d);
    let bytes = std::fs::read(&gguf).unwrap();
    let write = |name: &str, data: &[u8]| {
        let p = d.join(name);
        std::fs::write(&p, data).unwrap();
        p
    };

    // Cut in the tensor data, and cut in the header.
    for (name, len) in [("data.gguf", bytes.len() - 100), ("header.gguf", 200)] {
        let e = load_err(&write(name, &bytes[..len]));
        assert!(matches!(e, Error::BadWeights { .. }) && e.to_string().contains("truncated"), "{name}: {e}");
    }
    // Wrong magic in a .gguf file.
    let mut bad = bytes.clone();
    bad[..4].copy_from_slice(b"GGML");
    let e = load_err(&write("magic.gguf", &bad));
    assert!(e.to_string().contains("not a GGUF file"), "{e}");
    // A metadata count that cannot fit.
    let mut bad = bytes.clone();
    bad[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = load_err(&write("count.gguf", &bad));
    assert!(e.to_string().contains("cannot fit"), "{e}");

    // An architecture we do not run, and a tensor type we do not read.
    let mut meta = llama_meta("llama");
    meta[0] = ("general.architecture", Meta::Str("mamba"));
    let e = load_err(&write("arch.gguf", &gguf_bytes(&meta, &[])));
    assert!(matches!(e, Error::UnsupportedModel { .. }) && e.to_string().contains("llama, qwen2, qwen3"), "{e}");
    let embed = ("token_embd.weight".to_string(), vec![HIDDEN as u64, VOCAB as u64], 0u32, vec![0u8; HIDDEN * VOCAB * 4]);
    let iq2 = vec![embed.clone(), ("blk.0.attn_q.weight".to_string(), vec![256u64, 1], 16u32, vec![0u8; 66])];
    let e = load_err(&write("iq2.gguf", &gguf_bytes(&llama_meta("llama"), &iq2)));
    assert!(e.to_string().contains("IQ type 16 is not supported"), "{e}");
    // A missing hyperparameter is named.
    let mut meta = llama_meta("llama");
    meta.retain(|(k, _)| *k != "llama.feed_forward_length");
    let e = load_err(&write("key.gguf", &gguf_bytes(&meta, &[embed])));
    assert!(e.to_string().contains("llama.feed_forward_length"), "{e}");
    std::fs::remove_dir_all(d).unwrap();
}

/// Every block type we read, on random blocks, against gguf-py's dequantizers (PyPI `gguf`, the
/// llama.cpp project's own Python reference).
#[test]
fn block_types_match_gguf_py() {
    let python = common::venv_python("gguf-venv", "SALA_GGUF_PYTHON", "gguf", &["gguf==0.19.0"]);
    let d = dir("kquants");
    std::fs::create_dir_all(&d).unwrap();
    let mut rng = Lcg(99);
    // (ggml type id, block bytes, offsets of f16 scale fields), 8 blocks of 256 weights per row.
    let types: [(u32, usize, &[usize], GgmlType); 8] = [
        (8, 34, &[0], GgmlType::Q8_0),
        (2, 18, &[0], GgmlType::Q4_0),
        (3, 20, &[0, 2], GgmlType::Q4_1),
        (10, 84, &[80, 82], GgmlType::Q2K),
        (11, 110, &[108], GgmlType::Q3K),
        (12, 144, &[0, 2], GgmlType::Q4K),
        (13, 176, &[0, 2], GgmlType::Q5K),
        (14, 210, &[208], GgmlType::Q6K),
    ];
    let (rows, cols) = (2usize, 512usize);
    for (id, size, halves, kind) in types {
        let per_block = if size == 34 || size == 18 || size == 20 { 32 } else { 256 };
        let n_blocks = rows * cols / per_block;
        let mut bytes: Vec<u8> = (0..n_blocks * size).map(|_| (rng.next().abs() * 256.0) as u8).collect();
        for b in 0..n_blocks {
            for &at in halves {
                let v = half::f16::from_f32(0.01 + 0.05 * rng.next().abs());
                bytes[b * size + at..b * size + at + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        let input = d.join(format!("{id}.bin"));
        let output = d.join(format!("{id}.f32"));
        std::fs::write(&input, &bytes).unwrap();
        let script = format!(
            "import numpy as np, sys\nfrom gguf import quants, GGMLQuantizationType as T\n\
             data = np.fromfile(sys.argv[1], dtype=np.uint8).reshape({rows}, -1)\n\
             quants.dequantize(data, T({id})).astype(np.float32).tofile(sys.argv[2])\n"
        );
        let out = std::process::Command::new(&python).arg("-c").arg(script).arg(&input).arg(&output).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let want: Vec<f32> = std::fs::read(&output).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        let got = match convert_bytes(&bytes, kind, &[rows as i32, cols as i32]).unwrap() {
            // In f32: MLX dequantizes in the scales' dtype, and f16 would round d·code + bias.
            Converted::Quantized(mut q) => {
                q.scales = q.scales.as_dtype(mlx_rs::Dtype::Float32).unwrap();
                q.biases = q.biases.as_dtype(mlx_rs::Dtype::Float32).unwrap();
                to_vec_f32(&q.dequantize().unwrap()).unwrap()
            }
            Converted::Float(a) => to_vec_f32(&a).unwrap(),
        };
        assert_eq!(got.len(), want.len(), "{kind:?}");
        // Exact for the affine types (f32/f16 arithmetic of the same products); Q2_K/Q3_K/Q6_K are
        // expanded to f16, so within f16 rounding.
        let tolerance = |w: f32| if matches!(kind, GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q6K) { w.abs() * 1e-3 + 1e-6 } else { w.abs() * 1e-6 + 1e-7 };
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= tolerance(*w), "{kind:?}: weight {i} is {g}, gguf-py says {w}");
        }
    }
    std::fs::remove_dir_all(d).unwrap();
}

/// Issue 28's crafted files: sizes that overflow, an offset that wraps, a metadata array far
/// larger in memory than on disk. Each was a crash or a huge allocation; each is now refused.
#[test]
fn hostile_gguf_files_are_refused_not_crashed() {
    let d = dir("hostile");
    std::fs::create_dir_all(&d).unwrap();
    let write = |name: &str, data: &[u8]| {
        let p = d.join(name);
        std::fs::write(&p, data).unwrap();
        p
    };
    // Dimensions whose element count overflows u64 (the size became 0 and an empty buffer
    // reached MLX with an i32-truncated shape: a segfault).
    let embed = ("token_embd.weight".to_string(), vec![(1u64 << 32) + 576, (1u64 << 32) + 49152], 0u32, vec![0u8; 64]);
    let e = load_err(&write("dims.gguf", &gguf_bytes(&llama_meta("llama"), &[embed])));
    assert!(matches!(e, Error::BadWeights { .. }) && e.to_string().contains("outside 1..2^31"), "{e}");
    // One dimension fine, their product past what a tensor can hold.
    let embed = ("token_embd.weight".to_string(), vec![1 << 30, 1 << 30, 1 << 30], 0u32, vec![0u8; 64]);
    let e = load_err(&write("rows.gguf", &gguf_bytes(&llama_meta("llama"), &[embed])));
    assert!(e.to_string().contains("outside 1..2^31"), "{e}");

    // A tensor offset of 2^64 - 64 wrapped into the header and was accepted.
    let embed = ("token_embd.weight".to_string(), vec![HIDDEN as u64, VOCAB as u64], 0u32, vec![0u8; HIDDEN * VOCAB * 4]);
    let mut bytes = gguf_bytes(&llama_meta("llama"), &[embed]);
    let name_at = bytes.windows(17).position(|w| w == b"token_embd.weight").unwrap();
    let offset_at = name_at + 17 + 4 + 2 * 8 + 4;
    bytes[offset_at..offset_at + 8].copy_from_slice(&(u64::MAX - 63).to_le_bytes());
    let e = load_err(&write("offset.gguf", &bytes));
    assert!(matches!(e, Error::BadWeights { .. }) && e.to_string().contains("truncated"), "{e}");

    // A 16M-entry u8 array: 16 MB on disk, ~540 MB as metadata values.
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    bytes.extend(1u64.to_le_bytes());
    let key = b"tokenizer.ggml.token_type";
    bytes.extend((key.len() as u64).to_le_bytes());
    bytes.extend(key);
    bytes.extend(9u32.to_le_bytes());
    bytes.extend(0u32.to_le_bytes());
    let n = 16u64 << 20;
    bytes.extend(n.to_le_bytes());
    bytes.resize(bytes.len() + n as usize, 1);
    let e = load_err(&write("metadata.gguf", &bytes));
    assert!(e.to_string().contains("MiB of memory"), "{e}");

    // A zero head count divided the q rows (a panic).
    let mut meta = llama_meta("llama");
    meta[5] = ("llama.attention.head_count", Meta::U32(0));
    let embed = ("token_embd.weight".to_string(), vec![HIDDEN as u64, VOCAB as u64], 0u32, vec![0u8; HIDDEN * VOCAB * 4]);
    let e = load_err(&write("heads.gguf", &gguf_bytes(&meta, &[embed])));
    assert!(e.to_string().contains("head_count is 0"), "{e}");
    // Converting bytes that do not make the shape is refused before MLX sees them.
    assert!(convert_bytes(&[0u8; 8], GgmlType::F32, &[4, 4]).is_err());
    assert!(convert_bytes(&[0u8; 34], GgmlType::Q8_0, &[0, 32]).is_err());
    std::fs::remove_dir_all(d).unwrap();
}
