//! Uploads checked in the background: `POST /v1/topologies?background=true` answers `202`
//! once the upload is read, its manifest parsed and its caller admitted, with a job; the
//! compile, the check and the write to the registry go on after the answer. `GET
//! /v1/uploads/{id}` says how far it got (`checking`, then `stored`, `unchanged` or
//! `failed` with the error the upload would have answered), and `GET /status` shows its
//! compile with an estimate of its progress (see [`crate::runtime::progress`]).
//!
//! A caller sees its own jobs (the admin sees all), on the worker it uploaded through,
//! for ten minutes after they end, while the finished jobs kept hold at most [`KEPT`] jobs
//! and [`KEPT_BYTES`] of answers (a finished job holds its registry entry, the manifest
//! text in it: re-uploading one topology with a large manifest must not make the worker
//! hold a copy per upload).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::{AdminState, ApiError};
use crate::registry::tenants::Caller;
use crate::registry::Entry;

/// Finished jobs are kept this long, and at most this many of all, holding at most this
/// many bytes of answers together (the oldest go first).
const KEPT_FOR: Duration = Duration::from_secs(600);
const KEPT: usize = 256;
const KEPT_BYTES: usize = 16 << 20;

/// An upload's job as `GET /v1/uploads/{id}` answers it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UploadJob {
    pub id: String,
    pub topology: String,
    /// Who uploaded it (a tenant's name, or `admin`).
    pub caller: String,
    /// The component's bytes.
    pub bytes: u64,
    /// `checking` (compiling, describing, checking topics), then `stored` (a new version
    /// is in the registry), `unchanged` (the same component and manifest were there) or
    /// `failed`.
    pub state: String,
    /// Seconds from the upload to now, or to its end.
    pub seconds: f64,
    /// The registry entry (stored, unchanged).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub entry: Option<Entry>,
    /// What the upload would have answered (failed): the HTTP status, the error's kind and
    /// its message.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<JobError>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobError {
    pub status: u16,
    pub error: String,
    pub message: String,
}

struct Job {
    view: UploadJob,
    started: Instant,
    ended: Option<Instant>,
    /// What its answer holds (its JSON's length), once it ended.
    held: usize,
}

/// This worker's upload jobs.
#[derive(Default)]
pub struct Uploads {
    jobs: Mutex<BTreeMap<String, Job>>,
}

impl Uploads {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Job>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A new job, checking.
    pub(super) fn start(&self, topology: &str, caller: &str, bytes: usize) -> UploadJob {
        let id = uuid::Uuid::new_v4().simple().to_string();
        let view = UploadJob {
            id: id.clone(),
            topology: topology.to_string(),
            caller: caller.to_string(),
            bytes: bytes as u64,
            state: "checking".into(),
            seconds: 0.0,
            entry: None,
            error: None,
        };
        let mut jobs = self.lock();
        forget_old(&mut jobs);
        jobs.insert(
            id,
            Job {
                view: view.clone(),
                started: Instant::now(),
                ended: None,
                held: 0,
            },
        );
        view
    }

    /// The job `id` ended: stored or unchanged (with the entry), or failed.
    pub(super) fn finish(&self, id: &str, result: Result<(StatusCode, Entry), ApiError>) {
        let mut jobs = self.lock();
        let Some(job) = jobs.get_mut(id) else {
            return;
        };
        job.ended = Some(Instant::now());
        match result {
            Ok((status, entry)) => {
                job.view.state = if status == StatusCode::CREATED {
                    "stored"
                } else {
                    "unchanged"
                }
                .into();
                job.view.entry = Some(entry);
            }
            Err(e) => {
                job.view.state = "failed".into();
                job.view.error = Some(JobError {
                    status: e.status.as_u16(),
                    error: e.kind.to_string(),
                    message: e.message,
                });
            }
        }
        job.held = serde_json::to_vec(&job.view).map_or(0, |json| json.len());
        forget_old(&mut jobs);
    }

    /// The jobs `who` may see, oldest first.
    fn visible(&self, who: &Caller) -> Vec<UploadJob> {
        let mut jobs = self.lock();
        forget_old(&mut jobs);
        let mut out: Vec<(Instant, UploadJob)> = jobs
            .values()
            .filter(|j| may_see(who, &j.view))
            .map(|j| (j.started, view(j)))
            .collect();
        out.sort_by_key(|(started, _)| *started);
        out.into_iter().map(|(_, v)| v).collect()
    }
}

