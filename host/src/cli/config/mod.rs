//! One configuration file for a worker: its settings under Kafka-style dotted keys
//! (`num.standby.replicas`, `processing.guarantee`, `scale.down.timeout.ms`…), its tenants
//! and their limits. Settings are layered: built-in defaults < the file < the environment
//! (`SLUICE_NUM_STANDBY_REPLICAS`, …) < flags. The file is read and checked once, before
//! the worker starts: an unknown key is refused by name, a value of the wrong type or out
//! of range names its key. `sluice config show` prints every setting with its origin.
//!
//! Every setting is a flag of `sluice worker` (see [`SETTINGS`]); a value from the file is
//! parsed by the flag's own parser, so the file, the environment and the command line
//! accept the same values.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Command, CommandFactory, FromArgMatches};
use sluice::registry::tenants::TenancyConfig;

use super::topologies::Output;
use super::worker::WorkerSettings;
use super::Cli;

mod settings;

use settings::Kind;
pub use settings::{Setting, SETTINGS};

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    Default,
    File,
    Env(String),
    Flag,
    /// Not set anywhere, and no default: the worker works it out (see the flag's help).
    Unset,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Default => f.write_str("default"),
            Origin::File => f.write_str("file"),
            Origin::Env(name) => write!(f, "env {name}"),
            Origin::Flag => f.write_str("flag"),
            Origin::Unset => f.write_str("unset"),
        }
    }
}

/// The configuration file's contribution, once checked.
#[derive(Debug, Clone, Default)]
pub struct Layered {
    pub file: Option<PathBuf>,
    /// The file's `[admin] tokens` and `[tenants.*]`.
    pub tenancy: TenancyConfig,
    /// Each setting's origin, by key.
    pub origins: BTreeMap<&'static str, Origin>,
    /// Each setting's value as written (a list joined with `,`; `-` when unset), by key.
    pub values: BTreeMap<&'static str, String>,
}

impl Layered {
    /// How many settings the file decided.
    pub fn decided_by_file(&self) -> usize {
        self.origins.values().filter(|o| **o == Origin::File).count()
    }
}

/// The environment variable of a setting without one of its own: `SLUICE_` and the key
/// in capitals with `_` for `.`.
pub fn env_name(key: &str) -> String {
    format!("SLUICE_{}", key.to_ascii_uppercase().replace('.', "_"))
}

/// Gives every setting of `cmd` (a command with `WorkerSettings` flattened in) an
/// environment variable, unless its flag declares one already (`KAFKA_BOOTSTRAP`, …).
fn with_env(mut cmd: Command) -> Command {
    for setting in SETTINGS {
        cmd = cmd.mut_arg(setting.arg, |a| {
            if a.get_env().is_some() {
                a
            } else {
                // A negated flag keeps the flag's sense (`SLUICE_NO_POOLING=true`).
                let name = match setting.kind {
                    Kind::NotFlag => format!("SLUICE_{}", setting.arg.to_ascii_uppercase()),
                    _ => env_name(setting.key),
                };
                // Leaked once per setting at start: clap keeps `&'static str` names.
                a.env(&*Box::leak(name.into_boxed_str()))
            }
        });
    }
    cmd
}

/// The `sluice` command with every worker setting's environment variable.
pub fn command() -> Command {
    Cli::command()
        .mut_subcommand("worker", with_env)
        .mut_subcommand("config", |c| c.mut_subcommand("show", with_env))
}

