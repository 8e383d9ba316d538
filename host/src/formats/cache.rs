//! The worker's schemas: one registry client shared by all its tasks. Writer schemas are
//! kept by id for the worker's life (a registry never changes what an id names) within a
//! byte budget; the ids of the schemas its sinks write, by subject. Nothing here blocks a
//! task: a lookup answers at once (the schema, "wait", or why not), and the fetch or
//! registration it starts runs on the worker's runtime, retried with backoff while the
//! registry cannot be reached. A task waits only for what it needs; the others go on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_wire::SchemaKind;

use super::client::{Reference, RegistryClient, RegistryError};
use super::{Declared, Parsed};

/// A schema the registry named by id, parsed.
#[derive(Debug)]
pub struct WriterSchema {
    pub id: u32,
    pub kind: SchemaKind,
    pub text: String,
    /// The schemas it references (Protobuf imports, JSON Schema references), by name.
    pub imports: Vec<(String, String)>,
    pub parsed: Parsed,
}

impl WriterSchema {
    /// Bytes it is counted as in the cache (its texts, and what parsing them made).
    fn weight(&self) -> usize {
        let texts = self.text.len() + self.imports.iter().map(|(n, t)| n.len() + t.len()).sum::<usize>();
        256 + texts * 4
    }
}

/// Why a lookup has no answer yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// What is waited for, for people (`schema id 7`, `subject orders-value`).
    pub what: String,
    pub since: Instant,
    /// Requests made so far.
    pub attempts: u32,
    /// Why the last one failed.
    pub last_error: Option<String>,
}

/// The answer to a lookup.
#[derive(Debug, Clone)]
pub enum Lookup<T> {
    Ready(T),
    /// Being fetched (or registered): ask again.
    Waiting(Waiting),
    /// The registry said no (an id it does not know, a schema it refuses); the reason.
    Failed(String),
}

/// How long a "no" is believed before the registry is asked again (an operator may fix
/// what it said no to).
const FAILED_FOR: Duration = Duration::from_secs(30);
/// A schema id the registry does not know is asked again this many times before it counts
/// as unknown: a registry of several replicas may answer before it has caught up with the
/// write that made the id.
const NOT_FOUND_TRIES: u32 = 3;
/// Longest wait between two tries.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// References one schema may bring, all together.
const MAX_REFERENCES: usize = 256;
/// Entries for ids the registry does not know, at most (a tenant may write any id).
const MAX_FAILED: usize = 10_000;

enum IdEntry {
    Ready { schema: Arc<WriterSchema>, used: u64 },
    Fetching(Waiting),
    Failed { reason: String, at: Instant },
}

enum SubjectEntry {
    Ready(u32),
    Working(Waiting),
    Failed { reason: String, at: Instant },
}

#[derive(Default)]
struct State {
    ids: HashMap<u32, IdEntry>,
    subjects: HashMap<(String, [u8; 32], bool), SubjectEntry>,
    /// Bytes of the ready entries.
    bytes: usize,
    clock: u64,
    failed: usize,
}

struct Inner {
    client: Option<RegistryClient>,
    runtime: tokio::runtime::Handle,
    state: Mutex<State>,
    budget: usize,
    counters: Counters,
}

/// What the registry client has done, as metrics (`sluice_schema_registry_*`).
#[derive(Clone, Default)]
pub struct Counters {
    /// Requests made to the registry (every schema fetched, reference, registration).
    pub requests: prometheus_client::metrics::counter::Counter,
    /// Requests that failed (unreachable, refused, malformed answers).
    pub failures: prometheus_client::metrics::counter::Counter,
    /// Schemas dropped from the cache to keep it within its bytes.
    pub evictions: prometheus_client::metrics::counter::Counter,
    /// Bytes the cached schemas are counted as.
    pub cached_bytes: prometheus_client::metrics::gauge::Gauge,
}

