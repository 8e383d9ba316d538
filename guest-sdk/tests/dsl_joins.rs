//! Joins against obviously correct models over random interleavings of both sides:
//! stream-table (inner, left), table-table (inner, left, outer), stream-global-table.

use std::collections::BTreeMap;

use proptest::prelude::*;
use sluice_guest::dsl::testing::TestDriver;
use sluice_guest::dsl::StreamsBuilder;

/// One input: a side ("a" or "b"), a key, a value (none: a tombstone), in arrival order.
fn inputs() -> impl Strategy<Value = Vec<(bool, u8, Option<u8>)>> {
    proptest::collection::vec((any::<bool>(), 0u8..4, proptest::option::weighted(0.8, 0u8..10)), 0..60)
}

/// A key, its new value (none: deleted), the timestamp.
type Changed = (String, Option<String>, i64);

fn key(k: u8) -> String {
    format!("k{k}")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn stream_table_joins_see_the_table_as_it_is_when_the_record_comes(inputs in inputs()) {
        fn topology(b: &mut StreamsBuilder) {
            let table = b.table::<String, u64>("table", "table");
            let stream = b.stream::<String, u64>("stream");
            stream.join(&table, |s, t| s * 100 + t).to("inner");
            stream.left_join(&table, |s, t| s * 100 + t.copied().unwrap_or(99)).to("left");
        }
        let mut driver = TestDriver::new("j", topology).unwrap();
        let mut table: BTreeMap<String, u64> = BTreeMap::new();
        let (mut inner, mut left) = (Vec::new(), Vec::new());
        for (i, (is_table, k, v)) in inputs.iter().enumerate() {
            let ts = i as i64;
            let v = v.map(u64::from);
            if *is_table {
                driver.pipe("table", key(*k), v, ts).unwrap();
                match v {
                    Some(v) => table.insert(key(*k), v),
                    None => table.remove(&key(*k)),
                };
            } else {
                let Some(v) = v else { continue };
                driver.pipe("stream", key(*k), v, ts).unwrap();
                if let Some(t) = table.get(&key(*k)) {
                    inner.push((key(*k), v * 100 + t, ts));
                }
                left.push((key(*k), v * 100 + table.get(&key(*k)).copied().unwrap_or(99), ts));
            }
        }
        let read = |driver: &mut TestDriver, sink: &str| -> Vec<(String, u64, i64)> {
            driver.read::<String, u64>(sink).unwrap().into_iter().map(|r| (r.key, r.value, r.timestamp)).collect()
        };
        prop_assert_eq!(read(&mut driver, "inner"), inner);
        prop_assert_eq!(read(&mut driver, "left"), left);
    }

    #[test]
    fn table_table_joins_update_the_result_from_either_side(inputs in inputs()) {
        fn topology(b: &mut StreamsBuilder) {
            let a = b.table::<String, u64>("a", "a");
            let bt = b.table::<String, u64>("b", "b");
            a.join(&bt, |x, y| format!("{x}+{y}")).to_stream().to("inner");
            a.left_join(&bt, |x, y| format!("{x}+{y:?}")).to_stream().to("left");
            a.outer_join(&bt, |x, y| format!("{x:?}+{y:?}")).to_stream().to("outer");
        }
        type Joiner = fn(Option<u64>, Option<u64>) -> Option<String>;
        let joiners: [(&str, Joiner); 3] = [
            ("inner", |x, y| Some(format!("{}+{}", x?, y?))),
            ("left", |x, y| Some(format!("{}+{y:?}", x?))),
            ("outer", |x, y| if x.is_none() && y.is_none() { None } else { Some(format!("{x:?}+{y:?}")) }),
        ];
        let mut driver = TestDriver::new("j", topology).unwrap();
        let (mut a, mut b): (BTreeMap<String, u64>, BTreeMap<String, u64>) = Default::default();
        let mut expected: BTreeMap<&str, Vec<Changed>> = BTreeMap::new();
        for (i, (is_a, k, v)) in inputs.iter().enumerate() {
            let ts = i as i64;
            let v = v.map(u64::from);
            let k = key(*k);
            driver.pipe(if *is_a { "a" } else { "b" }, k.clone(), v, ts).unwrap();
            let side = if *is_a { &mut a } else { &mut b };
            let old = match v {
                Some(v) => side.insert(k.clone(), v),
                None => side.remove(&k),
            };
            if old.is_none() && v.is_none() {
                continue; // deleting what is not there changes nothing
            }
            for (sink, joiner) in joiners {
                let (new_result, old_result) = if *is_a {
                    (joiner(v, b.get(&k).copied()), joiner(old, b.get(&k).copied()))
                } else {
                    (joiner(a.get(&k).copied(), v), joiner(a.get(&k).copied(), old))
                };
                if new_result.is_some() || old_result.is_some() {
                    expected.entry(sink).or_default().push((k.clone(), new_result, ts));
                }
            }
        }
        for sink in ["inner", "left", "outer"] {
            let got: Vec<Changed> = driver
                .read::<String, Option<String>>(sink)
                .unwrap()
                .into_iter()
                .map(|r| (r.key, r.value, r.timestamp))
                .collect();
            let want = expected.remove(sink).unwrap_or_default();
            prop_assert_eq!(got, want, "{}", sink);
        }
    }

    #[test]
    fn stream_global_table_joins_look_up_the_key_the_mapper_makes(inputs in inputs()) {
        fn topology(b: &mut StreamsBuilder) {
            let products = b.global_table::<String, u64>("products", "products");
            let orders = b.stream::<u64, String>("orders");
            orders.join_global(&products, |_, product| product.clone(), |p, price| format!("{p}={price}")).to("inner");
            orders
                .left_join_global(&products, |_, product| product.clone(), |p, price| format!("{p}={price:?}"))
                .to("left");
        }
        let mut driver = TestDriver::new("j", topology).unwrap();
        let mut products: BTreeMap<String, u64> = BTreeMap::new();
        let (mut inner, mut left) = (Vec::new(), Vec::new());
        for (i, (is_table, k, v)) in inputs.iter().enumerate() {
            let ts = i as i64;
            if *is_table {
                let v = v.map(u64::from);
                driver.pipe("products", key(*k), v, ts).unwrap();
                match v {
                    Some(v) => products.insert(key(*k), v),
                    None => products.remove(&key(*k)),
                };
            } else {
                // An order keyed by its own number names its product in the value.
                driver.pipe("orders", i as u64, key(*k), ts).unwrap();
                let price = products.get(&key(*k)).copied();
                if let Some(p) = price {
                    inner.push((i as u64, format!("{}={p}", key(*k))));
                }
                left.push((i as u64, format!("{}={price:?}", key(*k))));
            }
        }
        let read = |driver: &mut TestDriver, sink: &str| -> Vec<(u64, String)> {
            driver.read::<u64, String>(sink).unwrap().into_iter().map(|r| (r.key, r.value)).collect()
        };
        prop_assert_eq!(read(&mut driver, "inner"), inner);
        prop_assert_eq!(read(&mut driver, "left"), left);
    }
}

