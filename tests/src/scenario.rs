//! A scenario: one topology under test with topics, a manifest and state of its own, and the
//! workers that run it — the set-up most integration tests share, written once — and
//! [`eventually`], the one way to wait for something.
//!
//! ```ignore
//! let wc = Scenario::builder("wc", "word-count").source("lines", 4).sink("counts", 4).create().await?;
//! let positions = wc.produce(&records).await?;
//! let mut worker = wc.worker(&["--commit-interval", "100ms"])?;
//! wc.wait_committed(records.len(), Duration::from_secs(60)).await?;
//! assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
//! let counts = wc.store_counts(0, "counts")?;
//! ```
//!
//! What a scenario does not cover (several topologies on one worker, uploads, a topic that
//! must not exist) stays in the test, on the helpers underneath: [`crate::Kafka`],
//! [`crate::worker`].

use std::fmt::Display;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Result};

use crate::worker::{cluster_worker, dump_counts, dump_store, guest, manifest, TempDir, WorkerProcess};
use crate::{kafka, unique_name, Received};

/// Whether a topic is one the topology reads or one it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Source,
    Sink,
}

/// One topic of a scenario: the logical name the manifest binds, the topic, its partitions.
#[derive(Debug, Clone)]
struct Binding {
    role: Role,
    logical: String,
    topic: String,
    partitions: i32,
}

/// What a [`Scenario`] will be: its guest, its sources and sinks, its limits.
#[must_use = "nothing is created until `create` is awaited"]
pub struct ScenarioBuilder {
    prefix: String,
    guest: String,
    /// A component file to run instead of the example guest `guest` (another release's).
    component: Option<PathBuf>,
    bindings: Vec<(Role, String, i32)>,
    limits: String,
}

impl ScenarioBuilder {
    /// A source `logical` of the guest, bound to a new topic of `partitions` partitions.
    pub fn source(mut self, logical: &str, partitions: i32) -> Self {
        self.bindings.push((Role::Source, logical.to_string(), partitions));
        self
    }

    /// A sink `logical` of the guest, bound to a new topic of `partitions` partitions.
    pub fn sink(mut self, logical: &str, partitions: i32) -> Self {
        self.bindings.push((Role::Sink, logical.to_string(), partitions));
        self
    }

    /// Runs the component at `path` (built elsewhere: another release's example guest)
    /// instead of the example guest named.
    pub fn component(mut self, path: PathBuf) -> Self {
        self.component = Some(path);
        self
    }

    /// The manifest's `[limits]` table, as TOML lines (`memory = "16MiB"`).
    pub fn limits(mut self, limits: &str) -> Self {
        self.limits = limits.to_string();
        self
    }

    /// Creates every topic (unique names: tests share a cluster) and writes the manifest.
    pub async fn create(self) -> Result<Scenario> {
        let dir = TempDir::new(&self.prefix);
        let name = unique_name(&self.prefix);
        let mut bindings = Vec::new();
        for (role, logical, partitions) in self.bindings {
            let topic = unique_name(&format!("{}-{logical}", self.prefix));
            kafka().create_topic(&topic, partitions).await?;
            bindings.push(Binding {
                role,
                logical,
                topic,
                partitions,
            });
        }
        let pairs = |role| -> Vec<(&str, &str)> {
            bindings
                .iter()
                .filter(|b| b.role == role)
                .map(|b| (b.logical.as_str(), b.topic.as_str()))
                .collect()
        };
        let manifest = dir.write(
            &format!("{}.toml", self.prefix),
            &manifest(
                &name,
                &self.component.clone().unwrap_or_else(|| guest(&self.guest)),
                &pairs(Role::Source),
                &pairs(Role::Sink),
                &self.limits,
            ),
        );
        Ok(Scenario {
            name,
            dir,
            manifest,
            bindings,
        })
    }
}

/// One topology under test: its topics, its manifest and the state of its workers, all under
/// names no other test uses. The temporary directory (manifest, state, worker logs) goes when
/// the scenario is dropped; the topics stay, as every test's do.
pub struct Scenario {
    name: String,
    dir: TempDir,
    manifest: PathBuf,
    bindings: Vec<Binding>,
}

impl Scenario {
    /// A scenario running the example guest `guest` (built by `dev/build-guests`), its names
    /// starting with `prefix`; add its sources and sinks, then [`create`](ScenarioBuilder::create) it.
    pub fn builder(prefix: &str, guest: &str) -> ScenarioBuilder {
        ScenarioBuilder {
            prefix: prefix.to_string(),
            guest: guest.to_string(),
            component: None,
            bindings: Vec::new(),
            limits: String::new(),
        }
    }

