//! Test topology: for each format of a Schema Registry, records decoded into Rust types with
//! the SDK's codecs and written again — Avro (`every_in` → `every_out`, a record of every
//! Avro type, `schemas/every.avsc`), Protobuf (`proto_in` → `proto_out`, `schemas/order.proto`)
//! and JSON Schema (`json_in` → `json_out`, `schemas/order.json`), and JSON orders keyed by an
//! Avro record (`keyed_in` → `keyed_out`, `schemas/order-key.avsc`). What comes out must equal
//! what went in, read by another client (the interop tests read it with confluent-kafka).

use std::collections::BTreeMap;

use sluice_guest::formats::{Avro, JsonSchema, JsonSchemaOf, ProtoSchema, Protobuf};
use sluice_guest::serde::{Deserialize, Serialize};
use sluice_guest::{export, Context, Description, Error, Processor, Record, TaskInfo};

/// `schemas/every.avsc`: each Avro type as serde reads it with `serde_avro_fast`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "sluice_guest::serde")]
pub struct Every {
    pub n: (),
    pub b: bool,
    pub i: i32,
    pub l: i64,
    pub f: f32,
    pub d: f64,
    pub by: Bytes,
    pub s: String,
    pub fx: Bytes,
    pub e: Suit,
    pub a: Vec<i64>,
    pub m: BTreeMap<String, String>,
    pub u: Option<StringOrLong>,
    pub r: Inner,
    pub ra: Vec<Inner>,
    pub date: i32,
    pub tm: i32,
    pub tu: i64,
    pub tsm: i64,
    pub tsu: i64,
    pub uuid: String,
    /// A decimal, as its text (`"12.50"`).
    pub dec: String,
}

sluice_guest::avro_schema!(Every, include_str!("../schemas/every.avsc"));

/// Avro `bytes` and `fixed`: serde's bytes, not a sequence of numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Bytes(pub Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: sluice_guest::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: sluice_guest::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> sluice_guest::serde::de::Visitor<'de> for Visitor {
            type Value = Bytes;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Bytes, E> {
                Ok(Bytes(v.to_vec()))
            }
            fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Bytes, E> {
                Ok(Bytes(v))
            }
        }
        d.deserialize_bytes(Visitor)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(crate = "sluice_guest::serde")]
pub enum Suit {
    #[serde(rename = "CLUBS")]
    Clubs,
    #[serde(rename = "DIAMONDS")]
    Diamonds,
    #[serde(rename = "HEARTS")]
    Hearts,
    #[serde(rename = "SPADES")]
    Spades,
}

/// The union `["null", "string", "long"]` (its null as the `Option`'s none):
/// serde_avro_fast names a union's branches by their types.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "sluice_guest::serde")]
pub enum StringOrLong {
    String(String),
    Long(i64),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "sluice_guest::serde")]
pub struct Inner {
    pub x: i32,
    pub next: Option<Box<Inner>>,
}

/// `schemas/order.proto`'s `interop.Order`, as prost derives it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProtoOrder {
    #[prost(string, tag = "1")]
    pub id: String,
    #[prost(int32, tag = "2")]
    pub quantity: i32,
    #[prost(double, tag = "3")]
    pub price: f64,
    #[prost(string, repeated, tag = "4")]
    pub tags: Vec<String>,
    #[prost(message, repeated, tag = "5")]
    pub lines: Vec<Line>,
    #[prost(int32, tag = "6")]
    pub status: i32,
    #[prost(btree_map = "string, int64", tag = "7")]
    pub counters: BTreeMap<String, i64>,
    #[prost(bytes = "vec", tag = "8")]
    pub blob: Vec<u8>,
    #[prost(bool, tag = "9")]
    pub gift: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(string, tag = "1")]
    pub sku: String,
    #[prost(int64, tag = "2")]
    pub count: i64,
}

impl ProtoSchema for ProtoOrder {
    const PROTO: &'static str = include_str!("../schemas/order.proto");
    const MESSAGE: &'static str = "interop.Order";
}

/// `schemas/order-key.avsc`: a composite key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "sluice_guest::serde")]
pub struct OrderKey {
    pub id: String,
    pub shard: i32,
}

