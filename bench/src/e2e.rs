//! End to end on a real broker: 1M records through `uppercase`, one worker, 4 partitions.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::Args;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

#[derive(Args)]
pub struct E2eArgs {
    #[arg(long, env = "KAFKA_BOOTSTRAP")]
    bootstrap: String,
    /// The uppercase component.
    #[arg(long)]
    component: PathBuf,
    #[arg(long, default_value_t = 1_000_000)]
    records: usize,
    #[arg(long, default_value_t = 100)]
    size: usize,
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    #[arg(long, default_value_t = 500)]
    batch: usize,
    /// Class path of bench/kafka-streams (its classes and dependencies): when given, the
    /// same job runs on Kafka Streams too, on the same input, and the ratio is printed.
    #[arg(long)]
    kafka_streams_classpath: Option<String>,
    /// Runs of each system, alternating (Sluice, Kafka Streams, native, Sluice, …); the
    /// median is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// More arguments for `sluice worker` (repeat), e.g. `--sluice-arg=--prefetch=16MiB`.
    #[arg(long = "sluice-arg", allow_hyphen_values = true)]
    sluice_args: Vec<String>,
    /// Skip the exactly-once runs.
    #[arg(long)]
    no_exactly_once: bool,
    /// The uppercase component built from Python (guests/python/uppercase): when given, it runs
    /// too, under both guarantees, in the same rounds.
    #[arg(long)]
    python_component: Option<PathBuf>,
}

/// One run of one system.
#[derive(Debug, Clone, Copy)]
struct Measured {
    /// Seconds from the process start to the last output.
    total_s: f64,
    /// Seconds from the first output to the last.
    steady_s: f64,
    peak_rss: u64,
    cpu_s: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap);
    c
}

