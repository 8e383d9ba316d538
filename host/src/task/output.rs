//! Where a task's records go: the worker's shared producer (at-least-once), or the
//! transactional producer of the stream thread the task runs on (exactly-once).
//!
//! Under exactly-once every stream thread has one transactional producer, and all the tasks
//! it drives commit their outputs, changelog writes and source offsets in one transaction
//! (Kafka Streams' `exactly_once_v2`, KIP-447). Its transactional id belongs to the thread
//! (`sluice-worker-<worker id>-<thread>`, the worker id kept in the state directory), so a
//! restarted worker's threads abort what their killed predecessors left open. Zombies are
//! fenced by the cluster group's generation, not by the transactional id: see
//! [`super::control::Fence`] and `docs/guarantees.md`.

use crate::kafka::Authorize as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};
use rdkafka_sys as rdsys;

use super::control::FenceToken;
use super::delivery::{self, DeliveryRouter, DeliveryTracker, Outgoing, SharedProducer, WorkerProducer, PARTITIONER};
use crate::kafka::KafkaSettings;

/// What a task promises about its outputs, state and offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Guarantee {
    /// Nothing is lost; after a failure some records may be processed twice.
    #[default]
    AtLeastOnce,
    /// Outputs, changelog writes and source offsets commit atomically (Kafka transactions).
    ExactlyOnce,
}

impl std::str::FromStr for Guarantee {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "at-least-once" | "at_least_once" => Ok(Guarantee::AtLeastOnce),
            "exactly-once" | "exactly_once" | "exactly_once_v2" => Ok(Guarantee::ExactlyOnce),
            other => Err(format!(
                "unknown processing guarantee {other:?}: use \"at-least-once\" or \"exactly-once\""
            )),
        }
    }
}

/// Why a transaction did not commit.
#[derive(Debug)]
pub enum TransactionError {
    /// The producer cannot go on (another producer took its transactional id, or the
    /// broker timed the transaction out): nothing was committed, and the producer must be
    /// made again.
    Fenced(String),
    /// The transaction was aborted (its records and offsets will never be visible): the
    /// group refused the membership it proved, or a write failed.
    Aborted(String),
}

/// How long a transaction may stay open before the broker aborts it, and how long a commit
/// or a producer's start may take. A worker killed with a transaction open holds back its
/// partitions' readers (and the next owner's committed offsets) this long: Kafka Streams'
/// default under exactly-once.
pub const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the broker lets a transaction stay open before it aborts it: Kafka Streams'
/// 10 s, or three commit intervals if that is longer (a transaction is open for one).
pub fn transaction_timeout(commit_interval: Duration) -> Duration {
    TRANSACTION_TIMEOUT.max(commit_interval * 3)
}

/// The transactional id of stream thread `thread` of the worker whose id is `worker`.
pub fn thread_transactional_id(worker: &str, thread: usize) -> String {
    format!("sluice-worker-{worker}-{thread}")
}

/// Where a task sends its records.
pub struct TaskOutput {
    kind: Kind,
    /// Whether the task sent anything in its thread's open transaction (which an abort of
    /// that transaction then takes back).
    touched: bool,
}

enum Kind {
    /// The worker's shared producer, and the one of it this task sends to.
    Shared(Arc<SharedProducer>, Arc<WorkerProducer>),
    /// Exactly-once: its stream thread's producer, once the task is on that thread.
    Thread(Option<Arc<ThreadProducer>>),
}

impl TaskOutput {
    /// Records go through the worker's shared producer.
    pub fn shared(producer: Arc<SharedProducer>) -> TaskOutput {
        TaskOutput {
            kind: Kind::Shared(producer.clone(), producer.current()),
            touched: false,
        }
    }

    /// Records go through the transactional producer of the stream thread the task will run
    /// on ([`attach`](Self::attach)).
    pub fn transactional() -> TaskOutput {
        TaskOutput {
            kind: Kind::Thread(None),
            touched: false,
        }
    }

    /// The task is on a stream thread: its records go in that thread's transactions.
    pub fn attach(&mut self, producer: Arc<ThreadProducer>) {
        if let Kind::Thread(slot) = &mut self.kind {
            *slot = Some(producer);
        }
    }

