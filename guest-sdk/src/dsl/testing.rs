//! [`TestDriver`]: runs a DSL topology natively, without a host or Kafka (Kafka Streams'
//! `TopologyTestDriver`). Every sub-topology runs as one task (a single partition) over
//! [`MemoryStores`]; records written to internal repartition topics go straight to the
//! sub-topology that reads them.

use std::collections::VecDeque;

use super::data::{encoded, Data};
use super::graph::Topology;
use super::runtime::{DslTask, Emitter, SourceRecord};
use super::state::{Entry, KeyValueStore, MemoryStores};
use super::StreamsBuilder;
use crate::{Description, Error};

/// A record a topology wrote to a sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub sink: String,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub timestamp: i64,
}

/// A record a topology wrote, decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestRecord<K, V> {
    pub key: K,
    pub value: V,
    pub timestamp: i64,
}

#[derive(Default)]
struct Collect(Vec<Output>);

impl Emitter for Collect {
    fn emit(&mut self, sink: &str, key: Option<&[u8]>, value: Option<&[u8]>, timestamp: i64) -> Result<(), Error> {
        self.0.push(Output {
            sink: sink.to_string(),
            key: key.map(<[u8]>::to_vec),
            value: value.map(<[u8]>::to_vec),
            timestamp,
        });
        Ok(())
    }
}

struct Task {
    task: DslTask,
    /// The largest timestamp it has read (none: it has read nothing, and is not punctuated).
    stream_time: Option<i64>,
}

/// Runs a DSL topology natively: pipe records into its sources, punctuate, read what it
/// wrote to its sinks and what its stores hold.
///
/// ```
/// use sluice_guest::dsl::{testing::TestDriver, StreamsBuilder};
///
/// fn topology(b: &mut StreamsBuilder) {
///     b.stream::<String, String>("in").map_values(|v| v.to_uppercase()).to("out");
/// }
///
/// let mut driver = TestDriver::new("upper", topology).unwrap();
/// driver.pipe("in", "k".to_string(), "hello".to_string(), 5).unwrap();
/// let out = driver.read::<String, String>("out").unwrap();
/// assert_eq!(out[0].value, "HELLO");
/// assert_eq!(out[0].timestamp, 5);
/// ```
pub struct TestDriver {
    description: Description,
    tasks: Vec<Task>,
    stores: MemoryStores,
    outputs: Vec<Output>,
}

impl TestDriver {
    /// Builds `topology` (as `describe` does) and one task per sub-topology (as each
    /// `init` does), over empty stores.
    pub fn new(name: &str, topology: impl Fn(&mut StreamsBuilder)) -> Result<Self, Error> {
        Self::with_stores(name, topology, MemoryStores::new())
    }

    /// As [`TestDriver::new`], over the stores of an earlier driver
    /// ([`TestDriver::close`]): a restart, or a move to another worker.
    pub fn with_stores(
        name: &str,
        topology: impl Fn(&mut StreamsBuilder),
        stores: MemoryStores,
    ) -> Result<Self, Error> {
        let description = Topology::build(name, &topology)?.description();
        let mut backend = stores.clone();
        let mut tasks = Vec::new();
        for sub in &description.subtopologies {
            let task = Topology::build(name, &topology)?.instantiate(&sub.name, &mut backend)?;
            tasks.push(Task {
                task,
                stream_time: None,
            });
        }
        Ok(TestDriver {
            description,
            tasks,
            stores,
            outputs: Vec::new(),
        })
    }

    /// What the topology's `describe` answers.
    pub fn description(&self) -> &Description {
        &self.description
    }

    /// Pipes a record into the source `source` (or the topic of a global table), encoded
    /// with its codecs, and runs it through every sub-topology it reaches.
    pub fn pipe<K: Data, V: Data>(&mut self, source: &str, key: K, value: V, timestamp: i64) -> Result<(), Error> {
        let key = encoded(&key)?;
        let value = encoded(&value)?;
        self.pipe_raw(source, key.as_deref(), value.as_deref(), timestamp)
    }

    /// Pipes a record of raw bytes (none: a null key, a tombstone).
    pub fn pipe_raw(
        &mut self,
        source: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp: i64,
    ) -> Result<(), Error> {
        if let Some(global) = self.description.global_stores.iter().find(|g| g.topic == source) {
            // The host keeps a global table: the latest value per key, a tombstone deletes.
            let store = self.stores.store(&global.name);
            return match (key, value) {
                (None, _) => Ok(()),
                (Some(key), Some(value)) => store.put(key, value),
                (Some(key), None) => store.delete(key),
            };
        }
        if self.description.internal_topics.iter().any(|t| t.name == source) {
            return Err(Error::msg(format!(
                "{source:?} is an internal topic: pipe into the topology's sources {:?}",
                self.external_sources()
            )));
        }
        let mut queue = VecDeque::new();
        queue.push_back(Output {
            sink: source.to_string(),
            key: key.map(<[u8]>::to_vec),
            value: value.map(<[u8]>::to_vec),
            timestamp,
        });
        self.run(queue)
    }

    fn external_sources(&self) -> Vec<&str> {
        let internal = &self.description.internal_topics;
        self.description
            .sources
            .iter()
            .filter(|s| !internal.iter().any(|t| &t.name == *s))
            .map(String::as_str)
            .collect()
    }

