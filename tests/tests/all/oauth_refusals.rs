//! Kafka's own refusals of OAUTHBEARER tokens, against the real provider (`dev/oidc`:
//! Keycloak) and brokers (`dev/kafka up --security sasl_oauthbearer`: Kafka 4.4's
//! OAuthBearerValidatorCallbackHandler checking each token's key, `exp`, issuer and audience
//! `kafka`, the principal its `azp`). Each token is presented as a Kafka client presents one
//! (librdkafka over SASL_SSL, the token handed over by the client's own callback), and each
//! answer checked twice: at the client (a SASL authentication failure within a second or so,
//! never a listing) and in the brokers' log (why they refused it). A good token beside them
//! lists topics, so each case can fail. Then the provider's side, on a provider and Kafka of
//! their own ([`oidc::oauth_alone`]): its keys rotated, and the provider down under a
//! running worker (beside two ignored tests of what a worker does not survive yet: its token
//! expiring with the provider down, and its key rotated out under it).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use base64::Engine as _;
use rdkafka::client::{ClientContext, OAuthToken};
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, Producer};
use sluice_tests::oidc::{self, client, ClientSpec};
use sluice_tests::worker::TempDir;
use sluice_tests::{oauth_secured, unique_name, Kafka};

/// The audience the brokers take (`sasl.oauthbearer.expected.audience`).
const KAFKA: &str = "kafka";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The (header, claims) of a token, as JSON.
fn parts(token: &str) -> (serde_json::Value, serde_json::Value) {
    let mut it = token.split('.');
    let mut next = || -> serde_json::Value {
        let part = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(it.next().unwrap())
            .unwrap();
        serde_json::from_slice(&part).unwrap()
    };
    let header = next();
    (header, next())
}

/// A token of `header` and `claims` with `signature` (base64url) as it is.
fn forge(header: &serde_json::Value, claims: &serde_json::Value, signature: &str) -> String {
    format!(
        "{}.{}.{signature}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    )
}

/// A Kafka client's side of OAUTHBEARER with one token, whatever it holds, and the errors
/// librdkafka reported.
struct Presenter {
    token: String,
    errors: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl ClientContext for Presenter {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        // librdkafka takes no token whose lifetime is over: it is told ten minutes, whatever
        // the token's `exp` says (the brokers' check is the one under test).
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH)?.as_millis() as i64;
        Ok(OAuthToken {
            token: self.token.clone(),
            principal_name: "presented".into(),
            lifetime_ms: now + 600_000,
        })
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.errors
            .lock()
            .unwrap()
            .push((Instant::now(), format!("{error}: {reason}")));
    }
}

/// How the brokers answered a client presenting a token.
#[derive(Debug)]
enum Answer {
    /// It authenticated: the topics the cluster's metadata listed to its principal.
    Listed(Vec<String>),
    /// Refused: librdkafka's error, and how long after the client was made it came.
    Refused(String, Duration),
    /// Neither within five seconds: what librdkafka reported meanwhile.
    Unanswered(Vec<String>),
}

/// Presents `token` to `kafka`'s brokers as a Kafka client would (SASL_SSL, OAUTHBEARER)
/// and asks for the cluster's metadata until it is listed or librdkafka reports a SASL
/// authentication failure (five seconds at most: either comes within a second).
async fn present(kafka: &'static Kafka, token: &str) -> anyhow::Result<Answer> {
    let ca = kafka
        .properties("admin")
        .into_iter()
        .find(|(k, _)| *k == "ssl.ca.location")
        .context("the cluster has no CA")?
        .1;
    let token = token.to_string();
    tokio::task::spawn_blocking(move || {
        let errors: Arc<Mutex<Vec<(Instant, String)>>> = Default::default();
        let started = Instant::now();
        let client: FutureProducer<Presenter> = ClientConfig::new()
            .set("bootstrap.servers", kafka.bootstrap())
            .set("security.protocol", "SASL_SSL")
            .set("sasl.mechanism", "OAUTHBEARER")
            .set("ssl.ca.location", &ca)
            .create_with_context(Presenter {
                token,
                errors: errors.clone(),
            })?;
        while started.elapsed() < Duration::from_secs(5) {
            if let Ok(metadata) = client.client().fetch_metadata(None, Duration::from_millis(500)) {
                let topics = metadata.topics().iter().map(|t| t.name().to_string()).collect();
                return Ok(Answer::Listed(topics));
            }
            let errors = errors.lock().unwrap();
            if let Some((at, error)) = errors.iter().find(|(_, e)| e.contains("SASL authentication error")) {
                return Ok(Answer::Refused(error.clone(), at.duration_since(started)));
            }
        }
        let errors = errors.lock().unwrap().iter().map(|(_, e)| e.clone()).collect();
        Ok(Answer::Unanswered(errors))
    })
    .await?
}

