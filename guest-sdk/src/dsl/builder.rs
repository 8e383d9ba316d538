//! Where a topology starts: [`StreamsBuilder`] makes streams and tables from sources, and
//! the operators every stream needs at its ends (decoding sources, encoding sinks,
//! repartitioning).

use std::cell::RefCell;
use std::marker::PhantomData;
use std::rc::Rc;

use super::data::{encode_into, Data};
use super::graph::{check_store_like, Build, Graph, GraphNode};
use super::runtime::{built, Change, Cx, Downstream, Node, RawSource, Rec};
use super::stamp;
use super::state::KeyValueStore;
use super::table::{store_getter, GlobalKTable, KTable};
use super::KStream;
use crate::Error;

pub(crate) type Shared = Rc<RefCell<Graph>>;

/// The name of a store an operator keeps: given (`"counts"`, [`materialized`]) so that
/// interactive queries can read it, or generated from the operator (`count_5`).
///
/// Every `&str` is one: `.count("counts")`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Materialized {
    pub(crate) name: Option<String>,
}

impl Materialized {
    /// A store named `name` (letters, digits and `_`, at most 64: it names a changelog topic).
    pub fn named(name: impl Into<String>) -> Self {
        Materialized {
            name: Some(name.into()),
        }
    }

    /// A store whose name the DSL makes up (`<operator>_<index>`, e.g. `count_5`).
    pub fn unnamed() -> Self {
        Materialized::default()
    }

    pub(crate) fn or(&self, generated: String) -> String {
        self.name.clone().unwrap_or(generated)
    }
}

/// A store named `name`: `.count(materialized("counts"))`.
pub fn materialized(name: impl Into<String>) -> Materialized {
    Materialized::named(name)
}

impl From<&str> for Materialized {
    fn from(name: &str) -> Self {
        Materialized::named(name)
    }
}

impl From<String> for Materialized {
    fn from(name: String) -> Self {
        Materialized::named(name)
    }
}

/// Builds a topology: a topology function gets one and makes streams and tables from its
/// sources. See the [module docs](super).
pub struct StreamsBuilder {
    pub(crate) graph: Shared,
}

impl StreamsBuilder {
    pub(crate) fn new() -> Self {
        StreamsBuilder {
            graph: Rc::new(RefCell::new(Graph::default())),
        }
    }

    /// The bytes of each aggregation's record cache (Kafka Streams'
    /// `statestore.cache.max.bytes`): the updates of a key between two commits go downstream
    /// once, the last one, as Kafka Streams sends them with its cache on. Default
    /// [`DEFAULT_CACHE_MAX_BYTES`](super::DEFAULT_CACHE_MAX_BYTES) per aggregation; `0` sends
    /// every update on at once (Kafka Streams with `statestore.cache.max.bytes = 0`).
    pub fn cache_max_bytes(&mut self, bytes: usize) -> &mut Self {
        self.graph.borrow_mut().cache_max_bytes = Some(bytes);
        self
    }

    pub(crate) fn into_graph(self) -> Result<Graph, Error> {
        Ok(std::mem::take(&mut *self.graph.borrow_mut()))
    }

    /// A stream of the records of the source `source` (a logical name the manifest binds to
    /// a topic), with keys of type `K` and values of type `V`.
    pub fn stream<K: Data, V: Data>(&mut self, source: &str) -> KStream<K, V> {
        let mut g = self.graph.borrow_mut();
        let name = g.next_name("source");
        let mut node = GraphNode::new(
            name.clone(),
            Vec::new(),
            stream_source::<K, V>(name, source.to_string()),
        )
        .with_formats::<K, V>();
        node.source = Some(source.to_string());
        let id = g.add(node);
        KStream::new(self.graph.clone(), id, false)
    }

    /// A table of the source `source`: the latest value per key, a record without a value
    /// deleting its key; records without a key are dropped. It is kept in a store
    /// (`materialized`), which the table's joins read and interactive queries can read.
    pub fn table<K: Data, V: Data>(&mut self, source: &str, materialized: impl Into<Materialized>) -> KTable<K, V> {
        let materialized = materialized.into();
        let mut g = self.graph.borrow_mut();
        let name = g.next_name("table");
        let store = materialized.or(name.clone());
        let build = {
            let (name, store) = (name.clone(), store.clone());
            Build::Source(Box::new(move |cx, children| {
                Ok(Box::new(TableSource::<K, V> {
                    down: Downstream::from_built(&name, children)?,
                    store: cx.store(&store)?,
                    name,
                    key_buf: Vec::new(),
                    value_buf: Vec::new(),
                }) as Box<dyn RawSource>)
            }))
        };
        let mut node = GraphNode::new(name, Vec::new(), build).with_formats::<K, V>();
        node.source = Some(source.to_string());
        node.stores.push(store.clone());
        let id = g.add(node);
        KTable::new(self.graph.clone(), id, store_getter::<K, V>(store.clone()), vec![store])
    }

