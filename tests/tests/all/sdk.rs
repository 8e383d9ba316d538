//! The guest SDK's state and emit API end to end: `guests/timeline` keeps events under tuple
//! keys, reads them back with a typed prefix scan, trims them with `delete_range` and emits
//! with `emit_at`, on a real worker and broker.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sluice_guest::Decode;
use sluice_tests::worker::{dump_store, guest, manifest, TempDir, WorkerProcess};
use sluice_tests::{kafka, unique_name};

#[tokio::test(flavor = "multi_thread")]
async fn tuple_keys_prefix_scans_range_deletes_and_explicit_timestamps() -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("timeline-in"), unique_name("timeline-out"));
    kafka.create_topic(&input, 1).await?;
    kafka.create_topic(&output, 1).await?;
    let dir = TempDir::new("timeline");
    let name = unique_name("timeline");
    let topology = dir.write(
        "timeline.toml",
        &manifest(
            &name,
            &guest("timeline"),
            &[("commands", &input)],
            &[("timelines", &output)],
            "",
        ),
    );
    // Event times near now: the broker's retention would soon delete records stamped 1970.
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis() as i64;
    let t = |offset: i64| (now + offset).to_string();
    let commands = [
        ("a", format!("add {} x", t(1000))),
        ("a", "add -5 before the epoch".to_string()),
        ("a", format!("add {} z", t(3000))),
        ("a", format!("add {} y", t(2000))),
        // Its name starts with "a": a byte prefix of "a" would take its events for a's.
        ("ab", format!("add {} other", t(1500))),
        ("a", "show".to_string()),
        ("a", format!("trim {}", t(2000))),
        ("a", "show".to_string()),
        ("ab", "show".to_string()),
    ];
    let records: Vec<(&str, &str)> = commands.iter().map(|(k, v)| (*k, v.as_str())).collect();
    kafka.produce_to(&input, 0, &records).await?;

    let state = dir.path().join("state");
    let mut worker = WorkerProcess::start(
        kafka.bootstrap(),
        dir.path(),
        &[
            "--topology",
            topology.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ],
    )?;
    let got = kafka.consume(&output, 4, Duration::from_secs(30)).await?;
    let got: Vec<(String, String, Option<i64>)> = got
        .iter()
        .map(|r| {
            let text = |b: &Option<Vec<u8>>| String::from_utf8_lossy(b.as_deref().unwrap_or_default()).into_owned();
            (text(&r.key), text(&r.value), r.timestamp)
        })
        .collect();
    let timeline = |events: &[(i64, &str)]| -> String {
        let shown: Vec<String> = events.iter().map(|(at, text)| format!("{at}={text}")).collect();
        shown.join(" ")
    };
    let before = timeline(&[
        (-5, "before the epoch"),
        (now + 1000, "x"),
        (now + 2000, "y"),
        (now + 3000, "z"),
    ]);
    // Each `show` is stamped (emit_at) with the time of the newest event it shows.
    assert_eq!(got[0], ("a".into(), before, Some(now + 3000)));
    // Before +2000 (excluded): -5 and +1000, and not "ab"'s +1500.
    assert_eq!((got[1].0.as_str(), got[1].1.as_str()), ("a", "trimmed 2"));
    let after = timeline(&[(now + 2000, "y"), (now + 3000, "z")]);
    assert_eq!(got[2], ("a".into(), after, Some(now + 3000)));
    assert_eq!(
        got[3],
        ("ab".into(), timeline(&[(now + 1500, "other")]), Some(now + 1500))
    );

    // What is left in the store, in the store's (byte) order: by user, then by time.
    assert!(worker.terminate(Duration::from_secs(30))?.success());
    let stored: Vec<((String, i64), String)> = dump_store(&state, &name, 0, "events")?
        .iter()
        .map(|(k, v)| Ok((<(String, i64)>::decode(k)?, String::decode(v)?)))
        .collect::<anyhow::Result<_>>()?;
    let expected = [
        ("a", now + 2000, "y"),
        ("a", now + 3000, "z"),
        ("ab", now + 1500, "other"),
    ]
    .map(|(user, at, text)| ((user.to_string(), at), text.to_string()));
    assert_eq!(stored, expected);
    Ok(())
}
