//! Sluice on a Kafka that takes client certificates (`dev/kafka up --security mtls`: SSL with
//! `ssl.client.auth=required`, a principal per certificate's CN, ACLs on): a worker whose
//! certificate says CN=sluice is `User:sluice` and runs on exactly the ACLs `sluice acls
//! --worker` derives; a client without a certificate, with one of another CA (even for
//! CN=worker) or with an expired one is refused at once, naming the broker and why.

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
    let kafka = mtls_secured();
    let ns = format!("{}.", unique_name("mt"));
    let (input, output) = (format!("{ns}in"), format!("{ns}out"));
    kafka.create_topic(&input, 2).await?;
    kafka.create_topic(&output, 2).await?;
    let cluster = unique_name("mtls");
    let acls = [
        "acls",
        "--worker",
        "--principal",
        "User:sluice",
        "--cluster",
        &cluster,
        "--namespace",
        &ns,
        "--apply",
    ];
    let (ok, stdout, stderr) = sluice_as("admin", &acls)?;
    assert!(ok, "sluice acls --apply as admin: {stderr}");
    assert!(stdout.contains("User:sluice"), "{stdout}");

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
    let worker_args = |state: &str| -> Vec<String> {
        [
            "--topology",
            topology.to_str().unwrap(),
            "--cluster",
            &cluster,
            "--state-dir",
            dir.path().join(state).to_str().unwrap(),
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
    };
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
