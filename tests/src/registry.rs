//! A real Schema Registry for the tests (`dev/registry`, Apicurio Registry with Confluent's
//! API), and confluent-kafka's own serializers to write and read records with
//! (`tests/python/confluent_io.py`, run with the venv of `dev/setup-python`).
//!
//! [`registry()`] is the run's shared registry: `SCHEMA_REGISTRY_URL` when set, else the
//! first call runs `dev/registry up` (which finds the running one, or starts it). A test
//! that stops its registry starts one of its own ([`PrivateRegistry`]).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};

use crate::worker::TempDir;
use crate::{kafka, refuse_under_no_kafka, repo_root};

/// The Schema Registry of this test run (the URL a Confluent client takes).
pub fn registry() -> &'static str {
    refuse_under_no_kafka();
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        let url = match std::env::var("SCHEMA_REGISTRY_URL") {
            Ok(url) if !url.trim().is_empty() => url.trim().to_string(),
            _ => up(None).unwrap_or_else(|e| panic!("no schema registry for the tests: {e:#}")),
        };
        eprintln!("tests: using the schema registry at {url}");
        url
    })
}

/// Runs `dev/registry <command>` (in `dir`, or the default state directory); its last line.
fn run(command: &str, dir: Option<&Path>) -> Result<String> {
    match dir {
        Some(dir) => crate::dev_script("registry", &[command], &[("SLUICE_REGISTRY_DIR", dir)]),
        None => crate::dev_script("registry", &[command], &[]),
    }
}

fn up(dir: Option<&Path>) -> Result<String> {
    run("up", dir)
}

/// A registry of one test's own, in a directory of its own: stopped (its schemas kept, as
/// a registry that is down) and started again on the same port. Removed when dropped.
pub struct PrivateRegistry {
    dir: TempDir,
    pub url: String,
}

impl PrivateRegistry {
    pub fn start() -> Result<PrivateRegistry> {
        refuse_under_no_kafka();
        let dir = TempDir::new("registry");
        let url = up(Some(dir.path()))?;
        Ok(PrivateRegistry { dir, url })
    }

    /// Stops it, keeping its schemas: requests are refused until [`PrivateRegistry::resume`].
    pub fn stop(&self) -> Result<()> {
        run("stop", Some(self.dir.path())).map(|_| ())
    }

    /// Starts it again, same port, same schemas and ids.
    pub fn resume(&self) -> Result<()> {
        run("start", Some(self.dir.path())).map(|_| ())
    }
}

impl Drop for PrivateRegistry {
    fn drop(&mut self) {
        let _ = run("down", Some(self.dir.path()));
    }
}

/// The Python of `dev/setup-python`'s venv (confluent-kafka, fastavro, protobuf).
pub fn python() -> Result<PathBuf> {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let out = Command::new(repo_root().join("dev").join("setup-python"))
                .output()
                .map_err(|e| format!("running dev/setup-python: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "dev/setup-python failed:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        })
        .clone()
        .map_err(|e| anyhow::anyhow!(e))
}

/// Runs `tests/python/confluent_io.py ARGS` with `input` on its stdin; its stdout.
pub fn confluent_io(args: &[&str], input: &str) -> Result<String> {
    let script = repo_root().join("tests").join("python").join("confluent_io.py");
    let mut child = Command::new(python()?)
        .arg(&script)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {}", script.display()))?;
    let mut stdin = child.stdin.take().expect("piped");
    let input = input.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output()?;
    let _ = writer.join();
    if !out.status.success() {
        bail!(
            "confluent_io.py {} failed ({}):\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Produces `records` (JSON lines: key, value, partition) to `topic` with confluent-kafka's
/// serializer of `format` and the schema in `schema` (a file), registering it.
pub fn produce_with_confluent(
    registry: &str,
    topic: &str,
    format: &str,
    schema: &Path,
    extra: &[&str],
    records: &[serde_json::Value],
) -> Result<()> {
    let lines: String = records.iter().map(|r| format!("{r}\n")).collect();
    let schema = schema.display().to_string();
    let mut args = vec![
        "produce",
        "--bootstrap",
        kafka().bootstrap(),
        "--registry",
        registry,
        "--topic",
        topic,
        "--format",
        format,
        "--schema",
        &schema,
    ];
    args.extend_from_slice(extra);
    confluent_io(&args, &lines).map(|_| ())
}

/// Reads `count` records of `topic` with confluent-kafka's deserializer of `format` (the
/// writer's schema from the registry): JSON lines of partition, offset, key, value.
pub fn consume_with_confluent(
    registry: &str,
    topic: &str,
    format: &str,
    count: usize,
    extra: &[&str],
) -> Result<Vec<serde_json::Value>> {
    let count = count.to_string();
    let mut args = vec![
        "consume",
        "--bootstrap",
        kafka().bootstrap(),
        "--registry",
        registry,
        "--topic",
        topic,
        "--format",
        format,
        "--count",
        &count,
    ];
    args.extend_from_slice(extra);
    confluent_io(&args, "")?
        .lines()
        .map(|l| serde_json::from_str(l).with_context(|| format!("a line of confluent_io.py: {l}")))
        .collect()
}
