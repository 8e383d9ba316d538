//! Per-task store data and the host side of `sluice:topology/host`: emit, log, time.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use wasmtime::component::ResourceTable;
use wasmtime::ResourceLimiter;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bindings::sluice::topology0_1_0::{host, types};
use super::fault::GuestFault;
use super::state_host::NamedStore;
use sluice_wire::wire::{Header, Writer, INHERIT_TIMESTAMP};

/// How much guest stdout/stderr a task keeps: the last bytes, to explain a trap (e.g. a
/// panic message). Writing more never fails; older output is dropped.
const OUTPUT_TAIL: usize = 4 << 10;

/// Longest guest log line; the rest is cut (and the cut is said).
const MAX_LOG_LINE: usize = 1 << 10;
/// Log lines a task may write per second on average, and in one burst.
const LOG_LINES_PER_SECOND: f64 = 20.0;
const LOG_BURST: f64 = 100.0;

/// Most bytes one `wasi:random` call returns: the host makes them before the guest's
/// memory holds them (a guest's `getrandom` asks for tens of bytes).
const MAX_RANDOM_BYTES: u64 = 64 << 10;

/// Resources (open stores, scans, WASI streams…) one instance may hold at once.
pub(super) const MAX_RESOURCES: usize = 10_000;

/// Everything one task's `Store` holds.
pub struct TaskData {
    wasi: WasiCtx,
    pub(super) table: ResourceTable,
    /// The task's state stores, by declared name.
    pub(super) stores: Vec<NamedStore>,
    output: TailPipe,
    /// Tags log lines: `<topology>/<partition>`.
    pub(super) label: String,
    /// Sink names by index, for `host.emit`.
    pub(super) sinks: Vec<String>,
    /// Records emitted through `host.emit` during the current call.
    pub(super) emitted: Writer,
    pub(super) memory_limit: usize,
    /// Bytes the guest's calls may make the host hold (emitted records, state writes not yet
    /// committed); see [`TaskData::charge`].
    pub(super) host_memory_limit: usize,
    /// Set when the guest asked for more memory than its limit.
    pub(super) memory_denied: Option<usize>,
    /// Bytes of linear memory of every memory of the instance together (the cap holds for
    /// the instance as a whole, however many memories its core instances define).
    memory_total: usize,
    /// Why a host function ended the call, when one did (a budget, a denied call).
    pub(super) fault: Option<GuestFault>,
    /// A sink or store the guest used without declaring it: the call fails when it returns,
    /// whatever the guest did with the error it got.
    pub(super) undeclared: Option<String>,
    log: LogLimiter,
}

