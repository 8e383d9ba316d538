//! Broker trouble is weather: a broker started a moment ago, and a rolling restart of a
//! three-broker cluster under load, also while tasks restore. Each test runs its own
//! cluster (`dev/kafka` with a private state directory).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sluice_tests::cluster::PrivateCluster;
use sluice_tests::unique_name;
use sluice_tests::worker::{guest, manifest, TempDir, WorkerProcess};

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_started_with_a_broker_that_just_started_reads_what_is_waiting() -> anyhow::Result<()> {
    // The group coordinator of a new broker creates and loads `__consumer_offsets` when the
    // first group asks for it, answering "not coordinator" or "loading" meanwhile. Tasks that
    // look up their committed offsets in that window must retry, not sit idle: several
    // topologies (so several groups) start at once, as the first group lookups make the
    // broker create the offsets topic. (On a busy machine the window is wide and the
    // lookups fail for seconds; on an idle one it may be missed, and the test passes either
    // way when the product is right.)
    let cluster = tokio::task::spawn_blocking(|| PrivateCluster::start(1)).await??;
    let kafka = &cluster.kafka;
    let dir = TempDir::new("first-run");
    let (topologies, partitions) = (3, 4);
    let mut args = Vec::new();
    let mut outputs = Vec::new();
    let mut expected = Vec::new();
    let mut inputs = Vec::new();
    for t in 0..topologies {
        let (input, output) = (unique_name("first-in"), unique_name("first-out"));
        kafka.create_topic(&input, partitions).await?;
        kafka.create_topic(&output, partitions).await?;
        let m = dir.write(
            &format!("up-{t}.toml"),
            &manifest(
                &unique_name("first"),
                &guest("uppercase"),
                &[("input", &input)],
                &[("output", &output)],
                "",
            ),
        );
        args.push("--topology".to_string());
        args.push(m.to_str().unwrap().to_string());
        outputs.push(output);
        inputs.push(input);
    }
    let state = dir.path().join("state");
    args.extend(["--state-dir".to_string(), state.to_str().unwrap().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // As in dev/demo: the worker starts, then the input arrives.
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &args)?;
    for (t, input) in inputs.iter().enumerate() {
        for p in 0..partitions {
            let value = format!("hello {t}/{p}");
            kafka.produce_to(input, p, &[("k", &value)]).await?;
            expected.push(value.to_uppercase());
        }
    }
    let mut values = Vec::new();
    for output in &outputs {
        match kafka
            .consume(output, partitions as usize, Duration::from_secs(120))
            .await
        {
            Ok(got) => values.extend(got.iter().map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())),
            Err(e) => panic!("{e:#}; the worker's log:\n{}", worker.log()),
        }
    }
    values.sort();
    expected.sort();
    assert_eq!(values, expected);
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    Ok(())
}

/// Hundreds of tasks start at once against a broker started a second ago (its offsets topic
/// not created yet, its coordinators loading): every one starts and processes — none sits
/// in its start without a word — and every task logs that it started.
#[tokio::test(flavor = "multi_thread")]
async fn hundreds_of_tasks_start_against_a_broker_started_a_second_ago() -> anyhow::Result<()> {
    let cluster = tokio::task::spawn_blocking(|| PrivateCluster::start(1)).await??;
    let kafka = &cluster.kafka;
    let dir = TempDir::new("many-starts");
    let partitions = 256;
    let (input, output) = (unique_name("many-in"), unique_name("many-out"));
    kafka.create_topic(&input, partitions).await?;
    kafka.create_topic(&output, partitions).await?;
    let name = unique_name("many");
    let m = dir.write(
        "many.toml",
        &manifest(
            &name,
            &guest("uppercase"),
            &[("input", &input)],
            &[("output", &output)],
            "",
        ),
    );
    let state = dir.path().join("state");
    let mut worker = WorkerProcess::start(
        kafka.bootstrap(),
        dir.path(),
        &[
            "--topology",
            m.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ],
    )?;
    for p in 0..partitions {
        kafka.produce_to(&input, p, &[("k", &format!("p{p}"))]).await?;
    }
    let got = match kafka
        .consume(&output, partitions as usize, Duration::from_secs(240))
        .await
    {
        Ok(got) => got,
        Err(e) => panic!("{e:#}; the worker's log:\n{}", worker.log()),
    };
    let mut values: Vec<String> = got
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
        .collect();
    values.sort();
    let mut expected: Vec<String> = (0..partitions).map(|p| format!("P{p}")).collect();
    expected.sort();
    assert_eq!(values, expected, "every one of {partitions} tasks processed its record");
    let log = worker.log();
    for p in 0..partitions {
        let task = format!("task={name}/{p}");
        assert!(
            log.lines()
                .any(|l| l.contains(": started ") && l.trim_end().ends_with(&task)),
            "task {name}/{p} never logged that it started"
        );
    }
    assert!(worker.terminate(Duration::from_secs(120))?.success(), "{log}");
    Ok(())
}

