//! State benchmarks on a real broker: restoring a store from its changelog, and word count
//! end to end.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use sluice::state::engine::Storage;
use sluice::state::restore::ChangelogReader;
use sluice::state::rocks::{RocksStorage, SharedMemory};

#[derive(Args)]
pub struct RestoreArgs {
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    bootstrap: String,
    #[arg(long, default_value_t = 1_000_000)]
    keys: usize,
    #[arg(long, default_value_t = 100)]
    size: usize,
}

#[derive(Args)]
pub struct WordCountArgs {
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    bootstrap: String,
    /// The two-stage word-count component (`guests/word-totals`).
    #[arg(long)]
    component: PathBuf,
    /// Input lines of five words each.
    #[arg(long, default_value_t = 200_000)]
    lines: usize,
    /// Class path of bench/kafka-streams: when given, the same count runs on Kafka Streams
    /// too (its DSL: flatMap, repartition by word, groupByKey, count), alternating with Sluice.
    #[arg(long)]
    kafka_streams_classpath: Option<String>,
    /// Runs of each system, alternating; the median is reported.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// The word count written with the SDK's stream DSL (`guests/dsl-word-count`): when
    /// given, it runs too, against Kafka Streams' DSL word count as its users write it
    /// (flatMap, groupByKey: a repartition topic of the input's partition count, count).
    #[arg(long)]
    dsl_component: Option<PathBuf>,
    /// The same word count written with the Python SDK's DSL
    /// (`$CARGO_TARGET_DIR/python-guests/dsl-word-count.wasm`): when given, it runs beside
    /// the Rust DSL one and Kafka Streams'. It is compiled once before the first round, into
    /// the compile cache its workers read (what a restarted worker has).
    #[arg(long)]
    python_dsl_component: Option<PathBuf>,
}

#[derive(Args)]
pub struct WindowedCountArgs {
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    bootstrap: String,
    /// The DSL windowed count (`guests/dsl-windowed-count`).
    #[arg(long)]
    component: PathBuf,
    /// Events, keyed by one of `--users`, a millisecond of event time apart.
    #[arg(long, default_value_t = 1_000_000)]
    events: usize,
    #[arg(long, default_value_t = 10_000)]
    users: usize,
    /// Class path of bench/kafka-streams: when given, Kafka Streams' DSL windowed count
    /// (groupByKey, windowedBy, count) runs too, alternating with Sluice.
    #[arg(long)]
    kafka_streams_classpath: Option<String>,
    #[arg(long, default_value_t = 1)]
    rounds: usize,
}

#[derive(Debug, Args)]
pub struct RepartitionArgs {
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    bootstrap: String,
    /// The two-stage word-count component (`guests/word-totals`).
    #[arg(long)]
    component: PathBuf,
    /// Input lines of five words each (every word goes through the repartition topic).
    #[arg(long, default_value_t = 2_000_000)]
    lines: usize,
    /// The worker's `--repartition-purge-interval`.
    #[arg(long, default_value = "30s")]
    purge_interval: String,
}

fn config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap);
    c
}

pub(crate) async fn create(bootstrap: &str, topic: &str, partitions: i32, compact: bool) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = config(bootstrap).create()?;
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    if compact {
        new = new.set("cleanup.policy", "compact");
    }
    for r in admin.create_topics([&new], &AdminOptions::new()).await? {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    Ok(())
}

pub(crate) fn produce_all(
    bootstrap: &str,
    topic: &str,
    records: impl Iterator<Item = (Vec<u8>, Vec<u8>)>,
) -> anyhow::Result<usize> {
    produce_stamped(bootstrap, topic, records.map(|(k, v)| (k, v, None)))
}

