//! `sala serve`'s tokenizer endpoints in vLLM's shapes (`POST /tokenize`, `POST /detokenize`,
//! `GET /tokenizer_info`) on the SmolLM2 GGUF, against the model's own tokenizer and through
//! lm-eval's `RemoteTokenizer` (the client that reads them); and the short model ids a `--model`
//! server answers to.

mod common;

use common::server::{request, Server};
use serde_json::{json, Value};
use std::process::Command;

fn post(port: u16, path: &str, body: Value) -> (u16, Value) {
    let r = request(port, "POST", path, Some(&body.to_string()), &[]).unwrap();
    (r.status, r.json())
}

fn get(port: u16, path: &str) -> (u16, Value) {
    let r = request(port, "GET", path, None, &[]).unwrap();
    (r.status, r.json())
}

#[test]
fn tokenizer_endpoints_answer_as_vllm_does() {
    let gguf = common::smollm2_gguf();
    let server = Server::start(&gguf, &[], 200);
    let port = server.port;
    let (_, tokenizer) = sala::models::load_with_tokenizer(&gguf, None).unwrap();
    let tokenizer = tokenizer.unwrap();

    // The settings lm-eval reads: SmolLM2's end token is <|im_end|> (id 2), its context 8192.
    let (status, info) = get(port, "/tokenizer_info");
    assert_eq!(status, 200, "{info}");
    assert_eq!((info["eos_token"].as_str(), info["bos_token"].as_str()), (Some("<|im_end|>"), Some("<|im_start|>")), "{info}");
    assert_eq!((info["model_max_length"].as_u64(), info["add_bos_token"].as_bool()), (Some(8192), Some(false)), "{info}");
    assert_eq!(info["tokenizer_class"], "PreTrainedTokenizerFast");
    assert_eq!(info["chat_template"].as_str(), Some(tokenizer.chat_template()));

    // A prompt: its ids, count, the context, and the vocabulary's pieces when asked.
    let (status, t) = post(port, "/tokenize", json!({"prompt": "Hello world<|im_end|>", "return_token_strs": true}));
    assert_eq!(status, 200, "{t}");
    assert_eq!(t["tokens"], json!([19556, 905, 2]), "{t}");
    assert_eq!((t["count"].as_u64(), t["max_model_len"].as_u64()), (Some(3), Some(8192)));
    assert_eq!(t["token_strs"], json!(["Hello", "Ġworld", "<|im_end|>"]));
    let (_, plain) = post(port, "/tokenize", json!({"prompt": "A longer sentence, with punctuation.", "add_special_tokens": false}));
    assert_eq!(plain["tokens"], json!(tokenizer.encode_plain("A longer sentence, with punctuation.").unwrap()));
    assert!(plain.get("token_strs").is_none(), "{plain}");
    // A chat: rendered with the model's template, as /v1/chat/completions runs it.
    let messages = json!([{"role": "user", "content": "Hi there"}]);
    let (status, chat) = post(port, "/tokenize", json!({"messages": messages}));
    let rendered = tokenizer.apply_chat_template(&[sala::engine::tokenizer::Message::new("user", "Hi there")], true).unwrap();
    assert_eq!((status, chat["tokens"].clone()), (200, json!(tokenizer.encode_plain(&rendered).unwrap())), "{chat}");

    // Back again, special tokens kept.
    let (status, d) = post(port, "/detokenize", json!({"tokens": [19556, 905, 2]}));
    assert_eq!((status, d["prompt"].as_str()), (200, Some("Hello world<|im_end|>")), "{d}");

    // Bad bodies name the field; an unknown model is a 404, as on the other endpoints.
    for (path, body, status, param) in [
        ("/detokenize", json!({"tokens": [1, 49152]}), 400, "tokens[1]"),
        ("/detokenize", json!({"tokens": [1, -3]}), 400, "tokens[1]"),
        ("/detokenize", json!({}), 400, "tokens"),
        ("/detokenize", json!({"tokens": "1 2"}), 400, "tokens"),
        ("/tokenize", json!({}), 400, "prompt"),
        ("/tokenize", json!({"prompt": 5}), 400, "prompt"),
        ("/tokenize", json!({"prompt": "a", "messages": messages}), 400, "messages"),
        ("/tokenize", json!({"prompt": "a", "add_special_tokens": "yes"}), 400, "add_special_tokens"),
        ("/tokenize", json!({"messages": messages, "add_generation_prompt": false}), 400, "add_generation_prompt"),
        ("/tokenize", json!({"messages": "Hi"}), 400, "messages"),
        ("/tokenize", json!({"prompt": "a", "model": "other"}), 404, "model"),
        ("/detokenize", json!({"tokens": [1], "model": "other"}), 404, "model"),
    ] {
        let (got, e) = post(port, path, body.clone());
        assert_eq!((got, e["error"]["param"].as_str()), (status, Some(param)), "{path} {body}: {e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(param.split('[').next().unwrap()), "{e}");
    }
    let (status, e) = get(port, "/tokenizer_info?model=other");
    assert_eq!((status, e["error"]["code"].as_str()), (404, Some("model_not_found")), "{e}");

    // lm-eval's own client for these endpoints reads what it needs from them.
    let python = common::venv_python("lm-eval-venv", "SALA_LM_EVAL_PYTHON", "lm_eval, aiohttp, requests, tenacity", &["lm_eval[api]==0.4.13"]);
    let script = "import sys, json\nfrom lm_eval.utils import RemoteTokenizer, check_remote_tokenizer_support\n\
        base = sys.argv[1]\nassert check_remote_tokenizer_support(base)\nt = RemoteTokenizer(base)\n\
        chat = t.apply_chat_template([{'role': 'user', 'content': 'Hi there'}])\n\
        print(json.dumps({'eos': t.eos_token_id, 'bos': t.bos_token_id, 'ids': t.encode('Hello world'), 'text': t.decode([19556, 905]), 'chat': chat}))\n";
    let out = Command::new(python).args(["-c", script, &format!("http://127.0.0.1:{port}/v1/completions")]).output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{printed}{}", String::from_utf8_lossy(&out.stderr));
    let seen: Value = serde_json::from_str(printed.trim()).unwrap();
    assert_eq!((seen["eos"].as_u64(), seen["bos"].as_u64()), (Some(2), Some(1)), "{seen}");
    assert_eq!((seen["ids"].clone(), seen["text"].as_str()), (json!([19556, 905]), Some("Hello world")), "{seen}");
    // Its Jinja render of the template the server gave is the prompt the server renders.
    assert_eq!(seen["chat"].as_str(), Some(rendered.as_str()), "{seen}");
}

/// Every name a `--model` server answers to, what it lists, and what an answer echoes.
#[test]
fn a_model_answers_to_its_short_id_alias_and_path() {
    let gguf = common::smollm2_gguf();
    let path = gguf.display().to_string();
    let stem = "SmolLM2-135M-Instruct.Q4_1";
    let completion = |port: u16, model: &str| post(port, "/v1/completions", json!({"model": model, "prompt": "Hi", "max_tokens": 1, "temperature": 0}));

    let server = Server::start(&gguf, &[], 200);
    let (_, list) = get(server.port, "/v1/models");
    assert_eq!((list["data"][0]["id"].as_str(), list["data"][0]["path"].as_str()), (Some(stem), Some(path.as_str())), "{list}");
    for name in [stem, path.as_str(), "SmolLM2-135M-Instruct.Q4_1.gguf"] {
        let (status, answer) = completion(server.port, name);
        assert_eq!((status, answer["model"].as_str()), (200, Some(name)), "{name}: {answer}");
    }
    let (status, e) = completion(server.port, "SmolLM2");
    assert_eq!((status, e["error"]["code"].as_str()), (404, Some("model_not_found")), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains(stem), "{e}");
    drop(server);

    // --alias is the listed id; the short id and the path still work.
    let server = Server::start(&gguf, &["--alias", "smollm2"], 200);
    let (_, list) = get(server.port, "/v1/models");
    assert_eq!(list["data"][0]["id"], "smollm2", "{list}");
    for name in ["smollm2", stem, path.as_str()] {
        assert_eq!(completion(server.port, name).0, 200, "{name}");
        let (status, t) = post(server.port, "/tokenize", json!({"model": name, "prompt": "Hi"}));
        assert_eq!((status, t["count"].as_u64()), (200, Some(1)), "{name}: {t}");
    }
    let (status, health) = get(server.port, "/health");
    assert_eq!((status, health["model"].as_str()), (200, Some("smollm2")), "{health}");
    drop(server);

    // --alias names the one model of --model; without it the server refuses to start.
    let out = Command::new(env!("CARGO_BIN_EXE_sala")).args(["serve", "--alias", "x", "--port", "0"]).env("HF_HOME", std::env::temp_dir().join("sala-no-store")).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--alias names the model given with --model"), "{stderr}");
}
