//! The Python SDK's stream DSL against this crate's, record for record: each topology here has
//! a twin written with the Python DSL (`guest-sdk-python/tests/dsl_twins.py`). Both compile to
//! a description and operator lines that must be equal, and both run the same random input
//! (records into every source, punctuations between them) through their test drivers: every
//! record each sends to each sink (key, value and timestamp bytes, in order) and every entry
//! each leaves in each store (stored bytes, times and stream times included) must be equal.
//!
//! The first five are the examples `guests/dsl-word-count`, `guests/dsl-page-views`,
//! `guests/dsl-enrich-orders`, `guests/dsl-orders-payments` and `guests/dsl-avro-orders` (and
//! their twins the Python examples in `guests/python/`; the Avro one's orders are random Avro
//! values, and its descriptions' formats are compared too); the others use the rest of the
//! DSL's operators: every operator of the Rust DSL has its twin here.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use sluice_guest::dsl::testing::TestDriver;
use sluice_guest::dsl::{JoinWindows, SessionWindows, SlidingWindows, StreamsBuilder, TimeWindows, Topology, Windowed};
use sluice_guest::formats::{Avro, Schema};
use sluice_guest::serde::{Deserialize, Serialize};
use sluice_guest::{Description, Encode};

fn word_count(b: &mut StreamsBuilder) {
    b.stream::<(), String>("lines")
        .flat_map_values(|line| line.split_whitespace().map(str::to_lowercase).collect::<Vec<_>>())
        .group_by(|_, word| word.clone())
        .named("words")
        .count("counts")
        .to_stream()
        .to("totals");
}

fn page_views(b: &mut StreamsBuilder) {
    const MINUTE: Duration = Duration::from_secs(60);
    const GRACE: Duration = Duration::from_secs(30);
    fn line(window: Windowed<String>, count: Option<u64>) -> (String, String) {
        (
            window.key,
            format!("{} {} {}", window.start, window.end, count.unwrap_or(0)),
        )
    }
    let by_user = b.stream::<String, String>("views").group_by_key();
    by_user
        .windowed_by(TimeWindows::tumbling(MINUTE).grace(GRACE))
        .emit_final()
        .count("views_per_minute")
        .to_stream()
        .map(line)
        .to("per_minute");
    by_user
        .windowed_by(TimeWindows::hopping(5 * MINUTE, MINUTE).grace(GRACE))
        .emit_final()
        .count("views_per_5_minutes")
        .to_stream()
        .map(line)
        .to("per_5_minutes");
}

fn enrich_orders(b: &mut StreamsBuilder) {
    fn enriched(order: &str, customer: Option<&String>) -> String {
        format!("{order} for {}", customer.map_or("unknown customer", String::as_str))
    }
    let customers = b.table::<String, String>("customers", "customers");
    let directory = b.global_table::<String, String>("directory", "directory");
    let orders = b.stream::<String, String>("orders");
    orders.left_join(&customers, |o, c| enriched(o, c)).to("enriched");
    orders
        .left_join_global(&directory, |customer, _| customer.clone(), |o, c| enriched(o, c))
        .to("enriched_global");
}

fn orders_payments(b: &mut StreamsBuilder) {
    let orders = b.stream::<String, String>("orders");
    let payments = b.stream::<String, String>("payments");
    orders
        .left_join_stream(
            &payments,
            |order, payment| match payment {
                Some(payment) => format!("{order} paid by {payment}"),
                None => format!("{order} unpaid"),
            },
            JoinWindows::of(Duration::from_secs(600))
                .before(Duration::ZERO)
                .grace(Duration::from_secs(120)),
        )
        .to("paid");
}

/// `guests/dsl-avro-orders` (its code, and its types over its schema files).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "sluice_guest::serde")]
struct Order {
    id: String,
    customer: String,
    amount: f64,
    quantity: i32,
    placed: i64,
    note: Option<String>,
}

