//! Test harness: a real Kafka broker for the test run, unique names per test, and rdkafka helpers.
//!
//! Every test that talks to Kafka calls [`kafka()`]. When `KAFKA_BOOTSTRAP` is set, that
//! cluster is used as it is; otherwise the first call runs `dev/kafka up`, which starts a
//! local broker (or finds the one already running) and prints its address. The broker is
//! left running for the next run; `dev/kafka down` stops it. Under `SLUICE_TEST_NO_KAFKA=1`
//! (`dev/test --unit`) a test that asks for Kafka fails at once instead.
//!
//! A new test's set-up (topics, manifest, workers, waiting for a result) is [`Scenario`]
//! and [`eventually`], in [`scenario`].

pub mod cluster;
pub mod oidc;
pub mod registry;
pub mod releases;
pub mod scenario;
pub mod wordcount;
pub mod worker;

pub use scenario::{eventually, Scenario};

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

/// A Kafka cluster that tests may use.
#[derive(Debug)]
pub struct Kafka {
    bootstrap: String,
    /// How to connect to a secured cluster (`dev/kafka up --security sasl_ssl`).
    security: Option<Security>,
}

/// The credentials of a secured test cluster: its CA and each user's password; on an
/// OAUTHBEARER cluster also each user's OAUTHBEARER environment (what workers connect with;
/// the harness keeps to SCRAM, which the same listener takes); on a mutual-TLS one each
/// user's client certificate and key instead of a password.
#[derive(Debug, Clone)]
pub struct Security {
    pub ca: PathBuf,
    pub users: std::collections::BTreeMap<String, String>,
    pub oauth: std::collections::BTreeMap<String, Vec<(String, String)>>,
    /// Mutual TLS (`dev/kafka up --security mtls`): each user's (certificate, key), PEM.
    pub certificates: std::collections::BTreeMap<String, (PathBuf, PathBuf)>,
    /// The cluster's state directory (`SLUICE_KAFKA_DIR` of its `dev/kafka`).
    pub dir: PathBuf,
}

/// The Kafka cluster for this test run; see the module docs for where it comes from. With
/// `SLUICE_TEST_SECURITY=sasl_ssl` it is the secured one ([`secured`]): every worker the
/// tests start connects as the `worker` principal, and the harness as `admin`.
pub fn kafka() -> &'static Kafka {
    refuse_under_no_kafka();
    if std::env::var("SLUICE_TEST_SECURITY").is_ok_and(|s| s == "sasl_ssl") {
        return secured();
    }
    static KAFKA: OnceLock<Kafka> = OnceLock::new();
    KAFKA.get_or_init(|| {
        let bootstrap = match std::env::var("KAFKA_BOOTSTRAP") {
            Ok(addr) if !addr.trim().is_empty() => addr.trim().to_string(),
            _ => start_local_kafka().unwrap_or_else(|e| panic!("no Kafka for the tests: {e:#}")),
        };
        eprintln!("tests: using Kafka at {bootstrap}");
        Kafka {
            bootstrap,
            security: None,
        }
    })
}

/// A secured Kafka (SASL_SSL, ACLs on: `dev/kafka up --security sasl_ssl` with a state
/// directory of its own), started on first use and left running like the plain one. The
/// `worker` principal is given ACLs wide enough for any test's topics and groups (the
/// `secured` tests grant exactly what `sluice acls` derives, on names of their own).
pub fn secured() -> &'static Kafka {
    refuse_under_no_kafka();
    SECURED.get_or_init(|| {
        let kafka = start_secured_kafka(&["--security", "sasl_ssl"], &secured_dir(), true)
            .unwrap_or_else(|e| panic!("no secured Kafka for the tests: {e:#}"));
        eprintln!("tests: using the secured Kafka at {}", kafka.bootstrap);
        kafka
    })
}

/// Fails the calling test when `SLUICE_TEST_NO_KAFKA=1`: a test run that promised no broker
/// (`dev/test --unit`) must neither start one nor wait on one.
pub(crate) fn refuse_under_no_kafka() {
    if std::env::var("SLUICE_TEST_NO_KAFKA").is_ok_and(|v| v == "1") {
        panic!("this test needs Kafka, and SLUICE_TEST_NO_KAFKA=1 (dev/test --unit) runs none: run it with dev/test");
    }
}

static SECURED: OnceLock<Kafka> = OnceLock::new();
static OAUTH: OnceLock<Kafka> = OnceLock::new();
static MTLS: OnceLock<Kafka> = OnceLock::new();
static SOAK: OnceLock<Kafka> = OnceLock::new();

