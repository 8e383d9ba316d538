//! The starter threads: each takes a task to start (fencing, restore, instantiate, committed
//! offsets) and hands it, ready, to the least loaded stream thread. A watch gives every step
//! of a start its deadline: a start whose step goes past it is given up — the task ends as
//! failed for a transient reason, with the step named, and is started again — and a starter
//! that does not come back from it is left behind and replaced, so one stuck start never
//! holds up the others.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::slot::TaskSlot;
use super::stream::Command;
use crate::kafka::KafkaSettings;
use crate::task::control::TaskControl;
use crate::task::{self, KafkaEnv, Prepared, TaskContext, TaskError};

/// Threads that start tasks (restores run there). Four, so that the tasks a rebalance
/// moves here start side by side: most of a handover's start is waiting for Kafka (the
/// changelog's end, committed offsets) and for RocksDB to open, not using a core.
const STARTERS: usize = 4;
/// How long a given-up start may take to come back before its thread is left behind.
const GIVE_UP_GRACE: Duration = Duration::from_secs(10);
/// How often the watch looks.
const WATCH_EVERY: Duration = Duration::from_secs(1);

type Job = (TaskContext, Arc<TaskSlot>);

/// A start in progress.
struct InFlight {
    label: String,
    control: Arc<TaskControl>,
    slot: Arc<TaskSlot>,
    /// The starter running it: set when the start is left behind.
    left_behind: Arc<AtomicBool>,
    given_up: Option<Instant>,
}

struct Shared {
    jobs: Mutex<Receiver<Job>>,
    streams: Vec<(Sender<Command>, Arc<AtomicUsize>)>,
    kafka: KafkaSettings,
    in_flight: Mutex<Vec<InFlight>>,
    /// Every starter thread, and whether it was left behind (not to be waited for).
    threads: Mutex<Vec<(std::thread::JoinHandle<()>, Arc<AtomicBool>)>>,
    stop: AtomicBool,
}

/// The starter threads and their watch.
pub(super) struct Starters {
    jobs: Option<Sender<Job>>,
    shared: Arc<Shared>,
    watch: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Starters {
    fn drop(&mut self) {
        self.jobs = None;
        self.shared.stop.store(true, Ordering::Release);
        if let Some(w) = self.watch.take() {
            let _ = w.join();
        }
        let threads = std::mem::take(&mut *self.shared.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for (thread, left_behind) in threads {
            if !left_behind.load(Ordering::Acquire) {
                let _ = thread.join();
            }
        }
    }
}

impl Starters {
    pub(super) fn start(
        kafka: &KafkaSettings,
        streams: Vec<(Sender<Command>, Arc<AtomicUsize>)>,
    ) -> anyhow::Result<Starters> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let shared = Arc::new(Shared {
            jobs: Mutex::new(queue),
            streams,
            kafka: kafka.clone(),
            in_flight: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        for _ in 0..STARTERS {
            spawn_starter(&shared)?;
        }
        let watched = shared.clone();
        let watch = std::thread::Builder::new()
            .name("start-watch".into())
            .spawn(move || watch(&watched))?;
        Ok(Starters {
            jobs: Some(jobs),
            shared,
            watch: Some(watch),
        })
    }

    pub(super) fn submit(&self, ctx: TaskContext, slot: Arc<TaskSlot>) {
        let Some(jobs) = &self.jobs else {
            return slot.end(None);
        };
        if let Err(mpsc::SendError((_, slot))) = jobs.send((ctx, slot)) {
            slot.end(None);
        }
    }
}

fn spawn_starter(shared: &Arc<Shared>) -> anyhow::Result<()> {
    let mut threads = shared.threads.lock().unwrap_or_else(|p| p.into_inner());
    let n = threads.len();
    let mut env = KafkaEnv::new(&shared.kafka)?;
    let left_behind = Arc::new(AtomicBool::new(false));
    let (me, mine) = (shared.clone(), left_behind.clone());
    let thread = std::thread::Builder::new()
        .name(format!("starter-{n}"))
        .spawn(move || loop {
            if mine.load(Ordering::Acquire) {
                return;
            }
            let job = me.jobs.lock().unwrap_or_else(|p| p.into_inner()).recv();
            let Ok((ctx, slot)) = job else { return };
            let label = format!("{}/{}", ctx.topology.name, ctx.partition);
            me.in_flight.lock().unwrap_or_else(|p| p.into_inner()).push(InFlight {
                label,
                control: ctx.control.clone(),
                slot: slot.clone(),
                left_behind: mine.clone(),
                given_up: None,
            });
            let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task::prepare(ctx, &mut env)));
            me.in_flight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|f| !Arc::ptr_eq(&f.slot, &slot));
            if slot.was_told() {
                // The watch gave this start up and told its end; the task is started anew
                // elsewhere: whatever this one came to is dropped.
                tracing::info!("a start given up earlier came back; dropped");
                continue;
            }
            match started {
                Ok(Prepared::Ready(task)) => {
                    // The least loaded thread takes it.
                    let (tx, load) = me
                        .streams
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
    threads.push((thread, left_behind));
    Ok(())
}

/// Gives up starts whose step went past its deadline, and replaces starters that do not
/// come back from one.
fn watch(shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::Acquire) {
        std::thread::sleep(WATCH_EVERY);
        let mut replace = 0;
        {
            let mut in_flight = shared.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            for f in in_flight.iter_mut() {
                let Some(step) = f.control.step() else { continue };
                match f.given_up {
                    None if step.since.elapsed() > step.deadline => {
                        let why = format!(
                            "{} took more than {}s without progress; it is started again",
                            step.what,
                            step.deadline.as_secs()
                        );
                        tracing::warn!(task = %f.label, "giving its start up: {why}");
                        f.control.abandon(why);
                        f.given_up = Some(Instant::now());
                    }
                    Some(at) if at.elapsed() > GIVE_UP_GRACE && !f.left_behind.load(Ordering::Acquire) => {
                        tracing::error!(
                            task = %f.label,
                            "its start does not come back from {}: leaving its starter thread behind and starting \
                             another",
                            step.what
                        );
                        f.slot.end(Some(Err(TaskError::Start {
                            task: f.label.clone(),
                            detail: format!("{} did not come back", step.what),
                        })));
                        f.left_behind.store(true, Ordering::Release);
                        replace += 1;
                    }
                    _ => {}
                }
            }
            in_flight.retain(|f| !f.left_behind.load(Ordering::Acquire));
        }
        for _ in 0..replace {
            if let Err(e) = spawn_starter(shared) {
                tracing::error!("starting a starter thread in place of one left behind: {e:#}");
            }
        }
    }
}
