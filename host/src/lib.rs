//! The Sluice host: runs stream-processing topologies, compiled to WebAssembly components,
//! on Apache Kafka.
//!
//! Layers, lowest first (each imports only those below it; `docs/architecture.md` has the
//! picture):
//!
//! 1. [`kafka`] (client settings), [`secret`] (signatures under the cluster secret), [`tls`]
//!    (PEM material), [`manifest`] (pure parsing), [`group`] (task ids, the group protocol,
//!    the assignors), [`state`] (stores, their engines — RocksDB, in memory — and handovers),
//!    [`runtime`] (the Wasm sandbox), [`metrics`], [`drops`] (dropping what ended off the hot path);
//! 2. [`topology`]: a topology deployed here, checked against the cluster; [`registry`]:
//!    uploaded topologies and tenants, in a Kafka topic; [`acls`]: the Kafka ACLs a cluster needs;
//! 3. [`task`]: one task as a state machine (batch, call, produce, commit);
//! 4. [`threads`]: the stream threads, starters and the state updater that drive tasks;
//! 5. [`worker`]: the process — deploys, the group runner, the task runner, the status board;
//! 6. [`admin`]: the admin API, which speaks for a worker through its handle.

pub mod acls;
pub mod admin;
pub mod drops;
pub mod formats;
pub mod group;
pub mod kafka;
pub mod manifest;
pub mod metrics;
pub mod oidc;
pub mod registry;
pub mod runtime;
pub mod secret;
pub mod state;
pub mod task;
pub mod threads;
pub mod tls;
pub mod topology;
pub mod web;
pub mod worker;

/// The version of this build, as printed by `sluice --version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
