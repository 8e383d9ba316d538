//! A small HTTP/1 client for the workers' admin endpoints (`sluice status`, `sluice worker
//! drain`): one request per connection, with a deadline.

use std::time::Duration;

use anyhow::Context as _;
use http_body_util::BodyExt as _;

/// Sends `method path` to `admin` (`host:port`) and returns the status and body, or an error
/// naming the address when it cannot be reached or does not answer within `timeout`.
pub async fn request(
    method: hyper::Method,
    admin: &str,
    path: &str,
    timeout: Duration,
) -> anyhow::Result<(hyper::StatusCode, bytes::Bytes)> {
    let exchange = async {
        let stream = tokio::net::TcpStream::connect(admin)
            .await
            .with_context(|| format!("cannot reach the worker's admin endpoint at {admin}"))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .with_context(|| format!("talking HTTP to {admin}"))?;
        tokio::spawn(connection);
        let request = hyper::Request::builder()
            .method(method.clone())
            .uri(path)
            .header("host", admin)
            .body(http_body_util::Empty::<bytes::Bytes>::new())?;
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
