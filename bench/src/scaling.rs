//! Scaling: a stateful topology under steady input while the cluster grows from one worker
//! to two and three and shrinks back to two and one (each worker stopped with a plain
//! SIGTERM, as Kubernetes stops a pod), under these policies — `eager` (stop the world),
//! `sticky` without learners (a task moves at once and restores on its new worker),
//! `learners` (it moves once a learner there caught up; a stopped worker drains through
//! them) and `no-drain` (learners for scaling up, but a stopped worker hands its tasks over
//! at once). Pauses are measured from outside: for each input partition, the gaps between
//! consecutive outputs as the bench's own consumer sees them. `--trace` prints, for the
//! longest pause of each run, what every worker logged of the handover in one timeline.
//!
//! `--two-stage` runs the two-stage word count (`guests/word-totals`) instead: a stateless
//! `split` task per input partition writes each word to the repartition topic, and a
//! stateful `count` task per repartition partition (8) keeps the counts, so both kinds of
//! task move. Upstream pauses are measured per input partition as before; downstream ones
//! per output partition, which is the `count` task's (the output has as many partitions as
//! the repartition topic and both are written by key with Java's partitioner).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context as _};
use clap::Args;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::Message;

#[derive(Args)]
pub struct ScalingArgs {
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    bootstrap: String,
    /// The word-count component.
    #[arg(long)]
    component: PathBuf,
    /// Keys of state (in the changelog before the first worker starts).
    #[arg(long, default_value_t = 500_000)]
    keys: u64,
    #[arg(long, default_value_t = 8)]
    partitions: i32,
    /// Input records per second, spread over the partitions.
    #[arg(long, default_value_t = 2_000)]
    rate: u64,
    /// Policies to run, in order.
    #[arg(long, value_delimiter = ',', default_value = "eager,sticky,learners")]
    policies: Vec<String>,
    /// How long each step holds after the cluster settled.
    #[arg(long, default_value_t = 3)]
    hold_secs: u64,
    /// How long the steady state before the first step is measured: its largest gap is
    /// what the unmoved tasks' largest pause compares with, so as long as the steps take
    /// (about 20 s) by default — the largest of 2.5 s of gaps is smaller than the largest of
    /// 20 s even when nothing happens.
    #[arg(long, default_value_t = 20)]
    steady_secs: u64,
    /// Runs of each policy (the figures are their median, and the worst run).
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Print the timeline of the longest pause of each run: the outputs around it and what
    /// every worker logged of the handover (their `handover` log target at debug).
    #[arg(long)]
    trace: bool,
    /// Keep the workers' logs and state (their directory is printed).
    #[arg(long)]
    keep: bool,
    /// The component is the two-stage word count (`guests/word-totals`): measure the
    /// upstream `split` tasks per input partition and the stateful downstream `count`
    /// tasks per output partition.
    #[arg(long)]
    two_stage: bool,
    /// The workers' processing guarantee (`at-least-once`, their default, or
    /// `exactly-once`: outputs then show when their transaction commits).
    #[arg(long, default_value = "at-least-once")]
    processing_guarantee: String,
    /// How often the workers' tasks commit (their `--commit-interval`; default: theirs, 1s
    /// under at-least-once and 100ms under exactly-once; under exactly-once an output shows
    /// when its transaction commits, so this is a floor on the gaps seen).
    #[arg(long)]
    commit_interval: Option<String>,
    /// More arguments for every worker (repeat it: `--worker-arg=--standby-restore-rate
    /// --worker-arg=100000`).
    #[arg(long, allow_hyphen_values = true)]
    worker_arg: Vec<String>,
}

/// The repartition topic's partitions: `guests/word-totals` declares 8.
const WORD_TOTALS_REPARTITION: i32 = 8;

/// What the bench runs: which tasks there are and how an output names the task it measures.
#[derive(Clone, Copy)]
struct Layout {
    two_stage: bool,
    /// Input partitions: one (upstream) task each.
    input: i32,
}

