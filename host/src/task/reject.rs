//! A record the guest cannot process, or the host cannot read for the guest (its topic's
//! format), judged by the topology's error policy: the task fails (committing what came
//! before it), skips it, or sends it unchanged to the dead-letter topic with headers naming
//! the error and where it came from.

/// A record for the dead-letter topic: as it came, and where from.
struct DeadRecord<'a> {
    source_topic: &'a str,
    partition: i32,
    offset: i64,
    timestamp: i64,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
    headers: Vec<Header<'a>>,
}

use rdkafka::message::{Headers as _, Message as _, OwnedMessage};
use sluice_wire::wire::{self, Header, Writer};

use super::commit::{enqueue, Commit};
use super::delivery::Outgoing;
use super::{KafkaEnv, Task, TaskError};
use crate::manifest::OnError;
use crate::metrics::RejectLabels;
use crate::runtime::GuestFault;

impl Task {
    /// One record (or, when no instance could start, the rest of the batch) failed with
    /// `fault`: the topology's error policy decides.
    pub(super) fn reject(
        &mut self,
        whole: &[u8],
        batch: &[(u32, i64)],
        range: std::ops::Range<usize>,
        fault: GuestFault,
        env: &mut KafkaEnv,
    ) -> Result<(), TaskError> {
        let topics = self.ctx.source_topics();
        let partition = self.ctx.partition;
        let at = if range.len() == 1 {
            let (source, offset) = batch[range.start];
            format!(
                "offset {offset} of topic {} partition {partition}",
                topics[source as usize]
            )
        } else {
            format!(
                "the records at offsets {}..={} of partition {partition}",
                batch[range.start].1,
                batch[range.end - 1].1
            )
        };
        let policy = self.ctx.topology.on_error;
        if policy == OnError::Fail || range.len() != 1 {
            // Commit what was processed before it; nothing after. (Under exactly-once the
            // stream thread aborts its transaction instead: the next attempt processes those
            // records again.)
            match if self.output.is_transactional() {
                Ok(Commit::Skipped)
            } else {
                self.commit(env)
            } {
                Ok(Commit::Done) => {}
                Ok(_) => {
                    tracing::warn!(task = %self.id, "not committing the records before the failure: no lease, or fenced")
                }
                Err(e) => tracing::warn!(task = %self.id, "committing the records before the failure: {e}"),
            }
            return Err(TaskError::Guest {
                task: self.id.clone(),
                at,
                fault,
            });
        }
        let input = wire::inputs(whole)
            .expect("the host's own batch encoding")
            .nth(range.start)
            .expect("the record is in the batch")
            .expect("the host's own batch encoding");
        let action = match policy {
            OnError::Skip => {
                tracing::warn!(task = %self.id, "skipping the record at {at} (on-error = \"skip\"): {fault}");
                "skip"
            }
            _ => {
                let (source, offset) = batch[range.start];
                let error = fault.to_string();
                // A record of a topic with a format goes as it came, not as the guest got it.
                let (key, value) = self.originals.get(range.start).unwrap_or((input.key, input.value));
                let (key, value) = (key.map(<[u8]>::to_vec), value.map(<[u8]>::to_vec));
                let record = DeadRecord {
                    source_topic: &topics[source as usize],
                    partition,
                    offset,
                    timestamp: input.timestamp,
                    key: key.as_deref(),
                    value: value.as_deref(),
                    headers: input.headers.iter().collect(),
                };
                self.dead_letter(record, &error, fault.kind())?;
                tracing::warn!(task = %self.id, "sent the record at {at} to the dead-letter topic (on-error = \"dead-letter\"): {fault}");
                "dead-letter"
            }
        };
        self.ctx
            .metrics
            .records_rejected
            .get_or_create(&RejectLabels {
                topology: self.ctx.topology.name.clone(),
                task: self.id.clone(),
                action: action.into(),
                kind: fault.kind().into(),
            })
            .inc();
        self.done(range);
        Ok(())
    }

