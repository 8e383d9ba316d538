//! The state updater: standby (and learner) tasks keep a task's stores warm on another
//! worker by tailing their changelogs, and vouch for what was applied with the same
//! checkpoint an active task uses. Promoted to active, the task then replays only what the
//! standby had not read yet.
//!
//! Every standby of a worker runs on one state-updater thread with one consumer for all
//! their changelog partitions: a standby costs its open stores, not a thread and a
//! connection. As on stream threads, a partition whose standby leaves is paused, not
//! unassigned, and sought when a standby of it comes back.
//!
//! The same thread fills and tails the worker's global tables (`state::global`): each
//! reads every partition of its topic, first up to where the topic ended when the table
//! was opened (tasks that read it wait until then), then for as long as a topology reads it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::group::TaskId;
use crate::kafka::{KafkaSettings, OffsetsClient};
use crate::state::checkpoint::Checkpoint;
use crate::state::dir::{offsets_hint, task_dir, write_offsets_hint, StateDir};
use crate::state::engine::{Db, Marker};
use crate::state::global::{GlobalTable, Status};
use crate::state::warm::{handover, Handover, HandoverSender, WarmStores};
use crate::topology::{Changelog, DeployedTopology};

/// How often a standby makes its progress durable.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);
/// Most changelog records applied in one round.
const ROUND_RECORDS: usize = 50_000;
/// Most bytes of keys and values one round holds before it applies them: a global topic
/// is a tenant's, and 50,000 of its records may be a megabyte each.
const ROUND_BYTES: usize = 16 << 20;
/// How many records a round reads between looks at whether a removal waits.
const URGENT_CHECK_EVERY: usize = 512;
/// How long a promoted learner reads its changelogs' tail before it hands its stores over
/// (what is left then, the task restores itself), and how many records at a time.
const CATCH_UP_FOR: Duration = Duration::from_secs(2);
const CATCH_UP_RECORDS: usize = 5_000;
/// How long a catch-up sees nothing before it wakes the fetcher again.
const CATCH_UP_NUDGE: Duration = Duration::from_millis(25);

/// How stopping a standby ended: records it applied, or why it failed.
type Removed = Result<u64, String>;

enum Command {
    /// Start a standby, with its stores if they are open already.
    Add(Arc<DeployedTopology>, TaskId, WarmStores),
    /// Checkpoint and close; the reply (if one is waited for) says how many records it
    /// applied.
    Remove(TaskId, Option<Sender<Removed>>),
    /// Read the changelogs' tail, then hand the open stores to the task that becomes active
    /// here.
    HandOver(TaskId, HandoverSender),
    /// Make what was applied durable now (a learner that caught up: its promotion then
    /// flushes only what arrives until the handover).
    Checkpoint(TaskId),
}

/// How far each standby (or learner) has read: the sum of its stores' next changelog
/// offsets, updated every round (what its lag is measured from).
pub type Positions = Arc<Mutex<HashMap<TaskId, i64>>>;

/// The worker's state-updater thread.
pub struct StandbyUpdater {
    commands: Option<Sender<Command>>,
    thread: Option<std::thread::JoinHandle<()>>,
    positions: Positions,
    /// Set while a removal waits: the thread cuts its round short (a round of 50,000
    /// records held a promoted learner's handover up for 0.16 s).
    urgent: Arc<AtomicBool>,
}

/// How long a standby that failed to start waits before it is tried again: the first
/// wait, doubled after each failure up to the last.
const RETRY_ADD: Duration = Duration::from_secs(1);
const RETRY_ADD_MAX: Duration = Duration::from_secs(30);

impl StandbyUpdater {
    /// Starts the thread; `rate`: most changelog records a second it reads (none: no limit).
    pub fn start(kafka: &KafkaSettings, env: Arc<StateDir>, rate: Option<u64>) -> anyhow::Result<StandbyUpdater> {
        // Learners restore whole stores through this consumer: fetch in large steps, as a
        // restoration does (restore.rs), within a bounded queue. Under a rate, in small
        // steps into a small queue: what librdkafka fetches ahead it fetches at the broker's
        // full speed, whatever the rate of reading it.
        let (fetch, partition_fetch, queue_kb) = match rate {
            None => (32 << 20, 4 << 20, 64 << 10),
            Some(_) => (4 << 20, 1 << 20, 4 << 10),
        };
        let consumer: BaseConsumer = kafka
            .client()
            .set("client.id", "sluice-standby")
            .set("fetch.max.bytes", fetch.to_string())
            .set("max.partition.fetch.bytes", partition_fetch.to_string())
            .set("queued.max.messages.kbytes", queue_kb.to_string())
            // A partition whose queue is full is fetched again after this long, not after
            // librdkafka's default second: learners read faster than the queue refills.
            .set("fetch.queue.backoff.ms", "10")
            .set("group.id", "sluice.restore")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .set("isolation.level", "read_committed")
            // A partition added (a new learner) is fetched only with the next request, once
            // the one in flight returns: a broker holds an empty fetch this long (500 ms by
            // default), which a promoted learner's catch-up and a new learner would wait for.
            .set("fetch.wait.max.ms", "20")
            .create()?;
        // Changelog bounds are read on a connection of their own: on the tailing consumer's
        // they would queue behind its long-polling fetch (half a second per standby).
        let bounds = OffsetsClient::new(kafka, "sluice-standby-offsets", "sluice.restore");
        let (tx, rx) = mpsc::channel();
        let positions = Positions::default();
        let shared = positions.clone();
        let urgent = Arc::new(AtomicBool::new(false));
        let urgent_here = urgent.clone();
        let thread = std::thread::Builder::new().name("standbys".into()).spawn(move || {
            Updater {
                consumer,
                bounds,
                retries: Vec::new(),
                env,
                standbys: HashMap::new(),
                routes: HashMap::new(),
                globals: HashMap::new(),
                waiting: Vec::new(),
                assigned: HashSet::new(),
                known_topics: HashSet::new(),
                positions: shared,
                urgent: urgent_here,
                rate: rate.map(|r| r as f64),
            }
            .run(rx)
        })?;
        Ok(StandbyUpdater {
            commands: Some(tx),
            thread: Some(thread),
            positions,
            urgent,
        })
    }

