//! Warm stores: open databases passed from their last user to their next as a value, so
//! that a handover neither closes a store nor opens it again (closing waits for running
//! compactions, opening reads every file's footer: up to 0.8 s of a handover on a busy
//! machine).
//!
//! Two paths carry them, and ownership says who closes a store at every point:
//!
//! - **A learner (or standby) becomes active.** The state updater reads its changelogs'
//!   tail, then sends its stores through a [`Handover`]; the task's start waits for them.
//!   A start that gives up drops its end of the handover, and the stores close where they
//!   are.
//! - **An active task ends here.** It returns its stores to the worker's task runner, which
//!   passes them to the next user here (the task started again, or a standby of it) or, if
//!   the task is no longer this worker's, closes them.

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use super::engine::Db;

/// A task's open stores, by store name.
pub type WarmStores = HashMap<String, Db>;

/// The receiving end of a handover: the stores a learner hands to its task's start.
pub struct Handover(Receiver<WarmStores>);

/// The sending end, held by the state updater until the learner's tail is read.
pub struct HandoverSender(Sender<WarmStores>);

/// A handover's two ends.
pub fn handover() -> (HandoverSender, Handover) {
    let (tx, rx) = mpsc::channel();
    (HandoverSender(tx), Handover(rx))
}

impl HandoverSender {
    /// Hands the stores over; if the start gave up waiting, they close here.
    pub fn send(self, stores: WarmStores) {
        let _ = self.0.send(stores);
    }
}

/// How waiting for a handover ended.
pub enum Waited {
    /// The stores, open.
    Stores(WarmStores),
    /// None come: the learner failed (its stores are closed) or it took longer than the
    /// patience given. The start opens what is on disk.
    Nothing,
    /// `stop` said to stop.
    Stopped,
}

impl Handover {
    /// Waits for the stores, checking `stop` every 50 ms, for at most `patience` (a
    /// handover is bounded: the learner reads its tail for at most two seconds).
    pub fn wait(self, stop: &dyn Fn() -> bool, patience: Duration) -> Waited {
        let deadline = Instant::now() + patience;
        loop {
            match self.0.recv_timeout(Duration::from_millis(50)) {
                Ok(stores) => return Waited::Stores(stores),
                Err(RecvTimeoutError::Disconnected) => return Waited::Nothing,
                Err(RecvTimeoutError::Timeout) if stop() => return Waited::Stopped,
                Err(RecvTimeoutError::Timeout) if Instant::now() >= deadline => {
                    tracing::warn!(
                        "a learner's handover took longer than {patience:?}: opening the stores as they are on disk"
                    );
                    return Waited::Nothing;
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }
}

/// What a starting task is given of its state, if anything.
pub enum Warm {
    /// Its learner's stores, on their way.
    Handover(Handover),
    /// The stores it (or its standby) left here when it last ended.
    Returned(WarmStores),
}

impl Warm {
    /// The stores (none: open them from disk), or none at all if `stop` said to stop.
    pub fn take(self, stop: &dyn Fn() -> bool, patience: Duration) -> Option<WarmStores> {
        match self {
            Warm::Returned(stores) => Some(stores),
            Warm::Handover(handover) => match handover.wait(stop, patience) {
                Waited::Stores(stores) => Some(stores),
                Waited::Nothing => Some(WarmStores::new()),
                Waited::Stopped => None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::engine::Storage;
    use super::super::memory::MemoryStorage;
    use super::*;

    #[test]
    fn a_handover_brings_the_open_stores_or_says_none_come() {
        let storage = MemoryStorage::new();
        let path = std::path::Path::new("/t/0/counts");
        let (tx, rx) = handover();
        let db = storage.open(path).unwrap();
        std::thread::spawn(move || tx.send(WarmStores::from([("counts".to_string(), db)])));
        let Waited::Stores(stores) = rx.wait(&|| false, Duration::from_secs(5)) else {
            panic!("the stores were sent");
        };
        assert!(storage.is_open(path), "handed over open");
        drop(stores);
        assert!(!storage.is_open(path), "closed by their last owner");

        // The learner failed: its sender is gone, and the start opens the disk's.
        let (tx, rx) = handover();
        drop(tx);
        assert!(matches!(rx.wait(&|| false, Duration::from_secs(5)), Waited::Nothing));
        // Stopped while waiting; then the stores sent close on the sender's side.
        let (tx, rx) = handover();
        assert!(matches!(rx.wait(&|| true, Duration::from_secs(5)), Waited::Stopped));
        tx.send(WarmStores::from([("counts".to_string(), storage.open(path).unwrap())]));
        assert!(!storage.is_open(path));
        // Never sent within the patience.
        let (_tx, rx) = handover();
        assert!(matches!(
            rx.wait(&|| false, Duration::from_millis(120)),
            Waited::Nothing
        ));
    }
}
