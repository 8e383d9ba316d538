//! The Wasm sandbox without Kafka: real components, real wasmtime.

use std::time::Duration;

use sluice::runtime::{GuestFault, LoadError, LoadedTopology, Runtime, RuntimeConfig};
use sluice_tests::worker::{guest, TempDir};
use sluice_wire::wire::{self, Writer};
use sluice_wire::TaskInfo;

fn runtime(memory: usize, timeout: Duration) -> Runtime {
    Runtime::new(&RuntimeConfig {
        memory_limit: memory,
        call_timeout: timeout,
        pooling: true,
        max_instances: 16,
        ..RuntimeConfig::default()
    })
    .expect("an engine")
}

fn task(topology: &LoadedTopology) -> TaskInfo {
    TaskInfo {
        topology: "test".into(),
        subtopology: "test".into(),
        task_id: "test/0".into(),
        partition: 0,
        source_topics: vec!["in".into()],
        sink_topics: topology
            .description()
            .sinks
            .iter()
            .map(|s| format!("topic-{s}"))
            .collect(),
    }
}

fn batch(values: &[&str]) -> Vec<u8> {
    let mut w = Writer::new();
    for (i, v) in values.iter().enumerate() {
        let key = format!("k{i}");
        w.push_input(
            Some(key.as_bytes()),
            Some(v.as_bytes()),
            1000 + i as i64,
            0,
            0,
            i as i64,
            std::iter::empty(),
        );
    }
    w.take()
}

/// Runs one batch through a fresh instance; returns (sink, key, value, timestamp) per output.
fn run(topology: &LoadedTopology, values: &[&str]) -> Result<Vec<(String, String, String, i64)>, GuestFault> {
    let sinks = topology.description().sinks.clone();
    let mut instance = topology.instantiate_in_memory("test/0")?;
    instance.init(&task(topology))?;
    let output = instance.process(&batch(values))?;
    let records = output.records(sinks.len())?;
    Ok(records
        .iter()
        .map(|r| {
            let text = |b: Option<&[u8]>| String::from_utf8(b.unwrap_or_default().to_vec()).unwrap();
            (sinks[r.sink as usize].clone(), text(r.key), text(r.value), r.timestamp)
        })
        .collect())
}

#[test]
fn uppercase_describes_itself_and_upper_cases_a_batch() {
    let rt = runtime(64 << 20, Duration::from_secs(5));
    let topology = rt.load(guest("uppercase")).unwrap();
    let d = topology.description();
    assert_eq!(
        (d.name.as_str(), d.sources.as_slice(), d.sinks.as_slice()),
        ("uppercase", &["input".to_string()][..], &["output".to_string()][..])
    );
    let out = run(&topology, &["hello", "wasm world", ""]).unwrap();
    assert_eq!(
        out,
        vec![
            ("output".into(), "k0".into(), "HELLO".into(), 1000),
            ("output".into(), "k1".into(), "WASM WORLD".into(), 1001),
            ("output".into(), "k2".into(), "".into(), 1002),
        ]
    );
}

#[test]
fn a_component_of_the_0_1_0_contract_runs_as_one_sub_topology() {
    // Built against wit/deps/topology-0.1.0 directly, as every component before 0.2.0 was.
    let rt = runtime(64 << 20, Duration::from_secs(5));
    let topology = rt.load(guest("v1-uppercase")).unwrap();
    let d = topology.description();
    assert_eq!(
        (d.name.as_str(), d.sinks.as_slice()),
        ("v1-uppercase", &["output".to_string()][..])
    );
    assert!(d.subtopologies.is_empty() && d.internal_topics.is_empty(), "{d:?}");
    let out = run(&topology, &["hello", "old world"]).unwrap();
    let values: Vec<(&str, &str, &str)> = out
        .iter()
        .map(|(s, k, v, _)| (s.as_str(), k.as_str(), v.as_str()))
        .collect();
    assert_eq!(values, vec![("output", "k0", "HELLO"), ("output", "k1", "OLD WORLD")]);
    // The SDK's components are of the new contract; both kinds load in one runtime.
    assert!(rt
        .load(guest("uppercase"))
        .unwrap()
        .description()
        .subtopologies
        .is_empty());
}

