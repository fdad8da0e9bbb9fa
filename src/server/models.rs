//! The model endpoints: `GET /v1/models` (the served model and the store, with metadata),
//! `POST /v1/models/download` (a background `sala pull`), `GET /v1/models/download` (its
//! progress) and `DELETE /v1/models/{org}/{name}` (`sala rm`).

use super::openai::ApiError;
use super::{authorized, AppState};
use crate::store::cache::{self, cache_dir, ModelRef};
use crate::store::pull::{pull, PullProgress};
use crate::store::summary::summarize;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// A download started through the API.
pub struct Download {
    pub reference: ModelRef,
    pub progress: Arc<PullProgress>,
    /// `None` while running; then the snapshot path or the error.
    pub result: Mutex<Option<Result<String, String>>>,
}

impl Download {
    fn status(&self) -> Value {
        let p = &self.progress;
        let mut v = json!({
            "id": self.reference.repo, "revision": self.reference.revision,
            "downloaded_bytes": p.done_bytes.load(Ordering::Relaxed), "total_bytes": p.total_bytes.load(Ordering::Relaxed),
            "files_done": p.files_done.load(Ordering::Relaxed), "files_total": p.files_total.load(Ordering::Relaxed),
        });
        match &*self.result.lock().expect("download lock") {
            None => v["status"] = json!("downloading"),
            Some(Ok(path)) => {
                v["status"] = json!("completed");
                v["path"] = json!(path);
            }
            Some(Err(e)) => {
                v["status"] = json!("failed");
                v["error"] = json!(e);
            }
        }
        v
    }

    fn running(&self) -> bool {
        self.result.lock().expect("download lock").is_none()
    }
}

/// Describes a model for the list: path, size, quantization, architecture, context.
fn describe(id: &str, path: &std::path::Path, size: u64, loaded: bool) -> Value {
    let mut v = json!({"id": id, "object": "model", "created": 0, "owned_by": "sala", "path": path, "size": size, "loaded": loaded});
    match summarize(path, None) {
        Ok((s, _)) => {
            v["quantization"] = json!(s.quantization);
            v["architecture"] = json!(s.model_type);
            v["context_length"] = json!(s.context_length);
            if size == 0 {
                v["size"] = json!(s.disk_bytes);
            }
        }
        Err(e) => v["error"] = json!(e.to_string()),
    }
    v
}

pub async fn list(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorized(&state, &headers) {
        return e.into_response();
    }
    let state = state.clone();
    // Reading headers of every stored model touches the disk: off the async threads.
    let data = tokio::task::spawn_blocking(move || {
        let mut data = vec![describe(&state.model_id, &state.model_path, 0, state.ready.get().is_some())];
        for m in cache::list(&cache_dir()).unwrap_or_default() {
            if m.snapshot != state.model_path {
                data.push(describe(&m.repo, &m.snapshot, m.size, false));
            }
        }
        data
    })
    .await
    .unwrap_or_default();
    Json(json!({"object": "list", "data": data})).into_response()
}

fn parse_ref(id: &str, param: &str) -> Result<ModelRef, ApiError> {
    ModelRef::parse(id).map_err(|e| ApiError::bad_request(param, &e.to_string()))
}

pub async fn download(State(state): State<Arc<AppState>>, headers: HeaderMap, body: axum::body::Bytes) -> Response {
    match start_download(&state, &headers, &body) {
        Ok((status, v)) => (status, Json(v)).into_response(),
        Err(e) => e.into_response(),
    }
}

fn start_download(state: &Arc<AppState>, headers: &HeaderMap, body: &[u8]) -> Result<(StatusCode, Value), ApiError> {
    authorized(state, headers)?;
    let request: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", "invalid_json", None, &format!("the body is not valid JSON: {e}")))?;
    let model = request.get("model").and_then(Value::as_str).ok_or_else(|| ApiError::bad_request("model", "`model` must be a repo id, `org/name`"))?;
    let name = match request.get("revision") {
        None | Some(Value::Null) => model.to_string(),
        Some(Value::String(rev)) => format!("{model}@{rev}"),
        Some(_) => return Err(ApiError::bad_request("revision", "`revision` must be a string")),
    };
    let reference = parse_ref(&name, "model")?;
    let mut downloads = state.downloads.lock().expect("downloads lock");
    if let Some(d) = downloads.iter().find(|d| d.reference == reference && d.running()) {
        return Ok((StatusCode::OK, d.status()));
    }
    downloads.retain(|d| d.reference != reference);
    let download = Arc::new(Download { reference: reference.clone(), progress: Arc::default(), result: Mutex::new(None) });
    downloads.push(download.clone());
    let worker = download.clone();
    std::thread::Builder::new()
        .name("sala-download".into())
        .spawn(move || {
            let bars = indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::hidden());
            let result = pull(&worker.reference, &bars, worker.progress.clone())
                .map(|p| p.snapshot.display().to_string())
                .map_err(|e| e.to_string());
            match &result {
                Ok(path) => eprintln!("downloaded {} to {path}", worker.reference.repo),
                Err(e) => eprintln!("download of {} failed: {e}", worker.reference.repo),
            }
            *worker.result.lock().expect("download lock") = Some(result);
        })
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "spawn_failed", None, &e.to_string()))?;
    Ok((StatusCode::ACCEPTED, download.status()))
}

pub async fn downloads(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = authorized(&state, &headers) {
        return e.into_response();
    }
    let data: Vec<Value> = state.downloads.lock().expect("downloads lock").iter().map(|d| d.status()).collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

pub async fn delete(State(state): State<Arc<AppState>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    match remove(&state, &headers, &id) {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

fn remove(state: &AppState, headers: &HeaderMap, id: &str) -> Result<Value, ApiError> {
    authorized(state, headers)?;
    let in_use = || {
        ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "model_in_use", Some("model"), &format!("`{id}` is the model this server is running; stop the server to delete it"))
    };
    // The served model's own id may be a path, which is no store name: checked before parsing.
    if id == state.model_id {
        return Err(in_use());
    }
    let reference = parse_ref(id, "model")?;
    let store = cache_dir();
    if reference.snapshot(&store).is_some_and(|s| s == state.model_path) {
        return Err(in_use());
    }
    if state.downloads.lock().expect("downloads lock").iter().any(|d| d.reference.repo == reference.repo && d.running()) {
        return Err(ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "download_running", Some("model"), &format!("`{id}` is still downloading")));
    }
    if !reference.repo_dir(&store).is_dir() {
        return Err(ApiError::not_found(&format!("model `{}` is not in the store ({})", reference.repo, store.display())));
    }
    let freed = cache::remove(&store, &reference.repo)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "delete_failed", None, &e.to_string()))?;
    Ok(json!({"id": reference.repo, "object": "model", "deleted": true, "freed_bytes": freed}))
}
