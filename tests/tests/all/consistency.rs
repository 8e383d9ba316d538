//! Local state against crashes and faults: uncommitted writes never reach RocksDB, a failed
//! batch leaves no trace, and a store that cannot be trusted is rebuilt from its changelog.
//! The `ledger` guest keeps two stores in step and scans one of them on every record.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_tests::{kafka, Scenario};

/// What the two stores of one task should hold: counts per key, and `key/<n>` log entries.
#[derive(Debug, Default, PartialEq, Eq)]
struct Stores {
    counts: BTreeMap<String, u64>,
    log: BTreeMap<String, String>,
}

impl Stores {
    fn truth<'a>(events: impl IntoIterator<Item = &'a (String, String)>) -> Stores {
        let mut s = Stores::default();
        for (key, value) in events {
            let n = s.counts.entry(key.clone()).or_insert(0);
            *n += 1;
            s.log.insert(format!("{key}/{n:010}"), value.clone());
        }
        s
    }
}

/// The `ledger` guest over `partitions` partitions.
async fn ledger(partitions: i32) -> anyhow::Result<Scenario> {
    Scenario::builder("ledger", "ledger")
        .source("events", partitions)
        .sink("totals", partitions)
        .create()
        .await
}

async fn produce_events(ledger: &Scenario, partition: i32, events: &[(String, String)]) -> anyhow::Result<()> {
    let records: Vec<(&str, &str)> = events.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    ledger.produce_to(partition, &records).await
}

/// Both stores of one task, read with `sluice state dump` (the worker must be stopped), and
/// whether they agree with each other.
fn stores(ledger: &Scenario, partition: i32) -> anyhow::Result<Stores> {
    let counts = ledger.store_counts(partition, "counts")?;
    let mut log = BTreeMap::new();
    for (k, v) in ledger.store(partition, "log")? {
        log.insert(String::from_utf8(k)?, String::from_utf8(v)?);
    }
    for (key, n) in &counts {
        let logged = log.keys().filter(|k| k.starts_with(&format!("{key}/"))).count() as u64;
        anyhow::ensure!(
            logged == *n,
            "the stores disagree on {key}: counts says {n}, log has {logged} entries"
        );
    }
    Ok(Stores { counts, log })
}

