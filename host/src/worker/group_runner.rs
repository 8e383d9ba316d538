//! A worker in a cluster: joins the group, applies each assignment (revoked tasks stop
//! before anything else happens), heartbeats, and leaves on shutdown.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::{TaskRunner, WorkerReport};
use crate::group::assignor::{by_name, AssignorInput};
use crate::group::membership::{Heartbeat, Membership, MembershipConfig};
use crate::group::metadata::{MemberMetadata, CURRENT_VERSION, OLDEST_VERSION};
use crate::group::TaskId;

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
    pub bootstrap: String,
    pub state_dir: PathBuf,
    /// The member metadata version this worker speaks (testing rolling upgrades: a newer
    /// build can pretend to be an older one).
    pub metadata_version: u16,
}

/// The Kafka group of a cluster.
pub fn group_id(cluster: &str) -> String {
    format!("sluice-cluster-{cluster}")
}

/// A worker id that survives restarts, kept in the state directory.
fn worker_id(state_dir: &Path) -> anyhow::Result<[u8; 16]> {
    let path = state_dir.join("worker-id");
    if let Ok(text) = std::fs::read_to_string(&path) {
        if let Ok(id) = uuid::Uuid::parse_str(text.trim()) {
            return Ok(*id.as_bytes());
        }
    }
    std::fs::create_dir_all(state_dir).with_context(|| format!("creating {}", state_dir.display()))?;
    let id = uuid::Uuid::new_v4();
    std::fs::write(&path, id.to_string()).with_context(|| format!("writing {}", path.display()))?;
    Ok(*id.as_bytes())
}

pub async fn run(
    cluster: &ClusterConfig,
    mut runner: TaskRunner,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<WorkerReport> {
    let assignor = by_name(&cluster.assignor).with_context(|| {
        format!(
            "unknown assignor {:?}; the built-in ones are \"sticky\" and \"eager\"",
            cluster.assignor
        )
    })?;
    let worker_id = worker_id(&cluster.state_dir)?;
    anyhow::ensure!(
        (OLDEST_VERSION..=CURRENT_VERSION).contains(&cluster.metadata_version),
        "metadata version {} is not one this worker speaks ({OLDEST_VERSION} to {CURRENT_VERSION})",
        cluster.metadata_version
    );
    let all = runner.all_tasks();
    let stateful = runner.stateful();
    let ends = HashMap::new();
    let mut membership = Membership::new(MembershipConfig {
        bootstrap: cluster.bootstrap.clone(),
        group: group_id(&cluster.name),
        instance_id: cluster.instance_id.clone(),
        session_timeout: cluster.session_timeout,
        rebalance_timeout: Duration::from_secs(60),
    });
    tokio::pin!(shutdown);
    'member: loop {
        let metadata = MemberMetadata {
            version: cluster.metadata_version,
            supported: cluster.metadata_version,
            worker_id,
            capacity: cluster.capacity,
            active: runner.running(),
            standby: runner.standbys(),
            offset_sums: runner.local_offset_sums(),
            ..Default::default()
        };
        let assign = |members: &_| {
            assignor.assign(&AssignorInput {
                members,
                tasks: &all,
                stateful: &stateful,
                end_offsets: &ends,
                standby_replicas: cluster.standby_replicas,
            })
        };
        let joined = tokio::select! {
            joined = membership.join(&metadata, assign) => joined?,
            _ = &mut shutdown => break 'member,
        };
        let a = joined.assignment;
        tracing::info!(
            cluster = %cluster.name, generation = joined.generation, leader = joined.leader,
            active = a.active.len(), standby = a.standby.len(), revoked = a.revoked.len(), rejoin = a.rejoin,
            tasks = %a.active.iter().map(TaskId::to_string).collect::<Vec<_>>().join(","),
            "assignment"
        );
        // Revoked (and anything no longer ours) stops first: commit, flush, close. Standbys
        // no longer wanted (or promoted) stop next and checkpoint what they applied, so a
        // promoted task replays only the rest.
        let stop: Vec<TaskId> = runner.running().into_iter().filter(|t| !a.active.contains(t)).collect();
        let stop_standby: Vec<TaskId> = runner
            .standbys()
            .into_iter()
            .filter(|t| !a.standby.contains(t))
            .collect();
        tokio::task::block_in_place(|| {
            runner.stop(&stop);
            runner.stop_standbys(&stop_standby);
        });
        runner.start(&a.active)?;
        runner.start_standbys(&a.standby)?;
        if a.rejoin {
            continue 'member;
        }
        let mut last_heard = Instant::now();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(cluster.heartbeat_interval) => {}
                _ = &mut shutdown => break 'member,
            }
            match membership.heartbeat().await? {
                Heartbeat::Alive => last_heard = Instant::now(),
                Heartbeat::RejoinNeeded => continue 'member,
                Heartbeat::Lost => {
                    tracing::warn!(cluster = %cluster.name, "the group no longer knows this worker: stopping its tasks, rejoining");
                    let all = runner.running();
                    tokio::task::block_in_place(|| runner.stop(&all));
                    continue 'member;
                }
                Heartbeat::Unreachable if last_heard.elapsed() > cluster.session_timeout => {
                    // Others may own these tasks by now: stop before they could run twice.
                    tracing::warn!(cluster = %cluster.name, "no successful heartbeat for the session timeout: stopping all tasks");
                    let all = runner.running();
                    tokio::task::block_in_place(|| runner.stop(&all));
                    continue 'member;
                }
                Heartbeat::Unreachable => {}
            }
        }
    }
    tracing::info!("stopping: finishing batches in flight, flushing, committing, leaving the group");
    let report = tokio::task::block_in_place(|| runner.stop_all());
    if let Err(e) = membership.leave().await {
        tracing::warn!("leaving the group: {e}");
    }
    Ok(report)
}
