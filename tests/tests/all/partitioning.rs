//! Where Sluice puts a keyed output: on the partition Java's default partitioner picks, so
//! topics Sluice writes are co-partitioned with those Java clients and Kafka Streams write.

use std::collections::HashMap;
use std::time::Duration;

use sluice_tests::worker::{guest, manifest, TempDir, WorkerProcess};
use sluice_tests::{kafka, unique_name};

#[tokio::test(flavor = "multi_thread")]
async fn keyed_outputs_land_where_javas_default_partitioner_puts_them() -> anyhow::Result<()> {
    let kafka = kafka();
    // Seven output partitions: not a power of two, and not the input's count.
    let (input, output, reference) = (unique_name("java-in"), unique_name("java-out"), unique_name("java-ref"));
    kafka.create_topic(&input, 3).await?;
    kafka.create_topic(&output, 7).await?;
    kafka.create_topic(&reference, 7).await?;

    // 10,000 distinct keys: text keys as applications use them, binary keys of every
    // length up to 40 with bytes above 0x7f (murmur2 reads them as signed in Java), and the
    // empty key (a key, not a missing one: Java hashes it).
    let mut keys: std::collections::BTreeSet<Vec<u8>> =
        (0..9_000).map(|i| format!("customer-{i}").into_bytes()).collect();
    keys.insert(Vec::new());
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    while keys.len() < 10_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let len = (seed % 40 + 1) as usize;
        keys.insert((0..len).map(|i| (seed >> (i % 8 * 8)) as u8 ^ i as u8).collect());
    }
    let keys: Vec<Vec<u8>> = keys.into_iter().collect();
    let java = kafka.produce_with_java(&reference, &keys)?;

    let sent: Vec<(Vec<u8>, Vec<u8>)> = keys.iter().map(|k| (k.clone(), b"v".to_vec())).collect();
    kafka.produce(&input, &sent).await?;
    let dir = TempDir::new("java-partitions");
    let m = dir.write(
        "upper.toml",
        &manifest(
            &unique_name("upper"),
            &guest("uppercase"),
            &[("input", &input)],
            &[("output", &output)],
            "",
        ),
    );
    let _worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &["--topology", m.to_str().unwrap()])?;
    let received = kafka.consume(&output, keys.len(), Duration::from_secs(120)).await?;

    let mut sluice: HashMap<Vec<u8>, i32> = HashMap::new();
    for r in &received {
        let key = r.key.clone().unwrap_or_default();
        assert!(
            sluice.insert(key.clone(), r.partition).is_none(),
            "key {key:02x?} came out twice"
        );
    }
    assert_eq!(sluice.len(), keys.len(), "distinct keys in the output");
    let wrong: Vec<_> = keys
        .iter()
        .filter(|k| sluice.get(*k) != java.get(*k))
        .map(|k| (k, sluice.get(k), java.get(k)))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} keys are not where Java's producer puts them (key, Sluice, Java), e.g. {:02x?}",
        wrong.len(),
        keys.len(),
        &wrong[..wrong.len().min(5)]
    );
    // Every partition got keys, so the comparison covers all seven.
    let mut per_partition = [0usize; 7];
    for p in java.values() {
        per_partition[*p as usize] += 1;
    }
    assert!(
        per_partition.iter().all(|&n| n > 1_000),
        "keys per partition: {per_partition:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn orders_join_a_customer_table_written_by_a_java_producer() -> anyhow::Result<()> {
    // The `enrich` example: a stream-table join over co-partitioned topics, the table
    // written by Kafka's Java producer (as a Java service or Kafka Streams would write it).
    let kafka = kafka();
    let (orders, customers, enriched) = (unique_name("orders"), unique_name("customers"), unique_name("enriched"));
    for topic in [&orders, &customers, &enriched] {
        kafka.create_topic(topic, 6).await?;
    }
    let table: Vec<(Vec<u8>, Vec<u8>)> = (0..2_000)
        .map(|i| (format!("customer-{i}").into_bytes(), format!("name-{i}").into_bytes()))
        .collect();
    kafka.produce_records_with_java(&customers, &table)?;

    let dir = TempDir::new("enrich");
    let name = unique_name("enrich");
    let m = dir.write(
        "enrich.toml",
        &manifest(
            &name,
            &guest("enrich"),
            &[("orders", &orders), ("customers", &customers)],
            &[("enriched", &enriched)],
            "",
        ),
    );
    let _worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &["--topology", m.to_str().unwrap()])?;
    // The table is in before the orders come (a stream-table join sees the table as it is
    // when the order is processed).
    kafka
        .wait_committed(
            &format!("sluice-{name}"),
            &customers,
            6,
            2_000,
            Duration::from_secs(120),
        )
        .await?;

    // 5,000 orders of 2,500 customers: the last 500 are not in the table.
    let stream: Vec<(Vec<u8>, Vec<u8>)> = (0..5_000)
        .map(|j| {
            (
                format!("customer-{}", j % 2_500).into_bytes(),
                format!("order-{j}").into_bytes(),
            )
        })
        .collect();
    kafka.produce_records_with_java(&orders, &stream)?;
    let received = kafka.consume(&enriched, stream.len(), Duration::from_secs(120)).await?;

    let mut got: Vec<String> = received
        .iter()
        .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
        .collect();
    let mut truth: Vec<String> = (0..5_000)
        .map(|j| match j % 2_500 {
            c if c < 2_000 => format!("order-{j} | name-{c}"),
            _ => format!("order-{j} | unknown customer"),
        })
        .collect();
    got.sort();
    truth.sort();
    assert_eq!(got.len(), truth.len());
    let wrong: Vec<_> = got.iter().zip(&truth).filter(|(g, t)| g != t).take(5).collect();
    assert!(
        wrong.is_empty(),
        "enriched orders differ from the truth (got, expected): {wrong:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn sources_of_different_partition_counts_are_refused_naming_each() -> anyhow::Result<()> {
    let kafka = kafka();
    let (orders, customers, enriched) = (unique_name("orders"), unique_name("customers"), unique_name("enriched"));
    kafka.create_topic(&orders, 4).await?;
    kafka.create_topic(&customers, 6).await?;
    kafka.create_topic(&enriched, 4).await?;
    let dir = TempDir::new("copartition");
    let m = dir.write(
        "enrich.toml",
        &manifest(
            "enrich",
            &guest("enrich"),
            &[("orders", &orders), ("customers", &customers)],
            &[("enriched", &enriched)],
            "",
        ),
    );
    let mut worker = WorkerProcess::start(kafka.bootstrap(), dir.path(), &["--topology", m.to_str().unwrap()])?;
    let status = worker.wait(Duration::from_secs(60))?;
    assert!(!status.success());
    let expected = format!(
        "topology enrich (manifest {}): its sources are not co-partitioned: {orders:?} has 4, {customers:?} has 6; \
         a task reads the same partition of each source",
        m.display()
    );
    assert!(
        worker.log().contains(&expected),
        "expected {expected:?} in:\n{}",
        worker.log()
    );
    Ok(())
}
