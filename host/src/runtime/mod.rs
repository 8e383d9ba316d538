//! The Wasm sandbox: one wasmtime `Engine` per process, each topology compiled once, one
//! `Store` and instance per task, with a memory cap and a deadline on every call.
//!
//! ```no_run
//! use sluice::runtime::{Runtime, RuntimeConfig};
//! # fn main() -> anyhow::Result<()> {
//! let runtime = Runtime::new(&RuntimeConfig::default())?;
//! let topology = runtime.load("uppercase.wasm")?;
//! println!("{:?}", topology.description());
//! # Ok(()) }
//! ```
//!
//! The sandbox policy lives here and nowhere else: guests get no filesystem, network,
//! environment or clock beyond what the `sluice:topology/host` interface offers (WASI is
//! linked only because Rust's `wasm32-wasip2` standard library imports it; its clocks say
//! no more than `host.now-ms`, its random is bounded per call, every other capability in it
//! is denied, and stdout/stderr go to a small per-task buffer used to explain traps).

mod cache;
pub mod compiler;
mod contract;
mod description;
mod fault;
mod host;
mod instance;
pub mod progress;
pub mod scan;
mod state_host;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use contract::{check_world, is_processor, not_a_topology, ContractVersion, PROCESSOR_FUNCTIONS};
pub use contract::{WIT_VERSION, WIT_VERSION_V1};
pub use fault::GuestFault;
pub use host::TaskData;
pub use instance::{CallOutput, Operators, TaskInstance};
pub use state_host::NamedStore;

/// Generated from `wit/`; kept private behind the types of this module. The world is
/// `sluice:topology@0.2.0`; the host's interfaces it imports are those of 0.1.0
/// (`wit/deps/topology-0.1.0/`), so one linker serves components of both versions.
mod bindings {
    wasmtime::component::bindgen!({
        world: "topology",
        path: "../wit",
        // Host functions may trap: a guest that exceeds a budget or asks for what it may
        // not have ends its call (see `TaskData::deny`).
        imports: { default: trappable },
        with: {
            "sluice:topology/state.store": super::state_host::StoreHandle,
            "sluice:topology/state.scan": super::state_host::ScanState,
        },
    });
}

/// The exports of a `sluice:topology@0.1.0` component (one sub-topology); its imports are
/// the ones [`bindings`] links.
mod bindings_v1 {
    wasmtime::component::bindgen!({
        world: "sluice:topology/topology@0.1.0",
        path: "../wit",
        imports: { default: trappable },
        with: {
            "sluice:topology/types@0.1.0": super::bindings::sluice::topology0_1_0::types,
            "sluice:topology/host@0.1.0": super::bindings::sluice::topology0_1_0::host,
            "sluice:topology/state@0.1.0": super::bindings::sluice::topology0_1_0::state,
        },
    });
}

pub use bindings::sluice::topology0_1_0::types::Level as GuestLevel;

/// How long one epoch tick lasts; call deadlines are rounded up to whole ticks.
const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Sandbox limits and engine settings. Defaults suit a worker running a few hundred tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// Linear memory one task instance may grow to.
    pub memory_limit: usize,
    /// Longest one guest call (a batch, a punctuation, init, close) may run.
    pub call_timeout: Duration,
    /// Bytes a task's guest calls may make the host hold: records emitted through
    /// `host.emit` in one call plus state writes not yet committed.
    pub host_memory_limit: usize,
    /// Use the pooling allocator (pre-reserved slots, fast instantiation). Falls back to
    /// on-demand allocation when the machine refuses the reservation.
    pub pooling: bool,
    /// Instances the pooling allocator has room for (one per task).
    pub max_instances: u32,
    /// Where compiled components are kept (see [`cache`]); none: compile every time.
    pub compile_cache: Option<PathBuf>,
    /// How much a component may hold to be compiled at all (see [`scan`]).
    pub compile_bounds: scan::Bounds,
    /// Compile in a child process under a deadline and a memory cap (see [`compiler`]);
    /// none: in this process (tests, and tools that load a component once).
    pub compile_in_child: Option<compiler::ChildCompiler>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            memory_limit: 64 << 20,
            call_timeout: Duration::from_secs(5),
            host_memory_limit: 64 << 20,
            pooling: true,
            max_instances: 1000,
            compile_cache: None,
            compile_bounds: scan::Bounds::default(),
            compile_in_child: None,
        }
    }
}

