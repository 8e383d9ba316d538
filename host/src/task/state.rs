//! A task's state stores on the worker: validated against their changelogs, restored before
//! the task processes, and committed together with the marker that vouches for them.
//!
//! Each store's RocksDB holds a marker beside its data (see `state::rocks`): the changelog
//! topic and its id, and the next changelog offset. Data and marker are written in one
//! atomic batch, so local state never runs ahead of what vouches for it.
//!
//! The commit protocol, and where a crash can fall:
//!
//! 1. Outputs and the store's writes since the last commit go to Kafka (under exactly-once,
//!    in the task's transaction). Nothing has reached RocksDB yet.
//!    *Crash here:* RocksDB and its marker are as of the last commit; the records produced
//!    are either replayed from the changelog (at-least-once: their source records are
//!    processed again, so counts may run ahead of the truth, never behind) or aborted
//!    (exactly-once: the restart sees none of it).
//! 2. Everything produced is acknowledged, and source offsets are committed (exactly-once:
//!    the transaction commits, offsets included).
//!    *Crash here:* RocksDB is behind the changelog; the restart replays the changelog from
//!    the marker and the state is exact.
//! 3. The writes and the new marker go to RocksDB in one batch (WAL on).
//!
//! A store whose marker cannot be trusted — none, another topic id (the changelog was
//! re-created), an offset outside the changelog — is wiped and rebuilt from the changelog.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rocksdb::DB;

use super::TaskProgress;
use crate::group::TaskId;
use crate::kafka::{KafkaSettings, OffsetsClient};
use crate::metrics::{Metrics, StoreLabels};
use crate::runtime::NamedStore;
use crate::state::checkpoint::{self, Checkpoint};
use crate::state::restore::ChangelogReader;
use crate::state::rocks::{self, Marker, RocksStore, SharedMemory};
use crate::topology::Changelog;

/// Where a worker keeps state, and the memory its stores share.
pub struct StateEnv {
    pub dir: PathBuf,
    pub memory: SharedMemory,
    /// The stores of the active tasks running here, by (topology, partition, store): what
    /// interactive queries read (their committed state).
    pub open: std::sync::Mutex<std::collections::HashMap<(String, i32, String), std::sync::Weak<DB>>>,
    /// The worker's global tables, by topic (filled by the state updater).
    pub globals: crate::state::global::GlobalTables,
    /// Open databases a promoted learner (or standby) handed to the task that becomes
    /// active here, by store path, with when they were parked. Closing a store and opening
    /// it again cost up to 0.8 s of a handover on a busy machine (the close waits for
    /// running compactions, the open reads every file's footer); the task takes it as is.
    parked: std::sync::Mutex<std::collections::HashMap<PathBuf, (Arc<DB>, std::time::Instant)>>,
    /// Reads changelog bounds when a task opens its stores: one client for the worker, made
    /// at the first start and kept, so a start does not wait for a new client's connections
    /// (up to 0.7 s of a handover on a busy machine).
    bounds: Arc<OffsetsClient>,
    /// Threads dropping what ended tasks held (their guest, their producer), joined by
    /// [`StateEnv::settle`].
    dropping: std::sync::Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// Task directories whose learner is handing its stores over (see
    /// [`StateEnv::wait_for_handover`]), and the signal that one is done.
    handovers: std::sync::Mutex<std::collections::HashSet<PathBuf>>,
    handed: std::sync::Condvar,
}

/// How long a parked store waits for its task before it is closed.
const PARKED_FOR: Duration = Duration::from_secs(30);

impl StateEnv {
    pub fn new(dir: PathBuf, memory: SharedMemory, kafka: &KafkaSettings) -> StateEnv {
        StateEnv {
            dir,
            memory,
            open: Default::default(),
            globals: Default::default(),
            parked: Default::default(),
            bounds: Arc::new(OffsetsClient::new(kafka, "sluice-changelog-bounds", "sluice.restore")),
            dropping: Default::default(),
            handovers: Default::default(),
            handed: Default::default(),
        }
    }

    /// The learner of the task whose state is in `dir` is handing its stores over: the
    /// task's start waits for it ([`wait_for_handover`](Self::wait_for_handover)).
    pub fn expect_handover(&self, dir: PathBuf) {
        self.handovers.lock().unwrap_or_else(|p| p.into_inner()).insert(dir);
    }

