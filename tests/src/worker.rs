//! Running `sluice worker` as a real process: start, watch its log, stop or kill it.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The cargo target directory these tests were built in.
pub fn target_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("CARGO_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    // The test binary lives in <target>/<profile>/deps/.
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .expect("<target>/<profile>/deps/<binary>")
        .to_path_buf()
}

/// The `sluice` binary built alongside these tests (or `SLUICE_BINARY`: another build to run
/// the same tests against, an older one to show what a fix changed).
pub fn sluice_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SLUICE_BINARY") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe.ancestors().nth(2).expect("<target>/<profile>/deps/<binary>");
    let bin = profile_dir.join("sluice");
    assert!(
        bin.exists(),
        "{} is missing: build it first (`cargo build -p sluice-host`, or run dev/test)",
        bin.display()
    );
    bin
}

/// An example guest component built by `dev/build-guests`: `NAME` for the Rust one in
/// `guests/NAME`, `python/NAME` for the Python one in `guests/python/NAME`.
pub fn guest(name: &str) -> PathBuf {
    let path = match name.strip_prefix("python/") {
        Some(python) => target_dir().join("python-guests").join(format!("{python}.wasm")),
        None => target_dir()
            .join("wasm32-wasip2/release")
            .join(format!("{}.wasm", name.replace('-', "_"))),
    };
    assert!(
        path.exists(),
        "{} is missing: run dev/build-guests (dev/test does)",
        path.display()
    );
    path
}

/// Arguments that point a worker at one compile cache shared by the whole test run, for
/// topologies in Python: a Python component takes Cranelift 6-20 s to compile (CPython is in
/// it), once per component and engine, not once per test worker. A worker without them
/// compiles into its own state directory, as in production.
pub fn shared_compile_cache() -> [String; 2] {
    let dir = target_dir().join("test-compile-cache");
    ["--compile-cache".to_string(), dir.display().to_string()]
}

/// A temporary directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        let dir = std::env::temp_dir().join(crate::unique_name(prefix));
        std::fs::create_dir_all(&dir).expect("creating a temporary directory");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `contents` (bytes) to `name` inside the directory and returns the path.
    pub fn write_bytes(&self, name: &str, contents: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).expect("writing a temporary file");
        path
    }

    /// Writes `contents` to `name` inside the directory and returns the path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).expect("writing a temporary file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A manifest for `component` binding `input` and `output` (or the given sinks).
pub fn manifest(
    name: &str,
    component: &Path,
    sources: &[(&str, &str)],
    sinks: &[(&str, &str)],
    limits: &str,
) -> String {
    let mut text = format!(
        "name = {name:?}\ncomponent = {:?}\n[sources]\n",
        component.display().to_string()
    );
    for (logical, topic) in sources {
        text.push_str(&format!("{logical} = {topic:?}\n"));
    }
    text.push_str("[sinks]\n");
    for (logical, topic) in sinks {
        text.push_str(&format!("{logical} = {topic:?}\n"));
    }
    if !limits.is_empty() {
        text.push_str(&format!("[limits]\n{limits}\n"));
    }
    text
}

/// A running `sluice worker`; its stderr goes to a log file that tests can search.
pub struct WorkerProcess {
    child: Option<Child>,
    log: PathBuf,
}

impl WorkerProcess {
    /// Starts `sluice worker --bootstrap … <args>` with `SLUICE_LOG` at info.
    pub fn start(bootstrap: &str, log_dir: &Path, args: &[&str]) -> Result<WorkerProcess> {
        Self::start_with_env(bootstrap, log_dir, args, &[])
    }

    /// As [`start`](Self::start), with environment variables of its own (they win over the
    /// secured cluster's `worker` credentials).
    pub fn start_with_env(
        bootstrap: &str,
        log_dir: &Path,
        args: &[&str],
        env: &[(String, String)],
    ) -> Result<WorkerProcess> {
        Self::spawn(bootstrap, log_dir, args, env, true)
    }

    /// As [`start_with_env`](Self::start_with_env), but with none of the secured cluster's
    /// `worker` credentials: only `env` says how to connect (a worker without a client
    /// certificate, say).
    pub fn start_with_only_env(
        bootstrap: &str,
        log_dir: &Path,
        args: &[&str],
        env: &[(String, String)],
    ) -> Result<WorkerProcess> {
        Self::spawn(bootstrap, log_dir, args, env, false)
    }

    /// As [`start`](Self::start), running `binary` (another release's `sluice`).
    pub fn start_binary(binary: &Path, bootstrap: &str, log_dir: &Path, args: &[&str]) -> Result<WorkerProcess> {
        Self::spawn_binary(binary, bootstrap, log_dir, args, &[], true)
    }

