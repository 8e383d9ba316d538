//! How this process reaches Kafka: the settings every Kafka client shares (rdkafka's
//! producers, consumers and admin clients, and the group-protocol connections), in one place.
//!
//! Every rdkafka client is made from [`KafkaSettings::client`] and created through
//! [`Authorize::authorized`], and every group-protocol connection reads
//! [`KafkaSettings::security`], so a property that every connection needs (TLS, SASL) is set
//! here once and reaches them all.
//!
//! With OAUTHBEARER (`sasl.mechanism = OAUTHBEARER`), the process fetches its access tokens
//! itself ([`crate::oidc::token`]; [`KafkaSettings::start_tokens`]) and hands each one to
//! every rdkafka client it has (`rd_kafka_oauthbearer_set_token`): one token per process, not
//! one per client, fetched on the host's schedule whether or not a client is polled (an admin
//! client never polls the queue librdkafka asks for tokens on). librdkafka re-authenticates
//! its connections when the broker asks (KIP-368).
//!
//! ```
//! use sluice::kafka::KafkaSettings;
//! let kafka = KafkaSettings::new("broker1:9093")
//!     .with([
//!         ("security.protocol", "SASL_SSL"),
//!         ("sasl.mechanism", "SCRAM-SHA-512"),
//!         ("sasl.username", "worker"),
//!         ("sasl.password", "…"),
//!         ("ssl.ca.location", "/etc/kafka/ca.pem"),
//!     ])
//!     .unwrap();
//! assert!(kafka.security().sasl.is_some());
//! ```

mod certificate;
mod tokens;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::oidc::token::TokenSettings;

use tokens::Tokens;
pub use tokens::{Authorize, Authorized, Native};

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::ConsumerContext;

/// The client properties Sluice passes on to Kafka (librdkafka's names, as Kafka's own
/// clients spell them); with [`OAUTH_PROPERTIES`], what Sluice takes; any other is refused
/// by name.
pub const PROPERTIES: &[&str] = &[
    "security.protocol",
    "sasl.mechanism",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
];

/// The properties of OAUTHBEARER, which Sluice reads and librdkafka does not get (the host
/// fetches the tokens).
pub const OAUTH_PROPERTIES: &[&str] = &[
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.scope",
    "sasl.oauthbearer.audience",
    "https.ca.location",
];

/// The Kafka cluster this process talks to, and how.
#[derive(Clone)]
pub struct KafkaSettings {
    bootstrap: String,
    properties: BTreeMap<String, String>,
    security: Security,
    /// With OAUTHBEARER, once started: the tokens and the clients that hold them.
    tokens: Option<Arc<Tokens>>,
    /// With a client certificate: its files, watched for a renewal.
    certificate: Option<Arc<certificate::CertificateWatch>>,
}

impl PartialEq for KafkaSettings {
    fn eq(&self, other: &Self) -> bool {
        self.bootstrap == other.bootstrap
            && self.properties == other.properties
            && self.security == other.security
            && match (&self.tokens, &other.tokens) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

impl Eq for KafkaSettings {}

impl std::fmt::Debug for KafkaSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSettings")
            .field("bootstrap", &self.bootstrap)
            .field("security", &self.security)
            .finish()
    }
}

/// How connections to the brokers are secured, as the group-protocol client reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Security {
    /// TLS, when `security.protocol` is `SSL` or `SASL_SSL`.
    pub tls: Option<Tls>,
    /// SASL, when `security.protocol` is `SASL_PLAINTEXT` or `SASL_SSL`.
    pub sasl: Option<Sasl>,
    /// Where OAUTHBEARER tokens come from, with `sasl.mechanism = OAUTHBEARER`.
    pub oauth: Option<TokenSettings>,
}

/// TLS to the brokers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    /// The CA (PEM) broker certificates are checked against (`ssl.ca.location`).
    pub ca: Option<PathBuf>,
    /// A client certificate chain and its key (PEM), for brokers that ask for one.
    pub client: Option<(PathBuf, PathBuf)>,
    /// Check that a broker's certificate names its host (`ssl.endpoint.identification.algorithm
    /// = https`, the default); `none` checks the chain only.
    pub verify_hostname: bool,
}

