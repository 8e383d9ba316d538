//! The Schema Registry's REST API (Confluent's, which Apicurio, Karapace and Redpanda serve
//! too): schemas by id, subjects' versions, registering a schema and checking its
//! compatibility. Basic or bearer authentication, TLS with a CA of one's own beside the
//! system's roots, a deadline on every request and a bound on every answer.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use sluice_wire::SchemaKind;

/// Where the registry is and how to talk to it (the worker's `registry.*` settings).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RegistrySettings {
    /// The URL a Confluent client takes as `url` (for Apicurio, `…/apis/ccompat/v7`).
    pub url: String,
    pub auth: RegistryAuth,
    /// A CA (PEM) to trust beside the system's roots, for an `https://` registry.
    pub ca: Option<PathBuf>,
    /// Longest one request may take, connecting included.
    pub timeout: Duration,
}

/// How requests authenticate.
#[derive(Clone, PartialEq, Eq, Default)]
pub enum RegistryAuth {
    #[default]
    None,
    /// HTTP basic authentication (Confluent's `basic.auth.user.info`).
    Basic { user: String, password: String },
    /// A bearer token.
    Bearer(String),
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryAuth::None => f.write_str("None"),
            RegistryAuth::Basic { user, .. } => write!(f, "Basic({user}, <password>)"),
            RegistryAuth::Bearer(_) => f.write_str("Bearer(<token>)"),
        }
    }
}

/// Why a request to the registry failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// No answer (refused, timed out, TLS failed, a server error): worth trying again.
    #[error("the schema registry at {url} cannot be reached: {detail}")]
    Unreachable { url: String, detail: String },
    /// The registry answered no (not found, not allowed, invalid): it will answer the same.
    #[error("the schema registry answered {status}{}: {message}", code.map(|c| format!(" (error {c})")).unwrap_or_default())]
    Refused {
        status: u16,
        code: Option<i64>,
        message: String,
    },
    /// The answer was not what the API promises.
    #[error("the schema registry's answer to {what} is not what its API says: {detail}")]
    Malformed { what: String, detail: String },
}

impl RegistryError {
    /// Whether asking again may help (the registry down, slow, or failing).
    pub fn is_transient(&self) -> bool {
        match self {
            RegistryError::Unreachable { .. } => true,
            // Too many requests, or a proxy in front timing out.
            RegistryError::Refused { status, .. } => *status == 429 || *status == 408,
            RegistryError::Malformed { .. } => false,
        }
    }

    /// Whether the registry said it does not have it (a schema, subject or version).
    pub fn is_not_found(&self) -> bool {
        matches!(self, RegistryError::Refused { status: 404, .. })
    }
}

/// A reference from one schema to another (a Protobuf import), as the registry keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reference {
    /// The import path it is imported by.
    pub name: String,
    pub subject: String,
    pub version: i64,
}

/// A schema as the registry answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    pub kind: SchemaKind,
    pub text: String,
    pub references: Vec<Reference>,
}

/// A subject's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub id: u32,
    pub version: i64,
    pub schema: Fetched,
}

/// Most bytes of one answer: a schema is text, and a registry we do not control may answer
/// anything.
const MAX_ANSWER: usize = 8 << 20;

const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json";

#[derive(Deserialize)]
struct SchemaAnswer {
    schema: String,
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
    #[serde(default)]
    references: Vec<Reference>,
    id: Option<i64>,
    version: Option<i64>,
}

#[derive(Deserialize)]
struct IdAnswer {
    id: i64,
}

#[derive(Deserialize)]
struct ErrorAnswer {
    error_code: Option<i64>,
    message: Option<String>,
}

#[derive(Deserialize)]
struct CompatibilityAnswer {
    is_compatible: bool,
    #[serde(default)]
    messages: Vec<String>,
}

#[derive(Serialize)]
struct Register<'a> {
    schema: &'a str,
    #[serde(rename = "schemaType", skip_serializing_if = "Option::is_none")]
    schema_type: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    references: &'a [Reference],
}

/// A client of one registry.
#[derive(Clone)]
pub struct RegistryClient {
    http: reqwest::Client,
    settings: RegistrySettings,
    base: String,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryClient")
            .field("url", &self.settings.url)
            .finish()
    }
}

fn kind_of(schema_type: Option<&str>) -> Result<SchemaKind, String> {
    match schema_type.unwrap_or("AVRO") {
        "AVRO" => Ok(SchemaKind::Avro),
        "PROTOBUF" => Ok(SchemaKind::Protobuf),
        "JSON" => Ok(SchemaKind::JsonSchema),
        other => Err(format!(
            "schema type {other:?}, which is none of AVRO, PROTOBUF and JSON"
        )),
    }
}

