//! Order-preserving key encodings: tuples and [`Ordered<T>`], whose bytes sort as the values do.
//!
//! A store keeps its entries in the byte order of the encoded keys, and its range and prefix
//! scans follow that order. Every element type here has an encoding that is
//! - *order-preserving*: comparing two encodings byte by byte gives the same answer as
//!   comparing the values with [`Ord`], and
//! - *self-delimiting*: a decoder knows where an element ends without a length in front, so
//!   the encoding of a tuple is its elements' encodings one after the other, and comparing
//!   two tuples' bytes compares them element by element, the first difference deciding.
//!
//! | element | encoding |
//! | --- | --- |
//! | `u8` … `u128` | big-endian, fixed width |
//! | `i8` … `i128` | big-endian, fixed width, sign bit flipped (negatives sort first) |
//! | `bool` | `0x00` (false) or `0x01` (true) |
//! | `String`, `str`, `Vec<u8>`, `[u8]` | the bytes, each `0x00` written as `0x00 0xFF`, then `0x00 0x01` |
//! | `[u8; N]` | the N bytes as they are (the width is in the type) |
//! | `Option<T>` | `0x00` for none; `0x01` then `T` for some |
//! | tuples of these (up to 5), [`Ordered<T>`] | the elements' encodings in order |
//!
//! The escape is the one FoundationDB's tuple layer uses, with a two-byte end mark (its
//! elements carry a type code, these do not): a string that is a prefix of another ends in
//! `0x00 0x01` where the longer one has a byte `>= 0x01` or the escape `0x00 0xFF`, so the
//! shorter sorts first, as it should.

use super::{CodecError, Decode, Encode};

const CODEC: &str = "ordered key";

fn error(message: impl Into<String>) -> CodecError {
    CodecError {
        codec: CODEC,
        message: message.into(),
    }
}

/// A value that can be an element of an order-preserving key: a tuple element, or the value
/// inside [`Ordered`]. Its encoding is self-delimiting and sorts byte-wise as the value sorts.
pub trait OrderedEncode {
    /// Appends the element's encoding to `out`.
    fn encode_ordered(&self, out: &mut Vec<u8>);
}

/// Reads an element written by [`OrderedEncode`].
pub trait OrderedDecode: Sized {
    /// Reads one element from the front of `input` and moves `input` past it.
    fn decode_ordered(input: &mut &[u8]) -> Result<Self, CodecError>;
}

/// `Self` encodes as `T` does in an order-preserving key: `&str` as `String`, `&[u8]` as
/// `Vec<u8>`, and every element type as itself. It lets a [`Prefix`] be written with
/// borrowed elements: `store.prefix(&("user-1",))` for a `Store<(String, u64), V>`.
pub trait OrderedAs<T: ?Sized>: OrderedEncode {}

impl<T: OrderedEncode + ?Sized> OrderedAs<T> for T {}
impl OrderedAs<String> for str {}
impl OrderedAs<String> for &str {}
impl OrderedAs<String> for &String {}
impl OrderedAs<Vec<u8>> for [u8] {}
impl OrderedAs<Vec<u8>> for &[u8] {}
impl OrderedAs<Vec<u8>> for &Vec<u8> {}

/// `Self` is a leading part of the key type `K`, for [`crate::Store::prefix`]: every key
/// whose leading part equals a prefix value encodes to bytes that start with the prefix's
/// encoding, and no other key does.
///
/// For a tuple key, any leading run of its elements, as a tuple: `(A,)`, `(A, B)`, … of
/// `(A, B, C)`, each element of its own type or one that encodes as it ([`OrderedAs`]). For a
/// `String` key, text the key starts with (`str`, `String`); for a `Vec<u8>` key, bytes.
pub trait Prefix<K>: Encode {}

impl Prefix<String> for str {}
impl Prefix<String> for String {}
impl Prefix<Vec<u8>> for [u8] {}
impl Prefix<Vec<u8>> for Vec<u8> {}
impl<K, P: Prefix<K> + ?Sized> Prefix<K> for &P {}

/// A single value with the order-preserving encoding of a tuple element, as a key or value:
/// `Store<Ordered<i64>, V>` scans its keys in numeric order, negatives first (the plain
/// `i64` codec does not; see [`crate::codec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Ordered<T>(pub T);

impl<T: OrderedEncode> OrderedEncode for Ordered<T> {
    fn encode_ordered(&self, out: &mut Vec<u8>) {
        self.0.encode_ordered(out);
    }
}

impl<T: OrderedDecode> OrderedDecode for Ordered<T> {
    fn decode_ordered(input: &mut &[u8]) -> Result<Self, CodecError> {
        T::decode_ordered(input).map(Ordered)
    }
}

