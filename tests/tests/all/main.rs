//! All integration tests, one module per area (one binary keeps linking time down).

mod cluster;
mod group;
mod kafka_roundtrip;
mod runtime;
mod state;
mod worker;
