//! One connection to a broker speaking Kafka's request/response framing, with the messages
//! encoded by the `kafka-protocol` crate: over TLS (rustls) and authenticated with SASL
//! (SaslHandshake and SaslAuthenticate, the mechanisms by the `rsasl` crate) as the
//! [`KafkaSettings`] say, like every other client of the worker.
//!
//! A connection that cannot be secured fails within [`CONNECT_TIMEOUT`] with an error
//! naming the broker and what failed (the TLS handshake, the mechanism, the credentials),
//! never a hang.
//!
//! OAUTHBEARER sends the process's current token (RFC 7628's client response, three fields:
//! what Kafka's own clients send; rsasl's mechanism would take a callback for the same
//! string). A broker that limits sessions (KIP-368: `connections.max.reauth.ms`, or a token
//! that expires) says how long in its SaslAuthenticate answer; the connection
//! authenticates again on the same socket, with the credentials or token of that moment,
//! before the next request once 85% of that time has passed, so the broker never closes it.

use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, ApiKey, CreateAclsRequest, CreateAclsResponse,
    DescribeGroupsRequest, DescribeGroupsResponse, FindCoordinatorRequest, FindCoordinatorResponse, HeartbeatRequest,
    HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, MetadataRequest,
    MetadataResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    RequestHeader, ResponseHeader, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse, SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::kafka::{KafkaSettings, Sasl, Tls};

/// How long connecting, the TLS handshake and SASL authentication may take together.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection or protocol failure talking to a broker (the external system's side).
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("cannot connect to broker {addr}: {detail}")]
    Connect { addr: String, detail: String },
    #[error("broker {addr}: {detail}")]
    Io { addr: String, detail: String },
    #[error("broker {addr} answered something that does not decode: {detail}")]
    Protocol { addr: String, detail: String },
    /// TLS with the broker failed (its certificate, our CA, the host name, …).
    #[error("broker {addr}: TLS failed: {detail}")]
    Tls { addr: String, detail: String },
    /// The broker refused our SASL authentication (mechanism, credentials).
    #[error("broker {addr}: SASL {mechanism} authentication as {user:?} failed: {detail}")]
    Sasl {
        addr: String,
        mechanism: &'static str,
        user: String,
        detail: String,
    },
}

/// The FindCoordinator version both group clients (membership, offsets) speak.
pub const FIND_COORDINATOR_VERSION: i16 = 3;

/// Kafka error codes the group clients act on.
pub mod code {
    pub const NONE: i16 = 0;
    pub const REQUEST_TIMED_OUT: i16 = 7;
    pub const COORDINATOR_LOAD_IN_PROGRESS: i16 = 14;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const NOT_COORDINATOR: i16 = 16;
    pub const ILLEGAL_GENERATION: i16 = 22;
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const GROUP_AUTHORIZATION_FAILED: i16 = 30;
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    pub const MEMBER_ID_REQUIRED: i16 = 79;
    pub const FENCED_INSTANCE_ID: i16 = 82;
    pub const UNSTABLE_OFFSET_COMMIT: i16 = 88;
}

/// A Kafka error code, named.
pub fn describe(code: i16) -> String {
    match kafka_protocol::ResponseError::try_from_code(code) {
        Some(e) => format!("{e:?} ({code})"),
        None => format!("error code {code}"),
    }
}

/// A request this client sends, with its API key and response type. (kafka-protocol ties
/// these together only when built with its `broker` feature, which we do not need.)
pub trait Call: Encodable + HeaderVersion {
    const KEY: ApiKey;
    type Response: Decodable + HeaderVersion;
}

macro_rules! calls {
    ($($request:ty => $response:ty, $key:ident;)*) => {$(
        impl Call for $request {
            const KEY: ApiKey = ApiKey::$key;
            type Response = $response;
        }
    )*};
}

calls! {
    FindCoordinatorRequest => FindCoordinatorResponse, FindCoordinator;
    JoinGroupRequest => JoinGroupResponse, JoinGroup;
    SyncGroupRequest => SyncGroupResponse, SyncGroup;
    HeartbeatRequest => HeartbeatResponse, Heartbeat;
    LeaveGroupRequest => LeaveGroupResponse, LeaveGroup;
    DescribeGroupsRequest => DescribeGroupsResponse, DescribeGroups;
    MetadataRequest => MetadataResponse, Metadata;
    AlterClientQuotasRequest => AlterClientQuotasResponse, AlterClientQuotas;
    OffsetCommitRequest => OffsetCommitResponse, OffsetCommit;
    OffsetFetchRequest => OffsetFetchResponse, OffsetFetch;
    SaslHandshakeRequest => SaslHandshakeResponse, SaslHandshake;
    CreateAclsRequest => CreateAclsResponse, CreateAcls;
    SaslAuthenticateRequest => SaslAuthenticateResponse, SaslAuthenticate;
}

