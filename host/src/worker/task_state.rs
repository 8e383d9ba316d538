//! A task's state stores on the worker: restored from their changelogs before the task
//! processes, flushed to RocksDB and the changelog at every commit, and vouched for by a
//! checkpoint of changelog offsets.
//!
//! The commit protocol (at-least-once), and where a crash can fall:
//!
//! 1. The write cache goes to RocksDB (one batch, WAL on) and to the changelog.
//!    *Crash here:* RocksDB may hold writes the changelog lacks, and the checkpoint is the
//!    previous one. On restart the changelog is replayed from that checkpoint over RocksDB;
//!    the source records behind the extra writes were not committed, so they are processed
//!    again: counts may run ahead of the truth (at-least-once), never behind.
//! 2. The producer is flushed: outputs and changelog records are acknowledged.
//!    *Crash here:* as above; the changelog now holds the writes, so the replay restores them.
//! 3. Source offsets are committed.
//!    *Crash here:* the checkpoint is stale, so restart replays more of the changelog than
//!    needed; replaying puts and deletes in order is idempotent.
//! 4. The checkpoint (changelog offsets) is written atomically.
//!
//! A task that finds no checkpoint cannot trust its local state and rebuilds it from the
//! beginning of the changelog.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::metrics::{Metrics, StoreLabels};
use crate::runtime::NamedStore;
use crate::state::checkpoint::{self, Checkpoint};
use crate::state::restore::ChangelogReader;
use crate::state::rocks::{self, RocksStore, SharedMemory};

/// Where a worker keeps state, and the memory its stores share.
pub struct StateEnv {
    pub dir: PathBuf,
    pub memory: SharedMemory,
}

/// The directory of one task's state.
pub fn task_dir(state_dir: &Path, topology: &str, partition: i32) -> PathBuf {
    state_dir.join(topology).join(partition.to_string())
}

/// A task's checkpoint and the changelog topic of each store (in declaration order).
pub struct TaskState {
    checkpoint_path: PathBuf,
    checkpoint: Checkpoint,
    /// (store name, changelog topic)
    changelogs: Vec<(String, String)>,
}

impl TaskState {
    /// Opens and restores every store of a task (each restoration is logged). Returns the
    /// stores for the instance.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        env: &StateEnv,
        bootstrap: &str,
        topology: &str,
        task: &str,
        partition: i32,
        changelogs: Vec<(String, String)>,
        metrics: &Metrics,
    ) -> Result<(TaskState, Vec<NamedStore>), String> {
        let dir = task_dir(&env.dir, topology, partition);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating state directory {}: {e}", dir.display()))?;
        let checkpoint_path = dir.join("checkpoint.json");
        let old = checkpoint::read(&checkpoint_path)?;
        // From here until the next commit the local state may change without a checkpoint
        // vouching for it; a crash in between must not trust it.
        checkpoint::remove(&checkpoint_path)?;
        let mut stores = Vec::new();
        let mut fresh = Checkpoint::new();
        for (store, changelog) in &changelogs {
            let path = dir.join(store);
            let from = old.as_ref().and_then(|c| c.get(store).copied());
            if from.is_none() && path.exists() {
                tracing::info!(task = %task, store = %store, "no checkpoint vouches for the local state; rebuilding it from the changelog");
                std::fs::remove_dir_all(&path).map_err(|e| format!("removing {}: {e}", path.display()))?;
            }
            let db = Arc::new(rocks::open(&path, &env.memory)?);
            let mut reader = ChangelogReader::new(bootstrap, changelog, partition, from)?;
            let start = reader.position();
            let labels = StoreLabels {
                topology: topology.into(),
                task: task.into(),
                store: store.clone(),
            };
            let counter = metrics.restored_records.get_or_create(&labels).clone();
            let mut reported = 0;
            if reader.end() > start {
                tracing::info!(task = %task, store = %store, changelog = %changelog, from = start, to = reader.end(), "restoring");
            }
            let progress = reader.restore_into(&db, |p| {
                counter.inc_by(p.restored - reported);
                reported = p.restored;
                metrics
                    .restore_remaining
                    .get_or_create(&labels)
                    .set((p.total - p.restored) as i64);
                metrics.restore_rate.get_or_create(&labels).set(p.rate());
                metrics
                    .restore_seconds_left
                    .get_or_create(&labels)
                    .set(p.time_left().as_secs_f64());
                if p.restored < p.total {
                    tracing::info!(
                        task = %task, store = %store, restored = p.restored, total = p.total,
                        rate = %format!("{:.0}/s", p.rate()),
                        left = %humantime::format_duration(Duration::from_secs(p.time_left().as_secs())),
                        "restoring"
                    );
                }
            })?;
            tracing::info!(
                task = %task, store = %store, from_offset = start, records = progress.restored,
                mb = %format!("{:.1}", progress.bytes as f64 / 1e6),
                seconds = %format!("{:.2}", progress.elapsed.as_secs_f64()),
                "restored {} records", progress.restored
            );
            fresh.insert(store.clone(), reader.position());
            stores.push(NamedStore {
                name: store.clone(),
                store: Box::new(RocksStore::new(store, db)),
            });
        }
        checkpoint::write(&checkpoint_path, &fresh)?;
        Ok((
            TaskState {
                checkpoint_path,
                checkpoint: fresh,
                changelogs,
            },
            stores,
        ))
    }

    /// The changelog topic of each store, by store name.
    pub fn changelog(&self, store: &str) -> Option<&str> {
        self.changelogs
            .iter()
            .find(|(s, _)| s == store)
            .map(|(_, t)| t.as_str())
    }

    /// Step 4: records the changelog offsets the local state now contains.
    pub fn write_checkpoint(&mut self, acknowledged: impl Fn(&str) -> Option<i64>) -> Result<(), String> {
        let mut changed = false;
        for (store, changelog) in &self.changelogs {
            if let Some(offset) = acknowledged(changelog) {
                let next = offset + 1;
                if self.checkpoint.get(store) != Some(&next) {
                    self.checkpoint.insert(store.clone(), next);
                    changed = true;
                }
            }
        }
        if changed || !self.checkpoint_path.exists() {
            checkpoint::write(&self.checkpoint_path, &self.checkpoint)?;
        }
        Ok(())
    }
}
