//! `sluice deploy` and `sluice topologies list|describe|delete`: the cluster's registry of
//! uploaded topologies, through any worker's admin API.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;

use sluice::admin::client::{self as http, Body};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// Where a worker's admin API is.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// A worker's admin address (what it was started with as `--metrics`).
    #[arg(long, env = "SLUICE_ADMIN", value_name = "HOST:PORT")]
    admin: String,
    /// The caller's token (a tenant's or the admin's), when the cluster requires one.
    #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The CA (PEM) to check an `https://` admin address's certificate against.
    #[arg(long, env = "SLUICE_ADMIN_CA", value_name = "FILE.pem")]
    ca: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
}

impl AdminArgs {
    /// The client for this address (trusting `--ca` for an `https://` one).
    fn client(&self) -> anyhow::Result<http::Client> {
        http::Client::new(self.ca.as_deref())
    }
}

#[derive(Debug, Args)]
pub struct DeployArgs {
    /// The topology's component (`.wasm`, built for wasm32-wasip2).
    component: PathBuf,
    /// The topology's manifest (its `component` line, if any, is not used).
    #[arg(long, value_name = "FILE.toml")]
    manifest: PathBuf,
    /// Reprocess: this version's tasks start reading at `earliest`, `latest`, `offset:N`
    /// or `timestamp:MILLIS|RFC3339` (in a fresh consumer group; state is kept). Without
    /// it, an upgrade goes on where the version before stopped.
    #[arg(long, value_name = "POSITION")]
    reprocess_from: Option<String>,
    #[command(flatten)]
    admin: AdminArgs,
}

#[derive(Debug, Args)]
pub struct TopologiesArgs {
    #[command(subcommand)]
    action: TopologiesAction,
}