impl Counters {
    /// Registers these under `registry` (the worker's metrics).
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "schema_registry_requests",
            "Requests the worker made to the Schema Registry",
            self.requests.clone(),
        );
        registry.register(
            "schema_registry_failures",
            "Requests to the Schema Registry that failed (unreachable, refused)",
            self.failures.clone(),
        );
        registry.register(
            "schema_cache_evictions",
            "Schemas dropped from the worker's cache to keep it within schema.registry.cache.max.bytes",
            self.evictions.clone(),
        );
        registry.register(
            "schema_cache_bytes",
            "Bytes of schemas the worker keeps",
            self.cached_bytes.clone(),
        );
    }
}

/// The worker's schemas (cheap to clone: one cache behind).
#[derive(Clone)]
pub struct Schemas {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Schemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schemas").field("client", &self.inner.client).finish()
    }
}

fn backoff(attempt: u32) -> Duration {
    let base = Duration::from_millis(100).saturating_mul(1 << attempt.min(10));
    let base = base.min(MAX_BACKOFF);
    // Up to a quarter more, so many workers do not ask in step.
    let jitter = (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos()) as u64)
        % (base.as_millis() as u64 / 4 + 1);
    base + Duration::from_millis(jitter)
}

impl Schemas {
    /// The schemas of a worker that talks to `client` (none: no registry configured, and a
    /// topology with formats cannot run) on `runtime`, keeping up to `budget` bytes.
    pub fn new(client: Option<RegistryClient>, runtime: tokio::runtime::Handle, budget: usize) -> Schemas {
        Schemas::with_counters(client, runtime, budget, Counters::default())
    }

    /// As [`Schemas::new`], counting into `counters` (registered with the worker's metrics).
    pub fn with_counters(
        client: Option<RegistryClient>,
        runtime: tokio::runtime::Handle,
        budget: usize,
        counters: Counters,
    ) -> Schemas {
        Schemas {
            inner: Arc::new(Inner {
                client,
                runtime,
                state: Mutex::new(State::default()),
                budget,
                counters,
            }),
        }
    }

    /// Whether a registry is configured.
    pub fn configured(&self) -> bool {
        self.inner.client.is_some()
    }

    /// The registry client, for checks made outside the cache (an upload's schemas).
    pub fn client(&self) -> Option<&RegistryClient> {
        self.inner.client.as_ref()
    }

    pub fn url(&self) -> Option<&str> {
        self.inner.client.as_ref().map(RegistryClient::url)
    }

    pub fn counters(&self) -> &Counters {
        &self.inner.counters
    }

