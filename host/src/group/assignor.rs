//! Assignors: pure functions from the members' metadata and the tasks to assignments.
//!
//! `sticky` (the default) is cooperative: a task that must move is revoked from its owner in
//! one generation and handed to its new owner in the next (the assignment asks everyone to
//! rejoin), so no task is ever active on two workers and tasks that stay never stop.
//! `eager` reassigns everything from scratch: the stop-the-world baseline.
//!
//! With learners (`LearnerPolicy`), a stateful task that must leave a live owner does not
//! move at once: it stays active there while a *learner* on its new member restores its
//! state from the changelogs; once the learner's lag (changelog end offsets, read by the
//! leader, less the offsets the member reports) is acceptable, the task is revoked from its
//! owner and, in the next generation, made active on the learner's member.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::metadata::{Assignment, MemberMetadata, CURRENT_VERSION};
use super::TaskId;

/// Everything an assignor may look at.
pub struct AssignorInput<'a> {
    /// Member id → its metadata.
    pub members: &'a BTreeMap<String, MemberMetadata>,
    /// Every task of every deployed topology.
    pub tasks: &'a [TaskId],
    /// Topologies (or sub-topologies, `<topology>/<sub>`: see [`TaskId::unit`]) whose tasks
    /// keep state (and so get standbys). Ask with [`keeps_state`].
    pub stateful: &'a HashSet<Arc<str>>,
    /// Per stateful task, the sum of its changelogs' end offsets (lag = this − a member's sum).
    pub end_offsets: &'a HashMap<TaskId, i64>,
    pub standby_replicas: u32,
    pub learners: LearnerPolicy,
}

/// Whether `task`'s unit (its topology, or its sub-topology) is in `stateful`.
pub fn keeps_state(stateful: &HashSet<Arc<str>>, task: &TaskId) -> bool {
    match &task.sub {
        None => stateful.contains(&*task.topology),
        Some(_) => stateful.contains(task.unit().as_str()),
    }
}

/// How stateful tasks move between live workers (the `sticky` assignor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LearnerPolicy {
    /// Learner tasks at once in the whole group; 0: a task moves at once and its new owner
    /// restores before processing (no learners).
    pub max_learners: usize,
    /// A learner this close to the changelogs' end (records, summed over its stores) is
    /// caught up: its task moves to it.
    pub acceptable_lag: i64,
}

impl LearnerPolicy {
    /// No learners: tasks move at once.
    pub const NONE: LearnerPolicy = LearnerPolicy {
        max_learners: 0,
        acceptable_lag: 0,
    };
}

