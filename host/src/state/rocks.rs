//! The RocksDB engine: one database per (task, store), memory shared by every store of the
//! worker, and write layers that keep both RocksDB's write path and uncommitted state off
//! the disk until a commit vouches for them.
//!
//! Writes live in two layers above RocksDB: the *call* layer (the writes of the guest call
//! in progress, dropped if that call faults) and the *dirty* layer (the writes of every
//! successful call since the last commit). Reads and scans see the layers merged over
//! RocksDB; nothing reaches RocksDB before a commit, and then it goes in one write batch
//! together with the store's [`Marker`] — the changelog offset the data now contains. The
//! marker lives in its own column family, so "the data" and "what vouches for it" cannot
//! disagree after a crash: local state never runs ahead of its checkpoint.

use std::any::Any;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DBCompressionType, FlushOptions, Options, ReadOptions,
    WriteBatch, WriteBufferManager, WriteOptions, DB,
};
use serde::{Deserialize, Serialize};

use super::{lower_bound, Change, StateStore};

/// The column family of Sluice's own bookkeeping (the marker); user data is in `default`.
const META_CF: &str = "sluice-meta";
const MARKER_KEY: &[u8] = b"changelog";

/// Memory shared by every store of a worker: one block cache and one write-buffer budget,
/// so hundreds of stores do not multiply the worker's memory.
#[derive(Clone)]
pub struct SharedMemory {
    cache: Cache,
    write_buffers: WriteBufferManager,
}

impl SharedMemory {
    pub fn new(block_cache_bytes: usize, write_buffer_bytes: usize) -> SharedMemory {
        // Compactions are background work: RocksDB's threads for them (its process-wide
        // low-priority pool) yield the CPU to stream threads. Flushes keep their priority
        // (a first commit waits for one).
        static LOWERED: std::sync::Once = std::sync::Once::new();
        LOWERED.call_once(|| match rocksdb::Env::new() {
            Ok(mut env) => env.lower_thread_pool_cpu_priority(),
            Err(e) => tracing::warn!("lowering the priority of RocksDB's compactions: {e}"),
        });
        let cache = Cache::new_lru_cache(block_cache_bytes);
        // Memtable memory is charged to the block cache, so the two budgets add up to one.
        let write_buffers =
            WriteBufferManager::new_write_buffer_manager_with_cache(write_buffer_bytes, false, cache.clone());
        SharedMemory { cache, write_buffers }
    }
}

/// What a store's data contains: the changelog it came from and the next offset to read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Marker {
    /// The changelog topic's name.
    pub topic: String,
    /// The changelog topic's id (a re-created topic has a new one), empty if unknown.
    pub topic_id: String,
    /// Every changelog record before this offset is in the data; none after it.
    pub next_offset: i64,
}

/// Opens (creating if needed) the database of one store.
pub fn open(path: &Path, memory: &SharedMemory) -> Result<DB, String> {
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(&memory.cache);
    table.set_bloom_filter(10.0, false);
    let mut options = Options::default();
    options.create_if_missing(true);
    options.create_missing_column_families(true);
    // Data and marker are flushed together, so a crash with the WAL off (restoration)
    // cannot leave a marker that is newer than the data it describes.
    options.set_atomic_flush(true);
    options.set_block_based_table_factory(&table);
    options.set_write_buffer_manager(&memory.write_buffers);
    options.set_compression_type(DBCompressionType::Lz4);
    options.set_max_open_files(256);
    options.set_keep_log_file_num(2);
    let cfs = [
        ColumnFamilyDescriptor::new(rocksdb::DEFAULT_COLUMN_FAMILY_NAME, options.clone()),
        ColumnFamilyDescriptor::new(META_CF, options.clone()),
    ];
    DB::open_cf_descriptors(&options, path, cfs).map_err(|e| format!("opening RocksDB at {}: {e}", path.display()))
}

/// The store's marker; none for a new (or pre-marker) database.
pub fn read_marker(db: &DB) -> Result<Option<Marker>, String> {
    let cf = db.cf_handle(META_CF).expect("opened with the meta column family");
    match db
        .get_cf(cf, MARKER_KEY)
        .map_err(|e| format!("reading the store's marker: {e}"))?
    {
        None => Ok(None),
        Some(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("the store's marker is corrupt ({e})")),
    }
}

