//! The harness itself: a real broker, topics, producing and consuming.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use sluice_tests::{by_partition, kafka, unique_name};

#[tokio::test]
async fn thousand_keyed_records_round_trip_in_partition_order() -> anyhow::Result<()> {
    let kafka = kafka();
    let topic = unique_name("roundtrip");
    kafka.create_topic(&topic, 4).await?;

    // 50 keys, 20 records each: every key's records must share one partition and keep
    // their order; the sequence number in the value makes order checkable.
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..1000)
        .map(|i| (format!("key-{}", i % 50).into_bytes(), format!("{i:04}").into_bytes()))
        .collect();
    let positions = kafka.produce(&topic, &records).await?;

    let received = kafka.consume(&topic, records.len(), Duration::from_secs(60)).await?;
    assert_eq!(received.len(), 1000);

    // Every record arrived exactly once, with its key and value intact, where the producer
    // was told it was written.
    type KeyValue = (Vec<u8>, Vec<u8>);
    let mut expected: HashMap<(i32, i64), &KeyValue> = HashMap::new();
    for (record, position) in records.iter().zip(&positions) {
        assert!(
            expected.insert(*position, record).is_none(),
            "two records acknowledged at {position:?}"
        );
    }
    let mut seen = HashSet::new();
    for r in &received {
        assert!(
            seen.insert((r.partition, r.offset)),
            "record at {}/{} read twice",
            r.partition,
            r.offset
        );
        let (key, value) = expected
            .get(&(r.partition, r.offset))
            .unwrap_or_else(|| panic!("unexpected record at {}/{}", r.partition, r.offset));
        assert_eq!(r.key.as_ref(), Some(key));
        assert_eq!(r.value.as_ref(), Some(value));
    }

    // All four partitions were used, each key stayed in one partition, and within a
    // partition the records appear in the order they were produced.
    let partitions = by_partition(&received);
    assert_eq!(
        partitions.len(),
        4,
        "records landed in partitions {:?}",
        partitions.keys()
    );
    let mut partition_of_key = HashMap::new();
    for (partition, list) in &partitions {
        let sequence: Vec<u32> = list
            .iter()
            .map(|r| std::str::from_utf8(r.value.as_ref().unwrap()).unwrap().parse().unwrap())
            .collect();
        assert!(
            sequence.windows(2).all(|w| w[0] < w[1]),
            "partition {partition} is out of order: {sequence:?}"
        );
        for r in list {
            let previous = partition_of_key.insert(r.key.clone(), *partition);
            assert!(
                previous.is_none() || previous == Some(*partition),
                "key {:?} in two partitions",
                r.key
            );
        }
    }
    Ok(())
}
