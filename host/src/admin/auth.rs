//! Who calls the admin API, decided before anything else of a request is read: the bearer
//! token, checked against the token hashes of the configuration file's tenants and those
//! created through the API, or verified as a JWT of the configured OpenID Connect provider
//! (`admin.jwt.*`, [`super::jwt`]); or another worker's request signed with the cluster
//! secret.
//!
//! Every route says who may call it ([`Access`]); [`gate`] answers 401 or 403 before the
//! route's handler (and so before its body is read), and hands the handler the [`Caller`].
//! With no token configured the API is open (every caller is the admin), but it still
//! refuses what a browser could send to it from another site: a request that changes
//! something must carry an `Authorization`, `X-Sluice-Client` or JSON `Content-Type` header,
//! which a cross-site page cannot send without the API's consent (it never gives it).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;
use crate::registry::tenants::{Caller, Tenancy};
use crate::registry::Watcher;
use crate::secret::{ClusterSecret, WORKER_HEADER};

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anybody (`/healthz`, `/readyz`).
    Public,
    /// Anybody when metrics are public (`admin.metrics.public`, the default), else callers;
    /// what each sees is cut to it (`views::metrics_for`).
    Metrics,
    /// Callers and other workers of the cluster (reads that workers ask each other for).
    Read,
    /// The admin and tenants.
    Callers,
    /// The admin only.
    Admin,
}

/// The header the `sluice` command sends with every request (proof that it is not a page in
/// a browser).
pub const CLIENT_HEADER: &str = "x-sluice-client";

/// What the gate checks requests against.
pub struct Gate {
    /// The configuration file's tenancy.
    tenancy: Tenancy,
    /// The cluster's registry, for the tenants created through the API.
    registry: Option<Arc<Watcher>>,
    /// Other workers sign their requests with it.
    secret: Option<ClusterSecret>,
    metrics_public: bool,
    /// JWTs of the configured provider, beside the static tokens.
    jwt: Option<super::jwt::Jwt>,
}

impl Gate {
    pub fn new(
        tenancy: Tenancy,
        registry: Option<Arc<Watcher>>,
        secret: Option<ClusterSecret>,
        metrics_public: bool,
        jwt: Option<super::jwt::Jwt>,
    ) -> Gate {
        Gate {
            tenancy,
            registry,
            secret,
            metrics_public,
            jwt,
        }
    }

    /// Whether callers must prove who they are (static tokens or JWTs are configured).
    pub fn enforced(&self) -> bool {
        self.jwt.is_some() || self.tenancy().enforced()
    }

    /// The tenants now: the configuration file's and those an admin created through the API.
    pub fn tenancy(&self) -> Tenancy {
        let Some(registry) = &self.registry else {
            return self.tenancy.clone();
        };
        let snapshot = registry.snapshot();
        self.tenancy.with(&snapshot.tenants).unwrap_or_else(|e| {
            tracing::warn!(
                "the tenants created through the API do not fit the configuration file's: {e}; using the file's"
            );
            self.tenancy.clone()
        })
    }

    /// Who sends a request (`method` on `path_and_query`, with `headers`).
    async fn identify(&self, method: &Method, path_and_query: &str, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let tenancy = self.tenancy();
        if !tenancy.enforced() && self.jwt.is_none() {
            return Ok(Caller::Admin);
        }
        if let (Some(secret), Some(signed)) = (&self.secret, headers.get(WORKER_HEADER)) {
            let ok = signed
                .to_str()
                .is_ok_and(|t| secret.verify_request(t, method.as_str(), path_and_query));
            return if ok {
                Ok(Caller::Worker)
            } else {
                Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "the worker signature of this request does not check (another cluster's secret, a clock \
                     more than a minute off, or a request it was not made for)",
                ))
            };
        }
        let token = bearer(headers);
        if let Some(caller) = token
            .and_then(|t| tenancy.caller(Some(t)))
            .filter(|_| tenancy.enforced())
        {
            return Ok(caller);
        }
        if let (Some(jwt), Some(token)) = (&self.jwt, token) {
            if crate::oidc::jwt::Verifier::looks_like_jwt(token) {
                return jwt.caller(token, &tenancy).await;
            }
        }
        let why = match (token, &self.jwt) {
            (Some(_), None) => "the token is not one this cluster knows",
            (Some(_), Some(_)) => "the token is not one this cluster knows (neither a static token nor a JWT)",
            (None, _) => "this cluster requires a token: pass --token (or set SLUICE_TOKEN)",
        };
        Err(ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", why))
    }
}

/// The middleware in front of every route: decides who calls (or refuses) before the
/// route reads anything of the request, and hands the [`Caller`] to the handler.
pub async fn gate(State((gate, access)): State<(Arc<Gate>, Access)>, mut request: Request, next: Next) -> Response {
    if access == Access::Public {
        return next.run(request).await;
    }
    let path = request
        .uri()
        .path_and_query()
        .map_or_else(|| request.uri().path().to_string(), |p| p.as_str().to_string());
    if access == Access::Metrics && gate.metrics_public {
        // Public metrics: anyone gets an answer (a scraper with a stale token too), and a
        // caller who proves who it is gets its own topologies' series; the handler shows
        // a request with no caller the worker-level series only.
        if let Ok(who) = gate.identify(request.method(), &path, request.headers()).await {
            request.extensions_mut().insert(who);
        }
        return next.run(request).await;
    }
    let who = match gate.identify(request.method(), &path, request.headers()).await {
        Ok(who) => who,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = allowed(access, &who, request.method(), request.headers(), &gate) {
        return e.into_response();
    }
    request.extensions_mut().insert(who);
    next.run(request).await
}

/// Whether `who` may make a request of `access`.
fn allowed(access: Access, who: &Caller, method: &Method, headers: &HeaderMap, gate: &Gate) -> Result<(), ApiError> {
    let changes = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    match (access, who) {
        (Access::Admin, Caller::Admin) => {}
        // An operator drains workers: the admin-only route that changes no tenant's things.
        (Access::Admin, Caller::Operator) => {}
        (Access::Admin, _) => return Err(admin_only(who).unwrap_err()),
        (Access::Callers, Caller::Operator) if changes => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "operator-read-only",
                "an operator reads the cluster's topologies, tenants and status, and drains workers; it deploys, \
                 deletes and creates nothing",
            ))
        }
        (Access::Callers, Caller::Worker) => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "worker-only-reads",
                "a worker's signed request may only read status and stores",
            ))
        }
        _ => {}
    }
    // An open API: a request that changes something must come from a program, not from a
    // page of another site in a browser.
    let open = !gate.enforced();
    if open && changes {
        let json = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim_start().starts_with("application/json"));
        let from_a_program = json || headers.contains_key("authorization") || headers.contains_key(CLIENT_HEADER);
        if !from_a_program {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "cross-site",
                format!(
                    "a request that changes something needs an Authorization, {CLIENT_HEADER} or JSON Content-Type \
                     header (a browser's cross-site request has none of them)"
                ),
            ));
        }
    }
    Ok(())
}

/// The token of `Authorization: Bearer TOKEN`, if any.
pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

pub(super) fn admin_only(who: &Caller) -> Result<(), ApiError> {
    match who {
        Caller::Admin => Ok(()),
        Caller::Tenant(t) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "admin-only",
            format!("only the admin may do this (the token is tenant {}'s)", t.name),
        )),
        Caller::Worker => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "admin-only",
            "only the admin may do this (this is another worker's request)",
        )),
        Caller::Operator => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "admin-only",
            "only the admin may do this (the token is an operator's)",
        )),
    }
}
