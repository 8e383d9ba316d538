//! Writing to the registry: creating its topic, and idempotent writes of components,
//! entries and tenants, each acknowledged by all in-sync replicas.

use crate::kafka::Authorize as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

use super::{
    chunk_key, entry_key, record_signature, sequence, tenant_key, tenants, topic, Entry, CHUNK_BYTES, SIGNATURE_HEADER,
};
use crate::kafka::KafkaSettings;
use crate::secret::{hex, ClusterSecret};

/// Creates the registry topic when it is missing (compacted, one partition).
pub fn ensure_topic(kafka: &KafkaSettings, cluster: &str) -> anyhow::Result<()> {
    let name = topic(cluster);
    let config = kafka.client();
    let probe: crate::kafka::Authorized<BaseConsumer> = config.authorized(kafka)?;
    let metadata = probe
        .fetch_metadata(Some(&name), Duration::from_secs(15))
        .with_context(|| format!("looking up the registry topic {name}"))?;
    if metadata
        .topics()
        .iter()
        .any(|t| t.name() == name && t.error().is_none() && !t.partitions().is_empty())
    {
        return Ok(());
    }
    let brokers = metadata.brokers().len().max(1);
    let replication = (brokers as i32).clamp(1, 3);
    let isr = (replication - 1).max(1).to_string();
    let max_bytes = (2 * CHUNK_BYTES).to_string();
    let admin: crate::kafka::Authorized<AdminClient<DefaultClientContext>> = config.authorized(kafka)?;
    let new = NewTopic::new(&name, 1, TopicReplication::Fixed(replication))
        .set("cleanup.policy", "compact")
        .set("min.insync.replicas", &isr)
        .set("max.message.bytes", &max_bytes);
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in futures::executor::block_on(admin.create_topics([&new], &options))? {
        match result {
            Ok(_) => tracing::info!(topic = %name, "created the registry topic"),
            Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => bail!("creating the registry topic {t}: {e}"),
        }
    }
    Ok(())
}

/// Writes to the registry: idempotent, every write acknowledged by all in-sync replicas,
/// and signed with the cluster secret when there is one.
pub struct Writer {
    producer: crate::kafka::Authorized<ThreadedProducer<DefaultProducerContext>>,
    topic: String,
    secret: Option<ClusterSecret>,
    /// The highest sequence this worker's registry reader has read (see [`sequence`]).
    highest_read: Arc<AtomicI64>,
    /// The last sequence this writer gave a record.
    last_given: AtomicI64,
}

impl Writer {
    pub fn new(kafka: &KafkaSettings, cluster: &str, secret: Option<ClusterSecret>) -> anyhow::Result<Writer> {
        let producer = kafka
            .client()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.max.bytes", (2 * CHUNK_BYTES).to_string())
            .set("linger.ms", "5")
            .authorized(kafka)
            .context("creating the registry producer")?;
        Ok(Writer {
            producer,
            topic: topic(cluster),
            secret,
            highest_read: Arc::new(AtomicI64::new(0)),
            last_given: AtomicI64::new(0),
        })
    }

    /// Gives each record a sequence above everything `watcher` has read (so a record
    /// written now is newer than any a reader has believed).
    pub fn following(mut self, watcher: &super::Watcher) -> Writer {
        self.highest_read = watcher.highest_sequence();
        self
    }

    fn send(&self, key: &str, value: Option<&[u8]>) -> anyhow::Result<()> {
        let mut record = BaseRecord::<str, [u8]>::to(&self.topic).key(key).partition(0);
        if let Some(value) = value {
            record = record.payload(value);
        }
        if let Some(secret) = &self.secret {
            let given = self.last_given.load(Ordering::SeqCst);
            let seq = sequence::next(self.highest_read.load(Ordering::SeqCst), given);
            self.last_given.fetch_max(seq, Ordering::SeqCst);
            let signature = hex(&record_signature(secret, &self.topic, key, value, seq));
            let seq = seq.to_string();
            record = record.headers(
                OwnedHeaders::new()
                    .insert(Header {
                        key: SIGNATURE_HEADER,
                        value: Some(signature.as_bytes()),
                    })
                    .insert(Header {
                        key: sequence::SEQUENCE_HEADER,
                        value: Some(seq.as_bytes()),
                    }),
            );
        }
        self.producer
            .send(record)
            .map_err(|(e, _)| anyhow::anyhow!("writing {key} to the registry {}: {e}", self.topic))
    }

