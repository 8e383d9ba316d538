//! A topology deployed on this worker: compiled, bound to topics checked against the
//! cluster, with its changelogs created and its digest taken. What the task, the threads
//! and the worker share about a topology lives here, below all three.

pub mod changelog;
pub mod repartition;
pub mod topics;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;

use crate::kafka::KafkaSettings;
use crate::manifest::{Binding, Manifest, OnError, StartFrom};
use crate::runtime::LoadedTopology;
pub use changelog::{Changelog, ChangelogSettings};
pub use topics::{check_topics, co_partitioned, source_consumer, TOPIC_APPEAR_WAIT};

use crate::group::TaskId;

/// A topology ready to run: compiled, bound to topics, with its changelogs.
pub struct DeployedTopology {
    pub name: String,
    pub loaded: LoadedTopology,
    pub binding: Binding,
    /// What happens to a record the topology cannot process.
    pub on_error: OnError,
    /// How long a task waits for an empty source partition (`max-task-idle-ms`).
    pub max_task_idle: crate::manifest::MaxTaskIdle,
    /// Its sub-topologies: one (named none) for a topology of one, else one per declared
    /// sub-topology. A task runs one stage on one partition.
    pub stages: Vec<Stage>,
    /// The changelog of each declared store.
    pub changelogs: Vec<Changelog>,
    /// The repartition topics it writes and reads, with their partition counts.
    pub internal_topics: Vec<(String, i32)>,
    /// Its global tables: each store and the topic that fills it (kept once per worker).
    pub globals: Vec<GlobalSpec>,
    /// How its topics in the Confluent wire format are read and written (their decoders
    /// shared by its tasks on this worker); empty for a topology of bytes.
    pub formats: Arc<crate::formats::TopologyFormats>,
    /// SHA-256 (first 16 bytes) of the component and its bindings: members compare it to
    /// know they run the same topology.
    pub digest: [u8; 16],
    /// Bytes of state on disk its tasks may keep on this worker, and what each keeps now
    /// (as of its last commit).
    pub state_limit: u64,
    pub state_usage: Mutex<HashMap<TaskId, u64>>,
    /// Most records one task processes per second (`limits.records-per-second`).
    pub records_per_second: Option<u32>,
    /// The group its source offsets are committed in (`sluice-<name>`, or a fresh one after
    /// a deploy that asked to reprocess), and where a partition with nothing committed there
    /// starts.
    pub group: String,
    pub start_from: Option<StartFrom>,
}

/// A global table a topology reads: the store its tasks open, and the topic it copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalSpec {
    pub store: String,
    pub topic: String,
}

/// One sub-topology of a deployed topology: what each of its tasks reads and keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// The sub-topology, in a topology of several (its tasks are `<topology>/<sub>/<partition>`);
    /// none in a topology of one (`<topology>/<partition>`).
    pub sub: Option<Arc<str>>,
    /// The name the guest is told in `task-info` (the declared sub-topology, or the topology's).
    pub guest_name: String,
    /// Its tasks: one per partition of its sources.
    pub partitions: i32,
    /// Its sources: each one's index among the description's sources (how the guest numbers
    /// it), and its topic.
    pub sources: Vec<(u32, String)>,
    /// Which of its sources (indices into `sources`) are repartition topics, purged by the
    /// host once processed.
    pub internal_sources: Vec<usize>,
    /// Its stores' changelogs: indices into [`DeployedTopology::changelogs`].
    pub changelogs: Vec<usize>,
}

impl DeployedTopology {
    /// Every task of the topology.
    pub fn tasks(&self) -> Vec<TaskId> {
        self.stages
            .iter()
            .flat_map(|s| (0..s.partitions as u32).map(|p| TaskId::of(&self.name, s.sub.as_deref(), p)))
            .collect()
    }

    /// The stage a task of this topology runs; none if the topology has no such task.
    pub fn stage_of(&self, task: &TaskId) -> Option<&Stage> {
        self.stages
            .iter()
            .find(|s| s.sub == task.sub)
            .filter(|s| (task.partition as i64) < s.partitions as i64)
    }

    /// The changelogs of a stage's stores.
    pub fn changelogs_of(&self, stage: &Stage) -> Vec<Changelog> {
        stage.changelogs.iter().map(|&i| self.changelogs[i].clone()).collect()
    }

