//! Event-time order across a task's source partitions: Kafka Streams' partition group.
//!
//! A task with several source partitions (a join's two sides, a merge, a table beside the
//! stream it enriches) keeps what its stream thread fetched of each in a queue of its own and
//! takes the record with the smallest timestamp among the queues' heads next. It does so only
//! when it knows it is not passing over an earlier record: every queue holds a record, or
//! each empty one belongs to a partition whose lag is known to be zero (KIP-695,
//! `max.task.idle.ms`):
//!
//! - lag unknown (no fetch answered for the partition yet) or not zero: wait, for up to
//!   [`UNKNOWN_PATIENCE`] or [`BEHIND_PATIENCE`] (see there why at all);
//! - lag zero: wait up to `max.task.idle.ms` (default 0: not at all) for a record to come;
//! - `max.task.idle.ms = -1`: never wait, take what is there.
//!
//! The queues are bounded ([`BUFFERED_RECORDS`], or the batch's bytes): a partition whose
//! queue is full is paused by the stream thread until it drains to half.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rdkafka::message::{Message, OwnedMessage};

pub use crate::manifest::MaxTaskIdle;

/// What the stream thread's consumer knows of how far behind the broker a partition is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lag {
    /// No fetch answered for it yet.
    Unknown,
    /// The broker has records the consumer has not handed out.
    Behind,
    /// The consumer has handed out everything the broker had at its last answer.
    CaughtUp,
}

/// Records buffered per partition before the partition is paused (Kafka Streams'
/// `buffered.records.per.partition`).
pub const BUFFERED_RECORDS: usize = 1_000;

/// How long an empty partition whose lag is unknown holds the others back: Kafka Streams
/// waits for the first fetch without bound; a partition whose leader is gone would then
/// stop the task, so it is bounded here, generously (a first fetch takes milliseconds).
pub const UNKNOWN_PATIENCE: Duration = Duration::from_secs(30);

/// How long an empty partition with lag holds the others back while none of its records
/// come. librdkafka exposes the high watermark, not the last stable offset, so records of an
/// open transaction count as lag (Kafka Streams, reading the stable offset, would not wait
/// for them): the wait ends when the transaction does, or after this.
pub const BEHIND_PATIENCE: Duration = Duration::from_secs(5);

/// A task's source partitions' records, buffered to be taken in timestamp order.
#[derive(Debug)]
pub struct PartitionGroup {
    queues: Vec<VecDeque<(i64, OwnedMessage)>>,
    bytes: Vec<usize>,
    max_bytes: usize,
    max_idle: MaxTaskIdle,
    /// Per partition: since when it was empty and caught up (its idle deadline runs from
    /// there), and since when empty and waited for (unknown or behind).
    idle_since: Vec<Option<Instant>>,
    waiting_since: Vec<Option<(Lag, Instant)>>,
    /// Partitions processed past after waiting their patience out (counted once per wait).
    pub enforced: u64,
}

impl PartitionGroup {
    pub fn new(sources: usize, max_idle: MaxTaskIdle, max_bytes: usize) -> PartitionGroup {
        PartitionGroup {
            queues: (0..sources).map(|_| VecDeque::new()).collect(),
            bytes: vec![0; sources],
            max_bytes: max_bytes.max(1),
            max_idle,
            idle_since: vec![None; sources],
            waiting_since: vec![None; sources],
            enforced: 0,
        }
    }

    pub fn push(&mut self, source: usize, message: OwnedMessage) {
        let ts = message.timestamp().to_millis().unwrap_or(-1);
        self.bytes[source] += size(&message);
        self.queues[source].push_back((ts, message));
    }

    /// Whether partition `source` has as much buffered as it may (its stream thread pauses it).
    pub fn is_backlogged(&self, source: usize) -> bool {
        self.queues[source].len() >= BUFFERED_RECORDS || self.bytes[source] >= self.max_bytes
    }

    /// Whether a paused partition has drained enough to be fetched again (half its bound).
    pub fn has_room(&self, source: usize) -> bool {
        self.queues[source].len() < BUFFERED_RECORDS / 2 && self.bytes[source] < self.max_bytes / 2
    }

