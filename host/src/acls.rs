//! The Kafka ACLs a Sluice cluster needs, derived from what it is: exactly what the workers'
//! principal must be allowed (its cluster's group and registry, the topology groups, the
//! changelogs, sources and sinks of each namespace, transactional ids, idempotent writes),
//! and what a tenant's principal gets (its namespace, prefixed; nothing of `sluice.`).
//! Printed as `kafka-acls.sh` commands, or created through the admin protocol
//! (CreateAcls) with [`apply`].

use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::CreateAclsRequest;
use kafka_protocol::protocol::StrBytes;

use crate::group::connection::{describe, Connection};
use crate::kafka::KafkaSettings;

/// What an ACL is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Resource {
    Topic,
    Group,
    TransactionalId,
    Cluster,
}

impl Resource {
    /// Kafka's resource type code.
    fn code(self) -> i8 {
        match self {
            Resource::Topic => 2,
            Resource::Group => 3,
            Resource::Cluster => 4,
            Resource::TransactionalId => 5,
        }
    }

    fn flag(self) -> &'static str {
        match self {
            Resource::Topic => "--topic",
            Resource::Group => "--group",
            Resource::TransactionalId => "--transactional-id",
            Resource::Cluster => "--cluster",
        }
    }
}

/// An operation an ACL allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    Read,
    Write,
    Create,
    Delete,
    Describe,
    DescribeConfigs,
    IdempotentWrite,
}

impl Operation {
    fn code(self) -> i8 {
        match self {
            Operation::Read => 3,
            Operation::Write => 4,
            Operation::Create => 5,
            Operation::Delete => 6,
            Operation::Describe => 8,
            Operation::DescribeConfigs => 10,
            Operation::IdempotentWrite => 12,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Operation::Read => "Read",
            Operation::Write => "Write",
            Operation::Create => "Create",
            Operation::Delete => "Delete",
            Operation::Describe => "Describe",
            Operation::DescribeConfigs => "DescribeConfigs",
            Operation::IdempotentWrite => "IdempotentWrite",
        }
    }
}

/// One ACL: `principal` may do `operations` on the resources named `name` (or, `prefixed`,
/// every one whose name starts with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acl {
    pub principal: String,
    pub resource: Resource,
    pub name: String,
    pub prefixed: bool,
    pub operations: Vec<Operation>,
    /// Why the workers (or the tenant) need it.
    pub why: &'static str,
}

/// The ACLs of the workers' principal of cluster `cluster` (none: workers that run alone,
/// with no registry), whose topologies live in `namespaces` (the tenants' and any the
/// admin's topologies use): what `sluice worker` needs and nothing more.
pub fn worker_acls(principal: &str, cluster: Option<&str>, namespaces: &[String]) -> Vec<Acl> {
    use Operation::*;
    let acl = |resource, name: &str, prefixed, operations: Vec<Operation>, why| Acl {
        principal: principal.to_string(),
        resource,
        name: name.to_string(),
        prefixed,
        operations,
        why,
    };
    let mut out = Vec::new();
    if let Some(cluster) = cluster {
        out.push(acl(
            Resource::Topic,
            &crate::registry::topic(cluster),
            false,
            vec![Read, Write, Create, Describe, DescribeConfigs],
            "the registry of uploaded topologies (created by the first worker)",
        ));
    }
    out.extend([
        acl(
            Resource::Group,
            "sluice.",
            true,
            vec![Read, Describe],
            "the cluster's group (sluice.cluster.NAME) and the workers' own consumers' groups (never joined)",
        ),
        acl(
            Resource::Group,
            "sluice-",
            true,
            vec![Read, Describe],
            "the topologies' groups, where source offsets are committed (sluice-TOPOLOGY[.vN])",
        ),
        acl(
            Resource::TransactionalId,
            "sluice-",
            true,
            vec![Write, Describe],
            "exactly-once: each stream thread's transactional producer (sluice-worker-WORKER-THREAD)",
        ),
        acl(
            Resource::Cluster,
            "kafka-cluster",
            false,
            vec![IdempotentWrite],
            "idempotent producers",
        ),
    ]);
    for ns in namespaces {
        out.push(acl(
            Resource::Topic,
            ns,
            true,
            vec![Read, Write, Create, Delete, Describe, DescribeConfigs],
            "the topologies of the namespace: their sources and sinks, their changelogs and repartition topics \
             (created at deploy; repartition records deleted once processed, DeleteRecords)",
        ));
    }
    out
}

