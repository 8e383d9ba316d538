//! Windowed aggregations over time windows (tumbling and hopping): a record is added to
//! every window `[start, end)` that covers its timestamp, unless the window has closed
//! (`end + grace <= stream time`); results go on at every update or once per window when it
//! closes ("emit final"). The operator keeps its own stream time in its store, so a restart
//! neither emits a closed window again nor an open one early.
//!
//! The store holds, per window and key, `[start: 8 bytes, order-preserving][key bytes]` →
//! the aggregate, so closing windows and expiring them are range operations over the
//! oldest starts. The entry with the empty key holds the stream time (8 bytes, big-endian).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use super::builder::{decode, encode, Materialized};
use super::cache::RecordCache;
use super::data::{pop_ordered, push_ordered, Data, Windowed};
use super::graph::{Build, GraphNode};
use super::grouped::{forward_all, read_aggregate, write_aggregate, KGroupedStream};
use super::runtime::{built, BuildCx, Change, Cx, Downstream, Node, NodeRef, Punctuate, Rec};
use super::stamp;
use super::state::KeyValueStore;
use super::table::{GetterFactory, KTable};
use crate::Error;

/// Milliseconds of a duration, as the DSL's times are.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Kinds of windows a grouped stream can be windowed by: [`TimeWindows`],
/// [`SessionWindows`](super::SessionWindows), [`SlidingWindows`](super::SlidingWindows).
pub trait Windows: Clone + 'static {}

/// When a windowed aggregation sends its results on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Emit {
    /// At every update of a window (Kafka Streams' default).
    #[default]
    OnUpdate,
    /// Once per window, when it closes (`end + grace <= stream time`): Kafka Streams'
    /// `EmitStrategy.onWindowClose()`. Closing happens at punctuation.
    Final,
}

/// Fixed-size windows: tumbling (back to back) or hopping (overlapping, one every
/// `advance`). Windows start at multiples of `advance` from the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeWindows {
    pub(crate) size: i64,
    pub(crate) advance: i64,
    pub(crate) grace: i64,
}

impl Windows for TimeWindows {}

impl TimeWindows {
    /// Windows of `size`, back to back, with no grace period.
    pub fn tumbling(size: Duration) -> Self {
        let size = millis(size);
        TimeWindows {
            size,
            advance: size,
            grace: 0,
        }
    }

    /// Windows of `size`, a new one every `advance` (at most `size`): a record is in every
    /// window that covers it.
    pub fn hopping(size: Duration, advance: Duration) -> Self {
        TimeWindows {
            size: millis(size),
            advance: millis(advance),
            grace: 0,
        }
    }

    /// How long after its end a window still takes records that arrive out of order.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = millis(grace);
        self
    }

    fn check(&self) -> Result<(), String> {
        if self.size <= 0 {
            return Err(format!("time windows of {} ms: the size must be positive", self.size));
        }
        if self.advance <= 0 || self.advance > self.size {
            return Err(format!(
                "time windows of {} ms advancing by {} ms: the advance must be positive and at most the size",
                self.size, self.advance
            ));
        }
        Ok(())
    }

    /// The starts of the windows that cover `ts` (none for a negative time).
    pub(crate) fn starts(&self, ts: i64) -> impl Iterator<Item = i64> {
        let first = (ts.saturating_sub(self.size).saturating_add(self.advance)).max(0) / self.advance * self.advance;
        let (advance, last) = (self.advance, if ts < 0 { -1 } else { ts });
        (0..)
            .map(move |i: i64| first.saturating_add(i.saturating_mul(advance)))
            .take_while(move |start| *start <= last)
    }
}

/// A grouped stream with windows, ready for an aggregation (Kafka Streams'
/// `TimeWindowedKStream`, `SessionWindowedKStream`).
pub struct WindowedBy<K, V, W> {
    pub(crate) grouped: KGroupedStream<K, V>,
    pub(crate) windows: W,
    pub(crate) emit: Emit,
}

impl<K: Data, V: Data, W: Windows> WindowedBy<K, V, W> {
    pub(crate) fn new(grouped: KGroupedStream<K, V>, windows: W) -> Self {
        WindowedBy {
            grouped,
            windows,
            emit: Emit::OnUpdate,
        }
    }

    /// Sends each window's result once, when the window closes, instead of at every update.
    pub fn emit_final(mut self) -> Self {
        self.emit = Emit::Final;
        self
    }

