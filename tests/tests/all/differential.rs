//! Differential tests: the DSL example topologies run by Sluice and by Kafka Streams, on the
//! same seeded input on one broker, outputs compared record by record.
//!
//! The peer is `bench/kafka-streams` (`dev.sluice.bench.Dsl`): each example guest written
//! again in Kafka Streams' DSL, as its users would write it, producing the same bytes. Both
//! read the same input topics, written in full before either starts, and write outputs of
//! their own. Once both have committed all their input and neither output has changed for a
//! few seconds, the outputs are compared per sink:
//!
//! - the multiset of `(key, value)`, for operators that send each result once (joins,
//!   windows emitted when they close);
//! - the last value per key, with its timestamp, for all (aggregations: both sides cache
//!   their updates, each flushing at its own commits, so which intermediate values go out
//!   differs from run to run even on one side; an aggregate's time is the latest of its
//!   records', so the last one's is the same);
//! - the multiset of `(key, value, timestamp)` for the others, except where the README's
//!   "where this differs" list says Sluice stamps a result differently.
//!
//! CI runs each topology on one seed, under one guarantee each; `dev/trials differential`
//! runs many seeds under both guarantees, with a SIGKILL or a scale step midway
//! (`SLUICE_DIFF_SEEDS`, `SLUICE_DIFF_GUARANTEES`, `SLUICE_DIFF_FAULT`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sluice_tests::worker::shared_compile_cache;
use sluice_tests::{kafka, repo_root, unique_name, Received};

use crate::dsl_examples::{base_ms, produce, Example, Out};

// --- The peer --------------------------------------------------------------------------------

/// `bench/kafka-streams` built (once per test process): its class path.
fn peer_classpath() -> anyhow::Result<String> {
    static CLASSPATH: OnceLock<Result<String, String>> = OnceLock::new();
    CLASSPATH
        .get_or_init(|| {
            let dir = repo_root().join("bench/kafka-streams");
            let mvn = |args: &[&str]| -> Result<(), String> {
                let out = Command::new("mvn")
                    .args(["-B", "-q", "-f"])
                    .arg(dir.join("pom.xml"))
                    .args(args)
                    .output()
                    .map_err(|e| format!("running mvn (Maven must be installed): {e}"))?;
                if out.status.success() {
                    Ok(())
                } else {
                    Err(format!(
                        "mvn {args:?} in {} failed ({}):\n{}{}",
                        dir.display(),
                        out.status,
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    ))
                }
            };
            mvn(&["package", "-DskipTests"])?;
            let list = dir.join("target/classpath.txt");
            mvn(&[
                "dependency:build-classpath",
                &format!("-Dmdep.outputFile={}", list.display()),
                "-Dmdep.includeScope=runtime",
            ])?;
            let deps = std::fs::read_to_string(&list).map_err(|e| format!("{}: {e}", list.display()))?;
            Ok(format!("{}:{}", dir.join("target/classes").display(), deps.trim()))
        })
        .clone()
        .map_err(|e| anyhow::anyhow!("building the Kafka Streams peer: {e}"))
}

/// A Kafka Streams application running one of the example topologies.
pub(crate) struct Peer {
    child: Child,
    log: PathBuf,
    app: String,
}

impl Peer {
    fn start(app: &str, guarantee: &str, topology: &str, roles: &[(&str, &str)]) -> anyhow::Result<Peer> {
        // Kafka Streams' default record cache (10 MiB), as its users run it.
        let mut args: Vec<String> = [kafka().bootstrap(), app, guarantee, "10485760", topology]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(roles.iter().map(|(role, topic)| format!("{role}={topic}")));
        Peer::spawn(app, "Dsl", &args)
    }

    /// Starts `dev.sluice.bench.CLASS ARGS` of `bench/kafka-streams` and waits until it prints
    /// `RUNNING` (Kafka Streams' state).
    pub(crate) fn spawn(app: &str, class: &str, args: &[String]) -> anyhow::Result<Peer> {
        let classpath = peer_classpath()?;
        let log = std::env::temp_dir().join(format!("{app}.log"));
        let mut child = Command::new("java")
            .args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp"])
            .arg(&classpath)
            .arg(format!("dev.sluice.bench.{class}"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.trim() == "RUNNING" {
                    let _ = tx.send(());
                }
            }
        });
        let mut peer = Peer {
            child,
            log,
            app: app.to_string(),
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if rx.recv_timeout(Duration::from_millis(200)).is_ok() {
                return Ok(peer);
            }
            if let Some(status) = peer.child.try_wait()? {
                anyhow::bail!("the Kafka Streams peer exited with {status}:\n{}", peer.log());
            }
            if Instant::now() > deadline {
                anyhow::bail!("the Kafka Streams peer did not reach RUNNING in 90 s:\n{}", peer.log());
            }
        }
    }

    pub(crate) fn log(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// SIGTERM (Kafka Streams closes), then SIGKILL if it has not exited in 30 s.
    pub(crate) fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop();
    }
}

// --- Seeded input ----------------------------------------------------------------------------

