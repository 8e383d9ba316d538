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
//! A member's metadata is public (DescribeGroups shows it to anyone who may describe the
//! group), so its signature binds who sent it and when ([`Binding`]): the group, the member
//! (its `group.instance.id` when it has one, else the member id the coordinator gave it) and
//! the generation it joins from. A copy joined under another member id, in another group or
//! many generations later is not believed.
//!
//! Versions: 1 — capacity, admin address, active and standby tasks, changelog offset sums.
//! 2 — adds learner tasks and the *leaving* flag (members and assignments).
//! 3 — adds the topologies a member runs (name, partitions, digest, stateful) and its failed
//! tasks with their errors (members).
//! 4 — adds the topologies of several sub-topologies (name, digest, and per sub-topology its
//! name, partitions and whether it keeps state). They are left out of the version-3 list, so
//! a leader of version 3 places none of their tasks (it could not run them either).
//! 5 (release 0.3) — adds the member's release and stream threads (members), and the
//! generation's roster, every member's worker id and stream threads (assignments, in groups of
//! at most [`MAX_ROSTER`] members): whoever leads next knows whose transactions a member that
//! vanished may have left open (see `worker::fencing`).
//!
//! Version probing, as Kafka Streams does it: a member first speaks the newest version it
//! knows; a leader that cannot read it (a release before 0.3 checks the signature right after
//! the fields it knows) answers `BadMetadata` in its own version, and the member joins again
//! at once in that version. A leader assigns in the lowest version the members support; a
//! member speaks the version of its last assignment, and once every member supports a newer
//! one (the assignment comes in it) it rejoins once speaking that. A reader of this release
//! reads any newer version: the signature covers everything before it, and fields it does not
//! know are skipped.

use super::codec::{Decoder, Encoder};
use super::{DecodeError, TaskId};
use crate::secret::{ClusterSecret, TAG_BYTES};

/// The newest version this build writes and understands.
pub const CURRENT_VERSION: u16 = 5;
/// The oldest version this build still reads.
pub const OLDEST_VERSION: u16 = 1;
/// The largest group whose assignments carry the roster (each assignment carries every
/// member's worker id: 17 bytes a member, so 64 members add 70 KB to a generation).
pub const MAX_ROSTER: usize = 64;

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
    /// Version 5: the member's release (`sluice --version`); empty when older.
    pub release: String,
    /// Version 5: its stream threads (its transactional ids under exactly-once are
    /// `thread_transactional_id(worker, 0..threads)`); 0 when older.
    pub threads: u32,
    /// Not on the wire: the generation the member's signature says it joins from (-1: a
    /// member new to the group, or a group without a secret), as the leader read it; none
    /// when not read so.
    pub joined_from: Option<i32>,
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
    /// Version 5: every member of the generation (see [`MAX_ROSTER`]); empty when older.
    pub roster: Vec<Rostered>,
}

/// A member of a generation, as its assignment's roster names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rostered {
    pub worker_id: [u8; 16],
    pub threads: u32,
}

impl Rostered {
    /// The roster of a generation of `members` (version 5: every member learns who is in
    /// it, so whoever leads next knows whose transactions a member that vanishes may leave
    /// open), sorted, each worker once.
    pub fn of<'a>(members: impl Iterator<Item = &'a MemberMetadata>) -> Vec<Rostered> {
        let mut roster: Vec<Rostered> = members
            .map(|m| Rostered {
                worker_id: m.worker_id,
                threads: m.threads,
            })
            .collect();
        roster.sort();
        roster.dedup();
        roster
    }
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
        if version >= 5 {
            e.str(&self.release);
            e.u64(self.threads as u64);
        }
        e.buf
    }

    pub fn decode(buf: &[u8]) -> Result<MemberMetadata, DecodeError> {
        Self::decode_fields(buf).map(|(m, _)| m)
    }

    /// Encoded in `version`; with a secret, followed by the generation it joins from and the
    /// signature of both, bound to `binding`.
    pub fn encode_signed(&self, version: u16, secret: Option<&ClusterSecret>, binding: &Binding<'_>) -> Vec<u8> {
        sign_metadata(self.encode(version), secret, binding)
    }

    /// Decoded; with a secret, only if the signature after its fields checks for the group
    /// and member of `binding`. Returns the metadata and the generation the member said it
    /// joined from (`binding.from_generation` is not read: the caller judges the one
    /// returned; -1 without a secret).
    pub fn decode_signed(
        buf: &[u8],
        secret: Option<&ClusterSecret>,
        binding: &Binding<'_>,
    ) -> Result<(MemberMetadata, i32), DecodeError> {
        let (metadata, used) = Self::decode_fields(buf)?;
        let Some(secret) = secret else {
            return Ok((metadata, -1));
        };
        let unsigned = DecodeError {
            position: used,
            problem: "not signed with this cluster's secret (registry.secret) for this member of this group",
        };
        // The generation and the signature close the buffer; before them, the fields of the
        // member's version (of a newer version, some this worker skips).
        let Some(signed_end) = buf.len().checked_sub(4 + TAG_BYTES).filter(|&end| end >= used) else {
            return Err(unsigned);
        };
        if metadata.version <= CURRENT_VERSION && signed_end != used {
            return Err(unsigned);
        }
        let (generation, tag) = buf[signed_end..].split_at(4);
        let parts: [&[u8]; 4] = [
            &buf[..signed_end],
            generation,
            binding.group.as_bytes(),
            binding.member.as_bytes(),
        ];
        if !secret.verify(METADATA_PURPOSE, &parts, tag) {
            return Err(unsigned);
        }
        let from = i32::from_be_bytes(generation.try_into().expect("four bytes"));
        Ok((metadata, from))
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
        let (mut release, mut threads) = (String::new(), 0);
        if version >= 5 {
            release = d.string()?;
            threads = d.u32()?;
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
                release,
                threads,
                joined_from: None,
            },
            used,
        ))
    }
}