impl Layout {
    /// Partitions of the stateful tasks: their changelog's, and the output's.
    fn stateful(&self) -> i32 {
        if self.two_stage {
            WORD_TOTALS_REPARTITION
        } else {
            self.input
        }
    }

    fn tasks(&self) -> usize {
        self.input as usize + if self.two_stage { self.stateful() as usize } else { 0 }
    }

    /// The measures: (what, the task a partition of it names, how many partitions). The
    /// first is per input partition; the two-stage layout adds one per output partition.
    fn measures(&self) -> Vec<Measure> {
        if self.two_stage {
            vec![
                Measure {
                    name: "upstream",
                    task: "split/",
                    by_output: false,
                    partitions: self.input,
                },
                Measure {
                    name: "downstream",
                    task: "count/",
                    by_output: true,
                    partitions: self.stateful(),
                },
            ]
        } else {
            vec![Measure {
                name: "tasks",
                task: "",
                by_output: false,
                partitions: self.input,
            }]
        }
    }
}

/// One way of timing pauses from outside: per input partition (its word names it) or per
/// output partition, each belonging to one task.
#[derive(Clone, Copy)]
struct Measure {
    name: &'static str,
    /// The task id of partition N, after `<topology>/`, is this followed by N.
    task: &'static str,
    by_output: bool,
    partitions: i32,
}

fn config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap);
    c
}

/// A worker process of the run, logging to a file.
struct Worker {
    child: Child,
    log: PathBuf,
    started: Instant,
}

