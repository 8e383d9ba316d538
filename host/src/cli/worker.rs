//! `sluice worker`: run topologies until a signal says stop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use sluice::manifest::parse_size;
use sluice::runtime::RuntimeConfig;
use sluice::worker::group_runner::ClusterConfig;
use sluice::worker::{self, TaskSettings, WorkerConfig};

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Kafka bootstrap servers, `host:port[,host:port…]`.
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    bootstrap: String,
    /// A topology manifest (TOML); repeat for several topologies.
    #[arg(long = "topology", value_name = "FILE.toml", required = true)]
    topologies: Vec<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR", env = "SLUICE_METRICS")]
    metrics: Option<SocketAddr>,
    /// Most records handed to the guest in one call.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch_size: u32,
    /// How often each task commits its source offsets (after flushing what it produced).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    commit_interval: Duration,
    /// How often each task's `punctuate` runs (stream time or wall clock, whichever is first).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    punctuate_interval: Duration,
    /// Memory one task instance may use; a manifest may lower it.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    memory_limit: usize,
    /// Deadline of one guest call; a manifest may change it.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    call_timeout: Duration,
    /// Most task instances this worker can hold (slots reserved by the pooling allocator).
    #[arg(long, default_value_t = 1000)]
    max_instances: u32,
    /// Allocate instances on demand instead of from the pooling allocator.
    #[arg(long)]
    no_pooling: bool,
    /// Share the tasks of all topologies with every worker started with the same cluster name
    /// (a Kafka group); without it this worker owns every task.
    #[arg(long, env = "SLUICE_CLUSTER")]
    cluster: Option<String>,
    /// This worker's share of tasks relative to the others (stream threads).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    capacity: u32,
    /// Static membership: a worker restarted under the same id within the session timeout
    /// gets its tasks back without a rebalance.
    #[arg(long)]
    instance_id: Option<String>,
    /// A worker not heard from for this long loses its tasks to the others.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    session_timeout: Duration,
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    heartbeat_interval: Duration,
    /// How tasks are placed: `sticky` (cooperative) or `eager` (stop-the-world baseline).
    #[arg(long, default_value = "sticky")]
    assignor: String,
    /// Standby replicas per stateful task, on other workers.
    #[arg(long, default_value_t = 0)]
    standby_replicas: u32,
    /// The group metadata version to speak (tests of rolling upgrades).
    #[arg(long, hide = true, default_value_t = sluice::group::metadata::CURRENT_VERSION)]
    metadata_version: u16,
    /// Where task state lives: one RocksDB store per (task, store) and a checkpoint per task.
    #[arg(long, default_value = "sluice-state", env = "SLUICE_STATE_DIR")]
    state_dir: PathBuf,
    /// Block cache shared by every state store of this worker.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    state_cache: usize,
    /// Memtable budget shared by every state store of this worker.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    state_write_buffers: usize,
}

pub async fn run(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let cluster = args.cluster.map(|name| ClusterConfig {
        name,
        capacity: args.capacity,
        instance_id: args.instance_id,
        session_timeout: args.session_timeout,
        heartbeat_interval: args.heartbeat_interval,
        assignor: args.assignor,
        standby_replicas: args.standby_replicas,
        bootstrap: args.bootstrap.clone(),
        state_dir: args.state_dir.clone(),
        metadata_version: args.metadata_version,
    });
    let config = WorkerConfig {
        cluster,
        bootstrap: args.bootstrap,
        manifests: args.topologies,
        metrics_addr: args.metrics,
        tasks: TaskSettings {
            batch_size: args.batch_size as usize,
            commit_interval: args.commit_interval,
            punctuate_interval: args.punctuate_interval,
        },
        runtime: RuntimeConfig {
            memory_limit: args.memory_limit,
            call_timeout: args.call_timeout,
            pooling: !args.no_pooling,
            max_instances: args.max_instances,
        },
        state_dir: args.state_dir,
        state_block_cache: args.state_cache,
        state_write_buffers: args.state_write_buffers,
    };
    let report = worker::run(config, shutdown_signal()).await?;
    let out: u64 = report.stopped.iter().map(|(_, s)| s.records_out).sum();
    let read: u64 = report.stopped.iter().map(|(_, s)| s.records_in).sum();
    tracing::info!(
        tasks = report.stopped.len(),
        failed = report.failed.len(),
        records_in = read,
        records_out = out,
        "worker stopped"
    );
    for (task, error) in &report.failed {
        tracing::warn!(%task, "was stopped by a failure: {error}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot listen for SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
        _ = term.recv() => tracing::info!("SIGTERM received"),
    }
}
