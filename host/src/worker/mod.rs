//! A worker process: loads the topologies it is given, checks them against the cluster,
//! and runs one task per source partition until it is told to stop.
//!
//! Until the worker group lands, a worker owns every partition of its topologies. Source
//! offsets are committed under a consumer group per topology (`sluice-<name>`), so a
//! restarted worker resumes where the last one committed.

pub mod board;
pub mod changelog;
pub mod control;
pub mod delivery;
pub mod group_runner;
mod runner;
pub mod standby;
pub mod stream;
pub mod task;
pub mod task_state;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::manifest::{Binding, Manifest};
use crate::metrics::Metrics;
use crate::runtime::{LoadedTopology, Runtime, RuntimeConfig};
use control::Lease;
use delivery::{DeliveryRouter, WorkerProducer};
pub use runner::{Stopping, TaskRunner, REAP_EVERY};
pub use task::{Ended, Guarantee, TaskError, TaskSettings, TaskSummary};
use task_state::Changelog;

/// Everything a worker is started with.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub bootstrap: String,
    pub manifests: Vec<PathBuf>,
    pub metrics_addr: Option<SocketAddr>,
    pub tasks: TaskSettings,
    pub runtime: RuntimeConfig,
    /// Share tasks with the other workers of this cluster (a Kafka group); none: own them all.
    pub cluster: Option<group_runner::ClusterConfig>,
    /// Where task state (RocksDB stores, checkpoints) lives.
    pub state_dir: PathBuf,
    /// Block cache shared by every store of the worker, in bytes.
    pub state_block_cache: usize,
    /// Memtable budget shared by every store of the worker, in bytes.
    pub state_write_buffers: usize,
    /// Default bytes of state on disk per topology on this worker (`limits.state`).
    pub state_limit: u64,
    /// How changelog topics are created.
    pub changelogs: changelog::ChangelogSettings,
    /// Largest component the admin API takes.
    pub max_component_bytes: usize,
    /// Who may call the admin API (tenants, tokens, limits).
    pub tenancy: crate::tenants::Tenancy,
}

impl WorkerConfig {
    pub fn new(bootstrap: impl Into<String>, manifests: Vec<PathBuf>) -> Self {
        WorkerConfig {
            bootstrap: bootstrap.into(),
            manifests,
            metrics_addr: None,
            tasks: TaskSettings::default(),
            runtime: RuntimeConfig::default(),
            cluster: None,
            state_dir: PathBuf::from("sluice-state"),
            state_block_cache: 64 << 20,
            state_write_buffers: 64 << 20,
            state_limit: 10 << 30,
            changelogs: changelog::ChangelogSettings::default(),
            max_component_bytes: 64 << 20,
            tenancy: Default::default(),
        }
    }
}

/// Consumer events: errors go to the log; nothing else is needed yet.
pub struct ConsumerEvents;

impl ClientContext for ConsumerEvents {}
impl ConsumerContext for ConsumerEvents {}

/// A topology ready to run: compiled, bound to topics, with its consumer.
pub struct DeployedTopology {
    pub name: String,
    pub loaded: LoadedTopology,
    pub binding: Binding,
    /// What happens to a record the topology cannot process.
    pub on_error: crate::manifest::OnError,
    pub partitions: i32,
    /// The changelog of each declared store.
    pub changelogs: Vec<Changelog>,
    /// SHA-256 (first 16 bytes) of the component and its bindings: members compare it to
    /// know they run the same topology.
    pub digest: [u8; 16],
    /// Bytes of state on disk its tasks may keep on this worker, and what each keeps now
    /// (by partition, as of its last commit).
    pub state_limit: u64,
    pub state_usage: std::sync::Mutex<std::collections::HashMap<i32, u64>>,
    /// Most records one task processes per second (`limits.records-per-second`).
    pub records_per_second: Option<u32>,
    /// The group its source offsets are committed in (`sluice-<name>`, or a fresh one after
    /// a deploy that asked to reprocess), and where a partition with nothing committed there
    /// starts.
    pub group: String,
    pub start_from: Option<crate::manifest::StartFrom>,
}

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

