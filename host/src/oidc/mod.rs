//! Identity from an OpenID Connect provider: JWTs verified against the issuer's published
//! keys (the admin API's bearer tokens, [`jwt`]), and access tokens fetched for this
//! process's own connections (OAUTHBEARER to Kafka, [`token`]).
//!
//! The provider is found from its issuer URL (`ISSUER/.well-known/openid-configuration`,
//! whose `issuer` must be that URL and whose `jwks_uri` names the keys). Nothing here trusts
//! what a token says about itself before its signature checks against a key the issuer
//! publishes: the algorithm a token names must be an asymmetric one of an allow list and the
//! key's own, and every refusal says why without repeating the token.

pub mod jwt;
pub mod token;

use std::time::Duration;

use serde::Deserialize;

use crate::web;

/// The most of a discovery document or key set read (a provider's are a few KiB).
const MAX_DOCUMENT: usize = 1 << 20;

/// The part of a provider's discovery document Sluice reads.
#[derive(Debug, Clone, Deserialize)]
pub struct Discovery {
    pub issuer: String,
    pub jwks_uri: String,
    #[serde(default)]
    pub token_endpoint: Option<String>,
}

/// `GET url` as JSON of type `T`, at most [`MAX_DOCUMENT`] bytes; the error says what
/// went wrong (`what` names the document).
pub(crate) async fn get_json<T: for<'de> Deserialize<'de>>(
    http: &reqwest::Client,
    url: &str,
    what: &str,
) -> Result<T, String> {
    let response = http
        .get(url)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| format!("{what} at {url}: {}", web::describe(&e)))?;
    let status = response.status();
    let body = web::body(response, MAX_DOCUMENT).await.map_err(|e| match e {
        web::BodyError::TooLong(d) | web::BodyError::Broken(d) => format!("{what} at {url}: {d}"),
    })?;
    if !status.is_success() {
        return Err(format!("{what} at {url}: it answered {status}: {}", web::shown(&body)));
    }
    serde_json::from_slice(&body)
        .map_err(|e| format!("{what} at {url} is not what it should be ({e}): {}", web::shown(&body)))
}

/// The discovery document of `issuer`, checked: its `issuer` is `issuer` (OpenID Connect
/// Discovery 1.0, section 4.3), its key set an http(s) URL.
pub async fn discover(http: &reqwest::Client, issuer: &str) -> Result<Discovery, String> {
    let issuer = issuer.trim_end_matches('/');
    let url = format!("{issuer}/.well-known/openid-configuration");
    let found: Discovery = get_json(http, &url, "the discovery document").await?;
    if found.issuer.trim_end_matches('/') != issuer {
        return Err(format!(
            "the discovery document at {url} names issuer {:?}, not {issuer:?}: set the issuer exactly as the provider \
             names itself",
            found.issuer
        ));
    }
    if !(found.jwks_uri.starts_with("https://") || found.jwks_uri.starts_with("http://")) {
        return Err(format!(
            "the discovery document at {url} names no http(s) jwks_uri ({:?})",
            found.jwks_uri
        ));
    }
    Ok(found)
}

/// Tries `attempt` until it succeeds or `within` has passed, waiting a little longer each
/// time (a provider that is starting answers within seconds); the last error if it never
/// does.
pub(crate) async fn with_retries<T, F, Fut>(within: Duration, mut attempt: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + within;
    let mut pause = Duration::from_millis(200);
    loop {
        match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) if tokio::time::Instant::now() + pause >= deadline => return Err(e),
            Err(e) => tracing::debug!("{e}; trying again in {pause:?}"),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(5));
    }
}
