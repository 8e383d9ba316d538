//! What the board shows: a worker's status as `GET /status` serves it (and `sluice status`
//! reads it back), with each task's role and phase and the handovers it timed.

use serde::{Deserialize, Serialize};

/// What a task is on this worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// It processes records here (or will, once it has started).
    Active,
    /// A warm copy of the state, kept for failover.
    Standby,
    /// A copy of the state being restored to take the task over.
    Learner,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Active => "active",
            Role::Standby => "standby",
            Role::Learner => "learner",
        }
    }
}

/// Where an active task is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Assigned; opening its producer and state, or waiting to start again after a failure.
    Starting,
    /// Replaying its changelog before it can process.
    Restoring,
    /// Processing records.
    Running,
    /// Stopped by a guest fault; stays stopped.
    Failed,
}

/// One task as `GET /status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskStatus {
    pub task: String,
    pub role: Role,
    /// Active tasks only.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub phase: Option<Phase>,
    /// Changelog records the local state is behind (stateful tasks; 0 for an active task
    /// that is processing). None: not known yet.
    pub lag: Option<i64>,
    /// Changelog records replayed in this role so far.
    pub restored: u64,
    /// Records per second replayed recently.
    pub restore_rate: Option<f64>,
    /// Share of what there was to replay when the role began that is replayed (0 to 1).
    pub progress: Option<f64>,
    /// Seconds the task spent here assigned as active but unable to process (starting,
    /// restoring, waiting to retry), over all its assignments to this worker.
    pub unavailable_seconds: f64,
    /// Seconds since it took this role here.
    pub in_role_seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    /// What an active task waits for besides its records (a schema from the registry), for
    /// how long.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub waiting: Option<String>,
}

/// The worker as `GET /status` shows it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// The worker's release (`sluice --version`; empty from releases before 0.3).
    #[serde(default)]
    pub release: String,
    /// The group metadata version of its last assignment, the one every member of the group
    /// speaks (0: none yet, not in a cluster, or a release before 0.3).
    #[serde(default)]
    pub metadata_version: u16,
    /// The group generation of the last assignment (0: none yet, or not in a cluster).
    pub generation: i32,
    pub leader: bool,
    /// Draining: the worker asked for its tasks to be moved away.
    pub leaving: bool,
    /// A rebalance is going on (from the first join until an assignment that needs no
    /// further join is applied).
    pub rebalancing: bool,
    /// Rebalances this worker took part in since it started.
    pub rebalances: u64,
    pub last_rebalance_seconds: Option<f64>,
    pub rebalance_seconds_total: f64,
    pub tasks: Vec<TaskStatus>,
    /// The last handovers of tasks to and from this worker, newest first.
    #[serde(default)]
    pub handovers: Vec<HandoverStatus>,
    /// Components compiling here (an upload checked, a topology starting), then the last
    /// compiles done.
    #[serde(default)]
    pub compiles: Vec<crate::runtime::progress::CompileStatus>,
    /// Set when the caller is a tenant: this answer is narrowed to its topologies, named
    /// here (what `sluice status` narrows the group's own view of other workers to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub narrowed_to: Option<Narrowed>,
}

/// The tenant a status was narrowed to, and its topologies.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Narrowed {
    pub tenant: String,
    pub topologies: Vec<String>,
}

/// One task's move, as the worker it left or the worker it came to saw it. Phases a side
/// did not see are none: the old owner knows its revoke, the new owner the rest.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct HandoverStatus {
    pub task: String,
    /// `in`: the task came here; `out`: it left.
    pub direction: String,
    /// Seconds since the handover finished here.
    pub ago_seconds: f64,
    /// Old owner: from the assignment that revoked the task to its final commit.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub revoke_seconds: Option<f64>,
    /// New owner: from the assignment of the revoking round to the one that gave it here
    /// (the old owner's revoke, and the group's round trips).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub rebalance_seconds: Option<f64>,
    /// New owner: from that assignment to processing (stores opened and the tail of the
    /// changelog replayed, guest instantiated, offsets looked up).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub start_seconds: Option<f64>,
    /// New owner: from processing to the first record produced.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub first_output_seconds: Option<f64>,
    /// New owner: the three above.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub total_seconds: Option<f64>,
}