mod stream_stream {
    use std::time::Duration;

    use proptest::prelude::*;
    use sluice_guest::dsl::testing::TestDriver;
    use sluice_guest::dsl::{JoinWindows, StreamsBuilder};

    #[derive(Debug, Clone)]
    enum Event {
        Left { key: u8, ts: i64, value: u64 },
        Right { key: u8, ts: i64, value: u64 },
        Punctuate,
        Restart,
    }

    fn events() -> impl Strategy<Value = Vec<Event>> {
        proptest::collection::vec(
            prop_oneof![
                4 => (0u8..3, 0i64..200, 0u64..1000).prop_map(|(key, ts, value)| Event::Left { key, ts, value }),
                4 => (0u8..3, 0i64..200, 0u64..1000).prop_map(|(key, ts, value)| Event::Right { key, ts, value }),
                2 => Just(Event::Punctuate),
                1 => Just(Event::Restart),
            ],
            0..70,
        )
    }

    /// (before, after, grace) in milliseconds.
    fn windows() -> impl Strategy<Value = (i64, i64, i64)> {
        (0i64..30, 0i64..30, 0i64..30)
    }

    type Out = (String, String, i64);

    fn run((before, after, grace): (i64, i64, i64), events: &[Event]) -> [Vec<Out>; 3] {
        let ms = |m: i64| Duration::from_millis(m as u64);
        let windows = JoinWindows::of(ms(0))
            .before(ms(before))
            .after(ms(after))
            .grace(ms(grace));
        let topology = move |b: &mut StreamsBuilder| {
            let left = b.stream::<String, u64>("left");
            let right = b.stream::<String, u64>("right");
            left.join_stream(&right, |l, r| format!("{l}+{r}"), windows).to("inner");
            left.left_join_stream(&right, |l, r| format!("{l}+{r:?}"), windows)
                .to("left_out");
            left.outer_join_stream(&right, |l, r| format!("{l:?}+{r:?}"), windows)
                .to("outer");
        };
        let mut driver = TestDriver::new("j", topology).unwrap();
        let mut out: [Vec<Out>; 3] = Default::default();
        let drain = |driver: &mut TestDriver, out: &mut [Vec<Out>; 3]| {
            for (i, sink) in ["inner", "left_out", "outer"].into_iter().enumerate() {
                for r in driver.read::<String, String>(sink).unwrap() {
                    out[i].push((r.key, r.value, r.timestamp));
                }
            }
        };
        for event in events {
            match event {
                Event::Left { key, ts, value } => driver.pipe("left", format!("k{key}"), *value, *ts).unwrap(),
                Event::Right { key, ts, value } => driver.pipe("right", format!("k{key}"), *value, *ts).unwrap(),
                Event::Punctuate => driver.punctuate().unwrap(),
                Event::Restart => {
                    drain(&mut driver, &mut out);
                    let stores = driver.close().unwrap();
                    driver = TestDriver::with_stores("j", topology, stores).unwrap();
                }
            }
        }
        driver.punctuate().unwrap();
        drain(&mut driver, &mut out);
        for o in &mut out {
            o.sort();
        }
        out
    }