/// A byte stream to a broker: plain TCP, or TLS over it.
trait Stream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Stream for T {}

pub struct Connection {
    stream: Box<dyn Stream>,
    addr: String,
    correlation: i32,
    client_id: StrBytes,
    /// What it authenticated with (again when the session runs out), if SASL.
    kafka: Option<KafkaSettings>,
    /// When to authenticate again (the broker limits the session).
    reauthenticate_at: Option<std::time::Instant>,
    /// Times it authenticated again.
    reauthentications: u64,
    /// The client certificate it showed in the TLS handshake, if any (to say so when the
    /// broker refuses it).
    client_certificate: Option<std::path::PathBuf>,
}

/// Longest a single request may take (JoinGroup waits up to the rebalance timeout).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

impl Connection {
    /// Connects to the broker at `addr`, secured (TLS, SASL) as `kafka` says.
    pub async fn connect(kafka: &KafkaSettings, addr: &str) -> Result<Connection, ConnectionError> {
        let fail = |detail: String| ConnectionError::Connect {
            addr: addr.to_string(),
            detail,
        };
        let connecting = async {
            let tcp = TcpStream::connect(addr).await.map_err(|e| fail(e.to_string()))?;
            tcp.set_nodelay(true).ok();
            let security = kafka.security();
            let stream: Box<dyn Stream> = match &security.tls {
                Some(tls) => Box::new(tls_handshake(tls, kafka.certificate_generation(), addr, tcp).await?),
                None => Box::new(tcp),
            };
            let mut connection = Connection {
                stream,
                addr: addr.to_string(),
                correlation: 0,
                client_id: StrBytes::from_static_str("sluice-worker"),
                kafka: security.sasl.is_some().then(|| kafka.clone()),
                reauthenticate_at: None,
                reauthentications: 0,
                client_certificate: security
                    .tls
                    .as_ref()
                    .and_then(|t| t.client.as_ref())
                    .map(|(c, _)| c.clone()),
            };
            if let Some(sasl) = &security.sasl {
                connection.authenticate(sasl, kafka).await?;
            } else if security.tls.is_some() {
                connection.confirm_tls().await?;
            }
            Ok(connection)
        };
        tokio::time::timeout(CONNECT_TIMEOUT, connecting)
            .await
            .map_err(|_| fail(format!("no connection (TLS, SASL included) within {CONNECT_TIMEOUT:?}")))?
    }

    /// Asks the broker for nothing (Metadata of no topics) to learn whether it took the TLS
    /// handshake: under TLS 1.3 the client's side of the handshake is over before the broker
    /// has checked the client's certificate, and a broker that refuses it (none given, another
    /// CA, expired) says so with an alert on the first request. Without this, a connection
    /// with a refused certificate looked made, and the first request failed later as I/O.
    /// (With SASL, SaslHandshake is that first request.)
    async fn confirm_tls(&mut self) -> Result<(), ConnectionError> {
        let request = MetadataRequest::default()
            .with_topics(Some(Vec::new()))
            .with_allow_auto_topic_creation(false);
        self.exchange(&request, 12, CONNECT_TIMEOUT).await.map(|_| ())
    }

    /// Authenticates again (the session's time is nearly up), with the credentials or the
    /// token of now.
    async fn reauthenticate_if_due(&mut self) -> Result<(), ConnectionError> {
        let due = self.reauthenticate_at.is_some_and(|at| std::time::Instant::now() >= at);
        let Some(kafka) = self.kafka.clone().filter(|_| due) else {
            return Ok(());
        };
        let Some(sasl) = kafka.security().sasl.clone() else {
            return Ok(());
        };
        self.reauthenticate_at = None;
        tokio::time::timeout(CONNECT_TIMEOUT, self.authenticate(&sasl, &kafka))
            .await
            .map_err(|_| ConnectionError::Io {
                addr: self.addr.clone(),
                detail: format!("authenticating again took more than {CONNECT_TIMEOUT:?}"),
            })??;
        self.reauthentications += 1;
        tracing::debug!(broker = %self.addr, times = self.reauthentications, "authenticated again (KIP-368)");
        Ok(())
    }