impl<T: OrderedEncode> Encode for Ordered<T> {
    fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
        self.0.encode_ordered(out);
        Ok(())
    }
}

impl<'a, T: OrderedDecode> Decode<'a> for Ordered<T> {
    fn decode(bytes: &'a [u8]) -> Result<Self, CodecError> {
        whole(bytes).map(Ordered)
    }
}

/// Decodes a whole key: one element (a tuple, or the value of an `Ordered`) and nothing after.
fn whole<T: OrderedDecode>(mut bytes: &[u8]) -> Result<T, CodecError> {
    let value = T::decode_ordered(&mut bytes)?;
    if !bytes.is_empty() {
        return Err(error(format!(
            "{} byte(s) left after the last element (a key of another type?)",
            bytes.len()
        )));
    }
    Ok(value)
}

/// The next `n` bytes of `input`, for an element called `what`.
fn take<'a>(input: &mut &'a [u8], n: usize, what: &str) -> Result<&'a [u8], CodecError> {
    if input.len() < n {
        return Err(error(format!("{what} needs {n} byte(s), {} left", input.len())));
    }
    let (head, rest) = input.split_at(n);
    *input = rest;
    Ok(head)
}

impl<T: OrderedEncode + ?Sized> OrderedEncode for &T {
    fn encode_ordered(&self, out: &mut Vec<u8>) {
        (**self).encode_ordered(out)
    }
}

macro_rules! unsigned {
    ($($t:ty),*) => {$(
        impl OrderedEncode for $t {
            fn encode_ordered(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_be_bytes());
            }
        }

        impl OrderedDecode for $t {
            fn decode_ordered(input: &mut &[u8]) -> Result<Self, CodecError> {
                let bytes = take(input, size_of::<$t>(), concat!("a ", stringify!($t)))?;
                Ok(<$t>::from_be_bytes(bytes.try_into().expect("the width of the type")))
            }
        }
    )*};
}

unsigned!(u8, u16, u32, u64, u128);

/// Two's complement with the sign bit flipped: `MIN` becomes all zeros, `-1` sorts just
/// below `0`, `MAX` becomes all ones.
macro_rules! signed {
    ($($t:ty => $u:ty),*) => {$(
        impl OrderedEncode for $t {
            fn encode_ordered(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&((*self as $u) ^ (1 << (<$u>::BITS - 1))).to_be_bytes());
            }
        }

        impl OrderedDecode for $t {
            fn decode_ordered(input: &mut &[u8]) -> Result<Self, CodecError> {
                let bytes = take(input, size_of::<$t>(), concat!("an ", stringify!($t)))?;
                let raw = <$u>::from_be_bytes(bytes.try_into().expect("the width of the type"));
                Ok((raw ^ (1 << (<$u>::BITS - 1))) as $t)
            }
        }
    )*};
}

signed!(i8 => u8, i16 => u16, i32 => u32, i64 => u64, i128 => u128);

impl OrderedEncode for bool {
    fn encode_ordered(&self, out: &mut Vec<u8>) {
        out.push(*self as u8);
    }
}

impl OrderedDecode for bool {
    fn decode_ordered(input: &mut &[u8]) -> Result<Self, CodecError> {
        match take(input, 1, "a bool")?[0] {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(error(format!("a bool is 0x00 or 0x01, not 0x{other:02x}"))),
        }
    }
}

impl<T: OrderedEncode> OrderedEncode for Option<T> {
    fn encode_ordered(&self, out: &mut Vec<u8>) {
        match self {
            None => out.push(0),
            Some(value) => {
                out.push(1);
                value.encode_ordered(out);
            }
        }
    }
}

impl<T: OrderedDecode> OrderedDecode for Option<T> {
    fn decode_ordered(input: &mut &[u8]) -> Result<Self, CodecError> {
        match take(input, 1, "an option")?[0] {
            0 => Ok(None),
            1 => T::decode_ordered(input).map(Some),
            other => Err(error(format!(
                "an option starts with 0x00 (none) or 0x01 (some), not 0x{other:02x}"
            ))),
        }
    }
}

/// Writes variable-length bytes: `0x00` escaped as `0x00 0xFF`, the end marked `0x00 0x01`.
fn encode_escaped(bytes: &[u8], out: &mut Vec<u8>) {
    let mut rest = bytes;
    while let Some(at) = rest.iter().position(|&b| b == 0) {
        out.extend_from_slice(&rest[..at]);
        out.extend_from_slice(&[0x00, 0xFF]);
        rest = &rest[at + 1..];
    }
    out.extend_from_slice(rest);
    out.extend_from_slice(&[0x00, 0x01]);
}