/// Loading a component failed; the message says which file and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read component {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path} is not a WebAssembly component: {detail}")]
    NotAComponent { path: String, detail: String },
    #[error("component {path} does not fit the sluice:topology@{WIT_VERSION} world: {detail}")]
    WrongWorld { path: String, detail: String },
    #[error(
        "component {path} was built for sluice:topology@{found}; this worker runs sluice:topology@{WIT_VERSION} \
         (and @{WIT_VERSION_V1}) topologies: rebuild it with a sluice-guest for {WIT_VERSION}"
    )]
    WrongVersion { path: String, found: String },
    #[error(
        "component {path} exports sluice:topology/processor without {}: a topology exports all of {}",
        missing.join(", "),
        PROCESSOR_FUNCTIONS.join(", ")
    )]
    MissingExport { path: String, missing: Vec<String> },
    #[error("component {path} failed while describing itself: {fault}")]
    Describe { path: String, fault: GuestFault },
    #[error("component {path} describes itself inconsistently: {detail}")]
    BadDescription { path: String, detail: String },
    /// The component makes more core instances, memories or tables than one task may.
    #[error("component {path} is larger than a topology may be: {detail}")]
    TooLarge { path: String, detail: String },
    /// The limits asked for are not ones this worker gives (see [`LoadedTopology::with_limits`]).
    #[error("{detail}")]
    Limits { path: String, detail: String },
    /// The component holds more than this worker compiles for a topology (see [`scan`]).
    #[error("component {path} is not compiled: {detail}")]
    TooComplex { path: String, detail: String },
}

/// The process-wide engine, linker and epoch ticker.
pub struct Runtime {
    engine: Engine,
    linker: Linker<TaskData>,
    config: RuntimeConfig,
    pooling: bool,
    ticker_stop: Arc<AtomicBool>,
    /// Compiles under way and the last ones done (`GET /status`).
    compiles: progress::Compiles,
}

