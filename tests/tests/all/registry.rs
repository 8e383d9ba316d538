//! Uploaded topologies: `sluice deploy` through one worker's admin API, the registry in
//! Kafka, every worker running what is uploaded; bad uploads refused with their own errors
//! and nothing stored; upgrades that keep state; deletion.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_tests::worker::{cluster_worker, guest, sluice_binary, TempDir, WorkerProcess};
use sluice_tests::{free_port, kafka, unique_name};

use crate::cluster::until_settled;

/// A worker of `cluster` with an admin endpoint on `port` and no `--topology`.
pub(crate) fn worker(
    dir: &TempDir,
    cluster: &str,
    n: usize,
    port: u16,
    extra: &[&str],
) -> anyhow::Result<WorkerProcess> {
    let admin = format!("127.0.0.1:{port}");
    let mut args = vec!["--metrics", admin.as_str()];
    args.extend_from_slice(extra);
    cluster_worker(dir, None, cluster, n, &args)
}

/// What a CLI run gave: success, stdout, stderr.
pub(crate) type Ran = (bool, String, String);

/// Runs the `sluice` CLI.
pub(crate) fn cli(args: &[&str]) -> anyhow::Result<Ran> {
    let out = std::process::Command::new(sluice_binary()).args(args).output()?;
    Ok((
        out.status.success(),
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    ))
}

pub(crate) fn deploy(
    admin: u16,
    component: &std::path::Path,
    manifest: &std::path::Path,
) -> anyhow::Result<(bool, String, String)> {
    cli(&[
        "deploy",
        component.to_str().unwrap(),
        "--manifest",
        manifest.to_str().unwrap(),
        "--admin",
        &format!("127.0.0.1:{admin}"),
        "--output",
        "json",
    ])
}

/// The names and versions the registry lists, through `admin`.
pub(crate) fn listed(admin: u16) -> anyhow::Result<BTreeMap<String, u64>> {
    let (ok, out, err) = cli(&[
        "topologies",
        "list",
        "--admin",
        &format!("127.0.0.1:{admin}"),
        "--output",
        "json",
    ])?;
    anyhow::ensure!(ok, "sluice topologies list failed: {err}");
    let v: serde_json::Value = serde_json::from_str(&out)?;
    Ok(v.as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap().to_string(), t["version"].as_u64().unwrap()))
        .collect())
}

