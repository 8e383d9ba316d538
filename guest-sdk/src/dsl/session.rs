//! Session windows: a key's records closer than the inactivity gap to each other form a
//! session; a record that bridges two sessions merges them (Kafka Streams'
//! `SessionWindows`).
//!
//! A session `[first, last]` (record times) is keyed `Windowed { start: first, end: last + 1 }`.
//! A record at `t` joins every session of its key with `first - gap <= t <= last + gap`
//! that is still kept: `last + gap + grace > T` (the operator's stream time; Kafka Streams'
//! session store keeps a session for the gap and grace, its default retention); it is late
//! (dropped) when the merged session is closed: `last + gap + grace < T` (Kafka Streams'
//! `mergedWindow.end() < T - grace - gap`). A closed session is emitted with
//! [`Emit::Final`](super::Emit::Final) at the next punctuation, and forgotten.
//! With [`Emit::OnUpdate`](super::Emit::OnUpdate) each merge sends a deletion (`None`) of
//! every session it absorbs, then the new session, each stamped with its last record's
//! time (Kafka Streams' time of a session).
//!
//! The store holds, per session, `(segment of last, key, last, first)` (order-preserving)
//! → the aggregate: closing sessions scans the oldest segments, and finding a key's
//! sessions scans the segments from `t - gap` to the stream time. The empty key holds the
//! stream time.

use std::rc::Rc;
use std::time::Duration;

use super::builder::{decode, encode, Materialized};
use super::data::{pop_ordered, push_ordered, Data, Windowed};
use super::grouped::write_aggregate;
use super::runtime::{Change, Cx, Downstream, Node, Punctuate, Rec};
use super::state::KeyValueStore;
use super::table::KTable;
use super::windows::{millis, Emit, StreamTime, WindowedBy, Windows};
use crate::Error;

/// Session windows: records of a key closer than `gap` to each other are one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionWindows {
    pub(crate) gap: i64,
    pub(crate) grace: i64,
}

impl Windows for SessionWindows {}

impl SessionWindows {
    /// Sessions that end after `gap` without a record, with no grace period.
    pub fn with_inactivity_gap(gap: Duration) -> Self {
        SessionWindows {
            gap: millis(gap),
            grace: 0,
        }
    }

    /// How long after a session could last have grown it still takes out-of-order records.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = millis(grace);
        self
    }
}

impl<K: Data, V: Data> WindowedBy<K, V, SessionWindows> {
    /// The number of records per key and session.
    pub fn count(&self, materialized: impl Into<Materialized>) -> KTable<Windowed<K>, u64> {
        self.sessions(
            "count",
            materialized.into(),
            |_k: &K, _v: V, n: Option<u64>| n.unwrap_or(0) + 1,
            |_k: &K, a: u64, b: u64| a + b,
        )
    }

    /// Each session's values combined by `reducer` (also when two sessions merge).
    pub fn reduce(
        &self,
        reducer: impl FnMut(V, V) -> V + 'static,
        materialized: impl Into<Materialized>,
    ) -> KTable<Windowed<K>, V> {
        let reducer = Rc::new(std::cell::RefCell::new(reducer));
        let merge = reducer.clone();
        self.sessions(
            "reduce",
            materialized.into(),
            move |_k: &K, v: V, agg: Option<V>| match agg {
                Some(agg) => (reducer.borrow_mut())(agg, v),
                None => v,
            },
            move |_k: &K, a: V, b: V| (merge.borrow_mut())(a, b),
        )
    }

    /// Each session's values folded by `aggregator` from `initializer()`; `merger` combines
    /// the aggregates of two sessions a record bridges.
    pub fn aggregate<VA: Data>(
        &self,
        mut initializer: impl FnMut() -> VA + 'static,
        mut aggregator: impl FnMut(&K, V, VA) -> VA + 'static,
        merger: impl FnMut(&K, VA, VA) -> VA + 'static,
        materialized: impl Into<Materialized>,
    ) -> KTable<Windowed<K>, VA> {
        self.sessions(
            "aggregate",
            materialized.into(),
            move |k: &K, v: V, agg: Option<VA>| {
                let agg = agg.unwrap_or_else(&mut initializer);
                aggregator(k, v, agg)
            },
            merger,
        )
    }

