//! The worker's producer and per-task delivery tracking: a task commits its source offsets
//! only once every record it produced before the commit has been acknowledged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header as KafkaHeader, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::Message;

/// Deliveries of one task still in flight, and the first failure among them.
#[derive(Debug, Default)]
pub struct DeliveryTracker {
    pending: AtomicU64,
    /// Bytes (keys and values) of the records in flight.
    pending_bytes: AtomicU64,
    /// Set with `failure`, so the per-record check takes no lock while all is well.
    failed: std::sync::atomic::AtomicBool,
    failure: Mutex<Option<String>>,
    /// Highest acknowledged offset per topic, kept only for changelogs (for checkpoints).
    offsets: Option<Mutex<std::collections::HashMap<String, i64>>>,
}

impl DeliveryTracker {
    /// A tracker that also remembers the highest acknowledged offset of each topic.
    pub fn with_offsets() -> Self {
        DeliveryTracker {
            offsets: Some(Mutex::default()),
            ..Default::default()
        }
    }

    /// The highest acknowledged offset of `topic` (trackers made `with_offsets` only).
    pub fn offset(&self, topic: &str) -> Option<i64> {
        self.offsets.as_ref()?.lock().unwrap().get(topic).copied()
    }

    pub fn pending(&self) -> u64 {
        self.pending.load(Ordering::Acquire)
    }

    pub fn pending_bytes(&self) -> u64 {
        self.pending_bytes.load(Ordering::Acquire)
    }

