//! Sliding windows against a model: a key's windows are `[t - d, t]` for each record and
//! `[t + 1, t + 1 + d]` when a record follows within it; late records are dropped; results
//! go out on every update (the open windows holding the record) or once per window, at the
//! first punctuation after it closed; across restarts.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use sluice_guest::dsl::testing::TestDriver;
use sluice_guest::dsl::{SlidingWindows, StreamsBuilder, Windowed};

#[derive(Debug, Clone)]
enum Event {
    Record { key: u8, ts: i64, value: u64 },
    Punctuate,
    Restart,
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    proptest::collection::vec(
        prop_oneof![
            8 => (0u8..3, 0i64..200, 1u64..10).prop_map(|(key, ts, value)| Event::Record { key, ts, value }),
            2 => Just(Event::Punctuate),
            1 => Just(Event::Restart),
        ],
        0..70,
    )
}

/// (key, start, end, count, sum, timestamp).
type Out = (String, i64, i64, u64, u64, i64);

fn run(d: i64, grace: i64, emit_final: bool, events: &[Event]) -> Vec<Out> {
    let ms = |m: i64| Duration::from_millis(m as u64);
    let windows = SlidingWindows::with_time_difference(ms(d)).grace(ms(grace));
    let topology = move |b: &mut StreamsBuilder| {
        let windowed = b.stream::<String, u64>("in").group_by_key().windowed_by(windows);
        let windowed = if emit_final { windowed.emit_final() } else { windowed };
        windowed.count("counts").to_stream().to("counts");
        windowed
            .aggregate(|| 0u64, |_, v, sum| sum + v, "sums")
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

/// A key's windows by definition: their starts.
fn windows_of(records: &[(i64, u64)], d: i64) -> BTreeSet<i64> {
    let mut starts = BTreeSet::new();
    for &(t, _) in records {
        starts.insert(t - d);
        if records.iter().any(|&(u, _)| t < u && u <= t + 1 + d) {
            starts.insert(t + 1);
        }
    }
    starts
}

/// A window's count, sum and time: the latest of its records' (Kafka Streams').
fn content(records: &[(i64, u64)], start: i64, d: i64) -> (u64, u64, i64) {
    let inside = records.iter().filter(|&&(t, _)| start <= t && t <= start + d);
    inside.fold((0, 0, i64::MIN), |(n, s, latest), &(t, v)| {
        (n + 1, s + v, latest.max(t))
    })
}

/// The model: Kafka Streams closes windows as each record comes (a record only joins the
/// windows still open when it comes, and a window that only comes to exist once closed is
/// never sent), so its results are those of [`punctuated`] with a punctuation after every
/// record; the operator sends each at the first punctuation after the window closed,
/// whenever its punctuations come.
fn model(d: i64, grace: i64, emit_final: bool, events: &[Event]) -> Vec<Out> {
    if !emit_final {
        return punctuated(d, grace, false, events);
    }
    let each_record: Vec<Event> = events
        .iter()
        .flat_map(|e| match e {
            Event::Record { .. } => vec![e.clone(), Event::Punctuate],
            Event::Punctuate => vec![],
            other => vec![other.clone()],
        })
        .collect();
    // How far the operator's own punctuations closed windows (only those with a record
    // read since the task started count).
    let (mut now, mut read, mut closed) = (i64::MIN, false, i64::MIN);
    for event in events.iter().chain([&Event::Punctuate]) {
        match event {
            Event::Record { ts, .. } => (now, read) = (now.max(*ts), true),
            Event::Punctuate if read => closed = closed.max(now - grace),
            Event::Punctuate => {}
            Event::Restart => read = false,
        }
    }
    let mut out = punctuated(d, grace, true, &each_record);
    out.retain(|(_, _, end, ..)| end - 1 < closed);
    out
}

/// Windows closed at each punctuation, with the records then in them.
fn punctuated(d: i64, grace: i64, emit_final: bool, events: &[Event]) -> Vec<Out> {
    let (mut now, mut read, mut closed_to) = (i64::MIN, false, i64::MIN);
    let mut records: BTreeMap<u8, Vec<(i64, u64)>> = BTreeMap::new();
    let mut out = Vec::new();
    for event in events.iter().chain([&Event::Punctuate]) {
        match event {
            Event::Record { key, ts, value } => {
                read = true;
                now = now.max(*ts);
                if ts + d + 1 + grace <= now {
                    continue; // late
                }
                let mine = records.entry(*key).or_default();
                mine.push((*ts, *value));
                if !emit_final {
                    for start in windows_of(mine, d) {
                        let end = start + d; // last millisecond
                        if start <= *ts && *ts <= end && end >= now - grace {
                            let (n, s, latest) = content(mine, start, d);
                            out.push((format!("k{key}"), start, end + 1, n, s, latest));
                        }
                    }
                }
            }
            Event::Punctuate if read => {
                let close = now - grace;
                if close > closed_to && emit_final {
                    for (key, mine) in &records {
                        for start in windows_of(mine, d) {
                            let end = start + d;
                            if closed_to <= end && end < close {
                                let (n, s, latest) = content(mine, start, d);
                                out.push((format!("k{key}"), start, end + 1, n, s, latest));
                            }
                        }
                    }
                }
                closed_to = closed_to.max(close);
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
    fn sliding_windows_emitting_every_update(d in 0i64..30, grace in 0i64..30, events in events()) {
        prop_assert_eq!(run(d, grace, false, &events), model(d, grace, false, &events));
    }

    #[test]
    fn sliding_windows_emitting_once_when_closed(d in 0i64..30, grace in 0i64..30, events in events()) {
        let mut got = run(d, grace, true, &events);
        let mut want = model(d, grace, true, &events);
        got.sort();
        want.sort();
        prop_assert_eq!(got, want);
    }
}
