//! A stream thread's consumer made again once the client certificate was renewed on disk
//! (`crate::kafka::certificate`): librdkafka loads a certificate once per client.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

use super::{spawn_waker, stream_consumer, StreamThread, STALE_WATERMARK};

impl StreamThread {
    /// With a client certificate renewed on disk since the consumer was made (see
    /// `crate::kafka::certificate`): a new consumer, between rounds, with every partition of
    /// a task here where the old one was — after the last record it handed out, or where
    /// the task positioned it — and paused as it was. What the old one fetched ahead is
    /// fetched again; nothing it handed out is read twice. Partitions of no task here (left,
    /// or leaving) are not carried: a task that comes for one assigns it anew.
    pub(super) fn renew_consumer(&mut self) {
        if !self.kafka.renewed(self.consumer.made()) || self.renew_after.is_some_and(|t| Instant::now() < t) {
            return;
        }
        let fresh = match stream_consumer(&self.kafka, self.prefetch_bytes) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(
                    "making the stream consumer again with the renewed client certificate: {e:#}; trying again in 5 s"
                );
                self.renew_after = Some(Instant::now() + Duration::from_secs(5));
                return;
            }
        };
        let handed_out: HashMap<(String, i32), i64> = match self.consumer.position() {
            Ok(list) => list
                .elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) => Some(((e.topic().to_string(), e.partition()), o)),
                    _ => None,
                })
                .collect(),
            Err(e) => {
                tracing::warn!("reading the stream consumer's positions to make it again: {e}; trying again in 5 s");
                self.renew_after = Some(Instant::now() + Duration::from_secs(5));
                return;
            }
        };
        let mut list = TopicPartitionList::new();
        let mut paused = TopicPartitionList::new();
        let mut carried = HashSet::new();
        let stale_until = Instant::now() + STALE_WATERMARK;
        for running in self.tasks.running.iter_mut().flatten().filter(|r| !r.leaving) {
            for (s, part) in running.parts.iter_mut().enumerate() {
                let key = (part.topic.clone(), part.partition);
                let offset = match handed_out.get(&key) {
                    Some(o) => Offset::Offset(*o),
                    None => part.start.map_or(Offset::Beginning, Offset::Offset),
                };
                let _ = list.add_partition_offset(&part.topic, part.partition, offset);
                if running.paused || running.held[s] {
                    let _ = paused.add_partition(&part.topic, part.partition);
                }
                part.stale_until = Some(stale_until);
                carried.insert(key);
            }
        }
        let topics: HashSet<String> = carried.iter().map(|(t, _)| t.clone()).collect();
        for topic in &topics {
            if let Err(e) = fresh.fetch_metadata(Some(topic), Duration::from_secs(5)) {
                tracing::debug!(%topic, "reading the topic's metadata before fetching it: {e}");
            }
        }
        if let Err(e) = fresh.assign(&list).and_then(|()| {
            if paused.count() > 0 {
                fresh.pause(&paused)
            } else {
                Ok(())
            }
        }) {
            tracing::warn!("positioning the stream consumer made again: {e}; trying again in 5 s");
            self.renew_after = Some(Instant::now() + Duration::from_secs(5));
            return;
        }
        tracing::info!(
            partitions = carried.len(),
            paused = paused.count(),
            "stream consumer made again with the renewed client certificate"
        );
        self.renew_after = None;
        let old = std::mem::replace(&mut self.consumer, Arc::new(fresh));
        // The old waker ends with its sender; closing the old consumer may wait on its
        // connections: not on this thread.
        self.tasks.waker = spawn_waker(self.consumer.clone());
        crate::drops::elsewhere(old);
        self.tasks.assigned = carried;
        self.tasks.known_topics = topics;
    }
}