    /// Adds a windowed aggregation operator that keeps `store`; `make` builds it at `init`.
    pub(crate) fn add<VA: Data, N>(
        &self,
        kind: &str,
        store: String,
        make: impl FnOnce(String, Rc<dyn KeyValueStore>, Downstream<Windowed<K>, Change<VA>>, usize) -> Result<N, Error>
            + 'static,
    ) -> KTable<Windowed<K>, VA>
    where
        N: Node<K, V> + Punctuate + 'static,
    {
        let input = self.grouped.input(&store);
        let mut g = input.graph.borrow_mut();
        let name = g.next_name(kind);
        let build = {
            let (name, store) = (name.clone(), store.clone());
            Build::Node(Box::new(
                move |cx: &mut BuildCx<'_>, children: &[Rc<dyn std::any::Any>]| {
                    let down = Downstream::from_built(&name, children)?;
                    let kv = cx.store(&store)?;
                    let node = Rc::new(RefCell::new(make(name, kv, down, cx.cache_max_bytes)?));
                    cx.punctuate(node.clone());
                    let node: NodeRef<K, V> = node;
                    Ok(built(node))
                },
            ))
        };
        let mut node = GraphNode::new(name.clone(), vec![input.node], build);
        node.stores.push(store.clone());
        let id = g.add(node);
        // A window store is read by range, not by key: a lookup by windowed key is not offered.
        let getter: GetterFactory<Windowed<K>, VA> = Rc::new(move |_cx: &mut BuildCx<'_>| {
            Err(Error::msg(format!(
                "the windowed table of {name} cannot be looked up by key (join its stream instead)"
            )))
        });
        KTable::new(input.graph.clone(), id, getter, vec![store])
    }

    pub(crate) fn error(&self, message: String) {
        self.grouped.stream.graph.borrow_mut().error(message);
    }

    pub(crate) fn store_name(&self, kind: &str, materialized: Materialized) -> String {
        materialized.or(self.grouped.stream.graph.borrow().next_name(kind))
    }
}

impl<K: Data, V: Data> WindowedBy<K, V, TimeWindows> {
    /// The number of records per key and window (`u64`).
    pub fn count(&self, materialized: impl Into<Materialized>) -> KTable<Windowed<K>, u64> {
        self.aggregate_with("count", materialized.into(), |_k: &K, _v: V, n: Option<u64>| {
            n.unwrap_or(0) + 1
        })
    }

    /// Each key's values per window, combined by `reducer`.
    pub fn reduce(
        &self,
        mut reducer: impl FnMut(V, V) -> V + 'static,
        materialized: impl Into<Materialized>,
    ) -> KTable<Windowed<K>, V> {
        self.aggregate_with(
            "reduce",
            materialized.into(),
            move |_k: &K, v: V, agg: Option<V>| match agg {
                Some(agg) => reducer(agg, v),
                None => v,
            },
        )
    }

    /// Each key's values per window folded by `aggregator` from `initializer()`.
    pub fn aggregate<VA: Data>(
        &self,
        mut initializer: impl FnMut() -> VA + 'static,
        mut aggregator: impl FnMut(&K, V, VA) -> VA + 'static,
        materialized: impl Into<Materialized>,
    ) -> KTable<Windowed<K>, VA> {
        self.aggregate_with("aggregate", materialized.into(), move |k: &K, v: V, agg: Option<VA>| {
            let agg = agg.unwrap_or_else(&mut initializer);
            aggregator(k, v, agg)
        })
    }

    fn aggregate_with<VA: Data>(
        &self,
        kind: &str,
        materialized: Materialized,
        step: impl FnMut(&K, V, Option<VA>) -> VA + 'static,
    ) -> KTable<Windowed<K>, VA> {
        if let Err(e) = self.windows.check() {
            self.error(e);
        }
        let (windows, emit) = (self.windows, self.emit);
        let store = self.store_name(kind, materialized);
        self.add(kind, store, move |name, store, down, cache_bytes| {
            let time = StreamTime::load(&name, &*store)?;
            Ok(TimeWindowAggregate {
                name,
                store,
                windows,
                emit,
                step,
                down,
                cache: RecordCache::new(if emit == Emit::OnUpdate { cache_bytes } else { 0 }),
                time,
                closed_below: i64::MIN,
                raw_key: Vec::new(),
                key_buf: Vec::new(),
                value_buf: Vec::new(),
                _input: std::marker::PhantomData,
            })
        })
    }
}

