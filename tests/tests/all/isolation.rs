//! Tenants kept apart from each other, strangers from the tenants, and guests from the
//! worker (issue 34, the second round): what one tenant's calls, an unauthenticated caller's
//! sockets or a guest's WASI calls could learn or break before, each tried as an attacker
//! would.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use sluice::runtime::{Runtime, RuntimeConfig};
use sluice_tests::worker::guest;
use sluice_tests::{http, kafka};
use sluice_wire::wire::Writer;

use crate::registry::manifest;
use crate::security::Secured;

/// What the hostile guest's `ambient` record says WASI told it, word by word.
fn ambient(topology: &sluice::runtime::LoadedTopology) -> anyhow::Result<HashMap<String, String>> {
    let mut instance = topology.instantiate_in_memory("hostile/0")?;
    let mut batch = Writer::new();
    batch.push_input(None, Some(b"ambient"), 1000, 0, 0, 0, std::iter::empty());
    let output = instance.process(&batch.take())?;
    let records = output.records(1)?;
    anyhow::ensure!(records.len() == 1, "{} records", records.len());
    let text = String::from_utf8(records[0].value.unwrap_or_default().to_vec())?;
    Ok(text
        .split(' ')
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// A guest's WASI clocks say what `host.now-ms` says and no more: milliseconds of the
/// host's wall clock, and a monotonic clock in milliseconds from the instance's start (not
/// the host's uptime in nanoseconds). It has no environment, arguments, working directory or
/// stdin; `wasi:random` is random (each instance its own).
#[test]
fn a_guest_reads_no_clock_finer_than_host_now_ms_and_nothing_of_the_host() -> anyhow::Result<()> {
    let rt = Runtime::new(&RuntimeConfig {
        max_instances: 4,
        ..RuntimeConfig::default()
    })?;
    let hostile = rt.load(guest("hostile"))?;
    let seen = ambient(&hostile)?;
    let number = |k: &str| -> u128 { seen.get(k).and_then(|v| v.parse().ok()).unwrap_or(u128::MAX) };
    let host_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    for i in 0..5 {
        let wall = number(&format!("wall{i}"));
        assert_eq!(
            wall % 1_000_000,
            0,
            "wall clock reading {wall} ns is finer than 1 ms: {seen:?}"
        );
        assert!(
            host_now.abs_diff(wall) < 60_000_000_000,
            "the wall clock is not the host's time: {seen:?}"
        );
        let mono = number(&format!("mono{i}"));
        assert_eq!(
            mono % 1_000_000,
            0,
            "monotonic reading {mono} ns is finer than 1 ms: {seen:?}"
        );
        assert!(
            mono < 60_000_000_000,
            "the monotonic clock tells the host's uptime ({mono} ns): {seen:?}"
        );
    }
    for (k, v) in [("env", "0"), ("args", "0"), ("stdin", "0")] {
        assert_eq!(seen.get(k).map(String::as_str), Some(v), "{k}: {seen:?}");
    }
    // No working directory is given: the guest's libc starts at its own root.
    let cwd = seen.get("cwd").map(String::as_str);
    assert!(matches!(cwd, Some("None" | "Some(\"/\")")), "cwd: {seen:?}");
    let again = ambient(&hostile)?;
    assert_ne!(seen.get("random"), again.get("random"), "wasi:random repeats itself");
    Ok(())
}

/// Polls `what` until it holds or `timeout` passes.
async fn eventually(timeout: Duration, what: &str, mut f: impl FnMut() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !f()? {
        anyhow::ensure!(Instant::now() < deadline, "{what} did not happen within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// A guest's log message with a newline (and a carriage return, and a terminal escape)
/// stays on its own line of the worker's log, escaped: it cannot forge a line that looks
/// like the worker's own.
#[tokio::test(flavor = "multi_thread")]
async fn a_guest_log_message_forges_no_line_of_the_workers_log() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    let (a, name) = (s.a.clone(), format!("{}loud", s.a));
    let m = s.dir.write(
        "loud.toml",
        &manifest(
            &name,
            &[("input", &format!("{a}in"))],
            &[("output", &format!("{a}out"))],
            "",
        ),
    );
    let (ok, _, err) = crate::registry::cli(&[
        "deploy",
        guest("hostile").to_str().unwrap(),
        "--manifest",
        m.to_str().unwrap(),
        "--admin",
        &s.admin(),
        "--token",
        "alpha-token",
    ])?;
    assert!(ok, "{err}");
    kafka()
        .produce(&format!("{a}in"), &[(b"k".to_vec(), b"log-forge".to_vec())])
        .await?;
    eventually(Duration::from_secs(60), "the guest's log line", || {
        Ok(s.worker.log().contains("innocent"))
    })
    .await?;
    let log = s.worker.log();
    let forged: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("FORGED") && !l.contains("innocent"))
        .collect();
    assert!(
        forged.is_empty(),
        "a guest forged lines of the worker's log: {forged:?}"
    );
    let line = log.lines().find(|l| l.contains("innocent")).unwrap_or_default();
    assert!(
        line.contains(r"innocent\n2030-01-01") && !line.contains('\r') && !line.contains('\u{1b}'),
        "the message is escaped, not dropped: {line:?}"
    );
    Ok(())
}

/// A tenant's `/status` shows nothing of another tenant's: not its tasks, and not the
/// handovers of its tasks (here: bravo's tasks moving to a second worker as it joins, seen
/// from both workers).
#[tokio::test(flavor = "multi_thread")]
async fn a_tenants_status_shows_nothing_of_anothers_handovers() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    let (ok, _, err) = s.deploy("bravo-token", &s.b.clone(), "theirs", "")?;
    assert!(ok, "{err}");
    let theirs = format!("{}theirs", s.b);
    let running = |port: u16| -> anyhow::Result<bool> {
        let (_, body) = http(port, "GET", "/status", &[("authorization", "Bearer root-token")], b"")?;
        Ok(body.contains(&format!("{theirs}/0")) || body.contains(&format!("{theirs}/1")))
    };
    eventually(Duration::from_secs(60), "bravo's tasks running", || running(s.port)).await?;
    // A second worker joins: one of bravo's tasks moves to it.
    let port = sluice_tests::free_port();
    let (admin, config) = (format!("127.0.0.1:{port}"), s.dir.path().join("sluice.toml"));
    let _second = sluice_tests::worker::cluster_worker(
        &s.dir,
        None,
        &s.cluster,
        1,
        &["--metrics", &admin, "--config", config.to_str().unwrap()],
    )?;
    let handed = |port: u16| -> anyhow::Result<bool> {
        let (_, body) = http(port, "GET", "/status", &[("authorization", "Bearer root-token")], b"")?;
        let status: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        Ok(status["handovers"].as_array().is_some_and(|h| {
            h.iter()
                .any(|h| h["task"].as_str().is_some_and(|t| t.starts_with(&theirs)))
        }))
    };
    eventually(Duration::from_secs(90), "a handover of bravo's tasks", || {
        handed(s.port)
    })
    .await?;
    let (ok, _, err) = s.deploy("alpha-token", &s.a.clone(), "mine", "")?;
    assert!(ok, "{err}");
    eventually(Duration::from_secs(60), "alpha's tasks running", || {
        let (_, body) = s.call("GET", "/status", Some("alpha-token"), b"")?;
        Ok(body.contains(&format!("{}mine/", s.a)))
    })
    .await?;
    for port in [s.port, port] {
        let (code, body) = http(port, "GET", "/status", &[("authorization", "Bearer alpha-token")], b"")?;
        assert_eq!(code, 200, "{body}");
        assert!(
            !body.contains(&s.b),
            "alpha sees bravo's tasks or handovers on {port}: {body}"
        );
    }
    Ok(())
}

/// The topologies a `/metrics` answer names, from its `topology` labels.
fn topologies_in(metrics: &str) -> std::collections::BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            l.split_once("topology=\"")?
                .1
                .split_once('"')
                .map(|(t, _)| t.to_string())
        })
        .collect()
}

