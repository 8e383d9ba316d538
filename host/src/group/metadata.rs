//! What a worker tells the group when it joins, and what the leader sends back: both
//! versioned and compact (the coordinator caps a response near 1 MB, and the leader's
//! JoinGroup response carries every member's metadata).
//!
//! Compatibility: fields are only ever appended, and a reader ignores what follows the
//! fields of its own version. Each member says which version it understands; the leader
//! encodes assignments in the highest version every member understands, so workers of two
//! versions share a group during a rolling upgrade.
//!
//! Signatures: in a cluster with a secret, a member's metadata and the leader's assignments
//! carry an HMAC under it after their fields (a reader without the secret ignores it, as it
//! ignores any field after its version's). A member whose metadata is not signed gets no
//! tasks and is never asked anything; an assignment that is not signed, for this member in
//! this generation, is not applied: a process that joins the cluster's group without the
//! secret can neither take tasks nor hand them out.
//!
//! Versions: 1 — capacity, admin address, active and standby tasks, changelog offset sums.
//! 2 — adds learner tasks and the *leaving* flag (members and assignments).
//! 3 — adds the topologies a member runs (name, partitions, digest, stateful) and its failed
//! tasks with their errors (members).
//! 4 — adds the topologies of several sub-topologies (name, digest, and per sub-topology its
//! name, partitions and whether it keeps state). They are left out of the version-3 list, so
//! a leader of version 3 places none of their tasks (it could not run them either).

use super::codec::{Decoder, Encoder};
use super::{DecodeError, TaskId};
use crate::secret::{ClusterSecret, TAG_BYTES};

/// The newest version this build writes and understands.
pub const CURRENT_VERSION: u16 = 4;
/// The oldest version this build still reads.
pub const OLDEST_VERSION: u16 = 1;

/// A member's metadata in JoinGroup.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemberMetadata {
    /// The version it is encoded in.
    pub version: u16,
    /// The highest version the member understands.
    pub supported: u16,
    /// Stable across restarts (kept in the state directory).
    pub worker_id: [u8; 16],
    /// Stream threads: the share of tasks it should get.
    pub capacity: u32,
    /// Where its admin API listens (`host:port`), empty if none.
    pub admin: String,
    pub active: Vec<TaskId>,
    pub standby: Vec<TaskId>,
    /// Sum of changelog offsets held locally per stateful task (for lag).
    pub offset_sums: Vec<(TaskId, i64)>,
    /// Version 2.
    pub learner: Vec<TaskId>,
    /// Version 2: the worker is scaling down and wants its tasks moved away.
    pub leaving: bool,
    /// Version 3: the topologies this worker can run. `None` when the member's version
    /// predates the field (such a member is taken to run every topology, as before).
    pub topologies: Option<Vec<TopologyInfo>>,
    /// Version 3: tasks that failed on this worker and stay failed, with their errors.
    pub failed: Vec<(TaskId, String)>,
}

/// What a member says about a topology it runs: tasks go only to members whose topology is
/// the same (same partitions, same digest of component and bindings).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopologyInfo {
    pub name: String,
    /// Of a topology of one sub-topology (0 when it has several: see `subs`).
    pub partitions: u32,
    /// SHA-256 of the component and its bindings, first 16 bytes.
    pub digest: [u8; 16],
    /// Whether any of its tasks keeps state.
    pub stateful: bool,
    /// Version 4: its sub-topologies, when it has several (their tasks are
    /// `<topology>/<sub>/<partition>`); empty for a topology of one.
    pub subs: Vec<SubInfo>,
}

/// A sub-topology of a topology of several.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SubInfo {
    pub name: String,
    pub partitions: u32,
    pub stateful: bool,
}

/// Longest error text a member reports per failed task (the metadata must stay compact).
pub const MAX_FAILURE_TEXT: usize = 300;

/// The leader's assignment to one member, in SyncGroup.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Assignment {
    pub version: u16,
    /// 0 = none; see [`AssignmentError`].
    pub error: i16,
    /// Rejoin right after applying this (tasks were revoked and will be handed out).
    pub rejoin: bool,
    pub active: Vec<TaskId>,
    pub standby: Vec<TaskId>,
    pub revoked: Vec<TaskId>,
    /// Version 2.
    pub learner: Vec<TaskId>,
    /// Version 2: the generation this assignment belongs to (for status).
    pub generation: i32,
}

