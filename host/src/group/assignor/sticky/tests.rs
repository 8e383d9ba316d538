//! One test per phase of the sticky assignor, on groups small enough to follow by hand
//! (the property tests of the whole are in `group/assignor_tests.rs`).

use super::*;

fn task(topology: &str, partition: u32) -> TaskId {
    TaskId::new(topology, partition)
}

/// Tasks s/0..s/n of a stateful topology, then l/0..l/m of a stateless one.
fn some_tasks(stateful: u32, stateless: u32) -> (Vec<TaskId>, HashSet<Arc<str>>) {
    let tasks = (0..stateful)
        .map(|p| task("s", p))
        .chain((0..stateless).map(|p| task("l", p)))
        .collect();
    (tasks, HashSet::from([Arc::from("s")]))
}

fn empty(members: usize) -> Vec<Assignment> {
    vec![Assignment::default(); members]
}

#[test]
fn tasks_keep_state_by_topology_and_sub_topology() {
    let list = vec![
        task("s", 0),
        task("l", 0),
        TaskId::of("m", Some("agg"), 0),
        TaskId::of("m", Some("map"), 0),
    ];
    let stateful = HashSet::from([Arc::from("s"), Arc::from("m/agg")]);
    let tasks = Tasks::new(&list, &stateful);
    assert_eq!(tasks.keeps, vec![true, false, true, false]);
    assert_eq!(tasks.lookup(&task("l", 0)), Some(1));
    assert_eq!(tasks.lookup(&task("l", 1)), None);
}

#[test]
fn the_first_claim_of_a_task_owns_it_and_the_others_are_revoked() {
    let (list, stateful) = some_tasks(2, 0);
    let tasks = Tasks::new(&list, &stateful);
    let a = MemberMetadata {
        active: vec![task("s", 0), task("s", 1)],
        ..Default::default()
    };
    let b = MemberMetadata {
        active: vec![task("s", 1), task("gone", 0)],
        ..Default::default()
    };
    let mut out = empty(2);
    let owners = current_owners(&[&a, &b], &tasks, &mut out);
    assert_eq!(owners.owner, vec![0, 0]);
    assert_eq!(owners.held, vec![2, 0]);
    assert_eq!(owners.claimed, vec![vec![0, 1], vec![]]);
    assert!(out[0].revoked.is_empty());
    assert_eq!(out[1].revoked, vec![task("s", 1), task("gone", 0)]);
}

#[test]
fn warm_members_are_listed_least_lag_first_and_the_first_learner_learns() {
    let (list, stateful) = some_tasks(2, 0);
    let tasks = Tasks::new(&list, &stateful);
    let ends = HashMap::from([(task("s", 0), 100)]);
    let behind = MemberMetadata {
        offset_sums: vec![(task("s", 0), 90), (task("s", 1), 5)],
        ..Default::default()
    };
    // A standby that reports no offset sum: its lag is unknown (last).
    let unknown = MemberMetadata {
        standby: vec![task("s", 0)],
        ..Default::default()
    };
    let learner = MemberMetadata {
        offset_sums: vec![(task("s", 0), 100)],
        learner: vec![task("s", 0)],
        ..Default::default()
    };
    let late_learner = MemberMetadata {
        learner: vec![task("s", 0)],
        ..Default::default()
    };
    let warm = Warm::new(&[&behind, &unknown, &learner, &late_learner], &tasks, &ends);
    assert_eq!(warm.of(0), &[(0, 2), (10, 0), (i64::MAX, 1), (i64::MAX, 3)]);
    assert_eq!(warm.learner_of, vec![2, NONE]);
    assert_eq!(warm.lag_of(0, 0), Some(10));
    assert_eq!(warm.lag_of(0, 1), None, "no offset sum, no lag");
    // Task s/1: its changelogs' end is not known, so neither is anyone's lag.
    assert_eq!(warm.of(1), &[(0, 0)]);
    assert_eq!(warm.lag_of(1, 0), None);
}