/// Loads a topology uploaded to the registry (its component is on disk at `component`).
pub fn load_uploaded(runtime: &Runtime, entry: &crate::registry::Entry, component: &Path) -> anyhow::Result<Loaded> {
    let label = format!("uploaded topology {} (version {})", entry.name, entry.version);
    let mut manifest = Manifest::parse_uploaded(&entry.manifest, &label, component)?;
    entry.cap(&mut manifest.limits);
    manifest.offsets_epoch = entry.offsets_epoch;
    manifest.start_from = entry.reprocess_from;
    load_manifest(runtime, manifest)
}

/// Compiles a manifest's component under its limits and binds it.
fn load_manifest(runtime: &Runtime, manifest: Manifest) -> anyhow::Result<Loaded> {
    let loaded = runtime.load(&manifest.component)?;
    let loaded = loaded
        .with_limits(&manifest.limits)
        .map_err(|m| anyhow::anyhow!("manifest {}: {m}", manifest.path))?;
    let binding = manifest.bind(loaded.description())?;
    Ok((manifest, loaded, binding))
}

/// How topologies are deployed on this worker (changelog creation, defaults).
#[derive(Debug, Clone)]
pub struct DeploySettings {
    pub bootstrap: String,
    pub changelogs: changelog::ChangelogSettings,
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
                deploy(&s.bootstrap, m, loaded, binding, s.changelogs, s.state_limit).map_err(|e| (name, e))
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
        match crate::group::connection::topic_ids(&settings.bootstrap, &topics).await {
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
async fn follow_registry(
    mut updates: tokio::sync::watch::Receiver<Arc<crate::registry::Snapshot>>,
    mut current: BTreeMap<String, u32>,
    static_names: HashSet<String>,
    runtime: Arc<Runtime>,
    settings: DeploySettings,
    changes: tokio::sync::mpsc::UnboundedSender<TopologyChange>,
) {
    while updates.changed().await.is_ok() {
        let snapshot = updates.borrow_and_update().clone();
        let remove: Vec<String> = current
            .keys()
            .filter(|n| !snapshot.entries.contains_key(*n))
            .cloned()
            .collect();
        let wanted: Vec<(crate::registry::Entry, PathBuf)> = snapshot
            .entries
            .values()
            .filter(|(e, _)| !static_names.contains(&e.name) && current.get(&e.name) != Some(&e.version))
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
                .map(|(e, path)| load_uploaded(&rt, e, path).map_err(|err| format!("{err:#}")))
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
            tracing::info!(topology = %name, "deleted from the registry: stopping its tasks");
        }
        for t in &put {
            let version = versions.get(&t.name).copied().unwrap_or(0);
            tracing::info!(topology = %t.name, version, partitions = t.partitions, "deployed from the registry");
            current.insert(t.name.clone(), version);
        }
        if changes.send(TopologyChange { put, remove }).is_err() {
            return;
        }
    }
}

/// Runs a worker until `shutdown` resolves, then stops every task cleanly (finish the
/// batch, flush, commit, close) and returns. Start-up problems (a bad manifest or
/// component, a missing topic, an unreachable cluster) are returned before anything runs.
pub async fn run(
    mut config: WorkerConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<WorkerReport> {
    if config.manifests.is_empty() && config.cluster.is_none() {
        bail!("no topology to run: pass --topology FILE.toml (repeatable), or --cluster NAME to run what is uploaded to the cluster");
    }
    // In a cluster, uploaded topologies come from its registry: read it all before starting.
    let registry = match &config.cluster {
        Some(cluster) => {
            let (bootstrap, name, dir) = (
                config.bootstrap.clone(),
                cluster.name.clone(),
                config.state_dir.join("registry"),
            );
            let watcher = tokio::task::spawn_blocking(move || {
                crate::registry::ensure_topic(&bootstrap, &name)?;
                crate::registry::Watcher::start(&bootstrap, &name, &dir)
            })
            .await?
            .context("reading the cluster's registry of uploaded topologies")?;
            Some(Arc::new(watcher))
        }
        None => None,
    };
    let uploaded = registry.as_ref().map(|r| r.snapshot()).unwrap_or_default();
    // Loading runs guest code (`describe`), which may use WASI: never on an async thread,
    // where wasmtime-wasi's blocking calls would panic.
    let (runtime_config, manifests) = (config.runtime.clone(), config.manifests.clone());
    let (runtime, (mut topologies, mut refused), uploaded_versions) =
        tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            let runtime = Runtime::new(&runtime_config)?;
            let (mut loaded, mut refused) = load_topologies(&runtime, &manifests)?;
            let mut versions = BTreeMap::new();
            for (entry, path) in uploaded.entries.values() {
                if loaded.iter().any(|(m, _, _)| m.name == entry.name) {
                    tracing::warn!(topology = %entry.name, "uploaded, and also given with --topology: running the manifest's");
                    continue;
                }
                match load_uploaded(&runtime, entry, path) {
                    Ok(l) => {
                        versions.insert(entry.name.clone(), entry.version);
                        loaded.push(l);
                    }
                    Err(e) => refused.push(format!("{e:#}")),
                }
            }
            Ok((runtime, (loaded, refused), versions))
        })
        .await??;
    let runtime = Arc::new(runtime);
    let static_names: HashSet<String> = topologies
        .iter()
        .filter(|(m, _, _)| !uploaded_versions.contains_key(&m.name))
        .map(|(m, _, _)| m.name.clone())
        .collect();

