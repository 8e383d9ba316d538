//! A task's topics in the Confluent wire format (see `crate::formats`): keys and values read
//! into the topology's schema as records enter the batch, what the guest emits checked and
//! framed as it is produced, and the records that must wait or cannot be read.
//!
//! A record whose writer schema is not on this worker yet waits, alone, at the end of the
//! batch: the records before it are processed, the task takes no more records (its stream
//! thread holds what comes and pauses its partitions) and asks again each turn until the
//! schema comes. A record that cannot be read goes to the topology's error policy once the
//! records before it are processed, with a reason naming its topic, partition, offset,
//! schema id and what is wrong; it is never passed over silently.

use std::sync::Arc;

use rdkafka::message::{Header as KafkaHeader, Headers as _, Message, OwnedHeaders, OwnedMessage};

use crate::formats::{Lookup, Pair, ReadError, Reading, Schemas, TopologyFormats, Waiting, Writing};

/// A record's key and value (none: null).
pub(super) type KeyValue<'a> = (Option<&'a [u8]>, Option<&'a [u8]>);

/// Where one record's key and value are kept (start, length), each none for null.
type Spans = [Option<(u32, u32)>; 2];

/// What the task keeps for its formats.
pub(super) struct TaskFormats {
    topology: Arc<TopologyFormats>,
    schemas: Schemas,
    /// Whether any of its topics has a format (else nothing here runs per record).
    pub(super) any: bool,
    key_scratch: Vec<u8>,
    value_scratch: Vec<u8>,
    /// Every sink schema's id is known.
    sinks_ready: bool,
}

/// A record that did not go into the batch: it waits for its schema, or cannot be read.
pub(super) struct Pending {
    /// Its source (numbered within the task's stage).
    pub source: u32,
    pub message: OwnedMessage,
    pub why: Why,
}

pub(super) enum Why {
    Wait(Waiting),
    /// The reason, and whether it is the registry's answer (which may change).
    Bad(String, bool),
}

/// Why a sink cannot be written yet, or at all.
pub(super) enum SinksNotReady {
    Wait(Waiting),
    Failed(String),
}

impl TaskFormats {
    pub(super) fn new(topology: Arc<TopologyFormats>, schemas: Schemas) -> TaskFormats {
        let any = topology.any();
        TaskFormats {
            topology,
            schemas,
            any,
            key_scratch: Vec::new(),
            value_scratch: Vec::new(),
            sinks_ready: !any,
        }
    }

    /// A record's key and value (from source `declared`, the description's index) in the
    /// topology's schemas; or why not, naming which of the two.
    /// Whether records of source `declared` are read with a format (and so kept as they
    /// came, see [`Originals`]).
    pub(super) fn reads(&self, declared: u32) -> bool {
        self.topology
            .sources
            .get(declared as usize)
            .is_some_and(|p| !p.is_empty())
    }

    pub(super) fn read<'s>(
        &'s mut self,
        declared: u32,
        key: Option<&'s [u8]>,
        value: Option<&'s [u8]>,
    ) -> Result<KeyValue<'s>, Why> {
        let Some(pair) = self.topology.sources.get(declared as usize) else {
            return Ok((key, value));
        };
        let schemas = &self.schemas;
        let key = read_one(schemas, pair.key.as_ref(), key, &mut self.key_scratch, "key")?;
        let value = read_one(schemas, pair.value.as_ref(), value, &mut self.value_scratch, "value")?;
        Ok((key, value))
    }

    /// Whether every sink's schema has its id (asking for those that do not, without
    /// waiting); `Err` when one is not there yet or cannot be.
    pub(super) fn sinks_ready(&mut self) -> Result<(), SinksNotReady> {
        if self.sinks_ready {
            return Ok(());
        }
        for w in self.topology.writings() {
            match w.ensure(&self.schemas) {
                Lookup::Ready(_) => {}
                Lookup::Waiting(waiting) => return Err(SinksNotReady::Wait(waiting)),
                Lookup::Failed(reason) => return Err(SinksNotReady::Failed(reason)),
            }
        }
        self.sinks_ready = true;
        Ok(())
    }

    /// Whether every sink schema's id was known at the last ask.
    pub(super) fn sinks_known(&self) -> bool {
        self.sinks_ready
    }

    /// The writings of sink `sink` (the description's index), if it has a format.
    pub(super) fn sink(&self, sink: usize) -> Option<&Pair<Writing>> {
        self.topology.sinks.get(sink).filter(|p| !p.is_empty())
    }
}

