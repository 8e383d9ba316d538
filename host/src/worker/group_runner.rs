//! A worker in a cluster: joins the group, applies each assignment (revoked tasks stop
//! before anything else happens), heartbeats on schedule — also while tasks stop — and
//! leaves on shutdown. Losing the membership (the coordinator says so during a heartbeat,
//! join or sync, or the lease runs out) while the lease still holds pauses every task and
//! rejoins at once: a leader holds a vanished member's tasks back for longer than that lease
//! (see `holds`), so tasks the group gives back within it go on where they were; otherwise,
//! and on any other loss, every task stops without committing, then the worker rejoins.

mod changes;
mod config;
mod decide;
mod fencing;
mod holds;
mod losing;
mod probing;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::sync::mpsc::UnboundedReceiver;

use self::decide::Speak;
use super::deploys::TopologyChange;
use super::heartbeats::{lease_margin, liveness, vanished_hold, Heartbeats, Kept};
use super::intruders::{Intruders, Next};
use super::learners::{learners_caught_up, ChangelogEnds, LEARNER_CHECK_EVERY, STANDBY_CHECK_EVERY};
use super::{Handovers, TaskRunner, WorkerReport};
use crate::group::assignor::{by_name, Assignor};
use crate::group::membership::{Joined, Membership, MembershipConfig, MembershipError};
use crate::group::metadata::{Assignment, AssignmentError, MemberMetadata, CURRENT_VERSION, OLDEST_VERSION};
use crate::group::TaskId;
use crate::group::{cluster_group, placement};

pub use config::{ClusterConfig, LearnerRejoin, Stop};

pub async fn run(
    cluster: &ClusterConfig,
    runner: TaskRunner,
    shutdown: impl std::future::Future<Output = ()>,
    mut changes: tokio::sync::mpsc::UnboundedReceiver<TopologyChange>,
) -> anyhow::Result<WorkerReport> {
    let mut group = GroupRunner::new(cluster, runner)?;
    tokio::pin!(shutdown);
    // The member loop: `Ok` when the worker is asked to stop (or drained), `Err` when it
    // cannot go on; either way its tasks are stopped before the worker returns.
    let outcome = group.member_loop(&mut shutdown, &mut changes).await;
    match outcome {
        Ok(()) => group.leave().await,
        Err(e) => Err(group.fail(e).await),
    }
}

/// Where the member loop goes when a step does not go on.
enum Then {
    /// Join again (after whatever the step did: stopped tasks, a pause).
    Rejoin,
    /// Stop every task and leave the group (asked to, drained, or nothing left to do).
    Leave,
}

/// What a step of the member loop returns: `Ok(Ok(_))` to go on, `Ok(Err(then))` to rejoin
/// or leave, `Err` when the worker cannot go on.
type Step<T> = anyhow::Result<Result<T, Then>>;

/// The value of a step that goes on; otherwise returns where the loop goes.
macro_rules! go_on {
    ($step:expr) => {
        match $step? {
            Ok(value) => value,
            Err(then) => return Ok(Err(then)),
        }
    };
}

/// What a join is prepared with.
struct Prepared {
    /// When preparing began (for the handover trace).
    began: Instant,
    topologies: Vec<crate::group::metadata::TopologyInfo>,
    /// The changelog partitions of this worker's stateful tasks, and where they end.
    stateful: Vec<(TaskId, Vec<(String, i32)>)>,
    ends: HashMap<TaskId, i64>,
    metadata: MemberMetadata,
}

