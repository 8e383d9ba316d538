//! One task — a topology on one input partition — as a state machine that a stream thread
//! drives (see `stream`): it is fed records, calls the guest on a batch, produces what it
//! emits, and commits (see `task_state` for the commit protocol and `output` for the
//! producer layout under each guarantee).
//!
//! A task processes and commits only while the worker's membership lease is valid (see
//! `control`); asked to abort, it stops without committing anything more.

mod output;
mod rate;
mod source;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, ConsumerGroupMetadata};
use rdkafka::message::{Headers as _, Message};
use rdkafka::{Offset, TopicPartitionList};
use sluice_wire::wire::{self, Header, Writer, INHERIT_TIMESTAMP};
use sluice_wire::TaskInfo;

use super::control::{Lease, Request, TaskControl};
use super::delivery::{DeliveryTracker, Outgoing, WorkerProducer};
use super::task_state::{Opened, StateEnv, TaskState};
use super::DeployedTopology;
use crate::group::offsets::{GroupOffsets, Position};
use crate::manifest::OnError;
use crate::metrics::{ErrorLabels, Metrics, RejectLabels, TaskLabels};
use crate::runtime::{CallOutput, GuestFault, TaskInstance};
pub use output::{Guarantee, TaskOutput, TransactionError};

/// How long a commit waits for the task's produced records to be acknowledged.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(120);

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
    pub commit_interval: Duration,
    pub punctuate_interval: Duration,
    pub guarantee: Guarantee,
    /// A task whose position did not move re-commits it this often, so the broker never
    /// expires the offsets of an idle partition.
    pub idle_commit_interval: Duration,
}

impl Default for TaskSettings {
    fn default() -> Self {
        TaskSettings {
            batch_size: 500,
            threads: 2,
            max_batch_bytes: 16 << 20,
            prefetch_bytes: 64 << 20,
            commit_interval: Duration::from_secs(1),
            punctuate_interval: Duration::from_secs(1),
            guarantee: Guarantee::AtLeastOnce,
            idle_commit_interval: Duration::from_secs(1),
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
        }
    }
}

/// Everything a task needs to start and run.
pub struct TaskContext {
    pub topology: Arc<DeployedTopology>,
    pub partition: i32,
    /// The worker's shared producer (used under at-least-once).
    pub producer: Arc<WorkerProducer>,
    pub settings: TaskSettings,
    pub control: Arc<TaskControl>,
    pub lease: Arc<Lease>,
    pub metrics: Metrics,
    pub bootstrap: String,
    /// Where stateful topologies keep their stores.
    pub state: Arc<StateEnv>,
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

pub struct Task {
    ctx: TaskContext,
    /// The topology group's metadata for offsets committed in a transaction (exactly-once).
    group_metadata: Option<ConsumerGroupMetadata>,
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
    last_punctuate: Instant,
    last_punctuate_stream: i64,
    summary: TaskSummary,
    counters: Counters,
}

/// How a commit went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Commit {
    Done,
    /// The lease was not valid: nothing was committed.
    Skipped,
    /// Another producer took the task's transactional id: nothing was committed, ever will be.
    Fenced,
}

/// This task's metric handles, looked up once.
struct Counters {
    records_in: prometheus_client::metrics::counter::Counter,
    records_out: prometheus_client::metrics::counter::Counter,
    calls: prometheus_client::metrics::counter::Counter,
    call_seconds: prometheus_client::metrics::counter::Counter<f64>,
}

/// A thread's means of talking to Kafka outside its consumer: source offsets of any
/// topology group, over a runtime of the thread's own (no threads of its own).
pub struct KafkaEnv {
    offsets: GroupOffsets,
    runtime: tokio::runtime::Runtime,
}

impl KafkaEnv {
    pub fn new(bootstrap: &str) -> std::io::Result<KafkaEnv> {
        Ok(KafkaEnv {
            offsets: GroupOffsets::new(bootstrap),
            runtime: tokio::runtime::Builder::new_current_thread().enable_all().build()?,
        })
    }

    pub fn fetch_offsets(&mut self, group: &str, wanted: &[(String, i32)]) -> Result<Vec<Option<i64>>, String> {
        self.runtime.block_on(self.offsets.fetch(group, wanted))
    }

