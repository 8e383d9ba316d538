//! Sliding windows (Kafka Streams' `SlidingWindows`): windows of a fixed time difference
//! `d` that slide with the records. A key's windows are `[t - d, t]` for each of its
//! records at `t` (both ends included), and `[t + 1, t + 1 + d]` when a record follows `t`
//! within that span, each keyed `Windowed { start, end: start + d + 1 }`.
//!
//! The operator keeps what Kafka Streams keeps: each window's aggregate and its time (the
//! largest of its records'), not the records, and derives a new window's aggregate from
//! the windows already there, record by record as Kafka Streams 4.x does (its
//! `KStreamSlidingWindowAggregate`, reverse-iterator path, and its path for records earlier
//! than `d`). So where Kafka Streams' aggregates are not those of the records a window
//! spans (a record that came after its own window closed is missing from a window created
//! later from its neighbour's; a right window created from the aggregate of a window that
//! also holds older records), these are the same.
//!
//! A window is closed when `start + d < T - grace` (`T`: the operator's stream time, the
//! largest timestamp it has seen); a closed window is never updated again, and a record
//! whose last window `[t, t + d]` is closed is dropped. With
//! [`Emit::Final`](super::Emit::Final), each window goes out once, at the first
//! punctuation after it closed (Kafka Streams: when a record moves stream time past it;
//! the same results). With [`Emit::OnUpdate`](super::Emit::OnUpdate), every window a
//! record creates or updates goes out, as Kafka Streams forwards them.
//!
//! The store keys a window `(segment of start, key, start)` → the aggregate stamped with
//! its time ([`stamp`](super::stamp)); the empty key holds the stream time, `[0]` where the
//! last punctuation's closing stopped. Windows no record can reach any more (start before
//! `T - grace - 3d`) and already sent are deleted a segment at a time at punctuation.

use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::Duration;

use super::builder::{decode, encode, Materialized};
use super::data::{pop_ordered, push_ordered, Data, Windowed};
use super::runtime::{Change, Cx, Downstream, Node, Punctuate, Rec};
use super::stamp;
use super::state::KeyValueStore;
use super::table::KTable;
use super::windows::{millis, Emit, StreamTime, WindowedBy, Windows};
use crate::Error;

/// Sliding windows: every set of a key's records no more than `difference` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindows {
    pub(crate) difference: i64,
    pub(crate) grace: i64,
}

impl Windows for SlidingWindows {}

impl SlidingWindows {
    /// Windows of records at most `difference` apart, with no grace period.
    pub fn with_time_difference(difference: Duration) -> Self {
        SlidingWindows {
            difference: millis(difference),
            grace: 0,
        }
    }

    /// How long after a window's end it still takes out-of-order records.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = millis(grace);
        self
    }
}

type Fold<K, V, VA> = Box<dyn FnMut(&K, V, Option<VA>) -> VA>;

impl<K: Data, V: Data> WindowedBy<K, V, SlidingWindows> {
    /// The number of records per key and window.
    pub fn count(&self, materialized: impl Into<Materialized>) -> KTable<Windowed<K>, u64> {
        self.sliding("count", materialized.into(), Box::new(|_k, _v, n| n.unwrap_or(0) + 1))
    }

    /// Each window's values combined by `reducer`, in time order.
    pub fn reduce(
        &self,
        mut reducer: impl FnMut(V, V) -> V + 'static,
        materialized: impl Into<Materialized>,
    ) -> KTable<Windowed<K>, V> {
        self.sliding(
            "reduce",
            materialized.into(),
            Box::new(move |_k, v, agg| match agg {
                Some(agg) => reducer(agg, v),
                None => v,
            }),
        )
    }

