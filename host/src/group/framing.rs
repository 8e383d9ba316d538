//! How a cluster group's member metadata and assignments look on the wire: framed in
//! Kafka's own consumer protocol, so Kafka's tools (`kafka-consumer-groups.sh --describe`,
//! lag monitors, admin clients) describe a Sluice cluster group as they describe any
//! consumer group, the way Kafka Streams does it.
//!
//! The group's protocol type is `consumer`; a member's metadata is a
//! `ConsumerProtocolSubscription` (no topics) whose user data is Sluice's own metadata
//! (`metadata.rs`, signed), and an assignment a `ConsumerProtocolAssignment` (no partitions)
//! whose user data is Sluice's assignment. Workers of an earlier version joined with the
//! protocol type `sluice` and sent the bytes unframed; both are read: a framed buffer starts
//! with the consumer protocol's 16-bit version (a zero byte), Sluice's own encoding with its
//! version as a varint of at least 1.

use std::borrow::Cow;

use bytes::Bytes;
use kafka_protocol::messages::{ConsumerProtocolAssignment, ConsumerProtocolSubscription};
use kafka_protocol::protocol::Encodable;

use super::DecodeError;

/// The protocol type of cluster groups: Kafka's consumer protocol, which Kafka's tools read.
pub const PROTOCOL_TYPE: &str = "consumer";
/// The protocol type of cluster groups before their metadata was framed. A worker joins
/// with it when the group still has members of that type (a rolling upgrade).
pub const LEGACY_PROTOCOL_TYPE: &str = "sluice";

/// The consumer protocol versions written: the oldest, which every Kafka tool reads.
const SUBSCRIPTION_VERSION: i16 = 0;
const ASSIGNMENT_VERSION: i16 = 0;

/// How a member frames what it sends, by the protocol type it joined with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `consumer`: framed in Kafka's consumer protocol.
    Consumer,
    /// `sluice`: Sluice's own bytes as they are.
    Legacy,
}

impl Framing {
    pub fn protocol_type(self) -> &'static str {
        match self {
            Framing::Consumer => PROTOCOL_TYPE,
            Framing::Legacy => LEGACY_PROTOCOL_TYPE,
        }
    }

    /// Member metadata (Sluice's encoding) as this framing sends it in JoinGroup.
    pub fn metadata(self, sluice: Vec<u8>) -> Vec<u8> {
        match self {
            Framing::Legacy => sluice,
            Framing::Consumer => frame(
                SUBSCRIPTION_VERSION,
                &ConsumerProtocolSubscription::default().with_user_data(Some(Bytes::from(sluice))),
            ),
        }
    }

    /// An assignment (Sluice's encoding) as this framing sends it in SyncGroup.
    pub fn assignment(self, sluice: Vec<u8>) -> Vec<u8> {
        match self {
            Framing::Legacy => sluice,
            Framing::Consumer => frame(
                ASSIGNMENT_VERSION,
                &ConsumerProtocolAssignment::default().with_user_data(Some(Bytes::from(sluice))),
            ),
        }
    }
}

fn frame(version: i16, message: &impl Encodable) -> Vec<u8> {
    let mut buf = bytes::BytesMut::new();
    buf.extend_from_slice(&version.to_be_bytes());
    message
        .encode(&mut buf, version)
        .expect("a consumer protocol message with only user data encodes");
    buf.to_vec()
}

/// Sluice's own metadata bytes from a member's JoinGroup metadata, framed or not.
pub fn unframe_metadata(buf: &[u8]) -> Result<Cow<'_, [u8]>, DecodeError> {
    // ConsumerProtocolSubscription: topics (array of strings), then user data.
    unframe(buf, |r| {
        for _ in 0..r.count()? {
            r.string()?;
        }
        Ok(())
    })
}

/// Sluice's own assignment bytes from a SyncGroup assignment, framed or not.
pub fn unframe_assignment(buf: &[u8]) -> Result<Cow<'_, [u8]>, DecodeError> {
    // ConsumerProtocolAssignment: partitions (array of topic, array of i32), then user data.
    unframe(buf, |r| {
        for _ in 0..r.count()? {
            r.string()?;
            let partitions = r.count()?;
            r.take(partitions as usize * 4, "a partition list is cut short")?;
        }
        Ok(())
    })
}

/// Reads the consumer protocol's framing by hand, checking every length against what is
/// left: the bytes come from other members (anyone who can join the group), and a decoder
/// that reserves room for a claimed count would let four bytes claim 2^31 topics.
fn unframe<'a>(
    buf: &'a [u8],
    skip_to_user_data: impl FnOnce(&mut Framed<'a>) -> Result<(), DecodeError>,
) -> Result<Cow<'a, [u8]>, DecodeError> {
    match buf.first() {
        None => Err(DecodeError {
            position: 0,
            problem: "empty",
        }),
        // Every version starts with these fields (consumer protocol messages have no
        // tagged fields); what a newer version appends after the user data is ignored.
        Some(0) => {
            let mut r = Framed { buf, at: 0 };
            if r.i16()? < 0 {
                return Err(r.fail("a negative consumer protocol version"));
            }
            skip_to_user_data(&mut r)?;
            let len = r.i32()?;
            if len <= 0 {
                return Err(r.fail("a consumer protocol message without Sluice's user data (not a Sluice member)"));
            }
            Ok(Cow::Borrowed(r.take(len as usize, "the user data is cut short")?))
        }
        Some(_) => Ok(Cow::Borrowed(buf)),
    }
}

