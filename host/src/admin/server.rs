//! The admin listener: the routes every worker has — `GET /metrics` (Prometheus text),
//! `GET /status` (JSON: the worker's status board), `GET /healthz` (the process answers),
//! `GET /readyz` (200 once the worker holds an assignment, 503 before), `POST /drain`,
//! `GET /openapi.yaml` — and, in a cluster, the topology, tenant and query routes.
//!
//! What holds the listener against whoever reaches it: who calls is decided before a body
//! is read ([`super::auth`]); each route takes a body of its own size at most; a request
//! has [`AdminConfig::request_timeout`] to be answered and a connection 10 s to send its
//! headers; at most [`AdminConfig::max_connections`] connections are open at once (more
//! are closed as they arrive); with `admin.tls.cert` and `admin.tls.key` it speaks only TLS.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Extension};
use axum::http::StatusCode;
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use axum::Router;

use super::auth::{gate, Access, Gate};
use super::{router, AdminConfig, AdminState, OPENAPI};
use crate::registry::tenants::Caller;
use crate::worker::board::WorkerStatus;
use crate::worker::WorkerHandle;

/// Bytes of body a route takes unless it says otherwise.
pub const DEFAULT_BODY_BYTES: usize = 64 << 10;

/// How long a connection may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

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
    if !config.tenancy.enforced() && !addr.ip().is_loopback() && !config.allow_open {
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
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen for the admin API on {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let app = app(worker, config)?;
    let permits = Arc::new(tokio::sync::Semaphore::new(config.max_connections.max(1)));
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
            let Ok(permit) = permits.clone().try_acquire_owned() else {
                // Closed as it arrives: the connections open already keep being served.
                if refused_at.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!(%peer, "the admin API has {max} connections open (admin.max.connections): refusing more");
                    refused_at = Some(std::time::Instant::now());
                }
                drop(tcp);
                continue;
            };
            let (app, tls) = (app.clone(), tls.clone());
            tokio::spawn(async move {
                let _permit = permit;
                let service = hyper_util::service::TowerToHyperService::new(app);
                let mut http = hyper::server::conn::http1::Builder::new();
                http.timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT);
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
            });
        }
    });
    Ok(Some(bound))
}

/// Every route, each behind the gate, with its body limit and the request timeout.
fn app(worker: WorkerHandle, config: &AdminConfig) -> anyhow::Result<Router> {
    let g = Arc::new(Gate::new(
        config.tenancy.clone(),
        worker.registry().cloned(),
        config.secret.clone(),
        config.metrics_public,
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
                    async move { axum::Json(status_for(&worker, &who)) }
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
                get(move || {
                    let worker = metrics.clone();
                    async move {
                        (
                            [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
                            worker.metrics_text(),
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

/// The worker's status as `who` may see it: a tenant only its own topologies' tasks.
fn status_for(worker: &WorkerHandle, who: &Caller) -> WorkerStatus {
    let mut status = worker.status();
    if let Caller::Tenant(tenant) = who {
        let snapshot = worker.registry().map(|r| r.snapshot());
        let mine = |task: &str| {
            let topology = task.split_once('/').map_or(task, |(t, _)| t);
            snapshot
                .as_ref()
                .is_some_and(|s| s.entries.get(topology).is_some_and(|(e, _)| e.tenant == tenant.name))
        };
        status.tasks.retain(|t| mine(&t.task));
    }
    status
}