    /// A global table: every partition of the topic `topic` (bound by the manifest under
    /// `[sources]`), kept by the host in the store `materialized` and read by every task.
    /// Join a stream with it with [`KStream::join_global`]; no repartitioning is needed.
    pub fn global_table<K: Data, V: Data>(
        &mut self,
        topic: &str,
        materialized: impl Into<Materialized>,
    ) -> GlobalKTable<K, V> {
        let materialized = materialized.into();
        let mut g = self.graph.borrow_mut();
        let store = materialized.or(format!("global_{}", g.global_stores.len()));
        if g.global_stores.iter().any(|(_, t)| t == topic) {
            g.error(format!("the topic {topic:?} fills two global tables: read it once"));
        }
        g.global_stores.push((store.clone(), topic.to_string()));
        g.global_formats.push((topic.to_string(), (K::schema(), V::schema())));
        GlobalKTable {
            store,
            _types: PhantomData,
        }
    }
}

/// Decodes a record, naming the operator and which part failed.
pub(crate) fn decode<T: Data>(operator: &str, what: &str, bytes: Option<&[u8]>) -> Result<T, Error> {
    T::read_from(bytes).map_err(|e| Error::msg(format!("operator {operator}: decoding the {what}: {e}")))
}

/// Decodes bytes read from `store`, naming the operator and the store (only on error: this
/// runs for every record).
pub(crate) fn decode_stored<T: Data>(operator: &str, what: &str, store: &str, bytes: &[u8]) -> Result<T, Error> {
    T::read_from(Some(bytes)).map_err(|e| {
        Error::msg(format!(
            "operator {operator}: decoding the {what} in store {store:?}: {e}"
        ))
    })
}

/// Encodes into `buf`; `None` for a null.
pub(crate) fn encode<'b, T: Data>(
    operator: &str,
    what: &str,
    value: &T,
    buf: &'b mut Vec<u8>,
) -> Result<Option<&'b [u8]>, Error> {
    let present =
        encode_into(value, buf).map_err(|e| Error::msg(format!("operator {operator}: encoding the {what}: {e}")))?;
    Ok(present.then_some(&buf[..]))
}

fn stream_source<K: Data, V: Data>(name: String, source: String) -> Build {
    Build::Source(Box::new(move |_cx, children| {
        Ok(Box::new(StreamSource::<K, V> {
            down: Downstream::from_built(&name, children)?,
            name: format!("{name} (source {source:?})"),
        }) as Box<dyn RawSource>)
    }))
}

struct StreamSource<K, V> {
    name: String,
    down: Downstream<K, V>,
}

impl<K: Data, V: Data> RawSource for StreamSource<K, V> {
    fn process_raw(&mut self, key: Option<&[u8]>, value: Option<&[u8]>, ts: i64, cx: &mut Cx<'_>) -> Result<(), Error> {
        let key = decode::<K>(&self.name, "key", key)?;
        let value = decode::<V>(&self.name, "value", value)?;
        self.down.forward(Rec { key, value, ts }, cx)
    }
}

/// A table's source: the store holds the latest value per key.
struct TableSource<K, V> {
    name: String,
    store: Rc<dyn KeyValueStore>,
    down: Downstream<K, Change<V>>,
    key_buf: Vec<u8>,
    value_buf: Vec<u8>,
}

impl<K: Data, V: Data> RawSource for TableSource<K, V> {
    fn process_raw(&mut self, key: Option<&[u8]>, value: Option<&[u8]>, ts: i64, cx: &mut Cx<'_>) -> Result<(), Error> {
        let key = decode::<K>(&self.name, "key", key)?;
        if key.is_null() {
            return Ok(());
        }
        let new = value.map(|v| decode::<V>(&self.name, "value", Some(v))).transpose()?;
        upsert(
            &self.name,
            &*self.store,
            key,
            new,
            ts,
            &mut self.key_buf,
            &mut self.value_buf,
            &self.down,
            cx,
        )
    }
}

