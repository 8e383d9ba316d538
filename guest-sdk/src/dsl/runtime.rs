//! What runs inside a task: records pushed through a chain of operators ([`Node`]s, each
//! holding its children), the [`Emitter`] outputs go to, and the task ([`DslTask`]) that
//! feeds a record from a source into its chain and drives punctuation.

use std::any::Any;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use super::state::{KeyValueStore, StateBackend};
use crate::Error;

/// One record inside a chain: a typed key and value and the record's timestamp.
#[derive(Debug, Clone)]
pub(crate) struct Rec<K, V> {
    pub key: K,
    pub value: V,
    pub ts: i64,
}

/// What a table forwards: a key's new value and the one it replaces (none: absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change<V> {
    pub new: Option<V>,
    pub old: Option<V>,
}

/// Where emitted records go: the host's [`crate::Context`] in a Wasm instance, a
/// collecting buffer in the [`TestDriver`](super::testing::TestDriver).
pub trait Emitter {
    /// Emits to the sink `sink` (an external sink or an internal topic) a record with these
    /// key and value bytes (none: null) and timestamp.
    fn emit(&mut self, sink: &str, key: Option<&[u8]>, value: Option<&[u8]>, timestamp: i64) -> Result<(), Error>;
}

impl Emitter for crate::Context {
    fn emit(&mut self, sink: &str, key: Option<&[u8]>, value: Option<&[u8]>, timestamp: i64) -> Result<(), Error> {
        self.emit_raw(sink, key, value, Some(timestamp), &[])
    }
}

/// The input record a chain is running for: where it came from, for error messages and
/// for ids that stay the same when the record is processed again after a failure.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Position {
    /// The index of its source in the task.
    pub source: u32,
    pub offset: i64,
    /// How many ids the chain has taken for this record (a flat-map makes several records).
    pub taken: u32,
}

/// What an operator has at hand while it processes a record or a punctuation.
pub(crate) struct Cx<'a> {
    pub out: &'a mut dyn Emitter,
    pub position: Position,
}

impl Cx<'_> {
    /// An id unique to this moment of the input: (source, offset, n-th id of this record).
    /// The same input processed again gets the same ids.
    pub fn next_id(&mut self) -> (u32, i64, u32) {
        let id = (self.position.source, self.position.offset, self.position.taken);
        self.position.taken += 1;
        id
    }
}

