//! Who calls the admin API: the bearer token of a request, checked against the token
//! hashes of the configuration file's tenants and those created through the API.

use axum::http::{HeaderMap, StatusCode};

use super::{AdminState, ApiError};
use crate::registry::tenants::{Caller, Tenancy};

/// The token of `Authorization: Bearer TOKEN`, if any.
pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The tenants now: the configuration file's and those an admin created through the API.
pub(super) fn tenancy(state: &AdminState) -> Tenancy {
    let snapshot = state.registry.snapshot();
    state.tenancy.with(&snapshot.tenants).unwrap_or_else(|e| {
        tracing::warn!(
            "the tenants created through the API do not fit the configuration file's: {e}; using the file's"
        );
        state.tenancy.clone()
    })
}

/// Who calls: `Authorization: Bearer TOKEN`, checked against the token hashes of the
/// file's and the API's tenants.
pub(super) fn caller(state: &AdminState, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let token = bearer(headers);
    tenancy(state).caller(token).ok_or_else(|| {
        let why = if token.is_some() {
            "the token is not one this cluster knows"
        } else {
            "this cluster requires a token: pass --token (or set SLUICE_TOKEN)"
        };
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", why)
    })
}

pub(super) fn admin_only(who: &Caller) -> Result<(), ApiError> {
    match who {
        Caller::Admin => Ok(()),
        Caller::Tenant(t) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "admin-only",
            format!("only the admin manages tenants (the token is tenant {}'s)", t.name),
        )),
    }
}
