//! Tenants: who may call a worker's admin API, what they see, and what their topologies may
//! reach. Defined in the worker's configuration file (`--config FILE`), the same on every
//! worker of a cluster:
//!
//! ```toml
//! [admin]
//! tokens = ["sha256:9f86d0…"]          # SHA-256 of each admin token, hex
//!
//! [tenants.acme]
//! tokens = ["sha256:2c26b4…"]
//! namespace = "acme."                  # every topic and topology name starts with it
//! max-topologies = 10
//! max-tasks = 64                       # tasks of all its topologies together
//! max-memory = "64MiB"                 # linear memory of one instance
//! max-call-timeout = "2s"              # deadline of one guest call
//! max-state = "1GiB"                   # state of one topology's tasks on one worker
//! max-records-per-second = 5000        # records one task processes per second
//! max-deploys-per-minute = 10          # deploys, upgrades and deletes in the cluster
//! ```
//!
//! Tokens are stored hashed (`sluice tenants hash-token` prints the form). A request
//! carries `Authorization: Bearer TOKEN`. The admin sees and manages every topology; a
//! tenant only its own, and it may bind only topics in its namespace. With no tokens
//! configured at all, the API is open and every caller is the admin (a single-tenant
//! cluster).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The configuration file's tenancy sections.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TenancyConfig {
    #[serde(default)]
    pub admin: AdminSection,
    #[serde(default)]
    pub tenants: BTreeMap<String, RawTenant>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AdminSection {
    #[serde(default)]
    pub tokens: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RawTenant {
    #[serde(default)]
    pub tokens: Vec<String>,
    pub namespace: String,
    pub max_topologies: Option<u32>,
    pub max_tasks: Option<u32>,
    pub max_memory: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_host_memory: Option<String>,
    pub max_call_timeout: Option<String>,
    pub max_state: Option<String>,
    pub max_records_per_second: Option<u32>,
    pub max_deploys_per_minute: Option<u32>,
}

/// The limits a tenant sets over its topologies' manifests: the lower of the two wins.
/// Stored with each of its registry entries, so every worker runs them under the same caps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct Caps {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_memory: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_host_memory: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_call_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_state: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_records_per_second: Option<u32>,
}

impl Caps {
    /// Lowers `limits` to the caps (setting them where the manifest left the worker's
    /// defaults; the worker's own limits still apply over these).
    pub fn apply(&self, limits: &mut crate::manifest::Limits) {
        fn lower<T: Ord + Copy>(v: &mut Option<T>, max: Option<T>) {
            if let Some(max) = max {
                *v = Some(v.map_or(max, |x| x.min(max)));
            }
        }
        lower(&mut limits.memory, self.max_memory);
        lower(&mut limits.host_memory, self.max_host_memory);
        lower(
            &mut limits.call_timeout,
            self.max_call_timeout_ms.map(Duration::from_millis),
        );
        lower(&mut limits.state, self.max_state);
        lower(&mut limits.records_per_second, self.max_records_per_second);
    }
}

/// A tenant, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub name: String,
    pub namespace: String,
    pub max_topologies: Option<u32>,
    pub max_tasks: Option<u32>,
    pub max_deploys_per_minute: Option<u32>,
    pub caps: Caps,
}

/// Who a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Admin,
    Tenant(Tenant),
    /// An operator (a JWT with role `operator`): sees every tenant's topologies, status and
    /// metrics and may drain a worker, but changes nothing of a tenant's and reads no store.
    Operator,
    /// Another worker of the cluster (signed with the cluster secret): it may read, on behalf
    /// of a caller it has checked already, never write.
    Worker,
}

impl Caller {
    /// The tenant name entries of this caller are stored under (`admin` for the admin).
    pub fn name(&self) -> &str {
        match self {
            Caller::Admin | Caller::Worker | Caller::Operator => ADMIN,
            Caller::Tenant(t) => &t.name,
        }
    }

