//! vLLM's tokenizer endpoints, which evaluation harnesses use to count and split text the way
//! the server will (lm-evaluation-harness's `local-completions` asks for them before anything
//! else, and without them needs a Hugging Face tokenizer that a GGUF user does not have):
//! `POST /tokenize` (a `prompt`, or chat `messages` rendered with the model's template),
//! `POST /detokenize` (`tokens` → `prompt`) and `GET /tokenizer_info` (the tokenizer's
//! settings, as `tokenizer_config.json` holds them). Served at the root, as vLLM does.

use super::openai::{boolean, json_object, wrong, ApiError, ChatRequest};
use super::{pool, read_body, AppState, MAX_BODY_BYTES};
use super::log::RequestLog;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// What HF's `AutoTokenizer` builds from a `tokenizer.json` alone, which is what every model's
/// tokenizer here is (a GGUF's vocabulary is turned into one).
const TOKENIZER_CLASS: &str = "PreTrainedTokenizerFast";

/// The body (and its size), and a hold on the model it names.
async fn model_for(state: &Arc<AppState>, headers: &HeaderMap, log: &RequestLog, body: axum::body::Body) -> Result<(Map<String, Value>, usize, pool::Lease), ApiError> {
    super::admit(state, headers)?;
    let bytes = read_body(state, body, MAX_BODY_BYTES).await?;
    let obj = json_object(&bytes)?;
    let requested = match obj.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(_) => return Err(wrong("model", "a string")),
    };
    let lease = super::lease(state, requested.as_deref(), log).await?;
    Ok((obj, bytes.len(), lease))
}

fn tokenizer_error(param: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(param, &format!("`{param}` could not be tokenized: {e}"))
}

/// `POST /tokenize`: vLLM's `TokenizeCompletionRequest` (`prompt`, `add_special_tokens`
/// default true) or `TokenizeChatRequest` (`messages`, `add_special_tokens` default false, as
/// the template writes its own), with `return_token_strs`; answers `count`, `max_model_len`,
/// `tokens` and, when asked, `token_strs`.
pub async fn tokenize(State(state): State<Arc<AppState>>, Extension(log): Extension<RequestLog>, headers: HeaderMap, body: axum::body::Body) -> Result<Response, ApiError> {
    let (obj, size, lease) = model_for(&state, &headers, &log, body).await?;
    let chat = match (obj.get("prompt"), obj.get("messages")) {
        (Some(_), Some(_)) => return Err(ApiError::bad_request("messages", "give either `prompt` (text) or `messages` (a chat), not both")),
        (None, None) => return Err(ApiError::bad_request("prompt", "`prompt` (text) or `messages` (a chat) is required")),
        (Some(Value::String(_)), None) => false,
        (Some(_), None) => return Err(wrong("prompt", "a string")),
        (None, Some(_)) => true,
    };
    let add_special_tokens = boolean(&obj, "add_special_tokens")?.unwrap_or(!chat);
    let token_strs = boolean(&obj, "return_token_strs")?.unwrap_or(false);
    if chat {
        // sala renders a chat as its chat endpoint does: ready for the assistant's answer.
        if boolean(&obj, "add_generation_prompt")? == Some(false) {
            return Err(unsupported("add_generation_prompt", "chat prompts are rendered with the generation prompt, as /v1/chat/completions runs them"));
        }
        if boolean(&obj, "continue_final_message")? == Some(true) {
            return Err(unsupported("continue_final_message", "chat prompts are rendered with the generation prompt, as /v1/chat/completions runs them"));
        }
    } else {
        for key in ["add_generation_prompt", "continue_final_message", "tools", "chat_template"] {
            if obj.get(key).is_some_and(|v| !v.is_null()) {
                return Err(ApiError::bad_request(key, &format!("`{key}` goes with `messages`, not `prompt`")));
            }
        }
    }
    if obj.get("chat_template").is_some_and(|v| !v.is_null()) {
        return Err(unsupported("chat_template", "the model's own template is used"));
    }
    // Off the async threads, large bodies a few at a time, as the other endpoints prepare theirs.
    let (tokens, strs, max_context) = super::prepare_blocking(&state, &lease, size, move |served| {
        let tokenizer = served.tokenizer;
        let (text, param) = if chat {
            let body = serde_json::to_vec(&Value::Object(obj)).unwrap_or_default();
            let request = ChatRequest::parse(&body, served.model_id, served.tool_format)?;
            let text = tokenizer
                .apply_chat_template_with_tools(&request.messages, &request.tools, request.tool_format, request.enable_thinking)
                .map_err(|e| ApiError::bad_request("messages", &e.to_string()))?;
            (text, "messages")
        } else {
            (obj.get("prompt").and_then(Value::as_str).unwrap_or_default().to_string(), "prompt")
        };
        let tokens = if add_special_tokens { tokenizer.encode(&text) } else { tokenizer.encode_plain(&text) }.map_err(|e| tokenizer_error(param, e))?;
        let strs: Option<Vec<String>> = token_strs.then(|| tokens.iter().map(|&id| tokenizer.id_to_token(id).unwrap_or_default()).collect());
        Ok((tokens, strs, served.max_context))
    })
    .await?;
    log.tokens(tokens.len(), 0, 0);
    let mut answer = json!({"count": tokens.len(), "max_model_len": max_context, "tokens": tokens});
    if let Some(strs) = strs {
        answer["token_strs"] = json!(strs);
    }
    Ok(Json(answer).into_response())
}

