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

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Multipart, Path as UrlPath, Query, State};
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
    /// The stores of the active tasks here (for interactive queries).
    pub state: Arc<crate::worker::task_state::StateEnv>,
    /// When each tenant's last deploys and deletes through this worker were made (for
    /// `max-deploys-per-minute`).
    pub deploys: std::sync::Mutex<HashMap<String, std::collections::VecDeque<std::time::Instant>>>,
}

impl AdminState {
    /// Counts a deploy or delete of `who`, or refuses it (429) when its tenant made
    /// `max-deploys-per-minute` of them in the last minute: through any worker of the
    /// cluster (as the registry tells), or tried through this one (each costs this worker
    /// a check and a compile, even when refused).
    fn deploy_allowed(&self, who: &Caller) -> Result<(), ApiError> {
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
    /// Its tasks as the workers running them report them now: each active, standby and
    /// learner copy, on which worker, in which phase, how far behind (describe only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tasks: Option<Vec<TaskPlace>>,
    /// Partitions no worker reports an active task for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unassigned: Option<Vec<u32>>,
    /// Workers that could not be asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problems: Option<Vec<String>>,
}

/// One copy of a task, on one worker.
#[derive(Debug, Serialize)]
pub struct TaskPlace {
    pub task: String,
    /// The admin address of the worker that has it.
    pub worker: String,
    #[serde(flatten)]
    pub status: crate::worker::board::TaskStatus,
}

/// The routes, for the worker's admin listener.
pub fn router(state: Arc<AdminState>) -> axum::Router {
    // Room for the manifest and the multipart framing beside the largest component.
    let limit = state.max_component_bytes + (1 << 20);
    axum::Router::new()
        .route("/v1/topologies", post(upload).get(list))
        .route("/v1/topologies/{name}", get(describe).delete(delete))
        .route("/v1/tenants", get(tenants).post(create_tenant))
        .route("/v1/tenants/{name}", axum::routing::delete(delete_tenant))
        .route("/v1/topologies/{name}/stores/{store}", get(query))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// The token of `Authorization: Bearer TOKEN`, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The tenants now: the configuration file's and those an admin created through the API.
fn tenancy(state: &AdminState) -> Tenancy {
    let snapshot = state.registry.snapshot();
    state.tenancy.with(&snapshot.tenants).unwrap_or_else(|e| {
        tracing::warn!(
            "the tenants created through the API do not fit the configuration file's: {e}; using the file's"
        );
        state.tenancy.clone()
    })
}

/// Who calls: `Authorization: Bearer TOKEN`, checked against the token hashes of the
/// file's and the API's tenants.
fn caller(state: &AdminState, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let token = bearer(headers);
    tenancy(state).caller(token).ok_or_else(|| {
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
                tasks: None,
                unassigned: None,
                problems: None,
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
    let Some((entry, _)) = snapshot.entries.get(&name).filter(|(e, _)| who.owns(&e.tenant)) else {
        return Err(not_found(&state, &name));
    };
    // Where its tasks are: every member's live status.
    let mut tasks = Vec::new();
    let mut problems = Vec::new();
    match ask_members(&state, "/status", None).await {
        Ok(answers) => {
            for (admin, answer) in answers {
                match answer {
                    Ok((code, body)) if code.is_success() => {
                        match serde_json::from_slice::<crate::worker::board::WorkerStatus>(&body) {
                            Ok(status) => tasks.extend(
                                status
                                    .tasks
                                    .into_iter()
                                    .filter(|t| t.task.rsplit_once('/').is_some_and(|(topology, _)| topology == name))
                                    .map(|t| TaskPlace {
                                        task: t.task.clone(),
                                        worker: admin.clone(),
                                        status: t,
                                    }),
                            ),
                            Err(e) => problems.push(format!("{admin}: its status is not readable: {e}")),
                        }
                    }
                    Ok((code, body)) => {
                        problems.push(format!("{admin} answered {code}: {}", String::from_utf8_lossy(&body)))
                    }
                    Err(e) => problems.push(format!("{admin}: {e:#}")),
                }
            }
        }
        Err(e) => problems.push(e.message),
    }
    let partition = |t: &TaskPlace| t.task.rsplit_once('/').and_then(|(_, p)| p.parse::<u32>().ok());
    tasks.sort_by_key(|t| (partition(t), t.status.role as u8, t.worker.clone()));
    let unassigned = (0..entry.partitions)
        .filter(|p| {
            !tasks
                .iter()
                .any(|t| partition(t) == Some(*p) && t.status.role == crate::worker::board::Role::Active)
        })
        .collect();
    Ok(Json(TopologyView {
        entry: entry.clone(),
        origin: "registry",
        tasks: Some(tasks),
        unassigned: Some(unassigned),
        problems: Some(problems),
    }))
}

/// Asks every member of the cluster (by its admin address) for `path`.
async fn ask_members(
    state: &AdminState,
    path: &str,
    token: Option<&str>,
) -> Result<Vec<(String, anyhow::Result<(StatusCode, bytes::Bytes)>)>, ApiError> {
    let (bootstrap, group) = (
        state.bootstrap.clone(),
        crate::worker::group_runner::group_id(&state.cluster),
    );
    let admins = tokio::task::spawn_blocking(move || member_admins(&bootstrap, &group))
        .await
        .map_err(internal)?
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "cluster", e))?;
    let asks = admins.iter().map(|admin| async move {
        let answer =
            crate::http_client::send(hyper::Method::GET, admin, path, token, None, Duration::from_secs(10)).await;
        (admin.clone(), answer)
    });
    Ok(futures::future::join_all(asks).await)
}

/// What a query asks: one key, or a range of keys (`from` inclusive, `to` exclusive, at most
/// `limit`), each as text or as hex (`*_hex`). `local`: answer from this worker's stores only
/// (how workers ask each other).
#[derive(Debug, Default, serde::Deserialize)]
pub struct QueryParams {
    key: Option<String>,
    key_hex: Option<String>,
    from: Option<String>,
    from_hex: Option<String>,
    to: Option<String>,
    to_hex: Option<String>,
    limit: Option<usize>,
    #[serde(default)]
    local: bool,
}

/// One entry of a store, as a query answers it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct Found {
    pub partition: i32,
    /// The key as text (when it is UTF-8) and as hex.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub key: Option<String>,
    pub key_hex: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub value: Option<String>,
    pub value_hex: String,
    /// Which worker answered (its admin address; empty for a local answer).
    #[serde(default)]
    pub worker: String,
}

/// Most entries a range query answers by default.
const QUERY_LIMIT: usize = 1000;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(name: &str, text: &str) -> Result<Vec<u8>, ApiError> {
    let bad = || {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad-request",
            format!("{name} = {text:?} is not hex"),
        )
    };
    if !text.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).map_err(|_| bad()))
        .collect()
}

