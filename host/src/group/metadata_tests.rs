//! Tests of the member metadata and assignment encodings and their signatures.

use super::*;

fn tasks(topology: &str, partitions: &[u32]) -> Vec<TaskId> {
    partitions.iter().map(|&p| TaskId::new(topology, p)).collect()
}

fn member() -> MemberMetadata {
    MemberMetadata {
        version: CURRENT_VERSION,
        supported: CURRENT_VERSION,
        worker_id: [7; 16],
        capacity: 4,
        admin: "127.0.0.1:9100".into(),
        active: tasks("orders", &[0, 3, 9]),
        standby: tasks("clicks", &[1]),
        offset_sums: vec![(TaskId::new("clicks", 1), 1234), (TaskId::new("orders", 0), -1)],
        learner: tasks("orders", &[5]),
        leaving: true,
        topologies: Some(vec![
            TopologyInfo {
                name: "orders".into(),
                partitions: 12,
                digest: [9; 16],
                stateful: true,
                subs: Vec::new(),
            },
            TopologyInfo {
                name: "wc".into(),
                partitions: 0,
                digest: [3; 16],
                stateful: true,
                subs: vec![
                    SubInfo {
                        name: "split".into(),
                        partitions: 4,
                        stateful: false,
                    },
                    SubInfo {
                        name: "count".into(),
                        partitions: 8,
                        stateful: true,
                    },
                ],
            },
        ]),
        failed: vec![
            (TaskId::new("orders", 4), "task orders/4 failed: boom".into()),
            (
                TaskId::of("wc", Some("count"), 6),
                "task wc/count/6 failed: boom".into(),
            ),
        ],
        release: "0.3.0".into(),
        threads: 2,
        joined_from: None,
    }
}

#[test]
fn metadata_round_trips_in_the_current_version() {
    let m = member();
    assert_eq!(MemberMetadata::decode(&m.encode(CURRENT_VERSION)).unwrap(), m);
}

#[test]
fn a_version_4_reader_and_writer_drop_only_the_release_threads_and_roster() {
    let m = member();
    let old = MemberMetadata::decode(&m.encode(4)).unwrap();
    assert_eq!((old.version, old.release.as_str(), old.threads), (4, "", 0));
    assert_eq!((old.topologies, old.failed), (m.topologies, m.failed));
    let a = Assignment {
        version: 5,
        active: tasks("t", &[1]),
        generation: 3,
        roster: vec![
            Rostered {
                worker_id: [1; 16],
                threads: 2,
            },
            Rostered {
                worker_id: [2; 16],
                threads: 1,
            },
        ],
        ..Default::default()
    };
    assert_eq!(Assignment::decode(&a.encode(5)).unwrap(), a);
    let old = Assignment::decode(&a.encode(4)).unwrap();
    assert_eq!((old.roster, old.active), (vec![], a.active.clone()));
    // A roster that claims more members than the bytes could hold is refused, not allocated.
    let mut lying = a.encode(5);
    let at = lying.len() - 2 * 17 - 1;
    assert_eq!(lying[at], 2);
    lying[at] = 0x7f;
    assert!(Assignment::decode(&lying).is_err());
}