/// Parses the command line with the configuration file layered under the environment and
/// flags. Exits (as clap does) on a command-line error or `--help`; returns an error naming
/// the file and key when the file is wrong.
pub fn parse(argv: Vec<OsString>) -> anyhow::Result<(Cli, Layered)> {
    let cmd = command();
    // A first, lenient pass: which subcommand, what its settings' sources are, which file.
    let pre = cmd.clone().ignore_errors(true).try_get_matches_from(&argv).ok();
    let settings = pre.as_ref().and_then(|m| match m.subcommand() {
        Some(("worker", w)) if w.subcommand().is_none() => Some(("worker", w)),
        Some(("config", c)) => match c.subcommand() {
            Some(("show", show)) => Some(("config show", show)),
            _ => None,
        },
        _ => None,
    });
    let mut layered = Layered::default();
    let mut argv = argv;
    let mut from_file = BTreeSet::new();
    if let Some((path, m)) = settings {
        let sub = match path {
            "worker" => cmd.find_subcommand("worker"),
            _ => cmd.find_subcommand("config").and_then(|c| c.find_subcommand("show")),
        }
        .expect("the subcommand exists");
        if let Ok(Some(file)) = m.try_get_one::<PathBuf>("config") {
            let text = std::fs::read_to_string(file)
                .map_err(|e| anyhow::anyhow!("cannot read configuration file {}: {e}", file.display()))?;
            let (extra, keys, tenancy) = layer(sub, m, file, &text)?;
            argv.extend(extra);
            from_file = keys;
            layered.file = Some(file.clone());
            layered.tenancy = tenancy;
        }
    }
    let matches = cmd.try_get_matches_from(&argv).unwrap_or_else(|e| e.exit());
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let sub = match matches.subcommand() {
        Some(("worker", w)) => Some(w),
        Some(("config", c)) => c.subcommand().map(|(_, m)| m),
        _ => None,
    };
    if let Some(m) = sub {
        let worker = command();
        let worker = worker.find_subcommand("worker").expect("worker");
        layered.origins = origins(worker, m, &from_file);
        layered.values = SETTINGS
            .iter()
            .filter(|s| m.try_contains_id(s.arg).is_ok())
            .map(|s| {
                let value = shown(s, m);
                // Secrets are never printed: only whether one is set.
                let secret = s.key.ends_with(".secret") || s.key.ends_with(".password");
                (
                    s.key,
                    if secret && value != "-" {
                        "(set)".to_string()
                    } else {
                        value
                    },
                )
            })
            .collect();
    }
    Ok((cli, layered))
}

