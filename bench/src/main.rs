//! `sluice-bench`: prints throughput figures (run it through `dev/bench`).
//!
//! - `guest`: records/s through a guest alone (no Kafka), with the per-record cost of the
//!   Wasm boundary beside a native Rust closure doing the same work.
//! - `e2e`: records/s through `uppercase` on a real broker: one worker process, 4 partitions.
//! - `density`: one worker holding 1,000 tasks: start time, idle threads, RSS, CPU.
//! - `scaling`: a stateful topology scaled 1 → 2 → 3 → 1 workers: pauses per policy.
//! - `tenants`: tenant B's throughput alone and beside tenant A looping until its deadline.
//! - `avro`: an Avro pipeline behind a Schema Registry beside Kafka Streams, and the decode
//!   and encode cost per record on their own.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use sluice::runtime::{Runtime, RuntimeConfig};
use sluice_guest::wire::{self, Writer};
use sluice_guest::TaskInfo;

mod avro;
mod crash;
mod density;
mod e2e;
mod native;
mod scaling;
mod state;
mod tenants;

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The guest alone: batches through `process`, against a native closure.
    Guest {
        /// The uppercase component.
        #[arg(long)]
        component: PathBuf,
        /// A component that emits every record unchanged (the `faults` guest does): its
        /// time against a native pass-through is the cost of the boundary alone.
        #[arg(long)]
        passthrough: Option<PathBuf>,
        #[arg(long, default_value_t = 1_000_000)]
        records: usize,
        /// Value size in bytes.
        #[arg(long, default_value_t = 100)]
        size: usize,
        #[arg(long, default_value_t = 500)]
        batch: usize,
        /// Repetitions (Wasm and native alternate); the median is reported.
        #[arg(long, default_value_t = 7)]
        runs: usize,
    },
    /// End to end on a broker: produce, run `sluice worker`, read the sink.
    E2e(e2e::E2eArgs),
    /// Restoring a store from a changelog of 1M keys into a fresh RocksDB.
    Restore(state::RestoreArgs),
    /// The two-stage word count end to end on a broker (repartition topic, state store and
    /// changelog included), beside the same job in Kafka Streams' DSL when given its classpath.
    WordCount(state::WordCountArgs),
    /// Events counted per user in tumbling windows: Sluice's DSL beside Kafka Streams' DSL.
    WindowedCount(state::WindowedCountArgs),
    /// The two-stage word count over millions of words: how much its repartition topic holds
    /// as they flow (the host deletes what the counting tasks committed).
    Repartition(state::RepartitionArgs),
    /// A worker killed with SIGKILL under load and started again: how much of a 1M-key store
    /// it restores, under each guarantee.
    Crash(crash::CrashArgs),
    /// One worker holding many tasks: start time, idle threads, RSS and CPU, and flow.
    Density(density::DensityArgs),
    /// A stateful topology scaled 1 -> 2 -> 3 -> 1 workers under eager, sticky and learners.
    Scaling(scaling::ScalingArgs),
    /// Tenant isolation: tenant B alone, then beside tenant A looping until its deadline.
    Tenants(tenants::TenantsArgs),
    /// An Avro pipeline behind a Schema Registry (read, enrich, filter, write Avro) beside
    /// Kafka Streams with Avro's Java library, and the decode and encode cost per record.
    Avro(avro::AvroArgs),
    /// The native baseline process `e2e` runs (a plain rdkafka uppercase program).
    #[command(hide = true)]
    Native(native::NativeArgs),
}

fn main() -> anyhow::Result<()> {
    match Args::parse().command {
        Command::Guest {
            component,
            passthrough,
            records,
            size,
            batch,
            runs,
        } => {
            guest(component, records, size, batch, runs)?;
            if let Some(passthrough) = passthrough {
                boundary(passthrough, records, size, batch, runs)?;
            }
            Ok(())
        }
        Command::E2e(args) => tokio::runtime::Runtime::new()?.block_on(e2e::run(args)),
        Command::Restore(args) => tokio::runtime::Runtime::new()?.block_on(state::restore(args)),
        Command::WordCount(args) => tokio::runtime::Runtime::new()?.block_on(state::word_count(args)),
        Command::WindowedCount(args) => tokio::runtime::Runtime::new()?.block_on(state::windowed_count(args)),
        Command::Repartition(args) => tokio::runtime::Runtime::new()?.block_on(state::repartition(args)),
        Command::Crash(args) => tokio::runtime::Runtime::new()?.block_on(crash::run(args)),
        Command::Density(args) => tokio::runtime::Runtime::new()?.block_on(density::run(args)),
        Command::Scaling(args) => tokio::runtime::Runtime::new()?.block_on(scaling::run(args)),
        Command::Tenants(args) => tokio::runtime::Runtime::new()?.block_on(tenants::run(args)),
        Command::Avro(args) => tokio::runtime::Runtime::new()?.block_on(avro::run(args)),
        Command::Native(args) => native::run(args),
    }
}

