//! Reading the registry: a thread tails its topic, writes each component to disk once all
//! its chunks arrived and their digest checks, and publishes a [`Snapshot`] whenever the
//! entries change.

use crate::kafka::Authorize as _;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use prometheus_client::metrics::counter::Counter;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers as _, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::sequence::{Sequences, SEQUENCE_HEADER};
use super::{parse_key, record_signed, tenants, topic, Entry, Record, Snapshot, SIGNATURE_HEADER};
use crate::kafka::KafkaSettings;
use crate::secret::{unhex, ClusterSecret};

/// Tails the registry topic on a thread of its own.
pub struct Watcher {
    pub updates: tokio::sync::watch::Receiver<Arc<Snapshot>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// The highest record sequence read (see `sequence`).
    highest: Arc<std::sync::atomic::AtomicI64>,
    /// Keys whose newest record is one not believed (see [`Shadowed`]).
    shadowed: Shadowed,
}

/// Keys of the registry whose newest record is one no worker believes (forged, or an old
/// signed one written back), with what this worker believes of the key: once Kafka compacts
/// the topic, only that newest record would be left, and a worker starting then would not see
/// what it shadows. A worker that holds the believed record writes it again (signed, with a
/// new sequence), so the newest record of the key is one it signed (see `registry::heal`).
/// A key leaves the set when a believed record of it is read.
#[derive(Clone, Default)]
pub struct Shadowed(Arc<std::sync::Mutex<BTreeMap<String, (std::time::Instant, Heal)>>>);

/// What to write again for a shadowed key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heal {
    /// An entry's or a tenant's record as believed (none: its tombstone).
    Value(Option<Vec<u8>>),
    /// Chunk `index` of the component at `path`.
    Chunk { path: PathBuf, index: u32 },
}

impl Shadowed {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (std::time::Instant, Heal)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn shadow(&self, key: &str, heal: Heal) {
        self.lock()
            .entry(key.to_string())
            .or_insert_with(|| (std::time::Instant::now(), heal));
    }

    fn believed(&self, key: &str) {
        self.lock().remove(key);
    }

    /// The keys shadowed for at least `for_at_least`, with what to write again; at most `max`.
    pub fn due(&self, for_at_least: Duration, max: usize) -> Vec<(String, Heal)> {
        self.lock()
            .iter()
            .filter(|(_, (since, _))| since.elapsed() >= for_at_least)
            .take(max)
            .map(|(k, (_, h))| (k.clone(), h.clone()))
            .collect()
    }