/// Each setting's origin in the final matches `m` of a command with the settings of `cmd`.
fn origins(cmd: &Command, m: &ArgMatches, from_file: &BTreeSet<&'static str>) -> BTreeMap<&'static str, Origin> {
    SETTINGS
        .iter()
        .filter(|s| m.try_contains_id(s.arg).is_ok())
        .map(|s| {
            let origin = if from_file.contains(s.key) {
                Origin::File
            } else {
                match m.value_source(s.arg) {
                    Some(ValueSource::CommandLine) => Origin::Flag,
                    Some(ValueSource::EnvVariable) => {
                        let env = cmd
                            .get_arguments()
                            .find(|a| a.get_id() == s.arg)
                            .and_then(|a| a.get_env());
                        Origin::Env(env.map_or_else(|| env_name(s.key), |e| e.to_string_lossy().into_owned()))
                    }
                    Some(ValueSource::DefaultValue) => Origin::Default,
                    _ => Origin::Unset,
                }
            };
            (s.key, origin)
        })
        .collect()
}

/// A setting's value as the command line would write it.
fn shown(s: &Setting, m: &ArgMatches) -> String {
    let raw: Vec<String> = m
        .get_raw(s.arg)
        .map(|raw| raw.map(|v| v.to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    let value = raw.join(",");
    match (s.kind, value.as_str()) {
        (Kind::NotFlag, "true") => "false".into(),
        (Kind::NotFlag, "false") => "true".into(),
        (_, "") => "-".into(),
        _ => value,
    }
}

/// Reads the file's settings for the subcommand `sub` (lenient matches `m`): the flags to
/// add to the command line for the settings no flag or variable sets, the keys the file
/// decides, and its tenancy sections.
fn layer(
    sub: &Command,
    m: &ArgMatches,
    file: &Path,
    text: &str,
) -> anyhow::Result<(Vec<OsString>, BTreeSet<&'static str>, TenancyConfig)> {
    let bad = |e: String| anyhow::anyhow!("configuration file {}: {e}", file.display());
    let mut table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| bad(format!("not valid TOML: {e}")))?;
    let tenancy = split_tenancy(&mut table).map_err(bad)?;
    let mut leaves = Vec::new();
    flatten("", table, &mut leaves);
    let base = file.parent().unwrap_or(Path::new("."));
    let mut extra = Vec::new();
    let mut decided = BTreeSet::new();
    for (key, value) in leaves {
        let Some(setting) = SETTINGS.iter().find(|s| s.key == key) else {
            return Err(bad(unknown(&key)));
        };
        let arg = sub
            .get_arguments()
            .find(|a| a.get_id() == setting.arg)
            .expect("every setting is an argument");
        let values = values(setting, &value, base).map_err(|e| bad(format!("{key} = {value}: {e}")))?;
        // Checked with the flag's own parser, so the error names the key, not the flag.
        let long = format!("--{}", arg.get_long().expect("settings have long flags"));
        let check = Command::new("sluice")
            .no_binary_name(true)
            .arg(arg.clone().env(None::<&str>));
        for v in values.iter().filter_map(|v| v.as_ref()) {
            let mut flag = OsString::from(format!("{long}="));
            flag.push(v);
            if let Err(e) = check.clone().try_get_matches_from([flag]) {
                let message = e.to_string();
                let message = message.lines().next().unwrap_or_default().trim_start_matches("error: ");
                return Err(bad(format!("{key} = {value}: {message}")));
            }
        }
        // A flag or variable sets it: the file yields.
        if matches!(
            m.value_source(setting.arg),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        ) {
            continue;
        }
        decided.insert(setting.key);
        for v in values {
            match v {
                Some(v) => {
                    let mut flag = OsString::from(format!("{long}="));
                    flag.push(v);
                    extra.push(flag);
                }
                None => extra.push(OsString::from(&long)),
            }
        }
    }
    Ok((extra, decided, tenancy))
}

/// Takes the tenancy sections (`[admin] tokens`, `[tenants.*]`) out of a file's table, to
/// their own parser.
fn split_tenancy(table: &mut toml::Table) -> Result<TenancyConfig, String> {
    let mut tenancy = toml::Table::new();
    if let Some(tenants) = table.remove("tenants") {
        tenancy.insert("tenants".into(), tenants);
    }
    if let Some(toml::Value::Table(admin)) = table.get_mut("admin") {
        if let Some(tokens) = admin.remove("tokens") {
            tenancy.insert(
                "admin".into(),
                toml::Value::Table([("tokens".to_string(), tokens)].into_iter().collect()),
            );
        }
    }
    toml::Value::Table(tenancy)
        .try_into()
        .map_err(|e: toml::de::Error| e.to_string().trim().to_string())
}

/// The tenancy sections of configuration file `file` (for commands other than the worker).
pub fn tenancy_of(file: &Path) -> anyhow::Result<TenancyConfig> {
    let bad = |e: String| anyhow::anyhow!("configuration file {}: {e}", file.display());
    let text = std::fs::read_to_string(file).map_err(|e| bad(e.to_string()))?;
    let mut table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| bad(format!("not valid TOML: {e}")))?;
    split_tenancy(&mut table).map_err(bad)
}

/// `a.b.c` for every non-table value under `prefix`.
fn flatten(prefix: &str, table: toml::Table, out: &mut Vec<(String, toml::Value)>) {
    for (k, v) in table {
        let key = if prefix.is_empty() { k } else { format!("{prefix}.{k}") };
        match v {
            toml::Value::Table(t) => flatten(&key, t, out),
            v => out.push((key, v)),
        }
    }
}

/// The flag values a file value stands for: `Some(text)` is `--flag=text`, `None` is a
/// bare `--flag`.
fn values(setting: &Setting, value: &toml::Value, base: &Path) -> Result<Vec<Option<OsString>>, String> {
    use toml::Value as V;
    let text = |v: &V| -> Result<String, String> {
        match v {
            V::String(s) => Ok(s.clone()),
            V::Integer(i) => Ok(i.to_string()),
            other => Err(format!("expected a string or an integer, found {}", other.type_str())),
        }
    };
    let path = |v: &V| -> Result<OsString, String> {
        match v {
            V::String(s) => Ok(base.join(s).into_os_string()),
            other => Err(format!("expected a path (a string), found {}", other.type_str())),
        }
    };
    let flag = |v: &V| -> Result<bool, String> {
        v.as_bool()
            .ok_or_else(|| format!("expected true or false, found {}", v.type_str()))
    };
    Ok(match setting.kind {
        Kind::Value | Kind::Bytes => vec![Some(text(value)?.into())],
        Kind::Millis => match value {
            V::Integer(ms) if *ms >= 0 => vec![Some(format!("{ms}ms").into())],
            V::Integer(_) => return Err("a duration cannot be negative".into()),
            V::String(s) => vec![Some(s.into())],
            other => {
                return Err(format!(
                    "expected milliseconds or a duration like \"1s\", found {}",
                    other.type_str()
                ))
            }
        },
        Kind::Flag => {
            if flag(value)? {
                vec![None]
            } else {
                vec![]
            }
        }
        Kind::NotFlag => {
            if flag(value)? {
                vec![]
            } else {
                vec![None]
            }
        }
        Kind::Path => vec![Some(path(value)?)],
        Kind::Paths => match value {
            V::Array(items) => items.iter().map(|v| path(v).map(Some)).collect::<Result<_, _>>()?,
            v => vec![Some(path(v)?)],
        },
    })
}

/// The error for a key no setting has, with the nearest key when one is close.
fn unknown(key: &str) -> String {
    let nearest = SETTINGS
        .iter()
        .map(|s| (distance(key, s.key), s.key))
        .min()
        .filter(|(d, _)| *d <= 3 + key.len() / 6);
    let hint = match nearest {
        Some((_, k)) => format!(" (did you mean `{k}`?)"),
        None => String::new(),
    };
    format!("unknown key `{key}`{hint}; `sluice config show` lists every setting, and tenants go under [tenants.NAME]")
}

/// Levenshtein distance, for suggestions.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// `sluice config show`: the settings a worker would start with.
#[derive(Debug, Args)]
pub struct ShowArgs {
    #[command(flatten)]
    settings: WorkerSettings,
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
}

#[derive(Debug, clap::Subcommand)]
pub enum ConfigAction {
    /// Print every worker setting (from `--config FILE`, the environment and these flags)
    /// with its value and origin, and the tenants; exit 1 if a worker would refuse them.
    Show(Box<ShowArgs>),
}

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    action: ConfigAction,
}

