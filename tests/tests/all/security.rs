//! A cluster that holds against its own tenants and its network: every attack tried as a
//! tenant (with Kafka access of its own and the admin API's address) or a stranger on the
//! network would try it, each answered as a user would expect.

use std::time::Duration;

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use sluice_tests::worker::{cluster_worker, guest, TempDir, WorkerProcess};
use sluice_tests::{free_port, http, kafka, unique_name};

use crate::registry::{cli, manifest};

/// The registry secret of the clusters these tests start.
const SECRET: &str = "correct horse battery staple, but longer";

/// A cluster of one worker with an admin token (`root-token`), two tenants (`alpha-token`,
/// `bravo-token`, namespaces `a-ID.` and `b-ID.`, each with an input and an output topic)
/// and the registry secret; `extra` is appended to its configuration file.
pub(crate) struct Secured {
    pub(crate) dir: TempDir,
    pub(crate) cluster: String,
    pub(crate) port: u16,
    pub(crate) a: String,
    pub(crate) b: String,
    pub(crate) worker: WorkerProcess,
}

impl Secured {
    pub(crate) async fn start(extra: &str) -> anyhow::Result<Secured> {
        let kafka = kafka();
        let id = unique_name("s");
        let (a, b) = (format!("a-{id}."), format!("b-{id}."));
        for ns in [&a, &b] {
            kafka.create_topic(&format!("{ns}in"), 2).await?;
            kafka.create_topic(&format!("{ns}out"), 2).await?;
        }
        let dir = TempDir::new("security");
        let hash = sluice::registry::tenants::hash_token;
        let config = dir.write(
            "sluice.toml",
            &format!(
                "registry.secret = \"{SECRET}\"\n{extra}\n[admin]\ntokens = [\"{}\"]\n\n\
                 [tenants.alpha]\ntokens = [\"{}\"]\nnamespace = \"{a}\"\n\n\
                 [tenants.bravo]\ntokens = [\"{}\"]\nnamespace = \"{b}\"\n",
                hash("root-token"),
                hash("alpha-token"),
                hash("bravo-token")
            ),
        );
        let cluster = unique_name("sec");
        let port = free_port();
        let admin = format!("127.0.0.1:{port}");
        let mut worker = cluster_worker(
            &dir,
            None,
            &cluster,
            0,
            &["--metrics", &admin, "--config", config.to_str().unwrap()],
        )?;
        worker.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
        Ok(Secured {
            dir,
            cluster,
            port,
            a,
            b,
            worker,
        })
    }

    pub(crate) fn admin(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `sluice deploy` of the uppercase topology `NS + name` (input to output of `ns`).
    pub(crate) fn deploy(
        &self,
        token: &str,
        ns: &str,
        name: &str,
        limits: &str,
    ) -> anyhow::Result<(bool, String, String)> {
        let m = self.dir.write(
            &format!("{name}.toml"),
            &manifest(
                &format!("{ns}{name}"),
                &[("input", &format!("{ns}in"))],
                &[("output", &format!("{ns}out"))],
                &if limits.is_empty() {
                    String::new()
                } else {
                    format!("[limits]\n{limits}")
                },
            ),
        );
        let upper = guest("uppercase");
        cli(&[
            "deploy",
            upper.to_str().unwrap(),
            "--manifest",
            m.to_str().unwrap(),
            "--admin",
            &self.admin(),
            "--token",
            token,
            "--output",
            "json",
        ])
    }

    /// `METHOD path` with `token` (none: no Authorization header).
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: &[u8],
    ) -> anyhow::Result<(u16, String)> {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers = vec![("content-type", "application/json")];
        if let Some(a) = &auth {
            headers.push(("authorization", a.as_str()));
        }
        http(self.port, method, path, &headers, body)
    }
}

