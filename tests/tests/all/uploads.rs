//! Uploads cost what they are allowed to: a tenant's quota holds against uploads sent at
//! once, a component that would take too long to compile is refused before it is compiled,
//! and a tenant's largest uploads, sent at once, cost a worker a bounded amount of memory.

use std::time::Duration;

use sluice::registry::tenants::hash_token;
use sluice_tests::worker::{cluster_worker, guest, TempDir, WorkerProcess};
use sluice_tests::{free_port, http, kafka, unique_name};

const SECRET: &str = "correct horse battery staple, but longer";

/// A multipart upload body (manifest and component) for `POST /v1/topologies`.
fn upload_body(manifest: &str, component: &[u8]) -> (String, Vec<u8>) {
    let boundary = "sluice-upload-test-3f9a2c";
    let mut body = Vec::new();
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"manifest\"; filename=\"m.toml\"\r\n\r\n{manifest}\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"component\"; filename=\"c.wasm\"\r\n\
             Content-Type: application/wasm\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(component);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

fn leb(mut n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return out;
        }
        out.push(byte | 0x80);
    }
}

/// `component` with a custom section appended that makes it `size` bytes (a valid
/// component: custom sections may stand anywhere and are not compiled).
fn padded(component: &[u8], size: usize) -> Vec<u8> {
    let name = b"padding";
    let payload = size.saturating_sub(component.len() + 16);
    let mut content = leb(name.len());
    content.extend_from_slice(name);
    content.resize(content.len() + payload, 0);
    let mut out = component.to_vec();
    out.push(0);
    out.extend(leb(content.len()));
    out.extend(content);
    out
}

/// One worker with the secret, an admin token and tenant `alpha` (`alpha-token`) whose
/// `limits` (TOML lines) are given, in namespace `ns`.
struct Uploads {
    _dir: TempDir,
    port: u16,
    ns: String,
    worker: WorkerProcess,
}

impl Uploads {
    async fn start(prefix: &str, limits: &str, extra: &[&str]) -> anyhow::Result<Uploads> {
        let ns = format!("{}.", unique_name(prefix));
        kafka().create_topic(&format!("{ns}in"), 1).await?;
        kafka().create_topic(&format!("{ns}out"), 1).await?;
        let dir = TempDir::new(prefix);
        let config = dir.write(
            "sluice.toml",
            &format!(
                "registry.secret = \"{SECRET}\"\n[admin]\ntokens = [\"{}\"]\n\n[tenants.alpha]\ntokens = [\"{}\"]\n\
                 namespace = \"{ns}\"\n{limits}\n",
                hash_token("root-token"),
                hash_token("alpha-token"),
            ),
        );
        let port = free_port();
        let admin = format!("127.0.0.1:{port}");
        let mut args = vec!["--metrics", admin.as_str(), "--config", config.to_str().unwrap()];
        args.extend_from_slice(extra);
        let mut worker = cluster_worker(&dir, None, &unique_name(prefix), 0, &args)?;
        worker.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
        Ok(Uploads {
            _dir: dir,
            port,
            ns,
            worker,
        })
    }

    /// Uploads `component` as topology `NS + name` (uppercase: input to output) as alpha.
    fn upload(&self, name: &str, component: &[u8]) -> anyhow::Result<(u16, String)> {
        let ns = &self.ns;
        let manifest = format!("name = \"{ns}{name}\"\n[sources]\ninput = \"{ns}in\"\n[sinks]\noutput = \"{ns}out\"\n");
        let (content_type, body) = upload_body(&manifest, component);
        http(
            self.port,
            "POST",
            "/v1/topologies",
            &[("content-type", &content_type), ("authorization", "Bearer alpha-token")],
            &body,
        )
    }
}