    pub fn commit_offsets(&mut self, group: &str, positions: &[Position]) -> Result<(), String> {
        self.runtime.block_on(self.offsets.commit(group, positions))
    }
}

/// What starting a task came to.
pub enum Prepared {
    /// Ready to be fed records from the returned positions on.
    Ready(Box<Task>),
    /// Asked to stop, or failed, before it could start: how it ended (already reported).
    Ended(Result<TaskSummary, TaskError>),
}

/// Starts a task: its producer, restored state, guest instance and source positions.
pub fn prepare(ctx: TaskContext, env: &mut KafkaEnv) -> Prepared {
    let id = format!("{}/{}", ctx.topology.name, ctx.partition);
    let labels = TaskLabels {
        topology: ctx.topology.name.clone(),
        task: id.clone(),
    };
    ctx.metrics.task_failed.get_or_create(&labels).set(0);
    // The first thing a task does; tests check ownership intervals from here to "ended".
    tracing::info!(task = %id, "starting");
    ctx.metrics.tasks_running.inc();
    let metrics = ctx.metrics.clone();
    let task_id = crate::group::TaskId::new(&ctx.topology.name, ctx.partition as u32);
    match Task::start(ctx, id.clone(), labels.clone(), env) {
        Ok(Some(task)) => {
            metrics.board.processing(&task_id);
            Prepared::Ready(Box::new(task))
        }
        Ok(None) => {
            tracing::info!(task = %id, "stopped before it started processing");
            let result = Ok(TaskSummary {
                ended: Ended::BeforeStart,
                ..Default::default()
            });
            report_end(&metrics, &labels, &result);
            Prepared::Ended(result)
        }
        Err(e) => {
            let result = Err(e);
            report_end(&metrics, &labels, &result);
            Prepared::Ended(result)
        }
    }
}

/// Logs how a task ended and updates its metrics. After this, nothing touches its state.
fn report_end(metrics: &Metrics, labels: &TaskLabels, result: &Result<TaskSummary, TaskError>) {
    let id = &labels.task;
    metrics.tasks_running.dec();
    let outcome = match result {
        Ok(summary) => format!("{:?}", summary.ended),
        Err(e) => format!("failed ({})", e.kind()),
    };
    // The last thing a task does: from "starting" to here it may touch the task's state.
    tracing::info!(task = %id, outcome = %outcome, "ended");
    if let Err(e) = result {
        tracing::error!(task = %id, "{e}");
        metrics.task_failed.get_or_create(labels).set(1);
        metrics
            .task_errors
            .get_or_create(&ErrorLabels {
                topology: labels.topology.clone(),
                task: id.clone(),
                kind: e.kind().into(),
            })
            .inc();
    }
}

