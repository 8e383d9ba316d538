//! Stream threads: a worker's tasks run on a few threads, not one each.
//!
//! Each stream thread owns one consumer for the source partitions of all its tasks and
//! drives them in turn: it polls a round of records, hands each to its task, processes a
//! task's batch as soon as it is full, then gives every task a turn (process what it has,
//! punctuate, commit when due, honour stop requests). An idle task is a value in a list:
//! no thread, no connection, no polling of its own.
//!
//! Starting a task — fencing the previous owner (exactly-once), restoring its state,
//! instantiating the guest, looking up committed offsets — can take long, so it happens
//! on separate starter threads; a task reaches its stream thread ready to process, and a
//! restore never holds up the tasks already running.
//!
//! A task that leaves a stream thread has its partitions paused, not unassigned: the
//! consumer assigns a partition once and seeks it when a task of it comes back (librdkafka
//! 2.12 can abort on a removal while another is still stopping, confluentinc/librdkafka#5573).

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message, OwnedMessage};
use rdkafka::{Offset, TopicPartitionList};
use rustc_hash::FxHashMap;

use super::task::{self, KafkaEnv, Prepared, Task, TaskContext, TaskError, TaskSummary};
use super::ConsumerEvents;

/// How a task ended: its summary or error; `None` if the code driving it panicked.
type Outcome = Option<Result<TaskSummary, TaskError>>;

/// The code driving a task panicked (the task is gone, nothing of it committed after).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Panicked;

/// Where a task's end is reported; the worker waits on it.
#[derive(Default)]
pub struct TaskSlot {
    outcome: Mutex<Option<Outcome>>,
    ended: Condvar,
}

impl TaskSlot {
    fn end(&self, outcome: Outcome) {
        *self.outcome.lock().unwrap() = Some(outcome);
        self.ended.notify_all();
    }

    /// Whether the task has ended (taking its outcome will not block).
    pub fn is_finished(&self) -> bool {
        self.outcome.lock().unwrap().is_some()
    }

    /// Waits for the task to end; `Err` if the code driving it panicked.
    pub fn join(&self) -> Result<Result<TaskSummary, TaskError>, Panicked> {
        let mut outcome = self.outcome.lock().unwrap();
        loop {
            if let Some(o) = outcome.take() {
                return o.ok_or(Panicked);
            }
            outcome = self.ended.wait(outcome).unwrap();
        }
    }
}

/// How long an idle stream thread waits for records before giving its tasks a turn.
const IDLE_WAIT: Duration = Duration::from_millis(50);
/// Longest a round of polling lasts before every task gets its turn.
const ROUND: Duration = Duration::from_millis(50);
/// Threads that start tasks (restores run there).
const STARTERS: usize = 2;

enum Command {
    Add(Box<Task>, Arc<TaskSlot>),
}

