//! Ending a vanished member's transactions at once.
//!
//! Under exactly-once each stream thread writes in transactions of its own transactional id
//! (`task::thread_transactional_id`). A worker killed with one open holds back every
//! `read_committed` reader of the partitions it wrote — and the committed offsets of their
//! next owners — until the broker times the transaction out (`task::transaction_timeout`,
//! then the broker's abort scan: up to some 20 s). The leader knows who was in the last
//! generation (the roster its assignments carry since metadata version 5), so when a member
//! is gone from the next join it starts a producer of each of the member's transactional ids:
//! `InitProducerId` bumps the id's epoch, which fences the old producer and aborts what it
//! left open, and the readers go on within the rebalance. Kafka Streams waits the timeout
//! out; KIP-939's admin abort would be the other way, with no zombie fenced.
//!
//! Safe for a member that is not dead but was dropped (frozen, or removed by a LeaveGroup):
//! its lease has stopped its tasks or will, and its next transactional call fails as fenced,
//! which rolls its tasks back and makes its thread start its producer again.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::group::metadata::Rostered;
use crate::kafka::KafkaSettings;
use crate::task::{thread_transactional_id, ThreadProducer};

/// How long a fencing producer keeps trying to initialise (the transaction coordinator may
/// be moving): past this the broker's own timeout has ended the transaction anyway.
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// The most stream threads fenced per vanished member: the threads a member says it has
/// are its word (without a secret, anyone's in the group), and each is a thread here.
const MAX_THREADS: u32 = 256;

/// The members of `last` (a roster) that are not `present` now.
pub(super) fn vanished(last: &[Rostered], present: &HashSet<[u8; 16]>) -> Vec<Rostered> {
    last.iter()
        .filter(|r| !present.contains(&r.worker_id))
        .copied()
        .collect()
}

/// The transactional ids of a member's stream threads.
pub(super) fn transactional_ids(member: &Rostered) -> Vec<String> {
    let worker = uuid::Uuid::from_bytes(member.worker_id).to_string();
    (0..member.threads.min(MAX_THREADS) as usize)
        .map(|thread| thread_transactional_id(&worker, thread))
        .collect()
}

/// Starts (and drops) a producer of each id on threads of their own, which aborts what
/// each id's last producer left open; logs what it did. Returns at once.
pub(super) fn end_transactions(kafka: &KafkaSettings, commit_interval: Duration, ids: Vec<String>) {
    for id in ids {
        let kafka = kafka.clone();
        let spawned = std::thread::Builder::new().name("fencing".into()).spawn(move || {
            let began = Instant::now();
            match ThreadProducer::start(&kafka, &id, commit_interval, &|| began.elapsed() > GIVE_UP_AFTER) {
                Ok(Some(_)) => tracing::info!(
                    transactional_id = %id, ms = began.elapsed().as_millis() as u64,
                    "fenced a vanished member's transactional id: what it left open is aborted"
                ),
                Ok(None) => tracing::warn!(
                    transactional_id = %id,
                    "could not fence a vanished member's transactional id within {GIVE_UP_AFTER:?}: its open transaction ends with the broker's timeout"
                ),
                Err(e) => tracing::warn!(
                    transactional_id = %id,
                    "fencing a vanished member's transactional id: {e}; its open transaction ends with the broker's timeout"
                ),
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("starting a fencing thread: {e}");
        }
    }
}

impl super::GroupRunner<'_> {
    /// As leader, under exactly-once: the members of the last generation that are not in
    /// this join have their open transactions ended now instead of at the broker's timeout
    /// (see `fencing`). Not when some member's metadata went unread: that member may be one
    /// of them, alive.
    pub(super) fn end_vanished_transactions(&self, present: &std::collections::HashSet<[u8; 16]>) {
        let Some((kafka, commit_interval)) = self.runner.exactly_once() else {
            return;
        };
        let gone = vanished(&self.roster, present);
        if gone.is_empty() {
            return;
        }
        let ids: Vec<String> = gone.iter().flat_map(transactional_ids).collect();
        tracing::info!(
            cluster = %self.cluster.name,
            members = %gone.iter().map(|r| uuid::Uuid::from_bytes(r.worker_id).to_string()).collect::<Vec<_>>().join(","),
            transactional_ids = ids.len(),
            "members of the last generation are gone: ending their open transactions"
        );
        end_transactions(kafka, commit_interval, ids);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_missing_from_the_join_is_vanished_and_its_ids_are_its_threads() {
        let a = Rostered {
            worker_id: [1; 16],
            threads: 2,
        };
        let b = Rostered {
            worker_id: [2; 16],
            threads: 1,
        };
        let present: HashSet<[u8; 16]> = [[2; 16], [3; 16]].into_iter().collect();
        assert_eq!(vanished(&[a, b], &present), vec![a]);
        assert_eq!(
            transactional_ids(&a),
            vec![
                "sluice-worker-01010101-0101-0101-0101-010101010101-0",
                "sluice-worker-01010101-0101-0101-0101-010101010101-1"
            ]
        );
        // A member of an older release says no threads: nothing to fence.
        assert!(transactional_ids(&Rostered { threads: 0, ..a }).is_empty());
        // A member claiming a million threads costs at most MAX_THREADS here.
        assert_eq!(
            transactional_ids(&Rostered {
                threads: 1_000_000,
                ..a
            })
            .len(),
            MAX_THREADS as usize
        );
    }
}
