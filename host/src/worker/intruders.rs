//! What a cluster worker does when something that is not a worker of its cluster meddles
//! with its group (on a Kafka without ACLs anyone may join it): a member that leads without
//! the cluster secret, that holds the group with another assignor, or that took this
//! worker's `group.instance.id`. Such members are told apart by their unsigned metadata
//! (`group::intruders`), removed from the group, and the worker joins again; it exits only
//! when the member in its way is a worker of its own cluster (a real misconfiguration).
//!
//! Each incident is logged once, loudly, and counted; what follows it until the group is
//! settled again is logged quietly, so an intruder cannot fill the worker's log.

use std::time::Duration;

use crate::group::intruders::DescribedGroup;
use crate::group::membership::Membership;

use super::group_runner::ClusterConfig;

/// What the worker does next.
pub(super) enum Next {
    /// Join again (after the pause given).
    Rejoin(Duration),
    /// Stop: the member in the way is a worker of this cluster.
    Exit(anyhow::Error),
}

/// Keeps whether an incident was reported already.
#[derive(Default)]
pub(super) struct Intruders {
    /// An incident is going on and was logged loudly.
    reported: bool,
    /// Intruders removed from the group since the worker started.
    pub(super) removed: u64,
    /// Incidents since the group was last settled (see [`Intruders::pause`]).
    streak: u32,
}

impl Intruders {
    /// The group gave this worker an assignment of its own cluster: the next incident is
    /// logged loudly again.
    pub(super) fn settled(&mut self) {
        if self.reported {
            tracing::info!("the cluster's group is led by its own workers again");
        }
        self.reported = false;
        self.streak = 0;
    }

    /// How long to wait before joining again after removing intruders: nothing (an
    /// intruder that rejoins at once races the worker for the empty group, and a worker that
    /// waits loses every race), but 100 ms after ten incidents in a row, so a worker that
    /// cannot remove them does not spin.
    fn pause(&mut self) -> Duration {
        self.streak += 1;
        match self.streak {
            0..=10 => Duration::ZERO,
            _ => Duration::from_millis(100),
        }
    }

    fn report(&mut self, what: std::fmt::Arguments<'_>) {
        if self.reported {
            tracing::debug!("{what}");
        } else {
            tracing::error!("{what}");
            self.reported = true;
        }
    }

    /// Describes the group and removes every member whose metadata is not signed with the
    /// cluster secret. Returns the group as described (none if it could not be described).
    async fn remove_intruders(&mut self, membership: &mut Membership) -> Option<DescribedGroup> {
        let group = match membership.describe_group().await {
            Ok(group) => group,
            Err(e) => {
                tracing::warn!("describing the cluster's group to find members without the secret: {e}");
                return None;
            }
        };
        let intruders = group.intruders();
        if !intruders.is_empty() {
            let names: Vec<String> = intruders
                .iter()
                .map(|m| format!("{} (client id {:?})", m.member_id, m.client_id))
                .collect();
            match membership.remove_members(&intruders).await {
                Ok(()) => {
                    self.removed += intruders.len() as u64;
                    tracing::warn!(members = %names.join(", "), "removed from the cluster's group: members without the cluster secret");
                }
                Err(e) => tracing::warn!("removing members without the cluster secret from the group: {e}"),
            }
        }
        Some(group)
    }

    /// The leader's assignment is not this cluster's (a member without the secret leads).
    /// Nothing was assigned this generation by a worker of the cluster, so every worker
    /// keeps what it runs, under its lease; the intruders are removed and the worker joins
    /// again, so that a worker of the cluster leads.
    pub(super) async fn foreign_leader(
        &mut self,
        cluster: &ClusterConfig,
        membership: &mut Membership,
        leader: &str,
        detail: &str,
    ) -> Next {
        self.report(format_args!(
            "cluster {}: member {leader} leads the group without this cluster's secret ({detail}); its assignment is not \
             applied, this worker keeps its tasks and removes it from the group (a Kafka without ACLs lets anyone \
             join the group: see docs/security.md)",
            cluster.name
        ));
        if cluster.secret.is_none() {
            return Next::Rejoin(Duration::from_secs(2));
        }
        self.remove_intruders(membership).await;
        Next::Rejoin(self.pause())
    }

