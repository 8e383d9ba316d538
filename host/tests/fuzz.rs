//! Fuzzing of everything that decodes bytes it did not write: the record wire format
//! (guest output is hostile), member metadata and assignments (any group member can send
//! them), manifests (a tenant writes them), and records and schemas of a Schema Registry
//! (a tenant writes records, whoever may register one writes schemas).
//!
//! Each property runs `SLUICE_FUZZ_CASES` cases (default 20,000: about a second, as CI runs
//! it); `dev/fuzz` runs a longer budget and prints the figures. A decoder must return an
//! error or a value — never panic, never allocate by a size it was told instead of the
//! bytes it has — and whatever it accepts must encode back to the same meaning.

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use sluice::group::metadata::{Assignment, MemberMetadata};
use sluice::manifest::Manifest;
use sluice_wire::wire::{self, Header, Writer};

fn runner() -> TestRunner {
    let cases = std::env::var("SLUICE_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

/// Bytes that are mostly valid encodings with damage: truncated, bit-flipped, with a
/// count or length overwritten, or extended — the inputs that reach deep into a decoder.
fn damaged(valid: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let pick = proptest::sample::select(valid);
    (pick, any::<u32>(), any::<usize>(), any::<u8>(), 0u8..5).prop_map(|(mut buf, word, at, byte, how)| {
        if buf.is_empty() {
            return buf;
        }
        let at = at % buf.len();
        match how {
            0 => buf.truncate(at),
            1 => buf[at] ^= byte | 1,
            2 => {
                let end = (at + 4).min(buf.len());
                let len = end - at;
                buf[at..end].copy_from_slice(&word.to_le_bytes()[..len]);
            }
            3 => buf.extend_from_slice(&word.to_le_bytes()),
            _ => buf[at] = byte,
        }
        buf
    })
}

fn bytes_or_arbitrary(valid: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..256),
        damaged(valid),
        // A huge count in front of a few bytes: the shape of the 288 GiB reservation.
        (any::<u32>(), proptest::collection::vec(any::<u8>(), 0..64)).prop_map(|(n, rest)| {
            let mut b = n.to_le_bytes().to_vec();
            b.extend(rest);
            b
        }),
    ]
}

fn sample_records() -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut w = Writer::new();
    let headers = [
        Header {
            name: b"trace",
            value: Some(b"abc"),
        },
        Header { name: b"", value: None },
    ];
    w.push_input(Some(b"key"), Some(b"value"), 7, 1, 2, 99, headers.iter().copied());
    w.push_input(None, None, -1, 0, 0, 0, std::iter::empty());
    out.push(w.take());
    w.push_emitted(
        0,
        Some(b"k"),
        Some(b"v"),
        wire::INHERIT_TIMESTAMP,
        headers.iter().copied(),
    );
    w.push_emitted(3, None, Some(b""), 12, std::iter::empty());
    out.push(w.take());
    out
}

#[test]
fn the_record_wire_format_survives_any_bytes() {
    runner()
        .run(&bytes_or_arbitrary(sample_records()), |buf| {
            // The claimed count is believed only as far as the bytes present can hold it.
            if let Ok(r) = wire::emitted(&buf) {
                prop_assert!(r.remaining() as usize * wire::MIN_EMITTED_BYTES <= buf.len());
            }
            if let Ok(r) = wire::inputs(&buf) {
                prop_assert!(r.remaining() as usize * wire::MIN_INPUT_BYTES <= buf.len());
            }
            // Every record and header decodes or errs, without a panic.
            let mut headers = 0;
            if let Ok(records) = wire::inputs(&buf) {
                for input in records.flatten() {
                    headers += input.headers.iter().count();
                }
            }
            if let Ok(records) = wire::emitted(&buf) {
                for emitted in records.flatten() {
                    headers += emitted.headers.iter().count();
                }
            }
            prop_assert!(headers <= buf.len());
            // Whatever decodes completely encodes back to the same bytes.
            if let Ok(records) = wire::emitted(&buf).and_then(|r| r.collect::<Result<Vec<_>, _>>()) {
                let mut w = Writer::new();
                for e in &records {
                    w.push_emitted(
                        e.sink,
                        e.key,
                        e.value,
                        e.timestamp,
                        e.headers.iter().collect::<Vec<_>>().into_iter(),
                    );
                }
                prop_assert_eq!(w.as_bytes(), &buf[..]);
            }
            Ok(())
        })
        .unwrap();
}

