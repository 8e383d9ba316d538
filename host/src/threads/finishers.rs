//! Finisher threads: a task asked to stop leaves its stream thread at once and makes its
//! final commit here (wait for its produced records, commit its offsets, close the guest,
//! commit what closing wrote), so that the tasks staying on that thread do not pause for
//! it, and the final commits of several revoked tasks (a drain moves all of a worker's
//! tasks) run side by side instead of one after another.

use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::slot::TaskSlot;
use crate::kafka::KafkaSettings;
use crate::task::{KafkaEnv, Task};

/// How many tasks make their final commits at once.
const FINISHERS: usize = 4;

/// A task that left its stream thread to finish, and where its end is told.
pub(super) type Finishing = (Box<Task>, Arc<TaskSlot>);

/// Starts the finisher threads; they end when every sender is dropped.
pub(super) fn start(kafka: &KafkaSettings) -> anyhow::Result<Sender<Finishing>> {
    let (tx, rx) = mpsc::channel::<Finishing>();
    let rx = Arc::new(Mutex::new(rx));
    for n in 0..FINISHERS {
        let env = KafkaEnv::new(kafka)?;
        let rx = rx.clone();
        std::thread::Builder::new()
            .name(format!("finisher-{n}"))
            .spawn(move || run(env, &rx))?;
    }
    Ok(tx)
}

fn run(mut env: KafkaEnv, jobs: &Mutex<Receiver<Finishing>>) {
    loop {
        let job = jobs.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let Ok((task, slot)) = job else { return };
        finish(task, &slot, &mut env);
    }
}

/// Drives a task that was asked to stop to its end (one step makes its final commits, or
/// aborts it if it was asked to abort meanwhile), then lets go of it as a stream thread
/// does (see `stream::ThreadTasks::end`) and tells its slot.
pub(super) fn finish(mut task: Box<Task>, slot: &TaskSlot, env: &mut KafkaEnv) {
    let began = std::time::Instant::now();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loop {
        if let Some(end) = task.step(env) {
            return end;
        }
        // Not possible once asked to stop; never spin if it were.
        std::thread::sleep(Duration::from_millis(10));
    }));
    if outcome.is_err() {
        tracing::error!(task = %task.id(), "a task's final commit panicked");
    }
    task.return_stores();
    let (drops, id) = (task.drops(), task.id().to_string());
    drops.later(task);
    tracing::debug!(target: "handover", task = %id, ms = began.elapsed().as_millis() as u64, "finished off its stream thread");
    slot.end(outcome.ok());
}