/// Whether the database holds any user data.
pub fn is_empty(db: &DB) -> bool {
    db.iterator(rocksdb::IteratorMode::Start).next().is_none()
}

/// Writes `changes` and the marker that vouches for them in one atomic batch. `wal: false`
/// is for replaying a changelog (the replay can be repeated; call [`flush`] to make it durable).
pub fn write_with_marker<'a>(
    db: &DB,
    changes: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    marker: &Marker,
    wal: bool,
) -> Result<(), String> {
    let marker = serde_json::to_vec(marker).expect("a marker serialises");
    write_with_meta(db, changes, MARKER_KEY, &marker, wal)
}

/// Writes `changes` and one bookkeeping entry (`key` in the meta column family) in one
/// atomic batch: what a store other than a task's (a global table) keeps its positions in.
pub fn write_with_meta<'a>(
    db: &DB,
    changes: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
    key: &[u8],
    value: &[u8],
    wal: bool,
) -> Result<(), String> {
    let mut batch = WriteBatch::default();
    for (k, v) in changes {
        match v {
            Some(v) => batch.put(k, v),
            None => batch.delete(k),
        }
    }
    let cf = db.cf_handle(META_CF).expect("opened with the meta column family");
    batch.put_cf(cf, key, value);
    let mut options = WriteOptions::default();
    options.disable_wal(!wal);
    db.write_opt(batch, &options).map_err(|e| format!("writing state: {e}"))
}

/// A bookkeeping entry written with [`write_with_meta`]; none if never written.
pub fn read_meta(db: &DB, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let cf = db.cf_handle(META_CF).expect("opened with the meta column family");
    db.get_cf(cf, key)
        .map_err(|e| format!("reading the store's bookkeeping: {e}"))
}

/// Bytes a database takes on disk and in its memtables (RocksDB's own estimate).
pub fn size_of(db: &DB) -> u64 {
    ["rocksdb.total-sst-files-size", "rocksdb.cur-size-all-mem-tables"]
        .iter()
        .map(|p| db.property_int_value(*p).ok().flatten().unwrap_or(0))
        .sum()
}

/// Flushes data and marker together (after writes without the WAL), and waits until it is
/// done (with nothing to flush, at once).
pub fn flush(db: &DB) -> Result<(), String> {
    flush_with(db, true)
}

/// Starts flushing data and marker together without waiting for it: the memtables written
/// so far are sealed and written out by RocksDB's background threads. Until that is done,
/// they are not durable; [`flush`] waits for it (see [`RocksStore::commit`]).
pub fn flush_in_background(db: &DB) -> Result<(), String> {
    flush_with(db, false)
}