/// SplitMix64: a seeded sequence, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// True with probability `p` percent.
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// In `-spread..=spread`.
    fn jitter(&mut self, spread: i64) -> i64 {
        self.below(2 * spread as u64 + 1) as i64 - spread
    }
}

/// A keyed record placed by Java's partitioner (murmur2), as every producer of a
/// co-partitioned topic must write it.
fn keyed(key: impl Into<String>, value: Option<String>, ts: i64) -> Out {
    Out {
        partition: None,
        key: key.into(),
        value,
        ts: Some(ts),
    }
}

/// Timestamps unique across a whole case (ties between partitions are broken differently
/// by Kafka Streams' priority queue and by Sluice, and neither is wrong): `slot` is a
/// millisecond spread over ten, plus the case-wide record number.
struct Clock {
    n: i64,
}

impl Clock {
    fn at(&mut self, ms: i64) -> i64 {
        self.n += 1;
        ms / 1000 * 1000 + self.n % 1000
    }
}

/// One topology's input: `(role, partitions, records)` per source, and its sink roles.
struct Case {
    topology: &'static str,
    /// Sluice runs the Python twin (`guests/python/<topology>`) instead of the Rust guest.
    python: bool,
    sources: Vec<(&'static str, i32, Vec<Out>)>,
    /// Sources Kafka Streams reads as a global table (no group offsets to wait for).
    globals: Vec<&'static str>,
    sinks: Vec<&'static str>,
    /// Sinks whose timestamps are not compared, and why: the README lists them as a
    /// difference, or they depend on how writers to a repartition topic interleave.
    unstamped: Vec<&'static str>,
    /// Sinks where only the last value per key is the same on every run: an aggregation's
    /// record cache sends updates at each commit, so which intermediate values go out
    /// depends on timing.
    last_only: Vec<&'static str>,
}

const MIN: i64 = 60_000;

fn word_count(rng: &mut Rng) -> Case {
    let base = base_ms();
    let lines = (0..600usize)
        .map(|i| {
            let words: Vec<String> = (0..1 + rng.below(8))
                .map(|_| {
                    let w = format!("w{}", rng.below(60));
                    if rng.chance(10) {
                        w.to_uppercase()
                    } else {
                        w
                    }
                })
                .collect();
            Out::at((i % 4) as i32, format!("l-{i}"), words.join(" "), base + i as i64 * 100)
        })
        .collect();
    Case {
        topology: "dsl-word-count",
        python: false,
        sources: vec![("lines", 4, lines)],
        globals: vec![],
        sinks: vec!["totals"],
        unstamped: vec![],
        last_only: vec!["totals"],
    }
}

/// Views of 20 users over 40 minutes, out of order within the grace and some past it.
fn page_views(rng: &mut Rng) -> Case {
    let base = base_ms();
    let mut clock = Clock { n: 0 };
    let views = (0..1_500)
        .map(|i| {
            let mut ts = base + i as i64 * 1_600 + rng.jitter(20_000);
            if rng.chance(2) {
                ts -= 5 * MIN; // late past the grace
            }
            keyed(
                format!("u{}", rng.below(20)),
                Some(format!("/p{}", rng.below(9))),
                clock.at(ts),
            )
        })
        .collect();
    Case {
        topology: "dsl-page-views",
        python: false,
        sources: vec![("views", 4, views)],
        globals: vec![],
        sinks: vec!["per_minute", "per_5_minutes"],
        unstamped: vec![],
        last_only: vec![],
    }
}

/// Clicks of 15 users in bursts: sessions that merge, split and arrive late.
fn sessions(rng: &mut Rng) -> Case {
    let base = base_ms();
    let mut clock = Clock { n: 0 };
    let mut at = [base; 15];
    // About 35 minutes per user (the broker takes timestamps up to an hour ahead of now).
    let mut times: Vec<(i64, usize)> = (0..500)
        .map(|_| {
            let user = rng.below(15) as usize;
            at[user] += if rng.chance(15) {
                4 * MIN + rng.below(MIN as u64) as i64
            } else {
                rng.below(40_000) as i64
            };
            (at[user], user)
        })
        .collect();
    // Written in about the order of time, each click up to 30 s out of place, and some ten
    // minutes late: no click comes within the gap of a session that has closed already,
    // where Sluice (closing sessions at punctuation) and Kafka Streams (at every record)
    // differ (README, "where this differs").
    times.sort();
    let clicks = times
        .into_iter()
        .map(|(t, user)| {
            let mut ts = t + rng.jitter(30_000);
            if rng.chance(2) {
                ts -= 10 * MIN;
            }
            keyed(format!("u{user}"), Some("click".into()), clock.at(ts))
        })
        .collect();
    Case {
        topology: "dsl-sessions",
        python: false,
        sources: vec![("clicks", 4, clicks)],
        globals: vec![],
        sinks: vec!["sessions"],
        unstamped: vec![],
        last_only: vec![],
    }
}

/// Orders, and payments for most of them: within the window, before the order, after the
/// window, twice, or never.
fn orders_payments(rng: &mut Rng) -> Case {
    let base = base_ms();
    let mut clock = Clock { n: 0 };
    let mut orders = Vec::new();
    let mut payments = Vec::new();
    for i in 0..800 {
        let t = base + i as i64 * 2_000;
        orders.push(keyed(
            format!("o-{i}"),
            Some(format!("order-{i}")),
            clock.at(t + rng.jitter(30_000)),
        ));
        let paid = rng.below(10);
        let times = match paid {
            0 => vec![],
            1 => vec![t - rng.below(5 * MIN as u64) as i64],
            2 => vec![t + 10 * MIN + rng.below(5 * MIN as u64) as i64],
            3 => vec![
                t + rng.below(10 * MIN as u64) as i64,
                t + rng.below(10 * MIN as u64) as i64,
            ],
            _ => vec![t + rng.below(10 * MIN as u64) as i64],
        };
        for (n, ts) in times.into_iter().enumerate() {
            payments.push(keyed(format!("o-{i}"), Some(format!("pay-{i}-{n}")), clock.at(ts)));
        }
    }
    payments.sort_by_key(|p| p.ts);
    Case {
        topology: "dsl-orders-payments",
        python: false,
        sources: vec![("orders", 4, orders), ("payments", 4, payments)],
        globals: vec![],
        sinks: vec!["paid"],
        unstamped: vec![],
        last_only: vec![],
    }
}

/// Customers (a table, updated and deleted while orders come) and a directory (a global
/// table), orders keyed by customer.
fn enrich_orders(rng: &mut Rng) -> Case {
    let base = base_ms();
    let mut clock = Clock { n: 0 };
    let mut customers = Vec::new();
    let mut directory = Vec::new();
    for c in 0..50 {
        if rng.chance(90) {
            customers.push(keyed(
                format!("c{c}"),
                Some(format!("name-{c}")),
                clock.at(base - 10 * MIN),
            ));
        }
        if rng.chance(90) {
            directory.push(keyed(
                format!("c{c}"),
                Some(format!("dir-{c}")),
                clock.at(base - 10 * MIN),
            ));
        }
    }
    let mut orders = Vec::new();
    for i in 0..1_200 {
        let t = base + i as i64 * 1_000;
        orders.push(keyed(
            format!("c{}", rng.below(55)),
            Some(format!("order-{i}")),
            clock.at(t),
        ));
        if rng.chance(8) {
            let c = rng.below(50);
            let value = (!rng.chance(25)).then(|| format!("name-{c}-v{i}"));
            customers.push(keyed(format!("c{c}"), value, clock.at(t + 500)));
        }
        if rng.chance(4) {
            let c = rng.below(50);
            directory.push(keyed(format!("c{c}"), Some(format!("dir-{c}-v{i}")), clock.at(t + 500)));
        }
    }
    Case {
        topology: "dsl-enrich-orders",
        python: false,
        sources: vec![
            ("orders", 4, orders),
            ("customers", 4, customers),
            ("directory", 3, directory),
        ],
        globals: vec!["directory"],
        sinks: vec!["enriched", "enriched_global"],
        unstamped: vec![],
        last_only: vec![],
    }
}

/// Orders (a table: amounts change, customers change, orders are deleted) and their
/// statuses (a table), revenue per customer.
fn revenue(rng: &mut Rng) -> Case {
    let base = base_ms();
    let mut clock = Clock { n: 0 };
    let mut orders = Vec::new();
    let mut statuses = Vec::new();
    for i in 0..1_500 {
        let t = base + i as i64 * 1_000;
        let id = format!("o-{}", rng.below(200));
        if rng.chance(60) {
            let value = (!rng.chance(10)).then(|| {
                format!(
                    r#"{{"customer":"c{}","amount":{}}}"#,
                    rng.below(20),
                    100 + rng.below(10_000)
                )
            });
            orders.push(keyed(id, value, clock.at(t)));
        } else {
            let value = match rng.below(10) {
                0 => None,
                1..=2 => Some("pending".to_string()),
                3 => Some("refunded".to_string()),
                _ => Some("paid".to_string()),
            };
            statuses.push(keyed(id, value, clock.at(t)));
        }
    }
    Case {
        topology: "dsl-revenue",
        python: false,
        sources: vec![("orders", 4, orders), ("statuses", 4, statuses)],
        globals: vec![],
        sinks: vec!["revenue"],
        unstamped: vec![],
        last_only: vec!["revenue"],
    }
}

/// Events of 30 keys, counted per tumbling minute at every update.
fn windowed_count(rng: &mut Rng) -> Case {
    let base = base_ms();
    let mut clock = Clock { n: 0 };
    let events = (0..1_500)
        .map(|i| {
            let mut ts = base + i as i64 * 1_000 + rng.jitter(8_000);
            if rng.chance(2) {
                ts -= 3 * MIN;
            }
            keyed(format!("k{}", rng.below(30)), Some("e".into()), clock.at(ts))
        })
        .collect();
    Case {
        topology: "dsl-windowed-count",
        python: false,
        sources: vec![("events", 4, events)],
        globals: vec![],
        sinks: vec!["counts"],
        unstamped: vec![],
        last_only: vec!["counts"],
    }
}

// --- Running and comparing -------------------------------------------------------------------

/// What one side wrote to one sink, in the order of each partition.
type Output = Vec<Received>;

/// Clicks of 12 users in bursts (each user active two minutes in five, so sessions end and
/// merge), out of order and some late; purchases near some clicks; two tables of the users
/// (profiles and plans), written first and then updated and deleted while the clicks come.
fn activity(rng: &mut Rng) -> Case {
    let base = base_ms();
    let mut clock = Clock { n: 0 };
    let (mut clicks, mut purchases) = (Vec::new(), Vec::new());
    for i in 0..1_200 {
        let t = base + i as i64 * 1_500;
        let user = rng.below(12) as i64;
        if ((t - base) / MIN + user) % 5 >= 2 {
            continue;
        }
        let mut ts = t + rng.jitter(20_000);
        if rng.chance(3) {
            ts -= 3 * MIN; // late past every grace but the sessions' (sometimes)
        }
        clicks.push(keyed(format!("u{user}"), Some(format!("/p{i}")), clock.at(ts)));
        if rng.chance(30) {
            let at = t + rng.jitter(90_000);
            purchases.push(keyed(format!("u{user}"), Some(format!("item-{i}")), clock.at(at)));
        }
    }
    purchases.sort_by_key(|p| p.ts);
    let (mut profiles, mut plans) = (Vec::new(), Vec::new());
    for u in 0..20 {
        if rng.chance(70) {
            profiles.push(keyed(
                format!("u{u}"),
                Some(format!("name-{u}")),
                clock.at(base - 10 * MIN),
            ));
        }
        if rng.chance(70) {
            plans.push(keyed(
                format!("u{u}"),
                Some(format!("plan-{u}")),
                clock.at(base - 10 * MIN),
            ));
        }
    }
    for k in 0..300 {
        let t = base + k as i64 * 6_000;
        let (table, what) = if rng.chance(50) {
            (&mut profiles, "name")
        } else {
            (&mut plans, "plan")
        };
        let u = rng.below(20);
        let value = (!rng.chance(20)).then(|| format!("{what}-{u}-v{k}"));
        table.push(keyed(format!("u{u}"), value, clock.at(t)));
    }
    Case {
        topology: "dsl-activity",
        python: false,
        sources: vec![
            ("clicks", 4, clicks),
            ("purchases", 4, purchases),
            ("profiles", 4, profiles),
            ("plans", 4, plans),
        ],
        globals: vec![],
        sinks: vec![
            "sliding",
            "session_updates",
            "hopping_updates",
            "bought_after_click",
            "click_or_purchase",
            "profile_plans",
            "profiles_or_plans",
        ],
        // The tables' caches flush one after the other at a commit: the last result of a
        // key comes from whichever flushes last, stamped from that side.
        unstamped: vec!["profile_plans", "profiles_or_plans"],
        // Kafka Streams caches the hopping windows' updates and the tables (Sluice sends
        // every table update); the session updates go out uncached on both sides, but
        // Kafka Streams sends a merged session's deletion only when it was sent before.
        last_only: vec![
            "session_updates",
            "hopping_updates",
            "profile_plans",
            "profiles_or_plans",
        ],
    }
}

/// Runs `case` on Sluice and on Kafka Streams under `guarantee`; the differences found, one
/// line each (none: they agree).
async fn differences(case: Case, guarantee: &'static str, seed: u64, fault: Fault) -> anyhow::Result<Vec<String>> {
    let name = match case.python {
        true => format!("py{}", case.topology.trim_start_matches("dsl-")),
        false => case.topology.trim_start_matches("dsl-").to_string(),
    };
    let name = name.as_str();
    let t = |what: &str| unique_name(&format!("diff-{name}-{what}"));
    let mut sources = Vec::new();
    for (role, partitions, records) in &case.sources {
        let topic = t(role);
        kafka().create_topic(&topic, *partitions).await?;
        produce(&topic, records).await?;
        sources.push((*role, topic, *partitions, records.len()));
    }
    let mut sinks = Vec::new();
    for role in &case.sinks {
        let (ours, theirs) = (t(&format!("{role}-sluice")), t(&format!("{role}-ks")));
        kafka().create_topic(&ours, 2).await?;
        kafka().create_topic(&theirs, 2).await?;
        sinks.push((*role, ours, theirs));
    }
    let source_roles: Vec<(&str, &str)> = sources.iter().map(|(r, t, _, _)| (*r, t.as_str())).collect();
    let our_sinks: Vec<(&str, &str)> = sinks.iter().map(|(r, o, _)| (*r, o.as_str())).collect();
    let mut their_roles = source_roles.clone();
    their_roles.extend(sinks.iter().map(|(r, _, k)| (*r, k.as_str())));

    let mut ex = if case.python {
        // Python components compile once per test run, into a cache the workers share.
        let cache: Vec<&'static str> = shared_compile_cache()
            .into_iter()
            .map(|s| &*Box::leak(s.into_boxed_str()))
            .collect();
        let component = format!("python/{}", case.topology);
        Example::new(&format!("diff{name}"), &component, &source_roles, &our_sinks).with_args(&cache)
    } else {
        Example::new(&format!("diff{name}"), case.topology, &source_roles, &our_sinks)
    }
    .under(guarantee);
    ex.start_worker()?;
    if fault == Fault::Kill {
        ex.start_worker()?;
    }
    let app = unique_name(&format!("diff-{name}-ks"));
    let mut peer = Peer::start(&app, guarantee, case.topology, &their_roles)?;
    if fault != Fault::None {
        // Midway: once Sluice's first output is there, a second worker joins (scale), or
        // the first of two is SIGKILLed (kill).
        let first = &sinks[0].1;
        let deadline = Instant::now() + Duration::from_secs(60);
        while kafka().read_all(first, Duration::from_secs(10))?.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match fault {
            Fault::Kill => ex.kill_first()?,
            _ => ex.start_worker()?,
        }
    }
    // At-least-once through a kill may send some updates twice: only the last value per key
    // is the same as Kafka Streams' then.
    let through_a_kill = fault == Fault::Kill && guarantee == "at-least-once";

    // Both have committed all their input, and neither output changed for four seconds.
    for (role, topic, partitions, total) in &sources {
        if case.globals.contains(role) {
            continue;
        }
        for (who, group) in [("Sluice", ex.group()), ("Kafka Streams", peer.app.clone())] {
            kafka()
                .wait_committed(&group, topic, *partitions, *total as i64, Duration::from_secs(120))
                .await
                .map_err(|e| {
                    anyhow::anyhow!(
                        "{who} did not commit all of {role} ({e}); Sluice:\n{}\nKafka Streams:\n{}",
                        ex.logs(),
                        peer.log()
                    )
                })?;
        }
    }
    // And Sluice has read its repartition topics to their end: a task that reads one may
    // have been on the killed worker, and restarts only when its session times out.
    caught_up_internally(&ex, Duration::from_secs(120))
        .await
        .map_err(|e| anyhow::anyhow!("{e}; Sluice:\n{}", ex.logs()))?;
    let topics: Vec<&str> = sinks.iter().flat_map(|(_, o, k)| [o.as_str(), k.as_str()]).collect();
    // A worker SIGKILLed inside a transaction leaves it open until the broker times it out
    // (10 s, then up to its 10 s abort check): a read-committed reader sees nothing past
    // its first record on each partition it wrote, the survivor's committed outputs
    // included. Compared before, those outputs would look missing.
    for topic in &topics {
        kafka()
            .wait_transactions_ended(topic, Duration::from_secs(90))
            .await
            .map_err(|e| anyhow::anyhow!("{e}; Sluice:\n{}", ex.logs()))?;
    }
    let read = || -> anyhow::Result<Vec<Output>> {
        topics
            .iter()
            .map(|s| kafka().read_all(s, Duration::from_secs(60)))
            .collect()
    };
    let counts = |out: &[Output]| out.iter().map(Vec::len).collect::<Vec<_>>();
    let (mut last, mut since) = (counts(&read()?), Instant::now());
    let deadline = Instant::now() + Duration::from_secs(90);
    while since.elapsed() < Duration::from_secs(4) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = counts(&read()?);
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    ex.stop()?;
    peer.stop();
    let out = read()?;
    // A trial of many seeds would otherwise leave thousands of partitions on the broker
    // (each holds open files): the run's topics go, its own and both sides' internal ones.
    let mut prefixes = vec![format!("{}-", ex.name), format!("{}-", peer.app)];
    prefixes.extend(sources.iter().map(|(_, t, _, _)| t.clone()));
    prefixes.extend(topics.iter().map(|t| t.to_string()));
    forget_topics(&prefixes).await;

    let mut found = Vec::new();
    for (i, (role, our_topic, _)) in sinks.iter().enumerate() {
        let (ours, theirs) = (&out[2 * i], &out[2 * i + 1]);
        let at = format!("{} seed {seed} {guarantee} {fault:?} sink {role}", case.topology);
        if theirs.len() < 20 {
            found.push(format!(
                "{at}: Kafka Streams wrote {} records: the case shows nothing",
                theirs.len()
            ));
        }
        let last_only = through_a_kill || case.last_only.contains(role);
        let before = found.len();
        compare(&at, ours, theirs, !case.unstamped.contains(role), last_only, &mut found);
        if found.len() > before {
            found.push(written_but_not_committed(our_topic, ours));
        }
    }
    if !found.is_empty() {
        eprintln!(
            "{} differences:\n{}\nSluice:\n{}\n\nKafka Streams:\n{}",
            found.len(),
            found.join("\n"),
            ex.logs(),
            peer.log()
        );
    }
    Ok(found)
}

/// Where Sluice's records of `topic` went that a read-committed reader does not see
/// (`committed`): each partition's records, committed and as written (aborted and open
/// transactions' too), and the records of keys never committed.
fn written_but_not_committed(topic: &str, committed: &Output) -> String {
    let written = match kafka().read_all_uncommitted(topic, Duration::from_secs(60)) {
        Ok(written) => written,
        Err(e) => return format!("    (reading {topic} read-uncommitted: {e})"),
    };
    let mut lines = vec![format!("    {topic}, as written:")];
    let partitions: BTreeSet<i32> = written.iter().map(|r| r.partition).collect();
    for p in partitions {
        let of = |o: &Output| o.iter().filter(|r| r.partition == p).count();
        let last = written.iter().filter(|r| r.partition == p).map(|r| r.offset).max();
        lines.push(format!(
            "      partition {p}: {} committed, {} written, last at offset {last:?}",
            of(committed),
            of(&written)
        ));
    }
    let seen: BTreeSet<&Option<Vec<u8>>> = committed.iter().map(|r| &r.key).collect();
    let lost: Vec<String> = written
        .iter()
        .filter(|r| !seen.contains(&r.key))
        .take(24)
        .map(|r| format!("{} → {} at {}@{}", show(&r.key), show(&r.value), r.partition, r.offset))
        .collect();
    lines.push(format!("      written, of keys never committed: {}", lost.join(", ")));
    lines.join("\n")
}

/// Deletes the topics whose names start with one of `prefixes`, without waiting; a failure
/// is only reported (the comparison is done).
async fn forget_topics(prefixes: &[String]) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let names = (|| -> anyhow::Result<Vec<String>> {
        let consumer: BaseConsumer = kafka().config().create()?;
        let metadata = consumer.fetch_metadata(None, Duration::from_secs(10))?;
        Ok(metadata
            .topics()
            .iter()
            .map(|t| t.name().to_string())
            .filter(|name| prefixes.iter().any(|p| name.starts_with(p.as_str())))
            .collect())
    })();
    let result = async {
        let names = names?;
        if names.is_empty() {
            return Ok(());
        }
        let admin: AdminClient<DefaultClientContext> = kafka().config().create()?;
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        admin.delete_topics(&refs, &AdminOptions::new()).await?;
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = result {
        eprintln!("differential: deleting the run's topics: {e}");
    }
}

/// Whether `topic`/`partition` holds a committed record at or after `from` (transaction
/// markers and aborted records are not records).
fn has_records_from(topic: &str, partition: i32, from: i64) -> anyhow::Result<bool> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::error::KafkaError;
    use rdkafka::{Offset, TopicPartitionList};
    let consumer: BaseConsumer = kafka()
        .config()
        .set("group.id", unique_name("peek"))
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(from))?;
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(500)) {
            Some(Ok(_)) => return Ok(true),
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(false),
            Some(Err(e)) => anyhow::bail!("reading {topic}/{partition}: {e}"),
            None => {}
        }
    }
    anyhow::bail!("reading {topic}/{partition} from {from}: no answer in 20 s")
}