    /// Each window's values folded by `aggregator` from `initializer()`, in time order.
    pub fn aggregate<VA: Data>(
        &self,
        mut initializer: impl FnMut() -> VA + 'static,
        mut aggregator: impl FnMut(&K, V, VA) -> VA + 'static,
        materialized: impl Into<Materialized>,
    ) -> KTable<Windowed<K>, VA> {
        self.sliding(
            "aggregate",
            materialized.into(),
            Box::new(move |k, v, agg| {
                let agg = agg.unwrap_or_else(&mut initializer);
                aggregator(k, v, agg)
            }),
        )
    }

    fn sliding<VA: Data>(
        &self,
        kind: &str,
        materialized: Materialized,
        fold: Fold<K, V, VA>,
    ) -> KTable<Windowed<K>, VA> {
        let windows = self.windows;
        if windows.difference < 0 || windows.grace < 0 {
            self.error(format!(
                "sliding windows with a time difference of {} ms and a grace of {} ms: neither may be negative",
                windows.difference, windows.grace
            ));
        }
        let emit = self.emit;
        let store = self.store_name(kind, materialized);
        self.add(kind, store, move |name, store, down, _cache| {
            let closed_to = match store.get(CLOSED_KEY)? {
                None => i64::MIN,
                Some(bytes) => i64::from_be_bytes(bytes.as_slice().try_into().map_err(|_| {
                    Error::msg(format!("operator {name}: the closing time in its store is not 8 bytes"))
                })?),
            };
            Ok(SlidingAggregate {
                time: StreamTime::load(&name, &*store)?,
                segment: (windows.difference.saturating_add(windows.grace) / 2).max(1),
                closed_to,
                name,
                store,
                windows,
                emit,
                fold,
                down,
                raw_key: Vec::new(),
                key_buf: Vec::new(),
                buf: Vec::new(),
            })
        })
    }
}

/// Where the last punctuation's closing stopped: windows ending before it went out.
const CLOSED_KEY: &[u8] = &[0];

struct SlidingAggregate<K, V, VA> {
    name: String,
    store: Rc<dyn KeyValueStore>,
    windows: SlidingWindows,
    emit: Emit,
    fold: Fold<K, V, VA>,
    down: Downstream<Windowed<K>, Change<VA>>,
    time: StreamTime,
    /// Windows whose last millisecond is before this have gone out (or never will).
    closed_to: i64,
    segment: i64,
    raw_key: Vec<u8>,
    key_buf: Vec<u8>,
    buf: Vec<u8>,
}

/// A window of the store: its start, its aggregate's bytes and its time.
#[derive(Clone)]
struct Found {
    start: i64,
    agg: Vec<u8>,
    ts: i64,
}

impl<K: Data, V: Data, VA: Data> SlidingAggregate<K, V, VA> {
    fn window_key(&self, out: &mut Vec<u8>, key: &[u8], start: i64) {
        out.clear();
        push_ordered(out, &start.div_euclid(self.segment));
        push_ordered(out, key);
        push_ordered(out, &start);
    }

    /// A stored window's key: (key, start).
    fn parse(&self, raw: &[u8]) -> Result<(Vec<u8>, i64), Error> {
        let mut rest = raw;
        let parsed = (|| {
            let _segment: i64 = pop_ordered(&mut rest)?;
            let key: Vec<u8> = pop_ordered(&mut rest)?;
            let start: i64 = pop_ordered(&mut rest)?;
            Ok::<_, crate::CodecError>((key, start))
        })();
        let (key, start) =
            parsed.map_err(|e| Error::msg(format!("operator {}: a window key in its store: {e}", self.name)))?;
        if !rest.is_empty() {
            // Before this SDK kept windows, it kept records: (segment, key, time, id).
            return Err(Error::msg(format!(
                "operator {}: store {:?} holds sliding-window state of an older SDK (records, not \
                 windows): reset the topology's state (or name the store anew) to run this version",
                self.name,
                self.store.name()
            )));
        }
        Ok((key, start))
    }

