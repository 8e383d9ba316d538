//! Starts, stops and watches tasks (run by the stream threads) and standbys (the state
//! updater). A task that ends on its own is
//! reaped: a guest fault keeps it failed (reported, its slot kept so the group does not hand
//! the poison to another worker unless told to release it); anything else — Kafka or state
//! trouble — restarts it after a backoff.

use std::collections::BTreeMap;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::board::Board;
use super::WorkerReport;
use crate::drops::Drops;
use crate::group::metadata::TopologyInfo;
use crate::group::TaskId;
use crate::kafka::KafkaSettings;
use crate::metrics::Metrics;
use crate::state::dir::StateDir;
use crate::state::warm::{Handover, Warm, WarmStores};
use crate::task::control::{Fence, Lease, TaskControl};
use crate::task::delivery::SharedProducer;
use crate::task::{self, Ended, TaskError, TaskSettings, TaskSummary};
use crate::threads::standbys as standby;
use crate::threads::GlobalUpdater;
use crate::threads::{Panicked, StreamThreads, TaskSlot};
use crate::topology::DeployedTopology;

/// How often the worker looks for tasks that ended on their own.
pub const REAP_EVERY: Duration = Duration::from_millis(500);

/// Longest wait before a task that failed for a transient reason starts again.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The open stores an ended task returned.
type Returned = (TaskId, WarmStores);

/// A task (on a starter or stream thread), how to ask it to stop, and where its end is told.
type RunningTask = (Arc<TaskControl>, Arc<TaskSlot>);

/// Tasks asked to stop, not yet joined.
#[must_use = "stopping tasks must be finished with TaskRunner::finish"]
pub struct Stopping {
    tasks: Vec<(TaskId, RunningTask)>,
    /// Ownership is (or may be) lost: how a task ended no longer matters, nothing of it
    /// was committed after the abort.
    aborted: std::sync::atomic::AtomicBool,
}

impl Stopping {
    /// Turns the stop into an abort: nothing more is committed.
    pub fn abort(&self) {
        self.aborted.store(true, std::sync::atomic::Ordering::Relaxed);
        for (_, (control, _)) in &self.tasks {
            control.abort();
        }
    }

    /// Whether every task has ended (joining them will not block).
    pub fn is_done(&self) -> bool {
        self.tasks.iter().all(|(_, (_, h))| h.is_finished())
    }
}

/// Starts and stops tasks (on the stream threads) and standbys; knows every deployed topology.
pub struct TaskRunner {
    /// Whether tasks may process and commit (renewed by the group membership).
    lease: Arc<Lease>,
    /// The membership exactly-once transactions prove (set by the group membership).
    fence: Arc<Fence>,
    producer: Arc<SharedProducer>,
    settings: TaskSettings,
    metrics: Metrics,
    /// What the worker is doing now (for `GET /status` and the metrics).
    board: Arc<Board>,
    kafka: KafkaSettings,
    state: Arc<StateDir>,
    /// Where ended tasks (and stores nobody takes) are dropped.
    drops: Arc<Drops>,
    /// Where ended tasks return their open stores, and the stores returned: each is passed
    /// to the next user of its task's state here (the task started again, or a standby of
    /// it) or closed once its task is no longer this worker's (see `state::warm`).
    returns: (Sender<Returned>, Receiver<Returned>),
    returned: BTreeMap<TaskId, WarmStores>,
    topologies: BTreeMap<String, Arc<DeployedTopology>>,
    running: BTreeMap<TaskId, RunningTask>,
    /// Tasks a guest fault stopped: still ours, not running, with their errors.
    failed: BTreeMap<TaskId, String>,
    /// Tasks that failed for a transient reason: when they start again, and how often
    /// they failed in a row.
    retrying: BTreeMap<TaskId, (Instant, u32)>,
    /// Failures in a row of tasks started again (forgotten when a task ends cleanly).
    retry_counts: BTreeMap<TaskId, u32>,
    /// Give a task a guest fault stopped back to the group instead of keeping it failed.
    release_failed: bool,
    /// Standby tasks, kept warm on the state-updater thread.
    standbys: std::collections::BTreeSet<TaskId>,
    /// Which of the standbys are learners (restoring to take the task over).
    learners: std::collections::BTreeSet<TaskId>,
    updater: standby::StandbyUpdater,
    /// Fills and tails the global tables (on a thread of its own).
    _globals: GlobalUpdater,
    finished: WorkerReport,
    streams: StreamThreads,
    /// The worker's schema registry client and cache, for its tasks.
    schemas: crate::formats::Schemas,
}

