//! One task — a sub-topology on one input partition — as a state machine that a stream
//! thread drives (see `threads`): it is fed records, calls the guest on a batch, produces
//! what it emits, and commits.
//!
//! - `start`: opening a task (its producer, restored state, guest instance, positions);
//! - `batch`: a batch through the guest (and a failing record isolated), punctuation;
//! - `reject`: a record the guest cannot process, by the topology's error policy;
//! - `commit`: the commit protocol (see `state` for where a crash can fall);
//! - `state`: its stores, checked against and restored from their changelogs;
//! - `output` and `delivery`: the producer layout under each guarantee, and acknowledgements;
//! - `source`: committed source offsets and where a partition starts; `rate`: its
//!   records-per-second limit; `control`: what the worker lets it do.
//!
//! A task processes and commits only while the worker's membership lease is valid (see
//! `control`); asked to abort, it stops without committing anything more.

mod batch;
mod commit;
pub mod control;
pub mod delivery;
mod formats;
mod output;
pub mod partition_group;
mod rate;
mod reject;
mod source;
mod start;
pub mod state;
mod transaction;

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_wire::wire::Writer;
use sluice_wire::TaskInfo;

use crate::group::TaskId;
use crate::kafka::KafkaSettings;
use crate::metrics::{Metrics, TaskLabels};
use crate::runtime::{GuestFault, TaskInstance};
use crate::topology::DeployedTopology;
use commit::Commit;
use control::{Lease, Request, TaskControl};
use delivery::{DeliveryTracker, SharedProducer};
pub use output::{thread_transactional_id, Guarantee, TaskOutput, ThreadProducer, TransactionError};
pub use source::KafkaEnv;
use start::report_end;
pub use start::{prepare, Prepared};
use state::TaskState;
pub use transaction::Prepared as InTransaction;

/// Knobs shared by every task of a worker.
#[derive(Debug, Clone)]
pub struct TaskSettings {
    pub batch_size: usize,
    /// Stream threads of the worker: each runs its share of the tasks.
    pub threads: usize,
    /// Most bytes of records in one batch (a quarter of the topology's memory limit, if
    /// that is less): a batch must fit in the guest's memory with room for its output.
    pub max_batch_bytes: usize,
    /// Bytes of records each stream thread's consumer may fetch ahead of processing.
    pub prefetch_bytes: usize,
    /// Most changelog records a second the state updater reads (none: no limit).
    pub standby_restore_rate: Option<u64>,
    pub commit_interval: Duration,
    pub punctuate_interval: Duration,
    pub guarantee: Guarantee,
    /// A task whose position did not move re-commits it this often, so the broker never
    /// expires the offsets of an idle partition.
    pub idle_commit_interval: Duration,
    /// How often a task deletes what it has committed of its repartition sources.
    pub purge_interval: Duration,
}

impl Default for TaskSettings {
    fn default() -> Self {
        TaskSettings {
            batch_size: 500,
            threads: 2,
            max_batch_bytes: 16 << 20,
            prefetch_bytes: 64 << 20,
            standby_restore_rate: None,
            commit_interval: Duration::from_secs(1),
            punctuate_interval: Duration::from_secs(1),
            guarantee: Guarantee::AtLeastOnce,
            idle_commit_interval: Duration::from_secs(1),
            purge_interval: crate::topology::repartition::PURGE_INTERVAL,
        }
    }
}

/// Why a task stopped. Each message names the task, where it was, and the cause.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("task {task} failed at {at}: {fault}")]
    Guest {
        task: String,
        at: String,
        fault: GuestFault,
    },
    #[error("task {task} failed: {detail}")]
    Produce { task: String, detail: String },
    #[error("task {task} failed: state: {detail}")]
    State { task: String, detail: String },
    #[error("task {task} failed: {detail}")]
    Transaction { task: String, detail: String },
    /// Its topology's state on this worker would grow past `limits.state`.
    #[error("task {task} failed: {detail}")]
    Quota { task: String, detail: String },
    #[error("task {task} failed: reading its sources: {detail}")]
    Source { task: String, detail: String },
    /// Asked to stop while it waited for Kafka: it stops without committing (not a failure).
    #[error("task {task} was stopped while it waited for Kafka")]
    GaveUp { task: String },
    /// A step of its start went past its deadline: the start was given up (to be retried).
    #[error("task {task} did not start: {detail}")]
    Start { task: String, detail: String },
    /// A record it cannot read (its topic's format), under `on-error = "fail"`; or a sink
    /// schema the registry refuses. `retry`: what is wrong is the registry's answer, which
    /// may change (the task starts again later); else the topology must be fixed.
    #[error("task {task} failed at {at}: {reason}")]
    Input {
        task: String,
        at: String,
        reason: String,
        retry: bool,
    },
}

