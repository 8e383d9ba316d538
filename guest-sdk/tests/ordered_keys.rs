//! Properties of the order-preserving key codecs: for any two keys the encodings compare as
//! the keys do, every key decodes back to itself, and no bytes make a decoder panic.

use proptest::prelude::*;
use sluice_guest::codec::{Decode, Encode, Ordered};

fn encode<T: Encode>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    value.encode_into(&mut out).expect("ordered encodings do not fail");
    out
}

/// Text dense in the bytes the escaping is about (0x00, 0x01, and multi-byte characters).
fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![Just('\0'), Just('\u{1}'), Just('a'), Just('ÿ'), any::<char>()],
        0..6,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(
        prop_oneof![Just(0u8), Just(1), Just(0xFF), Just(0xFE), any::<u8>()],
        0..6,
    )
}

/// Small and extreme integers, so that pairs are often equal or neighbours.
fn int() -> impl Strategy<Value = i64> {
    prop_oneof![-3i64..3, Just(i64::MIN), Just(i64::MAX), any::<i64>()]
}

/// Checks order, round trip and canonical form for a pair of keys of one type.
fn check<T>(a: &T, b: &T) -> Result<(), TestCaseError>
where
    T: Encode + for<'x> Decode<'x> + Ord + std::fmt::Debug,
{
    let (ea, eb) = (encode(a), encode(b));
    prop_assert_eq!(ea.cmp(&eb), a.cmp(b), "{:?} vs {:?}: {:02x?} vs {:02x?}", a, b, ea, eb);
    prop_assert_eq!(&T::decode(&ea).expect("a key decodes"), a);
    prop_assert_eq!(&T::decode(&eb).expect("a key decodes"), b);
    Ok(())
}

/// Any bytes: an error or a value, never a panic; what decodes encodes back to the same bytes.
fn survive<T>(raw: &[u8]) -> Result<(), TestCaseError>
where
    T: Encode + for<'x> Decode<'x> + std::fmt::Debug,
{
    match T::decode(raw) {
        Ok(value) => prop_assert_eq!(encode(&value), raw, "{:?}", value),
        Err(e) => prop_assert_eq!(e.codec, "ordered key"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn text_and_signed_integers(a in (text(), int()), b in (text(), int())) {
        check(&a, &b)?;
    }

    #[test]
    fn bytes_small_integers_and_bools(
        a in (bytes(), any::<u8>(), any::<bool>()),
        b in (bytes(), any::<u8>(), any::<bool>()),
    ) {
        check(&a, &b)?;
    }

    #[test]
    fn four_integer_widths(a in any::<(i8, i16, i32, u16)>(), b in any::<(i8, i16, i32, u16)>()) {
        check(&a, &b)?;
    }

    #[test]
    fn options_arrays_nesting_and_wide_integers(
        a in (proptest::option::of(text()), any::<[u8; 2]>(), (any::<u32>(), bytes()), any::<i128>(), any::<u64>()),
        b in (proptest::option::of(text()), any::<[u8; 2]>(), (any::<u32>(), bytes()), any::<i128>(), any::<u64>()),
    ) {
        check(&a, &b)?;
    }

    #[test]
    fn ordered_single_values(a in int(), b in int(), s in text(), t in text()) {
        check(&Ordered(a), &Ordered(b))?;
        check(&Ordered(s), &Ordered(t))?;
    }

    #[test]
    fn a_prefix_matches_exactly_the_keys_with_those_leading_elements(
        key in (text(), int()),
        first in text(),
    ) {
        let prefix = encode(&(first.clone(),));
        prop_assert_eq!(encode(&key).starts_with(&prefix), key.0 == first);
    }

    #[test]
    fn decoders_survive_any_bytes(raw in proptest::collection::vec(
        prop_oneof![Just(0u8), Just(1), Just(0xFF), any::<u8>()], 0..24,
    )) {
        survive::<(String, i64)>(&raw)?;
        survive::<(Vec<u8>, u8, bool)>(&raw)?;
        survive::<(Option<String>, [u8; 2], (u32, Vec<u8>))>(&raw)?;
        survive::<Ordered<i16>>(&raw)?;
    }
}