    /// Whether this caller may see a topology stored under `owner` (and, but for a worker
    /// or an operator, manage it).
    pub fn owns(&self, owner: &str) -> bool {
        match self {
            Caller::Admin | Caller::Worker | Caller::Operator => true,
            Caller::Tenant(t) => t.name == owner,
        }
    }
}

/// The owner of topologies the admin uploads.
pub const ADMIN: &str = "admin";

/// A name as Kafka's metrics see it: `.` and `_` are the same there, so topics `a.x` and
/// `a_x` collide.
fn kafka_normal(name: &str) -> String {
    name.replace('.', "_")
}

/// Whether two namespaces can name the same topic (one is a prefix of the other, as Kafka
/// compares names).
fn overlap(a: &str, b: &str) -> bool {
    let (a, b) = (kafka_normal(a), kafka_normal(b));
    a.starts_with(&b) || b.starts_with(&a)
}

/// The prefix of the cluster's own topics and groups (`sluice.cluster.NAME.registry`, …).
pub const RESERVED_PREFIX: &str = "sluice.";

/// Why a namespace may not be a tenant's, if it may not: one over `sluice.` (or that
/// `sluice.` is in) would let a tenant bind the cluster's own topics.
pub fn reserved(namespace: &str) -> Option<String> {
    overlap(namespace, RESERVED_PREFIX).then(|| {
        format!(
            "a namespace may not overlap {RESERVED_PREFIX:?} (the cluster's own topics and groups): choose a prefix \
             that neither starts with \"sluice.\" nor is the start of it"
        )
    })
}

impl Tenant {
    /// Whether a topology of this tenant is named inside its namespace and binds only
    /// topics in it (its changelogs, `<name>-<store>-changelog`, then are too), and names
    /// its sinks' schema subjects after its topics. An error says which name, topic or
    /// subject is outside, with its kind (`foreign-name`, `foreign-topic`, `foreign-subject`).
    pub fn check_manifest(&self, manifest: &crate::manifest::Manifest) -> Result<(), (&'static str, String)> {
        let ns = &self.namespace;
        if !manifest.name.starts_with(ns.as_str()) {
            return Err((
                "foreign-name",
                format!(
                    "topology {:?} is outside tenant {}'s namespace: its name must start with {ns:?}",
                    manifest.name, self.name
                ),
            ));
        }
        let topics = manifest
            .sources
            .iter()
            .map(|(n, t)| ("source", n, t))
            .chain(manifest.sinks.iter().map(|(n, t)| ("sink", n, t)));
        for (kind, binding, topic) in topics {
            if !topic.starts_with(ns.as_str()) {
                return Err((
                    "foreign-topic",
                    format!(
                        "{kind} {binding:?} is bound to {topic:?}, outside tenant {}'s namespace {ns:?}",
                        self.name
                    ),
                ));
            }
        }
        // Subjects named after records are the registry's, not the tenant's: one tenant's
        // schema would become a version of another's (or refused for it).
        if manifest.formats.subject_strategy == crate::formats::SubjectStrategy::Record {
            return Err((
                "foreign-subject",
                format!(
                    "formats.subject-name-strategy = \"record\" names schema subjects after records, outside tenant \
                     {}'s namespace {ns:?}: use \"topic\" or \"topic-record\", which start with the topic",
                    self.name
                ),
            ));
        }
        if let Some(topic) = manifest
            .dead_letter_topic
            .as_ref()
            .filter(|t| !t.starts_with(ns.as_str()))
        {
            return Err((
                "foreign-topic",
                format!(
                    "dead-letter-topic {topic:?} is outside tenant {}'s namespace {ns:?}",
                    self.name
                ),
            ));
        }
        Ok(())
    }
}

/// Who may call, by token hash.
#[derive(Debug, Clone, Default)]
pub struct Tenancy {
    tokens: BTreeMap<String, Caller>,
    tenants: BTreeMap<String, Tenant>,
    /// What it was made from: the configuration file's sections.
    raw: TenancyConfig,
}

