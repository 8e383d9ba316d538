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
    /// The word-count component.
    #[arg(long)]
    component: PathBuf,
    /// Input lines of five words each.
    #[arg(long, default_value_t = 200_000)]
    lines: usize,
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
    let mut reader = ChangelogReader::new(&args.bootstrap, &topic, 0).map_err(anyhow::Error::msg)?;
    let progress = reader
        .restore_into(&db, "", &|| false, |_| {})
        .map_err(anyhow::Error::msg)?
        .expect("never asked to stop");
    let s = progress.elapsed.as_secs_f64();
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
    let (input, output, name) = (
        format!("bench-wc-in-{id}"),
        format!("bench-wc-out-{id}"),
        format!("bench-wc-{id}"),
    );
    create(&args.bootstrap, &input, 4, false).await?;
    create(&args.bootstrap, &output, 4, false).await?;
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
    let manifest = dir.join("wc.toml");
    std::fs::write(
        &manifest,
        format!(
            "name = {name:?}\ncomponent = {:?}\n[sources]\nlines = {input:?}\n[sinks]\ncounts = {output:?}\n",
            args.component.display().to_string()
        ),
    )?;
    let log = std::fs::File::create(dir.join("worker.log"))?;
    let started = Instant::now();
    let mut worker = Command::new(crate::sluice_binary()?)
        .args(["worker", "--bootstrap", &args.bootstrap, "--topology"])
        .arg(&manifest)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .env("SLUICE_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .context("starting sluice worker")?;
    // Done when every input record is committed: outputs and changelog acknowledged first.
    let consumer: BaseConsumer = config(&args.bootstrap)
        .set("group.id", format!("sluice-{name}"))
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..4 {
        tpl.add_partition(&input, p);
    }
    let check = crate::deadline("word count to commit its input", Duration::from_secs(900));
    loop {
        check()?;
        if let Some(status) = worker.try_wait()? {
            bail!("the worker exited ({status}); see {}", dir.join("worker.log").display());
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
        if done as usize >= lines {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let s = started.elapsed().as_secs_f64();
    let _ = Command::new("kill").args(["-TERM", &worker.id().to_string()]).status();
    let _ = worker.wait();
    let _ = std::fs::remove_dir_all(&dir);
    println!("word-count benchmark: {lines} lines ({words} words), 4 partitions, one worker");
    println!(
        "  {:>10.0} lines/s, {:>10.0} words/s (store get+put and one output per word), {s:.1} s from worker start to the last commit",
        lines as f64 / s,
        words as f64 / s
    );
    Ok(())
}
