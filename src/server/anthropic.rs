//! Anthropic's Messages API: `POST /v1/messages` (also `?beta=true`) and
//! `POST /v1/messages/count_tokens`. A request is read into the chat endpoint's [`ChatRequest`]
//! (system prompt, messages, `tool_use`/`tool_result` as calls and tool messages, tools and
//! `tool_choice` as the same grammar-constrained calls, `output_config.format` as its
//! `response_format`), runs on the same worker, and its answer
//! is split by the same [`AnswerParser`] into text, `tool_use` blocks and (with `thinking`)
//! thinking blocks. Errors are Anthropic's `{"type": "error", "error": {"type", "message"}}`.

use super::answer::AnswerParser;
use super::openai::{self, boolean, check_model, integer, json_object, number, wrong, ApiError, ChatRequest, ToolChoice};
use super::scheduler::{Event, Job};
use super::AppState;
use crate::engine::generation_config::SamplingChoice;
use crate::engine::generate::LogprobOptions;
use crate::engine::sampler::SamplingParams;
use crate::engine::tokenizer::Message;
use crate::engine::tools::{ToolCall, ToolFormat};
use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Most stop sequences a request may give.
pub const MAX_STOP_SEQUENCES: usize = 16;

pub fn routes() -> Router<Arc<AppState>> {
    Router::new().route("/v1/messages", post(messages)).route("/v1/messages/count_tokens", post(count_tokens))
}

/// Anthropic's error type for an HTTP status (what its SDKs map back to exception classes).
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// The error body in Anthropic's shape.
fn error_json(status: StatusCode, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}})
}

/// Rewrites the server's OpenAI-shaped errors into Anthropic's on the Messages endpoints, so
/// every layer's errors (body limits, methods, parsing) come out alike there.
pub async fn error_shape(request: Request, next: Next) -> Response {
    let anthropic = request.uri().path().starts_with("/v1/messages");
    let response = next.run(request).await;
    let status = response.status();
    if !anthropic || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_json = response.headers().get(CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20).await.unwrap_or_default();
    let parsed: Value = if is_json { serde_json::from_slice(&bytes).unwrap_or(Value::Null) } else { Value::Null };
    let message = match parsed["error"]["message"].as_str() {
        Some(m) => m.to_string(),
        None => String::from_utf8_lossy(&bytes).trim().to_string(),
    };
    let mut response = (parts.status, Json(error_json(parts.status, &message))).into_response();
    for name in ["retry-after", "allow"] {
        if let Some(v) = parts.headers.get(name) {
            response.headers_mut().insert(name, v.clone());
        }
    }
    response
}

/// Text out of a `content` that is a string or a list of text blocks.
fn text_of(value: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .enumerate()
            .map(|(i, b)| match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                (Some("text"), Some(t)) => Ok(t.to_string()),
                (Some(other), _) if other != "text" => Err(ApiError::bad_request(&format!("{param}[{i}].type"), &format!("`{other}` blocks are not supported here: only text"))),
                _ => Err(wrong(&format!("{param}[{i}]"), "a text block {\"type\": \"text\", \"text\": …}")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|parts| parts.join("")),
        Some(_) => Err(wrong(param, "a string or a list of text blocks")),
    }
}