#[test]
fn route_sends_even_numbers_to_even_and_everything_else_to_odd() {
    let rt = runtime(64 << 20, Duration::from_secs(5));
    let topology = rt.load(guest("route")).unwrap();
    assert_eq!(
        topology.description().sinks,
        vec!["even".to_string(), "odd".to_string()]
    );
    let out = run(&topology, &["2", "3", " 10 ", "-4", "x", "7"]).unwrap();
    let sinks: Vec<(&str, &str)> = out.iter().map(|(s, _, v, _)| (s.as_str(), v.as_str())).collect();
    assert_eq!(
        sinks,
        vec![
            ("even", "2"),
            ("odd", "3"),
            ("even", " 10 "),
            ("even", "-4"),
            ("odd", "x"),
            ("odd", "7")
        ]
    );
}

#[test]
fn a_panic_is_a_trap_with_the_panic_message() {
    let rt = runtime(64 << 20, Duration::from_secs(5));
    let topology = rt.load(guest("faults")).unwrap();
    let fault = run(&topology, &["a", "panic"]).unwrap_err();
    let GuestFault::Trap { trap, stderr } = &fault else {
        panic!("expected a trap, got {fault:?}")
    };
    assert!(trap.contains("unreachable"), "{trap}");
    assert!(stderr.contains("boom at offset 1"), "{stderr}");
    assert!(
        fault
            .to_string()
            .starts_with("the guest trapped: wasm `unreachable` instruction executed"),
        "{fault}"
    );
}

