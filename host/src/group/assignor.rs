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

mod sticky;

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use super::metadata::{Assignment, MemberMetadata, CURRENT_VERSION};
use super::TaskId;
pub use sticky::Sticky;

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

/// Each member's capacity for the quotas: a leaving member's is 0 (its tasks move away).
fn capacities(metas: &[&MemberMetadata]) -> Vec<u32> {
    metas
        .iter()
        .map(|m| if m.leaving { 0 } else { m.capacity.max(1) })
        .collect()
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