impl TaskError {
    pub fn kind(&self) -> &'static str {
        match self {
            TaskError::Guest { fault, .. } => fault.kind(),
            TaskError::Produce { .. } => "produce",
            TaskError::Source { .. } => "source",
            TaskError::State { .. } => "state",
            TaskError::Transaction { .. } => "transaction",
            TaskError::GaveUp { .. } => "stopped",
            TaskError::Quota { .. } => "quota",
            TaskError::Start { .. } => "start",
            TaskError::Input { .. } => "input",
        }
    }
}

/// Everything a task needs to start and run.
pub struct TaskContext {
    pub topology: Arc<DeployedTopology>,
    /// The task: which of the topology's stages (`topology.stages[stage]`), on which partition.
    pub task: TaskId,
    pub stage: usize,
    pub partition: i32,
    /// The worker's shared producer (used under at-least-once).
    pub producer: Arc<SharedProducer>,
    pub settings: TaskSettings,
    pub control: Arc<TaskControl>,
    pub lease: Arc<Lease>,
    pub metrics: Metrics,
    /// Where the task's progress is told (the worker's status board).
    pub progress: Arc<dyn TaskProgress>,
    pub kafka: KafkaSettings,
    /// Where stateful topologies keep their stores.
    pub state: Arc<crate::state::dir::StateDir>,
    /// Where what ended is dropped, off the path that waits.
    pub drops: Arc<crate::drops::Drops>,
    /// Its stores open already, if it has any here (taken at start).
    pub warm: Option<crate::state::warm::Warm>,
    /// Where the task returns its open stores when it ends (the worker's task runner).
    pub returns: std::sync::mpsc::Sender<(TaskId, crate::state::warm::WarmStores)>,
    /// The worker's schema registry client and cache (for topics in the Confluent wire format).
    pub schemas: crate::formats::Schemas,
}

impl TaskContext {
    /// The stage (sub-topology) this task runs.
    pub fn stage(&self) -> &crate::topology::Stage {
        &self.topology.stages[self.stage]
    }

    /// The topic of this task's source `source` (numbered within its stage).
    pub fn source_topic(&self, source: u32) -> &str {
        &self.stage().sources[source as usize].1
    }

    /// Its source topics, in the stage's order.
    pub fn source_topics(&self) -> Vec<String> {
        self.stage().sources.iter().map(|(_, t)| t.clone()).collect()
    }
}

/// What a task tells the worker as it starts (the worker's status board listens).
pub trait TaskProgress: Send + Sync {
    /// The task replays its changelogs: `restored` of `total` records, at `rate` per second.
    fn restoring(&self, task: &TaskId, restored: u64, total: u64, rate: f64);
    /// The task has started processing.
    fn processing(&self, task: &TaskId);
    /// The task produced its first records (since it started here).
    fn first_output(&self, _task: &TaskId) {}
    /// The task waits for something other than its records (a schema from the registry):
    /// what, for people; none when it waits no more.
    fn waiting(&self, _task: &TaskId, _what: Option<String>) {}
}

/// What a task did before it stopped.
#[derive(Debug, Default, Clone, Copy)]
pub struct TaskSummary {
    pub records_in: u64,
    pub records_out: u64,
    pub ended: Ended,
}

/// How a task that did not fail ended.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Asked to stop: it finished its batch, committed and closed the guest.
    #[default]
    Stopped,
    /// Stopped without committing (asked to abort, its lease ran out, or it was fenced).
    Aborted,
    /// Asked to stop before it had started processing (while restoring, for example).
    BeforeStart,
}

/// A task whose guest call ran into its deadline sits out this many times the call's
/// duration before its next call: a guest that loops until its deadline on every record
/// holds its stream thread at most a tenth of the time, and the other tasks on the thread
/// (other tenants' too) keep the rest.
pub const DEADLINE_PENALTY: u32 = 9;