    let state = Arc::new(task_state::StateEnv::new(
        config.state_dir.clone(),
        crate::state::rocks::SharedMemory::new(config.state_block_cache, config.state_write_buffers),
    ));
    let metrics = Metrics::new();
    if let Some(addr) = config.metrics_addr {
        let drain = config.cluster.as_ref().and_then(|c| c.drain.clone()).map(|tx| {
            let drain: std::sync::Arc<dyn Fn() -> Result<(), String> + Send + Sync> = std::sync::Arc::new(move || {
                let mut accepted = Ok(());
                tx.send_if_modified(|s| match s {
                    group_runner::Stop::Run => {
                        *s = group_runner::Stop::Drain;
                        tracing::info!("drain requested through the admin endpoint");
                        true
                    }
                    group_runner::Stop::Drain => false,
                    group_runner::Stop::Now => {
                        accepted = Err("this worker is stopping already".to_string());
                        false
                    }
                });
                accepted
            });
            drain
        });
        let admin = match (&registry, &config.cluster) {
            (Some(watcher), Some(cluster)) => {
                let writer = crate::registry::Writer::new(&config.bootstrap, &cluster.name)?;
                Some(crate::admin::router(Arc::new(crate::admin::AdminState {
                    runtime: runtime.clone(),
                    registry: watcher.clone(),
                    writer,
                    bootstrap: config.bootstrap.clone(),
                    cluster: cluster.name.clone(),
                    static_names: static_names.clone(),
                    max_component_bytes: config.max_component_bytes,
                    tenancy: config.tenancy.clone(),
                    state: state.clone(),
                    deploys: Default::default(),
                })))
            }
            _ => None,
        };
        let bound = metrics.clone().serve(addr, drain, admin).await?;
        if let Some(cluster) = config.cluster.as_mut().filter(|c| c.admin.is_empty()) {
            cluster.admin = advertised(bound);
        }
        tracing::info!("metrics on http://{bound}/metrics; POST http://{bound}/drain drains this worker");
    }

    let settings = DeploySettings {
        bootstrap: config.bootstrap.clone(),
        changelogs: config.changelogs,
        state_limit: config.state_limit,
    };
    let (deployed, more_refused) = deploy_all(&settings, std::mem::take(&mut topologies)).await;
    refused.extend(more_refused);
    // One tenant's bad topology keeps no other from running; with none left (and no
    // registry to bring more), there is nothing to do.
    if deployed.is_empty() && registry.is_none() {
        bail!("{}", refused.join("\n"));
    }
    for reason in &refused {
        tracing::error!("not running a topology: {reason}");
    }
    let producer: Arc<WorkerProducer> = Arc::new(
        base_config(&config.bootstrap)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("compression.type", "lz4")
            // Each task has at most `delivery::MAX_IN_FLIGHT` records queued; the queue holds
            // many tasks' worth, so tasks whose sinks are stuck cannot fill it for the rest.
            .set("queue.buffering.max.messages", "1000000")
            // A record that cannot be delivered in two minutes fails its task (alone).
            .set("message.timeout.ms", "120000")
            .create_with_context(DeliveryRouter)
            .context("creating the producer")?,
    );

    let lease = Arc::new(if config.cluster.is_some() {
        Lease::expired()
    } else {
        Lease::forever()
    });
    for t in &deployed {
        tracing::info!(topology = %t.name, partitions = t.partitions, sources = ?t.binding.source_topics, sinks = ?t.binding.sink_topics, "deployed");
    }
    let mut runner = TaskRunner::new(
        lease,
        producer.clone(),
        config.tasks.clone(),
        metrics.clone(),
        config.bootstrap.clone(),
        state,
        deployed,
    )?;

