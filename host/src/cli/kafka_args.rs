//! The Kafka client properties every command that talks to Kafka takes (`kafka.*` in the
//! configuration file, `SLUICE_KAFKA_*` in the environment, `--kafka-*` flags): TLS and
//! SASL, passed on to every client of the worker, or of the command.

use std::path::PathBuf;

use clap::Args;
use sluice::kafka::KafkaSettings;

#[derive(Debug, Clone, Default, Args)]
pub struct KafkaArgs {
    /// How connections to Kafka are secured: PLAINTEXT (the default), SSL, SASL_PLAINTEXT
    /// or SASL_SSL.
    #[arg(long, value_name = "PROTOCOL", env = "SLUICE_KAFKA_SECURITY_PROTOCOL")]
    pub kafka_security_protocol: Option<String>,
    /// The SASL mechanism: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER (with the
    /// --kafka-sasl-oauthbearer-* settings).
    #[arg(long, value_name = "MECHANISM", env = "SLUICE_KAFKA_SASL_MECHANISM")]
    pub kafka_sasl_mechanism: Option<String>,
    /// The SASL user name.
    #[arg(long, value_name = "USER", env = "SLUICE_KAFKA_SASL_USERNAME")]
    pub kafka_sasl_username: Option<String>,
    /// The SASL password.
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "SLUICE_KAFKA_SASL_PASSWORD",
        hide_env_values = true
    )]
    pub kafka_sasl_password: Option<String>,
    /// A file whose first line is the SASL password, instead of --kafka-sasl-password.
    #[arg(long, value_name = "FILE", env = "SLUICE_KAFKA_SASL_PASSWORD_FILE")]
    pub kafka_sasl_password_file: Option<PathBuf>,
    /// OAUTHBEARER: the OpenID Connect provider's token endpoint, where the process fetches
    /// its access tokens (client credentials).
    #[arg(long, value_name = "URL", env = "SLUICE_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL")]
    pub kafka_sasl_oauthbearer_token_endpoint_url: Option<String>,
    /// OAUTHBEARER: the OAuth client id.
    #[arg(long, value_name = "ID", env = "SLUICE_KAFKA_SASL_OAUTHBEARER_CLIENT_ID")]
    pub kafka_sasl_oauthbearer_client_id: Option<String>,
    /// OAUTHBEARER: the client secret (from the environment only).
    #[arg(
        long,
        hide = true,
        env = "SLUICE_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET",
        hide_env_values = true
    )]
    pub kafka_sasl_oauthbearer_client_secret: Option<String>,
    /// OAUTHBEARER: a file whose first line is the client secret.
    #[arg(long, value_name = "FILE", env = "SLUICE_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET_FILE")]
    pub kafka_sasl_oauthbearer_client_secret_file: Option<PathBuf>,
    /// OAUTHBEARER: the scope to ask tokens for.
    #[arg(long, value_name = "SCOPE", env = "SLUICE_KAFKA_SASL_OAUTHBEARER_SCOPE")]
    pub kafka_sasl_oauthbearer_scope: Option<String>,
    /// OAUTHBEARER: the audience to ask tokens for (providers that take `audience=`).
    #[arg(long, value_name = "AUDIENCE", env = "SLUICE_KAFKA_SASL_OAUTHBEARER_AUDIENCE")]
    pub kafka_sasl_oauthbearer_audience: Option<String>,
    /// OAUTHBEARER: a CA (PEM) for the token endpoint's HTTPS, beside the system's roots.
    #[arg(long, value_name = "FILE.pem", env = "SLUICE_KAFKA_HTTPS_CA_LOCATION")]
    pub kafka_https_ca_location: Option<PathBuf>,
    /// The CA (PEM) the brokers' certificates are checked against.
    #[arg(long, value_name = "FILE.pem", env = "SLUICE_KAFKA_SSL_CA_LOCATION")]
    pub kafka_ssl_ca_location: Option<PathBuf>,
    /// A client certificate chain (PEM), for brokers that ask for one; with --kafka-ssl-key-location.
    #[arg(long, value_name = "FILE.pem", env = "SLUICE_KAFKA_SSL_CERTIFICATE_LOCATION")]
    pub kafka_ssl_certificate_location: Option<PathBuf>,
    /// The private key (PEM) of --kafka-ssl-certificate-location.
    #[arg(long, value_name = "FILE.pem", env = "SLUICE_KAFKA_SSL_KEY_LOCATION")]
    pub kafka_ssl_key_location: Option<PathBuf>,
    /// The password of an encrypted client key (librdkafka's clients only; the group
    /// connections take an unencrypted key).
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "SLUICE_KAFKA_SSL_KEY_PASSWORD",
        hide_env_values = true
    )]
    pub kafka_ssl_key_password: Option<String>,
    /// `https` (the default: a broker's certificate must name its host) or `none`.
    #[arg(
        long,
        value_name = "ALGORITHM",
        env = "SLUICE_KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM"
    )]
    pub kafka_ssl_endpoint_identification_algorithm: Option<String>,
}

impl KafkaArgs {
    /// The settings for the cluster at `bootstrap`, checked (an error names the property).
    pub fn settings(&self, bootstrap: &str) -> anyhow::Result<KafkaSettings> {
        let password = match (&self.kafka_sasl_password, &self.kafka_sasl_password_file) {
            (Some(_), Some(_)) => anyhow::bail!("give kafka.sasl.password or kafka.sasl.password.file, not both"),
            (Some(p), None) => Some(p.clone()),
            (None, Some(file)) => Some(super::first_line("kafka.sasl.password.file", file)?),
            (None, None) => None,
        };
        let secret = match (
            &self.kafka_sasl_oauthbearer_client_secret,
            &self.kafka_sasl_oauthbearer_client_secret_file,
        ) {
            (Some(_), Some(_)) => anyhow::bail!(
                "give SLUICE_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET or kafka.sasl.oauthbearer.client.secret.file, not both"
            ),
            (Some(s), None) => Some(s.clone()),
            (None, Some(file)) => Some(super::first_line("kafka.sasl.oauthbearer.client.secret.file", file)?),
            (None, None) => None,
        };
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        let properties = [
            ("security.protocol", self.kafka_security_protocol.clone()),
            ("sasl.mechanism", self.kafka_sasl_mechanism.clone()),
            ("sasl.username", self.kafka_sasl_username.clone()),
            ("sasl.password", password),
            (
                "sasl.oauthbearer.token.endpoint.url",
                self.kafka_sasl_oauthbearer_token_endpoint_url.clone(),
            ),
            (
                "sasl.oauthbearer.client.id",
                self.kafka_sasl_oauthbearer_client_id.clone(),
            ),
            ("sasl.oauthbearer.client.secret", secret),
            ("sasl.oauthbearer.scope", self.kafka_sasl_oauthbearer_scope.clone()),
            (
                "sasl.oauthbearer.audience",
                self.kafka_sasl_oauthbearer_audience.clone(),
            ),
            ("https.ca.location", path(&self.kafka_https_ca_location)),
            ("ssl.ca.location", path(&self.kafka_ssl_ca_location)),
            ("ssl.certificate.location", path(&self.kafka_ssl_certificate_location)),
            ("ssl.key.location", path(&self.kafka_ssl_key_location)),
            ("ssl.key.password", self.kafka_ssl_key_password.clone()),
            (
                "ssl.endpoint.identification.algorithm",
                self.kafka_ssl_endpoint_identification_algorithm.clone(),
            ),
        ];
        KafkaSettings::new(bootstrap)
            .with(properties.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))))
            .map_err(anyhow::Error::msg)
    }
}
