//! `sluice-bench avro`: an Avro pipeline behind a Schema Registry — orders in the Confluent
//! wire format read, enriched, filtered and written as Avro (`guests/avro-enrich`) — beside
//! the same pipeline in Kafka Streams with Avro's Java library and the same framing and
//! registry (`bench/kafka-streams`, `AvroEnrich`), on the same broker and input, in one run;
//! and the decode and encode cost per record on their own: the host's resolution plan, the
//! guest's `serde_avro_fast` (with the enrichment and the boundary), Java's
//! `GenericDatumReader`/`GenericDatumWriter`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;
use sluice::formats::avro::{Limits, Plan};
use sluice::formats::{framing, json_io, Declared, Parsed, RegistryClient, RegistrySettings};
use sluice_guest::wire::Writer;
use sluice_guest::TaskInfo;
use sluice_wire::{Schema, SchemaKind};

use crate::state::{compare, create, produce_all, Contender};

#[derive(Args)]
pub struct AvroArgs {
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    bootstrap: String,
    /// The Schema Registry (what a Confluent client takes as `url`).
    #[arg(long, env = "SCHEMA_REGISTRY_URL")]
    registry: String,
    /// The Avro enrichment component (`guests/avro-enrich`).
    #[arg(long)]
    component: PathBuf,
    /// Its schemas' folder (`guests/avro-enrich/schemas`; `order.avsc`, the version-1
    /// writer, from `guests/dsl-avro-orders/schemas`).
    #[arg(long)]
    schemas: PathBuf,
    /// Orders in the input (4 partitions).
    #[arg(long, default_value_t = 1_000_000)]
    orders: usize,
    /// `v2`: the orders are written with the reader's own schema (the plan only checks
    /// them); `v1`: with the older writer schema, resolved to the reader's (a field added).
    #[arg(long, default_value = "v2")]
    writer: String,
    /// Class path of bench/kafka-streams: the same pipeline in Kafka Streams too.
    #[arg(long)]
    kafka_streams_classpath: Option<String>,
    /// Runs of each system, alternating; the median is reported.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
}

fn order(i: usize, v2: bool) -> serde_json::Value {
    let mut o = json!({
        "id": format!("o-{i:08}"),
        "customer": format!("customer-{}", i % 5_000),
        "amount": (i % 977) as f64 * 0.75,
        "quantity": (i % 5) as i64,
        "placed": 1_733_500_000_000i64 + i as i64,
        "note": if i.is_multiple_of(3) { serde_json::Value::Null } else { json!("leave at the door") },
    });
    if v2 {
        o["channel"] = json!(if i.is_multiple_of(2) { "web" } else { "app" });
    }
    o
}