    pub fn failure(&self) -> Option<String> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.failure.lock().unwrap().clone()
    }

    /// Waits until nothing is in flight; fails with the first delivery error, or when
    /// `timeout` passes first. Returns false if `give_up` said to stop waiting.
    pub fn wait_idle(&self, timeout: Duration, give_up: &dyn Fn() -> bool) -> Result<bool, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(failure) = self.failure() {
                return Err(failure);
            }
            let pending = self.pending();
            if pending == 0 {
                return Ok(true);
            }
            if give_up() {
                return Ok(false);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{pending} produced record(s) not acknowledged within {}s",
                    timeout.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

/// Routes delivery reports to the tracker of the task that produced the record. Does
/// nothing heavy: it runs on the producer's polling thread.
pub struct DeliveryRouter;

impl ClientContext for DeliveryRouter {}

impl ProducerContext for DeliveryRouter {
    type DeliveryOpaque = Arc<DeliveryTracker>;

    fn delivery(&self, result: &DeliveryResult<'_>, tracker: Arc<DeliveryTracker>) {
        if let (Ok(message), Some(offsets)) = (result, &tracker.offsets) {
            let mut offsets = offsets.lock().unwrap();
            let entry = offsets.entry(message.topic().to_string()).or_insert(-1);
            *entry = (*entry).max(message.offset());
        }
        if let Err((error, message)) = result {
            let mut failure = tracker.failure.lock().unwrap();
            failure.get_or_insert_with(|| {
                format!(
                    "producing to topic {} (partition {}) failed: {error}",
                    message.topic(),
                    message.partition()
                )
            });
            tracker.failed.store(true, Ordering::Release);
        }
        let message = match result {
            Ok(message) => message,
            Err((_, message)) => message,
        };
        let bytes = message.payload_len() + message.key().map_or(0, <[u8]>::len);
        tracker.pending_bytes.fetch_sub(bytes as u64, Ordering::AcqRel);
        tracker.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

pub type WorkerProducer = crate::kafka::Authorized<ThreadedProducer<DeliveryRouter>>;

/// The worker's shared producer (at-least-once), made again when the client certificate is
/// renewed on disk (see `crate::kafka::certificate`): a task moves to the new one once
/// nothing of its is in flight on the old one (so its records to a partition stay in
/// order), and the old one is closed, off the tasks' threads, once no task holds it.
pub struct SharedProducer {
    kafka: crate::kafka::KafkaSettings,
    config: rdkafka::ClientConfig,
    current: Mutex<Arc<WorkerProducer>>,
}

impl SharedProducer {
    /// The producer of `config` (made from `kafka`'s [`crate::kafka::KafkaSettings::worker_client`]).
    pub fn new(kafka: &crate::kafka::KafkaSettings, config: rdkafka::ClientConfig) -> anyhow::Result<SharedProducer> {
        use crate::kafka::Authorize as _;
        use anyhow::Context as _;
        let producer = config
            .authorized_with(kafka, DeliveryRouter)
            .context("creating the producer")?;
        Ok(SharedProducer {
            kafka: kafka.clone(),
            config,
            current: Mutex::new(Arc::new(producer)),
        })
    }

    /// The producer now: made again first if the certificate was renewed since (a new one
    /// that cannot be made is logged, and the old one kept).
    pub fn current(&self) -> Arc<WorkerProducer> {
        use crate::kafka::Authorize as _;
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if self.kafka.renewed(current.made()) {
            match self.config.authorized_with(&self.kafka, DeliveryRouter) {
                Ok(fresh) => {
                    tracing::info!("the shared producer made again with the renewed client certificate");
                    let old = std::mem::replace(&mut *current, Arc::new(fresh));
                    retire(old);
                }
                Err(e) => tracing::warn!("making the shared producer again with the renewed client certificate: {e}"),
            }
        }
        current.clone()
    }

    /// Whether `producer` was made before the certificate was last renewed (a load).
    pub fn is_stale(&self, producer: &WorkerProducer) -> bool {
        self.kafka.renewed(producer.made())
    }
}

/// Closes `old` once no task holds it any more (each moves off when its records are
/// delivered), on a thread of its own: closing waits for its connections.
fn retire(old: Arc<WorkerProducer>) {
    let spawned = std::thread::Builder::new().name("producer-drop".into()).spawn(move || {
        while Arc::strong_count(&old) > 1 {
            std::thread::sleep(Duration::from_millis(200));
        }
        if let Err(e) = old.flush(Duration::from_secs(30)) {
            tracing::warn!("flushing the producer made before the certificate was renewed: {e}");
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("closing the producer made before the certificate was renewed: {e}");
    }
}

/// The partitioner of every producer that writes a task's keyed outputs: murmur2 of the
/// key bytes, positive, modulo the partition count, as Java's default partitioner (and so
/// Kafka Streams) picks; records without a key spread at random. librdkafka's own default
/// (`consistent_random`, CRC32) would put a key elsewhere than a Java producer does, and a
/// stream written by Sluice would not be co-partitioned with a table written from Java.
pub const PARTITIONER: (&str, &str) = ("partitioner", "murmur2_random");

/// One record to produce.
pub struct Outgoing<'a> {
    pub topic: &'a str,
    /// None: the producer's partitioner picks by key.
    pub partition: Option<i32>,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub timestamp: i64,
    pub headers: sluice_wire::wire::Headers<'a>,
}

/// Records one task may have in flight (enqueued, not yet acknowledged) at once. The
/// producer is shared: without a cap per task, one task whose sink cannot take records (a
/// deleted topic, a partition without leader) would fill the queue and stall every task.
pub const MAX_IN_FLIGHT: u64 = 10_000;
/// Bytes of keys and values one task may have in flight at once.
pub const MAX_IN_FLIGHT_BYTES: u64 = 32 << 20;
/// Longest a task waits for room to enqueue a record before it fails.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(120);

/// Enqueues a record once the task has room in flight (see [`MAX_IN_FLIGHT`]) and the
/// producer's queue takes it. Waits at most [`SEND_TIMEOUT`], and fails at once when an
/// earlier record of the task failed. Returns false, enqueuing nothing, when `give_up`
/// says to stop waiting (the task is being stopped).
pub fn send(
    producer: &WorkerProducer,
    tracker: &Arc<DeliveryTracker>,
    out: Outgoing<'_>,
    give_up: &dyn Fn() -> bool,
) -> Result<bool, String> {
    let bytes = (out.key.map_or(0, <[u8]>::len) + out.value.map_or(0, <[u8]>::len)) as u64;
    let mut record = BaseRecord::with_opaque_to(out.topic, tracker.clone());
    if out.timestamp >= 0 {
        record = record.timestamp(out.timestamp);
    }
    if let Some(partition) = out.partition {
        record = record.partition(partition);
    }
    if let Some(key) = out.key {
        record = record.key(key);
    }
    if let Some(value) = out.value {
        record = record.payload(value);
    }
    if !out.headers.is_empty() {
        let mut headers = OwnedHeaders::new_with_capacity(out.headers.len());
        for h in out.headers.iter() {
            let key = String::from_utf8_lossy(h.name);
            headers = headers.insert(KafkaHeader {
                key: &key,
                value: h.value,
            });
        }
        record = record.headers(headers);
    }
    // Only a record that has to wait reads the clock.
    let mut started: Option<Instant> = None;
    loop {
        if let Some(failure) = tracker.failure() {
            return Err(failure);
        }
        let pending = tracker.pending();
        let room = pending == 0 || (pending < MAX_IN_FLIGHT && tracker.pending_bytes() + bytes <= MAX_IN_FLIGHT_BYTES);
        if room {
            // Counted before the send: the delivery report may come before `send` returns.
            tracker.pending.fetch_add(1, Ordering::AcqRel);
            tracker.pending_bytes.fetch_add(bytes, Ordering::AcqRel);
            match producer.send(record) {
                Ok(()) => return Ok(true),
                Err((e, back)) => {
                    tracker.pending.fetch_sub(1, Ordering::AcqRel);
                    tracker.pending_bytes.fetch_sub(bytes, Ordering::AcqRel);
                    if !matches!(e, KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)) {
                        return Err(format!("producing to topic {}: {e}", out.topic));
                    }
                    // The producer's own thread drains the queue; wait for it below.
                    record = back;
                }
            }
        }
        if give_up() {
            return Ok(false);
        }
        if started.get_or_insert_with(Instant::now).elapsed() > SEND_TIMEOUT {
            return Err(format!(
                "no room to produce to topic {} for {}s: {} record(s) of this task are not acknowledged \
                 (does the topic exist? is the cluster reachable?)",
                out.topic,
                SEND_TIMEOUT.as_secs(),
                tracker.pending()
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Flushes everything, for shutdown.
pub fn flush(producer: &WorkerProducer, timeout: Duration) -> Result<(), KafkaError> {
    producer.flush(timeout)
}