    let report = match &config.cluster {
        None => {
            // Alone: this worker owns every task.
            let all = runner.all_tasks();
            runner.board().all_active(&all);
            runner.start(&all)?;
            tokio::pin!(shutdown);
            loop {
                tokio::select! {
                    _ = &mut shutdown => break,
                    _ = tokio::time::sleep(REAP_EVERY) => { runner.reap()?; }
                }
            }
            tracing::info!("stopping: finishing batches in flight, flushing, committing");
            tokio::task::spawn_blocking(move || runner.stop_all()).await?
        }
        Some(cluster) => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            if let Some(watcher) = &registry {
                tokio::spawn(follow_registry(
                    watcher.updates.clone(),
                    uploaded_versions,
                    static_names,
                    runtime.clone(),
                    settings,
                    tx,
                ));
            }
            group_runner::run(cluster, runner, shutdown, rx).await?
        }
    };
    let report = {
        let mut report = report;
        report.failed.extend(
            refused
                .into_iter()
                .map(|reason| ("(refused topology)".to_string(), reason)),
        );
        if let Err(e) = delivery::flush(&producer, Duration::from_secs(30)) {
            report
                .failed
                .push(("producer".into(), format!("flushing at shutdown: {e}")));
        }
        report
    };
    Ok(report)
}

/// The address to tell others for an endpoint bound at `bound`: this host's name instead
/// of an unspecified address (`0.0.0.0`, `::`).
fn advertised(bound: SocketAddr) -> String {
    if !bound.ip().is_unspecified() {
        return bound.to_string();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    format!("{host}:{}", bound.port())
}

/// How the worker's tasks ended.
#[derive(Debug, Default)]
pub struct WorkerReport {
    pub stopped: Vec<(String, TaskSummary)>,
    pub failed: Vec<(String, String)>,
}

pub(crate) fn base_config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("client.id", "sluice-worker");
    config
}

/// A consumer in a topology's group (`sluice-<topology>`, see [`Manifest::group`]), for its metadata at deploy and,
/// under exactly-once, the group's metadata for offsets committed in transactions. Records
/// are read by the stream threads' consumers (see `stream`).
pub(crate) fn source_consumer(
    bootstrap: &str,
    group: &str,
    prefetch_bytes: usize,
) -> rdkafka::error::KafkaResult<BaseConsumer<ConsumerEvents>> {
    base_config(bootstrap)
        // Used for metadata and the exactly-once group metadata only: a small prefetch.
        .set("queued.max.messages.kbytes", (prefetch_bytes / 1024).max(1).to_string())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "100")
        .create_with_context(ConsumerEvents)
}