pub(crate) fn manifest(name: &str, sources: &[(&str, &str)], sinks: &[(&str, &str)], extra: &str) -> String {
    let table = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| format!("{k} = \"{v}\"\n"))
            .collect::<String>()
    };
    format!(
        "name = \"{name}\"\n{extra}\n[sources]\n{}\n[sinks]\n{}",
        table(sources),
        table(sinks)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_topology_deployed_through_one_worker_runs_across_the_cluster_and_bad_uploads_change_nothing(
) -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("deploy-in"), unique_name("deploy-out"));
    kafka.create_topic(&input, 4).await?;
    kafka.create_topic(&output, 4).await?;
    let dir = TempDir::new("registry");
    let cluster = unique_name("c");
    let ports = [free_port(), free_port()];
    // The second worker takes components of at most 64 KiB (uppercase is about 100 KiB).
    let mut workers = vec![
        worker(&dir, &cluster, 0, ports[0], &[])?,
        worker(&dir, &cluster, 1, ports[1], &["--max-component-size", "64KiB"])?,
    ];
    for w in &mut workers {
        w.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    }

    let name = unique_name("shout");
    let m = dir.write(
        "shout.toml",
        &manifest(&name, &[("input", &input)], &[("output", &output)], ""),
    );
    let (ok, out, err) = deploy(ports[0], &guest("uppercase"), &m)?;
    assert!(ok, "deploy failed: {err}");
    let deployed: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(
        (deployed["version"].as_u64(), deployed["partitions"].as_u64()),
        (Some(1), Some(4)),
        "{out}"
    );

    // Both workers run it: two tasks each; records go through.
    until_settled(&mut workers, 2).await?;
    let sent: Vec<(Vec<u8>, Vec<u8>)> = (0..1000)
        .map(|i| (format!("k{i}").into_bytes(), format!("hello {i}").into_bytes()))
        .collect();
    kafka.produce(&input, &sent).await?;
    let received = kafka.consume(&output, sent.len(), Duration::from_secs(120)).await?;
    let mut got: Vec<Vec<u8>> = received.iter().map(|r| r.value.clone().unwrap()).collect();
    let mut want: Vec<Vec<u8>> = sent.iter().map(|(_, v)| v.to_ascii_uppercase()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    // The other worker lists it.
    let before = listed(ports[1])?;
    assert_eq!(before.get(&name), Some(&1), "{before:?}");
    // Describing it through either worker shows where its tasks run: four active tasks,
    // two on each worker, all running.
    let (ok, out, err) = cli(&[
        "topologies",
        "describe",
        &name,
        "--admin",
        &format!("127.0.0.1:{}", ports[1]),
        "--output",
        "json",
    ])?;
    assert!(ok, "{err}");
    let described: serde_json::Value = serde_json::from_str(&out)?;
    let mut placed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for t in described["tasks"].as_array().unwrap() {
        assert_eq!(
            (t["role"].as_str(), t["phase"].as_str()),
            (Some("active"), Some("running")),
            "{t}"
        );
        placed
            .entry(t["worker"].as_str().unwrap().to_string())
            .or_default()
            .push(t["task"].as_str().unwrap().to_string());
    }
    let admins: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let mut sorted = admins.clone();
    sorted.sort();
    assert_eq!(placed.keys().cloned().collect::<Vec<_>>(), sorted, "{described}");
    assert!(placed.values().all(|tasks| tasks.len() == 2), "{described}");
    let mut all: Vec<String> = placed.into_values().flatten().collect();
    all.sort();
    assert_eq!(all, (0..4).map(|p| format!("{name}/{p}")).collect::<Vec<_>>());
    assert_eq!(described["unassigned"], serde_json::json!([]), "{described}");
    assert_eq!(described["problems"], serde_json::json!([]), "{described}");
    let (ok, text, err) = cli(&["topologies", "describe", &name, "--admin", &admins[0]])?;
    assert!(ok, "{err}");
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("{name}/3")) && l.contains("active") && l.contains("running")),
        "{text}"
    );

    // Each bad upload gets its own error, and the registry stays as it was.
    let junk = dir.write("junk.wasm", "hello, not wasm");
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0")?;
    let other = unique_name("other");
    let good = dir.write(
        "other.toml",
        &manifest(&other, &[("input", &input)], &[("output", &output)], ""),
    );
    let cases: Vec<(&str, std::path::PathBuf, std::path::PathBuf, u16, &str)> = vec![
        (
            "not a component",
            junk,
            good.clone(),
            ports[0],
            "does not start with the Wasm magic bytes [not-a-component]",
        ),
        (
            "a core module",
            core,
            good.clone(),
            ports[0],
            "it is a core Wasm module; build it for wasm32-wasip2",
        ),
        (
            "a component of another world",
            guest("other-world"),
            good.clone(),
            ports[0],
            "does not fit the sluice:topology@0.2.0 world: it exports greet, not \
             sluice:topology/processor@0.2.0: it is not a Sluice topology",
        ),
        (
            "another version of the world",
            guest("wrong-version"),
            good.clone(),
            ports[0],
            "was built for sluice:topology@0.9.0; this worker runs sluice:topology@0.2.0 (and @0.1.0) topologies: \
             rebuild it with a sluice-guest for 0.2.0 [wrong-version]",
        ),
        (
            "a missing export",
            guest("missing-export"),
            good.clone(),
            ports[0],
            "exports sluice:topology/processor without process: a topology exports all of describe, init, \
             process, punctuate, close [missing-export]",
        ),
        (
            "describe loops",
            guest("hostile-describe-loop"),
            good.clone(),
            ports[0],
            "[describe-failed]",
        ),
        (
            "describe traps",
            guest("hostile-describe-trap"),
            good.clone(),
            ports[0],
            "[describe-failed]",
        ),
        (
            "a bad manifest",
            guest("uppercase"),
            dir.write("bad.toml", "name = \n"),
            ports[0],
            "[bad-manifest]",
        ),
        (
            "an undeclared source",
            guest("uppercase"),
            dir.write(
                "undeclared.toml",
                &manifest(
                    &other,
                    &[("input", &input), ("nope", &input)],
                    &[("output", &output)],
                    "",
                ),
            ),
            ports[0],
            "it binds the source \"nope\", which the component does not declare",
        ),
        (
            "a missing topic",
            guest("uppercase"),
            dir.write(
                "missing.toml",
                &manifest(
                    &other,
                    &[("input", &unique_name("missing"))],
                    &[("output", &output)],
                    "",
                ),
            ),
            ports[0],
            "does not exist; create it first",
        ),
        (
            "over the size limit",
            guest("uppercase"),
            good.clone(),
            ports[1],
            "[too-large]",
        ),
    ];
    for (what, component, manifest, port, expected) in cases {
        let (ok, _, err) = deploy(port, &component, &manifest)?;
        assert!(!ok, "{what}: accepted");
        eprintln!("{what}: {}", err.trim());
        assert!(err.contains(expected), "{what}: expected {expected:?} in:\n{err}");
        assert_eq!(listed(ports[0])?, before, "{what}: the registry changed");
    }

    // Deleted through the other worker: every task stops on both.
    let (ok, out, err) = cli(&[
        "topologies",
        "delete",
        &name,
        "--admin",
        &format!("127.0.0.1:{}", ports[1]),
    ])?;
    assert!(ok, "delete failed: {err}");
    assert!(out.contains("deleted"), "{out}");
    until_settled(&mut workers, 0).await?;
    let (ok, _, err) = cli(&[
        "topologies",
        "describe",
        &name,
        "--admin",
        &format!("127.0.0.1:{}", ports[0]),
    ])?;
    assert!(!ok && err.contains("[not-found]"), "{err}");
    for w in &mut workers {
        assert!(w.terminate(Duration::from_secs(60))?.success(), "{}", w.log());
    }
    Ok(())
}

