//! Command-line interface: argument parsing and dispatch to the subcommands.

mod acls;
mod build;
pub mod config;
mod jwt_args;
mod kafka_args;
mod kafka_tools;
mod new;
mod registry_args;
mod state;
mod status;
mod topologies;
mod worker;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Sluice runs stream-processing topologies, compiled to WebAssembly components, on Apache Kafka.
#[derive(Debug, Parser)]
#[command(name = "sluice", version, about)]
pub struct Cli {
    /// Log filter, e.g. `info` or `sluice=debug` (default: $SLUICE_LOG, then `info`).
    #[arg(long, global = true)]
    pub log: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run topologies: one task per source partition, until SIGINT or SIGTERM
    /// (`sluice worker drain` drains a running one).
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Worker(Box<worker::WorkerArgs>),
    /// The worker settings from the configuration file, the environment and flags, with
    /// each value's origin (`sluice config show --config FILE`).
    Config(config::ConfigArgs),
    /// Show a cluster: generation, workers, and every task with its role, owner and lag.
    Status(status::StatusArgs),
    /// Upload a topology (component and manifest) to a cluster through any worker's admin
    /// API; every worker runs it. Uploading a name again upgrades it (state kept).
    Deploy(topologies::DeployArgs),
    /// List, describe or delete the topologies uploaded to a cluster.
    Topologies(topologies::TopologiesArgs),
    /// Read a key (or a range of keys) of a topology's store, as committed on the workers
    /// that run its tasks.
    Query(topologies::QueryArgs),
    /// The tenants of a cluster; the hashed form of a token for the configuration file.
    Tenants(topologies::TenantsArgs),
    /// Scaffold a topology project (Rust, or Python with `--python`) that builds a component,
    /// outside this repository.
    New(new::NewArgs),
    /// Build a topology project (Python or Rust) into a component and print where it is.
    Build(build::BuildArgs),
    /// Inspect a stopped worker's local state.
    State(state::StateArgs),
    /// The Kafka ACLs of a cluster's workers (`--worker`) or of one tenant (`--tenant NAME`),
    /// as `kafka-acls.sh` commands, or created with `--apply`.
    Acls(acls::AclsArgs),
    /// Create topics.
    Topics(kafka_tools::TopicsArgs),
    /// Produce lines from standard input as records (`key<TAB>value`, or just `value`).
    Produce(kafka_tools::ProduceArgs),
    /// Print records from a topic as `partition/offset key<TAB>value`.
    Consume(kafka_tools::ConsumeArgs),
    /// Compile a component as a worker's engine would, writing wasmtime's serialized form
    /// (what a worker runs as a child to compile under its limits).
    #[command(hide = true)]
    CompileComponent {
        input: std::path::PathBuf,
        output: std::path::PathBuf,
    },
}

/// The first line of `file`, trimmed: how secrets are read from files (`setting` names the
/// setting in errors; an empty line is one).
pub(crate) fn first_line(setting: &str, file: &std::path::Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("{setting} {}: {e}", file.display()))?;
    let line = text.lines().next().unwrap_or_default().trim().to_string();
    if line.is_empty() {
        anyhow::bail!("{setting} {}: the file's first line is empty", file.display());
    }
    Ok(line)
}

pub fn init_logging(filter: Option<&str>) {
    let filter = filter
        .map(str::to_owned)
        .or_else(|| std::env::var("SLUICE_LOG").ok())
        .unwrap_or_else(|| "info".to_owned());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("sluice: ignoring the log filter {filter:?}: {e}");
        tracing_subscriber::EnvFilter::new("info")
    });
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

pub async fn run(cli: Cli, layered: config::Layered) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Worker(args) => worker::run(*args, layered).await,
        Command::Config(args) => config::run(args, layered),
        Command::State(args) => state::run(args),
        Command::Deploy(args) => topologies::deploy(args).await,
        Command::Topologies(args) => topologies::topologies(args).await,
        Command::Tenants(args) => topologies::tenants(args).await,
        Command::Query(args) => topologies::query(args).await,
        Command::New(args) => new::run(args),
        Command::Build(args) => build::run(args),
        Command::Status(args) => status::run(args).await,
        Command::Acls(args) => acls::run(args).await,
        Command::Topics(args) => kafka_tools::topics(args).await,
        Command::Produce(args) => kafka_tools::produce(args).await,
        Command::Consume(args) => kafka_tools::consume(args).await,
        Command::CompileComponent { input, output } => {
            tokio::task::block_in_place(|| sluice::runtime::compiler::compile_file(&input, &output))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}
