//! `GET /metrics`: the server's counters in Prometheus' text format 0.0.4 (the `prometheus`
//! crate's encoder). Requests are counted by endpoint and status as they are answered; tokens,
//! time to first token and latency by the worker as requests finish; queue depth, batch size and
//! MLX's memory as the worker goes round.

use super::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderMap;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use std::sync::Arc;

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub prompt_tokens: IntCounter,
    pub generated_tokens: IntCounter,
    pub time_to_first_token: Histogram,
    pub request_duration: Histogram,
    pub prefill_chunk_tokens: Histogram,
    pub queue_depth: IntGauge,
    pub batch_size: IntGauge,
    pub prefix_cache_lookups: IntCounter,
    pub prefix_cache_hits: IntCounter,
    pub prefix_cache_hit_tokens: IntCounter,
    pub memory_active: IntGauge,
    pub memory_peak: IntGauge,
    pub kernel_variants: IntGauge,
    pub kv_reserved: IntGauge,
    pub kv_budget: IntGauge,
}

/// Time-to-first-token buckets (seconds): a short prompt on a GPU to a long one on a CPU.
const TTFT_BUCKETS: &[f64] = &[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0];
/// Request latency buckets (seconds).
const LATENCY_BUCKETS: &[f64] = &[0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];
/// Prompt tokens in one chunk: the paced sizes while others decode up to the largest step.
const CHUNK_BUCKETS: &[f64] = &[64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0];

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        fn add<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: prometheus::Result<M>) -> M {
            // Names and help are constants here: a failure is a programming error caught by the tests.
            let metric = metric.expect("valid metric definition");
            registry.register(Box::new(metric.clone())).expect("metric names are unique");
            metric
        }
        let counter = |name: &str, help: &str| add(&registry, IntCounter::new(name, help));
        let gauge = |name: &str, help: &str| add(&registry, IntGauge::new(name, help));
        let histogram = |name: &str, help: &str, buckets: &[f64]| add(&registry, Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec())));
        Self {
            requests: add(&registry, IntCounterVec::new(Opts::new("sala_requests_total", "HTTP requests answered, by endpoint (route) and status code"), &["endpoint", "status"])),
            prompt_tokens: counter("sala_prompt_tokens_total", "Prompt tokens of finished requests (as their usage reports)"),
            generated_tokens: counter("sala_generated_tokens_total", "Tokens generated for finished requests (as their usage reports)"),
            time_to_first_token: histogram("sala_time_to_first_token_seconds", "From a request's arrival to its first generated token", TTFT_BUCKETS),
            request_duration: histogram("sala_request_duration_seconds", "From a request's arrival to its last token", LATENCY_BUCKETS),
            prefill_chunk_tokens: histogram("sala_prefill_chunk_tokens", "Prompt tokens run in one forward pass (fewer while other requests decode)", CHUNK_BUCKETS),
            queue_depth: gauge("sala_queue_depth", "Requests waiting for a slot in the batch"),
            batch_size: gauge("sala_batch_size", "Requests being prefilled or decoded together"),
            prefix_cache_lookups: counter("sala_prefix_cache_lookups_total", "Prompts looked up in the prefix cache"),
            prefix_cache_hits: counter("sala_prefix_cache_hits_total", "Prompts that started from a kept state"),
            prefix_cache_hit_tokens: counter("sala_prefix_cache_hit_tokens_total", "Prompt tokens taken from kept states instead of being run"),
            memory_active: gauge("sala_memory_active_bytes", "Memory MLX holds in arrays now"),
            memory_peak: gauge("sala_memory_peak_bytes", "Most memory MLX has held in arrays since the server started"),
            kernel_variants: gauge("sala_kernel_variants", "Variants of our GPU kernels launched so far, each compiled or loaded from the disk cache at its first launch (0 on the CPU)"),
            kv_reserved: gauge("sala_kv_reserved_bytes", "Cache memory held for the running requests, each at its prompt and max_tokens"),
            kv_budget: gauge("sala_kv_budget_bytes", "Cache memory the running requests may hold together (--kv-memory; 0 where unknown)"),
            registry,
        }
    }

    /// Reads MLX's memory counters (on the worker thread, between steps). MLX's own peak is reset
    /// as each request starts, so the peak kept here is the largest seen across those resets.
    pub fn observe_memory(&self) {
        if let Ok(active) = mlx_rs::memory::active_memory() {
            self.memory_active.set(active as i64);
        }
        if let Ok(peak) = mlx_rs::memory::peak_memory() {
            if peak as i64 > self.memory_peak.get() {
                self.memory_peak.set(peak as i64);
            }
        }
    }

    /// The exposition text.
    pub fn encode(&self) -> String {
        use prometheus::Encoder;
        let mut out = Vec::new();
        // Encoding our own families into memory does not fail.
        let _ = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// `GET /metrics` (behind the API key, like every endpoint but `/health`).
pub async fn get(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = super::authorized(&state, &headers) {
        return e.into_response();
    }
    ([(CONTENT_TYPE, prometheus::TEXT_FORMAT.to_string() + "; charset=utf-8")], state.metrics.encode()).into_response()
}

/// Counts each answered request by its route (not its path: ids in paths would make a series
/// per id) and status.
pub async fn count_requests(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let endpoint = request.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let response = next.run(request).await;
    state.metrics.requests.with_label_values(&[endpoint.as_str(), response.status().as_str()]).inc();
    response
}