/// As [`produce_all`], each record with its timestamp (none: the time it is sent).
fn produce_stamped(
    bootstrap: &str,
    topic: &str,
    records: impl Iterator<Item = (Vec<u8>, Vec<u8>, Option<i64>)>,
) -> anyhow::Result<usize> {
    let producer: ThreadedProducer<DefaultProducerContext> = config(bootstrap)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let mut n = 0;
    for (key, value, timestamp) in records {
        let mut record = BaseRecord::<_, _, ()>::to(topic).key(&key).payload(&value);
        if let Some(ts) = timestamp {
            record = record.timestamp(ts);
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => bail!("producing to {topic}: {e}"),
            }
        }
        n += 1;
    }
    producer.flush(Duration::from_secs(120))?;
    Ok(n)
}

pub async fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("bench-changelog-{id}");
    create(&args.bootstrap, &topic, 1, true).await?;
    let value = vec![b'v'; args.size];
    let keys = args.keys;
    produce_all(
        &args.bootstrap,
        &topic,
        (0..keys).map(|i| (format!("key-{i:010}").into_bytes(), value.clone())),
    )?;
    let dir = std::env::temp_dir().join(format!("sluice-bench-restore-{id}"));
    let db = RocksStorage::new(SharedMemory::new(64 << 20, 64 << 20)).open(&dir)?;
    let mut reader = ChangelogReader::new(&sluice::kafka::KafkaSettings::new(args.bootstrap.as_str()), &topic, 0)
        .map_err(anyhow::Error::msg)?;
    let began = Instant::now();
    let progress = reader
        .restore_into(&*db, "", &|| false, |_| {})
        .map_err(anyhow::Error::msg)?
        .expect("never asked to stop");
    // Until its flush is done the restored state is not durable: that is part of the cost.
    db.flush(true)?;
    let s = began.elapsed().as_secs_f64();
    println!(
        "restore benchmark: a changelog of {keys} keys with {}-byte values, into a fresh RocksDB",
        args.size
    );
    println!(
        "  restored {} records in {s:.2} s: {:>10.0} records/s, {:.1} MB/s",
        progress.restored,
        progress.restored as f64 / s,
        progress.bytes as f64 / 1e6 / s
    );
    if progress.restored as usize != keys {
        bail!("restored {} of {keys} records", progress.restored);
    }
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

pub async fn word_count(args: WordCountArgs) -> anyhow::Result<()> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let input = format!("bench-wc-in-{id}");
    create(&args.bootstrap, &input, 4, false).await?;
    let lines = args.lines;
    let words = lines * 5;
    produce_all(
        &args.bootstrap,
        &input,
        (0..lines).map(|i| {
            let line: Vec<String> = (0..5)
                .map(|j| format!("w{}", (i * 7 + j * 131 + i / 3) % 1000))
                .collect();
            (format!("line-{i}").into_bytes(), line.join(" ").into_bytes())
        }),
    )?;
    println!(
        "word-count benchmark: {lines} lines ({words} words) on 4 partitions, counted in two stages through a \
         repartition topic, one process per system"
    );
    let streams = args.kafka_streams_classpath.as_deref();
    // The Processor API word count (`word-totals`, 8 repartition partitions) and Kafka
    // Streams repartitioning into as many.
    let mut systems = vec![Contender::sluice(
        "sluice",
        &args.component,
        ("lines", "counts"),
        REPARTITION,
    )];
    if let Some(cp) = streams {
        systems.push(Contender::streams(
            "kafka streams",
            cp,
            "WordTotals",
            &[&REPARTITION.to_string()],
            REPARTITION,
        ));
    }
    let counted = (lines, words, "words");
    compare(
        &args.bootstrap,
        &input,
        4,
        counted,
        args.rounds,
        &systems,
        &[("sluice", "kafka streams")],
    )?;
    // The DSL word count (a repartition topic of the input's partition count) and Kafka
    // Streams' groupByKey, which does the same.
    if args.dsl_component.is_some() || args.python_dsl_component.is_some() {
        let mut systems = Vec::new();
        if let Some(dsl) = &args.dsl_component {
            systems.push(Contender::sluice("sluice dsl", dsl, ("lines", "totals"), 4));
        }
        if let Some(python) = &args.python_dsl_component {
            systems.push(Contender::sluice("sluice py dsl", python, ("lines", "totals"), 4));
        }
        if let Some(cp) = streams {
            systems.push(Contender::streams("streams dsl", cp, "WordTotals", &["0"], 4));
        }
        compare(
            &args.bootstrap,
            &input,
            4,
            counted,
            args.rounds,
            &systems,
            &[
                ("sluice dsl", "streams dsl"),
                ("sluice py dsl", "streams dsl"),
                ("sluice py dsl", "sluice dsl"),
            ],
        )?;
    }
    Ok(())
}

