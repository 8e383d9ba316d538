//! A red-team pass over the admin API's JWT keys: the key set's endpoint turns hostile while
//! the worker runs (it answers slowly, trickles, sends junk, a huge body, no keys, an error,
//! or a shared secret as a "key"). The real provider (`dev/oidc`) issues the tokens; the key
//! set reaches the worker through a proxy the test controls (`admin.jwt.jwks.url`). Tokens
//! of keys the worker holds must keep working at once, a token naming an unknown key must be
//! refused within the request timeout with its reason, other callers must not wait behind
//! it, and nothing the endpoint sends may replace the keys held or become one.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use sluice_tests::oidc::{self, client, ClientSpec};
use sluice_tests::worker::TempDir;
use sluice_tests::{free_port, unique_name};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::registry::worker;

const AUDIENCE: &str = "sluice-admin";

/// What the proxy in front of the provider's key set does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Mode {
    /// Passes the provider's key set on.
    Pass,
    /// Answers after 30 s.
    Slow,
    /// Sends the headers, then a byte a second.
    Trickle,
    /// 200 with bytes that are not JSON.
    Junk,
    /// 200 with 32 MiB of JSON-looking text.
    Huge,
    /// A key set with no keys.
    Empty,
    /// 500.
    Error,
    /// A set whose one "key" is a shared secret (kty oct), with the provider's kid.
    Symmetric,
}

const MODES: [Mode; 8] = [
    Mode::Pass,
    Mode::Slow,
    Mode::Trickle,
    Mode::Junk,
    Mode::Huge,
    Mode::Empty,
    Mode::Error,
    Mode::Symmetric,
];

/// The shared secret the `Symmetric` mode publishes (base64url of it).
const SECRET: &[u8] = b"a shared secret the key set must never make a key of";

