//! The `sticky` assignor, phase by phase. Every per-task fact lives in a vector indexed by
//! the task's position in the input, so each claim costs one hash lookup (50,000 tasks ×
//! several maps used to dominate the run).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::{
    capacities, empty_assignments, finish, keeps_state, quotas_keeping, Assignor, AssignorInput, LearnerPolicy,
};
use crate::group::metadata::{Assignment, MemberMetadata};
use crate::group::TaskId;

/// Balanced by capacity, sticky, cooperative; standbys on other workers, preferring
/// caught-up ones.
pub struct Sticky;

impl Assignor for Sticky {
    fn name(&self) -> &'static str {
        "sticky"
    }

    fn assign(&self, input: &AssignorInput<'_>) -> BTreeMap<String, Assignment> {
        let metas: Vec<&MemberMetadata> = input.members.values().collect();
        let mut out = empty_assignments(input.members);
        if metas.is_empty() {
            return BTreeMap::new();
        }
        let tasks = Tasks::new(input.tasks, input.stateful);
        let Owners {
            owner,
            held,
            mut claimed,
        } = current_owners(&metas, &tasks, &mut out);
        let capacities = capacities(&metas);
        let quota = quotas_keeping(&capacities, tasks.len(), &held);
        // Targets per class, stateless (0) and stateful (1), adding up to each member's
        // quota. The quota is what a member holds; the targets only choose which tasks it
        // gives up and where moving tasks go, so that scaling does not leave one worker with
        // every stateful task and another with every stateless one, and no task moves only
        // to even the classes out.
        let target = class_targets(&capacities, &quota, &tasks.keeps, &claimed);
        let warm = Warm::new(&metas, &tasks, input.end_offsets);
        let mut loads = Loads::new(quota, target);
        let over = keep_within_quota(&mut claimed, &tasks, &mut loads, &mut out);
        let moves = move_over_quota(over, &tasks, &warm, &mut loads, input.learners, &mut out);
        let active_owner = place_unowned(&owner, &tasks, &warm, &moves, &mut loads, &mut out);
        place_standbys(
            input.standby_replicas as usize,
            &tasks,
            &warm,
            &moves,
            &active_owner,
            &mut out,
        );
        finish(input.members, out)
    }
}

/// No member (in the per-task vectors).
const NONE: usize = usize::MAX;

/// Splits each member's quota (`total`) into targets of stateless and stateful tasks
/// (`[0]`, `[1]`): the stateful share by capacity, sticky as [`quotas_keeping`] is, the rest
/// stateless. Where a member's quota is below its stateful share (few stateless tasks), a
/// stateful slot goes to a member with stateless room instead; so each member's targets add
/// up to its quota.
fn class_targets(capacities: &[u32], total: &[usize], keeps: &[bool], claimed: &[Vec<usize>]) -> [Vec<usize>; 2] {
    let stateful_held: Vec<usize> = claimed
        .iter()
        .map(|mine| mine.iter().filter(|&&x| keeps[x]).count())
        .collect();
    let stateful = keeps.iter().filter(|&&k| k).count();
    let mut s = quotas_keeping(capacities, stateful, &stateful_held);
    // Stateless quota = total − stateful; negative ones are repaired by trading a
    // stateful slot for a stateless one with the member that has the most stateless room.
    let mut l: Vec<isize> = total.iter().zip(&s).map(|(&q, &s)| q as isize - s as isize).collect();
    while let Some(i) = l.iter().position(|&x| x < 0) {
        let j = (0..l.len())
            .max_by_key(|&j| (l[j], Reverse(j)))
            .filter(|&j| l[j] > 0)
            .expect("the stateless quotas add up to the stateless tasks, which are not negative");
        s[i] -= 1;
        l[i] += 1;
        s[j] += 1;
        l[j] -= 1;
    }
    [l.into_iter().map(|x| x as usize).collect(), s]
}

/// The tasks to place, by index, and which of them keep state.
struct Tasks<'a> {
    tasks: &'a [TaskId],
    index: FxHashMap<&'a TaskId, u32>,
    /// Whether each task keeps state, worked out once per unit (a topology or sub-topology).
    keeps: Vec<bool>,
}

