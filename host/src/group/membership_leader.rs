//! The leader's work in a join (a part of `membership`): every member's signed metadata
//! read, the assignments made and signed in the version all members speak.

use std::collections::BTreeMap;

use bytes::Bytes;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::protocol::StrBytes;

use super::super::framing::unframe_metadata;
use super::super::metadata::{
    fresh_for, Assignment, AssignmentError, Binding, MemberMetadata, Rostered, CURRENT_VERSION, MAX_ROSTER,
};
use super::Membership;

impl Membership {
    /// The leader's work in a join: reads every member's signed metadata (one that does not
    /// decode, or was signed too many generations ago, gets no tasks), runs `assign` on the
    /// rest and signs each assignment, in the highest version every member understands.
    /// Returns them and how many members it could not read.
    pub(super) fn leader_assignments(
        &self,
        joined: &[JoinGroupResponseMember],
        assign: &impl Fn(&BTreeMap<String, MemberMetadata>) -> BTreeMap<String, Assignment>,
    ) -> (Vec<SyncGroupRequestAssignment>, usize) {
        let mut members = BTreeMap::new();
        let mut unreadable = Vec::new();
        let generation = self.generation;
        for m in joined {
            let binding = Binding {
                group: &self.config.group,
                member: m.group_instance_id.as_deref().unwrap_or(&m.member_id),
                from_generation: -1,
            };
            let decoded = unframe_metadata(&m.metadata)
                .and_then(|bytes| MemberMetadata::decode_signed(&bytes, self.config.secret.as_ref(), &binding));
            match decoded {
                Ok((_, from)) if !fresh_for(from, generation) => {
                    tracing::warn!(
                        member = %m.member_id, instance = ?m.group_instance_id.as_deref(),
                        "a member's metadata was signed in generation {from}, too long before generation \
                         {generation} (a copy of old metadata?); it gets no tasks"
                    );
                    unreadable.push(m.member_id.to_string());
                }
                Ok((meta, from)) => {
                    members.insert(
                        m.member_id.to_string(),
                        MemberMetadata {
                            joined_from: Some(from),
                            ..meta
                        },
                    );
                }
                Err(e) => {
                    tracing::warn!(
                        member = %m.member_id, instance = ?m.group_instance_id.as_deref(),
                        "a member's metadata does not decode, it gets no tasks: {e}"
                    );
                    unreadable.push(m.member_id.to_string());
                }
            }
        }
        // Assign in the highest version every member understands (rolling upgrades).
        let version = members
            .values()
            .map(|m| m.supported.min(CURRENT_VERSION))
            .min()
            .unwrap_or(CURRENT_VERSION);
        let mut assignments = assign(&members);
        if version >= 5 {
            let roster = Rostered::of(members.values());
            for a in assignments.values_mut().filter(|_| roster.len() <= MAX_ROSTER) {
                a.roster = roster.clone();
            }
        }
        let unread = unreadable.len();
        for id in unreadable {
            assignments.insert(
                id,
                Assignment {
                    error: AssignmentError::BadMetadata as i16,
                    ..Default::default()
                },
            );
        }
        let assignments = assignments
            .into_iter()
            .map(|(id, mut a)| {
                a.generation = generation;
                let bytes = self.framing.assignment(a.encode_signed(
                    version,
                    self.config.secret.as_ref(),
                    &self.config.group,
                    &id,
                ));
                SyncGroupRequestAssignment::default()
                    .with_member_id(StrBytes::from_string(id))
                    .with_assignment(Bytes::from(bytes))
            })
            .collect();
        (assignments, unread)
    }
}