/// SASL authentication with the brokers (for OAUTHBEARER the user is the OAuth client and
/// the password empty: the token comes from [`KafkaSettings::token`]).
#[derive(Clone, PartialEq, Eq)]
pub struct Sasl {
    pub mechanism: Mechanism,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Sasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sasl")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// The SASL mechanisms the workers speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    ScramSha256,
    ScramSha512,
    OAuthBearer,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
            Mechanism::OAuthBearer => "OAUTHBEARER",
        }
    }
}

impl KafkaSettings {
    /// Settings for the cluster at `bootstrap` (`host:port[,host:port…]`), in plaintext.
    pub fn new(bootstrap: impl Into<String>) -> KafkaSettings {
        KafkaSettings {
            bootstrap: bootstrap.into(),
            properties: BTreeMap::new(),
            security: Security::default(),
            tokens: None,
            certificate: None,
        }
    }

    /// These settings with client `properties` (names of [`PROPERTIES`]), checked: an
    /// unknown name, a protocol or mechanism the workers do not speak, SASL without its
    /// credentials, each is an error that names it.
    pub fn with<K: AsRef<str>, V: AsRef<str>>(
        mut self,
        properties: impl IntoIterator<Item = (K, V)>,
    ) -> Result<KafkaSettings, String> {
        for (name, value) in properties {
            let (name, value) = (name.as_ref(), value.as_ref());
            if !PROPERTIES.contains(&name) && !OAUTH_PROPERTIES.contains(&name) {
                return Err(format!(
                    "kafka.{name}: not a client property Sluice takes (it takes {}, {})",
                    PROPERTIES.join(", "),
                    OAUTH_PROPERTIES.join(", ")
                ));
            }
            self.properties.insert(name.to_string(), value.to_string());
        }
        self.security = self.read_security()?;
        self.certificate = self
            .security
            .tls
            .as_ref()
            .and_then(certificate::CertificateWatch::start);
        Ok(self)
    }

