//! The models a server holds. With `--model`, that one model: loaded at start and kept. Without,
//! every model of the store by its name (as ollama and llama.cpp's router serve): a model loads
//! on its first request, which waits for it; at most `max_models` are loaded at once, the least
//! recently used idle one making room (and room in memory) for another; a model idle for
//! `keep_alive` is unloaded. Each loaded model has its own worker thread ([`super::scheduler`]).
//! A model is its snapshot: names that resolve to one (`org/name`, `org/name@main`, the commit)
//! share its slot.

use super::openai::ApiError;
use super::{metrics, read_kept_states, scheduler, write_kept_states, AppState, Ready};
use crate::engine::prefix_cache::PrefixCache;
use crate::engine::state_file::StateDir;
use crate::engine::tools::ToolFormat;
use crate::load::{load, LoadOptions};
use crate::store::cache::{cache_dir, dir_size, ModelRef};
use axum::http::StatusCode;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a request waits for a loaded model to become idle (to be unloaded for it) before
/// the server answers that it is busy.
const BUSY_WAIT: Duration = Duration::from_secs(600);

/// What every model's worker is started with.
pub struct WorkerSettings {
    /// Device, dtype, window; the model is each slot's.
    pub load: LoadOptions,
    pub default_max_tokens: usize,
    pub prefill_step: usize,
    pub parallel: usize,
    pub cache_memory: Option<u64>,
    pub kv_memory: Option<u64>,
    pub prompt_cache_dir: Option<PathBuf>,
    pub tool_format: Option<ToolFormat>,
}

/// One model the server holds: loading, ready, or failed to load.
pub struct Slot {
    /// How clients name it: the store name, or with `--model` what was given (its file name on a
    /// public server).
    pub id: String,
    /// Where it is (a store name resolved to its snapshot).
    pub path: PathBuf,
    /// Every name a request may give it, `id` first (with `--model`: its alias, short id and path).
    pub names: Vec<String>,
    pub ready: OnceLock<Ready>,
    pub load_error: OnceLock<String>,
    /// Woken when `ready` or `load_error` is set.
    settled: tokio::sync::Notify,
    /// Requests holding a [`Lease`]: waiting for the load, being prepared, or running.
    in_flight: AtomicUsize,
    last_used: Mutex<Instant>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Slot {
    fn new(id: String, path: PathBuf) -> Arc<Self> {
        Self::named(vec![id], path)
    }

    /// A slot answering to `names`, listed by the first.
    fn named(names: Vec<String>, path: PathBuf) -> Arc<Self> {
        Arc::new(Slot {
            id: names[0].clone(),
            names,
            path,
            ready: OnceLock::new(),
            load_error: OnceLock::new(),
            settled: tokio::sync::Notify::new(),
            in_flight: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
            worker: Mutex::new(None),
        })
    }

    /// Whether a request may call this model `name`.
    pub fn answers_to(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    /// "loading", "ready" or "error".
    pub fn status(&self) -> &'static str {
        if self.ready.get().is_some() {
            "ready"
        } else if self.load_error.get().is_some() {
            "error"
        } else {
            "loading"
        }
    }

    /// Loaded (or failed) and no request holds it: it may be unloaded.
    pub fn idle(&self) -> bool {
        self.status() != "loading" && self.in_flight.load(Ordering::SeqCst) == 0
    }

    fn idle_for(&self) -> Duration {
        self.last_used.lock().expect("last_used lock").elapsed()
    }

    async fn settled(&self) {
        loop {
            // Registered before the check, so a wake between the check and the wait is not lost.
            let woken = self.settled.notified();
            if self.status() != "loading" {
                return;
            }
            woken.await;
        }
    }

    fn settle(&self) {
        self.settled.notify_waiters();
    }

    /// Stops the worker once it has finished what it holds (it saves kept prompt states) and
    /// waits for it; the model's memory is then free.
    fn stop_worker(&self) {
        if let Some(ready) = self.ready.get() {
            ready.jobs.lock().expect("jobs lock").take();
        }
        if let Some(worker) = self.worker.lock().expect("worker lock").take() {
            let _ = worker.join();
        }
    }
}

/// A request's hold on a model: while any exists the model stays loaded. Jobs carry one to the
/// worker, so a streamed answer holds the model until it is done.
pub struct Lease {
    slot: Arc<Slot>,
    /// The name the request gave the model (one of the names of its slot's snapshot): what the
    /// request is checked against and what its answer says. It stands before the slot's own
    /// `id`, which `Deref` would give.
    pub id: String,
}

impl Lease {
    fn new(slot: Arc<Slot>) -> Self {
        let id = slot.id.clone();
        Self::named(slot, id)
    }

