#![doc = include_str!("../README.md")]

pub mod wire;

/// What a topology declares: its name, sources, sinks and state stores, by logical name.
/// The manifest binds sources and sinks to topics at deployment; anything not declared
/// here is refused at run time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Description {
    pub name: String,
    pub sources: Vec<String>,
    pub sinks: Vec<String>,
    pub stores: Vec<String>,
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
}

/// The task an instance of the topology runs: one partition of its sources.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskInfo {
    /// The deployed topology's name.
    pub topology: String,
    /// `<topology>/<partition>`.
    pub task_id: String,
    pub partition: i32,
    /// The topic each source is bound to, in declaration order.
    pub source_topics: Vec<String>,
    /// The topic each sink is bound to, in declaration order.
    pub sink_topics: Vec<String>,
}