    /// The windows of `key` with starts in `[from, to]`, by start.
    fn fetch(&self, key: &[u8], from: i64, to: i64) -> Result<Vec<Found>, Error> {
        let mut found = Vec::new();
        if from > to {
            return Ok(found);
        }
        let mut prefix = Vec::new();
        for segment in from.div_euclid(self.segment)..=to.div_euclid(self.segment) {
            prefix.clear();
            push_ordered(&mut prefix, &segment);
            push_ordered(&mut prefix, key);
            for entry in self.store.prefix(&prefix)? {
                let (raw, stored) = entry?;
                let (_, start) = self.parse(&raw)?;
                if from <= start && start <= to {
                    let (agg, ts) = stamp::split(&stored);
                    found.push(Found {
                        start,
                        agg: agg.to_vec(),
                        ts,
                    });
                }
            }
        }
        found.sort_by_key(|w| w.start);
        Ok(found)
    }

    fn put(&mut self, key: &[u8], start: i64, agg: &VA, ts: i64) -> Result<(), Error> {
        let mut value = std::mem::take(&mut self.buf);
        value.clear();
        let encoded = encode(&self.name, "aggregate", agg, &mut value);
        let mut k = std::mem::take(&mut self.key_buf);
        self.window_key(&mut k, key, start);
        let result = match encoded {
            Ok(Some(_)) => {
                stamp::push(&mut value, ts);
                self.store.put(&k, &value)
            }
            Ok(None) => self.store.delete(&k), // a null aggregate: no window
            Err(e) => Err(e),
        };
        self.buf = value;
        self.key_buf = k;
        result
    }

    /// Kafka Streams' `updateWindowAndForward`: the window at `start`, holding `old` (none:
    /// the initializer's), takes the record, unless it is closed.
    fn update(
        &mut self,
        rec: &Rec<K, V>,
        raw_key: &[u8],
        start: i64,
        old: Option<(&[u8], i64)>,
        close: i64,
        cx: &mut Cx<'_>,
    ) -> Result<(), Error> {
        if start.saturating_add(self.windows.difference) < close {
            return Ok(()); // a closed window takes nothing more
        }
        let old_agg = match old {
            Some((bytes, _)) => Some(decode::<VA>(&self.name, "aggregate in its store", Some(bytes))?),
            None => None,
        };
        let ts = match old {
            Some((_, old_ts)) => rec.ts.max(old_ts),
            None => rec.ts,
        };
        let agg = (self.fold)(&rec.key, rec.value.clone(), old_agg);
        self.put(raw_key, start, &agg, ts)?;
        if self.emit == Emit::OnUpdate {
            self.forward(&rec.key, start, agg, ts, cx)?;
        }
        Ok(())
    }

    /// Kafka Streams' `createCurrentRecordRightWindow`: `[t + 1, t + 1 + d]` with the
    /// aggregate found (as it is, without the record).
    fn right_window(&mut self, rec: &Rec<K, V>, raw_key: &[u8], found: &Found, cx: &mut Cx<'_>) -> Result<(), Error> {
        let start = rec.ts.saturating_add(1);
        let agg = decode::<VA>(&self.name, "aggregate in its store", Some(&found.agg))?;
        self.put(raw_key, start, &agg, found.ts)?;
        if self.emit == Emit::OnUpdate {
            self.forward(&rec.key, start, agg, found.ts, cx)?;
        }
        Ok(())
    }

    fn forward(&mut self, key: &K, start: i64, agg: VA, ts: i64, cx: &mut Cx<'_>) -> Result<(), Error> {
        let rec = Rec {
            key: Windowed {
                key: key.clone(),
                start,
                end: start.saturating_add(self.windows.difference).saturating_add(1),
            },
            value: Change {
                new: Some(agg),
                old: None,
            },
            ts,
        };
        self.down.forward(rec, cx)
    }