/// Nobody without a token drains a worker or reads its status; a tenant reads only its
/// own tasks and cannot drain; only the admin drains.
#[tokio::test(flavor = "multi_thread")]
async fn drain_and_status_need_a_token_and_a_tenant_sees_only_its_own_tasks() -> anyhow::Result<()> {
    let mut s = Secured::start("").await?;
    let (ok, _, err) = s.deploy("alpha-token", &s.a.clone(), "shout", "")?;
    assert!(ok, "{err}");
    let (ok, _, err) = s.deploy("bravo-token", &s.b.clone(), "shout", "")?;
    assert!(ok, "{err}");
    // Both topologies' tasks run here.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (code, body) = s.call("GET", "/status", Some("root-token"), b"")?;
        assert_eq!(code, 200, "{body}");
        if body.contains(&format!("{}shout/1", s.a)) && body.contains(&format!("{}shout/1", s.b)) {
            break;
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "the tasks did not start: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let (code, body) = s.call("POST", "/drain", None, b"")?;
    assert_eq!(code, 401, "an unauthenticated drain: {body}");
    let (code, body) = s.call("POST", "/drain", Some("not-a-token"), b"")?;
    assert_eq!(code, 401, "a drain with a wrong token: {body}");
    let (code, body) = s.call("POST", "/drain", Some("alpha-token"), b"")?;
    assert_eq!(code, 403, "a tenant's drain: {body}");
    assert!(body.contains("admin-only"), "{body}");
    let (code, body) = s.call("GET", "/status", None, b"")?;
    assert_eq!(code, 401, "unauthenticated status: {body}");

    let (code, body) = s.call("GET", "/status", Some("alpha-token"), b"")?;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains(&format!("{}shout/0", s.a)),
        "alpha sees its own tasks: {body}"
    );
    assert!(!body.contains(&s.b), "alpha sees nothing of bravo's: {body}");

    // Still running after all that; the admin's drain is the one that counts.
    assert!(s.worker.pid().is_some());
    let (code, body) = s.call("POST", "/drain", Some("root-token"), b"")?;
    assert_eq!(code, 202, "{body}");
    assert!(s.worker.wait(Duration::from_secs(60))?.success(), "{}", s.worker.log());
    Ok(())
}

/// A tenant with write access to the registry topic (no ACLs) writes a tenant of its own
/// and a topology entry running as the admin with no caps: a worker skips both, counts
/// them, and the forged token opens nothing.
#[tokio::test(flavor = "multi_thread")]
async fn records_forged_into_the_registry_topic_are_not_believed() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    let topic = format!("sluice.cluster.{}.registry", s.cluster);
    let producer: ThreadedProducer<DefaultProducerContext> = kafka().config().create()?;
    let evil = serde_json::json!({
        "tokens": [sluice::registry::tenants::hash_token("evil-token")],
        "namespace": "evil.",
    });
    let value = serde_json::to_vec(&evil)?;
    producer
        .send(BaseRecord::to(&topic).key("n/evil").payload(&value).partition(0))
        .map_err(|(e, _)| e)?;
    // An entry claiming the admin uploaded it: the uppercase component's chunks and entry.
    let component = std::fs::read(guest("uppercase"))?;
    let digest = sluice::registry::digest(&component);
    let chunks: Vec<&[u8]> = component.chunks(sluice::registry::CHUNK_BYTES).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        producer
            .send(
                BaseRecord::to(&topic)
                    .key(&format!("c/{digest}/{i:05}"))
                    .payload(*chunk)
                    .partition(0),
            )
            .map_err(|(e, _)| e)?;
    }
    let name = format!("{}forged", s.b);
    let entry = serde_json::json!({
        "name": name,
        "version": 1,
        "manifest": format!("name = \"{name}\"\n[sources]\ninput = \"{}in\"\n[sinks]\noutput = \"{}out\"\n", s.b, s.a),
        "digest": digest,
        "size": component.len(),
        "chunks": chunks.len(),
        "uploaded_at_ms": 0,
        "partitions": 2,
        "sources": ["input"],
        "sinks": ["output"],
        "stores": [],
        "tenant": "admin",
    });
    let value = serde_json::to_vec(&entry)?;
    producer
        .send(
            BaseRecord::to(&topic)
                .key(&format!("t/{name}"))
                .payload(&value)
                .partition(0),
        )
        .map_err(|(e, _)| e)?;
    producer.flush(Duration::from_secs(30))?;
    // Give the worker time to read them (it reads the registry within a fraction of a second).
    tokio::time::sleep(Duration::from_secs(3)).await;

    let (code, body) = s.call("GET", "/v1/topologies", Some("evil-token"), b"")?;
    assert_eq!(code, 401, "a tenant forged into the registry: {body}");
    let (code, body) = s.call("GET", "/v1/topologies", Some("root-token"), b"")?;
    assert_eq!(code, 200, "{body}");
    assert!(!body.contains("forged"), "a forged entry is listed: {body}");
    let (_, status) = s.call("GET", "/status", Some("root-token"), b"")?;
    assert!(!status.contains("forged"), "a forged entry runs: {status}");
    let (_, metrics) = s.call("GET", "/metrics", Some("root-token"), b"")?;
    let rejected: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_registry_rejected_records_total"))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum();
    assert!(
        rejected >= 2.0 + chunks.len() as f64,
        "rejected records counted: {rejected}\n{metrics}"
    );
    let log = s.worker.log();
    assert!(
        log.contains("n/evil") && log.contains(&format!("t/{name}")),
        "each forged record is logged with its key"
    );
    Ok(())
}

