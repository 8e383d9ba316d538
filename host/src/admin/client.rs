//! The HTTP/1 client of the workers' admin endpoints (`sluice status`, `sluice worker
//! drain`, `sluice deploy`, `sluice topologies`, and workers asking each other): one request
//! per connection, with a deadline and a bound on the answer, over TLS for an `https://`
//! address (checked against the CA given, the host name included).
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! use sluice::admin::client::{Client, Request};
//! let client = Client::new(None)?;
//! let (status, body) = Request::new(hyper::Method::GET, "127.0.0.1:9100", "/healthz")
//!     .send(&client)
//!     .await?;
//! # Ok(()) }
//! ```

use std::path::Path;
use std::sync::Arc;
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

/// What the client trusts for `https://` addresses.
#[derive(Clone)]
pub struct Client {
    tls: Arc<rustls::ClientConfig>,
}

impl Client {
    /// A client that trusts the certificates of `ca` (PEM) for `https://` addresses (none:
    /// the system's roots are not used; an `https://` address then needs a CA).
    pub fn new(ca: Option<&Path>) -> anyhow::Result<Client> {
        let mut roots = rustls::RootCertStore::empty();
        if let Some(ca) = ca {
            for cert in crate::tls::certificates(ca)? {
                roots
                    .add(cert)
                    .with_context(|| format!("the CA file {}: a certificate rustls refuses", ca.display()))?;
            }
        }
        let config = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
            .with_safe_default_protocol_versions()
            .context("TLS settings")?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Client { tls: Arc::new(config) })
    }
}

/// One request to an admin endpoint.
pub struct Request<'a> {
    method: hyper::Method,
    admin: &'a str,
    path: &'a str,
    headers: Vec<(&'static str, String)>,
    body: Option<Body>,
    timeout: Duration,
    max_answer: usize,
}

impl<'a> Request<'a> {
    /// `method path` to `admin` (`host:port`, or `https://host:port`), 30 s to answer, at
    /// most 64 MiB of answer.
    pub fn new(method: hyper::Method, admin: &'a str, path: &'a str) -> Request<'a> {
        Request {
            method,
            admin,
            path,
            headers: vec![(super::auth::CLIENT_HEADER, format!("sluice/{}", crate::VERSION))],
            body: None,
            timeout: Duration::from_secs(30),
            max_answer: 64 << 20,
        }
    }

    pub fn header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }

    /// `Authorization: Bearer TOKEN`, when there is a token.
    pub fn bearer(self, token: Option<&str>) -> Self {
        match token {
            Some(t) => self.header("authorization", format!("Bearer {t}")),
            None => self,
        }
    }

    pub fn body(mut self, body: Body) -> Self {
        self.body = Some(body);
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The largest answer read; a larger one is an error.
    pub fn max_answer(mut self, bytes: usize) -> Self {
        self.max_answer = bytes;
        self
    }

    /// Sends the request; the status and body of the answer, or an error naming the address
    /// when it cannot be reached, does not answer within the timeout, or answers too much.
    pub async fn send(self, client: &Client) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
        let (method, path, timeout) = (self.method.clone(), self.path, self.timeout);
        let (tls, hostport) = match self.admin.strip_prefix("https://") {
            Some(rest) => (true, rest.trim_end_matches('/')),
            None => (false, self.admin.strip_prefix("http://").unwrap_or(self.admin)),
        };
        let shown = format!("{}://{hostport}{path}", if tls { "https" } else { "http" });
        let exchange = async {
            let stream = tokio::net::TcpStream::connect(hostport)
                .await
                .with_context(|| format!("cannot reach the worker's admin endpoint at {hostport}"))?;
            if tls {
                let host = hostport.rsplit_once(':').map_or(hostport, |(h, _)| h);
                let name = rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_string())
                    .with_context(|| format!("{host} is not a host name TLS can check"))?;
                let stream = tokio_rustls::TlsConnector::from(client.tls.clone())
                    .connect(name, stream)
                    .await
                    .with_context(|| format!("TLS with {hostport} (is --ca the CA that signed its certificate?)"))?;
                self.exchange(stream, hostport).await
            } else {
                self.exchange(stream, hostport).await
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| anyhow::anyhow!("{method} {shown}: no answer within {timeout:?}"))?
            .with_context(|| format!("{method} {shown}"))
    }

    async fn exchange<S>(self, stream: S, hostport: &str) -> anyhow::Result<(hyper::StatusCode, Bytes)>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .with_context(|| format!("talking HTTP to {hostport}"))?;
        tokio::spawn(connection);
        let mut request = hyper::Request::builder()
            .method(self.method.clone())
            .uri(self.path)
            .header("host", hostport);
        for (name, value) in &self.headers {
            request = request.header(*name, value);
        }
        let (pieces, progress): (Vec<Bytes>, _) = match self.body {
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
        let response = sender.send_request(request).await?;
        let status = response.status();
        let limited = http_body_util::Limited::new(response.into_body(), self.max_answer);
        let body = limited
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("reading the answer (at most {} bytes): {e}", self.max_answer))?
            .to_bytes();
        Ok((status, body))
    }
}