#[test]
fn a_member_over_its_quota_keeps_each_class_to_its_target_then_stateful_tasks() {
    // Three stateful tasks (0, 1, 2), then two stateless (3, 4).
    let keeps = [true, true, true, false, false];
    let mine = [0, 1, 2, 3, 4];
    assert_eq!(keep_flags(&mine, &keeps, 5, [0, 0]), vec![true; 5], "within its quota");
    assert_eq!(
        keep_flags(&mine, &keeps, 3, [2, 1]),
        vec![true, false, false, true, true],
        "each class up to its target"
    );
    assert_eq!(
        keep_flags(&mine, &keeps, 4, [1, 1]),
        vec![true, true, true, true, false],
        "the room left goes to stateful tasks first"
    );
}

#[test]
fn keeping_within_quota_gives_up_the_rest() {
    let (list, stateful) = some_tasks(2, 2);
    let tasks = Tasks::new(&list, &stateful);
    let mut claimed = vec![vec![3, 0, 2, 1], vec![]];
    let mut loads = Loads::new(vec![2, 2], [vec![1, 1], vec![1, 1]]);
    let mut out = empty(2);
    let over = keep_within_quota(&mut claimed, &tasks, &mut loads, &mut out);
    // Sorted stateful first: s/0, s/1, l/0, l/1; one of each class kept.
    assert_eq!(out[0].active, vec![task("s", 0), task("l", 0)]);
    assert_eq!(over, vec![(1, 0), (3, 0)]);
    assert_eq!(
        (loads.load.clone(), loads.class_load.clone()),
        (vec![2, 0], [vec![1, 0], vec![1, 0]])
    );
}

/// Two members; member 0 must give up stateful task 0, whose state member 1 holds `lag`
/// records behind.
fn one_move(policy: LearnerPolicy, lag: i64) -> (Vec<Assignment>, Moves, Loads) {
    let (list, stateful) = some_tasks(1, 0);
    let tasks = Tasks::new(&list, &stateful);
    let giver = MemberMetadata::default();
    let taker = MemberMetadata {
        offset_sums: vec![(task("s", 0), 100 - lag)],
        ..Default::default()
    };
    let warm = Warm::new(&[&giver, &taker], &tasks, &HashMap::from([(task("s", 0), 100)]));
    let mut loads = Loads::new(vec![0, 1], [vec![0, 0], vec![0, 1]]);
    let mut out = empty(2);
    let moves = move_over_quota(vec![(0, 0)], &tasks, &warm, &mut loads, policy, &mut out);
    (out, moves, loads)
}

#[test]
fn a_task_over_quota_is_revoked_at_once_without_learners() {
    let (out, moves, _) = one_move(LearnerPolicy::NONE, 1_000);
    assert_eq!(out[0].revoked, vec![task("s", 0)]);
    assert!(out[1].learner.is_empty());
    assert_eq!((moves.moving[0], moves.learner_at[0]), (0, NONE));
}

#[test]
fn a_stateful_task_over_quota_stays_until_its_learner_caught_up() {
    let policy = LearnerPolicy {
        max_learners: 1,
        acceptable_lag: 10,
    };
    let (out, moves, loads) = one_move(policy, 1_000);
    assert_eq!(out[0].active, vec![task("s", 0)], "still active on its owner");
    assert_eq!(out[1].learner, vec![task("s", 0)]);
    assert_eq!((moves.moving[0], moves.learner_at[0]), (NONE, 1));
    assert_eq!(loads.load, vec![1, 0]);

    let (out, moves, _) = one_move(policy, 10);
    assert_eq!(out[0].revoked, vec![task("s", 0)], "caught up: revoked now");
    assert_eq!(out[1].learner, vec![task("s", 0)], "kept until it is active there");
    assert_eq!((moves.moving[0], moves.learner_at[0]), (0, 1));
}