/// Waits until the topology's group has committed every partition of its repartition topics
/// (`<topology>-<name>-repartition`) past its last record: all it wrote there has been read.
/// (Under exactly-once a partition ends with transaction markers, which no offset commit
/// covers.)
pub(crate) async fn caught_up_internally(ex: &Example, timeout: Duration) -> anyhow::Result<()> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    let deadline = Instant::now() + timeout;
    let group = ex.group();
    let consumer: BaseConsumer = kafka().config().set("group.id", &group).create()?;
    let metadata = consumer.fetch_metadata(None, Duration::from_secs(10))?;
    let prefix = format!("{}-", ex.name);
    let internal: Vec<(String, i32)> = metadata
        .topics()
        .iter()
        .filter(|t| t.name().starts_with(&prefix) && t.name().ends_with("-repartition"))
        .map(|t| (t.name().to_string(), t.partitions().len() as i32))
        .collect();
    loop {
        let mut behind = Vec::new();
        for (topic, partitions) in &internal {
            let mut tpl = TopicPartitionList::new();
            for p in 0..*partitions {
                tpl.add_partition(topic, p);
            }
            let committed = consumer.committed_offsets(tpl, Duration::from_secs(30))?;
            for p in 0..*partitions {
                let (_, end) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
                let at = match committed.find_partition(topic, p).map(|e| e.offset()) {
                    Some(Offset::Offset(o)) => o,
                    _ => 0,
                };
                if at < end && has_records_from(topic, p, at)? {
                    behind.push(format!("{topic}/{p}: {at} of {end}"));
                }
            }
        }
        if behind.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "group {group} did not read its repartition topics to the end: {}",
                behind.join(", ")
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn show(bytes: &Option<Vec<u8>>) -> String {
    match bytes {
        None => "null".into(),
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) if s.chars().all(|c| !c.is_control()) => format!("{s:?}"),
            _ if b.len() == 8 => format!("{}", i64::from_be_bytes(b[..].try_into().expect("8 bytes"))),
            _ => format!("0x{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>()),
        },
    }
}

