//! Changelog topics: one compacted topic per (topology, store), one partition per source
//! partition; created when missing and checked when present.

use std::time::Duration;

use anyhow::bail;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;

/// The changelog topic of a store: `<topology>-<store>-changelog`.
pub fn changelog_topic(topology: &str, store: &str) -> String {
    format!("{topology}-{store}-changelog")
}

/// Makes sure every store has a well-formed changelog; returns (store, topic) pairs.
pub fn ensure_changelogs(
    bootstrap: &str,
    topology: &str,
    stores: &[String],
    partitions: i32,
) -> anyhow::Result<Vec<(String, String)>> {
    if stores.is_empty() {
        return Ok(Vec::new());
    }
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", bootstrap);
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
                let new =
                    NewTopic::new(&topic, partitions, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact");
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
                let configs =
                    futures::executor::block_on(admin.describe_configs([&ResourceSpecifier::Topic(&topic)], &options))?;
                let policy = configs
                    .into_iter()
                    .filter_map(Result::ok)
                    .flat_map(|r| r.entries)
                    .find(|e| e.name == "cleanup.policy")
                    .and_then(|e| e.value)
                    .unwrap_or_default();
                if !policy.split(',').any(|p| p.trim() == "compact") {
                    bail!(
                        "changelog topic {topic:?} of store {store:?} has cleanup.policy={policy}, but a changelog must \
                         be compacted (cleanup.policy=compact), or old state is deleted with old segments"
                    );
                }
            }
        }
        out.push((store.clone(), topic));
    }
    Ok(out)
}