/// Version probing works both ways only if a reader believes signed metadata and
/// assignments of a version newer than its own: their signature covers the fields it does
/// not know, which it skips (the release before this one refused them as unsigned).
#[test]
fn signed_metadata_and_assignments_of_a_newer_version_are_read_and_a_change_to_their_new_fields_is_not() {
    let secret = ClusterSecret::new(b"the cluster secret, long enough".to_vec()).unwrap();
    let m = member();
    let binding = Binding {
        group: "sluice.cluster.c1",
        member: "worker-1",
        from_generation: 7,
    };
    let newer = |field: &[u8]| {
        let mut fields = m.encode(CURRENT_VERSION);
        assert_eq!(fields[0] as u16, CURRENT_VERSION, "a one-byte version");
        fields[0] += 1;
        fields.extend_from_slice(field);
        sign_metadata(fields, Some(&secret), &binding)
    };
    let signed = newer(b"a field of the next version");
    let (read, from) = MemberMetadata::decode_signed(&signed, Some(&secret), &binding).unwrap();
    assert_eq!((read.version, from), (CURRENT_VERSION + 1, 7));
    assert_eq!(
        MemberMetadata {
            version: CURRENT_VERSION,
            ..read
        },
        m
    );
    let mut forged = signed.clone();
    let at = m.encode(CURRENT_VERSION).len() + 3;
    forged[at] ^= 1;
    assert!(MemberMetadata::decode_signed(&forged, Some(&secret), &binding).is_err());
    // Of this version, bytes after the fields are not skipped: they are not what was signed.
    let mut padded = m.encode(CURRENT_VERSION);
    padded.push(0);
    let padded = sign_metadata(padded, Some(&secret), &binding);
    assert!(MemberMetadata::decode_signed(&padded, Some(&secret), &binding).is_err());
    // Too short to hold a signature at all.
    assert!(MemberMetadata::decode_signed(&signed[..signed.len() - 40], Some(&secret), &binding).is_err());

    let a = Assignment {
        version: CURRENT_VERSION,
        active: tasks("t", &[1]),
        generation: 9,
        ..Default::default()
    };
    let (g, member) = ("sluice.cluster.c1", "member-1");
    let mut fields = a.encode(CURRENT_VERSION);
    fields[0] += 1;
    fields.extend_from_slice(b"next");
    let tag = secret.sign(
        ASSIGNMENT_PURPOSE,
        &[&fields, member.as_bytes(), &9i32.to_be_bytes(), g.as_bytes()],
    );
    let mut signed = fields.clone();
    signed.extend_from_slice(&tag);
    let read = Assignment::decode_signed(&signed, Some(&secret), g, member, 9).unwrap();
    assert_eq!((read.version, read.active), (CURRENT_VERSION + 1, a.active));
    signed[fields.len() - 1] ^= 1;
    assert!(Assignment::decode_signed(&signed, Some(&secret), g, member, 9).is_err());
}

#[test]
fn a_version_3_reader_and_writer_drop_only_the_topologies_of_several_sub_topologies() {
    let m = member();
    let old = MemberMetadata::decode(&m.encode(3)).unwrap();
    let topologies = old.topologies.unwrap();
    assert_eq!(topologies, m.topologies.unwrap()[..1]);
    assert_eq!((old.failed, old.active), (m.failed, m.active));
}

#[test]
fn a_version_2_reader_and_writer_drop_only_the_version_3_fields() {
    let m = member();
    let old = MemberMetadata::decode(&m.encode(2)).unwrap();
    assert_eq!((old.topologies, old.failed), (None, vec![]));
    assert_eq!((old.active, old.learner, old.leaving), (m.active, m.learner, m.leaving));
}

#[test]
fn a_long_failure_is_cut_to_keep_the_metadata_compact() {
    let mut m = member();
    m.failed = vec![(TaskId::new("orders", 1), "é".repeat(400))];
    let back = MemberMetadata::decode(&m.encode(3)).unwrap();
    assert!(back.failed[0].1.len() <= MAX_FAILURE_TEXT);
    assert!(back.failed[0].1.starts_with("éé"));
}

#[test]
fn a_version_1_reader_and_writer_drop_only_the_version_2_fields() {
    let m = member();
    let old = MemberMetadata::decode(&m.encode(1)).unwrap();
    assert_eq!(old.version, 1);
    assert_eq!(
        (old.active.clone(), old.standby.clone(), old.offset_sums.clone()),
        (m.active, m.standby, m.offset_sums)
    );
    assert!(old.learner.is_empty() && !old.leaving);
    let a = Assignment {
        version: 2,
        rejoin: true,
        active: tasks("t", &[1, 2]),
        learner: tasks("t", &[3]),
        generation: 7,
        ..Default::default()
    };
    let old = Assignment::decode(&a.encode(1)).unwrap();
    assert_eq!(
        (old.active, old.rejoin, old.learner, old.generation),
        (a.active.clone(), true, vec![], -1)
    );
    assert_eq!(Assignment::decode(&a.encode(2)).unwrap(), a);
}