/// Eight unauthenticated 60 MB bodies at once cost the worker less than 100 MB: the token
/// is checked before a body is read.
#[tokio::test(flavor = "multi_thread")]
async fn unauthenticated_bodies_are_refused_before_they_are_read() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    let before = s.worker.rss()?;
    let port = s.port;
    let sends: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                let body = vec![b'x'; 60 << 20];
                http(
                    port,
                    "POST",
                    "/v1/tenants",
                    &[("content-type", "application/json")],
                    &body,
                )
            })
        })
        .collect();
    let mut codes = Vec::new();
    for send in sends {
        codes.push(send.join().expect("a sender")?.0);
    }
    assert!(codes.iter().all(|c| *c == 401), "{codes:?}");
    let grown = s.worker.peak_rss()?.saturating_sub(before);
    assert!(
        grown < 100 << 20,
        "the worker grew by {} MB under eight 60 MB bodies",
        grown >> 20
    );
    Ok(())
}

/// A manifest may only lower the worker's limits; a tenant's caps include host memory.
#[tokio::test(flavor = "multi_thread")]
async fn a_manifest_cannot_raise_the_workers_limits() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    for (limits, named) in [
        ("host-memory = \"100GiB\"", "host-memory"),
        ("call-timeout = \"10m\"", "call-timeout"),
        ("memory = \"1GiB\"", "memory"),
        ("state = \"100GiB\"", "state"),
    ] {
        let (ok, out, err) = s.deploy("alpha-token", &s.a.clone(), "greedy", limits)?;
        assert!(!ok, "a manifest with {limits} deployed: {out}");
        assert!(err.contains("bad-limits") && err.contains(named), "{limits}: {err}");
    }
    let (ok, _, err) = s.deploy(
        "alpha-token",
        &s.a.clone(),
        "modest",
        "host-memory = \"8MiB\"\ncall-timeout = \"1s\"",
    )?;
    assert!(ok, "lowering the limits is allowed: {err}");
    Ok(())
}

/// A key that is not hex is a 400 naming it, not a dropped connection.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_that_is_not_hex_is_a_bad_request() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    let word_count = guest("word-count");
    let name = format!("{}wc", s.a);
    let m = s.dir.write(
        "wc.toml",
        &manifest(
            &name,
            &[("lines", &format!("{}in", s.a))],
            &[("counts", &format!("{}out", s.a))],
            "",
        ),
    );
    let (ok, _, err) = cli(&[
        "deploy",
        word_count.to_str().unwrap(),
        "--manifest",
        m.to_str().unwrap(),
        "--admin",
        &s.admin(),
        "--token",
        "alpha-token",
    ])?;
    assert!(ok, "{err}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    // `aéa`: four bytes, cut at two, in the middle of `é` (the old parser panicked there).
    for bad in ["a%C3%A9a", "%C3%A9%C3%A9", "zz", "abc"] {
        let path = format!("/v1/topologies/{name}/stores/counts?key_hex={bad}");
        let (code, body) = s.call("GET", &path, Some("alpha-token"), b"")?;
        assert_eq!(code, 400, "key_hex={bad}: {body}");
        assert!(body.contains("key_hex") && body.contains("not hex"), "{body}");
    }
    Ok(())
}

/// Namespaces that collide in Kafka's names (`.` and `_`), and any over `sluice.` (the
/// cluster's own topics), are refused.
#[tokio::test(flavor = "multi_thread")]
async fn namespaces_that_collide_or_reach_into_sluice_are_refused() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    let tenant = |name: &str, ns: &str| serde_json::to_vec(&serde_json::json!({"name": name, "namespace": ns}));
    let collide = s.a.replace('.', "_");
    for (name, ns, why) in [
        ("collides", collide.as_str(), "collide"),
        ("reaches", "sluice.", "sluice."),
        ("reaches2", "sluice_cluster", "sluice."),
        ("wide", "s", "sluice."),
    ] {
        let (code, body) = s.call("POST", "/v1/tenants", Some("root-token"), &tenant(name, ns)?)?;
        assert_eq!(code, 400, "namespace {ns:?}: {body}");
        assert!(
            body.contains("bad-tenant") && body.contains(why),
            "namespace {ns:?}: {body}"
        );
    }
    let (code, body) = s.call("POST", "/v1/tenants", Some("root-token"), &tenant("fine", "fine-ns.")?)?;
    assert_eq!(code, 201, "{body}");
    Ok(())
}

