//! `sluice worker`: run topologies until a signal says stop.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use sluice::admin::AdminConfig;
use sluice::group::assignor::LearnerPolicy;
use sluice::manifest::parse_size;
use sluice::runtime::RuntimeConfig;
use sluice::secret::ClusterSecret;
use sluice::task::{Guarantee, TaskSettings};
use sluice::topology::ChangelogSettings;
use sluice::worker::group_runner::{ClusterConfig, LearnerRejoin, Stop};
use sluice::worker::{Worker, WorkerConfig};

/// What `sluice worker` does besides running topologies.
#[derive(Debug, Subcommand)]
pub enum WorkerAction {
    /// Drain a running worker of a cluster: the others take its tasks (stateful ones once
    /// their learners caught up) and it exits 0 once it owns nothing.
    Drain(DrainArgs),
}

#[derive(Debug, Args)]
pub struct DrainArgs {
    /// The worker's admin address: what it was started with as `--metrics`.
    #[arg(long, value_name = "HOST:PORT")]
    admin: String,
    /// The admin's token, when the cluster's admin API requires one.
    #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The CA (PEM) to check an `https://` admin address's certificate against.
    #[arg(long, env = "SLUICE_ADMIN_CA", value_name = "FILE.pem")]
    ca: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(subcommand)]
    action: Option<WorkerAction>,
    #[command(flatten)]
    settings: WorkerSettings,
}