/// Errors a leader can put in an assignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i16)]
pub enum AssignmentError {
    None = 0,
    /// The member's metadata could not be read; it should upgrade or rejoin.
    BadMetadata = 1,
}

fn check_version(d: &Decoder<'_>, version: u16) -> Result<(), DecodeError> {
    if version < OLDEST_VERSION {
        return Err(DecodeError {
            position: d.pos,
            problem: "a metadata version older than this worker reads",
        });
    }
    Ok(())
}

impl MemberMetadata {
    /// Encodes in `version` (at most [`CURRENT_VERSION`]); newer fields are left out.
    pub fn encode(&self, version: u16) -> Vec<u8> {
        let mut e = Encoder::default();
        e.u64(version as u64);
        e.u64(self.supported as u64);
        e.buf.extend_from_slice(&self.worker_id);
        e.u64(self.capacity as u64);
        e.str(&self.admin);
        e.tasks(&self.active);
        e.tasks(&self.standby);
        e.tasks(self.offset_sums.iter().map(|(t, _)| t));
        // Values in the order the task set was written (sorted by topology, partition).
        let mut sums: Vec<&(TaskId, i64)> = self.offset_sums.iter().collect();
        sums.sort_by(|a, b| a.0.cmp(&b.0));
        sums.dedup_by(|a, b| a.0 == b.0);
        for (_, sum) in sums {
            e.i64(*sum);
        }
        if version >= 2 {
            e.tasks(&self.learner);
            e.bool(self.leaving);
        }
        if version >= 3 {
            let topologies = self.topologies.as_deref().unwrap_or(&[]);
            let single = || topologies.iter().filter(|t| t.subs.is_empty());
            e.u64(single().count() as u64);
            for t in single() {
                e.str(&t.name);
                e.u64(t.partitions as u64);
                e.bytes(&t.digest);
                e.bool(t.stateful);
            }
            e.u64(self.failed.len() as u64);
            for (task, error) in &self.failed {
                e.str(&task.unit());
                e.u64(task.partition as u64);
                let mut cut = error.len().min(MAX_FAILURE_TEXT);
                while !error.is_char_boundary(cut) {
                    cut -= 1;
                }
                e.str(&error[..cut]);
            }
        }
        if version >= 4 {
            let topologies = self.topologies.as_deref().unwrap_or(&[]);
            let staged = || topologies.iter().filter(|t| !t.subs.is_empty());
            e.u64(staged().count() as u64);
            for t in staged() {
                e.str(&t.name);
                e.bytes(&t.digest);
                e.u64(t.subs.len() as u64);
                for sub in &t.subs {
                    e.str(&sub.name);
                    e.u64(sub.partitions as u64);
                    e.bool(sub.stateful);
                }
            }
        }
        e.buf
    }

    pub fn decode(buf: &[u8]) -> Result<MemberMetadata, DecodeError> {
        Self::decode_fields(buf).map(|(m, _)| m)
    }

    /// Encoded in `version`, followed by its signature when there is a secret.
    pub fn encode_signed(&self, version: u16, secret: Option<&ClusterSecret>) -> Vec<u8> {
        let mut bytes = self.encode(version);
        if let Some(secret) = secret {
            let tag = secret.sign("member metadata", &[&bytes]);
            bytes.extend_from_slice(&tag);
        }
        bytes
    }

    /// Decoded; with a secret, only if the signature after its fields checks.
    pub fn decode_signed(buf: &[u8], secret: Option<&ClusterSecret>) -> Result<MemberMetadata, DecodeError> {
        let (metadata, used) = Self::decode_fields(buf)?;
        check_signature(buf, used, secret, "member metadata", &[])?;
        Ok(metadata)
    }

