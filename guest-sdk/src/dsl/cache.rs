//! The record cache of an aggregation (Kafka Streams' `statestore.cache.max.bytes`): the
//! updates of one key between two flushes go downstream once, as one change from the value
//! the key had at the last flush to the one it has now.
//!
//! The aggregation writes every update to its store at once (the host keeps one write per
//! key until its commit, so the store and changelog see one write per key per commit
//! either way); only what goes downstream waits here. The host flushes before every commit
//! (it punctuates first), so nothing a commit covers is still waiting; a cache over its
//! bytes sends its oldest keys on early.
//!
//! A batch that fails leaves no trace: what a batch changed here is undone when the next
//! call begins without the batch having ended (the host dropped its store writes and its
//! output too).

use std::collections::BTreeMap;

use super::runtime::Change;

/// Bytes an aggregation's cache holds before it sends its oldest keys on: Kafka Streams'
/// default of 10 MiB is for a whole application instance, shared by its tasks; a Sluice
/// task is one Wasm instance with its own memory (64 MiB by default), and each cached
/// operator of it has this much.
pub const DEFAULT_CACHE_MAX_BYTES: usize = 1 << 20;

/// What a cache entry costs beyond its key and value bytes (the typed copies, the maps).
const ENTRY_OVERHEAD: usize = 64;

struct Entry<K, V> {
    key: K,
    /// The value at the last flush (what downstream last saw).
    old: Option<V>,
    new: Option<V>,
    ts: i64,
    seq: u64,
    size: usize,
}

impl<K: Clone, V: Clone> Clone for Entry<K, V> {
    fn clone(&self) -> Self {
        Entry {
            key: self.key.clone(),
            old: self.old.clone(),
            new: self.new.clone(),
            ts: self.ts,
            seq: self.seq,
            size: self.size,
        }
    }
}

/// A change that leaves the cache: key, change, timestamp.
pub(crate) type Out<K, V> = (K, Change<V>, i64);

pub(crate) struct RecordCache<K, V> {
    entries: BTreeMap<Vec<u8>, Entry<K, V>>,
    /// Keys by the order of their last update (oldest first).
    order: BTreeMap<u64, Vec<u8>>,
    seq: u64,
    bytes: usize,
    max_bytes: usize,
    /// This batch's first change of each key: what to put back if the batch fails.
    undo: BTreeMap<Vec<u8>, Option<Entry<K, V>>>,
}

impl<K: Clone, V: Clone> RecordCache<K, V> {
    pub fn new(max_bytes: usize) -> Self {
        RecordCache {
            entries: BTreeMap::new(),
            order: BTreeMap::new(),
            seq: 0,
            bytes: 0,
            max_bytes,
            undo: BTreeMap::new(),
        }
    }

