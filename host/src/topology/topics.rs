//! A topology's topics as the cluster has them: each looked up (with patience for a topic
//! created a moment ago), source partition counts compared, and the topology group's
//! consumer.

use crate::kafka::Authorize as _;
use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::kafka::{ConsumerEvents, KafkaSettings};
use crate::manifest::{Binding, Manifest};

/// A consumer in a topology's group (`sluice-<topology>`, see [`Manifest::group`]), for its
/// metadata at deploy and, under exactly-once, the group's metadata for offsets committed in
/// transactions. Records are read by the stream threads' consumers (see `threads`).
pub fn source_consumer(
    kafka: &KafkaSettings,
    group: &str,
    prefetch_bytes: usize,
) -> rdkafka::error::KafkaResult<crate::kafka::Authorized<BaseConsumer<ConsumerEvents>>> {
    kafka
        .worker_client()
        // Used for metadata and the exactly-once group metadata only: a small prefetch.
        .set("queued.max.messages.kbytes", (prefetch_bytes / 1024).max(1).to_string())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "100")
        .authorized_with(kafka, ConsumerEvents)
}

/// Checks that a topology's topics exist (each is looked up for up to `patience`), except
/// its internal ones (`internal`, created by the host); returns each source topic's
/// partition count.
pub fn check_topics(
    kafka: &KafkaSettings,
    manifest: &Manifest,
    binding: &Binding,
    internal: &[String],
    patience: Duration,
) -> anyhow::Result<BTreeMap<String, i32>> {
    // Used here for metadata only; records are read by the stream threads.
    let consumer = source_consumer(kafka, &manifest.group(), 1 << 20).context("creating the consumer")?;
    let mut sources = BTreeMap::new();
    let dead_letter: Vec<String> = binding.dead_letter_topic.iter().cloned().collect();
    for (kind, topics) in [
        ("source", &binding.source_topics),
        ("sink", &binding.sink_topics),
        ("global store", &binding.global_topics),
        ("dead-letter", &dead_letter),
    ] {
        for topic in topics.iter().filter(|t| !internal.contains(t)) {
            let count = partition_count(&consumer, topic, patience).map_err(|e| {
                anyhow::anyhow!(
                    "topology {} (manifest {}): {kind} topic {topic:?}: {e}",
                    manifest.name,
                    manifest.path
                )
            })?;
            if kind == "source" {
                sources.insert(topic.clone(), count);
            }
        }
    }
    Ok(sources)
}

/// The partition count of sources read together (by one sub-topology's tasks): all the
/// same, or an error naming each source and its count.
pub fn co_partitioned(what: &str, sources: &[(&str, i32)]) -> Result<i32, String> {
    let partitions = sources.first().map_or(0, |s| s.1);
    if sources.iter().any(|(_, n)| *n != partitions) {
        let counts: Vec<String> = sources.iter().map(|(t, n)| format!("{t:?} has {n}")).collect();
        return Err(format!(
            "{what} not co-partitioned: {}; a task reads the same partition of each source, so they need the same \
             number of partitions (and keys written with the same partitioner)",
            counts.join(", ")
        ));
    }
    Ok(partitions)
}

/// How long a topic missing from the metadata is looked up again before its topology is
/// refused. A topic created a moment ago reaches each broker's metadata on its own time (a
/// broker that has just restarted, or one starved of CPU, can lag the controller by seconds),
/// so the first "unknown topic" answer is not yet the truth.
pub const TOPIC_APPEAR_WAIT: Duration = Duration::from_secs(10);

const MISSING_TOPIC: &str = "does not exist; create it first (for example `sluice topics create --partitions 4 TOPIC`)";

fn partition_count(consumer: &BaseConsumer<ConsumerEvents>, topic: &str, patience: Duration) -> Result<i32, String> {
    wait_for_topic(topic, patience, Duration::from_millis(250), || {
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(15))
            .map_err(|e| Lookup::Failed(format!("cannot fetch metadata from Kafka: {e}")))?;
        let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
            return Err(Lookup::Missing);
        };
        match t.error() {
            None if !t.partitions().is_empty() => Ok(t.partitions().len() as i32),
            None => Err(Lookup::Missing),
            Some(e) if RDKafkaErrorCode::from(e) == RDKafkaErrorCode::UnknownTopicOrPartition => Err(Lookup::Missing),
            Some(e) => Err(Lookup::Failed(format!("{}", KafkaError::MetadataFetch(e.into())))),
        }
    })
}

/// One metadata lookup of a topic.
#[derive(Debug)]
enum Lookup {
    /// The broker that answered does not know the topic (yet).
    Missing,
    Failed(String),
}

/// Looks a topic up until it appears or `patience` has passed; only a topic still missing
/// then is reported as missing. Other errors are reported at once.
fn wait_for_topic(
    topic: &str,
    patience: Duration,
    pause: Duration,
    mut lookup: impl FnMut() -> Result<i32, Lookup>,
) -> Result<i32, String> {
    let deadline = std::time::Instant::now() + patience;
    let mut said = false;
    loop {
        match lookup() {
            Ok(n) => return Ok(n),
            Err(Lookup::Failed(e)) => return Err(e),
            Err(Lookup::Missing) if std::time::Instant::now() >= deadline => return Err(MISSING_TOPIC.into()),
            Err(Lookup::Missing) => {
                if !said {
                    tracing::info!(
                        topic,
                        "not in the metadata yet; looking again for up to {}s \
                         (a topic created a moment ago takes a moment to reach every broker)",
                        patience.as_secs()
                    );
                    said = true;
                }
                std::thread::sleep(pause);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topic_that_appears_late_is_found() {
        let mut calls = 0;
        let found = wait_for_topic("t", Duration::from_secs(5), Duration::from_millis(1), || {
            calls += 1;
            if calls < 3 {
                Err(Lookup::Missing)
            } else {
                Ok(6)
            }
        });
        assert_eq!(found, Ok(6));
        assert_eq!(calls, 3);
    }

    #[test]
    fn a_topic_still_missing_after_the_wait_is_reported_missing() {
        let started = std::time::Instant::now();
        let mut calls = 0;
        let found = wait_for_topic("t", Duration::from_millis(50), Duration::from_millis(5), || {
            calls += 1;
            Err(Lookup::Missing)
        });
        assert_eq!(found, Err(MISSING_TOPIC.to_string()));
        assert!(started.elapsed() >= Duration::from_millis(50));
        assert!(calls > 1, "looked up only once");
    }

    #[test]
    fn a_failed_lookup_is_reported_at_once() {
        let mut calls = 0;
        let found = wait_for_topic("t", Duration::from_secs(5), Duration::from_millis(1), || {
            calls += 1;
            Err(Lookup::Failed("authorization failed".into()))
        });
        assert_eq!(found, Err("authorization failed".to_string()));
        assert_eq!(calls, 1);
    }
}