    fn spawn(
        bootstrap: &str,
        log_dir: &Path,
        args: &[&str],
        env: &[(String, String)],
        as_worker: bool,
    ) -> Result<WorkerProcess> {
        Self::spawn_binary(&sluice_binary(), bootstrap, log_dir, args, env, as_worker)
    }

    fn spawn_binary(
        binary: &Path,
        bootstrap: &str,
        log_dir: &Path,
        args: &[&str],
        env: &[(String, String)],
        as_worker: bool,
    ) -> Result<WorkerProcess> {
        let log = log_dir.join(crate::unique_name("worker") + ".log");
        let file = std::fs::File::create(&log)?;
        let mut command = Command::new(binary);
        // On the secured cluster, workers connect as its `worker` principal.
        if let Some(kafka) = crate::secured_at(bootstrap).filter(|_| as_worker) {
            command.envs(kafka.env_as("worker"));
        }
        command.envs(env.iter().map(|(k, v)| (k, v)));
        let child = command
            .arg("worker")
            .arg("--bootstrap")
            .arg(bootstrap)
            .args(args)
            .env("SLUICE_LOG", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("starting sluice worker")?;
        Ok(WorkerProcess {
            child: Some(child),
            log,
        })
    }

    /// Everything the worker logged so far.
    pub fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut text);
        }
        text
    }

    /// Waits until a log line contains every one of `parts`; returns that line.
    pub fn wait_for_line(&mut self, parts: &[&str], timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.log().lines().find(|l| parts.iter().all(|p| l.contains(p))) {
                return Ok(line.to_string());
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!(
                    "the worker exited ({status}) before logging {parts:?}; its log:\n{}",
                    self.log()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "no log line with {parts:?} within {timeout:?}; the log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        self.signal("TERM")?;
        self.wait(timeout)
    }

    /// SIGKILL: no chance to flush or commit.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(child) = self.child.as_mut() {
            child.kill()?;
            child.wait()?;
        }
        self.child = None;
        Ok(())
    }

    pub fn wait(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut().context("the worker is not running")?;
        loop {
            if let Some(status) = child.try_wait()? {
                self.child = None;
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("the worker did not exit within {timeout:?}; its log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Peak resident memory of the process so far, in bytes (`VmHWM`).
    pub fn peak_rss(&self) -> Result<u64> {
        let pid = self.pid().context("the worker is not running")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let line = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .context("no VmHWM in /proc/PID/status")?;
        let kib: u64 = line.split_whitespace().nth(1).context("a VmHWM value")?.parse()?;
        Ok(kib * 1024)
    }

    /// OS threads of the process now.
    pub fn threads(&self) -> Result<u64> {
        self.status_field("Threads:")
    }

    /// Resident memory of the process now, in bytes (`VmRSS`).
    pub fn rss(&self) -> Result<u64> {
        Ok(self.status_field("VmRSS:")? * 1024)
    }

    /// CPU time the process has used (user + system), in seconds.
    pub fn cpu_seconds(&self) -> Result<f64> {
        let pid = self.pid().context("the worker is not running")?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // The fields after the command name (which may hold spaces) are in parentheses.
        let rest = &stat[stat.rfind(')').context("a /proc/PID/stat line")? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
        Ok(ticks as f64 / 100.0)
    }

    fn status_field(&self, name: &str) -> Result<u64> {
        let pid = self.pid().context("the worker is not running")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/PID/status"))?;
        Ok(line.split_whitespace().nth(1).context("a value")?.parse()?)
    }

    /// SIGSTOP: the whole process freezes (a stalled VM, a long GC pause, a debugger).
    pub fn freeze(&self) -> Result<()> {
        self.signal("STOP")
    }

    /// SIGCONT: a frozen worker wakes up, unaware of the time that passed.
    pub fn thaw(&self) -> Result<()> {
        self.signal("CONT")
    }

    fn signal(&self, name: &str) -> Result<()> {
        if let Some(child) = &self.child {
            let status = Command::new("kill")
                .arg(format!("-{name}"))
                .arg(child.id().to_string())
                .status()?;
            if !status.success() {
                bail!("kill -{name} {} failed", child.id());
            }
        }
        Ok(())
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Every entry of one store of a stopped worker, read with `sluice state dump`, in key order.
pub fn dump_store(state_dir: &Path, topology: &str, partition: i32, store: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let out = Command::new(sluice_binary())
        .args(["state", "dump", "--state-dir"])
        .arg(state_dir)
        .args([
            "--topology",
            topology,
            "--partition",
            &partition.to_string(),
            "--store",
            store,
        ])
        .output()?;
    if !out.status.success() {
        bail!("sluice state dump failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let unhex = |s: &str| -> Result<Vec<u8>> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(s.get(i..i + 2).unwrap_or("?"), 16).map_err(Into::into))
            .collect()
    };
    String::from_utf8(out.stdout)?
        .lines()
        .map(|line| {
            let (k, v) = line.split_once(' ').context("a dump line is `key value`")?;
            Ok((unhex(k)?, unhex(v)?))
        })
        .collect()
}

/// A store of counts (UTF-8 keys, 8-byte big-endian values, as word-count keeps them).
pub fn dump_counts(
    state_dir: &Path,
    topology: &str,
    partition: i32,
    store: &str,
) -> Result<std::collections::BTreeMap<String, u64>> {
    dump_store(state_dir, topology, partition, store)?
        .into_iter()
        .map(|(k, v)| {
            let count: [u8; 8] = v.try_into().map_err(|_| anyhow::anyhow!("a count of 8 bytes"))?;
            Ok((String::from_utf8(k)?, u64::from_be_bytes(count)))
        })
        .collect()
}

/// Worker `n` of `cluster`, running `topology` (a manifest; none: what is uploaded), with
/// state under `dir/state-{n}`, fast heartbeats and commits (every 200 ms unless `extra`
/// sets `--commit-interval`), and `extra` arguments. SIGTERM
/// stops it at once (`--no-drain-on-stop`), as the tests of handing tasks over expect;
/// [`draining_cluster_worker`] keeps the default, a drain.
pub fn cluster_worker(
    dir: &TempDir,
    topology: Option<&Path>,
    cluster: &str,
    n: usize,
    extra: &[&str],
) -> Result<WorkerProcess> {
    cluster_worker_with(dir, topology, cluster, n, extra, false)
}

/// A cluster worker as [`cluster_worker`], on the cluster at `bootstrap` (the OAUTHBEARER
/// one, say) rather than the run's.
pub fn cluster_worker_at(
    bootstrap: &str,
    dir: &TempDir,
    topology: Option<&Path>,
    cluster: &str,
    n: usize,
    extra: &[&str],
) -> Result<WorkerProcess> {
    cluster_worker_with_at(bootstrap, dir, topology, cluster, n, extra, false)
}

fn cluster_worker_with(
    dir: &TempDir,
    topology: Option<&Path>,
    cluster: &str,
    n: usize,
    extra: &[&str],
    default_stop: bool,
) -> Result<WorkerProcess> {
    cluster_worker_with_at(
        crate::kafka().bootstrap(),
        dir,
        topology,
        cluster,
        n,
        extra,
        default_stop,
    )
}

/// A cluster worker as [`draining_cluster_worker`] (SIGTERM drains it), running `binary`:
/// another release's `sluice` (see [`crate::releases`]).
pub fn release_cluster_worker(
    binary: &Path,
    dir: &TempDir,
    topology: Option<&Path>,
    cluster: &str,
    n: usize,
    extra: &[&str],
) -> Result<WorkerProcess> {
    let args = cluster_args(dir, topology, cluster, n, extra, true);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    WorkerProcess::start_binary(binary, crate::kafka().bootstrap(), dir.path(), &args)
}

fn cluster_worker_with_at(
    bootstrap: &str,
    dir: &TempDir,
    topology: Option<&Path>,
    cluster: &str,
    n: usize,
    extra: &[&str],
    default_stop: bool,
) -> Result<WorkerProcess> {
    let args = cluster_args(dir, topology, cluster, n, extra, default_stop);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    WorkerProcess::start(bootstrap, dir.path(), &args)
}

/// The arguments of cluster worker `n`: fast heartbeats and commits, state in
/// `<dir>/state-<n>`, then `extra`.
fn cluster_args(
    dir: &TempDir,
    topology: Option<&Path>,
    cluster: &str,
    n: usize,
    extra: &[&str],
    default_stop: bool,
) -> Vec<String> {
    let state = dir.path().join(format!("state-{n}"));
    let mut args: Vec<String> = vec![];
    if let Some(m) = topology {
        args.extend(["--topology".to_string(), m.to_str().unwrap().to_string()]);
    }
    args.extend(
        [
            "--cluster",
            cluster,
            "--state-dir",
            state.to_str().unwrap(),
            "--heartbeat-interval",
            "200ms",
            "--session-timeout",
            "6s",
        ]
        .map(String::from),
    );
    // Unless `extra` says otherwise (the flag may be given once).
    if !extra.contains(&"--commit-interval") {
        args.extend(["--commit-interval", "200ms"].map(String::from));
    }
    if !default_stop && !extra.contains(&"--drain-on-stop") {
        args.push("--no-drain-on-stop".into());
    }
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// A cluster worker as [`cluster_worker`], but with no stop flag: what SIGTERM does by
/// default (it drains).
pub fn draining_cluster_worker(
    dir: &TempDir,
    topology: Option<&Path>,
    cluster: &str,
    n: usize,
    extra: &[&str],
) -> Result<WorkerProcess> {
    cluster_worker_with(dir, topology, cluster, n, extra, true)
}
