//! The guest side of the WIT contract: generated bindings, the per-task state behind
//! `export!`, and the `Context` a processor emits through.

use std::cell::UnsafeCell;

use crate::codec::Encode;
use crate::wire::{self, Header, Writer, INHERIT_TIMESTAMP};
use crate::{Description, Error, Processor, Record, TaskInfo};

use __private::bindings::exports::sluice::topology0_2_0::processor as wit;
use __private::bindings::sluice::topology0_1_0::host;
use __private::bindings::sluice::topology0_1_0::types as wit_types;

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

/// How a processor talks to the host: emit records to declared sinks, log, read the clock.
///
/// Emitted records are buffered and handed to the host when the call returns: one
/// transfer per batch instead of one host call per record.
pub struct Context {
    sinks: Vec<String>,
    out: Writer,
    /// An emit to an undeclared sink fails the batch even if the processor ignored the error.
    violation: Option<String>,
    /// The timestamp emitted records get: the input's, or the stream time in `punctuate`.
    timestamp: i64,
}

impl Context {
    /// Emits a record with `key` (none for a record without key) and `value` to `sink`,
    /// with the timestamp of the input being processed (in `punctuate`, the stream time;
    /// in `close`, the time the host produces it).
    ///
    /// Keys and values are encoded with their [`Encode`] impl: `&str`, `String`, `&[u8]`,
    /// `Vec<u8>`, `u64`, tuples, [`crate::Json`], … An undeclared sink is an error.
    pub fn emit<K, V>(&mut self, sink: &str, key: Option<&K>, value: &V) -> Result<(), Error>
    where
        K: Encode + ?Sized,
        V: Encode + ?Sized,
    {
        self.emit_with(sink, key, value, self.timestamp)
    }

    /// Emits like [`Context::emit`], with an explicit timestamp (milliseconds since the
    /// epoch) instead of the input's: a window's end, an event time carried in the value.
    /// Kafka has no negative timestamps: a negative one is sent as "none", and the producer
    /// stamps the record with the time it sends it.
    pub fn emit_at<K, V>(&mut self, sink: &str, key: Option<&K>, value: &V, timestamp_ms: i64) -> Result<(), Error>
    where
        K: Encode + ?Sized,
        V: Encode + ?Sized,
    {
        // -1 is Kafka's "no timestamp"; `INHERIT_TIMESTAMP` (i64::MIN) must not leak through.
        self.emit_with(sink, key, value, timestamp_ms.max(-1))
    }

    fn emit_with<K, V>(&mut self, sink: &str, key: Option<&K>, value: &V, timestamp: i64) -> Result<(), Error>
    where
        K: Encode + ?Sized,
        V: Encode + ?Sized,
    {
        let index = self.sink_index(sink)?;
        let start = self.out.byte_len();
        self.out.begin_emitted(index);
        let encoded = (|| {
            match key {
                Some(key) => self.field(|buf| key.encode_into(buf))?,
                None => self.out.none_field(),
            }
            self.field(|buf| value.encode_into(buf))
        })();
        if let Err(e) = encoded {
            self.out.truncate(start);
            return Err(Error::msg(format!("encoding a record for sink {sink:?}: {e}")));
        }
        self.out.finish_emitted(timestamp, std::iter::empty());
        Ok(())
    }

    /// Emits a record with every field spelled out: raw key and value (none for null),
    /// an explicit timestamp (none: the input's, as [`Context::emit`] has it) and headers.
    pub fn emit_raw(
        &mut self,
        sink: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        timestamp: Option<i64>,
        headers: &[(&str, Option<&[u8]>)],
    ) -> Result<(), Error> {
        let index = self.sink_index(sink)?;
        let headers = headers.iter().map(|(name, value)| Header {
            name: name.as_bytes(),
            value: *value,
        });
        self.out.push_emitted(
            index,
            key,
            value,
            timestamp.map_or(self.timestamp, |t| t.max(-1)),
            headers,
        );
        Ok(())
    }

