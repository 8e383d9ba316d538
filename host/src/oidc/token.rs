//! Access tokens of an OAuth 2.0 client (the client-credentials grant, RFC 6749 4.4) from an
//! OpenID Connect provider's token endpoint: what a worker presents to Kafka with
//! OAUTHBEARER (KIP-768).
//!
//! One [`TokenSource`] per process fetches a token at start (tried for a while: a provider
//! that is not there is an error naming it, not a hang), then again at about 80% of each
//! token's life (with jitter, so a cluster's workers do not ask at the same instant). A
//! refresh that fails is tried again with backoff while the token held is still good, but
//! never later than when it expires; once it has, every [`EXPIRED_RETRY`] (the process can do
//! nothing with Kafka meanwhile, and a provider that is back is found within seconds). The
//! holders of the token (every Kafka client of the process) are told of each new one through
//! [`TokenSource::subscribe`]. The client secret is read from a file or the environment and
//! never printed.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Deserialize;

use crate::web;

/// The longest access token taken (Keycloak's are 1–2 KiB).
const MAX_TOKEN: usize = 16 * 1024;

/// How often a token is asked for once the one held has expired.
pub const EXPIRED_RETRY: Duration = Duration::from_secs(2);

/// How often the failures of a process without a good token are logged (it asks more often).
const EXPIRED_LOG_EVERY: Duration = Duration::from_secs(30);

/// The longest backoff between failed refreshes while the token held is good.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Where and as whom tokens are fetched.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenSettings {
    /// The token endpoint (`https://…/protocol/openid-connect/token`).
    pub endpoint: String,
    pub client_id: String,
    pub client_secret: String,
    /// `scope` of the request, if any.
    pub scope: Option<String>,
    /// `audience` of the request (Keycloak, Auth0, Hydra take it), if any.
    pub audience: Option<String>,
    /// A CA (PEM) for the endpoint's HTTPS beside the system's roots.
    pub ca: Option<PathBuf>,
    /// Each request.
    pub timeout: Duration,
    /// How long the first token is tried for.
    pub startup: Duration,
}

impl std::fmt::Debug for TokenSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSettings")
            .field("endpoint", &self.endpoint)
            .field("client_id", &self.client_id)
            .field("scope", &self.scope)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl TokenSettings {
    pub fn new(endpoint: impl Into<String>, client_id: impl Into<String>, client_secret: impl Into<String>) -> Self {
        TokenSettings {
            endpoint: endpoint.into(),
            client_id: client_id.into(),
            client_secret: client_secret.into(),
            scope: None,
            audience: None,
            ca: None,
            timeout: Duration::from_secs(10),
            startup: Duration::from_secs(30),
        }
    }
}

/// An access token and when it stops being good.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    pub value: String,
    /// When the provider says it expires.
    pub expires: SystemTime,
    /// Its life when it was fetched.
    pub lifetime: Duration,
    /// The client it was fetched for (the principal name Kafka's client libraries want).
    pub principal: String,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("expires", &self.expires)
            .field("lifetime", &self.lifetime)
            .field("principal", &self.principal)
            .finish_non_exhaustive()
    }
}

impl Token {
    /// Milliseconds since the epoch of its expiry (what librdkafka takes).
    pub fn expires_ms(&self) -> i64 {
        self.expires
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis().min(i64::MAX as u128) as i64)
    }

    pub fn expired(&self) -> bool {
        SystemTime::now() >= self.expires
    }
}

/// How the source is doing, for status and metrics.
#[derive(Debug, Clone, Default)]
pub struct TokenState {
    /// Tokens fetched so far.
    pub fetched: u64,
    /// Refreshes that failed so far.
    pub failures: u64,
    /// The last failure, while the source is failing.
    pub failing: Option<String>,
}

/// A process's access tokens, kept fresh.
pub struct TokenSource {
    settings: TokenSettings,
    http: reqwest::Client,
    current: tokio::sync::watch::Sender<Token>,
    state: Mutex<TokenState>,
    /// Wakes the refresh loop before its time (see [`TokenSource::refused`]).
    kick: Arc<tokio::sync::Notify>,
}

