//! The Schema Registry settings every command that reads or writes records in the Confluent
//! wire format takes (`schema.registry.*` in the configuration file, as Confluent's clients
//! name them; `SLUICE_SCHEMA_REGISTRY_*` in the environment; `--schema-registry-*` flags).
//! Secrets come from a file or the environment, never from a flag's value that `ps` shows.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use sluice::formats::{RegistryAuth, RegistrySettings};

use super::first_line;

#[derive(Debug, Clone, Default, Args)]
pub struct RegistryArgs {
    /// The Schema Registry's URL, as a Confluent client takes it (`schema.registry.url`;
    /// for Apicurio, `http://HOST:PORT/apis/ccompat/v7`).
    #[arg(
        long,
        visible_alias = "registry",
        value_name = "URL",
        env = "SLUICE_SCHEMA_REGISTRY_URL"
    )]
    pub schema_registry_url: Option<String>,
    /// The user of HTTP basic authentication, with its password from
    /// SLUICE_SCHEMA_REGISTRY_PASSWORD or --schema-registry-password-file.
    #[arg(long, value_name = "USER", env = "SLUICE_SCHEMA_REGISTRY_USER")]
    pub schema_registry_user: Option<String>,
    /// The basic authentication password (from the environment only).
    #[arg(long, hide = true, env = "SLUICE_SCHEMA_REGISTRY_PASSWORD", hide_env_values = true)]
    pub schema_registry_password: Option<String>,
    /// A file whose first line is the basic authentication password.
    #[arg(long, value_name = "FILE", env = "SLUICE_SCHEMA_REGISTRY_PASSWORD_FILE")]
    pub schema_registry_password_file: Option<PathBuf>,
    /// A file whose first line is a bearer token for the registry (read again at start).
    #[arg(long, value_name = "FILE", env = "SLUICE_SCHEMA_REGISTRY_BEARER_TOKEN_FILE")]
    pub schema_registry_bearer_token_file: Option<PathBuf>,
    /// A CA (PEM) to trust for an `https://` registry, beside the system's roots.
    #[arg(long, value_name = "FILE.pem", env = "SLUICE_SCHEMA_REGISTRY_SSL_CA_LOCATION")]
    pub schema_registry_ssl_ca_location: Option<PathBuf>,
    /// Longest one request to the registry may take.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    pub schema_registry_request_timeout: Duration,
}

impl RegistryArgs {
    /// The registry's settings (none without a URL); the error names the setting that is
    /// wrong.
    pub fn settings(&self) -> anyhow::Result<Option<RegistrySettings>> {
        let Some(url) = &self.schema_registry_url else {
            if self.schema_registry_user.is_some() || self.schema_registry_bearer_token_file.is_some() {
                anyhow::bail!("schema registry credentials are set, but not schema.registry.url");
            }
            return Ok(None);
        };
        let password = match (&self.schema_registry_password, &self.schema_registry_password_file) {
            (Some(_), Some(_)) => anyhow::bail!(
                "give the schema registry's password in SLUICE_SCHEMA_REGISTRY_PASSWORD or \
                 schema.registry.password.file, not both"
            ),
            (Some(p), None) => Some(p.clone()),
            (None, Some(file)) => Some(first_line("schema.registry.password.file", file)?),
            (None, None) => None,
        };
        let auth = match (
            &self.schema_registry_user,
            password,
            &self.schema_registry_bearer_token_file,
        ) {
            (Some(_), _, Some(_)) => {
                anyhow::bail!(
                    "give schema.registry.user (basic authentication) or schema.registry.bearer.token.file, not both"
                )
            }
            (Some(user), Some(password), None) => RegistryAuth::Basic {
                user: user.clone(),
                password,
            },
            (Some(_), None, None) => anyhow::bail!(
                "schema.registry.user is set without a password: put it in SLUICE_SCHEMA_REGISTRY_PASSWORD or \
                 schema.registry.password.file"
            ),
            (None, Some(_), _) => anyhow::bail!("a schema registry password is set without schema.registry.user"),
            (None, None, Some(file)) => RegistryAuth::Bearer(first_line("schema.registry.bearer.token.file", file)?),
            (None, None, None) => RegistryAuth::None,
        };
        if let Some(ca) = &self.schema_registry_ssl_ca_location {
            if !ca.exists() {
                anyhow::bail!("schema.registry.ssl.ca.location {}: no such file", ca.display());
            }
        }
        Ok(Some(RegistrySettings {
            url: url.clone(),
            auth,
            ca: self.schema_registry_ssl_ca_location.clone(),
            timeout: self.schema_registry_request_timeout,
        }))
    }
}