    fn read_security(&self) -> Result<Security, String> {
        let get = |name: &str| self.properties.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
        let protocol = get("security.protocol").unwrap_or("PLAINTEXT").to_ascii_uppercase();
        let (tls, sasl) = match protocol.as_str() {
            "PLAINTEXT" => (false, false),
            "SSL" => (true, false),
            "SASL_PLAINTEXT" => (false, true),
            "SASL_SSL" => (true, true),
            other => {
                return Err(format!(
                    "kafka.security.protocol = {other:?}: one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"
                ))
            }
        };
        let tls = tls
            .then(|| -> Result<Tls, String> {
                let verify_hostname = match get("ssl.endpoint.identification.algorithm")
                    .unwrap_or("https")
                    .to_ascii_lowercase()
                    .as_str()
                {
                    "https" => true,
                    "none" => false,
                    other => {
                        return Err(format!(
                            "kafka.ssl.endpoint.identification.algorithm = {other:?}: https (check the host name, the \
                             default) or none"
                        ))
                    }
                };
                let client = match (get("ssl.certificate.location"), get("ssl.key.location")) {
                    (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
                    (None, None) => None,
                    _ => return Err(
                        "kafka.ssl.certificate.location and kafka.ssl.key.location go together: give both or neither"
                            .into(),
                    ),
                };
                if client.is_some() && get("ssl.key.password").is_some() {
                    return Err("kafka.ssl.key.password: the workers take an unencrypted client key (PEM)".into());
                }
                Ok(Tls {
                    ca: get("ssl.ca.location").map(PathBuf::from),
                    client,
                    verify_hostname,
                })
            })
            .transpose()?;
        let sasl = sasl
            .then(|| -> Result<Sasl, String> {
                let mechanism = match get("sasl.mechanism").unwrap_or("PLAIN").to_ascii_uppercase().as_str() {
                    "PLAIN" => Mechanism::Plain,
                    "SCRAM-SHA-256" => Mechanism::ScramSha256,
                    "SCRAM-SHA-512" => Mechanism::ScramSha512,
                    "OAUTHBEARER" => Mechanism::OAuthBearer,
                    other => {
                        return Err(format!(
                            "kafka.sasl.mechanism = {other:?}: the workers speak PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 \
                             and OAUTHBEARER"
                        ))
                    }
                };
                if mechanism == Mechanism::OAuthBearer {
                    let (Some(_), Some(id), Some(_)) = (
                        get("sasl.oauthbearer.token.endpoint.url"),
                        get("sasl.oauthbearer.client.id"),
                        get("sasl.oauthbearer.client.secret"),
                    ) else {
                        return Err(
                            "kafka.sasl.mechanism = OAUTHBEARER needs kafka.sasl.oauthbearer.token.endpoint.url, \
                             kafka.sasl.oauthbearer.client.id and its secret (kafka.sasl.oauthbearer.client.secret.file \
                             or SLUICE_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET)"
                                .into(),
                        );
                    };
                    return Ok(Sasl {
                        mechanism,
                        username: id.to_string(),
                        password: String::new(),
                    });
                }
                let (Some(username), Some(password)) = (get("sasl.username"), get("sasl.password")) else {
                    return Err(format!(
                        "kafka.security.protocol = {protocol} needs kafka.sasl.username and kafka.sasl.password (or \
                         kafka.sasl.password.file)"
                    ));
                };
                Ok(Sasl {
                    mechanism,
                    username: username.to_string(),
                    password: password.to_string(),
                })
            })
            .transpose()?;
        let oauth = match &sasl {
            Some(s) if s.mechanism == Mechanism::OAuthBearer => {
                let mut t = TokenSettings::new(
                    get("sasl.oauthbearer.token.endpoint.url").unwrap_or_default(),
                    get("sasl.oauthbearer.client.id").unwrap_or_default(),
                    get("sasl.oauthbearer.client.secret").unwrap_or_default(),
                );
                t.scope = get("sasl.oauthbearer.scope").map(str::to_string);
                t.audience = get("sasl.oauthbearer.audience").map(str::to_string);
                t.ca = get("https.ca.location").map(PathBuf::from);
                Some(t)
            }
            _ => None,
        };
        Ok(Security { tls, sasl, oauth })
    }

    /// The bootstrap servers, as given.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The bootstrap addresses one by one (for clients that connect themselves).
    pub fn bootstrap_addrs(&self) -> impl Iterator<Item = &str> {
        self.bootstrap.split(',').map(str::trim).filter(|a| !a.is_empty())
    }

    /// How connections are secured (for clients that connect themselves).
    pub fn security(&self) -> &Security {
        &self.security
    }

    /// The security properties, as given (for `sluice config show` and the CLI's tools).
    pub fn properties(&self) -> &BTreeMap<String, String> {
        &self.properties
    }

    /// An rdkafka configuration with every shared property set; the caller adds its own,
    /// and creates the client with [`Authorize::authorized`].
    pub fn client(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        for (name, value) in &self.properties {
            if PROPERTIES.contains(&name.as_str()) {
                config.set(name, value);
            }
        }
        if self.security.oauth.is_some() {
            config.set("sasl.mechanism", "OAUTHBEARER");
        }
        config
    }

    /// As [`Self::client`], for the clients that move records (`client.id` `sluice-worker`).
    pub fn worker_client(&self) -> ClientConfig {
        let mut config = self.client();
        config.set("client.id", "sluice-worker");
        config
    }
}

/// Consumer events: errors go to the log; nothing else is needed yet.
pub struct ConsumerEvents;

impl ClientContext for ConsumerEvents {}
impl ConsumerContext for ConsumerEvents {}

/// Makes `consumer` fetch a partition it has just sought and resumed now, not up to a
/// second later.
///
/// librdkafka (2.12) wakes a broker's thread when a partition starts fetching, but a
/// paused partition keeps its fetch state, so resuming it (or seeking it) wakes nobody: a
/// broker thread with nothing else to fetch sleeps until its next one-second tick before it
/// notices (measured: a promoted learner's tail came 0.96 s after its resume). Any request
/// to the partition's leader wakes that thread; this sends the cheapest, a ListOffsets, and
/// waits for its answer (behind a fetch in flight, at most the consumer's
/// `fetch.wait.max.ms`). Errors do not matter: the answer is not used.
pub fn wake_fetcher<C: ConsumerContext>(consumer: &rdkafka::consumer::BaseConsumer<C>, topic: &str, partition: i32) {
    use rdkafka::consumer::Consumer;
    let _ = consumer.fetch_watermarks(topic, partition, std::time::Duration::from_secs(2));
}

/// What a consumer knows, without asking the broker, of how far a partition it fetches is
/// behind: the high watermark of its last fetch response against its position (the offset
/// after the last record, or transaction marker, it handed out). `None` while it has had no
/// fetch response for the partition. `start` is where the partition was positioned (none:
/// the log start) and counts while nothing has been handed out since.
///
/// Kafka Streams reads the same from its consumer's fetch metadata (KIP-695). librdkafka
/// keeps the last stable offset too but exposes only the high watermark: an open
/// transaction's records count as lag until it ends.
pub fn cached_lag<C: ConsumerContext>(
    consumer: &rdkafka::consumer::BaseConsumer<C>,
    topic: &str,
    partition: i32,
    start: Option<i64>,
) -> Option<i64> {
    use rdkafka::bindings as ffi;
    use rdkafka::consumer::Consumer;
    let name = std::ffi::CString::new(topic).ok()?;
    let rk = consumer.client().native_ptr();
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: `rk` is the consumer's live handle, `name` a NUL-terminated string that
    // outlives the call, and the out-pointers point at locals; librdkafka only reads its
    // cached offsets under the partition's lock.
    let err = unsafe { ffi::rd_kafka_get_watermark_offsets(rk, name.as_ptr(), partition, &mut low, &mut high) };
    if err != ffi::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || high < 0 {
        return None;
    }
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    // SAFETY: as above; `tpl` is a list this function owns, which librdkafka fills in.
    let err = unsafe { ffi::rd_kafka_position(rk, tpl.ptr()) };
    let position = if err == ffi::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        tpl.elements().first().and_then(|e| match e.offset() {
            rdkafka::Offset::Offset(o) => Some(o),
            _ => None,
        })
    } else {
        None
    };
    let next = position.or(start).unwrap_or(low.max(0));
    Some((high - next).max(0))
}