#[test]
fn a_learner_goes_below_its_stateful_target_first_then_where_the_state_is() {
    let (list, stateful) = some_tasks(1, 0);
    let tasks = Tasks::new(&list, &stateful);
    let metas = [
        MemberMetadata::default(),
        MemberMetadata::default(),
        MemberMetadata {
            standby: vec![task("s", 0)],
            ..Default::default()
        },
    ];
    let warm = Warm::new(&metas.iter().collect::<Vec<_>>(), &tasks, &HashMap::new());
    // Members 1 and 2 have room; only member 1 is below its stateful target.
    let loads = Loads::new(vec![1, 1, 1], [vec![0, 0, 1], vec![1, 1, 0]]);
    assert_eq!(learner_destination(0, 0, &warm, &loads, &[0, 0, 0]), Some(1));
    // Both below it: the warm one.
    let loads = Loads::new(vec![1, 1, 1], [vec![0, 0, 0], vec![1, 1, 1]]);
    assert_eq!(learner_destination(0, 0, &warm, &loads, &[0, 0, 0]), Some(2));
    // No room left anywhere else (learners already on their way count).
    assert_eq!(learner_destination(0, 0, &warm, &loads, &[0, 1, 1]), None);
}

#[test]
fn unowned_tasks_go_to_their_learner_then_warm_members_then_the_emptiest() {
    // s/0 is learned on member 1 (full), s/1 is warm on member 0, l/0 and l/1 go by room.
    let (list, stateful) = some_tasks(2, 2);
    let tasks = Tasks::new(&list, &stateful);
    let metas = [
        MemberMetadata {
            standby: vec![task("s", 1)],
            ..Default::default()
        },
        MemberMetadata {
            learner: vec![task("s", 0)],
            ..Default::default()
        },
        MemberMetadata::default(),
    ];
    let warm = Warm::new(&metas.iter().collect::<Vec<_>>(), &tasks, &HashMap::new());
    let mut loads = Loads::new(vec![1, 1, 2], [vec![0, 0, 2], vec![1, 1, 0]]);
    loads.add(1, 1);
    let moves = Moves {
        moving: vec![NONE; 4],
        learner_at: vec![NONE; 4],
    };
    let mut out = empty(3);
    out[1].learner.push(task("s", 0));
    let owner = [NONE; 4];
    let active_owner = place_unowned(&owner, &tasks, &warm, &moves, &mut loads, &mut out);
    assert_eq!(active_owner, vec![1, 0, 2, 2]);
    assert_eq!(out[1].active, vec![task("s", 0)], "to its learner, past its quota");
    assert!(out[1].learner.is_empty(), "no longer a learner there");
    assert_eq!(out[0].active, vec![task("s", 1)]);
    assert_eq!(out[2].active, vec![task("l", 0), task("l", 1)]);
}

#[test]
fn standbys_avoid_the_active_and_the_giver_of_a_moving_task_keeps_one() {
    let (list, stateful) = some_tasks(2, 1);
    let tasks = Tasks::new(&list, &stateful);
    let metas = [
        MemberMetadata::default(),
        MemberMetadata::default(),
        MemberMetadata {
            standby: vec![task("s", 1)],
            ..Default::default()
        },
    ];
    let warm = Warm::new(&metas.iter().collect::<Vec<_>>(), &tasks, &HashMap::new());
    // s/0 is active on member 0; s/1 moves away from member 1 (revoked this generation).
    let moves = Moves {
        moving: vec![NONE, 1, NONE],
        learner_at: vec![NONE; 3],
    };
    let mut out = empty(3);
    place_standbys(1, &tasks, &warm, &moves, &[0, NONE, 2], &mut out);
    assert_eq!(out[0].standby, Vec::<TaskId>::new());
    assert_eq!(out[1].standby, vec![task("s", 0), task("s", 1)]);
    assert!(out[2].standby.is_empty(), "a stateless task has no standby");
    // Two replicas: s/1's second goes to the warm member.
    let mut out = empty(3);
    place_standbys(2, &tasks, &warm, &moves, &[0, NONE, 2], &mut out);
    assert_eq!(out[2].standby, vec![task("s", 0), task("s", 1)]);
    assert_eq!(out[1].standby, vec![task("s", 0), task("s", 1)]);
}
