//! Hostile guests against the sandbox alone (real wasmtime, no Kafka): every attack of the
//! `hostile` guest ends its own call with a fault that names the cause — quickly, without
//! harming the process — or, for floods within budget, is absorbed and the call succeeds.
//! The same guests run beside a well-behaved topology on a real worker in `hostile.rs`.

use std::time::{Duration, Instant};

use sluice::runtime::{GuestFault, LoadError, LoadedTopology, NamedStore, Runtime, RuntimeConfig};
use sluice_tests::worker::guest;
use sluice_wire::wire::Writer;
use sluice_wire::TaskInfo;

const TIMEOUT: Duration = Duration::from_secs(2);

fn runtime() -> Runtime {
    Runtime::new(&RuntimeConfig {
        memory_limit: 64 << 20,
        call_timeout: TIMEOUT,
        host_memory_limit: 32 << 20,
        max_instances: 16,
        ..RuntimeConfig::default()
    })
    .expect("an engine")
}

fn info(topology: &str) -> TaskInfo {
    TaskInfo {
        topology: topology.into(),
        subtopology: topology.into(),
        task_id: format!("{topology}/0"),
        partition: 0,
        source_topics: vec!["in".into()],
        sink_topics: vec!["out".into()],
    }
}

fn batch(values: &[&str]) -> Vec<u8> {
    let mut w = Writer::new();
    for (i, v) in values.iter().enumerate() {
        w.push_input(None, Some(v.as_bytes()), 1000, 0, 0, i as i64, std::iter::empty());
    }
    w.take()
}

/// One batch through a fresh instance whose store is a real RocksDB-free layered store
/// (in memory): the fault, or how many records came out.
fn attack(topology: &LoadedTopology, values: &[&str]) -> Result<usize, GuestFault> {
    let stores = vec![NamedStore {
        name: "state".into(),
        store: Box::new(sluice::state::MemoryStore::default()),
    }];
    let mut instance = topology.instantiate("hostile/0", vec!["output".into()], stores)?;
    instance.init(&info("hostile"))?;
    let output = instance.process(&batch(values))?;
    Ok(output.records(1)?.len())
}

fn hostile(rt: &Runtime) -> LoadedTopology {
    rt.load(guest("hostile")).expect("the hostile guest loads")
}

/// Runs `value` as an attack and returns the fault; the call must end within twice the
/// deadline (a fault named by the deadline itself may take the deadline).
fn fault_of(topology: &LoadedTopology, value: &str) -> GuestFault {
    let started = Instant::now();
    let result = attack(topology, &["before", value, "after"]);
    let took = started.elapsed();
    assert!(
        took < 2 * TIMEOUT + Duration::from_secs(1),
        "{value}: the call took {took:?}"
    );
    match result {
        Err(fault) => fault,
        Ok(n) => panic!("{value}: the attack succeeded with {n} records"),
    }
}

#[test]
fn four_bytes_claiming_four_billion_records_are_bad_output() {
    let rt = runtime();
    let fault = fault_of(&hostile(&rt), "bad-count");
    assert_eq!(fault.kind(), "bad_output", "{fault}");
    assert!(fault.to_string().contains("4294967295 records in 4 bytes"), "{fault}");
}

#[test]
fn sleeping_is_denied_at_once() {
    let rt = runtime();
    let started = Instant::now();
    let fault = fault_of(&hostile(&rt), "sleep");
    assert!(started.elapsed() < TIMEOUT, "{:?}", started.elapsed());
    assert_eq!(fault.kind(), "denied", "{fault}");
    assert!(fault.to_string().contains("std::thread::sleep"), "{fault}");
}