    fn sessions<VA: Data>(
        &self,
        kind: &str,
        materialized: Materialized,
        add: impl FnMut(&K, V, Option<VA>) -> VA + 'static,
        merge: impl FnMut(&K, VA, VA) -> VA + 'static,
    ) -> KTable<Windowed<K>, VA> {
        let windows = self.windows;
        if windows.gap < 0 || windows.grace < 0 {
            self.error(format!(
                "session windows with a gap of {} ms and a grace of {} ms: neither may be negative",
                windows.gap, windows.grace
            ));
        }
        let emit = self.emit;
        let store = self.store_name(kind, materialized);
        self.add(kind, store, move |name, store, down, _cache| {
            let mut lowest = Vec::new();
            push_ordered(&mut lowest, &i64::MIN);
            let floor = match store.range(Some(&lowest), None)?.next() {
                Some(entry) => pop_ordered::<i64>(&mut &entry?.0[..])
                    .map_err(|e| Error::msg(format!("operator {name}: a session key in its store: {e}")))?,
                None => i64::MAX,
            };
            Ok(SessionAggregate {
                time: StreamTime::load(&name, &*store)?,
                segment: (windows.gap.saturating_add(windows.grace) / 2).max(1),
                floor,
                closed_below: i64::MIN,
                name,
                store,
                windows,
                emit,
                add,
                merge,
                down,
                raw_key: Vec::new(),
                buf: Vec::new(),
                value_buf: Vec::new(),
                _input: std::marker::PhantomData,
            })
        })
    }
}

struct SessionAggregate<K, V, VA, A, M> {
    name: String,
    store: Rc<dyn KeyValueStore>,
    windows: SessionWindows,
    emit: Emit,
    add: A,
    merge: M,
    down: Downstream<Windowed<K>, Change<VA>>,
    time: StreamTime,
    segment: i64,
    /// No session is in a segment below this one (the store's oldest, or where the last
    /// punctuation closed): lookups start there, however old the record.
    floor: i64,
    /// Sessions ending below this were closed at the last punctuation.
    closed_below: i64,
    raw_key: Vec<u8>,
    buf: Vec<u8>,
    value_buf: Vec<u8>,
    _input: std::marker::PhantomData<fn(V)>,
}

/// A session found in the store: its store key, first and last times, aggregate bytes.
struct Found {
    store_key: Vec<u8>,
    first: i64,
    last: i64,
    agg: Vec<u8>,
}

impl<K, V, VA, A, M> SessionAggregate<K, V, VA, A, M>
where
    K: Data,
    V: Data,
    VA: Data,
    A: FnMut(&K, V, Option<VA>) -> VA,
    M: FnMut(&K, VA, VA) -> VA,
{
    fn session_key(&self, out: &mut Vec<u8>, key: &[u8], first: i64, last: i64) {
        out.clear();
        push_ordered(out, &last.div_euclid(self.segment));
        push_ordered(out, key);
        push_ordered(out, &last);
        push_ordered(out, &first);
    }

    /// Reads a store key: (key bytes, first, last).
    fn parse(&self, raw: &[u8]) -> Result<(Vec<u8>, i64, i64), Error> {
        let mut rest = raw;
        let parsed = (|| {
            let _segment: i64 = pop_ordered(&mut rest)?;
            let key: Vec<u8> = pop_ordered(&mut rest)?;
            let last: i64 = pop_ordered(&mut rest)?;
            let first: i64 = pop_ordered(&mut rest)?;
            Ok::<_, crate::CodecError>((key, first, last))
        })();
        parsed.map_err(|e| Error::msg(format!("operator {}: a session key in its store: {e}", self.name)))
    }

    /// The sessions of `key` with `last >= from` and `first <= to`, oldest first.
    fn overlapping(&self, key: &[u8], from: i64, to: i64) -> Result<Vec<Found>, Error> {
        let mut found = Vec::new();
        let (mut lower, mut upper) = (Vec::new(), Vec::new());
        let newest = self.time.now.max(to);
        for segment in from.div_euclid(self.segment).max(self.floor)..=newest.div_euclid(self.segment) {
            lower.clear();
            push_ordered(&mut lower, &segment);
            push_ordered(&mut lower, key);
            upper.clone_from(&lower);
            push_ordered(&mut lower, &from);
            upper = super::state::prefix_end(&upper).unwrap_or_default();
            for entry in self.store.range(Some(&lower), Some(&upper))? {
                let (store_key, agg) = entry?;
                let (_, first, last) = self.parse(&store_key)?;
                if first <= to {
                    found.push(Found {
                        store_key,
                        first,
                        last,
                        agg,
                    });
                }
            }
        }
        Ok(found)
    }

    fn add_record(&mut self, rec: Rec<K, V>, raw_key: &mut Vec<u8>, cx: &mut Cx<'_>) -> Result<(), Error> {
        if encode(&self.name, "key", &rec.key, raw_key)?.is_none() {
            return Ok(()); // null keys are dropped
        }
        self.time.observe(rec.ts);
        let (gap, grace) = (self.windows.gap, self.windows.grace);
        let mut found = self.overlapping(raw_key, rec.ts.saturating_sub(gap), rec.ts.saturating_add(gap))?;
        // A session kept past its gap and grace of stream time (it closed, and waits to go
        // out) takes nothing more: Kafka Streams' session store no longer finds it.
        let now = self.time.now;
        found.retain(|f| f.last.saturating_add(gap).saturating_add(grace) > now);
        let first = found.iter().map(|f| f.first).fold(rec.ts, i64::min);
        let last = found.iter().map(|f| f.last).fold(rec.ts, i64::max);
        if last.saturating_add(gap).saturating_add(grace) < now {
            return Ok(()); // late: the session it would make has closed
        }
        // A record on the only record time of its session replaces it in place.
        let in_place = first == rec.ts && last == rec.ts;
        let mut agg: Option<VA> = None;
        for f in &found {
            let old: VA = decode(&self.name, "aggregate in its store", Some(&f.agg))?;
            self.store.delete(&f.store_key)?;
            if self.emit == Emit::OnUpdate && !in_place {
                let key = Windowed {
                    key: rec.key.clone(),
                    start: f.first,
                    end: f.last.saturating_add(1),
                };
                let change = Change {
                    new: None,
                    old: Some(old.clone()),
                };
                // Stamped with the session's end, as Kafka Streams stamps sessions.
                self.down.forward(
                    Rec {
                        key,
                        value: change,
                        ts: f.last,
                    },
                    cx,
                )?;
            }
            agg = Some(match agg {
                None => old,
                Some(agg) => (self.merge)(&rec.key, agg, old),
            });
        }
        let new = (self.add)(&rec.key, rec.value, agg);
        let mut session_key = std::mem::take(&mut self.buf);
        self.session_key(&mut session_key, raw_key, first, last);
        self.floor = self.floor.min(last.div_euclid(self.segment));
        let written = write_aggregate(
            &self.name,
            &*self.store,
            &session_key,
            Some(&new),
            None,
            &mut self.value_buf,
        );
        self.buf = session_key;
        written?;
        if self.emit == Emit::OnUpdate {
            let key = Windowed {
                key: rec.key,
                start: first,
                end: last.saturating_add(1),
            };
            let change = Change {
                new: Some(new),
                old: None,
            };
            self.down.forward(
                Rec {
                    key,
                    value: change,
                    ts: last,
                },
                cx,
            )?;
        }
        Ok(())
    }
}

