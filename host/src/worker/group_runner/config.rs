//! How a worker takes part in a cluster, and what it can be asked to do.

use std::path::PathBuf;
use std::time::Duration;

use crate::group::assignor::LearnerPolicy;
use crate::kafka::KafkaSettings;

/// How a worker takes part in a cluster.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub name: String,
    pub capacity: u32,
    pub instance_id: Option<String>,
    pub session_timeout: Duration,
    pub heartbeat_interval: Duration,
    pub assignor: String,
    pub standby_replicas: u32,
    pub kafka: KafkaSettings,
    pub state_dir: PathBuf,
    /// The member metadata version this worker speaks (testing rolling upgrades: a newer
    /// build can pretend to be an older one).
    pub metadata_version: u16,
    /// Give a task that a guest fault stopped back to the group (which may place it on
    /// another worker) instead of keeping it failed on this one.
    pub release_failed_tasks: bool,
    /// How stateful tasks move (the leader's policy is the one that counts).
    pub learners: LearnerPolicy,
    /// When a worker with learners rejoins to take their tasks over.
    pub learner_rejoin: LearnerRejoin,
    /// Asks this worker to drain (hand its tasks to the others, then leave): signals and
    /// the admin endpoint send [`Stop::Drain`] here.
    pub drain: Option<std::sync::Arc<tokio::sync::watch::Sender<Stop>>>,
    /// How long a drain may take before the worker stops its remaining tasks and leaves.
    pub scale_down_timeout: Option<Duration>,
    /// Signs this worker's group messages and checks the others' (`registry.secret`).
    pub secret: Option<crate::secret::ClusterSecret>,
    /// Where this worker's admin endpoint is reached (`host:port`), told to the group so
    /// `sluice status` finds every worker's live status; empty: none (or not known yet,
    /// then the worker fills in the address it bound).
    pub admin: String,
}

/// What a worker has been asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Run,
    /// Hand every task to the other workers (stateful ones once their learners caught up),
    /// then leave the group and exit.
    Drain,
    /// Stop every task now (committing what was processed) and leave.
    Now,
}

/// When a worker rejoins the group to take over tasks its learners caught up on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LearnerRejoin {
    /// As soon as any learner has caught up (each task moves as early as it can).
    Each,
    /// Once all of this worker's learners have caught up (fewer rebalances).
    All,
}
