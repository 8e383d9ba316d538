//! `sluice topics|produce|consume`: just enough of a Kafka client to feed and watch a demo
//! without a second tool.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::{Args, Subcommand};
use futures::StreamExt;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

#[derive(Debug, Args)]
pub struct Connection {
    /// Kafka bootstrap servers, `host:port[,host:port…]`.
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    pub bootstrap: String,
    #[command(flatten)]
    pub kafka: super::kafka_args::KafkaArgs,
}

impl Connection {
    /// A client configuration, once the brokers answer as the settings say (a wrong
    /// password or CA fails here within seconds, naming the broker and what failed).
    async fn config(&self) -> anyhow::Result<ClientConfig> {
        let settings = self.settings()?;
        sluice::group::connection::check_brokers(&settings, std::time::Duration::from_secs(15))
            .await
            .context("connecting to Kafka")?;
        Ok(settings.client())
    }

    /// The Kafka settings of these flags, checked.
    pub fn settings(&self) -> anyhow::Result<sluice::kafka::KafkaSettings> {
        self.kafka.settings(&self.bootstrap)
    }
}

#[derive(Debug, Args)]
pub struct TopicsArgs {
    #[command(subcommand)]
    command: TopicsCommand,
}

#[derive(Debug, Subcommand)]
enum TopicsCommand {
    /// Create topics (an existing topic is left as it is).
    Create {
        #[command(flatten)]
        connection: Connection,
        /// Partitions per topic.
        #[arg(long, default_value_t = 1)]
        partitions: i32,
        /// Replication factor.
        #[arg(long, default_value_t = 1)]
        replication: i32,
        #[arg(required = true)]
        topics: Vec<String>,
    },
}

pub async fn topics(args: TopicsArgs) -> anyhow::Result<ExitCode> {
    let TopicsCommand::Create {
        connection,
        partitions,
        replication,
        topics,
    } = args.command;
    let admin: AdminClient<DefaultClientContext> = connection.config().await?.create()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(replication)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics(&new, &options).await? {
        match result {
            Ok(topic) => eprintln!("created topic {topic} ({partitions} partitions)"),
            Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => eprintln!("topic {topic} exists"),
            Err((topic, code)) => bail!("creating topic {topic}: {code}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct ProduceArgs {
    #[command(flatten)]
    connection: Connection,
    /// The topic to write to.
    topic: String,
}

pub async fn produce(args: ProduceArgs) -> anyhow::Result<ExitCode> {
    let producer: FutureProducer = args
        .connection
        .config()
        .await?
        .set("enable.idempotence", "true")
        .create()?;
    let lines: Vec<String> = std::io::stdin().lock().lines().collect::<Result<_, _>>()?;
    let sends = lines.iter().map(|line| {
        let (key, value) = match line.split_once('\t') {
            Some((k, v)) => (Some(k), v),
            None => (None, line.as_str()),
        };
        let mut record = FutureRecord::<str, str>::to(&args.topic).payload(value);
        if let Some(key) = key {
            record = record.key(key);
        }
        producer.send(record, Duration::from_secs(30))
    });
    let results = futures::future::join_all(sends).await;
    for (line, result) in lines.iter().zip(results) {
        result.map_err(|(e, _)| anyhow::anyhow!("producing {line:?} to {}: {e}", args.topic))?;
    }
    eprintln!("produced {} record(s) to {}", lines.len(), args.topic);
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct ConsumeArgs {
    #[command(flatten)]
    connection: Connection,
    /// The topic to read, from the beginning.
    topic: String,
    /// Stop after this many records.
    #[arg(long)]
    max: Option<usize>,
    /// Stop when no record arrived for this long (e.g. `5s`).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    idle: Duration,
}

pub async fn consume(args: ConsumeArgs) -> anyhow::Result<ExitCode> {
    let group = format!("sluice.consume.{}", uuid::Uuid::new_v4().simple());
    let consumer: StreamConsumer = args
        .connection
        .config()
        .await?
        .set("group.id", &group)
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()?;
    consumer.subscribe(&[&args.topic])?;
    let mut stream = consumer.stream();
    let mut count = 0usize;
    let mut out = std::io::stdout().lock();
    while args.max.is_none_or(|max| count < max) {
        let message = match tokio::time::timeout(args.idle, stream.next()).await {
            Ok(Some(message)) => message.with_context(|| format!("reading {}", args.topic))?,
            Ok(None) | Err(_) => break,
        };
        let key = message.key().map(String::from_utf8_lossy).unwrap_or_default();
        let value = message.payload().map(String::from_utf8_lossy).unwrap_or_default();
        writeln!(out, "{}/{} {key}\t{value}", message.partition(), message.offset())?;
        count += 1;
    }
    eprintln!("read {count} record(s) from {}", args.topic);
    Ok(ExitCode::SUCCESS)
}