fn decode_escaped(input: &mut &[u8], what: &str) -> Result<Vec<u8>, CodecError> {
    let bytes = *input;
    let mut out = Vec::new();
    let mut from = 0;
    loop {
        let Some(zero) = bytes[from..].iter().position(|&b| b == 0).map(|at| from + at) else {
            return Err(error(format!(
                "{what} has no end mark (0x00 0x01) in the {} byte(s) left",
                bytes.len()
            )));
        };
        out.extend_from_slice(&bytes[from..zero]);
        match bytes.get(zero + 1) {
            Some(0xFF) => {
                out.push(0);
                from = zero + 2;
            }
            Some(0x01) => {
                *input = &bytes[zero + 2..];
                return Ok(out);
            }
            Some(other) => {
                return Err(error(format!(
                    "{what} has 0x00 followed by 0x{other:02x} at its byte {zero} \
                     (0x00 is written 0x00 0xFF, and 0x00 0x01 ends the element)"
                )))
            }
            None => {
                return Err(error(format!(
                    "{what} has no end mark (0x00 0x01) in the {} byte(s) left",
                    bytes.len()
                )))
            }
        }
    }
}

impl OrderedEncode for [u8] {
    fn encode_ordered(&self, out: &mut Vec<u8>) {
        encode_escaped(self, out);
    }
}

impl OrderedEncode for Vec<u8> {
    fn encode_ordered(&self, out: &mut Vec<u8>) {
        encode_escaped(self, out);
    }
}

impl OrderedDecode for Vec<u8> {
    fn decode_ordered(input: &mut &[u8]) -> Result<Self, CodecError> {
        decode_escaped(input, "a byte-string element")
    }
}

impl OrderedEncode for str {
    fn encode_ordered(&self, out: &mut Vec<u8>) {
        encode_escaped(self.as_bytes(), out);
    }
}

impl OrderedEncode for String {
    fn encode_ordered(&self, out: &mut Vec<u8>) {
        encode_escaped(self.as_bytes(), out);
    }
}

impl OrderedDecode for String {
    fn decode_ordered(input: &mut &[u8]) -> Result<Self, CodecError> {
        let bytes = decode_escaped(input, "a string element")?;
        String::from_utf8(bytes).map_err(|e| error(format!("a string element is not UTF-8: {}", e.utf8_error())))
    }
}

impl<const N: usize> OrderedEncode for [u8; N] {
    fn encode_ordered(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self);
    }
}

impl<const N: usize> OrderedDecode for [u8; N] {
    fn decode_ordered(input: &mut &[u8]) -> Result<Self, CodecError> {
        let bytes = take(input, N, "a byte array")?;
        Ok(bytes.try_into().expect("N bytes"))
    }
}

/// Decodes field `index` of a tuple, naming it in the error.
fn field<T: OrderedDecode>(input: &mut &[u8], index: usize) -> Result<T, CodecError> {
    T::decode_ordered(input).map_err(|e| CodecError {
        codec: e.codec,
        message: format!("tuple field .{index}: {}", e.message),
    })
}

macro_rules! tuple {
    ($($T:ident . $i:tt),+) => {
        impl<$($T: OrderedEncode),+> OrderedEncode for ($($T,)+) {
            fn encode_ordered(&self, out: &mut Vec<u8>) {
                $(self.$i.encode_ordered(out);)+
            }
        }

        impl<$($T: OrderedDecode),+> OrderedDecode for ($($T,)+) {
            fn decode_ordered(input: &mut &[u8]) -> Result<Self, CodecError> {
                Ok(($(field::<$T>(input, $i)?,)+))
            }
        }

        /// A tuple key or value: its elements' order-preserving encodings, in order (see
        /// [`crate::codec::ordered`]).
        impl<$($T: OrderedEncode),+> Encode for ($($T,)+) {
            fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), CodecError> {
                self.encode_ordered(out);
                Ok(())
            }
        }

        impl<'a, $($T: OrderedDecode),+> Decode<'a> for ($($T,)+) {
            fn decode(bytes: &'a [u8]) -> Result<Self, CodecError> {
                whole(bytes)
            }
        }
    };
}

tuple!(A.0);
tuple!(A.0, B.1);
tuple!(A.0, B.1, C.2);
tuple!(A.0, B.1, C.2, D.3);
tuple!(A.0, B.1, C.2, D.3, E.4);

/// `($($X,)+)` is a prefix of the key `($($K,)+)`: its elements encode as the key's first ones.
macro_rules! prefix {
    (($($K:ident),+) <- ($($X:ident: $E:ident),+)) => {
        impl<$($K,)+ $($X: OrderedAs<$E>),+> Prefix<($($K,)+)> for ($($X,)+) {}
    };
}

