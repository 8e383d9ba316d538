//! The global tables' thread: fills and tails the worker's global tables (`state::global`).
//! Each reads every partition of its topic, first up to where the topic ended when the
//! table was opened (tasks that read it wait until then), then for as long as a topology
//! reads it. A thread of its own, as Kafka Streams' global stream thread: a table's reads
//! never wait behind a learner's restoration, nor a handover behind a table's.
//!
//! The decisions are methods of [`Globals`], generic over what it reads ([`Changelogs`]),
//! unit-tested below on topics and tables in memory.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::changelogs::{Changelogs, KafkaChangelogs, Partition};
use crate::kafka::KafkaSettings;
use crate::state::dir::StateDir;
use crate::state::global::{GlobalTable, Status};

/// How often a table makes its progress durable.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);
/// Most records read in one round.
const ROUND_RECORDS: usize = 50_000;
/// Most bytes of keys and values one round holds before it applies them: a global topic
/// is a tenant's, and 50,000 of its records may be a megabyte each.
const ROUND_BYTES: usize = 16 << 20;
/// How long a table that could not start waits before it is tried again.
const RETRY_START: Duration = Duration::from_secs(2);

/// The worker's global-tables thread; it ends when this is dropped.
pub struct GlobalUpdater {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GlobalUpdater {
    pub fn start(kafka: &KafkaSettings, state: Arc<StateDir>) -> anyhow::Result<GlobalUpdater> {
        let changelogs = KafkaChangelogs::new(kafka, "sluice-globals", None)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new().name("globals".into()).spawn(move || {
            let mut globals = Globals::new(changelogs, state);
            while !stopping.load(Ordering::Acquire) {
                globals.step();
            }
            globals.stop_all();
        })?;
        Ok(GlobalUpdater {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for GlobalUpdater {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A global table being filled or tailed.
struct Global {
    table: Arc<GlobalTable>,
    /// The next offset to read of each partition (applied, or pending below).
    positions: BTreeMap<i32, i64>,
    /// Until the table is ready: where each partition ended when it was opened.
    targets: Option<BTreeMap<i32, i64>>,
    /// Records to read until ready (for the progress tasks see).
    total: u64,
    pending: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    applied: u64,
    last_checkpoint: Instant,
    /// Stopped (failed, or over its limit): no longer applied.
    stopped: bool,
}

/// The worker's global tables and the consumer that feeds them.
pub(crate) struct Globals<C> {
    changelogs: C,
    state: Arc<StateDir>,
    globals: HashMap<String, Global>,
    /// Tables that could not be started yet (their topic's offsets unread): tried again.
    waiting: Vec<(Arc<GlobalTable>, Instant)>,
}

impl<C: Changelogs> Globals<C> {
    pub(crate) fn new(changelogs: C, state: Arc<StateDir>) -> Globals<C> {
        Globals {
            changelogs,
            state,
            globals: HashMap::new(),
            waiting: Vec::new(),
        }
    }

    /// One round: follow what the worker wants, read, apply (or wait a little when there
    /// is nothing to read).
    pub(crate) fn step(&mut self) {
        self.follow();
        if self.globals.is_empty() {
            std::thread::sleep(Duration::from_millis(100));
            return;
        }
        self.read(Duration::from_millis(20));
        self.apply();
    }

    /// Stops every table (checkpointing what it applied).
    pub(crate) fn stop_all(&mut self) {
        let topics: Vec<String> = self.globals.keys().cloned().collect();
        for topic in topics {
            self.remove(&topic);
        }
    }

    /// Starts the tables opened since the last round (and those that could not start
    /// before), and stops those no topology reads any more.
    fn follow(&mut self) {
        let (added, removed) = self.state.globals.take_changes();
        for topic in removed {
            self.waiting.retain(|(t, _)| t.topic != topic);
            self.remove(&topic);
        }
        let now = Instant::now();
        let mut due: Vec<Arc<GlobalTable>> = added;
        let (ready, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|(_, at)| *at <= now);
        self.waiting = later;
        due.extend(ready.into_iter().map(|(t, _)| t));
        for table in due {
            if let Err(e) = self.add(table.clone()) {
                tracing::warn!(topic = %table.topic, "global table not started yet (trying again in {RETRY_START:?}): {e}");
                self.waiting.push((table, now + RETRY_START));
            }
        }
    }

    fn add(&mut self, table: Arc<GlobalTable>) -> Result<(), String> {
        let topic = table.topic.clone();
        if self.globals.contains_key(&topic) {
            self.remove(&topic);
        }
        let partitions = self.changelogs.partitions(&topic)?;
        let mut bounds = BTreeMap::new();
        for &p in &partitions {
            bounds.insert(p, self.changelogs.bounds(&topic, p)?);
        }
        let mut stored = table.positions()?;
        // A position the topic no longer has (re-created, truncated): what the table holds
        // cannot be vouched for, so it is read again from the start.
        let outside = stored.iter().any(|(p, &pos)| match bounds.get(p) {
            Some(&(low, high)) => pos < low || pos > high,
            None => true,
        });
        if outside {
            tracing::warn!(topic = %topic, "global table: positions outside the topic, reading it again from the start");
            table.wipe()?;
            stored.clear();
        }
        let positions: BTreeMap<i32, i64> = bounds
            .iter()
            .map(|(&p, &(low, _))| (p, stored.get(&p).copied().unwrap_or(low).max(low)))
            .collect();
        let targets: BTreeMap<i32, i64> = bounds.iter().map(|(&p, &(_, high))| (p, high)).collect();
        let total: u64 = targets
            .iter()
            .map(|(p, high)| (high - positions[p]).max(0) as u64)
            .sum();
        let reads: Vec<(String, i32, i64)> = positions.iter().map(|(&p, &from)| (topic.clone(), p, from)).collect();
        self.changelogs
            .read_from(&reads)
            .map_err(|e| format!("reading topic {topic:?}: {e}"))?;
        tracing::info!(topic = %topic, partitions = partitions.len(), to_read = total, "global table started");
        table.set_status(Status::Restoring { restored: 0, total });
        self.globals.insert(
            topic,
            Global {
                table,
                positions,
                targets: Some(targets),
                total,
                pending: Vec::new(),
                applied: 0,
                last_checkpoint: Instant::now(),
                stopped: false,
            },
        );
        Ok(())
    }

    fn remove(&mut self, topic: &str) {
        let Some(mut global) = self.globals.remove(topic) else {
            return;
        };
        self.pause(topic, &global);
        if !global.stopped {
            if let Err(e) = checkpoint(&mut global) {
                tracing::warn!(topic = %topic, "global table: {e}");
            }
        }
        tracing::info!(topic = %topic, applied = global.applied, "global table stopped");
    }

    fn pause(&mut self, topic: &str, global: &Global) {
        let partitions: Vec<Partition> = global.positions.keys().map(|&p| (topic.to_string(), p)).collect();
        self.changelogs.pause(&partitions);
    }

    /// Reads what the topics hold, up to a round, waiting up to `wait` for the first
    /// record. What is read waits in the tables' pending writes.
    fn read(&mut self, wait: Duration) {
        let mut wait = wait;
        let (mut read, mut bytes) = (0, 0);
        while read < ROUND_RECORDS && bytes < ROUND_BYTES {
            let globals = &mut self.globals;
            let polled = self.changelogs.poll(wait, &mut |m| {
                let Some(global) = globals.get_mut(m.topic).filter(|g| !g.stopped) else {
                    return;
                };
                global.positions.insert(m.partition, m.offset + 1);
                if let Some(key) = m.key {
                    bytes += key.len() + m.value.map_or(0, <[u8]>::len);
                    global.pending.push((key.to_vec(), m.value.map(<[u8]>::to_vec)));
                }
            });
            wait = Duration::ZERO;
            read += 1;
            match polled {
                None => break,
                Some(Err(e)) => {
                    tracing::debug!("global tables' consumer: {e}");
                    break;
                }
                Some(Ok(())) => {}
            }
        }
    }

    /// Applies what each table read this round; a table that has caught up with where its
    /// topic ended when it was opened becomes ready.
    fn apply(&mut self) {
        // Offsets have gaps (transaction markers, compaction): the consumer's position
        // says how far a partition was read.
        let consumed = self.changelogs.positions();
        let mut paused: Vec<Partition> = Vec::new();
        for (topic, global) in &mut self.globals {
            if global.stopped {
                continue;
            }
            if global.pending.is_empty() {
                for (p, position) in global.positions.iter_mut() {
                    if let Some(&at) = consumed.get(&(topic.clone(), *p)) {
                        *position = (*position).max(at);
                    }
                }
            }
            if let Some(status) = apply_one(global) {
                tracing::error!(topic = %topic, "global table stopped: {status:?}");
                global.table.set_status(status);
                global.stopped = true;
                paused.extend(global.positions.keys().map(|&p| (topic.clone(), p)));
            }
        }
        self.changelogs.pause(&paused);
    }
}

/// Applies what one table read; returns the status it stopped with, if it had to stop
/// (failed, or grown past its limit).
fn apply_one(global: &mut Global) -> Option<Status> {
    let mut result = Ok(());
    if !global.pending.is_empty() {
        let changes = std::mem::take(&mut global.pending);
        result = global.table.apply(&changes, &global.positions);
        global.applied += changes.len() as u64;
    }
    let caught_up = global.targets.as_ref().is_some_and(|t| {
        t.iter()
            .all(|(p, high)| global.positions.get(p).is_some_and(|at| at >= high))
    });
    if result.is_ok() && (caught_up || global.last_checkpoint.elapsed() >= CHECKPOINT_EVERY) {
        result = checkpoint(global);
    }
    let (limit, bytes) = (global.table.limit(), global.table.bytes());
    if result.is_ok() && bytes > limit {
        return Some(Status::OverLimit(format!(
            "it takes {bytes} bytes, more than {limit}, the largest state limit of the topologies that \
             read it (limits.state in their manifests, or the worker's --state-limit)"
        )));
    }
    match result {
        Err(e) => return Some(Status::Failed(e)),
        Ok(()) if caught_up => {
            tracing::info!(topic = %global.table.topic, restored = global.applied, "global table ready");
            global.targets = None;
            global.table.set_status(Status::Ready);
        }
        Ok(()) if global.targets.is_some() => global.table.set_status(Status::Restoring {
            restored: global.applied.min(global.total),
            total: global.total,
        }),
        Ok(()) => {}
    }
    None
}

/// Makes what a table applied durable, with its positions.
fn checkpoint(global: &mut Global) -> Result<(), String> {
    global.table.apply(&[], &global.positions)?;
    global.table.flush()?;
    global.last_checkpoint = Instant::now();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::changelogs::memory::MemoryTopics;
    use super::*;
    use crate::kafka::KafkaSettings;
    use crate::state::memory::MemoryStorage;

    fn state() -> Arc<StateDir> {
        let dir = std::env::temp_dir().join(format!("sluice-globals-{}", uuid::Uuid::new_v4().simple()));
        Arc::new(StateDir::new(
            dir,
            MemoryStorage::new(),
            &KafkaSettings::new("127.0.0.1:9"),
        ))
    }

    fn want(state: &StateDir, topic: &str, limit: u64) {
        state.want_globals(&BTreeMap::from([(topic.to_string(), limit)]));
    }

    #[test]
    fn a_table_is_ready_once_it_has_read_what_its_topic_held_and_then_stays_current() {
        let topics = MemoryTopics::default();
        topics.create("customers", 2);
        topics.append("customers", 0, b"c1", Some(b"ada"));
        topics.append_marker("customers", 0);
        topics.append("customers", 1, b"c2", Some(b"bob"));
        let state = state();
        want(&state, "customers", 1 << 30);
        let mut globals = Globals::new(topics.consumer(), state.clone());
        let table = state.globals.get("customers").unwrap();
        // The first round applies the records, the next sees the consumer past the marker.
        globals.step();
        globals.step();
        assert_eq!(table.status(), Status::Ready, "three offsets, two records: caught up");
        assert_eq!(table.db.get(b"c1").unwrap().as_deref(), Some(&b"ada"[..]));
        assert_eq!(table.positions().unwrap(), BTreeMap::from([(0, 2), (1, 1)]));
        topics.append("customers", 1, b"c1", None);
        globals.step();
        assert_eq!(table.db.get(b"c1").unwrap(), None, "a tombstone deletes");
        // No longer wanted: stopped, its positions kept.
        state.want_globals(&BTreeMap::new());
        globals.step();
        assert!(globals.globals.is_empty());
        assert_eq!(table.positions().unwrap(), BTreeMap::from([(0, 2), (1, 2)]));
    }

    #[test]
    fn a_table_that_cannot_start_is_tried_again_and_one_past_its_limit_stops() {
        let topics = MemoryTopics::default();
        topics.create("big", 1);
        for i in 0..10u8 {
            topics.append("big", 0, &[i], Some(&[0; 100]));
        }
        topics.unreachable(true);
        let state = state();
        want(&state, "big", 500);
        let mut globals = Globals::new(topics.consumer(), state.clone());
        globals.step();
        assert!(globals.globals.is_empty(), "the broker is away");
        assert_eq!(globals.waiting.len(), 1, "waits to be tried again");
        topics.unreachable(false);
        globals.waiting[0].1 = Instant::now();
        globals.step();
        let table = state.globals.get("big").unwrap();
        assert!(
            matches!(table.status(), Status::OverLimit(ref e) if e.contains("more than 500")),
            "{:?}",
            table.status()
        );
    }
}
