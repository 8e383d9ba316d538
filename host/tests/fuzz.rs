//! Fuzzing of everything that decodes bytes it did not write: the record wire format
//! (guest output is hostile), member metadata and assignments (any group member can send
//! them) and manifests (a tenant writes them).
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
