//! A stream thread's fair shares of thread time (start-time fair queueing): which of its
//! tasks may take a call now. Pure bookkeeping: the stream thread tells it the thread time
//! each task's calls held (`Task::thread_time`, charged per call as `task::thread_charge`
//! says) and which tasks have work, and asks it who may go; no threads, no Kafka.

use std::time::{Duration, Instant};

/// Over how long a stream thread measures whether it is saturated.
const SATURATION_WINDOW: Duration = Duration::from_millis(500);

/// How far ahead of the least-served busy task a task may be and still get a call: a round,
/// so tasks of like cost are not held back (their partitions paused) for small differences.
pub(super) const FAIR_QUANTUM: Duration = super::ROUND;

/// The fair shares of one stream thread's tasks, by the task's slot on the thread.
pub(super) struct FairShare {
    accounts: Vec<Option<Account>>,
    /// The least start tag among the busy tasks: where a task that had no work joins in.
    entry: Duration,
    /// Thread time charged since `window` began, and whether the last window was saturated
    /// (charged at least half of it): shares are enforced only then.
    charged: Duration,
    window: Instant,
    saturated: bool,
}

/// One task's account.
#[derive(Debug, Clone)]
struct Account {
    /// Thread time charged to it here (its virtual time), its virtual time when its last
    /// charged work began (its start tag), and the task's own count when last charged.
    vtime: Duration,
    start: Duration,
    seen: Duration,
    /// Whether it had work when shares were last handed out.
    busy: bool,
    /// How far its virtual time may go before it lets the others go first: the least among
    /// the thread's other busy tasks at the last share (its own, when none is), plus
    /// [`FAIR_QUANTUM`].
    limit: Option<Duration>,
    /// Whether it may take a call (as of the last share, or a charge that took it away).
    turn: bool,
}

impl FairShare {
    pub(super) fn new(now: Instant) -> FairShare {
        FairShare {
            accounts: Vec::new(),
            entry: Duration::ZERO,
            charged: Duration::ZERO,
            window: now,
            saturated: false,
        }
    }

    /// A task arrives in slot `index`, its calls having held `thread_time` so far. It joins
    /// at the thread's virtual time: no credit for the time before it came.
    pub(super) fn join(&mut self, index: usize, thread_time: Duration) {
        if self.accounts.len() <= index {
            self.accounts.resize(index + 1, None);
        }
        self.accounts[index] = Some(Account {
            vtime: self.entry,
            start: self.entry,
            seen: thread_time,
            busy: false,
            limit: None,
            turn: true,
        });
    }

    /// The task in slot `index` left the thread.
    pub(super) fn leave(&mut self, index: usize) {
        if let Some(a) = self.accounts.get_mut(index) {
            *a = None;
        }
    }

    /// Charges the task in slot `index` the thread time its batches held since last charged
    /// (its calls having held `thread_time` in all: guest calls and the host's work on their
    /// output alike). Returns whether that put it past its share: then its turn is taken
    /// away until the next share.
    pub(super) fn charge(&mut self, index: usize, thread_time: Duration) -> bool {
        let Some(a) = self.accounts.get_mut(index).and_then(Option::as_mut) else {
            return false;
        };
        let used = thread_time.saturating_sub(a.seen);
        a.seen = thread_time;
        if used.is_zero() {
            return false;
        }
        self.charged += used;
        a.start = a.vtime;
        a.vtime += used;
        let over = a.limit.is_some_and(|l| a.vtime > l);
        if over {
            a.turn = false;
        }
        over
    }

    /// Whether the task in slot `index` may take a call (see [`FairShare::share`]).
    pub(super) fn turn(&self, index: usize) -> bool {
        self.accounts
            .get(index)
            .and_then(Option::as_ref)
            .is_some_and(|a| a.turn)
    }