/// What reaping found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reaped {
    /// A task stopped itself without committing while the worker still held its lease (it
    /// was fenced by another owner): the worker should rejoin the group.
    pub rejoin: bool,
}

impl TaskRunner {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        lease: Arc<Lease>,
        fence: Arc<Fence>,
        worker_id: &str,
        producer: Arc<SharedProducer>,
        settings: TaskSettings,
        metrics: Metrics,
        board: Arc<Board>,
        kafka: KafkaSettings,
        state: Arc<StateDir>,
        deployed: Vec<DeployedTopology>,
        schemas: crate::formats::Schemas,
    ) -> anyhow::Result<TaskRunner> {
        let exactly_once = (settings.guarantee == task::Guarantee::ExactlyOnce)
            .then(|| (worker_id.to_string(), fence.clone(), settings.commit_interval));
        let streams = StreamThreads::start(settings.threads, &kafka, settings.prefetch_bytes, exactly_once)?;
        let updater = standby::StandbyUpdater::start(&kafka, state.clone(), settings.standby_restore_rate)?;
        let globals = GlobalUpdater::start(&kafka, state.clone())?;
        // Global tables fill from now on, before any task that reads one is placed here.
        state.want_globals(&wanted_globals(deployed.iter()));
        Ok(TaskRunner {
            schemas,
            streams,
            updater,
            _globals: globals,
            lease,
            fence,
            producer,
            settings,
            metrics,
            board,
            kafka,
            state,
            drops: Default::default(),
            returns: std::sync::mpsc::channel(),
            returned: BTreeMap::new(),
            topologies: deployed.into_iter().map(|t| (t.name.clone(), Arc::new(t))).collect(),
            running: BTreeMap::new(),
            failed: BTreeMap::new(),
            retrying: BTreeMap::new(),
            retry_counts: BTreeMap::new(),
            release_failed: false,
            standbys: Default::default(),
            learners: Default::default(),
            finished: WorkerReport::default(),
        })
    }

    /// Releases tasks that a guest fault stopped to the group (cluster mode) instead of
    /// keeping them failed here.
    pub fn release_failed_tasks(&mut self, release: bool) {
        self.release_failed = release;
    }

    /// Every task of every deployed topology.
    pub fn all_tasks(&self) -> Vec<TaskId> {
        self.topologies.values().flat_map(|t| t.tasks()).collect()
    }

    /// The digest of each topology this worker runs, by name.
    pub fn digests(&self) -> BTreeMap<String, [u8; 16]> {
        self.topologies.iter().map(|(n, t)| (n.clone(), t.digest)).collect()
    }

    /// Tasks (owned: running, failed or retrying) and standbys of the topologies `names`:
    /// what has to stop before they are removed or replaced.
    pub fn tasks_of(&self, names: &[String]) -> (Vec<TaskId>, Vec<TaskId>) {
        let of = |t: &TaskId| names.iter().any(|n| **n == *t.topology);
        let owned = self.owned().into_iter().filter(of).collect();
        let standbys = self.standbys.iter().filter(|t| of(t)).cloned().collect();
        (owned, standbys)
    }

    /// Runs `topology` from now on (replacing one of the same name, whose tasks and
    /// standbys must have stopped: see [`Self::tasks_of`]).
    pub fn put_topology(&mut self, topology: DeployedTopology) {
        self.forget(&topology.name);
        self.topologies.insert(topology.name.clone(), Arc::new(topology));
        self.state
            .want_globals(&wanted_globals(self.topologies.values().map(|t| &**t)));
    }

    /// Stops running the topology `name` (its tasks and standbys must have stopped).
    pub fn remove_topology(&mut self, name: &str) {
        self.forget(name);
        self.topologies.remove(name);
        self.close_unclaimed();
        self.state
            .want_globals(&wanted_globals(self.topologies.values().map(|t| &**t)));
    }

    /// Forgets the failures of a topology's tasks (a new version starts them afresh).
    fn forget(&mut self, name: &str) {
        self.failed.retain(|t, _| *t.topology != *name);
        self.retrying.retain(|t, _| *t.topology != *name);
        self.retry_counts.retain(|t, _| *t.topology != *name);
    }

    /// What this worker tells the group it runs.
    pub fn topology_infos(&self) -> Vec<TopologyInfo> {
        use crate::group::metadata::SubInfo;
        self.topologies
            .values()
            .map(|t| {
                let subs: Vec<SubInfo> = t
                    .stages
                    .iter()
                    .filter_map(|s| {
                        Some(SubInfo {
                            name: s.sub.as_deref()?.to_string(),
                            partitions: s.partitions as u32,
                            stateful: !s.changelogs.is_empty(),
                        })
                    })
                    .collect();
                TopologyInfo {
                    name: t.name.clone(),
                    partitions: if subs.is_empty() {
                        t.stages[0].partitions as u32
                    } else {
                        0
                    },
                    digest: t.digest,
                    stateful: t.stateful(),
                    subs,
                }
            })
            .collect()
    }

    /// The tasks this worker owns: running, failed, or waiting to start again.
    pub fn owned(&self) -> Vec<TaskId> {
        let mut all: Vec<TaskId> = self
            .running
            .keys()
            .chain(self.failed.keys())
            .chain(self.retrying.keys())
            .cloned()
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// The tasks running now.
    pub fn running(&self) -> Vec<TaskId> {
        self.running.keys().cloned().collect()
    }

    /// Tasks a guest fault stopped, with their errors.
    pub fn failed(&self) -> Vec<(TaskId, String)> {
        self.failed.iter().map(|(t, e)| (t.clone(), e.clone())).collect()
    }

    /// Collects tasks that ended on their own and restarts transient failures whose
    /// backoff has passed (only while the lease holds).
    pub fn reap(&mut self) -> anyhow::Result<Reaped> {
        // A client certificate renewed on disk: the shared producer is made again now,
        // whether or not a task sends (the tasks move to it as they settle).
        let _ = self.producer.current();
        let mut reaped = Reaped::default();
        let ended: Vec<TaskId> = self
            .running
            .iter()
            .filter(|(_, (_, handle))| handle.is_finished())
            .map(|(t, _)| t.clone())
            .collect();
        for id in ended {
            let (_, handle) = self.running.remove(&id).expect("listed above");
            match handle.join() {
                Ok(Ok(summary)) => {
                    self.retry_counts.remove(&id);
                    // Ended without being asked: it could not commit.
                    if summary.ended == Ended::Aborted && self.lease.valid() {
                        reaped.rejoin = true;
                    }
                    self.finished.stopped.push((id.to_string(), summary));
                }
                Ok(Err(
                    e @ (TaskError::Guest { .. } | TaskError::Quota { .. } | TaskError::Input { retry: false, .. }),
                )) => {
                    if self.release_failed {
                        // Given back to the group, which may place it elsewhere (or here again).
                        tracing::error!(task = %id, "failed; releasing it to the group: {e}");
                        reaped.rejoin = true;
                    } else {
                        tracing::error!(task = %id, "failed and stays failed until the topology is fixed: {e}");
                        self.failed.insert(id.clone(), e.to_string());
                        self.board.ended(&id, Some(e.to_string()));
                    }
                    self.finished.failed.push((id.to_string(), e.to_string()));
                }
                Ok(Err(e)) => self.schedule_retry(&id, &e.to_string()),
                Err(Panicked) => self.schedule_retry(&id, "its stream thread panicked while running it"),
            }
        }
        if self.lease.valid() {
            let due: Vec<TaskId> = self
                .retrying
                .iter()
                .filter(|(_, (at, _))| *at <= Instant::now())
                .map(|(t, _)| t.clone())
                .collect();
            for id in due {
                tracing::info!(task = %id, "starting again after a transient failure");
                self.start_one(&id, None)?;
            }
        }
        // A task that failed for good no longer needs its stores; one waiting to start
        // again keeps them.
        self.close_unclaimed();
        Ok(reaped)
    }

    fn schedule_retry(&mut self, id: &TaskId, error: &str) {
        self.board.ended(id, None);
        let attempts = self.retry_counts.get(id).copied().unwrap_or(0) + 1;
        self.retry_counts.insert(id.clone(), attempts);
        let backoff = Duration::from_secs(1)
            .saturating_mul(1 << (attempts - 1).min(6))
            .min(MAX_BACKOFF);
        tracing::warn!(task = %id, attempts, "failed ({error}); starting it again in {backoff:?}");
        self.retrying.insert(id.clone(), (Instant::now() + backoff, attempts));
    }

    /// Starts tasks not running yet (a failed one stays failed; a retrying one starts now),
    /// each on the stores its learner hands over (`handovers`, from
    /// [`stop_standbys`](Self::stop_standbys)) or those it left here when it last ended.
    pub fn start(&mut self, tasks: &[TaskId], handovers: Handovers) -> anyhow::Result<()> {
        let mut handovers: BTreeMap<TaskId, Handover> = handovers.0.into_iter().collect();
        for task in tasks {
            if self.running.contains_key(task) || self.failed.contains_key(task) {
                continue;
            }
            let warm = handovers.remove(task).map(Warm::Handover);
            self.start_one(task, warm)?;
        }
        // Handovers left (a task failed here): their stores close on the state updater.
        Ok(())
    }

    fn start_one(&mut self, task: &TaskId, warm: Option<Warm>) -> anyhow::Result<()> {
        self.collect_returned();
        let warm = warm.or_else(|| self.returned.remove(task).map(Warm::Returned));
        {
            let Some(topology) = self.topologies.get(&*task.topology).cloned() else {
                tracing::warn!(%task, "assigned a task of a topology this worker does not run");
                return Ok(());
            };
            let Some(stage) = topology
                .stages
                .iter()
                .position(|s| s.sub == task.sub && task.partition < s.partitions as u32)
            else {
                tracing::warn!(%task, "assigned a task its topology does not have here");
                return Ok(());
            };
            let control = Arc::new(TaskControl::default());
            let ctx = task::TaskContext {
                topology,
                task: task.clone(),
                stage,
                partition: task.partition as i32,
                producer: self.producer.clone(),
                settings: self.settings.clone(),
                control: control.clone(),
                lease: self.lease.clone(),
                metrics: self.metrics.clone(),
                progress: self.board.clone(),
                kafka: self.kafka.clone(),
                state: self.state.clone(),
                drops: self.drops.clone(),
                warm,
                returns: self.returns.0.clone(),
                schemas: self.schemas.clone(),
            };
            let slot = Arc::new(TaskSlot::default());
            self.streams.submit(ctx, slot.clone());
            self.running.insert(task.clone(), (control, slot));
            self.retrying.remove(task);
        }
        Ok(())
    }

    /// Its stream threads (under exactly-once each has a transactional id of its own:
    /// `task::thread_transactional_id`).
    pub fn threads(&self) -> usize {
        self.settings.threads
    }

    /// Under exactly-once: the Kafka settings and commit interval its transactional
    /// producers are made with.
    pub fn exactly_once(&self) -> Option<(&KafkaSettings, Duration)> {
        (self.settings.guarantee == task::Guarantee::ExactlyOnce)
            .then_some((&self.kafka, self.settings.commit_interval))
    }

    /// The membership lease the tasks obey.
    pub fn lease(&self) -> &Arc<Lease> {
        &self.lease
    }

    /// The membership exactly-once transactions prove.
    pub fn fence(&self) -> &Arc<Fence> {
        &self.fence
    }

    /// Asks tasks to stop — cleanly (finish the batch, commit, close) or, with `abort`,
    /// without committing anything more — and returns them for [`finish`](Self::finish).
    pub fn begin_stop(&mut self, tasks: &[TaskId], abort: bool) -> Stopping {
        let mut stopping = Vec::new();
        for task in tasks {
            // Failed or waiting tasks have no thread: giving them up is forgetting them.
            self.failed.remove(task);
            self.retrying.remove(task);
            self.retry_counts.remove(task);
            if let Some((control, handle)) = self.running.remove(task) {
                if abort {
                    control.abort();
                } else {
                    control.stop();
                }
                stopping.push((task.clone(), (control, handle)));
            }
        }
        Stopping {
            tasks: stopping,
            aborted: abort.into(),
        }
    }

    /// Waits for stopping tasks to end and records how they ended. Errors of aborted tasks
    /// (a fenced producer, a delivery that failed after the membership was lost) are not
    /// failures of the task: its new owner carries on.
    pub fn finish(&mut self, stopping: Stopping) {
        let aborted = stopping.aborted.load(std::sync::atomic::Ordering::Relaxed);
        for (task, (_, handle)) in stopping.tasks {
            let id = task.to_string();
            match handle.join() {
                Ok(Ok(summary)) => self.finished.stopped.push((id, summary)),
                Ok(Err(e)) if aborted => {
                    tracing::warn!(task = %id, "aborted; it had also failed: {e}");
                    let summary = TaskSummary {
                        ended: Ended::Aborted,
                        ..Default::default()
                    };
                    self.finished.stopped.push((id, summary));
                }
                Ok(Err(e)) => self.finished.failed.push((id, e.to_string())),
                Err(Panicked) => self
                    .finished
                    .failed
                    .push((id, "its stream thread panicked while running it".to_string())),
            }
        }
    }

    /// Stops tasks cleanly and waits for them.
    pub fn stop(&mut self, tasks: &[TaskId]) {
        let stopping = self.begin_stop(tasks, false);
        self.finish(stopping);
    }

    pub fn stop_all(mut self) -> WorkerReport {
        let all = self.running();
        self.stop(&all);
        for (task, (_, attempts)) in std::mem::take(&mut self.retrying) {
            self.finished.failed.push((
                task.to_string(),
                format!("still failing after {attempts} attempt(s) at shutdown"),
            ));
        }
        let standbys = self.standbys();
        let _ = self.stop_standbys(&standbys, &[]);
        // What ended tasks left behind: their stores and their drops.
        self.collect_returned();
        self.returned.clear();
        self.drops.settle();
        self.finished
    }

    /// What this worker is doing now (for `GET /status` and the metrics).
    pub fn board(&self) -> &Board {
        &self.board
    }

    /// The standby tasks running now.
    pub fn standbys(&self) -> Vec<TaskId> {
        self.standbys.iter().cloned().collect()
    }

    /// Whether any standby (or learner) runs.
    pub fn has_standbys(&self) -> bool {
        !self.standbys.is_empty()
    }

    /// Whether any learner runs (without copying the set).
    pub fn has_learners(&self) -> bool {
        !self.learners.is_empty()
    }

    /// The learner tasks running now (a subset of [`Self::standbys`]).
    pub fn learners(&self) -> Vec<TaskId> {
        self.learners.iter().cloned().collect()
    }

    /// Offset sums of the local state of every task this worker has state for: from the
    /// checkpoints, and for standbys and learners how far they have read now.
    pub fn local_offset_sums(&self) -> Vec<(TaskId, i64)> {
        let topologies: Vec<Arc<DeployedTopology>> = self.topologies.values().cloned().collect();
        let mut sums = standby::local_offset_sums(&self.state.dir, &topologies);
        let live = self.updater.positions();
        for (task, sum) in &mut sums {
            if let Some(&now) = live.get(task) {
                *sum = (*sum).max(now);
            }
        }
        for (task, &now) in &live {
            if !sums.iter().any(|(t, _)| t == task) {
                sums.push((task.clone(), now));
            }
        }
        sums
    }

    /// How far each standby and learner has read (changelog offset sums).
    pub fn standby_positions(&self) -> std::collections::HashMap<TaskId, i64> {
        self.updater.positions()
    }

    /// The changelog partitions of each stateful task (for their end offsets).
    pub fn changelog_partitions(&self) -> Vec<(TaskId, Vec<(String, i32)>)> {
        let mut out = Vec::new();
        for t in self.topologies.values() {
            for stage in &t.stages {
                for task in (0..stage.partitions as u32).map(|p| TaskId::of(&t.name, stage.sub.as_deref(), p)) {
                    let parts: Vec<(String, i32)> = t
                        .changelogs_of(stage)
                        .into_iter()
                        .map(|c| (c.topic, task.partition as i32))
                        .collect();
                    if !parts.is_empty() {
                        out.push((task, parts));
                    }
                }
            }
        }
        out
    }

    /// Runs `standbys` and `learners` (both on the state-updater thread) and stops every
    /// other standby first; a learner that becomes a standby, or the reverse, keeps going.
    pub fn set_standbys(&mut self, standbys: &[TaskId], learners: &[TaskId]) -> anyhow::Result<()> {
        let wanted: std::collections::BTreeSet<&TaskId> = standbys.iter().chain(learners).collect();
        let stop: Vec<TaskId> = self.standbys.iter().filter(|t| !wanted.contains(t)).cloned().collect();
        let _ = self.stop_standbys(&stop, &[]);
        self.learners = learners
            .iter()
            .filter(|t| !self.running.contains_key(*t))
            .cloned()
            .collect();
        let all: Vec<TaskId> = wanted.into_iter().cloned().collect();
        self.start_standbys(&all);
        self.close_unclaimed();
        Ok(())
    }

    /// Starts standbys of `tasks` (each on the stores its task left here, if it did).
    fn start_standbys(&mut self, tasks: &[TaskId]) {
        self.collect_returned();
        for task in tasks {
            if self.standbys.contains(task) || self.running.contains_key(task) {
                continue;
            }
            let Some(topology) = self.topologies.get(&*task.topology).cloned() else {
                continue;
            };
            let Some(stage) = topology.stage_of(task) else {
                tracing::warn!(%task, "a standby of a task its topology does not have here");
                continue;
            };
            let warm = self.returned.remove(task).unwrap_or_default();
            self.updater.add(task.clone(), topology.changelogs_of(stage), warm);
            self.standbys.insert(task.clone());
        }
    }

    /// Takes the stores ended tasks returned since the last look.
    fn collect_returned(&mut self) {
        while let Ok((task, stores)) = self.returns.1.try_recv() {
            if let Some(older) = self.returned.insert(task, stores) {
                self.drops.later(older);
            }
        }
    }

    /// Closes (in the background) the returned stores of tasks that are neither running,
    /// waiting to start again, nor standbys here: nobody here will use them. Called once
    /// an assignment has been carried out, when every task's place is known.
    fn close_unclaimed(&mut self) {
        self.collect_returned();
        let unclaimed: Vec<TaskId> = self
            .returned
            .keys()
            .filter(|t| {
                !self.running.contains_key(*t) && !self.retrying.contains_key(*t) && !self.standbys.contains(*t)
            })
            .cloned()
            .collect();
        for task in unclaimed {
            tracing::debug!(%task, "closing the stores of a task that is no longer here");
            if let Some(stores) = self.returned.remove(&task) {
                self.drops.later(stores);
            }
        }
    }

    /// Makes what these learners applied durable now, in the background, so that taking
    /// their tasks over flushes only what arrives until then.
    pub fn checkpoint_learners(&self, tasks: &[TaskId]) {
        self.updater.checkpoint(tasks);
    }

    /// Stops standbys; their progress is checkpointed and their stores closed on return,
    /// except those of `active_next` (tasks about to start here as active): they read their
    /// changelogs' tail and hand their open stores over in the background, through the
    /// handovers returned, which [`start`](Self::start) gives to the tasks' starts.
    pub fn stop_standbys(&mut self, tasks: &[TaskId], active_next: &[TaskId]) -> Handovers {
        let mut stopping = Vec::new();
        let mut handing_over = Vec::new();
        for task in tasks {
            self.learners.remove(task);
            if self.standbys.remove(task) {
                if active_next.contains(task) {
                    handing_over.push(task.clone());
                } else {
                    stopping.push(task.clone());
                }
            }
        }
        // Those becoming active here hand over while the worker goes on (rejoins); their
        // starts wait for it.
        let handovers = Handovers(self.updater.hand_over(&handing_over));
        for (task, result) in self.updater.remove(&stopping) {
            if let Err(e) = result {
                tracing::warn!(%task, "standby failed: {e}");
            }
        }
        handovers
    }
}

/// Learners' stores on their way to their tasks' starts (see [`TaskRunner::start`]).
#[must_use = "a task started without its learner's handover restores its state itself"]
#[derive(Default)]
pub struct Handovers(Vec<(TaskId, Handover)>);

impl Handovers {
    /// No handover (tasks start on what they left here, or on the disk's stores).
    pub fn none() -> Handovers {
        Handovers::default()
    }
}

/// The global tables `topologies` read: topic → the largest state limit of the topologies
/// reading it.
fn wanted_globals<'a>(topologies: impl IntoIterator<Item = &'a DeployedTopology>) -> BTreeMap<String, u64> {
    let mut wanted = BTreeMap::<String, u64>::new();
    for t in topologies {
        for g in &t.globals {
            let limit = wanted.entry(g.topic.clone()).or_default();
            *limit = (*limit).max(t.state_limit);
        }
    }
    wanted
}
