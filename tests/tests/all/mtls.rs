//! Sluice on a Kafka that takes client certificates (`dev/kafka up --security mtls`: SSL with
//! `ssl.client.auth=required`, a principal per certificate's CN, ACLs on): a worker whose
//! certificate says CN=sluice is `User:sluice` and runs on exactly the ACLs `sluice acls
//! --worker` derives; a client without a certificate, with one of another CA (even for
//! CN=worker) or with an expired one is refused at once, naming the broker and why.

use std::path::Path;
use std::time::{Duration, Instant};

use rdkafka::producer::{FutureProducer, FutureRecord};
use sluice_tests::worker::{guest, manifest, sluice_binary, TempDir, WorkerProcess};
use sluice_tests::{mtls_secured, unique_name};

/// `sluice ARGS` connecting as `user` of the mutual-TLS cluster: (success, stdout, stderr).
fn sluice_as(user: &str, args: &[&str]) -> anyhow::Result<(bool, String, String)> {
    let kafka = mtls_secured();
    let out = std::process::Command::new(sluice_binary())
        .args(args)
        .args(["--bootstrap", kafka.bootstrap()])
        .envs(kafka.env_as(user))
        .output()?;
    Ok((
        out.status.success(),
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    ))
}

/// The value of `name` in `user`'s environment (`dev/kafka credentials USER`).
fn env_of(user: &str, name: &str) -> String {
    mtls_secured()
        .env_as(user)
        .into_iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("{user} has no {name}"))
        .1
}

/// The tests here share the user `sluice`'s certificate (one makes it short-lived) and the
/// cluster's one broker (one restarts it): they run one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Grants `User:sluice` exactly what `sluice acls --worker` derives for `cluster` and the
/// topics of `namespace` (applied as admin).
fn grant_worker_acls(cluster: &str, namespace: &str) -> anyhow::Result<()> {
    let acls = [
        "acls",
        "--worker",
        "--principal",
        "User:sluice",
        "--cluster",
        cluster,
        "--namespace",
        namespace,
        "--apply",
    ];
    let (ok, stdout, stderr) = sluice_as("admin", &acls)?;
    assert!(ok, "sluice acls --apply as admin: {stderr}");
    assert!(stdout.contains("User:sluice"), "{stdout}");
    Ok(())
}

/// The arguments of a worker of `cluster` running `topology` with its state in `state`.
fn worker_args(topology: &Path, cluster: &str, state: &Path) -> Vec<String> {
    [
        "--topology",
        topology.to_str().unwrap(),
        "--cluster",
        cluster,
        "--state-dir",
        state.to_str().unwrap(),
        "--heartbeat-interval",
        "200ms",
        "--session-timeout",
        "6s",
        "--commit-interval",
        "200ms",
        "--no-drain-on-stop",
    ]
    .map(String::from)
    .to_vec()
}

