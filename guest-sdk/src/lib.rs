#![doc = include_str!("../README.md")]

pub mod codec;
pub mod dsl;
pub mod formats;
mod guest;
mod store;

use std::fmt;

pub use codec::{CodecError, Decode, Encode, Json, Ordered};
#[doc(hidden)]
pub use guest::__private;
pub use guest::{Context, Level};
pub use sluice_wire::{wire, Description, GlobalStore, InternalTopic, Subtopology, TaskInfo, TopicFormat};
pub use store::{Scan, Store};

/// serde, with its derive macros, for [`Json<T>`] without a serde dependency of your own:
/// derive with `#[derive(sluice_guest::serde::Serialize)]` and add
/// `#[serde(crate = "sluice_guest::serde")]` so the generated code finds it.
pub use serde;
/// serde_json, the format behind [`Json<T>`].
pub use serde_json;

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
pub trait Processor: Sized + 'static {
    /// Declares sources, sinks and stores. Called before any task starts.
    fn describe() -> Description;

    /// Creates the processor for one task.
    fn init(task: &TaskInfo) -> Result<Self, Error>;

    /// Handles one record. Emit with `ctx`. An error stops the task at this record, or, as
    /// the manifest's `on-error` says, skips it or sends it to the dead-letter topic.
    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error>;

    /// Called before the records of each batch (one call from the host; records come in
    /// batches of up to `--batch-size`). The host commits only between batches, and when a
    /// batch fails it drops what the batch wrote to stores and emitted, then processes its
    /// records again. So state kept in memory across records — a running maximum, a cache
    /// — should be read from a store here and written back in [`Processor::batch_done`]:
    /// then it always agrees with what the stores hold, at a commit and after a failure.
    fn batch_started(&mut self) -> Result<(), Error> {
        Ok(())
    }

    /// Called after the last record of each batch, before the host takes what it emitted:
    /// write back what [`Processor::batch_started`] read. An error fails the batch as an
    /// error in `process` does, without a record to blame.
    fn batch_done(&mut self, _ctx: &mut Context) -> Result<(), Error> {
        Ok(())
    }

    /// Called as time advances, for work that is due by time rather than by a record:
    /// closing windows, expiring state, periodic summaries.
    ///
    /// - **When.** Between batches, on the task's thread (never during `process`), about once
    ///   per punctuation interval (the worker's `--punctuate-interval`, 1 s by default) of
    ///   stream time or of wall-clock time, whichever passes first; so also while no records
    ///   arrive, with an unchanged stream time. A jump in stream time gives one call, not one
    ///   per interval jumped. Never before the task has read a record.
    /// - **`stream_time_ms`** is the largest timestamp (milliseconds since the epoch) of the
    ///   records this task has read since it started on this worker, and every one of them
    ///   has been through `process` when this is called. It never decreases while the task
    ///   runs, but it is not stored: after a restart or a move to another worker it starts
    ///   again from the first record read there, and that record may be older than ones seen
    ///   before.
    /// - **Emitting.** To any declared sink, as in `process`: [`Context::emit`] stamps
    ///   records with `stream_time_ms`, [`Context::emit_at`] with a time of your choosing.
    ///   They are produced with the task's other output, under the same guarantee.
    /// - **State.** Stores may be read and written as in `process`; the writes are committed
    ///   with the task's next commit, together with the input offsets.
    /// - **Errors.** An `Err` (or a trap, the call's deadline, an emit to an undeclared sink)
    ///   drops what this call emitted and wrote and fails the task; the manifest's `on-error`
    ///   does not apply (there is no record to skip). Nothing since the task's last commit is
    ///   committed (state writes, input offsets and, under exactly-once, output): whoever
    ///   runs the task next processes those records again.
    fn punctuate(&mut self, _stream_time_ms: i64, _ctx: &mut Context) -> Result<(), Error> {
        Ok(())
    }

    /// Called once when the task ends cleanly.
    fn close(&mut self, _ctx: &mut Context) -> Result<(), Error> {
        Ok(())
    }

    /// What each sub-topology does, operator by operator, for people: `sluice topologies
    /// describe` prints it. By sub-topology name (the topology's name for one without
    /// sub-topologies), one line per operator. None by default; the DSL fills it in.
    fn operators() -> Vec<(String, Vec<String>)> {
        Vec::new()
    }
}