/// The conversation as chat messages: `system` first; a user turn's `tool_result` blocks become
/// tool messages (before its text), an assistant turn's `tool_use` blocks its calls.
fn parse_messages(obj: &Map<String, Value>) -> Result<Vec<Message>, ApiError> {
    let mut out = Vec::new();
    let system = text_of(obj.get("system"), "system")?;
    if !system.is_empty() {
        out.push(Message::new("system", &system));
    }
    let items = obj.get("messages").and_then(Value::as_array).filter(|m| !m.is_empty()).ok_or_else(|| wrong("messages", "a non-empty list of messages"))?;
    for (i, m) in items.iter().enumerate() {
        let param = format!("messages[{i}]");
        let role = match m.get("role").and_then(Value::as_str) {
            Some(r @ ("user" | "assistant" | "system")) => r,
            _ => return Err(wrong(&format!("{param}.role"), "\"user\" or \"assistant\"")),
        };
        let blocks = match m.get("content") {
            Some(Value::String(s)) => {
                out.push(Message::new(role, s));
                continue;
            }
            Some(Value::Array(blocks)) => blocks,
            _ => return Err(wrong(&format!("{param}.content"), "a string or a list of content blocks")),
        };
        let (mut text, mut calls) = (String::new(), Vec::new());
        for (j, block) in blocks.iter().enumerate() {
            let bparam = format!("{param}.content[{j}]");
            match (role, block.get("type").and_then(Value::as_str)) {
                (_, Some("text")) => text.push_str(block.get("text").and_then(Value::as_str).ok_or_else(|| wrong(&format!("{bparam}.text"), "a string"))?),
                ("assistant", Some("tool_use")) => {
                    let name = block.get("name").and_then(Value::as_str).ok_or_else(|| wrong(&format!("{bparam}.name"), "a string"))?;
                    let input = match block.get("input") {
                        None | Some(Value::Null) => json!({}),
                        Some(v @ Value::Object(_)) => v.clone(),
                        Some(_) => return Err(wrong(&format!("{bparam}.input"), "an object")),
                    };
                    calls.push(json!({"id": block.get("id"), "type": "function", "function": {"name": name, "arguments": input}}));
                }
                ("user", Some("tool_result")) => {
                    let id = block.get("tool_use_id").and_then(Value::as_str).ok_or_else(|| wrong(&format!("{bparam}.tool_use_id"), "a string"))?;
                    let mut content = text_of(block.get("content"), &format!("{bparam}.content"))?;
                    if block.get("is_error").and_then(Value::as_bool) == Some(true) {
                        content = format!("Error: {content}");
                    }
                    let mut message = Message::new("tool", &content);
                    message.tool_call_id = Some(id.to_string());
                    out.push(message);
                }
                // Earlier reasoning is not fed back (as chat templates drop it).
                ("assistant", Some("thinking" | "redacted_thinking")) => {}
                (_, Some(other)) => {
                    return Err(ApiError::bad_request(&format!("{bparam}.type"), &format!("`{other}` blocks are not supported in {role} messages (text, tool_use and tool_result are)")))
                }
                (_, None) => return Err(wrong(&format!("{bparam}.type"), "a block type such as \"text\"")),
            }
        }
        if role == "assistant" {
            let mut message = Message::new(role, &text);
            message.tool_calls = (!calls.is_empty()).then_some(calls);
            out.push(message);
        } else if !text.is_empty() || !blocks.iter().any(|b| b.get("type").and_then(Value::as_str) == Some("tool_result")) {
            out.push(Message::new(role, &text));
        }
    }
    Ok(out)
}

/// `tools` as OpenAI function tools; server tools (web search, code execution, …) are refused.
fn parse_tools(obj: &Map<String, Value>) -> Result<Vec<Value>, ApiError> {
    let tools = match obj.get("tools") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(tools)) => tools,
        Some(_) => return Err(wrong("tools", "a list of tools")),
    };
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let param = format!("tools[{i}]");
            match tool.get("type").and_then(Value::as_str) {
                None | Some("custom") => {}
                Some(other) => return Err(ApiError::bad_request(&format!("{param}.type"), &format!("server tool `{other}` is not supported: give tools with a name and an input_schema"))),
            }
            let name = tool.get("name").and_then(Value::as_str).unwrap_or_default();
            if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                return Err(wrong(&format!("{param}.name"), "1 to 64 letters, digits, underscores or dashes"));
            }
            let schema = tool.get("input_schema").filter(|s| s.is_object()).ok_or_else(|| wrong(&format!("{param}.input_schema"), "a JSON Schema object"))?;
            let mut function = json!({"name": name, "parameters": schema});
            if let Some(d) = tool.get("description").and_then(Value::as_str) {
                function["description"] = json!(d);
            }
            Ok(json!({"type": "function", "function": function}))
        })
        .collect()
}

/// Anthropic's `effort` levels (they tune Claude's spending of tokens; here they change nothing).
const EFFORTS: [&str; 5] = ["low", "medium", "high", "xhigh", "max"];

