//! The standby thread's decisions, on changelog partitions and stores in memory: restore,
//! tailing, catch-up and handover, removal in the middle of a restore, errors and retries.

use std::path::PathBuf;

use super::super::changelogs::memory::{MemoryChangelogs, MemoryTopics};
use super::*;
use crate::kafka::KafkaSettings;
use crate::state::engine::Storage;
use crate::state::memory::MemoryStorage;
use crate::state::warm::{handover, Waited};

struct Fixture {
    topics: MemoryTopics,
    storage: Arc<MemoryStorage>,
    state: Arc<StateDir>,
    standbys: Standbys<MemoryChangelogs>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.state.dir);
    }
}

fn fixture() -> Fixture {
    let topics = MemoryTopics::default();
    let storage = MemoryStorage::new();
    let dir = std::env::temp_dir().join(format!("sluice-standbys-{}", uuid::Uuid::new_v4().simple()));
    let state = Arc::new(StateDir::new(dir, storage.clone(), &KafkaSettings::new("127.0.0.1:9")));
    let standbys = Standbys::new(topics.consumer(), state.clone(), None);
    Fixture {
        topics,
        storage,
        state,
        standbys,
    }
}

fn task(p: u32) -> TaskId {
    TaskId::of("wc", None, p)
}

fn changelogs() -> Vec<Changelog> {
    vec![Changelog {
        store: "counts".into(),
        topic: "wc-counts-changelog".into(),
        topic_id: "id".into(),
    }]
}

const TOPIC: &str = "wc-counts-changelog";

impl Fixture {
    fn write(&self, partition: i32, from: u32, to: u32) {
        for i in from..to {
            self.topics
                .append(TOPIC, partition, format!("k{i}").as_bytes(), Some(&i.to_be_bytes()));
        }
    }

    fn path(&self, p: u32) -> PathBuf {
        task_dir(&self.state.dir, &task(p)).join("counts")
    }

    /// The store of task `p` as it is durable (opened anew: its standby must have let go).
    fn stored(&self, p: u32) -> (Option<Marker>, usize) {
        let db = self.storage.open(&self.path(p)).expect("closed by its standby");
        (db.read_marker().unwrap(), db.dump().unwrap().len())
    }

    fn rounds(&mut self, n: usize) {
        for _ in 0..n {
            self.standbys.round();
        }
    }
}

#[test]
fn a_standby_restores_its_changelog_tails_it_and_checkpoints_when_removed() {
    let mut f = fixture();
    f.topics.create(TOPIC, 2);
    f.write(0, 0, 300);
    f.write(1, 0, 5);
    f.standbys.add(&task(0), &changelogs(), WarmStores::new()).unwrap();
    f.rounds(1);
    f.standbys.publish_positions();
    assert_eq!(f.standbys.positions.lock().unwrap()[&task(0)], 300, "read to the end");
    f.write(0, 300, 310);
    f.topics.append_marker(TOPIC, 0);
    f.rounds(1);
    assert_eq!(
        f.standbys.positions.lock().unwrap()[&task(0)],
        311,
        "past the marker too"
    );
    let (applied, warm) = f.standbys.remove(&task(0), false).unwrap();
    assert_eq!(applied, 310);
    assert!(warm.is_empty(), "not handed over: closed");
    let (marker, entries) = f.stored(0);
    assert_eq!((marker.unwrap().next_offset, entries), (311, 310));
    assert_eq!(
        offsets_hint(&task_dir(&f.state.dir, &task(0))),
        Some(std::collections::BTreeMap::from([("counts".to_string(), 311)]))
    );
    // Partition 1 was never read: nobody asked for it.
    assert!(f.storage.open(&f.path(1)).unwrap().is_empty());
}

#[test]
fn a_promoted_learner_reads_the_tail_and_hands_its_stores_over_open() {
    let mut f = fixture();
    f.topics.create(TOPIC, 2);
    f.write(0, 0, 100);
    f.write(1, 0, 100);
    for p in [0, 1] {
        f.standbys.add(&task(p), &changelogs(), WarmStores::new()).unwrap();
    }
    f.rounds(1);
    // The old owner's last commits, after the learner's last round.
    f.write(0, 100, 120);
    let (sender, handover) = handover();
    f.standbys.hand_over_all(vec![(task(0), sender)]);
    let Waited::Stores(mut stores) = handover.wait(&|| false, Duration::from_secs(1)) else {
        panic!("the stores were handed over");
    };
    let db = stores.remove("counts").expect("its one store");
    assert!(f.storage.is_open(&f.path(0)), "open, not closed and opened again");
    assert_eq!(
        db.read_marker().unwrap().unwrap().next_offset,
        120,
        "caught up with the tail"
    );
    assert_eq!(db.dump().unwrap().len(), 120);
    assert!(!f.standbys.standbys.contains_key(&task(0)));
    // The other learner goes on (its partition was paused for the catch-up, then resumed).
    f.write(1, 100, 110);
    f.rounds(1);
    f.standbys.publish_positions();
    assert_eq!(f.standbys.positions.lock().unwrap()[&task(1)], 110);
}

