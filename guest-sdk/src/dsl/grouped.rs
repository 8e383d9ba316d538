//! Grouped streams and their aggregations (count, reduce, aggregate): the aggregate per
//! key lives in a store (key → aggregate, in their codecs), and each update goes on as a
//! table change.

use std::cell::RefCell;
use std::rc::Rc;

use super::builder::{decode_stored, encode, repartition, Materialized};
use super::cache::RecordCache;
use super::data::Data;
use super::graph::{Build, GraphNode};
use super::runtime::{built, BuildCx, Change, Cx, Downstream, Node, NodeRef, Punctuate, Rec};
use super::stamp;
use super::state::KeyValueStore;
use super::stream::KStream;
use super::table::{store_getter, KTable};
use super::windows::{WindowedBy, Windows};
use crate::Error;

/// A stream grouped by key, ready for an aggregation (Kafka Streams' `KGroupedStream`).
pub struct KGroupedStream<K, V> {
    pub(crate) stream: KStream<K, V>,
    pub(crate) repartition: bool,
    pub(crate) name: Option<String>,
    pub(crate) partitions: Option<u32>,
    /// The repartitioned stream, once an aggregation made it: every aggregation of this
    /// grouping reads the same repartition topic (shared with its windowed groupings).
    repartitioned: Rc<RefCell<Option<KStream<K, V>>>>,
}

impl<K: Data, V: Data> KGroupedStream<K, V> {
    pub(crate) fn new(stream: KStream<K, V>, repartition: bool) -> Self {
        KGroupedStream {
            stream,
            repartition,
            name: None,
            partitions: None,
            repartitioned: Rc::default(),
        }
    }

    /// Names the repartition topic, if one is needed (Kafka Streams' `Grouped.as`): the
    /// host creates `<topology>-<name>-repartition`. By default it is named after the
    /// aggregation's store.
    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// The partition count of the repartition topic, if one is needed (by default the host
    /// picks the largest partition count of the sources upstream).
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = Some(partitions);
        self
    }

    /// The stream an aggregation keeping `store` reads: repartitioned by key if needed,
    /// through one topic for every aggregation of this grouping (named after the grouping,
    /// or else after the store of the first aggregation), as Kafka Streams' optimizer merges
    /// them.
    pub(crate) fn input(&self, store: &str) -> KStream<K, V> {
        if !self.repartition {
            return self.stream.clone();
        }
        let mut made = self.repartitioned.borrow_mut();
        made.get_or_insert_with(|| {
            let topic = self.name.clone().unwrap_or_else(|| store.to_string());
            repartition(&self.stream, &topic, self.partitions)
        })
        .clone()
    }

    /// The number of records per key, kept in the store `materialized` (key → `u64`).
    pub fn count(&self, materialized: impl Into<Materialized>) -> KTable<K, u64> {
        self.aggregate_with(
            "count",
            materialized.into(),
            |_key: &K, _value: V, count: Option<u64>| count.unwrap_or(0) + 1,
        )
    }

    /// Each key's values combined by `reducer` (the first value as it is).
    pub fn reduce(
        &self,
        mut reducer: impl FnMut(V, V) -> V + 'static,
        materialized: impl Into<Materialized>,
    ) -> KTable<K, V> {
        self.aggregate_with(
            "reduce",
            materialized.into(),
            move |_key: &K, value: V, agg: Option<V>| match agg {
                Some(agg) => reducer(agg, value),
                None => value,
            },
        )
    }

    /// Each key's values folded by `aggregator` into an aggregate that starts as
    /// `initializer()`.
    pub fn aggregate<VA: Data>(
        &self,
        mut initializer: impl FnMut() -> VA + 'static,
        mut aggregator: impl FnMut(&K, V, VA) -> VA + 'static,
        materialized: impl Into<Materialized>,
    ) -> KTable<K, VA> {
        self.aggregate_with(
            "aggregate",
            materialized.into(),
            move |key: &K, value: V, agg: Option<VA>| {
                let agg = agg.unwrap_or_else(&mut initializer);
                aggregator(key, value, agg)
            },
        )
    }

    fn aggregate_with<VA: Data>(
        &self,
        kind: &str,
        materialized: Materialized,
        step: impl FnMut(&K, V, Option<VA>) -> VA + 'static,
    ) -> KTable<K, VA> {
        let store = materialized.or(self.stream.graph.borrow().next_name(kind));
        let input = self.input(&store);
        let mut g = input.graph.borrow_mut();
        let name = g.next_name(kind);
        let build = {
            let (name, store) = (name.clone(), store.clone());
            Build::Node(Box::new(
                move |cx: &mut BuildCx<'_>, children: &[Rc<dyn std::any::Any>]| {
                    let node = Rc::new(RefCell::new(StreamAggregate {
                        down: Downstream::from_built(&name, children)?,
                        store: cx.store(&store)?,
                        name,
                        step,
                        cache: RecordCache::new(cx.cache_max_bytes),
                        key_buf: Vec::new(),
                        value_buf: Vec::new(),
                        _input: std::marker::PhantomData,
                    }));
                    if cx.cache_max_bytes > 0 {
                        cx.punctuate(node.clone());
                    }
                    let node: NodeRef<K, V> = node;
                    Ok(built(node))
                },
            ))
        };
        let mut node = GraphNode::new(name, vec![input.node], build);
        node.stores.push(store.clone());
        let id = g.add(node);
        KTable::new(
            input.graph.clone(),
            id,
            store_getter::<K, VA>(store.clone()),
            vec![store],
        )
    }

    /// Windows the groups by [`TimeWindows`](super::TimeWindows) (tumbling or hopping),
    /// [`SessionWindows`](super::SessionWindows) or [`SlidingWindows`](super::SlidingWindows):
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice_guest::dsl::{StreamsBuilder, TimeWindows, Topology};
    ///
    /// let topology = Topology::build("clicks", |b: &mut StreamsBuilder| {
    ///     b.stream::<String, String>("clicks")
    ///         .group_by_key()
    ///         .windowed_by(TimeWindows::tumbling(Duration::from_secs(60)).grace(Duration::from_secs(10)))
    ///         .count("clicks_per_minute")
    ///         .to_stream()
    ///         .map(|w, n| (w.key, n.unwrap_or(0)))
    ///         .to("per_minute");
    /// });
    /// assert!(topology.is_ok());
    /// ```
    pub fn windowed_by<W: Windows>(&self, windows: W) -> WindowedBy<K, V, W> {
        WindowedBy::new(self.clone_grouped(), windows)
    }

    pub(crate) fn clone_grouped(&self) -> Self {
        KGroupedStream {
            stream: self.stream.clone(),
            repartition: self.repartition,
            name: self.name.clone(),
            partitions: self.partitions,
            repartitioned: self.repartitioned.clone(),
        }
    }
}