const CUT_SHORT: &str = "not a consumer protocol message (cut short)";

/// A cursor over a consumer protocol message (big-endian, lengths checked).
struct Framed<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Framed<'a> {
    fn fail(&self, problem: &'static str) -> DecodeError {
        DecodeError {
            position: self.at,
            problem,
        }
    }

    /// The next `n` bytes; `short` is the error when fewer are left.
    fn take(&mut self, n: usize, short: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() - self.at < n {
            return Err(self.fail(short));
        }
        let out = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    fn i16(&mut self) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(self.take(2, CUT_SHORT)?.try_into().unwrap()))
    }

    fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(self.take(4, CUT_SHORT)?.try_into().unwrap()))
    }

    /// An array's count; negative (null) counts as none.
    fn count(&mut self) -> Result<u32, DecodeError> {
        Ok(self.i32()?.max(0) as u32)
    }

    fn string(&mut self) -> Result<(), DecodeError> {
        let len = self.i16()?;
        self.take(len.max(0) as usize, CUT_SHORT)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::metadata::{Assignment, MemberMetadata, CURRENT_VERSION};
    use crate::group::TaskId;

    #[test]
    fn framed_and_legacy_bytes_both_read_back() {
        let meta = MemberMetadata {
            version: CURRENT_VERSION,
            supported: CURRENT_VERSION,
            capacity: 2,
            admin: "127.0.0.1:9100".into(),
            active: vec![TaskId::new("wc", 3)],
            topologies: Some(vec![]),
            ..Default::default()
        };
        let sluice = meta.encode(CURRENT_VERSION);
        for framing in [Framing::Consumer, Framing::Legacy] {
            let wire = framing.metadata(sluice.clone());
            assert_eq!(wire[0] == 0, framing == Framing::Consumer);
            let back = unframe_metadata(&wire).unwrap();
            assert_eq!(MemberMetadata::decode(&back).unwrap(), meta);
        }
        let assignment = Assignment {
            active: vec![TaskId::new("wc", 1)],
            generation: 7,
            ..Default::default()
        };
        let sluice = assignment.encode(CURRENT_VERSION);
        for framing in [Framing::Consumer, Framing::Legacy] {
            let back = unframe_assignment(&framing.assignment(sluice.clone()))
                .unwrap()
                .into_owned();
            assert_eq!(Assignment::decode(&back).unwrap().active, assignment.active);
        }
    }

    #[test]
    fn the_framing_is_kafkas_consumer_protocol_byte_for_byte() {
        // What Java's ConsumerProtocol.serializeSubscription writes for a subscription to no
        // topics with user data [1, 2, 3] at version 0: version, topic count, user data.
        let wire = Framing::Consumer.metadata(vec![1, 2, 3]);
        assert_eq!(wire, [0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 1, 2, 3]);
        // And an assignment of no partitions with the same user data.
        let wire = Framing::Consumer.assignment(vec![1, 2, 3]);
        assert_eq!(wire, [0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 1, 2, 3]);
    }

    #[test]
    fn claimed_counts_and_lengths_larger_than_the_buffer_are_refused_without_allocating() {
        // Four bytes claiming 2^31 - 1 topics (a decoder that reserves room for them first
        // aborts the worker), then a user data length past the end.
        let e = unframe_metadata(&[0, 0, 0x7f, 0xff, 0xff, 0xff]).unwrap_err();
        assert_eq!(e.problem, "not a consumer protocol message (cut short)");
        let e = unframe_assignment(&[0, 0, 0, 0, 0, 1, 0, 1, b't', 0x7f, 0xff, 0xff, 0xff]).unwrap_err();
        assert_eq!(e.problem, "a partition list is cut short");
        let e = unframe_metadata(&[0, 0, 0, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff, 1]).unwrap_err();
        assert_eq!(e.problem, "the user data is cut short");
    }

    #[test]
    fn a_real_consumers_metadata_is_refused_by_name() {
        // A Java consumer's subscription (version 1, one topic "t", no user data) joined
        // by mistake: it is no Sluice member.
        let mut buf = vec![0, 1, 0, 0, 0, 1, 0, 1, b't', 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0];
        let e = unframe_metadata(&buf).unwrap_err();
        assert!(e.problem.contains("not a Sluice member"), "{e:?}");
        buf.truncate(1);
        assert!(unframe_metadata(&buf).is_err());
        assert!(unframe_metadata(&[]).is_err());
    }
}