/// Serves `/jwks` as `mode` says; `upstream` is the provider's key set. Counts requests.
async fn proxy(upstream: String, mode: Arc<AtomicU8>, asked: Arc<AtomicU8>, kid: String) -> anyhow::Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            let (upstream, mode, asked, kid) = (upstream.clone(), mode.clone(), asked.clone(), kid.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 1024];
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") && seen.len() < 16 << 10 {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                asked.fetch_add(1, Ordering::Relaxed);
                let ok = |body: &[u8]| {
                    let mut out = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    )
                    .into_bytes();
                    out.extend_from_slice(body);
                    out
                };
                let m = MODES[mode.load(Ordering::Relaxed) as usize];
                let answer = match m {
                    Mode::Pass | Mode::Slow => {
                        if m == Mode::Slow {
                            tokio::time::sleep(Duration::from_secs(30)).await;
                        }
                        match reqwest::get(&upstream).await {
                            Ok(r) => ok(&r.bytes().await.unwrap_or_default()),
                            Err(_) => return,
                        }
                    }
                    Mode::Trickle => {
                        let _ = conn
                            .write_all(
                                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n",
                            )
                            .await;
                        for _ in 0..60 {
                            if conn.write_all(b"{").await.is_err() {
                                return;
                            }
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        return;
                    }
                    Mode::Junk => ok(&[0xff, 0xfe, 0x00, 0x13, 0x37, b'{', b'}', 0x80].repeat(100)),
                    Mode::Huge => {
                        let mut body = b"{\"keys\":[\"".to_vec();
                        body.resize(32 << 20, b'x');
                        body.extend_from_slice(b"\"]}");
                        ok(&body)
                    }
                    Mode::Empty => ok(br#"{"keys":[]}"#),
                    Mode::Error => {
                        b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\nconnection: close\r\n\r\nboom"
                            .to_vec()
                    }
                    Mode::Symmetric => ok(serde_json::json!({
                        "keys": [{
                            "kty": "oct",
                            "kid": kid,
                            "alg": "HS256",
                            "k": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(SECRET),
                        }]
                    })
                    .to_string()
                    .as_bytes()),
                };
                let _ = conn.write_all(&answer).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    Ok(port)
}

/// A request to the admin API: (status, body, how long it took).
async fn get(admin: &str, token: &str) -> anyhow::Result<(u16, String, Duration)> {
    let began = Instant::now();
    let answer = reqwest::Client::builder()
        .timeout(Duration::from_secs(40))
        .build()?
        .get(format!("http://{admin}/v1/topologies"))
        .bearer_auth(token)
        .send()
        .await?;
    let status = answer.status().as_u16();
    Ok((status, answer.text().await?, began.elapsed()))
}

/// `token` with its header's `kid` replaced (the signature no longer checks, but first the
/// worker has to look for a key of that id).
fn with_kid(token: &str, kid: &str) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut parts = token.splitn(3, '.');
    let header: serde_json::Value = serde_json::from_slice(&b64.decode(parts.next().unwrap()).unwrap()).unwrap();
    let mut header = header.as_object().unwrap().clone();
    header.insert("kid".into(), kid.into());
    format!(
        "{}.{}.{}",
        b64.encode(serde_json::to_vec(&header).unwrap()),
        parts.next().unwrap(),
        parts.next().unwrap()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_key_set_endpoint_mid_run_neither_stalls_the_admin_api_nor_changes_its_keys() -> anyhow::Result<()> {
    let issuer = oidc::oidc();
    let id = unique_name("jwks");
    let alpha = client(
        &format!("alpha-{id}"),
        ClientSpec {
            audiences: &[AUDIENCE],
            claims: &[("sluice_tenant", "alpha")],
            ..Default::default()
        },
    )?;
    let good = alpha.token()?;
    let kid = {
        let header = good.split('.').next().unwrap();
        let header: serde_json::Value =
            serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header)?)?;
        header["kid"].as_str().unwrap_or_default().to_string()
    };
    let mode = Arc::new(AtomicU8::new(Mode::Pass as u8));
    let asked = Arc::new(AtomicU8::new(0));
    let jwks_port = proxy(
        format!("{issuer}/protocol/openid-connect/certs"),
        mode.clone(),
        asked.clone(),
        kid.clone(),
    )
    .await?;

    let dir = TempDir::new("jwks");
    let hash = |t: &str| sluice::registry::tenants::hash_token(t);
    let config = dir.write(
        "sluice.toml",
        &format!(
            "registry.secret = \"the jwks test's cluster secret\"\n\
             [admin]\ntokens = [\"{}\"]\n\
             jwt.issuer = \"{issuer}\"\njwt.audience = \"{AUDIENCE}\"\n\
             jwt.jwks.url = \"http://127.0.0.1:{jwks_port}/jwks\"\n\
             jwt.jwks.refresh.ms = \"1s\"\njwt.jwks.min.refresh.ms = \"1s\"\n\n\
             [tenants.alpha]\nnamespace = \"alpha-{id}.\"\n",
            hash("static-root"),
        ),
    );
    let port = free_port();
    let mut w = worker(
        &dir,
        &unique_name("c"),
        0,
        port,
        &["--config", config.to_str().unwrap()],
    )?;
    w.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
    let admin = format!("127.0.0.1:{port}");
    let (code, body, _) = get(&admin, &good).await?;
    assert_eq!(code, 200, "the provider's token before anything turned hostile: {body}");

    let hs256 = jsonwebtoken::encode(
        &jsonwebtoken::Header {
            kid: Some(kid.clone()),
            ..jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256)
        },
        &serde_json::json!({
            "iss": issuer, "aud": AUDIENCE, "sluice_tenant": "alpha",
            "exp": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() + 600,
        }),
        &jsonwebtoken::EncodingKey::from_secret(SECRET),
    )?;
    let mut figures = Vec::new();
    for m in &MODES[1..] {
        mode.store(*m as u8, Ordering::Relaxed);
        let before = asked.load(Ordering::Relaxed);
        // Long enough for a background refresh to meet the endpoint as it is now.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // A token of a held key: answered at once, whatever the endpoint does.
        let (code, body, took) = get(&admin, &good).await?;
        assert_eq!(
            code,
            200,
            "{m:?}: the provider's token, of a key the worker holds: {body}\n{}",
            w.log()
        );
        assert!(
            took < Duration::from_secs(2),
            "{m:?}: a token of a held key took {took:?}"
        );
        // A token naming a key the worker does not hold sends it to the endpoint: refused
        // within the request timeout (5 s) with its reason; meanwhile others are answered.
        let unknown = with_kid(&good, &format!("not-a-key-{}", *m as u8));
        let waiting = tokio::spawn({
            let admin = admin.clone();
            async move { get(&admin, &unknown).await }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (code, body, beside) = get(&admin, "static-root").await?;
        assert_eq!(code, 200, "{m:?}: a static token beside it: {body}");
        let (code, body, refused_in) = waiting.await??;
        assert_eq!(code, 401, "{m:?}: a token of an unknown key: {body}");
        assert!(
            body.contains("key") && !body.contains(&good[..40]),
            "{m:?}: the refusal should name the key and not repeat the token: {body}"
        );
        assert!(
            refused_in < Duration::from_secs(8),
            "{m:?}: a token of an unknown key was refused only after {refused_in:?}"
        );
        // The shared secret the endpoint published is no key.
        let (code, body, _) = get(&admin, &hs256).await?;
        assert_eq!(
            code, 401,
            "{m:?}: an HS256 token signed with what the endpoint sent: {body}"
        );
        let (code, body, _) = get(&admin, &good).await?;
        assert_eq!(code, 200, "{m:?}: after it, the provider's token: {body}");
        assert!(
            asked.load(Ordering::Relaxed) > before,
            "{m:?}: the worker never asked the endpoint, so this proved nothing"
        );
        figures.push(format!(
            "{m:?}: held key {took:.1?}, unknown key refused in {refused_in:.1?}, a static token beside it {beside:.1?}"
        ));
    }
    for f in &figures {
        println!("{f}");
    }
    // Back to the provider's set: everything as before, and the worker is still there.
    mode.store(Mode::Pass as u8, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (code, body, _) = get(&admin, &good).await?;
    assert_eq!(code, 200, "after the endpoint healed: {body}");
    assert!(w.pid().is_some(), "the worker exited:\n{}", w.log());
    assert!(w.terminate(Duration::from_secs(60))?.success(), "{}", w.log());
    Ok(())
}