/// A worker with another assignor than the cluster's is refused when it joins, with an
/// error naming both; the task never runs on two workers.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_with_another_assignor_is_refused_at_join() -> anyhow::Result<()> {
    let kafka = kafka();
    let (input, output) = (unique_name("mix-in"), unique_name("mix-out"));
    kafka.create_topic(&input, 2).await?;
    kafka.create_topic(&output, 2).await?;
    let dir = TempDir::new("assignors");
    let m = dir.write(
        "shout.toml",
        &sluice_tests::worker::manifest(
            &unique_name("mix"),
            &guest("uppercase"),
            &[("input", &input)],
            &[("output", &output)],
            "",
        ),
    );
    let cluster = unique_name("mix");
    let mut eager = cluster_worker(&dir, Some(&m), &cluster, 0, &["--assignor", "eager"])?;
    eager.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let mut sticky = cluster_worker(&dir, Some(&m), &cluster, 1, &["--assignor", "sticky"])?;
    // The refusal (a worker first tries the protocol type of earlier versions, and says so).
    let line = sticky.wait_for_line(&["assignor", "refused it"], Duration::from_secs(60))?;
    assert!(line.contains("eager") && line.contains("sticky"), "{line}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !sticky.log().contains(": starting task="),
        "the refused worker started a task:\n{}",
        sticky.log()
    );
    drop(sticky);
    assert!(eager.terminate(Duration::from_secs(60))?.success(), "{}", eager.log());
    Ok(())
}