fn sample_group_messages() -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    use sluice::group::metadata::{SubInfo, TopologyInfo};
    use sluice::group::TaskId;
    let mut member = MemberMetadata {
        worker_id: [7; 16],
        capacity: 4,
        admin: "127.0.0.1:8080".into(),
        ..MemberMetadata::default()
    };
    member.active = vec![
        TaskId::new("a", 0),
        TaskId::new("a", 3),
        TaskId::new("b-c", 1),
        TaskId::of("wc", Some("count"), 5),
    ];
    member.standby = vec![TaskId::new("b-c", 0)];
    member.offset_sums = vec![(TaskId::new("b-c", 0), 1234)];
    member.learner = vec![TaskId::new("a", 1)];
    member.topologies = Some(vec![
        TopologyInfo {
            name: "a".into(),
            partitions: 4,
            digest: [9; 16],
            stateful: true,
            subs: Vec::new(),
        },
        TopologyInfo {
            name: "wc".into(),
            partitions: 0,
            digest: [3; 16],
            stateful: true,
            subs: vec![SubInfo {
                name: "count".into(),
                partitions: 8,
                stateful: true,
            }],
        },
    ]);
    member.failed = vec![(TaskId::new("a", 2), "the guest trapped".into())];
    let members: Vec<Vec<u8>> = (1..=4).map(|v| member.encode(v)).collect();
    let assignment = Assignment {
        active: member.active.clone(),
        standby: member.standby.clone(),
        revoked: vec![TaskId::new("a", 9)],
        learner: member.learner.clone(),
        generation: 12,
        rejoin: true,
        ..Assignment::default()
    };
    let assignments: Vec<Vec<u8>> = (1..=2).map(|v| assignment.encode(v)).collect();
    (members, assignments)
}

#[test]
fn member_metadata_and_assignments_survive_any_bytes() {
    let (members, assignments) = sample_group_messages();
    runner()
        .run(&bytes_or_arbitrary(members), |buf| {
            if let Ok(m) = MemberMetadata::decode(&buf) {
                // What decodes re-encodes (at its version) to something that decodes, and
                // from then on nothing changes (error texts are cut to a bound on encoding).
                let once = MemberMetadata::decode(&m.encode(m.version)).expect("a re-encoded member");
                let twice = MemberMetadata::decode(&once.encode(once.version)).expect("a re-encoded member");
                prop_assert_eq!(&once, &twice);
                let sorted = |mut v: Vec<sluice::group::TaskId>| {
                    v.sort();
                    v
                };
                prop_assert_eq!(sorted(once.active.clone()), sorted(m.active.clone()));
            }
            Ok(())
        })
        .unwrap();
    runner()
        .run(&bytes_or_arbitrary(assignments), |buf| {
            if let Ok(a) = Assignment::decode(&buf) {
                let once = Assignment::decode(&a.encode(a.version)).expect("a re-encoded assignment");
                let twice = Assignment::decode(&once.encode(once.version)).expect("a re-encoded assignment");
                prop_assert_eq!(&once, &twice);
            }
            Ok(())
        })
        .unwrap();
}

const SAMPLE_MANIFEST: &str = r#"name = "shout"
component = "uppercase.wasm"
on-error = "dead-letter"

[sources]
input = "greetings"

[sinks]
output = "greetings-shouted"

[limits]
memory = "32MiB"
call-timeout = "2s"
"#;

#[test]
fn the_manifest_parser_survives_any_text() {
    let lines: Vec<&str> = SAMPLE_MANIFEST.lines().collect();
    let line_edits = (
        proptest::collection::vec(proptest::sample::select(lines.clone()), 0..12),
        "\\PC{0,40}",
        any::<usize>(),
    )
        .prop_map(|(mut picked, junk, at)| {
            let at = at % (picked.len() + 1);
            picked.insert(at, Box::leak(junk.into_boxed_str()));
            picked.join("\n")
        });
    let text = prop_oneof!["\\PC{0,200}", line_edits];
    runner()
        .run(&text, |text| {
            // Only errors and manifests; an error names the file.
            if let Err(e) = Manifest::parse(&text, "fuzz.toml", Path::new("/deploy")) {
                prop_assert!(e.to_string().contains("fuzz.toml"), "{}", e);
            }
            Ok(())
        })
        .unwrap();
}

// --- Records and schemas of a Schema Registry ---------------------------------------------