/// A worker whose certificate is CN=sluice (`User:sluice`, with exactly the ACLs `sluice acls
/// --worker --principal User:sluice` derives for its cluster and namespace) runs uppercase:
/// every record comes out, exactly. A tenant's certificate is its own principal (refused
/// the worker's topics). Then refused at the TLS handshake, each naming the broker and why,
/// and a worker exiting non-zero within seconds rather than retrying: no certificate; a
/// certificate for CN=worker signed by another CA; a certificate of the cluster's CA that
/// has expired (`dev/kafka renew-cert --seconds 1`), which a renewal in place makes good
/// again.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_runs_as_its_certificate_and_clients_without_one_of_the_ca_are_refused() -> anyhow::Result<()> {
    let _alone = ONE_AT_A_TIME.lock().await;
    let kafka = mtls_secured();
    let ns = format!("{}.", unique_name("mt"));
    let (input, output) = (format!("{ns}in"), format!("{ns}out"));
    kafka.create_topic(&input, 2).await?;
    kafka.create_topic(&output, 2).await?;
    let cluster = unique_name("mtls");
    grant_worker_acls(&cluster, &ns)?;

    let dir = TempDir::new("mtls");
    let name = format!("{ns}upper");
    let topology = dir.write(
        "upper.toml",
        &manifest(
            &name,
            &guest("uppercase"),
            &[("input", &input)],
            &[("output", &output)],
            "",
        ),
    );
    let worker_args = |state: &str| worker_args(&topology, &cluster, &dir.path().join(state));
    let args = worker_args("state-0");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env = kafka.env_as("sluice");
    assert!(
        env.iter()
            .any(|(k, v)| k == "SLUICE_KAFKA_SECURITY_PROTOCOL" && v == "SSL")
            && env.iter().any(|(k, _)| k == "SLUICE_KAFKA_SSL_CERTIFICATE_LOCATION")
            && !env.iter().any(|(k, _)| k.starts_with("SLUICE_KAFKA_SASL")),
        "the worker would not connect by certificate alone: {env:?}"
    );
    let mut w = WorkerProcess::start_with_only_env(kafka.bootstrap(), dir.path(), &args, &env)?;
    w.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let sent: Vec<(Vec<u8>, Vec<u8>)> = (0..200)
        .map(|i| {
            (
                format!("k{i}").into_bytes(),
                format!("value {i} of mutual tls").into_bytes(),
            )
        })
        .collect();
    kafka.produce(&input, &sent[..100]).await?;
    kafka.produce(&input, &sent[100..]).await?;
    let got = kafka.consume(&output, sent.len(), Duration::from_secs(60)).await?;
    let mut want: Vec<(Vec<u8>, Vec<u8>)> = sent.iter().map(|(k, v)| (k.clone(), v.to_ascii_uppercase())).collect();
    let mut seen: Vec<(Vec<u8>, Vec<u8>)> = got
        .iter()
        .map(|r| (r.key.clone().unwrap_or_default(), r.value.clone().unwrap_or_default()))
        .collect();
    want.sort();
    seen.sort();
    assert_eq!(seen.len(), want.len(), "records lost or doubled");
    assert_eq!(seen, want);
    let log = w.log();
    for bad in [
        "TLS failed",
        "SSL handshake failed",
        "Authorization",
        "authorization failed",
    ] {
        assert!(!log.contains(bad), "the worker logged {bad:?}:\n{log}");
    }
    assert!(w.terminate(Duration::from_secs(30))?.success(), "{}", w.log());

    // The principal is the certificate's CN: tenant-a (no ACLs on the namespace) may not
    // write the worker's topic, whatever the worker may.
    let producer: FutureProducer = kafka
        .config_as("tenant-a")
        .set("message.timeout.ms", "10000")
        .create()?;
    let refused = producer
        .send(FutureRecord::to(&input).key("k").payload("v"), Duration::from_secs(10))
        .await
        .map(|_| ())
        .expect_err("tenant-a's certificate wrote the worker's topic");
    assert!(refused.0.to_string().contains("Authorization"), "{:?}", refused.0);

    // Refused at the TLS handshake: a worker exits non-zero at once, naming the broker and
    // what it refused.
    let ca = env_of("worker", "SLUICE_KAFKA_SSL_CA_LOCATION");
    let stranger = env_of("stranger", "SLUICE_KAFKA_SSL_CERTIFICATE_LOCATION");
    let broker = format!("broker {}", kafka.bootstrap());
    for (what, env, names) in [
        (
            "no certificate",
            vec![
                ("SLUICE_KAFKA_SECURITY_PROTOCOL".to_string(), "SSL".to_string()),
                ("SLUICE_KAFKA_SSL_CA_LOCATION".to_string(), ca.clone()),
            ],
            "TLS failed: the broker ended TLS with the alert BadCertificate: it asks for a client certificate \
             and none is set (kafka.ssl.certificate.location, kafka.ssl.key.location)"
                .to_string(),
        ),
        (
            "CN=worker of another CA",
            kafka.env_as("stranger"),
            format!(
                "TLS failed: the broker ended TLS with the alert CertificateUnknown: it does not take the client \
                 certificate {stranger} (not signed by a CA it trusts, expired, or not for client authentication)"
            ),
        ),
    ] {
        let args = worker_args(&unique_name("state"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let started = Instant::now();
        let mut w = WorkerProcess::start_with_only_env(kafka.bootstrap(), dir.path(), &args, &env)?;
        let status = w.wait(Duration::from_secs(60))?;
        let took = started.elapsed();
        let log = w.log();
        assert!(!status.success(), "{what}: the worker ran:\n{log}");
        assert!(
            log.contains("connecting to Kafka") && log.contains(&broker) && log.contains(&names),
            "{what}: the worker's error does not say why:\n{log}"
        );
        assert!(
            took < Duration::from_secs(20),
            "{what}: the worker took {took:?} to give up"
        );
        eprintln!("{what}: the worker exited ({status}) after {took:?}");
    }

    // A certificate of the cluster's CA that has expired: refused; renewed in place (a new
    // serial, the same key), the same files connect again (tenant-b has no ACLs: what it
    // hears is the authorizer's answer, past TLS).
    let cert = env_of("tenant-b", "SLUICE_KAFKA_SSL_CERTIFICATE_LOCATION");
    let short = kafka.renew_certificate("tenant-b", &["--seconds", "1"])?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let topic = unique_name("tb");
    let create = ["topics", "create", &topic];
    let (ok, _, stderr) = sluice_as("tenant-b", &create)?;
    assert!(!ok, "an expired certificate created a topic");
    assert!(
        stderr.contains(&broker)
            && stderr.contains(&format!(
                "the broker ended TLS with the alert CertificateUnknown: it does not take the client certificate {cert}"
            )),
        "an expired certificate: {stderr}"
    );
    let renewed = kafka.renew_certificate("tenant-b", &[])?;
    assert_ne!(short, renewed, "renew-cert kept the serial");
    let (ok, _, stderr) = sluice_as("tenant-b", &create)?;
    assert!(!ok, "tenant-b created a topic without an ACL");
    assert!(
        stderr.contains("TopicAuthorizationFailed") && !stderr.contains("TLS"),
        "a renewed certificate: {stderr}"
    );
    Ok(())
}

/// How long the certificate a worker starts with lives: long enough for it to start and
/// process the first records (here that takes 2-10 s), short enough to wait out.
const SHORT_LIFE: Duration = Duration::from_secs(40);

/// Puts `sluice`'s certificate back to one of the usual 30 days when dropped (on a failure
/// too): the other tests here connect with it.
struct LongLivedAgain;

impl Drop for LongLivedAgain {
    fn drop(&mut self) {
        match mtls_secured().renew_certificate("sluice", &[]) {
            Ok(serial) => eprintln!("sluice's certificate is long-lived again (serial {serial})"),
            Err(e) => eprintln!("could not renew sluice's certificate back to a long-lived one: {e:#}"),
        }
    }
}

/// `n` records of `phase`, their keys and values its own.
fn records(phase: &str, n: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..n)
        .map(|i| {
            (
                format!("{phase}-{i}").into_bytes(),
                format!("value {i} of {phase}").into_bytes(),
            )
        })
        .collect()
}