/// Batches of `batch` records with `size`-byte lower-case ASCII values and 8-byte keys.
fn batches(records: usize, size: usize, batch: usize) -> Vec<Vec<u8>> {
    let value: Vec<u8> = (0..size).map(|i| b'a' + (i % 26) as u8).collect();
    let mut out = Vec::new();
    let mut w = Writer::new();
    for i in 0..records {
        let key = (i as u64).to_le_bytes();
        w.push_input(Some(&key), Some(&value), i as i64, 0, 0, i as i64, std::iter::empty());
        if w.len() as usize == batch || i + 1 == records {
            out.push(w.take());
        }
    }
    out
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    xs[xs.len() / 2]
}

fn guest(component: PathBuf, records: usize, size: usize, batch: usize, runs: usize) -> anyhow::Result<()> {
    let runtime = Runtime::new(&RuntimeConfig::default())?;
    let loading = Instant::now();
    let topology = runtime.load(&component)?;
    let load_s = loading.elapsed().as_secs_f64();
    let sinks = topology.description().sinks.clone();
    let input = batches(records, size, batch);
    let task = TaskInfo {
        topology: "bench".into(),
        subtopology: "bench".into(),
        task_id: "bench/0".into(),
        partition: 0,
        source_topics: vec!["in".into()],
        sink_topics: vec!["out".into()],
    };
    println!(
        "guest benchmark: {records} records of {size} bytes, batches of {batch}, {} ({})",
        component.display(),
        if runtime.is_pooling() {
            "pooling allocator"
        } else {
            "on-demand allocator"
        }
    );

    // Wasm: process every batch and decode its output, as the worker does.
    let mut wasm = Vec::new();
    let mut checksum = 0usize;
    for _ in 0..runs {
        let mut instance = topology.instantiate_in_memory("bench/0")?;
        instance.init(&task)?;
        let started = Instant::now();
        for b in &input {
            let output = instance.process(b)?;
            let out = output.records(sinks.len())?;
            checksum += out.len();
        }
        wasm.push(started.elapsed().as_secs_f64());
    }
    if checksum != records * runs {
        bail!("the guest emitted {checksum} records for {} inputs", records * runs);
    }

    // Native: the same work (decode the batch, upper-case, encode the output, decode it).
    let mut native = Vec::new();
    let mut writer = Writer::new();
    let mut upper = Vec::with_capacity(size);
    for _ in 0..runs {
        let started = Instant::now();
        let mut n = 0usize;
        for b in &input {
            writer.clear();
            for r in wire::inputs(b)? {
                let r = r?;
                let text = std::str::from_utf8(r.value.unwrap_or_default())?;
                upper.clear();
                upper.extend_from_slice(text.to_uppercase().as_bytes());
                writer.push_emitted(0, r.key, Some(&upper), r.timestamp, std::iter::empty());
            }
            for r in wire::emitted(writer.as_bytes())? {
                r?;
                n += 1;
            }
        }
        std::hint::black_box(n);
        native.push(started.elapsed().as_secs_f64());
    }

    // The fixed cost of one call: an empty batch.
    let empty = Writer::new().take();
    let mut instance = topology.instantiate_in_memory("bench/0")?;
    instance.init(&task)?;
    let calls = 100_000;
    let started = Instant::now();
    for _ in 0..calls {
        instance.process(&empty)?;
    }
    let per_call_ns = started.elapsed().as_nanos() as f64 / calls as f64;

    // A new store and instance (what starting a task costs).
    let n = 5_000;
    let (mut create, mut init) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..n {
        let started = Instant::now();
        let mut i = topology.instantiate_in_memory("bench/0")?;
        let created = Instant::now();
        i.init(&task)?;
        let done = Instant::now();
        drop(i);
        create += created - started;
        init += done - created;
    }
    let us = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    let instantiate_us = us(create + init);

    // What a live task costs in memory: 64 instances alive at once, each having processed a
    // batch (the worker's resident memory grows by this per task).
    let live_n = 64;
    let before = rss_bytes();
    let mut live = Vec::new();
    for _ in 0..live_n {
        let mut i = topology.instantiate_in_memory("bench/0")?;
        i.init(&task)?;
        i.process(&input[0])?;
        live.push(i);
    }
    let per_live = (rss_bytes().saturating_sub(before)) as f64 / live_n as f64;
    drop(live);

    let wasm_s = median(wasm);
    let native_s = median(native);
    let per = |s: f64| s * 1e9 / records as f64;
    println!(
        "  wasm guest:     {:>12.0} records/s  {:>7.1} ns/record",
        records as f64 / wasm_s,
        per(wasm_s)
    );
    println!(
        "  native closure: {:>12.0} records/s  {:>7.1} ns/record",
        records as f64 / native_s,
        per(native_s)
    );
    println!(
        "  wasm - native:  {:>7.1} ns/record (boundary, copies and wasm code speed)",
        per(wasm_s) - per(native_s)
    );
    println!(
        "  empty call:     {per_call_ns:>7.0} ns/call  = {:.1} ns/record at batches of {batch}",
        per_call_ns / batch as f64
    );
    println!(
        "  new instance:   {instantiate_us:>7.1} µs (store + instance {:.1} µs, init {:.1} µs)",
        us(create),
        us(init)
    );
    println!(
        "  live instance:  {:>7.2} MiB resident each ({live_n} alive at once, each after one batch)",
        per_live / (1 << 20) as f64
    );
    println!(
        "  compile + load: {load_s:>7.2} s ({} bytes of component, compiled here by Cranelift)",
        std::fs::metadata(&component)?.len()
    );
    Ok(())
}

