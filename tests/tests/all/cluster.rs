//! Several `sluice worker` processes in one cluster: sharing tasks, a worker joining, a
//! worker killed.

use std::collections::BTreeSet;
use std::time::Duration;

use sluice_tests::worker::{guest, manifest, sluice_binary, TempDir, WorkerProcess};
use sluice_tests::{kafka, unique_name};

/// The tasks of the last settled assignment (`rejoin=false`) in a worker's log.
pub(crate) fn settled_tasks(log: &str) -> Option<BTreeSet<String>> {
    let line = log
        .lines()
        .rfind(|l| l.contains(" assignment ") && l.contains("rejoin=false"))?;
    let tasks = line.split("tasks=").nth(1)?.split(' ').next()?;
    Some(tasks.split(',').filter(|t| !t.is_empty()).map(str::to_string).collect())
}

pub(crate) async fn until_settled(
    workers: &mut [WorkerProcess],
    per_worker: usize,
) -> anyhow::Result<Vec<BTreeSet<String>>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let sets: Vec<Option<BTreeSet<String>>> = workers.iter().map(|w| settled_tasks(&w.log())).collect();
        if sets.iter().all(|s| s.as_ref().is_some_and(|s| s.len() == per_worker)) {
            let sets: Vec<BTreeSet<String>> = sets.iter().cloned().map(Option::unwrap).collect();
            let union: BTreeSet<&String> = sets.iter().flatten().collect();
            if union.len() == per_worker * workers.len() {
                return Ok(sets);
            }
        }
        if tokio::time::Instant::now() > deadline {
            let logs: Vec<String> = workers.iter().map(|w| w.log()).collect();
            anyhow::bail!(
                "the cluster did not settle on {per_worker} tasks per worker: {sets:?}\n{}",
                logs.join("\n-----\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn lines(range: std::ops::Range<usize>) -> Vec<(Vec<u8>, Vec<u8>)> {
    range
        .map(|i| {
            (
                format!("line-{i}").into_bytes(),
                format!("alpha beta w{}", i % 97).into_bytes(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_share_tasks_a_joiner_takes_only_moved_ones_and_a_killed_workers_tasks_move() -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("cluster-in"), unique_name("cluster-out"));
    kafka.create_topic(&input, 12).await?;
    kafka.create_topic(&output, 12).await?;
    let dir = TempDir::new("cluster");
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
                "--no-drain-on-stop",
                "--state-dir",
                state.to_str().unwrap(),
                "--heartbeat-interval",
                "200ms",
                "--session-timeout",
                "6s",
                "--commit-interval",
                "200ms",
            ],
        )
    };

    // Input arrives throughout: 60 chunks of 500 lines, 100 ms apart.
    let total = 30_000;
    let producing = {
        let input = input.clone();
        tokio::spawn(async move {
            for chunk in 0..60 {
                kafka.produce(&input, &lines(chunk * 500..(chunk + 1) * 500)).await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(())
        })
    };

    let mut workers = vec![start(0)?, start(1)?, start(2)?];
    let three = until_settled(&mut workers, 4).await?;

    // A fourth worker joins: each of the three gives up exactly one task, and keeps (never
    // stops) the other three.
    workers.push(start(3)?);
    let four = until_settled(&mut workers, 3).await?;
    for (before, after) in three.iter().zip(&four) {
        assert!(
            after.is_subset(before),
            "a worker gained a task from another old worker: {before:?} -> {after:?}"
        );
    }
    let moved: BTreeSet<String> = three
        .iter()
        .zip(&four)
        .flat_map(|(b, a)| b.difference(a).cloned())
        .collect();
    assert_eq!(moved, four[3], "the newcomer got exactly the revoked tasks");
    // A task logs "started" once it has restored its state and initialised, which under load
    // can come after the assignment settled: wait for it, then expect exactly one start and
    // no stop.
    // (A learner's lines — "standby started/stopped" — are not the task's.)
    let count = |log: &str, task: &str| {
        let stops = log
            .lines()
            .filter(|l| l.contains(" stopped ") && !l.contains("standby") && l.contains(&format!("task={task} ")))
            .count();
        let starts = log
            .lines()
            .filter(|l| l.contains(" started ") && l.ends_with(&format!("task={task}")))
            .count();
        (starts, stops)
    };
    for (worker, kept) in workers.iter().zip(&four).take(3) {
        for task in kept {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while count(&worker.log(), task).0 == 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert_eq!(
                count(&worker.log(), task),
                (1, 0),
                "{task} kept running through the rebalance; the worker's log:\n{}",
                worker.log()
            );
        }
    }

    // A worker is killed: after the session timeout its tasks move to the other three.
    workers[0].kill()?;
    let mut alive: Vec<WorkerProcess> = workers.drain(1..).collect();
    until_settled(&mut alive, 4).await?;
    producing.await??;

    // No input record is lost: everything is processed and committed.
    kafka
        .wait_committed(
            &format!("sluice-{name}"),
            &input,
            12,
            total as i64,
            Duration::from_secs(120),
        )
        .await?;
    for worker in &mut alive {
        assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    }
    Ok(())
}

/// `(from_offset, records)` of the last "restored" line of `task` in a worker's log.
fn last_restore(log: &str, task: &str) -> Option<(i64, u64)> {
    let line = log
        .lines()
        .rfind(|l| l.contains(" restored ") && l.contains(&format!("task={task} ")))?;
    let field = |key: &str| {
        line.split(&format!(" {key}="))
            .nth(1)?
            .split(' ')
            .next()
            .map(str::to_string)
    };
    Some((field("from_offset")?.parse().ok()?, field("records")?.parse().ok()?))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_standby_takes_over_without_a_full_restore() -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("standby-in"), unique_name("standby-out"));
    kafka.create_topic(&input, 4).await?;
    kafka.create_topic(&output, 4).await?;
    let dir = TempDir::new("standby");
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
                "--no-drain-on-stop",
                "--state-dir",
                state.to_str().unwrap(),
                "--heartbeat-interval",
                "200ms",
                "--session-timeout",
                "6s",
                "--commit-interval",
                "200ms",
                "--standby-replicas",
                "1",
                // Admin endpoints on free ports: `sluice status` asks them for live status.
                "--metrics",
                "127.0.0.1:0",
            ],
        )
    };
    let mut workers = vec![start(0)?, start(1)?];
    until_settled(&mut workers, 2).await?;
    let total = 20_000;
    kafka.produce(&input, &lines(0..total)).await?;
    kafka
        .wait_committed(
            &format!("sluice-{name}"),
            &input,
            4,
            total as i64,
            Duration::from_secs(120),
        )
        .await?;
    // `sluice status` shows both workers, every task active once and once standby elsewhere.
    let json = status(&cluster, "json")?;
    let status_json: serde_json::Value = serde_json::from_str(&json)?;
    assert_eq!(status_json["workers"].as_array().unwrap().len(), 2, "{json}");
    // Both workers may have joined in the first generation or in a later one.
    assert!(status_json["generation"].as_i64().is_some_and(|g| g >= 1), "{json}");
    let tasks = status_json["tasks"].as_array().unwrap();
    for p in 0..4 {
        let task = format!("{name}/{p}");
        let owners = |role: &str| -> Vec<String> {
            tasks
                .iter()
                .filter(|t| t["task"] == task.as_str() && t["role"] == role)
                .map(|t| t["owner"].as_str().unwrap().to_string())
                .collect()
        };
        let (active, standby) = (owners("active"), owners("standby"));
        assert_eq!((active.len(), standby.len()), (1, 1), "{task}: {json}");
        assert_ne!(active, standby, "{task}: standby on the active's worker");
    }
    // Live from each worker's admin endpoint: every task's lag (standbys' lag is read once a
    // second, so it may take a moment to appear), phases, progress, rebalances.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let (json, status_json) = loop {
        let json = status(&cluster, "json")?;
        let v: serde_json::Value = serde_json::from_str(&json)?;
        if v["tasks"].as_array().unwrap().iter().all(|t| t["lag"].is_i64()) {
            break (json, v);
        }
        if std::time::Instant::now() >= deadline {
            for (n, w) in workers.iter().enumerate() {
                eprintln!("--- worker {n}:\n{}", w.log());
            }
            panic!("a task without a changelog lag: {json}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    for w in status_json["workers"].as_array().unwrap() {
        assert_eq!(w["live"], true, "worker not asked through its admin endpoint: {json}");
        assert!(w["admin"].as_str().unwrap().starts_with("127.0.0.1:"), "{json}");
        assert!(w["rebalances"].as_u64().is_some_and(|r| r >= 1), "{json}");
        assert!(w["last_rebalance_seconds"].as_f64().is_some(), "{json}");
    }
    for t in status_json["tasks"].as_array().unwrap() {
        match t["role"].as_str().unwrap() {
            "active" => {
                assert_eq!((&t["phase"], &t["lag"]), (&"running".into(), &0.into()), "{json}");
                assert!(t["unavailable_seconds"].as_f64().is_some_and(|u| u > 0.0), "{json}");
            }
            "standby" => {
                assert!(
                    t["progress"].as_f64().is_some_and(|p| (0.0..=1.0).contains(&p)),
                    "{json}"
                );
                assert!(t["lag"].as_i64().is_some_and(|l| l >= 0), "{json}");
            }
            role => panic!("unexpected role {role}: {json}"),
        }
    }
    let text = status(&cluster, "text")?;
    eprintln!("{text}");
    for line in text.lines().filter(|l| l.contains(" standby ") && l.starts_with(&name)) {
        assert!(
            line.contains("] ") && line.contains("%"),
            "no progress bar: {line}\n{text}"
        );
    }
    assert!(
        text.starts_with(&format!(
            "cluster {cluster} (group sluice.cluster.{cluster}): Stable, generation "
        )),
        "{text}"
    );
    assert!(text.contains("TASK") && text.contains(&format!("{name}/3")), "{text}");

    // Worker 1 dies; worker 0 held its tasks as standbys and takes them over. Which tasks
    // worker 1 holds is read again now: the placement may have moved one since the start
    // (once standbys are warm), and a task already on worker 0 is not promoted.
    let settled = until_settled(&mut workers, 2).await?;
    let restores = |log: &str, task: &str| {
        log.lines()
            .filter(|l| l.contains(" restored ") && l.contains(&format!("task={task} ")))
            .count()
    };
    let before: Vec<usize> = settled[1].iter().map(|t| restores(&workers[0].log(), t)).collect();
    workers[1].kill()?;
    let mut survivor: Vec<WorkerProcess> = workers.drain(..1).collect();
    until_settled(&mut survivor, 4).await?;
    for (task, before) in settled[1].iter().zip(before) {
        // The promoted task restores as it starts, just after the assignment is logged.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while restores(&survivor[0].log(), task) <= before {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "{task} was not restored on promotion"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let log = survivor[0].log();
        let (from, records) =
            last_restore(&log, task).ok_or_else(|| anyhow::anyhow!("no restore of {task}:\n{log}"))?;
        eprintln!("promoted {task}: restored {records} records on top of a standby at offset {from}");
        assert!(from > 0, "{task} restored from offset 0: a full restore");
        assert!(
            records * 10 <= from as u64,
            "{task} replayed {records} records on top of {from}: not warm"
        );
    }
    assert!(survivor[0].terminate(Duration::from_secs(60))?.success());
    Ok(())
}

