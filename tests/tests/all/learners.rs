//! Learner tasks: a worker that joins restores the state of the tasks it will take over
//! while their owner keeps processing them, and takes each over once caught up.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sluice_tests::worker::{
    cluster_worker, draining_cluster_worker, dump_counts, guest, manifest, sluice_binary, TempDir, WorkerProcess,
};
use sluice_tests::{free_port, http_get, kafka, unique_name};

use crate::cluster::until_settled;

/// Lines of three words; word counts per input partition are the truth to compare with.
fn lines(range: std::ops::Range<usize>) -> Vec<(Vec<u8>, Vec<u8>)> {
    range
        .map(|i| {
            (
                format!("line-{i}").into_bytes(),
                format!("w{} w{} w{}", i % 1009, (i * 7) % 2003, i % 13).into_bytes(),
            )
        })
        .collect()
}

/// Seconds since midnight of a log line's RFC 3339 timestamp (`…T16:40:00.123456Z …`).
fn at(line: &str) -> Option<f64> {
    let time = line.split_whitespace().next()?.split('T').nth(1)?.trim_end_matches('Z');
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// The first line of a log with all of `needles` (standby and learner lines of the
/// state-updater thread left out unless asked for).
fn first<'a>(log: &'a str, needles: &[&str]) -> Option<&'a str> {
    log.lines()
        .filter(|l| !l.contains("sluice::threads::state_updater") || needles.iter().any(|n| n.contains("standby")))
        .find(|l| needles.iter().all(|n| l.contains(n)))
}

