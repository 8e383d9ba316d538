//! A stream thread's transaction under exactly-once: every commit interval (and at once
//! when a task leaves), all the thread's tasks commit their outputs, changelog writes and
//! source offsets together, with the worker's proof of membership (see
//! `task::control::Fence`). When the transaction aborts, every task of the thread goes back
//! to its last commit (`Task::roll_back`): its stores drop what they had not committed
//! (RocksDB holds only committed writes, so nothing is restored), its guest starts afresh,
//! and its partitions are read again from its committed offsets. A task that fails alone
//! takes the transaction down only if it had sent something in it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

use super::{StreamConsumer, ThreadTasks};
use crate::kafka::KafkaSettings;
use crate::task::control::Fence;
use crate::task::{InTransaction, TaskError, ThreadProducer, TransactionError};

/// What a stream thread needs to run its tasks exactly once.
pub struct ExactlyOnce {
    pub kafka: KafkaSettings,
    /// The thread's transactional id (see `task::thread_transactional_id`).
    pub transactional_id: String,
    pub fence: Arc<Fence>,
    pub commit_interval: Duration,
}

/// How long a thread keeps trying to start its producer before the task that needs it
/// gives up (and is started again later).
const PRODUCER_START: Duration = Duration::from_secs(60);

pub(super) struct Transaction {
    config: ExactlyOnce,
    /// Made when a first task comes, and again after it could not go on (fenced).
    producer: Option<Arc<ThreadProducer>>,
    last_commit: Instant,
    /// How often the transaction aborted and the tasks went back (to tell whether ending a
    /// failed task took it down).
    rollbacks: u64,
}

impl Transaction {
    pub(super) fn new(config: ExactlyOnce) -> Transaction {
        Transaction {
            config,
            producer: None,
            last_commit: Instant::now(),
            rollbacks: 0,
        }
    }

    /// The producer, started now if there is none.
    fn producer(&mut self) -> Result<Arc<ThreadProducer>, String> {
        if let Some(p) = self.producer.as_ref().filter(|p| !p.is_broken()) {
            return Ok(p.clone());
        }
        let began = Instant::now();
        let producer = ThreadProducer::start(
            &self.config.kafka,
            &self.config.transactional_id,
            self.config.commit_interval,
            &|| began.elapsed() > PRODUCER_START,
        )?
        .ok_or_else(|| {
            format!(
                "the transactional producer {} did not start within {}s (is the transaction coordinator reachable?)",
                self.config.transactional_id,
                PRODUCER_START.as_secs()
            )
        })?;
        let producer = Arc::new(producer);
        self.producer = Some(producer.clone());
        Ok(producer)
    }
}

/// What the tasks brought to a commit.
#[derive(Default)]
struct Round {
    /// Group → the offsets of its tasks here.
    offsets: BTreeMap<String, TopicPartitionList>,
    members: Vec<usize>,
    failed: Vec<(usize, TaskError)>,
    not_now: bool,
}

impl ThreadTasks {
    /// Under exactly-once, starts the thread's producer if it has none (a failure is logged:
    /// the first task to arrive tries again).
    pub(super) fn start_producer(&mut self) {
        let Some(txn) = self.txn.as_mut() else { return };
        if let Err(e) = txn.producer() {
            tracing::warn!(
                "starting the stream thread's transactional producer: {e}; the first task to come tries again"
            );
        }
    }

    /// Under exactly-once, gives a task arriving on the thread the thread's producer. An
    /// error: the producer could not be started.
    pub(super) fn join_transaction(&mut self, task: &mut crate::task::Task) -> Result<(), String> {
        let Some(txn) = self.txn.as_mut() else { return Ok(()) };
        task.join_transaction(txn.producer()?);
        Ok(())
    }

    /// Asked to stop: the task closes (what it emits goes in the transaction), its
    /// partitions pause, and the thread commits at once.
    pub(super) fn close_for_stop(&mut self, consumer: &StreamConsumer, index: usize) {
        let Some(running) = self.running[index].as_mut() else {
            return;
        };
        tracing::debug!(target: "handover", task = %running.task.id(), "closing for its final commit");
        match running.task.close_for_stop() {
            Ok(()) => {
                running.leaving = true;
                running.overflow.clear();
                let _ = consumer.pause(&self.partitions_of(index));
            }
            Err(e) => {
                let end = running.task.report(Err(e));
                self.end(consumer, index, Some(end));
            }
        }
    }