#[test]
fn a_standby_started_on_its_tasks_open_stores_reads_on_from_their_marker() {
    let mut f = fixture();
    f.topics.create(TOPIC, 1);
    f.write(0, 0, 50);
    // The task ran here and committed up to 40; its stores come back open.
    let db = f.storage.open(&f.path(0)).unwrap();
    let data: Vec<(Vec<u8>, Option<Vec<u8>>)> = (0..40u32)
        .map(|i| (format!("k{i}").into_bytes(), Some(i.to_be_bytes().to_vec())))
        .collect();
    let marker = Marker {
        topic: TOPIC.into(),
        topic_id: "id".into(),
        next_offset: 40,
    };
    db.write_with_marker(&mut crate::state::engine::as_slices(&data), &marker, true)
        .unwrap();
    f.standbys
        .add(&task(0), &changelogs(), WarmStores::from([("counts".to_string(), db)]))
        .unwrap();
    f.rounds(1);
    let (applied, _) = f.standbys.remove(&task(0), false).unwrap();
    assert_eq!(applied, 10, "only what the task had not committed");
    assert_eq!(
        f.stored(0),
        (
            Some(Marker {
                next_offset: 50,
                ..marker
            }),
            50
        )
    );
}

#[test]
fn a_standby_removed_in_the_middle_of_a_restore_keeps_what_it_applied() {
    let mut f = fixture();
    f.topics.create(TOPIC, 1);
    f.write(0, 0, 1_000);
    f.standbys.add(&task(0), &changelogs(), WarmStores::new()).unwrap();
    // Part of the changelog read and applied, the rest not yet.
    f.standbys.read(600, Duration::ZERO, false);
    f.standbys.apply_all(false);
    let (applied, _) = f.standbys.remove(&task(0), false).unwrap();
    assert_eq!(applied, 600);
    let (marker, entries) = f.stored(0);
    assert_eq!(
        (marker.unwrap().next_offset, entries),
        (600, 600),
        "its marker vouches for what it holds"
    );
    // Added again, it reads on from there.
    f.standbys.add(&task(0), &changelogs(), WarmStores::new()).unwrap();
    f.rounds(1);
    let (applied, _) = f.standbys.remove(&task(0), false).unwrap();
    assert_eq!(applied, 400);
    assert_eq!(f.stored(0).1, 1_000);
}

#[test]
fn a_standby_that_cannot_start_is_tried_again_and_one_that_fails_reports_it_when_removed() {
    let mut f = fixture();
    f.topics.create(TOPIC, 2);
    f.write(0, 0, 10);
    // The broker is away: no bounds, no standby; tried again later.
    f.topics.unreachable(true);
    f.standbys
        .add_or_retry(task(0), changelogs(), WarmStores::new(), RETRY_ADD);
    assert!(f.standbys.standbys.is_empty());
    assert_eq!(f.standbys.retries.len(), 1);
    f.topics.unreachable(false);
    f.standbys.retry_adds();
    assert_eq!(f.standbys.retries.len(), 1, "not before its time");
    f.standbys.retries[0].at = Instant::now();
    f.standbys.retry_adds();
    assert!(f.standbys.standbys.contains_key(&task(0)) && f.standbys.retries.is_empty());
    // Its store is busy elsewhere (a task letting go of it): tried again, after longer.
    let held = f.storage.open(&f.path(1)).unwrap();
    f.standbys
        .add_or_retry(task(1), changelogs(), WarmStores::new(), RETRY_ADD);
    assert!(!f.standbys.standbys.contains_key(&task(1)));
    assert_eq!(f.standbys.retries.len(), 1);
    assert_eq!(f.standbys.retries[0].next_wait, RETRY_ADD * 2, "the wait doubles");
    drop(held);
    // A disk that refuses writes: the standby stops applying and says why when removed.
    f.storage.failing(true);
    f.rounds(1);
    let e = f.standbys.remove(&task(0), false).err().expect("it failed");
    assert!(e.contains("disk is full"), "{e}");
    assert!(!f.storage.is_open(&f.path(0)));
    f.storage.failing(false);
    // A learner that fails on its tail hands nothing over: its task opens what is on disk,
    // closed by then.
    f.standbys.retries[0].at = Instant::now();
    f.standbys.retry_adds();
    assert!(f.standbys.standbys.contains_key(&task(1)));
    f.write(1, 0, 5);
    f.storage.failing(true);
    let (sender, handover) = handover();
    f.standbys.hand_over_all(vec![(task(1), sender)]);
    assert!(matches!(
        handover.wait(&|| false, Duration::from_secs(1)),
        Waited::Nothing
    ));
    assert!(!f.storage.is_open(&f.path(1)), "closed before the start opens it");
}

#[test]
fn the_offset_sums_of_local_state_come_from_the_hints() {
    let mut f = fixture();
    f.topics.create(TOPIC, 1);
    f.write(0, 0, 7);
    f.standbys.add(&task(0), &changelogs(), WarmStores::new()).unwrap();
    f.rounds(1);
    f.standbys.remove(&task(0), false).unwrap();
    let hint = offsets_hint(&task_dir(&f.state.dir, &task(0))).unwrap();
    assert_eq!(hint.values().sum::<i64>(), 7);
}
