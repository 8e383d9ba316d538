//! Deploys reaching a member: a topology uploaded, replaced or deleted.

use super::GroupRunner;
use crate::worker::deploys::TopologyChange;
use crate::worker::heartbeats::Kept;

impl GroupRunner<'_> {
    /// A topology was uploaded, replaced or deleted: its tasks stop (committing) before the
    /// swap; then the worker rejoins to say what it runs now.
    pub(super) async fn change_topologies(&mut self, change: TopologyChange) -> anyhow::Result<()> {
        let names: Vec<String> = change
            .put
            .iter()
            .map(|t| t.name.clone())
            .chain(change.remove.iter().cloned())
            .collect();
        let (owned, standbys) = self.runner.tasks_of(&names);
        let stopping = self.runner.begin_stop(&owned, false);
        if let Kept::Lost(why) = self
            .heartbeats
            .wait_for(&mut self.membership, &mut self.runner, stopping)
            .await?
        {
            self.lose(&why).await;
        }
        let _ = tokio::task::block_in_place(|| self.runner.stop_standbys(&standbys, &[]));
        for name in &change.remove {
            self.runner.remove_topology(name);
        }
        for topology in change.put {
            self.runner.put_topology(topology);
        }
        Ok(())
    }
}
