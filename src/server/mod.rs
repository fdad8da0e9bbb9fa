//! `sala serve`: an OpenAI-compatible HTTP API (axum), with Anthropic's Messages API beside it
//! ([`anthropic`]), vLLM's tokenizer endpoints ([`tokenize`]), Prometheus metrics ([`metrics`])
//! and a log line per request ([`log`]). The model loads in the background
//! (`/health` answers 503 until it is ready) on the worker thread that then serves every request
//! ([`scheduler`]). Errors follow OpenAI's schema: `{"error": {"message", "type", "param", "code"}}`,
//! whichever layer makes them (Anthropic's endpoints rewrite them into theirs). Clients that stall
//! sending a request are dropped; SIGINT and SIGTERM drain (running requests finish, up to a
//! deadline) before the process exits.

pub mod anthropic;
pub mod answer;
pub mod completions;
mod connection;
pub mod log;
pub mod metrics;
pub mod models;
pub mod openai;
pub mod pool;
pub mod scheduler;
pub mod tokenize;

use crate::load::LoadOptions;
use crate::progress::{bytes_progress, progress_to};
use crate::engine::generation_config::GenerationDefaults;
use crate::engine::prefix_cache::{PrefixCache, SNAPSHOT_SPACING};
use crate::engine::tools::ToolFormat;
use crate::engine::state_file::StateDir;
use crate::engine::tokenizer::TextTokenizer;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use answer::AnswerParser;
pub(crate) use connection::Peer;
use openai::ApiError;
use scheduler::{Event, Job};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Largest request body accepted.
pub const MAX_BODY_BYTES: usize = 8 << 20;
/// Largest body of the model-management requests (a few fields).
pub const MAX_SMALL_BODY_BYTES: usize = 64 << 10;

/// What the worker publishes once the model is loaded.
pub struct Ready {
    pub tokenizer: Arc<TextTokenizer>,
    /// Taken at shutdown, once running requests are done: the worker then stops.
    pub jobs: Mutex<Option<std::sync::mpsc::Sender<Job>>>,
    pub max_context: usize,
    pub vocab_size: usize,
    /// The ids that end an answer.
    pub eos: Vec<u32>,
    pub tool_format: ToolFormat,
    /// The model's `generation_config.json` sampling defaults, for what a request leaves out.
    pub generation: GenerationDefaults,
}

/// `serve`'s prompt tokens a forward pass with nothing decoding (`--prefill-step` unset): a
/// recurrent model's restart points for the prefix cache fall at chunk ends, so chunks of the
/// points' spacing keep them that close, and a request arriving mid-chunk waits less.
pub const SERVE_PREFILL_STEP: usize = SNAPSHOT_SPACING;

pub struct AppState {
    /// The models served: the one given with --model, or the store's, loaded on demand.
    pub pool: pool::Pool,
    pub downloads: Mutex<Vec<Arc<models::Download>>>,
    pub api_key: Option<String>,
    /// Listening beyond this machine without an API key: model management is refused and no
    /// filesystem path is shown.
    pub public: bool,
    pub default_max_tokens: usize,
    /// How long a client may take to send a request's body.
    pub read_timeout: Duration,
    /// Set at SIGINT/SIGTERM: new requests are refused while the running ones finish.
    pub draining: AtomicBool,
    /// Set when the drain's deadline passes: the worker ends every request it holds.
    pub abort: Arc<AtomicBool>,
    /// `GET /v1/models` entries by model path (a model's files do not change under a snapshot).
    pub descriptions: tokio::sync::Mutex<std::collections::HashMap<std::path::PathBuf, serde_json::Value>>,
    pub metrics: Arc<metrics::Metrics>,
    /// Turns of large request bodies at being prepared ([`prepare_blocking`]).
    pub large_bodies: tokio::sync::Semaphore,
}

