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
use kafka_protocol::protocol::{Decodable, Encodable};

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
    unframe::<ConsumerProtocolSubscription>(buf, |s| s.user_data)
}

/// Sluice's own assignment bytes from a SyncGroup assignment, framed or not.
pub fn unframe_assignment(buf: &[u8]) -> Result<Cow<'_, [u8]>, DecodeError> {
    unframe::<ConsumerProtocolAssignment>(buf, |a| a.user_data)
}

fn unframe<M: Decodable>(buf: &[u8], user_data: impl Fn(M) -> Option<Bytes>) -> Result<Cow<'_, [u8]>, DecodeError> {
    let fail = |problem| Err(DecodeError { position: 0, problem });
    match buf.first() {
        None => fail("empty"),
        Some(0) => {
            if buf.len() < 2 {
                return fail("the consumer protocol version is cut short");
            }
            let version = i16::from_be_bytes([buf[0], buf[1]]);
            if version < 0 {
                return fail("a negative consumer protocol version");
            }
            let mut rest = Bytes::copy_from_slice(&buf[2..]);
            // A newer version than this build knows still starts with the fields it knows.
            let message = M::decode(&mut rest, version.min(1)).map_err(|_| DecodeError {
                position: 2,
                problem: "not a consumer protocol message",
            })?;
            match user_data(message) {
                Some(data) if !data.is_empty() => Ok(Cow::Owned(data.to_vec())),
                _ => fail("a consumer protocol message without Sluice's user data (not a Sluice member)"),
            }
        }
        Some(_) => Ok(Cow::Borrowed(buf)),
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