#[test]
fn an_endless_loop_hits_the_deadline() {
    let rt = runtime(64 << 20, Duration::from_millis(200));
    let topology = rt.load(guest("faults")).unwrap();
    let started = std::time::Instant::now();
    let fault = run(&topology, &["loop"]).unwrap_err();
    assert_eq!(
        fault,
        GuestFault::Deadline {
            timeout: Duration::from_millis(200)
        }
    );
    assert_eq!(fault.to_string(), "the guest call exceeded its deadline of 200ms");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn memory_beyond_the_cap_is_reported_as_such() {
    let rt = runtime(16 << 20, Duration::from_secs(5));
    let topology = rt.load(guest("faults")).unwrap();
    let fault = run(&topology, &["oom"]).unwrap_err();
    let GuestFault::Memory { limit, requested } = fault else {
        panic!("expected a memory fault, got {fault:?}")
    };
    assert_eq!(limit, 16 << 20);
    assert!(requested > limit);
}

#[test]
fn an_emit_to_an_undeclared_sink_fails_the_batch_at_that_record() {
    let rt = runtime(64 << 20, Duration::from_secs(5));
    let topology = rt.load(guest("faults")).unwrap();
    let fault = run(&topology, &["fine", "undeclared", "fine"]).unwrap_err();
    assert_eq!(fault.record_index(), Some(1));
    assert_eq!(
        fault.to_string(),
        "the topology reported an error: emit to undeclared sink \"nowhere\"; the topology declares [\"output\"]"
    );
}

#[test]
fn a_guest_error_names_its_record() {
    let rt = runtime(64 << 20, Duration::from_secs(5));
    let topology = rt.load(guest("faults")).unwrap();
    let fault = run(&topology, &["fine", "fine", "error"]).unwrap_err();
    assert_eq!(fault.record_index(), Some(2));
    assert_eq!(
        fault.to_string(),
        "the topology reported an error: refusing the record at offset 2"
    );
}

#[test]
fn a_faulted_instance_refuses_further_calls_but_a_new_one_works() {
    let rt = runtime(64 << 20, Duration::from_secs(5));
    let topology = rt.load(guest("faults")).unwrap();
    let mut instance = topology.instantiate_in_memory("t/0").unwrap();
    instance.init(&task(&topology)).unwrap();
    assert!(instance.process(&batch(&["panic"])).is_err());
    assert!(instance.is_faulted());
    assert!(instance.process(&batch(&["fine"])).is_err());
    assert_eq!(run(&topology, &["fine"]).unwrap().len(), 1);
}

#[test]
fn bad_components_are_refused_with_a_message_that_says_why() {
    let rt = runtime(64 << 20, Duration::from_secs(5));
    let dir = TempDir::new("components");

    let missing = dir.path().join("missing.wasm");
    let err = rt.load(&missing).err().unwrap();
    assert!(matches!(err, LoadError::Read { .. }));
    assert_eq!(
        err.to_string(),
        format!(
            "cannot read component {}: No such file or directory (os error 2)",
            missing.display()
        )
    );

    let text = dir.write("notes.wasm", "this is not wasm");
    let err = rt.load(&text).err().unwrap();
    assert_eq!(
        err.to_string(),
        format!(
            "{} is not a WebAssembly component: it does not start with the Wasm magic bytes",
            text.display()
        )
    );

    // An empty core module: the Wasm magic, version 1.
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let err = rt.load(&core).err().unwrap();
    assert_eq!(
        err.to_string(),
        format!(
            "{} is not a WebAssembly component: it is a core Wasm module; build it for wasm32-wasip2 (or wrap it with `wasm-tools component new`)",
            core.display()
        )
    );

    // An empty component: valid, but it exports nothing of the topology world.
    let empty = dir.path().join("empty.wasm");
    std::fs::write(&empty, b"\0asm\x0d\0\x01\0").unwrap();
    let err = rt.load(&empty).err().unwrap();
    assert!(matches!(err, LoadError::WrongWorld { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.starts_with(&format!(
            "component {} does not fit the sluice:topology@0.2.0 world: ",
            empty.display()
        )),
        "{message}"
    );
    assert!(message.contains("sluice:topology/processor@0.2.0"), "{message}");

    // A truncated component.
    let bytes = std::fs::read(guest("uppercase")).unwrap();
    let cut = dir.path().join("cut.wasm");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let err = rt.load(&cut).err().unwrap();
    assert!(matches!(err, LoadError::NotAComponent { .. }), "{err}");
    assert!(
        err.to_string()
            .starts_with(&format!("{} is not a WebAssembly component: ", cut.display())),
        "{err}"
    );
}

#[test]
fn the_wire_format_survives_the_boundary_with_headers_and_nulls() {
    let rt = runtime(64 << 20, Duration::from_secs(5));
    let topology = rt.load(guest("faults")).unwrap();
    let mut instance = topology.instantiate_in_memory("t/0").unwrap();
    instance.init(&task(&topology)).unwrap();
    let mut w = Writer::new();
    let headers = [wire::Header {
        name: b"trace",
        value: Some(b"abc"),
    }];
    w.push_input(None, Some(b"v"), 5, 0, 0, 0, headers.iter().copied());
    w.push_input(Some(b"k"), None, 6, 0, 0, 1, std::iter::empty());
    let output = instance.process(w.as_bytes()).unwrap();
    let records = output.records(1).unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(
        (records[0].key, records[0].value, records[0].timestamp),
        (None, Some(&b"v"[..]), 5)
    );
    assert_eq!(
        (records[1].key, records[1].value, records[1].timestamp),
        (Some(&b"k"[..]), None, 6)
    );
}

/// Runs batches of (key, value, timestamp) through one instance with in-memory stores.
fn run_stateful(
    instance: &mut sluice::runtime::TaskInstance,
    records: &[(&str, &str, i64)],
) -> Result<Vec<(String, String)>, GuestFault> {
    let mut w = Writer::new();
    for (i, (k, v, ts)) in records.iter().enumerate() {
        w.push_input(
            Some(k.as_bytes()),
            Some(v.as_bytes()),
            *ts,
            0,
            0,
            i as i64,
            std::iter::empty(),
        );
    }
    let output = instance.process(w.as_bytes())?;
    Ok(text_records(&output))
}

fn text_records(output: &sluice::runtime::CallOutput) -> Vec<(String, String)> {
    let text = |b: Option<&[u8]>| String::from_utf8(b.unwrap_or_default().to_vec()).unwrap();
    output
        .records(8)
        .unwrap()
        .iter()
        .map(|r| (text(r.key), text(r.value)))
        .collect()
}

#[test]
fn word_count_keeps_counts_across_batches_in_its_store() {
    let rt = runtime(64 << 20, Duration::from_secs(5));
    let topology = rt.load(guest("word-count")).unwrap();
    assert_eq!(topology.description().stores, vec!["counts".to_string()]);
    let mut instance = topology.instantiate_in_memory("wc/0").unwrap();
    instance.init(&task(&topology)).unwrap();
    let out = run_stateful(&mut instance, &[("1", "The cat, the hat", 1)]).unwrap();
    let pairs = |v: &[(&str, &str)]| {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(out, pairs(&[("the", "1"), ("cat", "1"), ("the", "2"), ("hat", "1")]));
    let out = run_stateful(&mut instance, &[("2", "THE end", 2)]).unwrap();
    assert_eq!(out, pairs(&[("the", "3"), ("end", "1")]));
}

#[test]
fn window_count_emits_each_window_once_when_stream_time_passes_its_end() {
    let rt = runtime(64 << 20, Duration::from_secs(5));
    let topology = rt.load(guest("window-count")).unwrap();
    let mut instance = topology.instantiate_in_memory("w/0").unwrap();
    instance.init(&task(&topology)).unwrap();
    // Window [0, 10000): a ×2, b ×1; window [10000, 20000): a ×1.
    let out = run_stateful(
        &mut instance,
        &[
            ("a", "x", 1_000),
            ("b", "x", 2_000),
            ("a", "x", 9_999),
            ("a", "x", 10_500),
        ],
    )
    .unwrap();
    assert!(out.is_empty(), "{out:?}");
    // Stream time 9,999: nothing has closed yet.
    assert!(text_records(&instance.punctuate(9_999, 0).unwrap()).is_empty());
    // Stream time 10,000: the first window closes, exactly once.
    let mut closed = text_records(&instance.punctuate(10_000, 0).unwrap());
    closed.sort();
    assert_eq!(
        closed,
        vec![
            ("a".to_string(), "0 2".to_string()),
            ("b".to_string(), "0 1".to_string())
        ]
    );
    assert!(text_records(&instance.punctuate(15_000, 0).unwrap()).is_empty());
    assert_eq!(
        text_records(&instance.punctuate(20_000, 0).unwrap()),
        vec![("a".to_string(), "10000 1".to_string())]
    );
}

#[test]
fn opening_an_undeclared_store_is_a_named_error() {
    let rt = runtime(64 << 20, Duration::from_secs(5));
    let topology = rt.load(guest("faults")).unwrap();
    let fault = run(&topology, &["fine", "store"]).unwrap_err();
    assert_eq!(fault.record_index(), Some(1));
    assert_eq!(
        fault.to_string(),
        "the topology reported an error: store \"undeclared\": not declared by the topology, so it cannot be opened (declared stores: none)"
    );
}

/// The compile cache: a second runtime loads the compiled component from disk instead of
/// compiling it; a damaged cache file is noticed, removed and compiled again.
#[test]
fn compiled_components_are_kept_on_disk_and_a_damaged_one_is_compiled_again() {
    let dir = TempDir::new("compile-cache");
    let cache = dir.path().join("compiled");
    let runtime = || {
        Runtime::new(&RuntimeConfig {
            max_instances: 4,
            compile_cache: Some(cache.clone()),
            ..RuntimeConfig::default()
        })
        .expect("an engine")
    };
    let component = guest("word-count");
    let files = || -> Vec<std::path::PathBuf> {
        let mut f: Vec<_> = std::fs::read_dir(&cache)
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        f.retain(|p| p.extension().is_some_and(|x| x == "cwasm"));
        f
    };
    assert!(files().is_empty());

    let started = std::time::Instant::now();
    let first = runtime().load(&component).expect("it loads");
    let compiled = started.elapsed();
    assert!(!first.from_cache(), "nothing was cached yet");
    assert_eq!(files().len(), 1, "one compiled component kept");

    let started = std::time::Instant::now();
    let second = runtime().load(&component).expect("it loads from the cache");
    let cached = started.elapsed();
    assert!(second.from_cache());
    assert_eq!(second.description(), first.description());
    eprintln!("word-count: compiled in {compiled:?}, loaded from the cache in {cached:?}");

    // Flip bytes in the middle of the compiled code: the checksum no longer matches.
    let file = &files()[0];
    let mut bytes = std::fs::read(file).unwrap();
    let mid = bytes.len() / 2;
    for b in &mut bytes[mid..mid + 64] {
        *b ^= 0xff;
    }
    std::fs::write(file, &bytes).unwrap();
    let third = runtime().load(&component).expect("it compiles again");
    assert!(!third.from_cache(), "a damaged file is not used");
    assert_eq!(third.description(), first.description());
    assert!(runtime().load(&component).unwrap().from_cache(), "and is replaced");

    // Another component is another entry; a runtime without a cache compiles.
    runtime().load(guest("uppercase")).unwrap();
    assert_eq!(files().len(), 2);
    let uncached = Runtime::new(&RuntimeConfig {
        max_instances: 4,
        ..RuntimeConfig::default()
    })
    .unwrap();
    assert!(!uncached.load(&component).unwrap().from_cache());
}

/// A runtime for Python components: the worker's defaults (the pool of 1,000 instances
/// included), compiled once per test run into the shared compile cache.
fn python_runtime(max_instances: u32) -> Runtime {
    let cache = sluice_tests::worker::target_dir().join("test-compile-cache");
    Runtime::new(&RuntimeConfig {
        max_instances,
        compile_cache: Some(cache),
        ..RuntimeConfig::default()
    })
    .expect("an engine")
}

#[test]
fn a_python_topology_describes_itself_and_upper_cases_a_batch() {
    let rt = python_runtime(16);
    let topology = rt.load(guest("python/uppercase")).unwrap();
    let d = topology.description();
    assert_eq!(
        (d.name.as_str(), d.sinks.as_slice()),
        ("uppercase", &["output".to_string()][..])
    );
    let out = run(&topology, &["hello", "ça va", ""]).unwrap();
    assert_eq!(
        out,
        vec![
            ("output".into(), "k0".into(), "HELLO".into(), 1000),
            ("output".into(), "k1".into(), "ÇA VA".into(), 1001),
            ("output".into(), "k2".into(), "".into(), 1002),
        ]
    );
}

/// The Python DSL examples, as components, describe themselves to the host exactly as their
/// Rust twins do: the same sources, sinks, stores, repartition topics, sub-topologies and
/// global stores, and the same operator lines (the host sees nothing of the language).
#[test]
fn python_dsl_components_describe_themselves_as_their_rust_twins() {
    let rt = python_runtime(16);
    for name in [
        "dsl-word-count",
        "dsl-page-views",
        "dsl-enrich-orders",
        "dsl-orders-payments",
        "dsl-avro-orders",
    ] {
        let python = rt.load(guest(&format!("python/{name}"))).unwrap();
        let rust = rt.load(guest(name)).unwrap();
        assert_eq!(python.description(), rust.description(), "{name}");
        assert!(!rust.operators().is_empty(), "{name}: no operator lines");
        assert_eq!(python.operators(), rust.operators(), "{name}");
    }
}

/// The Avro example's types (`guests/dsl-avro-orders`), to write its input and read its output.
mod avro_orders {
    use sluice_guest::serde::{Deserialize, Serialize};

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(crate = "sluice_guest::serde")]
    pub struct Order {
        pub id: String,
        pub customer: String,
        pub amount: f64,
        pub quantity: i32,
        pub placed: i64,
        pub note: Option<String>,
    }

    sluice_guest::avro_schema!(
        Order,
        include_str!("../../../guests/dsl-avro-orders/schemas/order.avsc")
    );

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(crate = "sluice_guest::serde")]
    pub struct CustomerTotal {
        pub customer: String,
        pub orders: i64,
        pub items: i64,
    }

    sluice_guest::avro_schema!(
        CustomerTotal,
        include_str!("../../../guests/dsl-avro-orders/schemas/customer_total.avsc")
    );
}

/// An input record: (source index, key, value).
type Input = (u32, Option<Vec<u8>>, Vec<u8>);
/// An emitted record: (sink, key, value).
type Output = (String, Option<Vec<u8>>, Option<Vec<u8>>);

/// Runs one batch of inputs through a fresh instance of the sub-topology `subtopology`, then
/// punctuates it (its record caches flush); returns every record it emitted, and the guest
/// time of the batch.
fn run_stage(topology: &LoadedTopology, subtopology: &str, inputs: &[Input]) -> (Vec<Output>, Duration) {
    let sinks = topology.description().sinks.clone();
    let mut instance = topology.instantiate_in_memory("avro/0").unwrap();
    instance
        .init(&TaskInfo {
            subtopology: subtopology.into(),
            ..task(topology)
        })
        .unwrap();
    let mut w = Writer::new();
    for (i, (source, key, value)) in inputs.iter().enumerate() {
        w.push_input(
            key.as_deref(),
            Some(value),
            1_000 + i as i64,
            *source,
            0,
            i as i64,
            std::iter::empty(),
        );
    }
    let started = std::time::Instant::now();
    let processed = instance.process(w.as_bytes()).unwrap();
    let took = started.elapsed();
    let flushed = instance.punctuate(1_000 + inputs.len() as i64, 0).unwrap();
    let mut out = Vec::new();
    for output in [&processed, &flushed] {
        for r in output.records(sinks.len()).unwrap() {
            out.push((
                sinks[r.sink as usize].clone(),
                r.key.map(<[u8]>::to_vec),
                r.value.map(<[u8]>::to_vec),
            ));
        }
    }
    (out, took)
}

/// The Python Avro example, as a component, does what its Rust twin does with the payloads
/// the host hands them: the same Avro bytes to the repartition topic and the same Avro totals
/// to `totals`, record for record. (What each costs per record is printed: fastavro's pure
/// Python inside the component against serde_avro_fast.)
#[test]
fn the_python_avro_example_writes_the_bytes_its_rust_twin_writes() {
    use avro_orders::{CustomerTotal, Order};
    use sluice_guest::formats::Avro;
    use sluice_guest::{Decode, Encode};

    let rt = python_runtime(16);
    let python = rt.load(guest("python/dsl-avro-orders")).unwrap();
    let rust = rt.load(guest("dsl-avro-orders")).unwrap();
    let d = python.description();
    assert_eq!(
        d.format_of("orders").and_then(|f| f.value.clone()),
        Some(Avro::<Order>::schema()),
        "the Python component declares order.avsc itself"
    );
    let mut orders = Vec::new();
    for i in 0..2_000u32 {
        let order = Order {
            id: format!("o-{i}"),
            customer: format!("c{}", i % 7),
            amount: f64::from(i) * 1.25,
            quantity: (i % 5) as i32 + 1,
            placed: 1_733_500_000_000 + i64::from(i),
            note: (i % 3 == 0).then(|| format!("note ✓ {i}")),
        };
        let mut value = Vec::new();
        Avro(order).encode_into(&mut value).unwrap();
        orders.push((0, Some(format!("o-{i}").into_bytes()), value));
    }
    let source =
        |t: &LoadedTopology, name: &str| t.description().sources.iter().position(|s| s == name).unwrap() as u32;
    let (rust_regrouped, rust_took) = run_stage(&rust, "orders", &orders);
    let (python_regrouped, python_took) = run_stage(&python, "orders", &orders);
    assert_eq!(rust_regrouped.len(), orders.len());
    assert!(python_regrouped == rust_regrouped, "the repartition records differ");
    // The second stage reads them back from the repartition topic and keeps the totals.
    let regrouped: Vec<_> = rust_regrouped
        .iter()
        .map(|(_, k, v)| (source(&rust, "by_customer"), k.clone(), v.clone().unwrap()))
        .collect();
    let (rust_totals, rust_took2) = run_stage(&rust, "by_customer", &regrouped);
    let (python_totals, python_took2) = run_stage(&python, "by_customer", &regrouped);
    assert!(!rust_totals.is_empty());
    assert!(python_totals == rust_totals, "the totals differ");
    let (_, _, last) = rust_totals
        .iter()
        .rev()
        .find(|(_, k, _)| k.as_deref() == Some(b"c3"))
        .unwrap();
    let total = Avro::<CustomerTotal>::decode(last.as_deref().unwrap()).unwrap().0;
    assert_eq!((total.customer.as_str(), total.orders), ("c3", 286));
    let per = |d: Duration, n: usize| d.as_secs_f64() * 1e6 / n as f64;
    eprintln!(
        "per record, {} orders in one batch: decode an Order and re-encode it: Python {:.1} µs, Rust {:.2} µs; \
         decode an Order, read, update and write an Avro total: Python {:.1} µs, Rust {:.2} µs",
        orders.len(),
        per(python_took, orders.len()),
        per(rust_took, orders.len()),
        per(python_took2, regrouped.len()),
        per(rust_took2, regrouped.len()),
    );
}

/// The worker's default pool holds 64 live instances of a Python topology (each makes a
/// dozen core instances and memories, where a Rust one makes a few), and a pool that is
/// full refuses the next instance with an error that says so.
#[test]
fn sixty_four_python_tasks_fit_the_default_pool_and_a_full_pool_says_so() {
    let rt = python_runtime(RuntimeConfig::default().max_instances);
    let topology = rt.load(guest("python/uppercase")).unwrap();
    let mut live = Vec::new();
    for i in 0..64 {
        let mut instance = topology
            .instantiate_in_memory(&format!("test/{i}"))
            .unwrap_or_else(|e| panic!("instance {i} of 64: {e}"));
        instance.init(&task(&topology)).unwrap();
        let out = instance.process(&batch(&["x"])).unwrap();
        assert_eq!(out.records(1).unwrap().len(), 1);
        live.push(instance);
    }
    drop(live);

    let small = python_runtime(4);
    let topology = small.load(guest("python/uppercase")).unwrap();
    let live: Vec<_> = (0..4)
        .map(|i| topology.instantiate_in_memory(&format!("t/{i}")).unwrap())
        .collect();
    let err = topology
        .instantiate_in_memory("t/4")
        .err()
        .expect("a fifth instance in a pool of four");
    let text = err.to_string();
    assert!(text.contains("cannot instantiate the topology"), "{text}");
    assert!(
        text.contains("--max-instances"),
        "the error should name the limit: {text}"
    );
    drop(live);
}

/// `describe` has no error in the contract, so a Python exception there traps; the load is
/// refused with the Python traceback, naming the file and line.
#[test]
fn a_python_describe_that_raises_is_refused_with_its_traceback() {
    let rt = python_runtime(16);
    let err = rt
        .load(guest("python/describe-raise"))
        .err()
        .expect("a describe that raises");
    let text = err.to_string();
    assert!(text.contains("failed while describing itself"), "{text}");
    assert!(text.contains("KeyError: 'no sink configured'"), "{text}");
    assert!(
        text.contains("describe_raise.py\", line 8, in _sinks"),
        "the Python line: {text}"
    );
}
