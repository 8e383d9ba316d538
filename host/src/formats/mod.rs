//! Records in the Confluent wire format behind a Schema Registry (Avro, Protobuf, JSON
//! Schema): the worker's registry client and schema cache, and how each key or value of a
//! topic a topology declares a format for is read before its guest sees it and written
//! after.
//!
//! Decoding runs here, in the host, not in the guest: the host must read the framing anyway
//! (to find the writer's schema, to wait for a schema it does not have, to judge a record
//! that does not fit by the topology's error policy before the guest sees it), and a pair of
//! writer and reader schemas is resolved once per worker, natively, for every language's
//! guests alike. What a guest gets is the payload in the topology's own schema — Avro
//! binary in the reader's schema, the Protobuf message as written, the JSON text — which
//! its SDK decodes without a registry or a resolution of its own.
//!
//! - `framing`: the wire format (magic byte, schema id, Protobuf message indexes);
//! - `client`: the registry's REST API; `cache`: the worker's [`Schemas`];
//! - `avro`, `protobuf`, `json`: each language's parsing and checks;
//! - this file: a topology's [`TopologyFormats`], its [`Reading`]s and [`Writing`]s.

pub mod avro;
pub mod cache;
pub mod client;
pub mod framing;
pub mod json;
pub mod json_io;
pub mod protobuf;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use prost_reflect::MessageDescriptor;
use sluice_wire::{Description, Schema, SchemaKind};

pub use cache::{Lookup, Schemas, Waiting, WriterSchema};
pub use client::{RegistryAuth, RegistryClient, RegistryError, RegistrySettings};

/// A schema parsed, in its language.
#[derive(Debug)]
pub enum Parsed {
    Avro(avro::AvroSchema),
    Protobuf(protobuf::ProtoSchema),
    Json(json::JsonSchema),
}

/// Most bytes of one schema's text (with its imports) the host parses.
pub const MAX_SCHEMA_BYTES: usize = 4 << 20;
/// Deepest nesting of braces and brackets a schema's text may have: the parsers recurse,
/// and a schema is what anyone who may register one wrote.
pub const MAX_SCHEMA_NESTING: usize = 128;

/// Refuses a schema text nested deeper than [`MAX_SCHEMA_NESTING`] (braces and brackets
/// outside strings), before a recursive parser sees it.
fn check_nesting(text: &str) -> Result<(), String> {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' | b'(' | b'<' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b'}' | b']' | b')' | b'>' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if deepest > MAX_SCHEMA_NESTING {
        return Err(format!(
            "nested {deepest} levels deep, more than the {MAX_SCHEMA_NESTING} a schema may be"
        ));
    }
    Ok(())
}

impl Parsed {
    /// Parses `text` (with the documents it imports) as a schema of `kind`.
    pub fn parse(kind: SchemaKind, text: &str, imports: &[(String, String)]) -> Result<Parsed, String> {
        let bytes = text.len() + imports.iter().map(|(p, t)| p.len() + t.len()).sum::<usize>();
        if bytes > MAX_SCHEMA_BYTES {
            return Err(format!(
                "{bytes} bytes of schema, more than the {MAX_SCHEMA_BYTES} taken"
            ));
        }
        check_nesting(text)?;
        for (path, imported) in imports {
            check_nesting(imported).map_err(|e| format!("its import {path:?} is {e}"))?;
        }
        match kind {
            SchemaKind::Avro => avro::AvroSchema::parse(text).map(Parsed::Avro),
            SchemaKind::Protobuf => protobuf::ProtoSchema::parse(text, imports).map(Parsed::Protobuf),
            SchemaKind::JsonSchema => json::JsonSchema::parse(text, imports).map(Parsed::Json),
        }
    }
}

/// Most bytes of the schemas one topology may declare, together (the host keeps them).
pub const MAX_DECLARED_BYTES: usize = 4 << 20;

/// A schema a topology declares for a topic's keys or values, parsed.
#[derive(Debug)]
pub struct Declared {
    pub schema: Schema,
    pub parsed: Parsed,
    /// Protobuf: the declared message.
    pub message: Option<MessageDescriptor>,
    /// SHA-256 of the kind, text, message and imports.
    pub digest: [u8; 32],
}

