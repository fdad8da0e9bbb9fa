//! Bounded fuzzing of every reader of untrusted bytes (issue 28): safetensors headers, GGUF
//! headers and tensor tables (then the import), `.sala` files (metadata, config, tokenizer, then
//! the model built and run), config.json, the chat request (parsed, templated, tokenized), and
//! prompt-cache state files (opened, read into the model's cache, and read by a server's start).
//!
//! Each target mutates valid seeds — bytes flipped, cut, inserted, integers overwritten with
//! edge values, and JSON nodes replaced by values of the wrong type or size — for
//! `SALA_FUZZ_SECONDS` (default 20) and requires, for every input: no panic (the input is saved
//! under target/fuzz-failures/ and the test fails), and no more than [`HEAP_BOUND`] of heap held
//! at once while it is read (a counting allocator, per thread). `SALA_FUZZ_SEED` replays a run.
//! Each target prints how many inputs ran and how many were accepted as valid.

mod common;

use common::gguf_file::{gguf_bytes, Meta};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashMap;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Heap one input may hold at once while it is read: the inputs are a few KB to a few MB.
const HEAP_BOUND: isize = 256 << 20;

struct CountingAllocator;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is forwarded to the system allocator unchanged; only sizes are counted.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        note(-(layout.size() as isize));
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Runs `read` on mutations of `seeds` until the time is up; `read` returns whether the input
/// was accepted.
fn fuzz(target: &str, seeds: &[Vec<u8>], mutate: impl Fn(&[u8], &mut StdRng) -> Vec<u8>, read: impl Fn(&[u8]) -> bool) {
    let seconds: f64 = std::env::var("SALA_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20.0);
    let seed: u64 = std::env::var("SALA_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let (mut inputs, mut accepted, mut largest) = (0u64, 0u64, 0isize);
    // The seeds themselves must be accepted, or the mutations test nothing.
    for s in seeds {
        assert!(read(s), "{target}: a seed is refused");
    }
    while Instant::now() < deadline {
        let input = mutate(&seeds[rng.random_range(0..seeds.len())], &mut rng);
        let base = LIVE.with(Cell::get);
        PEAK.with(|p| p.set(base));
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| read(&input)));
        let held = PEAK.with(Cell::get) - base;
        largest = largest.max(held);
        inputs += 1;
        match outcome {
            Ok(ok) => accepted += ok as u64,
            Err(_) => panic!("{target}: input {inputs} (seed {seed}) panicked; saved as {}", save(target, inputs, &input).display()),
        }
        assert!(
            held <= HEAP_BOUND,
            "{target}: input {inputs} (seed {seed}) held {held} bytes of heap; saved as {}",
            save(target, inputs, &input).display()
        );
    }
    println!("fuzz {target}: {inputs} inputs in {seconds} s ({accepted} accepted), most heap held {largest} bytes, seed {seed}");
    assert!(inputs > 0);
}

fn save(target: &str, n: u64, input: &[u8]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{target}-{n}.bin"));
    std::fs::write(&path, input).unwrap();
    path
}

/// A scratch file for readers that take a path.
fn scratch(target: &str) -> PathBuf {
    std::env::temp_dir().join(format!("sala-fuzz-{}-{target}", std::process::id()))
}

const EDGE_INTS: &[u64] = &[
    0,
    1,
    2,
    7,
    255,
    65535,
    (1 << 31) - 1,
    1 << 31,
    (1 << 32) - 1,
    1 << 32,
    (1 << 32) + 576,
    (1 << 32) + 49152,
    1 << 53,
    1 << 62,
    (1 << 63) - 1,
    1 << 63,
    u64::MAX - 63,
    u64::MAX,
];

fn edge_int(rng: &mut StdRng) -> u64 {
    if rng.random_range(0..4) == 0 {
        rng.random::<u64>() >> rng.random_range(0..64)
    } else {
        EDGE_INTS[rng.random_range(0..EDGE_INTS.len())]
    }
}

/// Byte-level damage: flipped bits, random bytes, little-endian integers overwritten with edge
/// values (at aligned places, where headers keep them, or anywhere), cuts, insertions, deletions.
fn mutate_bytes(data: &[u8], rng: &mut StdRng) -> Vec<u8> {
    let mut b = data.to_vec();
    for _ in 0..rng.random_range(1..5) {
        let len = b.len();
        if len == 0 {
            b.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..len);
        match rng.random_range(0..7) {
            0 => b[at] ^= 1 << rng.random_range(0..8),
            1 => b[at] = rng.random(),
            2 | 3 => {
                let width = if rng.random() { 8 } else { 4 };
                let at = if rng.random() { at / width * width } else { at };
                let v = edge_int(rng).to_le_bytes();
                for (i, byte) in v[..width].iter().enumerate() {
                    if at + i < len {
                        b[at + i] = *byte;
                    }
                }
            }
            4 => b.truncate(at),
            5 => {
                let n = rng.random_range(1..64);
                let bytes: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                b.splice(at..at, bytes);
            }
            _ => {
                let end = (at + rng.random_range(1..64)).min(len);
                b.drain(at..end);
            }
        }
    }
    b
}

