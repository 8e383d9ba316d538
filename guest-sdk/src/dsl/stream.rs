//! [`KStream`]: a stream of records and its record-at-a-time operators (map, filter,
//! flat-map, select-key, split, merge, peek, to), and where a stream becomes a table.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;

use super::builder::{add_sink, repartition, upsert, Materialized, Shared};
use super::data::Data;
use super::graph::{Build, GraphNode};
use super::grouped::KGroupedStream;
use super::runtime::{built, Change, Cx, Downstream, Node, NodeRef, Rec};
use super::table::{store_getter, KTable};
use crate::Error;

/// A stream of records with keys of type `K` and values of type `V` (Kafka Streams'
/// `KStream`). Operators take `&self`: a stream may feed several operators, and each gets
/// every record.
pub struct KStream<K, V> {
    pub(crate) graph: Shared,
    pub(crate) node: usize,
    /// Whether an operator upstream may have changed the key: a stateful operator below
    /// then repartitions first.
    pub(crate) key_changed: bool,
    _types: PhantomData<fn() -> (K, V)>,
}

impl<K, V> Clone for KStream<K, V> {
    fn clone(&self) -> Self {
        KStream {
            graph: self.graph.clone(),
            node: self.node,
            key_changed: self.key_changed,
            _types: PhantomData,
        }
    }
}

/// An operator made of a closure over the record and the children.
struct FnNode<K2, V2, F> {
    f: F,
    down: Downstream<K2, V2>,
}

