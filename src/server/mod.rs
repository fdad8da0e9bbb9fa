//! `sala serve`: an OpenAI-compatible HTTP API (axum). The model loads in the background
//! (`/health` answers 503 until it is ready) on the worker thread that then serves every request
//! ([`scheduler`]). Errors follow OpenAI's schema: `{"error": {"message", "type", "param", "code"}}`.

pub mod answer;
pub mod models;
pub mod openai;
pub mod scheduler;

use crate::cli::{load, ModelArgs};
use crate::engine::tokenizer::TextTokenizer;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use answer::AnswerParser;
use openai::{ApiError, ChatRequest};
use scheduler::{Event, Job};
use serde_json::json;
use std::sync::{Arc, Mutex, OnceLock};

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 8 << 20;

/// What the worker publishes once the model is loaded.
pub struct Ready {
    pub tokenizer: Arc<TextTokenizer>,
    pub jobs: Mutex<std::sync::mpsc::Sender<Job>>,
    pub max_context: usize,
}

pub struct AppState {
    pub model_id: String,
    /// Where the served model is (a store name resolved to its snapshot).
    pub model_path: std::path::PathBuf,
    pub downloads: Mutex<Vec<Arc<models::Download>>>,
    pub api_key: Option<String>,
    pub ready: OnceLock<Ready>,
    pub load_error: OnceLock<String>,
    pub default_max_tokens: usize,
}

pub struct ServerOptions {
    pub host: String,
    pub port: u16,
    pub api_key: Option<String>,
    /// Answer length when a request gives none.
    pub default_max_tokens: usize,
    /// Requests decoded together.
    pub parallel: usize,
}

/// Binds, starts loading the model on the worker thread, and serves until Ctrl-C.
pub fn serve(model: ModelArgs, options: ServerOptions) -> anyhow::Result<()> {
    let ServerOptions { host, port, api_key, default_max_tokens, parallel } = options;
    let path = model.model_or_default()?;
    let state = Arc::new(AppState {
        model_id: path.display().to_string(),
        model_path: crate::store::cache::resolve(&path).unwrap_or_else(|_| path.clone()),
        downloads: Mutex::new(Vec::new()),
        api_key,
        ready: OnceLock::new(),
        load_error: OnceLock::new(),
        default_max_tokens,
    });
    let worker_state = state.clone();
    let prefill_step = model.runtime.prefill_step;
    std::thread::Builder::new().name("sala-worker".into()).spawn(move || {
        let loaded = match load(&model, default_max_tokens) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("error: loading {}: {e:#}", model.model.as_ref().map(|p| p.display().to_string()).unwrap_or_default());
                let _ = worker_state.load_error.set(format!("{e:#}"));
                return;
            }
        };
        let Some(tokenizer) = loaded.tokenizer else {
            let _ = worker_state.load_error.set("the model has no tokenizer, which the chat API needs".into());
            return;
        };
        let tokenizer = Arc::new(tokenizer);
        let (tx, rx) = std::sync::mpsc::channel();
        let max_context = loaded.model.info().max_context;
        let _ = worker_state.ready.set(Ready { tokenizer: tokenizer.clone(), jobs: Mutex::new(tx), max_context });
        eprintln!("model ready: {}", worker_state.model_id);
        scheduler::run(loaded.model, tokenizer, prefill_step, parallel, rx);
    })?;

    let app = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models::list))
        .route("/v1/models/download", post(models::download).get(models::downloads))
        .route("/v1/models/{*id}", axum::routing::delete(models::delete))
        .route("/v1/chat/completions", post(chat_completions))
        .fallback(|| async { ApiError::not_found("no such endpoint").into_response() })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", "method_not_allowed", None, "this endpoint does not take that method").into_response()
        })
        .with_state(state);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((host.as_str(), port)).await?;
        eprintln!("listening on http://{}", listener.local_addr()?);
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        Ok(())
    })
}

pub(crate) fn authorized(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.api_key else { return Ok(()) };
    let given = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(key.as_str()) {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", "invalid_api_key", None, "missing or wrong API key (Authorization: Bearer KEY)"))
    }
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.ready.get().is_some() {
        (StatusCode::OK, Json(json!({"status": "ok", "model": state.model_id}))).into_response()
    } else if let Some(e) = state.load_error.get() {
        (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"status": "error", "error": e}))).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "loading"}))).into_response()
    }
}