    /// Hands out turns by thread time used; `busy(i)`: the task in slot `i` has work that
    /// waits only for its turn. A task gets a call only while its virtual time (the thread
    /// time its calls held here) is within [`FAIR_QUANTUM`] of the least-served busy task's.
    /// A guest that takes most of its deadline on every call gets its share of the thread
    /// when others have work, and all of it when they have none (start-time fair queueing).
    /// A task coming back from idle joins at the least start tag among the busy tasks, so it
    /// is neither owed the time it had no work nor put behind a long call that began before
    /// it came back.
    pub(super) fn share(&mut self, now: Instant, mut busy: impl FnMut(usize) -> bool) {
        let elapsed = now.duration_since(self.window);
        if elapsed >= SATURATION_WINDOW {
            self.saturated = self.charged * 2 >= elapsed;
            self.charged = Duration::ZERO;
            self.window = now;
        }
        let entry = self.entry;
        // The two least virtual times among the busy tasks (the least with its index), so
        // each task's limit is the least among the others'.
        let mut least: Option<(usize, Duration)> = None;
        let mut second: Option<Duration> = None;
        let mut least_start: Option<Duration> = None;
        for (i, a) in self.accounts.iter_mut().enumerate() {
            let Some(a) = a else { continue };
            let has_work = busy(i);
            if has_work && !a.busy {
                a.vtime = a.vtime.max(entry);
                a.start = a.vtime;
            }
            a.busy = has_work;
            if !has_work {
                continue;
            }
            least_start = Some(least_start.map_or(a.start, |s| s.min(a.start)));
            match least {
                Some((_, v)) if v <= a.vtime => second = Some(second.map_or(a.vtime, |s| s.min(a.vtime))),
                _ => {
                    second = least.map(|(_, v)| v);
                    least = Some((i, a.vtime));
                }
            }
        }
        if let Some(s) = least_start {
            self.entry = s;
        } else if let Some(v) = self.accounts.iter().flatten().map(|a| a.vtime).max() {
            // Nobody has work: whoever gets some next joins level with the most served.
            self.entry = self.entry.max(v);
        }
        if !self.saturated {
            // Work-conserving: while the thread has time to spare, nobody waits for a share.
            // A task that used more than its light neighbours (a burst, a backlog after a
            // handover, a call slowed by another process) would otherwise wait until they
            // had used as much, which at their pace can take seconds; its lead is forgiven
            // down to a quantum, so the shares start even when the thread fills up.
            let least = least.map(|(_, v)| v);
            for a in self.accounts.iter_mut().flatten() {
                if a.busy {
                    if let Some(v) = least {
                        a.vtime = a.vtime.min(v + FAIR_QUANTUM);
                    }
                }
                a.limit = None;
                a.turn = true;
            }
            return;
        }
        for (i, a) in self.accounts.iter_mut().enumerate() {
            let Some(a) = a else { continue };
            let others = match least {
                Some((l, _)) if l == i => second,
                other => other.map(|(_, v)| v),
            };
            // With no other task busy, a task may go a quantum past where it is before the
            // next share looks again (a guest's long call is then one call, not a round's).
            a.limit = Some(others.unwrap_or(a.vtime) + FAIR_QUANTUM);
            a.turn = !a.busy || others.is_none_or(|v| a.vtime <= v + FAIR_QUANTUM);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Runs `rounds` rounds of tasks that always have work, each call of task i costing
    /// `cost[i]`: every round hands out the shares, then each task whose turn it is takes one
    /// call. The clock moves by the thread time charged (a saturated thread). Returns who
    /// went in each round.
    fn rounds(
        share: &mut FairShare,
        now: &mut Instant,
        held: &mut [Duration],
        cost: &[Duration],
        rounds: usize,
    ) -> Vec<Vec<usize>> {
        let mut went = Vec::new();
        for _ in 0..rounds {
            share.share(*now, |_| true);
            let mut this = Vec::new();
            for (i, held) in held.iter_mut().enumerate() {
                if share.turn(i) {
                    this.push(i);
                    *held += cost[i];
                    share.charge(i, *held);
                    *now += cost[i];
                }
            }
            went.push(this);
        }
        went
    }

    #[test]
    fn a_saturated_thread_gives_a_costly_task_no_more_than_its_share() {
        let mut now = Instant::now();
        let mut share = FairShare::new(now);
        share.join(0, Duration::ZERO);
        share.join(1, Duration::ZERO);
        // Task 0's calls take 40 ms, task 1's 10 ms.
        let cost = [40 * MS, 10 * MS];
        let mut held = [Duration::ZERO; 2];
        // The first window (500 ms) is not known to be saturated: everybody goes.
        let went = rounds(&mut share, &mut now, &mut held, &cost, 10);
        assert!(went.iter().all(|w| *w == [0, 1]), "{went:?}");
        // Saturated: task 0 goes once for every four calls of task 1, the same thread time.
        let went = rounds(&mut share, &mut now, &mut held, &cost, 12);
        let pattern = [vec![1], vec![1], vec![1], vec![0, 1]];
        assert_eq!(went, pattern.iter().cycle().take(12).cloned().collect::<Vec<_>>());
        // And it stays saturated past the next window (the clock moves only by what was
        // charged).
        let went = rounds(&mut share, &mut now, &mut held, &cost, 28);
        assert_eq!(went, pattern.iter().cycle().take(28).cloned().collect::<Vec<_>>());
    }

    #[test]
    fn a_call_past_its_limit_takes_the_turn_away_until_the_next_share() {
        let mut now = Instant::now();
        let mut share = FairShare::new(now);
        share.join(0, Duration::ZERO);
        share.join(1, Duration::ZERO);
        let mut held = [Duration::ZERO; 2];
        // Saturate the first window with equal calls.
        rounds(&mut share, &mut now, &mut held, &[25 * MS, 25 * MS], 10);
        share.share(now, |_| true);
        assert!(share.turn(0) && share.turn(1));
        // Task 0's limit is task 1's virtual time plus a quantum: a 40 ms call stays within
        // it, a second one goes past it.
        assert!(!share.charge(0, held[0] + 40 * MS));
        assert!(share.turn(0));
        assert!(share.charge(0, held[0] + 80 * MS));
        assert!(!share.turn(0));
        assert!(share.turn(1));
    }

    #[test]
    fn a_task_back_from_idle_joins_at_the_busy_tasks_start_not_owed_its_idle_time() {
        let mut now = Instant::now();
        let mut share = FairShare::new(now);
        share.join(0, Duration::ZERO);
        share.join(1, Duration::ZERO);
        let mut held = [Duration::ZERO; 2];
        // Saturated, task 1 idle: task 0 has the whole thread.
        for _ in 0..30 {
            share.share(now, |i| i == 0);
            assert!(share.turn(0));
            held[0] += 20 * MS;
            share.charge(0, held[0]);
            now += 20 * MS;
        }
        // Task 1 comes back: it joins at task 0's start tag (not at 0, which would give it
        // the thread for the 600 ms it had no work), so they take turns at once.
        let went = rounds(&mut share, &mut now, &mut held, &[20 * MS, 20 * MS], 4);
        assert_eq!(went, vec![vec![0, 1]; 4]);
    }

    #[test]
    fn a_task_that_left_has_no_turn_and_its_slot_is_taken_fresh() {
        let now = Instant::now();
        let mut share = FairShare::new(now);
        share.join(2, 5 * MS);
        assert!(!share.turn(0) && !share.turn(1));
        share.share(now, |_| true);
        assert!(share.turn(2));
        // Thread time before it came is not charged.
        assert!(!share.charge(2, 5 * MS));
        share.leave(2);
        assert!(!share.turn(2));
        assert!(!share.charge(2, 50 * MS));
    }
}
