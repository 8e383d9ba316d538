//! What the caller of `sluice status` may see of what the group itself shows, decided by
//! the workers' answers to its token.

use std::collections::BTreeSet;

use sluice::group::metadata::Assignment;
use sluice::group::TaskId;
use sluice::worker::board::WorkerStatus;

/// What the caller may see of what the group shows, from the workers' answers to its token.
#[derive(Debug, PartialEq)]
pub(super) enum Sight {
    /// No token (Kafka's ACLs decided who may describe the group), or one the workers
    /// showed everything to (the admin, an operator).
    All,
    /// A tenant's token: the topologies the workers said are its own.
    Tenant(BTreeSet<String>),
    /// A token no worker answered to: nothing said what it may see.
    Unknown,
}

impl Sight {
    pub(super) fn of(token: bool, answers: &[Option<anyhow::Result<WorkerStatus>>]) -> Sight {
        if !token {
            return Sight::All;
        }
        let live: Vec<&WorkerStatus> = answers.iter().flatten().filter_map(|a| a.as_ref().ok()).collect();
        if live.is_empty() {
            return Sight::Unknown;
        }
        // One narrowed answer narrows all (the workers read the same registry; one that is
        // behind may know fewer of the tenant's topologies, never another tenant's).
        let narrowed: Vec<_> = live.iter().filter_map(|l| l.narrowed_to.as_ref()).collect();
        if narrowed.is_empty() {
            return Sight::All;
        }
        Sight::Tenant(narrowed.iter().flat_map(|n| n.topologies.iter().cloned()).collect())
    }

    pub(super) fn sees(&self, topology: &str) -> bool {
        match self {
            Sight::All => true,
            Sight::Tenant(mine) => mine.contains(topology),
            Sight::Unknown => false,
        }
    }

    /// The part of an assignment the caller may see.
    pub(super) fn cut(&self, assignment: &Assignment) -> Assignment {
        let keep =
            |tasks: &Vec<TaskId>| -> Vec<TaskId> { tasks.iter().filter(|t| self.sees(&t.topology)).cloned().collect() };
        Assignment {
            active: keep(&assignment.active),
            standby: keep(&assignment.standby),
            learner: keep(&assignment.learner),
            revoked: keep(&assignment.revoked),
            ..assignment.clone()
        }
    }
}

/// The topology a task id as the workers show it (`<topology>/<partition>`,
/// `<topology>/<sub>/<partition>`) is of.
pub(super) fn topology_of(task: &str) -> &str {
    task.split_once('/').map_or(task, |(t, _)| t)
}

#[cfg(test)]
mod tests {
    use super::super::worker_row;
    use super::*;
    use sluice::group::metadata::MemberMetadata;

    #[test]
    fn a_tenants_token_sees_only_what_the_workers_said_is_its_own_and_an_unanswered_one_nothing() {
        let narrowed = |topologies: &[&str]| WorkerStatus {
            narrowed_to: Some(sluice::worker::board::Narrowed {
                tenant: "alpha".into(),
                topologies: topologies.iter().map(|t| t.to_string()).collect(),
            }),
            ..Default::default()
        };
        let refused = || Some(Err(anyhow::anyhow!("401")));
        // No token: the group's view, as Kafka's ACLs let the caller read it.
        assert_eq!(Sight::of(false, &[refused()]), Sight::All);
        // A token no worker answered to, or only workers without an admin endpoint.
        assert_eq!(Sight::of(true, &[refused(), None]), Sight::Unknown);
        assert_eq!(Sight::of(true, &[Some(Ok(WorkerStatus::default()))]), Sight::All);
        // A tenant's: the union of its topologies as the workers know them, even beside an
        // answer that was not narrowed.
        let sight = Sight::of(
            true,
            &[
                Some(Ok(narrowed(&["a.one"]))),
                Some(Ok(narrowed(&["a.two"]))),
                Some(Ok(WorkerStatus::default())),
            ],
        );
        assert!(sight.sees("a.one") && sight.sees("a.two") && !sight.sees("b.one") && !sight.sees(""));
        let assignment = Assignment {
            active: vec![TaskId::new("a.one", 0), TaskId::new("b.one", 0)],
            standby: vec![TaskId::new("b.one", 1)],
            learner: vec![TaskId::new("a.two", 2)],
            revoked: vec![TaskId::new("b.one", 2)],
            generation: 4,
            ..Default::default()
        };
        let cut = sight.cut(&assignment);
        assert_eq!(cut.active, vec![TaskId::new("a.one", 0)]);
        assert!(cut.standby.is_empty() && cut.revoked.is_empty());
        assert_eq!((cut.learner.len(), cut.generation), (1, 4));
        let row = worker_row(
            "m".into(),
            "h".into(),
            &MemberMetadata::default(),
            &assignment,
            &sight,
            None,
        );
        assert_eq!((row.active, row.standby, row.learner), (Some(1), Some(0), Some(1)));
        let row = worker_row(
            "m".into(),
            "h".into(),
            &MemberMetadata::default(),
            &assignment,
            &Sight::Unknown,
            None,
        );
        assert_eq!((row.active, row.standby, row.learner), (None, None, None));
        assert_eq!(topology_of("a.one/sub/3"), "a.one");
    }
}
