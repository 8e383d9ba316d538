//! Topology manifests: which component to run under which name, and the topics its logical
//! sources and sinks are bound to. Pure: parsing and checking only, no I/O beyond reading
//! the file.
//!
//! ```toml
//! name = "shout"                 # the deployed topology's name: [A-Za-z0-9._-], unique
//! component = "uppercase.wasm"   # relative to this file
//!
//! [sources]                      # every source the component declares, bound to a topic
//! input = "greetings"
//!
//! [sinks]                        # every sink it declares
//! output = "greetings-shouted"
//!
//! [limits]                       # optional; the worker's defaults otherwise
//! memory = "32MiB"               # linear memory of one instance (at most the worker's)
//! call-timeout = "2s"            # deadline of one guest call
//! host-memory = "16MiB"          # what one task's calls may make the host hold
//! state = "10GiB"                # state on disk of the topology's tasks on one worker
//! records-per-second = 5000      # most records one task processes per second
//! ```
//!
//! A record the topology cannot process (its guest returns an error, traps, runs past its
//! deadline or out of memory on that one record) is handled by `on-error`:
//!
//! ```toml
//! on-error = "dead-letter"       # "fail" (default): the task stops and stays failed;
//!                                # "skip": count, log and go on past the record;
//!                                # "dead-letter": produce it unchanged to the dead-letter
//!                                # topic, with headers naming the error, and go on
//! dead-letter-topic = "shout-dlq" # default "<name>-dead-letter"; must exist
//! ```
//!
//! A task with several source partitions (a join, a merge) takes its records in timestamp
//! order across them, and waits for a partition the broker has records for before it
//! processes past it; `max-task-idle-ms` is Kafka Streams' `max.task.idle.ms`:
//!
//! ```toml
//! max-task-idle-ms = 0           # 0 (default): wait only for partitions with lag; N: also
//!                                # wait up to N ms for new records; -1: never wait
//! ```
//!
//! Topics whose records are in the Confluent wire format (the topology declares which, with
//! their schemas) take their registry settings here:
//!
//! ```toml
//! [formats]
//! subject-name-strategy = "topic" # "topic" (default): <topic>-key, <topic>-value; "record":
//!                                 # the record's full name; "topic-record": <topic>-<record>
//! auto-register = true            # sinks register their schemas (false: each must be
//!                                 # registered under its subject already)
//! validate-json-reads = false     # JSON Schema records read are validated against their
//!                                 # writer's schema (written ones always are)
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use sluice_wire::Description;

/// A manifest that cannot be used; the message names the file and the problem.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read manifest {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("manifest {path} is not valid: {message}")]
    Invalid { path: String, message: String },
    #[error("manifest {path} does not fit component {component}: {message}")]
    Mismatch {
        path: String,
        component: String,
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawManifest {
    name: String,
    #[serde(default)]
    component: Option<PathBuf>,
    #[serde(default)]
    sources: BTreeMap<String, String>,
    #[serde(default)]
    sinks: BTreeMap<String, String>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    on_error: Option<String>,
    #[serde(default)]
    dead_letter_topic: Option<String>,
    #[serde(default)]
    max_task_idle_ms: Option<i64>,
    #[serde(default)]
    formats: RawFormats,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawFormats {
    subject_name_strategy: Option<String>,
    auto_register: Option<bool>,
    validate_json_reads: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawLimits {
    memory: Option<String>,
    call_timeout: Option<String>,
    host_memory: Option<String>,
    state: Option<String>,
    records_per_second: Option<u32>,
}

/// Per-topology limits that override the worker's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    pub memory: Option<usize>,
    pub call_timeout: Option<Duration>,
    pub host_memory: Option<usize>,
    /// Bytes of state on disk the topology's tasks may keep on one worker.
    pub state: Option<u64>,
    /// Most records one task processes per second (its partitions are paused in between).
    pub records_per_second: Option<u32>,
}

/// Kafka Streams' `max.task.idle.ms`: how long a task waits for a record of an empty
/// partition that has nothing more on the broker before it processes past it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MaxTaskIdle {
    /// Wait for partitions the broker has records for, not for new records (`0`, the default).
    #[default]
    Zero,
    /// Wait up to this long for a record of a caught-up partition.
    Wait(Duration),
    /// Never wait: process what is buffered (`-1`).
    Disabled,
}

impl MaxTaskIdle {
    /// From Kafka Streams' milliseconds: `-1` disables waiting, `0` (default) waits only for
    /// partitions with lag.
    pub fn from_ms(ms: i64) -> Result<MaxTaskIdle, String> {
        match ms {
            -1 => Ok(MaxTaskIdle::Disabled),
            0 => Ok(MaxTaskIdle::Zero),
            ms if ms > 0 => Ok(MaxTaskIdle::Wait(Duration::from_millis(ms as u64))),
            ms => Err(format!(
                "max-task-idle-ms = {ms}: write -1 (never wait), 0 (the default) or a positive number of milliseconds"
            )),
        }
    }

    /// How long a caught-up partition is waited for.
    pub fn wait(self) -> Duration {
        match self {
            MaxTaskIdle::Wait(d) => d,
            _ => Duration::ZERO,
        }
    }
}

/// What happens to a record the topology cannot process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnError {
    /// The task stops (and stays failed); nothing past the last good record is committed.
    #[default]
    Fail,
    /// The record is logged, counted and passed over.
    Skip,
    /// The record goes unchanged to the dead-letter topic, with headers naming the error.
    DeadLetter,
}