fn flush_with(db: &DB, wait: bool) -> Result<(), String> {
    let default = db
        .cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
        .expect("the default column family");
    let meta = db.cf_handle(META_CF).expect("opened with the meta column family");
    let mut options = FlushOptions::default();
    options.set_wait(wait);
    db.flush_cfs_opt(&[&default, &meta], &options)
        .map_err(|e| format!("flushing state: {e}"))
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

/// Written but not in RocksDB: a value, or none for a delete.
type Layer = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// A task's store: RocksDB plus the writes since the last commit.
pub struct RocksStore {
    name: String,
    db: Arc<DB>,
    /// The current call's writes; dropped if the call faults.
    call: Layer,
    /// Writes of successful calls since the last commit.
    dirty: Layer,
    /// Bytes held in `call` and `dirty` (keys, values and a per-entry overhead).
    call_bytes: usize,
    dirty_bytes: usize,
    /// Whether writes without the WAL (a restore's, a learner's) may still sit in memtables:
    /// see [`RocksStore::commit`].
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

impl RocksStore {
    pub fn new(name: &str, db: Arc<DB>) -> Self {
        RocksStore {
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

    pub fn db(&self) -> &Arc<DB> {
        &self.db
    }

    /// Bytes the store takes on disk and in its memtables (RocksDB's own estimate).
    pub fn disk_bytes(&self) -> u64 {
        size_of(&self.db)
    }

    /// Whether successful calls wrote anything since the last commit.
    pub fn has_changes(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// The writes since the last commit, in key order (for the changelog).
    pub fn changes(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.dirty.iter().map(|(k, v)| (k.as_slice(), v.as_deref()))
    }

    /// Moves the writes since the last commit into RocksDB with the marker that now vouches
    /// for them (one batch, WAL on).
    ///
    /// The store may have been restored, or handed over by a learner, with the WAL off and
    /// only a background flush started ([`flush_in_background`]), so that the task did not
    /// wait for it. A write with the WAL on top of unflushed unlogged writes would survive a
    /// crash that they do not (the marker would vouch for data that is gone): the first
    /// commit waits for that flush before it writes (by then it is done, or nearly).
    pub fn commit(&mut self, marker: &Marker) -> Result<(), String> {
        if self.unlogged {
            flush(&self.db).map_err(|e| format!("store {}: {e}", self.name))?;
            self.unlogged = false;
        }
        write_with_marker(&self.db, self.changes(), marker, true).map_err(|e| format!("store {}: {e}", self.name))?;
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

impl StateStore for RocksStore {
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
    ) -> Result<Vec<super::Entry>, String> {
        // Nothing is written to RocksDB here: the layers are merged over an iterator, and an
        // entry is copied only once it fits the page (its size is known before).
        let lower = lower_bound(start, after);
        let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
        if super::empty_range(lower, upper) {
            return Ok(Vec::new()); // bounds a guest handed that hold nothing
        }
        let mut call = self.call.range::<[u8], _>((lower, upper)).peekable();
        let mut dirty = self.dirty.range::<[u8], _>((lower, upper)).peekable();
        let mut options = ReadOptions::default();
        if let Some(end) = end {
            options.set_iterate_upper_bound(end.to_vec());
        }
        let mut it = self.db.raw_iterator_opt(options);
        match lower {
            Bound::Included(k) | Bound::Excluded(k) => it.seek(k),
            Bound::Unbounded => it.seek_to_first(),
        }
        let mut out: Vec<super::Entry> = Vec::new();
        let mut bytes = 0usize;
        while out.len() < max {
            // Skip the excluded lower bound.
            while it.valid() && after.is_some() && it.key() == after {
                it.next();
            }
            let rocks_key = if it.valid() { it.key() } else { None };
            // The smallest key of the three layers; on equal keys the newer layer wins.
            let key: Vec<u8> = match [
                call.peek().map(|(k, _)| k.as_slice()),
                dirty.peek().map(|(k, _)| k.as_slice()),
                rocks_key,
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
            let from_rocks = rocks_key.is_some_and(|k| k == key.as_slice());
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
            if from_rocks {
                it.next();
            }
        }
        it.status().map_err(|e| e.to_string())?;
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

    fn as_any(&mut self) -> &mut dyn Any {
        self
    }
}

/// Marks a change list as borrowed slices (for [`write_with_marker`]).
pub fn as_slices(changes: &[Change]) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
    changes.iter().map(|(k, v)| (k.as_slice(), v.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_db() -> (std::path::PathBuf, Arc<DB>) {
        let dir = std::env::temp_dir().join(format!("sluice-rocks-{}", uuid::Uuid::new_v4().simple()));
        let memory = SharedMemory::new(8 << 20, 8 << 20);
        (dir.clone(), Arc::new(open(&dir, &memory).unwrap()))
    }

    fn marker(next_offset: i64) -> Marker {
        Marker {
            topic: "t".into(),
            topic_id: "id".into(),
            next_offset,
        }
    }

    fn keys(page: &[super::super::Entry]) -> Vec<&[u8]> {
        page.iter().map(|(k, _)| k.as_slice()).collect()
    }

    #[test]
    fn a_scan_with_bounds_that_hold_nothing_is_empty_not_a_panic() {
        let (dir, db) = temp_db();
        let mut store = RocksStore::new("s", db.clone());
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
        drop(store);
        drop(db);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn writes_reach_rocksdb_only_at_commit_and_scans_merge_the_layers() {
        let (dir, db) = temp_db();
        let mut store = RocksStore::new("s", db.clone());
        store.put(b"a".to_vec(), b"1".to_vec()).unwrap();
        store.put(b"b".to_vec(), b"2".to_vec()).unwrap();
        store.end_call(true);
        store.put(b"c".to_vec(), b"3".to_vec()).unwrap();
        assert_eq!(store.get(b"a").unwrap(), Some(b"1".to_vec()));
        // A scan in the middle of a call sees every layer and writes nothing to RocksDB.
        let page = store.scan(None, None, None, 10, usize::MAX).unwrap();
        assert_eq!(keys(&page), [b"a", b"b", b"c"]);
        assert!(is_empty(&db), "a scan must not move uncommitted writes into RocksDB");
        store.end_call(true);
        store.commit(&marker(7)).unwrap();
        assert_eq!(read_marker(&db).unwrap(), Some(marker(7)));
        assert_eq!(dump(&db).unwrap().len(), 3);

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
        drop(store);
        drop(db);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_page_stops_at_its_byte_budget_across_the_layers_and_resumes_after_it() {
        let (dir, db) = temp_db();
        let mut store = RocksStore::new("s", db.clone());
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
        drop(store);
        drop(db);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_faulted_call_leaves_no_trace_and_discard_drops_everything_uncommitted() {
        let (dir, db) = temp_db();
        let mut store = RocksStore::new("s", db.clone());
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
        assert!(read_marker(&db).unwrap().is_none());
        drop(store);
        drop(db);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_marker_survives_a_reopen_with_its_data() {
        let (dir, db) = temp_db();
        let changes = vec![(b"k".to_vec(), Some(b"v".to_vec())), (b"gone".to_vec(), None)];
        write_with_marker(&db, as_slices(&changes), &marker(42), false).unwrap();
        flush(&db).unwrap();
        drop(db);
        let memory = SharedMemory::new(8 << 20, 8 << 20);
        let db = open(&dir, &memory).unwrap();
        assert_eq!(read_marker(&db).unwrap(), Some(marker(42)));
        assert_eq!(dump(&db).unwrap(), vec![(b"k".to_vec(), b"v".to_vec())]);
        drop(db);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A store restored (or handed over by a learner) with the WAL off, whose first commit
    /// writes with the WAL on, and a process that dies right after (SIGABRT: nothing is
    /// closed or flushed on the way out). The commit must have made the unlogged writes
    /// durable first: otherwise the WAL brings back the commit's marker without the state
    /// it vouches for.
    #[test]
    fn a_crash_after_the_first_commit_keeps_what_was_restored_without_the_wal() {
        const CHILD: &str = "SLUICE_TEST_CRASHING_STORE";
        if let Ok(dir) = std::env::var(CHILD) {
            // The child: restore, commit once, die.
            let memory = SharedMemory::new(8 << 20, 8 << 20);
            let db = Arc::new(open(std::path::Path::new(&dir), &memory).unwrap());
            let restored = vec![(b"restored".to_vec(), Some(b"r".to_vec()))];
            write_with_marker(&db, as_slices(&restored), &marker(10), false).unwrap();
            let mut store = RocksStore::new("s", db.clone());
            store.put(b"processed".to_vec(), b"p".to_vec()).unwrap();
            store.end_call(true);
            store.commit(&marker(11)).unwrap();
            std::process::abort();
        }
        let dir = std::env::temp_dir().join(format!("sluice-rocks-crash-{}", uuid::Uuid::new_v4().simple()));
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "state::rocks::tests::a_crash_after_the_first_commit_keeps_what_was_restored_without_the_wal",
                "--test-threads",
                "1",
            ])
            .env(CHILD, &dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(!status.success(), "the child was to die");
        let memory = SharedMemory::new(8 << 20, 8 << 20);
        let db = open(&dir, &memory).unwrap();
        assert_eq!(read_marker(&db).unwrap(), Some(marker(11)), "the commit survived");
        assert_eq!(
            dump(&db).unwrap(),
            vec![
                (b"processed".to_vec(), b"p".to_vec()),
                (b"restored".to_vec(), b"r".to_vec())
            ],
            "the marker of the commit vouches for the restored state too"
        );
        drop(db);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