    /// The topology's (deployed) name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The group its source offsets are committed in: `sluice-<name>`.
    pub fn group(&self) -> String {
        format!("sluice-{}", self.name)
    }

    /// The scenario's temporary directory: manifest, state directories, worker logs.
    pub fn dir(&self) -> &TempDir {
        &self.dir
    }

    /// The manifest file.
    pub fn manifest(&self) -> &Path {
        &self.manifest
    }

    fn binding(&self, logical: &str) -> &Binding {
        self.bindings.iter().find(|b| b.logical == logical).unwrap_or_else(|| {
            panic!(
                "the scenario binds no {logical:?} (it binds {:?})",
                self.logical_names()
            )
        })
    }

    fn logical_names(&self) -> Vec<&str> {
        self.bindings.iter().map(|b| b.logical.as_str()).collect()
    }

    fn only(&self, role: Role) -> &Binding {
        let mut of_role = self.bindings.iter().filter(|b| b.role == role);
        match (of_role.next(), of_role.next()) {
            (Some(b), None) => b,
            _ => panic!(
                "the scenario has not exactly one {role:?} (it binds {:?}): name the topic with `topic`",
                self.logical_names()
            ),
        }
    }

    /// The topic bound to the source or sink `logical`.
    pub fn topic(&self, logical: &str) -> &str {
        &self.binding(logical).topic
    }

    /// The topic of the scenario's only source.
    pub fn input(&self) -> &str {
        &self.only(Role::Source).topic
    }

    /// The topic of the scenario's only sink.
    pub fn output(&self) -> &str {
        &self.only(Role::Sink).topic
    }

    /// How many partitions the only source has (as many tasks as the topology runs).
    pub fn input_partitions(&self) -> i32 {
        self.only(Role::Source).partitions
    }

    /// The state directory of the workers [`worker`](Self::worker) starts: `<dir>/state`.
    pub fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// Starts `sluice worker` on this topology alone, with its state in [`state`](Self::state)
    /// (so a restarted worker finds it), and `extra` arguments.
    pub fn worker(&self, extra: &[&str]) -> Result<WorkerProcess> {
        let state = self.state();
        let mut args = vec![
            "--topology",
            self.manifest.to_str().expect("a UTF-8 path"),
            "--state-dir",
            state.to_str().expect("a UTF-8 path"),
        ];
        args.extend_from_slice(extra);
        WorkerProcess::start(kafka().bootstrap(), self.dir.path(), &args)
    }

    /// Starts member `n` of cluster `cluster` on this topology: [`cluster_worker`] (fast
    /// heartbeats and commits, state in `<dir>/state-<n>`).
    pub fn member(&self, cluster: &str, n: usize, extra: &[&str]) -> Result<WorkerProcess> {
        cluster_worker(&self.dir, Some(&self.manifest), cluster, n, extra)
    }

    /// Produces `records` (key, value) to the only source; where each went, in order.
    pub async fn produce(&self, records: &[(Vec<u8>, Vec<u8>)]) -> Result<Vec<(i32, i64)>> {
        kafka().produce(self.input(), records).await
    }

    /// Produces `records` (key, value, timestamp in ms) to the only source.
    pub async fn produce_stamped(&self, records: &[(Vec<u8>, Vec<u8>, i64)]) -> Result<Vec<(i32, i64)>> {
        kafka().produce_stamped(self.input(), records).await
    }

    /// Produces `records` (key, value) to one partition of the only source, in order.
    pub async fn produce_to(&self, partition: i32, records: &[(&str, &str)]) -> Result<()> {
        kafka().produce_to(self.input(), partition, records).await
    }

    /// The offsets the topology has committed on its only source, summed over its partitions.
    pub fn committed_total(&self) -> Result<i64> {
        kafka().committed_total(&self.group(), self.input(), self.input_partitions())
    }

    /// The offset the topology has committed on one partition of its only source.
    pub fn committed_offset(&self, partition: i32) -> Result<Option<i64>> {
        kafka().committed_offset(&self.group(), self.input(), partition)
    }

    /// Waits until the topology has committed `total` records of its only source.
    pub async fn wait_committed(&self, total: usize, timeout: Duration) -> Result<()> {
        kafka()
            .wait_committed(
                &self.group(),
                self.input(),
                self.input_partitions(),
                total as i64,
                timeout,
            )
            .await
    }