/// A parsed manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// The file it was read from (for messages).
    pub path: String,
    pub name: String,
    /// The component file, resolved against the manifest's directory.
    pub component: PathBuf,
    pub sources: BTreeMap<String, String>,
    pub sinks: BTreeMap<String, String>,
    pub limits: Limits,
    pub on_error: OnError,
    /// Where `on-error = "dead-letter"` sends records (none under the other policies).
    pub dead_letter_topic: Option<String>,
    /// How long a task waits for an empty source partition before processing past it.
    pub max_task_idle: MaxTaskIdle,
    /// How its topics in the Confluent wire format are registered and checked (`[formats]`).
    pub formats: crate::formats::FormatSettings,
    /// Not from the file: set for an uploaded topology from its registry entry. Source
    /// offsets are committed in group `sluice-<name>`, or `sluice-<name>.v<epoch>` after a
    /// deploy that asked to reprocess (so the new group starts empty) …
    pub offsets_epoch: u32,
    /// … from here, where the group has nothing committed yet (default: the beginning).
    pub start_from: Option<StartFrom>,
}

impl Manifest {
    /// The group its source offsets are committed in.
    pub fn group(&self) -> String {
        group_id(&self.name, self.offsets_epoch)
    }
}

/// The group a topology's source offsets are committed in (see [`Manifest::offsets_epoch`]).
pub fn group_id(name: &str, epoch: u32) -> String {
    if epoch == 0 {
        format!("sluice-{name}")
    } else {
        format!("sluice-{name}.v{epoch}")
    }
}

/// Where a topology's tasks start reading a partition nothing is committed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum StartFrom {
    Earliest,
    Latest,
    /// This offset of every source partition.
    Offset(i64),
    /// The first record at or after this time (milliseconds since the epoch).
    Timestamp(i64),
}

impl std::str::FromStr for StartFrom {
    type Err = String;

    /// `earliest`, `latest`, `offset:N`, `timestamp:MS` or `timestamp:2026-11-30T12:00:00Z`.
    fn from_str(s: &str) -> Result<StartFrom, String> {
        let bad = || {
            format!(
                "{s:?} is not a position to reprocess from: write earliest, latest, offset:N, timestamp:MILLIS \
                 or timestamp:RFC3339 (e.g. timestamp:2026-11-30T12:00:00Z)"
            )
        };
        match s {
            "earliest" => return Ok(StartFrom::Earliest),
            "latest" => return Ok(StartFrom::Latest),
            _ => {}
        }
        if let Some(n) = s.strip_prefix("offset:") {
            return n
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .map(StartFrom::Offset)
                .ok_or_else(bad);
        }
        if let Some(t) = s.strip_prefix("timestamp:") {
            if let Ok(ms) = t.parse::<i64>() {
                return Ok(StartFrom::Timestamp(ms));
            }
            let at = humantime::parse_rfc3339_weak(t).map_err(|_| bad())?;
            let ms = at.duration_since(std::time::UNIX_EPOCH).map_err(|_| bad())?.as_millis();
            return Ok(StartFrom::Timestamp(ms as i64));
        }
        Err(bad())
    }
}

impl std::fmt::Display for StartFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartFrom::Earliest => f.write_str("earliest"),
            StartFrom::Latest => f.write_str("latest"),
            StartFrom::Offset(n) => write!(f, "offset:{n}"),
            StartFrom::Timestamp(ms) => write!(f, "timestamp:{ms}"),
        }
    }
}

