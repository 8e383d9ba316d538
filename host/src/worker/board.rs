//! What a worker is doing right now: each task's role and phase, its changelog lag, how fast
//! it restores and how long it has been unable to process; and the worker's rebalances.
//! Served as JSON at `GET /status` (read by `sluice status`) and exported as metrics.
//! Tasks report to it through [`TaskProgress`], the worker loop directly.
//!
//! The worker loop, the tasks and their state restoration write here; readers get a copy.
//! Everything is kept per task, under one lock taken a few times per second at most (never
//! per record).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod families;
mod status;

use families::{labels, role_labels};
pub use families::{BoardMetrics, PhaseLabels};
pub use status::{HandoverStatus, Narrowed, Phase, Role, TaskStatus, WorkerStatus};

use crate::group::TaskId;
use crate::task::TaskProgress;

/// A task moving here: when its revoking round began, when it was assigned here, and when
/// it began processing.
struct Move {
    round: Instant,
    assigned: Instant,
    started: Option<Instant>,
}

/// How many handovers the status keeps.
const RECENT_HANDOVERS: usize = 16;

struct Entry {
    role: Role,
    phase: Phase,
    since: Instant,
    lag: Option<i64>,
    restored: u64,
    /// What was there to replay when the role began (for progress).
    to_restore: Option<i64>,
    rate: Option<f64>,
    /// Learners and standbys: the last position seen, and when.
    sample: Option<(Instant, i64)>,
    unavailable: Duration,
    unavailable_since: Option<Instant>,
    error: Option<String>,
    /// What it waits for besides its records (a schema from the registry), and since when.
    waiting: Option<(String, Instant)>,
}

impl Entry {
    fn new(role: Role, now: Instant) -> Entry {
        Entry {
            role,
            phase: Phase::Starting,
            since: now,
            lag: None,
            restored: 0,
            to_restore: None,
            rate: None,
            sample: None,
            unavailable: Duration::ZERO,
            unavailable_since: (role == Role::Active).then_some(now),
            error: None,
            waiting: None,
        }
    }

    fn unavailable(&self, now: Instant) -> Duration {
        self.unavailable + self.unavailable_since.map_or(Duration::ZERO, |s| now.duration_since(s))
    }

    /// Stops the unavailability clock (the task processes, or is no longer active here);
    /// returns the stretch it adds.
    fn available(&mut self, now: Instant) -> Duration {
        let stretch = self
            .unavailable_since
            .take()
            .map_or(Duration::ZERO, |s| now.duration_since(s));
        self.unavailable += stretch;
        stretch
    }
}

#[derive(Default)]
struct Inner {
    /// An assignment was applied (or, outside a cluster, the tasks were started).
    ready: bool,
    tasks: BTreeMap<TaskId, Entry>,
    generation: i32,
    leader: bool,
    /// The group metadata version of the last assignment (0: none yet).
    speaking: u16,
    leaving: bool,
    rebalancing_since: Option<Instant>,
    rebalances: u64,
    last_rebalance: Option<Duration>,
    rebalance_total: Duration,
    moving: BTreeMap<TaskId, Move>,
    /// Finished handovers (when, what), newest last.
    handovers: std::collections::VecDeque<(Instant, HandoverStatus)>,
}

/// A worker's live status (see the module docs).
pub struct Board {
    inner: Mutex<Inner>,
    metrics: BoardMetrics,
}

/// Weight of the newest sample in the smoothed restore rate.
const RATE_WEIGHT: f64 = 0.5;

