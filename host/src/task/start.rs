//! Starting a task: where each source starts (its committed offsets, once stable), its
//! restored state and its guest instance. Under exactly-once it has no producer of its own:
//! its stream thread's transactions carry its records (`output`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_wire::wire::Writer;
use sluice_wire::TaskInfo;

use super::delivery::DeliveryTracker;
use super::partition_group::PartitionGroup;
use super::state::{Opened, Opening, TaskState};
use super::{
    rate, source, Counters, Ended, Guarantee, KafkaEnv, Task, TaskContext, TaskError, TaskOutput, TaskSummary,
};
use crate::metrics::{ErrorLabels, Metrics, TaskLabels};
use crate::state::global::NotReady;

/// What starting a task came to.
pub enum Prepared {
    /// Ready to be fed records from the returned positions on.
    Ready(Box<Task>),
    /// Asked to stop, or failed, before it could start: how it ended (already reported).
    Ended(Result<TaskSummary, TaskError>),
}

/// Starts a task: its producer, restored state, guest instance and source positions.
pub fn prepare(ctx: TaskContext, env: &mut KafkaEnv) -> Prepared {
    let id = ctx.task.to_string();
    let labels = TaskLabels {
        topology: ctx.topology.name.clone(),
        task: id.clone(),
    };
    ctx.metrics.task_failed.get_or_create(&labels).set(0);
    // The first thing a task does; tests check ownership intervals from here to "ended".
    tracing::info!(task = %id, "starting");
    ctx.metrics.tasks_running.inc();
    let (metrics, progress, control) = (ctx.metrics.clone(), ctx.progress.clone(), ctx.control.clone());
    let task_id = ctx.task.clone();
    let started = Task::start(ctx, id.clone(), labels.clone(), env);
    control.started();
    // Given up by the start watch: a failure to retry, however it ended.
    if let Some(detail) = control.abandoned() {
        let result = Err(TaskError::Start { task: id, detail });
        report_end(&metrics, &labels, &result);
        return Prepared::Ended(result);
    }
    match started {
        Ok(Some(task)) => {
            progress.processing(&task_id);
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
pub(super) fn report_end(metrics: &Metrics, labels: &TaskLabels, result: &Result<TaskSummary, TaskError>) {
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

/// The worker's progress listener, telling the start's watch too that a restore goes on.
struct Watched<'a> {
    inner: &'a dyn super::TaskProgress,
    control: &'a super::control::TaskControl,
}

impl super::TaskProgress for Watched<'_> {
    fn restoring(&self, task: &crate::group::TaskId, restored: u64, total: u64, rate: f64) {
        self.control.progress();
        self.inner.restoring(task, restored, total, rate);
    }

    fn processing(&self, task: &crate::group::TaskId) {
        self.inner.processing(task);
    }
}

/// How long a step of a start may go without progress before the start is given up (and
/// the task started again): each step retries by itself, logging, well within it.
pub const STEP_DEADLINE: Duration = Duration::from_secs(150);

impl Task {
    /// Prepares a task: its committed offsets, its restored state and its guest instance.
    /// None: asked to stop first.
    pub(super) fn start(
        mut ctx: TaskContext,
        id: String,
        labels: TaskLabels,
        env: &mut KafkaEnv,
    ) -> Result<Option<Task>, TaskError> {
        let topology = ctx.topology.clone();
        let control = ctx.control.clone();
        let stopping = move || control.stopping();
        let stage = ctx.stage();
        let info = TaskInfo {
            topology: topology.name.clone(),
            subtopology: stage.guest_name.clone(),
            task_id: id.clone(),
            partition: ctx.partition,
            // Every source the guest declares, so that it finds its own by the index the
            // records carry.
            source_topics: topology.binding.source_topics.clone(),
            sink_topics: topology.binding.sink_topics.clone(),
        };
        // Under exactly-once the task's records go in its stream thread's transactions: no
        // producer of its own to start here.
        let output = match ctx.settings.guarantee {
            Guarantee::AtLeastOnce => TaskOutput::shared(ctx.producer.clone()),
            Guarantee::ExactlyOnce => TaskOutput::transactional(),
        };
        let began = Instant::now();
        // The committed offsets first: the lookup waits for offsets pending in an open
        // transaction (`require_stable`), and under exactly-once every transaction holding
        // this task's writes holds its offsets too. Once they are stable, no transaction of
        // a previous owner can still commit changelog records of this task (see
        // `docs/guarantees.md`), so the restore below reads all there is.
        let sources = &ctx.source_topics();
        ctx.control.enter("looking up its committed offsets", STEP_DEADLINE);
        let Some(committed) = source::committed(env, &topology.group, sources, ctx.partition, &id, &stopping) else {
            return Ok(None);
        };
        // After a deploy that asked to reprocess, the group starts empty: from there.
        let committed = match topology.start_from {
            Some(from) if committed.iter().any(Option::is_none) => {
                source::start_from(&ctx.kafka, sources, ctx.partition, committed, from).map_err(|detail| {
                    TaskError::Source {
                        task: id.clone(),
                        detail,
                    }
                })?
            }
            _ => committed,
        };
        let offsets_at = began.elapsed();
        let Some((state, stores)) = open_state(&mut ctx, &id, &stopping)? else {
            return Ok(None);
        };
        let opened_at = began.elapsed();
        ctx.control
            .enter("instantiating the guest and calling init", STEP_DEADLINE);
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
        let instantiated_at = began.elapsed();
        let counters = Counters {
            records_in: ctx.metrics.records_in.get_or_create(&labels).clone(),
            enforced_processing: ctx.metrics.enforced_processing.get_or_create(&labels).clone(),
            records_out: ctx.metrics.records_out.get_or_create(&labels).clone(),
            calls: ctx.metrics.guest_calls.get_or_create(&labels).clone(),
            call_seconds: ctx.metrics.guest_call_seconds.get_or_create(&labels).clone(),
            faults: ctx.metrics.guest_faults.clone(),
            topology: labels.topology.clone(),
        };
        tracing::debug!(
            target: "handover", task = %id, open_ms = (opened_at - offsets_at).as_millis() as u64,
            instantiate_ms = (instantiated_at - opened_at).as_millis() as u64,
            offsets_ms = offsets_at.as_millis() as u64, "start steps"
        );
        tracing::info!(committed = ?committed, guarantee = ?ctx.settings.guarantee, task = %id, "started");
        let rate = topology.records_per_second.map(|r| rate::Rate::new(r, Instant::now()));
        let batch_bytes = ctx
            .settings
            .max_batch_bytes
            .min(topology.loaded.limits().memory_limit / 4)
            .max(1);
        let sources = ctx.stage().sources.len();
        // Several source partitions are taken in timestamp order across them.
        let inputs = (sources > 1).then(|| PartitionGroup::new(sources, topology.max_task_idle, batch_bytes));
        let holds_back = topology.loaded.holds_back();
        let flush_each_batch =
            holds_back && (topology.on_error != crate::manifest::OnError::Fail || super::batch::lost_cache_before(&id));
        Ok(Some(Task {
            inputs,
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
            batch_bytes,
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
            last_purge: Instant::now(),
            purged: Vec::new(),
            last_punctuate: Instant::now(),
            last_punctuate_stream: i64::MIN,
            unflushed: false,
            instance_batches: 0,
            keeps_instance: false,
            cache_lost: false,
            flush_each_batch,
            holds_back,
            summary: TaskSummary::default(),
            counters,
            thread_time: Duration::ZERO,
            fair_turn: true,
            formats: super::formats::TaskFormats::new(topology.formats.clone(), ctx.schemas.clone()),
            pending: None,
            originals: Default::default(),
            told_waiting: None,
            ctx,
        }))
    }
}

/// Opens and restores a task's stores and its views of the global tables it reads (waiting
/// for them to catch up). None: asked to stop first.
#[allow(clippy::type_complexity)]
fn open_state(
    ctx: &mut TaskContext,
    id: &str,
    stopping: &dyn Fn() -> bool,
) -> Result<Option<(Option<TaskState>, Vec<crate::runtime::NamedStore>)>, TaskError> {
    let topology = ctx.topology.clone();
    let stage = ctx.stage();
    let id = id.to_string();
    ctx.control.enter("opening and restoring its state", STEP_DEADLINE);
    let changelogs = topology.changelogs_of(stage);
    let (state, stores) = if changelogs.is_empty() {
        (None, Vec::new())
    } else {
        let opened = TaskState::open(Opening {
            state: &ctx.state,
            kafka: &ctx.kafka,
            drops: &ctx.drops,
            task_id: &ctx.task,
            task: &id,
            changelogs,
            metrics: &ctx.metrics,
            progress: &Watched {
                inner: ctx.progress.as_ref(),
                control: &ctx.control,
            },
            stop: stopping,
            warm: ctx.warm.take(),
        })
        .map_err(|detail| TaskError::State {
            task: id.clone(),
            detail,
        })?;
        match opened {
            Opened::Ready(state, stores) => (Some(state), stores),
            Opened::Stopped => return Ok(None),
        }
    };
    let mut stores = stores;
    if !topology.globals.is_empty() {
        ctx.control
            .enter("waiting for its global tables to catch up", STEP_DEADLINE);
        for g in &topology.globals {
            let Some(table) = ctx.state.globals.get(&g.topic) else {
                return Err(TaskError::State {
                    task: id.clone(),
                    detail: format!("the global table of topic {:?} is not kept on this worker", g.topic),
                });
            };
            // The start's watch hears of progress only when the table moves.
            let seen = std::cell::Cell::new(None);
            let progress = |restored: u64, _total: u64| {
                if seen.replace(Some(restored)) != Some(restored) {
                    ctx.control.progress();
                }
            };
            match table.wait_ready(stopping, &progress) {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                Err(NotReady::Failed(detail)) => {
                    return Err(TaskError::State {
                        task: id.clone(),
                        detail,
                    })
                }
                Err(NotReady::OverLimit(detail)) => {
                    return Err(TaskError::Quota {
                        task: id.clone(),
                        detail,
                    })
                }
            }
            if table.bytes() > topology.state_limit {
                return Err(TaskError::Quota {
                    task: id.clone(),
                    detail: format!(
                        "the global table of topic {:?} takes {} bytes, more than the limit of topology {} \
                         ({} bytes: limits.state in the manifest, or the worker's --state-limit)",
                        g.topic,
                        table.bytes(),
                        topology.name,
                        topology.state_limit
                    ),
                });
            }
            stores.push(crate::runtime::NamedStore {
                name: g.store.clone(),
                store: Box::new(crate::state::global::GlobalReader::new(&g.store, table)),
            });
        }
    }
    Ok(Some((state, stores)))
}
