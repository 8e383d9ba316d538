//! The hostile-guest suite on a real worker: every attack of the `hostile` guests deployed
//! on one worker beside a well-behaved topology. The worker stays up, each hostile task
//! fails with a fault naming its cause (floods within budget keep running), topologies
//! that cannot load are refused alone, the neighbour keeps at least 80% of the throughput
//! it has alone (measured in this run), SIGTERM stops the worker within 30 s, and its peak
//! RSS stays under a stated bound.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use sluice_tests::worker::{guest, manifest, TempDir, WorkerProcess};
use sluice_tests::{free_port, http_get, kafka, unique_name, Kafka};

/// Records the neighbour processes in each run: enough for several seconds of processing.
/// Shorter runs measure mostly noise, and one-off costs: a looping guest stalls the tasks
/// sharing its stream thread once, for its call timeout (500 ms here), before it fails.
/// At ~400,000 records/s a 400,000-record window made that single stall 30-55% of it.
const NEIGHBOUR_RECORDS: usize = 1_600_000;
/// What the worker's resident memory may reach with every attack at once (measured: about
/// 180 MiB). 14 instances of at most 64 MiB of linear memory each could in theory take
/// 900 MiB, but only `grow` (16 MiB) and the budgets (32 MiB of host memory per task) may
/// keep any.
const PEAK_RSS_BOUND: u64 = 400 << 20;

/// (record value, expected fault kind; none: keeps running and passes the record on).
const ATTACKS: &[(&str, Option<&str>)] = &[
    ("bad-count", Some("bad_output")),
    ("sleep", Some("denied")),
    ("loop", Some("deadline")),
    ("stack", Some("trap")),
    // The guest's own allocator refuses and aborts (see sandbox.rs): a trap naming it.
    ("alloc", Some("trap")),
    ("grow", None),
    ("state-bomb", Some("memory")),
    // Within the call budget, but more than `limits.state` on disk.
    ("state-fill", Some("quota")),
    ("emit-flood", Some("memory")),
    ("log-flood", None),
    ("stdout-flood", None),
    ("undeclared-store", Some("undeclared")),
    ("undeclared-sink", Some("undeclared")),
];

/// A neighbour topology over a topic holding [`NEIGHBOUR_RECORDS`] records.
async fn neighbour(kafka: &Kafka, dir: &TempDir) -> anyhow::Result<(String, String, std::path::PathBuf)> {
    let (input, output) = (unique_name("neighbour-in"), unique_name("neighbour-out"));
    kafka.create_topic(&input, 1).await?;
    kafka.create_topic(&output, 1).await?;
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..NEIGHBOUR_RECORDS)
        .map(|i| {
            (
                format!("k{i}").into_bytes(),
                format!("neighbour record {i}").into_bytes(),
            )
        })
        .collect();
    kafka.produce(&input, &records).await?;
    let name = unique_name("neighbour");
    let path = dir.write(
        &format!("{name}.toml"),
        &manifest(
            &name,
            &guest("uppercase"),
            &[("input", &input)],
            &[("output", &output)],
            "",
        ),
    );
    Ok((name, input, path))
}

