//! Membership of the worker group through Kafka's group coordinator, with a protocol type of
//! our own (as Kafka Connect does): FindCoordinator, JoinGroup, SyncGroup, Heartbeat and
//! LeaveGroup. The leader runs the assignor on every member's metadata.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::find_coordinator_request::FindCoordinatorRequest;
use kafka_protocol::messages::heartbeat_request::HeartbeatRequest;
use kafka_protocol::messages::join_group_request::{JoinGroupRequest, JoinGroupRequestProtocol};
use kafka_protocol::messages::join_group_response::JoinGroupResponse;
use kafka_protocol::messages::leave_group_request::{LeaveGroupRequest, MemberIdentity};
use kafka_protocol::messages::sync_group_request::SyncGroupRequest;
use kafka_protocol::messages::GroupId;
use kafka_protocol::protocol::StrBytes;

use super::connection::{Connection, ConnectionError};
use super::framing::{unframe_assignment, Framing};
use super::metadata::{Assignment, Binding, MemberMetadata, CURRENT_VERSION};

#[path = "membership_leader.rs"]
mod leader;

/// The protocol (assignment strategy) a member advertises: its assignor's, so the
/// coordinator refuses a member whose assignor differs from the group's (an eager leader
/// and a sticky follower would otherwise run a task on two workers at once).
pub fn protocol_name(assignor: &str) -> String {
    format!("sluice-{assignor}")
}

use super::connection::FIND_COORDINATOR_VERSION;
const JOIN_GROUP_VERSION: i16 = 7;
const SYNC_GROUP_VERSION: i16 = 5;
const HEARTBEAT_VERSION: i16 = 4;
const LEAVE_GROUP_VERSION: i16 = 4;

use super::connection::{code, describe};

/// Why membership failed; transient coordinator trouble is retried inside.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error(transparent)]
    Connection(#[from] ConnectionError),
    #[error("group {group}: the coordinator refused {call}: {reason}")]
    Refused {
        group: String,
        call: &'static str,
        reason: String,
    },
    #[error("group {group}: another worker uses group.instance.id {instance}; this one is fenced and must stop")]
    Fenced { group: String, instance: String },
    #[error("group {group}: the assignment of leader {leader} does not decode: {detail}")]
    BadAssignment {
        group: String,
        detail: String,
        /// The leader's member id.
        leader: String,
    },
    /// The coordinator refused the join: the group's members advertise another protocol
    /// (another assignor).
    #[error("group {group}: its members run another assignor than this worker's {ours:?} (the coordinator answered {reason})")]
    OtherProtocol {
        group: String,
        ours: String,
        reason: String,
    },
    /// The coordinator no longer knows this member (its session expired, or a newer
    /// generation moved on without it): its tasks may belong to others already.
    #[error("group {group}: the coordinator no longer knows this member ({call}: {reason})")]
    Lost {
        group: String,
        call: &'static str,
        reason: String,
    },
}

/// Settings of one membership.
#[derive(Debug, Clone)]
pub struct MembershipConfig {
    pub kafka: crate::kafka::KafkaSettings,
    pub group: String,
    /// The assignor this member runs when it leads (its protocol name, see [`protocol_name`]).
    pub assignor: String,
    /// Signs this member's metadata and its assignments as leader; checks theirs.
    pub secret: Option<crate::secret::ClusterSecret>,
    /// Static membership: a restart within the session timeout keeps the member's place.
    pub instance_id: Option<String>,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
}

/// What a heartbeat learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heartbeat {
    Alive,
    /// The coordinator could not be reached this time (the session may still be alive).
    Unreachable,
    /// A rebalance started: rejoin (keep processing tasks meanwhile).
    RejoinNeeded,
    /// The coordinator no longer knows this member: stop active tasks, then rejoin.
    Lost,
}

/// The result of a completed join.
#[derive(Debug, Clone)]
pub struct Joined {
    pub generation: i32,
    pub member_id: String,
    pub leader: bool,
    pub assignment: Assignment,
    /// As leader: how many members' metadata it could not read (they got no tasks).
    pub unread: usize,
    /// When the JoinGroup that completed was sent: the coordinator's session timer for this
    /// member restarted no earlier than that.
    pub alive_at: Instant,
}

/// One worker's membership in the group.
pub struct Membership {
    pub(super) config: MembershipConfig,
    coordinator: Option<Connection>,
    member_id: String,
    generation: i32,
    /// Kafka's consumer protocol, or the older framing while the group still has members
    /// that joined with it (see `framing.rs`).
    framing: Framing,
    /// A connection to the coordinator was made (so the credentials were good once).
    authenticated_once: bool,
}

