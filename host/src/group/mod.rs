//! The worker group: task ids, versioned member metadata and assignments, the assignors
//! (pure, no I/O), and the membership client that speaks Kafka's group protocol.

pub mod assignor;
#[cfg(test)]
mod assignor_tests;
mod codec;
pub mod connection;
pub mod framing;
pub mod membership;
pub mod metadata;
pub mod offsets;
pub mod placement;

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

/// The Kafka group of a cluster. `sluice.`, not `sluice-`: a topology's offsets live in the
/// group `sluice-<topology>`, so no topology name (not even `cluster-x`) can name a
/// cluster's group.
pub fn cluster_group(cluster: &str) -> String {
    format!("sluice.cluster.{cluster}")
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.topology, self.partition)
    }
}