impl TokenSource {
    /// Fetches the first token (tried for `settings.startup`) and keeps it fresh from then on
    /// (on the current tokio runtime). The error names the endpoint and why it failed.
    pub async fn start(settings: TokenSettings) -> Result<Arc<TokenSource>, String> {
        if !(settings.endpoint.starts_with("https://") || settings.endpoint.starts_with("http://")) {
            return Err(format!(
                "sasl.oauthbearer.token.endpoint.url {:?} is not an http:// or https:// URL",
                settings.endpoint
            ));
        }
        let http = web::client(
            settings.timeout,
            settings.ca.as_deref(),
            "sasl.oauthbearer.ssl.ca.location",
        )?;
        // A provider that is starting is waited for; one that refuses the client is not.
        let first = super::with_retries(settings.startup, || async {
            match fetch(&http, &settings).await {
                Ok(t) => Ok(Ok(t)),
                Err(Failed { message, refused: true }) => Ok(Err(message)),
                Err(Failed { message, .. }) => Err(message),
            }
        })
        .await
        .and_then(|r| r)
        .map_err(|e| format!("no OAuth token for Kafka: {e}"))?;
        let (current, _) = tokio::sync::watch::channel(first);
        let source = Arc::new(TokenSource {
            settings,
            http,
            current,
            state: Mutex::new(TokenState {
                fetched: 1,
                ..Default::default()
            }),
            kick: Arc::new(tokio::sync::Notify::new()),
        });
        let weak = Arc::downgrade(&source);
        let kick = source.kick.clone();
        tokio::spawn(async move { refresh_loop(weak, kick).await });
        Ok(source)
    }

    /// The token now.
    pub fn token(&self) -> Token {
        self.current.borrow().clone()
    }

    /// Each new token, as it is fetched.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<Token> {
        self.current.subscribe()
    }

    pub fn state(&self) -> TokenState {
        self.state.lock().unwrap().clone()
    }

    pub fn settings(&self) -> &TokenSettings {
        &self.settings
    }

    /// A broker refused the token held (its key rotated out at the provider, say): fetch a
    /// new one now rather than at the usual time. At most one early fetch every
    /// [`EARLY_FETCH_EVERY`], however often this is called.
    pub fn refused(&self) {
        self.kick.notify_one();
    }
}

/// The least time between two fetches a refusal asks for.
pub const EARLY_FETCH_EVERY: Duration = Duration::from_secs(5);

/// When to fetch again: at 75–85% of the token's life (at least a second from now).
fn refresh_after(token: &Token) -> Duration {
    let jitter = 0.75 + 0.10 * random_unit();
    let life = token.expires.duration_since(SystemTime::now()).unwrap_or_default();
    (life.mul_f64(jitter)).max(Duration::from_secs(1))
}

/// A number in [0, 1) good enough for jitter.
fn random_unit() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// When to ask again after a failed refresh: after `backoff`, but not after the token held
/// (with `left` of its life) has expired, and then every [`EXPIRED_RETRY`]. (It backed off to
/// 8, 16, then 30 s past the expiry: up to 30 s more without Kafka once the provider was back,
/// past the brokers' 30 s leeway for an expired token.)
fn retry_in(backoff: Duration, left: Duration) -> Duration {
    backoff.min(left.max(EXPIRED_RETRY))
}