    fn add(&mut self, rec: Rec<K, V>, raw_key: &mut Vec<u8>, cx: &mut Cx<'_>) -> Result<(), Error> {
        if rec.ts < 0 || encode(&self.name, "key", &rec.key, raw_key)?.is_none() {
            return Ok(()); // null keys and negative times are dropped
        }
        if rec.value.is_null() {
            return Ok(()); // Kafka Streams drops a null value before it counts its time
        }
        let (d, grace) = (self.windows.difference, self.windows.grace);
        self.time.observe(rec.ts);
        let close = self.time.now.saturating_sub(grace);
        if rec.ts.saturating_add(d) < close {
            return Ok(()); // late: its last window [t, t + d] is closed
        }
        if rec.ts < d {
            self.early(&rec, raw_key, close, cx)
        } else {
            self.in_time(&rec, raw_key, close, cx)
        }
    }

    /// A record at `t >= d` (Kafka Streams' `processReverse`): the key's windows starting in
    /// `[t - 2d, t + 1]`, latest first.
    fn in_time(&mut self, rec: &Rec<K, V>, raw_key: &[u8], close: i64, cx: &mut Cx<'_>) -> Result<(), Error> {
        let (t, d) = (rec.ts, self.windows.difference);
        let found = self.fetch(
            raw_key,
            t.saturating_sub(d.saturating_mul(2)).max(0),
            t.saturating_add(1),
        )?;
        let starts: BTreeSet<i64> = found.iter().map(|w| w.start).collect();
        let (mut left_agg, mut right_agg): (Option<&Found>, Option<&Found>) = (None, None);
        let (mut left_exists, mut right_exists) = (false, false);
        let mut previous: Option<i64> = None;
        for w in found.iter().rev() {
            let end = w.start.saturating_add(d);
            if w.start == t.saturating_add(1) {
                right_exists = true;
            } else if end > t {
                right_agg.get_or_insert(w);
                self.update(rec, raw_key, w.start, Some((&w.agg, w.ts)), close, cx)?;
            } else if end == t {
                left_exists = true;
                self.update(rec, raw_key, w.start, Some((&w.agg, w.ts)), close, cx)?;
                if w.ts < t {
                    previous = Some(w.ts);
                } else {
                    return Ok(()); // a record at t was here before: every window exists
                }
            } else {
                left_agg = Some(w);
                previous = Some(w.ts);
                break;
            }
        }
        // The previous record's right window, if the record falls in it and it is missing.
        if let Some(p) = previous {
            let start = p.saturating_add(1);
            if !starts.contains(&start) && start.saturating_add(d) >= t {
                self.update(rec, raw_key, start, None, close, cx)?;
            }
        }
        // The record's left window: the previous record's window's aggregate, if that
        // record is within reach.
        if !left_exists {
            let old = match (previous, left_agg) {
                (Some(p), Some(w)) if t.saturating_sub(d) <= p => Some((&w.agg[..], t)),
                _ => None,
            };
            self.update(rec, raw_key, t.saturating_sub(d), old, close, cx)?;
        }
        // The record's right window, from the latest window holding a later record.
        if let Some(w) = right_agg.filter(|w| !right_exists && w.ts > t) {
            let w = w.clone();
            self.right_window(rec, raw_key, &w, cx)?;
        }
        Ok(())
    }

    /// A record at `0 <= t < d` (Kafka Streams' `processEarly`): its left window would
    /// start before 0, so the early records share the window `[0, d]`.
    fn early(&mut self, rec: &Rec<K, V>, raw_key: &[u8], close: i64, cx: &mut Cx<'_>) -> Result<(), Error> {
        let t = rec.ts;
        let found = self.fetch(raw_key, 0, t.saturating_add(1))?;
        let starts: BTreeSet<i64> = found.iter().map(|w| w.start).collect();
        let (mut combined, mut right_agg): (Option<&Found>, Option<&Found>) = (None, None);
        let mut right_exists = false;
        let mut previous: Option<i64> = None;
        for w in &found {
            if w.start == 0 {
                combined = Some(w);
                if w.ts < t {
                    previous = Some(w.ts);
                }
            } else if w.start <= t {
                right_agg = Some(w);
                self.update(rec, raw_key, w.start, Some((&w.agg, w.ts)), close, cx)?;
            } else if w.start == t.saturating_add(1) {
                right_exists = true;
            }
        }
        if right_agg.is_none() {
            right_agg = combined.filter(|c| c.ts > t);
        }
        if let Some(w) = right_agg.filter(|w| !right_exists && w.ts > t) {
            let w = w.clone();
            self.right_window(rec, raw_key, &w, cx)?;
        }
        if let Some(p) = previous {
            if !starts.contains(&p.saturating_add(1)) {
                self.update(rec, raw_key, p.saturating_add(1), None, close, cx)?;
            }
        }
        let old = combined.map(|c| (&c.agg[..], c.ts));
        self.update(rec, raw_key, 0, old, close, cx)
    }
}