pub struct ServerOptions {
    pub host: String,
    pub port: u16,
    pub api_key: Option<String>,
    /// Answer length when a request gives none.
    pub default_max_tokens: usize,
    /// Requests decoded together.
    pub parallel: usize,
    /// How long a client may take to send a request's headers, and its body.
    pub read_timeout: Duration,
    /// At SIGINT/SIGTERM, how long running requests may take to finish before they are ended.
    pub shutdown_timeout: Duration,
    /// Bytes of prompt states kept for reuse; `None`: a quarter of the memory free once the
    /// model is loaded.
    pub cache_memory: Option<u64>,
    /// Bytes the running requests' caches share; `None`: what is free once the model is loaded,
    /// less the prefix cache and an eighth.
    pub kv_memory: Option<u64>,
    /// Where kept prompt states are saved at shutdown and read back at start.
    pub prompt_cache_dir: Option<std::path::PathBuf>,
    /// The tool-call syntax, when not the model's own.
    pub tool_format: Option<ToolFormat>,
    /// Prompt tokens per forward pass during prefill.
    pub prefill_step: usize,
    /// Serving the store: the most models loaded at once.
    pub max_models: usize,
    /// Serving the store: how long a model may stay idle before it is unloaded (`None`: kept).
    pub keep_alive: Option<Duration>,
    /// With `--model`: the name clients may use and `/v1/models` lists.
    pub alias: Option<String>,
    pub log_format: log::LogFormat,
    pub log_level: log::LogLevel,
}

