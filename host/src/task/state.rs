//! A task's state stores on the worker: validated against their changelogs, restored before
//! the task processes, and committed together with the marker that vouches for them.
//!
//! Each store's RocksDB holds a marker beside its data (see `state::rocks`): the changelog
//! topic and its id, and the next changelog offset. Data and marker are written in one
//! atomic batch, so local state never runs ahead of what vouches for it.
//!
//! The commit protocol, and where a crash can fall:
//!
//! 1. Outputs and the store's writes since the last commit go to Kafka (under exactly-once,
//!    in the task's transaction). Nothing has reached RocksDB yet.
//!    *Crash here:* RocksDB and its marker are as of the last commit; the records produced
//!    are either replayed from the changelog (at-least-once: their source records are
//!    processed again, so counts may run ahead of the truth, never behind) or aborted
//!    (exactly-once: the restart sees none of it).
//! 2. Everything produced is acknowledged, and source offsets are committed (exactly-once:
//!    the transaction commits, offsets included).
//!    *Crash here:* RocksDB is behind the changelog; the restart replays the changelog from
//!    the marker and the state is exact.
//! 3. The writes and the new marker go to RocksDB in one batch (WAL on).
//!
//! A store whose marker cannot be trusted — none, another topic id (the changelog was
//! re-created), an offset outside the changelog — is wiped and rebuilt from the changelog.

use std::path::PathBuf;
use std::time::Duration;

use super::TaskProgress;
use crate::drops::Drops;
use crate::group::TaskId;
use crate::kafka::KafkaSettings;
use crate::metrics::{Metrics, StoreLabels};
use crate::runtime::NamedStore;
use crate::state::checkpoint::Checkpoint;
use crate::state::dir::{task_dir, write_offsets_hint, StateDir};
use crate::state::engine::{Db, Marker, StateError};
use crate::state::restore::ChangelogReader;
use crate::state::store::TaskStore;
use crate::state::warm::{Warm, WarmStores};
use crate::topology::Changelog;

/// How long a start waits for its learner's handover before it opens the stores on disk.
const HANDOVER_PATIENCE: Duration = Duration::from_secs(60);

/// Opens one store of a task and checks its marker against the changelog (taking `warm`,
/// the store open already, if given). A store that cannot be trusted is wiped (with a log
/// line saying why) and read from the beginning. Returns it with its changelog reader,
/// positioned where its data ends.
fn open_store(
    state: &StateDir,
    kafka: &KafkaSettings,
    task: &str,
    dir: &std::path::Path,
    changelog: &Changelog,
    partition: i32,
    warm: Option<Db>,
) -> Result<(Db, ChangelogReader), StateError> {
    let began = std::time::Instant::now();
    let bounds = state.changelog_bounds(&changelog.topic, partition)?;
    let mut reader = ChangelogReader::with_bounds(kafka, &changelog.topic, partition, bounds);
    let read_bounds = began.elapsed();
    let (db, from) = state.prepare_store(task, dir, changelog, partition, reader.bounds(), warm)?;
    tracing::debug!(
        target: "handover", task = %task, store = %changelog.store, bounds_ms = read_bounds.as_millis() as u64,
        open_ms = (began.elapsed() - read_bounds).as_millis() as u64, "store opened"
    );
    reader.seek(from).map_err(StateError::retryable)?;
    Ok((db, reader))
}

/// A task's stores and the changelog of each (in declaration order).
pub struct TaskState {
    dir: PathBuf,
    changelogs: Vec<Changelog>,
}

