//! All integration tests, one module per area (one binary keeps linking time down).

mod brokers;
mod cluster;
mod consistency;
mod group;
mod kafka_roundtrip;
mod kills;
mod ownership;
mod runtime;
mod sandbox;
mod state;
mod worker;
