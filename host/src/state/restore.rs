//! Reading a store's changelog: bulk restoration before a task processes, and continuous
//! tailing with a lag (what standby and learner tasks will use).

use crate::kafka::Authorize as _;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::engine::{as_slices, Engine, Marker};

/// Reads one changelog partition from an offset on. Reads committed data only: under
/// exactly-once, aborted changelog writes (a fenced zombie's) are never restored.
pub struct ChangelogReader {
    kafka: crate::kafka::KafkaSettings,
    /// Created when there is something to read: a promoted learner's store is usually at the
    /// end already, and a new client costs its connections (and, on a busy machine, up to
    /// most of a second).
    consumer: Option<crate::kafka::Authorized<BaseConsumer>>,
    topic: String,
    partition: i32,
    /// Next offset to read.
    position: i64,
    /// The first offset the partition still holds.
    start: i64,
    end: i64,
    /// When a consumer error was last logged (they repeat while a broker is away).
    last_warning: Option<Instant>,
    /// Whether the partition is assigned (at `position`). Assigned once, when reading
    /// starts: librdkafka (2.12) can abort on a consumer closed right after a second
    /// assignment replaced the first (a duplicate fetch stop; confluentinc/librdkafka#5573).
    assigned: bool,
}

/// How far a restoration has come.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub restored: u64,
    pub total: u64,
    pub bytes: u64,
    pub elapsed: Duration,
}

impl Progress {
    pub fn rate(&self) -> f64 {
        self.restored as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn time_left(&self) -> Duration {
        let rate = self.rate();
        if rate <= 0.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(self.total.saturating_sub(self.restored) as f64 / rate)
    }
}

impl ChangelogReader {
    /// Opens the changelog partition and looks up its bounds on a client of its own; see
    /// [`with_bounds`](Self::with_bounds).
    pub fn new(kafka: &crate::kafka::KafkaSettings, topic: &str, partition: i32) -> Result<Self, String> {
        let consumer = restore_consumer(kafka, topic)?;
        let bounds = consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(15))
            .map_err(|e| format!("reading the offsets of changelog {topic}/{partition}: {e}"))?;
        let mut reader = ChangelogReader::with_bounds(kafka, topic, partition, bounds);
        reader.consumer = Some(consumer);
        Ok(reader)
    }

    /// A reader of the changelog partition whose first offset and end are `bounds` (read
    /// on a long-lived client: `StateDir::changelog_bounds`); [`seek`](Self::seek) picks
    /// where to read from (until then: the beginning).
    pub fn with_bounds(
        kafka: &crate::kafka::KafkaSettings,
        topic: &str,
        partition: i32,
        (low, high): (i64, i64),
    ) -> Self {
        ChangelogReader {
            kafka: kafka.clone(),
            consumer: None,
            topic: topic.to_string(),
            partition,
            position: low,
            start: low,
            end: high,
            last_warning: None,
            assigned: false,
        }
    }

    /// Reads from `offset` on (it must lie within [`bounds`](Self::bounds)).
    pub fn seek(&mut self, offset: i64) -> Result<(), String> {
        self.position = offset;
        if self.assigned {
            self.assign()?;
        }
        Ok(())
    }

    fn consumer(&mut self) -> Result<&BaseConsumer, String> {
        if self.consumer.is_none() {
            self.consumer = Some(restore_consumer(&self.kafka, &self.topic)?);
        }
        Ok(self.consumer.as_ref().expect("created above"))
    }