/// Places tasks on members. Implementations must be pure and deterministic.
pub trait Assignor: Send + Sync {
    fn name(&self) -> &'static str;
    fn assign(&self, input: &AssignorInput<'_>) -> BTreeMap<String, Assignment>;
}

/// The built-in assignor called `name` (`sticky` or `eager`).
pub fn by_name(name: &str) -> Option<Box<dyn Assignor>> {
    match name {
        "sticky" => Some(Box::new(Sticky)),
        "eager" => Some(Box::new(Eager)),
        _ => None,
    }
}

/// Each member's share of `total` tasks, proportional to capacity (largest remainder), so
/// every share is within one task of exact.
pub fn quotas(capacities: &[u32], total: usize) -> Vec<usize> {
    quotas_keeping(capacities, total, &vec![0; capacities.len()])
}

/// As [`quotas`], but the rounding-up goes first to members that already hold more than
/// their rounded-down share, so a balanced assignment needs as few moves as possible.
pub fn quotas_keeping(capacities: &[u32], total: usize, held: &[usize]) -> Vec<usize> {
    // Capacity 0 (a leaving member) gets nothing, unless every member has 0.
    let all_zero = capacities.iter().all(|&c| c == 0);
    let weight = |c: u32| if all_zero { 1 } else { c as u64 };
    let sum: u64 = capacities.iter().map(|&c| weight(c)).sum();
    if sum == 0 {
        return Vec::new();
    }
    let exact: Vec<(usize, u64)> = capacities
        .iter()
        .map(|&c| {
            let scaled = total as u64 * weight(c);
            ((scaled / sum) as usize, scaled % sum)
        })
        .collect();
    let mut out: Vec<usize> = exact.iter().map(|(q, _)| *q).collect();
    let left = total - out.iter().sum::<usize>();
    // Only members with a fractional share may round up (else they would be a whole task
    // over their share); there are always at least `left` of them.
    let mut order: Vec<usize> = (0..out.len()).filter(|&i| exact[i].1 > 0).collect();
    order.sort_by_key(|&i| (held[i] <= out[i], Reverse(exact[i].1), i));
    for &i in order.iter().take(left) {
        out[i] += 1;
    }
    out
}

fn empty_assignments(members: &BTreeMap<String, MemberMetadata>) -> Vec<Assignment> {
    members
        .keys()
        .map(|_| Assignment {
            version: CURRENT_VERSION,
            ..Default::default()
        })
        .collect()
}

fn finish(members: &BTreeMap<String, MemberMetadata>, mut out: Vec<Assignment>) -> BTreeMap<String, Assignment> {
    let rejoin = out
        .iter()
        .any(|a| !a.revoked.is_empty() && a.revoked.iter().any(|t| !a.active.contains(t)));
    for a in &mut out {
        a.rejoin = rejoin;
        a.active.sort();
        a.standby.sort();
        a.revoked.sort();
        a.learner.sort();
    }
    members.keys().cloned().zip(out).collect()
}

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
        // Tasks by index: every per-task fact below lives in a vector, so each claim costs
        // one hash lookup (50,000 tasks × several maps used to dominate the run).
        let tasks = input.tasks;
        let index: FxHashMap<&TaskId, u32> = tasks.iter().enumerate().map(|(i, t)| (t, i as u32)).collect();
        let lookup = |t: &TaskId| index.get(t).map(|&i| i as usize);
        // Which tasks keep state, worked out once per unit (a topology or sub-topology).
        let keeps: Vec<bool> = {
            let mut by_unit: FxHashMap<(&str, Option<&str>), bool> = FxHashMap::default();
            tasks
                .iter()
                .map(|t| {
                    *by_unit
                        .entry((&t.topology, t.sub.as_deref()))
                        .or_insert_with(|| keeps_state(input.stateful, t))
                })
                .collect()
        };

