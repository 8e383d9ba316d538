//! Uploaded topologies: `sluice deploy` through one worker's admin API, the registry in
//! Kafka, every worker running what is uploaded; bad uploads refused with their own errors
//! and nothing stored; upgrades that keep state; deletion.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_tests::worker::{cluster_worker, guest, sluice_binary, TempDir, WorkerProcess};
use sluice_tests::{free_port, kafka, unique_name};

use crate::cluster::until_settled;

/// A worker of `cluster` with an admin endpoint on `port` and no `--topology`.
fn worker(dir: &TempDir, cluster: &str, n: usize, port: u16, extra: &[&str]) -> anyhow::Result<WorkerProcess> {
    let admin = format!("127.0.0.1:{port}");
    let mut args = vec!["--metrics", admin.as_str()];
    args.extend_from_slice(extra);
    cluster_worker(dir, None, cluster, n, &args)
}

/// What a CLI run gave: success, stdout, stderr.
type Ran = (bool, String, String);

/// Runs the `sluice` CLI.
fn cli(args: &[&str]) -> anyhow::Result<Ran> {
    let out = std::process::Command::new(sluice_binary()).args(args).output()?;
    Ok((
        out.status.success(),
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    ))
}

fn deploy(
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
fn listed(admin: u16) -> anyhow::Result<BTreeMap<String, u64>> {
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

fn manifest(name: &str, sources: &[(&str, &str)], sinks: &[(&str, &str)], extra: &str) -> String {
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
            "does not fit the sluice:topology@0.1.0 world: it exports greet, not \
             sluice:topology/processor@0.1.0: it is not a Sluice topology",
        ),
        (
            "another version of the world",
            guest("wrong-version"),
            good.clone(),
            ports[0],
            "was built for sluice:topology@0.9.0; this worker runs sluice:topology@0.1.0 topologies: rebuild it \
             with a sluice-guest for 0.1.0 [wrong-version]",
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

/// Tenants: each sees and manages only its own topologies, binds only topics of its
/// namespace, and stays within its limits; a call without a known token is refused.
#[tokio::test(flavor = "multi_thread")]
async fn tenants_see_and_touch_only_their_own_topologies_and_topics() -> anyhow::Result<()> {
    let kafka = kafka();
    let id = unique_name("t");
    let (a, b) = (format!("a-{id}."), format!("b-{id}."));
    for ns in [&a, &b] {
        kafka.create_topic(&format!("{ns}in"), 2).await?;
        kafka.create_topic(&format!("{ns}out"), 2).await?;
    }
    let dir = TempDir::new("tenants");
    let hash = |t: &str| sluice::tenants::hash_token(t);
    let config = dir.write(
        "sluice.toml",
        &format!(
            "[admin]\ntokens = [\"{}\"]\n\n[tenants.alpha]\ntokens = [\"{}\"]\nnamespace = \"{a}\"\nmax-tasks = 2\n\n\
             [tenants.bravo]\ntokens = [\"{}\"]\nnamespace = \"{b}\"\n",
            hash("root-token"),
            hash("alpha-token"),
            hash("bravo-token")
        ),
    );
    let cluster = unique_name("c");
    let port = free_port();
    let mut workers = vec![worker(
        &dir,
        &cluster,
        0,
        port,
        &["--config", config.to_str().unwrap()],
    )?];
    workers[0].wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let admin = format!("127.0.0.1:{port}");
    let as_ = |token: &str, args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend_from_slice(&["--admin", &admin, "--token", token, "--output", "json"]);
        cli(&all)
    };
    let shout = |ns: &str, name: &str, sink_ns: &str| {
        dir.write(
            &format!("{name}.toml"),
            &manifest(
                &format!("{ns}{name}"),
                &[("input", &format!("{ns}in"))],
                &[("output", &format!("{sink_ns}out"))],
                "",
            ),
        )
    };
    let upper = guest("uppercase");
    let up = upper.to_str().unwrap();
    let deploy_as = |token: &str, m: &std::path::Path| as_(token, &["deploy", up, "--manifest", m.to_str().unwrap()]);

    let (ok, _, err) = deploy_as("alpha-token", &shout(&a, "shout", &a))?;
    assert!(ok, "{err}");
    let (ok, _, err) = deploy_as("bravo-token", &shout(&b, "shout", &b))?;
    assert!(ok, "{err}");
    let names = |token: &str| -> anyhow::Result<Vec<String>> {
        let (ok, out, err) = as_(token, &["topologies", "list"])?;
        anyhow::ensure!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out)?;
        Ok(v.as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect())
    };
    assert_eq!(names("alpha-token")?, vec![format!("{a}shout")]);
    assert_eq!(names("bravo-token")?, vec![format!("{b}shout")]);
    assert_eq!(names("root-token")?.len(), 2);

    // Alpha cannot describe, delete or overwrite bravo's topology, nor bind bravo's topics.
    let theirs = format!("{b}shout");
    let refusals: Vec<(&str, anyhow::Result<Ran>, &str)> = vec![
        (
            "describe",
            as_("alpha-token", &["topologies", "describe", &theirs]),
            "[not-found]",
        ),
        (
            "delete",
            as_("alpha-token", &["topologies", "delete", &theirs]),
            "[not-found]",
        ),
        (
            "overwrite",
            deploy_as("alpha-token", &shout(&b, "shout", &b)),
            "[name-taken]",
        ),
        (
            "name outside",
            deploy_as("alpha-token", &shout(&b, "mine", &b)),
            "[foreign-name]",
        ),
        (
            "emit to theirs",
            deploy_as("alpha-token", &shout(&a, "evil", &b)),
            "[foreign-topic]",
        ),
        (
            "over its tasks",
            deploy_as("alpha-token", &shout(&a, "second", &a)),
            "[over-limit]",
        ),
        (
            "no token",
            cli(&["topologies", "list", "--admin", &admin]),
            "[unauthorized]",
        ),
        ("a wrong token", as_("guess", &["topologies", "list"]), "[unauthorized]"),
    ];
    for (what, result, expected) in refusals {
        let (ok, _, err) = result?;
        assert!(!ok, "{what}: accepted");
        eprintln!("{what}: {}", err.trim());
        assert!(err.contains(expected), "{what}: expected {expected:?} in {err}");
    }
    assert_eq!(names("root-token")?.len(), 2, "a refusal changed the registry");
    assert_eq!(names("bravo-token")?, vec![theirs.clone()]);

    // Alpha's topology runs.
    until_settled(&mut workers, 4).await?;
    kafka
        .produce(&format!("{a}in"), &[(b"k".to_vec(), b"quiet".to_vec())])
        .await?;
    let got = kafka.consume(&format!("{a}out"), 1, Duration::from_secs(60)).await?;
    assert_eq!(got[0].value.as_deref(), Some(&b"QUIET"[..]));

    // Tenants: the admin sees both, alpha only itself.
    let tenants = |token: &str| -> anyhow::Result<serde_json::Value> {
        let (ok, out, err) = as_(token, &["tenants", "list"])?;
        anyhow::ensure!(ok, "{err}");
        Ok(serde_json::from_str(&out)?)
    };
    assert_eq!(tenants("root-token")?.as_array().unwrap().len(), 2);
    let alpha = tenants("alpha-token")?;
    assert_eq!(alpha.as_array().unwrap().len(), 1, "{alpha}");
    assert_eq!(
        (alpha[0]["topologies"].as_u64(), alpha[0]["tasks"].as_u64()),
        (Some(1), Some(2)),
        "{alpha}"
    );

    // The admin creates a tenant through the API; a worker started after it knows it from
    // the registry. Only the admin may; a file-defined name or an overlapping namespace is
    // refused; a deleted tenant's token stops working.
    let c = format!("c-{id}.");
    let create = |token: &str, name: &str, ns: &str| {
        as_(
            token,
            &[
                "tenants",
                "create",
                name,
                "--namespace",
                ns,
                "--tenant-token",
                "charlie-token",
                "--max-tasks",
                "4",
                "--max-deploys-per-minute",
                "2",
            ],
        )
    };
    let (ok, _, err) = create("alpha-token", "charlie", &c)?;
    assert!(!ok && err.contains("[admin-only]"), "{err}");
    let (ok, _, err) = create("root-token", "alpha", &c)?;
    assert!(!ok && err.contains("[name-taken]"), "{err}");
    let (ok, _, err) = create("root-token", "charlie", &format!("{a}sub."))?;
    assert!(
        !ok && err.contains("[bad-tenant]") && err.contains("must not overlap"),
        "{err}"
    );
    let (ok, _, err) = create("root-token", "charlie", &c)?;
    assert!(ok, "{err}");
    let port2 = free_port();
    workers.push(worker(
        &dir,
        &cluster,
        1,
        port2,
        &["--config", config.to_str().unwrap()],
    )?);
    workers[1].wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let admin2 = format!("127.0.0.1:{port2}");
    let (ok, out, err) = cli(&[
        "tenants",
        "list",
        "--admin",
        &admin2,
        "--token",
        "charlie-token",
        "--output",
        "json",
    ])?;
    assert!(ok, "the second worker does not know the new tenant: {err}");
    let charlie: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(
        (
            charlie[0]["name"].as_str(),
            charlie[0]["defined_in"].as_str(),
            charlie[0]["max_tasks"].as_u64()
        ),
        (Some("charlie"), Some("api"), Some(4)),
        "{charlie}"
    );

    // Deploys per minute count across the cluster: a deploy through one worker and a delete
    // through the other use up charlie's two, so a third through the first is refused,
    // though that worker alone took one.
    kafka.create_topic(&format!("{c}in"), 2).await?;
    kafka.create_topic(&format!("{c}out"), 2).await?;
    let charlie_shout = shout(&c, "shout", &c);
    let (ok, _, err) = deploy_as("charlie-token", &charlie_shout)?;
    assert!(ok, "{err}");
    let (ok, _, err) = cli(&[
        "topologies",
        "delete",
        &format!("{c}shout"),
        "--admin",
        &admin2,
        "--token",
        "charlie-token",
    ])?;
    assert!(ok, "{err}");
    // Once the first worker has read the delete from the registry.
    let until = std::time::Instant::now() + Duration::from_secs(15);
    while !names("charlie-token")?.is_empty() {
        assert!(
            std::time::Instant::now() < until,
            "the first worker did not learn of the delete"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (ok, _, err) = deploy_as("charlie-token", &charlie_shout)?;
    assert!(
        !ok,
        "a third deploy within a minute, through the first worker, was accepted"
    );
    assert!(
        err.contains("[over-limit]")
            && err.contains("across the cluster")
            && err.contains("max-deploys-per-minute = 2"),
        "{err}"
    );

    let (ok, _, err) = as_("root-token", &["tenants", "delete", "charlie"])?;
    assert!(ok, "{err}");
    // The other worker reads the deletion from the registry within moments.
    let until = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (ok, _, err) = cli(&["tenants", "list", "--admin", &admin2, "--token", "charlie-token"])?;
        if !ok && err.contains("[unauthorized]") {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "a deleted tenant's token still works: {err}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(workers[1].terminate(Duration::from_secs(60))?.success());
    assert!(workers[0].terminate(Duration::from_secs(60))?.success());
    Ok(())
}

/// A key queried through any worker returns what the worker owning its task committed.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_queried_through_any_worker_returns_the_owners_value() -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("query-in"), unique_name("query-out"));
    kafka.create_topic(&input, 4).await?;
    kafka.create_topic(&output, 4).await?;
    let dir = TempDir::new("query");
    let cluster = unique_name("c");
    let ports = [free_port(), free_port()];
    let mut workers = vec![
        worker(&dir, &cluster, 0, ports[0], &[])?,
        worker(&dir, &cluster, 1, ports[1], &[])?,
    ];
    for w in &mut workers {
        w.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    }
    let name = unique_name("wc");
    let m = dir.write(
        "wc.toml",
        &manifest(&name, &[("lines", &input)], &[("counts", &output)], ""),
    );
    let (ok, _, err) = deploy(ports[0], &guest("word-count"), &m)?;
    assert!(ok, "{err}");
    until_settled(&mut workers, 2).await?;
    // 400 lines over the four partitions: "apple" twice a line, "kiwi" once in every
    // fourth line.
    let sent: Vec<(Vec<u8>, Vec<u8>)> = (0..400)
        .map(|i| {
            let text = if i % 4 == 0 { "apple kiwi apple" } else { "apple apple" };
            (format!("line-{i}").into_bytes(), text.as_bytes().to_vec())
        })
        .collect();
    kafka.produce(&input, &sent).await?;
    kafka
        .wait_committed(&format!("sluice-{name}"), &input, 4, 400, Duration::from_secs(120))
        .await?;
    // Committed offsets come before the store's own commit step: wait for both to hold it.
    let query = |port: u16, args: &[&str]| -> anyhow::Result<serde_json::Value> {
        let admin = format!("127.0.0.1:{port}");
        let mut all = vec!["query", name.as_str(), "counts"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--admin", &admin, "--output", "json"]);
        let (ok, out, err) = cli(&all)?;
        anyhow::ensure!(ok, "sluice query failed: {err}");
        Ok(serde_json::from_str(&out)?)
    };
    let total = |v: &serde_json::Value| -> u64 {
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            // The store holds counts as the SDK encodes a u64: 8 bytes, big-endian.
            .map(|e| u64::from_str_radix(e["value_hex"].as_str().unwrap(), 16).unwrap())
            .sum()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let answers = [query(ports[0], &["apple"])?, query(ports[1], &["apple"])?];
        if answers.iter().all(|a| total(a) == 800) {
            // Both workers answered the same, from the tasks of both (each has two).
            assert_eq!(answers[0]["entries"], answers[1]["entries"]);
            let workers: std::collections::BTreeSet<&str> = answers[0]["entries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["worker"].as_str().unwrap())
                .collect();
            assert_eq!(workers.len(), 2, "{}", answers[0]);
            assert_eq!(answers[0]["partitions_missing"], serde_json::json!([]));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "apple counts: {answers:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(total(&query(ports[1], &["kiwi"])?), 100);
    // A range: every word from "a" up to (not including) "b" is "apple", one per partition.
    let range = query(ports[0], &["--from", "a", "--to", "b"])?;
    let keys: Vec<&str> = range["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, vec!["apple"; 4], "{range}");
    // A key nobody has, and a store the topology does not declare.
    let (ok, _, err) = cli(&[
        "query",
        &name,
        "counts",
        "durian",
        "--admin",
        &format!("127.0.0.1:{}", ports[0]),
    ])?;
    assert!(!ok && err.contains("no such key"), "{err}");
    let (ok, _, err) = cli(&[
        "query",
        &name,
        "nope",
        "apple",
        "--admin",
        &format!("127.0.0.1:{}", ports[0]),
    ])?;
    assert!(!ok && err.contains("[no-such-store]"), "{err}");
    for w in &mut workers {
        assert!(w.terminate(Duration::from_secs(60))?.success());
    }
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

/// One configuration file: worker settings under dotted keys (here the cluster, the admin
/// listener and the group timings come only from the file) and a tenant's limits on
/// records per second, deploys per minute and state, all enforced; `sluice config show`
/// gives each value's origin; a wrong key is refused by name before the worker starts.
#[tokio::test(flavor = "multi_thread")]
async fn the_configuration_file_sets_the_worker_and_its_tenants_limits() -> anyhow::Result<()> {
    let kafka = kafka();
    let id = unique_name("g");
    let ns = format!("g-{id}.");
    let (input, output) = (format!("{ns}in"), format!("{ns}out"));
    kafka.create_topic(&input, 1).await?;
    kafka.create_topic(&output, 1).await?;
    let dir = TempDir::new("config-file");
    let port = free_port();
    let cluster = unique_name("c");
    let config = dir.write(
        "sluice.toml",
        &format!(
            "cluster.name = \"{cluster}\"\nsession.timeout.ms = 6000\nheartbeat.interval.ms = 200\n\
             commit.interval.ms = 200\nstate.dir = \"state\"\n\n\
             [admin]\nlistener = \"127.0.0.1:{port}\"\ntokens = [\"{}\"]\n\n\
             [tenants.gamma]\ntokens = [\"{}\"]\nnamespace = \"{ns}\"\n\
             max-records-per-second = 50\nmax-deploys-per-minute = 2\nmax-state = \"1MiB\"\n",
            sluice::tenants::hash_token("root-token"),
            sluice::tenants::hash_token("gamma-token"),
        ),
    );
    let config_arg = config.to_str().unwrap();

    // What a worker would start with, and where each value comes from.
    let (ok, out, err) = cli(&[
        "config",
        "show",
        "--config",
        config_arg,
        "--bootstrap",
        kafka.bootstrap(),
        "--output",
        "json",
    ])?;
    assert!(ok, "{err}");
    let shown: serde_json::Value = serde_json::from_str(&out)?;
    let setting = |key: &str| {
        (
            shown["settings"][key]["value"].as_str().unwrap_or("?").to_string(),
            shown["settings"][key]["origin"].as_str().unwrap_or("?").to_string(),
        )
    };
    assert_eq!(setting("cluster.name"), (cluster.clone(), "file".into()));
    assert_eq!(setting("commit.interval.ms"), ("200ms".into(), "file".into()));
    assert_eq!(setting("bootstrap.servers").1, "flag");
    assert_eq!(setting("num.standby.replicas"), ("0".into(), "default".into()));
    let state_dir = dir.path().join("state");
    assert_eq!(
        setting("state.dir").0,
        state_dir.to_str().unwrap(),
        "relative to the file"
    );
    assert_eq!(shown["tenants"]["gamma"]["max-records-per-second"], 50);
    assert_eq!(shown["valid"], true);

    // A wrong key stops a worker before it starts, naming the key.
    let bad = dir.write("bad.toml", "num.standby.replica = 1\n");
    let (ok, _, err) = cli(&[
        "worker",
        "--config",
        bad.to_str().unwrap(),
        "--bootstrap",
        kafka.bootstrap(),
    ])?;
    assert!(!ok);
    assert!(
        err.contains("unknown key `num.standby.replica` (did you mean `num.standby.replicas`?)"),
        "{err}"
    );

    // The worker: only its bootstrap is a flag; it joins the file's cluster and listens on
    // the file's admin address.
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &["--config", config_arg])?;
    worker.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let admin = format!("127.0.0.1:{port}");
    let as_gamma = |args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend_from_slice(&["--admin", &admin, "--token", "gamma-token", "--output", "json"]);
        cli(&all)
    };
    let upper = guest("uppercase");
    let name = format!("{ns}shout");
    let m1 = dir.write(
        "shout.toml",
        &manifest(&name, &[("input", &input)], &[("output", &output)], ""),
    );
    let deploy =
        |m: &std::path::Path| as_gamma(&["deploy", upper.to_str().unwrap(), "--manifest", m.to_str().unwrap()]);
    let (ok, out, err) = deploy(&m1)?;
    assert!(ok, "{err}");
    let entry: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(
        (entry["max_records_per_second"].as_u64(), entry["max_state"].as_u64()),
        (Some(50), Some(1 << 20)),
        "the tenant's caps go with its topology: {entry}"
    );
    until_settled(std::slice::from_mut(&mut worker), 1).await?;

    // 300 records at most 50 a second (a burst of 12 first): at least 5.7 s, where the
    // worker unlimited takes well under one.
    const N: usize = 300;
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..N)
        .map(|i| (format!("k{i}").into_bytes(), format!("v{i}").into_bytes()))
        .collect();
    let started = std::time::Instant::now();
    kafka.produce(&input, &records).await?;
    let got = kafka.consume(&output, N, Duration::from_secs(120)).await?;
    let took = started.elapsed();
    assert_eq!(got.len(), N);
    assert_eq!(got[N - 1].value.as_deref(), Some(format!("V{}", N - 1).as_bytes()));
    eprintln!("{N} records at max-records-per-second = 50 took {took:?}");
    assert!(
        took >= Duration::from_millis(5_700),
        "{N} records in {took:?}: faster than 50 a second"
    );

    // Two deploys a minute: the first and an upgrade pass, the third is refused.
    let m2 = dir.write(
        "shout2.toml",
        &manifest(
            &name,
            &[("input", &input)],
            &[("output", &output)],
            "on-error = \"skip\"",
        ),
    );
    let (ok, _, err) = deploy(&m2)?;
    assert!(ok, "{err}");
    let (ok, _, err) = deploy(&m1)?;
    assert!(!ok, "a third deploy within a minute was accepted");
    assert!(
        err.contains("[over-limit]") && err.contains("max-deploys-per-minute = 2"),
        "{err}"
    );
    assert_eq!(
        listed_as(&admin, "root-token")?.get(&name),
        Some(&2),
        "the refusal changed nothing"
    );
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    Ok(())
}

/// Names and versions the registry lists for a caller with `token`.
fn listed_as(admin: &str, token: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    let (ok, out, err) = cli(&[
        "topologies",
        "list",
        "--admin",
        admin,
        "--token",
        token,
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
    // From the latest: nothing again; what comes next is processed.
    deploy(Some("latest"))?;
    until_settled(&mut workers, 1).await?;
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
