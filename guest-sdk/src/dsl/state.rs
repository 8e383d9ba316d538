//! The state the DSL's operators keep, behind a byte-level trait ([`KeyValueStore`]) with
//! two implementations: the host's stores inside a Wasm instance, and [`MemoryStores`]
//! (`BTreeMap`s) for native tests and the [`TestDriver`](super::testing::TestDriver).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use crate::Error;

/// One entry of a scan: key and value bytes.
pub type Entry = (Vec<u8>, Vec<u8>);

/// The entries of a scan, in key order.
pub type EntryIter<'a> = Box<dyn Iterator<Item = Result<Entry, Error>> + 'a>;

/// A key-value store of bytes, ordered by key: what the DSL's operators need of state.
///
/// Methods take `&self`: several operators of one task may share a store (a table and the
/// joins that read it), and a task runs on one thread.
pub trait KeyValueStore {
    /// The store's name, for error messages.
    fn name(&self) -> &str;
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error>;
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), Error>;
    fn delete(&self, key: &[u8]) -> Result<(), Error>;
    /// Puts (`Some`) and deletes (`None`) in one call.
    fn write_batch(&self, entries: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), Error>;
    /// Entries with `start <= key < end` (an open bound when `None`), in key order.
    fn range(&self, start: Option<&[u8]>, end: Option<&[u8]>) -> Result<EntryIter<'_>, Error>;
    /// Entries whose key starts with `prefix`, in key order.
    fn prefix(&self, prefix: &[u8]) -> Result<EntryIter<'_>, Error>;
    /// Deletes the entries with `start <= key < end`; returns how many there were.
    fn delete_range(&self, start: Option<&[u8]>, end: Option<&[u8]>) -> Result<u64, Error>;
}

/// Where a task's stores come from: the host's, or memory.
pub trait StateBackend {
    /// Opens the store `name` (a declared store, or a global table).
    fn open(&mut self, name: &str) -> Result<Rc<dyn KeyValueStore>, Error>;
}

/// The smallest key greater than every key that starts with `prefix` (none: no bound).
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

/// Stores kept in memory, by name: the state of a [`TestDriver`](super::testing::TestDriver),
/// kept across a restart (`TestDriver::close` returns them, `TestDriver::with_stores` takes
/// them).
#[derive(Clone, Default)]
pub struct MemoryStores {
    stores: Rc<RefCell<BTreeMap<String, Rc<MemoryStore>>>>,
    /// The next offset of each topic the driver feeds, so that a restarted driver's records
    /// get new offsets, as they would in Kafka (operators derive ids from them).
    offsets: Rc<RefCell<BTreeMap<String, i64>>>,
}

impl MemoryStores {
    pub fn new() -> Self {
        Self::default()
    }

    /// The store `name`, created empty if it does not exist.
    pub fn store(&self, name: &str) -> Rc<MemoryStore> {
        self.stores
            .borrow_mut()
            .entry(name.to_string())
            .or_insert_with(|| {
                Rc::new(MemoryStore {
                    name: name.to_string(),
                    map: RefCell::new(Map::new()),
                })
            })
            .clone()
    }

    /// The offset the next record of `topic` gets.
    pub(crate) fn next_offset(&self, topic: &str) -> i64 {
        let mut offsets = self.offsets.borrow_mut();
        let next = offsets.entry(topic.to_string()).or_insert(0);
        *next += 1;
        *next - 1
    }

    /// The names of the stores that exist.
    pub fn names(&self) -> Vec<String> {
        self.stores.borrow().keys().cloned().collect()
    }

    /// A copy of every entry of the store `name` (empty if there is no such store).
    pub fn entries(&self, name: &str) -> Vec<Entry> {
        match self.stores.borrow().get(name) {
            Some(store) => store.map.borrow().iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            None => Vec::new(),
        }
    }
}