        // Current owners: the first member (in id order) that claims a task keeps the claim.
        let mut owner = vec![NONE; tasks.len()];
        let mut held = vec![0usize; metas.len()];
        let mut claimed: Vec<Vec<usize>> = vec![Vec::new(); metas.len()];
        for (i, m) in metas.iter().enumerate() {
            for t in &m.active {
                match lookup(t) {
                    Some(x) if owner[x] == NONE => {
                        owner[x] = i;
                        held[i] += 1;
                        claimed[i].push(x);
                    }
                    _ => out[i].revoked.push(t.clone()),
                }
            }
        }
        let capacities = capacities(&metas);
        let quota = quotas_keeping(&capacities, tasks.len(), &held);
        // Targets per class, stateless (0) and stateful (1), adding up to each member's
        // quota. The quota is what a member holds; the targets only choose which tasks it
        // gives up and where moving tasks go, so that scaling does not leave one worker with
        // every stateful task and another with every stateless one, and no task moves only
        // to even the classes out.
        let target = class_targets(&capacities, &quota, &keeps, &claimed);
        // Where each stateful task's state already is (standby or any local state), least lag first.
        let mut end: Vec<Option<i64>> = vec![None; tasks.len()];
        for (t, &e) in input.end_offsets {
            if let Some(x) = lookup(t) {
                end[x] = Some(e);
            }
        }
        // (task, lag, member) for every member holding state of a task, grouped by task with
        // a counting sort: `warm(x)` is task x's list. No allocation per task or member.
        let mut claims: Vec<(usize, i64, usize)> = Vec::new();
        let mut has_sum = vec![NONE; tasks.len()];
        // The member learning each task (the first to say so, in id order).
        let mut learner_of = vec![NONE; tasks.len()];
        for (i, m) in metas.iter().enumerate() {
            for (t, sum) in &m.offset_sums {
                if let Some(x) = lookup(t) {
                    claims.push((x, end[x].map_or(0, |end| (end - sum).max(0)), i));
                    has_sum[x] = i;
                }
            }
            for t in m.standby.iter().chain(&m.learner) {
                if let Some(x) = lookup(t) {
                    if has_sum[x] != i {
                        claims.push((x, i64::MAX, i));
                        has_sum[x] = i;
                    }
                }
            }
            for t in &m.learner {
                if let Some(x) = lookup(t) {
                    if learner_of[x] == NONE {
                        learner_of[x] = i;
                    }
                }
            }
        }
        let mut starts = vec![0usize; tasks.len() + 1];
        for &(x, _, _) in &claims {
            starts[x + 1] += 1;
        }
        for x in 0..tasks.len() {
            starts[x + 1] += starts[x];
        }
        let mut warm_flat = vec![(0i64, 0usize); claims.len()];
        let mut next = starts.clone();
        for &(x, lag, i) in &claims {
            warm_flat[next[x]] = (lag, i);
            next[x] += 1;
        }
        for x in 0..tasks.len() {
            let list = &mut warm_flat[starts[x]..starts[x + 1]];
            if list.len() > 1 {
                list.sort_unstable();
            }
        }
        let warm = |x: usize| &warm_flat[starts[x]..starts[x + 1]];
        // A member's lag on a task, if the leader knows the changelogs' end.
        let lag_of = |x: usize, i: usize| -> Option<i64> {
            end[x]?;
            warm(x)
                .iter()
                .find(|&&(_, j)| j == i)
                .map(|&(lag, _)| lag)
                .filter(|&l| l != i64::MAX)
        };

