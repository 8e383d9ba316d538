//! A worker process: loads the topologies it is given, checks them against the cluster,
//! and runs one task per source partition until it is told to stop.
//!
//! Until the worker group lands, a worker owns every partition of its topologies. Source
//! offsets are committed under a consumer group per topology (`sluice-<name>`), so a
//! restarted worker resumes where the last one committed.

mod changelog;
pub mod delivery;
pub mod group_runner;
pub mod standby;
pub mod task;
pub mod task_state;

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::group::TaskId;
use crate::manifest::{Binding, Manifest};
use crate::metrics::Metrics;
use crate::runtime::{LoadedTopology, Runtime, RuntimeConfig};
use delivery::{DeliveryRouter, WorkerProducer};
pub use task::{TaskError, TaskSettings, TaskSummary};

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
}

impl WorkerConfig {
    pub fn new(bootstrap: impl Into<String>, manifests: Vec<PathBuf>) -> Self {
        WorkerConfig {
            bootstrap: bootstrap.into(),
            manifests,
            metrics_addr: None,
            tasks: TaskSettings {
                batch_size: 500,
                commit_interval: Duration::from_secs(1),
                punctuate_interval: Duration::from_secs(1),
            },
            runtime: RuntimeConfig::default(),
            cluster: None,
            state_dir: PathBuf::from("sluice-state"),
            state_block_cache: 64 << 20,
            state_write_buffers: 64 << 20,
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
    pub partitions: i32,
    /// (store, changelog topic) for each declared store.
    pub changelogs: Vec<(String, String)>,
}

/// Loads and checks every manifest and component; the first problem is returned.
pub fn load_topologies(
    runtime: &Runtime,
    manifests: &[PathBuf],
) -> anyhow::Result<Vec<(Manifest, LoadedTopology, Binding)>> {
    if manifests.is_empty() {
        bail!("no topology to run: pass --topology FILE.toml (repeatable)");
    }
    let mut names = HashSet::new();
    let mut out = Vec::new();
    for path in manifests {
        let manifest = Manifest::load(path)?;
        if !names.insert(manifest.name.clone()) {
            bail!(
                "two manifests name the topology {:?}; topology names must be unique",
                manifest.name
            );
        }
        let loaded = runtime.load(&manifest.component)?;
        let loaded = loaded
            .with_limits(&manifest.limits)
            .map_err(|m| anyhow::anyhow!("manifest {}: {m}", manifest.path))?;
        let binding = manifest.bind(loaded.description())?;
        out.push((manifest, loaded, binding));
    }
    Ok(out)
}

/// Runs a worker until `shutdown` resolves, then stops every task cleanly (finish the
/// batch, flush, commit, close) and returns. Start-up problems (a bad manifest or
/// component, a missing topic, an unreachable cluster) are returned before anything runs.
pub async fn run(
    config: WorkerConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<WorkerReport> {
    let runtime = Runtime::new(&config.runtime)?;
    let topologies = load_topologies(&runtime, &config.manifests)?;

    let metrics = Metrics::new();
    if let Some(addr) = config.metrics_addr {
        let bound = metrics.clone().serve(addr).await?;
        tracing::info!("metrics on http://{bound}/metrics");
    }

    let bootstrap = config.bootstrap.clone();
    let deployed = tokio::task::spawn_blocking(move || -> anyhow::Result<Vec<DeployedTopology>> {
        topologies
            .into_iter()
            .map(|(m, loaded, binding)| deploy(&bootstrap, m, loaded, binding))
            .collect()
    })
    .await??;

    let producer: Arc<WorkerProducer> = Arc::new(
        base_config(&config.bootstrap)
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .set("compression.type", "lz4")
            .create_with_context(DeliveryRouter)
            .context("creating the producer")?,
    );

    let state = Arc::new(task_state::StateEnv {
        dir: config.state_dir.clone(),
        memory: crate::state::rocks::SharedMemory::new(config.state_block_cache, config.state_write_buffers),
    });
    let mut runner = TaskRunner {
        producer: producer.clone(),
        settings: config.tasks.clone(),
        metrics: metrics.clone(),
        bootstrap: config.bootstrap.clone(),
        state: state.clone(),
        topologies: deployed.into_iter().map(|t| (t.name.clone(), Arc::new(t))).collect(),
        running: BTreeMap::new(),
        standbys: BTreeMap::new(),
        finished: WorkerReport::default(),
    };
    for (name, t) in runner.topologies.clone() {
        tracing::info!(topology = %name, partitions = t.partitions, sources = ?t.binding.source_topics, sinks = ?t.binding.sink_topics, "deployed");
    }

    let report = match &config.cluster {
        None => {
            // Alone: this worker owns every task.
            let all = runner.all_tasks();
            runner.start(&all)?;
            shutdown.await;
            tracing::info!("stopping: finishing batches in flight, flushing, committing");
            tokio::task::spawn_blocking(move || runner.stop_all()).await?
        }
        Some(cluster) => group_runner::run(cluster, runner, shutdown).await?,
    };
    let report = {
        let mut report = report;
        if let Err(e) = delivery::flush(&producer, Duration::from_secs(30)) {
            report
                .failed
                .push(("producer".into(), format!("flushing at shutdown: {e}")));
        }
        report
    };
    Ok(report)
}

/// A task thread and the flag that asks it to stop.
type RunningTask = (Arc<AtomicBool>, std::thread::JoinHandle<Result<TaskSummary, TaskError>>);

/// Starts and stops task threads; knows every deployed topology.
pub struct TaskRunner {
    producer: Arc<WorkerProducer>,
    settings: TaskSettings,
    metrics: Metrics,
    bootstrap: String,
    state: Arc<task_state::StateEnv>,
    topologies: BTreeMap<String, Arc<DeployedTopology>>,
    running: BTreeMap<TaskId, RunningTask>,
    standbys: BTreeMap<TaskId, RunningStandby>,
    finished: WorkerReport,
}

/// A standby thread and the flag that asks it to stop.
type RunningStandby = (Arc<AtomicBool>, std::thread::JoinHandle<Result<u64, String>>);

impl TaskRunner {
    /// Every task of every deployed topology.
    pub fn all_tasks(&self) -> Vec<TaskId> {
        self.topologies
            .values()
            .flat_map(|t| (0..t.partitions as u32).map(|p| TaskId::new(&t.name, p)))
            .collect()
    }

    /// Topologies whose tasks keep state.
    pub fn stateful(&self) -> std::collections::HashSet<Arc<str>> {
        self.topologies
            .values()
            .filter(|t| !t.changelogs.is_empty())
            .map(|t| Arc::from(t.name.as_str()))
            .collect()
    }

    /// The tasks running now.
    pub fn running(&self) -> Vec<TaskId> {
        self.running.keys().cloned().collect()
    }

    pub fn start(&mut self, tasks: &[TaskId]) -> anyhow::Result<()> {
        for task in tasks {
            if self.running.contains_key(task) {
                continue;
            }
            let Some(topology) = self.topologies.get(&*task.topology).cloned() else {
                tracing::warn!(%task, "assigned a task of a topology this worker does not run");
                continue;
            };
            let stop = Arc::new(AtomicBool::new(false));
            let ctx = task::TaskContext {
                topology,
                partition: task.partition as i32,
                producer: self.producer.clone(),
                settings: self.settings.clone(),
                stop: stop.clone(),
                metrics: self.metrics.clone(),
                bootstrap: self.bootstrap.clone(),
                state: self.state.clone(),
            };
            let name = format!("task-{}-{}", task.topology, task.partition);
            let handle = std::thread::Builder::new().name(name).spawn(move || task::run(ctx))?;
            self.running.insert(task.clone(), (stop, handle));
        }
        Ok(())
    }

    /// Stops tasks cleanly (finish the batch, flush, commit, close) and waits for them.
    pub fn stop(&mut self, tasks: &[TaskId]) {
        let mut stopping = Vec::new();
        for task in tasks {
            if let Some((stop, handle)) = self.running.remove(task) {
                stop.store(true, Ordering::Relaxed);
                stopping.push((task.clone(), handle));
            }
        }
        for (task, handle) in stopping {
            let id = task.to_string();
            match handle.join() {
                Ok(Ok(summary)) => self.finished.stopped.push((id, summary)),
                Ok(Err(e)) => self.finished.failed.push((id, e.to_string())),
                Err(_) => self.finished.failed.push((id, "the task thread panicked".to_string())),
            }
        }
    }

    pub fn stop_all(mut self) -> WorkerReport {
        let all = self.running();
        self.stop(&all);
        let standbys = self.standbys();
        self.stop_standbys(&standbys);
        self.finished
    }

    /// The standby tasks running now.
    pub fn standbys(&self) -> Vec<TaskId> {
        self.standbys.keys().cloned().collect()
    }

    /// Offset sums of the local state of every task this worker has state for.
    pub fn local_offset_sums(&self) -> Vec<(TaskId, i64)> {
        let topologies: Vec<Arc<DeployedTopology>> = self.topologies.values().cloned().collect();
        standby::local_offset_sums(&self.state.dir, &topologies)
    }

    pub fn start_standbys(&mut self, tasks: &[TaskId]) -> anyhow::Result<()> {
        for task in tasks {
            if self.standbys.contains_key(task) || self.running.contains_key(task) {
                continue;
            }
            let Some(topology) = self.topologies.get(&*task.topology).cloned() else {
                continue;
            };
            let stop = Arc::new(AtomicBool::new(false));
            let (flag, bootstrap, state, partition) =
                (stop.clone(), self.bootstrap.clone(), self.state.clone(), task.partition);
            let name = format!("standby-{}-{}", task.topology, task.partition);
            let handle = std::thread::Builder::new()
                .name(name)
                .spawn(move || standby::run(topology, partition as i32, &bootstrap, &state, &flag))?;
            self.standbys.insert(task.clone(), (stop, handle));
        }
        Ok(())
    }

    pub fn stop_standbys(&mut self, tasks: &[TaskId]) {
        let mut stopping = Vec::new();
        for task in tasks {
            if let Some((stop, handle)) = self.standbys.remove(task) {
                stop.store(true, Ordering::Relaxed);
                stopping.push((task.clone(), handle));
            }
        }
        for (task, handle) in stopping {
            match handle.join() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(%task, "standby failed: {e}"),
                Err(_) => tracing::warn!(%task, "standby thread panicked"),
            }
        }
    }
}

/// How the worker's tasks ended.
#[derive(Debug, Default)]
pub struct WorkerReport {
    pub stopped: Vec<(String, TaskSummary)>,
    pub failed: Vec<(String, String)>,
}

fn base_config(bootstrap: &str) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("client.id", "sluice-worker");
    config
}

/// A consumer of a topology's sources: offsets in the topology's group `sluice-<topology>`,
/// committed by hand, from the beginning where nothing is committed.
pub(crate) fn source_consumer(
    bootstrap: &str,
    topology: &str,
) -> rdkafka::error::KafkaResult<BaseConsumer<ConsumerEvents>> {
    base_config(bootstrap)
        .set("group.id", format!("sluice-{topology}"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "100")
        .create_with_context(ConsumerEvents)
}

/// Checks a topology's topics against the cluster and creates its changelogs.
fn deploy(
    bootstrap: &str,
    manifest: Manifest,
    loaded: LoadedTopology,
    binding: Binding,
) -> anyhow::Result<DeployedTopology> {
    // Used here for metadata only; each task creates its own (see task.rs).
    let consumer = source_consumer(bootstrap, &manifest.name).context("creating the consumer")?;

    let mut partitions = None;
    for (kind, topics) in [("source", &binding.source_topics), ("sink", &binding.sink_topics)] {
        for topic in topics.iter() {
            let count = partition_count(&consumer, topic).map_err(|e| {
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
    let changelogs = changelog::ensure_changelogs(bootstrap, &manifest.name, &loaded.description().stores, partitions)
        .map_err(|e| anyhow::anyhow!("topology {} (manifest {}): {e:#}", manifest.name, manifest.path))?;
    Ok(DeployedTopology {
        name: manifest.name,
        loaded,
        binding,
        partitions,
        changelogs,
    })
}

fn partition_count(consumer: &BaseConsumer<ConsumerEvents>, topic: &str) -> Result<i32, String> {
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(15))
        .map_err(|e| format!("cannot fetch metadata from Kafka: {e}"))?;
    let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Err("not in the cluster's metadata".into());
    };
    match t.error() {
        None if !t.partitions().is_empty() => Ok(t.partitions().len() as i32),
        Some(e) if RDKafkaErrorCode::from(e) == RDKafkaErrorCode::UnknownTopicOrPartition => {
            Err("does not exist; create it first (for example `sluice topics create --partitions 4 TOPIC`)".into())
        }
        None => Err("does not exist; create it first (for example `sluice topics create --partitions 4 TOPIC`)".into()),
        Some(e) => Err(format!("{}", KafkaError::MetadataFetch(e.into()))),
    }
}
