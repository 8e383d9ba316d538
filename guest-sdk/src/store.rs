//! Typed key-value state: [`Store<K, V>`] over the host's `sluice:topology/state` stores.
//!
//! The host keeps each store in RocksDB and logs every write to a compacted changelog
//! topic, so state survives crashes and moves with its task.

use std::marker::PhantomData;

use crate::__private::bindings::sluice::topology0_1_0::state as wit;
use crate::codec::{Decode, Encode, Prefix};
use crate::Error;

/// How many entries a scan fetches from the host per call.
const PAGE: u32 = 256;

/// A store the topology declared with [`crate::Description::store`], with keys and values
/// of types `K` and `V` (any codec: `String`, `Vec<u8>`, `u64`, `Json<T>`, tuples such as
/// `(String, i64)`, [`Ordered<T>`](crate::Ordered), …).
///
/// Open it once, in `init`, and keep it: `Store::<String, u64>::open("counts")?`.
///
/// Entries are kept in the byte order of their encoded keys, and scans return them in that
/// order: for tuple keys and [`Ordered`](crate::Ordered) keys it is the order of the values
/// (see [`crate::codec::ordered`]).
pub struct Store<K, V> {
    inner: wit::Store,
    name: String,
    _types: PhantomData<fn(K) -> V>,
}

fn state_error(store: &str, e: wit::StateError) -> Error {
    match e {
        wit::StateError::Undeclared(message) | wit::StateError::Storage(message) => {
            Error::msg(format!("store {store:?}: {message}"))
        }
    }
}

fn encode<T: Encode + ?Sized>(store: &str, what: &str, item: &T) -> Result<Vec<u8>, Error> {
    let mut out = Vec::new();
    item.encode_into(&mut out)
        .map_err(|e| Error::msg(format!("store {store:?}: encoding a {what}: {e}")))?;
    Ok(out)
}

fn decode<T: for<'a> Decode<'a>>(store: &str, what: &str, bytes: &[u8]) -> Result<T, Error> {
    T::decode(bytes).map_err(|e| Error::msg(format!("store {store:?}: decoding a {what}: {e}")))
}

