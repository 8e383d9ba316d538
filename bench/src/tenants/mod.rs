//! Tenant isolation (issue 12): tenant B's throughput alone, then on fresh input while
//! tenant A's topology loops until its deadline on every record, then alone again once A
//! is deleted; the ratio is B beside A over the mean of the two alone (a drift over the run,
//! which shows as the two alone figures differing, is not charged to A). Everything goes the
//! product's way: workers of a cluster (`--cluster`) sharing a configuration file of
//! tenants (tokens, namespaces, limits), topologies uploaded with `sluice deploy` under each
//! tenant's token, A's deadline from its tenant's `max-call-timeout`, A's `on-error = "skip"`
//! so a record that hits the deadline is passed over and the next one loops again.
//!
//! B's throughput is read from outside, from its committed offsets (from when all its tasks
//! have started to the commit of its last record; `tests/tests/all/hostile.rs` starts at
//! the first commit, which on short runs counts the other tasks' start-up); the workers' CPU from
//! `/proc/PID/stat`, their peak RSS from `VmHWM`; what A did meanwhile from the workers'
//! metrics (`sluice_records_rejected_total`, `sluice_guest_calls_total`,
//! `sluice_guest_call_seconds_total` of A's topology).

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use workers::*;

mod workers;

#[derive(Args)]
pub struct TenantsArgs {
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    bootstrap: String,
    /// The uppercase component (tenant B's topology).
    #[arg(long)]
    component: PathBuf,
    /// The hostile component (tenant A's topology: it spins on a record whose value is `loop`).
    #[arg(long)]
    hostile: PathBuf,
    /// B's records in each measurement (each on fresh input).
    #[arg(long, default_value_t = 2_000_000)]
    records: u64,
    /// Value size of B's records in bytes.
    #[arg(long, default_value_t = 100)]
    size: usize,
    /// Partitions of B's input (its tasks).
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    /// Partitions of A's input (its looping tasks).
    #[arg(long, default_value_t = 1)]
    hostile_partitions: i32,
    /// Tenant A's `max-call-timeout` in milliseconds (its manifest asks for 10 s).
    #[arg(long, default_value_t = 100)]
    deadline_ms: u64,
    /// `loop` records per partition in A's input before it starts: its first batch (the
    /// worker's `--batch-size`, 500, at most) is then all `loop`, and the worker isolates
    /// the records of a failed batch by halving it, so A's first batch alone keeps it in
    /// its deadline for about (2 × batch - 1) × deadline.
    #[arg(long, default_value_t = 500)]
    loop_backlog: u64,
    /// `loop` records per second into A's input besides, while it runs: more than A can
    /// pass over, so it never runs out of them.
    #[arg(long, default_value_t = 20)]
    loop_rate: u64,
    /// Instead of looping until its deadline, A's every call keeps busy for PERCENT of the
    /// deadline and returns in time (`busy:MS` records): no call runs into the deadline, so
    /// only the stream thread's fair shares of guest time hold A back.
    #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u64).range(1..100))]
    near_deadline: Option<u64>,
    /// Cluster sizes to run, in order.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    workers: Vec<usize>,
    /// Stream threads per worker (default: the worker's own, the number of cores).
    #[arg(long)]
    threads: Option<u32>,
    /// Runs of each cluster size (each a new cluster: alone, then beside A).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Small enough for CI: `--records 100000 --loop-backlog 100 --workers 1 --rounds 1`.
    #[arg(long)]
    quick: bool,
    /// Longest wait for B's records in one measurement; a measurement that runs out reports
    /// what B committed until then.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
    /// Keep the workers' logs, configuration and state (their directory is printed).
    #[arg(long)]
    keep: bool,
}

/// B in one measurement.
#[derive(Clone, Copy)]
struct Phase {
    /// Records/s from when all of B's tasks started to its last record's commit (or the timeout).
    rate: f64,
    /// Whether every record was committed before the timeout.
    done: bool,
    committed: u64,
    window_s: f64,
    /// CPU seconds of every worker over the window.
    cpu_s: f64,
    /// The largest `VmHWM` of a worker, at the end of the measurement.
    peak_rss: u64,
}

/// What tenant A's topology did, summed over the workers.
#[derive(Clone, Copy, Default, Debug)]
struct Hostile {
    /// Records passed over after a deadline (`on-error = "skip"`).
    skipped: f64,
    /// Guest calls: each (but a rare punctuation) ran into the deadline.
    calls: f64,
    /// Seconds spent in those calls.
    guest_s: f64,
    /// A's tasks that failed (none should: `on-error = "skip"`).
    failed: f64,
}

