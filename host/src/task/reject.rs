//! A record the guest cannot process, judged by the topology's error policy: the task fails
//! (committing what came before it), skips it, or sends it unchanged to the dead-letter
//! topic with headers naming the error and where it came from.

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
                let topic = self
                    .ctx
                    .topology
                    .binding
                    .dead_letter_topic
                    .clone()
                    .expect("a dead-letter topic under on-error = \"dead-letter\"");
                let error = fault.to_string();
                let (source, offset) = batch[range.start];
                let source_topic = topics[source as usize].clone();
                let (partition_text, offset_text, time_text) =
                    (partition.to_string(), offset.to_string(), input.timestamp.to_string());
                let mut headers = Writer::new();
                let ours = [
                    ("sluice.error", error.as_bytes()),
                    ("sluice.error.kind", fault.kind().as_bytes()),
                    ("sluice.task", self.id.as_bytes()),
                    ("sluice.source.topic", source_topic.as_bytes()),
                    ("sluice.source.partition", partition_text.as_bytes()),
                    ("sluice.source.offset", offset_text.as_bytes()),
                    ("sluice.source.timestamp", time_text.as_bytes()),
                ];
                let all: Vec<Header<'_>> = input
                    .headers
                    .iter()
                    .chain(ours.iter().map(|(name, value)| Header {
                        name: name.as_bytes(),
                        value: Some(value),
                    }))
                    .collect();
                headers.push_emitted(0, input.key, input.value, input.timestamp, all.into_iter());
                let record = wire::emitted(headers.as_bytes())
                    .expect("our own encoding")
                    .next()
                    .expect("one record")
                    .expect("our own encoding");
                let out = Outgoing {
                    topic: &topic,
                    partition: None,
                    key: record.key,
                    value: record.value,
                    timestamp: input.timestamp.max(-1),
                    headers: record.headers,
                };
                enqueue(&mut self.output, &self.tracker, &self.ctx, &self.id, out).map_err(|e| match e {
                    TaskError::Produce { task, detail } => TaskError::Produce {
                        task,
                        detail: format!("sending a record to the dead-letter topic {topic:?}: {detail}"),
                    },
                    other => other,
                })?;
                tracing::warn!(task = %self.id, "sent the record at {at} to {topic:?} (on-error = \"dead-letter\"): {fault}");
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
}
