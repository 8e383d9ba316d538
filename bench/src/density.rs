//! Density: one worker holding many tasks (10 topologies × 100 partitions of `uppercase` by
//! default). Prints how long until every task runs, then, idle: OS threads, RSS, CPU, and
//! the worker's requests to the broker per second; then whether records still flow
//! through every topology.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::Message;

#[derive(Args)]
pub struct DensityArgs {
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    bootstrap: String,
    /// The uppercase component.
    #[arg(long)]
    component: PathBuf,
    #[arg(long, default_value_t = 10)]
    topologies: usize,
    #[arg(long, default_value_t = 100)]
    partitions: i32,
    /// Stream threads of the worker (default: its own default, the cores).
    #[arg(long)]
    threads: Option<u32>,
    /// Seconds of idle to measure.
    #[arg(long, default_value_t = 10)]
    idle_secs: u64,
    /// The worker's processing guarantee: at-least-once or exactly-once.
    #[arg(long, default_value = "at-least-once")]
    processing_guarantee: String,
    /// Then stop the worker (SIGTERM) and start it again on its state: how long until every
    /// task runs again, and whether it compiled anything (it should find the compiled code).
    #[arg(long)]
    restart: bool,
}

fn config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap);
    c
}

fn status_field(pid: u32, name: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(name))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    Some((fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?) / 100.0)
}

/// Bytes the process has sent on its sockets (a proxy for requests; see `requests`).
fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

pub(crate) fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}

/// TCP segments the host has sent so far (`/proc/net/snmp` OutSegs): over an idle minute
/// with nothing else talking to the broker, the worker's requests show up here.
fn out_segments() -> Option<u64> {
    let snmp = std::fs::read_to_string("/proc/net/snmp").ok()?;
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let names: Vec<&str> = tcp.next()?.split_whitespace().collect();
    let values: Vec<&str> = tcp.next()?.split_whitespace().collect();
    values.get(names.iter().position(|n| *n == "OutSegs")?)?.parse().ok()
}

