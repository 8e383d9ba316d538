//! The threads a worker's tasks run on: a few stream threads (about one per core), not one
//! per task; four starter threads that open tasks; one state-updater thread for the
//! standbys and learners; one for the global tables.
//!
//! Each stream thread (`stream`) owns one consumer for the source partitions of all its
//! tasks and drives them in turn: it polls a round of records, hands each to its task,
//! processes a task's batch as soon as it is full, then gives every task a turn (process
//! what it has, punctuate, commit when due, honour stop requests). An idle task is a value
//! in a list: no thread, no connection, no polling of its own.
//!
//! Starting a task — looking up committed offsets (once stable), restoring its state,
//! instantiating the guest — can take long, so it happens on the starter threads; a task
//! reaches its stream thread ready to process, and a restore never holds up the tasks
//! already running. A task asked to stop leaves its stream thread for a finisher thread
//! (`finishers`), which makes its final commits; under exactly-once the stream thread
//! commits all its tasks in one transaction (`stream::transaction`), a leaving one with
//! them. How a task ends is told to its [`TaskSlot`], which the worker waits on.
//!
//! Standbys and learners replay changelogs on the state updater (`standbys`), with a
//! consumer of its own, so restoring never blocks processing; global tables fill and tail on
//! a thread of their own (`globals`). Both read through [`changelogs::Changelogs`], which
//! their unit tests replace with partitions in memory.

pub mod changelogs;
mod finishers;
pub mod globals;
mod slot;
pub mod standbys;
mod starters;
mod stream;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;

use crate::kafka::KafkaSettings;
use crate::task::{KafkaEnv, TaskContext};
pub use globals::GlobalUpdater;
pub use slot::{Panicked, TaskSlot};
pub use standbys::StandbyUpdater;
use starters::Starters;
use stream::{stream_consumer, Command, StreamThread};

/// The stream threads and starter threads of a worker.
pub struct StreamThreads {
    threads: Vec<(Sender<Command>, Arc<AtomicUsize>)>,
    starters: Option<Starters>,
    streams: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for StreamThreads {
    /// Ends the threads once their tasks have ended (the worker stops every task first).
    fn drop(&mut self) {
        drop(self.starters.take());
        self.threads.clear();
        for h in self.streams.drain(..) {
            let _ = h.join();
        }
    }
}

impl StreamThreads {
    /// Starts `count` stream threads (each with its share of `prefetch_bytes`) and the
    /// starter threads. They run until the worker drops this.
    ///
    /// Under exactly-once (`exactly_once`: the worker's id, its membership's fence and the
    /// commit interval) each thread commits its tasks in transactions of its own producer.
    pub fn start(
        count: usize,
        kafka: &KafkaSettings,
        prefetch_bytes: usize,
        exactly_once: Option<(String, Arc<crate::task::control::Fence>, std::time::Duration)>,
    ) -> anyhow::Result<StreamThreads> {
        let count = count.max(1);
        let mut threads = Vec::with_capacity(count);
        let mut streams = Vec::new();
        let finishers = finishers::start(kafka)?;
        let (ready, readiness) = mpsc::channel();
        for i in 0..count {
            let (tx, rx) = mpsc::channel();
            let load = Arc::new(AtomicUsize::new(0));
            let consumer = stream_consumer(kafka, prefetch_bytes / count)?;
            let env = KafkaEnv::new(kafka)?;
            let load2 = load.clone();
            let kafka2 = kafka.clone();
            let finishers = finishers.clone();
            let ready = ready.clone();
            let exactly_once = exactly_once
                .as_ref()
                .map(|(worker, fence, interval)| stream::ExactlyOnce {
                    kafka: kafka.clone(),
                    transactional_id: crate::task::thread_transactional_id(worker, i),
                    fence: fence.clone(),
                    commit_interval: *interval,
                });
            streams.push(std::thread::Builder::new().name(format!("stream-{i}")).spawn(move || {
                StreamThread::new(
                    (kafka2, prefetch_bytes / count),
                    consumer,
                    env,
                    load2,
                    finishers,
                    exactly_once,
                )
                .run(rx, ready)
            })?);
            threads.push((tx, load));
        }
        // Under exactly-once, until every thread's producer has started (or given up, for its
        // first task to try again): no task is placed here that would wait for one.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(70);
        for _ in 0..count {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if readiness.recv_timeout(left).is_err() {
                break;
            }
        }
        let starters = Starters::start(kafka, threads.clone())?;
        Ok(StreamThreads {
            threads,
            starters: Some(starters),
            streams,
        })
    }

    /// Starts a task; its end is reported to `slot`.
    pub fn submit(&self, ctx: TaskContext, slot: Arc<TaskSlot>) {
        match &self.starters {
            Some(starters) => starters.submit(ctx, slot),
            None => slot.end(None),
        }
    }

    /// Tasks on each stream thread now.
    pub fn loads(&self) -> Vec<usize> {
        self.threads.iter().map(|(_, l)| l.load(Ordering::Relaxed)).collect()
    }
}
