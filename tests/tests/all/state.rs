//! State stores against a real broker: word count, crashes, rebuilding state, changelog checks.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use sluice_tests::{eventually, kafka, Scenario};

const VOCABULARY: usize = 300;

/// Lines of five words each from a fixed vocabulary, deterministic in `i`.
fn lines(range: std::ops::Range<usize>) -> Vec<(Vec<u8>, Vec<u8>)> {
    range
        .map(|i| {
            let words: Vec<String> = (0..5)
                .map(|j| format!("w{}", (i * 7 + j * 131 + i / 3) % VOCABULARY))
                .collect();
            (format!("line-{i}").into_bytes(), words.join(" ").into_bytes())
        })
        .collect()
}

/// Word counts per input partition: each task counts the words of its own partition.
type Counts = BTreeMap<String, u64>;

fn truth(lines: &[(Vec<u8>, Vec<u8>)], positions: &[(i32, i64)]) -> HashMap<i32, Counts> {
    let mut counts: HashMap<i32, Counts> = HashMap::new();
    for ((_, line), (partition, _)) in lines.iter().zip(positions) {
        for word in std::str::from_utf8(line).unwrap().split(' ') {
            *counts
                .entry(*partition)
                .or_default()
                .entry(word.to_string())
                .or_insert(0) += 1;
        }
    }
    counts
}

/// A word count over four partitions, its state in the scenario's directory.
async fn word_count() -> anyhow::Result<Scenario> {
    Scenario::builder("wc", "word-count")
        .source("lines", 4)
        .sink("counts", 4)
        .create()
        .await
}

/// Waits until every task's checkpoint names a changelog offset above 0: each has committed
/// state at least once.
async fn wait_checkpointed(wc: &Scenario, timeout: Duration) -> anyhow::Result<()> {
    let state = wc.state().join(wc.name());
    eventually(timeout, "every task to checkpoint a changelog offset above 0", || {
        let positions: Vec<Option<i64>> = (0..4)
            .map(|p| {
                let text = std::fs::read_to_string(state.join(p.to_string()).join("checkpoint.json")).ok()?;
                let map: BTreeMap<String, i64> = serde_json::from_str(&text).ok()?;
                map.get("counts").copied()
            })
            .collect();
        if positions.iter().all(|p| p.is_some_and(|o| o > 0)) {
            Ok(())
        } else {
            Err(format!(
                "the checkpoints' offsets of \"counts\" per task: {positions:?}"
            ))
        }
    })
    .await
}