/// Checks a topology's topics against the cluster and creates its changelogs.
fn deploy(
    bootstrap: &str,
    manifest: Manifest,
    loaded: LoadedTopology,
    binding: Binding,
    changelog_settings: changelog::ChangelogSettings,
    state_limit: u64,
) -> anyhow::Result<DeployedTopology> {
    let partitions = check_topics(bootstrap, &manifest, &binding, TOPIC_APPEAR_WAIT)?;
    let digest = topology_digest(&manifest, &binding, &loaded.description().stores)?;
    let changelogs = changelog::ensure_changelogs(
        bootstrap,
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

/// Checks that a topology's topics exist (each is looked up for up to `patience`) and its
/// sources have the same number of partitions; returns that number.
pub fn check_topics(
    bootstrap: &str,
    manifest: &Manifest,
    binding: &Binding,
    patience: Duration,
) -> anyhow::Result<i32> {
    // Used here for metadata only; each task creates its own (see task.rs).
    let consumer = source_consumer(bootstrap, &manifest.group(), 1 << 20).context("creating the consumer")?;
    let mut partitions = None;
    let dead_letter: Vec<String> = binding.dead_letter_topic.iter().cloned().collect();
    for (kind, topics) in [
        ("source", &binding.source_topics),
        ("sink", &binding.sink_topics),
        ("dead-letter", &dead_letter),
    ] {
        for topic in topics.iter() {
            let count = partition_count(&consumer, topic, patience).map_err(|e| {
                anyhow::anyhow!(
                    "topology {} (manifest {}): {kind} topic {topic:?}: {e}",
                    manifest.name,
                    manifest.path
                )
            })?;
            if kind == "source" {
                match partitions {
                    None => partitions = Some((topic.clone(), count)),
                    Some((ref first, n)) if n != count => bail!(
                        "topology {}: source topics {first:?} ({n} partitions) and {topic:?} ({count} partitions) \
                         must have the same number of partitions (a task reads the same partition of each)",
                        manifest.name
                    ),
                    Some(_) => {}
                }
            }
        }
    }
    let (_, partitions) = partitions.expect("a topology has at least one source");
    Ok(partitions)
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

/// How long a topic missing from the metadata is looked up again before its topology is
/// refused. A topic created a moment ago reaches each broker's metadata on its own time (a
/// broker that has just restarted, or one starved of CPU, can lag the controller by seconds),
/// so the first "unknown topic" answer is not yet the truth.
const TOPIC_APPEAR_WAIT: Duration = Duration::from_secs(10);

const MISSING_TOPIC: &str = "does not exist; create it first (for example `sluice topics create --partitions 4 TOPIC`)";

fn partition_count(consumer: &BaseConsumer<ConsumerEvents>, topic: &str, patience: Duration) -> Result<i32, String> {
    wait_for_topic(topic, patience, Duration::from_millis(250), || {
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(15))
            .map_err(|e| Lookup::Failed(format!("cannot fetch metadata from Kafka: {e}")))?;
        let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Err(Lookup::Missing);
        };
        match t.error() {
            None if !t.partitions().is_empty() => Ok(t.partitions().len() as i32),
            None => Err(Lookup::Missing),
            Some(e) if RDKafkaErrorCode::from(e) == RDKafkaErrorCode::UnknownTopicOrPartition => Err(Lookup::Missing),
            Some(e) => Err(Lookup::Failed(format!("{}", KafkaError::MetadataFetch(e.into())))),
        }
    })
}

/// One metadata lookup of a topic.
#[derive(Debug)]
enum Lookup {
    /// The broker that answered does not know the topic (yet).
    Missing,
    Failed(String),
}

/// Looks a topic up until it appears or `patience` has passed; only a topic still missing
/// then is reported as missing. Other errors are reported at once.
fn wait_for_topic(
    topic: &str,
    patience: Duration,
    pause: Duration,
    mut lookup: impl FnMut() -> Result<i32, Lookup>,
) -> Result<i32, String> {
    let deadline = std::time::Instant::now() + patience;
    let mut said = false;
    loop {
        match lookup() {
            Ok(n) => return Ok(n),
            Err(Lookup::Failed(e)) => return Err(e),
            Err(Lookup::Missing) if std::time::Instant::now() >= deadline => return Err(MISSING_TOPIC.into()),
            Err(Lookup::Missing) => {
                if !said {
                    tracing::info!(
                        topic,
                        "not in the metadata yet; looking again for up to {}s \
                         (a topic created a moment ago takes a moment to reach every broker)",
                        patience.as_secs()
                    );
                    said = true;
                }
                std::thread::sleep(pause);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_that_appears_late_is_found() {
        let mut calls = 0;
        let found = wait_for_topic("t", Duration::from_secs(5), Duration::from_millis(1), || {
            calls += 1;
            if calls < 3 {
                Err(Lookup::Missing)
            } else {
                Ok(6)
            }
        });
        assert_eq!(found, Ok(6));
        assert_eq!(calls, 3);
    }

    #[test]
    fn a_topic_still_missing_after_the_wait_is_reported_missing() {
        let started = std::time::Instant::now();
        let mut calls = 0;
        let found = wait_for_topic("t", Duration::from_millis(50), Duration::from_millis(5), || {
            calls += 1;
            Err(Lookup::Missing)
        });
        assert_eq!(found, Err(MISSING_TOPIC.to_string()));
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert!(calls > 1, "looked up only once");
    }

    #[test]
    fn a_failed_lookup_is_reported_at_once() {
        let mut calls = 0;
        let found = wait_for_topic("t", Duration::from_secs(5), Duration::from_millis(1), || {
            calls += 1;
            Err(Lookup::Failed("authorization failed".into()))
        });
        assert_eq!(found, Err("authorization failed".to_string()));
        assert_eq!(calls, 1);
    }
}