    /// Writes a line to the worker's log, tagged with this topology and task.
    pub fn log(&self, level: Level, message: &str) {
        let level = match level {
            Level::Trace => wit_types::Level::Trace,
            Level::Debug => wit_types::Level::Debug,
            Level::Info => wit_types::Level::Info,
            Level::Warn => wit_types::Level::Warn,
            Level::Error => wit_types::Level::Error,
        };
        host::log(level, message);
    }

    /// Wall-clock time from the host, milliseconds since the epoch.
    pub fn now_ms(&self) -> i64 {
        host::now_ms()
    }

    /// The declared sinks, in order.
    pub fn sinks(&self) -> &[String] {
        &self.sinks
    }

    fn sink_index(&mut self, sink: &str) -> Result<u32, Error> {
        match self.sinks.iter().position(|s| same_name(s, sink)) {
            Some(i) => Ok(i as u32),
            None => {
                let message = format!(
                    "emit to undeclared sink {sink:?}; the topology declares {:?}",
                    self.sinks
                );
                self.violation.get_or_insert_with(|| message.clone());
                Err(Error::msg(message))
            }
        }
    }

    fn field(&mut self, encode: impl FnOnce(&mut Vec<u8>) -> Result<(), crate::CodecError>) -> Result<(), Error> {
        let at = self.out.begin_field();
        encode(self.out.field_buffer())?;
        self.out.end_field(at);
        Ok(())
    }
}

/// Whether two (short) names are equal, compared in place: in Wasm a `memcmp` is a real
/// call, and this runs for every emitted record.
#[inline]
fn same_name(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut differ = 0u8;
    for i in 0..a.len() {
        differ |= a[i] ^ b[i];
    }
    differ == 0
}

struct State<T> {
    processor: T,
    sources: Vec<String>,
    ctx: Context,
}

/// Where `export!` keeps the task's processor. A component instance runs one task on one
/// thread, so there is never concurrent access.
#[doc(hidden)]
pub struct Slot<T>(UnsafeCell<Option<State<T>>>);

// SAFETY: Wasm components are single-threaded; the host never calls an instance concurrently.
unsafe impl<T> Sync for Slot<T> {}

impl<T> Slot<T> {
    #[allow(clippy::new_without_default)]
    pub const fn new() -> Self {
        Slot(UnsafeCell::new(None))
    }

    #[allow(clippy::mut_from_ref)]
    fn state(&self) -> &mut Option<State<T>> {
        // SAFETY: see the `Sync` impl; each export call takes this reference once and
        // drops it before returning.
        unsafe { &mut *self.0.get() }
    }
}

fn guest_error(record_index: Option<u32>, message: impl Into<String>) -> wit_types::GuestError {
    wit_types::GuestError {
        record_index,
        message: message.into(),
    }
}

const NOT_INITIALISED: &str = "the host called the topology before init";

/// What `export!` expands to needs these paths; they are not API and may change in any release.
#[doc(hidden)]
pub mod __private {
    /// The raw WIT bindings. Hidden behind [`crate::Processor`], [`crate::Context`] and
    /// [`crate::Store`]; only the repository's hostile test guests speak WIT directly.
    pub mod bindings {
        wit_bindgen::generate!({
            // `topology` and the optional `introspection` (operators, for people) and
            // `formats` (the schemas of its topics) exports.
            world: "formatted-topology",
            // A copy of the repository's `wit/`, inside the crate so that it builds as a
            // dependency anywhere (the host checks that the two are the same).
            path: "wit",
            pub_export_macro: true,
            export_macro_name: "__export_topology",
            default_bindings_module: "sluice_guest::__private::bindings",
            // The host's interfaces are those of 0.1.0 (`wit/deps/`), imported by 0.2.0.
            generate_all,
        });
    }

    pub use self::bindings::exports::sluice::topology0_2_0::formats::{
        Guest as FormatsGuest, Schema as WitSchema, SchemaKind as WitSchemaKind, TopicFormat as WitTopicFormat,
    };
    pub use self::bindings::exports::sluice::topology0_2_0::introspection::Guest as IntrospectionGuest;
    pub use self::bindings::exports::sluice::topology0_2_0::processor::Guest;
    pub use self::bindings::sluice::topology0_1_0::types::GuestError;
    pub use self::bindings::sluice::topology0_2_0::types::{
        Description as WitDescription, GlobalStore as WitGlobalStore, InternalTopic as WitInternalTopic,
        Subtopology as WitSubtopology, TaskInfo as WitTaskInfo,
    };
    pub use super::{close, describe, describe_formats, describe_operators, init, process, punctuate, Slot};
}