/// The refusal `answer` should be, checked: a SASL authentication failure at the broker
/// (`invalid_token`, what Kafka's validator answers every bad token with) within five
/// seconds of connecting.
fn refused(kafka: &Kafka, what: &str, answer: Answer) -> (String, Duration) {
    match answer {
        Answer::Refused(error, after) => {
            assert!(
                error.contains("SASL authentication error")
                    && error.contains("invalid_token")
                    && error.contains(kafka.bootstrap()),
                "{what}: librdkafka's error does not name the broker and the SASL failure: {error}"
            );
            assert!(after < Duration::from_secs(5), "{what}: refused only after {after:?}");
            (error, after)
        }
        answer => panic!("{what}: not refused: {answer:?}"),
    }
}

/// Waits (10 s at most) for the brokers' log, from byte `since` on, to say why they refused a
/// token: a line of Kafka's token validator with `why` in it, and `marker` (something of the
/// token it quotes: its `azp`, `kid`, issuer or payload) where it quotes any. The reason.
async fn broker_says(kafka: &Kafka, since: usize, marker: Option<&str>, why: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = kafka.broker_log()?;
        let new = log.get(since..).unwrap_or_default();
        let validator = || {
            new.lines()
                .filter(|l| l.contains("OAuthBearerValidatorCallbackHandler") || l.contains("JwtValidatorException"))
        };
        if let Some(line) = validator().find(|l| l.contains(why) && marker.is_none_or(|m| l.contains(m))) {
            let reason = line.split_once("Additional details: ").map_or(line, |(_, r)| r);
            let reason = reason.split_once("] WARN ").map_or(reason, |(_, r)| r);
            return Ok(reason.chars().take(240).collect());
        }
        if Instant::now() > deadline {
            let lines: Vec<String> = validator().map(|l| l.chars().take(400).collect()).collect();
            anyhow::bail!(
                "the brokers' log does not say {why:?} of the token ({marker:?}); what their validator said since: \
                 {lines:#?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Lets `principal` describe `topic` (and so see it listed), as the admin.
async fn grant_describe(kafka: &Kafka, principal: &str, topic: &str) -> anyhow::Result<()> {
    let acl = sluice::acls::Acl {
        principal: format!("User:{principal}"),
        resource: sluice::acls::Resource::Topic,
        name: topic.into(),
        prefixed: false,
        operations: vec![sluice::acls::Operation::Describe],
        why: "a good token lists the topic",
    };
    sluice::acls::apply(&kafka.settings("admin")?, &[acl]).await?;
    Ok(())
}

/// Presents `token` until the brokers take it and list `topic` (the principal's ACL may take
/// a moment to reach them; 20 s at most): how long that took.
async fn lists(kafka: &'static Kafka, what: &str, token: &str, topic: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        let answer = present(kafka, token).await?;
        match &answer {
            Answer::Listed(topics) if topics.iter().any(|t| t == topic) => return Ok(started.elapsed()),
            _ if started.elapsed() > Duration::from_secs(20) => {
                anyhow::bail!("{what}: not taken with {topic} listed within 20 s: {answer:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    }
}

/// An RSA key of the test's own (PKCS#1 DER), which no provider publishes.
fn rsa_key(dir: &TempDir) -> anyhow::Result<Vec<u8>> {
    let pem = dir.path().join("stranger.pem");
    let der = dir.path().join("stranger.der");
    for args in [
        vec!["genrsa", "-traditional", "-out", pem.to_str().unwrap(), "2048"],
        vec![
            "rsa",
            "-in",
            pem.to_str().unwrap(),
            "-traditional",
            "-outform",
            "DER",
            "-out",
            der.to_str().unwrap(),
        ],
    ] {
        let out = std::process::Command::new("openssl").args(&args).output()?;
        anyhow::ensure!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(std::fs::read(der)?)
}

/// A token of the provider's client `client` fetched through `base` (the provider's own
/// address under another name: its tokens then say another issuer, signed by the same key).
async fn token_through(base: &str, client: &oidc::Client) -> anyhow::Result<String> {
    let answer = reqwest::Client::new()
        .post(format!("{base}/protocol/openid-connect/token"))
        .form(&[
            ("grant_type", "client_credentials"),
            ("client_id", client.id.as_str()),
            ("client_secret", client.secret.as_str()),
        ])
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let answer: serde_json::Value = serde_json::from_str(&answer)?;
    Ok(answer["access_token"].as_str().context("no access token")?.to_string())
}

/// A token whose `exp` has passed is never taken again: until the brokers' leeway for clocks
/// (`sasl.oauthbearer.clock.skew.seconds`, 30 s) is over their validator passes it, but the
/// session it opens has no life left (KIP-368 re-authentication is on) and the connection
/// ends before anything is answered on it; after the leeway, a SASL authentication failure,
/// the brokers saying it is no longer valid. While it lived it was taken.
#[tokio::test(flavor = "multi_thread")]
async fn an_expired_token_is_never_taken_and_refused_once_the_brokers_leeway_is_over() -> anyhow::Result<()> {
    let kafka = oauth_secured();
    let short = client(
        &unique_name("short"),
        ClientSpec {
            audiences: &[KAFKA],
            lifespan: Some("2s"),
            ..Default::default()
        },
    )?;
    let token = short.token()?;
    let exp = parts(&token).1["exp"].as_u64().context("no exp")?;
    let answer = present(kafka, &token).await?;
    assert!(matches!(answer, Answer::Listed(_)), "the fresh token: {answer:?}");
    let past = || {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            - exp as f64
    };
    // From a second past its expiry (`exp` is in whole seconds), every 2 s until refused.
    while past() < 1.0 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut unanswered = Vec::new();
    let mut said = None;
    let since = kafka.broker_log()?.len();
    let (error, after) = loop {
        let at = past();
        assert!(at < 45.0, "not refused {at:.1} s past its exp");
        match present(kafka, &token).await? {
            Answer::Listed(topics) => panic!("taken {at:.1} s past its exp (listed {} topics)", topics.len()),
            Answer::Unanswered(errors) => {
                unanswered.push(at);
                said = errors.last().cloned();
            }
            answer => break refused(kafka, "expired", answer),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let at = past();
    let why = broker_says(kafka, since, Some(&short.id), "no longer valid").await?;
    eprintln!(
        "expired: unanswered at {unanswered:.1?} s past its exp (librdkafka: {said:?}), refused at {at:.1} s after \
         {after:?}: {error}; the brokers: {why}"
    );
    Ok(())
}

/// Every other token Kafka must not take, each refused at once as a SASL authentication
/// failure and by the brokers for its own reason: another audience; another issuer (the
/// provider's other realm, keys of its own); another issuer signed by the trusted key (the
/// provider reached as `localhost`); the claims of a good token signed by a key of the
/// test's (under the provider's `kid`, and under one made up); `alg: none`; HMAC keyed with
/// the provider's public key; a good token's claims changed after signing (`azp` made
/// `admin`, the super user). The good token they come from is taken before and after,
/// listing the topic its principal may describe.
#[tokio::test(flavor = "multi_thread")]
async fn tokens_kafka_must_not_take_are_refused_each_for_its_reason_and_a_good_one_lists_topics() -> anyhow::Result<()>
{
    let kafka = oauth_secured();
    let issuer = oidc::oidc();
    let id = unique_name("refuse");
    let topic = format!("oauth-{id}");
    kafka.create_topic(&topic, 1).await?;
    let good = client(
        &format!("good-{id}"),
        ClientSpec {
            audiences: &[KAFKA],
            ..Default::default()
        },
    )?;
    grant_describe(kafka, &good.id, &topic).await?;
    let elsewhere = client(
        &format!("aud-{id}"),
        ClientSpec {
            audiences: &["other"],
            ..Default::default()
        },
    )?;
    let other_realm = client(
        &format!("realm-{id}"),
        ClientSpec {
            audiences: &[KAFKA],
            realm: Some("other"),
            ..Default::default()
        },
    )?;

    let token = good.token()?;
    let took = lists(kafka, "the good token", &token, &topic).await?;
    eprintln!("the good token: taken, {topic} listed, after {took:?}");

    let (header, claims) = parts(&token);
    let kid = header["kid"].as_str().context("no kid")?.to_string();
    let signature = token.rsplit('.').next().unwrap().to_string();
    // Claims of the good token with a `jti` of their own, to find them in the brokers' log.
    let marked = |jti: &str| {
        let mut c = claims.clone();
        c["jti"] = jti.into();
        c
    };
    let dir = TempDir::new("oauth-refusals");
    let stranger = jsonwebtoken::EncodingKey::from_rsa_der(&rsa_key(&dir)?);
    let signed = |kid: &str, claims: &serde_json::Value| {
        let mut h = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        h.kid = Some(kid.to_string());
        jsonwebtoken::encode(&h, claims, &stranger)
    };
    let jwks: serde_json::Value = serde_json::from_str(
        &reqwest::get(format!("{issuer}/protocol/openid-connect/certs"))
            .await?
            .text()
            .await?,
    )?;
    let public = jwks["keys"]
        .as_array()
        .context("no keys")?
        .iter()
        .find(|k| k["kid"] == kid.as_str())
        .context("the good token's key is not published")?
        .clone();
    let confused = jsonwebtoken::encode(
        &jsonwebtoken::Header {
            alg: jsonwebtoken::Algorithm::HS256,
            kid: Some(kid.clone()),
            ..Default::default()
        },
        &marked(&format!("hmac-{id}")),
        &jsonwebtoken::EncodingKey::from_secret(public["n"].as_str().unwrap().as_bytes()),
    )?;
    let mut as_admin = marked(&format!("changed-{id}"));
    as_admin["azp"] = "admin".into();
    let other_token = other_realm.token()?;
    let other_kid = parts(&other_token).0["kid"].as_str().context("no kid")?.to_string();
    let localhost = issuer.replace("127.0.0.1", "localhost");
    let renamed = token_through(&localhost, &good).await?;
    assert_eq!(
        parts(&renamed).1["iss"],
        localhost.as_str(),
        "the provider's issuer under its other name"
    );
    assert_eq!(parts(&renamed).0["kid"], kid.as_str(), "signed by the trusted key");

    let made_up = format!("made-up-{id}");
    let stranger_signed = signed(&kid, &marked(&format!("stranger-{id}")))?;
    let changed = forge(&header, &as_admin, &signature);
    // The payload as the brokers' log quotes a token whose signature does not check.
    let payload = |token: &str| token.split('.').nth(1).unwrap().to_string();
    let no_key = "Unable to find a suitable verification key";
    let wrong_issuer = format!("Issuer (iss) claim value ({localhost}) doesn't match expected value of {issuer}");
    // (what, the token, what of it the brokers' log quotes, what the brokers say of it)
    let cases: Vec<(&str, String, Option<String>, &str)> = vec![
        (
            "another audience",
            elsewhere.token()?,
            Some(elsewhere.id.clone()),
            "doesn't contain an acceptable identifier. Expected kafka as an aud value",
        ),
        (
            "another issuer, keys of its own (realm other)",
            other_token,
            Some(format!("\"kid\" : \"{other_kid}\"")),
            no_key,
        ),
        (
            "another issuer, signed by the trusted key",
            renamed,
            Some(good.id.clone()),
            &wrong_issuer,
        ),
        (
            "the provider's kid, another key",
            stranger_signed.clone(),
            Some(payload(&stranger_signed)),
            "Invalid JWS Signature",
        ),
        (
            "a kid made up, another key",
            signed(&made_up, &marked(&made_up))?,
            Some(format!("\"kid\":\"{made_up}\"")),
            no_key,
        ),
        (
            "alg none",
            forge(
                &serde_json::json!({"alg": "none", "typ": "JWT"}),
                &marked(&format!("none-{id}")),
                "",
            ),
            None,
            "Malformed JWT provided",
        ),
        (
            "HMAC with the public key",
            confused,
            Some(format!("\"alg\":\"HS256\",\"kid\":\"{kid}\"")),
            no_key,
        ),
        (
            "claims changed after signing (azp admin)",
            changed.clone(),
            Some(payload(&changed)),
            "Invalid JWS Signature",
        ),
    ];
    let mut slowest = Duration::ZERO;
    for (what, token, marker, why) in &cases {
        let since = kafka.broker_log()?.len();
        let (error, after) = refused(kafka, what, present(kafka, token).await?);
        let said = broker_says(kafka, since, marker.as_deref(), why)
            .await
            .with_context(|| format!("{what}: refused at the client ({error}), but"))?;
        eprintln!("{what}: refused after {after:?}: {error}; the brokers: {said}");
        slowest = slowest.max(after);
    }
    // The good token is still taken.
    lists(kafka, "the good token again", &token, &topic).await?;
    eprintln!("every refusal within {slowest:?}");
    Ok(())
}

/// On a provider and Kafka of their own ([`oidc::oauth_alone`]), one at a time: what they do
/// to the provider (rotate the keys the brokers trust, stop it) would break every other
/// test's tokens on the shared one.
mod alone {
    use std::collections::BTreeSet;
    use std::time::{Duration, Instant};

    use anyhow::Context as _;
    use sluice_tests::oidc::{self, ClientSpec};
    use sluice_tests::worker::{guest, manifest, sluice_binary, TempDir, WorkerProcess};
    use sluice_tests::{unique_name, Kafka};

    use super::{broker_says, grant_describe, lists, parts, present, refused, Answer, KAFKA};

    /// The tests here take turns: they change the one provider they share.
    static TURNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

    /// Starts the provider again if a test ends with it stopped (a failed one, say).
    struct StartAgain(&'static oidc::Provider);

    impl Drop for StartAgain {
        fn drop(&mut self) {
            if !self.0.answers() {
                if let Err(e) = self.0.start() {
                    eprintln!("starting the provider again: {e:#}");
                }
            }
        }
    }

    /// A key rotated at the provider (`dev/oidc rotate-keys`): a token of the new key is
    /// taken within seconds (the brokers read the key set again for a key they do not
    /// hold), and one of the removed key, good a moment before, is refused, the brokers
    /// saying they have no key for it.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_rotated_key_is_taken_and_a_token_of_the_removed_one_refused() -> anyhow::Result<()> {
        let _turn = TURNS.lock().await;
        let (kafka, provider) = oidc::oauth_alone();
        let id = unique_name("rotate");
        let topic = format!("oauth-{id}");
        kafka.create_topic(&topic, 1).await?;
        let client = provider.client(
            &id,
            ClientSpec {
                audiences: &[KAFKA],
                ..Default::default()
            },
        )?;
        grant_describe(kafka, &client.id, &topic).await?;
        let before = client.token()?;
        lists(kafka, "a token of the key before", &before, &topic).await?;
        let old_kid = parts(&before).0["kid"].as_str().context("no kid")?.to_string();

        let new_kid = provider.rotate_keys("sluice")?;
        let rotated = Instant::now();
        let after = client.token()?;
        assert_eq!(
            parts(&after).0["kid"],
            new_kid.as_str(),
            "the provider signs with its new key"
        );
        let took = lists(kafka, "a token of the new key", &after, &topic).await?;
        assert!(took < Duration::from_secs(15), "the new key was taken after {took:?}");
        // The removed key: refused once the brokers have read the set again (every 10 s,
        // and at once for the new key's id).
        let since = kafka.broker_log()?.len();
        let deadline = Instant::now() + Duration::from_secs(20);
        let (error, after_ms) = loop {
            match present(kafka, &before).await? {
                Answer::Listed(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(500)).await,
                answer => break refused(kafka, "a token of the removed key", answer),
            }
        };
        let gone = rotated.elapsed();
        let marker = format!("\"kid\" : \"{old_kid}\"");
        let why = broker_says(
            kafka,
            since,
            Some(&marker),
            "Unable to find a suitable verification key",
        )
        .await?;
        lists(kafka, "a token of the new key again", &after, &topic).await?;
        eprintln!(
            "rotated: the new key taken {took:?} after the rotation; the removed one refused {gone:?} after it \
             ({after_ms:?} after connecting): {error}; the brokers: {why}"
        );
        Ok(())
    }

    /// The time `line` of the worker's log says is left on its token (`(4.2s left on the
    /// one held)`).
    fn left_on_token(line: &str) -> Option<Duration> {
        let text = line.split_once("yet (")?.1.split_once(" left")?.0;
        if let Some(ms) = text.strip_suffix("ms") {
            return ms.parse::<f64>().ok().map(|ms| Duration::from_secs_f64(ms / 1000.0));
        }
        if let Some(s) = text
            .strip_suffix('s')
            .filter(|s| s.ends_with(|c: char| c.is_ascii_digit()))
        {
            return s.parse::<f64>().ok().map(Duration::from_secs_f64);
        }
        Some(Duration::ZERO) // µs, ns
    }

    /// A worker of the alone cluster running uppercase from topics of its own, on exactly the
    /// ACLs `sluice acls --worker` derives for its cluster and namespace, and what was sent to it.
    struct Upper {
        kafka: &'static Kafka,
        input: String,
        output: String,
        w: WorkerProcess,
        sent: Vec<(Vec<u8>, Vec<u8>)>,
        _dir: TempDir,
    }

    impl Upper {
        async fn start(kafka: &'static Kafka) -> anyhow::Result<Upper> {
            let ns = format!("{}.", unique_name("up"));
            let (input, output) = (format!("{ns}in"), format!("{ns}out"));
            kafka.create_topic(&input, 2).await?;
            kafka.create_topic(&output, 2).await?;
            let cluster = unique_name("alone");
            let acls = std::process::Command::new(sluice_binary())
                .args(["acls", "--worker", "--cluster", &cluster, "--namespace", &ns, "--apply"])
                .args(["--bootstrap", kafka.bootstrap()])
                .envs(kafka.env_as("admin"))
                .output()?;
            anyhow::ensure!(
                acls.status.success(),
                "sluice acls --apply as admin: {}",
                String::from_utf8_lossy(&acls.stderr)
            );
            let dir = TempDir::new("oauth-alone");
            let topology = dir.write(
                "upper.toml",
                &manifest(
                    &format!("{ns}upper"),
                    &guest("uppercase"),
                    &[("input", &input)],
                    &[("output", &output)],
                    "",
                ),
            );
            let state = dir.path().join("state");
            let args = [
                "--topology",
                topology.to_str().unwrap(),
                "--cluster",
                &cluster,
                "--state-dir",
                state.to_str().unwrap(),
                "--heartbeat-interval",
                "200ms",
                "--session-timeout",
                "6s",
                "--commit-interval",
                "200ms",
                "--no-drain-on-stop",
            ];
            let mut w =
                WorkerProcess::start_with_only_env(kafka.bootstrap(), dir.path(), &args, &kafka.env_as("worker"))?;
            w.wait_for_line(&[" assignment "], Duration::from_secs(60))?;
            let mut upper = Upper {
                kafka,
                input,
                output,
                w,
                sent: Vec::new(),
                _dir: dir,
            };
            upper.send("first").await?;
            upper.all_out(Duration::from_secs(60)).await?;
            Ok(upper)
        }

        /// Produces 20 records tagged `tag`.
        async fn send(&mut self, tag: &str) -> anyhow::Result<()> {
            let batch: Vec<(Vec<u8>, Vec<u8>)> = (0..20)
                .map(|i| {
                    (
                        format!("{tag}-{i}").into_bytes(),
                        format!("value {tag} {i}").into_bytes(),
                    )
                })
                .collect();
            self.kafka.produce(&self.input, &batch).await?;
            self.sent.extend(batch);
            Ok(())
        }

        /// Waits until everything sent so far has come out, uppercased; checks that nothing
        /// else did, and that each came out once (`exactly`) or at least once.
        async fn all_out(&self, timeout: Duration) -> anyhow::Result<usize> {
            let want: BTreeSet<(Vec<u8>, Vec<u8>)> = self
                .sent
                .iter()
                .map(|(k, v)| (k.clone(), v.to_ascii_uppercase()))
                .collect();
            let pair =
                |r: &sluice_tests::Received| (r.key.clone().unwrap_or_default(), r.value.clone().unwrap_or_default());
            let got = self
                .kafka
                .consume_until(&self.output, timeout, |got| {
                    want.is_subset(&got.iter().map(pair).collect())
                })
                .await
                .with_context(|| format!("the worker's log:\n{}", self.w.log()))?;
            let seen: BTreeSet<_> = got.iter().map(pair).collect();
            anyhow::ensure!(
                seen == want,
                "records out that were not sent: {:?}",
                seen.difference(&want)
            );
            Ok(got.len())
        }

        /// How many assignments the worker has logged.
        fn assignments(&self) -> usize {
            self.w.log().lines().filter(|l| l.contains(" assignment ")).count()
        }

        /// Stops the worker, which must still be running.
        fn stop(mut self) -> anyhow::Result<()> {
            let log = self.w.log();
            anyhow::ensure!(
                self.w.terminate(Duration::from_secs(30))?.success(),
                "the worker did not stop cleanly:\n{log}"
            );
            Ok(())
        }
    }

    /// The provider down under a running worker (`dev/oidc stop`; 20 s tokens, connections
    /// re-authenticating every 5 s): the worker goes on processing on the token it holds, and
    /// says in its log why it has no new one once a refresh fails, naming the token endpoint.
    /// (What it does once that token has expired is the ignored test below.)
    #[tokio::test(flavor = "multi_thread")]
    async fn a_worker_goes_on_while_its_token_holds_with_the_provider_down_and_says_why() -> anyhow::Result<()> {
        let _turn = TURNS.lock().await;
        let (kafka, provider) = oidc::oauth_alone();
        let mut upper = Upper::start(kafka).await?;
        let endpoint = provider.token_endpoint();
        let _again = StartAgain(provider);
        let stopping = Instant::now();
        provider.stop()?;
        let stop_took = stopping.elapsed();
        // Still processing, on the token it holds (refreshed at 75-85% of its life, it has
        // 3 s left at the least).
        upper.send("held").await?;
        upper.all_out(Duration::from_secs(30)).await?;
        let held_out = stopping.elapsed();
        let warned = upper
            .w
            .wait_for_line(&["no new OAuth token yet", &endpoint], Duration::from_secs(30))?;
        let warned_after = stopping.elapsed();
        let left = left_on_token(&warned).with_context(|| format!("no time left in {warned:?}"))?;
        assert!(
            held_out < warned_after + left,
            "the records produced after the stop came out {held_out:?} after it, past the worker's token's life \
             ({left:?} left {warned_after:?} after the stop)"
        );
        let log = upper.w.log();
        assert!(!log.contains("the worker stops"), "the worker stopped:\n{log}");
        // Stopped before its token expires: what comes after is the test below.
        upper.stop()?;
        eprintln!(
            "provider down (stopped in {stop_took:?}): the records produced then out {held_out:?} after the stop; \
             the worker warned {warned_after:?} after it: {warned}"
        );
        provider.start()?;
        Ok(())
    }

    /// The provider down under a running worker until the worker's token has expired, then
    /// back (`dev/oidc start`, with new signing keys, as after a rotation): the worker fetches
    /// a token again within seconds and every record comes out, those produced while it could
    /// not work included, with nothing else; it asks for a token again when its token
    /// expires and every 2 s from then on (it backed off to 8, 16, then 30 s: up to 30 s more
    /// without Kafka once the provider was back). FAILS, so not run: the brokers refuse the
    /// worker's token with SASL `invalid_token` once `exp` and their 30 s leeway are over, or
    /// once they have read the provider's new key set (within 10 s of its return) if that is
    /// sooner, and the group client takes any SASL refusal for bad credentials: "the worker
    /// stops: broker …: SASL OAUTHBEARER authentication as "worker" failed: the broker refused
    /// the token", exit 1 (seen 32.6 s after `exp` with the provider still starting, and
    /// 22.6 s after it, 0.7 s before the worker had a new token). Once it stopped even before
    /// `exp`: re-authenticating with a second left on its token, the broker answered the
    /// handshake with `IllegalSaslState (34)`, as fatal. That is what it used
    /// to do; now the group connection waits out a token refused after the worker's tokens
    /// were taken before (`group/membership.rs`, `Membership::waits_out`): weather, not a
    /// wrong secret.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_worker_whose_token_expired_with_the_provider_down_recovers_once_it_is_back() -> anyhow::Result<()> {
        let _turn = TURNS.lock().await;
        let (kafka, provider) = oidc::oauth_alone();
        let mut upper = Upper::start(kafka).await?;
        let endpoint = provider.token_endpoint();
        let _again = StartAgain(provider);
        provider.stop()?;
        upper
            .w
            .wait_for_line(&["no new OAuth token yet", &endpoint], Duration::from_secs(30))?;
        upper.send("held").await?;
        // It asks again when its token expires, and every 2 s from then on.
        upper.w.wait_for_line(
            &[
                "no new OAuth token, and the one held has expired",
                &endpoint,
                "trying again every 2s",
            ],
            Duration::from_secs(30),
        )?;
        // Produced while the worker cannot work.
        upper.send("down").await?;
        let starting = Instant::now();
        provider.start()?;
        let start_took = starting.elapsed();
        let back = Instant::now();
        upper.w.wait_for_line(
            &["OAuth tokens are fetched again from", &endpoint],
            Duration::from_secs(60),
        )?;
        let fetched = back.elapsed();
        upper.send("after").await?;
        let out = upper.all_out(Duration::from_secs(60)).await?;
        let recovered = back.elapsed();
        eprintln!(
            "provider back after {start_took:?} starting: a token {fetched:?} later, every record out {recovered:?} \
             later ({out} records out for {} sent, {} assignments)",
            upper.sent.len(),
            upper.assignments()
        );
        assert!(
            fetched < Duration::from_secs(5),
            "a token only {fetched:?} after the provider was back"
        );
        assert!(
            recovered < Duration::from_secs(30),
            "the records came out only {recovered:?} after the provider was back"
        );
        upper.stop()
    }

    /// A key rotated at the provider under a running worker (`dev/oidc rotate-keys`: the new
    /// key signs at once, the old one is removed): records produced all along come out,
    /// through the brokers' reading of the new key set and the worker's next token. FAILS, so
    /// not run: the brokers drop the old key within 10 s, the group connection's next
    /// re-authentication (every 5 s here) presents the token it still holds and is refused,
    /// and the worker used to stop as above (seen 12 s after the rotation, before its next
    /// token was due). Fixed the same way.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_worker_runs_through_a_key_rotation_at_its_provider() -> anyhow::Result<()> {
        let _turn = TURNS.lock().await;
        let (kafka, provider) = oidc::oauth_alone();
        let mut upper = Upper::start(kafka).await?;
        provider.rotate_keys("sluice")?;
        let rotated = Instant::now();
        let mut round = 0;
        // Through more than a token's life (20 s) and two of the brokers' key set reads.
        while rotated.elapsed() < Duration::from_secs(25) {
            upper.send(&format!("r{round}")).await?;
            round += 1;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let out = upper.all_out(Duration::from_secs(60)).await?;
        let log = upper.w.log();
        assert!(!log.contains("the worker stops"), "the worker stopped:\n{log}");
        eprintln!(
            "key rotated under a worker: {out} records out for {} sent, {} assignments",
            upper.sent.len(),
            upper.assignments()
        );
        upper.stop()
    }
}
