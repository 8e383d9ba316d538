//! Keys and values in the formats of a Schema Registry — Avro, Protobuf, JSON Schema — as
//! Confluent's serializers write them: typed values in, typed values out.
//!
//! The host does the registry's part (see the repository's `docs/formats.md`): for a source,
//! it finds each record's writer schema by the id in its first bytes, checks the record, and
//! hands the topology the payload in the topology's own schema (an Avro record resolved from
//! the writer's schema to this one's, a Protobuf message of this type, a JSON text). For a
//! sink, it checks what the topology emits against the schema declared here, registers the
//! schema, and frames each record with its id. So a codec here encodes and decodes the
//! payload alone, with no network and no registry, and a topology declares which topics
//! carry which schema (the DSL does that by itself from its types).
//!
//! ```
//! use sluice_guest::formats::{Avro, AvroSchema};
//! use sluice_guest::serde::{Deserialize, Serialize};
//!
//! #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
//! #[serde(crate = "sluice_guest::serde")]
//! struct Order {
//!     id: String,
//!     amount: f64,
//! }
//!
//! impl AvroSchema for Order {
//!     const SCHEMA: &'static str = r#"{"type":"record","name":"Order","namespace":"shop",
//!         "fields":[{"name":"id","type":"string"},{"name":"amount","type":"double"}]}"#;
//! }
//!
//! // A Processor declares the format of its topics in its description…
//! let description = sluice_guest::Description::new("orders")
//!     .source("orders")
//!     .value_format("orders", Avro::<Order>::schema());
//! // …and reads and writes the values with the codec: `record.value_as::<Avro<Order>>()`,
//! // `ctx.emit("out", None, &Avro(order))`.
//! use sluice_guest::{Decode, Encode};
//! let mut bytes = Vec::new();
//! Avro(Order { id: "o-1".into(), amount: 9.5 }).encode_into(&mut bytes).unwrap();
//! assert_eq!(Avro::<Order>::decode(&bytes).unwrap().0.id, "o-1");
//! ```

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec::{CodecError, Decode, Encode};
pub use sluice_wire::{Schema, SchemaKind};

mod generic;
pub use generic::{AvroValue, GenericAvro};

/// A type read and written as Avro with the schema `SCHEMA` (Avro's JSON): implement it for
/// a serde type, or use [`avro_schema!`](crate::avro_schema) with an `.avsc` file.
///
/// The Rust type and the schema must agree: serde reads a record's fields by name, a union
/// `["null", T]` as an `Option<T>`, an enum as a Rust enum of unit variants (or a `String`),
/// `bytes` and `fixed` as `Vec<u8>` (with `serde_bytes`) or `[u8; N]`, logical types as
/// their underlying type (a `timestamp-millis` is an `i64`, a `decimal` its bytes).
pub trait AvroSchema {
    const SCHEMA: &'static str;
}

/// Implements [`AvroSchema`] for a type from a schema's text:
/// `sluice_guest::avro_schema!(Order, include_str!("order.avsc"));`.
#[macro_export]
macro_rules! avro_schema {
    ($type:ty, $schema:expr) => {
        impl $crate::formats::AvroSchema for $type {
            const SCHEMA: &'static str = $schema;
        }
    };
}

/// The parsed schema of `text`, once per schema (a topology has a few).
fn avro_schema(text: &'static str) -> Result<&'static serde_avro_fast::Schema, CodecError> {
    static PARSED: OnceLock<Mutex<HashMap<usize, &'static serde_avro_fast::Schema>>> = OnceLock::new();
    let parsed = PARSED.get_or_init(Default::default);
    let mut parsed = parsed.lock().unwrap_or_else(|e| e.into_inner());
    let key = text.as_ptr() as usize;
    if let Some(schema) = parsed.get(&key) {
        return Ok(schema);
    }
    let schema: serde_avro_fast::Schema = text.parse().map_err(|e| CodecError {
        codec: "avro",
        message: format!("the schema does not parse: {e}"),
    })?;
    let schema: &'static serde_avro_fast::Schema = Box::leak(Box::new(schema));
    parsed.insert(key, schema);
    Ok(schema)
}

/// A value carried as Avro with `T`'s schema ([`AvroSchema`]): `record.value_as::<Avro<Order>>()?.0`,
/// `ctx.emit("out", None, &Avro(order))`, or as a stream's type in the DSL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Avro<T>(pub T);

impl<T: AvroSchema> Avro<T> {
    /// The schema to declare for a topic of these values (or keys).
    pub fn schema() -> Schema {
        Schema::avro(T::SCHEMA)
    }
}

/// Reads `bytes` as Avro of the schema `text` into a `T`.
fn avro_decode<T: DeserializeOwned>(text: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    let schema = avro_schema(text)?;
    serde_avro_fast::from_datum_slice(bytes, schema).map_err(|e| CodecError {
        codec: "avro",
        message: e.to_string(),
    })
}

/// Writes `value` as Avro of the schema `text` to `out`.
fn avro_encode<T: Serialize + ?Sized>(text: &'static str, value: &T, out: &mut Vec<u8>) -> Result<(), CodecError> {
    let schema = avro_schema(text)?;
    let mut config = serde_avro_fast::ser::SerializerConfig::new(schema);
    serde_avro_fast::to_datum(value, out, &mut config)
        .map(|_| ())
        .map_err(|e| CodecError {
            codec: "avro",
            message: e.to_string(),
        })
}

impl<'a, T: AvroSchema + DeserializeOwned> Decode<'a> for Avro<T> {
    fn decode(bytes: &'a [u8]) -> Result<Self, CodecError> {
        avro_decode(T::SCHEMA, bytes).map(Avro)
    }
}

impl<T: AvroSchema + Serialize> Encode for Avro<T> {
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        avro_encode(T::SCHEMA, &self.0, out)
    }

    fn schema() -> Option<Schema> {
        Some(Schema::avro(T::SCHEMA))
    }
}

