//! A real OpenID Connect provider for the tests (`dev/oidc`: Keycloak): clients made with
//! the claims and audiences a test needs, their tokens, and key rotations.
//!
//! [`oidc()`] is the run's shared provider: `SLUICE_OIDC_ISSUER` when set (with the state
//! directory of the `dev/oidc up` that printed it), else the first call runs `dev/oidc up`
//! (which finds the running one, or starts it). Tests make clients of unique names, so they
//! share it without meeting. A test that stops a provider, or rotates the keys of the realm
//! a Kafka trusts, takes a [`Provider`] of its own instead (`dev/oidc` with a state
//! directory of its own): on the shared one it would break every other test's tokens.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{bail, Result};

use crate::refuse_under_no_kafka;

/// The issuer of this test run's provider (its `sluice` realm).
pub fn oidc() -> &'static str {
    refuse_under_no_kafka();
    static ISSUER: OnceLock<String> = OnceLock::new();
    ISSUER.get_or_init(|| {
        let issuer = match std::env::var("SLUICE_OIDC_ISSUER") {
            Ok(url) if !url.trim().is_empty() => url.trim().to_string(),
            _ => run(&["up"]).unwrap_or_else(|e| panic!("no OpenID Connect provider for the tests: {e:#}")),
        };
        eprintln!("tests: using the OpenID Connect provider {issuer}");
        issuer
    })
}

/// The issuer of the provider's second realm (another issuer, with keys of its own).
pub fn other_issuer() -> String {
    oidc().replace("/realms/sluice", "/realms/other")
}

/// Runs `dev/oidc ARGS`; its last line of stdout.
pub fn run(args: &[&str]) -> Result<String> {
    run_in(None, args)
}

/// `dev/oidc ARGS` of the provider in `dir` (none: the shared one).
fn run_in(dir: Option<&Path>, args: &[&str]) -> Result<String> {
    match dir {
        Some(dir) => crate::dev_script("oidc", args, &[("SLUICE_OIDC_DIR", dir)]),
        None => crate::dev_script("oidc", args, &[]),
    }
}

/// A client-credentials client of the provider.
#[derive(Debug, Clone)]
pub struct Client {
    pub id: String,
    pub secret: String,
    pub realm: String,
    /// The state directory of its provider, if not the shared one.
    provider: Option<PathBuf>,
}

/// What a new client's tokens carry.
#[derive(Debug, Clone, Default)]
pub struct ClientSpec<'a> {
    pub audiences: &'a [&'a str],
    pub claims: &'a [(&'a str, &'a str)],
    /// `60s`, `5m`; none: the realm's five minutes.
    pub lifespan: Option<&'a str>,
    /// `other` for the second realm; none: `sluice`.
    pub realm: Option<&'a str>,
}

/// Makes (or remakes) client `id` as `spec` says.
pub fn client(id: &str, spec: ClientSpec<'_>) -> Result<Client> {
    oidc();
    client_in(None, id, spec)
}

