//! Losing the membership: pausing the tasks when the lease still holds (and settling them
//! with the next assignment), or stopping them without committing; and the member loop's
//! two ends, failing and leaving.

use std::time::{Duration, Instant};

use super::super::heartbeats::Kept;
use super::super::{TaskRunner, WorkerReport};
use super::GroupRunner;
use crate::group::metadata::Assignment;
use crate::group::TaskId;

impl GroupRunner<'_> {
    /// The membership is lost (`why`) while the lease still holds: every task pauses (the
    /// lease and the fence are revoked, so nothing is processed or committed, and renewals
    /// do not reach the lease until the next assignment says what goes on) and the worker
    /// rejoins at once, claiming them. A leader holds a vanished member's tasks back for
    /// longer than the lease could have run (see `holds`), so if the group gives them back
    /// before that moment nobody ran them meanwhile, and they go on where they were
    /// ([`settle_pause`](Self::settle_pause)). With the lease already over (or nothing to
    /// pause) it is a plain loss.
    pub(super) async fn pause(&mut self, why: &str) {
        if self.paused_until.is_some() {
            tracing::warn!("{why}: the tasks stay paused, rejoining");
            return;
        }
        let left = self.runner.lease().remaining();
        if left.is_zero() || self.runner.owned().is_empty() {
            return self.lose(why).await;
        }
        self.paused_until = Some(Instant::now() + left);
        self.heartbeats.paused.set(true);
        self.runner.lease().revoke();
        self.runner.fence().revoke();
        self.runner.board().not_ready();
        self.holds.borrow_mut().forget();
        tracing::warn!(
            tasks = self.runner.owned().len(),
            ms = left.as_millis() as u64,
            "{why}: pausing every task (nothing processed or committed) and rejoining; they go on if the group gives them back within the lease"
        );
    }

    /// The first assignment after a pause: the paused tasks it gives back go on where they
    /// were if it came before the lease would have ended (`until`): the leader held them
    /// back until then, so nobody else ran them. The rest stop without committing (those
    /// assigned start again, from their last commit). Then the lease runs again, from the
    /// request that got this generation (`alive_at`).
    pub(super) fn settle_pause(&mut self, a: &Assignment, until: Instant, alive_at: Instant) {
        let owned = self.runner.owned();
        let in_time = Instant::now() < until;
        let (resume, abort): (Vec<TaskId>, Vec<TaskId>) = if in_time {
            owned.into_iter().partition(|t| a.active.contains(t))
        } else {
            (Vec::new(), owned)
        };
        if !abort.is_empty() {
            let stopping = self.runner.begin_stop(&abort, true);
            tokio::task::block_in_place(|| self.runner.finish(stopping));
        }
        tracing::info!(
            resumed = resume.len(), stopped = abort.len(), in_time,
            "the group is joined again: paused tasks it gave back go on where they were, the others stopped without committing"
        );
        self.heartbeats.unpause(alive_at);
    }

    /// The membership is lost and the tasks cannot wait for it (see
    /// [`pause`](Self::pause)): they stop without committing.
    pub(super) async fn lose(&mut self, why: &str) {
        self.paused_until = None;
        self.heartbeats.paused.set(false);
        self.holds.borrow_mut().forget();
        lose_membership(&mut self.runner, why).await;
    }

    /// The worker cannot go on (a second worker with its instance id, a cluster of another
    /// assignor, a broker that refuses it the group): its tasks stop without committing,
    /// the group is left, and the error goes to the caller.
    pub(super) async fn fail(mut self, e: anyhow::Error) -> anyhow::Error {
        tracing::error!(cluster = %self.cluster.name, "the worker stops: {e:#}");
        self.lose("the worker stops on an error").await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.membership.leave()).await;
        tokio::task::block_in_place(|| self.runner.stop_all());
        e
    }

    /// Asked to stop (or drained): every task finishes its batch and commits while the
    /// worker, still a member, heartbeats; then it leaves the group and shuts down.
    pub(super) async fn leave(mut self) -> anyhow::Result<WorkerReport> {
        tracing::info!("stopping: finishing batches in flight, flushing, committing, leaving the group");
        // Still a member while the tasks finish: keep heartbeating so their commits hold.
        let owned = self.runner.owned();
        let stopping = self.runner.begin_stop(&owned, false);
        if let Kept::Lost(why) = self
            .heartbeats
            .wait_for(&mut self.membership, &mut self.runner, stopping)
            .await?
        {
            tracing::warn!(cluster = %self.cluster.name, "{why} while stopping: the tasks stopped without committing");
        }
        // Every task has ended (committed or not): the group may give them away now. Leaving
        // before the rest shuts down (standbys, threads, clients: the better part of a second)
        // lets the others rebalance meanwhile, instead of waiting for this member.
        let left = self.membership.leave().await;
        tracing::debug!(target: "handover", "left the group");
        if let Err(e) = left {
            tracing::warn!("leaving the group: {e}");
        }
        let report = tokio::task::block_in_place(|| self.runner.stop_all());
        Ok(report)
    }
}

/// Membership is lost: others may own these tasks already. Every task stops without
/// committing, then the worker rejoins.
async fn lose_membership(runner: &mut TaskRunner, why: &str) {
    runner.lease().revoke();
    runner.fence().revoke();
    runner.board().not_ready();
    let running = runner.owned();
    tracing::warn!(
        tasks = running.len(),
        "{why}: stopping every task without committing, then rejoining"
    );
    let stopping = runner.begin_stop(&running, true);
    tokio::task::block_in_place(|| runner.finish(stopping));
}
