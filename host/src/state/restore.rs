//! Reading a store's changelog: bulk restoration before a task processes, and continuous
//! tailing with a lag (what standby and learner tasks will use).

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use rocksdb::{WriteBatch, WriteOptions, DB};

/// Reads one changelog partition from an offset on.
pub struct ChangelogReader {
    consumer: BaseConsumer,
    topic: String,
    partition: i32,
    /// Next offset to read.
    position: i64,
    end: i64,
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
    /// Starts at `from` (none: the beginning of the partition).
    pub fn new(bootstrap: &str, topic: &str, partition: i32, from: Option<i64>) -> Result<Self, String> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "sluice-restore")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("fetch.max.bytes", "52428800")
            .set("max.partition.fetch.bytes", "10485760")
            .create()
            .map_err(|e| format!("creating the restore consumer: {e}"))?;
        let (low, high) = consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(15))
            .map_err(|e| format!("reading the offsets of changelog {topic}/{partition}: {e}"))?;
        // A checkpoint past the end (the changelog was recreated) or before the start
        // (compacted away) means reading from the beginning.
        let start = match from {
            Some(offset) if offset >= low && offset <= high => offset,
            _ => low,
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(start))
            .map_err(|e| format!("changelog {topic}/{partition}: {e}"))?;
        consumer
            .assign(&tpl)
            .map_err(|e| format!("assigning changelog {topic}/{partition}: {e}"))?;
        Ok(ChangelogReader {
            consumer,
            topic: topic.to_string(),
            partition,
            position: start,
            end: high,
        })
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
        let (_, high) = self
            .consumer
            .fetch_watermarks(&self.topic, self.partition, Duration::from_secs(15))
            .map_err(|e| format!("reading the end of changelog {}/{}: {e}", self.topic, self.partition))?;
        self.end = high;
        Ok((high - self.position).max(0))
    }

    /// Reads what is available within `timeout`, up to `max` records: (key, value; none for
    /// a tombstone).
    pub fn poll(&mut self, max: usize, timeout: Duration) -> Result<Vec<super::Change>, String> {
        let mut out = Vec::new();
        let mut wait = timeout;
        while out.len() < max {
            match self.consumer.poll(wait) {
                None => break,
                Some(Err(e)) => return Err(format!("reading changelog {}/{}: {e}", self.topic, self.partition)),
                Some(Ok(m)) => {
                    self.position = m.offset() + 1;
                    if let Some(key) = m.key() {
                        out.push((key.to_vec(), m.payload().map(<[u8]>::to_vec)));
                    }
                }
            }
            wait = Duration::ZERO;
        }
        Ok(out)
    }

    /// Applies the changelog up to its end (as it was when the reader started) to `db`, in
    /// large write batches without the WAL, then flushes `db` so the result is durable.
    /// `progress` is called about once a second and at the end.
    pub fn restore_into(&mut self, db: &DB, mut progress: impl FnMut(Progress)) -> Result<Progress, String> {
        let started = Instant::now();
        let total = (self.end - self.position).max(0) as u64;
        let mut state = Progress {
            restored: 0,
            total,
            bytes: 0,
            elapsed: Duration::ZERO,
        };
        let mut options = WriteOptions::default();
        options.disable_wal(true);
        let mut last_report = Instant::now();
        let mut idle_since = Instant::now();
        while self.position < self.end {
            let records = self.poll(10_000, Duration::from_millis(200))?;
            if records.is_empty() {
                // Offsets can have gaps (compaction); the consumer's position says where it is.
                if let Ok(tpl) = self.consumer.position() {
                    if let Some(Offset::Offset(p)) = tpl.find_partition(&self.topic, self.partition).map(|p| p.offset())
                    {
                        self.position = self.position.max(p);
                    }
                }
                if idle_since.elapsed() > Duration::from_secs(120) {
                    return Err(format!(
                        "changelog {}/{} delivered nothing for 120 s at offset {} of {}",
                        self.topic, self.partition, self.position, self.end
                    ));
                }
                continue;
            }
            idle_since = Instant::now();
            let mut batch = WriteBatch::default();
            for (key, value) in &records {
                state.bytes += (key.len() + value.as_ref().map_or(0, Vec::len)) as u64;
                match value {
                    Some(v) => batch.put(key, v),
                    None => batch.delete(key),
                }
            }
            db.write_opt(batch, &options)
                .map_err(|e| format!("writing restored records: {e}"))?;
            state.restored += records.len() as u64;
            state.total = state.total.max(state.restored);
            if last_report.elapsed() >= Duration::from_secs(1) {
                state.elapsed = started.elapsed();
                progress(state);
                last_report = Instant::now();
            }
        }
        // The WAL was off: make the restored state durable before anyone checkpoints it.
        db.flush().map_err(|e| format!("flushing restored state: {e}"))?;
        state.elapsed = started.elapsed();
        progress(state);
        Ok(state)
    }
}