impl Declared {
    /// Parses a declared schema; the error says what is wrong with it.
    pub fn parse(schema: &Schema) -> Result<Declared, String> {
        use sha2::{Digest, Sha256};
        let parsed = Parsed::parse(schema.kind, &schema.text, &schema.imports)?;
        let message = match (&parsed, &schema.message) {
            (Parsed::Protobuf(p), Some(name)) => Some(p.message(name).ok_or_else(|| {
                format!("the Protobuf schema has no message {name:?} (give its full name, package.Message)")
            })?),
            (Parsed::Protobuf(_), None) => {
                return Err("a Protobuf schema must name the message its records are".into());
            }
            (_, Some(_)) => return Err(format!("a {} schema names no message", schema.kind)),
            _ => None,
        };
        if let (Parsed::Protobuf(p), Some(m)) = (&parsed, &message) {
            if p.indexes_of(m).is_none() {
                return Err(format!(
                    "message {} is imported, not defined in the schema's own file: declare the file that defines it",
                    m.full_name()
                ));
            }
        }
        let mut hash = Sha256::new();
        hash.update(schema.kind.name());
        for part in [Some(&schema.text), schema.message.as_ref()] {
            let part = part.map_or("", |s| s.as_str());
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part);
        }
        for (path, text) in &schema.imports {
            hash.update((path.len() as u64).to_le_bytes());
            hash.update(path);
            hash.update((text.len() as u64).to_le_bytes());
            hash.update(text);
        }
        Ok(Declared {
            schema: schema.clone(),
            parsed,
            message,
            digest: hash.finalize().into(),
        })
    }

    /// The name the record strategies name a subject after: an Avro schema's full name, a
    /// Protobuf message's, a JSON Schema's `title`.
    pub fn record_name(&self) -> Option<String> {
        match &self.parsed {
            Parsed::Avro(a) => a.full_name(),
            Parsed::Protobuf(_) => self.message.as_ref().map(|m| m.full_name().to_string()),
            Parsed::Json(j) => j.title().map(str::to_string),
        }
    }
}

/// How subjects are named for a sink's schemas (Confluent's `subject.name.strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SubjectStrategy {
    /// `<topic>-key`, `<topic>-value` (the default).
    #[default]
    Topic,
    /// The record's full name.
    Record,
    /// `<topic>-<record's full name>`.
    TopicRecord,
}

impl SubjectStrategy {
    pub fn parse(text: &str) -> Result<SubjectStrategy, String> {
        match text {
            "topic" => Ok(SubjectStrategy::Topic),
            "record" => Ok(SubjectStrategy::Record),
            "topic-record" => Ok(SubjectStrategy::TopicRecord),
            other => Err(format!(
                "formats.subject-name-strategy = {other:?}: write \"topic\" (the default), \"record\" or \"topic-record\""
            )),
        }
    }

    /// The subject a schema written to `topic` is registered under.
    pub fn subject(self, topic: &str, is_key: bool, declared: &Declared) -> Result<String, String> {
        let part = if is_key { "key" } else { "value" };
        let record = || {
            declared.record_name().ok_or_else(|| {
                format!(
                    "the {part} schema of topic {topic} has no name for the record subject strategies (an Avro \
                     record, enum or fixed; a Protobuf message; a JSON Schema with a title)"
                )
            })
        };
        Ok(match self {
            SubjectStrategy::Topic => format!("{topic}-{part}"),
            SubjectStrategy::Record => record()?,
            SubjectStrategy::TopicRecord => format!("{topic}-{}", record()?),
        })
    }
}

/// A topology's settings for its formats (the manifest's `[formats]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FormatSettings {
    pub subject_strategy: SubjectStrategy,
    /// Sinks register their schemas (else a schema must be registered already).
    pub auto_register: bool,
    /// JSON Schema records read are validated against their writer's schema (they are
    /// always checked to be JSON; written ones are always validated).
    pub validate_json_reads: bool,
}

impl Default for FormatSettings {
    fn default() -> Self {
        FormatSettings {
            subject_strategy: SubjectStrategy::Topic,
            auto_register: true,
            validate_json_reads: false,
        }
    }
}

/// Why a record cannot be read (yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// Its writer schema is not here yet: the task waits for it.
    Wait(Waiting),
    /// It does not fit: a reason naming the schema id (when it has one) and what is wrong;
    /// `registry`: the registry's answer says so (an id it does not know), which may change.
    Bad {
        id: Option<u32>,
        reason: String,
        registry: bool,
    },
}

/// How a writer's schema reads as the topology's.
enum Decoder {
    Avro(avro::Plan),
    /// The writer's file: its message at each record's indexes must be the declared one.
    Protobuf(Arc<WriterSchema>),
    Json(Arc<WriterSchema>),
    /// It cannot be read as the topology's schema: each record written with it fails so.
    Refused(String),
}

