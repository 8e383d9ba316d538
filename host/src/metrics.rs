//! Prometheus metrics of one worker's tasks, and their text exposition. Other parts of the
//! worker (its status board) register families of their own through [`Metrics::with`].

use std::sync::Arc;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskLabels {
    pub topology: String,
    pub task: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabels {
    pub topology: String,
    pub task: String,
    /// `active`, `standby` or `learner`.
    pub role: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreLabels {
    pub topology: String,
    pub task: String,
    pub store: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub topology: String,
    pub task: String,
    pub kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectLabels {
    pub topology: String,
    pub task: String,
    /// `skip` or `dead-letter`.
    pub action: String,
    /// The fault's kind.
    pub kind: String,
}

/// Every metric the worker exports. Cheap to clone (the families are shared).
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    pub records_in: Family<TaskLabels, Counter>,
    pub records_out: Family<TaskLabels, Counter>,
    pub guest_calls: Family<TaskLabels, Counter>,
    pub guest_call_seconds: Family<TaskLabels, Counter<f64>>,
    pub task_errors: Family<ErrorLabels, Counter>,
    /// Batches whose guest call faulted, by kind, whether the task went on or not.
    pub guest_faults: Family<ErrorLabels, Counter>,
    pub records_rejected: Family<RejectLabels, Counter>,
    pub task_failed: Family<TaskLabels, Gauge>,
    /// Times a task processed past an empty source partition it had waited for in vain.
    pub enforced_processing: Family<TaskLabels, Counter>,
    pub tasks_running: Gauge,
    pub restored_records: Family<StoreLabels, Counter>,
    pub restore_remaining: Family<StoreLabels, Gauge>,
    pub restore_rate: Family<StoreLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub restore_seconds_left: Family<StoreLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Registry records skipped for their signature (written by someone without the secret).
    pub registry_rejected: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics::with(|_| {})
    }

    /// The task metrics, and whatever `more` registers beside them.
    pub fn with(more: impl FnOnce(&mut Registry)) -> Metrics {
        let mut registry = Registry::with_prefix("sluice");
        let records_in = Family::<TaskLabels, Counter>::default();
        let records_out = Family::<TaskLabels, Counter>::default();
        let guest_calls = Family::<TaskLabels, Counter>::default();
        let guest_call_seconds = Family::<TaskLabels, Counter<f64>>::default();
        let task_errors = Family::<ErrorLabels, Counter>::default();
        let guest_faults = Family::<ErrorLabels, Counter>::default();
        let records_rejected = Family::<RejectLabels, Counter>::default();
        let task_failed = Family::<TaskLabels, Gauge>::default();
        let enforced_processing = Family::<TaskLabels, Counter>::default();
        let tasks_running = Gauge::default();
        let restored_records = Family::<StoreLabels, Counter>::default();
        let restore_remaining = Family::<StoreLabels, Gauge>::default();
        let restore_rate = Family::<StoreLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let restore_seconds_left = Family::<StoreLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        let registry_rejected = Counter::default();
        registry.register("records_in", "Records read from source topics", records_in.clone());
        registry.register("records_out", "Records produced to sink topics", records_out.clone());
        registry.register(
            "guest_calls",
            "Calls into the Wasm guest (batches, punctuations)",
            guest_calls.clone(),
        );
        registry.register(
            "guest_call_seconds",
            "Time spent in guest calls",
            guest_call_seconds.clone(),
        );
        registry.register(
            "task_errors",
            "Task failures by kind (trap, deadline, memory, error, produce, …)",
            task_errors.clone(),
        );
        registry.register(
            "guest_faults",
            "Batches whose guest call faulted (trap, deadline, memory, error, …), whether the task went \
             on (the batch processed again in parts, a record skipped) or failed",
            guest_faults.clone(),
        );
        registry.register(
            "records_rejected",
            "Records the topology could not process, skipped or sent to its dead-letter topic (on-error)",
            records_rejected.clone(),
        );
        registry.register(
            "task_failed",
            "1 while a task is stopped by a failure",
            task_failed.clone(),
        );
        registry.register(
            "enforced_processing",
            "Times a task with several source partitions processed past an empty one it had \
             waited for in vain (its lag unknown or not zero, or max-task-idle-ms over): records \
             from there on may be out of timestamp order across its partitions",
            enforced_processing.clone(),
        );
        registry.register(
            "tasks_running",
            "Tasks processing records on this worker",
            tasks_running.clone(),
        );
        registry.register(
            "restored_records",
            "Changelog records replayed into an active task's store before it processed",
            restored_records.clone(),
        );
        registry.register(
            "restore_remaining_records",
            "Changelog records an active task's store still has to replay",
            restore_remaining.clone(),
        );
        registry.register(
            "restore_records_per_second",
            "How fast an active task's store replays its changelog",
            restore_rate.clone(),
        );
        registry.register(
            "restore_seconds_left",
            "Estimated time until an active task's store is restored",
            restore_seconds_left.clone(),
        );
        registry.register(
            "registry_rejected_records",
            "Registry records skipped because they carry no valid signature of this cluster's secret",
            registry_rejected.clone(),
        );
        more(&mut registry);
        Metrics {
            registry: Arc::new(registry),
            records_in,
            records_out,
            guest_calls,
            guest_call_seconds,
            task_errors,
            guest_faults,
            records_rejected,
            task_failed,
            enforced_processing,
            tasks_running,
            restored_records,
            restore_remaining,
            restore_rate,
            restore_seconds_left,
            registry_rejected,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}