/// This process's resident memory, from /proc.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Pass-through in Wasm against pass-through in native code: what crossing costs.
fn boundary(component: PathBuf, records: usize, size: usize, batch: usize, runs: usize) -> anyhow::Result<()> {
    let runtime = Runtime::new(&RuntimeConfig::default())?;
    let topology = runtime.load(&component)?;
    let sinks = topology.description().sinks.clone();
    let input = batches(records, size, batch);
    let task = TaskInfo {
        topology: "bench".into(),
        subtopology: "bench".into(),
        task_id: "bench/0".into(),
        partition: 0,
        source_topics: vec!["in".into()],
        sink_topics: vec!["out".into()],
    };
    // Wasm and native runs alternate, so a slow spell of the machine hits both alike.
    let (mut wasm, mut native) = (Vec::new(), Vec::new());
    let mut writer = Writer::new();
    let mut instance = topology.instantiate_in_memory("bench/0")?;
    instance.init(&task)?;
    for _ in 0..runs {
        let started = Instant::now();
        let mut n = 0;
        for b in &input {
            n += instance.process(b)?.records(sinks.len())?.len();
        }
        wasm.push(started.elapsed().as_secs_f64());
        if n != records {
            bail!("the pass-through guest emitted {n} of {records} records");
        }

        let started = Instant::now();
        let mut n = 0usize;
        for b in &input {
            writer.clear();
            for r in wire::inputs(b)? {
                let r = r?;
                writer.push_emitted(0, r.key, r.value, r.timestamp, std::iter::empty());
            }
            for r in wire::emitted(writer.as_bytes())? {
                r?;
                n += 1;
            }
        }
        std::hint::black_box(n);
        native.push(started.elapsed().as_secs_f64());
    }
    let per = |s: f64| s * 1e9 / records as f64;
    let paired = median(wasm.iter().zip(&native).map(|(w, n)| per(w - n)).collect());
    let (w, n) = (per(median(wasm)), per(median(native)));
    println!("pass-through ({}): the boundary alone", component.display());
    println!("  wasm guest:     {:>12.0} records/s  {w:>7.1} ns/record", 1e9 / w);
    println!("  native closure: {:>12.0} records/s  {n:>7.1} ns/record", 1e9 / n);
    println!("  boundary cost:  {paired:>7.1} ns/record (median over {runs} back-to-back pairs of runs)");
    Ok(())
}

/// How long to wait for something, printing what it is.
pub fn deadline(what: &str, timeout: Duration) -> impl Fn() -> anyhow::Result<()> + '_ {
    let end = Instant::now() + timeout;
    move || {
        if Instant::now() > end {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        Ok(())
    }
}

pub fn sluice_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe.parent().context("the bench binary's directory")?.join("sluice");
    if !bin.exists() {
        bail!("{} is missing: build it first (dev/bench does)", bin.display());
    }
    Ok(bin)
}
