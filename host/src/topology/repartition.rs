//! Repartition topics: the internal topics between a topology's sub-topologies,
//! `<topology>-<name>-repartition`, created by the host at deploy (`cleanup.policy=delete`)
//! and checked when present; and the purger, which deletes their records once the task
//! reading them has committed past them, so a repartition topic holds only its backlog.

use crate::kafka::Authorize as _;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::bail;
use sluice_wire::Description;

use super::changelog::{ChangelogSettings, TopicAdmin};
use crate::kafka::KafkaSettings;
use crate::manifest::Binding;

/// Each internal topic's partition count: the one declared; else, so that it co-partitions
/// with them, that of the other sources its reader reads; else the largest of the sources
/// of the sub-topologies that write it. `external`: every external source's count.
pub fn partition_counts(
    description: &Description,
    binding: &Binding,
    external: &BTreeMap<String, i32>,
) -> Result<Vec<(String, i32)>, String> {
    let topic_of = |name: &str| -> String {
        let i = description
            .sources
            .iter()
            .position(|s| s == name)
            .expect("a checked description");
        binding.source_topics[i].clone()
    };
    let mut known: BTreeMap<String, i32> = external.clone();
    let mut resolved: BTreeMap<&str, i32> = BTreeMap::new();
    // Sub-topologies do not loop (checked at load), so each pass resolves at least one
    // topic whose neighbours are known, until all are.
    for _ in 0..=description.internal_topics.len() {
        for t in &description.internal_topics {
            if resolved.contains_key(t.name.as_str()) {
                continue;
            }
            let count = t.partitions.map(|n| n as i32).or_else(|| {
                let reader = description.subtopologies.iter().find(|s| s.sources.contains(&t.name))?;
                let partners: Vec<i32> = reader
                    .sources
                    .iter()
                    .filter(|s| **s != t.name)
                    .filter_map(|s| known.get(&topic_of(s)).copied())
                    .collect();
                if let Some(&n) = partners.first() {
                    return Some(n);
                }
                let upstream: Option<Vec<i32>> = description
                    .subtopologies
                    .iter()
                    .filter(|s| s.sinks.contains(&t.name))
                    .flat_map(|s| s.sources.iter())
                    .map(|s| known.get(&topic_of(s)).copied())
                    .collect();
                upstream.and_then(|counts| counts.into_iter().max())
            });
            if let Some(n) = count {
                resolved.insert(&t.name, n);
                known.insert(topic_of(&t.name), n);
            }
        }
    }
    description
        .internal_topics
        .iter()
        .map(|t| match resolved.get(t.name.as_str()) {
            Some(&n) => Ok((topic_of(&t.name), n)),
            None => Err(format!(
                "the partition count of internal topic {:?} follows from no source; declare it",
                t.name
            )),
        })
        .collect()
}

/// Makes sure each repartition topic exists with its partition count and
/// `cleanup.policy=delete` (it holds records in flight, not state: the host deletes what
/// every downstream task has committed).
pub fn ensure_repartition_topics(
    kafka: &KafkaSettings,
    topology: &str,
    topics: &[(String, i32)],
    settings: ChangelogSettings,
) -> anyhow::Result<()> {
    if topics.is_empty() {
        return Ok(());
    }
    let admin = TopicAdmin::new(kafka)?;
    for (topic, partitions) in topics {
        let partitions = *partitions;
        match admin.lookup(topic)? {
            (None, brokers) => match admin.create(topic, partitions, "delete", settings, brokers) {
                Ok(true) => tracing::info!(topology, topic, partitions, "created repartition topic"),
                Ok(false) => {}
                Err(code) => bail!("creating repartition topic {topic}: {code}"),
            },
            (Some(found), _) if found as i32 != partitions => bail!(
                "repartition topic {topic:?} has {found} partitions, but the topology needs {partitions} there; \
                 delete the topic to let the worker create it (`sluice topologies delete --purge-internal`), or \
                 declare its partition count"
            ),
            (Some(_), _) => {
                let policy = admin.cleanup_policy(topic)?;
                if policy.trim() != "delete" {
                    bail!(
                        "repartition topic {topic:?} has cleanup.policy={policy}, but a repartition topic must be \
                         exactly cleanup.policy=delete (it holds records in flight, which the host deletes once \
                         processed); set cleanup.policy=delete on the topic, or delete it to let the worker create it"
                    );
                }
            }
        }
    }
    Ok(())
}

/// How often a task deletes what it has committed of its repartition sources (Kafka
/// Streams' `repartition.purge.interval.ms` is 30 s too).
pub const PURGE_INTERVAL: Duration = Duration::from_secs(30);

/// Deletes records of repartition topics (DeleteRecords) on a thread of its own, so that the
/// tasks asking never wait for the brokers. Requests that arrive while one is under way are
/// merged (the largest offset per partition wins).
pub struct Purger {
    tx: mpsc::Sender<Vec<(String, i32, i64)>>,
}

