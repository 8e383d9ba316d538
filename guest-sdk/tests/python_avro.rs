//! The Python SDK's Avro codec (`sluice_guest.formats.Avro`, fastavro's pure-Python modules,
//! as in a component) against this crate's (`formats::Avro`, serde_avro_fast), both ways:
//! random values of a record with every Avro type and logical type are written here; the
//! Python SDK (`guest-sdk-python/tests/check_avro_vectors.py`) must read each to the value
//! written (its Python form: `Decimal`, `datetime`, `UUID`…) and write that value back as the
//! same bytes, which this crate must read back to the value it wrote. So a store or topic
//! one writes reads the same in the other.

use std::collections::BTreeMap;
use std::fmt;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;

use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::json;
use sluice_guest::formats::{Avro, AvroSchema};
use sluice_guest::{Decode, Encode};

/// Values written.
const CASES: usize = 400;

const EVERY: &str = r#"{"type": "record", "name": "Every", "namespace": "test", "fields": [
    {"name": "nothing", "type": "null"},
    {"name": "flag", "type": "boolean"},
    {"name": "small", "type": "int"},
    {"name": "big", "type": "long"},
    {"name": "single", "type": "float"},
    {"name": "double", "type": "double"},
    {"name": "blob", "type": "bytes"},
    {"name": "text", "type": "string"},
    {"name": "inner", "type": {"type": "record", "name": "Inner", "fields": [
        {"name": "a", "type": "int"}, {"name": "b", "type": ["null", "string"], "default": null}]}},
    {"name": "suit", "type": {"type": "enum", "name": "Suit", "symbols": ["HEARTS", "SPADES", "CLUBS"]}},
    {"name": "longs", "type": {"type": "array", "items": "long"}},
    {"name": "doubles", "type": {"type": "map", "values": "double"}},
    {"name": "maybe", "type": ["null", "string"], "default": null},
    {"name": "either", "type": ["null", "long", "string", "Inner"]},
    {"name": "four", "type": {"type": "fixed", "name": "Four", "size": 4}},
    {"name": "inners", "type": {"type": "array", "items": "Inner"}},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}},
    {"name": "price8", "type": {"type": "fixed", "name": "Price8", "size": 8, "logicalType": "decimal",
                                "precision": 18, "scale": 2}},
    {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "time_ms", "type": {"type": "int", "logicalType": "time-millis"}},
    {"name": "time_us", "type": {"type": "long", "logicalType": "time-micros"}},
    {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "local_ms", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
    {"name": "local_us", "type": {"type": "long", "logicalType": "local-timestamp-micros"}}
]}"#;

/// Avro `bytes` and `fixed` (serde's bytes, not a sequence of numbers); JSON writes them as
/// an array of numbers.
#[derive(Debug, Clone, PartialEq)]
struct Blob(Vec<u8>);

impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct BlobVisitor;
        impl<'de> Visitor<'de> for BlobVisitor {
            type Value = Blob;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Blob, E> {
                Ok(Blob(v.to_vec()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Blob, A::Error> {
                let mut out = Vec::new();
                while let Some(b) = seq.next_element()? {
                    out.push(b);
                }
                Ok(Blob(out))
            }
        }
        d.deserialize_bytes(BlobVisitor)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Inner {
    a: i32,
    b: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(clippy::upper_case_acronyms)]
enum Suit {
    HEARTS,
    SPADES,
    CLUBS,
}

/// The union `["null", "long", "string", "Inner"]` (an `Option<Either>`: serde_avro_fast
/// reads the null branch into a `Null` variant as `String("Null")` when there is a `String`
/// one), by branch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Either {
    Long(i64),
    String(String),
    #[serde(rename = "test.Inner")]
    Inner(Inner),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Every {
    nothing: (),
    flag: bool,
    small: i32,
    big: i64,
    single: f32,
    double: f64,
    blob: Blob,
    text: String,
    inner: Inner,
    suit: Suit,
    longs: Vec<i64>,
    doubles: BTreeMap<String, f64>,
    maybe: Option<String>,
    either: Option<Either>,
    four: Blob,
    inners: Vec<Inner>,
    /// Decimals as their text (serde_avro_fast reads and writes them so).
    price: String,
    price8: String,
    id: String,
    day: i32,
    time_ms: i32,
    time_us: i64,
    at_ms: i64,
    at_us: i64,
    local_ms: i64,
    local_us: i64,
}

impl AvroSchema for Every {
    const SCHEMA: &'static str = EVERY;
}

/// A small seeded generator (xorshift) with the edges of each type now and then.
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
    fn between(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % ((hi - lo) as u64 + 1)) as i64
    }
    fn edge(&mut self) -> bool {
        self.below(6) == 0
    }
    fn i32(&mut self) -> i32 {
        if self.edge() {
            [i32::MIN, i32::MAX, 0, -1][self.below(4) as usize]
        } else {
            self.next() as i32 >> self.below(31)
        }
    }
    fn i64(&mut self) -> i64 {
        if self.edge() {
            [i64::MIN, i64::MAX, 0, -1][self.below(4) as usize]
        } else {
            self.next() as i64 >> self.below(63)
        }
    }
    fn f32(&mut self) -> f32 {
        loop {
            let f = if self.edge() {
                [0.0, -0.0, f32::MIN_POSITIVE, f32::MAX, 1e-45, 0.1][self.below(6) as usize]
            } else {
                f32::from_bits(self.next() as u32)
            };
            if f.is_finite() {
                return f;
            }
        }
    }
    fn f64(&mut self) -> f64 {
        loop {
            let f = if self.edge() {
                [0.0, -0.0, f64::MIN_POSITIVE, f64::MAX, 5e-324, 0.1][self.below(6) as usize]
            } else {
                f64::from_bits(self.next())
            };
            if f.is_finite() {
                return f;
            }
        }
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    fn text(&mut self) -> String {
        const CHARS: &[char] = &['a', '\0', '\u{1}', 'é', '€', '𝄞', '"', '\\', '\u{7f}', 'ÿ'];
        (0..self.below(7))
            .map(|_| CHARS[self.below(CHARS.len() as u64) as usize])
            .collect()
    }
    fn inner(&mut self) -> Inner {
        Inner {
            a: self.i32(),
            b: (self.below(2) == 0).then(|| self.text()),
        }
    }
    /// A decimal of `precision` digits and `scale` of them after the point, as text.
    fn decimal(&mut self, precision: u32, scale: u32) -> String {
        let max = 10i64.pow(precision) - 1;
        // Now and then a power of two either side: where a two's complement needs one more byte.
        let unscaled = if self.edge() {
            let power = 1i64 << (8 * self.below(4) + 7);
            [power, -power, power - 1, -power - 1][self.below(4) as usize]
        } else {
            self.between(-max, max)
        };
        let (sign, digits) = (if unscaled < 0 { "-" } else { "" }, unscaled.unsigned_abs());
        let divisor = 10u64.pow(scale);
        format!(
            "{sign}{}.{:0width$}",
            digits / divisor,
            digits % divisor,
            width = scale as usize
        )
    }
}

/// Python's datetimes: years 1 to 9999 (what fastavro can give for a timestamp).
const MIN_MS: i64 = -62_135_596_800_000;
const MAX_MS: i64 = 253_402_300_799_999;

fn every(rng: &mut Rng) -> Every {
    let at_us = rng.between(MIN_MS * 1_000, MAX_MS * 1_000 + 999);
    Every {
        nothing: (),
        flag: rng.below(2) == 0,
        small: rng.i32(),
        big: rng.i64(),
        single: rng.f32(),
        double: rng.f64(),
        blob: Blob({
            let n = rng.below(6) as usize;
            rng.bytes(n)
        }),
        text: rng.text(),
        inner: rng.inner(),
        suit: [Suit::HEARTS, Suit::SPADES, Suit::CLUBS][rng.below(3) as usize].clone(),
        longs: (0..rng.below(4)).map(|_| rng.i64()).collect(),
        doubles: (0..rng.below(4)).map(|_| (rng.text(), rng.f64())).collect(),
        maybe: (rng.below(2) == 0).then(|| rng.text()),
        either: match rng.below(4) {
            0 => None,
            1 => Some(Either::Long(rng.i64())),
            2 => Some(Either::String(rng.text())),
            _ => Some(Either::Inner(rng.inner())),
        },
        four: Blob(rng.bytes(4)),
        inners: (0..rng.below(3)).map(|_| rng.inner()).collect(),
        price: rng.decimal(12, 3),
        price8: rng.decimal(18, 2),
        id: {
            let (hi, lo) = (rng.next(), rng.next());
            let x = (u128::from(hi) << 64) | u128::from(lo);
            let h = format!("{x:032x}");
            format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
        },
        day: rng.between(-719_162, 2_932_896) as i32,
        time_ms: rng.between(0, 86_399_999) as i32,
        time_us: rng.between(0, 86_399_999_999),
        at_ms: rng.between(MIN_MS, MAX_MS),
        at_us,
        local_ms: rng.between(MIN_MS, MAX_MS),
        local_us: rng.between(MIN_MS * 1_000, MAX_MS * 1_000 + 999),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `$SLUICE_PYTHON`, else the venv of `dev/setup-python` (it has fastavro), else `python3`.
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

#[test]
fn avro_values_of_every_type_read_and_write_the_same_in_python_and_rust() {
    let mut rng = Rng(0x5EED_AB12_C0FF_EE01);
    let values: Vec<Every> = (0..CASES).map(|_| every(&mut rng)).collect();
    let mut out = json!({ "schema": EVERY }).to_string();
    out.push('\n');
    for value in &values {
        let mut bytes = Vec::new();
        Avro(value.clone()).encode_into(&mut bytes).expect("encodes");
        // What this crate writes, it reads back.
        assert_eq!(&Avro::<Every>::decode(&bytes).unwrap().0, value);
        let line = json!({ "value": value, "bytes": hex(&bytes) });
        out.push_str(&line.to_string());
        out.push('\n');
    }
    let dir = PathBuf::from(manifest_dir()).join("../guest-sdk-python");
    let id = std::process::id();
    let (vectors, written) = (
        std::env::temp_dir().join(format!("sluice-avro-vectors-{id}.jsonl")),
        std::env::temp_dir().join(format!("sluice-avro-python-{id}.txt")),
    );
    std::fs::write(&vectors, &out).expect("writes the vectors");
    let python = python();
    let run = Command::new(&python)
        .arg(dir.join("tests/check_avro_vectors.py"))
        .arg(&vectors)
        .arg(&written)
        .env("PYTHONPATH", &dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} (dev/setup-python makes a venv with fastavro): {e}"));
    let _ = std::fs::remove_file(&vectors);
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "the Python SDK disagrees:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("{CASES} vectors agree")),
        "the Python check did not report all {CASES} vectors: {stdout}"
    );
    // What Python wrote, this crate reads as the value it wrote itself, and the bytes are the same.
    let python_bytes = std::fs::read_to_string(&written).expect("the Python side wrote its bytes");
    let _ = std::fs::remove_file(&written);
    let lines: Vec<&str> = python_bytes.lines().collect();
    assert_eq!(lines.len(), CASES);
    let rust_lines: Vec<serde_json::Value> = out.lines().skip(1).map(|l| serde_json::from_str(l).unwrap()).collect();
    for ((value, line), rust) in values.iter().zip(&lines).zip(&rust_lines) {
        let bytes = unhex(line);
        let read = Avro::<Every>::decode(&bytes)
            .unwrap_or_else(|e| panic!("Python's bytes {line} do not read here: {e} (the value: {value:?})"));
        assert_eq!(&read.0, value, "Python's bytes {line}");
        assert_eq!(
            rust["bytes"].as_str().unwrap(),
            *line,
            "Python writes other bytes for {value:?}"
        );
    }
}

/// The same random values of every type, read as a [`GenericAvro`] (no Rust type for the
/// schema) and written again: the typed value's bytes, and the fields a generic reader
/// expects where it expects them.
#[test]
fn a_generic_value_of_every_type_reads_and_writes_the_bytes_of_the_typed_one() {
    use sluice_guest::formats::{AvroValue, GenericAvro};
    let mut rng = Rng(0x0DD_BA11_5EED_0002);
    for _ in 0..CASES {
        let value = every(&mut rng);
        let mut bytes = Vec::new();
        Avro(value.clone()).encode_into(&mut bytes).expect("encodes");
        let generic = GenericAvro::<Every>::decode(&bytes).expect("reads as a generic value");
        let mut again = Vec::new();
        generic.encode_into(&mut again).expect("writes again");
        assert_eq!(again, bytes, "{generic:?}");
        assert_eq!(generic["big"].as_i64(), Some(value.big));
        assert_eq!(generic["text"].as_str(), Some(value.text.as_str()));
        assert_eq!(generic["blob"].as_bytes(), Some(value.blob.0.as_slice()));
        assert_eq!(generic["inner"]["a"].as_i64(), Some(i64::from(value.inner.a)));
        assert!(matches!(generic["suit"], AvroValue::String(_)), "an enum is its symbol");
        assert_eq!(
            generic["maybe"].as_str(),
            value.maybe.as_deref(),
            "a union is its branch's value"
        );
        assert_eq!(
            generic.as_map().unwrap().len(),
            26,
            "every field, in the schema's order"
        );
        assert_eq!(generic.as_map().unwrap()[0].0, "nothing");
    }
    // A field changed, one missing.
    let mut rng = Rng(7);
    let mut bytes = Vec::new();
    Avro(every(&mut rng)).encode_into(&mut bytes).unwrap();
    let mut generic = GenericAvro::<Every>::decode(&bytes).unwrap();
    generic.set("text", "changed");
    let mut out = Vec::new();
    generic.encode_into(&mut out).unwrap();
    assert_eq!(Avro::<Every>::decode(&out).unwrap().0.text, "changed");
    if let AvroValue::Map(fields) = &mut generic.value {
        fields.retain(|(name, _)| name != "big");
    }
    let e = generic.encode_into(&mut Vec::new()).unwrap_err();
    assert!(e.to_string().contains("big"), "{e}");
}

/// This package's directory as cargo runs the test now (the compile-time path goes stale when
/// the shared target directory holds a binary built from another checkout of the same
/// sources).
fn manifest_dir() -> String {
    std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string())
}
