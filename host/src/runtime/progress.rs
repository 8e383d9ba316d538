//! Compiles under way on this worker, and the last ones done, for `GET /status` (and so
//! `sluice status`): a Python component takes Cranelift 6-20 s, a Rust one well under a
//! second, and an upload or a topology's start waits for it.
//!
//! Cranelift says nothing while it works, so a compile's progress is an estimate: its bytes
//! over the rate of this worker's last compile (bytes per second), capped below 1 until it
//! ends. The first compile of a worker has no estimate, only its time so far.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// How many finished compiles are kept, and for how long.
const KEPT: usize = 16;
const KEPT_FOR: Duration = Duration::from_secs(600);

/// One compile as `GET /status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompileStatus {
    /// The topology it is for (empty: not known, e.g. a component loaded by path).
    pub topology: String,
    /// The component: its path or the name it was uploaded under.
    pub component: String,
    pub bytes: u64,
    /// `compiling`, `compiled` or `failed`.
    pub state: String,
    /// Seconds it has taken so far (or took).
    pub seconds: f64,
    /// About how long it takes in all, from this worker's last compile (compiling only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub expected_seconds: Option<f64>,
    /// About how much of it is done, 0 to 1 (compiling only; see the module docs).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub progress: Option<f64>,
    /// Seconds since it finished (finished only).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub ago_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
}

struct Running {
    topology: String,
    component: String,
    bytes: u64,
    started: Instant,
}

struct Done {
    status: CompileStatus,
    at: Instant,
}

#[derive(Default)]
struct Inner {
    next: u64,
    running: BTreeMap<u64, Running>,
    done: VecDeque<Done>,
    /// Bytes per second of the last successful compile.
    rate: Option<f64>,
}

/// The compiles of one runtime.
#[derive(Default, Clone)]
pub struct Compiles(Arc<Mutex<Inner>>);

impl Compiles {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A compile begins; it ends (failed, unless [`CompileGuard::done`] says otherwise) when
    /// the guard is dropped.
    pub fn start(&self, topology: &str, component: &str, bytes: usize) -> CompileGuard {
        let mut inner = self.lock();
        let id = inner.next;
        inner.next += 1;
        inner.running.insert(
            id,
            Running {
                topology: topology.to_string(),
                component: component.to_string(),
                bytes: bytes as u64,
                started: Instant::now(),
            },
        );
        CompileGuard {
            compiles: self.clone(),
            id,
            outcome: Some(Err("the compile ended without a result".into())),
        }
    }

    fn finish(&self, id: u64, outcome: Result<(), String>) {
        let mut inner = self.lock();
        let Some(run) = inner.running.remove(&id) else {
            return;
        };
        let seconds = run.started.elapsed().as_secs_f64();
        if outcome.is_ok() && seconds > 0.0 {
            inner.rate = Some(run.bytes as f64 / seconds);
        }
        let (state, error) = match outcome {
            Ok(()) => ("compiled", None),
            Err(e) => ("failed", Some(e)),
        };
        inner.done.push_front(Done {
            status: CompileStatus {
                topology: run.topology,
                component: run.component,
                bytes: run.bytes,
                state: state.into(),
                seconds,
                expected_seconds: None,
                progress: None,
                ago_seconds: None,
                error,
            },
            at: Instant::now(),
        });
        inner.done.truncate(KEPT);
    }

    /// Compiles under way (oldest first), then the finished ones of the last ten minutes
    /// (newest first).
    pub fn status(&self) -> Vec<CompileStatus> {
        let mut inner = self.lock();
        inner.done.retain(|d| d.at.elapsed() < KEPT_FOR);
        let rate = inner.rate;
        let mut out: Vec<CompileStatus> = inner
            .running
            .values()
            .map(|r| {
                let seconds = r.started.elapsed().as_secs_f64();
                let expected = rate.map(|rate| r.bytes as f64 / rate);
                CompileStatus {
                    topology: r.topology.clone(),
                    component: r.component.clone(),
                    bytes: r.bytes,
                    state: "compiling".into(),
                    seconds,
                    expected_seconds: expected,
                    progress: expected.map(|e| if e > 0.0 { (seconds / e).min(0.99) } else { 0.99 }),
                    ago_seconds: None,
                    error: None,
                }
            })
            .collect();
        out.extend(inner.done.iter().map(|d| CompileStatus {
            ago_seconds: Some(d.at.elapsed().as_secs_f64()),
            ..d.status.clone()
        }));
        out
    }
}

/// A compile under way; see [`Compiles::start`].
pub struct CompileGuard {
    compiles: Compiles,
    id: u64,
    outcome: Option<Result<(), String>>,
}

impl CompileGuard {
    /// It compiled.
    pub fn done(mut self) {
        self.outcome = Some(Ok(()));
    }

    /// It did not: `why`.
    pub fn failed(mut self, why: String) {
        self.outcome = Some(Err(why));
    }
}

impl Drop for CompileGuard {
    fn drop(&mut self) {
        let outcome = self.outcome.take().unwrap_or(Ok(()));
        self.compiles.finish(self.id, outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_compile_shows_while_it_runs_then_as_done_with_an_estimate_for_the_next() {
        let c = Compiles::default();
        let first = c.start("wc", "wc.wasm", 1_000_000);
        let now = c.status();
        assert_eq!(now.len(), 1);
        assert_eq!((now[0].state.as_str(), now[0].expected_seconds), ("compiling", None));
        std::thread::sleep(Duration::from_millis(20));
        first.done();
        let next = c.start("py", "py.wasm", 2_000_000);
        let now = c.status();
        assert_eq!(now.len(), 2);
        assert_eq!((now[0].topology.as_str(), now[0].state.as_str()), ("py", "compiling"));
        let expected = now[0].expected_seconds.expect("an estimate from the last compile");
        assert!(
            expected > 0.03,
            "twice the bytes of a compile of 20 ms or more: {expected}"
        );
        assert!(now[0].progress.unwrap() < 0.99);
        assert_eq!((now[1].state.as_str(), now[1].error.as_deref()), ("compiled", None));
        next.failed("Cranelift ran out of memory".into());
        let dropped = c.start("x", "x.wasm", 1);
        drop(dropped);
        let now = c.status();
        assert_eq!(
            now.iter()
                .map(|s| (s.topology.as_str(), s.state.as_str()))
                .collect::<Vec<_>>(),
            [("x", "failed"), ("py", "failed"), ("wc", "compiled")]
        );
        assert_eq!(now[1].error.as_deref(), Some("Cranelift ran out of memory"));
    }
}
