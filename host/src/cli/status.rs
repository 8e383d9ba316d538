//! `sluice status`: the cluster as its group coordinator knows it — generation, workers, and
//! every task with its role, owner and changelog lag — and, from each worker's admin
//! endpoint (`GET /status`), what it is doing now: learners' and restorations' progress,
//! time tasks could not process, rebalances. A worker whose endpoint cannot be reached is
//! shown as of its last join, and named under PROBLEMS.
//!
//! With a tenant's token, the workers answer for its topologies only and say so
//! (`narrowed_to`); what the group itself shows (other workers' assignments, the counts,
//! disagreements) is narrowed to the same topologies. A token no worker answered to shows
//! no task at all: nothing said what it may see.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args, ValueEnum};
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde::Serialize;
use sluice::group::cluster_group;
use sluice::group::metadata::{Assignment, MemberMetadata};
use sluice::group::TaskId;
use sluice::kafka::Authorize as _;
use sluice::worker::board::{Phase, Role, WorkerStatus};

mod sight;
mod text;

use sight::{topology_of, Sight};
use text::print_text;

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    bootstrap: String,
    #[command(flatten)]
    kafka: super::kafka_args::KafkaArgs,
    /// The cluster name the workers were started with.
    #[arg(long, env = "SLUICE_CLUSTER")]
    cluster: String,
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
    /// Show the status again every this many seconds, until interrupted.
    #[arg(long, value_name = "SECONDS")]
    watch: Option<f64>,
    /// The admin's token, when the cluster's admin API requires one.
    #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The CA (PEM) to check the workers' `https://` admin certificates against.
    #[arg(long, env = "SLUICE_ADMIN_CA", value_name = "FILE.pem")]
    ca: Option<std::path::PathBuf>,
}

/// How long a worker's admin endpoint may take to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

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
    /// The last handovers each reachable worker saw, newest first.
    handovers: Vec<Handover>,
    /// Components compiling on each reachable worker (uploads checked, topologies
    /// starting), then its compiles of the last ten minutes.
    compiles: Vec<Compile>,
}

#[derive(Debug, Serialize)]
struct Compile {
    worker: String,
    #[serde(flatten)]
    compile: sluice::runtime::progress::CompileStatus,
}

#[derive(Debug, Serialize)]
struct Handover {
    worker: String,
    #[serde(flatten)]
    handover: sluice::worker::board::HandoverStatus,
}

#[derive(Debug, Serialize)]
struct Worker {
    member: String,
    worker_id: String,
    host: String,
    capacity: u32,
    /// The metadata version it joined in (the group's: see `group::metadata`).
    version: u16,
    /// The newest metadata version it speaks.
    supported: u16,
    /// Its release (empty: a release before 0.3, which does not say).
    release: String,
    leaving: bool,
    /// Its tasks by role that the caller may see (none: no worker said what that is).
    active: Option<usize>,
    standby: Option<usize>,
    learner: Option<usize>,
    /// Its admin endpoint (empty: none).
    admin: String,
    /// Whether the figures below and its tasks' progress came from its admin endpoint.
    live: bool,
    rebalances: Option<u64>,
    last_rebalance_seconds: Option<f64>,
    rebalancing: Option<bool>,
}

#[derive(Debug, Serialize)]
struct Task {
    task: String,
    role: &'static str,
    owner: String,
    /// Changelog records the owner's local state is behind (stateful tasks): live from the
    /// worker, else as of its last join.
    lag: Option<i64>,
    /// Active tasks: starting, restoring, running or failed (from the worker).
    #[serde(skip_serializing_if = "Option::is_none")]
    phase: Option<Phase>,
    /// Share restored of what there was to restore when the role began (learners,
    /// standbys, restoring tasks), 0 to 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    progress: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    restore_rate: Option<f64>,
    /// Seconds the task spent on its owner unable to process.
    #[serde(skip_serializing_if = "Option::is_none")]
    unavailable_seconds: Option<f64>,
    /// Why the task failed (role `failed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// What an active task waits for besides its records (a schema from the registry).
    #[serde(skip_serializing_if = "Option::is_none")]
    waiting: Option<String>,
}

