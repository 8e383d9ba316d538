//! Where a task starts reading: its partition of every source topic, at the offsets
//! committed under the topology's group (`sluice-<topology>`), or the beginning.
//!
//! The committed offsets are looked up explicitly, and the lookup is retried until it gives
//! an answer for every partition: a just-started broker's group coordinator answers "not
//! coordinator" or "loading" for a while, and a task must not start from a guess. Offsets
//! of a transaction not yet decided (exactly-once) are "unstable" and retried the same way.

use std::time::{Duration, Instant};

use super::KafkaEnv;

/// Looks up the committed offset of `partition` of each of `sources` in group
/// `sluice-<topology>`; none per source where nothing is committed. Retries (with backoff,
/// saying so in the log) until it succeeds or `stopping` says to give up (then: none).
pub fn committed(
    env: &mut KafkaEnv,
    topology: &str,
    sources: &[String],
    partition: i32,
    task: &str,
    stopping: &dyn Fn() -> bool,
) -> Option<Vec<Option<i64>>> {
    let group = format!("sluice-{topology}");
    let wanted: Vec<(String, i32)> = sources.iter().map(|t| (t.clone(), partition)).collect();
    let started = Instant::now();
    let mut backoff = Duration::from_millis(100);
    loop {
        match env.fetch_offsets(&group, &wanted) {
            Ok(committed) => return Some(committed),
            Err(e) => tracing::warn!(
                task, after = %humantime::format_duration(Duration::from_secs(started.elapsed().as_secs())),
                "looking up the committed offsets of group {group} failed: {e}; retrying in {backoff:?}"
            ),
        }
        let until = Instant::now() + backoff;
        while Instant::now() < until {
            if stopping() {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
