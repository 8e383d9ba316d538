//! What the state-updater threads read: changelog (and global) topic partitions through one
//! consumer, and their bounds through a client of their own. A trait, so that the threads'
//! decisions are unit-tested on partitions in memory ([`memory::MemoryChangelogs`]).

use crate::kafka::Authorize as _;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::kafka::{KafkaSettings, OffsetsClient};

/// A topic partition.
pub type Partition = (String, i32);

/// One record read.
pub struct Polled<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
}

/// Partitions read through one consumer.
pub trait Changelogs: Send + 'static {
    /// Reads each partition from its offset on: added if new, sought and resumed if it was
    /// read (and paused) before.
    fn read_from(&mut self, partitions: &[(String, i32, i64)]) -> Result<(), String>;
    /// Stops fetching these partitions (what they have queued is dropped).
    fn pause(&mut self, partitions: &[Partition]);
    /// Fetches them again, from where they were read up to.
    fn resume(&mut self, partitions: &[Partition]);
    /// Makes sure the partition's leader is fetched from now (a fetcher may be asleep until
    /// its next request: see `crate::kafka::wake_fetcher`).
    fn wake(&self, topic: &str, partition: i32);
    /// The next record, waiting up to `wait` for one; none if none came.
    fn poll(&mut self, wait: Duration, each: &mut dyn FnMut(Polled<'_>)) -> Option<Result<(), String>>;
    /// How far each partition has been read: the offset after the last record (or
    /// transaction marker, or compacted gap) handed out.
    fn positions(&self) -> HashMap<Partition, i64>;
    /// The first offset and the end (last stable offset) of a partition.
    fn bounds(&self, topic: &str, partition: i32) -> Result<(i64, i64), String>;
    /// Where each of these partitions ends now, in one request.
    fn ends(&self, partitions: &[Partition]) -> Result<HashMap<Partition, i64>, String>;
    /// The partitions of a topic.
    fn partitions(&self, topic: &str) -> Result<Vec<i32>, String>;
}

/// Changelogs read from Kafka.
pub struct KafkaChangelogs {
    consumer: crate::kafka::Authorized<BaseConsumer>,
    /// Reads bounds and metadata on a connection of its own: on the consumer's they would
    /// queue behind its long-polling fetch (half a second per standby).
    client: OffsetsClient,
    assigned: HashSet<Partition>,
    /// Topics whose metadata the consumer has read (see [`KafkaChangelogs::read_from`]).
    known_topics: HashSet<String>,
    /// What made the consumer, to make it again with a renewed client certificate.
    kafka: KafkaSettings,
    name: String,
    rate: Option<u64>,
    /// Where each assigned partition was last positioned (read from), and which are paused:
    /// what a consumer made again starts from.
    positioned: HashMap<Partition, i64>,
    paused: HashSet<Partition>,
    /// Partitions positioned by a consumer made again, where nothing was read since: their
    /// position is where the old consumer was.
    carried: HashMap<Partition, i64>,
}

impl KafkaChangelogs {
    /// A consumer named `name` (its client id) reading committed records; `rate`: the reader
    /// is held to a rate (then it fetches in small steps into a small queue: what librdkafka
    /// fetches ahead it fetches at the broker's full speed, whatever the rate of reading it).
    pub fn new(kafka: &KafkaSettings, name: &str, rate: Option<u64>) -> anyhow::Result<KafkaChangelogs> {
        Ok(KafkaChangelogs {
            consumer: Self::consumer(kafka, name, rate)?,
            client: OffsetsClient::new(kafka, "sluice-standby-offsets", "sluice.restore"),
            assigned: HashSet::new(),
            known_topics: HashSet::new(),
            kafka: kafka.clone(),
            name: name.to_string(),
            rate,
            positioned: HashMap::new(),
            paused: HashSet::new(),
            carried: HashMap::new(),
        })
    }

    fn consumer(
        kafka: &KafkaSettings,
        name: &str,
        rate: Option<u64>,
    ) -> anyhow::Result<crate::kafka::Authorized<BaseConsumer>> {
        // Learners restore whole stores through this consumer: fetch in large steps, as a
        // restoration does (restore.rs), within a bounded queue.
        let (fetch, partition_fetch, queue_kb) = match rate {
            None => (32 << 20, 4 << 20, 64 << 10),
            Some(_) => (4 << 20, 1 << 20, 4 << 10),
        };
        Ok(kafka
            .client()
            .set("client.id", name)
            .set("fetch.max.bytes", fetch.to_string())
            .set("max.partition.fetch.bytes", partition_fetch.to_string())
            .set("queued.max.messages.kbytes", queue_kb.to_string())
            // A partition whose queue is full is fetched again after this long, not after
            // librdkafka's default second: learners read faster than the queue refills.
            .set("fetch.queue.backoff.ms", "10")
            .set("group.id", "sluice.restore")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .set("isolation.level", "read_committed")
            // A partition added (a new learner) is fetched only with the next request, once
            // the one in flight returns: a broker holds an empty fetch this long (500 ms by
            // default), which a promoted learner's catch-up and a new learner would wait for.
            .set("fetch.wait.max.ms", "20")
            .authorized(kafka)?)
    }

    /// With a client certificate renewed on disk since the consumer was made: a new one,
    /// every partition where the old one was (read up to, or positioned), paused as it was.
    /// What the old one had fetched ahead is fetched again. A new one that cannot be made
    /// or positioned is tried again at the next poll.
    fn renew_if_due(&mut self) {
        if !self.kafka.renewed(self.consumer.made()) {
            return;
        }
        let fresh = match Self::consumer(&self.kafka, &self.name, self.rate) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(consumer = %self.name, "making the changelog consumer again with the renewed certificate: {e:#}");
                return;
            }
        };
        let read = self.positions();
        let mut list = TopicPartitionList::new();
        let mut at = HashMap::new();
        for key in &self.assigned {
            let Some(offset) = read.get(key).or(self.positioned.get(key)).copied() else {
                continue;
            };
            let _ = list.add_partition_offset(&key.0, key.1, Offset::Offset(offset));
            at.insert(key.clone(), offset);
        }
        if let Err(e) = fresh.assign(&list) {
            tracing::warn!(consumer = %self.name, "positioning the changelog consumer made again: {e}");
            return;
        }
        let paused: Vec<Partition> = self.paused.iter().filter(|p| at.contains_key(*p)).cloned().collect();
        if !paused.is_empty() {
            let _ = fresh.pause(&Self::list(&paused));
        }
        tracing::info!(consumer = %self.name, partitions = at.len(), "changelog consumer made again with the renewed client certificate");
        let old = std::mem::replace(&mut self.consumer, fresh);
        // Closing it may wait on its connections: not on this thread.
        crate::drops::elsewhere(old);
        self.assigned = at.keys().cloned().collect();
        self.positioned = at.clone();
        self.carried = at;
        self.known_topics.clear();
    }

    fn list(partitions: &[Partition]) -> TopicPartitionList {
        let mut list = TopicPartitionList::new();
        for (topic, p) in partitions {
            let _ = list.add_partition(topic, *p);
        }
        list
    }
}