impl TaskData {
    pub(super) fn new(
        label: &str,
        sinks: Vec<String>,
        stores: Vec<NamedStore>,
        memory_limit: usize,
        host_memory_limit: usize,
    ) -> Self {
        let output = TailPipe::default();
        // What WASI hands a guest, all of it (docs/sandbox.md, "What WASI gives a guest"):
        // no preopened directories, environment, arguments, working directory or network
        // (the builder grants none unless asked; we say so for the network), an empty
        // stdin; clocks that tell no more than `host.now-ms`; random bytes, a little at a
        // time.
        let wasi = WasiCtxBuilder::new()
            .stdout(output.clone())
            .stderr(output.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .wall_clock(MillisecondWallClock)
            .monotonic_clock(InstanceClock { start: Instant::now() })
            .max_random_size(MAX_RANDOM_BYTES)
            .build();
        let mut table = ResourceTable::new();
        table.set_max_capacity(MAX_RESOURCES);
        TaskData {
            wasi,
            table,
            stores,
            output,
            label: label.to_string(),
            sinks,
            emitted: Writer::new(),
            memory_limit,
            host_memory_limit,
            memory_denied: None,
            memory_total: 0,
            fault: None,
            undeclared: None,
            log: LogLimiter::new(),
        }
    }

    /// What the guest printed last (lossy UTF-8, last lines kept short).
    pub(super) fn captured_output(&self) -> String {
        let bytes = self.output.contents();
        let text = String::from_utf8_lossy(&bytes);
        // Rust's hint about RUST_BACKTRACE means nothing to a guest: it has no environment.
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"))
            .collect();
        let start = lines.len().saturating_sub(5);
        lines[start..].join("\n")
    }

    /// Ends the guest's call with `fault` (a host function returns the error this makes).
    pub(super) fn deny(&mut self, fault: GuestFault) -> wasmtime::Error {
        let message = fault.to_string();
        self.fault = Some(fault);
        wasmtime::Error::msg(message)
    }

    /// Bytes the host holds for this task's guest: records emitted through the host in this
    /// call, and state writes not yet committed.
    pub(super) fn held(&self) -> usize {
        self.emitted.byte_len() + self.stores.iter().map(|s| s.store.held_bytes()).sum::<usize>()
    }

    /// Checks that `adding` more bytes for `what` stay within the host-memory budget; if not,
    /// the call ends with a `memory` fault naming the budget.
    pub(super) fn charge(&mut self, what: &'static str, adding: usize) -> wasmtime::Result<()> {
        let held = self.held();
        if held.saturating_add(adding) > self.host_memory_limit {
            return Err(self.deny(GuestFault::Budget {
                budget: "host memory",
                unit: "bytes",
                limit: self.host_memory_limit,
                wanted: held.saturating_add(adding),
                what,
            }));
        }
        Ok(())
    }
}

impl WasiView for TaskData {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Core instances one task's component may create (a Rust `wasm32-wasip2` topology has a
/// handful: its module and the shims of the WASI it links).
pub const MAX_CORE_INSTANCES: usize = 32;
/// Linear memories of one task's component, all its core instances together.
pub const MAX_MEMORIES: usize = 4;
/// Tables of one task's component.
pub const MAX_TABLES: usize = 32;

impl TaskData {
    /// Bytes of linear memory of all the instance's memories together.
    pub fn memory_total(&self) -> usize {
        self.memory_total
    }
}

impl ResourceLimiter for TaskData {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        // Called for each memory's creation (from 0) and each growth: the instance's memories
        // together stay within the limit.
        let total = self.memory_total.saturating_sub(current).saturating_add(desired);
        if desired > self.memory_limit || total > self.memory_limit {
            // Refuse the growth (the guest sees memory.grow fail, and Rust aborts); remember
            // why, so the trap that follows is reported as a memory limit.
            self.memory_denied = Some(total.max(desired));
            return Ok(false);
        }
        if maximum.is_none_or(|m| desired <= m) {
            self.memory_total = total;
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }

    fn instances(&self) -> usize {
        MAX_CORE_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}

impl types::Host for TaskData {}
impl super::bindings::sluice::topology0_2_0::types::Host for TaskData {}

impl host::Host for TaskData {
    fn emit(&mut self, sink: String, out: types::Output) -> wasmtime::Result<Result<(), types::EmitError>> {
        let Some(index) = self.sinks.iter().position(|s| *s == sink) else {
            self.undeclared
                .get_or_insert_with(|| format!("the sink {sink:?} (declared sinks: {:?})", self.sinks));
            return Ok(Err(types::EmitError::UnknownSink(sink)));
        };
        let size = 32
            + out.key.as_ref().map_or(0, Vec::len)
            + out.value.as_ref().map_or(0, Vec::len)
            + out
                .headers
                .iter()
                .map(|h| 8 + h.key.len() + h.value.as_ref().map_or(0, Vec::len))
                .sum::<usize>();
        self.charge("records emitted through host.emit", size)?;
        let headers: Vec<Header<'_>> = out
            .headers
            .iter()
            .map(|h| Header {
                name: h.key.as_bytes(),
                value: h.value.as_deref(),
            })
            .collect();
        self.emitted.push_emitted(
            index as u32,
            out.key.as_deref(),
            out.value.as_deref(),
            out.timestamp.unwrap_or(INHERIT_TIMESTAMP),
            headers.into_iter(),
        );
        Ok(Ok(()))
    }

