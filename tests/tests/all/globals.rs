//! Global tables on a real broker: the `enrich-global` example, orders enriched with their
//! customer from a table the host keeps as a copy of the whole `customers` topic.
//!
//! The two topics have different partition counts and different keys on purpose: a global
//! table needs no co-partitioning. Each order names its customer in its value.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use sluice_tests::worker::{guest, manifest, TempDir, WorkerProcess};
use sluice_tests::{free_port, http_get, kafka, unique_name, Kafka, Received};

struct Topics {
    orders: String,
    customers: String,
    enriched: String,
}

async fn topics(kafka: &Kafka) -> anyhow::Result<Topics> {
    let t = Topics {
        orders: unique_name("g-orders"),
        customers: unique_name("g-customers"),
        enriched: unique_name("g-enriched"),
    };
    kafka.create_topic(&t.orders, 4).await?;
    kafka.create_topic(&t.customers, 3).await?;
    kafka.create_topic(&t.enriched, 4).await?;
    Ok(t)
}

fn order(customer: usize, order: &str) -> (Vec<u8>, Vec<u8>) {
    (
        order.as_bytes().to_vec(),
        format!("customer-{customer}|{order}").into_bytes(),
    )
}

fn values(received: &[Received]) -> Vec<String> {
    received
        .iter()
        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect()
}

fn start(kafka: &Kafka, dir: &Path, state: &Path, m: &Path, extra: &[&str]) -> anyhow::Result<WorkerProcess> {
    let mut args = vec![
        "--topology",
        m.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
        "--processing-guarantee",
        "exactly-once",
        "--commit-interval",
        "200ms",
    ];
    args.extend_from_slice(extra);
    WorkerProcess::start(kafka.bootstrap(), dir, &args)
}

/// The `enrich-global` example's manifest over `t` (with `limits`, if any): its name and path.
fn enrich_global(dir: &TempDir, t: &Topics, limits: &str) -> (String, std::path::PathBuf) {
    let name = unique_name("enrich-global");
    let text = manifest(
        &name,
        &guest("enrich-global"),
        &[("orders", &t.orders), ("customers", &t.customers)],
        &[("enriched", &t.enriched)],
        limits,
    );
    let path = dir.write("enrich-global.toml", &text);
    (name, path)
}

