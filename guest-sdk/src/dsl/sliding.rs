//! Sliding windows (Kafka Streams' `SlidingWindows`): windows of a fixed time difference
//! `d` that slide with the records. A key's windows are `[t - d, t]` for each of its
//! records at `t` (both ends included), and `[t + 1, t + 1 + d]` when a record follows `t`
//! within that span: every distinct set of records no more than `d` apart, each window
//! keyed `Windowed { start, end: start + d + 1 }`.
//!
//! A window is closed when `end + grace <= T` (the operator's stream time); a record at `t`
//! is late (dropped) when the last window that could hold it, `[t, t + d]`, is closed, and
//! otherwise counts in the windows that were open when it came (Kafka Streams adds a record
//! to those only). With [`Emit::Final`](super::Emit::Final), each window goes out once, at
//! the first punctuation after it closed, holding the records that came while it was open;
//! a window that only comes to exist once closed is never sent. Each stored record keeps
//! the closing time (`T - grace`) when it came, so the results do not depend on when the
//! punctuations come. With
//! [`Emit::OnUpdate`](super::Emit::OnUpdate), each on-time record sends every open window
//! that holds it (Kafka Streams also sends the new record's right window, which does not
//! hold it; this does not).
//!
//! The store keeps the records themselves, `(segment of t, key, t, id)` → value and the
//! closing time when it came (as a [`stamp`](super::stamp) of the value), and
//! aggregates a window's records (in time order) when it goes out; records are kept while
//! a window that is not closed could hold them. The empty key holds the stream time, the
//! key `[0]` where the last punctuation's closing stopped.

use std::collections::BTreeMap;
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

/// A key's records in time order: (time, the closing time when it came, value bytes).
type Records = Vec<(i64, i64, Vec<u8>)>;

impl<K: Data, V: Data, VA: Data> SlidingAggregate<K, V, VA> {
    fn record_key(&self, out: &mut Vec<u8>, key: &[u8], ts: i64, id: (u32, i64, u32)) {
        out.clear();
        push_ordered(out, &ts.div_euclid(self.segment));
        push_ordered(out, key);
        push_ordered(out, &ts);
        push_ordered(out, &id.0);
        push_ordered(out, &id.1);
        push_ordered(out, &id.2);
    }

    fn parse(&self, raw: &[u8]) -> Result<(Vec<u8>, i64), Error> {
        let mut rest = raw;
        let parsed = (|| {
            let _segment: i64 = pop_ordered(&mut rest)?;
            let key: Vec<u8> = pop_ordered(&mut rest)?;
            let ts: i64 = pop_ordered(&mut rest)?;
            Ok::<_, crate::CodecError>((key, ts))
        })();
        parsed.map_err(|e| Error::msg(format!("operator {}: a record key in its store: {e}", self.name)))
    }

    /// The records of `key` (or of every key: none) with times in `[from, to]`, by key.
    fn records(&self, key: Option<&[u8]>, from: i64, to: i64) -> Result<BTreeMap<Vec<u8>, Records>, Error> {
        let mut found: BTreeMap<Vec<u8>, Records> = BTreeMap::new();
        let mut add = |entry: Result<(Vec<u8>, Vec<u8>), Error>| -> Result<(), Error> {
            let (raw, stored) = entry?;
            let (k, ts) = self.parse(&raw)?;
            if from <= ts && ts <= to {
                // Stored with the closing time when it came; a record stored by an older
                // SDK has none, and counts in every window that holds it.
                let (value, came) = stamp::split(&stored);
                found.entry(k).or_default().push((ts, came, value.to_vec()));
            }
            Ok(())
        };
        let (first, last) = (from.div_euclid(self.segment), to.div_euclid(self.segment));
        match key {
            // One key: a prefix scan per segment (a window spans a few).
            Some(key) => {
                let mut prefix = Vec::new();
                for segment in first..=last {
                    prefix.clear();
                    push_ordered(&mut prefix, &segment);
                    push_ordered(&mut prefix, key);
                    for entry in self.store.prefix(&prefix)? {
                        add(entry)?;
                    }
                }
            }
            // Every key: one scan over the segments.
            None => {
                let (mut lower, mut upper) = (Vec::new(), Vec::new());
                push_ordered(&mut lower, &first);
                push_ordered(&mut upper, &last.saturating_add(1));
                for entry in self.store.range(Some(&lower), Some(&upper))? {
                    add(entry)?;
                }
            }
        }
        Ok(found)
    }