fn bytes_of(name: &str, text: &Option<String>, hex: &Option<String>) -> Result<Option<Vec<u8>>, ApiError> {
    match (text, hex) {
        (Some(_), Some(_)) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad-request",
            format!("give {name} or {name}_hex, not both"),
        )),
        (Some(t), None) => Ok(Some(t.as_bytes().to_vec())),
        (None, Some(h)) => unhex(&format!("{name}_hex"), h).map(Some),
        (None, None) => Ok(None),
    }
}

fn found(partition: i32, key: &[u8], value: &[u8]) -> Found {
    Found {
        partition,
        key: std::str::from_utf8(key).ok().map(str::to_string),
        key_hex: hex(key),
        value: std::str::from_utf8(value).ok().map(str::to_string),
        value_hex: hex(value),
        worker: String::new(),
    }
}

/// `GET /v1/topologies/{name}/stores/{store}`: the committed state of a store, read by the
/// workers that run its tasks (each worker asks every member and merges the answers).
async fn query(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    UrlPath((name, store)): UrlPath<(String, String)>,
    Query(params): Query<QueryParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let who = caller(&state, &headers)?;
    let snapshot = state.registry.snapshot();
    let owned = snapshot.entries.get(&name).filter(|(e, _)| who.owns(&e.tenant));
    let entry = match owned {
        Some((e, _)) => Some(e.clone()),
        // Topologies given with --topology are the admin's.
        None if state.static_names.contains(&name) && who == Caller::Admin => None,
        None => return Err(not_found(&state, &name)),
    };
    if let Some(e) = entry.as_ref().filter(|e| !e.stores.contains(&store)) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no-such-store",
            format!(
                "topology {name:?} has no store {store:?} (it declares {})",
                e.stores.join(", ")
            ),
        ));
    }
    let key = bytes_of("key", &params.key, &params.key_hex)?;
    let from = bytes_of("from", &params.from, &params.from_hex)?;
    let to = bytes_of("to", &params.to, &params.to_hex)?;
    let limit = params.limit.unwrap_or(QUERY_LIMIT).min(100_000);
    if params.local {
        let st = state.clone();
        let (n, s) = (name.clone(), store.clone());
        let local = tokio::task::spawn_blocking(move || read_local(&st, &n, &s, key.as_deref(), from, to, limit))
            .await
            .map_err(internal)??;
        return Ok(Json(serde_json::json!({ "entries": local.0, "partitions": local.1 })));
    }
    // Every member answers for the tasks it runs.
    let mut path = format!("/v1/topologies/{name}/stores/{store}?local=true&limit={limit}");
    for (k, v) in [
        (
            "key_hex",
            params
                .key_hex
                .clone()
                .or(params.key.as_ref().map(|k| hex(k.as_bytes()))),
        ),
        (
            "from_hex",
            params
                .from_hex
                .clone()
                .or(params.from.as_ref().map(|k| hex(k.as_bytes()))),
        ),
        (
            "to_hex",
            params.to_hex.clone().or(params.to.as_ref().map(|k| hex(k.as_bytes()))),
        ),
    ] {
        if let Some(v) = v {
            path.push_str(&format!("&{k}={v}"));
        }
    }
    let answers = ask_members(&state, &path, bearer(&headers)).await?;
    let mut entries: Vec<Found> = Vec::new();
    let mut answered: Vec<i32> = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    for (admin, answer) in answers {
        match answer {
            Ok((code, body)) if code.is_success() => {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let mut found: Vec<Found> = serde_json::from_value(v["entries"].clone()).unwrap_or_default();
                for f in &mut found {
                    f.worker = admin.clone();
                }
                entries.extend(found);
                answered.extend(
                    v["partitions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|p| p.as_i64())
                        .map(|p| p as i32),
                );
            }
            Ok((code, body)) => problems.push(format!("{admin} answered {code}: {}", String::from_utf8_lossy(&body))),
            Err(e) => problems.push(format!("{admin}: {e:#}")),
        }
    }
    entries.sort_by(|a, b| (&a.key_hex, a.partition).cmp(&(&b.key_hex, b.partition)));
    entries.dedup_by(|a, b| a.key_hex == b.key_hex && a.partition == b.partition);
    entries.truncate(limit);
    answered.sort();
    answered.dedup();
    let missing: Vec<u32> = entry
        .as_ref()
        .map(|e| (0..e.partitions).filter(|p| !answered.contains(&(*p as i32))).collect())
        .unwrap_or_default();
    Ok(Json(serde_json::json!({
        "topology": name,
        "store": store,
        "entries": entries,
        "partitions_answered": answered,
        "partitions_missing": missing,
        "problems": problems,
    })))
}