/// Binds, starts loading the model on the worker thread, and serves until SIGINT or SIGTERM,
/// then drains: no new requests, running ones finish (or are ended at `shutdown_timeout`).
pub fn serve(model: LoadOptions, options: ServerOptions) -> anyhow::Result<()> {
    let ServerOptions {
        host,
        port,
        api_key,
        default_max_tokens,
        parallel,
        read_timeout,
        shutdown_timeout,
        cache_memory,
        kv_memory,
        prompt_cache_dir,
        tool_format,
        prefill_step,
        max_models,
        keep_alive,
        alias,
        log_format,
        log_level,
    } = options;
    log::init(log_format, log_level);
    if alias.is_some() && model.model.is_none() {
        anyhow::bail!("--alias names the model given with --model; a server of the store serves each model by its store name (or the part after the `/`)");
    }
    // Without --model the store is served; an empty one gets the default model first.
    let fixed = match &model.model {
        Some(path) => Some(path.clone()),
        None if crate::store::cache::list(&crate::store::cache::cache_dir()).unwrap_or_default().is_empty() => {
            model.model_or_default()?;
            None
        }
        None => None,
    };
    if let Some(dir) = &prompt_cache_dir {
        StateDir::check_writable(dir).map_err(|e| anyhow::anyhow!("--prompt-cache-dir {}: {e}; pass a folder this user can write", dir.display()))?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let listener = runtime.block_on(tokio::net::TcpListener::bind((host.as_str(), port)))?;
    let address = listener.local_addr()?;
    let public = !address.ip().is_loopback() && api_key.is_none();
    if public {
        eprintln!(
            "WARNING: listening on {address} without --api-key: anyone who can reach this port can use the model. \
             Model downloads and deletions are refused and paths are hidden; pass --api-key KEY to allow them."
        );
    }
    let settings = pool::WorkerSettings { load: model, default_max_tokens, prefill_step, parallel, cache_memory, kv_memory, prompt_cache_dir, tool_format };
    let pool = match &fixed {
        // Clients name the model by a short id (or its path, as llama.cpp's server does); a
        // public server takes no path.
        Some(path) => pool::Pool::fixed(
            models::names_of(path, alias.as_deref(), public),
            crate::store::cache::resolve(path).unwrap_or_else(|_| path.clone()),
            settings,
        ),
        None => pool::Pool::store(max_models, keep_alive, settings),
    };
    let state = Arc::new(AppState {
        pool,
        downloads: Mutex::new(Vec::new()),
        api_key,
        public,
        default_max_tokens,
        read_timeout,
        draining: AtomicBool::new(false),
        abort: Arc::new(AtomicBool::new(false)),
        descriptions: tokio::sync::Mutex::new(std::collections::HashMap::new()),
        metrics: Arc::new(metrics::Metrics::new()),
        large_bodies: tokio::sync::Semaphore::new(LARGE_BODY_UNITS_AT_ONCE),
    });
    if state.pool.fixed {
        pool::start_worker(&state, state.pool.only());
    } else {
        let keep = state.pool.keep_alive.map_or("never".to_string(), |d| humantime::format_duration(d).to_string());
        eprintln!("serving the model store ({}): models load on first request, at most {} at once, unloaded after {keep} idle", crate::store::cache::cache_dir().display(), state.pool.max_models);
        runtime.spawn(pool::keep_alive(state.clone()));
    }

    let app = Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models::list))
        .route("/v1/models/download", post(models::download).get(models::downloads))
        .route("/v1/models/{*id}", axum::routing::delete(models::delete))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions::handle))
        .route("/metrics", get(metrics::get))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/tokenizer_info", get(tokenize::tokenizer_info))
        .merge(anthropic::routes())
        .fallback(|| async { ApiError::not_found("no such endpoint").into_response() })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", "method_not_allowed", None, "this endpoint does not take that method").into_response()
        })
        .layer(axum::middleware::map_response(json_errors))
        .layer(axum::middleware::from_fn(anthropic::error_shape))
        .layer(axum::middleware::from_fn_with_state(state.clone(), metrics::count_requests))
        .layer(axum::middleware::from_fn(log::log_requests))
        .with_state(state.clone());
    let shutdown_state = state.clone();
    runtime.block_on(async move {
        eprintln!("listening on http://{address}");
        let connections = hyper_util::server::graceful::GracefulShutdown::new();
        let mut http = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
        // A client that never finishes its request headers is dropped.
        http.http1().timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(read_timeout);
        let signal = shutdown_signal();
        tokio::pin!(signal);
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        Err(e) => {
                            // Out of file descriptors and the like: wait instead of spinning.
                            eprintln!("accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    };
                    let peer = Peer::of(&stream);
                    let app = app.clone();
                    let service = hyper_util::service::TowerToHyperService::new(tower::service_fn(move |mut request: axum::http::Request<hyper::body::Incoming>| {
                        request.extensions_mut().insert(peer.clone());
                        tower::ServiceExt::oneshot(app.clone(), request)
                    }));
                    let stream = connection::JsonParseErrors::new(stream);
                    let connection = http.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(stream), service).into_owned();
                    let connection = connections.watch(connection);
                    tokio::spawn(async move {
                        let _ = connection.await;
                    });
                }
                _ = &mut signal => break,
            }
        }
        drop(listener);
        state.draining.store(true, Ordering::SeqCst);
        for d in state.downloads.lock().expect("downloads lock").iter() {
            d.progress.cancel();
        }
        eprintln!("shutting down: {} connections to finish (at most {} s)", connections.count(), shutdown_timeout.as_secs());
        let drained = connections.shutdown();
        tokio::pin!(drained);
        if tokio::time::timeout(shutdown_timeout, &mut drained).await.is_err() {
            // Past the deadline: the worker ends what it holds, streams close with an error and [DONE].
            eprintln!("shutdown deadline reached: ending the running requests");
            state.abort.store(true, Ordering::SeqCst);
            let _ = tokio::time::timeout(Duration::from_secs(5), drained).await;
        }
        Ok::<(), anyhow::Error>(())
    })?;
    pool::stop_all(&shutdown_state.pool);
    eprintln!("stopped");
    Ok(())
}