impl<K: Data, V: Data, VA: Data> Node<K, V> for SlidingAggregate<K, V, VA> {
    fn process(&mut self, rec: Rec<K, V>, cx: &mut Cx<'_>) -> Result<(), Error> {
        let mut raw_key = std::mem::take(&mut self.raw_key);
        let result = self.add(rec, &mut raw_key, cx);
        self.raw_key = raw_key;
        result
    }
}

impl<K: Data, V: Data, VA: Data> Punctuate for SlidingAggregate<K, V, VA> {
    fn batch_started(&mut self) -> Result<(), Error> {
        self.time = StreamTime::load(&self.name, &*self.store)?;
        Ok(())
    }

    fn batch_done(&mut self) -> Result<(), Error> {
        self.time.save(&*self.store)
    }

    fn punctuate(&mut self, _time: i64, cx: &mut Cx<'_>) -> Result<(), Error> {
        if self.time.now == i64::MIN {
            return Ok(());
        }
        let d = self.windows.difference;
        // Windows ending before `close` are closed: start + d < T - grace.
        let close = self.time.now.saturating_sub(self.windows.grace);
        if close > self.closed_to && self.emit == Emit::Final {
            // Windows starting in [closed_to - d, close - d - 1], every key, by start.
            let from = if self.closed_to == i64::MIN {
                0
            } else {
                self.closed_to.saturating_sub(d).max(0)
            };
            let to = close.saturating_sub(d).saturating_sub(1);
            if from <= to {
                let (mut lower, mut upper) = (Vec::new(), Vec::new());
                push_ordered(&mut lower, &from.div_euclid(self.segment));
                push_ordered(&mut upper, &to.div_euclid(self.segment).saturating_add(1));
                let mut due = Vec::new();
                for entry in self.store.range(Some(&lower), Some(&upper))? {
                    let (raw, stored) = entry?;
                    let (key, start) = self.parse(&raw)?;
                    if from <= start && start <= to {
                        let (agg, ts) = stamp::split(&stored);
                        due.push((start, key, agg.to_vec(), ts));
                    }
                }
                // By start, then key: each key's windows in time order.
                due.sort();
                for (start, raw_key, agg, ts) in due {
                    let key = decode::<K>(&self.name, "key in its store", Some(&raw_key))?;
                    let agg = decode::<VA>(&self.name, "aggregate in its store", Some(&agg))?;
                    self.forward(&key, start, agg, ts, cx)?;
                }
            }
        }
        if close > self.closed_to {
            self.closed_to = close;
            self.store.put(CLOSED_KEY, &close.to_be_bytes())?;
            // Windows no record can reach any more: a record that is not late is at
            // t >= close - d and reads windows from t - 2d; closed ones have gone out.
            let reach = close.saturating_sub(d.saturating_mul(3));
            let (mut lower, mut upper) = (Vec::new(), Vec::new());
            push_ordered(&mut lower, &i64::MIN);
            push_ordered(&mut upper, &reach.div_euclid(self.segment));
            self.store.delete_range(Some(&lower), Some(&upper))?;
        }
        self.time.save(&*self.store)
    }

    fn close(&mut self, _cx: &mut Cx<'_>) -> Result<(), Error> {
        self.time.save(&*self.store)
    }
}