/// An operator: takes a record, forwards what it makes of it to its children.
pub(crate) trait Node<K, V> {
    fn process(&mut self, rec: Rec<K, V>, cx: &mut Cx<'_>) -> Result<(), Error>;
}

/// Operators are shared: an operator with two parents (a merge) is reached from both.
pub(crate) type NodeRef<K, V> = Rc<RefCell<dyn Node<K, V>>>;

/// An operator that acts as time passes (closing windows, expiring join buffers) and keeps
/// its own stream time.
pub(crate) trait Punctuate {
    /// Stream time has reached `time` (the host's; the operator keeps the larger of it and
    /// its own).
    fn punctuate(&mut self, time: i64, cx: &mut Cx<'_>) -> Result<(), Error>;
    /// The task ends cleanly: save what must survive it.
    fn close(&mut self, cx: &mut Cx<'_>) -> Result<(), Error>;
    /// A batch begins: what the operator keeps in memory across records (its stream time)
    /// is read again from its store, where the last batch left it. The host commits between
    /// batches and drops what a failed batch wrote, so memory and store agree at a commit,
    /// and a batch processed again after a failure decides as it did the first time.
    fn batch_started(&mut self) -> Result<(), Error> {
        Ok(())
    }
    /// A batch ends: write back what [`Punctuate::batch_started`] reads.
    fn batch_done(&mut self) -> Result<(), Error> {
        Ok(())
    }
    /// A call of the host begins (a batch, a punctuation, the close): what the last call
    /// changed in memory is undone if that call did not end (see `cache`).
    fn call_started(&mut self) {}
    /// The call ended well.
    fn call_done(&mut self) {}
    /// Sends on what waits in a record cache; whether it sent anything.
    fn flush(&mut self, _cx: &mut Cx<'_>) -> Result<bool, Error> {
        Ok(false)
    }
}

/// The children of an operator, all of one input type.
pub(crate) struct Downstream<K, V> {
    children: Vec<NodeRef<K, V>>,
}

impl<K: Clone + 'static, V: Clone + 'static> Downstream<K, V> {
    /// The children built for an operator, checked to take `(K, V)`.
    pub fn from_built(operator: &str, built: &[Rc<dyn Any>]) -> Result<Self, Error> {
        let mut children = Vec::with_capacity(built.len());
        for child in built {
            let child = child.downcast_ref::<NodeRef<K, V>>().ok_or_else(|| {
                Error::msg(format!(
                    "internal error: a child of operator {operator} does not take its output type"
                ))
            })?;
            children.push(child.clone());
        }
        Ok(Downstream { children })
    }

    /// Forwards to every child: a copy to all but the last, which gets the record itself.
    #[inline]
    pub fn forward(&self, rec: Rec<K, V>, cx: &mut Cx<'_>) -> Result<(), Error> {
        match self.children.split_last() {
            None => Ok(()),
            Some((last, others)) => {
                for child in others {
                    call(child, rec.clone(), cx)?;
                }
                call(last, rec, cx)
            }
        }
    }
}

#[inline]
fn call<K, V>(child: &NodeRef<K, V>, rec: Rec<K, V>, cx: &mut Cx<'_>) -> Result<(), Error> {
    // The graph has no cycles, so an operator is never re-entered while it runs.
    let mut node = child
        .try_borrow_mut()
        .map_err(|_| Error::msg("internal error: an operator was re-entered"))?;
    node.process(rec, cx)
}

/// Wraps a built operator for its parents.
pub(crate) fn built<K: 'static, V: 'static>(node: NodeRef<K, V>) -> Rc<dyn Any> {
    Rc::new(node)
}

/// A source of a task: decodes a record's bytes and pushes it into its chain.
pub(crate) trait RawSource {
    fn process_raw(&mut self, key: Option<&[u8]>, value: Option<&[u8]>, ts: i64, cx: &mut Cx<'_>) -> Result<(), Error>;
}

/// What building a task's operators needs: its stores (each opened once and shared) and a
/// list of the operators to punctuate.
pub(crate) struct BuildCx<'a> {
    backend: &'a mut dyn StateBackend,
    opened: BTreeMap<String, Rc<dyn KeyValueStore>>,
    pub punctuators: Vec<Rc<RefCell<dyn Punctuate>>>,
    /// Bytes of each aggregation's record cache (0: none).
    pub cache_max_bytes: usize,
}

impl<'a> BuildCx<'a> {
    pub fn new(backend: &'a mut dyn StateBackend) -> Self {
        BuildCx {
            backend,
            opened: BTreeMap::new(),
            punctuators: Vec::new(),
            cache_max_bytes: 0,
        }
    }

    /// The store `name`, opened once per task.
    pub fn store(&mut self, name: &str) -> Result<Rc<dyn KeyValueStore>, Error> {
        if let Some(store) = self.opened.get(name) {
            return Ok(store.clone());
        }
        let store = self.backend.open(name)?;
        self.opened.insert(name.to_string(), store.clone());
        Ok(store)
    }

    pub fn punctuate(&mut self, node: Rc<RefCell<dyn Punctuate>>) {
        self.punctuators.push(node);
    }
}

/// A record as a task reads it from a source.
#[derive(Debug, Clone, Copy)]
pub struct SourceRecord<'a> {
    /// The logical name of the source (or internal topic) it comes from.
    pub source: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub timestamp: i64,
}

/// The operators of one sub-topology in one task: what `init` builds.
pub struct DslTask {
    pub(crate) subtopology: String,
    pub(crate) sources: Vec<(String, Box<dyn RawSource>)>,
    pub(crate) punctuators: Vec<Rc<RefCell<dyn Punctuate>>>,
}

impl DslTask {
    /// The sub-topology this task runs.
    pub fn subtopology(&self) -> &str {
        &self.subtopology
    }

