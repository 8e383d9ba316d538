//! One TCP connection to a broker speaking Kafka's request/response framing, with the
//! messages encoded by the `kafka-protocol` crate.

use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, ApiKey, FindCoordinatorRequest, FindCoordinatorResponse,
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
    MetadataRequest, MetadataResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
    OffsetFetchResponse, RequestHeader, ResponseHeader, SyncGroupRequest, SyncGroupResponse, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A connection or protocol failure talking to a broker (the external system's side).
#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("cannot connect to broker {addr}: {detail}")]
    Connect { addr: String, detail: String },
    #[error("broker {addr}: {detail}")]
    Io { addr: String, detail: String },
    #[error("broker {addr} answered something that does not decode: {detail}")]
    Protocol { addr: String, detail: String },
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
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
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
    MetadataRequest => MetadataResponse, Metadata;
    AlterClientQuotasRequest => AlterClientQuotasResponse, AlterClientQuotas;
    OffsetCommitRequest => OffsetCommitResponse, OffsetCommit;
    OffsetFetchRequest => OffsetFetchResponse, OffsetFetch;
}

pub struct Connection {
    stream: TcpStream,
    addr: String,
    correlation: i32,
    client_id: StrBytes,
}

/// Longest a single request may take (JoinGroup waits up to the rebalance timeout).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

impl Connection {
    pub async fn connect(addr: &str) -> Result<Connection, ConnectionError> {
        let fail = |detail: String| ConnectionError::Connect {
            addr: addr.to_string(),
            detail,
        };
        let stream = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(addr))
            .await
            .map_err(|_| fail("timed out after 10s".into()))?
            .map_err(|e| fail(e.to_string()))?;
        stream.set_nodelay(true).ok();
        Ok(Connection {
            stream,
            addr: addr.to_string(),
            correlation: 0,
            client_id: StrBytes::from_static_str("sluice-worker"),
        })
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

        let io = |e: std::io::Error| ConnectionError::Io {
            addr: self.addr.clone(),
            detail: e.to_string(),
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
            let mut c = Connection::connect(addr).await?;
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