pub async fn run(args: E2eArgs) -> anyhow::Result<()> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let input = format!("bench-in-{id}");
    let admin: AdminClient<DefaultClientContext> = config(&args.bootstrap).create()?;
    let topics = [NewTopic::new(&input, args.partitions, TopicReplication::Fixed(1))];
    for r in admin.create_topics(&topics, &AdminOptions::new()).await? {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    println!(
        "end-to-end benchmark: {} records of {} bytes, {} partitions, Kafka at {}",
        args.records, args.size, args.partitions, args.bootstrap
    );

    // Produce the input.
    let producer: ThreadedProducer<DefaultProducerContext> = config(&args.bootstrap)
        .set("linger.ms", "20")
        .set("batch.size", "1000000")
        .set("compression.type", "lz4")
        .set("queue.buffering.max.messages", "1000000")
        .create()?;
    let value: Vec<u8> = (0..args.size).map(|i| b'a' + (i % 26) as u8).collect();
    let started = Instant::now();
    for i in 0..args.records {
        let key = format!("{i:08}");
        let mut record = BaseRecord::<_, _, ()>::to(&input).key(key.as_bytes()).payload(&value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => bail!("producing the input: {e}"),
            }
        }
    }
    producer.flush(Duration::from_secs(120))?;
    let produce_s = started.elapsed().as_secs_f64();
    println!(
        "  produced input:  {:>10.0} records/s ({produce_s:.1} s)",
        args.records as f64 / produce_s
    );

    let dir = std::env::temp_dir().join(format!("sluice-bench-{id}"));
    std::fs::create_dir_all(&dir)?;
    // Each system reads the same input into an output of its own, in alternating rounds.
    // Exactly-once: Sluice at its default commit interval under exactly-once (100 ms, Kafka
    // Streams' default) and at 1 s; Kafka Streams' exactly_once_v2 at its default.
    let mut systems: Vec<&str> = vec!["sluice"];
    if args.kafka_streams_classpath.is_some() {
        systems.push("kafka streams");
    }
    if args.python_component.is_some() {
        systems.push("sluice python");
        if !args.no_exactly_once {
            systems.push("sluice python eos");
        }
    }
    if !args.no_exactly_once {
        systems.extend(["sluice eos", "sluice eos 1s"]);
        if args.kafka_streams_classpath.is_some() {
            systems.push("kafka streams eos");
        }
    }
    systems.push("native");
    let mut results: Vec<(&str, Measured)> = Vec::new();
    for round in 0..args.rounds {
        for &system in &systems {
            let run = format!("{}-{round}-{id}", system.replace(' ', "-"));
            let output = format!("bench-out-{run}");
            let topic = [NewTopic::new(&output, args.partitions, TopicReplication::Fixed(1))];
            for r in admin.create_topics(&topic, &AdminOptions::new()).await? {
                r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
            }
            let command = match system {
                "sluice" | "sluice eos" | "sluice eos 1s" | "sluice python" | "sluice python eos" => {
                    let component = match system {
                        "sluice python" | "sluice python eos" => args.python_component.as_ref().expect("given"),
                        _ => &args.component,
                    };
                    let manifest = dir.join(format!("{run}.toml"));
                    std::fs::write(
                        &manifest,
                        format!(
                            "name = \"bench-{run}\"\ncomponent = {:?}\n[sources]\ninput = {input:?}\n[sinks]\noutput = {output:?}\n",
                            component.display().to_string()
                        ),
                    )?;
                    let mut worker = Command::new(crate::sluice_binary()?);
                    worker
                        .args(["worker", "--bootstrap", &args.bootstrap, "--topology"])
                        .arg(&manifest)
                        .arg("--state-dir")
                        .arg(dir.join(format!("state-{run}")))
                        .args(["--batch-size", &args.batch.to_string()])
                        .args(&args.sluice_args)
                        .env("SLUICE_LOG", "warn");
                    if system.ends_with("eos") || system == "sluice eos 1s" {
                        worker.args(["--processing-guarantee", "exactly-once"]);
                    }
                    if system.starts_with("sluice python") {
                        // One compile for every round (the first): what a restarted worker has.
                        worker.arg("--compile-cache").arg(dir.join("compiled"));
                    }
                    if system == "sluice eos 1s" {
                        worker.args(["--commit-interval", "1s"]);
                    }
                    worker
                }
                "kafka streams" | "kafka streams eos" => {
                    let mut streams = Command::new("java");
                    streams
                        .args([
                            "-Xmx1g",
                            "-cp",
                            args.kafka_streams_classpath.as_deref().unwrap_or_default(),
                            "dev.sluice.bench.Uppercase",
                            &args.bootstrap,
                            &input,
                            &output,
                        ])
                        .arg(format!("bench-streams-{run}"))
                        // Stream threads = partitions, as a user would tune it.
                        .arg(args.partitions.to_string())
                        .arg(if system == "kafka streams" {
                            "at_least_once"
                        } else {
                            "exactly_once_v2"
                        });
                    streams
                }
                _ => {
                    let mut native = Command::new(std::env::current_exe()?);
                    native.args([
                        "native",
                        "--bootstrap",
                        &args.bootstrap,
                        "--input",
                        &input,
                        "--output",
                        &output,
                        "--group",
                        &format!("bench-native-{run}"),
                    ]);
                    native
                }
            };
            let label = format!("{system} #{}", round + 1);
            let measured = measure(&label, command, &args, &output, &dir.join(format!("{run}.log")), &id)?;
            results.push((system, measured));
        }
    }
    println!();
    println!(
        "  uppercase, {} records, {} partitions, median of {} alternating runs:",
        args.records, args.partitions, args.rounds
    );
    println!(
        "  {:<18} {:>14} {:>16} {:>14} {:>10}",
        "system", "steady rec/s", "start-to-last/s", "CPU s per 1M", "peak RSS"
    );
    let mut medians = Vec::new();
    for &system in &systems {
        let runs: Vec<Measured> = results.iter().filter(|(s, _)| *s == system).map(|(_, m)| *m).collect();
        let steady = median(runs.iter().map(|m| args.records as f64 / m.steady_s).collect());
        let total = median(runs.iter().map(|m| args.records as f64 / m.total_s).collect());
        let cpu = median(runs.iter().map(|m| m.cpu_s * 1e6 / args.records as f64).collect());
        let rss = median(runs.iter().map(|m| m.peak_rss as f64 / (1 << 20) as f64).collect());
        println!("  {system:<18} {steady:>14.0} {total:>16.0} {cpu:>14.2} {rss:>8.0} MB");
        medians.push((system, steady, cpu, rss));
    }
    let ratio = |a: &str, b: &str| {
        let (Some(a), Some(b)) = (medians.iter().find(|m| m.0 == a), medians.iter().find(|m| m.0 == b)) else {
            return;
        };
        println!(
            "  {} / {}: {:.2}x the steady throughput, {:.2}x the CPU per record, {:.2}x the peak RSS",
            a.0,
            b.0,
            a.1 / b.1,
            a.2 / b.2,
            a.3 / b.3
        );
    };
    for (a, b) in [
        ("sluice", "kafka streams"),
        ("sluice", "native"),
        ("sluice eos", "sluice"),
        ("sluice eos 1s", "sluice"),
        ("sluice eos", "kafka streams eos"),
        ("kafka streams eos", "kafka streams"),
        ("sluice python", "sluice"),
        ("sluice python", "kafka streams"),
        ("sluice python eos", "sluice python"),
        ("sluice python eos", "kafka streams eos"),
    ] {
        ratio(a, b);
    }
    println!();

    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Starts `command`, reads `output` until every record has arrived, stops the process.