/// A rank other than 0 of `sala serve --tp`: loads its part of the model and runs every round
/// rank 0's worker runs, until rank 0 ends (rank 0 alone listens, answers and stops on signals).
pub fn follow(model: LoadOptions, options: ServerOptions) -> anyhow::Result<()> {
    // The supervisor passes Ctrl-C and SIGTERM to every rank: this one ends when rank 0 has drained.
    // SAFETY: setting a signal's disposition to "ignore".
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
    let tp = model.tp.clone();
    let mut loaded = crate::load::load(&model, options.default_max_tokens)?;
    let tokenizer = loaded.tokenizer.take().ok_or_else(|| anyhow::anyhow!("the model has no tokenizer, which the chat API needs"))?;
    let budget = pool::shared_budget(&tp, options.cache_memory)?;
    let per_request = |tokens: usize| loaded.cache_bytes(tokens);
    let memory = pool::shared_cache_memory(&tp, loaded.device, budget, options.kv_memory)?.map(|budget| scheduler::CacheMemory { budget, per_request: &per_request });
    warm_up(loaded.model.as_ref(), loaded.device, options.parallel, false);
    let metrics = metrics::Metrics::new();
    scheduler::run(
        loaded.model.as_ref(),
        Arc::new(tokenizer),
        scheduler::Batching { prefill_step: options.prefill_step, parallel: options.parallel, memory },
        scheduler::Intake::Follower(scheduler::Follower::new(tp)),
        Arc::new(AtomicBool::new(false)),
        PrefixCache::new(budget),
        &metrics,
    );
    Ok(())
}

/// On a GPU, runs the batch sizes and prompt lengths whose kernels a server of `parallel`
/// sequences a step would otherwise compile while its first requests wait (models::warm_shapes,
/// engine::generate::warm_up). Every rank of a group runs it (its forwards hold collectives).
/// Best effort: a failure leaves the kernels to compile when met.
fn warm_up(model: &dyn crate::engine::model::LanguageModel, device: crate::engine::device::DeviceKind, parallel: usize, show: bool) {
    if device == crate::engine::device::DeviceKind::Cpu {
        return;
    }
    let began = std::time::Instant::now();
    let (batches, prompts) = crate::models::warm_shapes(parallel);
    let bar = crate::progress::work_bar((batches.len() + prompts.len()) as u64, "warming up batch sizes and prompt lengths", "shapes");
    if !show {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let warmed = crate::engine::generate::warm_up(model, &batches, &prompts, || bar.inc(1));
    bar.finish_and_clear();
    match warmed {
        Ok(()) if show => eprintln!("warmed up {} batch sizes and {} prompt lengths in {:.1} s", batches.len(), prompts.len(), began.elapsed().as_secs_f64()),
        Ok(()) => {}
        Err(e) => eprintln!("warning: warming up failed ({e}); kernels compile as requests meet them"),
    }
}

/// Puts the states saved in `store` back into `prefixes` (as many as its budget holds).
fn read_kept_states(model: &dyn crate::engine::model::LanguageModel, store: &StateDir, dir: &std::path::Path, prefixes: &mut PrefixCache) {
    let bar = bytes_progress("reading kept prompt states", 0);
    let loaded = store.load(model, prefixes.budget(), &mut progress_to(&bar));
    bar.finish_and_clear();
    match loaded {
        Ok((states, skipped)) => {
            for s in skipped {
                let moved = s.moved_to.map(|to| format!("; moved to {}", to.display())).unwrap_or_default();
                eprintln!("warning: skipped {}: {}{moved}", s.path.display(), s.error);
            }
            let count = states.len();
            for mut state in states {
                if let Err(e) = prefixes.insert(&state.tokens, &state.cache, &mut state.trail) {
                    eprintln!("warning: a saved prompt state was not kept: {e}");
                }
            }
            eprintln!("prompt cache: {count} kept states read from {} ({})", dir.display(), crate::engine::memory::human(prefixes.held_bytes()));
        }
        Err(e) => eprintln!("warning: --prompt-cache-dir {}: {e}", dir.display()),
    }
}

/// Saves the states `prefixes` holds to `store`, for the next start.
fn write_kept_states(store: &StateDir, dir: &std::path::Path, prefixes: &PrefixCache) {
    let bar = bytes_progress("saving kept prompt states", 0);
    let written = store.save(prefixes.kept(), &mut progress_to(&bar));
    bar.finish_and_clear();
    match written {
        Ok(n) => eprintln!("prompt cache: {} kept states in {} ({n} written)", prefixes.len(), dir.display()),
        Err(e) => eprintln!("error: saving prompt states to {}: {e}", dir.display()),
    }
}

/// SIGINT (Ctrl-C) or SIGTERM (what service managers send).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Every error the server sends is OpenAI-schema JSON, including the ones the HTTP layers make
/// themselves (a body over a limit, an undecodable path, an unknown method).
async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response.headers().get(CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let text = axum::body::to_bytes(response.into_body(), 4096).await.map(|b| String::from_utf8_lossy(&b).trim().to_string()).unwrap_or_default();
    let message = if text.is_empty() { status.canonical_reason().unwrap_or("error").to_string() } else { text };
    let (kind, code) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => ("invalid_request_error", "request_too_large"),
        StatusCode::REQUEST_TIMEOUT => ("invalid_request_error", "request_timeout"),
        StatusCode::NOT_FOUND => ("invalid_request_error", "not_found"),
        StatusCode::METHOD_NOT_ALLOWED => ("invalid_request_error", "method_not_allowed"),
        s if s.is_server_error() => ("server_error", "internal_error"),
        _ => ("invalid_request_error", "invalid_request"),
    };
    ApiError::new(status, kind, code, None, &message).into_response()
}

