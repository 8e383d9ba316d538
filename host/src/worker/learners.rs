//! How a cluster worker follows its standbys and learners: where their changelogs end, and
//! when learners are far enough along that the worker rejoins to take their tasks over.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::group_runner::{ClusterConfig, LearnerRejoin};
use super::TaskRunner;
use crate::group::TaskId;
use crate::kafka::{KafkaSettings, OffsetsClient};

/// How often a worker with learners compares their progress with the changelogs' end.
pub(super) const LEARNER_CHECK_EVERY: Duration = Duration::from_millis(200);
/// How often a worker with standbys (no learners) updates their lag on its status board.
pub(super) const STANDBY_CHECK_EVERY: Duration = Duration::from_secs(1);
/// A caught-up learner asks for its task again after this long if it did not get it.
const LEARNER_REJOIN_AGAIN: Duration = Duration::from_secs(3);

/// Reads where changelogs end (for the leader's lag figures, the status board and learners'
/// progress) on a client of its own, made again after an error (see [`OffsetsClient`]).
pub(super) struct ChangelogEnds {
    client: OffsetsClient,
}

impl ChangelogEnds {
    pub(super) fn new(kafka: &KafkaSettings) -> ChangelogEnds {
        ChangelogEnds {
            client: OffsetsClient::new(kafka, "sluice-lag", "sluice.lag"),
        }
    }

    /// The end offsets of the changelogs of `tasks`, summed per task, in one ListOffsets
    /// round (the last stable offsets: transactions in flight do not count). Tasks whose
    /// offsets could not be read are left out (their lag is then unknown), and the next
    /// call asks on a new client.
    pub(super) fn read(&self, tasks: &[(TaskId, Vec<(String, i32)>)]) -> HashMap<TaskId, i64> {
        let client = match self.client.get() {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!("{e:#}");
                return HashMap::new();
            }
        };
        let (ends, complete) = changelog_ends(&client, tasks);
        if !complete {
            self.client.renew(&client);
        }
        ends
    }
}

/// The end offsets of the changelogs of `tasks`, summed per task, and whether every one
/// was read.
fn changelog_ends(consumer: &BaseConsumer, tasks: &[(TaskId, Vec<(String, i32)>)]) -> (HashMap<TaskId, i64>, bool) {
    let mut ends = HashMap::new();
    if tasks.is_empty() {
        return (ends, true);
    }
    let mut list = TopicPartitionList::new();
    for (_, parts) in tasks {
        for (topic, p) in parts {
            let _ = list.add_partition_offset(topic, *p, Offset::End);
        }
    }
    let found = match consumer.offsets_for_times(list, Duration::from_secs(2)) {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!("reading the changelogs' end offsets: {e}");
            return (ends, false);
        }
    };
    let mut complete = true;
    'task: for (task, parts) in tasks {
        let mut sum = 0;
        for (topic, p) in parts {
            match found.find_partition(topic, *p).map(|e| (e.error(), e.offset())) {
                Some((Ok(()), Offset::Offset(o))) => sum += o,
                other => {
                    tracing::debug!(%task, topic, partition = p, "the changelog's end offset is unknown: {other:?}");
                    complete = false;
                    continue 'task;
                }
            }
        }
        ends.insert(task.clone(), sum);
    }
    (ends, complete)
}

/// Whether this worker's learners are far enough along to take their tasks over (by the
/// rejoin policy); if so the worker rejoins, and the leader moves the caught-up tasks.
pub(super) fn learners_caught_up(
    cluster: &ClusterConfig,
    runner: &TaskRunner,
    ends: &HashMap<TaskId, i64>,
    positions: &HashMap<TaskId, i64>,
    asked: &mut HashMap<TaskId, Instant>,
) -> bool {
    let learners = runner.learners();
    let lag = |t: &TaskId| Some((ends.get(t)? - positions.get(t)?).max(0));
    let ready: Vec<(TaskId, i64)> = learners
        .iter()
        .filter_map(|t| lag(t).map(|l| (t.clone(), l)))
        .filter(|(_, l)| *l <= cluster.learners.acceptable_lag)
        .collect();
    let now = Instant::now();
    let fresh: Vec<&(TaskId, i64)> = ready
        .iter()
        .filter(|(t, _)| {
            asked
                .get(t)
                .is_none_or(|&at| now.duration_since(at) >= LEARNER_REJOIN_AGAIN)
        })
        .collect();
    let go = match cluster.learner_rejoin {
        LearnerRejoin::Each => !fresh.is_empty(),
        LearnerRejoin::All => ready.len() == learners.len() && !fresh.is_empty(),
    };
    if go {
        for (t, l) in &fresh {
            tracing::info!(task = %t, lag = l, "learner caught up: rejoining to take the task over");
            asked.insert(t.clone(), now);
        }
        // Flushed while the group rebalances, not after the task is handed over.
        let tasks: Vec<TaskId> = fresh.iter().map(|(t, _)| t.clone()).collect();
        runner.checkpoint_learners(&tasks);
    }
    go
}
