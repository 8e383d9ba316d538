//! The wire format against a simple model: round trips, and bad input refused, never
//! trusted (property tests).

use proptest::prelude::*;

use super::*;

type Fields = Option<Vec<u8>>;
type AnyHeaders = Vec<(Vec<u8>, Fields)>;
/// key, value, timestamp, source, partition, offset, headers
type AnyInput = (Fields, Fields, i64, u32, i32, i64, AnyHeaders);

fn any_input() -> impl Strategy<Value = AnyInput> {
    let bytes = || proptest::collection::vec(any::<u8>(), 0..12);
    (
        proptest::option::of(bytes()),
        proptest::option::of(bytes()),
        any::<i64>(),
        any::<u32>(),
        any::<i32>(),
        any::<i64>(),
        proptest::collection::vec((bytes(), proptest::option::of(bytes())), 0..3),
    )
}

fn headers(list: &AnyHeaders) -> Vec<Header<'_>> {
    list.iter()
        .map(|(name, value)| Header {
            name,
            value: value.as_deref(),
        })
        .collect()
}

fn header_list(headers: Headers<'_>) -> AnyHeaders {
    headers
        .iter()
        .map(|h| (h.name.to_vec(), h.value.map(<[u8]>::to_vec)))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever the writer writes, as inputs or as emitted records, decodes to the same fields.
    #[test]
    fn any_records_decode_to_what_was_written(records in proptest::collection::vec(any_input(), 0..6)) {
        let mut w = Writer::new();
        for (key, value, timestamp, source, partition, offset, list) in &records {
            let hs = headers(list);
            w.push_input(key.as_deref(), value.as_deref(), *timestamp, *source, *partition, *offset, hs.into_iter());
        }
        let buf = w.take();
        let decoded: Vec<Input<'_>> = inputs(&buf).unwrap().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(decoded.len(), records.len());
        for (got, (key, value, timestamp, source, partition, offset, list)) in decoded.iter().zip(&records) {
            prop_assert_eq!((got.key, got.value), (key.as_deref(), value.as_deref()));
            prop_assert_eq!((got.timestamp, got.source, got.partition, got.offset), (*timestamp, *source, *partition, *offset));
            prop_assert_eq!(&header_list(got.headers), list);
        }
        for (key, value, timestamp, source, _, _, list) in &records {
            let hs = headers(list);
            w.push_emitted(*source, key.as_deref(), value.as_deref(), *timestamp, hs.into_iter());
        }
        let decoded: Vec<Emitted<'_>> = emitted(w.as_bytes()).unwrap().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(decoded.len(), records.len());
        for (got, (key, value, timestamp, source, _, _, list)) in decoded.iter().zip(&records) {
            prop_assert_eq!((got.sink, got.key, got.value, got.timestamp), (*source, key.as_deref(), value.as_deref(), *timestamp));
            prop_assert_eq!(&header_list(got.headers), list);
        }
    }
}

#[test]
fn inputs_round_trip() {
    let mut w = Writer::new();
    let headers = [
        Header {
            name: b"h1",
            value: Some(b"v1"),
        },
        Header {
            name: b"h2",
            value: None,
        },
    ];
    w.push_input(Some(b"k"), Some(b"value"), 42, 1, 3, 1000, headers.iter().copied());
    w.push_input(None, None, -1, 0, 0, 0, std::iter::empty());
    let buf = w.take();
    let got: Vec<Input<'_>> = inputs(&buf).unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].key, Some(&b"k"[..]));
    assert_eq!(got[0].value, Some(&b"value"[..]));
    assert_eq!(
        (got[0].timestamp, got[0].source, got[0].partition, got[0].offset),
        (42, 1, 3, 1000)
    );
    assert_eq!(got[0].headers.iter().collect::<Vec<_>>(), headers);
    assert_eq!(got[0].headers.get("h2"), Some(None));
    assert_eq!((got[1].key, got[1].value, got[1].headers.len()), (None, None, 0));
    assert!(w.is_empty());
}

#[test]
fn emitted_round_trip_with_fields_encoded_in_place() {
    let mut w = Writer::new();
    w.begin_emitted(2);
    let at = w.begin_field();
    w.field_buffer().extend_from_slice(b"key");
    w.end_field(at);
    w.none_field();
    w.finish_emitted(INHERIT_TIMESTAMP, std::iter::empty());
    w.push_emitted(0, None, Some(b"v"), 7, std::iter::empty());
    let got: Vec<_> = emitted(w.as_bytes()).unwrap().collect::<Result<_, _>>().unwrap();
    assert_eq!(got[0].sink, 2);
    assert_eq!(got[0].key, Some(&b"key"[..]));
    assert_eq!(got[0].value, None);
    assert_eq!(got[0].timestamp, INHERIT_TIMESTAMP);
    assert_eq!((got[1].sink, got[1].value, got[1].timestamp), (0, Some(&b"v"[..]), 7));
}

#[test]
fn truncated_and_trailing_bytes_are_errors_with_positions() {
    let mut w = Writer::new();
    w.push_input(Some(b"key"), Some(b"value"), 1, 0, 0, 0, std::iter::empty());
    let buf = w.take();
    // Cut into the last field, the header count.
    let cut = &buf[..buf.len() - 3];
    let err = inputs(cut).unwrap().next().unwrap().unwrap_err();
    assert_eq!(err.expected, "a u32");
    assert_eq!(err.position, buf.len() - 4);
    assert_eq!(
        err.to_string(),
        format!("malformed record buffer at byte {}: expected a u32", buf.len() - 4)
    );
    // Cut into the offset.
    let err = inputs(&buf[..buf.len() - 8]).unwrap().next().unwrap().unwrap_err();
    assert_eq!(err.expected, "an s64");

    let mut long = buf.clone();
    long.push(0);
    let mut it = inputs(&long).unwrap();
    assert!(it.next().unwrap().is_ok());
    assert_eq!(it.next().unwrap().unwrap_err().expected, "the end of the buffer");
    assert!(it.next().is_none());

    let mut huge = buf.clone();
    huge[4..8].copy_from_slice(&(u32::MAX - 1).to_le_bytes());
    assert!(inputs(&huge).unwrap().next().unwrap().is_err());
}
