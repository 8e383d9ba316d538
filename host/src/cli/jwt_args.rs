//! The admin API's JWT settings (`admin.jwt.*` in the configuration file, `--admin-jwt-*`
//! flags): the OpenID Connect provider whose tokens the API takes beside its static tokens,
//! and the claims that map a token to a tenant or a role.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use sluice::admin::jwt::JwtAccess;
use sluice::oidc::jwt::{parse_algorithms, JwtSettings};

#[derive(Debug, Clone, Default, Args)]
pub struct JwtArgs {
    /// Take JWTs from the OpenID Connect provider of this issuer (its tokens' `iss`, e.g.
    /// `https://keycloak.example/realms/acme`); its keys come from its discovery document.
    #[arg(long, value_name = "URL")]
    pub admin_jwt_issuer: Option<String>,
    /// What a token's `aud` must hold (required with --admin-jwt-issuer).
    #[arg(long, value_name = "AUDIENCE")]
    pub admin_jwt_audience: Option<String>,
    /// The key set's URL, if not the discovery document's `jwks_uri`.
    #[arg(long, value_name = "URL")]
    pub admin_jwt_jwks_url: Option<String>,
    /// The algorithms a token may be signed with (asymmetric only; default every one of
    /// RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA).
    #[arg(long, value_name = "LIST")]
    pub admin_jwt_algorithms: Option<String>,
    /// How far a token's `exp` and `nbf` may be off.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    pub admin_jwt_leeway: Duration,
    /// The claim naming a token's tenant.
    #[arg(long, value_name = "CLAIM", default_value = "sluice_tenant")]
    pub admin_jwt_tenant_claim: String,
    /// The claim naming a token's role: admin, operator or tenant (absent: tenant).
    #[arg(long, value_name = "CLAIM", default_value = "sluice_role")]
    pub admin_jwt_role_claim: String,
    /// A CA (PEM) for the provider's HTTPS, beside the system's roots.
    #[arg(long, value_name = "FILE.pem")]
    pub admin_jwt_ssl_ca_location: Option<PathBuf>,
    /// How often the provider's keys are read again (keys it removed stop working then).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration)]
    pub admin_jwt_jwks_refresh: Duration,
    /// The least time between two reads of the keys for a token signed by a key not held.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    pub admin_jwt_jwks_min_refresh: Duration,
}

impl JwtArgs {
    /// The API's JWT access (none without an issuer); the error names the setting.
    pub fn access(&self) -> anyhow::Result<Option<JwtAccess>> {
        let (Some(issuer), Some(audience)) = (&self.admin_jwt_issuer, &self.admin_jwt_audience) else {
            if self.admin_jwt_issuer.is_some() || self.admin_jwt_audience.is_some() {
                anyhow::bail!("admin.jwt.issuer and admin.jwt.audience go together: give both or neither");
            }
            if self.admin_jwt_jwks_url.is_some() || self.admin_jwt_algorithms.is_some() {
                anyhow::bail!("admin.jwt settings are given, but not admin.jwt.issuer and admin.jwt.audience");
            }
            return Ok(None);
        };
        if issuer.trim().is_empty() || audience.trim().is_empty() {
            anyhow::bail!("admin.jwt.issuer and admin.jwt.audience may not be empty");
        }
        let mut settings = JwtSettings::new(issuer.trim(), audience.trim());
        settings.jwks_url = self.admin_jwt_jwks_url.clone();
        if let Some(list) = &self.admin_jwt_algorithms {
            settings.algorithms = parse_algorithms(list).map_err(|e| anyhow::anyhow!("admin.jwt.algorithms: {e}"))?;
        }
        settings.leeway = self.admin_jwt_leeway;
        if settings.leeway > Duration::from_secs(300) {
            anyhow::bail!(
                "admin.jwt.leeway.ms: at most 5 minutes (a leeway is for clocks that differ, not for old tokens)"
            );
        }
        settings.ca = self.admin_jwt_ssl_ca_location.clone();
        settings.refresh = self.admin_jwt_jwks_refresh.max(Duration::from_secs(1));
        settings.min_refresh = self.admin_jwt_jwks_min_refresh;
        Ok(Some(JwtAccess {
            settings,
            tenant_claim: self.admin_jwt_tenant_claim.clone(),
            role_claim: self.admin_jwt_role_claim.clone(),
        }))
    }
}
