//! Changelog topics: one compacted topic per (topology, store), one partition per source
//! partition; created when missing and checked when present.

use crate::kafka::Authorize as _;
use std::time::Duration;

use anyhow::bail;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

use crate::kafka::KafkaSettings;

pub use crate::state::Changelog;

/// The changelog topic of a store: `<topology>-<store>-changelog`.
pub fn changelog_topic(topology: &str, store: &str) -> String {
    format!("{topology}-{store}-changelog")
}

/// How changelog topics are created. `None` picks a safe default from the cluster's size:
/// a replication factor of min(3, brokers), and `min.insync.replicas` one less than that
/// (at least 1), so an acknowledged changelog write survives the loss of a broker.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChangelogSettings {
    pub replication_factor: Option<i32>,
    pub min_insync_replicas: Option<i32>,
}

impl ChangelogSettings {
    /// (replication factor, min.insync.replicas) for a cluster of `brokers`.
    pub fn resolve(&self, brokers: usize) -> (i32, i32) {
        let rf = self.replication_factor.unwrap_or_else(|| (brokers as i32).clamp(1, 3));
        let isr = self.min_insync_replicas.unwrap_or((rf - 1).max(1));
        (rf, isr)
    }
}

/// The clients that look up, create and check a topology's internal topics (changelogs and
/// repartition topics).
pub(super) struct TopicAdmin {
    admin: crate::kafka::Authorized<AdminClient<DefaultClientContext>>,
    metadata: crate::kafka::Authorized<BaseConsumer>,
    options: AdminOptions,
}

impl TopicAdmin {
    pub(super) fn new(kafka: &KafkaSettings) -> anyhow::Result<Self> {
        let config = kafka.client();
        Ok(TopicAdmin {
            admin: config.authorized(kafka)?,
            metadata: config.authorized(kafka)?,
            options: AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
        })
    }

    /// The topic's partition count, if it exists, and how many brokers the cluster has.
    pub(super) fn lookup(&self, topic: &str) -> anyhow::Result<(Option<usize>, usize)> {
        let metadata = self.metadata.fetch_metadata(Some(topic), Duration::from_secs(15))?;
        let existing = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map(|t| t.partitions().len())
            .filter(|&n| n > 0);
        Ok((existing, metadata.brokers().len()))
    }

    /// Creates `topic` with `cleanup.policy` and a replication fitting the cluster; true if
    /// this call created it (false: someone else just did).
    pub(super) fn create(
        &self,
        topic: &str,
        partitions: i32,
        policy: &str,
        settings: ChangelogSettings,
        brokers: usize,
    ) -> Result<bool, RDKafkaErrorCode> {
        let (rf, isr) = settings.resolve(brokers);
        let isr = isr.to_string();
        let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(rf))
            .set("cleanup.policy", policy)
            .set("min.insync.replicas", &isr);
        let results = futures::executor::block_on(self.admin.create_topics([&new], &self.options))
            .map_err(|e| e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail))?;
        match results.into_iter().next() {
            Some(Ok(_)) => Ok(true),
            None | Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => Ok(false),
            Some(Err((_, code))) => Err(code),
        }
    }

    /// Deletes `topics`; one that is not there is not an error.
    pub(super) fn delete(&self, topics: &[String]) -> anyhow::Result<()> {
        if topics.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        for result in futures::executor::block_on(self.admin.delete_topics(&names, &self.options))? {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
                Err((topic, code)) => bail!("deleting topic {topic}: {code}"),
            }
        }
        Ok(())
    }

    /// The `cleanup.policy` of `topic` (see [`cleanup_policy`]).
    pub(super) fn cleanup_policy(&self, topic: &str) -> anyhow::Result<String> {
        cleanup_policy(&self.admin, topic, &self.options)
    }
}

/// Makes sure every store has a well-formed changelog; returns each store's changelog (its
/// topic id is filled in by the caller).
pub fn ensure_changelogs(
    kafka: &KafkaSettings,
    topology: &str,
    stores: &[String],
    partitions: i32,
    settings: ChangelogSettings,
) -> anyhow::Result<Vec<Changelog>> {
    if stores.is_empty() {
        return Ok(Vec::new());
    }
    let admin = TopicAdmin::new(kafka)?;
    let mut out = Vec::new();
    for store in stores {
        let topic = changelog_topic(topology, store);
        match admin.lookup(&topic)? {
            (None, brokers) => match admin.create(&topic, partitions, "compact", settings, brokers) {
                Ok(true) => tracing::info!(topology, store, topic, partitions, "created changelog topic"),
                Ok(false) => {}
                Err(code) => {
                    bail!("creating changelog topic {topic} for store {store:?} of topology {topology}: {code}")
                }
            },
            (Some(found), _) if found as i32 != partitions => bail!(
                "changelog topic {topic:?} of store {store:?} has {found} partitions, but topology {topology} reads \
                 {partitions} source partitions; a changelog needs one partition per source partition \
                 (delete the topic to let the worker recreate it, or fix the sources)"
            ),
            (Some(_), _) => {
                let policy = admin.cleanup_policy(&topic)?;
                if policy.trim() != "compact" {
                    bail!(
                        "changelog topic {topic:?} of store {store:?} has cleanup.policy={policy}, but a changelog must \
                         be exactly cleanup.policy=compact (with `delete`, old state is deleted with old segments); \
                         set cleanup.policy=compact on the topic, or delete it to let the worker create it"
                    );
                }
            }
        }
        out.push(Changelog {
            store: store.clone(),
            topic,
            topic_id: String::new(),
        });
    }
    Ok(out)
}

/// The `cleanup.policy` of `topic`, as the cluster answers it. A topic created a moment
/// ago (by another worker, say) may not be known yet to the broker that answers, which
/// then says nothing of its configs: that is asked again for a while, and only a policy
/// actually read is returned.
fn cleanup_policy(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    options: &AdminOptions,
) -> anyhow::Result<String> {
    let deadline = std::time::Instant::now() + super::topics::TOPIC_APPEAR_WAIT;
    loop {
        let answer = futures::executor::block_on(admin.describe_configs([&ResourceSpecifier::Topic(topic)], options));
        let found = match answer {
            Ok(configs) => configs
                .into_iter()
                .map(|r| r.map_err(|e| e.to_string()))
                .collect::<Result<Vec<_>, _>>()
                .map(|resources| {
                    resources
                        .into_iter()
                        .flat_map(|r| r.entries)
                        .find(|e| e.name == "cleanup.policy")
                        .and_then(|e| e.value)
                }),
            Err(e) => Err(e.to_string()),
        };
        match found {
            Ok(Some(policy)) => return Ok(policy),
            not_yet if std::time::Instant::now() < deadline => {
                tracing::debug!(topic, answer = ?not_yet, "no cleanup.policy of the topic yet; asking again");
                std::thread::sleep(Duration::from_millis(250));
            }
            Ok(None) => bail!("topic {topic:?}: the cluster does not say its cleanup.policy"),
            Err(e) => bail!("topic {topic:?}: reading its cleanup.policy: {e}"),
        }
    }
}