    /// A record the host could not read for the guest (`reason`: its topic's format), judged
    /// by the policy once the records before it are processed; `retry`: what is wrong is the
    /// registry's answer, which may change (under `fail`, the task starts again later).
    pub(super) fn reject_input(
        &mut self,
        source: u32,
        m: &OwnedMessage,
        reason: String,
        retry: bool,
        env: &mut KafkaEnv,
    ) -> Result<(), TaskError> {
        let at = format!(
            "offset {} of topic {} partition {}",
            m.offset(),
            m.topic(),
            m.partition()
        );
        let policy = self.ctx.topology.on_error;
        let action = match policy {
            OnError::Fail => {
                // What came before it is processed: commit it (under exactly-once the stream
                // thread aborts its transaction instead, and the records come again).
                if !self.output.is_transactional() {
                    match self.commit(env) {
                        Ok(Commit::Done) => {}
                        Ok(_) => {
                            tracing::warn!(task = %self.id, "not committing the records before the failure: no lease, or fenced")
                        }
                        Err(e) => tracing::warn!(task = %self.id, "committing the records before the failure: {e}"),
                    }
                }
                self.count_rejected("fail", "input");
                return Err(TaskError::Input {
                    task: self.id.clone(),
                    at,
                    reason,
                    retry,
                });
            }
            OnError::Skip => {
                tracing::warn!(task = %self.id, "skipping the record at {at} (on-error = \"skip\"): {reason}");
                "skip"
            }
            OnError::DeadLetter => {
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| Header {
                                name: h.key.as_bytes(),
                                value: h.value,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let record = DeadRecord {
                    source_topic: m.topic(),
                    partition: m.partition(),
                    offset: m.offset(),
                    timestamp: m.timestamp().to_millis().unwrap_or(-1),
                    key: m.key(),
                    value: m.payload(),
                    headers,
                };
                self.dead_letter(record, &reason, "input")?;
                tracing::warn!(task = %self.id, "sent the record at {at} to the dead-letter topic (on-error = \"dead-letter\"): {reason}");
                "dead-letter"
            }
        };
        self.count_rejected(action, "input");
        self.summary.records_in += 1;
        self.counters.records_in.inc();
        self.positions[source as usize] = Some(m.offset() + 1);
        Ok(())
    }

    fn count_rejected(&self, action: &str, kind: &str) {
        self.ctx
            .metrics
            .records_rejected
            .get_or_create(&RejectLabels {
                topology: self.ctx.topology.name.clone(),
                task: self.id.clone(),
                action: action.into(),
                kind: kind.into(),
            })
            .inc();
    }

    /// Sends `record` unchanged to the dead-letter topic, with headers naming `error` (of
    /// `kind`), the task, and where the record came from.
    fn dead_letter(&mut self, record: DeadRecord<'_>, error: &str, kind: &str) -> Result<(), TaskError> {
        let topic = self
            .ctx
            .topology
            .binding
            .dead_letter_topic
            .clone()
            .expect("a dead-letter topic under on-error = \"dead-letter\"");
        let (partition_text, offset_text, time_text) = (
            record.partition.to_string(),
            record.offset.to_string(),
            record.timestamp.to_string(),
        );
        let ours = [
            ("sluice.error", error.as_bytes()),
            ("sluice.error.kind", kind.as_bytes()),
            ("sluice.task", self.id.as_bytes()),
            ("sluice.source.topic", record.source_topic.as_bytes()),
            ("sluice.source.partition", partition_text.as_bytes()),
            ("sluice.source.offset", offset_text.as_bytes()),
            ("sluice.source.timestamp", time_text.as_bytes()),
        ];
        let all: Vec<Header<'_>> = record
            .headers
            .iter()
            .copied()
            .chain(ours.iter().map(|(name, value)| Header {
                name: name.as_bytes(),
                value: Some(value),
            }))
            .collect();
        let mut encoded = Writer::new();
        encoded.push_emitted(0, record.key, record.value, record.timestamp, all.into_iter());
        let emitted = wire::emitted(encoded.as_bytes())
            .expect("our own encoding")
            .next()
            .expect("one record")
            .expect("our own encoding");
        let out = Outgoing {
            topic: &topic,
            partition: None,
            key: emitted.key,
            value: emitted.value,
            timestamp: record.timestamp.max(-1),
            headers: emitted.headers,
        };
        enqueue(&mut self.output, &self.tracker, &self.ctx, &self.id, out).map_err(|e| match e {
            TaskError::Produce { task, detail } => TaskError::Produce {
                task,
                detail: format!("sending a record to the dead-letter topic {topic:?}: {detail}"),
            },
            other => other,
        })
    }
}
