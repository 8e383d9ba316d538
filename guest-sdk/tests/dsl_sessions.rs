//! Session windows against a model: sessions grow, merge when a record bridges them,
//! drop late records, and close once their gap and grace have passed; emitting every
//! update or once when closed, across restarts.

use std::time::Duration;

use proptest::prelude::*;
use sluice_guest::dsl::testing::TestDriver;
use sluice_guest::dsl::{SessionWindows, StreamsBuilder, Windowed};

#[derive(Debug, Clone)]
enum Event {
    Record { key: u8, ts: i64, value: u64 },
    Punctuate,
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

/// (key, start, end, count, sum, timestamp); count and sum none for a deleted session.
type Out = (String, i64, i64, Option<u64>, Option<u64>, i64);

fn run(gap: i64, grace: i64, emit_final: bool, events: &[Event]) -> Vec<Out> {
    let ms = |m: i64| Duration::from_millis(m as u64);
    let windows = SessionWindows::with_inactivity_gap(ms(gap)).grace(ms(grace));
    let topology = move |b: &mut StreamsBuilder| {
        let windowed = b.stream::<String, u64>("in").group_by_key().windowed_by(windows);
        let windowed = if emit_final { windowed.emit_final() } else { windowed };
        windowed.count("counts").to_stream().to("counts");
        windowed
            .aggregate(|| 0u64, |_, v, sum| sum + v, |_, a, b| a + b, "sums")
            .to_stream()
            .to("sums");
    };
    let mut driver = TestDriver::new("s", topology).unwrap();
    let mut out = Vec::new();
    let drain = |driver: &mut TestDriver, out: &mut Vec<Out>| {
        let counts = driver.read::<Windowed<String>, Option<u64>>("counts").unwrap();
        let sums = driver.read::<Windowed<String>, Option<u64>>("sums").unwrap();
        assert_eq!(counts.len(), sums.len());
        for (c, s) in counts.into_iter().zip(sums) {
            assert_eq!(c.key, s.key);
            out.push((c.key.key, c.key.start, c.key.end, c.value, s.value, c.timestamp));
        }
    };
    for event in events {
        match event {
            Event::Record { key, ts, value } => driver.pipe("in", format!("k{key}"), *value, *ts).unwrap(),
            Event::Punctuate => driver.punctuate().unwrap(),
            Event::Restart => {
                drain(&mut driver, &mut out);
                let stores = driver.close().unwrap();
                driver = TestDriver::with_stores("s", topology, stores).unwrap();
            }
        }
    }
    driver.punctuate().unwrap();
    drain(&mut driver, &mut out);
    out
}

#[derive(Debug, Clone, Copy)]
struct Session {
    key: u8,
    first: i64,
    last: i64,
    count: u64,
    sum: u64,
}

fn model(gap: i64, grace: i64, emit_final: bool, events: &[Event]) -> Vec<Out> {
    let (mut now, mut read) = (i64::MIN, false);
    let mut sessions: Vec<Session> = Vec::new();
    let mut out = Vec::new();
    let k = |key: u8| format!("k{key}");
    for event in events.iter().chain([&Event::Punctuate]) {
        match event {
            Event::Record { key, ts, value } => {
                read = true;
                now = now.max(*ts);
                // Sessions within the gap, and still kept (Kafka Streams' default retention:
                // gap + grace of stream time; a closed one waiting to go out is not).
                let joins = |s: &Session| {
                    s.key == *key && s.first - gap <= *ts && *ts <= s.last + gap && s.last + gap + grace > now
                };
                let mut merged: Vec<Session> = sessions.iter().filter(|s| joins(s)).copied().collect();
                merged.sort_by_key(|s| s.last);
                let first = merged.iter().map(|s| s.first).fold(*ts, i64::min);
                let last = merged.iter().map(|s| s.last).fold(*ts, i64::max);
                if last + gap + grace < now {
                    continue;
                }
                sessions.retain(|s| !joins(s));
                let in_place = first == *ts && last == *ts;
                let mut new = Session {
                    key: *key,
                    first,
                    last,
                    count: 1,
                    sum: *value,
                };
                for s in &merged {
                    if !emit_final && !in_place {
                        out.push((k(*key), s.first, s.last + 1, None, None, s.last));
                    }
                    new.count += s.count;
                    new.sum += s.sum;
                }
                if !emit_final {
                    out.push((k(*key), first, last + 1, Some(new.count), Some(new.sum), last));
                }
                // The store is keyed by session: a closed session of the same key and times,
                // no longer kept (so not merged) but not yet sent, is overwritten, as Kafka
                // Streams' session store overwrites it (its fetch skips the expired session,
                // its put replaces it).
                sessions.retain(|s| (s.key, s.first, s.last) != (*key, first, last));
                sessions.push(new);
            }
            Event::Punctuate if read => {
                let mut closed: Vec<Session> = sessions
                    .iter()
                    .filter(|s| s.last + gap + grace < now)
                    .copied()
                    .collect();
                sessions.retain(|s| s.last + gap + grace >= now);
                closed.sort_by_key(|s| (s.last, s.key));
                if emit_final {
                    for s in closed {
                        out.push((k(s.key), s.first, s.last + 1, Some(s.count), Some(s.sum), s.last));
                    }
                }
            }
            Event::Punctuate => {}
            Event::Restart => read = false,
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn session_windows_emitting_every_update(gap in 0i64..40, grace in 0i64..40, events in events()) {
        prop_assert_eq!(run(gap, grace, false, &events), model(gap, grace, false, &events));
    }

    #[test]
    fn session_windows_emitting_once_when_closed(gap in 0i64..40, grace in 0i64..40, events in events()) {
        let mut got = run(gap, grace, true, &events);
        let mut want = model(gap, grace, true, &events);
        got.sort();
        want.sort();
        prop_assert_eq!(got, want);
    }
}

#[test]
fn a_record_that_bridges_two_sessions_merges_them_while_both_are_kept() {
    let bridge = |grace: u64| -> Vec<(i64, i64, Option<u64>, i64)> {
        let windows = SessionWindows::with_inactivity_gap(Duration::from_millis(5)).grace(Duration::from_millis(grace));
        let topology = move |b: &mut StreamsBuilder| {
            b.stream::<String, u64>("in")
                .group_by_key()
                .windowed_by(windows)
                .count("sessions")
                .to_stream()
                .to("out");
        };
        let mut driver = TestDriver::new("s", topology).unwrap();
        for ts in [10, 20, 15] {
            driver.pipe("in", "a".to_string(), 1u64, ts).unwrap();
        }
        driver
            .read::<Windowed<String>, Option<u64>>("out")
            .unwrap()
            .into_iter()
            .map(|r| (r.key.start, r.key.end, r.value, r.timestamp))
            .collect()
    };
    // [10] and [20] apart; 15 is within 5 of both: one session [10, 20] of 3, each session
    // (and each deletion) stamped with its last record's time.
    assert_eq!(
        bridge(10),
        [
            (10, 11, Some(1), 10),
            (20, 21, Some(1), 20),
            (10, 11, None, 10),
            (20, 21, None, 20),
            (10, 21, Some(3), 20)
        ]
    );
    // Without grace, [10] closed when stream time reached 20 (10 + 5 < 20): it is no longer
    // kept, and 15 joins [20] alone (Kafka Streams' session store has dropped [10] too).
    assert_eq!(
        bridge(0),
        [
            (10, 11, Some(1), 10),
            (20, 21, Some(1), 20),
            (20, 21, None, 20),
            (15, 21, Some(2), 20)
        ]
    );
}

#[test]
fn a_record_on_a_session_no_longer_kept_replaces_it_and_it_goes_out_once() {
    // Gap 23, grace 20: at stream time 279, [236] is no longer kept (236 + 43 = 279) but not
    // yet closed. Another record at 236 is not merged with it and makes the same session,
    // which overwrites it in the store (Kafka Streams' session store does the same): one
    // session of 1 goes out when it closes, not two.
    let events = [
        Event::Record {
            key: 1,
            ts: 236,
            value: 1,
        },
        Event::Record {
            key: 0,
            ts: 279,
            value: 1,
        },
        Event::Record {
            key: 1,
            ts: 236,
            value: 1,
        },
        Event::Record {
            key: 0,
            ts: 280,
            value: 1,
        },
    ];
    let got = run(23, 20, true, &events);
    assert_eq!(got, [("k1".to_string(), 236, 237, Some(1), Some(1), 236)]);
    assert_eq!(model(23, 20, true, &events), got);
}