impl TenantsArgs {
    /// The value of A's records.
    fn a_value(&self) -> Vec<u8> {
        match self.near_deadline {
            None => b"loop".to_vec(),
            Some(pct) => format!("busy:{}", self.deadline_ms * pct / 100).into_bytes(),
        }
    }

    /// What A does, for the figures' labels.
    fn a_does(&self) -> String {
        match self.near_deadline {
            None => "looping until its deadline on every record".into(),
            Some(pct) => format!("busy for {pct}% of its deadline on every call"),
        }
    }
}

impl Run {
    /// B beside A over B alone, alone being the mean of before and after A.
    fn ratio(&self) -> f64 {
        self.beside.rate / ((self.alone.rate + self.after.rate) / 2.0)
    }
}

impl std::ops::Sub for Hostile {
    type Output = Hostile;
    fn sub(self, o: Hostile) -> Hostile {
        Hostile {
            skipped: self.skipped - o.skipped,
            calls: self.calls - o.calls,
            guest_s: self.guest_s - o.guest_s,
            failed: self.failed - o.failed,
        }
    }
}

/// One run: a new cluster, B alone, then B beside A, then B alone again.
struct Run {
    workers: usize,
    alone: Phase,
    beside: Phase,
    /// B alone again, after A was deleted.
    after: Phase,
    /// A during B's measurement beside it.
    a: Hostile,
    /// A's deadline as the registry stored it (the tenant's cap).
    deadline_ms: u64,
    /// When A's task failed, in seconds into B's window beside it (none: it did not).
    a_failed_at: Option<f64>,
    /// B's records committed by then.
    b_before_a_failed: u64,
}