    /// With the client certificate renewed on disk: onto the worker's new shared producer,
    /// once nothing the task sent (through any of its `trackers`: outputs, changelogs) is in
    /// flight on the old one, so that its records to a partition stay in order.
    pub fn renew_if_settled(&mut self, trackers: &[&DeliveryTracker]) {
        if let Kind::Shared(shared, producer) = &mut self.kind {
            if shared.is_stale(producer) && trackers.iter().all(|t| t.pending() == 0) {
                *producer = shared.current();
            }
        }
    }

    pub fn is_transactional(&self) -> bool {
        matches!(self.kind, Kind::Thread(_))
    }

    /// Whether the task sent records in its thread's open transaction.
    pub fn touched(&self) -> bool {
        self.touched
    }

    /// The thread's transaction ended (committed or aborted).
    pub fn settled(&mut self) {
        self.touched = false;
    }

    /// Enqueues a record (see [`delivery::send`]); false: `give_up` said to stop waiting.
    pub fn send(
        &mut self,
        tracker: &Arc<DeliveryTracker>,
        out: Outgoing<'_>,
        give_up: &dyn Fn() -> bool,
    ) -> Result<bool, String> {
        match &self.kind {
            Kind::Shared(_, producer) => delivery::send(producer, tracker, out, give_up),
            Kind::Thread(Some(thread)) => {
                thread.begin()?;
                self.touched = true;
                delivery::send(&thread.producer, tracker, out, give_up)
            }
            Kind::Thread(None) => Err("the task is not on a stream thread yet: it has no producer".into()),
        }
    }
}

/// A stream thread's transactional producer: one open transaction at a time, holding what
/// every task of the thread sent since the thread's last commit.
pub struct ThreadProducer {
    producer: WorkerProducer,
    id: String,
    in_transaction: AtomicBool,
    /// It hit a fatal error (fenced, or its transaction timed out on the broker while the
    /// worker was frozen): it can do nothing more, and its thread makes a new one.
    broken: AtomicBool,
}

