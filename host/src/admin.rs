//! The admin API of a worker in a cluster (JSON over HTTP, on the `--metrics` listener):
//! upload, list, describe and delete topologies in the cluster's registry. Any worker takes
//! an upload; every worker runs it once it reads the registry.
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

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Multipart, Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::Serialize;

use crate::manifest::Manifest;
use crate::registry::{self, Entry, Watcher, Writer};
use crate::runtime::{LoadError, Runtime};
use crate::tenants::{Caller, Tenancy};

/// The API's OpenAPI description (`GET /openapi.yaml`).
pub const OPENAPI: &str = include_str!("../../docs/openapi.yaml");

/// What the admin API works with.
pub struct AdminState {
    pub runtime: Arc<Runtime>,
    pub registry: Arc<Watcher>,
    pub writer: Writer,
    pub bootstrap: String,
    pub cluster: String,
    /// Topologies given to this worker with `--topology` (they cannot be uploaded).
    pub static_names: HashSet<String>,
    pub max_component_bytes: usize,
    /// Who may call, and what each caller may do.
    pub tenancy: Tenancy,
}

/// An answer that is not a success.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
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

/// What the registry says about a topology, as the API shows it.
#[derive(Debug, Serialize)]
pub struct TopologyView {
    #[serde(flatten)]
    pub entry: Entry,
    /// `registry` (uploaded) or `manifest` (given to a worker with `--topology`).
    pub origin: &'static str,
}