/// Percent-encodes a subject for a URL path (subjects may hold `/`, `:` and more).
fn segment(subject: &str) -> String {
    let mut out = String::with_capacity(subject.len());
    for b in subject.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

impl RegistryClient {
    /// A client for `settings`; the error names a URL or CA file that cannot be used.
    pub fn new(settings: RegistrySettings) -> Result<RegistryClient, String> {
        let url = settings.url.trim_end_matches('/').to_string();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "registry.url {:?} is not an http:// or https:// URL (for Apicurio: http://HOST:PORT/apis/ccompat/v7)",
                settings.url
            ));
        }
        let http = crate::web::client(settings.timeout, settings.ca.as_deref(), "registry.ca")?;
        Ok(RegistryClient {
            http,
            base: url,
            settings,
        })
    }

    pub fn url(&self) -> &str {
        &self.base
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<bytes::Bytes, RegistryError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method.clone(), &url).header("accept", CONTENT_TYPE);
        request = match &self.settings.auth {
            RegistryAuth::None => request,
            RegistryAuth::Basic { user, password } => request.basic_auth(user, Some(password)),
            RegistryAuth::Bearer(token) => request.bearer_auth(token),
        };
        if let Some(body) = body {
            request = request.header("content-type", CONTENT_TYPE).body(body);
        }
        let unreachable = |detail: String| RegistryError::Unreachable {
            url: self.base.clone(),
            detail,
        };
        let response = request.send().await.map_err(|e| unreachable(describe(&e)))?;
        let status = response.status();
        let body = crate::web::body(response, MAX_ANSWER).await.map_err(|e| match e {
            BodyError::TooLong(detail) => RegistryError::Malformed {
                what: format!("{method} {path}"),
                detail,
            },
            BodyError::Broken(detail) => unreachable(detail),
        })?;
        if status.is_success() {
            return Ok(body.into());
        }
        if status.is_server_error() {
            return Err(unreachable(format!(
                "it answered {status} to {method} {path}: {}",
                shown(&body)
            )));
        }
        let (code, message) = match serde_json::from_slice::<ErrorAnswer>(&body) {
            Ok(e) => (e.error_code, e.message.unwrap_or_else(|| shown(&body))),
            Err(_) => (None, shown(&body)),
        };
        Err(RegistryError::Refused {
            status: status.as_u16(),
            code,
            message: if status.as_u16() == 401 || status.as_u16() == 403 {
                format!("{message} (check registry.basic-auth-user / registry.bearer-token-file)")
            } else {
                message
            },
        })
    }

    fn parse<T: for<'de> Deserialize<'de>>(what: &str, body: &[u8]) -> Result<T, RegistryError> {
        serde_json::from_slice(body).map_err(|e| RegistryError::Malformed {
            what: what.to_string(),
            detail: format!("{e}: {}", shown(body)),
        })
    }

    fn fetched(what: &str, answer: SchemaAnswer) -> Result<Fetched, RegistryError> {
        let kind = kind_of(answer.schema_type.as_deref()).map_err(|detail| RegistryError::Malformed {
            what: what.to_string(),
            detail,
        })?;
        Ok(Fetched {
            kind,
            text: answer.schema,
            references: answer.references,
        })
    }

    /// `GET /schemas/ids/{id}`: the schema with id `id`.
    pub async fn schema_by_id(&self, id: u32) -> Result<Fetched, RegistryError> {
        let what = format!("GET /schemas/ids/{id}");
        let body = self
            .send(reqwest::Method::GET, &format!("/schemas/ids/{id}"), None)
            .await?;
        Self::fetched(&what, Self::parse(&what, &body)?)
    }

    /// `GET /subjects/{subject}/versions/{version}` (`version`: a number or `latest`).
    pub async fn subject_version(&self, subject: &str, version: &str) -> Result<Version, RegistryError> {
        let path = format!("/subjects/{}/versions/{version}", segment(subject));
        let what = format!("GET {path}");
        let body = self.send(reqwest::Method::GET, &path, None).await?;
        let answer: SchemaAnswer = Self::parse(&what, &body)?;
        let (id, version) = (answer.id, answer.version);
        let schema = Self::fetched(&what, answer)?;
        let id = id
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| RegistryError::Malformed {
                what: what.clone(),
                detail: "no schema id".into(),
            })?;
        Ok(Version {
            id,
            version: version.unwrap_or(0),
            schema,
        })
    }

    /// `POST /subjects/{subject}/versions`: registers the schema under the subject (or finds
    /// it registered already); its id. A schema the subject's compatibility rule refuses is
    /// `Refused` with status 409 and the registry's reasons.
    pub async fn register(
        &self,
        subject: &str,
        kind: SchemaKind,
        text: &str,
        references: &[Reference],
    ) -> Result<u32, RegistryError> {
        let path = format!("/subjects/{}/versions", segment(subject));
        let body = serde_json::to_vec(&Register {
            schema: text,
            schema_type: (kind != SchemaKind::Avro).then(|| kind.registry_name()),
            references,
        })
        .expect("a schema serialises");
        let answer = self.send(reqwest::Method::POST, &path, Some(body)).await?;
        let id: IdAnswer = Self::parse(&format!("POST {path}"), &answer)?;
        u32::try_from(id.id).map_err(|_| RegistryError::Malformed {
            what: format!("POST {path}"),
            detail: format!("schema id {}", id.id),
        })
    }

    /// `POST /subjects/{subject}`: the id and version of the schema if it is registered under
    /// the subject; not found (`is_not_found`) if it is not.
    pub async fn lookup_version(
        &self,
        subject: &str,
        kind: SchemaKind,
        text: &str,
        references: &[Reference],
    ) -> Result<(u32, i64), RegistryError> {
        let path = format!("/subjects/{}", segment(subject));
        let body = serde_json::to_vec(&Register {
            schema: text,
            schema_type: (kind != SchemaKind::Avro).then(|| kind.registry_name()),
            references,
        })
        .expect("a schema serialises");
        let answer = self.send(reqwest::Method::POST, &path, Some(body)).await?;
        let found: SchemaAnswer = Self::parse(&format!("POST {path}"), &answer)?;
        let id = found
            .id
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(|| RegistryError::Malformed {
                what: format!("POST {path}"),
                detail: "no schema id".into(),
            })?;
        Ok((id, found.version.unwrap_or(1)))
    }

    /// `POST /compatibility/subjects/{subject}/versions/latest?verbose=true`: whether the
    /// schema may be registered under the subject, and if not, the registry's reasons. A
    /// subject with no version yet takes any schema.
    pub async fn compatible(
        &self,
        subject: &str,
        kind: SchemaKind,
        text: &str,
        references: &[Reference],
    ) -> Result<Result<(), Vec<String>>, RegistryError> {
        let path = format!(
            "/compatibility/subjects/{}/versions/latest?verbose=true",
            segment(subject)
        );
        let body = serde_json::to_vec(&Register {
            schema: text,
            schema_type: (kind != SchemaKind::Avro).then(|| kind.registry_name()),
            references,
        })
        .expect("a schema serialises");
        match self.send(reqwest::Method::POST, &path, Some(body)).await {
            Ok(answer) => {
                let c: CompatibilityAnswer = Self::parse(&format!("POST {path}"), &answer)?;
                Ok(if c.is_compatible { Ok(()) } else { Err(c.messages) })
            }
            // No subject or no version yet: anything goes.
            Err(e) if e.is_not_found() => Ok(Ok(())),
            Err(e) => Err(e),
        }
    }
}