/// A worker's settings. Each has a key in the configuration file and an environment
/// variable (see `sluice config show` and `cli::config::SETTINGS`): built-in defaults <
/// the file < the environment < flags.
#[derive(Debug, Args)]
pub struct WorkerSettings {
    /// Kafka bootstrap servers, `host:port[,host:port…]`.
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    bootstrap: Option<String>,
    #[command(flatten)]
    kafka: super::kafka_args::KafkaArgs,
    #[command(flatten)]
    schema_registry: super::registry_args::RegistryArgs,
    #[command(flatten)]
    admin_jwt: super::jwt_args::JwtArgs,
    /// Bytes of schemas from the registry the worker keeps (they never change: kept for the
    /// worker's life within this).
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    schema_cache: usize,
    /// A topology manifest (TOML); repeat for several topologies. In a cluster (`--cluster`)
    /// it may be left out: the worker runs what is uploaded to the cluster's registry.
    #[arg(long = "topology", value_name = "FILE.toml")]
    topologies: Vec<PathBuf>,
    /// The worker's admin endpoint: Prometheus metrics at http://ADDR/metrics, live status
    /// (roles, lag, learners' progress, rebalances) at /status, /healthz and /readyz, and
    /// POST /drain. Port 0 picks a free port.
    #[arg(long, value_name = "ADDR", env = "SLUICE_METRICS")]
    metrics: Option<SocketAddr>,
    /// The address other workers and `sluice status` reach the admin endpoint at (default:
    /// the bound address; this host's name when bound to all interfaces).
    #[arg(long, value_name = "HOST:PORT")]
    advertise_admin: Option<String>,
    /// Most records handed to the guest in one call.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    batch_size: u32,
    /// Most bytes of records in one batch; a quarter of the topology's memory limit when
    /// that is less. A record larger than this goes in a batch of its own.
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    max_batch_bytes: usize,
    /// Stream threads: each runs its share of this worker's tasks over one consumer
    /// (default: the number of cores).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    threads: Option<u32>,
    /// Memory this worker may spend on records fetched ahead of processing, shared by its
    /// stream threads (half for record bytes, half for the client's per-record overhead;
    /// besides, at most 5,000 records per partition and 128 KiB per partition and fetch).
    /// Lower it to bound memory under a backlog, at some cost in throughput.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    prefetch: usize,
    /// How often source offsets are committed, with what was produced and written since
    /// (default: 100ms under exactly-once, as in Kafka Streams, where it is also how long
    /// readers wait for results; 1s under at-least-once).
    #[arg(long, value_parser = humantime::parse_duration)]
    commit_interval: Option<Duration>,
    /// `at-least-once` (the default, faster: after a failure some records are processed
    /// twice) or `exactly-once` (Kafka transactions: outputs, state and offsets commit
    /// atomically, and a new owner fences the old one).
    #[arg(long, default_value = "at-least-once", value_parser = parse_guarantee, env = "SLUICE_PROCESSING_GUARANTEE")]
    processing_guarantee: Guarantee,
    /// A task whose position did not move re-commits it this often, so Kafka never expires
    /// the offsets of an idle partition (default: a minute, or the commit interval if longer).
    #[arg(long, value_parser = humantime::parse_duration)]
    idle_commit_interval: Option<Duration>,
    /// How often a task deletes the records of its repartition sources it has committed
    /// (DeleteRecords), so a repartition topic holds only its backlog.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    repartition_purge_interval: Duration,
    /// Replication factor of changelog topics this worker creates (default: min(3, brokers)).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=32))]
    changelog_replication_factor: Option<i32>,
    /// `min.insync.replicas` of changelog topics this worker creates (default: one less
    /// than the replication factor, at least 1).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=32))]
    changelog_min_insync_replicas: Option<i32>,
    /// How often each task's `punctuate` runs (stream time or wall clock, whichever is first).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    punctuate_interval: Duration,
    /// Memory one task instance may use; a manifest may lower it.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    memory_limit: usize,
    /// Bytes one task's guest may make the host hold: records emitted through `host.emit`
    /// in a call plus state writes not yet committed. A manifest may change it
    /// (`limits.host-memory`).
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    host_memory_limit: usize,
    /// Deadline of one guest call; a manifest may change it.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    call_timeout: Duration,
    /// Most task instances this worker can hold (slots reserved by the pooling allocator).
    #[arg(long, default_value_t = 1000)]
    max_instances: u32,
    /// Allocate instances on demand instead of from the pooling allocator.
    #[arg(long)]
    no_pooling: bool,
    /// Where compiled components are kept (by SHA-256 and engine version), so a restart or a
    /// re-upload skips compiling (default: `compiled` in the state directory).
    #[arg(long, value_name = "DIR")]
    compile_cache: Option<PathBuf>,
    /// Compile every component every time (no compile cache).
    #[arg(long)]
    no_compile_cache: bool,
    /// Share the tasks of all topologies with every worker started with the same cluster name
    /// (a Kafka group); without it this worker owns every task.
    #[arg(long, env = "SLUICE_CLUSTER")]
    cluster: Option<String>,
    /// This worker's share of tasks relative to the others (default: its stream threads).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    capacity: Option<u32>,
    /// Static membership: a worker restarted under the same id within the session timeout
    /// gets its tasks back without a rebalance.
    #[arg(long)]
    instance_id: Option<String>,
    /// A worker not heard from for this long loses its tasks to the others.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    session_timeout: Duration,
    /// How often a worker heartbeats: also how soon it learns that the group rebalances (a
    /// task moving to or from it waits for that). Five intervals (at least 1.5 s) are its
    /// lease: it pauses processing when it has heard nothing from the coordinator for that
    /// long. Give every worker of a cluster the same interval.
    #[arg(long, default_value = "300ms", value_parser = humantime::parse_duration)]
    heartbeat_interval: Duration,
    /// How tasks are placed: `sticky` (cooperative) or `eager` (stop-the-world baseline).
    #[arg(long, default_value = "sticky")]
    assignor: String,
    /// Give a task that a guest fault stopped back to the cluster (it may be placed on
    /// another worker, or here again) instead of keeping it failed on this worker.
    #[arg(long)]
    release_failed_tasks: bool,
    /// Standby replicas per stateful task, on other workers.
    #[arg(long, default_value_t = 0)]
    standby_replicas: u32,
    /// Learner tasks at once in the cluster: a stateful task that moves to another live
    /// worker stays active where it is until a learner there has restored its state. 0
    /// moves tasks at once (the new owner restores before processing).
    #[arg(long, default_value_t = 8)]
    max_learner_tasks: u32,
    /// A learner this many changelog records (or fewer) behind is caught up: its task moves.
    #[arg(long, default_value_t = 10_000)]
    acceptable_recovery_lag: u64,
    /// Most changelog records a second this worker's standbys, learners and global tables
    /// read together (0: as fast as the broker serves them). A learner restoring at full
    /// speed takes a core of its worker and much of the broker; on machines the workers
    /// share with each other or with the broker, a rate keeps the tasks that do not move
    /// flowing while learners restore (see docs/scaling.md), at the cost of a slower scale-up.
    #[arg(long, default_value_t = 0)]
    standby_restore_rate: u64,
    /// When a worker with learners rejoins to take their tasks: `each` as soon as one has
    /// caught up, `all` once all of them have.
    #[arg(long, value_enum, default_value = "each")]
    learner_rejoin: LearnerRejoin,
    /// In a cluster, SIGTERM (or SIGINT) stops the worker at once, handing its tasks over
    /// without learners (their new owners restore before processing). By default it drains
    /// instead: the worker asks the others to take its tasks (stateful ones once their
    /// learners caught up) and exits 0 when it owns nothing, or after --scale-down-timeout;
    /// a second signal stops it at once. SIGUSR1 always drains.
    #[arg(long)]
    no_drain_on_stop: bool,
    /// What drains by default now (kept so that scripts that ask for it still start).
    #[arg(long, hide = true, conflicts_with = "no_drain_on_stop")]
    drain_on_stop: bool,
    /// A draining worker that still owns tasks after this long stops them and leaves
    /// anyway (`0s`: no limit). Keep it below the time a supervisor waits between SIGTERM
    /// and SIGKILL (Kubernetes: `terminationGracePeriodSeconds`, 30 s by default).
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    scale_down_timeout: Duration,
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
    /// State on disk one topology's tasks may keep on this worker; a manifest may change it
    /// (`limits.state`). A task whose commit would go past it fails and stays failed.
    #[arg(long, default_value = "10GiB", value_parser = parse_size)]
    state_limit: usize,
    /// The configuration file: worker settings under Kafka-style dotted keys, tenants, their
    /// tokens, namespaces and limits (the same file on every worker of a cluster; see
    /// docs/configuration.md). Environment variables and flags override it.
    #[arg(long, env = "SLUICE_CONFIG", value_name = "FILE.toml")]
    config: Option<PathBuf>,
    /// Largest component the admin API takes (`POST /v1/topologies`).
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    max_component_size: usize,
    /// Most functions (core functions with code, and canonical functions) a component may
    /// have to be compiled: compiling costs time and memory with each, on every worker.
    #[arg(long, default_value_t = 50_000)]
    max_component_functions: u64,
    /// Most bytes of function code a component may have to be compiled.
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    max_component_code: usize,
    /// Longest one compile of a component may take (each runs in a child process, killed
    /// at this deadline).
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    compile_timeout: Duration,
    /// Most memory one compile of a component may use (the child's data segment).
    #[arg(long, default_value = "2GiB", value_parser = parse_size)]
    compile_memory: usize,
    /// The cluster secret (the same on every worker of the cluster; 16 bytes at least):
    /// registry records and group messages are believed only when signed with it, and
    /// workers sign what they ask each other with it. Needed when the admin API has tokens.
    #[arg(long, value_name = "SECRET", hide_env_values = true)]
    registry_secret: Option<String>,
    /// A file holding the cluster secret (its first line), instead of --registry-secret.
    #[arg(long, value_name = "FILE")]
    registry_secret_file: Option<PathBuf>,
    /// Ask a token for `GET /metrics` too (by default metrics are public, as Prometheus
    /// scrapes them).
    #[arg(long)]
    private_metrics: bool,
    /// Serve an open admin API (no tokens configured) on an address others can reach; by
    /// default a worker refuses to, unless it listens on a loopback address.
    #[arg(long)]
    allow_open_admin: bool,
    /// The admin API speaks TLS with this certificate chain (PEM); with --admin-tls-key.
    #[arg(long, value_name = "FILE.pem", requires = "admin_tls_key")]
    admin_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --admin-tls-cert.
    #[arg(long, value_name = "FILE.pem", requires = "admin_tls_cert")]
    admin_tls_key: Option<PathBuf>,
    /// The CA (PEM) workers check each other's admin certificates against.
    #[arg(long, value_name = "FILE.pem")]
    admin_tls_ca: Option<PathBuf>,
    /// Connections the admin API keeps open at once; more are closed as they arrive.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    admin_max_connections: u32,
    /// How long an admin request may take to be answered.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    admin_request_timeout: Duration,
}