/// Events counted per user in tumbling windows of a minute: Sluice's DSL against Kafka
/// Streams' DSL (groupByKey, windowedBy, count), each sending every update downstream.
pub async fn windowed_count(args: WindowedCountArgs) -> anyhow::Result<()> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let input = format!("bench-win-in-{id}");
    create(&args.bootstrap, &input, 4, false).await?;
    // Event time: an hour ago onwards, a millisecond apart (within the broker's retention).
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64
        - 3_600_000;
    let users = args.users.max(1);
    produce_stamped(
        &args.bootstrap,
        &input,
        (0..args.events).map(|i| {
            (
                format!("user-{}", (i * 7919) % users).into_bytes(),
                b"view".to_vec(),
                Some(base + i as i64),
            )
        }),
    )?;
    println!(
        "windowed-count benchmark: {} events of {users} users on 4 partitions, counted per user in tumbling \
         windows of 1 min (10 s grace), every update sent on, one process per system",
        args.events
    );
    let mut systems = vec![Contender::sluice(
        "sluice dsl",
        &args.component,
        ("events", "counts"),
        0,
    )];
    if let Some(cp) = args.kafka_streams_classpath.as_deref() {
        systems.push(Contender::streams("streams dsl", cp, "WindowedCount", &[], 0));
    }
    let counted = (args.events, args.events, "events");
    compare(
        &args.bootstrap,
        &input,
        4,
        counted,
        args.rounds,
        &systems,
        &[("sluice dsl", "streams dsl")],
    )?;
    Ok(())
}

/// A system under test: Sluice running a component, or a Kafka Streams application.
pub(crate) struct Contender {
    name: &'static str,
    kind: ContenderKind,
    /// Its source's and sink's logical names (Sluice), and its repartition topic's
    /// partitions (0: none).
    source: &'static str,
    sink: &'static str,
    repartition: i32,
}

pub(crate) enum ContenderKind {
    Sluice(PathBuf),
    Streams {
        classpath: String,
        class: &'static str,
        extra: Vec<String>,
    },
}

impl Contender {
    pub(crate) fn sluice(
        name: &'static str,
        component: &std::path::Path,
        (source, sink): (&'static str, &'static str),
        repartition: i32,
    ) -> Self {
        Contender {
            name,
            kind: ContenderKind::Sluice(component.to_path_buf()),
            source,
            sink,
            repartition,
        }
    }

    pub(crate) fn streams(
        name: &'static str,
        classpath: &str,
        class: &'static str,
        extra: &[&str],
        repartition: i32,
    ) -> Self {
        Contender {
            name,
            kind: ContenderKind::Streams {
                classpath: classpath.to_string(),
                class,
                extra: extra.iter().map(|s| s.to_string()).collect(),
            },
            source: "",
            sink: "",
            repartition,
        }
    }
}

