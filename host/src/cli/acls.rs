//! `sluice acls`: the Kafka ACLs of a cluster's workers or of one tenant, printed as
//! `kafka-acls.sh` commands, or created with `--apply` (as an admin principal).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use sluice::acls::{self, Acl};
use sluice::registry::tenants::Tenancy;

#[derive(Debug, Args)]
pub struct AclsArgs {
    /// The ACLs of the workers' principal.
    #[arg(long, conflicts_with = "tenant", required_unless_present = "tenant")]
    worker: bool,
    /// The ACLs of this tenant's principal (a tenant of the configuration file).
    #[arg(long, value_name = "NAME")]
    tenant: Option<String>,
    /// The principal (default: `User:worker` for the workers, `User:NAME` for a tenant).
    #[arg(long, value_name = "User:NAME")]
    principal: Option<String>,
    /// The cluster's name (`cluster.name`): its registry and group; without it, the ACLs of
    /// workers that run alone.
    #[arg(long, env = "SLUICE_CLUSTER")]
    cluster: Option<String>,
    /// The configuration file: its tenants' namespaces.
    #[arg(long, env = "SLUICE_CONFIG", value_name = "FILE.toml")]
    config: Option<PathBuf>,
    /// A topic prefix the admin's own topologies use (repeatable), besides the tenants'.
    #[arg(long = "namespace", value_name = "PREFIX")]
    namespaces: Vec<String>,
    /// The properties file of an admin principal that `kafka-acls.sh` should connect as.
    #[arg(long, default_value = "admin.properties", value_name = "FILE")]
    command_config: String,
    /// Create the ACLs in the cluster (with `--bootstrap` and the `--kafka-*` settings of an
    /// admin principal) instead of printing the commands.
    #[arg(long)]
    apply: bool,
    #[command(flatten)]
    connection: super::kafka_tools::Connection,
}

pub async fn run(args: AclsArgs) -> anyhow::Result<ExitCode> {
    let tenancy = match &args.config {
        Some(file) => Tenancy::from_config(super::config::tenancy_of(file)?)
            .map_err(|e| anyhow::anyhow!("configuration file {}: {e}", file.display()))?,
        None => Tenancy::default(),
    };
    let acls: Vec<Acl> = match &args.tenant {
        Some(name) => {
            let tenant = tenancy.tenant(name).ok_or_else(|| {
                anyhow::anyhow!("no tenant {name:?} in the configuration file (give it with --config)")
            })?;
            let principal = args.principal.clone().unwrap_or_else(|| format!("User:{name}"));
            acls::tenant_acls(&principal, &tenant.namespace)
        }
        None => {
            let cluster = args.cluster.as_deref();
            let mut namespaces: Vec<String> = tenancy.tenants().map(|t| t.namespace.clone()).collect();
            namespaces.extend(args.namespaces.iter().cloned());
            namespaces.sort();
            namespaces.dedup();
            anyhow::ensure!(
                !namespaces.is_empty(),
                "the workers need ACLs on the topics of their topologies: give --config (its tenants' namespaces) \
                 or --namespace PREFIX"
            );
            let principal = args.principal.clone().unwrap_or_else(|| "User:worker".to_string());
            acls::worker_acls(&principal, cluster, &namespaces)
        }
    };
    if args.apply {
        let kafka = args.connection.settings().await?;
        let n = acls::apply(&kafka, &acls).await?;
        println!("created {n} ACL entries for {}", acls[0].principal);
    } else {
        print!(
            "{}",
            acls::as_commands(&acls, &args.connection.bootstrap, &args.command_config)
        );
    }
    Ok(ExitCode::SUCCESS)
}