/// A record of every Avro type, and a reader of it evolved every way Avro resolves whatever
/// the writer wrote (not bytes to string: bytes that are not UTF-8 fail that one).
const AVRO_WRITER: &str = r#"{"type":"record","name":"Every","namespace":"t","fields":[
    {"name":"n","type":"null"}, {"name":"b","type":"boolean"}, {"name":"i","type":"int"},
    {"name":"l","type":"long"}, {"name":"f","type":"float"}, {"name":"d","type":"double"},
    {"name":"by","type":"bytes"}, {"name":"s","type":"string"},
    {"name":"fx","type":{"type":"fixed","name":"Four","size":4}},
    {"name":"e","type":{"type":"enum","name":"Suit","symbols":["CLUBS","DIAMONDS","HEARTS","SPADES"]}},
    {"name":"a","type":{"type":"array","items":"long"}},
    {"name":"m","type":{"type":"map","values":"string"}},
    {"name":"u","type":["null","string","long"]},
    {"name":"r","type":{"type":"record","name":"Inner","fields":[{"name":"x","type":"int"},
        {"name":"next","type":["null","Inner"],"default":null}]}},
    {"name":"dec","type":{"type":"bytes","logicalType":"decimal","precision":6,"scale":2}}]}"#;
const AVRO_READER: &str = r#"{"type":"record","name":"Every","namespace":"t","fields":[
    {"name":"s","type":"bytes"}, {"name":"i","type":"double"}, {"name":"l","type":"float"},
    {"name":"by","type":"bytes"}, {"name":"added","type":{"type":"array","items":"int"},"default":[1,2]},
    {"name":"e","type":{"type":"enum","name":"Suit","symbols":["SPADES","HEARTS","DIAMONDS","CLUBS"]}},
    {"name":"a","type":{"type":"array","items":"double"}},
    {"name":"u","type":["string","null","double"]},
    {"name":"r","type":{"type":"record","name":"Inner","fields":[{"name":"y","type":"int","default":7},
        {"name":"x","type":"long"},{"name":"next","type":["null","Inner"],"default":null}]}},
    {"name":"dec","type":{"type":"bytes","logicalType":"decimal","precision":6,"scale":2}}]}"#;
const PROTO: &str = r#"syntax = "proto3";
package fuzz;
message Order {
  string id = 1;
  int32 quantity = 2;
  double price = 3;
  repeated string tags = 4;
  message Line { string sku = 1; sint64 count = 2; fixed32 f = 3; }
  repeated Line lines = 5;
  enum Status { NEW = 0; PAID = 1; }
  Status status = 6;
  map<string, int64> counters = 7;
  bytes blob = 8;
  oneof pick { bool gift = 9; float weight = 10; }
}"#;
const JSON_SCHEMA: &str = r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object",
    "properties":{"id":{"type":"string"},"amount":{"type":"number"},"tags":{"type":"array","items":{"type":"string"}}},
    "required":["id"],"additionalProperties":false}"#;

/// A value of [`AVRO_WRITER`] with `n` shaping its sizes (as `sluice produce` takes it).
fn avro_value(n: usize) -> serde_json::Value {
    let inner = if n.is_multiple_of(2) {
        serde_json::json!({"x": n, "next": {"x": 1, "next": null}})
    } else {
        serde_json::json!({"x": -(n as i64), "next": null})
    };
    let suit = ["CLUBS", "DIAMONDS", "HEARTS", "SPADES"][n % 4];
    let union = [serde_json::Value::Null, serde_json::json!("text"), serde_json::json!(n)][n % 3].clone();
    serde_json::json!({
        "n": null, "b": n % 2 == 1, "i": n as i64 * 1001 - 5000, "l": (n as i64) << 40, "f": n as f64 * 0.5,
        "d": -(n as f64) * 1.25, "by": "\u{0}\u{ff}".repeat(n % 4), "s": "é".repeat(n % 5), "fx": "abcd",
        "e": suit, "a": (0..n % 6).map(|i| i as i64 - 2).collect::<Vec<_>>(),
        "m": (0..n % 3).map(|i| (format!("k{i}"), serde_json::json!(format!("v{i}")))).collect::<serde_json::Map<_, _>>(),
        "u": union,
        "r": inner, "dec": format!("{}.{:02}", n * 7, n % 100),
    })
}

