//! The OAUTHBEARER soak: two cluster workers as `User:worker` on a Kafka that takes the
//! provider's tokens (60 s tokens, every connection made to authenticate again within 30 s:
//! [`sluice_tests::oauth_soak`]) run the word count while input flows at a steady rate for
//! minutes, through a SIGKILL of one worker midway and its restart. At the end: every count
//! exact under exactly-once (none below the truth under at-least-once), no rebalance but those
//! of the kill and the restart (none at a token refresh or a re-authentication), and the
//! longest gap in the output near each refresh, printed with the rest in a closing note.
//!
//! A long trial, never in CI (`#[ignore]`): `dev/trials oauth-soak [--minutes N] [--guarantee
//! at-least-once|exactly-once|both]` runs it (`SLUICE_SOAK_MINUTES`, default 10;
//! `SLUICE_SOAK_RATE`, lines a second, default 200; `SLUICE_SOAK_MAX_GAP_MS`, the longest a
//! task may write nothing near a refresh, default 3000). The workers' logs and the note are
//! kept under `$CARGO_TARGET_DIR/oauth-soak/`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::producer::FutureRecord;
use sluice_tests::worker::{guest, manifest, sluice_binary, target_dir, TempDir, WorkerProcess};
use sluice_tests::{oauth_soak, unique_name, Received};

const PARTITIONS: i32 = 4;
/// Words of each input partition's own vocabulary (`p{P}w{K}`): each word is one task's, so
/// its counts in the output are that task's, in order.
const VOCABULARY: usize = 50;
const WORDS_PER_LINE: usize = 4;
/// The output intervals that count as "near" a refresh or re-authentication at `t`: those
/// overlapping `t ± NEAR_MS`.
const NEAR_MS: i64 = 2_000;
/// After the restart, how long the group may take to settle (its rebalances are expected).
const SETTLE_MS: i64 = 90_000;
/// The worker's log filter: token fetches and the group connections' re-authentications are
/// debug events.
const LOG_FILTER: &str = "info,sluice::oidc=debug,sluice::group::connection=debug";

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Line `i`: its partition and its words.
fn line(i: usize) -> (i32, String) {
    let p = (i % PARTITIONS as usize) as i32;
    let n = i / PARTITIONS as usize;
    let words: Vec<String> = (0..WORDS_PER_LINE)
        .map(|j| format!("p{p}w{}", (n * 7 + j * 13) % VOCABULARY))
        .collect();
    (p, words.join(" "))
}

/// The task (input partition) a word of [`line`] belongs to.
fn task_of(word: &str) -> Option<i32> {
    word.strip_prefix('p')?.split('w').next()?.parse().ok()
}

/// One line of a worker's log (`tracing`'s format: time, level, target, message).
#[derive(Debug, Clone)]
struct LogLine {
    at: i64,
    level: String,
    text: String,
    /// Which log: `w0`, `w1`, `w1'` (the restarted one).
    worker: String,
}

/// Milliseconds since the epoch of `2026-01-02T03:04:05.678901Z`.
fn parse_time(s: &str) -> Option<i64> {
    let (date, time) = s.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (h, min) = (t.next()?.parse::<i64>().ok()?, t.next()?.parse::<i64>().ok()?);
    let sec: f64 = t.next()?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + h * 3_600 + min * 60) as f64 * 1000.0 + sec * 1000.0) as i64)
}

fn parse_log(worker: &str, text: &str) -> Vec<LogLine> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let at = parse_time(parts.next()?)?;
            let level = parts.next()?.to_string();
            let rest = l.split_once(&format!(" {level} "))?.1.trim().to_string();
            Some(LogLine {
                at,
                level,
                text: rest,
                worker: worker.to_string(),
            })
        })
        .collect()
}

/// `name=VALUE` of a log line's fields.
fn field<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let start = text.find(&format!(" {name}="))? + name.len() + 2;
    text[start..].split_whitespace().next()
}

/// Whether `pid` runs (a child that exited and was not waited for is a zombie: not running).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rfind(')').and_then(|i| stat.get(i + 2..i + 3)) != Some("Z"),
        Err(_) => false,
    }
}

/// The longest of `intervals` (start, end, task) overlapping `[from, to]`.
fn longest_in(intervals: &[(i64, i64, i32)], from: i64, to: i64) -> Option<(i64, i64, i32)> {
    intervals
        .iter()
        .filter(|(a, b, _)| *a <= to && *b >= from)
        .max_by_key(|(a, b, _)| b - a)
        .copied()
}