/// `/metrics` per caller: without a token, worker-level series only (no topology or task
/// is named); a tenant, its own topologies' series; the admin, everything.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_show_each_caller_only_its_own_topologies() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    let (ok, _, err) = s.deploy("alpha-token", &s.a.clone(), "mine", "")?;
    assert!(ok, "{err}");
    let (ok, _, err) = s.deploy("bravo-token", &s.b.clone(), "theirs", "")?;
    assert!(ok, "{err}");
    let (mine, theirs) = (format!("{}mine", s.a), format!("{}theirs", s.b));
    eventually(Duration::from_secs(60), "both topologies in the metrics", || {
        let (_, body) = s.call("GET", "/metrics", Some("root-token"), b"")?;
        let named = topologies_in(&body);
        Ok(named.contains(&mine) && named.contains(&theirs))
    })
    .await?;
    for token in [None, Some("not-a-token")] {
        let (code, body) = s.call("GET", "/metrics", token, b"")?;
        assert_eq!(code, 200, "{body}");
        assert!(
            !body.contains(&s.a) && !body.contains(&s.b) && !body.contains("task=\""),
            "public metrics ({token:?}) name tenants' topologies: {:?}",
            topologies_in(&body)
        );
        assert!(
            body.contains("sluice_tasks_running"),
            "worker-level series stay: {body}"
        );
    }
    let (code, body) = s.call("GET", "/metrics", Some("alpha-token"), b"")?;
    assert_eq!(code, 200, "{body}");
    assert_eq!(topologies_in(&body), [mine.clone()].into(), "alpha's metrics");
    assert!(!body.contains(&s.b), "alpha's metrics name bravo's: {body}");
    Ok(())
}

