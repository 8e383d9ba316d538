//! Property tests of the assignors over random groups, up to 1,000 workers and 50,000 tasks.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use super::assignor::{by_name, quotas, Assignor, AssignorInput, LearnerPolicy, Sticky};
use super::metadata::{Assignment, MemberMetadata, CURRENT_VERSION};
use super::TaskId;

/// xorshift64*: deterministic, good enough to shuffle test inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct Group {
    members: BTreeMap<String, MemberMetadata>,
    tasks: Vec<TaskId>,
    stateful: HashSet<Arc<str>>,
    end_offsets: HashMap<TaskId, i64>,
    replicas: u32,
}

impl Group {
    fn random(rng: &mut Rng, workers: usize, tasks: usize, replicas: u32) -> Group {
        let topologies = 1 + rng.below(5) as usize;
        let mut all = Vec::with_capacity(tasks);
        let mut stateful = HashSet::new();
        for t in 0..topologies {
            let name: Arc<str> = format!("topology-{t}").into();
            if rng.below(2) == 0 {
                stateful.insert(name.clone());
            }
            let n = if t + 1 == topologies {
                tasks - all.len()
            } else {
                tasks / topologies
            };
            all.extend((0..n as u32).map(|p| TaskId {
                sub: None,
                topology: name.clone(),
                partition: p,
            }));
        }
        let end_offsets = all
            .iter()
            .filter(|t| stateful.contains(&t.topology))
            .map(|t| (t.clone(), 1000))
            .collect();
        let mut group = Group {
            members: BTreeMap::new(),
            tasks: all,
            stateful,
            end_offsets,
            replicas,
        };
        for _ in 0..workers {
            let capacity = 1 + rng.below(4) as u32;
            group.add_member(rng, capacity);
        }
        group
    }

    fn add_member(&mut self, rng: &mut Rng, capacity: u32) -> String {
        let id = format!("member-{:016x}", rng.next());
        let meta = MemberMetadata {
            version: CURRENT_VERSION,
            supported: CURRENT_VERSION,
            capacity,
            ..Default::default()
        };
        self.members.insert(id.clone(), meta);
        id
    }

    fn assign(&self, assignor: &dyn Assignor) -> BTreeMap<String, Assignment> {
        assignor.assign(&AssignorInput {
            members: &self.members,
            tasks: &self.tasks,
            stateful: &self.stateful,
            end_offsets: &self.end_offsets,
            standby_replicas: self.replicas,
            learners: LearnerPolicy::NONE,
        })
    }

    /// What members report after applying an assignment: their tasks, caught up.
    fn apply(&mut self, assignments: &BTreeMap<String, Assignment>) {
        for (id, a) in assignments {
            let m = self.members.get_mut(id).unwrap();
            m.active = a.active.clone();
            m.standby = a.standby.clone();
            m.offset_sums = a
                .active
                .iter()
                .chain(&a.standby)
                .filter(|t| self.stateful.contains(&t.topology))
                .map(|t| (t.clone(), self.end_offsets[t]))
                .collect();
        }
    }

    /// Assigns and applies until nobody is asked to rejoin; checks each round's safety.
    fn converge(&mut self, assignor: &dyn Assignor) -> usize {
        for round in 1..=4 {
            let assignments = self.assign(assignor);
            check_round(self, &assignments);
            self.apply(&assignments);
            if !assignments.values().any(|a| a.rejoin) {
                return round;
            }
        }
        panic!("no convergence within 4 rounds");
    }

    fn owners(&self) -> HashMap<TaskId, String> {
        let mut out = HashMap::new();
        for (id, m) in &self.members {
            for t in &m.active {
                out.insert(t.clone(), id.clone());
            }
        }
        out
    }
}

/// Safety in every round: no task active twice, revoked tasks not active, standbys apart
/// from the active.
fn check_round(group: &Group, assignments: &BTreeMap<String, Assignment>) {
    let mut active: HashMap<&TaskId, &str> = HashMap::new();
    for (id, a) in assignments {
        for t in &a.active {
            assert!(active.insert(t, id).is_none(), "{t} is active on two members");
        }
    }
    for (id, a) in assignments {
        for t in &a.revoked {
            // Cooperative: a revoked task may stay only where it already was (a duplicate
            // claim resolved); it reaches a new owner in a later round.
            if let Some(holder) = active.get(t) {
                assert!(
                    group.members[*holder].active.contains(t),
                    "{t} is revoked from {id} and handed to {holder} in the same round"
                );
            }
        }
        for t in &a.standby {
            assert_ne!(
                active.get(t),
                Some(&id.as_str()),
                "{t}: standby on its active member {id}"
            );
            assert!(
                group.stateful.contains(&t.topology),
                "{t}: a standby of a stateless task"
            );
        }
    }
}

