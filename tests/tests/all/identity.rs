//! Identity as enterprises run it, against a real OpenID Connect provider (`dev/oidc`,
//! Keycloak): JWTs at the admin API, mapped to a tenant or a role by their claims, beside the
//! static tokens; every kind of bad token refused with its reason, and never echoed.

use std::time::Duration;

use base64::Engine as _;
use sluice_tests::oidc::{self, client, ClientSpec};
use sluice_tests::worker::{guest, TempDir, WorkerProcess};
use sluice_tests::{free_port, kafka, unique_name};

use crate::registry::{cli, manifest, worker};

const AUDIENCE: &str = "sluice-admin";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn unb64(text: &str) -> Vec<u8> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text).unwrap()
}

/// The (header, claims) of a token, as JSON.
fn parts(token: &str) -> (serde_json::Value, serde_json::Value) {
    let mut it = token.split('.');
    let h = serde_json::from_slice(&unb64(it.next().unwrap())).unwrap();
    let c = serde_json::from_slice(&unb64(it.next().unwrap())).unwrap();
    (h, c)
}

/// A raw request to the admin API: (status, body).
async fn get(admin: &str, path: &str, token: &str) -> anyhow::Result<(u16, String)> {
    let answer = reqwest::Client::new()
        .get(format!("http://{admin}{path}"))
        .bearer_auth(token)
        .send()
        .await?;
    Ok((answer.status().as_u16(), answer.text().await?))
}

