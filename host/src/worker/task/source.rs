//! A task's source consumer: its partition of every source topic, positioned at the
//! offsets committed under the topology's group (`sluice-<topology>`), or the beginning.
//!
//! The committed offsets are looked up explicitly, and the lookup is retried until it gives
//! an answer for every partition. Assigning with "the stored offset" and letting the client
//! look it up in the background can leave a partition without a position — and the task
//! silently idle — when the lookup fails, as it does while a just-started broker's group
//! coordinator is still loading `__consumer_offsets`.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use super::super::ConsumerEvents;

/// The consumer, and for each source the committed offset it starts from (none: nothing
/// committed, it starts at the beginning).
pub struct Source {
    pub consumer: BaseConsumer<ConsumerEvents>,
    pub committed: Vec<Option<i64>>,
}

/// How long one lookup of committed offsets may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// Creates the task's consumer. Retries the offset lookup (with backoff, saying so in the
/// log) until it succeeds or `stopping` says to give up (then: none).
pub fn open(
    bootstrap: &str,
    topology: &str,
    sources: &[String],
    partition: i32,
    task: &str,
    prefetch_bytes: usize,
    stopping: &dyn Fn() -> bool,
) -> Result<Option<Source>, String> {
    let consumer = super::super::source_consumer(bootstrap, topology, prefetch_bytes)
        .map_err(|e| format!("creating the consumer: {e}"))?;
    let mut wanted = TopicPartitionList::new();
    for topic in sources {
        wanted
            .add_partition_offset(topic, partition, Offset::Invalid)
            .map_err(|e| e.to_string())?;
    }
    let started = Instant::now();
    let mut backoff = Duration::from_millis(100);
    let committed = loop {
        match lookup(&consumer, &wanted, sources, partition) {
            Ok(committed) => break committed,
            Err(e) => {
                tracing::warn!(
                    task, after = %humantime::format_duration(Duration::from_secs(started.elapsed().as_secs())),
                    "looking up the committed offsets of group sluice-{topology} failed: {e}; retrying in {backoff:?}"
                );
            }
        }
        let until = Instant::now() + backoff;
        while Instant::now() < until {
            if stopping() {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    };
    let mut assignment = TopicPartitionList::new();
    for (topic, offset) in sources.iter().zip(&committed) {
        let offset = offset.map_or(Offset::Beginning, Offset::Offset);
        assignment
            .add_partition_offset(topic, partition, offset)
            .map_err(|e| e.to_string())?;
    }
    consumer
        .assign(&assignment)
        .map_err(|e| format!("assigning {sources:?} partition {partition}: {e}"))?;
    Ok(Some(Source { consumer, committed }))
}

/// One lookup: a committed offset (or none) for every source, or the error to retry on.
fn lookup(
    consumer: &BaseConsumer<ConsumerEvents>,
    wanted: &TopicPartitionList,
    sources: &[String],
    partition: i32,
) -> Result<Vec<Option<i64>>, String> {
    let answer = consumer
        .committed_offsets(wanted.clone(), LOOKUP_TIMEOUT)
        .map_err(|e| e.to_string())?;
    sources
        .iter()
        .map(|topic| {
            let p = answer
                .find_partition(topic, partition)
                .ok_or_else(|| format!("no answer for {topic}/{partition}"))?;
            if let Err(e) = p.error() {
                return Err(format!("{topic}/{partition}: {e}"));
            }
            match p.offset() {
                Offset::Offset(n) if n >= 0 => Ok(Some(n)),
                Offset::Invalid => Ok(None),
                other => Err(format!("{topic}/{partition}: an unexpected committed offset {other:?}")),
            }
        })
        .collect()
}