    /// A lease on `slot` for a request that called it `id`.
    fn named(slot: Arc<Slot>, id: String) -> Self {
        slot.in_flight.fetch_add(1, Ordering::SeqCst);
        *slot.last_used.lock().expect("last_used lock") = Instant::now();
        Lease { slot, id }
    }

    /// The loaded model ([`Pool::acquire`] hands out leases of ready models only).
    pub fn ready(&self) -> &Ready {
        self.slot.ready.get().expect("a lease is handed out once the model is ready")
    }
}

impl std::ops::Deref for Lease {
    type Target = Slot;
    fn deref(&self) -> &Slot {
        &self.slot
    }
}

impl Clone for Lease {
    fn clone(&self) -> Self {
        Lease::named(self.slot.clone(), self.id.clone())
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        *self.slot.last_used.lock().expect("last_used lock") = Instant::now();
        self.slot.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

pub struct Pool {
    slots: Mutex<Vec<Arc<Slot>>>,
    /// Repo folders being deleted: nothing loads from them meanwhile (locked after `slots`).
    removing: Mutex<Vec<PathBuf>>,
    /// Serving the one model given with `--model`, not the store.
    pub fixed: bool,
    pub max_models: usize,
    /// `None`: never unloaded for being idle.
    pub keep_alive: Option<Duration>,
    pub settings: WorkerSettings,
}

impl Pool {
    /// A pool serving the store.
    pub fn store(max_models: usize, keep_alive: Option<Duration>, settings: WorkerSettings) -> Self {
        Pool { slots: Mutex::new(Vec::new()), removing: Mutex::default(), fixed: false, max_models: max_models.max(1), keep_alive, settings }
    }

    /// A pool of the one model at `path`, answering to `names` (listed by the first).
    pub fn fixed(names: Vec<String>, path: PathBuf, settings: WorkerSettings) -> Self {
        assert!(!names.is_empty(), "a served model has a name");
        Pool { slots: Mutex::new(vec![Slot::named(names, path)]), removing: Mutex::default(), fixed: true, max_models: 1, keep_alive: None, settings }
    }

    /// The models held now, in loading order.
    pub fn slots(&self) -> Vec<Arc<Slot>> {
        self.slots.lock().expect("slots lock").clone()
    }

    /// The one model of a `--model` server.
    pub fn only(&self) -> Arc<Slot> {
        self.slots()[0].clone()
    }

    /// The slot holding the model at `path`, if loaded or loading.
    pub fn holding(&self, path: &Path) -> Option<Arc<Slot>> {
        self.slots().into_iter().find(|s| s.path == path)
    }

    /// Takes `slot` out of the pool if it is idle, so no request can lease it any more (leases
    /// are made under the same lock); then it is the caller's to [`unload`].
    pub fn take_if_idle(&self, slot: &Arc<Slot>) -> bool {
        let mut slots = self.slots.lock().expect("slots lock");
        let idle = slot.idle() && slots.iter().any(|s| Arc::ptr_eq(s, slot));
        if idle {
            slots.retain(|s| !Arc::ptr_eq(s, slot));
        }
        idle
    }

    /// For deleting the repo folder `repo_dir`: takes every model loaded from it out of the pool
    /// (the caller unloads them) and keeps new loads from it away until the [`Removal`] is
    /// dropped; or, if one of them is loading or answering, that one and nothing changes.
    pub fn take_for_removal(&self, repo_dir: &Path) -> Result<Removal<'_>, Arc<Slot>> {
        let mut slots = self.slots.lock().expect("slots lock");
        if let Some(busy) = slots.iter().find(|s| s.path.starts_with(repo_dir) && !s.idle()) {
            return Err(busy.clone());
        }
        let (taken, kept): (Vec<_>, Vec<_>) = slots.drain(..).partition(|s| s.path.starts_with(repo_dir));
        *slots = kept;
        self.removing.lock().expect("removing lock").push(repo_dir.to_path_buf());
        Ok(Removal { pool: self, dir: repo_dir.to_path_buf(), slots: taken })
    }

    /// Whether `path` is in a repo folder being deleted (called with `slots` locked).
    fn being_removed(&self, path: &Path) -> bool {
        self.removing.lock().expect("removing lock").iter().any(|d| path.starts_with(d))
    }
}

/// A repo folder being deleted ([`Pool::take_for_removal`]): its models, out of the pool, for
/// the caller to unload; loads from it are refused until this is dropped.
pub struct Removal<'a> {
    pool: &'a Pool,
    dir: PathBuf,
    pub slots: Vec<Arc<Slot>>,
}

impl Drop for Removal<'_> {
    fn drop(&mut self) {
        let mut removing = self.pool.removing.lock().expect("removing lock");
        if let Some(i) = removing.iter().position(|d| *d == self.dir) {
            removing.remove(i);
        }
    }
}