sluice_guest::avro_schema!(Order, include_str!("../../guests/dsl-avro-orders/schemas/order.avsc"));

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(crate = "sluice_guest::serde")]
struct CustomerTotal {
    customer: String,
    orders: i64,
    items: i64,
}

sluice_guest::avro_schema!(
    CustomerTotal,
    include_str!("../../guests/dsl-avro-orders/schemas/customer_total.avsc")
);

fn avro_orders(b: &mut StreamsBuilder) {
    b.stream::<Option<String>, Avro<Order>>("orders")
        .group_by(|_, order| order.0.customer.clone())
        .named("by_customer")
        .aggregate(
            || {
                Avro(CustomerTotal {
                    customer: String::new(),
                    orders: 0,
                    items: 0,
                })
            },
            |customer: &String, order, Avro(total)| {
                Avro(CustomerTotal {
                    customer: customer.clone(),
                    orders: total.orders + 1,
                    items: total.items + i64::from(order.0.quantity),
                })
            },
            "totals",
        )
        .to_stream()
        .to("totals");
}

/// Split, merge, map, select-key, reduce, to-table after a key change, a stream-table join
/// after a key change (a repartition) over a filtered and mapped table, a flat-map, and a
/// small record cache that sends its oldest keys on early.
fn mixed(b: &mut StreamsBuilder) {
    b.cache_max_bytes(300);
    let events = b.stream::<String, String>("events");
    let names = b.table::<String, String>("names", "names");
    let parts = events
        .split()
        .branch(|_, v| v.starts_with('a'))
        .branch(|_, v| v.len() > 3)
        .default_branch();
    parts[0].map_values(|v| v.to_uppercase()).peek(|_, _| {}).to("upper");
    parts[1]
        .merge(&parts[2])
        .select_key(|_, v| v.chars().take(1).collect::<String>())
        .group_by_key()
        .reduce(|a, b| format!("{a}+{b}"), "joined")
        .to_stream()
        .to("reduced");
    events
        .map(|k, v| (v.clone(), k))
        .to_table("latest")
        .to_stream()
        .to("latest_out");
    let lengths = names.filter(|_, v| v.len() % 2 == 0).map_values(|v| v.len() as u64);
    events
        .filter_not(|k, _| k.ends_with('4'))
        .select_key(|_, v| format!("k{}", v.len() % 5))
        .left_join(&lengths, |v, n| format!("{v}:{}", n.map_or(-1, |n| *n as i64)))
        .to("with_length");
    events
        .flat_map(|k, v| v.chars().map(|c| (c.to_string(), k.clone())).collect::<Vec<_>>())
        .group_by_key()
        .count("letters")
        .to_stream()
        .to("letter_counts");
}

/// Windows sent at every update, through a record cache so small that it sends keys on
/// early (a record's letters each update two hopping windows): hopping windows aggregated
/// with an initializer and counted, tumbling ones reduced; a stream-table inner join.
fn windowed(b: &mut StreamsBuilder) {
    b.cache_max_bytes(230);
    let events = b.stream::<String, String>("events");
    let names = b.table::<String, String>("names", "names");
    events
        .group_by_key()
        .windowed_by(
            TimeWindows::hopping(Duration::from_secs(10), Duration::from_secs(5)).grace(Duration::from_secs(2)),
        )
        .aggregate(|| 0i64, |_, v, a| a + v.len() as i64, "lens")
        .to_stream()
        .map(|w, n| (format!("{}@{}-{}", w.key, w.start, w.end), n.unwrap_or(-1)))
        .to("lens");
    events
        .group_by(|_, v| v.chars().take(2).collect::<String>())
        .named("by_prefix")
        .windowed_by(TimeWindows::tumbling(Duration::from_secs(7)))
        .reduce(|a, b| if b > a { b } else { a }, "largest")
        .to_stream()
        .map(|w, v| (w.key, v.unwrap_or_default()))
        .to("largest");
    events
        .flat_map_values(|v| v.chars().map(|c| c.to_string()).collect::<Vec<_>>())
        .group_by_key()
        .windowed_by(TimeWindows::hopping(Duration::from_secs(10), Duration::from_secs(5)))
        .count("char_windows")
        .to_stream()
        .map(|w, n| (format!("{}@{}", w.key, w.start), n.unwrap_or(0)))
        .to("chars_out");
    events.join(&names, |v, n| format!("{v} by {n}")).to("joined");
}

