//! One owner per task, under faults: a worker frozen past its session timeout (SIGSTOP) and
//! woken again, and eager (stop-the-world) rebalancing. Every check is on data — counts,
//! committed offsets, intervals of ownership — not on log wording.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_tests::worker::{dump_counts, guest, manifest, TempDir, WorkerProcess};
use sluice_tests::{kafka, unique_name};

use crate::cluster::until_settled;

const PARTITIONS: i32 = 4;

/// Lines of words from a small vocabulary, deterministic in `i`.
fn lines(range: std::ops::Range<usize>) -> Vec<(Vec<u8>, Vec<u8>)> {
    range
        .map(|i| {
            let words: Vec<String> = (0..4).map(|j| format!("w{}", (i * 13 + j * 7) % 50)).collect();
            (format!("line-{i}").into_bytes(), words.join(" ").into_bytes())
        })
        .collect()
}

type Counts = BTreeMap<String, u64>;

/// Word counts per partition of the lines that were written at `positions`.
fn truth(lines: &[(Vec<u8>, Vec<u8>)], positions: &[(i32, i64)]) -> HashMap<i32, Counts> {
    let mut counts: HashMap<i32, Counts> = HashMap::new();
    for ((_, line), (partition, _)) in lines.iter().zip(positions) {
        for word in std::str::from_utf8(line).unwrap().split(' ') {
            *counts.entry(*partition).or_default().entry(word.into()).or_insert(0) += 1;
        }
    }
    counts
}

struct WordCount {
    name: String,
    input: String,
    output: String,
    manifest: PathBuf,
    dir: TempDir,
    cluster: String,
}

impl WordCount {
    async fn new() -> anyhow::Result<WordCount> {
        let (input, output) = (unique_name("own-in"), unique_name("own-out"));
        kafka().create_topic(&input, PARTITIONS).await?;
        kafka().create_topic(&output, PARTITIONS).await?;
        let dir = TempDir::new("ownership");
        let name = unique_name("wc");
        let manifest = dir.write(
            "wc.toml",
            &manifest(
                &name,
                &guest("word-count"),
                &[("lines", &input)],
                &[("counts", &output)],
                "",
            ),
        );
        Ok(WordCount {
            name,
            input,
            output,
            manifest,
            dir,
            cluster: unique_name("own"),
        })
    }

    fn state(&self, worker: &str) -> PathBuf {
        self.dir.path().join(format!("state-{worker}"))
    }

    /// A cluster member with a short session, so freezing it past the timeout is quick.
    fn member(&self, worker: &str, extra: &[&str]) -> anyhow::Result<WorkerProcess> {
        self.member_with(worker, "200ms", extra, &[])
    }

    /// As [`member`](Self::member), committing every `commit_interval`, with environment
    /// variables of its own.
    fn member_with(
        &self,
        worker: &str,
        commit_interval: &str,
        extra: &[&str],
        env: &[(String, String)],
    ) -> anyhow::Result<WorkerProcess> {
        let state = self.state(worker);
        let mut args = vec![
            "--topology",
            self.manifest.to_str().unwrap(),
            "--cluster",
            &self.cluster,
            "--no-drain-on-stop",
            "--state-dir",
            state.to_str().unwrap(),
            "--session-timeout",
            "6s",
            "--heartbeat-interval",
            "500ms",
            "--commit-interval",
            commit_interval,
        ];
        args.extend_from_slice(extra);
        WorkerProcess::start_with_env(kafka().bootstrap(), self.dir.path(), &args, env)
    }

    /// Rebuilds every task from its changelog alone, in a fresh state directory, and returns
    /// the stores: what the changelogs say the counts are.
    async fn counts_from_changelogs(&self, guarantee: &str) -> anyhow::Result<HashMap<i32, Counts>> {
        let state = self.state("fresh");
        let mut worker = WorkerProcess::start(
            kafka().bootstrap(),
            self.dir.path(),
            &[
                "--topology",
                self.manifest.to_str().unwrap(),
                "--state-dir",
                state.to_str().unwrap(),
                "--processing-guarantee",
                guarantee,
            ],
        )?;
        for p in 0..PARTITIONS {
            worker.wait_for_line(
                &["started", &format!("task={}/{p}", self.name)],
                Duration::from_secs(90),
            )?;
        }
        assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
        (0..PARTITIONS)
            .map(|p| Ok((p, dump_counts(&state, &self.name, p, "counts")?)))
            .collect()
    }
}

/// Samples the group's committed offsets until stopped, and remembers every time an offset
/// moved backwards.
struct OffsetWatch {
    stop: Arc<AtomicBool>,
    rewinds: Arc<Mutex<Vec<String>>>,
    handle: std::thread::JoinHandle<()>,
}

