//! Global tables: a copy of a whole topic (every partition, the latest value per key) kept
//! once per worker, whichever topologies read it. The state updater
//! (`threads/globals.rs`) fills and tails each table; tasks read it through a
//! [`GlobalReader`] and never write it.
//!
//! A table lives in `<state-dir>/+global/<topic>`: a topology's tasks live in
//! `<state-dir>/<topology>`, and no topology name holds a `+`; a topic name is
//! `[A-Za-z0-9._-]`, never `.` or `..`. Its data and how far it has read each partition are written in one batch, so after a
//! crash it resumes from what it holds; a position outside the topic (re-created,
//! truncated) wipes it and it reads the topic again from the start.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::engine::{Db, Storage};
use super::store::TaskStore;
use super::{Charge, StateStore};

/// The directory of every global table of a worker, under its state directory.
pub const GLOBAL_DIR: &str = "+global";
/// Where a table keeps its positions (in its bookkeeping column family).
const POSITIONS_KEY: &[u8] = b"global-positions";

/// Where a table stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// Reading the topic up to where it ended when the table was opened: tasks wait.
    Restoring { restored: u64, total: u64 },
    /// Caught up once; kept current from now on.
    Ready,
    /// Stopped: why (tasks that need it fail with this).
    Failed(String),
    /// Stopped, grown past its limit: by how much (tasks that need it fail over their quota).
    OverLimit(String),
}

/// Why a task cannot read a table.
#[derive(Debug, Clone, PartialEq)]
pub enum NotReady {
    Failed(String),
    OverLimit(String),
}

/// One global table: its topic's records in a database of its own.
pub struct GlobalTable {
    pub topic: String,
    pub dir: PathBuf,
    pub db: Db,
    /// Most bytes it may take (the largest `limits.state` of the topologies that read it).
    limit: Mutex<u64>,
    status: Mutex<Status>,
    changed: Condvar,
}

impl GlobalTable {
    fn open(state_dir: &Path, topic: &str, storage: &dyn Storage, limit: u64) -> Result<GlobalTable, String> {
        let dir = state_dir.join(GLOBAL_DIR).join(topic);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let db = storage.open(&dir)?;
        Ok(GlobalTable {
            topic: topic.to_string(),
            dir,
            db,
            limit: Mutex::new(limit),
            status: Mutex::new(Status::Restoring { restored: 0, total: 0 }),
            changed: Condvar::new(),
        })
    }

