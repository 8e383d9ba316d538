//! How the worker talks to its standby thread: commands, and what the thread shares
//! (how far each standby has read, whether a removal waits).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};

use super::super::changelogs::KafkaChangelogs;
use super::Standbys;
use crate::group::TaskId;
use crate::kafka::KafkaSettings;
use crate::state::dir::StateDir;
use crate::state::warm::{handover, Handover, HandoverSender, WarmStores};
use crate::topology::Changelog;

/// How stopping a standby ended: records it applied, or why it failed.
pub(super) type Removed = Result<u64, String>;

pub(super) enum Command {
    /// Start a standby of a task with these changelogs, with its stores if they are open
    /// already.
    Add(TaskId, Vec<Changelog>, WarmStores),
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

/// The worker's standby thread.
pub struct StandbyUpdater {
    commands: Option<Sender<Command>>,
    thread: Option<std::thread::JoinHandle<()>>,
    positions: Positions,
    /// Set while a removal waits: the thread cuts its round short (a round of 50,000
    /// records held a promoted learner's handover up for 0.16 s).
    urgent: Arc<AtomicBool>,
}

impl StandbyUpdater {
    /// Starts the thread; `rate`: most changelog records a second it reads (none: no limit).
    pub fn start(kafka: &KafkaSettings, state: Arc<StateDir>, rate: Option<u64>) -> anyhow::Result<StandbyUpdater> {
        let changelogs = KafkaChangelogs::new(kafka, "sluice-standby", rate)?;
        let (tx, rx) = mpsc::channel();
        let standbys = Standbys::new(changelogs, state, rate);
        let (positions, urgent) = (standbys.positions.clone(), standbys.urgent.clone());
        let thread = std::thread::Builder::new()
            .name("standbys".into())
            .spawn(move || standbys.run(rx))?;
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

    /// Starts keeping `task` warm, the stores of `changelogs`, on `warm` (its stores open
    /// already) where given (failures are logged: a standby never affects active tasks).
    pub fn add(&self, task: TaskId, changelogs: Vec<Changelog>, warm: WarmStores) {
        if let Some(tx) = &self.commands {
            let _ = tx.send(Command::Add(task, changelogs, warm));
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