/// Tenants, an operator and the admin through JWTs of the company's provider: each sees and
/// does what its claims give it (a tenant's JWT only its tenant, at no other tenant's routes),
/// static tokens keep working beside them, and every token that should not pass is refused
/// with a 401 or 403 naming why, without the token in the answer.
#[tokio::test(flavor = "multi_thread")]
async fn jwts_of_the_provider_map_to_tenants_and_roles_and_every_bad_token_is_refused_with_its_reason(
) -> anyhow::Result<()> {
    let kafka = kafka();
    let issuer = oidc::oidc();
    let id = unique_name("j");
    let (a, b) = (format!("a-{id}."), format!("b-{id}."));
    for ns in [&a, &b] {
        kafka.create_topic(&format!("{ns}in"), 1).await?;
        kafka.create_topic(&format!("{ns}out"), 1).await?;
    }
    let aud = [AUDIENCE];
    let make = |name: &str, claims: &[(&str, &str)]| {
        client(
            &format!("{name}-{id}"),
            ClientSpec {
                audiences: &aud,
                claims,
                ..Default::default()
            },
        )
    };
    let alpha = make("alpha", &[("sluice_tenant", "alpha")])?;
    let bravo = make("bravo", &[("sluice_tenant", "bravo")])?;
    let ops = make("ops", &[("sluice_role", "operator")])?;
    let root = make("root", &[("sluice_role", "admin")])?;
    let nobody = make("nobody", &[])?;
    let stranger = make("stranger", &[("sluice_tenant", "globex")])?;
    let elsewhere = client(
        &format!("elsewhere-{id}"),
        ClientSpec {
            claims: &[("sluice_tenant", "alpha")],
            ..Default::default()
        },
    )?;
    let short = client(
        &format!("short-{id}"),
        ClientSpec {
            audiences: &aud,
            claims: &[("sluice_tenant", "alpha")],
            lifespan: Some("2s"),
            ..Default::default()
        },
    )?;
    let other_realm = client(
        &format!("other-{id}"),
        ClientSpec {
            audiences: &aud,
            claims: &[("sluice_tenant", "alpha")],
            realm: Some("other"),
            ..Default::default()
        },
    )?;

    let dir = TempDir::new("jwt");
    let hash = |t: &str| sluice::registry::tenants::hash_token(t);
    let config = dir.write(
        "sluice.toml",
        &format!(
            "registry.secret = \"the jwt test's cluster secret\"\n\
             [admin]\ntokens = [\"{}\"]\n\
             jwt.issuer = \"{issuer}\"\njwt.audience = \"{AUDIENCE}\"\njwt.leeway.ms = \"1s\"\n\
             jwt.jwks.min.refresh.ms = \"2s\"\n\n[tenants.alpha]\ntokens = [\"{}\"]\nnamespace = \"{a}\"\n\n\
             [tenants.bravo]\nnamespace = \"{b}\"\n",
            hash("static-root"),
            hash("static-alpha"),
        ),
    );
    let port = free_port();
    let cluster = unique_name("c");
    let mut w = worker(&dir, &cluster, 0, port, &["--config", config.to_str().unwrap()])?;
    w.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let admin = format!("127.0.0.1:{port}");
    let as_ = |token: &str, args: &[&str]| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend_from_slice(&["--admin", &admin, "--token", token, "--output", "json"]);
        cli(&all)
    };
    let upper = guest("uppercase");
    let shout = |ns: &str, name: &str| {
        dir.write(
            &format!("{name}.toml"),
            &manifest(
                &format!("{ns}{name}"),
                &[("input", &format!("{ns}in"))],
                &[("output", &format!("{ns}out"))],
                "",
            ),
        )
    };
    let deploy_as = |token: &str, m: &std::path::Path| {
        as_(
            token,
            &["deploy", upper.to_str().unwrap(), "--manifest", m.to_str().unwrap()],
        )
    };
    let names = |token: &str| -> anyhow::Result<Vec<String>> {
        let (ok, out, err) = as_(token, &["topologies", "list"])?;
        anyhow::ensure!(ok, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out)?;
        let mut n: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect();
        n.sort();
        Ok(n)
    };

    // Each tenant deploys with its JWT and sees only its own.
    let (alpha_jwt, bravo_jwt) = (alpha.token()?, bravo.token()?);
    let (ok, _, err) = deploy_as(&alpha_jwt, &shout(&a, "shout"))?;
    assert!(ok, "alpha's JWT deploys: {err}");
    let (ok, _, err) = deploy_as(&bravo_jwt, &shout(&b, "shout"))?;
    assert!(ok, "bravo's JWT deploys: {err}");
    assert_eq!(names(&alpha_jwt)?, vec![format!("{a}shout")]);
    assert_eq!(names(&bravo_jwt)?, vec![format!("{b}shout")]);
    // The static tokens beside them: alpha's sees the same as alpha's JWT.
    assert_eq!(names("static-alpha")?, vec![format!("{a}shout")]);
    assert_eq!(names("static-root")?.len(), 2);
    // Alpha's JWT at bravo's routes: nothing to see, nothing to delete.
    let theirs = format!("{b}shout");
    for args in [
        &["topologies", "describe", &theirs][..],
        &["topologies", "delete", &theirs][..],
    ] {
        let (ok, _, err) = as_(&alpha_jwt, args)?;
        assert!(!ok && err.contains("[not-found]"), "alpha's JWT at {args:?}: {err}");
    }
    assert!(
        !deploy_as(&alpha_jwt, &shout(&b, "mine"))?.0,
        "alpha's JWT deploys into bravo's namespace"
    );
    // Status: a tenant's JWT sees its own tasks only (once both topologies run here).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = get(&admin, "/status", "static-root").await?;
        if status == 200 && body.contains(&theirs) && body.contains(&format!("{a}shout")) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the topologies never ran here: {body}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (status, body) = get(&admin, "/status", &alpha_jwt).await?;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(&format!("{a}shout")) && !body.contains(&theirs),
        "alpha's status shows bravo's: {body}"
    );
    // `sluice status` with alpha's JWT: its tasks, and its share of the worker's counts.
    let status_as = |token: &str| -> anyhow::Result<serde_json::Value> {
        let (ok, out, err) = cli(&[
            "status",
            "--bootstrap",
            kafka.bootstrap(),
            "--cluster",
            &cluster,
            "--token",
            token,
            "--output",
            "json",
        ])?;
        anyhow::ensure!(ok, "sluice status: {err}");
        Ok(serde_json::from_str(&out)?)
    };
    let seen = status_as(&alpha_jwt)?;
    let text = seen.to_string();
    assert!(
        text.contains(&format!("{a}shout")) && !text.contains(&theirs),
        "sluice status with alpha's JWT shows bravo's: {text}"
    );
    assert_eq!(
        seen["workers"][0]["active"], 1,
        "alpha's JWT counts bravo's task: {text}"
    );
    // A worker that cannot answer (frozen) is shown as of its last join, from the group
    // itself: with no worker to say what alpha's JWT may see, no task is shown to it.
    w.freeze()?;
    let frozen = status_as(&alpha_jwt);
    w.thaw()?;
    let text = frozen?.to_string();
    assert!(
        !text.contains(&theirs) && !text.contains(&format!("{a}shout")),
        "sluice status with alpha's JWT and no worker answering shows tasks: {text}"
    );
    assert!(
        text.contains("not shown"),
        "no reason given for the missing tasks: {text}"
    );

    // The operator sees everything, changes nothing, reads no store; the admin's JWT does all.
    let ops_jwt = ops.token()?;
    assert_eq!(names(&ops_jwt)?.len(), 2);
    let (status, body) = get(&admin, "/status", &ops_jwt).await?;
    assert!(
        status == 200 && body.contains(&theirs) && body.contains(&format!("{a}shout")),
        "{status} {body}"
    );
    let (ok, _, err) = deploy_as(&ops_jwt, &shout(&a, "ops"))?;
    assert!(!ok && err.contains("[operator-read-only]"), "{err}");
    let (ok, _, err) = as_(&ops_jwt, &["topologies", "delete", &theirs])?;
    assert!(!ok && err.contains("[operator-read-only]"), "{err}");
    let (status, body) = get(&admin, &format!("/v1/topologies/{theirs}/stores/x"), &ops_jwt).await?;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("operator-no-data"), "{body}");
    let root_jwt = root.token()?;
    // `sluice status` asks each worker for its live status with the admin's JWT: all of it.
    let v = status_as(&root_jwt)?;
    assert_eq!(
        v["workers"][0]["live"], true,
        "the worker did not answer sluice status with the admin's JWT: {v}"
    );
    assert_eq!(v["workers"][0]["active"], 2, "{v}");
    let text = v.to_string();
    assert!(text.contains(&theirs) && text.contains(&format!("{a}shout")), "{text}");
    let (ok, _, err) = as_(
        &root_jwt,
        &["tenants", "create", "charlie", "--namespace", &format!("c-{id}.")],
    )?;
    assert!(ok, "the admin's JWT creates a tenant: {err}");
    let (ok, _, err) = as_(
        &ops_jwt,
        &["tenants", "create", "delta", "--namespace", &format!("d-{id}.")],
    )?;
    assert!(!ok && err.contains("[operator-read-only]"), "{err}");

    // Every token that should not pass, refused by reason; the answer never holds the token.
    let alpha_again = alpha.token()?;
    let (header, claims) = parts(&alpha_again);
    let kid = header["kid"].as_str().unwrap().to_string();
    let signature = alpha_again.rsplit('.').next().unwrap().to_string();
    let forge = |header: &serde_json::Value, claims: &serde_json::Value, sig: &str| {
        format!(
            "{}.{}.{sig}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        )
    };
    // Signed with HMAC, the "secret" being the issuer's public key: algorithm confusion.
    let jwks: serde_json::Value = serde_json::from_str(
        &reqwest::get(format!("{issuer}/protocol/openid-connect/certs"))
            .await?
            .text()
            .await?,
    )?;
    let public = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == kid.as_str())
        .unwrap();
    let confused = jsonwebtoken::encode(
        &jsonwebtoken::Header {
            alg: jsonwebtoken::Algorithm::HS256,
            kid: Some(kid.clone()),
            ..Default::default()
        },
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(public["n"].as_str().unwrap().as_bytes()),
    )?;
    let mut bravo_claims = claims.clone();
    bravo_claims["sluice_tenant"] = "bravo".into();
    let mut deep = String::new();
    for _ in 0..2000 {
        deep.push('[');
    }
    let nested_header = format!("{{\"alg\":\"RS256\",\"kid\":\"{kid}\",\"x\":{deep}}}");
    let expired = short.token()?;
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (
            "no audience of this API",
            elsewhere.token()?,
            401,
            "aud does not hold sluice-admin",
        ),
        ("another issuer's key", other_realm.token()?, 401, "does not publish"),
        (
            "alg none",
            forge(&serde_json::json!({"alg": "none", "typ": "JWT"}), &claims, ""),
            401,
            "not signed (alg none)",
        ),
        ("HMAC with the public key", confused, 401, "shared secret"),
        (
            "claims changed",
            forge(&header, &bravo_claims, &signature),
            401,
            "signature does not check",
        ),
        (
            "a kid made up",
            forge(
                &serde_json::json!({"alg": "RS256", "kid": "made-up"}),
                &claims,
                &signature,
            ),
            401,
            "does not publish",
        ),
        (
            "oversized",
            format!("eyJ{}.{}.x", "A".repeat(9000), "B"),
            401,
            "more than the 8192",
        ),
        (
            "deeply nested header",
            format!(
                "{}.{}.{signature}",
                b64(nested_header.as_bytes()),
                b64(claims.to_string().as_bytes())
            ),
            401,
            "not a JWT header",
        ),
        (
            "junk that looks like one",
            "eyJhbGciOiJSUzI1NiJ9.e30.c2ln".to_string(),
            401,
            "signature does not check",
        ),
        ("a valid token of no one", nobody.token()?, 403, "names no tenant"),
        ("a tenant the cluster lacks", stranger.token()?, 403, "does not have"),
    ];
    // The short-lived token, once its 2 s and the 1 s leeway are over.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut cases = cases;
    cases.push(("expired", expired, 401, "has expired"));
    for (what, token, want, why) in &cases {
        let (status, body) = get(&admin, "/v1/topologies", token).await?;
        assert_eq!(status, *want, "{what}: {body}");
        assert!(body.contains(why), "{what}: the answer {body} does not say {why:?}");
        let tail = &token[token.len().saturating_sub(24)..];
        assert!(
            tail.len() < 8 || !body.contains(tail),
            "{what}: the answer repeats the token: {body}"
        );
    }
    // And the CLI shows the reason as well.
    let (ok, _, err) = as_(&cases.last().unwrap().1, &["topologies", "list"])?;
    assert!(!ok && err.contains("has expired"), "{err}");
    w.terminate(Duration::from_secs(30))?;
    Ok(())
}