/// A long-lived client for questions about offsets (changelog bounds, ends, a group's
/// protocol): made at first use and kept, so that a question does not wait for a new
/// client's connections (up to 0.7 s on a busy machine), and made again after an error.
///
/// A long-lived client can be left with metadata it answers from without asking again:
/// through a rolling restart of the brokers one kept answering `UnknownPartition` for a
/// changelog partition for minutes while a fresh client found it at once. So
/// [`ask`](Self::ask) asks once more on a new client when the first answer is an error.
pub struct OffsetsClient {
    kafka: KafkaSettings,
    client_id: &'static str,
    group_id: &'static str,
    current: std::sync::Mutex<Option<std::sync::Arc<Authorized<rdkafka::consumer::BaseConsumer>>>>,
}

impl OffsetsClient {
    /// A client named `client_id` (its connections in the broker's logs and quotas) that
    /// reads committed offsets only (`read_committed`: an open transaction's records do
    /// not count), under a `group_id` it never joins.
    pub fn new(kafka: &KafkaSettings, client_id: &'static str, group_id: &'static str) -> OffsetsClient {
        OffsetsClient {
            kafka: kafka.clone(),
            client_id,
            group_id,
            current: Default::default(),
        }
    }

    /// The client, made now if there is none.
    pub fn get(&self) -> anyhow::Result<std::sync::Arc<Authorized<rdkafka::consumer::BaseConsumer>>> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        // One made before the client certificate was renewed is made again (its questions
        // in flight finish on it).
        if let Some(client) = current.as_ref().filter(|c| !self.kafka.renewed(c.made())) {
            return Ok(client.clone());
        }
        let client: Authorized<rdkafka::consumer::BaseConsumer> = self
            .kafka
            .client()
            .set("client.id", self.client_id)
            .set("group.id", self.group_id)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .authorized(&self.kafka)
            .map_err(|e| anyhow::anyhow!("creating the Kafka client {}: {e}", self.client_id))?;
        let client = std::sync::Arc::new(client);
        *current = Some(client.clone());
        Ok(client)
    }

    /// Drops `client` (it gave a wrong answer): the next question makes a new one. A
    /// client that another caller replaced already is left as it is.
    pub fn renew(&self, client: &std::sync::Arc<Authorized<rdkafka::consumer::BaseConsumer>>) {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.as_ref().is_some_and(|c| std::sync::Arc::ptr_eq(c, client)) {
            *current = None;
        }
    }

    /// `question` on the client; after an error, once more on a new client, whose error,
    /// if any, is the answer.
    pub fn ask<T, E: std::fmt::Display>(
        &self,
        question: impl Fn(&rdkafka::consumer::BaseConsumer) -> Result<T, E>,
    ) -> Result<T, String> {
        let client = self.get().map_err(|e| format!("{e:#}"))?;
        match question(&client) {
            Ok(answer) => Ok(answer),
            Err(first) => {
                self.renew(&client);
                tracing::debug!(client = self.client_id, "{first}; asking again on a new client");
                let fresh = self.get().map_err(|e| format!("{e:#}"))?;
                question(&fresh).map_err(|e| e.to_string())
            }
        }
    }

    /// Makes the client and connects it, in the background: what a worker does when it
    /// starts, so that its first question does not wait for it either.
    pub fn connect(self: &std::sync::Arc<Self>) {
        let this = self.clone();
        let _ = std::thread::Builder::new()
            .name("offsets-client".into())
            .spawn(move || {
                use rdkafka::consumer::Consumer;
                if let Ok(client) = this.get() {
                    let _ = client.fetch_metadata(None, std::time::Duration::from_secs(10));
                }
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn security_properties_are_read_and_wrong_ones_named() {
        let plain = KafkaSettings::new("b:9092");
        assert_eq!(plain.security(), &Security::default());
        let s = KafkaSettings::new("b:9093")
            .with([
                ("security.protocol", "sasl_ssl"),
                ("sasl.mechanism", "SCRAM-SHA-256"),
                ("sasl.username", "u"),
                ("sasl.password", "p"),
                ("ssl.ca.location", "/ca.pem"),
            ])
            .unwrap();
        let sasl = s.security().sasl.as_ref().unwrap();
        assert_eq!((sasl.mechanism, sasl.username.as_str()), (Mechanism::ScramSha256, "u"));
        let tls = s.security().tls.as_ref().unwrap();
        assert!(tls.verify_hostname && tls.ca.is_some() && tls.client.is_none());
        assert!(!format!("{s:?}").contains("password"), "no password in Debug: {s:?}");
        assert_eq!(s.client().get("sasl.password"), Some("p"));

        let err = |props: &[(&str, &str)]| KafkaSettings::new("b").with(props.iter().copied()).unwrap_err();
        assert!(err(&[("sasl.jaas.config", "x")]).contains("kafka.sasl.jaas.config"));
        assert!(err(&[("security.protocol", "TLS")]).contains("one of PLAINTEXT"));
        assert!(err(&[("security.protocol", "SASL_SSL")]).contains("needs kafka.sasl.username"));
        assert!(err(&[
            ("security.protocol", "SASL_PLAINTEXT"),
            ("sasl.mechanism", "GSSAPI"),
            ("sasl.username", "u"),
            ("sasl.password", "p")
        ])
        .contains("GSSAPI"));
        assert!(err(&[("security.protocol", "SSL"), ("ssl.key.location", "k")]).contains("go together"));
    }
}