fn client_in(provider: Option<&Path>, id: &str, spec: ClientSpec<'_>) -> Result<Client> {
    let realm = spec.realm.unwrap_or("sluice");
    let mut args: Vec<String> = vec!["client".into(), id.into(), "--realm".into(), realm.into()];
    for a in spec.audiences {
        args.extend(["--audience".into(), (*a).into()]);
    }
    for (k, v) in spec.claims {
        args.extend(["--claim".into(), format!("{k}={v}")]);
    }
    if let Some(l) = spec.lifespan {
        args.extend(["--lifespan".into(), l.into()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let line = run_in(provider, &args)?;
    let Some((got, secret)) = line.split_once(' ') else {
        bail!("dev/oidc client printed {line:?}, not ID SECRET");
    };
    anyhow::ensure!(got == id, "dev/oidc client printed id {got:?} for {id:?}");
    Ok(Client {
        id: id.into(),
        secret: secret.into(),
        realm: realm.into(),
        provider: provider.map(Path::to_path_buf),
    })
}

impl Client {
    /// A fresh access token.
    pub fn token(&self) -> Result<String> {
        run_in(self.provider.as_deref(), &["token", &self.id, "--realm", &self.realm])
    }
}

/// Signs the realm's tokens with a new key and removes the old ones; the new key's id.
pub fn rotate_keys(realm: &str) -> Result<String> {
    oidc();
    run(&["rotate-keys", "--realm", realm])
}

/// A provider of its own: `dev/oidc` with `SLUICE_OIDC_DIR` its state directory (a port,
/// realms, clients and keys of its own), left running like the shared one.
#[derive(Debug)]
pub struct Provider {
    dir: PathBuf,
    issuer: String,
}

impl Provider {
    /// The provider in `dir`: the one running there, or a new one (`dev/oidc up`).
    pub fn up(dir: &Path) -> Result<Provider> {
        crate::refuse_under_no_kafka();
        let issuer = run_in(Some(dir), &["up"])?;
        anyhow::ensure!(
            issuer.starts_with("http"),
            "dev/oidc up printed {issuer:?}, not an issuer"
        );
        Ok(Provider {
            dir: dir.to_path_buf(),
            issuer,
        })
    }

    /// The issuer of its `sluice` realm.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// Its state directory (`SLUICE_OIDC_DIR`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its token endpoint (of the `sluice` realm).
    pub fn token_endpoint(&self) -> String {
        format!("{}/protocol/openid-connect/token", self.issuer)
    }

    /// `dev/oidc ARGS` of this provider; its last line of stdout.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        run_in(Some(&self.dir), args)
    }

    /// Makes (or remakes) client `id` of this provider as `spec` says.
    pub fn client(&self, id: &str, spec: ClientSpec<'_>) -> Result<Client> {
        client_in(Some(&self.dir), id, spec)
    }

    /// Signs `realm`'s tokens with a new key and removes the old ones; the new key's id.
    pub fn rotate_keys(&self, realm: &str) -> Result<String> {
        self.run(&["rotate-keys", "--realm", realm])
    }

    /// Stops it (`dev/oidc stop`): a provider that is down, its clients kept.
    pub fn stop(&self) -> Result<()> {
        self.run(&["stop"]).map(drop)
    }

    /// Starts it again (`dev/oidc start`): the same port and clients, new keys.
    pub fn start(&self) -> Result<()> {
        let issuer = self.run(&["start"])?;
        anyhow::ensure!(
            issuer == self.issuer,
            "dev/oidc start came back as {issuer}, not {}",
            self.issuer
        );
        Ok(())
    }

    /// Whether it answers (`dev/oidc status`).
    pub fn answers(&self) -> bool {
        self.run(&["status"]).is_ok()
    }
}

/// A Kafka with OAUTHBEARER whose provider is its own: `dev/oidc` in `dev/.oidc-alone` and
/// `dev/kafka up --security sasl_oauthbearer --token-lifespan 20s --reauth-ms 5000` in
/// `dev/.kafka-oauth-alone`, both started on first use and left running like the others. For
/// tests that stop the provider or rotate the keys the brokers trust, which on the shared one
/// would break every other test's tokens; they share this one, so they take turns (`dev/test`
/// runs them one at a time, after the rest). The harness connects as `admin` (SCRAM), a
/// worker as `worker` with OAUTHBEARER ([`crate::Kafka::env_as`]); nobody but the admin has
/// ACLs here: a test grants what it needs (`sluice acls --worker --apply`).
pub fn oauth_alone() -> (&'static crate::Kafka, &'static Provider) {
    crate::refuse_under_no_kafka();
    static ALONE: OnceLock<(crate::Kafka, Provider)> = OnceLock::new();
    let (kafka, provider) = ALONE.get_or_init(|| {
        let started = (|| -> Result<(crate::Kafka, Provider)> {
            let provider = Provider::up(&crate::repo_root().join("dev").join(".oidc-alone"))?;
            let kafka = kafka_trusting(&provider, &crate::repo_root().join("dev").join(".kafka-oauth-alone"))?;
            Ok((kafka, provider))
        })()
        .unwrap_or_else(|e| panic!("no OAUTHBEARER Kafka with a provider of its own: {e:#}"));
        eprintln!(
            "tests: using the OAUTHBEARER Kafka at {} of the provider {}",
            started.0.bootstrap,
            started.1.issuer()
        );
        started
    });
    (kafka, provider)
}

/// `dev/kafka up --security sasl_oauthbearer` in `dir`, trusting `provider`'s tokens: the
/// cluster running there if it trusts that provider, else a new one.
fn kafka_trusting(provider: &Provider, dir: &Path) -> Result<crate::Kafka> {
    use anyhow::Context;
    let env = [("SLUICE_KAFKA_DIR", dir), ("SLUICE_OIDC_DIR", provider.dir())];
    let file = dir.join("cluster.json");
    let trusts = |file: &Path| -> Option<String> {
        let cluster: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file).ok()?).ok()?;
        cluster["security"]["oauth"]["issuer"].as_str().map(String::from)
    };
    // A cluster left running for a provider made anew since (`dev/oidc down`, or a stopped
    // one brought `up` again: another port) trusts an issuer that is gone.
    if trusts(&file).is_some_and(|issuer| issuer != provider.issuer()) {
        eprintln!(
            "tests: the OAUTHBEARER Kafka in {} trusts another provider; starting a new one",
            dir.display()
        );
        crate::dev_script("kafka", &["down"], &env)?;
    }
    let up = [
        "up",
        "--security",
        "sasl_oauthbearer",
        "--token-lifespan",
        "20s",
        "--reauth-ms",
        "5000",
    ];
    let bootstrap = crate::dev_script("kafka", &up, &env)?;
    anyhow::ensure!(
        trusts(&file).as_deref() == Some(provider.issuer()),
        "the OAUTHBEARER Kafka in {} does not trust {}",
        dir.display(),
        provider.issuer()
    );
    let cluster: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&file)?)?;
    let security = &cluster["security"];
    let users: std::collections::BTreeMap<String, String> = security["users"]
        .as_object()
        .context("no users in the OAUTHBEARER cluster's file")?
        .iter()
        .map(|(u, p)| (u.clone(), p.as_str().unwrap_or_default().to_string()))
        .collect();
    // Each user's OAUTHBEARER environment, as `dev/kafka credentials USER` prints it.
    let mut oauth = std::collections::BTreeMap::new();
    for user in users.keys() {
        let out = std::process::Command::new(crate::repo_root().join("dev").join("kafka"))
            .args(["credentials", user])
            .env("SLUICE_KAFKA_DIR", dir)
            .output()?;
        anyhow::ensure!(out.status.success(), "dev/kafka credentials {user} failed");
        let env = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        oauth.insert(user.clone(), env);
    }
    Ok(crate::Kafka {
        bootstrap,
        security: Some(crate::Security {
            ca: PathBuf::from(
                security["ca"]
                    .as_str()
                    .context("no CA in the OAUTHBEARER cluster's file")?,
            ),
            users,
            oauth,
            certificates: Default::default(),
            dir: dir.to_path_buf(),
        }),
    })
}

impl crate::Kafka {
    /// What this secured cluster's brokers logged so far (every node's `server.log`, one
    /// after the other): where Kafka says why it refused a token.
    pub fn broker_log(&self) -> Result<String> {
        use anyhow::Context;
        let s = self.security.as_ref().context("not a secured cluster of the harness")?;
        let cluster: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(s.dir.join("cluster.json"))?)?;
        let mut text = String::new();
        for node in cluster["nodes"].as_array().context("no nodes in the cluster's file")? {
            let log = node["log"]
                .as_str()
                .context("a node without a log in the cluster's file")?;
            text.push_str(&String::from_utf8_lossy(&std::fs::read(log)?));
        }
        Ok(text)
    }
}
