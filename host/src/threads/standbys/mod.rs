//! The state updater of standbys and learners: they keep a task's stores warm on another
//! worker by tailing their changelogs, and vouch for what was applied with the same marker
//! and offsets hint an active task uses. Promoted to active, a learner reads its changelogs'
//! tail and hands its open stores to the task's start (`state::warm`), which then replays
//! only what it had not read.
//!
//! Every standby of a worker runs on this one thread with one consumer for all their
//! changelog partitions: a standby costs its open stores, not a thread and a connection.
//! As on stream threads, a partition whose standby leaves is paused, not unassigned, and
//! sought when a standby of it comes back. Global tables have a thread of their own
//! (`threads/globals.rs`), as in Kafka Streams.
//!
//! The worker talks to the thread through [`StandbyUpdater`] (`updater.rs`). The thread's
//! decisions are methods of [`Standbys`], generic over what it reads ([`Changelogs`]): its
//! unit tests (`tests.rs`) run them on partitions and stores in memory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod updater;

use updater::Command;
pub use updater::{Positions, StandbyUpdater};

use super::changelogs::{Changelogs, Partition};
use crate::group::TaskId;
use crate::state::checkpoint::Checkpoint;
use crate::state::dir::{offsets_hint, task_dir, write_offsets_hint, StateDir};
use crate::state::engine::{Db, Marker};
use crate::state::warm::{HandoverSender, WarmStores};
use crate::topology::{Changelog, DeployedTopology};

/// How often a standby makes its progress durable.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);
/// Most changelog records applied in one round.
const ROUND_RECORDS: usize = 50_000;
/// Most bytes of keys and values one round holds before it applies them.
const ROUND_BYTES: usize = 16 << 20;
/// How many records a round reads between looks at whether a removal waits.
const URGENT_CHECK_EVERY: usize = 512;
/// How long a promoted learner reads its changelogs' tail before it hands its stores over
/// (what is left then, the task restores itself), and how many records at a time.
const CATCH_UP_FOR: Duration = Duration::from_secs(2);
const CATCH_UP_RECORDS: usize = 5_000;
/// How long a catch-up sees nothing before it wakes the fetcher again.
const CATCH_UP_NUDGE: Duration = Duration::from_millis(25);
/// How long a standby that failed to start waits before it is tried again: the first
/// wait, doubled after each failure up to the last.
const RETRY_ADD: Duration = Duration::from_secs(1);
const RETRY_ADD_MAX: Duration = Duration::from_secs(30);

/// One store of a standby: its database and the next changelog offset to apply.
struct Tailed {
    changelog: Changelog,
    db: Db,
    position: i64,
    pending: Vec<(Vec<u8>, Option<Vec<u8>>)>,
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
    task: TaskId,
    changelogs: Vec<Changelog>,
}

/// Consecutive records of one changelog partition, read in a round.
#[derive(Default)]
struct Run {
    topic: String,
    partition: i32,
    /// Its standby's store; none: nobody wants it (any more).
    route: Option<(TaskId, usize)>,
    /// The next offset after the last record read.
    position: i64,
    records: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl Run {
    fn is(&self, topic: &str, partition: i32) -> bool {
        self.route.is_some() && self.partition == partition && self.topic == topic
    }
}

/// The standbys of a worker and the consumer that feeds them.
pub(crate) struct Standbys<C> {
    changelogs: C,
    state: Arc<StateDir>,
    standbys: HashMap<TaskId, Standby>,
    /// Changelog partition → the standby's store that reads it.
    routes: HashMap<Partition, (TaskId, usize)>,
    /// Standbys and learners that failed to start, and when to try again.
    retries: Vec<Retry>,
    positions: Positions,
    /// A removal waits: end the round early (see [`StandbyUpdater`]).
    urgent: Arc<AtomicBool>,
    /// Most changelog records a second (none: as fast as they come): each round reads a
    /// twentieth of a second's worth, then waits out the rest of its time.
    rate: Option<f64>,
}

impl<C: Changelogs> Standbys<C> {
    pub(crate) fn new(changelogs: C, state: Arc<StateDir>, rate: Option<u64>) -> Standbys<C> {
        Standbys {
            changelogs,
            state,
            standbys: HashMap::new(),
            routes: HashMap::new(),
            retries: Vec::new(),
            positions: Positions::default(),
            urgent: Arc::new(AtomicBool::new(false)),
            rate: rate.map(|r| r as f64),
        }
    }

