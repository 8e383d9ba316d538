//! A Kafka cluster of a test's own, for tests that restart brokers or need a broker that
//! was started a moment ago: `dev/kafka` run with a private state directory.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{repo_root, Kafka};

/// A private cluster; stopped and deleted on drop.
pub struct PrivateCluster {
    dir: PathBuf,
    pub kafka: Kafka,
}

impl PrivateCluster {
    /// Starts `brokers` fresh nodes and waits until every one answers.
    pub fn start(brokers: u32) -> Result<PrivateCluster> {
        Self::start_with(brokers, &[])
    }

    /// As [`start`](Self::start), with more arguments for `dev/kafka up`.
    pub fn start_with(brokers: u32, extra: &[&str]) -> Result<PrivateCluster> {
        crate::refuse_under_no_kafka();
        let dir = std::env::temp_dir().join(crate::unique_name("sluice-kafka"));
        std::fs::create_dir_all(&dir)?;
        let brokers = brokers.to_string();
        let mut args = vec!["up", "--brokers", &brokers];
        args.extend_from_slice(extra);
        let out = dev_kafka(&dir, &args)?;
        let bootstrap = out
            .lines()
            .last()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .context("dev/kafka up printed no address")?
            .to_string();
        Ok(PrivateCluster {
            dir,
            kafka: Kafka {
                bootstrap,
                security: None,
            },
        })
    }

    /// Stops one node cleanly (SIGTERM), keeps it down for `down_secs`, starts it again
    /// with its data and waits until it is back.
    /// Stops node `node`, keeps it down `down_secs`, starts it again and waits until it is
    /// back: up to 240 s, as a node of three JVMs beside three workers on two cores took
    /// more than dev/kafka's default 90 s to rejoin in two of four full test runs (its log
    /// silent after loading its partitions; dev/kafka then prints its thread dump).
    pub fn restart(&self, node: u32, down_secs: f64) -> Result<()> {
        dev_kafka(
            &self.dir,
            &[
                "restart",
                "--node",
                &node.to_string(),
                "--down",
                &down_secs.to_string(),
                "--timeout",
                "240",
            ],
        )
        .map(drop)
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        // A failing test's brokers are evidence: their logs end up in its output (the
        // directory itself is gone with a CI machine).
        if std::thread::panicking() {
            match dev_kafka(&self.dir, &["logs", "--lines", "80"]) {
                Ok(logs) => eprintln!("the private cluster's logs ({}):\n{logs}", self.dir.display()),
                Err(e) => eprintln!("the private cluster's logs could not be read: {e:#}"),
            }
        }
        let _ = dev_kafka(&self.dir, &["down"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn dev_kafka(dir: &PathBuf, args: &[&str]) -> Result<String> {
    let script = repo_root().join("dev").join("kafka");
    let out = Command::new(&script)
        .args(args)
        .env("SLUICE_KAFKA_DIR", dir)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "`dev/kafka {}` failed ({}):\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