    /// Times this connection authenticated again on its socket (KIP-368).
    pub fn reauthentications(&self) -> u64 {
        self.reauthentications
    }

    /// SaslHandshake, then SaslAuthenticate until the mechanism is done; remembers when the
    /// broker wants it done again.
    async fn authenticate(&mut self, sasl: &Sasl, kafka: &KafkaSettings) -> Result<(), ConnectionError> {
        use rsasl::prelude::{Mechname, SASLClient, SASLConfig, State};
        let mechanism = sasl.mechanism.name();
        let addr = self.addr.clone();
        let failed = |detail: String| ConnectionError::Sasl {
            addr: addr.clone(),
            mechanism,
            user: sasl.username.clone(),
            detail,
        };
        let handshake = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(mechanism));
        let answer = self.exchange(&handshake, 1, CONNECT_TIMEOUT).await?;
        if answer.error_code != code::NONE {
            let offered: Vec<String> = answer.mechanisms.iter().map(|m| m.to_string()).collect();
            return Err(failed(format!(
                "the broker does not take it ({}; it takes {})",
                describe(answer.error_code),
                offered.join(", ")
            )));
        }
        if sasl.mechanism == crate::kafka::Mechanism::OAuthBearer {
            let Some(token) = kafka.token() else {
                return Err(failed(
                    "OAUTHBEARER without a token source (start_tokens was not called)".into(),
                ));
            };
            // RFC 7628 3.1: the GS2 header, then `auth=Bearer TOKEN`, fields ended by 0x01.
            let first = format!("n,,\x01auth=Bearer {}\x01\x01", token.value);
            let request = SaslAuthenticateRequest::default().with_auth_bytes(bytes::Bytes::from(first));
            let answer = self.exchange(&request, 2, CONNECT_TIMEOUT).await?;
            if answer.error_code != code::NONE {
                let message = answer.error_message.map(|m| m.to_string()).unwrap_or_default();
                return Err(failed(format!("{message} ({})", describe(answer.error_code))));
            }
            if !answer.auth_bytes.is_empty() {
                // The server's error, as a challenge (a JSON status); the client ends the
                // exchange with 0x01 and the broker then fails it.
                let status =
                    String::from_utf8_lossy(&answer.auth_bytes[..answer.auth_bytes.len().min(300)]).to_string();
                let end = SaslAuthenticateRequest::default().with_auth_bytes(bytes::Bytes::from_static(b"\x01"));
                let _ = self.exchange(&end, 2, CONNECT_TIMEOUT).await;
                return Err(failed(format!("the broker refused the token: {status}")));
            }
            self.session(answer.session_lifetime_ms);
            return Ok(());
        }
        let config = SASLConfig::with_credentials(None, sasl.username.clone(), sasl.password.clone())
            .map_err(|e| failed(e.to_string()))?;
        let name = Mechname::parse(mechanism.as_bytes()).map_err(|e| failed(e.to_string()))?;
        let mut session = SASLClient::new(config)
            .start_suggested(&[name])
            .map_err(|e| failed(e.to_string()))?;
        let mut input: Option<Vec<u8>> = None;
        // A mechanism takes a few rounds (SCRAM two); a broker that asks for more is not one.
        for _ in 0..8 {
            let mut out = Vec::new();
            let state = session
                .step(input.as_deref(), &mut out)
                .map_err(|e| failed(format!("the mechanism failed: {e}")))?;
            let finished = matches!(state, State::Finished(_));
            let sent = match state {
                State::Running => true,
                State::Finished(sent) => sent == rsasl::prelude::MessageSent::Yes,
            };
            if !sent {
                return Ok(());
            }
            let request = SaslAuthenticateRequest::default().with_auth_bytes(bytes::Bytes::from(out));
            let answer = self.exchange(&request, 2, CONNECT_TIMEOUT).await?;
            if answer.error_code != code::NONE {
                let message = answer.error_message.map(|m| m.to_string()).unwrap_or_default();
                return Err(failed(format!("{message} ({})", describe(answer.error_code))));
            }
            if finished {
                self.session(answer.session_lifetime_ms);
                return Ok(());
            }
            input = Some(answer.auth_bytes.to_vec());
        }
        Err(failed("the broker asked for more rounds than the mechanism has".into()))
    }

    /// The broker's limit on this session (KIP-368; 0: none): authenticate again at 85%.
    fn session(&mut self, lifetime_ms: i64) {
        self.reauthenticate_at = (lifetime_ms > 0)
            .then(|| std::time::Instant::now() + Duration::from_millis(lifetime_ms as u64).mul_f64(0.85));
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sends `request` in API `version` and waits for its response.
    pub async fn send<R: Call>(&mut self, request: &R, version: i16) -> Result<R::Response, ConnectionError> {
        self.send_within(request, version, REQUEST_TIMEOUT).await
    }

    /// As [`send`](Self::send), with a deadline of its own (heartbeats must fail fast).
    pub async fn send_within<R: Call>(
        &mut self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response, ConnectionError> {
        self.reauthenticate_if_due().await?;
        self.exchange(request, version, timeout).await
    }

    /// One request and its response, as they are.
    async fn exchange<R: Call>(
        &mut self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> Result<R::Response, ConnectionError> {
        self.correlation = self.correlation.wrapping_add(1);
        let protocol = |e: anyhow::Error| ConnectionError::Protocol {
            addr: self.addr.clone(),
            detail: format!("{e:#}"),
        };
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(self.client_id.clone()));
        let mut body = BytesMut::new();
        header.encode(&mut body, R::header_version(version)).map_err(protocol)?;
        request.encode(&mut body, version).map_err(protocol)?;
        let mut frame = BytesMut::with_capacity(body.len() + 4);
        frame.put_i32(body.len() as i32);
        frame.extend_from_slice(&body);

        let io = |e: std::io::Error| {
            tls_failure(&self.addr, self.client_certificate.as_deref(), &e).unwrap_or_else(|| ConnectionError::Io {
                addr: self.addr.clone(),
                detail: e.to_string(),
            })
        };
        let exchange = async {
            self.stream.write_all(&frame).await.map_err(io)?;
            let size = self.stream.read_i32().await.map_err(io)?;
            if !(0..=100 << 20).contains(&size) {
                return Err(ConnectionError::Protocol {
                    addr: self.addr.clone(),
                    detail: format!("a response of {size} bytes"),
                });
            }
            let mut response = vec![0u8; size as usize];
            self.stream.read_exact(&mut response).await.map_err(io)?;
            Ok(response)
        };
        let response = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| ConnectionError::Io {
                addr: self.addr.clone(),
                detail: format!("no response within {timeout:?}"),
            })??;
        let mut buf = bytes::Bytes::from(response);
        let header = ResponseHeader::decode(&mut buf, R::Response::header_version(version)).map_err(protocol)?;
        if header.correlation_id != self.correlation {
            return Err(ConnectionError::Protocol {
                addr: self.addr.clone(),
                detail: format!(
                    "correlation id {} for request {}",
                    header.correlation_id, self.correlation
                ),
            });
        }
        let decoded = R::Response::decode(&mut buf, version).map_err(protocol)?;
        if buf.has_remaining() {
            tracing::debug!(broker = %self.addr, extra = buf.remaining(), "response has trailing bytes");
        }
        Ok(decoded)
    }
}

