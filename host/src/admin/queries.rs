//! `GET /v1/topologies/{name}/stores/{store}`: interactive queries of a store's committed
//! state, answered by the workers that run its tasks; and asking every member of the
//! cluster (by the admin address in its group metadata).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Serialize;

use super::{internal, not_found, AdminState, ApiError};
use crate::kafka::KafkaSettings;
use crate::registry::tenants::Caller;
use crate::secret::{hex, ClusterSecret};
use crate::state::engine::StateError;

/// Asks every member of the cluster (by its admin address) for `GET path`, signed as this
/// worker with the cluster secret (a caller's token is never passed on). Each answer is
/// read up to `max_bytes`.
pub(super) async fn ask_members(
    state: &AdminState,
    path: &str,
    max_bytes: usize,
) -> Result<Vec<(String, anyhow::Result<(StatusCode, bytes::Bytes)>)>, ApiError> {
    let (kafka, group, secret) = (
        state.worker.kafka().clone(),
        crate::group::cluster_group(&state.cluster),
        state.secret.clone(),
    );
    let admins = member_admins(&kafka, &group, secret)
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "cluster", e))?;
    let asks = admins.iter().map(|admin| async move {
        let mut request = super::client::Request::new(hyper::Method::GET, admin, path)
            .timeout(Duration::from_secs(10))
            .max_answer(max_bytes);
        if let Some(secret) = &state.secret {
            request = request.header(crate::secret::WORKER_HEADER, secret.request_token("GET", path));
        }
        (admin.clone(), request.send(&state.client).await)
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
    /// Set (with no value) when the value is too large for an answer: its size in bytes.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub value_bytes: Option<usize>,
    /// The value's time, for a value stored with one (a DSL table or aggregation keeps
    /// Kafka Streams' `ValueAndTimestamp`); the value above is then without it.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub timestamp: Option<i64>,
    /// Which worker answered (its admin address; empty for a local answer).
    #[serde(default)]
    pub worker: String,
}

/// Most entries a range query answers by default, and at most.
const QUERY_LIMIT: usize = 1000;
const MAX_QUERY_LIMIT: usize = 100_000;

/// Bytes of keys and values one member answers with, and one answer holds in all: a query
/// of large values stops there (and says so) instead of holding them all.
const MEMBER_ANSWER_BYTES: usize = 8 << 20;
const ANSWER_BYTES: usize = 16 << 20;

/// What one entry weighs in an answer, at most: its key and value as hex (2 bytes a byte)
/// and as JSON text (up to 6 bytes a byte: `\u0000`).
fn weight(key: usize, value: usize) -> usize {
    8 * (key + value) + 128
}

fn unhex(name: &str, text: &str) -> Result<Vec<u8>, ApiError> {
    crate::secret::unhex(text).ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad-request",
            format!("{name} = {text:?} is not hex (an even number of the digits 0-9 and a-f)"),
        )
    })
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

/// What ends a value stored with its time by the SDK's stream DSL: the time (8 bytes,
/// big-endian), then this tag (`guest-sdk/src/dsl/stamp.rs`). Its first two bytes never
/// occur in UTF-8.
const STAMP_TAG: [u8; 8] = [0xF5, 0xC1, b'S', b'l', b'T', b's', 0x00, 0x01];

/// A stored value's bytes and its time, if it was stored with one.
fn unstamp(stored: &[u8]) -> (&[u8], Option<i64>) {
    match stored.len().checked_sub(8 + STAMP_TAG.len()) {
        Some(at) if stored.ends_with(&STAMP_TAG) => {
            let ts: [u8; 8] = stored[at..at + 8].try_into().expect("8 bytes");
            (&stored[..at], Some(i64::from_be_bytes(ts)))
        }
        _ => (stored, None),
    }
}