fn status(cluster: &str, output: &str) -> anyhow::Result<String> {
    let out = std::process::Command::new(sluice_binary())
        .args([
            "status",
            "--bootstrap",
            kafka().bootstrap(),
            "--cluster",
            cluster,
            "--output",
            output,
        ])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "sluice status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_of_an_older_and_a_newer_metadata_version_share_a_cluster() -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("versions-in"), unique_name("versions-out"));
    kafka.create_topic(&input, 4).await?;
    kafka.create_topic(&output, 4).await?;
    let dir = TempDir::new("versions");
    let name = unique_name("shout");
    let m = dir.write(
        "m.toml",
        &manifest(
            &name,
            &guest("uppercase"),
            &[("input", &input)],
            &[("output", &output)],
            "",
        ),
    );
    let cluster = unique_name("c");
    let start = |n: usize, version: &str| {
        let state = dir.path().join(format!("state-{n}"));
        WorkerProcess::start(
            kafka.bootstrap(),
            dir.path(),
            &[
                "--topology",
                m.to_str().unwrap(),
                "--cluster",
                &cluster,
                "--no-drain-on-stop",
                "--state-dir",
                state.to_str().unwrap(),
                "--heartbeat-interval",
                "200ms",
                "--metadata-version",
                version,
            ],
        )
    };
    // The newest version (topologies advertised) beside the oldest (they are assumed).
    let mut workers = vec![start(0, "3")?, start(1, "1")?];
    until_settled(&mut workers, 2).await?;
    let json: serde_json::Value = serde_json::from_str(&status(&cluster, "json")?)?;
    // Each says the newest it speaks; the group speaks the oldest (the newer worker joins
    // in it from the first assignment it gets on).
    let mut versions: Vec<(i64, i64)> = json["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["supported"].as_i64().unwrap(), w["version"].as_i64().unwrap()))
        .collect();
    versions.sort();
    assert_eq!(versions.iter().map(|v| v.0).collect::<Vec<_>>(), vec![1, 3]);
    assert!(
        versions.iter().all(|(supported, spoken)| spoken <= supported),
        "{versions:?}"
    );
    // Records flow through both.
    let sent: Vec<(Vec<u8>, Vec<u8>)> = (0..400)
        .map(|i| (format!("k{i}").into_bytes(), format!("v{i}").into_bytes()))
        .collect();
    kafka.produce(&input, &sent).await?;
    let received = kafka.consume(&output, 400, Duration::from_secs(60)).await?;
    let values: BTreeSet<Vec<u8>> = received.into_iter().map(|r| r.value.unwrap()).collect();
    assert_eq!(values, sent.iter().map(|(_, v)| v.to_ascii_uppercase()).collect());
    for w in &mut workers {
        assert!(w.terminate(Duration::from_secs(60))?.success());
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_topology_runs_only_on_workers_that_have_it_through_a_rolling_deploy() -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("deploy");
    let mut topics = Vec::new();
    let mut manifests = Vec::new();
    for t in ["old", "new"] {
        let (input, output) = (unique_name(&format!("{t}-in")), unique_name(&format!("{t}-out")));
        kafka.create_topic(&input, 4).await?;
        kafka.create_topic(&output, 4).await?;
        let name = unique_name(t);
        let m = dir.write(
            &format!("{t}.toml"),
            &manifest(
                &name,
                &guest("uppercase"),
                &[("input", &input)],
                &[("output", &output)],
                "",
            ),
        );
        topics.push((name, input, output));
        manifests.push(m);
    }
    let cluster = unique_name("c");
    let start = |n: &str, with_new: bool| {
        let state = dir.path().join(format!("state-{n}"));
        let mut args = vec!["--topology", manifests[0].to_str().unwrap()];
        if with_new {
            args.extend(["--topology", manifests[1].to_str().unwrap()]);
        }
        args.extend([
            "--cluster",
            &cluster,
            "--no-drain-on-stop",
            "--state-dir",
            state.to_str().unwrap(),
            "--heartbeat-interval",
            "200ms",
        ]);
        WorkerProcess::start(kafka.bootstrap(), dir.path(), &args)
    };
    // Mid-deploy: a has the new topology, b does not yet.
    let mut workers = vec![start("a", true)?, start("b", false)?];
    let new_name = &topics[1].0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    let (a_tasks, b_tasks) = loop {
        let (a, b) = (settled_tasks(&workers[0].log()), settled_tasks(&workers[1].log()));
        if let (Some(a), Some(b)) = (a, b) {
            if a.len() + b.len() == 8 {
                break (a, b);
            }
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the cluster did not settle on 8 tasks"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        b_tasks.iter().all(|t| !t.starts_with(&format!("{new_name}/"))),
        "b runs a task of a topology it does not have: {b_tasks:?}"
    );
    assert_eq!(
        a_tasks
            .iter()
            .filter(|t| t.starts_with(&format!("{new_name}/")))
            .count(),
        4,
        "every task of the new topology is on a: {a_tasks:?}"
    );
    let sent: Vec<(Vec<u8>, Vec<u8>)> = (0..200)
        .map(|i| (format!("k{i}").into_bytes(), format!("v{i}").into_bytes()))
        .collect();
    kafka.produce(&topics[1].1, &sent).await?;
    kafka.produce(&topics[0].1, &sent).await?;
    // b gets the new topology too (restarted with it): records keep flowing, none dropped.
    assert!(workers[1].terminate(Duration::from_secs(60))?.success());
    workers[1] = start("b", true)?;
    kafka.produce(&topics[1].1, &sent).await?;
    for (_, _, output) in &topics {
        // Every record of every send comes out: each value once per send (the new
        // topology's input got two). At-least-once may add copies (a record processed
        // again after a hand-over); they are counted, not failed.
        let sends = if output == &topics[1].2 { 2 } else { 1 };
        let expected: BTreeSet<Vec<u8>> = sent.iter().map(|(_, v)| v.to_ascii_uppercase()).collect();
        let complete = |received: &[sluice_tests::Received]| {
            let mut per_value: std::collections::HashMap<&[u8], usize> = std::collections::HashMap::new();
            for r in received {
                *per_value.entry(r.value.as_deref().unwrap_or_default()).or_default() += 1;
            }
            expected
                .iter()
                .all(|v| per_value.get(v.as_slice()).is_some_and(|&n| n >= sends))
        };
        let received = match kafka.consume_until(output, Duration::from_secs(90), complete).await {
            Ok(received) => received,
            Err(e) => panic!(
                "{e:#}\n--- worker a:\n{}\n--- worker b:\n{}",
                workers[0].log(),
                workers[1].log()
            ),
        };
        let values: BTreeSet<Vec<u8>> = received.iter().map(|r| r.value.clone().unwrap()).collect();
        assert_eq!(values, expected, "only what was sent comes out");
        eprintln!(
            "rolling deploy: {output}: {} records for {} sent ({} copies from replays)",
            received.len(),
            sends * sent.len(),
            received.len() - sends * sent.len()
        );
    }
    until_settled(&mut workers, 4).await?;
    for w in &mut workers {
        assert!(w.terminate(Duration::from_secs(60))?.success(), "{}", w.log());
    }
    Ok(())
}
