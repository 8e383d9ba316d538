//! Topologies of several sub-topologies joined by repartition topics the host creates: a
//! true word count in two stages (`guests/word-totals`: split lines into words keyed by the
//! word, repartition by word, count), with a SIGKILL in the middle, under both guarantees.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_tests::worker::{guest, manifest, TempDir, WorkerProcess};
use sluice_tests::{eventually, kafka, unique_name, Scenario};

/// Lines spread over 4 partitions, each word on every partition: the same word in two input
/// partitions must still get one count.
const INPUT_PARTITIONS: i32 = 4;
/// What `word-totals` declares for its repartition topic (different from the input's on
/// purpose: the counting stage has 8 tasks).
const REPARTITION_PARTITIONS: i32 = 8;
/// Line timestamps start an hour ago, one millisecond apart: an output stamped with the time
/// it was produced instead of its input's would show. (Not further back: the broker's
/// retention would delete records older than a week as soon as they are written.)
fn epoch_ms() -> i64 {
    static EPOCH: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        now.as_millis() as i64 - 3_600_000
    })
}

fn lines(range: std::ops::Range<usize>) -> Vec<(Vec<u8>, Vec<u8>, i64)> {
    range
        .map(|i| {
            let words: Vec<String> = (0..5).map(|j| format!("W{}", (i * 7 + j * 13) % 150)).collect();
            (
                format!("line-{i}").into_bytes(),
                words.join(" ").into_bytes(),
                epoch_ms() + i as i64,
            )
        })
        .collect()
}

