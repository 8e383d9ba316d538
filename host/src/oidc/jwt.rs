//! Verifying JWTs (RFC 7519) against an issuer's key set (JWKS, RFC 7517): the admin API's
//! bearer tokens from the company's provider.
//!
//! A [`Verifier`] fetches the key set once (from the issuer's discovery document unless a
//! URL is given), keeps it, refreshes it in the background every `refresh`, and fetches it
//! again when a token names a key it does not hold, at most once every `min_refresh` (so a
//! stream of tokens with made-up key ids costs the provider one request a minute, not one
//! each). A key set that cannot be fetched or read leaves the one held in place.
//!
//! A token is refused, with a reason that repeats nothing of it but a cleaned key id, when:
//! it is longer than [`MAX_TOKEN`] bytes or not three base64url parts; its header is not
//! JSON, names critical extensions, or an algorithm outside the allow list (`none` and the
//! HMAC family never get in: a public key is not a shared secret); it names a key the issuer
//! does not publish, or one published for another algorithm or for encryption; its
//! signature does not check; its `exp` has passed or its `nbf` is to come (give or take the
//! leeway); its `iss` is not the issuer or its `aud` does not hold the audience; or its
//! claims are not a JSON object serde reads (a nesting deeper than 128 is not).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use base64::Engine as _;

/// The longest token read (Keycloak's are 1–2 KiB; a header of 8 KiB is what most proxies
/// take).
pub const MAX_TOKEN: usize = 8 * 1024;

/// The most keys of a key set kept.
const MAX_KEYS: usize = 64;

/// The algorithms allowed unless configured otherwise: every asymmetric one of RFC 7518
/// that ring verifies.
pub const DEFAULT_ALGORITHMS: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// How tokens are verified.
#[derive(Debug, Clone)]
pub struct JwtSettings {
    /// The issuer, exactly as its tokens' `iss` names it.
    pub issuer: String,
    /// What a token's `aud` must hold.
    pub audience: String,
    /// The key set's URL; `None`: the discovery document's `jwks_uri`.
    pub jwks_url: Option<String>,
    /// The algorithms a token may be signed with (asymmetric ones only).
    pub algorithms: Vec<Algorithm>,
    /// How far `exp` and `nbf` may be off (clocks differ).
    pub leeway: Duration,
    /// A CA (PEM) for the provider's HTTPS beside the system's roots.
    pub ca: Option<PathBuf>,
    /// How often the key set is fetched again in the background.
    pub refresh: Duration,
    /// The least time between two fetches for a key the set does not hold.
    pub min_refresh: Duration,
    /// Each request to the provider.
    pub timeout: Duration,
    /// How long the first fetch (at start) is tried.
    pub startup: Duration,
}

impl JwtSettings {
    /// Settings for `issuer` and `audience`, everything else at its default.
    pub fn new(issuer: impl Into<String>, audience: impl Into<String>) -> JwtSettings {
        JwtSettings {
            issuer: issuer.into(),
            audience: audience.into(),
            jwks_url: None,
            algorithms: DEFAULT_ALGORITHMS.to_vec(),
            leeway: Duration::from_secs(30),
            ca: None,
            refresh: Duration::from_secs(300),
            min_refresh: Duration::from_secs(60),
            timeout: Duration::from_secs(5),
            startup: Duration::from_secs(10),
        }
    }
}

/// An algorithm's name, as a token's header writes it.
pub fn algorithm_name(a: Algorithm) -> &'static str {
    match a {
        Algorithm::HS256 => "HS256",
        Algorithm::HS384 => "HS384",
        Algorithm::HS512 => "HS512",
        Algorithm::ES256 => "ES256",
        Algorithm::ES384 => "ES384",
        Algorithm::RS256 => "RS256",
        Algorithm::RS384 => "RS384",
        Algorithm::RS512 => "RS512",
        Algorithm::PS256 => "PS256",
        Algorithm::PS384 => "PS384",
        Algorithm::PS512 => "PS512",
        Algorithm::EdDSA => "EdDSA",
    }
}