    /// Reads the only sink from the beginning until `count` records have arrived.
    pub async fn consume(&self, count: usize, timeout: Duration) -> Result<Vec<Received>> {
        kafka().consume(self.output(), count, timeout).await
    }

    /// Every committed record of the only sink, to its end as it is now (read-committed).
    pub fn read_all(&self, timeout: Duration) -> Result<Vec<Received>> {
        kafka().read_all(self.output(), timeout)
    }

    /// Every entry of `store` of task `partition` in [`state`](Self::state), in key order
    /// (the worker must be stopped).
    pub fn store(&self, partition: i32, store: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        dump_store(&self.state(), &self.name, partition, store)
    }

    /// A store of counts (UTF-8 keys, 8-byte big-endian values) of task `partition` in
    /// [`state`](Self::state) (the worker must be stopped).
    pub fn store_counts(&self, partition: i32, store: &str) -> Result<std::collections::BTreeMap<String, u64>> {
        dump_counts(&self.state(), &self.name, partition, store)
    }
}

/// What one look at the thing [`eventually`] waits for found: done (with a value), or not
/// yet (and what was seen instead).
pub trait Outcome {
    type Value;
    /// The value when done; otherwise what was seen, for the message if time runs out.
    fn into_outcome(self) -> std::result::Result<Self::Value, String>;
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn into_outcome(self) -> std::result::Result<T, String> {
        self.ok_or_else(|| "nothing yet (None)".to_string())
    }
}

impl<T, E: Display> Outcome for std::result::Result<T, E> {
    type Value = T;
    fn into_outcome(self) -> std::result::Result<T, String> {
        self.map_err(|e| format!("{e:#}"))
    }
}

/// How long [`eventually`] waits between two checks.
const RECHECK: Duration = Duration::from_millis(200);

/// Runs `check` until it returns `Some`/`Ok` (its value is returned), every 200 ms, at least
/// once and until `timeout` has passed. A check that is not done yet returns `None` or an
/// error saying what it saw instead (`Err(anyhow!("{n} of {total} committed"))`): when time
/// runs out, the error names `what` was waited for, how many checks ran, and what the last one
/// said. A query that fails (a busy broker) is retried the same way.
pub async fn eventually<C: Outcome>(timeout: Duration, what: &str, mut check: impl FnMut() -> C) -> Result<C::Value> {
    let start = tokio::time::Instant::now();
    let mut checks = 0u32;
    loop {
        checks += 1;
        let last = match check().into_outcome() {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        if start.elapsed() >= timeout {
            bail!(
                "waited {:.1?} (timeout {timeout:?}) for {what}; {checks} check(s), the last saw: {last}",
                start.elapsed()
            );
        }
        tokio::time::sleep(RECHECK.min(timeout.saturating_sub(start.elapsed()))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn eventually_returns_the_first_value_a_check_is_done_with() {
        let mut n = 0;
        let got = eventually(Duration::from_secs(10), "the third check", || {
            n += 1;
            if n == 3 {
                Ok(n * 10)
            } else {
                Err(format!("check {n}"))
            }
        })
        .await
        .unwrap();
        assert_eq!((got, n), (30, 3));
    }

    #[tokio::test]
    async fn eventually_fails_naming_what_it_waited_for_and_the_last_value_seen() {
        let mut n = 0;
        let e = eventually(Duration::from_millis(500), "the moon to turn blue", || {
            n += 1;
            Err::<(), _>(anyhow::anyhow!("grey, check {n}"))
        })
        .await
        .unwrap_err()
        .to_string();
        assert!(e.contains("for the moon to turn blue;"), "{e}");
        assert!(
            e.contains(&format!("{n} check(s), the last saw: grey, check {n}")),
            "{e}"
        );
        assert!(n >= 2, "checked {n} times in 500 ms: it does not retry");
    }

    #[tokio::test]
    async fn eventually_takes_options_and_checks_once_even_with_no_time() {
        let mut checks = 0;
        let e = eventually(Duration::ZERO, "something", || {
            checks += 1;
            None::<()>
        })
        .await
        .unwrap_err()
        .to_string();
        assert_eq!(checks, 1);
        assert!(e.contains("the last saw: nothing yet (None)"), "{e}");
        let found = eventually(Duration::ZERO, "a value", || Some("here")).await.unwrap();
        assert_eq!(found, "here");
    }
}
