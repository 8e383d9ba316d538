//! Keeping a cluster worker's membership, and so its lease, alive: heartbeats on schedule
//! (also while tasks stop), each renewing the lease to the moment it was sent plus the
//! [`liveness`] window (never past the session timeout less a margin), so the lease ends
//! before the coordinator could give the tasks away (see `task::control`) and before a
//! leader gives away the tasks of a member that vanished from the group without leaving it
//! (removed by someone else's LeaveGroup: see `group_runner::holds`).

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
    /// How long a heartbeat keeps the lease: the [`liveness`] window, at most the session
    /// timeout less a safety margin.
    pub(super) lease_length: Duration,
    /// When the last heartbeat (or join) the coordinator answered as a member was sent.
    pub(super) last_heard: std::cell::Cell<Option<Instant>>,
    /// Renewals do not reach the lease: the membership was lost and the tasks wait, paused,
    /// for the worker to learn (from its next assignment) whether they may go on.
    pub(super) paused: std::cell::Cell<bool>,
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
                self.renew(sent);
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
                self.renew(sent);
                Kept::Member { rejoin: true }
            }
            Heartbeat::Lost => Kept::Lost("the group coordinator no longer knows this worker".into()),
            // The lease lapses after the liveness window (the tasks wait meanwhile); the
            // membership is given up only when the coordinator may have dropped it.
            Heartbeat::Unreachable if !self.may_be_member(sent) => Kept::Lost(format!(
                "no successful heartbeat for {:?} (the session timeout is {:?})",
                self.session_lease(),
                self.cluster.session_timeout
            )),
            Heartbeat::Unreachable => Kept::Member { rejoin: false },
        })
    }

    /// The coordinator answered a request sent at `sent` as from a member: the lease runs
    /// on from then (unless the tasks are paused).
    pub(super) fn renew(&self, sent: Instant) {
        self.last_heard
            .set(Some(self.last_heard.get().map_or(sent, |t| t.max(sent))));
        if !self.paused.get() {
            self.lease.renew(sent, self.lease_length);
        }
    }

    /// Paused tasks may go on: the lease runs from `sent` (a request the coordinator answered
    /// in the generation that gave them back).
    pub(super) fn unpause(&self, sent: Instant) {
        self.paused.set(false);
        self.renew(sent);
    }

    /// The session timeout less the margin: how long after the last answered request the
    /// coordinator surely still knows this member.
    fn session_lease(&self) -> Duration {
        let session = self.cluster.session_timeout;
        session.saturating_sub(lease_margin(session))
    }

    /// Whether the coordinator may still count this worker a member at `now`.
    fn may_be_member(&self, now: Instant) -> bool {
        self.last_heard
            .get()
            .is_some_and(|heard| now.saturating_duration_since(heard) < self.session_lease())
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

/// How long after a request the coordinator answered as from a member this worker may go on
/// processing without hearing from it again: five heartbeat intervals, at least 1.5 s (and
/// never past the session timeout less [`lease_margin`]: see `Heartbeats::lease_length`).
///
/// A member removed by someone else's LeaveGroup learns it from its next heartbeat, but the
/// coordinator has let the others rebalance without it at once; the leader holds that
/// member's tasks back for [`vanished_hold`], which outlasts this window, so they are never
/// run by two members at once, and the removed member that rejoins within it gets them back
/// without a restart. Every worker of a cluster should have the same heartbeat interval (a
/// leader's hold is its own window).
pub(super) fn liveness(heartbeat_interval: Duration) -> Duration {
    (heartbeat_interval * 5).max(Duration::from_millis(1500))
}

/// How long a leader holds back the tasks of a member that left the group without saying
/// so (see [`liveness`]): the window, and a margin for the clocks of two processes.
pub(super) fn vanished_hold(heartbeat_interval: Duration) -> Duration {
    liveness(heartbeat_interval) + Duration::from_millis(250)
}

/// How much earlier than the coordinator a member gives up its tasks: a fifth of the session
/// timeout, at least 500 ms (at most half the session).
pub(super) fn lease_margin(session_timeout: Duration) -> Duration {
    (session_timeout / 5)
        .max(Duration::from_millis(500))
        .min(session_timeout / 2)
}