/// A multipart upload body (manifest and component) and its content type.
fn upload_body(manifest: &str, component: &[u8]) -> (String, Vec<u8>) {
    let boundary = "sluice-isolation-boundary-41c2";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"manifest\"; filename=\"m.toml\"\r\n\r\n{manifest}\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"component\"; filename=\"c.wasm\"\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(component);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// The error kind of an answer.
fn kind(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body).map_or_else(|_| body.to_string(), |v| v["error"].to_string())
}

/// Whether another tenant has a topology of some name cannot be told from any answer: an
/// upload, describe, delete or query of alpha's existing topology answers bravo exactly as
/// the same of a name nobody has.
#[tokio::test(flavor = "multi_thread")]
async fn another_tenants_names_answer_as_free_names_do() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    let (ok, _, err) = s.deploy("alpha-token", &s.a.clone(), "taken", "")?;
    assert!(ok, "{err}");
    let upper = std::fs::read(guest("uppercase"))?;
    let mut answers = Vec::new();
    for name in [format!("{}taken", s.a), format!("{}free", s.a)] {
        let m = manifest(
            &name,
            &[("input", &format!("{}in", s.b))],
            &[("output", &format!("{}out", s.b))],
            "",
        );
        let (content_type, body) = upload_body(&m, &upper);
        let auth = "Bearer bravo-token";
        let upload = http(
            s.port,
            "POST",
            "/v1/topologies",
            &[("content-type", &content_type), ("authorization", auth)],
            &body,
        )?;
        let mut seen = vec![("upload", upload.0, kind(&upload.1))];
        for (what, method, path) in [
            ("describe", "GET", format!("/v1/topologies/{name}")),
            ("delete", "DELETE", format!("/v1/topologies/{name}")),
            ("query", "GET", format!("/v1/topologies/{name}/stores/state?key=x")),
        ] {
            let (code, body) = s.call(method, &path, Some("bravo-token"), b"")?;
            seen.push((what, code, kind(&body)));
        }
        answers.push(seen);
    }
    assert_eq!(answers[0], answers[1], "bravo tells alpha's topology from a free name");
    assert_eq!(answers[0][0].1, 403, "{answers:?}");
    Ok(())
}

