//! State benchmarks on a real broker: restoring a store from its changelog, and word count
//! end to end.

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
use sluice::state::restore::ChangelogReader;
use sluice::state::rocks::{self, SharedMemory};

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

async fn create(bootstrap: &str, topic: &str, partitions: i32, compact: bool) -> anyhow::Result<()> {
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

fn produce_all(
    bootstrap: &str,
    topic: &str,
    records: impl Iterator<Item = (Vec<u8>, Vec<u8>)>,
) -> anyhow::Result<usize> {
    let producer: ThreadedProducer<DefaultProducerContext> = config(bootstrap)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let mut n = 0;
    for (key, value) in records {
        let mut record = BaseRecord::<_, _, ()>::to(topic).key(&key).payload(&value);
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
    let memory = SharedMemory::new(64 << 20, 64 << 20);
    let db = rocks::open(&dir, &memory).map_err(anyhow::Error::msg)?;
    let mut reader = ChangelogReader::new(&sluice::kafka::KafkaSettings::new(args.bootstrap.as_str()), &topic, 0)
        .map_err(anyhow::Error::msg)?;
    let began = Instant::now();
    let progress = reader
        .restore_into(&db, "", &|| false, |_| {})
        .map_err(anyhow::Error::msg)?
        .expect("never asked to stop");
    // Until its flush is done the restored state is not durable: that is part of the cost.
    rocks::flush(&db).map_err(anyhow::Error::msg)?;
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
    let dir = std::env::temp_dir().join(format!("sluice-bench-wc-{id}"));
    std::fs::create_dir_all(&dir)?;
    println!(
        "word-count benchmark: {lines} lines ({words} words) on 4 partitions, counted in two stages through a \
         repartition topic of {REPARTITION} partitions, one process per system"
    );
    let mut systems = vec!["sluice"];
    if args.kafka_streams_classpath.is_some() {
        systems.push("kafka streams");
    }
    let mut results: Vec<(&str, f64, u64, f64)> = Vec::new();
    for round in 0..args.rounds {
        for &system in &systems {
            let run = format!("{}-{round}-{id}", system.replace(' ', "-"));
            let output = format!("bench-wc-out-{run}");
            create(&args.bootstrap, &output, 4, false).await?;
            // The group whose committed offsets say how far the system has come.
            let (group, repartition, command) = if system == "sluice" {
                let name = format!("bench-wc-{run}");
                let manifest = dir.join(format!("{run}.toml"));
                std::fs::write(
                    &manifest,
                    format!(
                        "name = {name:?}\ncomponent = {:?}\n[sources]\nlines = {input:?}\n[sinks]\ncounts = {output:?}\n",
                        args.component.display().to_string()
                    ),
                )?;
                let mut worker = Command::new(crate::sluice_binary()?);
                worker
                    .args(["worker", "--bootstrap", &args.bootstrap, "--topology"])
                    .arg(&manifest)
                    .arg("--state-dir")
                    .arg(dir.join(format!("state-{run}")))
                    .env("SLUICE_LOG", "warn");
                (format!("sluice-{name}"), format!("{name}-words-repartition"), worker)
            } else {
                let app = format!("bench-wc-streams-{run}");
                let mut streams = Command::new("java");
                streams.args([
                    "-Xmx1g",
                    "-cp",
                    args.kafka_streams_classpath.as_deref().unwrap_or_default(),
                    "dev.sluice.bench.WordTotals",
                    &args.bootstrap,
                    &input,
                    &output,
                    &app,
                    "4",
                    &REPARTITION.to_string(),
                ]);
                (app.clone(), format!("{app}-words-repartition"), streams)
            };
            let (s, rss, cpu) = until_committed(
                command,
                &args.bootstrap,
                &group,
                &[(&input, 4), (&repartition, REPARTITION)],
                lines,
                &dir.join(format!("{run}.log")),
            )?;
            let counts = output_records(&args.bootstrap, &output)?;
            println!(
                "  {system:<14} #{}: {:>10.0} words/s, {s:.1} s from start to the last commit, peak RSS {} MB, \
                 CPU {cpu:.1} s ({:.2} µs per word), {counts} counts out",
                round + 1,
                words as f64 / s,
                rss >> 20,
                cpu * 1e6 / words as f64
            );
            results.push((system, s, rss, cpu));
        }
    }
    let mut medians = Vec::new();
    for &system in &systems {
        let runs: Vec<&(&str, f64, u64, f64)> = results.iter().filter(|r| r.0 == system).collect();
        let rate = median(runs.iter().map(|r| words as f64 / r.1).collect());
        let cpu = median(runs.iter().map(|r| r.3 * 1e6 / words as f64).collect());
        let rss = median(runs.iter().map(|r| r.2 as f64 / (1 << 20) as f64).collect());
        println!("  {system:<14} median: {rate:>10.0} words/s, {cpu:.2} µs CPU per word, peak RSS {rss:.0} MB");
        medians.push((rate, cpu, rss));
    }
    if medians.len() == 2 {
        println!(
            "  sluice / kafka streams: {:.2}x the words/s, {:.2}x the CPU per word, {:.2}x the peak RSS",
            medians[0].0 / medians[1].0,
            medians[0].1 / medians[1].1,
            medians[0].2 / medians[1].2
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
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