async fn two_stage_word_count(guarantee: &str) -> anyhow::Result<()> {
    let totals = Scenario::builder("totals", "word-totals")
        .source("lines", INPUT_PARTITIONS)
        .sink("counts", 3)
        .create()
        .await?;
    let name = totals.name();
    let start = || {
        totals.worker(&[
            "--processing-guarantee",
            guarantee,
            "--commit-interval",
            "100ms",
            "--batch-size",
            "100",
        ])
    };
    let (chunks, per_chunk) = (24, 250);
    let total = chunks * per_chunk;
    let all = lines(0..total);
    let producing = {
        let (input, all) = (totals.input().to_string(), all.clone());
        tokio::spawn(async move {
            for chunk in all.chunks(per_chunk) {
                kafka().produce_stamped(&input, chunk).await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(())
        })
    };
    let mut worker = start()?;
    // The host made the repartition topic: `<topology>-words-repartition`, 8 partitions,
    // deleted (not compacted) as it is consumed.
    let repartition = format!("{name}-words-repartition");
    worker.wait_for_line(&["started", &format!("{name}/count/7")], Duration::from_secs(120))?;
    let described = kafka().describe_topic(&repartition, "cleanup.policy").await?;
    assert_eq!(
        described,
        Some((REPARTITION_PARTITIONS, Some("delete".to_string()))),
        "{repartition}"
    );
    // Killed while both stages have work in flight.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    worker.kill()?;
    worker = start()?;
    producing.await??;

    let mut truth: BTreeMap<String, u64> = BTreeMap::new();
    for (_, line, _) in &all {
        for w in std::str::from_utf8(line)?.split(' ') {
            *truth.entry(w.to_lowercase()).or_insert(0) += 1;
        }
    }
    // Done when every word's largest count has reached the truth.
    let out = eventually(
        Duration::from_secs(180),
        "every word's largest count to reach the truth",
        || {
            let out = totals.read_all(Duration::from_secs(60))?;
            let mut largest: BTreeMap<String, u64> = BTreeMap::new();
            for r in &out {
                let word = String::from_utf8(r.key.clone().unwrap_or_default())?;
                let n: u64 = std::str::from_utf8(r.value.as_deref().unwrap_or_default())?.parse()?;
                let e = largest.entry(word).or_insert(0);
                *e = (*e).max(n);
            }
            let short: Vec<_> = truth
                .iter()
                .filter(|(w, n)| largest.get(*w).copied().unwrap_or(0) < **n)
                .collect();
            anyhow::ensure!(
                short.is_empty(),
                "{} words are still below their count, e.g. {:?}",
                short.len(),
                &short[..short.len().min(5)]
            );
            Ok(out)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}; the worker's log:\n{}", worker.log()));
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());

    let mut per_word: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in &out {
        let at = r.timestamp.unwrap_or(0);
        assert!(
            (epoch_ms()..epoch_ms() + total as i64).contains(&at),
            "a count stamped {at}, not with its line's time: timestamps do not travel through the repartition topic"
        );
        per_word
            .entry(String::from_utf8(r.key.clone().unwrap_or_default())?)
            .or_default()
            .push(std::str::from_utf8(r.value.as_deref().unwrap_or_default())?.parse()?);
    }
    assert_eq!(per_word.len(), truth.len(), "every word is counted");
    let mut over = 0;
    for (word, n) in &truth {
        let mut counts = per_word[word].clone();
        counts.sort_unstable();
        if guarantee == "exactly-once" {
            // Across both stages and the kill: each count 1..=n exactly once.
            assert_eq!(
                counts,
                (1..=*n).collect::<Vec<_>>(),
                "{word}: the committed output is not each count exactly once"
            );
        } else {
            // Nothing lost: every count up to the truth is there; replays may add more.
            for k in 1..=*n {
                assert!(counts.binary_search(&k).is_ok(), "{word}: count {k} of {n} is missing");
            }
            over += counts.len() - *n as usize;
        }
    }
    eprintln!(
        "two-stage word count ({guarantee}): {} words, {over} repeated counts",
        truth.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_two_stage_word_count_is_exact_under_exactly_once_through_a_kill() -> anyhow::Result<()> {
    two_stage_word_count("exactly-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_two_stage_word_count_loses_nothing_under_at_least_once_through_a_kill() -> anyhow::Result<()> {
    two_stage_word_count("at-least-once").await
}

/// The low watermark of each partition of `topic`, and its end.
fn watermarks(topic: &str, partitions: i32) -> anyhow::Result<Vec<(i64, i64)>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = kafka().config().create()?;
    (0..partitions)
        .map(|p| Ok(consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn repartition_records_are_deleted_once_the_counting_tasks_have_committed_them() -> anyhow::Result<()> {
    let purge = Scenario::builder("purge", "word-totals")
        .source("lines", INPUT_PARTITIONS)
        .sink("counts", 2)
        .create()
        .await?;
    let name = purge.name();
    let mut worker = purge.worker(&[
        "--commit-interval",
        "100ms",
        // Longer than the counting takes: the purge that deletes the last words comes
        // after the tasks have gone idle.
        "--repartition-purge-interval",
        "3s",
    ])?;
    let all = lines(0..2_000);
    purge.produce_stamped(&all).await?;
    let words = all.len() as i64 * 5;
    let repartition = format!("{name}-words-repartition");
    // Every word went through the repartition topic, and once counted, is deleted from it:
    // within a few purge intervals, not at the next commit of an idle task (a minute).
    eventually(Duration::from_secs(45), "the repartition topic to be purged", || {
        // The topic may not have reached this client's metadata yet: no marks, look again.
        let marks = watermarks(&repartition, REPARTITION_PARTITIONS).unwrap_or_default();
        let written: i64 = marks.iter().map(|(_, high)| high).sum();
        let left: i64 = marks.iter().map(|(low, high)| high - low).sum();
        if !marks.is_empty() && written >= words && left == 0 {
            Ok(())
        } else {
            Err(format!(
                "{written} of {words} words written, {left} still there (low, high per partition: {marks:?})"
            ))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}; the worker's log:\n{}", worker.log()));
    // Deleted only what was counted: the counts are all there.
    let out = purge.read_all(Duration::from_secs(60))?;
    assert_eq!(out.len() as i64, words, "one count per word");
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    Ok(())
}

/// Starts a worker on `m` that must refuse it; returns its log.
fn refused(dir: &TempDir, m: &std::path::Path) -> anyhow::Result<String> {
    let mut worker = WorkerProcess::start(kafka().bootstrap(), dir.path(), &["--topology", m.to_str().unwrap()])?;
    let status = worker.wait(Duration::from_secs(60))?;
    assert!(!status.success(), "the worker ran it:\n{}", worker.log());
    Ok(worker.log())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_manifest_that_binds_an_internal_topic_is_refused() -> anyhow::Result<()> {
    let (input, output, elsewhere) = (
        unique_name("bind-in"),
        unique_name("bind-out"),
        unique_name("bind-else"),
    );
    for t in [&input, &output, &elsewhere] {
        kafka().create_topic(t, 2).await?;
    }
    let dir = TempDir::new("bind-internal");
    let m = dir.write(
        "totals.toml",
        &manifest(
            "totals",
            &guest("word-totals"),
            &[("lines", &input), ("words", &elsewhere)],
            &[("counts", &output)],
            "",
        ),
    );
    let log = refused(&dir, &m)?;
    let expected = "it binds the source \"words\" to a topic, but the component declares \"words\" an internal \
                    topic: the host names it \"totals-words-repartition\" and creates it itself";
    assert!(log.contains(expected), "expected {expected:?} in:\n{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn sub_topologies_that_loop_are_refused_naming_the_loop() -> anyhow::Result<()> {
    let input = unique_name("loop-in");
    kafka().create_topic(&input, 2).await?;
    let dir = TempDir::new("stage-loop");
    let m = dir.write(
        "loop.toml",
        &manifest("loop", &guest("stage-loop"), &[("input", &input)], &[], ""),
    );
    let log = refused(&dir, &m)?;
    let expected = "its sub-topologies form a loop through internal topics: a → b → a";
    assert!(log.contains(expected), "expected {expected:?} in:\n{log}");
    // Nothing was created for it.
    assert_eq!(
        kafka().describe_topic("loop-ab-repartition", "cleanup.policy").await?,
        None
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_uploaded_two_stage_topology_spreads_over_a_cluster_stays_exact_through_a_scale_step_and_is_purged(
) -> anyhow::Result<()> {
    use crate::cluster::until_settled;
    use crate::registry::{cli, deploy, worker};
    let (input, output) = (unique_name("staged-in"), unique_name("staged-out"));
    kafka().create_topic(&input, INPUT_PARTITIONS).await?;
    kafka().create_topic(&output, 3).await?;
    let dir = TempDir::new("staged-cluster");
    let cluster = unique_name("c");
    let ports = [sluice_tests::free_port(), sluice_tests::free_port()];
    let eos = ["--processing-guarantee", "exactly-once"];
    let mut workers = vec![worker(&dir, &cluster, 0, ports[0], &eos)?];
    workers[0].wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let name = unique_name("staged");
    let m = dir.write(
        "staged.toml",
        &crate::registry::manifest(&name, &[("lines", &input)], &[("counts", &output)], ""),
    );
    let (ok, out, err) = deploy(ports[0], &guest("word-totals"), &m)?;
    assert!(ok, "deploy failed: {err}");
    let entry: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(entry["partitions"], 12, "4 splitting and 8 counting tasks: {entry}");
    assert_eq!(
        entry["subtopologies"],
        serde_json::json!([
            {"name": "split", "partitions": 4, "sources": ["lines"], "sinks": ["words"], "stores": []},
            {"name": "count", "partitions": 8, "sources": ["words"], "sinks": ["counts"], "stores": ["counts"]}
        ]),
        "{entry}"
    );
    until_settled(&mut workers, 12).await?;

    let total = 4_000;
    let all = lines(0..total);
    kafka().produce_stamped(&input, &all[..total / 2]).await?;
    // A scale step while the first half is in flight: each sub-topology's tasks spread.
    tokio::time::sleep(Duration::from_millis(500)).await;
    workers.push(worker(&dir, &cluster, 1, ports[1], &eos)?);
    let sets = until_settled(&mut workers, 6).await?;
    for (i, set) in sets.iter().enumerate() {
        let count = set.iter().filter(|t| t.contains("/count/")).count();
        assert!(
            count > 0 && count < 8,
            "worker {i} runs {count} of the 8 counting tasks: {sets:?}"
        );
    }
    kafka().produce_stamped(&input, &all[total / 2..]).await?;

    let mut truth: BTreeMap<String, u64> = BTreeMap::new();
    for (_, line, _) in &all {
        for w in std::str::from_utf8(line)?.split(' ') {
            *truth.entry(w.to_lowercase()).or_insert(0) += 1;
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    let per_word = loop {
        let mut per_word: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for r in kafka().read_all(&output, Duration::from_secs(60))? {
            per_word
                .entry(String::from_utf8(r.key.unwrap_or_default())?)
                .or_default()
                .push(std::str::from_utf8(r.value.as_deref().unwrap_or_default())?.parse()?);
        }
        let done = truth
            .iter()
            .all(|(w, n)| per_word.get(w).is_some_and(|c| c.iter().max() >= Some(n)));
        if done {
            break per_word;
        }
        if std::time::Instant::now() > deadline {
            let logs: Vec<String> = workers.iter().map(|w| w.log()).collect();
            panic!("the counts did not reach the truth:\n{}", logs.join("\n-----\n"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for (word, n) in &truth {
        let mut counts = per_word[word].clone();
        counts.sort_unstable();
        assert_eq!(
            counts,
            (1..=*n).collect::<Vec<_>>(),
            "{word}: through the scale step, the committed output is not each count exactly once"
        );
    }

    // `describe` shows every task of both sub-topologies active somewhere.
    let (ok, out, err) = cli(&[
        "topologies",
        "describe",
        &name,
        "--admin",
        &format!("127.0.0.1:{}", ports[1]),
        "--output",
        "json",
    ])?;
    assert!(ok, "describe failed: {err}");
    let described: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(described["unassigned"], serde_json::json!([]), "{described}");
    let active: std::collections::BTreeSet<&str> = described["tasks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["role"] == "active")
        .filter_map(|t| t["task"].as_str())
        .collect();
    assert_eq!(active.len(), 12, "{described}");
    assert!(active.contains(format!("{name}/split/3").as_str()) && active.contains(format!("{name}/count/7").as_str()));

    // Deleted with its internal topics.
    let (ok, out, err) = cli(&[
        "topologies",
        "delete",
        &name,
        "--purge-internal",
        "--admin",
        &format!("127.0.0.1:{}", ports[0]),
    ])?;
    assert!(ok, "delete failed: {err}");
    assert!(out.contains("deleted its internal topics"), "{out}");
    for topic in [format!("{name}-words-repartition"), format!("{name}-counts-changelog")] {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while kafka().describe_topic(&topic, "cleanup.policy").await?.is_some() {
            assert!(std::time::Instant::now() < deadline, "{topic} is still there");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    for w in &mut workers {
        assert!(w.terminate(Duration::from_secs(60))?.success(), "{}", w.log());
    }
    Ok(())
}