pub fn run(args: ConfigArgs, layered: Layered) -> anyhow::Result<ExitCode> {
    let ConfigAction::Show(show) = args.action;
    let rows = rows(&layered);
    let tenants = &layered.tenancy.tenants;
    let checked = show.settings.into_config(&layered, None);
    let jwt = checked.as_ref().ok().is_some_and(|(_, admin)| admin.jwt.is_some());
    match show.output {
        Output::Json => {
            let settings: serde_json::Map<String, serde_json::Value> = rows
                .iter()
                .map(|(key, value, origin)| {
                    (
                        key.to_string(),
                        serde_json::json!({ "value": value, "origin": origin.to_string() }),
                    )
                })
                .collect();
            let tenants: serde_json::Map<String, serde_json::Value> =
                tenants.iter().map(|(name, t)| (name.clone(), tenant_json(t))).collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&serde_json::json!({
                    "file": layered.file,
                    "settings": settings,
                    "admin_tokens": layered.tenancy.admin.tokens.len(),
                    "tenants": tenants,
                    "valid": checked.is_ok(),
                    "error": checked.as_ref().err().map(|e| format!("{e:#}")),
                }))?
            );
        }
        Output::Text => {
            match &layered.file {
                Some(file) => println!("configuration file: {}", file.display()),
                None => println!("configuration file: none (--config FILE or SLUICE_CONFIG)"),
            }
            let width = rows.iter().map(|(k, _, _)| k.len()).max().unwrap_or(0);
            let vwidth = rows.iter().map(|(_, v, _)| v.len()).max().unwrap_or(0).min(40);
            println!("{:width$}  {:vwidth$}  ORIGIN", "KEY", "VALUE");
            for (key, value, origin) in &rows {
                println!("{key:width$}  {value:vwidth$}  {origin}");
            }
            println!();
            println!(
                "admin tokens: {}{}",
                layered.tenancy.admin.tokens.len(),
                match (layered.tenancy.admin.tokens.is_empty() && tenants.is_empty(), jwt) {
                    (true, false) => " (no tokens at all: the admin API is open)",
                    (_, true) => " (and JWTs of admin.jwt.issuer)",
                    (false, false) => "",
                }
            );
            for (name, t) in tenants {
                println!("tenant {name}: {}", tenant_json(t));
            }
        }
    }
    match checked {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("sluice: a worker would refuse this configuration: {e:#}");
            Ok(ExitCode::FAILURE)
        }
    }
}

fn tenant_json(t: &sluice::registry::tenants::RawTenant) -> serde_json::Value {
    serde_json::json!({
        "namespace": t.namespace,
        "tokens": t.tokens.len(),
        "max-topologies": t.max_topologies,
        "max-tasks": t.max_tasks,
        "max-memory": t.max_memory,
        "max-call-timeout": t.max_call_timeout,
        "max-state": t.max_state,
        "max-records-per-second": t.max_records_per_second,
        "max-deploys-per-minute": t.max_deploys_per_minute,
    })
}

/// (key, value, origin) of every setting, in the order of [`SETTINGS`].
fn rows(layered: &Layered) -> Vec<(&'static str, String, Origin)> {
    SETTINGS
        .iter()
        .map(|s| {
            let value = layered.values.get(s.key).cloned().unwrap_or_else(|| "-".into());
            let origin = layered.origins.get(s.key).cloned().unwrap_or(Origin::Unset);
            (s.key, value, origin)
        })
        .collect()
}

#[cfg(test)]
mod tests;