fn view(job: &Job) -> UploadJob {
    let until = job.ended.unwrap_or_else(Instant::now);
    UploadJob {
        seconds: until.duration_since(job.started).as_secs_f64(),
        ..job.view.clone()
    }
}

fn may_see(who: &Caller, job: &UploadJob) -> bool {
    match who {
        Caller::Admin | Caller::Worker | Caller::Operator => true,
        Caller::Tenant(_) => who.name() == job.caller,
    }
}

fn forget_old(jobs: &mut BTreeMap<String, Job>) {
    jobs.retain(|_, j| j.ended.is_none_or(|e| e.elapsed() < KEPT_FOR));
    let mut held: usize = jobs.values().map(|j| j.held).sum();
    while jobs.len() > KEPT || held > KEPT_BYTES {
        let oldest = jobs
            .iter()
            .filter(|(_, j)| j.ended.is_some())
            .min_by_key(|(_, j)| j.started)
            .map(|(id, _)| id.clone());
        match oldest.and_then(|id| jobs.remove(&id)) {
            Some(gone) => held -= gone.held,
            None => break,
        };
    }
}

/// `GET /v1/uploads`: the caller's upload jobs on this worker.
pub(super) async fn list(
    State(state): State<Arc<AdminState>>,
    Extension(who): Extension<Caller>,
) -> Json<Vec<UploadJob>> {
    Json(state.uploads.visible(&who))
}

/// `GET /v1/uploads/{id}`: one of the caller's upload jobs.
pub(super) async fn get(
    State(state): State<Arc<AdminState>>,
    Extension(who): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<UploadJob>, ApiError> {
    state
        .uploads
        .visible(&who)
        .into_iter()
        .find(|j| j.id == id)
        .map(Json)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "not-found",
                format!(
                    "no upload {id:?} of {} on this worker (jobs are kept for ten minutes after they end, on the \
                     worker that took the upload)",
                    who.name()
                ),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(manifest: String) -> Entry {
        serde_json::from_value(serde_json::json!({
            "name": "big", "version": 1, "manifest": manifest, "digest": "d",
            "size": 1, "chunks": 1, "uploaded_at_ms": 0,
        }))
        .expect("an entry")
    }

    /// Re-uploading a topology with a 1 MiB manifest 256 times: the finished jobs kept
    /// hold at most `KEPT_BYTES` of answers, and the newest is still there.
    #[test]
    fn finished_jobs_hold_at_most_their_byte_budget() {
        let uploads = Uploads::default();
        let manifest = "#".repeat(1 << 20);
        let mut last = String::new();
        for _ in 0..KEPT {
            let job = uploads.start("big", "tenant-a", 100);
            uploads.finish(&job.id, Ok((StatusCode::OK, entry(manifest.clone()))));
            last = job.id;
        }
        let jobs = uploads.lock();
        let held: usize = jobs.values().map(|j| j.held).sum();
        assert!(held <= KEPT_BYTES, "finished jobs hold {held} bytes, over {KEPT_BYTES}");
        assert!(held > KEPT_BYTES / 2, "the budget is used, not emptied: {held} bytes");
        assert!(jobs.contains_key(&last), "the newest job is kept");
        assert_eq!(jobs[&last].view.state, "unchanged");
    }

    /// A job still checking is never forgotten to make room.
    #[test]
    fn a_job_still_checking_is_kept_whatever_the_others_hold() {
        let uploads = Uploads::default();
        let checking = uploads.start("slow", "tenant-a", 100);
        let manifest = "#".repeat(4 << 20);
        for _ in 0..8 {
            let job = uploads.start("big", "tenant-b", 100);
            uploads.finish(&job.id, Ok((StatusCode::CREATED, entry(manifest.clone()))));
        }
        let jobs = uploads.lock();
        assert_eq!(jobs[&checking.id].view.state, "checking");
        let held: usize = jobs.values().map(|j| j.held).sum();
        assert!(held <= KEPT_BYTES, "{held}");
    }
}