    /// The learner of the task in `dir` has parked its stores (or closed them, failing).
    pub fn handed_over(&self, dir: &Path) {
        self.handovers.lock().unwrap_or_else(|p| p.into_inner()).remove(dir);
        self.handed.notify_all();
    }

    /// No learner hands anything over any more (the state updater ended).
    pub fn handed_over_all(&self) {
        self.handovers.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.handed.notify_all();
    }

    /// Waits until no learner is handing the stores in `dir` over, or `stop` says to stop
    /// (then false). A handover is bounded (the learner reads its tail for at most two
    /// seconds); after a minute the start goes on and opens what is there.
    pub fn wait_for_handover(&self, dir: &Path, stop: &dyn Fn() -> bool) -> bool {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut handovers = self.handovers.lock().unwrap_or_else(|p| p.into_inner());
        while handovers.contains(dir) {
            if stop() {
                return false;
            }
            if std::time::Instant::now() >= deadline {
                tracing::warn!(dir = %dir.display(), "a learner's handover took over a minute: opening the stores as they are");
                return true;
            }
            handovers = self
                .handed
                .wait_timeout(handovers, Duration::from_millis(50))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// The first offset and the end (read-committed: the last stable offset) of a changelog
    /// partition, read on the worker's long-lived client (see [`OffsetsClient`]).
    pub fn changelog_bounds(&self, topic: &str, partition: i32) -> Result<(i64, i64), String> {
        use rdkafka::consumer::Consumer;
        self.bounds
            .ask(|client| client.fetch_watermarks(topic, partition, Duration::from_secs(15)))
            .map_err(|e| format!("reading the offsets of changelog {topic}/{partition}: {e}"))
    }

    /// Makes the client [`changelog_bounds`](Self::changelog_bounds) reads on and connects
    /// it, in the background: what a worker does when it starts, so that its first task
    /// start does not wait for it either.
    pub fn connect(&self) {
        self.bounds.connect();
    }

    /// Drops `what` (an ended task: its guest instance, its producer, its share of its
    /// stores) on a thread of its own, so that the stream thread and the task's new owner do
    /// not wait for it; [`settle`](Self::settle) waits for every such drop.
    pub fn drop_later<T: Send + 'static>(&self, what: T) {
        let mut dropping = self.dropping.lock().unwrap_or_else(|p| p.into_inner());
        dropping.retain(|t| !t.is_finished());
        match std::thread::Builder::new()
            .name("drop-task".into())
            .spawn(move || drop(what))
        {
            Ok(handle) => dropping.push(handle),
            // No thread to be had: dropped here (the spawn hands `what` back by dropping it).
            Err(e) => tracing::warn!("dropping an ended task on this thread: {e}"),
        }
    }

    /// Waits for the drops [`drop_later`](Self::drop_later) started, then closes every
    /// parked store: what a worker does last, so that its stores are closed when it exits.
    pub fn settle(&self) {
        let dropping = std::mem::take(&mut *self.dropping.lock().unwrap_or_else(|p| p.into_inner()));
        for t in dropping {
            let _ = t.join();
        }
        let parked = std::mem::take(&mut *self.parked.lock().unwrap_or_else(|p| p.into_inner()));
        drop(parked);
    }

    /// Keeps the open database of the store at `path` for whoever opens that store next
    /// (see [`prepare_store`]).
    pub fn park(&self, path: PathBuf, db: Arc<DB>) {
        let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        parked.insert(path, (db, std::time::Instant::now()));
    }

    /// The parked database of the store at `path`, if one is.
    fn take_parked(&self, path: &Path) -> Option<Arc<DB>> {
        let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
        parked.remove(path).map(|(db, _)| db)
    }

    /// Closes (in the background) parked stores that no task took within
    /// [`PARKED_FOR`]: their task went elsewhere, or failed before it opened them.
    pub fn close_stale_parked(&self) {
        let stale: Vec<(PathBuf, Arc<DB>)> = {
            let mut parked = self.parked.lock().unwrap_or_else(|p| p.into_inner());
            let old: Vec<PathBuf> = parked
                .iter()
                .filter(|(_, (_, at))| at.elapsed() >= PARKED_FOR)
                .map(|(path, _)| path.clone())
                .collect();
            old.into_iter()
                .filter_map(|path| parked.remove(&path).map(|(db, _)| (path, db)))
                .collect()
        };
        if stale.is_empty() {
            return;
        }
        for (path, _) in &stale {
            tracing::debug!(path = %path.display(), "closing a parked store no task took");
        }
        let _ = std::thread::Builder::new()
            .name("close-parked".into())
            .spawn(move || drop(stale));
    }

    /// How many stores are parked now.
    pub fn parked_count(&self) -> usize {
        self.parked.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Keeps the global tables `topologies` read (and no others), each within the largest
    /// state limit of the topologies reading it.
    pub fn want_globals<'a>(&self, topologies: impl IntoIterator<Item = &'a crate::topology::DeployedTopology>) {
        let mut wanted = std::collections::BTreeMap::<String, u64>::new();
        for t in topologies {
            for g in &t.globals {
                let limit = wanted.entry(g.topic.clone()).or_default();
                *limit = (*limit).max(t.state_limit);
            }
        }
        if let Err(e) = self.globals.want(&self.dir, &self.memory, &wanted) {
            tracing::error!("{e}");
        }
    }

    /// The open databases of `store` of `topology`'s active tasks here, by partition.
    pub fn active_stores(&self, topology: &str, store: &str) -> Vec<(i32, Arc<DB>)> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|_, db| db.strong_count() > 0);
        let mut out: Vec<(i32, Arc<DB>)> = open
            .iter()
            .filter(|((t, _, s), _)| t == topology && s == store)
            .filter_map(|((_, p, _), db)| Some((*p, db.upgrade()?)))
            .collect();
        out.sort_by_key(|(p, _)| *p);
        out
    }
}