    /// The coordinator refused this worker's join: the group's members run another
    /// protocol (assignor). When none of them is a worker of the cluster, they are removed
    /// and the worker joins again; otherwise the cluster really runs another assignor.
    pub(super) async fn other_protocol(
        &mut self,
        cluster: &ClusterConfig,
        membership: &mut Membership,
        group_name: &str,
        ours: &str,
    ) -> Next {
        let described = if cluster.secret.is_some() {
            self.remove_intruders(membership).await
        } else {
            membership.describe_group().await.ok()
        };
        if let Some(group) = &described {
            let workers = group.members.iter().filter(|m| m.metadata.is_some()).count();
            if cluster.secret.is_some() && workers == 0 && !group.members.is_empty() {
                self.report(format_args!(
                    "cluster {}: group {group_name} is held by {} member(s) without this cluster's secret running \
                     {:?}; they were removed and this worker joins again",
                    cluster.name,
                    group.members.len(),
                    group.protocol
                ));
                membership.reset_framing();
                return Next::Rejoin(self.pause());
            }
            if group.members.is_empty() {
                // Gone meanwhile (removed, or left): try again.
                membership.reset_framing();
                return Next::Rejoin(self.pause());
            }
        }
        let theirs = described
            .map(|g| g.protocol)
            .filter(|p| !p.is_empty())
            .map_or("an unknown".to_string(), |p| {
                format!("{:?}", p.strip_prefix("sluice-").unwrap_or(&p))
            });
        Next::Exit(anyhow::anyhow!(
            "cluster {} runs the {theirs} assignor, and this worker was started with the {ours:?} assignor: \
             the coordinator of group {group_name} refused it (an eager leader and a sticky follower would run a task \
             on two workers at once); start every worker of a cluster with the same task.assignor (--assignor)",
            cluster.name
        ))
    }

    /// Another member joined with this worker's `group.instance.id` and the coordinator
    /// fenced this one (its tasks are stopped already). A worker of the cluster with
    /// another worker id there is a real second worker with the same id: exit. Anything
    /// else (a member without the secret, or one showing this very worker's id: a copy of
    /// its metadata) is an intruder: it is removed and this worker takes its place back.
    pub(super) async fn fenced(
        &mut self,
        cluster: &ClusterConfig,
        membership: &mut Membership,
        worker_id: [u8; 16],
    ) -> Next {
        let instance = cluster.instance_id.clone().unwrap_or_default();
        membership.forget();
        let group = match membership.describe_group().await {
            Ok(group) => group,
            Err(e) => {
                tracing::warn!("describing the cluster's group after this worker was fenced: {e}");
                return Next::Rejoin(Duration::from_secs(1));
            }
        };
        let holder = group
            .members
            .iter()
            .find(|m| m.instance_id.as_deref() == Some(instance.as_str()));
        let Some(holder) = holder else {
            // Nobody holds it now: take it back.
            return Next::Rejoin(self.pause());
        };
        let worker = holder.metadata.as_ref().filter(|m| m.worker_id != worker_id);
        if worker.is_some() || cluster.secret.is_none() {
            return Next::Exit(anyhow::anyhow!(
                "cluster {}: another worker joined with group.instance.id {instance:?} (member {}), and the \
                 coordinator fenced this one: give every worker its own instance id (--instance-id)",
                cluster.name,
                holder.member_id
            ));
        }
        self.report(format_args!(
            "cluster {}: member {} (client id {:?}) took this worker's group.instance.id {instance:?} without the \
             cluster's secret; this worker's tasks stopped, it removes that member and joins again",
            cluster.name, holder.member_id, holder.client_id
        ));
        let holder = holder.clone();
        match membership.remove_members(&[&holder]).await {
            Ok(()) => self.removed += 1,
            Err(e) => tracing::warn!("removing member {} from the group: {e}", holder.member_id),
        }
        Next::Rejoin(self.pause())
    }
}
