//! The tenant benchmark's cluster: worker processes and what is read from them (metrics,
//! CPU), records fed to the tenants' topics, and the CLI calls that deploy their topologies.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use super::{Beside, Hostile, Phase, TenantsArgs};
use crate::density::http_get;
use crate::e2e::process_usage;

pub(super) fn config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap);
    c
}

/// A worker of the cluster, with its admin endpoint on `port`.
pub(super) struct Worker {
    pub(super) child: Child,
    pub(super) port: u16,
    pub(super) log: PathBuf,
}

/// Produces `records` values of `size` lower-case bytes, spread evenly over the partitions.
pub(super) fn produce(bootstrap: &str, topic: &str, partitions: i32, records: u64, size: usize) -> anyhow::Result<()> {
    let value: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
    produce_values(bootstrap, topic, partitions, records, |_| value.clone())
}

/// Produces `records` records (value `value(i)`), spread evenly over the partitions.
pub(super) fn produce_values(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    records: u64,
    value: impl Fn(u64) -> Vec<u8>,
) -> anyhow::Result<()> {
    let producer: ThreadedProducer<DefaultProducerContext> = config(bootstrap)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    for i in 0..records {
        let key = format!("{i:08}");
        let v = value(i);
        let mut record = BaseRecord::<_, _, ()>::to(topic)
            .partition((i % partitions as u64) as i32)
            .key(key.as_bytes())
            .payload(&v);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => bail!("producing to {topic}: {e}"),
            }
        }
    }
    producer.flush(Duration::from_secs(120))?;
    Ok(())
}