        // Keep up to the quota of what each member owns; the rest must move. What a member
        // over its quota keeps: each class up to its target first, then stateful tasks (a
        // stateless task moves in a few milliseconds, a stateful one through a learner or,
        // without learners, by restoring its state).
        let mut load = vec![0usize; metas.len()];
        let mut class_load = [vec![0usize; metas.len()], vec![0usize; metas.len()]];
        let mut moving = vec![NONE; tasks.len()];
        let mut over: Vec<(usize, usize)> = Vec::new();
        for (i, mine) in claimed.iter_mut().enumerate() {
            mine.sort_unstable_by(|&a, &b| (!keeps[a], &tasks[a]).cmp(&(!keeps[b], &tasks[b])));
            let keep: Vec<bool> = if mine.len() <= quota[i] {
                vec![true; mine.len()]
            } else {
                let mut kept = [0usize; 2];
                let mut keep: Vec<bool> = mine
                    .iter()
                    .map(|&x| {
                        let c = keeps[x] as usize;
                        let within = kept[c] < target[c][i];
                        kept[c] += within as usize;
                        within
                    })
                    .collect();
                let mut room = quota[i] - (kept[0] + kept[1]);
                for k in keep.iter_mut() {
                    if room > 0 && !*k {
                        *k = true;
                        room -= 1;
                    }
                }
                keep
            };
            for (&x, kept) in mine.iter().zip(keep) {
                if kept {
                    out[i].active.push(tasks[x].clone());
                    load[i] += 1;
                    class_load[keeps[x] as usize][i] += 1;
                } else {
                    over.push((x, i));
                }
            }
        }
        // How far a member is below its target of a class (negative: above).
        let below =
            |class_load: &[Vec<usize>; 2], c: usize, i: usize| target[c][i] as isize - class_load[c][i] as isize;
        // A task that must move is revoked now and handed out next generation — unless it is
        // stateful and learners are on: then it stays active on its owner until a learner
        // elsewhere has caught up. Tasks with a learner already go first (they keep it).
        let policy = input.learners;
        let mut learner_at = vec![NONE; tasks.len()];
        let mut incoming = vec![0usize; metas.len()];
        let mut learners_left = policy.max_learners;
        over.sort_by_key(|&(x, i)| (learner_of[x] == NONE || learner_of[x] == i, x));
        for (x, i) in over {
            let learns = policy.max_learners > 0 && keeps[x];
            if !learns {
                out[i].revoked.push(tasks[x].clone());
                moving[x] = i;
                continue;
            }
            let holder = Some(learner_of[x]).filter(|&j| j != NONE && j != i);
            let destination = match holder {
                Some(j) => Some(j),
                None if learners_left == 0 => None,
                // A member below its stateful target first (one holding the task's state
                // before others), then one holding its state, then the one furthest below
                // its target, then the one with most room.
                None => {
                    let room = |j: usize| quota[j].saturating_sub(load[j] + incoming[j]);
                    (0..metas.len()).filter(|&j| j != i && room(j) > 0).max_by_key(|&j| {
                        let below = below(&class_load, 1, j) - incoming[j] as isize;
                        let warm = warm(x).iter().any(|&(_, k)| k == j);
                        (below > 0, warm, below, room(j), Reverse(j))
                    })
                }
            };
            let Some(j) = destination else {
                // No learner possible yet: the task stays where it is.
                out[i].active.push(tasks[x].clone());
                load[i] += 1;
                class_load[1][i] += 1;
                continue;
            };
            learners_left = learners_left.saturating_sub(1);
            incoming[j] += 1;
            learner_at[x] = j;
            out[j].learner.push(tasks[x].clone());
            let caught_up = lag_of(x, j).is_some_and(|lag| lag <= policy.acceptable_lag);
            if caught_up {
                // Revoked now; the learner (kept until then) becomes active next generation.
                out[i].revoked.push(tasks[x].clone());
                moving[x] = i;
            } else {
                out[i].active.push(tasks[x].clone());
                load[i] += 1;
                class_load[1][i] += 1;
            }
        }
        // Unowned tasks go to members with room: a warm one if it has room, else the emptiest.
        // A task handed over from a learner goes to that learner's member, even past its
        // quota (the member then sheds another task, through a learner if it is stateful):
        // anywhere else it would restore its state from the changelog before it runs. Those
        // tasks go first, then the other stateful ones (to warm members while they have
        // room), then the stateless ones, so that stateless tasks never take the room a
        // stateful task's state is in.
        let mut order: Vec<usize> = (0..tasks.len()).filter(|&x| owner[x] == NONE).collect();
        order.sort_by_key(|&x| (learner_of[x] == NONE, !keeps[x], x));
        // Per class, members with room by (how far below the class's target, room): keys
        // only fall, so a stale entry is corrected when it is popped.
        let key = |class_load: &[Vec<usize>; 2], load: &[usize], c: usize, i: usize| {
            (below(class_load, c, i), quota[i] - load[i])
        };
        type Room = BinaryHeap<((isize, usize), Reverse<usize>)>;
        let mut room: [Room; 2] = [0, 1].map(|c| {
            (0..metas.len())
                .filter(|&i| quota[i] > load[i])
                .map(|i| (key(&class_load, &load, c, i), Reverse(i)))
                .collect()
        });
        let mut active_owner: Vec<usize> = (0..tasks.len())
            .map(|x| if moving[x] == NONE { owner[x] } else { NONE })
            .collect();
        for x in order {
            let t = &tasks[x];
            let c = keeps[x] as usize;
            let learned = Some(learner_of[x]).filter(|&i| i != NONE && quota[i] > 0);
            let warm_pick = learned.or_else(|| warm(x).iter().map(|&(_, i)| i).find(|&i| load[i] < quota[i]));
            let pick = match warm_pick {
                Some(i) => Some(i),
                None => loop {
                    match room[c].pop() {
                        None => break None,
                        Some((_, Reverse(i))) if load[i] >= quota[i] => continue,
                        Some((k, Reverse(i))) if k != key(&class_load, &load, c, i) => {
                            room[c].push((key(&class_load, &load, c, i), Reverse(i)))
                        }
                        Some((_, Reverse(i))) => break Some(i),
                    }
                },
            };
            let Some(i) = pick else { continue };
            out[i].learner.retain(|l| l != t);
            out[i].active.push(t.clone());
            load[i] += 1;
            class_load[c][i] += 1;
            active_owner[x] = i;
            if load[i] < quota[i] {
                room[c].push((key(&class_load, &load, c, i), Reverse(i)));
            }
        }

