//! Topology-aware placement, on the leader: which tasks exist and which members may run
//! them, from what every member advertises — never from what the leader happens to run.
//!
//! A topology's tasks go only to members that run it identically (same partition count and
//! digest). When members disagree (a rolling deploy of a new version), the variant run by
//! the most members wins and the disagreement is reported. The assignor then runs once per
//! topology over its eligible members, so a member never gets a task it cannot run.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::assignor::{Assignor, AssignorInput, LearnerPolicy};
use super::metadata::{Assignment, MemberMetadata, TopologyInfo, CURRENT_VERSION};
use super::TaskId;

/// What the leader will place, and on whom.
#[derive(Debug, Default)]
pub struct Placement {
    /// Every task of every topology some member can run.
    pub tasks: Vec<TaskId>,
    /// The units (see [`TaskId::unit`]) whose tasks keep state.
    pub stateful: HashSet<Arc<str>>,
    /// Topology → the members that may run its tasks.
    eligible: BTreeMap<Arc<str>, BTreeSet<String>>,
    /// Disagreements among members, for the log and `sluice status`.
    pub problems: Vec<Problem>,
}

/// A disagreement about one topology (named, so `sluice status` shows a tenant only its own).
#[derive(Debug, Clone)]
pub struct Problem {
    pub topology: String,
    pub text: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Works out the placement from the members' metadata. Members that predate topology
/// advertisements are taken to run every topology (the behaviour of their version): every
/// advertised one, and the leader's own (`local`) where nobody advertises it.
pub fn plan(members: &BTreeMap<String, MemberMetadata>, local: &[TopologyInfo]) -> Placement {
    // Topology name → variant → the members running that variant.
    let mut variants: BTreeMap<&str, BTreeMap<&TopologyInfo, Vec<&String>>> = BTreeMap::new();
    let mut legacy = Vec::new();
    for (id, m) in members {
        match &m.topologies {
            Some(list) => {
                for t in list {
                    variants.entry(&t.name).or_default().entry(t).or_default().push(id);
                }
            }
            None => legacy.push(id),
        }
    }
    if !legacy.is_empty() {
        for t in local {
            variants.entry(&t.name).or_default().entry(t).or_default();
        }
    }
    let mut placement = Placement::default();
    for (name, by_variant) in variants {
        // The variant most members run; ties go to the one whose members hold more of its
        // tasks now, then to the smaller digest (every leader decides the same).
        let by_variant: BTreeMap<&TopologyInfo, Vec<&String>> = match by_variant.iter().any(|(_, ms)| !ms.is_empty()) {
            // The leader's own fallback counts only where no member advertises the topology.
            true => by_variant.into_iter().filter(|(_, ms)| !ms.is_empty()).collect(),
            false => by_variant,
        };
        let (winner, runners) = by_variant
            .iter()
            .max_by(|(a, ma), (b, mb)| {
                let holding = |list: &Vec<&String>| -> usize {
                    list.iter()
                        .map(|id| members[*id].active.iter().filter(|t| &*t.topology == name).count())
                        .sum()
                };
                ma.len()
                    .cmp(&mb.len())
                    .then(holding(ma).cmp(&holding(mb)))
                    .then(b.digest.cmp(&a.digest))
            })
            .expect("a topology has at least one variant");
        if by_variant.len() > 1 {
            let described: Vec<String> = by_variant
                .iter()
                .map(|(v, ms)| {
                    let partitions = match v.subs.is_empty() {
                        true => v.partitions.to_string(),
                        false => {
                            let subs: Vec<String> =
                                v.subs.iter().map(|s| format!("{} {}", s.name, s.partitions)).collect();
                            subs.join(" + ")
                        }
                    };
                    format!(
                        "{} member(s) run {} partitions, digest {}",
                        ms.len(),
                        partitions,
                        hex(&v.digest)
                    )
                })
                .collect();
            placement.problems.push(Problem {
                topology: name.to_string(),
                text: format!(
                    "topology {name}: members disagree ({}); its tasks go to the {} member(s) running digest {}",
                    described.join("; "),
                    runners.len(),
                    hex(&winner.digest)
                ),
            });
        }
        let topology: Arc<str> = Arc::from(name);
        if winner.subs.is_empty() {
            placement
                .tasks
                .extend((0..winner.partitions).map(|p| TaskId::new(name, p)));
            if winner.stateful {
                placement.stateful.insert(topology.clone());
            }
        }
        for sub in &winner.subs {
            placement
                .tasks
                .extend((0..sub.partitions).map(|p| TaskId::of(name, Some(&sub.name), p)));
            if sub.stateful {
                placement.stateful.insert(format!("{name}/{}", sub.name).into());
            }
        }
        let mut eligible: BTreeSet<String> = runners.iter().map(|id| (*id).clone()).collect();
        eligible.extend(legacy.iter().map(|id| (*id).clone()));
        placement.eligible.insert(topology, eligible);
    }
    placement
}

/// Runs `assignor` once per topology over the members eligible for it, and merges the
/// results. A member's tasks of topologies it may not run are revoked.
pub fn assign(
    assignor: &dyn Assignor,
    members: &BTreeMap<String, MemberMetadata>,
    placement: &Placement,
    end_offsets: &HashMap<TaskId, i64>,
    standby_replicas: u32,
    learners: LearnerPolicy,
) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members
        .keys()
        .map(|id| {
            (
                id.clone(),
                Assignment {
                    version: CURRENT_VERSION,
                    ..Default::default()
                },
            )
        })
        .collect();
    let mut by_topology: HashMap<&str, Vec<TaskId>> = HashMap::new();
    for t in &placement.tasks {
        by_topology.entry(&t.topology).or_default().push(t.clone());
    }
    // A task still active on a member that may not run it is revoked there first and placed
    // in the next generation, so it never has two owners.
    let mut held_elsewhere: HashSet<&TaskId> = HashSet::new();
    for (id, m) in members {
        for t in &m.active {
            if !placement.eligible.get(&t.topology).is_some_and(|e| e.contains(id)) {
                held_elsewhere.insert(t);
            }
        }
    }
    let mut rejoin = false;
    for (topology, eligible) in &placement.eligible {
        let mut tasks = by_topology.remove(&**topology).unwrap_or_default();
        tasks.retain(|t| !held_elsewhere.contains(t));
        let only =
            |list: &[TaskId]| -> Vec<TaskId> { list.iter().filter(|t| t.topology == *topology).cloned().collect() };
        let sub: BTreeMap<String, MemberMetadata> = eligible
            .iter()
            .filter_map(|id| members.get(id).map(|m| (id, m)))
            .map(|(id, m)| {
                let view = MemberMetadata {
                    active: only(&m.active),
                    standby: only(&m.standby),
                    learner: only(&m.learner),
                    offset_sums: m
                        .offset_sums
                        .iter()
                        .filter(|(t, _)| t.topology == *topology)
                        .cloned()
                        .collect(),
                    topologies: None,
                    failed: Vec::new(),
                    ..m.clone()
                };
                (id.clone(), view)
            })
            .collect();
        let result = assignor.assign(&AssignorInput {
            members: &sub,
            tasks: &tasks,
            stateful: &placement.stateful,
            end_offsets,
            standby_replicas,
            learners,
        });
        for (id, a) in result {
            let merged = out.get_mut(&id).expect("an eligible member is a member");
            merged.active.extend(a.active);
            merged.standby.extend(a.standby);
            merged.revoked.extend(a.revoked);
            merged.learner.extend(a.learner);
            rejoin |= a.rejoin;
        }
    }
    // Tasks a member runs but may not (its topology lost, or no longer deployed anywhere).
    for (id, m) in members {
        let a = out.get_mut(id).expect("every member has an assignment");
        for t in &m.active {
            let allowed =
                placement.eligible.get(&t.topology).is_some_and(|e| e.contains(id)) && placement.tasks.contains(t);
            if !allowed && !a.revoked.contains(t) {
                a.revoked.push(t.clone());
                // Someone else gets it in the next generation.
                rejoin |= placement.tasks.contains(t);
            }
        }
    }
    for a in out.values_mut() {
        a.rejoin = rejoin;
        a.active.sort();
        a.standby.sort();
        a.revoked.sort();
        a.learner.sort();
    }
    out
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::assignor::by_name;