/// `output_config.format` (or the older beta's top-level `output_format`): the JSON Schema the
/// answer's text must follow, held to it by the same grammar as OpenAI's `response_format`; with
/// the field naming the schema (for errors about it). Anything it cannot enforce is refused.
fn output_format(obj: &Map<String, Value>) -> Result<Option<(&'static str, Value)>, ApiError> {
    let config = match obj.get("output_config") {
        None | Some(Value::Null) => None,
        Some(Value::Object(c)) => Some(c),
        Some(_) => return Err(wrong("output_config", "an object such as {\"format\": {\"type\": \"json_schema\", \"schema\": {…}}}")),
    };
    for (key, value) in config.into_iter().flatten() {
        match (key.as_str(), value) {
            ("format", _) | ("effort", Value::Null) => {}
            ("effort", Value::String(e)) if EFFORTS.contains(&e.as_str()) => {}
            ("effort", _) => return Err(wrong("output_config.effort", &format!("one of {}", EFFORTS.join(", ")))),
            (other, _) => {
                return Err(ApiError::bad_request(&format!("output_config.{other}"), &format!("`output_config.{other}` is not supported (`format` and `effort` are)")))
            }
        }
    }
    let in_config = config.and_then(|c| c.get("format")).filter(|f| !f.is_null());
    let (param, format) = match (in_config, obj.get("output_format").filter(|f| !f.is_null())) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request("output_format", "give the format once: `output_format` is the older name of `output_config.format`"))
        }
        (Some(f), None) => ("output_config.format", f),
        (None, Some(f)) => ("output_format", f),
        (None, None) => return Ok(None),
    };
    let format = format.as_object().ok_or_else(|| wrong(param, "an object such as {\"type\": \"json_schema\", \"schema\": {…}}"))?;
    let (type_param, schema_param) = match param {
        "output_format" => ("output_format.type", "output_format.schema"),
        _ => ("output_config.format.type", "output_config.format.schema"),
    };
    match format.get("type") {
        Some(Value::String(t)) if t == "json_schema" => {}
        Some(Value::String(t)) => return Err(ApiError::bad_request(type_param, &format!("`{type_param}` `{t}` is not supported: only \"json_schema\""))),
        _ => return Err(wrong(type_param, "\"json_schema\"")),
    }
    match format.get("schema") {
        Some(schema @ Value::Object(_)) => Ok(Some((schema_param, schema.clone()))),
        _ => Err(wrong(schema_param, "a JSON Schema object")),
    }
}