    /// Whether this task reads `source`.
    pub fn reads(&self, source: &str) -> bool {
        self.sources.iter().any(|(name, _)| name == source)
    }

    /// Processes one record.
    pub fn process(&mut self, record: &SourceRecord<'_>, out: &mut dyn Emitter) -> Result<(), Error> {
        let SourceRecord {
            source,
            partition,
            offset,
            key,
            value,
            timestamp,
        } = *record;
        let Some(index) = self.sources.iter().position(|(name, _)| name == source) else {
            return Err(Error::msg(format!(
                "sub-topology {:?} got a record from {source:?}, which it does not read",
                self.subtopology
            )));
        };
        let mut cx = Cx {
            out,
            position: Position {
                source: index as u32,
                offset,
                taken: 0,
            },
        };
        self.sources[index]
            .1
            .process_raw(key, value, timestamp, &mut cx)
            .map_err(|e| Error::msg(format!("the record at {source}/{partition}@{offset}: {e}")))
    }

    /// Runs `f` on every operator that keeps time or a cache.
    fn each(&self, mut f: impl FnMut(&mut dyn Punctuate) -> Result<(), Error>) -> Result<(), Error> {
        for node in &self.punctuators {
            let mut node = node
                .try_borrow_mut()
                .map_err(|_| Error::msg("internal error: an operator was re-entered"))?;
            f(&mut *node)?;
        }
        Ok(())
    }

    /// Sends on everything waiting in record caches: operators nearer the sources first
    /// (they were built last), again while any sent something into a cache below.
    fn drain(&self, cx: &mut Cx<'_>) -> Result<(), Error> {
        for _ in 0..=self.punctuators.len() {
            let mut sent = false;
            for node in self.punctuators.iter().rev() {
                let mut node = node
                    .try_borrow_mut()
                    .map_err(|_| Error::msg("internal error: an operator was re-entered"))?;
                sent |= node.flush(cx)?;
            }
            if !sent {
                break;
            }
        }
        Ok(())
    }

    /// One call of the host outside a batch: `work`, then the record caches drained, all
    /// undone in the caches if the call fails (see `cache`).
    fn outside_batch(
        &self,
        out: &mut dyn Emitter,
        work: impl FnOnce(&Self, &mut Cx<'_>) -> Result<(), Error>,
    ) -> Result<(), Error> {
        let mut cx = Cx {
            out,
            position: Position::default(),
        };
        self.each(|n| {
            n.call_started();
            Ok(())
        })?;
        work(self, &mut cx)?;
        self.drain(&mut cx)?;
        self.each(|n| {
            n.call_done();
            Ok(())
        })
    }

    /// Stream time has advanced to `stream_time`: windows close, join buffers expire, and
    /// record caches are flushed (the host punctuates before each commit).
    pub fn punctuate(&mut self, stream_time: i64, out: &mut dyn Emitter) -> Result<(), Error> {
        self.outside_batch(out, |task, cx| task.each(|n| n.punctuate(stream_time, cx)))
    }

    /// Sends on what waits in record caches, and nothing else (the `TestDriver` does after
    /// each record, as Kafka Streams' `TopologyTestDriver` commits after each).
    pub fn flush(&mut self, out: &mut dyn Emitter) -> Result<(), Error> {
        self.outside_batch(out, |_, _| Ok(()))
    }

    /// A batch of records begins (see `Processor::batch_started`): operators read their
    /// stream time from their stores.
    pub fn batch_started(&mut self) -> Result<(), Error> {
        self.each(|n| {
            n.call_started();
            n.batch_started()
        })
    }

    /// A batch of records ends: operators write their stream time to their stores, to be
    /// committed with the batch.
    pub fn batch_done(&mut self) -> Result<(), Error> {
        self.each(|n| {
            n.batch_done()?;
            n.call_done();
            Ok(())
        })
    }

    /// The task ends cleanly: operators save their stream time, and record caches are
    /// flushed.
    pub fn close(&mut self, out: &mut dyn Emitter) -> Result<(), Error> {
        self.outside_batch(out, |task, cx| task.each(|n| n.close(cx)))
    }
}
