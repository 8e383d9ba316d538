//! The Confluent wire format: a magic byte 0, the schema's id in the registry (4 bytes,
//! big-endian), then the payload; for Protobuf, the indexes of the message within its file
//! (zig-zag varints: a count, then each index; a lone 0 for the file's first message)
//! between the id and the payload.

/// The first byte of every framed record.
pub const MAGIC: u8 = 0;
/// Magic byte and schema id.
pub const HEADER: usize = 5;
/// Most message indexes a Protobuf record may carry (messages nested this deep).
pub const MAX_MESSAGE_INDEXES: usize = 64;

/// Why bytes are not a framed record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("it is empty: a framed record has at least the magic byte 0 and a 4-byte schema id")]
    Empty,
    #[error("{} bytes: too short for the magic byte 0 and a 4-byte schema id", .0)]
    Short(usize),
    #[error(
        "its first byte is {:#04x}, not the magic byte 0 of the Confluent wire format{}",
        .0,
        guess(*.0)
    )]
    NoMagic(u8),
    #[error("its Protobuf message indexes {0}")]
    MessageIndexes(String),
}

/// What the first byte of something not framed suggests it is.
fn guess(first: u8) -> &'static str {
    match first {
        b'{' | b'[' => " (it looks like plain JSON, written without a schema registry serializer)",
        0x20..=0x7e => " (it looks like text, written without a schema registry serializer)",
        _ => "",
    }
}

/// A framed record, split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framed<'a> {
    pub id: u32,
    /// What follows the id (for Protobuf, message indexes first).
    pub rest: &'a [u8],
}

/// Splits `bytes` into schema id and what follows.
pub fn split(bytes: &[u8]) -> Result<Framed<'_>, FramingError> {
    match bytes {
        [] => Err(FramingError::Empty),
        [first, ..] if *first != MAGIC => Err(FramingError::NoMagic(*first)),
        [_, a, b, c, d, rest @ ..] => Ok(Framed {
            id: u32::from_be_bytes([*a, *b, *c, *d]),
            rest,
        }),
        short => Err(FramingError::Short(short.len())),
    }
}

/// Writes the header for schema `id` to `out`.
pub fn write_header(id: u32, out: &mut Vec<u8>) {
    out.push(MAGIC);
    out.extend_from_slice(&id.to_be_bytes());
}

/// Reads the Protobuf message indexes at the start of `rest`: the indexes (`[0]` for the
/// file's first message) and the payload after them.
pub fn message_indexes(rest: &[u8]) -> Result<(Vec<usize>, &[u8]), FramingError> {
    let mut at = 0;
    let count = zigzag(rest, &mut at)?;
    if count == 0 {
        return Ok((vec![0], &rest[at..]));
    }
    if count < 0 || count as usize > MAX_MESSAGE_INDEXES {
        return Err(FramingError::MessageIndexes(format!(
            "start with a count of {count}, not 0 to {MAX_MESSAGE_INDEXES}"
        )));
    }
    let mut indexes = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let index = zigzag(rest, &mut at)?;
        if index < 0 {
            return Err(FramingError::MessageIndexes(format!("hold a negative index ({index})")));
        }
        indexes.push(index as usize);
    }
    Ok((indexes, &rest[at..]))
}

/// Writes Protobuf message indexes (a lone 0 for `[0]`, as Confluent's serializers do).
pub fn write_message_indexes(indexes: &[usize], out: &mut Vec<u8>) {
    if indexes == [0] {
        out.push(0);
        return;
    }
    write_zigzag(indexes.len() as i64, out);
    for &i in indexes {
        write_zigzag(i as i64, out);
    }
}

fn zigzag(bytes: &[u8], at: &mut usize) -> Result<i64, FramingError> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        let Some(&byte) = bytes.get(*at) else {
            return Err(FramingError::MessageIndexes("end before the payload".into()));
        };
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    Err(FramingError::MessageIndexes(
        "hold a varint longer than 10 bytes".into(),
    ))
}

fn write_zigzag(value: i64, out: &mut Vec<u8>) {
    let mut v = ((value << 1) ^ (value >> 63)) as u64;
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_framed_record_splits_into_its_id_and_payload() {
        let mut bytes = Vec::new();
        write_header(0x01020304, &mut bytes);
        bytes.extend_from_slice(b"payload");
        assert_eq!(
            split(&bytes),
            Ok(Framed {
                id: 0x01020304,
                rest: b"payload"
            })
        );
        assert_eq!(split(&[0, 0, 0, 0, 7]), Ok(Framed { id: 7, rest: &[] }));
    }

    #[test]
    fn bytes_not_framed_say_why() {
        assert_eq!(split(&[]), Err(FramingError::Empty));
        assert_eq!(split(&[0, 1, 2]), Err(FramingError::Short(3)));
        let json = split(b"{\"a\":1}").unwrap_err().to_string();
        assert!(json.contains("0x7b") && json.contains("plain JSON"), "{json}");
        let text = split(b"hello").unwrap_err().to_string();
        assert!(text.contains("looks like text"), "{text}");
        let binary = split(&[0xff, 0, 0, 0, 1]).unwrap_err().to_string();
        assert_eq!(
            binary,
            "its first byte is 0xff, not the magic byte 0 of the Confluent wire format"
        );
    }

    #[test]
    fn message_indexes_round_trip_as_confluent_writes_them() {
        for indexes in [vec![0], vec![1], vec![0, 2], vec![3, 0, 1], vec![200]] {
            let mut out = Vec::new();
            write_message_indexes(&indexes, &mut out);
            out.extend_from_slice(b"msg");
            assert_eq!(message_indexes(&out), Ok((indexes.clone(), &b"msg"[..])), "{indexes:?}");
        }
        // The first message is a single 0 byte; [1] is count 1 (2 zig-zagged), index 1 (2).
        let mut out = Vec::new();
        write_message_indexes(&[0], &mut out);
        assert_eq!(out, [0]);
        out.clear();
        write_message_indexes(&[1], &mut out);
        assert_eq!(out, [2, 2]);
    }

    #[test]
    fn hostile_message_indexes_are_refused() {
        // A count of a million, a negative count, a negative index, a varint that never ends.
        let mut out = Vec::new();
        write_zigzag(1_000_000, &mut out);
        assert!(message_indexes(&out).is_err());
        assert!(message_indexes(&[1]).is_err());
        assert!(message_indexes(&[2, 1]).is_err());
        assert!(message_indexes(&[0xff; 12]).is_err());
        assert!(message_indexes(&[]).is_err());
    }
}