impl Board {
    pub fn new(metrics: BoardMetrics) -> Board {
        Board {
            inner: Mutex::new(Inner::default()),
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere while holding it leaves consistent (if stale) figures.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A rebalance begins (a join is sent); does nothing if one is going on already.
    pub fn rebalance_started(&self) {
        let mut inner = self.lock();
        if inner.rebalancing_since.is_none() {
            inner.rebalancing_since = Some(Instant::now());
        }
    }

    /// The assignment of `generation` is applied and asks for no further join: the
    /// rebalance is over. `active`, `standby` and `learner` are this worker's tasks now.
    pub fn assigned(&self, generation: i32, leader: bool, active: &[TaskId], standby: &[TaskId], learner: &[TaskId]) {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.generation = generation;
        inner.leader = leader;
        self.metrics.generation.set(generation as i64);
        self.set_roles(&mut inner, now, active, standby, learner);
    }

    /// The group metadata version the last assignment came in: the version every member of
    /// the group speaks.
    pub fn speaking(&self, version: u16) {
        self.lock().speaking = version;
    }

    /// Every task of this worker is active (a worker outside any cluster).
    pub fn all_active(&self, tasks: &[TaskId]) {
        let mut inner = self.lock();
        self.set_roles(&mut inner, Instant::now(), tasks, &[], &[]);
    }

    /// The rebalance that began with [`Self::rebalance_started`] is over.
    pub fn rebalance_finished(&self) {
        let mut inner = self.lock();
        if let Some(since) = inner.rebalancing_since.take() {
            let took = since.elapsed();
            inner.rebalances += 1;
            inner.last_rebalance = Some(took);
            inner.rebalance_total += took;
            self.metrics.rebalances.inc();
            self.metrics.rebalance_seconds.observe(took.as_secs_f64());
        }
    }

    pub fn set_leaving(&self, leaving: bool) {
        self.lock().leaving = leaving;
    }

    /// Whether the worker holds an assignment (for `/readyz`).
    pub fn ready(&self) -> bool {
        self.lock().ready
    }

    /// The worker holds no assignment any more (it lost its membership): `/readyz` answers
    /// 503 until the next one.
    pub fn not_ready(&self) {
        self.lock().ready = false;
    }

    fn set_roles(&self, inner: &mut Inner, now: Instant, active: &[TaskId], standby: &[TaskId], learner: &[TaskId]) {
        inner.ready = true;
        let mut wanted: BTreeMap<&TaskId, Role> = BTreeMap::new();
        for t in standby {
            wanted.insert(t, Role::Standby);
        }
        for t in learner {
            wanted.insert(t, Role::Learner);
        }
        for t in active {
            wanted.insert(t, Role::Active);
        }
        let gone: Vec<TaskId> = inner
            .tasks
            .keys()
            .filter(|t| !wanted.contains_key(t))
            .cloned()
            .collect();
        for t in gone {
            if let Some(mut e) = inner.tasks.remove(&t) {
                self.count_unavailable(&t, e.available(now));
                self.metrics.role.remove(&role_labels(&t, e.role));
                self.metrics.lag.remove(&labels(&t));
            }
        }
        for (t, role) in wanted {
            match inner.tasks.get_mut(t) {
                Some(e) if e.role == role => {}
                Some(e) => {
                    self.metrics.role.remove(&role_labels(t, e.role));
                    self.metrics.role.get_or_create(&role_labels(t, role)).set(1);
                    let stretch = e.available(now);
                    self.count_unavailable(t, stretch);
                    let unavailable = e.unavailable;
                    *e = Entry::new(role, now);
                    e.unavailable = unavailable;
                }
                None => {
                    self.metrics.role.get_or_create(&role_labels(t, role)).set(1);
                    inner.tasks.insert(t.clone(), Entry::new(role, now));
                }
            }
        }
    }

    fn count_unavailable(&self, task: &TaskId, stretch: Duration) {
        if !stretch.is_zero() {
            self.metrics
                .unavailable
                .get_or_create(&labels(task))
                .inc_by(stretch.as_secs_f64());
        }
    }

    /// An active task replays its changelog: `restored` of `total` records, at `rate`.
    pub fn restoring(&self, task: &TaskId, restored: u64, total: u64, rate: f64) {
        let mut inner = self.lock();
        if let Some(e) = inner.tasks.get_mut(task) {
            e.phase = Phase::Restoring;
            e.restored = restored;
            e.to_restore = Some(total as i64);
            e.lag = Some(total.saturating_sub(restored) as i64);
            e.rate = Some(rate);
            self.metrics
                .lag
                .get_or_create(&labels(task))
                .set(total.saturating_sub(restored) as i64);
        }
    }

    /// Tasks revoked from this worker finished their final commits, `took` after the
    /// assignment that revoked them.
    pub fn revoked(&self, tasks: &[TaskId], took: Duration) {
        let now = Instant::now();
        let mut inner = self.lock();
        for task in tasks {
            self.observe("revoke", took);
            inner.push_handover(
                now,
                HandoverStatus {
                    task: task.to_string(),
                    direction: "out".into(),
                    revoke_seconds: Some(took.as_secs_f64()),
                    ..Default::default()
                },
            );
        }
    }

    /// Tasks assigned here now after a round that revoked them elsewhere (that round's
    /// assignment came at `round`): their handover is timed until their first output.
    pub fn moving_here(&self, tasks: &[TaskId], round: Instant) {
        let now = Instant::now();
        let mut inner = self.lock();
        for task in tasks {
            inner.moving.insert(
                task.clone(),
                Move {
                    round,
                    assigned: now,
                    started: None,
                },
            );
        }
    }

    /// A task produced its first records here: a handover in progress is over.
    pub fn first_output(&self, task: &TaskId) {
        let now = Instant::now();
        let mut inner = self.lock();
        let Some(m) = inner.moving.remove(task) else { return };
        let Some(started) = m.started else { return };
        let phases = [
            ("rebalance", m.assigned - m.round),
            ("start", started - m.assigned),
            ("first_output", now - started),
            ("total", now - m.round),
        ];
        for (phase, took) in phases {
            self.observe(phase, took);
        }
        let s = |d: Duration| Some(d.as_secs_f64());
        inner.push_handover(
            now,
            HandoverStatus {
                task: task.to_string(),
                direction: "in".into(),
                rebalance_seconds: s(phases[0].1),
                start_seconds: s(phases[1].1),
                first_output_seconds: s(phases[2].1),
                total_seconds: s(phases[3].1),
                ..Default::default()
            },
        );
    }

    fn observe(&self, phase: &str, took: Duration) {
        self.metrics
            .handover_seconds
            .get_or_create(&PhaseLabels { phase: phase.into() })
            .observe(took.as_secs_f64());
    }

    /// An active task has started processing.
    pub fn processing(&self, task: &TaskId) {
        let now = Instant::now();
        let mut inner = self.lock();
        if let Some(m) = inner.moving.get_mut(task) {
            m.started = Some(now);
        }
        if let Some(e) = inner.tasks.get_mut(task) {
            e.phase = Phase::Running;
            e.lag = Some(0);
            e.error = None;
            let stretch = e.available(now);
            self.count_unavailable(task, stretch);
            self.metrics.lag.get_or_create(&labels(task)).set(0);
        }
    }

    /// A task waits for something besides its records (`what`), or no longer (none).
    pub fn waiting(&self, task: &TaskId, what: Option<String>) {
        let mut inner = self.lock();
        if let Some(e) = inner.tasks.get_mut(task) {
            e.waiting = match (what, e.waiting.take()) {
                (Some(what), Some((_, since))) => Some((what, since)),
                (Some(what), None) => Some((what, Instant::now())),
                (None, _) => None,
            };
        }
    }

    /// An active task ended on its own: failed for good (`error`), or to start again.
    pub fn ended(&self, task: &TaskId, error: Option<String>) {
        let now = Instant::now();
        let mut inner = self.lock();
        if let Some(e) = inner.tasks.get_mut(task).filter(|e| e.role == Role::Active) {
            e.waiting = None;
            if e.phase == Phase::Running {
                e.unavailable_since = Some(now);
            }
            e.phase = if error.is_some() {
                Phase::Failed
            } else {
                Phase::Starting
            };
            e.error = error;
        }
    }

    /// Where the standbys and learners are (changelog offset sums) and where their
    /// changelogs end.
    pub fn positions(
        &self,
        positions: &std::collections::HashMap<TaskId, i64>,
        ends: &std::collections::HashMap<TaskId, i64>,
    ) {
        let now = Instant::now();
        let mut inner = self.lock();
        for (t, e) in inner.tasks.iter_mut().filter(|(_, e)| e.role != Role::Active) {
            let Some(&at) = positions.get(t) else { continue };
            if let Some((when, before)) = e.sample {
                let secs = now.duration_since(when).as_secs_f64();
                if secs > 0.05 {
                    let rate = (at - before).max(0) as f64 / secs;
                    e.rate = Some(e.rate.map_or(rate, |r| r * (1.0 - RATE_WEIGHT) + rate * RATE_WEIGHT));
                    e.restored += (at - before).max(0) as u64;
                    e.sample = Some((now, at));
                }
            } else {
                e.sample = Some((now, at));
            }
            if let Some(&end) = ends.get(t) {
                let lag = (end - at).max(0);
                e.lag = Some(lag);
                if e.to_restore.is_none() {
                    e.to_restore = Some(lag);
                }
                self.metrics.lag.get_or_create(&labels(t)).set(lag);
            }
        }
    }

    /// A copy of everything, for `GET /status`.
    pub fn snapshot(&self) -> WorkerStatus {
        let now = Instant::now();
        let inner = self.lock();
        let tasks = inner
            .tasks
            .iter()
            .map(|(t, e)| TaskStatus {
                task: t.to_string(),
                role: e.role,
                phase: (e.role == Role::Active).then_some(e.phase),
                lag: e.lag,
                restored: e.restored,
                restore_rate: e.rate,
                progress: progress(e),
                unavailable_seconds: e.unavailable(now).as_secs_f64(),
                in_role_seconds: now.duration_since(e.since).as_secs_f64(),
                error: e.error.clone(),
                waiting: e
                    .waiting
                    .as_ref()
                    .map(|(what, since)| format!("{what}, for {:.0} s", now.duration_since(*since).as_secs_f64())),
            })
            .collect();
        WorkerStatus {
            release: crate::VERSION.to_string(),
            metadata_version: inner.speaking,
            generation: inner.generation,
            leader: inner.leader,
            leaving: inner.leaving,
            rebalancing: inner.rebalancing_since.is_some(),
            rebalances: inner.rebalances,
            last_rebalance_seconds: inner.last_rebalance.map(|d| d.as_secs_f64()),
            rebalance_seconds_total: inner.rebalance_total.as_secs_f64(),
            tasks,
            handovers: inner
                .handovers
                .iter()
                .rev()
                .map(|(at, h)| HandoverStatus {
                    ago_seconds: now.duration_since(*at).as_secs_f64(),
                    ..h.clone()
                })
                .collect(),
            // The runtime's, added by `WorkerHandle::status`.
            compiles: Vec::new(),
            // Set by the admin API, for a tenant's answer.
            narrowed_to: None,
        }
    }
}

impl Inner {
    fn push_handover(&mut self, at: Instant, handover: HandoverStatus) {
        if self.handovers.len() == RECENT_HANDOVERS {
            self.handovers.pop_front();
        }
        self.handovers.push_back((at, handover));
    }
}

impl TaskProgress for Board {
    fn restoring(&self, task: &TaskId, restored: u64, total: u64, rate: f64) {
        Board::restoring(self, task, restored, total, rate);
    }

    fn processing(&self, task: &TaskId) {
        Board::processing(self, task);
    }

    fn first_output(&self, task: &TaskId) {
        Board::first_output(self, task);
    }

    fn waiting(&self, task: &TaskId, what: Option<String>) {
        Board::waiting(self, task, what);
    }
}

/// Share replayed of what there was to replay when the role began.
fn progress(e: &Entry) -> Option<f64> {
    if e.role == Role::Active && e.phase == Phase::Running {
        return Some(1.0);
    }
    let lag = e.lag?;
    let total = (e.restored as i64 + lag).max(e.to_restore.unwrap_or(0));
    Some(if total <= 0 {
        1.0
    } else {
        (1.0 - lag as f64 / total as f64).clamp(0.0, 1.0)
    })
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;

    fn board() -> Board {
        Board::new(BoardMetrics::new())
    }

    #[test]
    fn an_active_task_is_unavailable_until_it_processes_and_learners_show_progress() {
        let b = board();
        let (a, l) = (TaskId::new("t", 0), TaskId::new("t", 1));
        b.rebalance_started();
        b.assigned(3, true, std::slice::from_ref(&a), &[], std::slice::from_ref(&l));
        b.rebalance_finished();
        std::thread::sleep(Duration::from_millis(30));
        b.restoring(&a, 50, 100, 1000.0);
        let s = b.snapshot();
        assert_eq!(s.generation, 3);
        assert_eq!(s.rebalances, 1);
        let active = &s.tasks[0];
        assert_eq!((active.role, active.phase), (Role::Active, Some(Phase::Restoring)));
        assert_eq!(active.lag, Some(50));
        assert!(active.unavailable_seconds >= 0.03, "{}", active.unavailable_seconds);
        b.processing(&a);
        std::thread::sleep(Duration::from_millis(20));
        let s = b.snapshot();
        let unavailable = s.tasks[0].unavailable_seconds;
        assert_eq!((s.tasks[0].phase, s.tasks[0].lag), (Some(Phase::Running), Some(0)));
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            b.snapshot().tasks[0].unavailable_seconds,
            unavailable,
            "the clock stopped"
        );

        let ends = [(l.clone(), 1000)].into_iter().collect();
        b.positions(&[(l.clone(), 200)].into_iter().collect(), &ends);
        std::thread::sleep(Duration::from_millis(100));
        b.positions(&[(l.clone(), 600)].into_iter().collect(), &ends);
        let learner = b.snapshot().tasks[1].clone();
        assert_eq!(
            (learner.role, learner.lag, learner.restored),
            (Role::Learner, Some(400), 400)
        );
        assert_eq!(learner.progress, Some(0.5), "{learner:?}");
        assert!(learner.restore_rate.unwrap() > 1000.0, "{learner:?}");

        // Promoted: a new active entry keeps the unavailable time already counted.
        b.assigned(4, true, &[a.clone(), l.clone()], &[], &[]);
        let s = b.snapshot();
        assert_eq!(
            (s.tasks[1].role, s.tasks[1].phase),
            (Role::Active, Some(Phase::Starting))
        );
        b.assigned(5, false, &[], &[], &[]);
        assert!(b.snapshot().tasks.is_empty());
    }

    #[test]
    fn a_handover_is_timed_in_phases_until_the_first_output_and_the_old_owner_times_its_revoke() {
        let b = board();
        let t = TaskId::new("t", 2);
        let round = Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        b.moving_here(std::slice::from_ref(&t), round);
        std::thread::sleep(Duration::from_millis(20));
        b.processing(&t);
        // Not over until the task produces.
        assert!(b.snapshot().handovers.is_empty());
        std::thread::sleep(Duration::from_millis(10));
        b.first_output(&t);
        // A later first output (after a restart of the task here) is not another handover.
        b.processing(&t);
        b.first_output(&t);
        let s = b.snapshot();
        assert_eq!(s.handovers.len(), 1, "{:?}", s.handovers);
        let h = &s.handovers[0];
        assert_eq!((h.task.as_str(), h.direction.as_str()), ("t/2", "in"));
        let (rebalance, start, first) = (
            h.rebalance_seconds.unwrap(),
            h.start_seconds.unwrap(),
            h.first_output_seconds.unwrap(),
        );
        assert!(rebalance >= 0.02 && start >= 0.02 && first >= 0.01, "{h:?}");
        assert!(
            (h.total_seconds.unwrap() - (rebalance + start + first)).abs() < 0.005,
            "{h:?}"
        );
        assert_eq!(h.revoke_seconds, None);

        b.revoked(std::slice::from_ref(&t), Duration::from_millis(40));
        let s = b.snapshot();
        assert_eq!(s.handovers.len(), 2);
        assert_eq!(s.handovers[0].direction, "out", "newest first");
        assert_eq!(s.handovers[0].revoke_seconds, Some(0.04));
        // Only the last few are kept.
        for _ in 0..2 * RECENT_HANDOVERS {
            b.revoked(std::slice::from_ref(&t), Duration::from_millis(1));
        }
        assert_eq!(b.snapshot().handovers.len(), RECENT_HANDOVERS);

        let mut registry = Registry::default();
        b.metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for phase in ["revoke", "rebalance", "start", "first_output", "total"] {
            assert!(
                text.contains(&format!("handover_seconds_count{{phase=\"{phase}\"}}")),
                "{phase} in:\n{text}"
            );
        }
    }
}