    /// Whether any of its tasks keeps state.
    pub fn stateful(&self) -> bool {
        !self.changelogs.is_empty()
    }

    /// The stage whose tasks keep `store`, if any.
    pub fn stage_keeping(&self, store: &str) -> Option<&Stage> {
        self.stages
            .iter()
            .find(|s| s.changelogs.iter().any(|&i| self.changelogs[i].store == store))
    }
}

/// Checks a topology's topics against the cluster, creates its repartition topics and its
/// changelogs (their topic ids are filled in by the caller, for all topologies at once).
pub fn deploy(
    kafka: &KafkaSettings,
    manifest: Manifest,
    loaded: LoadedTopology,
    binding: Binding,
    changelog_settings: ChangelogSettings,
    state_limit: u64,
) -> anyhow::Result<DeployedTopology> {
    let refused = |e: String| anyhow::anyhow!("topology {} (manifest {}): {e}", manifest.name, manifest.path);
    check_state_limit(&manifest, state_limit).map_err(refused)?;
    let description = loaded.description();
    let internal_names: Vec<String> = description
        .internal_topics
        .iter()
        .map(|t| crate::manifest::repartition_topic(&manifest.name, &t.name))
        .collect();
    let external = check_topics(kafka, &manifest, &binding, &internal_names, TOPIC_APPEAR_WAIT)?;
    let internal = repartition::partition_counts(description, &binding, &external).map_err(refused)?;
    repartition::ensure_repartition_topics(kafka, &manifest.name, &internal, changelog_settings)
        .map_err(|e| refused(format!("{e:#}")))?;
    let mut counts = external;
    counts.extend(internal.iter().cloned());
    let mut stages = plan_stages(&manifest.name, description, &binding, &counts).map_err(refused)?;
    let digest = topology_digest(&manifest, &binding, &description.stores)?;
    let mut changelogs = Vec::new();
    for stage in &mut stages {
        let stores = stage_stores(description, stage);
        let made = changelog::ensure_changelogs(kafka, &manifest.name, &stores, stage.partitions, changelog_settings)
            .map_err(|e| refused(format!("{e:#}")))?;
        stage.changelogs = (changelogs.len()..changelogs.len() + made.len()).collect();
        changelogs.extend(made);
    }
    let globals = global_specs(description, &binding).map_err(refused)?;
    let formats = crate::formats::TopologyFormats::new(
        description,
        &binding.sink_topics,
        &manifest.formats,
        loaded.limits().memory_limit / 4,
    )
    .map_err(refused)?;
    Ok(DeployedTopology {
        formats: Arc::new(formats),
        state_limit: manifest.limits.state.unwrap_or(state_limit),
        state_usage: Default::default(),
        records_per_second: manifest.limits.records_per_second,
        group: manifest.group(),
        start_from: manifest.start_from,
        name: manifest.name,
        loaded,
        on_error: manifest.on_error,
        max_task_idle: manifest.max_task_idle,
        binding,
        stages,
        changelogs,
        internal_topics: internal,
        globals,
        digest,
    })
}

/// Each global store and its topic. A changelog or repartition topic cannot fill one: the
/// state updater reads those for the tasks that own them, and a topic is read once there.
pub fn global_specs(description: &sluice_wire::Description, binding: &Binding) -> Result<Vec<GlobalSpec>, String> {
    let mut specs = Vec::new();
    for (g, topic) in description.global_stores.iter().zip(&binding.global_topics) {
        if topic.ends_with("-changelog") || topic.ends_with("-repartition") {
            return Err(format!(
                "global store {:?} is bound to {topic:?}, a changelog or repartition topic the host writes for a \
                 topology; bind a topic of your own",
                g.name
            ));
        }
        specs.push(GlobalSpec {
            store: g.name.clone(),
            topic: topic.clone(),
        });
    }
    Ok(specs)
}

/// The stores a stage keeps: all the topology's, or its sub-topology's.
fn stage_stores(description: &sluice_wire::Description, stage: &Stage) -> Vec<String> {
    match description.subtopologies.iter().find(|s| s.name == stage.guest_name) {
        Some(sub) if stage.sub.is_some() => sub.stores.clone(),
        _ => description.stores.clone(),
    }
}

