//! The registry of uploaded topologies: a compacted Kafka topic of the cluster, so any
//! worker can take an upload and every worker learns of it by reading the topic.
//!
//! Records, in one partition (so a reader sees a component's chunks before the entry that
//! names it):
//!
//! - `c/<sha256>/<index>`: a chunk of a component (at most [`CHUNK_BYTES`]), addressed by
//!   the SHA-256 of the whole component. Chunks of a digest no entry names any more are
//!   deleted (tombstoned) with the last entry that named them.
//! - `t/<name>`: a topology ([`Entry`], JSON): its manifest text, its component's digest,
//!   size and chunk count, its version. A tombstone deletes it.
//!
//! A reader ([`Watcher`]) replays the topic from the start, writes each component to disk
//! once all its chunks arrived and their digest checks, and publishes the current entries
//! whenever they change.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Most bytes of a component in one record (brokers take 1 MB records by default).
pub const CHUNK_BYTES: usize = 512 * 1024;

/// The registry topic of a cluster.
pub fn topic(cluster: &str) -> String {
    format!("sluice.cluster.{cluster}.registry")
}

/// An uploaded topology as the registry holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    /// 1 for the first upload of a name, one more for each upgrade.
    pub version: u32,
    /// The manifest as uploaded (its `component` line, if any, is not used).
    pub manifest: String,
    /// SHA-256 of the component, hex.
    pub digest: String,
    pub size: u64,
    pub chunks: u32,
    /// Milliseconds since the Unix epoch.
    pub uploaded_at_ms: i64,
    /// As checked at upload: the source topics' partition count (tasks), and what the
    /// component declares.
    #[serde(default)]
    pub partitions: u32,
    #[serde(default)]
    pub sources: Vec<String>,
    #[serde(default)]
    pub sinks: Vec<String>,
    #[serde(default)]
    pub stores: Vec<String>,
    /// Who uploaded it: a tenant's name, or `admin`.
    #[serde(default = "admin")]
    pub tenant: String,
    /// Limits its tenant imposes, over what its manifest says (the lower one wins).
    #[serde(flatten)]
    pub caps: crate::tenants::Caps,
    /// The version that last asked to reprocess (0: none): its source offsets are
    /// committed in group `sluice-<name>.v<epoch>`, which starts at `reprocess_from`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub offsets_epoch: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reprocess_from: Option<crate::manifest::StartFrom>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn admin() -> String {
    crate::tenants::ADMIN.to_string()
}

impl Entry {
    /// The limits it runs under: its manifest's, capped by its tenant's.
    pub fn cap(&self, limits: &mut crate::manifest::Limits) {
        self.caps.apply(limits);
    }
}

/// SHA-256 of `bytes`, hex.
pub fn digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    hash.iter().map(|b| format!("{b:02x}")).collect()
}

fn chunk_key(digest: &str, index: u32) -> String {
    format!("c/{digest}/{index:05}")
}

fn entry_key(name: &str) -> String {
    format!("t/{name}")
}

/// What a record of the registry topic is.
enum Record<'a> {
    Chunk {
        digest: &'a str,
        index: u32,
    },
    Entry {
        name: &'a str,
    },
    /// A tenant an admin created through the API.
    Tenant {
        name: &'a str,
    },
}

fn parse_key(key: &str) -> Option<Record<'_>> {
    if let Some(rest) = key.strip_prefix("c/") {
        let (digest, index) = rest.split_once('/')?;
        return Some(Record::Chunk {
            digest,
            index: index.parse().ok()?,
        });
    }
    if let Some(name) = key.strip_prefix("n/") {
        return Some(Record::Tenant { name });
    }
    key.strip_prefix("t/").map(|name| Record::Entry { name })
}

fn tenant_key(name: &str) -> String {
    format!("n/{name}")
}

