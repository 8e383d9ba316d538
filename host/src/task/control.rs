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
    /// No renewal goes past this (milliseconds after `origin`; `i64::MAX`: none): set while
    /// a rebalance waits for this member, which the coordinator drops (and gives its tasks
    /// away) once the rebalance timeout has passed without its join, heartbeats or not.
    ceiling_ms: AtomicI64,
}

impl Lease {
    /// A lease that never ends (a worker outside any cluster owns every task).
    pub fn forever() -> Lease {
        Lease {
            origin: Instant::now(),
            until_ms: AtomicI64::new(i64::MAX),
            ceiling_ms: AtomicI64::new(i64::MAX),
        }
    }

    /// A lease that has not started (a cluster member before its first join).
    pub fn expired() -> Lease {
        Lease {
            origin: Instant::now(),
            until_ms: AtomicI64::new(i64::MIN),
            ceiling_ms: AtomicI64::new(i64::MAX),
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
        let until = until.min(self.ceiling_ms.load(Ordering::Acquire));
        self.until_ms.fetch_max(until, Ordering::AcqRel);
    }

    /// From now on no renewal reaches past `at` (an earlier ceiling stays), and the lease
    /// ends there if it ran longer.
    pub fn cap_at(&self, at: Instant) {
        let ceiling = at.saturating_duration_since(self.origin).as_millis() as i64;
        let ceiling = self.ceiling_ms.fetch_min(ceiling, Ordering::AcqRel).min(ceiling);
        self.until_ms.fetch_min(ceiling, Ordering::AcqRel);
    }

    /// Renewals may reach as far as they go again (this member has rejoined).
    pub fn lift_cap(&self) {
        self.ceiling_ms.store(i64::MAX, Ordering::Release);
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

/// The membership a transaction proves under exactly-once (KIP-447's fencing by generation,
/// on the cluster's group): with the offsets it commits, every stream thread's transaction
/// sends one more offset commit, to the cluster's group, carrying this worker's member id and
/// generation. The group coordinator refuses it from a worker that is no longer a member or
/// holds an older generation, and the refused transaction can only abort: a worker that lost
/// a task (frozen, cut off, slow to notice a rebalance) can commit nothing for it once the
/// group has moved on. Why that covers every way a task moves is in `docs/guarantees.md`.
#[derive(Debug)]
pub struct Fence {
    state: std::sync::Mutex<FenceState>,
}

#[derive(Debug, Clone)]
enum FenceState {
    /// A worker outside any cluster: its tasks are its own; nothing to prove.
    Alone,
    /// A cluster member before its first join, or after its membership was lost.
    Out {
        group: String,
        topic: String,
    },
    Member(FenceToken),
}

/// What a transaction commits to the cluster's group to prove the membership it ran under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FenceToken {
    /// The cluster's group (`sluice.cluster.NAME`).
    pub group: String,
    pub member_id: String,
    pub generation: i32,
    pub instance_id: Option<String>,
    /// The partition whose offset (in the cluster's group) the proof commits: partition 0 of
    /// the cluster's registry topic, which every worker may read (the broker checks it
    /// exists). Nothing reads that offset.
    pub topic: String,
}

/// Why a transaction may not commit now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotMember;

impl Fence {
    /// For a worker outside any cluster.
    pub fn alone() -> Fence {
        Fence {
            state: std::sync::Mutex::new(FenceState::Alone),
        }
    }

    /// For a member of the cluster group `group` (not joined yet); `topic` is the registry.
    pub fn cluster(group: &str, topic: &str) -> Fence {
        Fence {
            state: std::sync::Mutex::new(FenceState::Out {
                group: group.to_string(),
                topic: topic.to_string(),
            }),
        }
    }

    /// The worker joined the group as `member_id` in `generation`.
    pub fn admit(&self, member_id: &str, generation: i32, instance_id: Option<&str>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (group, topic) = match &*state {
            FenceState::Alone => return,
            FenceState::Out { group, topic } => (group.clone(), topic.clone()),
            FenceState::Member(t) => (t.group.clone(), t.topic.clone()),
        };
        *state = FenceState::Member(FenceToken {
            group,
            member_id: member_id.to_string(),
            generation,
            instance_id: instance_id.map(str::to_string),
            topic,
        });
    }

    /// The membership is lost: no transaction commits until the worker joins again.
    pub fn revoke(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let FenceState::Member(t) = &*state {
            *state = FenceState::Out {
                group: t.group.clone(),
                topic: t.topic.clone(),
            };
        }
    }

    /// What a transaction committed now must prove: nothing (alone), the membership, or
    /// [`NotMember`] (commit nothing).
    pub fn token(&self) -> Result<Option<FenceToken>, NotMember> {
        match &*self.state.lock().unwrap_or_else(|p| p.into_inner()) {
            FenceState::Alone => Ok(None),
            FenceState::Out { .. } => Err(NotMember),
            FenceState::Member(t) => Ok(Some(t.clone())),
        }
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

/// A task's stop request, set by the worker and read by the task between steps; and, while
/// it starts, which step of its start it is at and since when (a watch gives each step a
/// deadline).
#[derive(Debug, Default)]
pub struct TaskControl {
    request: AtomicU8,
    start: std::sync::Mutex<Option<StartStep>>,
    /// Why its start was given up (the watch found a step past its deadline).
    abandoned: std::sync::Mutex<Option<String>>,
    /// Raised with every request, for the stream thread running the task: it stops
    /// waiting for records and gives its tasks their turns at once.
    waker: std::sync::OnceLock<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// A step of a task's start, with its deadline (without progress).
#[derive(Debug, Clone, Copy)]
pub struct StartStep {
    pub what: &'static str,
    pub deadline: Duration,
    /// When the step began, or last made progress.
    pub since: Instant,
}

impl TaskControl {
    /// The task's start is at step `what`, which may take `deadline` without progress.
    pub fn enter(&self, what: &'static str, deadline: Duration) {
        *self.start.lock().unwrap_or_else(|p| p.into_inner()) = Some(StartStep {
            what,
            deadline,
            since: Instant::now(),
        });
    }

    /// The step of the start made progress (a restore read a batch).
    pub fn progress(&self) {
        if let Some(step) = self.start.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            step.since = Instant::now();
        }
    }

    /// The start is over (the task runs, or ended).
    pub fn started(&self) {
        *self.start.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The step the start is at, if it is starting.
    pub fn step(&self) -> Option<StartStep> {
        *self.start.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives the start up for `why`: it is aborted, and ends as failed (to be started again).
    pub fn abandon(&self, why: String) {
        *self.abandoned.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.abort();
    }

    /// Why the start was given up, if it was.
    pub fn abandoned(&self) -> Option<String> {
        self.abandoned.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

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
        self.wake();
    }

    pub fn abort(&self) {
        self.request.store(2, Ordering::Release);
        self.wake();
    }

    /// `flag` is raised with every request from now on (and at once if one was made).
    pub fn wake_with(&self, flag: std::sync::Arc<std::sync::atomic::AtomicBool>) {
        let flag = self.waker.get_or_init(|| flag);
        if self.stopping() {
            flag.store(true, Ordering::Release);
        }
    }

    fn wake(&self) {
        if let Some(flag) = self.waker.get() {
            flag.store(true, Ordering::Release);
        }
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
    fn a_capped_lease_is_not_renewed_past_its_cap_until_the_cap_is_lifted() {
        let lease = Lease::expired();
        lease.renew(Instant::now(), Duration::from_secs(60));
        // A rebalance waits for this member: it must rejoin within 50 ms, heartbeats or not.
        lease.cap_at(Instant::now() + Duration::from_millis(50));
        assert!(
            lease.remaining() <= Duration::from_millis(50),
            "the cap shortens the lease"
        );
        lease.renew(Instant::now(), Duration::from_secs(60));
        assert!(
            lease.remaining() <= Duration::from_millis(50),
            "a heartbeat does not lift it"
        );
        std::thread::sleep(Duration::from_millis(80));
        assert!(!lease.valid(), "past the cap the tasks stop");
        lease.lift_cap();
        lease.renew(Instant::now(), Duration::from_secs(60));
        assert!(lease.remaining() > Duration::from_secs(50), "rejoined: renewed in full");
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

    #[test]
    fn a_fence_proves_the_last_generation_joined_and_nothing_once_revoked() {
        let alone = Fence::alone();
        assert_eq!(alone.token(), Ok(None), "a worker alone proves nothing");
        alone.revoke();
        assert_eq!(alone.token(), Ok(None));

        let fence = Fence::cluster("sluice.cluster.c", "sluice.cluster.c.registry");
        assert_eq!(fence.token(), Err(NotMember), "before the first join");
        fence.admit("m-1", 4, Some("w1"));
        let token = fence.token().unwrap().unwrap();
        assert_eq!(
            (
                token.group.as_str(),
                token.member_id.as_str(),
                token.generation,
                token.instance_id.as_deref()
            ),
            ("sluice.cluster.c", "m-1", 4, Some("w1"))
        );
        assert_eq!(token.topic, "sluice.cluster.c.registry");
        fence.admit("m-1", 5, Some("w1"));
        assert_eq!(fence.token().unwrap().unwrap().generation, 5);
        fence.revoke();
        assert_eq!(fence.token(), Err(NotMember), "a lost membership proves nothing");
        fence.admit("m-2", 7, None);
        assert_eq!(fence.token().unwrap().unwrap().member_id, "m-2");
    }
}
