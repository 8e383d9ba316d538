//! The in-memory engine: databases in maps, one per path, kept for as long as the storage
//! is (closing and opening a database again finds its data, as on a disk). For tests of the
//! state layer (the state updater, restoration, handovers) without RocksDB.
//!
//! It keeps RocksDB's rule of one opener: opening a database that is open already is a
//! retryable error, so tests see the same races a worker does. Every write is durable at
//! once; [`MemoryStorage::failing`] makes writes fail, for error paths.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use super::engine::{Cursor, Db, Engine, StateError, Storage, Writes};

/// The data and bookkeeping of one database.
#[derive(Default)]
struct Data {
    entries: BTreeMap<Vec<u8>, Vec<u8>>,
    meta: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// A database's data, and its engine while it is open.
type Slot = (Arc<RwLock<Data>>, Weak<MemoryEngine>);

/// In-memory databases by path.
#[derive(Default)]
pub struct MemoryStorage {
    databases: Mutex<HashMap<PathBuf, Slot>>,
    failing: Arc<AtomicBool>,
}

impl MemoryStorage {
    pub fn new() -> Arc<MemoryStorage> {
        Arc::new(MemoryStorage::default())
    }

    /// From now on (`true`) every write fails, as on a disk that is full.
    pub fn failing(&self, fail: bool) {
        self.failing.store(fail, Ordering::Relaxed);
    }

    /// Whether a database at `path` is open now.
    pub fn is_open(&self, path: &Path) -> bool {
        let databases = self.databases.lock().unwrap_or_else(|p| p.into_inner());
        databases.get(path).is_some_and(|(_, open)| open.strong_count() > 0)
    }
}

impl Storage for MemoryStorage {
    fn open(&self, path: &Path) -> Result<Db, StateError> {
        let mut databases = self.databases.lock().unwrap_or_else(|p| p.into_inner());
        let (data, open) = databases.entry(path.to_path_buf()).or_default();
        if open.strong_count() > 0 {
            return Err(StateError::retryable(format!(
                "the store at {} is open elsewhere",
                path.display()
            )));
        }
        let engine = Arc::new(MemoryEngine {
            data: data.clone(),
            failing: self.failing.clone(),
        });
        *open = Arc::downgrade(&engine);
        Ok(engine)
    }

    fn wipe(&self, path: &Path) -> Result<(), StateError> {
        let mut databases = self.databases.lock().unwrap_or_else(|p| p.into_inner());
        if databases.get(path).is_some_and(|(_, open)| open.strong_count() > 0) {
            return Err(StateError::retryable(format!(
                "the store at {} is open: it cannot be wiped",
                path.display()
            )));
        }
        databases.remove(path);
        Ok(())
    }
}

/// One in-memory database.
pub struct MemoryEngine {
    data: Arc<RwLock<Data>>,
    failing: Arc<AtomicBool>,
}

impl MemoryEngine {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Data> {
        self.data.read().unwrap_or_else(|p| p.into_inner())
    }
}

impl Engine for MemoryEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self.read().entries.get(key).cloned())
    }

    fn cursor(&self, upper: Option<&[u8]>) -> Box<dyn Cursor + '_> {
        Box::new(MemoryCursor {
            engine: self,
            upper: upper.map(<[u8]>::to_vec),
            at: None,
        })
    }

    fn write<'a>(&self, changes: Writes<'_, 'a>, meta: Option<(&[u8], &[u8])>, _wal: bool) -> Result<(), StateError> {
        if self.failing.load(Ordering::Relaxed) {
            return Err(StateError::fatal(
                "writing state: the disk is full (a test's failing storage)",
            ));
        }
        // One batch: nothing is visible before all of it is.
        let changes: Vec<(Vec<u8>, Option<Vec<u8>>)> =
            changes.map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec))).collect();
        let mut data = self.data.write().unwrap_or_else(|p| p.into_inner());
        for (k, v) in changes {
            match v {
                Some(v) => data.entries.insert(k, v),
                None => data.entries.remove(&k),
            };
        }
        if let Some((k, v)) = meta {
            data.meta.insert(k.to_vec(), v.to_vec());
        }
        Ok(())
    }

    fn read_meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        Ok(self.read().meta.get(key).cloned())
    }

    fn flush(&self, _wait: bool) -> Result<(), StateError> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.read()
            .entries
            .iter()
            .map(|(k, v)| (k.len() + v.len()) as u64)
            .sum()
    }
}

/// A cursor over a map that may change under it: it holds a copy of the entry it is at and
/// finds the next one from there.
struct MemoryCursor<'a> {
    engine: &'a MemoryEngine,
    upper: Option<Vec<u8>>,
    at: Option<(Vec<u8>, Vec<u8>)>,
}

impl MemoryCursor<'_> {
    fn find(&mut self, lower: Bound<&[u8]>) {
        let data = self.engine.read();
        let upper = self.upper.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        self.at = if super::empty_range(lower, upper) {
            None
        } else {
            data.entries
                .range::<[u8], _>((lower, upper))
                .next()
                .map(|(k, v)| (k.clone(), v.clone()))
        };
    }
}

impl Cursor for MemoryCursor<'_> {
    fn seek(&mut self, key: &[u8]) {
        self.find(Bound::Included(key));
    }
    fn seek_to_first(&mut self) {
        self.find(Bound::Unbounded);
    }
    fn valid(&self) -> bool {
        self.at.is_some()
    }
    fn key(&self) -> Option<&[u8]> {
        self.at.as_ref().map(|(k, _)| k.as_slice())
    }
    fn value(&self) -> Option<&[u8]> {
        self.at.as_ref().map(|(_, v)| v.as_slice())
    }
    fn next(&mut self) {
        if let Some((key, _)) = self.at.take() {
            self.find(Bound::Excluded(&key));
        }
    }
    fn status(&self) -> Result<(), StateError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::engine::{as_slices, Marker};
    use super::*;

    #[test]
    fn a_database_keeps_its_data_across_a_reopen_and_has_one_opener_at_a_time() {
        let storage = MemoryStorage::new();
        let path = Path::new("/t/0/counts");
        let db = storage.open(path).unwrap();
        assert!(storage.open(path).err().expect("open already").is_retryable());
        assert!(storage.wipe(path).unwrap_err().is_retryable());
        let marker = Marker {
            topic: "c".into(),
            topic_id: "id".into(),
            next_offset: 3,
        };
        let changes = vec![
            (b"a".to_vec(), Some(b"1".to_vec())),
            (b"b".to_vec(), Some(b"2".to_vec())),
        ];
        db.write_with_marker(&mut as_slices(&changes), &marker, false).unwrap();
        drop(db);
        assert!(!storage.is_open(path));
        let db = storage.open(path).unwrap();
        assert_eq!(db.read_marker().unwrap(), Some(marker));
        assert_eq!(db.dump().unwrap().len(), 2);
        let mut cursor = db.cursor(Some(b"b"));
        cursor.seek(b"");
        assert_eq!(cursor.key(), Some(&b"a"[..]));
        cursor.next();
        assert!(!cursor.valid(), "stops before its upper bound");
        drop(cursor);
        drop(db);
        storage.wipe(path).unwrap();
        assert!(storage.open(path).unwrap().is_empty());
        storage.failing(true);
        let db = storage.open(Path::new("/other")).unwrap();
        assert!(!db
            .write(&mut std::iter::empty(), None, true)
            .unwrap_err()
            .is_retryable());
    }
}