    /// How far each standby has read (changelog offset sums), as of its last round.
    pub fn positions(&self) -> HashMap<TaskId, i64> {
        self.positions.lock().expect("positions lock").clone()
    }

    /// Starts keeping `task` of `topology` warm, on `warm` (its stores open already) where
    /// given (failures are logged: a standby never affects active tasks).
    pub fn add(&self, topology: Arc<DeployedTopology>, task: TaskId, warm: WarmStores) {
        if let Some(tx) = &self.commands {
            let _ = tx.send(Command::Add(topology, task, warm));
        }
    }

    /// Makes what these standbys applied durable, in the background.
    pub fn checkpoint(&self, tasks: &[TaskId]) {
        if let Some(tx) = &self.commands {
            for task in tasks {
                let _ = tx.send(Command::Checkpoint(task.clone()));
            }
        }
    }

    /// Stops learners (or standbys) whose tasks become active here, without waiting: each
    /// reads its changelogs' tail, then sends its open stores through its [`Handover`], for
    /// which the task's start waits, not the group: the worker rejoins meanwhile, so the
    /// next step of a migration does not wait for this one.
    pub fn hand_over(&self, tasks: &[TaskId]) -> Vec<(TaskId, Handover)> {
        let Some(commands) = &self.commands else {
            return Vec::new();
        };
        let mut handovers = Vec::new();
        for task in tasks {
            let (sender, receiver) = handover();
            // A thread that has ended drops the sender: the start opens the stores on disk.
            let _ = commands.send(Command::HandOver(task.clone(), sender));
            handovers.push((task.clone(), receiver));
        }
        if !tasks.is_empty() {
            self.urgent.store(true, Ordering::Release);
        }
        handovers
    }

    /// Stops standbys: their progress is checkpointed and their stores closed before this
    /// returns (for those whose tasks become active here, see [`hand_over`](Self::hand_over)).
    /// Per task, records applied or why it failed. All are asked at once, so the thread stops
    /// them in one go.
    pub fn remove(&self, tasks: &[TaskId]) -> Vec<(TaskId, Result<u64, String>)> {
        let ended = || Err("the standby thread has ended".to_string());
        let Some(commands) = &self.commands else {
            return tasks.iter().map(|t| (t.clone(), Ok(0))).collect();
        };
        let replies: Vec<(TaskId, Option<Receiver<Removed>>)> = tasks
            .iter()
            .map(|task| {
                let (tx, rx) = mpsc::channel();
                let sent = commands.send(Command::Remove(task.clone(), Some(tx))).is_ok();
                (task.clone(), sent.then_some(rx))
            })
            .collect();
        // After the sends: the thread clears the flag before it takes commands, so one
        // set now is seen either by that take or by the round after it.
        if !tasks.is_empty() {
            self.urgent.store(true, Ordering::Release);
        }
        replies
            .into_iter()
            .map(|(task, rx)| {
                let result = rx.map_or_else(ended, |rx| rx.recv().unwrap_or_else(|_| ended()));
                (task, result)
            })
            .collect()
    }
}