#[derive(Debug, Subcommand)]
enum TopologiesAction {
    /// Every uploaded topology.
    List(AdminArgs),
    /// One uploaded topology: version, component, bindings, manifest.
    Describe {
        name: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Delete an uploaded topology: every worker stops its tasks. Its topics stay, and so
    /// do the ones the host made for it (changelogs, repartition topics), unless
    /// `--purge-internal`.
    Delete {
        name: String,
        /// Also delete its changelogs and repartition topics, once no worker runs its tasks
        /// (a deploy of the same name then starts from empty state).
        #[arg(long)]
        purge_internal: bool,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

/// An upload or a request may take a while (compiling a large component).
const TIMEOUT: Duration = Duration::from_secs(300);

pub async fn deploy(args: DeployArgs) -> anyhow::Result<ExitCode> {
    let manifest = std::fs::read_to_string(&args.manifest)
        .with_context(|| format!("reading manifest {}", args.manifest.display()))?;
    let component =
        std::fs::read(&args.component).with_context(|| format!("reading component {}", args.component.display()))?;
    let boundary = format!("sluice-{}", uuid::Uuid::new_v4().simple());
    let mut body = Vec::with_capacity(component.len() + manifest.len() + 512);
    let file_name = |p: &std::path::Path| {
        // Only for messages: quotes and line breaks would break the part's header.
        p.file_name()
            .map(|n| n.to_string_lossy().replace(['"', '\r', '\n'], "_"))
            .unwrap_or_default()
    };
    for (name, file, content_type, bytes) in [
        (
            "manifest",
            file_name(&args.manifest),
            "application/toml",
            manifest.as_bytes(),
        ),
        (
            "component",
            file_name(&args.component),
            "application/wasm",
            &component[..],
        ),
    ] {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{file}\"\r\nContent-Type: {content_type}\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    let size = component.len();
    let progress = progress_bar(body.len() as u64, &args.admin);
    // Checked in the background: the answer comes once the upload is read, and the job is
    // followed (its compile's progress shown) until it ends.
    let path = match &args.reprocess_from {
        Some(from) => {
            let from: sluice::manifest::StartFrom = from.parse().map_err(|e: String| anyhow::anyhow!(e))?;
            format!("/v1/topologies?background=true&reprocess_from={from}")
        }
        None => "/v1/topologies?background=true".to_string(),
    };
    let (status, answer) = http::Request::new(hyper::Method::POST, &args.admin.admin, &path)
        .bearer(args.admin.token.as_deref())
        .body(Body {
            content_type: format!("multipart/form-data; boundary={boundary}"),
            bytes: body,
            progress: progress.clone(),
        })
        .timeout(TIMEOUT)
        .send(&args.admin.client()?)
        .await?;
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let mut json: Value = parse(&answer)?;
    if !status.is_success() {
        anyhow::bail!(
            "{} refused the upload ({status}): {}",
            args.admin.admin,
            error_text(&json)
        );
    }
    let mut status = status;
    if status == hyper::StatusCode::ACCEPTED {
        (status, json) = follow_upload(&args.admin, &json).await?;
    }
    match args.admin.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&json)?),
        Output::Text => {
            let what = if status == hyper::StatusCode::CREATED {
                "deployed"
            } else {
                "unchanged (the same component and manifest are deployed)"
            };
            println!(
                "{} version {} {what}: {} tasks, component {} ({size} bytes)",
                json["name"].as_str().unwrap_or("?"),
                json["version"],
                json["partitions"],
                short(json["digest"].as_str().unwrap_or("")),
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Follows a background upload's job until it ends: the status and entry the upload would
/// have answered, or its error. On a terminal, a spinner shows the compile's progress (from
/// the worker's `GET /status`).
async fn follow_upload(admin: &AdminArgs, job: &Value) -> anyhow::Result<(hyper::StatusCode, Value)> {
    use std::io::IsTerminal;
    let id = job["id"]
        .as_str()
        .context("the upload's answer has no job id")?
        .to_string();
    let topology = job["topology"].as_str().unwrap_or("?").to_string();
    let spinner = (!matches!(admin.output, Output::Json) && std::io::stderr().is_terminal()).then(|| {
        let s = indicatif::ProgressBar::new_spinner();
        s.enable_steady_tick(Duration::from_millis(120));
        s
    });
    let started = std::time::Instant::now();
    let job = loop {
        let job = call(admin, hyper::Method::GET, &format!("/v1/uploads/{id}")).await?;
        if job["state"].as_str() != Some("checking") {
            break job;
        }
        if let Some(s) = &spinner {
            let compiling = call(admin, hyper::Method::GET, "/status").await.ok().and_then(|st| {
                st["compiles"]
                    .as_array()?
                    .iter()
                    .find(|c| {
                        c["topology"].as_str() == Some(topology.as_str()) && c["state"].as_str() == Some("compiling")
                    })
                    .cloned()
            });
            s.set_message(match compiling {
                Some(c) => match c["progress"].as_f64() {
                    Some(p) => format!(
                        "{topology}: compiling, about {:.0}% ({:.1} s of about {:.0} s)",
                        p * 100.0,
                        c["seconds"].as_f64().unwrap_or(0.0),
                        c["expected_seconds"].as_f64().unwrap_or(0.0)
                    ),
                    None => format!("{topology}: compiling ({:.1} s)", c["seconds"].as_f64().unwrap_or(0.0)),
                },
                None => format!("{topology}: checking ({:.1} s)", started.elapsed().as_secs_f64()),
            });
        }
        if started.elapsed() > TIMEOUT {
            anyhow::bail!(
                "the upload of {topology} was still being checked after {}s (job {id} on {})",
                TIMEOUT.as_secs(),
                admin.admin
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    if let Some(s) = spinner {
        s.finish_and_clear();
    }
    match job["state"].as_str() {
        Some("stored") => Ok((hyper::StatusCode::CREATED, job["entry"].clone())),
        Some("unchanged") => Ok((hyper::StatusCode::OK, job["entry"].clone())),
        _ => {
            // As the upload would have answered it.
            let e = &job["error"];
            let status = e["status"]
                .as_u64()
                .and_then(|s| hyper::StatusCode::from_u16(s as u16).ok())
                .map_or_else(|| e["status"].to_string(), |s| s.to_string());
            anyhow::bail!("{} refused the upload ({status}): {}", admin.admin, error_text(e))
        }
    }
}

/// A progress bar for an upload on a terminal (none otherwise, or for JSON output).
fn progress_bar(len: u64, admin: &AdminArgs) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    if matches!(admin.output, Output::Json) || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}) {elapsed}",
        )
        .expect("a valid template")
        .progress_chars("#>-"),
    );
    bar.set_message("uploading");
    Some(bar)
}

/// A request without a body to the admin API; the answer's JSON, or an error naming the
/// worker, the status and the API's message.
async fn call(admin: &AdminArgs, method: hyper::Method, path: &str) -> anyhow::Result<Value> {
    let (status, answer) = http::Request::new(method, &admin.admin, path)
        .bearer(admin.token.as_deref())
        .timeout(TIMEOUT)
        .send(&admin.client()?)
        .await?;
    let json = parse(&answer)?;
    if !status.is_success() {
        anyhow::bail!("{} ({status}): {}", admin.admin, error_text(&json));
    }
    Ok(json)
}

fn parse(answer: &[u8]) -> anyhow::Result<Value> {
    serde_json::from_slice(answer).with_context(|| {
        format!(
            "the worker answered something other than JSON: {}",
            String::from_utf8_lossy(&answer[..answer.len().min(300)])
        )
    })
}

fn error_text(json: &Value) -> String {
    match (json["error"].as_str(), json["message"].as_str()) {
        (Some(kind), Some(message)) => format!("{message} [{kind}]"),
        _ => json.to_string(),
    }
}

fn short(digest: &str) -> &str {
    &digest[..digest.len().min(12)]
}

pub async fn topologies(args: TopologiesArgs) -> anyhow::Result<ExitCode> {
    let (method, path, admin) = match &args.action {
        TopologiesAction::List(admin) => (hyper::Method::GET, "/v1/topologies".to_string(), admin),
        TopologiesAction::Describe { name, admin } => (hyper::Method::GET, format!("/v1/topologies/{name}"), admin),
        TopologiesAction::Delete {
            name,
            purge_internal,
            admin,
        } => {
            let query = if *purge_internal { "?purge-internal=true" } else { "" };
            (hyper::Method::DELETE, format!("/v1/topologies/{name}{query}"), admin)
        }
    };
    let json = call(admin, method, &path).await?;
    if matches!(admin.output, Output::Json) {
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(ExitCode::SUCCESS);
    }
    match &args.action {
        TopologiesAction::List(_) => {
            println!(
                "{:<32} {:>7} {:>5} {:<12} {:>10}  SOURCES -> SINKS",
                "NAME", "VERSION", "TASKS", "COMPONENT", "BYTES"
            );
            for t in json.as_array().into_iter().flatten() {
                println!(
                    "{:<32} {:>7} {:>5} {:<12} {:>10}  {} -> {}",
                    t["name"].as_str().unwrap_or("?"),
                    t["version"],
                    t["partitions"],
                    short(t["digest"].as_str().unwrap_or("")),
                    t["size"],
                    list(&t["sources"]),
                    list(&t["sinks"]),
                );
            }
        }
        TopologiesAction::Describe { .. } => {
            println!("name:       {}", json["name"].as_str().unwrap_or("?"));
            println!("version:    {}", json["version"]);
            println!("tasks:      {}", json["partitions"]);
            println!(
                "component:  {} ({} bytes)",
                json["digest"].as_str().unwrap_or("?"),
                json["size"]
            );
            println!("sources:    {}", list(&json["sources"]));
            println!("sinks:      {}", list(&json["sinks"]));
            println!("stores:     {}", list(&json["stores"]));
            print_subtopologies(&json);
            println!("manifest:");
            for line in json["manifest"].as_str().unwrap_or("").lines() {
                println!("  {line}");
            }
            println!();
            println!("{:<40} {:<8} {:<10} {:>10}  WORKER", "TASK", "ROLE", "PHASE", "LAG");
            for t in json["tasks"].as_array().into_iter().flatten() {
                let text = |v: &Value| v.as_str().map(str::to_string).unwrap_or_else(|| "-".into());
                println!(
                    "{:<40} {:<8} {:<10} {:>10}  {}",
                    text(&t["task"]),
                    text(&t["role"]),
                    text(&t["phase"]),
                    t["lag"].as_i64().map_or("-".to_string(), |l| l.to_string()),
                    text(&t["worker"]),
                );
            }
            let unassigned: Vec<String> = json["unassigned"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| t.as_str().map_or_else(|| t.to_string(), str::to_string))
                .collect();
            if !unassigned.is_empty() {
                println!("no active copy of tasks: {}", unassigned.join(", "));
            }
            for p in json["problems"].as_array().into_iter().flatten() {
                println!("problem: {}", p.as_str().unwrap_or("?"));
            }
        }
        TopologiesAction::Delete { name, .. } => {
            println!(
                "{name} version {} deleted: its tasks stop on every worker",
                json["version"]
            );
            if let Some(purged) = json["purged"].as_array() {
                println!("deleted its internal topics: {}", list(&Value::Array(purged.clone())));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The sub-topologies of a described topology, with their internal topics by the names
/// the host gives them, and what the component says of its operators (in the manner of
/// Kafka Streams' `Topology#describe()`).
fn print_subtopologies(json: &Value) {
    let name = json["name"].as_str().unwrap_or("?");
    let internal: Vec<&str> = json["internal_topics"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    // A logical name, and the topic an internal one is (`<topology>-<name>-repartition`).
    let topic = |logical: &str| {
        if internal.contains(&logical) {
            format!(
                "{logical} (internal: {})",
                sluice::manifest::repartition_topic(name, logical)
            )
        } else {
            logical.to_string()
        }
    };
    let topics = |v: &Value| -> String {
        let items: Vec<String> = v
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(topic)
            .collect();
        if items.is_empty() {
            "-".to_string()
        } else {
            items.join(", ")
        }
    };
    let operators = |v: &Value| {
        for line in v.as_array().into_iter().flatten().filter_map(Value::as_str) {
            println!("      {line}");
        }
    };
    match json["subtopologies"].as_array().filter(|s| !s.is_empty()) {
        Some(subs) => {
            println!("sub-topologies:");
            for sub in subs {
                println!(
                    "  {} ({} tasks)",
                    sub["name"].as_str().unwrap_or("?"),
                    sub["partitions"]
                );
                println!("    reads:  {}", topics(&sub["sources"]));
                println!("    writes: {}", topics(&sub["sinks"]));
                println!("    stores: {}", list(&sub["stores"]));
                if sub["operators"].as_array().is_some_and(|o| !o.is_empty()) {
                    println!("    operators:");
                    operators(&sub["operators"]);
                }
            }
        }
        None if json["operators"].as_array().is_some_and(|o| !o.is_empty()) => {
            println!("operators:");
            operators(&json["operators"]);
        }
        None => {}
    }
}

fn list(v: &Value) -> String {
    let items: Vec<&str> = v.as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    if items.is_empty() {
        "-".to_string()
    } else {
        items.join(", ")
    }
}

#[derive(Debug, Args)]
pub struct TenantsArgs {
    #[command(subcommand)]
    action: TenantsAction,
}

#[derive(Debug, Subcommand)]
enum TenantsAction {
    /// The tenants this caller may see (the admin sees all), with their limits and usage.
    List(AdminArgs),
    /// Print the hashed form of a token, for the configuration file's `tokens`.
    HashToken { token: String },
    /// Create a tenant (or change one created this way) through the API; every worker of
    /// the cluster learns of it from the registry. Admin only.
    Create(Box<CreateTenantArgs>),
    /// Delete a tenant created through the API (it must have no topologies). Admin only.
    Delete {
        name: String,
        #[command(flatten)]
        admin: AdminArgs,
    },
}

#[derive(Debug, Args)]
pub struct CreateTenantArgs {
    name: String,
    /// Its topic prefix: its topology names and every topic it binds start with it.
    #[arg(long)]
    namespace: String,
    /// A token of the tenant (repeat for several); only its SHA-256 is sent and stored.
    #[arg(long = "tenant-token", value_name = "TOKEN")]
    tenant_tokens: Vec<String>,
    /// A token already hashed (`sluice tenants hash-token`); repeat for several.
    #[arg(long = "tenant-token-hash", value_name = "sha256:HEX")]
    tenant_token_hashes: Vec<String>,
    #[arg(long)]
    max_topologies: Option<u32>,
    #[arg(long)]
    max_tasks: Option<u32>,
    /// Linear memory of one instance, e.g. `64MiB`.
    #[arg(long)]
    max_memory: Option<String>,
    /// Deadline of one guest call, e.g. `2s`.
    #[arg(long)]
    max_call_timeout: Option<String>,
    /// State of one topology's tasks on one worker, e.g. `1GiB`.
    #[arg(long)]
    max_state: Option<String>,
    #[arg(long)]
    max_records_per_second: Option<u32>,
    #[arg(long)]
    max_deploys_per_minute: Option<u32>,
    #[command(flatten)]
    admin: AdminArgs,
}

pub async fn tenants(args: TenantsArgs) -> anyhow::Result<ExitCode> {
    let admin = match args.action {
        TenantsAction::HashToken { token } => {
            println!("{}", sluice::registry::tenants::hash_token(&token));
            return Ok(ExitCode::SUCCESS);
        }
        TenantsAction::List(admin) => admin,
        TenantsAction::Create(create) => {
            let c = *create;
            let mut tokens: Vec<String> = c
                .tenant_tokens
                .iter()
                .map(|t| sluice::registry::tenants::hash_token(t))
                .collect();
            tokens.extend(c.tenant_token_hashes);
            let body = serde_json::json!({
                "name": c.name,
                "namespace": c.namespace,
                "tokens": tokens,
                "max-topologies": c.max_topologies,
                "max-tasks": c.max_tasks,
                "max-memory": c.max_memory,
                "max-call-timeout": c.max_call_timeout,
                "max-state": c.max_state,
                "max-records-per-second": c.max_records_per_second,
                "max-deploys-per-minute": c.max_deploys_per_minute,
            });
            // Unset limits are left out (the tenant has none).
            let body: serde_json::Map<String, Value> = body
                .as_object()
                .expect("an object")
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let (status, answer) = http::Request::new(hyper::Method::POST, &c.admin.admin, "/v1/tenants")
                .bearer(c.admin.token.as_deref())
                .body(Body {
                    content_type: "application/json".into(),
                    bytes: serde_json::to_vec(&body)?,
                    progress: None,
                })
                .timeout(TIMEOUT)
                .send(&c.admin.client()?)
                .await?;
            let json = parse(&answer)?;
            if !status.is_success() {
                anyhow::bail!("{} refused the tenant ({status}): {}", c.admin.admin, error_text(&json));
            }
            match c.admin.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&json)?),
                Output::Text => println!(
                    "tenant {} {} (namespace {})",
                    c.name,
                    if status == hyper::StatusCode::CREATED {
                        "created"
                    } else {
                        "changed"
                    },
                    c.namespace
                ),
            }
            return Ok(ExitCode::SUCCESS);
        }
        TenantsAction::Delete { name, admin } => {
            let json = call(&admin, hyper::Method::DELETE, &format!("/v1/tenants/{name}")).await?;
            match admin.output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&json)?),
                Output::Text => println!("tenant {name} deleted"),
            }
            return Ok(ExitCode::SUCCESS);
        }
    };
    let json = call(&admin, hyper::Method::GET, "/v1/tenants").await?;
    match admin.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&json)?),
        Output::Text => {
            println!(
                "{:<20} {:<20} {:>10} {:>6} {:>10} {:>10} {:>12} {:>10} {:>12}",
                "TENANT",
                "NAMESPACE",
                "TOPOLOGIES",
                "TASKS",
                "MAX TOPOS",
                "MAX TASKS",
                "MAX MEMORY",
                "MAX REC/S",
                "MAX STATE"
            );
            for t in json.as_array().into_iter().flatten() {
                let or_dash = |v: &Value| if v.is_null() { "-".to_string() } else { v.to_string() };
                println!(
                    "{:<20} {:<20} {:>10} {:>6} {:>10} {:>10} {:>12} {:>10} {:>12}",
                    t["name"].as_str().unwrap_or("?"),
                    t["namespace"].as_str().unwrap_or("?"),
                    t["topologies"],
                    t["tasks"],
                    or_dash(&t["max_topologies"]),
                    or_dash(&t["max_tasks"]),
                    or_dash(&t["max_memory"]),
                    or_dash(&t["max_records_per_second"]),
                    or_dash(&t["max_state"]),
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct QueryArgs {
    /// The topology.
    topology: String,
    /// One of its stores.
    store: String,
    /// The key to look up (as text); leave it out for a range.
    key: Option<String>,
    /// A range: keys from this one (inclusive)…
    #[arg(long, conflicts_with = "key")]
    from: Option<String>,
    /// …to this one (exclusive).
    #[arg(long, conflicts_with = "key")]
    to: Option<String>,
    /// Most entries a range answers.
    #[arg(long, default_value_t = 1000)]
    limit: usize,
    #[command(flatten)]
    admin: AdminArgs,
}

/// `sluice query`: a key (or a range) of a topology's store, as committed on the workers
/// that run its tasks.
pub async fn query(args: QueryArgs) -> anyhow::Result<ExitCode> {
    let enc = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    let mut path = format!(
        "/v1/topologies/{}/stores/{}?limit={}",
        args.topology, args.store, args.limit
    );
    for (name, value) in [("key_hex", &args.key), ("from_hex", &args.from), ("to_hex", &args.to)] {
        if let Some(v) = value {
            path.push_str(&format!("&{name}={}", enc(v)));
        }
    }
    let admin = &args.admin;
    let json = call(admin, hyper::Method::GET, &path).await?;
    match admin.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&json)?),
        Output::Text => {
            println!("{:>9}  {:<40} {:<14} VALUE", "PARTITION", "KEY", "TIMESTAMP");
            for e in json["entries"].as_array().into_iter().flatten() {
                let text_or_hex = |t: &Value, h: &Value| {
                    t.as_str()
                        .filter(|s| !s.chars().any(char::is_control))
                        .map_or_else(|| format!("0x{}", h.as_str().unwrap_or("")), str::to_string)
                };
                let timestamp = e["timestamp"]
                    .as_i64()
                    .map_or_else(|| "-".to_string(), |t| t.to_string());
                println!(
                    "{:>9}  {:<40} {:<14} {}",
                    e["partition"],
                    text_or_hex(&e["key"], &e["key_hex"]),
                    timestamp,
                    text_or_hex(&e["value"], &e["value_hex"])
                );
            }
            let missing = json["partitions_missing"].as_array().map_or(0, Vec::len);
            if missing > 0 {
                eprintln!(
                    "note: partitions {} did not answer (restoring, moving, or their worker is unreachable)",
                    json["partitions_missing"]
                );
            }
        }
    }
    if args.key.is_some() && json["entries"].as_array().is_none_or(Vec::is_empty) {
        eprintln!(
            "{}: no such key in {}/{}",
            args.key.as_deref().unwrap_or(""),
            args.topology,
            args.store
        );
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}
