//! Keeping a cluster worker's membership, and so its lease, alive: heartbeats on schedule
//! (also while tasks stop), each renewing the lease to the moment it was sent plus the
//! session timeout less a margin, so the lease ends before the coordinator could give the
//! tasks away (see `task::control`).

use std::time::{Duration, Instant};

use super::group_runner::ClusterConfig;
use super::{Stopping, TaskRunner};
use crate::group::membership::{Heartbeat, Membership, MembershipError};
use crate::task::control::Lease;

/// What keeping the membership alive while waiting for something found.
pub(super) enum Kept {
    /// Still a member; `rejoin`: the coordinator asked for a rebalance meanwhile.
    Member { rejoin: bool },
    /// Membership is lost (or its lease ran out): tasks must stop without committing.
    Lost(String),
}

/// The heartbeat side of a cluster worker: sends heartbeats, renews the lease.
pub(super) struct Heartbeats<'a> {
    pub(super) cluster: &'a ClusterConfig,
    pub(super) lease: std::sync::Arc<Lease>,
    /// When the last heartbeat that found the group stable was sent: a rebalance began
    /// after it.
    pub(super) last_stable: std::cell::Cell<Option<Instant>>,
    /// How long a heartbeat keeps the lease: the session timeout less a safety margin.
    pub(super) lease_length: Duration,
    /// A heartbeat not answered within this counts as unreachable.
    pub(super) timeout: Duration,
}

impl Heartbeats<'_> {
    pub(super) async fn beat(&self, membership: &mut Membership) -> anyhow::Result<Kept> {
        let sent = Instant::now();
        let beat = match membership.heartbeat(self.timeout).await {
            // Another member took this worker's group.instance.id: lost; the next join
            // finds out who (see `intruders::fenced`).
            Err(MembershipError::Fenced { .. }) => {
                return Ok(Kept::Lost(
                    "another member joined with this worker's group.instance.id".into(),
                ))
            }
            beat => beat?,
        };
        Ok(match beat {
            Heartbeat::Alive => {
                self.last_stable.set(Some(sent));
                self.lease.renew(sent, self.lease_length);
                Kept::Member { rejoin: false }
            }
            Heartbeat::RejoinNeeded => {
                // The coordinator drops a member that has not rejoined within the rebalance
                // timeout of the rebalance's start (at the latest, just after the last stable
                // heartbeat), heartbeats or not: the lease must end before that.
                let began = self.last_stable.get().unwrap_or(sent);
                let cap = (began + super::group_runner::REBALANCE_TIMEOUT)
                    .checked_sub(lease_margin(self.cluster.session_timeout))
                    .unwrap_or(began);
                self.lease.cap_at(cap);
                self.lease.renew(sent, self.lease_length);
                Kept::Member { rejoin: true }
            }
            Heartbeat::Lost => Kept::Lost("the group coordinator no longer knows this worker".into()),
            Heartbeat::Unreachable if !self.lease.valid() => Kept::Lost(format!(
                "no successful heartbeat for {:?} (the session timeout is {:?})",
                self.lease_length, self.cluster.session_timeout
            )),
            Heartbeat::Unreachable => Kept::Member { rejoin: false },
        })
    }

    /// Waits for stopping tasks to end while heartbeating on schedule, so a slow stop never
    /// costs the membership. If the membership is lost meanwhile, the tasks are told to
    /// abort instead (nothing more is committed).
    pub(super) async fn wait_for(
        &self,
        membership: &mut Membership,
        runner: &mut TaskRunner,
        stopping: Stopping,
    ) -> anyhow::Result<Kept> {
        let mut kept = Kept::Member { rejoin: false };
        let mut next_beat = Instant::now() + self.cluster.heartbeat_interval;
        while !stopping.is_done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
            if Instant::now() >= next_beat && matches!(kept, Kept::Member { .. }) {
                match self.beat(membership).await? {
                    Kept::Member { rejoin } => {
                        if let Kept::Member { rejoin: r } = &mut kept {
                            *r |= rejoin;
                        }
                    }
                    lost @ Kept::Lost(_) => {
                        stopping.abort();
                        kept = lost;
                    }
                }
                next_beat = Instant::now() + self.cluster.heartbeat_interval;
            }
        }
        runner.finish(stopping);
        Ok(kept)
    }
}

/// How much earlier than the coordinator a member gives up its tasks: a fifth of the session
/// timeout, at least 500 ms (at most half the session).
pub(super) fn lease_margin(session_timeout: Duration) -> Duration {
    (session_timeout / 5)
        .max(Duration::from_millis(500))
        .min(session_timeout / 2)
}