/// An operator's stream time, saved in its store under the empty key.
pub(crate) struct StreamTime {
    /// The largest timestamp the operator has seen (`i64::MIN`: none yet).
    pub now: i64,
    saved: i64,
}

impl StreamTime {
    pub const KEY: &'static [u8] = b"";

    pub fn load(operator: &str, store: &dyn KeyValueStore) -> Result<Self, Error> {
        let now = match store.get(Self::KEY)? {
            None => i64::MIN,
            Some(bytes) => {
                let bytes: [u8; 8] = bytes.as_slice().try_into().map_err(|_| {
                    Error::msg(format!(
                        "operator {operator}: the stream time in store {:?} is {} bytes, not 8",
                        store.name(),
                        bytes.len()
                    ))
                })?;
                i64::from_be_bytes(bytes)
            }
        };
        Ok(StreamTime { now, saved: now })
    }

    pub fn observe(&mut self, ts: i64) {
        self.now = self.now.max(ts);
    }

    /// Writes the stream time if it moved since it was last written.
    pub fn save(&mut self, store: &dyn KeyValueStore) -> Result<(), Error> {
        if self.now != self.saved {
            store.put(Self::KEY, &self.now.to_be_bytes())?;
            self.saved = self.now;
        }
        Ok(())
    }
}

/// The store key of a window of a key: its start (order-preserving), then the key's bytes.
pub(crate) fn window_key(start: i64, key: &[u8], out: &mut Vec<u8>) {
    out.clear();
    push_ordered(out, &start);
    out.extend_from_slice(key);
}

fn split_window_key<'a>(operator: &str, raw: &'a [u8]) -> Result<(i64, &'a [u8]), Error> {
    let mut rest = raw;
    let start: i64 = pop_ordered(&mut rest)
        .map_err(|e| Error::msg(format!("operator {operator}: a window key in its store: {e}")))?;
    Ok((start, rest))
}

struct TimeWindowAggregate<K, V, VA, F> {
    name: String,
    store: Rc<dyn KeyValueStore>,
    windows: TimeWindows,
    emit: Emit,
    step: F,
    down: Downstream<Windowed<K>, Change<VA>>,
    /// Updates waiting to go downstream (emitted on update only; see `cache`).
    cache: RecordCache<Windowed<K>, VA>,
    time: StreamTime,
    /// Windows starting below this were closed at the last punctuation.
    closed_below: i64,
    raw_key: Vec<u8>,
    key_buf: Vec<u8>,
    value_buf: Vec<u8>,
    _input: std::marker::PhantomData<fn(V)>,
}

impl<K, V, VA, F> Node<K, V> for TimeWindowAggregate<K, V, VA, F>
where
    K: Data,
    V: Data,
    VA: Data,
    F: FnMut(&K, V, Option<VA>) -> VA,
{
    fn process(&mut self, rec: Rec<K, V>, cx: &mut Cx<'_>) -> Result<(), Error> {
        if rec.ts < 0 {
            return Ok(()); // Kafka has no negative timestamps; Kafka Streams drops them too
        }
        let mut raw_key = std::mem::take(&mut self.raw_key);
        let result = self.add(rec, &mut raw_key, cx);
        self.raw_key = raw_key;
        result
    }
}

impl<K, V, VA, F> TimeWindowAggregate<K, V, VA, F>
where
    K: Data,
    V: Data,
    VA: Data,
    F: FnMut(&K, V, Option<VA>) -> VA,
{
    fn add(&mut self, rec: Rec<K, V>, raw_key: &mut Vec<u8>, cx: &mut Cx<'_>) -> Result<(), Error> {
        if encode(&self.name, "key", &rec.key, raw_key)?.is_none() {
            return Ok(()); // null keys are dropped
        }
        self.time.observe(rec.ts);
        let close = self.time.now.saturating_sub(self.windows.grace);
        let (size, windows) = (self.windows.size, self.windows);
        let open = move |start: &i64| start.saturating_add(size) > close;
        let count = windows.starts(rec.ts).filter(open).count();
        let mut value = Some(rec.value);
        for (i, start) in windows.starts(rec.ts).filter(open).enumerate() {
            // The value is copied for every window but the last, which takes it.
            let value = if i + 1 == count { value.take() } else { value.clone() };
            let Some(value) = value else { break };
            window_key(start, raw_key, &mut self.key_buf);
            let (old, old_ts) = read_aggregate::<VA>(&self.name, &*self.store, &self.key_buf)?.unzip();
            // Kafka Streams' time of a window: the largest of its records'.
            let ts = stamp::later(rec.ts, old_ts);
            let new = (self.step)(&rec.key, value, old.clone());
            write_aggregate(
                &self.name,
                &*self.store,
                &self.key_buf,
                Some(&new),
                Some(ts),
                &mut self.value_buf,
            )?;
            if self.emit == Emit::OnUpdate {
                let key = Windowed {
                    key: rec.key.clone(),
                    start,
                    end: start.saturating_add(size),
                };
                if self.cache.enabled() {
                    let bytes = self.key_buf.len() + self.value_buf.len();
                    let out = self.cache.put(&self.key_buf, key, old, Some(new), ts, bytes);
                    forward_all(&self.down, out, cx)?;
                    continue;
                }
                let value = Change { new: Some(new), old };
                self.down.forward(Rec { key, value, ts }, cx)?;
            }
        }
        Ok(())
    }
}