/// The ids of `topics` (a topic deleted and created again gets a new id), from the first
/// bootstrap broker that answers. Topics the cluster does not know are left out.
pub async fn topic_ids(
    kafka: &crate::kafka::KafkaSettings,
    topics: &[String],
) -> Result<std::collections::HashMap<String, String>, ConnectionError> {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    let request = MetadataRequest::default()
        .with_topics(Some(
            topics
                .iter()
                .map(|t| MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(t.clone())))))
                .collect(),
        ))
        .with_allow_auto_topic_creation(false);
    let mut last = None;
    for addr in kafka.bootstrap_addrs() {
        let answer = async {
            let mut c = Connection::connect(kafka, addr).await?;
            c.send_within(&request, 12, Duration::from_secs(15)).await
        }
        .await;
        match answer {
            Ok(response) => {
                return Ok(response
                    .topics
                    .into_iter()
                    .filter(|t| t.error_code == 0)
                    .filter_map(|t| Some((t.name?.0.to_string(), t.topic_id.to_string())))
                    .collect())
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or(ConnectionError::Connect {
        addr: kafka.bootstrap().to_string(),
        detail: "no bootstrap address".into(),
    }))
}

/// TLS over `tcp` to the broker at `addr` (`host:port`): its certificate checked against the
/// CA, and its host name unless the settings say not to.
async fn tls_handshake(
    tls: &Tls,
    certificate: u64,
    addr: &str,
    tcp: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ConnectionError> {
    let fail = |detail: String| ConnectionError::Tls {
        addr: addr.to_string(),
        detail,
    };
    let config = tls_config(tls, certificate).map_err(|e| fail(format!("{e:#}")))?;
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_matches(['[', ']']);
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| fail(format!("{host} is not a host name TLS can check: {e}")))?;
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| fail(e.to_string()))
}

