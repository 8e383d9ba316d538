//! The admin API of a worker (JSON over HTTP, on the admin listener, `--metrics`): the
//! worker's health, status, metrics and drain; in a cluster also the topologies in its
//! registry (upload, list, describe, delete), its tenants, and interactive queries. Any
//! worker takes an upload; every worker runs it once it reads the registry.
//!
//! - `server`: the listener and the routes every worker has (`/healthz`, `/readyz`,
//!   `/metrics`, `/status`, `/drain`, `/openapi.yaml`);
//! - `topologies`, `tenants`, `queries`: the routes of each resource; `auth`: who calls;
//!   `views`: what each caller may see of the worker's status and metrics;
//! - `client`: the HTTP client the CLI and the workers ask admin endpoints with.
//!
//! The API speaks for its worker through a [`WorkerHandle`] (status, deploy checks, drain,
//! the stores of its active tasks); it knows nothing else of the worker's insides.
//!
//! - `POST /v1/topologies` (multipart: `manifest`, the TOML text; `component`, the Wasm
//!   bytes): checks everything a worker would check before running it, then stores it.
//!   201 with the stored entry, 200 when the same component and manifest are there already.
//!   Uploading a name that exists is an upgrade: its tasks restart on the new version, their
//!   state kept.
//! - `GET /v1/topologies`, `GET /v1/topologies/{name}`, `DELETE /v1/topologies/{name}`.
//!
//! Every failure answers `{"error": KIND, "message": TEXT}` with its own status, and leaves
//! the registry as it was.

mod auth;
pub mod client;
mod connections;
pub mod jwt;
mod queries;
mod server;
mod tenants;
mod topologies;
pub mod uploads;
mod views;

use crate::kafka::Authorize as _;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::Serialize;

use crate::registry::tenants::{Caller, Tenancy};
use crate::registry::{self, Watcher, Writer};
use crate::secret::ClusterSecret;
use crate::worker::WorkerHandle;
pub use queries::Found;
pub use server::serve;
pub use topologies::{TaskPlace, TopologyView};

/// The API's OpenAPI description (`GET /openapi.yaml`).
pub const OPENAPI: &str = include_str!("../../../docs/openapi.yaml");

/// How the admin API of a worker is set up (besides the worker it speaks for).
#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// Where it listens (`admin.listener`, `--metrics`); none: no admin API.
    pub listen: Option<std::net::SocketAddr>,
    /// Largest component an upload may carry.
    pub max_component_bytes: usize,
    /// Who may call, and what each caller may do.
    pub tenancy: Tenancy,
    /// `GET /metrics` without a token (`admin.metrics.public`, the default: Prometheus
    /// scrapes without one).
    pub metrics_public: bool,
    /// Serve an open API (no tokens) on an address others can reach (`admin.allow.open`).
    pub allow_open: bool,
    /// Speak TLS with this certificate chain and key (`admin.tls.cert`, `admin.tls.key`).
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The CA workers check each other's admin certificates against (`admin.tls.ca`).
    pub tls_ca: Option<std::path::PathBuf>,
    /// Connections open at once, at most (`admin.max.connections`).
    pub max_connections: usize,
    /// How long a request may take to be answered (`admin.request.timeout.ms`).
    pub request_timeout: Duration,
    /// Workers sign what they ask each other with it.
    pub secret: Option<ClusterSecret>,
    /// JWTs from an OpenID Connect provider, beside the static tokens (`admin.jwt.*`).
    pub jwt: Option<jwt::JwtAccess>,
}

impl AdminConfig {
    /// Whether callers must prove who they are: static tokens or JWTs are configured.
    pub fn enforced(&self) -> bool {
        self.tenancy.enforced() || self.jwt.is_some()
    }

    /// An API on `listen` with the defaults: open (no tokens), public metrics, no TLS.
    pub fn new(listen: Option<std::net::SocketAddr>) -> AdminConfig {
        AdminConfig {
            listen,
            max_component_bytes: 64 << 20,
            tenancy: Tenancy::default(),
            metrics_public: true,
            allow_open: false,
            tls: None,
            tls_ca: None,
            max_connections: 256,
            request_timeout: Duration::from_secs(120),
            secret: None,
            jwt: None,
        }
    }
}

