//! A worker's state directory: where its stores live (one database per task and store,
//! under `<state-dir>/<topology>[/<sub>]/<partition>/<store>`), the storage engine that opens
//! them, the global tables, the stores interactive queries may read, and how a store is
//! opened and checked against its changelog.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::checkpoint;
use super::engine::{Db, Engine, Marker, StateError, Storage};
use super::global::GlobalTables;
use super::Changelog;
use crate::group::TaskId;
use crate::kafka::{KafkaSettings, OffsetsClient};

/// A store interactive queries may read: (topology, partition, store).
type QueryKey = (String, i32, String);

/// Where a worker keeps state.
pub struct StateDir {
    pub dir: PathBuf,
    pub storage: Arc<dyn Storage>,
    /// The worker's global tables, by topic (filled by the state updater).
    pub globals: GlobalTables,
    /// The stores of the active tasks running here, by (topology, partition, store): what
    /// interactive queries read (their committed state).
    queryable: Mutex<HashMap<QueryKey, Weak<dyn Engine>>>,
    /// Reads changelog bounds when a task opens its stores: one client for the worker, made
    /// at the first start and kept, so a start does not wait for a new client's connections
    /// (up to 0.7 s of a handover on a busy machine).
    bounds: Arc<OffsetsClient>,
}

impl StateDir {
    pub fn new(dir: PathBuf, storage: Arc<dyn Storage>, kafka: &KafkaSettings) -> StateDir {
        StateDir {
            dir,
            storage,
            globals: Default::default(),
            queryable: Default::default(),
            bounds: Arc::new(OffsetsClient::new(kafka, "sluice-changelog-bounds", "sluice.restore")),
        }
    }

    /// The first offset and the end (read-committed: the last stable offset) of a changelog
    /// partition, read on the worker's long-lived client (see [`OffsetsClient`]).
    pub fn changelog_bounds(&self, topic: &str, partition: i32) -> Result<(i64, i64), StateError> {
        use rdkafka::consumer::Consumer;
        self.bounds
            .ask(|client| client.fetch_watermarks(topic, partition, Duration::from_secs(15)))
            .map_err(|e| StateError::retryable(format!("reading the offsets of changelog {topic}/{partition}: {e}")))
    }

    /// Makes the client [`changelog_bounds`](Self::changelog_bounds) reads on and connects
    /// it, in the background: what a worker does when it starts, so that its first task
    /// start does not wait for it either.
    pub fn connect(&self) {
        self.bounds.connect();
    }

    /// Keeps the global tables of `wanted` (topic → the largest state limit of the
    /// topologies that read it), and no others.
    pub fn want_globals(&self, wanted: &BTreeMap<String, u64>) {
        if let Err(e) = self.globals.want(&self.dir, &*self.storage, wanted) {
            tracing::error!("{e}");
        }
    }

    /// Interactive queries may read `db`, store `store` of `topology`'s active task on
    /// `partition` (until the task ends: [`forget_queryable`](Self::forget_queryable)).
    pub fn queryable(&self, topology: &str, partition: i32, store: &str, db: &Db) {
        self.queryable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((topology.to_string(), partition, store.to_string()), Arc::downgrade(db));
    }

    /// The task's stores are no longer queried here.
    pub fn forget_queryable(&self, topology: &str, partition: i32, stores: impl IntoIterator<Item = String>) {
        let mut open = self.queryable.lock().unwrap_or_else(|p| p.into_inner());
        for store in stores {
            open.remove(&(topology.to_string(), partition, store));
        }
    }

    /// The open databases of `store` of `topology`'s active tasks here, by partition.
    pub fn active_stores(&self, topology: &str, store: &str) -> Vec<(i32, Db)> {
        let mut open = self.queryable.lock().unwrap_or_else(|p| p.into_inner());
        open.retain(|_, db| db.strong_count() > 0);
        let mut out: Vec<(i32, Db)> = open
            .iter()
            .filter(|((t, _, s), _)| t == topology && s == store)
            .filter_map(|((_, p, _), db)| Some((*p, db.upgrade()?)))
            .collect();
        out.sort_by_key(|(p, _)| *p);
        out
    }

