//! `/v1/topologies`: upload (checked as its worker would run it, then stored in the
//! registry), list, describe (with where each task runs now) and delete topologies. A
//! tenant sees and touches only its own, named and bound inside its namespace.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, Multipart, Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::{internal, not_found, store, AdminState, ApiError};
use crate::manifest::Manifest;
use crate::registry::tenants::{Caller, Tenant};
use crate::registry::{self, Entry};
use crate::runtime::LoadError;
use crate::worker::handle::DeployCheckError;

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
    /// Tasks no worker reports an active copy of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unassigned: Option<Vec<String>>,
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

pub(super) async fn list(
    State(state): State<Arc<AdminState>>,
    Extension(who): Extension<Caller>,
) -> Result<Json<Vec<TopologyView>>, ApiError> {
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

pub(super) async fn describe(
    State(state): State<Arc<AdminState>>,
    Extension(who): Extension<Caller>,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<TopologyView>, ApiError> {
    let snapshot = state.registry.snapshot();
    // Another tenant's topology is not there, as far as this caller can tell.
    let Some((entry, _)) = snapshot.entries.get(&name).filter(|(e, _)| who.owns(&e.tenant)) else {
        return Err(not_found(&state, &who, &name));
    };
    // Where its tasks are: every member's live status.
    let mut tasks = Vec::new();
    let mut problems = Vec::new();
    match super::queries::ask_members(&state, "/status", 16 << 20).await {
        Ok(answers) => {
            for (admin, answer) in answers {
                match answer {
                    Ok((code, body)) if code.is_success() => {
                        match serde_json::from_slice::<crate::worker::board::WorkerStatus>(&body) {
                            Ok(status) => tasks.extend(
                                status
                                    .tasks
                                    .into_iter()
                                    .filter(|t| t.task.split_once('/').is_some_and(|(topology, _)| topology == name))
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
    let all = entry.tasks();
    let place = |t: &TaskPlace| all.iter().position(|id| id.to_string() == t.task);
    tasks.sort_by_key(|t| (place(t), t.status.role as u8, t.worker.clone()));
    let unassigned = all
        .iter()
        .map(|id| id.to_string())
        .filter(|id| {
            !tasks
                .iter()
                .any(|t| t.task == *id && t.status.role == crate::worker::board::Role::Active)
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

/// `DELETE /v1/topologies/{name}?purge-internal=true` also deletes the topics the host made
/// for it (changelogs, repartition topics), once no worker runs its tasks.
#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct DeleteParams {
    #[serde(default, rename = "purge-internal")]
    purge_internal: bool,
}

/// How long a delete that purges internal topics waits for the workers to stop its tasks.
const STOP_WAIT: Duration = Duration::from_secs(60);

pub(super) async fn delete(
    State(state): State<Arc<AdminState>>,
    Extension(who): Extension<Caller>,
    UrlPath(name): UrlPath<String>,
    Query(params): Query<DeleteParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let _turn = state.turn(&who).await?;
    let snapshot = state.registry.snapshot();
    let Some((entry, _)) = snapshot
        .entries
        .get(&name)
        .filter(|(e, _)| who.owns(&e.tenant))
        .cloned()
    else {
        return Err(not_found(&state, &who, &name));
    };
    state.deploy_allowed(&who)?;
    let shared = snapshot
        .entries
        .values()
        .any(|(e, _)| e.name != name && e.digest == entry.digest);
    let e = entry.clone();
    store(&state, move |w| w.delete(&e, !shared)).await?;
    let mut answer = serde_json::json!({ "deleted": name, "version": entry.version });
    if params.purge_internal {
        let topics = entry.internal_topic_names();
        // Not while a task may still write one (a producer could create it again).
        let deadline = tokio::time::Instant::now() + STOP_WAIT;
        loop {
            let running = running_tasks(&state, &name).await;
            if running.is_empty() {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "still-running",
                    format!(
                        "topology {name} is deleted, but {} of its tasks still ran {}s later ({}); its internal topics \
                         are kept: delete them once its tasks have stopped ({})",
                        running.len(),
                        STOP_WAIT.as_secs(),
                        running.join(", "),
                        topics.join(", ")
                    ),
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let kafka = state.worker.kafka().clone();
        let to_delete = topics.clone();
        tokio::task::spawn_blocking(move || crate::topology::delete_topics(&kafka, &to_delete))
            .await
            .map_err(internal)?
            .map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "kafka",
                    format!("topology {name} is deleted, but deleting its internal topics failed: {e:#}"),
                )
            })?;
        tracing::info!(topology = %name, topics = ?topics, "deleted its internal topics");
        answer["purged"] = serde_json::json!(topics);
    }
    Ok(Json(answer))
}

/// The tasks (active or standby) of `name` some worker reports; a worker that does not
/// answer counts as running them (it may).
async fn running_tasks(state: &Arc<AdminState>, name: &str) -> Vec<String> {
    let mut running = Vec::new();
    match super::queries::ask_members(state, "/status", 16 << 20).await {
        Ok(answers) => {
            for (admin, answer) in answers {
                let status = match answer {
                    Ok((code, body)) if code.is_success() => {
                        serde_json::from_slice::<crate::worker::board::WorkerStatus>(&body).ok()
                    }
                    _ => None,
                };
                match status {
                    Some(status) => running.extend(
                        status
                            .tasks
                            .into_iter()
                            .filter(|t| t.task.split_once('/').is_some_and(|(topology, _)| topology == name))
                            .map(|t| format!("{} on {admin}", t.task)),
                    ),
                    None => running.push(format!("whatever {admin} runs (it did not answer)")),
                }
            }
        }
        Err(e) => running.push(e.message),
    }
    running
}

/// An upload: its manifest text and component bytes, each with the file name it was sent
/// under (for messages).
struct Upload {
    manifest: (String, String),
    component: (String, bytes::Bytes),
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
            "component" => component = Some((file, bytes)),
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

/// `POST /v1/topologies?reprocess_from=…&background=true`: where the deployed version
/// starts reading, and whether to answer before the check (see [`super::uploads`]).
#[derive(Debug, Default, serde::Deserialize)]
pub struct UploadParams {
    reprocess_from: Option<String>,
    #[serde(default)]
    background: bool,
}

pub(super) async fn upload(
    State(state): State<Arc<AdminState>>,
    Extension(who): Extension<Caller>,
    Query(params): Query<UploadParams>,
    form: Multipart,
) -> Result<Response, ApiError> {
    let reprocess_from = params
        .reprocess_from
        .as_deref()
        .map(str::parse::<crate::manifest::StartFrom>)
        .transpose()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad-request", format!("reprocess_from: {e}")))?;
    // One upload of a caller at a time through this worker (its quota is checked against
    // what the one before stored), and a few of all callers: taken before the body is read,
    // so uploads that wait hold a connection, not a component.
    let turn = state.turn(&who).await?;
    let slot = state.upload_slot().await?;
    let Upload {
        manifest: (manifest_file, text),
        component: (component_file, component),
    } = read_upload(form, state.max_component_bytes).await?;
    if component.len() > state.max_component_bytes {
        return Err(too_large(Some(component.len()), state.max_component_bytes));
    }
    let mut manifest = Manifest::parse_uploaded(&text, &manifest_file, Path::new(&component_file))
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad-manifest", e.to_string()))?;
    let name = manifest.name.clone();
    let snapshot = admit_name(&state, &who, &manifest)?;
    if let Caller::Tenant(tenant) = &who {
        within_max_topologies(tenant, &snapshot, &name)?;
        // Its manifest's limits, capped by the tenant's (checked against the worker's below).
        tenant.caps.apply(&mut manifest.limits);
    }
    // Counted before compiling: what the limit protects is the work of checking uploads.
    state.deploy_allowed(&who)?;
    if params.background {
        // Answered now; the check and the write go on, holding the caller's turn and the
        // upload slot until they end.
        let job = state.uploads.start(&name, who.name(), component.len());
        let (st, id) = (state.clone(), job.id.clone());
        tokio::spawn(async move {
            let result = check_and_store(&st, &who, manifest, component, text, &snapshot, reprocess_from).await;
            match &result {
                Ok((_, entry)) => tracing::info!(topology = %entry.name, upload = %id, "background upload done"),
                Err(e) => tracing::info!(upload = %id, "background upload failed: {}", e.message),
            }
            st.uploads.finish(&id, result);
            drop((turn, slot));
        });
        return Ok((StatusCode::ACCEPTED, Json(job)).into_response());
    }
    let (status, entry) = check_and_store(&state, &who, manifest, component, text, &snapshot, reprocess_from).await?;
    drop((turn, slot));
    Ok((status, Json(entry)).into_response())
}

/// Checks an upload as its worker would (compiling, describing, binding, topics), then
/// writes it to the registry: `201` and the new entry, or `200` and the entry there when
/// the same component and manifest are deployed.
async fn check_and_store(
    state: &Arc<AdminState>,
    who: &Caller,
    manifest: Manifest,
    component: bytes::Bytes,
    text: String,
    snapshot: &registry::Snapshot,
    reprocess_from: Option<crate::manifest::StartFrom>,
) -> Result<(StatusCode, Entry), ApiError> {
    let name = manifest.name.clone();
    // Everything a worker checks before running it, on a blocking thread: compiling and
    // describing run guest code (under the sandbox's limits).
    let st = state.clone();
    let checked = tokio::task::spawn_blocking(move || check(&st, manifest, &component).map(|d| (d, component)))
        .await
        .map_err(internal)?;
    let ((description, stages, operators), component) = checked?;
    let partitions: u32 = stages.iter().map(|s| s.partitions as u32).sum();
    let subtopologies = subtopology_entries(&stages, &description, &operators);
    if let Caller::Tenant(tenant) = who {
        within_max_tasks(tenant, snapshot, &name, partitions)?;
    }
    let digest = registry::digest(&component);
    let previous = snapshot.entries.get(&name).map(|(e, _)| e.clone());
    if let Some(p) = previous
        .as_ref()
        .filter(|p| p.digest == digest && p.manifest == text && reprocess_from.is_none())
    {
        return Ok((StatusCode::OK, p.clone()));
    }
    let (version, offsets_epoch, reprocess_from) = next_version(previous.as_ref(), reprocess_from);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let entry = Entry {
        name: name.clone(),
        version,
        manifest: text,
        digest: digest.clone(),
        size: component.len() as u64,
        chunks: component.len().div_ceil(registry::CHUNK_BYTES) as u32,
        uploaded_at_ms: now_ms,
        created_at_ms: previous.as_ref().map_or(now_ms, Entry::first_uploaded_ms),
        partitions,
        subtopologies,
        internal_topics: description.internal_topics.iter().map(|t| t.name.clone()).collect(),
        sources: description.sources,
        sinks: description.sinks,
        stores: description.stores,
        // With one sub-topology, what it says of its operators is the topology's.
        operators: if stages.len() == 1 && stages[0].sub.is_none() {
            operators.into_iter().next().map(|(_, lines)| lines).unwrap_or_default()
        } else {
            Vec::new()
        },
        tenant: who.name().to_string(),
        caps: match who {
            Caller::Tenant(tenant) => tenant.caps,
            Caller::Admin | Caller::Worker | Caller::Operator => Default::default(),
        },
        offsets_epoch,
        reprocess_from,
    };
    let present = snapshot.entries.values().any(|(e, _)| e.digest == digest);
    let e = entry.clone();
    store(state, move |w| w.put(&e, &component, present)).await?;
    tracing::info!(topology = %name, version = entry.version, digest = %entry.digest, "uploaded to the registry");
    Ok((StatusCode::CREATED, entry))
}

/// Whether `who` may upload a topology of this name: inside its namespace, not a worker's
/// `--topology`, not another tenant's. Returns the registry as it was when asked.
fn admit_name(state: &AdminState, who: &Caller, manifest: &Manifest) -> Result<Arc<registry::Snapshot>, ApiError> {
    let name = &manifest.name;
    // A name outside the tenant's namespace is refused before anything tells whether it
    // exists (taken by another tenant, or a worker's --topology): the same answer either way.
    if let Caller::Tenant(tenant) = who {
        tenant
            .check_manifest(manifest)
            .map_err(|(kind, message)| ApiError::new(StatusCode::FORBIDDEN, kind, message))?;
    }
    if state.worker.is_static(name) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "static-topology",
            format!("topology {name:?} is given to a worker with --topology; an upload cannot replace it"),
        ));
    }
    let snapshot = state.registry.snapshot();
    if snapshot.entries.get(name).is_some_and(|(e, _)| !who.owns(&e.tenant)) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "name-taken",
            format!("the topology name {name:?} is taken by another tenant; choose another"),
        ));
    }
    Ok(snapshot)
}

/// A tenant's other topologies than `name` (which an upload of it replaces).
fn others_of<'a>(
    tenant: &'a Tenant,
    snapshot: &'a registry::Snapshot,
    name: &'a str,
) -> impl Iterator<Item = &'a Entry> {
    snapshot
        .entries
        .values()
        .map(|(e, _)| e)
        .filter(move |e| e.tenant == tenant.name && e.name != name)
}

/// Refuses a tenant's upload of a new topology once it has `max-topologies` of them.
fn within_max_topologies(tenant: &Tenant, snapshot: &registry::Snapshot, name: &str) -> Result<(), ApiError> {
    let mine = others_of(tenant, snapshot, name).count();
    if let Some(max) = tenant.max_topologies.filter(|max| mine as u32 >= *max) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "over-limit",
            format!(
                "tenant {} has {} topologies, its limit (max-topologies = {max})",
                tenant.name, mine
            ),
        ));
    }
    Ok(())
}

