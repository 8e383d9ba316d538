//! A worker in a cluster: joins the group, applies each assignment (revoked tasks stop
//! before anything else happens), heartbeats on schedule — also while tasks stop — and
//! leaves on shutdown. Losing the membership in any way (the coordinator says so during a
//! heartbeat, join or sync, or the lease runs out) is one path: every task stops without
//! committing, then the worker rejoins.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::deploys::TopologyChange;
use super::heartbeats::{lease_margin, Heartbeats, Kept};
use super::intruders::{Intruders, Next};
use super::learners::{learners_caught_up, ChangelogEnds, LEARNER_CHECK_EVERY, STANDBY_CHECK_EVERY};
use super::{TaskRunner, WorkerReport};
use crate::group::assignor::{by_name, LearnerPolicy};
use crate::group::membership::{Membership, MembershipConfig, MembershipError};
use crate::group::metadata::{AssignmentError, MemberMetadata, CURRENT_VERSION, OLDEST_VERSION};
use crate::group::TaskId;
use crate::group::{cluster_group, placement};
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
    mut changes: tokio::sync::mpsc::UnboundedReceiver<TopologyChange>,
) -> anyhow::Result<WorkerReport> {
    let assignor = by_name(&cluster.assignor).with_context(|| {
        format!(
            "unknown assignor {:?}; the built-in ones are \"sticky\" and \"eager\"",
            cluster.assignor
        )
    })?;
    let stop_the_world = cluster.assignor == "eager";
    runner.release_failed_tasks(cluster.release_failed_tasks);
    let worker_id = worker_id(&cluster.state_dir)?;
    anyhow::ensure!(
        (OLDEST_VERSION..=CURRENT_VERSION).contains(&cluster.metadata_version),
        "metadata version {} is not one this worker speaks ({OLDEST_VERSION} to {CURRENT_VERSION})",
        cluster.metadata_version
    );
    // Reads changelog end offsets (for the leader's lag figures and for learners' progress).
    let offsets = ChangelogEnds::new(&cluster.kafka);
    // Learners that caught up and asked for their task (when), so a worker does not rejoin
    // for the same learner over and over.
    let mut asked: HashMap<TaskId, Instant> = HashMap::new();
    // The generation of the last assignment that asked for a rejoin, and how many times
    // in a row it did.
    let mut rejoins = (i32::MIN, 0u32);
    // Since when this worker drains (marked leaving in its metadata), if it does.
    let mut leaving_since: Option<Instant> = None;
    // When the first assignment of a run of rejoins came (a round that revokes tasks
    // elsewhere): tasks assigned here at the end of it are handovers, timed from then.
    let mut round_began: Option<Instant> = None;
    let drain_requested = || cluster.drain.as_ref().is_some_and(|d| *d.borrow() == Stop::Drain);
    let mut membership = Membership::new(MembershipConfig {
        kafka: cluster.kafka.clone(),
        group: cluster_group(&cluster.name),
        assignor: cluster.assignor.clone(),
        secret: cluster.secret.clone(),
        instance_id: cluster.instance_id.clone(),
        session_timeout: cluster.session_timeout,
        rebalance_timeout: REBALANCE_TIMEOUT,
    });
    let heartbeats = Heartbeats {
        cluster,
        lease: runner.lease().clone(),
        last_stable: std::cell::Cell::new(None),
        lease_length: cluster
            .session_timeout
            .saturating_sub(lease_margin(cluster.session_timeout)),
        timeout: (cluster.session_timeout / 4).max(Duration::from_millis(200)),
    };
    tokio::pin!(shutdown);
    let mut intruders = Intruders::default();
    // The member loop: `Ok` when the worker is asked to stop (or drained), `Err` when it
    // cannot go on; either way its tasks are stopped below before the worker returns.
    let outcome: anyhow::Result<()> = async {
    'member: loop {
        let preparing = Instant::now();
        runner.board().rebalance_started();
        // What this worker runs (uploads and deletions change it between joins).
        let topologies = runner.topology_infos();
        let stateful = runner.changelog_partitions();
        if stop_the_world && !runner.owned().is_empty() {
            // Eager rebalancing is stop-the-world: every task stops (and commits) before this
            // member rejoins, so no task is ever active on two workers.
            let running = runner.owned();
            tracing::info!(
                tasks = running.len(),
                "eager rebalance: stopping every task before rejoining"
            );
            let stopping = runner.begin_stop(&running, false);
            if let Kept::Lost(why) = heartbeats.wait_for(&mut membership, &mut runner, stopping).await? {
                tracing::warn!(cluster = %cluster.name, "{why}: the tasks stopped without committing");
            }
        }
        if leaving_since.is_none() && drain_requested() {
            tracing::info!(
                tasks = runner.owned().len(),
                "draining: asking the group to move this worker's tasks away"
            );
            leaving_since = Some(Instant::now());
            runner.board().set_leaving(true);
        }
        if drain_timed_out(cluster, leaving_since) {
            break 'member;
        }
        // Every member reads them (any may be the leader): one request per rebalance.
        let ends = tokio::task::block_in_place(|| offsets.read(&stateful));
        let learners = runner.learners();
        let metadata = MemberMetadata {
            version: cluster.metadata_version,
            supported: cluster.metadata_version,
            worker_id,
            capacity: cluster.capacity,
            active: runner.owned(),
            standby: runner
                .standbys()
                .into_iter()
                .filter(|t| !learners.contains(t))
                .collect(),
            learner: learners,
            offset_sums: runner.local_offset_sums(),
            topologies: Some(topologies.clone()),
            failed: runner.failed(),
            leaving: leaving_since.is_some(),
            admin: cluster.admin.clone(),
        };
        // The leader places what the members say they run, not what it runs itself.
        let staying = std::cell::Cell::new(usize::MAX);
        let assign = |members: &BTreeMap<String, MemberMetadata>| {
            staying.set(members.values().filter(|m| !m.leaving).count());
            let placement = placement::plan(members, &topologies);
            for problem in &placement.problems {
                tracing::warn!(cluster = %cluster.name, "{problem}");
            }
            placement::assign(
                &*assignor,
                members,
                &placement,
                &ends,
                cluster.standby_replicas,
                cluster.learners,
            )
        };
        // While the join waits (for a slow member, up to the rebalance timeout), a probe
        // keeps the session — and so the lease — alive, so tasks keep processing through a
        // long rebalance as the cooperative protocol intends.
        let probe = membership.probe();
        let keep_alive = async {
            let Some(mut probe) = probe else {
                return std::future::pending().await;
            };
            loop {
                tokio::time::sleep(cluster.heartbeat_interval).await;
                let sent = Instant::now();
                if probe.still_member(heartbeats.timeout).await {
                    heartbeats.lease.renew(sent, heartbeats.lease_length);
                }
            }
        };
        // A JoinGroup in: the coordinator no longer drops this member for the rebalance
        // timeout (see `Heartbeats::beat`).
        heartbeats.lease.lift_cap();
        tracing::debug!(target: "handover", ms = preparing.elapsed().as_millis() as u64, "join prepared");
        let joined = tokio::select! {
            joined = membership.join(&metadata, assign) => joined,
            _ = keep_alive => unreachable!("the probe loop never ends"),
            _ = &mut shutdown => break 'member,
        };
        let next = match joined {
            Ok(joined) => Ok(joined),
            Err(MembershipError::Lost { reason, call, .. }) => {
                lose_membership(&mut runner, &format!("{call}: {reason}")).await;
                continue 'member;
            }
            Err(MembershipError::BadAssignment { detail, leader, .. }) => {
                // A leader without the cluster's secret (a process that joined the group) or
                // of another version: its assignment is not applied. No worker of the
                // cluster assigned anything this generation, so each keeps what it runs,
                // under its lease, and joins again once the intruders are removed.
                Err(intruders.foreign_leader(cluster, &mut membership, &leader, &detail).await)
            }
            Err(MembershipError::OtherProtocol { group, ours, .. }) => {
                Err(intruders.other_protocol(cluster, &mut membership, &group, &ours).await)
            }
            Err(MembershipError::Fenced { .. }) => {
                // Another member holds this worker's group.instance.id: the coordinator may
                // hand its tasks out already.
                lose_membership(&mut runner, "another member joined with this worker's group.instance.id").await;
                Err(intruders.fenced(cluster, &mut membership, worker_id).await)
            }
            Err(e) => return Err(e.into()),
        };
        let joined = match next {
            Ok(joined) => joined,
            Err(Next::Rejoin(pause)) => {
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = &mut shutdown => break 'member,
                }
                continue 'member;
            }
            Err(Next::Exit(e)) => return Err(e),
        };
        heartbeats.lease.renew(joined.alive_at, heartbeats.lease_length);
        if leaving_since.is_some() && joined.leader && staying.get() == 0 {
            // Every member is leaving: there is nowhere to move the tasks. This one (the
            // leader) stops its tasks and leaves; the next leader does the same.
            tracing::warn!("draining, but every worker of the cluster is leaving: stopping the tasks here and leaving");
            break 'member;
        }
        let a = joined.assignment;
        intruders.settled();
        if a.error != AssignmentError::None as i16 {
            // The leader did not see what this worker runs, so it may have given those tasks
            // to others in this very generation: they stop without committing.
            tracing::error!(
                cluster = %cluster.name, error = a.error,
                "the leader could not read this worker's metadata (a version it does not know?); no tasks for now, rejoining in 5s"
            );
            lose_membership(&mut runner, "the leader did not read this worker's metadata").await;
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = &mut shutdown => break 'member,
            }
            continue 'member;
        }
        tracing::info!(
            cluster = %cluster.name, generation = joined.generation, leader = joined.leader,
            active = a.active.len(), standby = a.standby.len(), learner = a.learner.len(),
            revoked = a.revoked.len(), rejoin = a.rejoin,
            tasks = %a.active.iter().map(TaskId::to_string).collect::<Vec<_>>().join(","),
            learners = %a.learner.iter().map(TaskId::to_string).collect::<Vec<_>>().join(","),
            "assignment"
        );
        let assigned_at = Instant::now();
        let arriving: Vec<TaskId> = {
            let owned = runner.owned();
            a.active.iter().filter(|t| !owned.contains(t)).cloned().collect()
        };
        if let Some(round) = round_began.filter(|_| !arriving.is_empty()) {
            runner.board().moving_here(&arriving, round);
        }
        round_began = if a.rejoin {
            Some(round_began.unwrap_or(assigned_at))
        } else {
            None
        };
        asked.retain(|t, _| a.learner.contains(t));
        // Learners made active now: how far behind they were (as of the join), then stopped
        // as learners below and started as active tasks, which replay only the rest.
        let positions = runner.standby_positions();
        let learning = runner.learners();
        let promoted: Vec<(TaskId, Option<i64>)> = a
            .active
            .iter()
            .filter(|t| learning.contains(t))
            .map(|t| {
                (
                    t.clone(),
                    ends.get(t).zip(positions.get(t)).map(|(e, p)| (e - p).max(0)),
                )
            })
            .collect();
        // Revoked (and anything no longer ours) stops first: commit, flush, close. Standbys
        // no longer wanted (or promoted) stop next and checkpoint what they applied, so a
        // promoted task replays only the rest.
        let stop: Vec<TaskId> = runner.owned().into_iter().filter(|t| !a.active.contains(t)).collect();
        let stop_standby: Vec<TaskId> = runner
            .standbys()
            .into_iter()
            .filter(|t| !a.standby.contains(t) && !a.learner.contains(t))
            .collect();
        let revoke_began = Instant::now();
        let stopping = runner.begin_stop(&stop, false);
        if let Kept::Lost(why) = heartbeats.wait_for(&mut membership, &mut runner, stopping).await? {
            lose_membership(&mut runner, &why).await;
            continue 'member;
        }
        if !stop.is_empty() {
            runner.board().revoked(&stop, revoke_began.elapsed());
            tracing::debug!(
                target: "handover", generation = joined.generation,
                tasks = %stop.iter().map(TaskId::to_string).collect::<Vec<_>>().join(","),
                ms = revoke_began.elapsed().as_millis() as u64, "revoked tasks stopped"
            );
        }
        let handovers = tokio::task::block_in_place(|| runner.stop_standbys(&stop_standby, &a.active));
        for (t, lag) in &promoted {
            let lag = lag.map_or("unknown".to_string(), |l| l.to_string());
            tracing::info!(task = %t, lag = %lag, "learner promoted: the task is active here now");
        }
        runner.start(&a.active, handovers)?;
        runner.set_standbys(&a.standby, &a.learner)?;
        runner
            .board()
            .assigned(joined.generation, joined.leader, &a.active, &a.standby, &a.learner);
        if !a.rejoin {
            runner.board().rebalance_finished();
        }
        if leaving_since.is_some() && runner.owned().is_empty() {
            tracing::info!(
                seconds = %format!("{:.1}", leaving_since.map_or(0.0, |t| t.elapsed().as_secs_f64())),
                "drained: every task runs elsewhere now; leaving the group"
            );
            break 'member;
        }
        if a.rejoin {
            // Asked to rejoin again in the same generation: the rebalance waits for another
            // member (finishing a revocation). Back off instead of spinning through joins.
            if rejoins.0 == joined.generation {
                rejoins.1 += 1;
                let wait = Duration::from_millis(20 << rejoins.1.min(5));
                tracing::debug!(target: "handover", generation = joined.generation, ms = wait.as_millis() as u64, "asked to rejoin in the same generation: backing off");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = &mut shutdown => break 'member,
                }
            } else {
                rejoins = (joined.generation, 0);
            }
            continue 'member;
        }
        let mut next_beat = Instant::now() + cluster.heartbeat_interval;
        let mut next_learner_check = Instant::now() + LEARNER_CHECK_EVERY;
        let mut next_standby_check = Instant::now();
        // Wakes the loop at once when a drain is asked for.
        let mut asked_to_drain = cluster.drain.as_ref().map(|d| d.subscribe());
        loop {
            let mut wake = next_beat.min(Instant::now() + super::REAP_EVERY);
            if runner.has_learners() {
                wake = wake.min(next_learner_check);
            }
            if runner.has_standbys() {
                wake = wake.min(next_standby_check);
            }
            tokio::select! {
                _ = tokio::time::sleep_until(wake.into()) => {}
                _ = async {
                    match asked_to_drain.as_mut() {
                        Some(rx) if leaving_since.is_none() => {
                            let _ = rx.wait_for(|s| *s == Stop::Drain).await;
                        }
                        _ => std::future::pending().await,
                    }
                } => {}
                _ = &mut shutdown => break 'member,
                Some(change) = changes.recv() => {
                    // Tasks of what is deleted or replaced stop (committing) before the swap;
                    // then the worker rejoins to say what it runs now.
                    let names: Vec<String> =
                        change.put.iter().map(|t| t.name.clone()).chain(change.remove.iter().cloned()).collect();
                    let (owned, standbys) = runner.tasks_of(&names);
                    let stopping = runner.begin_stop(&owned, false);
                    if let Kept::Lost(why) = heartbeats.wait_for(&mut membership, &mut runner, stopping).await? {
                        lose_membership(&mut runner, &why).await;
                    }
                    let _ = tokio::task::block_in_place(|| runner.stop_standbys(&standbys, &[]));
                    for name in &change.remove {
                        runner.remove_topology(name);
                    }
                    for topology in change.put {
                        runner.put_topology(topology);
                    }
                    continue 'member;
                }
            }
            if runner.reap()?.rejoin {
                tracing::warn!(cluster = %cluster.name, "a task was fenced by another owner, or released: rejoining");
                continue 'member;
            }
            if (leaving_since.is_none() && drain_requested()) || drain_timed_out(cluster, leaving_since) {
                continue 'member;
            }
            let now = Instant::now();
            let learning = runner.has_learners() && now >= next_learner_check;
            if learning || (runner.has_standbys() && now >= next_standby_check) {
                next_learner_check = now + LEARNER_CHECK_EVERY;
                next_standby_check = now + STANDBY_CHECK_EVERY;
                // Where the standbys and learners are, and where their changelogs end: for
                // the status board, and for learners to know when to take their tasks over.
                let warm = runner.standbys();
                let mine: Vec<(TaskId, Vec<(String, i32)>)> =
                    stateful.iter().filter(|(t, _)| warm.contains(t)).cloned().collect();
                let ends = tokio::task::block_in_place(|| offsets.read(&mine));
                let positions = runner.standby_positions();
                runner.board().positions(&positions, &ends);
                if learning && learners_caught_up(cluster, &runner, &ends, &positions, &mut asked) {
                    tracing::debug!(target: "handover", "a learner caught up: rejoining");
                    continue 'member;
                }
            }
            if Instant::now() < next_beat {
                continue;
            }
            next_beat = Instant::now() + cluster.heartbeat_interval;
            match heartbeats.beat(&mut membership).await? {
                Kept::Member { rejoin: false } => {}
                Kept::Member { rejoin: true } => {
                    tracing::debug!(target: "handover", "a heartbeat says the group rebalances");
                    continue 'member;
                }
                Kept::Lost(why) => {
                    lose_membership(&mut runner, &why).await;
                    continue 'member;
                }
            }
        }
    }
    Ok(())
    }
    .await;
    if let Err(e) = outcome {
        // The worker cannot go on (a second worker with its instance id, a cluster of
        // another assignor, a broker that refuses it the group): its tasks stop without
        // committing, the group is left, and the error goes to the caller.
        tracing::error!(cluster = %cluster.name, "the worker stops: {e:#}");
        lose_membership(&mut runner, "the worker stops on an error").await;
        let _ = tokio::time::timeout(Duration::from_secs(5), membership.leave()).await;
        tokio::task::block_in_place(|| runner.stop_all());
        return Err(e);
    }
    tracing::info!("stopping: finishing batches in flight, flushing, committing, leaving the group");
    // Still a member while the tasks finish: keep heartbeating so their commits hold.
    let owned = runner.owned();
    let stopping = runner.begin_stop(&owned, false);
    if let Kept::Lost(why) = heartbeats.wait_for(&mut membership, &mut runner, stopping).await? {
        tracing::warn!(cluster = %cluster.name, "{why} while stopping: the tasks stopped without committing");
    }
    // Every task has ended (committed or not): the group may give them away now. Leaving
    // before the rest shuts down (standbys, threads, clients: the better part of a second)
    // lets the others rebalance meanwhile, instead of waiting for this member.
    let left = membership.leave().await;
    tracing::debug!(target: "handover", "left the group");
    if let Err(e) = left {
        tracing::warn!("leaving the group: {e}");
    }
    let report = tokio::task::block_in_place(|| runner.stop_all());
    Ok(report)
}

/// How long the coordinator waits for every member to rejoin in a rebalance before it drops
/// those that did not (and gives their tasks away).
pub const REBALANCE_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether a drain has gone on longer than `--scale-down-timeout` (then the worker stops
/// what it still owns and leaves).
fn drain_timed_out(cluster: &ClusterConfig, leaving_since: Option<Instant>) -> bool {
    let (Some(since), Some(limit)) = (leaving_since, cluster.scale_down_timeout) else {
        return false;
    };
    let out = since.elapsed() >= limit;
    if out {
        tracing::warn!(
            timeout = ?limit,
            "the drain did not finish within the scale-down timeout: stopping the remaining tasks and leaving"
        );
    }
    out
}

/// Membership is lost: others may own these tasks already. Every task stops without
/// committing, then the worker rejoins.
async fn lose_membership(runner: &mut TaskRunner, why: &str) {
    runner.lease().revoke();
    runner.board().not_ready();
    let running = runner.owned();
    tracing::warn!(
        tasks = running.len(),
        "{why}: stopping every task without committing, then rejoining"
    );
    let stopping = runner.begin_stop(&running, true);
    tokio::task::block_in_place(|| runner.finish(stopping));
}
