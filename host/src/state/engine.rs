//! The storage engine under every store: what the state layer asks of a database, whatever
//! keeps it. RocksDB ([`super::rocks`]) is the engine of a worker; [`super::memory`] keeps
//! everything in maps, for tests that exercise the state layer without a disk.
//!
//! A database holds user data (keys and values) and bookkeeping (a few entries of Sluice's
//! own, such as a store's [`Marker`]), written together in one atomic batch: the data and
//! what vouches for it cannot disagree after a crash.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Entry;

/// A state-layer failure, and whether trying the same thing again later may succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateError {
    retryable: bool,
    message: String,
}

impl StateError {
    /// A failure that may pass: a store still held by its previous user, a broker that did
    /// not answer.
    pub fn retryable(message: impl Into<String>) -> StateError {
        StateError {
            retryable: true,
            message: message.into(),
        }
    }

    /// A failure that will not pass by waiting: corrupt data, a disk that refuses writes.
    pub fn fatal(message: impl Into<String>) -> StateError {
        StateError {
            retryable: false,
            message: message.into(),
        }
    }

    pub fn is_retryable(&self) -> bool {
        self.retryable
    }

    /// The same failure, said of `what` (`store counts: …`).
    pub fn context(mut self, what: impl fmt::Display) -> StateError {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

impl fmt::Display for StateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StateError {}

impl From<StateError> for String {
    fn from(e: StateError) -> String {
        e.message
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

/// The bookkeeping key of a store's marker.
const MARKER_KEY: &[u8] = b"changelog";

/// Keys and their new values (none: delete), borrowed.
pub type Writes<'i, 'a> = &'i mut dyn Iterator<Item = (&'a [u8], Option<&'a [u8]>)>;

/// One open database.
pub trait Engine: Send + Sync + 'static {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError>;

    /// A cursor over the data in key order, stopping before `upper` when given. It starts
    /// unpositioned: seek first.
    fn cursor(&self, upper: Option<&[u8]>) -> Box<dyn Cursor + '_>;

    /// Writes `changes` and, if given, one bookkeeping entry in one atomic batch. `wal:
    /// false` is for writes that can be repeated (a changelog's replay): they become durable
    /// with the next [`flush`](Engine::flush).
    fn write<'a>(&self, changes: Writes<'_, 'a>, meta: Option<(&[u8], &[u8])>, wal: bool) -> Result<(), StateError>;

    /// A bookkeeping entry; none if never written.
    fn read_meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StateError>;

    /// Makes every write durable (data and bookkeeping together); `wait: false` starts it
    /// and returns (a later `flush(true)` waits for it).
    fn flush(&self, wait: bool) -> Result<(), StateError>;

    /// Bytes the data takes (on disk and in memory, as the engine estimates it).
    fn size(&self) -> u64;
}

/// A position in a database's data, lending keys and values in place.
pub trait Cursor {
    fn seek(&mut self, key: &[u8]);
    fn seek_to_first(&mut self);
    fn valid(&self) -> bool;
    fn key(&self) -> Option<&[u8]>;
    fn value(&self) -> Option<&[u8]>;
    fn next(&mut self);
    /// The error that ended the walk early, if one did.
    fn status(&self) -> Result<(), StateError>;
}

/// Where databases live: one per directory, and one opener at a time.
pub trait Storage: Send + Sync + 'static {
    /// Opens (creating if needed) the database at `path`. A database that is open already
    /// is a retryable error: its previous user may be letting go of it.
    fn open(&self, path: &Path) -> Result<Db, StateError>;

    /// Deletes the database at `path` (closed), if there is one.
    fn wipe(&self, path: &Path) -> Result<(), StateError>;
}

/// An open database, shared by whoever reads it (a task, interactive queries).
pub type Db = Arc<dyn Engine>;

impl dyn Engine {
    /// The store's marker; none for a new (or pre-marker) database.
    pub fn read_marker(&self) -> Result<Option<Marker>, StateError> {
        match self.read_meta(MARKER_KEY)? {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| StateError::fatal(format!("the store's marker is corrupt ({e})"))),
        }
    }

    /// Writes `changes` and the marker that vouches for them in one atomic batch.
    pub fn write_with_marker<'a>(&self, changes: Writes<'_, 'a>, marker: &Marker, wal: bool) -> Result<(), StateError> {
        let marker = serde_json::to_vec(marker).expect("a marker serialises");
        self.write(changes, Some((MARKER_KEY, &marker)), wal)
    }

    /// Whether the database holds any user data.
    pub fn is_empty(&self) -> bool {
        let mut cursor = self.cursor(None);
        cursor.seek_to_first();
        !cursor.valid()
    }

    /// Every entry, in key order (for tests and diagnostics).
    pub fn dump(&self) -> Result<Vec<Entry>, StateError> {
        let mut out = Vec::new();
        let mut cursor = self.cursor(None);
        cursor.seek_to_first();
        while let (Some(k), Some(v)) = (cursor.key(), cursor.value()) {
            out.push((k.to_vec(), v.to_vec()));
            cursor.next();
        }
        cursor.status()?;
        Ok(out)
    }
}

/// Borrowed writes from a list of owned ones.
pub fn as_slices(changes: &[super::Change]) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
    changes.iter().map(|(k, v)| (k.as_slice(), v.as_deref()))
}
