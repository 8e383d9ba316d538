//! A task's records-per-second limit (`limits.records-per-second`, or its tenant's
//! `max-records-per-second`): a token bucket the task spends a batch at a time.
//!
//! A task over its rate is not blocked: it declines to process (`Task::may_process`), so
//! its stream thread pauses its partitions and serves its other tasks meanwhile.

use std::time::Instant;

#[derive(Debug)]
pub struct Rate {
    per_second: f64,
    /// Most records one batch may hold: a quarter of a second's worth (at least one), so a
    /// limited task processes in small steps rather than a large batch and a long wait, and
    /// still keeps its rate when its stream thread comes back to it only every 100 ms.
    burst: f64,
    /// Records it may process now; negative after a batch larger than what was left.
    tokens: f64,
    last: Instant,
}

impl Rate {
    pub fn new(per_second: u32, now: Instant) -> Rate {
        let per_second = f64::from(per_second.max(1));
        let burst = (per_second / 4.0).max(1.0);
        Rate {
            per_second,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Records one batch may hold.
    pub fn batch(&self) -> usize {
        self.burst as usize
    }

    /// Whether the task may process a batch now.
    pub fn ready(&self, now: Instant) -> bool {
        self.tokens + now.saturating_duration_since(self.last).as_secs_f64() * self.per_second > 0.0
    }

    /// Spends `records` (a batch just processed).
    pub fn take(&mut self, records: usize, now: Instant) {
        let earned = now.saturating_duration_since(self.last).as_secs_f64() * self.per_second;
        self.tokens = (self.tokens + earned).min(self.burst) - records as f64;
        self.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_task_spends_at_most_its_rate() {
        let t0 = Instant::now();
        let mut rate = Rate::new(1000, t0);
        assert_eq!(rate.batch(), 250);
        // Simulate a task that processes a full batch whenever it may, for 10 seconds.
        let mut processed = 0usize;
        let mut now = t0;
        while now < t0 + Duration::from_secs(10) {
            if rate.ready(now) {
                rate.take(rate.batch(), now);
                processed += rate.batch();
            }
            now += Duration::from_millis(1);
        }
        // 10 s at 1,000/s, plus the first burst.
        assert!((10_000..=10_250).contains(&processed), "{processed}");
        // A slow rate still moves, one record at a time: after its burst, one per 500 ms.
        let mut slow = Rate::new(2, t0);
        assert_eq!(slow.batch(), 1);
        slow.take(1, t0);
        slow.take(1, t0);
        assert!(!slow.ready(t0 + Duration::from_millis(400)));
        assert!(slow.ready(t0 + Duration::from_millis(600)));
    }
}
