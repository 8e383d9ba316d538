//! The worker group's pure core: task ids, versioned member metadata and assignments, and
//! the assignors. No I/O here; the membership client (Kafka's group protocol) sits above.

pub mod assignor;
#[cfg(test)]
mod assignor_tests;
mod codec;
pub mod metadata;

use std::fmt;
use std::sync::Arc;

pub use codec::DecodeError;

/// A task: one topology's sub-topology on one input partition.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId {
    pub topology: Arc<str>,
    pub partition: u32,
}

impl TaskId {
    pub fn new(topology: &str, partition: u32) -> Self {
        TaskId {
            topology: topology.into(),
            partition,
        }
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.topology, self.partition)
    }
}
