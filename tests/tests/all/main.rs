//! All integration tests, one module per area (one binary keeps linking time down).

mod brokers;
mod cluster;
mod consistency;
mod density;
mod globals;
mod group;
mod hostile;
mod kafka_roundtrip;
mod kafka_tools;
mod kills;
mod learners;
mod ownership;
mod partitioning;
mod policies;
mod queries;
mod registry;
mod runtime;
mod sandbox;
mod sdk;
mod secured;
mod security;
mod stages;
mod state;
mod tenancy;
mod worker;
