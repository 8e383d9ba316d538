//! The registry of uploaded topologies: a compacted Kafka topic of the cluster, so any
//! worker can take an upload and every worker learns of it by reading the topic.
//!
//! Records, in one partition (so a reader sees a component's chunks before the entry that
//! names it):
//!
//! - `c/<sha256>/<index>`: a chunk of a component (at most [`CHUNK_BYTES`]), addressed by
//!   the SHA-256 of the whole component. Chunks of a digest no entry names any more are
//!   deleted (tombstoned) with the last entry that named them.
//! - `t/<name>`: a topology ([`Entry`], JSON): its manifest text, its component's digest,
//!   size and chunk count, its version. A tombstone deletes it.
//!
//! With a cluster secret (`registry.secret`), every record carries a signature
//! ([`SIGNATURE_HEADER`]); a reader with the secret skips any record without a valid one, so
//! a tenant with write access to the topic cannot forge a tenant or an entry.
//!
//! The registry also holds the tenants an admin created through the API (`n/<name>`), and
//! [`tenants`] is the model of tenants, their tokens, namespaces and caps.
//!
//! A reader ([`Watcher`]) replays the topic from the start, writes each component to disk
//! once all its chunks arrived and their digest checks, and publishes the current entries
//! whenever they change.

pub mod quota;
mod reader;
pub mod sequence;
pub mod tenants;
mod writer;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use reader::{Heal, Shadowed, Watcher};
pub use writer::{ensure_topic, heal, Writer};

use crate::secret::ClusterSecret;

/// The header a registry record's signature travels in (HMAC-SHA256 under the cluster
/// secret, hex).
pub const SIGNATURE_HEADER: &str = "sluice.signature";

/// What a registry record's signature covers: its topic, key and value (or that it is a
/// tombstone), and its sequence ([`sequence`]), so no record signed for one place, meaning
/// or moment passes for another.
fn signed_parts<'a>(topic: &'a str, key: &'a str, value: Option<&'a [u8]>, sequence: &'a [u8]) -> Vec<&'a [u8]> {
    let (kind, value): (&[u8], &[u8]) = match value {
        Some(v) => (b"value", v),
        None => (b"tombstone", b""),
    };
    let mut parts = vec![topic.as_bytes(), key.as_bytes(), kind, value];
    if !sequence.is_empty() {
        parts.push(sequence);
    }
    parts
}

/// A record's signature purpose: records written before sequences (0) were signed without.
fn purpose(sequence: i64) -> &'static str {
    match sequence {
        0 => "registry record",
        _ => "registry record, sequenced",
    }
}

/// The signature of a registry record with `sequence` (0: none).
fn record_signature(secret: &ClusterSecret, topic: &str, key: &str, value: Option<&[u8]>, sequence: i64) -> [u8; 32] {
    let seq = sequence_bytes(sequence);
    secret.sign(purpose(sequence), &signed_parts(topic, key, value, &seq))
}

/// Whether `tag` is a registry record's signature with `sequence` (0: none).
fn record_signed(
    secret: &ClusterSecret,
    topic: &str,
    key: &str,
    value: Option<&[u8]>,
    sequence: i64,
    tag: &[u8],
) -> bool {
    let seq = sequence_bytes(sequence);
    secret.verify(purpose(sequence), &signed_parts(topic, key, value, &seq), tag)
}

fn sequence_bytes(sequence: i64) -> Vec<u8> {
    match sequence {
        0 => Vec::new(),
        s => s.to_be_bytes().to_vec(),
    }
}

/// Most bytes of a component in one record (brokers take 1 MB records by default).
pub const CHUNK_BYTES: usize = 512 * 1024;

/// The registry topic of a cluster.
pub fn topic(cluster: &str) -> String {
    format!("sluice.cluster.{cluster}.registry")
}

/// An uploaded topology as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    /// 1 for the first upload of a name, one more for each upgrade.
    pub version: u32,
    /// The manifest as uploaded (its `component` line, if any, is not used).
    pub manifest: String,
    /// SHA-256 of the component, hex.
    pub digest: String,
    pub size: u64,
    pub chunks: u32,
    /// Milliseconds since the Unix epoch.
    pub uploaded_at_ms: i64,
    /// When its first version was uploaded (ms since the epoch; 0 in entries written before
    /// this field: then `uploaded_at_ms`). A tenant's quota counts its topologies in this
    /// order (see [`quota`]).
    #[serde(default)]
    pub created_at_ms: i64,
    /// As checked at upload: how many tasks it has (of a topology of one sub-topology, its
    /// source topics' partition count), its sub-topologies when it has several, and what
    /// the component declares.
    #[serde(default)]
    pub partitions: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subtopologies: Vec<SubtopologyEntry>,
    /// The names of its internal topics (each is the topic `<name>-<internal>-repartition`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub internal_topics: Vec<String>,
    #[serde(default)]
    pub sources: Vec<String>,
    #[serde(default)]
    pub sinks: Vec<String>,
    #[serde(default)]
    pub stores: Vec<String>,
    /// What the component says of its operators, when it has one sub-topology (see
    /// [`SubtopologyEntry::operators`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operators: Vec<String>,
    /// Who uploaded it: a tenant's name, or `admin`.
    #[serde(default = "admin")]
    pub tenant: String,
    /// Limits its tenant imposes, over what its manifest says (the lower one wins).
    #[serde(flatten)]
    pub caps: tenants::Caps,
    /// The version that last asked to reprocess (0: none): its source offsets are
    /// committed in group `sluice-<name>.v<epoch>`, which starts at `reprocess_from`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub offsets_epoch: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reprocess_from: Option<crate::manifest::StartFrom>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn admin() -> String {
    tenants::ADMIN.to_string()
}