impl<'a> Tasks<'a> {
    fn new(tasks: &'a [TaskId], stateful: &HashSet<Arc<str>>) -> Tasks<'a> {
        let index = tasks.iter().enumerate().map(|(i, t)| (t, i as u32)).collect();
        let mut by_unit: FxHashMap<(&str, Option<&str>), bool> = FxHashMap::default();
        let keeps = tasks
            .iter()
            .map(|t| {
                *by_unit
                    .entry((&t.topology, t.sub.as_deref()))
                    .or_insert_with(|| keeps_state(stateful, t))
            })
            .collect();
        Tasks { tasks, index, keeps }
    }

    fn len(&self) -> usize {
        self.tasks.len()
    }

    /// The index of `t`, if it is a task to place.
    fn lookup(&self, t: &TaskId) -> Option<usize> {
        self.index.get(t).map(|&i| i as usize)
    }
}

/// Who owns what now (see [`current_owners`]).
struct Owners {
    /// Each task's owner (or [`NONE`]).
    owner: Vec<usize>,
    /// How many tasks each member holds.
    held: Vec<usize>,
    /// Each member's tasks (indices).
    claimed: Vec<Vec<usize>>,
}

/// Decides who owns each task now: the first member (in id order) that claims a task keeps
/// the claim; a second claim, or a claim of a task that no longer exists, is revoked.
fn current_owners(metas: &[&MemberMetadata], tasks: &Tasks<'_>, out: &mut [Assignment]) -> Owners {
    let mut owner = vec![NONE; tasks.len()];
    let mut held = vec![0usize; metas.len()];
    let mut claimed: Vec<Vec<usize>> = vec![Vec::new(); metas.len()];
    for (i, m) in metas.iter().enumerate() {
        for t in &m.active {
            match tasks.lookup(t) {
                Some(x) if owner[x] == NONE => {
                    owner[x] = i;
                    held[i] += 1;
                    claimed[i].push(x);
                }
                _ => out[i].revoked.push(t.clone()),
            }
        }
    }
    Owners { owner, held, claimed }
}

/// Where each stateful task's state already is (see [`Warm::new`]).
struct Warm {
    /// Each task's changelog end (summed), if the leader read it.
    end: Vec<Option<i64>>,
    /// Task x's (lag, member) list is `flat[starts[x]..starts[x + 1]]`, least lag first.
    starts: Vec<usize>,
    flat: Vec<(i64, usize)>,
    /// The member learning each task (the first to say so, in id order), or [`NONE`].
    learner_of: Vec<usize>,
}

impl Warm {
    /// Decides how warm each member is on each task: its lag (changelog end less the
    /// offset sum it reports; `i64::MAX` for a standby or learner that reports no sum),
    /// least first, and which member learns each task. The lists are grouped by task with a
    /// counting sort: no allocation per task or member.
    fn new(metas: &[&MemberMetadata], tasks: &Tasks<'_>, end_offsets: &HashMap<TaskId, i64>) -> Warm {
        let n = tasks.len();
        let mut end: Vec<Option<i64>> = vec![None; n];
        for (t, &e) in end_offsets {
            if let Some(x) = tasks.lookup(t) {
                end[x] = Some(e);
            }
        }
        let mut claims: Vec<(usize, i64, usize)> = Vec::new();
        let mut has_sum = vec![NONE; n];
        let mut learner_of = vec![NONE; n];
        for (i, m) in metas.iter().enumerate() {
            for (t, sum) in &m.offset_sums {
                if let Some(x) = tasks.lookup(t) {
                    claims.push((x, end[x].map_or(0, |end| (end - sum).max(0)), i));
                    has_sum[x] = i;
                }
            }
            for t in m.standby.iter().chain(&m.learner) {
                if let Some(x) = tasks.lookup(t) {
                    if has_sum[x] != i {
                        claims.push((x, i64::MAX, i));
                        has_sum[x] = i;
                    }
                }
            }
            for t in &m.learner {
                if let Some(x) = tasks.lookup(t) {
                    if learner_of[x] == NONE {
                        learner_of[x] = i;
                    }
                }
            }
        }
        let mut starts = vec![0usize; n + 1];
        for &(x, _, _) in &claims {
            starts[x + 1] += 1;
        }
        for x in 0..n {
            starts[x + 1] += starts[x];
        }
        let mut flat = vec![(0i64, 0usize); claims.len()];
        let mut next = starts.clone();
        for &(x, lag, i) in &claims {
            flat[next[x]] = (lag, i);
            next[x] += 1;
        }
        for x in 0..n {
            let list = &mut flat[starts[x]..starts[x + 1]];
            if list.len() > 1 {
                list.sort_unstable();
            }
        }
        Warm {
            end,
            starts,
            flat,
            learner_of,
        }
    }