#[doc(hidden)]
pub fn describe<T: Processor>() -> wit::Description {
    let d: Description = T::describe();
    wit::Description {
        name: d.name,
        sources: d.sources,
        sinks: d.sinks,
        stores: d.stores,
        internal_topics: d
            .internal_topics
            .into_iter()
            .map(|t| __private::WitInternalTopic {
                name: t.name,
                partitions: t.partitions,
            })
            .collect(),
        subtopologies: d
            .subtopologies
            .into_iter()
            .map(|s| __private::WitSubtopology {
                name: s.name,
                sources: s.sources,
                sinks: s.sinks,
                stores: s.stores,
            })
            .collect(),
        global_stores: d
            .global_stores
            .into_iter()
            .map(|g| __private::WitGlobalStore {
                name: g.name,
                topic: g.topic,
            })
            .collect(),
    }
}

#[doc(hidden)]
pub fn describe_operators<T: Processor>() -> Vec<(String, Vec<String>)> {
    T::operators()
}

#[doc(hidden)]
pub fn describe_formats<T: Processor>() -> Vec<__private::WitTopicFormat> {
    let schema = |s: crate::formats::Schema| __private::WitSchema {
        kind: match s.kind {
            crate::formats::SchemaKind::Avro => __private::WitSchemaKind::Avro,
            crate::formats::SchemaKind::Protobuf => __private::WitSchemaKind::Protobuf,
            crate::formats::SchemaKind::JsonSchema => __private::WitSchemaKind::JsonSchema,
        },
        text: s.text,
        message: s.message,
        imports: s.imports,
    };
    T::describe()
        .formats
        .into_iter()
        .map(|f| __private::WitTopicFormat {
            topic: f.topic,
            key: f.key.map(schema),
            value: f.value.map(schema),
        })
        .collect()
}

#[doc(hidden)]
pub fn init<T: Processor>(slot: &Slot<T>, task: wit::TaskInfo) -> Result<(), wit_types::GuestError> {
    let description = T::describe();
    let info = TaskInfo {
        topology: task.topology,
        subtopology: task.subtopology,
        task_id: task.task_id,
        partition: task.partition,
        source_topics: task.source_topics,
        sink_topics: task.sink_topics,
    };
    let processor = T::init(&info).map_err(|e| guest_error(None, e.0))?;
    *slot.state() = Some(State {
        processor,
        sources: description.sources,
        ctx: Context {
            sinks: description.sinks,
            out: Writer::new(),
            violation: None,
            timestamp: INHERIT_TIMESTAMP,
        },
    });
    Ok(())
}

#[doc(hidden)]
pub fn process<T: Processor>(slot: &Slot<T>, batch: Vec<u8>) -> Result<Vec<u8>, wit_types::GuestError> {
    let state = slot
        .state()
        .as_mut()
        .ok_or_else(|| guest_error(None, NOT_INITIALISED))?;
    let State {
        processor,
        sources,
        ctx,
    } = state;
    let records = wire::inputs(&batch).map_err(|e| guest_error(None, e.to_string()))?;
    if let Err(e) = processor.batch_started() {
        ctx.out.clear();
        ctx.violation = None;
        return Err(guest_error(None, e.0));
    }
    for (index, raw) in records.enumerate() {
        let index = index as u32;
        let failed = |message: String, ctx: &mut Context| {
            ctx.out.clear();
            ctx.violation = None;
            Err(guest_error(Some(index), message))
        };
        let raw = match raw {
            Ok(raw) => raw,
            Err(e) => return failed(e.to_string(), ctx),
        };
        let Some(source) = sources.get(raw.source as usize) else {
            return failed(
                format!(
                    "the host sent a record from source #{}, which is not declared",
                    raw.source
                ),
                ctx,
            );
        };
        ctx.timestamp = raw.timestamp;
        let result = processor.process(&Record::from_wire(raw, source), ctx);
        if let Some(violation) = ctx.violation.take() {
            return failed(violation, ctx);
        }
        if let Err(e) = result {
            return failed(e.0, ctx);
        }
    }
    let done = processor.batch_done(ctx);
    if let Some(message) = ctx.violation.take().or_else(|| done.err().map(|e| e.0)) {
        ctx.out.clear();
        return Err(guest_error(None, message));
    }
    Ok(ctx.out.take())
}