#[test]
fn records_and_schemas_of_a_schema_registry_survive_any_bytes() {
    use sluice::formats::avro::{AvroSchema, Limits, Plan};
    use sluice::formats::{framing, json_io, protobuf, Declared, Parsed, WriterSchema};
    use sluice_wire::{Schema, SchemaKind};

    let writer = AvroSchema::parse(AVRO_WRITER).unwrap();
    let reader = AvroSchema::parse(AVRO_READER).unwrap();
    let resolve = Plan::compile(&writer, &reader).unwrap();
    let (check_writer, check_reader) = (Plan::check(&writer), Plan::check(&reader));
    let limits = Limits::default();
    let declared = Declared::parse(&Schema::avro(AVRO_WRITER)).unwrap();
    let proto = Declared::parse(&Schema::protobuf(PROTO, "fuzz.Order")).unwrap();
    let message = proto.message.clone().unwrap();
    let json = Declared::parse(&Schema::json_schema(JSON_SCHEMA)).unwrap();
    let Parsed::Json(json_schema) = &json.parsed else {
        unreachable!()
    };
    let as_writer = |kind: SchemaKind, text: &str| WriterSchema {
        id: 1,
        kind,
        text: text.to_string(),
        imports: vec![],
        parsed: Parsed::parse(kind, text, &[]).unwrap(),
    };
    let writers = [
        as_writer(SchemaKind::Avro, AVRO_WRITER),
        as_writer(SchemaKind::Protobuf, PROTO),
        as_writer(SchemaKind::JsonSchema, JSON_SCHEMA),
    ];

    // Valid records of each kind (payloads, framed ones, protobuf with message indexes).
    let mut valid: Vec<Vec<u8>> = (0..40)
        .map(|n| json_io::from_json(&declared, &avro_value(n)).unwrap())
        .collect();
    for n in 0..20 {
        let order = serde_json::json!({"id": format!("o{n}"), "quantity": n, "price": n as f64 / 3.0,
            "tags": ["a", "b"], "lines": [{"sku": "s", "count": -(n as i64), "f": 7}], "status": "PAID",
            "counters": {"x": n}, "blob": "AAE=", "weight": 1.5});
        valid.push(json_io::from_json(&proto, &order).unwrap());
        valid.push(format!(r#"{{"id":"j{n}","amount":{n}.5,"tags":["t"]}}"#).into_bytes());
    }
    let framed: Vec<Vec<u8>> = valid
        .iter()
        .map(|p| {
            let mut out = Vec::new();
            framing::write_header(7, &mut out);
            framing::write_message_indexes(&[0], &mut out);
            out.extend_from_slice(p);
            out
        })
        .collect();
    valid.extend(framed);
    runner()
        .run(&bytes_or_arbitrary(valid), |bytes| {
            let mut out = Vec::new();
            if let Ok(framed) = framing::split(&bytes) {
                let _ = framing::message_indexes(framed.rest);
            }
            let _ = framing::message_indexes(&bytes);
            // What the writer's schema accepts resolves, and the resolution is the reader's.
            let fits = check_writer.check_bytes(&bytes, &limits).is_ok();
            match resolve.run(&bytes, &mut out, &limits) {
                Ok(resolved) => {
                    let resolved = resolved.to_vec();
                    prop_assert!(fits, "resolved what the writer's schema refuses: {:02x?}", bytes);
                    prop_assert!(
                        check_reader.check_bytes(&resolved, &limits).is_ok(),
                        "the resolution of {:02x?} is not the reader's",
                        bytes
                    );
                }
                Err(e) => prop_assert!(
                    !fits,
                    "the writer's schema takes {:02x?}, its resolution fails: {}",
                    bytes,
                    e
                ),
            }
            let _ = protobuf::check(&message, &bytes);
            let _ = json_schema.check(&bytes, true);
            // What `sluice consume` prints: any bytes, under any writer's schema.
            for w in &writers {
                let _ = json_io::to_json(w, &bytes);
            }
            Ok(())
        })
        .unwrap();

    // Schemas are what anyone who may register one wrote: their texts damaged every way.
    let texts: Vec<Vec<u8>> = [AVRO_WRITER, AVRO_READER, PROTO, JSON_SCHEMA]
        .iter()
        .map(|t| t.as_bytes().to_vec())
        .collect();
    let mut schemas = runner();
    schemas
        .run(&(bytes_or_arbitrary(texts), 0usize..3), |(bytes, kind)| {
            let text = String::from_utf8_lossy(&bytes);
            let kind = [SchemaKind::Avro, SchemaKind::Protobuf, SchemaKind::JsonSchema][kind];
            if let Ok(Parsed::Avro(s)) = Parsed::parse(kind, &text, &[]) {
                // A schema that parses compiles against itself and against the reader.
                let _ = Plan::check(&s);
                let _ = Plan::compile(&s, &reader);
                let _ = Plan::compile(&writer, &s);
            }
            Ok(())
        })
        .unwrap();
}