pub async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let kafka = args
        .kafka
        .settings(&args.bootstrap)?
        .start_tokens()
        .await
        .map_err(anyhow::Error::msg)?;
    sluice::group::connection::check_brokers(&kafka, Duration::from_secs(15))
        .await
        .context("connecting to Kafka")?;
    let consumer: sluice::kafka::Authorized<BaseConsumer> = kafka.client().authorized(&kafka)?;
    let Some(every) = args.watch else {
        return show(&args, &consumer).await;
    };
    anyhow::ensure!(every > 0.0, "--watch takes a number of seconds above 0");
    loop {
        // Clear the screen and go home, like watch(1).
        if matches!(args.output, Output::Text) {
            print!("\x1b[2J\x1b[H");
        }
        if let Err(e) = show(&args, &consumer).await {
            println!("{e:#}");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs_f64(every)) => {}
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
        }
    }
}

async fn show(args: &StatusArgs, consumer: &BaseConsumer) -> anyhow::Result<ExitCode> {
    let group = cluster_group(&args.cluster);
    let (info, changelog_ends) = tokio::task::block_in_place(|| describe(consumer, &group))?;
    let Some(info) = info else {
        bail!("no group {group}: is a worker running with --cluster {}?", args.cluster);
    };
    let status = gather(args, &group, &info, &changelog_ends).await?;
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&status)?),
        Output::Text => print_text(&status),
    }
    Ok(ExitCode::SUCCESS)
}

/// A group as the coordinator describes it.
struct GroupInfo {
    state: String,
    members: Vec<MemberInfo>,
}

/// A member: id, client host, metadata and assignment (undecoded).
type MemberInfo = (String, String, Option<Vec<u8>>, Option<Vec<u8>>);

