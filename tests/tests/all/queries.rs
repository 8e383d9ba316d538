//! Interactive queries: a store's committed state, read through any worker of a cluster
//! from the workers that run its tasks.

use std::time::Duration;

use sluice_tests::worker::{guest, TempDir};
use sluice_tests::{free_port, kafka, unique_name};

use crate::cluster::until_settled;
use crate::registry::{cli, deploy, manifest, worker};

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