prefix!((A) <- (XA: A));
prefix!((A, B) <- (XA: A));
prefix!((A, B) <- (XA: A, XB: B));
prefix!((A, B, C) <- (XA: A));
prefix!((A, B, C) <- (XA: A, XB: B));
prefix!((A, B, C) <- (XA: A, XB: B, XC: C));
prefix!((A, B, C, D) <- (XA: A));
prefix!((A, B, C, D) <- (XA: A, XB: B));
prefix!((A, B, C, D) <- (XA: A, XB: B, XC: C));
prefix!((A, B, C, D) <- (XA: A, XB: B, XC: C, XD: D));
prefix!((A, B, C, D, E) <- (XA: A));
prefix!((A, B, C, D, E) <- (XA: A, XB: B));
prefix!((A, B, C, D, E) <- (XA: A, XB: B, XC: C));
prefix!((A, B, C, D, E) <- (XA: A, XB: B, XC: C, XD: D));
prefix!((A, B, C, D, E) <- (XA: A, XB: B, XC: C, XD: D, XE: E));

#[cfg(test)]
mod tests {
    use super::*;

    fn encode<T: Encode + ?Sized>(value: &T) -> Vec<u8> {
        let mut out = Vec::new();
        value.encode_into(&mut out).unwrap();
        out
    }

    #[test]
    fn elements_have_the_documented_bytes() {
        assert_eq!(encode(&(1u16, -1i16, true)), [0, 1, 0x7F, 0xFF, 1]);
        assert_eq!(encode(&Ordered(i64::MIN)), [0; 8]);
        assert_eq!(
            encode(&("a\0b", vec![0u8, 0xFF])),
            b"a\x00\xFFb\x00\x01\x00\xFF\xFF\x00\x01"
        );
        assert_eq!(encode(&(None::<u8>, Some(7u8), [9u8, 0])), [0, 1, 7, 9, 0]);
    }

    #[test]
    fn malformed_keys_are_errors_that_say_what_is_wrong() {
        let text = |bytes: &[u8]| <(String, u64)>::decode(bytes).unwrap_err().to_string();
        assert_eq!(
            text(b"ab"),
            "ordered key codec: tuple field .0: a string element has no end mark (0x00 0x01) in the 2 byte(s) left"
        );
        assert_eq!(
            text(b"a\x00\x07"),
            "ordered key codec: tuple field .0: a string element has 0x00 followed by 0x07 at its byte 1 \
             (0x00 is written 0x00 0xFF, and 0x00 0x01 ends the element)"
        );
        assert_eq!(
            text(b"\xFF\x00\x01"),
            "ordered key codec: tuple field .0: a string element is not UTF-8: \
             invalid utf-8 sequence of 1 bytes from index 0"
        );
        assert_eq!(
            text(b"a\x00\x01\x00\x00\x01"),
            "ordered key codec: tuple field .1: a u64 needs 8 byte(s), 3 left"
        );
        assert_eq!(
            text(b"a\x00\x01\x00\x00\x00\x00\x00\x00\x00\x01!"),
            "ordered key codec: 1 byte(s) left after the last element (a key of another type?)"
        );
        assert_eq!(
            <(bool, u8)>::decode(&[2, 0]).unwrap_err().to_string(),
            "ordered key codec: tuple field .0: a bool is 0x00 or 0x01, not 0x02"
        );
        assert_eq!(
            <(u8, (i32, Option<u8>))>::decode(&[1, 0x80, 0, 0, 0, 5]).unwrap_err().to_string(),
            "ordered key codec: tuple field .1: tuple field .1: an option starts with 0x00 (none) or 0x01 (some), not 0x05"
        );
    }

    #[test]
    fn prefixes_are_the_leading_elements_with_borrowed_forms_allowed() {
        fn prefix_bytes<K, P: Prefix<K> + ?Sized>(p: &P) -> Vec<u8> {
            encode(p)
        }
        let key = ("user-1".to_string(), 5u64, true);
        let p = prefix_bytes::<(String, u64, bool), _>(&("user-1",));
        assert!(encode(&key).starts_with(&p));
        // "user-1" is not a prefix of "user-10" as an element: its end mark differs.
        assert!(!encode(&("user-10".to_string(), 5u64, true)).starts_with(&p));
        let p = prefix_bytes::<(String, u64, bool), _>(&("user-1", 5u64));
        assert!(encode(&key).starts_with(&p));
        assert_eq!(prefix_bytes::<String, _>("us"), b"us");
    }
}