impl Drop for StandbyUpdater {
    fn drop(&mut self) {
        self.commands = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One store of a standby: its database and the next changelog offset to apply.
struct Tailed {
    changelog: Changelog,
    db: Db,
    position: i64,
    pending: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// Who reads a partition the updater consumes.
#[derive(Clone)]
enum Route {
    /// A standby's store (by index).
    Standby(TaskId, usize),
    /// The global table of the partition's topic.
    Global,
}

/// A global table being filled or tailed.
struct Global {
    table: Arc<GlobalTable>,
    /// The next offset to read of each partition (applied, or pending below).
    positions: BTreeMap<i32, i64>,
    /// Until the table is ready: where each partition ended when it was opened.
    targets: Option<BTreeMap<i32, i64>>,
    /// Records to read until ready (for the progress tasks see).
    total: u64,
    pending: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    applied: u64,
    last_checkpoint: Instant,
    /// Stopped (failed, or over its limit): no longer applied.
    stopped: bool,
}

/// Consecutive records of one changelog partition, read in a round.
#[derive(Default)]
struct Run {
    topic: String,
    partition: i32,
    /// Its reader; none: nobody wants it (any more).
    route: Option<Route>,
    /// The next offset after the last record read.
    position: i64,
    records: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl Run {
    fn is(&self, topic: &str, partition: i32) -> bool {
        self.route.is_some() && self.partition == partition && self.topic == topic
    }
}

struct Standby {
    dir: PathBuf,
    partition: i32,
    stores: Vec<Tailed>,
    applied: u64,
    last_checkpoint: Instant,
    /// The first failure; the standby stops applying and reports it when removed.
    failed: Option<String>,
}

/// A standby that failed to start, tried again `at`.
struct Retry {
    at: Instant,
    /// How long to wait if it fails again.
    next_wait: Duration,
    topology: Arc<DeployedTopology>,
    task: TaskId,
}

struct Updater {
    consumer: BaseConsumer,
    /// Reads changelog bounds (low and high offsets) and global topics' metadata.
    bounds: OffsetsClient,
    /// Standbys and learners that failed to start, and when to try again.
    retries: Vec<Retry>,
    env: Arc<StateDir>,
    standbys: HashMap<TaskId, Standby>,
    /// (changelog or global topic, partition) → who reads it.
    routes: HashMap<(String, i32), Route>,
    /// Global tables, by topic.
    globals: HashMap<String, Global>,
    /// Tables that could not be started yet (their topic's offsets unread): tried again.
    waiting: Vec<(Arc<GlobalTable>, Instant)>,
    assigned: HashSet<(String, i32)>,
    /// Topics whose metadata the consumer has read (see [`Updater::assign`]).
    known_topics: HashSet<String>,
    positions: Positions,
    /// A removal waits: end the round early (see [`StandbyUpdater`]).
    urgent: Arc<AtomicBool>,
    /// Most changelog records a second (none: as fast as they come): each round reads a
    /// twentieth of a second's worth, then waits out the rest of its time.
    rate: Option<f64>,
}

impl Updater {
    fn run(mut self, commands: Receiver<Command>) {
        loop {
            self.follow_globals();
            self.retry_adds();
            // Cleared before the commands are taken: a removal sent after this is seen by
            // the next round.
            self.urgent.store(false, Ordering::Release);
            // Promoted learners, handed over together once the commands waiting are taken
            // (see `hand_over_all`).
            let mut handovers: Vec<(TaskId, HandoverSender)> = Vec::new();
            loop {
                let idle = self.standbys.is_empty() && self.globals.is_empty() && handovers.is_empty();
                let command = if idle {
                    match commands.recv_timeout(Duration::from_millis(100)) {
                        Ok(c) => c,
                        // Idle, as before global tables, unless one was opened meanwhile.
                        Err(RecvTimeoutError::Timeout) if self.env.globals.has_changes() => break,
                        Err(RecvTimeoutError::Timeout) => continue,
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                } else {
                    match commands.try_recv() {
                        Ok(c) => c,
                        Err(mpsc::TryRecvError::Empty) => break,
                        Err(mpsc::TryRecvError::Disconnected) => {
                            let all: Vec<TaskId> = self.standbys.keys().cloned().collect();
                            for task in all {
                                let _ = self.remove(&task, false);
                            }
                            let topics: Vec<String> = self.globals.keys().cloned().collect();
                            for topic in topics {
                                self.remove_global(&topic);
                            }
                            return;
                        }
                    }
                };
                let command = match command {
                    Command::HandOver(task, sender) => {
                        handovers.push((task, sender));
                        continue;
                    }
                    // Anything else comes after the handovers sent before it.
                    other => {
                        self.hand_over_all(std::mem::take(&mut handovers));
                        other
                    }
                };
                match command {
                    Command::Add(topology, task, warm) => self.add_or_retry(topology, task, warm, RETRY_ADD),
                    Command::HandOver(..) => unreachable!("taken above"),
                    Command::Remove(task, reply) => {
                        self.retries.retain(|r| r.task != task);
                        let result = self.remove(&task, false).map(|(applied, _)| applied);
                        if let Some(reply) = reply {
                            let _ = reply.send(result);
                        } else if let Err(e) = result {
                            tracing::warn!(%task, "standby failed: {e}");
                        }
                    }
                    Command::Checkpoint(task) => {
                        if let Some(standby) = self.standbys.get_mut(&task).filter(|s| s.failed.is_none()) {
                            let result =
                                apply_standby(standby).and_then(|()| checkpoint_standby(&self.consumer, standby, true));
                            if let Err(e) = result {
                                tracing::warn!(%task, "standby failed: {e}");
                                standby.failed = Some(e);
                            }
                        }
                    }
                }
            }
            self.hand_over_all(handovers);
            self.round();
        }
    }

    /// Hands promoted learners' stores to their tasks, all at once: their changelogs' tails
    /// are read together, then each is stopped and its stores sent to its task. One
    /// after another, the last of four promoted together waited 0.14 s for the others (each
    /// read its tail with the rest paused, then resumed them).
    fn hand_over_all(&mut self, batch: Vec<(TaskId, HandoverSender)>) {
        if batch.is_empty() {
            return;
        }
        let began = Instant::now();
        let tasks: Vec<TaskId> = batch.iter().map(|(t, _)| t.clone()).collect();
        // A promoted learner reads what the old owner wrote since its last round on this
        // thread's consumer (connected, the partition fetched already), so the task starts
        // on a store at the changelog's end instead of restoring the tail on a new client.
        let (caught_up, paused) = self.catch_up(&tasks);
        let catch_up_ms = began.elapsed().as_millis() as u64;
        for (task, sender) in batch {
            self.retries.retain(|r| r.task != task);
            match self.remove(&task, true) {
                Ok((_, stores)) => sender.send(stores),
                // Its stores are closed by now: the sender goes after them, and the task
                // opens what is on disk.
                Err(e) => tracing::warn!(%task, "learner failed: {e}; the task restores its state itself"),
            }
            tracing::debug!(
                target: "handover", task = %task, caught_up = caught_up.get(&task).copied().unwrap_or(0),
                together = tasks.len(), catch_up_ms, ms = began.elapsed().as_millis() as u64, "learner handed over"
            );
        }
        // The others go on once the tasks have their stores: waking the fetcher waits for a
        // broker's answer, behind a fetch in flight.
        self.resume(&paused);
    }

    /// Resumes partitions paused for a catch-up (see `crate::kafka::wake_fetcher`).
    fn resume(&mut self, paused: &TopicPartitionList) {
        if paused.count() > 0 {
            let _ = self.consumer.resume(paused);
            if let Some(p) = paused.elements().first() {
                crate::kafka::wake_fetcher(&self.consumer, p.topic(), p.partition());
            }
        }
    }

    /// Starts a standby or learner; one that fails (a changelog's offsets unread, its
    /// store busy) is tried again a second later, then after twice as long each time (up
    /// to [`RETRY_ADD_MAX`]), until it starts or is removed: a transient error must not
    /// leave the worker without it until the next assignment. (Its warm stores close on a
    /// failure; the next attempt opens them again.)
    fn add_or_retry(&mut self, topology: Arc<DeployedTopology>, task: TaskId, warm: WarmStores, wait: Duration) {
        if let Err(e) = self.add(&topology, &task, warm) {
            // Logged at each attempt: a lasting failure once every 30 s.
            tracing::warn!(%task, "standby failed to start: {e}; trying again in {wait:?}");
            self.retries.push(Retry {
                at: Instant::now() + wait,
                next_wait: (wait * 2).min(RETRY_ADD_MAX),
                topology,
                task,
            });
        }
    }

    /// Tries again the standbys whose time has come.
    fn retry_adds(&mut self) {
        if self.retries.is_empty() {
            return;
        }
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.retries).into_iter().partition(|r| r.at <= now);
        self.retries = later;
        for r in due {
            self.add_or_retry(r.topology, r.task, WarmStores::new(), r.next_wait);
        }
    }

    fn add(&mut self, topology: &DeployedTopology, task: &TaskId, mut warm: WarmStores) -> Result<(), String> {
        let task = task.clone();
        if self.standbys.contains_key(&task) {
            return Ok(());
        }
        let Some(stage) = topology.stage_of(&task) else {
            return Err(format!("topology {} has no task {task}", topology.name));
        };
        let partition = task.partition as i32;
        let label = task.to_string();
        let dir = task_dir(&self.env.dir, &task);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let mut stores = Vec::new();
        for changelog in &topology.changelogs_of(stage) {
            let bounds = self
                .bounds
                .ask(|c| c.fetch_watermarks(&changelog.topic, partition, Duration::from_secs(15)))
                .map_err(|e| format!("reading the offsets of changelog {}/{partition}: {e}", changelog.topic))?;
            let warm = warm.remove(&changelog.store);
            let (db, from) = self
                .env
                .prepare_store(&label, &dir, changelog, partition, bounds, warm)?;
            stores.push(Tailed {
                changelog: changelog.clone(),
                db,
                position: from,
                pending: Vec::new(),
            });
        }
        let mut fresh = TopicPartitionList::new();
        for (index, store) in stores.iter().enumerate() {
            let key = (store.changelog.topic.clone(), partition);
            self.routes.insert(key.clone(), Route::Standby(task.clone(), index));
            let offset = Offset::Offset(store.position);
            if self.assigned.contains(&key) {
                let mut one = TopicPartitionList::new();
                let _ = one.add_partition(&key.0, partition);
                self.consumer
                    .seek(&key.0, partition, offset, Duration::from_secs(10))
                    .and_then(|()| self.consumer.resume(&one))
                    .map_err(|e| format!("positioning changelog {}/{partition}: {e}", key.0))?;
            } else {
                let _ = fresh.add_partition_offset(&key.0, partition, offset);
                self.assigned.insert(key);
            }
        }
        if fresh.count() > 0 {
            self.assign(&fresh).map_err(|e| format!("assigning changelogs: {e}"))?;
        }
        if fresh.count() < stores.len() {
            // Sought and resumed: see `crate::kafka::wake_fetcher`.
            let (topic, partition) = (&stores[0].changelog.topic, partition);
            crate::kafka::wake_fetcher(&self.consumer, topic, partition);
        }
        tracing::info!(task = %task, stores = stores.len(), "standby started");
        self.standbys.insert(
            task,
            Standby {
                dir,
                partition,
                stores,
                applied: 0,
                last_checkpoint: Instant::now(),
                failed: None,
            },
        );
        Ok(())
    }

    /// Stops a standby: checkpointed and closed, or (`hand_over`, its tail read already by
    /// [`catch_up`](Self::catch_up)) checkpointed and its open stores returned, for its task.
    /// Returns how many records it applied. On an error its stores are closed by the time
    /// this returns.
    fn remove(&mut self, task: &TaskId, hand_over: bool) -> Result<(u64, WarmStores), String> {
        let Some(mut standby) = self.standbys.remove(task) else {
            return Ok((0, WarmStores::new()));
        };
        let mut paused = TopicPartitionList::new();
        for store in &standby.stores {
            let key = (store.changelog.topic.clone(), standby.partition);
            self.routes.remove(&key);
            let _ = paused.add_partition(&key.0, key.1);
        }
        let _ = self.consumer.pause(&paused);
        if let Some(e) = standby.failed.take() {
            return Err(e);
        }
        let began = Instant::now();
        self.apply(&mut standby)?;
        let applied_ms = began.elapsed().as_millis() as u64;
        // Handed over, the stores are flushed in the background: the task's first commit
        // waits for that flush (`TaskStore::commit`), its start does not.
        checkpoint_standby(&self.consumer, &mut standby, !hand_over)?;
        if hand_over {
            tracing::debug!(
                target: "handover", task = %task, apply_ms = applied_ms,
                checkpoint_ms = began.elapsed().as_millis() as u64 - applied_ms, "learner stopped"
            );
        }
        tracing::info!(task = %task, applied = standby.applied, handed_over = hand_over, "standby stopped");
        let applied = standby.applied;
        if !hand_over {
            // Closed here, before the reply: the task may be opened as active next.
            return Ok((applied, WarmStores::new()));
        }
        let stores = standby
            .stores
            .into_iter()
            .map(|store| (store.changelog.store, store.db))
            .collect();
        Ok((applied, stores))
    }

    /// Reads what the changelogs hold (up to a round) and applies it to the stores.
    fn round(&mut self) {
        // Short: commands (a learner promoted, whose task waits to open its stores) are
        // taken between rounds.
        let began = Instant::now();
        let max = match self.rate {
            Some(rate) => ((rate / 20.0) as usize).clamp(1, ROUND_RECORDS),
            None => ROUND_RECORDS,
        };
        let read = self.read(max, Duration::from_millis(20), true);
        // A removal waits (a promoted learner's task waits for its store): what was read
        // stays pending and is applied next round. Applying a round of three learners'
        // records held a handover up for 0.16 s.
        if self.urgent.load(Ordering::Acquire) {
            return;
        }
        self.apply_all(true);
        self.publish_positions();
        if let Some(rate) = self.rate {
            let due = Duration::from_secs_f64(read as f64 / rate);
            while began.elapsed() < due && !self.urgent.load(Ordering::Acquire) {
                std::thread::sleep((due - began.elapsed()).min(Duration::from_millis(5)));
            }
        }
    }

    /// Reads what the changelogs hold for their standbys and tables, up to `max` records
    /// (and [`ROUND_BYTES`]), waiting up to `wait` for the first; stops early for a waiting
    /// removal if `yield_to_removals`. What is read waits in the stores' pending writes.
    fn read(&mut self, max: usize, wait: Duration, yield_to_removals: bool) -> usize {
        let mut wait = wait;
        let mut read = 0;
        // Records come in runs of one partition: they collect in `run` and go to their
        // store when the partition changes, so routing costs a lookup per run, not per
        // record (per record it was most of this thread's time).
        let mut run = Run::default();
        let mut bytes = 0;
        while read < max && bytes < ROUND_BYTES {
            if yield_to_removals && read % URGENT_CHECK_EVERY == 0 && read > 0 && self.urgent.load(Ordering::Acquire) {
                break;
            }
            let Some(polled) = self.consumer.poll(wait) else { break };
            wait = Duration::ZERO;
            read += 1;
            let m = match polled {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!("standby consumer: {e}");
                    break;
                }
            };
            if !run.is(m.topic(), m.partition()) {
                end_run(&mut self.standbys, &mut self.globals, &mut run);
                run.topic.clear();
                run.topic.push_str(m.topic());
                run.partition = m.partition();
                run.route = self.routes.get(&(run.topic.clone(), run.partition)).cloned();
            }
            if run.route.is_none() {
                continue;
            }
            run.position = m.offset() + 1;
            if let Some(key) = m.key() {
                bytes += key.len() + m.payload().map_or(0, <[u8]>::len);
                run.records.push((key.to_vec(), m.payload().map(<[u8]>::to_vec)));
            }
        }
        end_run(&mut self.standbys, &mut self.globals, &mut run);
        read
    }

    /// Applies what was read to the tables and standbys (checkpointing those due).
    fn apply_all(&mut self, yield_to_removals: bool) {
        self.apply_globals();
        let tasks: Vec<TaskId> = self.standbys.keys().cloned().collect();
        for task in tasks {
            if yield_to_removals && self.urgent.load(Ordering::Acquire) {
                // The rest next round (see `round`).
                break;
            }
            let standby = self.standbys.get_mut(&task).expect("listed above");
            if standby.failed.is_some() {
                continue;
            }
            let mut result = apply_standby(standby);
            if result.is_ok() && standby.last_checkpoint.elapsed() >= CHECKPOINT_EVERY {
                result = checkpoint_standby(&self.consumer, standby, true);
            }
            if let Err(e) = result {
                tracing::warn!(%task, "standby failed: {e}");
                standby.failed = Some(e);
            }
        }
    }

    /// Reads the changelogs of `tasks` up to where they end now (or for at most
    /// [`CATCH_UP_FOR`]); returns how many records that took, per task. Called when the
    /// tasks become active here: their old owners have made their last commits, so the ends
    /// read now are the tasks' whole state. The other partitions are left paused: the
    /// second list, for [`resume`](Self::resume).
    fn catch_up(&mut self, tasks: &[TaskId]) -> (HashMap<TaskId, u64>, TopicPartitionList) {
        // Where every tail ends, in one request (one round trip for all the tasks).
        let mut list = TopicPartitionList::new();
        for task in tasks {
            if let Some(standby) = self.standbys.get(task).filter(|s| s.failed.is_none()) {
                for store in &standby.stores {
                    let _ = list.add_partition_offset(&store.changelog.topic, standby.partition, Offset::End);
                }
            }
        }
        let found = if list.count() == 0 {
            TopicPartitionList::new()
        } else {
            let ends = self.bounds.ask(|c| {
                let found = c
                    .offsets_for_times(list.clone(), Duration::from_secs(5))
                    .map_err(|e| e.to_string())?;
                match found
                    .elements()
                    .iter()
                    .find(|e| e.error().is_err() || !matches!(e.offset(), Offset::Offset(_)))
                {
                    Some(e) => Err(format!("{}/{}: {:?}", e.topic(), e.partition(), e.error())),
                    None => Ok(found),
                }
            });
            match ends {
                Ok(found) => found,
                Err(e) => {
                    // The tasks restore what is missing themselves.
                    tracing::debug!("reading where the promoted learners' changelogs end: {e}");
                    TopicPartitionList::new()
                }
            }
        };
        let mut targets: Vec<(TaskId, Vec<(String, i64)>)> = Vec::new();
        'task: for task in tasks {
            let Some(standby) = self.standbys.get(task).filter(|s| s.failed.is_none()) else {
                continue;
            };
            let mut ends = Vec::new();
            for store in &standby.stores {
                let topic = &store.changelog.topic;
                match found.find_partition(topic, standby.partition).map(|e| e.offset()) {
                    Some(Offset::Offset(end)) => ends.push((topic.clone(), end)),
                    _ => continue 'task,
                }
            }
            targets.push((task.clone(), ends));
        }
        let count = |s: &Self, task: &TaskId| {
            s.standbys.get(task).map_or(0, |s| {
                s.applied + s.stores.iter().map(|w| w.pending.len() as u64).sum::<u64>()
            })
        };
        let total = |s: &Self| targets.iter().map(|(t, _)| count(s, t)).sum::<u64>();
        let before: HashMap<TaskId, u64> = targets.iter().map(|(t, _)| (t.clone(), count(self, t))).collect();
        // The other partitions wait meanwhile: learners restoring in bulk fill the consumer's
        // queue, and the tails would come only after everything queued ahead of them (0.2 s
        // with three learners restoring). Pausing drops what they have queued; resumed, they
        // fetch it again from where they were read up to.
        let mut others = TopicPartitionList::new();
        for ((topic, p), route) in &self.routes {
            let theirs = match route {
                Route::Standby(task, _) => targets.iter().any(|(t, _)| t == task),
                _ => false,
            };
            if !theirs {
                let _ = others.add_partition(topic, *p);
            }
        }
        let _ = self.consumer.pause(&others);
        let deadline = Instant::now() + CATCH_UP_FOR;
        let mut last = (total(self), Instant::now());
        while !targets.iter().all(|(t, ends)| self.reached(t, ends)) && Instant::now() < deadline {
            self.read(CATCH_UP_RECORDS, Duration::from_millis(5), false);
            let now = total(self);
            if now != last.0 {
                last = (now, Instant::now());
            } else if last.1.elapsed() >= CATCH_UP_NUDGE {
                // Nothing came: the fetcher may be asleep (see `crate::kafka::wake_fetcher`;
                // one request wakes the thread of a broker, which fetches all it leads).
                let behind = targets.iter().find(|(t, ends)| !self.reached(t, ends));
                if let Some((task, ends)) = behind {
                    if let (Some(standby), Some((topic, _))) = (self.standbys.get(task), ends.first()) {
                        crate::kafka::wake_fetcher(&self.consumer, topic, standby.partition);
                    }
                }
                last.1 = Instant::now();
            }
            // Everyone's reads are applied as they come, so that nothing waits unbounded.
            self.apply_all(false);
        }
        let caught_up = targets
            .iter()
            .map(|(t, _)| (t.clone(), count(self, t).saturating_sub(before[t])))
            .collect();
        (caught_up, others)
    }

    /// Adds partitions to the consumer. A topic it has no metadata for would be fetched only
    /// after librdkafka's next metadata refresh, about a second later (a promoted learner
    /// that had just started waited for it): one metadata request per topic first.
    fn assign(&mut self, fresh: &TopicPartitionList) -> rdkafka::error::KafkaResult<()> {
        for e in fresh.elements() {
            let topic = e.topic();
            if !self.known_topics.contains(topic) {
                match self.consumer.fetch_metadata(Some(topic), Duration::from_secs(5)) {
                    Ok(_) => {
                        self.known_topics.insert(topic.to_string());
                    }
                    Err(e) => tracing::debug!(%topic, "reading the topic's metadata before fetching it: {e}"),
                }
            }
        }
        self.consumer.incremental_assign(fresh)
    }

    /// Whether `task`'s stores have read their changelogs up to `targets` (topic, end).
    /// Offsets can have gaps (compaction, transaction markers): the consumer's position says
    /// how far a partition has been read.
    fn reached(&self, task: &TaskId, targets: &[(String, i64)]) -> bool {
        let Some(standby) = self.standbys.get(task).filter(|s| s.failed.is_none()) else {
            return true;
        };
        let positions = self.consumer.position().ok();
        targets.iter().all(|(topic, end)| {
            let stored = standby
                .stores
                .iter()
                .find(|w| &w.changelog.topic == topic)
                .map_or(0, |w| w.position);
            let consumed = positions
                .as_ref()
                .and_then(|tpl| tpl.find_partition(topic, standby.partition))
                .and_then(|p| match p.offset() {
                    Offset::Offset(o) => Some(o),
                    _ => None,
                })
                .unwrap_or(0);
            stored.max(consumed) >= *end
        })
    }

    /// Shares how far each standby has read. Offsets can have gaps (compaction,
    /// transaction markers): the consumer's position says how far a partition was read.
    fn publish_positions(&mut self) {
        let consumed = self.consumer.position().ok();
        let mut out = HashMap::with_capacity(self.standbys.len());
        for (task, standby) in &mut self.standbys {
            let mut sum = 0;
            for store in &mut standby.stores {
                if let Some(Offset::Offset(p)) = consumed
                    .as_ref()
                    .and_then(|tpl| tpl.find_partition(&store.changelog.topic, standby.partition))
                    .map(|p| p.offset())
                {
                    // Applied already, or applied next (pending goes in with this round).
                    if store.pending.is_empty() {
                        store.position = store.position.max(p);
                    }
                }
                sum += store.position;
            }
            out.insert(task.clone(), sum);
        }
        *self.positions.lock().expect("positions lock") = out;
    }

    fn apply(&self, standby: &mut Standby) -> Result<(), String> {
        apply_standby(standby)
    }

    /// Starts the global tables opened since the last round (and those that could not
    /// start before), and stops those no topology reads any more.
    fn follow_globals(&mut self) {
        let (added, removed) = self.env.globals.take_changes();
        for topic in removed {
            self.waiting.retain(|(t, _)| t.topic != topic);
            self.remove_global(&topic);
        }
        let now = Instant::now();
        let mut due: Vec<Arc<GlobalTable>> = added;
        let (ready, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|(_, at)| *at <= now);
        self.waiting = later;
        due.extend(ready.into_iter().map(|(t, _)| t));
        for table in due {
            if let Err(e) = self.add_global(table.clone()) {
                tracing::warn!(topic = %table.topic, "global table not started yet (trying again in 2 s): {e}");
                self.waiting.push((table, now + Duration::from_secs(2)));
            }
        }
    }

    fn add_global(&mut self, table: Arc<GlobalTable>) -> Result<(), String> {
        let topic = table.topic.clone();
        if self.globals.contains_key(&topic) {
            self.remove_global(&topic);
        }
        let wait = Duration::from_secs(15);
        let partitions = self
            .bounds
            .ask(|c| {
                let metadata = c.fetch_metadata(Some(&topic), wait).map_err(|e| e.to_string())?;
                let partitions: Vec<i32> = metadata
                    .topics()
                    .iter()
                    .filter(|t| t.name() == topic && t.error().is_none())
                    .flat_map(|t| t.partitions().iter().map(|p| p.id()))
                    .collect();
                if partitions.is_empty() {
                    return Err("no partitions in the metadata".to_string());
                }
                Ok(partitions)
            })
            .map_err(|e| format!("reading the metadata of topic {topic:?}: {e}"))?;
        let mut bounds = BTreeMap::new();
        for &p in &partitions {
            let b = self
                .bounds
                .ask(|c| c.fetch_watermarks(&topic, p, wait))
                .map_err(|e| format!("reading the offsets of {topic}/{p}: {e}"))?;
            bounds.insert(p, b);
        }
        let mut stored = table.positions()?;
        // A position the topic no longer has (re-created, truncated): what the table holds
        // cannot be vouched for, so it is read again from the start.
        let outside = stored.iter().any(|(p, &pos)| match bounds.get(p) {
            Some(&(low, high)) => pos < low || pos > high,
            None => true,
        });
        if outside {
            tracing::warn!(topic = %topic, "global table: positions outside the topic, reading it again from the start");
            table.wipe()?;
            stored.clear();
        }
        let positions: BTreeMap<i32, i64> = bounds
            .iter()
            .map(|(&p, &(low, _))| (p, stored.get(&p).copied().unwrap_or(low).max(low)))
            .collect();
        let targets: BTreeMap<i32, i64> = bounds.iter().map(|(&p, &(_, high))| (p, high)).collect();
        let total: u64 = targets
            .iter()
            .map(|(p, high)| (high - positions[p]).max(0) as u64)
            .sum();
        let mut fresh = TopicPartitionList::new();
        for (&p, &from) in &positions {
            let key = (topic.clone(), p);
            self.routes.insert(key.clone(), Route::Global);
            if self.assigned.contains(&key) {
                let mut one = TopicPartitionList::new();
                let _ = one.add_partition(&topic, p);
                self.consumer
                    .seek(&topic, p, Offset::Offset(from), wait)
                    .and_then(|()| self.consumer.resume(&one))
                    .map_err(|e| format!("positioning {topic}/{p}: {e}"))?;
            } else {
                let _ = fresh.add_partition_offset(&topic, p, Offset::Offset(from));
                self.assigned.insert(key);
            }
        }
        if fresh.count() > 0 {
            self.assign(&fresh)
                .map_err(|e| format!("assigning topic {topic:?}: {e}"))?;
        }
        tracing::info!(topic = %topic, partitions = partitions.len(), to_read = total, "global table started");
        table.set_status(Status::Restoring { restored: 0, total });
        self.globals.insert(
            topic,
            Global {
                table,
                positions,
                targets: Some(targets),
                total,
                pending: Vec::new(),
                applied: 0,
                last_checkpoint: Instant::now(),
                stopped: false,
            },
        );
        Ok(())
    }

    fn remove_global(&mut self, topic: &str) {
        let Some(mut global) = self.globals.remove(topic) else {
            return;
        };
        let mut paused = TopicPartitionList::new();
        for &p in global.positions.keys() {
            self.routes.remove(&(topic.to_string(), p));
            let _ = paused.add_partition(topic, p);
        }
        let _ = self.consumer.pause(&paused);
        if !global.stopped {
            if let Err(e) = checkpoint_global(&mut global) {
                tracing::warn!(topic = %topic, "global table: {e}");
            }
        }
        tracing::info!(topic = %topic, applied = global.applied, "global table stopped");
    }

    /// Applies what each global table read this round; a table that has caught up with
    /// where its topic ended when it was opened becomes ready.
    fn apply_globals(&mut self) {
        if self.globals.is_empty() {
            return;
        }
        // Offsets have gaps (transaction markers, compaction): the consumer's position
        // says how far a partition was read.
        let consumed = self.consumer.position().ok();
        let mut stop = Vec::new();
        for (topic, global) in &mut self.globals {
            if global.stopped {
                continue;
            }
            if global.pending.is_empty() {
                for (p, position) in global.positions.iter_mut() {
                    if let Some(Offset::Offset(at)) = consumed
                        .as_ref()
                        .and_then(|tpl| tpl.find_partition(topic, *p))
                        .map(|e| e.offset())
                    {
                        *position = (*position).max(at);
                    }
                }
            }
            let mut result = Ok(());
            if !global.pending.is_empty() {
                let changes = std::mem::take(&mut global.pending);
                result = global.table.apply(&changes, &global.positions);
                global.applied += changes.len() as u64;
            }
            let caught_up = global.targets.as_ref().is_some_and(|t| {
                t.iter()
                    .all(|(p, high)| global.positions.get(p).is_some_and(|at| at >= high))
            });
            if result.is_ok() && (caught_up || global.last_checkpoint.elapsed() >= CHECKPOINT_EVERY) {
                result = checkpoint_global(global);
            }
            let limit = global.table.limit();
            let bytes = global.table.bytes();
            if result.is_ok() && bytes > limit {
                let e = format!(
                    "it takes {bytes} bytes, more than {limit}, the largest state limit of the topologies that \
                     read it (limits.state in their manifests, or the worker's --state-limit)"
                );
                tracing::error!(topic = %topic, "global table stopped: {e}");
                global.table.set_status(Status::OverLimit(e));
                global.stopped = true;
                stop.push(topic.clone());
                continue;
            }
            match result {
                Err(e) => {
                    tracing::error!(topic = %topic, "global table stopped: {e}");
                    global.table.set_status(Status::Failed(e));
                    global.stopped = true;
                    stop.push(topic.clone());
                }
                Ok(()) if caught_up => {
                    tracing::info!(topic = %topic, restored = global.applied, "global table ready");
                    global.targets = None;
                    global.table.set_status(Status::Ready);
                }
                Ok(()) if global.targets.is_some() => global.table.set_status(Status::Restoring {
                    restored: global.applied.min(global.total),
                    total: global.total,
                }),
                Ok(()) => {}
            }
        }
        for topic in stop {
            let mut paused = TopicPartitionList::new();
            for (key, _) in self
                .routes
                .iter()
                .filter(|(k, r)| k.0 == topic && matches!(r, Route::Global))
            {
                let _ = paused.add_partition(&key.0, key.1);
            }
            let _ = self.consumer.pause(&paused);
        }
    }
}

/// Makes what a global table applied durable, with its positions.
fn checkpoint_global(global: &mut Global) -> Result<(), String> {
    global.table.apply(&[], &global.positions)?;
    global.table.flush()?;
    global.last_checkpoint = Instant::now();
    Ok(())
}

/// Hands what a run read to its store.
fn end_run(standbys: &mut HashMap<TaskId, Standby>, globals: &mut HashMap<String, Global>, run: &mut Run) {
    let (task, index) = match run.route.take() {
        None => return,
        Some(Route::Standby(task, index)) => (task, index),
        Some(Route::Global) => {
            match globals.get_mut(&run.topic).filter(|g| !g.stopped) {
                Some(global) => {
                    global.positions.insert(run.partition, run.position);
                    global.pending.append(&mut run.records);
                }
                None => run.records.clear(),
            }
            return;
        }
    };
    let Some(standby) = standbys.get_mut(&task) else {
        run.records.clear();
        return;
    };
    let store = &mut standby.stores[index];
    store.position = run.position;
    if store.pending.is_empty() {
        std::mem::swap(&mut store.pending, &mut run.records);
    } else {
        store.pending.append(&mut run.records);
    }
}

/// Writes what was read for each store, with the marker of how far it got (replayable, so
/// no WAL: the marker goes in the same batch and is flushed with it).
fn apply_standby(standby: &mut Standby) -> Result<(), String> {
    for store in &mut standby.stores {
        if store.pending.is_empty() {
            continue;
        }
        let marker = marker(store);
        let changes = std::mem::take(&mut store.pending);
        store
            .db
            .write_with_marker(
                &mut changes.iter().map(|(k, v)| (k.as_slice(), v.as_deref())),
                &marker,
                false,
            )
            .map_err(|e| format!("store {}: {e}", store.changelog.store))?;
        standby.applied += changes.len() as u64;
    }
    Ok(())
}

fn marker(store: &Tailed) -> Marker {
    Marker {
        topic: store.changelog.topic.clone(),
        topic_id: store.changelog.topic_id.clone(),
        next_offset: store.position,
    }
}

/// Flushes data and markers together and updates the offsets hint the worker reports.
/// Offsets can have gaps (compaction, transaction markers): the consumer's position says
/// how far a partition has been read.
fn checkpoint_standby(consumer: &BaseConsumer, standby: &mut Standby, wait: bool) -> Result<(), String> {
    let positions = consumer.position().ok();
    let mut hint = Checkpoint::new();
    for store in &mut standby.stores {
        if let Some(Offset::Offset(p)) = positions
            .as_ref()
            .and_then(|tpl| tpl.find_partition(&store.changelog.topic, standby.partition))
            .map(|p| p.offset())
        {
            store.position = store.position.max(p);
        }
        store
            .db
            .write_with_marker(&mut std::iter::empty(), &marker(store), false)?;
        store
            .db
            .flush(wait)
            .map_err(|e| format!("standby store {}: {e}", store.changelog.store))?;
        hint.insert(store.changelog.store.clone(), store.position);
    }
    standby.last_checkpoint = Instant::now();
    write_offsets_hint(&standby.dir, &hint)
}

/// Changelog offset sums of the state this worker holds on disk, per task (from the
/// checkpoints), for the assignor to prefer caught-up workers.
pub fn local_offset_sums(state_dir: &Path, topologies: &[Arc<DeployedTopology>]) -> Vec<(TaskId, i64)> {
    let mut out = Vec::new();
    for t in topologies.iter() {
        for task in t.tasks() {
            let keeps_state = t.stage_of(&task).is_some_and(|s| !s.changelogs.is_empty());
            if let Some(c) = offsets_hint(&task_dir(state_dir, &task)).filter(|_| keeps_state) {
                out.push((task, c.values().sum()));
            }
        }
    }
    out
}