/// Refuses a tenant's upload whose `partitions` tasks would take it over `max-tasks`.
fn within_max_tasks(
    tenant: &Tenant,
    snapshot: &registry::Snapshot,
    name: &str,
    partitions: u32,
) -> Result<(), ApiError> {
    let others: u32 = others_of(tenant, snapshot, name).map(|e| e.partitions).sum();
    if let Some(max) = tenant.max_tasks.filter(|max| others + partitions > *max) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "over-limit",
            format!(
                "tenant {} would run {} tasks with this topology's {partitions}, over its limit (max-tasks = {max})",
                tenant.name,
                others + partitions
            ),
        ));
    }
    Ok(())
}

/// What the registry records of each sub-topology (none for a topology of one): its
/// partitions, what its description declares, what it says of its operators.
fn subtopology_entries(
    stages: &[crate::topology::Stage],
    description: &sluice_wire::Description,
    operators: &crate::runtime::Operators,
) -> Vec<registry::SubtopologyEntry> {
    let operators_of = |sub: &str| -> Vec<String> {
        operators
            .iter()
            .find(|(name, _)| name == sub)
            .map(|(_, lines)| lines.clone())
            .unwrap_or_default()
    };
    stages
        .iter()
        .filter_map(|s| {
            let name = s.sub.as_deref()?.to_string();
            let declared = description.subtopologies.iter().find(|d| d.name == name);
            let field = |f: fn(&sluice_wire::Subtopology) -> &Vec<String>| declared.map(f).cloned().unwrap_or_default();
            Some(registry::SubtopologyEntry {
                partitions: s.partitions as u32,
                stores: field(|d| &d.stores),
                sources: field(|d| &d.sources),
                sinks: field(|d| &d.sinks),
                operators: operators_of(&name),
                name,
            })
        })
        .collect()
}

