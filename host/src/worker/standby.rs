//! Standby tasks: keep a task's stores warm on another worker by tailing their changelogs,
//! and vouch for what was applied with the same checkpoint an active task uses. Promoted to
//! active, the task then replays only what the standby had not read yet.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::task_state::{offsets_hint, open_store, task_dir, OpenedStore, StateEnv};
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
    let label = task.to_string();
    let dir = task_dir(&env.dir, &topology.name, partition);
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut stores = Vec::new();
    for changelog in &topology.changelogs {
        let OpenedStore { db, reader } = open_store(env, bootstrap, &label, &dir, changelog, partition)?;
        stores.push((changelog.clone(), db, reader));
    }
    tracing::info!(task = %task, stores = stores.len(), "standby started");
    let mut applied = 0u64;
    let mut last_checkpoint = Instant::now();
    let wait = Duration::from_millis(100 / stores.len().max(1) as u64);
    while !stop.load(Ordering::Relaxed) {
        for (changelog, db, reader) in &mut stores {
            let records = reader.poll(5_000, wait)?;
            if records.is_empty() {
                continue;
            }
            // Replayable, so no WAL: the marker goes in the same batch and is flushed with it.
            rocks::write_with_marker(
                db,
                rocks::as_slices(&records),
                &reader.marker(&changelog.topic_id),
                false,
            )
            .map_err(|e| format!("standby {task}: {e}"))?;
            applied += records.len() as u64;
        }
        if last_checkpoint.elapsed() >= CHECKPOINT_EVERY {
            write_checkpoint(&dir, &mut stores)?;
            last_checkpoint = Instant::now();
        }
    }
    write_checkpoint(&dir, &mut stores)?;
    tracing::info!(task = %task, applied, "standby stopped");
    Ok(applied)
}

type StandbyStore = (super::task_state::Changelog, Arc<rocksdb::DB>, ChangelogReader);

/// Flushes data and markers together and updates the offsets hint the worker reports.
fn write_checkpoint(dir: &Path, stores: &mut [StandbyStore]) -> Result<(), String> {
    let mut hint = Checkpoint::new();
    for (changelog, db, reader) in stores.iter_mut() {
        rocks::write_with_marker(db, std::iter::empty(), &reader.marker(&changelog.topic_id), false)?;
        rocks::flush(db).map_err(|e| format!("standby store {}: {e}", changelog.store))?;
        hint.insert(changelog.store.clone(), reader.position());
    }
    checkpoint::write(&dir.join("checkpoint.json"), &hint)
}

/// Changelog offset sums of the state this worker holds on disk, per task (from the
/// checkpoints), for the assignor to prefer caught-up workers.
pub fn local_offset_sums(state_dir: &Path, topologies: &[Arc<DeployedTopology>]) -> Vec<(TaskId, i64)> {
    let mut out = Vec::new();
    for t in topologies.iter().filter(|t| !t.changelogs.is_empty()) {
        for p in 0..t.partitions {
            if let Some(c) = offsets_hint(&task_dir(state_dir, &t.name, p)) {
                out.push((TaskId::new(&t.name, p as u32), c.values().sum()));
            }
        }
    }
    out
}
