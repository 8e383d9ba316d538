//! Where a task's records go: the worker's shared producer (at-least-once), or a
//! transactional producer of the task's own (exactly-once).
//!
//! Why one transactional producer per task, not per thread: source offsets are committed
//! under the topology's consumer group (`sluice-<topology>`), which no worker is a member
//! of, so the broker cannot fence a zombie by group generation (KIP-447). It fences by
//! `transactional.id` instead: the id is the task's (`sluice-<topology>-<partition>`), so a
//! new owner's producer, by initialising, aborts whatever the old owner left open and makes
//! every later write, offset commit and transaction commit of the old one fail. This costs a
//! producer per active task under exactly-once; at-least-once keeps one shared producer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::Producer;
use rdkafka::TopicPartitionList;

use super::delivery::{self, DeliveryRouter, DeliveryTracker, Outgoing, WorkerProducer, PARTITIONER};
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
    /// Another producer with this task's transactional id took over: the task is not ours.
    Fenced(String),
    /// The transaction was aborted (its records and offsets will never be visible).
    Aborted(String),
}

/// How long a transaction may take to commit, or a transactional producer to start.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

pub struct TaskOutput {
    producer: Arc<WorkerProducer>,
    transactional: bool,
    in_transaction: bool,
}

impl TaskOutput {
    /// Records go through the worker's shared producer.
    pub fn shared(producer: Arc<WorkerProducer>) -> TaskOutput {
        TaskOutput {
            producer,
            transactional: false,
            in_transaction: false,
        }
    }

    /// A transactional producer of the task's own. Initialising it fences every earlier
    /// producer of this id (and aborts what it left open). Retries while the transaction
    /// coordinator is not ready; gives up (none) when `stopping` says so.
    pub fn transactional(
        kafka: &KafkaSettings,
        transactional_id: &str,
        stopping: &dyn Fn() -> bool,
    ) -> Result<Option<TaskOutput>, String> {
        let producer: WorkerProducer = kafka
            .worker_client()
            .set("transactional.id", transactional_id)
            .set(PARTITIONER.0, PARTITIONER.1)
            .set("transaction.timeout.ms", TRANSACTION_TIMEOUT.as_millis().to_string())
            .set("linger.ms", "5")
            .set("compression.type", "lz4")
            .create_with_context(DeliveryRouter)
            .map_err(|e| format!("creating the transactional producer {transactional_id}: {e}"))?;
        let started = Instant::now();
        let mut backoff = Duration::from_millis(200);
        loop {
            match producer.init_transactions(TRANSACTION_TIMEOUT) {
                Ok(()) => break,
                Err(e) if is_fatal(&e) => {
                    return Err(format!("initialising transactional producer {transactional_id}: {e}"))
                }
                Err(e) => tracing::warn!(
                    transactional_id, after = ?started.elapsed(),
                    "initialising the transactional producer failed: {e}; retrying in {backoff:?}"
                ),
            }
            if stopping() {
                return Ok(None);
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
        Ok(Some(TaskOutput {
            producer: Arc::new(producer),
            transactional: true,
            in_transaction: false,
        }))
    }

    pub fn is_transactional(&self) -> bool {
        self.transactional
    }

    /// Whether a transaction is open (something was sent since the last commit).
    pub fn in_transaction(&self) -> bool {
        self.in_transaction
    }

    /// Sends one record (in the open transaction, which it begins if needed).
    /// Enqueues a record (see [`delivery::send`]); false: `give_up` said to stop waiting.
    pub fn send(
        &mut self,
        tracker: &Arc<DeliveryTracker>,
        out: Outgoing<'_>,
        give_up: &dyn Fn() -> bool,
    ) -> Result<bool, String> {
        self.begin()?;
        delivery::send(&self.producer, tracker, out, give_up)
    }

    fn begin(&mut self) -> Result<(), String> {
        if self.transactional && !self.in_transaction {
            self.producer
                .begin_transaction()
                .map_err(|e| format!("beginning a transaction: {e}"))?;
            self.in_transaction = true;
        }
        Ok(())
    }

    /// Commits the open transaction with `offsets` as the group's source offsets (a
    /// transaction is begun for the offsets alone if none is open).
    pub fn commit(
        &mut self,
        offsets: &TopicPartitionList,
        group: &ConsumerGroupMetadata,
    ) -> Result<(), TransactionError> {
        self.begin().map_err(TransactionError::Aborted)?;
        let result = (|| {
            if offsets.count() > 0 {
                self.producer
                    .send_offsets_to_transaction(offsets, group, TRANSACTION_TIMEOUT)?;
            }
            self.producer.commit_transaction(TRANSACTION_TIMEOUT)
        })();
        match result {
            Ok(()) => {
                self.in_transaction = false;
                Ok(())
            }
            Err(e) if is_fenced(&e) => {
                self.in_transaction = false;
                Err(TransactionError::Fenced(e.to_string()))
            }
            Err(e) => {
                let detail = format!("committing the transaction: {e}");
                self.abort();
                Err(TransactionError::Aborted(detail))
            }
        }
    }

    /// Aborts the open transaction, if any (errors are logged: a fenced producer's
    /// transaction is aborted by its successor anyway).
    pub fn abort(&mut self) {
        if self.in_transaction {
            if let Err(e) = self.producer.abort_transaction(TRANSACTION_TIMEOUT) {
                tracing::debug!("aborting the transaction: {e}");
            }
            self.in_transaction = false;
        }
    }
}

fn is_fenced(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch | RDKafkaErrorCode::Fenced)
    ) || matches!(e, KafkaError::Transaction(t) if t.is_fatal())
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
