//! Typed key-value state: [`Store<K, V>`] over the host's `sluice:topology/state` stores.
//!
//! The host keeps each store in RocksDB and logs every write to a compacted changelog
//! topic, so state survives crashes and moves with its task.

use std::marker::PhantomData;

use crate::codec::{Decode, Encode};
use crate::guest::bindings::sluice::topology::state as wit;
use crate::Error;

/// How many entries a scan fetches from the host per call.
const PAGE: u32 = 256;

/// A store the topology declared with [`crate::Description::store`], with keys and values
/// of types `K` and `V` (any codec: `String`, `Vec<u8>`, `u64`, `Json<T>`, …).
///
/// Open it once, in `init`, and keep it: `Store::<String, u64>::open("counts")?`.
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

    /// Entries with `start <= key < end` in the order of the encoded keys.
    pub fn range(&self, start: Option<&K>, end: Option<&K>) -> Result<Scan<K, V>, Error> {
        let start = start.map(|k| encode(&self.name, "key", k)).transpose()?;
        let end = end.map(|k| encode(&self.name, "key", k)).transpose()?;
        let inner = self
            .inner
            .range(start.as_deref(), end.as_deref())
            .map_err(|e| state_error(&self.name, e))?;
        Ok(Scan::new(inner, &self.name))
    }

    /// Entries whose encoded key starts with `prefix`.
    pub fn prefix(&self, prefix: &[u8]) -> Result<Scan<K, V>, Error> {
        let inner = self.inner.prefix(prefix).map_err(|e| state_error(&self.name, e))?;
        Ok(Scan::new(inner, &self.name))
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
