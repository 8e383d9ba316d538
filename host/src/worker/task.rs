//! One task — a topology on one input partition — on its own thread: poll a batch, call the
//! guest, produce what it emits, and commit source offsets once those records are
//! acknowledged (at-least-once).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{BorrowedMessage, Headers as _, Message};
use rdkafka::{Offset, TopicPartitionList};
use sluice_guest::wire::{self, Header, Writer, INHERIT_TIMESTAMP};
use sluice_guest::TaskInfo;

use super::delivery::{self, DeliveryTracker, Outgoing, WorkerProducer};
use super::task_state::{StateEnv, TaskState};
use super::{ConsumerEvents, DeployedTopology};
use crate::metrics::{ErrorLabels, Metrics, TaskLabels};
use crate::runtime::{CallOutput, GuestFault, TaskInstance};
use crate::state::rocks::RocksStore;

/// How long a commit waits for the task's produced records to be acknowledged.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(120);

/// Knobs shared by every task of a worker.
#[derive(Debug, Clone)]
pub struct TaskSettings {
    pub batch_size: usize,
    pub commit_interval: Duration,
    pub punctuate_interval: Duration,
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
}

impl TaskError {
    pub fn kind(&self) -> &'static str {
        match self {
            TaskError::Guest { fault, .. } => fault.kind(),
            TaskError::Produce { .. } => "produce",
            TaskError::State { .. } => "state",
        }
    }
}

/// Everything a task thread needs.
pub struct TaskContext {
    pub topology: Arc<DeployedTopology>,
    pub partition: i32,
    pub producer: Arc<WorkerProducer>,
    pub settings: TaskSettings,
    pub stop: Arc<AtomicBool>,
    pub metrics: Metrics,
    pub bootstrap: String,
    /// Where stateful topologies keep their stores.
    pub state: Arc<StateEnv>,
}

/// What a task did before it stopped cleanly.
#[derive(Debug, Default, Clone, Copy)]
pub struct TaskSummary {
    pub records_in: u64,
    pub records_out: u64,
}

struct Task {
    ctx: TaskContext,
    /// Reads the task's partition of every source; `None` only while a batch is polled.
    consumer: Option<BaseConsumer<ConsumerEvents>>,
    id: String,
    info: TaskInfo,
    instance: TaskInstance,
    tracker: Arc<DeliveryTracker>,
    /// Changelog records in flight; remembers acknowledged offsets for the checkpoint.
    changelog_tracker: Arc<DeliveryTracker>,
    state: Option<TaskState>,
    writer: Writer,
    /// (source index, offset) of each record in the current batch.
    batch: Vec<(u32, i64)>,
    /// Next offset to commit per source, once the batch that read it is produced.
    positions: Vec<Option<i64>>,
    committed: Vec<Option<i64>>,
    stream_time: i64,
    last_commit: Instant,
    last_punctuate: Instant,
    last_punctuate_stream: i64,
    summary: TaskSummary,
    counters: Counters,
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