/// Sends a probe order for each customer of `renamed` until every one comes back with its
/// new name: from then on the table holds every rename (it never goes back).
async fn wait_until_renamed(
    kafka: &Kafka,
    t: &Topics,
    renamed: &BTreeMap<usize, String>,
    worker: &WorkerProcess,
) -> anyhow::Result<()> {
    let reader: StreamConsumer = kafka.consumer(&unique_name("probe-reader"))?;
    reader.subscribe(&[t.enriched.as_str()])?;
    let mut missing: BTreeSet<usize> = renamed.keys().copied().collect();
    let deadline = Instant::now() + Duration::from_secs(90);
    for round in 0.. {
        let probes: Vec<(Vec<u8>, Vec<u8>)> = missing
            .iter()
            .map(|&c| order(c, &format!("probe-{round}-{c}")))
            .collect();
        kafka.produce(&t.orders, &probes).await?;
        let mut answered = 0;
        while answered < probes.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(message) = tokio::time::timeout(left, reader.recv()).await else {
                anyhow::bail!(
                    "renames not seen within 90 s: {} customers still have their old name; log:\n{}",
                    missing.len(),
                    worker.log()
                );
            };
            let message = message?;
            let value = String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned();
            let Some(rest) = value.strip_prefix(&format!("probe-{round}-")) else {
                continue;
            };
            answered += 1;
            let (c, name) = rest.split_once(" | ").expect("an enriched probe");
            let c: usize = c.parse()?;
            if renamed.get(&c) == Some(&name.to_string()) {
                missing.remove(&c);
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread")]
async fn orders_are_enriched_from_a_global_table_restored_first_kept_current_and_kept_through_a_kill(
) -> anyhow::Result<()> {
    let kafka = kafka();
    let t = topics(kafka).await?;
    // 3,000 customers, and 4,000 orders already waiting when the worker starts: every one
    // must find its customer, so the table is whole before any task processes an order.
    let customers: Vec<(Vec<u8>, Vec<u8>)> = (0..3_000)
        .map(|c| (format!("customer-{c}").into_bytes(), format!("name-{c}").into_bytes()))
        .collect();
    kafka.produce(&t.customers, &customers).await?;
    let first: Vec<(Vec<u8>, Vec<u8>)> = (0..4_000).map(|j| order(j % 3_500, &format!("order-{j}"))).collect();
    kafka.produce(&t.orders, &first).await?;

    let dir = TempDir::new("globals");
    let state = dir.path().join("state");
    let (_, m) = enrich_global(&dir, &t, "");
    let mut worker = start(kafka, dir.path(), &state, &m, &[])?;
    let received = kafka
        .consume(&t.enriched, first.len(), Duration::from_secs(120))
        .await?;
    let mut got = values(&received);
    let mut truth: Vec<String> = (0..4_000)
        .map(|j| match j % 3_500 {
            c if c < 3_000 => format!("order-{j} | name-{c}"),
            _ => format!("order-{j} | unknown customer"),
        })
        .collect();
    got.sort();
    truth.sort();
    let wrong: Vec<_> = got.iter().zip(&truth).filter(|(g, t)| g != t).take(5).collect();
    assert!(wrong.is_empty(), "orders enriched wrongly (got, expected): {wrong:?}");
    // Output keys are the orders' own.
    assert!(received
        .iter()
        .all(|r| r.key.as_deref().is_some_and(|k| k.starts_with(b"order-"))));

    // One copy of the table on the worker, whatever its four tasks: `+global/<topic>`.
    let globals: Vec<String> = std::fs::read_dir(state.join("+global"))?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    assert_eq!(globals, vec![t.customers.clone()], "global tables on disk");

    // Kept current: customers renamed (and new ones added) while it runs.
    let renamed: BTreeMap<usize, String> = (0..100)
        .map(|c| (c, format!("renamed-{c}")))
        .chain((3_000..3_100).map(|c| (c, format!("new-{c}"))))
        .collect();
    let updates: Vec<(Vec<u8>, Vec<u8>)> = renamed
        .iter()
        .map(|(c, n)| (format!("customer-{c}").into_bytes(), n.clone().into_bytes()))
        .collect();
    kafka.produce(&t.customers, &updates).await?;
    wait_until_renamed(kafka, &t, &renamed, &worker).await?;

    // SIGKILL, then more renames while it is down: the restarted worker resumes its table
    // from what it holds on disk and reads the rest before any task starts.
    worker.kill()?;
    let later: BTreeMap<usize, String> = (100..200).map(|c| (c, format!("later-{c}"))).collect();
    let updates: Vec<(Vec<u8>, Vec<u8>)> = later
        .iter()
        .map(|(c, n)| (format!("customer-{c}").into_bytes(), n.clone().into_bytes()))
        .collect();
    kafka.produce(&t.customers, &updates).await?;
    let last: Vec<(Vec<u8>, Vec<u8>)> = (0..1_000)
        .map(|c| order(c * 3 + c % 3, &format!("final-{c}")))
        .collect();
    kafka.produce(&t.orders, &last).await?;
    let worker = start(kafka, dir.path(), &state, &m, &[])?;
    let received = kafka
        .consume_until(&t.enriched, Duration::from_secs(120), |r| {
            values(r).iter().filter(|v| v.starts_with("final-")).count() >= last.len()
        })
        .await?;
    let mut got: Vec<String> = values(&received)
        .into_iter()
        .filter(|v| v.starts_with("final-"))
        .collect();
    let mut truth: Vec<String> = (0..1_000)
        .map(|j| {
            let c = j * 3 + j % 3;
            let name = match c {
                c if c < 100 => format!("renamed-{c}"),
                c if c < 200 => format!("later-{c}"),
                c if c < 3_000 => format!("name-{c}"),
                c => format!("new-{c}"),
            };
            format!("final-{j} | {name}")
        })
        .collect();
    got.sort();
    truth.sort();
    assert_eq!(got.len(), truth.len(), "final orders, exactly once each");
    let wrong: Vec<_> = got.iter().zip(&truth).filter(|(g, t)| g != t).take(5).collect();
    assert!(
        wrong.is_empty(),
        "after the kill, orders enriched wrongly (got, expected): {wrong:?}; log:\n{}",
        worker.log()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_global_table_past_the_state_limit_fails_its_tasks_over_their_quota() -> anyhow::Result<()> {
    let kafka = kafka();
    let t = topics(kafka).await?;
    // About 10 MB of customers, for a topology allowed 1 MiB of state on the worker. The
    // values are random bytes: RocksDB compresses its files, and repeated bytes would
    // take next to nothing on disk.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut random = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let customers: Vec<(Vec<u8>, Vec<u8>)> = (0..20_000)
        .map(|c| {
            let value: Vec<u8> = (0..500).map(|_| random() as u8).collect();
            (format!("customer-{c}").into_bytes(), value)
        })
        .collect();
    kafka.produce(&t.customers, &customers).await?;
    kafka.produce(&t.orders, &[order(1, "order-1")]).await?;
    let dir = TempDir::new("globals-limit");
    let state = dir.path().join("state");
    let (name, m) = enrich_global(&dir, &t, "state = \"1MiB\"");
    let port = free_port();
    let metrics = format!("127.0.0.1:{port}");
    let worker = start(kafka, dir.path(), &state, &m, &["--metrics", &metrics])?;
    let deadline = Instant::now() + Duration::from_secs(90);
    let quota_line = format!("sluice_task_errors_total{{topology=\"{name}\"");
    loop {
        let body = http_get(port, "/metrics").unwrap_or_default();
        let failed = body
            .lines()
            .filter(|l| l.starts_with(&quota_line) && l.contains("kind=\"quota\""))
            .any(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) >= 1.0);
        if failed {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no task failed over its quota within 90 s; log:\n{}",
            worker.log()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // And no order went through with a partial table.
    let reader = kafka.consumer(&unique_name("reader"))?;
    reader.subscribe(&[t.enriched.as_str()])?;
    let got = tokio::time::timeout(Duration::from_secs(3), reader.recv()).await;
    assert!(got.is_err(), "an order was enriched from a table over its limit");
    Ok(())
}
