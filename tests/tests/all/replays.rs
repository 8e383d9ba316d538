//! Records written back into the registry topic by a tenant with write access to it (a
//! Kafka without ACLs): old records a worker signed, and floods of unsigned ones. A signature
//! says who wrote a record, a sequence when; a worker believes neither an old record written
//! back nor a forged one, and what it skips costs it bounded memory and log.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers as _, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use sluice::registry::tenants::hash_token;
use sluice_tests::worker::{cluster_worker, guest, TempDir, WorkerProcess};
use sluice_tests::{free_port, http, kafka, unique_name};

const SECRET: &str = "correct horse battery staple, but longer";

/// A record of the registry topic as it was written: key, value, headers.
#[derive(Debug, Clone)]
struct Written {
    key: String,
    value: Option<Vec<u8>>,
    headers: Vec<(String, Vec<u8>)>,
}

/// Every record of `topic` (one partition) whose key is `key`, in order.
fn written(topic: &str, key: &str) -> anyhow::Result<Vec<Written>> {
    let consumer: BaseConsumer = kafka()
        .config()
        .set("group.id", unique_name("registry-reader"))
        .set("enable.auto.commit", "false")
        .create()?;
    let (_, end) = consumer.fetch_watermarks(topic, 0, Duration::from_secs(10))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut position = 0;
    while position < end && Instant::now() < deadline {
        let Some(m) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let m = m?;
        position = m.offset() + 1;
        if m.key() != Some(key.as_bytes()) {
            continue;
        }
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
                    .collect()
            })
            .unwrap_or_default();
        out.push(Written {
            key: key.to_string(),
            value: m.payload().map(<[u8]>::to_vec),
            headers,
        });
    }
    Ok(out)
}

/// Writes `record` to `topic` again, as it was.
fn write_back(topic: &str, record: &Written) -> anyhow::Result<()> {
    let producer: ThreadedProducer<DefaultProducerContext> = kafka().config().create()?;
    let mut headers = OwnedHeaders::new();
    for (k, v) in &record.headers {
        headers = headers.insert(Header {
            key: k,
            value: Some(v.as_slice()),
        });
    }
    let mut r = BaseRecord::<str, [u8]>::to(topic)
        .key(&record.key)
        .partition(0)
        .headers(headers);
    if let Some(v) = &record.value {
        r = r.payload(v);
    }
    producer.send(r).map_err(|(e, _)| e)?;
    producer.flush(Duration::from_secs(10))?;
    Ok(())
}

struct Registry {
    dir: TempDir,
    cluster: String,
    config: std::path::PathBuf,
    port: u16,
    ns: String,
    worker: WorkerProcess,
}

impl Registry {
    /// One worker with an admin token (`root-token`), the secret and a tenant `alpha`
    /// (`alpha-token`, namespace `ns`) with an input and an output topic.
    async fn start(prefix: &str) -> anyhow::Result<Registry> {
        let ns = format!("{}.", unique_name(prefix));
        kafka().create_topic(&format!("{ns}in"), 1).await?;
        kafka().create_topic(&format!("{ns}out"), 1).await?;
        let dir = TempDir::new(prefix);
        let config = dir.write(
            "sluice.toml",
            &format!(
                "registry.secret = \"{SECRET}\"\n[admin]\ntokens = [\"{}\"]\n\n[tenants.alpha]\ntokens = [\"{}\"]\n\
                 namespace = \"{ns}\"\n",
                hash_token("root-token"),
                hash_token("alpha-token"),
            ),
        );
        let cluster = unique_name(prefix);
        let port = free_port();
        let worker = Registry::worker(&dir, &cluster, &config, port)?;
        Ok(Registry {
            dir,
            cluster,
            config,
            port,
            ns,
            worker,
        })
    }

    fn worker(dir: &TempDir, cluster: &str, config: &std::path::Path, port: u16) -> anyhow::Result<WorkerProcess> {
        let admin = format!("127.0.0.1:{port}");
        let mut w = cluster_worker(
            dir,
            None,
            cluster,
            0,
            &["--metrics", &admin, "--config", config.to_str().unwrap()],
        )?;
        w.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
        Ok(w)
    }