/// The ACLs of a tenant's principal: its namespace's topics and groups, prefixed, and
/// nothing else (least of all `sluice.`, the cluster's own).
pub fn tenant_acls(principal: &str, namespace: &str) -> Vec<Acl> {
    use Operation::*;
    vec![
        Acl {
            principal: principal.to_string(),
            resource: Resource::Topic,
            name: namespace.to_string(),
            prefixed: true,
            operations: vec![Read, Write, Create, Describe, DescribeConfigs],
            why: "its topics: it feeds its sources and reads its sinks",
        },
        Acl {
            principal: principal.to_string(),
            resource: Resource::Group,
            name: namespace.to_string(),
            prefixed: true,
            operations: vec![Read, Describe],
            why: "its own consumers' groups",
        },
    ]
}

/// `kafka-acls.sh` commands that create `acls`, against `bootstrap` as the principal of
/// `command_config` (a client properties file of an admin).
pub fn as_commands(acls: &[Acl], bootstrap: &str, command_config: &str) -> String {
    let mut out = String::new();
    for a in acls {
        out.push_str(&format!("# {}\n", a.why));
        out.push_str(&format!(
            "kafka-acls.sh --bootstrap-server {bootstrap} --command-config {command_config} --add \\\n    --allow-principal {}",
            a.principal
        ));
        for op in &a.operations {
            out.push_str(&format!(" --operation {}", op.name()));
        }
        match a.resource {
            Resource::Cluster => out.push_str(" --cluster"),
            r => {
                out.push_str(&format!(" {} '{}'", r.flag(), a.name));
                if a.prefixed {
                    out.push_str(" --resource-pattern-type prefixed");
                }
            }
        }
        out.push_str("\n\n");
    }
    out
}

/// Creates `acls` in the cluster (CreateAcls, as the principal of `kafka`, which must be
/// allowed to alter ACLs). An ACL that exists already is left as it is.
pub async fn apply(kafka: &KafkaSettings, acls: &[Acl]) -> anyhow::Result<usize> {
    let creations: Vec<AclCreation> = acls
        .iter()
        .flat_map(|a| {
            a.operations.iter().map(move |op| {
                AclCreation::default()
                    .with_resource_type(a.resource.code())
                    .with_resource_name(StrBytes::from_string(a.name.clone()))
                    // 3: literal, 4: prefixed.
                    .with_resource_pattern_type(if a.prefixed { 4 } else { 3 })
                    .with_principal(StrBytes::from_string(a.principal.clone()))
                    .with_host(StrBytes::from_static_str("*"))
                    .with_operation(op.code())
                    // 3: allow.
                    .with_permission_type(3)
            })
        })
        .collect();
    let count = creations.len();
    let mut last = None;
    for addr in kafka.bootstrap_addrs() {
        let mut connection = match Connection::connect(kafka, addr).await {
            Ok(c) => c,
            Err(e) => {
                last = Some(anyhow::Error::from(e));
                continue;
            }
        };
        let request = CreateAclsRequest::default().with_creations(creations.clone());
        let response = connection.send(&request, 2).await?;
        let failed: Vec<String> = response
            .results
            .iter()
            .zip(&creations)
            .filter(|(r, _)| r.error_code != 0)
            .map(|(r, c)| {
                format!(
                    "{} on {} {}: {} {}",
                    c.principal,
                    c.resource_type,
                    c.resource_name,
                    describe(r.error_code),
                    r.error_message.as_deref().unwrap_or_default()
                )
            })
            .collect();
        anyhow::ensure!(failed.is_empty(), "the broker refused ACLs:\n{}", failed.join("\n"));
        return Ok(count);
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no bootstrap address in {:?}", kafka.bootstrap())))
}