/// The request body, at most `limit` bytes, within the client read timeout. A longer body is
/// still read (and dropped) up to four times `limit` before the 413 goes out: a server that
/// answers and closes while the client is still sending resets the connection, and the client
/// sees a broken pipe instead of the answer.
pub(crate) async fn read_body(state: &AppState, body: axum::body::Body, limit: usize) -> Result<axum::body::Bytes, ApiError> {
    use http_body_util::BodyExt;
    let read = async move {
        let mut body = body;
        let (mut bytes, mut total) = (Vec::new(), 0usize);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ApiError::bad_request("body", &format!("the request body could not be read: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            total += data.len();
            if total <= limit {
                bytes.extend_from_slice(&data);
            } else if total > limit.saturating_mul(4) {
                break;
            }
        }
        if total > limit {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "request_too_large",
                None,
                &format!("the request body is over {limit} bytes"),
            ));
        }
        Ok(axum::body::Bytes::from(bytes))
    };
    match tokio::time::timeout(state.read_timeout, read).await {
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "request_timeout",
            None,
            &format!("the request body did not arrive within {} s", state.read_timeout.as_secs_f32()),
        )),
        Ok(result) => result,
    }
}

/// The API key, given as `Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY`
/// (Anthropic's).
pub(crate) fn authorized(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &state.api_key else { return Ok(()) };
    let bearer = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let given = bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok())).unwrap_or("");
    // Compared as digests in constant time: neither the key's bytes nor its length leak through timing.
    use sha2::Digest;
    use subtle::ConstantTimeEq;
    if bool::from(sha2::Sha256::digest(given.as_bytes()).ct_eq(&sha2::Sha256::digest(key.as_bytes()))) {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", "invalid_api_key", None, "missing or wrong API key (Authorization: Bearer KEY, or x-api-key: KEY)"))
    }
}

/// Model management (download, delete) changes the disk: refused on a public server.
pub(crate) fn may_manage(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    authorized(state, headers)?;
    if state.public {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            "permission_denied",
            None,
            "model downloads and deletions are refused on a server that listens beyond this machine without an API key; restart it with --api-key KEY",
        ));
    }
    Ok(())
}