/// After convergence: every task active exactly once, load within one task of the
/// capacity-proportional share, the requested standbys everywhere.
fn check_converged(group: &Group) {
    let owners = group.owners();
    assert_eq!(owners.len(), group.tasks.len(), "every task is active somewhere");
    let capacities: Vec<u32> = group.members.values().map(|m| m.capacity).collect();
    let total_capacity: u32 = capacities.iter().sum();
    for m in group.members.values() {
        let exact = group.tasks.len() as f64 * m.capacity as f64 / total_capacity as f64;
        assert!(
            (m.active.len() as f64 - exact).abs() < 1.0,
            "{} tasks for a share of {exact:.2}",
            m.active.len()
        );
    }
    let expected = (group.replicas as usize).min(group.members.len() - 1);
    let mut standbys: HashMap<&TaskId, usize> = HashMap::new();
    for m in group.members.values() {
        for t in &m.standby {
            *standbys.entry(t).or_default() += 1;
        }
    }
    for t in group.tasks.iter().filter(|t| group.stateful.contains(&t.topology)) {
        assert_eq!(standbys.get(t).copied().unwrap_or(0), expected, "{t}: standbys");
    }
}

fn moved(before: &HashMap<TaskId, String>, after: &HashMap<TaskId, String>) -> Vec<(TaskId, String)> {
    after
        .iter()
        .filter(|(t, id)| before.get(*t) != Some(*id))
        .map(|(t, id)| (t.clone(), id.clone()))
        .collect()
}

fn join_and_leave(seed: u64, workers: usize, tasks: usize, replicas: u32) {
    let mut rng = Rng(seed.max(1));
    let mut group = Group::random(&mut rng, workers, tasks, replicas);
    group.converge(&Sticky);
    check_converged(&group);

    // A worker joins: only tasks that end up on it move.
    let before = group.owners();
    let capacity = 1 + rng.below(4) as u32;
    let newcomer = group.add_member(&mut rng, capacity);
    group.converge(&Sticky);
    check_converged(&group);
    let moves = moved(&before, &group.owners());
    assert!(
        moves.iter().all(|(_, to)| *to == newcomer),
        "a task moved between old workers"
    );
    assert_eq!(moves.len(), group.members[&newcomer].active.len());

    // A worker leaves: only its tasks move.
    let before = group.owners();
    let leaver = group
        .members
        .keys()
        .nth(rng.below(group.members.len() as u64) as usize)
        .unwrap()
        .clone();
    let had = group.members.remove(&leaver).unwrap().active.len();
    group.converge(&Sticky);
    check_converged(&group);
    let moves = moved(&before, &group.owners());
    assert!(
        moves.iter().all(|(t, _)| before[t] == leaver),
        "a task of a remaining worker moved"
    );
    assert_eq!(moves.len(), had);
}

#[test]
fn sticky_is_safe_balanced_and_moves_little_on_random_groups() {
    let mut rng = Rng(0x5eed);
    for _ in 0..40 {
        let workers = 2 + rng.below(60) as usize;
        let tasks = 1 + rng.below(3_000) as usize;
        join_and_leave(rng.next(), workers, tasks, rng.below(3) as u32);
    }
}

