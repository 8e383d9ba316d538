//! Codecs: how keys and values turn into bytes and back (raw bytes, UTF-8 text, integers,
//! JSON, and the order-preserving tuple keys of [`ordered`]).
//!
//! A store's scans follow the byte order of its encoded keys. Raw bytes and UTF-8 text sort
//! as the bytes and the text do, and `u64` numerically. A plain `i64` does not: it is
//! two's complement, so `-1` sorts after `i64::MAX`. That encoding stays as it is (stores
//! written with it depend on it); for keys that must scan in order, negatives included, use
//! [`Ordered<i64>`](Ordered) or a tuple key such as `(String, i64)`.

pub mod ordered;

use std::fmt;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use ordered::{Ordered, OrderedAs, OrderedDecode, OrderedEncode, Prefix};

/// Why a key or value could not be decoded or encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecError {
    /// The codec that failed: `utf-8`, `json`, …
    pub codec: &'static str,
    pub message: String,
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} codec: {}", self.codec, self.message)
    }
}

impl std::error::Error for CodecError {}

/// A type that can be read from the bytes of a key or value, borrowing from them where it can.
pub trait Decode<'a>: Sized {
    fn decode(bytes: &'a [u8]) -> Result<Self, CodecError>;
}

/// A type that can be written as the bytes of a key or value.
pub trait Encode {
    /// Appends the encoding to `out`.
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError>;

    /// The schema a topic of these keys or values carries in the Confluent wire format
    /// ([`crate::formats`]); none for plain bytes (every other codec).
    fn schema() -> Option<crate::formats::Schema>
    where
        Self: Sized,
    {
        None
    }
}

impl<'a> Decode<'a> for &'a [u8] {
    fn decode(bytes: &'a [u8]) -> Result<Self, CodecError> {
        Ok(bytes)
    }
}

impl<'a> Decode<'a> for Vec<u8> {
    fn decode(bytes: &'a [u8]) -> Result<Self, CodecError> {
        Ok(bytes.to_vec())
    }
}

impl<'a> Decode<'a> for &'a str {
    fn decode(bytes: &'a [u8]) -> Result<Self, CodecError> {
        std::str::from_utf8(bytes).map_err(|e| CodecError {
            codec: "utf-8",
            message: e.to_string(),
        })
    }
}

impl<'a> Decode<'a> for String {
    fn decode(bytes: &'a [u8]) -> Result<Self, CodecError> {
        <&str>::decode(bytes).map(str::to_owned)
    }
}

impl Encode for [u8] {
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        out.extend_from_slice(self);
        Ok(())
    }
}

impl Encode for Vec<u8> {
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        out.extend_from_slice(self);
        Ok(())
    }
}

impl<const N: usize> Encode for [u8; N] {
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        out.extend_from_slice(self);
        Ok(())
    }
}

impl Encode for str {
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        out.extend_from_slice(self.as_bytes());
        Ok(())
    }
}

impl Encode for String {
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        out.extend_from_slice(self.as_bytes());
        Ok(())
    }
}

impl<T: Encode + ?Sized> Encode for &T {
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        (**self).encode_into(out)
    }
}

/// Integers are 8 bytes, big-endian: for `u64` the byte order is the numeric order, so
/// range scans over `u64` keys run in numeric order. For `i64` it is only for values of one
/// sign (negatives sort after positives); [`Ordered<i64>`](Ordered) sorts them all.
macro_rules! big_endian {
    ($($t:ty),*) => {$(
        impl<'a> Decode<'a> for $t {
            fn decode(bytes: &'a [u8]) -> Result<Self, CodecError> {
                let array: [u8; 8] = bytes.try_into().map_err(|_| CodecError {
                    codec: "big-endian integer",
                    message: format!("expected 8 bytes, got {}", bytes.len()),
                })?;
                Ok(<$t>::from_be_bytes(array))
            }
        }

        impl Encode for $t {
            fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
                out.extend_from_slice(&self.to_be_bytes());
                Ok(())
            }
        }
    )*};
}

big_endian!(u64, i64);

/// A value carried as JSON (with serde): `record.value_as::<Json<Order>>()?.0`,
/// `ctx.emit("out", None, &Json(total))?`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Json<T>(pub T);

impl<'a, T: DeserializeOwned> Decode<'a> for Json<T> {
    fn decode(bytes: &'a [u8]) -> Result<Self, CodecError> {
        serde_json::from_slice(bytes).map(Json).map_err(|e| CodecError {
            codec: "json",
            message: e.to_string(),
        })
    }
}

impl<T: Serialize> Encode for Json<T> {
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        serde_json::to_writer(out, &self.0).map_err(|e| CodecError {
            codec: "json",
            message: e.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_decodes_borrowed_and_rejects_invalid_bytes() {
        assert_eq!(<&str>::decode(b"hello").unwrap(), "hello");
        let err = String::decode(&[0xff, 0xfe]).unwrap_err();
        assert_eq!(err.codec, "utf-8");
        assert!(err.to_string().starts_with("utf-8 codec: invalid utf-8"), "{err}");
    }

    #[test]
    fn integers_are_big_endian_and_checked() {
        let mut out = Vec::new();
        258u64.encode_into(&mut out).unwrap();
        assert_eq!(out, [0, 0, 0, 0, 0, 0, 1, 2]);
        assert_eq!(u64::decode(&out).unwrap(), 258);
        assert_eq!(
            u64::decode(b"abc").unwrap_err().to_string(),
            "big-endian integer codec: expected 8 bytes, got 3"
        );
    }

    #[test]
    fn json_round_trips_and_names_the_problem() {
        let mut out = Vec::new();
        Json(vec![1, 2, 3]).encode_into(&mut out).unwrap();
        assert_eq!(out, b"[1,2,3]");
        assert_eq!(Json::<Vec<u32>>::decode(&out).unwrap().0, vec![1, 2, 3]);
        let err = Json::<u32>::decode(b"\"x\"").unwrap_err();
        assert!(err.to_string().starts_with("json codec: invalid type: string"), "{err}");
    }
}
