//! The model endpoints: `GET /v1/models` (the served model and the store, with metadata),
//! `POST /v1/models/download` (a background `sala pull`), `GET /v1/models/download` (its
//! progress) and `DELETE /v1/models/{org}/{name}` (`sala rm`; a download still running is
//! cancelled first; a model loading or answering requests is not deleted: 409). At most
//! [`MAX_DOWNLOADS`] downloads run at once; another is refused with 429.

use super::openai::ApiError;
use super::{authorized, may_manage, read_body, AppState, MAX_SMALL_BODY_BYTES};
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

/// Downloads running at once; each holds a thread and a connection, so more are refused (429)
/// rather than queued without end.
pub const MAX_DOWNLOADS: usize = 4;

/// Finished downloads kept for `GET /v1/models/download`; older ones are forgotten.
const KEPT_FINISHED: usize = 32;

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
                v["status"] = json!(if p.is_cancelled() { "cancelled" } else { "failed" });
                v["error"] = json!(e);
            }
        }
        v
    }

    fn running(&self) -> bool {
        self.result.lock().expect("download lock").is_none()
    }
}

/// The names a `--model` server answers to, the one it lists first: `alias`, else a short id
/// (the store name of a store model, else a file's stem or a folder's name); then the file name,
/// the part of a store name after its `/`, and the path as given (not on a public server, whose
/// answers name no path).
pub fn names_of(given: &std::path::Path, alias: Option<&str>, public: bool) -> Vec<String> {
    let text = given.display().to_string();
    let short = if given.exists() {
        let full = std::fs::canonicalize(given).unwrap_or_else(|_| given.to_path_buf());
        let stored = cache::list(&cache_dir()).unwrap_or_default().into_iter().find(|m| m.snapshot == full).map(|m| m.name);
        // A snapshot folder's own name is a commit hash: its store name says more.
        stored.or_else(|| {
            let name = if full.is_dir() { full.file_name() } else { full.file_stem() };
            name.map(|n| n.to_string_lossy().to_string())
        })
    } else if ModelRef::parse(&text).is_ok() {
        // Not a path: a store name, already short.
        None
    } else {
        // Neither (it will fail to load): its file name, which shows no folders.
        Some(crate::load::file_label(given))
    }
    .unwrap_or_else(|| text.clone());
    let mut names: Vec<String> = alias.map(str::to_string).into_iter().collect();
    names.push(short.clone());
    names.push(crate::load::file_label(given));
    if let Some((_, name)) = short.split_once('/') {
        names.push(name.to_string());
    }
    if !public {
        names.push(text);
    }
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| !n.is_empty() && seen.insert(n.clone()));
    names
}

