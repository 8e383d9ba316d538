//! Values kept with a timestamp (Kafka Streams' `ValueAndTimestamp`): a table's value and an
//! aggregate carry the time Kafka Streams gives them — a table source the time of the
//! record that wrote it, an aggregate the largest time of the records folded into it — so
//! that what goes downstream later (a window sent when it closes, a cached update, a
//! table-table join's result) is stamped as Kafka Streams stamps it.
//!
//! The stored bytes are the value's codec bytes, then the time (8 bytes, big-endian), then
//! [`TAG`]. A value written by an SDK from before this layout has no tag and reads
//! back with no time ([`UNKNOWN`]): the next update stamps it with its record's time, as
//! Kafka Streams does for a store upgraded to timestamps. The tag starts with two bytes
//! that never occur in UTF-8, so no text or JSON value ends with it; a binary value of an
//! older store would have to end with these exact eight bytes to be misread.

/// What ends a stamped value.
pub(crate) const TAG: [u8; 8] = [0xF5, 0xC1, b'S', b'l', b'T', b's', 0x00, 0x01];

/// The bytes a stamp adds to a value.
pub(crate) const STAMP_BYTES: usize = 8 + TAG.len();

/// The time of a value stored without one: smaller than any record's, so that
/// `max(record time, stored time)` is the record's.
pub(crate) const UNKNOWN: i64 = i64::MIN;

/// Appends the stamp of `ts` to an encoded value.
pub(crate) fn push(value: &mut Vec<u8>, ts: i64) {
    value.extend_from_slice(&ts.to_be_bytes());
    value.extend_from_slice(&TAG);
}

/// A stored value's codec bytes and its time ([`UNKNOWN`] for a value stored without one).
pub(crate) fn split(stored: &[u8]) -> (&[u8], i64) {
    match stored.len().checked_sub(STAMP_BYTES) {
        Some(at) if stored[stored.len() - TAG.len()..] == TAG => {
            let ts: [u8; 8] = stored[at..at + 8].try_into().expect("8 bytes");
            (&stored[..at], i64::from_be_bytes(ts))
        }
        _ => (stored, UNKNOWN),
    }
}

/// The time of an update of a value stored at `old` by a record at `ts`: the larger of the
/// two (Kafka Streams' rule for aggregates and joined tables).
pub(crate) fn later(ts: i64, old: Option<i64>) -> i64 {
    old.map_or(ts, |old| old.max(ts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamped_values_read_back_and_unstamped_ones_have_no_time() {
        for (value, ts) in [(&b""[..], 0), (b"abc", 1_700_000_000_000), (b"\xF5\xC1", -5)] {
            let mut stored = value.to_vec();
            push(&mut stored, ts);
            assert_eq!(split(&stored), (value, ts));
        }
        // Written before values had times: the bytes as they are, no time.
        assert_eq!(split(b"12345678"), (&b"12345678"[..], UNKNOWN));
        assert_eq!(split(b""), (&b""[..], UNKNOWN));
        let short = &TAG[1..];
        assert_eq!(split(short), (short, UNKNOWN));
        assert_eq!(later(5, None), 5);
        assert_eq!(later(5, Some(UNKNOWN)), 5);
        assert_eq!(later(5, Some(9)), 9);
        assert_eq!(later(9, Some(5)), 9);
    }
}
