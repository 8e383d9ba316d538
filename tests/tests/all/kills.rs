//! Kill trials: a worker SIGKILLed at random moments of a word-count run while input flows,
//! restarted each time; the word count in Rust, and its twin in Python (the same store and
//! output, so the same truth). Under exactly-once every final count equals the truth (the
//! read-committed output and the stores); under at-least-once none is below it. CI runs a
//! short trial; `SLUICE_KILLS=20 cargo test kill_trials` runs the long one.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_tests::wordcount::{self, lines};
use sluice_tests::worker::shared_compile_cache;
use sluice_tests::{kafka, Scenario};

const PARTITIONS: i32 = 4;

/// xorshift: random kill moments, reproducible from the printed seed.
fn next(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

async fn kill_trial(guarantee: &str, guest: &str) -> anyhow::Result<()> {
    let kills: usize = std::env::var("SLUICE_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let mut seed: u64 = std::env::var("SLUICE_KILL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::process::id() as u64 * 2_654_435_761 + 1);
    eprintln!("kill trial ({guest}, {guarantee}): {kills} kills, seed {seed}");
    let wc = Scenario::builder("wc", guest)
        .source("lines", PARTITIONS)
        .sink("counts", PARTITIONS)
        .create()
        .await?;
    let cache = shared_compile_cache();
    let start = || {
        let mut args = vec![
            "--processing-guarantee",
            guarantee,
            "--commit-interval",
            "100ms",
            "--batch-size",
            "100",
        ];
        if guest.starts_with("python/") {
            args.extend(cache.iter().map(String::as_str));
        }
        wc.worker(&args)
    };
    let chunks = 20 + kills * 8;
    let total = chunks * 250;
    let producing = {
        let input = wc.input().to_string();
        tokio::spawn(async move {
            let mut positions = Vec::new();
            for chunk in 0..chunks {
                positions.extend(kafka().produce(&input, &lines(chunk * 250..(chunk + 1) * 250)).await?);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(positions)
        })
    };
    let mut worker = start()?;
    for _ in 0..kills {
        let wait = 500 + next(&mut seed) % 1500;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        worker.kill()?;
        worker = start()?;
    }
    let positions = producing.await??;
    if let Err(e) = wc.wait_committed(total, Duration::from_secs(180)).await {
        panic!("{e:#}; the last worker's log:\n{}", worker.log());
    }
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());

    let truth = wordcount::truth(total, &positions)?;
    let mut over: BTreeMap<u64, usize> = BTreeMap::new();
    for p in 0..PARTITIONS {
        let counts = wc.store_counts(p, "counts")?;
        for (word, n) in &truth[&p] {
            let got = counts.get(word).copied().unwrap_or(0);
            if guarantee == "exactly-once" {
                assert_eq!(
                    got, *n,
                    "partition {p}, {word}: exactly-once store differs from the truth"
                );
            } else {
                assert!(got >= *n, "partition {p}, {word}: {got} < {n}");
                *over.entry(got - n).or_default() += 1;
            }
        }
    }
    if guarantee == "exactly-once" {
        // Read-committed output: each word's counts 1..=n, each exactly once.
        let out = wc.read_all(Duration::from_secs(120))?;
        for (word, counts) in wordcount::counts_per_word(&out)? {
            assert_eq!(
                counts,
                wordcount::expected_counts(&truth, &word),
                "{word}: the committed output is not each count exactly once"
            );
        }
    } else {
        eprintln!("kill trial (at-least-once): over-count per (partition, word) -> how many: {over:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_trials_under_exactly_once_end_with_every_count_exact() -> anyhow::Result<()> {
    kill_trial("exactly-once", "word-count").await
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_trials_under_at_least_once_never_end_below_the_truth() -> anyhow::Result<()> {
    kill_trial("at-least-once", "word-count").await
}

#[tokio::test(flavor = "multi_thread")]
async fn python_kill_trials_under_exactly_once_end_with_every_count_exact() -> anyhow::Result<()> {
    kill_trial("exactly-once", "python/word-count").await
}

#[tokio::test(flavor = "multi_thread")]
async fn python_kill_trials_under_at_least_once_never_end_below_the_truth() -> anyhow::Result<()> {
    kill_trial("at-least-once", "python/word-count").await
}

/// A worker SIGKILLed inside a transaction: the leader ends its open transactions as soon as
/// the group sees it gone (it fences the dead worker's transactional ids), so a
/// read-committed reader of the output sees what the survivor committed since within a
/// second of that, not when the broker times the transaction out (10 s, then its abort
/// scan: the wait every read-committed reader had before, as Kafka Streams' have). With
/// `SLUICE_BINARY` at release 0.2.0 it fails: nothing new reaches the reader for 10-20 s.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_workers_open_transactions_end_when_the_group_sees_it_gone_not_at_their_timeout() -> anyhow::Result<()>
{
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::Message;
    use sluice_tests::{free_port, http_get, unique_name};
    use std::time::Instant;

    // Uppercase sends each record as it comes and its keys spread every task's output over
    // every output partition, so a transaction open at the kill holds all of them.
    let shout = Scenario::builder("crash", "uppercase")
        .source("input", PARTITIONS)
        .sink("output", 8)
        .create()
        .await?;
    let cluster = unique_name("crash");
    let port = free_port();
    let admin = format!("127.0.0.1:{port}");
    // Commits every 500 ms: a transaction is open most of the time (records go out as they
    // come, the commit ends it), so most kills land inside one.
    let common = ["--processing-guarantee", "exactly-once", "--commit-interval", "500ms"];
    let mut survivor_args = common.to_vec();
    survivor_args.extend(["--metrics", &admin]);
    let mut survivor = shout.member(&cluster, 0, &survivor_args)?;
    let status = || -> anyhow::Result<serde_json::Value> { Ok(serde_json::from_str(&http_get(port, "/status")?)?) };

    // Load all along, 25 lines every 10 ms or so.
    let producing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let producer = {
        let (input, producing) = (shout.input().to_string(), producing.clone());
        tokio::spawn(async move {
            let mut chunk = 0;
            while producing.load(std::sync::atomic::Ordering::Relaxed) {
                kafka().produce(&input, &lines(chunk * 25..(chunk + 1) * 25)).await?;
                chunk += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            anyhow::Ok(())
        })
    };
    let reader: StreamConsumer = kafka()
        .config()
        .set("group.id", unique_name("crash-reader"))
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()?;
    reader.subscribe(&[shout.output()])?;

    // A kill lands between two transactions now and then (the victim had just committed):
    // then nothing is held, and the victim is started again and killed once more.
    let mut held = Vec::new();
    for attempt in 0..5 {
        let mut victim = shout.member(&cluster, 1, &common)?;
        let began = Instant::now();
        loop {
            let s = status().unwrap_or_default();
            let tasks = s["tasks"]
                .as_array()
                .map_or(0, |t| t.iter().filter(|t| t["role"] == "active").count());
            if tasks > 0 && tasks < PARTITIONS as usize && s["rebalancing"] == false {
                break;
            }
            anyhow::ensure!(
                began.elapsed() < Duration::from_secs(90),
                "the two workers did not share the tasks: {s}\n{}",
                victim.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let settled = Instant::now() + Duration::from_secs(3);
        while Instant::now() < settled {
            let _ = tokio::time::timeout(Duration::from_millis(50), reader.recv()).await;
        }
        let generation = status()?["generation"].as_i64().unwrap();

        victim.kill()?;
        let killed = Instant::now();
        let killed_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as i64;
        // Per output partition: when a record made of input produced after the kill first
        // reached the reader; and when the survivor's group moved on.
        let mut first_new: BTreeMap<i32, Instant> = BTreeMap::new();
        let mut noticed: Option<Instant> = None;
        let mut next_status = Instant::now();
        while killed.elapsed() < Duration::from_secs(40) && (first_new.len() < 8 || noticed.is_none()) {
            if noticed.is_none() && Instant::now() >= next_status {
                next_status += Duration::from_millis(50);
                if status()
                    .ok()
                    .and_then(|s| s["generation"].as_i64())
                    .is_some_and(|g| g > generation)
                {
                    noticed = Some(Instant::now());
                }
            }
            if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(20), reader.recv()).await {
                if m.timestamp().to_millis().is_some_and(|t| t > killed_ms + 50) {
                    first_new.entry(m.partition()).or_insert_with(Instant::now);
                }
            }
        }
        let noticed = noticed.ok_or_else(|| {
            anyhow::anyhow!(
                "the survivor's group never moved on after the kill:\n{}",
                survivor.log()
            )
        })?;
        let since_kill = |t: Instant| (t.duration_since(killed).as_secs_f64() * 100.0).round() / 100.0;
        eprintln!(
            "kill {attempt}: the group moved on at {:.2}s; new records per output partition at {:?} s",
            since_kill(noticed),
            first_new.iter().map(|(p, t)| (*p, since_kill(*t))).collect::<Vec<_>>()
        );
        assert_eq!(
            first_new.len(),
            8,
            "some output partition saw nothing new within 40 s: {first_new:?}"
        );
        // The partitions the dead worker's transaction held: nothing new reached the reader
        // before the group moved on.
        held = first_new
            .iter()
            .filter(|(_, t)| **t > noticed)
            .map(|(p, t)| (*p, t.duration_since(noticed).as_secs_f64()))
            .collect();
        if !held.is_empty() {
            break;
        }
    }
    producing.store(false, std::sync::atomic::Ordering::Relaxed);
    producer.await??;
    assert!(
        !held.is_empty(),
        "five kills and none inside a transaction; the survivor's log:\n{}",
        survivor.log()
    );
    for (p, after) in &held {
        assert!(
            *after < 1.0,
            "output partition {p}: new records only {after:.2}s after the group saw the worker gone; the survivor's log:\n{}",
            survivor.log()
        );
    }
    assert!(
        survivor.terminate(Duration::from_secs(60))?.success(),
        "{}",
        survivor.log()
    );
    Ok(())
}
