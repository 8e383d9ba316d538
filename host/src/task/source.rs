//! Where a task starts reading: its partition of every source topic, at the offsets
//! committed under the topology's group (`sluice-<topology>`), or the beginning; and the
//! means by which a thread reads and commits those offsets ([`KafkaEnv`]).
//!
//! The committed offsets are looked up explicitly, and the lookup is retried until it gives
//! an answer for every partition: a just-started broker's group coordinator answers "not
//! coordinator" or "loading" for a while, and a task must not start from a guess. Offsets
//! of a transaction not yet decided (exactly-once) are "unstable" and retried the same way.

use crate::kafka::Authorize as _;
use std::time::{Duration, Instant};

use crate::group::offsets::{GroupOffsets, Position};
use crate::kafka::KafkaSettings;

/// Looks up the committed offset of `partition` of each of `sources` in the topology's
/// `group`; none per source where nothing is committed. Retries (with backoff, saying so in
/// the log) until it succeeds or `stopping` says to give up (then: none).
pub fn committed(
    env: &mut KafkaEnv,
    group: &str,
    sources: &[String],
    partition: i32,
    task: &str,
    stopping: &dyn Fn() -> bool,
) -> Option<Vec<Option<i64>>> {
    let wanted: Vec<(String, i32)> = sources.iter().map(|t| (t.clone(), partition)).collect();
    let started = Instant::now();
    let mut backoff = Duration::from_millis(100);
    loop {
        match env.fetch_offsets(group, &wanted) {
            Ok(committed) => return Some(committed),
            Err(e) => tracing::warn!(
                task, after = %humantime::format_duration(Duration::from_secs(started.elapsed().as_secs())),
                "looking up the committed offsets of group {group} failed: {e}; retrying in {backoff:?}"
            ),
        }
        let until = Instant::now() + backoff;
        while Instant::now() < until {
            if stopping() {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Where each source without a committed offset starts, after a deploy that asked to
/// reprocess `from` there: an offset (the high watermark for `latest`, the first record at
/// or after the time for a timestamp, the high watermark when there is none), or none for
/// the beginning.
pub fn start_from(
    kafka: &KafkaSettings,
    sources: &[String],
    partition: i32,
    committed: Vec<Option<i64>>,
    from: crate::manifest::StartFrom,
) -> Result<Vec<Option<i64>>, String> {
    use crate::manifest::StartFrom;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    let timeout = Duration::from_secs(30);
    let consumer: crate::kafka::Authorized<BaseConsumer> = kafka
        .client()
        .authorized(kafka)
        .map_err(|e| format!("creating a consumer to find where to reprocess from: {e}"))?;
    let mut out = Vec::with_capacity(sources.len());
    for (topic, committed) in sources.iter().zip(committed) {
        if committed.is_some() {
            out.push(committed);
            continue;
        }
        let high = || {
            consumer
                .fetch_watermarks(topic, partition, timeout)
                .map(|(_, high)| high)
                .map_err(|e| format!("the end of {topic}/{partition}: {e}"))
        };
        out.push(match from {
            StartFrom::Earliest => None,
            StartFrom::Latest => Some(high()?),
            StartFrom::Offset(n) => Some(n),
            StartFrom::Timestamp(ms) => {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition_offset(topic, partition, Offset::Offset(ms))
                    .map_err(|e| e.to_string())?;
                let found = consumer
                    .offsets_for_times(tpl, timeout)
                    .map_err(|e| format!("the offset of {topic}/{partition} at {ms} ms: {e}"))?;
                match found.find_partition(topic, partition).map(|e| e.offset()) {
                    Some(Offset::Offset(n)) => Some(n),
                    // No record at or after that time: from the end.
                    _ => Some(high()?),
                }
            }
        });
    }
    tracing::info!(sources = ?sources, partition, %from, positions = ?out, "reprocessing from");
    Ok(out)
}

/// A thread's means of talking to Kafka outside its consumer: source offsets of any
/// topology group, over a runtime of the thread's own (no threads of its own).
pub struct KafkaEnv {
    offsets: GroupOffsets,
    runtime: tokio::runtime::Runtime,
    kafka: KafkaSettings,
    /// Started with the first purge asked for (most workers have no repartition topic).
    purger: Option<crate::topology::repartition::Purger>,
}

impl KafkaEnv {
    pub fn new(kafka: &KafkaSettings) -> std::io::Result<KafkaEnv> {
        Ok(KafkaEnv {
            offsets: GroupOffsets::new(kafka),
            runtime: tokio::runtime::Builder::new_current_thread().enable_all().build()?,
            kafka: kafka.clone(),
            purger: None,
        })
    }

    /// Deletes, in the background, each repartition partition's records before its offset.
    pub fn purge(&mut self, before: Vec<(String, i32, i64)>) {
        if self.purger.is_none() {
            match crate::topology::repartition::Purger::start(&self.kafka) {
                Ok(p) => self.purger = Some(p),
                Err(e) => tracing::warn!("starting the repartition purger: {e}"),
            }
        }
        if let Some(p) = &self.purger {
            p.purge(before);
        }
    }

    pub fn fetch_offsets(&mut self, group: &str, wanted: &[(String, i32)]) -> Result<Vec<Option<i64>>, String> {
        self.runtime.block_on(self.offsets.fetch(group, wanted))
    }

    pub fn commit_offsets(&mut self, group: &str, positions: &[Position]) -> Result<(), String> {
        self.runtime.block_on(self.offsets.commit(group, positions))
    }
}
