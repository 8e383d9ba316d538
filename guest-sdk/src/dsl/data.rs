//! The types a stream carries as keys and values ([`Data`]): the SDK's codecs, `Option<T>`
//! for what may be null, `()` for keys nobody reads, and [`Windowed<K>`] for window keys.

use std::fmt;

use crate::codec::ordered::{OrderedDecode, OrderedEncode};
use crate::codec::{CodecError, Decode, Encode};

/// A key or value type of a stream or table: how it is written to a topic or store and read
/// back. This is the DSL's "serde": the type *is* the codec.
///
/// Every codec type of the SDK is `Data` (`String`, `Vec<u8>`, `u64`, `i64`, [`crate::Json<T>`],
/// [`crate::Ordered<T>`], tuples of ordered elements, …) and so is:
///
/// - `Option<T>` for a `T: Data`: `None` is a null key or a record without a value (a
///   tombstone). A type that is not an `Option` cannot be null: a record with a null key or
///   value where the type says otherwise is an error naming the operator and the record.
/// - `()`: written as null, and any key or value read as `()` — for keys a topology ignores.
/// - [`Windowed<K>`], the key of a windowed aggregation.
pub trait Data: Clone + 'static {
    /// Appends the encoding to `out`; `Ok(false)` (nothing written) for a null.
    fn write_to(&self, out: &mut Vec<u8>) -> Result<bool, CodecError>;

    /// Reads the bytes of a key or value; `None` is a null.
    fn read_from(bytes: Option<&[u8]>) -> Result<Self, CodecError>;

    /// Whether this is a null: aggregations and joins drop records whose key is null.
    fn is_null(&self) -> bool {
        false
    }

    /// The schema a topic of these keys or values carries in the Confluent wire format
    /// ([`crate::formats`]: `Avro<T>`, `Protobuf<T>`, `JsonSchema<T>`); none for bytes.
    fn schema() -> Option<crate::formats::Schema> {
        None
    }
}

fn null_error() -> CodecError {
    CodecError {
        codec: "null",
        message: "null (absent), but its type cannot be null: declare it as an Option<…>".into(),
    }
}

impl<T> Data for T
where
    T: Encode + for<'a> Decode<'a> + Clone + 'static,
{
    fn write_to(&self, out: &mut Vec<u8>) -> Result<bool, CodecError> {
        self.encode_into(out)?;
        Ok(true)
    }

    fn read_from(bytes: Option<&[u8]>) -> Result<Self, CodecError> {
        match bytes {
            Some(bytes) => T::decode(bytes),
            None => Err(null_error()),
        }
    }

    fn schema() -> Option<crate::formats::Schema> {
        <T as Encode>::schema()
    }
}

impl<T: Data> Data for Option<T> {
    fn write_to(&self, out: &mut Vec<u8>) -> Result<bool, CodecError> {
        match self {
            Some(value) => value.write_to(out),
            None => Ok(false),
        }
    }

    fn read_from(bytes: Option<&[u8]>) -> Result<Self, CodecError> {
        match bytes {
            Some(bytes) => T::read_from(Some(bytes)).map(Some),
            None => Ok(None),
        }
    }

    fn is_null(&self) -> bool {
        self.as_ref().is_none_or(Data::is_null)
    }

    fn schema() -> Option<crate::formats::Schema> {
        T::schema()
    }
}

impl Data for () {
    fn write_to(&self, _out: &mut Vec<u8>) -> Result<bool, CodecError> {
        Ok(false)
    }

    fn read_from(_bytes: Option<&[u8]>) -> Result<Self, CodecError> {
        Ok(())
    }

    fn is_null(&self) -> bool {
        true
    }
}

/// The key of a windowed aggregation: the record key and the window, `[start, end)` in
/// milliseconds.
///
/// As a key of a topic it is written as the key's bytes followed by the start and the end,
/// each 8 bytes big-endian (so it reads back without knowing the window size).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Windowed<K> {
    pub key: K,
    /// The window's first millisecond.
    pub start: i64,
    /// The millisecond after its last one.
    pub end: i64,
}

impl<K: fmt::Display> fmt::Display for Windowed<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@[{}, {})", self.key, self.start, self.end)
    }
}

impl<K: Data> Data for Windowed<K> {
    fn write_to(&self, out: &mut Vec<u8>) -> Result<bool, CodecError> {
        self.key.write_to(out)?;
        out.extend_from_slice(&self.start.to_be_bytes());
        out.extend_from_slice(&self.end.to_be_bytes());
        Ok(true)
    }

    fn read_from(bytes: Option<&[u8]>) -> Result<Self, CodecError> {
        let bytes = bytes.ok_or_else(null_error)?;
        if bytes.len() < 16 {
            return Err(CodecError {
                codec: "windowed key",
                message: format!("needs at least 16 bytes (start and end), got {}", bytes.len()),
            });
        }
        let (key, times) = bytes.split_at(bytes.len() - 16);
        let start = i64::from_be_bytes(times[..8].try_into().unwrap_or_default());
        let end = i64::from_be_bytes(times[8..].try_into().unwrap_or_default());
        Ok(Windowed {
            key: K::read_from(Some(key))?,
            start,
            end,
        })
    }
}

/// Encodes a key or value for a store or a topic, into a buffer the caller reuses.
pub(crate) fn encode_into<T: Data>(value: &T, out: &mut Vec<u8>) -> Result<bool, CodecError> {
    out.clear();
    value.write_to(out)
}

/// The encoding of a key or value in a fresh buffer (`None` for a null).
pub(crate) fn encoded<T: Data>(value: &T) -> Result<Option<Vec<u8>>, CodecError> {
    let mut out = Vec::new();
    Ok(value.write_to(&mut out)?.then_some(out))
}

/// Appends an order-preserving element to a store key.
pub(crate) fn push_ordered<T: OrderedEncode + ?Sized>(out: &mut Vec<u8>, element: &T) {
    element.encode_ordered(out);
}

/// Reads an order-preserving element from the front of a store key.
pub(crate) fn pop_ordered<T: OrderedDecode>(input: &mut &[u8]) -> Result<T, CodecError> {
    T::decode_ordered(input)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nullability_is_in_the_type() {
        assert_eq!(String::read_from(Some(b"a")).unwrap(), "a");
        let e = String::read_from(None).unwrap_err().to_string();
        assert!(e.contains("declare it as an Option"), "{e}");
        assert_eq!(Option::<String>::read_from(None).unwrap(), None);
        assert!(Option::<String>::None.is_null());
        assert!(!Some("x".to_string()).is_null());
        assert_eq!(<()>::read_from(Some(b"anything")).unwrap(), ());
        assert_eq!(encoded(&()).unwrap(), None);
        assert_eq!(encoded(&Some(7u64)).unwrap(), Some(7u64.to_be_bytes().to_vec()));
    }

    #[test]
    fn windowed_keys_round_trip_and_short_ones_are_errors() {
        let w = Windowed {
            key: "k".to_string(),
            start: -5,
            end: 10,
        };
        let bytes = encoded(&w).unwrap().unwrap();
        assert_eq!(bytes.len(), 17);
        assert_eq!(Windowed::<String>::read_from(Some(&bytes)).unwrap(), w);
        let e = Windowed::<String>::read_from(Some(b"short")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "windowed key codec: needs at least 16 bytes (start and end), got 5"
        );
    }
}
