//! Many tasks on one worker cost a few threads: tasks are values a stream thread drives,
//! not threads with consumers of their own. (CI runs 200 tasks; `dev/bench density` runs
//! 1,000 and prints the figures.)

use std::time::{Duration, Instant};

use rdkafka::producer::{FutureRecord, Producer as _};
use sluice_tests::worker::{guest, manifest, TempDir, WorkerProcess};
use sluice_tests::{free_port, http_get, kafka, unique_name};

/// `sluice_tasks_running` from the metrics endpoint.
fn tasks_running(port: u16) -> Option<u64> {
    let body = http_get(port, "/metrics").ok()?;
    body.lines()
        .find(|l| l.starts_with("sluice_tasks_running "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_tasks_run_on_a_few_threads_and_every_one_processes() -> anyhow::Result<()> {
    two_hundred_tasks("at-least-once").await
}

/// Under exactly-once the tasks share their stream thread's transactional producer: no
/// producer, connections or `InitProducerId` per task (before, 256 tasks took 1,320 threads
/// and 538 sockets, and three of them had not started after 300 s).
#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_exactly_once_tasks_run_on_a_few_threads_and_every_one_processes() -> anyhow::Result<()> {
    two_hundred_tasks("exactly-once").await
}

async fn two_hundred_tasks(guarantee: &str) -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("density");
    let (topologies, partitions) = (5usize, 40i32);
    let mut args: Vec<String> = Vec::new();
    let mut pairs = Vec::new();
    for t in 0..topologies {
        let (input, output) = (unique_name("dense-in"), unique_name("dense-out"));
        kafka.create_topic(&input, partitions).await?;
        kafka.create_topic(&output, partitions).await?;
        let m = dir.write(
            &format!("t{t}.toml"),
            &manifest(
                &unique_name("dense"),
                &guest("uppercase"),
                &[("input", &input)],
                &[("output", &output)],
                "",
            ),
        );
        args.extend(["--topology".into(), m.to_str().unwrap().into()]);
        pairs.push((input, output));
    }
    let port = free_port();
    let state = dir.path().join("state");
    args.extend([
        "--metrics".into(),
        format!("127.0.0.1:{port}"),
        "--state-dir".into(),
        state.to_str().unwrap().into(),
        "--threads".into(),
        "2".into(),
        "--processing-guarantee".into(),
        guarantee.into(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &args)?;
    let tasks = topologies as u64 * partitions as u64;
    let started = Instant::now();
    while tasks_running(port) != Some(tasks) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{:?} of {tasks} tasks running after 120s:\n{}",
            tasks_running(port),
            worker.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let start_secs = started.elapsed().as_secs_f64();
    // Idle: what the worker costs with every task running and nothing to do.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (cpu0, t0) = (worker.cpu_seconds()?, Instant::now());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_cpu = (worker.cpu_seconds()? - cpu0) / t0.elapsed().as_secs_f64();
    let (threads, rss) = (worker.threads()?, worker.rss()?);
    eprintln!(
        "density ({guarantee}): {tasks} tasks running {start_secs:.1}s after start; idle: {threads} threads, \
         {:.0} MiB RSS, {:.1}% of a core",
        rss as f64 / (1 << 20) as f64,
        idle_cpu * 100.0
    );
    assert!(
        threads <= 64,
        "{threads} OS threads for {tasks} tasks (at most 64 with stream threads)"
    );

    // Every task processes: one record to every partition of every topology.
    let producer = kafka.producer()?;
    let records: Vec<(&str, i32, String)> = pairs
        .iter()
        .enumerate()
        .flat_map(|(t, (input, _))| (0..partitions).map(move |p| (input.as_str(), p, format!("hello {t}/{p}"))))
        .collect();
    let sends: Vec<_> = records
        .iter()
        .map(|(input, p, value)| {
            producer.send(
                FutureRecord::to(input).partition(*p).key("k").payload(value),
                Duration::from_secs(30),
            )
        })
        .collect();
    for send in futures::future::join_all(sends).await {
        send.map_err(|(e, _)| anyhow::anyhow!("producing: {e}"))?;
    }
    for (t, (_, output)) in pairs.iter().enumerate() {
        let got = match kafka
            .consume(output, partitions as usize, Duration::from_secs(120))
            .await
        {
            Ok(got) => got,
            Err(e) => panic!("topology {t}: {e:#}; the worker's log:\n{}", worker.log()),
        };
        let mut values: Vec<String> = got
            .iter()
            .map(|r| String::from_utf8(r.value.clone().unwrap()).unwrap())
            .collect();
        values.sort();
        let mut expected: Vec<String> = (0..partitions).map(|p| format!("HELLO {t}/{p}")).collect();
        expected.sort();
        assert_eq!(values, expected, "topology {t}");
    }
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    Ok(())
}

/// A task restoring a large store does not hold up the other tasks of its stream thread:
/// with one stream thread, a stateless topology keeps producing output while a word count
/// restores two million changelog records (restores run on starter threads).
#[tokio::test(flavor = "multi_thread")]
async fn a_long_restore_does_not_pause_the_other_tasks_of_its_thread() -> anyhow::Result<()> {
    use std::sync::{Arc, Mutex};

    let kafka = kafka();
    let dir = TempDir::new("restore-beside");
    let (up_in, up_out) = (unique_name("beside-in"), unique_name("beside-out"));
    let (wc_in, wc_out) = (unique_name("restoring-in"), unique_name("restoring-out"));
    for t in [&up_in, &up_out, &wc_in, &wc_out] {
        kafka.create_topic(t, 1).await?;
    }
    // The word count's changelog, filled before the worker starts: its task restores it all.
    let wc = unique_name("restoring");
    let changelog = format!("{wc}-counts-changelog");
    kafka
        .create_topic_with(&changelog, 1, 1, &[("cleanup.policy", "compact")])
        .await?;
    let producer: rdkafka::producer::ThreadedProducer<rdkafka::producer::DefaultProducerContext> = kafka
        .config()
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let changes = 2_000_000u64;
    for i in 0..changes {
        let key = format!("old{i}");
        let value = (i % 7 + 1).to_le_bytes();
        loop {
            match producer.send(
                rdkafka::producer::BaseRecord::to(&changelog)
                    .partition(0)
                    .key(&key)
                    .payload(&value[..]),
            ) {
                Ok(()) => break,
                Err((e, _)) if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => anyhow::bail!("filling the changelog: {e}"),
            }
        }
    }
    producer.flush(Duration::from_secs(120))?;

    let up = dir.write(
        "up.toml",
        &manifest(
            &unique_name("beside"),
            &guest("uppercase"),
            &[("input", &up_in)],
            &[("output", &up_out)],
            "",
        ),
    );
    let counts = dir.write(
        "wc.toml",
        &manifest(
            &wc,
            &guest("word-count"),
            &[("lines", &wc_in)],
            &[("counts", &wc_out)],
            "",
        ),
    );
    // Arrival times of each output, read as they come.
    let arrivals: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let mut readers = Vec::new();
    for topic in [up_out.clone(), wc_out.clone()] {
        let arrivals = arrivals.clone();
        let consumer = kafka.consumer(&unique_name("beside-reader"))?;
        readers.push(tokio::spawn(async move {
            use rdkafka::consumer::Consumer;
            consumer.subscribe(&[&topic])?;
            loop {
                let m = consumer.recv().await?;
                arrivals.lock().unwrap().push((topic.clone(), Instant::now()));
                drop(m);
            }
            #[allow(unreachable_code)]
            anyhow::Ok(())
        }));
    }
    let state = dir.path().join("state");
    let mut worker = WorkerProcess::start(
        kafka.bootstrap(),
        dir.path(),
        &[
            "--topology",
            up.to_str().unwrap(),
            "--topology",
            counts.to_str().unwrap(),
            "--threads",
            "1",
            "--state-dir",
            state.to_str().unwrap(),
        ],
    )?;
    kafka.produce_to(&wc_in, 0, &[("k", "fresh")]).await?;
    // The stateless topology gets a record every 50 ms until the word count has answered.
    let started = Instant::now();
    let mut sent = 0;
    let steady = kafka.producer()?;
    loop {
        let value = format!("r{sent}");
        steady
            .send(
                FutureRecord::to(&up_in).partition(0).key("k").payload(&value),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| anyhow::anyhow!("producing: {e}"))?;
        sent += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
        if arrivals.lock().unwrap().iter().any(|(t, _)| *t == wc_out) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the word count did not answer within 180s:\n{}",
            worker.log()
        );
    }
    for r in readers {
        r.abort();
    }
    let arrivals = arrivals.lock().unwrap().clone();
    let answered = arrivals.iter().find(|(t, _)| *t == wc_out).map(|(_, at)| *at).unwrap();
    let before = arrivals.iter().filter(|(t, at)| *t == up_out && *at < answered).count();
    let restore = answered.duration_since(started);
    eprintln!(
        "while the word count restored {changes} records ({restore:?}), {before} of the {sent} records sent \
         to the other topology came through"
    );
    assert!(
        before >= 5 && before * 2 >= sent,
        "only {before} of {sent} records of the stateless topology came through in the {restore:?} the word \
         count took to restore {changes} records on the same stream thread:\n{}",
        worker.log()
    );
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    Ok(())
}
