//! Dropping what ended off the path that waits: an ended task's guest instance and
//! producer, a restoration's Kafka client (destroying one takes about 100 ms while
//! librdkafka joins its threads), stores to close. Each drop runs on a thread of its own;
//! the worker waits for them all before it exits ([`Drops::settle`]), so that its stores are
//! closed when it does. A replaced Kafka client is dropped elsewhere too, not waited for
//! ([`elsewhere`]).

use std::sync::Mutex;
use std::thread::JoinHandle;

/// The worker's drops in flight.
#[derive(Default)]
pub struct Drops {
    running: Mutex<Vec<JoinHandle<()>>>,
}

impl Drops {
    /// Drops `what` on a thread of its own.
    pub fn later<T: Send + 'static>(&self, what: T) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running.retain(|t| !t.is_finished());
        match std::thread::Builder::new()
            .name("drop-ended".into())
            .spawn(move || drop(what))
        {
            Ok(handle) => running.push(handle),
            // No thread to be had: dropped here (the spawn hands `what` back by dropping it).
            Err(e) => tracing::warn!("dropping what ended on this thread: {e}"),
        }
    }

    /// Waits for every drop started so far.
    pub fn settle(&self) {
        let running = std::mem::take(&mut *self.running.lock().unwrap_or_else(|p| p.into_inner()));
        for t in running {
            let _ = t.join();
        }
    }
}

/// Drops `what` on a thread of its own, not waited for: a Kafka client replaced by one made
/// again (a renewed certificate), whose closing may wait on its connections and holds
/// nothing the worker must see closed before it exits.
pub fn elsewhere<T: Send + 'static>(what: T) {
    let spawned = std::thread::Builder::new()
        .name("client-drop".into())
        .spawn(move || drop(what));
    if let Err(e) = spawned {
        tracing::warn!("dropping a replaced client on this thread: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Counts its drops on the drop threads (and only there).
    struct Slow(Arc<AtomicUsize>);

    impl Drop for Slow {
        fn drop(&mut self) {
            std::thread::sleep(std::time::Duration::from_millis(50));
            if std::thread::current().name() == Some("drop-ended") {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    #[test]
    fn drops_run_elsewhere_and_settle_waits_for_them() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let drops = Drops::default();
        for _ in 0..3 {
            drops.later(Slow(dropped.clone()));
        }
        drops.settle();
        assert_eq!(dropped.load(Ordering::SeqCst), 3);
    }
}