impl<K, V, K2, V2, F> Node<K, V> for FnNode<K2, V2, F>
where
    F: FnMut(Rec<K, V>, &Downstream<K2, V2>, &mut Cx<'_>) -> Result<(), Error>,
{
    #[inline]
    fn process(&mut self, rec: Rec<K, V>, cx: &mut Cx<'_>) -> Result<(), Error> {
        (self.f)(rec, &self.down, cx)
    }
}

/// Adds an operator made of `f` under `parents`; its input is `(K, V)`, its output `(K2, V2)`.
pub(crate) fn add_fn_node<K, V, K2, V2, F>(graph: &Shared, parents: Vec<usize>, kind: &str, f: F) -> usize
where
    K: 'static,
    V: 'static,
    K2: Clone + 'static,
    V2: Clone + 'static,
    F: FnMut(Rec<K, V>, &Downstream<K2, V2>, &mut Cx<'_>) -> Result<(), Error> + 'static,
{
    let mut g = graph.borrow_mut();
    let name = g.next_name(kind);
    let build = {
        let name = name.clone();
        Build::Node(Box::new(move |_cx, children| {
            let down = Downstream::<K2, V2>::from_built(&name, children)?;
            let node: NodeRef<K, V> = Rc::new(RefCell::new(FnNode { f, down }));
            Ok(built(node))
        }))
    };
    g.add(GraphNode::new(name, parents, build))
}

impl<K: Data, V: Data> KStream<K, V> {
    pub(crate) fn new(graph: Shared, node: usize, key_changed: bool) -> Self {
        KStream {
            graph,
            node,
            key_changed,
            _types: PhantomData,
        }
    }

    /// A new operator below this one.
    pub(crate) fn then<K2: Data, V2: Data, F>(&self, kind: &str, key_changed: bool, f: F) -> KStream<K2, V2>
    where
        F: FnMut(Rec<K, V>, &Downstream<K2, V2>, &mut Cx<'_>) -> Result<(), Error> + 'static,
    {
        let id = add_fn_node(&self.graph, vec![self.node], kind, f);
        KStream::new(self.graph.clone(), id, key_changed)
    }

    /// Each record becomes the key and value `f` makes of it (the key may change: a
    /// stateful operator below repartitions).
    pub fn map<K2: Data, V2: Data>(&self, mut f: impl FnMut(K, V) -> (K2, V2) + 'static) -> KStream<K2, V2> {
        self.then("map", true, move |rec, down, cx| {
            let (key, value) = f(rec.key, rec.value);
            down.forward(Rec { key, value, ts: rec.ts }, cx)
        })
    }

    /// Each record's value becomes what `f` makes of it; the key stays.
    pub fn map_values<V2: Data>(&self, mut f: impl FnMut(V) -> V2 + 'static) -> KStream<K, V2> {
        self.then("map_values", self.key_changed, move |rec, down, cx| {
            let value = f(rec.value);
            down.forward(
                Rec {
                    key: rec.key,
                    value,
                    ts: rec.ts,
                },
                cx,
            )
        })
    }

    /// As [`KStream::map_values`], with the key at hand.
    pub fn map_values_with_key<V2: Data>(&self, mut f: impl FnMut(&K, V) -> V2 + 'static) -> KStream<K, V2> {
        self.then("map_values", self.key_changed, move |rec, down, cx| {
            let value = f(&rec.key, rec.value);
            down.forward(
                Rec {
                    key: rec.key,
                    value,
                    ts: rec.ts,
                },
                cx,
            )
        })
    }

    /// Each record becomes any number of records (the key may change).
    pub fn flat_map<K2: Data, V2: Data, I>(&self, mut f: impl FnMut(K, V) -> I + 'static) -> KStream<K2, V2>
    where
        I: IntoIterator<Item = (K2, V2)>,
    {
        self.then("flat_map", true, move |rec, down, cx| {
            for (key, value) in f(rec.key, rec.value) {
                down.forward(Rec { key, value, ts: rec.ts }, cx)?;
            }
            Ok(())
        })
    }

    /// Each record becomes any number of records with its key.
    pub fn flat_map_values<V2: Data, I>(&self, mut f: impl FnMut(V) -> I + 'static) -> KStream<K, V2>
    where
        I: IntoIterator<Item = V2>,
    {
        self.then("flat_map_values", self.key_changed, move |rec, down, cx| {
            let mut values = f(rec.value).into_iter().peekable();
            let mut key = Some(rec.key);
            while let Some(value) = values.next() {
                // The key is copied for every record but the last, which takes it.
                let key = match values.peek() {
                    Some(_) => key.clone(),
                    None => key.take(),
                };
                let Some(key) = key else { break };
                down.forward(Rec { key, value, ts: rec.ts }, cx)?;
            }
            Ok(())
        })
    }

    /// The records for which `f` is true.
    pub fn filter(&self, mut f: impl FnMut(&K, &V) -> bool + 'static) -> KStream<K, V> {
        self.then("filter", self.key_changed, move |rec, down, cx| {
            if f(&rec.key, &rec.value) {
                down.forward(rec, cx)
            } else {
                Ok(())
            }
        })
    }

    /// The records for which `f` is false.
    pub fn filter_not(&self, mut f: impl FnMut(&K, &V) -> bool + 'static) -> KStream<K, V> {
        self.then("filter_not", self.key_changed, move |rec, down, cx| {
            if f(&rec.key, &rec.value) {
                Ok(())
            } else {
                down.forward(rec, cx)
            }
        })
    }

    /// Each record gets the key `f` makes of it.
    pub fn select_key<K2: Data>(&self, mut f: impl FnMut(&K, &V) -> K2 + 'static) -> KStream<K2, V> {
        self.then("select_key", true, move |rec, down, cx| {
            let key = f(&rec.key, &rec.value);
            down.forward(
                Rec {
                    key,
                    value: rec.value,
                    ts: rec.ts,
                },
                cx,
            )
        })
    }

    /// Calls `f` on each record and passes it on unchanged (logging, metrics).
    pub fn peek(&self, mut f: impl FnMut(&K, &V) + 'static) -> KStream<K, V> {
        self.then("peek", self.key_changed, move |rec, down, cx| {
            f(&rec.key, &rec.value);
            down.forward(rec, cx)
        })
    }

    /// The records of this stream and of `other`, as they come. Both run in one
    /// sub-topology, so their sources must be co-partitioned.
    pub fn merge(&self, other: &KStream<K, V>) -> KStream<K, V> {
        let id = add_fn_node(
            &self.graph,
            vec![self.node, other.node],
            "merge",
            |rec: Rec<K, V>, down: &Downstream<K, V>, cx: &mut Cx<'_>| down.forward(rec, cx),
        );
        KStream::new(self.graph.clone(), id, self.key_changed || other.key_changed)
    }

    /// Splits the stream in branches: each record goes to the first branch whose predicate
    /// it meets (Kafka Streams' `split().branch(…)`).
    pub fn split(&self) -> Split<K, V> {
        Split {
            stream: self.clone(),
            predicates: Vec::new(),
        }
    }

    /// Writes every record to the sink `sink` (a logical name the manifest binds to a topic).
    pub fn to(&self, sink: &str) {
        add_sink::<K, V>(&self.graph, self.node, "sink", sink, false);
    }

    /// A table of this stream: the latest value per key, kept in the store `materialized`.
    /// Records with a null key are dropped; after a key change the stream is repartitioned
    /// first (through `<store>`).
    pub fn to_table(&self, materialized: impl Into<Materialized>) -> KTable<K, V> {
        let materialized = materialized.into();
        let name = self.graph.borrow().next_name("to_table");
        let store = materialized.or(name.clone());
        let input = if self.key_changed {
            repartition(self, &store, None)
        } else {
            self.clone()
        };
        let mut g = self.graph.borrow_mut();
        let name = g.next_name("to_table");
        let build = {
            let (name, store) = (name.clone(), store.clone());
            Build::Node(Box::new(move |cx, children| {
                let node: NodeRef<K, V> = Rc::new(RefCell::new(ToTable {
                    down: Downstream::from_built(&name, children)?,
                    store: cx.store(&store)?,
                    name,
                    key_buf: Vec::new(),
                    value_buf: Vec::new(),
                }));
                Ok(built(node))
            }))
        };
        let mut node = GraphNode::new(name, vec![input.node], build);
        node.stores.push(store.clone());
        let id = g.add(node);
        KTable::new(self.graph.clone(), id, store_getter::<K, V>(store.clone()), vec![store])
    }

    /// Groups the records by their key, for an aggregation. After a key change the stream
    /// is repartitioned first.
    pub fn group_by_key(&self) -> KGroupedStream<K, V> {
        KGroupedStream::new(self.clone(), self.key_changed)
    }

    /// Groups the records by the key `f` makes of each (always repartitioned).
    pub fn group_by<K2: Data>(&self, f: impl FnMut(&K, &V) -> K2 + 'static) -> KGroupedStream<K2, V> {
        let keyed = self.then("group_by", true, {
            let mut f = f;
            move |rec: Rec<K, V>, down: &Downstream<K2, V>, cx: &mut Cx<'_>| {
                let key = f(&rec.key, &rec.value);
                down.forward(
                    Rec {
                        key,
                        value: rec.value,
                        ts: rec.ts,
                    },
                    cx,
                )
            }
        });
        KGroupedStream::new(keyed, true)
    }
}

/// `to_table`: a stream's records as a table's updates.
struct ToTable<K, V> {
    name: String,
    store: Rc<dyn super::state::KeyValueStore>,
    down: Downstream<K, Change<V>>,
    key_buf: Vec<u8>,
    value_buf: Vec<u8>,
}

impl<K: Data, V: Data> Node<K, V> for ToTable<K, V> {
    fn process(&mut self, rec: Rec<K, V>, cx: &mut Cx<'_>) -> Result<(), Error> {
        if rec.key.is_null() {
            return Ok(());
        }
        upsert(
            &self.name,
            &*self.store,
            rec.key,
            Some(rec.value),
            rec.ts,
            &mut self.key_buf,
            &mut self.value_buf,
            &self.down,
            cx,
        )
    }
}

type Predicate<K, V> = Box<dyn FnMut(&K, &V) -> bool>;

/// The branches of [`KStream::split`], made one predicate at a time.
pub struct Split<K, V> {
    stream: KStream<K, V>,
    predicates: Vec<Predicate<K, V>>,
}

impl<K: Data, V: Data> Split<K, V> {
    /// A branch of the records that meet `predicate` (and no earlier branch's).
    pub fn branch(mut self, predicate: impl FnMut(&K, &V) -> bool + 'static) -> Self {
        self.predicates.push(Box::new(predicate));
        self
    }

    /// The branches, in order, and last the records no branch took.
    pub fn default_branch(self) -> Vec<KStream<K, V>> {
        self.finish(true)
    }

    /// The branches, in order; records no branch took are dropped.
    pub fn no_default_branch(self) -> Vec<KStream<K, V>> {
        self.finish(false)
    }

    fn finish(self, default: bool) -> Vec<KStream<K, V>> {
        let Split { stream, predicates } = self;
        let branches = predicates.len() + usize::from(default);
        let split = {
            let mut g = stream.graph.borrow_mut();
            let name = g.next_name("split");
            let build = {
                let name = name.clone();
                Build::Node(Box::new(move |_cx, children| {
                    // The split's children are its branches, made right after it, in order.
                    if children.len() != branches {
                        return Err(Error::msg(format!(
                            "internal error: split {name} has {} branches built, not {branches}",
                            children.len()
                        )));
                    }
                    let mut downs = Vec::with_capacity(branches);
                    for child in children.chunks(1) {
                        downs.push(Downstream::<K, V>::from_built(&name, child)?);
                    }
                    let node: NodeRef<K, V> = Rc::new(RefCell::new(SplitNode {
                        predicates,
                        branches: downs,
                    }));
                    Ok(built(node))
                }))
            };
            g.add(GraphNode::new(name, vec![stream.node], build))
        };
        (0..branches)
            .map(|_| {
                let id = add_fn_node(
                    &stream.graph,
                    vec![split],
                    "branch",
                    |rec: Rec<K, V>, down: &Downstream<K, V>, cx: &mut Cx<'_>| down.forward(rec, cx),
                );
                KStream::new(stream.graph.clone(), id, stream.key_changed)
            })
            .collect()
    }
}

struct SplitNode<K, V> {
    predicates: Vec<Predicate<K, V>>,
    /// One per predicate, then the default branch if there is one.
    branches: Vec<Downstream<K, V>>,
}

impl<K: Data, V: Data> Node<K, V> for SplitNode<K, V> {
    fn process(&mut self, rec: Rec<K, V>, cx: &mut Cx<'_>) -> Result<(), Error> {
        for (i, predicate) in self.predicates.iter_mut().enumerate() {
            if predicate(&rec.key, &rec.value) {
                return self.branches[i].forward(rec, cx);
            }
        }
        match self.branches.get(self.predicates.len()) {
            Some(default) => default.forward(rec, cx),
            None => Ok(()),
        }
    }
}
