//! Kafka's own tools read what Sluice keeps in Kafka: `kafka-consumer-groups.sh` describes
//! a cluster's group (members, state, assignor) and a topology's group (committed offsets,
//! lag) as it describes any consumer group.

use std::process::Command;
use std::time::Duration;

use sluice_tests::worker::{cluster_worker, guest, manifest, TempDir};
use sluice_tests::{kafka, repo_root, unique_name};

/// `kafka-consumer-groups.sh ARGS` (Kafka's own, from the broker's jars): its output, or
/// an error with everything it printed when it failed or reported an error.
fn consumer_groups(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(repo_root().join("dev").join("kafka"))
        .args(["tool", "consumer-groups", "--bootstrap-server", kafka().bootstrap()])
        .args(args)
        .output()?;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    // The tool exits 0 after some failures; what it prints says.
    if !out.status.success() || stdout.contains("Error") || stderr.contains("Error") || stderr.contains("Exception") {
        anyhow::bail!(
            "kafka-consumer-groups.sh {args:?} failed ({}):\n{stdout}\n{stderr}",
            out.status
        );
    }
    Ok(stdout.into_owned())
}

/// The rows of a table the tool printed (after its header line starting with GROUP).
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .skip_while(|l| !l.starts_with("GROUP"))
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn kafkas_consumer_groups_tool_describes_cluster_and_topology_groups() -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("tools-in"), unique_name("tools-out"));
    kafka.create_topic(&input, 4).await?;
    kafka.create_topic(&output, 4).await?;
    let records: Vec<(Vec<u8>, Vec<u8>)> = (0..2_000)
        .map(|i| (format!("key-{i}").into_bytes(), format!("value {i}").into_bytes()))
        .collect();
    kafka.produce(&input, &records).await?;

    let dir = TempDir::new("kafka-tools");
    let name = unique_name("tools");
    let m = dir.write(
        "upper.toml",
        &manifest(
            &name,
            &guest("uppercase"),
            &[("input", &input)],
            &[("output", &output)],
            "",
        ),
    );
    let cluster = unique_name("tools");
    let _one = cluster_worker(&dir, Some(&m), &cluster, 1, &[])?;
    let _two = cluster_worker(&dir, Some(&m), &cluster, 2, &[])?;
    let topology_group = format!("sluice-{name}");
    let cluster_group = format!("sluice.cluster.{cluster}");
    kafka
        .wait_committed(&topology_group, &input, 4, 2_000, Duration::from_secs(120))
        .await?;

    // The topology's group: every partition's committed offset at its end, no lag.
    let offsets = consumer_groups(&["--describe", "--group", &topology_group])?;
    let offsets = rows(&offsets);
    assert_eq!(offsets.len(), 4, "{offsets:?}");
    let mut committed = 0;
    for row in &offsets {
        // GROUP TOPIC PARTITION CURRENT-OFFSET LOG-END-OFFSET LAG ...
        assert_eq!((&row[0], &row[1]), (&topology_group, &input), "{row:?}");
        assert_eq!(row[3], row[4], "committed offset at the end: {row:?}");
        assert_eq!(row[5], "0", "lag: {row:?}");
        committed += row[3].parse::<i64>()?;
    }
    assert_eq!(committed, 2_000);

    // The cluster's group: both workers as members, stable, with the cluster's assignor,
    // once they have settled into one generation.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let state = loop {
        let state = consumer_groups(&["--describe", "--state", "--group", &cluster_group])?;
        let row = rows(&state).into_iter().next().unwrap_or_default();
        if row.get(4).map(String::as_str) == Some("Stable") && row.get(5).map(String::as_str) == Some("2") {
            break row;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the cluster group never became stable with 2 members: {state}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // GROUP COORDINATOR (ID) ASSIGNMENT-STRATEGY STATE #MEMBERS
    assert_eq!(
        (&state[0], &state[3]),
        (&cluster_group, &"sluice-sticky".to_string()),
        "{state:?}"
    );
    for args in [
        &["--describe", "--members"][..],
        &["--describe", "--members", "--verbose"],
    ] {
        let members = consumer_groups(&[args, &["--group", &cluster_group]].concat())?;
        let members = rows(&members);
        assert_eq!(members.len(), 2, "{args:?}: {members:?}");
        assert!(
            members.iter().all(|m| m[0] == cluster_group && m[3] == "sluice-worker"),
            "{members:?}"
        );
    }
    // The cluster group commits no offsets: described without a row, and without an error.
    assert_eq!(
        rows(&consumer_groups(&["--describe", "--group", &cluster_group])?),
        Vec::<Vec<String>>::new()
    );

    // Listed, and described together (`--all-groups` would race with other tests
    // deleting theirs on the shared broker).
    let list = consumer_groups(&["--list"])?;
    for group in [&topology_group, &cluster_group] {
        assert!(list.lines().any(|l| l.trim() == group), "{group} not listed:\n{list}");
    }
    let both = consumer_groups(&[
        "--describe",
        "--state",
        "--group",
        &cluster_group,
        "--group",
        &topology_group,
    ])?;
    let described = |group: &str, state: &str| {
        both.lines()
            .any(|l| l.split_whitespace().next() == Some(group) && l.split_whitespace().nth(4) == Some(state))
    };
    // A topology's group has no members (workers commit for it; see `group/offsets.rs`).
    assert!(
        described(&cluster_group, "Stable") && described(&topology_group, "Empty"),
        "{both}"
    );
    Ok(())
}