impl Worker {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A run that fails midway leaves no worker behind (one left running took its tasks' share
/// of the machine from every later run).
impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The last assignment a worker logged: (active tasks, learners, rejoin).
fn last_assignment(log: &str) -> Option<(BTreeSet<String>, usize, bool)> {
    let line = log.lines().rfind(|l| l.contains(" assignment "))?;
    let field = |key: &str| {
        line.split(&format!(" {key}="))
            .nth(1)
            .map(|r| r.split(' ').next().unwrap_or(""))
    };
    let tasks = field("tasks")?
        .split(',')
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect();
    let learners = field("learner").and_then(|n| n.parse().ok()).unwrap_or(0);
    Some((tasks, learners, field("rejoin") == Some("true")))
}

/// Waits until `workers` hold every task, balanced (within one), with no learner left and
/// no rejoin pending. Returns when that was first seen.
fn until_balanced(workers: &mut [Worker], tasks: usize, timeout: Duration) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + timeout;
    let (low, high) = (tasks / workers.len(), tasks.div_ceil(workers.len()));
    loop {
        let states: Vec<_> = workers.iter().map(|w| last_assignment(&w.log())).collect();
        let union: BTreeSet<&String> = states.iter().flatten().flat_map(|(t, _, _)| t).collect();
        let balanced = states.iter().all(|s| {
            s.as_ref()
                .is_some_and(|(t, learners, rejoin)| (low..=high).contains(&t.len()) && *learners == 0 && !rejoin)
        });
        if balanced && union.len() == tasks {
            return Ok(Instant::now());
        }
        for w in workers.iter_mut() {
            if let Some(status) = w.child.try_wait()? {
                bail!("a worker exited ({status}); see {}", w.log.display());
            }
        }
        if Instant::now() > deadline {
            bail!("the cluster did not balance within {timeout:?}: {states:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the output consumer saw: arrival times per input partition and per output
/// partition, the broker's append times likewise (the output topic has
/// `message.timestamp.type=LogAppendTime`, so a stall of this process cannot show as a
/// pause there), outputs per word.
#[derive(Default)]
struct Seen {
    arrivals: HashMap<i32, Vec<SystemTime>>,
    arrivals_out: HashMap<i32, Vec<SystemTime>>,
    appended: HashMap<i32, Vec<SystemTime>>,
    appended_out: HashMap<i32, Vec<SystemTime>>,
    outputs: HashMap<String, u32>,
}

impl Seen {
    fn times(&self, by_output: bool, partition: i32) -> &[SystemTime] {
        let arrivals = if by_output { &self.arrivals_out } else { &self.arrivals };
        arrivals.get(&partition).map(Vec::as_slice).unwrap_or(&[])
    }

    fn append_times(&self, by_output: bool, partition: i32) -> &[SystemTime] {
        let appended = if by_output { &self.appended_out } else { &self.appended };
        appended.get(&partition).map(Vec::as_slice).unwrap_or(&[])
    }
}

/// One measure's pauses in one run.
#[derive(Clone)]
struct Pauses {
    measure: &'static str,
    moved_max: f64,
    moved_p99: f64,
    unmoved_max: f64,
    /// The largest gap of any partition in steady state, before the first step: what an
    /// unmoved task's pause compares with.
    steady_max: f64,
    /// The same three as the broker appended the outputs (LogAppendTime): what a stall of the
    /// bench's own consumer cannot add to.
    appended: (f64, f64, f64),
}

/// One policy's figures.
struct Figures {
    policy: String,
    /// The moved tasks' largest pause (over every measure) in each run (one run's figures
    /// have one).
    runs: Vec<f64>,
    /// The same as the broker appended the outputs.
    runs_appended: Vec<f64>,
    /// The largest over every measure: what the median is taken of.
    moved_max: f64,
    pauses: Vec<Pauses>,
    to_balanced: Vec<f64>,
    rebalances: usize,
    lost: usize,
    duplicated: usize,
}

impl Figures {
    /// The run with the median largest pause of the moved tasks, with every run's pause.
    fn median(mut runs: Vec<Figures>) -> Figures {
        let pauses: Vec<f64> = runs.iter().map(|f| f.moved_max).collect();
        let appended: Vec<f64> = runs.iter().flat_map(|f| f.runs_appended.iter().copied()).collect();
        runs.sort_by(|a, b| a.moved_max.total_cmp(&b.moved_max));
        let lost = runs.iter().map(|f| f.lost).sum();
        let duplicated = runs.iter().map(|f| f.duplicated).sum();
        let mut median = runs.swap_remove(runs.len() / 2);
        median.runs = pauses;
        median.runs_appended = appended;
        median.lost = lost;
        median.duplicated = duplicated;
        median
    }
}

pub async fn run(args: ScalingArgs) -> anyhow::Result<()> {
    // Before a million keys go into a changelog for nothing.
    if !args.component.is_file() {
        bail!(
            "the component {} does not exist: build the guests first (`dev/build-guests` prints where they are)",
            args.component.display()
        );
    }
    let layout = Layout {
        two_stage: args.two_stage,
        input: args.partitions,
    };
    println!(
        "scaling benchmark: {}, {} keys of state over {} partitions, {} records/s, {}, commits every {}, 1 -> 2 -> 3 -> 2 -> 1 workers (SIGTERM stops), Kafka at {}",
        if layout.two_stage {
            format!(
                "two-stage word count ({} split tasks -> repartition -> {} count tasks)",
                layout.input,
                layout.stateful()
            )
        } else {
            "word count".to_string()
        },
        args.keys,
        layout.stateful(),
        args.rate,
        args.processing_guarantee,
        args.commit_interval.as_deref().unwrap_or("the worker's default"),
        args.bootstrap
    );
    let mut all = Vec::new();
    for policy in &args.policies {
        let mut runs = Vec::new();
        for run in 0..args.runs.max(1) {
            let figures = one_policy(&args, layout, policy)
                .await
                .with_context(|| format!("policy {policy}, run {}", run + 1))?;
            runs.push(figures);
        }
        let figures = Figures::median(runs);
        for p in &figures.pauses {
            println!(
                "  {policy:<9} {:<10} moved tasks: largest pause {:.2} s, p99 {:.2} s; unmoved: largest {:.2} s; \
                 steady state (before the first step): largest gap {:.2} s",
                p.measure, p.moved_max, p.moved_p99, p.unmoved_max, p.steady_max
            );
            println!(
                "  {policy:<9} {:<10} as the broker appended them: moved {:.2} s, unmoved {:.2} s, steady {:.2} s",
                p.measure, p.appended.0, p.appended.1, p.appended.2
            );
        }
        println!(
            "  {policy:<9} to balanced after a start: {}; {} rebalances; {} lost, {} duplicated",
            joined(&figures.to_balanced, 1, " s", ", "),
            figures.rebalances,
            figures.lost,
            figures.duplicated
        );
        if figures.runs.len() > 1 {
            println!(
                "  {policy:<9} moved tasks' largest pause per run: {} (median {:.2} s, worst {:.2} s)",
                joined(&figures.runs, 2, " s", ", "),
                figures.moved_max,
                figures.runs.iter().copied().fold(0.0, f64::max)
            );
            let mut appended = figures.runs_appended.clone();
            appended.sort_by(f64::total_cmp);
            println!(
                "  {policy:<9} the same as the broker appended the outputs: {} (median {:.2} s, worst {:.2} s)",
                joined(&figures.runs_appended, 2, " s", ", "),
                appended[appended.len() / 2],
                appended.last().copied().unwrap_or(0.0)
            );
        }
        all.push(figures);
    }
    println!();
    println!(
        "  {:<9} {:<10} {:>14} {:>12} {:>16} {:>15} {:>22} {:>11} {:>5} {:>10}",
        "policy",
        "tasks",
        "moved max (s)",
        "moved p99",
        "unmoved max (s)",
        "steady max (s)",
        "start -> balanced (s)",
        "rebalances",
        "lost",
        "duplicated"
    );
    for f in &all {
        for p in &f.pauses {
            println!(
                "  {:<9} {:<10} {:>14.2} {:>12.2} {:>16.2} {:>15.2} {:>22} {:>11} {:>5} {:>10}",
                f.policy,
                p.measure,
                p.moved_max,
                p.moved_p99,
                p.unmoved_max,
                p.steady_max,
                joined(&f.to_balanced, 1, "", " / "),
                f.rebalances,
                f.lost,
                f.duplicated
            );
        }
    }
    Ok(())
}

/// Seconds as a list: each with `decimals` decimals and `unit`, separated by `separator`.
fn joined(seconds: &[f64], decimals: usize, unit: &str, separator: &str) -> String {
    seconds
        .iter()
        .map(|s| format!("{s:.decimals$}{unit}"))
        .collect::<Vec<_>>()
        .join(separator)
}

async fn one_policy(args: &ScalingArgs, layout: Layout, policy: &str) -> anyhow::Result<Figures> {
    let policy_args: &[&str] = match policy {
        "eager" => &["--assignor", "eager", "--max-learner-tasks", "0"],
        "sticky" => &["--max-learner-tasks", "0"],
        // The defaults: learners, and SIGTERM drains.
        "learners" => &[],
        "no-drain" => &["--no-drain-on-stop"],
        other => bail!("unknown policy {other:?} (eager, sticky, learners, no-drain)"),
    };
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (input, output, name) = (
        format!("scale-in-{id}"),
        format!("scale-out-{id}"),
        format!("scale-{id}"),
    );
    let changelog = format!("{name}-counts-changelog");
    let admin: AdminClient<DefaultClientContext> = config(&args.bootstrap).create()?;
    let p = layout.input;
    // The stateful tasks' partitions: the changelog's and the output's (in the two-stage
    // layout, the output partition of a word is then its `count` task's).
    let q = layout.stateful();
    let topics = [
        NewTopic::new(&input, p, TopicReplication::Fixed(1)),
        NewTopic::new(&output, q, TopicReplication::Fixed(1)).set("message.timestamp.type", "LogAppendTime"),
        NewTopic::new(&changelog, q, TopicReplication::Fixed(1)).set("cleanup.policy", "compact"),
    ];
    for r in admin.create_topics(&topics, &AdminOptions::new()).await? {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    // The state, straight into the changelog: the first worker restores it.
    let producer: ThreadedProducer<DefaultProducerContext> = config(&args.bootstrap)
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    for i in 0..args.keys {
        let key = format!("old-{i}");
        let value = 1u64.to_be_bytes();
        loop {
            let record = BaseRecord::to(&changelog)
                .partition((i % q as u64) as i32)
                .key(&key)
                .payload(&value[..]);
            match producer.send(record) {
                Ok(()) => break,
                Err((e, _)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => bail!("filling the changelog: {e}"),
            }
        }
    }
    producer.flush(Duration::from_secs(120))?;

    let dir = std::env::temp_dir().join(format!("sluice-scaling-{id}"));
    std::fs::create_dir_all(&dir)?;
    let manifest = dir.join("wc.toml");
    std::fs::write(
        &manifest,
        format!(
            "name = {name:?}\ncomponent = {:?}\n[sources]\nlines = {input:?}\n[sinks]\ncounts = {output:?}\n",
            args.component.display().to_string()
        ),
    )?;
    let cluster = format!("scale-{id}");
    let trace = args.trace;
    let start = |n: usize| -> anyhow::Result<Worker> {
        let log = dir.join(format!("worker-{n}.log"));
        let child = Command::new(crate::sluice_binary()?)
            .args(["worker", "--bootstrap", &args.bootstrap, "--cluster", &cluster])
            .arg("--topology")
            .arg(&manifest)
            .arg("--state-dir")
            .arg(dir.join(format!("state-{n}")))
            .args(["--threads", "1", "--capacity", "1", "--session-timeout", "10s"])
            .args(["--processing-guarantee", &args.processing_guarantee])
            .args(
                args.commit_interval
                    .iter()
                    .flat_map(|c| ["--commit-interval", c.as_str()]),
            )
            .args(policy_args)
            .args(&args.worker_arg)
            .env(
                "SLUICE_LOG",
                std::env::var("SCALING_WORKER_LOG").unwrap_or_else(|_| {
                    if trace {
                        "info,handover=debug".into()
                    } else {
                        "info".into()
                    }
                }),
            )
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        Ok(Worker {
            child,
            log,
            started: Instant::now(),
        })
    };

    // The output, read as it comes: the key is the word (`p<partition>x<sequence>`, one
    // word as the guest splits text), which names its input partition; the partition it
    // comes out of is its stateful task's.
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (seen, stop) = (seen.clone(), stop.clone());
        let consumer: BaseConsumer = config(&args.bootstrap)
            .set("group.id", format!("scaling-reader-{id}"))
            .set("auto.offset.reset", "earliest")
            .set("isolation.level", "read_committed")
            .create()?;
        consumer.subscribe(&[&output])?;
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Some(Ok(m)) = consumer.poll(Duration::from_millis(20)) else {
                    continue;
                };
                let now = SystemTime::now();
                let Some(word) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                    continue;
                };
                let Some(partition) = word
                    .strip_prefix('p')
                    .and_then(|r| r.split('x').next())
                    .and_then(|n| n.parse().ok())
                else {
                    continue;
                };
                let appended = m.timestamp().to_millis().map_or(now, |ms| {
                    SystemTime::UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)
                });
                let mut seen = seen.lock().unwrap();
                seen.arrivals.entry(partition).or_default().push(now);
                seen.arrivals_out.entry(m.partition()).or_default().push(now);
                seen.appended.entry(partition).or_default().push(appended);
                seen.appended_out.entry(m.partition()).or_default().push(appended);
                *seen.outputs.entry(word.to_string()).or_default() += 1;
            }
        })
    };

    let mut workers = vec![start(0)?];
    until_balanced(&mut workers, layout.tasks(), Duration::from_secs(300))?;
    // Wait for the restore: the first outputs of every partition come after it.
    let sending = Arc::new(AtomicBool::new(true));
    let writer = {
        let sending = sending.clone();
        let (bootstrap, input, rate) = (args.bootstrap.clone(), input.clone(), args.rate);
        std::thread::spawn(move || -> anyhow::Result<u64> {
            let producer: ThreadedProducer<DefaultProducerContext> =
                config(&bootstrap).set("linger.ms", "1").create()?;
            let started = Instant::now();
            let mut sent = 0u64;
            while sending.load(Ordering::Relaxed) {
                let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
                while sent < due {
                    let partition = (sent % p as u64) as i32;
                    let word = format!("p{partition}x{sent}");
                    producer
                        .send(BaseRecord::to(&input).partition(partition).key(&word).payload(&word))
                        .map_err(|(e, _)| e)?;
                    sent += 1;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            producer.flush(Duration::from_secs(30))?;
            Ok(sent)
        })
    };
    // Every partition flowing before the first step.
    let deadline = Instant::now() + Duration::from_secs(300);
    while {
        let seen = seen.lock().unwrap();
        seen.arrivals.len() < p as usize || seen.arrivals_out.len() < q as usize
    } {
        if Instant::now() > deadline {
            bail!("not every partition produced output within 300 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Steady state first: the gaps before any step are what a task's output normally
    // shows (its batches, the commit interval), for the unmoved tasks' pauses to compare with.
    let steady_start = SystemTime::now() + Duration::from_millis(500);
    std::thread::sleep(Duration::from_millis(500) + Duration::from_secs(args.steady_secs));
    let window_start = SystemTime::now();
    let since = |at: SystemTime| at.duration_since(window_start).unwrap_or_default().as_secs_f64();
    let hold = Duration::from_secs(args.hold_secs);

    // 1 -> 2 -> 3.
    let mut to_balanced = Vec::new();
    let mut steps = Vec::new();
    for n in 1..3 {
        steps.push((format!("start worker {n}"), since(SystemTime::now())));
        workers.push(start(n)?);
        let at = until_balanced(&mut workers, layout.tasks(), Duration::from_secs(300))?;
        to_balanced.push(at.duration_since(workers[n].started).as_secs_f64());
        std::thread::sleep(hold);
    }
    // 3 -> 2 -> 1: the newest worker is stopped with SIGTERM, then the next one (under
    // `learners` they drain; under the others they hand their tasks over at once).
    let mut stopped = Vec::new();
    for n in (1..3).rev() {
        steps.push((format!("stop worker {n}"), since(SystemTime::now())));
        let mut w = workers.remove(n);
        Command::new("kill")
            .args(["-TERM", &w.child.id().to_string()])
            .status()?;
        let deadline = Instant::now() + Duration::from_secs(300);
        while w.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                bail!("a stopped worker did not exit within 300 s; see {}", w.log.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        stopped.push(w);
        until_balanced(&mut workers, layout.tasks(), Duration::from_secs(300))?;
        std::thread::sleep(hold);
    }
    let mut last = workers;
    let workers = stopped;
    sending.store(false, Ordering::Relaxed);
    let window_end = SystemTime::now();
    let sent = writer
        .join()
        .map_err(|_| anyhow::anyhow!("the input writer panicked"))??;
    // Everything sent comes out (or 60 s pass).
    let deadline = Instant::now() + Duration::from_secs(60);
    while (seen.lock().unwrap().outputs.len() as u64) < sent && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = reader.join();
    Command::new("kill")
        .args(["-TERM", &last[0].child.id().to_string()])
        .status()?;
    let _ = last[0].child.wait();

    // Which tasks moved: started on more than one worker (or more than once).
    let mut logs: Vec<String> = workers.iter().map(Worker::log).collect();
    logs.push(last[0].log());
    // Worker numbers in start order: the stopped ones were 2 then 1; the last one is 0.
    let log_names = ["worker 2", "worker 1", "worker 0"];
    // Starts per task, by its id after `<topology>/` (`3`, or `split/3` and `count/3`).
    let mut starts: BTreeMap<String, usize> = BTreeMap::new();
    for log in &logs {
        for line in log
            .lines()
            .filter(|l| l.contains(" started ") && !l.contains("standby"))
        {
            if let Some(task) = line.rsplit("task=").next() {
                if let Some(id) = task.strip_prefix(&format!("{name}/")) {
                    *starts.entry(id.trim().to_string()).or_default() += 1;
                }
            }
        }
    }
    let generations: BTreeSet<i64> = logs
        .iter()
        .flat_map(|l| l.lines())
        .filter(|l| l.contains(" assignment "))
        .filter_map(|l| l.split(" generation=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    let seen = seen.lock().unwrap();
    let mut details = Vec::new();
    let mut pauses = Vec::new();
    // The longest pause: (seconds, task, last output before it, first after it).
    let mut longest = (0f64, String::new(), window_start, window_start);
    for measure in layout.measures() {
        let mut moved_gaps = Vec::new();
        let (mut moved_max, mut unmoved_max, mut steady_max) = (0f64, 0f64, 0f64);
        let mut appended = (0f64, 0f64, 0f64);
        for partition in 0..measure.partitions {
            let task = format!("{}{partition}", measure.task);
            let moved = starts.get(&task).copied().unwrap_or(0) > 1;
            // As appended: (moved, unmoved, steady) largest gaps.
            let times = seen.append_times(measure.by_output, partition);
            // A task's outputs go to several output partitions, so they arrive out of append
            // order: sorted first.
            let largest_within = |from: SystemTime, to: SystemTime| {
                let mut inside: Vec<SystemTime> = times.iter().copied().filter(|t| *t >= from && *t <= to).collect();
                inside.sort();
                inside
                    .windows(2)
                    .map(|w| w[1].duration_since(w[0]).unwrap_or_default().as_secs_f64())
                    .fold(0.0, f64::max)
            };
            let during = largest_within(window_start, window_end);
            if moved {
                appended.0 = appended.0.max(during);
            } else {
                appended.1 = appended.1.max(during);
            }
            appended.2 = appended.2.max(largest_within(steady_start, window_start));
            let steady: Vec<SystemTime> = seen
                .times(measure.by_output, partition)
                .iter()
                .copied()
                .filter(|t| *t >= steady_start && *t <= window_start)
                .collect();
            for w in steady.windows(2) {
                steady_max = steady_max.max(w[1].duration_since(w[0]).unwrap_or_default().as_secs_f64());
            }
            let inside: Vec<SystemTime> = seen
                .times(measure.by_output, partition)
                .iter()
                .copied()
                .filter(|t| *t >= window_start && *t <= window_end)
                .collect();
            let gaps: Vec<f64> = inside
                .windows(2)
                .map(|w| w[1].duration_since(w[0]).unwrap_or_default().as_secs_f64())
                .collect();
            let largest = gaps.iter().copied().fold(0.0, f64::max);
            if let Some(i) = gaps.iter().position(|&g| g == largest) {
                let at = since(inside[i]);
                details.push(format!("{task} {largest:.2} s at +{at:.1} s"));
                if largest > longest.0 {
                    longest = (largest, task.clone(), inside[i], inside[i + 1]);
                }
            }
            if moved {
                moved_max = moved_max.max(largest);
                moved_gaps.extend(gaps);
            } else {
                unmoved_max = unmoved_max.max(largest);
            }
        }
        moved_gaps.sort_by(|a, b| a.total_cmp(b));
        let moved_p99 = moved_gaps
            .get((moved_gaps.len() as f64 * 0.99) as usize)
            .copied()
            .unwrap_or(0.0);
        pauses.push(Pauses {
            measure: measure.name,
            moved_max,
            moved_p99,
            unmoved_max,
            steady_max,
            appended,
        });
    }
    println!(
        "  {policy}: steps {}; largest pause per task: {}",
        steps
            .iter()
            .map(|(what, at)| format!("{what} at +{at:.1} s"))
            .collect::<Vec<_>>()
            .join(", "),
        details.join(", ")
    );
    for p in &pauses {
        println!(
            "  {policy}: this run, {}: moved {:.2} s, unmoved {:.2} s, steady {:.2} s",
            p.measure, p.moved_max, p.unmoved_max, p.steady_max
        );
    }
    if args.trace && longest.0 > 0.0 {
        print_timeline(&name, longest, &logs, &log_names);
    }
    let lost = (0..sent)
        .filter(|s| !seen.outputs.contains_key(&format!("p{}x{s}", s % p as u64)))
        .count();
    let duplicated = seen.outputs.values().map(|&n| n.saturating_sub(1) as usize).sum();
    if args.keep {
        println!("  {policy}: logs and state kept in {}", dir.display());
    } else if lost == 0 && duplicated == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!(
            "  {policy}: {lost} records lost, {duplicated} duplicated; the workers' logs are in {}",
            dir.display()
        );
    }
    let moved_max = pauses.iter().map(|p| p.moved_max).fold(0.0, f64::max);
    Ok(Figures {
        policy: policy.to_string(),
        runs: vec![moved_max],
        runs_appended: vec![pauses.iter().map(|p| p.appended.0).fold(0.0, f64::max)],
        moved_max,
        pauses,
        to_balanced,
        rebalances: generations.len().saturating_sub(1),
        lost,
        duplicated,
    })
}

/// Prints one pause as a timeline: the output consumer's last record of the task before
/// it and first after it, and between them every line the workers logged of the
/// handover (the task's own lines and the group's), in milliseconds from the last output.
fn print_timeline(topology: &str, pause: (f64, String, SystemTime, SystemTime), logs: &[String], names: &[&str]) {
    let (seconds, id, last, first) = pause;
    let task = format!("task={topology}/{id}");
    let mut lines: Vec<(f64, String)> = Vec::new();
    let from = last - Duration::from_millis(400);
    for (log, name) in logs.iter().zip(names) {
        for line in log.lines() {
            let Some((stamp, rest)) = line.split_once(' ') else {
                continue;
            };
            let Ok(at) = humantime::parse_rfc3339(stamp) else {
                continue;
            };
            if at < from || at > first + Duration::from_millis(20) {
                continue;
            }
            let group = [
                " JoinGroup ",
                " SyncGroup ",
                " assignment ",
                "revoked tasks",
                "backing off",
                "rebalances",
                "caught up",
                "join prepared",
                "leaving the group",
                "drain",
            ]
            .iter()
            .any(|w| rest.contains(w));
            if !(rest.contains(&task) || group) {
                continue;
            }
            let ms = match at.duration_since(last) {
                Ok(d) => d.as_secs_f64() * 1e3,
                Err(e) => -e.duration().as_secs_f64() * 1e3,
            };
            let rest = rest.trim_start();
            let rest = rest.split_once(": ").map_or(rest, |(_, r)| r);
            lines.push((ms, format!("{name}: {}", rest.replace(&task, "").trim())));
        }
    }
    lines.push((
        0.0,
        "output consumer: last record of the task before the pause".to_string(),
    ));
    lines.push((
        seconds * 1e3,
        "output consumer: first record of the task after the pause".to_string(),
    ));
    lines.sort_by(|a, b| a.0.total_cmp(&b.0));
    println!("  timeline of the longest pause: {topology}/{id}, {seconds:.2} s");
    for (ms, what) in lines {
        println!("    {ms:>+8.1} ms  {what}");
    }
}