use crate::web::{describe, shown, BodyError};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_are_escaped_in_paths() {
        assert_eq!(segment("orders-value"), "orders-value");
        assert_eq!(segment("a/b c:d"), "a%2Fb%20c%3Ad");
        assert_eq!(segment("com.acme.Order"), "com.acme.Order");
    }

    #[test]
    fn a_url_that_is_not_http_is_refused_with_the_setting_named() {
        let e = RegistryClient::new(RegistrySettings {
            url: "localhost:8081".into(),
            timeout: Duration::from_secs(1),
            ..Default::default()
        })
        .unwrap_err();
        assert!(e.contains("registry.url") && e.contains("localhost:8081"), "{e}");
    }

    #[test]
    fn credentials_never_print() {
        let basic = RegistryAuth::Basic {
            user: "ann".into(),
            password: "s3cret".into(),
        };
        assert!(!format!("{basic:?}").contains("s3cret"));
        assert!(!format!("{:?}", RegistryAuth::Bearer("t0ken".into())).contains("t0ken"));
    }

    #[test]
    fn the_kinds_of_the_registry_api() {
        assert_eq!(kind_of(None), Ok(SchemaKind::Avro));
        assert_eq!(kind_of(Some("PROTOBUF")), Ok(SchemaKind::Protobuf));
        assert_eq!(kind_of(Some("JSON")), Ok(SchemaKind::JsonSchema));
        assert!(kind_of(Some("XML")).is_err());
    }

    #[tokio::test]
    async fn a_registry_that_is_not_there_is_unreachable_and_transient() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let client = RegistryClient::new(RegistrySettings {
            url: format!("http://127.0.0.1:{port}"),
            timeout: Duration::from_secs(2),
            ..Default::default()
        })
        .unwrap();
        let e = client.schema_by_id(1).await.unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert!(e.to_string().contains(&format!("127.0.0.1:{port}")), "{e}");
    }
}