impl ThreadProducer {
    /// Makes and initialises the producer of transactional id `id`, which aborts whatever an
    /// earlier producer of that id (this thread before the worker restarted) left open. Its
    /// transactions stay open for a commit interval: the broker aborts one open longer than
    /// [`transaction_timeout`]`(commit_interval)`. Retries while the transaction coordinator
    /// is not ready; none when `stopping` says so.
    pub fn start(
        kafka: &KafkaSettings,
        id: &str,
        commit_interval: Duration,
        stopping: &dyn Fn() -> bool,
    ) -> Result<Option<ThreadProducer>, String> {
        let producer: WorkerProducer = kafka
            .worker_client()
            .set("transactional.id", id)
            .set(PARTITIONER.0, PARTITIONER.1)
            .set(
                "transaction.timeout.ms",
                transaction_timeout(commit_interval).as_millis().to_string(),
            )
            .set("linger.ms", "5")
            .set("compression.type", "lz4")
            // Many tasks share it: the queue holds many tasks' worth (see the shared one).
            .set("queue.buffering.max.messages", "1000000")
            .authorized_with(kafka, DeliveryRouter)
            .map_err(|e| format!("creating the transactional producer {id}: {e}"))?;
        let started = Instant::now();
        let mut backoff = Duration::from_millis(200);
        loop {
            match producer.init_transactions(TRANSACTION_TIMEOUT) {
                Ok(()) => break,
                Err(e) if is_fatal(&e) => return Err(format!("initialising transactional producer {id}: {e}")),
                Err(e) => tracing::warn!(
                    transactional_id = id, after = ?started.elapsed(),
                    "initialising the transactional producer failed: {e}; retrying in {backoff:?}"
                ),
            }
            if stopping() {
                return Ok(None);
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
        tracing::info!(
            transactional_id = id,
            ms = started.elapsed().as_millis() as u64,
            "transactional producer ready"
        );
        Ok(Some(ThreadProducer {
            producer,
            id: id.to_string(),
            in_transaction: AtomicBool::new(false),
            broken: AtomicBool::new(false),
        }))
    }

    /// The client certificate's generation it was made at (see `KafkaSettings::renewed`).
    pub fn made(&self) -> u64 {
        self.producer.made()
    }

    /// Whether a transaction is open (something was sent since the last commit or abort).
    pub fn in_transaction(&self) -> bool {
        self.in_transaction.load(Ordering::Acquire)
    }

    /// Whether it can do nothing more (see `broken`).
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    fn begin(&self) -> Result<(), String> {
        if !self.in_transaction() {
            self.producer.begin_transaction().map_err(|e| {
                if is_fatal(&e) {
                    self.broken.store(true, Ordering::Release);
                }
                format!("beginning a transaction: {e}")
            })?;
            self.in_transaction.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// Commits the open transaction (beginning one for the offsets alone if none is open):
    /// first each group's source offsets (`offsets`: group → partitions), then, in a
    /// cluster, the proof of membership (`fence`), last the commit. A refused proof aborts
    /// the transaction: what it holds, offsets included, is never visible.
    ///
    /// The proof goes after the offsets on purpose: offsets added to a transaction are
    /// pending until it ends, and the next owner of a task waits for pending offsets of its
    /// partitions before it reads its state (`require_stable`). So a worker that froze
    /// before its proof leaves offsets the next owner waits on until the transaction aborts;
    /// one that froze after a proof the group accepted (it was still the owner) commits a
    /// transaction the next owner then reads whole.
    pub fn commit(
        &self,
        offsets: &[(String, TopicPartitionList)],
        fence: Option<&FenceToken>,
    ) -> Result<(), TransactionError> {
        self.begin().map_err(TransactionError::Aborted)?;
        let result = (|| {
            for (group, tpl) in offsets {
                if tpl.count() > 0 {
                    send_offsets(&self.producer, tpl, group, None)?;
                }
            }
            if let Some(token) = fence {
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition_offset(&token.topic, 0, Offset::Offset(0))
                    .map_err(|e| Failure::other(format!("the fence's partition: {e}")))?;
                send_offsets(&self.producer, &tpl, &token.group, Some(token))
                    .map_err(|f| f.context("the cluster group refused this worker's membership"))?;
            }
            flush_and_commit(&self.producer)
        })();
        match result {
            Ok(()) => {
                self.in_transaction.store(false, Ordering::Release);
                Ok(())
            }
            Err(f) if f.fatal => {
                self.in_transaction.store(false, Ordering::Release);
                self.broken.store(true, Ordering::Release);
                Err(TransactionError::Fenced(f.message))
            }
            Err(f) => {
                let detail = format!("committing the transaction: {}", f.message);
                self.abort();
                Err(TransactionError::Aborted(detail))
            }
        }
    }

    /// Aborts the open transaction, if any (errors are logged: a transaction the broker
    /// timed out, or one of a fenced producer, is aborted already).
    pub fn abort(&self) {
        if self.in_transaction.swap(false, Ordering::AcqRel) {
            if let Err(e) = self.producer.abort_transaction(TRANSACTION_TIMEOUT) {
                if is_fatal(&e) {
                    self.broken.store(true, Ordering::Release);
                }
                tracing::debug!(transactional_id = %self.id, "aborting the transaction: {e}");
            }
        }
    }
}

/// Why adding offsets to a transaction, or committing it, failed.
struct Failure {
    message: String,
    /// The producer cannot go on (fenced, or timed out by the broker).
    fatal: bool,
}

impl Failure {
    fn other(message: String) -> Failure {
        Failure { message, fatal: false }
    }

    fn context(self, what: &str) -> Failure {
        Failure {
            message: format!("{what}: {}", self.message),
            ..self
        }
    }
}

/// Waits for every record of the transaction to be acknowledged, then commits it, both
/// through librdkafka directly: rust-rdkafka's `flush` (which its `commit_transaction` calls
/// first) waits on the producer's event queue in 100 ms slices, which the polling thread of a
/// threaded producer empties first, so every commit took at least 100 ms.
fn flush_and_commit(producer: &WorkerProducer) -> Result<(), Failure> {
    use rdkafka::client::Client;
    let client: &Client<DeliveryRouter> = producer.client();
    let deadline = Instant::now() + TRANSACTION_TIMEOUT;
    // SAFETY: the client's pointer is valid while `producer` lives; the error returned by
    // the commit is read and destroyed once, here.
    unsafe {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rdsys::rd_kafka_flush(client.native_ptr(), left.as_millis().clamp(1, 1000) as i32) {
                rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => break,
                rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__TIMED_OUT if !left.is_zero() => continue,
                e => {
                    return Err(Failure::other(format!(
                        "waiting for the transaction's records to be acknowledged: {}",
                        RDKafkaErrorCode::from(e)
                    )))
                }
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let error = rdsys::rd_kafka_commit_transaction(client.native_ptr(), left.as_millis().max(1) as i32);
        take_error(error, "committing the transaction")
    }
}

/// Reads and destroys a librdkafka error object (none: success).
///
/// # Safety
/// `error` is null or an error object librdkafka returned, not destroyed yet.
unsafe fn take_error(error: *mut rdsys::rd_kafka_error_t, what: &str) -> Result<(), Failure> {
    use std::ffi::CStr;
    if error.is_null() {
        return Ok(());
    }
    let message = CStr::from_ptr(rdsys::rd_kafka_error_string(error))
        .to_string_lossy()
        .into_owned();
    let name = CStr::from_ptr(rdsys::rd_kafka_error_name(error))
        .to_string_lossy()
        .into_owned();
    let fatal = rdsys::rd_kafka_error_is_fatal(error) != 0;
    rdsys::rd_kafka_error_destroy(error);
    Err(Failure {
        message: format!("{what}: {name}: {message}"),
        fatal,
    })
}

/// `rd_kafka_send_offsets_to_transaction` with group metadata of our making: rust-rdkafka
/// builds it only from a consumer's own membership, and the fence proves the worker's
/// membership in the cluster group, which no librdkafka consumer holds. `member` none: the
/// offsets of a group nobody joins (generation -1).
fn send_offsets(
    producer: &WorkerProducer,
    offsets: &TopicPartitionList,
    group: &str,
    member: Option<&FenceToken>,
) -> Result<(), Failure> {
    use rdkafka::client::Client;
    use std::ffi::CString;
    let cstring = |s: &str| CString::new(s).map_err(|_| Failure::other(format!("{s:?} holds a NUL byte")));
    let group_c = cstring(group)?;
    let member_c = member.map(|m| cstring(&m.member_id)).transpose()?;
    let instance_c = member.and_then(|m| m.instance_id.as_deref()).map(cstring).transpose()?;
    let client: &Client<DeliveryRouter> = producer.client();
    // SAFETY: every pointer handed to librdkafka lives until the call returns; the group
    // metadata and the error it returns are destroyed here, once.
    unsafe {
        let cgm = match (&member_c, member) {
            (Some(member_c), Some(m)) => rdsys::rd_kafka_consumer_group_metadata_new_with_genid(
                group_c.as_ptr(),
                m.generation,
                member_c.as_ptr(),
                instance_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            ),
            _ => rdsys::rd_kafka_consumer_group_metadata_new(group_c.as_ptr()),
        };
        if cgm.is_null() {
            return Err(Failure::other(format!("making the metadata of group {group}")));
        }
        let error = rdsys::rd_kafka_send_offsets_to_transaction(
            client.native_ptr(),
            offsets.ptr(),
            cgm,
            TRANSACTION_TIMEOUT.as_millis() as i32,
        );
        rdsys::rd_kafka_consumer_group_metadata_destroy(cgm);
        take_error(
            error,
            &format!("adding the offsets of group {group} to the transaction"),
        )
    }
}

fn is_fatal(e: &KafkaError) -> bool {
    matches!(e, KafkaError::Transaction(t) if t.is_fatal())
}

#[cfg(test)]
mod tests {
    use super::Guarantee;

    #[test]
    fn guarantees_parse_and_an_unknown_one_is_named() {
        assert_eq!("exactly-once".parse(), Ok(Guarantee::ExactlyOnce));
        assert_eq!("at-least-once".parse(), Ok(Guarantee::AtLeastOnce));
        assert_eq!(
            "at-most-once".parse::<Guarantee>(),
            Err("unknown processing guarantee \"at-most-once\": use \"at-least-once\" or \"exactly-once\"".to_string())
        );
    }
}