/// Creates the registry topic when it is missing (compacted, one partition).
pub fn ensure_topic(bootstrap: &str, cluster: &str) -> anyhow::Result<()> {
    let name = topic(cluster);
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
    let probe: BaseConsumer = config.create()?;
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
    let admin: AdminClient<DefaultClientContext> = config.create()?;
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

/// Writes to the registry: idempotent, every write acknowledged by all in-sync replicas.
pub struct Writer {
    producer: ThreadedProducer<DefaultProducerContext>,
    topic: String,
}

impl Writer {
    pub fn new(bootstrap: &str, cluster: &str) -> anyhow::Result<Writer> {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("message.max.bytes", (2 * CHUNK_BYTES).to_string())
            .set("linger.ms", "5")
            .create()
            .context("creating the registry producer")?;
        Ok(Writer {
            producer,
            topic: topic(cluster),
        })
    }

    fn send(&self, key: &str, value: Option<&[u8]>) -> anyhow::Result<()> {
        let mut record = BaseRecord::<str, [u8]>::to(&self.topic).key(key).partition(0);
        if let Some(value) = value {
            record = record.payload(value);
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
    pub fn put_tenant(&self, name: &str, tenant: &crate::tenants::RawTenant) -> anyhow::Result<()> {
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

/// The registry as a reader has seen it.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Topologies by name, each with the path of its component on disk.
    pub entries: BTreeMap<String, (Entry, PathBuf)>,
    /// Tenants an admin created through the API (the configuration file's are not here).
    pub tenants: BTreeMap<String, crate::tenants::RawTenant>,
    /// Deploys, upgrades and deletes of the last two minutes, through any worker: the tenant
    /// and when (ms since the epoch, as the writing worker's clock had it).
    pub changes: Vec<(String, i64)>,
    /// The offset after the last record read.
    pub position: i64,
}

impl Snapshot {
    /// How many deploys, upgrades and deletes `tenant` made through any worker since
    /// `since` (ms since the epoch).
    pub fn changes_since(&self, tenant: &str, since: i64) -> usize {
        self.changes
            .iter()
            .filter(|(t, at)| t == tenant && *at >= since)
            .count()
    }
}

/// Tails the registry topic on a thread of its own.
pub struct Watcher {
    pub updates: tokio::sync::watch::Receiver<Arc<Snapshot>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Watcher {
    /// Starts reading the registry of `cluster` and returns once everything written before
    /// now has been read (so a worker starts knowing every topology). Components are kept
    /// under `dir`.
    pub fn start(bootstrap: &str, cluster: &str, dir: &Path) -> anyhow::Result<Watcher> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let name = topic(cluster);
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "sluice.registry")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "100")
            .set("fetch.queue.backoff.ms", "10")
            .create()
            .context("creating the registry reader")?;
        // A topic created a moment ago (by this worker or another) takes a moment to reach
        // every broker's metadata.
        let patience = std::time::Instant::now() + Duration::from_secs(30);
        let end = loop {
            match consumer.fetch_watermarks(&name, 0, Duration::from_secs(15)) {
                Ok((_, end)) => break end,
                Err(e) if std::time::Instant::now() < patience => {
                    tracing::debug!("reading the end of the registry {name}: {e}; trying again");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e).with_context(|| format!("reading the end of the registry {name}")),
            }
        };
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&name, 0, Offset::Beginning)?;
        consumer.assign(&tpl)?;
        let mut state = Reader {
            dir: dir.to_path_buf(),
            chunks: HashMap::new(),
            entries: BTreeMap::new(),
            tenants: BTreeMap::new(),
            changes: Default::default(),
            position: 0,
        };
        // Everything written before now, before the worker starts.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while state.position < end {
            if std::time::Instant::now() > deadline {
                bail!(
                    "reading the registry {name}: stuck at offset {} of {end}",
                    state.position
                );
            }
            state.poll(&consumer, Duration::from_millis(200));
        }
        let (tx, rx) = tokio::sync::watch::channel(Arc::new(state.snapshot()));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::Builder::new().name("registry".into()).spawn(move || {
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                if state.poll(&consumer, Duration::from_millis(200)) {
                    tx.send_replace(Arc::new(state.snapshot()));
                }
            }
        })?;
        Ok(Watcher { updates: rx, stop })
    }

    /// The registry now.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.updates.borrow().clone()
    }

    /// Waits until the reader has read past `offset` (a write of this worker), at most
    /// `timeout`.
    pub async fn wait_for(&self, offset: i64, timeout: Duration) -> bool {
        let mut rx = self.updates.clone();
        tokio::time::timeout(timeout, rx.wait_for(|s| s.position > offset))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

struct Reader {
    dir: PathBuf,
    /// Chunks of components not assembled yet, by digest and index.
    chunks: HashMap<String, BTreeMap<u32, Vec<u8>>>,
    entries: BTreeMap<String, (Entry, PathBuf)>,
    tenants: BTreeMap<String, crate::tenants::RawTenant>,
    changes: std::collections::VecDeque<(String, i64)>,
    position: i64,
}

impl Reader {
    /// Notes a deploy, upgrade or delete of `tenant`'s at `at` (ms since the epoch); those of
    /// the last two minutes (of the newest) are kept.
    fn changed_by(&mut self, tenant: String, at: i64) {
        self.changes.push_back((tenant, at));
        while self.changes.front().is_some_and(|(_, t)| *t < at - 120_000) {
            self.changes.pop_front();
        }
    }

    /// Reads what is there; true when the entries changed.
    fn poll(&mut self, consumer: &BaseConsumer, wait: Duration) -> bool {
        let mut changed = false;
        let mut wait = wait;
        // A bounded number per call, so the caller publishes and checks for a stop.
        for _ in 0..1000 {
            let Some(polled) = consumer.poll(wait) else { break };
            wait = Duration::ZERO;
            let m = match polled {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!("reading the registry: {e}");
                    break;
                }
            };
            self.position = m.offset() + 1;
            let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                continue;
            };
            match parse_key(key) {
                Some(Record::Chunk { digest, index }) => match m.payload() {
                    Some(bytes) => {
                        if !self.component_path(digest).exists() {
                            self.chunks
                                .entry(digest.to_string())
                                .or_default()
                                .insert(index, bytes.to_vec());
                        }
                    }
                    None => {
                        self.chunks.remove(digest);
                    }
                },
                Some(Record::Entry { name }) => {
                    changed = true;
                    let at = m.timestamp().to_millis().unwrap_or(0);
                    match m.payload() {
                        None => {
                            if let Some((entry, _)) = self.entries.remove(name) {
                                self.changed_by(entry.tenant, at);
                            }
                        }
                        Some(json) => match serde_json::from_slice::<Entry>(json) {
                            Ok(entry) => match self.assemble(&entry) {
                                Ok(path) => {
                                    self.changed_by(entry.tenant.clone(), at);
                                    self.entries.insert(name.to_string(), (entry, path));
                                }
                                Err(e) => tracing::error!(topology = name, "not running an uploaded topology: {e}"),
                            },
                            Err(e) => tracing::error!(topology = name, "an unreadable registry entry: {e}"),
                        },
                    }
                }
                Some(Record::Tenant { name }) => {
                    changed = true;
                    match m.payload().map(serde_json::from_slice::<crate::tenants::RawTenant>) {
                        None => {
                            self.tenants.remove(name);
                        }
                        Some(Ok(tenant)) => {
                            self.tenants.insert(name.to_string(), tenant);
                        }
                        Some(Err(e)) => tracing::error!(tenant = name, "an unreadable tenant in the registry: {e}"),
                    }
                }
                None => tracing::warn!(key, "an unknown record in the registry; skipped"),
            }
        }
        changed
    }

    fn component_path(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}.wasm"))
    }

    /// The component of `entry` on disk: written from its chunks (checked) if not there yet.
    fn assemble(&mut self, entry: &Entry) -> Result<PathBuf, String> {
        let path = self.component_path(&entry.digest);
        if path.exists() {
            return Ok(path);
        }
        let chunks = self.chunks.remove(&entry.digest).unwrap_or_default();
        if chunks.len() != entry.chunks as usize || !chunks.keys().copied().eq(0..entry.chunks) {
            return Err(format!(
                "component {} has {} of its {} chunks in the registry",
                entry.digest,
                chunks.len(),
                entry.chunks
            ));
        }
        let bytes: Vec<u8> = chunks.into_values().flatten().collect();
        if bytes.len() as u64 != entry.size || digest(&bytes) != entry.digest {
            return Err(format!("component {} does not match its digest or size", entry.digest));
        }
        let partial = path.with_extension("partial");
        std::fs::write(&partial, &bytes)
            .and_then(|()| std::fs::rename(&partial, &path))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        Ok(path)
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            entries: self.entries.clone(),
            tenants: self.tenants.clone(),
            changes: self.changes.iter().cloned().collect(),
            position: self.position,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let d = digest(b"hello");
        assert_eq!(d.len(), 64);
        match parse_key(&chunk_key(&d, 7)) {
            Some(Record::Chunk { digest, index }) => assert_eq!((digest, index), (d.as_str(), 7)),
            _ => panic!("not a chunk"),
        }
        match parse_key(&entry_key("shout")) {
            Some(Record::Entry { name }) => assert_eq!(name, "shout"),
            _ => panic!("not an entry"),
        }
        assert!(parse_key("x/y").is_none());
        assert!(parse_key("c/abc/notanumber").is_none());
    }
}