/// A TLS failure after the handshake as [`ConnectionError::Tls`], none for any other I/O
/// error. Under TLS 1.3 a broker checks the client's certificate after the client's side of
/// the handshake is over, and refuses it with an alert on the first request:
/// `bad_certificate` or `certificate_required` when none was shown, `certificate_unknown`,
/// `unknown_ca`, `certificate_expired` (…) for one it does not take.
fn tls_failure(
    addr: &str,
    client_certificate: Option<&std::path::Path>,
    e: &std::io::Error,
) -> Option<ConnectionError> {
    use rustls::AlertDescription as A;
    let tls = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    let detail = match (tls, client_certificate) {
        (rustls::Error::AlertReceived(alert @ (A::BadCertificate | A::CertificateRequired)), None) => format!(
            "the broker ended TLS with the alert {alert:?}: it asks for a client certificate and none is set \
             (kafka.ssl.certificate.location, kafka.ssl.key.location)"
        ),
        (
            rustls::Error::AlertReceived(
                alert @ (A::BadCertificate
                | A::CertificateRequired
                | A::CertificateUnknown
                | A::UnknownCA
                | A::CertificateExpired
                | A::CertificateRevoked
                | A::UnsupportedCertificate
                | A::AccessDenied),
            ),
            Some(cert),
        ) => format!(
            "the broker ended TLS with the alert {alert:?}: it does not take the client certificate {} (not \
             signed by a CA it trusts, expired, or not for client authentication)",
            cert.display()
        ),
        (rustls::Error::AlertReceived(alert), _) => format!("the broker ended TLS with the alert {alert:?}"),
        (other, _) => other.to_string(),
    };
    Some(ConnectionError::Tls {
        addr: addr.to_string(),
        detail,
    })
}

/// The client TLS configuration of `tls`, made once per setting (connections are many) and
/// client certificate generation ([`KafkaSettings::certificate_generation`]: one renewed on
/// disk is shown from the next connection on).
fn tls_config(tls: &Tls, certificate: u64) -> anyhow::Result<std::sync::Arc<rustls::ClientConfig>> {
    use std::sync::{Arc, Mutex, OnceLock};
    type Made = Vec<(Tls, u64, Arc<rustls::ClientConfig>)>;
    static MADE: OnceLock<Mutex<Made>> = OnceLock::new();
    let made = MADE.get_or_init(Default::default);
    if let Some((_, _, config)) = made
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find(|(t, g, _)| t == tls && *g == certificate)
    {
        return Ok(config.clone());
    }
    let config = Arc::new(crate::tls::client_config(
        tls.ca.as_deref(),
        tls.client.as_ref(),
        tls.verify_hostname,
    )?);
    let mut made = made.lock().unwrap_or_else(|p| p.into_inner());
    // The generations before this one of the same setting are done with.
    made.retain(|(t, g, _)| t != tls || *g > certificate);
    made.push((tls.clone(), certificate, config.clone()));
    Ok(config)
}

/// Checks that the brokers can be reached as the settings say, before anything else of a
/// worker starts: a wrong password, mechanism or CA fails within seconds, naming the broker
/// and what failed, instead of every client retrying in silence. A broker that is not up
/// yet (refused, timed out) is waited for, up to `patience`.
pub async fn check_brokers(kafka: &KafkaSettings, patience: Duration) -> Result<(), ConnectionError> {
    let deadline = std::time::Instant::now() + patience;
    let mut said = false;
    loop {
        let mut last = None;
        for addr in kafka.bootstrap_addrs() {
            match Connection::connect(kafka, addr).await {
                Ok(_) => return Ok(()),
                // Refused credentials or certificates do not get better by waiting.
                Err(e @ (ConnectionError::Tls { .. } | ConnectionError::Sasl { .. })) => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        let last = last.unwrap_or(ConnectionError::Connect {
            addr: kafka.bootstrap().to_string(),
            detail: "no bootstrap address".into(),
        });
        if std::time::Instant::now() >= deadline {
            return Err(last);
        }
        if !said {
            tracing::info!("no broker answers yet ({last}); trying again for up to {patience:?}");
            said = true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