/// The admin addresses of the cluster's members (from the group coordinator).
fn member_admins(bootstrap: &str, group: &str) -> Result<Vec<String>, String> {
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| e.to_string())?;
    let list = consumer
        .fetch_group_list(Some(group), Duration::from_secs(10))
        .map_err(|e| format!("describing group {group}: {e}"))?;
    let mut out = Vec::new();
    for g in list.groups().iter().filter(|g| g.name() == group) {
        for m in g.members() {
            let meta = m
                .metadata()
                .and_then(|b| crate::group::metadata::MemberMetadata::decode(b).ok());
            if let Some(admin) = meta.map(|m| m.admin).filter(|a| !a.is_empty()) {
                out.push(admin);
            }
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Reads this worker's active stores: one key, or a range. Returns the entries and the
/// partitions it holds.
fn read_local(
    state: &AdminState,
    topology: &str,
    store: &str,
    key: Option<&[u8]>,
    from: Option<Vec<u8>>,
    to: Option<Vec<u8>>,
    limit: usize,
) -> Result<(Vec<Found>, Vec<i32>), ApiError> {
    let stores = state.state.active_stores(topology, store);
    let mut out = Vec::new();
    for (partition, db) in &stores {
        let failed = |e: rocksdb::Error| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "store", e.to_string());
        if let Some(key) = key {
            if let Some(value) = db.get(key).map_err(failed)? {
                out.push(found(*partition, key, &value));
            }
            continue;
        }
        let start = from.clone().unwrap_or_default();
        let mode = rocksdb::IteratorMode::From(&start, rocksdb::Direction::Forward);
        for item in db.iterator(mode) {
            let (k, v) = item.map_err(failed)?;
            if to.as_deref().is_some_and(|to| &*k >= to) || out.len() >= limit {
                break;
            }
            out.push(found(*partition, &k, &v));
        }
    }
    Ok((out, stores.iter().map(|(p, _)| *p).collect()))
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
    max_deploys_per_minute: Option<u32>,
    #[serde(flatten)]
    caps: crate::tenants::Caps,
    /// `file` (the configuration file) or `api` (created by an admin through the API).
    defined_in: &'static str,
}

/// `POST /v1/tenants`: a tenant as the configuration file writes one, with its name.
#[derive(Debug, serde::Deserialize)]
pub struct NewTenant {
    name: String,
    #[serde(flatten)]
    tenant: crate::tenants::RawTenant,
}

/// Writes to the registry on a blocking thread (503 `registry` when Kafka refuses), then
/// waits until this worker has read the write back, so the answer's caller sees it here.
async fn store(
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

fn admin_only(who: &Caller) -> Result<(), ApiError> {
    match who {
        Caller::Admin => Ok(()),
        Caller::Tenant(t) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "admin-only",
            format!("only the admin manages tenants (the token is tenant {}'s)", t.name),
        )),
    }
}