/// The group's members and the changelogs' end offsets per (topic, partition).
#[allow(clippy::type_complexity)]
fn describe(consumer: &BaseConsumer, group: &str) -> anyhow::Result<(Option<GroupInfo>, BTreeMap<(String, i32), i64>)> {
    let list = consumer
        .fetch_group_list(Some(group), Duration::from_secs(15))
        .with_context(|| format!("describing group {group}"))?;
    let Some(info) = list.groups().iter().find(|g| g.name() == group) else {
        return Ok((None, BTreeMap::new()));
    };
    let info = GroupInfo {
        state: info.state().to_string(),
        members: info
            .members()
            .iter()
            .map(|m| {
                (
                    m.id().to_string(),
                    m.client_host().to_string(),
                    m.metadata().map(<[u8]>::to_vec),
                    m.assignment().map(<[u8]>::to_vec),
                )
            })
            .collect(),
    };
    if info.members.is_empty() {
        return Ok((Some(info), BTreeMap::new()));
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
    Ok((Some(info), ends))
}

async fn gather(
    args: &StatusArgs,
    group: &str,
    info: &GroupInfo,
    ends: &BTreeMap<(String, i32), i64>,
) -> anyhow::Result<Status> {
    if info.members.is_empty() {
        bail!(
            "cluster {} has no workers (group {group} is {})",
            args.cluster,
            info.state
        );
    }
    let mut status = Status {
        cluster: args.cluster.clone(),
        group: group.to_string(),
        state: info.state.clone(),
        generation: None,
        workers: vec![],
        tasks: vec![],
        problems: vec![],
        handovers: vec![],
        compiles: vec![],
    };
    let mut metas = BTreeMap::new();
    let decoded = decode_members(&info.members);
    // Every worker's live status, asked for at once.
    let asks = decoded.iter().map(|(_, _, meta, _)| async move {
        if meta.admin.is_empty() {
            return None;
        }
        Some(live_status(args, &meta.admin).await)
    });
    let answers = futures::future::join_all(asks).await;
    let sight = Sight::of(args.token.is_some(), &answers);
    if let Sight::Unknown = sight {
        status.problems.push(
            "no worker answered with this token, so what it may see is not known: tasks are not shown \
             (run without --token for the group's own view, which Kafka's ACLs govern)"
                .to_string(),
        );
    }
    for ((member_id, host, meta, assignment), live) in decoded.into_iter().zip(answers) {
        if assignment.generation > 0 {
            status.generation = Some(status.generation.unwrap_or(0).max(assignment.generation));
        }
        let owner = member_id.clone();
        let live = match live {
            Some(Ok(live)) => Some(live),
            Some(Err(e)) => {
                status
                    .problems
                    .push(format!("worker {owner}: shown as of its last join ({e:#})"));
                None
            }
            None => None,
        };
        match &live {
            Some(live) => status
                .tasks
                .extend(live_tasks(&owner, live).filter(|t| sight.sees(topology_of(&t.task)))),
            None => status
                .tasks
                .extend(last_join_tasks(&owner, &meta, &sight.cut(&assignment), ends)),
        }
        for c in live
            .iter()
            .flat_map(|l| &l.compiles)
            .filter(|c| sight.sees(&c.topology))
        {
            status.compiles.push(Compile {
                worker: owner.clone(),
                compile: c.clone(),
            });
        }
        for h in live
            .iter()
            .flat_map(|l| &l.handovers)
            .filter(|h| sight.sees(topology_of(&h.task)))
        {
            status.handovers.push(Handover {
                worker: owner.clone(),
                handover: h.clone(),
            });
        }
        status
            .workers
            .push(worker_row(owner, host, &meta, &assignment, &sight, live.as_ref()));
        metas.insert(member_id, meta);
    }
    let disagreements = sluice::group::placement::plan(&metas, &[]).problems;
    status.problems.extend(
        disagreements
            .into_iter()
            .filter(|p| sight.sees(&p.topology))
            .map(|p| p.text),
    );
    status.tasks.sort_by(|a, b| (&a.task, a.role).cmp(&(&b.task, b.role)));
    status
        .handovers
        .sort_by(|a, b| a.handover.ago_seconds.total_cmp(&b.handover.ago_seconds));
    Ok(status)
}

/// Each member's metadata and assignment, decoded (a part that does not decode is shown
/// empty).
fn decode_members(members: &[MemberInfo]) -> Vec<(String, String, MemberMetadata, Assignment)> {
    use sluice::group::framing::{unframe_assignment, unframe_metadata};
    members
        .iter()
        .map(|(id, host, meta, assignment)| {
            let meta = meta
                .as_deref()
                .and_then(|b| MemberMetadata::decode(&unframe_metadata(b).ok()?).ok());
            let assignment = assignment
                .as_deref()
                .and_then(|b| Assignment::decode(&unframe_assignment(b).ok()?).ok());
            (
                id.clone(),
                host.clone(),
                meta.unwrap_or_default(),
                assignment.unwrap_or_default(),
            )
        })
        .collect()
}

/// The sum of the end offsets of `task`'s changelogs at its partition (none known: none).
fn changelog_end(ends: &BTreeMap<(String, i32), i64>, task: &TaskId) -> Option<i64> {
    let prefix = format!("{}-", task.topology);
    let matching: Vec<i64> = ends
        .iter()
        .filter(|((t, p), _)| t.starts_with(&prefix) && *p == task.partition as i32)
        .map(|(_, e)| *e)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

/// A reachable worker's tasks, as it reports them now.
fn live_tasks<'a>(owner: &'a str, live: &'a WorkerStatus) -> impl Iterator<Item = Task> + 'a {
    live.tasks.iter().map(move |t| Task {
        task: t.task.clone(),
        role: if t.phase == Some(Phase::Failed) {
            "failed"
        } else {
            t.role.as_str()
        },
        owner: owner.to_string(),
        lag: t.lag,
        phase: t.phase,
        progress: t.progress,
        restore_rate: t.restore_rate,
        unavailable_seconds: (t.role == Role::Active).then_some(t.unavailable_seconds),
        error: t.error.clone(),
        waiting: t.waiting.clone(),
    })
}

/// An unreachable worker's tasks as of its last join: its assignment, with lags from the
/// offset sums its metadata told against the changelogs' ends now.
fn last_join_tasks(
    owner: &str,
    meta: &MemberMetadata,
    assignment: &Assignment,
    ends: &BTreeMap<(String, i32), i64>,
) -> Vec<Task> {
    let sums: BTreeMap<&TaskId, i64> = meta.offset_sums.iter().map(|(t, s)| (t, *s)).collect();
    let failed: BTreeMap<&TaskId, &String> = meta.failed.iter().map(|(t, e)| (t, e)).collect();
    let mut tasks = Vec::new();
    for (role, assigned) in [
        ("active", &assignment.active),
        ("standby", &assignment.standby),
        ("learner", &assignment.learner),
    ] {
        for t in assigned {
            // A sub-topology that keeps no state has no changelog lag (the changelogs at
            // its partition are another sub-topology's).
            let stateless = t.sub.as_deref().is_some_and(|sub| {
                meta.topologies
                    .iter()
                    .flatten()
                    .any(|info| *info.name == *t.topology && info.subs.iter().any(|s| s.name == sub && !s.stateful))
            });
            let lag = changelog_end(ends, t)
                .filter(|_| !stateless)
                .map(|end| (end - sums.get(t).copied().unwrap_or(0)).max(0));
            let error = failed.get(t).map(|e| e.to_string());
            tasks.push(Task {
                task: t.to_string(),
                role: if error.is_some() { "failed" } else { role },
                owner: owner.to_string(),
                lag,
                phase: None,
                progress: None,
                restore_rate: None,
                unavailable_seconds: None,
                error,
                waiting: None,
            });
        }
    }
    tasks
}

/// A worker's row: from its metadata and assignment, and its live figures when it answered.
fn worker_row(
    owner: String,
    host: String,
    meta: &MemberMetadata,
    assignment: &Assignment,
    sight: &Sight,
    live: Option<&WorkerStatus>,
) -> Worker {
    let seen = (*sight != Sight::Unknown).then(|| sight.cut(assignment));
    Worker {
        member: owner,
        worker_id: uuid::Uuid::from_bytes(meta.worker_id).to_string(),
        host,
        capacity: meta.capacity,
        version: meta.version,
        supported: meta.supported,
        release: meta.release.clone(),
        leaving: meta.leaving,
        active: seen.as_ref().map(|a| a.active.len()),
        standby: seen.as_ref().map(|a| a.standby.len()),
        learner: seen.as_ref().map(|a| a.learner.len()),
        admin: meta.admin.clone(),
        live: live.is_some(),
        rebalances: live.map(|l| l.rebalances),
        last_rebalance_seconds: live.and_then(|l| l.last_rebalance_seconds),
        rebalancing: live.map(|l| l.rebalancing),
    }
}

/// A worker's `GET /status`.
async fn live_status(args: &StatusArgs, admin: &str) -> anyhow::Result<WorkerStatus> {
    let client = sluice::admin::client::Client::new(args.ca.as_deref())?;
    let (code, body) = sluice::admin::client::Request::new(hyper::Method::GET, admin, "/status")
        .bearer(args.token.as_deref())
        .timeout(ASK_TIMEOUT)
        .send(&client)
        .await?;
    anyhow::ensure!(code.is_success(), "GET http://{admin}/status answered {code}");
    serde_json::from_slice(&body).with_context(|| format!("reading the status from http://{admin}/status"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ends() -> BTreeMap<(String, i32), i64> {
        BTreeMap::from([
            (("orders-counts-changelog".to_string(), 0), 100),
            (("orders-totals-changelog".to_string(), 0), 50),
            (("orders-counts-changelog".to_string(), 1), 7),
            (("other-changelog".to_string(), 0), 1_000),
        ])
    }

    #[test]
    fn a_tasks_changelog_end_sums_its_topologys_changelogs_at_its_partition() {
        assert_eq!(changelog_end(&ends(), &TaskId::new("orders", 0)), Some(150));
        assert_eq!(changelog_end(&ends(), &TaskId::new("orders", 1)), Some(7));
        assert_eq!(changelog_end(&ends(), &TaskId::new("orders", 2)), None);
        assert_eq!(changelog_end(&ends(), &TaskId::new("stateless", 0)), None);
    }

    #[test]
    fn an_unreachable_workers_tasks_show_their_lag_as_of_its_last_join_and_its_failures() {
        let meta = MemberMetadata {
            offset_sums: vec![(TaskId::new("orders", 0), 120)],
            failed: vec![(TaskId::new("orders", 1), "trapped".to_string())],
            ..Default::default()
        };
        let assignment = Assignment {
            active: vec![TaskId::new("orders", 0), TaskId::new("orders", 1)],
            standby: vec![TaskId::new("other", 0)],
            ..Default::default()
        };
        let tasks = last_join_tasks("m1", &meta, &assignment, &ends());
        let seen: Vec<(String, &str, Option<i64>, Option<&str>)> = tasks
            .iter()
            .map(|t| (t.task.clone(), t.role, t.lag, t.error.as_deref()))
            .collect();
        assert_eq!(
            seen,
            vec![
                ("orders/0".to_string(), "active", Some(30), None),
                ("orders/1".to_string(), "failed", Some(7), Some("trapped")),
                ("other/0".to_string(), "standby", Some(1_000), None),
            ]
        );
        assert!(tasks.iter().all(|t| t.owner == "m1" && t.phase.is_none()));
    }
}
