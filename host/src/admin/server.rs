//! The admin listener: the routes every worker has — `GET /metrics` (Prometheus text),
//! `GET /status` (JSON: the worker's status board), `GET /healthz` (the process answers),
//! `GET /readyz` (200 once the worker holds an assignment, 503 before), `POST /drain`,
//! `GET /openapi.yaml` — and, in a cluster, the topology, tenant and query routes.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::StatusCode;
use axum::routing::{get, post};

use super::{router, AdminConfig, AdminState, OPENAPI};
use crate::worker::WorkerHandle;

/// Serves the admin API of `worker` on `addr` until the process ends; returns the bound
/// address. `POST /drain` answers 202 when the worker will drain, 409 when it cannot (not
/// in a cluster, or stopping already).
pub async fn serve(addr: SocketAddr, worker: WorkerHandle, config: &AdminConfig) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen for metrics on {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let (status, ready, metrics, drain) = (worker.clone(), worker.clone(), worker.clone(), worker.clone());
    let app = axum::Router::new()
        .route(
            "/status",
            get(move || {
                let worker = status.clone();
                async move { axum::Json(worker.status()) }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/openapi.yaml",
            get(|| async { ([("content-type", "application/yaml")], OPENAPI) }),
        )
        .route(
            "/readyz",
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
        )
        .route(
            "/metrics",
            get(move || {
                let worker = metrics.clone();
                async move {
                    (
                        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
                        worker.metrics_text(),
                    )
                }
            }),
        )
        .route(
            "/drain",
            post(move || {
                let worker = drain.clone();
                async move {
                    match worker.drain() {
                        Ok(()) => (StatusCode::ACCEPTED, "draining\n".to_string()),
                        Err(why) => (StatusCode::CONFLICT, format!("{why}\n")),
                    }
                }
            }),
        );
    let app = match AdminState::new(worker, config)? {
        Some(state) => app.merge(router(Arc::new(state))),
        None => app,
    };
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("metrics endpoint stopped: {e}");
        }
    });
    Ok(bound)
}