/// Creates a tenant, or changes one created through the API; every worker learns of it
/// from the registry.
async fn create_tenant(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let who = caller(&state, &headers)?;
    admin_only(&who)?;
    let new: NewTenant = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad-tenant",
            format!("the tenant is not valid: {e}"),
        )
    })?;
    let name = new.name.clone();
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad-tenant",
            format!("tenant name {name:?}: letters, digits, '.', '_' and '-'"),
        ));
    }
    if state.tenancy.in_file(&name) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "name-taken",
            format!("tenant {name:?} is defined in the workers' configuration file; change it there"),
        ));
    }
    if !state.tenancy.has_admin_tokens() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "no-admin-token",
            "this cluster has no admin token ([admin] tokens in the configuration file): a tenant with a token would \
             close the open API to its admin too",
        ));
    }
    let snapshot = state.registry.snapshot();
    let mut extra = snapshot.tenants.clone();
    let existed = extra.insert(name.clone(), new.tenant.clone()).is_some();
    state
        .tenancy
        .with(&extra)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad-tenant", e))?;
    let tenant = new.tenant.clone();
    let n = name.clone();
    store(&state, move |w| w.put_tenant(&n, &tenant)).await?;
    tracing::info!(tenant = %name, "tenant {} through the API", if existed { "changed" } else { "created" });
    let status = if existed { StatusCode::OK } else { StatusCode::CREATED };
    Ok((
        status,
        Json(serde_json::json!({ "tenant": name, "namespace": new.tenant.namespace })),
    )
        .into_response())
}