    /// The windows of a key's `records` (sorted by time) that end in `[from, to]` and came
    /// to exist while open: their starts. A window exists once its records do — the window
    /// ending at a record when that record comes, the window starting just after a record
    /// when both it and a later record within reach have come — and one that only comes to
    /// exist once closed (its end before the closing time then) is never sent, as in Kafka
    /// Streams, which does not create it.
    fn windows_ending(&self, records: &Records, from: i64, to: i64) -> Vec<i64> {
        let d = self.windows.difference;
        let mut starts = Vec::new();
        for (i, (t, came, _)) in records.iter().enumerate() {
            // The window that ends at a record.
            if from <= *t && *t <= to && *t >= *came {
                starts.push(t.saturating_sub(d));
            }
            // The window that starts just after it, if a later record is in it: it came to
            // exist with the later of this record and the first of those (closing times
            // only grow, so that is the larger closing time).
            let end = t.saturating_add(1).saturating_add(d);
            if from <= end && end <= to {
                let first_later = records[i + 1..]
                    .iter()
                    .filter(|(u, _, _)| u > t && *u <= end)
                    .map(|(_, c, _)| *c)
                    .min();
                if first_later.is_some_and(|c| end >= (*came).max(c)) {
                    starts.push(t.saturating_add(1));
                }
            }
        }
        starts.sort_unstable();
        starts.dedup();
        starts
    }

    /// The aggregate of a window's records, and its time: the largest of theirs (Kafka
    /// Streams').
    fn aggregate(&mut self, key: &K, records: &Records, start: i64) -> Result<Option<(VA, i64)>, Error> {
        let end = start.saturating_add(self.windows.difference);
        let (mut agg, mut latest) = (None, i64::MIN);
        // A record counts in the windows that were open when it came (end >= its closing
        // time then): Kafka Streams adds it to those only.
        let held = |(t, came, _): &&(i64, i64, Vec<u8>)| start <= *t && *t <= end && end >= *came;
        for (t, _, value) in records.iter().filter(held) {
            let value = decode::<V>(&self.name, "value in its store", Some(value))?;
            agg = Some((self.fold)(key, value, agg));
            latest = latest.max(*t);
        }
        Ok(agg.map(|agg| (agg, latest)))
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
        let (d, grace) = (self.windows.difference, self.windows.grace);
        self.time.observe(rec.ts);
        // Late when its last window [t, t + d] is closed: t + d + 1 + grace <= T.
        if rec.ts.saturating_add(d).saturating_add(1).saturating_add(grace) <= self.time.now {
            return Ok(());
        }
        let mut value = std::mem::take(&mut self.buf);
        let stored = encode(&self.name, "value", &rec.value, &mut value).map(|v| v.is_some());
        // With the closing time as it came: the windows ending before it are closed to it.
        let came = self.time.now.saturating_sub(grace);
        stamp::push(&mut value, came);
        let id = cx.next_id();
        let mut key = std::mem::take(&mut self.key_buf);
        self.record_key(&mut key, raw_key, rec.ts, id);
        let result = match stored {
            Ok(true) => self.store.put(&key, &value),
            Ok(false) => Ok(()), // a null value adds nothing
            Err(e) => Err(e),
        };
        self.buf = value;
        self.key_buf = key;
        result?;
        if self.emit == Emit::OnUpdate {
            // Every open window that holds the record: those ending in [t, t + d].
            let records = self
                .records(
                    Some(raw_key),
                    rec.ts.saturating_sub(d).saturating_sub(1),
                    rec.ts.saturating_add(d),
                )?
                .remove(raw_key.as_slice())
                .unwrap_or_default();
            let open_from = self.time.now.saturating_sub(grace);
            let from = rec.ts.max(open_from);
            for start in self.windows_ending(&records, from, rec.ts.saturating_add(d)) {
                if start <= rec.ts {
                    if let Some((agg, ts)) = self.aggregate(&rec.key, &records, start)? {
                        self.forward(&rec.key, start, agg, ts, cx)?;
                    }
                }
            }
        }
        Ok(())
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
        // Windows ending before `close` are closed: end (exclusive) + grace <= T.
        let close = self.time.now.saturating_sub(self.windows.grace);
        if close > self.closed_to && self.emit == Emit::Final {
            let from = self.closed_to;
            let by_key = self.records(None, from.saturating_sub(d).saturating_sub(1), close.saturating_sub(1))?;
            for (raw_key, records) in by_key {
                let key = decode::<K>(&self.name, "key in its store", Some(&raw_key))?;
                for start in self.windows_ending(&records, from, close.saturating_sub(1)) {
                    if let Some((agg, ts)) = self.aggregate(&key, &records, start)? {
                        self.forward(&key, start, agg, ts, cx)?;
                    }
                }
            }
        }
        if close > self.closed_to {
            self.closed_to = close;
            self.store.put(CLOSED_KEY, &close.to_be_bytes())?;
            // Records no open window can hold: t < close - d - 1, a segment at a time.
            let (mut lower, mut upper) = (Vec::new(), Vec::new());
            push_ordered(&mut lower, &i64::MIN);
            push_ordered(
                &mut upper,
                &close.saturating_sub(d).saturating_sub(1).div_euclid(self.segment),
            );
            self.store.delete_range(Some(&lower), Some(&upper))?;
        }
        self.time.save(&*self.store)
    }

    fn close(&mut self, _cx: &mut Cx<'_>) -> Result<(), Error> {
        self.time.save(&*self.store)
    }
}
