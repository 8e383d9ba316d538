//! Learner tasks: a worker that joins restores the state of the tasks it will take over
//! while their owner keeps processing them, and takes each over once caught up.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sluice_tests::worker::{dump_counts, guest, manifest, TempDir, WorkerProcess};
use sluice_tests::{kafka, unique_name};

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
        .filter(|l| !l.contains("sluice::worker::standby") || needles.iter().any(|n| n.contains("standby")))
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
    let start = |n: usize| {
        let state = dir.path().join(format!("state-{n}"));
        WorkerProcess::start(
            kafka.bootstrap(),
            dir.path(),
            &[
                "--topology",
                m.to_str().unwrap(),
                "--cluster",
                &cluster,
                "--state-dir",
                state.to_str().unwrap(),
                "--heartbeat-interval",
                "200ms",
                "--session-timeout",
                "6s",
                "--commit-interval",
                "200ms",
                "--acceptable-recovery-lag",
                &acceptable_lag.to_string(),
            ],
        )
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
        // A learner that asked for its task got it at once, not at a later periodic check
        // (the issue asks for one second; the bound leaves room for a loaded CI machine).
        if let Some(caught_up) = first(&new, &["learner caught up", &tag]) {
            let delay = at(promoted).unwrap_or(f64::NAN) - at(caught_up).unwrap_or(f64::NAN);
            eprintln!("{task}: promoted {delay:.3}s after its learner caught up");
            assert!(delay < 3.0, "{task}: promoted {delay:.3}s after its learner caught up");
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

    // Stop both, then each partition's store (on its final owner) equals the truth.
    for w in &mut workers {
        assert!(w.terminate(Duration::from_secs(60))?.success(), "{}", w.log());
    }
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
