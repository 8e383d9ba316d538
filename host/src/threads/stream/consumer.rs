//! A stream thread's consumer: how much it fetches ahead (from its share of the prefetch
//! memory), its settings, and the thread that wakes its fetcher for a resumed partition.

use std::collections::HashSet;
use std::sync::Arc;

use super::StreamConsumer;
use rdkafka::consumer::BaseConsumer;

use crate::kafka::{Authorize as _, ConsumerEvents, KafkaSettings};

/// A stream thread's consumer: no group of its own (offsets go through `GroupOffsets`),
/// partitions assigned by hand with explicit offsets. `prefetch_bytes` is this thread's
/// share of the worker's prefetch memory.
pub(in crate::threads) fn stream_consumer(
    kafka: &KafkaSettings,
    prefetch_bytes: usize,
) -> anyhow::Result<crate::kafka::Authorized<BaseConsumer<ConsumerEvents>>> {
    let fetch = FetchLimits::for_budget(prefetch_bytes);
    Ok(kafka
        .worker_client()
        .set("queued.max.messages.kbytes", fetch.queued_kbytes.to_string())
        .set("queued.min.messages", fetch.queued_records.to_string())
        .set("fetch.max.bytes", fetch.fetch_bytes.to_string())
        .set("max.partition.fetch.bytes", fetch.partition_fetch_bytes.to_string())
        // A partition whose queue is full is fetched again 10 ms later, not librdkafka's
        // 1 s: with queues this short, a second's wait would starve the thread.
        .set("fetch.queue.backoff.ms", "10")
        // Never used to commit or join: librdkafka's assignment code expects a group.
        .set("group.id", "sluice.stream")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("isolation.level", "read_committed")
        // How long the broker holds a fetch that finds nothing (it answers as soon as
        // records arrive): long, so idle partitions cost few requests (Java's default).
        .set("fetch.wait.max.ms", "500")
        .authorized_with(kafka, ConsumerEvents)?)
}

/// How much a stream consumer may fetch ahead, from its share of the prefetch memory.
///
/// librdkafka counts only record bytes against `queued.max.messages.kbytes`, but it holds
/// every fetched record in an op of about 250 bytes, decompressed: 100-byte records that
/// compress 10:1 take ~30x their fetched size. Measured on a 2M-record backlog of 4
/// partitions, librdkafka's defaults (1 MiB per partition and fetch, 100,000 records queued
/// per partition) peaked at 170–250 MB; these at ~80 MB, and faster.
#[derive(Debug, PartialEq, Eq)]
struct FetchLimits {
    queued_kbytes: usize,
    queued_records: usize,
    fetch_bytes: usize,
    partition_fetch_bytes: usize,
}

impl FetchLimits {
    /// Records queued per partition before its fetching pauses.
    const RECORDS_PER_PARTITION: usize = 5_000;
    /// Fetched (compressed) bytes per partition and request.
    const PARTITION_FETCH: usize = 128 << 10;

    fn for_budget(bytes: usize) -> FetchLimits {
        // Half the budget for record bytes, half for librdkafka's per-record overhead.
        let queued_kbytes = (bytes / 2 / 1024).max(1024);
        // One response, decompressed, must fit the budget several times over.
        let fetch_bytes = (bytes / 16).clamp(1 << 20, 50 << 20);
        FetchLimits {
            queued_kbytes,
            queued_records: Self::RECORDS_PER_PARTITION,
            fetch_bytes,
            partition_fetch_bytes: Self::PARTITION_FETCH.min(fetch_bytes),
        }
    }
}

/// Starts the thread that wakes `consumer`'s fetcher for partitions sent to it (see
/// `crate::kafka::wake_fetcher`): once per partition of what waits, then it waits again. It
/// ends with the stream thread (the sender dropped).
pub(super) fn spawn_waker(consumer: Arc<StreamConsumer>) -> std::sync::mpsc::Sender<(String, i32)> {
    let (tx, rx) = std::sync::mpsc::channel::<(String, i32)>();
    let spawned = std::thread::Builder::new().name("fetch-waker".into()).spawn(move || {
        while let Ok(first) = rx.recv() {
            let mut waiting: HashSet<(String, i32)> = HashSet::from([first]);
            waiting.extend(rx.try_iter());
            for (topic, partition) in waiting {
                crate::kafka::wake_fetcher(&consumer, &topic, partition);
            }
        }
    });
    if let Err(e) = spawned {
        // Without it, a resumed partition is fetched at librdkafka's next tick (a second).
        tracing::warn!("starting a stream thread's fetch waker: {e}");
    }
    tx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetch_limits_follow_the_prefetch_budget() {
        // The default: 64 MiB per worker over 2 threads.
        let l = FetchLimits::for_budget(32 << 20);
        assert_eq!(l.queued_kbytes, 16 << 10);
        assert_eq!(l.fetch_bytes, 2 << 20);
        assert_eq!(l.partition_fetch_bytes, 128 << 10);
        assert_eq!(l.queued_records, 5_000);
        // A tiny budget still fetches something; a huge one stays within librdkafka's cap.
        let l = FetchLimits::for_budget(1 << 10);
        assert_eq!((l.queued_kbytes, l.fetch_bytes), (1024, 1 << 20));
        assert_eq!(FetchLimits::for_budget(4 << 30).fetch_bytes, 50 << 20);
    }
}