/// What the uppercase guest makes of `sent`.
fn uppercased(sent: &[(Vec<u8>, Vec<u8>)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    sent.iter().map(|(k, v)| (k.clone(), v.to_ascii_uppercase())).collect()
}

/// Reads `topic` (read-committed) from the beginning until every record of `want` has come
/// or `timeout` has passed: the (key, value) of every record read, and when the first one
/// whose key starts with `first_of` came.
async fn read_until_all(
    topic: &str,
    want: &[(Vec<u8>, Vec<u8>)],
    timeout: Duration,
    first_of: &str,
) -> anyhow::Result<(Vec<(Vec<u8>, Vec<u8>)>, Option<Instant>)> {
    use rdkafka::consumer::Consumer;
    use rdkafka::message::Message;
    let consumer = mtls_secured().consumer(&unique_name("test-reader"))?;
    consumer.subscribe(&[topic])?;
    let mut missing: std::collections::BTreeSet<&(Vec<u8>, Vec<u8>)> = want.iter().collect();
    let (mut read, mut first) = (Vec::new(), None);
    let deadline = tokio::time::Instant::now() + timeout;
    while !missing.is_empty() {
        let Ok(message) = tokio::time::timeout_at(deadline, consumer.recv()).await else {
            break;
        };
        let message = message?;
        let record = (
            message.key().unwrap_or_default().to_vec(),
            message.payload().unwrap_or_default().to_vec(),
        );
        if first.is_none() && record.0.starts_with(first_of.as_bytes()) {
            first = Some(Instant::now());
        }
        missing.remove(&record);
        read.push(record);
    }
    Ok((read, first))
}

/// The worker's `GET /status` (generation, rebalances, tasks).
fn worker_status(admin: u16) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::from_str(&sluice_tests::http_get(admin, "/status")?)?)
}