fn edge_json(rng: &mut StdRng) -> Value {
    match rng.random_range(0..14) {
        0 => json!(edge_int(rng)),
        1 => json!(-((edge_int(rng) >> 1) as i64)),
        2 => json!([1e308, -1e308, 0.5, -0.0, 1e-300][rng.random_range(0..5)]),
        3 => Value::Null,
        4 => json!(rng.random::<bool>()),
        5 => json!(""),
        6 => json!("x".repeat(rng.random_range(1..5000))),
        7 => json!([]),
        8 => json!({}),
        9 => json!(["a", 1, null]),
        10 => json!([edge_int(rng), edge_int(rng)]),
        11 => json!({"type": "function", "function": {"name": "f"}}),
        12 => json!("../../x"),
        _ => json!(std::iter::repeat_n(json!(0), rng.random_range(1..2000)).collect::<Vec<_>>()),
    }
}

/// Every node of `v`, as JSON pointers.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                pointers(child, format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate().take(64) {
                pointers(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

/// Structure-aware damage: a few nodes replaced by edge values, removed, or given a new key.
fn mutate_json(v: &Value, rng: &mut StdRng) -> Value {
    let mut v = v.clone();
    for _ in 0..rng.random_range(1..4) {
        let mut all = Vec::new();
        pointers(&v, String::new(), &mut all);
        let at = all[rng.random_range(0..all.len())].clone();
        let action = rng.random_range(0..6);
        let Some(node) = v.pointer_mut(&at) else { continue };
        match (action, node) {
            (0, Value::Object(map)) if !map.is_empty() => {
                let key = map.keys().nth(rng.random_range(0..map.len())).cloned().unwrap_or_default();
                map.remove(&key);
            }
            (1, Value::Object(map)) => {
                map.insert(["model", "messages", "tools", "n", "sala.file.x", "quantization"][rng.random_range(0..6)].into(), edge_json(rng));
            }
            (2, Value::Array(items)) if !items.is_empty() => {
                items.remove(rng.random_range(0..items.len()));
            }
            (3, Value::Array(items)) if !items.is_empty() => {
                let copy = items[rng.random_range(0..items.len())].clone();
                items.push(copy);
            }
            (_, node) => *node = edge_json(rng),
        }
    }
    v
}

/// Mutates JSON text structurally most of the time, as bytes sometimes.
fn mutate_json_text(data: &[u8], rng: &mut StdRng) -> Vec<u8> {
    match serde_json::from_slice::<Value>(data) {
        Ok(v) if rng.random_range(0..4) != 0 => mutate_json(&v, rng).to_string().into_bytes(),
        _ => mutate_bytes(data, rng),
    }
}

fn golden_config() -> Value {
    serde_json::from_str(&std::fs::read_to_string(common::golden("A_dense_f32").join("config.json")).unwrap()).unwrap()
}

fn llama_config() -> Value {
    json!({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096, "rope_theta": 10000.0, "tie_word_embeddings": false,
        "bos_token_id": 1, "eos_token_id": [2],
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 1024},
        "quantization": {"group_size": 64, "bits": 4, "model.layers.0.mlp.down_proj": false},
    })
}

#[test]
fn fuzz_config_json() {
    let mut yarn = llama_config();
    yarn["model_type"] = json!("qwen3");
    yarn["rope_scaling"] = json!({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024});
    let mut longrope = llama_config();
    longrope["model_type"] = json!("minicpm");
    longrope["scale_emb"] = json!(12);
    longrope["scale_depth"] = json!(1.4);
    longrope["dim_model_base"] = json!(256);
    longrope["rope_scaling"] = json!({"rope_type": "longrope", "long_factor": vec![1.0; 8], "short_factor": vec![1.0; 8],
                                      "original_max_position_embeddings": 1024});
    let seeds: Vec<Vec<u8>> = [golden_config(), llama_config(), yarn, longrope].iter().map(|c| c.to_string().into_bytes()).collect();
    let path = Path::new("config.json");
    fuzz("config", &seeds, mutate_json_text, |bytes| {
        let Ok(text) = std::str::from_utf8(bytes) else { return false };
        let Ok(cfg) = sala::engine::config::ConfigFile::parse(path, text) else { return false };
        let specs = sala::models::tensor_specs(&cfg);
        let _ = sala::engine::quant::QuantConfig::from_config(&cfg);
        let _ = sala::models::cache_bytes(&cfg, usize::MAX, 4, Some(8));
        specs.is_ok() && sala::models::cache_bytes(&cfg, 4096, 2, None).is_ok()
    });
}