/// Runs each system `rounds` times, alternating, over the same `input` (`partitions`, its
/// source) until its group has committed all of its `records` (and all of its repartition
/// topic), and prints each run's rate of `items` (`unit`: words, events), CPU per item and
/// peak RSS, the medians, and the ratio of each pair `(ours, peer)` that ran. Sluice's
/// workers share a compile cache, filled before the first round. Returns each run's
/// (system, output topic), for a caller that checks what they wrote.
pub(crate) fn compare(
    bootstrap: &str,
    input: &str,
    partitions: i32,
    (records, items, unit): (usize, usize, &str),
    rounds: usize,
    systems: &[Contender],
    pairs: &[(&str, &str)],
) -> anyhow::Result<Vec<(String, String)>> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let dir = std::env::temp_dir().join(format!("sluice-bench-cmp-{id}"));
    std::fs::create_dir_all(&dir)?;
    let compiled = dir.join("compiled");
    for system in systems {
        if let ContenderKind::Sluice(component) = &system.kind {
            let runtime = sluice::runtime::Runtime::new(&sluice::runtime::RuntimeConfig {
                compile_cache: Some(compiled.clone()),
                ..sluice::runtime::RuntimeConfig::default()
            })?;
            let started = Instant::now();
            let loaded = runtime
                .load(component)
                .map_err(|e| anyhow::anyhow!("{}: {e}", component.display()))?;
            println!(
                "  {:<14} compiled in {:.1} s{} ({:.1} MB component)",
                system.name,
                started.elapsed().as_secs_f64(),
                if loaded.from_cache() { " (from the cache)" } else { "" },
                std::fs::metadata(component)?.len() as f64 / 1e6
            );
        }
    }
    let runtime = tokio::runtime::Handle::current();
    let mut results: Vec<(&str, f64, u64, f64)> = Vec::new();
    let mut outputs = Vec::new();
    for round in 0..rounds.max(1) {
        for system in systems {
            let run = format!("{}-{round}-{id}", system.name.replace(' ', "-"));
            let output = format!("bench-out-{run}");
            tokio::task::block_in_place(|| runtime.block_on(create(bootstrap, &output, partitions, false)))?;
            // The group whose committed offsets say how far the system has come.
            let (group, internal, command) = match &system.kind {
                ContenderKind::Sluice(component) => {
                    let name = format!("bench-{run}");
                    let manifest = dir.join(format!("{run}.toml"));
                    std::fs::write(
                        &manifest,
                        format!(
                            "name = {name:?}\ncomponent = {:?}\n[sources]\n{} = {input:?}\n[sinks]\n{} = {output:?}\n",
                            component.display().to_string(),
                            system.source,
                            system.sink,
                        ),
                    )?;
                    let mut worker = Command::new(crate::sluice_binary()?);
                    worker
                        .args(["worker", "--bootstrap", bootstrap, "--topology"])
                        .arg(&manifest)
                        .arg("--state-dir")
                        .arg(dir.join(format!("state-{run}")))
                        .arg("--compile-cache")
                        .arg(&compiled)
                        .env("SLUICE_LOG", "warn");
                    (format!("sluice-{name}"), format!("{name}-words-repartition"), worker)
                }
                ContenderKind::Streams {
                    classpath,
                    class,
                    extra,
                } => {
                    let app = format!("bench-streams-{run}");
                    let mut streams = Command::new("java");
                    streams
                        .args(["-Xmx1g", "-cp", classpath, &format!("dev.sluice.bench.{class}")])
                        .args([bootstrap, input, &output, &app, "4"])
                        .args(extra);
                    (app.clone(), format!("{app}-words-repartition"), streams)
                }
            };
            let mut stages = vec![(input, partitions)];
            if system.repartition > 0 {
                stages.push((internal.as_str(), system.repartition));
            }
            let (s, rss, cpu) = until_committed(
                command,
                bootstrap,
                &group,
                &stages,
                records,
                &dir.join(format!("{run}.log")),
            )?;
            let out = output_records(bootstrap, &output)?;
            println!(
                "  {:<14} #{}: {:>10.0} {unit}/s, {s:.1} s from start to the last commit, peak RSS {} MB, \
                 CPU {cpu:.1} s ({:.2} µs per {}), {out} records out",
                system.name,
                round + 1,
                items as f64 / s,
                rss >> 20,
                cpu * 1e6 / items as f64,
                unit.trim_end_matches('s'),
            );
            results.push((system.name, s, rss, cpu));
            outputs.push((system.name.to_string(), output));
        }
    }
    let mut medians = BTreeMap::new();
    for system in systems {
        let runs: Vec<&(&str, f64, u64, f64)> = results.iter().filter(|r| r.0 == system.name).collect();
        let rate = median(runs.iter().map(|r| items as f64 / r.1).collect());
        let cpu = median(runs.iter().map(|r| r.3 * 1e6 / items as f64).collect());
        let rss = median(runs.iter().map(|r| r.2 as f64 / (1 << 20) as f64).collect());
        println!(
            "  {:<14} median: {rate:>10.0} {unit}/s, {cpu:.2} µs CPU per {}, peak RSS {rss:.0} MB",
            system.name,
            unit.trim_end_matches('s')
        );
        medians.insert(system.name, (rate, cpu, rss));
    }
    for (ours, peer) in pairs {
        if let (Some(a), Some(b)) = (medians.get(ours), medians.get(peer)) {
            println!(
                "  {ours} / {peer}: {:.2}x the {unit}/s, {:.2}x the CPU per {}, {:.2}x the peak RSS",
                a.0 / b.0,
                a.1 / b.1,
                unit.trim_end_matches('s'),
                a.2 / b.2
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(outputs)
}

/// Runs the two-stage word count over `lines` × 5 words and samples its repartition topic
/// every second: how many records were written to it, and how many it still holds (what
/// the purger has not deleted yet). Fails if it still holds more than its backlog at the end.
pub async fn repartition(args: RepartitionArgs) -> anyhow::Result<()> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (input, output) = (format!("bench-rp-in-{id}"), format!("bench-rp-out-{id}"));
    create(&args.bootstrap, &input, 4, false).await?;
    create(&args.bootstrap, &output, 4, false).await?;
    let words = args.lines * 5;
    println!(
        "repartition benchmark: {} lines ({words} words) through a repartition topic of {REPARTITION} partitions, \
         --repartition-purge-interval {}",
        args.lines, args.purge_interval
    );
    let produced = Instant::now();
    produce_all(
        &args.bootstrap,
        &input,
        (0..args.lines).map(|i| {
            let line: Vec<String> = (0..5)
                .map(|j| format!("w{}", (i * 7 + j * 131 + i / 3) % 1000))
                .collect();
            (format!("line-{i}").into_bytes(), line.join(" ").into_bytes())
        }),
    )?;
    println!("  produced the input in {:.1} s", produced.elapsed().as_secs_f64());
    let dir = std::env::temp_dir().join(format!("sluice-bench-rp-{id}"));
    std::fs::create_dir_all(&dir)?;
    let name = format!("bench-rp-{id}");
    let manifest = dir.join("rp.toml");
    std::fs::write(
        &manifest,
        format!(
            "name = {name:?}\ncomponent = {:?}\n[sources]\nlines = {input:?}\n[sinks]\ncounts = {output:?}\n",
            args.component.display().to_string()
        ),
    )?;
    let log = dir.join("worker.log");
    let mut child = Command::new(crate::sluice_binary()?)
        .args(["worker", "--bootstrap", &args.bootstrap, "--topology"])
        .arg(&manifest)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(["--repartition-purge-interval", &args.purge_interval])
        .env("SLUICE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(dir.join("worker.err"))?)
        .spawn()
        .context("starting the worker")?;
    let topic = format!("{name}-words-repartition");
    let consumer: BaseConsumer = config(&args.bootstrap)
        .set("group.id", format!("sluice-{name}"))
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..REPARTITION {
        tpl.add_partition(&topic, p);
    }
    let started = Instant::now();
    let check = crate::deadline("the words to be counted", Duration::from_secs(1800));
    let (mut peak, mut last_print, mut done_at) = (0i64, Instant::now(), None::<Instant>);
    let sample = |consumer: &BaseConsumer| -> anyhow::Result<(i64, i64, i64)> {
        let (mut written, mut held) = (0, 0);
        for p in 0..REPARTITION {
            let (low, high) = consumer.fetch_watermarks(&topic, p, Duration::from_secs(10))?;
            written += high;
            held += high - low;
        }
        let committed: i64 = consumer
            .committed_offsets(tpl.clone(), Duration::from_secs(10))?
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o,
                _ => 0,
            })
            .sum();
        Ok((written, held, committed))
    };
    let result = loop {
        if let Err(e) = check() {
            break Err(e);
        }
        if let Some(status) = child.try_wait()? {
            break Err(anyhow::anyhow!("the worker exited ({status}); see {}", log.display()));
        }
        let Ok((written, held, committed)) = sample(&consumer) else {
            std::thread::sleep(Duration::from_secs(1));
            continue;
        };
        peak = peak.max(held);
        if last_print.elapsed() >= Duration::from_secs(5) {
            println!(
                "  {:>5.0} s: {written:>9} written, {committed:>9} counted, {held:>9} held ({:.0}% of written)",
                started.elapsed().as_secs_f64(),
                held as f64 * 100.0 / written.max(1) as f64
            );
            last_print = Instant::now();
        }
        if written as usize >= words && committed >= written {
            // Everything counted: one more purge interval (and a little) to delete it.
            let at = *done_at.get_or_insert_with(Instant::now);
            let wait = humantime::parse_duration(&args.purge_interval)? + Duration::from_secs(5);
            if held == 0 || at.elapsed() > wait {
                break Ok((written, held, at.duration_since(started)));
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
    let (written, held, took) = result?;
    println!(
        "  {written} records written to the repartition topic in {:.1} s ({:.0} words/s); the most it held at \
         once: {peak} ({:.1}% of what went through); at the end: {held}",
        took.as_secs_f64(),
        written as f64 / took.as_secs_f64(),
        peak as f64 * 100.0 / written.max(1) as f64
    );
    let _ = std::fs::remove_dir_all(&dir);
    if held > 0 {
        bail!("the repartition topic still holds {held} counted records: they were not purged");
    }
    Ok(())
}

/// The repartition topic's partitions (`word-totals` declares 8; the Kafka Streams peer is
/// given as many).
const REPARTITION: i32 = 8;

/// How many records `topic` holds (the sum of its partitions' ends).
fn output_records(bootstrap: &str, topic: &str) -> anyhow::Result<i64> {
    let consumer: BaseConsumer = config(bootstrap).create()?;
    let metadata = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let partitions = metadata.topics().first().map_or(0, |t| t.partitions().len() as i32);
    let mut total = 0;
    for p in 0..partitions {
        let (low, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        total += high - low;
    }
    Ok(total)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs `command` until `group` has committed everything of each stage's source in turn:
/// all `records` of the input (`stages[0]`), then, the first stage's output being
/// acknowledged before its commit, everything the repartition topic (`stages[1]`) then
/// holds. Seconds from start, peak RSS and CPU seconds of the process.
fn until_committed(
    mut command: Command,
    bootstrap: &str,
    group: &str,
    stages: &[(&str, i32)],
    records: usize,
    log: &std::path::Path,
) -> anyhow::Result<(f64, u64, f64)> {
    let log_file = std::fs::File::create(log)?;
    let started = Instant::now();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .spawn()
        .context("starting the system under test")?;
    let consumer: BaseConsumer = config(bootstrap).set("group.id", group).create()?;
    let check = crate::deadline("the input to be committed", Duration::from_secs(900));
    let result = (|| {
        let mut target = records as i64;
        for (i, (topic, partitions)) in stages.iter().enumerate() {
            let mut tpl = TopicPartitionList::new();
            for p in 0..*partitions {
                tpl.add_partition(topic, p);
            }
            if i > 0 {
                // The upstream stage has committed, so all it wrote is in: wait for that.
                target = 0;
                for p in 0..*partitions {
                    target += consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?.1;
                }
            }
            loop {
                check()?;
                if let Some(status) = child.try_wait()? {
                    bail!("the process exited ({status}); see {}", log.display());
                }
                let committed = consumer.committed_offsets(tpl.clone(), Duration::from_secs(10))?;
                let done: i64 = committed
                    .elements()
                    .iter()
                    .map(|e| match e.offset() {
                        Offset::Offset(o) => o,
                        _ => 0,
                    })
                    .sum();
                if done >= target {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        anyhow::Ok(())
    })();
    let s = started.elapsed().as_secs_f64();
    let (rss, cpu) = crate::e2e::process_usage(child.id()).unwrap_or((0, f64::NAN));
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
    result?;
    Ok((s, rss, cpu))
}