pub async fn run(args: AvroArgs) -> anyhow::Result<()> {
    let v2 = match args.writer.as_str() {
        "v2" => true,
        "v1" => false,
        other => anyhow::bail!("--writer {other:?}: v1 or v2"),
    };
    let reader_path = args.schemas.join("order-v2.avsc");
    let enriched_path = args.schemas.join("enriched-order.avsc");
    let writer_path = if v2 {
        reader_path.clone()
    } else {
        args.schemas.join("../../dsl-avro-orders/schemas/order.avsc")
    };
    let read = |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()));
    let writer = Arc::new(Declared::parse(&Schema::avro(read(&writer_path)?)).map_err(anyhow::Error::msg)?);
    let reader = Declared::parse(&Schema::avro(read(&reader_path)?)).map_err(anyhow::Error::msg)?;
    let enriched = Declared::parse(&Schema::avro(read(&enriched_path)?)).map_err(anyhow::Error::msg)?;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let input = format!("bench-avro-in-{id}");
    create(&args.bootstrap, &input, 4, false).await?;
    let client = RegistryClient::new(RegistrySettings {
        url: args.registry.clone(),
        timeout: Duration::from_secs(10),
        ..Default::default()
    })
    .map_err(anyhow::Error::msg)?;
    let schema_id = client
        .register(&format!("{input}-value"), SchemaKind::Avro, &writer.schema.text, &[])
        .await?;
    // The orders, as a Confluent serializer frames them (encoded once each here).
    let started = Instant::now();
    let framed: Vec<Vec<u8>> = (0..args.orders)
        .map(|i| {
            let payload = json_io::from_json(&writer, &order(i, v2)).expect("an order of the schema");
            let mut out = Vec::with_capacity(payload.len() + 5);
            framing::write_header(schema_id, &mut out);
            out.extend_from_slice(&payload);
            out
        })
        .collect();
    let bytes: usize = framed.iter().map(Vec::len).sum();
    produce_all(
        &args.bootstrap,
        &input,
        framed
            .iter()
            .enumerate()
            .map(|(i, v)| (format!("o-{i}").into_bytes(), v.clone())),
    )?;
    println!(
        "avro benchmark: {} orders ({:.0} bytes each, framed) written with the {} schema (id {schema_id}) on 4 \
         partitions in {:.1} s; read with order-v2.avsc, enriched, those of quantity 0 (a fifth) dropped, written as \
         EnrichedOrder",
        args.orders,
        bytes as f64 / args.orders as f64,
        if v2 { "reader's own" } else { "older (version 1)" },
        started.elapsed().as_secs_f64()
    );
    costs(&args, &framed, &writer, &reader, &enriched)?;
    // Both systems against the same registry; the worker takes it from the environment.
    std::env::set_var("SLUICE_SCHEMA_REGISTRY_URL", &args.registry);
    let mut systems = vec![Contender::sluice("sluice", &args.component, ("orders", "enriched"), 0)];
    let (reader_arg, enriched_arg) = (reader_path.display().to_string(), enriched_path.display().to_string());
    if let Some(cp) = &args.kafka_streams_classpath {
        systems.push(Contender::streams(
            "kafka streams",
            cp,
            "AvroEnrich",
            &[&args.registry, &reader_arg, &enriched_arg],
            0,
        ));
    }
    let outputs = tokio::task::block_in_place(|| {
        compare(
            &args.bootstrap,
            &input,
            4,
            (args.orders, args.orders, "orders"),
            args.rounds,
            &systems,
            &[("sluice", "kafka streams")],
        )
    })?;
    // The figures count only if every run wrote the same records: each key's Avro payloads
    // after the framing (Avro binary is one encoding per value), the first run's the truth.
    let mut truth: Option<(String, Written)> = None;
    for (system, topic) in &outputs {
        let written = tokio::task::block_in_place(|| written(&args.bootstrap, topic))?;
        match &truth {
            None => truth = Some((format!("{system} ({topic})"), written)),
            Some((first, want)) => {
                if let Some(difference) = differ(want, &written) {
                    anyhow::bail!("{system} ({topic}) wrote other records than {first}: {difference}");
                }
            }
        }
    }
    if let Some((_, want)) = &truth {
        println!(
            "  outputs: each of the {} runs wrote the same {} records (keys and Avro payloads, record for record)",
            outputs.len(),
            want.values().map(Vec::len).sum::<usize>()
        );
    }
    if let Some(cp) = &args.kafka_streams_classpath {
        java_costs(&args, cp, &framed, &reader_arg, &enriched_arg)?;
    }
    Ok(())
}

/// What a run wrote: each key's payloads (the bytes after the Confluent framing), sorted.
type Written = BTreeMap<Vec<u8>, Vec<Vec<u8>>>;