impl Membership {
    pub fn new(config: MembershipConfig) -> Membership {
        Membership {
            config,
            coordinator: None,
            member_id: String::new(),
            generation: -1,
            framing: Framing::Consumer,
            authenticated_once: false,
        }
    }

    /// Whether a SASL refusal is worth waiting out: an OAUTHBEARER token refused after the
    /// process's tokens were taken before. Its provider may be down past the token's expiry,
    /// or have rotated the key that signed it; the token source fetches a new one on its own
    /// schedule or at once when asked (see `oidc::token`), and the member gets it with its next
    /// connection. At
    /// start, and for passwords, a refusal stays an error: waiting would not change it.
    fn waits_out(&self, e: &ConnectionError) -> bool {
        let wait = self.authenticated_once
            && matches!(e, ConnectionError::Sasl { mechanism, .. } if *mechanism == crate::kafka::Mechanism::OAuthBearer.name());
        if wait {
            // Ask for a new token now (the source spaces such fetches out).
            self.config.kafka.token_refused();
        }
        wait
    }

    /// A member that frames its metadata as `framing` says from its first join: with
    /// [`Framing::Legacy`], as workers of earlier versions did (the tests of rolling
    /// upgrades use it).
    pub fn with_framing(config: MembershipConfig, framing: Framing) -> Membership {
        Membership {
            framing,
            ..Membership::new(config)
        }
    }