    /// Bytes the cached schemas take.
    pub fn cached_bytes(&self) -> usize {
        self.lock().bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn no_registry() -> String {
        "no schema registry is configured for this worker: set registry.url (or --registry-url)".into()
    }

    /// The writer schema with id `id`: at once if cached; otherwise its fetch starts (or goes
    /// on) and the answer is to wait.
    pub fn writer(&self, id: u32) -> Lookup<Arc<WriterSchema>> {
        let Some(client) = self.inner.client.clone() else {
            return Lookup::Failed(Self::no_registry());
        };
        let mut state = self.lock();
        state.clock += 1;
        let clock = state.clock;
        match state.ids.get_mut(&id) {
            Some(IdEntry::Ready { schema, used }) => {
                *used = clock;
                return Lookup::Ready(schema.clone());
            }
            Some(IdEntry::Fetching(waiting)) => return Lookup::Waiting(waiting.clone()),
            Some(IdEntry::Failed { reason, at }) if at.elapsed() < FAILED_FOR => {
                return Lookup::Failed(reason.clone());
            }
            Some(IdEntry::Failed { .. }) => {
                state.failed -= 1;
            }
            None => {}
        }
        let waiting = Waiting {
            what: format!("schema id {id}"),
            since: Instant::now(),
            attempts: 0,
            last_error: None,
        };
        state.ids.insert(id, IdEntry::Fetching(waiting.clone()));
        drop(state);
        let inner = self.inner.clone();
        self.inner
            .runtime
            .spawn(async move { fetch_loop(inner, client, id).await });
        Lookup::Waiting(waiting)
    }

    /// The id of `declared` under `subject`: registered there first when `register`, else
    /// looked up (it must be there already). At once if known; otherwise the work starts (or
    /// goes on) and the answer is to wait.
    pub fn subject_id(&self, subject: &str, declared: &Arc<Declared>, register: bool) -> Lookup<u32> {
        let Some(client) = self.inner.client.clone() else {
            return Lookup::Failed(Self::no_registry());
        };
        let key = (subject.to_string(), declared.digest, register);
        let mut state = self.lock();
        match state.subjects.get(&key) {
            Some(SubjectEntry::Ready(id)) => return Lookup::Ready(*id),
            Some(SubjectEntry::Working(w)) => return Lookup::Waiting(w.clone()),
            Some(SubjectEntry::Failed { reason, at }) if at.elapsed() < FAILED_FOR => {
                return Lookup::Failed(reason.clone())
            }
            _ => {}
        }
        let waiting = Waiting {
            what: format!("subject {subject}"),
            since: Instant::now(),
            attempts: 0,
            last_error: None,
        };
        state
            .subjects
            .insert(key.clone(), SubjectEntry::Working(waiting.clone()));
        drop(state);
        let inner = self.inner.clone();
        let declared = declared.clone();
        self.inner
            .runtime
            .spawn(async move { subject_loop(inner, client, key, declared).await });
        Lookup::Waiting(waiting)
    }

    /// Waits (up to `timeout`) for the writer schema with id `id`: for tools, not tasks.
    pub async fn writer_now(&self, id: u32, timeout: Duration) -> Result<Arc<WriterSchema>, String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.writer(id) {
                Lookup::Ready(s) => return Ok(s),
                Lookup::Failed(e) => return Err(e),
                Lookup::Waiting(w) if Instant::now() >= deadline => {
                    return Err(format!(
                        "schema id {id}: no answer from the registry within {timeout:?}{}",
                        w.last_error.map(|e| format!(" ({e})")).unwrap_or_default()
                    ))
                }
                Lookup::Waiting(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Waits (up to `timeout`) for the id of `declared` under `subject`: for tools.
    pub async fn subject_id_now(
        &self,
        subject: &str,
        declared: &Arc<Declared>,
        register: bool,
        timeout: Duration,
    ) -> Result<u32, String> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.subject_id(subject, declared, register) {
                Lookup::Ready(id) => return Ok(id),
                Lookup::Failed(e) => return Err(e),
                Lookup::Waiting(w) if Instant::now() >= deadline => {
                    return Err(format!(
                        "subject {subject}: no answer from the registry within {timeout:?}{}",
                        w.last_error.map(|e| format!(" ({e})")).unwrap_or_default()
                    ))
                }
                Lookup::Waiting(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// What the cache holds, for `sluice status`: ready schemas, lookups under way.
    pub fn summary(&self) -> (usize, Vec<Waiting>) {
        let state = self.lock();
        let ready = state
            .ids
            .values()
            .filter(|e| matches!(e, IdEntry::Ready { .. }))
            .count();
        let mut waiting: Vec<Waiting> = state
            .ids
            .values()
            .filter_map(|e| match e {
                IdEntry::Fetching(w) => Some(w.clone()),
                _ => None,
            })
            .chain(state.subjects.values().filter_map(|e| match e {
                SubjectEntry::Working(w) => Some(w.clone()),
                _ => None,
            }))
            .collect();
        waiting.sort_by_key(|w| w.since);
        (ready, waiting)
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self, result: &Result<impl Sized, RegistryError>) {
        self.counters.requests.inc();
        if result.is_err() {
            self.counters.failures.inc();
        }
    }

    /// Keeps the ready entries within the budget, dropping the least recently used.
    fn evict(&self, state: &mut State) {
        self.evict_over_budget(state);
        self.counters.cached_bytes.set(state.bytes as i64);
    }

    fn evict_over_budget(&self, state: &mut State) {
        while state.bytes > self.budget {
            let Some((&id, _)) = state
                .ids
                .iter()
                .filter_map(|(id, e)| match e {
                    IdEntry::Ready { used, .. } => Some((id, *used)),
                    _ => None,
                })
                .min_by_key(|(_, used)| *used)
            else {
                break;
            };
            if let Some(IdEntry::Ready { schema, .. }) = state.ids.remove(&id) {
                state.bytes -= schema.weight();
                self.counters.evictions.inc();
            }
        }
        if state.failed > MAX_FAILED {
            let mut failed: Vec<(u32, Instant)> = state
                .ids
                .iter()
                .filter_map(|(id, e)| match e {
                    IdEntry::Failed { at, .. } => Some((*id, *at)),
                    _ => None,
                })
                .collect();
            failed.sort_by_key(|(_, at)| *at);
            for (id, _) in failed.iter().take(state.failed - MAX_FAILED / 2) {
                state.ids.remove(id);
            }
            state.failed = state
                .ids
                .values()
                .filter(|e| matches!(e, IdEntry::Failed { .. }))
                .count();
        }
    }
}

/// Why fetching a schema failed.
enum FetchError {
    /// Worth asking again.
    Transient(String),
    /// The registry does not know the id.
    NotFound(String),
    /// It knows it, but what it holds cannot be used (does not parse, a reference missing).
    Unusable(String),
}

async fn fetch_loop(inner: Arc<Inner>, client: RegistryClient, id: u32) {
    let mut attempt: u32 = 0;
    let mut not_found = 0;
    loop {
        let outcome = fetch(&inner, &client, id).await;
        attempt += 1;
        let done = {
            let mut state = inner.lock();
            match outcome {
                Ok(schema) => {
                    state.clock += 1;
                    state.bytes += schema.weight();
                    let used = state.clock;
                    state.ids.insert(
                        id,
                        IdEntry::Ready {
                            schema: Arc::new(schema),
                            used,
                        },
                    );
                    inner.evict(&mut state);
                    true
                }
                Err(FetchError::NotFound(reason)) if not_found + 1 >= NOT_FOUND_TRIES => {
                    state.ids.insert(
                        id,
                        IdEntry::Failed {
                            reason,
                            at: Instant::now(),
                        },
                    );
                    state.failed += 1;
                    inner.evict(&mut state);
                    true
                }
                Err(FetchError::Unusable(reason)) => {
                    state.ids.insert(
                        id,
                        IdEntry::Failed {
                            reason,
                            at: Instant::now(),
                        },
                    );
                    state.failed += 1;
                    inner.evict(&mut state);
                    true
                }
                Err(FetchError::NotFound(reason)) => {
                    not_found += 1;
                    if let Some(IdEntry::Fetching(w)) = state.ids.get_mut(&id) {
                        w.attempts = attempt;
                        w.last_error = Some(reason);
                    }
                    false
                }
                Err(FetchError::Transient(reason)) => {
                    if let Some(IdEntry::Fetching(w)) = state.ids.get_mut(&id) {
                        w.attempts = attempt;
                        w.last_error = Some(reason.clone());
                    }
                    if attempt == 1 || attempt.is_multiple_of(10) {
                        tracing::warn!(
                            schema_id = id,
                            attempt,
                            "fetching a schema from the registry: {reason}; trying again"
                        );
                    }
                    false
                }
            }
        };
        if done {
            return;
        }
        // An id the registry does not know yet is asked again soon, a few times; a registry
        // that cannot be reached, with a growing backoff.
        let wait = if not_found > 0 {
            Duration::from_millis(500) * not_found
        } else {
            backoff(attempt)
        };
        tokio::time::sleep(wait).await;
    }
}

async fn fetch(inner: &Inner, client: &RegistryClient, id: u32) -> Result<WriterSchema, FetchError> {
    let result = client.schema_by_id(id).await;
    inner.count(&result);
    let fetched = match result {
        Ok(f) => f,
        Err(e) if e.is_not_found() => {
            return Err(FetchError::NotFound(format!(
                "the schema registry does not know schema id {id}: {e}"
            )))
        }
        Err(e) if e.is_transient() => return Err(FetchError::Transient(e.to_string())),
        Err(e) => return Err(FetchError::Unusable(format!("schema id {id}: {e}"))),
    };
    let imports = references(inner, client, &fetched.references)
        .await
        .map_err(|e| match e {
            FetchError::Unusable(m) | FetchError::NotFound(m) => {
                FetchError::Unusable(format!("schema id {id} refers to what the registry cannot give: {m}"))
            }
            t => t,
        })?;
    let parsed = Parsed::parse(fetched.kind, &fetched.text, &imports)
        .map_err(|e| FetchError::Unusable(format!("the registry's schema id {id} is {e}")))?;
    Ok(WriterSchema {
        id,
        kind: fetched.kind,
        text: fetched.text,
        imports,
        parsed,
    })
}

/// The texts of `references` and of what they reference in turn, by import name.
async fn references(
    inner: &Inner,
    client: &RegistryClient,
    references: &[Reference],
) -> Result<Vec<(String, String)>, FetchError> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut todo: Vec<Reference> = references.to_vec();
    while let Some(r) = todo.pop() {
        if out.iter().any(|(name, _)| *name == r.name) {
            continue;
        }
        if out.len() >= MAX_REFERENCES {
            return Err(FetchError::Unusable(format!("more than {MAX_REFERENCES} references")));
        }
        let result = client.subject_version(&r.subject, &r.version.to_string()).await;
        inner.count(&result);
        let version = match result {
            Ok(v) => v,
            Err(e) if e.is_transient() => return Err(FetchError::Transient(e.to_string())),
            Err(e) => {
                return Err(FetchError::Unusable(format!(
                    "reference {} (subject {} version {}): {e}",
                    r.name, r.subject, r.version
                )))
            }
        };
        todo.extend(version.schema.references.iter().cloned());
        out.push((r.name, version.schema.text));
    }
    Ok(out)
}

async fn subject_loop(
    inner: Arc<Inner>,
    client: RegistryClient,
    key: (String, [u8; 32], bool),
    declared: Arc<Declared>,
) {
    let (subject, _, register) = key.clone();
    let mut attempt: u32 = 0;
    loop {
        let outcome = subject_once(&inner, &client, &subject, &declared, register).await;
        attempt += 1;
        let done = {
            let mut state = inner.lock();
            match outcome {
                Ok(id) => {
                    state.subjects.insert(key.clone(), SubjectEntry::Ready(id));
                    true
                }
                Err(e) if !e.is_transient() => {
                    let reason = match &e {
                        RegistryError::Refused {
                            status: 409, message, ..
                        } => format!(
                            "the schema registry refuses the schema under subject {subject}: it is not compatible \
                             with the versions there ({message})"
                        ),
                        RegistryError::Refused { status: 404, .. } if !register => format!(
                            "the schema is not registered under subject {subject}, and the manifest says it must \
                             be (formats.auto-register = false): register it, or let the topology do so"
                        ),
                        other => format!("subject {subject}: {other}"),
                    };
                    state.subjects.insert(
                        key.clone(),
                        SubjectEntry::Failed {
                            reason,
                            at: Instant::now(),
                        },
                    );
                    true
                }
                Err(e) => {
                    if let Some(SubjectEntry::Working(w)) = state.subjects.get_mut(&key) {
                        w.attempts = attempt;
                        w.last_error = Some(e.to_string());
                    }
                    if attempt == 1 || attempt.is_multiple_of(10) {
                        tracing::warn!(%subject, attempt, "registering a schema: {e}; trying again");
                    }
                    false
                }
            }
        };
        if done {
            return;
        }
        tokio::time::sleep(backoff(attempt)).await;
    }
}

/// Registers (or looks up) `declared` under `subject`, its imports first, each under its
/// import path as Confluent's serializers do (Google's well-known types are not
/// registered: every registry knows them).
async fn subject_once(
    inner: &Inner,
    client: &RegistryClient,
    subject: &str,
    declared: &Declared,
    register: bool,
) -> Result<u32, RegistryError> {
    let mut references = Vec::new();
    for (path, text) in &declared.schema.imports {
        let result = if register {
            client.register(path, declared.schema.kind, text, &[]).await
        } else {
            Ok(0)
        };
        inner.count(&result);
        result?;
        let found = client.lookup_version(path, declared.schema.kind, text, &[]).await;
        inner.count(&found);
        let (_, version) = found?;
        references.push(Reference {
            name: path.clone(),
            subject: path.clone(),
            version,
        });
    }
    let result = if register {
        client
            .register(subject, declared.schema.kind, &declared.schema.text, &references)
            .await
    } else {
        client
            .lookup_version(subject, declared.schema.kind, &declared.schema.text, &references)
            .await
            .map(|(id, _)| id)
    };
    inner.count(&result);
    result
}