fn found(partition: i32, key: &[u8], stored: &[u8]) -> Found {
    let (value, timestamp) = unstamp(stored);
    Found {
        partition,
        key: std::str::from_utf8(key).ok().map(str::to_string),
        key_hex: hex(key),
        value: std::str::from_utf8(value).ok().map(str::to_string),
        value_hex: hex(value),
        value_bytes: None,
        timestamp,
        worker: String::new(),
    }
}

/// An entry whose value is too large for an answer: its key and the value's size only.
fn too_large(partition: i32, key: &[u8], bytes: usize) -> Found {
    Found {
        value: None,
        value_hex: String::new(),
        value_bytes: Some(bytes),
        ..found(partition, key, &[])
    }
}

/// Whether `text` is a topology or store name (nothing a URL's path or query would read
/// otherwise).
fn is_name(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// `GET /v1/topologies/{name}/stores/{store}`: the committed state of a store, read by the
/// workers that run its tasks (each worker asks every member and merges the answers).
pub(super) async fn query(
    State(state): State<Arc<AdminState>>,
    Extension(who): Extension<Caller>,
    UrlPath((name, store)): UrlPath<(String, String)>,
    Query(params): Query<QueryParams>,
) -> Result<Json<serde_json::Value>, ApiError> {
    if who == Caller::Operator {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "operator-no-data",
            "an operator sees the cluster's topologies, status and metrics, not what tenants' stores hold",
        ));
    }
    // One worker's own stores are how workers ask each other; anyone else asks them all.
    if params.local && who != Caller::Worker && state.gate.enforced() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "worker-only-reads",
            "local=true (this worker's stores alone) is for workers asking each other, signed with the cluster \
             secret; ask without it for the answer of every worker",
        ));
    }
    let snapshot = state.registry.snapshot();
    let owned = snapshot.entries.get(&name).filter(|(e, _)| who.owns(&e.tenant));
    let entry = match owned {
        Some((e, _)) => Some(e.clone()),
        // Topologies given with --topology are the admin's (and asked of each worker by
        // the worker the admin asked). Their names go into the path the members are asked,
        // so they must be names (`[A-Za-z0-9._-]`), nothing that changes that path.
        None if state.worker.is_static(&name)
            && matches!(who, Caller::Admin | Caller::Worker)
            && [&name, &store].iter().all(|n| is_name(n)) =>
        {
            None
        }
        None => return Err(not_found(&state, &who, &name)),
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
    let limit = params.limit.unwrap_or(QUERY_LIMIT).min(MAX_QUERY_LIMIT);
    if params.local {
        let st = state.clone();
        let (n, s) = (name.clone(), store.clone());
        let local = tokio::task::spawn_blocking(move || {
            read_local(&st, &n, &s, key.as_deref(), from, to, limit, MEMBER_ANSWER_BYTES)
        })
        .await
        .map_err(internal)??;
        return Ok(Json(serde_json::json!({
            "entries": local.entries,
            "partitions": local.partitions,
            "truncated": local.truncated,
        })));
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
    // A member's answer of MEMBER_ANSWER_BYTES of entries, as JSON, with room to spare.
    let answers = ask_members(&state, &path, 2 * MEMBER_ANSWER_BYTES).await?;
    let mut entries: Vec<Found> = Vec::new();
    let mut answered: Vec<i32> = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    let mut truncated = false;
    let mut bytes = 0;
    for (admin, answer) in answers {
        match answer {
            Ok((code, body)) if code.is_success() => {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let mut found: Vec<Found> = serde_json::from_value(v["entries"].clone()).unwrap_or_default();
                truncated |= v["truncated"].as_bool().unwrap_or(false);
                for f in &mut found {
                    f.worker = admin.clone();
                }
                let before = found.len();
                found.retain(|f| {
                    bytes += weight(f.key_hex.len() / 2, f.value_hex.len() / 2);
                    bytes <= ANSWER_BYTES
                });
                truncated |= found.len() < before;
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
        .map(|e| {
            (0..e.store_partitions(&store))
                .filter(|p| !answered.contains(&(*p as i32)))
                .collect()
        })
        .unwrap_or_default();
    Ok(Json(serde_json::json!({
        "topology": name,
        "store": store,
        "entries": entries,
        "partitions_answered": answered,
        "partitions_missing": missing,
        "truncated": truncated,
        "problems": problems,
    })))
}

/// The admin addresses of the cluster's members (from the group coordinator). With a
/// secret, only members whose metadata is signed with it for their member id: a process
/// that joined the group without it (or with a copy of a worker's metadata) is not asked
/// anything.
async fn member_admins(
    kafka: &KafkaSettings,
    group: &str,
    secret: Option<ClusterSecret>,
) -> Result<Vec<String>, String> {
    let described = crate::group::intruders::describe_cluster_group(kafka, group, secret)
        .await
        .map_err(|e| format!("describing group {group}: {e}"))?;
    let mut out: Vec<String> = described
        .members
        .into_iter()
        .filter_map(|m| m.metadata.map(|m| m.admin))
        .filter(|a| !a.is_empty())
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// What this worker's stores hold for a query.
struct Local {
    entries: Vec<Found>,
    partitions: Vec<i32>,
    /// The answer stopped at its byte budget (or a value was too large to hold).
    truncated: bool,
}

/// Reads this worker's active stores: one key, or a range of at most `limit` entries and
/// `max_bytes` of keys and values. A value is measured before it is copied: one larger
/// than the budget is answered by its size alone.
#[allow(clippy::too_many_arguments)]
fn read_local(
    state: &AdminState,
    topology: &str,
    store: &str,
    key: Option<&[u8]>,
    from: Option<Vec<u8>>,
    to: Option<Vec<u8>>,
    limit: usize,
    max_bytes: usize,
) -> Result<Local, ApiError> {
    let stores = state.worker.active_stores(topology, store);
    let mut out = Local {
        entries: Vec::new(),
        partitions: stores.iter().map(|(p, _)| *p).collect(),
        truncated: false,
    };
    let mut bytes = 0;
    let failed = |e: StateError| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "store", e.to_string());
    'stores: for (partition, db) in &stores {
        if let Some(key) = key {
            if let Some(value) = db.get(key).map_err(failed)? {
                if weight(key.len(), value.len()) > max_bytes {
                    out.entries.push(too_large(*partition, key, value.len()));
                    out.truncated = true;
                } else {
                    out.entries.push(found(*partition, key, &value));
                }
            }
            continue;
        }
        // A cursor lends keys and values in place: nothing is copied until it is kept.
        let mut it = db.cursor(None);
        match &from {
            Some(start) => it.seek(start),
            None => it.seek_to_first(),
        }
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                break;
            };
            if to.as_deref().is_some_and(|to| k >= to) {
                break;
            }
            if out.entries.len() >= limit {
                break 'stores;
            }
            let w = weight(k.len(), v.len());
            if bytes + w > max_bytes {
                out.truncated = true;
                if w > max_bytes {
                    out.entries.push(too_large(*partition, k, v.len()));
                    it.next();
                    continue;
                }
                break 'stores;
            }
            bytes += w;
            out.entries.push(found(*partition, k, v));
            it.next();
        }
        it.status().map_err(failed)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_stored_with_its_time_is_answered_without_it() {
        let mut stored = b"42".to_vec();
        stored.extend(1_700_000_000_123i64.to_be_bytes());
        stored.extend(STAMP_TAG);
        let f = found(3, b"k", &stored);
        assert_eq!((f.value.as_deref(), f.timestamp), (Some("42"), Some(1_700_000_000_123)));
        assert_eq!(f.value_hex, "3432");
        let f = found(3, b"k", b"plain");
        assert_eq!((f.value.as_deref(), f.timestamp), (Some("plain"), None));
        // Too short to hold a time, though it ends with the tag.
        let f = found(0, b"k", &STAMP_TAG);
        assert_eq!((f.value_hex.len(), f.timestamp), (16, None));
    }
}
