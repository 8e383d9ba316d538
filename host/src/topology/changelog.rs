//! Changelog topics: one compacted topic per (topology, store), one partition per source
//! partition; created when missing and checked when present.

use std::time::Duration;

use anyhow::bail;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

use crate::kafka::KafkaSettings;

/// A store's changelog topic and its id (empty when the cluster did not say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changelog {
    pub store: String,
    pub topic: String,
    pub topic_id: String,
}

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
    let config = kafka.client();
    let admin: AdminClient<DefaultClientContext> = config.create()?;
    let metadata_client: BaseConsumer = config.create()?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let mut out = Vec::new();
    for store in stores {
        let topic = changelog_topic(topology, store);
        let metadata = metadata_client.fetch_metadata(Some(&topic), Duration::from_secs(15))?;
        let existing = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
            .map(|t| t.partitions().len());
        match existing {
            Some(0) | None => {
                let (rf, isr) = settings.resolve(metadata.brokers().len());
                let isr = isr.to_string();
                let new = NewTopic::new(&topic, partitions, TopicReplication::Fixed(rf))
                    .set("cleanup.policy", "compact")
                    .set("min.insync.replicas", &isr);
                for result in futures::executor::block_on(admin.create_topics([&new], &options))? {
                    match result {
                        Ok(_) => tracing::info!(topology, store, topic, partitions, "created changelog topic"),
                        Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                        Err((t, code)) => {
                            bail!("creating changelog topic {t} for store {store:?} of topology {topology}: {code}")
                        }
                    }
                }
            }
            Some(found) if found as i32 != partitions => bail!(
                "changelog topic {topic:?} of store {store:?} has {found} partitions, but topology {topology} reads \
                 {partitions} source partitions; a changelog needs one partition per source partition \
                 (delete the topic to let the worker recreate it, or fix the sources)"
            ),
            Some(_) => {
                let policy = cleanup_policy(&admin, &topic, &options)?;
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
                tracing::debug!(topic, answer = ?not_yet, "no cleanup.policy of the changelog yet; asking again");
                std::thread::sleep(Duration::from_millis(250));
            }
            Ok(None) => bail!("changelog topic {topic:?}: the cluster does not say its cleanup.policy"),
            Err(e) => bail!("changelog topic {topic:?}: reading its cleanup.policy: {e}"),
        }
    }
}
