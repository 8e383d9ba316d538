//! `sluice status`: the cluster as its group coordinator knows it — generation, workers, and
//! every task with its role, owner and changelog lag.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args, ValueEnum};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::Serialize;
use sluice::group::metadata::{Assignment, MemberMetadata};
use sluice::group::TaskId;
use sluice::worker::group_runner::group_id;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    bootstrap: String,
    /// The cluster name the workers were started with.
    #[arg(long, env = "SLUICE_CLUSTER")]
    cluster: String,
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
}

#[derive(Debug, Serialize)]
struct Status {
    cluster: String,
    group: String,
    state: String,
    generation: Option<i32>,
    workers: Vec<Worker>,
    tasks: Vec<Task>,
    /// Topologies the workers disagree on (different components, bindings or partitions).
    problems: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Worker {
    member: String,
    worker_id: String,
    host: String,
    capacity: u32,
    version: u16,
    leaving: bool,
    active: usize,
    standby: usize,
}

#[derive(Debug, Serialize)]
struct Task {
    task: String,
    role: &'static str,
    owner: String,
    /// Changelog records the owner's local state is behind (stateful tasks).
    lag: Option<i64>,
    /// Why the task failed (role `failed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

pub fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let group = group_id(&args.cluster);
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", &args.bootstrap).create()?;
    let list = consumer
        .fetch_group_list(Some(&group), Duration::from_secs(15))
        .with_context(|| format!("describing group {group} at {}", args.bootstrap))?;
    let Some(info) = list.groups().iter().find(|g| g.name() == group) else {
        bail!("no group {group}: is a worker running with --cluster {}?", args.cluster);
    };
    if info.members().is_empty() {
        bail!(
            "cluster {} has no workers (group {group} is {})",
            args.cluster,
            info.state()
        );
    }
    // Changelog ends per (topology, partition), for lag.
    let metadata = consumer.fetch_metadata(None, Duration::from_secs(15))?;
    let mut ends: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for topic in metadata.topics().iter().filter(|t| t.name().ends_with("-changelog")) {
        for p in topic.partitions() {
            if let Ok((_, high)) = consumer.fetch_watermarks(topic.name(), p.id(), Duration::from_secs(10)) {
                ends.insert((topic.name().to_string(), p.id()), high);
            }
        }
    }
    let changelog_end = |task: &TaskId| -> Option<i64> {
        let prefix = format!("{}-", task.topology);
        let matching: Vec<i64> = ends
            .iter()
            .filter(|((t, p), _)| t.starts_with(&prefix) && *p == task.partition as i32)
            .map(|(_, e)| *e)
            .collect();
        (!matching.is_empty()).then(|| matching.iter().sum())
    };

    let mut status = Status {
        cluster: args.cluster.clone(),
        group: group.clone(),
        state: info.state().to_string(),
        generation: None,
        workers: vec![],
        tasks: vec![],
        problems: vec![],
    };
    let mut metas = BTreeMap::new();
    for member in info.members() {
        let meta = member.metadata().map(MemberMetadata::decode).transpose().ok().flatten();
        let assignment = member.assignment().map(Assignment::decode).transpose().ok().flatten();
        let (meta, assignment) = (meta.unwrap_or_default(), assignment.unwrap_or_default());
        if assignment.generation > 0 {
            status.generation = Some(status.generation.unwrap_or(0).max(assignment.generation));
        }
        let owner = member.id().to_string();
        let sums: BTreeMap<&TaskId, i64> = meta.offset_sums.iter().map(|(t, s)| (t, *s)).collect();
        let failed: BTreeMap<&TaskId, &String> = meta.failed.iter().map(|(t, e)| (t, e)).collect();
        for (role, tasks) in [
            ("active", &assignment.active),
            ("standby", &assignment.standby),
            ("learner", &assignment.learner),
        ] {
            for t in tasks {
                let lag = changelog_end(t).map(|end| (end - sums.get(t).copied().unwrap_or(0)).max(0));
                let error = failed.get(t).map(|e| e.to_string());
                status.tasks.push(Task {
                    task: t.to_string(),
                    role: if error.is_some() { "failed" } else { role },
                    owner: owner.clone(),
                    lag,
                    error,
                });
            }
        }
        status.workers.push(Worker {
            member: owner,
            worker_id: uuid::Uuid::from_bytes(meta.worker_id).to_string(),
            host: member.client_host().to_string(),
            capacity: meta.capacity,
            version: meta.version,
            leaving: meta.leaving,
            active: assignment.active.len(),
            standby: assignment.standby.len(),
        });
        metas.insert(member.id().to_string(), meta);
    }
    status.problems = sluice::group::placement::plan(&metas, &[]).problems;
    status.tasks.sort_by(|a, b| (&a.task, a.role).cmp(&(&b.task, b.role)));

    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&status)?),
        Output::Text => print_text(&status),
    }
    Ok(ExitCode::SUCCESS)
}

fn print_text(s: &Status) {
    let generation = s.generation.map_or("-".to_string(), |g| g.to_string());
    println!(
        "cluster {} (group {}): {}, generation {generation}, {} worker(s)",
        s.cluster,
        s.group,
        s.state,
        s.workers.len()
    );
    println!();
    println!(
        "{:<48} {:<36} {:<16} {:>8} {:>7} {:>6} {:>7}",
        "WORKER", "WORKER ID", "HOST", "CAPACITY", "VERSION", "ACTIVE", "STANDBY"
    );
    for w in &s.workers {
        let leaving = if w.leaving { " (leaving)" } else { "" };
        println!(
            "{:<48} {:<36} {:<16} {:>8} {:>7} {:>6} {:>7}{leaving}",
            w.member, w.worker_id, w.host, w.capacity, w.version, w.active, w.standby
        );
    }
    println!();
    println!("{:<48} {:<8} {:<48} {:>8}", "TASK", "ROLE", "OWNER", "LAG");
    for t in &s.tasks {
        let lag = t.lag.map_or("-".to_string(), |l| l.to_string());
        println!("{:<48} {:<8} {:<48} {:>8}", t.task, t.role, t.owner, lag);
    }
    let failed: Vec<&Task> = s.tasks.iter().filter(|t| t.error.is_some()).collect();
    if !failed.is_empty() {
        println!();
        println!("FAILED TASKS");
        for t in failed {
            println!("  {}: {}", t.task, t.error.as_deref().unwrap_or_default());
        }
    }
    if !s.problems.is_empty() {
        println!();
        println!("PROBLEMS");
        for p in &s.problems {
            println!("  {p}");
        }
    }
}