/// Tables: table-table joins (inner, left, outer), and tables grouped by a new key with
/// count, reduce and aggregate (adders and subtractors), their changes through repartition
/// topics.
fn tables(b: &mut StreamsBuilder) {
    fn or_dash(v: Option<&String>) -> &str {
        v.map_or("-", String::as_str)
    }
    let orders = b.table::<String, String>("accounts", "accounts");
    let statuses = b.table::<String, String>("statuses", "statuses");
    let joined = orders.join(&statuses, |o, s| format!("{o}/{s}"));
    joined.to_stream().to("joined");
    orders
        .left_join(&statuses, |o, s| format!("{o}/{}", or_dash(s)))
        .to_stream()
        .to("left");
    orders
        .outer_join(&statuses, |o, s| format!("{}/{}", or_dash(o), or_dash(s)))
        .to_stream()
        .to("outer");
    let by_first = joined.group_by(|_, v| (v.chars().take(1).collect::<String>(), v.clone()));
    by_first.count("per_letter").to_stream().to("letter_counts");
    by_first
        .reduce(
            |a, b| format!("{a}+{b}"),
            |a, b| a.replacen(&format!("+{b}"), "", 1),
            "reduced",
        )
        .to_stream()
        .to("reduced");
    statuses
        .group_by(|_, s| (s.clone(), s.len() as i64))
        .aggregate(|| 0i64, |_, v, a| a + v, |_, v, a| a - v, "status_totals")
        .to_stream()
        .to("totals_out");
}

/// Session windows: emitted when closed (counted), and at every update (aggregated, with a
/// merger for the sessions a record bridges, and a deletion of each session merged away).
fn sessions(b: &mut StreamsBuilder) {
    let clicks = b.stream::<String, String>("clicks").group_by_key();
    clicks
        .windowed_by(SessionWindows::with_inactivity_gap(Duration::from_secs(5)).grace(Duration::from_secs(3)))
        .emit_final()
        .count("final_sessions")
        .to_stream()
        .map(|w, n| (w.key, format!("{} {} {}", w.start, w.end, n.unwrap_or(0))))
        .to("final");
    clicks
        .windowed_by(SessionWindows::with_inactivity_gap(Duration::from_secs(4)))
        .aggregate(
            String::new,
            |_, v, a| format!("{a}{v}"),
            |_, a, b| format!("{a}|{b}"),
            "joined_sessions",
        )
        .to_stream()
        .map(|w, v| (format!("{}@{}-{}", w.key, w.start, w.end), v))
        .to("updates");
}

/// Stream-stream joins: a left join with no time before (orders and their payments), an
/// inner and an outer join with other windows, and an inner join of both streams re-keyed
/// (both repartitioned).
fn stream_joins(b: &mut StreamsBuilder) {
    fn or_dash(v: Option<&String>) -> &str {
        v.map_or("-", String::as_str)
    }
    let orders = b.stream::<String, String>("orders");
    let payments = b.stream::<String, String>("payments");
    orders
        .left_join_stream(
            &payments,
            |o, p| match p {
                Some(p) => format!("{o} paid by {p}"),
                None => format!("{o} unpaid"),
            },
            JoinWindows::of(Duration::from_secs(10))
                .before(Duration::ZERO)
                .grace(Duration::from_secs(3)),
        )
        .to("paid");
    orders
        .join_stream(
            &payments,
            |o, p| format!("{o}+{p}"),
            JoinWindows::of(Duration::from_secs(2)).grace(Duration::from_secs(1)),
        )
        .to("inner");
    orders
        .outer_join_stream(
            &payments,
            |o, p| format!("{}|{}", or_dash(o), or_dash(p)),
            JoinWindows::of(Duration::from_secs(3)).after(Duration::from_secs(1)),
        )
        .to("outer");
    let first = |_: &String, v: &String| v.chars().take(1).collect::<String>();
    orders
        .select_key(first)
        .join_stream(
            &payments.select_key(first),
            |o, p| format!("{o}={p}"),
            JoinWindows::of(Duration::from_secs(1)),
        )
        .to("by_letter");
}