    /// How many keys are shadowed now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Watcher {
    /// Starts reading the registry of `cluster` and returns once everything written before
    /// now has been read (so a worker starts knowing every topology). Components are kept
    /// under `dir`. With `secret`, a record without a valid signature, or an old one written
    /// back, is skipped, counted in `rejected` and logged (a few lines a minute at most).
    pub fn start(
        kafka: &KafkaSettings,
        cluster: &str,
        dir: &Path,
        secret: Option<ClusterSecret>,
        rejected: Counter,
    ) -> anyhow::Result<Watcher> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let name = topic(cluster);
        let consumer = reader_consumer(kafka)?;
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
            topic: name.clone(),
            secret,
            rejected,
            log: RejectLog::default(),
            sequences: Sequences::default(),
            highest: Arc::new(std::sync::atomic::AtomicI64::new(0)),
            dir: dir.to_path_buf(),
            chunks: HashMap::new(),
            entries: BTreeMap::new(),
            tenants: BTreeMap::new(),
            changes: Default::default(),
            position: 0,
            believed: HashMap::new(),
            shadowed: Shadowed::default(),
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
        let highest = state.highest.clone();
        let shadowed = state.shadowed.clone();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let kafka = kafka.clone();
        let mut consumer = consumer;
        std::thread::Builder::new().name("registry".into()).spawn(move || {
            while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                if kafka.renewed(consumer.made()) {
                    // The client certificate was renewed on disk: a new reader from where
                    // this one is (tried again at the next poll if it cannot be made).
                    let fresh = reader_consumer(&kafka).and_then(|c| {
                        let mut tpl = TopicPartitionList::new();
                        let at = match state.position {
                            0 => Offset::Beginning,
                            n => Offset::Offset(n),
                        };
                        tpl.add_partition_offset(&state.topic, 0, at)?;
                        c.assign(&tpl)?;
                        Ok(c)
                    });
                    match fresh {
                        Ok(c) => {
                            tracing::info!("registry reader made again with the renewed client certificate");
                            let old = std::mem::replace(&mut consumer, c);
                            crate::drops::elsewhere(old);
                        }
                        Err(e) => {
                            tracing::warn!("making the registry reader again with the renewed certificate: {e:#}")
                        }
                    }
                }
                if state.poll(&consumer, Duration::from_millis(200)) {
                    tx.send_replace(Arc::new(state.snapshot()));
                }
            }
        })?;
        Ok(Watcher {
            updates: rx,
            stop,
            highest,
            shadowed,
        })
    }

    /// The highest record sequence read, kept current (a writer gives its records higher
    /// ones).
    pub fn highest_sequence(&self) -> Arc<std::sync::atomic::AtomicI64> {
        self.highest.clone()
    }

    /// The keys whose newest record is not believed, to write again.
    pub fn shadowed(&self) -> &Shadowed {
        &self.shadowed
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
    topic: String,
    /// Records are believed only with a valid signature under it (when there is one).
    secret: Option<ClusterSecret>,
    /// Records skipped for their signature or sequence.
    rejected: Counter,
    /// Says what was skipped, a few lines a minute at most.
    log: RejectLog,
    /// What was believed of each key, and the highest sequence read.
    sequences: Sequences,
    /// `sequences.highest()`, for this worker's writer.
    highest: Arc<std::sync::atomic::AtomicI64>,
    dir: PathBuf,
    /// Chunks of components not assembled yet, by digest and index.
    chunks: HashMap<String, BTreeMap<u32, Vec<u8>>>,
    entries: BTreeMap<String, (Entry, PathBuf)>,
    tenants: BTreeMap<String, tenants::RawTenant>,
    changes: std::collections::VecDeque<(String, i64)>,
    position: i64,
    /// The record believed of each entry and tenant key, as written (none: a tombstone).
    believed: HashMap<String, Option<Vec<u8>>>,
    shadowed: Shadowed,
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
            let Some(sequence) = self.signed(&m, key) else {
                self.shadowing(key);
                continue;
            };
            let judged = match parse_key(key) {
                Some(Record::Entry { .. } | Record::Tenant { .. }) => self.sequences.judge(key, sequence),
                _ => {
                    self.sequences.saw(sequence);
                    Ok(())
                }
            };
            self.highest
                .store(self.sequences.highest(), std::sync::atomic::Ordering::SeqCst);
            if let Err(stale) = judged {
                self.rejected.inc();
                self.log.skipped(key, m.offset(), format_args!("{stale}"));
                self.shadowing(key);
                continue;
            }
            self.shadowed.believed(key);
            if matches!(parse_key(key), Some(Record::Entry { .. } | Record::Tenant { .. })) {
                let value = m.payload().map(<[u8]>::to_vec);
                if self.believed.get(key) == Some(&value) && value.is_some() {
                    // The same record written again (a worker healing a shadowed key): nothing
                    // changes, and it is no deploy of the tenant's.
                    continue;
                }
                self.believed.insert(key.to_string(), value);
            }
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
                                self.changed_by(entry.tenant.clone(), at);
                                self.forget_component(&entry.digest);
                            }
                        }
                        Some(json) => match serde_json::from_slice::<Entry>(json) {
                            Ok(entry) => match self.assemble(&entry) {
                                Ok(path) => {
                                    self.changed_by(entry.tenant.clone(), at);
                                    let replaced = self.entries.insert(name.to_string(), (entry, path));
                                    if let Some((old, _)) = replaced {
                                        self.forget_component(&old.digest);
                                    }
                                }
                                Err(e) => tracing::error!(topology = name, "not running an uploaded topology: {e}"),
                            },
                            Err(e) => tracing::error!(topology = name, "an unreadable registry entry: {e}"),
                        },
                    }
                }
                Some(Record::Tenant { name }) => {
                    changed = true;
                    match m.payload().map(serde_json::from_slice::<tenants::RawTenant>) {
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

    /// The sequence of a record to believe (0: written before sequences, or without a
    /// secret): any, without a secret; with one, only a record whose signature checks (a
    /// skipped one is counted and logged).
    fn signed(&mut self, m: &BorrowedMessage<'_>, key: &str) -> Option<i64> {
        let Some(secret) = &self.secret else {
            return Some(0);
        };
        let header = |name: &str| {
            m.headers()
                .and_then(|h| h.iter().find(|h| h.key == name))
                .and_then(|h| h.value)
                .and_then(|v| std::str::from_utf8(v).ok())
        };
        let tag = header(SIGNATURE_HEADER).and_then(unhex);
        // No header: a record from before sequences. A header that is no number: forged.
        let sequence = match header(SEQUENCE_HEADER) {
            None => Some(0),
            Some(text) => text.parse::<i64>().ok().filter(|s| *s > 0),
        };
        let good = match (tag, sequence) {
            (Some(tag), Some(seq)) => record_signed(secret, &self.topic, key, m.payload(), seq, &tag),
            _ => false,
        };
        if !good {
            self.rejected.inc();
            self.log.skipped(
                key,
                m.offset(),
                format_args!(
                    "no valid signature: only what a worker of this cluster wrote (signed with its registry.secret) \
                     is believed"
                ),
            );
            return None;
        }
        sequence
    }

    /// A record of `key` was not believed: if this worker believes another record of it, the
    /// key is shadowed until a believed record of it is read again.
    fn shadowing(&mut self, key: &str) {
        if let Some(value) = self.believed.get(key) {
            self.shadowed.shadow(key, Heal::Value(value.clone()));
            return;
        }
        if let Some(Record::Chunk { digest, index }) = parse_key(key) {
            let path = self.component_path(digest);
            if self.entries.values().any(|(e, _)| e.digest == digest) && path.exists() {
                self.shadowed.shadow(key, Heal::Chunk { path, index });
            }
        }
    }

    /// Removes the component file of `digest` once no entry names it any more.
    fn forget_component(&mut self, digest: &str) {
        if self.entries.values().any(|(e, _)| e.digest == digest) {
            return;
        }
        let path = self.component_path(digest);
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::info!(file = %path.display(), "removed a component no topology uses any more"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(file = %path.display(), "removing a component no topology uses: {e}"),
        }
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
        // Written chunk by chunk and hashed as it goes (a component is never held twice).
        let partial = path.with_extension("partial");
        let write = || -> std::io::Result<(u64, String)> {
            use sha2::Digest as _;
            use std::io::Write as _;
            let mut file = std::io::BufWriter::new(std::fs::File::create(&partial)?);
            let (mut size, mut hash) = (0u64, sha2::Sha256::new());
            for chunk in chunks.into_values() {
                size += chunk.len() as u64;
                hash.update(&chunk);
                file.write_all(&chunk)?;
            }
            file.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            Ok((size, hash.finalize().iter().map(|b| format!("{b:02x}")).collect()))
        };
        let (size, hash) = write().map_err(|e| format!("writing {}: {e}", partial.display()))?;
        if size != entry.size || hash != entry.digest {
            let _ = std::fs::remove_file(&partial);
            return Err(format!("component {} does not match its digest or size", entry.digest));
        }
        std::fs::rename(&partial, &path).map_err(|e| format!("writing {}: {e}", path.display()))?;
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

/// Logs skipped registry records: at most [`RejectLog::PER_MINUTE`] lines a minute, each
/// naming at most the first 64 characters of the key (escaped), then one line saying how
/// many more were skipped. Nothing of a skipped record is kept.
#[derive(Default)]
struct RejectLog {
    window: Option<std::time::Instant>,
    logged: u32,
    more: u64,
}

impl RejectLog {
    const PER_MINUTE: u32 = 10;

    fn skipped(&mut self, key: &str, offset: i64, why: std::fmt::Arguments<'_>) {
        let now = std::time::Instant::now();
        if self
            .window
            .is_none_or(|w| now.duration_since(w) >= Duration::from_secs(60))
        {
            if self.more > 0 {
                tracing::warn!(
                    "skipped {} more registry record(s) in the last minute (see sluice_registry_rejected_records_total)",
                    self.more
                );
            }
            *self = RejectLog {
                window: Some(now),
                ..Default::default()
            };
        }
        if self.logged >= Self::PER_MINUTE {
            self.more += 1;
            return;
        }
        self.logged += 1;
        let shown = short_key(key);
        tracing::warn!(key = %shown, key_bytes = key.len(), offset, "skipping a registry record: {why}");
    }
}

/// At most the first 64 characters of a key, escaped to one line.
fn short_key(key: &str) -> String {
    let mut cut: String = key.chars().take(64).collect::<String>().escape_debug().collect();
    if key.chars().nth(64).is_some() {
        cut.push('…');
    }
    cut
}

/// The registry's consumer: read committed, no group, a bounded prefetch.
fn reader_consumer(kafka: &KafkaSettings) -> anyhow::Result<crate::kafka::Authorized<BaseConsumer>> {
    kafka
        .client()
        .set("group.id", "sluice.registry")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "100")
        .set("fetch.queue.backoff.ms", "10")
        // Anyone with write access may fill the topic: a bounded prefetch (chunks are
        // 512 KiB each).
        .set("queued.max.messages.kbytes", "16384")
        .authorized(kafka)
        .context("creating the registry reader")
}
