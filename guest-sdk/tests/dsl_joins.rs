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

    /// The model: every on-time pair within the window; every on-time record without a
    /// partner, once a punctuation found its window and grace period passed.
    fn model((before, after, grace): (i64, i64, i64), events: &[Event]) -> [Vec<Out>; 3] {
        let (mut now, mut closed_at, mut read) = (i64::MIN, i64::MIN, false);
        let (mut lefts, mut rights) = (Vec::new(), Vec::new());
        for event in events.iter().chain([&Event::Punctuate]) {
            match event {
                Event::Left { key, ts, value } => {
                    read = true;
                    now = now.max(*ts);
                    if ts + after + grace >= now {
                        lefts.push((*key, *ts, *value));
                    }
                }
                Event::Right { key, ts, value } => {
                    read = true;
                    now = now.max(*ts);
                    if ts + before + grace >= now {
                        rights.push((*key, *ts, *value));
                    }
                }
                Event::Punctuate if read => closed_at = now,
                Event::Punctuate => {}
                Event::Restart => read = false,
            }
        }
        let window = before + after + grace;
        let mut out: [Vec<Out>; 3] = Default::default();
        let joins = |l: &(u8, i64, u64), r: &(u8, i64, u64)| l.0 == r.0 && l.1 - before <= r.1 && r.1 <= l.1 + after;
        for l in &lefts {
            let mut matched = false;
            for r in rights.iter().filter(|r| joins(l, r)) {
                matched = true;
                let ts = l.1.max(r.1);
                out[0].push((format!("k{}", l.0), format!("{}+{}", l.2, r.2), ts));
                out[1].push((format!("k{}", l.0), format!("{}+Some({})", l.2, r.2), ts));
                out[2].push((format!("k{}", l.0), format!("Some({})+Some({})", l.2, r.2), ts));
            }
            if !matched && closed_at > l.1 + window {
                out[1].push((format!("k{}", l.0), format!("{}+None", l.2), l.1));
                out[2].push((format!("k{}", l.0), format!("Some({})+None", l.2), l.1));
            }
        }
        for r in &rights {
            if !lefts.iter().any(|l| joins(l, r)) && closed_at > r.1 + window {
                out[2].push((format!("k{}", r.0), format!("None+Some({})", r.2), r.1));
            }
        }
        for o in &mut out {
            o.sort();
        }
        out
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