/// Multiset differences of `ours` and `theirs` by `what`, as lines.
fn multiset_diff<T: Ord + Clone>(ours: &[T], theirs: &[T]) -> (Vec<(T, i64)>, usize) {
    let mut counts: BTreeMap<T, i64> = BTreeMap::new();
    for r in ours {
        *counts.entry(r.clone()).or_default() += 1;
    }
    for r in theirs {
        *counts.entry(r.clone()).or_default() -= 1;
    }
    let diff: Vec<(T, i64)> = counts.into_iter().filter(|(_, n)| *n != 0).collect();
    let n = diff.len();
    (diff, n)
}

fn compare(at: &str, ours: &Output, theirs: &Output, stamps: bool, last_only: bool, found: &mut Vec<String>) {
    type Kv = (Option<Vec<u8>>, Option<Vec<u8>>);
    let kv = |o: &Output| o.iter().map(|r| (r.key.clone(), r.value.clone())).collect::<Vec<Kv>>();
    let (diff, n) = if last_only {
        (Vec::new(), 0)
    } else {
        multiset_diff(&kv(ours), &kv(theirs))
    };
    if n > 0 {
        let lines: Vec<String> = diff
            .iter()
            .take(12)
            .map(|((k, v), d)| {
                let side = if *d > 0 { "only Sluice" } else { "only Kafka Streams" };
                format!("    {side} ×{}: {} → {}", d.abs(), show(k), show(v))
            })
            .collect();
        // Both sides' records of the first keys that differ, in the order they were written.
        let keys: BTreeSet<&Option<Vec<u8>>> = diff.iter().map(|((k, _), _)| k).take(3).collect();
        let mut sides = Vec::new();
        for k in keys {
            for (who, out) in [("Sluice", ours), ("Kafka Streams", theirs)] {
                let values: Vec<String> = out
                    .iter()
                    .filter(|r| &r.key == k)
                    .map(|r| format!("{} @{}", show(&r.value), r.timestamp.unwrap_or(-1)))
                    .collect();
                sides.push(format!("    {} from {who}: {}", show(k), values.join(", ")));
            }
        }
        found.push(format!(
            "{at}: {n} (key, value) records differ ({} from Sluice, {} from Kafka Streams):\n{}\n{}",
            ours.len(),
            theirs.len(),
            lines.join("\n"),
            sides.join("\n")
        ));
    }
    // The last value per key, with its time: a key is on one partition of a sink, in
    // offset order.
    type Stamped = (Option<Vec<u8>>, Option<i64>);
    let last = |o: &Output| {
        let mut m: BTreeMap<Option<Vec<u8>>, Stamped> = BTreeMap::new();
        for r in o {
            m.insert(r.key.clone(), (r.value.clone(), r.timestamp.filter(|_| stamps)));
        }
        // A key whose last record is a tombstone is a key without a value, as one never
        // sent: a record cache does not send the deletion of a key it never sent.
        m.retain(|_, (value, _)| value.is_some());
        m
    };
    let (a, b) = (last(ours), last(theirs));
    let keys: BTreeSet<_> = a.keys().chain(b.keys()).cloned().collect();
    let wrong: Vec<String> = keys
        .iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .take(12)
        .map(|k| {
            let v = |m: &BTreeMap<_, Stamped>| {
                m.get(k).map_or("nothing".into(), |(v, ts)| match ts {
                    Some(ts) => format!("{} @{ts}", show(v)),
                    None => show(v),
                })
            };
            format!("    {}: Sluice {}, Kafka Streams {}", show(k), v(&a), v(&b))
        })
        .collect();
    if !wrong.is_empty() {
        found.push(format!("{at}: the last value differs for keys:\n{}", wrong.join("\n")));
    }
    if stamps && !last_only && n == 0 {
        type Kvt = (Option<Vec<u8>>, Option<Vec<u8>>, Option<i64>);
        let kvt = |o: &Output| {
            o.iter()
                .map(|r| (r.key.clone(), r.value.clone(), r.timestamp))
                .collect::<Vec<Kvt>>()
        };
        let (diff, n) = multiset_diff(&kvt(ours), &kvt(theirs));
        if n > 0 {
            let lines: Vec<String> = diff
                .iter()
                .take(12)
                .map(|((k, v, ts), d)| {
                    let side = if *d > 0 { "only Sluice" } else { "only Kafka Streams" };
                    format!("    {side}: {} → {} at {ts:?}", show(k), show(v))
                })
                .collect();
            found.push(format!(
                "{at}: {n} records are stamped differently:\n{}",
                lines.join("\n")
            ));
        }
    }
}