/// A Messages request as the chat endpoint's request; `thinking` says whether reasoning is
/// asked for (it is then shown as thinking blocks).
pub fn parse(body: &[u8], served_model: &str, tool_format: ToolFormat, counting: bool) -> Result<(ChatRequest, bool), ApiError> {
    let obj = &json_object(body)?;
    check_model(obj, served_model)?;
    let max_tokens = integer(obj, "max_tokens", 1)?;
    if max_tokens.is_none() && !counting {
        return Err(ApiError::bad_request("max_tokens", "`max_tokens` is required: the most tokens to generate"));
    }
    let messages = parse_messages(obj)?;
    let tools = parse_tools(obj)?;
    let names: Vec<&str> = tools.iter().filter_map(|t| t["function"]["name"].as_str()).collect();
    let (choice, parallel) = match obj.get("tool_choice") {
        None | Some(Value::Null) => (Some(ToolChoice::Auto), true),
        Some(Value::Object(c)) => {
            let parallel = !boolean(c, "disable_parallel_tool_use")?.unwrap_or(false);
            let choice = match c.get("type").and_then(Value::as_str) {
                Some("auto") => Some(ToolChoice::Auto),
                Some("any") => Some(ToolChoice::Required),
                Some("none") => None,
                Some("tool") => match c.get("name").and_then(Value::as_str) {
                    Some(name) if names.contains(&name) => Some(ToolChoice::Function(name.to_string())),
                    Some(name) => return Err(ApiError::bad_request("tool_choice.name", &format!("`tool_choice` names `{name}`, which is not in `tools`"))),
                    None => return Err(wrong("tool_choice.name", "the name of one of the tools")),
                },
                _ => return Err(wrong("tool_choice.type", "\"auto\", \"any\", \"tool\" or \"none\"")),
            };
            (choice, parallel)
        }
        Some(_) => return Err(wrong("tool_choice", "an object such as {\"type\": \"auto\"}")),
    };
    if tools.is_empty() && matches!(choice, Some(ToolChoice::Required | ToolChoice::Function(_))) {
        return Err(ApiError::bad_request("tool_choice", "`tool_choice` asks for a tool call but no `tools` are given"));
    }
    let (tools, tool_choice) = match choice {
        Some(choice) => (tools, choice),
        None => (Vec::new(), ToolChoice::Auto),
    };
    let thinking = match obj.get("thinking") {
        None | Some(Value::Null) => false,
        Some(t) => match t.get("type").and_then(Value::as_str) {
            Some("enabled" | "adaptive") => true,
            Some("disabled") => false,
            _ => return Err(wrong("thinking.type", "\"enabled\" or \"disabled\"")),
        },
    };
    let stop = match obj.get("stop_sequences") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => {
            let stops = items.iter().map(|v| v.as_str().filter(|s| !s.is_empty()).map(str::to_string)).collect::<Option<Vec<_>>>();
            let stops = stops.ok_or_else(|| wrong("stop_sequences", "a list of non-empty strings"))?;
            if stops.len() > MAX_STOP_SEQUENCES {
                return Err(ApiError::bad_request("stop_sequences", &format!("at most {MAX_STOP_SEQUENCES} stop sequences")));
            }
            stops
        }
        Some(_) => return Err(wrong("stop_sequences", "a list of non-empty strings")),
    };
    let (response_format_param, response_format) = match output_format(obj)? {
        Some((param, schema)) => (param, Some(schema)),
        None => ("output_config.format.schema", None),
    };
    let sampling = SamplingParams {
        temperature: number(obj, "temperature", 0.0..=1.0)?.unwrap_or(1.0) as f32,
        top_p: (number(obj, "top_p", 0.0..=1.0)?.unwrap_or(1.0) as f32).max(f32::MIN_POSITIVE),
        top_k: integer(obj, "top_k", 0)?.unwrap_or(0) as usize,
        ..Default::default()
    };
    sampling.validate().map_err(|e| ApiError::bad_request(e.field, &format!("`{}` {}", e.field, e.rule)))?;
    // Anthropic has no min_p nor repetition penalty: those stay the model's (or off).
    let sampling_set = SamplingChoice { min_p: None, repetition_penalty: None, ..openai::sampling_set(obj, &sampling) };
    let request = ChatRequest {
        messages,
        sampling,
        sampling_set,
        max_tokens: Some(max_tokens.map_or(1, |n| usize::try_from(n).unwrap_or(usize::MAX))),
        ignore_eos: false,
        stop,
        stream: boolean(obj, "stream")?.unwrap_or(false),
        include_usage: false,
        enable_thinking: thinking,
        tools,
        tool_choice,
        parallel_tool_calls: parallel,
        tool_format,
        response_format,
        response_format_param,
        logprobs: None,
        cap_max_tokens: true,
    };
    Ok((request, thinking))
}

/// Anthropic's ids: a prefix and 24 random hex digits.
fn random_id(prefix: &str) -> String {
    format!("{prefix}_{:024x}", rand::random::<u128>() >> 32)
}

fn tool_use(call: &ToolCall) -> Value {
    let input: Value = serde_json::from_str(&call.arguments).ok().filter(Value::is_object).unwrap_or_else(|| json!({}));
    json!({"type": "tool_use", "id": random_id("toolu"), "name": call.name, "input": input})
}

/// Why the answer ended, in Anthropic's words.
fn stop_reason(finish_reason: &str, stop_sequence: &Option<String>, called: bool) -> &'static str {
    // Cut by max_tokens after complete calls is still max_tokens: the answer is not whole.
    match (called, finish_reason, stop_sequence) {
        (_, "length", _) => "max_tokens",
        (true, _, _) => "tool_use",
        (_, _, Some(_)) => "stop_sequence",
        _ => "end_turn",
    }
}

/// Prompt tokens as Anthropic counts them: those read from the prefix cache apart.
fn usage(prompt_tokens: usize, completion_tokens: usize, cached_tokens: usize) -> Value {
    json!({"input_tokens": prompt_tokens - cached_tokens.min(prompt_tokens), "output_tokens": completion_tokens,
           "cache_read_input_tokens": cached_tokens, "cache_creation_input_tokens": 0})
}

