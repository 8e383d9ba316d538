//! `sluice worker` as a process against a real broker: delivery, restarts, guest faults.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use sluice_tests::worker::{guest, manifest, sluice_binary, TempDir, WorkerProcess};
use sluice_tests::{free_port, http_get, kafka, unique_name, Scenario};

fn records(prefix: &str, range: std::ops::Range<usize>) -> Vec<(Vec<u8>, Vec<u8>)> {
    range
        .map(|i| {
            (
                format!("key-{i}").into_bytes(),
                format!("{prefix} record number {i}").into_bytes(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn ten_thousand_records_through_uppercase_all_arrive_upper_cased() -> anyhow::Result<()> {
    let up = Scenario::builder("upper", "uppercase")
        .source("input", 4)
        .sink("output", 4)
        .create()
        .await?;
    let sent = records("hello", 0..10_000);
    up.produce(&sent).await?;
    let name = up.name();
    let metrics_port = free_port();
    let mut worker = up.worker(&["--metrics", &format!("127.0.0.1:{metrics_port}")])?;

    let received = up.consume(sent.len(), Duration::from_secs(120)).await?;
    let expected: BTreeSet<(Vec<u8>, Vec<u8>)> =
        sent.iter().map(|(k, v)| (k.clone(), v.to_ascii_uppercase())).collect();
    let got: BTreeSet<(Vec<u8>, Vec<u8>)> = received
        .iter()
        .map(|r| (r.key.clone().unwrap(), r.value.clone().unwrap()))
        .collect();
    assert_eq!(got.len(), 10_000, "distinct records in the sink");
    assert_eq!(got, expected);

    // The metrics endpoint counts them per task (4 tasks, 10,000 in and out in total).
    let text = http_get(metrics_port, "/metrics")?;
    let total = |metric: &str| -> u64 {
        text.lines()
            .filter(|l| l.starts_with(metric) && l.contains(&format!("topology=\"{name}\"")))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
            .sum()
    };
    assert_eq!(total("sluice_records_in_total"), 10_000, "{text}");
    assert_eq!(total("sluice_records_out_total"), 10_000, "{text}");

    // The rest of the admin endpoint: health, readiness, live status (every task active and
    // running), and a drain refused with its reason (a worker alone has nobody to drain to).
    assert_eq!(http_get(metrics_port, "/healthz")?.trim(), "ok");
    assert_eq!(http_get(metrics_port, "/readyz")?.trim(), "ready");
    let status: serde_json::Value = serde_json::from_str(&http_get(metrics_port, "/status")?)?;
    let tasks = status["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 4, "{status}");
    for t in tasks {
        assert_eq!(
            (&t["role"], &t["phase"]),
            (&"active".into(), &"running".into()),
            "{status}"
        );
    }
    let drain = |admin: &str| {
        std::process::Command::new(sluice_binary())
            .args(["worker", "drain", "--admin", admin])
            .output()
    };
    let refused = drain(&format!("127.0.0.1:{metrics_port}"))?;
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("refused to drain (409 Conflict): this worker is not in a cluster"),
        "{stderr}"
    );
    let nobody = format!("127.0.0.1:{}", free_port());
    let unreachable = drain(&nobody)?;
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert!(!unreachable.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot reach the worker's admin endpoint at {nobody}")),
        "{stderr}"
    );

    let status = worker.terminate(Duration::from_secs(60))?;
    assert!(status.success(), "exit status {status}; log:\n{}", worker.log());
    // A clean stop commits everything it read.
    assert_eq!(up.committed_total()?, 10_000, "offsets committed at shutdown");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_killed_mid_stream_and_restarted_loses_nothing() -> anyhow::Result<()> {
    let kafka = kafka();
    let up = Scenario::builder("killed", "uppercase")
        .source("input", 4)
        .sink("output", 4)
        .create()
        .await?;
    let args = ["--batch-size", "20", "--commit-interval", "50ms"];
    let mut worker = up.worker(&args)?;

    // Input keeps arriving for a few seconds: 30 chunks of 1,000 records, 100 ms apart.
    let total = 30_000;
    let producing = {
        let input = up.input().to_string();
        tokio::spawn(async move {
            for chunk in 0..30 {
                kafka
                    .produce(&input, &records("streamed", chunk * 1000..(chunk + 1) * 1000))
                    .await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(())
        })
    };
    // Kill the worker once part of the input has made it through, while more is arriving.
    up.consume(5_000, Duration::from_secs(60)).await?;
    worker.kill()?;
    let killed_with = up.committed_total()?;
    producing.await??;
    assert!(
        killed_with < total as i64,
        "everything was committed before the kill; the test proves nothing"
    );

    let mut worker = up.worker(&args)?;
    // Every input arrives at least once (duplicates are allowed: at-least-once).
    let expected: BTreeSet<Vec<u8>> = records("streamed", 0..total)
        .iter()
        .map(|(_, v)| v.to_ascii_uppercase())
        .collect();
    let mut seen = BTreeSet::new();
    let consumer = kafka.consumer(&unique_name("reader"))?;
    rdkafka::consumer::Consumer::subscribe(&consumer, &[up.output()])?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while seen.len() < expected.len() {
        let message = tokio::time::timeout_at(deadline, consumer.recv()).await.map_err(|_| {
            anyhow::anyhow!(
                "only {} of {} distinct records arrived; worker log:\n{}",
                seen.len(),
                expected.len(),
                worker.log()
            )
        })??;
        seen.insert(rdkafka::Message::payload(&message).unwrap().to_vec());
    }
    assert_eq!(seen, expected);
    assert!(worker.terminate(Duration::from_secs(60))?.success());
    Ok(())
}

/// One worker runs five topologies of the `faults` guest, each over a two-partition topic.
/// Partition 0 of each gets three good records, then one that triggers a fault, then one more;
/// partition 1 gets good records before and after. Each faulting task stops with its named
/// error and has committed exactly up to its last good record; the worker's other tasks keep
/// going.
#[tokio::test(flavor = "multi_thread")]
async fn guest_faults_stop_only_their_task_with_a_named_error() -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("faults");
    let cases = [
        ("panic", "", &["the guest trapped: wasm `unreachable` instruction executed (guest stderr: ", "boom at offset 3"][..]),
        ("loop", "call-timeout = \"300ms\"", &["the guest call exceeded its deadline of 300ms"]),
        ("oom", "memory = \"16MiB\"", &["the guest exceeded its memory limit of 16777216 bytes"]),
        ("undeclared", "", &["the topology reported an error: emit to undeclared sink \"nowhere\"; the topology declares [\"output\"]"]),
        ("error", "", &["the topology reported an error: refusing the record at offset 3"]),
    ];
    let mut args = Vec::new();
    let mut topics = HashMap::new();
    for (fault, limits, _) in &cases {
        let (input, output) = (
            unique_name(&format!("{fault}-in")),
            unique_name(&format!("{fault}-out")),
        );
        kafka.create_topic(&input, 2).await?;
        kafka.create_topic(&output, 2).await?;
        // Offsets 0–2 are good; 3 (produced once those are through) faults; 4 must never be processed.
        kafka
            .produce_to(&input, 0, &[("a", "good-0"), ("b", "good-1"), ("c", "good-2")])
            .await?;
        kafka.produce_to(&input, 1, &[("f", "p1-before")]).await?;
        let name = unique_name(fault);
        let path = dir.write(
            &format!("{fault}.toml"),
            &manifest(
                &name,
                &guest("faults"),
                &[("input", &input)],
                &[("output", &output)],
                limits,
            ),
        );
        args.push("--topology".to_string());
        args.push(path.to_str().unwrap().to_string());
        topics.insert(*fault, (name, input, output));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &args)?;
    for (fault, _, _) in &cases {
        let (_, input, output) = &topics[fault];
        kafka.consume(output, 4, Duration::from_secs(60)).await?;
        kafka.produce_to(input, 0, &[("d", fault), ("e", "after")]).await?;
    }

    for (fault, _, cause) in &cases {
        let (name, input, _) = &topics[fault];
        let at = format!("task {name}/0 failed at offset 3 of topic {input} partition 0: ");
        let parts: Vec<&str> = std::iter::once(at.as_str()).chain(cause.iter().copied()).collect();
        let line = worker.wait_for_line(&parts, Duration::from_secs(60))?;
        assert!(line.contains("ERROR"), "{line}");
    }
    // The healthy tasks keep processing: records produced now still come through.
    for (fault, _, _) in &cases {
        let (_, input, _) = &topics[fault];
        kafka.produce_to(input, 1, &[("g", "p1-after")]).await?;
    }
    for (fault, _, _) in &cases {
        let (name, input, output) = &topics[fault];
        let received = kafka.consume(output, 5, Duration::from_secs(60)).await?;
        let values: BTreeSet<String> = received
            .iter()
            .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
            .collect();
        let expected: BTreeSet<String> = ["good-0", "good-1", "good-2", "p1-before", "p1-after"]
            .map(String::from)
            .into();
        assert_eq!(values, expected, "{fault}: the sink holds exactly the good records");
        // Everything up to the last good record is committed, nothing past it.
        assert_eq!(
            kafka.committed_offset(&format!("sluice-{name}"), input, 0)?,
            Some(3),
            "{fault}: partition 0"
        );
    }
    // A worker whose tasks failed says so with its exit status.
    let status = worker.terminate(Duration::from_secs(60))?;
    assert_eq!(status.code(), Some(3), "log:\n{}", worker.log());
    assert!(worker.log().contains(&format!(
        "{} task(s) failed or topologies were refused while this worker ran",
        cases.len()
    )));
    // After the fault, nothing from partition 0 past the last good record was committed,
    // even at shutdown.
    for (fault, _, _) in &cases {
        let (name, input, _) = &topics[fault];
        assert_eq!(
            kafka.committed_offset(&format!("sluice-{name}"), input, 0)?,
            Some(3),
            "{fault}: at shutdown"
        );
        assert_eq!(
            kafka.committed_offset(&format!("sluice-{name}"), input, 1)?,
            Some(2),
            "{fault}: partition 1"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_topic_or_bad_manifest_is_refused_at_start_up() -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("refuse");
    let input = unique_name("exists");
    kafka.create_topic(&input, 1).await?;
    let missing = unique_name("missing");

    let m = dir.write(
        "m.toml",
        &manifest(
            "refused",
            &guest("uppercase"),
            &[("input", &input)],
            &[("output", &missing)],
            "",
        ),
    );
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &["--topology", m.to_str().unwrap()])?;
    let status = worker.wait(Duration::from_secs(60))?;
    assert!(!status.success());
    let expected = format!(
        "sluice: error: topology refused (manifest {}): sink topic {missing:?}: does not exist; create it first (for example `sluice topics create --partitions 4 TOPIC`)",
        m.display()
    );
    assert!(
        worker.log().contains(&expected),
        "expected {expected:?} in:\n{}",
        worker.log()
    );

    let bad = dir.write(
        "bad.toml",
        &manifest(
            "bad",
            &guest("uppercase"),
            &[("input", &input)],
            &[("shout", &input)],
            "",
        ),
    );
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &["--topology", bad.to_str().unwrap()])?;
    assert!(!worker.wait(Duration::from_secs(60))?.success());
    let expected = format!(
        "sluice: error: manifest {} does not fit component {}: it binds the sink \"shout\", which the component does not declare (it declares \"output\")",
        bad.display(),
        guest("uppercase").display()
    );
    assert!(
        worker.log().contains(&expected),
        "expected {expected:?} in:\n{}",
        worker.log()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_0_1_0_component_runs_beside_a_0_2_0_one_on_one_worker() -> anyhow::Result<()> {
    // Components uploaded before the 0.2.0 contract keep running, as one sub-topology.
    let kafka = kafka();
    // Each reads a topic of its own: two topologies reading one topic on one worker is a
    // case of its own (its tasks can share a stream thread's consumer).
    let (old_in, new_in) = (unique_name("v1-in"), unique_name("v2-in"));
    let (old_out, new_out) = (unique_name("v1-out"), unique_name("v2-out"));
    for topic in [&old_in, &new_in, &old_out, &new_out] {
        kafka.create_topic(topic, 2).await?;
    }
    let sent = records("both versions", 0..1_000);
    kafka.produce(&old_in, &sent).await?;
    kafka.produce(&new_in, &sent).await?;
    let dir = TempDir::new("versions");
    let old = dir.write(
        "old.toml",
        &manifest(
            &unique_name("old"),
            &guest("v1-uppercase"),
            &[("input", &old_in)],
            &[("output", &old_out)],
            "",
        ),
    );
    let new = dir.write(
        "new.toml",
        &manifest(
            &unique_name("new"),
            &guest("uppercase"),
            &[("input", &new_in)],
            &[("output", &new_out)],
            "",
        ),
    );
    let _worker = WorkerProcess::start(
        kafka.bootstrap(),
        dir.path(),
        &["--topology", old.to_str().unwrap(), "--topology", new.to_str().unwrap()],
    )?;
    let expected: BTreeSet<(Vec<u8>, Vec<u8>)> =
        sent.iter().map(|(k, v)| (k.clone(), v.to_ascii_uppercase())).collect();
    for output in [&old_out, &new_out] {
        let got: BTreeSet<(Vec<u8>, Vec<u8>)> = kafka
            .consume(output, sent.len(), Duration::from_secs(120))
            .await?
            .into_iter()
            .map(|r| (r.key.unwrap(), r.value.unwrap()))
            .collect();
        assert_eq!(got, expected, "{output}");
    }
    Ok(())
}