/// A multipart upload body (manifest and component) for `POST /v1/topologies`.
fn upload_body(manifest: &str, component: &[u8]) -> (String, Vec<u8>) {
    let boundary = "sluice-test-boundary-7d1b0f";
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

/// Every route of `docs/openapi.yaml`, called with no token, a wrong token, another
/// tenant's token and the right one (the owner's, or the admin's for admin routes): each
/// answers as the table says, and the table holds every route the document describes.
#[tokio::test(flavor = "multi_thread")]
async fn every_route_answers_each_kind_of_caller_as_the_table_says() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    let a = s.a.clone();
    let name = format!("{a}wc");
    let wc = std::fs::read(guest("word-count"))?;
    let wc_manifest = format!("name = \"{name}\"\n[sources]\nlines = \"{a}in\"\n[sinks]\ncounts = \"{a}out\"\n");
    let (upload_type, upload) = upload_body(&wc_manifest, &wc);
    let tenant_body = serde_json::to_vec(&serde_json::json!({"name": "charlie", "namespace": format!("c-{a}")}))?;
    let upper = std::fs::read(guest("uppercase"))?;
    let foreign = format!("name = \"{a}sneaky\"\n[sources]\ninput = \"{a}in\"\n[sinks]\noutput = \"{a}out\"\n");
    let (foreign_type, foreign_upload) = upload_body(&foreign, &upper);
    // An upload of alpha's checked in the background: its job is alpha's to read.
    let background = format!("name = \"{a}bg\"\n[sources]\ninput = \"{a}in\"\n[sinks]\noutput = \"{a}out\"\n");
    let (background_type, background_upload) = upload_body(&background, &upper);
    let (code, job) = http(
        s.port,
        "POST",
        "/v1/topologies?background=true",
        &[
            ("content-type", background_type.as_str()),
            ("authorization", "Bearer alpha-token"),
        ],
        &background_upload,
    )?;
    assert_eq!(code, 202, "a background upload: {job}");
    let job: serde_json::Value = serde_json::from_str(&job)?;
    let job = job["id"].as_str().expect("a job id").to_string();

    /// (method, path, content type, body, statuses for [no token, wrong token, other tenant, right]).
    type Row<'a> = (&'a str, String, &'a str, Vec<u8>, [u16; 4], &'a str);
    let json = "application/json";
    // In order: what a row creates, later rows use; what deletes comes last.
    let rows: Vec<Row> = vec![
        (
            "POST",
            "/v1/topologies".into(),
            &upload_type,
            upload.clone(),
            [401, 401, 403, 201],
            "alpha",
        ),
        (
            "GET",
            "/v1/topologies".into(),
            json,
            vec![],
            [401, 401, 200, 200],
            "alpha",
        ),
        (
            "GET",
            format!("/v1/topologies/{name}"),
            json,
            vec![],
            [401, 401, 404, 200],
            "alpha",
        ),
        (
            "GET",
            format!("/v1/topologies/{name}/stores/counts?key=x"),
            json,
            vec![],
            [401, 401, 404, 200],
            "alpha",
        ),
        ("GET", "/v1/tenants".into(), json, vec![], [401, 401, 200, 200], "root"),
        (
            "POST",
            "/v1/tenants".into(),
            json,
            tenant_body.clone(),
            [401, 401, 403, 201],
            "root",
        ),
        (
            "DELETE",
            "/v1/tenants/charlie".into(),
            json,
            vec![],
            [401, 401, 403, 200],
            "root",
        ),
        ("GET", "/v1/uploads".into(), json, vec![], [401, 401, 200, 200], "alpha"),
        (
            "GET",
            format!("/v1/uploads/{job}"),
            json,
            vec![],
            [401, 401, 404, 200],
            "alpha",
        ),
        ("GET", "/status".into(), json, vec![], [401, 401, 200, 200], "alpha"),
        ("GET", "/metrics".into(), json, vec![], [200, 200, 200, 200], "alpha"),
        ("GET", "/healthz".into(), json, vec![], [200, 200, 200, 200], "alpha"),
        ("GET", "/readyz".into(), json, vec![], [200, 200, 200, 200], "alpha"),
        (
            "GET",
            "/openapi.yaml".into(),
            json,
            vec![],
            [401, 401, 200, 200],
            "alpha",
        ),
        (
            "DELETE",
            format!("/v1/topologies/{name}"),
            json,
            vec![],
            [401, 401, 404, 200],
            "alpha",
        ),
        ("POST", "/drain".into(), json, vec![], [401, 401, 403, 202], "root"),
    ];
    // Another tenant's upload of a name in alpha's namespace.
    let (code, body) = http(
        s.port,
        "POST",
        "/v1/topologies",
        &[
            ("content-type", foreign_type.as_str()),
            ("authorization", "Bearer bravo-token"),
        ],
        &foreign_upload,
    )?;
    assert_eq!(code, 403, "bravo uploads into alpha's namespace: {body}");

    let mut wrong = Vec::new();
    for (method, path, content_type, body, expected, right) in &rows {
        let right = format!("{right}-token");
        let other = if right == "alpha-token" {
            "bravo-token"
        } else {
            "alpha-token"
        };
        for (i, token) in [None, Some("not-a-token"), Some(other), Some(right.as_str())]
            .iter()
            .enumerate()
        {
            let auth = token.map(|t| format!("Bearer {t}"));
            let mut headers = vec![("content-type", *content_type)];
            if let Some(a) = &auth {
                headers.push(("authorization", a.as_str()));
            }
            let (code, answer) = http(s.port, method, path, &headers, body)?;
            if code != expected[i] {
                wrong.push(format!(
                    "{method} {path} with {}: {code}, expected {} ({})",
                    token.unwrap_or("no token"),
                    expected[i],
                    answer.chars().take(200).collect::<String>()
                ));
            }
            if i == 2 && method == &"GET" && code == 200 && (path.starts_with("/v1/topologies") || path == "/status") {
                assert!(
                    !answer.contains(&name),
                    "{other} sees alpha's topology at {path}: {answer}"
                );
            }
            if i == 2 && code == 200 && path.starts_with("/v1/uploads") {
                assert!(
                    !answer.contains(&job),
                    "{other} sees alpha's upload at {path}: {answer}"
                );
            }
        }
        // Let an upload reach the registry (and the tasks start) before the routes that read it.
        if method == &"POST" && path == "/v1/topologies" {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
    }
    assert!(
        wrong.is_empty(),
        "routes answered otherwise than the table says:\n{}",
        wrong.join("\n")
    );

    // The table covers every route the document describes.
    let doc = std::fs::read_to_string(sluice_tests::repo_root().join("docs/openapi.yaml"))?;
    let mut described = Vec::new();
    let mut path = String::new();
    for line in doc.lines() {
        if let Some(p) = line.strip_prefix("  /").and_then(|p| p.strip_suffix(':')) {
            path = format!("/{p}");
        } else if let Some(m) = line.strip_prefix("    ").and_then(|m| m.strip_suffix(':')) {
            if ["get", "post", "put", "delete", "patch"].contains(&m) {
                described.push((m.to_uppercase(), path.clone()));
            }
        }
    }
    assert!(
        described.len() >= 13,
        "only {} routes read from the document",
        described.len()
    );
    let template = |p: &str| {
        p.replace(&name, "{name}")
            .replace("/stores/counts?key=x", "/stores/{store}")
            .replace("charlie", "{name}")
            .replace(&job, "{id}")
    };
    for (method, path) in &described {
        assert!(
            rows.iter().any(|(m, p, ..)| m == method && template(p) == *path),
            "{method} {path} is described but not in the table"
        );
    }
    Ok(())
}

/// Resets the peak resident memory (`VmHWM`) of a process to what it holds now.
fn reset_peak_rss(pid: u32) -> anyhow::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?;
    Ok(())
}