/// An upgrade (a new version of a stateful topology) restarts its tasks on the new version
/// with their state: word counts go on from where they were.
#[tokio::test(flavor = "multi_thread")]
async fn an_upgrade_keeps_the_state() -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("upgrade-in"), unique_name("upgrade-out"));
    kafka.create_topic(&input, 2).await?;
    kafka.create_topic(&output, 2).await?;
    let dir = TempDir::new("upgrade");
    let cluster = unique_name("c");
    let port = free_port();
    let mut workers = vec![worker(&dir, &cluster, 0, port, &[])?];
    workers[0].wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let name = unique_name("wc");
    let bindings = (&[("lines", input.as_str())][..], &[("counts", output.as_str())][..]);
    let v1 = dir.write("v1.toml", &manifest(&name, bindings.0, bindings.1, ""));
    let (ok, _, err) = deploy(port, &guest("word-count"), &v1)?;
    assert!(ok, "{err}");
    until_settled(&mut workers, 2).await?;
    // One key: every line in one partition, so one task holds the counts.
    let line = |_: usize| (b"same".to_vec(), b"apple banana apple".to_vec());
    kafka.produce(&input, &(0..100).map(line).collect::<Vec<_>>()).await?;
    kafka
        .wait_committed(&format!("sluice-{name}"), &input, 2, 100, Duration::from_secs(120))
        .await?;

    // Version 2: the same component under another limit.
    let v2 = dir.write(
        "v2.toml",
        &manifest(&name, bindings.0, bindings.1, "[limits]\ncall-timeout = \"3s\"\n"),
    );
    let (ok, out, err) = deploy(port, &guest("word-count"), &v2)?;
    assert!(ok, "{err}");
    assert!(out.contains("\"version\": 2"), "{out}");
    workers[0].wait_for_line(&["deployed from the registry", "version=2"], Duration::from_secs(60))?;
    until_settled(&mut workers, 2).await?;
    kafka.produce(&input, &(100..200).map(line).collect::<Vec<_>>()).await?;
    kafka
        .wait_committed(&format!("sluice-{name}"), &input, 2, 200, Duration::from_secs(120))
        .await?;
    // The highest count of each word is the truth over both versions: 400 apples, 200
    // bananas (a version that lost the state would count from zero again).
    let outputs = kafka.read_all(&output, Duration::from_secs(10))?;
    let mut highest: BTreeMap<String, u64> = BTreeMap::new();
    for r in &outputs {
        let word = String::from_utf8(r.key.clone().unwrap())?;
        let count: u64 = String::from_utf8(r.value.clone().unwrap())?.parse()?;
        let h = highest.entry(word).or_default();
        *h = (*h).max(count);
    }
    assert_eq!(highest.get("apple"), Some(&400), "{highest:?}");
    assert_eq!(highest.get("banana"), Some(&200), "{highest:?}");
    assert!(workers[0].terminate(Duration::from_secs(60))?.success());
    Ok(())
}