/// Golden case A's safetensors file split into its header (JSON) and data.
fn golden_safetensors() -> (Value, Vec<u8>) {
    let bytes = std::fs::read(common::golden("A_dense_f32").join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (serde_json::from_slice(&bytes[8..8 + n]).unwrap(), bytes[8 + n..].to_vec())
}

fn safetensors_bytes(header: &Value, data: &[u8]) -> Vec<u8> {
    let header = header.to_string();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

#[test]
fn fuzz_safetensors_header() {
    let (header, data) = golden_safetensors();
    let data_len = data.len() as u64;
    let seed = safetensors_bytes(&header, &[]);
    let path = Path::new("model.safetensors");
    let mutate = |s: &[u8], rng: &mut StdRng| {
        if rng.random_range(0..3) == 0 {
            return mutate_bytes(s, rng);
        }
        let n = u64::from_le_bytes(s[..8].try_into().unwrap()) as usize;
        let header: Value = serde_json::from_slice(&s[8..8 + n]).unwrap();
        safetensors_bytes(&mutate_json(&header, rng), &[])
    };
    // Only the header is in memory; the reader is told the file also holds the data.
    fuzz("safetensors", &[seed], mutate, |bytes| {
        let header_len = bytes.get(..8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()));
        let file_len = (bytes.len() as u64).max(header_len.saturating_add(8).saturating_add(data_len).min(bytes.len() as u64 + data_len));
        sala::engine::weights::parse_header(Cursor::new(bytes), file_len, path).is_ok()
    });
}

/// A tiny Llama as llama.cpp writes it: byte-level BPE vocabulary with merges, F32, F16, Q8_0 and
/// Q4_0 tensors.
fn gguf_seed() -> Vec<u8> {
    let (hidden, ffn, vocab) = (32usize, 64usize, 64usize);
    let tokens: Vec<String> = (0..vocab)
        .map(|i| match i {
            0..26 => ((b'a' + i as u8) as char).to_string(),
            26 => "ab".into(),
            27 => "cd".into(),
            _ => format!("t{i}"),
        })
        .collect();
    let meta = vec![
        ("general.architecture", Meta::Str("llama")),
        ("llama.block_count", Meta::U32(1)),
        ("llama.context_length", Meta::U32(256)),
        ("llama.embedding_length", Meta::U32(hidden as u32)),
        ("llama.feed_forward_length", Meta::U32(ffn as u32)),
        ("llama.attention.head_count", Meta::U32(4)),
        ("llama.attention.head_count_kv", Meta::U32(2)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
        ("llama.rope.freq_base", Meta::F32(10000.0)),
        ("tokenizer.ggml.model", Meta::Str("gpt2")),
        ("tokenizer.ggml.pre", Meta::Str("qwen2")),
        ("tokenizer.ggml.tokens", Meta::Strs(tokens)),
        ("tokenizer.ggml.token_type", Meta::I32s(vec![1; vocab])),
        ("tokenizer.ggml.merges", Meta::Strs(vec!["a b".into(), "c d".into()])),
        ("tokenizer.ggml.eos_token_id", Meta::U32(2)),
        ("tokenizer.chat_template", Meta::Str("{% for m in messages %}{{ m.content }}{% endfor %}")),
    ];
    let f32s = |n: usize| -> Vec<u8> { (0..n).flat_map(|i| ((i % 7) as f32 * 0.1).to_le_bytes()).collect() };
    let f16s = |n: usize| -> Vec<u8> { (0..n).flat_map(|i| half::f16::from_f32((i % 5) as f32 * 0.1).to_le_bytes()).collect() };
    // Q8_0: per 32 weights an f16 scale and 32 i8; Q4_0: an f16 scale and 16 bytes of nibbles.
    let q8 = |rows: usize, cols: usize| -> Vec<u8> {
        (0..rows * cols / 32).flat_map(|b| half::f16::from_f32(0.01).to_le_bytes().into_iter().chain((0..32).map(move |i| (b + i) as u8))).collect()
    };
    let q4 = |rows: usize, cols: usize| -> Vec<u8> {
        (0..rows * cols / 32).flat_map(|b| half::f16::from_f32(0.02).to_le_bytes().into_iter().chain((0..16).map(move |i| (b * 3 + i) as u8))).collect()
    };
    let t = |name: &str, dims: Vec<u64>, kind: u32, data: Vec<u8>| (name.to_string(), dims, kind, data);
    let (h, f, v) = (hidden as u64, ffn as u64, vocab as u64);
    let tensors = vec![
        t("token_embd.weight", vec![h, v], 0, f32s(hidden * vocab)),
        t("output_norm.weight", vec![h], 0, f32s(hidden)),
        t("output.weight", vec![h, v], 1, f16s(hidden * vocab)),
        t("blk.0.attn_norm.weight", vec![h], 0, f32s(hidden)),
        t("blk.0.ffn_norm.weight", vec![h], 0, f32s(hidden)),
        t("blk.0.attn_q.weight", vec![h, h], 8, q8(hidden, hidden)),
        t("blk.0.attn_k.weight", vec![h, 16], 8, q8(16, hidden)),
        t("blk.0.attn_v.weight", vec![h, 16], 0, f32s(16 * hidden)),
        t("blk.0.attn_output.weight", vec![h, h], 2, q4(hidden, hidden)),
        t("blk.0.ffn_gate.weight", vec![h, f], 2, q4(ffn, hidden)),
        t("blk.0.ffn_up.weight", vec![h, f], 8, q8(ffn, hidden)),
        t("blk.0.ffn_down.weight", vec![f, h], 1, f16s(hidden * ffn)),
    ];
    gguf_bytes(&meta, &tensors)
}

#[test]
fn fuzz_gguf() {
    let path = scratch("model.gguf");
    let read = |bytes: &[u8]| {
        if sala::engine::gguf::GgufFile::from_reader(Cursor::new(bytes), bytes.len() as u64, &path).is_err() {
            return false;
        }
        // The header reads: the import converts every tensor and builds config and tokenizer.
        std::fs::write(&path, bytes).unwrap();
        let Ok(mut source) = sala::models::gguf::import(&path) else { return false };
        let Ok(cfg) = source.config() else { return false };
        sala::models::check(&cfg, &mut source.weights).is_ok() && source.tokenizer(None).is_ok()
    };
    fuzz("gguf", &[gguf_seed()], mutate_bytes, read);
    let _ = std::fs::remove_file(path);
}

/// Golden case A as a `.sala` file, with a tokenizer and a chat template among its side files.
fn sala_file(header: &Value, data: &[u8], config: &Value, tokenizer: &Value) -> Vec<u8> {
    let mut header = header.clone();
    let mut metadata: HashMap<&str, String> = HashMap::new();
    metadata.insert("format", "sala".into());
    metadata.insert("sala.file.config.json", config.to_string());
    metadata.insert("sala.file.tokenizer.json", tokenizer.to_string());
    metadata.insert("sala.file.tokenizer_config.json", json!({"chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"}).to_string());
    if let Some(entries) = header.as_object_mut() {
        entries.insert("__metadata__".into(), json!(metadata));
    }
    safetensors_bytes(&header, data)
}

#[test]
fn fuzz_sala_file() {
    let (header, data) = golden_safetensors();
    let (config, tokenizer) = (golden_config(), common::byte_tokenizer());
    let seed = sala_file(&header, &data, &config, &tokenizer);
    let mutate = |_: &[u8], rng: &mut StdRng| -> Vec<u8> {
        match rng.random_range(0..5) {
            0 => sala_file(&header, &data, &mutate_json(&config, rng), &tokenizer),
            1 => sala_file(&header, &data, &config, &mutate_json(&tokenizer, rng)),
            2 => sala_file(&mutate_json(&header, rng), &data, &config, &tokenizer),
            3 => {
                // A side file with a name from the edge values (paths among them).
                let mut h = header.clone();
                let name = match edge_json(rng) {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                h["__metadata__"] = json!({"sala.file.config.json": config.to_string(), format!("sala.file.{name}"): "x"});
                safetensors_bytes(&h, &data)
            }
            _ => {
                // Damage inside the header only: the data is large and read as it is.
                let seed = sala_file(&header, &data, &config, &tokenizer);
                let n = 8 + u64::from_le_bytes(seed[..8].try_into().unwrap()) as usize;
                let mut head = mutate_bytes(&seed[..n], rng);
                head.extend(&seed[n..]);
                head
            }
        }
    };
    let path = scratch("model.sala");
    let read = |bytes: &[u8]| {
        std::fs::write(&path, bytes).unwrap();
        let Ok((_, mut source)) = sala::store::summary::summarize(&path, None) else { return false };
        // Accepted: the model is built and runs a step.
        let Ok(cfg) = source.config() else { return false };
        let Ok(model) = sala::models::build(&cfg, &mut source.weights, Some(mlx_rs::Dtype::Float32), &Default::default()) else { return false };
        let input = mlx_rs::Array::from_slice(&[1i32, 2, 3], &[1, 3]);
        let logits = model.forward(&input, &mut model.new_cache(), sala::engine::model::Logits::Last, None);
        let tokenizer = source.tokenizer(model.info().bos_token_id);
        // Accepted: the tokenizer renders a chat, tokenizes it and reads ids back.
        let chat = tokenizer.ok().flatten().map(|t| {
            let text = t.apply_chat_template(&[sala::engine::tokenizer::Message::new("user", "hi ünï ✓")], true)?;
            let ids = t.encode(&text)?;
            t.decode(&ids)
        });
        logits.and_then(|l| Ok(l.eval()?)).is_ok() && chat.is_some_and(|c| c.is_ok())
    };
    sala::engine::device::select(Some(sala::engine::device::DeviceKind::Cpu)).unwrap();
    fuzz("sala-file", &[seed], mutate, read);
    let _ = std::fs::remove_file(path);
}

fn minicpm_tokenizer() -> sala::engine::tokenizer::TextTokenizer {
    let files = sala::engine::tokenizer::TokenizerFiles::from_dir(&common::shared().join("assets/minicpm4-tokenizer")).unwrap().unwrap();
    sala::engine::tokenizer::TextTokenizer::new(&files, Some(1)).unwrap()
}

/// A MiniCPM model with a 4096-token context, as the request preparers see it.
fn served_by(tokenizer: &sala::engine::tokenizer::TextTokenizer) -> sala::server::openai::Served<'_> {
    sala::server::openai::Served {
        model_id: "served",
        tokenizer,
        max_context: 4096,
        vocab_size: tokenizer.vocab_size(),
        eos: &[2],
        default_max_tokens: 512,
        tool_format: sala::engine::tools::ToolFormat::MiniCpmXml,
        generation: &NO_GENERATION_DEFAULTS,
    }
}

static NO_GENERATION_DEFAULTS: sala::engine::generation_config::GenerationDefaults = sala::engine::generation_config::GenerationDefaults::NONE;

#[test]
fn fuzz_chat_request() {
    let tokenizer = minicpm_tokenizer();
    let tool = json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}});
    let seeds: Vec<Vec<u8>> = [
        json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16, "temperature": 0.7, "top_p": 0.9}),
        json!({"model": "served", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
               "stream": true, "stream_options": {"include_usage": true}, "stop": ["\n", "END"], "seed": 7, "logit_bias": {"5": -100},
               "chat_template_kwargs": {"enable_thinking": false}}),
        json!({"messages": [{"role": "user", "content": "Weather in Paris?"},
                            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
               "tools": [tool.clone()], "tool_choice": "auto", "parallel_tool_calls": false}),
        json!({"messages": [{"role": "user", "content": "Call it"}], "tools": [tool.clone()],
               "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_completion_tokens": 32,
               "frequency_penalty": 0.5, "presence_penalty": -0.5, "min_p": 0.1, "top_k": 20}),
        json!({"messages": [{"role": "user", "content": "A person"}], "response_format": {"type": "json_schema", "json_schema": {"name": "person",
               "schema": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}}, "required": ["name"]}, "strict": true}}}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect();
    fuzz("chat-request", &seeds, mutate_json_text, |bytes| {
        sala::server::openai::prepare_chat(bytes, &served_by(&tokenizer)).is_ok()
    });
}

