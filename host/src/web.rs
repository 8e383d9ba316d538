//! What the host's HTTP clients share (the Schema Registry's, the OpenID Connect
//! provider's): a client with timeouts, no redirects and an optional CA; answers read up to a
//! bound; errors described with their causes.

use std::path::Path;
use std::time::Duration;

/// A client for one kind of server: `timeout` for each request, redirects not followed (a
/// server that redirects is misconfigured, and a redirect could carry credentials
/// elsewhere), the system's roots and the CA (PEM) at `ca` if given. `what` names the
/// setting in errors (`registry.ca`).
pub fn client(timeout: Duration, ca: Option<&Path>, what: &str) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(10)))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(format!("sluice/{}", crate::VERSION))
        .pool_max_idle_per_host(4);
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).map_err(|e| format!("{what} {}: {e}", ca.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("{what} {}: not PEM certificates: {e}", ca.display()))?;
        if certs.is_empty() {
            return Err(format!("{what} {} holds no certificate", ca.display()));
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().map_err(|e| format!("an HTTP client ({what}): {e}"))
}

/// Why an answer's body could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// Longer than the bound: the server's fault, not the network's.
    TooLong(String),
    /// The connection broke or timed out while reading (worth trying again).
    Broken(String),
}

/// The body of `response`, refused once it is longer than `max` bytes (whether it says so
/// up front or not).
pub async fn body(response: reqwest::Response, max: usize) -> Result<Vec<u8>, BodyError> {
    if let Some(len) = response.content_length() {
        if len as usize > max {
            return Err(BodyError::TooLong(format!(
                "an answer of {len} bytes, more than the {max} taken"
            )));
        }
    }
    let mut body = Vec::new();
    let mut response = response;
    while let Some(chunk) = response.chunk().await.map_err(|e| BodyError::Broken(describe(&e)))? {
        if body.len() + chunk.len() > max {
            return Err(BodyError::TooLong(format!(
                "an answer of more than the {max} bytes taken"
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// An error of reqwest, with its causes (which say what went wrong: refused, timed out,
/// the certificate).
pub fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "no answer in time".to_string()
    } else {
        e.to_string()
    };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// The start of an answer's body, for a message (control characters blanked).
pub fn shown(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(300)]);
    let text: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    if text.trim().is_empty() {
        "(an empty answer)".into()
    } else {
        text.trim().to_string()
    }
}
