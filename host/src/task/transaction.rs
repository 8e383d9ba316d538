//! A task's side of its stream thread's transaction (exactly-once): the thread commits all
//! its tasks at once (`threads::stream`), each task first adding its changelog writes and
//! naming its offsets (`prepare_transaction`), then putting its writes in RocksDB once the
//! transaction committed (`transaction_committed`), or going back to its last commit when it
//! aborted (`roll_back`): its stores' uncommitted writes are dropped (RocksDB holds only
//! committed ones, so nothing is restored), a fresh guest instance replaces the one that saw
//! the records rolled back, and its thread seeks its partitions back to the committed offsets.

use std::sync::Arc;
use std::time::Instant;

use rdkafka::TopicPartitionList;

use super::delivery::DeliveryTracker;
use super::{now_ms, KafkaEnv, Task, TaskError, TaskSummary};

/// What a task brings to its thread's commit.
#[derive(Debug)]
pub enum Prepared {
    /// Nothing moved since its last commit.
    Nothing,
    /// Its source offsets, to commit in its topology's group (`sluice-<topology>`).
    Offsets(String, TopicPartitionList),
    /// The lease is not valid: the thread commits nothing now.
    NotNow,
}

impl Task {
    /// Before its thread commits: the guest sends on what it holds back, the state quota
    /// holds, and the stores' writes since the last commit go to their changelogs (in the
    /// transaction). A task that sent anything in the transaction always names its offsets,
    /// moved or not: the next owner of the task waits for pending offsets of its partitions,
    /// so no transaction holding its writes can commit behind that owner's back.
    pub fn prepare_transaction(&mut self) -> Result<Prepared, TaskError> {
        if !self.ctx.lease.valid() {
            return Ok(Prepared::NotNow);
        }
        self.last_commit = Instant::now();
        self.flush_guest()?;
        if self.state.is_some() {
            self.check_state_quota()?;
        }
        let logged = self.log_state()?;
        let idle_due = self.last_offsets_commit.elapsed() >= self.ctx.settings.idle_commit_interval;
        if !logged && !self.output.touched() && self.positions == self.committed && !idle_due {
            return Ok(Prepared::Nothing);
        }
        Ok(Prepared::Offsets(self.group.clone(), self.offsets()))
    }

    /// How a task its thread ends (outside its own step) ended, reported as a step's end is
    /// (log, metrics), and passed on for its slot.
    pub fn report(&self, result: Result<TaskSummary, TaskError>) -> Result<TaskSummary, TaskError> {
        super::report_end(&self.ctx.metrics, &self.labels, &result);
        result
    }

    /// Its records go in the transactions of `producer` (its stream thread's).
    pub fn join_transaction(&mut self, producer: Arc<super::ThreadProducer>) {
        self.output.attach(producer);
    }

    /// Whether it has anything in its thread's open transaction.
    pub fn in_transaction(&self) -> bool {
        self.output.touched()
    }

    /// Its thread's transaction committed (with this task's offsets): its positions are
    /// committed, and its stores' writes and markers go to RocksDB.
    pub fn transaction_committed(&mut self, env: &mut KafkaEnv) -> Result<(), TaskError> {
        self.output.settled();
        self.committed = self.positions.clone();
        self.last_offsets_commit = Instant::now();
        self.purge_committed(env);
        self.commit_state()
    }

    /// Its thread's transaction aborted: back to the last commit (see the module). Its
    /// thread seeks its partitions to [`sources`](Self::sources) afterwards. An error: the
    /// guest could not be started again.
    pub fn roll_back(&mut self) -> Result<(), TaskError> {
        self.output.settled();
        self.clear_batch();
        // A record that waited after the batch comes again from the committed offsets.
        self.pending = None;
        if let Some(inputs) = &mut self.inputs {
            inputs.clear();
        }
        self.positions = self.committed.clone();
        if let Some(state) = &self.state {
            state.discard(self.instance.stores_mut());
        }
        // Deliveries of the aborted transaction report failures into the old trackers.
        self.tracker = Arc::new(DeliveryTracker::default());
        self.changelog_tracker = Arc::new(DeliveryTracker::with_offsets());
        self.unflushed = false;
        self.cache_lost = false;
        self.last_commit = Instant::now();
        match self.fresh_instance() {
            Ok(()) => Ok(()),
            Err(fault) => Err(TaskError::Guest {
                task: self.id.clone(),
                at: "start-up again after its stream thread's transaction aborted".into(),
                fault,
            }),
        }
    }

    /// Asked to stop under exactly-once: records fed but not processed are left for the next
    /// owner; the guest sends on what it holds and closes, and what closing emits goes in
    /// the thread's transaction, which the thread commits next.
    pub fn close_for_stop(&mut self) -> Result<(), TaskError> {
        self.clear_batch();
        self.pending = None;
        self.flush_guest()?;
        let output = self.call("close", |i| i.close())?;
        self.produce(&output, now_ms(), "close")
    }

    /// After [`close_for_stop`](Self::close_for_stop) and its thread's commit: stopped, or
    /// (the transaction did not commit) stopped without committing.
    pub fn stopped(&mut self, committed: bool) -> TaskSummary {
        // Its thread has committed or is aborting the transaction: nothing of it is open.
        self.output.settled();
        if !committed {
            return self.abort("its final transaction did not commit");
        }
        tracing::info!(task = %self.id, records_in = self.summary.records_in, records_out = self.summary.records_out, "stopped");
        self.summary
    }
}