/// Most writer schemas a reading keeps decoders for (each record names its own; a tenant
/// may write many).
const MAX_DECODERS: usize = 256;

/// How one topic's keys or values are read: the topology's schema, and a decoder per writer
/// schema id met (compiled once per worker, shared by the topology's tasks).
pub struct Reading {
    pub declared: Arc<Declared>,
    validate_json: bool,
    limits: avro::Limits,
    decoders: Mutex<HashMap<u32, Arc<Decoder>>>,
}

impl std::fmt::Debug for Reading {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reading")
            .field("kind", &self.declared.schema.kind)
            .finish()
    }
}

impl Reading {
    pub fn new(declared: Arc<Declared>, settings: &FormatSettings, max_record: usize) -> Reading {
        Reading {
            declared,
            validate_json: settings.validate_json_reads,
            limits: avro::Limits {
                max_out: max_record,
                ..Default::default()
            },
            decoders: Mutex::new(HashMap::new()),
        }
    }

    fn decoder(&self, schemas: &Schemas, id: u32) -> Result<Arc<Decoder>, ReadError> {
        if let Some(d) = self.decoders.lock().unwrap_or_else(|e| e.into_inner()).get(&id) {
            return Ok(d.clone());
        }
        let writer = match schemas.writer(id) {
            Lookup::Ready(w) => w,
            Lookup::Waiting(w) => return Err(ReadError::Wait(w)),
            Lookup::Failed(reason) => {
                return Err(ReadError::Bad {
                    id: Some(id),
                    reason,
                    registry: true,
                })
            }
        };
        let decoder = Arc::new(self.compile(&writer));
        let mut decoders = self.decoders.lock().unwrap_or_else(|e| e.into_inner());
        if decoders.len() >= MAX_DECODERS {
            decoders.clear();
        }
        decoders.insert(id, decoder.clone());
        Ok(decoder)
    }

    fn compile(&self, writer: &Arc<WriterSchema>) -> Decoder {
        let kind = self.declared.schema.kind;
        if writer.kind != kind {
            return Decoder::Refused(format!(
                "schema id {} is a {} schema, but the topology reads this topic as {kind}",
                writer.id, writer.kind
            ));
        }
        match (&writer.parsed, &self.declared.parsed) {
            (Parsed::Avro(w), Parsed::Avro(r)) => match avro::Plan::compile(w, r) {
                Ok(plan) => Decoder::Avro(plan),
                Err(e) => Decoder::Refused(format!(
                    "schema id {} cannot be read with the topology's reader schema: {e}",
                    writer.id
                )),
            },
            (Parsed::Protobuf(_), _) => Decoder::Protobuf(writer.clone()),
            (Parsed::Json(_), _) => Decoder::Json(writer.clone()),
            _ => Decoder::Refused("the writer's schema and the topology's are of different kinds".into()),
        }
    }

    /// Reads one framed key or value: the payload in the topology's schema, borrowed from
    /// `bytes` when it is as written, else written to `scratch`.
    pub fn read<'a>(
        &self,
        schemas: &Schemas,
        bytes: &'a [u8],
        scratch: &'a mut Vec<u8>,
    ) -> Result<&'a [u8], ReadError> {
        let framed = framing::split(bytes).map_err(|e| ReadError::Bad {
            id: None,
            reason: e.to_string(),
            registry: false,
        })?;
        let id = framed.id;
        let decoder = self.decoder(schemas, id)?;
        let bad = |reason: String| ReadError::Bad {
            id: Some(id),
            reason,
            registry: false,
        };
        match &*decoder {
            Decoder::Refused(reason) => Err(bad(reason.clone())),
            Decoder::Avro(plan) => plan
                .run(framed.rest, scratch, &self.limits)
                .map_err(|e| bad(format!("it does not read as Avro under schema id {id}: {e}"))),
            Decoder::Protobuf(writer) => {
                let (indexes, payload) = framing::message_indexes(framed.rest).map_err(|e| bad(e.to_string()))?;
                let Parsed::Protobuf(file) = &writer.parsed else {
                    unreachable!("a Protobuf decoder holds a Protobuf schema")
                };
                let message = file
                    .message_at(&indexes)
                    .map_err(|e| bad(format!("schema id {id}: {e}")))?;
                let want = self
                    .declared
                    .message
                    .as_ref()
                    .expect("a declared Protobuf schema names its message");
                if message.full_name() != want.full_name() {
                    return Err(bad(format!(
                        "it was written as Protobuf message {} (schema id {id}), but the topology reads {}",
                        message.full_name(),
                        want.full_name()
                    )));
                }
                protobuf::check(&message, payload).map_err(|e| bad(format!("{e} (schema id {id})")))?;
                Ok(payload)
            }
            Decoder::Json(writer) => {
                let Parsed::Json(schema) = &writer.parsed else {
                    unreachable!("a JSON decoder holds a JSON schema")
                };
                schema
                    .check(framed.rest, self.validate_json)
                    .map_err(|e| bad(format!("{e} (schema id {id})")))?;
                Ok(framed.rest)
            }
        }
    }
}

