//! The RocksDB engine: one database per (task, store), memory shared by every store of the
//! worker. Bookkeeping (a store's marker, a global table's positions) lives in a column
//! family of its own, flushed atomically with the data: after a crash with the WAL off (a
//! restoration), the marker is never newer than the data it describes.

use std::path::Path;
use std::sync::Arc;

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DBCompressionType, DBRawIterator, FlushOptions, Options,
    ReadOptions, WriteBatch, WriteBufferManager, WriteOptions, DB,
};

use super::engine::{Cursor, Db, Engine, StateError, Storage, Writes};

/// The column family of Sluice's own bookkeeping (the marker); user data is in `default`.
const META_CF: &str = "sluice-meta";

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

/// Where a worker's RocksDB databases are opened, sharing its memory.
#[derive(Clone)]
pub struct RocksStorage {
    memory: SharedMemory,
}

impl RocksStorage {
    pub fn new(memory: SharedMemory) -> RocksStorage {
        RocksStorage { memory }
    }
}

impl Storage for RocksStorage {
    fn open(&self, path: &Path) -> Result<Db, StateError> {
        Ok(Arc::new(RocksEngine::open(path, &self.memory)?))
    }

    fn wipe(&self, path: &Path) -> Result<(), StateError> {
        match std::fs::remove_dir_all(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(StateError::fatal(format!("removing {}: {e}", path.display())))
            }
            _ => Ok(()),
        }
    }
}

/// One RocksDB database.
pub struct RocksEngine {
    db: DB,
}

impl RocksEngine {
    /// Opens (creating if needed) the database of one store.
    pub fn open(path: &Path, memory: &SharedMemory) -> Result<RocksEngine, StateError> {
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
        DB::open_cf_descriptors(&options, path, cfs)
            .map(|db| RocksEngine { db })
            .map_err(|e| {
                let message = format!("opening RocksDB at {}: {e}", path.display());
                // Another opener holds its lock (a task letting go of it): that passes.
                if e.to_string().contains("lock") {
                    StateError::retryable(message)
                } else {
                    StateError::fatal(message)
                }
            })
    }

    fn meta(&self) -> &rocksdb::ColumnFamily {
        self.db.cf_handle(META_CF).expect("opened with the meta column family")
    }
}

fn failed(what: &str) -> impl Fn(rocksdb::Error) -> StateError + '_ {
    move |e| StateError::fatal(format!("{what}: {e}"))
}

impl Engine for RocksEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.db.get(key).map_err(failed("reading"))
    }

    fn cursor(&self, upper: Option<&[u8]>) -> Box<dyn Cursor + '_> {
        let mut options = ReadOptions::default();
        if let Some(end) = upper {
            options.set_iterate_upper_bound(end.to_vec());
        }
        Box::new(RocksCursor(self.db.raw_iterator_opt(options)))
    }

    fn write<'a>(&self, changes: Writes<'_, 'a>, meta: Option<(&[u8], &[u8])>, wal: bool) -> Result<(), StateError> {
        let mut batch = WriteBatch::default();
        for (k, v) in changes {
            match v {
                Some(v) => batch.put(k, v),
                None => batch.delete(k),
            }
        }
        if let Some((key, value)) = meta {
            batch.put_cf(self.meta(), key, value);
        }
        let mut options = WriteOptions::default();
        options.disable_wal(!wal);
        self.db.write_opt(batch, &options).map_err(failed("writing state"))
    }

    fn read_meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError> {
        self.db
            .get_cf(self.meta(), key)
            .map_err(failed("reading the store's bookkeeping"))
    }

    fn flush(&self, wait: bool) -> Result<(), StateError> {
        let default = self
            .db
            .cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME)
            .expect("the default column family");
        let meta = self.meta();
        let mut options = FlushOptions::default();
        options.set_wait(wait);
        self.db
            .flush_cfs_opt(&[&default, &meta], &options)
            .map_err(failed("flushing state"))
    }

    fn size(&self) -> u64 {
        ["rocksdb.total-sst-files-size", "rocksdb.cur-size-all-mem-tables"]
            .iter()
            .map(|p| self.db.property_int_value(*p).ok().flatten().unwrap_or(0))
            .sum()
    }
}

struct RocksCursor<'a>(DBRawIterator<'a>);

impl Cursor for RocksCursor<'_> {
    fn seek(&mut self, key: &[u8]) {
        self.0.seek(key)
    }
    fn seek_to_first(&mut self) {
        self.0.seek_to_first()
    }
    fn valid(&self) -> bool {
        self.0.valid()
    }
    fn key(&self) -> Option<&[u8]> {
        self.0.key()
    }
    fn value(&self) -> Option<&[u8]> {
        self.0.value()
    }
    fn next(&mut self) {
        self.0.next()
    }
    fn status(&self) -> Result<(), StateError> {
        self.0.status().map_err(failed("reading state"))
    }
}

#[cfg(test)]
mod tests {
    use super::super::engine::{as_slices, Marker};
    use super::super::store::TaskStore;
    use super::super::StateStore;
    use super::*;

    fn marker(next_offset: i64) -> Marker {
        Marker {
            topic: "t".into(),
            topic_id: "id".into(),
            next_offset,
        }
    }

    fn open(dir: &Path) -> Db {
        RocksStorage::new(SharedMemory::new(8 << 20, 8 << 20))
            .open(dir)
            .unwrap()
    }

    #[test]
    fn the_marker_survives_a_reopen_with_its_data_and_a_second_opener_is_told_to_retry() {
        let dir = std::env::temp_dir().join(format!("sluice-rocks-{}", uuid::Uuid::new_v4().simple()));
        let db = open(&dir);
        let busy = RocksStorage::new(SharedMemory::new(8 << 20, 8 << 20))
            .open(&dir)
            .err()
            .expect("RocksDB lets one opener hold a store");
        assert!(busy.is_retryable(), "{busy}");
        let changes = vec![(b"k".to_vec(), Some(b"v".to_vec())), (b"gone".to_vec(), None)];
        db.write_with_marker(&mut as_slices(&changes), &marker(42), false)
            .unwrap();
        db.flush(true).unwrap();
        drop(db);
        let db = open(&dir);
        assert_eq!(db.read_marker().unwrap(), Some(marker(42)));
        assert_eq!(db.dump().unwrap(), vec![(b"k".to_vec(), b"v".to_vec())]);
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
            let db = open(Path::new(&dir));
            let restored = vec![(b"restored".to_vec(), Some(b"r".to_vec()))];
            db.write_with_marker(&mut as_slices(&restored), &marker(10), false)
                .unwrap();
            let mut store = TaskStore::new("s", db.clone());
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
        let db = open(&dir);
        assert_eq!(db.read_marker().unwrap(), Some(marker(11)), "the commit survived");
        assert_eq!(
            db.dump().unwrap(),
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