async fn refresh_loop(source: std::sync::Weak<TokenSource>, kick: Arc<tokio::sync::Notify>) {
    let mut wait = match source.upgrade() {
        Some(s) => refresh_after(&s.token()),
        None => return,
    };
    let mut backoff = Duration::from_millis(500);
    // When a failure with the token expired was last logged.
    let mut said_expired: Option<Instant> = None;
    let mut last_fetch = Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = kick.notified() => {
                let early = last_fetch + EARLY_FETCH_EVERY;
                if Instant::now() < early {
                    tokio::time::sleep_until(early.into()).await;
                }
                tracing::info!("a broker refused the OAuth token held: fetching a new one now");
            }
        }
        last_fetch = Instant::now();
        let Some(s) = source.upgrade() else {
            return; // the process let go of its source
        };
        let started = Instant::now();
        match fetch(&s.http, &s.settings).await.map_err(|f| f.message) {
            Ok(token) => {
                wait = refresh_after(&token);
                backoff = Duration::from_millis(500);
                tracing::debug!(lifetime = ?token.lifetime, next_in = ?wait, "fetched a new OAuth token");
                said_expired = None;
                let mut state = s.state.lock().unwrap();
                state.fetched += 1;
                if state.failing.take().is_some() {
                    tracing::info!("OAuth tokens are fetched again from {}", s.settings.endpoint);
                }
                drop(state);
                s.current.send_replace(token);
            }
            Err(e) => {
                let held = s.token();
                let left = held.expires.duration_since(SystemTime::now()).unwrap_or_default();
                let next = retry_in(backoff, left);
                if left.is_zero() {
                    if said_expired.is_none_or(|at| at.elapsed() >= EXPIRED_LOG_EVERY) {
                        said_expired = Some(Instant::now());
                        tracing::error!(
                            "no new OAuth token, and the one held has expired: {e}; trying again every {next:?}"
                        );
                    }
                } else {
                    tracing::warn!(
                        "no new OAuth token yet ({left:?} left on the one held): {e}; trying again in {next:?}"
                    );
                }
                let mut state = s.state.lock().unwrap();
                state.failures += 1;
                state.failing = Some(e);
                drop(state);
                wait = next.saturating_sub(started.elapsed());
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    token_type: Option<String>,
    #[serde(default)]
    expires_in: Option<f64>,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

/// Why no token came: `refused` when the endpoint answered that it will not give one (a
/// wrong secret, an unknown client), which asking again does not change.
struct Failed {
    message: String,
    refused: bool,
}

impl From<String> for Failed {
    fn from(message: String) -> Failed {
        Failed {
            message,
            refused: false,
        }
    }
}

/// One token from the endpoint (client_secret_basic, as RFC 6749 recommends).
async fn fetch(http: &reqwest::Client, settings: &TokenSettings) -> Result<Token, Failed> {
    let mut form: Vec<(&str, &str)> = vec![("grant_type", "client_credentials")];
    if let Some(scope) = &settings.scope {
        form.push(("scope", scope));
    }
    if let Some(audience) = &settings.audience {
        form.push(("audience", audience));
    }
    let at = &settings.endpoint;
    let response = http
        .post(at)
        .basic_auth(&settings.client_id, Some(&settings.client_secret))
        .header("accept", "application/json")
        .form(&form)
        .send()
        .await
        .map_err(|e| format!("the token endpoint {at}: {}", web::describe(&e)))?;
    let status = response.status();
    let body = web::body(response, 64 * 1024).await.map_err(|e| match e {
        web::BodyError::TooLong(d) | web::BodyError::Broken(d) => format!("the token endpoint {at}: {d}"),
    })?;
    if !status.is_success() {
        let why = match serde_json::from_slice::<ErrorAnswer>(&body) {
            Ok(e) => match e.error_description {
                Some(d) => format!("{} ({})", web::shown(e.error.as_bytes()), web::shown(d.as_bytes())),
                None => web::shown(e.error.as_bytes()),
            },
            Err(_) => web::shown(&body),
        };
        return Err(Failed {
            message: format!(
                "the token endpoint {at} refused client {} ({status}): {why}",
                settings.client_id
            ),
            refused: status.is_client_error() && status.as_u16() != 408 && status.as_u16() != 429,
        });
    }
    let answer: TokenAnswer = serde_json::from_slice(&body)
        .map_err(|e| format!("the token endpoint {at} answered something that is not a token ({e})"))?;
    if let Some(t) = &answer.token_type {
        if !t.eq_ignore_ascii_case("bearer") {
            return Err(format!("the token endpoint {at} gave a {t:?} token, not a bearer token").into());
        }
    }
    let value = answer.access_token;
    if value.is_empty() || value.len() > MAX_TOKEN || !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "the token endpoint {at} gave an access token Kafka cannot take (empty, longer than {MAX_TOKEN} bytes, or \
             not printable ASCII)"
        )
        .into());
    }
    let lifetime = match answer.expires_in {
        Some(s) if s.is_finite() && s > 0.0 => Duration::from_secs_f64(s.min(86_400.0)),
        _ => return Err(format!("the token endpoint {at} did not say when its token expires (expires_in)").into()),
    };
    Ok(Token {
        value,
        expires: SystemTime::now() + lifetime,
        lifetime,
        principal: settings.client_id.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refresh_comes_at_three_quarters_to_most_of_a_tokens_life() {
        let token = Token {
            value: "t".into(),
            expires: SystemTime::now() + Duration::from_secs(100),
            lifetime: Duration::from_secs(100),
            principal: "p".into(),
        };
        for _ in 0..200 {
            let after = refresh_after(&token);
            assert!(
                after >= Duration::from_secs(74) && after <= Duration::from_secs(86),
                "{after:?}"
            );
        }
        let spread: std::collections::BTreeSet<u64> = (0..50)
            .map(|_| refresh_after(&token).as_millis() as u64 / 500)
            .collect();
        assert!(spread.len() > 3, "no jitter: {spread:?}");
    }

    #[test]
    fn a_failed_refresh_is_tried_again_no_later_than_the_token_expires_and_then_every_two_seconds() {
        let s = Duration::from_secs;
        // With time left: the backoff, but never past the expiry.
        assert_eq!(retry_in(Duration::from_millis(500), s(10)), Duration::from_millis(500));
        assert_eq!(retry_in(s(16), s(10)), s(10));
        assert_eq!(retry_in(s(30), s(4)), s(4));
        // Expired, or about to: every two seconds, however long the provider has been away.
        assert_eq!(retry_in(s(30), Duration::ZERO), EXPIRED_RETRY);
        assert_eq!(retry_in(s(30), Duration::from_millis(300)), EXPIRED_RETRY);
        assert_eq!(
            retry_in(Duration::from_millis(500), Duration::ZERO),
            Duration::from_millis(500)
        );
    }

    #[test]
    fn secrets_never_print() {
        let s = TokenSettings::new("http://x/token", "client", "hunter2-secret");
        assert!(!format!("{s:?}").contains("hunter2"));
        let t = Token {
            value: "eyJsecret".into(),
            expires: SystemTime::now(),
            lifetime: Duration::ZERO,
            principal: "client".into(),
        };
        assert!(!format!("{t:?}").contains("eyJsecret"));
    }

    #[tokio::test]
    async fn a_client_the_endpoint_refuses_is_not_asked_for_again() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = asked.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = vec![0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let body = r#"{"error":"unauthorized_client","error_description":"Invalid client credentials"}"#;
                let answer = format!(
                    "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            }
        });
        let mut s = TokenSettings::new(format!("http://127.0.0.1:{port}/token"), "worker", "wrong-secret");
        s.startup = Duration::from_secs(20);
        let started = Instant::now();
        let e = TokenSource::start(s).await.err().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "a refusal was retried: {:?}",
            started.elapsed()
        );
        assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(
            e.contains("refused client worker") && e.contains("unauthorized_client"),
            "{e}"
        );
        assert!(!e.contains("wrong-secret"), "{e}");
    }

    #[tokio::test]
    async fn an_endpoint_that_is_not_there_is_named_once_its_time_is_up() {
        let mut s = TokenSettings::new("http://127.0.0.1:1/token", "client", "secret");
        s.startup = Duration::from_millis(300);
        s.timeout = Duration::from_millis(200);
        let e = TokenSource::start(s).await.err().unwrap();
        assert!(e.contains("http://127.0.0.1:1/token") && !e.contains("secret"), "{e}");
    }
}