/// The directory of one task's state: `<topology>/<partition>`, or `<topology>/<sub>/<partition>`.
pub fn task_dir(state_dir: &Path, task: &TaskId) -> PathBuf {
    let topology = state_dir.join(&*task.topology);
    match &task.sub {
        None => topology.join(task.partition.to_string()),
        Some(sub) => topology.join(&**sub).join(task.partition.to_string()),
    }
}

/// A store opened and checked against its changelog, positioned where its data ends.
pub struct OpenedStore {
    pub db: Arc<DB>,
    pub reader: ChangelogReader,
}

/// Opens one store of a task and checks its marker against the changelog. A store that
/// cannot be trusted is wiped (with a log line saying why) and read from the beginning.
pub fn open_store(
    env: &StateEnv,
    kafka: &KafkaSettings,
    task: &str,
    dir: &Path,
    changelog: &Changelog,
    partition: i32,
) -> Result<OpenedStore, String> {
    let began = std::time::Instant::now();
    let bounds = env.changelog_bounds(&changelog.topic, partition)?;
    let mut reader = ChangelogReader::with_bounds(kafka, &changelog.topic, partition, bounds);
    let read_bounds = began.elapsed();
    let (db, from) = prepare_store(env, task, dir, changelog, partition, reader.bounds())?;
    tracing::debug!(
        target: "handover", task = %task, store = %changelog.store, bounds_ms = read_bounds.as_millis() as u64,
        open_ms = (began.elapsed() - read_bounds).as_millis() as u64, "store opened"
    );
    reader.seek(from)?;
    Ok(OpenedStore { db, reader })
}