impl Purger {
    pub fn start(kafka: &KafkaSettings) -> std::io::Result<Purger> {
        let (tx, rx) = mpsc::channel::<Vec<(String, i32, i64)>>();
        let kafka = kafka.clone();
        std::thread::Builder::new()
            .name("purger".into())
            .spawn(move || purge_loop(&kafka, rx))?;
        Ok(Purger { tx })
    }

    /// Deletes each partition's records before its offset (what the task committed).
    pub fn purge(&self, before: Vec<(String, i32, i64)>) {
        if !before.is_empty() {
            let _ = self.tx.send(before);
        }
    }
}

fn purge_loop(kafka: &KafkaSettings, rx: mpsc::Receiver<Vec<(String, i32, i64)>>) {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::{Offset, TopicPartitionList};
    let make = || -> rdkafka::error::KafkaResult<crate::kafka::Authorized<AdminClient<DefaultClientContext>>> {
        kafka.client().authorized(kafka)
    };
    let mut admin = match make() {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!("repartition topics will not be purged: creating an admin client: {e}");
            return;
        }
    };
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    // Topics whose purge failed already (said once, not every interval).
    let mut warned: HashSet<String> = HashSet::new();
    while let Ok(first) = rx.recv() {
        let mut wanted: HashMap<(String, i32), i64> = HashMap::new();
        for (topic, partition, offset) in std::iter::once(first).chain(rx.try_iter()).flatten() {
            let e = wanted.entry((topic, partition)).or_insert(offset);
            *e = (*e).max(offset);
        }
        if kafka.renewed(admin.made()) {
            // The client certificate was renewed on disk.
            match make() {
                Ok(a) => admin = a,
                Err(e) => tracing::warn!("making the purger's admin client again with the renewed certificate: {e}"),
            }
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), offset) in &wanted {
            let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset));
        }
        match futures::executor::block_on(admin.delete_records(&tpl, &options)) {
            Ok(result) => {
                for e in result.elements() {
                    match e.error() {
                        Ok(()) => {
                            warned.remove(e.topic());
                            tracing::debug!(topic = e.topic(), partition = e.partition(), low = ?e.offset(), "purged");
                        }
                        Err(err) if warned.insert(e.topic().to_string()) => tracing::warn!(
                            topic = e.topic(),
                            partition = e.partition(),
                            "deleting processed records of a repartition topic: {err} (it grows until this works; \
                             the workers need Delete on it)"
                        ),
                        Err(_) => {}
                    }
                }
            }
            Err(e) => tracing::warn!("deleting processed records of repartition topics: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_wire::Subtopology;

    fn bind(d: &Description) -> Binding {
        let topic = |n: &String| match d.internal_topics.iter().any(|t| t.name == *n) {
            true => format!("t-{n}-repartition"),
            false => n.clone(),
        };
        Binding {
            source_topics: d.sources.iter().map(topic).collect(),
            sink_topics: d.sinks.iter().map(topic).collect(),
            global_topics: vec![],
            dead_letter_topic: None,
        }
    }

    fn counts(d: &Description, external: &[(&str, i32)]) -> Result<Vec<(String, i32)>, String> {
        let external = external.iter().map(|(t, n)| (t.to_string(), *n)).collect();
        partition_counts(d, &bind(d), &external)
    }

    #[test]
    fn an_internal_topic_has_its_declared_count_or_its_upstreams_largest() {
        let d = |declared| {
            Description::new("t")
                .source("a")
                .source("b")
                .sink("out")
                .internal_topic("words", declared)
                .subtopology(Subtopology::new("split").source("a").source("b").sink("words"))
                .subtopology(Subtopology::new("count").source("words").sink("out"))
        };
        assert_eq!(
            counts(&d(Some(8)), &[("a", 4), ("b", 4)]),
            Ok(vec![("t-words-repartition".into(), 8)])
        );
        assert_eq!(
            counts(&d(None), &[("a", 4), ("b", 6)]),
            Ok(vec![("t-words-repartition".into(), 6)])
        );
    }

    #[test]
    fn an_internal_topic_co_partitions_with_what_its_reader_joins_it_with() {
        // orders re-keyed by customer, joined with customers (5 partitions).
        let d = Description::new("t")
            .source("orders")
            .source("customers")
            .sink("out")
            .internal_topic("by_customer", None)
            .subtopology(Subtopology::new("rekey").source("orders").sink("by_customer"))
            .subtopology(
                Subtopology::new("join")
                    .source("by_customer")
                    .source("customers")
                    .sink("out"),
            );
        assert_eq!(
            counts(&d, &[("orders", 12), ("customers", 5)]),
            Ok(vec![("t-by_customer-repartition".into(), 5)])
        );
    }

    #[test]
    fn chained_internal_topics_follow_each_other() {
        let d = Description::new("t")
            .source("in")
            .internal_topic("two", None)
            .internal_topic("one", None)
            .subtopology(Subtopology::new("a").source("in").sink("one"))
            .subtopology(Subtopology::new("b").source("one").sink("two"))
            .subtopology(Subtopology::new("c").source("two"));
        assert_eq!(
            counts(&d, &[("in", 3)]),
            Ok(vec![("t-two-repartition".into(), 3), ("t-one-repartition".into(), 3)])
        );
    }
}
