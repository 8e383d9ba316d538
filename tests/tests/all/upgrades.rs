//! Rolling upgrades from the real previous release (built from its tag by `dev/previous`):
//! a cluster of three of its workers, with a secret, runs the previous release's word count
//! (a component built with that release's SDK) under load; each worker is drained and
//! replaced by one of this build on the same state directory, one at a time, then one is
//! replaced by the previous release again. Throughout, every worker holds active tasks
//! from its first on until it is asked to stop (the group speaks the metadata version all
//! its members speak, and switches up once all can: version probing), no handover pauses
//! a task for long, and the read-committed output is each count exactly once under
//! exactly-once, none missing under at-least-once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sluice_tests::releases::{previous_binary, previous_guest, PREVIOUS};
use sluice_tests::wordcount::{self, lines};
use sluice_tests::worker::{release_cluster_worker, sluice_binary, WorkerProcess};
use sluice_tests::{free_port, http_get, kafka, unique_name, Scenario};

const PARTITIONS: i32 = 8;
const WORKERS: usize = 3;
const SECRET: &str = "correct horse battery staple, but longer";
/// The longest a moved task may be paused (revoke, rebalance, start, first output): a
/// drain's handover takes well under a second here; a task held for a vanished member or
/// stopped by a refused join would take seconds more.
const HANDOVER_BOUND: Duration = Duration::from_secs(5);

/// What the watcher knows of one worker slot.
#[derive(Debug, Default)]
struct Slot {
    port: u16,
    release: &'static str,
    /// Asked to stop (drained): it may hold nothing from now on.
    stopping: bool,
    /// It held an active task at some sample since it started.
    had_tasks: bool,
    /// Its last `/status`.
    last: Option<serde_json::Value>,
}