    /// Commits the thread's transaction when the commit interval has passed, or at once
    /// when a task is leaving.
    pub(super) fn commit_when_due(&mut self, consumer: &StreamConsumer) {
        let Some(txn) = self.txn.as_mut() else { return };
        let leaving = self.running.iter().flatten().any(|r| r.leaving);
        if !leaving && txn.last_commit.elapsed() < txn.config.commit_interval {
            return;
        }
        txn.last_commit = Instant::now();
        let rollbacks = txn.rollbacks;
        let round = self.prepare_round();
        for (index, e) in round.failed {
            let Some(running) = self.running[index].as_ref() else {
                continue;
            };
            let end = running.task.report(Err(e));
            self.end(consumer, index, Some(end));
        }
        let Some(txn) = self.txn.as_ref() else { return };
        if txn.rollbacks != rollbacks {
            // A failed task had records in the transaction: it went down, and every task
            // went back to its last commit.
            return;
        }
        let Some(producer) = txn.producer.clone() else {
            self.finish_leaving(consumer, false);
            return;
        };
        let fence = txn.config.fence.token();
        let (Ok(fence), false) = (fence, round.not_now) else {
            // No lease or no membership: nothing commits now. Tasks leaving cannot wait.
            if leaving {
                self.abort_transaction(consumer, "the worker's membership is not certain");
            }
            return;
        };
        if round.members.is_empty() && !producer.in_transaction() {
            self.finish_leaving(consumer, true);
            return;
        }
        let offsets: Vec<(String, TopicPartitionList)> = round.offsets.into_iter().collect();
        if producer.in_transaction() {
            fault_stall();
        }
        let began = Instant::now();
        match producer.commit(&offsets, fence.as_ref()) {
            Ok(()) => {
                tracing::trace!(
                    members = round.members.len(),
                    ms = began.elapsed().as_millis() as u64,
                    "transaction committed"
                );
                for index in round.members {
                    let Some(running) = self.running[index].as_mut() else {
                        continue;
                    };
                    if let Err(e) = running.task.transaction_committed(&mut self.env) {
                        let end = running.task.report(Err(e));
                        self.end(consumer, index, Some(end));
                    }
                }
                self.finish_leaving(consumer, true);
            }
            Err(TransactionError::Fenced(detail)) => {
                // The producer cannot go on (it is broken): the tasks go back and get a new one.
                self.roll_back_all(consumer, &format!("the thread's producer cannot go on: {detail}"));
                self.renew_producer(consumer);
            }
            Err(TransactionError::Aborted(detail)) => self.roll_back_all(consumer, &detail),
        }
    }

    /// Every task's part of the commit (see `Task::prepare_transaction`).
    fn prepare_round(&mut self) -> Round {
        let mut round = Round::default();
        for (index, running) in self.running.iter_mut().enumerate() {
            let Some(running) = running else { continue };
            match running.task.prepare_transaction() {
                Ok(InTransaction::Nothing) => {}
                Ok(InTransaction::NotNow) => round.not_now = true,
                Ok(InTransaction::Offsets(group, tpl)) => {
                    let merged = round.offsets.entry(group).or_default();
                    for e in tpl.elements() {
                        let _ = merged.add_partition_offset(e.topic(), e.partition(), e.offset());
                    }
                    round.members.push(index);
                }
                Err(e) => round.failed.push((index, e)),
            }
        }
        round
    }

    /// Tasks that closed for their final commit end: stopped, or (`committed` false)
    /// stopped without committing.
    fn finish_leaving(&mut self, consumer: &StreamConsumer, committed: bool) {
        for index in 0..self.running.len() {
            let Some(running) = self.running[index].as_mut().filter(|r| r.leaving) else {
                continue;
            };
            let summary = running.task.stopped(committed);
            let end = running.task.report(Ok(summary));
            self.end(consumer, index, Some(end));
        }
    }

    /// Aborts the open transaction (if any) and takes every task back to its last commit.
    pub(super) fn abort_transaction(&mut self, consumer: &StreamConsumer, why: &str) {
        let producer = self.txn.as_ref().and_then(|t| t.producer.clone());
        if let Some(producer) = &producer {
            producer.abort();
        }
        self.roll_back_all(consumer, why);
        if producer.is_some_and(|p| p.is_broken()) {
            // Its transaction was timed out while the worker was frozen, or another took
            // its id: the tasks that stay get a new one.
            self.renew_producer(consumer);
        }
    }

