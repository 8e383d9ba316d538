//! Windowed aggregations against an obviously correct model, over random out-of-order
//! input with records inside and past the grace period, punctuations at random points,
//! and restarts on the same stores.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use sluice_guest::dsl::testing::TestDriver;
use sluice_guest::dsl::{StreamsBuilder, TimeWindows, Windowed};

#[derive(Debug, Clone)]
enum Event {
    Record {
        key: u8,
        ts: i64,
        value: u64,
    },
    Punctuate,
    /// Close the driver and start a new one on its stores.
    Restart,
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    proptest::collection::vec(
        prop_oneof![
            8 => (0u8..3, 0i64..300, 1u64..10).prop_map(|(key, ts, value)| Event::Record { key, ts, value }),
            2 => Just(Event::Punctuate),
            1 => Just(Event::Restart),
        ],
        0..80,
    )
}

fn time_windows() -> impl Strategy<Value = TimeWindows> {
    (1i64..50, 0i64..40, any::<bool>(), 1i64..50).prop_map(|(size, grace, tumbling, advance)| {
        let ms = |m: i64| Duration::from_millis(m as u64);
        let w = if tumbling {
            TimeWindows::tumbling(ms(size))
        } else {
            TimeWindows::hopping(ms(size), ms(advance.min(size)))
        };
        w.grace(ms(grace))
    })
}

/// What comes out: (key, window start, window end) → (count, sum), and the timestamp.
type Out = (String, i64, i64, u64, u64, i64);

/// Runs `events` through a topology that counts and sums per key and window.
fn run(windows: TimeWindows, emit_final: bool, events: &[Event]) -> Vec<Out> {
    let topology = move |b: &mut StreamsBuilder| {
        let grouped = b.stream::<String, u64>("in").group_by_key();
        let windowed = grouped.windowed_by(windows);
        let windowed = if emit_final { windowed.emit_final() } else { windowed };
        let counts = windowed.count("counts");
        let sums = windowed.aggregate(|| 0u64, |_, v, sum| sum + v, "sums");
        counts.to_stream().to("counts");
        sums.to_stream().to("sums");
    };
    let mut driver = TestDriver::new("w", topology).unwrap();
    let mut out = Vec::new();
    let mut drain = |driver: &mut TestDriver| {
        let counts = driver.read::<Windowed<String>, Option<u64>>("counts").unwrap();
        let sums = driver.read::<Windowed<String>, Option<u64>>("sums").unwrap();
        assert_eq!(counts.len(), sums.len());
        for (c, s) in counts.into_iter().zip(sums) {
            assert_eq!((&c.key, c.timestamp), (&s.key, s.timestamp));
            out.push((
                c.key.key,
                c.key.start,
                c.key.end,
                c.value.unwrap(),
                s.value.unwrap(),
                c.timestamp,
            ));
        }
    };
    for event in events {
        match event {
            Event::Record { key, ts, value } => driver.pipe("in", format!("k{key}"), *value, *ts).unwrap(),
            Event::Punctuate => driver.punctuate().unwrap(),
            Event::Restart => {
                drain(&mut driver);
                let stores = driver.close().unwrap();
                driver = TestDriver::with_stores("w", topology, stores).unwrap();
            }
        }
        drain(&mut driver);
    }
    driver.punctuate().unwrap();
    drain(&mut driver);
    out
}