fn events(range: std::ops::Range<usize>) -> Vec<(String, String)> {
    range.map(|i| (format!("k{}", i % 7), format!("event-{i}"))).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn writes_a_scan_saw_are_not_applied_twice_after_a_kill_before_the_first_commit() -> anyhow::Result<()> {
    let ledger = ledger(1).await?;
    let input = events(0..100);
    let mut worker = ledger.worker(&["--commit-interval", "1h", "--batch-size", "10"])?;
    produce_events(&ledger, 0, &input).await?;
    // Every event was processed (and scanned its store), none committed.
    ledger.consume(100, Duration::from_secs(60)).await?;
    worker.kill()?;

    let mut worker = ledger.worker(&[])?;
    ledger.wait_committed(100, Duration::from_secs(60)).await?;
    assert!(worker.terminate(Duration::from_secs(60))?.success());
    assert_eq!(
        stores(&ledger, 0)?,
        Stores::truth(&input),
        "after the restart every event is counted exactly once"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_that_fails_part_way_leaves_no_state_behind() -> anyhow::Result<()> {
    let ledger = ledger(1).await?;
    let good = events(0..40);
    // One call gets all of these: 25 good events, then one the guest refuses.
    let mut poisoned = events(40..65);
    poisoned.push(("k1".into(), "fail".into()));
    produce_events(&ledger, 0, &good).await?;
    let mut worker = ledger.worker(&["--batch-size", "500"])?;
    ledger.wait_committed(40, Duration::from_secs(60)).await?;
    assert!(worker.terminate(Duration::from_secs(60))?.success());
    let before = stores(&ledger, 0)?;
    assert_eq!(before, Stores::truth(&good));

    produce_events(&ledger, 0, &poisoned).await?;
    let mut worker = ledger.worker(&["--batch-size", "500"])?;
    worker.wait_for_line(
        &["failed at offset 65", "refusing the record at offset 65"],
        Duration::from_secs(60),
    )?;
    worker.terminate(Duration::from_secs(60))?;
    // The call that failed had counted 25 good events before the bad one; it left nothing
    // behind. The batch was then processed in parts: the 25 good events once, the bad one
    // not at all (the task failed there, on-error = "fail").
    let committed = ledger.committed_offset(0)?;
    assert_eq!(committed, Some(65), "committed up to the bad record, not past it");
    let mut processed = good.clone();
    processed.extend_from_slice(&poisoned[..25]);
    assert_eq!(
        stores(&ledger, 0)?,
        Stores::truth(&processed),
        "every good event counted exactly once: the failed call's writes were dropped"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_directory_deleted_under_its_checkpoint_is_rebuilt() -> anyhow::Result<()> {
    let ledger = ledger(1).await?;
    let input = events(0..300);
    produce_events(&ledger, 0, &input).await?;
    let mut worker = ledger.worker(&[])?;
    ledger.wait_committed(300, Duration::from_secs(60)).await?;
    assert!(worker.terminate(Duration::from_secs(60))?.success());
    // One store's data is gone; the task's other files (its checkpoint among them) stay.
    let task = ledger.state().join(ledger.name()).join("0");
    std::fs::remove_dir_all(task.join("counts"))?;
    assert!(task.join("checkpoint.json").exists());

    let mut worker = ledger.worker(&[])?;
    worker.wait_for_line(&["restored", "store=counts"], Duration::from_secs(60))?;
    assert!(worker.terminate(Duration::from_secs(60))?.success());
    assert_eq!(stores(&ledger, 0)?, Stores::truth(&input));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_whose_changelog_was_recreated_is_wiped_and_rebuilt() -> anyhow::Result<()> {
    let ledger = ledger(1).await?;
    let input = events(0..300);
    produce_events(&ledger, 0, &input).await?;
    let mut worker = ledger.worker(&[])?;
    ledger.wait_committed(300, Duration::from_secs(60)).await?;
    assert!(worker.terminate(Duration::from_secs(60))?.success());

    // Start over: the changelogs and the committed offsets go; the local stores stay.
    for store in ["counts", "log"] {
        kafka()
            .delete_topic(&format!("{}-{store}-changelog", ledger.name()))
            .await?;
    }
    kafka().delete_group(&ledger.group()).await?;
    let mut worker = ledger.worker(&[])?;
    let line = worker.wait_for_line(&["wiping the local store", "store=counts"], Duration::from_secs(60))?;
    assert!(line.contains("deleted and created again"), "{line}");
    ledger.wait_committed(300, Duration::from_secs(60)).await?;
    assert!(worker.terminate(Duration::from_secs(60))?.success());
    assert_eq!(
        stores(&ledger, 0)?,
        Stores::truth(&input),
        "reprocessing from the start counts every event once, not on top of the old store"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_that_claims_more_than_its_changelog_holds_is_wiped_and_rebuilt() -> anyhow::Result<()> {
    let ledger = ledger(1).await?;
    let input = events(0..200);
    produce_events(&ledger, 0, &input).await?;
    let mut worker = ledger.worker(&[])?;
    ledger.wait_committed(200, Duration::from_secs(60)).await?;
    assert!(worker.terminate(Duration::from_secs(60))?.success());
    // The store says it holds changelog offsets far past the changelog's end (as after a
    // broker lost the tail of the changelog), with data the changelog never had: restoring
    // on top of it would keep that data.
    let path = ledger.state().join(ledger.name()).join("0").join("counts");
    {
        use sluice::state::engine::{as_slices, Storage};
        use sluice::state::rocks::{RocksStorage, SharedMemory};
        let db = RocksStorage::new(SharedMemory::new(8 << 20, 8 << 20)).open(&path)?;
        let mut marker = db.read_marker()?.expect("a marker");
        marker.next_offset += 10_000;
        marker.topic_id.clear();
        let bogus = (b"ghost".to_vec(), Some(999u64.to_be_bytes().to_vec()));
        db.write_with_marker(&mut as_slices(&[bogus]), &marker, true)?;
    }
    let mut worker = ledger.worker(&[])?;
    let line = worker.wait_for_line(&["wiping the local store", "store=counts"], Duration::from_secs(60))?;
    assert!(line.contains("but changelog"), "{line}");
    worker.wait_for_line(&["restored", "store=counts"], Duration::from_secs(60))?;
    assert!(worker.terminate(Duration::from_secs(60))?.success());
    assert_eq!(
        stores(&ledger, 0)?,
        Stores::truth(&input),
        "the rebuilt store equals the truth"
    );
    Ok(())
}