impl Changelogs for KafkaChangelogs {
    fn read_from(&mut self, partitions: &[(String, i32, i64)]) -> Result<(), String> {
        self.renew_if_due();
        let mut fresh = TopicPartitionList::new();
        let mut sought = None;
        for (topic, partition, offset) in partitions {
            let key = (topic.clone(), *partition);
            self.positioned.insert(key.clone(), *offset);
            self.carried.remove(&key);
            self.paused.remove(&key);
            if self.assigned.contains(&key) {
                self.consumer
                    .seek(topic, *partition, Offset::Offset(*offset), Duration::from_secs(10))
                    .and_then(|()| self.consumer.resume(&Self::list(std::slice::from_ref(&key))))
                    .map_err(|e| format!("positioning {topic}/{partition}: {e}"))?;
                sought = Some(key);
            } else {
                let _ = fresh.add_partition_offset(topic, *partition, Offset::Offset(*offset));
                self.assigned.insert(key);
            }
        }
        if fresh.count() > 0 {
            // A topic it has no metadata for would be fetched only after librdkafka's next
            // metadata refresh, about a second later (a promoted learner that had just
            // started waited for it): one metadata request per topic first.
            for e in fresh.elements() {
                let topic = e.topic();
                if !self.known_topics.contains(topic) {
                    match self.consumer.fetch_metadata(Some(topic), Duration::from_secs(5)) {
                        Ok(_) => {
                            self.known_topics.insert(topic.to_string());
                        }
                        Err(e) => tracing::debug!(%topic, "reading the topic's metadata before fetching it: {e}"),
                    }
                }
            }
            self.consumer
                .incremental_assign(&fresh)
                .map_err(|e| format!("assigning partitions: {e}"))?;
        }
        if let Some((topic, partition)) = sought {
            // Sought and resumed: see `crate::kafka::wake_fetcher`.
            self.wake(&topic, partition);
        }
        Ok(())
    }