/// The model: every window that covers a record, by brute force over all window starts.
fn model(windows: TimeWindows, emit_final: bool, events: &[Event]) -> Vec<Out> {
    let (size, advance, grace) = sizes(windows);
    let mut now = i64::MIN;
    // (count, sum, time): a window's time is the latest of its records' (Kafka Streams').
    let mut windows_of: BTreeMap<(String, i64), (u64, u64, i64)> = BTreeMap::new();
    let mut out = Vec::new();
    // The stream time of the last punctuation, which closes windows; the host (and the
    // driver) punctuates a task only once it has read a record since it started.
    let (mut closed_at, mut read) = (i64::MIN, false);
    for event in events.iter().chain([&Event::Punctuate]) {
        let (key, ts, value) = match event {
            Event::Record { key, ts, value } => (key, ts, value),
            Event::Punctuate if read => {
                closed_at = now;
                continue;
            }
            Event::Punctuate => continue,
            Event::Restart => {
                read = false;
                continue;
            }
        };
        read = true;
        now = now.max(*ts);
        let mut start = 0;
        while start <= *ts {
            let end = start + size;
            if start <= *ts && *ts < end && end > now - grace {
                let w = windows_of.entry((format!("k{key}"), start)).or_insert((0, 0, i64::MIN));
                w.0 += 1;
                w.1 += value;
                w.2 = w.2.max(*ts);
                if !emit_final {
                    out.push((format!("k{key}"), start, end, w.0, w.1, w.2));
                }
            }
            start += advance;
        }
    }
    // Punctuations change when a window is emitted, not what: it is closed for good.
    if emit_final {
        let mut last = vec![];
        for ((key, start), (count, sum, latest)) in windows_of {
            if start + size + grace <= closed_at {
                last.push((key, start, start + size, count, sum, latest));
            }
        }
        out = last;
    }
    out
}

fn sizes(w: TimeWindows) -> (i64, i64, i64) {
    // The window's numbers, read back through its Debug form (they are not public).
    let text = format!("{w:?}");
    let field = |name: &str| -> i64 {
        let at = text.find(&format!("{name}: ")).unwrap() + name.len() + 2;
        text[at..]
            .split(|c: char| !c.is_ascii_digit() && c != '-')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    (field("size"), field("advance"), field("grace"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn time_windows_emitting_every_update(windows in time_windows(), events in events()) {
        prop_assert_eq!(run(windows, false, &events), model(windows, false, &events));
    }

    #[test]
    fn time_windows_emitting_once_when_closed_also_across_restarts(windows in time_windows(), events in events()) {
        let mut got = run(windows, true, &events);
        got.sort();
        prop_assert_eq!(got, model(windows, true, &events));
    }
}

#[test]
fn emit_final_after_a_restart_neither_repeats_a_closed_window_nor_emits_an_open_one() {
    let windows = TimeWindows::tumbling(Duration::from_millis(10)).grace(Duration::from_millis(5));
    let topology = move |b: &mut StreamsBuilder| {
        b.stream::<String, u64>("in")
            .group_by_key()
            .windowed_by(windows)
            .emit_final()
            .count("counts")
            .to_stream()
            .to("out");
    };
    let mut driver = TestDriver::new("w", topology).unwrap();
    driver.pipe("in", "a".to_string(), 1u64, 3).unwrap();
    driver.pipe("in", "a".to_string(), 1u64, 16).unwrap(); // [0, 10) closes at 15
    driver.punctuate().unwrap();
    let first = driver.read::<Windowed<String>, Option<u64>>("out").unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(
        (first[0].key.start, first[0].value, first[0].timestamp),
        (0, Some(1), 3)
    );
    let stores = driver.close().unwrap();

    // The new driver's stream time starts from the first record it reads (an old one here),
    // but the operator's own stream time (16) was saved: [0, 10) is not emitted again, a
    // record for it is late, and [10, 20) stays open until 25.
    let mut driver = TestDriver::with_stores("w", topology, stores).unwrap();
    driver.pipe("in", "a".to_string(), 1u64, 2).unwrap();
    driver.pipe("in", "a".to_string(), 1u64, 12).unwrap();
    driver.punctuate().unwrap();
    assert!(driver.read::<Windowed<String>, Option<u64>>("out").unwrap().is_empty());
    driver.pipe("in", "b".to_string(), 1u64, 25).unwrap();
    driver.punctuate().unwrap();
    let second = driver.read::<Windowed<String>, Option<u64>>("out").unwrap();
    assert_eq!(second.len(), 1);
    assert_eq!(
        (second[0].key.key.as_str(), second[0].key.start, second[0].value),
        ("a", 10, Some(2))
    );
}
