//! A worker process: loads the topologies it is given (and, in a cluster, what is uploaded
//! to the cluster's registry), checks them against the cluster, and runs their tasks until
//! it is told to stop — all of them alone, or its share of them in a cluster.
//!
//! Source offsets are committed under a consumer group per topology (`sluice-<name>`), so a
//! restarted worker resumes where the last one committed. The worker knows no admin API:
//! the binary starts one beside it and hands it the worker's [`WorkerHandle`].

pub mod board;
pub mod deploys;
pub mod group_runner;
pub mod handle;
mod heartbeats;
mod intruders;
mod learners;
mod runner;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};

use crate::kafka::KafkaSettings;
use crate::metrics::Metrics;
use crate::registry::tenants::Tenancy;
use crate::registry::Watcher;
use crate::runtime::{Runtime, RuntimeConfig};
use crate::secret::ClusterSecret;
use crate::state::dir::StateDir;
use crate::task::control::{Fence, Lease};
use crate::task::delivery::{self, SharedProducer};
use crate::task::{TaskSettings, TaskSummary};
use crate::topology::ChangelogSettings;
use board::{Board, BoardMetrics};
use deploys::{deploy_all, follow_registry, load_topologies, load_uploaded, DeploySettings, Loaded, Refused};
pub use handle::WorkerHandle;
pub use runner::{Handovers, Stopping, TaskRunner, REAP_EVERY};

/// Everything a worker is started with.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub kafka: KafkaSettings,
    pub manifests: Vec<PathBuf>,
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
    pub changelogs: ChangelogSettings,
    /// The configuration file's tenants: an uploaded topology runs only as its tenant may.
    pub tenancy: Tenancy,
    /// The cluster secret: registry records and group messages are believed only when
    /// signed with it (`registry.secret`).
    pub secret: Option<ClusterSecret>,
    /// The Schema Registry topologies with formats read and write through (`registry.url`
    /// and the rest): none, and such a topology's records cannot be read.
    pub schema_registry: Option<crate::formats::RegistrySettings>,
    /// Bytes of schemas the worker keeps (`registry.cache-bytes`).
    pub schema_cache_bytes: usize,
}

impl WorkerConfig {
    pub fn new(kafka: KafkaSettings, manifests: Vec<PathBuf>) -> Self {
        WorkerConfig {
            kafka,
            manifests,
            tasks: TaskSettings::default(),
            runtime: RuntimeConfig::default(),
            cluster: None,
            state_dir: PathBuf::from("sluice-state"),
            state_block_cache: 64 << 20,
            state_write_buffers: 64 << 20,
            state_limit: 10 << 30,
            changelogs: ChangelogSettings::default(),
            tenancy: Tenancy::default(),
            secret: None,
            schema_registry: None,
            schema_cache_bytes: 64 << 20,
        }
    }
}

/// How the worker's tasks ended.
#[derive(Debug, Default)]
pub struct WorkerReport {
    pub stopped: Vec<(String, TaskSummary)>,
    pub failed: Vec<(String, String)>,
}

/// A worker that has read its registry and loaded its topologies, not yet running them.
pub struct Worker {
    config: WorkerConfig,
    registry: Option<Arc<Watcher>>,
    runtime: Arc<Runtime>,
    loaded: Vec<Loaded>,
    refused: Vec<Refused>,
    /// The version of each uploaded topology loaded.
    uploaded_versions: BTreeMap<String, u32>,
    /// Topologies given with `--topology` (an upload cannot replace them).
    static_names: HashSet<String>,
    state: Arc<StateDir>,
    metrics: Metrics,
    board: Arc<Board>,
    /// The worker's schema registry client and cache, shared by its tasks.
    schemas: crate::formats::Schemas,
}