    fn assign(&mut self) -> Result<(), String> {
        let (topic, partition) = (self.topic.clone(), self.partition);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&topic, partition, Offset::Offset(self.position))
            .map_err(|e| format!("changelog {topic}/{partition}: {e}"))?;
        self.consumer()?
            .assign(&tpl)
            .map_err(|e| format!("assigning changelog {topic}/{partition}: {e}"))?;
        self.assigned = true;
        Ok(())
    }

    /// The first offset the partition holds and its end, when the reader was opened.
    pub fn bounds(&self) -> (i64, i64) {
        (self.start, self.end)
    }

    /// The offset reading started from, or has reached.
    pub fn position(&self) -> i64 {
        self.position
    }

    /// The end of the changelog when last looked up.
    pub fn end(&self) -> i64 {
        self.end
    }

    /// Records between the position and the end of the changelog (refreshed).
    pub fn lag(&mut self) -> Result<i64, String> {
        let (topic, partition) = (self.topic.clone(), self.partition);
        let (_, high) = self
            .consumer()?
            .fetch_watermarks(&topic, partition, Duration::from_secs(15))
            .map_err(|e| format!("reading the end of changelog {}/{}: {e}", self.topic, self.partition))?;
        self.end = high;
        Ok((high - self.position).max(0))
    }

    /// Reads what is available within `timeout`, up to `max` records: (key, value; none for
    /// a tombstone). Consumer errors (a broker away, a leader moving) are weather: the
    /// consumer recovers by itself, so they are logged (once in a while) and reading goes on.
    pub fn poll(&mut self, max: usize, timeout: Duration) -> Result<Vec<super::Change>, String> {
        if !self.assigned {
            self.assign()?;
        }
        let consumer = self.consumer.as_ref().expect("assigned above");
        let mut out = Vec::new();
        let mut wait = timeout;
        while out.len() < max {
            match consumer.poll(wait) {
                None => break,
                Some(Err(e)) => {
                    if self.last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                        tracing::warn!(changelog = %self.topic, partition = self.partition, "reading the changelog: {e}; retrying");
                        self.last_warning = Some(Instant::now());
                    }
                    break;
                }
                Some(Ok(m)) => {
                    self.position = m.offset() + 1;
                    if let Some(key) = m.key() {
                        out.push((key.to_vec(), m.payload().map(<[u8]>::to_vec)));
                    }
                }
            }
            wait = Duration::ZERO;
        }
        if out.is_empty() {
            // Offsets can have gaps (compaction, transaction markers); the consumer's
            // position says where it is.
            if let Ok(tpl) = consumer.position() {
                if let Some(Offset::Offset(p)) = tpl.find_partition(&self.topic, self.partition).map(|p| p.offset()) {
                    self.position = self.position.max(p);
                }
            }
        }
        Ok(out)
    }

    /// Applies the changelog up to its end (as it was when the reader started) to `db`, in
    /// large write batches without the WAL, each with the marker of how far it got; starts
    /// flushing `db` at the end (without waiting: `Engine::flush(true)` waits for it, and so does
    /// a task's first commit) so the result becomes durable. Returns none if `stop` said to stop first
    /// (what was applied is kept, vouched for by its marker). `progress` is called about once
    /// a second and at the end.
    pub fn restore_into(
        &mut self,
        db: &dyn Engine,
        topic_id: &str,
        stop: &dyn Fn() -> bool,
        mut progress: impl FnMut(Progress),
    ) -> Result<Option<Progress>, String> {
        let started = Instant::now();
        let total = (self.end - self.position).max(0) as u64;
        let mut state = Progress {
            restored: 0,
            total,
            bytes: 0,
            elapsed: Duration::ZERO,
        };
        let mut last_report = Instant::now();
        let mut idle_since = Instant::now();
        let from = self.position;
        while self.position < self.end {
            if stop() {
                db.flush(true)?;
                return Ok(None);
            }
            let records = self.poll(10_000, Duration::from_millis(200))?;
            if records.is_empty() {
                if idle_since.elapsed() > RESTORE_STALL {
                    return Err(format!(
                        "changelog {}/{} delivered nothing for {}s at offset {} of {}",
                        self.topic,
                        self.partition,
                        RESTORE_STALL.as_secs(),
                        self.position,
                        self.end
                    ));
                }
                continue;
            }
            idle_since = Instant::now();
            for (key, value) in &records {
                state.bytes += (key.len() + value.as_ref().map_or(0, Vec::len)) as u64;
            }
            let marker = self.marker(topic_id);
            db.write_with_marker(&mut as_slices(&records), &marker, false)
                .map_err(|e| format!("writing restored records: {e}"))?;
            state.restored += records.len() as u64;
            state.total = state.total.max(state.restored);
            if last_report.elapsed() >= Duration::from_secs(1) {
                state.elapsed = started.elapsed();
                progress(state);
                last_report = Instant::now();
            }
        }
        if self.position != from {
            // Gaps at the end (a compacted tail, a transaction marker) leave no record to write.
            db.write_with_marker(&mut std::iter::empty(), &self.marker(topic_id), false)?;
            // The WAL was off: the restored state becomes durable with this flush. The task
            // does not wait for it to start; its first commit does (`TaskStore::commit`). (A
            // store already at the end has nothing to flush: one flushing already, a learner's
            // handed over, would make a second flush wait for it.)
            db.flush(false)?;
        }
        state.elapsed = started.elapsed();
        progress(state);
        Ok(Some(state))
    }

    /// The marker of what has been read so far.
    pub fn marker(&self, topic_id: &str) -> Marker {
        Marker {
            topic: self.topic.clone(),
            topic_id: topic_id.to_string(),
            next_offset: self.position,
        }
    }
}

/// How long a restoration may see no data before it counts as stuck.
const RESTORE_STALL: Duration = Duration::from_secs(120);

/// A consumer that reads one changelog partition, committed data only.
fn restore_consumer(
    kafka: &crate::kafka::KafkaSettings,
    topic: &str,
) -> Result<crate::kafka::Authorized<BaseConsumer>, String> {
    kafka
        .client()
        // Named after the changelog, so broker quotas and logs can tell restorations apart.
        .set("client.id", format!("sluice-restore-{topic}"))
        .set("group.id", "sluice.restore")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .set("fetch.max.bytes", "52428800")
        .set("max.partition.fetch.bytes", "10485760")
        // A full queue is fetched again after 10 ms, not librdkafka's default second.
        .set("fetch.queue.backoff.ms", "10")
        .authorized(kafka)
        .map_err(|e| format!("creating the restore consumer: {e}"))
}
