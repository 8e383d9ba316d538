//! Per-task store data and the host side of `sluice:topology/host`: emit, log, time.

use wasmtime::component::ResourceTable;
use wasmtime::ResourceLimiter;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::bindings::sluice::topology::{host, types};
use super::state_host::NamedStore;
use sluice_guest::wire::{Header, Writer, INHERIT_TIMESTAMP};

/// How much guest stdout/stderr a task keeps (to explain a trap, e.g. a panic message).
const OUTPUT_CAPTURE: usize = 16 << 10;

/// Everything one task's `Store` holds.
pub struct TaskData {
    wasi: WasiCtx,
    pub(super) table: ResourceTable,
    /// The task's state stores, by declared name.
    pub(super) stores: Vec<NamedStore>,
    stderr: MemoryOutputPipe,
    /// Tags log lines: `<topology>/<partition>`.
    pub(super) label: String,
    /// Sink names by index, for `host.emit`.
    pub(super) sinks: Vec<String>,
    /// Records emitted through `host.emit` during the current call.
    pub(super) emitted: Writer,
    pub(super) memory_limit: usize,
    /// Set when the guest asked for more memory than its limit.
    pub(super) memory_denied: Option<usize>,
}

impl TaskData {
    pub(super) fn new(label: &str, sinks: Vec<String>, stores: Vec<NamedStore>, memory_limit: usize) -> Self {
        let stderr = MemoryOutputPipe::new(OUTPUT_CAPTURE);
        // No preopened directories, environment, arguments or network: the builder grants
        // nothing unless asked, and we say so explicitly for the network.
        let wasi = WasiCtxBuilder::new()
            .stdout(stderr.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        TaskData {
            wasi,
            table: ResourceTable::new(),
            stores,
            stderr,
            label: label.to_string(),
            sinks,
            emitted: Writer::new(),
            memory_limit,
            memory_denied: None,
        }
    }

    /// What the guest printed so far (lossy UTF-8, last lines kept short).
    pub(super) fn captured_output(&self) -> String {
        let bytes = self.stderr.contents();
        let text = String::from_utf8_lossy(&bytes);
        // Rust's hint about RUST_BACKTRACE means nothing to a guest: it has no environment.
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.starts_with("note: run with `RUST_BACKTRACE"))
            .collect();
        let start = lines.len().saturating_sub(5);
        lines[start..].join("\n")
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

impl ResourceLimiter for TaskData {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            // Refuse the growth (the guest sees memory.grow fail, and Rust aborts); remember
            // why, so the trap that follows is reported as a memory limit.
            self.memory_denied = Some(desired);
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

impl types::Host for TaskData {}

impl host::Host for TaskData {
    fn emit(&mut self, sink: String, out: types::Output) -> Result<(), types::EmitError> {
        let Some(index) = self.sinks.iter().position(|s| *s == sink) else {
            return Err(types::EmitError::UnknownSink(sink));
        };
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
        Ok(())
    }

    fn log(&mut self, level: types::Level, message: String) {
        let task = self.label.as_str();
        match level {
            types::Level::Trace => tracing::trace!(target: "sluice::guest", task, "{message}"),
            types::Level::Debug => tracing::debug!(target: "sluice::guest", task, "{message}"),
            types::Level::Info => tracing::info!(target: "sluice::guest", task, "{message}"),
            types::Level::Warn => tracing::warn!(target: "sluice::guest", task, "{message}"),
            types::Level::Error => tracing::error!(target: "sluice::guest", task, "{message}"),
        }
    }

    fn now_ms(&mut self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }
}