/// A store of 200 values of 900 KiB (zeros: little disk): a guest's `next-page(10000)` over
/// it, and a query of `limit=100000`, each make the worker hold their byte budget at most,
/// not every value before the cut.
#[tokio::test(flavor = "multi_thread")]
async fn large_values_cost_a_scan_and_a_query_only_their_budgets() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    let kafka = kafka();
    let name = format!("{}big", s.a);
    let m = s.dir.write(
        "big.toml",
        &manifest(
            &name,
            &[("input", &format!("{}in", s.a))],
            &[("output", &format!("{}out", s.a))],
            "",
        ),
    );
    let (ok, _, err) = cli(&[
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
    // One value per call (each within the host-memory budget), all on partition 0.
    let values: Vec<(String, String)> = (0..200)
        .map(|i| (format!("k{i}"), format!("big-value:{i:03}")))
        .collect();
    let records: Vec<(&str, &str)> = values.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    for chunk in records.chunks(20) {
        kafka.produce_to(&format!("{}in", s.a), 0, chunk).await?;
    }
    let group = format!("sluice-{name}");
    kafka
        .wait_committed(&group, &format!("{}in", s.a), 2, 200, Duration::from_secs(120))
        .await?;
    let pid = s.worker.pid().expect("running");
    let base = s.worker.rss()?;
    reset_peak_rss(pid)?;

    kafka
        .produce_to(&format!("{}in", s.a), 0, &[("scan", "scan-all")])
        .await?;
    kafka
        .wait_committed(&group, &format!("{}in", s.a), 2, 201, Duration::from_secs(120))
        .await?;
    let scanned = s.worker.peak_rss()?.saturating_sub(base);
    assert!(
        scanned < 100 << 20,
        "a scan over 180 MB of values made the worker grow by {} MB",
        scanned >> 20
    );

    reset_peak_rss(pid)?;
    let base = s.worker.rss()?;
    let (code, body) = s.call(
        "GET",
        &format!("/v1/topologies/{name}/stores/state?limit=100000"),
        Some("alpha-token"),
        b"",
    )?;
    assert_eq!(code, 200, "{}", &body[..body.len().min(300)]);
    let answer: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(
        answer["truncated"],
        true,
        "an answer cut at its budget says so: {}",
        &body[..body.len().min(600)]
    );
    let n = answer["entries"].as_array().map_or(0, Vec::len);
    assert!(n > 0 && n < 200, "{n} entries of 900 KiB in one answer");
    assert!(body.len() < 64 << 20, "an answer of {} MB", body.len() >> 20);
    let queried = s.worker.peak_rss()?.saturating_sub(base);
    assert!(
        queried < 100 << 20,
        "a query of limit=100000 made the worker grow by {} MB",
        queried >> 20
    );
    assert!(s.worker.pid().is_some(), "{}", s.worker.log());
    Ok(())
}

/// The uppercase component with `instances` more core instances at its top, each of a
/// module with one memory of `pages` pages: a component that creates many memories.
fn with_memories(instances: u32, pages: u32) -> anyhow::Result<Vec<u8>> {
    fn leb(mut v: u32, out: &mut Vec<u8>) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut bytes = std::fs::read(guest("uppercase"))?;
    // The core modules the component defines at its top level (sections of id 1) come first
    // in its module index space.
    let (mut at, mut modules) = (8, 0u32);
    while at < bytes.len() {
        let id = bytes[at];
        let (mut size, mut shift) = (0usize, 0);
        at += 1;
        loop {
            let b = bytes[at];
            at += 1;
            size |= ((b & 0x7f) as usize) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                break;
            }
        }
        if id == 1 {
            modules += 1;
        }
        at += size;
    }
    let mut module = vec![0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
    let mut memory = vec![0x01, 0x00];
    leb(pages, &mut memory);
    module.push(0x05);
    leb(memory.len() as u32, &mut module);
    module.extend(memory);
    bytes.push(0x01);
    leb(module.len() as u32, &mut bytes);
    bytes.extend(&module);
    let mut section = Vec::new();
    leb(instances, &mut section);
    for _ in 0..instances {
        section.push(0x00);
        leb(modules, &mut section);
        section.push(0x00);
    }
    bytes.push(0x02);
    leb(section.len() as u32, &mut bytes);
    bytes.extend(section);
    Ok(bytes)
}

/// A component whose core instances each get a memory as large as the limit would get many
/// times the limit; the cap holds for the instance as a whole, and a component is capped in
/// core instances and memories.
#[tokio::test(flavor = "multi_thread")]
async fn a_component_of_many_memories_gets_the_memory_limit_once() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    let a = s.a.clone();
    let upload = |name: &str, component: &[u8]| {
        let manifest = format!("name = \"{a}{name}\"\n[sources]\ninput = \"{a}in\"\n[sinks]\noutput = \"{a}out\"\n");
        let (content_type, body) = upload_body(&manifest, component);
        http(
            s.port,
            "POST",
            "/v1/topologies",
            &[
                ("content-type", content_type.as_str()),
                ("authorization", "Bearer alpha-token"),
            ],
            &body,
        )
    };
    // Three memories of 32 MiB: within the count, over the 64 MiB limit together.
    let (code, body) = upload("wide", &with_memories(3, 512)?)?;
    assert_eq!(code, 422, "three 32 MiB memories beside the component's own: {body}");
    assert!(body.contains("memory limit"), "{body}");
    // Forty small memories: over the count.
    let (code, body) = upload("many", &with_memories(40, 1)?)?;
    assert_eq!(code, 422, "forty memories: {body}");
    assert!(
        body.contains("too-many-instances") && body.contains("at most 32 core instances"),
        "{body}"
    );
    // The component as it is deploys.
    let (code, body) = upload("plain", &std::fs::read(guest("uppercase"))?)?;
    assert_eq!(code, 201, "{body}");
    Ok(())
}