    fn pause(&mut self, partitions: &[Partition]) {
        self.paused.extend(partitions.iter().cloned());
        if !partitions.is_empty() {
            let _ = self.consumer.pause(&Self::list(partitions));
        }
    }

    fn resume(&mut self, partitions: &[Partition]) {
        for p in partitions {
            self.paused.remove(p);
        }
        if let Some((topic, partition)) = partitions.first() {
            let _ = self.consumer.resume(&Self::list(partitions));
            self.wake(topic, *partition);
        }
    }

    fn wake(&self, topic: &str, partition: i32) {
        crate::kafka::wake_fetcher(&self.consumer, topic, partition);
    }

    fn poll(&mut self, wait: Duration, each: &mut dyn FnMut(Polled<'_>)) -> Option<Result<(), String>> {
        self.renew_if_due();
        match self.consumer.poll(wait)? {
            Ok(m) => {
                each(Polled {
                    topic: m.topic(),
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key(),
                    value: m.payload(),
                });
                Some(Ok(()))
            }
            Err(e) => Some(Err(e.to_string())),
        }
    }

    fn positions(&self) -> HashMap<Partition, i64> {
        let Ok(list) = self.consumer.position() else {
            return self.carried.clone();
        };
        let mut read = self.carried.clone();
        read.extend(list.elements().iter().filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
            _ => None,
        }));
        read
    }

    fn bounds(&self, topic: &str, partition: i32) -> Result<(i64, i64), String> {
        self.client
            .ask(|c| c.fetch_watermarks(topic, partition, Duration::from_secs(15)))
            .map_err(|e| format!("reading the offsets of {topic}/{partition}: {e}"))
    }

    fn ends(&self, partitions: &[Partition]) -> Result<HashMap<Partition, i64>, String> {
        let mut list = TopicPartitionList::new();
        for (topic, p) in partitions {
            let _ = list.add_partition_offset(topic, *p, Offset::End);
        }
        let found = self.client.ask(|c| {
            let found = c
                .offsets_for_times(list.clone(), Duration::from_secs(5))
                .map_err(|e| e.to_string())?;
            match found
                .elements()
                .iter()
                .find(|e| e.error().is_err() || !matches!(e.offset(), Offset::Offset(_)))
            {
                Some(e) => Err(format!("{}/{}: {:?}", e.topic(), e.partition(), e.error())),
                None => Ok(found),
            }
        })?;
        Ok(found
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                _ => None,
            })
            .collect())
    }

    fn partitions(&self, topic: &str) -> Result<Vec<i32>, String> {
        self.client
            .ask(|c| {
                let metadata = c
                    .fetch_metadata(Some(topic), Duration::from_secs(15))
                    .map_err(|e| e.to_string())?;
                let partitions: Vec<i32> = metadata
                    .topics()
                    .iter()
                    .filter(|t| t.name() == topic && t.error().is_none())
                    .flat_map(|t| t.partitions().iter().map(|p| p.id()))
                    .collect();
                if partitions.is_empty() {
                    return Err("no partitions in the metadata".to_string());
                }
                Ok(partitions)
            })
            .map_err(|e| format!("reading the metadata of topic {topic:?}: {e}"))
    }
}

#[cfg(test)]
pub mod memory {
    //! Partitions in memory, shared between a test and the consumer it hands a thread.

    use std::collections::{BTreeMap, HashMap};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::{Changelogs, Partition, Polled};

    /// A record of a partition: key and value (none: a tombstone); `None` for an offset
    /// that holds no record (a transaction marker, a compacted gap).
    type Slot = Option<(Vec<u8>, Option<Vec<u8>>)>;

    #[derive(Default)]
    struct Log {
        /// Each partition from its first offset.
        partitions: BTreeMap<Partition, (i64, Vec<Slot>)>,
        /// Bounds requests fail while set.
        unreachable: bool,
    }

    /// Topics in memory; clones share them.
    #[derive(Clone, Default)]
    pub struct MemoryTopics(Arc<Mutex<Log>>);