#[test]
fn a_busy_loop_and_unbounded_recursion_and_a_4_gib_allocation_end_their_calls() {
    let rt = runtime();
    let topology = hostile(&rt);
    assert_eq!(fault_of(&topology, "loop").kind(), "deadline");
    let stack = fault_of(&topology, "stack");
    assert_eq!(stack.kind(), "trap", "{stack}");
    // Rust's stack lives in linear memory, so overflowing it is an out-of-bounds access
    // (the native call stack limit traps too, as "call stack exhausted").
    let text = stack.to_string();
    assert!(
        text.contains("stack overflow") || text.contains("call stack exhausted"),
        "{stack}"
    );
    let alloc = fault_of(&topology, "alloc");
    // The guest's allocator refuses 2 GiB of a 4 GiB address space by itself (it never asks
    // the host to grow memory) and aborts, saying so on stderr, which the fault carries.
    assert_eq!(alloc.kind(), "trap", "{alloc}");
    assert!(
        alloc
            .to_string()
            .contains("memory allocation of 2147483647 bytes failed"),
        "{alloc}"
    );
}

#[test]
fn memory_growth_within_the_cap_is_allowed() {
    let rt = runtime();
    assert_eq!(attack(&hostile(&rt), &["grow", "x"]).unwrap(), 2);
}

#[test]
fn a_state_bomb_and_an_emit_flood_hit_the_host_memory_budget() {
    let rt = runtime();
    let topology = hostile(&rt);
    for attack in ["state-bomb", "emit-flood"] {
        let fault = fault_of(&topology, attack);
        assert_eq!(fault.kind(), "memory", "{attack}: {fault}");
        let text = fault.to_string();
        assert!(
            text.contains("host memory budget of 33554432 bytes"),
            "{attack}: {text}"
        );
    }
}

#[test]
fn log_and_stdout_floods_are_absorbed() {
    let rt = runtime();
    let topology = hostile(&rt);
    for flood in ["log-flood", "stdout-flood"] {
        let started = Instant::now();
        assert_eq!(attack(&topology, &[flood, flood]).unwrap(), 2, "{flood}");
        assert!(started.elapsed() < TIMEOUT, "{flood} took {:?}", started.elapsed());
    }
    // A flood does not fill the output for good: a later trap still shows its message.
    let mut instance = topology
        .instantiate("hostile/0", vec!["output".into()], Vec::new())
        .unwrap();
    instance.init(&info("hostile")).unwrap();
    instance.process(&batch(&["stdout-flood"])).unwrap();
    instance.process(&batch(&["stdout-flood"])).unwrap();
}

#[test]
fn undeclared_stores_and_sinks_fail_the_call_even_when_the_guest_ignores_the_error() {
    let rt = runtime();
    let topology = hostile(&rt);
    let store = fault_of(&topology, "undeclared-store");
    assert_eq!(store.kind(), "undeclared", "{store}");
    assert!(store.to_string().contains("the store \"not-declared\""), "{store}");
    let sink = fault_of(&topology, "undeclared-sink");
    assert_eq!(sink.kind(), "undeclared", "{sink}");
    assert!(sink.to_string().contains("the sink \"not-declared\""), "{sink}");
}

#[test]
fn an_init_that_traps_is_a_fault_of_the_task() {
    let rt = runtime();
    let topology = hostile(&rt);
    let mut instance = topology.instantiate("x/0", vec!["output".into()], Vec::new()).unwrap();
    let fault = instance.init(&info("init-trap")).unwrap_err();
    assert_eq!(fault.kind(), "trap", "{fault}");
    assert!(fault.to_string().contains("init refuses to start"), "{fault}");
}

#[test]
fn describe_that_loops_or_traps_and_a_store_named_dot_dot_are_refused_at_load() {
    let rt = runtime();
    let started = Instant::now();
    match rt.load(guest("hostile_describe_loop")) {
        Err(LoadError::Describe { fault, .. }) => assert_eq!(fault.kind(), "deadline"),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a describe that loops was loaded"),
    }
    assert!(started.elapsed() < 2 * TIMEOUT, "{:?}", started.elapsed());
    match rt.load(guest("hostile_describe_trap")) {
        Err(LoadError::Describe { fault, .. }) => assert!(fault.to_string().contains("describe refuses"), "{fault}"),
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a describe that traps was loaded"),
    }
    match rt.load(guest("hostile_store_name")) {
        Err(e @ LoadError::BadDescription { .. }) => {
            assert!(e.to_string().contains("store name \"..\""), "{e}")
        }
        Err(other) => panic!("{other}"),
        Ok(_) => panic!("a store named .. was accepted"),
    }
}