/// A hold on the model a request names (`None`: it named none), loading it first when the server
/// serves the store. With `--model` a request gets an answer at once while the model loads; it
/// may name the model by any of its names, and its answer says the name it gave.
pub async fn acquire(state: &Arc<AppState>, requested: Option<&str>) -> Result<Lease, ApiError> {
    let pool = &state.pool;
    if pool.fixed {
        let slot = pool.only();
        if let Some(name) = requested.filter(|name| !slot.answers_to(name)) {
            return Err(super::openai::not_served(name, &slot.id));
        }
        return match (slot.ready.get(), slot.load_error.get()) {
            (Some(_), _) => Ok(match requested {
                Some(name) => Lease::named(slot, name.to_string()),
                None => Lease::new(slot),
            }),
            (None, Some(e)) => Err(load_failed(e, state.public)),
            (None, None) => Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "model_loading",
                None,
                "the model is still loading; retry shortly (GET /health says when it is ready)",
            )),
        };
    }
    let name = requested.ok_or_else(|| {
        ApiError::bad_request("model", "`model` is required: this server serves every model of its store by name (GET /v1/models lists them)")
    })?;
    let lease = slot_for(state, name).await?;
    lease.settled().await;
    match lease.load_error.get() {
        Some(e) => Err(load_failed(e, state.public)),
        None => Ok(lease),
    }
}

/// Why a load failed names files: a public server says only that it failed.
fn load_failed(e: &str, public: bool) -> ApiError {
    let message = if public { "the model failed to load; the server's log says why".to_string() } else { format!("the model failed to load: {e}") };
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "model_load_failed", None, &message)
}

fn not_in_store(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "model_not_found",
        Some("model"),
        &format!("model `{name}` is not in the store; fetch it first (`sala pull {name}`, or POST /v1/models/download)"),
    )
}

/// The model's snapshot in the store, and the name the store lists it by (one for every alias).
fn in_store(name: &str) -> Result<(PathBuf, String), ApiError> {
    let cache = cache_dir();
    let full = without_organisation(&cache, name)?;
    let reference = ModelRef::parse(full.as_deref().unwrap_or(name)).map_err(|e| ApiError::bad_request("model", &e.to_string()))?;
    let found = reference.snapshot(&cache).zip(reference.listed_name(&cache));
    found.ok_or_else(|| not_in_store(name))
}

/// The full store name of `name` given without its organisation (`SmolLM2-135M-Instruct` for
/// `HuggingFaceTB/SmolLM2-135M-Instruct`), when one model of the store has that name; two are
/// ambiguous, and refused naming both.
fn without_organisation(cache: &Path, name: &str) -> Result<Option<String>, ApiError> {
    let (base, revision) = match name.split_once('@') {
        Some((base, revision)) => (base, Some(revision)),
        None => (name, None),
    };
    if base.contains('/') || base.is_empty() {
        return Ok(None);
    }
    let mut repos: Vec<String> = crate::store::cache::list(cache)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| {
            let repo = m.repo;
            (repo.split_once('/').map(|(_, n)| n) == Some(base)).then_some(repo)
        })
        .collect();
    repos.dedup();
    match repos.as_slice() {
        [] => Ok(None),
        [repo] => Ok(Some(revision.map_or_else(|| repo.clone(), |r| format!("{repo}@{r}")))),
        _ => Err(ApiError::bad_request("model", &format!("`{name}` is the name of {} models of the store ({}); give the full name", repos.len(), repos.join(", ")))),
    }
}

/// What to do about a model that is not loaded.
enum Step {
    Lease(Lease),
    /// Unload this idle model, then look again.
    Evict(Arc<Slot>),
    /// Every loaded model is busy: wait.
    Wait,
}