impl<K, V> Store<K, V>
where
    K: Encode + for<'a> Decode<'a>,
    V: Encode + for<'a> Decode<'a>,
{
    /// Opens a declared store. An undeclared name is an error that stops the task.
    pub fn open(name: &str) -> Result<Self, Error> {
        let inner = wit::Store::open(name).map_err(|e| state_error(name, e))?;
        Ok(Store {
            inner,
            name: name.to_string(),
            _types: PhantomData,
        })
    }

    pub fn get(&self, key: &K) -> Result<Option<V>, Error> {
        let key = encode(&self.name, "key", key)?;
        match self.inner.get(&key).map_err(|e| state_error(&self.name, e))? {
            Some(bytes) => decode(&self.name, "value", &bytes).map(Some),
            None => Ok(None),
        }
    }

    pub fn put(&self, key: &K, value: &V) -> Result<(), Error> {
        let key = encode(&self.name, "key", key)?;
        let value = encode(&self.name, "value", value)?;
        self.inner.put(&key, &value).map_err(|e| state_error(&self.name, e))
    }

    pub fn delete(&self, key: &K) -> Result<(), Error> {
        let key = encode(&self.name, "key", key)?;
        self.inner.delete(&key).map_err(|e| state_error(&self.name, e))
    }

    /// Puts (`Some`) and deletes (`None`) several entries in one call to the host.
    pub fn write_batch<'e>(&self, entries: impl IntoIterator<Item = (&'e K, Option<&'e V>)>) -> Result<(), Error>
    where
        K: 'e,
        V: 'e,
    {
        let mut encoded = Vec::new();
        for (key, value) in entries {
            let key = encode(&self.name, "key", key)?;
            let value = value.map(|v| encode(&self.name, "value", v)).transpose()?;
            encoded.push((key, value));
        }
        self.inner.write_batch(&encoded).map_err(|e| state_error(&self.name, e))
    }

    /// Entries with `start <= key < end` (a bound left out is open), in the order of the
    /// encoded keys.
    pub fn range(&self, start: Option<&K>, end: Option<&K>) -> Result<Scan<K, V>, Error> {
        Ok(Scan::new(self.raw_range(start, end)?, &self.name))
    }

    /// Entries whose key starts with `prefix`, a leading part of the key type ([`Prefix`]):
    /// for a `Store<(String, u64), V>`, `store.prefix(&("user-1",))` scans the entries of
    /// `"user-1"` in `u64` order (and not those of `"user-10"`); for a `String` key, text the
    /// key starts with.
    pub fn prefix<P: Prefix<K> + ?Sized>(&self, prefix: &P) -> Result<Scan<K, V>, Error> {
        let prefix = encode(&self.name, "key prefix", prefix)?;
        self.prefix_bytes(&prefix)
    }

    /// Entries whose *encoded* key starts with the bytes `prefix`, whatever the key type.
    pub fn prefix_bytes(&self, prefix: &[u8]) -> Result<Scan<K, V>, Error> {
        let inner = self.inner.prefix(prefix).map_err(|e| state_error(&self.name, e))?;
        Ok(Scan::new(inner, &self.name))
    }

    /// Deletes every entry with `start <= key < end` (a bound left out is open) and returns
    /// how many there were.
    ///
    /// The host has no range deletion: this scans the range a page at a time and deletes
    /// each page's keys in one [`Store::write_batch`]. So it costs what that costs: every
    /// entry in the range is read once (values included) and deleted one by one, each
    /// deletion is a tombstone in the store's changelog at the next commit, and the time
    /// counts against the call's deadline and the deletions against the task's budget for
    /// uncommitted writes (the manifest's `[limits]`). Keep ranges to what one call can
    /// afford, e.g. what one punctuation expires, rather than most of a large store.
    pub fn delete_range(&self, start: Option<&K>, end: Option<&K>) -> Result<u64, Error> {
        let scan = self.raw_range(start, end)?;
        let mut deleted = 0u64;
        loop {
            let page = scan.next_page(PAGE).map_err(|e| state_error(&self.name, e))?;
            if page.is_empty() {
                return Ok(deleted);
            }
            deleted += page.len() as u64;
            // The scan resumes after the last key it returned, so deleting behind it is safe.
            let deletions: Vec<(Vec<u8>, Option<Vec<u8>>)> = page.into_iter().map(|e| (e.key, None)).collect();
            self.inner
                .write_batch(&deletions)
                .map_err(|e| state_error(&self.name, e))?;
        }
    }

    fn raw_range(&self, start: Option<&K>, end: Option<&K>) -> Result<wit::Scan, Error> {
        let start = start.map(|k| encode(&self.name, "key", k)).transpose()?;
        let end = end.map(|k| encode(&self.name, "key", k)).transpose()?;
        self.inner
            .range(start.as_deref(), end.as_deref())
            .map_err(|e| state_error(&self.name, e))
    }

    /// The store's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The entries of a range or prefix scan, fetched from the host a page at a time.
pub struct Scan<K, V> {
    inner: wit::Scan,
    store: String,
    page: std::vec::IntoIter<wit::Entry>,
    done: bool,
    _types: PhantomData<fn() -> (K, V)>,
}

impl<K, V> Scan<K, V> {
    fn new(inner: wit::Scan, store: &str) -> Self {
        Scan {
            inner,
            store: store.to_string(),
            page: Vec::new().into_iter(),
            done: false,
            _types: PhantomData,
        }
    }
}

impl<K, V> Iterator for Scan<K, V>
where
    K: for<'a> Decode<'a>,
    V: for<'a> Decode<'a>,
{
    type Item = Result<(K, V), Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(entry) = self.page.next() {
                let decoded = decode(&self.store, "key", &entry.key)
                    .and_then(|k| decode(&self.store, "value", &entry.value).map(|v| (k, v)));
                return Some(decoded);
            }
            if self.done {
                return None;
            }
            match self.inner.next_page(PAGE) {
                Ok(page) if page.is_empty() => self.done = true,
                Ok(page) => self.page = page.into_iter(),
                Err(e) => {
                    self.done = true;
                    return Some(Err(state_error(&self.store, e)));
                }
            }
        }
    }
}
