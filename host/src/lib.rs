//! The Sluice host: runs stream-processing topologies, compiled to WebAssembly components,
//! on Apache Kafka.
//!
//! Layers, lowest first: [`manifest`] (pure parsing), [`runtime`] (the Wasm sandbox),
//! [`metrics`], and [`worker`] (Kafka in, guest calls, Kafka out).

pub mod admin;
pub mod group;
pub mod http_client;
pub mod manifest;
pub mod metrics;
pub mod registry;
pub mod runtime;
pub mod state;
pub mod tenants;
pub mod worker;

/// The version of this build, as printed by `sluice --version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
