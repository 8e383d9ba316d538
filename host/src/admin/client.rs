//! A small HTTP/1 client for the workers' admin endpoints (`sluice status`, `sluice worker
//! drain`, `sluice deploy`, `sluice topologies`): one request per connection, with a
//! deadline.

use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::BodyExt as _;

/// A request body, sent in pieces so that a progress bar can follow it.
pub struct Body {
    pub content_type: String,
    pub bytes: Vec<u8>,
    pub progress: Option<indicatif::ProgressBar>,
}

/// Bytes per piece of a body.
const PIECE: usize = 64 * 1024;

/// Sends `method path` to `admin` (`host:port`) and returns the status and body, or an error
/// naming the address when it cannot be reached or does not answer within `timeout`.
pub async fn request(
    method: hyper::Method,
    admin: &str,
    path: &str,
    timeout: Duration,
) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
    send(method, admin, path, None, None, timeout).await
}

/// As [`request`], with a body.
pub async fn send(
    method: hyper::Method,
    admin: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Body>,
    timeout: Duration,
) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(admin)
            .await
            .with_context(|| format!("cannot reach the worker's admin endpoint at {admin}"))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .with_context(|| format!("talking HTTP to {admin}"))?;
        tokio::spawn(connection);
        let mut request = hyper::Request::builder()
            .method(method.clone())
            .uri(path)
            .header("host", admin);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let (pieces, progress): (Vec<Bytes>, _) = match body {
            Some(body) => {
                request = request
                    .header("content-type", body.content_type)
                    .header("content-length", body.bytes.len());
                let all = Bytes::from(body.bytes);
                let pieces = (0..all.len())
                    .step_by(PIECE)
                    .map(|at| all.slice(at..(at + PIECE).min(all.len())))
                    .collect();
                (pieces, body.progress)
            }
            None => (Vec::new(), None),
        };
        use futures::StreamExt as _;
        let stream = futures::stream::iter(pieces).map(move |piece| {
            // Counted as hyper takes the piece to send it.
            if let Some(bar) = &progress {
                bar.inc(piece.len() as u64);
                if bar.length().is_some_and(|len| bar.position() >= len) {
                    // All sent: what remains is the worker's (checking, compiling, storing).
                    bar.set_message("sent; the worker checks and compiles it");
                    bar.enable_steady_tick(std::time::Duration::from_millis(200));
                }
            }
            Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(piece))
        });
        let request = request.body(http_body_util::StreamBody::new(stream))?;
        let response = sender
            .send_request(request)
            .await
            .with_context(|| format!("{method} http://{admin}{path}"))?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, body))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| anyhow::anyhow!("{method} http://{admin}{path}: no answer within {timeout:?}"))?
}
