//! JWTs at the admin API: a bearer token from the company's OpenID Connect provider,
//! verified against its keys ([`crate::oidc::jwt`]), is mapped to a caller by two claims:
//! the role claim (`admin`, `operator` or `tenant`; absent means `tenant`) and, for a
//! tenant, the tenant claim naming a tenant of the cluster (from the configuration file or
//! created through the API). A token that does not verify is a 401 saying why; one that
//! verifies but maps to no caller is a 403 saying why. Neither repeats the token.

use std::sync::Arc;

use axum::http::StatusCode;

use super::ApiError;
use crate::oidc::jwt::{Claims, JwtSettings, Verifier};
use crate::registry::tenants::{Caller, Tenancy};

/// What the admin API takes JWTs with: the verifier's settings and the claims it reads.
#[derive(Debug, Clone)]
pub struct JwtAccess {
    pub settings: JwtSettings,
    /// The claim naming the caller's tenant (`admin.jwt.tenant.claim`, default `sluice_tenant`).
    pub tenant_claim: String,
    /// The claim naming its role (`admin.jwt.role.claim`, default `sluice_role`).
    pub role_claim: String,
}

impl JwtAccess {
    pub fn new(settings: JwtSettings) -> JwtAccess {
        JwtAccess {
            settings,
            tenant_claim: "sluice_tenant".into(),
            role_claim: "sluice_role".into(),
        }
    }
}

/// A started verifier and the claims to map.
pub struct Jwt {
    pub(super) verifier: Arc<Verifier>,
    pub(super) access: JwtAccess,
}

impl Jwt {
    /// The caller a JWT speaks for: 401 when it does not verify, 403 when it maps to no one.
    pub async fn caller(&self, token: &str, tenancy: &Tenancy) -> Result<Caller, ApiError> {
        let claims = self.verifier.verify(token).await.map_err(|why| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                format!("the bearer token is refused: {why}"),
            )
        })?;
        caller_of(&claims, &self.access, tenancy)
    }
}

/// The caller of verified `claims`.
pub(super) fn caller_of(claims: &Claims, access: &JwtAccess, tenancy: &Tenancy) -> Result<Caller, ApiError> {
    let forbidden = |why: String| ApiError::new(StatusCode::FORBIDDEN, "no-role", why);
    let text = |name: &str| -> Result<Option<&str>, ApiError> {
        match claims.get(name) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.as_str())),
            Some(_) => Err(forbidden(format!("the token's {name} claim is not a string"))),
        }
    };
    let role = text(&access.role_claim)?;
    match role {
        Some("admin") => return Ok(Caller::Admin),
        Some("operator") => return Ok(Caller::Operator),
        None | Some("tenant") => {}
        Some(_) => {
            return Err(forbidden(format!(
                "the token's {} claim names no role of this API (admin, operator or tenant)",
                access.role_claim
            )))
        }
    }
    let Some(name) = text(&access.tenant_claim)? else {
        return Err(forbidden(format!(
            "the token is valid but names no tenant ({} claim) and no role ({} claim): it may call nothing here",
            access.tenant_claim, access.role_claim
        )));
    };
    match tenancy.tenant(name) {
        Some(t) => Ok(Caller::Tenant(t.clone())),
        None => Err(forbidden(format!(
            "the token's {} claim names a tenant this cluster does not have",
            access.tenant_claim
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::tenants::TenancyConfig;

    fn tenancy() -> Tenancy {
        let config: TenancyConfig = toml::from_str(
            r#"
            [tenants.acme]
            namespace = "acme."
            "#,
        )
        .unwrap();
        Tenancy::from_config(config).unwrap()
    }

    fn claims(json: serde_json::Value) -> Claims {
        json.as_object().unwrap().clone()
    }

    #[test]
    fn claims_map_to_the_admin_an_operator_a_tenant_or_no_one() {
        let access = JwtAccess::new(JwtSettings::new("http://issuer", "sluice"));
        let t = tenancy();
        let of = |j| caller_of(&claims(j), &access, &t);
        assert_eq!(of(serde_json::json!({"sluice_role": "admin"})).unwrap(), Caller::Admin);
        assert_eq!(
            of(serde_json::json!({"sluice_role": "operator", "sluice_tenant": "acme"})).unwrap(),
            Caller::Operator
        );
        assert!(
            matches!(of(serde_json::json!({"sluice_tenant": "acme"})).unwrap(), Caller::Tenant(t) if t.name == "acme")
        );
        assert!(matches!(
            of(serde_json::json!({"sluice_role": "tenant", "sluice_tenant": "acme"})).unwrap(),
            Caller::Tenant(_)
        ));
        for (json, why) in [
            (serde_json::json!({}), "names no tenant"),
            (serde_json::json!({"sluice_tenant": "globex"}), "does not have"),
            (serde_json::json!({"sluice_tenant": ["acme"]}), "not a string"),
            (serde_json::json!({"sluice_role": "root"}), "names no role"),
            (serde_json::json!({"sluice_role": {"admin": true}}), "not a string"),
        ] {
            let e = of(json.clone()).unwrap_err();
            assert_eq!(e.status, StatusCode::FORBIDDEN, "{json}");
            assert!(e.message.contains(why), "{json}: {}", e.message);
        }
    }
}