impl Task {
    /// Prepares a task: its producer (under exactly-once, fencing the previous owner first),
    /// its restored state, its guest instance and its consumer. None: asked to stop first.
    fn start(ctx: TaskContext, id: String, labels: TaskLabels, env: &mut KafkaEnv) -> Result<Option<Task>, TaskError> {
        let topology = &ctx.topology;
        let control = ctx.control.clone();
        let stopping = move || control.stopping();
        let info = TaskInfo {
            topology: topology.name.clone(),
            task_id: id.clone(),
            partition: ctx.partition,
            source_topics: topology.binding.source_topics.clone(),
            sink_topics: topology.binding.sink_topics.clone(),
        };
        // The new owner's producer goes first: it aborts what a previous owner left open, so
        // the changelogs read below hold only committed data.
        let output = match ctx.settings.guarantee {
            Guarantee::AtLeastOnce => TaskOutput::shared(ctx.producer.clone()),
            Guarantee::ExactlyOnce => {
                let transactional_id = format!("sluice-{}-{}", topology.name, ctx.partition);
                match TaskOutput::transactional(&ctx.bootstrap, &transactional_id, &stopping) {
                    Ok(Some(output)) => output,
                    Ok(None) => return Ok(None),
                    Err(detail) => return Err(TaskError::Transaction { task: id, detail }),
                }
            }
        };
        let (state, stores) = if topology.changelogs.is_empty() {
            (None, Vec::new())
        } else {
            let opened = TaskState::open(
                &ctx.state,
                &ctx.bootstrap,
                &topology.name,
                &id,
                ctx.partition,
                topology.changelogs.clone(),
                &ctx.metrics,
                &stopping,
            )
            .map_err(|detail| TaskError::State {
                task: id.clone(),
                detail,
            })?;
            match opened {
                Opened::Ready(state, stores) => (Some(state), stores),
                Opened::Stopped => return Ok(None),
            }
        };
        let at = "start-up (instantiate and init)".to_string();
        let fail = |fault| TaskError::Guest {
            task: id.clone(),
            at: at.clone(),
            fault,
        };
        let mut instance = topology
            .loaded
            .instantiate(&id, topology.loaded.description().sinks.clone(), stores)
            .map_err(fail)?;
        instance.init(&info).map_err(fail)?;
        let sources = &topology.binding.source_topics;
        let Some(committed) = source::committed(env, &topology.group, sources, ctx.partition, &id, &stopping) else {
            return Ok(None);
        };
        // After a deploy that asked to reprocess, the group starts empty: from there.
        let committed = match topology.start_from {
            Some(from) if committed.iter().any(Option::is_none) => {
                source::start_from(&ctx.bootstrap, sources, ctx.partition, committed, from).map_err(|detail| {
                    TaskError::Source {
                        task: id.clone(),
                        detail,
                    }
                })?
            }
            _ => committed,
        };
        // Offsets committed in a transaction name the topology's group.
        let group_metadata = if output.is_transactional() {
            let consumer = super::source_consumer(&ctx.bootstrap, &topology.group, 1 << 20).map_err(|e| {
                TaskError::Transaction {
                    task: id.clone(),
                    detail: format!("creating a consumer for the group metadata: {e}"),
                }
            })?;
            Some(consumer.group_metadata().ok_or_else(|| TaskError::Transaction {
                task: id.clone(),
                detail: "the consumer has no group metadata".into(),
            })?)
        } else {
            None
        };
        let counters = Counters {
            records_in: ctx.metrics.records_in.get_or_create(&labels).clone(),
            records_out: ctx.metrics.records_out.get_or_create(&labels).clone(),
            calls: ctx.metrics.guest_calls.get_or_create(&labels).clone(),
            call_seconds: ctx.metrics.guest_call_seconds.get_or_create(&labels).clone(),
        };
        tracing::info!(committed = ?committed, guarantee = ?ctx.settings.guarantee, task = %id, "started");
        let rate = topology.records_per_second.map(|r| rate::Rate::new(r, Instant::now()));
        Ok(Some(Task {
            group_metadata,
            group: topology.group.clone(),
            labels,
            id,
            info,
            instance,
            tracker: Arc::new(DeliveryTracker::default()),
            changelog_tracker: Arc::new(DeliveryTracker::with_offsets()),
            output,
            state,
            writer: Writer::new(),
            batch: Vec::with_capacity(ctx.settings.batch_size),
            batch_bytes: ctx
                .settings
                .max_batch_bytes
                .min(topology.loaded.limits().memory_limit / 4)
                .max(1),
            batch_records: ctx
                .settings
                .batch_size
                .min(rate.as_ref().map_or(usize::MAX, rate::Rate::batch)),
            rate,
            cooldown_until: None,
            retry: None,
            positions: committed.clone(),
            committed,
            stream_time: i64::MIN,
            last_commit: Instant::now(),
            last_offsets_commit: Instant::now(),
            last_punctuate: Instant::now(),
            last_punctuate_stream: i64::MIN,
            summary: TaskSummary::default(),
            counters,
            ctx,
        }))
    }