    fn info(name: &str, partitions: u32, digest: u8) -> TopologyInfo {
        TopologyInfo {
            name: name.into(),
            partitions,
            digest: [digest; 16],
            stateful: false,
            subs: Vec::new(),
        }
    }

    fn member(topologies: Vec<TopologyInfo>, active: &[(&str, u32)]) -> MemberMetadata {
        MemberMetadata {
            version: CURRENT_VERSION,
            supported: CURRENT_VERSION,
            capacity: 1,
            active: active.iter().map(|(t, p)| TaskId::new(t, *p)).collect(),
            topologies: Some(topologies),
            ..Default::default()
        }
    }

    fn owners(out: &BTreeMap<String, Assignment>) -> BTreeMap<String, Vec<String>> {
        out.iter()
            .map(|(id, a)| (id.clone(), a.active.iter().map(TaskId::to_string).collect()))
            .collect()
    }

    #[test]
    fn tasks_go_only_to_members_that_run_the_topology() {
        let members: BTreeMap<String, MemberMetadata> = [
            (
                "a".to_string(),
                member(vec![info("orders", 4, 1), info("clicks", 2, 2)], &[]),
            ),
            ("b".to_string(), member(vec![info("orders", 4, 1)], &[])),
            ("c".to_string(), member(vec![], &[])),
        ]
        .into();
        let placement = plan(&members, &[]);
        assert_eq!(placement.tasks.len(), 6);
        assert!(placement.problems.is_empty());
        for name in ["sticky", "eager"] {
            let out = assign(
                &*by_name(name).unwrap(),
                &members,
                &placement,
                &HashMap::new(),
                0,
                LearnerPolicy::NONE,
            );
            let o = owners(&out);
            assert!(o["c"].is_empty(), "{name}: c runs no topology: {o:?}");
            assert!(o["b"].iter().all(|t| t.starts_with("orders/")), "{name}: {o:?}");
            assert!(o["a"].contains(&"clicks/0".to_string()) && o["a"].contains(&"clicks/1".to_string()));
            let all: BTreeSet<&String> = o.values().flatten().collect();
            assert_eq!(all.len(), 6, "{name}: every task is placed once: {o:?}");
        }
    }

