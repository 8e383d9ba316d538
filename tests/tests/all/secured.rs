//! Sluice on a secured Kafka (`dev/kafka up --security sasl_ssl`: SASL_SSL, ACLs on): the
//! workers run on exactly the ACLs `sluice acls --worker` derives, and the broker refuses a
//! tenant's principal what is not its own.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use rdkafka::producer::{FutureProducer, FutureRecord};
use sluice::group::membership::{Membership, MembershipConfig, MembershipError};
use sluice::group::metadata::MemberMetadata;
use sluice_tests::worker::{dump_counts, guest, manifest, sluice_binary, TempDir, WorkerProcess};
use sluice_tests::{secured, unique_name};

use crate::cluster::until_settled;

/// `sluice acls …` connecting as `user` of the secured cluster.
fn acls_as(user: &str, args: &[&str]) -> anyhow::Result<String> {
    let kafka = secured();
    let out = std::process::Command::new(sluice_binary())
        .arg("acls")
        .args(args)
        .args(["--bootstrap", kafka.bootstrap()])
        .envs(kafka.env_as(user))
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "sluice acls {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// A tenant's principal, with the ACLs `sluice acls --tenant` gives it, may feed its own
/// namespace and nothing else: not another namespace, not the cluster's registry, not the
/// cluster's group.
#[tokio::test(flavor = "multi_thread")]
async fn the_broker_refuses_a_tenant_the_registry_the_cluster_group_and_other_namespaces() -> anyhow::Result<()> {
    let kafka = secured();
    let id = unique_name("z");
    let (mine, theirs) = (format!("ta-{id}."), format!("tb-{id}."));
    let cluster = unique_name("sec");
    let registry = format!("sluice.cluster.{cluster}.registry");
    for topic in [format!("{mine}in"), format!("{theirs}in"), registry.clone()] {
        kafka.create_topic(&topic, 1).await?;
    }
    let dir = TempDir::new("tenant-acls");
    let config = dir.write(
        "sluice.toml",
        &format!("[tenants.tenant-a]\nnamespace = \"{mine}\"\n[tenants.tenant-b]\nnamespace = \"{theirs}\"\n"),
    );
    // What the commands would be, then the same ACLs created.
    let printed = acls_as("admin", &["--tenant", "tenant-a", "--config", config.to_str().unwrap()])?;
    assert!(
        printed.contains("--allow-principal User:tenant-a") && printed.contains(&mine),
        "{printed}"
    );
    assert!(
        !printed.contains("sluice."),
        "a tenant gets nothing of sluice.: {printed}"
    );
    acls_as(
        "admin",
        &["--tenant", "tenant-a", "--config", config.to_str().unwrap(), "--apply"],
    )?;

    let producer: FutureProducer = kafka
        .config_as("tenant-a")
        .set("message.timeout.ms", "10000")
        .create()?;
    let send = |topic: String| {
        let producer = producer.clone();
        async move {
            producer
                .send(FutureRecord::to(&topic).key("k").payload("v"), Duration::from_secs(10))
                .await
                .map(|_| ())
                .map_err(|(e, _)| e.to_string())
        }
    };
    // ACLs take a moment to reach the broker's authorizer.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match send(format!("{mine}in")).await {
            Ok(()) => break,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("own namespace not writable yet: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("tenant-a cannot write its own namespace: {e}"),
        }
    }
    let refused = send(format!("{theirs}in"))
        .await
        .expect_err("tenant-a wrote another namespace");
    assert!(refused.contains("Authorization"), "{refused}");
    let refused = send(registry.clone()).await.expect_err("tenant-a wrote the registry");
    assert!(refused.contains("Authorization"), "{refused}");

    let mut member = Membership::new(MembershipConfig {
        kafka: kafka.settings("tenant-a")?,
        group: sluice::group::cluster_group(&cluster),
        assignor: "sticky".into(),
        secret: None,
        instance_id: None,
        session_timeout: Duration::from_secs(10),
        rebalance_timeout: Duration::from_secs(10),
    });
    let joined = tokio::time::timeout(
        Duration::from_secs(30),
        member.join(&MemberMetadata::default(), |_| BTreeMap::new()),
    )
    .await?;
    match joined {
        Err(MembershipError::Refused { reason, .. }) => {
            assert!(reason.contains("GroupAuthorizationFailed"), "{reason}")
        }
        other => panic!("tenant-a joined the cluster's group: {other:?}"),
    }
    Ok(())
}

