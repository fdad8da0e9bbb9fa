//! The MiniCPM tokenizer (../shared/assets/minicpm4-tokenizer): known encodings, BOS exactly
//! once, chat templates (the model's own and the ChatML fallback) and streaming decode.

mod common;

use sala::engine::tokenizer::{Message, StreamDecoder, TextTokenizer};
use std::path::PathBuf;

fn asset_dir() -> PathBuf {
    common::shared().join("assets").join("minicpm4-tokenizer")
}

/// A scratch directory with the MiniCPM tokenizer.json and the given tokenizer_config.json.
fn with_config(name: &str, config: Option<serde_json::Value>) -> (PathBuf, TextTokenizer) {
    let dir = std::env::temp_dir().join(format!("sala-tok-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(asset_dir().join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    if let Some(config) = config {
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
    }
    let tok = TextTokenizer::from_dir(&dir, Some(1)).unwrap().unwrap();
    (dir, tok)
}

const KNOWN_TEXT: &str = "<|im_start|>user\n你好 Hello world! The best thing<|im_end|>\n";
const KNOWN_IDS: [u32; 13] = [73441, 3060, 5, 23523, 21045, 2809, 73, 1507, 2558, 4562, 73440, 59320, 5];

#[test]
fn known_encoding_with_bos_once() {
    let tok = TextTokenizer::from_dir(&asset_dir(), Some(1)).unwrap().unwrap();
    assert_eq!(tok.vocab_size(), 73448);
    let ids = tok.encode(KNOWN_TEXT).unwrap();
    assert_eq!(ids[0], 1, "BOS first");
    assert_eq!(&ids[1..], &KNOWN_IDS);
    // Text that already starts with <s> does not get a second one.
    let ids = tok.encode(&format!("<s>{KNOWN_TEXT}")).unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 1);
    assert_eq!(&ids[1..], &KNOWN_IDS);
    // Specials are skipped; the `▁` the tokenizer put after <|im_end|> decodes to a space.
    assert_eq!(tok.decode(&ids).unwrap(), "user\n你好 Hello world! The best thing \n");
}