/// What the topology and tenant routes work with: the worker, its cluster's registry, and
/// who may call.
pub struct AdminState {
    /// The worker this API speaks for.
    pub worker: WorkerHandle,
    pub registry: Arc<Watcher>,
    pub writer: Writer,
    pub cluster: String,
    pub max_component_bytes: usize,
    /// Who may call, and what each caller may do.
    pub tenancy: Tenancy,
    /// Decides who calls (and knows the tenants created through the API).
    pub gate: Arc<auth::Gate>,
    /// Workers sign what they ask each other with it.
    pub secret: Option<ClusterSecret>,
    /// The client workers ask each other with.
    pub client: client::Client,
    /// When each tenant's last deploys and deletes through this worker were made (for
    /// `max-deploys-per-minute`).
    pub deploys: std::sync::Mutex<HashMap<String, std::collections::VecDeque<std::time::Instant>>>,
    /// Uploads and deletes of one caller (a tenant, or the admin) go one at a time through
    /// this worker: each checks its quota against what the one before stored.
    pub turns: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Uploads read and checked at once on this worker, of all callers: each holds up to a
    /// component's size in memory and compiles it.
    pub uploading: Arc<tokio::sync::Semaphore>,
    /// Uploads checked in the background, and how they ended.
    pub uploads: uploads::Uploads,
}

/// Uploads this worker reads and checks at once.
pub const CONCURRENT_UPLOADS: usize = 2;

/// How long an upload waits for its turn before it is refused (429).
pub const UPLOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

impl AdminState {
    /// The state of a worker in a cluster (none outside one: there is no registry).
    pub fn new(
        worker: WorkerHandle,
        config: &AdminConfig,
        gate: Arc<auth::Gate>,
    ) -> anyhow::Result<Option<AdminState>> {
        let (Some(registry), Some(cluster)) = (worker.registry().cloned(), worker.cluster().map(str::to_string)) else {
            return Ok(None);
        };
        let writer = Writer::new(worker.kafka(), &cluster, config.secret.clone())?.following(&registry);
        if config.secret.is_some() {
            // Records not believed (possible only where a secret makes some believed) shadow
            // believed ones under compaction: this worker writes those again.
            let healer = Writer::new(worker.kafka(), &cluster, config.secret.clone())?.following(&registry);
            crate::registry::heal(healer, Arc::downgrade(&registry))?;
        }
        Ok(Some(AdminState {
            worker,
            registry,
            writer,
            cluster,
            max_component_bytes: config.max_component_bytes,
            tenancy: config.tenancy.clone(),
            gate,
            secret: config.secret.clone(),
            client: client::Client::new(config.tls_ca.as_deref())?,
            deploys: Default::default(),
            turns: Default::default(),
            uploading: Arc::new(tokio::sync::Semaphore::new(CONCURRENT_UPLOADS)),
            uploads: Default::default(),
        }))
    }

    /// Waits for `who`'s turn to change the registry through this worker (one upload or
    /// delete of a caller at a time), at most [`UPLOAD_WAIT`]; then 429.
    pub(super) async fn turn(&self, who: &Caller) -> Result<tokio::sync::OwnedMutexGuard<()>, ApiError> {
        let lock = {
            let mut turns = self.turns.lock().unwrap_or_else(|e| e.into_inner());
            turns.entry(who.name().to_string()).or_default().clone()
        };
        tokio::time::timeout(UPLOAD_WAIT, lock.lock_owned()).await.map_err(|_| {
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "busy",
                format!(
                    "another upload or delete of {} has been going on through this worker for {}s; try again later",
                    who.name(),
                    UPLOAD_WAIT.as_secs()
                ),
            )
        })
    }

    /// Waits for one of this worker's [`CONCURRENT_UPLOADS`] upload slots, at most
    /// [`UPLOAD_WAIT`]; then 429.
    pub(super) async fn upload_slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        match tokio::time::timeout(UPLOAD_WAIT, self.uploading.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "busy",
                format!(
                    "this worker has been reading {CONCURRENT_UPLOADS} other uploads for {}s; try again later",
                    UPLOAD_WAIT.as_secs()
                ),
            )),
        }
    }

    /// Counts a deploy or delete of `who`, or refuses it (429) when its tenant made
    /// `max-deploys-per-minute` of them in the last minute: through any worker of the
    /// cluster (as the registry tells), or tried through this one (each costs this worker
    /// a check and a compile, even when refused).
    pub(super) fn deploy_allowed(&self, who: &Caller) -> Result<(), ApiError> {
        let Caller::Tenant(tenant) = who else {
            return Ok(());
        };
        let Some(max) = tenant.max_deploys_per_minute else {
            return Ok(());
        };
        let now = std::time::Instant::now();
        let minute = std::time::Duration::from_secs(60);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let cluster = self.registry.snapshot().changes_since(&tenant.name, now_ms - 60_000);
        if cluster >= max as usize {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "over-limit",
                format!(
                    "tenant {} made {cluster} deploys or deletes in the last minute across the cluster, its limit \
                     (max-deploys-per-minute = {max}); try again in a minute",
                    tenant.name
                ),
            ));
        }
        let mut deploys = self.deploys.lock().unwrap_or_else(|e| e.into_inner());
        let recent = deploys.entry(tenant.name.clone()).or_default();
        while recent.front().is_some_and(|t| now.duration_since(*t) >= minute) {
            recent.pop_front();
        }
        if recent.len() >= max as usize {
            let wait = minute.saturating_sub(now.duration_since(recent[0])).as_secs() + 1;
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "over-limit",
                format!(
                    "tenant {} made {} deploys or deletes in the last minute, its limit (max-deploys-per-minute = {max}); \
                     try again in {wait}s",
                    tenant.name,
                    recent.len()
                ),
            ));
        }
        recent.push_back(now);
        Ok(())
    }
}

