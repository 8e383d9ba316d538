//! A worker killed with SIGKILL and started again on its state directory: how much of its
//! store (1M keys of `word-count`) it restores from the changelog, and how long until it
//! processes again, under each guarantee. Its local state is trusted up to its last commit
//! under both (each store's marker names the changelog offset its data holds), so only the
//! tail since that commit is replayed.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
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

#[derive(Args)]
pub struct CrashArgs {
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    bootstrap: String,
    /// The word-count component (`guests/word-count`).
    #[arg(long)]
    component: PathBuf,
    /// Distinct words, so keys of state.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    /// Guarantees to run, in order.
    #[arg(long, value_delimiter = ',', default_value = "at-least-once,exactly-once")]
    guarantees: Vec<String>,
}

fn config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap);
    c
}

/// What the worker restarted after the kill said of its restore.
struct Restarted {
    /// The changelog offset the store was trusted up to (its marker), the records replayed
    /// after it, and the seconds that took (from the worker's log).
    from_offset: u64,
    restored: u64,
    restore_s: f64,
    /// From the restart to the task's "started" line.
    started_s: f64,
}

pub async fn run(args: CrashArgs) -> anyhow::Result<()> {
    println!(
        "crash benchmark: word-count, one partition, {} keys of state, SIGKILL under load, then the worker started again on its state, Kafka at {}",
        args.keys, args.bootstrap
    );
    for guarantee in &args.guarantees {
        let r = one(&args, guarantee).await?;
        println!(
            "  {guarantee:<14} store trusted up to changelog offset {}, restored {} records after it in {:.2} s; processing {:.2} s after the restart",
            r.from_offset, r.restored, r.restore_s, r.started_s
        );
    }
    Ok(())
}

async fn one(args: &CrashArgs, guarantee: &str) -> anyhow::Result<Restarted> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (input, output, name) = (
        format!("crash-in-{id}"),
        format!("crash-out-{id}"),
        format!("crash-{id}"),
    );
    let admin: AdminClient<DefaultClientContext> = config(&args.bootstrap).create()?;
    let topics = [
        NewTopic::new(&input, 1, TopicReplication::Fixed(1)),
        NewTopic::new(&output, 1, TopicReplication::Fixed(1)),
    ];
    for r in admin.create_topics(&topics, &AdminOptions::new()).await? {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    let producer: ThreadedProducer<DefaultProducerContext> = config(&args.bootstrap)
        .set("linger.ms", "20")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let send = |n: u64| -> anyhow::Result<()> {
        let value = format!("w{n}");
        let mut record = BaseRecord::<(), _, ()>::to(&input).payload(value.as_bytes());
        loop {
            match producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => bail!("producing the input: {e}"),
            }
        }
    };
    for n in 0..args.keys {
        send(n)?;
    }
    producer.flush(Duration::from_secs(120))?;

    let dir = std::env::temp_dir().join(format!("sluice-crash-{id}"));
    std::fs::create_dir_all(&dir)?;
    let manifest = dir.join("word-count.toml");
    std::fs::write(
        &manifest,
        format!(
            "name = {name:?}\ncomponent = {:?}\n[sources]\nlines = {input:?}\n[sinks]\ncounts = {output:?}\n",
            args.component.display().to_string()
        ),
    )?;
    let start = |log: &str| -> anyhow::Result<Child> {
        let file = std::fs::File::create(dir.join(log))?;
        Command::new(crate::sluice_binary()?)
            .args(["worker", "--bootstrap", &args.bootstrap, "--topology"])
            .arg(&manifest)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .args(["--processing-guarantee", guarantee])
            .env("SLUICE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("starting the worker")
    };
    let mut worker = start("first.log")?;
    let consumer: BaseConsumer = config(&args.bootstrap)
        .set("group.id", format!("sluice-{name}"))
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(&input, 0);
    let committed = |consumer: &BaseConsumer| -> i64 {
        consumer
            .committed_offsets(tpl.clone(), Duration::from_secs(10))
            .ok()
            .and_then(|c| match c.elements().first().map(|e| e.offset()) {
                Some(Offset::Offset(o)) => Some(o),
                _ => None,
            })
            .unwrap_or(0)
    };
    let check = crate::deadline("the words to be counted", Duration::from_secs(900));
    while committed(&consumer) < args.keys as i64 {
        check()?;
        if let Some(status) = worker.try_wait()? {
            bail!("the worker exited ({status}); see {}", dir.join("first.log").display());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Under load: new words for two seconds (as many commits), then the kill.
    let mut n = args.keys;
    let loaded = Instant::now();
    while loaded.elapsed() < Duration::from_secs(2) {
        for _ in 0..100 {
            send(n)?;
            n += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    worker.kill()?;
    worker.wait()?;
    let restarted = Instant::now();
    let mut worker = start("second.log")?;
    let log = dir.join("second.log");
    let check = crate::deadline("the restarted worker's task to start", Duration::from_secs(600));
    let result = loop {
        if let Err(e) = check() {
            break Err(e);
        }
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("sluice::task::start: started") {
            let started_s = restarted.elapsed().as_secs_f64();
            let line = text
                .lines()
                .find(|l| l.contains("restored ") && l.contains("store=counts"));
            let field =
                |key: &str| -> Option<f64> { line?.split_whitespace().find_map(|w| w.strip_prefix(key))?.parse().ok() };
            break Ok(Restarted {
                from_offset: field("from_offset=").unwrap_or(0.0) as u64,
                restored: field("records=").unwrap_or(0.0) as u64,
                restore_s: field("seconds=").unwrap_or(0.0),
                started_s,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = Command::new("kill").args(["-TERM", &worker.id().to_string()]).status();
    let _ = worker.wait();
    if result.is_ok() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}