/// The lines of a worker's log that say something about TLS or certificates (each message
/// once, the first time; the first 30 of them).
fn tls_lines(log: &str) -> String {
    let mut seen = std::collections::HashSet::new();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| {
            ["TLS", "SSL", "certificate", "Certificate"]
                .iter()
                .any(|w| l.contains(w))
        })
        .filter(|l| !l.contains("AllBrokersDown") && !l.contains("Connection refused"))
        // Each message once: without its time stamp and counts.
        .filter(|l| seen.insert(l.chars().filter(|c| !c.is_ascii_digit()).collect::<String>()))
        .collect();
    lines[..lines.len().min(30)].join("\n")
}

/// A worker whose client certificate (CN=sluice) is about to expire, its file renewed in
/// place (a new key, a new certificate: what a certificate manager does) while the worker
/// runs uppercase, goes on with the renewed one without being restarted: once the old
/// certificate has expired, a restart of the broker makes every connection of the worker
/// be made again, and with the old certificate the broker would refuse them. Every record
/// sent before the renewal, after it, while the broker restarts and after it comes out
/// uppercased (under exactly-once exactly once each, under at-least-once at least once and
/// nothing else); the worker is the process that started, still running, and it never lost
/// its tasks (the same group generation, each task started once).
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_takes_its_renewed_certificate_without_a_restart() -> anyhow::Result<()> {
    let _alone = ONE_AT_A_TIME.lock().await;
    let _long_lived_again = LongLivedAgain;
    for guarantee in ["exactly-once", "at-least-once"] {
        through_a_renewal_and_a_broker_restart(guarantee).await?;
    }
    Ok(())
}