    /// Opens a store's database for reading its changelog partition, whose first offset and
    /// end are `bounds` — or takes `warm`, the database open already — and returns it with
    /// the offset to read from. A store whose local data cannot be trusted (see
    /// [`distrust`]) is wiped first and read from the start.
    pub fn prepare_store(
        &self,
        task: &str,
        dir: &Path,
        changelog: &Changelog,
        partition: i32,
        (low, high): (i64, i64),
        warm: Option<Db>,
    ) -> Result<(Db, i64), StateError> {
        let path = dir.join(&changelog.store);
        let mut db = match warm {
            Some(db) => db,
            None => self.storage.open(&path)?,
        };
        let marker = db.read_marker()?;
        // Whether it holds data matters only without a marker; looking costs an iterator over
        // every file, which a store just written by a learner has many of.
        let has_data = marker.is_none() && !db.is_empty();
        let distrust = distrust(marker.as_ref(), has_data, changelog, partition, (low, high));
        let from = match (&marker, &distrust) {
            (Some(m), None) => m.next_offset,
            _ => low,
        };
        if let Some(why) = distrust {
            tracing::warn!(task, store = %changelog.store, "wiping the local store and rebuilding it from the changelog: {why}");
            // An interactive query may be reading it this moment.
            let deadline = std::time::Instant::now() + Duration::from_secs(1);
            while Arc::strong_count(&db) > 1 && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if Arc::strong_count(&db) > 1 {
                return Err(StateError::retryable(format!(
                    "store {} at {} is still open elsewhere",
                    changelog.store,
                    path.display()
                )));
            }
            drop(db);
            self.storage.wipe(&path)?;
            db = self.storage.open(&path)?;
        }
        Ok((db, from))
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

/// Changelog positions of every store, by store name, read from the hint file.
pub fn offsets_hint(dir: &Path) -> Option<BTreeMap<String, i64>> {
    checkpoint::read(&dir.join("checkpoint.json")).ok().flatten()
}

/// Writes the hint file [`offsets_hint`] reads: each store's changelog position, read by the
/// worker (without opening a store) to tell the group how warm its local state is. A hint
/// only: what state is trusted is decided by the markers inside the stores.
pub fn write_offsets_hint(dir: &Path, positions: &checkpoint::Checkpoint) -> Result<(), String> {
    checkpoint::write(&dir.join("checkpoint.json"), positions)
}

/// A worker id that survives restarts, kept in the state directory.
pub fn worker_id(state_dir: &Path) -> anyhow::Result<[u8; 16]> {
    let path = state_dir.join("worker-id");
    if let Ok(text) = std::fs::read_to_string(&path) {
        if let Ok(id) = uuid::Uuid::parse_str(text.trim()) {
            return Ok(*id.as_bytes());
        }
    }
    std::fs::create_dir_all(state_dir).map_err(|e| anyhow::anyhow!("creating {}: {e}", state_dir.display()))?;
    let id = uuid::Uuid::new_v4();
    std::fs::write(&path, id.to_string()).map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    Ok(*id.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::super::engine::as_slices;
    use super::super::memory::MemoryStorage;
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
    fn a_warm_store_is_taken_as_it_is_and_an_untrusted_one_is_wiped() {
        let storage = MemoryStorage::new();
        let dir = Path::new("/state/t/0");
        let state = StateDir::new(dir.to_path_buf(), storage.clone(), &KafkaSettings::new("127.0.0.1:9"));
        let c = changelog("A");
        let path = dir.join(&c.store);
        let db = storage.open(&path).unwrap();
        let data = vec![(b"k".to_vec(), Some(b"v".to_vec()))];
        db.write_with_marker(&mut as_slices(&data), &marker("A", 7), false)
            .unwrap();
        // Open elsewhere, the store is busy: opening it again is a retryable error.
        let busy = state.prepare_store("t/0", dir, &c, 0, (0, 10), None).err().unwrap();
        assert!(busy.is_retryable(), "{busy}");
        let (db, from) = state.prepare_store("t/0", dir, &c, 0, (0, 10), Some(db)).unwrap();
        assert_eq!(from, 7, "read on from the warm store's marker");
        assert_eq!(db.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
        // The changelog was re-created: wiped, and read from its start.
        let (db, from) = state
            .prepare_store("t/0", dir, &changelog("B"), 0, (3, 10), Some(db))
            .unwrap();
        assert_eq!((from, db.get(b"k").unwrap()), (3, None));
        assert!(db.read_marker().unwrap().is_none());
        drop(db);
        // Closed, it opens again from "disk".
        assert!(state.prepare_store("t/0", dir, &c, 0, (0, 10), None).is_ok());
    }
}
