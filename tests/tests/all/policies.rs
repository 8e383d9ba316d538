//! What a worker does with records a topology cannot process (the manifest's `on-error`),
//! with batches too big for the guest, and with punctuation before any record: against a
//! real broker, checked on the data in the topics.

use std::time::Duration;

use sluice_tests::worker::{guest, manifest, TempDir, WorkerProcess};
use sluice_tests::{kafka, unique_name, Received};

fn text(bytes: &Option<Vec<u8>>) -> String {
    String::from_utf8_lossy(bytes.as_deref().unwrap_or_default()).into_owned()
}

fn values(records: &[Received]) -> Vec<String> {
    let mut out: Vec<String> = records.iter().map(|r| text(&r.value)).collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn skip_and_dead_letter_pass_over_bad_records_and_the_dead_letters_say_why() -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("policies");
    let sent = [
        ("k0", "good-0"),
        ("k1", "panic"),
        ("k2", "good-1"),
        ("k3", "error"),
        ("k4", "good-2"),
        ("k5", "loop"),
        ("k6", "good-3"),
    ];
    let mut args = Vec::new();
    let mut cases = Vec::new();
    for policy in ["skip", "dead-letter"] {
        let name = unique_name(&format!("policy-{policy}"));
        let (input, output, dlq) = (unique_name("pol-in"), unique_name("pol-out"), unique_name("pol-dlq"));
        kafka.create_topic(&input, 1).await?;
        kafka.create_topic(&output, 1).await?;
        let mut text = manifest(
            &name,
            &guest("faults"),
            &[("input", &input)],
            &[("output", &output)],
            "call-timeout = \"500ms\"",
        );
        let head = if policy == "skip" {
            "on-error = \"skip\"\n".to_string()
        } else {
            kafka.create_topic(&dlq, 1).await?;
            format!("on-error = \"dead-letter\"\ndead-letter-topic = {dlq:?}\n")
        };
        text = head + &text;
        let path = dir.write(&format!("{policy}.toml"), &text);
        args.push("--topology".to_string());
        args.push(path.to_str().unwrap().to_string());
        // All in one batch: the bad records are found inside it.
        kafka.produce_to(&input, 0, &sent).await?;
        cases.push((policy, name, input, output, dlq));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &args)?;

    let good = ["good-0", "good-1", "good-2", "good-3"].map(String::from).to_vec();
    for (policy, name, input, output, dlq) in &cases {
        let received = kafka.consume(output, 4, Duration::from_secs(90)).await?;
        assert_eq!(values(&received), good, "{policy}: every good record, once");
        kafka
            .wait_committed(&format!("sluice-{name}"), input, 1, 7, Duration::from_secs(60))
            .await?;
        if *policy == "dead-letter" {
            let dead = kafka.consume(dlq, 3, Duration::from_secs(60)).await?;
            let mut dead: Vec<&Received> = dead.iter().collect();
            dead.sort_by_key(|r| r.header("sluice.source.offset").unwrap_or_default());
            let expected = [
                ("k1", "panic", "1", "trap", "boom at offset 1"),
                ("k3", "error", "3", "error", "refusing the record at offset 3"),
                ("k5", "loop", "5", "deadline", "deadline of 500ms"),
            ];
            for (r, (key, value, offset, kind, cause)) in dead.iter().zip(expected) {
                assert_eq!(
                    (text(&r.key).as_str(), text(&r.value).as_str()),
                    (key, value),
                    "the record unchanged"
                );
                assert_eq!(r.header("sluice.source.topic").as_deref(), Some(input.as_str()));
                assert_eq!(r.header("sluice.source.partition").as_deref(), Some("0"));
                assert_eq!(r.header("sluice.source.offset").as_deref(), Some(offset));
                assert_eq!(r.header("sluice.error.kind").as_deref(), Some(kind));
                let error = r.header("sluice.error").unwrap_or_default();
                assert!(error.contains(cause), "{error:?} should name {cause:?}");
                assert!(r
                    .header("sluice.source.timestamp")
                    .is_some_and(|t| t.parse::<i64>().is_ok()));
            }
        }
    }
    // The tasks keep running: a record produced now still comes through.
    for (_, _, input, output, _) in &cases {
        kafka.produce_to(input, 0, &[("k7", "good-4")]).await?;
        let received = kafka.consume(output, 5, Duration::from_secs(60)).await?;
        assert!(values(&received).contains(&"good-4".to_string()));
    }
    // Nothing failed, so the worker exits 0.
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn five_hundred_records_of_200_kb_get_through_a_64_mib_guest() -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("big-batch");
    let (input, output) = (unique_name("big-in"), unique_name("big-out"));
    kafka.create_topic(&input, 1).await?;
    kafka.create_topic(&output, 1).await?;
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..500)
        .map(|i| {
            let mut value = format!("record {i:03} ").into_bytes();
            value.resize(200_000, b'x');
            (format!("k{i}").into_bytes(), value)
        })
        .collect();
    kafka.produce(&input, &records).await?;
    let name = unique_name("big");
    let m = dir.write(
        "big.toml",
        &manifest(
            &name,
            &guest("uppercase"),
            &[("input", &input)],
            &[("output", &output)],
            "memory = \"64MiB\"",
        ),
    );
    // 500 records at once: 100 MB in one batch would be more than the guest's memory.
    let mut worker = WorkerProcess::start(
        kafka.bootstrap(),
        dir.path(),
        &["--topology", m.to_str().unwrap(), "--batch-size", "500"],
    )?;
    let received = match kafka.consume(&output, 500, Duration::from_secs(180)).await {
        Ok(r) => r,
        Err(e) => panic!("{e:#}\n{}", worker.log()),
    };
    let mut got: Vec<String> = received
        .iter()
        .map(|r| {
            let v = r.value.as_deref().unwrap_or_default();
            assert_eq!(v.len(), 200_000);
            assert!(v[11..].iter().all(|&b| b == b'X'), "upper-cased");
            String::from_utf8_lossy(&v[..11]).into_owned()
        })
        .collect();
    got.sort();
    let expected: Vec<String> = (0..500).map(|i| format!("RECORD {i:03} ")).collect();
    assert_eq!(got, expected, "each record once");
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn window_count_restarted_on_an_idle_partition_emits_nothing_early() -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("idle-restart");
    let (input, output) = (unique_name("win-in"), unique_name("win-out"));
    kafka.create_topic(&input, 1).await?;
    kafka.create_topic(&output, 1).await?;
    let name = unique_name("windows");
    let m = dir.write(
        "w.toml",
        &manifest(
            &name,
            &guest("window-count"),
            &[("events", &input)],
            &[("windows", &output)],
            "",
        ),
    );
    let state = dir.path().join("state");
    let args = [
        "--topology",
        m.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
        "--punctuate-interval",
        "200ms",
        "--commit-interval",
        "200ms",
    ];
    // Two keys in the window [0, 10 s) of stream time: open, nothing to emit yet.
    let producer = kafka.producer()?;
    let send = |key: &'static str, ts: i64| {
        let producer = producer.clone();
        let input = input.clone();
        async move {
            use rdkafka::producer::FutureRecord;
            producer
                .send(
                    FutureRecord::to(&input)
                        .partition(0)
                        .key(key)
                        .payload("e")
                        .timestamp(ts),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)
        }
    };
    send("a", 1_000).await?;
    send("b", 2_000).await?;
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &args)?;
    kafka
        .wait_committed(&format!("sluice-{name}"), &input, 1, 2, Duration::from_secs(60))
        .await?;
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());

    // Restarted with nothing new to read: many punctuation intervals pass.
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &args)?;
    worker.wait_for_line(&["started", &format!("{name}/0")], Duration::from_secs(60))?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let early = kafka.read_all(&output, Duration::from_secs(10))?;
    assert!(early.is_empty(), "emitted before any new record: {:?}", values(&early));

    // Stream time passes the window's end: both counts come out, once.
    send("c", 25_000).await?;
    let closed = kafka.consume(&output, 2, Duration::from_secs(60)).await?;
    let got: Vec<(String, String)> = {
        let mut v: Vec<_> = closed.iter().map(|r| (text(&r.key), text(&r.value))).collect();
        v.sort();
        v
    };
    assert_eq!(got, vec![("a".into(), "0 1".into()), ("b".into(), "0 1".into())]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        kafka.read_all(&output, Duration::from_secs(10))?.len(),
        2,
        "nothing more"
    );
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    Ok(())
}
