//! The admin listener: the routes every worker has — `GET /metrics` (Prometheus text),
//! `GET /status` (JSON: the worker's status board), `GET /healthz` (the process answers),
//! `GET /readyz` (200 once the worker holds an assignment, 503 before), `POST /drain`,
//! `GET /openapi.yaml` — and, in a cluster, the topology, tenant and query routes.
//!
//! What holds the listener against whoever reaches it: who calls is decided before a body
//! is read ([`super::auth`]); each route takes a body of its own size at most; a request
//! has [`AdminConfig::request_timeout`] to be answered and a connection 5 s to send its
//! headers (64 KiB of them at most); at most [`AdminConfig::max_connections`] connections
//! are open at once, a quarter of them per peer address, and an idle one makes room for a
//! new one ([`super::connections`]); with `admin.tls.cert` and `admin.tls.key` it speaks
//! only TLS.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Extension};
use axum::http::StatusCode;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use axum::Router;

use super::auth::{gate, Access, Gate};
use super::connections::{Connection, Connections};
use super::{router, views, AdminConfig, AdminState, OPENAPI};
use crate::registry::tenants::Caller;
use crate::worker::WorkerHandle;

/// Bytes of body a route takes unless it says otherwise.
pub const DEFAULT_BODY_BYTES: usize = 64 << 10;

/// How long a connection may take to send a request's headers (its first, or its next
/// when it is kept alive).
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// Most bytes a connection's buffer holds: a request's line and headers must fit (431
/// beyond), so each connection costs the worker that much at most before its body.
const MAX_HEAD_BYTES: usize = 64 << 10;

/// `route` behind the gate, for callers of `access`.
pub(super) fn guarded<S: Clone + Send + Sync + 'static>(
    g: &Arc<Gate>,
    access: Access,
    route: axum::routing::MethodRouter<S>,
) -> axum::routing::MethodRouter<S> {
    route.route_layer(from_fn_with_state((g.clone(), access), gate))
}