/// Returns (seconds from start, seconds from the first output) to the last output.
fn measure(
    name: &str,
    mut command: Command,
    args: &E2eArgs,
    output: &str,
    log: &std::path::Path,
    id: &str,
) -> anyhow::Result<Measured> {
    let log_file = std::fs::File::create(log)?;
    let consumer: BaseConsumer = config(&args.bootstrap)
        .set("group.id", format!("bench-reader-{id}-{output}"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()?;
    consumer.subscribe(&[output])?;
    let started = Instant::now();
    let mut child = command
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    let mut seen = 0usize;
    let mut first: Option<Instant> = None;
    let check = crate::deadline("the sink to fill", Duration::from_secs(900));
    let result = (|| {
        while seen < args.records {
            check()?;
            if let Some(status) = child.try_wait()? {
                bail!("{name} exited ({status}); see {}", log.display());
            }
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(_)) => {
                    first.get_or_insert_with(Instant::now);
                    seen += 1;
                }
                Some(Err(e)) => bail!("reading the sink: {e}"),
                None => {}
            }
        }
        Ok(())
    })();
    let total_s = started.elapsed().as_secs_f64();
    let steady_s = first.map(|f| f.elapsed().as_secs_f64()).unwrap_or(total_s);
    let usage = process_usage(child.id());
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
    result?;
    println!(
        "  {name:<15} {:>10.0} records/s from start to the last output ({total_s:.1} s, start-up included)",
        args.records as f64 / total_s
    );
    println!(
        "  {:<15} {:>10.0} records/s from the first output to the last ({steady_s:.1} s)",
        "",
        args.records as f64 / steady_s
    );
    let (peak_rss, cpu_s) = usage.unwrap_or((0, f64::NAN));
    println!(
        "  {:<15} peak RSS {} MB, CPU {cpu_s:.1} s ({:.2} µs per record)",
        "",
        peak_rss >> 20,
        cpu_s * 1e6 / args.records as f64
    );
    Ok(Measured {
        total_s,
        steady_s,
        peak_rss,
        cpu_s,
    })
}

/// Peak resident memory (bytes) and CPU time (user + system, seconds) of a live process.
pub(crate) fn process_usage(pid: u32) -> Option<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm_kib: u64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may hold spaces) start at its closing parenthesis;
    // utime and stime are fields 14 and 15, in clock ticks.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    let per_second: f64 = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(100.0);
    Some((hwm_kib * 1024, ticks / per_second))
}