impl Runtime {
    pub fn new(config: &RuntimeConfig) -> anyhow::Result<Runtime> {
        let (engine, pooling) = if config.pooling {
            match Engine::new(&engine_config(config, true)) {
                Ok(engine) => (engine, true),
                Err(e) => {
                    tracing::warn!("pooling allocator unavailable ({e:#}); allocating instances on demand");
                    (Engine::new(&engine_config(config, false))?, false)
                }
            }
        } else {
            (Engine::new(&engine_config(config, false))?, false)
        };

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        bindings::Topology::add_to_linker::<_, HasSelf<_>>(&mut linker, |data: &mut TaskData| data)?;
        deny_blocking(&mut linker)?;

        // Epoch interruption bounds every call: a thread bumps the epoch every tick and a
        // store traps once its deadline (set per call) passes.
        let ticker_stop = Arc::new(AtomicBool::new(false));
        let ticker_engine = engine.weak();
        let stop = ticker_stop.clone();
        std::thread::Builder::new().name("sluice-epoch".into()).spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                match ticker_engine.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => break,
                }
            }
        })?;

        Ok(Runtime {
            engine,
            linker,
            config: config.clone(),
            pooling,
            ticker_stop,
            compiles: progress::Compiles::default(),
        })
    }

    /// Compiles under way on this runtime, then the last ones done (see [`progress`]).
    pub fn compiles(&self) -> Vec<progress::CompileStatus> {
        self.compiles.status()
    }

    /// Whether instances come from the pooling allocator.
    pub fn is_pooling(&self) -> bool {
        self.pooling
    }

    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// Compiles a component file, checks it against the world and asks it to describe itself.
    pub fn load(&self, path: impl AsRef<Path>) -> Result<LoadedTopology, LoadError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: shown.clone(),
            source,
        })?;
        self.load_bytes(&shown, &bytes)
    }

    /// As [`Runtime::load`], from bytes; `name` is used in errors.
    pub fn load_bytes(&self, name: &str, bytes: &[u8]) -> Result<LoadedTopology, LoadError> {
        self.load_bytes_under(name, bytes, &crate::manifest::Limits::default())
    }

    /// As [`Runtime::load_bytes`], with `limits` applied before the component describes
    /// itself: a tenant's upload describes itself under its own caps, not the worker's.
    pub fn load_bytes_under(
        &self,
        name: &str,
        bytes: &[u8],
        limits: &crate::manifest::Limits,
    ) -> Result<LoadedTopology, LoadError> {
        self.load_topology("", name, bytes, limits)
    }

    /// As [`Runtime::load_bytes_under`], for the topology `topology`: a compile it needs shows
    /// under that name in [`Runtime::compiles`].
    pub fn load_topology(
        &self,
        topology: &str,
        name: &str,
        bytes: &[u8],
        limits: &crate::manifest::Limits,
    ) -> Result<LoadedTopology, LoadError> {
        let path = name.to_string();
        if !is_component(bytes) {
            let detail = if bytes.starts_with(b"\0asm") {
                "it is a core Wasm module; build it for wasm32-wasip2 (or wrap it with `wasm-tools component new`)"
                    .to_string()
            } else {
                "it does not start with the Wasm magic bytes".to_string()
            };
            return Err(LoadError::NotAComponent { path, detail });
        }
        // Counted before compiling: what it would cost to compile, and whether it is a
        // topology at all.
        let counted = scan::count(bytes).map_err(|detail| LoadError::NotAComponent {
            path: path.clone(),
            detail,
        })?;
        self.config
            .compile_bounds
            .check(&counted)
            .map_err(|detail| LoadError::TooComplex {
                path: path.clone(),
                detail,
            })?;
        if !counted.exports.iter().any(|e| is_processor(e)) {
            return Err(not_a_topology(&path, &counted.exports));
        }
        let (component, from_cache) = self.compile(topology, &path, bytes)?;
        let version = check_world(&self.engine, &component, &path)?;
        let pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| LoadError::WrongWorld {
                path: path.clone(),
                detail: format!("{e:#}"),
            })?;
        let wrong_world = |e: wasmtime::Error| LoadError::WrongWorld {
            path: path.clone(),
            detail: format!("{e:#}"),
        };
        let pre = match version {
            ContractVersion::V2 => instance::Pre::V2(bindings::TopologyPre::new(pre).map_err(wrong_world)?),
            ContractVersion::V1 => instance::Pre::V1(bindings_v1::TopologyPre::new(pre).map_err(wrong_world)?),
        };
        let topology = LoadedTopology {
            pre,
            description: Default::default(),
            operators: Vec::new(),
            holds_back: false,
            engine: self.engine.clone(),
            config: self.config.clone(),
            from_cache,
            footprint: Footprint {
                core_instances: counted.core_instances,
                memories: counted.memories,
                tables: counted.tables,
            },
        }
        .with_limits(limits)
        .map_err(|detail| LoadError::Limits {
            path: path.clone(),
            detail,
        })?;
        let (description, operators, holds_back) = topology.describe().map_err(|fault| match fault {
            // The component makes more core instances, memories or tables than a task may.
            GuestFault::Instantiate { detail } if detail.contains("count too high") => LoadError::TooLarge {
                path: path.clone(),
                detail: format!(
                    "{detail} (a topology may create at most {} core instances, {} memories and {} tables)",
                    host::MAX_CORE_INSTANCES,
                    host::MAX_MEMORIES,
                    host::MAX_TABLES
                ),
            },
            fault => LoadError::Describe {
                path: path.clone(),
                fault,
            },
        })?;
        description::check(&description).map_err(|detail| LoadError::BadDescription { path, detail })?;
        Ok(LoadedTopology {
            description,
            operators,
            holds_back,
            ..topology
        })
    }
}

impl Runtime {
    /// Removes what the compile cache keeps of the component whose SHA-256 is `digest` (hex):
    /// its topology was deleted and no other uses it.
    pub fn forget_compiled(&self, digest: &str) {
        if let Some(dir) = &self.config.compile_cache {
            cache::forget(dir, digest);
        }
    }