fn lines(range: std::ops::Range<usize>) -> Vec<(Vec<u8>, Vec<u8>)> {
    range
        .map(|i| {
            let words: Vec<String> = (0..4).map(|j| format!("w{}", (i * 31 + j * 17) % 400)).collect();
            (format!("line-{i}").into_bytes(), words.join(" ").into_bytes())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_survive_a_rolling_restart_of_three_brokers_under_load_and_lose_nothing() -> anyhow::Result<()> {
    let cluster = std::sync::Arc::new(tokio::task::spawn_blocking(|| PrivateCluster::start(3)).await??);
    let kafka = &cluster.kafka;
    let (input, output) = (unique_name("roll-in"), unique_name("roll-out"));
    kafka
        .create_topic_with(&input, 6, 3, &[("min.insync.replicas", "2")])
        .await?;
    kafka
        .create_topic_with(&output, 6, 3, &[("min.insync.replicas", "2")])
        .await?;
    let dir = TempDir::new("rolling");
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
    let group = unique_name("roll");
    let start = |n: &str| {
        let state = dir.path().join(format!("state-{n}"));
        WorkerProcess::start(
            kafka.bootstrap(),
            dir.path(),
            &[
                "--topology",
                m.to_str().unwrap(),
                "--cluster",
                &group,
                "--no-drain-on-stop",
                "--state-dir",
                state.to_str().unwrap(),
                "--commit-interval",
                "200ms",
                "--heartbeat-interval",
                "500ms",
            ],
        )
    };
    let mut workers = vec![start("a")?, start("b")?];

    // Input flows for the whole run.
    let total = 30_000;
    let producing = {
        let input = input.clone();
        let cluster = cluster.clone();
        tokio::spawn(async move {
            let mut positions = Vec::new();
            for chunk in 0..100 {
                positions.extend(
                    cluster
                        .kafka
                        .produce(&input, &lines(chunk * 300..(chunk + 1) * 300))
                        .await?,
                );
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            anyhow::Ok(positions)
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    for node in 1..=3 {
        if node == 2 {
            // A third worker joins: tasks move and restore their changelogs while the next
            // broker goes down.
            workers.push(start("c")?);
        }
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || c.restart(node, 2.0)).await??;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let positions = producing.await??;
    if let Err(e) = kafka
        .wait_committed(
            &format!("sluice-{name}"),
            &input,
            6,
            total as i64,
            Duration::from_secs(180),
        )
        .await
    {
        for (n, w) in workers.iter().enumerate() {
            eprintln!("--- worker {n}:\n{}", w.log());
        }
        return Err(e);
    }
    for w in &mut workers {
        let status = w.terminate(Duration::from_secs(60))?;
        assert!(
            status.success(),
            "a worker failed or had failed tasks ({status}):\n{}",
            w.log()
        );
    }
    // What the changelogs say, rebuilt by a fresh worker, is never below the truth.
    let mut truth: HashMap<i32, BTreeMap<String, u64>> = HashMap::new();
    for ((_, line), (p, _)) in lines(0..total).iter().zip(&positions) {
        for w in std::str::from_utf8(line)?.split(' ') {
            *truth.entry(*p).or_default().entry(w.to_string()).or_insert(0) += 1;
        }
    }
    let fresh = dir.path().join("state-fresh");
    let mut rebuild = WorkerProcess::start(
        kafka.bootstrap(),
        dir.path(),
        &[
            "--topology",
            m.to_str().unwrap(),
            "--state-dir",
            fresh.to_str().unwrap(),
        ],
    )?;
    for p in 0..6 {
        rebuild.wait_for_line(&["started", &format!("task={name}/{p}")], Duration::from_secs(120))?;
    }
    assert!(
        rebuild.terminate(Duration::from_secs(60))?.success(),
        "{}",
        rebuild.log()
    );
    for p in 0..6 {
        let counts = sluice_tests::worker::dump_counts(&fresh, &name, p, "counts")?;
        for (word, n) in &truth[&p] {
            let got = counts.get(word).copied().unwrap_or(0);
            assert!(
                got >= *n,
                "partition {p}, {word}: {got} < {n} after the rolling restart"
            );
        }
    }
    Ok(())
}
