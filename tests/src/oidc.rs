//! A real OpenID Connect provider for the tests (`dev/oidc`: Keycloak): clients made with
//! the claims and audiences a test needs, their tokens, and key rotations.
//!
//! [`oidc()`] is the run's shared provider: `SLUICE_OIDC_ISSUER` when set (with the state
//! directory of the `dev/oidc up` that printed it), else the first call runs `dev/oidc up`
//! (which finds the running one, or starts it). Tests make clients of unique names, so they
//! share it without meeting.

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
    crate::dev_script("oidc", args, &[])
}

/// A client-credentials client of the provider.
#[derive(Debug, Clone)]
pub struct Client {
    pub id: String,
    pub secret: String,
    pub realm: String,
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
    let line = run(&args)?;
    let Some((got, secret)) = line.split_once(' ') else {
        bail!("dev/oidc client printed {line:?}, not ID SECRET");
    };
    anyhow::ensure!(got == id, "dev/oidc client printed id {got:?} for {id:?}");
    Ok(Client {
        id: id.into(),
        secret: secret.into(),
        realm: realm.into(),
    })
}

impl Client {
    /// A fresh access token.
    pub fn token(&self) -> Result<String> {
        run(&["token", &self.id, "--realm", &self.realm])
    }
}

/// Signs the realm's tokens with a new key and removes the old ones; the new key's id.
pub fn rotate_keys(realm: &str) -> Result<String> {
    oidc();
    run(&["rotate-keys", "--realm", realm])
}
