//! Deploys: the topologies a worker runs, from its manifests and from the cluster's
//! registry. Each is loaded (compiled, described, bound), then deployed (topics checked,
//! changelogs created); one that fails is refused alone, with its reason.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::bail;

use crate::kafka::KafkaSettings;
use crate::manifest::{Binding, Manifest};
use crate::registry::tenants::{Tenancy, ADMIN};
use crate::registry::{Entry, Snapshot};
use crate::runtime::{LoadError, LoadedTopology, Runtime};
use crate::topology::{ChangelogSettings, DeployedTopology};

/// A topology this worker will not run, and why (the message names the manifest).
pub type Refused = String;

/// A topology that loaded: its manifest, compiled component and bindings.
pub type Loaded = (Manifest, LoadedTopology, Binding);

/// Loads and checks every manifest and component. A topology that fails is refused alone
/// (returned with its reason); the others load.
pub fn load_topologies(runtime: &Runtime, manifests: &[PathBuf]) -> anyhow::Result<(Vec<Loaded>, Vec<Refused>)> {
    let mut names = HashSet::new();
    let mut out = Vec::new();
    let mut refused = Vec::new();
    for path in manifests {
        let loaded = (|| -> anyhow::Result<_> {
            let manifest = Manifest::load(path)?;
            if !names.insert(manifest.name.clone()) {
                bail!(
                    "manifest {}: another manifest already names the topology {:?}; topology names must be unique",
                    manifest.path,
                    manifest.name
                );
            }
            load_manifest(runtime, manifest)
        })();
        match loaded {
            Ok(topology) => out.push(topology),
            Err(e) => refused.push(format!("{e:#}")),
        }
    }
    Ok((out, refused))
}

/// Loads a topology uploaded to the registry (its component is on disk at `component`),
/// checked again as its upload was: its tenant exists, it is named and bound inside the
/// tenant's namespace, and it runs under the tenant's caps as they are now (and the ones
/// stored with it, the lower winning).
pub fn load_uploaded(runtime: &Runtime, tenancy: &Tenancy, entry: &Entry, component: &Path) -> anyhow::Result<Loaded> {
    let label = format!("uploaded topology {} (version {})", entry.name, entry.version);
    let mut manifest = Manifest::parse_uploaded(&entry.manifest, &label, component)?;
    anyhow::ensure!(
        manifest.name == entry.name,
        "{label}: its manifest names the topology {:?}",
        manifest.name
    );
    if entry.tenant != ADMIN {
        let Some(tenant) = tenancy.tenant(&entry.tenant) else {
            bail!(
                "{label}: its tenant {:?} is not a tenant of this cluster (deleted, or never one)",
                entry.tenant
            );
        };
        tenant
            .check_manifest(&manifest)
            .map_err(|(_, why)| anyhow::anyhow!("{label}: {why}"))?;
        tenant.caps.apply(&mut manifest.limits);
    }
    entry.cap(&mut manifest.limits);
    manifest.offsets_epoch = entry.offsets_epoch;
    manifest.start_from = entry.reprocess_from;
    load_manifest(runtime, manifest)
}

/// Compiles a manifest's component under its limits (its `describe` runs under them too)
/// and binds it.
fn load_manifest(runtime: &Runtime, manifest: Manifest) -> anyhow::Result<Loaded> {
    let shown = manifest.component.display().to_string();
    let bytes = std::fs::read(&manifest.component).map_err(|source| LoadError::Read {
        path: shown.clone(),
        source,
    })?;
    let loaded = runtime
        .load_topology(&manifest.name, &shown, &bytes, &manifest.limits)
        .map_err(|e| match e {
            LoadError::Limits { detail, .. } => anyhow::anyhow!("manifest {}: {detail}", manifest.path),
            other => other.into(),
        })?;
    let binding = manifest.bind(loaded.description())?;
    Ok((manifest, loaded, binding))
}

/// How topologies are deployed on this worker (changelog creation, defaults).
#[derive(Debug, Clone)]
pub struct DeploySettings {
    pub kafka: KafkaSettings,
    pub changelogs: ChangelogSettings,
    pub state_limit: u64,
}

/// Deploys loaded topologies: checks their topics, creates their changelogs and looks up
/// the changelogs' topic ids. Each failure is returned with its reason, alone.
pub async fn deploy_all(settings: &DeploySettings, loaded: Vec<Loaded>) -> (Vec<DeployedTopology>, Vec<Refused>) {
    let s = settings.clone();
    let deploying = match tokio::task::spawn_blocking(move || {
        loaded
            .into_iter()
            .map(|(m, loaded, binding)| {
                let name = m.name.clone();
                crate::topology::deploy(&s.kafka, m, loaded, binding, s.changelogs, s.state_limit)
                    .map_err(|e| (name, e))
            })
            .collect::<Vec<_>>()
    })
    .await
    {
        Ok(results) => results,
        Err(e) => return (Vec::new(), vec![format!("deploying: {e}")]),
    };
    let (mut deployed, mut refused) = (Vec::new(), Vec::new());
    for result in deploying {
        match result {
            Ok(topology) => deployed.push(topology),
            Err((_, e)) => refused.push(format!("{e:#}")),
        }
    }
    // Topic ids tell a changelog that was deleted and created again from the one a store
    // was restored from.
    let topics: Vec<String> = deployed
        .iter()
        .flat_map(|t: &DeployedTopology| t.changelogs.iter().map(|c| c.topic.clone()))
        .collect();
    if !topics.is_empty() {
        match crate::group::connection::topic_ids(&settings.kafka, &topics).await {
            Ok(ids) => {
                for changelog in deployed.iter_mut().flat_map(|t| t.changelogs.iter_mut()) {
                    changelog.topic_id = ids.get(&changelog.topic).cloned().unwrap_or_default();
                }
            }
            Err(e) => {
                for t in deployed.drain(..) {
                    refused.push(format!(
                        "topology {}: looking up the ids of its changelog topics: {e:#}",
                        t.name
                    ));
                }
            }
        }
    }
    (deployed, refused)
}