/// Sliding windows: emitted when closed (counted), and at every update (reduced); records
/// earlier than the time difference share the window that starts at 0.
fn sliding(b: &mut StreamsBuilder) {
    let clicks = b.stream::<String, String>("clicks").group_by_key();
    clicks
        .windowed_by(SlidingWindows::with_time_difference(Duration::from_secs(6)).grace(Duration::from_secs(3)))
        .emit_final()
        .count("sliding_final")
        .to_stream()
        .map(|w, n| (w.key, format!("{} {} {}", w.start, w.end, n.unwrap_or(0))))
        .to("final");
    clicks
        .windowed_by(SlidingWindows::with_time_difference(Duration::from_secs(4)))
        .reduce(|a, b| format!("{a}{b}"), "sliding_joined")
        .to_stream()
        .map(|w, v| (format!("{}@{}-{}", w.key, w.start, w.end), v))
        .to("updates");
}

/// The twins: each topology's name and function (its sources and sinks are read from its
/// description, so that none goes unfed or unread).
type TopologyFn = fn(&mut StreamsBuilder);

const TWINS: &[(&str, TopologyFn)] = &[
    ("dsl-word-count", word_count),
    ("dsl-page-views", page_views),
    ("dsl-enrich-orders", enrich_orders),
    ("dsl-orders-payments", orders_payments),
    ("dsl-avro-orders", avro_orders),
    ("mixed", mixed),
    ("windowed", windowed),
    ("tables", tables),
    ("sessions", sessions),
    ("stream_joins", stream_joins),
    ("sliding", sliding),
];

/// A topology's external sources (global tables' topics included) and sinks.
fn ends(name: &str, topology: fn(&mut StreamsBuilder)) -> (Vec<String>, Vec<String>) {
    let d = Topology::build(name, topology)
        .expect("the Rust twin builds")
        .description();
    let internal = |t: &String| d.internal_topics.iter().any(|i| &i.name == t);
    let mut sources: Vec<String> = d.sources.iter().filter(|t| !internal(t)).cloned().collect();
    sources.extend(d.global_stores.iter().map(|g| g.topic.clone()));
    let sinks = d.sinks.iter().filter(|t| !internal(t)).cloned().collect();
    (sources, sinks)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn hex_opt(bytes: Option<&[u8]>) -> Value {
    bytes.map_or(Value::Null, |b| Value::String(hex(b)))
}

fn description(d: &Description) -> Value {
    json!({
        "name": d.name,
        "sources": d.sources,
        "sinks": d.sinks,
        "stores": d.stores,
        "internal_topics": d.internal_topics.iter().map(|t| json!([t.name, t.partitions])).collect::<Vec<_>>(),
        "subtopologies": d.subtopologies.iter()
            .map(|s| json!([s.name, s.sources, s.sinks, s.stores]))
            .collect::<Vec<_>>(),
        "global_stores": d.global_stores.iter().map(|g| json!([g.name, g.topic])).collect::<Vec<_>>(),
        "formats": d.formats.iter()
            .map(|f| json!([f.topic, f.key.as_ref().map(schema), f.value.as_ref().map(schema)]))
            .collect::<Vec<_>>(),
    })
}

fn schema(s: &Schema) -> Value {
    json!([s.kind.name(), s.text, s.message, s.imports])
}

/// A small seeded generator (xorshift), so that a failure names a seed to run again.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn word(&mut self) -> String {
        let len = self.below(6);
        (0..len).map(|_| (b'a' + self.below(5) as u8) as char).collect()
    }
}

