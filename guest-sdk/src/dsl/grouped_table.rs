//! A table grouped by a new key ([`KGroupedTable`]) and its aggregations: every update of
//! the table travels over a repartition topic as the retraction of the old value and the
//! addition of the new one (one record when both land on the same key), and the
//! aggregation subtracts the one and adds the other.

use std::cell::RefCell;
use std::rc::Rc;

use super::builder::{add_internal_topic, decode, encode, Materialized};
use super::cache::RecordCache;
use super::data::Data;
use super::graph::{Build, GraphNode};
use super::grouped::{forward_all, read_aggregate, write_aggregate};
use super::runtime::{built, BuildCx, Change, Cx, Downstream, Node, NodeRef, Punctuate, RawSource, Rec};
use super::stamp;
use super::state::KeyValueStore;
use super::table::{store_getter, KTable};
use crate::Error;

/// A table grouped by a new key, ready for an aggregation (Kafka Streams'
/// `KGroupedTable`): always repartitioned; each update travels as the retraction of the
/// old value and the addition of the new one.
pub struct KGroupedTable<K, V> {
    graph: super::builder::Shared,
    _types: std::marker::PhantomData<fn() -> (K, V)>,
    table_node: usize,
    name: Option<String>,
    partitions: Option<u32>,
    /// Makes the operator that re-keys the table's changes, given the topic it writes.
    regroup: Rc<dyn Fn(&str) -> Build>,
    /// The operator that reads the repartition topic back, once an aggregation made it:
    /// every aggregation of this grouping reads the same topic.
    repartitioned: Rc<RefCell<Option<usize>>>,
}

impl<K0: Data, V0: Data> KTable<K0, V0> {
    /// Groups the table by the key and value `selector` makes of each entry, for an
    /// aggregation that subtracts an entry's old value and adds its new one.
    pub fn group_by<K: Data, V: Data>(
        &self,
        selector: impl FnMut(&K0, &V0) -> (K, V) + 'static,
    ) -> KGroupedTable<K, V> {
        let selector = Rc::new(RefCell::new(selector));
        let regroup: Rc<dyn Fn(&str) -> Build> = {
            let selector = selector.clone();
            Rc::new(move |topic: &str| {
                let (selector, topic) = (selector.clone(), topic.to_string());
                Build::Node(Box::new(
                    move |_cx: &mut BuildCx<'_>, _children: &[Rc<dyn std::any::Any>]| {
                        let node: NodeRef<K0, Change<V0>> = Rc::new(RefCell::new(Regroup::<K, V, _> {
                            name: format!("group_by (to {topic:?})"),
                            topic,
                            selector,
                            buffers: Default::default(),
                            out: Vec::new(),
                            _types: std::marker::PhantomData,
                        }));
                        Ok(built(node))
                    },
                ))
            })
        };
        KGroupedTable {
            graph: self.graph.clone(),
            _types: std::marker::PhantomData,
            table_node: self.node,
            name: None,
            partitions: None,
            regroup,
            repartitioned: Rc::default(),
        }
    }
}

/// Re-keys a table's changes and writes them to the repartition topic.
struct Regroup<K, V, F> {
    name: String,
    topic: String,
    selector: Rc<RefCell<F>>,
    buffers: [Vec<u8>; 4],
    /// The change written to the topic.
    out: Vec<u8>,
    _types: std::marker::PhantomData<fn() -> (K, V)>,
}

/// A table change over a repartition topic: a flags byte (1: old value, 2: new value), the
/// old value's length (4 bytes, big-endian) and bytes, the new value's bytes.
fn write_change(old: Option<&[u8]>, new: Option<&[u8]>, out: &mut Vec<u8>) {
    out.clear();
    out.push(u8::from(old.is_some()) | (u8::from(new.is_some()) << 1));
    if let Some(old) = old {
        out.extend_from_slice(&(old.len() as u32).to_be_bytes());
        out.extend_from_slice(old);
    }
    if let Some(new) = new {
        out.extend_from_slice(new);
    }
}

type RawChange<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

fn read_change(bytes: &[u8]) -> Result<RawChange<'_>, String> {
    let (&flags, rest) = bytes.split_first().ok_or("an empty table change")?;
    if flags > 3 {
        return Err(format!("a table change with flags {flags:#04x}"));
    }
    let (old, rest) = if flags & 1 == 1 {
        let len: [u8; 4] = rest
            .get(..4)
            .and_then(|l| l.try_into().ok())
            .ok_or("a table change cut short")?;
        let len = u32::from_be_bytes(len) as usize;
        let old = rest.get(4..4 + len).ok_or("a table change cut short")?;
        (Some(old), &rest[4 + len..])
    } else {
        (None, rest)
    };
    let new = if flags & 2 == 2 {
        Some(rest)
    } else if rest.is_empty() {
        None
    } else {
        return Err("bytes after a table change without a new value".into());
    };
    Ok((old, new))
}

