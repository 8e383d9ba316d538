//! Members of the cluster's group that are not workers of the cluster. On a Kafka without
//! ACLs anyone may join the group, lead it, or take a worker's `group.instance.id`; their
//! metadata is not signed with the cluster secret, so a worker can tell them apart
//! (DescribeGroups) and remove them (LeaveGroup, which the broker lets anyone send for any
//! member), then join again. What this cannot stop is written in `docs/security.md`.

use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::leave_group_request::{LeaveGroupRequest, MemberIdentity};
use kafka_protocol::protocol::StrBytes;

use super::connection::{code, describe};
use super::framing::unframe_metadata;
use super::membership::{Membership, MembershipConfig, MembershipError};
use super::metadata::{Binding, MemberMetadata};

const DESCRIBE_GROUPS_VERSION: i16 = 5;
const LEAVE_GROUP_VERSION: i16 = 4;

/// A member of the group as the coordinator describes it.
#[derive(Debug, Clone)]
pub struct DescribedMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    /// The client id it connected with (whatever it chose to say).
    pub client_id: String,
    /// Its metadata, when it is signed with the cluster secret for this member of this
    /// group (with no secret: when it decodes at all).
    pub metadata: Option<MemberMetadata>,
    /// Its metadata as it sent it (framed), believed or not.
    pub raw: bytes::Bytes,
}

impl DescribedMember {
    /// How the member can be named to LeaveGroup.
    fn identity(&self) -> MemberIdentity {
        MemberIdentity::default()
            .with_member_id(StrBytes::from_string(self.member_id.clone()))
            .with_group_instance_id(self.instance_id.clone().map(StrBytes::from_string))
    }
}

/// The group as the coordinator describes it.
#[derive(Debug, Clone, Default)]
pub struct DescribedGroup {
    /// The protocol (assignor) the group runs, e.g. `sluice-sticky`; empty when it has none.
    pub protocol: String,
    pub members: Vec<DescribedMember>,
}

impl DescribedGroup {
    /// The members whose metadata is not signed with the cluster secret.
    pub fn intruders(&self) -> Vec<&DescribedMember> {
        self.members.iter().filter(|m| m.metadata.is_none()).collect()
    }
}

impl Membership {
    /// The group's protocol and members, each with its metadata when it is believed.
    pub async fn describe_group(&mut self) -> Result<DescribedGroup, MembershipError> {
        let request = DescribeGroupsRequest::default().with_groups(vec![self.group_id()]);
        let response = match self.coordinator().await?.send(&request, DESCRIBE_GROUPS_VERSION).await {
            Ok(r) => r,
            Err(e) => {
                self.reconnect();
                return Err(e.into());
            }
        };
        let Some(group) = response.groups.into_iter().next() else {
            return Ok(DescribedGroup::default());
        };
        if group.error_code != code::NONE {
            return Err(self.refused("DescribeGroups", group.error_code));
        }
        let members = group
            .members
            .iter()
            .map(|m| {
                let binding = Binding {
                    group: &self.config.group,
                    member: m.group_instance_id.as_deref().unwrap_or(&m.member_id),
                    from_generation: -1,
                };
                let metadata = unframe_metadata(&m.member_metadata)
                    .and_then(|b| MemberMetadata::decode_signed(&b, self.config.secret.as_ref(), &binding))
                    .ok()
                    .map(|(meta, _)| meta);
                DescribedMember {
                    member_id: m.member_id.to_string(),
                    instance_id: m.group_instance_id.as_ref().map(|i| i.to_string()),
                    client_id: m.client_id.to_string(),
                    metadata,
                    raw: m.member_metadata.clone(),
                }
            })
            .collect();
        Ok(DescribedGroup {
            protocol: group.protocol_data.to_string(),
            members,
        })
    }

    /// Removes `members` from the group (LeaveGroup on their behalf). Members that are gone
    /// already are not an error.
    pub async fn remove_members(&mut self, members: &[&DescribedMember]) -> Result<(), MembershipError> {
        if members.is_empty() {
            return Ok(());
        }
        let request = LeaveGroupRequest::default()
            .with_group_id(self.group_id())
            .with_members(members.iter().map(|m| m.identity()).collect());
        let response = match self.coordinator().await?.send(&request, LEAVE_GROUP_VERSION).await {
            Ok(r) => r,
            Err(e) => {
                self.reconnect();
                return Err(e.into());
            }
        };
        if !matches!(response.error_code, code::NONE | code::UNKNOWN_MEMBER_ID) {
            return Err(self.refused("LeaveGroup", response.error_code));
        }
        for m in &response.members {
            if !matches!(m.error_code, code::NONE | code::UNKNOWN_MEMBER_ID) {
                tracing::warn!(member = %m.member_id, "removing a member from the group: {}", describe(m.error_code));
            }
        }
        Ok(())
    }
}

/// The cluster's group `group` as its coordinator describes it, asked on a connection of
/// its own (by a worker's admin API, which is no member): members are believed with
/// `secret` as a leader would believe them.
pub async fn describe_cluster_group(
    kafka: &crate::kafka::KafkaSettings,
    group: &str,
    secret: Option<crate::secret::ClusterSecret>,
) -> Result<DescribedGroup, MembershipError> {
    let mut asker = Membership::new(MembershipConfig {
        kafka: kafka.clone(),
        group: group.to_string(),
        assignor: String::new(),
        secret,
        instance_id: None,
        session_timeout: std::time::Duration::from_secs(10),
        rebalance_timeout: std::time::Duration::from_secs(10),
    });
    tokio::time::timeout(std::time::Duration::from_secs(10), asker.describe_group())
        .await
        .map_err(|_| MembershipError::Refused {
            group: group.to_string(),
            call: "DescribeGroups",
            reason: "no coordinator answered within 10s".into(),
        })?
}