#[test]
fn sticky_at_1000_workers_and_50000_tasks() {
    let started = Instant::now();
    let mut rng = Rng(42);
    let mut group = Group::random(&mut rng, 1_000, 50_000, 1);
    let one = Instant::now();
    let first = group.assign(&Sticky);
    let first_ms = one.elapsed().as_secs_f64() * 1e3;
    check_round(&group, &first);
    group.apply(&first);
    group.converge(&Sticky);
    check_converged(&group);
    let one = Instant::now();
    let steady = group.assign(&Sticky);
    let steady_ms = one.elapsed().as_secs_f64() * 1e3;
    assert!(
        steady.values().all(|a| a.revoked.is_empty() && !a.rejoin),
        "a converged group stays put"
    );

    // The leader's JoinGroup response carries every member's metadata; each member's
    // SyncGroup response carries its own assignment.
    let metadata: usize = group.members.values().map(|m| m.encode(CURRENT_VERSION).len()).sum();
    let largest_assignment = steady.values().map(|a| a.encode(CURRENT_VERSION).len()).max().unwrap();
    let all_assignments: usize = steady.values().map(|a| a.encode(CURRENT_VERSION).len()).sum();
    println!(
        "sticky, 1000 workers x 50000 tasks (1 standby): first assignment {first_ms:.0} ms, steady {steady_ms:.0} ms; \
         metadata of all members {metadata} bytes, assignments {all_assignments} bytes in all (largest {largest_assignment}); \
         whole test {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        metadata < 1_000_000,
        "JoinGroup metadata of 1000 members is {metadata} bytes"
    );
    join_and_leave(7, 1_000, 50_000, 1);
}

#[test]
fn eager_revokes_everything_and_reassigns_balanced() {
    let mut rng = Rng(9);
    let mut group = Group::random(&mut rng, 20, 500, 0);
    let eager = by_name("eager").unwrap();
    group.converge(eager.as_ref());
    check_converged(&group);
    let before = group.owners();
    group.add_member(&mut rng, 2);
    let assignments = group.assign(eager.as_ref());
    // Every worker gives up everything it had, whether or not it moves.
    for (id, a) in &assignments {
        assert_eq!(a.revoked.len(), group.members[id].active.len());
    }
    group.apply(&assignments);
    check_converged(&group);
    assert!(moved(&before, &group.owners()).len() > group.members.values().last().unwrap().active.len() / 2);
}

#[test]
fn quotas_follow_capacity_within_one_task() {
    assert_eq!(quotas(&[1, 1, 1], 10), vec![4, 3, 3]);
    assert_eq!(quotas(&[1, 3], 8), vec![2, 6]);
    assert_eq!(quotas(&[2, 1], 0), vec![0, 0]);
    assert_eq!(quotas(&[4, 1, 1], 5).iter().sum::<usize>(), 5);
}

#[test]
fn duplicate_and_unknown_claims_are_revoked() {
    let mut rng = Rng(3);
    let mut group = Group::random(&mut rng, 3, 6, 0);
    let t = group.tasks[0].clone();
    for m in group.members.values_mut() {
        m.active = vec![t.clone(), TaskId::new("gone", 0)];
    }
    let assignments = group.assign(&Sticky);
    check_round(&group, &assignments);
    let holders = assignments.values().filter(|a| a.active.contains(&t)).count();
    assert_eq!(holders, 1);
    assert!(assignments
        .values()
        .all(|a| a.revoked.contains(&TaskId::new("gone", 0))));
}

/// One round of the sticky assignor with learners (no standbys), checked by [`check_round`].
fn learning_round(
    members: &BTreeMap<String, MemberMetadata>,
    tasks: &[TaskId],
    stateful: &HashSet<Arc<str>>,
    end_offsets: &HashMap<TaskId, i64>,
    max_learners: usize,
) -> BTreeMap<String, Assignment> {
    let group = Group {
        members: members.clone(),
        tasks: tasks.to_vec(),
        stateful: stateful.clone(),
        end_offsets: end_offsets.clone(),
        replicas: 0,
    };
    let out = Sticky.assign(&AssignorInput {
        members,
        tasks,
        stateful,
        end_offsets,
        standby_replicas: 0,
        learners: LearnerPolicy {
            max_learners,
            acceptable_lag: 100,
        },
    });
    check_round(&group, &out);
    out
}

