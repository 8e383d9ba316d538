//! The formats of a topology, without a registry: declared schemas, subjects, what a sink
//! writes, and a reading's answers when there is no registry at all.

use sluice_wire::{Description, Schema};

use super::*;

const ORDER: &str = r#"{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},{"name":"amount","type":"long"}]}"#;

fn description() -> Description {
    Description::new("t")
        .source("orders")
        .sink("totals")
        .value_format("orders", Schema::avro(ORDER))
        .key_format("totals", Schema::avro(r#""string""#))
        .value_format("totals", Schema::avro(ORDER))
}

#[test]
fn subjects_follow_the_strategy() {
    let d = Declared::parse(&Schema::avro(ORDER)).unwrap();
    assert_eq!(SubjectStrategy::Topic.subject("t1", false, &d).unwrap(), "t1-value");
    assert_eq!(SubjectStrategy::Topic.subject("t1", true, &d).unwrap(), "t1-key");
    assert_eq!(SubjectStrategy::Record.subject("t1", false, &d).unwrap(), "shop.Order");
    assert_eq!(
        SubjectStrategy::TopicRecord.subject("t1", false, &d).unwrap(),
        "t1-shop.Order"
    );
    let plain = Declared::parse(&Schema::avro(r#""string""#)).unwrap();
    let e = SubjectStrategy::Record.subject("t1", true, &plain).unwrap_err();
    assert!(e.contains("key schema of topic t1"), "{e}");
    assert!(SubjectStrategy::parse("topic-name")
        .unwrap_err()
        .contains("topic-record"));
}

#[test]
fn a_topologys_formats_are_bound_to_its_sinks_subjects() {
    let f = TopologyFormats::new(
        &description(),
        &["totals-topic".into()],
        &FormatSettings::default(),
        1 << 20,
    )
    .unwrap();
    assert!(f.any());
    assert!(f.sources[0].key.is_none() && f.sources[0].value.is_some());
    let subjects: Vec<&str> = f.writings().map(|w| w.subject.as_str()).collect();
    assert_eq!(subjects, ["totals-topic-key", "totals-topic-value"]);
}

#[test]
fn declared_schemas_that_cannot_be_used_are_named() {
    let bad = Description::new("t")
        .source("orders")
        .value_format("orders", Schema::avro("{\"type\":\"recrd\"}"));
    let e = TopologyFormats::new(&bad, &[], &FormatSettings::default(), 1 << 20).unwrap_err();
    assert!(
        e.starts_with("the value schema it declares for \"orders\": not an Avro schema"),
        "{e}"
    );
    let unknown = Description::new("t")
        .source("orders")
        .value_format("nowhere", Schema::avro(ORDER));
    let e = TopologyFormats::new(&unknown, &[], &FormatSettings::default(), 1 << 20).unwrap_err();
    assert!(e.contains("\"nowhere\""), "{e}");
    let proto = Description::new("t")
        .source("orders")
        .value_format("orders", Schema::protobuf("syntax = \"proto3\"; message A {}", "B"));
    let e = TopologyFormats::new(&proto, &[], &FormatSettings::default(), 1 << 20).unwrap_err();
    assert!(e.contains("no message \"B\""), "{e}");
    let huge = Description::new("t")
        .source("orders")
        .value_format("orders", Schema::json_schema(" ".repeat(5 << 20)));
    let e = TopologyFormats::new(&huge, &[], &FormatSettings::default(), 1 << 20).unwrap_err();
    assert!(e.contains("more than"), "{e}");
}

#[test]
fn a_sink_checks_what_the_guest_emits_and_frames_it() {
    let d = Arc::new(Declared::parse(&Schema::avro(ORDER)).unwrap());
    let w = Writing::new(d, "o-value".into(), true, 1 << 20);
    let mut out = Vec::new();
    assert!(w.write(&[2, b'a', 4], &mut out).unwrap_err().contains("not known yet"));
    w.id.set(9).unwrap();
    w.write(&[2, b'a', 4], &mut out).unwrap();
    assert_eq!(out, [0, 0, 0, 0, 9, 2, b'a', 4]);
    // A guest that emits something else is told what.
    let e = w.write(&[2, b'a'], &mut out).unwrap_err();
    assert!(e.contains("field amount"), "{e}");
}

#[test]
fn a_protobuf_sink_frames_its_message_indexes() {
    let proto = "syntax = \"proto3\"; package p; message A { string x = 1; } message B { int64 y = 1; }";
    let d = Arc::new(Declared::parse(&Schema::protobuf(proto, "p.B")).unwrap());
    let w = Writing::new(d, "s".into(), true, 1 << 20);
    w.id.set(3).unwrap();
    let mut out = Vec::new();
    w.write(&[0x08, 0x05], &mut out).unwrap();
    assert_eq!(out, [0, 0, 0, 0, 3, 2, 2, 0x08, 0x05]);
}

#[tokio::test]
async fn without_a_registry_a_framed_record_is_refused_saying_so() {
    let schemas = Schemas::new(None, tokio::runtime::Handle::current(), 1 << 20);
    let f = TopologyFormats::new(&description(), &["t".into()], &FormatSettings::default(), 1 << 20).unwrap();
    let reading = f.sources[0].value.as_ref().unwrap();
    let mut scratch = Vec::new();
    match reading.read(&schemas, &[0, 0, 0, 0, 1, 2, b'a', 4], &mut scratch) {
        Err(ReadError::Bad {
            id: Some(1), reason, ..
        }) => assert!(reason.contains("registry.url"), "{reason}"),
        other => panic!("{other:?}"),
    }
    match reading.read(&schemas, b"{\"id\":1}", &mut scratch) {
        Err(ReadError::Bad { id: None, reason, .. }) => assert!(reason.contains("magic byte"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn schemas_nested_too_deep_or_too_big_are_refused_before_a_parser_sees_them() {
    let deep = format!("{}\"int\"{}", "[".repeat(10_000), "]".repeat(10_000));
    let e = Parsed::parse(SchemaKind::Avro, &deep, &[]).unwrap_err();
    assert!(e.contains("nested 10000 levels"), "{e}");
    let e = Parsed::parse(SchemaKind::JsonSchema, &"{\"a\":".repeat(500), &[]).unwrap_err();
    assert!(e.contains("nested"), "{e}");
    let proto = format!("syntax = \"proto3\"; {} {}", "message M {".repeat(300), "}".repeat(300));
    assert!(Parsed::parse(SchemaKind::Protobuf, &proto, &[])
        .unwrap_err()
        .contains("nested"));
    // Brackets inside strings do not count.
    let doc = format!(
        r#"{{"type":"record","name":"R","doc":"{}","fields":[]}}"#,
        "[".repeat(500)
    );
    assert!(Parsed::parse(SchemaKind::Avro, &doc, &[]).is_ok());
    let big = format!(
        r#"{{"type":"record","name":"R","doc":"{}","fields":[]}}"#,
        "x".repeat(5 << 20)
    );
    assert!(Parsed::parse(SchemaKind::Avro, &big, &[])
        .unwrap_err()
        .contains("more than"));
}

#[test]
fn a_global_table_of_a_formatted_topic_is_refused_naming_what_to_do() {
    let d = Description::new("t")
        .source("orders")
        .global_store("customers", "customers_topic")
        .value_format("customers_topic", Schema::avro(ORDER));
    let e = TopologyFormats::new(&d, &[], &FormatSettings::default(), 1 << 20).unwrap_err();
    assert!(e.contains("global table \"customers\"") && e.contains("KTable"), "{e}");
}