/// The stream threads and starter threads of a worker.
pub struct StreamThreads {
    threads: Vec<(Sender<Command>, Arc<AtomicUsize>)>,
    starts: Option<Sender<(TaskContext, Arc<TaskSlot>)>>,
    starters: Vec<std::thread::JoinHandle<()>>,
    streams: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for StreamThreads {
    /// Ends the threads once their tasks have ended (the worker stops every task first).
    fn drop(&mut self) {
        self.starts = None;
        for h in self.starters.drain(..) {
            let _ = h.join();
        }
        self.threads.clear();
        for h in self.streams.drain(..) {
            let _ = h.join();
        }
    }
}

impl StreamThreads {
    /// Starts `count` stream threads (each with its share of `prefetch_bytes`) and the
    /// starter threads. They run until the worker drops this.
    pub fn start(count: usize, bootstrap: &str, prefetch_bytes: usize) -> anyhow::Result<StreamThreads> {
        let count = count.max(1);
        let mut threads = Vec::with_capacity(count);
        let (mut streams, mut starters) = (Vec::new(), Vec::new());
        for i in 0..count {
            let (tx, rx) = mpsc::channel();
            let load = Arc::new(AtomicUsize::new(0));
            let consumer = stream_consumer(bootstrap, prefetch_bytes / count)?;
            let env = KafkaEnv::new(bootstrap)?;
            let load2 = load.clone();
            streams.push(
                std::thread::Builder::new()
                    .name(format!("stream-{i}"))
                    .spawn(move || StreamThread::new(consumer, env, load2).run(rx))?,
            );
            threads.push((tx, load));
        }
        let (starts, jobs) = mpsc::channel::<(TaskContext, Arc<TaskSlot>)>();
        let jobs = Arc::new(Mutex::new(jobs));
        let senders: Vec<(Sender<Command>, Arc<AtomicUsize>)> = threads.clone();
        for i in 0..STARTERS {
            let jobs = jobs.clone();
            let senders = senders.clone();
            let mut env = KafkaEnv::new(bootstrap)?;
            let starter = std::thread::Builder::new()
                .name(format!("starter-{i}"))
                .spawn(move || loop {
                    let job = jobs.lock().unwrap().recv();
                    let Ok((ctx, slot)) = job else { return };
                    let started =
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task::prepare(ctx, &mut env)));
                    match started {
                        Ok(Prepared::Ready(task)) => {
                            // The least loaded thread takes it.
                            let (tx, load) = senders
                                .iter()
                                .min_by_key(|(_, load)| load.load(Ordering::Relaxed))
                                .expect("at least one stream thread");
                            load.fetch_add(1, Ordering::Relaxed);
                            if let Err(mpsc::SendError(Command::Add(_, slot))) = tx.send(Command::Add(task, slot)) {
                                slot.end(None);
                            }
                        }
                        Ok(Prepared::Ended(result)) => slot.end(Some(result)),
                        Err(_) => slot.end(None),
                    }
                })?;
            starters.push(starter);
        }
        Ok(StreamThreads {
            threads,
            starts: Some(starts),
            starters,
            streams,
        })
    }

    /// Starts a task; its end is reported to `slot`.
    pub fn submit(&self, ctx: TaskContext, slot: Arc<TaskSlot>) {
        let Some(starts) = &self.starts else {
            return slot.end(None);
        };
        if let Err(mpsc::SendError((_, slot))) = starts.send((ctx, slot)) {
            slot.end(None);
        }
    }

    /// Tasks on each stream thread now.
    pub fn loads(&self) -> Vec<usize> {
        self.threads.iter().map(|(_, l)| l.load(Ordering::Relaxed)).collect()
    }
}

/// A stream thread's consumer: no group of its own (offsets go through `GroupOffsets`),
/// partitions assigned by hand with explicit offsets. `prefetch_bytes` is this thread's
/// share of the worker's prefetch memory.
fn stream_consumer(bootstrap: &str, prefetch_bytes: usize) -> anyhow::Result<BaseConsumer<ConsumerEvents>> {
    let fetch = FetchLimits::for_budget(prefetch_bytes);
    Ok(super::base_config(bootstrap)
        .set("queued.max.messages.kbytes", fetch.queued_kbytes.to_string())
        .set("queued.min.messages", fetch.queued_records.to_string())
        .set("fetch.max.bytes", fetch.fetch_bytes.to_string())
        .set("max.partition.fetch.bytes", fetch.partition_fetch_bytes.to_string())
        // A partition whose queue is full is fetched again 10 ms later, not librdkafka's
        // 1 s: with queues this short, a second's wait would starve the thread.
        .set("fetch.queue.backoff.ms", "10")
        // Never used to commit or join: librdkafka's assignment code expects a group.
        .set("group.id", "sluice.stream")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("isolation.level", "read_committed")
        // How long the broker holds a fetch that finds nothing (it answers as soon as
        // records arrive): long, so idle partitions cost few requests (Java's default).
        .set("fetch.wait.max.ms", "500")
        .create_with_context(ConsumerEvents)?)
}

/// How much a stream consumer may fetch ahead, from its share of the prefetch memory.
///
/// librdkafka counts only record bytes against `queued.max.messages.kbytes`, but it holds
/// every fetched record in an op of about 250 bytes, decompressed: 100-byte records that
/// compress 10:1 take ~30x their fetched size. Measured on a 2M-record backlog of 4
/// partitions, librdkafka's defaults (1 MiB per partition and fetch, 100,000 records queued
/// per partition) peaked at 170–250 MB; these at ~80 MB, and faster.
#[derive(Debug, PartialEq, Eq)]
struct FetchLimits {
    queued_kbytes: usize,
    queued_records: usize,
    fetch_bytes: usize,
    partition_fetch_bytes: usize,
}

