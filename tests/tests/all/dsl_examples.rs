//! The stream DSL's examples on a real broker, each against a truth the test computes: the
//! word count (`guests/dsl-word-count`), page views per user in tumbling and hopping windows
//! (`guests/dsl-page-views`) and user sessions (`guests/dsl-sessions`), the last two sending
//! each window once, when it closes. The joins and the table aggregation are in
//! `dsl_joins_e2e`.
//!
//! Every example runs under exactly-once (commits every 100 ms, batches of 50) on a cluster
//! that takes one scale step (a second worker joins and takes half the tasks over through
//! learners) and one SIGKILL (of the first worker, so that the second takes its tasks over
//! from their changelogs), and its committed output must be exactly the truth.
//!
//! The windowed examples write each partition's records in an order the test decides (the
//! partition is named, not hashed), so that a record's lateness is known: the test runs
//! the records of each partition through a model of event time (stream time is the largest
//! timestamp a partition's task has read) and knows which late records count (within the
//! grace period) and which are dropped (past it). The first records written after the kill
//! are late ones: a task that restarted without its windows' stream time would take them,
//! and send a window twice or a session that should not exist.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rdkafka::producer::FutureRecord;
use sluice_tests::worker::{cluster_worker, guest, manifest, TempDir, WorkerProcess};
use sluice_tests::{kafka, unique_name, Received};

use crate::cluster::until_settled;

/// The start of the examples' event time: 50 to 55 minutes ago, on a multiple of five
/// minutes (so windows of one and five minutes line up with it). Records stay within the
/// last hour: the broker deletes older ones as they are written.
pub(crate) fn base_ms() -> i64 {
    static BASE: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *BASE.get_or_init(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let five = 300_000;
        (now - 50 * 60_000) / five * five
    })
}

/// A record to write: to a named partition or (none) where Java's partitioner puts its
/// key; without a value, a tombstone; without a timestamp, stamped when produced.
#[derive(Debug, Clone)]
pub(crate) struct Out {
    pub partition: Option<i32>,
    pub key: String,
    pub value: Option<String>,
    pub ts: Option<i64>,
}

impl Out {
    pub fn at(partition: i32, key: impl Into<String>, value: impl Into<String>, ts: i64) -> Out {
        Out {
            partition: Some(partition),
            key: key.into(),
            value: Some(value.into()),
            ts: Some(ts),
        }
    }

    pub fn keyed(key: impl Into<String>, value: Option<String>) -> Out {
        Out {
            partition: None,
            key: key.into(),
            value,
            ts: None,
        }
    }
}

/// Writes `records` to `topic` in order (per partition) and waits for every acknowledgement.
/// Keys without a partition go where Java's default partitioner (murmur2) puts them, as the
/// host puts its own keyed records, so two topics written here are co-partitioned.
pub(crate) async fn produce(topic: &str, records: &[Out]) -> anyhow::Result<()> {
    let producer: rdkafka::producer::FutureProducer = kafka()
        .config()
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("partitioner", "murmur2_random")
        .create()?;
    let sends: Vec<_> = records
        .iter()
        .map(|r| {
            let mut record = FutureRecord::<str, str>::to(topic).key(&r.key);
            if let Some(value) = &r.value {
                record = record.payload(value);
            }
            if let Some(p) = r.partition {
                record = record.partition(p);
            }
            if let Some(ts) = r.ts {
                record = record.timestamp(ts);
            }
            producer.send(record, Duration::from_secs(30))
        })
        .collect();
    for (i, send) in futures::future::join_all(sends).await.into_iter().enumerate() {
        send.map_err(|(e, _)| anyhow::anyhow!("producing record {i} to {topic}: {e}"))?;
    }
    Ok(())
}

/// Produces `records` in `chunks` pieces, `pause` apart, in the background.
pub(crate) fn produce_slowly(
    topic: &str,
    records: Vec<Out>,
    chunks: usize,
    pause: Duration,
) -> tokio::task::JoinHandle<anyhow::Result<()>> {
    let topic = topic.to_string();
    tokio::spawn(async move {
        let per_chunk = records.len().div_ceil(chunks.max(1)).max(1);
        for chunk in records.chunks(per_chunk) {
            produce(&topic, chunk).await?;
            tokio::time::sleep(pause).await;
        }
        Ok(())
    })
}

