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
