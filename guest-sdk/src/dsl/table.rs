//! [`KTable`]: a changelog of the latest value per key, and [`GlobalKTable`]. A table's
//! operators pass on *changes* (the new value and the one it replaces), so that what is
//! below can retract the old value; and a table can be read by key (a value getter: the
//! store of the table it comes from, with the filters and mappers since applied).

use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;

use super::builder::{decode, encode, Shared};
use super::data::Data;
use super::graph::{Build, GraphNode};
use super::runtime::{built, BuildCx, Change, Cx, Downstream, Node, NodeRef, Rec};
use super::stamp;
use super::stream::{add_fn_node, KStream};
use crate::Error;

/// A table's predicate, shared by its operator and its value getter.
type TablePredicate<K, V> = Rc<dyn Fn(&K, &V) -> bool>;
/// A join of two optional values (none: no result).
type OptionJoiner<A, B, VR> = Rc<dyn Fn(Option<&A>, Option<&B>) -> Option<VR>>;

/// Reads a table's current value for a key, with its time (Kafka Streams'
/// `ValueAndTimestamp`; [`stamp::UNKNOWN`] for a value stored without one).
pub(crate) type Getter<K, V> = Rc<dyn Fn(&K) -> Result<Option<(V, i64)>, Error>>;
/// Makes a [`Getter`] at `init` (a table may be read by several operators).
pub(crate) type GetterFactory<K, V> = Rc<dyn Fn(&mut BuildCx<'_>) -> Result<Getter<K, V>, Error>>;

/// Reads the store `store` (keys and values in their codecs).
pub(crate) fn store_getter<K: Data, V: Data>(store: String) -> GetterFactory<K, V> {
    Rc::new(move |cx: &mut BuildCx<'_>| {
        let kv = cx.store(&store)?;
        let buf = RefCell::new(Vec::new());
        let operator = format!("lookup in store {store:?}");
        let getter: Getter<K, V> = Rc::new(move |key: &K| {
            let mut buf = buf
                .try_borrow_mut()
                .map_err(|_| Error::msg("internal error: a table lookup was re-entered"))?;
            let Some(raw) = encode(&operator, "key", key, &mut buf)? else {
                return Ok(None);
            };
            match kv.get(raw)? {
                Some(bytes) => {
                    let (value, ts) = stamp::split(&bytes);
                    decode::<V>(&operator, "value", Some(value)).map(|v| Some((v, ts)))
                }
                None => Ok(None),
            }
        });
        Ok(getter)
    })
}

/// A table: the latest value per key of type `K`, values of type `V` (Kafka Streams'
/// `KTable`). Its keys are never null.
pub struct KTable<K, V> {
    pub(crate) graph: Shared,
    pub(crate) node: usize,
    pub(crate) getter: GetterFactory<K, V>,
    /// The stores the getter reads: an operator that reads the table runs beside them.
    pub(crate) stores: Vec<String>,
    _types: PhantomData<fn() -> (K, V)>,
}

impl<K, V> Clone for KTable<K, V> {
    fn clone(&self) -> Self {
        KTable {
            graph: self.graph.clone(),
            node: self.node,
            getter: self.getter.clone(),
            stores: self.stores.clone(),
            _types: PhantomData,
        }
    }
}

impl<K: Data, V: Data> KTable<K, V> {
    pub(crate) fn new(graph: Shared, node: usize, getter: GetterFactory<K, V>, stores: Vec<String>) -> Self {
        KTable {
            graph,
            node,
            getter,
            stores,
            _types: PhantomData,
        }
    }

    /// A new operator on this table's changes.
    fn then<V2: Data>(
        &self,
        kind: &str,
        getter: GetterFactory<K, V2>,
        f: impl FnMut(Rec<K, Change<V>>, &Downstream<K, Change<V2>>, &mut Cx<'_>) -> Result<(), Error> + 'static,
    ) -> KTable<K, V2> {
        let id = add_fn_node(&self.graph, vec![self.node], kind, f);
        KTable::new(self.graph.clone(), id, getter, self.stores.clone())
    }

    /// The entries for which `f` is true (an entry that stops meeting it is deleted).
    pub fn filter(&self, f: impl Fn(&K, &V) -> bool + 'static) -> KTable<K, V> {
        self.filter_with("filter", Rc::new(f), true)
    }

    /// The entries for which `f` is false.
    pub fn filter_not(&self, f: impl Fn(&K, &V) -> bool + 'static) -> KTable<K, V> {
        self.filter_with("filter_not", Rc::new(f), false)
    }

    fn filter_with(&self, kind: &str, f: TablePredicate<K, V>, keep: bool) -> KTable<K, V> {
        let parent = self.getter.clone();
        let getter: GetterFactory<K, V> = {
            let f = f.clone();
            Rc::new(move |cx: &mut BuildCx<'_>| {
                let (get, f) = (parent(cx)?, f.clone());
                let getter: Getter<K, V> = Rc::new(move |key: &K| Ok(get(key)?.filter(|(v, _)| f(key, v) == keep)));
                Ok(getter)
            })
        };
        self.then(kind, getter, move |rec, down, cx| {
            let Rec { key, value, ts } = rec;
            let new = value.new.filter(|v| f(&key, v) == keep);
            let old = value.old.filter(|v| f(&key, v) == keep);
            if new.is_none() && old.is_none() {
                return Ok(());
            }
            down.forward(
                Rec {
                    key,
                    value: Change { new, old },
                    ts,
                },
                cx,
            )
        })
    }