/// `local=true` (one worker's own stores, how workers ask each other) is the workers'
/// alone: a tenant's or the admin's is refused, as the API's description says.
#[tokio::test(flavor = "multi_thread")]
async fn a_local_query_is_for_workers_only() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    let (a, name) = (s.a.clone(), format!("{}wc", s.a));
    let m = s.dir.write(
        "wc.toml",
        &manifest(
            &name,
            &[("lines", &format!("{a}in"))],
            &[("counts", &format!("{a}out"))],
            "",
        ),
    );
    let (ok, _, err) = crate::registry::cli(&[
        "deploy",
        guest("word-count").to_str().unwrap(),
        "--manifest",
        m.to_str().unwrap(),
        "--admin",
        &s.admin(),
        "--token",
        "alpha-token",
    ])?;
    assert!(ok, "{err}");
    let path = format!("/v1/topologies/{name}/stores/counts?key=x");
    eventually(Duration::from_secs(60), "a query answered", || {
        Ok(s.call("GET", &path, Some("alpha-token"), b"")?.0 == 200)
    })
    .await?;
    for token in ["alpha-token", "root-token"] {
        let (code, body) = s.call("GET", &format!("{path}&local=true"), Some(token), b"")?;
        assert_eq!(code, 403, "{token}'s local query: {body}");
        assert!(body.contains("worker-only-reads"), "{body}");
    }
    Ok(())
}

/// One exchange on a connection of its own, every step bounded by `timeout`: the status.
fn probe(port: u16, path: &str, token: Option<&str>, timeout: Duration) -> anyhow::Result<u16> {
    let mut stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let answer = String::from_utf8_lossy(&answer);
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no HTTP answer: {answer:?}"))
}

/// 300 idle sockets from one peer (more than `admin.max.connections`) do not keep the
/// worker from answering its health checks and an authenticated caller.
#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_do_not_starve_health_checks() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    let idle: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", s.port)).ok())
        .collect();
    assert!(idle.len() >= 250, "only {} sockets opened", idle.len());
    let mut answered = 0;
    let mut failures = Vec::new();
    for _ in 0..21 {
        match probe(s.port, "/healthz", None, Duration::from_secs(2)) {
            Ok(200) => answered += 1,
            other => failures.push(format!("{other:?}")),
        }
    }
    assert!(answered >= 20, "/healthz answered {answered} of 21: {failures:?}");
    let status = probe(s.port, "/status", Some("root-token"), Duration::from_secs(5))?;
    assert_eq!(status, 200, "an authenticated /status under the flood");
    drop(idle);
    Ok(())
}

/// A request's line and headers fit in 64 KiB or are refused (431) before anything else is
/// read: a connection costs the worker that much at most, also unauthenticated. Malformed
/// and oversized inputs are answered with what is wrong, never a dropped connection.
#[tokio::test(flavor = "multi_thread")]
async fn oversized_and_malformed_requests_are_answered_and_bounded() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    let junk = "j".repeat(100 << 10);
    let (code, _) = http(s.port, "GET", "/healthz", &[("x-junk", &junk)], b"")?;
    assert_eq!(code, 431, "a 100 KiB header");
    let (code, _) = http(s.port, "GET", &format!("/healthz?{junk}"), &[], b"")?;
    assert!(code == 431 || code == 414, "a 100 KiB request line: {code}");
    let (code, body) = http(s.port, "GET", "/healthz", &[("x-junk", &junk[..1000])], b"")?;
    assert_eq!(code, 200, "a request with headers of ordinary size: {body}");
    for (method, path, body, expected) in [
        ("POST", "/v1/tenants", b"{not json".to_vec(), 400),
        ("POST", "/v1/tenants", vec![b' '; 100 << 10], 413),
        ("GET", "/v1/topologies/x/stores/y?limit=-1", Vec::new(), 400),
        ("GET", "/v1/topologies/..%2F..%2Fetc/stores/y", Vec::new(), 404),
        ("DELETE", "/v1/topologies/%0a%0d", Vec::new(), 404),
    ] {
        let (code, answer) = s.call(method, path, Some("root-token"), &body)?;
        assert_eq!(code, expected, "{method} {path}: {answer}");
    }
    Ok(())
}
