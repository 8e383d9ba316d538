//! Source offsets of topology groups (`sluice-<topology>`), committed and looked up with
//! Kafka's OffsetCommit / OffsetFetch requests sent to each group's coordinator.
//!
//! A stream thread runs the tasks of many topologies over one consumer, and a librdkafka
//! consumer commits only for the one group it was created with. So offsets do not go
//! through the consumer: this client commits for any group over one connection per
//! coordinator. No worker is a member of a topology group (commits carry generation -1);
//! what keeps a zombie from committing is the worker's membership lease (see
//! `worker::control`) and, under exactly-once, the task's transactional id.

use std::collections::HashMap;
use std::time::Duration;

use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{FindCoordinatorRequest, GroupId, OffsetCommitRequest, OffsetFetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::connection::{code, describe, Connection, FIND_COORDINATOR_VERSION};

const OFFSET_COMMIT_VERSION: i16 = 8;
const OFFSET_FETCH_VERSION: i16 = 7;
/// One request's deadline.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// An error worth trying again after finding the coordinator anew.
fn retriable(code: i16) -> bool {
    matches!(
        code,
        code::COORDINATOR_LOAD_IN_PROGRESS
            | code::COORDINATOR_NOT_AVAILABLE
            | code::NOT_COORDINATOR
            | code::REQUEST_TIMED_OUT
            | code::UNSTABLE_OFFSET_COMMIT
    )
}

/// One source partition's position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// Commits and looks up offsets of any group. Holds one connection per coordinator; a
/// failed request drops it (the next finds the coordinator again).
pub struct GroupOffsets {
    kafka: crate::kafka::KafkaSettings,
    /// Coordinator address of each group seen.
    coordinators: HashMap<String, String>,
    connections: HashMap<String, Connection>,
}

impl GroupOffsets {
    pub fn new(kafka: &crate::kafka::KafkaSettings) -> GroupOffsets {
        GroupOffsets {
            kafka: kafka.clone(),
            coordinators: HashMap::new(),
            connections: HashMap::new(),
        }
    }

    /// Commits `positions` for `group`. One attempt per call, after finding the coordinator
    /// again if needed: the caller decides whether and when to retry (a commit that failed
    /// only means a restart reprocesses a little more).
    pub async fn commit(&mut self, group: &str, positions: &[Position]) -> Result<(), String> {
        if positions.is_empty() {
            return Ok(());
        }
        let mut topics: Vec<OffsetCommitRequestTopic> = Vec::new();
        for p in positions {
            let partition = OffsetCommitRequestPartition::default()
                .with_partition_index(p.partition)
                .with_committed_offset(p.offset)
                .with_committed_leader_epoch(-1)
                .with_committed_metadata(Some(StrBytes::from_static_str("")));
            match topics.iter_mut().find(|t| t.name.0.as_str() == p.topic) {
                Some(t) => t.partitions.push(partition),
                None => topics.push(
                    OffsetCommitRequestTopic::default()
                        .with_name(TopicName(StrBytes::from_string(p.topic.clone())))
                        .with_partitions(vec![partition]),
                ),
            }
        }
        let request = OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
            .with_generation_id_or_member_epoch(-1)
            .with_member_id(StrBytes::from_static_str(""))
            .with_topics(topics);
        let response = self.send_to_coordinator(group, &request, OFFSET_COMMIT_VERSION).await?;
        for t in &response.topics {
            for p in &t.partitions {
                if p.error_code != code::NONE {
                    if retriable(p.error_code) {
                        self.forget(group);
                    }
                    return Err(format!(
                        "committing offsets of group {group}: {} partition {}: {}",
                        t.name.0,
                        p.partition_index,
                        describe(p.error_code)
                    ));
                }
            }
        }
        Ok(())
    }

    /// The committed offset of each `(topic, partition)` of `group` (none: nothing
    /// committed). Offsets of a transaction not yet decided make it fail (retriable).
    pub async fn fetch(&mut self, group: &str, wanted: &[(String, i32)]) -> Result<Vec<Option<i64>>, String> {
        let mut topics: Vec<OffsetFetchRequestTopic> = Vec::new();
        for (topic, partition) in wanted {
            match topics.iter_mut().find(|t| t.name.0.as_str() == topic) {
                Some(t) => t.partition_indexes.push(*partition),
                None => topics.push(
                    OffsetFetchRequestTopic::default()
                        .with_name(TopicName(StrBytes::from_string(topic.clone())))
                        .with_partition_indexes(vec![*partition]),
                ),
            }
        }
        let request = OffsetFetchRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
            .with_topics(Some(topics))
            .with_require_stable(true);
        let response = self.send_to_coordinator(group, &request, OFFSET_FETCH_VERSION).await?;
        if response.error_code != code::NONE {
            if retriable(response.error_code) {
                self.forget(group);
            }
            return Err(format!(
                "looking up offsets of group {group}: {}",
                describe(response.error_code)
            ));
        }
        wanted
            .iter()
            .map(|(topic, partition)| {
                let p = response
                    .topics
                    .iter()
                    .filter(|t| t.name.0.as_str() == topic)
                    .flat_map(|t| t.partitions.iter())
                    .find(|p| p.partition_index == *partition)
                    .ok_or_else(|| format!("no answer for {topic}/{partition} of group {group}"))?;
                if p.error_code != code::NONE {
                    return Err(format!(
                        "looking up offsets of group {group}: {topic}/{partition}: {}",
                        describe(p.error_code)
                    ));
                }
                Ok((p.committed_offset >= 0).then_some(p.committed_offset))
            })
            .collect()
    }

    fn forget(&mut self, group: &str) {
        if let Some(addr) = self.coordinators.remove(group) {
            self.connections.remove(&addr);
        }
    }

    async fn send_to_coordinator<R: super::connection::Call>(
        &mut self,
        group: &str,
        request: &R,
        version: i16,
    ) -> Result<R::Response, String> {
        let addr = match self.coordinators.get(group) {
            Some(addr) => addr.clone(),
            None => {
                let addr = self.find_coordinator(group).await?;
                self.coordinators.insert(group.to_string(), addr.clone());
                addr
            }
        };
        if !self.connections.contains_key(&addr) {
            let c = Connection::connect(&self.kafka, &addr).await.map_err(|e| {
                self.coordinators.remove(group);
                e.to_string()
            })?;
            self.connections.insert(addr.clone(), c);
        }
        let connection = self.connections.get_mut(&addr).expect("connected above");
        match connection.send_within(request, version, REQUEST_TIMEOUT).await {
            Ok(response) => Ok(response),
            Err(e) => {
                self.connections.remove(&addr);
                self.coordinators.remove(group);
                Err(e.to_string())
            }
        }
    }

    async fn find_coordinator(&mut self, group: &str) -> Result<String, String> {
        let request = FindCoordinatorRequest::default()
            .with_key(StrBytes::from_string(group.to_string()))
            .with_key_type(0);
        let mut last = format!("no bootstrap address in {:?}", self.kafka.bootstrap());
        let kafka = self.kafka.clone();
        for addr in kafka.bootstrap_addrs() {
            if !self.connections.contains_key(addr) {
                match Connection::connect(&kafka, addr).await {
                    Ok(c) => {
                        self.connections.insert(addr.to_string(), c);
                    }
                    Err(e) => {
                        last = e.to_string();
                        continue;
                    }
                }
            }
            let c = self.connections.get_mut(addr).expect("connected above");
            match c.send_within(&request, FIND_COORDINATOR_VERSION, REQUEST_TIMEOUT).await {
                Ok(r) if r.error_code == code::NONE => return Ok(format!("{}:{}", r.host, r.port)),
                Ok(r) => last = format!("finding the coordinator of group {group}: {}", describe(r.error_code)),
                Err(e) => {
                    self.connections.remove(addr);
                    last = e.to_string();
                }
            }
        }
        Err(last)
    }
}