    /// Whether updates wait here at all (a cache of 0 bytes sends each on at once).
    pub fn enabled(&self) -> bool {
        self.max_bytes > 0
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn remember(&mut self, raw_key: &[u8]) {
        if !self.undo.contains_key(raw_key) {
            self.undo.insert(raw_key.to_vec(), self.entries.get(raw_key).cloned());
        }
    }

    fn remove(&mut self, raw_key: &[u8]) -> Option<Entry<K, V>> {
        let entry = self.entries.remove(raw_key)?;
        self.order.remove(&entry.seq);
        self.bytes -= entry.size;
        Some(entry)
    }

    fn insert(&mut self, raw_key: Vec<u8>, entry: Entry<K, V>) {
        self.bytes += entry.size;
        self.order.insert(entry.seq, raw_key.clone());
        self.entries.insert(raw_key, entry);
    }

    /// An update of `raw_key` from `old` (its value before this update) to `new`, of
    /// `size` bytes (key and value encoded). Returns the oldest entries pushed out when the
    /// cache is over its bytes, to go downstream now.
    pub fn put(
        &mut self,
        raw_key: &[u8],
        key: K,
        old: Option<V>,
        new: Option<V>,
        ts: i64,
        size: usize,
    ) -> Vec<Out<K, V>> {
        self.remember(raw_key);
        let first_old = match self.remove(raw_key) {
            Some(was) => was.old,
            None => old,
        };
        self.seq += 1;
        let entry = Entry {
            key,
            old: first_old,
            new,
            ts,
            seq: self.seq,
            size: size + raw_key.len() + ENTRY_OVERHEAD,
        };
        self.insert(raw_key.to_vec(), entry);
        let mut out = Vec::new();
        while self.bytes > self.max_bytes {
            let Some(oldest) = self.order.values().next().cloned() else {
                break;
            };
            self.remember(&oldest);
            if let Some(e) = self.remove(&oldest) {
                out.extend(emit(e));
            }
        }
        out
    }

    /// Everything waiting, oldest update first; the cache is empty after.
    pub fn flush(&mut self) -> Vec<Out<K, V>> {
        let keys: Vec<Vec<u8>> = std::mem::take(&mut self.order).into_values().collect();
        let mut out = Vec::with_capacity(keys.len());
        for raw_key in keys {
            self.remember(&raw_key);
            if let Some(entry) = self.entries.remove(&raw_key) {
                self.bytes -= entry.size;
                out.extend(emit(entry));
            }
        }
        out
    }

    /// A call that changes the cache begins: if the last one did not end (its batch failed,
    /// and the host dropped what it wrote and sent), its changes are undone.
    pub fn call_started(&mut self) {
        let undo = std::mem::take(&mut self.undo);
        for (raw_key, was) in undo {
            self.remove(&raw_key);
            if let Some(was) = was {
                self.insert(raw_key, was);
            }
        }
    }

    /// The call ended well: its changes stand.
    pub fn call_done(&mut self) {
        self.undo.clear();
    }
}

/// An entry as it goes downstream: nothing when the key had no value before and has none now.
fn emit<K, V>(e: Entry<K, V>) -> Option<Out<K, V>> {
    if e.old.is_none() && e.new.is_none() {
        return None;
    }
    Some((e.key, Change { new: e.new, old: e.old }, e.ts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(c: &mut RecordCache<String, u64>, k: &str, old: Option<u64>, new: u64, ts: i64) -> Vec<Out<String, u64>> {
        c.put(k.as_bytes(), k.to_string(), old, Some(new), ts, 8)
    }

    #[test]
    fn updates_of_a_key_go_on_once_from_the_first_old_value_to_the_last_new_one() {
        let mut c = RecordCache::new(1 << 20);
        assert!(put(&mut c, "a", None, 1, 10).is_empty());
        assert!(put(&mut c, "b", None, 1, 11).is_empty());
        assert!(put(&mut c, "a", Some(1), 2, 12).is_empty());
        assert!(put(&mut c, "a", Some(2), 3, 13).is_empty());
        let out = c.flush();
        assert_eq!(
            out,
            vec![
                (
                    "b".to_string(),
                    Change {
                        new: Some(1),
                        old: None
                    },
                    11
                ),
                (
                    "a".to_string(),
                    Change {
                        new: Some(3),
                        old: None
                    },
                    13
                ),
            ]
        );
        assert!(c.is_empty() && c.flush().is_empty());
        assert!(put(&mut c, "a", Some(3), 4, 14).is_empty());
        assert_eq!(
            c.flush(),
            vec![(
                "a".to_string(),
                Change {
                    new: Some(4),
                    old: Some(3)
                },
                14
            )]
        );
    }

    #[test]
    fn a_full_cache_sends_its_oldest_keys_on() {
        // Each entry costs 1 + 8 + ENTRY_OVERHEAD = 73 bytes: two fit in 150.
        let mut c = RecordCache::new(150);
        assert!(put(&mut c, "a", None, 1, 1).is_empty());
        assert!(put(&mut c, "b", None, 1, 2).is_empty());
        assert!(put(&mut c, "a", Some(1), 2, 3).is_empty());
        let out = put(&mut c, "c", None, 1, 4);
        assert_eq!(
            out,
            vec![(
                "b".to_string(),
                Change {
                    new: Some(1),
                    old: None
                },
                2
            )]
        );
        let out = c.flush();
        assert_eq!(out.iter().map(|o| o.0.as_str()).collect::<Vec<_>>(), ["a", "c"]);
    }

    #[test]
    fn a_call_that_did_not_end_is_undone() {
        let mut c = RecordCache::new(1 << 20);
        c.call_started();
        put(&mut c, "a", None, 1, 1);
        c.call_done();
        c.call_started();
        put(&mut c, "a", Some(1), 2, 2);
        put(&mut c, "b", None, 1, 3);
        // No call_done: the batch failed.
        c.call_started();
        assert_eq!(
            c.flush(),
            vec![(
                "a".to_string(),
                Change {
                    new: Some(1),
                    old: None
                },
                1
            )]
        );
        // A flush in a call that fails is undone too.
        c.call_done();
        c.call_started();
        put(&mut c, "a", Some(1), 5, 5);
        c.call_done();
        c.call_started();
        assert_eq!(c.flush().len(), 1);
        c.call_started();
        assert_eq!(
            c.flush(),
            vec![(
                "a".to_string(),
                Change {
                    new: Some(5),
                    old: Some(1)
                },
                5
            )]
        );
    }

    #[test]
    fn a_key_created_and_deleted_between_flushes_sends_nothing() {
        let mut c: RecordCache<String, u64> = RecordCache::new(1 << 20);
        c.put(b"a", "a".into(), None, Some(1), 1, 8);
        c.put(b"a", "a".into(), Some(1), None, 2, 0);
        assert!(c.flush().is_empty());
    }
}