/// How one topic's keys or values are written: checked against the topology's schema, and
/// framed with its id under the topic's subject.
pub struct Writing {
    pub declared: Arc<Declared>,
    pub subject: String,
    pub register: bool,
    id: OnceLock<u32>,
    check: WriteCheck,
    limits: avro::Limits,
}

enum WriteCheck {
    Avro(avro::Plan),
    Protobuf {
        message: MessageDescriptor,
        indexes: Vec<usize>,
    },
    Json,
}

impl std::fmt::Debug for Writing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writing").field("subject", &self.subject).finish()
    }
}

impl Writing {
    pub fn new(declared: Arc<Declared>, subject: String, register: bool, max_record: usize) -> Writing {
        let check = match &declared.parsed {
            Parsed::Avro(a) => WriteCheck::Avro(avro::Plan::check(a)),
            Parsed::Protobuf(p) => {
                let message = declared
                    .message
                    .clone()
                    .expect("a declared Protobuf schema names its message");
                let indexes = p.indexes_of(&message).expect("checked when declared");
                WriteCheck::Protobuf { message, indexes }
            }
            Parsed::Json(_) => WriteCheck::Json,
        };
        Writing {
            declared,
            subject,
            register,
            id: OnceLock::new(),
            check,
            limits: avro::Limits {
                max_out: max_record,
                ..Default::default()
            },
        }
    }

    /// Its schema's id under its subject, once the registry gave it: at once after that.
    pub fn ensure(&self, schemas: &Schemas) -> Lookup<u32> {
        if let Some(id) = self.id.get() {
            return Lookup::Ready(*id);
        }
        let found = schemas.subject_id(&self.subject, &self.declared, self.register);
        if let Lookup::Ready(id) = found {
            let _ = self.id.set(id);
        }
        found
    }

    /// The id, if known (see [`Writing::ensure`]).
    pub fn id(&self) -> Option<u32> {
        self.id.get().copied()
    }

    /// Checks `payload` (what the guest emitted, in the topology's schema); the error says
    /// what does not fit the schema, or that the schema's id is not known yet.
    pub fn check(&self, payload: &[u8]) -> Result<(), String> {
        if self.id().is_none() {
            return Err(format!(
                "the id of its schema under subject {} is not known yet",
                self.subject
            ));
        }
        match &self.check {
            WriteCheck::Avro(plan) => plan
                .check_bytes(payload, &self.limits)
                .map_err(|e| format!("it is not Avro of its schema: {e}")),
            WriteCheck::Protobuf { message, .. } => protobuf::check(message, payload),
            WriteCheck::Json => {
                let Parsed::Json(schema) = &self.declared.parsed else {
                    unreachable!("a JSON check holds a JSON schema")
                };
                schema.check(payload, true)
            }
        }
    }

    /// Writes `payload`, checked before ([`Writing::check`]), framed with the schema's id to
    /// `out` (cleared first).
    pub fn frame(&self, payload: &[u8], out: &mut Vec<u8>) {
        out.clear();
        framing::write_header(self.id().expect("checked before framing"), out);
        if let WriteCheck::Protobuf { indexes, .. } = &self.check {
            framing::write_message_indexes(indexes, out);
        }
        out.extend_from_slice(payload);
    }

    /// Checks `payload` and writes it framed to `out`.
    pub fn write(&self, payload: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        self.check(payload)?;
        self.frame(payload, out);
        Ok(())
    }
}

/// A key and a value way of one topic (none: bytes).
#[derive(Debug)]
pub struct Pair<T> {
    pub key: Option<T>,
    pub value: Option<T>,
}

impl<T> Default for Pair<T> {
    fn default() -> Self {
        Pair { key: None, value: None }
    }
}

impl<T> Pair<T> {
    pub fn is_empty(&self) -> bool {
        self.key.is_none() && self.value.is_none()
    }
}

