//! What can go wrong inside a guest, classified so that the task's error says whose fault
//! it is and what happened.

use std::time::Duration;

/// A guest call failed. Every variant is the guest's fault; none can harm the worker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuestFault {
    /// The guest returned an error (its own message).
    #[error("the topology reported an error: {message}")]
    Error { message: String, record_index: Option<u32> },
    /// The guest trapped: a panic, `unreachable`, an out-of-bounds access, …
    #[error("the guest trapped: {trap}{}", stderr_suffix(.stderr))]
    Trap { trap: String, stderr: String },
    /// The call ran past its deadline (an endless loop, or far too much work per call).
    #[error("the guest call exceeded its deadline of {}", humantime::format_duration(*.timeout))]
    Deadline { timeout: Duration },
    /// The guest tried to grow its memory beyond the cap.
    #[error("the guest exceeded its memory limit of {limit} bytes (it asked for {requested} bytes)")]
    Memory { limit: usize, requested: usize },
    /// The guest made the host hold more than its budget allows (records emitted through
    /// the host, state writes not yet committed).
    #[error("the guest exceeded its {budget} budget of {limit} {unit}: {what} would make it {wanted} {unit}")]
    Budget {
        budget: &'static str,
        unit: &'static str,
        limit: usize,
        wanted: usize,
        what: &'static str,
    },
    /// The guest called something topologies may not use (e.g. a blocking wait).
    #[error("the guest called {call}, which topologies may not use: {why}")]
    Denied { call: &'static str, why: &'static str },
    /// The guest used a sink or store it did not declare (even if it ignored the error it got).
    #[error("the topology used {what}, which it did not declare")]
    Undeclared { what: String },
    /// The guest handed back records that do not follow the contract.
    #[error("the guest returned invalid output: {detail}")]
    BadOutput { detail: String },
    /// The host could not create an instance (e.g. the pooling allocator is full).
    #[error("cannot instantiate the topology: {detail}")]
    Instantiate { detail: String },
}

impl GuestFault {
    /// A short machine-friendly kind, used as a metrics label.
    pub fn kind(&self) -> &'static str {
        match self {
            GuestFault::Error { .. } => "error",
            GuestFault::Trap { .. } => "trap",
            GuestFault::Deadline { .. } => "deadline",
            GuestFault::Memory { .. } | GuestFault::Budget { .. } => "memory",
            GuestFault::Denied { .. } => "denied",
            GuestFault::Undeclared { .. } => "undeclared",
            GuestFault::BadOutput { .. } => "bad_output",
            GuestFault::Instantiate { .. } => "instantiate",
        }
    }

    /// The index of the batch record the guest was at, when it said so.
    pub fn record_index(&self) -> Option<u32> {
        match self {
            GuestFault::Error { record_index, .. } => *record_index,
            _ => None,
        }
    }
}

fn stderr_suffix(stderr: &str) -> String {
    let trimmed = stderr.trim();
    if trimmed.is_empty() {
        String::new()
    } else {
        format!(" (guest stderr: {})", trimmed.lines().collect::<Vec<_>>().join(" | "))
    }
}
