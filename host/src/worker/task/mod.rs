//! One task — a topology on one input partition — on its own thread: poll a batch, call the
//! guest, produce what it emits, and commit (see `task_state` for the commit protocol and
//! `output` for the producer layout under each guarantee).
//!
//! A task processes and commits only while the worker's membership lease is valid (see
//! `control`); asked to abort, it stops without committing anything more.

mod output;
mod source;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{BorrowedMessage, Headers as _, Message};
use rdkafka::{Offset, TopicPartitionList};
use sluice_guest::wire::{self, Header, Writer, INHERIT_TIMESTAMP};
use sluice_guest::TaskInfo;

use super::control::{Lease, Request, TaskControl};
use super::delivery::{DeliveryTracker, Outgoing, WorkerProducer};
use super::task_state::{Opened, StateEnv, TaskState};
use super::{ConsumerEvents, DeployedTopology};
use crate::metrics::{ErrorLabels, Metrics, TaskLabels};
use crate::runtime::{CallOutput, GuestFault, TaskInstance};
pub use output::{Guarantee, TaskOutput, TransactionError};

/// How long a commit waits for the task's produced records to be acknowledged.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(120);

/// Knobs shared by every task of a worker.
#[derive(Debug, Clone)]
pub struct TaskSettings {
    pub batch_size: usize,
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
}

impl TaskError {
    pub fn kind(&self) -> &'static str {
        match self {
            TaskError::Guest { fault, .. } => fault.kind(),
            TaskError::Produce { .. } => "produce",
            TaskError::State { .. } => "state",
            TaskError::Transaction { .. } => "transaction",
        }
    }
}

/// Everything a task thread needs.
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

