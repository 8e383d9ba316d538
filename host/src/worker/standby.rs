//! Standby tasks: keep a task's stores warm on another worker by tailing their changelogs,
//! and vouch for what was applied with the same checkpoint an active task uses. Promoted to
//! active, the task then replays only what the standby had not read yet.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rocksdb::{WriteBatch, WriteOptions};

use super::task_state::{task_dir, StateEnv};
use super::DeployedTopology;
use crate::group::TaskId;
use crate::state::checkpoint::{self, Checkpoint};
use crate::state::restore::ChangelogReader;
use crate::state::rocks;

/// How often a standby makes its progress durable.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);

/// Runs a standby until `stop` is set. Errors are logged by the caller; a standby failing
/// never affects active tasks.
pub fn run(
    topology: Arc<DeployedTopology>,
    partition: i32,
    bootstrap: &str,
    env: &StateEnv,
    stop: &AtomicBool,
) -> Result<u64, String> {
    let task = TaskId::new(&topology.name, partition as u32);
    let dir = task_dir(&env.dir, &topology.name, partition);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let checkpoint_path = dir.join("checkpoint.json");
    let old = checkpoint::read(&checkpoint_path)?;
    checkpoint::remove(&checkpoint_path)?;
    let mut stores = Vec::new();
    for (store, changelog) in &topology.changelogs {
        let path = dir.join(store);
        let from = old.as_ref().and_then(|c| c.get(store).copied());
        if from.is_none() && path.exists() {
            std::fs::remove_dir_all(&path).map_err(|e| format!("removing {}: {e}", path.display()))?;
        }
        let db = rocks::open(&path, &env.memory)?;
        let reader = ChangelogReader::new(bootstrap, changelog, partition, from)?;
        stores.push((store.clone(), db, reader));
    }
    tracing::info!(task = %task, stores = stores.len(), "standby started");
    let mut options = WriteOptions::default();
    options.disable_wal(true);
    let mut applied = 0u64;
    let mut last_checkpoint = Instant::now();
    let wait = Duration::from_millis(100 / stores.len().max(1) as u64);
    while !stop.load(Ordering::Relaxed) {
        for (_, db, reader) in &mut stores {
            let records = reader.poll(5_000, wait)?;
            if records.is_empty() {
                continue;
            }
            let mut batch = WriteBatch::default();
            for (key, value) in &records {
                match value {
                    Some(v) => batch.put(key, v),
                    None => batch.delete(key),
                }
            }
            db.write_opt(batch, &options)
                .map_err(|e| format!("standby {task}: writing: {e}"))?;
            applied += records.len() as u64;
        }
        if last_checkpoint.elapsed() >= CHECKPOINT_EVERY {
            write_checkpoint(&checkpoint_path, &mut stores)?;
            last_checkpoint = Instant::now();
        }
    }
    write_checkpoint(&checkpoint_path, &mut stores)?;
    tracing::info!(task = %task, applied, "standby stopped");
    Ok(applied)
}

/// The WAL is off: flush first, so the checkpoint never vouches for more than is on disk.
fn write_checkpoint(path: &Path, stores: &mut [(String, rocksdb::DB, ChangelogReader)]) -> Result<(), String> {
    let mut checkpoint = Checkpoint::new();
    for (store, db, reader) in stores.iter_mut() {
        db.flush().map_err(|e| format!("flushing standby store {store}: {e}"))?;
        checkpoint.insert(store.clone(), reader.position());
    }
    checkpoint::write(path, &checkpoint)
}

/// Changelog offset sums of the state this worker holds on disk, per task (from the
/// checkpoints), for the assignor to prefer caught-up workers.
pub fn local_offset_sums(state_dir: &Path, topologies: &[Arc<DeployedTopology>]) -> Vec<(TaskId, i64)> {
    let mut out = Vec::new();
    for t in topologies.iter().filter(|t| !t.changelogs.is_empty()) {
        for p in 0..t.partitions {
            let path = task_dir(state_dir, &t.name, p).join("checkpoint.json");
            if let Ok(Some(c)) = checkpoint::read(&path) {
                out.push((TaskId::new(&t.name, p as u32), c.values().sum()));
            }
        }
    }
    out
}
