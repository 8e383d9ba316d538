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

/// A transaction left open (its producer killed, here: never committed) holds a
/// read-committed reader back: records another producer committed after it began are not
/// read until it ends. `read_all` stops at the last stable offset and says nothing, so a test
/// that compares outputs after a SIGKILL must first wait for `wait_transactions_ended` (the
/// differential tests do), or it sees a committed output as missing.
#[tokio::test]
async fn an_open_transaction_hides_records_committed_after_it_until_it_ends() -> anyhow::Result<()> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let kafka = kafka();
    let topic = unique_name("open-txn");
    kafka.create_topic(&topic, 1).await?;
    kafka.produce(&topic, &[(b"before".to_vec(), b"1".to_vec())]).await?;

    let zombie: BaseProducer = kafka
        .config()
        .set("transactional.id", unique_name("zombie"))
        .set("transaction.timeout.ms", "60000")
        .create()?;
    zombie.init_transactions(Duration::from_secs(30))?;
    zombie.begin_transaction()?;
    zombie
        .send(BaseRecord::to(&topic).key("zombie").payload("open"))
        .map_err(|(e, _)| e)?;
    zombie.flush(Duration::from_secs(30))?;
    // Committed after the zombie's record, behind its open transaction.
    kafka.produce(&topic, &[(b"after".to_vec(), b"2".to_vec())]).await?;

    let keys = |records: &[sluice_tests::Received]| -> Vec<String> {
        records
            .iter()
            .map(|r| String::from_utf8_lossy(r.key.as_deref().unwrap_or_default()).into_owned())
            .collect()
    };
    assert_eq!(keys(&kafka.read_all(&topic, Duration::from_secs(30))?), ["before"]);
    assert_eq!(kafka.open_transactions(&topic)?, [(0, 1, 3)]);
    let waited = kafka.wait_transactions_ended(&topic, Duration::from_secs(1)).await;
    let said = waited.expect_err("the transaction is open").to_string();
    assert!(said.contains("partition 0 stable to 1 of 3"), "{said}");

    zombie.abort_transaction(Duration::from_secs(30))?;
    kafka.wait_transactions_ended(&topic, Duration::from_secs(30)).await?;
    assert_eq!(kafka.open_transactions(&topic)?, []);
    assert_eq!(
        keys(&kafka.read_all(&topic, Duration::from_secs(30))?),
        ["before", "after"]
    );
    assert_eq!(
        keys(&kafka.read_all_uncommitted(&topic, Duration::from_secs(30))?),
        ["before", "zombie", "after"]
    );
    Ok(())
}