pub async fn run(mut args: TenantsArgs) -> anyhow::Result<()> {
    if args.quick {
        args.records = 100_000;
        args.loop_backlog = 100;
        args.workers = vec![1];
        args.rounds = 1;
    }
    println!(
        "tenants benchmark: tenant B's uppercase ({} records of {} bytes, {} partitions) alone, then beside tenant A's \
         hostile topology {} (deadline {} ms, on-error = skip; {} partition(s), \
         {} records/s of its input); workers {:?}, {}, Kafka at {}",
        args.records,
        args.size,
        args.partitions,
        args.a_does(),
        args.deadline_ms,
        args.hostile_partitions,
        args.loop_rate,
        args.workers,
        args.threads
            .map_or("stream threads: the cores".to_string(), |t| format!("{t} stream threads each")),
        args.bootstrap
    );
    let started = Instant::now();
    let mut runs = Vec::new();
    for &workers in &args.workers {
        for round in 0..args.rounds {
            let r = one_run(&args, workers)
                .await
                .with_context(|| format!("{workers} worker(s), round {}", round + 1))?;
            println!(
                "  {workers} worker(s) #{}: B alone {:.0} records/s, beside A {:.0} records/s{}, alone again after A {:.0} \
                 records/s{} ({:.0}% of the two alone); A: {:.0} records skipped after the deadline, {:.0} guest calls, {:.1} s in the guest over B's {:.1} s; {}",
                round + 1,
                r.alone.rate,
                r.beside.rate,
                if r.beside.done { "" } else { " (B did not finish)" },
                r.after.rate,
                if r.after.done { "" } else { " (B did not finish)" },
                100.0 * r.ratio(),
                r.a.skipped,
                r.a.calls,
                r.a.guest_s,
                r.beside.window_s,
                match r.a_failed_at {
                    None => "A's tasks kept running".to_string(),
                    Some(at) => format!(
                        "A's task FAILED {at:.1} s into B's window, when B had committed {} of {} records",
                        r.b_before_a_failed, r.beside.committed
                    ),
                }
            );
            runs.push(r);
        }
    }
    let us = |p: &Phase| p.cpu_s * 1e6 / p.committed.max(1) as f64;
    // A ran throughout B's window: its tasks kept running and it was in the guest at least
    // 1% of the window (the table shows how much). What holds a looping A back is the
    // cooldown after each call that ran into the deadline and its fair share of the thread
    // (at most a tenth: 1 / (1 + DEADLINE_PENALTY)); near the deadline, its fair share only,
    // and then no call may have run into the deadline. A run where B did not finish a phase
    // measured nothing.
    let busy = |r: &Run| r.a.guest_s / r.beside.window_s / args.hostile_partitions as f64;
    let valid = |r: &Run| {
        r.a_failed_at.is_none()
            && r.alone.done
            && r.beside.done
            && r.after.done
            && busy(r) >= 0.01
            && (args.near_deadline.is_none() || r.a.skipped == 0.0)
    };
    println!();
    println!(
        "  {:>7} {:>14} {:>14} {:>14} {:>6} {:>15} {:>15} {:>14} {:>11} {:>10} {:>8} {:>9} {:>12}",
        "workers",
        "B alone rec/s",
        "B beside A",
        "B after A",
        "ratio",
        "CPU µs/rec alone",
        "beside (all)",
        "peak RSS MiB",
        if args.near_deadline.is_some() {
            "A calls"
        } else {
            "A deadline"
        },
        "A skipped",
        "A busy",
        "deadline",
        "A failed at"
    );
    for r in &runs {
        println!(
            "  {:>7} {:>14.0} {:>13.0}{} {:>13.0}{} {:>6.2} {:>15.2} {:>15.2} {:>6} / {:<6} {:>11.0} {:>10.0} {:>7.0}% {:>6} ms {:>12}",
            r.workers,
            r.alone.rate,
            r.beside.rate,
            if r.beside.done { " " } else { "*" },
            r.after.rate,
            if r.after.done { " " } else { "*" },
            r.ratio(),
            us(&r.alone),
            us(&r.beside),
            r.alone.peak_rss >> 20,
            r.beside.peak_rss >> 20,
            r.a.calls,
            r.a.skipped,
            100.0 * busy(r),
            r.deadline_ms,
            r.a_failed_at.map_or("-".to_string(), |at| format!("{at:.1} s"))
        );
    }
    println!(
        "  (ratio: B beside A over the mean of B alone before and after A; A deadline / A calls: A's guest calls during B's measurement (looping, each ran into the deadline); A busy: A's time in \
         the guest over that window, per A task (its fair share of the thread; a task that runs into its deadline \
         also sits out 9 times the call after it, so at most 10%; under 1% makes the run invalid); CPU: every worker's, A's \
         looping included; A failed at: seconds into B's window; * B did not finish)"
    );
    for &w in &args.workers {
        let of_w: Vec<&Run> = runs.iter().filter(|r| r.workers == w).collect();
        let median_ratio = crate::median(of_w.iter().map(|r| r.ratio()).collect());
        // The figures of one run, the one whose ratio is nearest the median: medians of each
        // column would pair rates no run measured together.
        let Some(mid) = of_w.iter().min_by(|x, y| {
            (x.ratio() - median_ratio)
                .abs()
                .total_cmp(&(y.ratio() - median_ratio).abs())
        }) else {
            continue;
        };
        let (lo, hi) = of_w
            .iter()
            .map(|r| r.ratio())
            .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
        let invalid = of_w.iter().filter(|r| !valid(r)).count();
        println!(
            "  {w} worker(s): tenant B keeps {:.0}% of its throughput beside A {} (median of {} run(s), range \
             {:.0}-{:.0}%; the goal is at least 80%); in the median run B did {:.0} records/s alone, {:.0} beside A, \
             {:.0} alone again after A{}",
            100.0 * median_ratio,
            args.a_does(),
            of_w.len(),
            100.0 * lo,
            100.0 * hi,
            mid.alone.rate,
            mid.beside.rate,
            mid.after.rate,
            if invalid > 0 {
                format!(" -- NOT VALID: A was not busy throughout B's window, or B did not finish, in {invalid} of these runs")
            } else {
                String::new()
            }
        );
    }
    println!("  {:.0} s in all", started.elapsed().as_secs_f64());
    let invalid = runs.iter().filter(|r| !valid(r)).count();
    if invalid > 0 {
        bail!(
            "in {invalid} of {} run(s) tenant A was not busy throughout B's measurement (its task failed, it was in \
             the guest under 1% of the window, or, near the deadline, a call ran into it) or B did not finish: \
             those are not isolation figures (see the workers' logs with --keep)",
            runs.len()
        );
    }
    Ok(())
}

