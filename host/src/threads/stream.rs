//! One stream thread: its consumer (the source partitions of all its tasks, assigned by hand
//! and paused, never unassigned, when a task leaves), its tasks, and the loop that polls a
//! round of records and gives every task its turn.
//!
//! A task that leaves a stream thread has its partitions paused, not unassigned: the
//! consumer assigns a partition once and seeks it when a task of it comes back (librdkafka
//! 2.12 can abort on a removal while another is still stopping, confluentinc/librdkafka#5573).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};
use rustc_hash::FxHashMap;

mod consumer;
mod fair_share;
mod renew;
mod transaction;

use consumer::spawn_waker;
pub(super) use consumer::stream_consumer;

use fair_share::FairShare;
pub(super) use transaction::ExactlyOnce;
use transaction::Transaction;

use super::slot::{Outcome, TaskSlot};
use crate::kafka::{ConsumerEvents, KafkaSettings};
use crate::task::partition_group::Lag;
use crate::task::{KafkaEnv, Task};

/// How long an idle stream thread waits for records before giving its tasks a turn.
const IDLE_WAIT: Duration = Duration::from_millis(50);
/// Longest a round of polling lasts before every task gets its turn.
const ROUND: Duration = Duration::from_millis(50);

/// What a stream thread is told.
pub(super) enum Command {
    /// Run this task (started, ready to process) and tell its end to the slot.
    Add(Box<Task>, Arc<TaskSlot>),
}

/// A task on a stream thread.
struct Running {
    task: Box<Task>,
    slot: Arc<TaskSlot>,
    /// Records that arrived while the batch was full and could not be processed (the
    /// lease lapsed, or a stop is pending); the task's partitions are paused meanwhile.
    overflow: Vec<(u32, OwnedMessage)>,
    paused: bool,
    /// Whether a record was fed to it yet (for the handover trace).
    fed: bool,
    /// Under exactly-once: asked to stop, it has closed, and ends with its thread's next
    /// commit (which comes at once).
    leaving: bool,
    /// Its source partitions, for their lags (a task that orders its inputs by time asks
    /// them of the consumer), and which of them are paused because their queue is full.
    parts: Vec<SourcePart>,
    held: Vec<bool>,
}

/// Charges the task in slot `index` the thread time its batches held since last charged
/// (see [`FairShare::charge`]), and takes its turn away if that puts it past its share.
fn charge(share: &mut FairShare, index: usize, task: &mut Task) {
    if share.charge(index, task.thread_time()) {
        task.set_fair_turn(false);
    }
}

/// One source partition of a task on this thread.
struct SourcePart {
    topic: String,
    partition: i32,
    /// Where the task positioned it (none: the log start).
    start: Option<i64>,
    /// For a partition positioned again after an earlier task here: until a record of it
    /// comes, or this time, the consumer's high watermark may be from before (its lag is
    /// taken as unknown).
    stale_until: Option<Instant>,
}

/// How long the cached high watermark of a partition positioned again is not believed: a
/// fetch answers within `fetch.wait.max.ms` (500 ms) once the partition is resumed.
const STALE_WATERMARK: Duration = Duration::from_secs(1);

impl SourcePart {
    fn lag(&self, consumer: &StreamConsumer, now: Instant) -> Lag {
        if self.stale_until.is_some_and(|t| now < t) {
            return Lag::Unknown;
        }
        match crate::kafka::cached_lag(consumer, &self.topic, self.partition, self.start) {
            None => Lag::Unknown,
            Some(0) => Lag::CaughtUp,
            Some(_) => Lag::Behind,
        }
    }
}

pub(super) struct StreamThread {
    consumer: Arc<StreamConsumer>,
    tasks: ThreadTasks,
    /// What made the consumer (the settings and the thread's prefetch share), to make it
    /// again with a renewed client certificate ([`StreamThread::renew_consumer`]).
    kafka: KafkaSettings,
    prefetch_bytes: usize,
    /// A consumer that could not be made again is tried again at this time.
    renew_after: Option<Instant>,
}