#[test]
fn signed_metadata_and_assignments_are_believed_only_with_the_secret() {
    let secret = ClusterSecret::new(b"the cluster secret, long enough".to_vec()).unwrap();
    let other = ClusterSecret::new(b"another cluster's secret, also".to_vec()).unwrap();
    let m = member();
    let binding = Binding {
        group: "sluice.cluster.c1",
        member: "worker-1",
        from_generation: 7,
    };
    let signed = m.encode_signed(CURRENT_VERSION, Some(&secret), &binding);
    assert_eq!(
        MemberMetadata::decode_signed(&signed, Some(&secret), &binding).unwrap(),
        (m.clone(), 7)
    );
    assert_eq!(
        MemberMetadata::decode(&signed).unwrap(),
        m,
        "a reader without the secret ignores the signature"
    );
    assert!(MemberMetadata::decode_signed(&signed, Some(&other), &binding).is_err());
    assert!(
        MemberMetadata::decode_signed(&m.encode(3), Some(&secret), &binding).is_err(),
        "unsigned"
    );
    let mut forged = signed.clone();
    forged[5] ^= 1;
    assert!(MemberMetadata::decode_signed(&forged, Some(&secret), &binding).is_err());

    let a = Assignment {
        version: 2,
        active: tasks("t", &[1]),
        generation: 9,
        ..Default::default()
    };
    let g = "sluice.cluster.c1";
    let signed = a.encode_signed(2, Some(&secret), g, "member-1");
    assert_eq!(
        Assignment::decode_signed(&signed, Some(&secret), g, "member-1", 9).unwrap(),
        a
    );
    assert!(
        Assignment::decode_signed(&signed, Some(&secret), g, "member-2", 9).is_err(),
        "another member's"
    );
    assert!(
        Assignment::decode_signed(&signed, Some(&secret), g, "member-1", 10).is_err(),
        "another round's"
    );
    assert!(
        Assignment::decode_signed(&signed, Some(&secret), "sluice.cluster.c2", "member-1", 9).is_err(),
        "another cluster's"
    );
    assert!(Assignment::decode_signed(&a.encode(2), Some(&secret), g, "member-1", 9).is_err());
    assert_eq!(
        Assignment::decode_signed(&a.encode(2), None, g, "member-1", 9).unwrap(),
        a
    );
}

/// Metadata copied from DescribeGroups (where anyone may read it) is believed only for
/// the member and group it was signed for; the generation it came from is told.
#[test]
fn signed_metadata_is_bound_to_its_member_group_and_generation() {
    let secret = ClusterSecret::new(b"the cluster secret, long enough".to_vec()).unwrap();
    let m = member();
    let binding = Binding {
        group: "sluice.cluster.c1",
        member: "worker-1-5f0c",
        from_generation: 41,
    };
    let signed = m.encode_signed(CURRENT_VERSION, Some(&secret), &binding);
    let other_member = Binding {
        member: "rogue-77aa",
        ..binding
    };
    assert!(
        MemberMetadata::decode_signed(&signed, Some(&secret), &other_member).is_err(),
        "a copy joined under another member id"
    );
    let other_group = Binding {
        group: "sluice.cluster.c2",
        ..binding
    };
    assert!(
        MemberMetadata::decode_signed(&signed, Some(&secret), &other_group).is_err(),
        "a copy joined into another cluster's group"
    );
    // The generation is signed: changing it breaks the signature.
    let mut moved = signed.clone();
    let at = signed.len() - TAG_BYTES - 1;
    moved[at] ^= 0x7f;
    assert!(MemberMetadata::decode_signed(&moved, Some(&secret), &binding).is_err());
    let (_, from) = MemberMetadata::decode_signed(&signed, Some(&secret), &binding).unwrap();
    assert!(fresh_for(from, 42) && fresh_for(from, 51));
    assert!(!fresh_for(from, 52), "ten generations later it is stale");
    assert!(
        !fresh_for(from, 41) && !fresh_for(from, 3),
        "not from this generation or the future"
    );
    assert!(fresh_for(-1, 1) && fresh_for(-1, 900), "a new member");
}

#[test]
fn garbage_is_a_decode_error_not_a_panic() {
    let bytes = member().encode(3);
    for cut in 0..bytes.len() {
        let _ = MemberMetadata::decode(&bytes[..cut]);
    }
    let err = MemberMetadata::decode(&[0x80]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "malformed group metadata at byte 1: a varint runs past the end"
    );
    assert!(
        MemberMetadata::decode(&[0]).is_err(),
        "version 0 is older than any reader"
    );
}
