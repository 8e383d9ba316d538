//! How this process reaches Kafka: the settings every Kafka client shares (rdkafka's
//! producers, consumers and admin clients, and the group-protocol connection), in one place.
//!
//! Every client is made from [`KafkaSettings::client`], so a property that every
//! connection needs is set here once and reaches them all.

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::ConsumerContext;

/// The Kafka cluster this process talks to, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaSettings {
    bootstrap: String,
}

impl KafkaSettings {
    /// Settings for the cluster at `bootstrap` (`host:port[,host:port…]`).
    pub fn new(bootstrap: impl Into<String>) -> KafkaSettings {
        KafkaSettings {
            bootstrap: bootstrap.into(),
        }
    }

    /// The bootstrap servers, as given.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The bootstrap addresses one by one (for clients that connect themselves).
    pub fn bootstrap_addrs(&self) -> impl Iterator<Item = &str> {
        self.bootstrap.split(',').map(str::trim).filter(|a| !a.is_empty())
    }

    /// An rdkafka configuration with every shared property set; the caller adds its own.
    pub fn client(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        config
    }

    /// As [`Self::client`], for the clients that move records (`client.id` `sluice-worker`).
    pub fn worker_client(&self) -> ClientConfig {
        let mut config = self.client();
        config.set("client.id", "sluice-worker");
        config
    }
}

/// Consumer events: errors go to the log; nothing else is needed yet.
pub struct ConsumerEvents;

impl ClientContext for ConsumerEvents {}
impl ConsumerContext for ConsumerEvents {}