/// A stream thread's tasks and where their records go.
struct ThreadTasks {
    env: KafkaEnv,
    load: Arc<AtomicUsize>,
    running: Vec<Option<Running>>,
    /// topic → partition → (index in `tasks`, source index).
    routes: FxHashMap<String, FxHashMap<i32, (usize, u32)>>,
    /// Partitions ever assigned to the consumer (paused when no task reads them).
    assigned: HashSet<(String, i32)>,
    /// Topics whose metadata the consumer has read.
    known_topics: HashSet<String>,
    /// Their fair shares of the thread's time, by index in `running`.
    share: FairShare,
    /// Raised when one of its tasks is asked to stop: the round ends at once.
    attention: Arc<AtomicBool>,
    /// Partitions resumed, for the thread that wakes the consumer's fetcher for them
    /// (`crate::kafka::wake_fetcher`; off this thread, which must not wait for a fetch).
    waker: std::sync::mpsc::Sender<(String, i32)>,
    /// Where a task asked to stop goes for its final commits (`threads::finishers`).
    finishers: std::sync::mpsc::Sender<super::finishers::Finishing>,
    /// Under exactly-once: the thread's transaction, which all its tasks commit together.
    txn: Option<Transaction>,
}

impl StreamThread {
    pub(super) fn new(
        (kafka, prefetch_bytes): (KafkaSettings, usize),
        consumer: crate::kafka::Authorized<BaseConsumer<ConsumerEvents>>,
        env: KafkaEnv,
        load: Arc<AtomicUsize>,
        finishers: std::sync::mpsc::Sender<super::finishers::Finishing>,
        exactly_once: Option<ExactlyOnce>,
    ) -> StreamThread {
        let consumer = Arc::new(consumer);
        let waker = spawn_waker(consumer.clone());
        StreamThread {
            consumer,
            kafka,
            prefetch_bytes,
            renew_after: None,
            tasks: ThreadTasks {
                waker,
                finishers,
                txn: exactly_once.map(Transaction::new),
                env,
                load,
                running: Vec::new(),
                routes: FxHashMap::default(),
                assigned: HashSet::new(),
                known_topics: HashSet::new(),
                share: FairShare::new(Instant::now()),
                attention: Arc::new(AtomicBool::new(false)),
            },
        }
    }

    /// Runs the thread until `commands` is dropped; `ready` hears once the thread can take
    /// tasks.
    pub(super) fn run(mut self, commands: Receiver<Command>, ready: std::sync::mpsc::Sender<()>) {
        // Under exactly-once the thread's producer starts first: `InitProducerId` takes about
        // half a second (librdkafka asks again 500 ms after a first try with no connection
        // up), which a task arriving here would wait; the worker joins its group once its
        // threads are ready.
        self.tasks.start_producer();
        let _ = ready.send(());
        loop {
            // New tasks; with none to run, wait for one.
            loop {
                let command = if self.tasks.running.iter().all(Option::is_none) {
                    match commands.recv_timeout(IDLE_WAIT) {
                        Ok(c) => c,
                        Err(RecvTimeoutError::Timeout) => continue,
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                } else {
                    match commands.try_recv() {
                        Ok(c) => c,
                        Err(_) => break,
                    }
                };
                let Command::Add(task, slot) = command;
                self.tasks.add(&self.consumer, task, slot);
            }
            self.renew_consumer();
            self.tasks.renew_producer_if_due(&self.consumer);
            // Shares are handed out after polling, so a task whose records just came counts
            // as busy, not idle, when the turns are taken.
            self.poll_round();
            self.tasks.share();
            // Tasks asked to stop go first: their new owners wait for their final commits,
            // which would otherwise wait for the others' batches and commits of this round.
            // They leave the thread and make them on a finisher thread, side by side.
            for i in 0..self.tasks.running.len() {
                if self.tasks.running[i].as_ref().is_some_and(|r| r.task.asked_to_stop()) {
                    self.tasks.turn(&self.consumer, i);
                }
            }
            for i in 0..self.tasks.running.len() {
                self.tasks.turn(&self.consumer, i);
            }
            self.tasks.commit_when_due(&self.consumer);
        }
    }

    /// Polls records for up to a round and hands them to their tasks, processing a task's
    /// batch as soon as it is full.
    fn poll_round(&mut self) {
        let tasks = &mut self.tasks;
        let any_lease = tasks.running.iter().flatten().any(|r| r.task.may_process());
        if !any_lease {
            // Nothing may be processed (the lease lapsed): do not fetch ahead of it.
            std::thread::sleep(Duration::from_millis(10));
            return;
        }
        // Work only a task that may process now: records held back by a task's rate limit,
        // cooldown or fair share do not make the round spin (and end before the others'
        // records came, which would make them look idle and give the turn back).
        let mut has_work = tasks
            .running
            .iter()
            .flatten()
            .any(|r| (r.task.has_records() || !r.overflow.is_empty()) && r.task.may_process());
        let round = Instant::now();
        loop {
            // A task asked to stop gets its turn now, not at the end of the round: its new
            // owner waits for its final commit.
            // A load first: this runs per record, and a stop is rare.
            if tasks.attention.load(Ordering::Relaxed) && tasks.attention.swap(false, Ordering::AcqRel) {
                break;
            }
            // Until a task that may process has records, wait for them (for up to
            // IDLE_WAIT): records of a task that must wait for its share (or its rate)
            // do not end the wait, so a task whose next records are a fetch away is not
            // taken for idle when the turns are handed out.
            let wait = if has_work {
                Duration::ZERO
            } else {
                IDLE_WAIT.saturating_sub(round.elapsed())
            };
            let Some(polled) = self.consumer.poll(wait) else { break };
            match polled {
                Ok(message) => {
                    let route = tasks
                        .routes
                        .get(message.topic())
                        .and_then(|p| p.get(&message.partition()))
                        .copied();
                    // A partition of no task here (one that left): its records are not ours.
                    if let Some((index, source)) = route {
                        tasks.feed(&self.consumer, index, source, &message);
                        has_work = has_work || tasks.running[index].as_ref().is_some_and(|r| r.task.may_process());
                    }
                }
                Err(e) => tracing::warn!(thread = ?std::thread::current().name(), "consumer: {e}"),
            }
            if round.elapsed() >= ROUND {
                break;
            }
        }
    }
}

type StreamConsumer = crate::kafka::Authorized<BaseConsumer<ConsumerEvents>>;

impl ThreadTasks {
    /// Hands out turns by thread time used (see [`FairShare::share`]): a task is busy when
    /// it has records (fetched or waiting in its overflow) that wait only for its turn.
    fn share(&mut self) {
        let running = &self.running;
        self.share.share(Instant::now(), |i| {
            running[i]
                .as_ref()
                .is_some_and(|r| (r.task.has_records() || !r.overflow.is_empty()) && r.task.waits_only_for_its_turn())
        });
        for (i, r) in self.running.iter_mut().enumerate() {
            if let Some(r) = r {
                r.task.set_fair_turn(self.share.turn(i));
            }
        }
    }