impl FetchLimits {
    /// Records queued per partition before its fetching pauses.
    const RECORDS_PER_PARTITION: usize = 5_000;
    /// Fetched (compressed) bytes per partition and request.
    const PARTITION_FETCH: usize = 128 << 10;

    fn for_budget(bytes: usize) -> FetchLimits {
        // Half the budget for record bytes, half for librdkafka's per-record overhead.
        let queued_kbytes = (bytes / 2 / 1024).max(1024);
        // One response, decompressed, must fit the budget several times over.
        let fetch_bytes = (bytes / 16).clamp(1 << 20, 50 << 20);
        FetchLimits {
            queued_kbytes,
            queued_records: Self::RECORDS_PER_PARTITION,
            fetch_bytes,
            partition_fetch_bytes: Self::PARTITION_FETCH.min(fetch_bytes),
        }
    }
}

/// A task on a stream thread.
struct Running {
    task: Box<Task>,
    slot: Arc<TaskSlot>,
    /// Records that arrived while the batch was full and could not be processed (the
    /// lease lapsed, or a stop is pending); the task's partitions are paused meanwhile.
    overflow: Vec<(u32, OwnedMessage)>,
    paused: bool,
}

struct StreamThread {
    consumer: BaseConsumer<ConsumerEvents>,
    board: Board,
}

/// A stream thread's tasks and where their records go.
struct Board {
    env: KafkaEnv,
    load: Arc<AtomicUsize>,
    tasks: Vec<Option<Running>>,
    /// topic → partition → (index in `tasks`, source index).
    routes: FxHashMap<String, FxHashMap<i32, (usize, u32)>>,
    /// Partitions ever assigned to the consumer (paused when no task reads them).
    assigned: HashSet<(String, i32)>,
}

impl StreamThread {
    fn new(consumer: BaseConsumer<ConsumerEvents>, env: KafkaEnv, load: Arc<AtomicUsize>) -> StreamThread {
        StreamThread {
            consumer,
            board: Board {
                env,
                load,
                tasks: Vec::new(),
                routes: FxHashMap::default(),
                assigned: HashSet::new(),
            },
        }
    }