    /// Each value becomes what `f` makes of it.
    pub fn map_values<V2: Data>(&self, f: impl Fn(&V) -> V2 + 'static) -> KTable<K, V2> {
        let f: Rc<dyn Fn(&V) -> V2> = Rc::new(f);
        let parent = self.getter.clone();
        let getter: GetterFactory<K, V2> = {
            let f = f.clone();
            Rc::new(move |cx: &mut BuildCx<'_>| {
                let (get, f) = (parent(cx)?, f.clone());
                let getter: Getter<K, V2> = Rc::new(move |key: &K| Ok(get(key)?.map(|(v, ts)| (f(&v), ts))));
                Ok(getter)
            })
        };
        self.then("map_values", getter, move |rec, down, cx| {
            let change = Change {
                new: rec.value.new.as_ref().map(|v| f(v)),
                old: rec.value.old.as_ref().map(|v| f(v)),
            };
            down.forward(
                Rec {
                    key: rec.key,
                    value: change,
                    ts: rec.ts,
                },
                cx,
            )
        })
    }

    /// The table's updates as a stream: each new value, and `None` where a key was deleted
    /// (a tombstone when written to a sink).
    pub fn to_stream(&self) -> KStream<K, Option<V>> {
        let id = add_fn_node(
            &self.graph,
            vec![self.node],
            "to_stream",
            |rec: Rec<K, Change<V>>, down: &Downstream<K, Option<V>>, cx: &mut Cx<'_>| {
                down.forward(
                    Rec {
                        key: rec.key,
                        value: rec.value.new,
                        ts: rec.ts,
                    },
                    cx,
                )
            },
        );
        KStream::new(self.graph.clone(), id, false)
    }

    /// A table joined with `other` by key: for every key in both, `joiner` of the two values
    /// (Kafka Streams' `KTable.join`). An update of either side updates the result.
    pub fn join<V2: Data, VR: Data>(
        &self,
        other: &KTable<K, V2>,
        joiner: impl Fn(&V, &V2) -> VR + 'static,
    ) -> KTable<K, VR> {
        self.join_tables(other, "join", move |a, b| match (a, b) {
            (Some(a), Some(b)) => Some(joiner(a, b)),
            _ => None,
        })
    }

    /// Every key of this table, with `other`'s value when it has one.
    pub fn left_join<V2: Data, VR: Data>(
        &self,
        other: &KTable<K, V2>,
        joiner: impl Fn(&V, Option<&V2>) -> VR + 'static,
    ) -> KTable<K, VR> {
        self.join_tables(other, "left_join", move |a, b| a.map(|a| joiner(a, b)))
    }

    /// Every key of either table, with the values each has.
    pub fn outer_join<V2: Data, VR: Data>(
        &self,
        other: &KTable<K, V2>,
        joiner: impl Fn(Option<&V>, Option<&V2>) -> VR + 'static,
    ) -> KTable<K, VR> {
        self.join_tables(other, "outer_join", move |a, b| {
            if a.is_none() && b.is_none() {
                None
            } else {
                Some(joiner(a, b))
            }
        })
    }

    /// A table-table join: one operator per side reads the other side's value, and their
    /// changes merge into the result.
    fn join_tables<V2: Data, VR: Data>(
        &self,
        other: &KTable<K, V2>,
        kind: &str,
        joiner: impl Fn(Option<&V>, Option<&V2>) -> Option<VR> + 'static,
    ) -> KTable<K, VR> {
        let joiner: OptionJoiner<V, V2, VR> = Rc::new(joiner);
        let (this_getter, other_getter) = (self.getter.clone(), other.getter.clone());
        let mut g = self.graph.borrow_mut();
        let base = g.next_name(kind);
        // This side's changes, looked up in the other table.
        let this_side = {
            let name = format!("{base}_this");
            let (joiner, other_getter) = (joiner.clone(), other_getter.clone());
            let build = Build::Node(Box::new({
                let name = name.clone();
                move |cx: &mut BuildCx<'_>, children: &[Rc<dyn std::any::Any>]| {
                    let node: NodeRef<K, Change<V>> = Rc::new(RefCell::new(TableJoinSide {
                        lookup: other_getter(cx)?,
                        joiner: Rc::new(move |this: Option<&V>, other: Option<&V2>| joiner(this, other)),
                        down: Downstream::<K, Change<VR>>::from_built(&name, children)?,
                    }));
                    Ok(built(node))
                }
            }));
            let mut node = GraphNode::new(name, vec![self.node], build);
            node.reads = other.stores.clone();
            g.add(node)
        };
        let other_side = {
            let name = format!("{base}_other");
            let (joiner, this_getter) = (joiner.clone(), this_getter.clone());
            let build = Build::Node(Box::new({
                let name = name.clone();
                move |cx: &mut BuildCx<'_>, children: &[Rc<dyn std::any::Any>]| {
                    let node: NodeRef<K, Change<V2>> = Rc::new(RefCell::new(TableJoinSide {
                        lookup: this_getter(cx)?,
                        joiner: Rc::new(move |other: Option<&V2>, this: Option<&V>| joiner(this, other)),
                        down: Downstream::<K, Change<VR>>::from_built(&name, children)?,
                    }));
                    Ok(built(node))
                }
            }));
            let mut node = GraphNode::new(name, vec![other.node], build);
            node.reads = self.stores.clone();
            g.add(node)
        };
        drop(g);
        let merged = add_fn_node(
            &self.graph,
            vec![this_side, other_side],
            &format!("{kind}_merge"),
            |rec: Rec<K, Change<VR>>, down: &Downstream<K, Change<VR>>, cx: &mut Cx<'_>| down.forward(rec, cx),
        );
        let getter: GetterFactory<K, VR> = Rc::new(move |cx: &mut BuildCx<'_>| {
            let (this, other, joiner) = (this_getter(cx)?, other_getter(cx)?, joiner.clone());
            // Kafka Streams' join value getters: the later of the two sides' times.
            let getter: Getter<K, VR> = Rc::new(move |key: &K| {
                let (a, b) = (this(key)?, other(key)?);
                let ts = a
                    .as_ref()
                    .map(|(_, ts)| *ts)
                    .into_iter()
                    .chain(b.as_ref().map(|(_, ts)| *ts))
                    .max();
                let value = joiner(a.as_ref().map(|(v, _)| v), b.as_ref().map(|(v, _)| v));
                Ok(value.zip(ts))
            });
            Ok(getter)
        });
        let mut stores = self.stores.clone();
        stores.extend(other.stores.iter().cloned());
        KTable::new(self.graph.clone(), merged, getter, stores)
    }
}

