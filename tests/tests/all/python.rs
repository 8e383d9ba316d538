//! Topologies written in Python (built by componentize-py from `guests/python/`), on real
//! workers and a real broker: beside a Rust topology on one worker through SIGKILLs, under
//! both guarantees; a Rust topology taking over the store a Python one wrote (the codecs
//! write the same bytes); and the hostile cases that apply to Python, each contained.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_tests::worker::{guest, shared_compile_cache, TempDir, WorkerProcess};
use sluice_tests::{free_port, kafka, unique_name, Scenario};

use crate::cluster::until_settled;
use crate::registry::{deploy, manifest, worker};

const PARTITIONS: i32 = 4;

fn lines(range: std::ops::Range<usize>) -> Vec<(Vec<u8>, Vec<u8>)> {
    range
        .map(|i| {
            let words: Vec<String> = (0..3).map(|j| format!("w{}", (i * 7 + j * 13) % 40)).collect();
            (format!("line-{i}").into_bytes(), words.join(" ").into_bytes())
        })
        .collect()
}

/// A Python uppercase and the Rust word count on one worker (one process, one thread pool,
/// one pooling allocator), the worker killed twice while input flows. Under exactly-once
/// the Python output holds each input once, upper-cased, and every count is exact; under
/// at-least-once nothing is missing and no count is below the truth.
async fn python_beside_rust_through_kills(guarantee: &str) -> anyhow::Result<()> {
    let upper = Scenario::builder("pyup", "python/uppercase")
        .source("input", PARTITIONS)
        .sink("output", PARTITIONS)
        .create()
        .await?;
    let wc = Scenario::builder("pywc", "word-count")
        .source("lines", PARTITIONS)
        .sink("counts", PARTITIONS)
        .create()
        .await?;
    let state = upper.state();
    let cache = shared_compile_cache();
    let start = || {
        let mut args = vec![
            "--topology",
            upper.manifest().to_str().unwrap(),
            "--topology",
            wc.manifest().to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
            "--processing-guarantee",
            guarantee,
            "--commit-interval",
            "100ms",
            "--batch-size",
            "100",
        ];
        args.extend(cache.iter().map(String::as_str));
        WorkerProcess::start(kafka().bootstrap(), upper.dir().path(), &args)
    };
    let chunks = 16;
    let per_chunk = 250;
    let total = chunks * per_chunk;
    let producing = {
        let (a, b) = (upper.input().to_string(), wc.input().to_string());
        tokio::spawn(async move {
            let mut positions = Vec::new();
            for chunk in 0..chunks {
                let records = lines(chunk * per_chunk..(chunk + 1) * per_chunk);
                kafka().produce(&a, &records).await?;
                positions.extend(kafka().produce(&b, &records).await?);
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            anyhow::Ok(positions)
        })
    };
    let mut worker = start()?;
    // The first start may compile the Python component (seconds): kill once it runs.
    worker.wait_for_line(&[upper.name(), "started"], Duration::from_secs(180))?;
    for wait in [700, 1300] {
        tokio::time::sleep(Duration::from_millis(wait)).await;
        worker.kill()?;
        worker = start()?;
    }
    let positions = producing.await??;
    for s in [&upper, &wc] {
        if let Err(e) = s.wait_committed(total, Duration::from_secs(180)).await {
            panic!("{e:#}; the last worker's log:\n{}", worker.log());
        }
    }
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());

    // The Python topology: every input upper-cased, with its key.
    let mut expected: BTreeMap<(Vec<u8>, Vec<u8>), usize> = BTreeMap::new();
    for (k, v) in lines(0..total) {
        *expected.entry((k, v.to_ascii_uppercase())).or_default() += 1;
    }
    let mut got: BTreeMap<(Vec<u8>, Vec<u8>), usize> = BTreeMap::new();
    for r in upper.read_all(Duration::from_secs(120))? {
        *got.entry((r.key.unwrap_or_default(), r.value.unwrap_or_default()))
            .or_default() += 1;
    }
    if guarantee == "exactly-once" {
        assert_eq!(got.len(), expected.len(), "distinct outputs of the Python topology");
        assert!(
            got == expected,
            "the Python topology's committed output is not each input exactly once"
        );
    } else {
        for record in expected.keys() {
            assert!(got.contains_key(record), "the Python topology lost {record:?}");
        }
        assert!(
            got.keys().all(|k| expected.contains_key(k)),
            "an output that is no input's"
        );
    }

    // The Rust topology beside it: its counts.
    let mut truth: BTreeMap<i32, BTreeMap<String, u64>> = BTreeMap::new();
    for ((_, line), (p, _)) in lines(0..total).iter().zip(&positions) {
        for w in std::str::from_utf8(line)?.split(' ') {
            *truth.entry(*p).or_default().entry(w.to_string()).or_insert(0) += 1;
        }
    }
    for (p, words) in &truth {
        let counts = sluice_tests::worker::dump_counts(&state, wc.name(), *p, "counts")?;
        for (word, n) in words {
            let c = counts.get(word).copied().unwrap_or(0);
            if guarantee == "exactly-once" {
                assert_eq!(c, *n, "partition {p}, {word}");
            } else {
                assert!(c >= *n, "partition {p}, {word}: {c} < {n}");
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_topology_beside_a_rust_one_is_exact_through_kills_under_exactly_once() -> anyhow::Result<()> {
    python_beside_rust_through_kills("exactly-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_topology_beside_a_rust_one_loses_nothing_through_kills_under_at_least_once() -> anyhow::Result<()> {
    python_beside_rust_through_kills("at-least-once").await
}

/// The word count deployed in Python, then upgraded to the Rust word count under the same
/// name: the Rust one reads the counts the Python one wrote (UTF-8 words, 8-byte big-endian
/// counts) and goes on from them, and the store holds the truth over both.
#[tokio::test(flavor = "multi_thread")]
async fn a_rust_topology_takes_over_the_store_a_python_one_wrote() -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("py2rust-in"), unique_name("py2rust-out"));
    kafka.create_topic(&input, 2).await?;
    kafka.create_topic(&output, 2).await?;
    let dir = TempDir::new("py2rust");
    let cluster = unique_name("c");
    let port = free_port();
    let cache = shared_compile_cache();
    let cache: Vec<&str> = cache.iter().map(String::as_str).collect();
    let mut workers = vec![worker(&dir, &cluster, 0, port, &cache)?];
    workers[0].wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let name = unique_name("wc");
    let m = dir.write(
        "wc.toml",
        &manifest(&name, &[("lines", input.as_str())], &[("counts", output.as_str())], ""),
    );
    let (ok, _, err) = deploy(port, &guest("python/word-count"), &m)?;
    assert!(ok, "deploying the Python word count: {err}");
    until_settled(&mut workers, 2).await?;
    // One key: every line in one partition, so one task holds the counts. Words with
    // non-ASCII letters and digits, cased: both split and lower-case them alike.
    let line = |i: usize| {
        (
            b"same".to_vec(),
            format!("Äpfel apple{} {} Ωmega", i % 3, i % 2).into_bytes(),
        )
    };
    kafka.produce(&input, &(0..100).map(line).collect::<Vec<_>>()).await?;
    if let Err(e) = kafka
        .wait_committed(&format!("sluice-{name}"), &input, 2, 100, Duration::from_secs(180))
        .await
    {
        panic!("{e:#}; the worker's log:\n{}", workers[0].log());
    }

    let (ok, out, err) = deploy(port, &guest("word-count"), &m)?;
    assert!(ok, "upgrading to the Rust word count: {err}");
    assert!(out.contains("\"version\": 2"), "{out}");
    workers[0].wait_for_line(&["deployed from the registry", "version=2"], Duration::from_secs(60))?;
    until_settled(&mut workers, 2).await?;
    kafka.produce(&input, &(100..200).map(line).collect::<Vec<_>>()).await?;
    kafka
        .wait_committed(&format!("sluice-{name}"), &input, 2, 200, Duration::from_secs(180))
        .await?;
    assert!(
        workers[0].terminate(Duration::from_secs(60))?.success(),
        "{}",
        workers[0].log()
    );

    let mut truth: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..200 {
        for w in String::from_utf8(line(i).1)?.split(' ') {
            *truth.entry(w.to_lowercase()).or_default() += 1;
        }
    }
    // The highest count each version emitted: the Rust one's go on from the Python one's.
    let mut highest: BTreeMap<String, u64> = BTreeMap::new();
    for r in kafka.read_all(&output, Duration::from_secs(10))? {
        let word = String::from_utf8(r.key.unwrap())?;
        let count: u64 = String::from_utf8(r.value.unwrap())?.parse()?;
        let h = highest.entry(word).or_default();
        *h = (*h).max(count);
    }
    assert_eq!(highest, truth, "the counts over both versions");
    let state = dir.path().join("state-0");
    let mut stored = BTreeMap::new();
    for p in 0..2 {
        stored.extend(sluice_tests::worker::dump_counts(&state, &name, p, "counts")?);
    }
    assert_eq!(stored, truth, "the store after both versions");
    Ok(())
}

/// (record value, the fault kind it must end its task with).
const PYTHON_ATTACKS: &[(&str, &str)] = &[
    ("loop", "deadline"),
    ("alloc", "error"),
    ("hoard", "error"),
    ("recursion", "error"),
    ("deep-recursion", "memory"),
    ("exit", "error"),
    ("os-exit", "trap"),
    ("bad-count", "bad_output"),
    ("undeclared-sink", "undeclared"),
    ("undeclared-store", "undeclared"),
    ("state-bomb", "memory"),
    ("init-raise", "error"),
];

/// `sluice_task_errors_total` by (topology, kind), from the metrics endpoint.
fn task_errors(port: u16) -> anyhow::Result<BTreeMap<(String, String), u64>> {
    let body = sluice_tests::http_get(port, "/metrics")?;
    let mut out = BTreeMap::new();
    for line in body.lines().filter(|l| l.starts_with("sluice_task_errors_total{")) {
        let label = |name: &str| {
            line.split(&format!("{name}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        out.insert(
            (label("topology"), label("kind")),
            line.rsplit(' ').next().unwrap_or("0").parse()?,
        );
    }
    Ok(out)
}

/// Every attack a Python topology can make, each a topology of its own on one worker beside
/// a Python neighbour: each ends its own task with the fault it should (a Python exception
/// is the topology's error, with its traceback), the neighbour processes everything, and the
/// worker stays up until SIGTERM.
#[tokio::test(flavor = "multi_thread")]
async fn hostile_python_topologies_cost_only_themselves() -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("pyhostile");
    let state = dir.path().join("state");
    let cache = shared_compile_cache();
    let mut args: Vec<String> = vec![
        "--commit-interval".into(),
        "100ms".into(),
        "--host-memory-limit".into(),
        "32MiB".into(),
        "--state-dir".into(),
        state.display().to_string(),
    ];
    args.extend(cache.iter().cloned());
    let (nin, nout) = (unique_name("pyneighbour-in"), unique_name("pyneighbour-out"));
    kafka.create_topic(&nin, 2).await?;
    kafka.create_topic(&nout, 2).await?;
    let neighbour = unique_name("pyneighbour");
    let m = dir.write(
        "neighbour.toml",
        &sluice_tests::worker::manifest(
            &neighbour,
            &guest("python/uppercase"),
            &[("input", &nin)],
            &[("output", &nout)],
            "",
        ),
    );
    args.extend(["--topology".into(), m.display().to_string()]);
    let mut attacks = Vec::new();
    for (attack, kind) in PYTHON_ATTACKS {
        let topology = unique_name(&format!("pyhostile-{attack}"));
        let (hin, hout) = (unique_name("pyhostile-in"), unique_name("pyhostile-out"));
        kafka.create_topic(&hin, 1).await?;
        kafka.create_topic(&hout, 1).await?;
        kafka
            .produce_to(&hin, 0, &[("a", "before"), ("b", attack), ("c", "after")])
            .await?;
        let limits = if *attack == "loop" {
            "call-timeout = \"500ms\""
        } else {
            ""
        };
        let m = dir.write(
            &format!("{topology}.toml"),
            &sluice_tests::worker::manifest(
                &topology,
                &guest("python/hostile"),
                &[("input", &hin)],
                &[("output", &hout)],
                limits,
            ),
        );
        args.extend(["--topology".into(), m.display().to_string()]);
        attacks.push((topology, *attack, *kind));
    }
    let metrics = free_port();
    args.extend(["--metrics".into(), format!("127.0.0.1:{metrics}")]);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &refs)?;

    let sent: Vec<(Vec<u8>, Vec<u8>)> = (0..5000)
        .map(|i| {
            (
                format!("k{i}").into_bytes(),
                format!("neighbour record {i}").into_bytes(),
            )
        })
        .collect();
    kafka.produce(&nin, &sent).await?;

    // Every attack's task ends with a fault; then each must be the one expected.
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let seen = loop {
        let errors = task_errors(metrics).unwrap_or_default();
        let seen: BTreeMap<&str, Vec<String>> = attacks
            .iter()
            .map(|(topology, attack, _)| {
                let kinds = errors.keys().filter(|(t, _)| t == topology).map(|(_, k)| k.clone());
                (*attack, kinds.collect())
            })
            .collect();
        if seen.values().all(|kinds| !kinds.is_empty()) || std::time::Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let expected: BTreeMap<&str, Vec<String>> = attacks
        .iter()
        .map(|(_, attack, kind)| (*attack, vec![kind.to_string()]))
        .collect();
    assert_eq!(
        seen,
        expected,
        "the fault each attack ended with; log:\n{}",
        worker.log()
    );
    if let Err(e) = kafka
        .wait_committed(
            &format!("sluice-{neighbour}"),
            &nin,
            2,
            sent.len() as i64,
            Duration::from_secs(120),
        )
        .await
    {
        panic!("{e:#}; log:\n{}", worker.log());
    }
    let out = kafka.read_all(&nout, Duration::from_secs(30))?;
    assert_eq!(out.len(), sent.len(), "the neighbour's output");
    let log = worker.log();
    // A Python exception names itself and where it was raised.
    assert!(
        log.contains("RecursionError") && log.contains("hostile.py:") && log.contains("in _recurse"),
        "the recursion's error should carry its Python traceback; log:\n{log}"
    );
    assert!(log.contains("ValueError: refusing to start"), "{log}");
    let status = worker.terminate(Duration::from_secs(30))?;
    assert_eq!(
        status.code(),
        Some(3),
        "tasks failed, so the worker says so; log:\n{log}"
    );
    Ok(())
}

/// A Python topology from nothing: `sluice new --python`, its own test under CPython, `sluice
/// build`, then a worker runs it from its manifest.
#[tokio::test(flavor = "multi_thread")]
async fn a_python_scaffold_tests_builds_and_runs() -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("pyscaffold");
    let name = format!("py-{}", &unique_name("x")[2..10]);
    let project = dir.path().join(&name);
    let sluice = sluice_tests::worker::sluice_binary();
    let run = |args: &[&str], cwd: &std::path::Path| -> anyhow::Result<(bool, String)> {
        let out = std::process::Command::new(&sluice)
            .args(args)
            .current_dir(cwd)
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        Ok((out.status.success(), text))
    };
    let (ok, out) = run(&["new", "--python", project.to_str().unwrap()], dir.path())?;
    assert!(ok, "sluice new --python: {out}");
    let python = std::env::var("SLUICE_PYTHON_VENV")
        .map(|v| format!("{v}/bin/python"))
        .unwrap_or_else(|_| "python3".into());
    let test = std::process::Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .current_dir(&project)
        .output()?;
    assert!(
        test.status.success(),
        "the scaffold's own test: {}",
        String::from_utf8_lossy(&test.stdout)
    );
    let (ok, out) = run(&["build"], &project)?;
    assert!(ok, "sluice build: {out}");
    assert!(
        out.contains(&format!("build/{name}.wasm")),
        "it says where it wrote: {out}"
    );

    for topic in ["in", "out"] {
        kafka.create_topic(&format!("{name}-{topic}"), 2).await?;
    }
    let cache = shared_compile_cache();
    let state = dir.path().join("state");
    let manifest = project.join(format!("{name}.toml"));
    let mut args = vec![
        "--topology",
        manifest.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ];
    args.extend(cache.iter().map(String::as_str));
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &args)?;
    let sent: Vec<(Vec<u8>, Vec<u8>)> = (0..100)
        .map(|i| (format!("k{}", i % 10).into_bytes(), format!("v{i}").into_bytes()))
        .collect();
    kafka.produce(&format!("{name}-in"), &sent).await?;
    let got = kafka
        .consume(&format!("{name}-out"), 100, Duration::from_secs(120))
        .await;
    let got = got.unwrap_or_else(|e| panic!("{e:#}; log:\n{}", worker.log()));
    assert!(got.iter().all(|r| r.value.as_ref().unwrap().starts_with(b"V")));
    kafka
        .wait_committed(
            &format!("sluice-{name}"),
            &format!("{name}-in"),
            2,
            100,
            Duration::from_secs(60),
        )
        .await?;
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    // Its store counted 10 records of key k3 (keys spread over both partitions' tasks).
    let mut seen = BTreeMap::new();
    for p in 0..2 {
        seen.extend(sluice_tests::worker::dump_counts(&state, &name, p, "seen")?);
    }
    assert_eq!(seen.get("k3"), Some(&10), "{seen:?}");
    Ok(())
}

/// `sluice new --python --dsl`: a word count written with the Python DSL, whose own test
/// passes, which `sluice build` builds, and which counts words on a worker (two
/// sub-topologies, through the repartition topic the host creates).
#[tokio::test(flavor = "multi_thread")]
async fn a_python_dsl_scaffold_tests_builds_and_counts_words() -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("pydslscaffold");
    let name = format!("pyd-{}", &unique_name("x")[2..10]);
    let project = dir.path().join(&name);
    let sluice = sluice_tests::worker::sluice_binary();
    let run = |args: &[&str], cwd: &std::path::Path| -> anyhow::Result<(bool, String)> {
        let out = std::process::Command::new(&sluice)
            .args(args)
            .current_dir(cwd)
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        Ok((out.status.success(), text))
    };
    let (ok, out) = run(&["new", "--python", "--dsl", project.to_str().unwrap()], dir.path())?;
    assert!(ok, "sluice new --python --dsl: {out}");
    let python = std::env::var("SLUICE_PYTHON_VENV")
        .map(|v| format!("{v}/bin/python"))
        .unwrap_or_else(|_| "python3".into());
    let test = std::process::Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .current_dir(&project)
        .output()?;
    assert!(
        test.status.success(),
        "the scaffold's own test: {}",
        String::from_utf8_lossy(&test.stdout)
    );
    let (ok, out) = run(&["build"], &project)?;
    assert!(ok && out.contains(&format!("build/{name}.wasm")), "sluice build: {out}");

    kafka.create_topic(&format!("{name}-lines"), 2).await?;
    kafka.create_topic(&format!("{name}-totals"), 1).await?;
    let cache = shared_compile_cache();
    let state = dir.path().join("state");
    let manifest = project.join(format!("{name}.toml"));
    let mut args = vec![
        "--topology",
        manifest.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
    ];
    args.extend(cache.iter().map(String::as_str));
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &args)?;
    let lines: Vec<(Vec<u8>, Vec<u8>)> = (0..40)
        .map(|i| {
            (
                format!("l{i}").into_bytes(),
                format!("The cat w{} the", i % 4).into_bytes(),
            )
        })
        .collect();
    kafka.produce(&format!("{name}-lines"), &lines).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    while std::time::Instant::now() < deadline {
        for r in kafka.read_all(&format!("{name}-totals"), Duration::from_secs(10))? {
            let word = String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).to_string();
            let n = u64::from_be_bytes(r.value.as_deref().unwrap_or_default().try_into().unwrap_or_default());
            last.insert(word, n);
        }
        if last.get("the") == Some(&80) && last.get("w3") == Some(&10) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    let want: BTreeMap<String, u64> = [("the", 80), ("cat", 40), ("w0", 10), ("w1", 10), ("w2", 10), ("w3", 10)]
        .into_iter()
        .map(|(w, n)| (w.to_string(), n))
        .collect();
    assert_eq!(last, want, "the last count of each word; log:\n{}", worker.log());
    Ok(())
}