/// A random order of a few customers, as Avro (what the host hands the topology).
fn avro_order(rng: &mut Rng) -> Vec<u8> {
    let order = Order {
        id: format!("o-{}", rng.below(1_000)),
        customer: rng.word(),
        amount: rng.below(100_000) as f64 / 100.0,
        quantity: rng.below(20) as i32 - 2,
        placed: 1_733_500_000_000 + rng.below(86_400_000) as i64,
        note: (rng.below(3) == 0).then(|| rng.word()),
    };
    let mut bytes = Vec::new();
    Avro(order).encode_into(&mut bytes).unwrap();
    bytes
}

/// Random steps: records into the sources (keys from a few, values of a few letters, or
/// Avro orders for the Avro twin; a tenth of the table records are tombstones), timestamps
/// moving on with some out of order and some late, and a punctuation now and then.
fn steps(rng: &mut Rng, twin: &str, sources: &[String], n: usize) -> Vec<Value> {
    let mut steps = Vec::new();
    let mut now: i64 = 1_000;
    let tables = ["names", "customers", "directory", "accounts", "statuses"];
    for _ in 0..n {
        if rng.below(12) == 0 {
            steps.push(json!({ "punctuate": true }));
            continue;
        }
        // Whole seconds, so that records fall on window bounds and grace ends exactly, and
        // a millisecond either side of them now and then.
        now += rng.below(4) as i64 * 1_000;
        let ts = match rng.below(10) {
            0 => now - 45_000 - rng.below(60) as i64 * 1_000,
            1 | 2 => now - rng.below(8) as i64 * 1_000,
            _ => now,
        };
        let ts = match rng.below(6) {
            0 => ts + 1,
            1 => ts - 1,
            _ => ts,
        }
        .max(0);
        let source = sources[rng.below(sources.len() as u64) as usize].as_str();
        let key = if source == "lines" {
            None
        } else {
            Some(format!("k{}", rng.below(5)))
        };
        let value = if tables.contains(&source) && rng.below(10) == 0 {
            None
        } else if twin == "dsl-avro-orders" {
            Some(avro_order(rng))
        } else if source == "lines" {
            let words: Vec<String> = (0..rng.below(5)).map(|_| rng.word().to_uppercase()).collect();
            Some(words.join(" ").into_bytes())
        } else {
            Some(rng.word().into_bytes())
        };
        steps.push(json!({
            "pipe": [source, key.as_deref().map(|k| hex(k.as_bytes())), value.as_deref().map(hex), ts]
        }));
    }
    steps.push(json!({ "punctuate": true }));
    steps
}

fn unhex(v: &Value) -> Option<Vec<u8>> {
    let s = v.as_str()?;
    Some(
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect(),
    )
}

/// Runs `steps` through the Rust twin: description, operators, outputs per sink, stores.
fn run_rust(name: &str, topology: fn(&mut StreamsBuilder), sinks: &[String], steps: &[Value]) -> Value {
    let compiled = Topology::build(name, topology).expect("the Rust twin builds");
    let mut driver = TestDriver::new(name, topology).expect("the Rust twin starts");
    for step in steps {
        if let Some(pipe) = step.get("pipe") {
            let (key, value) = (unhex(&pipe[1]), unhex(&pipe[2]));
            let source = pipe[0].as_str().unwrap();
            driver
                .pipe_raw(source, key.as_deref(), value.as_deref(), pipe[3].as_i64().unwrap())
                .unwrap_or_else(|e| panic!("{name}: the Rust twin failed at {step}: {e}"));
        } else {
            driver
                .punctuate()
                .unwrap_or_else(|e| panic!("{name}: the Rust twin failed to punctuate: {e}"));
        }
    }
    let mut outputs = BTreeMap::new();
    for sink in sinks {
        let out: Vec<Value> = driver
            .outputs(sink)
            .iter()
            .map(|o| json!([hex_opt(o.key.as_deref()), hex_opt(o.value.as_deref()), o.timestamp]))
            .collect();
        outputs.insert(sink.clone(), out);
    }
    let mut stores = BTreeMap::new();
    for store in &driver.description().stores {
        let entries: Vec<Value> = driver
            .store_raw(store)
            .iter()
            .map(|(k, v)| json!([hex(k), hex(v)]))
            .collect();
        stores.insert(store.clone(), entries);
    }
    let operators: Vec<Value> = compiled
        .operators()
        .iter()
        .map(|(s, lines)| json!([s, lines]))
        .collect();
    json!({
        "description": description(driver.description()),
        "operators": operators,
        "outputs": outputs,
        "stores": stores,
    })
}