    fn flush(&self) -> anyhow::Result<()> {
        self.producer
            .flush(Duration::from_secs(60))
            .with_context(|| format!("writing to the registry {}", self.topic))
    }

    /// Stores a component (its chunks) and then the entry naming it; returns once both are
    /// acknowledged. `chunks_present`: the chunks are there already (same digest).
    pub fn put(&self, entry: &Entry, component: &[u8], chunks_present: bool) -> anyhow::Result<()> {
        if !chunks_present {
            for (index, chunk) in component.chunks(CHUNK_BYTES).enumerate() {
                self.send(&chunk_key(&entry.digest, index as u32), Some(chunk))?;
            }
        }
        let value = serde_json::to_vec(entry)?;
        self.send(&entry_key(&entry.name), Some(&value))?;
        self.flush()
    }

    /// Stores a tenant (created or changed through the API).
    pub fn put_tenant(&self, name: &str, tenant: &tenants::RawTenant) -> anyhow::Result<()> {
        let value = serde_json::to_vec(tenant)?;
        self.send(&tenant_key(name), Some(&value))?;
        self.flush()
    }

    pub fn delete_tenant(&self, name: &str) -> anyhow::Result<()> {
        self.send(&tenant_key(name), None)?;
        self.flush()
    }

    /// Deletes an entry, and the chunks of its component when `drop_chunks` (no other
    /// entry names them).
    pub fn delete(&self, entry: &Entry, drop_chunks: bool) -> anyhow::Result<()> {
        self.send(&entry_key(&entry.name), None)?;
        if drop_chunks {
            for index in 0..entry.chunks {
                self.send(&chunk_key(&entry.digest, index), None)?;
            }
        }
        self.flush()
    }
}

impl Writer {
    /// Writes `key`'s record again as this worker believes it (`None`: its tombstone),
    /// signed anew: see [`super::reader::Shadowed`].
    pub fn rewrite(&self, key: &str, value: Option<&[u8]>) -> anyhow::Result<()> {
        self.send(key, value)?;
        self.flush()
    }
}

/// Writes again, through `writer`, the registry records a record not believed shadows (see
/// [`super::reader::Shadowed`]), on a thread of its own, until the watcher is dropped. Each
/// key waits a second and a moment of its own first: the first worker to write it again
/// clears it for the others (they read that record), so a shadowed key is mostly written
/// once, not once per worker.
pub fn heal(writer: Writer, watcher: std::sync::Weak<super::Watcher>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("registry-heal".into())
        .spawn(move || loop {
            let jitter = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos() % 2000);
            std::thread::sleep(Duration::from_millis(1000 + u64::from(jitter)));
            let Some(watcher) = watcher.upgrade() else { return };
            for (key, heal) in watcher.shadowed().due(Duration::from_secs(1), 64) {
                let written = match &heal {
                    super::reader::Heal::Value(value) => writer.rewrite(&key, value.as_deref()),
                    super::reader::Heal::Chunk { path, index } => {
                        read_chunk(path, *index).and_then(|chunk| writer.rewrite(&key, Some(&chunk)))
                    }
                };
                match written {
                    Ok(()) => tracing::info!(
                        key = %key.chars().take(64).collect::<String>(),
                        "a registry record not believed came after this key's: wrote the believed one again, so \
                         compaction keeps it"
                    ),
                    Err(e) => tracing::warn!("writing a shadowed registry record again: {e:#}"),
                }
            }
        })?;
    Ok(())
}

/// Chunk `index` of the component file at `path`, as it was written to the registry.
fn read_chunk(path: &std::path::Path, index: u32) -> anyhow::Result<Vec<u8>> {
    use std::io::{Read as _, Seek as _};
    let mut file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    file.seek(std::io::SeekFrom::Start(u64::from(index) * CHUNK_BYTES as u64))?;
    let mut chunk = Vec::with_capacity(CHUNK_BYTES);
    file.take(CHUNK_BYTES as u64).read_to_end(&mut chunk)?;
    anyhow::ensure!(!chunk.is_empty(), "{} has no chunk {index}", path.display());
    Ok(chunk)
}