/// A lease on `name`'s slot: the one loaded or loading, or a new one once there is room.
async fn slot_for(state: &Arc<AppState>, name: &str) -> Result<Lease, ApiError> {
    let pool = &state.pool;
    let started = Instant::now();
    // By its snapshot, so that every name of one model finds one slot.
    let (path, id) = in_store(name)?;
    loop {
        let step = {
            let mut slots = pool.slots.lock().expect("slots lock");
            if let Some(slot) = slots.iter().find(|s| s.path == path) {
                Step::Lease(Lease::named(slot.clone(), name.to_string()))
            } else if pool.being_removed(&path) || !path.is_dir() {
                // Deleted since it was looked up, or being deleted now.
                return Err(not_in_store(name));
            } else {
                let lru_idle = slots.iter().filter(|s| s.idle()).min_by_key(|s| std::cmp::Reverse(s.idle_for())).cloned();
                let full = slots.len() >= pool.max_models;
                // Room in memory too: what the files take against what the device has free.
                let short_of_memory = || {
                    crate::engine::memory::available_bytes(crate::engine::device::or_default(pool.settings.load.device))
                        .is_some_and(|free| dir_size(&path) > free)
                };
                match lru_idle {
                    Some(victim) if full || short_of_memory() => {
                        // Out of the pool under the lock that makes leases: nobody leases it now.
                        slots.retain(|s| !Arc::ptr_eq(s, &victim));
                        Step::Evict(victim)
                    }
                    _ if full => Step::Wait,
                    _ => {
                        let slot = Slot::new(id.clone(), path.clone());
                        slots.push(slot.clone());
                        let lease = Lease::named(slot.clone(), name.to_string());
                        start_worker(state, slot);
                        Step::Lease(lease)
                    }
                }
            }
        };
        match step {
            Step::Lease(lease) => return Ok(lease),
            Step::Evict(victim) => unload(victim).await,
            Step::Wait if started.elapsed() > BUSY_WAIT => {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "server_error",
                    "all_models_busy",
                    None,
                    &format!("all {} loaded models are busy (--max-models); retry later", pool.max_models),
                ))
            }
            Step::Wait => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Stops the worker of `slot`, taken out of the pool, off the async threads.
pub async fn unload(slot: Arc<Slot>) {
    let _ = tokio::task::spawn_blocking(move || unload_blocking(slot)).await;
}

/// [`unload`] on a thread that may block.
pub fn unload_blocking(slot: Arc<Slot>) {
    slot.stop_worker();
    crate::engine::memory::release_cached();
    eprintln!("model unloaded: {}", slot.id);
}

/// Unloads models idle for longer than `--keep-alive`, checking a few times per period.
pub async fn keep_alive(state: Arc<AppState>) {
    let Some(keep) = state.pool.keep_alive.filter(|_| !state.pool.fixed) else { return };
    let tick = (keep / 4).clamp(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        tokio::time::sleep(tick).await;
        let expired: Vec<Arc<Slot>> = state.pool.slots().into_iter().filter(|s| s.idle() && s.idle_for() >= keep).collect();
        for slot in expired {
            // Leased since it was listed: kept.
            if state.pool.take_if_idle(&slot) {
                unload(slot).await;
            }
        }
    }
}

/// Stops every serving worker: each finishes what it holds and saves kept prompt states first.
/// One still loading has nothing to save and is not waited for.
pub fn stop_all(pool: &Pool) {
    for slot in pool.slots.lock().expect("slots lock").drain(..) {
        if slot.ready.get().is_some() {
            slot.stop_worker();
        }
    }
}

/// Loads `slot`'s model on its own thread, which then serves its requests until its job
/// channel closes.
pub fn start_worker(state: &Arc<AppState>, slot: Arc<Slot>) {
    let state = state.clone();
    let worker_slot = slot.clone();
    let spawned = std::thread::Builder::new().name("sala-worker".into()).spawn(move || {
        let slot = worker_slot;
        // A panic while loading would leave the slot `loading` for good (every request a 503):
        // it is a failed load instead.
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve_model(&state, &slot)));
        if let (Err(panic), None) = (served, slot.ready.get()) {
            let what = crate::engine::contain::panic_message(panic.as_ref()).unwrap_or_default();
            let _ = slot.load_error.set(format!("the model's worker panicked ({what}), a bug in sala; please report it"));
        }
        if slot.ready.get().is_none() {
            // A store model that failed is dropped, so a later request tries again.
            if !state.pool.fixed {
                state.pool.slots.lock().expect("slots lock").retain(|s| !Arc::ptr_eq(s, &slot));
            }
            slot.settle();
        }
    });
    match spawned {
        Ok(handle) => *slot.worker.lock().expect("worker lock") = Some(handle),
        Err(e) => {
            let _ = slot.load_error.set(format!("starting the model's thread: {e}"));
            slot.settle();
        }
    }
}