    fn run(mut self, commands: Receiver<Command>) {
        loop {
            self.retry_adds();
            // Cleared before the commands are taken: a removal sent after this is seen by
            // the next round.
            self.urgent.store(false, Ordering::Release);
            let Some(handovers) = self.take_commands(&commands) else {
                let all: Vec<TaskId> = self.standbys.keys().cloned().collect();
                for task in all {
                    let _ = self.remove(&task, false);
                }
                return;
            };
            self.hand_over_all(handovers);
            self.round();
        }
    }

    /// Carries out the commands waiting (waiting for one while there is nothing else to
    /// do); returns the promoted learners to hand over together (see
    /// [`hand_over_all`](Self::hand_over_all)), or none once the worker has let go of the
    /// thread.
    fn take_commands(&mut self, commands: &Receiver<Command>) -> Option<Vec<(TaskId, HandoverSender)>> {
        let mut handovers: Vec<(TaskId, HandoverSender)> = Vec::new();
        loop {
            let command = if self.standbys.is_empty() && handovers.is_empty() {
                match commands.recv_timeout(Duration::from_millis(100)) {
                    Ok(c) => c,
                    Err(RecvTimeoutError::Timeout) if self.retries.is_empty() => continue,
                    Err(RecvTimeoutError::Timeout) => return Some(handovers),
                    Err(RecvTimeoutError::Disconnected) => return None,
                }
            } else {
                match commands.try_recv() {
                    Ok(c) => c,
                    Err(mpsc::TryRecvError::Empty) => return Some(handovers),
                    Err(mpsc::TryRecvError::Disconnected) => return None,
                }
            };
            if let Command::HandOver(task, sender) = command {
                handovers.push((task, sender));
                continue;
            }
            // Anything else comes after the handovers sent before it.
            self.hand_over_all(std::mem::take(&mut handovers));
            self.carry_out(command);
        }
    }

    fn carry_out(&mut self, command: Command) {
        match command {
            Command::Add(task, changelogs, warm) => self.add_or_retry(task, changelogs, warm, RETRY_ADD),
            Command::HandOver(task, sender) => self.hand_over_all(vec![(task, sender)]),
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
                let positions = self.changelogs.positions();
                if let Some(standby) = self.standbys.get_mut(&task).filter(|s| s.failed.is_none()) {
                    let result = apply_standby(standby).and_then(|()| checkpoint_standby(&positions, standby, true));
                    if let Err(e) = result {
                        tracing::warn!(%task, "standby failed: {e}");
                        standby.failed = Some(e);
                    }
                }
            }
        }
    }