/// A Kafka that takes client certificates (`dev/kafka up --security mtls` in a state
/// directory of its own: SSL, a certificate required, ACLs on), started on first use and left
/// running like the others: every user connects with its certificate (CN=worker is
/// `User:worker`), `worker` with the same wide ACLs as on [`secured`]. The user `stranger`
/// has a certificate for CN=worker signed by a CA the brokers do not trust.
pub fn mtls_secured() -> &'static Kafka {
    refuse_under_no_kafka();
    MTLS.get_or_init(|| {
        let kafka = start_secured_kafka(&["--security", "mtls"], &mtls_dir(), true)
            .unwrap_or_else(|e| panic!("no mutual-TLS Kafka for the tests: {e:#}"));
        eprintln!("tests: using the mutual-TLS Kafka at {}", kafka.bootstrap);
        kafka
    })
}

/// A Kafka with OAUTHBEARER beside SCRAM (`dev/kafka up --security sasl_oauthbearer` in a
/// state directory of its own, tokens of [`oidc::oidc`] living 10 s, connections
/// re-authenticating every 5 s), started on first use: workers the tests start on it connect
/// with OAUTHBEARER as `worker`, with the same wide ACLs as on [`secured`].
pub fn oauth_secured() -> &'static Kafka {
    refuse_under_no_kafka();
    OAUTH.get_or_init(|| {
        oidc::oidc();
        let kafka = start_secured_kafka(
            &[
                "--security",
                "sasl_oauthbearer",
                "--token-lifespan",
                "10s",
                "--reauth-ms",
                "5000",
            ],
            &oauth_dir(),
            true,
        )
        .unwrap_or_else(|e| panic!("no OAUTHBEARER Kafka for the tests: {e:#}"));
        eprintln!("tests: using the OAUTHBEARER Kafka at {}", kafka.bootstrap);
        kafka
    })
}

/// The OAUTHBEARER Kafka of the soak trial (`dev/trials oauth-soak`): `dev/kafka up --security
/// sasl_oauthbearer --token-lifespan 60s --reauth-ms 30000 --client-prefix soak` in
/// `dev/.kafka-soak`, a broker of its own (its provider's clients `soak-USER`, so neither it
/// nor [`oauth_secured`] remakes the other's), started on first use and left running. Unlike
/// the others, `worker` gets no ACLs here: the trial grants it exactly what `sluice acls
/// --worker` derives.
pub fn oauth_soak() -> &'static Kafka {
    refuse_under_no_kafka();
    SOAK.get_or_init(|| {
        oidc::oidc();
        let kafka = start_secured_kafka(
            &[
                "--security",
                "sasl_oauthbearer",
                "--token-lifespan",
                SOAK_TOKEN_LIFESPAN,
                "--reauth-ms",
                SOAK_REAUTH_MS,
                "--client-prefix",
                "soak",
            ],
            &repo_root().join("dev").join(".kafka-soak"),
            false,
        )
        .unwrap_or_else(|e| panic!("no OAUTHBEARER Kafka for the soak trial: {e:#}"));
        eprintln!("tests: using the soak trial's OAUTHBEARER Kafka at {}", kafka.bootstrap);
        kafka
    })
}

/// The life of the soak cluster's tokens and its brokers' `connections.max.reauth.ms`.
pub const SOAK_TOKEN_LIFESPAN: &str = "60s";
pub const SOAK_REAUTH_MS: &str = "30000";

/// The secured cluster, if it is running for these tests and `bootstrap` is its address.
pub fn secured_at(bootstrap: &str) -> Option<&'static Kafka> {
    SECURED
        .get()
        .filter(|k| k.bootstrap == bootstrap)
        .or_else(|| OAUTH.get().filter(|k| k.bootstrap == bootstrap))
        .or_else(|| MTLS.get().filter(|k| k.bootstrap == bootstrap))
        .or_else(|| SOAK.get().filter(|k| k.bootstrap == bootstrap))
}

fn secured_dir() -> PathBuf {
    repo_root().join("dev").join(".kafka-secured")
}

fn oauth_dir() -> PathBuf {
    repo_root().join("dev").join(".kafka-oauth")
}

fn mtls_dir() -> PathBuf {
    repo_root().join("dev").join(".kafka-mtls")
}

