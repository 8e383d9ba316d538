//! Avro values for code that has no Rust type for a schema: [`GenericAvro<S>`] reads and
//! writes any record of `S`'s schema as an [`AvroValue`] tree, as Kafka Streams' users take
//! a `GenericRecord`.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

use super::{avro_decode, avro_encode, AvroSchema, Schema};
use crate::codec::{CodecError, Decode, Encode};

/// A value of an Avro schema, whatever the schema.
///
/// Reading one, a union is the value of its branch, an enum its symbol (`String`), `fixed`
/// its `Bytes`, a `decimal` the text of its digits (`"12.50"`), a `uuid` its text, logical
/// dates and times their number, a record its fields in the schema's order (`Map`, as a map
/// is). Writing one, each is written as the schema at its place asks: a `String` into an enum
/// is its symbol, a `Map` into a record its fields by name (a field missing is an error), a
/// value into a union the first branch of its kind.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum AvroValue {
    #[default]
    Null,
    Boolean(bool),
    Int(i32),
    Long(i64),
    Float(f32),
    Double(f64),
    Bytes(Vec<u8>),
    String(String),
    Array(Vec<AvroValue>),
    /// A record's fields or a map's entries, in the order they were read or set.
    Map(Vec<(String, AvroValue)>),
}

static NULL: AvroValue = AvroValue::Null;

impl AvroValue {
    /// A record's field or a map's entry (`None` for another kind of value).
    pub fn get(&self, name: &str) -> Option<&AvroValue> {
        match self {
            AvroValue::Map(entries) => entries.iter().find(|(k, _)| k == name).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The field or entry `name`, to change it.
    pub fn get_mut(&mut self, name: &str) -> Option<&mut AvroValue> {
        match self {
            AvroValue::Map(entries) => entries.iter_mut().find(|(k, _)| k == name).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Sets the field or entry `name` (added at the end if it is not there); a value that is
    /// not a `Map` becomes one.
    pub fn set(&mut self, name: &str, value: impl Into<AvroValue>) {
        if !matches!(self, AvroValue::Map(_)) {
            *self = AvroValue::Map(Vec::new());
        }
        if let Some(slot) = self.get_mut(name) {
            *slot = value.into();
        } else if let AvroValue::Map(entries) = self {
            entries.push((name.to_string(), value.into()));
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, AvroValue::Null)
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            AvroValue::Boolean(b) => Some(*b),
            _ => None,
        }
    }

    /// An `int` or `long` (dates, times and timestamps too).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            AvroValue::Int(n) => Some(i64::from(*n)),
            AvroValue::Long(n) => Some(*n),
            _ => None,
        }
    }

    /// A `float`, `double`, `int` or `long` as a double.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            AvroValue::Float(x) => Some(f64::from(*x)),
            AvroValue::Double(x) => Some(*x),
            AvroValue::Int(n) => Some(f64::from(*n)),
            AvroValue::Long(n) => Some(*n as f64),
            _ => None,
        }
    }

    /// A `string`, an enum's symbol, a decimal's digits, a UUID.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            AvroValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// `bytes` or `fixed`.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            AvroValue::Bytes(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[AvroValue]> {
        match self {
            AvroValue::Array(items) => Some(items),
            _ => None,
        }
    }

    /// A record's fields or a map's entries.
    pub fn as_map(&self) -> Option<&[(String, AvroValue)]> {
        match self {
            AvroValue::Map(entries) => Some(entries),
            _ => None,
        }
    }
}

/// `value["field"]`: the field, or `Null` when there is none.
impl std::ops::Index<&str> for AvroValue {
    type Output = AvroValue;

    fn index(&self, name: &str) -> &AvroValue {
        self.get(name).unwrap_or(&NULL)
    }
}

macro_rules! from {
    ($($t:ty => $variant:ident),*) => {$(
        impl From<$t> for AvroValue {
            fn from(v: $t) -> AvroValue {
                AvroValue::$variant(v.into())
            }
        }
    )*};
}
from!(bool => Boolean, i32 => Int, i64 => Long, f32 => Float, f64 => Double, Vec<u8> => Bytes,
      String => String, &str => String, Vec<AvroValue> => Array);

impl<T: Into<AvroValue>> From<Option<T>> for AvroValue {
    fn from(v: Option<T>) -> AvroValue {
        v.map_or(AvroValue::Null, Into::into)
    }
}

