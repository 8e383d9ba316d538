//! Records in the Confluent wire format behind a real Schema Registry (`dev/registry`:
//! Apicurio Registry with Confluent's API), written and read by confluent-kafka's own
//! serializers (`tests/python/confluent_io.py`): Sluice topologies read what a shop's
//! producers write and write what its consumers read, through kills, schema evolution,
//! bad records and a registry that goes away.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::formats::{RegistryClient, RegistrySettings};
use sluice_tests::registry::{consume_with_confluent, produce_with_confluent, registry, PrivateRegistry};
use sluice_tests::worker::{guest, manifest, shared_compile_cache, TempDir, WorkerProcess};
use sluice_tests::{free_port, http_get, kafka, repo_root, unique_name, Received};
use sluice_wire::SchemaKind;

use crate::differential::{caught_up_internally, Peer};
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

/// The Avro orders example (`guests/dsl-avro-orders`, or its Python twin
/// `guests/python/dsl-avro-orders`) on two workers, the first SIGKILLed midway: every
/// customer's last total, read back with confluent-kafka's `AvroDeserializer`, is the truth.
async fn avro_orders_through_a_kill(component: &str, guarantee: &'static str) -> anyhow::Result<()> {
    let url = registry();
    let (input, output) = (unique_name("avro-orders"), unique_name("avro-totals"));
    kafka().create_topic(&input, 3).await?;
    kafka().create_topic(&output, 2).await?;
    let all = orders(0..1_500, 40);
    let mut ex = Example::new("avroorders", component, &[("orders", &input)], &[("totals", &output)])
        .under(guarantee)
        .with_args(&registry_args(url));
    if component.starts_with("python/") {
        // Python components compile once per test run, into a cache the workers share.
        let cache: Vec<&'static str> = shared_compile_cache()
            .into_iter()
            .map(|s| &*Box::leak(s.into_boxed_str()))
            .collect();
        ex = ex.with_args(&cache);
    }
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
            "last totals per customer ({component}, {guarantee}) differ: {}; topics {input} {output}; the workers:\n{}",
            wrong.join(", "),
            ex.logs()
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn avro_orders_are_counted_per_customer_exactly_through_a_kill_under_exactly_once() -> anyhow::Result<()> {
    avro_orders_through_a_kill("dsl-avro-orders", "exactly-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn avro_orders_are_counted_per_customer_exactly_through_a_kill_at_least_once() -> anyhow::Result<()> {
    avro_orders_through_a_kill("dsl-avro-orders", "at-least-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_avro_orders_are_counted_per_customer_exactly_through_a_kill_under_exactly_once(
) -> anyhow::Result<()> {
    avro_orders_through_a_kill("python/dsl-avro-orders", "exactly-once").await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_avro_orders_are_counted_per_customer_exactly_through_a_kill_at_least_once() -> anyhow::Result<()> {
    avro_orders_through_a_kill("python/dsl-avro-orders", "at-least-once").await
}

// --- Bad records ---------------------------------------------------------------------------

/// A file of the Avro enrichment example (`guests/avro-enrich/schemas/`).
fn enrich_schema(name: &str) -> PathBuf {
    repo_root()
        .join("guests")
        .join("avro-enrich")
        .join("schemas")
        .join(name)
}

fn client(url: &str) -> RegistryClient {
    RegistryClient::new(RegistrySettings {
        url: url.to_string(),
        timeout: Duration::from_secs(10),
        ..Default::default()
    })
    .expect("a registry client")
}

/// What confluent-kafka's serializer writes for `records` with the schema in `schema` (a
/// scratch topic of one partition, read back as bytes): framed records, in order.
async fn confluent_bytes(url: &str, schema: &Path, records: &[Value]) -> anyhow::Result<Vec<Received>> {
    let scratch = unique_name("scratch");
    kafka().create_topic(&scratch, 1).await?;
    produce_with_confluent(url, &scratch, "avro", schema, &[], records)?;
    let got = kafka().read_all(&scratch, Duration::from_secs(30))?;
    anyhow::ensure!(
        got.len() == records.len(),
        "{} of {} records on {scratch}",
        got.len(),
        records.len()
    );
    Ok(got)
}

/// An order of `schemas/order.avsc` (version 1, no `channel`).
fn order_v1(i: usize, quantity: i64) -> Value {
    json!({"key": format!("o-{i}"), "value": {
        "id": format!("o-{i}"), "customer": format!("c{i}"), "amount": 10.0, "quantity": quantity,
        "placed": {"$timestamp_ms": 1_733_500_000_000i64 + i as i64}, "note": null}})
}

/// An order of `schemas/order-v2.avsc` (with `channel`).
fn order_v2(i: usize, channel: &str) -> Value {
    json!({"key": format!("o-{i}"), "value": {
        "id": format!("o-{i}"), "customer": format!("c{i}"), "amount": 10.0, "quantity": 2,
        "placed": {"$timestamp_ms": 1_733_500_000_000i64 + i as i64}, "note": "v2", "channel": channel}})
}

/// `avro-enrich` over `input` (one partition) to `output`, its manifest's head lines first.
fn enrich_manifest(dir: &TempDir, input: &str, output: &str, head: &str) -> (String, PathBuf) {
    let name = unique_name("enrich");
    let text = format!(
        "{head}\n{}",
        manifest(
            &name,
            &guest("avro-enrich"),
            &[("orders", input)],
            &[("enriched", output)],
            ""
        )
    );
    let path = dir.write(&format!("{name}.toml"), &text);
    (name, path)
}

fn start_enrich(dir: &TempDir, manifest: &Path, url: &str, extra: &[&str]) -> anyhow::Result<WorkerProcess> {
    let state = dir.path().join("state");
    let mut args = vec![
        "--topology",
        manifest.to_str().unwrap(),
        "--state-dir",
        state.to_str().unwrap(),
        "--schema-registry-url",
        url,
        "--commit-interval",
        "200ms",
    ];
    args.extend_from_slice(extra);
    WorkerProcess::start(kafka().bootstrap(), dir.path(), &args)
}

/// The ids of the enriched orders in `records`, decoded as the Rust SDK does.
fn enriched_ids(records: &[Received]) -> Vec<String> {
    records
        .iter()
        .map(|r| {
            let v = r.value.as_deref().expect("a value");
            assert_eq!(v[0], 0, "framed");
            // The payload after the 5-byte header starts with the id (an Avro string).
            let (len, rest) = (v[5] as usize / 2, &v[6..]);
            String::from_utf8_lossy(&rest[..len]).into_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_kind_of_bad_record_goes_to_the_dead_letter_topic_as_it_came_with_its_reason() -> anyhow::Result<()> {
    let url = registry();
    let registry = client(url);
    let dir = TempDir::new("badrecords");
    let (input, output, dlq) = (unique_name("bad-in"), unique_name("bad-out"), unique_name("bad-dlq"));
    for t in [&input, &output, &dlq] {
        kafka().create_topic(t, 1).await?;
    }
    // Good records of both writer versions, as confluent-kafka writes them.
    let good_v1 = confluent_bytes(url, &schema_file("order.avsc"), &[order_v1(0, 3), order_v1(2, 1)]).await?;
    let good_v2 = confluent_bytes(url, &enrich_schema("order-v2.avsc"), &[order_v2(8, "app")]).await?;
    let payload = |r: &Received| r.value.clone().unwrap()[5..].to_vec();
    let framed = |id: u32, payload: &[u8]| {
        let mut v = vec![0];
        v.extend_from_slice(&id.to_be_bytes());
        v.extend_from_slice(payload);
        v
    };
    // A writer schema the topology cannot read (its quantity is a string), and a JSON Schema.
    let incompatible = r#"{"type":"record","name":"Order","namespace":"shop","fields":[
        {"name":"id","type":"string"},{"name":"customer","type":"string"},{"name":"amount","type":"double"},
        {"name":"quantity","type":"string"}]}"#;
    let incompatible_id = registry
        .register(&unique_name("incompatible"), SchemaKind::Avro, incompatible, &[])
        .await?;
    let json_id = registry
        .register(
            &unique_name("json"),
            SchemaKind::JsonSchema,
            r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"object"}"#,
            &[],
        )
        .await?;
    // An Avro payload of the incompatible schema: "o-5", "c5", 1.0, "many".
    let mut incompatible_payload = vec![6];
    incompatible_payload.extend_from_slice(b"o-5");
    incompatible_payload.extend_from_slice(&[4, b'c', b'5']);
    incompatible_payload.extend_from_slice(&1.0f64.to_le_bytes());
    incompatible_payload.extend_from_slice(&[8, b'm', b'a', b'n', b'y']);
    let v1_id = u32::from_be_bytes(good_v1[0].value.as_ref().unwrap()[1..5].try_into().unwrap());
    let good0 = good_v1[0].value.clone().unwrap();
    let mut trailing = good0.clone();
    trailing.extend_from_slice(&[1, 2, 3]);
    let records: Vec<(&str, Vec<u8>, Option<&str>)> = vec![
        ("o-0", good0.clone(), None),
        (
            "bad-1",
            br#"{"id":"o-1"}"#.to_vec(),
            Some("not the magic byte 0|plain JSON"),
        ),
        ("o-2", good_v1[1].value.clone().unwrap(), None),
        (
            "bad-3",
            framed(0x7fff_fff0, &payload(&good_v1[0])),
            Some("2147483632|does not know"),
        ),
        (
            "bad-4",
            good0[..good0.len() - 5].to_vec(),
            Some(&*Box::leak(
                format!("schema id {v1_id}|does not read as Avro").into_boxed_str(),
            )),
        ),
        (
            "bad-5",
            framed(incompatible_id, &incompatible_payload),
            Some("cannot be read with the topology's reader schema|quantity"),
        ),
        ("bad-6", framed(json_id, b"{}"), Some("is a json-schema schema")),
        ("bad-7", Vec::new(), Some("it is empty")),
        ("o-8", good_v2[0].value.clone().unwrap(), None),
        ("bad-9", trailing, Some("3 bytes follow the end of the value")),
    ];
    let raw: Vec<(Vec<u8>, Vec<u8>)> = records
        .iter()
        .map(|(k, v, _)| (k.as_bytes().to_vec(), v.clone()))
        .collect();
    kafka().produce(&input, &raw).await?;
    let (name, path) = enrich_manifest(
        &dir,
        &input,
        &output,
        &format!("on-error = \"dead-letter\"\ndead-letter-topic = {dlq:?}"),
    );
    let metrics = free_port();
    let metrics_at = format!("127.0.0.1:{metrics}");
    let mut worker = start_enrich(&dir, &path, url, &["--metrics", &metrics_at])?;
    let bad: Vec<&(&str, Vec<u8>, Option<&str>)> = records.iter().filter(|r| r.2.is_some()).collect();
    let enriched = kafka()
        .consume(&output, 3, Duration::from_secs(90))
        .await
        .map_err(|e| anyhow::anyhow!("{e}: {}", worker.log()))?;
    assert_eq!(
        enriched_ids(&enriched),
        ["o-0", "o-2", "o-8"],
        "every good record, once, in order"
    );
    let dead = kafka().consume(&dlq, bad.len(), Duration::from_secs(60)).await?;
    kafka()
        .wait_committed(
            &format!("sluice-{name}"),
            &input,
            1,
            records.len() as i64,
            Duration::from_secs(60),
        )
        .await?;
    for (r, (key, value, expected)) in dead.iter().zip(&bad) {
        assert_eq!(r.key.as_deref(), Some(key.as_bytes()), "in order");
        assert_eq!(r.value.as_deref().unwrap_or_default(), &value[..], "{key}: as it came");
        assert_eq!(r.header("sluice.error.kind").as_deref(), Some("input"), "{key}");
        assert_eq!(r.header("sluice.source.topic").as_deref(), Some(input.as_str()));
        let offset = records.iter().position(|(k, _, _)| k == key).unwrap().to_string();
        assert_eq!(
            r.header("sluice.source.offset").as_deref(),
            Some(offset.as_str()),
            "{key}"
        );
        let error = r.header("sluice.error").unwrap_or_default();
        eprintln!("dead letter {key}: {error}");
        assert!(error.contains("its value"), "{key}: {error}");
        for part in expected.unwrap().split('|') {
            assert!(error.contains(part), "{key}: {error:?} should say {part:?}");
        }
    }
    assert_eq!(dead.len(), bad.len());
    let text = http_get(metrics, "/metrics")?;
    let counted: f64 = text
        .lines()
        .filter(|l| l.starts_with("sluice_records_rejected_total") && l.contains("kind=\"input\"") && l.contains(&name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(counted, bad.len() as f64, "counted:\n{text}");
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn under_fail_a_bad_record_stops_its_task_with_the_reason_and_a_fixed_policy_goes_on_losing_nothing(
) -> anyhow::Result<()> {
    let url = registry();
    let dir = TempDir::new("badfail");
    let (input, output, dlq) = (unique_name("badf-in"), unique_name("badf-out"), unique_name("badf-dlq"));
    for t in [&input, &output, &dlq] {
        kafka().create_topic(t, 1).await?;
    }
    let good = confluent_bytes(url, &schema_file("order.avsc"), &[order_v1(0, 3), order_v1(2, 1)]).await?;
    let raw = vec![
        (b"o-0".to_vec(), good[0].value.clone().unwrap()),
        (b"bad-1".to_vec(), b"plain text".to_vec()),
        (b"o-2".to_vec(), good[1].value.clone().unwrap()),
    ];
    kafka().produce(&input, &raw).await?;
    let (name, path) = enrich_manifest(&dir, &input, &output, "");
    let metrics = free_port();
    let metrics_at = format!("127.0.0.1:{metrics}");
    let mut worker = start_enrich(&dir, &path, url, &["--metrics", &metrics_at])?;
    let first = kafka().consume(&output, 1, Duration::from_secs(90)).await?;
    assert_eq!(enriched_ids(&first), ["o-0"]);
    // The task stops at the bad record and says why, where.
    let group = format!("sluice-{name}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let error = loop {
        let status: Value = serde_json::from_str(&http_get(metrics, "/status")?)?;
        if let Some(e) = status["tasks"][0]["error"].as_str() {
            break e.to_string();
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no failed task in {status}:\n{}",
            worker.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let at = format!("offset 1 of topic {input} partition 0");
    for part in [at.as_str(), "not in the Confluent wire format", "looks like text"] {
        assert!(error.contains(part), "{error:?} should say {part:?}");
    }
    assert_eq!(
        kafka().committed_offset(&group, &input, 0)?,
        Some(1),
        "what came before it is committed"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        kafka().read_all(&output, Duration::from_secs(10))?.len(),
        1,
        "nothing after it"
    );
    assert!(
        !worker.terminate(Duration::from_secs(60))?.success(),
        "a failed task fails the worker's exit"
    );
    // Fixed: the same topology with a dead-letter topic goes on from the bad record.
    let text = std::fs::read_to_string(&path)?;
    std::fs::write(
        &path,
        format!("on-error = \"dead-letter\"\ndead-letter-topic = {dlq:?}\n{text}"),
    )?;
    let mut worker = start_enrich(&dir, &path, url, &[])?;
    let all = kafka().consume(&output, 2, Duration::from_secs(90)).await?;
    assert_eq!(enriched_ids(&all), ["o-0", "o-2"], "each good record once");
    let dead = kafka().consume(&dlq, 1, Duration::from_secs(60)).await?;
    assert_eq!(dead[0].value.as_deref(), Some(&b"plain text"[..]));
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    Ok(())
}

// --- The registry goes away ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn with_the_registry_down_cached_schemas_go_on_and_a_new_one_waits_then_goes_through_losing_nothing(
) -> anyhow::Result<()> {
    let registry = PrivateRegistry::start()?;
    let url = registry.url.clone();
    let dir = TempDir::new("outage");
    let (input, output) = (unique_name("outage-in"), unique_name("outage-out"));
    kafka().create_topic(&input, 2).await?;
    kafka().create_topic(&output, 2).await?;
    // Bytes of both versions, made while the registry is up: version 2 is registered, but
    // the worker will not have seen it before the registry goes.
    let v1: Vec<Value> = (0..40).map(|i| order_v1(i, 1)).collect();
    let v1 = confluent_bytes(&url, &schema_file("order.avsc"), &v1).await?;
    let v2 = confluent_bytes(&url, &enrich_schema("order-v2.avsc"), &[order_v2(100, "app")]).await?;
    let on = |partition: i32, records: Vec<(Vec<u8>, Vec<u8>)>| {
        let input = input.clone();
        async move {
            let producer = kafka().producer()?;
            for (k, v) in records {
                producer
                    .send(
                        rdkafka::producer::FutureRecord::to(&input)
                            .partition(partition)
                            .key(&k)
                            .payload(&v),
                        Duration::from_secs(30),
                    )
                    .await
                    .map_err(|(e, _)| anyhow::anyhow!("{e}"))?;
            }
            anyhow::Ok(())
        }
    };
    let rec = |r: &Received| (r.key.clone().unwrap(), r.value.clone().unwrap());
    on(0, v1[..10].iter().map(rec).collect()).await?;
    on(1, v1[10..20].iter().map(rec).collect()).await?;
    let (name, path) = enrich_manifest(&dir, &input, &output, "");
    let metrics = free_port();
    let metrics_at = format!("127.0.0.1:{metrics}");
    let mut worker = start_enrich(&dir, &path, &url, &["--metrics", &metrics_at])?;
    kafka().consume(&output, 20, Duration::from_secs(90)).await?;

    registry.stop()?;
    // Partition 0 gets the new schema first, then more of the old; partition 1 only the old.
    let mut p0: Vec<(Vec<u8>, Vec<u8>)> = vec![rec(&v2[0])];
    p0.extend(v1[20..30].iter().map(rec));
    on(0, p0).await?;
    on(1, v1[30..40].iter().map(rec).collect()).await?;
    // Partition 1's task goes on from the cache; partition 0's waits at the new record.
    let group = format!("sluice-{name}");
    kafka()
        .wait_committed(&group, &input, 1, 40 - 10, Duration::from_secs(5))
        .await
        .ok();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p1 = kafka().committed_offset(&group, &input, 1)?;
        if p1 == Some(20) {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "partition 1 stuck at {p1:?}:\n{}",
            worker.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let status: Value = serde_json::from_str(&http_get(metrics, "/status")?)?;
    let waiting: Vec<String> = status["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| Some(format!("{}: {}", t["task"].as_str()?, t["waiting"].as_str()?)))
        .collect();
    let v2_id = u32::from_be_bytes(v2[0].value.as_ref().unwrap()[1..5].try_into().unwrap());
    assert_eq!(waiting.len(), 1, "only the task that needs it waits: {status}");
    assert!(
        waiting[0].contains(&format!("{name}/0")) && waiting[0].contains(&format!("schema id {v2_id}")),
        "{waiting:?}"
    );
    assert_eq!(
        kafka().committed_offset(&group, &input, 0)?,
        Some(10),
        "nothing skipped"
    );

    registry.resume()?;
    let all = kafka()
        .consume(&output, 41, Duration::from_secs(90))
        .await
        .map_err(|e| anyhow::anyhow!("{e}:\n{}", worker.log()))?;
    let mut ids = enriched_ids(&all);
    ids.sort();
    let mut want: Vec<String> = (0..40).map(|i| format!("o-{i}")).chain(["o-100".to_string()]).collect();
    want.sort();
    assert_eq!(ids, want, "every record once");
    let status: Value = serde_json::from_str(&http_get(metrics, "/status")?)?;
    assert!(
        status["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["waiting"].is_null()),
        "{status}"
    );
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    Ok(())
}

// --- Evolution -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn records_of_version_1_writers_read_with_the_default_then_version_2_writers_through_a_restart(
) -> anyhow::Result<()> {
    let url = registry();
    let dir = TempDir::new("evolution");
    let (input, output) = (unique_name("evo-in"), unique_name("evo-out"));
    kafka().create_topic(&input, 1).await?;
    kafka().create_topic(&output, 1).await?;
    let (_, path) = enrich_manifest(&dir, &input, &output, "");
    produce_with_confluent(
        url,
        &input,
        "avro",
        &schema_file("order.avsc"),
        &[],
        &(0..5).map(|i| order_v1(i, 1)).collect::<Vec<_>>(),
    )?;
    let mut worker = start_enrich(&dir, &path, url, &[])?;
    kafka().consume(&output, 5, Duration::from_secs(90)).await?;
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    produce_with_confluent(
        url,
        &input,
        "avro",
        &enrich_schema("order-v2.avsc"),
        &[],
        &(5..10).map(|i| order_v2(i, "app")).collect::<Vec<_>>(),
    )?;
    let mut worker = start_enrich(&dir, &path, url, &[])?;
    kafka().consume(&output, 10, Duration::from_secs(90)).await?;
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    let read = consume_with_confluent(url, &output, "avro", 10, &[])?;
    let channels: Vec<(String, String)> = read
        .iter()
        .map(|r| {
            (
                r["value"]["id"].as_str().unwrap().to_string(),
                r["value"]["channel"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = (0..10)
        .map(|i| (format!("o-{i}"), if i < 5 { "web" } else { "app" }.to_string()))
        .collect();
    assert_eq!(
        channels, want,
        "version 1 records take the reader's default, version 2 ones their own"
    );
    Ok(())
}

/// A third writer of orders, as a team with its own ideas writes them: fields in another
/// order, `id` as bytes, `amount` as a float, `note` without its union, a field the reader
/// lacks (`coupon`) and no `channel`. Avro resolves each of these (bytes → string, float →
/// double, a branch of the reader's union, a skipped field, a default).
const ORDER_V3: &str = r#"{"type": "record", "name": "Order", "namespace": "shop", "fields": [
  {"name": "placed", "type": {"type": "long", "logicalType": "timestamp-millis"}},
  {"name": "quantity", "type": "int"},
  {"name": "coupon", "type": {"type": "array", "items": "string"}},
  {"name": "customer", "type": "string"},
  {"name": "amount", "type": "float"},
  {"name": "note", "type": "string"},
  {"name": "id", "type": "bytes"}]}"#;

#[tokio::test(flavor = "multi_thread")]
async fn three_writer_versions_resolved_by_sluice_agree_with_kafka_streams_and_avros_java_library() -> anyhow::Result<()>
{
    let url = registry();
    let dir = TempDir::new("avro-diff");
    let (input, ours, theirs) = (
        unique_name("avro-diff-in"),
        unique_name("avro-diff-sluice"),
        unique_name("avro-diff-streams"),
    );
    kafka().create_topic(&input, 3).await?;
    kafka().create_topic(&ours, 3).await?;
    kafka().create_topic(&theirs, 3).await?;
    let v3 = dir.write("order-v3.avsc", ORDER_V3);
    let placed = |i: usize| json!({"$timestamp_ms": 1_733_500_000_000i64 + (i * 997) as i64});
    // Amounts that are not exact in binary, quantities 0 to 4 (the zeros are dropped), writers
    // interleaved: version 1, 2, 3, then 1 again.
    let v1: Vec<Value> = (0..300)
        .map(|i| {
            let note = if i % 2 == 0 {
                Value::Null
            } else {
                json!(format!("n{i}"))
            };
            json!({"key": format!("a-{i}"), "value": {"id": format!("a-{i}"), "customer": format!("c{}", i % 17),
                "amount": i as f64 * 0.37, "quantity": (i % 5) as i64, "placed": placed(i), "note": note}})
        })
        .collect();
    const CHANNELS: [&str; 3] = ["app", "store", "web"];
    let v2: Vec<Value> = (0..300)
        .map(|i| {
            json!({"key": format!("b-{i}"), "value": {"id": format!("b-{i}"), "customer": format!("c{}", i % 13),
                "amount": 1e-3 * i as f64 + 271.0, "quantity": (i % 5) as i64, "placed": placed(i), "note": null,
                "channel": CHANNELS[i % 3]}})
        })
        .collect();
    let v3_orders: Vec<Value> = (0..300)
        .map(|i| {
            let id: String = format!("c-{i}").bytes().map(|b| format!("{b:02x}")).collect();
            json!({"key": format!("c-{i}"), "value": {"placed": placed(i), "quantity": (i % 5) as i64,
                "coupon": [format!("x{i}")], "customer": format!("c{}", i % 11), "amount": 0.1 + i as f64 * 0.77,
                "note": format!("é{i}"), "id": {"$bytes": id}}})
        })
        .collect();
    produce_with_confluent(url, &input, "avro", &schema_file("order.avsc"), &[], &v1[..150])?;
    produce_with_confluent(url, &input, "avro", &enrich_schema("order-v2.avsc"), &[], &v2)?;
    produce_with_confluent(url, &input, "avro", &v3, &[], &v3_orders)?;
    produce_with_confluent(url, &input, "avro", &schema_file("order.avsc"), &[], &v1[150..])?;
    let kept = [&v1, &v2, &v3_orders]
        .iter()
        .flat_map(|orders| orders.iter())
        .filter(|o| o["value"]["quantity"] != json!(0))
        .count();

    let (_, path) = enrich_manifest(&dir, &input, &ours, "");
    let mut worker = start_enrich(&dir, &path, url, &[])?;
    let app = unique_name("avro-diff-app");
    let peer_args: Vec<String> = [
        kafka().bootstrap(),
        input.as_str(),
        theirs.as_str(),
        app.as_str(),
        "2",
        url,
        &enrich_schema("order-v2.avsc").display().to_string(),
        &enrich_schema("enriched-order.avsc").display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut peer = Peer::spawn(&app, "AvroEnrich", &peer_args)?;
    let our_records = kafka()
        .consume(&ours, kept, Duration::from_secs(120))
        .await
        .map_err(|e| anyhow::anyhow!("Sluice's output: {e}\n{}", worker.log()))?;
    let their_records = kafka()
        .consume(&theirs, kept, Duration::from_secs(120))
        .await
        .map_err(|e| anyhow::anyhow!("Kafka Streams' output: {e}\n{}", peer.log()))?;
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    peer.stop();

    // Record for record: each key's value, decoded by confluent-kafka, and its Avro bytes.
    let decoded = |topic: &str| -> anyhow::Result<BTreeMap<String, Value>> {
        Ok(consume_with_confluent(url, topic, "avro", kept, &[])?
            .into_iter()
            .map(|r| (r["key"].as_str().unwrap().to_string(), r["value"].clone()))
            .collect())
    };
    let (ours_decoded, theirs_decoded) = (decoded(&ours)?, decoded(&theirs)?);
    assert_eq!(theirs_decoded.len(), kept, "Kafka Streams: one result per order kept");
    let differ: Vec<String> = theirs_decoded
        .iter()
        .filter(|(k, v)| ours_decoded.get(*k) != Some(v))
        .take(5)
        .map(|(k, v)| format!("{k}: Sluice {:?}, Kafka Streams {v}", ours_decoded.get(k)))
        .collect();
    assert!(
        differ.is_empty() && ours_decoded.len() == kept,
        "{} results of Sluice's, {kept} of Kafka Streams'; differing: {}",
        ours_decoded.len(),
        differ.join("; ")
    );
    let payloads = |records: &[Received]| -> BTreeMap<Vec<u8>, Vec<u8>> {
        records
            .iter()
            .map(|r| (r.key.clone().unwrap(), r.value.as_ref().unwrap()[5..].to_vec()))
            .collect()
    };
    assert!(
        payloads(&our_records) == payloads(&their_records),
        "the same values, but other Avro bytes"
    );
    // The third writer's orders are among them, read through every resolution it needs.
    let v3_seen = theirs_decoded
        .values()
        .filter(|v| v["id"].as_str().is_some_and(|id| id.starts_with("c-")))
        .count();
    assert_eq!(
        v3_seen,
        v3_orders.iter().filter(|o| o["value"]["quantity"] != json!(0)).count()
    );
    Ok(())
}

// --- Interop with confluent-kafka's serializers ------------------------------------------------

/// A file of the formats echo topology (`guests/formats-echo/schemas/`).
fn echo_schema(name: &str) -> PathBuf {
    repo_root()
        .join("guests")
        .join("formats-echo")
        .join("schemas")
        .join(name)
}

/// `schemas/order.proto` compiled into a FileDescriptorSet (what confluent-kafka's Python
/// serializers build message classes from), written to `dir`.
fn proto_descriptor_set(dir: &TempDir) -> anyhow::Result<PathBuf> {
    let mut compiler = protox::Compiler::new([echo_schema("")])?;
    compiler.include_imports(true);
    compiler.open_file("order.proto")?;
    Ok(dir.write_bytes("order.pb", &compiler.encode_file_descriptor_set()))
}

/// Random protobuf orders (the JSON protobuf maps them from), `n` of them.
fn proto_orders(n: usize, seed: u64) -> Vec<Value> {
    let mut x = seed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|i| {
            let lines: Vec<Value> = (0..next() % 3)
                .map(|j| json!({"sku": format!("sku-{j}-{}", next() % 100), "count": (next() % 1000) as i64 - 500}))
                .collect();
            let counters: serde_json::Map<String, Value> = (0..next() % 3)
                .map(|j| (format!("c{j}"), json!(format!("{}", next() as i64))))
                .collect();
            let status = ["NEW", "PAID", "SHIPPED"][(next() % 3) as usize];
            let tags: Vec<String> = (0..next() % 4).map(|t| format!("tag{t}")).collect();
            json!({"key": format!("p-{i}"), "value": {
                "id": format!("p-{i}"), "quantity": (next() % 100) as i64, "price": (next() % 10_000) as f64 / 4.0,
                "tags": tags,
                "lines": lines, "status": status,
                "counters": counters, "blob": "AAEC/w==", "gift": next() % 2 == 0}})
        })
        .collect()
}

/// Random JSON orders of `schemas/order.json`.
fn json_orders(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let mut v = json!({"id": format!("j-{i}"), "amount": i as f64 * 0.5});
            if i % 2 == 0 {
                v["tags"] = json!(["a", format!("t{i}")]);
            }
            if i % 3 == 0 {
                v["customer"] = json!({"name": format!("Ann {i} é")});
            }
            json!({"key": format!("j-{i}"), "value": v})
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn records_of_confluents_avro_protobuf_and_json_serializers_read_and_written_by_a_rust_topology_read_back_equal(
) -> anyhow::Result<()> {
    echoed_as_confluent_wrote_them("formats-echo").await
}

#[tokio::test(flavor = "multi_thread")]
async fn records_of_confluents_avro_protobuf_and_json_serializers_read_and_written_by_a_python_topology_read_back_equal(
) -> anyhow::Result<()> {
    echoed_as_confluent_wrote_them("python/formats-echo").await
}

/// Records of every Avro type, Protobuf and JSON Schema orders written by confluent-kafka's
/// serializers, through the echo topology `component` (`guests/formats-echo` or its Python
/// twin), read back by confluent-kafka's deserializers: equal, value for value.
async fn echoed_as_confluent_wrote_them(component: &str) -> anyhow::Result<()> {
    let url = registry();
    let dir = TempDir::new("interop");
    let names = ["every_in", "proto_in", "json_in", "every_out", "proto_out", "json_out"];
    let topics: Vec<String> = names.iter().map(|n| unique_name(&format!("interop-{n}"))).collect();
    for t in &topics {
        kafka().create_topic(t, 2).await?;
    }
    // JSON orders keyed by an Avro record, out to five partitions: where Java's default
    // partitioner puts a framed key is where Sluice must put it.
    let (keyed_in, keyed_out) = (unique_name("interop-keyed-in"), unique_name("interop-keyed-out"));
    kafka().create_topic(&keyed_in, 2).await?;
    kafka().create_topic(&keyed_out, 5).await?;
    let descriptors = proto_descriptor_set(&dir)?;
    let descriptors_arg = descriptors.display().to_string();
    // 300 random records of every Avro type, 100 Protobuf orders, 100 JSON orders.
    let every = sluice_tests::registry::confluent_io(
        &[
            "random",
            "--schema",
            &echo_schema("every.avsc").display().to_string(),
            "--count",
            "300",
            "--seed",
            "7",
        ],
        "",
    )?;
    let every: Vec<Value> = every.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    produce_with_confluent(url, &topics[0], "avro", &echo_schema("every.avsc"), &[], &every)?;
    let protos = proto_orders(100, 42);
    produce_with_confluent(
        url,
        &topics[1],
        "protobuf",
        &descriptors,
        &["--message", "interop.Order"],
        &protos,
    )?;
    let jsons = json_orders(100);
    produce_with_confluent(url, &topics[2], "json", &echo_schema("order.json"), &[], &jsons)?;
    let keyed: Vec<Value> = json_orders(200)
        .into_iter()
        .enumerate()
        .map(|(i, mut r)| {
            r["key"] = json!({"id": format!("j-{i}"), "shard": (i % 7) as i64 - 3});
            r
        })
        .collect();
    let key_schema = echo_schema("order-key.avsc").display().to_string();
    let keyed_args = ["--key-format", "avro", "--key-schema", key_schema.as_str()];
    produce_with_confluent(url, &keyed_in, "json", &echo_schema("order.json"), &keyed_args, &keyed)?;

    let name = unique_name("echo");
    let mut sources: Vec<(&str, &str)> = names[..3]
        .iter()
        .copied()
        .zip(topics[..3].iter().map(String::as_str))
        .collect();
    sources.push(("keyed_in", &keyed_in));
    let mut sinks: Vec<(&str, &str)> = names[3..]
        .iter()
        .copied()
        .zip(topics[3..].iter().map(String::as_str))
        .collect();
    sinks.push(("keyed_out", &keyed_out));
    let m = dir.write("echo.toml", &manifest(&name, &guest(component), &sources, &sinks, ""));
    let state = dir.path().join("state");
    let metrics = free_port();
    let metrics_at = format!("127.0.0.1:{metrics}");
    let mut args = vec![
        "--topology".to_string(),
        m.display().to_string(),
        "--state-dir".to_string(),
        state.display().to_string(),
        "--schema-registry-url".to_string(),
        url.to_string(),
        "--metrics".to_string(),
        metrics_at,
    ];
    if component.starts_with("python/") {
        // Python components compile once per test run, into a cache the workers share.
        args.extend(shared_compile_cache());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut worker = WorkerProcess::start(kafka().bootstrap(), dir.path(), &args)?;
    for (i, n) in [(0, every.len()), (1, protos.len()), (2, jsons.len())] {
        kafka()
            .consume(&topics[3 + i], n, Duration::from_secs(120))
            .await
            .map_err(|e| anyhow::anyhow!("{}: {e}\n{}", names[3 + i], worker.log()))?;
    }
    let keyed_framed = kafka()
        .consume(&keyed_out, keyed.len(), Duration::from_secs(120))
        .await
        .map_err(|e| anyhow::anyhow!("keyed_out: {e}\n{}", worker.log()))?;
    // Each schema once per worker: each writer schema id the inputs carry fetched, each of
    // the five sink subjects registered, for 700 records on eight tasks.
    let mut ids = std::collections::BTreeSet::new();
    for topic in topics[..3].iter().chain([&keyed_in]) {
        for r in kafka().read_all(topic, Duration::from_secs(30))? {
            for framed in [r.key.as_deref(), r.value.as_deref()].into_iter().flatten() {
                if framed.first() == Some(&0) && framed.len() >= 5 {
                    ids.insert(u32::from_be_bytes(framed[1..5].try_into().unwrap()));
                }
            }
        }
    }
    let text = http_get(metrics, "/metrics")?;
    let requests = text
        .lines()
        .find(|l| l.starts_with("sluice_schema_registry_requests_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert_eq!(
        requests,
        Some((ids.len() + 5) as f64),
        "requests to the registry for the writer ids {ids:?} and five sink subjects:\n{text}"
    );
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    // Each topic read back by confluent-kafka's deserializer of its format, in and out.
    let by_key = |records: Vec<Value>| -> BTreeMap<String, Value> {
        records
            .into_iter()
            .map(|r| (r["key"].as_str().unwrap().to_string(), r["value"].clone()))
            .collect()
    };
    for (i, format, extra) in [
        (0, "avro", vec![]),
        (
            1,
            "protobuf",
            vec!["--schema", descriptors_arg.as_str(), "--message", "interop.Order"],
        ),
        (2, "json", vec![]),
    ] {
        let count = [every.len(), protos.len(), jsons.len()][i];
        let wrote = by_key(consume_with_confluent(url, &topics[i], format, count, &extra)?);
        let read = by_key(consume_with_confluent(url, &topics[3 + i], format, count, &extra)?);
        assert_eq!(read.len(), count, "{format}: every record once");
        for (key, value) in &wrote {
            assert_eq!(
                read.get(key),
                Some(value),
                "{format} record {key}: what {component} wrote differs from what it read"
            );
        }
    }
    // Avro keys: read back as they were written, each on the partition Java's producer picks
    // for its framed bytes.
    let args = ["--key-format", "avro"];
    let read: BTreeMap<String, Value> = consume_with_confluent(url, &keyed_out, "json", keyed.len(), &args)?
        .into_iter()
        .map(|r| (r["key"].to_string(), r["value"].clone()))
        .collect();
    let want: BTreeMap<String, Value> = keyed
        .iter()
        .map(|r| (r["key"].to_string(), r["value"].clone()))
        .collect();
    assert_eq!(read, want, "JSON orders with Avro keys, through {component}");
    let framed_keys: Vec<Vec<u8>> = keyed_framed.iter().map(|r| r.key.clone().unwrap()).collect();
    let reference = unique_name("interop-keyed-java");
    kafka().create_topic(&reference, 5).await?;
    let java = kafka().produce_with_java(&reference, &framed_keys)?;
    let used: std::collections::BTreeSet<i32> = keyed_framed.iter().map(|r| r.partition).collect();
    assert_eq!(used.len(), 5, "the keys cover every partition of {keyed_out}: {used:?}");
    for r in &keyed_framed {
        assert_eq!(
            java.get(r.key.as_ref().unwrap()),
            Some(&r.partition),
            "the framed Avro key {:02x?} is on partition {}, not where Java's partitioner puts it",
            r.key,
            r.partition
        );
    }
    // What confluent-kafka wrote for Avro is what the test generated, value for value.
    let generated = by_key(every);
    let wrote = by_key(consume_with_confluent(url, &topics[3], "avro", generated.len(), &[])?);
    assert_eq!(
        wrote, generated,
        "the records of every Avro type, through {component}, as generated"
    );
    Ok(())
}

// --- The CLI -------------------------------------------------------------------------------------

/// Runs `sluice ARGS` with `input` on stdin: its stdout (it must succeed) or its error text.
fn sluice(args: &[&str], input: &str) -> Result<String, String> {
    use std::io::Write as _;
    let mut child = std::process::Command::new(sluice_tests::worker::sluice_binary())
        .args(args)
        .env("KAFKA_BOOTSTRAP", kafka().bootstrap())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `sluice consume`'s lines as (key, value JSON).
fn consumed(text: &str) -> Vec<(String, Value)> {
    text.lines()
        .map(|l| {
            let (head, value) = l.split_once('\t').expect("key<TAB>value");
            let key = head.split_once(' ').map(|(_, k)| k).unwrap_or_default().to_string();
            (
                key,
                serde_json::from_str(value).unwrap_or_else(|e| panic!("{value}: {e}")),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn sluice_produce_and_consume_speak_avro_protobuf_and_json_schema_with_confluents_serializers(
) -> anyhow::Result<()> {
    let url = registry();
    let dir = TempDir::new("cli-formats");
    // Avro: `sluice produce` registers TOPIC-value and frames; confluent-kafka reads it.
    let topic = unique_name("cli-avro");
    kafka().create_topic(&topic, 1).await?;
    let orders = [
        json!({"id": "o1", "customer": "c1", "amount": 2.5, "quantity": 3, "placed": 1_733_500_000_000i64, "note": null}),
        json!({"id": "o2", "customer": "c2", "amount": 1.25, "quantity": 1, "placed": 1_733_500_000_001i64, "note": "fast"}),
    ];
    let lines: String = orders.iter().enumerate().map(|(i, o)| format!("k{i}\t{o}\n")).collect();
    let order_avsc = schema_file("order.avsc").display().to_string();
    sluice(
        &[
            "produce",
            "--value-format",
            "avro",
            "--registry",
            url,
            "--schema",
            &order_avsc,
            &topic,
        ],
        &lines,
    )
    .map_err(anyhow::Error::msg)?;
    let read = consume_with_confluent(url, &topic, "avro", 2, &[])?;
    for (r, o) in read.iter().zip(&orders) {
        let v = &r["value"];
        assert_eq!(
            (&v["id"], &v["customer"], &v["quantity"], &v["note"]),
            (&o["id"], &o["customer"], &o["quantity"], &o["note"])
        );
        assert_eq!(
            v["placed"]["$timestamp_us"].as_i64(),
            o["placed"].as_i64().map(|ms| ms * 1000)
        );
    }
    // … and `sluice consume` prints it back as the plain JSON it was given.
    let printed = sluice(
        &[
            "consume",
            "--value-format",
            "avro",
            "--registry",
            url,
            "--idle",
            "3s",
            &topic,
        ],
        "",
    )
    .map_err(anyhow::Error::msg)?;
    let printed = consumed(&printed);
    assert_eq!(
        printed.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>(),
        orders.to_vec()
    );
    assert_eq!(printed[0].0, "k0");
    // A line that does not fit the schema is refused, naming the line and the field.
    let e = sluice(
        &[
            "produce",
            "--value-format",
            "avro",
            "--registry",
            url,
            "--schema",
            &order_avsc,
            &topic,
        ],
        "k\t{\"id\":\"x\"}\n",
    )
    .unwrap_err();
    assert!(e.contains("line 1") && e.contains("customer"), "{e}");

    // Protobuf: what confluent-kafka's serializer wrote (its schema registered as a
    // descriptor), printed by `sluice consume` in Protobuf's JSON mapping.
    let descriptors = proto_descriptor_set(&dir)?;
    let topic = unique_name("cli-proto");
    kafka().create_topic(&topic, 1).await?;
    let protos = proto_orders(3, 9);
    produce_with_confluent(
        url,
        &topic,
        "protobuf",
        &descriptors,
        &["--message", "interop.Order"],
        &protos,
    )?;
    let printed = consumed(
        &sluice(
            &[
                "consume",
                "--value-format",
                "protobuf",
                "--registry",
                url,
                "--idle",
                "3s",
                &topic,
            ],
            "",
        )
        .map_err(anyhow::Error::msg)?,
    );
    assert_eq!(printed.len(), 3);
    for ((_, v), p) in printed.iter().zip(&protos) {
        assert_eq!(v["id"], p["value"]["id"], "{v}");
        assert_eq!(
            v["tags"].as_array().map(Vec::len).unwrap_or(0),
            p["value"]["tags"].as_array().unwrap().len(),
            "{v}"
        );
    }
    // And `sluice produce --value-format protobuf` (the .proto text registered) is read by
    // confluent-kafka's deserializer.
    let topic = unique_name("cli-proto-out");
    kafka().create_topic(&topic, 1).await?;
    let proto_file = echo_schema("order.proto").display().to_string();
    sluice(
        &["produce", "--value-format", "protobuf", "--registry", url, "--schema", &proto_file, "--message", "interop.Order", &topic],
        "k\t{\"id\":\"p1\",\"quantity\":4,\"tags\":[\"x\"],\"status\":\"PAID\",\"lines\":[{\"sku\":\"s\",\"count\":\"2\"}]}\n",
    )
    .map_err(anyhow::Error::msg)?;
    let descriptors_arg = descriptors.display().to_string();
    let read = consume_with_confluent(
        url,
        &topic,
        "protobuf",
        1,
        &["--schema", &descriptors_arg, "--message", "interop.Order"],
    )?;
    let v = &read[0]["value"];
    assert_eq!(
        (v["id"].as_str(), v["quantity"].as_i64(), v["status"].as_str()),
        (Some("p1"), Some(4), Some("PAID")),
        "{v}"
    );
    assert_eq!(v["lines"][0]["count"].as_str(), Some("2"), "{v}");

    // JSON Schema: validated on the way out, the reason naming the place.
    let topic = unique_name("cli-json");
    kafka().create_topic(&topic, 1).await?;
    let json_schema = echo_schema("order.json").display().to_string();
    sluice(
        &[
            "produce",
            "--value-format",
            "json-schema",
            "--registry",
            url,
            "--schema",
            &json_schema,
            &topic,
        ],
        "k\t{\"id\":\"j1\",\"amount\":2}\n",
    )
    .map_err(anyhow::Error::msg)?;
    let e = sluice(
        &[
            "produce",
            "--value-format",
            "json-schema",
            "--registry",
            url,
            "--schema",
            &json_schema,
            &topic,
        ],
        "k\t{\"id\":\"j2\",\"amount\":-1}\n",
    )
    .unwrap_err();
    assert!(e.contains("/amount"), "{e}");
    let read = consume_with_confluent(url, &topic, "json", 1, &["--schema", &json_schema])?;
    assert_eq!(read[0]["value"], json!({"id": "j1", "amount": 2}));
    let printed = consumed(
        &sluice(
            &[
                "consume",
                "--value-format",
                "json-schema",
                "--registry",
                url,
                "--idle",
                "3s",
                &topic,
            ],
            "",
        )
        .map_err(anyhow::Error::msg)?,
    );
    assert_eq!(printed, vec![("k".to_string(), json!({"id": "j1", "amount": 2}))]);
    // Without a registry, a format is refused up front.
    let e = sluice(&["consume", "--value-format", "avro", "--idle", "1s", &topic], "").unwrap_err();
    assert!(e.contains("--schema-registry-url"), "{e}");
    Ok(())
}

// --- Uploads ------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_whose_sink_schema_the_registry_would_refuse_is_refused_with_its_reasons() -> anyhow::Result<()> {
    let url = registry();
    let dir = TempDir::new("upload-schema");
    let (input, output) = (unique_name("up-in"), unique_name("up-out"));
    kafka().create_topic(&input, 1).await?;
    kafka().create_topic(&output, 1).await?;
    // The output's subject already holds an EnrichedOrder of other fields, and takes only
    // versions that can read what is there (BACKWARD).
    let subject = format!("{output}-value");
    let existing =
        r#"{"type":"record","name":"EnrichedOrder","namespace":"shop","fields":[{"name":"sku","type":"string"}]}"#;
    client(url).register(&subject, SchemaKind::Avro, existing, &[]).await?;
    let port: u16 = url
        .split(':')
        .nth(2)
        .and_then(|p| p.split('/').next())
        .unwrap()
        .parse()?;
    let path = format!(
        "{}/config/{subject}",
        url.splitn(4, '/').nth(3).map(|p| format!("/{p}")).unwrap()
    );
    let (status, body) = sluice_tests::http(
        port,
        "PUT",
        &path,
        &[("content-type", "application/vnd.schemaregistry.v1+json")],
        br#"{"compatibility":"BACKWARD"}"#,
    )?;
    anyhow::ensure!(status == 200, "setting the subject's compatibility: {status} {body}");
    let admin = free_port();
    let cluster = unique_name("upc");
    let mut worker = crate::registry::worker(&dir, &cluster, 0, admin, &["--schema-registry-url", url])?;
    worker.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let name = unique_name("upenrich");
    let m = dir.write(
        "up.toml",
        &crate::registry::manifest(&name, &[("orders", &input)], &[("enriched", &output)], ""),
    );
    let (ok, _, err) = crate::registry::deploy(admin, &guest("avro-enrich"), &m)?;
    assert!(!ok, "refused");
    assert!(err.contains("bad-schema") && err.contains(&subject), "{err}");
    assert!(!crate::registry::listed(admin)?.contains_key(&name), "nothing stored");
    // Under a subject of its own the same upload goes through.
    let m = dir.write(
        "up2.toml",
        &crate::registry::manifest(
            &name,
            &[("orders", &input)],
            &[("enriched", &output)],
            "[formats]\nsubject-name-strategy = \"topic-record\"\n",
        ),
    );
    let (ok, out, err) = crate::registry::deploy(admin, &guest("avro-enrich"), &m)?;
    assert!(ok, "{out}{err}\n{}", worker.log());
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    Ok(())
}