/// `dev/kafka up UP` in `dir`, its users' credentials read; with `wide_acls`, `worker` is
/// granted any topic, group and transactional id (see below).
fn start_secured_kafka(up: &[&str], dir: &std::path::Path, wide_acls: bool) -> Result<Kafka> {
    let script = repo_root().join("dev").join("kafka");
    let out = Command::new(&script)
        .arg("up")
        .args(up)
        .env("SLUICE_KAFKA_DIR", dir)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "`{} up {}` failed ({}):\n{}",
            script.display(),
            up.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let bootstrap = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .context("dev/kafka up printed no bootstrap address")?;
    let cluster: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json"))?)?;
    let security = &cluster["security"];
    let users: std::collections::BTreeMap<String, String> = security["users"]
        .as_object()
        .context("no users in the secured cluster's file")?
        .iter()
        .map(|(u, p)| (u.clone(), p.as_str().unwrap_or_default().to_string()))
        .collect();
    // Each user's OAUTHBEARER environment, as `dev/kafka credentials USER` prints it.
    let mut oauth = std::collections::BTreeMap::new();
    if !security["oauth"].is_null() {
        for user in users.keys() {
            let out = Command::new(&script)
                .args(["credentials", user])
                .env("SLUICE_KAFKA_DIR", dir)
                .output()?;
            anyhow::ensure!(out.status.success(), "dev/kafka credentials {user} failed");
            let env = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            oauth.insert(user.clone(), env);
        }
    }
    // Each user's client certificate on a mutual-TLS cluster.
    let mut certificates = std::collections::BTreeMap::new();
    if let Some(clients) = security["clients"].as_object() {
        for (user, client) in clients {
            let path = |what: &str| {
                client[what]
                    .as_str()
                    .map(PathBuf::from)
                    .with_context(|| format!("no {what} for {user} in the mutual-TLS cluster's file"))
            };
            certificates.insert(user.clone(), (path("certificate")?, path("key")?));
        }
    }
    let kafka = Kafka {
        bootstrap,
        security: Some(Security {
            ca: PathBuf::from(security["ca"].as_str().context("no CA in the secured cluster's file")?),
            users,
            oauth,
            certificates,
            dir: dir.to_path_buf(),
        }),
    };
    if !wide_acls {
        return Ok(kafka);
    }
    // Wide ACLs for the workers of ordinary tests (any topic, group and transactional id of
    // theirs): the principal is not a super user, and every request is authorized.
    let wide = |resource, operations: Vec<sluice::acls::Operation>| sluice::acls::Acl {
        principal: "User:worker".into(),
        resource,
        // `*`, literal: Kafka's wildcard (every name).
        name: if resource == sluice::acls::Resource::Cluster {
            "kafka-cluster".into()
        } else {
            "*".into()
        },
        prefixed: false,
        operations,
        why: "tests",
    };
    use sluice::acls::{Operation::*, Resource};
    let acls = vec![
        wide(Resource::Topic, vec![Read, Write, Create, Describe, DescribeConfigs]),
        wide(Resource::Group, vec![Read, Describe]),
        wide(Resource::TransactionalId, vec![Write, Describe]),
        wide(Resource::Cluster, vec![IdempotentWrite]),
    ];
    let admin = kafka.settings("admin")?;
    // On a thread of its own: the first test to ask runs inside an async runtime.
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(sluice::acls::apply(&admin, &acls))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("granting the test workers' ACLs panicked"))??;
    Ok(kafka)
}

/// The root of this repository.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn start_local_kafka() -> Result<String> {
    let script = repo_root().join("dev").join("kafka");
    let out = Command::new(&script)
        .arg("up")
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("`{} up` failed ({}):\n{stderr}", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().last() {
        Some(addr) if !addr.trim().is_empty() => Ok(addr.trim().to_string()),
        _ => bail!("`{} up` printed no bootstrap address:\n{stderr}", script.display()),
    }
}

/// Runs `dev/NAME ARGS` (with `env` set); its last line of stdout, or an error with its
/// stderr.
pub(crate) fn dev_script(name: &str, args: &[&str], env: &[(&str, &std::path::Path)]) -> Result<String> {
    let script = repo_root().join("dev").join(name);
    let out = Command::new(&script)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "`dev/{name} {}` failed ({}):\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string())
}

/// A name no other test (or earlier run) uses: `{prefix}-{uuid}`.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// A record as read back from Kafka.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub partition: i32,
    pub offset: i64,
    /// Milliseconds since the epoch, if the record has a timestamp.
    pub timestamp: Option<i64>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Received {
    fn from(message: &impl rdkafka::message::Message) -> Received {
        use rdkafka::message::Headers as _;
        Received {
            key: message.key().map(<[u8]>::to_vec),
            value: message.payload().map(<[u8]>::to_vec),
            partition: message.partition(),
            offset: message.offset(),
            timestamp: message.timestamp().to_millis(),
            headers: message
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// The value of header `name` as text (none if absent or null).
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_ref())
            .map(|v| String::from_utf8_lossy(v).into_owned())
    }
}

impl Kafka {
    /// The bootstrap address (`host:port[,host:port…]`).
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// A client config with the bootstrap address set (on a secured cluster, as `admin`).
    pub fn config(&self) -> ClientConfig {
        self.config_as("admin")
    }