/// What happens to Sluice's workers midway (`SLUICE_DIFF_FAULT`: `kill`, `scale`; none
/// by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Kill,
    Scale,
}

impl Fault {
    fn from_env() -> Fault {
        match std::env::var("SLUICE_DIFF_FAULT").as_deref() {
            Ok("kill") => Fault::Kill,
            Ok("scale") => Fault::Scale,
            _ => Fault::None,
        }
    }
}

/// Seeds to run: `SLUICE_DIFF_SEEDS` (a count, from 1) or the one given.
/// `SLUICE_DIFF_SEEDS`: `N` runs seeds 1 to N, `A-B` seeds A to B; unset, the test's own.
fn seeds(default: u64) -> Vec<u64> {
    let Ok(text) = std::env::var("SLUICE_DIFF_SEEDS") else {
        return vec![default];
    };
    let (from, to) = match text.split_once('-') {
        Some((a, b)) => (a.trim().parse().ok(), b.trim().parse().ok()),
        None => (Some(1), text.trim().parse().ok()),
    };
    match (from, to) {
        (Some(from), Some(to)) => (from..=to).collect(),
        _ => panic!("SLUICE_DIFF_SEEDS={text:?}: give N (seeds 1 to N) or A-B"),
    }
}

fn guarantees(default: &'static str) -> Vec<&'static str> {
    match std::env::var("SLUICE_DIFF_GUARANTEES").as_deref() {
        Ok("both") => vec!["at-least-once", "exactly-once"],
        Ok("at-least-once") => vec!["at-least-once"],
        Ok("exactly-once") => vec!["exactly-once"],
        _ => vec![default],
    }
}

async fn agree(make: fn(&mut Rng) -> Case, seed: u64, guarantee: &'static str) -> anyhow::Result<()> {
    let mut found = Vec::new();
    for seed in seeds(seed) {
        for g in guarantees(guarantee) {
            found.extend(differences(make(&mut Rng(seed)), g, seed, Fault::from_env()).await?);
        }
    }
    assert!(
        found.is_empty(),
        "Sluice and Kafka Streams differ:\n{}",
        found.join("\n")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn word_count_agrees_with_kafka_streams() -> anyhow::Result<()> {
    agree(word_count, 1, "at-least-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn tumbling_and_hopping_windows_emitted_final_agree_with_kafka_streams() -> anyhow::Result<()> {
    agree(page_views, 2, "exactly-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn session_windows_agree_with_kafka_streams() -> anyhow::Result<()> {
    agree(sessions, 3, "at-least-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_stream_left_join_agrees_with_kafka_streams() -> anyhow::Result<()> {
    agree(orders_payments, 4, "exactly-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn stream_table_and_global_table_joins_agree_with_kafka_streams() -> anyhow::Result<()> {
    agree(enrich_orders, 5, "at-least-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_table_join_and_a_table_aggregation_agree_with_kafka_streams() -> anyhow::Result<()> {
    agree(revenue, 6, "exactly-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn windows_emitted_on_update_agree_with_kafka_streams() -> anyhow::Result<()> {
    agree(windowed_count, 7, "at-least-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn sliding_session_and_hopping_windows_stream_and_table_joins_agree_with_kafka_streams() -> anyhow::Result<()> {
    agree(activity, 8, "exactly-once").await
}

// --- Python twins ----------------------------------------------------------------------------

/// The Python twin of a case (`guests/python/<topology>`, written with the Python DSL) against
/// Kafka Streams, through a SIGKILL of one of Sluice's two workers midway, under `guarantee`.
async fn python_agrees_through_a_kill(
    make: fn(&mut Rng) -> Case,
    seed: u64,
    guarantee: &'static str,
) -> anyhow::Result<()> {
    let mut case = make(&mut Rng(seed));
    case.python = true;
    let found = differences(case, guarantee, seed, Fault::Kill).await?;
    assert!(
        found.is_empty(),
        "Sluice (the Python twin) and Kafka Streams differ:\n{}",
        found.join("\n")
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_dsl_word_count_agrees_with_kafka_streams_through_a_kill_at_least_once() -> anyhow::Result<()> {
    python_agrees_through_a_kill(word_count, 11, "at-least-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_dsl_word_count_agrees_with_kafka_streams_through_a_kill_exactly_once() -> anyhow::Result<()> {
    python_agrees_through_a_kill(word_count, 12, "exactly-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn python_windows_emitted_final_agree_with_kafka_streams_through_a_kill_exactly_once() -> anyhow::Result<()> {
    python_agrees_through_a_kill(page_views, 13, "exactly-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn python_windows_emitted_final_agree_with_kafka_streams_through_a_kill_at_least_once() -> anyhow::Result<()> {
    python_agrees_through_a_kill(page_views, 16, "at-least-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn python_stream_table_and_global_joins_agree_with_kafka_streams_through_a_kill_exactly_once(
) -> anyhow::Result<()> {
    python_agrees_through_a_kill(enrich_orders, 17, "exactly-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_stream_stream_left_join_agrees_with_kafka_streams_through_a_kill_at_least_once() -> anyhow::Result<()>
{
    python_agrees_through_a_kill(orders_payments, 18, "at-least-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_stream_stream_left_join_agrees_with_kafka_streams_through_a_kill_exactly_once() -> anyhow::Result<()>
{
    python_agrees_through_a_kill(orders_payments, 15, "exactly-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn python_stream_table_and_global_joins_agree_with_kafka_streams_through_a_kill_at_least_once(
) -> anyhow::Result<()> {
    python_agrees_through_a_kill(enrich_orders, 14, "at-least-once").await
}