/// Serves the admin API of `worker` on `config.listen` until the process ends; returns the
/// bound address. Refuses an open API (no tokens) on an address others can reach, unless
/// `admin.allow.open` says so.
pub async fn serve(worker: WorkerHandle, config: &AdminConfig) -> anyhow::Result<Option<SocketAddr>> {
    let Some(addr) = config.listen else {
        return Ok(None);
    };
    if !config.enforced() && !addr.ip().is_loopback() && !config.allow_open {
        anyhow::bail!(
            "the admin API on {addr} would be open to anyone who reaches it (no tokens are configured): configure \
             tokens ([admin] tokens in the configuration file), listen on a loopback address, or set \
             admin.allow.open = true (--allow-open-admin) if the network in front of it is trusted"
        );
    }
    let tls = match &config.tls {
        Some((cert, key)) => Some(tokio_rustls::TlsAcceptor::from(Arc::new(crate::tls::server_config(
            cert, key,
        )?))),
        None => None,
    };
    // The provider's keys before the first request: a provider that is down (or an issuer
    // that is wrong) stops the worker here, saying so, not at the first caller.
    let jwt = match &config.jwt {
        Some(access) => Some(super::jwt::Jwt {
            verifier: crate::oidc::jwt::Verifier::start(access.settings.clone())
                .await
                .map_err(|e| anyhow::anyhow!("admin.jwt: {e}"))?,
            access: access.clone(),
        }),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen for the admin API on {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let app = app(worker, config, jwt)?;
    let connections = Connections::new(config.max_connections);
    let max = config.max_connections;
    tokio::spawn(async move {
        let mut refused_at = None::<std::time::Instant>;
        loop {
            let (tcp, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!("the admin listener: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Some(admitted) = connections.admit(peer.ip()) else {
                // Closed as it arrives: every connection that could make room is busy.
                if refused_at.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(
                        %peer,
                        "the admin API has {max} connections open (admin.max.connections), or this peer its share, \
                         all busy: refusing more"
                    );
                    refused_at = Some(std::time::Instant::now());
                }
                drop(tcp);
                continue;
            };
            let (app, tls) = (app.clone(), tls.clone());
            tokio::spawn(async move {
                let connection = admitted.connection.clone();
                tokio::select! {
                    () = serve_connection(tcp, peer, app, tls, &connection) => {}
                    () = connection.shed() => {
                        tracing::debug!(%peer, "closed an idle admin connection to make room for another");
                    }
                }
                drop(admitted);
            });
        }
    });
    Ok(Some(bound))
}

/// Serves one connection (TLS first, when configured) until it ends; each request is
/// marked in flight on `connection` while its handler runs.
async fn serve_connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    app: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    connection: &Arc<Connection>,
) {
    let app = hyper_util::service::TowerToHyperService::new(app);
    let on = connection.clone();
    let service = hyper::service::service_fn(move |request| {
        let guard = on.request();
        let answer = hyper::service::Service::call(&app, request);
        async move {
            let answer = answer.await;
            drop(guard);
            answer
        }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_header_size(MAX_HEAD_BYTES)
        .max_buf_size(MAX_HEAD_BYTES);
    let served = match tls {
        Some(acceptor) => match tokio::time::timeout(HEADER_TIMEOUT, acceptor.accept(tcp)).await {
            Ok(Ok(stream)) => {
                http.serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await
            }
            Ok(Err(e)) => {
                tracing::debug!(%peer, "a TLS handshake with the admin API failed: {e}");
                return;
            }
            Err(_) => return,
        },
        None => http.serve_connection(hyper_util::rt::TokioIo::new(tcp), service).await,
    };
    if let Err(e) = served {
        tracing::debug!(%peer, "an admin connection ended: {e}");
    }
}

/// Every route, each behind the gate, with its body limit and the request timeout.
fn app(worker: WorkerHandle, config: &AdminConfig, jwt: Option<super::jwt::Jwt>) -> anyhow::Result<Router> {
    let g = Arc::new(Gate::new(
        config.tenancy.clone(),
        worker.registry().cloned(),
        config.secret.clone(),
        config.metrics_public,
        jwt,
    ));
    let (status, ready, metrics, drain) = (worker.clone(), worker.clone(), worker.clone(), worker.clone());
    let app = Router::new()
        .route(
            "/status",
            guarded(
                &g,
                Access::Read,
                get(move |Extension(who): Extension<Caller>| {
                    let worker = status.clone();
                    async move { axum::Json(views::status_for(&worker, &who)) }
                }),
            ),
        )
        .route("/healthz", guarded(&g, Access::Public, get(|| async { "ok\n" })))
        .route(
            "/openapi.yaml",
            guarded(
                &g,
                Access::Callers,
                get(|| async { ([("content-type", "application/yaml")], OPENAPI) }),
            ),
        )
        .route(
            "/readyz",
            guarded(
                &g,
                Access::Public,
                get(move || {
                    let worker = ready.clone();
                    async move {
                        if worker.ready() {
                            (StatusCode::OK, "ready\n")
                        } else {
                            (StatusCode::SERVICE_UNAVAILABLE, "no assignment yet\n")
                        }
                    }
                }),
            ),
        )
        .route(
            "/metrics",
            guarded(
                &g,
                Access::Metrics,
                // No caller: metrics are public and the request proved no one.
                get(move |who: Option<Extension<Caller>>| {
                    let worker = metrics.clone();
                    async move {
                        (
                            [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
                            views::metrics_for(&worker, who.as_ref().map(|w| &w.0)),
                        )
                    }
                }),
            ),
        )
        .route(
            "/drain",
            guarded(
                &g,
                Access::Admin,
                post(move || {
                    let worker = drain.clone();
                    async move {
                        match worker.drain() {
                            Ok(()) => (StatusCode::ACCEPTED, "draining\n".to_string()),
                            Err(why) => (StatusCode::CONFLICT, format!("{why}\n")),
                        }
                    }
                }),
            ),
        );
    let app = match AdminState::new(worker, config, g.clone())? {
        Some(state) => app.merge(router(Arc::new(state), &g)),
        None => app,
    };
    Ok(app
        .layer(DefaultBodyLimit::max(DEFAULT_BODY_BYTES))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            config.request_timeout,
        )))
}