/// A key rotated at the provider: a token of the new key is taken (the key set is read
/// again for a key it does not hold), and one of the removed key is refused once the worker
/// has read the set again; a worker whose provider is not there does not start, and says why.
#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_key_is_taken_a_removed_one_refused_and_a_worker_without_its_provider_does_not_start(
) -> anyhow::Result<()> {
    let _kafka = kafka();
    // The second realm: rotating its keys touches no other test's tokens.
    let issuer = oidc::other_issuer();
    let id = unique_name("r");
    let alpha = client(
        &format!("rot-{id}"),
        ClientSpec {
            audiences: &[AUDIENCE],
            claims: &[("sluice_role", "operator")],
            realm: Some("other"),
            ..Default::default()
        },
    )?;
    let dir = TempDir::new("jwt-rotate");
    let port = free_port();
    let jwt_args = |issuer: &str| {
        vec![
            "--registry-secret".to_string(),
            "the rotation test's cluster secret".into(),
            "--admin-jwt-issuer".into(),
            issuer.to_string(),
            "--admin-jwt-audience".into(),
            AUDIENCE.into(),
            "--admin-jwt-jwks-refresh".into(),
            "2s".into(),
            "--admin-jwt-jwks-min-refresh".into(),
            "1s".into(),
        ]
    };
    let args = jwt_args(&issuer);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut w = worker(&dir, &unique_name("c"), 0, port, &args)?;
    w.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let admin = format!("127.0.0.1:{port}");
    let before = alpha.token()?;
    assert_eq!(get(&admin, "/status", &before).await?.0, 200);
    let new_kid = oidc::rotate_keys("other")?;
    let after = alpha.token()?;
    assert_eq!(
        parts(&after).0["kid"],
        new_kid.as_str(),
        "the provider signs with its new key"
    );
    let (status, body) = get(&admin, "/status", &after).await?;
    assert_eq!(status, 200, "a token of the new key: {body}");
    // The old key is gone from the set once it is read again (every 2 s here).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = get(&admin, "/status", &before).await?;
        if status == 401 {
            assert!(body.contains("does not publish"), "{body}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a token of the removed key is still taken: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(get(&admin, "/status", &after).await?.0, 200);
    w.terminate(Duration::from_secs(30))?;

    // No provider at the issuer: the worker stops at start, non-zero, naming it.
    let gone = format!("http://127.0.0.1:{}/realms/none", free_port());
    let args = jwt_args(&gone);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.extend(["--metrics", "127.0.0.1:0", "--cluster", "nowhere", "--state-dir"]);
    let state = dir.path().join("state-gone");
    args.push(state.to_str().unwrap());
    let mut w = WorkerProcess::start(kafka().bootstrap(), dir.path(), &args)?;
    let status = w.wait(Duration::from_secs(60))?;
    assert!(!status.success(), "a worker without its provider started");
    let log = w.log();
    assert!(
        log.contains("admin.jwt") && log.contains(&gone) && log.contains("discovery document"),
        "the worker's error does not name the provider: {log}"
    );
    Ok(())
}

/// A worker on a Kafka that takes the provider's tokens (OAUTHBEARER, 10 s tokens, every
/// connection made to authenticate again within 5 s): it runs uppercase for 40 s, through
/// some four token refreshes and eight re-authentications per connection, with no rebalance
/// and every record through exactly once in order; a client without credentials is refused by
/// the broker, and a worker with a wrong client secret, or whose provider is not there, stops
/// at start naming the token endpoint.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_on_an_oauthbearer_kafka_runs_through_token_refreshes_and_bad_credentials_are_refused(
) -> anyhow::Result<()> {
    let kafka = sluice_tests::oauth_secured();
    let (input, output) = (unique_name("oauth-in"), unique_name("oauth-out"));
    kafka.create_topic(&input, 2).await?;
    kafka.create_topic(&output, 2).await?;
    let dir = TempDir::new("oauth");
    let topology = dir.write(
        "upper.toml",
        &sluice_tests::worker::manifest(
            &unique_name("upper"),
            &guest("uppercase"),
            &[("input", &input)],
            &[("output", &output)],
            "",
        ),
    );
    let cluster = unique_name("c");
    let mut w = sluice_tests::worker::cluster_worker_at(kafka.bootstrap(), &dir, Some(&topology), &cluster, 0, &[])?;
    let env = kafka.env_as("worker");
    assert!(
        env.iter()
            .any(|(k, v)| k == "SLUICE_KAFKA_SASL_MECHANISM" && v == "OAUTHBEARER"),
        "the worker would not use OAUTHBEARER: {env:?}"
    );
    w.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let mut sent = Vec::new();
    let started = std::time::Instant::now();
    let mut round = 0;
    while started.elapsed() < Duration::from_secs(40) {
        let batch: Vec<(Vec<u8>, Vec<u8>)> = (0..10)
            .map(|i| {
                (
                    format!("k{round}-{i}").into_bytes(),
                    format!("value {round}-{i}").into_bytes(),
                )
            })
            .collect();
        kafka.produce(&input, &batch).await?;
        sent.extend(batch);
        round += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let got = kafka.consume(&output, sent.len(), Duration::from_secs(60)).await?;
    let mut want: Vec<(Vec<u8>, Vec<u8>)> = sent.iter().map(|(k, v)| (k.clone(), v.to_ascii_uppercase())).collect();
    let mut seen: Vec<(Vec<u8>, Vec<u8>)> = got
        .iter()
        .map(|r| (r.key.clone().unwrap_or_default(), r.value.clone().unwrap_or_default()))
        .collect();
    want.sort();
    seen.sort();
    assert_eq!(seen.len(), want.len(), "records lost or doubled");
    assert_eq!(seen, want);
    let log = w.log();
    let assignments = log.lines().filter(|l| l.contains(" assignment ")).count();
    assert_eq!(
        assignments, 1,
        "a refresh or re-authentication caused a rebalance:\n{log}"
    );
    for bad in [
        "Authentication failed",
        "SASL authentication error",
        "token has expired",
    ] {
        assert!(!log.contains(bad), "the worker logged {bad:?}:\n{log}");
    }
    w.terminate(Duration::from_secs(30))?;

    // No credentials at all: the broker's SASL_SSL listener refuses a plain TLS client.
    let ca = kafka
        .env_as("worker")
        .into_iter()
        .find(|(k, _)| k == "SLUICE_KAFKA_SSL_CA_LOCATION")
        .unwrap()
        .1;
    let (ok, _, err) = crate::registry::cli(&[
        "topics",
        "create",
        "--bootstrap",
        kafka.bootstrap(),
        "--kafka-security-protocol",
        "SSL",
        "--kafka-ssl-ca-location",
        &ca,
        &unique_name("nobody"),
    ])?;
    assert!(!ok, "a client without credentials created a topic");
    assert!(!err.is_empty(), "no reason given");

    // A wrong client secret, and a provider that is not there: the worker stops at start.
    let wrong = dir.write("wrong.secret", "not-the-secret\n");
    let gone = format!(
        "http://127.0.0.1:{}/realms/none/protocol/openid-connect/token",
        free_port()
    );
    for (what, extra, names) in [
        (
            "a wrong secret",
            vec![(
                "SLUICE_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE".to_string(),
                wrong.display().to_string(),
            )],
            "refused client worker",
        ),
        (
            "no provider",
            vec![(
                "SLUICE_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL".to_string(),
                gone.clone(),
            )],
            gone.as_str(),
        ),
    ] {
        let state = dir.path().join(unique_name("state"));
        let mut w = WorkerProcess::start_with_env(
            kafka.bootstrap(),
            dir.path(),
            &[
                "--topology",
                topology.to_str().unwrap(),
                "--state-dir",
                state.to_str().unwrap(),
            ],
            &extra,
        )?;
        let status = w.wait(Duration::from_secs(90))?;
        assert!(!status.success(), "{what}: the worker started");
        let log = w.log();
        assert!(
            log.contains(names) && log.contains("no OAuth token for Kafka"),
            "{what}: the worker's error:\n{log}"
        );
        assert!(
            !log.contains("not-the-secret"),
            "{what}: the secret is in the log:\n{log}"
        );
    }
    Ok(())
}

/// The provider's clients, made by several tests at once (as the suite does), are all kept:
/// each gets tokens. Two `dev/oidc client` runs at once once lost each other's clients, and
/// the JWT test above failed in CI when another test made one beside it.
#[test]
fn clients_made_at_once_are_all_kept() -> anyhow::Result<()> {
    oidc::oidc();
    let id = unique_name("at-once");
    let made: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let name = format!("{id}-{i}");
                s.spawn(move || client(&name, ClientSpec::default()))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for c in made {
        let c = c?;
        let token = c.token().map_err(|e| anyhow::anyhow!("client {}: {e:#}", c.id))?;
        assert_eq!(token.split('.').count(), 3, "client {} got {token:?}", c.id);
    }
    Ok(())
}