pub async fn run(args: WorkerArgs, layered: super::config::Layered) -> anyhow::Result<ExitCode> {
    if let Some(WorkerAction::Drain(drain)) = &args.action {
        return ask_to_drain(drain).await;
    }
    let settings = args.settings;
    // Stop requests from signals: a drain first (in a cluster, when asked), then a stop.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(Stop::Run);
    let stop_tx = std::sync::Arc::new(stop_tx);
    let in_cluster = settings.cluster.is_some();
    let drain_on_stop = !settings.no_drain_on_stop;
    let (config, admin) = settings.into_config(&layered, Some(stop_tx.clone()))?;
    if let Some(file) = &layered.file {
        tracing::info!(
            file = %file.display(),
            settings = layered.decided_by_file(),
            tenants = layered.tenancy.tenants.len(),
            "configuration file read"
        );
    }
    tokio::spawn(signals(stop_tx.clone(), in_cluster && drain_on_stop, in_cluster));
    let mut stop_rx = stop_rx;
    let shutdown = async move {
        let _ = stop_rx.wait_for(|s| *s == Stop::Now).await;
    };
    // The worker, and its admin API beside it (started before the worker joins its group,
    // which it tells where the API is).
    // With OAUTHBEARER, the first token before any client (a provider that is not there stops
    // the worker here, saying so).
    let mut config = config;
    config.kafka = config.kafka.clone().start_tokens().await.map_err(anyhow::Error::msg)?;
    if let Some(cluster) = &mut config.cluster {
        cluster.kafka = config.kafka.clone();
    }
    let mut worker = Worker::start(config).await?;
    if let Some(bound) = sluice::admin::serve(worker.handle(), &admin).await? {
        worker.admin_bound(bound, admin.tls.is_some());
        let scheme = if admin.tls.is_some() { "https" } else { "http" };
        tracing::info!("metrics on {scheme}://{bound}/metrics; POST {scheme}://{bound}/drain drains this worker");
    }
    let report = worker.run(shutdown).await?;
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
        if task == "(refused topology)" {
            tracing::error!("was not run: {error}");
        } else {
            tracing::error!(%task, "was stopped by a failure: {error}");
        }
    }
    if report.failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "sluice: {} task(s) failed or topologies were refused while this worker ran (see the log above); \
             exiting with status {TASKS_FAILED}",
            report.failed.len()
        );
        Ok(ExitCode::from(TASKS_FAILED))
    }
}