    fn restart(&mut self) -> anyhow::Result<()> {
        self.worker.terminate(Duration::from_secs(60))?;
        self.worker = Registry::worker(&self.dir, &self.cluster, &self.config, self.port)?;
        Ok(())
    }

    fn topic(&self) -> String {
        sluice::registry::topic(&self.cluster)
    }

    fn call(&self, method: &str, path: &str, token: &str, body: &[u8]) -> anyhow::Result<(u16, String)> {
        let auth = format!("Bearer {token}");
        http(
            self.port,
            method,
            path,
            &[("content-type", "application/json"), ("authorization", &auth)],
            body,
        )
    }

    /// How many registry records the worker skipped (its metric).
    fn rejected(&self) -> anyhow::Result<u64> {
        let (_, body) = self.call("GET", "/metrics", "root-token", b"")?;
        Ok(body
            .lines()
            .find(|l| l.starts_with("sluice_registry_rejected_records_total"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0) as u64)
    }

    /// Waits until the worker skipped `n` more records than `before`.
    async fn until_rejected(&self, before: u64, n: u64) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.rejected()? < before + n {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the worker did not skip the records written back (sluice_registry_rejected_records_total did not grow):\n{}",
                self.worker.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }
}

/// A tenant's token is rotated; the tenant writes the record with its old token back into
/// the registry topic. The old token stays refused, also after a restart (it used to work
/// again: 401 → 200).
#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_out_token_stays_out_when_its_old_record_is_written_back() -> anyhow::Result<()> {
    let mut r = Registry::start("rotate").await?;
    let carol = |token: &str| {
        serde_json::to_vec(&serde_json::json!({
            "name": "carol",
            "tokens": [hash_token(token)],
            "namespace": format!("carol-{}", r.ns),
        }))
    };
    let (code, body) = r.call("POST", "/v1/tenants", "root-token", &carol("carol-1")?)?;
    assert_eq!(code, 201, "{body}");
    let (code, body) = r.call("POST", "/v1/tenants", "root-token", &carol("carol-2")?)?;
    assert_eq!(code, 200, "{body}");
    let opens =
        |r: &Registry, token: &str| -> anyhow::Result<u16> { Ok(r.call("GET", "/v1/topologies", token, b"")?.0) };
    let deadline = Instant::now() + Duration::from_secs(20);
    while opens(&r, "carol-1")? != 401 || opens(&r, "carol-2")? != 200 {
        anyhow::ensure!(Instant::now() < deadline, "the rotation did not take");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let records = written(&r.topic(), "n/carol")?;
    assert_eq!(records.len(), 2, "{records:?}");
    let before = r.rejected()?;
    write_back(&r.topic(), &records[0])?;
    r.until_rejected(before, 1).await?;
    assert_eq!(opens(&r, "carol-1")?, 401, "the rotated-out token works again");
    assert_eq!(opens(&r, "carol-2")?, 200);
    r.restart()?;
    assert_eq!(
        opens(&r, "carol-1")?,
        401,
        "after a restart, the rotated-out token works again"
    );
    assert_eq!(opens(&r, "carol-2")?, 200);
    Ok(())
}

/// A topology is deleted and uploaded again; a tenant writes the old tombstone back. The
/// topology stays, also after a restart (it used to be deleted).
#[tokio::test(flavor = "multi_thread")]
async fn an_old_tombstone_written_back_deletes_nothing() -> anyhow::Result<()> {
    let mut r = Registry::start("tomb").await?;
    let name = format!("{}shout", r.ns);
    let m = r.dir.write(
        "shout.toml",
        &crate::registry::manifest(
            &name,
            &[("input", &format!("{}in", r.ns))],
            &[("output", &format!("{}out", r.ns))],
            "",
        ),
    );
    let deploy = || {
        crate::registry::cli(&[
            "deploy",
            guest("uppercase").to_str().unwrap(),
            "--manifest",
            m.to_str().unwrap(),
            "--admin",
            &format!("127.0.0.1:{}", r.port),
            "--token",
            "alpha-token",
            "--output",
            "json",
        ])
    };
    let (ok, _, err) = deploy()?;
    assert!(ok, "{err}");
    let (code, body) = r.call("DELETE", &format!("/v1/topologies/{name}"), "alpha-token", b"")?;
    assert_eq!(code, 200, "{body}");
    let (ok, _, err) = deploy()?;
    assert!(ok, "{err}");
    let key = format!("t/{name}");
    let tombstone = written(&r.topic(), &key)?
        .into_iter()
        .find(|w| w.value.is_none())
        .expect("the delete wrote a tombstone");
    let before = r.rejected()?;
    write_back(&r.topic(), &tombstone)?;
    r.until_rejected(before, 1).await?;
    let listed = |r: &Registry| -> anyhow::Result<bool> {
        let (code, body) = r.call("GET", "/v1/topologies", "alpha-token", b"")?;
        anyhow::ensure!(code == 200, "{body}");
        Ok(body.contains(&name))
    };
    assert!(listed(&r)?, "the old tombstone deleted the topology uploaded again");
    r.restart()?;
    assert!(listed(&r)?, "after a restart, the old tombstone deleted the topology");
    Ok(())
}

/// 150 unsigned records with keys of 900 KB: the worker skips and counts each, logs a few
/// lines of bounded length (it used to log every key whole: 190 MB of log for 200), and
/// keeps none of them.
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_unsigned_records_costs_bounded_memory_and_log() -> anyhow::Result<()> {
    let r = Registry::start("flood").await?;
    let log_before = r.worker.log().len();
    let rss_before = r.worker.rss()?;
    let before = r.rejected()?;
    let producer: ThreadedProducer<DefaultProducerContext> = kafka()
        .config()
        .set("message.max.bytes", "1000000")
        .set("linger.ms", "20")
        .create()?;
    let topic = r.topic();
    for i in 0..150u32 {
        let key = format!("t/{i:03}{}", "x".repeat(900_000));
        loop {
            match producer.send(
                BaseRecord::<str, [u8]>::to(&topic)
                    .key(&key)
                    .payload(b"{}")
                    .partition(0),
            ) {
                Ok(()) => break,
                Err((e, _)) if e.to_string().contains("Queue full") => std::thread::sleep(Duration::from_millis(50)),
                Err((e, _)) => return Err(e.into()),
            }
        }
    }
    producer.flush(Duration::from_secs(60))?;
    r.until_rejected(before, 150).await?;
    let logged = r.worker.log().len() - log_before;
    let grown = r.worker.rss()?.saturating_sub(rss_before);
    assert!(logged < 20_000, "{logged} bytes of log for 150 skipped records");
    assert!(
        grown < 100 * 1024 * 1024,
        "the worker grew {} MB skipping 135 MB of records",
        grown / (1024 * 1024)
    );
    Ok(())
}

/// Makes Kafka compact `topic` soon: small segments, any dirt worth cleaning. (The broker's
/// cleaner looks every `log.cleaner.backoff.ms`, 1 s under dev/kafka.)
async fn compact_soon(topic: &str) -> anyhow::Result<()> {
    use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = kafka().config().create()?;
    let max_bytes = (2 * sluice::registry::CHUNK_BYTES).to_string();
    let config = AlterConfig::new(ResourceSpecifier::Topic(topic))
        .set("cleanup.policy", "compact")
        .set("max.message.bytes", &max_bytes)
        .set("segment.ms", "200")
        .set("min.cleanable.dirty.ratio", "0.001")
        .set("min.compaction.lag.ms", "0");
    for r in admin.alter_configs([&config], &AdminOptions::new()).await? {
        r.map_err(|(_, e)| anyhow::anyhow!("altering {topic}: {e}"))?;
    }
    Ok(())
}

/// Until Kafka has compacted `key` in `topic` down to one record (the newest) and that record
/// is what `healed` wants, appending a record of another key now and then so the segment
/// holding it rolls and can be cleaned. Compaction may run before the worker has written its
/// record again (it waits a second or more before it heals a key), so a lone shadowing record
/// is waited past, not taken for the end state; one that stays 60 s is the defect, named by
/// `what`.
async fn until_compacted(
    topic: &str,
    key: &str,
    healed: impl Fn(&Written) -> bool,
    what: &str,
) -> anyhow::Result<Written> {
    let roll = Written {
        key: "roll/segment".into(),
        value: Some(b"x".to_vec()),
        headers: vec![],
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        write_back(topic, &roll)?;
        let left = written(topic, key)?;
        if left.len() == 1 && healed(&left[0]) {
            return Ok(left.into_iter().next().unwrap());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "after 60 s, {what} ({} records of {key} left in {topic}, the last {})",
            left.len(),
            match left.last() {
                None => "gone".to_string(),
                Some(w) => match &w.value {
                    None => "a tombstone".to_string(),
                    Some(v) => format!("{} bytes", v.len()),
                },
            }
        );
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
}

/// The old tombstone written back again, and then Kafka compacts the registry: it keeps
/// only the newest record of each key, and the newest is the tombstone no worker believed.
/// A worker that starts after that must still run the topology (it used to find it gone:
/// compaction shadowed the upload with the tombstone). The worker that skipped the
/// tombstone writes what it believes of that key again, so the newest record is one it
/// signed.
#[tokio::test(flavor = "multi_thread")]
async fn compaction_after_an_old_record_written_back_loses_nothing() -> anyhow::Result<()> {
    let mut r = Registry::start("compact").await?;
    let name = format!("{}shout", r.ns);
    let m = r.dir.write(
        "shout.toml",
        &crate::registry::manifest(
            &name,
            &[("input", &format!("{}in", r.ns))],
            &[("output", &format!("{}out", r.ns))],
            "",
        ),
    );
    let deploy = || {
        crate::registry::cli(&[
            "deploy",
            guest("uppercase").to_str().unwrap(),
            "--manifest",
            m.to_str().unwrap(),
            "--admin",
            &format!("127.0.0.1:{}", r.port),
            "--token",
            "alpha-token",
            "--output",
            "json",
        ])
    };
    let (ok, _, err) = deploy()?;
    assert!(ok, "{err}");
    let (code, body) = r.call("DELETE", &format!("/v1/topologies/{name}"), "alpha-token", b"")?;
    assert_eq!(code, 200, "{body}");
    let (ok, _, err) = deploy()?;
    assert!(ok, "{err}");
    let key = format!("t/{name}");
    let tombstone = written(&r.topic(), &key)?
        .into_iter()
        .find(|w| w.value.is_none())
        .expect("the delete wrote a tombstone");
    // And a forged record over the first chunk of its component (which a worker with a fresh
    // state directory needs).
    let entry: serde_json::Value = serde_json::from_slice(
        written(&r.topic(), &key)?
            .last()
            .and_then(|w| w.value.as_deref())
            .expect("the upload wrote its entry"),
    )?;
    let chunk_key = format!(
        "c/{}/00000",
        entry["digest"].as_str().expect("an entry names its digest")
    );
    let chunk = written(&r.topic(), &chunk_key)?
        .pop()
        .expect("the upload wrote its component's chunks");
    let before = r.rejected()?;
    compact_soon(&r.topic()).await?;
    write_back(&r.topic(), &tombstone)?;
    write_back(
        &r.topic(),
        &Written {
            key: chunk_key.clone(),
            value: Some(b"not a component".to_vec()),
            headers: vec![],
        },
    )?;
    r.until_rejected(before, 2).await?;
    until_compacted(
        &r.topic(),
        &key,
        |w| w.value.is_some(),
        "compaction kept the tombstone written back as the newest record",
    )
    .await?;
    until_compacted(
        &r.topic(),
        &chunk_key,
        |w| w.value == chunk.value,
        "compaction kept the forged chunk as the newest record",
    )
    .await?;
    // A worker starting now reads the compacted topic; one with a fresh state directory
    // assembles the component from it.
    r.worker.terminate(Duration::from_secs(60))?;
    let fresh = TempDir::new("compact-fresh");
    r.worker = Registry::worker(&fresh, &r.cluster, &r.config, r.port)?;
    let (code, body) = r.call("GET", "/v1/topologies", "alpha-token", b"")?;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains(&name),
        "after compaction, a restarted worker does not know the topology: {body}"
    );
    // And it runs it.
    kafka()
        .produce(&format!("{}in", r.ns), &[(b"k".to_vec(), b"after compaction".to_vec())])
        .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let out = kafka().read_all(&format!("{}out", r.ns), Duration::from_secs(5))?;
        if out
            .iter()
            .any(|o| o.value.as_deref() == Some(b"AFTER COMPACTION".as_slice()))
        {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the topology did not run after compaction:\n{}",
            r.worker.log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Ok(())
}