/// Encoded metadata `bytes` with, given a secret, the generation it joins from and the
/// signature of both, bound to `binding`.
fn sign_metadata(mut bytes: Vec<u8>, secret: Option<&ClusterSecret>, binding: &Binding<'_>) -> Vec<u8> {
    if let Some(secret) = secret {
        let used = bytes.len();
        bytes.extend_from_slice(&binding.from_generation.to_be_bytes());
        let tag = secret.sign(
            METADATA_PURPOSE,
            &[
                &bytes[..used],
                &bytes[used..],
                binding.group.as_bytes(),
                binding.member.as_bytes(),
            ],
        );
        bytes.extend_from_slice(&tag);
    }
    bytes
}

/// What a member's signed metadata is bound to.
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    /// The group it joins.
    pub group: &'a str,
    /// Its `group.instance.id` when it has one (a static member learns its member id only
    /// from the answer to its first join), else its member id.
    pub member: &'a str,
    /// The generation the member was in when it sent the metadata (-1: none yet).
    pub from_generation: i32,
}

/// The purpose of a member metadata signature (the binding is signed with it since release
/// 0.2.0; the signature of the fields alone, of earlier builds, is not believed).
const METADATA_PURPOSE: &str = "member metadata, bound";
/// The purpose of an assignment's signature (bound to its group too since 0.2.0).
const ASSIGNMENT_PURPOSE: &str = "assignment, bound";

/// How many generations old the generation a member joins from may be: a member that lost
/// a join's answer and asked again may be a few behind, a copy of old metadata many.
pub const BINDING_GENERATIONS: i32 = 10;

/// Whether a member that says it joins from `from` may join generation `generation`: it is
/// new (-1), or it was in one of the last [`BINDING_GENERATIONS`] generations before it.
pub fn fresh_for(from: i32, generation: i32) -> bool {
    from == -1 || (from < generation && generation - from <= BINDING_GENERATIONS)
}

/// With a secret: that `buf` is `used` bytes of fields (of a version newer than this
/// build's, perhaps more it does not know) followed by their signature for `purpose` (over
/// the fields and `context`).
fn check_signature(
    buf: &[u8],
    (used, version): (usize, u16),
    secret: Option<&ClusterSecret>,
    purpose: &str,
    context: &[&[u8]],
) -> Result<(), DecodeError> {
    let Some(secret) = secret else { return Ok(()) };
    let unsigned = DecodeError {
        position: used,
        problem: "not signed with this cluster's secret (registry.secret)",
    };
    let Some(signed_end) = buf.len().checked_sub(TAG_BYTES).filter(|&end| end >= used) else {
        return Err(unsigned);
    };
    if version <= CURRENT_VERSION && signed_end != used {
        return Err(unsigned);
    }
    let (fields, tag) = buf.split_at(signed_end);
    let parts: Vec<&[u8]> = std::iter::once(fields).chain(context.iter().copied()).collect();
    if !secret.verify(purpose, &parts, tag) {
        return Err(unsigned);
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
        if version >= 5 {
            e.u64(self.roster.len() as u64);
            for r in &self.roster {
                e.buf.extend_from_slice(&r.worker_id);
                e.u64(r.threads as u64);
            }
        }
        e.buf
    }

    /// Encoded in `version`, signed with the secret (when there is one) for `member` of
    /// `group` in `generation`, so that it is not taken for another member's, another
    /// round's or another cluster's.
    pub fn encode_signed(&self, version: u16, secret: Option<&ClusterSecret>, group: &str, member: &str) -> Vec<u8> {
        let mut bytes = self.encode(version);
        if let Some(secret) = secret {
            let generation = self.generation.to_be_bytes();
            let tag = secret.sign(
                ASSIGNMENT_PURPOSE,
                &[&bytes, member.as_bytes(), &generation, group.as_bytes()],
            );
            bytes.extend_from_slice(&tag);
        }
        bytes
    }

    /// Decoded; with a secret, only if it is signed for `member` of `group` in `generation`.
    pub fn decode_signed(
        buf: &[u8],
        secret: Option<&ClusterSecret>,
        group: &str,
        member: &str,
        generation: i32,
    ) -> Result<Assignment, DecodeError> {
        let (assignment, used) = Self::decode_fields(buf)?;
        let generation = generation.to_be_bytes();
        check_signature(
            buf,
            (used, assignment.version),
            secret,
            ASSIGNMENT_PURPOSE,
            &[member.as_bytes(), &generation, group.as_bytes()],
        )?;
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
        let mut roster = Vec::new();
        if version >= 5 {
            let n = d.u64()?;
            // At least 17 bytes each: a count larger than what is left is a lie.
            if n > (buf.len() - d.pos) as u64 / 17 {
                return Err(DecodeError {
                    position: d.pos,
                    problem: "a roster longer than the assignment",
                });
            }
            for _ in 0..n {
                let mut worker_id = [0u8; 16];
                for b in worker_id.iter_mut() {
                    *b = d.bytes_fixed()?;
                }
                roster.push(Rostered {
                    worker_id,
                    threads: d.u32()?,
                });
            }
        }
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
                roster,
            },
            used,
        ))
    }
}

#[cfg(test)]
#[path = "metadata_tests.rs"]
mod tests;