#[test]
fn chat_template_from_tokenizer_config() {
    let tok = TextTokenizer::from_dir(&asset_dir(), Some(1)).unwrap().unwrap();
    let prompt = tok
        .apply_chat_template(&[Message::new("system", "Be brief."), Message::new("user", "Hi")], true)
        .unwrap();
    assert_eq!(prompt, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    let ids = tok.encode(&prompt).unwrap();
    assert_eq!(&ids[..2], &[1, 73441]);
}

#[test]
fn template_that_writes_bos_gets_no_second_one_and_sees_enable_thinking() {
    let template = "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n{% if not enable_thinking %}<think>\n\n</think>\n\n{% endif %}";
    let config = serde_json::json!({ "add_bos_token": true, "bos_token": "<s>", "eos_token": "<|im_end|>", "chat_template": template });
    let (dir, tok) = with_config("bos", Some(config));
    let thinking = tok.apply_chat_template(&[Message::new("user", " Hi ")], true).unwrap();
    assert_eq!(thinking, "<s><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    let ids = tok.encode(&thinking).unwrap();
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 1, "{ids:?}");
    let quiet = tok.apply_chat_template(&[Message::new("user", "Hi")], false).unwrap();
    assert!(quiet.ends_with("<think>\n\n</think>\n\n"));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn chatml_fallback_without_tokenizer_config() {
    let (dir, tok) = with_config("plain", None);
    let prompt = tok.apply_chat_template(&[Message::new("user", "Hi")], true).unwrap();
    assert_eq!(prompt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    // Without a config the tokenizer's post-processor decides: this one prepends <s>.
    assert_eq!(tok.encode("Hi").unwrap()[0], 1);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn bad_template_is_a_typed_error() {
    let config = serde_json::json!({ "chat_template": "{% for m in messages %}{{ raise_exception('no ' + m.role) }}{% endfor %}" });
    let (dir, tok) = with_config("raise", Some(config));
    let err = tok.apply_chat_template(&[Message::new("user", "x")], true).unwrap_err();
    assert!(err.to_string().contains("no user"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn stream_decoder_reassembles_text_and_multibyte_characters() {
    let tok = TextTokenizer::from_dir(&asset_dir(), Some(1)).unwrap().unwrap();
    let text = "Hello 世界! naïve café — 12345 🙂 done.";
    let ids = tok.encode(text).unwrap();
    let mut decoder = StreamDecoder::default();
    let mut out = String::new();
    for &id in &ids {
        let piece = decoder.push(&tok, id).unwrap();
        assert!(!piece.contains('\u{FFFD}'), "partial character leaked: {piece:?}");
        out.push_str(&piece);
    }
    out.push_str(&decoder.finish(&tok).unwrap());
    assert_eq!(out, text);
}

/// The pieces of a SentencePiece `tokenizer.model` (protobuf ModelProto: field 1 = SentencePiece
/// {1: piece, 2: score, 3: type}), as a GGUF file stores them.
fn sentencepiece_pieces(path: &std::path::Path) -> (Vec<String>, Vec<f32>, Vec<i64>) {
    fn varint(b: &[u8], i: &mut usize) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = b[*i];
            *i += 1;
            v |= ((byte & 0x7f) as u64) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        v
    }
    let bytes = std::fs::read(path).unwrap();
    let (mut tokens, mut scores, mut types) = (Vec::new(), Vec::new(), Vec::new());
    let mut i = 0;
    while i < bytes.len() {
        let key = varint(&bytes, &mut i);
        let (field, wire) = (key >> 3, key & 7);
        let len = match wire {
            0 => {
                varint(&bytes, &mut i);
                continue;
            }
            1 => 8,
            5 => 4,
            2 => varint(&bytes, &mut i) as usize,
            other => panic!("wire type {other}"),
        };
        if field == 1 && wire == 2 {
            let msg = &bytes[i..i + len];
            let (mut piece, mut score, mut kind) = (String::new(), 0.0f32, 1i64);
            let mut j = 0;
            while j < msg.len() {
                let key = varint(msg, &mut j);
                match (key >> 3, key & 7) {
                    (1, 2) => {
                        let n = varint(msg, &mut j) as usize;
                        piece = String::from_utf8(msg[j..j + n].to_vec()).unwrap();
                        j += n;
                    }
                    (2, 5) => {
                        score = f32::from_le_bytes(msg[j..j + 4].try_into().unwrap());
                        j += 4;
                    }
                    (3, 0) => kind = varint(msg, &mut j) as i64,
                    (_, 0) => {
                        varint(msg, &mut j);
                    }
                    (_, 2) => {
                        let n = varint(msg, &mut j) as usize;
                        j += n;
                    }
                    (_, 5) => j += 4,
                    (_, 1) => j += 8,
                    (_, w) => panic!("wire type {w}"),
                }
            }
            tokens.push(piece);
            scores.push(score);
            types.push(kind);
        }
        i += len;
    }
    (tokens, scores, types)
}

/// A GGUF `llama` (SentencePiece) vocabulary — here MiniCPM4's tokenizer.model plus its added
/// tokens, as llama.cpp's converter writes them — must tokenize exactly like the HF tokenizer.json
/// that transformers built from the same model.
#[test]
fn sentencepiece_vocabulary_from_gguf_metadata_matches_the_hf_tokenizer() {
    let (mut tokens, mut scores, mut types) = sentencepiece_pieces(&asset_dir().join("tokenizer.model"));
    assert_eq!(tokens.len(), 73440);
    let added: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(asset_dir().join("added_tokens.json")).unwrap()).unwrap();
    let mut added: Vec<(u64, String)> = added.as_object().unwrap().iter().map(|(k, v)| (v.as_u64().unwrap(), k.clone())).collect();
    added.sort();
    for (id, text) in added {
        assert_eq!(id as usize, tokens.len());
        tokens.push(text);
        scores.push(-1000.0);
        types.push(3);
    }
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let ours: tokenizers::Tokenizer = sala::engine::gguf::sentencepiece_bpe(&refs, &scores, &types, true)
        .unwrap()
        .to_string()
        .parse()
        .unwrap();
    let hf = tokenizers::Tokenizer::from_file(asset_dir().join("tokenizer.json")).unwrap();
    for text in [
        KNOWN_TEXT,
        "Hello world",
        "  two  spaces and\ttabs\n\nnew lines ",
        "数字 12345 和 3.14159，标点！",
        "emoji 🦀🚀 and rare ǅ ꙮ bytes",
        "def f(x):\n    return x ** 2  # comment",
    ] {
        let a = ours.encode(text, false).unwrap().get_ids().to_vec();
        let b = hf.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(a, b, "{text:?}");
        assert_eq!(ours.decode(&a, false).unwrap(), hf.decode(&b, false).unwrap(), "{text:?}");
    }
    assert_eq!(ours.encode(KNOWN_TEXT, false).unwrap().get_ids(), &KNOWN_IDS);
}

/// The bound a server refuses overlong prompts on, before tokenizing them, never exceeds the
/// real count (the MiniCPM tokenizer prepends a space and normalizes), and for a large text that
/// fits it is close to it, so only prompts past the context are refused.
#[test]
fn fewest_tokens_is_a_lower_bound_that_stays_close() {
    let tok = TextTokenizer::from_dir(&asset_dir(), Some(1)).unwrap().unwrap();
    let english: String = (0..150_000u32).map(|i| format!("word{i:x} and, ")).collect();
    let cjk = "模型在长上下文中检索信息。".repeat(40_000);
    let unbroken = "abcdefghij".repeat(150_000);
    let special = "<s></s>".repeat(200_000);
    for (name, text) in [("english", &english), ("cjk", &cjk), ("no whitespace", &unbroken), ("special tokens", &special), ("short", &"Hello there".to_string())] {
        let real = tok.encode_plain(text).unwrap().len();
        let fewest = tok.fewest_tokens(text, usize::MAX).unwrap();
        assert!(fewest <= real, "{name}: bound {fewest} over the real count {real}");
        if text.len() > 1 << 20 {
            assert!(fewest as f64 >= 0.99 * real as f64, "{name}: bound {fewest} far below the real count {real}");
            // Past a limit it stops early, still below the real count.
            let early = tok.fewest_tokens(text, real / 10).unwrap();
            assert!(early > real / 10 && early <= real, "{name}: {early} against limit {} of {real}", real / 10);
        }
    }
}