/// A worker in its cluster's group: its task runner, its membership and what the member
/// loop remembers between joins. One round of the loop: [`GroupRunner::prepare`], join,
/// apply the assignment, heartbeat until the next rebalance.
struct GroupRunner<'a> {
    cluster: &'a ClusterConfig,
    runner: TaskRunner,
    membership: Membership,
    heartbeats: Heartbeats<'a>,
    intruders: Intruders,
    assignor: Box<dyn Assignor>,
    /// The eager assignor: every task stops before each join.
    stop_the_world: bool,
    worker_id: [u8; 16],
    /// Reads changelog end offsets (for the leader's lag figures and for learners' progress).
    offsets: ChangelogEnds,
    /// Learners that caught up and asked for their task (when), so a worker does not rejoin
    /// for the same learner over and over.
    asked: HashMap<TaskId, Instant>,
    /// The generation of the last assignment that asked for a rejoin, and how many times in
    /// a row it did.
    rejoins: (i32, u32),
    /// Since when this worker drains (marked leaving in its metadata), if it does.
    leaving_since: Option<Instant>,
    /// When the first assignment of a run of rejoins came (a round that revokes tasks
    /// elsewhere): tasks assigned here at the end of it are handovers, timed from then.
    round_began: Option<Instant>,
    /// As leader: tasks of members that vanished, held back (see `holds`).
    holds: std::cell::RefCell<holds::Holds>,
    /// Who was in the generation of the last assignment (its roster; empty before metadata
    /// version 5 or in a group too large for one): as leader, the members gone from a join
    /// have their transactions ended (see `fencing`).
    roster: Vec<crate::group::metadata::Rostered>,
    /// The metadata version this member speaks: its newest at first, then its last
    /// assignment's (version probing: see `group::metadata`).
    speaking: u16,
    /// The membership was lost while the lease held: every task is paused (the lease is
    /// revoked and renewals do not reach it) until this moment, when the lease would have
    /// ended; the next assignment says which of them go on (see [`GroupRunner::pause`]).
    paused_until: Option<Instant>,
}