/// Opens a store's database for reading its changelog partition, whose first offset and end
/// are `bounds`: returns it with the offset to read from. A store whose local data cannot be
/// trusted (see [`distrust`]) is wiped first and read from the start.
pub fn prepare_store(
    env: &StateEnv,
    task: &str,
    dir: &Path,
    changelog: &Changelog,
    partition: i32,
    (low, high): (i64, i64),
) -> Result<(Arc<DB>, i64), String> {
    let path = dir.join(&changelog.store);
    let mut db = match env.take_parked(&path) {
        Some(db) => db,
        None => Arc::new(rocks::open(&path, &env.memory)?),
    };
    let marker = rocks::read_marker(&db)?;
    // Whether it holds data matters only without a marker; looking costs an iterator over
    // every file, which a store just written by a learner has many of.
    let has_data = marker.is_none() && !rocks::is_empty(&db);
    let distrust = distrust(marker.as_ref(), has_data, changelog, partition, (low, high));
    let from = match (&marker, &distrust) {
        (Some(m), None) => m.next_offset,
        _ => low,
    };
    if let Some(why) = distrust {
        tracing::warn!(task, store = %changelog.store, "wiping the local store and rebuilding it from the changelog: {why}");
        // A task that ended here may still be letting go of it (`StateEnv::drop_later`).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&db) > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if Arc::strong_count(&db) > 1 {
            return Err(format!(
                "store {} at {} is still open elsewhere",
                changelog.store,
                path.display()
            ));
        }
        drop(db);
        std::fs::remove_dir_all(&path).map_err(|e| format!("removing {}: {e}", path.display()))?;
        db = Arc::new(rocks::open(&path, &env.memory)?);
    }
    Ok((db, from))
}

/// Why a store's local data cannot be trusted, if it cannot: `marker` is what the store says
/// it holds, `bounds` the changelog partition's first offset and end.
pub fn distrust(
    marker: Option<&Marker>,
    has_data: bool,
    changelog: &Changelog,
    partition: i32,
    (low, high): (i64, i64),
) -> Option<String> {
    match marker {
        None if !has_data => None,
        None => Some("it has data but no marker of the changelog offset it holds".to_string()),
        Some(m) if m.topic != changelog.topic => Some(format!(
            "it was restored from changelog {:?}, not {:?}",
            m.topic, changelog.topic
        )),
        Some(m) if !m.topic_id.is_empty() && !changelog.topic_id.is_empty() && m.topic_id != changelog.topic_id => {
            Some(format!(
                "changelog {} was deleted and created again (topic id {} in the store, {} in the cluster)",
                changelog.topic, m.topic_id, changelog.topic_id
            ))
        }
        Some(m) if m.next_offset > high => Some(format!(
            "it holds changelog offsets up to {} but changelog {}/{partition} ends at {high}",
            m.next_offset, changelog.topic
        )),
        Some(m) if m.next_offset < low => Some(format!(
            "it holds changelog offsets up to {} but changelog {}/{partition} now starts at {low}",
            m.next_offset, changelog.topic
        )),
        Some(_) => None,
    }
}

/// A task's stores and the changelog of each (in declaration order).
pub struct TaskState {
    dir: PathBuf,
    changelogs: Vec<Changelog>,
}

/// How opening a task's state ended.
pub enum Opened {
    Ready(TaskState, Vec<NamedStore>),
    /// `stop` was set while restoring.
    Stopped,
}