impl WorkerSettings {
    /// The worker's configuration from its layered settings: every check a worker makes of
    /// its settings before it starts (`sluice config show` makes the same ones).
    pub fn into_config(
        self,
        layered: &super::config::Layered,
        drain: Option<std::sync::Arc<tokio::sync::watch::Sender<Stop>>>,
    ) -> anyhow::Result<(WorkerConfig, AdminConfig)> {
        let args = self;
        let bootstrap = args.bootstrap.ok_or_else(|| {
            anyhow::anyhow!(
                "no Kafka bootstrap servers: give --bootstrap HOST:PORT, set KAFKA_BOOTSTRAP, or write \
                 bootstrap.servers in the configuration file"
            )
        })?;
        if args.topologies.is_empty() && args.cluster.is_none() {
            anyhow::bail!(
                "nothing to run: give --topology FILE.toml (or `topologies` in the configuration file), \
                 or --cluster NAME to run what is uploaded to the cluster"
            );
        }
        let threads = args
            .threads
            .map(|t| t as usize)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        let tenancy = sluice::registry::tenants::Tenancy::from_config(layered.tenancy.clone()).map_err(|e| {
            match &layered.file {
                Some(file) => anyhow::anyhow!("configuration file {}: {e}", file.display()),
                None => anyhow::anyhow!("{e}"),
            }
        })?;
        if args.advertise_admin.is_some() && args.metrics.is_none() {
            anyhow::bail!("--advertise-admin (admin.advertised.listener) needs --metrics (admin.listener)");
        }
        let kafka = args.kafka.settings(&bootstrap)?;
        let secret = cluster_secret(args.registry_secret.as_deref(), args.registry_secret_file.as_deref())?;
        let jwt = args.admin_jwt.access()?;
        if args.cluster.is_some() && (tenancy.enforced() || jwt.is_some()) && secret.is_none() {
            anyhow::bail!(
                "this cluster's admin API has tokens, so its workers need the cluster secret: set registry.secret (or \
                 registry.secret.file, SLUICE_REGISTRY_SECRET) to the same long random value on every worker (without \
                 it a tenant with Kafka access could forge registry records and group members)"
            );
        }
        // With tls, the address others reach this worker's API at says so.
        let advertise = match (&args.admin_tls_cert, args.advertise_admin.clone()) {
            (Some(_), Some(a)) if !a.starts_with("https://") => Some(format!("https://{a}")),
            (_, a) => a,
        };
        let cluster = args.cluster.map(|name| ClusterConfig {
            name,
            capacity: args.capacity.unwrap_or(threads as u32),
            instance_id: args.instance_id,
            session_timeout: args.session_timeout,
            heartbeat_interval: args.heartbeat_interval,
            assignor: args.assignor,
            standby_replicas: args.standby_replicas,
            kafka: kafka.clone(),
            state_dir: args.state_dir.clone(),
            metadata_version: args.metadata_version,
            release_failed_tasks: args.release_failed_tasks,
            learners: LearnerPolicy {
                max_learners: args.max_learner_tasks as usize,
                acceptable_lag: args.acceptable_recovery_lag.min(i64::MAX as u64) as i64,
            },
            learner_rejoin: args.learner_rejoin,
            drain,
            scale_down_timeout: Some(args.scale_down_timeout).filter(|t| !t.is_zero()),
            admin: advertise.unwrap_or_default(),
            secret: secret.clone(),
        });
        let admin = AdminConfig {
            listen: args.metrics,
            max_component_bytes: args.max_component_size,
            tenancy: tenancy.clone(),
            metrics_public: !args.private_metrics,
            allow_open: args.allow_open_admin,
            tls: args.admin_tls_cert.clone().zip(args.admin_tls_key.clone()),
            tls_ca: args.admin_tls_ca.clone(),
            max_connections: args.admin_max_connections as usize,
            request_timeout: args.admin_request_timeout,
            secret: secret.clone(),
            jwt,
        };
        let commit_interval = args.commit_interval.unwrap_or(match args.processing_guarantee {
            Guarantee::ExactlyOnce => Duration::from_millis(100),
            Guarantee::AtLeastOnce => Duration::from_secs(1),
        });
        let schema_registry = args.schema_registry.settings()?;
        let worker = WorkerConfig {
            schema_registry,
            schema_cache_bytes: args.schema_cache,
            cluster,
            kafka,
            manifests: args.topologies,
            tasks: TaskSettings {
                batch_size: args.batch_size as usize,
                threads,
                max_batch_bytes: args.max_batch_bytes,
                prefetch_bytes: args.prefetch,
                standby_restore_rate: Some(args.standby_restore_rate).filter(|&r| r > 0),
                commit_interval,
                punctuate_interval: args.punctuate_interval,
                guarantee: args.processing_guarantee,
                idle_commit_interval: args
                    .idle_commit_interval
                    .unwrap_or(commit_interval.max(Duration::from_secs(60))),
                purge_interval: args.repartition_purge_interval,
            },
            changelogs: ChangelogSettings {
                replication_factor: args.changelog_replication_factor,
                min_insync_replicas: args.changelog_min_insync_replicas,
            },
            runtime: RuntimeConfig {
                memory_limit: args.memory_limit,
                call_timeout: args.call_timeout,
                host_memory_limit: args.host_memory_limit,
                pooling: !args.no_pooling,
                max_instances: args.max_instances,
                compile_cache: (!args.no_compile_cache).then(|| {
                    args.compile_cache
                        .clone()
                        .unwrap_or_else(|| args.state_dir.join("compiled"))
                }),
                compile_bounds: sluice::runtime::scan::Bounds {
                    max_functions: args.max_component_functions,
                    max_code_bytes: args.max_component_code as u64,
                },
                compile_in_child: Some(sluice::runtime::compiler::ChildCompiler {
                    program: std::env::current_exe()
                        .map_err(|e| anyhow::anyhow!("finding the sluice binary (to compile components with): {e}"))?,
                    timeout: args.compile_timeout,
                    memory: args.compile_memory as u64,
                }),
            },
            state_dir: args.state_dir,
            state_block_cache: args.state_cache,
            state_write_buffers: args.state_write_buffers,
            state_limit: args.state_limit as u64,
            tenancy,
            secret,
        };
        Ok((worker, admin))
    }
}