/// A process in the cluster's group that keeps rejoining when told to; it assigns with
/// `assign` whenever it leads. Stops (leaving the group) when `stop` is set, and returns
/// every assignment it got.
fn rogue_member(
    group: String,
    tasks: Vec<sluice::group::TaskId>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<anyhow::Result<Vec<sluice::group::membership::Joined>>> {
    use sluice::group::membership::{Heartbeat, Membership, MembershipConfig};
    use sluice::group::metadata::{Assignment, MemberMetadata, CURRENT_VERSION};
    tokio::spawn(async move {
        let mut member = Membership::new(MembershipConfig {
            kafka: sluice::kafka::KafkaSettings::new(kafka().bootstrap()),
            group,
            assignor: "sticky".into(),
            secret: None,
            instance_id: None,
            session_timeout: Duration::from_secs(10),
            rebalance_timeout: Duration::from_secs(20),
        });
        let metadata = MemberMetadata {
            version: CURRENT_VERSION,
            supported: CURRENT_VERSION,
            capacity: 100,
            ..Default::default()
        };
        // As leader: every task to every other member, nothing to itself (a worker that
        // believed it would run them).
        let forge = |members: &std::collections::BTreeMap<String, MemberMetadata>| {
            members
                .keys()
                .map(|id| {
                    let a = Assignment {
                        active: tasks.clone(),
                        ..Default::default()
                    };
                    (id.clone(), a)
                })
                .collect()
        };
        let mut joined = vec![member.join(&metadata, forge).await?];
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(300)).await;
            match member.heartbeat(Duration::from_secs(5)).await? {
                Heartbeat::Alive | Heartbeat::Unreachable => {}
                Heartbeat::RejoinNeeded | Heartbeat::Lost => joined.push(member.join(&metadata, forge).await?),
            }
        }
        member.leave().await?;
        Ok(joined)
    })
}