/// One side of a table-table join: its changes joined with the other side's current value.
struct TableJoinSide<K, A, B, VR> {
    lookup: Getter<K, B>,
    joiner: OptionJoiner<A, B, VR>,
    down: Downstream<K, Change<VR>>,
}

impl<K: Data, A: Data, B: Data, VR: Data> Node<K, Change<A>> for TableJoinSide<K, A, B, VR> {
    fn process(&mut self, rec: Rec<K, Change<A>>, cx: &mut Cx<'_>) -> Result<(), Error> {
        let (other, other_ts) = (self.lookup)(&rec.key)?.unzip();
        let new = (self.joiner)(rec.value.new.as_ref(), other.as_ref());
        let old = (self.joiner)(rec.value.old.as_ref(), other.as_ref());
        if new.is_none() && old.is_none() {
            return Ok(());
        }
        // Kafka Streams' time of a table-table join's result: the later of the update's and
        // the other side's value's.
        let ts = stamp::later(rec.ts, other_ts);
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

/// A global table (Kafka Streams' `GlobalKTable`): a whole topic in a store of every task,
/// kept by the host. Streams join it with [`KStream::join_global`] and
/// [`KStream::left_join_global`].
pub struct GlobalKTable<K, V> {
    pub(crate) store: String,
    pub(crate) _types: PhantomData<fn() -> (K, V)>,
}

impl<K, V> Clone for GlobalKTable<K, V> {
    fn clone(&self) -> Self {
        GlobalKTable {
            store: self.store.clone(),
            _types: PhantomData,
        }
    }
}

impl<K, V> GlobalKTable<K, V> {
    /// The name of the store that holds it.
    pub fn store(&self) -> &str {
        &self.store
    }
}
