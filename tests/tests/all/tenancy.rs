//! Tenants of a cluster: each sees and touches only its own topologies and topics, tenants
//! created through the API reach every worker, and the configuration file sets the worker's
//! settings and its tenants' limits.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_tests::worker::{guest, TempDir, WorkerProcess};
use sluice_tests::{free_port, kafka, unique_name};

use crate::cluster::until_settled;
use crate::registry::{cli, manifest, worker, Ran};

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
    let hash = |t: &str| sluice::registry::tenants::hash_token(t);
    let config = dir.write(
        "sluice.toml",
        &format!(
            "registry.secret = \"the tenants test's cluster secret\"\n\
             [admin]\ntokens = [\"{}\"]\n\n[tenants.alpha]\ntokens = [\"{}\"]\nnamespace = \"{a}\"\nmax-tasks = 2\n\n\
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
        // Refused as any name outside alpha's namespace is, taken or not: the answer does
        // not tell alpha that bravo has this topology (isolation.rs).
        (
            "overwrite",
            deploy_as("alpha-token", &shout(&b, "shout", &b)),
            "[foreign-name]",
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
             commit.interval.ms = 200\nstate.dir = \"state\"\n\
             registry.secret = \"the configuration test's cluster secret\"\n\n\
             [admin]\nlistener = \"127.0.0.1:{port}\"\ntokens = [\"{}\"]\n\n\
             [tenants.gamma]\ntokens = [\"{}\"]\nnamespace = \"{ns}\"\n\
             max-records-per-second = 50\nmax-deploys-per-minute = 2\nmax-state = \"1MiB\"\n",
            sluice::registry::tenants::hash_token("root-token"),
            sluice::registry::tenants::hash_token("gamma-token"),
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