sluice_guest::avro_schema!(OrderKey, include_str!("../schemas/order-key.avsc"));

/// `schemas/order.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "sluice_guest::serde", deny_unknown_fields)]
pub struct JsonOrder {
    pub id: String,
    pub amount: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub customer: Option<Customer>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "sluice_guest::serde", deny_unknown_fields)]
pub struct Customer {
    pub name: String,
}

impl JsonSchemaOf for JsonOrder {
    const SCHEMA: &'static str = include_str!("../schemas/order.json");
}

struct FormatsEcho;

impl Processor for FormatsEcho {
    fn describe() -> Description {
        Description::new("formats-echo")
            .source("every_in")
            .source("proto_in")
            .source("json_in")
            .source("keyed_in")
            .sink("every_out")
            .sink("proto_out")
            .sink("json_out")
            .sink("keyed_out")
            .value_format("every_in", Avro::<Every>::schema())
            .value_format("every_out", Avro::<Every>::schema())
            .value_format("proto_in", Protobuf::<ProtoOrder>::schema())
            .value_format("proto_out", Protobuf::<ProtoOrder>::schema())
            .value_format("json_in", JsonSchema::<JsonOrder>::schema())
            .value_format("json_out", JsonSchema::<JsonOrder>::schema())
            .key_format("keyed_in", Avro::<OrderKey>::schema())
            .key_format("keyed_out", Avro::<OrderKey>::schema())
            .value_format("keyed_in", JsonSchema::<JsonOrder>::schema())
            .value_format("keyed_out", JsonSchema::<JsonOrder>::schema())
    }

    fn init(_task: &TaskInfo) -> Result<Self, Error> {
        Ok(FormatsEcho)
    }

    fn process(&mut self, record: &Record<'_>, ctx: &mut Context) -> Result<(), Error> {
        match record.source() {
            "every_in" => {
                let every: Avro<Every> = record.value_as()?;
                ctx.emit("every_out", record.key(), &every)
            }
            "proto_in" => {
                let order: Protobuf<ProtoOrder> = record.value_as()?;
                ctx.emit("proto_out", record.key(), &order)
            }
            "keyed_in" => {
                let key: Avro<OrderKey> = record.key_as()?;
                let order: JsonSchema<JsonOrder> = record.value_as()?;
                ctx.emit("keyed_out", Some(&key), &order)
            }
            _ => {
                let order: JsonSchema<JsonOrder> = record.value_as()?;
                ctx.emit("json_out", record.key(), &order)
            }
        }
    }
}

export!(FormatsEcho);

#[cfg(test)]
mod tests {
    use sluice_guest::{Decode, Encode};

    use super::*;

    #[test]
    fn every_avro_type_round_trips_through_the_typed_value() {
        let every = Every {
            n: (),
            b: true,
            i: -5,
            l: 1 << 40,
            f: 1.5,
            d: -2.25,
            by: Bytes(vec![0, 255]),
            s: "héllo".into(),
            fx: Bytes(vec![1, 2, 3, 4]),
            e: Suit::Hearts,
            a: vec![1, -2],
            m: [("k".to_string(), "v".to_string())].into_iter().collect(),
            u: Some(StringOrLong::Long(7)),
            r: Inner {
                x: 1,
                next: Some(Box::new(Inner { x: 2, next: None })),
            },
            ra: vec![Inner { x: 3, next: None }],
            date: 19_000,
            tm: 1_000,
            tu: 1_000_000,
            tsm: 1_733_500_000_000,
            tsu: 1_733_500_000_000_000,
            uuid: "00000000-0000-0000-0000-000000000001".into(),
            dec: "12.50".into(),
        };
        let mut bytes = Vec::new();
        Avro(every.clone()).encode_into(&mut bytes).unwrap();
        assert_eq!(Avro::<Every>::decode(&bytes).unwrap().0, every);
        for u in [None, Some(StringOrLong::String("s".into()))] {
            let with = Every {
                u: u.clone(),
                ..every.clone()
            };
            let mut bytes = Vec::new();
            Avro(with.clone()).encode_into(&mut bytes).unwrap();
            assert_eq!(Avro::<Every>::decode(&bytes).unwrap().0, with);
        }
    }
}