impl StateBackend for MemoryStores {
    fn open(&mut self, name: &str) -> Result<Rc<dyn KeyValueStore>, Error> {
        Ok(self.store(name))
    }
}

/// One in-memory store.
pub struct MemoryStore {
    name: String,
    map: RefCell<Map>,
}

impl MemoryStore {
    fn borrowed(&self) -> Result<std::cell::RefMut<'_, Map>, Error> {
        self.map
            .try_borrow_mut()
            .map_err(|_| Error::msg(format!("store {:?}: written while it is being read", self.name)))
    }

    /// The entries in `[start, end)`, copied: a scan is a snapshot, so the caller may write
    /// while it iterates (as the host's paged scans allow).
    fn snapshot(&self, start: Option<&[u8]>, end: Option<&[u8]>) -> Vec<Entry> {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        if let (Some(s), Some(e)) = (start, end) {
            if s >= e {
                return Vec::new();
            }
        }
        let lower = start.map_or(Unbounded, Included);
        let upper = end.map_or(Unbounded, Excluded);
        self.map
            .borrow()
            .range::<[u8], _>((lower, upper))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

impl KeyValueStore for MemoryStore {
    fn name(&self) -> &str {
        &self.name
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        Ok(self.map.borrow().get(key).cloned())
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        self.borrowed()?.insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn delete(&self, key: &[u8]) -> Result<(), Error> {
        self.borrowed()?.remove(key);
        Ok(())
    }

    fn write_batch(&self, entries: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), Error> {
        let mut map = self.borrowed()?;
        for (key, value) in entries {
            match value {
                Some(value) => map.insert(key.clone(), value.clone()),
                None => map.remove(key),
            };
        }
        Ok(())
    }

    fn range(&self, start: Option<&[u8]>, end: Option<&[u8]>) -> Result<EntryIter<'_>, Error> {
        Ok(Box::new(self.snapshot(start, end).into_iter().map(Ok)))
    }

    fn prefix(&self, prefix: &[u8]) -> Result<EntryIter<'_>, Error> {
        let end = prefix_end(prefix);
        Ok(Box::new(
            self.snapshot(Some(prefix), end.as_deref()).into_iter().map(Ok),
        ))
    }

    fn delete_range(&self, start: Option<&[u8]>, end: Option<&[u8]>) -> Result<u64, Error> {
        let doomed = self.snapshot(start, end);
        let mut map = self.borrowed()?;
        for (key, _) in &doomed {
            map.remove(key);
        }
        Ok(doomed.len() as u64)
    }
}

/// The host's stores (`sluice:topology/state`), inside a Wasm instance.
pub(crate) struct HostStores;

impl StateBackend for HostStores {
    fn open(&mut self, name: &str) -> Result<Rc<dyn KeyValueStore>, Error> {
        Ok(Rc::new(host::HostStore::open(name)?))
    }
}

mod host {
    use super::{Entry, EntryIter, KeyValueStore};
    use crate::Error;

    use crate::__private::bindings::sluice::topology0_1_0::state as wit;

    /// Entries fetched from the host per call of a scan.
    const PAGE: u32 = 256;

    pub(super) struct HostStore {
        inner: wit::Store,
        name: String,
    }

    fn state_error(store: &str, e: wit::StateError) -> Error {
        match e {
            wit::StateError::Undeclared(message) | wit::StateError::Storage(message) => {
                Error::msg(format!("store {store:?}: {message}"))
            }
        }
    }

    impl HostStore {
        pub(super) fn open(name: &str) -> Result<Self, Error> {
            let inner = wit::Store::open(name).map_err(|e| state_error(name, e))?;
            Ok(HostStore {
                inner,
                name: name.to_string(),
            })
        }