/// Sends records of `value` (`loop`, `busy:MS`) at `rate` per second, round robin over the partitions, until told to
/// stop; returns how many.
pub(super) fn feed(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    rate: u64,
    value: &[u8],
    feeding: &AtomicBool,
) -> anyhow::Result<u64> {
    let producer: ThreadedProducer<DefaultProducerContext> = config(bootstrap).set("linger.ms", "5").create()?;
    let started = Instant::now();
    let mut sent = 0u64;
    while feeding.load(Ordering::Relaxed) {
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due {
            let partition = (sent % partitions as u64) as i32;
            producer
                .send(BaseRecord::to(topic).partition(partition).key("a").payload(value))
                .map_err(|(e, _)| e)?;
            sent += 1;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    producer.flush(Duration::from_secs(30))?;
    Ok(sent)
}

pub(super) fn start_worker(
    args: &TenantsArgs,
    cluster: &str,
    config_file: &Path,
    dir: &Path,
    n: usize,
) -> anyhow::Result<Worker> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let log = dir.join(format!("worker-{n}.log"));
    let mut command = Command::new(crate::sluice_binary()?);
    command
        .args(["worker", "--bootstrap", &args.bootstrap, "--cluster", cluster])
        .arg("--config")
        .arg(config_file)
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .arg("--state-dir")
        .arg(dir.join(format!("state-{n}")))
        .args(["--commit-interval", "100ms", "--heartbeat-interval", "200ms"])
        .args(["--session-timeout", "6s"]);
    if let Some(threads) = args.threads {
        command.args(["--threads", &threads.to_string()]);
    }
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting a worker")?;
    Ok(Worker { child, port, log })
}

pub(super) fn exited(ws: &mut [Worker]) -> anyhow::Result<()> {
    for w in ws.iter_mut() {
        if let Some(status) = w.child.try_wait()? {
            bail!("a worker exited ({status}); see {}", w.log.display());
        }
    }
    Ok(())
}

/// Every worker holds an assignment (`/readyz` answers 200).
pub(super) fn until_ready(ws: &mut [Worker]) -> anyhow::Result<()> {
    let check = crate::deadline("the workers to join the cluster", Duration::from_secs(120));
    loop {
        let ready = ws
            .iter()
            .all(|w| http_get(w.port, "/readyz").is_ok_and(|r| r.lines().next().is_some_and(|l| l.contains(" 200"))));
        if ready {
            return Ok(());
        }
        exited(ws)?;
        check()?;
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The workers run `tasks` tasks in all.
pub(super) fn until_tasks(ws: &mut [Worker], tasks: usize, timeout: Duration) -> anyhow::Result<()> {
    let check = crate::deadline("the workers' running tasks to settle", timeout);
    loop {
        let mut running = 0.0;
        for w in ws.iter() {
            running += metric(&http_get(w.port, "/metrics")?, "sluice_tasks_running", None, &[]);
        }
        if running as usize == tasks {
            return Ok(());
        }
        exited(ws)?;
        check()?;
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The sum of metric `name` over the series of `topology` (any, when None) with the given
/// other labels, in a Prometheus text exposition.
pub(super) fn metric(body: &str, name: &str, topology: Option<&str>, labels: &[(&str, &str)]) -> f64 {
    let label = |line: &str, key: &str| {
        line.split(&format!("{key}=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .map(str::to_string)
    };
    body.lines()
        .filter(|l| l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{' | b' ')))
        .filter(|l| topology.is_none_or(|t| label(l, "topology").as_deref() == Some(t)))
        .filter(|l| labels.iter().all(|(k, v)| label(l, k).as_deref() == Some(*v)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub(super) fn metric_sum(ws: &[Worker], name: &str, topology: &str, labels: &[(&str, &str)]) -> anyhow::Result<f64> {
    let mut sum = 0.0;
    for w in ws {
        sum += metric(&http_get(w.port, "/metrics")?, name, Some(topology), labels);
    }
    Ok(sum)
}

/// Tasks of `topology` started on the workers (each has its `sluice_guest_calls_total` series).
pub(super) fn tasks_started(ws: &[Worker], topology: &str) -> anyhow::Result<usize> {
    let mut n = 0;
    for w in ws {
        let body = http_get(w.port, "/metrics")?;
        n += body
            .lines()
            .filter(|l| l.starts_with("sluice_guest_calls_total{"))
            .filter(|l| l.contains(&format!("topology=\"{topology}\"")))
            .count();
    }
    Ok(n)
}

/// A's figures so far, summed over the workers.
pub(super) fn hostile(ws: &[Worker], topology: &str) -> anyhow::Result<Hostile> {
    let mut h = Hostile::default();
    for w in ws {
        let body = http_get(w.port, "/metrics")?;
        h.skipped += metric(
            &body,
            "sluice_records_rejected_total",
            Some(topology),
            &[("action", "skip"), ("kind", "deadline")],
        );
        h.calls += metric(&body, "sluice_guest_calls_total", Some(topology), &[]);
        h.guest_s += metric(&body, "sluice_guest_call_seconds_total", Some(topology), &[]);
        h.failed += metric(&body, "sluice_task_failed", Some(topology), &[]);
    }
    Ok(h)
}

/// Every worker's CPU seconds, in all.
pub(super) fn cpu(ws: &[Worker]) -> f64 {
    ws.iter()
        .filter_map(|w| process_usage(w.child.id()))
        .map(|(_, cpu)| cpu)
        .sum()
}

/// Runs the `sluice` CLI; its stdout.
pub(super) fn sluice_cli(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(crate::sluice_binary()?).args(args).output()?;
    if !out.status.success() {
        bail!(
            "sluice {} failed: {}",
            args.first().copied().unwrap_or(""),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// `sluice deploy` under a tenant's token; the registry entry (JSON).
pub(super) fn deploy(admin: &str, token: &str, component: &Path, manifest: &Path) -> anyhow::Result<String> {
    let (component, manifest) = (component.to_string_lossy(), manifest.to_string_lossy());
    sluice_cli(&[
        "deploy",
        &component,
        "--manifest",
        &manifest,
        "--admin",
        admin,
        "--token",
        token,
        "--output",
        "json",
    ])
}

/// A number field of a JSON text, by key (enough for the registry entry `deploy` prints).
pub(super) fn json_number(json: &str, key: &str) -> Option<u64> {
    let rest = json.split(&format!("\"{key}\"")).nth(1)?;
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// B's throughput from its committed offsets: from when all its tasks have started to the
/// commit of its last record, or to the timeout. With `a`, what A did over the same window and when
/// (if) its tasks failed.
pub(super) fn measure(
    args: &TenantsArgs,
    ws: &mut [Worker],
    name: &str,
    input: &str,
    a: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<(Phase, Option<Beside>)> {
    let group = format!("sluice-{name}");
    let consumer: BaseConsumer = config(&args.bootstrap)
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut partitions = TopicPartitionList::new();
    for p in 0..args.partitions {
        partitions.add_partition(input, p);
    }
    let committed = || -> anyhow::Result<u64> {
        let list = consumer.committed_offsets(partitions.clone(), Duration::from_secs(10))?;
        Ok(list
            .elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o.max(0) as u64,
                _ => 0,
            })
            .sum())
    };
    let end = Instant::now() + timeout;
    let mut first: Option<(Instant, u64, f64, Option<Hostile>)> = None;
    let mut a_failed: Option<(Instant, u64)> = None;
    let mut last_look = Instant::now();
    let (last_at, last, done) = loop {
        let n = committed()?;
        let now = Instant::now();
        // The window opens once every task of B has started (its series are in the
        // metrics): not at B's first commit, while its other tasks may still be starting.
        if first.is_none() && tasks_started(ws, name)? >= args.partitions as usize {
            let a0 = a.map(|t| hostile(ws, t)).transpose()?;
            first = Some((now, n, cpu(ws), a0));
        }
        if n >= args.records {
            break (now, n, true);
        }
        if now > end {
            break (now, n, false);
        }
        if let Some(t) = a.filter(|_| a_failed.is_none() && now - last_look > Duration::from_millis(200)) {
            last_look = now;
            if metric_sum(ws, "sluice_task_failed", t, &[])? > 0.0 {
                a_failed = Some((now, n));
            }
        }
        exited(ws)?;
        std::thread::sleep(Duration::from_millis(20));
    };
    let (cpu1, a1) = (cpu(ws), a.map(|t| hostile(ws, t)).transpose()?);
    let Some((t0, n0, cpu0, a0)) = first else {
        bail!("{name}'s tasks did not all start within {timeout:?}");
    };
    let window_s = last_at.duration_since(t0).as_secs_f64().max(0.001);
    let peak_rss = ws
        .iter()
        .filter_map(|w| process_usage(w.child.id()))
        .map(|(rss, _)| rss)
        .max()
        .unwrap_or(0);
    let phase = Phase {
        rate: (last - n0) as f64 / window_s,
        done,
        committed: last - n0,
        window_s,
        cpu_s: cpu1 - cpu0,
        peak_rss,
    };
    let beside = a0.zip(a1).map(|(a0, a1)| Beside {
        during: a1 - a0,
        failed: a_failed.map(|(at, n)| (at.duration_since(t0).as_secs_f64(), n.saturating_sub(n0))),
    });
    Ok((phase, beside))
}