/// Five uploads sent at once by a tenant allowed one topology of two tasks: one is stored,
/// four are refused (they all used to be stored: each checked against what was there before
/// any of them).
#[tokio::test(flavor = "multi_thread")]
async fn uploads_sent_at_once_do_not_pass_a_tenants_quota_together() -> anyhow::Result<()> {
    let u = std::sync::Arc::new(Uploads::start("quota", "max-topologies = 1\nmax-tasks = 2", &[]).await?);
    let component = std::sync::Arc::new(std::fs::read(guest("uppercase"))?);
    let sends: Vec<_> = (0..5)
        .map(|i| {
            let (u, c) = (u.clone(), component.clone());
            std::thread::spawn(move || u.upload(&format!("t{i}"), &c))
        })
        .collect();
    let mut codes = Vec::new();
    for s in sends {
        let (code, body) = s.join().expect("the upload thread")?;
        codes.push(code);
        assert!(
            code == 201 || (code == 403 && body.contains("max-topologies")),
            "{code} {body}"
        );
    }
    codes.sort();
    assert_eq!(codes, [201, 403, 403, 403, 403], "{}", u.worker.log());
    Ok(())
}

/// A component of 200,000 empty functions (under a megabyte) is refused before it is
/// compiled, naming the bound; it used to take 14–21 s and 1.1 GB to compile, on every
/// worker.
#[tokio::test(flavor = "multi_thread")]
async fn a_component_too_costly_to_compile_is_refused_before_compiling() -> anyhow::Result<()> {
    let u = Uploads::start("functions", "", &[]).await?;
    let bomb = sluice_tests::many_functions(200_000);
    assert!(bomb.len() < 1 << 20);
    let started = std::time::Instant::now();
    let (code, body) = u.upload("bomb", &bomb)?;
    let took = started.elapsed();
    assert_eq!(code, 422, "{body}");
    assert!(
        body.contains("too-complex") && body.contains("200000 functions") && body.contains("component.max.functions"),
        "{body}"
    );
    assert!(took < Duration::from_secs(5), "refusing it took {took:?}");
    Ok(())
}

/// Eight uploads of the largest component a tenant may send (24 MiB here), sent at once:
/// the worker reads and checks them one at a time for the tenant, so its memory grows by a
/// bounded number of times one component (the body, its registry records, the reader's
/// chunks and the file loaded; compiles run in a child: 107 MiB measured), whatever the
/// number sent; it used to grow by all of them at once (522 MiB here; 327–469 MB for eight
/// of 60 MB).
#[tokio::test(flavor = "multi_thread")]
async fn a_tenants_largest_uploads_sent_at_once_cost_a_bounded_amount_of_memory() -> anyhow::Result<()> {
    const SIZE: usize = 24 << 20;
    let u = std::sync::Arc::new(Uploads::start("large", "", &["--max-component-size", "24MiB"]).await?);
    let component = std::sync::Arc::new(padded(&std::fs::read(guest("uppercase"))?, SIZE - 4096));
    let pid = u.worker.pid().expect("running");
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?;
    let before = u.worker.rss()?;
    let sends: Vec<_> = (0..8)
        .map(|i| {
            let (u, c) = (u.clone(), component.clone());
            std::thread::spawn(move || u.upload(&format!("big{i}"), &c))
        })
        .collect();
    for s in sends {
        let (code, body) = s.join().expect("the upload thread")?;
        assert_eq!(code, 201, "{body}");
    }
    let peak = u.worker.peak_rss()?;
    let grown = peak.saturating_sub(before);
    println!(
        "eight uploads of {} MiB at once: the worker's peak grew {} MiB",
        SIZE >> 20,
        grown >> 20
    );
    assert!(
        grown < 8 * SIZE as u64,
        "the worker grew {} MiB for eight uploads of {} MiB",
        grown >> 20,
        SIZE >> 20
    );
    Ok(())
}

