//! Compiling a component in a process of its own, under a deadline and a memory cap.
//! Cranelift's time and memory grow with what a component holds, and a tenant chooses that:
//! [`scan`](super::scan) refuses what is plainly too much before anything is compiled, and
//! this bounds the rest. A worker runs `sluice compile-component IN OUT` as a child whose
//! data segment is capped (`RLIMIT_DATA` at `component.compile.max.bytes`), kills it at
//! `component.compile.timeout.ms`, and loads what it wrote: wasmtime's serialized form, made by
//! an engine configured as the worker's own (the pooling allocator changes how instances
//! are allocated, not the code, so the child needs none). The worker's own memory never
//! holds Cranelift's working set, and a compile that runs away costs one child process.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where and under which limits components are compiled in a child process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildCompiler {
    /// The `sluice` binary (its `compile-component` command).
    pub program: PathBuf,
    /// Longest one compile may take.
    pub timeout: Duration,
    /// Most bytes of data (heap) the compiling process may hold.
    pub memory: u64,
}

/// Why a compile in a child failed.
#[derive(Debug)]
pub enum ChildError {
    /// It ran past the deadline or the memory cap: what was exceeded.
    OverLimit(String),
    /// The component does not compile (or the child failed otherwise): its message.
    Failed(String),
}

impl ChildCompiler {
    /// Compiles `component` in a child and returns wasmtime's serialized form of it.
    pub fn compile(&self, component: &[u8]) -> Result<Vec<u8>, ChildError> {
        let dir = std::env::temp_dir().join(format!("sluice-compile-{}", uuid::Uuid::new_v4().simple()));
        let result = self.compile_in(&dir, component);
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    fn compile_in(&self, dir: &Path, component: &[u8]) -> Result<Vec<u8>, ChildError> {
        let failed = |what: &str, e: std::io::Error| ChildError::Failed(format!("{what}: {e}"));
        std::fs::create_dir_all(dir).map_err(|e| failed("making a directory to compile in", e))?;
        let (input, output) = (dir.join("component.wasm"), dir.join("component.cwasm"));
        std::fs::write(&input, component).map_err(|e| failed("writing the component to compile", e))?;
        let mut command = Command::new(&self.program);
        command
            .arg("compile-component")
            .arg(&input)
            .arg(&output)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let memory = self.memory;
        // SAFETY: between fork and exec only setrlimit, which is async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: memory as libc::rlim_t,
                    rlim_max: memory as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_DATA, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let started = Instant::now();
        let mut child = command
            .spawn()
            .map_err(|e| failed(&format!("starting {}", self.program.display()), e))?;
        // Its message, read as it comes (bounded), so a chatty child cannot block on a
        // full pipe.
        let stderr = child.stderr.take().map(|mut pipe| {
            std::thread::spawn(move || {
                use std::io::Read;
                let mut text = Vec::new();
                let _ = (&mut pipe).take(4096).read_to_end(&mut text);
                let _ = std::io::copy(&mut pipe, &mut std::io::sink());
                String::from_utf8_lossy(&text).into_owned()
            })
        });
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if started.elapsed() >= self.timeout => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(ChildError::OverLimit(format!(
                        "compiling it took longer than {:?}, this worker's limit (component.compile.timeout.ms)",
                        self.timeout
                    )));
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => return Err(failed("waiting for the compiling process", e)),
            }
        };
        let message = stderr.and_then(|t| t.join().ok()).unwrap_or_default();
        if status.success() {
            return std::fs::read(&output).map_err(|e| failed("reading the compiled component", e));
        }
        use std::os::unix::process::ExitStatusExt;
        let out_of_memory = message.contains("memory allocation") || status.signal() == Some(libc::SIGABRT);
        if out_of_memory {
            return Err(ChildError::OverLimit(format!(
                "compiling it needed more than {} MiB of memory, this worker's limit (component.compile.max.bytes)",
                self.memory >> 20
            )));
        }
        let message = message.trim();
        Err(ChildError::Failed(if message.is_empty() {
            format!("the compiling process ended with {status}")
        } else {
            message.strip_prefix("sluice: error: ").unwrap_or(message).to_string()
        }))
    }
}

/// `sluice compile-component IN OUT`: compiles the component in file `input` as a worker's
/// engine would and writes wasmtime's serialized form to `output`.
pub fn compile_file(input: &Path, output: &Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let bytes = std::fs::read(input).with_context(|| format!("reading {}", input.display()))?;
    let engine = wasmtime::Engine::new(&super::engine_config(&super::RuntimeConfig::default(), false))?;
    let compiled = engine.precompile_component(&bytes)?;
    std::fs::write(output, compiled).with_context(|| format!("writing {}", output.display()))?;
    Ok(())
}