impl<K0, V0, K, V, F> Node<K0, Change<V0>> for Regroup<K, V, F>
where
    K0: Data,
    V0: Data,
    K: Data,
    V: Data,
    F: FnMut(&K0, &V0) -> (K, V),
{
    fn process(&mut self, rec: Rec<K0, Change<V0>>, cx: &mut Cx<'_>) -> Result<(), Error> {
        let mut selector = self
            .selector
            .try_borrow_mut()
            .map_err(|_| Error::msg("internal error: a group_by was re-entered"))?;
        let old = rec.value.old.as_ref().map(|v| (*selector)(&rec.key, v));
        let new = rec.value.new.as_ref().map(|v| (*selector)(&rec.key, v));
        drop(selector);
        let [old_key, old_value, new_key, new_value] = &mut self.buffers;
        let old = match &old {
            Some((k, v)) => match encode(&self.name, "key", k, old_key)? {
                Some(k) => Some((k, encode(&self.name, "value", v, old_value)?)),
                None => None,
            },
            None => None,
        };
        let new = match &new {
            Some((k, v)) => match encode(&self.name, "key", k, new_key)? {
                Some(k) => Some((k, encode(&self.name, "value", v, new_value)?)),
                None => None,
            },
            None => None,
        };
        let out = &mut self.out;
        match (old, new) {
            (Some((ok, ov)), Some((nk, nv))) if ok == nk => {
                write_change(ov, nv, out);
                cx.out.emit(&self.topic, Some(ok), Some(out), rec.ts)?;
            }
            (old, new) => {
                if let Some((ok, ov)) = old {
                    write_change(ov, None, out);
                    cx.out.emit(&self.topic, Some(ok), Some(out), rec.ts)?;
                }
                if let Some((nk, nv)) = new {
                    write_change(None, nv, out);
                    cx.out.emit(&self.topic, Some(nk), Some(out), rec.ts)?;
                }
            }
        }
        Ok(())
    }
}

/// Reads re-keyed table changes from a repartition topic.
struct ChangeSource<K, V> {
    name: String,
    down: Downstream<K, Change<V>>,
}

impl<K: Data, V: Data> RawSource for ChangeSource<K, V> {
    fn process_raw(&mut self, key: Option<&[u8]>, value: Option<&[u8]>, ts: i64, cx: &mut Cx<'_>) -> Result<(), Error> {
        let key = decode::<K>(&self.name, "key", key)?;
        let (old, new) =
            read_change(value.unwrap_or_default()).map_err(|e| Error::msg(format!("operator {}: {e}", self.name)))?;
        let old = old.map(|o| decode::<V>(&self.name, "old value", Some(o))).transpose()?;
        let new = new.map(|n| decode::<V>(&self.name, "new value", Some(n))).transpose()?;
        self.down.forward(
            Rec {
                key,
                value: Change { new, old },
                ts,
            },
            cx,
        )
    }
}

