//! What the server keeps of each client connection: a watch on whether the client is still
//! there ([`Peer`]), and JSON bodies for the errors hyper answers by itself
//! ([`JsonParseErrors`]).

use super::openai::ApiError;
use axum::http::StatusCode;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client's end of a request's connection, watched while the request runs: hyper reads
/// nothing from a connection while its handler works, so without this a client that hangs up on
/// a non-streamed request leaves it decoding to the end.
#[derive(Clone)]
pub(crate) struct Peer(Option<Arc<std::net::TcpStream>>);

impl Peer {
    /// How often a running request looks at its client's socket.
    const LOOK_EVERY: Duration = Duration::from_millis(50);

    /// A second handle on `stream`'s socket (non-blocking, as tokio's is), only ever peeked at.
    pub(crate) fn of(stream: &tokio::net::TcpStream) -> Self {
        use std::os::fd::AsFd;
        Self(stream.as_fd().try_clone_to_owned().ok().map(|fd| Arc::new(std::net::TcpStream::from(fd))))
    }

    /// The client closed its end (end of stream, or the connection reset).
    fn hung_up(&self) -> bool {
        let Some(socket) = &self.0 else { return false };
        match socket.peek(&mut [0u8; 1]) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted),
        }
    }

    /// Runs `work` (a non-streamed answer being collected) unless the client hangs up first:
    /// then `work` is dropped with the request's event channel, which the worker takes as a
    /// cancellation at its next step.
    pub(crate) async fn unless_hung_up<T>(&self, work: impl std::future::Future<Output = Result<T, ApiError>>) -> Result<T, ApiError> {
        let watch = async {
            while !self.hung_up() {
                tokio::time::sleep(Self::LOOK_EVERY).await;
            }
        };
        tokio::select! {
            done = work => done,
            _ = watch => Err(ApiError::new(
                StatusCode::from_u16(499).expect("a valid status"),
                "invalid_request_error",
                "client_closed_request",
                None,
                "the client closed the connection; the request was cancelled",
            )),
        }
    }
}

/// A connection whose error answers from hyper itself (a request it cannot parse: 400, a URI over
/// its 64 KiB: 414, headers over its buffer or 100 of them: 431), which go out with empty bodies,
/// are written with the JSON error body every other error of the server has.
pub(crate) struct JsonParseErrors<S> {
    inner: S,
    /// An answer rewritten, still to be written out.
    pending: Vec<u8>,
    sent: usize,
}

impl<S> JsonParseErrors<S> {
    pub(crate) fn new(inner: S) -> Self {
        Self { inner, pending: Vec::new(), sent: 0 }
    }
}

impl<S: AsyncWrite + Unpin> JsonParseErrors<S> {
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.pending.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.sent..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.sent += n;
        }
        self.pending.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

/// `head` with a JSON error body, when it is one of hyper's own error answers: a 4xx head with
/// `content-length: 0` (every answer of the router's has a body; [`super::json_errors`]).
fn with_json_body(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let status: u16 = text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    if !(400..500).contains(&status) || !text.ends_with("\r\n\r\n") || !text.contains("\r\ncontent-length: 0\r\n") {
        return None;
    }
    let (code, message) = match status {
        414 => ("uri_too_long", "the request's URI is longer than the server takes (64 KiB); send data in the body"),
        431 => ("headers_too_large", "the request's headers are larger than the server takes (about 400 KiB, or over 100 headers)"),
        _ => ("invalid_http", "the request is not valid HTTP/1.1 (its request line, headers or framing); check the client"),
    };
    let status = StatusCode::from_u16(status).ok()?;
    let body = ApiError::new(status, "invalid_request_error", code, None, message).to_json().to_string();
    let head = text.replacen("\r\ncontent-length: 0\r\n", &format!("\r\ncontent-type: application/json\r\ncontent-length: {}\r\n", body.len()), 1);
    Some((head + &body).into_bytes())
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonParseErrors<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

// Not vectored: hyper then writes an answer's head in one buffer, where it can be recognised.
impl<S: AsyncWrite + Unpin> AsyncWrite for JsonParseErrors<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        ready!(self.drain(cx))?;
        if let Some(answer) = with_json_body(buf) {
            self.pending = answer;
            // Whatever is left goes out at the flush hyper makes next.
            if let Poll::Ready(Err(e)) = self.drain(cx) {
                return Poll::Ready(Err(e));
            }
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hypers_empty_error_answers_get_a_json_body() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: Sat, 28 Nov 2026 15:16:48 GMT\r\n\r\n";
        let answer = String::from_utf8(with_json_body(head).unwrap()).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("content-type: application/json") && head.contains(&format!("content-length: {}", body.len())), "{head}");
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "headers_too_large");
        // Answers with bodies, successes, and bodies that happen to look like a head pass as they are.
        assert!(with_json_body(b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 103\r\n\r\n{}").is_none());
        assert!(with_json_body(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(with_json_body(b"{\"error\": 1}").is_none());
    }
}