/// An answer that is not a success.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl ApiError {
    pub(super) fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        #[derive(Serialize)]
        struct Body<'a> {
            error: &'a str,
            message: &'a str,
        }
        let body = Json(Body {
            error: self.kind,
            message: &self.message,
        });
        (self.status, body).into_response()
    }
}

/// The topology, tenant and query routes, each behind the gate, for the worker's admin
/// listener.
fn router(state: Arc<AdminState>, g: &Arc<auth::Gate>) -> axum::Router {
    use auth::Access::{Callers, Read};
    use server::guarded;
    // Room for the manifest and the multipart framing beside the largest component; only
    // uploads take that much, and only from a caller the gate let through.
    let upload = state.max_component_bytes + (1 << 20);
    axum::Router::new()
        .route(
            "/v1/topologies",
            guarded(
                g,
                Callers,
                post(topologies::upload)
                    .layer(DefaultBodyLimit::max(upload))
                    .get(topologies::list),
            ),
        )
        .route(
            "/v1/topologies/{name}",
            guarded(g, Callers, get(topologies::describe).delete(topologies::delete)),
        )
        .route("/v1/uploads", guarded(g, Callers, get(uploads::list)))
        .route("/v1/uploads/{id}", guarded(g, Callers, get(uploads::get)))
        .route(
            "/v1/tenants",
            guarded(g, Callers, get(tenants::list).post(tenants::create)),
        )
        .route(
            "/v1/tenants/{name}",
            guarded(g, Callers, axum::routing::delete(tenants::delete)),
        )
        .route(
            "/v1/topologies/{name}/stores/{store}",
            guarded(g, Read, get(queries::query)),
        )
        .with_state(state)
}

/// Writes to the registry on a blocking thread (503 `registry` when Kafka refuses), then
/// waits until this worker has read the write back, so the answer's caller sees it here.
pub(super) async fn store(
    state: &Arc<AdminState>,
    write: impl FnOnce(&Writer) -> anyhow::Result<()> + Send + 'static,
) -> Result<(), ApiError> {
    let st = state.clone();
    tokio::task::spawn_blocking(move || write(&st.writer))
        .await
        .map_err(internal)?
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "registry", format!("{e:#}")))?;
    settle(state).await;
    Ok(())
}

pub(super) fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
}

/// Waits until this worker's reader has read everything written so far (so a list or
/// describe right after an upload sees it).
async fn settle(state: &AdminState) {
    let (kafka, cluster) = (state.worker.kafka().clone(), state.cluster.clone());
    let end = tokio::task::spawn_blocking(move || -> Option<i64> {
        let consumer: crate::kafka::Authorized<BaseConsumer> = kafka.client().authorized(&kafka).ok()?;
        let (_, high) = consumer
            .fetch_watermarks(&registry::topic(&cluster), 0, Duration::from_secs(10))
            .ok()?;
        Some(high)
    })
    .await
    .ok()
    .flatten();
    if let Some(end) = end {
        state.registry.wait_for(end - 1, Duration::from_secs(10)).await;
    }
}

/// No topology `name` that `who` may see. Only the admin and the workers learn that a name
/// is a worker's `--topology`: to a tenant it is as absent as another tenant's topology.
pub(super) fn not_found(state: &AdminState, who: &Caller, name: &str) -> ApiError {
    if state.worker.is_static(name) && !matches!(who, Caller::Tenant(_)) {
        return ApiError::new(
            StatusCode::CONFLICT,
            "static-topology",
            format!("topology {name:?} is given to a worker with --topology, not uploaded: it is managed by its manifest file"),
        );
    }
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not-found",
        format!("no topology {name:?} in the registry of cluster {}", state.cluster),
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_openapi_description_names_every_route() {
        for route in [
            "/v1/topologies:",
            "/v1/topologies/{name}:",
            "/v1/topologies/{name}/stores/{store}:",
            "/v1/uploads:",
            "/v1/uploads/{id}:",
            "/v1/tenants:",
            "/status:",
            "/metrics:",
            "/healthz:",
            "/readyz:",
            "/drain:",
            "/openapi.yaml:",
        ] {
            assert!(
                super::OPENAPI.contains(&format!("\n  {route}\n")),
                "{route} is not described"
            );
        }
    }
}