    metrics.tasks_running.inc();
    let result = Task::start(ctx, id.clone(), &labels).and_then(Task::run_until_stopped);
    metrics.tasks_running.dec();

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
    fn start(ctx: TaskContext, id: String, labels: &TaskLabels) -> Result<Task, TaskError> {
        let topology = &ctx.topology;
        let info = TaskInfo {
            topology: topology.name.clone(),
            task_id: id.clone(),
            partition: ctx.partition,
            source_topics: topology.binding.source_topics.clone(),
            sink_topics: topology.binding.sink_topics.clone(),
        };
        let (state, stores) = if topology.changelogs.is_empty() {
            (None, Vec::new())
        } else {
            let (state, stores) = TaskState::open(
                &ctx.state,
                &ctx.bootstrap,
                &topology.name,
                &id,
                ctx.partition,
                topology.changelogs.clone(),
                &ctx.metrics,
            )
            .map_err(|detail| TaskError::State {
                task: id.clone(),
                detail,
            })?;
            (Some(state), stores)
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
        let sources = topology.binding.source_topics.len();
        let consumer = task_consumer(
            &ctx.bootstrap,
            &topology.name,
            &topology.binding.source_topics,
            ctx.partition,
        )
        .map_err(|detail| TaskError::Produce {
            task: id.clone(),
            detail,
        })?;
        let counters = Counters {
            records_in: ctx.metrics.records_in.get_or_create(labels).clone(),
            records_out: ctx.metrics.records_out.get_or_create(labels).clone(),
            calls: ctx.metrics.guest_calls.get_or_create(labels).clone(),
            call_seconds: ctx.metrics.guest_call_seconds.get_or_create(labels).clone(),
        };
        tracing::info!(task = %id, "started");
        Ok(Task {
            consumer: Some(consumer),
            id,
            info,
            instance,
            tracker: Arc::new(DeliveryTracker::default()),
            changelog_tracker: Arc::new(DeliveryTracker::with_offsets()),
            state,
            writer: Writer::new(),
            batch: Vec::with_capacity(ctx.settings.batch_size),
            positions: vec![None; sources],
            committed: vec![None; sources],
            stream_time: i64::MIN,
            last_commit: Instant::now(),
            last_punctuate: Instant::now(),
            last_punctuate_stream: i64::MIN,
            summary: TaskSummary::default(),
            counters,
            ctx,
        })
    }

    fn run_until_stopped(mut self) -> Result<TaskSummary, TaskError> {
        while !self.ctx.stop.load(Ordering::Relaxed) {
            self.fill_batch();
            if !self.batch.is_empty() {
                self.process_batch()?;
            }
            self.maybe_punctuate()?;
            if self.last_commit.elapsed() >= self.ctx.settings.commit_interval {
                self.commit()?;
            }
        }
        // Shutdown: the batch in flight is done; flush and commit, then let the guest close
        // and commit again.
        self.commit()?;
        let output = self.call("close", |i| i.close())?;
        self.produce(&output, now_ms(), "close")?;
        // What closing emitted or wrote to state goes through the same commit.
        self.commit()?;
        tracing::info!(task = %self.id, records_in = self.summary.records_in, records_out = self.summary.records_out, "stopped");
        Ok(self.summary)
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

    /// Produces what a call (`at` says which) emitted. Records without a timestamp of their
    /// own get `default_ts`.
    fn produce(&mut self, output: &CallOutput, default_ts: i64, at: &str) -> Result<(), TaskError> {
        let sink_topics = &self.ctx.topology.binding.sink_topics;
        let records = output.records(sink_topics.len()).map_err(|fault| TaskError::Guest {
            task: self.id.clone(),
            at: at.to_string(),
            fault,
        })?;
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
            delivery::send(&self.ctx.producer, &self.tracker, out).map_err(|detail| TaskError::Produce {
                task: self.id.clone(),
                detail,
            })?;
        }
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

    /// Commits what earlier batches read, then names where this batch failed.
    fn fail_batch(&mut self, fault: GuestFault) -> TaskError {
        let at = self.locate(&fault);
        if let Err(e) = self.commit() {
            tracing::warn!(task = %self.id, "committing the records before the failure: {e}");
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

    /// The commit protocol (see `task_state` for where a crash can fall): state changes to
    /// RocksDB and the changelog → wait until everything produced is acknowledged → commit
    /// source offsets → write the checkpoint.
    fn commit(&mut self) -> Result<(), TaskError> {
        self.last_commit = Instant::now();
        let logged = self.flush_state()?;
        if self.positions == self.committed && !logged {
            return Ok(());
        }
        let produce_error = |detail| TaskError::Produce {
            task: self.id.clone(),
            detail,
        };
        self.tracker.wait_idle(DELIVERY_TIMEOUT).map_err(produce_error)?;
        self.changelog_tracker
            .wait_idle(DELIVERY_TIMEOUT)
            .map_err(produce_error)?;
        if self.positions != self.committed {
            let mut tpl = TopicPartitionList::new();
            for (source, position) in self.positions.iter().enumerate() {
                if let Some(offset) = position {
                    let topic = &self.ctx.topology.binding.source_topics[source];
                    tpl.add_partition_offset(topic, self.ctx.partition, Offset::Offset(*offset))
                        .expect("a valid offset");
                }
            }
            match self
                .consumer
                .as_ref()
                .expect("the task's consumer")
                .commit(&tpl, CommitMode::Sync)
            {
                Ok(()) => self.committed = self.positions.clone(),
                // Not fatal: the offsets are committed with the next commit, and until then a
                // restart only reprocesses (at-least-once).
                Err(e) => tracing::warn!(task = %self.id, "committing offsets failed, will retry: {e}"),
            }
        }
        if let Some(state) = &mut self.state {
            let tracker = &self.changelog_tracker;
            state
                .write_checkpoint(|topic| tracker.offset(topic))
                .map_err(|detail| TaskError::State {
                    task: self.id.clone(),
                    detail,
                })?;
        }
        Ok(())
    }

    /// Step 1: writes each store's cached changes to RocksDB and the changelog. Returns
    /// whether anything was written.
    fn flush_state(&mut self) -> Result<bool, TaskError> {
        let Some(state) = &self.state else { return Ok(false) };
        let mut written = false;
        let partition = self.ctx.partition;
        for named in self.instance.stores_mut() {
            let Some(store) = named.store.as_any().downcast_mut::<RocksStore>() else {
                continue;
            };
            if !store.has_changes() {
                continue;
            }
            let changelog = state.changelog(&named.name).expect("every store has a changelog");
            let changes = store.take_changes().map_err(|detail| TaskError::State {
                task: self.id.clone(),
                detail,
            })?;
            for (key, value) in &changes {
                let out = Outgoing {
                    topic: changelog,
                    partition: Some(partition),
                    key: Some(key),
                    value: value.as_deref(),
                    timestamp: -1,
                    headers: wire::Headers::EMPTY,
                };
                delivery::send(&self.ctx.producer, &self.changelog_tracker, out).map_err(|detail| {
                    TaskError::Produce {
                        task: self.id.clone(),
                        detail,
                    }
                })?;
            }
            written |= !changes.is_empty();
        }
        Ok(written)
    }
}

/// The task's own consumer: its partition of every source, from the committed offsets of
/// the topology's consumer group (`sluice-<topology>`), or the beginning.
fn task_consumer(
    bootstrap: &str,
    topology: &str,
    sources: &[String],
    partition: i32,
) -> Result<BaseConsumer<ConsumerEvents>, String> {
    let consumer = super::source_consumer(bootstrap, topology).map_err(|e| format!("creating the consumer: {e}"))?;
    let mut tpl = TopicPartitionList::new();
    for topic in sources {
        tpl.add_partition_offset(topic, partition, Offset::Stored)
            .map_err(|e| e.to_string())?;
    }
    consumer
        .assign(&tpl)
        .map_err(|e| format!("assigning {sources:?} partition {partition}: {e}"))?;
    Ok(consumer)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