async fn one_run(args: &TenantsArgs, workers: usize) -> anyhow::Result<Run> {
    let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
    let dir = std::env::temp_dir().join(format!("sluice-tenants-{id}"));
    std::fs::create_dir_all(&dir)?;
    let (ns_a, ns_b) = (format!("a{id}."), format!("b{id}."));
    let (token_admin, token_a, token_b) = (format!("admin-{id}"), format!("a-{id}"), format!("b-{id}"));
    let hash = sluice::registry::tenants::hash_token;
    let config_file = dir.join("sluice.toml");
    std::fs::write(
        &config_file,
        format!(
            "registry.secret = \"{}\"\n[admin]\ntokens = [{:?}]\n\n\
             [tenants.a]\ntokens = [{:?}]\nnamespace = {ns_a:?}\nmax-topologies = 1\nmax-tasks = {}\n\
             max-memory = \"64MiB\"\nmax-call-timeout = \"{}ms\"\n\n\
             [tenants.b]\ntokens = [{:?}]\nnamespace = {ns_b:?}\nmax-topologies = 2\nmax-tasks = {}\n",
            uuid::Uuid::new_v4().simple(),
            hash(&token_admin),
            hash(&token_a),
            args.hostile_partitions,
            args.deadline_ms,
            hash(&token_b),
            2 * args.partitions
        ),
    )?;

    // Topics: B's two inputs (alone, beside) filled now; A's input fed while it runs.
    let admin: AdminClient<DefaultClientContext> = config(&args.bootstrap).create()?;
    let b_topics = |what: &str| {
        (
            format!("{ns_b}{what}"),
            format!("{ns_b}{what}-in"),
            format!("{ns_b}{what}-out"),
        )
    };
    let (a_name, a_in, a_out) = (
        format!("{ns_a}loop"),
        format!("{ns_a}loop-in"),
        format!("{ns_a}loop-out"),
    );
    let (alone_name, alone_in, alone_out) = b_topics("alone");
    let (beside_name, beside_in, beside_out) = b_topics("beside");
    let (after_name, after_in, after_out) = b_topics("after");
    let (p, hp) = (args.partitions, args.hostile_partitions);
    let topics = [
        NewTopic::new(&alone_in, p, TopicReplication::Fixed(1)),
        NewTopic::new(&alone_out, p, TopicReplication::Fixed(1)),
        NewTopic::new(&beside_in, p, TopicReplication::Fixed(1)),
        NewTopic::new(&beside_out, p, TopicReplication::Fixed(1)),
        NewTopic::new(&after_in, p, TopicReplication::Fixed(1)),
        NewTopic::new(&after_out, p, TopicReplication::Fixed(1)),
        NewTopic::new(&a_in, hp, TopicReplication::Fixed(1)),
        NewTopic::new(&a_out, hp, TopicReplication::Fixed(1)),
    ];
    for r in admin.create_topics(&topics, &AdminOptions::new()).await? {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    for topic in [&alone_in, &beside_in, &after_in] {
        produce(&args.bootstrap, topic, p, args.records, args.size)?;
    }

    let manifest = |name: &str, input: &str, output: &str, extra: &str| -> anyhow::Result<PathBuf> {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(
            &path,
            format!("name = {name:?}\n{extra}\n[sources]\ninput = {input:?}\n[sinks]\noutput = {output:?}\n"),
        )?;
        Ok(path)
    };
    let alone_manifest = manifest(&alone_name, &alone_in, &alone_out, "")?;
    let beside_manifest = manifest(&beside_name, &beside_in, &beside_out, "")?;
    let after_manifest = manifest(&after_name, &after_in, &after_out, "")?;
    // A asks for 10 s; its tenant's max-call-timeout caps it.
    let a_manifest = manifest(
        &a_name,
        &a_in,
        &a_out,
        "on-error = \"skip\"\n[limits]\ncall-timeout = \"10s\"",
    )?;

    let cluster = format!("tenants-{id}");
    let mut ws = Vec::new();
    for n in 0..workers {
        ws.push(start_worker(args, &cluster, &config_file, &dir, n)?);
    }
    let outcome = phases(
        args,
        &mut ws,
        [token_a.as_str(), token_b.as_str()],
        [
            (alone_name.as_str(), alone_in.as_str(), &alone_manifest),
            (beside_name.as_str(), beside_in.as_str(), &beside_manifest),
            (after_name.as_str(), after_in.as_str(), &after_manifest),
        ],
        (a_name.as_str(), a_in.as_str(), &a_manifest),
    )
    .await;
    for w in &mut ws {
        let _ = Command::new("kill").args(["-TERM", &w.child.id().to_string()]).status();
    }
    for w in &mut ws {
        let end = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = w.child.try_wait()? {
                break Some(status);
            }
            if Instant::now() > end {
                let _ = w.child.kill();
                let _ = w.child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !status.is_some_and(|s| s.success()) {
            eprintln!(
                "  note: a worker ended with {status:?} (not 0 within 30 s of SIGTERM); see {}",
                w.log.display()
            );
        }
    }
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            eprintln!("  the workers' logs are in {}", dir.display());
            return Err(e);
        }
    };
    if args.keep {
        println!("  logs, configuration and state kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(Run {
        workers,
        alone: outcome.alone,
        beside: outcome.beside,
        after: outcome.after,
        a: outcome.a,
        deadline_ms: outcome.deadline_ms,
        a_failed_at: outcome.a_failed.map(|(at, _)| at),
        b_before_a_failed: outcome.a_failed.map_or(0, |(_, n)| n),
    })
}