impl<K: Data, V: Data> KGroupedTable<K, V> {
    /// Names the repartition topic (by default, after the aggregation's store).
    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// The partition count of the repartition topic.
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = Some(partitions);
        self
    }

    /// The number of entries per new key: an entry that moves to another key counts there,
    /// and no longer here.
    pub fn count(&self, materialized: impl Into<Materialized>) -> KTable<K, u64> {
        self.aggregate_with(
            "count",
            materialized.into(),
            |_key: &K, change: Change<V>, count: Option<u64>| {
                let mut count = count.unwrap_or(0);
                if change.old.is_some() {
                    count = count.saturating_sub(1);
                }
                if change.new.is_some() {
                    count += 1;
                }
                Some(count)
            },
        )
    }

    /// Each key's values combined by `adder`; a value that leaves the key is taken out with
    /// `subtractor` (Kafka Streams' `KGroupedTable.reduce`).
    pub fn reduce(
        &self,
        mut adder: impl FnMut(V, V) -> V + 'static,
        mut subtractor: impl FnMut(V, V) -> V + 'static,
        materialized: impl Into<Materialized>,
    ) -> KTable<K, V> {
        self.aggregate_with(
            "reduce",
            materialized.into(),
            move |_key: &K, change: Change<V>, agg: Option<V>| {
                let mut agg = agg;
                if let Some(old) = change.old {
                    agg = agg.map(|a| subtractor(a, old));
                }
                if let Some(new) = change.new {
                    agg = Some(match agg {
                        Some(a) => adder(a, new),
                        None => new,
                    });
                }
                agg
            },
        )
    }

    /// Each key's values folded in by `adder` and taken out by `subtractor`, from
    /// `initializer()` (Kafka Streams' `KGroupedTable.aggregate`).
    pub fn aggregate<VA: Data>(
        &self,
        mut initializer: impl FnMut() -> VA + 'static,
        mut adder: impl FnMut(&K, V, VA) -> VA + 'static,
        mut subtractor: impl FnMut(&K, V, VA) -> VA + 'static,
        materialized: impl Into<Materialized>,
    ) -> KTable<K, VA> {
        self.aggregate_with(
            "aggregate",
            materialized.into(),
            move |key: &K, change: Change<V>, agg: Option<VA>| {
                let mut agg = agg.unwrap_or_else(&mut initializer);
                if let Some(old) = change.old {
                    agg = subtractor(key, old, agg);
                }
                if let Some(new) = change.new {
                    agg = adder(key, new, agg);
                }
                Some(agg)
            },
        )
    }

    /// The operator that reads this grouping's repartition topic (named after the grouping,
    /// or else after the store of its first aggregation), made by the first aggregation.
    fn input(&self, store: &str) -> usize {
        if let Some(source) = *self.repartitioned.borrow() {
            return source;
        }
        let topic = self.name.clone().unwrap_or_else(|| store.to_string());
        add_internal_topic(&self.graph, &topic, self.partitions);
        let mut g = self.graph.borrow_mut();
        let mut regroup = GraphNode::new(g.next_name("group_by"), vec![self.table_node], (self.regroup)(&topic));
        regroup.sink = Some(topic.clone());
        regroup.internal_io = true;
        g.add(regroup);
        let source_name = g.next_name("repartition_source");
        let build = {
            let name = source_name.clone();
            Build::Source(Box::new(
                move |_cx: &mut BuildCx<'_>, children: &[Rc<dyn std::any::Any>]| {
                    Ok(Box::new(ChangeSource::<K, V> {
                        down: Downstream::from_built(&name, children)?,
                        name,
                    }) as Box<dyn RawSource>)
                },
            ))
        };
        let mut source = GraphNode::new(source_name, Vec::new(), build);
        source.source = Some(topic);
        source.internal_io = true;
        let source = g.add(source);
        *self.repartitioned.borrow_mut() = Some(source);
        source
    }

    fn aggregate_with<VA: Data>(
        &self,
        kind: &str,
        materialized: Materialized,
        step: impl FnMut(&K, Change<V>, Option<VA>) -> Option<VA> + 'static,
    ) -> KTable<K, VA> {
        let store = materialized.or(self.graph.borrow().next_name(kind));
        let source = self.input(&store);
        let mut g = self.graph.borrow_mut();
        let name = g.next_name(kind);
        let build = {
            let (name, store) = (name.clone(), store.clone());
            Build::Node(Box::new(
                move |cx: &mut BuildCx<'_>, children: &[Rc<dyn std::any::Any>]| {
                    let node = Rc::new(RefCell::new(TableAggregate {
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
                    let node: NodeRef<K, Change<V>> = node;
                    Ok(built(node))
                },
            ))
        };
        let mut node = GraphNode::new(name, vec![source], build);
        node.stores.push(store.clone());
        let id = g.add(node);
        KTable::new(
            self.graph.clone(),
            id,
            store_getter::<K, VA>(store.clone()),
            vec![store],
        )
    }
}

/// A table aggregation: retracts the old value, adds the new one.
struct TableAggregate<K, V, VA, F> {
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

impl<K, V, VA, F> Punctuate for TableAggregate<K, V, VA, F>
where
    K: Data,
    V: Data,
    VA: Data,
    F: FnMut(&K, Change<V>, Option<VA>) -> Option<VA>,
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

impl<K, V, VA, F> Node<K, Change<V>> for TableAggregate<K, V, VA, F>
where
    K: Data,
    V: Data,
    VA: Data,
    F: FnMut(&K, Change<V>, Option<VA>) -> Option<VA>,
{
    fn process(&mut self, rec: Rec<K, Change<V>>, cx: &mut Cx<'_>) -> Result<(), Error> {
        let Some(raw_key) = encode(&self.name, "key", &rec.key, &mut self.key_buf)? else {
            return Ok(());
        };
        let (old, old_ts) = read_aggregate::<VA>(&self.name, &*self.store, raw_key)?.unzip();
        // Kafka Streams' time of a table aggregate: the largest of its records'.
        let ts = stamp::later(rec.ts, old_ts);
        let new = (self.step)(&rec.key, rec.value, old.clone());
        write_aggregate(
            &self.name,
            &*self.store,
            raw_key,
            new.as_ref(),
            Some(ts),
            &mut self.value_buf,
        )?;
        if self.cache.enabled() {
            let size = raw_key.len() + self.value_buf.len();
            let out = self.cache.put(raw_key, rec.key, old, new, ts, size);
            return forward_all(&self.down, out, cx).map(|_| ());
        }
        if new.is_none() && old.is_none() {
            return Ok(());
        }
        self.down.forward(
            Rec {
                key: rec.key,
                value: Change { new, old },
                ts,
            },
            cx,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_changes_round_trip_and_bad_ones_are_named() {
        let mut out = Vec::new();
        for (old, new) in [
            (Some(&b"old"[..]), Some(&b"new"[..])),
            (None, Some(&b""[..])),
            (Some(&b""[..]), None),
            (None, None),
        ] {
            write_change(old, new, &mut out);
            assert_eq!(read_change(&out).unwrap(), (old, new));
        }
        assert_eq!(read_change(b"").unwrap_err(), "an empty table change");
        assert_eq!(
            read_change(b"\x01\x00\x00\x00\x09ab").unwrap_err(),
            "a table change cut short"
        );
        assert_eq!(read_change(b"\x07").unwrap_err(), "a table change with flags 0x07");
        assert_eq!(
            read_change(b"\x00x").unwrap_err(),
            "bytes after a table change without a new value"
        );
    }
}