    pub fn status(&self) -> Status {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set_status(&self, status: Status) {
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = status;
        self.changed.notify_all();
    }

    pub fn limit(&self) -> u64 {
        *self.limit.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes it takes on disk and in memtables.
    pub fn bytes(&self) -> u64 {
        self.db.size()
    }

    /// Waits until the table has caught up with its topic (true), `stopping` says stop
    /// (false), or it failed (the error). `progress` hears how far the restore is.
    pub fn wait_ready(&self, stopping: &dyn Fn() -> bool, progress: &dyn Fn(u64, u64)) -> Result<bool, NotReady> {
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            match &*status {
                Status::Ready => return Ok(true),
                Status::Failed(e) => {
                    return Err(NotReady::Failed(format!(
                        "the global table of topic {:?} failed: {e}",
                        self.topic
                    )))
                }
                Status::OverLimit(e) => {
                    return Err(NotReady::OverLimit(format!(
                        "the global table of topic {:?} stopped: {e}",
                        self.topic
                    )))
                }
                Status::Restoring { restored, total } => progress(*restored, *total),
            }
            if stopping() {
                return Ok(false);
            }
            status = self
                .changed
                .wait_timeout(status, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The next offset to read of each partition, as the data vouches for it.
    pub fn positions(&self) -> Result<BTreeMap<i32, i64>, String> {
        match self.db.read_meta(POSITIONS_KEY)? {
            None => Ok(BTreeMap::new()),
            Some(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| format!("the global table's positions are corrupt ({e})"))
            }
        }
    }

    /// Applies records and the positions they bring the table to, in one batch (no WAL: a
    /// crash replays them; [`Self::flush`] makes them durable).
    pub fn apply(&self, changes: &[(Vec<u8>, Option<Vec<u8>>)], positions: &BTreeMap<i32, i64>) -> Result<(), String> {
        let meta = serde_json::to_vec(positions).expect("positions serialise");
        self.db
            .write(
                &mut changes.iter().map(|(k, v)| (k.as_slice(), v.as_deref())),
                Some((POSITIONS_KEY, &meta)),
                false,
            )
            .map_err(|e| format!("global table of topic {:?}: {e}", self.topic))
    }

    pub fn flush(&self) -> Result<(), String> {
        self.db
            .flush(true)
            .map_err(|e| format!("global table of topic {:?}: {e}", self.topic))
    }

    /// Deletes every entry and position (the table is read again from the start).
    pub fn wipe(&self) -> Result<(), String> {
        let deletes: Vec<(Vec<u8>, Option<Vec<u8>>)> = self.db.dump()?.into_iter().map(|(k, _)| (k, None)).collect();
        self.apply(&deletes, &BTreeMap::new())?;
        self.flush()
    }
}

/// The global tables of a worker, by topic.
#[derive(Default)]
pub struct GlobalTables {
    tables: Mutex<HashMap<String, Arc<GlobalTable>>>,
    /// Tables opened or dropped since the state updater last looked.
    added: Mutex<Vec<Arc<GlobalTable>>>,
    removed: Mutex<Vec<String>>,
}

impl GlobalTables {
    /// Keeps the tables of `wanted` (topic → the largest state limit of the topologies that
    /// read it), opening those missing, and drops the rest. An error names each table that
    /// could not be opened (its tasks fail at start, saying why).
    pub fn want(&self, state_dir: &Path, storage: &dyn Storage, wanted: &BTreeMap<String, u64>) -> Result<(), String> {
        let mut tables = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        let gone: Vec<String> = tables.keys().filter(|t| !wanted.contains_key(*t)).cloned().collect();
        for topic in gone {
            tables.remove(&topic);
            self.removed.lock().unwrap_or_else(|p| p.into_inner()).push(topic);
        }
        let mut errors = Vec::new();
        for (topic, limit) in wanted {
            if let Some(table) = tables.get(topic) {
                *table.limit.lock().unwrap_or_else(|p| p.into_inner()) = *limit;
                continue;
            }
            match GlobalTable::open(state_dir, topic, storage, *limit) {
                Ok(table) => {
                    let table = Arc::new(table);
                    tables.insert(topic.clone(), table.clone());
                    self.added.lock().unwrap_or_else(|p| p.into_inner()).push(table);
                }
                Err(e) => errors.push(format!("the global table of topic {topic:?}: {e}")),
            }
        }
        match errors.is_empty() {
            true => Ok(()),
            false => Err(errors.join("; ")),
        }
    }

    /// The table of `topic`, if the worker keeps one.
    pub fn get(&self, topic: &str) -> Option<Arc<GlobalTable>> {
        self.tables
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(topic)
            .cloned()
    }

    /// Whether tables were opened or dropped since the last [`Self::take_changes`].
    pub fn has_changes(&self) -> bool {
        !self.added.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
            || !self.removed.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// What changed since the last call: tables to start filling, topics to stop reading.
    pub fn take_changes(&self) -> (Vec<Arc<GlobalTable>>, Vec<String>) {
        let added = std::mem::take(&mut *self.added.lock().unwrap_or_else(|p| p.into_inner()));
        let removed = std::mem::take(&mut *self.removed.lock().unwrap_or_else(|p| p.into_inner()));
        (added, removed)
    }
}

/// A task's view of a global table: reads go to the shared table, writes are refused.
pub struct GlobalReader {
    table: Arc<GlobalTable>,
    reads: TaskStore,
}

impl GlobalReader {
    pub fn new(name: &str, table: Arc<GlobalTable>) -> GlobalReader {
        let reads = TaskStore::new(name, table.db.clone());
        GlobalReader { table, reads }
    }

    pub fn table(&self) -> &Arc<GlobalTable> {
        &self.table
    }

    fn refused(&self) -> String {
        format!(
            "the store {:?} is a global table: the host fills it from the topic {:?}, and tasks only read it",
            self.reads.name(),
            self.table.topic
        )
    }
}

impl StateStore for GlobalReader {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        self.reads.get(key)
    }

    fn put(&mut self, _key: Vec<u8>, _value: Vec<u8>) -> Result<(), String> {
        Err(self.refused())
    }

    fn delete(&mut self, _key: Vec<u8>) -> Result<(), String> {
        Err(self.refused())
    }

    fn scan(
        &mut self,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        after: Option<&[u8]>,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<super::Entry>, String> {
        self.reads.scan(start, end, after, max, max_bytes)
    }

    fn charge(&self) -> Charge {
        Charge::Shared(self.table.bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_keeps_its_data_and_positions_and_refuses_writes() {
        let dir = std::env::temp_dir().join(format!("sluice-global-{}", std::process::id()));
        let memory = crate::state::rocks::RocksStorage::new(crate::state::rocks::SharedMemory::new(8 << 20, 4 << 20));
        let tables = GlobalTables::default();
        let wanted = BTreeMap::from([("acme.customers".to_string(), 1u64 << 30)]);
        tables.want(&dir, &memory, &wanted).unwrap();
        let (added, _) = tables.take_changes();
        assert_eq!(added.len(), 1);
        let table = tables.get("acme.customers").unwrap();
        assert!(table.dir.ends_with("+global/acme.customers"), "{}", table.dir.display());
        let changes = vec![
            (b"c1".to_vec(), Some(b"ada".to_vec())),
            (b"c2".to_vec(), Some(b"bob".to_vec())),
            (b"c1".to_vec(), None),
        ];
        table.apply(&changes, &BTreeMap::from([(0, 3), (1, 0)])).unwrap();
        table.flush().unwrap();
        assert_eq!(table.positions().unwrap(), BTreeMap::from([(0, 3), (1, 0)]));
        let mut reader = GlobalReader::new("customers", table.clone());
        assert_eq!(reader.get(b"c1").unwrap(), None);
        assert_eq!(reader.get(b"c2").unwrap(), Some(b"bob".to_vec()));
        let e = reader.put(b"c3".to_vec(), b"x".to_vec()).unwrap_err();
        assert!(e.contains("\"customers\" is a global table"), "{e}");
        assert!(reader.delete(b"c2".to_vec()).is_err());
        assert_eq!(reader.scan(None, None, None, 10, 1 << 20).unwrap().len(), 1);
        table.wipe().unwrap();
        assert_eq!(reader.get(b"c2").unwrap(), None);
        assert!(table.positions().unwrap().is_empty());
        // Dropped when no topology reads it any more.
        tables.want(&dir, &memory, &BTreeMap::new()).unwrap();
        assert_eq!(tables.take_changes().1, vec!["acme.customers".to_string()]);
        assert!(tables.get("acme.customers").is_none());
        drop((reader, table));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