/// A type read and written as JSON (with serde) under the JSON Schema `SCHEMA`: the host
/// validates what is written against it (and, if the manifest asks, what is read).
pub trait JsonSchemaOf {
    const SCHEMA: &'static str;
}

/// A value carried as JSON under `T`'s JSON Schema ([`JsonSchemaOf`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JsonSchema<T>(pub T);

impl<T: JsonSchemaOf> JsonSchema<T> {
    /// The schema to declare for a topic of these values (or keys).
    pub fn schema() -> Schema {
        Schema::json_schema(T::SCHEMA)
    }
}

impl<'a, T: JsonSchemaOf + DeserializeOwned> Decode<'a> for JsonSchema<T> {
    fn decode(bytes: &'a [u8]) -> Result<Self, CodecError> {
        serde_json::from_slice(bytes).map(JsonSchema).map_err(|e| CodecError {
            codec: "json-schema",
            message: e.to_string(),
        })
    }
}

impl<T: JsonSchemaOf + Serialize> Encode for JsonSchema<T> {
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        serde_json::to_writer(out, &self.0).map_err(|e| CodecError {
            codec: "json-schema",
            message: e.to_string(),
        })
    }

    fn schema() -> Option<Schema> {
        Some(Schema::json_schema(T::SCHEMA))
    }
}

/// A Protobuf message type (a `prost` message) and the `.proto` file that defines it:
/// `PROTO` is the file's text, `MESSAGE` the message's full name (`package.Message`),
/// `IMPORTS` the files it imports (import path, text) other than Google's well-known types.
pub trait ProtoSchema {
    const PROTO: &'static str;
    const MESSAGE: &'static str;
    const IMPORTS: &'static [(&'static str, &'static str)] = &[];
}

/// A value carried as a Protobuf message ([`ProtoSchema`], encoded with `prost`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Protobuf<T>(pub T);

fn proto_schema<T: ProtoSchema>() -> Schema {
    T::IMPORTS
        .iter()
        .fold(Schema::protobuf(T::PROTO, T::MESSAGE), |s, (path, text)| {
            s.import(*path, *text)
        })
}

impl<T: ProtoSchema> Protobuf<T> {
    /// The schema to declare for a topic of these values (or keys).
    pub fn schema() -> Schema {
        proto_schema::<T>()
    }
}

impl<'a, T: ProtoSchema + prost::Message + Default> Decode<'a> for Protobuf<T> {
    fn decode(bytes: &'a [u8]) -> Result<Self, CodecError> {
        T::decode(bytes).map(Protobuf).map_err(|e| CodecError {
            codec: "protobuf",
            message: e.to_string(),
        })
    }
}

impl<T: ProtoSchema + prost::Message> Encode for Protobuf<T> {
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        self.0.encode(out).map_err(|e| CodecError {
            codec: "protobuf",
            message: e.to_string(),
        })
    }

    fn schema() -> Option<Schema> {
        Some(proto_schema::<T>())
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Order {
        id: String,
        amount: f64,
        note: Option<String>,
    }

    crate::avro_schema!(
        Order,
        r#"{"type":"record","name":"Order","fields":[{"name":"id","type":"string"},{"name":"amount","type":"double"},{"name":"note","type":["null","string"],"default":null}]}"#
    );

    #[test]
    fn avro_round_trips_in_the_binary_encoding() {
        let order = Order {
            id: "o-1".into(),
            amount: 2.5,
            note: Some("fast".into()),
        };
        let mut out = Vec::new();
        Avro(order.clone()).encode_into(&mut out).unwrap();
        // "o-1": length 3 (zig-zag 6), the bytes; 2.5 as a double; branch 1, "fast".
        assert_eq!(&out[..4], &[6, b'o', b'-', b'1']);
        assert_eq!(&out[4..12], &2.5f64.to_le_bytes());
        assert_eq!(&out[12..], &[2, 8, b'f', b'a', b's', b't']);
        assert_eq!(Avro::<Order>::decode(&out).unwrap().0, order);
        assert_eq!(<Avro<Order> as Encode>::schema().unwrap().kind, SchemaKind::Avro);
    }

    #[test]
    fn bytes_that_are_not_the_schemas_say_so() {
        let e = Avro::<Order>::decode(&[6, b'o']).unwrap_err();
        assert_eq!(e.codec, "avro");
    }
}