    /// Where the task reads from: each source topic's partition and the offset to start at
    /// (none: nothing committed, from the beginning).
    pub fn sources(&self) -> Vec<(String, i32, Option<i64>)> {
        let topics = &self.ctx.topology.binding.source_topics;
        topics
            .iter()
            .zip(&self.committed)
            .map(|(t, c)| (t.clone(), self.ctx.partition, *c))
            .collect()
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether the batch has room for no more records.
    pub fn is_full(&self) -> bool {
        self.retry.is_some() || self.batch.len() >= self.batch_records || self.writer.byte_len() >= self.batch_bytes
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
        self.ctx.control.request() == Request::Run && self.ctx.lease.valid() && self.within_rate() && self.cooled()
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
            Request::Stop => return self.finish(env).map(Some),
            Request::Abort => return Ok(Some(self.abort("asked to abort"))),
        }
        if !self.ctx.lease.valid() {
            // Membership is uncertain: others may own this task by now. Do nothing until
            // the worker renews the lease or aborts the task.
            return Ok(None);
        }
        if !self.batch.is_empty() && self.within_rate() && self.cooled() {
            self.process_batch(env)?;
        }
        self.maybe_punctuate()?;
        if self.last_commit.elapsed() >= self.ctx.settings.commit_interval {
            match self.commit(env)? {
                // Skipped: the lease ran out meanwhile; the task waits for it (above).
                Commit::Done | Commit::Skipped => {}
                Commit::Fenced => return Ok(Some(self.abort("another owner fenced it"))),
            }
        }
        Ok(None)
    }

    /// Asked to stop: records fed but not processed are left for the next owner; commit,
    /// then let the guest close and commit what closing emitted or wrote.
    fn finish(&mut self, env: &mut KafkaEnv) -> Result<TaskSummary, TaskError> {
        self.clear_batch();
        if self.commit(env)? != Commit::Done {
            return Ok(self.abort("it could not make its final commit (lease expired or fenced)"));
        }
        let output = self.call("close", |i| i.close())?;
        self.produce(&output, now_ms(), "close")?;
        if self.commit(env)? != Commit::Done {
            return Ok(self.abort("it could not make its final commit (lease expired or fenced)"));
        }
        tracing::info!(task = %self.id, records_in = self.summary.records_in, records_out = self.summary.records_out, "stopped");
        Ok(self.summary)
    }

    fn clear_batch(&mut self) {
        self.writer.clear();
        self.batch.clear();
        self.retry = None;
    }

    /// Stops without committing: uncommitted state is dropped, an open transaction aborted.
    fn abort(&mut self, why: &str) -> TaskSummary {
        self.output.abort();
        if let Some(state) = &self.state {
            state.discard(self.instance.stores_mut());
        }
        tracing::warn!(task = %self.id, records_in = self.summary.records_in, "stopped without committing: {why}");
        self.summary.ended = Ended::Aborted;
        self.summary
    }

