//! What a leader holds back: the tasks of a member that vanished from the group without
//! leaving it.
//!
//! A member leaves the group cleanly only after its tasks stopped (or after a drain moved
//! them away). One that vanishes was dropped by the coordinator: after its session timed out
//! (it crashed, or froze: its lease ran out long before), or at once, by a LeaveGroup that
//! anyone who reaches a Kafka without ACLs may send for its member id. In the second case it
//! is still processing: it learns from its next heartbeat, and its lease runs for at most the
//! liveness window (`heartbeats::liveness`) after the last request the coordinator answered,
//! which was sent before the removal. So a leader that finds tasks of a member that vanished
//! since its last assignment (or, when it did not lead the last generation, any task nobody
//! claims) gives them to nobody until the hold (`heartbeats::vanished_hold`, longer than
//! the window) has passed since it first saw them so: never two owners at once. The removed
//! member rejoins within a heartbeat or two claiming its tasks, and gets them back (it
//! paused them meanwhile: see `GroupRunner::pause`); a member that crashed has its tasks
//! placed once the hold is over (the leader rejoins for it).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::group::metadata::{Assignment, MemberMetadata};
use crate::group::TaskId;

/// The leader's memory of its last assignment and the tasks it holds back.
#[derive(Debug)]
pub struct Holds {
    length: Duration,
    /// Worker id → the tasks it claimed or was given in the last assignment this worker
    /// made as leader; none when it did not make the last one.
    last: Option<HashMap<[u8; 16], HashSet<TaskId>>>,
    /// Held tasks, since when.
    since: HashMap<TaskId, Instant>,
}

impl Holds {
    pub fn new(length: Duration) -> Holds {
        Holds {
            length,
            last: None,
            since: HashMap::new(),
        }
    }

    /// Of `tasks`, those to give nobody in this assignment (as of `now`).
    pub fn held(
        &mut self,
        members: &BTreeMap<String, MemberMetadata>,
        tasks: &[TaskId],
        now: Instant,
    ) -> HashSet<TaskId> {
        let claimed: HashSet<&TaskId> = members.values().flat_map(|m| m.active.iter()).collect();
        let present: HashSet<[u8; 16]> = members.values().map(|m| m.worker_id).collect();
        let vanished_with: HashSet<&TaskId> = match &self.last {
            None => HashSet::new(),
            Some(last) => last
                .iter()
                .filter(|(worker, _)| !present.contains(*worker))
                .flat_map(|(_, tasks)| tasks.iter())
                .collect(),
        };
        // A group that starts (every member new to it, none claiming anything) runs nothing
        // yet: nothing to hold for a leader that did not make the last assignment.
        let starting = self.last.is_none()
            && self.since.is_empty()
            && claimed.is_empty()
            && members.values().all(|m| m.joined_from.is_some_and(|g| g < 0));
        let mut held = HashSet::new();
        let mut since = HashMap::new();
        for task in tasks.iter().filter(|t| !claimed.contains(t)) {
            let maybe_running =
                (self.last.is_none() && !starting) || vanished_with.contains(task) || self.since.contains_key(task);
            if !maybe_running {
                continue;
            }
            let began = self.since.get(task).copied().unwrap_or(now);
            if now < began + self.length {
                since.insert(task.clone(), began);
                held.insert(task.clone());
            }
        }
        self.since = since;
        held
    }

    /// The assignment this worker made as leader, for the next one.
    pub fn remember(&mut self, members: &BTreeMap<String, MemberMetadata>, out: &BTreeMap<String, Assignment>) {
        let mut last: HashMap<[u8; 16], HashSet<TaskId>> = HashMap::new();
        for (id, m) in members {
            let tasks = last.entry(m.worker_id).or_default();
            tasks.extend(m.active.iter().cloned());
            if let Some(a) = out.get(id) {
                tasks.extend(a.active.iter().cloned());
            }
        }
        self.last = Some(last);
    }

    /// Another member leads now (or this worker lost its membership): what it remembers
    /// may be out of date, and its holds are the new leader's business.
    pub fn forget(&mut self) {
        self.last = None;
        self.since.clear();
    }

