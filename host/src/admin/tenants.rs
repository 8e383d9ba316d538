//! `/v1/tenants`: the admin creates, changes and deletes tenants (stored in the registry,
//! so every worker knows them); each caller lists the tenants it may see.

use std::sync::Arc;

use axum::extract::{Extension, Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;

use super::auth::admin_only;
use super::{store, AdminState, ApiError};
use crate::registry::tenants::Caller;
use crate::registry::Entry;

/// A tenant as `GET /v1/tenants` shows it.
#[derive(Debug, Serialize)]
pub(super) struct TenantView {
    name: String,
    namespace: String,
    topologies: usize,
    tasks: u32,
    max_topologies: Option<u32>,
    max_tasks: Option<u32>,
    max_deploys_per_minute: Option<u32>,
    #[serde(flatten)]
    caps: crate::registry::tenants::Caps,
    /// `file` (the configuration file) or `api` (created by an admin through the API).
    defined_in: &'static str,
}

/// `POST /v1/tenants`: a tenant as the configuration file writes one, with its name.
#[derive(Debug, serde::Deserialize)]
pub struct NewTenant {
    name: String,
    #[serde(flatten)]
    tenant: crate::registry::tenants::RawTenant,
}

/// Creates a tenant, or changes one created through the API; every worker learns of it
/// from the registry.
pub(super) async fn create(
    State(state): State<Arc<AdminState>>,
    Extension(who): Extension<Caller>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    admin_only(&who)?;
    let new: NewTenant = serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad-tenant",
            format!("the tenant is not valid: {e}"),
        )
    })?;
    let name = new.name.clone();
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "bad-tenant",
            format!("tenant name {name:?}: letters, digits, '.', '_' and '-'"),
        ));
    }
    if state.tenancy.in_file(&name) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "name-taken",
            format!("tenant {name:?} is defined in the workers' configuration file; change it there"),
        ));
    }
    if !state.tenancy.has_admin_tokens() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "no-admin-token",
            "this cluster has no admin token ([admin] tokens in the configuration file): a tenant with a token would \
             close the open API to its admin too",
        ));
    }
    let snapshot = state.registry.snapshot();
    let mut extra = snapshot.tenants.clone();
    let existed = extra.insert(name.clone(), new.tenant.clone()).is_some();
    state
        .tenancy
        .with(&extra)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "bad-tenant", e))?;
    let tenant = new.tenant.clone();
    let n = name.clone();
    store(&state, move |w| w.put_tenant(&n, &tenant)).await?;
    tracing::info!(tenant = %name, "tenant {} through the API", if existed { "changed" } else { "created" });
    let status = if existed { StatusCode::OK } else { StatusCode::CREATED };
    Ok((
        status,
        Json(serde_json::json!({ "tenant": name, "namespace": new.tenant.namespace })),
    )
        .into_response())
}

/// Deletes a tenant created through the API (one without topologies).
pub(super) async fn delete(
    State(state): State<Arc<AdminState>>,
    Extension(who): Extension<Caller>,
    UrlPath(name): UrlPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    admin_only(&who)?;
    if state.tenancy.in_file(&name) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "name-taken",
            format!("tenant {name:?} is defined in the workers' configuration file; remove it there"),
        ));
    }
    let snapshot = state.registry.snapshot();
    if !snapshot.tenants.contains_key(&name) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not-found",
            format!("no tenant {name:?} created through the API"),
        ));
    }
    let owned: Vec<&str> = snapshot
        .entries
        .values()
        .filter(|(e, _)| e.tenant == name)
        .map(|(e, _)| e.name.as_str())
        .collect();
    if !owned.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "has-topologies",
            format!(
                "tenant {name:?} has topologies ({}); delete them first",
                owned.join(", ")
            ),
        ));
    }
    let n = name.clone();
    store(&state, move |w| w.delete_tenant(&n)).await?;
    Ok(Json(serde_json::json!({ "deleted": name })))
}

pub(super) async fn list(
    State(state): State<Arc<AdminState>>,
    Extension(who): Extension<Caller>,
) -> Result<Json<Vec<TenantView>>, ApiError> {
    let snapshot = state.registry.snapshot();
    Ok(Json(
        state
            .gate
            .tenancy()
            .tenants()
            .filter(|t| who.owns(&t.name))
            .map(|t| {
                let mine: Vec<&Entry> = snapshot
                    .entries
                    .values()
                    .map(|(e, _)| e)
                    .filter(|e| e.tenant == t.name)
                    .collect();
                TenantView {
                    name: t.name.clone(),
                    namespace: t.namespace.clone(),
                    topologies: mine.len(),
                    tasks: mine.iter().map(|e| e.partitions).sum(),
                    max_topologies: t.max_topologies,
                    max_tasks: t.max_tasks,
                    max_deploys_per_minute: t.max_deploys_per_minute,
                    caps: t.caps,
                    defined_in: if state.tenancy.in_file(&t.name) { "file" } else { "api" },
                }
            })
            .collect(),
    ))
}