/// The routes, for the worker's admin listener.
pub fn router(state: Arc<AdminState>) -> axum::Router {
    // Room for the manifest and the multipart framing beside the largest component.
    let limit = state.max_component_bytes + (1 << 20);
    axum::Router::new()
        .route("/v1/topologies", post(upload).get(list))
        .route("/v1/topologies/{name}", get(describe).delete(delete))
        .route("/v1/tenants", get(tenants))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// Who calls: `Authorization: Bearer TOKEN`, checked against the configured token hashes.
fn caller(state: &AdminState, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    state.tenancy.caller(token).ok_or_else(|| {
        let why = if token.is_some() {
            "the token is not one this cluster knows"
        } else {
            "this cluster requires a token: pass --token (or set SLUICE_TOKEN)"
        };
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", why)
    })
}

async fn list(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Result<Json<Vec<TopologyView>>, ApiError> {
    let who = caller(&state, &headers)?;
    let snapshot = state.registry.snapshot();
    Ok(Json(
        snapshot
            .entries
            .values()
            .filter(|(entry, _)| who.owns(&entry.tenant))
            .map(|(entry, _)| TopologyView {
                entry: entry.clone(),
                origin: "registry",
            })
            .collect(),
    ))
}

async fn describe(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<TopologyView>, ApiError> {
    let who = caller(&state, &headers)?;
    let snapshot = state.registry.snapshot();
    // Another tenant's topology is not there, as far as this caller can tell.
    match snapshot.entries.get(&name).filter(|(e, _)| who.owns(&e.tenant)) {
        Some((entry, _)) => Ok(Json(TopologyView {
            entry: entry.clone(),
            origin: "registry",
        })),
        None => Err(not_found(&state, &name)),
    }
}

/// A tenant as `GET /v1/tenants` shows it.
#[derive(Debug, Serialize)]
struct TenantView {
    name: String,
    namespace: String,
    topologies: usize,
    tasks: u32,
    max_topologies: Option<u32>,
    max_tasks: Option<u32>,
    max_memory: Option<usize>,
    max_call_timeout_ms: Option<u64>,
}

async fn tenants(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Result<Json<Vec<TenantView>>, ApiError> {
    let who = caller(&state, &headers)?;
    let snapshot = state.registry.snapshot();
    Ok(Json(
        state
            .tenancy
            .tenants()
            .filter(|t| who.owns(&t.name))
            .map(|t| {
                let mine: Vec<&Entry> = snapshot
                    .entries
                    .values()
                    .map(|(e, _)| e)
                    .filter(|e| e.tenant == t.name)
                    .collect();
                TenantView {
                    name: t.name.clone(),
                    namespace: t.namespace.clone(),
                    topologies: mine.len(),
                    tasks: mine.iter().map(|e| e.partitions).sum(),
                    max_topologies: t.max_topologies,
                    max_tasks: t.max_tasks,
                    max_memory: t.max_memory,
                    max_call_timeout_ms: t.max_call_timeout.map(|d| d.as_millis() as u64),
                }
            })
            .collect(),
    ))
}

fn not_found(state: &AdminState, name: &str) -> ApiError {
    if state.static_names.contains(name) {
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

async fn delete(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let who = caller(&state, &headers)?;
    let snapshot = state.registry.snapshot();
    let Some((entry, _)) = snapshot
        .entries
        .get(&name)
        .filter(|(e, _)| who.owns(&e.tenant))
        .cloned()
    else {
        return Err(not_found(&state, &name));
    };
    let shared = snapshot
        .entries
        .values()
        .any(|(e, _)| e.name != name && e.digest == entry.digest);
    let st = state.clone();
    let e = entry.clone();
    tokio::task::spawn_blocking(move || st.writer.delete(&e, !shared))
        .await
        .map_err(internal)?
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "registry", format!("{e:#}")))?;
    settle(&state).await;
    Ok(Json(serde_json::json!({ "deleted": name, "version": entry.version })))
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
}

/// Waits until this worker's reader has read everything written so far (so a list or
/// describe right after an upload sees it).
async fn settle(state: &AdminState) {
    let (bootstrap, cluster) = (state.bootstrap.clone(), state.cluster.clone());
    let end = tokio::task::spawn_blocking(move || -> Option<i64> {
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .create()
            .ok()?;
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

/// An upload: its manifest text and component bytes, each with the file name it was sent
/// under (for messages).
struct Upload {
    manifest: (String, String),
    component: (String, Vec<u8>),
}

async fn read_upload(mut form: Multipart, limit: usize) -> Result<Upload, ApiError> {
    let (mut manifest, mut component) = (None, None);
    loop {
        let field = match form.next_field().await {
            Ok(Some(field)) => field,
            Ok(None) => break,
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(too_large(None, limit)),
            Err(e) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad-request",
                    format!("reading the upload: {e}"),
                ))
            }
        };
        let name = field.name().unwrap_or_default().to_string();
        let file = field.file_name().unwrap_or(&name).to_string();
        let bytes = match field.bytes().await {
            Ok(b) => b,
            Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => return Err(too_large(None, limit)),
            Err(e) => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad-request",
                    format!("reading part {name:?} of the upload: {e}"),
                ))
            }
        };
        match name.as_str() {
            "manifest" => {
                let text = String::from_utf8(bytes.to_vec()).map_err(|_| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "bad-manifest",
                        format!("manifest {file} is not UTF-8 text"),
                    )
                })?;
                manifest = Some((file, text));
            }
            "component" => component = Some((file, bytes.to_vec())),
            other => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "bad-request",
                    format!("unexpected part {other:?}: an upload has two parts, `manifest` and `component`"),
                ))
            }
        }
    }
    match (manifest, component) {
        (Some(manifest), Some(component)) => Ok(Upload { manifest, component }),
        (None, _) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad-request",
            "the upload has no `manifest` part (the topology's manifest, TOML)",
        )),
        (_, None) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad-request",
            "the upload has no `component` part (the topology's Wasm component)",
        )),
    }
}

fn too_large(size: Option<usize>, limit: usize) -> ApiError {
    let size = size.map_or(String::new(), |s| format!(" ({s} bytes)"));
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "too-large",
        format!(
            "the component{size} is larger than this cluster takes ({limit} bytes, the workers' --max-component-size)"
        ),
    )
}