    /// Runs records (and what they make on internal topics) to the end: `queue` holds
    /// records written to topics the topology reads.
    fn run(&mut self, mut queue: VecDeque<Output>) -> Result<(), Error> {
        while let Some(Output {
            sink: source,
            key,
            value,
            timestamp,
        }) = queue.pop_front()
        {
            let Some(task) = self.tasks.iter_mut().find(|t| t.task.reads(&source)) else {
                return Err(Error::msg(format!(
                    "the topology has no source {source:?}; its sources are {:?}",
                    self.external_sources()
                )));
            };
            let at = self.stores.next_offset(&source);
            let mut out = Collect::default();
            let record = SourceRecord {
                source: &source,
                partition: 0,
                offset: at,
                key: key.as_deref(),
                value: value.as_deref(),
                timestamp,
            };
            // One record is one batch here (the host's are up to `--batch-size`).
            task.task.batch_started()?;
            task.task.process(&record, &mut out)?;
            task.task.batch_done()?;
            // And a commit after it, as Kafka Streams' TopologyTestDriver makes: what waits
            // in record caches goes on.
            task.task.flush(&mut out)?;
            task.stream_time = Some(task.stream_time.map_or(timestamp, |t| t.max(timestamp)));
            self.route(out, &mut queue);
        }
        Ok(())
    }

    fn route(&mut self, out: Collect, queue: &mut VecDeque<Output>) {
        for o in out.0 {
            if self.description.internal_topics.iter().any(|t| t.name == o.sink) {
                queue.push_back(o);
            } else {
                self.outputs.push(o);
            }
        }
    }

    /// Punctuates every task that has read a record, at its stream time (the largest
    /// timestamp it has read), as the host does about once a second: windows close and
    /// join buffers expire.
    pub fn punctuate(&mut self) -> Result<(), Error> {
        let mut queue = VecDeque::new();
        for i in 0..self.tasks.len() {
            let Some(time) = self.tasks[i].stream_time else {
                continue;
            };
            let mut out = Collect::default();
            self.tasks[i].task.punctuate(time, &mut out)?;
            self.route(out, &mut queue);
            // What a punctuation wrote to an internal topic is processed before the tasks
            // after it are punctuated.
            self.run(std::mem::take(&mut queue))?;
        }
        Ok(())
    }

    /// Takes what the topology wrote to the sink `sink` since the last call.
    pub fn outputs(&mut self, sink: &str) -> Vec<Output> {
        let (taken, kept) = std::mem::take(&mut self.outputs)
            .into_iter()
            .partition(|o| o.sink == sink);
        self.outputs = kept;
        taken
    }

    /// Takes what the topology wrote to the sink `sink` since the last call, decoded.
    pub fn read<K: Data, V: Data>(&mut self, sink: &str) -> Result<Vec<TestRecord<K, V>>, Error> {
        self.outputs(sink)
            .into_iter()
            .map(|o| {
                let key = K::read_from(o.key.as_deref())
                    .map_err(|e| Error::msg(format!("sink {sink:?}: decoding a key: {e}")))?;
                let value = V::read_from(o.value.as_deref())
                    .map_err(|e| Error::msg(format!("sink {sink:?}: decoding a value: {e}")))?;
                Ok(TestRecord {
                    key,
                    value,
                    timestamp: o.timestamp,
                })
            })
            .collect()
    }

    /// Every entry of the store `store`, decoded with its key and value codecs (as an
    /// interactive query reads them), in key order.
    pub fn store<K: Data, V: Data>(&self, store: &str) -> Result<Vec<(K, V)>, Error> {
        let entries = self.store_stamped::<K, V>(store)?;
        Ok(entries.into_iter().map(|(k, v, _)| (k, v)).collect())
    }

    /// Every entry of the store `store` with its time, for a table's or an aggregation's
    /// store (the time Kafka Streams gives the value: its record's, or the latest of those
    /// aggregated; `None` where the store keeps no time).
    pub fn store_stamped<K: Data, V: Data>(&self, store: &str) -> Result<Vec<(K, V, Option<i64>)>, Error> {
        self.stores
            .entries(store)
            .into_iter()
            .map(|(k, v)| {
                let key =
                    K::read_from(Some(&k)).map_err(|e| Error::msg(format!("store {store:?}: decoding a key: {e}")))?;
                let (v, ts) = super::stamp::split(&v);
                let value =
                    V::read_from(Some(v)).map_err(|e| Error::msg(format!("store {store:?}: decoding a value: {e}")))?;
                Ok((key, value, (ts != super::stamp::UNKNOWN).then_some(ts)))
            })
            .collect()
    }

    /// Every entry of the store `store`, as bytes (a value with a time ends with it: 8 bytes,
    /// big-endian, then an 8-byte tag).
    pub fn store_raw(&self, store: &str) -> Vec<Entry> {
        self.stores.entries(store)
    }

    /// The stores, as they are.
    pub fn stores(&self) -> &MemoryStores {
        &self.stores
    }

    /// Ends every task cleanly (as the host does when a task stops or moves) and returns
    /// the stores, for [`TestDriver::with_stores`]. Outputs not read are dropped.
    pub fn close(mut self) -> Result<MemoryStores, Error> {
        let mut queue = VecDeque::new();
        for i in 0..self.tasks.len() {
            let mut out = Collect::default();
            self.tasks[i].task.close(&mut out)?;
            self.route(out, &mut queue);
        }
        self.run(queue)?;
        Ok(self.stores)
    }
}
