//! The Python SDK's codecs against this crate's, byte for byte: random values of every codec
//! both SDKs have are encoded here and written out with their bytes; the Python SDK
//! (`guest-sdk-python/tests/check_vectors.py`, under the machine's CPython) encodes each value
//! and must write the same bytes, and decodes the bytes and must get the same value. So a
//! store or topic written by a topology in one language reads the same in the other.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Value};
use sluice_guest::codec::{Encode, Json, Ordered};

/// Values per codec.
const CASES: usize = 300;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn encoded<T: Encode + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::new();
    value.encode_into(&mut out).expect("encodes");
    out
}

/// How a value is written for the Python side (tagged, so that nothing is lost in JSON).
fn s(text: &str) -> Value {
    json!({ "s": text })
}
fn b(bytes: &[u8]) -> Value {
    json!({ "b": hex(bytes) })
}
fn i(n: impl ToString) -> Value {
    json!({ "i": n.to_string() })
}
fn t(items: Vec<Value>) -> Value {
    json!({ "t": items })
}
fn opt(v: Option<Value>) -> Value {
    match v {
        None => json!({ "none": true }),
        Some(v) => json!({ "some": v }),
    }
}

fn text() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just('\0'),
            Just('\u{1}'),
            Just('a'),
            Just('ÿ'),
            Just('"'),
            Just('\\'),
            Just('\u{7f}'),
            any::<char>()
        ],
        0..8,
    )
    .prop_map(|chars| chars.into_iter().collect())
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(prop_oneof![Just(0u8), Just(1), Just(0xFF), any::<u8>()], 0..8)
}

fn float() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>().prop_filter("finite", |f| f.is_finite()),
        Just(0.0),
        Just(-0.0),
        Just(1e16),
        Just(1e15),
        Just(0.00001),
        Just(0.0001),
        Just(1.5e-7),
        Just(123456789.125),
        (-1_000_000i64..1_000_000).prop_map(|n| n as f64 / 1000.0),
    ]
}

/// JSON values as serde_json writes them (objects with sorted keys: `serde_json::Map`).
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        float().prop_map(|f| json!(f)),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(text(), inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn vectors<S: Strategy>(
    runner: &mut TestRunner,
    codec: &str,
    strategy: S,
    describe: impl Fn(&S::Value) -> (Value, Vec<u8>),
    out: &mut String,
) {
    for _ in 0..CASES {
        let value = strategy.new_tree(runner).expect("a value").current();
        let (value, bytes) = describe(&value);
        let line = json!({ "codec": codec, "value": value, "bytes": hex(&bytes) });
        out.push_str(&line.to_string());
        out.push('\n');
    }
}

#[test]
fn the_python_sdks_codecs_write_and_read_the_same_bytes_as_these() {
    let mut runner = TestRunner::new(Config::default());
    let mut out = String::new();
    let o = &mut out;
    let r = &mut runner;
    vectors(r, "Str", text(), |v| (s(v), encoded(v)), o);
    vectors(r, "Bytes", bytes(), |v| (b(v), encoded(v)), o);
    vectors(r, "U64", any::<u64>(), |v| (i(v), encoded(v)), o);
    vectors(r, "I64", any::<i64>(), |v| (i(v), encoded(v)), o);
    vectors(
        r,
        "Json",
        json_value(),
        |v| (json!({ "json": v }), encoded(&Json(v))),
        o,
    );
    vectors(
        r,
        "Tuple(Str,I64)",
        (text(), any::<i64>()),
        |v| (t(vec![s(&v.0), i(v.1)]), encoded(v)),
        o,
    );
    vectors(
        r,
        "Tuple(U8,U16,U32,U64,U128)",
        (any::<u8>(), any::<u16>(), any::<u32>(), any::<u64>(), any::<u128>()),
        |v| (t(vec![i(v.0), i(v.1), i(v.2), i(v.3), i(v.4)]), encoded(v)),
        o,
    );
    vectors(
        r,
        "Tuple(I8,I16,I32,I64,I128)",
        (any::<i8>(), any::<i16>(), any::<i32>(), any::<i64>(), any::<i128>()),
        |v| (t(vec![i(v.0), i(v.1), i(v.2), i(v.3), i(v.4)]), encoded(v)),
        o,
    );
    vectors(
        r,
        "Tuple(Bool,Optional(Str),Bytes,Fixed(3))",
        (any::<bool>(), proptest::option::of(text()), bytes(), any::<[u8; 3]>()),
        |v| {
            let value = t(vec![
                json!({ "bool": v.0 }),
                opt(v.1.as_deref().map(s)),
                b(&v.2),
                b(&v.3),
            ]);
            (value, encoded(v))
        },
        o,
    );
    vectors(
        r,
        "Tuple(Str,Tuple(I32,Optional(U8)))",
        (text(), (any::<i32>(), proptest::option::of(any::<u8>()))),
        |v| (t(vec![s(&v.0), t(vec![i(v.1 .0), opt(v.1 .1.map(i))])]), encoded(v)),
        o,
    );
    vectors(r, "Ordered(I64)", any::<i64>(), |v| (i(v), encoded(&Ordered(*v))), o);
    vectors(r, "Ordered(Str)", text(), |v| (s(v), encoded(&Ordered(v.clone()))), o);

    let dir = PathBuf::from(manifest_dir()).join("..").join("guest-sdk-python");
    let file = std::env::temp_dir().join(format!("sluice-codec-vectors-{}.jsonl", std::process::id()));
    std::fs::write(&file, &out).expect("writes the vectors");
    let python = std::env::var("SLUICE_PYTHON").unwrap_or_else(|_| "python3".into());
    let run = Command::new(&python)
        .arg(dir.join("tests").join("check_vectors.py"))
        .arg(&file)
        .env("PYTHONPATH", &dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} (the Python SDK's check needs CPython 3.11+): {e}"));
    let _ = std::fs::remove_file(&file);
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "the Python SDK disagrees:\n{stdout}\n{stderr}");
    let lines = out.lines().count();
    assert!(
        stdout.contains(&format!("{lines} vectors agree")),
        "the Python check did not report all {lines} vectors: {stdout}"
    );
}

/// This package's directory as cargo runs the test now (the compile-time path goes stale when
/// the shared target directory holds a binary built from another checkout of the same
/// sources).
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string())
}
