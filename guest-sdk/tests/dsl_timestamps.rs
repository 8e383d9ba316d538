//! Output timestamps as Kafka Streams gives them (its `ValueAndTimestamp` rules): an
//! aggregate's time is the latest of the records folded into it, a window's the latest of
//! its records' (also when sent at its close), a table-table join's result the later of
//! its two sides'. And stores written by an SDK from before values kept times still read.

use std::time::Duration;

use sluice_guest::dsl::testing::TestDriver;
use sluice_guest::dsl::{KeyValueStore, MemoryStores, StreamsBuilder, TimeWindows, Windowed};

fn stamps<K: sluice_guest::dsl::Data, V: sluice_guest::dsl::Data>(
    driver: &mut TestDriver,
    sink: &str,
) -> Vec<(K, V, i64)> {
    driver
        .read::<K, V>(sink)
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value, r.timestamp))
        .collect()
}

#[test]
fn an_aggregate_has_the_latest_time_of_its_records_also_out_of_order() {
    let topology = |b: &mut StreamsBuilder| {
        b.stream::<String, u64>("in")
            .group_by_key()
            .reduce(|a, b| a + b, "sums")
            .to_stream()
            .to("out");
    };
    let mut driver = TestDriver::new("agg", topology).unwrap();
    driver.pipe("in", "a".to_string(), 1u64, 30).unwrap();
    driver.pipe("in", "a".to_string(), 2u64, 10).unwrap(); // out of order
    driver.pipe("in", "b".to_string(), 5u64, 20).unwrap();
    driver.pipe("in", "a".to_string(), 4u64, 40).unwrap();
    assert_eq!(
        stamps::<String, Option<u64>>(&mut driver, "out"),
        [
            ("a".into(), Some(1), 30),
            ("a".into(), Some(3), 30), // Kafka Streams: max(10, 30)
            ("b".into(), Some(5), 20),
            ("a".into(), Some(7), 40),
        ]
    );
    assert_eq!(
        driver.store_stamped::<String, u64>("sums").unwrap(),
        [("a".into(), 7, Some(40)), ("b".into(), 5, Some(20))]
    );
}

#[test]
fn an_emit_final_window_has_the_latest_time_of_its_records_and_on_update_too() {
    let windows = TimeWindows::tumbling(Duration::from_millis(100));
    let topology = move |b: &mut StreamsBuilder| {
        let grouped = b.stream::<String, u64>("in").group_by_key();
        grouped
            .windowed_by(windows)
            .emit_final()
            .count("final_counts")
            .to_stream()
            .to("final");
        grouped.windowed_by(windows).count("counts").to_stream().to("updates");
    };
    let mut driver = TestDriver::new("w", topology).unwrap();
    driver.pipe("in", "a".to_string(), 0u64, 50).unwrap();
    driver.pipe("in", "a".to_string(), 0u64, 20).unwrap();
    driver.pipe("in", "b".to_string(), 0u64, 100).unwrap(); // closes [0, 100)
    driver.punctuate().unwrap();
    let final_ = stamps::<Windowed<String>, Option<u64>>(&mut driver, "final");
    assert_eq!(final_.len(), 1);
    assert_eq!((final_[0].1, final_[0].2), (Some(2), 50), "Kafka Streams: 50, not 99");
    let updates = stamps::<Windowed<String>, Option<u64>>(&mut driver, "updates");
    let times: Vec<(Option<u64>, i64)> = updates.iter().map(|(_, n, ts)| (*n, *ts)).collect();
    assert_eq!(times, [(Some(1), 50), (Some(2), 50), (Some(1), 100)]);
}