    /// Adds a record of source `source` to the batch (check [`is_full`](Self::is_full) first).
    pub fn push<M: Message>(&mut self, source: u32, m: &M) {
        let timestamp = m.timestamp().to_millis().unwrap_or(-1);
        let headers: Vec<Header<'_>> = match m.headers() {
            Some(h) => h
                .iter()
                .map(|h| Header {
                    name: h.key.as_bytes(),
                    value: h.value,
                })
                .collect(),
            None => Vec::new(),
        };
        self.writer.push_input(
            m.key(),
            m.payload(),
            timestamp,
            source,
            m.partition(),
            m.offset(),
            headers.into_iter(),
        );
        self.batch.push((source, m.offset()));
        self.stream_time = self.stream_time.max(timestamp);
    }

    fn process_batch(&mut self, env: &mut KafkaEnv) -> Result<(), TaskError> {
        if self.retry.is_some() {
            return self.retry_step(env);
        }
        if let Some(rate) = &mut self.rate {
            rate.take(self.batch.len(), Instant::now());
        }
        let result = self.process_batch_inner(env);
        if result.is_err() || self.retry.is_none() {
            self.clear_batch();
        }
        result
    }

    /// The next record of a batch that ran into its deadline, alone in a fresh instance; if
    /// it runs into its deadline too, the policy judges it and the task cools down again.
    fn retry_step(&mut self, env: &mut KafkaEnv) -> Result<(), TaskError> {
        let Some(i) = self.retry else {
            return Ok(());
        };
        let whole = self.writer.as_bytes().to_vec();
        let batch = self.batch.clone();
        let started = Instant::now();
        let outcome = match self.process_part(&whole, i..i + 1) {
            Ok(Some(fault)) => {
                if matches!(fault, GuestFault::Deadline { .. }) {
                    self.cool_down(started.elapsed());
                }
                self.reject(&whole, &batch, i..i + 1, fault, env)
            }
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        if outcome.is_err() || i + 1 >= batch.len() {
            self.clear_batch();
        } else {
            self.retry = Some(i + 1);
        }
        outcome
    }

    fn process_batch_inner(&mut self, env: &mut KafkaEnv) -> Result<(), TaskError> {
        let started = Instant::now();
        // A record skipped or dead-lettered left its faulted instance behind: go on in a
        // fresh one (or, when none can start, let the policy judge the batch by that).
        let result = match self.renew_instance()? {
            Some(fault) => Err(fault),
            None => self.instance.process(self.writer.as_bytes()),
        };
        self.counters.calls.inc();
        self.counters.call_seconds.inc_by(started.elapsed().as_secs_f64());
        let fault = match result {
            Ok(output) => match self.produce(&output, self.stream_time, "a batch") {
                Ok(()) => {
                    self.done(0..self.batch.len());
                    return Ok(());
                }
                Err(TaskError::Guest { fault, .. }) => fault,
                Err(other) => return Err(other),
            },
            Err(fault) => fault,
        };
        if matches!(fault, GuestFault::Deadline { .. }) {
            // Each further try may run into the deadline again: rather than halving the
            // batch at once (up to 2n - 1 calls at the deadline, holding the stream thread
            // throughout), try its records one per turn, each after a cooldown.
            self.cool_down(started.elapsed());
            if self.batch.len() > 1 {
                tracing::info!(task = %self.id, records = self.batch.len(), "{fault}; processing the batch one record per turn to find the record");
                self.retry = Some(0);
                return Ok(());
            }
        }
        // Some record of the batch cannot be processed, or the batch as a whole is too much
        // for the guest: find out which by processing parts of it in fresh instances.
        let whole = self.writer.as_bytes().to_vec();
        let batch = self.batch.clone();
        self.isolate(&whole, &batch, 0..batch.len(), fault, env)
    }

    /// Marks records `range` of the batch processed: their offsets may be committed.
    fn done(&mut self, range: std::ops::Range<usize>) {
        let n = range.len() as u64;
        self.summary.records_in += n;
        self.counters.records_in.inc_by(n);
        for i in range {
            let (source, offset) = self.batch[i];
            self.positions[source as usize] = Some(offset + 1);
        }
    }

    /// Records `range` of `whole` failed together with `fault`. With one record, the
    /// topology's error policy decides; with more, the part before a record the guest named
    /// (or the first half) is processed again in a fresh instance, then the rest, so the
    /// failing record is isolated and every other record is processed once.
    fn isolate(
        &mut self,
        whole: &[u8],
        batch: &[(u32, i64)],
        range: std::ops::Range<usize>,
        fault: GuestFault,
        env: &mut KafkaEnv,
    ) -> Result<(), TaskError> {
        if range.len() == 1 || matches!(fault, GuestFault::Instantiate { .. }) {
            return self.reject(whole, batch, range, fault, env);
        }
        tracing::info!(task = %self.id, records = range.len(), "{fault}; processing the batch in parts to find the record");
        let parts = match fault.record_index().map(|i| range.start + i as usize) {
            // The guest named the record: what comes before it, it alone, what follows.
            Some(at) if at < range.end => vec![
                (range.start..at, None),
                (at..at + 1, Some(fault)),
                (at + 1..range.end, None),
            ],
            _ => {
                let mid = range.start + range.len() / 2;
                vec![(range.start..mid, None), (mid..range.end, None)]
            }
        };
        for (part, known) in parts {
            if part.is_empty() {
                continue;
            }
            let fault = match known {
                Some(fault) => fault,
                None => match self.process_part(whole, part.clone())? {
                    None => continue,
                    Some(fault) => fault,
                },
            };
            self.isolate(whole, batch, part, fault, env)?;
        }
        Ok(())
    }

    /// Processes records `part` of `whole` in a fresh instance (the last one faulted) and
    /// produces their output; the fault if they fail.
    fn process_part(&mut self, whole: &[u8], part: std::ops::Range<usize>) -> Result<Option<GuestFault>, TaskError> {
        if let Some(fault) = self.renew_instance()? {
            return Ok(Some(fault));
        }
        let mut writer = Writer::new();
        let inputs = wire::inputs(whole).expect("the host's own batch encoding");
        for input in inputs.skip(part.start).take(part.len()) {
            let input = input.expect("the host's own batch encoding");
            writer.push_input(
                input.key,
                input.value,
                input.timestamp,
                input.source,
                input.partition,
                input.offset,
                input.headers.iter().collect::<Vec<_>>().into_iter(),
            );
        }
        let output = match self.call("a part of a batch", |i| i.process(writer.as_bytes())) {
            Ok(output) => output,
            Err(TaskError::Guest { fault, .. }) => return Ok(Some(fault)),
            Err(other) => return Err(other),
        };
        match self.produce(&output, self.stream_time, "a part of a batch") {
            Ok(()) => {
                self.done(part);
                Ok(None)
            }
            Err(TaskError::Guest { fault, .. }) => Ok(Some(fault)),
            Err(other) => Err(other),
        }
    }

    /// A fresh instance over the same stores when the current one faulted. Its own fault
    /// (it cannot start) is returned.
    fn renew_instance(&mut self) -> Result<Option<GuestFault>, TaskError> {
        if !self.instance.is_faulted() {
            return Ok(None);
        }
        let topology = &self.ctx.topology;
        let stores = self.instance.take_stores();
        let fresh = topology
            .loaded
            .instantiate(&self.id, topology.loaded.description().sinks.clone(), stores)
            .and_then(|mut instance| instance.init(&self.info).map(|()| instance));
        match fresh {
            Ok(instance) => {
                self.instance = instance;
                Ok(None)
            }
            Err(fault) => Ok(Some(fault)),
        }
    }

    /// One record (or, when no instance could start, the rest of the batch) failed with
    /// `fault`: the topology's error policy decides.
    fn reject(
        &mut self,
        whole: &[u8],
        batch: &[(u32, i64)],
        range: std::ops::Range<usize>,
        fault: GuestFault,
        env: &mut KafkaEnv,
    ) -> Result<(), TaskError> {
        let topics = &self.ctx.topology.binding.source_topics;
        let partition = self.ctx.partition;
        let at = if range.len() == 1 {
            let (source, offset) = batch[range.start];
            format!(
                "offset {offset} of topic {} partition {partition}",
                topics[source as usize]
            )
        } else {
            format!(
                "the records at offsets {}..={} of partition {partition}",
                batch[range.start].1,
                batch[range.end - 1].1
            )
        };
        let policy = self.ctx.topology.on_error;
        if policy == OnError::Fail || range.len() != 1 {
            // Commit what was processed before it; nothing after.
            match self.commit(env) {
                Ok(Commit::Done) => {}
                Ok(_) => {
                    tracing::warn!(task = %self.id, "not committing the records before the failure: no lease, or fenced")
                }
                Err(e) => tracing::warn!(task = %self.id, "committing the records before the failure: {e}"),
            }
            return Err(TaskError::Guest {
                task: self.id.clone(),
                at,
                fault,
            });
        }
        let input = wire::inputs(whole)
            .expect("the host's own batch encoding")
            .nth(range.start)
            .expect("the record is in the batch")
            .expect("the host's own batch encoding");
        let action = match policy {
            OnError::Skip => {
                tracing::warn!(task = %self.id, "skipping the record at {at} (on-error = \"skip\"): {fault}");
                "skip"
            }
            _ => {
                let topic = self
                    .ctx
                    .topology
                    .binding
                    .dead_letter_topic
                    .clone()
                    .expect("a dead-letter topic under on-error = \"dead-letter\"");
                let error = fault.to_string();
                let (source, offset) = batch[range.start];
                let source_topic = topics[source as usize].clone();
                let (partition_text, offset_text, time_text) =
                    (partition.to_string(), offset.to_string(), input.timestamp.to_string());
                let mut headers = Writer::new();
                let ours = [
                    ("sluice.error", error.as_bytes()),
                    ("sluice.error.kind", fault.kind().as_bytes()),
                    ("sluice.task", self.id.as_bytes()),
                    ("sluice.source.topic", source_topic.as_bytes()),
                    ("sluice.source.partition", partition_text.as_bytes()),
                    ("sluice.source.offset", offset_text.as_bytes()),
                    ("sluice.source.timestamp", time_text.as_bytes()),
                ];
                let all: Vec<Header<'_>> = input
                    .headers
                    .iter()
                    .chain(ours.iter().map(|(name, value)| Header {
                        name: name.as_bytes(),
                        value: Some(value),
                    }))
                    .collect();
                headers.push_emitted(0, input.key, input.value, input.timestamp, all.into_iter());
                let record = wire::emitted(headers.as_bytes())
                    .expect("our own encoding")
                    .next()
                    .expect("one record")
                    .expect("our own encoding");
                let out = Outgoing {
                    topic: &topic,
                    partition: None,
                    key: record.key,
                    value: record.value,
                    timestamp: input.timestamp.max(-1),
                    headers: record.headers,
                };
                enqueue(&mut self.output, &self.tracker, &self.ctx, &self.id, out).map_err(|e| match e {
                    TaskError::Produce { task, detail } => TaskError::Produce {
                        task,
                        detail: format!("sending a record to the dead-letter topic {topic:?}: {detail}"),
                    },
                    other => other,
                })?;
                tracing::warn!(task = %self.id, "sent the record at {at} to {topic:?} (on-error = \"dead-letter\"): {fault}");
                "dead-letter"
            }
        };
        self.ctx
            .metrics
            .records_rejected
            .get_or_create(&RejectLabels {
                topology: self.ctx.topology.name.clone(),
                task: self.id.clone(),
                action: action.into(),
                kind: fault.kind().into(),
            })
            .inc();
        self.done(range);
        Ok(())
    }

    /// Produces what a call (`at` says which) emitted, then keeps the call's state writes;
    /// output that breaks the contract drops them. Records without a timestamp of their own
    /// get `default_ts`.
    fn produce(&mut self, output: &CallOutput, default_ts: i64, at: &str) -> Result<(), TaskError> {
        let sink_topics = &self.ctx.topology.binding.sink_topics;
        let records = match output.records(sink_topics.len()) {
            Ok(records) => records,
            Err(fault) => {
                self.instance.end_call(false);
                return Err(TaskError::Guest {
                    task: self.id.clone(),
                    at: at.to_string(),
                    fault,
                });
            }
        };
        for r in &records {
            let timestamp = if r.timestamp == INHERIT_TIMESTAMP {
                default_ts
            } else {
                r.timestamp
            };
            let out = Outgoing {
                topic: &sink_topics[r.sink as usize],
                partition: None,
                key: r.key,
                value: r.value,
                timestamp: timestamp.max(-1),
                headers: r.headers,
            };
            enqueue(&mut self.output, &self.tracker, &self.ctx, &self.id, out)?;
        }
        self.instance.end_call(true);
        let n = records.len() as u64;
        self.summary.records_out += n;
        self.counters.records_out.inc_by(n);
        Ok(())
    }

    fn maybe_punctuate(&mut self) -> Result<(), TaskError> {
        // Stream time starts with the first record this task sees; until then there is no
        // time to punctuate by (a restarted task on an idle partition would otherwise close
        // every open window at the start of time).
        if self.stream_time == i64::MIN {
            return Ok(());
        }
        let interval = self.ctx.settings.punctuate_interval;
        let stream_due = self.stream_time.saturating_sub(self.last_punctuate_stream) >= interval.as_millis() as i64;
        if !(stream_due || self.last_punctuate.elapsed() >= interval) {
            return Ok(());
        }
        self.last_punctuate = Instant::now();
        self.last_punctuate_stream = self.stream_time;
        let (stream_time, wall) = (self.stream_time, now_ms());
        let at = format!("punctuation (stream time {stream_time})");
        let output = self.call(&at, |i| i.punctuate(stream_time, wall))?;
        self.produce(&output, stream_time, &at)
    }

    fn call(
        &mut self,
        at: &str,
        f: impl FnOnce(&mut TaskInstance) -> Result<CallOutput, GuestFault>,
    ) -> Result<CallOutput, TaskError> {
        // As in `process_batch_inner`: never call an instance that faulted.
        if let Some(fault) = self.renew_instance()? {
            return Err(TaskError::Guest {
                task: self.id.clone(),
                at: at.to_string(),
                fault,
            });
        }
        let started = Instant::now();
        let result = f(&mut self.instance);
        self.counters.calls.inc();
        self.counters.call_seconds.inc_by(started.elapsed().as_secs_f64());
        result.map_err(|fault| TaskError::Guest {
            task: self.id.clone(),
            at: at.to_string(),
            fault,
        })
    }

    /// The commit protocol (see `task_state` for where a crash can fall). Commits nothing
    /// when the lease is not valid (skipped: the task waits for it) or another producer
    /// fenced the task (exactly-once: it is not ours any more).
    fn commit(&mut self, env: &mut KafkaEnv) -> Result<Commit, TaskError> {
        self.last_commit = Instant::now();
        if !self.ctx.lease.valid() {
            return Ok(Commit::Skipped);
        }
        // 0. Within its state quota, or nothing of this commit happens.
        if self.state.is_some() {
            self.check_state_quota()?;
        }
        // 1. The stores' writes since the last commit go to their changelogs.
        let logged = self.log_state()?;
        let idle_due = self.last_offsets_commit.elapsed() >= self.ctx.settings.idle_commit_interval;
        if self.positions == self.committed && !logged && !self.output.in_transaction() && !idle_due {
            return Ok(Commit::Done);
        }
        // 2. Everything produced is acknowledged; source offsets are committed.
        if self.output.is_transactional() {
            let offsets = self.offsets();
            let group = self
                .group_metadata
                .as_ref()
                .expect("a transactional task has its group's metadata");
            match self.output.commit(&offsets, group) {
                Ok(()) => {}
                Err(TransactionError::Fenced(detail)) => {
                    tracing::warn!(task = %self.id, "fenced by a newer owner of the task: {detail}");
                    return Ok(Commit::Fenced);
                }
                Err(TransactionError::Aborted(detail)) => {
                    return Err(TaskError::Transaction {
                        task: self.id.clone(),
                        detail,
                    })
                }
            }
        } else {
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
        // 3. The writes and their markers go to RocksDB.
        self.commit_state()?;
        Ok(Commit::Done)
    }

    /// The positions to commit (sources that have one).
    fn offsets(&self) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for (source, position) in self.positions.iter().enumerate() {
            if let Some(offset) = position {
                let topic = &self.ctx.topology.binding.source_topics[source];
                tpl.add_partition_offset(topic, self.ctx.partition, Offset::Offset(*offset))
                    .expect("a valid offset");
            }
        }
        tpl
    }

    /// The positions to commit, for the offsets client (sources that have one).
    fn commit_positions(&self) -> Vec<Position> {
        let topics = &self.ctx.topology.binding.source_topics;
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

    fn commit_state(&mut self) -> Result<(), TaskError> {
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
    fn check_state_quota(&mut self) -> Result<(), TaskError> {
        let mut mine = 0u64;
        for named in self.instance.stores_mut() {
            if let Some(store) = named.store.as_any().downcast_mut::<crate::state::rocks::RocksStore>() {
                mine += store.disk_bytes() + named.store.held_bytes() as u64;
            }
        }
        let topology = &self.ctx.topology;
        let total: u64 = {
            let mut usage = topology.state_usage.lock().unwrap();
            usage.insert(self.ctx.partition, mine);
            usage.values().sum()
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
    fn log_state(&mut self) -> Result<bool, TaskError> {
        let Some(state) = &self.state else { return Ok(false) };
        let mut written = false;
        let partition = self.ctx.partition;
        for named in self.instance.stores_mut() {
            let Some(store) = named.store.as_any().downcast_mut::<crate::state::rocks::RocksStore>() else {
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
fn enqueue(
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

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