        // Standbys for stateful tasks, never on the active's member (nor, while a task moves,
        // on the member giving it up: that one keeps its state as a standby anyway).
        let replicas = input.standby_replicas as usize;
        if replicas > 0 && metas.len() > 1 {
            let mut standby_load = vec![0usize; metas.len()];
            let mut by_load: BinaryHeap<(Reverse<usize>, Reverse<usize>)> =
                (0..metas.len()).map(|i| (Reverse(0), Reverse(i))).collect();
            for (x, t) in tasks.iter().enumerate() {
                if !keeps[x] {
                    continue;
                }
                // None while the task moves: its giver revokes it now, the new owner gets it next.
                let active = Some(active_owner[x]).filter(|&i| i != NONE);
                let mut chosen: Vec<usize> = Vec::with_capacity(replicas);
                if moving[x] != NONE {
                    // The member giving the task up keeps it warm until the new owner has it.
                    chosen.push(moving[x]);
                }
                for &(_, i) in warm(x) {
                    if chosen.len() >= replicas {
                        break;
                    }
                    if Some(i) != active && i != learner_at[x] && !chosen.contains(&i) {
                        chosen.push(i);
                    }
                }
                // Members chosen so far keep their (now stale) heap entries: a stale entry
                // is corrected when it is popped. Only members popped here need a new one.
                let from_warm = chosen.len();
                let mut skipped = Vec::new();
                while chosen.len() < replicas.min(metas.len() - 1) {
                    let Some((Reverse(l), Reverse(i))) = by_load.pop() else {
                        break;
                    };
                    if l != standby_load[i] {
                        by_load.push((Reverse(standby_load[i]), Reverse(i)));
                        continue;
                    }
                    if Some(i) == active || i == learner_at[x] || chosen.contains(&i) {
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
        finish(input.members, out)
    }
}

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

/// Each member's capacity for the quotas: a leaving member's is 0 (its tasks move away).
fn capacities(metas: &[&MemberMetadata]) -> Vec<u32> {
    metas
        .iter()
        .map(|m| if m.leaving { 0 } else { m.capacity.max(1) })
        .collect()
}

/// No member (in the per-task vectors of [`Sticky`]).
const NONE: usize = usize::MAX;

/// Revokes everything and deals tasks out again by capacity, ignoring where they were.
pub struct Eager;

impl Assignor for Eager {
    fn name(&self) -> &'static str {
        "eager"
    }

    fn assign(&self, input: &AssignorInput<'_>) -> BTreeMap<String, Assignment> {
        let metas: Vec<&MemberMetadata> = input.members.values().collect();
        let mut out = empty_assignments(input.members);
        if metas.is_empty() {
            return BTreeMap::new();
        }
        let quota = quotas(&capacities(&metas), input.tasks.len());
        let mut tasks: Vec<&TaskId> = input.tasks.iter().collect();
        tasks.sort();
        let mut next = tasks.into_iter();
        for (i, q) in quota.iter().enumerate() {
            out[i].active.extend(next.by_ref().take(*q).cloned());
        }
        for (i, m) in metas.iter().enumerate() {
            out[i].revoked = m.active.clone();
        }
        let mut result = finish(input.members, out);
        // Everything was revoked and reassigned in one step: there is nothing to rejoin for.
        for a in result.values_mut() {
            a.rejoin = false;
        }
        result
    }
}