async fn upload(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    form: Multipart,
) -> Result<Response, ApiError> {
    let who = caller(&state, &headers)?;
    let Upload {
        manifest: (manifest_file, text),
        component: (component_file, component),
    } = read_upload(form, state.max_component_bytes).await?;
    if component.len() > state.max_component_bytes {
        return Err(too_large(Some(component.len()), state.max_component_bytes));
    }
    let manifest = Manifest::parse_uploaded(&text, &manifest_file, Path::new(&component_file))
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad-manifest", e.to_string()))?;
    let name = manifest.name.clone();
    if state.static_names.contains(&name) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "static-topology",
            format!("topology {name:?} is given to a worker with --topology; an upload cannot replace it"),
        ));
    }
    let snapshot = state.registry.snapshot();
    if let Some((other, _)) = snapshot.entries.get(&name).filter(|(e, _)| !who.owns(&e.tenant)) {
        let _ = other;
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "name-taken",
            format!("the topology name {name:?} is taken by another tenant; choose another"),
        ));
    }
    let mut manifest = manifest;
    if let Caller::Tenant(tenant) = &who {
        namespace_check(tenant, &manifest)?;
        let mine: Vec<&Entry> = snapshot
            .entries
            .values()
            .map(|(e, _)| e)
            .filter(|e| e.tenant == tenant.name && e.name != name)
            .collect();
        if let Some(max) = tenant.max_topologies.filter(|max| mine.len() as u32 >= *max) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "over-limit",
                format!(
                    "tenant {} has {} topologies, its limit (max-topologies = {max})",
                    tenant.name,
                    mine.len()
                ),
            ));
        }
        // Its manifest's limits, capped by the tenant's (checked against the worker's below).
        let cap = tenant_cap(tenant);
        cap.cap(&mut manifest.limits);
    }
    // Everything a worker checks before running it, on a blocking thread: compiling and
    // describing run guest code (under the sandbox's limits).
    let st = state.clone();
    let checked = tokio::task::spawn_blocking(move || check(&st, manifest, &component).map(|d| (d, component)))
        .await
        .map_err(internal)?;
    let ((description, partitions), component) = checked?;
    if let Caller::Tenant(tenant) = &who {
        let others: u32 = snapshot
            .entries
            .values()
            .map(|(e, _)| e)
            .filter(|e| e.tenant == tenant.name && e.name != name)
            .map(|e| e.partitions)
            .sum();
        if let Some(max) = tenant.max_tasks.filter(|max| others + partitions as u32 > *max) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "over-limit",
                format!(
                    "tenant {} would run {} tasks with this topology's {partitions}, over its limit (max-tasks = {max})",
                    tenant.name,
                    others + partitions as u32
                ),
            ));
        }
    }
    let digest = registry::digest(&component);
    let previous = snapshot.entries.get(&name).map(|(e, _)| e.clone());
    if let Some(p) = previous.as_ref().filter(|p| p.digest == digest && p.manifest == text) {
        return Ok((StatusCode::OK, Json(p.clone())).into_response());
    }
    let entry = Entry {
        name: name.clone(),
        version: previous.as_ref().map_or(1, |p| p.version + 1),
        manifest: text,
        digest: digest.clone(),
        size: component.len() as u64,
        chunks: component.len().div_ceil(registry::CHUNK_BYTES) as u32,
        uploaded_at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64),
        partitions: partitions as u32,
        sources: description.sources,
        sinks: description.sinks,
        stores: description.stores,
        tenant: who.name().to_string(),
        max_memory: None,
        max_call_timeout_ms: None,
    };
    let entry = match &who {
        Caller::Tenant(tenant) => Entry {
            max_memory: tenant.max_memory,
            max_call_timeout_ms: tenant.max_call_timeout.map(|d| d.as_millis() as u64),
            ..entry
        },
        Caller::Admin => entry,
    };
    let present = snapshot.entries.values().any(|(e, _)| e.digest == digest);
    let st = state.clone();
    let e = entry.clone();
    tokio::task::spawn_blocking(move || st.writer.put(&e, &component, present))
        .await
        .map_err(internal)?
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "registry", format!("{e:#}")))?;
    settle(&state).await;
    tracing::info!(topology = %name, version = entry.version, digest = %entry.digest, "uploaded to the registry");
    Ok((StatusCode::CREATED, Json(entry)).into_response())
}