    /// Charges task `index` the thread time it used since last charged (see [`charge`]).
    fn charge(&mut self, index: usize) {
        if let Some(r) = self.running[index].as_mut() {
            charge(&mut self.share, index, &mut r.task);
        }
    }

    fn add(&mut self, consumer: &StreamConsumer, mut task: Box<Task>, slot: Arc<TaskSlot>) {
        let joined = self.join_transaction(&mut task);
        let index = match self.running.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.running.push(None);
                self.running.len() - 1
            }
        };
        let mut fresh = TopicPartitionList::new();
        let mut result = Ok(());
        let mut parts = Vec::new();
        for (source, (topic, partition, committed)) in task.sources().into_iter().enumerate() {
            let again = self.assigned.contains(&(topic.clone(), partition));
            parts.push(SourcePart {
                topic: topic.clone(),
                partition,
                start: committed,
                stale_until: again.then(|| Instant::now() + STALE_WATERMARK),
            });
            let offset = committed.map_or(Offset::Beginning, Offset::Offset);
            self.routes
                .entry(topic.clone())
                .or_default()
                .insert(partition, (index, source as u32));
            if self.assigned.contains(&(topic.clone(), partition)) {
                // Assigned before and paused: start again from the task's position.
                result = result.and_then(|()| {
                    consumer
                        .seek(&topic, partition, offset, Duration::from_secs(10))
                        .and_then(|()| consumer.resume(&one(&topic, partition)))
                });
                let _ = self.waker.send((topic.clone(), partition));
            } else {
                let _ = fresh.add_partition_offset(&topic, partition, offset);
                self.assigned.insert((topic, partition));
            }
        }
        if fresh.count() > 0 {
            // A topic the consumer has no metadata for is fetched only after librdkafka's
            // next metadata refresh, about a second after the assignment: every handover
            // of a task whose source is new to this thread paid it. One metadata request
            // for the topic (a round trip, once per topic) makes the first fetch go at once.
            for topic in fresh.elements().iter().map(|e| e.topic().to_string()) {
                if self.known_topics.insert(topic.clone()) {
                    if let Err(e) = consumer.fetch_metadata(Some(&topic), Duration::from_secs(5)) {
                        tracing::warn!(%topic, "reading the topic's metadata before fetching it: {e}");
                        self.known_topics.remove(&topic);
                    }
                }
            }
            result = result.and_then(|()| consumer.incremental_assign(&fresh));
        }
        tracing::debug!(target: "handover", task = %task.id(), assigned = fresh.count(), "on its stream thread");
        task.wake_with(self.attention.clone());
        // A task joins at the thread's virtual time: no credit for the time before it came.
        self.share.join(index, task.thread_time());
        self.running[index] = Some(Running {
            task,
            slot,
            overflow: Vec::new(),
            paused: false,
            fed: false,
            leaving: false,
            held: vec![false; parts.len()],
            parts,
        });
        let result = joined.and(result.map_err(|e| format!("positioning its partitions: {e}")));
        if let Err(e) = result {
            // The task cannot read or write: it ends, and the worker starts it again later.
            let running = self.running[index].as_mut().expect("added above");
            let end = running.task.abandon(e);
            self.end(consumer, index, Some(end));
        }
    }

    fn feed(&mut self, consumer: &StreamConsumer, index: usize, source: u32, message: &BorrowedMessage<'_>) {
        let Some(running) = self.running[index].as_mut().filter(|r| !r.leaving) else {
            return;
        };
        if running.task.orders_inputs() {
            running.fed = true;
            running.parts[source as usize].stale_until = None;
            running.task.enqueue(source, message.detach());
            if running.task.is_backlogged(source) && !running.held[source as usize] {
                running.held[source as usize] = true;
                let part = &running.parts[source as usize];
                let _ = consumer.pause(&one(&part.topic, part.partition));
            }
            self.fill_in_order(consumer, index, true);
            return;
        }
        if running.task.is_full() || !running.overflow.is_empty() {
            if running.overflow.is_empty() && running.task.may_process() {
                let end = running.task.process_now(&mut self.env);
                self.charge(index);
                if let Some(end) = end {
                    self.end(consumer, index, Some(end));
                    return;
                }
            }
            let running = self.running[index].as_mut().expect("checked above");
            // Still full: the batch could not be processed, or a record waits after it (for
            // its schema): this one waits too, and the task's partitions pause.
            if running.task.is_full() || !running.overflow.is_empty() {
                running.overflow.push((source, message.detach()));
                if !running.paused {
                    tracing::debug!(target: "handover", task = %running.task.id(), may_process = running.task.may_process(), "paused");
                    running.paused = true;
                    let _ = consumer.pause(&self.partitions_of(index));
                }
                return;
            }
        }
        let running = self.running[index].as_mut().expect("checked above");
        if !running.fed {
            running.fed = true;
            tracing::debug!(target: "handover", task = %running.task.id(), offset = message.offset(), "first record fetched");
        }
        running.task.push(source, message);
    }

    /// For a task that takes its inputs in timestamp order: moves what may go from its
    /// partition group into its batch, and with `process`, processes each batch that fills
    /// (while it may); then resumes the partitions whose queues drained.
    fn fill_in_order(&mut self, consumer: &StreamConsumer, index: usize, process: bool) {
        loop {
            let Some(running) = self.running[index].as_mut() else {
                return;
            };
            let now = Instant::now();
            let parts = &running.parts;
            running.task.fill(now, |s| parts[s].lag(consumer, now));
            if !process || !running.task.is_full() || !running.task.may_process() {
                break;
            }
            let end = running.task.process_now(&mut self.env);
            self.charge(index);
            if let Some(end) = end {
                self.end(consumer, index, Some(end));
                return;
            }
        }
        self.release_drained(consumer, index);
    }

    /// Resumes a task's partitions that were paused for a full queue and have room again.
    fn release_drained(&mut self, consumer: &StreamConsumer, index: usize) {
        let Some(running) = self.running[index].as_mut() else {
            return;
        };
        for s in 0..running.held.len() {
            if running.held[s] && running.task.has_room(s as u32) {
                running.held[s] = false;
                let part = &running.parts[s];
                let _ = consumer.resume(&one(&part.topic, part.partition));
                let _ = self.waker.send((part.topic.clone(), part.partition));
            }
        }
    }

    /// A task's turn: refill from what waited, then the task's own step; or, asked to stop,
    /// off to a finisher thread.
    fn turn(&mut self, consumer: &StreamConsumer, index: usize) {
        let Some(running) = self.running[index].as_mut() else {
            return;
        };
        if running.leaving {
            return;
        }
        if running.task.asked_to_stop() {
            if self.txn.is_some() {
                self.close_for_stop(consumer, index);
            } else {
                self.hand_off(consumer, index);
            }
            return;
        }
        let ordered = running.task.orders_inputs();
        if ordered {
            self.fill_in_order(consumer, index, false);
        }
        let Some(running) = self.running[index].as_mut() else {
            return;
        };
        let share = &mut self.share;
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut end = running.task.step(&mut self.env);
            charge(share, index, &mut running.task);
            // Records the partition group let go but the batch had no room for: batch by
            // batch while the task may process (the group holds at most a bounded number).
            while ordered && end.is_none() && running.task.may_process() {
                let now = Instant::now();
                let parts = &running.parts;
                if running.task.fill(now, |s| parts[s].lag(consumer, now)) == 0 {
                    break;
                }
                end = running.task.process_now(&mut self.env);
                charge(share, index, &mut running.task);
            }
            while end.is_none() && !running.overflow.is_empty() && running.task.may_process() {
                let waiting = std::mem::take(&mut running.overflow);
                let mut rest = waiting.into_iter();
                for (source, message) in rest.by_ref() {
                    if running.task.is_full() {
                        running.overflow.push((source, message));
                        break;
                    }
                    running.task.push(source, &message);
                }
                running.overflow.extend(rest);
                if !running.overflow.is_empty() {
                    end = running.task.process_now(&mut self.env);
                    charge(share, index, &mut running.task);
                }
            }
            end
        }));
        match stepped {
            Ok(None) => {
                if ordered {
                    self.release_drained(consumer, index);
                }
                let running = self.running[index].as_mut().expect("still here");
                if running.paused && running.overflow.is_empty() {
                    tracing::debug!(target: "handover", task = %running.task.id(), "resumed");
                    running.paused = false;
                    let partitions = self.partitions_of(index);
                    let _ = consumer.resume(&partitions);
                    for p in partitions.elements() {
                        let _ = self.waker.send((p.topic().to_string(), p.partition()));
                    }
                }
            }
            Ok(Some(end)) => self.end(consumer, index, Some(end)),
            Err(_) => {
                tracing::error!("a task's step panicked");
                self.end(consumer, index, None);
            }
        }
    }

    fn partitions_of(&self, index: usize) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        if let Some(running) = &self.running[index] {
            for (topic, partition, _) in running.task.sources() {
                let _ = tpl.add_partition(&topic, partition);
            }
        }
        tpl
    }

    /// Takes a task off the thread: its partitions are paused and forgotten.
    fn detach(&mut self, consumer: &StreamConsumer, index: usize) -> Option<Running> {
        let partitions = self.partitions_of(index);
        let _ = consumer.pause(&partitions);
        let running = self.running[index].take()?;
        self.share.leave(index);
        for (topic, partition, _) in running.task.sources() {
            if let Some(p) = self.routes.get_mut(&topic) {
                if p.get(&partition).is_some_and(|(i, _)| *i == index) {
                    p.remove(&partition);
                }
            }
        }
        self.load.fetch_sub(1, Ordering::Relaxed);
        Some(running)
    }

    /// A task asked to stop leaves the thread for a finisher thread, which makes its final
    /// commits and tells its slot (here, if no finisher runs any more).
    fn hand_off(&mut self, consumer: &StreamConsumer, index: usize) {
        let Some(running) = self.detach(consumer, index) else {
            return;
        };
        let Running { task, slot, .. } = running;
        tracing::debug!(target: "handover", task = %task.id(), "to a finisher");
        if let Err(std::sync::mpsc::SendError((task, slot))) = self.finishers.send((task, slot)) {
            super::finishers::finish(task, &slot, &mut self.env);
        }
    }

    /// A task ended: its partitions are paused and forgotten, its slot told. Under
    /// exactly-once, one that ended with records in the thread's open transaction (failed,
    /// or asked to abort) takes the transaction down with it: the other tasks go back to
    /// their last commit (see `transaction`).
    fn end(&mut self, consumer: &StreamConsumer, index: usize, outcome: Outcome) {
        let Some(running) = self.detach(consumer, index) else {
            return;
        };
        let doomed = self.txn.is_some() && running.task.in_transaction();
        // Its stores stay open, returned to the task runner for whoever uses them next here,
        // and the rest of it (guest instance, producer) is dropped on another thread: its end
        // is told at once. The worker waits for those drops before it exits (`Drops::settle`).
        let started = Instant::now();
        let Running { mut task, slot, .. } = running;
        task.return_stores();
        let (drops, id) = (task.drops(), task.id().to_string());
        drops.later(task);
        tracing::debug!(target: "handover", task = %id, ms = started.elapsed().as_millis() as u64, "off its stream thread");
        slot.end(outcome);
        if doomed {
            self.abort_transaction(consumer, &format!("task {id} ended with records in it"));
        }
    }
}

fn one(topic: &str, partition: i32) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    let _ = tpl.add_partition(topic, partition);
    tpl
}