    /// The members holding task `x`'s state, as (lag, member), least lag first.
    fn of(&self, x: usize) -> &[(i64, usize)] {
        &self.flat[self.starts[x]..self.starts[x + 1]]
    }

    /// Member `i`'s lag on task `x`, if the leader knows the changelogs' end.
    fn lag_of(&self, x: usize, i: usize) -> Option<i64> {
        self.end[x]?;
        self.of(x)
            .iter()
            .find(|&&(_, j)| j == i)
            .map(|&(lag, _)| lag)
            .filter(|&l| l != i64::MAX)
    }
}

/// Each member's quota and class targets, and what it has been given so far.
struct Loads {
    quota: Vec<usize>,
    /// Per class (stateless 0, stateful 1), per member.
    target: [Vec<usize>; 2],
    load: Vec<usize>,
    class_load: [Vec<usize>; 2],
}

impl Loads {
    fn new(quota: Vec<usize>, target: [Vec<usize>; 2]) -> Loads {
        let n = quota.len();
        Loads {
            quota,
            target,
            load: vec![0; n],
            class_load: [vec![0; n], vec![0; n]],
        }
    }

    fn members(&self) -> usize {
        self.quota.len()
    }

    /// Member `i` is given a task of class `c`.
    fn add(&mut self, i: usize, c: usize) {
        self.load[i] += 1;
        self.class_load[c][i] += 1;
    }

    /// How far member `i` is below its target of class `c` (negative: above).
    fn below(&self, c: usize, i: usize) -> isize {
        self.target[c][i] as isize - self.class_load[c][i] as isize
    }