/// A tenant's limits as an entry carries them.
fn tenant_cap(tenant: &crate::tenants::Tenant) -> Entry {
    Entry {
        name: String::new(),
        version: 0,
        manifest: String::new(),
        digest: String::new(),
        size: 0,
        chunks: 0,
        uploaded_at_ms: 0,
        partitions: 0,
        sources: vec![],
        sinks: vec![],
        stores: vec![],
        tenant: tenant.name.clone(),
        max_memory: tenant.max_memory,
        max_call_timeout_ms: tenant.max_call_timeout.map(|d| d.as_millis() as u64),
    }
}

/// A tenant's topology is named inside its namespace and binds only topics in it (its
/// changelogs, `<name>-<store>-changelog`, then are too).
fn namespace_check(tenant: &crate::tenants::Tenant, manifest: &Manifest) -> Result<(), ApiError> {
    let ns = &tenant.namespace;
    if !manifest.name.starts_with(ns.as_str()) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "foreign-name",
            format!(
                "topology {:?} is outside tenant {}'s namespace: its name must start with {ns:?}",
                manifest.name, tenant.name
            ),
        ));
    }
    let topics = manifest
        .sources
        .iter()
        .map(|(n, t)| ("source", n, t))
        .chain(manifest.sinks.iter().map(|(n, t)| ("sink", n, t)));
    for (kind, binding, topic) in topics {
        if !topic.starts_with(ns.as_str()) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "foreign-topic",
                format!(
                    "{kind} {binding:?} is bound to {topic:?}, outside tenant {}'s namespace {ns:?}",
                    tenant.name
                ),
            ));
        }
    }
    if let Some(topic) = manifest
        .dead_letter_topic
        .as_ref()
        .filter(|t| !t.starts_with(ns.as_str()))
    {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "foreign-topic",
            format!(
                "dead-letter-topic {topic:?} is outside tenant {}'s namespace {ns:?}",
                tenant.name
            ),
        ));
    }
    Ok(())
}

/// Checks an upload as a worker would before running it: a component of our world that
/// describes itself (within the sandbox's limits), a manifest that binds what it declares
/// within its limits, topics that exist. Returns its description and partition count.
fn check(
    state: &AdminState,
    manifest: Manifest,
    component: &[u8],
) -> Result<(sluice_guest::Description, i32), ApiError> {
    let loaded = state
        .runtime
        .load_bytes(&manifest.component.display().to_string(), component)
        .map_err(|e| {
            let (status, kind) = match &e {
                LoadError::Read { .. } | LoadError::NotAComponent { .. } => {
                    (StatusCode::BAD_REQUEST, "not-a-component")
                }
                LoadError::WrongWorld { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "wrong-world"),
                LoadError::Describe { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "describe-failed"),
                LoadError::BadDescription { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "bad-description"),
            };
            ApiError::new(status, kind, e.to_string())
        })?;
    let loaded = loaded
        .with_limits(&manifest.limits)
        .map_err(|m| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "bad-limits", m))?;
    let binding = manifest
        .bind(loaded.description())
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "bad-binding", e.to_string()))?;
    let partitions = crate::worker::check_topics(&state.bootstrap, &manifest, &binding, Duration::from_secs(2))
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "bad-topic", format!("{e:#}")))?;
    Ok((loaded.description().clone(), partitions))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_openapi_description_names_every_route() {
        for route in [
            "/v1/topologies:",
            "/v1/topologies/{name}:",
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