/// A tenant's first topology, from nothing: `sluice new` outside this repository, a build,
/// a deploy through one worker; its tasks run across both workers and its store answers.
#[tokio::test(flavor = "multi_thread")]
async fn a_scaffolded_topology_builds_deploys_and_runs_across_the_cluster() -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("scaffold");
    let name = format!("topo-{}", &unique_name("x")[2..10]);
    let project = dir.path().join(&name);
    let (ok, out, err) = cli(&["new", project.to_str().unwrap()])?;
    assert!(ok, "sluice new failed: {err}");
    assert!(out.contains("cargo build --release"), "{out}");
    // Built as its users would (its own .cargo/config.toml picks wasm32-wasip2); the
    // shared target directory only saves compiling the SDK's dependencies again.
    let target = sluice_tests::worker::target_dir();
    let started = std::time::Instant::now();
    let build = std::process::Command::new("cargo")
        .args(["build", "--release"])
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", &target)
        .output()?;
    assert!(
        build.status.success(),
        "building the scaffold failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    eprintln!("the scaffold built in {:.1}s", started.elapsed().as_secs_f64());
    let component = target
        .join("wasm32-wasip2/release")
        .join(format!("{}.wasm", name.replace('-', "_")));
    for topic in ["in", "out"] {
        kafka.create_topic(&format!("{name}-{topic}"), 4).await?;
    }
    let cluster = unique_name("c");
    let ports = [free_port(), free_port()];
    let mut workers = vec![
        worker(&dir, &cluster, 0, ports[0], &[])?,
        worker(&dir, &cluster, 1, ports[1], &[])?,
    ];
    for w in &mut workers {
        w.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    }
    let (ok, _, err) = deploy(ports[0], &component, &project.join(format!("{name}.toml")))?;
    assert!(ok, "{err}");
    until_settled(&mut workers, 2).await?;
    let sent: Vec<(Vec<u8>, Vec<u8>)> = (0..200)
        .map(|i| (format!("k{}", i % 10).into_bytes(), format!("v{i}").into_bytes()))
        .collect();
    kafka.produce(&format!("{name}-in"), &sent).await?;
    let got = kafka
        .consume(&format!("{name}-out"), 200, Duration::from_secs(60))
        .await?;
    assert!(got.iter().all(|r| r.value.as_ref().unwrap().starts_with(b"V")));
    // Its store counted 20 records of key k3 (on whichever worker runs its task).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, out, _) = cli(&[
            "query",
            &name,
            "seen",
            "k3",
            "--admin",
            &format!("127.0.0.1:{}", ports[1]),
            "--output",
            "json",
        ])?;
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        if ok && v["entries"][0]["value_hex"] == "0000000000000014" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "k3 was not counted 20 times: {out}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for w in &mut workers {
        assert!(w.terminate(Duration::from_secs(60))?.success());
    }
    Ok(())
}

