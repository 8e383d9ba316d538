//! The RocksDB engine: one database per (task, store), memory shared by every store of the
//! worker, and a write cache that keeps RocksDB's write path off the per-record path.

use std::any::Any;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use rocksdb::{BlockBasedOptions, Cache, DBCompressionType, Options, ReadOptions, WriteBatch, WriteBufferManager, DB};

use super::{lower_bound, StateStore};

/// Memory shared by every store of a worker: one block cache and one write-buffer budget,
/// so hundreds of stores do not multiply the worker's memory.
#[derive(Clone)]
pub struct SharedMemory {
    cache: Cache,
    write_buffers: WriteBufferManager,
}

impl SharedMemory {
    pub fn new(block_cache_bytes: usize, write_buffer_bytes: usize) -> SharedMemory {
        let cache = Cache::new_lru_cache(block_cache_bytes);
        // Memtable memory is charged to the block cache, so the two budgets add up to one.
        let write_buffers =
            WriteBufferManager::new_write_buffer_manager_with_cache(write_buffer_bytes, false, cache.clone());
        SharedMemory { cache, write_buffers }
    }
}

/// Opens (creating if needed) the database of one store.
pub fn open(path: &Path, memory: &SharedMemory) -> Result<DB, String> {
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(&memory.cache);
    table.set_bloom_filter(10.0, false);
    let mut options = Options::default();
    options.create_if_missing(true);
    options.set_block_based_table_factory(&table);
    options.set_write_buffer_manager(&memory.write_buffers);
    options.set_compression_type(DBCompressionType::Lz4);
    options.set_max_open_files(256);
    options.set_keep_log_file_num(2);
    DB::open(&options, path).map_err(|e| format!("opening RocksDB at {}: {e}", path.display()))
}

/// Every entry of a database, in key order (for tests and diagnostics).
pub fn dump(db: &DB) -> Result<Vec<super::Entry>, String> {
    let mut out = Vec::new();
    for entry in db.iterator(rocksdb::IteratorMode::Start) {
        let (k, v) = entry.map_err(|e| e.to_string())?;
        out.push((k.to_vec(), v.to_vec()));
    }
    Ok(out)
}

/// A task's store: RocksDB plus the writes since the last commit.
pub struct RocksStore {
    name: String,
    db: Arc<DB>,
    /// Written by the guest, not yet in RocksDB (none: deleted).
    dirty: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// In RocksDB (a scan flushed them early), not yet in the changelog.
    unlogged: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl RocksStore {
    pub fn new(name: &str, db: Arc<DB>) -> Self {
        RocksStore {
            name: name.to_string(),
            db,
            dirty: BTreeMap::new(),
            unlogged: BTreeMap::new(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn db(&self) -> &Arc<DB> {
        &self.db
    }

    /// Whether anything was written since the last commit.
    pub fn has_changes(&self) -> bool {
        !self.dirty.is_empty() || !self.unlogged.is_empty()
    }

    /// Writes the cached writes to RocksDB (one batch) and returns every change since the
    /// last commit, for the changelog.
    pub fn take_changes(&mut self) -> Result<Vec<super::Change>, String> {
        self.write_dirty()?;
        Ok(std::mem::take(&mut self.unlogged).into_iter().collect())
    }

    fn write_dirty(&mut self) -> Result<(), String> {
        if self.dirty.is_empty() {
            return Ok(());
        }
        let mut batch = WriteBatch::default();
        for (k, v) in &self.dirty {
            match v {
                Some(v) => batch.put(k, v),
                None => batch.delete(k),
            }
        }
        self.db
            .write(batch)
            .map_err(|e| format!("writing store {}: {e}", self.name))?;
        let dirty = std::mem::take(&mut self.dirty);
        self.unlogged.extend(dirty);
        Ok(())
    }
}

impl StateStore for RocksStore {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        if let Some(v) = self.dirty.get(key) {
            return Ok(v.clone());
        }
        self.db
            .get(key)
            .map_err(|e| format!("reading store {}: {e}", self.name))
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<(), String> {
        self.dirty.insert(key, Some(value));
        Ok(())
    }

    fn delete(&mut self, key: Vec<u8>) -> Result<(), String> {
        self.dirty.insert(key, None);
        Ok(())
    }

    fn scan(
        &mut self,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        after: Option<&[u8]>,
        max: usize,
    ) -> Result<Vec<super::Entry>, String> {
        // A scan sees the cached writes: they go to RocksDB now (the changelog still gets
        // them at the next commit).
        self.write_dirty()?;
        let mut options = ReadOptions::default();
        if let Some(end) = end {
            options.set_iterate_upper_bound(end.to_vec());
        }
        let mut it = self.db.raw_iterator_opt(options);
        match lower_bound(start, after) {
            std::ops::Bound::Included(k) | std::ops::Bound::Excluded(k) => it.seek(k),
            std::ops::Bound::Unbounded => it.seek_to_first(),
        }
        let mut out = Vec::new();
        while it.valid() && out.len() < max {
            let (k, v) = (it.key().unwrap_or_default(), it.value().unwrap_or_default());
            if after != Some(k) {
                out.push((k.to_vec(), v.to_vec()));
            }
            it.next();
        }
        it.status().map_err(|e| format!("scanning store {}: {e}", self.name))?;
        Ok(out)
    }

    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_writes_are_read_back_scanned_and_handed_to_the_changelog_once() {
        let dir = std::env::temp_dir().join(format!("sluice-rocks-{}", uuid::Uuid::new_v4().simple()));
        let memory = SharedMemory::new(8 << 20, 8 << 20);
        let db = Arc::new(open(&dir, &memory).unwrap());
        let mut store = RocksStore::new("s", db.clone());
        store.put(b"a".to_vec(), b"1".to_vec()).unwrap();
        store.put(b"b".to_vec(), b"2".to_vec()).unwrap();
        assert_eq!(store.get(b"a").unwrap(), Some(b"1".to_vec()));
        assert_eq!(
            db.get(b"a").unwrap(),
            None,
            "writes stay in the cache until a commit or scan"
        );
        let page = store.scan(None, None, None, 10).unwrap();
        assert_eq!(page.len(), 2);
        store.delete(b"a".to_vec()).unwrap();
        store.put(b"c".to_vec(), b"3".to_vec()).unwrap();
        let changes = store.take_changes().unwrap();
        assert_eq!(
            changes,
            vec![
                (b"a".to_vec(), None),
                (b"b".to_vec(), Some(b"2".to_vec())),
                (b"c".to_vec(), Some(b"3".to_vec()))
            ]
        );
        assert!(!store.has_changes());
        assert_eq!(
            dump(&db).unwrap(),
            vec![(b"b".to_vec(), b"2".to_vec()), (b"c".to_vec(), b"3".to_vec())]
        );
        let page = store.scan(Some(b"b"), Some(b"c"), None, 10).unwrap();
        assert_eq!(page, vec![(b"b".to_vec(), b"2".to_vec())]);
        drop(store);
        drop(db);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