/// Scale 1 → 2 with learners: the joining member learns first and takes over only what it
/// has caught up on; no task is ever active twice or without an owner.
#[test]
fn a_joining_member_learns_first_and_takes_over_once_caught_up() {
    let tasks: Vec<TaskId> = (0..8).map(|p| TaskId::new("counts", p)).collect();
    let end_offsets: HashMap<TaskId, i64> = tasks.iter().map(|t| (t.clone(), 1000)).collect();
    let member = |active: &[TaskId], learner: &[TaskId], sums: &[(TaskId, i64)]| MemberMetadata {
        version: CURRENT_VERSION,
        supported: CURRENT_VERSION,
        capacity: 1,
        active: active.to_vec(),
        learner: learner.to_vec(),
        offset_sums: sums.to_vec(),
        ..Default::default()
    };
    let caught_up = |list: &[TaskId], sum: i64| list.iter().map(|t| (t.clone(), sum)).collect::<Vec<_>>();
    let stateful: HashSet<Arc<str>> = [Arc::from("counts")].into();
    let assign = |members: &BTreeMap<String, MemberMetadata>, max_learners: usize| {
        learning_round(members, &tasks, &stateful, &end_offsets, max_learners)
    };

    // b joins: a keeps all 8 active; b learns 4; nothing is revoked, nobody rejoins.
    let mut members: BTreeMap<String, MemberMetadata> = [
        ("a".to_string(), member(&tasks, &[], &caught_up(&tasks, 1000))),
        ("b".to_string(), member(&[], &[], &[])),
    ]
    .into();
    let out = assign(&members, 8);
    assert_eq!(out["a"].active, tasks);
    assert!(out["a"].revoked.is_empty());
    assert_eq!(out["b"].learner.len(), 4);
    assert!(out["b"].active.is_empty());
    assert!(!out["a"].rejoin);
    let learning = out["b"].learner.clone();

    // At most `max_learners` at once.
    assert_eq!(assign(&members, 2)["b"].learner.len(), 2);

    // Halfway (lag 500): still learning, the same tasks.
    members.insert("b".into(), member(&[], &learning, &caught_up(&learning, 500)));
    let out = assign(&members, 8);
    assert_eq!(out["b"].learner, learning);
    assert_eq!(out["a"].active, tasks);

    // Caught up on two of them (lag 50 ≤ 100): those two are revoked from a, b keeps
    // learning all four, and everyone rejoins.
    let mut sums = caught_up(&learning[..2], 950);
    sums.extend(caught_up(&learning[2..], 500));
    members.insert("b".into(), member(&[], &learning, &sums));
    let out = assign(&members, 8);
    assert_eq!(out["a"].revoked, learning[..2].to_vec());
    assert_eq!(out["a"].active.len(), 6);
    assert_eq!(out["b"].learner, learning);
    assert!(out["a"].rejoin && out["b"].rejoin);

    // Next generation: the two go to b (its learners), the other two are still learned.
    let a_active = out["a"].active.clone();
    members.insert("a".into(), member(&a_active, &[], &caught_up(&a_active, 1000)));
    let out = assign(&members, 8);
    assert_eq!(out["b"].active, learning[..2].to_vec());
    assert_eq!(out["b"].learner, learning[2..].to_vec());
    assert_eq!(out["a"].active, a_active);

    // Without learners the same join moves 4 tasks at once (revoked now, owned next).
    let members: BTreeMap<String, MemberMetadata> = [
        ("a".to_string(), member(&tasks, &[], &caught_up(&tasks, 1000))),
        ("b".to_string(), member(&[], &[], &[])),
    ]
    .into();
    let out = assign(&members, 0);
    assert_eq!(out["a"].revoked.len(), 4);
    assert!(out["b"].learner.is_empty());
}

/// A member that began learning when it was the only one joining holds more learners than
/// its share once another joins: it keeps its share of them, and the rest are learned on
/// the newcomer, so the group ends balanced (4/4/4) instead of settling at 4/2/6 with no
/// rebalance to follow.
#[test]
fn a_learner_holder_over_its_share_gives_the_rest_to_a_later_joiner() {
    let tasks: Vec<TaskId> = (0..12).map(|p| TaskId::new("counts", p)).collect();
    let end_offsets: HashMap<TaskId, i64> = tasks.iter().map(|t| (t.clone(), 1000)).collect();
    let member = |active: &[TaskId], learner: &[TaskId], sum: i64| MemberMetadata {
        version: CURRENT_VERSION,
        supported: CURRENT_VERSION,
        capacity: 1,
        active: active.to_vec(),
        learner: learner.to_vec(),
        offset_sums: active.iter().chain(learner).map(|t| (t.clone(), sum)).collect(),
        ..Default::default()
    };
    let members: BTreeMap<String, MemberMetadata> = [
        ("a".to_string(), member(&tasks, &[], 1000)),
        ("b".to_string(), member(&[], &[], 0)),
        ("c".to_string(), member(&[], &tasks[6..], 500)),
    ]
    .into();
    let stateful: HashSet<Arc<str>> = [Arc::from("counts")].into();
    let out = learning_round(&members, &tasks, &stateful, &end_offsets, 12);
    assert_eq!(out["a"].active, tasks, "{out:?}");
    assert_eq!(out["c"].learner.len(), 4, "{out:?}");
    assert!(
        out["c"].learner.iter().all(|t| tasks[6..].contains(t)),
        "c keeps learning its own: {out:?}"
    );
    assert_eq!(out["b"].learner.len(), 4, "{out:?}");
}

