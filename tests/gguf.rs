//! GGUF import on hand-built files: a tiny Llama written the way llama.cpp's converter writes it
//! (q/k rows permuted, ggml dimension order, one Q8_0 matrix) must give the same logits as the
//! HF-layout checkpoint it came from; damaged files must give typed errors; every block type must
//! dequantize as gguf-py does; SmolLM2 in each llama.cpp preset mix must give the greedy tokens
//! of its gguf-py-dequantized self.

mod common;

use common::gguf_file::{gguf_bytes, Meta};
use common::Lcg;
use mlx_rs::Array;
use sala::engine::error::Error;
use sala::engine::generate::{generate, Flow, GenerateOptions};
use sala::engine::gguf::{convert_bytes, Converted, GgmlType, GgufFile};
use sala::engine::model::{LanguageModel, Logits};
use sala::engine::sampler::{Sampler, SamplingParams};
use sala::engine::tokenizer::Message;
use sala::engine::ops::to_vec_f32;
use std::path::{Path, PathBuf};

const HIDDEN: usize = 32;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 8;
const FFN: usize = 64;
const VOCAB: usize = 64;

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
        let d = half::f16::from_f32(0.002 + 0.002 * rng.next_signed().abs()).to_f32();
        let q: Vec<i8> = (0..32).map(|_| (rng.next_signed() * 127.0) as i8).collect();
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
    let mut matrix = |rows: usize, cols: usize, scale: f32| -> Vec<f32> { (0..rows * cols).map(|_| rng.next_signed() * scale).collect() };
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
    let message = e.to_string();
    assert!(message.contains("IQ2_XXS (1 tensor, e.g. `blk.0.attn_q.weight`) is not supported") && message.contains("IQ4_XS") && message.contains("re-quantize"), "{e}");
    // A missing hyperparameter is named.
    let mut meta = llama_meta("llama");
    meta.retain(|(k, _)| *k != "llama.feed_forward_length");
    let e = load_err(&write("key.gguf", &gguf_bytes(&meta, &[embed])));
    assert!(e.to_string().contains("llama.feed_forward_length"), "{e}");
    std::fs::remove_dir_all(d).unwrap();
}

/// The PyPI `gguf` package (gguf-py, the llama.cpp project's own Python reader and writer).
fn gguf_python() -> PathBuf {
    common::venv_python("gguf-venv", "SALA_GGUF_PYTHON", "gguf", &["gguf==0.19.0"])
}