    /// Records buffered in all.
    pub fn len(&self) -> usize {
        self.queues.iter().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.queues.iter().all(VecDeque::is_empty)
    }

    pub fn clear(&mut self) {
        for q in &mut self.queues {
            q.clear();
        }
        self.bytes.iter_mut().for_each(|b| *b = 0);
    }

    /// The next record in timestamp order, if the group may process now; `lag` tells how far
    /// behind the broker an empty partition is (asked only for empty ones).
    pub fn next(&mut self, now: Instant, mut lag: impl FnMut(usize) -> Lag) -> Option<(usize, OwnedMessage)> {
        if self.is_empty() {
            return None;
        }
        if self.max_idle != MaxTaskIdle::Disabled {
            for s in 0..self.queues.len() {
                if !self.queues[s].is_empty() {
                    self.idle_since[s] = None;
                    self.waiting_since[s] = None;
                    continue;
                }
                let l = lag(s);
                if l != Lag::CaughtUp {
                    let patience = if l == Lag::Unknown {
                        UNKNOWN_PATIENCE
                    } else {
                        BEHIND_PATIENCE
                    };
                    let since = match self.waiting_since[s] {
                        Some((was, since)) if was == l => since,
                        _ => {
                            self.waiting_since[s] = Some((l, now));
                            now
                        }
                    };
                    if now.duration_since(since) < patience {
                        self.idle_since[s] = None;
                        return None;
                    }
                    // Waited out: from here on it counts as caught up.
                    if self.idle_since[s].is_none() {
                        self.enforced += 1;
                    }
                } else {
                    self.waiting_since[s] = None;
                }
                let since = *self.idle_since[s].get_or_insert(now);
                if now.duration_since(since) < self.max_idle.wait() {
                    return None;
                }
            }
        }
        // The smallest head timestamp; on a tie, the partition listed first.
        let source = (0..self.queues.len())
            .filter(|&s| !self.queues[s].is_empty())
            .min_by_key(|&s| self.queues[s].front().map(|(ts, _)| *ts))?;
        let (_, message) = self.queues[source].pop_front()?;
        self.bytes[source] -= size(&message);
        Some((source, message))
    }
}