/// Reads the aggregate of `key` from `store`, with its time ([`stamp::UNKNOWN`] if it was
/// stored without one).
pub(crate) fn read_aggregate<VA: Data>(
    operator: &str,
    store: &dyn KeyValueStore,
    raw_key: &[u8],
) -> Result<Option<(VA, i64)>, Error> {
    store
        .get(raw_key)?
        .map(|bytes| {
            let (value, ts) = stamp::split(&bytes);
            decode_stored::<VA>(operator, "aggregate", store.name(), value).map(|agg| (agg, ts))
        })
        .transpose()
}

/// Writes the aggregate of `key` (a null deletes it), stamped with `ts` when given.
pub(crate) fn write_aggregate<VA: Data>(
    operator: &str,
    store: &dyn KeyValueStore,
    raw_key: &[u8],
    agg: Option<&VA>,
    ts: Option<i64>,
    buf: &mut Vec<u8>,
) -> Result<(), Error> {
    let present = match agg {
        Some(agg) => encode(operator, "aggregate", agg, buf)?.is_some(),
        None => false,
    };
    if !present {
        buf.clear();
        return store.delete(raw_key);
    }
    if let Some(ts) = ts {
        stamp::push(buf, ts);
    }
    store.put(raw_key, buf)
}

/// A stream aggregation: the store holds key → aggregate.
struct StreamAggregate<K, V, VA, F> {
    name: String,
    store: Rc<dyn KeyValueStore>,
    step: F,
    down: Downstream<K, Change<VA>>,
    /// Updates waiting to go downstream (see `cache`).
    cache: RecordCache<K, VA>,
    key_buf: Vec<u8>,
    value_buf: Vec<u8>,
    _input: std::marker::PhantomData<fn(V)>,
}

/// Sends on what a record cache let out.
pub(crate) fn forward_all<K: Clone + 'static, VA: Clone + 'static>(
    down: &Downstream<K, Change<VA>>,
    out: Vec<super::cache::Out<K, VA>>,
    cx: &mut Cx<'_>,
) -> Result<bool, Error> {
    let sent = !out.is_empty();
    for (key, value, ts) in out {
        down.forward(Rec { key, value, ts }, cx)?;
    }
    Ok(sent)
}

impl<K, V, VA, F> Punctuate for StreamAggregate<K, V, VA, F>
where
    K: Data,
    V: Data,
    VA: Data,
    F: FnMut(&K, V, Option<VA>) -> VA,
{
    fn punctuate(&mut self, _time: i64, _cx: &mut Cx<'_>) -> Result<(), Error> {
        Ok(())
    }
    fn close(&mut self, _cx: &mut Cx<'_>) -> Result<(), Error> {
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
}

impl<K, V, VA, F> Node<K, V> for StreamAggregate<K, V, VA, F>
where
    K: Data,
    V: Data,
    VA: Data,
    F: FnMut(&K, V, Option<VA>) -> VA,
{
    fn process(&mut self, rec: Rec<K, V>, cx: &mut Cx<'_>) -> Result<(), Error> {
        let Some(raw_key) = encode(&self.name, "key", &rec.key, &mut self.key_buf)? else {
            return Ok(()); // null keys are dropped, as Kafka Streams does
        };
        let (old, old_ts) = read_aggregate::<VA>(&self.name, &*self.store, raw_key)?.unzip();
        // Kafka Streams' time of an aggregate: the largest of its records'.
        let ts = stamp::later(rec.ts, old_ts);
        let new = (self.step)(&rec.key, rec.value, old.clone());
        write_aggregate(
            &self.name,
            &*self.store,
            raw_key,
            Some(&new),
            Some(ts),
            &mut self.value_buf,
        )?;
        if self.cache.enabled() {
            let size = raw_key.len() + self.value_buf.len();
            let out = self.cache.put(raw_key, rec.key, old, Some(new), ts, size);
            return forward_all(&self.down, out, cx).map(|_| ());
        }
        self.down.forward(
            Rec {
                key: rec.key,
                value: Change { new: Some(new), old },
                ts,
            },
            cx,
        )
    }
}
