//! One line per request on stderr, as llama-server and ollama write: method, path, status,
//! model, prompt/cached/generated tokens, time to first token and total time. Written through
//! `tracing` (as text, or one JSON object a line with `--log-format json`) when the request is
//! over: a streamed answer when its stream ends, a request whose client went away when it is
//! dropped (status 499, or `cancelled` for a stream cut short).

use super::scheduler::Event;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    // Values are described in the flag's help: documented values switch `--help` to clap's long
    // layout.
    Text,
    Json,
}

/// `--log-level`: the least severe lines written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogLevel {
    Error,
    // Only failed requests (status 500 and up).
    Warn,
    // Every request (the default).
    Info,
    // Also each request as it arrives, `/health` and `/metrics` probes, and each round of the
    // scheduler (how its prompt budget was shared, and its time).
    Debug,
}

impl From<LogLevel> for tracing::Level {
    fn from(level: LogLevel) -> Self {
        match level {
            LogLevel::Error => tracing::Level::ERROR,
            LogLevel::Warn => tracing::Level::WARN,
            LogLevel::Info => tracing::Level::INFO,
            LogLevel::Debug => tracing::Level::DEBUG,
        }
    }
}

/// Writes sala's log lines to stderr in `format`, from `level` up; other crates' events are left
/// out (hyper's and axum's would interleave with ours).
pub fn init(format: LogFormat, level: LogLevel) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    let targets = tracing_subscriber::filter::Targets::new().with_target("sala", tracing::Level::from(level));
    let text = (format == LogFormat::Text)
        .then(|| tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(std::io::stderr().is_terminal()).with_target(false));
    let json = (format == LogFormat::Json).then(|| {
        tracing_subscriber::fmt::layer().json().flatten_event(true).with_current_span(false).with_span_list(false).with_writer(std::io::stderr).with_target(false)
    });
    // Set once per process; a second server in one process keeps the first's.
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(targets).with(text).with(json));
}

/// A request's line, filled in by the layers that learn each part; written when the last
/// handle on it is dropped (the middleware's at the answer, a stream's at its end).
#[derive(Clone)]
pub struct RequestLog(Arc<Record>);

struct Record {
    method: String,
    path: String,
    started: Instant,
    fields: Mutex<Fields>,
}

#[derive(Default)]
struct Fields {
    status: Option<u16>,
    model: Option<String>,
    prompt_tokens: Option<usize>,
    cached_tokens: Option<usize>,
    generated_tokens: Option<usize>,
    first_token: Option<Duration>,
    /// The answer is a stream: it is over when its events say so, not at the status.
    streaming: bool,
    /// Every prompt of the request finished (a stream that ends before is cancelled).
    finished: bool,
    /// What a stream ended in, its status already sent as 200.
    error: Option<String>,
}

impl RequestLog {
    pub fn new(method: &str, path: &str) -> Self {
        tracing::debug!(method = %method, path = %path, "request received");
        RequestLog(Arc::new(Record { method: method.to_string(), path: path.to_string(), started: Instant::now(), fields: Mutex::default() }))
    }

    fn with(&self, change: impl FnOnce(&mut Fields)) {
        change(&mut self.0.fields.lock().expect("request log lock"));
    }

    pub fn status(&self, status: u16) {
        self.with(|f| f.status = Some(status));
    }

    pub fn model(&self, model: &str) {
        self.with(|f| f.model = Some(model.to_string()));
    }

    /// Adds a prompt's tokens (a completions request of several prompts sums them).
    pub fn tokens(&self, prompt: usize, cached: usize, generated: usize) {
        self.with(|f| {
            let add = |field: &mut Option<usize>, n: usize| *field = Some(field.unwrap_or(0) + n);
            add(&mut f.prompt_tokens, prompt);
            add(&mut f.cached_tokens, cached);
            add(&mut f.generated_tokens, generated);
        });
    }

    /// The answer is streamed: its line waits for the stream's end.
    pub fn streaming(&self) {
        self.with(|f| f.streaming = true);
    }

