//! The commit protocol of a task (see `state` for where a crash can fall): its state quota
//! checked, its stores' writes sent to their changelogs, everything produced acknowledged
//! and the source offsets committed (under exactly-once, one transaction), then the writes
//! and their markers put in RocksDB.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::{Offset, TopicPartitionList};

use sluice_wire::wire;

use super::control::{Lease, Request, TaskControl};
use super::delivery::{DeliveryTracker, Outgoing};
use super::{KafkaEnv, Task, TaskContext, TaskError, TaskOutput};
use crate::group::offsets::Position;
use crate::state::Charge;

/// How a commit went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Commit {
    Done,
    /// The lease was not valid: nothing was committed.
    Skipped,
}

/// How long a commit waits for the task's produced records to be acknowledged.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(120);

impl Task {
    /// The commit protocol under at-least-once (see `state` for where a crash can fall).
    /// Commits nothing when the lease is not valid (skipped: the task waits for it).
    pub(super) fn commit(&mut self, env: &mut KafkaEnv) -> Result<Commit, TaskError> {
        self.last_commit = Instant::now();
        if !self.ctx.lease.valid() {
            return Ok(Commit::Skipped);
        }
        // 0. The guest sends on what it holds back (its record caches): nothing a commit
        //    covers may still wait in the guest.
        self.flush_guest()?;
        // Within its state quota, or nothing of this commit happens.
        if self.state.is_some() {
            self.check_state_quota()?;
        }
        // 1. The stores' writes since the last commit go to their changelogs.
        let logged = self.log_state()?;
        let idle_due = self.last_offsets_commit.elapsed() >= self.ctx.settings.idle_commit_interval;
        if self.positions == self.committed && !logged && !idle_due {
            // Nothing new to commit, but what was committed before may not be purged yet
            // (the last commit of a task whose input has stopped).
            self.purge_committed(env);
            return Ok(Commit::Done);
        }
        // 2. Everything produced is acknowledged; source offsets are committed. (Under
        //    exactly-once the stream thread commits its tasks together: see `transaction`.)
        debug_assert!(
            !self.output.is_transactional(),
            "a transactional task commits with its thread"
        );
        {
            let produce_error = |detail| TaskError::Produce {
                task: self.id.clone(),
                detail,
            };
            let (control, lease, started) = (&self.ctx.control, &self.ctx.lease, Instant::now());
            let give_up = || stop_waiting(control, lease, started);
            if !self
                .tracker
                .wait_idle(DELIVERY_TIMEOUT, &give_up)
                .map_err(produce_error)?
                || !self
                    .changelog_tracker
                    .wait_idle(DELIVERY_TIMEOUT, &give_up)
                    .map_err(produce_error)?
            {
                return Ok(Commit::Skipped);
            }
            // Waiting took time: a worker that lost its membership meanwhile must not move
            // the group's offsets (its successor may have committed newer ones).
            if !self.ctx.lease.valid() {
                return Ok(Commit::Skipped);
            }
            let positions = self.commit_positions();
            if !positions.is_empty() {
                match env.commit_offsets(&self.group, &positions) {
                    Ok(()) => {}
                    // Not fatal: the offsets are committed with the next commit, and until then
                    // a restart only reprocesses (at-least-once).
                    Err(e) => {
                        tracing::warn!(task = %self.id, "committing offsets failed, will retry: {e}");
                        self.commit_state()?;
                        return Ok(Commit::Done);
                    }
                }
            }
        }
        self.committed = self.positions.clone();
        self.last_offsets_commit = Instant::now();
        self.purge_committed(env);
        // 3. The writes and their markers go to RocksDB.
        self.commit_state()?;
        Ok(Commit::Done)
    }

    /// Deletes, every purge interval, what this task has committed of its repartition
    /// sources: the records before its committed offset are processed for good (under
    /// exactly-once, the transaction that moved the offset has committed).
    pub(super) fn purge_committed(&mut self, env: &mut KafkaEnv) {
        let stage = self.ctx.stage();
        if stage.internal_sources.is_empty()
            || self.last_purge.elapsed() < self.ctx.settings.purge_interval
            || self.purged == self.committed
        {
            return;
        }
        self.last_purge = Instant::now();
        let before: Vec<(String, i32, i64)> = stage
            .internal_sources
            .iter()
            .filter_map(|&i| Some((stage.sources[i].1.clone(), self.ctx.partition, self.committed[i]?)))
            .collect();
        self.purged = self.committed.clone();
        env.purge(before);
    }

