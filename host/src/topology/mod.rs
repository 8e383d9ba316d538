//! A topology deployed on this worker: compiled, bound to topics checked against the
//! cluster, with its changelogs created and its digest taken. What the task, the threads
//! and the worker share about a topology lives here, below all three.

pub mod changelog;
pub mod topics;

use std::collections::HashMap;
use std::sync::Mutex;

use anyhow::Context as _;

use crate::kafka::KafkaSettings;
use crate::manifest::{Binding, Manifest, OnError, StartFrom};
use crate::runtime::LoadedTopology;
pub use changelog::{Changelog, ChangelogSettings};
pub use topics::{check_topics, source_consumer, TOPIC_APPEAR_WAIT};

/// A topology ready to run: compiled, bound to topics, with its changelogs.
pub struct DeployedTopology {
    pub name: String,
    pub loaded: LoadedTopology,
    pub binding: Binding,
    /// What happens to a record the topology cannot process.
    pub on_error: OnError,
    pub partitions: i32,
    /// The changelog of each declared store.
    pub changelogs: Vec<Changelog>,
    /// SHA-256 (first 16 bytes) of the component and its bindings: members compare it to
    /// know they run the same topology.
    pub digest: [u8; 16],
    /// Bytes of state on disk its tasks may keep on this worker, and what each keeps now
    /// (by partition, as of its last commit).
    pub state_limit: u64,
    pub state_usage: Mutex<HashMap<i32, u64>>,
    /// Most records one task processes per second (`limits.records-per-second`).
    pub records_per_second: Option<u32>,
    /// The group its source offsets are committed in (`sluice-<name>`, or a fresh one after
    /// a deploy that asked to reprocess), and where a partition with nothing committed there
    /// starts.
    pub group: String,
    pub start_from: Option<StartFrom>,
}

/// Checks a topology's topics against the cluster and creates its changelogs (their topic
/// ids are filled in by the caller, for all topologies at once).
pub fn deploy(
    kafka: &KafkaSettings,
    manifest: Manifest,
    loaded: LoadedTopology,
    binding: Binding,
    changelog_settings: ChangelogSettings,
    state_limit: u64,
) -> anyhow::Result<DeployedTopology> {
    check_state_limit(&manifest, state_limit)
        .map_err(|e| anyhow::anyhow!("topology {} (manifest {}): {e}", manifest.name, manifest.path))?;
    let partitions = check_topics(kafka, &manifest, &binding, TOPIC_APPEAR_WAIT)?;
    let digest = topology_digest(&manifest, &binding, &loaded.description().stores)?;
    let changelogs = changelog::ensure_changelogs(
        kafka,
        &manifest.name,
        &loaded.description().stores,
        partitions,
        changelog_settings,
    )
    .map_err(|e| anyhow::anyhow!("topology {} (manifest {}): {e:#}", manifest.name, manifest.path))?;
    Ok(DeployedTopology {
        state_limit: manifest.limits.state.unwrap_or(state_limit),
        state_usage: Default::default(),
        records_per_second: manifest.limits.records_per_second,
        group: manifest.group(),
        start_from: manifest.start_from,
        name: manifest.name,
        loaded,
        on_error: manifest.on_error,
        binding,
        partitions,
        changelogs,
        digest,
    })
}

/// A manifest may only lower the worker's state limit (bytes on disk of a topology's tasks
/// on one worker).
pub fn check_state_limit(manifest: &Manifest, worker_limit: u64) -> Result<(), String> {
    match manifest.limits.state {
        Some(asked) if asked > worker_limit => Err(format!(
            "limits.state ({asked} bytes) is more than the worker allows ({worker_limit} bytes, its --state-limit): a \
             manifest may only lower the worker's limits"
        )),
        _ => Ok(()),
    }
}

/// What makes two deployments of a topology the same: the component's bytes and the topics
/// and stores it is bound to.
fn topology_digest(manifest: &Manifest, binding: &Binding, stores: &[String]) -> anyhow::Result<[u8; 16]> {
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(&manifest.component)
        .with_context(|| format!("reading component {}", manifest.component.display()))?;
    let mut hash = Sha256::new();
    hash.update(&bytes);
    for list in [&binding.source_topics, &binding.sink_topics, &stores.to_vec()] {
        hash.update((list.len() as u64).to_le_bytes());
        for item in list.iter() {
            hash.update((item.len() as u64).to_le_bytes());
            hash.update(item.as_bytes());
        }
    }
    let full = hash.finalize();
    let mut digest = [0u8; 16];
    digest.copy_from_slice(&full[..16]);
    Ok(digest)
}