/// `$SLUICE_PYTHON`, else the venv of `dev/setup-python` (`$SLUICE_PYTHON_VENV`, which
/// `dev/env.sh` sets: it has fastavro, which the Avro twin needs), else `python3`.
fn python() -> String {
    if let Ok(python) = std::env::var("SLUICE_PYTHON") {
        return python;
    }
    std::env::var("SLUICE_PYTHON_VENV")
        .map(|venv| PathBuf::from(venv).join("bin/python"))
        .ok()
        .filter(|p| p.exists())
        .map_or_else(|| "python3".to_string(), |p| p.display().to_string())
}

fn run_python(case: &Value) -> Value {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::temp_dir().join(format!("sluice-python-dsl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!("{}.json", case["twin"].as_str().unwrap()));
    std::fs::write(&file, case.to_string()).unwrap();
    let out = Command::new(python())
        .arg(root.join("guest-sdk-python/tests/dsl_twins.py"))
        .arg(&file)
        .env("PYTHONPATH", root.join("guest-sdk-python"))
        .output()
        .expect("running Python (dev/setup-python makes its venv; or set SLUICE_PYTHON)");
    assert!(
        out.status.success(),
        "the Python twin failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the Python twin writes JSON")
}

/// Where the two differ, per part (first difference of each).
fn differences(rust: &Value, python: &Value) -> Vec<String> {
    let mut found = Vec::new();
    for part in ["description", "operators"] {
        if rust[part] != python[part] {
            found.push(format!("{part}:\n  Rust   {}\n  Python {}", rust[part], python[part]));
        }
    }
    for part in ["outputs", "stores"] {
        let (r, p) = (rust[part].as_object().unwrap(), python[part].as_object().unwrap());
        for (name, ours) in r {
            let theirs = p.get(name).cloned().unwrap_or(Value::Null);
            if *ours == theirs {
                continue;
            }
            let (a, b) = (
                ours.as_array().cloned().unwrap_or_default(),
                theirs.as_array().cloned().unwrap_or_default(),
            );
            let at = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i)).unwrap_or(0);
            found.push(format!(
                "{part} {name}: {} entries in Rust, {} in Python; the first difference at #{at}: Rust {:?}, Python {:?}",
                a.len(),
                b.len(),
                a.get(at),
                b.get(at)
            ));
        }
    }
    found
}

#[test]
fn python_dsl_topologies_compile_and_run_as_their_rust_twins_record_for_record() {
    let seeds: u64 = std::env::var("SLUICE_DSL_TWIN_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mut found = Vec::new();
    let mut records = 0;
    for seed in 1..=seeds {
        for (name, topology) in TWINS {
            let (sources, sinks) = ends(name, *topology);
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ seed.wrapping_mul(0x1000_0001));
            let steps = steps(&mut rng, name, &sources, 400);
            let rust = run_rust(name, *topology, &sinks, &steps);
            records += rust["outputs"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_array().unwrap().len())
                .sum::<usize>();
            let case = json!({ "twin": name, "sinks": sinks, "steps": steps });
            let python = run_python(&case);
            for d in differences(&rust, &python) {
                found.push(format!("{name} (seed {seed}): {d}"));
            }
        }
    }
    assert!(
        records > 1_000,
        "the cases sent only {records} records: they show nothing"
    );
    assert!(
        found.is_empty(),
        "the Python DSL differs from the Rust DSL:\n{}",
        found.join("\n")
    );
}
