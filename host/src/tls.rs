//! TLS material from PEM files (certificates, a private key), read once and checked, for
//! every TLS endpoint of the worker: the admin listener, its clients, and the connections
//! to Kafka that do not go through librdkafka.

use std::path::Path;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Every certificate of a PEM file (a chain, or a bundle of CAs).
pub fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading certificates from {}", path.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("{}: not a PEM file of certificates", path.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "{} holds no certificate (a PEM file with -----BEGIN CERTIFICATE----- blocks)",
        path.display()
    );
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1, unencrypted).
pub fn private_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).with_context(|| {
        format!(
            "reading a private key from {} (a PEM file with an unencrypted PRIVATE KEY block)",
            path.display()
        )
    })
}

/// The crypto provider of every TLS endpoint of the worker.
pub fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}

/// A server configuration from a certificate chain and its key.
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<rustls::ServerConfig> {
    let chain = certificates(cert)?;
    let key = private_key(key)?;
    rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS settings")?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .with_context(|| format!("the certificate {} and its key do not go together", cert.display()))
}

/// A client configuration: servers checked against the certificates of `ca` (PEM; none: the
/// system's usual roots are not used, so a CA is needed), with a client certificate chain and
/// key when given, and the server's host name checked unless `verify_hostname` is false.
pub fn client_config(
    ca: Option<&Path>,
    client: Option<&(std::path::PathBuf, std::path::PathBuf)>,
    verify_hostname: bool,
) -> anyhow::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    let ca = ca.context("TLS to the brokers needs a CA to check their certificates against (kafka.ssl.ca.location)")?;
    for cert in certificates(ca)? {
        roots
            .add(cert)
            .with_context(|| format!("the CA file {}: a certificate rustls refuses", ca.display()))?;
    }
    let roots = std::sync::Arc::new(roots);
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS settings")?;
    let builder = if verify_hostname {
        builder.with_root_certificates(roots)
    } else {
        let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider())
            .build()
            .context("a certificate verifier for the CA")?;
        builder
            .dangerous()
            .with_custom_certificate_verifier(std::sync::Arc::new(AnyName(inner)))
    };
    match client {
        Some((cert, key)) => builder
            .with_client_auth_cert(certificates(cert)?, private_key(key)?)
            .with_context(|| format!("the client certificate {} and its key", cert.display())),
        None => Ok(builder.with_no_client_auth()),
    }
}

/// Checks a server's certificate chain against the CA but not the name it is for
/// (`ssl.endpoint.identification.algorithm = none`).
#[derive(Debug)]
struct AnyName(std::sync::Arc<rustls::client::WebPkiServerVerifier>);

impl rustls::client::danger::ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext { .. })) => {
                Ok(rustls::client::danger::ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