impl OffsetWatch {
    fn start(group: String, topic: String) -> OffsetWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let rewinds = Arc::new(Mutex::new(Vec::new()));
        let (flag, seen) = (stop.clone(), rewinds.clone());
        let handle = std::thread::spawn(move || {
            let mut last: Vec<Option<i64>> = vec![None; PARTITIONS as usize];
            while !flag.load(Ordering::Relaxed) {
                if let Ok(now) = kafka().committed_offsets(&group, &topic, PARTITIONS) {
                    for (p, (before, after)) in last.iter().zip(&now).enumerate() {
                        if let (Some(b), Some(a)) = (before, after) {
                            if a < b {
                                seen.lock().unwrap().push(format!("partition {p}: {b} -> {a}"));
                            }
                        }
                    }
                    for (slot, now) in last.iter_mut().zip(now) {
                        if now.is_some() {
                            *slot = now;
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        OffsetWatch { stop, rewinds, handle }
    }

    fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap();
        self.rewinds.lock().unwrap().clone()
    }
}

/// Two workers share word-count; one is frozen for twice the session timeout while input
/// flows, then woken. Returns the truth and the test's fixture for the checks.
async fn freeze_one_of_two(guarantee: &str) -> anyhow::Result<(WordCount, HashMap<i32, Counts>, Vec<String>)> {
    let wc = WordCount::new().await?;
    let extra = ["--processing-guarantee", guarantee];
    let mut workers = vec![wc.member("a", &extra)?, wc.member("b", &extra)?];
    until_settled(&mut workers, 2).await?;
    let watch = OffsetWatch::start(format!("sluice-{}", wc.name), wc.input.clone());

    let total = 24_000;
    let producing = {
        let input = wc.input.clone();
        tokio::spawn(async move {
            let mut positions = Vec::new();
            for chunk in 0..120 {
                positions.extend(kafka().produce(&input, &lines(chunk * 200..(chunk + 1) * 200)).await?);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(positions)
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    workers[0].freeze()?;
    tokio::time::sleep(Duration::from_secs(12)).await;
    workers[0].thaw()?;
    let positions = producing.await??;
    kafka()
        .wait_committed(
            &format!("sluice-{}", wc.name),
            &wc.input,
            PARTITIONS,
            total as i64,
            Duration::from_secs(120),
        )
        .await?;
    for w in &mut workers {
        let status = w.terminate(Duration::from_secs(60))?;
        assert!(status.success(), "a worker failed: {status}\n{}", w.log());
    }
    let rewinds = watch.finish();
    Ok((wc, truth(&lines(0..total), &positions), rewinds))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_worker_that_wakes_commits_nothing_and_loses_nothing_under_at_least_once() -> anyhow::Result<()> {
    let (wc, truth, rewinds) = freeze_one_of_two("at-least-once").await?;
    assert!(rewinds.is_empty(), "committed offsets moved backwards: {rewinds:?}");
    let stores = wc.counts_from_changelogs("at-least-once").await?;
    for p in 0..PARTITIONS {
        for (word, n) in &truth[&p] {
            let got = stores[&p].get(word).copied().unwrap_or(0);
            assert!(
                got >= *n,
                "partition {p}, {word}: the changelog says {got}, below the truth {n}"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_worker_that_wakes_is_fenced_and_counts_stay_exact_under_exactly_once() -> anyhow::Result<()> {
    let (wc, truth, rewinds) = freeze_one_of_two("exactly-once").await?;
    assert!(rewinds.is_empty(), "committed offsets moved backwards: {rewinds:?}");
    assert_exactly_once(&wc, &truth).await
}

/// The one window no lease can cover: a worker frozen *inside* a commit, after its lease
/// check, while its stream thread's transaction holds records of its tasks. It stays frozen
/// past its session timeout (its tasks move to the other worker, which reads their offsets
/// and state and goes on) but within the transaction timeout (its transaction is still open
/// when it wakes), then wakes and commits, unaware. Only the fence stops it: the transaction
/// proves a membership the group no longer has, the coordinator refuses it, and it aborts.
/// Without the fence its records and offsets commit beside the new owner's, and the counts
/// go wrong. (The worker is held in the window by a fault-injection file,
/// `SLUICE_FAULT_STALL_COMMIT`, which makes one commit stall a second after its lease check.)
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_frozen_inside_its_commit_is_refused_by_the_group_and_counts_stay_exact() -> anyhow::Result<()> {
    let wc = WordCount::new().await?;
    let stall = wc.dir.path().join("stall-commit");
    // Transactions stay open up to three commit intervals (15 s at 5 s): longer than the
    // freeze below.
    let eos = ["--processing-guarantee", "exactly-once"];
    let fault = [(
        "SLUICE_FAULT_STALL_COMMIT".to_string(),
        stall.to_str().unwrap().to_string(),
    )];
    let mut workers = vec![
        wc.member_with("a", "5s", &eos, &fault)?,
        wc.member_with("b", "5s", &eos, &[])?,
    ];
    until_settled(&mut workers, 2).await?;

    let total = 16_000;
    let producing = {
        let input = wc.input.clone();
        tokio::spawn(async move {
            let mut positions = Vec::new();
            for chunk in 0..80 {
                positions.extend(kafka().produce(&input, &lines(chunk * 200..(chunk + 1) * 200)).await?);
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            anyhow::Ok(positions)
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Worker a stalls at its next commit with records in it; freeze it there.
    std::fs::write(&stall, b"")?;
    workers[0].wait_for_line(&["fault injection: stalling inside a commit"], Duration::from_secs(30))?;
    workers[0].freeze()?;
    tokio::time::sleep(Duration::from_secs(9)).await;
    workers[0].thaw()?;
    let positions = producing.await??;
    kafka()
        .wait_committed(
            &format!("sluice-{}", wc.name),
            &wc.input,
            PARTITIONS,
            total as i64,
            Duration::from_secs(120),
        )
        .await?;
    let log_a = workers[0].log();
    for w in &mut workers {
        let status = w.terminate(Duration::from_secs(60))?;
        assert!(status.success(), "a worker failed: {status}\n{}", w.log());
    }
    let truth = truth(&lines(0..total), &positions);
    assert_exactly_once(&wc, &truth).await?;
    // And the stall was where it should be: the woken worker's transaction aborted.
    assert!(
        log_a.contains("the stream thread's transaction aborted"),
        "the frozen worker's transaction did not abort; its log:\n{log_a}"
    );
    Ok(())
}

/// Read committed, every (word, count) was emitted exactly once, and each partition's
/// changelog holds the truth.
async fn assert_exactly_once(wc: &WordCount, truth: &HashMap<i32, Counts>) -> anyhow::Result<()> {
    // Read-committed output: every (partition, word) emitted 1, 2, …, n exactly once.
    let output = kafka().read_all(&wc.output, Duration::from_secs(120))?;
    let mut emitted: HashMap<(i32, String), Vec<u64>> = HashMap::new();
    for r in &output {
        let word = String::from_utf8(r.key.clone().unwrap())?;
        let count: u64 = std::str::from_utf8(r.value.as_ref().unwrap())?.parse()?;
        emitted.entry((r.partition, word)).or_default().push(count);
    }
    let words: u64 = truth.values().flat_map(|c| c.values()).sum();
    assert_eq!(output.len() as u64, words, "one output per word occurrence, exactly");
    // Output partitions follow the word's key, not the input partition: compare totals.
    let mut per_word: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for ((_, word), counts) in emitted {
        per_word.entry(word).or_default().extend(counts);
    }
    for (word, mut counts) in per_word {
        counts.sort_unstable();
        let mut expected: Vec<u64> = truth
            .values()
            .flat_map(|c| 1..=c.get(&word).copied().unwrap_or(0))
            .collect();
        expected.sort_unstable();
        assert_eq!(
            counts, expected,
            "{word}: the counts emitted are not each count exactly once"
        );
    }
    let stores = wc.counts_from_changelogs("exactly-once").await?;
    for p in 0..PARTITIONS {
        assert_eq!(
            stores[&p], truth[&p],
            "partition {p}: the changelog differs from the truth"
        );
    }
    Ok(())
}

/// (task, start, end) of every task interval in a worker's log, from its "starting" line to
/// its "ended" line (timestamps are RFC 3339 with fixed width, so they sort as text).
fn intervals(log: &str) -> Vec<(String, String, Option<String>)> {
    let mut open: HashMap<String, String> = HashMap::new();
    let mut out = Vec::new();
    for line in log.lines() {
        let Some(task) = line
            .split("task=")
            .nth(1)
            .map(|r| r.split(' ').next().unwrap_or("").to_string())
        else {
            continue;
        };
        let time = line.split(' ').next().unwrap_or("").to_string();
        if line.contains(": starting task=") {
            open.insert(task, time);
        } else if line.contains(": ended task=") {
            let start = open.remove(&task).unwrap_or_default();
            out.push((task, start, Some(time)));
        }
    }
    out.extend(open.into_iter().map(|(task, start)| (task, start, None)));
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn eager_rebalancing_never_runs_a_task_on_two_workers() -> anyhow::Result<()> {
    let wc = WordCount::new().await?;
    let eager = ["--assignor", "eager"];
    let total = 16_000;
    let producing = {
        let input = wc.input.clone();
        tokio::spawn(async move {
            for chunk in 0..80 {
                kafka().produce(&input, &lines(chunk * 200..(chunk + 1) * 200)).await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok(())
        })
    };
    let mut workers = vec![wc.member("a", &eager)?];
    until_settled(&mut workers, 4).await?;
    workers.push(wc.member("b", &eager)?);
    until_settled(&mut workers, 2).await?;
    producing.await??;
    kafka()
        .wait_committed(
            &format!("sluice-{}", wc.name),
            &wc.input,
            PARTITIONS,
            total,
            Duration::from_secs(120),
        )
        .await?;
    for w in &mut workers {
        assert!(w.terminate(Duration::from_secs(60))?.success(), "{}", w.log());
    }
    let mut by_task: BTreeMap<String, Vec<(String, String, &str)>> = BTreeMap::new();
    for (worker, name) in workers.iter().zip(["a", "b"]) {
        for (task, start, end) in intervals(&worker.log()) {
            let end = end.unwrap_or_else(|| panic!("task {task} on worker {name} never ended"));
            by_task.entry(task).or_default().push((start, end, name));
        }
    }
    assert_eq!(by_task.len(), PARTITIONS as usize, "{by_task:?}");
    assert!(
        by_task.values().any(|v| v.iter().any(|(_, _, w)| *w == "b")),
        "the second worker never ran a task: {by_task:?}"
    );
    for (task, mut spans) in by_task {
        spans.sort();
        for pair in spans.windows(2) {
            let ((_, end, w1), (start, _, w2)) = (&pair[0], &pair[1]);
            assert!(
                end < start,
                "task {task} ran on worker {w1} until {end} and on worker {w2} from {start}"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_task_revoked_while_restoring_stops_at_once_and_its_worker_keeps_the_rest() -> anyhow::Result<()> {
    let wc = WordCount::new().await?;
    // Task 3's changelog is long, and the broker serves its restoration slowly (a quota on
    // the restore consumer's client id), so the task is still restoring when it is revoked.
    let changelog = format!("{}-counts-changelog", wc.name);
    kafka()
        .create_topic_with(&changelog, PARTITIONS, 1, &[("cleanup.policy", "compact")])
        .await?;
    let history: Vec<(String, String)> = (0..20_000).map(|i| (format!("old-{i}"), "x".repeat(8))).collect();
    let history: Vec<(&str, &str)> = history.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    kafka().produce_to(&changelog, 3, &history).await?;
    let restore_client = format!("sluice-restore-{changelog}");
    kafka().set_consumer_byte_rate(&restore_client, Some(5_000.0)).await?;

    let mut a = wc.member("a", &[])?;
    a.wait_for_line(&["restoring", &format!("task={}/3", wc.name)], Duration::from_secs(60))?;
    kafka().produce_to(&wc.input, 0, &[("k", "before the join")]).await?;
    let b = wc.member("b", &[])?;
    // The sticky assignor keeps a's first two tasks and moves 2 and 3 to b.
    let mut workers = vec![a, b];
    let revoked = format!("task={}/3 outcome=BeforeStart", wc.name);
    workers[0].wait_for_line(&[": ended ", &revoked], Duration::from_secs(30))?;
    // a keeps processing its other tasks: input to partition 0 after the rebalance arrives.
    kafka().produce_to(&wc.input, 0, &[("k", "after the join")]).await?;
    kafka()
        .wait_committed(
            &format!("sluice-{}", wc.name),
            &wc.input,
            PARTITIONS,
            2,
            Duration::from_secs(60),
        )
        .await?;
    kafka().set_consumer_byte_rate(&restore_client, None).await?;
    let settled = until_settled(&mut workers, 2).await?;
    assert!(settled[0].contains(&format!("{}/0", wc.name)), "{settled:?}");
    // a never lost its membership, so the tasks it kept never restarted.
    let log = workers[0].log();
    for p in [0, 1] {
        let starts = log
            .lines()
            .filter(|l| l.contains(&format!(": starting task={}/{p}", wc.name)))
            .count();
        assert_eq!(starts, 1, "task {p} was restarted on the worker that kept it:\n{log}");
    }
    for w in &mut workers {
        assert!(w.terminate(Duration::from_secs(60))?.success(), "{}", w.log());
    }
    Ok(())
}