async fn messages(
    State(state): State<Arc<AppState>>,
    Extension(peer): Extension<super::Peer>,
    Extension(log): Extension<super::log::RequestLog>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let received = std::time::Instant::now();
    let (bytes, lease) = super::accept(&state, &headers, body, &log).await?;
    let (prepared, thinking) = super::prepare_blocking(&state, &lease, bytes.len(), move |served| {
        let (request, thinking) = parse(&bytes, served.model_id, served.tool_format, false)?;
        Ok((openai::prepare(request, served)?, thinking))
    })
    .await?;
    let openai::PreparedChat { request, prompt_text, prompt, max_tokens, stop, constraint } = prepared;
    let tools = (!request.tools.is_empty()).then_some((request.tool_format, request.tools.as_slice()));
    let mut parser = AnswerParser::new(&prompt_text, tools, request.parallel_tool_calls);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let prompt_tokens = prompt.len();
    let job = Job { prompt, sampling: request.sampling.clone(), constraint, max_tokens, ignore_eos: false, stop, logprobs: LogprobOptions::default(), received, events: tx, lease: None };
    super::submit(&lease, job)?;
    let id = random_id("msg");
    let model = lease.id.clone();
    if request.stream {
        log.streaming();
        return Ok(stream(id, model, prompt_tokens, thinking, parser, rx, log));
    }
    peer.unless_hung_up(async move {
    let (mut reasoning, mut text, mut calls) = (String::new(), String::new(), Vec::new());
    while let Some(event) = rx.recv().await {
        log.see(&event);
        match event {
            Event::Text { text: piece, .. } => {
                let d = parser.push(&piece);
                reasoning.push_str(&d.reasoning);
                text.push_str(&d.content);
                calls.extend(d.calls);
            }
            Event::Started { .. } | Event::PromptLogprobs(_) => {}
            Event::Error(e) => return Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", "generation_failed", None, &e)),
            Event::Shutdown => return Err(super::shutting_down()),
            Event::Done { finish_reason, stop_sequence, prompt_tokens, completion_tokens, cached_tokens, .. } => {
                let d = parser.finish(finish_reason);
                reasoning.push_str(&d.reasoning);
                text.push_str(&d.content);
                calls.extend(d.calls);
                let mut content = Vec::new();
                if thinking && !reasoning.trim().is_empty() {
                    content.push(json!({"type": "thinking", "thinking": reasoning.trim(), "signature": ""}));
                }
                if !text.is_empty() || calls.is_empty() {
                    content.push(json!({"type": "text", "text": text}));
                }
                content.extend(calls.iter().map(tool_use));
                return Ok(Json(json!({
                    "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
                    "stop_reason": stop_reason(finish_reason, &stop_sequence, !calls.is_empty()),
                    "stop_sequence": stop_sequence,
                    "usage": usage(prompt_tokens, completion_tokens, cached_tokens),
                }))
                .into_response());
            }
        }
    }
    Err(super::worker_gone())
    })
    .await
}

/// The block being streamed.
#[derive(Clone, Copy, PartialEq)]
enum Open {
    Nothing,
    Thinking,
    Text,
}