/// A change to the topologies a worker runs, found in the registry: the group runner stops
/// the tasks of what is removed or replaced, swaps them, and rejoins.
pub struct TopologyChange {
    pub put: Vec<DeployedTopology>,
    pub remove: Vec<String>,
}

/// Follows the registry: loads and deploys what is uploaded or upgraded, and sends each
/// change to the group runner. `current`: the version of each uploaded topology running.
pub async fn follow_registry(
    mut updates: tokio::sync::watch::Receiver<Arc<Snapshot>>,
    mut current: BTreeMap<String, u32>,
    static_names: HashSet<String>,
    runtime: Arc<Runtime>,
    tenancy: Tenancy,
    settings: DeploySettings,
    changes: tokio::sync::mpsc::UnboundedSender<TopologyChange>,
) {
    // The component digest of each uploaded topology running, to forget what a deleted one
    // compiled to.
    let mut digests: BTreeMap<String, String> = updates
        .borrow()
        .entries
        .values()
        .map(|(e, _)| (e.name.clone(), e.digest.clone()))
        .collect();
    // Topologies refused for their tenant's limits (each logged once).
    let mut refused_over: std::collections::BTreeSet<String> = Default::default();
    while updates.changed().await.is_ok() {
        let snapshot = updates.borrow_and_update().clone();
        let in_use = |digest: &str| snapshot.entries.values().any(|(e, _)| e.digest == digest);
        for (name, digest) in std::mem::take(&mut digests) {
            if !in_use(&digest) {
                runtime.forget_compiled(&digest);
            }
            if let Some((e, _)) = snapshot.entries.get(&name) {
                digests.insert(name, e.digest.clone());
            }
        }
        for (e, _) in snapshot.entries.values() {
            digests.entry(e.name.clone()).or_insert_with(|| e.digest.clone());
        }
        // The tenants as they are now: the file's, and those created through the API.
        let tenants = tenancy.with(&snapshot.tenants).unwrap_or_else(|_| tenancy.clone());
        // Uploads that raced past their tenant's limits through several workers at once.
        let over = crate::registry::quota::over_quota(snapshot.entries.values().map(|(e, _)| e), &tenants);
        for (name, reason) in &over {
            if !refused_over.contains(name) {
                tracing::error!("not running an uploaded topology: {reason}");
            }
        }
        refused_over = over.keys().cloned().collect();
        let remove: Vec<String> = current
            .keys()
            .filter(|n| !snapshot.entries.contains_key(*n) || over.contains_key(*n))
            .cloned()
            .collect();
        let wanted: Vec<(Entry, PathBuf)> = snapshot
            .entries
            .values()
            .filter(|(e, _)| {
                !static_names.contains(&e.name)
                    && current.get(&e.name) != Some(&e.version)
                    && !over.contains_key(&e.name)
            })
            .cloned()
            .collect();
        if remove.is_empty() && wanted.is_empty() {
            continue;
        }
        let rt = runtime.clone();
        let versions: BTreeMap<String, u32> = wanted.iter().map(|(e, _)| (e.name.clone(), e.version)).collect();
        let loading = tokio::task::spawn_blocking(move || {
            wanted
                .iter()
                .map(|(e, path)| load_uploaded(&rt, &tenants, e, path).map_err(|err| format!("{err:#}")))
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let mut loaded = Vec::new();
        for result in loading {
            match result {
                Ok(l) => loaded.push(l),
                Err(e) => tracing::error!("not running an uploaded topology: {e}"),
            }
        }
        let (put, refused) = deploy_all(&settings, loaded).await;
        for reason in &refused {
            tracing::error!("not running an uploaded topology: {reason}");
        }
        for name in &remove {
            current.remove(name);
            tracing::info!(topology = %name, "deleted from the registry (or over its tenant's limits): stopping its tasks");
        }
        for t in &put {
            let version = versions.get(&t.name).copied().unwrap_or(0);
            tracing::info!(topology = %t.name, version, tasks = t.tasks().len(), "deployed from the registry");
            current.insert(t.name.clone(), version);
        }
        if changes.send(TopologyChange { put, remove }).is_err() {
            return;
        }
    }
}