/// Samples every worker's `/status` every 200 ms and notes each sample where a worker that
/// held tasks before (and was not asked to stop) held none.
struct Watcher {
    slots: Arc<Mutex<Vec<Slot>>>,
    violations: Arc<Mutex<Vec<String>>>,
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn active_tasks(status: &serde_json::Value) -> usize {
    status["tasks"]
        .as_array()
        .map_or(0, |t| t.iter().filter(|t| t["role"] == "active").count())
}

impl Watcher {
    fn start(ports: &[u16]) -> Watcher {
        let slots = Arc::new(Mutex::new(
            ports
                .iter()
                .map(|&port| Slot {
                    port,
                    ..Default::default()
                })
                .collect::<Vec<_>>(),
        ));
        let violations = Arc::new(Mutex::new(Vec::new()));
        let done = Arc::new(AtomicBool::new(false));
        let thread = {
            let (slots, violations, done) = (slots.clone(), violations.clone(), done.clone());
            let began = Instant::now();
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    let ports: Vec<u16> = slots.lock().unwrap().iter().map(|s| s.port).collect();
                    for (n, port) in ports.into_iter().enumerate() {
                        let Ok(status) = http_get(port, "/status")
                            .ok()
                            .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
                            .context("no status")
                        else {
                            continue;
                        };
                        let mut slots = slots.lock().unwrap();
                        let slot = &mut slots[n];
                        let active = active_tasks(&status);
                        if active > 0 {
                            slot.had_tasks = true;
                        } else if slot.had_tasks && !slot.stopping {
                            violations.lock().unwrap().push(format!(
                                "at {:.1}s worker {n} ({}) held no active task (generation {})",
                                began.elapsed().as_secs_f64(),
                                slot.release,
                                status["generation"]
                            ));
                        }
                        slot.last = Some(status);
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        Watcher {
            slots,
            violations,
            done,
            thread: Some(thread),
        }
    }

    /// Slot `n` runs `release` from now on (a new process on the same port).
    fn started(&self, n: usize, release: &'static str) {
        let mut slots = self.slots.lock().unwrap();
        slots[n] = Slot {
            port: slots[n].port,
            release,
            ..Default::default()
        };
    }

    fn stopping(&self, n: usize) {
        self.slots.lock().unwrap()[n].stopping = true;
    }

    /// Waits until every slot holds active tasks (and `also` holds of their statuses).
    async fn until(
        &self,
        what: &str,
        timeout: Duration,
        also: impl Fn(&[Slot]) -> bool,
        logs: &[WorkerProcess],
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let slots = self.slots.lock().unwrap();
                let busy = slots.iter().all(|s| {
                    s.last
                        .as_ref()
                        .is_some_and(|l| active_tasks(l) > 0 && l["rebalancing"] == false)
                });
                if busy && also(&slots) {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    let seen: Vec<String> = slots
                        .iter()
                        .map(|s| {
                            format!(
                                "{}: {} active, metadata {}",
                                s.release,
                                s.last.as_ref().map_or(0, active_tasks),
                                s.last
                                    .as_ref()
                                    .map_or(serde_json::Value::Null, |l| l["metadata_version"].clone())
                            )
                        })
                        .collect();
                    let tail: Vec<String> = logs
                        .iter()
                        .map(|w| w.log().lines().rev().take(15).collect::<Vec<_>>().join("\n"))
                        .collect();
                    bail!(
                        "{what}: not within {timeout:?}; workers: {seen:?}; their logs' last lines:\n{}",
                        tail.join("\n---\n")
                    );
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn finish(mut self) -> (Vec<String>, Vec<Slot>) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let slots = std::mem::take(&mut *self.slots.lock().unwrap());
        let violations = self.violations.lock().unwrap().clone();
        (violations, slots)
    }
}

/// The metadata version a worker of this build says its group speaks (an older release's
/// status does not say: none).
fn speaks(slot: &Slot) -> Option<u64> {
    (slot.release == "this")
        .then(|| slot.last.as_ref().and_then(|l| l["metadata_version"].as_u64()))
        .flatten()
}

async fn rolling_upgrade_and_back(guarantee: &str) -> anyhow::Result<()> {
    let previous = previous_binary();
    let this = sluice_binary();
    let wc = Scenario::builder("upgrade", "word-count")
        .component(previous_guest("word_count"))
        .source("lines", PARTITIONS)
        .sink("counts", PARTITIONS)
        .create()
        .await?;
    let cluster = unique_name("upgrade");
    let ports: Vec<u16> = (0..WORKERS).map(|_| free_port()).collect();
    let start = |n: usize, binary: &std::path::Path| {
        let admin = format!("127.0.0.1:{}", ports[n]);
        release_cluster_worker(
            binary,
            wc.dir(),
            Some(wc.manifest()),
            &cluster,
            n,
            &[
                "--registry-secret",
                SECRET,
                "--processing-guarantee",
                guarantee,
                "--commit-interval",
                "100ms",
                "--metrics",
                &admin,
            ],
        )
    };
    let watcher = Watcher::start(&ports);
    let mut workers = Vec::new();
    for n in 0..WORKERS {
        watcher.started(n, "previous");
        workers.push(start(n, &previous)?);
    }
    watcher
        .until(
            &format!("three workers of {PREVIOUS} holding tasks"),
            Duration::from_secs(120),
            |_| true,
            &workers,
        )
        .await?;

    // Load through the whole upgrade: 250 lines every 100 ms.
    let producing = Arc::new(AtomicBool::new(true));
    let producer = {
        let (input, producing) = (wc.input().to_string(), producing.clone());
        tokio::spawn(async move {
            let mut positions = Vec::new();
            let mut chunk = 0;
            while producing.load(Ordering::Relaxed) {
                positions.extend(kafka().produce(&input, &lines(chunk * 250..(chunk + 1) * 250)).await?);
                chunk += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            anyhow::Ok((chunk * 250, positions))
        })
    };

    // Upgrade, one worker at a time: drained (SIGTERM), then this build on its state.
    let steps: Vec<(usize, &'static str)> = (0..WORKERS)
        .map(|n| (n, "this"))
        .chain([(WORKERS - 1, "previous")])
        .collect();
    for (step, &(n, release)) in steps.iter().enumerate() {
        watcher.stopping(n);
        let status = workers[n].terminate(Duration::from_secs(60))?;
        assert!(
            status.success(),
            "worker {n} did not drain and stop cleanly: {}",
            workers[n].log()
        );
        watcher.started(n, release);
        workers[n] = start(n, if release == "this" { &this } else { &previous })?;
        // Version 5 once every worker runs this build (step 2), else the previous release's 4.
        let expect: u64 = if step == WORKERS - 1 { 5 } else { 4 };
        watcher
            .until(
                &format!("step {step}: worker {n} of {release} holding tasks beside the others, the group speaking version {expect}"),
                Duration::from_secs(120),
                |slots| slots.iter().filter(|s| s.release == "this").all(|s| speaks(s) == Some(expect)),
                &workers,
            )
            .await?;
        eprintln!("upgrade ({guarantee}) step {step}: worker {n} runs {release}; the group speaks version {expect}");
    }

    producing.store(false, Ordering::Relaxed);
    let (total, positions) = producer.await??;
    if let Err(e) = wc.wait_committed(total, Duration::from_secs(180)).await {
        panic!(
            "{e:#}; the workers' logs:\n{}",
            workers.iter().map(|w| w.log()).collect::<Vec<_>>().join("\n---\n")
        );
    }
    let (violations, slots) = watcher.finish();
    // The handovers each worker saw come to it, as of now (the last ones of each process).
    let mut longest = (0.0f64, String::new());
    for slot in &slots {
        for h in slot
            .last
            .as_ref()
            .and_then(|l| l["handovers"].as_array().cloned())
            .unwrap_or_default()
        {
            if let Some(total) = h["total_seconds"].as_f64().filter(|_| h["direction"] == "in") {
                if total > longest.0 {
                    longest = (total, format!("{} to a worker of {}", h["task"], slot.release));
                }
            }
        }
    }
    eprintln!(
        "upgrade ({guarantee}): {total} lines; the longest pause of a moved task seen in the last handovers: {:.3}s ({})",
        longest.0, longest.1
    );
    for w in &mut workers {
        assert!(w.terminate(Duration::from_secs(60))?.success(), "{}", w.log());
    }
    assert!(
        violations.is_empty(),
        "workers idled during the upgrade: {violations:#?}"
    );
    assert!(
        longest.0 < HANDOVER_BOUND.as_secs_f64(),
        "a moved task paused {:.3}s ({})",
        longest.0,
        longest.1
    );

    // The output, read committed: each count of each word (per input partition) once under
    // exactly-once; at least once under at-least-once.
    let truth = wordcount::truth(total, &positions)?;
    let per_word = wordcount::counts_per_word(&wc.read_all(Duration::from_secs(120))?)?;
    let words: std::collections::BTreeSet<&String> = truth.values().flat_map(|c| c.keys()).collect();
    for word in words {
        let expected = wordcount::expected_counts(&truth, word);
        let got = per_word.get(word).cloned().unwrap_or_default();
        if guarantee == "exactly-once" {
            assert_eq!(
                got, expected,
                "{word}: the committed output is not each count exactly once"
            );
        } else {
            let mut seen: BTreeMap<u64, usize> = BTreeMap::new();
            for v in &got {
                *seen.entry(*v).or_default() += 1;
            }
            let mut wanted: BTreeMap<u64, usize> = BTreeMap::new();
            for v in &expected {
                *wanted.entry(*v).or_default() += 1;
            }
            for (v, n) in wanted {
                assert!(
                    seen.get(&v).copied().unwrap_or(0) >= n,
                    "{word}: count {v} appears fewer than {n} times: output lost"
                );
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_upgrade_from_the_previous_release_and_one_step_back_keeps_every_worker_busy_under_exactly_once(
) -> anyhow::Result<()> {
    rolling_upgrade_and_back("exactly-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_upgrade_from_the_previous_release_and_one_step_back_keeps_every_worker_busy_under_at_least_once(
) -> anyhow::Result<()> {
    rolling_upgrade_and_back("at-least-once").await
}

/// A component built with the previous release's SDK (its example guest, from its tag) runs
/// on this build unchanged: the host runs the WIT worlds of both releases.
#[tokio::test(flavor = "multi_thread")]
async fn a_component_built_with_the_previous_releases_sdk_runs_on_this_build() -> anyhow::Result<()> {
    let shout = Scenario::builder("old-sdk", "uppercase")
        .component(previous_guest("uppercase"))
        .source("input", 2)
        .sink("output", 2)
        .create()
        .await?;
    let mut worker = shout.worker(&[])?;
    let sent: Vec<(Vec<u8>, Vec<u8>)> = (0..200)
        .map(|i| (format!("k{i}").into_bytes(), format!("value {i}").into_bytes()))
        .collect();
    shout.produce(&sent).await?;
    let got = shout.consume(sent.len(), Duration::from_secs(60)).await;
    let got = match got {
        Ok(got) => got,
        Err(e) => panic!("{e:#}; the worker's log:\n{}", worker.log()),
    };
    let values: std::collections::BTreeSet<Vec<u8>> = got.into_iter().map(|r| r.value.unwrap()).collect();
    assert_eq!(values, sent.iter().map(|(_, v)| v.to_ascii_uppercase()).collect());
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    Ok(())
}