fn read_one<'s>(
    schemas: &Schemas,
    reading: Option<&Reading>,
    bytes: Option<&'s [u8]>,
    scratch: &'s mut Vec<u8>,
    part: &str,
) -> Result<Option<&'s [u8]>, Why> {
    // A null key or value (a tombstone) is not framed: it stays null.
    let (Some(reading), Some(bytes)) = (reading, bytes) else {
        return Ok(bytes);
    };
    match reading.read(schemas, bytes, scratch) {
        Ok(read) => Ok(Some(read)),
        Err(ReadError::Wait(w)) => Err(Why::Wait(w)),
        Err(ReadError::Bad { id, reason, registry }) => Err(Why::Bad(
            match id {
                Some(id) => format!("its {part} (schema id {id}) cannot be read: {reason}"),
                None => format!("its {part} is not in the Confluent wire format: {reason}"),
            },
            registry,
        )),
    }
}

/// A copy of `m` to keep while it waits.
pub(super) fn owned<M: Message>(m: &M) -> OwnedMessage {
    let headers = m.headers().map(|h| {
        let mut owned = OwnedHeaders::new_with_capacity(h.count());
        for header in h.iter() {
            owned = owned.insert(KafkaHeader {
                key: header.key,
                value: header.value,
            });
        }
        owned
    });
    OwnedMessage::new(
        m.payload().map(<[u8]>::to_vec),
        m.key().map(<[u8]>::to_vec),
        m.topic().to_string(),
        m.timestamp(),
        m.partition(),
        m.offset(),
        headers,
    )
}

/// The key and value of each record of the batch as they came from Kafka, for the records
/// whose topic has a format (the batch holds them in the topology's schema): what the
/// dead-letter topic gets, unchanged, when the guest cannot process one.
#[derive(Default)]
pub(super) struct Originals {
    bytes: Vec<u8>,
    /// Per record of the batch: none when the batch holds it as it came; else the spans of
    /// its key and value in `bytes` (none: null).
    spans: Vec<Option<Spans>>,
}

impl Originals {
    /// Keeps a record's key and value (`None`: the batch holds them as they came).
    pub(super) fn push(&mut self, kept: Option<KeyValue<'_>>) {
        let Some((key, value)) = kept else {
            self.spans.push(None);
            return;
        };
        let mut span = |b: Option<&[u8]>| {
            b.map(|b| {
                let start = self.bytes.len() as u32;
                self.bytes.extend_from_slice(b);
                (start, b.len() as u32)
            })
        };
        let spans = [span(key), span(value)];
        self.spans.push(Some(spans));
    }

    /// Record `i`'s key and value as they came, if the batch holds them otherwise.
    pub(super) fn get(&self, i: usize) -> Option<KeyValue<'_>> {
        let spans = self.spans.get(i)?.as_ref()?;
        let of = |s: Option<(u32, u32)>| s.map(|(start, len)| &self.bytes[start as usize..(start + len) as usize]);
        Some((of(spans[0]), of(spans[1])))
    }

    pub(super) fn clear(&mut self) {
        self.bytes.clear();
        self.spans.clear();
    }
}

/// What a waiting record waits for, for people (`sluice status`).
pub(super) fn waiting_text(w: &Waiting) -> String {
    let mut text = format!(
        "waiting for {} from the schema registry ({:.0} s, {} tries",
        w.what,
        w.since.elapsed().as_secs_f64(),
        w.attempts
    );
    if let Some(e) = &w.last_error {
        text.push_str(&format!("; last: {e}"));
    }
    text.push(')');
    text
}