        fn pages(&self, scan: wit::Scan) -> EntryIter<'_> {
            Box::new(Pages {
                scan,
                store: &self.name,
                page: Vec::new().into_iter(),
                done: false,
            })
        }
    }

    struct Pages<'a> {
        scan: wit::Scan,
        store: &'a str,
        page: std::vec::IntoIter<wit::Entry>,
        done: bool,
    }

    impl Iterator for Pages<'_> {
        type Item = Result<Entry, Error>;

        fn next(&mut self) -> Option<Self::Item> {
            loop {
                if let Some(entry) = self.page.next() {
                    return Some(Ok((entry.key, entry.value)));
                }
                if self.done {
                    return None;
                }
                match self.scan.next_page(PAGE) {
                    Ok(page) if page.is_empty() => self.done = true,
                    Ok(page) => self.page = page.into_iter(),
                    Err(e) => {
                        self.done = true;
                        return Some(Err(state_error(self.store, e)));
                    }
                }
            }
        }
    }

    impl KeyValueStore for HostStore {
        fn name(&self) -> &str {
            &self.name
        }

        fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
            self.inner.get(key).map_err(|e| state_error(&self.name, e))
        }

        fn put(&self, key: &[u8], value: &[u8]) -> Result<(), Error> {
            self.inner.put(key, value).map_err(|e| state_error(&self.name, e))
        }

        fn delete(&self, key: &[u8]) -> Result<(), Error> {
            self.inner.delete(key).map_err(|e| state_error(&self.name, e))
        }

        fn write_batch(&self, entries: &[(Vec<u8>, Option<Vec<u8>>)]) -> Result<(), Error> {
            self.inner.write_batch(entries).map_err(|e| state_error(&self.name, e))
        }

        fn range(&self, start: Option<&[u8]>, end: Option<&[u8]>) -> Result<EntryIter<'_>, Error> {
            let scan = self.inner.range(start, end).map_err(|e| state_error(&self.name, e))?;
            Ok(self.pages(scan))
        }

        fn prefix(&self, prefix: &[u8]) -> Result<EntryIter<'_>, Error> {
            let scan = self.inner.prefix(prefix).map_err(|e| state_error(&self.name, e))?;
            Ok(self.pages(scan))
        }

        fn delete_range(&self, start: Option<&[u8]>, end: Option<&[u8]>) -> Result<u64, Error> {
            // The host has no range deletion: read a page, delete its keys in one batch. The
            // scan resumes after the last key it returned, so deleting behind it is safe.
            let scan = self.inner.range(start, end).map_err(|e| state_error(&self.name, e))?;
            let mut deleted = 0u64;
            loop {
                let page = scan.next_page(PAGE).map_err(|e| state_error(&self.name, e))?;
                if page.is_empty() {
                    return Ok(deleted);
                }
                deleted += page.len() as u64;
                let deletions: Vec<(Vec<u8>, Option<Vec<u8>>)> = page.into_iter().map(|e| (e.key, None)).collect();
                self.write_batch(&deletions)?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_scans_are_ordered_snapshots() {
        let stores = MemoryStores::new();
        let s = stores.store("s");
        for k in [&b"a"[..], b"ab", b"b", b"b\xff", b"c"] {
            s.put(k, b"v").unwrap();
        }
        let keys = |it: EntryIter<'_>| it.map(|e| e.unwrap().0).collect::<Vec<_>>();
        assert_eq!(keys(s.prefix(b"a").unwrap()), vec![b"a".to_vec(), b"ab".to_vec()]);
        assert_eq!(keys(s.prefix(b"b").unwrap()), vec![b"b".to_vec(), b"b\xff".to_vec()]);
        assert_eq!(keys(s.range(Some(b"ab"), Some(b"c")).unwrap()).len(), 3);
        assert_eq!(keys(s.range(Some(b"c"), Some(b"a")).unwrap()).len(), 0);
        // Writing while a scan is open is allowed: the scan is a snapshot.
        for entry in s.range(None, None).unwrap() {
            s.delete(&entry.unwrap().0).unwrap();
        }
        assert!(stores.entries("s").is_empty());
        assert_eq!(prefix_end(&[1, 0xFF]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xFF]), None);
    }
}
