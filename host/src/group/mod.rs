//! The worker group: task ids, versioned member metadata and assignments, the assignors
//! (pure, no I/O), and the membership client that speaks Kafka's group protocol.

pub mod assignor;
#[cfg(test)]
mod assignor_tests;
mod codec;
pub mod connection;
pub mod framing;
pub mod intruders;
pub mod membership;
pub mod metadata;
pub mod offsets;
pub mod placement;

use std::fmt;
use std::sync::Arc;

pub use codec::DecodeError;

/// A task: one topology's sub-topology on one input partition. A topology of one
/// sub-topology names none (`<topology>/<partition>`); in one of several each task names its
/// own (`<topology>/<sub>/<partition>`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId {
    pub topology: Arc<str>,
    pub sub: Option<Arc<str>>,
    pub partition: u32,
}

impl TaskId {
    pub fn new(topology: &str, partition: u32) -> Self {
        TaskId {
            topology: topology.into(),
            sub: None,
            partition,
        }
    }

    /// A task of sub-topology `sub` (none: the topology's only one).
    pub fn of(topology: &str, sub: Option<&str>, partition: u32) -> Self {
        TaskId {
            topology: topology.into(),
            sub: sub.map(Into::into),
            partition,
        }
    }

    /// What the task's partitions are numbered within: `<topology>` or `<topology>/<sub>`
    /// (names hold no '/', so this reads back unambiguously).
    pub fn unit(&self) -> String {
        match &self.sub {
            None => self.topology.to_string(),
            Some(sub) => format!("{}/{sub}", self.topology),
        }
    }

    /// The task of partition `partition` of `unit` (see [`Self::unit`]); None if the unit
    /// is not a name or a name and a sub-topology.
    pub fn from_unit(unit: &str, partition: u32) -> Option<Self> {
        match unit.split_once('/') {
            None if !unit.is_empty() => Some(TaskId::new(unit, partition)),
            Some((t, s)) if !t.is_empty() && !s.is_empty() && !s.contains('/') => {
                Some(TaskId::of(t, Some(s), partition))
            }
            _ => None,
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
        match &self.sub {
            None => write!(f, "{}/{}", self.topology, self.partition),
            Some(sub) => write!(f, "{}/{sub}/{}", self.topology, self.partition),
        }
    }
}