fn serve_model(state: &Arc<AppState>, slot: &Slot) {
    let settings = &state.pool.settings;
    let options = LoadOptions { model: Some(slot.path.clone()), ..settings.load.clone() };
    let tp = options.tp.clone();
    let mut loaded = match load(&options, settings.default_max_tokens) {
        Ok(l) => l,
        Err(e) if !tp.is_single() => {
            // The other ranks wait for this one: end, and the supervisor stops them.
            eprintln!("error: loading {}: {e:#}", slot.id);
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("error: loading {}: {e:#}", slot.id);
            let _ = slot.load_error.set(format!("{e:#}"));
            return;
        }
    };
    let Some(tokenizer) = loaded.tokenizer.take() else {
        let _ = slot.load_error.set("the model has no tokenizer, which the chat API needs".into());
        return;
    };
    let tokenizer = Arc::new(tokenizer);
    let cache_budget = match shared_budget(&tp, settings.cache_memory) {
        Ok(budget) => budget,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let per_request = |tokens: usize| loaded.cache_bytes(tokens);
    let memory = match shared_cache_memory(&tp, loaded.device, cache_budget, settings.kv_memory) {
        Ok(budget) => budget.map(|budget| scheduler::CacheMemory { budget, per_request: &per_request }),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    super::warm_up(loaded.model.as_ref(), loaded.device, settings.parallel, tp.is_leader());
    // Set before the slot is ready: /metrics answers from then on.
    state.metrics.kv_budget.set(memory.map_or(0, |m| m.budget.min(i64::MAX as u64) as i64));
    let model = loaded.model.as_ref();
    let mut prefixes = PrefixCache::new(cache_budget);
    let store = settings.prompt_cache_dir.clone().and_then(|dir| match StateDir::new(&dir, &loaded.fingerprint) {
        Ok(store) => Some((dir, store)),
        Err(e) => {
            eprintln!("warning: --prompt-cache-dir {}: {e}; prompt states will not be kept on disk", dir.display());
            None
        }
    });
    if let Some((dir, store)) = &store {
        read_kept_states(model, store, dir, &mut prefixes);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let info = model.info();
    let tool_format = settings.tool_format.unwrap_or_else(|| crate::models::tool_format(&info.model_type, tokenizer.chat_template()));
    let _ = slot.ready.set(Ready {
        tokenizer: tokenizer.clone(),
        jobs: Mutex::new(Some(tx)),
        max_context: info.max_context,
        vocab_size: info.vocab_size,
        eos: info.eos_token_ids.clone(),
        tool_format,
        generation: loaded.generation.clone(),
    });
    slot.settle();
    // A shutdown that came while loading found no sender to take.
    if state.draining.load(Ordering::SeqCst) {
        slot.ready.get().map(|r| r.jobs.lock().expect("jobs lock").take());
    }
    eprintln!(
        "model ready: {} (prefix cache: up to {}; requests' caches: up to {}; tool calls: {})",
        slot.id,
        crate::engine::memory::human(cache_budget),
        memory.map_or_else(|| "unknown memory".into(), |m| crate::engine::memory::human(m.budget)),
        tool_format.name()
    );
    let metrics: &metrics::Metrics = &state.metrics;
    let intake = if tp.is_single() { scheduler::Intake::Channel(rx) } else { scheduler::Intake::Leader(rx, tp) };
    let prefixes = scheduler::run(
        model,
        tokenizer,
        scheduler::Batching { prefill_step: settings.prefill_step, parallel: settings.parallel, memory },
        intake,
        state.abort.clone(),
        prefixes,
        metrics,
    );
    if let Some((dir, store)) = &store {
        write_kept_states(store, dir, &prefixes);
    }
}

/// The memory the requests' caches share (see [`scheduler::CacheMemory`]): `asked`, else what the
/// device has free with the model loaded, less the prefix cache's `prefix_budget` and an eighth
/// kept for the forward passes' working memory; rank 0's under tensor parallelism, so that every
/// rank admits the same requests. `None` where the free memory is unknown.
pub fn shared_cache_memory(
    tp: &crate::engine::distributed::TensorParallel,
    device: crate::engine::device::DeviceKind,
    prefix_budget: u64,
    asked: Option<u64>,
) -> crate::engine::error::Result<Option<u64>> {
    if let Some(asked) = asked {
        return Ok(Some(asked));
    }
    let free = tp.share_u64(|| Ok::<_, crate::engine::error::Error>(crate::engine::memory::available_bytes(device).unwrap_or(u64::MAX)))?;
    Ok((free != u64::MAX).then(|| {
        let free = free.saturating_sub(prefix_budget);
        free - free / 8
    }))
}

/// The prefix cache's budget: `asked`, else a share of the free memory; under tensor parallelism
/// rank 0's, so that every rank keeps and drops the same states.
pub fn shared_budget(tp: &crate::engine::distributed::TensorParallel, asked: Option<u64>) -> crate::engine::error::Result<u64> {
    tp.share_u64(|| Ok(asked.unwrap_or_else(crate::engine::memory::default_state_budget)))
}