/// A deploy may reprocess: from the earliest record, from a time, from an offset, or skip
/// to the latest; without it, an upgrade goes on where the version before stopped.
#[tokio::test(flavor = "multi_thread")]
async fn a_deploy_reprocesses_from_an_offset_or_a_timestamp() -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("replay-in"), unique_name("replay-out"));
    kafka.create_topic(&input, 1).await?;
    kafka.create_topic(&output, 1).await?;
    let dir = TempDir::new("reprocess");
    let cluster = unique_name("c");
    let port = free_port();
    let mut workers = vec![worker(&dir, &cluster, 0, port, &[])?];
    workers[0].wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    // Five records, then (a moment later) five more: the time between them splits them.
    kafka
        .produce_to(
            &input,
            0,
            &[("k", "a0"), ("k", "a1"), ("k", "a2"), ("k", "a3"), ("k", "a4")],
        )
        .await?;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let between = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    kafka
        .produce_to(
            &input,
            0,
            &[("k", "b0"), ("k", "b1"), ("k", "b2"), ("k", "b3"), ("k", "b4")],
        )
        .await?;

    let name = unique_name("replay");
    let m = dir.write(
        "replay.toml",
        &manifest(&name, &[("input", &input)], &[("output", &output)], ""),
    );
    let upper = guest("uppercase");
    let admin = format!("127.0.0.1:{port}");
    let deploy = |from: Option<&str>| -> anyhow::Result<serde_json::Value> {
        let mut args = vec![
            "deploy",
            upper.to_str().unwrap(),
            "--manifest",
            m.to_str().unwrap(),
            "--admin",
            &admin,
        ];
        args.extend(["--output", "json"]);
        if let Some(from) = from {
            args.extend(["--reprocess-from", from]);
        }
        let (ok, out, err) = cli(&args)?;
        anyhow::ensure!(ok, "{err}");
        Ok(serde_json::from_str(&out)?)
    };
    // All outputs so far, in order.
    let outputs = |n: usize| {
        let output = output.clone();
        async move {
            let got = kafka.consume(&output, n, Duration::from_secs(60)).await?;
            anyhow::Ok(
                got.iter()
                    .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
                    .collect::<Vec<String>>(),
            )
        }
    };
    let all: Vec<String> = ["A0", "A1", "A2", "A3", "A4", "B0", "B1", "B2", "B3", "B4"]
        .iter()
        .map(|s| s.to_string())
        .collect();

    deploy(None)?;
    assert_eq!(outputs(10).await?, all);
    // Everything again.
    let v2 = deploy(Some("earliest"))?;
    assert_eq!(
        (v2["version"].as_u64(), v2["offsets_epoch"].as_u64()),
        (Some(2), Some(2)),
        "{v2}"
    );
    assert_eq!(outputs(20).await?[10..], all[..]);
    // From the time between the two runs of records: the second five.
    deploy(Some(&format!("timestamp:{between}")))?;
    assert_eq!(outputs(25).await?[20..], all[5..]);
    // From offset 8: the last two.
    deploy(Some("offset:8"))?;
    assert_eq!(outputs(27).await?[25..], all[8..]);
    // From the latest: nothing again; what comes next is processed. "Latest" is where the
    // task finds the end when it starts (after the assignment, so wait for its fifth start:
    // a record produced before it would rightly be skipped).
    deploy(Some("latest"))?;
    until_settled(&mut workers, 1).await?;
    let task = format!("task={name}/0");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while workers[0]
        .log()
        .lines()
        .filter(|l| l.contains("started committed=") && l.contains(&task))
        .count()
        < 5
    {
        assert!(std::time::Instant::now() < deadline, "{}", workers[0].log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    kafka.produce_to(&input, 0, &[("k", "c0")]).await?;
    assert_eq!(outputs(28).await?[27..], ["C0".to_string()]);
    // A bad position is refused before anything is sent.
    let (ok, _, err) = cli(&[
        "deploy",
        upper.to_str().unwrap(),
        "--manifest",
        m.to_str().unwrap(),
        "--admin",
        &admin,
        "--reprocess-from",
        "yesterday",
    ])?;
    assert!(
        !ok && err.contains("\"yesterday\" is not a position to reprocess from"),
        "{err}"
    );
    // An upgrade without it goes on from there: nothing is processed twice.
    let m2 = dir.write(
        "replay2.toml",
        &manifest(
            &name,
            &[("input", &input)],
            &[("output", &output)],
            "on-error = \"skip\"",
        ),
    );
    let (ok, _, err) = cli(&[
        "deploy",
        upper.to_str().unwrap(),
        "--manifest",
        m2.to_str().unwrap(),
        "--admin",
        &admin,
    ])?;
    assert!(ok, "{err}");
    until_settled(&mut workers, 1).await?;
    kafka.produce_to(&input, 0, &[("k", "d0")]).await?;
    assert_eq!(outputs(29).await?[28..], ["D0".to_string()]);
    // The whole output topic, read to its end: nothing more than the above.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let everything = kafka.read_all(&output, Duration::from_secs(30))?;
    assert_eq!(everything.len(), 29, "records processed twice");
    assert!(workers[0].terminate(Duration::from_secs(60))?.success());
    Ok(())
}

/// `sluice topologies describe` prints a topology's sub-topologies as Kafka Streams'
/// `Topology#describe()` does: what each reads and writes (internal topics by the names the
/// host gives them), its stores, and — from a component built with the SDK's DSL — its
/// operators. A Processor API topology has no operators to show, and says none.
#[tokio::test(flavor = "multi_thread")]
async fn a_dsl_topology_is_described_sub_topology_by_sub_topology_with_its_operators() -> anyhow::Result<()> {
    let kafka = kafka();
    let (lines, totals) = (unique_name("describe-lines"), unique_name("describe-totals"));
    kafka.create_topic(&lines, 4).await?;
    kafka.create_topic(&totals, 4).await?;
    let dir = TempDir::new("describe");
    let cluster = unique_name("describe");
    let port = free_port();
    let mut w = worker(&dir, &cluster, 0, port, &[])?;
    w.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let name = unique_name("dslwc");
    let m = dir.write(
        "wc.toml",
        &manifest(&name, &[("lines", &lines)], &[("totals", &totals)], ""),
    );
    let (ok, _, err) = deploy(port, &guest("dsl-word-count"), &m)?;
    assert!(ok, "deploy failed: {err}");
    let (ok, text, err) = cli(&["topologies", "describe", &name, "--admin", &format!("127.0.0.1:{port}")])?;
    assert!(ok, "{err}");
    let section: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "sub-topologies:")
        .take_while(|l| *l != "manifest:")
        .collect();
    let shown = section.join("\n");
    // Two sub-topologies: `lines` (4 tasks, like its source) writes the repartition topic
    // `words`, which `words` reads and counts into the store `counts`.
    let repartition = format!("words (internal: {name}-words-repartition)");
    assert!(section.contains(&"  lines (4 tasks)"), "{text}");
    assert!(shown.contains(&format!("    writes: {repartition}")), "{text}");
    assert!(section.iter().any(|l| l.starts_with("  words (")), "{text}");
    assert!(shown.contains(&format!("    reads:  {repartition}")), "{text}");
    assert!(shown.contains("    stores: counts"), "{text}");
    // The operators, each in its sub-topology, linked to its neighbours.
    let operator = |needles: &[&str]| {
        section
            .iter()
            .any(|l| l.starts_with("      ") && needles.iter().all(|n| l.contains(n)))
    };
    assert!(operator(&["(reads source lines)", "-->"]), "{text}");
    assert!(operator(&["flat_map_values", "<--", "-->"]), "{text}");
    assert!(operator(&["count_", "(stores: [counts])", "<--"]), "{text}");
    assert!(operator(&["(writes sink totals)", "<--"]), "{text}");

    // A Processor API topology (one sub-topology, no DSL) shows no operators.
    let (input, output) = (unique_name("describe-in"), unique_name("describe-out"));
    kafka.create_topic(&input, 2).await?;
    kafka.create_topic(&output, 2).await?;
    let plain = unique_name("plain");
    let m = dir.write(
        "plain.toml",
        &manifest(&plain, &[("input", &input)], &[("output", &output)], ""),
    );
    let (ok, _, err) = deploy(port, &guest("uppercase"), &m)?;
    assert!(ok, "deploy failed: {err}");
    let (ok, text, err) = cli(&[
        "topologies",
        "describe",
        &plain,
        "--admin",
        &format!("127.0.0.1:{port}"),
    ])?;
    assert!(ok, "{err}");
    assert!(
        !text.contains("operators:") && !text.contains("sub-topologies:"),
        "{text}"
    );

    // What a hostile component says of its operators is shown bounded and cleaned: no
    // escape sequence reaches the terminal, no line is endless, and there is an end.
    let hostile = unique_name("hostile");
    let m = dir.write(
        "hostile.toml",
        &manifest(&hostile, &[("input", &input)], &[("output", &output)], ""),
    );
    let (ok, _, err) = deploy(port, &guest("hostile"), &m)?;
    assert!(ok, "deploy failed: {err}");
    let (ok, text, err) = cli(&[
        "topologies",
        "describe",
        &hostile,
        "--admin",
        &format!("127.0.0.1:{port}"),
    ])?;
    assert!(ok, "{err}");
    assert!(!text.contains('\u{1b}'), "an escape sequence reached the output");
    let operators: Vec<&str> = text
        .lines()
        .skip_while(|l| *l != "operators:")
        .skip(1)
        .take_while(|l| l.starts_with("      "))
        .collect();
    assert!(operators[0].contains("?[2J?[Hcleared"), "{:?}", &operators[..2]);
    assert!(
        operators.iter().all(|l| l.chars().count() <= 1_010),
        "a line of {} characters",
        operators.iter().map(|l| l.len()).max().unwrap_or(0)
    );
    assert!(
        operators.len() <= 2_001 && operators.last().is_some_and(|l| l.contains("not shown")),
        "{} operator lines, the last: {:?}",
        operators.len(),
        operators.last()
    );
    assert!(w.terminate(Duration::from_secs(60))?.success(), "{}", w.log());
    Ok(())
}