/// Text of a record's key and value.
pub(crate) fn text(r: &Received) -> (String, String) {
    let s = |b: &Option<Vec<u8>>| String::from_utf8_lossy(b.as_deref().unwrap_or_default()).into_owned();
    (s(&r.key), s(&r.value))
}

/// One example topology on a cluster of workers started here, each under exactly-once with
/// commits every 100 ms and batches of 50 records.
pub(crate) struct Example {
    pub dir: TempDir,
    /// The topology's name (its group is `sluice-<name>`).
    pub name: String,
    manifest: PathBuf,
    cluster: String,
    pub workers: Vec<WorkerProcess>,
    /// Workers SIGKILLed so far: their logs stay part of [`logs`](Self::logs).
    killed: Vec<WorkerProcess>,
    started: usize,
    guarantee: &'static str,
    commit_interval: &'static str,
    extra: Vec<&'static str>,
}

impl Example {
    pub fn new(prefix: &str, component: &str, sources: &[(&str, &str)], sinks: &[(&str, &str)]) -> Example {
        let dir = TempDir::new(prefix);
        let name = unique_name(prefix);
        let manifest = dir.write("topology.toml", &manifest(&name, &guest(component), sources, sinks, ""));
        Example {
            dir,
            name,
            manifest,
            cluster: unique_name("c"),
            workers: Vec::new(),
            killed: Vec::new(),
            started: 0,
            guarantee: "exactly-once",
            commit_interval: "100ms",
            extra: Vec::new(),
        }
    }