/// The version an upload gets after `previous`, and where it commits and starts: asked to
/// reprocess, it commits in a fresh group (its epoch is its version), which starts at
/// `reprocess_from`; otherwise the group (and its start) of the version before stays.
fn next_version(
    previous: Option<&Entry>,
    reprocess_from: Option<crate::manifest::StartFrom>,
) -> (u32, u32, Option<crate::manifest::StartFrom>) {
    let version = previous.map_or(1, |p| p.version + 1);
    let (offsets_epoch, reprocess_from) = match reprocess_from {
        Some(from) => (version, Some(from)),
        None => previous.map_or((0, None), |p| (p.offsets_epoch, p.reprocess_from)),
    };
    (version, offsets_epoch, reprocess_from)
}

/// Checks an upload as its worker would before running it (see
/// [`crate::worker::WorkerHandle::check`]); each failure gets its own status and kind.
/// Returns its description, its stages and what it says of its operators.
fn check(
    state: &AdminState,
    manifest: Manifest,
    component: &[u8],
) -> Result<
    (
        sluice_wire::Description,
        Vec<crate::topology::Stage>,
        crate::runtime::Operators,
    ),
    ApiError,
> {
    let checked = state
        .worker
        .check(&manifest, component, Duration::from_secs(2))
        .map_err(|e| {
            let (status, kind) = match &e {
                DeployCheckError::Load(LoadError::Read { .. } | LoadError::NotAComponent { .. }) => {
                    (StatusCode::BAD_REQUEST, "not-a-component")
                }
                DeployCheckError::Load(LoadError::WrongWorld { .. }) => {
                    (StatusCode::UNPROCESSABLE_ENTITY, "wrong-world")
                }
                DeployCheckError::Load(LoadError::WrongVersion { .. }) => {
                    (StatusCode::UNPROCESSABLE_ENTITY, "wrong-version")
                }
                DeployCheckError::Load(LoadError::MissingExport { .. }) => {
                    (StatusCode::UNPROCESSABLE_ENTITY, "missing-export")
                }
                DeployCheckError::Load(LoadError::Describe { .. }) => {
                    (StatusCode::UNPROCESSABLE_ENTITY, "describe-failed")
                }
                DeployCheckError::Load(LoadError::BadDescription { .. }) => {
                    (StatusCode::UNPROCESSABLE_ENTITY, "bad-description")
                }
                DeployCheckError::Load(LoadError::Limits { .. }) => (StatusCode::UNPROCESSABLE_ENTITY, "bad-limits"),
                DeployCheckError::Load(LoadError::TooComplex { .. }) => {
                    (StatusCode::UNPROCESSABLE_ENTITY, "too-complex")
                }
                DeployCheckError::Load(LoadError::TooLarge { .. }) => {
                    (StatusCode::UNPROCESSABLE_ENTITY, "too-many-instances")
                }
                DeployCheckError::Limits(_) => (StatusCode::UNPROCESSABLE_ENTITY, "bad-limits"),
                DeployCheckError::Binding(_) => (StatusCode::UNPROCESSABLE_ENTITY, "bad-binding"),
                DeployCheckError::Topics(_) => (StatusCode::UNPROCESSABLE_ENTITY, "bad-topic"),
                DeployCheckError::Schema(_) => (StatusCode::CONFLICT, "bad-schema"),
            };
            ApiError::new(status, kind, e.to_string())
        })?;
    Ok((checked.description, checked.stages, checked.operators))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::StartFrom;

    fn previous(version: u32, offsets_epoch: u32, reprocess_from: Option<StartFrom>) -> Entry {
        Entry {
            name: "t".into(),
            version,
            manifest: String::new(),
            digest: String::new(),
            size: 0,
            chunks: 0,
            uploaded_at_ms: 0,
            created_at_ms: 0,
            partitions: 1,
            subtopologies: vec![],
            internal_topics: vec![],
            sources: vec![],
            sinks: vec![],
            stores: vec![],
            operators: vec![],
            tenant: String::new(),
            caps: Default::default(),
            offsets_epoch,
            reprocess_from,
        }
    }

    #[test]
    fn a_new_version_keeps_its_group_unless_it_reprocesses() {
        // The first upload: version 1 in the group of epoch 0.
        assert_eq!(next_version(None, None), (1, 0, None));
        // Reprocessing the first upload: a fresh group from the start asked for.
        assert_eq!(
            next_version(None, Some(StartFrom::Earliest)),
            (1, 1, Some(StartFrom::Earliest))
        );
        // An upgrade keeps the group (and the start) of the version before.
        let p = previous(3, 2, Some(StartFrom::Latest));
        assert_eq!(next_version(Some(&p), None), (4, 2, Some(StartFrom::Latest)));
        // Reprocessing commits in the group of its own version, from the new start.
        assert_eq!(
            next_version(Some(&p), Some(StartFrom::Offset(5))),
            (4, 4, Some(StartFrom::Offset(5)))
        );
    }
}
