//! State stores: the key-value interface guests see ([`StateStore`]), the storage engine
//! under it ([`engine::Engine`]: RocksDB, or maps in memory for tests), a task's store with
//! its uncommitted writes ([`store::TaskStore`]), changelog markers, checkpoints and
//! restoration, and global tables.
//!
//! Nothing outside this folder names RocksDB: the worker opens stores through a
//! [`engine::Storage`].

pub mod checkpoint;
pub mod dir;
pub mod engine;
pub mod global;
pub mod memory;
pub mod restore;
pub mod rocks;
pub mod store;
pub mod warm;

use std::collections::BTreeMap;
use std::ops::Bound;

/// A store's changelog topic and its id (empty when the cluster did not say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changelog {
    pub store: String,
    pub topic: String,
    pub topic_id: String,
}

/// A key and its value.
pub type Entry = (Vec<u8>, Vec<u8>);

/// A key and its new value; none deletes it (a changelog record, a tombstone when none).
pub type Change = (Vec<u8>, Option<Vec<u8>>);

/// One task's view of one store. Errors are storage failures (the task stops).
pub trait StateStore: Send + 'static {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, String>;
    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<(), String>;
    fn delete(&mut self, key: Vec<u8>) -> Result<(), String>;
    /// Up to `max` entries with `start <= key < end`, strictly after `after`, in key order,
    /// and no more than `max_bytes` of keys and values (but at least one entry): a store
    /// stops before it copies the entry that would pass the budget.
    fn scan(
        &mut self,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        after: Option<&[u8]>,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Entry>, String>;
    /// Ends a guest call: keep its writes (it succeeded) or drop them (it faulted), so a
    /// faulted call leaves no trace. Stores without layers write through and ignore this.
    fn end_call(&mut self, keep: bool) {
        let _ = keep;
    }
    /// Bytes of writes held in memory and not yet committed (charged to the guest's
    /// host-memory budget). Stores that write through hold none.
    fn held_bytes(&self) -> usize {
        0
    }
    /// The task's own store this is, which the task logs to its changelog and commits;
    /// none for a store the task only reads (a global table) or one of a test.
    fn logged(&mut self) -> Option<&mut store::TaskStore> {
        None
    }
    /// What the store adds to its topology's state quota.
    fn charge(&self) -> Charge {
        Charge::Nothing
    }
    /// The task's own database, open, for the next user of the store here (its writes
    /// since the last commit are dropped); none for a store the task does not own.
    fn into_db(self: Box<Self>) -> Option<engine::Db> {
        None
    }
}

/// What a store adds to its topology's state quota on a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    Nothing,
    /// Bytes of the task's own (its database and its uncommitted writes).
    Own(u64),
    /// Bytes of a table shared by every task that reads it (counted once per topology).
    Shared(u64),
}

/// The smallest key greater than every key that starts with `prefix` (none: no bound).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Whether no key lies between `lower` and `upper`. A guest may hand any bounds (`start`
/// after `end`, or `after` at or past `end`): such a scan is empty, where `BTreeMap::range`
/// would panic.
pub(crate) fn empty_range(lower: Bound<&[u8]>, upper: Bound<&[u8]>) -> bool {
    match (lower, upper) {
        (Bound::Included(a), Bound::Excluded(b)) | (Bound::Excluded(a), Bound::Excluded(b)) => a >= b,
        (Bound::Included(a), Bound::Included(b)) => a > b,
        (Bound::Excluded(a), Bound::Included(b)) => a >= b,
        _ => false,
    }
}

/// The lower bound of a page: after `after` if given, else from `start`.
pub(crate) fn lower_bound<'a>(start: Option<&'a [u8]>, after: Option<&'a [u8]>) -> Bound<&'a [u8]> {
    match (start, after) {
        (_, Some(after)) if start.is_none_or(|s| after >= s) => Bound::Excluded(after),
        (Some(start), _) => Bound::Included(start),
        (None, _) => Bound::Unbounded,
    }
}

/// A store in a `BTreeMap`, for tests and for guests run without a worker.
#[derive(Debug, Default)]
pub struct MemoryStore {
    pub entries: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Bytes of keys and values held (all of it is in memory, so all of it counts).
    bytes: usize,
}

impl StateStore for MemoryStore {
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
        Ok(self.entries.get(key).cloned())
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<(), String> {
        let (k, v) = (key.len(), value.len());
        if let Some(old) = self.entries.insert(key, value) {
            self.bytes -= k + old.len();
        }
        self.bytes += k + v;
        Ok(())
    }

    fn delete(&mut self, key: Vec<u8>) -> Result<(), String> {
        if let Some(old) = self.entries.remove(&key) {
            self.bytes -= key.len() + old.len();
        }
        Ok(())
    }

    fn held_bytes(&self) -> usize {
        self.bytes
    }

    fn scan(
        &mut self,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        after: Option<&[u8]>,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Entry>, String> {
        let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
        let lower = lower_bound(start, after);
        if empty_range(lower, upper) {
            return Ok(Vec::new());
        }
        let mut bytes = 0;
        let mut out = Vec::new();
        for (k, v) in self.entries.range::<[u8], _>((lower, upper)).take(max) {
            bytes += k.len() + v.len();
            if !out.is_empty() && bytes > max_bytes {
                break;
            }
            out.push((k.clone(), v.clone()));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_prefix() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 255]), Some(vec![2]));
        assert_eq!(prefix_end(&[255, 255]), None);
        assert_eq!(prefix_end(b""), None);
    }

    #[test]
    fn memory_store_pages_through_a_range() {
        let mut store = MemoryStore::default();
        assert_eq!(store.held_bytes(), 0);
        for k in [b"a", b"b", b"c", b"d", b"e"] {
            store.put(k.to_vec(), k.to_vec()).unwrap();
        }
        let page = store.scan(Some(b"b"), Some(b"e"), None, 2, usize::MAX).unwrap();
        assert_eq!(page.iter().map(|(k, _)| k.as_slice()).collect::<Vec<_>>(), [b"b", b"c"]);
        let page = store.scan(Some(b"b"), Some(b"e"), Some(b"c"), 2, usize::MAX).unwrap();
        assert_eq!(page.iter().map(|(k, _)| k.as_slice()).collect::<Vec<_>>(), [b"d"]);
        assert!(store
            .scan(Some(b"b"), Some(b"e"), Some(b"d"), 2, usize::MAX)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_scan_with_bounds_that_hold_nothing_is_empty_not_a_panic() {
        let mut store = MemoryStore::default();
        for k in [b"a", b"b", b"c"] {
            store.put(k.to_vec(), k.to_vec()).unwrap();
        }
        // What a guest may hand: start past end, start equal to end, after at or past end.
        for (start, end, after) in [
            (Some(&b"c"[..]), Some(&b"a"[..]), None),
            (Some(b"b"), Some(b"b"), None),
            (None, Some(b"b"), Some(&b"b"[..])),
            (None, Some(b"b"), Some(b"z")),
        ] {
            assert!(store.scan(start, end, after, 10, usize::MAX).unwrap().is_empty());
        }
    }
}
