#![doc = include_str!("../README.md")]

pub mod wire;

/// What a topology declares: its name, sources, sinks and state stores, by logical name,
/// and (contract 0.2.0) its internal topics and sub-topologies. The manifest binds the
/// external sources and sinks to topics at deployment; anything not declared here is
/// refused at run time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Description {
    pub name: String,
    pub sources: Vec<String>,
    pub sinks: Vec<String>,
    pub stores: Vec<String>,
    /// Topics the topology writes and reads itself (each also a source and a sink).
    pub internal_topics: Vec<InternalTopic>,
    /// Its stages; empty: one sub-topology of every source, sink and store.
    pub subtopologies: Vec<Subtopology>,
    /// Global tables: stores the host fills from every partition of a topic, readable by
    /// every task of the topology and written by none.
    pub global_stores: Vec<GlobalStore>,
}

/// A global table: a store the host keeps as a copy of a whole topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalStore {
    /// The store's name (distinct from the description's other stores).
    pub name: String,
    /// The logical name of the topic that fills it, bound by the manifest under `[sources]`.
    pub topic: String,
}

/// A topic internal to a topology (a repartition topic), created by the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternalTopic {
    /// Its logical name, also declared as a source and a sink.
    pub name: String,
    /// Its partitions; none: the largest partition count of the writing sub-topology's sources.
    pub partitions: Option<u32>,
}

/// One stage of a topology: what its tasks read, write and keep, by logical name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subtopology {
    pub name: String,
    pub sources: Vec<String>,
    pub sinks: Vec<String>,
    pub stores: Vec<String>,
}

impl Subtopology {
    pub fn new(name: impl Into<String>) -> Self {
        Subtopology {
            name: name.into(),
            ..Default::default()
        }
    }

    /// A source its tasks read (declared in the description too).
    pub fn source(mut self, name: impl Into<String>) -> Self {
        self.sources.push(name.into());
        self
    }

    /// A sink its tasks may write (declared in the description too).
    pub fn sink(mut self, name: impl Into<String>) -> Self {
        self.sinks.push(name.into());
        self
    }

    /// A store its tasks may open (declared in the description too).
    pub fn store(mut self, name: impl Into<String>) -> Self {
        self.stores.push(name.into());
        self
    }
}

impl Description {
    pub fn new(name: impl Into<String>) -> Self {
        Description {
            name: name.into(),
            ..Default::default()
        }
    }

    /// Declares an input.
    pub fn source(mut self, name: impl Into<String>) -> Self {
        self.sources.push(name.into());
        self
    }

    /// Declares an output.
    pub fn sink(mut self, name: impl Into<String>) -> Self {
        self.sinks.push(name.into());
        self
    }

    /// Declares a key-value state store.
    pub fn store(mut self, name: impl Into<String>) -> Self {
        self.stores.push(name.into());
        self
    }

    /// Declares an internal topic, which is also a source and a sink of the topology.
    pub fn internal_topic(mut self, name: impl Into<String>, partitions: Option<u32>) -> Self {
        let name = name.into();
        self.sources.push(name.clone());
        self.sinks.push(name.clone());
        self.internal_topics.push(InternalTopic { name, partitions });
        self
    }

    /// Declares a global table: the store `name`, filled by the host from every partition
    /// of the topic the manifest binds to `topic` (under `[sources]`), and readable by every
    /// task (`Store::open(name)`); writes to it are refused.
    pub fn global_store(mut self, name: impl Into<String>, topic: impl Into<String>) -> Self {
        self.global_stores.push(GlobalStore {
            name: name.into(),
            topic: topic.into(),
        });
        self
    }

    /// Declares a sub-topology (its sources, sinks and stores must be declared too).
    pub fn subtopology(mut self, subtopology: Subtopology) -> Self {
        self.subtopologies.push(subtopology);
        self
    }
}

/// The task an instance of the topology runs: one sub-topology on one partition of its
/// sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskInfo {
    /// The deployed topology's name.
    pub topology: String,
    /// The sub-topology the task runs (the topology's name for a topology of one).
    pub subtopology: String,
    /// `<topology>/<partition>`, or `<topology>/<subtopology>/<partition>` in a topology of
    /// several sub-topologies.
    pub task_id: String,
    pub partition: i32,
    /// The topic each source is bound to, in declaration order.
    pub source_topics: Vec<String>,
    /// The topic each sink is bound to, in declaration order.
    pub sink_topics: Vec<String>,
}