/// How long one call (a batch, a punctuation) may hold its stream thread at the price of
/// its time; each millisecond beyond this is charged `1 + DEADLINE_PENALTY` times (see
/// [`Task::thread_time`]).
pub const CALL_SLICE: Duration = Duration::from_millis(10);

/// The thread time a call that held the thread for `held` is charged: its time, and
/// [`DEADLINE_PENALTY`] times more for what went beyond [`CALL_SLICE`]. A guest that returns
/// just under its deadline on every call so gets about as much of a contended thread as one
/// that runs into it (a tenth beside one busy task, less beside more), while batches of
/// ordinary length pay their time.
pub fn thread_charge(held: Duration) -> Duration {
    held + held.saturating_sub(CALL_SLICE) * DEADLINE_PENALTY
}

pub struct Task {
    ctx: TaskContext,
    /// `sluice-<topology>`: where source offsets are committed.
    group: String,
    labels: TaskLabels,
    id: String,
    info: TaskInfo,
    instance: TaskInstance,
    tracker: Arc<DeliveryTracker>,
    /// Changelog records in flight; remembers acknowledged offsets for the store markers.
    changelog_tracker: Arc<DeliveryTracker>,
    output: TaskOutput,
    state: Option<TaskState>,
    writer: Writer,
    /// With several source partitions: what was fetched of each, taken into the batch in
    /// timestamp order (see `partition_group`).
    inputs: Option<partition_group::PartitionGroup>,
    /// (source index, offset) of each record in the current batch.
    batch: Vec<(u32, i64)>,
    /// Bytes at which a batch is full (see `TaskSettings::max_batch_bytes`).
    batch_bytes: usize,
    /// Records at which a batch is full (`TaskSettings::batch_size`, less under a rate).
    batch_records: usize,
    /// Its topology's records-per-second limit.
    rate: Option<rate::Rate>,
    /// After a call ran into its deadline: no call before this (see [`DEADLINE_PENALTY`]).
    cooldown_until: Option<Instant>,
    /// A batch that ran into its deadline is processed one record per turn: the next one.
    retry: Option<usize>,
    /// Next offset to commit per source, once the batch that read it is produced.
    positions: Vec<Option<i64>>,
    committed: Vec<Option<i64>>,
    stream_time: i64,
    last_commit: Instant,
    /// When source offsets were last committed (idle partitions re-commit theirs).
    last_offsets_commit: Instant,
    /// When it last deleted what it committed of its repartition sources, and up to where.
    last_purge: Instant,
    purged: Vec<Option<i64>>,
    last_punctuate: Instant,
    last_punctuate_stream: i64,
    /// Whether a batch was processed since the guest's last punctuation: the guest may hold
    /// updates in a record cache (the SDK's aggregations do) that it sends on when
    /// punctuated, so the task punctuates before it commits.
    unflushed: bool,
    /// A faulted instance was replaced while it was unflushed: what its cache held is gone
    /// with it, so nothing from here may be committed (the task starts again).
    cache_lost: bool,
    /// Punctuate after every batch, so that a fault (which replaces the instance) never
    /// finds it unflushed: under `skip`/`dead-letter`, after a first fault, and for a task
    /// that lost a cache on this worker before (see `batch::lost_caches`).
    flush_each_batch: bool,
    /// Whether its guest may hold updates back until punctuated: a topology built with the
    /// SDK's stream DSL (it describes its operators), whose aggregations have record caches.
    /// Other guests are punctuated on time only, and a fault costs them nothing more.
    holds_back: bool,
    /// Batches its current guest instance has processed (see `batch::recycle_if_grown`).
    instance_batches: u32,
    /// Its instances reached three quarters of their memory limit in a few batches: they
    /// use their memory for real, and are not replaced for it.
    keeps_instance: bool,
    summary: TaskSummary,
    counters: Counters,
    /// Thread time its batches and punctuations have held (see [`Task::thread_time`]).
    thread_time: Duration,
    /// Whether its stream thread gives it a call now (see `threads::stream`'s fair share).
    fair_turn: bool,
    /// Its topics' formats: reading, writing, the schemas they wait for.
    formats: formats::TaskFormats,
    /// A record that did not go into the batch: it waits for its schema, or cannot be read
    /// (judged once the batch before it is processed). The batch takes nothing after it.
    pending: Option<formats::Pending>,
    /// The records of the batch as they came, where the batch holds them otherwise.
    originals: formats::Originals,
    /// What it last told the board it waits for.
    told_waiting: Option<String>,
}

