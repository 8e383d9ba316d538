#![doc = include_str!("../README.md")]

pub mod codec;
pub mod wire;

#[cfg(feature = "bindings")]
mod guest;
#[cfg(feature = "bindings")]
mod store;

use std::fmt;

pub use codec::{CodecError, Decode, Encode, Json};
#[cfg(feature = "bindings")]
#[doc(hidden)]
pub use guest::__private;
#[cfg(feature = "bindings")]
pub use guest::{Context, Level};
#[cfg(feature = "bindings")]
pub use store::{Scan, Store};

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

/// A failure in a topology's code. The task stops and the host reports the message with
/// the topology, partition and offset; nothing after the last good record is committed.
pub struct Error(String);

impl Error {
    pub fn msg(message: impl fmt::Display) -> Self {
        Error(message.to_string())
    }

    pub fn message(&self) -> &str {
        &self.0
    }
}

impl<E: std::error::Error> From<E> for Error {
    fn from(e: E) -> Self {
        Error(e.to_string())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One input record, borrowed from the batch the host handed over.
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    raw: wire::Input<'a>,
    source: &'a str,
}

impl<'a> Record<'a> {
    #[doc(hidden)]
    pub fn from_wire(raw: wire::Input<'a>, source: &'a str) -> Self {
        Record { raw, source }
    }

    /// The key's bytes, if it has a key.
    pub fn key(&self) -> Option<&'a [u8]> {
        self.raw.key
    }

    /// The value's bytes; none for a tombstone.
    pub fn value(&self) -> Option<&'a [u8]> {
        self.raw.value
    }

    /// The key decoded with a codec: `&str`, `String`, `&[u8]`, `Json<T>`, …
    /// A record without a key is an error.
    pub fn key_as<T: Decode<'a>>(&self) -> Result<T, Error> {
        let bytes = self
            .raw
            .key
            .ok_or_else(|| Error::msg(format!("{} has no key", self.describe())))?;
        T::decode(bytes).map_err(|e| Error::msg(format!("the key of {}: {e}", self.describe())))
    }

    /// The value decoded with a codec: `&str`, `String`, `&[u8]`, `Json<T>`, …
    /// A tombstone (no value) is an error.
    pub fn value_as<T: Decode<'a>>(&self) -> Result<T, Error> {
        let bytes = self
            .raw
            .value
            .ok_or_else(|| Error::msg(format!("{} has no value", self.describe())))?;
        T::decode(bytes).map_err(|e| Error::msg(format!("the value of {}: {e}", self.describe())))
    }

    /// Milliseconds since the epoch.
    pub fn timestamp(&self) -> i64 {
        self.raw.timestamp
    }

    pub fn headers(&self) -> wire::Headers<'a> {
        self.raw.headers
    }

    /// The logical name of the source this record came from.
    pub fn source(&self) -> &'a str {
        self.source
    }

    pub fn partition(&self) -> i32 {
        self.raw.partition
    }

    pub fn offset(&self) -> i64 {
        self.raw.offset
    }

    fn describe(&self) -> String {
        format!(
            "the record at {}/{}@{}",
            self.source, self.raw.partition, self.raw.offset
        )
    }
}

/// A stream-processing topology. One value of it exists per task, created by `init`.
#[cfg(feature = "bindings")]
pub trait Processor: Sized + 'static {
    /// Declares sources, sinks and stores. Called before any task starts.
    fn describe() -> Description;

    /// Creates the processor for one task.
    fn init(task: &TaskInfo) -> Result<Self, Error>;

    /// Handles one record. Emit with `ctx`. An error stops the task at this record, or, as
    /// the manifest's `on-error` says, skips it or sends it to the dead-letter topic.
    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error>;

    /// Called as time advances: `stream_time_ms` is the largest record timestamp seen. Only
    /// called once the task has seen a record (before that there is no stream time).
    fn punctuate(&mut self, _stream_time_ms: i64, _ctx: &mut Context) -> Result<(), Error> {
        Ok(())
    }

    /// Called once when the task ends cleanly.
    fn close(&mut self, _ctx: &mut Context) -> Result<(), Error> {
        Ok(())
    }
}
