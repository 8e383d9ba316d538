//! Version probing, the member's side: which group metadata version it speaks after each
//! assignment (the decision: `decide::speak_after`; the versions: `group::metadata`).

use super::decide::{self, Speak};
use super::{GroupRunner, Then};
use crate::group::metadata::Assignment;

impl GroupRunner<'_> {
    /// Follows what `a` says of the version to speak. `Err`: the leader (of an older
    /// release) could not read this worker's metadata; it joins again at once in the
    /// leader's version, having stopped what it ran (the leader may have given it away).
    pub(super) async fn follow_version(&mut self, a: &Assignment) -> Result<Speak, Then> {
        let speak = decide::speak_after(a, self.speaking, self.cluster.metadata_version);
        self.runner.board().speaking(a.version.max(1));
        match speak {
            Speak::Keep => {}
            Speak::Fallback(version) => {
                // A leader of an older release could not read this worker's metadata: it may
                // have given what this worker runs to others in this very generation.
                tracing::info!(
                    cluster = %self.cluster.name, from = self.speaking, to = version,
                    "the group's leader speaks an older metadata version (a worker of an older release): joining again in it"
                );
                self.speaking = version;
                if !self.runner.owned().is_empty() {
                    self.lose("the leader (of an older release) did not read this worker's metadata")
                        .await;
                }
                return Err(Then::Rejoin);
            }
            Speak::Down(version) => {
                tracing::info!(
                    cluster = %self.cluster.name, from = self.speaking, to = version,
                    "a member of an older release joined: speaking its metadata version from the next join"
                );
                self.speaking = version;
            }
            Speak::Up(version) => tracing::info!(
                cluster = %self.cluster.name, from = self.speaking, to = version,
                "every member speaks a newer metadata version now: joining once more in it"
            ),
        }
        Ok(speak)
    }
}