/// `/v1/completions` and `/v1/messages` bodies: mutated, they are refused or prepared, never a panic.
#[test]
fn fuzz_completions_and_messages_requests() {
    let tokenizer = minicpm_tokenizer();
    let served = || served_by(&tokenizer);
    let seeds: Vec<Vec<u8>> = [
        json!({"model": "served", "prompt": "Once upon a time", "max_tokens": 8, "echo": true, "logprobs": 3, "stop": ["\n"], "temperature": 0}),
        json!({"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 0, "echo": true, "logprobs": 1, "stream": true, "stream_options": {"include_usage": true},
               "n": 1, "best_of": 1, "suffix": null, "logit_bias": {"7": 5}, "seed": 3}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect();
    fuzz("completions-request", &seeds, mutate_json_text, |bytes| sala::server::completions::prepare(bytes, &served()).is_ok());
    let tool = json!({"name": "get_weather", "description": "Weather in a city", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}});
    let seeds: Vec<Vec<u8>> = [
        json!({"model": "served", "max_tokens": 32, "system": [{"type": "text", "text": "Be brief."}], "stop_sequences": ["END"], "temperature": 0.5,
               "messages": [{"role": "user", "content": "Weather in Paris?"},
                            {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny", "is_error": false}]}],
               "tools": [tool.clone()], "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}}),
        json!({"max_tokens": 16, "stream": true, "messages": [{"role": "user", "content": [{"type": "text", "text": "Call it"}]}], "tools": [tool],
               "tool_choice": {"type": "tool", "name": "get_weather"}, "top_k": 20, "top_p": 0.9, "thinking": {"type": "disabled"}}),
    ]
    .iter()
    .map(|v| v.to_string().into_bytes())
    .collect();
    fuzz("messages-request", &seeds, mutate_json_text, |bytes| {
        let served = served();
        sala::server::anthropic::parse(bytes, served.model_id, served.tool_format, false)
            .and_then(|(request, _)| sala::server::openai::prepare(request, &served))
            .is_ok()
    });
}

/// Grows a schema somewhere in a request: a node repeated as many properties of an object, as
/// many alternatives of an `anyOf`, or nested many levels deep (what once overflowed the
/// compiler's stack), with counts around the limits.
fn grow_schema(data: &[u8], rng: &mut StdRng) -> Vec<u8> {
    let Ok(mut v) = serde_json::from_slice::<Value>(data) else { return mutate_bytes(data, rng) };
    let mut all = Vec::new();
    pointers(&v, String::new(), &mut all);
    let schemas: Vec<&String> = all.iter().filter(|p| p.contains("/schema") || p.contains("/parameters")).collect();
    let Some(at) = (!schemas.is_empty()).then(|| schemas[rng.random_range(0..schemas.len())].clone()) else { return mutate_json(&v, rng).to_string().into_bytes() };
    let Some(node) = v.pointer_mut(&at) else { return data.to_vec() };
    let n = [1, 2, 100, 499, 501, 2000, 4999, 5001, 10_000][rng.random_range(0..9)];
    let inner = node.clone();
    *node = match rng.random_range(0..4) {
        0 => json!({"type": "object", "properties": (0..n).map(|i| (format!("p{i}"), inner.clone())).collect::<serde_json::Map<_, _>>(),
                    "required": if rng.random() { json!((0..n).map(|i| format!("p{i}")).collect::<Vec<_>>()) } else { json!([]) }}),
        1 => json!({"anyOf": std::iter::repeat_n(inner, n.min(3000)).collect::<Vec<_>>()}),
        2 => json!({"enum": (0..n).map(|i| format!("v{i}")).collect::<Vec<_>>()}),
        // serde_json reads at most 128 levels: past them the request is refused when parsed.
        _ => (0..rng.random_range(1..140)).fold(inner, |acc, i| if i % 2 == 0 { json!({"type": "array", "items": acc}) } else { json!({"type": "object", "properties": {"x": acc}, "required": ["x"]}) }),
    };
    v.to_string().into_bytes()
}

/// Schemas and grammars through the real compile path: chat requests whose `response_format` and
/// tools are mutated and grown wide, deep and into many alternatives are refused or compiled,
/// never a crash; Lark grammars, mutated, likewise.
#[test]
fn fuzz_schemas_and_grammars() {
    let tokenizer = minicpm_tokenizer();
    let person = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]+$"}}, "kind": {"enum": ["a", "b", null]}}, "required": ["name"]});
    let recursive = json!({"$defs": {"node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}}, "$ref": "#/$defs/node"});
    let request = |schema: &Value| json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}});
    let tools = json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": person}}, {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {"q": {"anyOf": [{"type": "string"}, {"type": "number"}]}}}}}]});
    let seeds: Vec<Vec<u8>> = [request(&person), request(&recursive), tools].iter().map(|v| v.to_string().into_bytes()).collect();
    let served = served_by(&tokenizer);
    let mutate = |data: &[u8], rng: &mut StdRng| if rng.random() { grow_schema(data, rng) } else { mutate_json_text(data, rng) };
    fuzz("schema", &seeds, mutate, |bytes| sala::server::openai::prepare_chat(bytes, &served).is_ok());

    use sala::engine::grammar::{Grammar, Reasoning};
    let compiler = tokenizer.grammar_compiler(tokenizer.vocab_size(), &[2]).unwrap();
    let lark: Vec<Vec<u8>> = [
        "start: \"yes\" | \"no\"",
        "start: item (\",\" item)*\nitem: /[a-z]+/ | NUMBER\n%import common.NUMBER",
        "start: value\nvalue: \"[\" (value (\",\" value)*)? \"]\" | /[0-9]+/",
        "start: %json {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"string\"}}}",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    let grow_lark = |data: &[u8], rng: &mut StdRng| {
        let text = String::from_utf8_lossy(data).into_owned();
        match rng.random_range(0..4) {
            // Many alternatives, or deep nesting of parentheses.
            0 => format!("start: {}", (0..rng.random_range(1..20_000)).map(|i| format!("\"w{i}\"")).collect::<Vec<_>>().join(" | ")).into_bytes(),
            1 => {
                let depth = rng.random_range(1..5000);
                format!("start: {}\"a\"{}", "(".repeat(depth), ")".repeat(depth)).into_bytes()
            }
            _ => mutate_bytes(text.as_bytes(), rng),
        }
    };
    fuzz("lark", &lark, grow_lark, |bytes| {
        let text = String::from_utf8_lossy(bytes).into_owned();
        compiler.compile(&Grammar::Lark(text), Reasoning::Off).is_ok()
    });
}

/// Golden A's state after 30 of its prompt tokens (attention layers 0 and 3, recurrent 1 and 2,
/// restart points at 16 and 30), as `--prompt-cache` writes it, for the model of `fingerprint`.
fn state_file_seed(model: &dyn sala::engine::model::LanguageModel, fingerprint: &sala::engine::state_file::Fingerprint, path: &Path) -> Vec<u8> {
    use sala::engine::prefix_cache::Trail;
    let prompt = common::ids(&common::tokens("A_dense_f32"), "prompt_ids");
    let mut cache = model.new_cache();
    let mut trail = Trail::new(&cache);
    trail.stop_at(16);
    sala::engine::generate::extend_along(model, &mut cache, &mut trail, &prompt[..30], 512, |_| {}).unwrap();
    trail.mark_end(&cache).unwrap();
    sala::engine::state_file::save(path, fingerprint, &prompt[..30], &cache, &trail, &mut |_, _| {}).unwrap();
    std::fs::read(path).unwrap()
}

/// Float and integer values a state's tensors should never hold, and some they may.
fn edge_value(dtype: &str, rng: &mut StdRng) -> Vec<u8> {
    let floats = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN_POSITIVE / 2.0, -0.0, 1e30, 0.0];
    let f = floats[rng.random_range(0..floats.len())];
    match dtype {
        "F32" => f.to_le_bytes().to_vec(),
        "F16" | "BF16" => [[0x7e, 0x7f], [0x80, 0x7f], [0x00, 0x7c], [0xff, 0xff], [0, 0]][rng.random_range(0..5)].to_vec(),
        _ => edge_int(rng).to_le_bytes().to_vec(),
    }
}

/// Prompt-cache files (issue 54) through the reads a server makes at start: `StateFile::open`,
/// then `read` of every layer and restart point, and `StateDir::load` over a folder holding the
/// file. Mutations: bytes damaged anywhere (the digests refuse most), and — sealed again with
/// valid digests and header checksum, so only the reader's own checks stand — metadata values
/// changed, tensor values set to NaN, infinities and edge integers, shapes and dtypes changed,
/// tensors removed or renamed.
#[test]
fn fuzz_state_file() {
    use common::state_files::Parts;
    use sala::engine::state_file::{Fingerprint, StateDir, StateFile};
    sala::engine::device::select(Some(sala::engine::device::DeviceKind::Cpu)).unwrap();
    let golden = common::golden("A_dense_f32");
    let fingerprint = Fingerprint::of(&sala::models::open(&golden).unwrap(), mlx_rs::Dtype::Float32).unwrap();
    let model = sala::models::load(&golden, Some(mlx_rs::Dtype::Float32)).unwrap();
    let model = model.as_ref();
    let dir = scratch("state-dir");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}-{}-{:016x}.prompt-cache", &fingerprint.model[..16], &fingerprint.tokenizer[..16], 0));
    let seed = state_file_seed(model, &fingerprint, &path);
    let mutate = |s: &[u8], rng: &mut StdRng| -> Vec<u8> {
        let mut parts = Parts::parse(s);
        let names: Vec<String> = parts.tensors.keys().cloned().collect();
        let name = names[rng.random_range(0..names.len())].clone();
        // A signed edge value, or a size a real layout has.
        let fact = |rng: &mut StdRng| -> Value {
            match rng.random_range(0..3) {
                0 => json!(edge_int(rng) as i64),
                1 => json!((edge_int(rng) as i64).wrapping_neg()),
                _ => json!([0, 1, 2, 16, 32, 64][rng.random_range(0..6)]),
            }
        };
        match rng.random_range(0..8) {
            0 => return mutate_bytes(s, rng),
            6 => {
                // Pooled keys of a layer, with a tensor of a small shape for them.
                let layer = ["0", "3", "1", "99"][rng.random_range(0..4)];
                let layout: Vec<Value> = (0..rng.random_range(1..3)).map(|_| json!([fact(rng), fact(rng), fact(rng), fact(rng)])).collect();
                parts.metadata.insert("pooled".into(), json!({ layer: layout }).to_string());
                let shape = vec![1, 1, rng.random_range(0..4), [0, 32, 64][rng.random_range(0..3)]];
                let bytes = vec![0u8; 4 * shape.iter().product::<usize>()];
                parts.tensors.insert(format!("layer.{layer}.pooled.0"), ("F32".into(), shape, bytes));
            }
            7 => {
                // Restart points, layer counts and token lists of edge sizes.
                match rng.random_range(0..3) {
                    0 => {
                        let points: Vec<Value> = (0..rng.random_range(0..4)).map(|_| fact(rng)).collect();
                        parts.metadata.insert("points".into(), json!(points).to_string());
                    }
                    1 => {
                        parts.metadata.insert("layers".into(), fact(rng).to_string());
                    }
                    _ => {
                        let n = [0, 1, 2, 29, 31][rng.random_range(0..5)];
                        let tokens: Vec<u8> = (0..n).flat_map(|_| (edge_int(rng) as u32 % 600).to_le_bytes()).collect();
                        parts.tensors.insert("tokens".into(), ("U32".into(), vec![n], tokens));
                    }
                }
            }
            1 => {
                let keys: Vec<String> = parts.metadata.keys().filter(|k| *k != "xxh3" && *k != "checksum").cloned().collect();
                let key = keys[rng.random_range(0..keys.len())].clone();
                let value = mutate_json_text(parts.metadata[&key].as_bytes(), rng);
                parts.metadata.insert(key, String::from_utf8_lossy(&value).into_owned());
            }
            2 => {
                let (dtype, _, bytes) = parts.tensors.get_mut(&name).unwrap();
                let width = sala::engine::weights::dtype_size(dtype).unwrap_or(1).max(1) as usize;
                for _ in 0..rng.random_range(1..4) {
                    if bytes.len() >= width {
                        let at = rng.random_range(0..bytes.len() / width) * width;
                        let value = edge_value(dtype, rng);
                        bytes[at..at + width].copy_from_slice(&value[..width]);
                    }
                }
            }
            3 => {
                let (dtype, shape, bytes) = parts.tensors.get_mut(&name).unwrap();
                if rng.random() {
                    *dtype = ["F32", "F16", "BF16", "U32", "I64", "U8", "BOOL", "F64"][rng.random_range(0..8)].to_string();
                }
                match rng.random_range(0..4) {
                    0 => shape.clear(),
                    1 => shape.push(rng.random_range(0..3)),
                    2 if !shape.is_empty() => {
                        shape.remove(rng.random_range(0..shape.len()));
                    }
                    _ if !shape.is_empty() => {
                        let at = rng.random_range(0..shape.len());
                        shape[at] = (edge_int(rng) as usize).min(1 << 40);
                    }
                    _ => {}
                }
                // Bytes for the new shape when that is small; else the header and data disagree.
                let size = shape.iter().try_fold(sala::engine::weights::dtype_size(dtype).unwrap_or(1) as usize, |a, &d| a.checked_mul(d));
                if let Some(size) = size.filter(|&n| n <= 1 << 20) {
                    bytes.resize(size, 0);
                }
            }
            4 => {
                parts.tensors.remove(&name);
            }
            _ => {
                let tensor = parts.tensors.remove(&name).unwrap();
                let other = ["tokens", "layer.0.keys", "layer.3.values", "layer.1.keys", "point.0.layer.1", "point.1.layer.2", "point.9.layer.1", "layer.0.pooled.0"];
                parts.tensors.insert(other[rng.random_range(0..other.len())].to_string(), tensor);
            }
        }
        parts.seal()
    };
    let read = |bytes: &[u8]| {
        std::fs::write(&path, bytes).unwrap();
        let accepted = StateFile::open(&path, &fingerprint)
            .and_then(|file| {
                let points: Vec<usize> = (0..Parts::parse(bytes).metadata.get("points").map_or(0, |p| serde_json::from_str::<Vec<Value>>(p).map_or(0, |v| v.len()))).collect();
                file.read(model, &points, &mut |_, _| {})
            })
            .is_ok();
        // The server's path: a panic there is caught and reported as a skipped file.
        let store = StateDir::new(&dir, &fingerprint).unwrap();
        let (_, skipped) = store.load(model, u64::MAX, &mut |_, _| {}).unwrap();
        if let Some(s) = skipped.iter().find(|s| s.error.to_string().contains("panicked")) {
            panic!("StateDir::load: {}", s.error);
        }
        accepted
    };
    fuzz("state-file", &[seed], mutate, read);
    let _ = std::fs::remove_dir_all(dir);
}