/// The `key=value` field of a log line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split(&format!(" {key}=")).nth(1)?.split([' ', '"']).next()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_joining_worker_learns_then_takes_over_caught_up_tasks_and_state_equals_the_truth() -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("learn-in"), unique_name("learn-out"));
    kafka.create_topic(&input, 4).await?;
    kafka.create_topic(&output, 4).await?;
    let dir = TempDir::new("learners");
    let name = unique_name("wc");
    let m = dir.write(
        "wc.toml",
        &manifest(
            &name,
            &guest("word-count"),
            &[("lines", &input)],
            &[("counts", &output)],
            "",
        ),
    );
    let cluster = unique_name("c");
    let acceptable_lag = 2_000;
    // The first worker's admin endpoint (`sluice worker drain` talks to it).
    let admin = format!("127.0.0.1:{}", free_port());
    let lag = acceptable_lag.to_string();
    let start = |n: usize| {
        let extra = ["--acceptable-recovery-lag", &lag, "--metrics", &admin];
        // Only the first worker has an admin endpoint.
        cluster_worker(&dir, Some(&m), &cluster, n, &extra[..if n == 0 { 4 } else { 2 }])
    };

    // State first: 60,000 lines (about 3,000 distinct words per partition, so changelogs of
    // thousands of records) on one worker.
    let mut sent = lines(0..60_000);
    let mut positions = kafka.produce(&input, &sent).await?;
    let mut workers = vec![start(0)?];
    until_settled(&mut workers, 4).await?;
    kafka
        .wait_committed(&format!("sluice-{name}"), &input, 4, 60_000, Duration::from_secs(120))
        .await?;

    // Then steady input while a second worker joins.
    let producing = {
        let input = input.clone();
        tokio::spawn(async move {
            let mut positions = Vec::new();
            for chunk in 0..50 {
                let from = 60_000 + chunk * 200;
                positions.extend(kafka.produce(&input, &lines(from..from + 200)).await?);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(positions)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    workers.push(start(1)?);
    let settled = until_settled(&mut workers, 2).await?;
    positions.extend(producing.await??);
    sent.extend(lines(60_000..70_000));
    let total = sent.len() as i64;
    kafka
        .wait_committed(&format!("sluice-{name}"), &input, 4, total, Duration::from_secs(120))
        .await?;

    // Every task the newcomer took over was a learner first; it caught up (lag within the
    // acceptable lag), then became active and replayed only what arrived in between.
    let (old, new) = (workers[0].log(), workers[1].log());
    assert!(
        first(&new, &[" assignment ", "learner=2"]).is_some() || first(&new, &[" assignment ", "learner=1"]).is_some(),
        "the newcomer never held learners:\n{new}"
    );
    assert!(
        first(&new, &["learner caught up"]).is_some(),
        "no learner of the newcomer ever caught up:\n{new}"
    );
    for task in &settled[1] {
        let tag = format!("task={task}");
        // Promoted from a learner that was within the acceptable lag (as of that rebalance).
        let promoted = first(&new, &["learner promoted", &tag])
            .ok_or_else(|| anyhow::anyhow!("{task} was not promoted from a learner:\n{new}"))?;
        let lag: i64 = field(promoted, "lag").unwrap_or("-1").parse()?;
        assert!((0..=acceptable_lag).contains(&lag), "{task}: promoted at lag {lag}");
        // As active, it replayed only what its learner had not read.
        let restored = first(&new, &[" restored ", &format!("{tag} ")])
            .ok_or_else(|| anyhow::anyhow!("{task} never restored as active:\n{new}"))?;
        let from: i64 = field(restored, "from_offset").unwrap_or("0").parse()?;
        let records: i64 = field(restored, "records").unwrap_or("-1").parse()?;
        eprintln!("{task}: promoted at lag {lag}; replayed {records} records on top of offset {from}");
        assert!(
            from > 0,
            "{task}: the active task restored from offset 0, not from its learner"
        );
        assert!(
            records <= acceptable_lag + 5_000,
            "{task}: replayed {records} records after promotion"
        );
        // A learner that asked for its task got it at once, not at a later periodic check:
        // within one second.
        if let Some(caught_up) = first(&new, &["learner caught up", &tag]) {
            let delay = at(promoted).unwrap_or(f64::NAN) - at(caught_up).unwrap_or(f64::NAN);
            eprintln!("{task}: promoted {delay:.3}s after its learner caught up");
            assert!(delay < 1.0, "{task}: promoted {delay:.3}s after its learner caught up");
        }
        // The old owner stopped it (committed) before the new one started it.
        let stopped = first(&old, &[" stopped ", &format!("{tag} ")])
            .ok_or_else(|| anyhow::anyhow!("{task} never stopped on the old worker:\n{old}"))?;
        let started = new
            .lines()
            .find(|l| l.contains(" started ") && l.ends_with(&tag) && !l.contains("standby"))
            .ok_or_else(|| anyhow::anyhow!("{task} never started on the new worker"))?;
        assert!(
            at(stopped) <= at(started),
            "{task} started on the newcomer before it stopped on its old worker"
        );
    }
    // The old worker kept processing the tasks it kept: started once, never stopped.
    for task in &settled[0] {
        let tag = format!("{task} ");
        assert!(
            first(&old, &[" stopped ", &format!("task={tag}")]).is_none(),
            "{task} stopped on the worker that kept it"
        );
    }

    // Drain 2 -> 1 under steady input: the first worker hands its tasks to the second (whose
    // learners catch up first) and exits 0 once it owns nothing.
    let producing = {
        let input = input.clone();
        tokio::spawn(async move {
            let mut positions = Vec::new();
            for chunk in 0..50 {
                let from = 70_000 + chunk * 200;
                positions.extend(kafka.produce(&input, &lines(from..from + 200)).await?);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(positions)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = std::process::Command::new(sluice_binary())
        .args(["worker", "drain", "--admin", &admin])
        .output()?;
    assert!(
        asked.status.success(),
        "sluice worker drain: {}{}",
        String::from_utf8_lossy(&asked.stdout),
        String::from_utf8_lossy(&asked.stderr)
    );
    let drained = workers[0].wait(Duration::from_secs(120))?;
    let old = workers[0].log();
    assert!(drained.success(), "the drained worker exited with {drained}:\n{old}");
    assert!(old.contains("drained: every task runs elsewhere now"), "{old}");
    let mut survivor: Vec<WorkerProcess> = workers.drain(1..).collect();
    let all = until_settled(&mut survivor, 4).await?;
    positions.extend(producing.await??);
    sent.extend(lines(70_000..80_000));
    let total = sent.len() as i64;
    kafka
        .wait_committed(&format!("sluice-{name}"), &input, 4, total, Duration::from_secs(120))
        .await?;
    let new = survivor[0].log();
    for task in &settled[0] {
        let tag = format!("task={task}");
        let promoted = first(&new, &["learner promoted", &tag])
            .ok_or_else(|| anyhow::anyhow!("{task} was not promoted from a learner in the drain:\n{new}"))?;
        let lag: i64 = field(promoted, "lag").unwrap_or("-1").parse()?;
        assert!((0..=acceptable_lag).contains(&lag), "{task}: promoted at lag {lag}");
        let stopped = first(&old, &[" stopped ", &format!("{tag} ")])
            .ok_or_else(|| anyhow::anyhow!("{task} never stopped on the drained worker:\n{old}"))?;
        assert!(
            at(stopped) <= at(promoted),
            "{task} promoted before it stopped on the drained worker"
        );
        let restored = first(&new, &[" restored ", &format!("{tag} ")])
            .ok_or_else(|| anyhow::anyhow!("{task} never restored as active:\n{new}"))?;
        let from: i64 = field(restored, "from_offset").unwrap_or("0").parse()?;
        eprintln!("drain: {task} promoted at lag {lag}, restored on top of offset {from}");
        assert!(from > 0, "{task}: restored from offset 0 after the drain");
    }
    assert!(survivor[0].terminate(Duration::from_secs(60))?.success(), "{new}");

    // Each partition's store (on its final owner) equals the truth.
    let settled = [
        std::collections::BTreeSet::new(),
        all.into_iter().next().unwrap_or_default(),
    ];
    let mut truth: HashMap<i32, BTreeMap<String, u64>> = HashMap::new();
    for ((_, line), (partition, _)) in sent.iter().zip(&positions) {
        for word in std::str::from_utf8(line)?.split(' ') {
            *truth
                .entry(*partition)
                .or_default()
                .entry(word.to_string())
                .or_insert(0) += 1;
        }
    }
    for (n, tasks) in settled.iter().enumerate() {
        let state = dir.path().join(format!("state-{n}"));
        for task in tasks {
            let p: i32 = task.rsplit('/').next().unwrap().parse()?;
            let counts = dump_counts(&state, &name, p, "counts")?;
            assert_eq!(
                counts, truth[&p],
                "{task}: the store on its owner differs from the truth"
            );
        }
    }
    Ok(())
}

/// A draining worker whose tasks' learners cannot catch up in time (a large state to
/// restore) stops them and leaves after `--scale-down-timeout`; the other worker takes them.
#[tokio::test(flavor = "multi_thread")]
async fn scale_down_timeout_forces_a_draining_worker_out() -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("timeout-in"), unique_name("timeout-out"));
    kafka.create_topic(&input, 2).await?;
    kafka.create_topic(&output, 2).await?;
    let name = unique_name("wc");
    // A large state, written to the changelog before anything starts: 600,000 keys per task.
    fill_changelog(&name, 2, 1_200_000).await?;

    let dir = TempDir::new("scale-down-timeout");
    let m = dir.write(
        "wc.toml",
        &manifest(
            &name,
            &guest("word-count"),
            &[("lines", &input)],
            &[("counts", &output)],
            "",
        ),
    );
    let cluster = unique_name("c");
    let admin = [free_port(), free_port()];
    let start = |n: usize| {
        let metrics = format!("127.0.0.1:{}", admin[n]);
        cluster_worker(
            &dir,
            Some(&m),
            &cluster,
            n,
            // Short: the second worker restores 1.2-1.5M records/s here, so in 1 s the
            // learners sometimes caught up (600,000 records each) and nothing was forced.
            &[
                "--drain-on-stop",
                "--scale-down-timeout",
                "200ms",
                "--metrics",
                &metrics,
            ],
        )
    };
    let mut first = start(0)?;
    for p in 0..2 {
        first.wait_for_line(&[" started ", &format!("task={name}/{p}")], Duration::from_secs(120))?;
    }
    kafka.produce(&input, &lines(0..1_000)).await?;
    // A second worker joins and starts learning; the first is told to stop (it drains) while
    // the learners are far from done.
    let mut second = start(1)?;
    second.wait_for_line(&[" assignment ", "learner=1"], Duration::from_secs(60))?;
    // The learner's progress, live from the worker's status: lag falling, restored and
    // progress rising, a restore rate; its role in the metrics.
    let learner = |status: &serde_json::Value| {
        status["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["role"] == "learner" && t["restored"].as_u64().is_some_and(|r| r > 0))
            .cloned()
    };
    let mut seen: Vec<serde_json::Value> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < 2 {
        let status: serde_json::Value = serde_json::from_str(&http_get(admin[1], "/status")?)?;
        if let Some(l) = learner(&status) {
            if seen.last().is_none_or(|last| last["restored"] != l["restored"]) {
                seen.push(l);
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no learner progress seen: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (a, b) = (&seen[0], &seen[1]);
    eprintln!("learner progress: {a}\n  then {b}");
    assert_eq!(a["task"], b["task"]);
    assert!(b["restored"].as_u64() > a["restored"].as_u64(), "{a} then {b}");
    assert!(b["lag"].as_i64() < a["lag"].as_i64(), "{a} then {b}");
    let progress = |v: &serde_json::Value| v["progress"].as_f64().unwrap();
    assert!(
        progress(a) > 0.0 && progress(a) < progress(b) && progress(b) <= 1.0,
        "{a} then {b}"
    );
    assert!(b["restore_rate"].as_f64().is_some_and(|r| r > 0.0), "{b}");
    let metrics = http_get(admin[1], "/metrics")?;
    let role_line = format!(
        "sluice_task_role{{topology=\"{name}\",task={},role=\"learner\"}} 1",
        a["task"]
    );
    assert!(metrics.contains(&role_line), "no {role_line} in:\n{metrics}");
    let asked_at = std::time::Instant::now();
    let status = first.terminate(Duration::from_secs(60))?;
    let took = asked_at.elapsed();
    let log = first.log();
    assert!(status.success(), "the drained worker exited with {status}:\n{log}");
    assert!(
        log.contains("did not finish within the scale-down timeout"),
        "the worker left without the timeout forcing it:\n{log}"
    );
    eprintln!("the draining worker was forced out {took:?} after SIGTERM (timeout 200ms)");
    // The second worker owns both tasks and processes everything.
    let mut rest = vec![second];
    until_settled(&mut rest, 2).await?;
    // The moved task is active and processing on the second worker; the time it could not
    // process there (its restore) is counted; the rebalances are too.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let json = http_get(admin[1], "/status")?;
        let status: serde_json::Value = serde_json::from_str(&json)?;
        let tasks = status["tasks"].as_array().unwrap();
        let running = tasks
            .iter()
            .filter(|t| t["role"] == "active" && t["phase"] == "running")
            .count();
        if running == 2 {
            let moved = tasks.iter().find(|t| t["task"] == a["task"]).unwrap();
            assert!(moved["unavailable_seconds"].as_f64().unwrap() > 0.0, "{json}");
            assert!(status["rebalances"].as_u64().unwrap() >= 2, "{json}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not both running: {json}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = http_get(admin[1], "/metrics")?;
    for needle in [
        "sluice_rebalances_total ",
        "sluice_rebalance_seconds_bucket",
        "sluice_task_unavailable_seconds_total{",
        "sluice_task_lag_records{",
        "sluice_restored_records_total{",
    ] {
        assert!(metrics.contains(needle), "no {needle} in:\n{metrics}");
    }
    kafka.produce(&input, &lines(1_000..2_000)).await?;
    kafka
        .wait_committed(&format!("sluice-{name}"), &input, 2, 2_000, Duration::from_secs(120))
        .await?;
    assert!(rest[0].terminate(Duration::from_secs(60))?.success());
    Ok(())
}

/// Fills `{topology}-counts-changelog` (created here) with `keys` records spread over
/// `partitions`: state for word-count tasks to restore.
async fn fill_changelog(topology: &str, partitions: i32, keys: u64) -> anyhow::Result<()> {
    use rdkafka::producer::Producer as _;
    let kafka = kafka();
    let changelog = format!("{topology}-counts-changelog");
    kafka
        .create_topic_with(&changelog, partitions, 1, &[("cleanup.policy", "compact")])
        .await?;
    let producer: rdkafka::producer::ThreadedProducer<rdkafka::producer::DefaultProducerContext> = kafka
        .config()
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    for i in 0..keys {
        let key = format!("old{i}");
        let value = 1u64.to_be_bytes();
        loop {
            let record = rdkafka::producer::BaseRecord::to(&changelog)
                .partition((i % partitions as u64) as i32)
                .key(&key)
                .payload(&value[..]);
            match producer.send(record) {
                Ok(()) => break,
                Err((e, _)) if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => anyhow::bail!("filling the changelog: {e}"),
            }
        }
    }
    producer.flush(Duration::from_secs(120))?;
    Ok(())
}

/// The leader is killed while a joining worker's learners restore: the next leader carries
/// the migration on from what the members report. Learners are not restarted, every task
/// ends active exactly once, and no input is lost.
#[tokio::test(flavor = "multi_thread")]
async fn the_leader_killed_in_a_migration_and_the_migration_completes() -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("failover-in"), unique_name("failover-out"));
    kafka.create_topic(&input, 4).await?;
    kafka.create_topic(&output, 4).await?;
    let name = unique_name("wc");
    fill_changelog(&name, 4, 1_200_000).await?;
    let dir = TempDir::new("leader-failover");
    let m = dir.write(
        "wc.toml",
        &manifest(
            &name,
            &guest("word-count"),
            &[("lines", &input)],
            &[("counts", &output)],
            "",
        ),
    );
    let cluster = unique_name("c");
    let start = |n: usize| cluster_worker(&dir, Some(&m), &cluster, n, &[]);
    let mut workers = vec![start(0)?, start(1)?];
    until_settled(&mut workers, 2).await?;
    for p in 0..4 {
        let tag = format!("task={name}/{p}");
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while !workers
            .iter()
            .any(|w| w.log().lines().any(|l| l.contains(" started ") && l.ends_with(&tag)))
        {
            anyhow::ensure!(std::time::Instant::now() < deadline, "{tag} never started");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let producing = {
        let input = input.clone();
        tokio::spawn(async move {
            for chunk in 0..60 {
                kafka.produce(&input, &lines(chunk * 100..(chunk + 1) * 100)).await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(())
        })
    };
    // A third worker joins and starts learning; the leader dies at once.
    workers.push(start(2)?);
    let learning = workers[2].wait_for_line(&[" assignment ", "learner=", "learners=wc"], Duration::from_secs(60))?;
    let learned: Vec<String> = field(&learning, "learners")
        .unwrap_or_default()
        .split(',')
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect();
    let leader = (0..2)
        .find(|&i| {
            workers[i]
                .log()
                .lines()
                .rfind(|l| l.contains(" assignment "))
                .is_some_and(|l| l.contains("leader=true"))
        })
        .ok_or_else(|| anyhow::anyhow!("neither old worker says it leads"))?;
    workers[leader].kill()?;
    eprintln!("killed the leader (worker {leader}) while worker 2 learned {learned:?}");
    let mut alive: Vec<WorkerProcess> = workers
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != leader)
        .map(|(_, w)| w)
        .collect();
    until_settled(&mut alive, 2).await?;
    producing.await??;
    kafka
        .wait_committed(&format!("sluice-{name}"), &input, 4, 6_000, Duration::from_secs(120))
        .await?;
    // Learners that had started were carried on, not started over.
    let newcomer = alive[1].log();
    for task in &learned {
        let starts = newcomer
            .lines()
            .filter(|l| l.contains("standby started") && l.contains(&format!("task={task} ")))
            .count();
        assert!(starts <= 1, "{task}: its learner started {starts} times:\n{newcomer}");
    }
    for w in &mut alive {
        assert!(w.terminate(Duration::from_secs(60))?.success(), "{}", w.log());
    }
    Ok(())
}

/// Records restored as active by task `task` on the worker whose admin endpoint is `admin`
/// (all its stores), from its metrics.
fn restored_as_active(admin: u16, task: &str) -> anyhow::Result<u64> {
    let metrics = http_get(admin, "/metrics")?;
    let needle = format!("task=\"{task}\"");
    Ok(metrics
        .lines()
        .filter(|l| l.starts_with("sluice_restored_records_total{") && l.contains(&needle))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// The end offset of a changelog partition.
fn changelog_end(topic: &str, partition: i32) -> anyhow::Result<i64> {
    use rdkafka::consumer::Consumer as _;
    let consumer: rdkafka::consumer::BaseConsumer = kafka().config().create()?;
    Ok(consumer.fetch_watermarks(topic, partition, Duration::from_secs(10))?.1)
}

/// A plain SIGTERM (what Kubernetes sends on a scale-down) drains a cluster worker by
/// default: its stateful task moves only once a learner on the other worker caught up, so
/// the task replays nothing — its learner reads the thousands of changelog records its old
/// copy there is behind, and the tail, before it hands the store over — and the state equals
/// the truth.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_drains_a_cluster_worker_through_learners_by_default() -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("term-in"), unique_name("term-out"));
    kafka.create_topic(&input, 2).await?;
    kafka.create_topic(&output, 2).await?;
    let dir = TempDir::new("sigterm-drain");
    let name = unique_name("wc");
    let m = dir.write(
        "wc.toml",
        &manifest(
            &name,
            &guest("word-count"),
            &[("lines", &input)],
            &[("counts", &output)],
            "",
        ),
    );
    let cluster = unique_name("c");
    let admin = [free_port(), free_port()];
    let acceptable_lag = 100;
    let lag = acceptable_lag.to_string();
    let start = |n: usize| {
        let metrics = format!("127.0.0.1:{}", admin[n]);
        // No stop flag: the default.
        draining_cluster_worker(
            &dir,
            Some(&m),
            &cluster,
            n,
            &["--acceptable-recovery-lag", &lag, "--metrics", &metrics],
        )
    };
    let group = format!("sluice-{name}");
    let mut sent = lines(0..4_000);
    let mut positions = kafka.produce(&input, &sent).await?;
    let mut workers = vec![start(0)?];
    until_settled(&mut workers, 2).await?;
    kafka
        .wait_committed(&group, &input, 2, 4_000, Duration::from_secs(120))
        .await?;
    workers.push(start(1)?);
    let settled = until_settled(&mut workers, 1).await?;
    let moved = settled[1].iter().next().unwrap().clone();
    let p: i32 = moved.rsplit('/').next().unwrap().parse()?;
    let changelog = format!("{name}-counts-changelog");
    // The first worker's copy of the moved task's state falls behind while the task runs on
    // the second worker.
    let end_at_move = changelog_end(&changelog, p)?;
    let more = lines(4_000..12_000);
    positions.extend(kafka.produce(&input, &more).await?);
    sent.extend(more);
    kafka
        .wait_committed(&group, &input, 2, 12_000, Duration::from_secs(120))
        .await?;
    let behind = changelog_end(&changelog, p)? - end_at_move;
    assert!(
        behind > 10 * acceptable_lag,
        "{moved}'s changelog grew by only {behind} records while it ran on the second worker"
    );
    let before = restored_as_active(admin[0], &moved)?;

    // SIGTERM: the second worker drains (exit 0, owning nothing), through a learner.
    let status = workers[1].terminate(Duration::from_secs(60))?;
    let log = workers[1].log();
    assert!(status.success(), "the worker exited with {status}:\n{log}");
    let mut survivor: Vec<WorkerProcess> = workers.drain(..1).collect();
    until_settled(&mut survivor, 2).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let status: serde_json::Value = serde_json::from_str(&http_get(admin[0], "/status")?)?;
        let running = status["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["task"] == moved.as_str() && t["role"] == "active" && t["phase"] == "running");
        if running {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{moved} not running: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let replayed = restored_as_active(admin[0], &moved)? - before;
    eprintln!("{moved}: its old copy was {behind} changelog records behind; it replayed {replayed} as active");
    // Its learner read the tail too (what the old owner wrote until its last commit) before
    // it handed the store over: the task replayed nothing as active.
    assert_eq!(
        replayed, 0,
        "{moved} replayed {replayed} records as active after the drain (its learner, {behind} records behind \
         when it started, should have read all of them before handing the store over)"
    );
    let last = lines(12_000..13_000);
    positions.extend(kafka.produce(&input, &last).await?);
    sent.extend(last);
    kafka
        .wait_committed(&group, &input, 2, 13_000, Duration::from_secs(120))
        .await?;
    // The drain's handover is in the status (it ends with the task's first output): its
    // phases on the new owner, and in the metrics.
    let status: serde_json::Value = serde_json::from_str(&http_get(admin[0], "/status")?)?;
    let handover = status["handovers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["task"] == moved.as_str() && h["direction"] == "in")
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no handover of {moved} in {status}"))?;
    for phase in [
        "rebalance_seconds",
        "start_seconds",
        "first_output_seconds",
        "total_seconds",
    ] {
        assert!(
            handover[phase].as_f64().is_some_and(|s| s >= 0.0),
            "{phase}: {handover}"
        );
    }
    let metrics = http_get(admin[0], "/metrics")?;
    assert!(
        metrics.contains("sluice_handover_seconds_count{phase=\"total\"}"),
        "{metrics}"
    );

    assert!(survivor[0].terminate(Duration::from_secs(60))?.success());
    let mut truth: HashMap<i32, BTreeMap<String, u64>> = HashMap::new();
    for ((_, line), (partition, _)) in sent.iter().zip(&positions) {
        for word in std::str::from_utf8(line)?.split(' ') {
            *truth
                .entry(*partition)
                .or_default()
                .entry(word.to_string())
                .or_insert(0) += 1;
        }
    }
    let state = dir.path().join("state-0");
    for p in 0..2 {
        assert_eq!(dump_counts(&state, &name, p, "counts")?, truth[&p], "{name}/{p}");
    }
    Ok(())
}

/// A second SIGTERM stops a draining worker at once: it does not wait for the learners
/// (which have much to restore), and the other worker takes the tasks over and goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_sigterm_stops_a_draining_worker_at_once() -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("term2-in"), unique_name("term2-out"));
    kafka.create_topic(&input, 2).await?;
    kafka.create_topic(&output, 2).await?;
    let name = unique_name("wc");
    // 200,000 keys per task: a learner needs seconds to read them.
    fill_changelog(&name, 2, 400_000).await?;
    let dir = TempDir::new("second-sigterm");
    let m = dir.write(
        "wc.toml",
        &manifest(
            &name,
            &guest("word-count"),
            &[("lines", &input)],
            &[("counts", &output)],
            "",
        ),
    );
    let cluster = unique_name("c");
    let admin = free_port();
    let metrics = format!("127.0.0.1:{admin}");
    // Nothing but the second signal may cut the drain short.
    let mut first = draining_cluster_worker(&dir, Some(&m), &cluster, 0, &["--scale-down-timeout", "10m"])?;
    for p in 0..2 {
        first.wait_for_line(&[" started ", &format!("task={name}/{p}")], Duration::from_secs(120))?;
    }
    kafka.produce(&input, &lines(0..1_000)).await?;
    let group = format!("sluice-{name}");
    kafka
        .wait_committed(&group, &input, 2, 1_000, Duration::from_secs(120))
        .await?;
    let mut second = draining_cluster_worker(&dir, Some(&m), &cluster, 1, &["--metrics", &metrics])?;
    second.wait_for_line(&[" assignment ", "learner=1"], Duration::from_secs(60))?;
    let pid = first.pid().unwrap().to_string();
    let term = || std::process::Command::new("kill").args(["-TERM", &pid]).status();
    assert!(term()?.success());
    first.wait_for_line(&["draining: asking the group"], Duration::from_secs(10))?;
    let asked = std::time::Instant::now();
    assert!(term()?.success());
    let status = first.wait(Duration::from_secs(30))?;
    let took = asked.elapsed();
    let log = first.log();
    assert!(status.success(), "exited with {status}:\n{log}");
    assert!(
        !log.contains("drained: every task runs elsewhere"),
        "it drained instead:\n{log}"
    );
    eprintln!("a draining worker stopped {took:?} after the second SIGTERM");
    // The second worker took both tasks before its learners were done: together they
    // replayed much of their state as active tasks.
    let mut rest = vec![second];
    until_settled(&mut rest, 2).await?;
    kafka.produce(&input, &lines(1_000..2_000)).await?;
    kafka
        .wait_committed(&group, &input, 2, 2_000, Duration::from_secs(120))
        .await?;
    let replayed = restored_as_active(admin, &format!("{name}/0"))? + restored_as_active(admin, &format!("{name}/1"))?;
    eprintln!("the tasks replayed {replayed} records as active on the second worker");
    assert!(
        replayed > 10_000,
        "the tasks replayed only {replayed} records as active: the drain was not cut short"
    );
    assert!(rest[0].terminate(Duration::from_secs(60))?.success());
    Ok(())
}

/// `--standby-restore-rate` bounds how fast a learner reads its changelog: over three
/// seconds its restored count grows by no more than the rate allows (with room for the
/// status' own delay and one round), while the same learner unbounded reads its 150,000
/// records in a fraction of a second here; and it does make progress.
#[tokio::test(flavor = "multi_thread")]
async fn a_restore_rate_bounds_how_fast_a_learner_reads() -> anyhow::Result<()> {
    const RATE: f64 = 20_000.0;
    let kafka = kafka();
    let (input, output) = (unique_name("rate-in"), unique_name("rate-out"));
    kafka.create_topic(&input, 2).await?;
    kafka.create_topic(&output, 2).await?;
    let name = unique_name("wc");
    fill_changelog(&name, 2, 300_000).await?;
    let dir = TempDir::new("restore-rate");
    let m = dir.write(
        "wc.toml",
        &manifest(
            &name,
            &guest("word-count"),
            &[("lines", &input)],
            &[("counts", &output)],
            "",
        ),
    );
    let cluster = unique_name("c");
    let mut first = cluster_worker(&dir, Some(&m), &cluster, 0, &[])?;
    for p in 0..2 {
        first.wait_for_line(&[" started ", &format!("task={name}/{p}")], Duration::from_secs(120))?;
    }
    let admin = free_port();
    let metrics = format!("127.0.0.1:{admin}");
    let rate = (RATE as u64).to_string();
    let mut second = cluster_worker(
        &dir,
        Some(&m),
        &cluster,
        1,
        &["--standby-restore-rate", &rate, "--metrics", &metrics],
    )?;
    second.wait_for_line(&[" assignment ", "learner=1"], Duration::from_secs(60))?;
    // What the worker's learners have restored, from its status.
    let restored = || -> anyhow::Result<u64> {
        let status: serde_json::Value = serde_json::from_str(&http_get(admin, "/status")?)?;
        Ok(status["tasks"]
            .as_array()
            .map(|tasks| {
                tasks
                    .iter()
                    .filter(|t| t["role"] == "learner")
                    .filter_map(|t| t["restored"].as_u64())
                    .sum()
            })
            .unwrap_or(0))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (t0, r0) = loop {
        let r = restored()?;
        if r > 0 {
            break (std::time::Instant::now(), r);
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "the learner restored nothing:\n{}",
            second.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (t1, r1) = (std::time::Instant::now(), restored()?);
    let seconds = (t1 - t0).as_secs_f64();
    // The status is up to a learner check (200 ms) behind at each end; a round reads a
    // twentieth of a second's worth before it waits.
    let bound = RATE * (seconds + 0.5) + RATE / 20.0;
    // A learner no longer listed caught up and was promoted: its 150,000 records took less
    // than 7.5 s, faster than the rate allows.
    let Some(read) = r1.checked_sub(r0) else {
        panic!("the learner was done within {seconds:.2} s of its first {r0} records: faster than {RATE}/s")
    };
    eprintln!("learner: {read} records in {seconds:.2} s at a rate of {RATE} records/s (bound {bound:.0})");
    assert!(
        read > 0,
        "the learner made no progress in {seconds:.2} s ({r0} restored)"
    );
    assert!(
        read as f64 <= bound,
        "the learner read {read} records in {seconds:.2} s, over the rate of {RATE}/s (bound {bound:.0})"
    );
    for w in [&mut second, &mut first] {
        assert!(w.terminate(Duration::from_secs(60))?.success(), "{}", w.log());
    }
    Ok(())
}
