//! Where a task's end is told: the thread that ran it ends the slot with the task's
//! outcome, and the worker waits on it.

use std::sync::{Condvar, Mutex};

use crate::task::{TaskError, TaskSummary};

/// How a task ended: its summary or error; `None` if the code driving it panicked.
pub(super) type Outcome = Option<Result<TaskSummary, TaskError>>;

/// The code driving a task panicked (the task is gone, nothing of it committed after).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Panicked;

/// Where a task's end is reported; the worker waits on it.
#[derive(Default)]
pub struct TaskSlot {
    outcome: Mutex<Option<Outcome>>,
    ended: Condvar,
    /// Told once: a start the watch gave up may still return later, and is not told again.
    told: std::sync::atomic::AtomicBool,
}

impl TaskSlot {
    /// Tells how the task ended (the first time only).
    pub(super) fn end(&self, outcome: Outcome) {
        if self.told.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        *self.outcome.lock().unwrap() = Some(outcome);
        self.ended.notify_all();
    }

    /// Whether its end was told already (its start was given up, say).
    pub(super) fn was_told(&self) -> bool {
        self.told.load(std::sync::atomic::Ordering::Acquire)
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