    /// The component compiled: from the compile cache when it holds this component for this
    /// engine, else by Cranelift (and then kept in the cache). True: it came from the cache.
    fn compile(&self, topology: &str, path: &str, bytes: &[u8]) -> Result<(Component, bool), LoadError> {
        let cache = self
            .config
            .compile_cache
            .as_deref()
            .map(|dir| cache::Cache::new(dir, &self.engine));
        if let Some(found) = cache.as_ref().and_then(|c| c.get(bytes)) {
            tracing::debug!(component = %path, "compiled code from the compile cache");
            return Ok((found, true));
        }
        let started = std::time::Instant::now();
        let compiling = self.compiles.start(topology, path, bytes.len());
        let compiled = self.compile_now(path, bytes);
        match &compiled {
            Ok(_) => compiling.done(),
            Err(e) => compiling.failed(e.to_string()),
        }
        let component = compiled?;
        tracing::debug!(component = %path, seconds = started.elapsed().as_secs_f64(), "compiled");
        if let Some(cache) = &cache {
            cache.put(bytes, &component);
        }
        Ok((component, false))
    }

    /// Cranelift's compile of `bytes`, in a child process when the config says so.
    fn compile_now(&self, path: &str, bytes: &[u8]) -> Result<Component, LoadError> {
        let component = match &self.config.compile_in_child {
            Some(child) => {
                let serialized = child.compile(bytes).map_err(|e| match e {
                    compiler::ChildError::OverLimit(detail) => LoadError::TooComplex {
                        path: path.to_string(),
                        detail,
                    },
                    compiler::ChildError::Failed(detail) => compile_error(path, detail),
                })?;
                // SAFETY: the bytes are what `Engine::precompile_component` wrote, in a
                // directory of this worker's, for an engine configured as this one;
                // wasmtime checks the header (version, settings) again and refuses a mismatch.
                unsafe { Component::deserialize(&self.engine, &serialized) }
                    .map_err(|e| compile_error(path, format!("{e:#}")))?
            }
            None => Component::new(&self.engine, bytes).map_err(|e| compile_error(path, format!("{e:#}")))?,
        };
        Ok(component)
    }
}