/// componentize-py 0.25.1 leaks the buffer each call of a Python topology returns: a Python
/// uppercase instance on 100-byte records reaches its 64 MiB memory limit within 830 batches
/// of 500. The host replaces an instance whose memory grew past three quarters of its limit,
/// between batches, over the same stores: 700,000 records go through one task without a
/// single fault.
#[tokio::test(flavor = "multi_thread")]
async fn a_python_task_outlives_what_its_runtime_leaks() -> anyhow::Result<()> {
    const RECORDS: usize = 700_000;
    let upper = Scenario::builder("pyleak", "python/uppercase")
        .source("input", 1)
        .sink("output", 1)
        .create()
        .await?;
    let value = "a".repeat(100);
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..RECORDS)
        .map(|i| (format!("{i:08}").into_bytes(), value.clone().into_bytes()))
        .collect();
    upper.produce(&records).await?;
    let cache = shared_compile_cache();
    let metrics = free_port();
    let admin = format!("127.0.0.1:{metrics}");
    let mut args = vec!["--batch-size", "500", "--metrics", &admin];
    args.extend(cache.iter().map(String::as_str));
    let mut worker = upper.worker(&args)?;
    if let Err(e) = upper.wait_committed(RECORDS, Duration::from_secs(300)).await {
        panic!("{e:#}; log:\n{}", worker.log());
    }
    let body = sluice_tests::http_get(metrics, "/metrics")?;
    let faults: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("sluice_guest_faults_total{"))
        .collect();
    assert!(faults.is_empty(), "guest faults: {faults:?}; log:\n{}", worker.log());
    let status = worker.terminate(Duration::from_secs(60))?;
    assert!(
        status.success(),
        "the task failed (exit {status}); log:\n{}",
        worker.log()
    );
    let out = upper.read_all(Duration::from_secs(60))?;
    assert_eq!(out.len(), RECORDS, "outputs");
    assert!(out
        .iter()
        .all(|r| r.value.as_deref() == Some(value.to_uppercase().as_bytes())));
    Ok(())
}
