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
    /// Topics whose keys or values are in the Confluent wire format behind a Schema
    /// Registry, with the schema the topology reads or writes them with (the `formats`
    /// export); every other topic is bytes.
    pub formats: Vec<TopicFormat>,
}

/// What a source, sink or internal topic holds (by its logical name): its key's schema and
/// its value's, each none for plain bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicFormat {
    pub topic: String,
    pub key: Option<Schema>,
    pub value: Option<Schema>,
}

/// The schema languages of a Schema Registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SchemaKind {
    Avro,
    Protobuf,
    JsonSchema,
}

impl SchemaKind {
    /// The registry's name for it (`schemaType`): `AVRO`, `PROTOBUF`, `JSON`.
    pub fn registry_name(self) -> &'static str {
        match self {
            SchemaKind::Avro => "AVRO",
            SchemaKind::Protobuf => "PROTOBUF",
            SchemaKind::JsonSchema => "JSON",
        }
    }

    /// Its name for people and flags: `avro`, `protobuf`, `json-schema`.
    pub fn name(self) -> &'static str {
        match self {
            SchemaKind::Avro => "avro",
            SchemaKind::Protobuf => "protobuf",
            SchemaKind::JsonSchema => "json-schema",
        }
    }
}

impl std::fmt::Display for SchemaKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A schema a topology reads or writes a topic's keys or values with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Schema {
    pub kind: SchemaKind,
    /// Avro's JSON, a `.proto` file, or a JSON Schema document.
    pub text: String,
    /// Protobuf: the message the records are (its full name, `package.Message`).
    pub message: Option<String>,
    /// Protobuf: the files `text` imports (import path, text), other than Google's
    /// well-known types.
    pub imports: Vec<(String, String)>,
}

impl Schema {
    /// An Avro schema (its JSON text).
    pub fn avro(text: impl Into<String>) -> Schema {
        Schema {
            kind: SchemaKind::Avro,
            text: text.into(),
            message: None,
            imports: Vec::new(),
        }
    }

    /// A JSON Schema document.
    pub fn json_schema(text: impl Into<String>) -> Schema {
        Schema {
            kind: SchemaKind::JsonSchema,
            text: text.into(),
            message: None,
            imports: Vec::new(),
        }
    }

    /// Protobuf message `message` (`package.Message`) of the `.proto` file `text`.
    pub fn protobuf(text: impl Into<String>, message: impl Into<String>) -> Schema {
        Schema {
            kind: SchemaKind::Protobuf,
            text: text.into(),
            message: Some(message.into()),
            imports: Vec::new(),
        }
    }

    /// A file the `.proto` text imports, by its import path (Protobuf).
    pub fn import(mut self, path: impl Into<String>, text: impl Into<String>) -> Schema {
        self.imports.push((path.into(), text.into()));
        self
    }
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

    /// Reads or writes the keys of `topic` (a declared source, sink or internal topic) in the
    /// Confluent wire format with `schema`.
    pub fn key_format(self, topic: impl Into<String>, schema: Schema) -> Self {
        self.with_format(topic.into(), |f| f.key = Some(schema))
    }

    /// Reads or writes the values of `topic` (a declared source, sink or internal topic) in
    /// the Confluent wire format with `schema`.
    pub fn value_format(self, topic: impl Into<String>, schema: Schema) -> Self {
        self.with_format(topic.into(), |f| f.value = Some(schema))
    }

    fn with_format(mut self, topic: String, set: impl FnOnce(&mut TopicFormat)) -> Self {
        let at = match self.formats.iter().position(|f| f.topic == topic) {
            Some(at) => at,
            None => {
                self.formats.push(TopicFormat {
                    topic,
                    key: None,
                    value: None,
                });
                self.formats.len() - 1
            }
        };
        set(&mut self.formats[at]);
        self
    }

    /// The format of `topic`'s records, if it has one.
    pub fn format_of(&self, topic: &str) -> Option<&TopicFormat> {
        self.formats.iter().find(|f| f.topic == topic)
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
