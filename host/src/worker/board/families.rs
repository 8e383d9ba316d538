//! The metric families the board keeps current, and their labels.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::Role;
use crate::group::TaskId;
use crate::metrics::{RoleLabels, TaskLabels};

/// The metric families the board keeps current.
#[derive(Clone)]
pub struct BoardMetrics {
    pub role: Family<RoleLabels, Gauge>,
    pub lag: Family<TaskLabels, Gauge>,
    pub unavailable: Family<TaskLabels, Counter<f64>>,
    pub rebalances: Counter,
    pub rebalance_seconds: Histogram,
    pub generation: Gauge,
    pub handover_seconds: Family<PhaseLabels, Histogram, fn() -> Histogram>,
}

/// A phase of a handover (`revoke`, `rebalance`, `start`, `first_output`, `total`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: String,
}

/// 5 ms to ~80 s.
fn handover_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.005, 2.0, 15,
    ))
}

impl BoardMetrics {
    pub fn new() -> BoardMetrics {
        BoardMetrics {
            role: Family::default(),
            lag: Family::default(),
            unavailable: Family::default(),
            rebalances: Counter::default(),
            // 10 ms to ~80 s.
            rebalance_seconds: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.01, 2.0, 14,
            )),
            generation: Gauge::default(),
            handover_seconds: Family::new_with_constructor(handover_histogram),
        }
    }

    /// Registers the families with the worker's metrics.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "task_role",
            "1 for each task this worker holds, labelled with its role (active, standby, learner)",
            self.role.clone(),
        );
        registry.register(
            "task_lag_records",
            "Changelog records a task's local state is behind (0 for an active task that processes)",
            self.lag.clone(),
        );
        registry.register(
            "task_unavailable_seconds",
            "Time a task assigned here as active could not process (starting, restoring, retrying)",
            self.unavailable.clone(),
        );
        registry.register(
            "rebalances",
            "Rebalances this worker took part in (from its join to an assignment needing no further join)",
            self.rebalances.clone(),
        );
        registry.register(
            "rebalance_seconds",
            "How long this worker's rebalances took",
            self.rebalance_seconds.clone(),
        );
        registry.register(
            "handover_seconds",
            "Phases of the handovers of tasks to and from this worker: revoke (old owner: revoked to final commit), \
             rebalance (new owner: the revoking round to the assignment here), start (to processing), first_output \
             (to the first record produced), total (the last three)",
            self.handover_seconds.clone(),
        );
        registry.register(
            "generation",
            "The group generation of this worker's last assignment",
            self.generation.clone(),
        );
    }
}

impl Default for BoardMetrics {
    fn default() -> Self {
        BoardMetrics::new()
    }
}

pub(super) fn labels(task: &TaskId) -> TaskLabels {
    TaskLabels {
        topology: task.topology.to_string(),
        task: task.to_string(),
    }
}

pub(super) fn role_labels(task: &TaskId, role: Role) -> RoleLabels {
    RoleLabels {
        topology: task.topology.to_string(),
        task: task.to_string(),
        role: role.as_str().to_string(),
    }
}