    /// The transaction aborted: tasks leaving end without committing; the others go back
    /// to their last commit and read their partitions again from there.
    fn roll_back_all(&mut self, consumer: &StreamConsumer, why: &str) {
        if let Some(txn) = self.txn.as_mut() {
            txn.rollbacks += 1;
        }
        let tasks = self.running.iter().flatten().count();
        tracing::warn!(
            tasks,
            "the stream thread's transaction aborted ({why}): its tasks go back to their last commit"
        );
        self.finish_leaving(consumer, false);
        for index in 0..self.running.len() {
            let Some(running) = self.running[index].as_mut() else {
                continue;
            };
            if let Err(e) = running.task.roll_back() {
                let end = running.task.report(Err(e));
                self.end(consumer, index, Some(end));
                continue;
            }
            if let Err(e) = self.read_again(consumer, index) {
                let running = self.running[index].as_mut().expect("still here");
                let end = running
                    .task
                    .abandon(format!("positioning its partitions after a rollback: {e}"));
                self.end(consumer, index, Some(end));
            }
        }
    }

    /// A task gone back to its last commit reads its partitions again from there.
    fn read_again(&mut self, consumer: &StreamConsumer, index: usize) -> rdkafka::error::KafkaResult<()> {
        let Some(running) = self.running[index].as_mut() else {
            return Ok(());
        };
        running.overflow.clear();
        running.paused = false;
        running.held.iter_mut().for_each(|h| *h = false);
        let mut result = Ok(());
        for (s, (topic, partition, committed)) in running.task.sources().into_iter().enumerate() {
            // Where it reads from now (for its lag, and a consumer made again).
            if let Some(part) = running.parts.get_mut(s) {
                part.start = committed;
            }
            let offset = committed.map_or(Offset::Beginning, Offset::Offset);
            result = result.and_then(|()| consumer.seek(&topic, partition, offset, Duration::from_secs(10)));
        }
        let partitions = self.partitions_of(index);
        let _ = consumer.resume(&partitions);
        for p in partitions.elements() {
            let _ = self.waker.send((p.topic().to_string(), p.partition()));
        }
        result
    }

    /// With the client certificate renewed on disk since the thread's producer was made:
    /// between transactions (none open), a new producer of the same transactional id (which
    /// fences the old one) for every task.
    pub(super) fn renew_producer_if_due(&mut self, consumer: &StreamConsumer) {
        let Some(txn) = self.txn.as_mut() else { return };
        let Some(producer) = txn.producer.as_ref() else { return };
        if producer.in_transaction() || !txn.config.kafka.renewed(producer.made()) {
            return;
        }
        tracing::info!("transactional producer made again with the renewed client certificate");
        txn.producer = None;
        self.start_producer();
        self.renew_producer(consumer);
    }

    /// After the producer could not go on: a new one for every task (one that cannot get it
    /// ends, to be started again later).
    fn renew_producer(&mut self, consumer: &StreamConsumer) {
        for index in 0..self.running.len() {
            let Some(running) = self.running[index].as_mut() else {
                continue;
            };
            let Some(txn) = self.txn.as_mut() else { return };
            match txn.producer() {
                Ok(producer) => running.task.join_transaction(producer),
                Err(e) => {
                    let end = running.task.abandon(e);
                    self.end(consumer, index, Some(end));
                }
            }
        }
    }
}

/// A fault for tests: with `SLUICE_FAULT_STALL_COMMIT` naming a file, a stream thread that
/// finds the file at a commit (its lease checked, records in its transaction, the membership
/// it will prove read) removes it, says so in its log and stalls a second before it commits:
/// the window no lease can cover, held open so that a test can freeze the worker in it
/// (`ownership::a_worker_frozen_inside_its_commit_…`). Without the variable, nothing.
fn fault_stall() {
    static PATH: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    let path = PATH.get_or_init(|| std::env::var_os("SLUICE_FAULT_STALL_COMMIT").map(Into::into));
    if let Some(path) = path {
        if std::fs::remove_file(path).is_ok() {
            tracing::warn!("fault injection: stalling inside a commit, after its lease check");
            std::thread::sleep(Duration::from_secs(1));
        }
    }
}