    /// The fields, and how many bytes they took.
    fn decode_fields(buf: &[u8]) -> Result<(MemberMetadata, usize), DecodeError> {
        let mut d = Decoder::new(buf);
        let version = d.u64()? as u16;
        check_version(&d, version)?;
        let supported = d.u64()? as u16;
        let mut worker_id = [0u8; 16];
        for b in worker_id.iter_mut() {
            *b = d.bytes_fixed()?;
        }
        let capacity = d.u32()?;
        let admin = d.string()?;
        let active = d.tasks()?;
        let standby = d.tasks()?;
        let sum_tasks = d.tasks()?;
        let mut offset_sums = Vec::with_capacity(sum_tasks.len());
        for task in sum_tasks {
            offset_sums.push((task, d.i64()?));
        }
        let (learner, leaving) = if version >= 2 {
            (d.tasks()?, d.bool()?)
        } else {
            (Vec::new(), false)
        };
        let (mut topologies, mut failed) = (None, Vec::new());
        if version >= 3 {
            let n = d.u64()?;
            let mut list = Vec::new();
            for _ in 0..n {
                let name = d.string()?;
                let partitions = d.u32()?;
                let digest: [u8; 16] = d.bytes()?.try_into().map_err(|_| DecodeError {
                    position: d.pos,
                    problem: "a topology digest that is not 16 bytes",
                })?;
                let stateful = d.bool()?;
                list.push(TopologyInfo {
                    name,
                    partitions,
                    digest,
                    stateful,
                    subs: Vec::new(),
                });
            }
            topologies = Some(list);
            let n = d.u64()?;
            for _ in 0..n {
                let unit = d.string()?;
                let partition = d.u32()?;
                let Some(task) = TaskId::from_unit(&unit, partition) else {
                    return Err(DecodeError {
                        position: d.pos,
                        problem: "a failed task names neither a topology nor a topology and a sub-topology",
                    });
                };
                failed.push((task, d.string()?));
            }
        }
        if version >= 4 {
            let list = topologies.as_mut().expect("version 3 read the list");
            let n = d.u64()?;
            for _ in 0..n {
                let name = d.string()?;
                let digest: [u8; 16] = d.bytes()?.try_into().map_err(|_| DecodeError {
                    position: d.pos,
                    problem: "a topology digest that is not 16 bytes",
                })?;
                let count = d.u64()?;
                if count == 0 || count > buf.len() as u64 {
                    return Err(DecodeError {
                        position: d.pos,
                        problem: "a count of sub-topologies that is zero or larger than the buffer",
                    });
                }
                let mut subs = Vec::new();
                for _ in 0..count {
                    subs.push(SubInfo {
                        name: d.string()?,
                        partitions: d.u32()?,
                        stateful: d.bool()?,
                    });
                }
                list.push(TopologyInfo {
                    name,
                    partitions: 0,
                    digest,
                    stateful: subs.iter().any(|s| s.stateful),
                    subs,
                });
            }
        }
        let used = d.pos;
        Ok((
            MemberMetadata {
                version,
                supported,
                worker_id,
                capacity,
                admin,
                active,
                standby,
                offset_sums,
                learner,
                leaving,
                topologies,
                failed,
            },
            used,
        ))
    }
}

/// With a secret: that `buf` is `used` bytes of fields followed by their signature for
/// `purpose` (over the fields and `context`).
fn check_signature(
    buf: &[u8],
    used: usize,
    secret: Option<&ClusterSecret>,
    purpose: &str,
    context: &[&[u8]],
) -> Result<(), DecodeError> {
    let Some(secret) = secret else { return Ok(()) };
    let (fields, tag) = buf.split_at(used);
    let parts: Vec<&[u8]> = std::iter::once(fields).chain(context.iter().copied()).collect();
    if tag.len() != TAG_BYTES || !secret.verify(purpose, &parts, tag) {
        return Err(DecodeError {
            position: used,
            problem: "not signed with this cluster's secret (registry.secret)",
        });
    }
    Ok(())
}

impl Assignment {
    pub fn encode(&self, version: u16) -> Vec<u8> {
        let mut e = Encoder::default();
        e.u64(version as u64);
        e.i64(self.error as i64);
        e.bool(self.rejoin);
        e.tasks(&self.active);
        e.tasks(&self.standby);
        e.tasks(&self.revoked);
        if version >= 2 {
            e.tasks(&self.learner);
            e.i64(self.generation as i64);
        }
        e.buf
    }