/// This task's metric handles, looked up once.
struct Counters {
    records_in: prometheus_client::metrics::counter::Counter,
    enforced_processing: prometheus_client::metrics::counter::Counter,
    records_out: prometheus_client::metrics::counter::Counter,
    calls: prometheus_client::metrics::counter::Counter,
    call_seconds: prometheus_client::metrics::counter::Counter<f64>,
    /// `sluice_guest_faults_total` of this task, by fault kind.
    faults: prometheus_client::metrics::family::Family<
        crate::metrics::ErrorLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    topology: String,
}

impl Task {
    /// Where the task reads from: each source topic's partition and the offset to start at
    /// (none: nothing committed, from the beginning).
    pub fn sources(&self) -> Vec<(String, i32, Option<i64>)> {
        self.ctx
            .stage()
            .sources
            .iter()
            .zip(&self.committed)
            .map(|((_, t), c)| (t.clone(), self.ctx.partition, *c))
            .collect()
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// `flag` is raised when the task is asked to stop or abort (its stream thread then
    /// stops waiting for records and gives it its turn).
    pub fn wake_with(&self, flag: std::sync::Arc<std::sync::atomic::AtomicBool>) {
        self.ctx.control.wake_with(flag);
    }

    /// Whether the worker asked it to stop (cleanly, with its final commits): its stream
    /// thread hands it to a finisher thread, since its new owner waits for those commits.
    pub fn asked_to_stop(&self) -> bool {
        self.ctx.control.request() == Request::Stop
    }

    /// Returns the open databases of its stores to the worker's task runner, which passes
    /// them to the next user of the stores here or closes them (see `state::warm`), and
    /// takes them off interactive queries: ending the task then does not wait for the
    /// stores to close (tens of milliseconds each, with compactions running), and a task
    /// that comes back, or a standby of it, finds them open. Its committed state is all
    /// they hold.
    pub fn return_stores(&mut self) {
        let Some(state) = &self.state else { return };
        let warm = state.release(&self.ctx.state, &self.ctx.task, self.instance.take_stores());
        if !warm.is_empty() {
            // A runner that is gone (the worker exits) leaves them to close here.
            let _ = self.ctx.returns.send((self.ctx.task.clone(), warm));
        }
    }

    /// Where the worker drops what ended (a task, once it has returned its stores).
    pub fn drops(&self) -> Arc<crate::drops::Drops> {
        self.ctx.drops.clone()
    }

    /// Whether the batch has room for no more records (or a record that did not go in waits
    /// after it).
    pub fn is_full(&self) -> bool {
        self.retry.is_some()
            || self.pending.is_some()
            || self.batch.len() >= self.batch_records
            || self.writer.byte_len() >= self.batch_bytes
    }

    /// Whether the batch holds records not processed yet.
    pub fn has_records(&self) -> bool {
        !self.batch.is_empty()
    }

    /// The task cannot read its sources (the stream thread could not position them): it
    /// ends without committing, as failed for a transient reason.
    pub fn abandon(&mut self, detail: String) -> Result<TaskSummary, TaskError> {
        self.abort("it cannot read its sources");
        let result = Err(TaskError::Source {
            task: self.id.clone(),
            detail,
        });
        report_end(&self.ctx.metrics, &self.labels, &result);
        result
    }

    /// Whether the task may process now (asked to run, the lease holds, and it is within
    /// its records-per-second limit).
    pub fn may_process(&self) -> bool {
        self.waits_only_for_its_turn() && self.fair_turn
    }

    /// Whether nothing but its stream thread's fair share keeps it from processing: one held
    /// back by its rate limit, a cooldown or a lapsed lease does not count as waiting for a
    /// share, so it does not hold the thread's other tasks back either.
    pub fn waits_only_for_its_turn(&self) -> bool {
        self.ctx.control.request() == Request::Run
            && self.ctx.lease.valid()
            && self.within_rate()
            && self.cooled()
            && !self.waits_for_schemas()
    }

    /// Whether it waits for a schema from the registry: its sinks' ids, or a record's writer
    /// schema (its turns then ask again; its records wait meanwhile).
    fn waits_for_schemas(&self) -> bool {
        !self.formats.sinks_known() || matches!(&self.pending, Some(p) if matches!(p.why, formats::Why::Wait(_)))
    }

    /// Whether its sinks' schemas have their ids: asks (without waiting) when not; tells the
    /// board what it waits for. An error when the registry refuses one.
    fn sinks_ready(&mut self) -> Result<bool, TaskError> {
        match self.formats.sinks_ready() {
            Ok(()) => Ok(true),
            Err(formats::SinksNotReady::Wait(w)) => {
                self.tell_waiting(Some(formats::waiting_text(&w)));
                Ok(false)
            }
            Err(formats::SinksNotReady::Failed(reason)) => Err(TaskError::Input {
                task: self.id.clone(),
                at: "the schemas of its sinks".into(),
                reason,
                retry: true,
            }),
        }
    }

    /// Tells the board what the task waits for (none: nothing), when that changed.
    fn tell_waiting(&mut self, what: Option<String>) {
        if self.told_waiting != what {
            self.ctx.progress.waiting(&self.ctx.task, what.clone());
            self.told_waiting = what;
        }
    }

    /// The record that did not go into the batch, now that the batch before it is
    /// processed: one that waits for its schema is read again (into the batch, or it waits
    /// on); one that cannot be read goes to the error policy.
    fn take_pending(&mut self, env: &mut KafkaEnv) -> Result<(), TaskError> {
        while self.batch.is_empty() {
            let Some(pending) = self.pending.take() else { break };
            match pending.why {
                formats::Why::Wait(_) => {
                    self.push(pending.source, &pending.message);
                    if let Some(formats::Pending {
                        why: formats::Why::Wait(w),
                        ..
                    }) = &self.pending
                    {
                        let text = formats::waiting_text(w);
                        self.tell_waiting(Some(text));
                        break;
                    }
                    self.tell_waiting(None);
                }
                formats::Why::Bad(reason, retry) => {
                    self.tell_waiting(None);
                    self.reject_input(pending.source, &pending.message, reason, retry, env)?;
                }
            }
        }
        Ok(())
    }

    /// Thread time its batches and punctuations have been charged so far: the guest calls
    /// and the host's work on what they returned, each by [`thread_charge`] (what its stream
    /// thread shares out fairly).
    pub fn thread_time(&self) -> Duration {
        self.thread_time
    }

    /// Whether this task's stream thread gives it a call now: one that has used more than
    /// its share of the thread lets the others go first (records wait, partitions pause).
    pub fn set_fair_turn(&mut self, turn: bool) {
        self.fair_turn = turn;
    }

    fn within_rate(&self) -> bool {
        self.rate.as_ref().is_none_or(|r| r.ready(Instant::now()))
    }

    /// Whether the cooldown after a call that ran into its deadline is over.
    fn cooled(&self) -> bool {
        self.cooldown_until.is_none_or(|t| Instant::now() >= t)
    }

    /// A call ran into its deadline after `spent`: the task sits out [`DEADLINE_PENALTY`]
    /// times that, so its stream thread serves its other tasks meanwhile.
    fn cool_down(&mut self, spent: Duration) {
        self.cooldown_until = Some(Instant::now() + spent * DEADLINE_PENALTY);
    }

    /// Processes the batch at once (it is full); the task's end if that ended it.
    pub fn process_now(&mut self, env: &mut KafkaEnv) -> Option<Result<TaskSummary, TaskError>> {
        let result = self.process_batch(env).map(|()| None);
        self.ended(result)
    }

    /// One turn: honour a stop or abort request; else, if the lease holds, process the
    /// batch, punctuate and commit when due. Some: the task ended (how, already reported).
    pub fn step(&mut self, env: &mut KafkaEnv) -> Option<Result<TaskSummary, TaskError>> {
        self.output.renew_if_settled(&[&self.tracker, &self.changelog_tracker]);
        let result = self.turn(env);
        self.ended(result)
    }

    fn ended(&mut self, result: Result<Option<TaskSummary>, TaskError>) -> Option<Result<TaskSummary, TaskError>> {
        let result = match result {
            Ok(None) => return None,
            Ok(Some(summary)) => Ok(summary),
            Err(TaskError::GaveUp { .. }) => Ok(self.abort("it was asked to stop while it waited for Kafka")),
            Err(e) => Err(e),
        };
        report_end(&self.ctx.metrics, &self.labels, &result);
        Some(result)
    }

    fn turn(&mut self, env: &mut KafkaEnv) -> Result<Option<TaskSummary>, TaskError> {
        match self.ctx.control.request() {
            Request::Run => {}
            // Under exactly-once its stream thread closes it and commits (`close_for_stop`).
            Request::Stop if self.output.is_transactional() => return Ok(None),
            Request::Stop => return self.finish(env).map(Some),
            Request::Abort => return Ok(Some(self.abort("asked to abort"))),
        }
        if !self.ctx.lease.valid() {
            // Membership is uncertain: others may own this task by now. Do nothing until
            // the worker renews the lease or aborts the task.
            return Ok(None);
        }
        if self.formats.any && !self.sinks_ready()? {
            // Its records wait (its stream thread holds them) until its sinks' schemas
            // have their ids.
            return Ok(None);
        }
        if !self.batch.is_empty() && self.within_rate() && self.cooled() && self.fair_turn {
            self.process_batch(env)?;
        }
        if self.pending.is_some() && self.batch.is_empty() {
            self.take_pending(env)?;
        }
        self.maybe_punctuate()?;
        // Under exactly-once the stream thread commits all its tasks in one transaction.
        if !self.output.is_transactional() && self.last_commit.elapsed() >= self.ctx.settings.commit_interval {
            // Skipped: the lease ran out meanwhile; the task waits for it (above).
            self.commit(env)?;
        }
        Ok(None)
    }

    /// Asked to stop: records fed but not processed are left for the next owner; commit,
    /// then let the guest close and commit what closing emitted or wrote.
    fn finish(&mut self, env: &mut KafkaEnv) -> Result<TaskSummary, TaskError> {
        let began = Instant::now();
        self.clear_batch();
        self.pending = None;
        if self.commit(env)? != Commit::Done {
            return Ok(self.abort("it could not make its final commit (lease expired or fenced)"));
        }
        let first_commit = began.elapsed();
        let output = self.call("close", |i| i.close())?;
        self.produce(&output, now_ms(), "close")?;
        let closed = began.elapsed();
        if self.commit(env)? != Commit::Done {
            return Ok(self.abort("it could not make its final commit (lease expired or fenced)"));
        }
        tracing::debug!(
            target: "handover", task = %self.id, commit_ms = first_commit.as_millis() as u64,
            close_ms = (closed - first_commit).as_millis() as u64,
            last_commit_ms = (began.elapsed() - closed).as_millis() as u64, "final commits"
        );
        tracing::info!(task = %self.id, records_in = self.summary.records_in, records_out = self.summary.records_out, "stopped");
        Ok(self.summary)
    }

    fn clear_batch(&mut self) {
        self.writer.clear();
        self.batch.clear();
        self.originals.clear();
        self.retry = None;
    }

    /// Stops without committing: uncommitted state is dropped (under exactly-once, what it
    /// sent in its thread's open transaction is taken back by the thread aborting it).
    fn abort(&mut self, why: &str) -> TaskSummary {
        if let Some(state) = &self.state {
            state.discard(self.instance.stores_mut());
        }
        tracing::warn!(task = %self.id, records_in = self.summary.records_in, "stopped without committing: {why}");
        self.summary.ended = Ended::Aborted;
        self.summary
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_near_its_deadline_costs_its_share_what_one_into_the_deadline_costs() {
        let ms = Duration::from_millis;
        // Ordinary batches pay their time.
        assert_eq!(thread_charge(ms(3)), ms(3));
        assert_eq!(thread_charge(CALL_SLICE), CALL_SLICE);
        // 95 ms of a 100 ms deadline: 95 + 9 × 85.
        assert_eq!(thread_charge(ms(95)), ms(860));
        // A call that runs into a 100 ms deadline holds the thread 100 ms and then sits out
        // nine times that: a tenth of the thread. One just under it, charged as above, gets
        // about as much beside one neighbour task that always has work (that task uses what
        // it was charged, less a round, before the next call), and less beside more.
        let share = |neighbours: u32| {
            let wait = (thread_charge(ms(95)) - ms(50)) * neighbours;
            ms(95).as_secs_f64() / (ms(95) + wait).as_secs_f64()
        };
        assert!((share(1) - 0.1).abs() < 0.02, "{}", share(1));
        assert!(share(2) < 0.06, "{}", share(2));
    }
}
