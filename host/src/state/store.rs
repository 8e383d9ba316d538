//! A task's store: its database with write layers that keep uncommitted state off the disk
//! until a commit vouches for it.
//!
//! Writes live in two layers above the database: the *call* layer (the writes of the guest
//! call in progress, dropped if that call faults) and the *dirty* layer (the writes of every
//! successful call since the last commit). Reads and scans see the layers merged over the
//! database; nothing reaches it before a commit, and then it goes in one write batch
//! together with the store's [`Marker`] — the changelog offset the data now contains.

use std::collections::BTreeMap;
use std::ops::Bound;

use super::engine::{Db, Marker, StateError};
use super::{empty_range, lower_bound, Charge, Entry, StateStore};

/// Written but not in the database: a value, or none for a delete.
type Layer = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// A task's store: its database plus the writes since the last commit.
pub struct TaskStore {
    name: String,
    db: Db,
    /// The current call's writes; dropped if the call faults.
    call: Layer,
    /// Writes of successful calls since the last commit.
    dirty: Layer,
    /// Bytes held in `call` and `dirty` (keys, values and a per-entry overhead).
    call_bytes: usize,
    dirty_bytes: usize,
    /// Whether writes without the WAL (a restore's, a learner's) may still sit in memtables:
    /// see [`TaskStore::commit`].
    unlogged: bool,
}

/// Roughly what one layer entry costs beyond its key and value (map node, vectors).
const ENTRY_OVERHEAD: usize = 64;

fn entry_bytes(key: &[u8], value: &Option<Vec<u8>>) -> usize {
    key.len() + value.as_ref().map_or(0, Vec::len) + ENTRY_OVERHEAD
}

/// Inserts into a layer, keeping its byte count.
fn insert(layer: &mut Layer, bytes: &mut usize, key: Vec<u8>, value: Option<Vec<u8>>) {
    let size = entry_bytes(&key, &value);
    if let Some(old) = layer.get(&key) {
        *bytes -= entry_bytes(&key, old);
    }
    *bytes += size;
    layer.insert(key, value);
}

