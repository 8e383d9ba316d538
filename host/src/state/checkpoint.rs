//! A task's checkpoint: for each store, the changelog offset its RocksDB state contains as
//! of its last commit, written after every commit. A hint for the group (how warm this
//! worker's copy of a task is), read without opening RocksDB: what state is trusted is
//! decided by the marker inside each store.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// Store name → the next changelog offset to restore from.
pub type Checkpoint = BTreeMap<String, i64>;

/// Reads a checkpoint; none when the file does not exist.
pub fn read(path: &Path) -> Result<Option<Checkpoint>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
            format!(
                "checkpoint {} is corrupt ({e}); delete it to restore from the changelog",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("reading checkpoint {}: {e}", path.display())),
    }
}

/// Writes a checkpoint atomically against a process crash: a temporary file renamed over
/// the old one. Not synced to disk: it is a hint, and its two fsyncs (file and directory)
/// cost every commit and every task's start 2–50 ms on a busy disk (52 ms of one
/// handover's start). After a machine crash the hint may be older than the store, or
/// missing (then the store's own marker is all there is).
pub fn write(path: &Path, checkpoint: &Checkpoint) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    let fail = |e: std::io::Error| format!("writing checkpoint {}: {e}", path.display());
    let mut file = std::fs::File::create(&tmp).map_err(fail)?;
    file.write_all(
        serde_json::to_string(checkpoint)
            .expect("a map of strings to numbers")
            .as_bytes(),
    )
    .map_err(fail)?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(fail)?;
    Ok(())
}

/// Removes a checkpoint (the state it vouched for is about to be rebuilt).
pub fn remove(path: &Path) -> Result<(), String> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing checkpoint {}: {e}", path.display())),
    }
}
