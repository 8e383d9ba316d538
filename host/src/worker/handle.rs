//! What an admin API may ask of a worker, and nothing more: its live status and metrics, a
//! drain, the checks a deploy must pass here, the committed stores of its active tasks,
//! and the registry it follows. The binary hands one to the admin server it starts.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::kafka::KafkaSettings;
use crate::manifest::{Manifest, ManifestError};
use crate::metrics::Metrics;
use crate::registry::Watcher;
use crate::runtime::{LoadError, Runtime};
use crate::state::dir::StateDir;

use super::board::{Board, WorkerStatus};
use super::group_runner::Stop;

/// A worker, as its admin API sees it. Cheap to clone.
#[derive(Clone)]
pub struct WorkerHandle {
    pub(super) kafka: KafkaSettings,
    pub(super) cluster: Option<String>,
    pub(super) board: Arc<Board>,
    pub(super) metrics: Metrics,
    pub(super) runtime: Arc<Runtime>,
    pub(super) registry: Option<Arc<Watcher>>,
    pub(super) state: Arc<StateDir>,
    pub(super) static_names: Arc<HashSet<String>>,
    pub(super) drain: Option<Arc<tokio::sync::watch::Sender<Stop>>>,
    /// Bytes of state one topology's tasks may keep here (a manifest may only lower it).
    pub(super) state_limit: u64,
    /// The worker's schema registry client (uploads' sink schemas are checked against it).
    pub(super) schemas: crate::formats::Schemas,
}

/// Why an upload would not run on this worker.
#[derive(Debug, thiserror::Error)]
pub enum DeployCheckError {
    /// The component is not one this worker runs (not a component, another world, …).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The manifest asks for limits this worker does not give.
    #[error("{0}")]
    Limits(String),
    /// The manifest does not bind what the component declares.
    #[error(transparent)]
    Binding(#[from] ManifestError),
    /// A topic it binds is missing, or its sources disagree on their partitions.
    #[error("{0}")]
    Topics(String),
    /// A sink's schema would not be accepted under its subject (the registry's reasons), or
    /// must be registered already and is not, or there is no registry for its formats.
    #[error("{0}")]
    Schema(String),
}

/// What an upload that would run here declares, and the tasks it has.
pub struct DeployCheck {
    pub description: sluice_wire::Description,
    /// Its stages (sub-topologies), with their partition counts.
    pub stages: Vec<crate::topology::Stage>,
    /// What it says of its operators, per sub-topology (for people; may be empty).
    pub operators: crate::runtime::Operators,
}

impl DeployCheck {
    /// How many tasks it has: a stage's partitions, summed.
    pub fn tasks(&self) -> u32 {
        self.stages.iter().map(|s| s.partitions as u32).sum()
    }
}

impl WorkerHandle {
    /// Asks the registry whether each sink's schema would be taken under its subject (or,
    /// with `auto-register = false`, is registered there), so that an upload it would refuse
    /// is refused at once, with the registry's reasons, rather than failing its tasks. A
    /// registry that cannot be reached now does not stop the upload (its tasks wait for it).
    fn check_schemas(
        &self,
        manifest: &Manifest,
        description: &sluice_wire::Description,
        binding: &crate::manifest::Binding,
    ) -> Result<(), DeployCheckError> {
        if description.formats.is_empty() {
            return Ok(());
        }
        let formats =
            crate::formats::TopologyFormats::new(description, &binding.sink_topics, &manifest.formats, usize::MAX)
                .map_err(|e| DeployCheckError::Schema(format!("topology {}: {e}", manifest.name)))?;
        let Some(client) = self.schemas.client() else {
            return Err(DeployCheckError::Schema(format!(
                "topology {} reads or writes records in the Confluent wire format, and this worker has no schema \
                 registry: set schema.registry.url",
                manifest.name
            )));
        };
        let runtime = tokio::runtime::Handle::current();
        for w in formats.writings() {
            let schema = &w.declared.schema;
            if !schema.imports.is_empty() {
                // Its imports are registered as subjects of their own when the task first
                // writes; the registry cannot judge the file without them.
                continue;
            }
            let asked = runtime.block_on(async {
                if manifest.formats.auto_register {
                    client.compatible(&w.subject, schema.kind, &schema.text, &[]).await
                } else {
                    match client.lookup_version(&w.subject, schema.kind, &schema.text, &[]).await {
                        Ok(_) => Ok(Ok(())),
                        Err(e) if e.is_not_found() => Ok(Err(vec![format!(
                            "it is not registered there, and the manifest says it must be (formats.auto-register = false)"
                        )])),
                        Err(e) => Err(e),
                    }
                }
            });
            match asked {
                Ok(Ok(())) => {}
                Ok(Err(reasons)) => {
                    return Err(DeployCheckError::Schema(format!(
                        "topology {}: the schema registry refuses its schema for subject {}: {}",
                        manifest.name,
                        w.subject,
                        if reasons.is_empty() {
                            "it is not compatible with the versions there".to_string()
                        } else {
                            reasons.join("; ")
                        }
                    )))
                }
                Err(e) if e.is_transient() => {
                    tracing::warn!(topology = %manifest.name, subject = %w.subject, "not checking the schema against the registry now: {e}");
                }
                Err(e) => {
                    return Err(DeployCheckError::Schema(format!(
                        "topology {}: subject {}: {e}",
                        manifest.name, w.subject
                    )))
                }
            }
        }
        Ok(())
    }

