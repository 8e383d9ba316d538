//! Stream-table joins (each record looks up the table's current value for its key) and
//! stream-global-table joins (the lookup key comes from a key mapper, the table is whole in
//! every task). Records whose (mapped) key is null are dropped, as Kafka Streams does.

use std::cell::RefCell;
use std::rc::Rc;

use super::builder::{decode_stored, encode, join_input};
use super::data::Data;
use super::graph::{Build, GraphNode};
use super::runtime::{built, BuildCx, Cx, Downstream, Node, NodeRef, Rec};
use super::state::KeyValueStore;
use super::stream::KStream;
use super::table::{Getter, GlobalKTable, KTable};
use crate::Error;

impl<K: Data, V: Data> KStream<K, V> {
    /// Each record joined with the table's value for its key: records whose key the table
    /// does not have are dropped (Kafka Streams' `KStream.join(KTable)`). After a key change
    /// the stream is repartitioned first, so that it meets the table's partition.
    pub fn join<VT: Data, VR: Data>(
        &self,
        table: &KTable<K, VT>,
        mut joiner: impl FnMut(&V, &VT) -> VR + 'static,
    ) -> KStream<K, VR> {
        self.join_table(table, "join", move |v, t| t.map(|t| joiner(v, t)))
    }

    /// Each record joined with the table's value for its key, `None` when it has none.
    pub fn left_join<VT: Data, VR: Data>(
        &self,
        table: &KTable<K, VT>,
        mut joiner: impl FnMut(&V, Option<&VT>) -> VR + 'static,
    ) -> KStream<K, VR> {
        self.join_table(table, "left_join", move |v, t| Some(joiner(v, t)))
    }

    fn join_table<VT: Data, VR: Data>(
        &self,
        table: &KTable<K, VT>,
        kind: &str,
        joiner: impl FnMut(&V, Option<&VT>) -> Option<VR> + 'static,
    ) -> KStream<K, VR> {
        let base = self.graph.borrow().next_name(kind);
        let input = join_input(self, &format!("{base}_left"));
        let mut g = self.graph.borrow_mut();
        let name = g.next_name(kind);
        let getter = table.getter.clone();
        let build = {
            let name = name.clone();
            Build::Node(Box::new(
                move |cx: &mut BuildCx<'_>, children: &[Rc<dyn std::any::Any>]| {
                    let node: NodeRef<K, V> = Rc::new(RefCell::new(StreamTableJoin {
                        lookup: getter(cx)?,
                        joiner,
                        down: Downstream::<K, VR>::from_built(&name, children)?,
                    }));
                    Ok(built(node))
                },
            ))
        };
        let mut node = GraphNode::new(name, vec![input.node], build);
        node.reads = table.stores.clone();
        let id = g.add(node);
        KStream::new(self.graph.clone(), id, false)
    }

    /// Each record joined with the global table's value for the key `key` makes of it;
    /// records it finds nothing for are dropped. No repartitioning: every task has the
    /// whole table.
    pub fn join_global<GK: Data, GV: Data, VR: Data>(
        &self,
        global: &GlobalKTable<GK, GV>,
        key: impl FnMut(&K, &V) -> GK + 'static,
        mut joiner: impl FnMut(&V, &GV) -> VR + 'static,
    ) -> KStream<K, VR> {
        self.join_global_with(global, "join_global", key, move |v, g| g.map(|g| joiner(v, g)))
    }

    /// Each record joined with the global table's value for the key `key` makes of it,
    /// `None` when it has none.
    pub fn left_join_global<GK: Data, GV: Data, VR: Data>(
        &self,
        global: &GlobalKTable<GK, GV>,
        key: impl FnMut(&K, &V) -> GK + 'static,
        mut joiner: impl FnMut(&V, Option<&GV>) -> VR + 'static,
    ) -> KStream<K, VR> {
        self.join_global_with(global, "left_join_global", key, move |v, g| Some(joiner(v, g)))
    }

    fn join_global_with<GK: Data, GV: Data, VR: Data>(
        &self,
        global: &GlobalKTable<GK, GV>,
        kind: &str,
        key: impl FnMut(&K, &V) -> GK + 'static,
        joiner: impl FnMut(&V, Option<&GV>) -> Option<VR> + 'static,
    ) -> KStream<K, VR> {
        let mut g = self.graph.borrow_mut();
        let name = g.next_name(kind);
        let store = global.store.clone();
        let build = {
            let name = name.clone();
            Build::Node(Box::new(
                move |cx: &mut BuildCx<'_>, children: &[Rc<dyn std::any::Any>]| {
                    let node: NodeRef<K, V> = Rc::new(RefCell::new(GlobalJoin {
                        store: cx.store(&store)?,
                        key,
                        joiner,
                        down: Downstream::<K, VR>::from_built(&name, children)?,
                        name,
                        key_buf: Vec::new(),
                        _types: std::marker::PhantomData,
                    }));
                    Ok(built(node))
                },
            ))
        };
        let mut node = GraphNode::new(name, vec![self.node], build);
        node.reads = vec![global.store.clone()];
        let id = g.add(node);
        KStream::new(self.graph.clone(), id, self.key_changed)
    }
}

struct StreamTableJoin<K, VT, VR, F> {
    lookup: Getter<K, VT>,
    joiner: F,
    down: Downstream<K, VR>,
}

impl<K, V, VT, VR, F> Node<K, V> for StreamTableJoin<K, VT, VR, F>
where
    K: Data,
    V: Data,
    VT: Data,
    VR: Data,
    F: FnMut(&V, Option<&VT>) -> Option<VR>,
{
    fn process(&mut self, rec: Rec<K, V>, cx: &mut Cx<'_>) -> Result<(), Error> {
        if rec.key.is_null() {
            return Ok(());
        }
        let found = (self.lookup)(&rec.key)?.map(|(value, _)| value);
        match (self.joiner)(&rec.value, found.as_ref()) {
            Some(value) => self.down.forward(
                Rec {
                    key: rec.key,
                    value,
                    ts: rec.ts,
                },
                cx,
            ),
            None => Ok(()),
        }
    }
}

struct GlobalJoin<K, V, GK, GV, VR, KF, F> {
    name: String,
    store: Rc<dyn KeyValueStore>,
    key: KF,
    joiner: F,
    down: Downstream<K, VR>,
    key_buf: Vec<u8>,
    _types: std::marker::PhantomData<fn(V, GK, GV)>,
}

impl<K, V, GK, GV, VR, KF, F> Node<K, V> for GlobalJoin<K, V, GK, GV, VR, KF, F>
where
    K: Data,
    V: Data,
    GK: Data,
    GV: Data,
    VR: Data,
    KF: FnMut(&K, &V) -> GK,
    F: FnMut(&V, Option<&GV>) -> Option<VR>,
{
    fn process(&mut self, rec: Rec<K, V>, cx: &mut Cx<'_>) -> Result<(), Error> {
        let global_key = (self.key)(&rec.key, &rec.value);
        let Some(raw) = encode(&self.name, "global table key", &global_key, &mut self.key_buf)? else {
            return Ok(()); // a null lookup key is dropped
        };
        let found = match self.store.get(raw)? {
            Some(bytes) => Some(decode_stored::<GV>(
                &self.name,
                "global table's value",
                self.store.name(),
                &bytes,
            )?),
            None => None,
        };
        match (self.joiner)(&rec.value, found.as_ref()) {
            Some(value) => self.down.forward(
                Rec {
                    key: rec.key,
                    value,
                    ts: rec.ts,
                },
                cx,
            ),
            None => Ok(()),
        }
    }
}