struct Task {
    ctx: TaskContext,
    /// Reads the task's partition of every source; `None` only while a batch is polled.
    consumer: Option<BaseConsumer<ConsumerEvents>>,
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

/// Runs a task until `stop` is set (returns its summary) or it fails (returns why; nothing
/// past the last good record is committed, and its consumer closes with it).
pub fn run(ctx: TaskContext) -> Result<TaskSummary, TaskError> {
    let id = format!("{}/{}", ctx.topology.name, ctx.partition);
    let labels = TaskLabels {
        topology: ctx.topology.name.clone(),
        task: id.clone(),
    };
    ctx.metrics.task_failed.get_or_create(&labels).set(0);
    let metrics = ctx.metrics.clone();
    // The first thing a task does; tests check ownership intervals from here to "stopped".
    tracing::info!(task = %id, "starting");

    metrics.tasks_running.inc();
    let result = Task::start(ctx, id.clone(), &labels).and_then(|task| match task {
        Some(task) => task.run_until_stopped(),
        None => {
            tracing::info!(task = %id, "stopped before it started processing");
            Ok(TaskSummary {
                ended: Ended::BeforeStart,
                ..Default::default()
            })
        }
    });
    metrics.tasks_running.dec();
    let outcome = match &result {
        Ok(summary) => format!("{:?}", summary.ended),
        Err(e) => format!("failed ({})", e.kind()),
    };
    // The last thing a task does: from "starting" to here it may touch the task's state.
    tracing::info!(task = %id, outcome = %outcome, "ended");

    if let Err(e) = &result {
        tracing::error!(task = %id, "{e}");
        metrics.task_failed.get_or_create(&labels).set(1);
        metrics
            .task_errors
            .get_or_create(&ErrorLabels {
                topology: labels.topology.clone(),
                task: id,
                kind: e.kind().into(),
            })
            .inc();
        // The task's consumer closed with it: its partitions are no longer fetched.
    }
    result
}

impl Task {
    /// Prepares a task: its producer (under exactly-once, fencing the previous owner first),
    /// its restored state, its guest instance and its consumer. None: asked to stop first.
    fn start(ctx: TaskContext, id: String, labels: &TaskLabels) -> Result<Option<Task>, TaskError> {
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
        let Some(source) = source::open(
            &ctx.bootstrap,
            &topology.name,
            &topology.binding.source_topics,
            ctx.partition,
            &id,
            &stopping,
        )
        .map_err(|detail| TaskError::Produce {
            task: id.clone(),
            detail,
        })?
        else {
            return Ok(None);
        };
        let counters = Counters {
            records_in: ctx.metrics.records_in.get_or_create(labels).clone(),
            records_out: ctx.metrics.records_out.get_or_create(labels).clone(),
            calls: ctx.metrics.guest_calls.get_or_create(labels).clone(),
            call_seconds: ctx.metrics.guest_call_seconds.get_or_create(labels).clone(),
        };
        tracing::info!(committed = ?source.committed, guarantee = ?ctx.settings.guarantee, task = %id, "started");
        Ok(Some(Task {
            consumer: Some(source.consumer),
            id,
            info,
            instance,
            tracker: Arc::new(DeliveryTracker::default()),
            changelog_tracker: Arc::new(DeliveryTracker::with_offsets()),
            output,
            state,
            writer: Writer::new(),
            batch: Vec::with_capacity(ctx.settings.batch_size),
            positions: source.committed.clone(),
            committed: source.committed,
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

    fn run_until_stopped(mut self) -> Result<TaskSummary, TaskError> {
        loop {
            match self.ctx.control.request() {
                Request::Run => {}
                Request::Stop => break,
                Request::Abort => return Ok(self.abort("asked to abort")),
            }
            if !self.ctx.lease.valid() {
                // Membership is uncertain: others may own this task by now. Do nothing until
                // the worker renews the lease or aborts the task.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            self.fill_batch();
            if !self.batch.is_empty() {
                self.process_batch()?;
            }
            self.maybe_punctuate()?;
            if self.last_commit.elapsed() >= self.ctx.settings.commit_interval {
                match self.commit()? {
                    // Skipped: the lease ran out meanwhile; the loop waits for it (above).
                    Commit::Done | Commit::Skipped => {}
                    Commit::Fenced => return Ok(self.abort("another owner fenced it")),
                }
            }
        }
        // Shutdown: the batch in flight is done; commit, then let the guest close and commit
        // what closing emitted or wrote.
        if self.commit()? != Commit::Done {
            return Ok(self.abort("it could not make its final commit (lease expired or fenced)"));
        }
        let output = self.call("close", |i| i.close())?;
        self.produce(&output, now_ms(), "close")?;
        if self.commit()? != Commit::Done {
            return Ok(self.abort("it could not make its final commit (lease expired or fenced)"));
        }
        tracing::info!(task = %self.id, records_in = self.summary.records_in, records_out = self.summary.records_out, "stopped");
        Ok(self.summary)
    }

    /// Stops without committing: uncommitted state is dropped, an open transaction aborted.
    fn abort(mut self, why: &str) -> TaskSummary {
        self.output.abort();
        if let Some(state) = &self.state {
            state.discard(self.instance.stores_mut());
        }
        tracing::warn!(task = %self.id, records_in = self.summary.records_in, "stopped without committing: {why}");
        self.summary.ended = Ended::Aborted;
        self.summary
    }

    /// Takes what the consumer holds, up to a batch; waits briefly only when it has nothing.
    fn fill_batch(&mut self) {
        self.writer.clear();
        self.batch.clear();
        let consumer = self.consumer.take().expect("the task's consumer");
        let mut wait = Duration::from_millis(100);
        while self.batch.len() < self.ctx.settings.batch_size {
            match consumer.poll(wait) {
                Some(Ok(message)) => {
                    let topics = &self.ctx.topology.binding.source_topics;
                    match topics.iter().position(|t| t == message.topic()) {
                        Some(source) => self.push(source as u32, &message),
                        None => {
                            tracing::warn!(task = %self.id, topic = message.topic(), "a record from a topic the task does not read")
                        }
                    }
                }
                Some(Err(e)) => tracing::warn!(task = %self.id, "consumer: {e}"),
                None => break,
            }
            wait = Duration::ZERO;
        }
        self.consumer = Some(consumer);
    }

    fn push(&mut self, source: u32, m: &BorrowedMessage<'_>) {
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

    fn process_batch(&mut self) -> Result<(), TaskError> {
        let started = Instant::now();
        let result = self.instance.process(self.writer.as_bytes());
        self.counters.calls.inc();
        self.counters.call_seconds.inc_by(started.elapsed().as_secs_f64());
        let output = match result {
            Ok(output) => output,
            Err(fault) => return Err(self.fail_batch(fault)),
        };
        let default_ts = self.stream_time;
        if let Err(fault) = self.produce(&output, default_ts, "a batch") {
            return Err(match fault {
                TaskError::Guest { fault, .. } => self.fail_batch(fault),
                other => other,
            });
        }
        let n = self.batch.len() as u64;
        self.summary.records_in += n;
        self.counters.records_in.inc_by(n);
        for &(source, offset) in &self.batch {
            self.positions[source as usize] = Some(offset + 1);
        }
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
            self.output
                .send(&self.tracker, out)
                .map_err(|detail| TaskError::Produce {
                    task: self.id.clone(),
                    detail,
                })?;
        }
        self.instance.end_call(true);
        let n = records.len() as u64;
        self.summary.records_out += n;
        self.counters.records_out.inc_by(n);
        Ok(())
    }

    fn maybe_punctuate(&mut self) -> Result<(), TaskError> {
        let interval = self.ctx.settings.punctuate_interval;
        let stream_due = self.stream_time != i64::MIN
            && self.stream_time.saturating_sub(self.last_punctuate_stream) >= interval.as_millis() as i64;
        if !(stream_due || self.last_punctuate.elapsed() >= interval) {
            return Ok(());
        }
        self.last_punctuate = Instant::now();
        self.last_punctuate_stream = self.stream_time;
        let (stream_time, wall) = (self.stream_time, now_ms());
        let at = format!("punctuation (stream time {stream_time})");
        let output = self.call(&at, |i| i.punctuate(stream_time, wall))?;
        self.produce(&output, if stream_time == i64::MIN { wall } else { stream_time }, &at)
    }

    fn call(
        &mut self,
        at: &str,
        f: impl FnOnce(&mut TaskInstance) -> Result<CallOutput, GuestFault>,
    ) -> Result<CallOutput, TaskError> {
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

    /// Commits what earlier batches read (the failed call left no state behind), then names
    /// where this batch failed.
    fn fail_batch(&mut self, fault: GuestFault) -> TaskError {
        let at = self.locate(&fault);
        match self.commit() {
            Ok(Commit::Done) => {}
            Ok(_) => {
                tracing::warn!(task = %self.id, "not committing the records before the failure: no lease, or fenced")
            }
            Err(e) => tracing::warn!(task = %self.id, "committing the records before the failure: {e}"),
        }
        TaskError::Guest {
            task: self.id.clone(),
            at,
            fault,
        }
    }

    /// Where in the batch the guest failed: the record it named, the only record, or the
    /// first record that fails again when the batch is replayed one record at a time in a
    /// fresh instance (a trap carries no record index).
    fn locate(&self, fault: &GuestFault) -> String {
        let topics = &self.ctx.topology.binding.source_topics;
        let describe = |(source, offset): (u32, i64)| {
            format!(
                "offset {offset} of topic {} partition {}",
                topics[source as usize], self.ctx.partition
            )
        };
        if let Some(&record) = fault.record_index().and_then(|i| self.batch.get(i as usize)) {
            return describe(record);
        }
        if self.batch.len() == 1 {
            return describe(self.batch[0]);
        }
        if matches!(
            fault,
            GuestFault::Trap { .. } | GuestFault::Deadline { .. } | GuestFault::Memory { .. }
        ) {
            if let Some(index) = self.replay_one_by_one() {
                return describe(self.batch[index]);
            }
        }
        let (first, last) = (self.batch[0], self.batch[self.batch.len() - 1]);
        format!(
            "the batch of offsets {}..={} of partition {}",
            first.1, last.1, self.ctx.partition
        )
    }

    fn replay_one_by_one(&self) -> Option<usize> {
        tracing::info!(task = %self.id, records = self.batch.len(), "replaying the failed batch one record at a time to find the failing record");
        // Against empty in-memory stores: this only has to find the record that faults.
        let mut instance = self.ctx.topology.loaded.instantiate_in_memory(&self.id).ok()?;
        instance.init(&self.info).ok()?;
        let mut single = Writer::new();
        for (index, input) in wire::inputs(self.writer.as_bytes()).ok()?.enumerate() {
            let input = input.ok()?;
            single.clear();
            single.push_input(
                input.key,
                input.value,
                input.timestamp,
                input.source,
                input.partition,
                input.offset,
                input.headers.iter().collect::<Vec<_>>().into_iter(),
            );
            if instance.process(single.as_bytes()).is_err() {
                return Some(index);
            }
        }
        None
    }

    /// The commit protocol (see `task_state` for where a crash can fall). Commits nothing
    /// when the lease is not valid (skipped: the task waits for it) or another producer
    /// fenced the task (exactly-once: it is not ours any more).
    fn commit(&mut self) -> Result<Commit, TaskError> {
        self.last_commit = Instant::now();
        if !self.ctx.lease.valid() {
            return Ok(Commit::Skipped);
        }
        // 1. The stores' writes since the last commit go to their changelogs.
        let logged = self.log_state()?;
        let idle_due = self.last_offsets_commit.elapsed() >= self.ctx.settings.idle_commit_interval;
        if self.positions == self.committed && !logged && !self.output.in_transaction() && !idle_due {
            return Ok(Commit::Done);
        }
        let offsets = self.offsets();
        // 2. Everything produced is acknowledged; source offsets are committed.
        if self.output.is_transactional() {
            let group = self
                .consumer
                .as_ref()
                .expect("the task's consumer")
                .group_metadata()
                .ok_or_else(|| TaskError::Transaction {
                    task: self.id.clone(),
                    detail: "the consumer has no group metadata".into(),
                })?;
            match self.output.commit(&offsets, &group) {
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
            let (control, lease) = (&self.ctx.control, &self.ctx.lease);
            let give_up = || control.request() == Request::Abort || !lease.valid();
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
            if offsets.count() > 0 {
                match self
                    .consumer
                    .as_ref()
                    .expect("the task's consumer")
                    .commit(&offsets, CommitMode::Sync)
                {
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
                self.output
                    .send(&self.changelog_tracker, out)
                    .map_err(|detail| TaskError::Produce {
                        task: self.id.clone(),
                        detail,
                    })?;
                written = true;
            }
        }
        Ok(written)
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
