//! The membership client against a real group coordinator: joins, cooperative rebalances,
//! mixed metadata versions, leaving.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use sluice::group::assignor::{Assignor, AssignorInput, LearnerPolicy, Sticky};
use sluice::group::framing::Framing;
use sluice::group::membership::{Heartbeat, Membership, MembershipConfig};
use sluice::group::metadata::{Assignment, MemberMetadata};
use sluice::group::TaskId;
use sluice_tests::{kafka, unique_name};

fn config(group: &str) -> MembershipConfig {
    MembershipConfig {
        kafka: sluice::kafka::KafkaSettings::new(kafka().bootstrap()),
        group: group.to_string(),
        assignor: "sticky".into(),
        secret: None,
        instance_id: None,
        session_timeout: Duration::from_secs(10),
        rebalance_timeout: Duration::from_secs(20),
    }
}

fn metadata(version: u16, active: &[TaskId]) -> MemberMetadata {
    MemberMetadata {
        version,
        supported: version,
        capacity: 1,
        active: active.to_vec(),
        ..Default::default()
    }
}

/// The sticky assignor over `tasks` (stateless: no standbys, no learners), as a leader
/// passes it to `join`.
fn sticky(tasks: &[TaskId]) -> impl Fn(&BTreeMap<String, MemberMetadata>) -> BTreeMap<String, Assignment> + Copy + '_ {
    move |members| {
        Sticky.assign(&AssignorInput {
            members,
            tasks,
            stateful: &HashSet::new(),
            end_offsets: &HashMap::new(),
            standby_replicas: 0,
            learners: LearnerPolicy::NONE,
        })
    }
}

