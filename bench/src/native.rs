//! The native baseline: the `uppercase` job as a plain rdkafka program — one consumer, one
//! producer, upper-casing in Rust, offsets committed every second after the producer has
//! flushed (at-least-once, like the others). It is the floor Sluice's overhead (Wasm,
//! batching, task bookkeeping) is measured against. Runs until SIGTERM.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Args;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::Message;

#[derive(Args)]
pub struct NativeArgs {
    #[arg(long)]
    bootstrap: String,
    #[arg(long)]
    input: String,
    #[arg(long)]
    output: String,
    #[arg(long)]
    group: String,
}

pub fn run(args: NativeArgs) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook_registry(&stop)?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("group.id", &args.group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[&args.input])?;
    // The same producer settings as the worker's.
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("linger.ms", "5")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let mut last_commit = Instant::now();
    let mut value = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match consumer.poll(Duration::from_millis(100)) {
            None => {}
            Some(Err(e)) => eprintln!("native: {e}"),
            Some(Ok(m)) => {
                value.clear();
                if let Some(v) = m.payload() {
                    value.extend(v.iter().map(u8::to_ascii_uppercase));
                }
                let mut record = BaseRecord::<[u8], [u8]>::to(&args.output).payload(&value[..]);
                if let Some(k) = m.key() {
                    record = record.key(k);
                }
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                            record = back;
                            producer.poll(Duration::from_millis(1));
                        }
                        Err((e, _)) => bail!("producing: {e}"),
                    }
                }
            }
        }
        if last_commit.elapsed() >= Duration::from_secs(1) {
            producer.flush(Duration::from_secs(60))?;
            if let Err(e) = consumer.commit_consumer_state(CommitMode::Sync) {
                eprintln!("native: committing: {e}");
            }
            last_commit = Instant::now();
        }
    }
    producer.flush(Duration::from_secs(60))?;
    let _ = consumer.commit_consumer_state(CommitMode::Sync);
    Ok(())
}

/// SIGTERM sets `stop`.
fn signal_hook_registry(stop: &Arc<AtomicBool>) -> anyhow::Result<()> {
    let stop = stop.clone();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    std::thread::spawn(move || {
        runtime.block_on(async {
            if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                term.recv().await;
            }
            stop.store(true, Ordering::Relaxed);
        })
    });
    Ok(())
}