pub async fn run(args: DensityArgs) -> anyhow::Result<()> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let admin: AdminClient<DefaultClientContext> = config(&args.bootstrap).create()?;
    let dir = std::env::temp_dir().join(format!("sluice-density-{id}"));
    std::fs::create_dir_all(&dir)?;
    let mut pairs = Vec::new();
    let mut manifests = Vec::new();
    for t in 0..args.topologies {
        let (input, output) = (format!("dense-in-{t}-{id}"), format!("dense-out-{t}-{id}"));
        let topics = [
            NewTopic::new(&input, args.partitions, TopicReplication::Fixed(1)),
            NewTopic::new(&output, args.partitions, TopicReplication::Fixed(1)),
        ];
        for r in admin.create_topics(&topics, &AdminOptions::new()).await? {
            r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
        }
        let manifest = dir.join(format!("t{t}.toml"));
        std::fs::write(
            &manifest,
            format!(
                "name = \"dense-{t}-{id}\"\ncomponent = {:?}\n[sources]\ninput = {input:?}\n[sinks]\noutput = {output:?}\n",
                args.component.display().to_string()
            ),
        )?;
        manifests.push(manifest);
        pairs.push((input, output));
    }
    let tasks = args.topologies as u64 * args.partitions as u64;
    println!(
        "density benchmark: {} topologies × {} partitions = {tasks} tasks of {} on one worker, Kafka at {}",
        args.topologies,
        args.partitions,
        args.component.display(),
        args.bootstrap
    );
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let spawn = |log_name: &str, log_filter: &str| -> anyhow::Result<std::process::Child> {
        let mut worker = Command::new(crate::sluice_binary()?);
        worker.args(["worker", "--bootstrap", &args.bootstrap]);
        for m in &manifests {
            worker.arg("--topology").arg(m);
        }
        worker
            .args(["--metrics", &format!("127.0.0.1:{port}")])
            .arg("--state-dir")
            .arg(dir.join("state"));
        if let Some(threads) = args.threads {
            worker.args(["--threads", &threads.to_string()]);
        }
        worker.args(["--processing-guarantee", &args.processing_guarantee]);
        let log = std::fs::File::create(dir.join(log_name))?;
        Ok(worker
            .env("SLUICE_LOG", log_filter)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?)
    };
    // Until the metrics say every task runs.
    let all_running = |child: &mut std::process::Child, started: Instant| -> anyhow::Result<()> {
        loop {
            let running = http_get(port, "/metrics")
                .ok()
                .and_then(|b| metric(&b, "sluice_tasks_running"));
            if running == Some(tasks as f64) {
                return Ok(());
            }
            if let Some(status) = child.try_wait()? {
                bail!("the worker exited ({status}); see {}", dir.join("worker.log").display());
            }
            if started.elapsed() > Duration::from_secs(300) {
                bail!("{running:?} of {tasks} tasks running after 300s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let mut child = spawn("worker.log", "warn")?;
    let pid = child.id();
    let started = Instant::now();
    all_running(&mut child, started)?;
    let start_s = started.elapsed().as_secs_f64();
    let start_cpu = cpu_seconds(pid).context("cpu")?;
    std::thread::sleep(Duration::from_secs(3));
    let (cpu0, segs0, t0) = (cpu_seconds(pid).context("cpu")?, out_segments(), Instant::now());
    std::thread::sleep(Duration::from_secs(args.idle_secs));
    let elapsed = t0.elapsed().as_secs_f64();
    let idle_cpu = (cpu_seconds(pid).context("cpu")? - cpu0) / elapsed;
    let segs = match (segs0, out_segments()) {
        (Some(a), Some(b)) => format!("{:.0}", (b - a) as f64 / elapsed),
        _ => "?".into(),
    };
    let threads = status_field(pid, "Threads:").context("threads")?;
    let rss = status_field(pid, "VmRSS:").context("rss")? * 1024;
    let sockets = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .filter(|target| target.to_string_lossy().starts_with("socket:"))
                .count()
        })
        .unwrap_or(0);
    println!(
        "  all {tasks} tasks running after {start_s:.1} s ({}), {start_cpu:.1} s of CPU to start them",
        args.processing_guarantee
    );
    println!("  {sockets} sockets open");
    println!(
        "  idle: {threads} OS threads, RSS {} MiB ({:.0} KiB per task), CPU {:.1}% of a core, \
         {segs} TCP segments/s sent on this host (worker and broker)",
        rss >> 20,
        rss as f64 / 1024.0 / tasks as f64,
        idle_cpu * 100.0
    );

    // Records still flow through every topology: one per partition.
    let producer: ThreadedProducer<DefaultProducerContext> = config(&args.bootstrap).create()?;
    for (input, _) in &pairs {
        for p in 0..args.partitions {
            producer
                .send(BaseRecord::to(input).partition(p).key("k").payload("hello"))
                .map_err(|(e, _)| e)?;
        }
    }
    producer.flush(Duration::from_secs(30))?;
    let flow = Instant::now();
    let consumer: BaseConsumer = config(&args.bootstrap)
        .set("group.id", format!("density-reader-{id}"))
        .set("auto.offset.reset", "earliest")
        .create()?;
    let outputs: Vec<&str> = pairs.iter().map(|(_, o)| o.as_str()).collect();
    consumer.subscribe(&outputs)?;
    let mut got = 0u64;
    while got < tasks && flow.elapsed() < Duration::from_secs(120) {
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            if m?.payload() == Some(b"HELLO".as_slice()) {
                got += 1;
            }
        }
    }
    println!(
        "  flow: {got} of {tasks} records through every task in {:.1} s",
        flow.elapsed().as_secs_f64()
    );
    let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    let status = child.wait()?;
    if got != tasks {
        bail!("only {got} of {tasks} records came through");
    }
    if !status.success() {
        bail!("the worker exited with {status}");
    }
    if args.restart {
        let mut child = spawn("restart.log", "warn,sluice::runtime=debug")?;
        let started = Instant::now();
        all_running(&mut child, started)?;
        let restart_s = started.elapsed().as_secs_f64();
        let cpu = cpu_seconds(child.id()).context("cpu")?;
        let log = std::fs::read_to_string(dir.join("restart.log"))?;
        let cached = log.matches("compiled code from the compile cache").count();
        let compiled = log
            .lines()
            .filter(|l| l.contains(" compiled ") && l.contains("seconds="))
            .count();
        println!(
            "  restart: all {tasks} tasks running again after {restart_s:.1} s ({cpu:.1} s of CPU); \
             {cached} topologies' code from the compile cache, {compiled} compiled"
        );
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let status = child.wait()?;
        if !status.success() {
            bail!("the restarted worker exited with {status}");
        }
        if compiled > 0 {
            bail!("the restarted worker compiled {compiled} components again");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