async fn until_rejoin_needed(member: &mut Membership) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match member.heartbeat(Duration::from_secs(5)).await? {
            Heartbeat::RejoinNeeded => return Ok(()),
            Heartbeat::Alive | Heartbeat::Unreachable => {
                anyhow::ensure!(tokio::time::Instant::now() < deadline, "no rebalance within 30s")
            }
            Heartbeat::Lost => anyhow::bail!("the member lost its membership"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_and_an_old_worker_share_a_group_and_only_moved_tasks_are_revoked() -> anyhow::Result<()> {
    let group = unique_name("sluice-group");
    let tasks: Vec<TaskId> = (0..12).map(|p| TaskId::new("orders", p)).collect();
    let assign = sticky(&tasks);

    // A (metadata version 2) alone: it leads and owns everything.
    let mut a = Membership::new(config(&group));
    let first = a.join(&metadata(2, &[]), assign).await?;
    assert!(first.leader);
    assert_eq!(first.assignment.active.len(), 12);
    assert!(!first.assignment.rejoin);

    // B, an older worker (version 1 only), joins; A learns of it by heartbeat and rejoins.
    let mut b = Membership::new(config(&group));
    let (a_meta, b_meta) = (metadata(2, &first.assignment.active), metadata(1, &[]));
    let (second_a, second_b) = tokio::join!(
        async {
            until_rejoin_needed(&mut a).await?;
            anyhow::Ok(a.join(&a_meta, assign).await?)
        },
        b.join(&b_meta, assign)
    );
    let (second_a, second_b) = (second_a?, second_b?);
    assert_eq!(second_a.generation, second_b.generation);
    assert!(second_a.generation > first.generation);
    // Assignments are written in the version both understand.
    assert_eq!((second_a.assignment.version, second_b.assignment.version), (1, 1));
    // Cooperative: A keeps six and revokes six; B gets none of them in this generation.
    assert_eq!(second_a.assignment.active.len(), 6);
    assert_eq!(second_a.assignment.revoked.len(), 6);
    assert!(second_b.assignment.active.is_empty());
    assert!(second_a.assignment.rejoin && second_b.assignment.rejoin);

    // Both rejoin: the revoked six go to B, nothing else moves.
    let kept = second_a.assignment.active.clone();
    let a_meta = metadata(2, &kept);
    let (third_a, third_b) = tokio::join!(a.join(&a_meta, assign), async {
        // A follower whose JoinGroup reaches a stable group with unchanged metadata is handed
        // the current generation back; like a worker, it then learns of the leader's
        // rebalance by heartbeat and joins again.
        loop {
            let joined = b.join(&b_meta, assign).await?;
            if joined.generation > second_b.generation {
                return anyhow::Ok(joined);
            }
            until_rejoin_needed(&mut b).await?;
        }
    });
    let (third_a, third_b) = (third_a?, third_b?);
    assert_eq!(third_a.assignment.active, kept, "A's remaining tasks did not move");
    let mut handed: Vec<TaskId> = second_a.assignment.revoked.clone();
    handed.sort();
    assert_eq!(third_b.assignment.active, handed);
    assert!(third_a.assignment.revoked.is_empty() && !third_a.assignment.rejoin);

    // B leaves cleanly: A is told at its next heartbeat and takes everything back.
    b.leave().await?;
    until_rejoin_needed(&mut a).await?;
    let fourth = a.join(&metadata(2, &kept), assign).await?;
    assert_eq!(fourth.assignment.active, tasks);
    a.leave().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_of_the_earlier_protocol_type_and_a_new_one_share_a_group() -> anyhow::Result<()> {
    // A rolling upgrade: A joined as workers before Kafka's consumer framing did (protocol
    // type `sluice`); B, of this version, joins the same group. The coordinator refuses a
    // second protocol type in one group, so B joins as A does and they share the tasks.
    let group = unique_name("sluice-upgrade");
    let tasks: Vec<TaskId> = (0..4).map(|p| TaskId::new("orders", p)).collect();
    let assign = sticky(&tasks);
    let mut a = Membership::with_framing(config(&group), Framing::Legacy);
    let first = a.join(&metadata(3, &[]), assign).await?;
    assert_eq!(first.assignment.active.len(), 4);

    let mut b = Membership::new(config(&group));
    assert_eq!(b.framing(), Framing::Consumer);
    let (a_meta, b_meta) = (metadata(3, &first.assignment.active), metadata(3, &[]));
    let (second_a, second_b) = tokio::join!(
        async {
            until_rejoin_needed(&mut a).await?;
            anyhow::Ok(a.join(&a_meta, assign).await?)
        },
        b.join(&b_meta, assign)
    );
    let (second_a, second_b) = (second_a?, second_b?);
    assert_eq!(b.framing(), Framing::Legacy, "B joined as the group's members do");
    assert_eq!(second_a.generation, second_b.generation);
    assert_eq!(
        (second_a.assignment.active.len(), second_a.assignment.revoked.len()),
        (2, 2)
    );
    b.leave().await?;
    a.leave().await?;

    // Once the group is empty, a new member frames in Kafka's consumer protocol again.
    let mut c = Membership::new(config(&group));
    let alone = c.join(&metadata(3, &[]), assign).await?;
    assert_eq!((c.framing(), alone.assignment.active.len()), (Framing::Consumer, 4));
    c.leave().await?;
    Ok(())
}

/// Exactly-once's fence against a real coordinator: a stream thread's transaction proves the
/// worker's membership of the cluster group (`task::control::Fence`). A transaction that
/// proves an older generation, or a member the group no longer has, is refused and aborts:
/// none of its records and none of its offsets become visible. Without the fence (the
/// transaction sending only the topology group's offsets, as it did when each task had a
/// producer of its own) the zombie's transaction commits, and this test fails.
#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_proving_an_old_generation_or_a_removed_member_is_refused_and_invisible() -> anyhow::Result<()> {
    use rdkafka::{Offset, TopicPartitionList};
    use sluice::task::control::Fence;
    use sluice::task::delivery::{DeliveryTracker, Outgoing};
    use sluice::task::{TaskOutput, ThreadProducer, TransactionError};

    let group = unique_name("sluice.cluster.fence");
    let (out, topology_group) = (unique_name("fence-out"), unique_name("sluice-fence-topology"));
    kafka().create_topic(&out, 1).await?;
    let tasks: Vec<TaskId> = (0..4).map(|p| TaskId::new("fence", p)).collect();
    let assign = sticky(&tasks);
    let mut a = Membership::new(config(&group));
    let first = a.join(&metadata(3, &[]), assign).await?;
    // A's fence, and a second one that keeps what A held in the first generation (a zombie).
    let (fence, zombie) = (Fence::cluster(&group, &out), Fence::cluster(&group, &out));
    fence.admit(&first.member_id, first.generation, None);
    zombie.admit(&first.member_id, first.generation, None);

    let settings = sluice::kafka::KafkaSettings::new(kafka().bootstrap());
    let producer = std::sync::Arc::new(
        ThreadProducer::start(
            &settings,
            &unique_name("sluice-worker-fence"),
            Duration::from_millis(100),
            &|| false,
        )
        .map_err(anyhow::Error::msg)?
        .expect("not asked to stop"),
    );
    // A tracker per send, as a task gets new ones when its thread's transaction aborts (the
    // aborted records' deliveries fail into the old ones).
    let send = |value: &str| -> anyhow::Result<()> {
        let tracker = std::sync::Arc::new(DeliveryTracker::default());
        let mut output = TaskOutput::transactional();
        output.attach(producer.clone());
        let sent = output.send(
            &tracker,
            Outgoing {
                topic: &out,
                partition: Some(0),
                key: None,
                value: Some(value.as_bytes()),
                timestamp: -1,
                headers: sluice_wire::wire::Headers::EMPTY,
            },
            &|| false,
        );
        anyhow::ensure!(sent.map_err(anyhow::Error::msg)?, "the send gave up");
        Ok(())
    };
    let offsets = |offset: i64| {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&out, 0, Offset::Offset(offset)).unwrap();
        vec![(topology_group.clone(), tpl)]
    };
    let commit = |fence: &Fence, offset: i64| producer.commit(&offsets(offset), fence.token().unwrap().as_ref());

    // The member's own generation: committed.
    send("first")?;
    commit(&fence, 10).map_err(|e| anyhow::anyhow!("{e:?}"))?;

    // B joins: a new generation, which A joins too. The zombie still proves the first.
    let mut b = Membership::new(config(&group));
    let (a_meta, b_meta) = (metadata(3, &first.assignment.active), metadata(3, &[]));
    let (second_a, second_b) = tokio::join!(
        async {
            until_rejoin_needed(&mut a).await?;
            anyhow::Ok(a.join(&a_meta, assign).await?)
        },
        b.join(&b_meta, assign)
    );
    let (second_a, _second_b) = (second_a?, second_b?);
    assert!(second_a.generation > first.generation);
    send("from a zombie of the first generation")?;
    match commit(&zombie, 20) {
        Err(TransactionError::Aborted(detail)) => assert!(
            detail.contains("ILLEGAL_GENERATION") || detail.contains("generation"),
            "refused for another reason: {detail}"
        ),
        other => panic!("a transaction proving an old generation was not refused: {other:?}"),
    }

    // The current generation commits again.
    fence.admit(&second_a.member_id, second_a.generation, None);
    send("second")?;
    commit(&fence, 30).map_err(|e| anyhow::anyhow!("{e:?}"))?;

    // A leaves the group: its member id proves nothing any more.
    a.leave().await?;
    send("from a member that left")?;
    match commit(&fence, 40) {
        Err(TransactionError::Aborted(detail)) => assert!(
            detail.contains("UNKNOWN_MEMBER_ID") || detail.contains("member"),
            "refused for another reason: {detail}"
        ),
        other => panic!("a transaction proving a removed member was not refused: {other:?}"),
    }
    b.leave().await?;

    // Read committed: the two records of the member's own generations, nothing of the others;
    // and the topology group's offset is the last one a valid transaction committed.
    let values: Vec<String> = kafka()
        .read_all(&out, Duration::from_secs(30))?
        .into_iter()
        .map(|r| String::from_utf8(r.value.unwrap_or_default()).unwrap())
        .collect();
    assert_eq!(values, ["first", "second"]);
    assert_eq!(kafka().committed_offsets(&topology_group, &out, 1)?, vec![Some(30)]);
    Ok(())
}