/// Load status for anyone (no filesystem paths); why a load failed only with the API key. A
/// server of the store is up whatever its models do: it lists each one loaded or loading.
async fn health(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if !state.pool.fixed {
        let models: Vec<_> = state.pool.slots().iter().map(|s| json!({"model": s.id, "status": s.status()})).collect();
        return (StatusCode::OK, Json(json!({"status": "ok", "models": models, "max_models": state.pool.max_models}))).into_response();
    }
    let slot = state.pool.only();
    let model = slot.id.clone();
    if slot.ready.get().is_some() {
        let mut body = json!({"status": "ok", "model": model});
        // Random weights answer, but nothing they say means anything: a probe should know.
        if crate::store::synthetic::is_synthetic(&slot.path) {
            body["synthetic"] = json!(true);
        }
        (StatusCode::OK, Json(body)).into_response()
    } else if let Some(e) = slot.load_error.get() {
        let error = if state.api_key.is_some() && authorized(&state, &headers).is_ok() {
            e.clone()
        } else {
            "the model failed to load; the server's log says why (or GET /health with the API key)".to_string()
        };
        (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"status": "error", "model": model, "error": error}))).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "loading", "model": model}))).into_response()
    }
}

pub(crate) fn shutting_down() -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "server_shutting_down", None, "the server is shutting down; retry against another instance")
}

/// What every request for a model is checked for first: its key, and that the server is not
/// draining.
pub(crate) fn admit(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    authorized(state, headers)?;
    if state.draining.load(Ordering::SeqCst) {
        return Err(shutting_down());
    }
    Ok(())
}

/// A hold on the model named `requested` (or the one served, with `--model`), loaded first when
/// the server serves the store; the request's log line names it.
pub(crate) async fn lease(state: &Arc<AppState>, requested: Option<&str>, log: &log::RequestLog) -> Result<pool::Lease, ApiError> {
    let lease = pool::acquire(state, requested).await?;
    log.model(&lease.id);
    Ok(lease)
}

/// A generation request's common start: [`admit`], the body, and a [`lease`] on the model it
/// names.
pub(crate) async fn accept(state: &Arc<AppState>, headers: &HeaderMap, body: axum::body::Body, log: &log::RequestLog) -> Result<(axum::body::Bytes, pool::Lease), ApiError> {
    admit(state, headers)?;
    let bytes = read_body(state, body, MAX_BODY_BYTES).await?;
    // The name picks the model (a server of the store) or is checked against the one served,
    // under any of its names; the full parse checks the rest.
    let requested = requested_model(&bytes)?;
    let lease = lease(state, requested.as_deref(), log).await?;
    Ok((bytes, lease))
}

/// The `model` a request body names, if any (the full parse checks the rest).
fn requested_model(body: &[u8]) -> Result<Option<String>, ApiError> {
    #[derive(serde::Deserialize)]
    struct Named {
        model: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Named>(body) {
        Ok(Named { model: Some(serde_json::Value::String(m)) }) => Ok(Some(m)),
        Ok(Named { model: None | Some(serde_json::Value::Null) }) => Ok(None),
        Ok(Named { model: Some(_) }) => Err(ApiError::bad_request("model", "`model` must be a string")),
        // Not JSON, or not an object: the full parse says what is wrong.
        Err(_) => Ok(None),
    }
}

/// Bodies from this size up are prepared a few at a time, and the memory their tokenizing took
/// is handed back to the system after: tokenizing costs hundreds of bytes per byte of text.
const LARGE_BODY_BYTES: usize = 1 << 20;
/// Bytes of large bodies prepared at once, in [`LARGE_BODY_BYTES`] units.
const LARGE_BODY_UNITS_AT_ONCE: usize = 16;

/// Runs `prepare` on the request (of `body_bytes`) off the async threads (parsing, templating and
/// tokenizing a large body is CPU work) with what it is checked against.
pub(crate) async fn prepare_blocking<T: Send + 'static>(
    state: &Arc<AppState>,
    lease: &pool::Lease,
    body_bytes: usize,
    prepare: impl FnOnce(&openai::Served) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let default_max_tokens = state.default_max_tokens;
    let lease = lease.clone();
    let large = body_bytes >= LARGE_BODY_BYTES;
    let _turn = match large {
        true => Some(state.large_bodies.acquire_many(body_bytes.div_ceil(LARGE_BODY_BYTES).min(LARGE_BODY_UNITS_AT_ONCE) as u32).await.map_err(|_| shutting_down())?),
        false => None,
    };
    tokio::task::spawn_blocking(move || {
        let _trim = large.then_some(TrimOnDrop);
        let ready = lease.ready();
        let served = openai::Served {
            model_id: &lease.id,
            tokenizer: &ready.tokenizer,
            max_context: ready.max_context,
            vocab_size: ready.vocab_size,
            eos: &ready.eos,
            default_max_tokens,
            tool_format: ready.tool_format,
            generation: &ready.generation,
        };
        prepare(&served)
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "internal_error", None, &format!("preparing the request failed: {e}")))?
}