impl<K, V, VA, A, M> Node<K, V> for SessionAggregate<K, V, VA, A, M>
where
    K: Data,
    V: Data,
    VA: Data,
    A: FnMut(&K, V, Option<VA>) -> VA,
    M: FnMut(&K, VA, VA) -> VA,
{
    fn process(&mut self, rec: Rec<K, V>, cx: &mut Cx<'_>) -> Result<(), Error> {
        let mut raw_key = std::mem::take(&mut self.raw_key);
        let result = self.add_record(rec, &mut raw_key, cx);
        self.raw_key = raw_key;
        result
    }
}

impl<K, V, VA, A, M> Punctuate for SessionAggregate<K, V, VA, A, M>
where
    K: Data,
    V: Data,
    VA: Data,
    A: FnMut(&K, V, Option<VA>) -> VA,
    M: FnMut(&K, VA, VA) -> VA,
{
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
        // Closed: last + gap + grace < T.
        let cut = self
            .time
            .now
            .saturating_sub(self.windows.gap)
            .saturating_sub(self.windows.grace);
        if cut == self.closed_below {
            return self.time.save(&*self.store); // stream time has not moved
        }
        self.closed_below = cut;
        let (mut lower, mut upper) = (Vec::new(), Vec::new());
        push_ordered(&mut lower, &i64::MIN);
        push_ordered(&mut upper, &cut.div_euclid(self.segment).saturating_add(1));
        let mut closed = Vec::new();
        for entry in self.store.range(Some(&lower), Some(&upper))? {
            let (store_key, agg) = entry?;
            let (key, first, last) = self.parse(&store_key)?;
            if last >= cut {
                continue;
            }
            if self.emit == Emit::Final {
                let key = decode::<K>(&self.name, "key in its store", Some(&key))?;
                let value = read_aggregate_bytes::<VA>(&self.name, &agg)?;
                let rec = Rec {
                    key: Windowed {
                        key,
                        start: first,
                        end: last.saturating_add(1),
                    },
                    value: Change {
                        new: Some(value),
                        old: None,
                    },
                    ts: last,
                };
                self.down.forward(rec, cx)?;
            }
            closed.push((store_key, None));
        }
        if !closed.is_empty() {
            self.store.write_batch(&closed)?;
        }
        // Every session left ends at or after `cut`.
        self.floor = self.floor.max(cut.div_euclid(self.segment));
        self.time.save(&*self.store)
    }

    fn close(&mut self, _cx: &mut Cx<'_>) -> Result<(), Error> {
        self.time.save(&*self.store)
    }
}

fn read_aggregate_bytes<VA: Data>(operator: &str, bytes: &[u8]) -> Result<VA, Error> {
    decode::<VA>(operator, "aggregate in its store", Some(bytes))
}