/// The stages of a topology, each with its sources and partition count (`counts`: every
/// source topic's). A stage's sources must be co-partitioned.
pub fn plan_stages(
    topology: &str,
    description: &sluice_wire::Description,
    binding: &Binding,
    counts: &BTreeMap<String, i32>,
) -> Result<Vec<Stage>, String> {
    let source = |name: &str| -> (u32, String) {
        let i = description
            .sources
            .iter()
            .position(|s| s == name)
            .expect("a checked description");
        (i as u32, binding.source_topics[i].clone())
    };
    let count_of = |sources: &[(u32, String)]| -> Vec<(String, i32)> {
        sources
            .iter()
            .map(|(_, t)| (t.clone(), counts.get(t).copied().unwrap_or(0)))
            .collect()
    };
    let internal = |sources: &[(u32, String)]| -> Vec<usize> {
        sources
            .iter()
            .enumerate()
            .filter(|(_, (i, _))| {
                let name = &description.sources[*i as usize];
                description.internal_topics.iter().any(|t| t.name == *name)
            })
            .map(|(local, _)| local)
            .collect()
    };
    let check = |what: &str, sources: &[(u32, String)]| -> Result<i32, String> {
        let listed = count_of(sources);
        let listed: Vec<(&str, i32)> = listed.iter().map(|(t, n)| (t.as_str(), *n)).collect();
        co_partitioned(what, &listed)
    };
    if description.subtopologies.len() <= 1 {
        let sources: Vec<(u32, String)> = description.sources.iter().map(|s| source(s)).collect();
        let partitions = check("its sources are", &sources)?;
        let guest_name = description
            .subtopologies
            .first()
            .map_or_else(|| topology.to_string(), |s| s.name.clone());
        return Ok(vec![Stage {
            sub: None,
            guest_name,
            partitions,
            internal_sources: internal(&sources),
            sources,
            changelogs: Vec::new(),
        }]);
    }
    description
        .subtopologies
        .iter()
        .map(|sub| {
            let sources: Vec<(u32, String)> = sub.sources.iter().map(|s| source(s)).collect();
            let partitions = check(&format!("the sources of sub-topology {:?} are", sub.name), &sources)?;
            Ok(Stage {
                sub: Some(sub.name.as_str().into()),
                guest_name: sub.name.clone(),
                partitions,
                internal_sources: internal(&sources),
                sources,
                changelogs: Vec::new(),
            })
        })
        .collect()
}

/// Deletes `topics` (a deleted topology's changelogs and repartition topics); one that is
/// not there is not an error.
pub fn delete_topics(kafka: &KafkaSettings, topics: &[String]) -> anyhow::Result<()> {
    changelog::TopicAdmin::new(kafka)?.delete(topics)
}

/// A manifest may only lower the worker's state limit (bytes on disk of a topology's tasks
/// on one worker).
pub fn check_state_limit(manifest: &Manifest, worker_limit: u64) -> Result<(), String> {
    match manifest.limits.state {
        Some(asked) if asked > worker_limit => Err(format!(
            "limits.state ({asked} bytes) is more than the worker allows ({worker_limit} bytes, its --state-limit): a \
             manifest may only lower the worker's limits"
        )),
        _ => Ok(()),
    }
}