fn unsupported(param: &str, why: &str) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", "unsupported_parameter", Some(param), &format!("`{param}` is not supported: {why}"))
}

/// `POST /detokenize`: `tokens` (ids of the model's vocabulary) → `prompt`, the text they
/// stand for with special tokens kept (what `/tokenize` of it gives back).
pub async fn detokenize(State(state): State<Arc<AppState>>, Extension(log): Extension<RequestLog>, headers: HeaderMap, body: axum::body::Body) -> Result<Response, ApiError> {
    let (obj, size, lease) = model_for(&state, &headers, &log, body).await?;
    let Some(Value::Array(items)) = obj.get("tokens") else {
        return Err(match obj.get("tokens") {
            None | Some(Value::Null) => ApiError::bad_request("tokens", "`tokens` (a list of token ids) is required"),
            Some(_) => wrong("tokens", "a list of token ids"),
        });
    };
    let vocab = lease.ready().vocab_size.max(lease.ready().tokenizer.vocab_size());
    let ids = items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64().and_then(|id| u32::try_from(id).ok()).filter(|&id| (id as usize) < vocab).ok_or_else(|| {
                ApiError::bad_request(&format!("tokens[{i}]"), &format!("`tokens[{i}]` is {v}: a token id is an integer from 0 to {} (the vocabulary's size less one)", vocab - 1))
            })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    let count = ids.len();
    let text = super::prepare_blocking(&state, &lease, size, move |served| served.tokenizer.decode_all(&ids).map_err(|e| ApiError::bad_request("tokens", &e.to_string()))).await?;
    log.tokens(count, 0, 0);
    Ok(Json(json!({"prompt": text})).into_response())
}

/// `GET /tokenizer_info[?model=NAME]`: the tokenizer's settings under `tokenizer_config.json`'s
/// keys, as vLLM answers: `tokenizer_class`, `bos_token`, `eos_token`, `add_bos_token`,
/// `model_max_length` and `chat_template` (what lm-eval's remote tokenizer reads), and the
/// vocabulary's size.
pub async fn tokenizer_info(
    State(state): State<Arc<AppState>>,
    Extension(log): Extension<RequestLog>,
    headers: HeaderMap,
    Query(query): Query<std::collections::HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let requested = query.get("model").map(String::as_str);
    if requested.is_none() && !state.pool.fixed {
        super::authorized(&state, &headers)?;
        return Err(ApiError::bad_request("model", "this server serves every model of its store: name one, as GET /tokenizer_info?model=NAME (GET /v1/models lists them)"));
    }
    super::admit(&state, &headers)?;
    let lease = super::lease(&state, requested, &log).await?;
    let ready = lease.ready();
    let tokenizer = &ready.tokenizer;
    // The end token the tokenizer config names, else the model's first.
    let eos = tokenizer.eos_token().map(str::to_string).or_else(|| ready.eos.first().and_then(|&id| tokenizer.id_to_token(id)));
    let (bos, add_bos) = tokenizer.bos_token();
    Ok(Json(json!({
        "tokenizer_class": TOKENIZER_CLASS,
        "bos_token": bos,
        "eos_token": eos,
        "add_bos_token": add_bos,
        "model_max_length": ready.max_context,
        "vocab_size": tokenizer.vocab_size(),
        "chat_template": tokenizer.chat_template(),
    }))
    .into_response())
}