fn size(m: &OwnedMessage) -> usize {
    use rdkafka::message::Headers;
    let headers: usize = m
        .headers()
        .map(|h| h.iter().map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len)).sum())
        .unwrap_or(0);
    m.key().map_or(0, <[u8]>::len) + m.payload().map_or(0, <[u8]>::len) + headers + 64
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::Timestamp;

    fn record(partition: i32, offset: i64, ts: i64) -> OwnedMessage {
        OwnedMessage::new(
            Some(b"v".to_vec()),
            Some(b"k".to_vec()),
            "t".into(),
            Timestamp::CreateTime(ts),
            partition,
            offset,
            None,
        )
    }

    fn drain(g: &mut PartitionGroup, now: Instant, lags: &[Lag]) -> Vec<(usize, i64)> {
        let mut out = Vec::new();
        while let Some((s, m)) = g.next(now, |s| lags[s]) {
            out.push((s, m.offset()));
        }
        out
    }

    #[test]
    fn records_come_in_timestamp_order_across_partitions() {
        let mut g = PartitionGroup::new(2, MaxTaskIdle::Zero, 1 << 20);
        for (o, ts) in [(0, 100), (1, 300), (2, 500)] {
            g.push(0, record(0, o, ts));
        }
        for (o, ts) in [(0, 200), (1, 400), (2, 600)] {
            g.push(1, record(0, o, ts));
        }
        // Once a queue runs empty the group asks its lag: caught up, the rest goes.
        let out = drain(&mut g, Instant::now(), &[Lag::CaughtUp, Lag::CaughtUp]);
        assert_eq!(out, vec![(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]);
    }

    #[test]
    fn an_empty_partition_the_broker_has_records_for_is_waited_for() {
        let mut g = PartitionGroup::new(2, MaxTaskIdle::Zero, 1 << 20);
        g.push(1, record(0, 0, 500));
        let now = Instant::now();
        for lag in [Lag::Unknown, Lag::Behind] {
            assert!(g.next(now, |_| lag).is_none(), "{lag:?}: must wait");
        }
        // Its records come, earlier than the other's: they go first.
        g.push(0, record(0, 0, 100));
        assert_eq!(drain(&mut g, now, &[Lag::Behind, Lag::CaughtUp]), vec![(0, 0)]);
        // Caught up (nothing more on the broker): no wait under the default.
        assert_eq!(drain(&mut g, now, &[Lag::CaughtUp, Lag::CaughtUp]), vec![(1, 0)]);
    }

    #[test]
    fn waiting_is_bounded_by_the_patience_of_its_kind() {
        let mut g = PartitionGroup::new(2, MaxTaskIdle::Zero, 1 << 20);
        g.push(1, record(0, 0, 500));
        let t0 = Instant::now();
        assert!(g.next(t0, |_| Lag::Behind).is_none());
        assert!(g
            .next(t0 + BEHIND_PATIENCE - Duration::from_millis(1), |_| Lag::Behind)
            .is_none());
        assert!(g.next(t0 + BEHIND_PATIENCE, |_| Lag::Behind).is_some());
        assert_eq!(g.enforced, 1);
        g.push(1, record(0, 1, 600));
        let t1 = t0 + Duration::from_secs(60);
        assert!(g.next(t1, |_| Lag::Unknown).is_none());
        assert!(
            g.next(t1 + BEHIND_PATIENCE, |_| Lag::Unknown).is_none(),
            "unknown lag waits longer"
        );
        assert!(g.next(t1 + UNKNOWN_PATIENCE, |_| Lag::Unknown).is_some());
    }

    #[test]
    fn max_task_idle_waits_for_a_caught_up_partition_and_minus_one_never_waits() {
        let wait = Duration::from_millis(300);
        let mut g = PartitionGroup::new(2, MaxTaskIdle::Wait(wait), 1 << 20);
        g.push(1, record(0, 0, 500));
        let t0 = Instant::now();
        assert!(g.next(t0, |_| Lag::CaughtUp).is_none());
        assert!(g.next(t0 + wait / 2, |_| Lag::CaughtUp).is_none());
        assert!(g.next(t0 + wait, |_| Lag::CaughtUp).is_some());

        let mut g = PartitionGroup::new(2, MaxTaskIdle::Disabled, 1 << 20);
        g.push(1, record(0, 0, 500));
        assert!(g.next(t0, |_| Lag::Unknown).is_some());
        assert_eq!(MaxTaskIdle::from_ms(-1), Ok(MaxTaskIdle::Disabled));
        assert_eq!(MaxTaskIdle::from_ms(0), Ok(MaxTaskIdle::Zero));
        assert_eq!(
            MaxTaskIdle::from_ms(250),
            Ok(MaxTaskIdle::Wait(Duration::from_millis(250)))
        );
        assert!(MaxTaskIdle::from_ms(-2).unwrap_err().contains("-2"));
    }

    #[test]
    fn ties_go_to_the_partition_listed_first_and_queues_are_bounded() {
        let mut g = PartitionGroup::new(2, MaxTaskIdle::Zero, 1 << 30);
        g.push(1, record(0, 0, 100));
        g.push(0, record(0, 0, 100));
        assert_eq!(drain(&mut g, Instant::now(), &[Lag::CaughtUp; 2]), vec![(0, 0), (1, 0)]);
        for o in 0..BUFFERED_RECORDS as i64 {
            assert!(!g.is_backlogged(0));
            g.push(0, record(0, o, o));
        }
        assert!(g.is_backlogged(0) && !g.has_room(0));
        let now = Instant::now();
        for _ in 0..BUFFERED_RECORDS / 2 + 1 {
            g.next(now, |_| Lag::CaughtUp).unwrap();
        }
        assert!(g.has_room(0));
    }
}