/// What makes two deployments of a topology the same: the component's bytes and the topics
/// and stores it is bound to.
fn topology_digest(manifest: &Manifest, binding: &Binding, stores: &[String]) -> anyhow::Result<[u8; 16]> {
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(&manifest.component)
        .with_context(|| format!("reading component {}", manifest.component.display()))?;
    let mut hash = Sha256::new();
    hash.update(&bytes);
    for list in [&binding.source_topics, &binding.sink_topics, &stores.to_vec()] {
        hash.update((list.len() as u64).to_le_bytes());
        for item in list.iter() {
            hash.update((item.len() as u64).to_le_bytes());
            hash.update(item.as_bytes());
        }
    }
    // Global tables count only where there are some, so earlier digests stay as they were.
    if !binding.global_topics.is_empty() {
        hash.update(b"global-stores");
        for topic in &binding.global_topics {
            hash.update((topic.len() as u64).to_le_bytes());
            hash.update(topic.as_bytes());
        }
    }
    let full = hash.finalize();
    let mut digest = [0u8; 16];
    digest.copy_from_slice(&full[..16]);
    Ok(digest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_wire::{Description, Subtopology};

    fn join() -> (Description, Binding) {
        let d = Description::new("j")
            .source("orders")
            .source("customers")
            .sink("out")
            .store("customers")
            .internal_topic("by_customer", Some(6))
            .subtopology(Subtopology::new("rekey").source("orders").sink("by_customer"))
            .subtopology(
                Subtopology::new("join")
                    .source("by_customer")
                    .source("customers")
                    .sink("out")
                    .store("customers"),
            );
        let binding = Binding {
            source_topics: vec!["orders".into(), "customers".into(), "j-by_customer-repartition".into()],
            global_topics: vec![],
            sink_topics: vec!["out".into(), "j-by_customer-repartition".into()],
            dead_letter_topic: None,
        };
        (d, binding)
    }

    fn counts(list: &[(&str, i32)]) -> BTreeMap<String, i32> {
        list.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    #[test]
    fn a_global_store_cannot_copy_a_topic_the_host_writes() {
        let d = Description::new("g").source("in").global_store("t", "table");
        let bound = |topic: &str| Binding {
            source_topics: vec!["in".into()],
            sink_topics: vec![],
            global_topics: vec![topic.into()],
            dead_letter_topic: None,
        };
        assert_eq!(
            global_specs(&d, &bound("acme.customers")).unwrap(),
            vec![GlobalSpec {
                store: "t".into(),
                topic: "acme.customers".into()
            }]
        );
        let e = global_specs(&d, &bound("other-counts-changelog")).unwrap_err();
        assert!(e.contains("a changelog or repartition topic the host writes"), "{e}");
    }

    #[test]
    fn each_sub_topology_is_a_stage_with_its_own_sources_and_partitions() {
        let (d, binding) = join();
        let stages = plan_stages(
            "j",
            &d,
            &binding,
            &counts(&[("orders", 12), ("customers", 6), ("j-by_customer-repartition", 6)]),
        )
        .unwrap();
        assert_eq!(stages.len(), 2);
        assert_eq!((stages[0].sub.as_deref(), stages[0].partitions), (Some("rekey"), 12));
        assert_eq!(stages[0].sources, vec![(0, "orders".to_string())]);
        assert!(stages[0].internal_sources.is_empty());
        assert_eq!((stages[1].sub.as_deref(), stages[1].partitions), (Some("join"), 6));
        // Numbered as the description lists its sources (the internal topic is the third).
        assert_eq!(
            stages[1].sources,
            vec![
                (2, "j-by_customer-repartition".to_string()),
                (1, "customers".to_string())
            ]
        );
        assert_eq!(stages[1].internal_sources, vec![0]);
        assert_eq!(stage_stores(&d, &stages[1]), vec!["customers".to_string()]);
        assert!(stage_stores(&d, &stages[0]).is_empty());
    }

    #[test]
    fn a_sub_topology_whose_sources_are_not_co_partitioned_is_refused_naming_it() {
        let (d, binding) = join();
        let refused = plan_stages(
            "j",
            &d,
            &binding,
            &counts(&[("orders", 12), ("customers", 5), ("j-by_customer-repartition", 6)]),
        )
        .unwrap_err();
        assert_eq!(
            refused,
            "the sources of sub-topology \"join\" are not co-partitioned: \"j-by_customer-repartition\" has 6, \
             \"customers\" has 5; a task reads the same partition of each source, so they need the same number of \
             partitions (and keys written with the same partitioner)"
        );
    }

    #[test]
    fn a_topology_of_one_sub_topology_keeps_its_task_names() {
        let d = Description::new("u").source("in").sink("out");
        let binding = Binding {
            source_topics: vec!["in".into()],
            global_topics: vec![],
            sink_topics: vec!["out".into()],
            dead_letter_topic: None,
        };
        let stages = plan_stages("u", &d, &binding, &counts(&[("in", 3)])).unwrap();
        assert_eq!(stages.len(), 1);
        assert_eq!(
            (
                stages[0].sub.clone(),
                stages[0].guest_name.as_str(),
                stages[0].partitions
            ),
            (None, "u", 3)
        );
    }
}
