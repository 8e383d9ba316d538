//! Record-at-a-time operators and stream aggregations through the test driver.

use sluice_guest::dsl::testing::TestDriver;
use sluice_guest::dsl::StreamsBuilder;

fn word_count(b: &mut StreamsBuilder) {
    b.stream::<(), String>("lines")
        .flat_map_values(|line| line.split_whitespace().map(str::to_lowercase).collect::<Vec<_>>())
        .group_by(|_, word| word.clone())
        .named("words")
        .count("counts")
        .to_stream()
        .to("counts");
}

#[test]
fn a_word_count_counts_through_its_repartition_topic() {
    let mut driver = TestDriver::new("word-count", word_count).unwrap();
    driver.pipe("lines", (), "the cat and the hat".to_string(), 10).unwrap();
    driver.pipe("lines", (), "The end".to_string(), 20).unwrap();
    let out: Vec<(String, Option<u64>, i64)> = driver
        .read::<String, Option<u64>>("counts")
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value, r.timestamp))
        .collect();
    assert_eq!(
        out,
        [
            ("the".into(), Some(1), 10),
            ("cat".into(), Some(1), 10),
            ("and".into(), Some(1), 10),
            ("the".into(), Some(2), 10),
            ("hat".into(), Some(1), 10),
            ("the".into(), Some(3), 20),
            ("end".into(), Some(1), 20),
        ]
    );
    // The store holds key → count with the codecs chosen (what an interactive query reads),
    // and the count's time: the latest of the words counted (Kafka Streams').
    let counts = driver.store_stamped::<String, u64>("counts").unwrap();
    assert!(counts.contains(&("the".to_string(), 3, Some(20))));
    assert!(counts.contains(&("hat".to_string(), 1, Some(10))));
    let mut stamped = 1u64.to_be_bytes().to_vec();
    stamped.extend(10i64.to_be_bytes());
    stamped.extend([0xF5, 0xC1, b'S', b'l', b'T', b's', 0x00, 0x01]);
    assert_eq!(driver.store_raw("counts")[0], (b"and".to_vec(), stamped));
}

#[test]
fn record_operators_chain_split_merge_and_peek() {
    use std::cell::RefCell;
    use std::rc::Rc;
    thread_local! {
        static SEEN: Rc<RefCell<Vec<String>>> = Rc::new(RefCell::new(Vec::new()));
    }
    fn topology(b: &mut StreamsBuilder) {
        let numbers = b.stream::<String, u64>("numbers");
        let branches = numbers
            .split()
            .branch(|_, n| *n >= 100)
            .branch(|_, n| *n >= 10)
            .default_branch();
        branches[0].map_values(|n| format!("big {n}")).to("out");
        branches[1]
            .filter_not(|_, n| n % 2 == 1)
            .map_values(|n| format!("even {n}"))
            .to("out");
        let small = branches[2].map(|k, n| (format!("{k}!"), n * 1000));
        let seen = SEEN.with(Rc::clone);
        small
            .merge(&numbers.filter(|k, _| k == "both"))
            .peek(move |k, _| seen.borrow_mut().push(k.clone()))
            .flat_map(|k, n| vec![(k.clone(), n), (k, n + 1)])
            .map_values(|n| n.to_string())
            .to("out");
    }
    let mut driver = TestDriver::new("ops", topology).unwrap();
    for (k, n) in [("a", 500u64), ("b", 12), ("c", 13), ("d", 3), ("both", 7)] {
        driver.pipe("numbers", k.to_string(), n, 1).unwrap();
    }
    let out: Vec<(String, String)> = driver
        .read::<String, String>("out")
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value))
        .collect();
    let expected = [
        ("a", "big 500"),
        ("b", "even 12"),
        ("d!", "3000"),
        ("d!", "3001"),
        ("both!", "7000"),
        ("both!", "7001"),
        ("both", "7"),
        ("both", "8"),
    ];
    assert_eq!(out, expected.map(|(k, v)| (k.to_string(), v.to_string())));
    assert_eq!(SEEN.with(|s| s.borrow().clone()), ["d!", "both!", "both"]);
}

#[test]
fn a_null_key_where_the_type_cannot_be_null_is_an_error_naming_the_operator_and_record() {
    fn topology(b: &mut StreamsBuilder) {
        b.stream::<String, String>("in").to("out");
    }
    let mut driver = TestDriver::new("t", topology).unwrap();
    let e = driver.pipe_raw("in", None, Some(b"v"), 0).unwrap_err().to_string();
    assert_eq!(
        e,
        "the record at in/0@0: operator source_0 (source \"in\"): decoding the key: null codec: null (absent), \
         but its type cannot be null: declare it as an Option<…>"
    );
    let e = driver
        .pipe_raw("in", Some(b"k"), Some(&[0xff]), 0)
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("the record at in/0@1: operator source_0 (source \"in\"): decoding the value: utf-8"),
        "{e}"
    );
    let e = driver
        .pipe_raw("nope", Some(b"k"), Some(b"v"), 0)
        .unwrap_err()
        .to_string();
    assert_eq!(e, "the topology has no source \"nope\"; its sources are [\"in\"]");
}

#[test]
fn aggregations_drop_null_keys_and_reduce_and_aggregate() {
    fn topology(b: &mut StreamsBuilder) {
        let s = b.stream::<Option<String>, u64>("in");
        s.group_by_key().reduce(|a, b| a.max(b), "max").to_stream().to("max");
        s.group_by_key()
            .aggregate(
                || sluice_guest::Json(Vec::<u64>::new()),
                |_, v, mut all| {
                    all.0.push(v);
                    all
                },
                "all",
            )
            .to_stream()
            .to("all");
    }
    let mut driver = TestDriver::new("t", topology).unwrap();
    driver.pipe("in", Some("a".to_string()), 3u64, 1).unwrap();
    driver.pipe("in", None::<String>, 9u64, 2).unwrap();
    driver.pipe("in", Some("a".to_string()), 2u64, 3).unwrap();
    let max: Vec<(Option<String>, Option<u64>)> = driver
        .read("max")
        .unwrap()
        .into_iter()
        .map(|r| (r.key, r.value))
        .collect();
    assert_eq!(max, [(Some("a".into()), Some(3)), (Some("a".into()), Some(3))]);
    let all = driver.read::<String, sluice_guest::Json<Vec<u64>>>("all").unwrap();
    assert_eq!(all.last().unwrap().value.0, vec![3, 2]);
}

#[test]
fn bytes_in_a_store_that_do_not_decode_are_an_error_naming_the_operator_store_and_record() {
    use sluice_guest::dsl::KeyValueStore;
    let mut driver = TestDriver::new("word-count", word_count).unwrap();
    driver.stores().store("counts").put(b"cat", b"not a u64").unwrap();
    let e = driver.pipe("lines", (), "cat".to_string(), 1).unwrap_err().to_string();
    assert_eq!(
        e,
        "the record at words/0@0: operator count_5: decoding the aggregate in store \"counts\": \
         big-endian integer codec: expected 8 bytes, got 9"
    );
}