impl TaskState {
    /// Opens and restores every store of a task (each restoration is logged and measured),
    /// checking `stop` between batches. Returns the stores for the instance.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        env: &StateEnv,
        kafka: &KafkaSettings,
        task_id: &TaskId,
        task: &str,
        changelogs: Vec<Changelog>,
        metrics: &Metrics,
        progress: &dyn TaskProgress,
        stop: &dyn Fn() -> bool,
    ) -> Result<Opened, String> {
        let partition = task_id.partition as i32;
        let dir = task_dir(&env.dir, task_id);
        let waited = std::time::Instant::now();
        if !env.wait_for_handover(&dir, stop) {
            return Ok(Opened::Stopped);
        }
        if waited.elapsed() >= Duration::from_millis(1) {
            tracing::debug!(target: "handover", task = %task, ms = waited.elapsed().as_millis() as u64, "waited for the learner's handover");
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating state directory {}: {e}", dir.display()))?;
        let mut stores = Vec::new();
        for changelog in &changelogs {
            let store = &changelog.store;
            let OpenedStore { db, mut reader } = open_store(env, kafka, task, &dir, changelog, partition)?;
            let start = reader.position();
            let labels = StoreLabels {
                topology: task_id.topology.to_string(),
                task: task.into(),
                store: store.clone(),
            };
            let counter = metrics.restored_records.get_or_create(&labels).clone();
            let mut reported = 0;
            if reader.end() > start {
                tracing::info!(task = %task, store = %store, changelog = %changelog.topic, from = start, to = reader.end(), "restoring");
            }
            let progress = reader.restore_into(&db, &changelog.topic_id, stop, |p| {
                progress.restoring(task_id, p.restored, p.total, p.rate());
                counter.inc_by(p.restored - reported);
                reported = p.restored;
                metrics
                    .restore_remaining
                    .get_or_create(&labels)
                    .set((p.total - p.restored) as i64);
                metrics.restore_rate.get_or_create(&labels).set(p.rate());
                metrics
                    .restore_seconds_left
                    .get_or_create(&labels)
                    .set(p.time_left().as_secs_f64());
                if p.restored < p.total {
                    tracing::info!(
                        task = %task, store = %store, restored = p.restored, total = p.total,
                        rate = %format!("{:.0}/s", p.rate()),
                        left = %humantime::format_duration(Duration::from_secs(p.time_left().as_secs())),
                        "restoring"
                    );
                }
            })?;
            let Some(progress) = progress else {
                tracing::info!(task = %task, store = %store, at = reader.position(), "stopped while restoring; what was restored is kept");
                return Ok(Opened::Stopped);
            };
            tracing::info!(
                task = %task, store = %store, from_offset = start, records = progress.restored,
                mb = %format!("{:.1}", progress.bytes as f64 / 1e6),
                seconds = %format!("{:.2}", progress.elapsed.as_secs_f64()),
                "restored {} records", progress.restored
            );
            // Destroying a Kafka client takes about 100 ms (librdkafka joins its threads):
            // not on the start's path, where the task's new owner waits for it.
            env.drop_later(reader);
            env.open.lock().unwrap_or_else(|p| p.into_inner()).insert(
                (task_id.topology.to_string(), partition, store.clone()),
                Arc::downgrade(&db),
            );
            stores.push(NamedStore {
                name: store.clone(),
                store: Box::new(RocksStore::new(store, db)),
            });
        }
        let state = TaskState { dir, changelogs };
        let hint = std::time::Instant::now();
        state.write_offsets_hint(&mut stores)?;
        tracing::debug!(target: "handover", task = %task, ms = hint.elapsed().as_millis() as u64, "offsets hint written");
        Ok(Opened::Ready(state, stores))
    }

    /// Where the database of `store` lives.
    pub fn store_path(&self, store: &str) -> PathBuf {
        self.dir.join(store)
    }

    /// The changelog of a store.
    pub fn changelog(&self, store: &str) -> Option<&Changelog> {
        self.changelogs.iter().find(|c| c.store == store)
    }

    /// Step 3: moves each store's writes into RocksDB with its new marker. `acknowledged`
    /// gives the highest acknowledged offset of a changelog topic (none: nothing new).
    pub fn commit(&self, stores: &mut [NamedStore], acknowledged: impl Fn(&str) -> Option<i64>) -> Result<(), String> {
        let mut committed = false;
        for named in stores.iter_mut() {
            let Some(store) = named.store.as_any().downcast_mut::<RocksStore>() else {
                continue;
            };
            let changelog = self
                .changelog(&named.name)
                .ok_or_else(|| format!("store {} has no changelog", named.name))?;
            let Some(offset) = acknowledged(&changelog.topic) else {
                continue;
            };
            let marker = Marker {
                topic: changelog.topic.clone(),
                topic_id: changelog.topic_id.clone(),
                next_offset: offset + 1,
            };
            store.commit(&marker)?;
            committed = true;
        }
        if committed {
            self.write_offsets_hint(stores)?;
        }
        Ok(())
    }

    /// Drops every store's writes since the last commit (stopping without a commit).
    pub fn discard(&self, stores: &mut [NamedStore]) {
        for named in stores.iter_mut() {
            if let Some(store) = named.store.as_any().downcast_mut::<RocksStore>() {
                store.discard();
            }
        }
    }

    /// Writes `checkpoint.json`: each store's changelog position, read by the worker (without
    /// opening RocksDB) to tell the group how warm its local state is. A hint only: what
    /// state is trusted is decided by the markers inside the stores.
    fn write_offsets_hint(&self, stores: &mut [NamedStore]) -> Result<(), String> {
        let mut hint = Checkpoint::new();
        for named in stores.iter_mut() {
            if let Some(store) = named.store.as_any().downcast_mut::<RocksStore>() {
                if let Some(marker) = rocks::read_marker(store.db())? {
                    hint.insert(named.name.clone(), marker.next_offset);
                }
            }
        }
        checkpoint::write(&self.dir.join("checkpoint.json"), &hint)
    }
}

