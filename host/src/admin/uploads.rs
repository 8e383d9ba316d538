//! Uploads checked in the background: `POST /v1/topologies?background=true` answers `202`
//! once the upload is read, its manifest parsed and its caller admitted, with a job; the
//! compile, the check and the write to the registry go on after the answer. `GET
//! /v1/uploads/{id}` says how far it got (`checking`, then `stored`, `unchanged` or
//! `failed` with the error the upload would have answered), and `GET /status` shows its
//! compile with an estimate of its progress (see [`crate::runtime::progress`]).
//!
//! A caller sees its own jobs (the admin sees all), on the worker it uploaded through,
//! for ten minutes after they end.

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

/// Finished jobs are kept this long, and at most this many of all (the oldest go first).
const KEPT_FOR: Duration = Duration::from_secs(600);
const KEPT: usize = 256;

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
        Caller::Admin | Caller::Worker => true,
        Caller::Tenant(_) => who.name() == job.caller,
    }
}

fn forget_old(jobs: &mut BTreeMap<String, Job>) {
    jobs.retain(|_, j| j.ended.is_none_or(|e| e.elapsed() < KEPT_FOR));
    while jobs.len() > KEPT {
        let oldest = jobs
            .iter()
            .filter(|(_, j)| j.ended.is_some())
            .min_by_key(|(_, j)| j.started)
            .map(|(id, _)| id.clone());
        match oldest {
            Some(id) => jobs.remove(&id),
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