    /// A client config connecting as `user` (on a plaintext cluster, the user is ignored).
    pub fn config_as(&self, user: &str) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        for (k, v) in self.properties(user) {
            config.set(k, v);
        }
        config
    }

    /// The client properties of `user` on this cluster (none on a plaintext one).
    pub fn properties(&self, user: &str) -> Vec<(&'static str, String)> {
        let Some(s) = &self.security else { return Vec::new() };
        if !s.certificates.is_empty() {
            let (cert, key) = s.certificates.get(user).cloned().unwrap_or_default();
            return vec![
                ("security.protocol", "SSL".into()),
                ("ssl.ca.location", s.ca.display().to_string()),
                ("ssl.certificate.location", cert.display().to_string()),
                ("ssl.key.location", key.display().to_string()),
            ];
        }
        vec![
            ("security.protocol", "SASL_SSL".into()),
            ("sasl.mechanism", "SCRAM-SHA-512".into()),
            ("sasl.username", user.into()),
            ("sasl.password", s.users.get(user).cloned().unwrap_or_default()),
            ("ssl.ca.location", s.ca.display().to_string()),
        ]
    }

    /// The environment that makes `sluice` connect as `user` (`SLUICE_KAFKA_*`; on an
    /// OAUTHBEARER cluster, with OAUTHBEARER).
    pub fn env_as(&self, user: &str) -> Vec<(String, String)> {
        if let Some(env) = self.security.as_ref().and_then(|s| s.oauth.get(user)) {
            return env.clone();
        }
        self.properties(user)
            .into_iter()
            .map(|(k, v)| (format!("SLUICE_KAFKA_{}", k.to_ascii_uppercase().replace('.', "_")), v))
            .collect()
    }

    /// The host's settings for `user` on this cluster.
    pub fn settings(&self, user: &str) -> Result<sluice::kafka::KafkaSettings> {
        sluice::kafka::KafkaSettings::new(self.bootstrap.as_str())
            .with(self.properties(user))
            .map_err(anyhow::Error::msg)
    }

    /// Whether this is a secured cluster.
    pub fn is_secured(&self) -> bool {
        self.security.is_some()
    }

    /// `dev/kafka renew-cert USER ARGS` on this mutual-TLS cluster: a new certificate for
    /// `user` written over its file (`--days N`, `--seconds N`, `--new-key`); its serial.
    pub fn renew_certificate(&self, user: &str, args: &[&str]) -> Result<String> {
        let s = self.security.as_ref().context("not a secured cluster")?;
        anyhow::ensure!(!s.certificates.is_empty(), "not a mutual-TLS cluster");
        let mut all = vec!["renew-cert", user];
        all.extend_from_slice(args);
        dev_script("kafka", &all, &[("SLUICE_KAFKA_DIR", &s.dir)])
    }

    /// `dev/kafka ARGS` on this secured cluster, one of the harness's own (`restart --node
    /// 1`, say); the run's plain cluster may be one the harness did not start.
    pub fn dev_kafka(&self, args: &[&str]) -> Result<String> {
        let s = self.security.as_ref().context("not a secured cluster of the harness")?;
        dev_script("kafka", args, &[("SLUICE_KAFKA_DIR", &s.dir)])
    }

    /// Creates a topic with `partitions` partitions and waits until it exists.
    pub async fn create_topic(&self, name: &str, partitions: i32) -> Result<()> {
        self.create_topic_with(name, partitions, 1, &[]).await
    }

    /// Creates a topic with a replication factor and topic configs of its own.
    pub async fn create_topic_with(
        &self,
        name: &str,
        partitions: i32,
        replication: i32,
        configs: &[(&str, &str)],
    ) -> Result<()> {
        let admin: AdminClient<DefaultClientContext> = self.config().create()?;
        let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(replication));
        for (k, v) in configs {
            topic = topic.set(k, v);
        }
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        // A broker starved of CPU (two cores, several brokers and workers at once) can time
        // a request out; creating a topic again is harmless (it already exists, or now does).
        let mut attempts = 0;
        'create: loop {
            attempts += 1;
            let results = match admin.create_topics([&topic], &options).await {
                Ok(results) => results,
                Err(e) if attempts < 4 => {
                    eprintln!("creating topic {name}: {e}; trying again");
                    continue 'create;
                }
                Err(e) => return Err(e).with_context(|| format!("creating topic {name}")),
            };
            for result in results {
                match result {
                    Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                    Err((_, RDKafkaErrorCode::RequestTimedOut)) if attempts < 4 => continue 'create,
                    Err((topic, code)) => bail!("creating topic {topic}: {code}"),
                }
            }
            return Ok(());
        }
    }

    /// An idempotent producer: records of one partition arrive in the order they were sent.
    pub fn producer(&self) -> Result<FutureProducer> {
        Ok(self
            .config()
            .set("enable.idempotence", "true")
            .set("linger.ms", "5")
            .create()?)
    }

    /// Produces `records` (key, value) to `topic` and waits for every acknowledgement.
    /// Returns the (partition, offset) each record was written at, in input order.
    pub async fn produce(&self, topic: &str, records: &[(Vec<u8>, Vec<u8>)]) -> Result<Vec<(i32, i64)>> {
        let producer = self.producer()?;
        let sends: Vec<_> = records
            .iter()
            .map(|(k, v)| producer.send(FutureRecord::to(topic).key(k).payload(v), Duration::from_secs(30)))
            .collect();
        let mut positions = Vec::with_capacity(sends.len());
        for (i, send) in futures::future::join_all(sends).await.into_iter().enumerate() {
            let delivery = send.map_err(|(e, _)| anyhow::anyhow!("producing record {i} to {topic}: {e}"))?;
            positions.push((delivery.partition, delivery.offset));
        }
        Ok(positions)
    }

    /// Produces `records` (key, value, timestamp in ms) to `topic`, each stamped with its
    /// own time; returns where each was written, in input order.
    pub async fn produce_stamped(&self, topic: &str, records: &[(Vec<u8>, Vec<u8>, i64)]) -> Result<Vec<(i32, i64)>> {
        let producer = self.producer()?;
        let sends: Vec<_> = records
            .iter()
            .map(|(k, v, at)| {
                producer.send(
                    FutureRecord::to(topic).key(k).payload(v).timestamp(*at),
                    Duration::from_secs(30),
                )
            })
            .collect();
        let mut positions = Vec::with_capacity(sends.len());
        for (i, send) in futures::future::join_all(sends).await.into_iter().enumerate() {
            let delivery = send.map_err(|(e, _)| anyhow::anyhow!("producing record {i} to {topic}: {e}"))?;
            positions.push((delivery.partition, delivery.offset));
        }
        Ok(positions)
    }

    /// Produces `records` (key, value) to one partition of `topic`, in order.
    pub async fn produce_to(&self, topic: &str, partition: i32, records: &[(&str, &str)]) -> Result<()> {
        // The producer is idempotent: sent together, the records still land in order.
        let producer = self.producer()?;
        let sends: Vec<_> = records
            .iter()
            .map(|(k, v)| {
                producer.send(
                    FutureRecord::to(topic).partition(partition).key(*k).payload(*v),
                    Duration::from_secs(30),
                )
            })
            .collect();
        for send in futures::future::join_all(sends).await {
            send.map_err(|(e, _)| anyhow::anyhow!("producing to {topic}/{partition}: {e}"))?;
        }
        Ok(())
    }

    /// The offset `group` has committed for `topic`/`partition`, if any.
    pub fn committed_offset(&self, group: &str, topic: &str, partition: i32) -> Result<Option<i64>> {
        use rdkafka::consumer::BaseConsumer;
        use rdkafka::{Offset, TopicPartitionList};
        let consumer: BaseConsumer = self.config().set("group.id", group).create()?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, partition);
        let committed = consumer.committed_offsets(tpl, Duration::from_secs(30))?;
        let offset = committed.find_partition(topic, partition).map(|p| p.offset());
        Ok(match offset {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        })
    }

    /// Offsets `group` has committed for partitions `0..partitions` of `topic` (0 where none),
    /// summed: how many records of the topic the group has processed. One consumer, one
    /// request; a slow coordinator gets 30 s.
    pub fn committed_total(&self, group: &str, topic: &str, partitions: i32) -> Result<i64> {
        use rdkafka::consumer::BaseConsumer;
        use rdkafka::{Offset, TopicPartitionList};
        let consumer: BaseConsumer = self.config().set("group.id", group).create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(topic, p);
        }
        let committed = consumer.committed_offsets(tpl, Duration::from_secs(30))?;
        Ok(committed
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o,
                _ => 0,
            })
            .sum())
    }

    /// The offsets `group` has committed for partitions `0..partitions` of `topic`, in one
    /// request (none where nothing is committed).
    pub fn committed_offsets(&self, group: &str, topic: &str, partitions: i32) -> Result<Vec<Option<i64>>> {
        use rdkafka::consumer::BaseConsumer;
        use rdkafka::{Offset, TopicPartitionList};
        let consumer: BaseConsumer = self.config().set("group.id", group).create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition(topic, p);
        }
        let committed = consumer.committed_offsets(tpl, Duration::from_secs(30))?;
        Ok((0..partitions)
            .map(|p| match committed.find_partition(topic, p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => Some(o),
                _ => None,
            })
            .collect())
    }

    /// Waits until `group` has committed `total` records of `topic`. A query that fails (a
    /// busy coordinator) is retried until `timeout`.
    pub async fn wait_committed(
        &self,
        group: &str,
        topic: &str,
        partitions: i32,
        total: i64,
        timeout: Duration,
    ) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        // The last count seen, and the last failed query (both say what went wrong).
        let (mut counted, mut failed) = ("nothing counted".to_string(), String::new());
        loop {
            match self.committed_total(group, topic, partitions) {
                Ok(n) if n >= total => return Ok(()),
                Ok(n) => counted = format!("{n} of {total} committed"),
                Err(e) => failed = format!("; the last query failed: {e}"),
            }
            if tokio::time::Instant::now() > deadline {
                bail!("group {group} did not commit {total} records of {topic} within {timeout:?}: {counted}{failed}");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// The partitions of `topic` a transaction still holds open: (partition, last stable
    /// offset, high watermark). A read-committed reader sees nothing at or past a
    /// partition's last stable offset, records of transactions committed since included,
    /// and [`read_all`](Self::read_all) stops there. A producer killed inside a transaction
    /// holds it until the broker times the transaction out (its `transaction.timeout.ms`,
    /// then up to the coordinator's abort check interval, 10 s by default).
    pub fn open_transactions(&self, topic: &str) -> Result<Vec<(i32, i64, i64)>> {
        use rdkafka::consumer::BaseConsumer;
        let client = |isolation: &str| -> Result<BaseConsumer> {
            Ok(self
                .config()
                .set("group.id", unique_name("test-watermarks"))
                .set("isolation.level", isolation)
                .create()?)
        };
        let (committed, written) = (client("read_committed")?, client("read_uncommitted")?);
        let partitions = partition_count(&committed, topic)?;
        let mut open = Vec::new();
        for p in 0..partitions {
            let (_, stable) = committed.fetch_watermarks(topic, p, Duration::from_secs(10))?;
            let (_, high) = written.fetch_watermarks(topic, p, Duration::from_secs(10))?;
            if stable < high {
                open.push((p, stable, high));
            }
        }
        Ok(open)
    }

    /// Waits until no transaction holds a partition of `topic` open (see
    /// [`open_transactions`](Self::open_transactions)), for up to `timeout`.
    pub async fn wait_transactions_ended(&self, topic: &str, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let open = self.open_transactions(topic)?;
            if open.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                let open: Vec<String> = open
                    .iter()
                    .map(|(p, stable, high)| format!("partition {p} stable to {stable} of {high}"))
                    .collect();
                bail!(
                    "a transaction still holds {topic} open after {timeout:?}: {}",
                    open.join(", ")
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// A consumer in `group` that starts from the earliest offset of partitions it has no commit for.
    pub fn consumer(&self, group: &str) -> Result<StreamConsumer> {
        Ok(self
            .config()
            .set("group.id", group)
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()?)
    }

    /// Reads `topic` from the beginning with a fresh group until `count` records have arrived,
    /// or fails after `timeout` saying how many did.
    pub async fn consume(&self, topic: &str, count: usize, timeout: Duration) -> Result<Vec<Received>> {
        let consumer = self.consumer(&unique_name("test-reader"))?;
        consumer.subscribe(&[topic])?;
        let mut received = Vec::with_capacity(count);
        let deadline = tokio::time::Instant::now() + timeout;
        while received.len() < count {
            let message = match tokio::time::timeout_at(deadline, consumer.recv()).await {
                Ok(message) => message.with_context(|| format!("reading {topic}"))?,
                Err(_) => bail!(
                    "read {} of {count} records from {topic} within {timeout:?}",
                    received.len()
                ),
            };
            received.push(Received::from(&message));
        }
        Ok(received)
    }

    /// Reads `topic` from the beginning until `done` says what was read is enough (under
    /// at-least-once, replays may add copies: count what must be there, not how many came).
    pub async fn consume_until(
        &self,
        topic: &str,
        timeout: Duration,
        mut done: impl FnMut(&[Received]) -> bool,
    ) -> Result<Vec<Received>> {
        let consumer = self.consumer(&unique_name("test-reader"))?;
        consumer.subscribe(&[topic])?;
        let mut received = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        while !done(&received) {
            let message = match tokio::time::timeout_at(deadline, consumer.recv()).await {
                Ok(message) => message.with_context(|| format!("reading {topic}"))?,
                Err(_) => bail!(
                    "read {} records from {topic} within {timeout:?}, and not yet all that should be there",
                    received.len()
                ),
            };
            received.push(Received::from(&message));
        }
        Ok(received)
    }
}

impl Kafka {
    /// A topic's partition count and one of its configs (`None`: the topic does not exist).
    pub async fn describe_topic(&self, topic: &str, config: &str) -> Result<Option<(i32, Option<String>)>> {
        use rdkafka::admin::ResourceSpecifier;
        use rdkafka::consumer::BaseConsumer;
        let client: BaseConsumer = self.config().create()?;
        let metadata = client.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        let Some(partitions) = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
            .map(|t| t.partitions().len() as i32)
        else {
            return Ok(None);
        };
        let admin: AdminClient<DefaultClientContext> = self.config().create()?;
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        let mut value = None;
        for resource in admin
            .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
            .await?
        {
            let resource = resource.map_err(|e| anyhow::anyhow!("describing topic {topic}: {e}"))?;
            if let Some(entry) = resource.entries.into_iter().find(|e| e.name == config) {
                value = entry.value;
            }
        }
        Ok(Some((partitions, value)))
    }

    /// Deletes a topic and waits until the cluster no longer lists it.
    pub async fn delete_topic(&self, name: &str) -> Result<()> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let admin: AdminClient<DefaultClientContext> = self.config().create()?;
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for result in admin.delete_topics(&[name], &options).await? {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
                Err((topic, code)) => bail!("deleting topic {topic}: {code}"),
            }
        }
        let client: BaseConsumer = self.config().create()?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let metadata = client.fetch_metadata(Some(name), Duration::from_secs(10))?;
            let exists = metadata
                .topics()
                .iter()
                .any(|t| t.name() == name && t.error().is_none() && !t.partitions().is_empty());
            if !exists {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("topic {name} still exists 60 s after it was deleted");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Deletes a consumer group's committed offsets (the group must have no members).
    pub async fn delete_group(&self, group: &str) -> Result<()> {
        let admin: AdminClient<DefaultClientContext> = self.config().create()?;
        let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
        for result in admin.delete_groups(&[group], &options).await? {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::GroupIdNotFound)) => {}
                Err((group, code)) => bail!("deleting group {group}: {code}"),
            }
        }
        Ok(())
    }

    /// Every committed record of `topic` (read-committed: aborted transactions are skipped),
    /// from the beginning to the end of each partition as it is now.
    pub fn read_all(&self, topic: &str, timeout: Duration) -> Result<Vec<Received>> {
        self.read_all_at(topic, timeout, "read_committed")
    }

    /// As [`read_all`](Self::read_all), every record written, aborted and open transactions'
    /// included: where a record that [`read_all`](Self::read_all) misses went.
    pub fn read_all_uncommitted(&self, topic: &str, timeout: Duration) -> Result<Vec<Received>> {
        self.read_all_at(topic, timeout, "read_uncommitted")
    }

    fn read_all_at(&self, topic: &str, timeout: Duration, isolation: &str) -> Result<Vec<Received>> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::{Offset, TopicPartitionList};
        let consumer: BaseConsumer = self
            .config()
            .set("group.id", unique_name("test-read-all"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", isolation)
            .create()?;
        let partitions = partition_count(&consumer, topic)?;
        let mut tpl = TopicPartitionList::new();
        let mut ends = HashMap::new();
        for p in 0..partitions {
            let (_, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10))?;
            ends.insert(p, high);
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
        }
        consumer.assign(&tpl)?;
        let deadline = std::time::Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let position = consumer.position()?;
            let done = (0..partitions).all(|p| {
                let end = ends[&p];
                end == 0
                    || matches!(position.find_partition(topic, p).map(|e| e.offset()), Some(Offset::Offset(o)) if o >= end)
            });
            if done {
                return Ok(out);
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "reading {topic} to its end took longer than {timeout:?} ({} records so far)",
                    out.len()
                );
            }
            if let Some(message) = consumer.poll(Duration::from_millis(100)) {
                let message = message?;
                if message.offset() < ends[&message.partition()] {
                    out.push(Received::from(&message));
                }
            }
        }
    }
}