/// Replays a store's changelog from where its data ends to the changelog's end (logged and
/// measured). False: `stop` said to stop first (what was restored is kept).
fn restore(
    opening: &Opening<'_>,
    db: &Db,
    reader: &mut ChangelogReader,
    changelog: &Changelog,
) -> Result<bool, String> {
    let (task, task_id, metrics, store) = (opening.task, opening.task_id, opening.metrics, &changelog.store);
    let start = reader.position();
    let labels = StoreLabels {
        topology: task_id.topology.to_string(),
        task: task.into(),
        store: store.clone(),
    };
    let counter = metrics.restored_records.get_or_create(&labels).clone();
    let mut reported = 0;
    if reader.end() > start {
        tracing::info!(task = %task, store = %store, changelog = %changelog.topic, from = start, to = reader.end(), "restoring");
    }
    let progress = reader.restore_into(&**db, &changelog.topic_id, opening.stop, |p| {
        opening.progress.restoring(task_id, p.restored, p.total, p.rate());
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
    let Some(progress) = progress else {
        tracing::info!(task = %task, store = %store, at = reader.position(), "stopped while restoring; what was restored is kept");
        return Ok(false);
    };
    tracing::info!(
        task = %task, store = %store, from_offset = start, records = progress.restored,
        mb = %format!("{:.1}", progress.bytes as f64 / 1e6),
        seconds = %format!("{:.2}", progress.elapsed.as_secs_f64()),
        "restored {} records", progress.restored
    );
    Ok(true)
}

/// How opening a task's state ended.
pub enum Opened {
    Ready(TaskState, Vec<NamedStore>),
    /// `stop` was set while restoring.
    Stopped,
}

/// What opening a task's state needs.
pub struct Opening<'a> {
    pub state: &'a StateDir,
    pub kafka: &'a KafkaSettings,
    /// Where the restorations' Kafka clients are dropped.
    pub drops: &'a Drops,
    pub task_id: &'a TaskId,
    pub task: &'a str,
    pub changelogs: Vec<Changelog>,
    pub metrics: &'a Metrics,
    pub progress: &'a dyn TaskProgress,
    pub stop: &'a dyn Fn() -> bool,
    /// Its stores open already (handed over by its learner, or left by its last run here).
    pub warm: Option<Warm>,
}

impl TaskState {
    /// Opens and restores every store of a task (each restoration is logged and measured),
    /// checking `stop` between batches. Returns the stores for the instance.
    pub fn open(mut opening: Opening<'_>) -> Result<Opened, String> {
        let (state, kafka, drops, task_id, task) = (
            opening.state,
            opening.kafka,
            opening.drops,
            opening.task_id,
            opening.task,
        );
        let partition = task_id.partition as i32;
        let dir = task_dir(&state.dir, task_id);
        let waited = std::time::Instant::now();
        let mut warm: WarmStores = match opening.warm.take() {
            None => WarmStores::new(),
            Some(warm) => match warm.take(opening.stop, HANDOVER_PATIENCE) {
                Some(stores) => stores,
                None => return Ok(Opened::Stopped),
            },
        };
        if waited.elapsed() >= Duration::from_millis(1) {
            tracing::debug!(target: "handover", task = %task, ms = waited.elapsed().as_millis() as u64, "waited for the learner's handover");
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating state directory {}: {e}", dir.display()))?;
        let mut stores = Vec::new();
        for changelog in &opening.changelogs {
            let store = &changelog.store;
            let (db, mut reader) = open_store(state, kafka, task, &dir, changelog, partition, warm.remove(store))?;
            let restored = restore(&opening, &db, &mut reader, changelog)?;
            // Destroying a Kafka client takes about 100 ms (librdkafka joins its threads):
            // not on the start's path, where the task's new owner waits for it.
            drops.later(reader);
            if !restored {
                return Ok(Opened::Stopped);
            }
            state.queryable(&task_id.topology, partition, store, &db);
            stores.push(NamedStore {
                name: store.clone(),
                store: Box::new(TaskStore::new(store, db)),
            });
        }
        let task_state = TaskState {
            dir,
            changelogs: opening.changelogs,
        };
        let hint = std::time::Instant::now();
        task_state.write_offsets_hint(&mut stores)?;
        tracing::debug!(target: "handover", task = %task, ms = hint.elapsed().as_millis() as u64, "offsets hint written");
        Ok(Opened::Ready(task_state, stores))
    }

    /// The open databases of the task's stores, taken off them (and off interactive
    /// queries): its committed state, for the next user of the stores here.
    pub fn release(&self, state: &StateDir, task: &TaskId, stores: Vec<NamedStore>) -> WarmStores {
        let warm: WarmStores = stores
            .into_iter()
            .filter_map(|named| Some((named.name, named.store.into_db()?)))
            .collect();
        state.forget_queryable(&task.topology, task.partition as i32, warm.keys().cloned());
        warm
    }

    /// The changelog of a store.
    pub fn changelog(&self, store: &str) -> Option<&Changelog> {
        self.changelogs.iter().find(|c| c.store == store)
    }

    /// Step 3: moves each store's writes into its database with its new marker. `acknowledged`
    /// gives the highest acknowledged offset of a changelog topic (none: nothing new).
    pub fn commit(&self, stores: &mut [NamedStore], acknowledged: impl Fn(&str) -> Option<i64>) -> Result<(), String> {
        let mut committed = false;
        for named in stores.iter_mut() {
            let Some(store) = named.store.logged() else {
                continue;
            };
            let changelog = self
                .changelog(&named.name)
                .ok_or_else(|| format!("store {} has no changelog", named.name))?;
            let Some(offset) = acknowledged(&changelog.topic) else {
                continue;
            };
            let marker = Marker {
                topic: changelog.topic.clone(),
                topic_id: changelog.topic_id.clone(),
                next_offset: offset + 1,
            };
            store.commit(&marker)?;
            committed = true;
        }
        if committed {
            self.write_offsets_hint(stores)?;
        }
        Ok(())
    }

    /// Drops every store's writes since the last commit (stopping without a commit).
    pub fn discard(&self, stores: &mut [NamedStore]) {
        for named in stores.iter_mut() {
            if let Some(store) = named.store.logged() {
                store.discard();
            }
        }
    }

    /// Writes the offsets hint (`state::dir::offsets_hint`): each store's changelog position.
    fn write_offsets_hint(&self, stores: &mut [NamedStore]) -> Result<(), String> {
        let mut hint = Checkpoint::new();
        for named in stores.iter_mut() {
            if let Some(store) = named.store.logged() {
                if let Some(marker) = store.db().read_marker()? {
                    hint.insert(named.name.clone(), marker.next_offset);
                }
            }
        }
        write_offsets_hint(&self.dir, &hint)
    }
}