/// The formats of one deployed topology: how each of its sources is read and each of its
/// sinks written, by their index in its description.
#[derive(Debug, Default)]
pub struct TopologyFormats {
    pub sources: Vec<Pair<Reading>>,
    pub sinks: Vec<Pair<Writing>>,
    /// Its global stores' topics, by the store's index in the description.
    pub globals: Vec<Pair<Reading>>,
}

impl TopologyFormats {
    /// The formats of `description` bound to topics (`source_topics`, `sink_topics`: the
    /// topics each source and sink is bound to, repartition topics included); the error says
    /// which declared format cannot be used.
    pub fn new(
        description: &Description,
        sink_topics: &[String],
        settings: &FormatSettings,
        max_record: usize,
    ) -> Result<TopologyFormats, String> {
        let mut declared: HashMap<&str, Pair<Arc<Declared>>> = HashMap::new();
        let mut bytes = 0;
        for f in &description.formats {
            let known = description.sources.contains(&f.topic)
                || description.sinks.contains(&f.topic)
                || description.global_stores.iter().any(|g| g.topic == f.topic);
            if !known {
                return Err(format!(
                    "it declares a format for {:?}, which is none of its sources, sinks and global tables' topics",
                    f.topic
                ));
            }
            if declared.contains_key(f.topic.as_str()) {
                return Err(format!("it declares the format of {:?} twice", f.topic));
            }
            if let Some(g) = description.global_stores.iter().find(|g| g.topic == f.topic) {
                // A global table is one copy of its topic per worker, shared by every
                // topology that reads it, keyed by its records' key bytes: it cannot hold
                // one topology's reading of them yet.
                return Err(format!(
                    "global table {:?} reads {:?} in the Confluent wire format, which global tables do not \
                     support yet: read the topic as a table (KTable, co-partitioned) instead",
                    g.name, f.topic
                ));
            }
            let mut pair = Pair::default();
            for (is_key, schema) in [(true, &f.key), (false, &f.value)] {
                let Some(schema) = schema else { continue };
                bytes += schema.text.len() + schema.imports.iter().map(|(p, t)| p.len() + t.len()).sum::<usize>();
                if bytes > MAX_DECLARED_BYTES {
                    return Err(format!(
                        "its schemas take more than {MAX_DECLARED_BYTES} bytes together"
                    ));
                }
                let part = if is_key { "key" } else { "value" };
                let parsed = Declared::parse(schema)
                    .map_err(|e| format!("the {part} schema it declares for {:?}: {e}", f.topic))?;
                let parsed = Some(Arc::new(parsed));
                if is_key {
                    pair.key = parsed;
                } else {
                    pair.value = parsed;
                }
            }
            declared.insert(f.topic.as_str(), pair);
        }
        let reading = |name: &str| -> Pair<Reading> {
            match declared.get(name) {
                Some(p) => Pair {
                    key: p.key.clone().map(|d| Reading::new(d, settings, max_record)),
                    value: p.value.clone().map(|d| Reading::new(d, settings, max_record)),
                },
                None => Pair::default(),
            }
        };
        let sources = description.sources.iter().map(|s| reading(s)).collect();
        let globals = description.global_stores.iter().map(|g| reading(&g.topic)).collect();
        let mut sinks = Vec::with_capacity(description.sinks.len());
        for (name, topic) in description.sinks.iter().zip(sink_topics) {
            let mut pair = Pair::default();
            if let Some(p) = declared.get(name.as_str()) {
                for (is_key, d) in [(true, &p.key), (false, &p.value)] {
                    let Some(d) = d else { continue };
                    let subject = settings.subject_strategy.subject(topic, is_key, d)?;
                    let writing = Writing::new(d.clone(), subject, settings.auto_register, max_record);
                    if is_key {
                        pair.key = Some(writing);
                    } else {
                        pair.value = Some(writing);
                    }
                }
            }
            sinks.push(pair);
        }
        Ok(TopologyFormats {
            sources,
            sinks,
            globals,
        })
    }

    /// Whether any topic has a format.
    pub fn any(&self) -> bool {
        self.sources.iter().chain(&self.globals).any(|p| !p.is_empty()) || self.sinks.iter().any(|p| !p.is_empty())
    }

    /// Every writing, for making sure of their ids.
    pub fn writings(&self) -> impl Iterator<Item = &Writing> {
        self.sinks.iter().flat_map(|p| p.key.iter().chain(p.value.iter()))
    }
}

#[cfg(test)]
mod tests;