/// The cluster secret from its setting or its file (the file's first line), checked.
fn cluster_secret(value: Option<&str>, file: Option<&std::path::Path>) -> anyhow::Result<Option<ClusterSecret>> {
    let text = match (value, file) {
        (Some(_), Some(_)) => {
            anyhow::bail!("give registry.secret or registry.secret.file, not both")
        }
        (Some(v), None) => v.to_string(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("registry.secret.file {}: {e}", path.display()))?
            .lines()
            .next()
            .unwrap_or_default()
            .to_string(),
        (None, None) => return Ok(None),
    };
    ClusterSecret::new(text.trim().as_bytes().to_vec())
        .map(Some)
        .map_err(|e| anyhow::anyhow!("registry.secret: {e}"))
}

/// The exit status of a worker that stopped cleanly but had tasks fail while it ran.
pub const TASKS_FAILED: u8 = 3;

fn parse_guarantee(s: &str) -> Result<Guarantee, String> {
    s.parse()
}

/// Turns signals into stop requests. SIGTERM and SIGINT stop the worker, or with
/// `drain_first` drain it (a second one stops it); SIGUSR1 drains a worker in a cluster.
async fn signals(stop: std::sync::Arc<tokio::sync::watch::Sender<Stop>>, drain_first: bool, in_cluster: bool) {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut usr1) = match (signal(SignalKind::terminate()), signal(SignalKind::user_defined1())) {
        (Ok(t), Ok(u)) => (t, u),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!("cannot listen for SIGTERM and SIGUSR1: {e}");
            let _ = tokio::signal::ctrl_c().await;
            stop.send_replace(Stop::Now);
            return;
        }
    };
    loop {
        // Whether the signal asks for a stop (else for a drain).
        let stop_now = tokio::select! {
            _ = tokio::signal::ctrl_c() => { tracing::info!("SIGINT received"); true }
            _ = term.recv() => { tracing::info!("SIGTERM received"); true }
            _ = usr1.recv() => { tracing::info!("SIGUSR1 received"); false }
        };
        let running = *stop.borrow() == Stop::Run;
        let drain = running && if stop_now { drain_first } else { in_cluster };
        if drain {
            tracing::info!("draining: the other workers take this worker's tasks, then it exits");
            stop.send_replace(Stop::Drain);
        } else if stop_now {
            stop.send_replace(Stop::Now);
            return;
        }
    }
}

/// `sluice worker drain`: asks a worker, through its admin endpoint, to drain.
async fn ask_to_drain(args: &DrainArgs) -> anyhow::Result<ExitCode> {
    let admin = &args.admin;
    let client = sluice::admin::client::Client::new(args.ca.as_deref())?;
    let (status, body) = sluice::admin::client::Request::new(hyper::Method::POST, admin, "/drain")
        .bearer(args.token.as_deref())
        .timeout(Duration::from_secs(30))
        .send(&client)
        .await?;
    let text = String::from_utf8_lossy(&body);
    if status.is_success() {
        println!("{admin}: {}", text.trim());
        Ok(ExitCode::SUCCESS)
    } else {
        anyhow::bail!("{admin} refused to drain ({status}): {}", text.trim())
    }
}