/// Describes a model for the list: path, size, quantization, architecture, context.
fn describe(id: &str, path: &std::path::Path, size: u64) -> Value {
    let mut v = json!({"id": id, "object": "model", "created": 0, "owned_by": "sala", "path": path, "size": size});
    match summarize(path, None) {
        Ok((s, _)) => {
            v["quantization"] = json!(s.quantization);
            v["architecture"] = json!(s.model_type);
            v["context_length"] = json!(s.context_length);
            if crate::store::synthetic::is_synthetic(path) {
                v["synthetic"] = json!(true);
            }
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
    // One listing at a time, each model described once: a description reads its headers (a
    // GGUF's whole file), which concurrent clients must not repeat.
    let mut descriptions = state.descriptions.lock().await;
    let known: Vec<std::path::PathBuf> = descriptions.keys().cloned().collect();
    let task_state = state.clone();
    let fresh = tokio::task::spawn_blocking(move || {
        let state = task_state;
        // A --model server lists its model first (it may be no store model), then the store.
        let fixed = state.pool.fixed.then(|| state.pool.only());
        let mut models: Vec<(String, std::path::PathBuf, u64)> = fixed.iter().map(|s| (s.id.clone(), s.path.clone(), 0)).collect();
        for m in cache::list(&cache_dir()).unwrap_or_default() {
            if fixed.as_ref().is_none_or(|s| m.snapshot != s.path) {
                models.push((m.name, m.snapshot, m.size));
            }
        }
        models
            .into_iter()
            .map(|(id, path, size)| {
                let described = (!known.contains(&path)).then(|| describe(&id, &path, size));
                (path, described)
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default();
    let mut data = Vec::with_capacity(fresh.len());
    for (path, described) in fresh {
        let entry = match described {
            Some(v) => descriptions.entry(path.clone()).or_insert(v),
            None => descriptions.get_mut(&path).expect("described before"),
        };
        let mut v = entry.clone();
        let slot = state.pool.holding(&path);
        v["loaded"] = json!(slot.as_ref().is_some_and(|s| s.ready.get().is_some()));
        // "loaded", "loading", "error" (a --model server whose model failed) or "unloaded".
        v["status"] = json!(match slot.map(|s| s.status()) {
            Some("ready") => "loaded",
            Some(other) => other,
            None => "unloaded",
        });
        if state.public {
            v.as_object_mut().map(|o| o.remove("path"));
            // Why a model cannot be read names its files.
            if v.get("error").is_some() {
                v["error"] = json!("the model cannot be read; the server's log says why");
            }
        }
        data.push(v);
    }
    Json(json!({"object": "list", "data": data})).into_response()
}

fn parse_ref(id: &str, param: &str) -> Result<ModelRef, ApiError> {
    ModelRef::parse(id).map_err(|e| ApiError::bad_request(param, &e.to_string()))
}

pub async fn download(State(state): State<Arc<AppState>>, headers: HeaderMap, body: axum::body::Body) -> Response {
    let started = async {
        may_manage(&state, &headers)?;
        let body = read_body(&state, body, MAX_SMALL_BODY_BYTES).await?;
        start_download(&state, &body)
    };
    match started.await {
        Ok((status, v)) => (status, Json(v)).into_response(),
        Err(e) => e.into_response(),
    }
}

fn start_download(state: &Arc<AppState>, body: &[u8]) -> Result<(StatusCode, Value), ApiError> {
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
    let running = downloads.iter().filter(|d| d.running()).count();
    if running >= MAX_DOWNLOADS {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            "too_many_downloads",
            Some("model"),
            &format!(
                "{running} downloads are running, the most this server runs at once; retry when one has finished \
                 (GET /v1/models/download shows them; DELETE /v1/models/{{id}} cancels one)"
            ),
        ));
    }
    downloads.retain(|d| d.reference != reference);
    // Forget the oldest finished downloads beyond a few, so many names cannot grow the list.
    let finished = downloads.iter().filter(|d| !d.running()).count();
    let mut excess = finished.saturating_sub(KEPT_FINISHED);
    downloads.retain(|d| {
        let forget = excess > 0 && !d.running();
        excess -= usize::from(forget);
        !forget
    });
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
        .map_err(|e| {
            // Not left `downloading`, where it would hold a place under the cap for good.
            *download.result.lock().expect("download lock") = Some(Err(format!("starting the download's thread: {e}")));
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "spawn_failed", None, &e.to_string())
        })?;
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
    if let Err(e) = may_manage(&state, &headers) {
        return e.into_response();
    }
    // Waiting for a cancelled download to stop blocks: off the async threads.
    let removed = tokio::task::spawn_blocking(move || remove(&state, &id)).await;
    match removed {
        Ok(Ok(v)) => Json(v).into_response(),
        Ok(Err(e)) => e.into_response(),
        Err(e) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "internal_error", None, &e.to_string()).into_response(),
    }
}

/// How long a delete waits for a cancelled download to stop (one read timeout at most).
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

fn remove(state: &AppState, id: &str) -> Result<Value, ApiError> {
    let in_use = |what: String| ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "model_in_use", Some("model"), &format!("`{id}` {what}"));
    let fixed = || in_use("is the model this server is running; stop the server to delete it".into());
    // The served model's own id may be a path, which is no store name: checked before parsing.
    if state.pool.fixed && state.pool.only().answers_to(id) {
        return Err(fixed());
    }
    let reference = parse_ref(id, "model")?;
    let store = cache_dir();
    let repo_dir = reference.repo_dir(&store);
    // The whole repo goes: no snapshot of it may be in use, whichever name loaded it.
    if state.pool.fixed && state.pool.only().path.starts_with(&repo_dir) {
        return Err(fixed());
    }
    let removal = state.pool.take_for_removal(&repo_dir).map_err(|busy| {
        let doing = if busy.status() == "loading" { "loading" } else { "answering requests" };
        let under = if busy.id == id { String::new() } else { format!(" (as `{}`)", busy.id) };
        in_use(format!("is {doing}{under}; retry when its requests have finished, or stop the server to delete it now"))
    })?;
    // Idle, and out of the pool: unloaded before its files go.
    for slot in removal.slots.iter().cloned() {
        super::pool::unload_blocking(slot);
    }
    let running: Vec<Arc<Download>> =
        state.downloads.lock().expect("downloads lock").iter().filter(|d| d.reference.repo == reference.repo && d.running()).cloned().collect();
    let cancelled = !running.is_empty();
    for d in &running {
        d.progress.cancel();
    }
    let waited = std::time::Instant::now();
    while running.iter().any(|d| d.running()) {
        if waited.elapsed() > CANCEL_WAIT {
            return Err(ApiError::new(StatusCode::CONFLICT, "invalid_request_error", "download_running", Some("model"), &format!("`{id}` is still downloading and did not stop when cancelled; retry")));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // A cancelled download may have stored nothing yet: nothing to free, not an error.
    let freed = if repo_dir.is_dir() {
        let freed = cache::remove(&store, &reference.repo)
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "delete_failed", None, &e.to_string()))?;
        state.descriptions.blocking_lock().retain(|path, _| !path.starts_with(&repo_dir));
        freed
    } else if cancelled {
        0
    } else {
        return Err(ApiError::not_found(&format!("model `{}` is not in the store ({})", reference.repo, store.display())));
    };
    drop(removal);
    Ok(json!({"id": reference.repo, "object": "model", "deleted": true, "freed_bytes": freed, "cancelled_download": cancelled}))
}

#[cfg(test)]
mod tests {
    use super::names_of;

    #[test]
    fn a_model_file_answers_to_its_stem_alias_file_name_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("Tiny-Model.Q4_1.gguf");
        std::fs::write(&file, b"").unwrap();
        let path = file.display().to_string();
        assert_eq!(names_of(&file, None, false), ["Tiny-Model.Q4_1", "Tiny-Model.Q4_1.gguf", path.as_str()]);
        assert_eq!(names_of(&file, Some("tiny"), false), ["tiny", "Tiny-Model.Q4_1", "Tiny-Model.Q4_1.gguf", path.as_str()]);
        // A public server shows no path, and takes none.
        assert_eq!(names_of(&file, None, true), ["Tiny-Model.Q4_1", "Tiny-Model.Q4_1.gguf"]);
        // A folder by its name; a store name as it is, and without its organisation.
        assert_eq!(names_of(dir.path(), None, true)[0], dir.path().file_name().unwrap().to_string_lossy());
        assert_eq!(names_of(std::path::Path::new("some-org/some-model"), None, false), ["some-org/some-model", "some-model"]);
        // A path that is neither shows only its file name.
        assert_eq!(names_of(std::path::Path::new("/no/such/dir/x.gguf"), None, true), ["x.gguf"]);
    }
}