/// `sha256:<hex>` of a token: how tokens are written in the configuration file.
pub fn hash_token(token: &str) -> String {
    let hash = Sha256::digest(token.as_bytes());
    format!("sha256:{}", hash.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

impl Tenancy {
    /// This tenancy with `extra` tenants (the ones an admin created through the API, from
    /// the registry) besides the configuration file's; a name the file defines keeps the
    /// file's definition. Checked as the file is: an error names what is wrong.
    pub fn with(&self, extra: &BTreeMap<String, RawTenant>) -> Result<Tenancy, String> {
        if extra.is_empty() {
            return Ok(self.clone());
        }
        let mut raw = self.raw.clone();
        for (name, tenant) in extra {
            raw.tenants.entry(name.clone()).or_insert_with(|| tenant.clone());
        }
        Tenancy::from_config(raw)
    }

    /// Whether the configuration file defines tenant `name`.
    pub fn in_file(&self, name: &str) -> bool {
        self.raw.tenants.contains_key(name)
    }

    /// Whether the configuration file has admin tokens.
    pub fn has_admin_tokens(&self) -> bool {
        !self.raw.admin.tokens.is_empty()
    }

    pub fn from_config(raw: TenancyConfig) -> Result<Tenancy, String> {
        let mut tenancy = Tenancy {
            raw: raw.clone(),
            ..Tenancy::default()
        };
        let mut add = |hash: &str, caller: Caller, key: &str| -> Result<(), String> {
            let ok = hash
                .strip_prefix("sha256:")
                .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
            if !ok {
                return Err(format!(
                    "{key}: {hash:?} is not a token hash; write \"sha256:<64 hex digits>\" (see `sluice tenants hash-token`)"
                ));
            }
            if tenancy.tokens.insert(hash.to_ascii_lowercase(), caller).is_some() {
                return Err(format!("{key}: the same token is given twice"));
            }
            Ok(())
        };
        for hash in &raw.admin.tokens {
            add(hash, Caller::Admin, "admin.tokens")?;
        }
        for (name, t) in &raw.tenants {
            if name == ADMIN {
                return Err("tenants.admin: \"admin\" names the administrator, not a tenant".into());
            }
            if t.namespace.is_empty()
                || !t
                    .namespace
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            {
                return Err(format!(
                    "tenants.{name}.namespace = {:?}: a topic prefix of letters, digits, '.', '_' and '-'",
                    t.namespace
                ));
            }
            let size = |v: &Option<String>, key: &str| -> Result<Option<usize>, String> {
                v.as_deref()
                    .map(|s| crate::manifest::parse_size(s).map_err(|m| format!("tenants.{name}.{key} = {s:?}: {m}")))
                    .transpose()
            };
            if t.max_records_per_second == Some(0) || t.max_deploys_per_minute == Some(0) {
                return Err(format!(
                    "tenants.{name}: max-records-per-second and max-deploys-per-minute must be more than zero"
                ));
            }
            let tenant = Tenant {
                name: name.clone(),
                namespace: t.namespace.clone(),
                max_topologies: t.max_topologies,
                max_tasks: t.max_tasks,
                max_deploys_per_minute: t.max_deploys_per_minute,
                caps: Caps {
                    max_memory: size(&t.max_memory, "max-memory")?,
                    max_host_memory: size(&t.max_host_memory, "max-host-memory")?,
                    max_call_timeout_ms: t
                        .max_call_timeout
                        .as_deref()
                        .map(|s| {
                            humantime::parse_duration(s)
                                .map(|d| d.as_millis() as u64)
                                .map_err(|e| format!("tenants.{name}.max-call-timeout = {s:?}: {e}"))
                        })
                        .transpose()?,
                    max_state: size(&t.max_state, "max-state")?.map(|n| n as u64),
                    max_records_per_second: t.max_records_per_second,
                },
            };
            if let Some(why) = reserved(&t.namespace) {
                return Err(format!("tenants.{name}.namespace = {:?}: {why}", t.namespace));
            }
            for other in raw.tenants.iter().filter(|(n, _)| *n != name) {
                if overlap(&t.namespace, &other.1.namespace) {
                    let collide =
                        if t.namespace.starts_with(&other.1.namespace) || other.1.namespace.starts_with(&t.namespace) {
                            ""
                        } else {
                            " (they collide in Kafka's names, where '.' and '_' are the same)"
                        };
                    return Err(format!(
                        "tenants.{name}.namespace {:?} and tenant {}'s namespace {:?} overlap{collide}: namespaces \
                         must not overlap",
                        t.namespace, other.0, other.1.namespace
                    ));
                }
            }
            for hash in &t.tokens {
                add(hash, Caller::Tenant(tenant.clone()), &format!("tenants.{name}.tokens"))?;
            }
            tenancy.tenants.insert(name.clone(), tenant);
        }
        Ok(tenancy)
    }

    /// Whether any token is configured (otherwise the API is open).
    pub fn enforced(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// Who presents `token` (None: nobody; with no tokens configured, everyone is the admin).
    pub fn caller(&self, token: Option<&str>) -> Option<Caller> {
        if !self.enforced() {
            return Some(Caller::Admin);
        }
        self.tokens.get(&hash_token(token?)).cloned()
    }

    /// The tenant named `name`, if there is one.
    pub fn tenant(&self, name: &str) -> Option<&Tenant> {
        self.tenants.get(name)
    }

    pub fn tenants(&self) -> impl Iterator<Item = &Tenant> {
        self.tenants.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Result<Tenancy, String> {
        Tenancy::from_config(toml::from_str(text).map_err(|e| e.to_string())?)
    }

    #[test]
    fn tokens_are_checked_by_their_hash_and_namespaces_must_not_overlap() {
        let t = config(&format!(
            "[admin]\ntokens = [\"{}\"]\n[tenants.a]\ntokens = [\"{}\"]\nnamespace = \"a.\"\nmax-memory = \"8MiB\"\n",
            hash_token("root"),
            hash_token("alpha")
        ))
        .unwrap();
        assert_eq!(t.caller(Some("root")), Some(Caller::Admin));
        let Some(Caller::Tenant(a)) = t.caller(Some("alpha")) else {
            panic!()
        };
        assert_eq!((a.namespace.as_str(), a.caps.max_memory), ("a.", Some(8 << 20)));
        assert_eq!(t.caller(Some("nobody")), None);
        assert_eq!(t.caller(None), None);
        assert!(config("[admin]\ntokens = [\"root\"]\n")
            .unwrap_err()
            .contains("not a token hash"));
        assert!(
            config("[tenants.a]\nnamespace = \"x\"\n[tenants.b]\nnamespace = \"x.y\"\n")
                .unwrap_err()
                .contains("must not overlap")
        );
        assert!(config("[tenant.a]\n").is_err(), "unknown keys are refused");
        // A tenant's sinks name their subjects after its topics.
        let manifest = |strategy: &str| {
            crate::manifest::Manifest::parse(
                &format!("name = \"a.t\"\ncomponent = \"c.wasm\"\n[sources]\ni = \"a.in\"\n[formats]\nsubject-name-strategy = \"{strategy}\"\n"),
                "m.toml",
                std::path::Path::new("/"),
            )
            .unwrap()
        };
        assert!(a.check_manifest(&manifest("topic-record")).is_ok());
        let (kind, message) = a.check_manifest(&manifest("record")).unwrap_err();
        assert_eq!(kind, "foreign-subject");
        assert!(message.contains("topic-record"), "{message}");
        assert_eq!(
            config("").unwrap().caller(None),
            Some(Caller::Admin),
            "open without tokens"
        );
    }
}