impl TaskStore {
    pub fn new(name: &str, db: Db) -> Self {
        TaskStore {
            name: name.to_string(),
            db,
            call: Layer::new(),
            dirty: Layer::new(),
            call_bytes: 0,
            dirty_bytes: 0,
            unlogged: true,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Bytes the store's database takes (the engine's own estimate).
    pub fn disk_bytes(&self) -> u64 {
        self.db.size()
    }

    /// Whether successful calls wrote anything since the last commit.
    pub fn has_changes(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// The writes since the last commit, in key order (for the changelog).
    pub fn changes(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.dirty.iter().map(|(k, v)| (k.as_slice(), v.as_deref()))
    }

    /// Moves the writes since the last commit into the database with the marker that now vouches
    /// for them (one batch, WAL on).
    ///
    /// The store may have been restored, or handed over by a learner, with the WAL off and
    /// only a background flush started (`Engine::flush(false)`), so that the task did not
    /// wait for it. A write with the WAL on top of unflushed unlogged writes would survive a
    /// crash that they do not (the marker would vouch for data that is gone): the first
    /// commit waits for that flush before it writes (by then it is done, or nearly).
    pub fn commit(&mut self, marker: &Marker) -> Result<(), StateError> {
        if self.unlogged {
            self.db
                .flush(true)
                .map_err(|e| e.context(format!("store {}", self.name)))?;
            self.unlogged = false;
        }
        self.db
            .write_with_marker(&mut self.changes(), marker, true)
            .map_err(|e| e.context(format!("store {}", self.name)))?;
        self.dirty.clear();
        self.dirty_bytes = 0;
        Ok(())
    }

    /// Drops every write since the last commit (the task stops without committing).
    pub fn discard(&mut self) {
        self.call.clear();
        self.dirty.clear();
        self.call_bytes = 0;
        self.dirty_bytes = 0;
    }

    fn layered(&self, key: &[u8]) -> Option<&Option<Vec<u8>>> {
        self.call.get(key).or_else(|| self.dirty.get(key))
    }
}

impl StateStore for TaskStore {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        if let Some(v) = self.layered(key) {
            return Ok(v.clone());
        }
        self.db
            .get(key)
            .map_err(|e| format!("reading store {}: {e}", self.name))
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<(), String> {
        insert(&mut self.call, &mut self.call_bytes, key, Some(value));
        Ok(())
    }

    fn delete(&mut self, key: Vec<u8>) -> Result<(), String> {
        insert(&mut self.call, &mut self.call_bytes, key, None);
        Ok(())
    }

    fn held_bytes(&self) -> usize {
        self.call_bytes + self.dirty_bytes
    }

    fn scan(
        &mut self,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        after: Option<&[u8]>,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Entry>, String> {
        // Nothing is written to the database here: the layers are merged over a cursor, and an
        // entry is copied only once it fits the page (its size is known before).
        let lower = lower_bound(start, after);
        let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
        if empty_range(lower, upper) {
            return Ok(Vec::new()); // bounds a guest handed that hold nothing
        }
        let mut call = self.call.range::<[u8], _>((lower, upper)).peekable();
        let mut dirty = self.dirty.range::<[u8], _>((lower, upper)).peekable();
        let mut it = self.db.cursor(end);
        match lower {
            Bound::Included(k) | Bound::Excluded(k) => it.seek(k),
            Bound::Unbounded => it.seek_to_first(),
        }
        let mut out: Vec<Entry> = Vec::new();
        let mut bytes = 0usize;
        while out.len() < max {
            // Skip the excluded lower bound.
            while it.valid() && after.is_some() && it.key() == after {
                it.next();
            }
            let stored_key = if it.valid() { it.key() } else { None };
            // The smallest key of the three layers; on equal keys the newer layer wins.
            let key: Vec<u8> = match [
                call.peek().map(|(k, _)| k.as_slice()),
                dirty.peek().map(|(k, _)| k.as_slice()),
                stored_key,
            ]
            .into_iter()
            .flatten()
            .min()
            {
                Some(k) => k.to_vec(),
                None => break,
            };
            let from_call = call.peek().is_some_and(|(k, _)| **k == key);
            let from_dirty = dirty.peek().is_some_and(|(k, _)| **k == key);
            let from_stored = stored_key.is_some_and(|k| k == key.as_slice());
            let value: Option<&[u8]> = if from_call {
                call.peek().and_then(|(_, v)| v.as_deref())
            } else if from_dirty {
                dirty.peek().and_then(|(_, v)| v.as_deref())
            } else {
                it.value()
            };
            if let Some(value) = value {
                bytes = bytes.saturating_add(key.len() + value.len());
                if !out.is_empty() && bytes > max_bytes {
                    break;
                }
                out.push((key.clone(), value.to_vec()));
            }
            if from_call {
                call.next();
            }
            if from_dirty {
                dirty.next();
            }
            if from_stored {
                it.next();
            }
        }
        it.status()?;
        Ok(out)
    }

    fn end_call(&mut self, keep: bool) {
        if keep {
            // Insert one by one: `BTreeMap::append` rebuilds the whole dirty layer, which on
            // every call would cost the size of everything written since the last commit.
            for (key, value) in std::mem::take(&mut self.call) {
                insert(&mut self.dirty, &mut self.dirty_bytes, key, value);
            }
        } else {
            self.call.clear();
        }
        self.call_bytes = 0;
    }

    fn logged(&mut self) -> Option<&mut TaskStore> {
        Some(self)
    }

    fn charge(&self) -> Charge {
        Charge::Own(self.disk_bytes() + self.held_bytes() as u64)
    }

    fn into_db(self: Box<Self>) -> Option<Db> {
        Some(self.db)
    }
}

#[cfg(test)]
mod tests {
    use super::super::engine::Storage;
    use super::super::memory::MemoryStorage;
    use super::super::rocks::{RocksStorage, SharedMemory};
    use super::*;

    /// An empty database of each engine (with the RocksDB one's directory, removed on drop).
    fn engines() -> Vec<(Db, TempDir)> {
        let dir = TempDir(std::env::temp_dir().join(format!("sluice-store-{}", uuid::Uuid::new_v4().simple())));
        let rocks = RocksStorage::new(SharedMemory::new(8 << 20, 8 << 20))
            .open(&dir.0)
            .unwrap();
        let memory = MemoryStorage::new().open(std::path::Path::new("/s")).unwrap();
        vec![(memory, TempDir(std::path::PathBuf::new())), (rocks, dir)]
    }

    struct TempDir(std::path::PathBuf);

    impl Drop for TempDir {
        fn drop(&mut self) {
            if !self.0.as_os_str().is_empty() {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn marker(next_offset: i64) -> Marker {
        Marker {
            topic: "t".into(),
            topic_id: "id".into(),
            next_offset,
        }
    }

    fn keys(page: &[Entry]) -> Vec<&[u8]> {
        page.iter().map(|(k, _)| k.as_slice()).collect()
    }

    #[test]
    fn a_scan_with_bounds_that_hold_nothing_is_empty_not_a_panic() {
        for (db, _dir) in engines() {
            let mut store = TaskStore::new("s", db.clone());
            store.put(b"a".to_vec(), b"1".to_vec()).unwrap();
            store.end_call(true);
            store.put(b"b".to_vec(), b"2".to_vec()).unwrap();
            // Both layers hold keys, as when a join's guest scanned [from, to) with from > to.
            for (start, end, after) in [
                (Some(&b"c"[..]), Some(&b"a"[..]), None),
                (Some(b"b"), Some(b"b"), None),
                (None, Some(b"b"), Some(&b"b"[..])),
            ] {
                assert!(store.scan(start, end, after, 10, usize::MAX).unwrap().is_empty());
            }
        }
    }

    #[test]
    fn writes_reach_rocksdb_only_at_commit_and_scans_merge_the_layers() {
        for (db, _dir) in engines() {
            let mut store = TaskStore::new("s", db.clone());
            store.put(b"a".to_vec(), b"1".to_vec()).unwrap();
            store.put(b"b".to_vec(), b"2".to_vec()).unwrap();
            store.end_call(true);
            store.put(b"c".to_vec(), b"3".to_vec()).unwrap();
            assert_eq!(store.get(b"a").unwrap(), Some(b"1".to_vec()));
            // A scan in the middle of a call sees every layer and writes nothing to RocksDB.
            let page = store.scan(None, None, None, 10, usize::MAX).unwrap();
            assert_eq!(keys(&page), [b"a", b"b", b"c"]);
            assert!(db.is_empty(), "a scan must not move uncommitted writes into RocksDB");
            store.end_call(true);
            store.commit(&marker(7)).unwrap();
            assert_eq!(db.read_marker().unwrap(), Some(marker(7)));
            assert_eq!(db.dump().unwrap().len(), 3);

            // Deletes in a layer hide RocksDB entries; newer layers win; bounds and `after` hold.
            store.delete(b"b".to_vec()).unwrap();
            store.end_call(true);
            store.put(b"a".to_vec(), b"new".to_vec()).unwrap();
            store.put(b"d".to_vec(), b"4".to_vec()).unwrap();
            let page = store.scan(None, None, None, 10, usize::MAX).unwrap();
            assert_eq!(
                page,
                vec![
                    (b"a".to_vec(), b"new".to_vec()),
                    (b"c".to_vec(), b"3".to_vec()),
                    (b"d".to_vec(), b"4".to_vec())
                ]
            );
            assert_eq!(
                keys(&store.scan(Some(b"a"), Some(b"d"), Some(b"a"), 10, usize::MAX).unwrap()),
                [b"c"]
            );
            assert_eq!(
                keys(&store.scan(None, None, None, 2, usize::MAX).unwrap()),
                [b"a", b"c"]
            );
            assert_eq!(
                keys(&store.scan(None, None, Some(b"c"), 2, usize::MAX).unwrap()),
                [b"d"]
            );
        }
    }

    #[test]
    fn a_page_stops_at_its_byte_budget_across_the_layers_and_resumes_after_it() {
        for (db, _dir) in engines() {
            let mut store = TaskStore::new("s", db.clone());
            // Ten values of 1,000 bytes: five committed, three written since, two in this call.
            for i in 0..10u8 {
                store.put(vec![b'k', i], vec![i; 1000]).unwrap();
                if i == 4 {
                    store.end_call(true);
                    store.commit(&marker(1)).unwrap();
                }
                if i == 7 {
                    store.end_call(true);
                }
            }
            // 2,500 bytes: two entries, not the third that would pass the budget.
            let page = store.scan(None, None, None, 100, 2_500).unwrap();
            assert_eq!(page.len(), 2);
            let mut seen = page.len();
            let mut last = page.last().unwrap().0.clone();
            loop {
                let page = store.scan(None, None, Some(&last), 100, 2_500).unwrap();
                if page.is_empty() {
                    break;
                }
                assert!(page.len() <= 2, "a page of {} entries", page.len());
                seen += page.len();
                last = page.last().unwrap().0.clone();
            }
            assert_eq!(seen, 10, "every entry once, page after page");
            // One entry larger than the budget is still a page of one.
            assert_eq!(store.scan(None, None, None, 100, 10).unwrap().len(), 1);
        }
    }

    #[test]
    fn a_faulted_call_leaves_no_trace_and_discard_drops_everything_uncommitted() {
        for (db, _dir) in engines() {
            let mut store = TaskStore::new("s", db.clone());
            store.put(b"kept".to_vec(), b"1".to_vec()).unwrap();
            store.end_call(true);
            store.put(b"faulted".to_vec(), b"1".to_vec()).unwrap();
            store.delete(b"kept".to_vec()).unwrap();
            store.end_call(false);
            assert_eq!(store.get(b"faulted").unwrap(), None);
            assert_eq!(store.get(b"kept").unwrap(), Some(b"1".to_vec()));
            assert_eq!(
                store.changes().collect::<Vec<_>>(),
                vec![(b"kept".as_slice(), Some(b"1".as_slice()))]
            );
            store.discard();
            assert!(!store.has_changes());
            assert_eq!(store.get(b"kept").unwrap(), None);
            assert!(db.read_marker().unwrap().is_none());
        }
    }
}