#[doc(hidden)]
pub fn punctuate<T: Processor>(slot: &Slot<T>, stream_time_ms: i64) -> Result<Vec<u8>, wit_types::GuestError> {
    finish_call(slot, |processor, ctx| {
        ctx.timestamp = stream_time_ms;
        processor.punctuate(stream_time_ms, ctx)
    })
}

#[doc(hidden)]
pub fn close<T: Processor>(slot: &Slot<T>) -> Result<Vec<u8>, wit_types::GuestError> {
    finish_call(slot, |processor, ctx| {
        ctx.timestamp = INHERIT_TIMESTAMP;
        processor.close(ctx)
    })
}

fn finish_call<T: Processor>(
    slot: &Slot<T>,
    call: impl FnOnce(&mut T, &mut Context) -> Result<(), Error>,
) -> Result<Vec<u8>, wit_types::GuestError> {
    let state = slot
        .state()
        .as_mut()
        .ok_or_else(|| guest_error(None, NOT_INITIALISED))?;
    let result = call(&mut state.processor, &mut state.ctx);
    let violation = state.ctx.violation.take();
    match (violation, result) {
        (Some(message), _) | (None, Err(Error(message))) => {
            state.ctx.out.clear();
            Err(guest_error(None, message))
        }
        (None, Ok(())) => Ok(state.ctx.out.take()),
    }
}

/// Exports a [`Processor`] as the topology of this component. Use it once per crate.
#[macro_export]
macro_rules! export {
    ($processor:ty) => {
        #[doc(hidden)]
        struct __SluiceTopology;

        #[doc(hidden)]
        static __SLUICE_SLOT: $crate::__private::Slot<$processor> = $crate::__private::Slot::new();

        impl $crate::__private::Guest for __SluiceTopology {
            fn describe() -> $crate::__private::WitDescription {
                $crate::__private::describe::<$processor>()
            }
            fn init(task: $crate::__private::WitTaskInfo) -> ::core::result::Result<(), $crate::__private::GuestError> {
                $crate::__private::init(&__SLUICE_SLOT, task)
            }
            fn process(
                batch: ::std::vec::Vec<u8>,
            ) -> ::core::result::Result<::std::vec::Vec<u8>, $crate::__private::GuestError> {
                $crate::__private::process(&__SLUICE_SLOT, batch)
            }
            fn punctuate(
                stream_time_ms: i64,
                _wall_clock_ms: i64,
            ) -> ::core::result::Result<::std::vec::Vec<u8>, $crate::__private::GuestError> {
                $crate::__private::punctuate(&__SLUICE_SLOT, stream_time_ms)
            }
            fn close() -> ::core::result::Result<::std::vec::Vec<u8>, $crate::__private::GuestError> {
                $crate::__private::close(&__SLUICE_SLOT)
            }
        }

        impl $crate::__private::IntrospectionGuest for __SluiceTopology {
            fn describe_operators() -> ::std::vec::Vec<(::std::string::String, ::std::vec::Vec<::std::string::String>)> {
                $crate::__private::describe_operators::<$processor>()
            }
        }

        impl $crate::__private::FormatsGuest for __SluiceTopology {
            fn describe_formats() -> ::std::vec::Vec<$crate::__private::WitTopicFormat> {
                $crate::__private::describe_formats::<$processor>()
            }
        }

        // Only a component exports the topology: a native build of the crate (an `rlib` for
        // tests under `tests/`, or a `cdylib` built for the host's target) has no component
        // model, and the exports' names (`sluice:topology/processor@…`) break native linkers.
        #[cfg(target_arch = "wasm32")]
        $crate::__private::bindings::__export_topology!(__SluiceTopology with_types_in $crate::__private::bindings);
    };
}