    /// Which records of a join go out alone: none (inner), left ones (left), both (outer).
    #[derive(Clone, Copy, PartialEq)]
    enum Alone {
        Never,
        Left,
        Both,
    }

    /// The model: Kafka Streams 4.x's stream-stream join, record by record. Each side keeps
    /// its records for before + after + grace of its own stream time; a record joins every
    /// kept partner in its window; one without a partner goes out alone at once if the part
    /// of its window ahead of it has passed, or else waits until a record that moves stream
    /// time finds that part and the grace period passed (unless a partner came first), in
    /// a pass that Kafka Streams makes only when its `minTime` (the lowest time it knows of
    /// among the waiting records, set by each pass to where it stopped) allows, and that
    /// stops once a record of each side is still waiting. Punctuations and restarts change
    /// nothing.
    fn simulate((before, after, grace): (i64, i64, i64), alone: Alone, events: &[Event]) -> Vec<Out> {
        let retention = before + after + grace;
        // (side, key, ts, value), side 0 = left.
        let mut seen: Vec<(u8, u8, i64, u64)> = Vec::new();
        let mut side_time = [i64::MIN, i64::MIN];
        let mut waiting: Vec<(u8, u8, i64, u64)> = Vec::new();
        let mut min_time = i64::MAX;
        let mut out = Vec::new();
        let ahead = |side: u8| if side == 0 { after } else { before };
        let text = |side: u8, value: u64, partner: Option<u64>| match (side, alone) {
            (0, Alone::Never) => format!("{value}+{}", partner.unwrap()),
            (1, Alone::Never) => format!("{}+{value}", partner.unwrap()),
            (0, Alone::Left) => format!("{value}+{partner:?}"),
            (1, Alone::Left) => format!("{}+Some({value})", partner.unwrap()),
            (0, _) => format!("Some({value})+{partner:?}"),
            (_, _) => format!("{:?}+Some({value})", partner),
        };
        for event in events {
            let (side, key, ts, value) = match event {
                Event::Left { key, ts, value } => (0u8, *key, *ts, *value),
                Event::Right { key, ts, value } => (1u8, *key, *ts, *value),
                Event::Punctuate | Event::Restart => continue,
            };
            let before_now = side_time[0].max(side_time[1]);
            side_time[usize::from(side)] = side_time[usize::from(side)].max(ts);
            let now = side_time[0].max(side_time[1]);
            if ts >= before_now && (min_time == i64::MAX || min_time + ahead(side) + grace < now) {
                // In Kafka Streams' store order: time, then right before left, then key.
                waiting.sort_by_key(|w| (w.2, 1 - w.0, w.1));
                min_time = i64::MAX;
                let mut open = [false, false];
                let mut kept = Vec::new();
                for (i, w) in waiting.iter().enumerate() {
                    min_time = w.2;
                    if open[0] && open[1] {
                        kept.extend_from_slice(&waiting[i..]);
                        break;
                    }
                    if w.2 + ahead(w.0) + grace >= now {
                        open[usize::from(w.0)] = true;
                        kept.push(*w);
                    } else {
                        out.push((format!("k{}", w.1), text(w.0, w.3, None), w.2));
                    }
                }
                waiting = kept;
            }
            let other = 1 - side;
            let kept_from = side_time[usize::from(other)].saturating_sub(retention) + 1;
            let (back, fwd) = if side == 0 { (before, after) } else { (after, before) };
            let partners: Vec<(u8, u8, i64, u64)> = seen
                .iter()
                .filter(|o| o.0 == other && o.1 == key && o.2 >= kept_from)
                .filter(|o| ts - back <= o.2 && o.2 <= ts + fwd)
                .copied()
                .collect();
            for p in &partners {
                waiting.retain(|w| (w.0, w.1, w.2) != (p.0, p.1, p.2));
                let (l, r) = if side == 0 { (value, p.3) } else { (p.3, value) };
                let joined = match alone {
                    Alone::Never => format!("{l}+{r}"),
                    Alone::Left => format!("{l}+Some({r})"),
                    Alone::Both => format!("Some({l})+Some({r})"),
                };
                out.push((format!("k{key}"), joined, ts.max(p.2)));
            }
            let me = (side, key, ts, value);
            seen.push(me);
            let keeps = alone == Alone::Both || (alone == Alone::Left && side == 0);
            if partners.is_empty() && keeps {
                if ts + fwd < now {
                    out.push((format!("k{key}"), text(side, value, None), ts));
                } else {
                    // One waiting record per time, side and key: a second replaces the first.
                    waiting.retain(|w| (w.0, w.1, w.2) != (side, key, ts));
                    min_time = min_time.min(ts);
                    waiting.push(me);
                }
            }
        }
        out.sort();
        out
    }

    fn model(windows: (i64, i64, i64), events: &[Event]) -> [Vec<Out>; 3] {
        [
            simulate(windows, Alone::Never, events),
            simulate(windows, Alone::Left, events),
            simulate(windows, Alone::Both, events),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn stream_stream_joins_inner_left_and_outer(windows in windows(), events in events()) {
            let [inner, left, outer] = run(windows, &events);
            let [want_inner, want_left, want_outer] = model(windows, &events);
            prop_assert_eq!(inner, want_inner, "inner");
            prop_assert_eq!(left, want_left, "left");
            prop_assert_eq!(outer, want_outer, "outer");
        }
    }
}