fn lines(range: std::ops::Range<usize>) -> Vec<(Vec<u8>, Vec<u8>)> {
    range
        .map(|i| {
            (
                format!("line-{i}").into_bytes(),
                format!("w{} w{} w{}", i % 499, (i * 7) % 1003, i % 13).into_bytes(),
            )
        })
        .collect()
}

/// Two workers whose principal has exactly the ACLs `sluice acls --worker` derives run an
/// exactly-once word count while the second joins and its learners take tasks over; the
/// final stores equal the truth.
#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_with_a_learner_move_runs_on_exactly_the_workers_acls() -> anyhow::Result<()> {
    let kafka = secured();
    let ns = format!("{}.", unique_name("wc"));
    let (input, output) = (format!("{ns}lines"), format!("{ns}counts"));
    kafka.create_topic(&input, 4).await?;
    kafka.create_topic(&output, 4).await?;
    let cluster = unique_name("sec");
    let printed = acls_as(
        "admin",
        &[
            "--worker",
            "--principal",
            "User:sluice",
            "--cluster",
            &cluster,
            "--namespace",
            &ns,
        ],
    )?;
    assert!(
        printed.contains(&format!("sluice.cluster.{cluster}.registry")),
        "{printed}"
    );
    acls_as(
        "admin",
        &[
            "--worker",
            "--principal",
            "User:sluice",
            "--cluster",
            &cluster,
            "--namespace",
            &ns,
            "--apply",
        ],
    )?;
    let dir = TempDir::new("secured-wc");
    let name = format!("{ns}wc");
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
    let start = |n: usize| {
        let state = dir.path().join(format!("state-{n}"));
        let mut command_env = kafka.env_as("sluice");
        command_env.push(("SLUICE_PROCESSING_GUARANTEE".into(), "exactly-once".into()));
        WorkerProcess::start_with_env(
            kafka.bootstrap(),
            dir.path(),
            &[
                "--topology",
                m.to_str().unwrap(),
                "--cluster",
                &cluster,
                "--no-drain-on-stop",
                "--state-dir",
                state.to_str().unwrap(),
                "--heartbeat-interval",
                "200ms",
                "--session-timeout",
                "6s",
                "--commit-interval",
                "200ms",
                "--acceptable-recovery-lag",
                "2000",
            ],
            &command_env,
        )
    };
    let mut sent = lines(0..20_000);
    let mut positions = kafka.produce(&input, &sent).await?;
    let mut workers = vec![start(0)?];
    until_settled(&mut workers, 4).await?;
    kafka
        .wait_committed(&format!("sluice-{name}"), &input, 4, 20_000, Duration::from_secs(120))
        .await?;
    workers.push(start(1)?);
    let more = lines(20_000..24_000);
    positions.extend(kafka.produce(&input, &more).await?);
    sent.extend(more);
    let settled = until_settled(&mut workers, 2).await?;
    kafka
        .wait_committed(&format!("sluice-{name}"), &input, 4, 24_000, Duration::from_secs(120))
        .await?;
    let joined = workers[1].log();
    assert!(
        joined.contains("learner promoted"),
        "no learner took a task over:\n{joined}"
    );
    for w in &mut workers {
        assert!(w.terminate(Duration::from_secs(60))?.success(), "{}", w.log());
    }
    let mut truth: HashMap<i32, BTreeMap<String, u64>> = HashMap::new();
    for ((_, line), (partition, _)) in sent.iter().zip(&positions) {
        for word in std::str::from_utf8(line)?.split(' ') {
            *truth
                .entry(*partition)
                .or_default()
                .entry(word.to_string())
                .or_insert(0) += 1;
        }
    }
    for (n, tasks) in settled.iter().enumerate() {
        let state = dir.path().join(format!("state-{n}"));
        for task in tasks {
            let p: i32 = task.rsplit('/').next().unwrap().parse()?;
            assert_eq!(
                dump_counts(&state, &name, p, "counts")?,
                truth[&p],
                "{task}: the store on its owner differs from the truth"
            );
        }
    }
    Ok(())
}