/// Reads a list of algorithm names (`RS256,ES256`): asymmetric ones only.
pub fn parse_algorithms(text: &str) -> Result<Vec<Algorithm>, String> {
    let mut out = Vec::new();
    for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match DEFAULT_ALGORITHMS.iter().find(|a| algorithm_name(**a) == name) {
            Some(a) => out.push(*a),
            None if name.starts_with("HS") || name.eq_ignore_ascii_case("none") => {
                return Err(format!(
                    "{name}: not an asymmetric algorithm (tokens signed with a shared secret, or not at all, are \
                     never taken)"
                ))
            }
            None => {
                return Err(format!(
                    "{name}: not an algorithm Sluice verifies ({})",
                    names(DEFAULT_ALGORITHMS)
                ))
            }
        }
    }
    if out.is_empty() {
        return Err("no algorithm named".into());
    }
    Ok(out)
}

fn names(algorithms: &[Algorithm]) -> String {
    algorithms
        .iter()
        .map(|a| algorithm_name(*a))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A key of the set: what verifies, and the algorithm it was published for, if it says.
struct Key {
    decoding: DecodingKey,
    algorithm: Option<Algorithm>,
    /// What kind of key it is (`RSA`, `EC`, `OKP`), for messages.
    kind: &'static str,
}

struct KeySet {
    keys: HashMap<String, Arc<Key>>,
    fetched: Instant,
}

/// What a token's header says.
#[derive(Deserialize)]
struct RawHeader {
    alg: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    crit: Option<serde_json::Value>,
}

/// The claims of a verified token.
pub type Claims = serde_json::Map<String, serde_json::Value>;

/// Verifies tokens of one issuer.
pub struct Verifier {
    settings: JwtSettings,
    http: reqwest::Client,
    jwks_url: String,
    keys: RwLock<Arc<KeySet>>,
    /// When the key set was last asked for (held while asking: one fetch at a time).
    fetching: Arc<tokio::sync::Mutex<Instant>>,
}

impl Verifier {
    /// A verifier with the issuer's key set fetched (tried for `settings.startup`); the error
    /// says which URL failed and why.
    pub async fn start(settings: JwtSettings) -> Result<Arc<Verifier>, String> {
        if settings.algorithms.iter().any(|a| !DEFAULT_ALGORITHMS.contains(a)) {
            return Err("admin.jwt.algorithms: asymmetric algorithms only".into());
        }
        let issuer = settings.issuer.trim_end_matches('/').to_string();
        if !(issuer.starts_with("https://") || issuer.starts_with("http://")) {
            return Err(format!("admin.jwt.issuer {issuer:?} is not an http:// or https:// URL"));
        }
        let http = crate::web::client(settings.timeout, settings.ca.as_deref(), "admin.jwt.ssl.ca.location")?;
        let jwks_url = match &settings.jwks_url {
            Some(url) => url.clone(),
            None => {
                super::with_retries(settings.startup, || super::discover(&http, &issuer))
                    .await
                    .map_err(|e| format!("the OpenID Connect provider of admin.jwt.issuer: {e}"))?
                    .jwks_uri
            }
        };
        let keys = super::with_retries(settings.startup, || fetch_keys(&http, &jwks_url))
            .await
            .map_err(|e| format!("the key set of admin.jwt.issuer: {e}"))?;
        if keys.is_empty() {
            return Err(format!("the key set at {jwks_url} holds no signing key Sluice can use"));
        }
        let now = Instant::now();
        Ok(Arc::new(Verifier {
            settings,
            http,
            jwks_url,
            keys: RwLock::new(Arc::new(KeySet { keys, fetched: now })),
            fetching: Arc::new(tokio::sync::Mutex::new(now)),
        }))
    }

    pub fn settings(&self) -> &JwtSettings {
        &self.settings
    }

    /// Whether `token` looks like a JWT (three base64url parts, a JSON header) rather than a
    /// static token, before anything is verified.
    pub fn looks_like_jwt(token: &str) -> bool {
        token.starts_with("eyJ") && token.bytes().filter(|b| *b == b'.').count() == 2
    }

    /// The claims of `token` once everything checks, or why it does not (for a 401).
    pub async fn verify(self: &Arc<Self>, token: &str) -> Result<Claims, String> {
        if token.len() > MAX_TOKEN {
            return Err(format!(
                "the token is {} bytes, more than the {MAX_TOKEN} taken",
                token.len()
            ));
        }
        let mut parts = token.split('.');
        let (Some(header), Some(_), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
            return Err("the token is not a JWT (three base64url parts separated by dots)".into());
        };
        let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(header.trim_end_matches('='))
            .map_err(|_| "the token's header is not base64url".to_string())?;
        let header: RawHeader = serde_json::from_slice(&header)
            .map_err(|_| "the token's header is not a JWT header (JSON with alg)".to_string())?;
        if header.crit.is_some() {
            return Err("the token's header names critical extensions (crit), which Sluice does not implement".into());
        }
        let alg = self.algorithm(&header.alg)?;
        let key = self.key_for(header.kid.as_deref(), alg).await?;
        if let Some(published) = key.algorithm {
            if published != alg {
                return Err(format!(
                    "the token is signed with {} but its key ({}) is published for {}",
                    algorithm_name(alg),
                    shown_kid(header.kid.as_deref()),
                    algorithm_name(published)
                ));
            }
        }
        let mut validation = Validation::new(alg);
        validation.algorithms = vec![alg];
        validation.leeway = self.settings.leeway.as_secs();
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.set_issuer(&[self.settings.issuer.trim_end_matches('/')]);
        validation.set_audience(&[&self.settings.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud"]);
        let data = jsonwebtoken::decode::<Claims>(token, &key.decoding, &validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind as K;
            match e.kind() {
                K::ExpiredSignature => "the token has expired".to_string(),
                K::ImmatureSignature => "the token is not valid yet (its nbf is to come)".to_string(),
                K::InvalidIssuer => format!("the token's issuer is not {}", self.settings.issuer),
                K::InvalidAudience => format!(
                    "the token is not for this API (its aud does not hold {})",
                    self.settings.audience
                ),
                K::InvalidSignature => format!(
                    "the token's signature does not check against the issuer's key {}",
                    shown_kid(header.kid.as_deref())
                ),
                K::InvalidAlgorithm => format!(
                    "the token's algorithm {} does not fit its key ({}, a {} key)",
                    algorithm_name(alg),
                    shown_kid(header.kid.as_deref()),
                    key.kind
                ),
                K::MissingRequiredClaim(c) => format!("the token has no {c} claim"),
                K::Json(_) => "the token's claims are not a JSON object Sluice reads".to_string(),
                K::Base64(_) | K::Utf8(_) | K::InvalidToken => "the token is not a JWT".to_string(),
                _ => format!("the token does not check: {e}"),
            }
        })?;
        Ok(data.claims)
    }

    /// The allowed algorithm `name` names, or why it is refused.
    fn algorithm(&self, name: &str) -> Result<Algorithm, String> {
        let allowed = &self.settings.algorithms;
        if let Some(a) = allowed.iter().find(|a| algorithm_name(**a) == name) {
            return Ok(*a);
        }
        let shown: String = name.chars().take(16).filter(|c| c.is_ascii_alphanumeric()).collect();
        Err(if name.eq_ignore_ascii_case("none") {
            "the token is not signed (alg none)".to_string()
        } else if name.starts_with("HS") {
            format!(
                "the token is signed with a shared secret ({shown}); this API takes only the issuer's asymmetric \
                 signatures ({})",
                names(allowed)
            )
        } else {
            format!(
                "the token's algorithm {shown:?} is not one this API allows ({})",
                names(allowed)
            )
        })
    }

    /// The key `kid` names (fetching the set again if it is unknown and the last fetch was
    /// long enough ago); a token without a kid gets the one key of the set for `alg`.
    async fn key_for(self: &Arc<Self>, kid: Option<&str>, alg: Algorithm) -> Result<Arc<Key>, String> {
        self.refresh_in_background();
        if let Some(key) = self.lookup(kid, alg)? {
            return Ok(key);
        }
        // Unknown: once a minute at most, ask the provider again (a key it rotated in).
        let mut last = self.fetching.lock().await;
        if let Some(key) = self.lookup(kid, alg)? {
            return Ok(key); // someone else fetched it meanwhile
        }
        let since = last.elapsed();
        if since < self.settings.min_refresh {
            return Err(format!(
                "the token is signed by a key ({}) the issuer does not publish (its key set was read {}s ago)",
                shown_kid(kid),
                since.as_secs()
            ));
        }
        let fetched = fetch_keys(&self.http, &self.jwks_url).await;
        // From the end of the fetch: requests that waited for it (a slow provider, up to the
        // request timeout) look the key up in what it brought, and do not fetch again.
        *last = Instant::now();
        match fetched {
            Ok(keys) if !keys.is_empty() => {
                *self.keys.write().unwrap() = Arc::new(KeySet {
                    keys,
                    fetched: Instant::now(),
                });
            }
            Ok(_) => tracing::warn!(
                "the key set at {} holds no usable key now; keeping the one held",
                self.jwks_url
            ),
            Err(e) => {
                tracing::warn!("could not read the issuer's key set again: {e}; keeping the one held");
                return Err(format!(
                    "the token is signed by a key ({}) this API does not hold, and the issuer's key set could not be \
                     read again",
                    shown_kid(kid)
                ));
            }
        }
        drop(last);
        self.lookup(kid, alg)?.ok_or_else(|| {
            format!(
                "the token is signed by a key ({}) the issuer does not publish",
                shown_kid(kid)
            )
        })
    }

    fn lookup(&self, kid: Option<&str>, alg: Algorithm) -> Result<Option<Arc<Key>>, String> {
        let set = self.keys.read().unwrap().clone();
        match kid {
            Some(kid) => Ok(set.keys.get(kid).cloned()),
            None => {
                let fits: Vec<_> = set
                    .keys
                    .values()
                    .filter(|k| k.algorithm.is_none_or(|a| a == alg))
                    .collect();
                match fits.as_slice() {
                    [one] => Ok(Some((*one).clone())),
                    [] => Ok(None),
                    _ => Err("the token names no key (kid) and the issuer publishes several".into()),
                }
            }
        }
    }

    /// Starts a fetch of the key set when it is older than `refresh` and none is under way.
    fn refresh_in_background(self: &Arc<Self>) {
        let fetched = self.keys.read().unwrap().fetched;
        if fetched.elapsed() < self.settings.refresh {
            return;
        }
        let Ok(mut last) = self.fetching.clone().try_lock_owned() else {
            return; // one is under way
        };
        if last.elapsed() < self.settings.refresh.min(self.settings.min_refresh) {
            return;
        }
        *last = Instant::now();
        let me = self.clone();
        tokio::spawn(async move {
            let mut last = last;
            let fetched = fetch_keys(&me.http, &me.jwks_url).await;
            // Held until now: a request for an unknown key waits for this fetch, then
            // finds the set just read (see `key_for`).
            *last = Instant::now();
            match fetched {
                Ok(keys) if !keys.is_empty() => {
                    *me.keys.write().unwrap() = Arc::new(KeySet {
                        keys,
                        fetched: Instant::now(),
                    })
                }
                Ok(_) => tracing::warn!(
                    "the key set at {} holds no usable key now; keeping the one held",
                    me.jwks_url
                ),
                Err(e) => tracing::warn!("could not refresh the issuer's key set: {e}; keeping the one held"),
            }
        });
    }
}

/// A key id for a message: what an attacker chose, so cut short and cleaned.
fn shown_kid(kid: Option<&str>) -> String {
    match kid {
        None => "with no kid".into(),
        Some(k) => {
            let clean: String = k
                .chars()
                .take(64)
                .filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
                .collect();
            format!("kid {clean}")
        }
    }
}

/// The signing keys of the set at `url`: those of RSA, EC and OKP type not published for
/// encryption; others (symmetric, unknown, unreadable) are left out.
async fn fetch_keys(http: &reqwest::Client, url: &str) -> Result<HashMap<String, Arc<Key>>, String> {
    #[derive(Deserialize)]
    struct RawSet {
        keys: Vec<serde_json::Value>,
    }
    let set: RawSet = super::get_json(http, url, "the key set").await?;
    let mut keys = HashMap::new();
    for raw in set.keys.into_iter().take(MAX_KEYS * 4) {
        let Ok(jwk) = serde_json::from_value::<Jwk>(raw) else {
            continue;
        };
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let kind = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => "RSA",
            AlgorithmParameters::EllipticCurve(_) => "EC",
            AlgorithmParameters::OctetKeyPair(_) => "OKP",
            AlgorithmParameters::OctetKey(_) => continue, // a shared secret is no public key
        };
        let algorithm = match jwk.common.key_algorithm {
            None => None,
            Some(a) => match DEFAULT_ALGORITHMS
                .iter()
                .find(|x| format!("{a:?}") == algorithm_name(**x))
            {
                Some(x) => Some(*x),
                None => continue, // published for something else (RSA-OAEP, HS256)
            },
        };
        let Ok(decoding) = DecodingKey::from_jwk(&jwk) else {
            continue;
        };
        let kid = jwk.common.key_id.clone().unwrap_or_default();
        keys.insert(
            kid,
            Arc::new(Key {
                decoding,
                algorithm,
                kind,
            }),
        );
        if keys.len() == MAX_KEYS {
            break;
        }
    }
    Ok(keys)
}