/// The answer as Anthropic's event stream: `message_start`, a `ping`, each content block as
/// `content_block_start`, deltas and `content_block_stop`, then `message_delta` (stop reason,
/// usage) and `message_stop`; an error mid-way is an `error` event. `message_start` waits for
/// the request's admission, where the prefix cache says how many prompt tokens it holds, so that
/// it and `message_delta` split the prompt alike.
fn stream(
    id: String,
    model: String,
    prompt_tokens: usize,
    thinking: bool,
    mut parser: AnswerParser,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    log: super::log::RequestLog,
) -> Response {
    let (out, out_rx) = tokio::sync::mpsc::unbounded_channel::<Result<SseEvent, std::convert::Infallible>>();
    tokio::spawn(async move {
        let send = |kind: &str, data: Value| out.send(Ok(SseEvent::default().event(kind).data(data.to_string()))).is_ok();
        // Until admitted, a client that leaves must still close the request's channel.
        let first = tokio::select! {
            first = rx.recv() => first,
            _ = out.closed() => return,
        };
        let (cached, first) = match first {
            Some(Event::Started { cached_tokens }) => (cached_tokens, None),
            other => (0, other),
        };
        let start = json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null, "usage": usage(prompt_tokens, 0, cached)}});
        if !(send("message_start", start) && send("ping", json!({"type": "ping"}))) {
            return;
        }
        let (mut open, mut index, mut blocks, mut called) = (Open::Nothing, 0usize, 0usize, false);
        // Closes the open block (if any) and opens `next` when it differs.
        let switch = |to: Open, open: &mut Open, index: &mut usize, blocks: &mut usize| -> bool {
            if *open == to {
                return true;
            }
            let mut ok = true;
            if *open != Open::Nothing {
                ok &= send("content_block_stop", json!({"type": "content_block_stop", "index": *index}));
                *index += 1;
            }
            let block = match to {
                Open::Nothing => None,
                Open::Thinking => Some(json!({"type": "thinking", "thinking": "", "signature": ""})),
                Open::Text => Some(json!({"type": "text", "text": ""})),
            };
            if let Some(block) = block {
                ok &= send("content_block_start", json!({"type": "content_block_start", "index": *index, "content_block": block}));
                *blocks += 1;
            }
            *open = to;
            ok
        };
        let piece = |d: super::answer::Delta, open: &mut Open, index: &mut usize, blocks: &mut usize, called: &mut bool| -> bool {
            let mut ok = true;
            if thinking && !d.reasoning.is_empty() {
                ok &= switch(Open::Thinking, open, index, blocks);
                ok &= send("content_block_delta", json!({"type": "content_block_delta", "index": *index, "delta": {"type": "thinking_delta", "thinking": d.reasoning}}));
            }
            if !d.content.is_empty() {
                ok &= switch(Open::Text, open, index, blocks);
                ok &= send("content_block_delta", json!({"type": "content_block_delta", "index": *index, "delta": {"type": "text_delta", "text": d.content}}));
            }
            for call in &d.calls {
                ok &= switch(Open::Nothing, open, index, blocks);
                let mut block = tool_use(call);
                let input = std::mem::replace(&mut block["input"], json!({}));
                ok &= send("content_block_start", json!({"type": "content_block_start", "index": *index, "content_block": block}));
                ok &= send("content_block_delta", json!({"type": "content_block_delta", "index": *index, "delta": {"type": "input_json_delta", "partial_json": input.to_string()}}));
                ok &= send("content_block_stop", json!({"type": "content_block_stop", "index": *index}));
                *index += 1;
                *blocks += 1;
                *called = true;
            }
            ok
        };
        let mut pending = first;
        while let Some(event) = match pending.take() {
            Some(event) => Some(event),
            None => rx.recv().await,
        } {
            log.see(&event);
            let more = match event {
                Event::Text { text, .. } => piece(parser.push(&text), &mut open, &mut index, &mut blocks, &mut called),
                Event::Started { .. } | Event::PromptLogprobs(_) => true,
                Event::Error(e) => {
                    send("error", error_json(StatusCode::INTERNAL_SERVER_ERROR, &format!("generation failed: {e}")));
                    false
                }
                Event::Shutdown => {
                    send("error", error_json(StatusCode::SERVICE_UNAVAILABLE, &super::shutting_down().message));
                    false
                }
                Event::Done { finish_reason, stop_sequence, prompt_tokens, completion_tokens, cached_tokens, .. } => {
                    piece(parser.finish(finish_reason), &mut open, &mut index, &mut blocks, &mut called);
                    // An empty answer is still one (empty) text block, as the whole message has.
                    if blocks == 0 {
                        switch(Open::Text, &mut open, &mut index, &mut blocks);
                    }
                    switch(Open::Nothing, &mut open, &mut index, &mut blocks);
                    let mut usage = usage(prompt_tokens, completion_tokens, cached_tokens);
                    usage.as_object_mut().map(|u| u.remove("cache_creation_input_tokens"));
                    send("message_delta", json!({"type": "message_delta",
                        "delta": {"stop_reason": stop_reason(finish_reason, &stop_sequence, called), "stop_sequence": stop_sequence},
                        "usage": usage}));
                    send("message_stop", json!({"type": "message_stop"}));
                    log.finished();
                    false
                }
            };
            if !more {
                break;
            }
        }
    });
    Sse::new(tokio_stream::wrappers::UnboundedReceiverStream::new(out_rx)).keep_alive(KeepAlive::default()).into_response()
}

