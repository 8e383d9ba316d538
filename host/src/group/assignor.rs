//! Assignors: pure functions from the members' metadata and the tasks to assignments.
//!
//! `sticky` (the default) is cooperative: a task that must move is revoked from its owner in
//! one generation and handed to its new owner in the next (the assignment asks everyone to
//! rejoin), so no task is ever active on two workers and tasks that stay never stop.
//! `eager` reassigns everything from scratch: the stop-the-world baseline.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

use super::metadata::{Assignment, MemberMetadata, CURRENT_VERSION};
use super::TaskId;

/// Everything an assignor may look at.
pub struct AssignorInput<'a> {
    /// Member id → its metadata.
    pub members: &'a BTreeMap<String, MemberMetadata>,
    /// Every task of every deployed topology.
    pub tasks: &'a [TaskId],
    /// Topologies whose tasks keep state (and so get standbys).
    pub stateful: &'a HashSet<Arc<str>>,
    /// Per stateful task, the sum of its changelogs' end offsets (lag = this − a member's sum).
    pub end_offsets: &'a HashMap<TaskId, i64>,
    pub standby_replicas: u32,
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
    let sum: u64 = capacities.iter().map(|&c| c.max(1) as u64).sum();
    if sum == 0 {
        return Vec::new();
    }
    let exact: Vec<(usize, u64)> = capacities
        .iter()
        .map(|&c| {
            let scaled = total as u64 * c.max(1) as u64;
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
        let known: HashSet<&TaskId> = input.tasks.iter().collect();

        // Current owners: the first member (in id order) that claims a task keeps the claim.
        let mut owner: HashMap<&TaskId, usize> = HashMap::with_capacity(input.tasks.len());
        let mut held = vec![0usize; metas.len()];
        for (i, m) in metas.iter().enumerate() {
            for t in &m.active {
                if !known.contains(t) || owner.contains_key(t) {
                    out[i].revoked.push(t.clone());
                } else {
                    owner.insert(t, i);
                    held[i] += 1;
                }
            }
        }
        let capacities: Vec<u32> = metas.iter().map(|m| m.capacity).collect();
        let quota = quotas_keeping(&capacities, input.tasks.len(), &held);
        // Keep up to the quota of what each member owns; revoke the rest (it moves next round).
        let mut load = vec![0usize; metas.len()];
        let mut moving: HashMap<&TaskId, usize> = HashMap::new();
        for (i, m) in metas.iter().enumerate() {
            let mut mine: Vec<&TaskId> = m.active.iter().filter(|t| owner.get(t) == Some(&i)).collect();
            mine.sort();
            for t in mine {
                if load[i] < quota[i] {
                    out[i].active.push(t.clone());
                    load[i] += 1;
                } else {
                    out[i].revoked.push(t.clone());
                    moving.insert(t, i);
                }
            }
        }
        // Where each stateful task's state already is (standby or any local state), least lag first.
        let mut warm: HashMap<&TaskId, Vec<(i64, usize)>> = HashMap::new();
        for (i, m) in metas.iter().enumerate() {
            for (t, sum) in &m.offset_sums {
                if known.contains(t) {
                    let lag = input.end_offsets.get(t).map_or(0, |end| (end - sum).max(0));
                    warm.entry(t).or_default().push((lag, i));
                }
            }
            for t in &m.standby {
                if known.contains(t) && !m.offset_sums.iter().any(|(s, _)| s == t) {
                    warm.entry(t).or_default().push((i64::MAX, i));
                }
            }
        }
        for list in warm.values_mut() {
            list.sort();
        }
        // Unowned tasks go to members with room: a warm one if it has room, else the emptiest.
        let mut room: BinaryHeap<(usize, Reverse<usize>)> = (0..metas.len())
            .filter(|&i| quota[i] > load[i])
            .map(|i| (quota[i] - load[i], Reverse(i)))
            .collect();
        let mut active_owner: HashMap<&TaskId, usize> = HashMap::with_capacity(input.tasks.len());
        for (t, &i) in &owner {
            if !moving.contains_key(t) {
                active_owner.insert(t, i);
            }
        }
        for t in input.tasks {
            if owner.contains_key(t) {
                continue;
            }
            let warm_pick = warm
                .get(t)
                .and_then(|list| list.iter().map(|&(_, i)| i).find(|&i| load[i] < quota[i]));
            let pick = match warm_pick {
                Some(i) => Some(i),
                None => loop {
                    match room.pop() {
                        None => break None,
                        Some((_, Reverse(i))) if load[i] >= quota[i] => continue,
                        Some((r, Reverse(i))) if r != quota[i] - load[i] => room.push((quota[i] - load[i], Reverse(i))),
                        Some((_, Reverse(i))) => break Some(i),
                    }
                },
            };
            let Some(i) = pick else { continue };
            out[i].active.push(t.clone());
            load[i] += 1;
            active_owner.insert(t, i);
            if load[i] < quota[i] {
                room.push((quota[i] - load[i], Reverse(i)));
            }
        }

        // Standbys for stateful tasks, never on the active's member (nor, while a task moves,
        // on the member giving it up: that one keeps its state as a standby anyway).
        let replicas = input.standby_replicas as usize;
        if replicas > 0 && metas.len() > 1 {
            let mut standby_load = vec![0usize; metas.len()];
            let mut by_load: BinaryHeap<(Reverse<usize>, Reverse<usize>)> =
                (0..metas.len()).map(|i| (Reverse(0), Reverse(i))).collect();
            for t in input.tasks.iter().filter(|t| input.stateful.contains(&t.topology)) {
                // None while the task moves: its giver revokes it now, the new owner gets it next.
                let active = active_owner.get(t).copied();
                let mut chosen: Vec<usize> = Vec::with_capacity(replicas);
                if let Some(&giver) = moving.get(t) {
                    // The member giving the task up keeps it warm until the new owner has it.
                    chosen.push(giver);
                }
                for &(_, i) in warm.get(t).map(Vec::as_slice).unwrap_or(&[]) {
                    if chosen.len() >= replicas {
                        break;
                    }
                    if Some(i) != active && !chosen.contains(&i) {
                        chosen.push(i);
                    }
                }
                let mut skipped = Vec::new();
                while chosen.len() < replicas.min(metas.len() - 1) {
                    let Some((Reverse(l), Reverse(i))) = by_load.pop() else {
                        break;
                    };
                    if l != standby_load[i] {
                        by_load.push((Reverse(standby_load[i]), Reverse(i)));
                        continue;
                    }
                    if Some(i) == active || chosen.contains(&i) {
                        skipped.push((Reverse(l), Reverse(i)));
                        continue;
                    }
                    chosen.push(i);
                }
                by_load.extend(skipped);
                for i in chosen {
                    if Some(i) == active {
                        continue;
                    }
                    out[i].standby.push(t.clone());
                    standby_load[i] += 1;
                    by_load.push((Reverse(standby_load[i]), Reverse(i)));
                }
            }
        }
        finish(input.members, out)
    }
}

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
        let quota = quotas(&metas.iter().map(|m| m.capacity).collect::<Vec<_>>(), input.tasks.len());
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