    impl MemoryTopics {
        pub fn append(&self, topic: &str, partition: i32, key: &[u8], value: Option<&[u8]>) {
            let mut log = self.0.lock().unwrap();
            let (_, slots) = log.partitions.entry((topic.to_string(), partition)).or_default();
            slots.push(Some((key.to_vec(), value.map(<[u8]>::to_vec))));
        }

        /// An offset without a record (a transaction's commit marker).
        pub fn append_marker(&self, topic: &str, partition: i32) {
            let mut log = self.0.lock().unwrap();
            log.partitions
                .entry((topic.to_string(), partition))
                .or_default()
                .1
                .push(None);
        }

        pub fn create(&self, topic: &str, partitions: i32) {
            let mut log = self.0.lock().unwrap();
            for p in 0..partitions {
                log.partitions.entry((topic.to_string(), p)).or_default();
            }
        }

        /// While set, bounds and ends cannot be read (a broker away).
        pub fn unreachable(&self, unreachable: bool) {
            self.0.lock().unwrap().unreachable = unreachable;
        }

        pub fn consumer(&self) -> MemoryChangelogs {
            MemoryChangelogs {
                topics: self.clone(),
                reading: BTreeMap::new(),
            }
        }
    }

    /// A consumer of [`MemoryTopics`].
    pub struct MemoryChangelogs {
        topics: MemoryTopics,
        /// Partitions read: the next offset, and whether paused.
        reading: BTreeMap<Partition, (i64, bool)>,
    }

    impl Changelogs for MemoryChangelogs {
        fn read_from(&mut self, partitions: &[(String, i32, i64)]) -> Result<(), String> {
            for (topic, p, offset) in partitions {
                self.reading.insert((topic.clone(), *p), (*offset, false));
            }
            Ok(())
        }

        fn pause(&mut self, partitions: &[Partition]) {
            for p in partitions {
                if let Some(r) = self.reading.get_mut(p) {
                    r.1 = true;
                }
            }
        }

        fn resume(&mut self, partitions: &[Partition]) {
            for p in partitions {
                if let Some(r) = self.reading.get_mut(p) {
                    r.1 = false;
                }
            }
        }

        fn wake(&self, _topic: &str, _partition: i32) {}

        fn poll(&mut self, _wait: Duration, each: &mut dyn FnMut(Polled<'_>)) -> Option<Result<(), String>> {
            let log = self.topics.0.lock().unwrap();
            for ((topic, p), (next, paused)) in self.reading.iter_mut() {
                if *paused {
                    continue;
                }
                let Some((first, slots)) = log.partitions.get(&(topic.clone(), *p)) else {
                    continue;
                };
                let mut at = (*next).max(*first);
                // Offsets without a record are skipped, as a consumer skips them.
                while let Some(None) = slots.get((at - first) as usize) {
                    at += 1;
                    *next = at;
                }
                if let Some(Some((key, value))) = slots.get((at - first) as usize) {
                    *next = at + 1;
                    each(Polled {
                        topic,
                        partition: *p,
                        offset: at,
                        key: Some(key),
                        value: value.as_deref(),
                    });
                    return Some(Ok(()));
                }
            }
            None
        }

        fn positions(&self) -> HashMap<Partition, i64> {
            self.reading.iter().map(|(p, (next, _))| (p.clone(), *next)).collect()
        }

        fn bounds(&self, topic: &str, partition: i32) -> Result<(i64, i64), String> {
            let log = self.topics.0.lock().unwrap();
            if log.unreachable {
                return Err(format!(
                    "reading the offsets of {topic}/{partition}: the broker is away"
                ));
            }
            let (first, slots) = log
                .partitions
                .get(&(topic.to_string(), partition))
                .ok_or_else(|| format!("{topic}/{partition}: no such partition"))?;
            Ok((*first, first + slots.len() as i64))
        }

        fn ends(&self, partitions: &[Partition]) -> Result<HashMap<Partition, i64>, String> {
            partitions
                .iter()
                .map(|(t, p)| Ok(((t.clone(), *p), self.bounds(t, *p)?.1)))
                .collect()
        }

        fn partitions(&self, topic: &str) -> Result<Vec<i32>, String> {
            let log = self.topics.0.lock().unwrap();
            let found: Vec<i32> = log
                .partitions
                .keys()
                .filter(|(t, _)| t == topic)
                .map(|(_, p)| *p)
                .collect();
            match found.is_empty() {
                true => Err(format!("reading the metadata of topic {topic:?}: no partitions")),
                false => Ok(found),
            }
        }
    }
}