    fn run(mut self, commands: Receiver<Command>) {
        loop {
            // New tasks; with none to run, wait for one.
            loop {
                let command = if self.board.tasks.iter().all(Option::is_none) {
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
                self.board.add(&self.consumer, task, slot);
            }
            self.poll_round();
            for i in 0..self.board.tasks.len() {
                self.board.turn(&self.consumer, i);
            }
        }
    }

    /// Polls records for up to a round and hands them to their tasks, processing a task's
    /// batch as soon as it is full.
    fn poll_round(&mut self) {
        let board = &mut self.board;
        let any_lease = board.tasks.iter().flatten().any(|r| r.task.may_process());
        if !any_lease {
            // Nothing may be processed (the lease lapsed): do not fetch ahead of it.
            std::thread::sleep(Duration::from_millis(10));
            return;
        }
        let has_work = board
            .tasks
            .iter()
            .flatten()
            .any(|r| r.task.has_records() || !r.overflow.is_empty());
        let mut wait = if has_work { Duration::ZERO } else { IDLE_WAIT };
        let round = Instant::now();
        loop {
            let Some(polled) = self.consumer.poll(wait) else { break };
            wait = Duration::ZERO;
            match polled {
                Ok(message) => {
                    let route = board
                        .routes
                        .get(message.topic())
                        .and_then(|p| p.get(&message.partition()))
                        .copied();
                    // A partition of no task here (one that left): its records are not ours.
                    if let Some((index, source)) = route {
                        board.feed(&self.consumer, index, source, &message);
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

type StreamConsumer = BaseConsumer<ConsumerEvents>;

impl Board {
    fn add(&mut self, consumer: &StreamConsumer, task: Box<Task>, slot: Arc<TaskSlot>) {
        let index = match self.tasks.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.tasks.push(None);
                self.tasks.len() - 1
            }
        };
        let mut fresh = TopicPartitionList::new();
        let mut result = Ok(());
        for (source, (topic, partition, committed)) in task.sources().into_iter().enumerate() {
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
            } else {
                let _ = fresh.add_partition_offset(&topic, partition, offset);
                self.assigned.insert((topic, partition));
            }
        }
        if fresh.count() > 0 {
            result = result.and_then(|()| consumer.incremental_assign(&fresh));
        }
        self.tasks[index] = Some(Running {
            task,
            slot,
            overflow: Vec::new(),
            paused: false,
        });
        if let Err(e) = result {
            // The task cannot read: it ends, and the worker starts it again later.
            let running = self.tasks[index].as_mut().expect("added above");
            let end = running.task.abandon(format!("positioning its partitions: {e}"));
            self.end(consumer, index, Some(end));
        }
    }

    fn feed(&mut self, consumer: &StreamConsumer, index: usize, source: u32, message: &BorrowedMessage<'_>) {
        let Some(running) = self.tasks[index].as_mut() else {
            return;
        };
        if running.task.is_full() || !running.overflow.is_empty() {
            if running.overflow.is_empty() && running.task.may_process() {
                if let Some(end) = running.task.process_now(&mut self.env) {
                    self.end(consumer, index, Some(end));
                    return;
                }
            } else {
                running.overflow.push((source, message.detach()));
                if !running.paused {
                    running.paused = true;
                    let _ = consumer.pause(&self.partitions_of(index));
                }
                return;
            }
        }
        let running = self.tasks[index].as_mut().expect("checked above");
        running.task.push(source, message);
    }

    /// A task's turn: refill from what waited, then the task's own step.
    fn turn(&mut self, consumer: &StreamConsumer, index: usize) {
        let Some(running) = self.tasks[index].as_mut() else {
            return;
        };
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut end = running.task.step(&mut self.env);
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
                }
            }
            end
        }));
        match stepped {
            Ok(None) => {
                let running = self.tasks[index].as_mut().expect("still here");
                if running.paused && running.overflow.is_empty() {
                    running.paused = false;
                    let partitions = self.partitions_of(index);
                    let _ = consumer.resume(&partitions);
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
        if let Some(running) = &self.tasks[index] {
            for (topic, partition, _) in running.task.sources() {
                let _ = tpl.add_partition(&topic, partition);
            }
        }
        tpl
    }

    /// A task ended: its partitions are paused and forgotten, its slot told.
    fn end(&mut self, consumer: &StreamConsumer, index: usize, outcome: Outcome) {
        let partitions = self.partitions_of(index);
        let _ = consumer.pause(&partitions);
        let Some(running) = self.tasks[index].take() else {
            return;
        };
        for (topic, partition, _) in running.task.sources() {
            if let Some(p) = self.routes.get_mut(&topic) {
                if p.get(&partition).is_some_and(|(i, _)| *i == index) {
                    p.remove(&partition);
                }
            }
        }
        self.load.fetch_sub(1, Ordering::Relaxed);
        // The task's stores close before its end is told: the worker may exit right after.
        let Running { task, slot, .. } = running;
        drop(task);
        slot.end(outcome);
    }
}

fn one(topic: &str, partition: i32) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    let _ = tpl.add_partition(topic, partition);
    tpl
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetch_limits_follow_the_prefetch_budget() {
        // The default: 64 MiB per worker over 2 threads.
        let l = FetchLimits::for_budget(32 << 20);
        assert_eq!(l.queued_kbytes, 16 << 10);
        assert_eq!(l.fetch_bytes, 2 << 20);
        assert_eq!(l.partition_fetch_bytes, 128 << 10);
        assert_eq!(l.queued_records, 5_000);
        // A tiny budget still fetches something; a huge one stays within librdkafka's cap.
        let l = FetchLimits::for_budget(1 << 10);
        assert_eq!((l.queued_kbytes, l.fetch_bytes), (1024, 1 << 20));
        assert_eq!(FetchLimits::for_budget(4 << 30).fetch_bytes, 50 << 20);
    }
}