    /// The worker's live status (`GET /status`).
    pub fn status(&self) -> WorkerStatus {
        let mut status = self.board.snapshot();
        status.compiles = self.runtime.compiles();
        status
    }

    /// Whether the worker holds an assignment (`GET /readyz`).
    pub fn ready(&self) -> bool {
        self.board.ready()
    }

    /// Every metric, as Prometheus text (`GET /metrics`).
    pub fn metrics_text(&self) -> String {
        self.metrics.render()
    }

    /// Asks the worker to drain (hand its tasks to the others, then leave). An error says
    /// why it cannot: not in a cluster, or stopping already.
    pub fn drain(&self) -> Result<(), String> {
        let Some(tx) = &self.drain else {
            return Err("this worker is not in a cluster: there is nobody to drain to".to_string());
        };
        let mut accepted = Ok(());
        tx.send_if_modified(|s| match s {
            Stop::Run => {
                *s = Stop::Drain;
                tracing::info!("drain requested through the admin endpoint");
                true
            }
            Stop::Drain => false,
            Stop::Now => {
                accepted = Err("this worker is stopping already".to_string());
                false
            }
        });
        accepted
    }

    /// The cluster this worker is a member of, if any.
    pub fn cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    /// How this worker reaches Kafka.
    pub fn kafka(&self) -> &KafkaSettings {
        &self.kafka
    }

    /// The registry this worker follows (in a cluster).
    pub fn registry(&self) -> Option<&Arc<Watcher>> {
        self.registry.as_ref()
    }

    /// Whether `name` was given to this worker with `--topology` (uploads cannot replace it).
    pub fn is_static(&self, name: &str) -> bool {
        self.static_names.contains(name)
    }

    /// The open stores named `store` of `topology`'s active tasks here, by partition (their
    /// committed state, for interactive queries).
    pub fn active_stores(&self, topology: &str, store: &str) -> Vec<(i32, crate::state::engine::Db)> {
        self.state.active_stores(topology, store)
    }

    /// Checks an upload as this worker would before running it: a component of our world
    /// that describes itself (within the sandbox's limits), a manifest that binds what it
    /// declares within its limits, topics that exist (each looked up for `patience`).
    /// Blocking: it compiles and runs guest code.
    pub fn check(
        &self,
        manifest: &Manifest,
        component: &[u8],
        patience: Duration,
    ) -> Result<DeployCheck, DeployCheckError> {
        // Compiled, and described, under the manifest's limits (a tenant's caps included).
        let loaded = self
            .runtime
            .load_topology(
                &manifest.name,
                &manifest.component.display().to_string(),
                component,
                &manifest.limits,
            )
            .map_err(|e| match e {
                LoadError::Limits { detail, .. } => DeployCheckError::Limits(detail),
                other => DeployCheckError::Load(other),
            })?;
        crate::topology::check_state_limit(manifest, self.state_limit).map_err(DeployCheckError::Limits)?;
        let description = loaded.description();
        let binding = manifest.bind(description)?;
        let internal: Vec<String> = description
            .internal_topics
            .iter()
            .map(|t| crate::manifest::repartition_topic(&manifest.name, &t.name))
            .collect();
        let refused = |e: String| DeployCheckError::Topics(format!("topology {}: {e}", manifest.name));
        let mut counts = crate::topology::check_topics(&self.kafka, manifest, &binding, &internal, patience)
            .map_err(|e| DeployCheckError::Topics(format!("{e:#}")))?;
        let internal =
            crate::topology::repartition::partition_counts(description, &binding, &counts).map_err(refused)?;
        counts.extend(internal);
        let stages = crate::topology::plan_stages(&manifest.name, description, &binding, &counts).map_err(refused)?;
        crate::topology::global_specs(description, &binding).map_err(refused)?;
        self.check_schemas(manifest, description, &binding)?;
        Ok(DeployCheck {
            description: description.clone(),
            stages,
            operators: loaded.operators().to_vec(),
        })
    }
}