    /// When the first hold ends (the leader rejoins then, to place the task).
    pub fn next_end(&self) -> Option<Instant> {
        self.since.values().min().map(|t| *t + self.length)
    }

    /// Tasks held now, for the log.
    pub fn count(&self) -> usize {
        self.since.len()
    }
}

/// Takes the `held` tasks out of an assignment: nobody runs them active; a member that keeps
/// a standby of one (it says so in its metadata) keeps it, so their warm copies stay warm
/// through the hold.
pub fn withhold(
    out: &mut BTreeMap<String, Assignment>,
    members: &BTreeMap<String, MemberMetadata>,
    held: &HashSet<TaskId>,
) {
    if held.is_empty() {
        return;
    }
    for (id, a) in out.iter_mut() {
        a.active.retain(|t| !held.contains(t));
        a.learner.retain(|t| !held.contains(t));
        let Some(m) = members.get(id) else { continue };
        for t in m.standby.iter().filter(|t| held.contains(*t)) {
            if !a.standby.contains(t) {
                a.standby.push(t.clone());
            }
        }
        a.standby.sort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(worker: u8, active: &[u32]) -> MemberMetadata {
        MemberMetadata {
            worker_id: [worker; 16],
            active: active.iter().map(|p| TaskId::new("t", *p)).collect(),
            ..Default::default()
        }
    }

    fn tasks(n: u32) -> Vec<TaskId> {
        (0..n).map(|p| TaskId::new("t", p)).collect()
    }

    fn ids(held: &HashSet<TaskId>) -> Vec<u32> {
        let mut v: Vec<u32> = held.iter().map(|t| t.partition).collect();
        v.sort();
        v
    }

    #[test]
    fn a_vanished_members_tasks_are_held_for_the_hold_and_no_longer() {
        let mut holds = Holds::new(Duration::from_secs(2));
        let t0 = Instant::now();
        let both: BTreeMap<String, MemberMetadata> = [
            ("a".to_string(), member(1, &[0, 1])),
            ("b".to_string(), member(2, &[2, 3])),
        ]
        .into();
        assert_eq!(ids(&holds.held(&both, &tasks(4), t0)), Vec::<u32>::new());
        holds.remember(&both, &BTreeMap::new());
        // Worker 1 vanishes: its tasks are held, from the first time they are seen so.
        let b_alone: BTreeMap<String, MemberMetadata> = [("b".to_string(), member(2, &[2, 3]))].into();
        assert_eq!(
            ids(&holds.held(&b_alone, &tasks(4), t0 + Duration::from_millis(100))),
            vec![0, 1]
        );
        holds.remember(&b_alone, &BTreeMap::new());
        assert_eq!(holds.next_end(), Some(t0 + Duration::from_millis(2100)));
        assert_eq!(
            ids(&holds.held(&b_alone, &tasks(4), t0 + Duration::from_millis(2000))),
            vec![0, 1]
        );
        holds.remember(&b_alone, &BTreeMap::new());
        assert_eq!(
            ids(&holds.held(&b_alone, &tasks(4), t0 + Duration::from_millis(2100))),
            Vec::<u32>::new()
        );
        assert_eq!(holds.next_end(), None);
    }

    #[test]
    fn a_member_that_comes_back_claiming_its_tasks_ends_their_hold() {
        let mut holds = Holds::new(Duration::from_secs(2));
        let t0 = Instant::now();
        let both: BTreeMap<String, MemberMetadata> =
            [("a".to_string(), member(1, &[0])), ("b".to_string(), member(2, &[1]))].into();
        holds.remember(&both, &BTreeMap::new());
        let b_alone: BTreeMap<String, MemberMetadata> = [("b".to_string(), member(2, &[1]))].into();
        assert_eq!(ids(&holds.held(&b_alone, &tasks(2), t0)), vec![0]);
        holds.remember(&b_alone, &BTreeMap::new());
        // Back under a new member id, claiming its task.
        let back: BTreeMap<String, MemberMetadata> =
            [("a2".to_string(), member(1, &[0])), ("b".to_string(), member(2, &[1]))].into();
        assert_eq!(
            ids(&holds.held(&back, &tasks(2), t0 + Duration::from_millis(300))),
            Vec::<u32>::new()
        );
        assert_eq!(holds.count(), 0);
    }

    #[test]
    fn a_member_present_that_no_longer_claims_a_task_does_not_run_it() {
        // Revoked and stopped, failed, or aborted when it lost its membership: present
        // members' claims are what they run, so nothing is held.
        let mut holds = Holds::new(Duration::from_secs(2));
        let t0 = Instant::now();
        let both: BTreeMap<String, MemberMetadata> =
            [("a".to_string(), member(1, &[0, 1])), ("b".to_string(), member(2, &[]))].into();
        holds.remember(&both, &BTreeMap::new());
        let a_stopped: BTreeMap<String, MemberMetadata> =
            [("a".to_string(), member(1, &[0])), ("b".to_string(), member(2, &[]))].into();
        assert_eq!(ids(&holds.held(&a_stopped, &tasks(2), t0)), Vec::<u32>::new());
    }

    #[test]
    fn held_tasks_run_nowhere_and_their_standbys_stay() {
        let t = |p| TaskId::new("t", p);
        let mut b = member(2, &[1]);
        b.standby = vec![t(0)];
        let members: BTreeMap<String, MemberMetadata> = [("b".to_string(), b)].into();
        let mut out: BTreeMap<String, Assignment> = [(
            "b".to_string(),
            Assignment {
                active: vec![t(0), t(1)],
                ..Default::default()
            },
        )]
        .into();
        withhold(&mut out, &members, &[t(0)].into());
        assert_eq!(out["b"].active, vec![t(1)]);
        assert_eq!(out["b"].standby, vec![t(0)]);
    }

    #[test]
    fn a_group_that_starts_holds_nothing() {
        let mut holds = Holds::new(Duration::from_secs(2));
        let fresh = |w| MemberMetadata {
            joined_from: Some(-1),
            ..member(w, &[])
        };
        let both: BTreeMap<String, MemberMetadata> = [("a".to_string(), fresh(1)), ("b".to_string(), fresh(2))].into();
        assert_eq!(ids(&holds.held(&both, &tasks(3), Instant::now())), Vec::<u32>::new());
        // One that was a member of the last generation: the leader did not make it, so
        // whoever left since may still run the unclaimed tasks.
        let mut was = both.clone();
        was.get_mut("b").unwrap().joined_from = Some(7);
        assert_eq!(ids(&holds.held(&was, &tasks(3), Instant::now())), vec![0, 1, 2]);
    }

    #[test]
    fn a_leader_without_the_last_assignment_holds_every_unclaimed_task() {
        let mut holds = Holds::new(Duration::from_secs(2));
        let t0 = Instant::now();
        let b: BTreeMap<String, MemberMetadata> = [("b".to_string(), member(2, &[1]))].into();
        assert_eq!(ids(&holds.held(&b, &tasks(3), t0)), vec![0, 2]);
        holds.forget();
        assert_eq!(holds.next_end(), None);
    }

    #[test]
    fn tasks_given_out_by_the_last_assignment_count_as_the_members() {
        let mut holds = Holds::new(Duration::from_secs(2));
        let t0 = Instant::now();
        let both: BTreeMap<String, MemberMetadata> =
            [("a".to_string(), member(1, &[])), ("b".to_string(), member(2, &[]))].into();
        let out: BTreeMap<String, Assignment> = [(
            "a".to_string(),
            Assignment {
                active: vec![TaskId::new("t", 0)],
                ..Default::default()
            },
        )]
        .into();
        holds.remember(&both, &out);
        let b_alone: BTreeMap<String, MemberMetadata> = [("b".to_string(), member(2, &[]))].into();
        assert_eq!(ids(&holds.held(&b_alone, &tasks(2), t0)), vec![0]);
    }
}