/// An upload checked in the background (`?background=true`, what `sluice deploy` sends):
/// the answer comes before the compile (a Python component: seconds of Cranelift), the
/// worker's `/status` shows the compile under way with its topology, and the job ends
/// stored, with the registry entry; a bad component's job ends failed with the error the
/// upload would have answered.
#[tokio::test(flavor = "multi_thread")]
async fn an_upload_compiles_in_the_background_with_its_progress_in_status() -> anyhow::Result<()> {
    let u = Uploads::start("background", "", &[]).await?;
    let ns = u.ns.clone();
    let post = |name: &str, component: &[u8]| -> anyhow::Result<(u16, serde_json::Value)> {
        let manifest = format!("name = \"{ns}{name}\"\n[sources]\ninput = \"{ns}in\"\n[sinks]\noutput = \"{ns}out\"\n");
        let (content_type, body) = upload_body(&manifest, component);
        let (code, answer) = http(
            u.port,
            "POST",
            "/v1/topologies?background=true",
            &[("content-type", &content_type), ("authorization", "Bearer alpha-token")],
            &body,
        )?;
        Ok((
            code,
            serde_json::from_str(&answer).unwrap_or(serde_json::Value::String(answer)),
        ))
    };
    let get = |path: &str, token: &str| -> anyhow::Result<serde_json::Value> {
        let (code, answer) = http(
            u.port,
            "GET",
            path,
            &[("authorization", &format!("Bearer {token}"))],
            b"",
        )?;
        anyhow::ensure!(code == 200, "GET {path}: {code} {answer}");
        Ok(serde_json::from_str(&answer)?)
    };
    // Compiled by this worker (no shared compile cache): a real compile.
    let component = std::fs::read(guest("python/uppercase"))?;
    let started = std::time::Instant::now();
    let (code, job) = post("py", &component)?;
    let answered = started.elapsed();
    assert_eq!(code, 202, "{job}");
    assert_eq!(job["state"], "checking", "{job}");
    let id = job["id"].as_str().expect("a job id").to_string();
    let topology = format!("{ns}py");
    let mut seen_compiling = None;
    let done = loop {
        let status = get("/status", "root-token")?;
        if let Some(c) = status["compiles"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["topology"] == topology.as_str() && c["state"] == "compiling")
        {
            seen_compiling.get_or_insert(c.clone());
        }
        let job = get(&format!("/v1/uploads/{id}"), "alpha-token")?;
        if job["state"] != "checking" {
            break job;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "still checking: {job}\n{}",
            u.worker.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = started.elapsed();
    assert_eq!(done["state"], "stored", "{done}\n{}", u.worker.log());
    assert_eq!(
        (done["entry"]["name"].as_str(), done["entry"]["version"].as_u64()),
        (Some(topology.as_str()), Some(1))
    );
    let compiling = seen_compiling.unwrap_or_else(|| panic!("/status never showed the compile of {topology}"));
    assert_eq!(compiling["bytes"].as_u64(), Some(component.len() as u64), "{compiling}");
    assert!(
        answered < took / 2,
        "the upload was answered after {answered:?}, its check ended after {took:?}: not in the background"
    );
    let status = get("/status", "root-token")?;
    let compiled = status["compiles"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["topology"] == topology.as_str())
        .cloned()
        .unwrap_or_default();
    assert_eq!(compiled["state"], "compiled", "{status}");
    // The tenant sees its own job in the list.
    let jobs = get("/v1/uploads", "alpha-token")?;
    assert!(
        jobs.as_array()
            .is_some_and(|j| j.iter().any(|j| j["id"] == id.as_str())),
        "{jobs}"
    );

    // Not a component: the job fails as the upload would have (400 not-a-component).
    let (code, job) = post("junk", b"this is not wasm")?;
    assert_eq!(code, 202, "{job}");
    let id = job["id"].as_str().expect("a job id").to_string();
    let failed = loop {
        let job = get(&format!("/v1/uploads/{id}"), "alpha-token")?;
        if job["state"] != "checking" {
            break job;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(
        (failed["error"]["status"].as_u64(), failed["error"]["error"].as_str()),
        (Some(400), Some("not-a-component")),
        "{failed}"
    );
    assert!(
        failed["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("magic"),
        "{failed}"
    );
    // An unknown job is not found.
    let (code, _) = http(
        u.port,
        "GET",
        "/v1/uploads/nope",
        &[("authorization", "Bearer alpha-token")],
        b"",
    )?;
    assert_eq!(code, 404);
    Ok(())
}