    /// Member `i`'s key for a task of class `c` (higher first): how far below the class's
    /// target, then room. Only for a member with room.
    fn key(&self, c: usize, i: usize) -> (isize, usize) {
        (self.below(c, i), self.quota[i] - self.load[i])
    }
}

/// Decides what each member keeps of what it owns: up to its quota; the rest must move
/// (returned as (task, member)). The tasks are gone through stateful first, then by id.
fn keep_within_quota(
    claimed: &mut [Vec<usize>],
    tasks: &Tasks<'_>,
    loads: &mut Loads,
    out: &mut [Assignment],
) -> Vec<(usize, usize)> {
    let keeps = &tasks.keeps;
    let mut over: Vec<(usize, usize)> = Vec::new();
    for (i, mine) in claimed.iter_mut().enumerate() {
        mine.sort_unstable_by(|&a, &b| (!keeps[a], &tasks.tasks[a]).cmp(&(!keeps[b], &tasks.tasks[b])));
        let target = [loads.target[0][i], loads.target[1][i]];
        let keep = keep_flags(mine, keeps, loads.quota[i], target);
        for (&x, kept) in mine.iter().zip(keep) {
            if kept {
                out[i].active.push(tasks.tasks[x].clone());
                loads.add(i, keeps[x] as usize);
            } else {
                over.push((x, i));
            }
        }
    }
    over
}

/// Which of a member's tasks (`mine`, stateful first) it keeps under `quota`: all of them
/// within it; over it, each class up to its `target` first, then stateful tasks (a
/// stateless task moves in a few milliseconds, a stateful one through a learner or, without
/// learners, by restoring its state).
fn keep_flags(mine: &[usize], keeps: &[bool], quota: usize, target: [usize; 2]) -> Vec<bool> {
    if mine.len() <= quota {
        return vec![true; mine.len()];
    }
    let mut kept = [0usize; 2];
    let mut keep: Vec<bool> = mine
        .iter()
        .map(|&x| {
            let c = keeps[x] as usize;
            let within = kept[c] < target[c];
            kept[c] += within as usize;
            within
        })
        .collect();
    let mut room = quota - (kept[0] + kept[1]);
    for k in keep.iter_mut() {
        if room > 0 && !*k {
            *k = true;
            room -= 1;
        }
    }
    keep
}

/// How the tasks over quota move (see [`move_over_quota`]).
struct Moves {
    /// For a task revoked this generation, the member giving it up (else [`NONE`]).
    moving: Vec<usize>,
    /// For a task learned elsewhere, the learner's member (else [`NONE`]).
    learner_at: Vec<usize>,
}

/// Decides how each task over its owner's quota moves: revoked now and handed out next
/// generation — unless it is stateful and learners are on: then it stays active on its
/// owner until a learner elsewhere has caught up. Tasks with a learner already go first
/// (they keep it while its member has room).
fn move_over_quota(
    mut over: Vec<(usize, usize)>,
    tasks: &Tasks<'_>,
    warm: &Warm,
    loads: &mut Loads,
    policy: LearnerPolicy,
    out: &mut [Assignment],
) -> Moves {
    let mut moves = Moves {
        moving: vec![NONE; tasks.len()],
        learner_at: vec![NONE; tasks.len()],
    };
    let mut incoming = vec![0usize; loads.members()];
    let mut learners_left = policy.max_learners;
    over.sort_by_key(|&(x, i)| (warm.learner_of[x] == NONE || warm.learner_of[x] == i, x));
    for (x, i) in over {
        let task = &tasks.tasks[x];
        let learns = policy.max_learners > 0 && tasks.keeps[x];
        if !learns {
            out[i].revoked.push(task.clone());
            moves.moving[x] = i;
            continue;
        }
        // A learner is kept where its member has room for it: one that began learning when
        // it joined alone may hold more than its share once others joined, and the rest
        // would make it over quota once they are active, with no rebalance to follow.
        let room = |j: usize| loads.quota[j] > loads.load[j] + incoming[j];
        let holder = Some(warm.learner_of[x]).filter(|&j| j != NONE && j != i && room(j));
        let destination = match holder {
            Some(j) => Some(j),
            None if learners_left == 0 => None,
            None => learner_destination(x, i, warm, loads, &incoming),
        };
        let Some(j) = destination else {
            // No learner possible yet: the task stays where it is.
            out[i].active.push(task.clone());
            loads.add(i, 1);
            continue;
        };
        learners_left = learners_left.saturating_sub(1);
        incoming[j] += 1;
        moves.learner_at[x] = j;
        out[j].learner.push(task.clone());
        let caught_up = warm.lag_of(x, j).is_some_and(|lag| lag <= policy.acceptable_lag);
        if caught_up {
            // Revoked now; the learner (kept until then) becomes active next generation.
            out[i].revoked.push(task.clone());
            moves.moving[x] = i;
        } else {
            out[i].active.push(task.clone());
            loads.add(i, 1);
        }
    }
    moves
}

/// Where a new learner of stateful task `x` (owned by `i`) goes: a member below its
/// stateful target first (one holding the task's state before others), then one holding
/// its state, then the one furthest below its target, then the one with most room; none
/// without room (counting the learners it was given, `incoming`).
fn learner_destination(x: usize, i: usize, warm: &Warm, loads: &Loads, incoming: &[usize]) -> Option<usize> {
    let room = |j: usize| loads.quota[j].saturating_sub(loads.load[j] + incoming[j]);
    (0..loads.members())
        .filter(|&j| j != i && room(j) > 0)
        .max_by_key(|&j| {
            let below = loads.below(1, j) - incoming[j] as isize;
            let warm = warm.of(x).iter().any(|&(_, k)| k == j);
            (below > 0, warm, below, room(j), Reverse(j))
        })
}

/// Members with room for a class, by [`Loads::key`]: keys only fall, so a stale entry is
/// corrected when it is popped.
type Room = BinaryHeap<((isize, usize), Reverse<usize>)>;

/// Decides where each unowned task goes, and returns each task's active owner after it
/// ([`NONE`] for a task revoked this generation).
///
/// Members with room: a warm one if it has room, else the emptiest. A task handed over from
/// a learner goes to that learner's member, even past its quota (the member then sheds
/// another task, through a learner if it is stateful): anywhere else it would restore its
/// state from the changelog before it runs. Those tasks go first, then the other stateful
/// ones (to warm members while they have room), then the stateless ones, so that stateless
/// tasks never take the room a stateful task's state is in.
fn place_unowned(
    owner: &[usize],
    tasks: &Tasks<'_>,
    warm: &Warm,
    moves: &Moves,
    loads: &mut Loads,
    out: &mut [Assignment],
) -> Vec<usize> {
    let keeps = &tasks.keeps;
    let mut order: Vec<usize> = (0..tasks.len()).filter(|&x| owner[x] == NONE).collect();
    order.sort_by_key(|&x| (warm.learner_of[x] == NONE, !keeps[x], x));
    let mut room: [Room; 2] = [0, 1].map(|c| {
        (0..loads.members())
            .filter(|&i| loads.quota[i] > loads.load[i])
            .map(|i| (loads.key(c, i), Reverse(i)))
            .collect()
    });
    let mut active_owner: Vec<usize> = (0..tasks.len())
        .map(|x| if moves.moving[x] == NONE { owner[x] } else { NONE })
        .collect();
    for x in order {
        let t = &tasks.tasks[x];
        let c = keeps[x] as usize;
        let learned = Some(warm.learner_of[x]).filter(|&i| i != NONE && loads.quota[i] > 0);
        let warm_pick = learned.or_else(|| {
            warm.of(x)
                .iter()
                .map(|&(_, i)| i)
                .find(|&i| loads.load[i] < loads.quota[i])
        });
        let Some(i) = warm_pick.or_else(|| emptiest(&mut room[c], loads, c)) else {
            continue;
        };
        out[i].learner.retain(|l| l != t);
        out[i].active.push(t.clone());
        loads.add(i, c);
        active_owner[x] = i;
        if loads.load[i] < loads.quota[i] {
            room[c].push((loads.key(c, i), Reverse(i)));
        }
    }
    active_owner
}

/// The member with room furthest below its target of class `c` (then with most room),
/// taken off `room`; stale entries are dropped (full) or put back with their key now.
fn emptiest(room: &mut Room, loads: &Loads, c: usize) -> Option<usize> {
    loop {
        match room.pop() {
            None => return None,
            Some((_, Reverse(i))) if loads.load[i] >= loads.quota[i] => continue,
            Some((k, Reverse(i))) if k != loads.key(c, i) => room.push((loads.key(c, i), Reverse(i))),
            Some((_, Reverse(i))) => return Some(i),
        }
    }
}

/// Decides the standbys of stateful tasks: up to `replicas` each, never on the active's
/// member (nor, while a task moves, on its learner's); the member giving a moving task up
/// first (it keeps its state as a standby anyway), then warm members, least lag first, then
/// those with the fewest standbys.
fn place_standbys(
    replicas: usize,
    tasks: &Tasks<'_>,
    warm: &Warm,
    moves: &Moves,
    active_owner: &[usize],
    out: &mut [Assignment],
) {
    let members = out.len();
    if replicas == 0 || members <= 1 {
        return;
    }
    let mut standby_load = vec![0usize; members];
    let mut by_load: BinaryHeap<(Reverse<usize>, Reverse<usize>)> =
        (0..members).map(|i| (Reverse(0), Reverse(i))).collect();
    for (x, t) in tasks.tasks.iter().enumerate() {
        if !tasks.keeps[x] {
            continue;
        }
        // None while the task moves: its giver revokes it now, the new owner gets it next.
        let active = Some(active_owner[x]).filter(|&i| i != NONE);
        let learner_at = moves.learner_at[x];
        let mut chosen: Vec<usize> = Vec::with_capacity(replicas);
        if moves.moving[x] != NONE {
            // The member giving the task up keeps it warm until the new owner has it.
            chosen.push(moves.moving[x]);
        }
        for &(_, i) in warm.of(x) {
            if chosen.len() >= replicas {
                break;
            }
            if Some(i) != active && i != learner_at && !chosen.contains(&i) {
                chosen.push(i);
            }
        }
        // Members chosen so far keep their (now stale) heap entries: a stale entry
        // is corrected when it is popped. Only members popped here need a new one.
        let from_warm = chosen.len();
        let mut skipped = Vec::new();
        while chosen.len() < replicas.min(members - 1) {
            let Some((Reverse(l), Reverse(i))) = by_load.pop() else {
                break;
            };
            if l != standby_load[i] {
                by_load.push((Reverse(standby_load[i]), Reverse(i)));
                continue;
            }
            if Some(i) == active || i == learner_at || chosen.contains(&i) {
                skipped.push((Reverse(l), Reverse(i)));
                continue;
            }
            chosen.push(i);
        }
        by_load.extend(skipped);
        for (n, i) in chosen.into_iter().enumerate() {
            if Some(i) == active {
                continue;
            }
            out[i].standby.push(t.clone());
            standby_load[i] += 1;
            if n >= from_warm {
                by_load.push((Reverse(standby_load[i]), Reverse(i)));
            }
        }
    }
}

#[cfg(test)]
mod tests;