/// Writes a table's new value for `key` (none: deletes it) and forwards the change.
#[allow(clippy::too_many_arguments)]
pub(crate) fn upsert<K: Data, V: Data>(
    name: &str,
    store: &dyn KeyValueStore,
    key: K,
    new: Option<V>,
    ts: i64,
    key_buf: &mut Vec<u8>,
    value_buf: &mut Vec<u8>,
    down: &Downstream<K, Change<V>>,
    cx: &mut Cx<'_>,
) -> Result<(), Error> {
    let Some(raw_key) = encode(name, "key", &key, key_buf)? else {
        return Ok(());
    };
    let old = store
        .get(raw_key)?
        .map(|bytes| decode_stored::<V>(name, "value", store.name(), stamp::split(&bytes).0))
        .transpose()?;
    if old.is_none() && new.is_none() {
        return Ok(());
    }
    let present = match &new {
        Some(value) => encode(name, "value", value, value_buf)?.is_some(),
        None => false,
    };
    if present {
        // Kept with the record's time, which a table-table join's result takes if later.
        stamp::push(value_buf, ts);
        store.put(raw_key, value_buf)?;
    } else {
        store.delete(raw_key)?;
    }
    down.forward(
        Rec {
            key,
            value: Change { new, old },
            ts,
        },
        cx,
    )
}

/// Writes each record to a sink: an external one (`to`) or an internal topic.
pub(crate) struct SinkNode {
    pub name: String,
    pub sink: String,
    /// Records with a null key are dropped (a repartition before an aggregation or a join).
    pub drop_null_keys: bool,
    pub key_buf: Vec<u8>,
    pub value_buf: Vec<u8>,
}

impl<K: Data, V: Data> Node<K, V> for SinkNode {
    fn process(&mut self, rec: Rec<K, V>, cx: &mut Cx<'_>) -> Result<(), Error> {
        if self.drop_null_keys && rec.key.is_null() {
            return Ok(());
        }
        let key = encode(&self.name, "key", &rec.key, &mut self.key_buf)?;
        let value = encode(&self.name, "value", &rec.value, &mut self.value_buf)?;
        cx.out.emit(&self.sink, key, value, rec.ts)
    }
}

/// Adds a sink operator under `parent` writing to `sink`.
pub(crate) fn add_sink<K: Data, V: Data>(
    graph: &Shared,
    parent: usize,
    kind: &str,
    sink: &str,
    internal: bool,
) -> usize {
    let mut g = graph.borrow_mut();
    let name = g.next_name(kind);
    let build = {
        let (name, sink) = (name.clone(), sink.to_string());
        Build::Node(Box::new(move |_cx, _children| {
            let node: Rc<RefCell<dyn Node<K, V>>> = Rc::new(RefCell::new(SinkNode {
                name,
                sink,
                drop_null_keys: internal,
                key_buf: Vec::new(),
                value_buf: Vec::new(),
            }));
            Ok(built(node))
        }))
    };
    let mut node = GraphNode::new(name, vec![parent], build).with_formats::<K, V>();
    node.sink = Some(sink.to_string());
    node.internal_io = internal;
    g.add(node)
}

/// Declares the internal topic `topic` (checked when the topology is built).
pub(crate) fn add_internal_topic(graph: &Shared, topic: &str, partitions: Option<u32>) {
    let mut g = graph.borrow_mut();
    if let Err(e) = check_store_like("repartition topic name", topic) {
        g.error(e);
    }
    if g.internal_topics.iter().any(|(t, _)| t == topic) {
        g.error(format!(
            "two repartitions are named {topic:?}: name the groupings or stores differently"
        ));
    }
    g.internal_topics.push((topic.to_string(), partitions));
}

/// `stream` as a join reads it: as it is, or, after a key change, repartitioned through
/// `topic` — once per stream, however many joins read it.
pub(crate) fn join_input<K: Data, V: Data>(stream: &KStream<K, V>, topic: &str) -> KStream<K, V> {
    if !stream.key_changed {
        return stream.clone();
    }
    let made = stream.graph.borrow().join_repartitions.get(&stream.node).copied();
    if let Some(node) = made {
        return KStream::new(stream.graph.clone(), node, false);
    }
    let input = repartition(stream, topic, None);
    stream
        .graph
        .borrow_mut()
        .join_repartitions
        .insert(stream.node, input.node);
    input
}

/// Writes `stream` to the internal topic `topic` and reads it back in a new sub-topology:
/// each record lands on the partition (and so the task) of its key. Null keys are dropped.
pub(crate) fn repartition<K: Data, V: Data>(
    stream: &KStream<K, V>,
    topic: &str,
    partitions: Option<u32>,
) -> KStream<K, V> {
    add_internal_topic(&stream.graph, topic, partitions);
    add_sink::<K, V>(&stream.graph, stream.node, "repartition", topic, true);
    let mut g = stream.graph.borrow_mut();
    let name = g.next_name("repartition_source");
    let mut node =
        GraphNode::new(name.clone(), Vec::new(), stream_source::<K, V>(name, topic.to_string())).with_formats::<K, V>();
    node.source = Some(topic.to_string());
    node.internal_io = true;
    let id = g.add(node);
    KStream::new(stream.graph.clone(), id, false)
}
