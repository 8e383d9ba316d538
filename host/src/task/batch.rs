//! A batch through the guest: records fed in, one call, what it emits produced; a batch
//! that fails is split (or, after a deadline, retried one record per turn) until the
//! failing record is found, and every other record is processed once. Punctuation and
//! close are guest calls too.

use std::time::Instant;

use rdkafka::message::{Headers as _, Message, OwnedMessage};
use sluice_wire::wire::{self, Header, Writer, INHERIT_TIMESTAMP};

use super::commit::enqueue;
use super::delivery::Outgoing;
use super::partition_group::{Lag, PartitionGroup};
use super::{now_ms, KafkaEnv, Task, TaskError};
use crate::runtime::{CallOutput, GuestFault, TaskInstance};

/// Batches within which an instance that reaches three quarters of its memory limit is
/// taken to use that memory for real, not to leak it (see `Task::recycle_if_grown`).
const QUICK_GROWTH: u32 = 16;

impl Task {
    /// Adds a record of source `source` (numbered within the task's stage, as
    /// [`Task::sources`] lists them) to the batch (check [`is_full`](Self::is_full) first).
    pub fn push<M: Message>(&mut self, source: u32, m: &M) {
        // The guest numbers sources as its description lists them.
        let declared = self.ctx.stage().sources[source as usize].0;
        let timestamp = m.timestamp().to_millis().unwrap_or(-1);
        let (key, value) = if self.formats.any {
            let reads = self.formats.reads(declared);
            match self.formats.read(declared, m.key(), m.payload()) {
                Err(why) => {
                    // It waits (or is judged) after the batch; the batch takes no more.
                    self.pending = Some(super::formats::Pending {
                        source,
                        message: super::formats::owned(m),
                        why,
                    });
                    return;
                }
                Ok(read) => {
                    self.originals.push(reads.then(|| (m.key(), m.payload())));
                    read
                }
            }
        } else {
            (m.key(), m.payload())
        };
        let headers: Vec<Header<'_>> = match m.headers() {
            Some(h) => h
                .iter()
                .map(|h| Header {
                    name: h.key.as_bytes(),
                    value: h.value,
                })
                .collect(),
            None => Vec::new(),
        };
        self.writer.push_input(
            key,
            value,
            timestamp,
            declared,
            m.partition(),
            m.offset(),
            headers.into_iter(),
        );
        self.batch.push((source, m.offset()));
        self.stream_time = self.stream_time.max(timestamp);
    }

    /// Whether its records wait in a partition group, to be taken in timestamp order across
    /// its source partitions ([`enqueue`](Self::enqueue) and [`fill`](Self::fill), not
    /// [`push`](Self::push)).
    pub fn orders_inputs(&self) -> bool {
        self.inputs.is_some()
    }

    /// Buffers a record of source `source` in its partition group.
    pub fn enqueue(&mut self, source: u32, m: OwnedMessage) {
        if let Some(group) = &mut self.inputs {
            group.push(source as usize, m);
        }
    }

    /// Whether source `source` has as much buffered as it may (its partition is paused).
    pub fn is_backlogged(&self, source: u32) -> bool {
        self.inputs.as_ref().is_some_and(|g| g.is_backlogged(source as usize))
    }

    /// Whether a paused source has room again.
    pub fn has_room(&self, source: u32) -> bool {
        self.inputs.as_ref().is_none_or(|g| g.has_room(source as usize))
    }

    /// Records buffered in its partition group, not yet in the batch.
    pub fn buffered(&self) -> usize {
        self.inputs.as_ref().map_or(0, PartitionGroup::len)
    }

    /// Moves records from its partition group into the batch, in timestamp order, while the
    /// group may go on (see `partition_group`) and the batch has room; `lag` says how far
    /// behind the broker an empty source is. How many it moved.
    pub fn fill(&mut self, now: Instant, mut lag: impl FnMut(usize) -> Lag) -> usize {
        let Some(mut group) = self.inputs.take() else {
            return 0;
        };
        let mut moved = 0;
        let enforced = group.enforced;
        while !self.is_full() {
            let Some((source, m)) = group.next(now, &mut lag) else {
                break;
            };
            self.push(source as u32, &m);
            moved += 1;
        }
        if group.enforced > enforced {
            self.counters.enforced_processing.inc_by(group.enforced - enforced);
            tracing::debug!(task = %self.id, "processing past an empty source partition it waited for in vain");
        }
        self.inputs = Some(group);
        moved
    }

    pub(super) fn process_batch(&mut self, env: &mut KafkaEnv) -> Result<(), TaskError> {
        let began = Instant::now();
        let result = self.process_batch_timed(env);
        self.thread_time += super::thread_charge(began.elapsed());
        result
    }

    fn process_batch_timed(&mut self, env: &mut KafkaEnv) -> Result<(), TaskError> {
        if self.retry.is_some() {
            return self.retry_step(env);
        }
        if let Some(rate) = &mut self.rate {
            rate.take(self.batch.len(), Instant::now());
        }
        let result = self.process_batch_inner(env);
        if result.is_err() || self.retry.is_none() {
            self.clear_batch();
        }
        result
    }

    /// The next record of a batch that ran into its deadline, alone in a fresh instance; if
    /// it runs into its deadline too, the policy judges it and the task cools down again.
    pub(super) fn retry_step(&mut self, env: &mut KafkaEnv) -> Result<(), TaskError> {
        let Some(i) = self.retry else {
            return Ok(());
        };
        let whole = self.writer.as_bytes().to_vec();
        let batch = self.batch.clone();
        let started = Instant::now();
        let outcome = match self.process_part(&whole, i..i + 1) {
            Ok(Some(fault)) => {
                if matches!(fault, GuestFault::Deadline { .. }) {
                    self.cool_down(started.elapsed());
                }
                self.reject(&whole, &batch, i..i + 1, fault, env)
            }
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        if outcome.is_err() || i + 1 >= batch.len() {
            self.clear_batch();
        } else {
            self.retry = Some(i + 1);
        }
        outcome
    }

    pub(super) fn process_batch_inner(&mut self, env: &mut KafkaEnv) -> Result<(), TaskError> {
        let started = Instant::now();
        // A record skipped or dead-lettered left its faulted instance behind: go on in a
        // fresh one (or, when none can start, let the policy judge the batch by that).
        let result = match self.renew_instance()? {
            Some(fault) => Err(fault),
            None => self.instance.process(self.writer.as_bytes()),
        };
        self.counters.calls.inc();
        let spent = started.elapsed();
        self.counters.call_seconds.inc_by(spent.as_secs_f64());
        let fault = match result {
            Ok(output) => match self.produce(&output, self.stream_time, "a batch") {
                Ok(()) => {
                    self.done(0..self.batch.len());
                    self.unflushed = self.holds_back;
                    self.recycle_if_grown()?;
                    return self.processed();
                }
                Err(TaskError::Guest { fault, .. }) => fault,
                Err(other) => return Err(other),
            },
            Err(fault) => fault,
        };
        self.counters
            .faults
            .get_or_create(&crate::metrics::ErrorLabels {
                topology: self.counters.topology.clone(),
                task: self.id.clone(),
                kind: fault.kind().into(),
            })
            .inc();
        if matches!(fault, GuestFault::Deadline { .. }) {
            // Each further try may run into the deadline again: rather than halving the
            // batch at once (up to 2n - 1 calls at the deadline, holding the stream thread
            // throughout), try its records one per turn, each after a cooldown.
            self.cool_down(started.elapsed());
            if self.batch.len() > 1 {
                tracing::info!(task = %self.id, records = self.batch.len(), "{fault}; processing the batch one record per turn to find the record");
                self.retry = Some(0);
                return Ok(());
            }
        }
        // Some record of the batch cannot be processed, or the batch as a whole is too much
        // for the guest: find out which by processing parts of it in fresh instances.
        let whole = self.writer.as_bytes().to_vec();
        let batch = self.batch.clone();
        self.isolate(&whole, &batch, 0..batch.len(), fault, env)
    }

    /// Marks records `range` of the batch processed: their offsets may be committed.
    pub(super) fn done(&mut self, range: std::ops::Range<usize>) {
        let n = range.len() as u64;
        self.summary.records_in += n;
        self.counters.records_in.inc_by(n);
        for i in range {
            let (source, offset) = self.batch[i];
            self.positions[source as usize] = Some(offset + 1);
        }
    }

    /// Records `range` of `whole` failed together with `fault`. With one record, the
    /// topology's error policy decides; with more, the part before a record the guest named
    /// (or the first half) is processed again in a fresh instance, then the rest, so the
    /// failing record is isolated and every other record is processed once.
    pub(super) fn isolate(
        &mut self,
        whole: &[u8],
        batch: &[(u32, i64)],
        range: std::ops::Range<usize>,
        fault: GuestFault,
        env: &mut KafkaEnv,
    ) -> Result<(), TaskError> {
        if range.len() == 1 || matches!(fault, GuestFault::Instantiate { .. }) {
            return self.reject(whole, batch, range, fault, env);
        }
        tracing::info!(task = %self.id, records = range.len(), "{fault}; processing the batch in parts to find the record");
        let parts = match fault.record_index().map(|i| range.start + i as usize) {
            // The guest named the record: what comes before it, it alone, what follows.
            Some(at) if at < range.end => vec![
                (range.start..at, None),
                (at..at + 1, Some(fault)),
                (at + 1..range.end, None),
            ],
            _ => {
                let mid = range.start + range.len() / 2;
                vec![(range.start..mid, None), (mid..range.end, None)]
            }
        };
        for (part, known) in parts {
            if part.is_empty() {
                continue;
            }
            let fault = match known {
                Some(fault) => fault,
                None => match self.process_part(whole, part.clone())? {
                    None => continue,
                    Some(fault) => fault,
                },
            };
            self.isolate(whole, batch, part, fault, env)?;
        }
        Ok(())
    }

    /// Processes records `part` of `whole` in a fresh instance (the last one faulted) and
    /// produces their output; the fault if they fail.
    pub(super) fn process_part(
        &mut self,
        whole: &[u8],
        part: std::ops::Range<usize>,
    ) -> Result<Option<GuestFault>, TaskError> {
        if let Some(fault) = self.renew_instance()? {
            return Ok(Some(fault));
        }
        let mut writer = Writer::new();
        let inputs = wire::inputs(whole).expect("the host's own batch encoding");
        for input in inputs.skip(part.start).take(part.len()) {
            let input = input.expect("the host's own batch encoding");
            writer.push_input(
                input.key,
                input.value,
                input.timestamp,
                input.source,
                input.partition,
                input.offset,
                input.headers.iter().collect::<Vec<_>>().into_iter(),
            );
        }
        let output = match self.call("a part of a batch", |i| i.process(writer.as_bytes())) {
            Ok(output) => output,
            Err(TaskError::Guest { fault, .. }) => return Ok(Some(fault)),
            Err(other) => return Err(other),
        };
        match self.produce(&output, self.stream_time, "a part of a batch") {
            Ok(()) => {
                self.done(part);
                self.unflushed = self.holds_back;
                self.processed()?;
                Ok(None)
            }
            Err(TaskError::Guest { fault, .. }) => Ok(Some(fault)),
            Err(other) => Err(other),
        }
    }

    /// A fresh instance over the same stores when the current one faulted. Its own fault
    /// (it cannot start) is returned.
    pub(super) fn renew_instance(&mut self) -> Result<Option<GuestFault>, TaskError> {
        if !self.instance.is_faulted() {
            return Ok(None);
        }
        // A task that faults once may fault again: from here on it leaves nothing in the
        // guest between batches.
        self.flush_each_batch = self.holds_back;
        if self.unflushed {
            // What the faulted instance held in its record caches is gone: the task starts
            // again from its last commit, and from then on flushes after every batch.
            self.cache_lost = true;
            lost_caches()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(self.id.clone());
        }
        Ok(self.fresh_instance().err())
    }

    /// Between batches, while the guest holds nothing back, replaces an instance whose memory
    /// grew past three quarters of its limit over many batches with a fresh one over the
    /// same stores. A guest whose memory only grows would otherwise fail its task at the
    /// limit: componentize-py 0.25.1 leaks the whole buffer each call of a Python topology
    /// returns (132 bytes per 100-byte record emitted), so a Python uppercase task failed at
    /// its 64 MiB limit within 600,000 records. The contract allows it at any batch boundary: state lives in the
    /// stores, and a guest keeps nothing else that the host must keep (the Rust SDK's
    /// `batch_started` and `batch_done` say so). An instance that gets there within
    /// [`QUICK_GROWTH`] batches of its start uses its memory for real: its task keeps it.
    fn recycle_if_grown(&mut self) -> Result<(), TaskError> {
        self.instance_batches = self.instance_batches.saturating_add(1);
        if self.unflushed || self.keeps_instance {
            return Ok(());
        }
        let limit = self.ctx.topology.loaded.limits().memory_limit;
        let used = self.instance.memory_used();
        if used <= limit / 4 * 3 {
            return Ok(());
        }
        if self.instance_batches < QUICK_GROWTH {
            tracing::debug!(task = %self.id, used, limit, batches = self.instance_batches, "the guest uses three quarters of its memory limit: it keeps its instance");
            self.keeps_instance = true;
            return Ok(());
        }
        tracing::debug!(task = %self.id, used, limit, batches = self.instance_batches, "replacing a guest instance whose memory grew past three quarters of its limit");
        self.fresh_instance().map_err(|fault| TaskError::Guest {
            task: self.id.clone(),
            at: "a fresh instance (the one before grew past three quarters of its memory limit)".into(),
            fault,
        })
    }

    /// Replaces the guest instance with a fresh one (instantiated and initialised) over the
    /// same stores.
    pub(super) fn fresh_instance(&mut self) -> Result<(), GuestFault> {
        let topology = &self.ctx.topology;
        let stores = self.instance.take_stores();
        let mut instance =
            topology
                .loaded
                .instantiate(&self.id, topology.loaded.description().sinks.clone(), stores)?;
        instance.init(&self.info)?;
        self.instance = instance;
        self.instance_batches = 0;
        Ok(())
    }

    /// Produces what a call (`at` says which) emitted, then keeps the call's state writes;
    /// output that breaks the contract drops them. Records without a timestamp of their own
    /// get `default_ts`.
    pub(super) fn produce(&mut self, output: &CallOutput, default_ts: i64, at: &str) -> Result<(), TaskError> {
        let sink_topics = &self.ctx.topology.binding.sink_topics;
        let records = match output.records(sink_topics.len()) {
            Ok(records) => records,
            Err(fault) => {
                self.instance.end_call(false);
                return Err(TaskError::Guest {
                    task: self.id.clone(),
                    at: at.to_string(),
                    fault,
                });
            }
        };
        // What goes to a topic with a format is checked against its schema first, all of it:
        // a call whose output does not fit produces nothing.
        if self.formats.any {
            if let Err(detail) = self.check_formats(&records) {
                self.instance.end_call(false);
                return Err(TaskError::Guest {
                    task: self.id.clone(),
                    at: at.to_string(),
                    fault: GuestFault::BadOutput { detail },
                });
            }
        }
        let (mut framed_key, mut framed_value) = (Vec::new(), Vec::new());
        for r in &records {
            let timestamp = if r.timestamp == INHERIT_TIMESTAMP {
                default_ts
            } else {
                r.timestamp
            };
            let (mut key, mut value) = (r.key, r.value);
            if let Some(writing) = self.formats.sink(r.sink as usize) {
                if let (Some(w), Some(k)) = (&writing.key, key) {
                    w.frame(k, &mut framed_key);
                    key = Some(&framed_key);
                }
                if let (Some(w), Some(v)) = (&writing.value, value) {
                    w.frame(v, &mut framed_value);
                    value = Some(&framed_value);
                }
            }
            let out = Outgoing {
                topic: &sink_topics[r.sink as usize],
                partition: None,
                key,
                value,
                timestamp: timestamp.max(-1),
                headers: r.headers,
            };
            enqueue(&mut self.output, &self.tracker, &self.ctx, &self.id, out)?;
        }
        self.instance.end_call(true);
        let n = records.len() as u64;
        if self.summary.records_out == 0 && n > 0 {
            tracing::debug!(target: "handover", task = %self.id, records = n, "first records produced");
            let task = crate::group::TaskId::new(&self.ctx.topology.name, self.ctx.partition as u32);
            self.ctx.progress.first_output(&task);
        }
        self.summary.records_out += n;
        self.counters.records_out.inc_by(n);
        Ok(())
    }

    /// Checks what a call emitted to topics with a format against their schemas; the error
    /// names the topic and what does not fit.
    fn check_formats(&self, records: &[sluice_wire::wire::Emitted<'_>]) -> Result<(), String> {
        let sink_topics = &self.ctx.topology.binding.sink_topics;
        for r in records {
            let Some(writing) = self.formats.sink(r.sink as usize) else {
                continue;
            };
            for (part, w, bytes) in [("key", &writing.key, r.key), ("value", &writing.value, r.value)] {
                if let (Some(w), Some(bytes)) = (w, bytes) {
                    w.check(bytes).map_err(|e| {
                        format!(
                            "the {part} it emitted for topic {} does not fit the schema it declares: {e}",
                            sink_topics[r.sink as usize]
                        )
                    })?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn maybe_punctuate(&mut self) -> Result<(), TaskError> {
        let began = Instant::now();
        let result = self.maybe_punctuate_timed();
        self.thread_time += super::thread_charge(began.elapsed());
        result
    }

    fn maybe_punctuate_timed(&mut self) -> Result<(), TaskError> {
        // Stream time starts with the first record this task sees; until then there is no
        // time to punctuate by (a restarted task on an idle partition would otherwise close
        // every open window at the start of time).
        if self.stream_time == i64::MIN {
            return Ok(());
        }
        let interval = self.ctx.settings.punctuate_interval;
        let stream_due = self.stream_time.saturating_sub(self.last_punctuate_stream) >= interval.as_millis() as i64;
        if !(stream_due || self.last_punctuate.elapsed() >= interval) {
            return Ok(());
        }
        self.punctuate_now()
    }

    /// Punctuates the guest now (its windows close, its record caches are flushed).
    pub(super) fn punctuate_now(&mut self) -> Result<(), TaskError> {
        if self.stream_time == i64::MIN {
            return Ok(());
        }
        self.last_punctuate = Instant::now();
        self.last_punctuate_stream = self.stream_time;
        let (stream_time, wall) = (self.stream_time, now_ms());
        let at = format!("punctuation (stream time {stream_time})");
        let output = self.call(&at, |i| i.punctuate(stream_time, wall))?;
        self.produce(&output, stream_time, &at)?;
        self.unflushed = false;
        Ok(())
    }

    /// Before a commit: the guest sends on what its record caches hold (see `unflushed`).
    /// An error when that is lost (the task must start again from its last commit).
    pub(super) fn flush_guest(&mut self) -> Result<(), TaskError> {
        if self.unflushed && self.instance.is_faulted() {
            self.cache_lost = true;
            lost_caches()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(self.id.clone());
        }
        if self.cache_lost {
            return Err(TaskError::State {
                task: self.id.clone(),
                detail: "the guest faulted while it held updates it had not sent yet (its record cache): \
                         the task starts again from its last commit"
                    .into(),
            });
        }
        if self.unflushed {
            let began = Instant::now();
            let result = self.punctuate_now();
            self.thread_time += super::thread_charge(began.elapsed());
            result?;
        }
        Ok(())
    }

    /// After records were processed: under an error policy that goes on past a failing
    /// record (`skip`, `dead-letter`), the guest is punctuated at once, so that a later
    /// fault, which replaces the instance, loses nothing it held.
    fn processed(&mut self) -> Result<(), TaskError> {
        if self.flush_each_batch {
            self.punctuate_now()?;
        }
        Ok(())
    }

    pub(super) fn call(
        &mut self,
        at: &str,
        f: impl FnOnce(&mut TaskInstance) -> Result<CallOutput, GuestFault>,
    ) -> Result<CallOutput, TaskError> {
        // As in `process_batch_inner`: never call an instance that faulted.
        if let Some(fault) = self.renew_instance()? {
            return Err(TaskError::Guest {
                task: self.id.clone(),
                at: at.to_string(),
                fault,
            });
        }
        let started = Instant::now();
        let result = f(&mut self.instance);
        self.counters.calls.inc();
        let spent = started.elapsed();
        self.counters.call_seconds.inc_by(spent.as_secs_f64());
        result.map_err(|fault| TaskError::Guest {
            task: self.id.clone(),
            at: at.to_string(),
            fault,
        })
    }
}

/// Tasks (by id) that lost what a faulted instance held in its record caches on this worker:
/// each starts again flushing after every batch, so the fault that recurs (a batch too large
/// for the guest's memory, a record past the deadline) costs it one restart, not one per
/// commit.
fn lost_caches() -> &'static std::sync::Mutex<std::collections::BTreeSet<String>> {
    static LOST: std::sync::OnceLock<std::sync::Mutex<std::collections::BTreeSet<String>>> = std::sync::OnceLock::new();
    LOST.get_or_init(Default::default)
}

/// Whether task `id` lost a cache on this worker before (see [`lost_caches`]).
pub(super) fn lost_cache_before(id: &str) -> bool {
    lost_caches().lock().unwrap_or_else(|e| e.into_inner()).contains(id)
}