async fn count_tokens(
    State(state): State<Arc<AppState>>,
    Extension(log): Extension<super::log::RequestLog>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let (bytes, lease) = super::accept(&state, &headers, body, &log).await?;
    let counted = super::prepare_blocking(&state, &lease, bytes.len(), move |served| {
        let (request, _) = parse(&bytes, served.model_id, served.tool_format, true)?;
        Ok(openai::prepare(request, served)?.prompt.len())
    })
    .await?;
    Ok(Json(json!({"input_tokens": counted})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_body(body: Value) -> Result<(ChatRequest, bool), ApiError> {
        parse(body.to_string().as_bytes(), "m", ToolFormat::Hermes, false)
    }

    #[test]
    fn blocks_become_chat_messages() {
        let (r, thinking) = parse_body(json!({
            "model": "m", "max_tokens": 10,
            "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "toolu_1", "name": "get", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]}, {"type": "text", "text": "And?"}]},
            ],
            "tools": [{"name": "get", "description": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "stop_sequences": ["\n\n"],
        }))
        .unwrap();
        assert!(!thinking);
        let roles: Vec<&str> = r.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(r.messages[0].content, "Be brief.");
        assert_eq!(r.messages[2].tool_calls.as_ref().unwrap()[0]["function"]["arguments"], json!({"city": "Paris"}));
        assert_eq!((r.messages[3].content.as_str(), r.messages[3].tool_call_id.as_deref()), ("sunny", Some("toolu_1")));
        assert_eq!(r.tools[0]["function"]["parameters"]["properties"]["city"]["type"], "string");
        assert_eq!((r.tool_choice.clone(), r.parallel_tool_calls, r.stop.clone(), r.max_tokens), (ToolChoice::Required, false, vec!["\n\n".to_string()], Some(10)));
    }

    #[test]
    fn output_formats_become_the_chat_response_format() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
        let base = json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
        let mut config = base.clone();
        config["output_config"] = json!({"format": {"type": "json_schema", "schema": schema}, "effort": "low"});
        let (r, _) = parse_body(config).unwrap();
        assert_eq!((r.response_format.as_ref(), r.response_format_param), (Some(&schema), "output_config.format.schema"));
        let mut older = base.clone();
        older["output_format"] = json!({"type": "json_schema", "schema": schema});
        let (r, _) = parse_body(older).unwrap();
        assert_eq!((r.response_format.as_ref(), r.response_format_param), (Some(&schema), "output_format.schema"));
        assert_eq!(parse_body(base).unwrap().0.response_format, None);
    }

    #[test]
    fn a_cut_answer_stops_for_max_tokens_even_after_calls() {
        assert_eq!(stop_reason("length", &None, true), "max_tokens");
        assert_eq!(stop_reason("stop", &None, true), "tool_use");
        assert_eq!(stop_reason("stop", &Some("x".into()), false), "stop_sequence");
        assert_eq!(stop_reason("stop", &None, false), "end_turn");
    }

    #[test]
    fn bad_requests_name_the_field() {
        let base = json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            b
        };
        for (param, body) in [
            ("max_tokens", json!({"messages": [{"role": "user", "content": "hi"}]})),
            ("messages", with("messages", json!([]))),
            ("messages[0].content[0].type", with("messages", json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]))),
            ("tools[0].type", with("tools", json!([{"type": "web_search_20250305", "name": "web_search"}]))),
            ("tools[0].input_schema", with("tools", json!([{"name": "f"}]))),
            ("tool_choice.name", with("tool_choice", json!({"type": "tool", "name": "absent"}))),
            ("temperature", with("temperature", json!(1.5))),
            ("stop_sequences", with("stop_sequences", json!([""]))),
            ("output_config", with("output_config", json!("json"))),
            ("output_config.format", with("output_config", json!({"format": "json"}))),
            ("output_config.format.type", with("output_config", json!({"format": {"type": "xml", "schema": {}}}))),
            ("output_config.format.schema", with("output_config", json!({"format": {"type": "json_schema", "schema": "x"}}))),
            ("output_config.effort", with("output_config", json!({"effort": "extreme"}))),
            ("output_config.task_budget", with("output_config", json!({"task_budget": 10}))),
            ("output_format.type", with("output_format", json!({"type": "regex", "schema": {}}))),
            ("output_format", {
                let mut b = with("output_format", json!({"type": "json_schema", "schema": {}}));
                b["output_config"] = json!({"format": {"type": "json_schema", "schema": {}}});
                b
            }),
        ] {
            let e = parse_body(body).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{}", e.message);
        }
        assert!(parse(base.to_string().as_bytes(), "m", ToolFormat::Hermes, true).is_ok());
        assert_eq!(error_json(StatusCode::UNAUTHORIZED, "x")["error"]["type"], "authentication_error");
        assert_eq!(error_json(StatusCode::NOT_FOUND, "x")["error"]["type"], "not_found_error");
    }
}