/// A process that joins the cluster's group without the cluster secret (on a Kafka without
/// ACLs, where nothing stops it joining): as leader it hands out no task a worker runs (the
/// worker applies none of its assignments, removes it from the group and leads itself), and
/// as a follower it gets no tasks; the topology's records go through exactly once before,
/// between and after.
#[tokio::test(flavor = "multi_thread")]
async fn a_member_without_the_cluster_secret_takes_no_tasks_and_hands_out_none() -> anyhow::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let kafka = kafka();
    let (input, output) = (unique_name("rogue-in"), unique_name("rogue-out"));
    kafka.create_topic(&input, 2).await?;
    kafka.create_topic(&output, 2).await?;
    let dir = TempDir::new("rogue");
    let name = unique_name("rogue");
    let m = dir.write(
        "shout.toml",
        &sluice_tests::worker::manifest(
            &name,
            &guest("uppercase"),
            &[("input", &input)],
            &[("output", &output)],
            "",
        ),
    );
    let cluster = unique_name("rogue");
    let group = format!("sluice.cluster.{cluster}");
    let tasks: Vec<sluice::group::TaskId> = (0..2).map(|p| sluice::group::TaskId::new(&name, p)).collect();
    let records = |from: usize, to: usize| -> Vec<(Vec<u8>, Vec<u8>)> {
        (from..to)
            .map(|i| (format!("k{i}").into_bytes(), format!("v{i}").into_bytes()))
            .collect()
    };
    let expect = |from: usize, to: usize| -> Vec<String> {
        let mut v: Vec<String> = (from..to).map(|i| format!("V{i}")).collect();
        v.sort();
        v
    };
    let values = |got: &[sluice_tests::Received]| -> Vec<String> {
        let mut v: Vec<String> = got
            .iter()
            .map(|r| String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned())
            .collect();
        v.sort();
        v
    };

    // 1. The rogue leads the group before the worker joins it.
    let stop = Arc::new(AtomicBool::new(false));
    let rogue = rogue_member(group.clone(), tasks.clone(), stop.clone());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut worker = cluster_worker(&dir, Some(&m), &cluster, 0, &["--registry-secret", SECRET])?;
    kafka.produce(&input, &records(0, 50)).await?;
    let refused = worker.wait_for_line(&["assignment is not applied"], Duration::from_secs(60));
    assert!(
        refused.is_ok(),
        "the worker took the rogue's assignment:\n{}",
        worker.log()
    );
    // Every assignment the worker applied is its own (it leads alone): none is the rogue's,
    // which gave every member every task.
    worker.wait_for_line(&[" assignment ", "leader=true"], Duration::from_secs(30))?;
    let log = worker.log();
    for line in log
        .lines()
        .filter(|l| l.contains(" assignment ") && l.contains("generation="))
    {
        assert!(
            line.contains("leader=true"),
            "the worker applied another leader's assignment: {line}\n{log}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    let led = rogue.await??;
    assert!(
        led.iter().any(|j| j.leader),
        "the rogue never led the group, so this proved nothing"
    );

    // 2. The worker leads alone and runs both tasks: the first 50 records go through once.
    let got = kafka.consume(&output, 50, Duration::from_secs(90)).await;
    let got = match got {
        Ok(got) => got,
        Err(e) => panic!("{e:#}; the worker's log:\n{}", worker.log()),
    };
    assert_eq!(values(&got), expect(0, 50));

    // 3. The rogue joins the worker's group as a follower: it gets no task, the worker keeps
    // both, and 50 more records go through once.
    let stop = Arc::new(AtomicBool::new(false));
    let rogue = rogue_member(group.clone(), tasks.clone(), stop.clone());
    tokio::time::sleep(Duration::from_secs(6)).await;
    kafka.produce(&input, &records(50, 100)).await?;
    let got = match kafka.consume(&output, 100, Duration::from_secs(90)).await {
        Ok(got) => got,
        Err(e) => panic!("{e:#}; the worker's log:\n{}", worker.log()),
    };
    assert_eq!(values(&got), expect(0, 100), "every record exactly once");
    stop.store(true, Ordering::Relaxed);
    let followed = rogue.await??;
    assert!(!followed.is_empty());
    for j in &followed {
        assert!(!j.leader, "the rogue led the worker's group");
        assert!(
            j.assignment.active.is_empty() && j.assignment.standby.is_empty() && j.assignment.learner.is_empty(),
            "the rogue got tasks: {:?}",
            j.assignment
        );
        assert_eq!(
            j.assignment.error, 1,
            "the leader tells it its metadata is not believed"
        );
    }
    assert!(worker.terminate(Duration::from_secs(60))?.success(), "{}", worker.log());
    Ok(())
}

/// Files under `dir` (recursively) whose name contains `digest`.
fn files_naming(dir: &std::path::Path, digest: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for e in entries.flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if e.file_name().to_string_lossy().contains(digest) {
                found.push(path);
            }
        }
    }
    found
}

/// A deleted topology's component leaves every worker's disk: the component file the
/// registry assembled and its compiled form in the compile cache.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_topologys_component_leaves_every_workers_disk() -> anyhow::Result<()> {
    let s = Secured::start("").await?;
    let config = s.dir.path().join("sluice.toml");
    let mut second = cluster_worker(&s.dir, None, &s.cluster, 1, &["--config", config.to_str().unwrap()])?;
    second.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let digest = sluice::registry::digest(&std::fs::read(guest("uppercase"))?);
    let (ok, out, err) = s.deploy("alpha-token", &s.a, "gone", "")?;
    assert!(ok, "{out}{err}");
    let states = [s.dir.path().join("state-0"), s.dir.path().join("state-1")];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    // Each worker holds the component and its compiled form once it runs the topology.
    while states.iter().any(|d| files_naming(d, &digest).len() < 2) {
        assert!(
            std::time::Instant::now() < deadline,
            "the workers never held the component and its compiled form: {:?}",
            states.iter().map(|d| files_naming(d, &digest)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (ok, out, err) = cli(&[
        "topologies",
        "delete",
        &format!("{}gone", s.a),
        "--admin",
        &s.admin(),
        "--token",
        "alpha-token",
    ])?;
    assert!(ok, "{out}{err}");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while states.iter().any(|d| !files_naming(d, &digest).is_empty()) {
        assert!(
            std::time::Instant::now() < deadline,
            "a deleted topology's component is still on disk: {:?}",
            states.iter().map(|d| files_naming(d, &digest)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(second.terminate(Duration::from_secs(60))?.success(), "{}", second.log());
    Ok(())
}