/// When dropped, hands the heap's free memory back to the system (glibc keeps what a large
/// request freed).
struct TrimOnDrop;

impl Drop for TrimOnDrop {
    fn drop(&mut self) {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only releases free pages of the heap.
        unsafe {
            libc::malloc_trim(0);
        }
    }
}

/// Hands a job to the model's worker; the job holds the model loaded until it is done.
pub(crate) fn submit(lease: &pool::Lease, mut job: Job) -> Result<(), ApiError> {
    job.lease = Some(lease.clone());
    lease
        .ready()
        .jobs
        .lock()
        .expect("jobs lock")
        .as_ref()
        .ok_or(std::sync::mpsc::SendError(()))
        .and_then(|jobs| jobs.send(job).map_err(|_| std::sync::mpsc::SendError(())))
        .map_err(|_| worker_gone())
}

pub(crate) fn worker_gone() -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "worker_gone", None, "the model worker stopped")
}

async fn chat(
    State(state): State<Arc<AppState>>,
    Extension(peer): Extension<Peer>,
    Extension(log): Extension<log::RequestLog>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let received = std::time::Instant::now();
    let (bytes, lease) = accept(&state, &headers, body, &log).await?;
    let prepared = prepare_blocking(&state, &lease, bytes.len(), move |served| openai::prepare_chat(&bytes, served)).await?;
    let tokenizer = lease.ready().tokenizer.clone();
    let openai::PreparedChat { request, prompt_text, prompt, max_tokens, stop, constraint } = prepared;
    let tools = (!request.tools.is_empty()).then_some((request.tool_format, request.tools.as_slice()));
    let parser = AnswerParser::new(&prompt_text, tools, request.parallel_tool_calls);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let logprobs = crate::engine::generate::LogprobOptions { generated: request.logprobs, prompt: None };
    let ignore_eos = request.ignore_eos;
    submit(&lease, Job { prompt, sampling: request.sampling.clone(), constraint, max_tokens, ignore_eos, stop, logprobs, received, events: tx, lease: None })?;
    let id = openai::completion_id();
    let created = openai::now();
    if request.stream {
        let model = lease.id.clone();
        let include_usage = request.include_usage;
        let logprobs = request.logprobs.is_some().then_some(tokenizer);
        log.streaming();
        let stream = async_stream(id, created, model, include_usage, parser, logprobs, rx, log);
        return Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response());
    }
    let mut parser = parser;
    peer.unless_hung_up(async move {
    let (mut reasoning, mut content, mut calls, mut token_logprobs) = (String::new(), String::new(), Vec::new(), Vec::new());
    while let Some(event) = rx.recv().await {
        log.see(&event);
        match event {
            Event::Text { text, logprobs } => {
                let d = parser.push(&text);
                reasoning.push_str(&d.reasoning);
                content.push_str(&d.content);
                calls.extend(d.calls);
                token_logprobs.extend(logprobs.into_iter().map(|t| t.logprobs));
            }
            Event::Started { .. } | Event::PromptLogprobs(_) => {}
            Event::Error(e) => return Err(ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", "generation_failed", None, &e)),
            Event::Shutdown => return Err(shutting_down()),
            Event::Done { finish_reason, prompt_tokens, completion_tokens, cached_tokens, .. } => {
                let d = parser.finish(finish_reason);
                reasoning.push_str(&d.reasoning);
                content.push_str(&d.content);
                calls.extend(d.calls);
                let mut message = json!({"role": "assistant", "content": content});
                if !reasoning.trim().is_empty() {
                    message["reasoning_content"] = json!(reasoning.trim());
                }
                if !calls.is_empty() {
                    if content.is_empty() {
                        message["content"] = serde_json::Value::Null;
                    }
                    message["tool_calls"] = answer::tool_calls_json(&calls, None);
                }
                let finish_reason = answer::chat_finish_reason(finish_reason, !calls.is_empty());
                let logprobs = match request.logprobs {
                    Some(_) => json!({"content": openai::chat_logprobs(&tokenizer, &token_logprobs), "refusal": null}),
                    None => serde_json::Value::Null,
                };
                return Ok(Json(json!({
                    "id": id, "object": "chat.completion", "created": created, "model": lease.id,
                    "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}],
                    "usage": openai::usage(prompt_tokens, completion_tokens, cached_tokens),
                }))
                .into_response());
            }
        }
    }
    Err(worker_gone())
    })
    .await
}