impl<'a> GroupRunner<'a> {
    fn new(cluster: &'a ClusterConfig, mut runner: TaskRunner) -> anyhow::Result<GroupRunner<'a>> {
        let assignor = by_name(&cluster.assignor).with_context(|| {
            format!(
                "unknown assignor {:?}; the built-in ones are \"sticky\" and \"eager\"",
                cluster.assignor
            )
        })?;
        runner.release_failed_tasks(cluster.release_failed_tasks);
        let worker_id = crate::state::dir::worker_id(&cluster.state_dir)?;
        anyhow::ensure!(
            (OLDEST_VERSION..=CURRENT_VERSION).contains(&cluster.metadata_version),
            "metadata version {} is not one this worker speaks ({OLDEST_VERSION} to {CURRENT_VERSION})",
            cluster.metadata_version
        );
        let membership = Membership::new(MembershipConfig {
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
                .saturating_sub(lease_margin(cluster.session_timeout))
                .min(liveness(cluster.heartbeat_interval)),
            last_heard: std::cell::Cell::new(None),
            paused: std::cell::Cell::new(false),
            timeout: (cluster.session_timeout / 4).max(Duration::from_millis(200)),
        };
        Ok(GroupRunner {
            cluster,
            stop_the_world: cluster.assignor == "eager",
            assignor,
            worker_id,
            offsets: ChangelogEnds::new(&cluster.kafka),
            membership,
            heartbeats,
            runner,
            intruders: Intruders::default(),
            asked: HashMap::new(),
            rejoins: (i32::MIN, 0),
            leaving_since: None,
            round_began: None,
            holds: std::cell::RefCell::new(holds::Holds::new(vanished_hold(cluster.heartbeat_interval))),
            paused_until: None,
            speaking: cluster.metadata_version,
            roster: Vec::new(),
        })
    }

    fn drain_requested(&self) -> bool {
        self.cluster.drain.as_ref().is_some_and(|d| *d.borrow() == Stop::Drain)
    }

    /// Joins, applies the assignment and heartbeats until the next rebalance, over and
    /// over: `Ok` when the worker is to leave, `Err` when it cannot go on.
    async fn member_loop<S: Future<Output = ()> + Unpin>(
        &mut self,
        shutdown: &mut S,
        changes: &mut UnboundedReceiver<TopologyChange>,
    ) -> anyhow::Result<()> {
        loop {
            match self.round(shutdown, changes).await? {
                Ok(()) | Err(Then::Rejoin) => continue,
                Err(Then::Leave) => return Ok(()),
            }
        }
    }

    /// One round of the member loop, from preparing a join to the next rebalance.
    async fn round<S: Future<Output = ()> + Unpin>(
        &mut self,
        shutdown: &mut S,
        changes: &mut UnboundedReceiver<TopologyChange>,
    ) -> Step<()> {
        let prepared = go_on!(self.prepare().await);
        let joined = go_on!(self.join(&prepared, shutdown).await);
        go_on!(self.apply(joined, &prepared.ends, shutdown).await);
        self.heartbeat_until_rebalance(&prepared.stateful, shutdown, changes)
            .await
            .map(Err)
    }

    /// Before a join: under the eager assignor, stops every task (stop-the-world); marks a
    /// drain asked for; leaves once a drain ran out of time; reads the changelogs' ends and
    /// says what this worker runs and holds in its metadata.
    async fn prepare(&mut self) -> Step<Prepared> {
        let began = Instant::now();
        self.runner.board().rebalance_started();
        if self.paused_until.is_some_and(|until| Instant::now() >= until) {
            // Too late to go on: others may be given the paused tasks by now. Claiming
            // them would only make two owners.
            self.lose("the paused tasks' lease ran out before the group gave them back")
                .await;
        }
        // What this worker runs (uploads and deletions change it between joins).
        let topologies = self.runner.topology_infos();
        let stateful = self.runner.changelog_partitions();
        if self.stop_the_world && !self.runner.owned().is_empty() {
            // Eager rebalancing is stop-the-world: every task stops (and commits) before this
            // member rejoins, so no task is ever active on two workers.
            let running = self.runner.owned();
            tracing::info!(
                tasks = running.len(),
                "eager rebalance: stopping every task before rejoining"
            );
            let stopping = self.runner.begin_stop(&running, false);
            if let Kept::Lost(why) = self
                .heartbeats
                .wait_for(&mut self.membership, &mut self.runner, stopping)
                .await?
            {
                tracing::warn!(cluster = %self.cluster.name, "{why}: the tasks stopped without committing");
            }
        }
        if self.leaving_since.is_none() && self.drain_requested() {
            tracing::info!(
                tasks = self.runner.owned().len(),
                "draining: asking the group to move this worker's tasks away"
            );
            self.leaving_since = Some(Instant::now());
            self.runner.board().set_leaving(true);
        }
        if drain_timed_out(self.cluster, self.leaving_since) {
            return Ok(Err(Then::Leave));
        }
        // Every member reads them (any may be the leader): one request per rebalance.
        let ends = tokio::task::block_in_place(|| self.offsets.read(&stateful));
        let learners = self.runner.learners();
        let metadata = MemberMetadata {
            version: self.speaking,
            supported: self.cluster.metadata_version,
            release: crate::VERSION.to_string(),
            threads: self.runner.threads() as u32,
            worker_id: self.worker_id,
            capacity: self.cluster.capacity,
            active: self.runner.owned(),
            standby: decide::standing_by(self.runner.standbys(), &learners),
            learner: learners,
            offset_sums: self.runner.local_offset_sums(),
            topologies: Some(topologies.clone()),
            failed: self.runner.failed(),
            leaving: self.leaving_since.is_some(),
            admin: self.cluster.admin.clone(),
            joined_from: None,
        };
        Ok(Ok(Prepared {
            began,
            topologies,
            stateful,
            ends,
            metadata,
        }))
    }

    /// Joins the group (as leader, placing every member's tasks), keeping the lease alive
    /// while the join waits. A lost membership, a foreign leader, a group of another
    /// protocol or a fenced instance id is dealt with here: then the worker rejoins (after a
    /// pause) or stops.
    async fn join<S: Future<Output = ()> + Unpin>(&mut self, prepared: &Prepared, shutdown: &mut S) -> Step<Joined> {
        let cluster = self.cluster;
        // The leader places what the members say they run, not what it runs itself.
        let staying = std::cell::Cell::new(usize::MAX);
        let present = std::cell::RefCell::new(std::collections::HashSet::new());
        let assignor = &self.assignor;
        let holds = &self.holds;
        let assign = |members: &BTreeMap<String, MemberMetadata>| {
            staying.set(members.values().filter(|m| !m.leaving).count());
            *present.borrow_mut() = members.values().map(|m| m.worker_id).collect();
            let placement = placement::plan(members, &prepared.topologies);
            for problem in &placement.problems {
                tracing::warn!(cluster = %cluster.name, "{problem}");
            }
            let mut holds = holds.borrow_mut();
            let held = holds.held(members, &placement.tasks, Instant::now());
            if !held.is_empty() {
                tracing::info!(
                    cluster = %cluster.name, tasks = held.len(),
                    "holding back the tasks of a member that left the group without leaving it (it may still run them until its lease ends); they are placed when it comes back or once the hold is over"
                );
            }
            let mut out = placement::assign(
                &**assignor,
                members,
                &placement,
                &prepared.ends,
                cluster.standby_replicas,
                cluster.learners,
            );
            holds::withhold(&mut out, members, &held);
            holds.remember(members, &out);
            out
        };
        // While the join waits (for a slow member, up to the rebalance timeout), a probe
        // keeps the session — and so the lease — alive, so tasks keep processing through a
        // long rebalance as the cooperative protocol intends.
        let probe = self.membership.probe();
        let heartbeats = &self.heartbeats;
        let keep_alive = async {
            let Some(mut probe) = probe else {
                return std::future::pending().await;
            };
            loop {
                tokio::time::sleep(cluster.heartbeat_interval).await;
                let sent = Instant::now();
                if probe.still_member(heartbeats.timeout).await {
                    heartbeats.renew(sent);
                }
            }
        };
        // A JoinGroup in: the coordinator no longer drops this member for the rebalance
        // timeout (see `Heartbeats::beat`).
        heartbeats.lease.lift_cap();
        tracing::debug!(target: "handover", ms = prepared.began.elapsed().as_millis() as u64, "join prepared");
        let joined = tokio::select! {
            joined = self.membership.join(&prepared.metadata, assign) => joined,
            _ = keep_alive => unreachable!("the probe loop never ends"),
            _ = &mut *shutdown => return Ok(Err(Then::Leave)),
        };
        let joined = go_on!(self.joined_or_why_not(joined, shutdown).await);
        if !joined.leader {
            self.holds.borrow_mut().forget();
        } else if joined.unread == 0 {
            self.end_vanished_transactions(&present.borrow());
        }
        self.heartbeats.renew(joined.alive_at);
        // Transactions from now on prove this generation (the tasks it revokes are still
        // this worker's until it rejoins; none it assigns were anyone else's in it).
        self.runner.fence().admit(
            &joined.member_id,
            joined.generation,
            self.cluster.instance_id.as_deref(),
        );
        if self.leaving_since.is_some() && joined.leader && staying.get() == 0 {
            // Every member is leaving: there is nowhere to move the tasks. This one (the
            // leader) stops its tasks and leaves; the next leader does the same.
            tracing::warn!("draining, but every worker of the cluster is leaving: stopping the tasks here and leaving");
            return Ok(Err(Then::Leave));
        }
        Ok(Ok(joined))
    }

    /// What a failed join means: a lost membership stops every task and rejoins; a foreign
    /// leader, a group of another protocol or a fenced instance id is looked into (see
    /// `worker::intruders`), then the worker rejoins after a pause or stops.
    async fn joined_or_why_not<S: Future<Output = ()> + Unpin>(
        &mut self,
        joined: Result<Joined, MembershipError>,
        shutdown: &mut S,
    ) -> Step<Joined> {
        let cluster = self.cluster;
        let next = match joined {
            Ok(joined) => return Ok(Ok(joined)),
            Err(MembershipError::Lost { reason, call, .. }) => {
                self.pause(&format!("{call}: {reason}")).await;
                return Ok(Err(Then::Rejoin));
            }
            Err(MembershipError::BadAssignment { detail, leader, .. }) => {
                // A leader without the cluster's secret (a process that joined the group) or
                // of another version: its assignment is not applied. No worker of the
                // cluster assigned anything this generation, so each keeps what it runs,
                // under its lease, and joins again once the intruders are removed.
                self.intruders
                    .foreign_leader(cluster, &mut self.membership, &leader, &detail)
                    .await
            }
            Err(MembershipError::OtherProtocol { group, ours, .. }) => {
                self.intruders
                    .other_protocol(cluster, &mut self.membership, &group, &ours)
                    .await
            }
            Err(MembershipError::Fenced { .. }) => {
                // Another member holds this worker's group.instance.id: the coordinator may
                // hand its tasks out already.
                self.lose("another member joined with this worker's group.instance.id")
                    .await;
                self.intruders
                    .fenced(cluster, &mut self.membership, self.worker_id)
                    .await
            }
            Err(e) => return Err(e.into()),
        };
        match next {
            Next::Rejoin(pause) => {
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = &mut *shutdown => return Ok(Err(Then::Leave)),
                }
                Ok(Err(Then::Rejoin))
            }
            Next::Exit(e) => Err(e),
        }
    }

    /// Applies an assignment: revoked tasks (and anything no longer ours) stop first, then
    /// unwanted standbys; then the assigned tasks, standbys and learners start. Leaves once
    /// a drain has moved every task away; rejoins (backing off) when the assignment asks to.
    async fn apply<S: Future<Output = ()> + Unpin>(
        &mut self,
        joined: Joined,
        ends: &HashMap<TaskId, i64>,
        shutdown: &mut S,
    ) -> Step<()> {
        let a = &joined.assignment;
        self.intruders.settled();
        let speak = match self.follow_version(a).await {
            Ok(speak) => speak,
            Err(then) => return Ok(Err(then)),
        };
        if a.error == AssignmentError::None as i16 {
            self.roster = a.roster.clone();
        }
        if a.error != AssignmentError::None as i16 {
            // The leader did not see what this worker runs, so it may have given those tasks
            // to others in this very generation: they stop without committing.
            tracing::error!(
                cluster = %self.cluster.name, error = a.error,
                "the leader could not read this worker's metadata (a version it does not know?); no tasks for now, rejoining in 5s"
            );
            self.lose("the leader did not read this worker's metadata").await;
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = &mut *shutdown => return Ok(Err(Then::Leave)),
            }
            return Ok(Err(Then::Rejoin));
        }
        tracing::info!(
            cluster = %self.cluster.name, generation = joined.generation, leader = joined.leader,
            active = a.active.len(), standby = a.standby.len(), learner = a.learner.len(),
            revoked = a.revoked.len(), rejoin = a.rejoin,
            tasks = %a.active.iter().map(TaskId::to_string).collect::<Vec<_>>().join(","),
            learners = %a.learner.iter().map(TaskId::to_string).collect::<Vec<_>>().join(","),
            "assignment"
        );
        if let Some(until) = self.paused_until.take() {
            self.settle_pause(a, until, joined.alive_at);
        }
        // Whether this worker joined claiming nothing: only then may a drained worker leave
        // (one that stops its last tasks now joins once more without them, so the leader
        // sees it run nothing instead of a member that vanished with them: see `holds`).
        let joined_with_nothing = self.runner.owned().is_empty();
        let promoted = self.note_moves(a, ends);
        let handovers = go_on!(self.stop_what_leaves(joined.generation, a).await);
        for (t, lag) in &promoted {
            let lag = lag.map_or("unknown".to_string(), |l| l.to_string());
            tracing::info!(task = %t, lag = %lag, "learner promoted: the task is active here now");
        }
        self.runner.start(&a.active, handovers)?;
        self.runner.set_standbys(&a.standby, &a.learner)?;
        self.runner
            .board()
            .assigned(joined.generation, joined.leader, &a.active, &a.standby, &a.learner);
        if !a.rejoin {
            self.runner.board().rebalance_finished();
        }
        if self.leaving_since.is_some() && self.runner.owned().is_empty() && joined_with_nothing {
            tracing::info!(
                seconds = %format!("{:.1}", self.leaving_since.map_or(0.0, |t| t.elapsed().as_secs_f64())),
                "drained: every task runs elsewhere now; leaving the group"
            );
            return Ok(Err(Then::Leave));
        }
        if self.leaving_since.is_some() && !joined_with_nothing && self.runner.owned().is_empty() {
            tracing::debug!(target: "handover", "drained: rejoining once without the last tasks before leaving");
            return Ok(Err(Then::Rejoin));
        }
        if let Speak::Up(version) = speak {
            self.speaking = version;
            return Ok(Err(Then::Rejoin));
        }
        if a.rejoin {
            // Asked to rejoin again in the same generation: the rebalance waits for another
            // member (finishing a revocation). Back off instead of spinning through joins.
            if let Some(wait) = decide::rejoin_backoff(&mut self.rejoins, joined.generation) {
                tracing::debug!(target: "handover", generation = joined.generation, ms = wait.as_millis() as u64, "asked to rejoin in the same generation: backing off");
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = &mut *shutdown => return Ok(Err(Then::Leave)),
                }
            }
            return Ok(Err(Then::Rejoin));
        }
        Ok(Ok(()))
    }

    /// Notes what an assignment moves: tasks arriving at the end of a round of rejoins are
    /// handovers (timed on the board), learners no longer assigned are forgotten. Returns the
    /// learners made active now, with how far behind they were (as of the join): they stop
    /// as learners and start as active tasks, which replay only the rest.
    fn note_moves(&mut self, a: &Assignment, ends: &HashMap<TaskId, i64>) -> Vec<(TaskId, Option<i64>)> {
        let assigned_at = Instant::now();
        let arriving = decide::arriving(&a.active, &self.runner.owned());
        if let Some(round) = self.round_began.filter(|_| !arriving.is_empty()) {
            self.runner.board().moving_here(&arriving, round);
        }
        self.round_began = decide::round_began(self.round_began, a.rejoin, assigned_at);
        self.asked.retain(|t, _| a.learner.contains(t));
        decide::promoted(
            &a.active,
            &self.runner.learners(),
            ends,
            &self.runner.standby_positions(),
        )
    }

    /// Stops what the assignment takes away: revoked tasks (and anything no longer ours)
    /// first — commit, flush, close, heartbeating meanwhile; then standbys no longer wanted
    /// (or promoted), which checkpoint what they applied, so a promoted task replays only the
    /// rest; promoted learners hand their stores over, through the handovers returned for
    /// the tasks' starts. A membership lost meanwhile stops every task and rejoins.
    async fn stop_what_leaves(&mut self, generation: i32, a: &Assignment) -> Step<Handovers> {
        let stop = decide::no_longer_active(self.runner.owned(), &a.active);
        let stop_standby = decide::no_longer_standing_by(self.runner.standbys(), &a.standby, &a.learner);
        let revoke_began = Instant::now();
        let stopping = self.runner.begin_stop(&stop, false);
        if let Kept::Lost(why) = self
            .heartbeats
            .wait_for(&mut self.membership, &mut self.runner, stopping)
            .await?
        {
            self.lose(&why).await;
            return Ok(Err(Then::Rejoin));
        }
        if !stop.is_empty() {
            self.runner.board().revoked(&stop, revoke_began.elapsed());
            tracing::debug!(
                target: "handover", generation,
                tasks = %stop.iter().map(TaskId::to_string).collect::<Vec<_>>().join(","),
                ms = revoke_began.elapsed().as_millis() as u64, "revoked tasks stopped"
            );
        }
        let handovers = tokio::task::block_in_place(|| self.runner.stop_standbys(&stop_standby, &a.active));
        Ok(Ok(handovers))
    }

    /// Between rebalances: heartbeats on schedule, reaps ended tasks, checks standbys' and
    /// learners' progress, and follows deploys. Returns when the worker must rejoin (a
    /// rebalance, a drain asked for, a learner caught up, a topology changed, a task fenced
    /// or released, membership lost) or leave (shutdown).
    async fn heartbeat_until_rebalance<S: Future<Output = ()> + Unpin>(
        &mut self,
        stateful: &[(TaskId, Vec<(String, i32)>)],
        shutdown: &mut S,
        changes: &mut UnboundedReceiver<TopologyChange>,
    ) -> anyhow::Result<Then> {
        let cluster = self.cluster;
        let mut next_beat = Instant::now() + cluster.heartbeat_interval;
        let mut next_learner_check = Instant::now() + LEARNER_CHECK_EVERY;
        let mut next_standby_check = Instant::now();
        // Wakes the loop at once when a drain is asked for.
        let mut asked_to_drain = cluster.drain.as_ref().map(|d| d.subscribe());
        loop {
            let hold_ends = self.holds.borrow().next_end();
            let wake = decide::wake_at(
                next_beat,
                Instant::now() + super::REAP_EVERY,
                self.runner.has_learners().then_some(next_learner_check),
                self.runner.has_standbys().then_some(next_standby_check),
            );
            let wake = hold_ends.map_or(wake, |end| wake.min(end));
            let leaving = self.leaving_since.is_some();
            tokio::select! {
                _ = tokio::time::sleep_until(wake.into()) => {}
                _ = async {
                    match asked_to_drain.as_mut() {
                        Some(rx) if !leaving => {
                            let _ = rx.wait_for(|s| *s == Stop::Drain).await;
                        }
                        _ => std::future::pending().await,
                    }
                } => {}
                _ = &mut *shutdown => return Ok(Then::Leave),
                Some(change) = changes.recv() => {
                    self.change_topologies(change).await?;
                    return Ok(Then::Rejoin);
                }
            }
            if self.runner.reap()?.rejoin {
                tracing::warn!(cluster = %cluster.name, "a task was fenced by another owner, or released: rejoining");
                return Ok(Then::Rejoin);
            }
            if (self.leaving_since.is_none() && self.drain_requested()) || drain_timed_out(cluster, self.leaving_since)
            {
                return Ok(Then::Rejoin);
            }
            if hold_ends.is_some_and(|end| Instant::now() >= end) {
                tracing::info!(
                    tasks = self.holds.borrow().count(),
                    "a member that left the group without leaving it has not come back: rejoining to place its tasks"
                );
                return Ok(Then::Rejoin);
            }
            let now = Instant::now();
            let learning = self.runner.has_learners() && now >= next_learner_check;
            if learning || (self.runner.has_standbys() && now >= next_standby_check) {
                next_learner_check = now + LEARNER_CHECK_EVERY;
                next_standby_check = now + STANDBY_CHECK_EVERY;
                if self.check_warm(stateful, learning) {
                    tracing::debug!(target: "handover", "a learner caught up: rejoining");
                    return Ok(Then::Rejoin);
                }
            }
            if Instant::now() < next_beat {
                continue;
            }
            next_beat = Instant::now() + cluster.heartbeat_interval;
            match self.heartbeats.beat(&mut self.membership).await? {
                Kept::Member { rejoin: false } => {}
                Kept::Member { rejoin: true } => {
                    tracing::debug!(target: "handover", "a heartbeat says the group rebalances");
                    return Ok(Then::Rejoin);
                }
                Kept::Lost(why) => {
                    self.pause(&why).await;
                    return Ok(Then::Rejoin);
                }
            }
        }
    }

    /// Where the standbys and learners are, and where their changelogs end: for the status
    /// board, and (with `learning`) for learners to know when to take their tasks over.
    /// Returns whether a learner caught up (the worker rejoins for its task).
    fn check_warm(&mut self, stateful: &[(TaskId, Vec<(String, i32)>)], learning: bool) -> bool {
        let warm = self.runner.standbys();
        let mine: Vec<(TaskId, Vec<(String, i32)>)> =
            stateful.iter().filter(|(t, _)| warm.contains(t)).cloned().collect();
        let ends = tokio::task::block_in_place(|| self.offsets.read(&mine));
        let positions = self.runner.standby_positions();
        self.runner.board().positions(&positions, &ends);
        learning && learners_caught_up(self.cluster, &self.runner, &ends, &positions, &mut self.asked)
    }
}

/// How long the coordinator waits for every member to rejoin in a rebalance before it drops
/// those that did not (and gives their tasks away).
pub const REBALANCE_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether a drain has gone on longer than `--scale-down-timeout` (then the worker stops
/// what it still owns and leaves).
fn drain_timed_out(cluster: &ClusterConfig, leaving_since: Option<Instant>) -> bool {
    let (Some(limit), true) = (
        cluster.scale_down_timeout,
        decide::drain_over(leaving_since, cluster.scale_down_timeout, Instant::now()),
    ) else {
        return false;
    };
    tracing::warn!(
        timeout = ?limit,
        "the drain did not finish within the scale-down timeout: stopping the remaining tasks and leaving"
    );
    true
}