    /// How this member frames its metadata: [`Framing::Legacy`] once it joined a group
    /// whose members use the earlier protocol type.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    pub fn member_id(&self) -> &str {
        &self.member_id
    }

    pub fn generation(&self) -> i32 {
        self.generation
    }

    /// Frames metadata as Kafka's consumer protocol again (after the members of another
    /// protocol type that made this member fall back were removed from the group).
    pub fn reset_framing(&mut self) {
        self.framing = Framing::Consumer;
    }

    /// Forgets the member id and generation: the next join is a new member's (after this
    /// one was fenced or removed).
    pub fn forget(&mut self) {
        self.member_id.clear();
        self.generation = -1;
    }

    /// A second line to the coordinator that heartbeats for this member while a JoinGroup
    /// of it waits (a rebalance can wait for a slow or dead member up to the rebalance
    /// timeout). None before the member's first join.
    pub fn probe(&self) -> Option<HeartbeatProbe> {
        if self.member_id.is_empty() || self.generation < 0 {
            return None;
        }
        Some(HeartbeatProbe {
            kafka: self.config.kafka.clone(),
            addr: self.coordinator.as_ref()?.addr().to_string(),
            connection: None,
            request: HeartbeatRequest::default()
                .with_group_id(self.group_id())
                .with_generation_id(self.generation)
                .with_member_id(StrBytes::from_string(self.member_id.clone()))
                .with_group_instance_id(self.instance()),
        })
    }

    pub(super) fn group_id(&self) -> GroupId {
        GroupId(StrBytes::from_string(self.config.group.clone()))
    }

    fn instance(&self) -> Option<StrBytes> {
        self.config.instance_id.clone().map(StrBytes::from_string)
    }

    /// Finds the coordinator through any bootstrap broker and connects to it. Brokers that
    /// are away or a coordinator that moves are weather: this retries with backoff until it
    /// succeeds (callers bound it with their own deadlines or shutdown).
    /// The coordinator's connection, found (again) through the bootstrap brokers. Failures
    /// that retrying cannot cure end the search: the broker refuses this principal the
    /// group (GROUP_AUTHORIZATION_FAILED) or refuses its SASL credentials.
    pub(super) async fn coordinator(&mut self) -> Result<&mut Connection, MembershipError> {
        let mut backoff = Duration::from_millis(100);
        let mut failures = 0u32;
        while self.coordinator.is_none() {
            let mut last = None;
            for addr in self.config.kafka.bootstrap_addrs() {
                let found = async {
                    let mut c = Connection::connect(&self.config.kafka, addr).await?;
                    let request = FindCoordinatorRequest::default()
                        .with_key(StrBytes::from_string(self.config.group.clone()))
                        .with_key_type(0);
                    c.send_within(&request, FIND_COORDINATOR_VERSION, Duration::from_secs(10))
                        .await
                }
                .await;
                match found {
                    Ok(r) if r.error_code == code::NONE => {
                        let addr = format!("{}:{}", r.host, r.port);
                        match Connection::connect(&self.config.kafka, &addr).await {
                            Ok(c) => {
                                self.authenticated_once = true;
                                if failures > 0 {
                                    tracing::info!(group = %self.config.group, coordinator = %addr, "found the group coordinator again");
                                }
                                self.coordinator = Some(c);
                                break;
                            }
                            Err(e @ ConnectionError::Sasl { .. }) if !self.waits_out(&e) => return Err(e.into()),
                            Err(e) => last = Some(e.to_string()),
                        }
                    }
                    Ok(r) if r.error_code == code::GROUP_AUTHORIZATION_FAILED => {
                        return Err(self.refused("FindCoordinator", r.error_code))
                    }
                    Ok(r) => last = Some(format!("FindCoordinator: {}", describe(r.error_code))),
                    Err(e @ ConnectionError::Sasl { .. }) if !self.waits_out(&e) => return Err(e.into()),
                    Err(e) => last = Some(e.to_string()),
                }
            }
            if self.coordinator.is_none() {
                failures += 1;
                tracing::warn!(
                    group = %self.config.group,
                    "cannot reach the group coordinator ({}); retrying in {backoff:?}",
                    last.unwrap_or_else(|| "no bootstrap address".into())
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
        Ok(self.coordinator.as_mut().expect("connected"))
    }

    /// Forgets the coordinator connection (it failed or the coordinator moved).
    pub(super) fn reconnect(&mut self) {
        self.coordinator = None;
    }

    /// Joins (or rejoins) the group and returns this member's assignment. When this member
    /// is elected leader, `assign` computes everyone's assignment from their metadata.
    pub async fn join(
        &mut self,
        metadata: &MemberMetadata,
        assign: impl Fn(&BTreeMap<String, MemberMetadata>) -> BTreeMap<String, Assignment>,
    ) -> Result<Joined, MembershipError> {
        let protocol = StrBytes::from_string(protocol_name(&self.config.assignor));
        let mut backoff = Duration::from_millis(50);
        loop {
            let request = self.join_request(metadata, &protocol);
            let join_sent = Instant::now();
            tracing::debug!(target: "handover", generation = self.generation, "JoinGroup sent");
            let response = match self.coordinator().await?.send(&request, JOIN_GROUP_VERSION).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(group = %self.config.group, "JoinGroup: {e}; finding the coordinator again");
                    self.reconnect();
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            if response.error_code != code::NONE {
                self.join_again(&response, &mut backoff).await?;
                continue;
            }
            self.member_id = response.member_id.to_string();
            self.generation = response.generation_id;
            let leader = response.leader == response.member_id;
            let leader_id = response.leader.to_string();
            tracing::debug!(
                target: "handover", generation = self.generation, leader,
                ms = join_sent.elapsed().as_millis() as u64, "JoinGroup answered"
            );
            let sync_sent = Instant::now();
            let (assignments, unread) = if leader {
                self.leader_assignments(&response.members, &assign)
            } else {
                (Vec::new(), 0)
            };
            let sync = SyncGroupRequest::default()
                .with_group_id(self.group_id())
                .with_generation_id(self.generation)
                .with_member_id(StrBytes::from_string(self.member_id.clone()))
                .with_group_instance_id(self.instance())
                .with_protocol_type(Some(StrBytes::from_static_str(self.framing.protocol_type())))
                .with_protocol_name(Some(protocol.clone()))
                .with_assignments(assignments);
            let response = match self.coordinator().await?.send(&sync, SYNC_GROUP_VERSION).await {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(group = %self.config.group, "SyncGroup: {e}; rejoining");
                    self.reconnect();
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            };
            if response.error_code != code::NONE {
                self.sync_again(response.error_code)?;
                continue;
            }
            tracing::debug!(
                target: "handover", generation = self.generation,
                ms = sync_sent.elapsed().as_millis() as u64, "SyncGroup answered"
            );
            let assignment = self.decode_assignment(&response.assignment, &leader_id)?;
            return Ok(Joined {
                generation: self.generation,
                member_id: self.member_id.clone(),
                leader,
                assignment,
                unread,
                alive_at: join_sent,
            });
        }
    }

    /// This member's JoinGroup, its metadata signed anew each time: the member id (or
    /// generation) may have changed since the last.
    fn join_request(&self, metadata: &MemberMetadata, protocol: &StrBytes) -> JoinGroupRequest {
        let binding = Binding {
            group: &self.config.group,
            member: self.config.instance_id.as_deref().unwrap_or(&self.member_id),
            from_generation: self.generation,
        };
        let signed = metadata.encode_signed(
            metadata.version.min(CURRENT_VERSION),
            self.config.secret.as_ref(),
            &binding,
        );
        let encoded = Bytes::from(self.framing.metadata(signed));
        JoinGroupRequest::default()
            .with_group_id(self.group_id())
            .with_session_timeout_ms(self.config.session_timeout.as_millis() as i32)
            .with_rebalance_timeout_ms(self.config.rebalance_timeout.as_millis() as i32)
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_group_instance_id(self.instance())
            .with_protocol_type(StrBytes::from_static_str(self.framing.protocol_type()))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(protocol.clone())
                .with_metadata(encoded)])
    }

    /// A JoinGroup answered with an error: `Ok` when the join is to be sent again (after
    /// taking the member id handed out, backing off, finding the coordinator again or
    /// falling back to the older framing), the error when it ends the join.
    async fn join_again(
        &mut self,
        response: &JoinGroupResponse,
        backoff: &mut Duration,
    ) -> Result<(), MembershipError> {
        match response.error_code {
            code::MEMBER_ID_REQUIRED => {
                self.member_id = response.member_id.to_string();
                Ok(())
            }
            code::UNKNOWN_MEMBER_ID | code::ILLEGAL_GENERATION => {
                // Only a member that completed a join has something to lose; a new one
                // (its id just handed out) simply asks again.
                let was_member = self.generation >= 0;
                self.member_id.clear();
                self.generation = -1;
                if was_member {
                    return Err(self.lost("JoinGroup", response.error_code));
                }
                Ok(())
            }
            code::REBALANCE_IN_PROGRESS | code::COORDINATOR_LOAD_IN_PROGRESS => {
                tokio::time::sleep(*backoff).await;
                *backoff = (*backoff * 2).min(Duration::from_secs(2));
                Ok(())
            }
            code::NOT_COORDINATOR | code::COORDINATOR_NOT_AVAILABLE => {
                self.reconnect();
                tokio::time::sleep(*backoff).await;
                *backoff = (*backoff * 2).min(Duration::from_secs(2));
                Ok(())
            }
            code::FENCED_INSTANCE_ID => Err(self.fenced()),
            code::INCONSISTENT_GROUP_PROTOCOL if self.framing == Framing::Consumer => {
                // Either the group's members are workers of a version that joined with
                // the older protocol type (a rolling upgrade: join as they do), or they
                // run another assignor (then the older type is refused too).
                tracing::warn!(
                    group = %self.config.group,
                    "the coordinator refused protocol type {1:?}: joining as Sluice versions before 0.2 \
                     did ({0:?}), which a group of such workers takes (it refuses this worker again if \
                     its members run another assignor)",
                    Framing::Legacy.protocol_type(),
                    Framing::Consumer.protocol_type()
                );
                self.framing = Framing::Legacy;
                Ok(())
            }
            code::INCONSISTENT_GROUP_PROTOCOL => Err(MembershipError::OtherProtocol {
                group: self.config.group.clone(),
                ours: self.config.assignor.clone(),
                reason: describe(response.error_code),
            }),
            other => Err(self.refused("JoinGroup", other)),
        }
    }

    /// A SyncGroup answered with error `code`: `Ok` when the member is to join again, the
    /// error when it ends the join.
    fn sync_again(&mut self, code: i16) -> Result<(), MembershipError> {
        match code {
            code::REBALANCE_IN_PROGRESS => Ok(()),
            code::UNKNOWN_MEMBER_ID | code::ILLEGAL_GENERATION => {
                self.member_id.clear();
                self.generation = -1;
                Err(self.lost("SyncGroup", code))
            }
            code::NOT_COORDINATOR | code::COORDINATOR_NOT_AVAILABLE => {
                self.reconnect();
                Ok(())
            }
            code::FENCED_INSTANCE_ID => Err(self.fenced()),
            other => Err(self.refused("SyncGroup", other)),
        }
    }

    /// This member's assignment from the SyncGroup answer, its signature checked (one that
    /// does not decode names `leader_id`, the leader that made it).
    fn decode_assignment(&self, framed: &[u8], leader_id: &str) -> Result<Assignment, MembershipError> {
        unframe_assignment(framed)
            .and_then(|bytes| {
                Assignment::decode_signed(
                    &bytes,
                    self.config.secret.as_ref(),
                    &self.config.group,
                    &self.member_id,
                    self.generation,
                )
            })
            .map_err(|e| MembershipError::BadAssignment {
                group: self.config.group.clone(),
                detail: e.to_string(),
                leader: leader_id.to_string(),
            })
    }

    /// One heartbeat, answered within `timeout` or counted as unreachable; call it every
    /// few seconds (well inside the session timeout).
    pub async fn heartbeat(&mut self, timeout: Duration) -> Result<Heartbeat, MembershipError> {
        let request = HeartbeatRequest::default()
            .with_group_id(self.group_id())
            .with_generation_id(self.generation)
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_group_instance_id(self.instance());
        let exchange = async {
            let connection = self.coordinator().await?;
            Ok::<_, MembershipError>(connection.send_within(&request, HEARTBEAT_VERSION, timeout).await?)
        };
        let response = match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(r)) => r,
            Ok(Err(MembershipError::Connection(e @ ConnectionError::Sasl { .. }))) if !self.waits_out(&e) => {
                return Err(MembershipError::Connection(e))
            }
            Ok(Err(e @ MembershipError::Refused { .. })) => return Err(e),
            failed => {
                // The next heartbeat finds the coordinator again; the lease bounds how long
                // this may go on before the member stops its tasks.
                let e = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no coordinator answered within {timeout:?}"),
                };
                tracing::warn!(group = %self.config.group, "Heartbeat: {e}");
                self.reconnect();
                return Ok(Heartbeat::Unreachable);
            }
        };
        match response.error_code {
            code::NONE => Ok(Heartbeat::Alive),
            code::REBALANCE_IN_PROGRESS => Ok(Heartbeat::RejoinNeeded),
            code::UNKNOWN_MEMBER_ID | code::ILLEGAL_GENERATION => {
                self.member_id.clear();
                Ok(Heartbeat::Lost)
            }
            code::NOT_COORDINATOR | code::COORDINATOR_NOT_AVAILABLE | code::COORDINATOR_LOAD_IN_PROGRESS => {
                // The coordinator moved (a broker restarts): not a lost membership.
                self.reconnect();
                Ok(Heartbeat::Unreachable)
            }
            code::FENCED_INSTANCE_ID => Err(self.fenced()),
            other => Err(self.refused("Heartbeat", other)),
        }
    }

    /// Leaves the group (clean shutdown), so the others rebalance at once.
    pub async fn leave(&mut self) -> Result<(), MembershipError> {
        if self.member_id.is_empty() {
            return Ok(());
        }
        let request = LeaveGroupRequest::default()
            .with_group_id(self.group_id())
            .with_members(vec![MemberIdentity::default()
                .with_member_id(StrBytes::from_string(self.member_id.clone()))
                .with_group_instance_id(self.instance())]);
        let group = self.config.group.clone();
        let connection = tokio::time::timeout(Duration::from_secs(5), self.coordinator())
            .await
            .map_err(|_| MembershipError::Refused {
                group,
                call: "LeaveGroup",
                reason: "no coordinator reachable within 5s".into(),
            })??;
        let response = connection
            .send_within(&request, LEAVE_GROUP_VERSION, Duration::from_secs(5))
            .await?;
        self.member_id.clear();
        self.generation = -1;
        match response.error_code {
            code::NONE | code::UNKNOWN_MEMBER_ID => Ok(()),
            other => Err(self.refused("LeaveGroup", other)),
        }
    }

    pub(super) fn refused(&self, call: &'static str, code: i16) -> MembershipError {
        MembershipError::Refused {
            group: self.config.group.clone(),
            call,
            reason: describe(code),
        }
    }

    fn lost(&self, call: &'static str, code: i16) -> MembershipError {
        MembershipError::Lost {
            group: self.config.group.clone(),
            call,
            reason: describe(code),
        }
    }

    fn fenced(&self) -> MembershipError {
        MembershipError::Fenced {
            group: self.config.group.clone(),
            instance: self.config.instance_id.clone().unwrap_or_default(),
        }
    }
}

/// Heartbeats for a member whose JoinGroup is in flight, on a connection of its own.
pub struct HeartbeatProbe {
    kafka: crate::kafka::KafkaSettings,
    addr: String,
    connection: Option<Connection>,
    request: HeartbeatRequest,
}

impl HeartbeatProbe {
    /// True when the coordinator answered that it still knows this member in its current
    /// generation (alive, or a rebalance in progress): the session was renewed. Anything
    /// else — no answer, another generation, an unknown member — says nothing here; the
    /// join in flight reports it.
    pub async fn still_member(&mut self, timeout: Duration) -> bool {
        let exchange = async {
            if self.connection.is_none() {
                self.connection = Some(Connection::connect(&self.kafka, &self.addr).await?);
            }
            let connection = self.connection.as_mut().expect("connected");
            connection.send_within(&self.request, HEARTBEAT_VERSION, timeout).await
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(r)) => matches!(r.error_code, code::NONE | code::REBALANCE_IN_PROGRESS),
            _ => {
                self.connection = None;
                false
            }
        }
    }
}