    /// More flags for its workers.
    pub fn with_args(mut self, args: &[&'static str]) -> Example {
        self.extra.extend_from_slice(args);
        self
    }

    /// Its workers commit this often (default 100 ms).
    pub fn committing_every(mut self, interval: &'static str) -> Example {
        self.commit_interval = interval;
        self
    }

    /// Its workers run under `guarantee` (`at-least-once` or `exactly-once`, the default).
    pub fn under(mut self, guarantee: &'static str) -> Example {
        self.guarantee = guarantee;
        self
    }

    /// The topology's group, where its source offsets are committed.
    pub fn group(&self) -> String {
        format!("sluice-{}", self.name)
    }

    /// Starts one more worker, with a state directory of its own.
    pub fn start_worker(&mut self) -> anyhow::Result<()> {
        let worker = cluster_worker(
            &self.dir,
            Some(&self.manifest),
            &self.cluster,
            self.started,
            &[
                &[
                    "--processing-guarantee",
                    self.guarantee,
                    "--commit-interval",
                    self.commit_interval,
                    "--batch-size",
                    "50",
                ][..],
                &self.extra,
            ]
            .concat(),
        )?;
        self.started += 1;
        self.workers.push(worker);
        Ok(())
    }

    /// Waits until every worker runs `per_worker` tasks and together they run them all.
    pub async fn settle(&mut self, per_worker: usize) -> anyhow::Result<Vec<BTreeSet<String>>> {
        until_settled(&mut self.workers, per_worker).await
    }

    /// SIGKILLs the first worker: no commit, no close; the others take its tasks over.
    pub fn kill_first(&mut self) -> anyhow::Result<()> {
        let mut first = self.workers.remove(0);
        let killed = first.kill();
        self.killed.push(first);
        killed
    }

    /// Every worker's log: the killed ones' first (each up to its kill), then the running ones'.
    pub fn logs(&self) -> String {
        let killed = self.killed.iter().map(|w| format!("(SIGKILLed)\n{}", w.log()));
        let logs: Vec<String> = killed.chain(self.workers.iter().map(WorkerProcess::log)).collect();
        logs.join("\n-----\n")
    }

    /// Stops every worker (SIGTERM: commit and close); each must exit cleanly.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        for w in &mut self.workers {
            let status = w.terminate(Duration::from_secs(60))?;
            assert!(status.success(), "a worker exited with {status}:\n{}", w.log());
        }
        Ok(())
    }

    /// Reads `sinks` (read-committed) until `done` says what came is complete, for up to
    /// `timeout`; then stops the workers and reads them again, whole: what the assertions
    /// see (and, if it never completed, say what differs; the workers' logs are printed).
    pub async fn finish(
        &mut self,
        sinks: &[&str],
        timeout: Duration,
        mut done: impl FnMut(&[Vec<Received>]) -> bool,
    ) -> anyhow::Result<Vec<Vec<Received>>> {
        let read = |sinks: &[&str]| -> anyhow::Result<Vec<Vec<Received>>> {
            sinks
                .iter()
                .map(|s| kafka().read_all(s, Duration::from_secs(60)))
                .collect()
        };
        let deadline = Instant::now() + timeout;
        loop {
            let out = read(sinks)?;
            if done(&out) {
                break;
            }
            if Instant::now() > deadline {
                let counts: Vec<usize> = out.iter().map(Vec::len).collect();
                eprintln!(
                    "the outputs did not reach the truth within {timeout:?} ({counts:?} records in {sinks:?}); \
                     the workers' logs:\n{}",
                    self.logs()
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        self.stop()?;
        read(sinks)
    }
}

/// Waits until the topology's group has committed `total` records of `topic`.
pub(crate) async fn committed(ex: &Example, topic: &str, partitions: i32, total: usize) -> anyhow::Result<()> {
    kafka()
        .wait_committed(&ex.group(), topic, partitions, total as i64, Duration::from_secs(120))
        .await
        .map_err(|e| anyhow::anyhow!("{e}; the workers' logs:\n{}", ex.logs()))
}

// --- 1. The word count ---------------------------------------------------------------------

fn lines(range: std::ops::Range<usize>) -> Vec<Out> {
    range
        .map(|i| {
            let words: Vec<String> = (0..5).map(|j| format!("W{}", (i * 7 + j * 13) % 150)).collect();
            // Keys are ignored (the topology reads them as `()`): spread over the partitions.
            Out::keyed(format!("line-{i}"), Some(words.join(" ")))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn dsl_word_count_is_exact_through_a_scale_step_and_a_kill() -> anyhow::Result<()> {
    let (input, output) = (unique_name("dsl-wc-in"), unique_name("dsl-wc-out"));
    kafka().create_topic(&input, 4).await?;
    kafka().create_topic(&output, 3).await?;
    let mut ex = Example::new("dslwc", "dsl-word-count", &[("lines", &input)], &[("totals", &output)]);
    let all = lines(0..3_000);
    let mut truth: BTreeMap<String, u64> = BTreeMap::new();
    for line in &all {
        for w in line.value.as_deref().unwrap_or_default().split(' ') {
            *truth.entry(w.to_lowercase()).or_insert(0) += 1;
        }
    }
    // 4 splitting tasks (`lines`), 4 counting ones (`words`, the repartition topic takes the
    // input's partition count).
    ex.start_worker()?;
    ex.settle(8).await?;

    // A second worker joins while the first third flows.
    let producing = produce_slowly(&input, all[..1_000].to_vec(), 10, Duration::from_millis(150));
    tokio::time::sleep(Duration::from_millis(400)).await;
    ex.start_worker()?;
    ex.settle(4).await?;
    producing.await??;

    // The first worker is killed while the second third flows; the last third comes while
    // the second takes its tasks over.
    let producing = produce_slowly(&input, all[1_000..2_000].to_vec(), 10, Duration::from_millis(100));
    tokio::time::sleep(Duration::from_millis(500)).await;
    ex.kill_first()?;
    producing.await??;
    produce(&input, &all[2_000..]).await?;
    ex.settle(8).await?;

    let outputs = ex
        .finish(&[&output], Duration::from_secs(120), |out| {
            let mut largest: BTreeMap<String, u64> = BTreeMap::new();
            for r in &out[0] {
                let (word, _) = text(r);
                let n = u64::from_be_bytes(r.value.as_deref().unwrap_or_default().try_into().unwrap_or_default());
                let e = largest.entry(word).or_default();
                *e = (*e).max(n);
            }
            truth.iter().all(|(w, n)| largest.get(w) >= Some(n))
        })
        .await?;

    let mut per_word: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut by_offset: Vec<&Received> = outputs[0].iter().collect();
    by_offset.sort_by_key(|r| (r.partition, r.offset));
    for r in by_offset {
        let value: [u8; 8] = r
            .value
            .as_deref()
            .unwrap_or_default()
            .try_into()
            .map_err(|_| anyhow::anyhow!("a count of {:?} is not 8 bytes", text(r)))?;
        per_word.entry(text(r).0).or_default().push(u64::from_be_bytes(value));
    }
    assert_eq!(
        per_word.keys().collect::<Vec<_>>(),
        truth.keys().collect::<Vec<_>>(),
        "the words counted"
    );
    for (word, n) in &truth {
        let counts = &per_word[word];
        assert_eq!(
            counts.last(),
            Some(n),
            "{word}: the last count (in the order it was written) is not the truth"
        );
        // The record cache sends a word's count on once per commit, not at every update:
        // under exactly-once, through the scale step and the kill, the counts a word got
        // still only go up, each once, and never past the truth.
        assert!(
            counts.windows(2).all(|w| w[0] < w[1]) && counts.iter().all(|c| (1..=*n).contains(c)),
            "{word}: through the scale step and the kill, the committed counts {counts:?} do not go up \
             one by one or more at a time to {n}, each once"
        );
    }
    Ok(())
}

/// The record cache (issue 35): Kafka Streams' word count sent 496-1,059 records where
/// Sluice sent 20,780 (every update). With the input all there and commits a second apart,
/// each word's count now goes out at most once per commit: as many times per word as
/// there were commits while the input was processed, at most.
#[tokio::test(flavor = "multi_thread")]
async fn dsl_word_count_sends_each_word_once_per_commit_with_its_record_cache() -> anyhow::Result<()> {
    let (input, output) = (unique_name("dsl-wcc-in"), unique_name("dsl-wcc-out"));
    kafka().create_topic(&input, 4).await?;
    kafka().create_topic(&output, 3).await?;
    let all = lines(0..4_000);
    let mut truth: BTreeMap<String, u64> = BTreeMap::new();
    for line in &all {
        for w in line.value.as_deref().unwrap_or_default().split(' ') {
            *truth.entry(w.to_lowercase()).or_insert(0) += 1;
        }
    }
    produce(&input, &all).await?;
    let words: u64 = truth.values().sum();
    let mut ex =
        Example::new("dslwcc", "dsl-word-count", &[("lines", &input)], &[("totals", &output)]).committing_every("1s");
    let started = Instant::now();
    ex.start_worker()?;
    let mut last: BTreeMap<String, u64> = BTreeMap::new();
    let outputs = ex
        .finish(&[&output], Duration::from_secs(120), |out| {
            last.clear();
            for r in &out[0] {
                let n = u64::from_be_bytes(r.value.as_deref().unwrap_or_default().try_into().unwrap_or_default());
                last.insert(text(r).0, n);
            }
            last == truth
        })
        .await?;
    let elapsed = started.elapsed();
    let mut per_word: BTreeMap<String, usize> = BTreeMap::new();
    for r in &outputs[0] {
        *per_word.entry(text(r).0).or_default() += 1;
    }
    let most = per_word.values().copied().max().unwrap_or(0);
    // Commits a second apart while the worker ran (it started, processed and stopped within
    // `elapsed`), plus its final commit at the stop.
    let commits = elapsed.as_secs() as usize + 2;
    eprintln!(
        "{words} words ({} distinct) in {elapsed:?}: {} records out, at most {most} per word",
        truth.len(),
        outputs[0].len()
    );
    assert_eq!(last, truth, "the last count of every word is the truth");
    assert!(
        most <= commits && outputs[0].len() < words as usize / 5,
        "{} records out for {words} words ({most} for one word, with at most {commits} commits): \
         the record cache should send each word once per commit",
        outputs[0].len()
    );
    Ok(())
}

// --- 2. Page views per user in tumbling and hopping windows ------------------------------

const SEC: i64 = 1_000;
const MIN: i64 = 60 * SEC;

/// A windowed result as the examples write it: key, window start and end, count; and the
/// record's timestamp.
type WindowResult = (String, i64, i64, u64, i64);

/// Reads `user → "<start> <end> <count>"` outputs.
fn window_results(out: &[Received]) -> anyhow::Result<Vec<WindowResult>> {
    out.iter()
        .map(|r| {
            let (key, value) = text(r);
            let parts: Vec<&str> = value.split(' ').collect();
            anyhow::ensure!(
                parts.len() == 3,
                "an output {key} → {value:?} is not \"<start> <end> <count>\""
            );
            Ok((
                key,
                parts[0].parse()?,
                parts[1].parse()?,
                parts[2].parse()?,
                r.timestamp.unwrap_or(-1),
            ))
        })
        .collect()
}

/// Each window's count and time: the latest of its records' (Kafka Streams' time of an
/// aggregate; a session's is its last click's).
type WindowTruth = BTreeMap<(String, i64, i64), (u64, i64)>;

/// Compares windowed results with the truth: each window of the truth exactly once, with
/// its count and its time, and nothing else. Says what differs.
fn assert_windows(what: &str, got: Vec<WindowResult>, truth: &WindowTruth) {
    let mut seen: BTreeMap<(String, i64, i64), Vec<(u64, i64)>> = BTreeMap::new();
    for (key, start, end, count, ts) in got {
        seen.entry((key, start, end)).or_default().push((count, ts));
    }
    let mut problems = Vec::new();
    for ((key, start, end), results) in &seen {
        let at = format!("{key} [{start}, {end}) (base {}{:+} ms)", base_ms(), start - base_ms());
        match truth.get(&(key.clone(), *start, *end)) {
            None => problems.push(format!(
                "{at}: sent {results:?}, but it holds no on-time record or never closed"
            )),
            Some(_) if results.len() > 1 => problems.push(format!("{at}: sent {} times: {results:?}", results.len())),
            Some((n, _)) if results[0].0 != *n => {
                problems.push(format!("{at}: counted {}, the truth is {n}", results[0].0))
            }
            Some((_, ts)) if results[0].1 != *ts => problems.push(format!(
                "{at}: stamped {}, not with its latest record's time {ts}",
                results[0].1
            )),
            Some(_) => {}
        }
    }
    for ((key, start, end), (n, _)) in truth {
        if !seen.contains_key(&(key.clone(), *start, *end)) {
            problems.push(format!(
                "{key} [{start}, {end}) (base{:+} ms): never sent (the truth: {n})",
                start - base_ms()
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{what}: {} of {} windows differ from the truth, e.g.:\n{}",
        problems.len(),
        truth.len(),
        problems[..problems.len().min(12)].join("\n")
    );
}

/// A view: partition, user, timestamp; and the phase it is written in.
#[derive(Debug, Clone)]
struct View {
    phase: usize,
    partition: i32,
    user: String,
    ts: i64,
}

const VIEW_PARTITIONS: i32 = 4;

/// Each partition's views, in the order they are written: one every 5 s (by one of the
/// partition's 4 users) for 30 minutes, in three phases of ten minutes; before the view of
/// every third minute (and at the start of each phase), three late ones — one past the grace
/// period of the minute before the one that just ended (but within the open hopping
/// windows), one past every window that holds it, one within the grace period of the minute
/// that just ended.
fn page_views() -> Vec<View> {
    let mut views = Vec::new();
    for p in 0..VIEW_PARTITIONS {
        let user = |i: usize| format!("user-{:02}", p as usize + 4 * (i % 4));
        let mut now = i64::MIN;
        for s in 0..360usize {
            let phase = match s {
                0..122 => 0,
                122..242 => 1,
                _ => 2,
            };
            if s >= 36 && (s % 36 == 2 || s == 122 || s == 242) {
                // Stream time here is 6-9 s past a minute's start `m`. The view past grace
                // comes first: a task that lost its stream time would count it.
                let m = now / MIN * MIN;
                for (j, late) in [m - 61 * SEC, m - 400 * SEC, m - SEC].into_iter().enumerate() {
                    views.push(View {
                        phase,
                        partition: p,
                        user: user(s / 12 + j),
                        ts: late + p as i64,
                    });
                }
            }
            let ts = base_ms() + (s as i64 * 5 + p as i64 + 1) * SEC;
            now = now.max(ts);
            views.push(View {
                phase,
                partition: p,
                user: user(s * 3 + s / 7),
                ts,
            });
        }
    }
    views
}

/// The windows `[start, start + size)`, starting every `advance`, that hold `ts`.
fn window_starts(ts: i64, size: i64, advance: i64) -> Vec<i64> {
    let mut start = (ts - size + advance).max(0) / advance * advance;
    let mut starts = Vec::new();
    while start <= ts {
        starts.push(start);
        start += advance;
    }
    starts
}

/// What a count per user in windows of `size` every `advance` with `grace` sends, once
/// stream time (per partition) is what the records (in order) make it: every window that
/// holds an on-time record and has closed. Also how many records were late but counted in
/// some window (`end <= stream time`, within grace) and how many no window took.
fn windowed_counts(
    views: &[View],
    closers: &BTreeMap<i32, i64>,
    size: i64,
    advance: i64,
    grace: i64,
) -> (WindowTruth, usize, usize) {
    let mut counts = WindowTruth::new();
    let (mut late_counted, mut dropped) = (0, 0);
    for p in 0..VIEW_PARTITIONS {
        let mut now = i64::MIN;
        for v in views.iter().filter(|v| v.partition == p) {
            now = now.max(v.ts);
            let mut taken = false;
            for start in window_starts(v.ts, size, advance) {
                let end = start + size;
                if end + grace > now {
                    let (n, latest) = counts.entry((v.user.clone(), start, end)).or_insert((0, i64::MIN));
                    *n += 1;
                    *latest = (*latest).max(v.ts);
                    taken = true;
                    if end <= now {
                        late_counted += 1;
                    }
                }
            }
            if !taken {
                dropped += 1;
            }
        }
        // The closer's record moves stream time past every window above.
        let closed_by = closers[&p];
        counts.retain(|(user, _, end), _| !user.ends_with(&format!("-p{p}")) || end + grace <= closed_by);
    }
    (counts, late_counted, dropped)
}

#[tokio::test(flavor = "multi_thread")]
async fn dsl_page_views_send_each_window_once_exactly_through_a_scale_step_and_a_kill() -> anyhow::Result<()> {
    let input = unique_name("dsl-views");
    let (minutes, fives) = (unique_name("dsl-per-minute"), unique_name("dsl-per-5-minutes"));
    kafka().create_topic(&input, VIEW_PARTITIONS).await?;
    kafka().create_topic(&minutes, 2).await?;
    kafka().create_topic(&fives, 2).await?;
    let mut ex = Example::new(
        "dslviews",
        "dsl-page-views",
        &[("views", &input)],
        &[("per_minute", &minutes), ("per_5_minutes", &fives)],
    );
    // Users are named after their partition (`-p<n>` is only in closers): see `user` above.
    let views: Vec<View> = page_views()
        .into_iter()
        .map(|v| View {
            user: format!("{}-p{}", v.user, v.partition),
            ..v
        })
        .collect();
    // At the end, a view 40 minutes in on every partition (by a user of its own) closes
    // every window above; the closers' own windows stay open, and must not be sent.
    let closers: BTreeMap<i32, i64> = (0..VIEW_PARTITIONS).map(|p| (p, base_ms() + 40 * MIN)).collect();
    let mut all = views.clone();
    for (&p, &ts) in &closers {
        all.push(View {
            phase: 3,
            partition: p,
            user: format!("closer-p{p}"),
            ts,
        });
    }
    let (per_minute, late_1, dropped_1) = windowed_counts(&all, &closers, MIN, MIN, 30 * SEC);
    let (per_5, late_5, dropped_5) = windowed_counts(&all, &closers, 5 * MIN, MIN, 30 * SEC);
    // The data does what it is meant to: late views within grace, views dropped from the
    // minute (but counted in open five-minute windows), views dropped from every window.
    assert!(
        late_1 >= 40 && dropped_1 >= 80,
        "per minute: {late_1} late counted, {dropped_1} dropped"
    );
    assert!(
        dropped_5 >= 40 && dropped_5 < dropped_1,
        "per 5 minutes: {late_5} late counted, {dropped_5} dropped"
    );
    assert!(per_minute.keys().all(|(u, _, _)| !u.starts_with("closer")));
    let records = |phase: usize| -> Vec<Out> {
        all.iter()
            .filter(|v| v.phase == phase)
            .map(|v| Out::at(v.partition, &v.user, "/page", v.ts))
            .collect()
    };
    let written = |phases: usize| all.iter().filter(|v| v.phase < phases).count();

    // Phase 3 starts with late views: the first records the moved tasks read.
    scale_then_kill(&mut ex, &input, records, written(2)).await?;

    let outputs = ex
        .finish(&[&minutes, &fives], Duration::from_secs(120), |out| {
            out[0].len() >= per_minute.len() && out[1].len() >= per_5.len()
        })
        .await?;
    assert_windows("per minute", window_results(&outputs[0])?, &per_minute);
    assert_windows("per 5 minutes", window_results(&outputs[1])?, &per_5);
    Ok(())
}

/// The four phases of the windowed examples on [`VIEW_PARTITIONS`] partitions of `input`:
/// one worker; phase 0 while a second joins; phase 1, and once its records (the first
/// `committed_after_1` of all) are committed, the first worker is SIGKILLed; phases 2 and 3
/// go to the one left, which then runs every task.
async fn scale_then_kill(
    ex: &mut Example,
    input: &str,
    records: impl Fn(usize) -> Vec<Out>,
    committed_after_1: usize,
) -> anyhow::Result<()> {
    ex.start_worker()?;
    ex.settle(4).await?;
    let producing = produce_slowly(input, records(0), 8, Duration::from_millis(200));
    tokio::time::sleep(Duration::from_millis(300)).await;
    ex.start_worker()?;
    ex.settle(2).await?;
    producing.await??;
    // Committed, not yet closed: the punctuation that closes their windows may still be
    // under way when the kill comes.
    produce_slowly(input, records(1), 6, Duration::from_millis(150)).await??;
    committed(ex, input, VIEW_PARTITIONS, committed_after_1).await?;
    ex.kill_first()?;
    produce(input, &records(2)).await?;
    produce(input, &records(3)).await?;
    ex.settle(4).await?;
    Ok(())
}

// --- 3. User sessions -----------------------------------------------------------------------

const GAP: i64 = 120 * SEC;
const SESSION_GRACE: i64 = 60 * SEC;

/// A click: partition, user, timestamp, the phase it is written in.
type Click = View;

/// Each partition's clicks in the order they are written. Each of a partition's 4 users
/// clicks in bursts (2 to 5 clicks, 20 s apart) every five minutes; for some, the next
/// burst comes only 150 s after the last click (more than the gap: a new session), and a
/// late click between the two (within the gap of both, and within grace) merges them. After
/// the first click of other bursts comes a late click near the session before, which has
/// closed (dropped). At the start of each phase, a user of its own clicks once within grace
/// (a session of one) and another once past gap and grace (dropped).
fn clicks() -> Vec<Click> {
    let mut out = Vec::new();
    for p in 0..VIEW_PARTITIONS {
        // (ts, user, what), sorted by time; what: 0 a click, 1 a first click of a bridged
        // burst, 2 a first click of another burst (after the first)
        let mut timeline: Vec<(i64, String, u8, i64)> = Vec::new();
        for u in 0..4usize {
            let user = format!("user-{:02}-p{p}", p as usize + 4 * u);
            let mut last = i64::MIN;
            let mut start = base_ms() + (30 + u as i64 * 7) * SEC;
            for b in 0..6usize {
                let bridged = b > 0 && (u + b) % 3 == 0;
                if bridged {
                    start = last + 150 * SEC;
                }
                let k = 2 + (u + b) % 4;
                for c in 0..k {
                    let ts = start + c as i64 * 20 * SEC + p as i64;
                    let what = match (c, b, bridged) {
                        (0, _, true) => 1,
                        (0, 1.., false) => 2,
                        _ => 0,
                    };
                    timeline.push((ts, user.clone(), what, last));
                }
                last = start + (k as i64 - 1) * 20 * SEC + p as i64;
                start = base_ms() + (30 + (b as i64 + 1) * 300 + u as i64 * 7) * SEC;
            }
        }
        timeline.sort();
        let phase_of = |ts: i64| ((ts - base_ms()) / (10 * MIN)).clamp(0, 2) as usize;
        let mut now = i64::MIN;
        let mut phase = 0;
        for (ts, user, what, before) in timeline {
            if phase_of(ts) != phase {
                phase = phase_of(ts);
                for (who, late) in [("grace", now - 59 * SEC), ("late", now - 181 * SEC)] {
                    out.push(Click {
                        phase,
                        partition: p,
                        user: format!("{who}-p{p}"),
                        ts: late,
                    });
                }
            }
            now = now.max(ts);
            out.push(Click {
                phase,
                partition: p,
                user: user.clone(),
                ts,
            });
            match what {
                // Halfway between the two sessions: within the gap of both.
                1 => out.push(Click {
                    phase,
                    partition: p,
                    user,
                    ts: before + (ts - before) / 2,
                }),
                // 20 s after the session before: within its gap, but that session closed
                // (its last click + gap + grace has passed): late.
                2 => out.push(Click {
                    phase,
                    partition: p,
                    user,
                    ts: before + 20 * SEC,
                }),
                _ => {}
            }
        }
    }
    out
}

/// What session windows with `GAP` and `SESSION_GRACE` send once every session has closed
/// (per partition, in the records' order): `(user, start, end) → clicks`. Also how many
/// clicks merged sessions, and how many were dropped. Panics if the data depends on when
/// punctuations come (a click that merges a session that could already have closed).
fn sessions_truth(clicks: &[Click], closers: &BTreeMap<i32, i64>) -> (WindowTruth, usize, usize) {
    #[derive(Clone)]
    struct Session {
        user: String,
        first: i64,
        last: i64,
        count: u64,
    }
    let mut truth = BTreeMap::new();
    let (mut merges, mut dropped) = (0, 0);
    for p in 0..VIEW_PARTITIONS {
        let mut sessions: Vec<Session> = Vec::new();
        let mut now = i64::MIN;
        for c in clicks.iter().filter(|c| c.partition == p) {
            now = now.max(c.ts);
            let near = |s: &Session| s.user == c.user && s.first - GAP <= c.ts && c.ts <= s.last + GAP;
            let found: Vec<Session> = sessions.iter().filter(|s| near(s)).cloned().collect();
            let first = found.iter().map(|s| s.first).fold(c.ts, i64::min);
            let last = found.iter().map(|s| s.last).fold(c.ts, i64::max);
            // Late: the session it would make has closed (Kafka Streams' rule).
            if last + GAP + SESSION_GRACE < now {
                dropped += 1;
                continue;
            }
            for s in &found {
                // (Kept while last + gap + grace > stream time: Kafka Streams' retention.)
                assert!(
                    s.last + GAP + SESSION_GRACE > now,
                    "test data: a click of {} at {} merges a session that may have closed already",
                    c.user,
                    c.ts
                );
            }
            if found.len() > 1 {
                merges += 1;
            }
            sessions.retain(|s| !near(s));
            sessions.push(Session {
                user: c.user.clone(),
                first,
                last,
                count: 1 + found.iter().map(|s| s.count).sum::<u64>(),
            });
        }
        for s in sessions {
            if s.last + GAP + SESSION_GRACE < closers[&p] {
                truth.insert((s.user, s.first, s.last + 1), (s.count, s.last));
            }
        }
    }
    (truth, merges, dropped)
}

#[tokio::test(flavor = "multi_thread")]
async fn dsl_sessions_merge_and_go_out_once_exactly_through_a_scale_step_and_a_kill() -> anyhow::Result<()> {
    let (input, output) = (unique_name("dsl-clicks"), unique_name("dsl-sessions"));
    kafka().create_topic(&input, VIEW_PARTITIONS).await?;
    kafka().create_topic(&output, 2).await?;
    let mut ex = Example::new(
        "dslsessions",
        "dsl-sessions",
        &[("clicks", &input)],
        &[("sessions", &output)],
    );
    let mut all = clicks();
    let closers: BTreeMap<i32, i64> = (0..VIEW_PARTITIONS).map(|p| (p, base_ms() + 45 * MIN)).collect();
    for (&p, &ts) in &closers {
        all.push(Click {
            phase: 3,
            partition: p,
            user: format!("closer-p{p}"),
            ts,
        });
    }
    let (truth, merges, dropped) = sessions_truth(&all, &closers);
    assert!(merges >= 12, "test data: {merges} late clicks merge two sessions");
    assert!(dropped >= 30, "test data: {dropped} late clicks are dropped");
    assert!(
        truth.keys().any(|(u, _, _)| u.starts_with("grace")) && !truth.keys().any(|(u, _, _)| u.starts_with("late")),
        "test data: sessions of one late click within grace, none past it"
    );
    let records = |phase: usize| -> Vec<Out> {
        all.iter()
            .filter(|c| c.phase == phase)
            .map(|c| Out::at(c.partition, &c.user, "/click", c.ts))
            .collect()
    };
    let written = |phases: usize| all.iter().filter(|c| c.phase < phases).count();

    // Phase 3 starts with a click within grace and one past it: the first the moved tasks read.
    scale_then_kill(&mut ex, &input, records, written(2)).await?;

    let outputs = ex
        .finish(&[&output], Duration::from_secs(120), |out| out[0].len() >= truth.len())
        .await?;
    // A session is stamped with its last click (`end - 1`); a window with its latest record.
    assert_windows("sessions", window_results(&outputs[0])?, &truth);
    Ok(())
}