/// A sub-topology of an uploaded topology of several: its partition count, what it reads,
/// writes and keeps (logical names, as the component declares them), and what the component
/// says of its operators (for people: shown by `sluice topologies describe`, never acted on).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SubtopologyEntry {
    pub name: String,
    pub partitions: u32,
    #[serde(default)]
    pub stores: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sinks: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operators: Vec<String>,
}

impl Entry {
    /// When its first version was uploaded, as far as the entry says.
    pub fn first_uploaded_ms(&self) -> i64 {
        match self.created_at_ms {
            0 => self.uploaded_at_ms,
            t => t,
        }
    }

    /// How many partitions the tasks keeping `store` have.
    pub fn store_partitions(&self, store: &str) -> u32 {
        self.subtopologies
            .iter()
            .find(|s| s.stores.iter().any(|s| s == store))
            .map_or(self.partitions, |s| s.partitions)
    }

    /// The topics the host made for it: its changelogs and repartition topics.
    pub fn internal_topic_names(&self) -> Vec<String> {
        let changelogs = self
            .stores
            .iter()
            .map(|s| crate::topology::changelog::changelog_topic(&self.name, s));
        let repartition = self
            .internal_topics
            .iter()
            .map(|t| crate::manifest::repartition_topic(&self.name, t));
        changelogs.chain(repartition).collect()
    }

    /// Its task ids, as checked at upload.
    pub fn tasks(&self) -> Vec<crate::group::TaskId> {
        match self.subtopologies.is_empty() {
            true => (0..self.partitions)
                .map(|p| crate::group::TaskId::new(&self.name, p))
                .collect(),
            false => self
                .subtopologies
                .iter()
                .flat_map(|s| (0..s.partitions).map(|p| crate::group::TaskId::of(&self.name, Some(&s.name), p)))
                .collect(),
        }
    }

    /// The limits it runs under: its manifest's, capped by its tenant's.
    pub fn cap(&self, limits: &mut crate::manifest::Limits) {
        self.caps.apply(limits);
    }
}

/// SHA-256 of `bytes`, hex.
pub fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

fn chunk_key(digest: &str, index: u32) -> String {
    format!("c/{digest}/{index:05}")
}

fn entry_key(name: &str) -> String {
    format!("t/{name}")
}

/// What a record of the registry topic is.
enum Record<'a> {
    Chunk {
        digest: &'a str,
        index: u32,
    },
    Entry {
        name: &'a str,
    },
    /// A tenant an admin created through the API.
    Tenant {
        name: &'a str,
    },
}

fn parse_key(key: &str) -> Option<Record<'_>> {
    if let Some(rest) = key.strip_prefix("c/") {
        let (digest, index) = rest.split_once('/')?;
        return Some(Record::Chunk {
            digest,
            index: index.parse().ok()?,
        });
    }
    if let Some(name) = key.strip_prefix("n/") {
        return Some(Record::Tenant { name });
    }
    key.strip_prefix("t/").map(|name| Record::Entry { name })
}

fn tenant_key(name: &str) -> String {
    format!("n/{name}")
}

/// The registry as a reader has seen it.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Topologies by name, each with the path of its component on disk.
    pub entries: BTreeMap<String, (Entry, PathBuf)>,
    /// Tenants an admin created through the API (the configuration file's are not here).
    pub tenants: BTreeMap<String, tenants::RawTenant>,
    /// Deploys, upgrades and deletes of the last two minutes, through any worker: the tenant
    /// and when (ms since the epoch, as the writing worker's clock had it).
    pub changes: Vec<(String, i64)>,
    /// The offset after the last record read.
    pub position: i64,
}

impl Snapshot {
    /// How many deploys, upgrades and deletes `tenant` made through any worker since
    /// `since` (ms since the epoch).
    pub fn changes_since(&self, tenant: &str, since: i64) -> usize {
        self.changes
            .iter()
            .filter(|(t, at)| t == tenant && *at >= since)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let d = digest(b"hello");
        assert_eq!(d.len(), 64);
        match parse_key(&chunk_key(&d, 7)) {
            Some(Record::Chunk { digest, index }) => assert_eq!((digest, index), (d.as_str(), 7)),
            _ => panic!("not a chunk"),
        }
        match parse_key(&entry_key("shout")) {
            Some(Record::Entry { name }) => assert_eq!(name, "shout"),
            _ => panic!("not an entry"),
        }
        assert!(parse_key("x/y").is_none());
        assert!(parse_key("c/abc/notanumber").is_none());
    }
}