/// The SSE chunks of a streamed completion, ending with `data: [DONE]`. A task converts the
/// worker's events; when the client goes away the stream is dropped, the task ends, and the
/// worker sees the request's channel closed. With `logprobs` (the tokenizer to name tokens),
/// each chunk carries the log-probabilities of the tokens its text completes. The request's
/// `log` line is written when the task ends.
#[allow(clippy::too_many_arguments)]
fn async_stream(
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    mut parser: AnswerParser,
    logprobs: Option<Arc<TextTokenizer>>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Event>,
    log: log::RequestLog,
) -> impl tokio_stream::Stream<Item = Result<SseEvent, std::convert::Infallible>> {
    let (out, out_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let chunk = |delta: serde_json::Value, finish: Option<&str>, tokens: &[crate::engine::logprobs::TokenLogprobs]| {
            let logprobs = match &logprobs {
                Some(tokenizer) if !tokens.is_empty() => json!({"content": openai::chat_logprobs(tokenizer, tokens), "refusal": null}),
                _ => serde_json::Value::Null,
            };
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})
        };
        let send = |v: serde_json::Value| out.send(Ok(SseEvent::default().data(v.to_string()))).is_ok();
        if !send(chunk(json!({"role": "assistant", "content": ""}), None, &[])) {
            return;
        }
        // Log-probabilities of tokens whose text the parser still holds back go with the next chunk.
        let mut unsent = Vec::new();
        while let Some(event) = rx.recv().await {
            log.see(&event);
            let more = match event {
                Event::Text { text, logprobs } => {
                    unsent.extend(logprobs.into_iter().map(|t| t.logprobs));
                    let first = parser.calls_so_far();
                    parser.push(&text).chunks(first).into_iter().all(|delta| send(chunk(delta, None, &std::mem::take(&mut unsent))))
                }
                Event::Started { .. } | Event::PromptLogprobs(_) => true,
                Event::Error(e) => {
                    send(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "generation_failed", None, &e).to_json());
                    false
                }
                Event::Shutdown => {
                    send(shutting_down().to_json());
                    false
                }
                Event::Done { finish_reason, prompt_tokens, completion_tokens, cached_tokens, .. } => {
                    let first = parser.calls_so_far();
                    for delta in parser.finish(finish_reason).chunks(first) {
                        send(chunk(delta, None, &std::mem::take(&mut unsent)));
                    }
                    let finish_reason = answer::chat_finish_reason(finish_reason, parser.calls_so_far() > 0);
                    send(chunk(json!({}), Some(finish_reason), &std::mem::take(&mut unsent)));
                    if include_usage {
                        let mut last = chunk(json!({}), None, &[]);
                        last["choices"] = json!([]);
                        last["usage"] = openai::usage(prompt_tokens, completion_tokens, cached_tokens);
                        send(last);
                    }
                    log.finished();
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