async fn through_a_renewal_and_a_broker_restart(guarantee: &str) -> anyhow::Result<()> {
    let kafka = mtls_secured();
    let ns = format!("{}.", unique_name("mr"));
    let (input, output) = (format!("{ns}in"), format!("{ns}out"));
    kafka.create_topic(&input, 2).await?;
    kafka.create_topic(&output, 2).await?;
    let cluster = unique_name("mtls-renew");
    grant_worker_acls(&cluster, &ns)?;
    let dir = TempDir::new("mtls-renew");
    let name = format!("{ns}upper");
    let topology = dir.write(
        "upper.toml",
        &manifest(
            &name,
            &guest("uppercase"),
            &[("input", &input)],
            &[("output", &output)],
            "",
        ),
    );
    let admin = sluice_tests::free_port();
    let mut args = worker_args(&topology, &cluster, &dir.path().join("state"));
    // A session that outlasts the broker's restart (10-20 s here): with a certificate the
    // broker takes, the worker keeps its membership and its tasks through it.
    let session = args.iter().position(|a| a == "--session-timeout").unwrap() + 1;
    args[session] = "45s".into();
    args.extend(
        [
            "--processing-guarantee",
            guarantee,
            "--metrics",
            &format!("127.0.0.1:{admin}"),
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    // The worker starts with a certificate about to expire.
    let old = kafka.renew_certificate("sluice", &["--seconds", &SHORT_LIFE.as_secs().to_string()])?;
    let expires = Instant::now() + SHORT_LIFE;
    let started = Instant::now();
    let mut w = WorkerProcess::start_with_only_env(kafka.bootstrap(), dir.path(), &args, &kafka.env_as("sluice"))?;
    let pid = w.pid();
    w.wait_for_line(&[" assignment "], Duration::from_secs(30))?;
    let before = records("before", 100);
    kafka.produce(&input, &before).await?;
    let (read, _) = read_until_all(&output, &uppercased(&before), Duration::from_secs(30), "before").await?;
    let first_out = started.elapsed();
    assert!(
        uppercased(&before).iter().all(|r| read.contains(r)),
        "{guarantee}: {} of the {} records before the renewal came out within 30 s:\n{}",
        read.len(),
        before.len(),
        w.log()
    );
    anyhow::ensure!(
        Instant::now() + Duration::from_secs(5) < expires,
        "{guarantee}: the worker took {first_out:?} to start and process the first records, too near the \
         {SHORT_LIFE:?} its certificate lives: make SHORT_LIFE longer"
    );
    // The group's view once settled, to compare with at the end.
    let status = worker_status(admin)?;
    let settled = Instant::now();
    let (generation, rebalances) = (status["generation"].clone(), status["rebalances"].clone());
    assert!(
        status["tasks"].as_array().is_some_and(|t| t.len() == 2),
        "{guarantee}: {status}"
    );

    // Renewed in place while it runs, a new key with it, before the old one expires.
    let renewed = kafka.renew_certificate("sluice", &["--new-key"])?;
    assert_ne!(old, renewed, "renew-cert kept the serial");
    let renewed_at = started.elapsed();
    let after_renewal = records("renewed", 100);
    kafka.produce(&input, &after_renewal).await?;

    // Once the old certificate has surely expired, the broker restarts: every connection of
    // the worker is made again, with the certificate it has now.
    tokio::time::sleep_until((expires + Duration::from_secs(3)).into()).await;
    let restart_at = Instant::now();
    let restarting = tokio::task::spawn_blocking(|| mtls_secured().dev_kafka(&["restart", "--node", "1"]));
    // Records keep coming while the broker is down (the producer holds them until it is back).
    let producer = kafka.producer()?;
    let mut while_restarting = Vec::new();
    let mut deliveries = Vec::new();
    while !restarting.is_finished() {
        let i = while_restarting.len();
        let record = (
            format!("restarting-{i}").into_bytes(),
            format!("value {i} of restarting").into_bytes(),
        );
        deliveries.push(
            producer
                .send_result(FutureRecord::to(&input).key(&record.0).payload(&record.1))
                .map_err(|(e, _)| anyhow::anyhow!("producing to {input}: {e}"))?,
        );
        while_restarting.push(record);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    restarting.await??;
    let back = Instant::now();
    for delivery in deliveries {
        delivery
            .await?
            .map_err(|(e, _)| anyhow::anyhow!("producing to {input} while the broker restarted: {e}"))?;
    }
    let after_restart = records("after", 100);
    kafka.produce(&input, &after_restart).await?;

    // Every record out, uppercased.
    let sent: Vec<(Vec<u8>, Vec<u8>)> = [&before, &after_renewal, &while_restarting, &after_restart]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
    let mut want = uppercased(&sent);
    want.sort();
    let (read, first_after) = read_until_all(&output, &want, Duration::from_secs(90), "after").await?;
    let seen: std::collections::BTreeSet<&(Vec<u8>, Vec<u8>)> = read.iter().collect();
    let missing = |phase: &str| {
        want.iter()
            .filter(|r| r.0.starts_with(phase.as_bytes()) && !seen.contains(r))
            .count()
    };
    let exited = w.wait(Duration::ZERO).ok();
    eprintln!(
        "{guarantee}: {} records sent ({} before the renewal, {} after it, {} while the broker restarted, {} \
         after), {} read; first output {first_out:?} after the start, renewed at {renewed_at:?}, the broker \
         restarted {:?} after the old certificate expired and took {:?}; first output of the records after \
         it {:?} after it was back",
        sent.len(),
        before.len(),
        after_renewal.len(),
        while_restarting.len(),
        after_restart.len(),
        read.len(),
        restart_at - expires,
        back - restart_at,
        first_after.map(|f| f - back),
    );
    assert!(
        want.iter().all(|r| seen.contains(r)),
        "{guarantee}: records sent never came out uppercased within 90 s of the broker's restart (the old \
         certificate expired, the renewed one on disk): missing {} of {} before the renewal, {} of {} after \
         it, {} of {} while the broker restarted, {} of {} after; the worker {}; its log about TLS:\n{}",
        missing("before"),
        before.len(),
        missing("renewed"),
        after_renewal.len(),
        missing("restarting"),
        while_restarting.len(),
        missing("after"),
        after_restart.len(),
        exited.map_or("is still running".to_string(), |s| format!("exited ({s})")),
        tls_lines(&w.log()),
    );
    let unsent: Vec<_> = seen.iter().filter(|r| want.binary_search(r).is_err()).collect();
    assert!(
        unsent.is_empty(),
        "{guarantee}: records out that were never sent: {unsent:?}"
    );
    if guarantee == "exactly-once" {
        // What came out is all that is there (a transaction still open would be read now).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let all = kafka.read_all(&output, Duration::from_secs(30))?;
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = all
            .iter()
            .map(|r| (r.key.clone().unwrap_or_default(), r.value.clone().unwrap_or_default()))
            .collect();
        out.sort();
        assert_eq!(out.len(), want.len(), "{guarantee}: records lost or doubled");
        assert_eq!(out, want, "{guarantee}: not each record exactly once");
    } else {
        eprintln!("{guarantee}: {} copies beyond one", read.len() - seen.len());
    }

    // The same process, still running, its tasks never lost.
    assert!(
        exited.is_none() && w.pid() == pid,
        "{guarantee}: the worker exited ({exited:?}):\n{}",
        w.log()
    );
    // Its tasks never lost: the same generation of its group, each task active here since
    // before the restart, none handed over, none started again.
    let status = worker_status(admin)?;
    eprintln!(
        "{guarantee}: generation {generation} -> {}, rebalances {rebalances} -> {}",
        status["generation"], status["rebalances"]
    );
    assert_eq!(
        status["generation"], generation,
        "{guarantee}: the worker lost its membership: {status}"
    );
    let tasks = status["tasks"].as_array().cloned().unwrap_or_default();
    assert_eq!(tasks.len(), 2, "{guarantee}: the worker's tasks: {status}");
    for t in &tasks {
        assert!(
            t["role"] == "active"
                && t["phase"] == "running"
                && t["in_role_seconds"]
                    .as_f64()
                    .is_some_and(|s| s >= settled.elapsed().as_secs_f64()),
            "{guarantee}: task {} did not stay active on the worker through the restart: {status}",
            t["task"]
        );
    }
    assert_eq!(
        status["handovers"].as_array().map(Vec::len),
        Some(0),
        "{guarantee}: tasks moved: {status}"
    );
    let log = w.log();
    for p in 0..2 {
        let starts = log
            .lines()
            .filter_map(|l| l.split_once(": starting task=").map(|(_, task)| task))
            .filter(|task| task.split_whitespace().next() == Some(&format!("{name}/{p}")))
            .count();
        assert_eq!(starts, 1, "{guarantee}: task {p} was started {starts} times:\n{log}");
    }
    assert!(w.terminate(Duration::from_secs(30))?.success(), "{}", w.log());
    Ok(())
}
