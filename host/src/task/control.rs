//! How the worker tells its tasks what they may do: the membership *lease* (may anything be
//! processed or committed at all?) and each task's stop request (stop cleanly, or abort).
//!
//! The lease is what makes "one owner per task" hold under faults. The group coordinator
//! hands a member's tasks to others once it has not heard a heartbeat for the session
//! timeout. Each successful heartbeat (or join) extends the lease to the moment that request
//! was *sent* plus the session timeout minus a margin, so the lease always ends before the
//! coordinator could have given the tasks away. Tasks check it before every batch and every
//! commit: a worker that was frozen (SIGSTOP), cut off, or simply slow finds its lease
//! expired the moment it wakes, before it can process or commit anything, and stops without
//! committing. The clock is monotonic, so it keeps running while the process is stopped.

use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

/// Until when this worker may process and commit its tasks.
#[derive(Debug)]
pub struct Lease {
    origin: Instant,
    /// Milliseconds after `origin`; `i64::MAX` for a worker that owns its tasks alone.
    until_ms: AtomicI64,
}

impl Lease {
    /// A lease that never ends (a worker outside any cluster owns every task).
    pub fn forever() -> Lease {
        Lease {
            origin: Instant::now(),
            until_ms: AtomicI64::new(i64::MAX),
        }
    }

    /// A lease that has not started (a cluster member before its first join).
    pub fn expired() -> Lease {
        Lease {
            origin: Instant::now(),
            until_ms: AtomicI64::new(i64::MIN),
        }
    }

    /// Whether tasks may process and commit now.
    pub fn valid(&self) -> bool {
        self.now_ms() < self.until_ms.load(Ordering::Acquire)
    }

    /// The coordinator heard from this member in a request sent at `sent`: the lease runs
    /// until `sent + length` (never shortened by an older request).
    pub fn renew(&self, sent: Instant, length: Duration) {
        let until = (sent.saturating_duration_since(self.origin) + length).as_millis() as i64;
        self.until_ms.fetch_max(until, Ordering::AcqRel);
    }

    /// Ends the lease now (membership is lost).
    pub fn revoke(&self) {
        self.until_ms.store(i64::MIN, Ordering::Release);
    }

    /// Time left, zero when expired.
    pub fn remaining(&self) -> Duration {
        let left = self.until_ms.load(Ordering::Acquire).saturating_sub(self.now_ms());
        Duration::from_millis(left.max(0) as u64)
    }

    fn now_ms(&self) -> i64 {
        self.origin.elapsed().as_millis() as i64
    }
}

/// What a task has been asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Run,
    /// Finish the batch, commit, close the guest, commit again.
    Stop,
    /// Stop at once without committing anything more (ownership is, or may be, lost).
    Abort,
}

/// A task's stop request, set by the worker and read by the task between steps.
#[derive(Debug, Default)]
pub struct TaskControl {
    request: AtomicU8,
}

impl TaskControl {
    pub fn request(&self) -> Request {
        match self.request.load(Ordering::Acquire) {
            0 => Request::Run,
            1 => Request::Stop,
            _ => Request::Abort,
        }
    }

    /// Asks for a clean stop (an abort already asked for stays an abort).
    pub fn stop(&self) {
        let _ = self.request.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire);
    }

    pub fn abort(&self) {
        self.request.store(2, Ordering::Release);
    }

    /// Whether the task should stop doing what it does (restoring, waiting).
    pub fn stopping(&self) -> bool {
        self.request() != Request::Run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_ends_at_the_send_time_plus_its_length_and_is_never_shortened() {
        let lease = Lease::expired();
        assert!(!lease.valid());
        let sent = Instant::now();
        lease.renew(sent, Duration::from_secs(60));
        assert!(lease.valid());
        // An answer to an older request does not shorten it.
        lease.renew(sent, Duration::from_millis(1));
        assert!(lease.remaining() > Duration::from_secs(50));
        lease.revoke();
        assert!(!lease.valid());
        let lease = Lease::expired();
        lease.renew(Instant::now(), Duration::from_millis(30));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!lease.valid(), "a lease that was not renewed expires");
        assert!(Lease::forever().valid());
    }

    #[test]
    fn an_abort_is_not_downgraded_to_a_stop() {
        let control = TaskControl::default();
        assert_eq!(control.request(), Request::Run);
        control.abort();
        control.stop();
        assert_eq!(control.request(), Request::Abort);
        let control = TaskControl::default();
        control.stop();
        assert_eq!(control.request(), Request::Stop);
        control.abort();
        assert_eq!(control.request(), Request::Abort);
    }
}