/// Records per second the neighbour commits, from its first commit to its last record.
async fn throughput(kafka: &Kafka, group: &str, input: &str, worker: &WorkerProcess) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut first: Option<(Instant, i64)> = None;
    loop {
        let committed = kafka.committed_offset(group, input, 0).unwrap_or(None).unwrap_or(0);
        let now = Instant::now();
        if committed > 0 && first.is_none() {
            first = Some((now, committed));
        }
        if committed as usize >= NEIGHBOUR_RECORDS {
            let (t0, c0) = first.expect("a first commit");
            let secs = now.duration_since(t0).as_secs_f64().max(0.001);
            return Ok((committed - c0) as f64 / secs);
        }
        if now > deadline {
            anyhow::bail!(
                "the neighbour committed {committed} of {NEIGHBOUR_RECORDS}; log:\n{}",
                worker.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `sluice_task_errors_total` by (topology, kind), from the metrics endpoint.
fn task_errors(port: u16) -> anyhow::Result<BTreeMap<(String, String), u64>> {
    let body = http_get(port, "/metrics")?;
    let mut out = BTreeMap::new();
    for line in body.lines().filter(|l| l.starts_with("sluice_task_errors_total{")) {
        let label = |name: &str| {
            line.split(&format!("{name}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        let value: u64 = line.rsplit(' ').next().unwrap_or("0").parse().unwrap_or(0);
        out.insert((label("topology"), label("kind")), value);
    }
    Ok(out)
}

/// The neighbour's throughput on a worker of its own, configured as the one beside the
/// attacks (with `--metrics`, whose admin server costs the worker by itself).
async fn neighbour_alone(kafka: &Kafka, dir: &TempDir, common: &[&str]) -> anyhow::Result<f64> {
    let (name, input, path) = neighbour(kafka, dir).await?;
    let mut args: Vec<String> = common.iter().map(|s| s.to_string()).collect();
    args.extend(["--topology".into(), path.to_str().unwrap().into()]);
    args.extend(["--metrics".into(), format!("127.0.0.1:{}", free_port())]);
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut alone = WorkerProcess::start(kafka.bootstrap(), dir.path(), &arg_refs)?;
    let rate = throughput(kafka, &format!("sluice-{name}"), &input, &alone).await?;
    assert!(alone.terminate(Duration::from_secs(30))?.success(), "{}", alone.log());
    Ok(rate)
}

/// Runs of the whole comparison at most: a second only if the first's ratio is below the
/// bound. The ratio compares runs a minute apart on a shared machine (in one CI run a
/// neighbour alone measured 291,660 and 389,247 records/s before and after); an attack
/// that costs the neighbour (a loop not stopped, a flood not charged) fails both.
const TRIALS: usize = 2;

#[tokio::test(flavor = "multi_thread")]
async fn hostile_guests_beside_a_neighbour_cost_only_themselves() -> anyhow::Result<()> {
    let kafka = kafka();
    let mut ratios = Vec::new();
    for trial in 1..=TRIALS {
        let (alone, beside) = hostile_trial(kafka).await?;
        let ratio = beside / alone;
        ratios.push(format!(
            "{:.0}% ({beside:.0} against {alone:.0} records/s)",
            100.0 * ratio
        ));
        if ratio >= 0.8 {
            return Ok(());
        }
        println!(
            "trial {trial}: the neighbour kept {} of its rate beside the attacks",
            ratios[trial - 1]
        );
    }
    panic!(
        "the neighbour slowed beside the attacks in each of {TRIALS} trials: it kept {}",
        ratios.join(", then ")
    );
}

/// One run of the comparison: every other check is hard; returns the neighbour's rate
/// alone (the mean of a run before and one after) and beside the attacks.
async fn hostile_trial(kafka: &Kafka) -> anyhow::Result<(f64, f64)> {
    let dir = TempDir::new("hostile");
    let state = dir.path().join("state");
    let common = [
        "--commit-interval",
        "100ms",
        "--host-memory-limit",
        "32MiB",
        "--state-dir",
        state.to_str().unwrap(),
    ];

    // 1. The neighbour alone (again after the attacks, below: other tests share the
    // machine, so the reference is the mean of a run before and a run after).
    let alone_first = neighbour_alone(kafka, &dir, &common).await?;

    // 2. The neighbour again, on fresh input, beside every attack.
    let (name, input, path) = neighbour(kafka, &dir).await?;
    let mut args: Vec<String> = common.iter().map(|s| s.to_string()).collect();
    args.extend(["--topology".into(), path.to_str().unwrap().into()]);
    let mut hostile = Vec::new();
    let attacks: Vec<(String, &str, Option<&str>)> = ATTACKS
        .iter()
        .map(|(attack, kind)| (attack.to_string(), "hostile", *kind))
        .chain([("x".to_string(), "hostile", Some("trap"))])
        .collect();
    for (i, (attack, component, kind)) in attacks.iter().enumerate() {
        let label = if i == attacks.len() - 1 {
            "init-trap"
        } else {
            attack.as_str()
        };
        let topology = unique_name(&format!("hostile-{label}"));
        let (hin, hout) = (unique_name("hostile-in"), unique_name("hostile-out"));
        kafka.create_topic(&hin, 1).await?;
        kafka.create_topic(&hout, 1).await?;
        // The attack, then two ordinary records (which only the survivors pass on).
        kafka
            .produce_to(&hin, 0, &[("a", attack.as_str()), ("b", "after-1"), ("c", "after-2")])
            .await?;
        let limits = match attack.as_str() {
            "loop" => "call-timeout = \"500ms\"",
            "state-fill" => "state = \"2MiB\"",
            _ => "",
        };
        let m = dir.write(
            &format!("{topology}.toml"),
            &manifest(
                &topology,
                &guest(component),
                &[("input", &hin)],
                &[("output", &hout)],
                limits,
            ),
        );
        args.extend(["--topology".into(), m.to_str().unwrap().into()]);
        hostile.push((topology, hout, *kind));
    }
    // Components that cannot even be loaded are refused alone.
    for component in ["hostile-describe-loop", "hostile-describe-trap", "hostile-store-name"] {
        let (hin, hout) = (unique_name("refused-in"), unique_name("refused-out"));
        let topology = unique_name(component);
        let m = dir.write(
            &format!("{topology}.toml"),
            &manifest(
                &topology,
                &guest(component),
                &[("input", &hin)],
                &[("output", &hout)],
                "",
            ),
        );
        args.extend(["--topology".into(), m.to_str().unwrap().into()]);
    }
    let metrics = free_port();
    args.extend(["--metrics".into(), format!("127.0.0.1:{metrics}")]);
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &arg_refs)?;
    let beside_rate = throughput(kafka, &format!("sluice-{name}"), &input, &worker).await?;

    // Each attack cost only its own task, with a fault naming the cause.
    let deadline = Instant::now() + Duration::from_secs(60);
    for (topology, output, kind) in &hostile {
        match kind {
            Some(kind) => loop {
                let errors = task_errors(metrics)?;
                let got: Vec<&String> = errors.keys().filter(|(t, _)| t == topology).map(|(_, k)| k).collect();
                if got.iter().any(|k| k.as_str() == *kind) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{topology}: expected a {kind} fault, saw {got:?}; log:\n{}",
                    worker.log()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            },
            None => {
                let received = kafka.consume(output, 3, Duration::from_secs(60)).await?;
                assert_eq!(received.len(), 3, "{topology} keeps running");
                assert!(
                    !task_errors(metrics)?.keys().any(|(t, _)| t == topology),
                    "{topology} faulted"
                );
            }
        }
    }
    let rss = worker.peak_rss()?;
    let started = Instant::now();
    let status = worker.terminate(Duration::from_secs(30))?;
    let stop = started.elapsed();
    let log = worker.log();
    let alone_second = neighbour_alone(kafka, &dir, &common).await?;
    let alone_rate = (alone_first + alone_second) / 2.0;
    for component in ["hostile-describe-loop", "hostile-describe-trap", "hostile-store-name"] {
        let name = component.replace('-', "_");
        assert!(
            log.contains("not running a topology") && log.contains(&format!("{name}.wasm")),
            "{component} should be refused by name; log:\n{log}"
        );
    }
    println!(
        "hostile suite: neighbour alone {alone_rate:.0} records/s ({alone_first:.0} before, {alone_second:.0} after), \
         beside {} attacks {beside_rate:.0} records/s ({:.0}%); peak RSS {} MiB; SIGTERM to exit {stop:?}",
        hostile.len() + 3,
        100.0 * beside_rate / alone_rate,
        rss >> 20
    );
    assert_eq!(
        status.code(),
        Some(3),
        "tasks failed, so the worker says so; log:\n{log}"
    );
    assert!(stop < Duration::from_secs(30), "stopping took {stop:?}");
    assert!(rss < PEAK_RSS_BOUND, "peak RSS {} MiB", rss >> 20);
    Ok((alone_rate, beside_rate))
}

/// `sluice_task_failed` of `topology`'s partition 0 (none before the task reports).
fn task_failed(port: u16, topology: &str) -> anyhow::Result<Option<u64>> {
    let body = http_get(port, "/metrics")?;
    let task = format!("task=\"{topology}/0\"");
    Ok(body
        .lines()
        .find(|l| l.starts_with("sluice_task_failed{") && l.contains(&task))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_whose_sink_is_deleted_stalls_only_itself() -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("stuck-sink");
    let mut args = Vec::new();
    let mut topologies = Vec::new();
    for who in ["stuck", "flowing"] {
        let (input, output) = (unique_name(&format!("{who}-in")), unique_name(&format!("{who}-out")));
        kafka.create_topic(&input, 1).await?;
        kafka.create_topic(&output, 1).await?;
        let name = unique_name(who);
        let m = dir.write(
            &format!("{who}.toml"),
            &manifest(
                &name,
                &guest("uppercase"),
                &[("input", &input)],
                &[("output", &output)],
                "",
            ),
        );
        args.extend(["--topology".to_string(), m.to_str().unwrap().to_string()]);
        topologies.push((name, input, output));
    }
    let metrics = free_port();
    let state = dir.path().join("state");
    args.extend([
        "--metrics".to_string(),
        format!("127.0.0.1:{metrics}"),
        "--state-dir".to_string(),
        state.to_str().unwrap().to_string(),
    ]);
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &arg_refs)?;
    for (_, input, output) in &topologies {
        kafka.produce_to(input, 0, &[("k", "warm-up")]).await?;
        kafka.consume(output, 1, Duration::from_secs(60)).await?;
    }
    let [(stuck, stuck_in, stuck_out), (_, flowing_in, flowing_out)] = &topologies[..] else {
        unreachable!()
    };

    // The stuck tenant's sink disappears and a backlog arrives for it: its records cannot
    // be delivered (the producer holds them until the topic is declared gone, 30 s later).
    kafka.delete_topic(stuck_out).await?;
    let backlog: Vec<(Vec<u8>, Vec<u8>)> = (0..150_000)
        .map(|i| (format!("k{i}").into_bytes(), format!("stuck record {i}").into_bytes()))
        .collect();
    kafka.produce(stuck_in, &backlog).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The other tenant's records flow while the stuck task is still stuck (not failed yet).
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..1_000)
        .map(|i| (format!("k{i}").into_bytes(), format!("flowing record {i}").into_bytes()))
        .collect();
    kafka.produce(flowing_in, &records).await?;
    let received = kafka.consume(flowing_out, 1_001, Duration::from_secs(120)).await?;
    assert_eq!(received.len(), 1_001);
    assert_eq!(
        task_failed(metrics, stuck)?,
        Some(0),
        "the flowing tenant should not have waited for the stuck one to fail; log:\n{}",
        worker.log()
    );

    // SIGTERM while a task waits for room to produce: it gives up waiting and the worker
    // stops in time.
    let started = std::time::Instant::now();
    worker.terminate(Duration::from_secs(30))?;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "stopping took {:?}",
        started.elapsed()
    );
    Ok(())
}

/// `on-error = "skip"` goes on past a record that ran into its deadline, in a fresh
/// instance: the records after it, in later batches, are processed (they were once skipped
/// or failed the task, because the next call went to the instance that had faulted).
#[tokio::test(flavor = "multi_thread")]
async fn skipping_a_record_that_loops_goes_on_with_the_next_batches() -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("skip-loop");
    let (input, output) = (unique_name("skip-in"), unique_name("skip-out"));
    kafka.create_topic(&input, 1).await?;
    kafka.create_topic(&output, 1).await?;
    let name = unique_name("skip-loop");
    let text = format!(
        "on-error = \"skip\"\n{}",
        manifest(
            &name,
            &guest("hostile"),
            &[("input", &input)],
            &[("output", &output)],
            "call-timeout = \"200ms\"",
        )
    );
    let m = dir.write(&format!("{name}.toml"), &text);
    let state = dir.path().join("state");
    let mut worker = WorkerProcess::start(
        kafka.bootstrap(),
        dir.path(),
        &[
            "--topology",
            m.to_str().unwrap(),
            "--batch-size",
            "1",
            "--commit-interval",
            "100ms",
            "--punctuate-interval",
            "50ms",
            "--state-dir",
            state.to_str().unwrap(),
        ],
    )?;
    let values = ["loop", "after-1", "loop", "after-2", "after-3"];
    let records: Vec<(&str, &str)> = values.iter().map(|v| ("k", *v)).collect();
    kafka.produce_to(&input, 0, &records).await?;
    let got = kafka.consume(&output, 3, Duration::from_secs(60)).await;
    let got: Vec<String> = got
        .map_err(|e| anyhow::anyhow!("{e:#}\nworker log:\n{}", worker.log()))?
        .iter()
        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect();
    assert_eq!(got, ["after-1", "after-2", "after-3"], "{}", worker.log());
    // Every record, the skipped ones too, is committed past.
    let group = format!("sluice-{name}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while kafka.committed_offset(&group, &input, 0).unwrap_or(None) != Some(values.len() as i64) {
        assert!(
            Instant::now() < deadline,
            "not committed past all records:\n{}",
            worker.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(worker.terminate(Duration::from_secs(30))?.success(), "{}", worker.log());
    Ok(())
}

/// A guest that loops until its deadline on every record (on-error = skip) shares one
/// stream thread with a neighbour: the neighbour's records all get through while the
/// looping guest goes on, record after record. (Before, the worker halved the looping
/// batch at once, 2n - 1 calls at the deadline holding the thread: 40 s for these 200.)
#[tokio::test(flavor = "multi_thread")]
async fn a_guest_looping_on_every_record_leaves_its_stream_thread_to_the_others() -> anyhow::Result<()> {
    const LOOPS: usize = 200;
    const NEIGHBOUR: usize = 20_000;
    let kafka = kafka();
    let dir = TempDir::new("loop-neighbour");
    let (a_in, a_out, b_in, b_out) = (
        unique_name("loop-in"),
        unique_name("loop-out"),
        unique_name("nb-in"),
        unique_name("nb-out"),
    );
    for t in [&a_in, &a_out, &b_in, &b_out] {
        kafka.create_topic(t, 1).await?;
    }
    let (a, b) = (unique_name("looping"), unique_name("neighbour"));
    let a_manifest = dir.write(
        &format!("{a}.toml"),
        &format!(
            "on-error = \"skip\"\n{}",
            manifest(
                &a,
                &guest("hostile"),
                &[("input", &a_in)],
                &[("output", &a_out)],
                "call-timeout = \"100ms\""
            )
        ),
    );
    let b_manifest = dir.write(
        &format!("{b}.toml"),
        &manifest(&b, &guest("uppercase"), &[("input", &b_in)], &[("output", &b_out)], ""),
    );
    let loops: Vec<(&str, &str)> = (0..LOOPS).map(|_| ("k", "loop")).collect();
    kafka.produce_to(&a_in, 0, &loops).await?;
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..NEIGHBOUR)
        .map(|i| (format!("k{i}").into_bytes(), format!("v{i}").into_bytes()))
        .collect();
    kafka.produce(&b_in, &records).await?;
    let state = dir.path().join("state");
    let mut worker = WorkerProcess::start(
        kafka.bootstrap(),
        dir.path(),
        &[
            "--topology",
            a_manifest.to_str().unwrap(),
            "--topology",
            b_manifest.to_str().unwrap(),
            "--threads",
            "1",
            "--commit-interval",
            "100ms",
            "--state-dir",
            state.to_str().unwrap(),
        ],
    )?;
    let got = kafka.consume(&b_out, NEIGHBOUR, Duration::from_secs(20)).await;
    let got = got.map_err(|e| anyhow::anyhow!("the neighbour starved: {e:#}\nlog:\n{}", worker.log()))?;
    assert_eq!(got.len(), NEIGHBOUR);
    // The looping guest goes on: it is skipping records, one after another, and its task
    // has not failed.
    let group = format!("sluice-{a}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let skipped = kafka.committed_offset(&group, &a_in, 0).unwrap_or(None).unwrap_or(0);
        if skipped >= 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the looping guest is stuck at {skipped}:\n{}",
            worker.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!worker.log().contains("stays failed"), "{}", worker.log());
    assert!(worker.terminate(Duration::from_secs(30))?.success(), "{}", worker.log());
    Ok(())
}

/// Under exactly-once a stream thread commits all its tasks in one transaction, so a guest
/// that fails with records in it takes the transaction down: the tasks sharing its thread
/// go back to their last commit (in place: they do not start again or restore) and carry
/// on. Here hostile guests fail beside a neighbour on one stream thread, each after emitting
/// two records in the open transaction; the neighbour's read-committed output still holds
/// every input record exactly once, the failed tasks' records never become visible, and
/// each hostile task fails alone with its own fault.
#[tokio::test(flavor = "multi_thread")]
async fn under_exactly_once_a_failing_guest_takes_its_threads_transaction_down_and_the_neighbour_stays_exact(
) -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("hostile-eos");
    let (input, output) = (unique_name("eos-neighbour-in"), unique_name("eos-neighbour-out"));
    kafka.create_topic(&input, 1).await?;
    kafka.create_topic(&output, 1).await?;
    let name = unique_name("eos-neighbour");
    let neighbour = dir.write(
        &format!("{name}.toml"),
        &manifest(
            &name,
            &guest("uppercase"),
            &[("input", &input)],
            &[("output", &output)],
            "",
        ),
    );
    let mut args: Vec<String> = [
        "--processing-guarantee",
        "exactly-once",
        "--threads",
        "1",
        "--state-dir",
        dir.path().join("state").to_str().unwrap(),
        "--topology",
        neighbour.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut hostile = Vec::new();
    for (attack, kind) in [("stack", "trap"), ("bad-count", "bad_output"), ("state-fill", "quota")] {
        let topology = unique_name(&format!("eos-hostile-{attack}"));
        let (hin, hout) = (unique_name("eos-hostile-in"), unique_name("eos-hostile-out"));
        kafka.create_topic(&hin, 1).await?;
        kafka.create_topic(&hout, 1).await?;
        let limits = if attack == "state-fill" { "state = \"2MiB\"" } else { "" };
        let m = dir.write(
            &format!("{topology}.toml"),
            &manifest(
                &topology,
                &guest("hostile"),
                &[("input", &hin)],
                &[("output", &hout)],
                limits,
            ),
        );
        args.extend(["--topology".into(), m.to_str().unwrap().into()]);
        hostile.push((topology, hin, hout, attack, kind));
    }
    let metrics = free_port();
    args.extend(["--metrics".into(), format!("127.0.0.1:{metrics}")]);
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &arg_refs)?;

    // The neighbour's input flows while the attacks come: 40 chunks of 500, 50 ms apart.
    let total = 20_000usize;
    let producing = {
        let input = input.clone();
        tokio::spawn(async move {
            for chunk in 0..40 {
                let records: Vec<(Vec<u8>, Vec<u8>)> = (chunk * 500..(chunk + 1) * 500)
                    .map(|i| (format!("k{i}").into_bytes(), format!("record {i}").into_bytes()))
                    .collect();
                sluice_tests::kafka().produce(&input, &records).await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            anyhow::Ok(())
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    for (_, hin, _, attack, _) in &hostile {
        // Two ordinary records (emitted into the open transaction), then the attack.
        kafka
            .produce_to(hin, 0, &[("b", "before-1"), ("c", "before-2"), ("a", attack)])
            .await?;
    }
    producing.await??;

    let deadline = Instant::now() + Duration::from_secs(90);
    for (topology, _, _, _, kind) in &hostile {
        loop {
            let errors = task_errors(metrics)?;
            if errors.keys().any(|(t, k)| t == topology && k == kind) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{topology}: expected a {kind} fault, saw {errors:?}; log:\n{}",
                worker.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    kafka
        .wait_committed(
            &format!("sluice-{name}"),
            &input,
            1,
            total as i64,
            Duration::from_secs(90),
        )
        .await?;
    let log = worker.log();
    let status = worker.terminate(Duration::from_secs(30))?;
    assert_eq!(
        status.code(),
        Some(3),
        "tasks failed, so the worker says so; log:\n{log}"
    );

    // The neighbour: every input record upper-cased exactly once, read committed.
    let out = kafka.read_all(&output, Duration::from_secs(60))?;
    let mut values: Vec<String> = out
        .iter()
        .map(|r| String::from_utf8(r.value.clone().unwrap_or_default()).unwrap())
        .collect();
    values.sort_unstable();
    let mut expected: Vec<String> = (0..total).map(|i| format!("RECORD {i}")).collect();
    expected.sort_unstable();
    assert_eq!(
        values.len(),
        total,
        "the neighbour's output holds each record exactly once"
    );
    assert_eq!(values, expected);
    // The failed tasks' records were in aborted transactions: none is visible.
    for (topology, _, hout, _, _) in &hostile {
        let seen = kafka.read_all(hout, Duration::from_secs(30))?;
        assert!(
            seen.is_empty(),
            "{topology}: {} record(s) of a failed task became visible",
            seen.len()
        );
    }
    // The transaction went down with the failing tasks, and the neighbour went back in
    // place: it started once.
    assert!(
        log.contains("the stream thread's transaction aborted"),
        "no transaction aborted; log:\n{log}"
    );
    let starts = log
        .lines()
        .filter(|l| l.contains("sluice::task::start: started") && l.contains(&format!("task={name}/0")))
        .count();
    assert_eq!(starts, 1, "the neighbour started again; log:\n{log}");
    Ok(())
}

/// A topology whose `describe-operators` traps (`hostile-operators-trap`: the DSL word
/// count, its counts in a record cache) is still made to send on what its cache holds
/// before every commit. Under exactly-once, with punctuation an hour away, every word's
/// last count is in the sink once its input is committed. (Taken for a topology that holds
/// nothing back, its commits took the counts' changelog writes and offsets without the
/// totals, which only the next punctuation sent: a kill in between lost them for good.)
#[tokio::test(flavor = "multi_thread")]
async fn a_topology_whose_operator_description_traps_is_flushed_before_every_commit() -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("operators-trap");
    let (lines, totals) = (
        unique_name("operators-trap-lines"),
        unique_name("operators-trap-totals"),
    );
    kafka.create_topic(&lines, 2).await?;
    kafka.create_topic(&totals, 2).await?;
    let name = unique_name("operators-trap");
    let m = dir.write(
        &format!("{name}.toml"),
        &manifest(
            &name,
            &guest("hostile-operators-trap"),
            &[("lines", &lines)],
            &[("totals", &totals)],
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
            "--processing-guarantee",
            "exactly-once",
            "--commit-interval",
            "100ms",
            // A task's first batch punctuates (its stream time starts), the next not for an
            // hour; batches of one record leave everything after that first record to the
            // flush before each commit.
            "--punctuate-interval",
            "1h",
            "--batch-size",
            "1",
            "--state-dir",
            state.to_str().unwrap(),
        ],
    )?;
    let mut truth: BTreeMap<String, u64> = BTreeMap::new();
    let group = format!("sluice-{name}");
    let mut sent = 0;
    // Two rounds: the second comes to tasks that have punctuated (see below).
    for round in 0..2 {
        let records: Vec<(Vec<u8>, Vec<u8>)> = (0..150)
            .map(|i| {
                let line = format!("w{} w{} w{}", (i + round) % 11, i % 7, (i * 3) % 13);
                for w in line.split(' ') {
                    *truth.entry(w.to_string()).or_default() += 1;
                }
                (format!("k{i}").into_bytes(), line.into_bytes())
            })
            .collect();
        kafka.produce(&lines, &records).await?;
        sent += records.len() as i64;
        kafka
            .wait_committed(&group, &lines, 2, sent, Duration::from_secs(60))
            .await
            .map_err(|e| anyhow::anyhow!("{e}; log:\n{}", worker.log()))?;
        if round == 0 {
            // Both `words` tasks have sent something (each word's totals go to the sink
            // partition of its task): each has had its first punctuation, so round 1's
            // counts reach the sink only through the flush before a commit.
            let deadline = Instant::now() + Duration::from_secs(30);
            while kafka
                .read_all(&totals, Duration::from_secs(30))?
                .iter()
                .map(|r| r.partition)
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                < 2
            {
                assert!(
                    Instant::now() < deadline,
                    "no totals from both tasks:\n{}",
                    worker.log()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let last = |out: &[sluice_tests::Received]| -> BTreeMap<String, u64> {
        out.iter()
            .filter_map(|r| {
                let key = String::from_utf8_lossy(r.key.as_deref()?).into_owned();
                let value = u64::from_be_bytes(r.value.as_deref()?.try_into().ok()?);
                Some((key, value))
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = last(&kafka.read_all(&totals, Duration::from_secs(30))?);
        if got == truth {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the last totals are not the counts:\n  got   {got:?}\n  truth {truth:?}\nlog:\n{}",
            worker.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        worker.log().contains("describing its operators"),
        "the trap is seen and said: {}",
        worker.log()
    );
    assert!(worker.terminate(Duration::from_secs(30))?.success(), "{}", worker.log());
    Ok(())
}