    /// Encoded in `version`, signed with the secret (when there is one) for `member` in
    /// `generation`, so that it is not taken for another member's or another round's.
    pub fn encode_signed(&self, version: u16, secret: Option<&ClusterSecret>, member: &str) -> Vec<u8> {
        let mut bytes = self.encode(version);
        if let Some(secret) = secret {
            let generation = self.generation.to_be_bytes();
            let tag = secret.sign("assignment", &[&bytes, member.as_bytes(), &generation]);
            bytes.extend_from_slice(&tag);
        }
        bytes
    }

    /// Decoded; with a secret, only if it is signed for `member` in `generation`.
    pub fn decode_signed(
        buf: &[u8],
        secret: Option<&ClusterSecret>,
        member: &str,
        generation: i32,
    ) -> Result<Assignment, DecodeError> {
        let (assignment, used) = Self::decode_fields(buf)?;
        let generation = generation.to_be_bytes();
        check_signature(buf, used, secret, "assignment", &[member.as_bytes(), &generation])?;
        Ok(assignment)
    }

    pub fn decode(buf: &[u8]) -> Result<Assignment, DecodeError> {
        Self::decode_fields(buf).map(|(a, _)| a)
    }

    fn decode_fields(buf: &[u8]) -> Result<(Assignment, usize), DecodeError> {
        let mut d = Decoder::new(buf);
        let version = d.u64()? as u16;
        check_version(&d, version)?;
        let error = d.i64()? as i16;
        let rejoin = d.bool()?;
        let active = d.tasks()?;
        let standby = d.tasks()?;
        let revoked = d.tasks()?;
        let (learner, generation) = if version >= 2 {
            (d.tasks()?, d.i64()? as i32)
        } else {
            (Vec::new(), -1)
        };
        let used = d.pos;
        Ok((
            Assignment {
                version,
                error,
                rejoin,
                active,
                standby,
                revoked,
                learner,
                generation,
            },
            used,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tasks(topology: &str, partitions: &[u32]) -> Vec<TaskId> {
        partitions.iter().map(|&p| TaskId::new(topology, p)).collect()
    }

    fn member() -> MemberMetadata {
        MemberMetadata {
            version: 4,
            supported: 4,
            worker_id: [7; 16],
            capacity: 4,
            admin: "127.0.0.1:9100".into(),
            active: tasks("orders", &[0, 3, 9]),
            standby: tasks("clicks", &[1]),
            offset_sums: vec![(TaskId::new("clicks", 1), 1234), (TaskId::new("orders", 0), -1)],
            learner: tasks("orders", &[5]),
            leaving: true,
            topologies: Some(vec![
                TopologyInfo {
                    name: "orders".into(),
                    partitions: 12,
                    digest: [9; 16],
                    stateful: true,
                    subs: Vec::new(),
                },
                TopologyInfo {
                    name: "wc".into(),
                    partitions: 0,
                    digest: [3; 16],
                    stateful: true,
                    subs: vec![
                        SubInfo {
                            name: "split".into(),
                            partitions: 4,
                            stateful: false,
                        },
                        SubInfo {
                            name: "count".into(),
                            partitions: 8,
                            stateful: true,
                        },
                    ],
                },
            ]),
            failed: vec![
                (TaskId::new("orders", 4), "task orders/4 failed: boom".into()),
                (
                    TaskId::of("wc", Some("count"), 6),
                    "task wc/count/6 failed: boom".into(),
                ),
            ],
        }
    }

    #[test]
    fn metadata_round_trips_in_the_current_version() {
        let m = member();
        assert_eq!(MemberMetadata::decode(&m.encode(4)).unwrap(), m);
    }

    #[test]
    fn a_version_3_reader_and_writer_drop_only_the_topologies_of_several_sub_topologies() {
        let m = member();
        let old = MemberMetadata::decode(&m.encode(3)).unwrap();
        let topologies = old.topologies.unwrap();
        assert_eq!(topologies, m.topologies.unwrap()[..1]);
        assert_eq!((old.failed, old.active), (m.failed, m.active));
    }

    #[test]
    fn a_version_2_reader_and_writer_drop_only_the_version_3_fields() {
        let m = member();
        let old = MemberMetadata::decode(&m.encode(2)).unwrap();
        assert_eq!((old.topologies, old.failed), (None, vec![]));
        assert_eq!((old.active, old.learner, old.leaving), (m.active, m.learner, m.leaving));
    }

    #[test]
    fn a_long_failure_is_cut_to_keep_the_metadata_compact() {
        let mut m = member();
        m.failed = vec![(TaskId::new("orders", 1), "é".repeat(400))];
        let back = MemberMetadata::decode(&m.encode(3)).unwrap();
        assert!(back.failed[0].1.len() <= MAX_FAILURE_TEXT);
        assert!(back.failed[0].1.starts_with("éé"));
    }

    #[test]
    fn a_version_1_reader_and_writer_drop_only_the_version_2_fields() {
        let m = member();
        let old = MemberMetadata::decode(&m.encode(1)).unwrap();
        assert_eq!(old.version, 1);
        assert_eq!(
            (old.active.clone(), old.standby.clone(), old.offset_sums.clone()),
            (m.active, m.standby, m.offset_sums)
        );
        assert!(old.learner.is_empty() && !old.leaving);
        let a = Assignment {
            version: 2,
            rejoin: true,
            active: tasks("t", &[1, 2]),
            learner: tasks("t", &[3]),
            generation: 7,
            ..Default::default()
        };
        let old = Assignment::decode(&a.encode(1)).unwrap();
        assert_eq!(
            (old.active, old.rejoin, old.learner, old.generation),
            (a.active.clone(), true, vec![], -1)
        );
        assert_eq!(Assignment::decode(&a.encode(2)).unwrap(), a);
    }

    #[test]
    fn signed_metadata_and_assignments_are_believed_only_with_the_secret() {
        let secret = ClusterSecret::new(b"the cluster secret, long enough".to_vec()).unwrap();
        let other = ClusterSecret::new(b"another cluster's secret, also".to_vec()).unwrap();
        let m = member();
        let signed = m.encode_signed(CURRENT_VERSION, Some(&secret));
        assert_eq!(MemberMetadata::decode_signed(&signed, Some(&secret)).unwrap(), m);
        assert_eq!(
            MemberMetadata::decode(&signed).unwrap(),
            m,
            "a reader without the secret ignores the signature"
        );
        assert!(MemberMetadata::decode_signed(&signed, Some(&other)).is_err());
        assert!(
            MemberMetadata::decode_signed(&m.encode(3), Some(&secret)).is_err(),
            "unsigned"
        );
        let mut forged = signed.clone();
        forged[5] ^= 1;
        assert!(MemberMetadata::decode_signed(&forged, Some(&secret)).is_err());

        let a = Assignment {
            version: 2,
            active: tasks("t", &[1]),
            generation: 9,
            ..Default::default()
        };
        let signed = a.encode_signed(2, Some(&secret), "member-1");
        assert_eq!(
            Assignment::decode_signed(&signed, Some(&secret), "member-1", 9).unwrap(),
            a
        );
        assert!(
            Assignment::decode_signed(&signed, Some(&secret), "member-2", 9).is_err(),
            "another member's"
        );
        assert!(
            Assignment::decode_signed(&signed, Some(&secret), "member-1", 10).is_err(),
            "another round's"
        );
        assert!(Assignment::decode_signed(&a.encode(2), Some(&secret), "member-1", 9).is_err());
        assert_eq!(Assignment::decode_signed(&a.encode(2), None, "member-1", 9).unwrap(), a);
    }

    #[test]
    fn garbage_is_a_decode_error_not_a_panic() {
        let bytes = member().encode(3);
        for cut in 0..bytes.len() {
            let _ = MemberMetadata::decode(&bytes[..cut]);
        }
        let err = MemberMetadata::decode(&[0x80]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "malformed group metadata at byte 1: a varint runs past the end"
        );
        assert!(
            MemberMetadata::decode(&[0]).is_err(),
            "version 0 is older than any reader"
        );
    }
}