/// Every block type we read, on random blocks, against gguf-py's dequantizers: the affine types
/// bit for bit (MLX's own dequantize of our packing, 5-bit included), the expanded ones within f16
/// rounding.
#[test]
fn block_types_match_gguf_py() {
    let python = gguf_python();
    let d = dir("kquants");
    std::fs::create_dir_all(&d).unwrap();
    let mut rng = Lcg(99);
    // (type, weights per block, block bytes, offsets of f16 scale fields, bits kept or None when
    // expanded), 2 rows of 512 weights.
    type Case = (GgmlType, usize, usize, &'static [usize], Option<i32>);
    let types: [Case; 12] = [
        (GgmlType::Q8_0, 32, 34, &[0], Some(8)),
        (GgmlType::Q4_0, 32, 18, &[0], Some(4)),
        (GgmlType::Q4_1, 32, 20, &[0, 2], Some(4)),
        (GgmlType::Q5_0, 32, 22, &[0], Some(5)),
        (GgmlType::Q5_1, 32, 24, &[0, 2], Some(5)),
        (GgmlType::Iq4Nl, 32, 18, &[0], Some(8)),
        (GgmlType::Q2K, 256, 84, &[80, 82], None),
        (GgmlType::Q3K, 256, 110, &[108], Some(8)),
        (GgmlType::Q4K, 256, 144, &[0, 2], Some(4)),
        (GgmlType::Q5K, 256, 176, &[0, 2], Some(5)),
        (GgmlType::Q6K, 256, 210, &[208], None),
        (GgmlType::Iq4Xs, 256, 136, &[0], Some(8)),
    ];
    let (rows, cols) = (2usize, 512usize);
    for (kind, per_block, size, halves, bits) in types {
        let n_blocks = rows * cols / per_block;
        let mut bytes: Vec<u8> = (0..n_blocks * size).map(|_| (rng.next_signed().abs() * 256.0) as u8).collect();
        for b in 0..n_blocks {
            for &at in halves {
                // Both signs: Q4_1/Q5_1 minimums are negative, and a negative d is valid.
                let v = half::f16::from_f32((0.01 + 0.05 * rng.next_signed().abs()) * rng.next_signed().signum());
                bytes[b * size + at..b * size + at + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        let id = kind.id();
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
        let got = match (convert_bytes(&bytes, kind, &[rows as i32, cols as i32]).unwrap(), bits) {
            // In f32: MLX dequantizes in the scales' dtype, and f16 would round d·code + bias.
            (Converted::Quantized(mut q), Some(bits)) => {
                assert_eq!((q.format.bits, q.format.group_size), (bits, 32), "{kind:?}");
                q.scales = q.scales.as_dtype(mlx_rs::Dtype::Float32).unwrap();
                q.biases = q.biases.as_dtype(mlx_rs::Dtype::Float32).unwrap();
                to_vec_f32(&q.dequantize().unwrap()).unwrap()
            }
            (Converted::Float(a), None) => {
                assert_eq!(a.dtype(), mlx_rs::Dtype::Float16, "{kind:?} is expanded to f16");
                to_vec_f32(&a).unwrap()
            }
            (_, bits) => panic!("{kind:?}: expected {}", bits.map_or("an expansion".into(), |b| format!("{b}-bit quantization"))),
        };
        assert_eq!(got.len(), want.len(), "{kind:?}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let tolerance = if bits.is_some() { 0.0 } else { w.abs() * 1e-3 + 1e-6 };
            assert!((g - w).abs() <= tolerance, "{kind:?}: weight {i} is {g}, gguf-py says {w}");
        }
    }
    std::fs::remove_dir_all(d).unwrap();
}

fn greedy(model: &dyn LanguageModel, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut cache = model.new_cache();
    let mut sampler = Sampler::new(SamplingParams { temperature: 0.0, ..Default::default() });
    let opts = GenerateOptions { max_tokens: n, ignore_eos: true, ..Default::default() };
    generate(model, &mut cache, prompt, &mut sampler, &opts, |_, _| {}, |_| Flow::Continue).unwrap().tokens
}

/// SmolLM2's weights written by `tests/reference/gguf_presets.py` in `preset`'s mix (llama.cpp's
/// per-tensor rules; on SmolLM2's 576-column matrices Q5_0/Q5_1/Q8_0 stand in for K-quants, as
/// llama.cpp does) must hold exactly `want_types`, give the greedy tokens of the same file
/// dequantized by gguf-py to F32, and `sala show` must list each type with its count and storage.
fn check_preset(preset: &str, want_types: &[&str]) {
    let python = gguf_python();
    let source = common::smollm2_gguf();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/gguf_presets.py");
    let d = dir(&format!("preset-{preset}"));
    std::fs::create_dir_all(&d).unwrap();
    let out = std::process::Command::new(&python).arg(&script).arg(&source).arg(&d).arg(preset).output().unwrap();
    assert!(out.status.success(), "{preset}: {}", String::from_utf8_lossy(&out.stderr));
    let written: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (quantized, reference) = (d.join(format!("{preset}.gguf")), d.join(format!("{preset}.f32.gguf")));
    // Meanwhile `sala show` reads the file in its own process.
    let show = std::process::Command::new(env!("CARGO_BIN_EXE_sala"))
        .arg("show")
        .arg(&quantized)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();

    // The types gguf-py wrote are the ones llama.cpp's rules give, and sala reads them so.
    let mut written: Vec<(String, usize)> =
        written["types"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap() as usize)).collect();
    written.sort();
    let mut names: Vec<&str> = written.iter().map(|(k, _)| k.as_str()).collect();
    let mut want_types = want_types.to_vec();
    names.sort();
    want_types.sort();
    assert_eq!(names, want_types, "{preset}: tensor types written");
    let mut read: Vec<(String, usize)> = GgufFile::open(&quantized).unwrap().type_counts().iter().map(|(k, n)| (k.name(), *n)).collect();
    read.sort();
    assert_eq!(read, written, "{preset}: tensor types as sala reads them");

    // Quantized (kept in MLX's layout or expanded) vs the f32 reference, on the CPU in f32.
    let (model, tokenizer) = sala::models::load_with_tokenizer(&quantized, Some(mlx_rs::Dtype::Float32)).unwrap();
    let tokenizer = tokenizer.unwrap();
    let reference_model = sala::models::load(&reference, Some(mlx_rs::Dtype::Float32)).unwrap();
    let chat = tokenizer.apply_chat_template(&[Message::new("user", "What is the capital of France?")], true).unwrap();
    // Types kept quantized are exact, so only summation order differs; f16 expansion rounds.
    let expanded = written.iter().any(|(t, _)| t == "Q2_K" || t == "Q6_K");
    let logit_tolerance = if expanded { 0.05 } else { 1e-3 };
    for prompt in [tokenizer.encode(&chat).unwrap(), tokenizer.encode("The three primary colours are").unwrap()] {
        let text = tokenizer.decode(&prompt).unwrap();
        let input = Array::from_slice(&prompt.iter().map(|&i| i as i32).collect::<Vec<_>>(), &[1, prompt.len() as i32]);
        let logits = |m: &dyn LanguageModel| to_vec_f32(&m.forward(&input, &mut m.new_cache(), Logits::Last, None).unwrap()).unwrap();
        let (got, want) = (logits(model.as_ref()), logits(reference_model.as_ref()));
        let diff = got.iter().zip(&want).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
        assert!(diff <= logit_tolerance, "{preset}: first-step logits of {text:?} differ by {diff}");
        let got = greedy(model.as_ref(), &prompt, 20);
        let want = greedy(reference_model.as_ref(), &prompt, 20);
        assert_eq!(got, want, "{preset}: greedy tokens of {text:?}");
    }
    drop((model, reference_model));

    // `sala show` lists each type with its count and what was done with it.
    let show = show.wait_with_output().unwrap();
    assert!(show.status.success(), "{}", String::from_utf8_lossy(&show.stderr));
    let text = String::from_utf8(show.stdout).unwrap();
    for (name, n) in &written {
        let line = text.lines().find(|l| l.contains(&format!(" {name} ×{n}: "))).unwrap_or_else(|| panic!("{preset}: no {name} ×{n} in\n{text}"));
        let how = match name.as_str() {
            "F32" => "loaded as stored",
            "Q2_K" | "Q6_K" => "expanded to f16 (scales",
            "Q8_0" | "Q3_K" | "IQ4_NL" | "IQ4_XS" => "kept as 8-bit affine, group 32",
            "Q5_0" | "Q5_1" | "Q5_K" => "kept as 5-bit affine, group 32",
            _ => "kept as 4-bit affine, group 32",
        };
        assert!(line.contains(how), "{preset}: {name} should be {how}: {line}");
    }
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn preset_q4_k_m_gives_the_greedy_tokens_of_its_dequantized_reference() {
    check_preset("Q4_K_M", &["F32", "Q5_0", "Q8_0", "Q4_K", "Q6_K"]);
}

#[test]
fn preset_q5_k_m_gives_the_greedy_tokens_of_its_dequantized_reference() {
    check_preset("Q5_K_M", &["F32", "Q5_1", "Q8_0", "Q5_K", "Q6_K"]);
}

#[test]
fn preset_q6_k_gives_the_greedy_tokens_of_its_dequantized_reference() {
    check_preset("Q6_K", &["F32", "Q8_0", "Q6_K"]);
}

#[test]
fn preset_q8_0_gives_the_greedy_tokens_of_its_dequantized_reference() {
    check_preset("Q8_0", &["F32", "Q8_0"]);
}

#[test]
fn preset_q4_0_gives_the_greedy_tokens_of_its_dequantized_reference() {
    check_preset("Q4_0", &["F32", "Q4_0", "Q8_0"]);
}

/// Not a llama.cpp preset: Q2_K, Q3_K and IQ4_XS by layer on the 1536-column ffn_down, Q4_1 and
/// IQ4_NL on the 576-column matrices, so every remaining type runs in a whole model.
#[test]
fn mix_of_the_remaining_types_gives_the_greedy_tokens_of_its_dequantized_reference() {
    check_preset("MIX", &["F32", "Q4_1", "Q8_0", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"]);
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
