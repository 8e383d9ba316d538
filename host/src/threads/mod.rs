//! The threads a worker's tasks run on: a few stream threads (about one per core), not one
//! per task; two starter threads that open tasks; and one state-updater thread for the
//! standbys and learners.
//!
//! Each stream thread (`stream`) owns one consumer for the source partitions of all its
//! tasks and drives them in turn: it polls a round of records, hands each to its task,
//! processes a task's batch as soon as it is full, then gives every task a turn (process
//! what it has, punctuate, commit when due, honour stop requests). An idle task is a value
//! in a list: no thread, no connection, no polling of its own.
//!
//! Starting a task — fencing the previous owner (exactly-once), restoring its state,
//! instantiating the guest, looking up committed offsets — can take long, so it happens
//! on the starter threads; a task reaches its stream thread ready to process, and a
//! restore never holds up the tasks already running. How a task ends is told to its
//! [`TaskSlot`], which the worker waits on.
//!
//! Standbys and learners replay changelogs on the state updater (`state_updater`), with a
//! consumer of its own, so restoring never blocks processing.

mod slot;
pub mod state_updater;
mod stream;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};

use crate::kafka::KafkaSettings;
use crate::task::{self, KafkaEnv, Prepared, TaskContext};
pub use slot::{Panicked, TaskSlot};
pub use state_updater::StandbyUpdater;
use stream::{stream_consumer, Command, StreamThread};

/// Threads that start tasks (restores run there).
const STARTERS: usize = 2;

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
    pub fn start(count: usize, kafka: &KafkaSettings, prefetch_bytes: usize) -> anyhow::Result<StreamThreads> {
        let count = count.max(1);
        let mut threads = Vec::with_capacity(count);
        let (mut streams, mut starters) = (Vec::new(), Vec::new());
        for i in 0..count {
            let (tx, rx) = mpsc::channel();
            let load = Arc::new(AtomicUsize::new(0));
            let consumer = stream_consumer(kafka, prefetch_bytes / count)?;
            let env = KafkaEnv::new(kafka)?;
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
            let mut env = KafkaEnv::new(kafka)?;
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