    #[test]
    fn every_sub_topology_gets_its_own_tasks_and_only_stateful_ones_get_standbys() {
        use crate::group::metadata::SubInfo;
        let staged = TopologyInfo {
            name: "wc".into(),
            partitions: 0,
            digest: [5; 16],
            stateful: true,
            subs: vec![
                SubInfo {
                    name: "split".into(),
                    partitions: 4,
                    stateful: false,
                },
                SubInfo {
                    name: "count".into(),
                    partitions: 8,
                    stateful: true,
                },
            ],
        };
        let members: BTreeMap<String, MemberMetadata> = ["a", "b"]
            .iter()
            .map(|id| (id.to_string(), member(vec![staged.clone()], &[])))
            .collect();
        let placement = plan(&members, &[]);
        assert_eq!(placement.tasks.len(), 12);
        assert!(placement.tasks.contains(&TaskId::of("wc", Some("count"), 7)));
        assert!(!placement.tasks.contains(&TaskId::of("wc", Some("split"), 4)));
        let out = assign(
            &*by_name("sticky").unwrap(),
            &members,
            &placement,
            &HashMap::new(),
            1,
            LearnerPolicy::NONE,
        );
        let active: BTreeSet<String> = owners(&out).into_values().flatten().collect();
        assert_eq!(active.len(), 12, "{out:?}");
        let standbys: Vec<String> = out
            .values()
            .flat_map(|a| a.standby.iter().map(TaskId::to_string))
            .collect();
        assert_eq!(standbys.len(), 8, "one standby per counting task: {standbys:?}");
        assert!(standbys.iter().all(|t| t.starts_with("wc/count/")), "{standbys:?}");
    }

    #[test]
    fn when_members_disagree_the_majority_variant_wins_and_it_is_reported() {
        let members: BTreeMap<String, MemberMetadata> = [
            (
                "a".to_string(),
                member(vec![info("orders", 4, 1)], &[("orders", 0), ("orders", 1)]),
            ),
            (
                "b".to_string(),
                member(vec![info("orders", 4, 2)], &[("orders", 2), ("orders", 3)]),
            ),
            ("c".to_string(), member(vec![info("orders", 4, 2)], &[])),
        ]
        .into();
        let placement = plan(&members, &[]);
        assert_eq!(placement.problems.len(), 1, "{:?}", placement.problems);
        assert!(placement.problems[0].text.contains("members disagree"));
        let out = assign(
            &*by_name("sticky").unwrap(),
            &members,
            &placement,
            &HashMap::new(),
            0,
            LearnerPolicy::NONE,
        );
        // a runs the losing variant: its tasks are revoked and given to nobody this round.
        assert_eq!(out["a"].revoked.len(), 2);
        assert!(out["a"].active.is_empty());
        let placed: Vec<&TaskId> = out.values().flat_map(|a| &a.active).collect();
        assert!(
            !placed.iter().any(|t| t.partition < 2),
            "revoked tasks must wait a generation: {placed:?}"
        );
        assert!(out.values().all(|a| a.rejoin));
    }

    #[test]
    fn a_member_of_an_older_version_is_taken_to_run_everything() {
        let mut old = member(vec![], &[]);
        old.topologies = None;
        let members: BTreeMap<String, MemberMetadata> = [
            ("a".to_string(), member(vec![info("orders", 4, 1)], &[])),
            ("old".to_string(), old),
        ]
        .into();
        let placement = plan(&members, &[]);
        let out = assign(
            &*by_name("sticky").unwrap(),
            &members,
            &placement,
            &HashMap::new(),
            0,
            LearnerPolicy::NONE,
        );
        assert_eq!(out["a"].active.len(), 2);
        assert_eq!(out["old"].active.len(), 2);
    }

    #[test]
    fn when_nobody_advertises_the_leaders_own_topologies_go_to_the_older_members() {
        let mut old = member(vec![], &[]);
        old.topologies = None;
        let members: BTreeMap<String, MemberMetadata> =
            [("old1".to_string(), old.clone()), ("old2".to_string(), old)].into();
        let placement = plan(&members, &[info("orders", 4, 1)]);
        assert_eq!(placement.tasks.len(), 4);
        let out = assign(
            &*by_name("sticky").unwrap(),
            &members,
            &placement,
            &HashMap::new(),
            0,
            LearnerPolicy::NONE,
        );
        assert_eq!(out["old1"].active.len() + out["old2"].active.len(), 4);
        assert!(placement.problems.is_empty());
    }
}
