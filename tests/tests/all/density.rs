//! Many tasks on one worker cost a few threads: tasks are values a stream thread drives,
//! not threads with consumers of their own. (CI runs 200 tasks; `dev/bench density` runs
//! 1,000 and prints the figures.)

use std::time::{Duration, Instant};

use rdkafka::producer::FutureRecord;
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
        "density: {tasks} tasks running {start_secs:.1}s after start; idle: {threads} threads, \
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