impl<K, V, VA, F> Punctuate for TimeWindowAggregate<K, V, VA, F>
where
    K: Data,
    V: Data,
    VA: Data,
    F: FnMut(&K, V, Option<VA>) -> VA,
{
    fn batch_started(&mut self) -> Result<(), Error> {
        self.time = StreamTime::load(&self.name, &*self.store)?;
        Ok(())
    }

    fn call_started(&mut self) {
        self.cache.call_started();
    }

    fn call_done(&mut self) {
        self.cache.call_done();
    }

    fn flush(&mut self, cx: &mut Cx<'_>) -> Result<bool, Error> {
        forward_all(&self.down, self.cache.flush(), cx)
    }

    fn batch_done(&mut self) -> Result<(), Error> {
        self.time.save(&*self.store)
    }

    fn punctuate(&mut self, _time: i64, cx: &mut Cx<'_>) -> Result<(), Error> {
        if self.time.now == i64::MIN {
            return Ok(());
        }
        // Closed: end + grace <= now, so start < now - grace - size + 1.
        let bound = self
            .time
            .now
            .saturating_sub(self.windows.grace)
            .saturating_sub(self.windows.size)
            .saturating_add(1);
        if bound == self.closed_below {
            // Stream time has not moved: nothing more is closed (a record for a closed
            // window is late, so none appeared below the bound).
            return self.time.save(&*self.store);
        }
        self.closed_below = bound;
        let mut lower = Vec::new();
        push_ordered(&mut lower, &i64::MIN);
        let mut upper = Vec::new();
        push_ordered(&mut upper, &bound);
        if self.emit == Emit::Final {
            for entry in self.store.range(Some(&lower), Some(&upper))? {
                let (raw_key, raw_value) = entry?;
                let (start, key) = split_window_key(&self.name, &raw_key)?;
                let key = decode::<K>(&self.name, "key in its store", Some(key))?;
                let (raw_value, ts) = stamp::split(&raw_value);
                let value = decode::<VA>(&self.name, "aggregate in its store", Some(raw_value))?;
                let end = start.saturating_add(self.windows.size);
                // Stored without a time (by an older SDK): the window's last millisecond.
                let ts = if ts == stamp::UNKNOWN { end - 1 } else { ts };
                let rec = Rec {
                    key: Windowed { key, start, end },
                    value: Change {
                        new: Some(value),
                        old: None,
                    },
                    ts,
                };
                self.down.forward(rec, cx)?;
            }
        }
        self.store.delete_range(Some(&lower), Some(&upper))?;
        self.time.save(&*self.store)
    }

    fn close(&mut self, _cx: &mut Cx<'_>) -> Result<(), Error> {
        self.time.save(&*self.store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn starts(w: TimeWindows, ts: i64) -> Vec<i64> {
        w.starts(ts).collect()
    }

    #[test]
    fn a_record_is_in_every_window_that_covers_it() {
        let ms = Duration::from_millis;
        assert_eq!(starts(TimeWindows::tumbling(ms(10)), 25), vec![20]);
        assert_eq!(starts(TimeWindows::tumbling(ms(10)), 0), vec![0]);
        assert_eq!(starts(TimeWindows::hopping(ms(10), ms(5)), 25), vec![20, 25]);
        assert_eq!(starts(TimeWindows::hopping(ms(10), ms(3)), 7), vec![0, 3, 6]);
        assert_eq!(starts(TimeWindows::hopping(ms(10), ms(3)), 2), vec![0]);
        assert!(starts(TimeWindows::tumbling(ms(10)), -1).is_empty());
    }
}