/// Deletes a tenant created through the API (one without topologies).
async fn delete_tenant(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let who = caller(&state, &headers)?;
    admin_only(&who)?;
    if state.tenancy.in_file(&name) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "name-taken",
            format!("tenant {name:?} is defined in the workers' configuration file; remove it there"),
        ));
    }
    let snapshot = state.registry.snapshot();
    if !snapshot.tenants.contains_key(&name) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("no tenant {name:?} created through the API"),
        ));
    }
    let owned: Vec<&str> = snapshot
        .entries
        .values()
        .filter(|(e, _)| e.tenant == name)
        .map(|(e, _)| e.name.as_str())
        .collect();
    if !owned.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "has-topologies",
            format!(
                "tenant {name:?} has topologies ({}); delete them first",
                owned.join(", ")
            ),
        ));
    }
    let n = name.clone();
    store(&state, move |w| w.delete_tenant(&n)).await?;
    Ok(Json(serde_json::json!({ "deleted": name })))
}

async fn tenants(State(state): State<Arc<AdminState>>, headers: HeaderMap) -> Result<Json<Vec<TenantView>>, ApiError> {
    let who = caller(&state, &headers)?;
    let snapshot = state.registry.snapshot();
    Ok(Json(
        tenancy(&state)
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
                    max_deploys_per_minute: t.max_deploys_per_minute,
                    caps: t.caps,
                    defined_in: if state.tenancy.in_file(&t.name) { "file" } else { "api" },
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
    state.deploy_allowed(&who)?;
    let shared = snapshot
        .entries
        .values()
        .any(|(e, _)| e.name != name && e.digest == entry.digest);
    let e = entry.clone();
    store(&state, move |w| w.delete(&e, !shared)).await?;
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

/// `POST /v1/topologies?reprocess_from=…`: where the deployed version starts reading.
#[derive(Debug, Default, serde::Deserialize)]
pub struct UploadParams {
    reprocess_from: Option<String>,
}

async fn upload(
    State(state): State<Arc<AdminState>>,
    headers: HeaderMap,
    Query(params): Query<UploadParams>,
    form: Multipart,
) -> Result<Response, ApiError> {
    let who = caller(&state, &headers)?;
    let reprocess_from = params
        .reprocess_from
        .as_deref()
        .map(str::parse::<crate::manifest::StartFrom>)
        .transpose()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad-request", format!("reprocess_from: {e}")))?;
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
    if snapshot.entries.get(&name).is_some_and(|(e, _)| !who.owns(&e.tenant)) {
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
        tenant.caps.apply(&mut manifest.limits);
    }
    // Counted before compiling: what the limit protects is the work of checking uploads.
    state.deploy_allowed(&who)?;
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
    if let Some(p) = previous
        .as_ref()
        .filter(|p| p.digest == digest && p.manifest == text && reprocess_from.is_none())
    {
        return Ok((StatusCode::OK, Json(p.clone())).into_response());
    }
    let version = previous.as_ref().map_or(1, |p| p.version + 1);
    // Reprocessing: this version commits in a fresh group, which starts there. Otherwise
    // the group (and its start) of the version before stays.
    let (offsets_epoch, reprocess_from) = match reprocess_from {
        Some(from) => (version, Some(from)),
        None => previous
            .as_ref()
            .map_or((0, None), |p| (p.offsets_epoch, p.reprocess_from)),
    };
    let entry = Entry {
        name: name.clone(),
        version,
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
        caps: match &who {
            Caller::Tenant(tenant) => tenant.caps,
            Caller::Admin => Default::default(),
        },
        offsets_epoch,
        reprocess_from,
    };
    let present = snapshot.entries.values().any(|(e, _)| e.digest == digest);
    let e = entry.clone();
    store(&state, move |w| w.put(&e, &component, present)).await?;
    tracing::info!(topology = %name, version = entry.version, digest = %entry.digest, "uploaded to the registry");
    Ok((StatusCode::CREATED, Json(entry)).into_response())
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
) -> Result<(sluice_wire::Description, i32), ApiError> {
    let loaded = state
        .runtime
        .load_bytes(&manifest.component.display().to_string(), component)
        .map_err(|e| {
            let (status, kind) = match &e {
                LoadError::Read { .. } | LoadError::NotAComponent { .. } => {
                    (StatusCode::BAD_REQUEST, "not-a-component")
                }
                LoadError::WrongWorld { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "wrong-world"),
                LoadError::WrongVersion { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "wrong-version"),
                LoadError::MissingExport { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "missing-export"),
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
            "/v1/topologies/{name}/stores/{store}:",
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