impl Worker {
    /// Reads the cluster's registry (in a cluster), compiles and checks every topology, and
    /// opens the worker's metrics and state. Start-up problems (a bad manifest or component,
    /// an unreachable cluster) are returned before anything runs.
    pub async fn start(config: WorkerConfig) -> anyhow::Result<Worker> {
        if config.manifests.is_empty() && config.cluster.is_none() {
            bail!("no topology to run: pass --topology FILE.toml (repeatable), or --cluster NAME to run what is uploaded to the cluster");
        }
        // Credentials, certificates and addresses, checked once before any client retries.
        crate::group::connection::check_brokers(&config.kafka, Duration::from_secs(60))
            .await
            .context("connecting to Kafka")?;
        let board_metrics = BoardMetrics::new();
        let schema_counters = crate::formats::cache::Counters::default();
        let metrics = Metrics::with(|registry| {
            board_metrics.register(registry);
            schema_counters.register(registry);
        });
        // In a cluster, uploaded topologies come from its registry: read it all before starting.
        let registry = match &config.cluster {
            Some(cluster) => {
                let (kafka, name, dir, secret, rejected) = (
                    config.kafka.clone(),
                    cluster.name.clone(),
                    config.state_dir.join("registry"),
                    config.secret.clone(),
                    metrics.registry_rejected.clone(),
                );
                let watcher = tokio::task::spawn_blocking(move || {
                    crate::registry::ensure_topic(&kafka, &name)?;
                    Watcher::start(&kafka, &name, &dir, secret, rejected)
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
        let tenancy = config.tenancy.clone();
        let (runtime, (loaded, refused), uploaded_versions) =
            tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
                let runtime = Runtime::new(&runtime_config)?;
                let (mut loaded, mut refused) = load_topologies(&runtime, &manifests)?;
                let mut versions = BTreeMap::new();
                let tenancy = tenancy.with(&uploaded.tenants).unwrap_or(tenancy);
                let over = crate::registry::quota::over_quota(uploaded.entries.values().map(|(e, _)| e), &tenancy);
                for (entry, path) in uploaded.entries.values() {
                    if let Some(reason) = over.get(&entry.name) {
                        refused.push(reason.clone());
                        continue;
                    }
                    if loaded.iter().any(|(m, _, _)| m.name == entry.name) {
                        tracing::warn!(topology = %entry.name, "uploaded, and also given with --topology: running the manifest's");
                        continue;
                    }
                    match load_uploaded(&runtime, &tenancy, entry, path) {
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
        let static_names: HashSet<String> = loaded
            .iter()
            .filter(|(m, _, _)| !uploaded_versions.contains_key(&m.name))
            .map(|(m, _, _)| m.name.clone())
            .collect();
        let memory = crate::state::rocks::SharedMemory::new(config.state_block_cache, config.state_write_buffers);
        let state = Arc::new(StateDir::new(
            config.state_dir.clone(),
            Arc::new(crate::state::rocks::RocksStorage::new(memory)),
            &config.kafka,
        ));
        state.connect();
        let client = config
            .schema_registry
            .clone()
            .map(crate::formats::RegistryClient::new)
            .transpose()
            .map_err(|e| anyhow::anyhow!("the schema registry: {e}"))?;
        let schemas = crate::formats::Schemas::with_counters(
            client,
            tokio::runtime::Handle::current(),
            config.schema_cache_bytes,
            schema_counters,
        );
        Ok(Worker {
            schemas,
            config,
            registry,
            runtime: Arc::new(runtime),
            loaded,
            refused,
            uploaded_versions,
            static_names,
            state,
            metrics,
            board: Arc::new(Board::new(board_metrics)),
        })
    }

    /// What an admin API may ask of this worker (its status, deploy checks, a drain).
    pub fn handle(&self) -> WorkerHandle {
        WorkerHandle {
            kafka: self.config.kafka.clone(),
            cluster: self.config.cluster.as_ref().map(|c| c.name.clone()),
            board: self.board.clone(),
            metrics: self.metrics.clone(),
            runtime: self.runtime.clone(),
            registry: self.registry.clone(),
            state: self.state.clone(),
            static_names: Arc::new(self.static_names.clone()),
            drain: self.config.cluster.as_ref().and_then(|c| c.drain.clone()),
            state_limit: self.config.state_limit,
            schemas: self.schemas.clone(),
        }
    }

    /// Where this worker's admin endpoint listens (bound at `bound`): told to the group,
    /// unless an address to advertise was configured.
    pub fn admin_bound(&mut self, bound: SocketAddr, tls: bool) {
        if let Some(cluster) = self.config.cluster.as_mut().filter(|c| c.admin.is_empty()) {
            let address = advertised(bound);
            cluster.admin = if tls { format!("https://{address}") } else { address };
        }
    }

    /// Runs the worker until `shutdown` resolves, then stops every task cleanly (finish the
    /// batch, flush, commit, close) and returns how they ended. Topologies whose topics do
    /// not check out are refused alone; with none left to run (and no registry to bring
    /// more), this fails before anything runs.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<WorkerReport> {
        let Worker {
            config,
            registry,
            runtime,
            loaded,
            mut refused,
            uploaded_versions,
            static_names,
            state,
            metrics,
            board,
            schemas,
        } = self;
        let settings = DeploySettings {
            kafka: config.kafka.clone(),
            changelogs: config.changelogs,
            state_limit: config.state_limit,
        };
        let (deployed, more_refused) = deploy_all(&settings, loaded).await;
        refused.extend(more_refused);
        // One tenant's bad topology keeps no other from running; with none left (and no
        // registry to bring more), there is nothing to do.
        if deployed.is_empty() && registry.is_none() {
            bail!("{}", refused.join("\n"));
        }
        for reason in &refused {
            tracing::error!("not running a topology: {reason}");
        }
        let producer = Arc::new(SharedProducer::new(
            &config.kafka,
            config
                .kafka
                .worker_client()
                .set("enable.idempotence", "true")
                .set(
                    crate::task::delivery::PARTITIONER.0,
                    crate::task::delivery::PARTITIONER.1,
                )
                .set("linger.ms", "5")
                .set("compression.type", "lz4")
                // Each task has at most `delivery::MAX_IN_FLIGHT` records queued; the queue
                // holds many tasks' worth, so tasks whose sinks are stuck cannot fill it for
                // the rest.
                .set("queue.buffering.max.messages", "1000000")
                // A record that cannot be delivered in two minutes fails its task (alone).
                .set("message.timeout.ms", "120000")
                .clone(),
        )?);
        let lease = Arc::new(if config.cluster.is_some() {
            Lease::expired()
        } else {
            Lease::forever()
        });
        let fence = Arc::new(match &config.cluster {
            Some(cluster) => Fence::cluster(
                &crate::group::cluster_group(&cluster.name),
                &crate::registry::topic(&cluster.name),
            ),
            None => Fence::alone(),
        });
        let worker_id = uuid::Uuid::from_bytes(crate::state::dir::worker_id(&config.state_dir)?).to_string();
        for t in &deployed {
            tracing::info!(topology = %t.name, tasks = t.tasks().len(), internal = ?t.internal_topics, sources = ?t.binding.source_topics, sinks = ?t.binding.sink_topics, "deployed");
        }
        let mut runner = TaskRunner::new(
            lease,
            fence,
            &worker_id,
            producer.clone(),
            config.tasks.clone(),
            metrics,
            board,
            config.kafka.clone(),
            state,
            deployed,
            schemas,
        )?;

        let report = match &config.cluster {
            None => {
                // Alone: this worker owns every task.
                let all = runner.all_tasks();
                runner.board().all_active(&all);
                runner.start(&all, runner::Handovers::none())?;
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
                        config.tenancy.clone(),
                        settings,
                        tx,
                    ));
                }
                group_runner::run(cluster, runner, shutdown, rx).await?
            }
        };
        let mut report = report;
        report.failed.extend(
            refused
                .into_iter()
                .map(|reason| ("(refused topology)".to_string(), reason)),
        );
        if let Err(e) = delivery::flush(&producer.current(), Duration::from_secs(30)) {
            report
                .failed
                .push(("producer".into(), format!("flushing at shutdown: {e}")));
        }
        Ok(report)
    }
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
