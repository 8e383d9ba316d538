//! Components compiled in a child process (`sluice compile-component`), as a worker
//! compiles them: under a deadline and a memory cap, and loaded into the worker's own engine
//! (pooling allocator and all). No Kafka.

use std::time::{Duration, Instant};

use sluice::runtime::compiler::{ChildCompiler, ChildError};
use sluice::runtime::{Runtime, RuntimeConfig};
use sluice_tests::worker::{guest, sluice_binary};

fn child(timeout: Duration, memory: u64) -> ChildCompiler {
    ChildCompiler {
        program: sluice_binary(),
        timeout,
        memory,
    }
}

/// A topology compiled in a child loads into a pooling engine and describes itself as the
/// same topology compiled in-process does.
#[test]
fn a_component_compiled_in_a_child_runs_as_one_compiled_here() -> anyhow::Result<()> {
    let config = |compile_in_child| RuntimeConfig {
        pooling: true,
        max_instances: 16,
        compile_in_child,
        ..RuntimeConfig::default()
    };
    let here = Runtime::new(&config(None))?.load(guest("uppercase"))?;
    let there = Runtime::new(&config(Some(child(Duration::from_secs(60), 2 << 30))))?.load(guest("uppercase"))?;
    assert!(!there.from_cache());
    assert_eq!(there.description(), here.description());
    Ok(())
}

/// A compile that needs more memory than the cap is refused, naming the cap; the worker's
/// own memory is not where it ran.
#[test]
fn a_compile_past_its_memory_cap_is_refused_naming_it() {
    // 40,000 empty functions (within the count bound) need a few hundred MiB to compile.
    let component = sluice_tests::many_functions(40_000);
    match child(Duration::from_secs(120), 96 << 20).compile(&component) {
        Err(ChildError::OverLimit(detail)) => {
            assert!(
                detail.contains("component.compile.max.bytes") && detail.contains("96 MiB"),
                "{detail}"
            )
        }
        Err(ChildError::Failed(detail)) => panic!("failed otherwise: {detail}"),
        Ok(_) => panic!("compiled within 96 MiB"),
    }
    // The same with room compiles.
    assert!(child(Duration::from_secs(120), 2 << 30).compile(&component).is_ok());
}

/// A compile that takes longer than the deadline is killed at it, naming the deadline.
#[test]
fn a_compile_past_its_deadline_is_killed_at_it() {
    let component = sluice_tests::many_functions(40_000);
    let started = Instant::now();
    match child(Duration::from_millis(300), 2 << 30).compile(&component) {
        Err(ChildError::OverLimit(detail)) => {
            assert!(detail.contains("component.compile.timeout.ms"), "{detail}")
        }
        Err(ChildError::Failed(detail)) => panic!("failed otherwise: {detail}"),
        Ok(_) => panic!("compiled 40,000 functions within 300 ms: the test proves nothing"),
    }
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
}

/// What does not compile says why, from the child's message.
#[test]
fn a_component_that_does_not_compile_says_why() {
    match child(Duration::from_secs(60), 2 << 30).compile(b"\0asm\x0d\0\x01\0\x01\x05garbage") {
        Err(ChildError::Failed(detail)) => {
            assert!(!detail.is_empty() && !detail.contains("sluice: error:"), "{detail}")
        }
        other => panic!("{:?}", other.map(|b| b.len())),
    }
}