    fn log(&mut self, level: types::Level, message: String) -> wasmtime::Result<()> {
        let Some(dropped) = self.log.admit() else {
            return Ok(());
        };
        let mut message = message;
        if message.len() > MAX_LOG_LINE {
            let mut cut = MAX_LOG_LINE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            let total = message.len();
            message.truncate(cut);
            message.push_str(&format!("… ({total} bytes, cut to {cut})"));
        }
        if dropped > 0 {
            message.push_str(&format!(
                " ({dropped} earlier lines dropped: more than {LOG_LINES_PER_SECOND} lines per second)"
            ));
        }
        // One line of the worker's log, whatever the guest put in it.
        let message = super::fault::one_line(&message);
        let task = self.label.as_str();
        match level {
            types::Level::Trace => tracing::trace!(target: "sluice::guest", task, "{message}"),
            types::Level::Debug => tracing::debug!(target: "sluice::guest", task, "{message}"),
            types::Level::Info => tracing::info!(target: "sluice::guest", task, "{message}"),
            types::Level::Warn => tracing::warn!(target: "sluice::guest", task, "{message}"),
            types::Level::Error => tracing::error!(target: "sluice::guest", task, "{message}"),
        }
        Ok(())
    }

    fn now_ms(&mut self) -> wasmtime::Result<i64> {
        Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0))
    }
}

/// The WASI wall clock: the host's, in whole milliseconds (what `host.now-ms` says). A
/// finer clock would time the host's caches and the neighbours' work for the guest.
struct MillisecondWallClock;

impl HostWallClock for MillisecondWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }

    fn now(&self) -> Duration {
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        Duration::from_millis(since_epoch.as_millis() as u64)
    }
}

/// The WASI monotonic clock: whole milliseconds since the instance was made, so it tells
/// neither the host's uptime nor anything finer than `host.now-ms`.
struct InstanceClock {
    start: Instant,
}

impl HostMonotonicClock for InstanceClock {
    fn resolution(&self) -> u64 {
        1_000_000
    }

    fn now(&self) -> u64 {
        (self.start.elapsed().as_millis() as u64).saturating_mul(1_000_000)
    }
}

/// A token bucket for a task's log lines.
struct LogLimiter {
    tokens: f64,
    last: Instant,
    dropped: u64,
}

impl LogLimiter {
    fn new() -> Self {
        LogLimiter {
            tokens: LOG_BURST,
            last: Instant::now(),
            dropped: 0,
        }
    }

    /// Whether a line may be written now: if so, how many were dropped before it.
    fn admit(&mut self) -> Option<u64> {
        let now = Instant::now();
        let refill = now.duration_since(self.last).as_secs_f64() * LOG_LINES_PER_SECOND;
        self.tokens = (self.tokens + refill).min(LOG_BURST);
        self.last = now;
        if self.tokens < 1.0 {
            self.dropped += 1;
            return None;
        }
        self.tokens -= 1.0;
        Some(std::mem::take(&mut self.dropped))
    }
}

/// Guest stdout and stderr: keeps the last [`OUTPUT_TAIL`] bytes, accepts any amount.
#[derive(Clone, Default)]
pub(super) struct TailPipe {
    tail: Arc<Mutex<VecDeque<u8>>>,
}

impl TailPipe {
    fn contents(&self) -> Vec<u8> {
        self.tail.lock().unwrap().iter().copied().collect()
    }

    fn append(&self, bytes: &[u8]) {
        let mut tail = self.tail.lock().unwrap();
        let bytes = &bytes[bytes.len().saturating_sub(OUTPUT_TAIL)..];
        let overflow = (tail.len() + bytes.len()).saturating_sub(OUTPUT_TAIL);
        tail.drain(..overflow);
        tail.extend(bytes);
    }
}