impl TryFrom<String> for StartFrom {
    type Error = String;
    fn try_from(s: String) -> Result<StartFrom, String> {
        s.parse()
    }
}

impl From<StartFrom> for String {
    fn from(s: StartFrom) -> String {
        s.to_string()
    }
}

/// A manifest's bindings in the order of the component's description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub source_topics: Vec<String>,
    pub sink_topics: Vec<String>,
    /// The topic of each global store, in the order of `description.global_stores` (bound
    /// under `[sources]`).
    pub global_topics: Vec<String>,
    /// The dead-letter topic, when the topology's policy sends records there.
    pub dead_letter_topic: Option<String>,
}

impl Manifest {
    pub fn load(path: impl AsRef<Path>) -> Result<Manifest, ManifestError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
            path: shown.clone(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Manifest::parse(&text, &shown, base)
    }

    /// Parses manifest text; `path` is used in messages, `base` resolves the component path.
    pub fn parse(text: &str, path: &str, base: &Path) -> Result<Manifest, ManifestError> {
        Manifest::parse_for(text, path, |raw| match raw {
            None => Err("`component` is missing; give the path of the .wasm file".to_string()),
            Some(c) if c.as_os_str().is_empty() => {
                Err("`component` is empty; give the path of the .wasm file".to_string())
            }
            Some(c) => Ok(base.join(c)),
        })
    }

    /// Parses the manifest of an uploaded topology, whose component is `component` (a
    /// `component` line in the text, if any, is not used).
    pub fn parse_uploaded(text: &str, path: &str, component: &Path) -> Result<Manifest, ManifestError> {
        Manifest::parse_for(text, path, |_| Ok(component.to_path_buf()))
    }

    fn parse_for(
        text: &str,
        path: &str,
        component: impl FnOnce(Option<&Path>) -> Result<PathBuf, String>,
    ) -> Result<Manifest, ManifestError> {
        let invalid = |message: String| ManifestError::Invalid {
            path: path.to_string(),
            message,
        };
        let raw: RawManifest = toml::from_str(text).map_err(|e| invalid(toml_error(text, &e)))?;
        check_name("topology name", &raw.name).map_err(invalid)?;
        let component = component(raw.component.as_deref()).map_err(invalid)?;
        for (kind, map) in [("source", &raw.sources), ("sink", &raw.sinks)] {
            for (name, topic) in map {
                check_topic(topic).map_err(|m| invalid(format!("{kind} {name:?} is bound to {topic:?}: {m}")))?;
            }
        }
        let memory = raw
            .limits
            .memory
            .as_deref()
            .map(|s| parse_size(s).map_err(|m| invalid(format!("limits.memory = {s:?}: {m}"))))
            .transpose()?;
        let call_timeout = raw
            .limits
            .call_timeout
            .as_deref()
            .map(|s| {
                humantime::parse_duration(s).map_err(|e| {
                    invalid(format!(
                        "limits.call-timeout = {s:?}: {e} (write e.g. \"500ms\" or \"2s\")"
                    ))
                })
            })
            .transpose()?;
        if call_timeout == Some(Duration::ZERO) {
            return Err(invalid("limits.call-timeout must be more than zero".into()));
        }
        let host_memory = raw
            .limits
            .host_memory
            .as_deref()
            .map(|s| parse_size(s).map_err(|m| invalid(format!("limits.host-memory = {s:?}: {m}"))))
            .transpose()?;
        let state = raw
            .limits
            .state
            .as_deref()
            .map(|s| parse_size(s).map_err(|m| invalid(format!("limits.state = {s:?}: {m}"))))
            .transpose()?
            .map(|n| n as u64);
        if raw.limits.records_per_second == Some(0) {
            return Err(invalid("limits.records-per-second must be more than zero".into()));
        }
        let on_error = match raw.on_error.as_deref() {
            None | Some("fail") => OnError::Fail,
            Some("skip") => OnError::Skip,
            Some("dead-letter") => OnError::DeadLetter,
            Some(other) => {
                return Err(invalid(format!(
                    "on-error = {other:?}: expected \"fail\", \"skip\" or \"dead-letter\""
                )))
            }
        };
        let dead_letter_topic = match (on_error, raw.dead_letter_topic) {
            (OnError::DeadLetter, topic) => {
                let topic = topic.unwrap_or_else(|| format!("{}-dead-letter", raw.name));
                check_topic(&topic).map_err(|m| invalid(format!("dead-letter-topic = {topic:?}: {m}")))?;
                Some(topic)
            }
            (_, Some(topic)) => {
                return Err(invalid(format!(
                    "dead-letter-topic = {topic:?} is set, but on-error is not \"dead-letter\""
                )))
            }
            (_, None) => None,
        };
        let max_task_idle = raw
            .max_task_idle_ms
            .map(MaxTaskIdle::from_ms)
            .transpose()
            .map_err(invalid)?
            .unwrap_or_default();
        let defaults = crate::formats::FormatSettings::default();
        let formats = crate::formats::FormatSettings {
            subject_strategy: raw
                .formats
                .subject_name_strategy
                .as_deref()
                .map(crate::formats::SubjectStrategy::parse)
                .transpose()
                .map_err(invalid)?
                .unwrap_or(defaults.subject_strategy),
            auto_register: raw.formats.auto_register.unwrap_or(defaults.auto_register),
            validate_json_reads: raw.formats.validate_json_reads.unwrap_or(defaults.validate_json_reads),
        };
        Ok(Manifest {
            path: path.to_string(),
            name: raw.name,
            component,
            sources: raw.sources,
            sinks: raw.sinks,
            limits: Limits {
                memory,
                call_timeout,
                host_memory,
                state,
                records_per_second: raw.limits.records_per_second,
            },
            on_error,
            dead_letter_topic,
            max_task_idle,
            formats,
            offsets_epoch: 0,
            start_from: None,
        })
    }