impl Kafka {
    /// Produces one record per key with Kafka's own Java producer and its default
    /// partitioner (`tests/java/ProduceKeys.java`, on the jars `dev/kafka classpath` names)
    /// and returns the partition each key went to. Plaintext clusters only.
    pub fn produce_with_java(&self, topic: &str, keys: &[Vec<u8>]) -> Result<HashMap<Vec<u8>, i32>> {
        let records: Vec<(Vec<u8>, Vec<u8>)> = keys.iter().map(|k| (k.clone(), k.clone())).collect();
        let partitions = self.produce_records_with_java(topic, &records)?;
        Ok(keys.iter().cloned().zip(partitions).collect())
    }

    /// As [`produce_with_java`](Self::produce_with_java), with values: the partition of
    /// each record, in order.
    pub fn produce_records_with_java(&self, topic: &str, records: &[(Vec<u8>, Vec<u8>)]) -> Result<Vec<i32>> {
        use std::io::Write;
        if self.is_secured() {
            bail!("produce_with_java speaks plaintext only");
        }
        let script = repo_root().join("dev").join("kafka");
        let out = Command::new(&script).arg("classpath").output()?;
        if !out.status.success() {
            bail!(
                "`dev/kafka classpath` failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let classpath = String::from_utf8(out.stdout)?.trim().to_string();
        let source = repo_root().join("tests").join("java").join("ProduceKeys.java");
        let mut child = Command::new("java")
            .arg("-cp")
            .arg(&classpath)
            .arg(&source)
            .arg(&self.bootstrap)
            .arg(topic)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .context("starting java (ProduceKeys.java)")?;
        let hex = |key: &[u8]| key.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let mut input = String::new();
        for (key, value) in records {
            input.push_str(&hex(key));
            input.push(' ');
            input.push_str(&hex(value));
            input.push('\n');
        }
        let mut stdin = child.stdin.take().context("java's stdin")?;
        let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
        let out = child.wait_with_output()?;
        writer
            .join()
            .map_err(|_| anyhow::anyhow!("writing the records panicked"))??;
        if !out.status.success() {
            bail!(
                "ProduceKeys.java failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let stdout = String::from_utf8(out.stdout)?;
        let lines: Vec<&str> = stdout.lines().collect();
        if lines.len() != records.len() {
            bail!("ProduceKeys reported {} of {} records", lines.len(), records.len());
        }
        let mut partitions = Vec::with_capacity(records.len());
        for (line, (key, _)) in lines.iter().zip(records) {
            match line.split_once(' ') {
                Some((k, p)) if k == hex(key) => partitions.push(p.parse()?),
                _ => bail!("ProduceKeys printed {line:?} for key {}", hex(key)),
            }
        }
        Ok(partitions)
    }
}

impl Kafka {
    /// Limits (or, with none, frees) how fast the broker serves fetches to clients with this
    /// `client.id`: a real broker quota, for tests that need a slow restoration.
    pub async fn set_consumer_byte_rate(&self, client_id: &str, rate: Option<f64>) -> Result<()> {
        use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
        use kafka_protocol::messages::AlterClientQuotasRequest;
        use kafka_protocol::protocol::StrBytes;
        let request = AlterClientQuotasRequest::default().with_entries(vec![EntryData::default()
            .with_entity(vec![EntityData::default()
                .with_entity_type(StrBytes::from_static_str("client-id"))
                .with_entity_name(Some(StrBytes::from_string(client_id.to_string())))])
            .with_ops(vec![OpData::default()
                .with_key(StrBytes::from_static_str("consumer_byte_rate"))
                .with_value(rate.unwrap_or(0.0))
                .with_remove(rate.is_none())])]);
        let addr = self.bootstrap.split(',').next().unwrap_or_default();
        let settings = self.settings("admin")?;
        let mut connection = sluice::group::connection::Connection::connect(&settings, addr).await?;
        let response = connection.send(&request, 1).await?;
        for entry in response.entries {
            if entry.error_code != 0 {
                bail!("setting a quota for client {client_id}: error {}", entry.error_code);
            }
        }
        Ok(())
    }
}

/// Groups records by partition, each partition in offset order.
pub fn by_partition(records: &[Received]) -> HashMap<i32, Vec<Received>> {
    let mut map: HashMap<i32, Vec<Received>> = HashMap::new();
    for r in records {
        map.entry(r.partition).or_default().push(r.clone());
    }
    for list in map.values_mut() {
        list.sort_by_key(|r| r.offset);
    }
    map
}

/// A TCP port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The body of `GET http://127.0.0.1:{port}{path}`.
pub fn http_get(port: u16, path: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default())
}

/// One HTTP/1.1 exchange with `127.0.0.1:{port}` on a connection of its own: the status and
/// the body of the answer. `headers` are sent as given (`("authorization", "Bearer …")`).
/// A body the server stops reading (it answered first) is not an error: the answer counts.
pub fn http(port: u16, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    stream.write_all(head.as_bytes())?;
    for piece in body.chunks(64 << 10) {
        if stream.write_all(piece).is_err() {
            break;
        }
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let response = String::from_utf8_lossy(&response).into_owned();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .with_context(|| {
            format!(
                "{method} {path}: no HTTP answer (got {} bytes: {response:?})",
                response.len()
            )
        })?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// A component wrapping one core module of `functions` empty functions: small on disk
/// (three bytes a function), costly to compile.
pub fn many_functions(functions: usize) -> Vec<u8> {
    fn leb(mut n: usize) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return out;
            }
            out.push(byte | 0x80);
        }
    }
    let mut module = b"\0asm\x01\0\0\0".to_vec();
    module.extend([1, 4, 1, 0x60, 0, 0]);
    let mut funcs = leb(functions);
    funcs.extend(std::iter::repeat_n(0u8, functions));
    module.push(3);
    module.extend(leb(funcs.len()));
    module.extend(funcs);
    let mut code = leb(functions);
    for _ in 0..functions {
        code.extend([2, 0, 0x0b]);
    }
    module.push(10);
    module.extend(leb(code.len()));
    module.extend(code);
    let mut component = b"\0asm\x0d\0\x01\0".to_vec();
    component.push(1);
    component.extend(leb(module.len()));
    component.extend(module);
    component
}

/// How many partitions `topic` has, as `client`'s metadata says (an error if it is not there).
fn partition_count(client: &rdkafka::consumer::BaseConsumer, topic: &str) -> Result<i32> {
    let metadata = client.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().len() as i32)
        .context("the topic is not in the metadata")
}