/// `from_offset` of each "restored" line of task `<name>/<partition>` in a worker log.
fn restored_from(log: &str, name: &str) -> HashMap<i32, i64> {
    let mut out = HashMap::new();
    for line in log.lines().filter(|l| l.contains(" restored ")) {
        let field = |key: &str| {
            line.split(&format!("{key}="))
                .nth(1)
                .map(|r| r.split([' ', '"']).next().unwrap_or("").to_string())
        };
        let (Some(task), Some(from)) = (field("task"), field("from_offset")) else {
            continue;
        };
        if let Some(partition) = task.strip_prefix(&format!("{name}/")) {
            out.insert(partition.parse().unwrap(), from.parse().unwrap());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn word_count_over_100k_records_equals_the_ground_truth() -> anyhow::Result<()> {
    let wc = word_count().await?;
    let input = lines(0..100_000);
    let positions = wc.produce(&input).await?;
    let truth = truth(&input, &positions);
    let mut worker = wc.worker(&[])?;
    wc.wait_committed(100_000, Duration::from_secs(240)).await?;
    // A fresh start restores nothing.
    assert!(restored_from(&worker.log(), wc.name()).values().all(|&from| from == 0));
    assert!(worker.terminate(Duration::from_secs(60))?.success());
    for p in 0..4 {
        assert_eq!(
            wc.store_counts(p, "counts")?,
            truth[&p],
            "partition {p}: no crash, so every count is exact"
        );
    }
    // The sink carries each running count: the last one per word and partition is the total.
    let emitted = wc.consume(500_000, Duration::from_secs(120)).await?;
    let mut highest: BTreeMap<String, u64> = BTreeMap::new();
    for r in &emitted {
        let word = String::from_utf8(r.key.clone().unwrap())?;
        let count: u64 = std::str::from_utf8(r.value.as_ref().unwrap())?.parse()?;
        let entry = highest.entry(word).or_insert(0);
        *entry = (*entry).max(count);
    }
    for (word, n) in &highest {
        let most = (0..4).filter_map(|p| truth[&p].get(word)).max().unwrap();
        assert_eq!(
            n, most,
            "{word}: the highest count emitted is the highest partition's count"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn after_sigkill_no_count_is_below_the_truth_and_state_restores_from_the_checkpoint() -> anyhow::Result<()> {
    let wc = word_count().await?;
    let args = ["--commit-interval", "100ms", "--batch-size", "50"];
    let mut worker = wc.worker(&args)?;
    let total = 40_000;
    let producing = {
        let input = wc.input().to_string();
        tokio::spawn(async move {
            let mut positions = Vec::new();
            for chunk in 0..40 {
                positions.extend(
                    kafka()
                        .produce(&input, &lines(chunk * 1000..(chunk + 1) * 1000))
                        .await?,
                );
                tokio::time::sleep(Duration::from_millis(75)).await;
            }
            anyhow::Ok(positions)
        })
    };
    // Kill once state has been written for a while, with input still arriving, and every
    // task has checkpointed at least once (a task that started late may not have yet).
    wc.consume(25_000, Duration::from_secs(60)).await?;
    wait_checkpointed(&wc, Duration::from_secs(60)).await?;
    worker.kill()?;
    let killed_log = worker.log();
    let positions = producing.await??;

    let mut worker = wc.worker(&args)?;
    wc.wait_committed(total, Duration::from_secs(240)).await?;
    // Every task restored from its checkpoint, not from the start of its changelog.
    let restored = restored_from(&worker.log(), wc.name());
    assert_eq!(restored.len(), 4, "restore lines: {restored:?}\n{}", worker.log());
    assert!(
        restored.values().all(|&from| from > 0),
        "restored from {restored:?}\n--- killed worker ---\n{killed_log}\n--- restarted worker ---\n{}",
        worker.log()
    );
    assert!(worker.terminate(Duration::from_secs(60))?.success());
    let truth = truth(&lines(0..total), &positions);
    for p in 0..4 {
        let counts = wc.store_counts(p, "counts")?;
        for (word, n) in &truth[&p] {
            let got = counts.get(word).copied().unwrap_or(0);
            assert!(got >= *n, "partition {p}, {word}: {got} < {n}");
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn deleted_local_state_is_rebuilt_from_the_changelog_identically() -> anyhow::Result<()> {
    let wc = word_count().await?;
    let input = lines(0..20_000);
    wc.produce(&input).await?;
    let mut worker = wc.worker(&[])?;
    wc.wait_committed(20_000, Duration::from_secs(120)).await?;
    assert!(worker.terminate(Duration::from_secs(60))?.success());
    let before = wc.store(0, "counts")?;
    assert!(
        before.len() > 10,
        "the store of partition 0 is nearly empty: {before:?}"
    );

    std::fs::remove_dir_all(wc.state().join(wc.name()).join("0"))?;
    let mut worker = wc.worker(&[])?;
    let line = worker.wait_for_line(
        &[" restored ", &format!("task={}/0", wc.name())],
        Duration::from_secs(60),
    )?;
    assert!(line.contains("from_offset=0"), "{line}");
    assert!(!line.contains("records=0"), "{line}");
    assert!(worker.terminate(Duration::from_secs(60))?.success());
    assert_eq!(
        wc.store(0, "counts")?,
        before,
        "the rebuilt store differs from the original"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changelog_with_the_wrong_partition_count_is_refused() -> anyhow::Result<()> {
    let wc = word_count().await?;
    let changelog = format!("{}-counts-changelog", wc.name());
    kafka().create_topic(&changelog, 2).await?;
    let mut worker = wc.worker(&[])?;
    assert!(!worker.wait(Duration::from_secs(60))?.success());
    let expected = format!(
        "changelog topic {changelog:?} of store \"counts\" has 2 partitions, but topology {} reads 4 source partitions; \
         a changelog needs one partition per source partition (delete the topic to let the worker recreate it, or fix the sources)",
        wc.name()
    );
    assert!(
        worker.log().contains(&expected),
        "expected {expected:?} in:\n{}",
        worker.log()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changelog_that_also_deletes_old_segments_is_refused() -> anyhow::Result<()> {
    let wc = word_count().await?;
    let changelog = format!("{}-counts-changelog", wc.name());
    kafka()
        .create_topic_with(&changelog, 4, 1, &[("cleanup.policy", "compact,delete")])
        .await?;
    let mut worker = wc.worker(&[])?;
    assert!(!worker.wait(Duration::from_secs(60))?.success());
    let expected = format!(
        "changelog topic {changelog:?} of store \"counts\" has cleanup.policy=compact,delete, but a changelog must \
         be exactly cleanup.policy=compact (with `delete`, old state is deleted with old segments); \
         set cleanup.policy=compact on the topic, or delete it to let the worker create it"
    );
    assert!(
        worker.log().contains(&expected),
        "expected {expected:?} in:\n{}",
        worker.log()
    );
    Ok(())
}