    /// Takes what a worker event tells: the first token's time, the token counts at the end.
    pub fn see(&self, event: &Event) {
        match event {
            // Until the end says (a stream cut short never hears it), the first text's arrival.
            Event::Text { .. } => {
                let elapsed = self.0.started.elapsed();
                self.with(|f| {
                    f.first_token.get_or_insert(elapsed);
                });
            }
            // The worker's measure, which also counts a first token held back (a stop string).
            Event::Done { prompt_tokens, completion_tokens, cached_tokens, first_token, .. } => {
                self.tokens(*prompt_tokens, *cached_tokens, *completion_tokens);
                if let Some(first) = *first_token {
                    self.with(|f| f.first_token = Some(f.first_token.map_or(first, |seen| seen.min(first))));
                }
            }
            Event::Error(e) => self.with(|f| f.error = Some(e.clone())),
            _ => {}
        }
    }

    /// Every prompt of the request is done (a stream's end).
    pub fn finished(&self) {
        self.with(|f| f.finished = true);
    }
}

fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

impl Drop for Record {
    fn drop(&mut self) {
        let total = millis(self.started.elapsed());
        let f = self.fields.get_mut().unwrap_or_else(|e| e.into_inner());
        // No status: the client went away before the answer (nginx's 499).
        let status = f.status.unwrap_or(499);
        let cancelled = f.status.is_none() || (f.streaming && !f.finished && status < 400 && f.error.is_none());
        let (method, path) = (tracing::field::display(&self.method), tracing::field::display(&self.path));
        let model = f.model.as_deref().map(tracing::field::display);
        let (prompt_tokens, cached_tokens, generated_tokens) = (f.prompt_tokens, f.cached_tokens, f.generated_tokens);
        let ttft_ms = f.first_token.map(millis);
        let cancelled = cancelled.then_some(true);
        // Probes come every few seconds from orchestrators and scrapers: only at debug.
        if matches!(self.path.as_str(), "/health" | "/metrics") {
            tracing::debug!(method, path, status, total_ms = total, "request");
        } else if let Some(error) = f.error.as_deref() {
            tracing::warn!(method, path, status, model, prompt_tokens, cached_tokens, generated_tokens, ttft_ms, total_ms = total, error, "request");
        } else if status >= 500 {
            tracing::warn!(method, path, status, model, prompt_tokens, cached_tokens, generated_tokens, ttft_ms, total_ms = total, cancelled, "request");
        } else {
            tracing::info!(method, path, status, model, prompt_tokens, cached_tokens, generated_tokens, ttft_ms, total_ms = total, cancelled, "request");
        }
    }
}

/// The middleware that gives each request its [`RequestLog`] and the answer's status.
pub async fn log_requests(mut request: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let log = RequestLog::new(request.method().as_str(), request.uri().path());
    request.extensions_mut().insert(log.clone());
    let response = next.run(request).await;
    log.status(response.status().as_u16());
    response
}

#[cfg(test)]
mod tests {
    use super::RequestLog;
    use crate::server::scheduler::Event;
    use std::sync::{Arc, Mutex};

    /// What the request lines written while `f` runs say.
    fn lines_of(f: impl FnOnce()) -> String {
        let written = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = written.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || Sink(sink.clone()))
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = written.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stream_that_ends_in_an_error_is_logged_with_it_not_as_cancelled() {
        let stream = |event: Option<Event>| {
            lines_of(|| {
                let log = RequestLog::new("POST", "/v1/completions");
                log.status(200);
                log.streaming();
                if let Some(event) = event {
                    log.see(&event);
                }
            })
        };
        let failed = stream(Some(Event::Error("out of memory".into())));
        assert!(failed.contains("WARN") && failed.contains("error=\"out of memory\"") && !failed.contains("cancelled"), "{failed}");
        // A stream cut short by its client is still a cancellation.
        let cut = stream(None);
        assert!(cut.contains("INFO") && cut.contains("cancelled=true") && !cut.contains("error"), "{cut}");
    }
}