/// The error of a component that did not compile (or load once compiled): `detail`.
fn compile_error(path: &str, detail: String) -> LoadError {
    // The pooling allocator's per-component caps (see `host::MAX_*`).
    if detail.contains("exceeds the configured maximum") {
        LoadError::TooLarge {
            path: path.to_string(),
            detail: format!(
                "{detail} (a topology may create at most {} core instances, {} memories and {} tables)",
                host::MAX_CORE_INSTANCES,
                host::MAX_MEMORIES,
                host::MAX_TABLES
            ),
        }
    } else {
        LoadError::NotAComponent {
            path: path.to_string(),
            detail,
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}

/// The WASI version whose `poll` interface [`deny_blocking`] replaces (the one
/// `wasmtime_wasi` links).
const WASI_POLL: &str = "wasi:io/poll@0.2.12";

/// A call must never block: the epoch deadline cannot interrupt a host function, so a
/// guest sleeping or waiting inside WASI (`std::thread::sleep`, `poll`) would hold its task
/// past any deadline. Both ways to wait end the call with a `denied` fault instead.
fn deny_blocking(linker: &mut Linker<TaskData>) -> anyhow::Result<()> {
    use wasmtime::component::Resource;
    use wasmtime_wasi::p2::DynPollable;
    const WHY: &str = "a call must not wait (sleeping or polling blocks the task past its deadline)";
    linker.allow_shadowing(true);
    let mut poll = linker.instance(WASI_POLL)?;
    poll.func_wrap(
        "[method]pollable.block",
        |mut store: wasmtime::StoreContextMut<'_, TaskData>, _: (Resource<DynPollable>,)| -> wasmtime::Result<()> {
            Err(store.data_mut().deny(GuestFault::Denied {
                call: "wasi:io/poll pollable.block (e.g. std::thread::sleep)",
                why: WHY,
            }))
        },
    )?;
    poll.func_wrap(
        "poll",
        |mut store: wasmtime::StoreContextMut<'_, TaskData>,
         _: (Vec<Resource<DynPollable>>,)|
         -> wasmtime::Result<(Vec<u32>,)> {
            Err(store.data_mut().deny(GuestFault::Denied {
                call: "wasi:io/poll poll",
                why: WHY,
            }))
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// Bytes of a released pool slot's memory (and table) kept resident and reset in place:
/// what a small topology touches (its stack, data and a first heap); the rest is given back.
const KEEP_RESIDENT: usize = 256 << 10;

fn engine_config(config: &RuntimeConfig, pooling: bool) -> Config {
    let mut c = Config::new();
    c.wasm_component_model(true);
    c.epoch_interruption(true);
    c.cranelift_opt_level(wasmtime::OptLevel::Speed);
    // `SLUICE_WASM_PROFILER=perfmap` names guest code in `perf` profiles (/tmp/perf-PID.map).
    if std::env::var("SLUICE_WASM_PROFILER").as_deref() == Ok("perfmap") {
        c.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    if pooling {
        let mut pool = PoolingAllocationConfig::default();
        let n = config.max_instances;
        pool.total_component_instances(n);
        // Core instances are a count, not reserved memory: room for every task's component to
        // make as many as one component may (a Rust topology makes 3, a Python one 14).
        pool.total_core_instances(n.saturating_mul(host::MAX_CORE_INSTANCES as u32));
        let (_, memories, tables) = pool_totals(n);
        pool.total_memories(u32::try_from(memories).unwrap_or(u32::MAX));
        pool.total_tables(u32::try_from(tables).unwrap_or(u32::MAX));
        pool.total_stacks(n);
        pool.max_memory_size(config.memory_limit);
        // What one component may hold at most (the store's limiter says the same, for
        // on-demand allocation too): see `host::MAX_*`.
        pool.max_core_instances_per_component(host::MAX_CORE_INSTANCES as u32);
        pool.max_memories_per_component(host::MAX_MEMORIES as u32);
        pool.max_tables_per_component(host::MAX_TABLES as u32);
        // A slot given back keeps the pages its instance touched: with PAGEMAP_SCAN (Linux
        // 6.7+) only those are reset, by memset, so the next instance in the slot takes no
        // page faults and the release no madvise (and no TLB shootdown across threads).
        pool.pagemap_scan(wasmtime::Enabled::Auto);
        pool.linear_memory_keep_resident(KEEP_RESIDENT);
        pool.table_keep_resident(KEEP_RESIDENT);
        // Reuse released slots before fresh ones, so the slots ever used (and what they keep
        // resident) never outnumber the most instances alive at once.
        pool.max_unused_warm_slots(0);
        c.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    c
}

fn is_component(bytes: &[u8]) -> bool {
    // A component has the Wasm magic and layer 1 in the version field; a core module layer 0.
    bytes.len() >= 8 && bytes.starts_with(b"\0asm") && bytes[6..8] == [1, 0]
}

/// A compiled topology, ready to instantiate for tasks.
#[derive(Clone)]
pub struct LoadedTopology {
    pre: instance::Pre,
    description: sluice_wire::Description,
    /// What it says of its operators, per sub-topology (for people; see
    /// [`TaskInstance::describe_operators`]).
    operators: Operators,
    /// Whether its guest may hold updates back between calls (see [`Self::holds_back`]).
    holds_back: bool,
    engine: Engine,
    config: RuntimeConfig,
    from_cache: bool,
    /// What one instance takes of the pooling allocator, as counted before compiling.
    footprint: Footprint,
}

/// What one instance of a component takes of the pooling allocator: its core instances,
/// memories and tables (counted in the component, see [`scan`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    pub core_instances: u64,
    pub memories: u64,
    pub tables: u64,
}

impl Footprint {
    /// How many instances of this footprint a worker's pool of `max_instances` holds.
    pub fn capacity(&self, max_instances: u32) -> u64 {
        let n = u64::from(max_instances);
        let (cores, memories, tables) = pool_totals(max_instances);
        let fit = |total: u64, each: u64| total.checked_div(each).unwrap_or(u64::MAX);
        n.min(fit(cores, self.core_instances))
            .min(fit(memories, self.memories))
            .min(fit(tables, self.tables))
    }
}

/// The pool's core instances, memories and tables in all, for `max_instances` task instances.
fn pool_totals(max_instances: u32) -> (u64, u64, u64) {
    let n = u64::from(max_instances);
    (n * host::MAX_CORE_INSTANCES as u64, n * 2, n * 4)
}

impl LoadedTopology {
    /// What one of its instances takes of the pooling allocator.
    pub fn footprint(&self) -> Footprint {
        self.footprint
    }

    /// Whether its compiled code came from the compile cache (not from Cranelift).
    pub fn from_cache(&self) -> bool {
        self.from_cache
    }

    pub fn description(&self) -> &sluice_wire::Description {
        &self.description
    }

    /// What the topology says of its operators, per sub-topology: lines for people, bounded
    /// and cleaned; empty if it says nothing.
    pub fn operators(&self) -> &[(String, Vec<String>)] {
        &self.operators
    }

    /// Whether its guest may hold updates back between calls (the DSL's record caches,
    /// open windows): then its tasks punctuate it before every commit, so that no commit
    /// takes a store's write without the output it stands for. A topology that describes
    /// operators has them; one whose `describe-operators` faults is taken to (the flush
    /// costs a call per commit; taken not to, its commits could hold state ahead of its
    /// outputs).
    pub fn holds_back(&self) -> bool {
        self.holds_back
    }

    /// The same topology with a manifest's limits applied. A manifest may only lower the
    /// worker's limits, never raise them (the pooling allocator's slots are sized for the
    /// worker's memory limit, and the others are what the operator allows one task).
    pub fn with_limits(&self, limits: &crate::manifest::Limits) -> Result<LoadedTopology, String> {
        let mut config = self.config.clone();
        let above = |key: &str, asked: String, worker: String, flag: &str| {
            format!(
                "limits.{key} ({asked}) is more than the worker allows ({worker}, its {flag}): a manifest may only \
                 lower the worker's limits"
            )
        };
        if let Some(memory) = limits.memory {
            if memory > self.config.memory_limit {
                return Err(above(
                    "memory",
                    format!("{memory} bytes"),
                    format!("{} bytes", self.config.memory_limit),
                    "--memory-limit",
                ));
            }
            config.memory_limit = memory;
        }
        if let Some(timeout) = limits.call_timeout {
            if timeout > self.config.call_timeout {
                return Err(above(
                    "call-timeout",
                    format!("{timeout:?}"),
                    format!("{:?}", self.config.call_timeout),
                    "--call-timeout",
                ));
            }
            config.call_timeout = timeout;
        }
        if let Some(bytes) = limits.host_memory {
            if bytes > self.config.host_memory_limit {
                return Err(above(
                    "host-memory",
                    format!("{bytes} bytes"),
                    format!("{} bytes", self.config.host_memory_limit),
                    "--host-memory-limit",
                ));
            }
            config.host_memory_limit = bytes;
        }
        Ok(LoadedTopology { config, ..self.clone() })
    }

    /// The limits its instances run with.
    pub fn limits(&self) -> &RuntimeConfig {
        &self.config
    }

    /// Its description, what it says of its operators, and whether it holds updates back
    /// (see [`Self::holds_back`]). A topology whose operator description faults is
    /// described without one, and taken to hold updates back.
    fn describe(&self) -> Result<(sluice_wire::Description, Operators, bool), GuestFault> {
        let mut instance = TaskInstance::new(self, "(describe)", Vec::new(), Vec::new())?;
        let mut description = instance.describe()?;
        // Unlike operators, formats decide how records are read and written: a guest that
        // faults declaring them cannot run.
        description.formats = instance.describe_formats()?;
        let (operators, holds_back) = match instance.describe_operators() {
            Ok(operators) => {
                let holds_back = !operators.is_empty();
                (operators, holds_back)
            }
            Err(fault) => {
                tracing::warn!(
                    topology = %description.name,
                    "describing its operators: {fault}; its tasks send on what it holds back before every commit all the same"
                );
                (Vec::new(), true)
            }
        };
        Ok((description, operators, holds_back))
    }

    /// A fresh instance for one task; `label` tags its log lines. `stores` are the task's
    /// state stores; a store the topology declared but that is not given cannot be opened.
    pub fn instantiate(
        &self,
        label: &str,
        sinks: Vec<String>,
        stores: Vec<NamedStore>,
    ) -> Result<TaskInstance, GuestFault> {
        TaskInstance::new(self, label, sinks, stores)
    }

    /// A fresh instance with an empty in-memory store for each declared store (global ones too).
    pub fn instantiate_in_memory(&self, label: &str) -> Result<TaskInstance, GuestFault> {
        let globals = self.description.global_stores.iter().map(|g| &g.name);
        let stores = (self.description.stores.iter())
            .chain(globals)
            .map(|name| NamedStore {
                name: name.clone(),
                store: Box::new(crate::state::MemoryStore::default()),
            })
            .collect();
        self.instantiate(label, self.description.sinks.clone(), stores)
    }
}