#[test]
fn a_table_table_join_has_the_later_time_of_its_two_sides() {
    let topology = |b: &mut StreamsBuilder| {
        let left = b.table::<String, String>("left", "left_store");
        let right = b.table::<String, String>("right", "right_store");
        left.join(&right, |l, r| format!("{l}+{r}")).to_stream().to("inner");
        left.left_join(&right, |l, r| format!("{l}+{}", r.map_or("-", |r| r.as_str())))
            .to_stream()
            .to("left_join");
    };
    let mut driver = TestDriver::new("tt", topology).unwrap();
    driver.pipe("right", "k".to_string(), "r1".to_string(), 200).unwrap();
    driver.pipe("left", "k".to_string(), "l1".to_string(), 100).unwrap();
    driver.pipe("left", "k".to_string(), "l2".to_string(), 300).unwrap();
    driver.pipe("left", "j".to_string(), "l3".to_string(), 150).unwrap(); // no right side
    driver.pipe("right", "k".to_string(), "r2".to_string(), 250).unwrap();
    assert_eq!(
        stamps::<String, Option<String>>(&mut driver, "inner"),
        [
            ("k".into(), Some("l1+r1".into()), 200), // the right side's time is later
            ("k".into(), Some("l2+r1".into()), 300),
            ("k".into(), Some("l2+r2".into()), 300), // the left side's time is later
        ]
    );
    assert_eq!(
        stamps::<String, Option<String>>(&mut driver, "left_join"),
        [
            ("k".into(), Some("l1+r1".into()), 200),
            ("k".into(), Some("l2+r1".into()), 300),
            ("j".into(), Some("l3+-".into()), 150),
            ("k".into(), Some("l2+r2".into()), 300),
        ]
    );
}

#[test]
fn a_table_aggregation_has_the_latest_time_of_its_updates() {
    let topology = |b: &mut StreamsBuilder| {
        b.table::<String, String>("users", "users")
            .group_by(|user, city| (city.clone(), user.clone()))
            .count("per_city")
            .to_stream()
            .to("out");
    };
    let mut driver = TestDriver::new("ta", topology).unwrap();
    driver
        .pipe("users", "ann".to_string(), "oslo".to_string(), 500)
        .unwrap();
    driver
        .pipe("users", "bob".to_string(), "oslo".to_string(), 100)
        .unwrap();
    driver
        .pipe("users", "ann".to_string(), "rome".to_string(), 200)
        .unwrap();
    assert_eq!(
        stamps::<String, Option<u64>>(&mut driver, "out"),
        [
            ("oslo".into(), Some(1), 500),
            ("oslo".into(), Some(2), 500),
            ("oslo".into(), Some(1), 500), // the retraction: max(200, 500)
            ("rome".into(), Some(1), 200),
        ]
    );
}

#[test]
fn stores_written_without_times_still_read_and_take_their_next_records_time() {
    // What an SDK from before stored: the codec's bytes alone.
    let stores = MemoryStores::new();
    stores.store("counts").put(b"a", &5u64.to_be_bytes()).unwrap();
    let mut window_key = vec![0x80, 0, 0, 0, 0, 0, 0, 0]; // start 0, order-preserving
    window_key.extend_from_slice(b"a");
    stores.store("windows").put(&window_key, &3u64.to_be_bytes()).unwrap();
    let topology = |b: &mut StreamsBuilder| {
        let grouped = b.stream::<String, u64>("in").group_by_key();
        grouped.count("counts").to_stream().to("out");
        grouped
            .windowed_by(TimeWindows::tumbling(Duration::from_millis(100)))
            .emit_final()
            .count("windows")
            .to_stream()
            .to("final");
    };
    let mut driver = TestDriver::with_stores("old", topology, stores).unwrap();
    driver.pipe("in", "a".to_string(), 0u64, 7).unwrap();
    assert_eq!(
        stamps::<String, Option<u64>>(&mut driver, "out"),
        [("a".into(), Some(6), 7)]
    );
    assert_eq!(
        driver.store_stamped::<String, u64>("counts").unwrap(),
        [("a".into(), 6, Some(7))]
    );
    // The window stored without a time and updated since has the record's; one not
    // updated since goes out with its last millisecond.
    driver.pipe("in", "b".to_string(), 0u64, 250).unwrap();
    driver.punctuate().unwrap();
    let final_ = stamps::<Windowed<String>, Option<u64>>(&mut driver, "final");
    assert_eq!(final_.len(), 1);
    assert_eq!((final_[0].1, final_[0].2), (Some(4), 7));
    let mut untouched = MemoryStores::new();
    untouched
        .store("windows")
        .put(&window_key, &3u64.to_be_bytes())
        .unwrap();
    let mut driver = TestDriver::with_stores("old", topology, std::mem::take(&mut untouched)).unwrap();
    driver.pipe("in", "b".to_string(), 0u64, 250).unwrap();
    driver.punctuate().unwrap();
    let final_ = stamps::<Windowed<String>, Option<u64>>(&mut driver, "final");
    assert_eq!((final_[0].0.key.as_str(), final_[0].1, final_[0].2), ("a", Some(3), 99));
}