    /// Checks the bindings against what the component declares and orders them like it.
    pub fn bind(&self, description: &Description) -> Result<Binding, ManifestError> {
        let mismatch = |message: String| ManifestError::Mismatch {
            path: self.path.clone(),
            component: self.component.display().to_string(),
            message,
        };
        let internal: Vec<&str> = description.internal_topics.iter().map(|t| t.name.as_str()).collect();
        let mut bound = Vec::new();
        // A global store's topic is bound under [sources] like a source.
        let inputs: Vec<String> = (description.sources.iter())
            .chain(description.global_stores.iter().map(|g| &g.topic))
            .cloned()
            .collect();
        for (kind, declared, map) in [
            ("source", &inputs, &self.sources),
            ("sink", &description.sinks, &self.sinks),
        ] {
            for name in map.keys() {
                if internal.contains(&name.as_str()) {
                    return Err(mismatch(format!(
                        "it binds the {kind} {name:?} to a topic, but the component declares {name:?} an internal \
                         topic: the host names it {:?} and creates it itself; remove `{name} = …` from [{kind}s]",
                        repartition_topic(&self.name, name)
                    )));
                }
                if !declared.contains(name) {
                    return Err(mismatch(format!(
                        "it binds the {kind} {name:?}, which the component does not declare (it declares {})",
                        list(declared)
                    )));
                }
            }
            let mut topics = Vec::new();
            for name in declared {
                if internal.contains(&name.as_str()) {
                    topics.push(repartition_topic(&self.name, name));
                    continue;
                }
                match map.get(name) {
                    Some(topic) => topics.push(topic.clone()),
                    None => {
                        return Err(mismatch(format!(
                            "the component declares the {kind} {name:?}, but the manifest does not bind it to a topic \
                             (add `{name} = \"<topic>\"` under [{kind}s])"
                        )))
                    }
                }
            }
            bound.push(topics);
        }
        let sink_topics = bound.pop().unwrap_or_default();
        let mut source_topics = bound.pop().unwrap_or_default();
        let global_topics = source_topics.split_off(description.sources.len());
        for topic in &sink_topics {
            let is_internal = internal.iter().any(|n| repartition_topic(&self.name, n) == *topic);
            if source_topics.contains(topic) && !is_internal {
                return Err(mismatch(format!(
                    "topic {topic:?} is bound both as a source and as a sink"
                )));
            }
        }
        if let Some(topic) = &self.dead_letter_topic {
            if source_topics.contains(topic) || sink_topics.contains(topic) {
                return Err(mismatch(format!(
                    "the dead-letter topic {topic:?} is also bound as a source or sink"
                )));
            }
        }
        Ok(Binding {
            source_topics,
            sink_topics,
            global_topics,
            dead_letter_topic: self.dead_letter_topic.clone(),
        })
    }
}

/// The topic of a topology's internal topic `name`: `<topology>-<name>-repartition`, in the
/// topology's namespace as its changelogs are (internal names are `[A-Za-z0-9_]`, so two
/// topologies' internal topics cannot collide).
pub fn repartition_topic(topology: &str, name: &str) -> String {
    format!("{topology}-{name}-repartition")
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", ")
    }
}