/// Changelog positions of every store, by store name, read from the hint file.
pub fn offsets_hint(dir: &Path) -> Option<BTreeMap<String, i64>> {
    checkpoint::read(&dir.join("checkpoint.json")).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changelog(id: &str) -> Changelog {
        Changelog {
            store: "counts".into(),
            topic: "t-counts-changelog".into(),
            topic_id: id.into(),
        }
    }

    fn marker(id: &str, next_offset: i64) -> Marker {
        Marker {
            topic: "t-counts-changelog".into(),
            topic_id: id.into(),
            next_offset,
        }
    }

    #[test]
    fn a_store_is_trusted_only_when_its_marker_matches_the_changelog() {
        let c = changelog("A");
        let trusted = |m: Option<Marker>, data: bool, bounds| distrust(m.as_ref(), data, &c, 0, bounds);
        assert_eq!(
            trusted(None, false, (0, 100)),
            None,
            "an empty store restores from the start"
        );
        assert_eq!(trusted(Some(marker("A", 50)), true, (0, 100)), None);
        assert_eq!(trusted(Some(marker("A", 100)), true, (0, 100)), None, "caught up");
        assert_eq!(
            trusted(Some(marker("", 50)), true, (0, 100)),
            None,
            "an id unknown then"
        );
        let why = |m: Option<Marker>, data: bool, bounds| trusted(m, data, bounds).expect("distrusted");
        assert!(why(None, true, (0, 100)).contains("no marker"));
        assert!(why(Some(marker("B", 50)), true, (0, 100)).contains("deleted and created again"));
        assert!(why(Some(marker("A", 101)), true, (0, 100)).contains("ends at 100"));
        assert!(why(Some(marker("A", 10)), true, (20, 100)).contains("now starts at 20"));
        let mut other = marker("A", 5);
        other.topic = "elsewhere".into();
        assert!(why(Some(other), true, (0, 100)).contains("not \"t-counts-changelog\""));
    }

    #[test]
    fn a_parked_store_is_taken_open_by_the_next_owner_and_closed_when_nobody_takes_it() {
        let dir = std::env::temp_dir().join(format!("sluice-parked-{}", uuid::Uuid::new_v4().simple()));
        let env = StateEnv::new(
            dir.clone(),
            rocks::SharedMemory::new(8 << 20, 8 << 20),
            &KafkaSettings::new("127.0.0.1:9"),
        );
        let c = changelog("A");
        let path = dir.join(&c.store);
        let db = Arc::new(rocks::open(&path, &env.memory).unwrap());
        rocks::write_with_marker(&db, [(&b"k"[..], Some(&b"v"[..]))], &marker("A", 7), false).unwrap();
        // Open elsewhere, the store is locked: opening it again fails.
        let locked = prepare_store(&env, "t/0", &dir, &c, 0, (0, 10));
        assert!(locked.is_err(), "RocksDB lets one opener hold a store");
        env.park(path.clone(), db);
        let (db, from) = prepare_store(&env, "t/0", &dir, &c, 0, (0, 10)).expect("the parked store is taken");
        assert_eq!(from, 7, "read on from the parked store's marker");
        assert_eq!(db.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
        assert_eq!(Arc::strong_count(&db), 1, "nobody else holds it");
        assert_eq!(env.parked_count(), 0);
        // Parked again and not taken: closed once it is stale, so the store opens again.
        env.park(path.clone(), db);
        env.close_stale_parked();
        assert_eq!(env.parked_count(), 1, "a store parked just now waits for its task");
        {
            let mut parked = env.parked.lock().unwrap();
            parked.get_mut(&path).unwrap().1 -= PARKED_FOR;
        }
        env.close_stale_parked();
        assert_eq!(env.parked_count(), 0);
        let reopened = (0..100).find_map(|_| {
            std::thread::sleep(Duration::from_millis(20));
            prepare_store(&env, "t/0", &dir, &c, 0, (0, 10)).ok()
        });
        assert_eq!(
            reopened.map(|(_, from)| from),
            Some(7),
            "closed in the background, then opened again"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