/// Reads `topic` from its start to its end.
fn written(bootstrap: &str, topic: &str) -> anyhow::Result<Written> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("bench-avro-check-{topic}"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions = metadata.topics().first().map_or(0, |t| t.partitions().len() as i32);
    let mut assignment = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for p in 0..partitions {
        let (low, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        if high > low {
            assignment.add_partition_offset(topic, p, Offset::Beginning)?;
            ends.insert(p, high);
        }
    }
    consumer.assign(&assignment)?;
    let mut out = Written::new();
    let check = crate::deadline("reading an output back", Duration::from_secs(300));
    while !ends.is_empty() {
        check()?;
        let Some(message) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let message = message?;
        let value = message.payload().unwrap_or_default();
        anyhow::ensure!(
            value.len() >= 5 && value[0] == 0,
            "{topic}/{}@{}: not in the Confluent wire format",
            message.partition(),
            message.offset()
        );
        out.entry(message.key().unwrap_or_default().to_vec())
            .or_default()
            .push(value[5..].to_vec());
        if ends
            .get(&message.partition())
            .is_some_and(|end| message.offset() + 1 >= *end)
        {
            ends.remove(&message.partition());
        }
    }
    for payloads in out.values_mut() {
        payloads.sort();
    }
    Ok(out)
}

/// The first key whose records differ between `want` and `got`, said.
fn differ(want: &Written, got: &Written) -> Option<String> {
    let count = |w: &Written| w.values().map(Vec::len).sum::<usize>();
    if count(want) != count(got) {
        return Some(format!("{} records instead of {}", count(got), count(want)));
    }
    want.iter().chain(got.iter()).find_map(|(key, _)| {
        (want.get(key) != got.get(key)).then(|| {
            format!(
                "key {:?}: {} record(s) instead of {}, or other bytes",
                String::from_utf8_lossy(key),
                got.get(key).map_or(0, Vec::len),
                want.get(key).map_or(0, Vec::len)
            )
        })
    })
}

/// Decode and encode on their own, per record: the host's plan over the framed payloads,
/// its check of what the guest writes, and the guest's whole call.
fn costs(
    args: &AvroArgs,
    framed: &[Vec<u8>],
    writer: &Declared,
    reader: &Declared,
    enriched: &Declared,
) -> anyhow::Result<()> {
    // A thousand distinct records, each read many times: the cost of reading one, not of
    // fetching it from memory (what a published figure for a decoder measures too).
    let sample = &framed[..framed.len().min(1_000)];
    const REPEAT: usize = 500;
    let (Parsed::Avro(w), Parsed::Avro(r), Parsed::Avro(e)) = (&writer.parsed, &reader.parsed, &enriched.parsed) else {
        anyhow::bail!("Avro schemas");
    };
    let plan = Plan::compile(w, r).map_err(anyhow::Error::msg)?;
    let limits = Limits::default();
    let mut scratch = Vec::new();
    let mut reader_form: Vec<Vec<u8>> = Vec::with_capacity(sample.len());
    let t = Instant::now();
    for _ in 0..REPEAT {
        for f in sample {
            let read = plan
                .run(&f[5..], &mut scratch, &limits)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            std::hint::black_box(read);
        }
    }
    let plan_ns = t.elapsed().as_nanos() as f64 / (REPEAT * sample.len()) as f64;
    for f in sample {
        reader_form.push(
            plan.run(&f[5..], &mut scratch, &limits)
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .to_vec(),
        );
    }
    // What the guest writes, checked as the host checks a sink's records.
    let enriched_json: Vec<serde_json::Value> = (0..1_000)
        .map(|i| json!({"id": format!("o-{i:08}"), "customer": "customer-1", "total": i as f64, "large": i > 100, "channel": "web", "placed": 1_733_500_000_000i64}))
        .collect();
    let written: Vec<Vec<u8>> = enriched_json
        .iter()
        .map(|j| json_io::from_json(enriched, j).expect("an enriched order"))
        .collect();
    let check = Plan::check(e);
    let t = Instant::now();
    let rounds = REPEAT;
    for _ in 0..rounds {
        for w in &written {
            check.check_bytes(w, &limits).map_err(|e| anyhow::anyhow!("{e}"))?;
        }
    }
    let check_ns = t.elapsed().as_nanos() as f64 / (rounds * written.len()) as f64;
    println!(
        "  host, per record: {plan_ns:.0} ns to read an order ({}), {check_ns:.0} ns to check an enriched one \
         before it is framed",
        if plan.is_identity() {
            "checked, handed over as it came"
        } else {
            "resolved to the reader's schema"
        }
    );
    // The guest: decode (serde_avro_fast), enrich, encode, and the boundary, in batches of 500.
    let runtime = sluice::runtime::Runtime::new(&sluice::runtime::RuntimeConfig::default())?;
    let topology = runtime.load(&args.component)?;
    let mut instance = topology.instantiate_in_memory("bench")?;
    instance.init(&TaskInfo {
        topology: "bench".into(),
        subtopology: "bench".into(),
        task_id: "bench/0".into(),
        partition: 0,
        source_topics: vec!["in".into()],
        sink_topics: vec!["out".into()],
    })?;
    let batches: Vec<Vec<u8>> = reader_form
        .chunks(500)
        .map(|chunk| {
            let mut w = Writer::new();
            for (i, v) in chunk.iter().enumerate() {
                w.push_input(Some(b"k"), Some(v), 0, 0, 0, i as i64, std::iter::empty());
            }
            w.take()
        })
        .collect();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..REPEAT / 5 {
            for b in &batches {
                let out = instance.process(b).map_err(|e| anyhow::anyhow!("{e}"))?;
                std::hint::black_box(out);
                instance.end_call(true);
            }
        }
        best = best.min(t.elapsed().as_nanos() as f64 / (REPEAT / 5 * reader_form.len()) as f64);
    }
    println!(
        "  guest (Wasm), per record: {best:.0} ns to decode an order with serde_avro_fast, enrich it and encode the \
         result (the call's boundary included; batches of 500, best of 3)"
    );
    Ok(())
}

/// Java's decode (resolving) and encode per record, timed by the peer's `--micro` mode.
fn java_costs(
    args: &AvroArgs,
    classpath: &str,
    framed: &[Vec<u8>],
    reader: &str,
    enriched: &str,
) -> anyhow::Result<()> {
    let file = std::env::temp_dir().join(format!("sluice-bench-avro-{}.bin", uuid::Uuid::new_v4().simple()));
    let mut all = Vec::new();
    for f in framed.iter().take(1_000) {
        all.extend_from_slice(&(f.len() as u32).to_be_bytes());
        all.extend_from_slice(f);
    }
    std::fs::write(&file, &all)?;
    let out = std::process::Command::new("java")
        .args([
            "-Xmx1g",
            "-cp",
            classpath,
            "dev.sluice.bench.AvroEnrich",
            "--micro",
            "1000000",
        ])
        .arg(&args.registry)
        .args([reader, enriched])
        .arg(&file)
        .output()?;
    let _ = std::fs::remove_file(&file);
    if !out.status.success() {
        anyhow::bail!(
            "the Java micro-benchmark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    print!("  {}", String::from_utf8_lossy(&out.stdout));
    Ok(())
}