/// `line 3, column 1: unknown field `replicas`, …` — one line, positions from 1.
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim();
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message.to_string(),
    }
}

/// Names used in group ids, metrics and paths (topologies; a component's sources and
/// sinks): `[A-Za-z0-9._-]`, 1–100 characters, not only dots (`.` and `..` are paths).
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 100 {
        return Err(format!("the {what} must be 1 to 100 characters long, got {name:?}"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "the {what} {name:?} contains {c:?}; use letters, digits, '.', '_' and '-'"
        ));
    }
    if name.chars().all(|c| c == '.') {
        return Err(format!("the {what} {name:?} is only dots; it would name a directory"));
    }
    Ok(())
}

/// Store names become directories and the middle of changelog topics
/// (`<topology>-<store>-changelog`): `[A-Za-z0-9_]`, 1–64 characters. Without '-' or '.'
/// two topologies' changelogs cannot collide (`a` + `b-c` against `a-b` + `c`).
pub fn check_store_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err(format!("the store name {name:?} must be 1 to 64 characters long"));
    }
    if let Some(c) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '_')) {
        return Err(format!(
            "the store name {name:?} contains {c:?}; use letters, digits and '_' (a store name is part \
             of its changelog topic `<topology>-<store>-changelog`, where '-' or '.' could make two \
             changelogs collide)"
        ));
    }
    Ok(())
}

/// Kafka's own rule for topic names.
fn check_topic(topic: &str) -> Result<(), String> {
    if topic.is_empty() || topic.len() > 249 || topic == "." || topic == ".." {
        return Err("not a valid Kafka topic name (1 to 249 characters, not \".\" or \"..\")".into());
    }
    if let Some(c) = topic
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "{c:?} is not allowed in a Kafka topic name (letters, digits, '.', '_', '-')"
        ));
    }
    Ok(())
}

/// `64MiB`, `512KiB`, `1GiB`, `1000000` (bytes), `10MB`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| "expected a number with an optional unit, e.g. \"64MiB\"".to_string())?;
    let factor: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => return Err(format!("unknown unit {other:?}; use B, KiB, MiB, GiB, KB, MB or GB")),
    };
    number
        .checked_mul(factor)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| "too large".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("10 MB"), Ok(10_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("3 parsecs").unwrap_err().contains("unknown unit"));
    }

    #[test]
    fn a_global_stores_topic_is_bound_under_sources() {
        let d = Description::new("g")
            .source("orders")
            .sink("out")
            .global_store("customers", "customer_table");
        let text = "name = \"g\"\ncomponent = \"g.wasm\"\n[sources]\norders = \"o\"\ncustomer_table = \"c\"\n[sinks]\nout = \"x\"\n";
        let b = Manifest::parse(text, "g.toml", Path::new("/deploy"))
            .unwrap()
            .bind(&d)
            .unwrap();
        assert_eq!(b.source_topics, vec!["o".to_string()]);
        assert_eq!(b.global_topics, vec!["c".to_string()]);
        let missing = "name = \"g\"\ncomponent = \"g.wasm\"\n[sources]\norders = \"o\"\n[sinks]\nout = \"x\"\n";
        let e = Manifest::parse(missing, "g.toml", Path::new("/deploy"))
            .unwrap()
            .bind(&d)
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("\"customer_table\", but the manifest does not bind it"),
            "{e}"
        );
    }

    /// Every `tests/manifests/*.toml` is checked against the description of `uppercase`
    /// (source `input`, sink `output`); a file with a `.err` beside it must fail with
    /// exactly that text, one without must pass.
    #[test]
    fn manifest_ui_cases() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/manifests");
        let description = Description::new("uppercase").source("input").sink("output");
        let mut cases = 0;
        let mut entries: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for path in entries
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        {
            cases += 1;
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let text = std::fs::read_to_string(&path).unwrap();
            let result = Manifest::parse(&text, &name, Path::new("/deploy")).and_then(|m| m.bind(&description));
            let expected = std::fs::read_to_string(path.with_extension("err")).ok();
            match (result, expected) {
                (Ok(_), None) => {}
                (Err(e), Some(expected)) => assert_eq!(e.to_string(), expected.trim_end(), "{name}"),
                (Ok(_), Some(expected)) => panic!("{name} passed, but should fail with: {expected}"),
                (Err(e), None) => panic!("{name} failed: {e}"),
            }
        }
        assert!(cases >= 8, "only {cases} manifest cases in {}", dir.display());
    }
}
