//! Records in the Confluent wire format behind a real Schema Registry (`dev/registry`:
//! Apicurio Registry with Confluent's API), written and read by confluent-kafka's own
//! serializers (`tests/python/confluent_io.py`): Sluice topologies read what a shop's
//! producers write and write what its consumers read, through kills, schema evolution,
//! bad records and a registry that goes away.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_tests::registry::{consume_with_confluent, produce_with_confluent, registry};
use sluice_tests::{kafka, repo_root, unique_name};

use crate::differential::caught_up_internally;
use crate::dsl_examples::{committed, Example};

/// A file of the Avro orders example (`guests/dsl-avro-orders/schemas/`).
fn schema_file(name: &str) -> PathBuf {
    repo_root()
        .join("guests")
        .join("dsl-avro-orders")
        .join("schemas")
        .join(name)
}

/// `--schema-registry-url URL` for an example's workers.
fn registry_args(url: &str) -> [&'static str; 2] {
    ["--schema-registry-url", Box::leak(url.to_string().into_boxed_str())]
}

/// Orders of `customers` customers, as the shop's producers write them.
fn orders(range: std::ops::Range<usize>, customers: usize) -> Vec<Value> {
    range
        .map(|i| {
            let note = if i % 3 == 0 {
                Value::Null
            } else {
                json!(format!("note {i}"))
            };
            json!({
                "key": format!("o-{i}"),
                "value": {
                    "id": format!("o-{i}"),
                    "customer": format!("c{}", (i * 7) % customers),
                    "amount": (i % 50) as f64 * 1.25,
                    "quantity": 1 + (i % 4) as i64,
                    "placed": {"$timestamp_ms": 1_733_500_000_000i64 + i as i64},
                    "note": note,
                }
            })
        })
        .collect()
}

/// Each customer's orders and items in `orders`.
fn truth(orders: &[Value]) -> BTreeMap<String, (i64, i64)> {
    let mut t: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for o in orders {
        let v = &o["value"];
        let e = t.entry(v["customer"].as_str().unwrap().to_string()).or_default();
        e.0 += 1;
        e.1 += v["quantity"].as_i64().unwrap();
    }
    t
}

/// The Avro orders example (`guests/dsl-avro-orders`) on two workers, the first SIGKILLed
/// midway: every customer's last total, read back with confluent-kafka's
/// `AvroDeserializer`, is the truth.
async fn avro_orders_through_a_kill(guarantee: &'static str) -> anyhow::Result<()> {
    let url = registry();
    let (input, output) = (unique_name("avro-orders"), unique_name("avro-totals"));
    kafka().create_topic(&input, 3).await?;
    kafka().create_topic(&output, 2).await?;
    let all = orders(0..1_500, 40);
    let mut ex = Example::new(
        "avroorders",
        "dsl-avro-orders",
        &[("orders", &input)],
        &[("totals", &output)],
    )
    .under(guarantee)
    .with_args(&registry_args(url));
    ex.start_worker()?;
    ex.start_worker()?;
    produce_with_confluent(url, &input, "avro", &schema_file("order.avsc"), &[], &all[..700])?;
    // Once the first totals are out, the first worker is killed; the rest of the orders
    // come while the second takes its tasks over.
    let deadline = Instant::now() + Duration::from_secs(90);
    while kafka().read_all(&output, Duration::from_secs(10))?.is_empty() {
        anyhow::ensure!(Instant::now() < deadline, "no totals within 90 s:\n{}", ex.logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ex.kill_first()?;
    produce_with_confluent(url, &input, "avro", &schema_file("order.avsc"), &[], &all[700..])?;
    committed(&ex, &input, 3, all.len()).await?;
    // The killed worker's open transaction holds read-committed readers of the partitions
    // it wrote (the repartition topic's included) until the broker aborts it.
    let repartition = format!("{}-by_customer-repartition", ex.name);
    kafka()
        .wait_transactions_ended(&repartition, Duration::from_secs(90))
        .await?;
    caught_up_internally(&ex, Duration::from_secs(120))
        .await
        .map_err(|e| anyhow::anyhow!("{e}; the workers:\n{}", ex.logs()))?;
    kafka()
        .wait_transactions_ended(&output, Duration::from_secs(90))
        .await?;
    let written = kafka().read_all(&output, Duration::from_secs(30))?.len();
    ex.stop()?;
    let written = written.max(kafka().read_all(&output, Duration::from_secs(30))?.len());
    let read = consume_with_confluent(url, &output, "avro", written, &[])?;
    let mut last: BTreeMap<String, Value> = BTreeMap::new();
    for r in &read {
        last.insert(r["key"].as_str().unwrap().to_string(), r["value"].clone());
    }
    let want = truth(&all);
    let got: BTreeMap<String, (i64, i64)> = last
        .iter()
        .map(|(k, v)| {
            assert_eq!(v["customer"].as_str(), Some(k.as_str()), "{v}");
            (k.clone(), (v["orders"].as_i64().unwrap(), v["items"].as_i64().unwrap()))
        })
        .collect();
    if got != want {
        let wrong: Vec<String> = want
            .iter()
            .filter(|(k, v)| got.get(*k) != Some(v))
            .map(|(k, v)| format!("{k}: {:?} instead of {v:?}", got.get(k)))
            .collect();
        panic!(
            "last totals per customer ({guarantee}) differ: {}; topics {input} {output}; the workers:\n{}",
            wrong.join(", "),
            ex.logs()
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn avro_orders_are_counted_per_customer_exactly_through_a_kill_under_exactly_once() -> anyhow::Result<()> {
    avro_orders_through_a_kill("exactly-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn avro_orders_are_counted_per_customer_exactly_through_a_kill_at_least_once() -> anyhow::Result<()> {
    avro_orders_through_a_kill("at-least-once").await
}