/// A two-stage topology scaled down from three workers to two: the leaving worker's
/// stateful `count` tasks are learned on the worker below its share of counts while it has
/// room (not on the one above its share, though that one holds their state from before),
/// and each goes to its learner once caught up; stateless tasks never take that room, and
/// no stateful task restores from the changelog to move.
#[test]
fn a_drained_stateful_task_is_learned_where_counts_are_few_and_goes_to_its_learner() {
    let split = |p| TaskId::of("wc", Some("split"), p);
    let count = |p| TaskId::of("wc", Some("count"), p);
    // The placement lists sub-topologies in their declared order: split first.
    let tasks: Vec<TaskId> = (0..8).map(split).chain((0..8).map(count)).collect();
    let end_offsets: HashMap<TaskId, i64> = (0..8).map(|p| (count(p), 1000)).collect();
    let stateful: HashSet<Arc<str>> = [Arc::from("wc/count")].into();
    let member = |active: Vec<TaskId>, learner: Vec<TaskId>, warm: Vec<TaskId>, leaving: bool| MemberMetadata {
        version: CURRENT_VERSION,
        supported: CURRENT_VERSION,
        capacity: 1,
        offset_sums: warm.iter().map(|t| (t.clone(), 1000)).collect(),
        active,
        learner,
        leaving,
        ..Default::default()
    };
    let counts = |r: std::ops::Range<u32>| r.map(count).collect::<Vec<_>>();
    let splits = |r: std::ops::Range<u32>| r.map(split).collect::<Vec<_>>();
    let assign =
        |members: &BTreeMap<String, MemberMetadata>| learning_round(members, &tasks, &stateful, &end_offsets, 8);
    // w2 drains. w0 runs five counts and still holds the state of all eight; w1 runs six
    // splits and no count, so it has room for two: it learns two, w0 (caught up) the third.
    let mut members: BTreeMap<String, MemberMetadata> = [
        ("w0".to_string(), member(counts(0..5), vec![], counts(0..8), false)),
        ("w1".to_string(), member(splits(0..6), vec![], vec![], false)),
        (
            "w2".to_string(),
            member([counts(5..8), splits(6..8)].concat(), vec![], counts(5..8), true),
        ),
    ]
    .into();
    let out = assign(&members);
    assert_eq!(out["w1"].learner, counts(5..7), "{out:?}");
    assert_eq!(out["w0"].learner, vec![count(7)], "{out:?}");
    assert_eq!(out["w2"].active, counts(5..7));
    assert_eq!(out["w2"].revoked, vec![count(7), split(6), split(7)]);

    // Next: count/7 goes to its learner, before the splits take w0's room; the splits go
    // to w0 too (no splits there), not to w1 (above its share of them).
    members.insert("w0".into(), member(counts(0..5), vec![count(7)], counts(0..8), false));
    members.insert("w1".into(), member(splits(0..6), counts(5..7), vec![], false));
    members.insert("w2".into(), member(counts(5..7), vec![], counts(5..7), true));
    let out = assign(&members);
    assert_eq!(
        out["w0"].active,
        [counts(0..5), vec![count(7)], splits(6..8)].concat(),
        "{out:?}"
    );
    assert_eq!(out["w1"].learner, counts(5..7));

    // w1 caught up: revoked from w2; then w2 is gone and w1 gets them.
    let w0 = out["w0"].active.clone();
    members.insert("w0".into(), member(w0.clone(), vec![], counts(0..8), false));
    members.insert("w1".into(), member(splits(0..6), counts(5..7), counts(5..7), false));
    let out = assign(&members);
    assert_eq!(out["w2"].revoked, counts(5..7), "{out:?}");
    members.remove("w2");
    let out = assign(&members);
    assert_eq!(out["w1"].active, [counts(5..7), splits(0..6)].concat(), "{out:?}");
    assert_eq!(out["w0"].active, w0);
}
