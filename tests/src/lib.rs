//! Test harness: a real Kafka broker for the test run, unique names per test, and rdkafka helpers.
//!
//! Every test that talks to Kafka calls [`kafka()`]. When `KAFKA_BOOTSTRAP` is set, that
//! cluster is used as it is; otherwise the first call runs `dev/kafka up`, which starts a
//! local broker (or finds the one already running) and prints its address. The broker is
//! left running for the next run; `dev/kafka down` stops it.

pub mod worker;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

/// A Kafka cluster that tests may use.
#[derive(Debug)]
pub struct Kafka {
    bootstrap: String,
}

/// The Kafka cluster for this test run; see the module docs for where it comes from.
pub fn kafka() -> &'static Kafka {
    static KAFKA: OnceLock<Kafka> = OnceLock::new();
    KAFKA.get_or_init(|| {
        let bootstrap = match std::env::var("KAFKA_BOOTSTRAP") {
            Ok(addr) if !addr.trim().is_empty() => addr.trim().to_string(),
            _ => start_local_kafka().unwrap_or_else(|e| panic!("no Kafka for the tests: {e:#}")),
        };
        eprintln!("tests: using Kafka at {bootstrap}");
        Kafka { bootstrap }
    })
}

/// The root of this repository.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn start_local_kafka() -> Result<String> {
    let script = repo_root().join("dev").join("kafka");
    let out = Command::new(&script)
        .arg("up")
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("`{} up` failed ({}):\n{stderr}", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().last() {
        Some(addr) if !addr.trim().is_empty() => Ok(addr.trim().to_string()),
        _ => bail!("`{} up` printed no bootstrap address:\n{stderr}", script.display()),
    }
}

/// A name no other test (or earlier run) uses: `{prefix}-{uuid}`.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// A record as read back from Kafka.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub partition: i32,
    pub offset: i64,
}

impl Kafka {
    /// The bootstrap address (`host:port[,host:port…]`).
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// A client config with the bootstrap address set.
    pub fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        config
    }

    /// Creates a topic with `partitions` partitions and waits until it exists.
    pub async fn create_topic(&self, name: &str, partitions: i32) -> Result<()> {
        let admin: AdminClient<DefaultClientContext> = self.config().create()?;
        let topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for result in admin.create_topics([&topic], &options).await? {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => bail!("creating topic {topic}: {code}"),
            }
        }
        Ok(())
    }

    /// An idempotent producer: records of one partition arrive in the order they were sent.
    pub fn producer(&self) -> Result<FutureProducer> {
        Ok(self
            .config()
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .create()?)
    }

    /// Produces `records` (key, value) to `topic` and waits for every acknowledgement.
    /// Returns the (partition, offset) each record was written at, in input order.
    pub async fn produce(&self, topic: &str, records: &[(Vec<u8>, Vec<u8>)]) -> Result<Vec<(i32, i64)>> {
        let producer = self.producer()?;
        let sends: Vec<_> = records
            .iter()
            .map(|(k, v)| producer.send(FutureRecord::to(topic).key(k).payload(v), Duration::from_secs(30)))
            .collect();
        let mut positions = Vec::with_capacity(sends.len());
        for (i, send) in futures::future::join_all(sends).await.into_iter().enumerate() {
            let delivery = send.map_err(|(e, _)| anyhow::anyhow!("producing record {i} to {topic}: {e}"))?;
            positions.push((delivery.partition, delivery.offset));
        }
        Ok(positions)
    }

    /// Produces `records` (key, value) to one partition of `topic`, in order.
    pub async fn produce_to(&self, topic: &str, partition: i32, records: &[(&str, &str)]) -> Result<()> {
        let producer = self.producer()?;
        for (k, v) in records {
            producer
                .send(
                    FutureRecord::to(topic).partition(partition).key(*k).payload(*v),
                    Duration::from_secs(30),
                )
                .await
                .map_err(|(e, _)| anyhow::anyhow!("producing to {topic}/{partition}: {e}"))?;
        }
        Ok(())
    }

    /// The offset `group` has committed for `topic`/`partition`, if any.
    pub fn committed_offset(&self, group: &str, topic: &str, partition: i32) -> Result<Option<i64>> {
        use rdkafka::consumer::BaseConsumer;
        use rdkafka::{Offset, TopicPartitionList};
        let consumer: BaseConsumer = self.config().set("group.id", group).create()?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, partition);
        let committed = consumer.committed_offsets(tpl, Duration::from_secs(30))?;
        let offset = committed.find_partition(topic, partition).map(|p| p.offset());
        Ok(match offset {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        })
    }

    /// Offsets `group` has committed for partitions `0..partitions` of `topic` (0 where none),
    /// summed: how many records of the topic the group has processed. One consumer, one
    /// request; a slow coordinator gets 30 s.
    pub fn committed_total(&self, group: &str, topic: &str, partitions: i32) -> Result<i64> {
        use rdkafka::consumer::BaseConsumer;
        use rdkafka::{Offset, TopicPartitionList};
        let consumer: BaseConsumer = self.config().set("group.id", group).create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(topic, p);
        }
        let committed = consumer.committed_offsets(tpl, Duration::from_secs(30))?;
        Ok(committed
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o,
                _ => 0,
            })
            .sum())
    }

    /// Waits until `group` has committed `total` records of `topic`. A query that fails (a
    /// busy coordinator) is retried until `timeout`.
    pub async fn wait_committed(
        &self,
        group: &str,
        topic: &str,
        partitions: i32,
        total: i64,
        timeout: Duration,
    ) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last;
        loop {
            match self.committed_total(group, topic, partitions) {
                Ok(n) if n >= total => return Ok(()),
                Ok(n) => last = format!("{n} of {total} committed"),
                Err(e) => last = format!("querying committed offsets: {e}"),
            }
            if tokio::time::Instant::now() > deadline {
                bail!("group {group} did not commit {total} records of {topic} within {timeout:?}: {last}");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// A consumer in `group` that starts from the earliest offset of partitions it has no commit for.
    pub fn consumer(&self, group: &str) -> Result<StreamConsumer> {
        Ok(self
            .config()
            .set("group.id", group)
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()?)
    }

    /// Reads `topic` from the beginning with a fresh group until `count` records have arrived,
    /// or fails after `timeout` saying how many did.
    pub async fn consume(&self, topic: &str, count: usize, timeout: Duration) -> Result<Vec<Received>> {
        let consumer = self.consumer(&unique_name("test-reader"))?;
        consumer.subscribe(&[topic])?;
        let mut received = Vec::with_capacity(count);
        let deadline = tokio::time::Instant::now() + timeout;
        while received.len() < count {
            let message = match tokio::time::timeout_at(deadline, consumer.recv()).await {
                Ok(message) => message.with_context(|| format!("reading {topic}"))?,
                Err(_) => bail!(
                    "read {} of {count} records from {topic} within {timeout:?}",
                    received.len()
                ),
            };
            received.push(Received {
                key: message.key().map(<[u8]>::to_vec),
                value: message.payload().map(<[u8]>::to_vec),
                partition: message.partition(),
                offset: message.offset(),
            });
        }
        Ok(received)
    }
}

/// Groups records by partition, each partition in offset order.
pub fn by_partition(records: &[Received]) -> HashMap<i32, Vec<Received>> {
    let mut map: HashMap<i32, Vec<Received>> = HashMap::new();
    for r in records {
        map.entry(r.partition).or_default().push(r.clone());
    }
    for list in map.values_mut() {
        list.sort_by_key(|r| r.offset);
    }
    map
}