impl Serialize for AvroValue {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            AvroValue::Null => s.serialize_none(),
            AvroValue::Boolean(b) => s.serialize_bool(*b),
            AvroValue::Int(n) => s.serialize_i32(*n),
            AvroValue::Long(n) => s.serialize_i64(*n),
            AvroValue::Float(x) => s.serialize_f32(*x),
            AvroValue::Double(x) => s.serialize_f64(*x),
            AvroValue::Bytes(b) => s.serialize_bytes(b),
            AvroValue::String(text) => s.serialize_str(text),
            AvroValue::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            AvroValue::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = AvroValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an Avro value")
    }

    fn visit_unit<E>(self) -> Result<AvroValue, E> {
        Ok(AvroValue::Null)
    }
    fn visit_none<E>(self) -> Result<AvroValue, E> {
        Ok(AvroValue::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<AvroValue, D::Error> {
        AvroValue::deserialize(d)
    }
    fn visit_bool<E>(self, v: bool) -> Result<AvroValue, E> {
        Ok(AvroValue::Boolean(v))
    }
    fn visit_i32<E>(self, v: i32) -> Result<AvroValue, E> {
        Ok(AvroValue::Int(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<AvroValue, E> {
        Ok(AvroValue::Long(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<AvroValue, E> {
        i64::try_from(v)
            .map(AvroValue::Long)
            .map_err(|_| E::custom(format!("{v} does not fit an Avro long")))
    }
    fn visit_f32<E>(self, v: f32) -> Result<AvroValue, E> {
        Ok(AvroValue::Float(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<AvroValue, E> {
        Ok(AvroValue::Double(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<AvroValue, E> {
        Ok(AvroValue::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<AvroValue, E> {
        Ok(AvroValue::String(v))
    }
    fn visit_bytes<E>(self, v: &[u8]) -> Result<AvroValue, E> {
        Ok(AvroValue::Bytes(v.to_vec()))
    }
    fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<AvroValue, E> {
        Ok(AvroValue::Bytes(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<AvroValue, A::Error> {
        // The hint is what the record claims: reserve no more than a few items by it.
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(AvroValue::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AvroValue, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
        while let Some((k, v)) = map.next_entry::<String, AvroValue>()? {
            entries.push((k, v));
        }
        Ok(AvroValue::Map(entries))
    }
}

impl<'de> Deserialize<'de> for AvroValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<AvroValue, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

/// A value of `S`'s Avro schema as an [`AvroValue`]: for code without a Rust type for the
/// schema (`S` is a marker type with [`avro_schema!`](crate::avro_schema)), in the Processor
/// API and as a stream's type in the DSL, as [`Avro<T>`](super::Avro) is.
///
/// ```
/// use sluice_guest::formats::{AvroValue, GenericAvro};
/// use sluice_guest::{Decode, Encode};
///
/// struct Orders;
/// sluice_guest::avro_schema!(Orders, r#"{"type":"record","name":"Order","fields":[
///     {"name":"id","type":"string"},{"name":"amount","type":"double"}]}"#);
///
/// let mut order = AvroValue::default();
/// order.set("id", "o-1");
/// order.set("amount", 2.5);
/// let mut bytes = Vec::new();
/// GenericAvro::<Orders>::new(order).encode_into(&mut bytes).unwrap();
/// let read = GenericAvro::<Orders>::decode(&bytes).unwrap();
/// assert_eq!(read.value["id"].as_str(), Some("o-1"));
/// assert_eq!(read.value["amount"].as_f64(), Some(2.5));
/// ```
pub struct GenericAvro<S> {
    pub value: AvroValue,
    schema: PhantomData<fn() -> S>,
}

impl<S> GenericAvro<S> {
    pub fn new(value: AvroValue) -> GenericAvro<S> {
        GenericAvro {
            value,
            schema: PhantomData,
        }
    }
}

impl<S: AvroSchema> GenericAvro<S> {
    /// The schema to declare for a topic of these values (or keys).
    pub fn schema() -> Schema {
        Schema::avro(S::SCHEMA)
    }
}

impl<S> Clone for GenericAvro<S> {
    fn clone(&self) -> Self {
        GenericAvro::new(self.value.clone())
    }
}

impl<S> PartialEq for GenericAvro<S> {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl<S> fmt::Debug for GenericAvro<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("GenericAvro").field(&self.value).finish()
    }
}

impl<S> std::ops::Deref for GenericAvro<S> {
    type Target = AvroValue;

    fn deref(&self) -> &AvroValue {
        &self.value
    }
}

impl<S> std::ops::DerefMut for GenericAvro<S> {
    fn deref_mut(&mut self) -> &mut AvroValue {
        &mut self.value
    }
}

impl<'a, S: AvroSchema> Decode<'a> for GenericAvro<S> {
    fn decode(bytes: &'a [u8]) -> Result<Self, CodecError> {
        avro_decode::<AvroValue>(S::SCHEMA, bytes).map(GenericAvro::new)
    }
}

impl<S: AvroSchema> Encode for GenericAvro<S> {
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        avro_encode(S::SCHEMA, &self.value, out)
    }

    fn schema() -> Option<Schema> {
        Some(Schema::avro(S::SCHEMA))
    }
}