    /// Hands promoted learners' stores to their tasks, all at once: their changelogs' tails
    /// are read together, then each is stopped and its stores sent to its task. One after
    /// another, the last of four promoted together waited 0.14 s for the others (each read
    /// its tail with the rest paused, then resumed them).
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
        self.changelogs.resume(&paused);
    }

    /// Starts a standby or learner; one that fails (a changelog's offsets unread, its
    /// store busy) is tried again a second later, then after twice as long each time (up
    /// to [`RETRY_ADD_MAX`]), until it starts or is removed: a transient error must not
    /// leave the worker without it until the next assignment. (Its warm stores close on a
    /// failure; the next attempt opens them again.)
    fn add_or_retry(&mut self, task: TaskId, changelogs: Vec<Changelog>, warm: WarmStores, wait: Duration) {
        if let Err(e) = self.add(&task, &changelogs, warm) {
            // Logged at each attempt: a lasting failure once every 30 s.
            tracing::warn!(%task, "standby failed to start: {e}; trying again in {wait:?}");
            self.retries.push(Retry {
                at: Instant::now() + wait,
                next_wait: (wait * 2).min(RETRY_ADD_MAX),
                task,
                changelogs,
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
            self.add_or_retry(r.task, r.changelogs, WarmStores::new(), r.next_wait);
        }
    }

    fn add(&mut self, task: &TaskId, changelogs: &[Changelog], mut warm: WarmStores) -> Result<(), String> {
        let task = task.clone();
        if self.standbys.contains_key(&task) {
            return Ok(());
        }
        let partition = task.partition as i32;
        let label = task.to_string();
        let dir = task_dir(&self.state.dir, &task);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let mut stores = Vec::new();
        for changelog in changelogs {
            let bounds = self
                .changelogs
                .bounds(&changelog.topic, partition)
                .map_err(|e| format!("changelog {}: {e}", changelog.topic))?;
            let warm = warm.remove(&changelog.store);
            let (db, from) = self
                .state
                .prepare_store(&label, &dir, changelog, partition, bounds, warm)?;
            stores.push(Tailed {
                changelog: changelog.clone(),
                db,
                position: from,
                pending: Vec::new(),
            });
        }
        let reads: Vec<(String, i32, i64)> = stores
            .iter()
            .map(|s| (s.changelog.topic.clone(), partition, s.position))
            .collect();
        for (index, store) in stores.iter().enumerate() {
            self.routes
                .insert((store.changelog.topic.clone(), partition), (task.clone(), index));
        }
        if let Err(e) = self.changelogs.read_from(&reads) {
            for (topic, p, _) in &reads {
                self.routes.remove(&(topic.clone(), *p));
            }
            return Err(format!("reading changelogs: {e}"));
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
        let mut paused = Vec::new();
        for store in &standby.stores {
            let key = (store.changelog.topic.clone(), standby.partition);
            self.routes.remove(&key);
            paused.push(key);
        }
        self.changelogs.pause(&paused);
        if let Some(e) = standby.failed.take() {
            return Err(e);
        }
        let began = Instant::now();
        apply_standby(&mut standby)?;
        let applied_ms = began.elapsed().as_millis() as u64;
        // Handed over, the stores are flushed in the background: the task's first commit
        // waits for that flush (`TaskStore::commit`), its start does not.
        checkpoint_standby(&self.changelogs.positions(), &mut standby, !hand_over)?;
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
        if self.standbys.is_empty() {
            // Nothing to read; the positions of the standbys removed go.
            self.publish_positions();
            return;
        }
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

    /// Reads what the changelogs hold for their standbys, up to `max` records (and
    /// [`ROUND_BYTES`]), waiting up to `wait` for the first; stops early for a waiting
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
            let (standbys, routes) = (&mut self.standbys, &self.routes);
            let polled = self.changelogs.poll(wait, &mut |m| {
                if !run.is(m.topic, m.partition) {
                    end_run(standbys, &mut run);
                    run.topic.clear();
                    run.topic.push_str(m.topic);
                    run.partition = m.partition;
                    run.route = routes.get(&(run.topic.clone(), run.partition)).cloned();
                }
                if run.route.is_none() {
                    return;
                }
                run.position = m.offset + 1;
                if let Some(key) = m.key {
                    bytes += key.len() + m.value.map_or(0, <[u8]>::len);
                    run.records.push((key.to_vec(), m.value.map(<[u8]>::to_vec)));
                }
            });
            wait = Duration::ZERO;
            read += 1;
            match polled {
                None => break,
                Some(Err(e)) => {
                    tracing::debug!("standby consumer: {e}");
                    break;
                }
                Some(Ok(())) => {}
            }
        }
        end_run(&mut self.standbys, &mut run);
        read
    }

    /// Applies what was read to the standbys (checkpointing those due).
    fn apply_all(&mut self, yield_to_removals: bool) {
        let positions = self.changelogs.positions();
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
                result = checkpoint_standby(&positions, standby, true);
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
    /// second list, to resume.
    fn catch_up(&mut self, tasks: &[TaskId]) -> (HashMap<TaskId, u64>, Vec<Partition>) {
        // Where every tail ends, in one request (one round trip for all the tasks).
        let mut wanted = Vec::new();
        for task in tasks {
            if let Some(standby) = self.standbys.get(task).filter(|s| s.failed.is_none()) {
                for store in &standby.stores {
                    wanted.push((store.changelog.topic.clone(), standby.partition));
                }
            }
        }
        let found = match wanted.is_empty() {
            true => HashMap::new(),
            false => self.changelogs.ends(&wanted).unwrap_or_else(|e| {
                // The tasks restore what is missing themselves.
                tracing::debug!("reading where the promoted learners' changelogs end: {e}");
                HashMap::new()
            }),
        };
        let mut targets: Vec<(TaskId, Vec<(String, i64)>)> = Vec::new();
        'task: for task in tasks {
            let Some(standby) = self.standbys.get(task).filter(|s| s.failed.is_none()) else {
                continue;
            };
            let mut ends = Vec::new();
            for store in &standby.stores {
                let topic = &store.changelog.topic;
                match found.get(&(topic.clone(), standby.partition)) {
                    Some(&end) => ends.push((topic.clone(), end)),
                    None => continue 'task,
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
        let others: Vec<Partition> = self
            .routes
            .iter()
            .filter(|(_, (task, _))| !targets.iter().any(|(t, _)| t == task))
            .map(|(partition, _)| partition.clone())
            .collect();
        self.changelogs.pause(&others);
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
                        self.changelogs.wake(topic, standby.partition);
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

    /// Whether `task`'s stores have read their changelogs up to `targets` (topic, end).
    /// Offsets can have gaps (compaction, transaction markers): the consumer's position says
    /// how far a partition has been read.
    fn reached(&self, task: &TaskId, targets: &[(String, i64)]) -> bool {
        let Some(standby) = self.standbys.get(task).filter(|s| s.failed.is_none()) else {
            return true;
        };
        let positions = self.changelogs.positions();
        targets.iter().all(|(topic, end)| {
            let stored = standby
                .stores
                .iter()
                .find(|w| &w.changelog.topic == topic)
                .map_or(0, |w| w.position);
            let consumed = positions.get(&(topic.clone(), standby.partition)).copied().unwrap_or(0);
            stored.max(consumed) >= *end
        })
    }

    /// Shares how far each standby has read. Offsets can have gaps (compaction,
    /// transaction markers): the consumer's position says how far a partition was read.
    fn publish_positions(&mut self) {
        let consumed = self.changelogs.positions();
        let mut out = HashMap::with_capacity(self.standbys.len());
        for (task, standby) in &mut self.standbys {
            let mut sum = 0;
            for store in &mut standby.stores {
                if let Some(&p) = consumed.get(&(store.changelog.topic.clone(), standby.partition)) {
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
}

/// Hands what a run read to its store.
fn end_run(standbys: &mut HashMap<TaskId, Standby>, run: &mut Run) {
    let Some((task, index)) = run.route.take() else {
        return;
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
/// Offsets can have gaps (compaction, transaction markers): `positions`, the consumer's,
/// say how far a partition has been read.
fn checkpoint_standby(positions: &HashMap<Partition, i64>, standby: &mut Standby, wait: bool) -> Result<(), String> {
    let mut hint = Checkpoint::new();
    for store in &mut standby.stores {
        if let Some(&p) = positions.get(&(store.changelog.topic.clone(), standby.partition)) {
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

#[cfg(test)]
mod tests;