    /// The positions to commit (sources that have one).
    pub(super) fn offsets(&self) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for (source, position) in self.positions.iter().enumerate() {
            if let Some(offset) = position {
                let topic = self.ctx.source_topic(source as u32);
                tpl.add_partition_offset(topic, self.ctx.partition, Offset::Offset(*offset))
                    .expect("a valid offset");
            }
        }
        tpl
    }

    /// The positions to commit, for the offsets client (sources that have one).
    pub(super) fn commit_positions(&self) -> Vec<Position> {
        let topics = self.ctx.source_topics();
        self.positions
            .iter()
            .enumerate()
            .filter_map(|(source, position)| {
                position.map(|offset| Position {
                    topic: topics[source].clone(),
                    partition: self.ctx.partition,
                    offset,
                })
            })
            .collect()
    }

    pub(super) fn commit_state(&mut self) -> Result<(), TaskError> {
        let Some(state) = &self.state else { return Ok(()) };
        let tracker = &self.changelog_tracker;
        state
            .commit(self.instance.stores_mut(), |topic| tracker.offset(topic))
            .map_err(|detail| TaskError::State {
                task: self.id.clone(),
                detail,
            })
    }

    /// Fails the task (before its writes reach RocksDB) when its topology's state on this
    /// worker, with these writes, would be more than the topology's `limits.state`.
    pub(super) fn check_state_quota(&mut self) -> Result<(), TaskError> {
        let mut mine = 0u64;
        // The topology's global tables count once, however many tasks read them.
        let mut global = 0u64;
        for named in self.instance.stores_mut() {
            match named.store.charge() {
                Charge::Own(bytes) => mine += bytes,
                Charge::Shared(bytes) => global += bytes,
                Charge::Nothing => {}
            }
        }
        let topology = &self.ctx.topology;
        let total: u64 = {
            let mut usage = topology.state_usage.lock().unwrap();
            usage.insert(self.ctx.task.clone(), mine);
            usage.values().sum::<u64>() + global
        };
        if total > topology.state_limit {
            return Err(TaskError::Quota {
                task: self.id.clone(),
                detail: format!(
                    "the state of topology {} on this worker would take {total} bytes, more than its limit \
                     of {} bytes (limits.state in the manifest, or the worker's --state-limit)",
                    topology.name, topology.state_limit
                ),
            });
        }
        Ok(())
    }

    /// Step 1: sends each store's writes since the last commit to its changelog. Returns
    /// whether anything was sent.
    pub(super) fn log_state(&mut self) -> Result<bool, TaskError> {
        let Some(state) = &self.state else { return Ok(false) };
        let mut written = false;
        let partition = self.ctx.partition;
        for named in self.instance.stores_mut() {
            let Some(store) = named.store.logged() else {
                continue;
            };
            if !store.has_changes() {
                continue;
            }
            let changelog = &state.changelog(&named.name).expect("every store has a changelog").topic;
            for (key, value) in store.changes() {
                let out = Outgoing {
                    topic: changelog,
                    partition: Some(partition),
                    key: Some(key),
                    value,
                    timestamp: -1,
                    headers: wire::Headers::EMPTY,
                };
                enqueue(&mut self.output, &self.changelog_tracker, &self.ctx, &self.id, out)?;
                written = true;
            }
        }
        Ok(written)
    }
}

/// Enqueues one record of task `id` (see `delivery::send`): asked to stop while it waits
/// for room, the task gives up (`GaveUp`); a producer failure is a `Produce` error.
pub(super) fn enqueue(
    output: &mut TaskOutput,
    tracker: &Arc<DeliveryTracker>,
    ctx: &TaskContext,
    id: &str,
    out: Outgoing<'_>,
) -> Result<(), TaskError> {
    // The clock is read only once a record has to wait (not on the per-record path).
    let started = std::cell::OnceCell::new();
    let give_up = || stop_waiting(&ctx.control, &ctx.lease, *started.get_or_init(Instant::now));
    match output.send(tracker, out, &give_up) {
        Ok(true) => Ok(()),
        Ok(false) => Err(TaskError::GaveUp { task: id.to_string() }),
        Err(detail) => Err(TaskError::Produce {
            task: id.to_string(),
            detail,
        }),
    }
}

/// How long a task that is asked to stop keeps waiting for Kafka (room to produce,
/// acknowledgements) before it stops without committing.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Whether a wait for Kafka that began at `started` should end: the task is asked to abort,
/// its lease ran out, or it is asked to stop and has waited [`STOP_GRACE`].
fn stop_waiting(control: &TaskControl, lease: &Lease, started: Instant) -> bool {
    match control.request() {
        Request::Abort => true,
        Request::Stop => !lease.valid() || started.elapsed() > STOP_GRACE,
        Request::Run => !lease.valid(),
    }
}