/// B alone; then A deployed and looping, and B again beside it; then A deleted, and B alone
/// once more (so that a drift over the run, which the two measurements alone would charge to
/// A, shows and is averaged out).
async fn phases(
    args: &TenantsArgs,
    ws: &mut [Worker],
    [token_a, token_b]: [&str; 2],
    [alone, beside, after]: [(&str, &str, &PathBuf); 3],
    (a_name, a_in, a_manifest): (&str, &str, &PathBuf),
) -> anyhow::Result<Outcome> {
    until_ready(ws)?;
    let admin = format!("127.0.0.1:{}", ws[0].port);
    let timeout = Duration::from_secs(args.timeout_secs);

    // 1. B alone; then its topology is deleted, so only A and B's second one run after.
    deploy(&admin, token_b, &args.component, alone.2)?;
    let (alone_phase, _) = measure(args, ws, alone.0, alone.1, None, timeout)?;
    sluice_cli(&["topologies", "delete", alone.0, "--admin", &admin, "--token", token_b])?;
    until_tasks(ws, 0, Duration::from_secs(60))?;

    // 2. A, with a backlog of `loop` records and more coming than it can pass over.
    let (hp, backlog) = (args.hostile_partitions, args.loop_backlog);
    let a_value = args.a_value();
    produce_values(&args.bootstrap, a_in, hp, backlog * hp as u64, |_| a_value.clone())?;
    let answer = deploy(&admin, token_a, &args.hostile, a_manifest)?;
    let deadline_ms = json_number(&answer, "max_call_timeout_ms").context("the registry's max_call_timeout_ms of A")?;
    let feeding = Arc::new(AtomicBool::new(true));
    let feeder = {
        let (feeding, bootstrap, topic) = (feeding.clone(), args.bootstrap.clone(), a_in.to_string());
        let rate = args.loop_rate;
        std::thread::spawn(move || feed(&bootstrap, &topic, hp, rate, &a_value, &feeding))
    };
    let result = (|| {
        // A is looping once it passed over a record after a deadline; near the deadline,
        // once it made a few calls.
        let check = crate::deadline("tenant A's first calls", Duration::from_secs(120));
        let started = |a: Hostile| match args.near_deadline {
            None => a.skipped >= 1.0,
            Some(_) => a.calls >= 3.0,
        };
        while !started(hostile(ws, a_name)?) {
            check()?;
            exited(ws)?;
            std::thread::sleep(Duration::from_millis(100));
        }
        // 3. B again, on fresh input, beside A.
        deploy(&admin, token_b, &args.component, beside.2)?;
        measure(args, ws, beside.0, beside.1, Some(a_name), timeout)
    })();
    feeding.store(false, Ordering::Relaxed);
    let fed = feeder
        .join()
        .map_err(|_| anyhow::anyhow!("the loop feeder panicked"))??;
    let (beside_phase, a) = result?;
    let a = a.context("A's metrics")?;
    let total = hostile(ws, a_name)?;
    eprintln!(
        "  A: {} records fed ({} before it started), {:.0} passed over after the deadline in all, {:.0} guest \
         calls, {:.1} s in the guest{}",
        fed + backlog * hp as u64,
        backlog * hp as u64,
        total.skipped,
        total.calls,
        total.guest_s,
        if total.failed > 0.0 {
            format!("; {:.0} of its tasks failed although on-error = skip", total.failed)
        } else {
            String::new()
        }
    );

    // 4. A and B's second topology deleted; B alone again, on fresh input.
    for (name, token) in [(a_name, token_a), (beside.0, token_b)] {
        sluice_cli(&["topologies", "delete", name, "--admin", &admin, "--token", token])?;
    }
    until_tasks(ws, 0, Duration::from_secs(60))?;
    deploy(&admin, token_b, &args.component, after.2)?;
    let (after_phase, _) = measure(args, ws, after.0, after.1, None, timeout)?;
    Ok(Outcome {
        alone: alone_phase,
        beside: beside_phase,
        after: after_phase,
        a: a.during,
        deadline_ms,
        a_failed: a.failed,
    })
}

/// What `phases` measured.
struct Outcome {
    alone: Phase,
    beside: Phase,
    after: Phase,
    a: Hostile,
    deadline_ms: u64,
    /// When A's task failed (seconds into B's window) and B's records committed by then.
    a_failed: Option<(f64, u64)>,
}

/// What A did while B was measured beside it.
struct Beside {
    during: Hostile,
    failed: Option<(f64, u64)>,
}