async fn soak(guarantee: &str) -> anyhow::Result<()> {
    let minutes: f64 = env_or("SLUICE_SOAK_MINUTES", 10.0);
    let rate: usize = env_or("SLUICE_SOAK_RATE", 200);
    let kafka = oauth_soak();
    let run = std::env::var("SLUICE_SOAK_RUN").unwrap_or_else(|_| format!("{}", now_ms() / 1000));
    let keep: PathBuf = target_dir().join("oauth-soak").join(format!("{run}-{guarantee}"));
    std::fs::create_dir_all(&keep)?;
    eprintln!(
        "oauth soak ({guarantee}): {minutes} min at {rate} lines/s on {} (tokens of {}, re-authentication within {} ms); logs in {}",
        kafka.bootstrap(),
        sluice_tests::SOAK_TOKEN_LIFESPAN,
        sluice_tests::SOAK_REAUTH_MS,
        keep.display()
    );

    // Topics and the worker's ACLs (exactly `sluice acls --worker`), as the admin.
    let ns = format!("{}.", unique_name("soak"));
    let (input, output) = (format!("{ns}lines"), format!("{ns}counts"));
    kafka.create_topic(&input, PARTITIONS).await?;
    // The broker's time of each output record: when it was written, so gaps in processing.
    kafka
        .create_topic_with(&output, PARTITIONS, 1, &[("message.timestamp.type", "LogAppendTime")])
        .await?;
    let cluster = unique_name("soak");
    let acls = std::process::Command::new(sluice_binary())
        .args(["acls", "--worker", "--cluster", &cluster, "--namespace", &ns, "--apply"])
        .args(["--bootstrap", kafka.bootstrap()])
        .envs(kafka.env_as("admin"))
        .output()?;
    anyhow::ensure!(
        acls.status.success(),
        "sluice acls --worker --apply: {}",
        String::from_utf8_lossy(&acls.stderr)
    );
    eprintln!("  {}", String::from_utf8_lossy(&acls.stdout).trim());
    let worker_env = kafka.env_as("worker");
    anyhow::ensure!(
        worker_env
            .iter()
            .any(|(k, v)| k == "SLUICE_KAFKA_SASL_MECHANISM" && v == "OAUTHBEARER"),
        "the workers would not use OAUTHBEARER: {worker_env:?}"
    );

    let dir = TempDir::new("soak");
    let name = format!("{ns}wc");
    let topology = dir.write(
        "wc.toml",
        &manifest(
            &name,
            &guest("word-count"),
            &[("lines", &input)],
            &[("counts", &output)],
            "",
        ),
    );
    let start = |n: usize| -> anyhow::Result<WorkerProcess> {
        let state = dir.path().join(format!("state-{n}"));
        WorkerProcess::start(
            kafka.bootstrap(),
            dir.path(),
            &[
                "--log",
                LOG_FILTER,
                "--topology",
                topology.to_str().unwrap(),
                "--cluster",
                &cluster,
                "--state-dir",
                state.to_str().unwrap(),
                "--processing-guarantee",
                guarantee,
                "--no-drain-on-stop",
            ],
        )
    };
    let mut workers = vec![start(0)?, start(1)?];
    for w in &mut workers {
        w.wait_for_line(&[" assignment "], Duration::from_secs(120))?;
    }
    // A settled group: no assignment for 10 s.
    let settled = Instant::now() + Duration::from_secs(180);
    loop {
        let last = workers
            .iter()
            .flat_map(|w| parse_log("", &w.log()))
            .filter(|l| l.text.contains("assignment "))
            .map(|l| l.at)
            .max()
            .unwrap_or(0);
        if now_ms() - last > 10_000 {
            break;
        }
        anyhow::ensure!(Instant::now() < settled, "the group did not settle within 3 minutes");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // Input at a steady rate: every 100 ms a tenth of a second's lines.
    let t0 = now_ms();
    let run_for = Duration::from_secs_f64(minutes * 60.0);
    let producing = {
        let producer = kafka.producer()?;
        let input = input.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let per_tick = (rate / 10).max(1);
            let mut sends = Vec::new();
            let mut i = 0;
            while started.elapsed() < run_for {
                tick.tick().await;
                let lines: Vec<(String, i32, String)> = (i..i + per_tick)
                    .map(|n| {
                        let (p, text) = line(n);
                        (format!("line-{n}"), p, text)
                    })
                    .collect();
                i += per_tick;
                let producer = producer.clone();
                let topic = input.clone();
                sends.push(tokio::spawn(async move {
                    let futures: Vec<_> = lines
                        .iter()
                        .map(|(key, p, text)| {
                            let record = FutureRecord::to(&topic).partition(*p).key(key).payload(text);
                            producer.send(record, Duration::from_secs(60))
                        })
                        .collect();
                    futures::future::join_all(futures)
                        .await
                        .into_iter()
                        .filter(|r| r.is_err())
                        .count()
                }));
            }
            let mut failed = 0;
            for s in sends {
                failed += s.await?;
            }
            anyhow::ensure!(failed == 0, "{failed} input lines were not delivered");
            anyhow::Ok(i)
        })
    };

    // The SIGKILL midway, and the restart; the workers watched meanwhile.
    let mut problems: Vec<String> = Vec::new();
    let mut logs: Vec<(String, String)> = Vec::new();
    let kill_at_ms = t0 + (run_for.as_millis() / 2) as i64;
    let (mut killed_at, mut restarted_at) = (None, None);
    while !producing.is_finished() {
        tokio::time::sleep(Duration::from_millis(250)).await;
        for (n, w) in workers.iter().enumerate() {
            if w.pid().is_some_and(|pid| !alive(pid)) {
                problems.push(format!("worker {n} died at +{:.1} s", (now_ms() - t0) as f64 / 1000.0));
            }
        }
        if !problems.is_empty() {
            break;
        }
        if killed_at.is_none() && now_ms() >= kill_at_ms {
            killed_at = Some(now_ms());
            workers[1].kill()?;
            logs.push(("w1".into(), workers[1].log()));
            eprintln!("  SIGKILL worker 1 at +{:.1} s", (now_ms() - t0) as f64 / 1000.0);
            tokio::time::sleep(Duration::from_secs(2)).await;
            workers[1] = start(1)?;
            restarted_at = Some(now_ms());
            eprintln!("  worker 1 started again at +{:.1} s", (now_ms() - t0) as f64 / 1000.0);
        }
    }
    if !problems.is_empty() {
        producing.abort();
    }
    let produced = if problems.is_empty() {
        match producing.await? {
            Ok(n) => n,
            Err(e) => {
                problems.push(format!("{e:#}"));
                0
            }
        }
    } else {
        0
    };
    let produced_until = now_ms();
    let group = format!("sluice-{name}");
    if problems.is_empty() {
        if let Err(e) = kafka
            .wait_committed(&group, &input, PARTITIONS, produced as i64, Duration::from_secs(300))
            .await
        {
            problems.push(format!("not every input line was processed: {e:#}"));
        }
    }
    let finished_at = now_ms();
    for (n, w) in workers.iter_mut().enumerate() {
        let label = if n == 1 && killed_at.is_some() {
            "w1'".to_string()
        } else {
            format!("w{n}")
        };
        match w.terminate(Duration::from_secs(60)) {
            Ok(s) if s.success() => {}
            Ok(s) => problems.push(format!("worker {label} exited {s} at SIGTERM")),
            Err(e) => problems.push(format!("worker {label}: {e:#}")),
        }
        logs.push((label, w.log()));
    }
    for (label, text) in &logs {
        std::fs::write(keep.join(format!("worker-{label}.log")), text)?;
    }

    // The output, and the truth.
    if guarantee == "exactly-once" {
        kafka.wait_transactions_ended(&output, Duration::from_secs(120)).await?;
    }
    let mut out: Vec<Received> = kafka.read_all(&output, Duration::from_secs(600))?;
    out.sort_by_key(|r| (r.partition, r.offset));
    let mut truth: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..produced {
        for w in line(i).1.split(' ') {
            *truth.entry(w.to_string()).or_insert(0) += 1;
        }
    }
    let words_in: u64 = truth.values().sum();
    // Each word's counts in output order (one task writes them, to one partition).
    let mut per_word: HashMap<String, Vec<u64>> = HashMap::new();
    for r in &out {
        let word = String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned();
        let count: u64 = std::str::from_utf8(r.value.as_deref().unwrap_or_default())?.parse()?;
        per_word.entry(word).or_default().push(count);
    }
    let mut exactness = String::new();
    let mut wrong = 0;
    let mut over: BTreeMap<u64, usize> = BTreeMap::new();
    for (word, n) in &truth {
        let counts = per_word.get(word).cloned().unwrap_or_default();
        if guarantee == "exactly-once" {
            let mut got = counts.clone();
            got.sort_unstable();
            let want: Vec<u64> = (1..=*n).collect();
            if got != want {
                wrong += 1;
                if wrong <= 5 {
                    let missing = want.iter().filter(|c| !got.contains(c)).count();
                    let _ = write!(
                        exactness,
                        "\n    {word}: {} counts for a truth of {n} ({missing} of 1..={n} missing), last {:?}",
                        got.len(),
                        counts.last()
                    );
                }
            }
        } else {
            let last = counts.last().copied().unwrap_or(0);
            if last < *n {
                wrong += 1;
                if wrong <= 5 {
                    let _ = write!(exactness, "\n    {word}: last count {last} < truth {n}");
                }
            } else {
                *over.entry(last - n).or_default() += 1;
            }
        }
    }
    let strangers = per_word.keys().filter(|w| !truth.contains_key(*w)).count();
    if produced > 0 && (wrong > 0 || strangers > 0) {
        problems.push(format!(
            "{wrong} of {} words' counts are wrong, {strangers} words counted that were never sent{exactness}",
            truth.len()
        ));
    }
    if produced > 0 && guarantee == "exactly-once" && out.len() as u64 != words_in {
        problems.push(format!(
            "{} output records (read_committed) for {words_in} words in",
            out.len()
        ));
    }

    // The logs: refreshes, re-authentications, rebalances, problems.
    let lines: Vec<LogLine> = logs.iter().flat_map(|(w, text)| parse_log(w, text)).collect();
    let rel = |t: i64| (t - t0) as f64 / 1000.0;
    let refreshes: Vec<&LogLine> = lines
        .iter()
        .filter(|l| l.text.contains("fetched a new OAuth token"))
        .collect();
    let reauths: Vec<&LogLine> = lines
        .iter()
        .filter(|l| l.text.contains("authenticated again (KIP-368)"))
        .collect();
    let per_worker = |events: &[&LogLine]| -> String {
        let mut by: BTreeMap<&str, usize> = BTreeMap::new();
        for e in events {
            *by.entry(e.worker.as_str()).or_default() += 1;
        }
        by.iter()
            .map(|(w, n)| format!("{w} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if refreshes.is_empty() || reauths.is_empty() {
        problems.push(format!(
            "the workers logged {} token refreshes and {} re-authentications: nothing was soaked",
            refreshes.len(),
            reauths.len()
        ));
    }
    let auth_trouble: Vec<&LogLine> = lines
        .iter()
        .filter(|l| l.level == "WARN" || l.level == "ERROR")
        .filter(|l| {
            let t = l.text.to_ascii_lowercase();
            ["authentic", "authoriz", "oauth", "token", "expired"]
                .iter()
                .any(|w| t.contains(w))
        })
        .collect();
    for l in auth_trouble.iter().take(10) {
        problems.push(format!(
            "{} at +{:.1} s logged: {} {}",
            l.worker,
            rel(l.at),
            l.level,
            l.text
        ));
    }
    let kill_window = killed_at.map(|k| (k - 1_000, restarted_at.unwrap_or(k) + SETTLE_MS));
    let in_kill_window = |t: i64| kill_window.is_some_and(|(a, b)| t >= a && t <= b);
    // Rebalances from the input's start to the workers' stop: one per generation.
    let mut generations: BTreeMap<i64, (i64, Vec<String>)> = BTreeMap::new();
    for l in lines
        .iter()
        .filter(|l| l.at >= t0 && l.at <= finished_at && l.text.contains("assignment "))
    {
        let Some(g) = field(&l.text, "generation").and_then(|g| g.parse::<i64>().ok()) else {
            continue;
        };
        let e = generations.entry(g).or_insert((l.at, Vec::new()));
        e.0 = e.0.min(l.at);
        e.1.push(l.worker.clone());
    }
    let mut rebalances = String::new();
    let mut unexpected = 0;
    for (g, (at, who)) in &generations {
        let expected = in_kill_window(*at);
        let nearest = |events: &[&LogLine]| {
            events
                .iter()
                .map(|e| e.at - at)
                .min_by_key(|d| d.abs())
                .map_or("none".to_string(), |d| format!("{:+.1} s", d as f64 / 1000.0))
        };
        let _ = write!(
            rebalances,
            "\n    generation {g} at +{:.1} s ({}): {}; nearest refresh {}, re-authentication {}",
            rel(*at),
            who.join(" "),
            if expected { "the kill and restart" } else { "UNEXPECTED" },
            nearest(&refreshes),
            nearest(&reauths),
        );
        if !expected {
            unexpected += 1;
            // What the workers said in the 15 s before it.
            for l in lines
                .iter()
                .filter(|l| l.at >= at - 15_000 && l.at <= *at && l.level != "DEBUG")
                .filter(|l| !l.text.contains("assignment "))
                .take(6)
            {
                let _ = write!(
                    rebalances,
                    "\n        {} +{:.1} s {} {}",
                    l.worker,
                    rel(l.at),
                    l.level,
                    l.text
                );
            }
        }
    }
    if unexpected > 0 {
        problems.push(format!(
            "{unexpected} rebalances outside the kill and restart (see the rebalances above)"
        ));
    }
    let warnings = lines
        .iter()
        .filter(|l| (l.level == "WARN" || l.level == "ERROR") && l.at >= t0)
        .count();
    let warnings_outside = lines
        .iter()
        .filter(|l| (l.level == "WARN" || l.level == "ERROR") && l.at >= t0 && !in_kill_window(l.at))
        .collect::<Vec<_>>();

    // Gaps in the output, per task (the broker's append times of its words' counts).
    let mut times: HashMap<i32, Vec<i64>> = HashMap::new();
    for r in &out {
        let word = String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned();
        if let (Some(task), Some(at)) = (task_of(&word), r.timestamp) {
            times.entry(task).or_default().push(at);
        }
    }
    let mut intervals: Vec<(i64, i64, i32)> = Vec::new();
    for (task, ts) in &mut times {
        ts.sort_unstable();
        intervals.extend(
            ts.windows(2)
                .filter(|w| w[0] >= t0 && w[1] <= produced_until)
                .map(|w| (w[0], w[1], *task)),
        );
    }
    let describe = |g: Option<(i64, i64, i32)>| {
        g.map_or("none".to_string(), |(a, b, task)| {
            format!("{} ms (task {task}, +{:.1} s)", b - a, rel(a))
        })
    };
    // Events of the kill and restart are left out: the kill's own gap is there.
    let soaked = |events: &[&LogLine]| {
        events
            .iter()
            .filter(|e| e.at >= t0 && e.at <= produced_until && !in_kill_window(e.at))
            .count()
    };
    let near = |events: &[&LogLine]| {
        events
            .iter()
            .filter(|e| e.at >= t0 && e.at <= produced_until && !in_kill_window(e.at))
            .filter_map(|e| longest_in(&intervals, e.at - NEAR_MS, e.at + NEAR_MS).map(|g| (g, e.worker.clone())))
            .max_by_key(|((a, b, _), _)| b - a)
    };
    let near_refresh = near(&refreshes);
    let near_reauth = near(&reauths);
    let overall = longest_in(&intervals, i64::MIN, i64::MAX);
    let outside: Vec<(i64, i64, i32)> = intervals
        .iter()
        .filter(|(a, b, _)| !in_kill_window(*a) && !in_kill_window(*b))
        .copied()
        .collect();
    let overall_outside = longest_in(&outside, i64::MIN, i64::MAX);
    let p99 = {
        let mut d: Vec<i64> = outside.iter().map(|(a, b, _)| b - a).collect();
        d.sort_unstable();
        d.get(d.len().saturating_sub(1) * 99 / 100).copied().unwrap_or(0)
    };
    // A task that writes nothing for longer than this near a refresh or re-authentication
    // (outside the kill and restart) fails the trial.
    let max_gap: i64 = env_or("SLUICE_SOAK_MAX_GAP_MS", 3_000);
    for (what, g) in [
        ("a token refresh", &near_refresh),
        ("a re-authentication", &near_reauth),
    ] {
        if let Some(((a, b, task), worker)) = g {
            if b - a > max_gap {
                problems.push(format!(
                    "task {task} wrote nothing for {} ms near {what} of {worker} at +{:.1} s (more than {max_gap} ms)",
                    b - a,
                    rel(*a)
                ));
            }
        }
    }

    let mut note = String::new();
    let _ = writeln!(note, "oauth soak, {guarantee}: {minutes} min at {rate} lines/s, two workers as User:worker over OAUTHBEARER (tokens of {}, connections.max.reauth.ms {})", sluice_tests::SOAK_TOKEN_LIFESPAN, sluice_tests::SOAK_REAUTH_MS);
    let _ = writeln!(
        note,
        "  in: {produced} lines, {words_in} words ({} distinct); out: {} records{}",
        truth.len(),
        out.len(),
        if guarantee == "exactly-once" {
            " (read_committed)"
        } else {
            ""
        }
    );
    if guarantee == "exactly-once" {
        let _ = writeln!(
            note,
            "  exact: {} (each word's counts in the output are 1..=truth, each once)",
            if wrong == 0 && strangers == 0 && out.len() as u64 == words_in {
                "yes"
            } else {
                "NO"
            }
        );
    } else {
        let _ = writeln!(
            note,
            "  at least: {} (each word's last count >= its truth); over-count per word -> words: {over:?}; {} records more than words in",
            if wrong == 0 && strangers == 0 { "yes" } else { "NO" },
            out.len() as i64 - words_in as i64
        );
    }
    match (killed_at, restarted_at) {
        (Some(k), Some(r)) => {
            let _ = writeln!(
                note,
                "  SIGKILL of worker 1 at +{:.1} s, started again at +{:.1} s",
                rel(k),
                rel(r)
            );
        }
        _ => {
            let _ = writeln!(note, "  no SIGKILL (the run ended first)");
        }
    }
    let _ = writeln!(
        note,
        "  rebalances from the input's start to the workers' stop: {} ({unexpected} outside the kill and restart){rebalances}",
        generations.len()
    );
    let _ = writeln!(
        note,
        "  token refreshes: {} ({}); group connections' re-authentications: {} ({}); auth warnings or errors: {}",
        refreshes.len(),
        per_worker(&refreshes),
        reauths.len(),
        per_worker(&reauths),
        auth_trouble.len()
    );
    let _ = writeln!(
        note,
        "  longest output gap of a task within {NEAR_MS} ms of a refresh: {} (over {} refreshes while the input flowed, outside the kill and restart); of a re-authentication: {} (over {}); limit {max_gap} ms",
        describe(near_refresh.as_ref().map(|(g, _)| *g)),
        soaked(&refreshes),
        describe(near_reauth.as_ref().map(|(g, _)| *g)),
        soaked(&reauths)
    );
    let _ = writeln!(
        note,
        "  longest output gap of a task overall: {}; outside the kill and restart: {} (99th percentile {p99} ms)",
        describe(overall),
        describe(overall_outside)
    );
    let _ = writeln!(
        note,
        "  warnings and errors logged since the input began: {warnings} ({} outside the kill and restart)",
        warnings_outside.len()
    );
    for l in warnings_outside.iter().take(5) {
        let _ = writeln!(note, "    {} +{:.1} s {} {}", l.worker, rel(l.at), l.level, l.text);
    }
    let _ = writeln!(
        note,
        "  all input processed {:.1} s after the last line was sent; logs in {}",
        (finished_at - produced_until) as f64 / 1000.0,
        keep.display()
    );
    if problems.is_empty() {
        let _ = writeln!(note, "  PASSED");
    } else {
        let _ = writeln!(note, "  FAILED:");
        for p in &problems {
            let _ = writeln!(note, "    - {p}");
        }
    }
    std::fs::write(keep.join("note.txt"), &note)?;
    eprintln!("{note}");
    anyhow::ensure!(
        problems.is_empty(),
        "oauth soak ({guarantee}) failed:\n{}",
        problems.join("\n")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "a long trial: dev/trials oauth-soak"]
async fn oauth_soak_exactly_once() -> anyhow::Result<()> {
    soak("exactly-once").await
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "a long trial: dev/trials oauth-soak"]
async fn oauth_soak_at_least_once() -> anyhow::Result<()> {
    soak("at-least-once").await
}

#[test]
fn the_soak_reads_its_logs_times_and_lines() {
    assert_eq!(parse_time("1970-01-01T00:00:01.500000Z"), Some(1_500));
    assert_eq!(parse_time("2024-03-01T00:00:00.000000Z"), Some(1_709_251_200_000));
    let l = parse_log(
        "w0",
        "2024-03-01T00:00:00.250000Z  INFO sluice::worker::group_runner: assignment cluster=c generation=7 leader=true",
    );
    assert_eq!(l.len(), 1);
    assert_eq!((l[0].at, l[0].level.as_str()), (1_709_251_200_250, "INFO"));
    assert_eq!(field(&l[0].text, "generation"), Some("7"));
    let (p, text) = line(6);
    assert_eq!(p, 2);
    assert!(text.split(' ').all(|w| task_of(w) == Some(2)), "{text}");
}
