//! A task's checkpoint: for each store, the changelog offset its RocksDB state is known to
//! contain, written atomically after every commit.

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

/// Writes a checkpoint atomically: a temporary file, fsync, rename over the old one.
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
    file.sync_all().map_err(fail)?;
    std::fs::rename(&tmp, path).map_err(fail)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(fail)?;
    }
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