async fn chat_completions(State(state): State<Arc<AppState>>, headers: HeaderMap, body: axum::body::Body) -> Response {
    match chat(state, headers, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn chat(state: Arc<AppState>, headers: HeaderMap, body: axum::body::Body) -> Result<Response, ApiError> {
    authorized(&state, &headers)?;
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES).await.map_err(|_| {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", "request_too_large", None, &format!("the request body is over {MAX_BODY_BYTES} bytes"))
    })?;
    let request = ChatRequest::parse(&bytes, &state.model_id)?;
    let Some(ready) = state.ready.get() else {
        return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "model_loading", None, "the model is still loading; retry shortly (GET /health says when it is ready)"));
    };
    let mut prompt_text = ready
        .tokenizer
        .apply_chat_template_with_tools(&request.messages, &request.tools, request.enable_thinking)
        .map_err(|e| ApiError::bad_request("messages", &e.to_string()))?;
    // tool_choice required/named: the answer is started as a call, so the model has to make one.
    let forced = if request.tools.is_empty() { String::new() } else { request.tool_choice.forced_prefix() };
    prompt_text.push_str(&forced);
    let tool_names = (!request.tools.is_empty()).then(|| request.tool_names.clone());
    let parser = AnswerParser::new(&prompt_text, tool_names, &forced, request.parallel_tool_calls);
    let prompt = ready.tokenizer.encode(&prompt_text).map_err(|e| ApiError::bad_request("messages", &e.to_string()))?;
    let max_tokens = request.max_tokens.unwrap_or(state.default_max_tokens.min(ready.max_context.saturating_sub(prompt.len())).max(1));
    if prompt.len() + max_tokens > ready.max_context {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "context_length_exceeded",
            Some("messages"),
            &format!(
                "this model's context is {} tokens; the messages take {} and max_tokens asks for {} more",
                ready.max_context,
                prompt.len(),
                max_tokens
            ),
        ));
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut stop = request.stop.clone();
    if !request.tools.is_empty() && matches!(request.tool_choice, openai::ToolChoice::Function(_)) {
        // One named call is all that was asked for: end the answer when it is complete.
        stop.push(crate::engine::tools::CALL_CLOSE.to_string());
    }
    let job = Job { prompt, sampling: request.sampling.clone(), max_tokens, stop, events: tx };
    ready
        .jobs
        .lock()
        .expect("jobs lock")
        .send(job)
        .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "worker_gone", None, "the model worker stopped"))?;
    let id = openai::completion_id();
    let created = openai::now();
    if request.stream {
        let model = state.model_id.clone();
        let include_usage = request.include_usage;
        let stream = async_stream(id, created, model, include_usage, parser, rx);
        return Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response());
    }
    let mut parser = parser;
    let (mut reasoning, mut content) = (String::new(), String::new());
    while let Some(event) = rx.recv().await {
        match event {
            Event::Text(t) => {
                let d = parser.push(&t);
                reasoning.push_str(&d.reasoning);
                content.push_str(&d.content);
            }
            Event::Error(e) => return Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", "generation_failed", None, &e)),
            Event::Done { finish_reason, prompt_tokens, completion_tokens } => {
                let (d, calls) = parser.finish();
                reasoning.push_str(&d.reasoning);
                content.push_str(&d.content);
                let mut message = json!({"role": "assistant", "content": content});
                if !reasoning.trim().is_empty() {
                    message["reasoning_content"] = json!(reasoning.trim());
                }
                let finish_reason = if calls.is_empty() {
                    finish_reason
                } else {
                    if content.is_empty() {
                        message["content"] = serde_json::Value::Null;
                    }
                    message["tool_calls"] = answer::tool_calls_json(&calls, false);
                    "tool_calls"
                };
                return Ok(Json(json!({
                    "id": id, "object": "chat.completion", "created": created, "model": state.model_id,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
                    "usage": openai::usage(prompt_tokens, completion_tokens),
                }))
                .into_response());
            }
        }
    }
    Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "worker_gone", None, "the model worker stopped"))
}

/// The SSE chunks of a streamed completion, ending with `data: [DONE]`. A task converts the
/// worker's events; when the client goes away the stream is dropped, the task ends, and the
/// worker sees the request's channel closed.
fn async_stream(
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    mut parser: AnswerParser,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> impl tokio_stream::Stream<Item = Result<SseEvent, std::convert::Infallible>> {
    let (out, out_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let chunk = |delta: serde_json::Value, finish: Option<&str>| {
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        };
        let send = |v: serde_json::Value| out.send(Ok(SseEvent::default().data(v.to_string()))).is_ok();
        if !send(chunk(json!({"role": "assistant", "content": ""}), None)) {
            return;
        }
        while let Some(event) = rx.recv().await {
            let more = match event {
                Event::Text(t) => parser.push(&t).chunks().into_iter().all(|delta| send(chunk(delta, None))),
                Event::Error(e) => {
                    send(json!({"error": {"message": e, "type": "server_error", "param": null, "code": "generation_failed"}}));
                    false
                }
                Event::Done { finish_reason, prompt_tokens, completion_tokens } => {
                    let (rest, calls) = parser.finish();
                    for delta in rest.chunks() {
                        send(chunk(delta, None));
                    }
                    let finish_reason = if calls.is_empty() {
                        finish_reason
                    } else {
                        send(chunk(json!({"tool_calls": answer::tool_calls_json(&calls, true)}), None));
                        "tool_calls"
                    };
                    send(chunk(json!({}), Some(finish_reason)));
                    if include_usage {
                        let mut last = chunk(json!({}), None);
                        last["choices"] = json!([]);
                        last["usage"] = openai::usage(prompt_tokens, completion_tokens);
                        send(last);
                    }
                    false
                }
            };
            if !more {
                break;
            }
        }
        let _ = out.send(Ok(SseEvent::default().data("[DONE]")));
    });
    tokio_stream::wrappers::UnboundedReceiverStream::new(out_rx)
}