/// `sluice new --dsl`: a word count written with the stream DSL, built as its users would,
/// deployed, counting exactly, its store queryable and its operators described.
#[tokio::test(flavor = "multi_thread")]
async fn a_dsl_scaffold_builds_deploys_and_counts_words() -> anyhow::Result<()> {
    let kafka = kafka();
    let dir = TempDir::new("scaffold-dsl");
    let name = format!("dsl-{}", &unique_name("x")[2..10]);
    let project = dir.path().join(&name);
    let (ok, _, err) = cli(&["new", "--dsl", project.to_str().unwrap()])?;
    assert!(ok, "sluice new --dsl failed: {err}");
    let target = sluice_tests::worker::target_dir();
    let build = std::process::Command::new("cargo")
        .args(["build", "--release"])
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", &target)
        .output()?;
    assert!(
        build.status.success(),
        "building the DSL scaffold failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let component = target
        .join("wasm32-wasip2/release")
        .join(format!("{}.wasm", name.replace('-', "_")));
    for topic in ["lines", "totals"] {
        kafka.create_topic(&format!("{name}-{topic}"), 4).await?;
    }
    let cluster = unique_name("c");
    let port = free_port();
    let mut w = worker(&dir, &cluster, 0, port, &[])?;
    w.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let (ok, _, err) = deploy(port, &component, &project.join(format!("{name}.toml")))?;
    assert!(ok, "{err}");
    // 100 lines of "apple banana apple": 200 apples, 100 bananas, whichever partition.
    let lines: Vec<(Vec<u8>, Vec<u8>)> = (0..100)
        .map(|i| (format!("l{i}").into_bytes(), b"Apple banana apple".to_vec()))
        .collect();
    kafka.produce(&format!("{name}-lines"), &lines).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let (ok, out, _) = cli(&[
            "query",
            &name,
            "counts",
            "apple",
            "--admin",
            &format!("127.0.0.1:{port}"),
            "--output",
            "json",
        ])?;
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        // 200, as the DSL's u64 codec writes it: 8 bytes, big-endian.
        if ok && v["entries"][0]["value_hex"] == "00000000000000c8" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "apple was not counted 200 times: {out}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let totals = kafka.read_all(&format!("{name}-totals"), Duration::from_secs(30))?;
    let bananas: Vec<&Vec<u8>> = totals
        .iter()
        .filter(|r| r.key.as_deref() == Some(&b"banana"[..]))
        .filter_map(|r| r.value.as_ref())
        .collect();
    // The record cache sends a word's count once per commit, not once per banana.
    assert!(
        !bananas.is_empty() && bananas.len() < 100,
        "{} updates for 100 bananas",
        bananas.len()
    );
    assert_eq!(
        bananas.last(),
        Some(&&100u64.to_be_bytes().to_vec()),
        "the last banana count is 100"
    );
    let (ok, text, err) = cli(&["topologies", "describe", &name, "--admin", &format!("127.0.0.1:{port}")])?;
    assert!(ok, "{err}");
    assert!(text.contains("(stores: [counts])"), "{text}");
    assert!(w.terminate(Duration::from_secs(60))?.success(), "{}", w.log());
    Ok(())
}