impl OutputStream for TailPipe {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        self.append(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 << 10)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for TailPipe {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for TailPipe {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.append(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

impl IsTerminal for TailPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for TailPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_output_tail_keeps_the_last_bytes_and_never_fills() {
        let pipe = TailPipe::default();
        for i in 0..10_000u32 {
            pipe.append(format!("line {i}\n").as_bytes());
        }
        let tail = String::from_utf8(pipe.contents()).unwrap();
        assert!(tail.len() <= OUTPUT_TAIL);
        assert!(tail.ends_with("line 9999\n"), "{tail}");
        pipe.append(&vec![b'x'; 3 * OUTPUT_TAIL]);
        assert_eq!(pipe.contents(), vec![b'x'; OUTPUT_TAIL]);
    }

    fn task_data() -> TaskData {
        TaskData::new("t/0", Vec::new(), Vec::new(), 1 << 20, 1 << 20)
    }

    /// What `f` logs, as the worker's log would show it (the fmt subscriber, no colours).
    fn logged(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::TRACE)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let bytes = sink.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_guest_log_message_is_one_line_of_the_workers_log() {
        let forged = "hello\n2030-01-01T00:00:00.000000Z ERROR sluice::worker: forged\r\u{1b}[2J\u{2028}\u{85}end";
        let log = logged(|| {
            let mut data = task_data();
            host::Host::log(&mut data, types::Level::Warn, forged.to_string()).unwrap();
        });
        assert_eq!(log.lines().count(), 1, "the message forged a line: {log:?}");
        assert!(log.ends_with('\n'), "{log:?}");
        let line = log.trim_end_matches('\n');
        assert!(
            !line.chars().any(|c| c.is_control() || c == '\u{2028}'),
            "a control character reached the log: {line:?}"
        );
        assert!(
            line.contains(r"hello\n2030-01-01") && line.contains(r"forged\r") && line.contains("end task="),
            "the message is kept, escaped: {line:?}"
        );
    }

    #[test]
    fn the_wasi_clocks_say_no_more_than_host_now_ms() {
        use wasmtime_wasi::clocks::WasiClocksCtxView;
        use wasmtime_wasi::p2::bindings::clocks::{monotonic_clock, wall_clock};
        let mut data = task_data();
        let mut view = WasiClocksCtxView {
            ctx: data.wasi.clocks(),
            table: &mut data.table,
        };
        let resolution = wall_clock::Host::resolution(&mut view).unwrap();
        assert_eq!((resolution.seconds, resolution.nanoseconds), (0, 1_000_000));
        assert_eq!(monotonic_clock::Host::resolution(&mut view).unwrap(), 1_000_000);
        let host_now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        // Ten readings a few microseconds apart: a clock finer than a millisecond shows it.
        for _ in 0..10 {
            let wall = wall_clock::Host::now(&mut view).unwrap();
            assert_eq!(
                wall.nanoseconds % 1_000_000,
                0,
                "the wall clock is finer than 1 ms: {wall:?}"
            );
            assert!(
                wall.seconds.abs_diff(host_now) < 60,
                "the wall clock is not the host's time: {wall:?}"
            );
            let mono = monotonic_clock::Host::now(&mut view).unwrap();
            assert_eq!(mono % 1_000_000, 0, "the monotonic clock is finer than 1 ms: {mono}");
            // It counts from the instance's start, not the host's: the host's uptime is not told.
            assert!(
                mono < 60_000_000_000,
                "the monotonic clock tells the host's uptime: {mono} ns"
            );
            std::thread::sleep(std::time::Duration::from_micros(7));
        }
    }

    #[test]
    fn wasi_random_gives_small_amounts_only() {
        use wasmtime_wasi::p2::bindings::random::{insecure, random};
        let mut data = task_data();
        let ctx = data.wasi.random();
        assert_eq!(random::Host::get_random_bytes(ctx, 32).unwrap().len(), 32);
        // Each call's bytes are held by the host before the guest gets them.
        let err = random::Host::get_random_bytes(ctx, 1 << 20).err();
        assert!(
            err.as_ref().is_some_and(|e| e.to_string().contains("exceeds limit")),
            "1 MiB of random bytes in one call: {err:?}"
        );
        assert!(insecure::Host::get_insecure_random_bytes(ctx, 1 << 20).is_err());
    }

    #[test]
    fn log_lines_beyond_the_rate_are_dropped_and_counted() {
        let mut limiter = LogLimiter::new();
        let admitted = (0..1000).filter(|_| limiter.admit().is_some()).count();
        assert!((100..=102).contains(&admitted), "{admitted}");
        limiter.last -= std::time::Duration::from_secs(1);
        assert_eq!(limiter.admit(), Some(1000 - admitted as u64));
    }
}
