//! A client certificate renewed on disk, taken by every Kafka client of the process without
//! a restart.
//!
//! librdkafka reads `ssl.certificate.location` and `ssl.key.location` once, when a client is
//! made (2.12; a reload is proposed upstream, librdkafka#5483), and every connection it makes
//! later shows that certificate: a worker whose certificate was renewed (cert-manager,
//! Vault, a cron job writing over the file) keeps the old one until it expires, and then
//! cannot connect again once a broker restarts. So the process watches the two files
//! ([`KafkaSettings::certificate_generation`]): when both changed and load together (a chain
//! and the key that goes with it; a certificate written before its new key is waited out),
//! the generation goes up, and every long-lived client is made again at its next safe point
//! (the stream threads between rounds, a producer once what it holds is delivered, the
//! group connections at their next connect; see [`KafkaSettings::renewed`]). Connections
//! already up stay up: TLS checks a certificate at the handshake only.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{KafkaSettings, Tls};

/// How often the files are read again, at most.
pub const CHECK_EVERY: Duration = Duration::from_secs(5);

/// The client certificate and key files of a process, and how often they changed.
pub(super) struct CertificateWatch {
    tls: Tls,
    generation: AtomicU64,
    /// The files' contents as last looked at.
    seen: Mutex<Vec<u8>>,
}

impl CertificateWatch {
    /// A watch of `tls`'s client certificate, if it has one, looking at its files every
    /// [`CHECK_EVERY`] (on a thread of its own, which ends once the watch is dropped): the
    /// clients read the generation on their hot paths, a load.
    pub(super) fn start(tls: &Tls) -> Option<Arc<CertificateWatch>> {
        let (cert, key) = tls.client.as_ref()?;
        let watch = Arc::new(CertificateWatch {
            tls: tls.clone(),
            generation: AtomicU64::new(0),
            seen: Mutex::new(contents(cert, key).unwrap_or_default()),
        });
        let weak = Arc::downgrade(&watch);
        let spawned = std::thread::Builder::new()
            .name("certificate-watch".into())
            .spawn(move || loop {
                std::thread::sleep(CHECK_EVERY);
                match weak.upgrade() {
                    Some(watch) => watch.check(),
                    None => return,
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("watching the Kafka client certificate for renewals: {e}; a renewal needs a restart");
        }
        Some(watch)
    }

    /// The generation now.
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Reads the files: if they changed and load together, the generation goes up.
    fn check(&self) {
        let mut seen_before = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let (cert, key) = self.tls.client.as_ref().expect("a watch has a certificate");
        let Ok(seen) = contents(cert, key) else {
            // Being written, or gone: the clients keep what they have.
            return;
        };
        if seen == *seen_before {
            return;
        }
        // Looked at again only once it changes again: a pair that does not load is said once.
        *seen_before = seen;
        // Both files must load, and go together, before anything takes them.
        match crate::tls::client_config(
            self.tls.ca.as_deref(),
            self.tls.client.as_ref(),
            self.tls.verify_hostname,
        ) {
            Ok(_) => {
                let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
                tracing::info!(
                    certificate = %cert.display(),
                    generation,
                    "the Kafka client certificate changed on disk: every Kafka client of this process takes it"
                );
            }
            Err(e) => tracing::warn!(
                certificate = %cert.display(),
                "the Kafka client certificate changed on disk but does not load ({e:#}); the clients keep the one \
                 they have"
            ),
        }
    }
}

fn contents(cert: &PathBuf, key: &PathBuf) -> std::io::Result<Vec<u8>> {
    let mut both = std::fs::read(cert)?;
    both.push(0);
    both.extend(std::fs::read(key)?);
    Ok(both)
}

impl KafkaSettings {
    /// How many times the client certificate was renewed on disk since the process started
    /// (its files are looked at every [`CHECK_EVERY`]); always 0 without one. A load: cheap
    /// enough for a hot path.
    pub fn certificate_generation(&self) -> u64 {
        self.certificate.as_ref().map_or(0, |w| w.generation())
    }

    /// Whether `client`, made at certificate generation `made`, should be made again: the
    /// certificate was renewed since.
    pub fn renewed(&self, made: u64) -> bool {
        self.certificate.is_some() && self.certificate_generation() != made
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CA and two client certificates of it (with their keys) in `dir`, made by openssl.
    fn pki(dir: &std::path::Path) -> bool {
        let run = |args: &[&str]| {
            std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        // Extensions make a version 3 certificate, which rustls requires.
        std::fs::write(
            dir.join("ext.cnf"),
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        )
        .unwrap();
        // A new P-256 key in `key` and a request (or, with `-x509`, a certificate) in `out`.
        let key_and = |first: &[&str], key: &str, out: &str, subject: &str, last: &[&str]| {
            let mut args = first.to_vec();
            args.extend(["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]);
            args.extend(["-keyout", key, "-out", out, "-subj", subject]);
            args.extend(last);
            run(&args)
        };
        key_and(&["req", "-x509"], "ca.key", "ca.pem", "/CN=ca", &["-days", "1"])
            && ["a", "b"].iter().all(|n| {
                let (key, csr, pem) = (format!("{n}.key"), format!("{n}.csr"), format!("{n}.pem"));
                key_and(&["req"], &key, &csr, &format!("/CN={n}"), &[])
                    && run(&[
                        "x509",
                        "-req",
                        "-in",
                        &csr,
                        "-CA",
                        "ca.pem",
                        "-CAkey",
                        "ca.key",
                        "-CAcreateserial",
                        "-out",
                        &pem,
                        "-days",
                        "1",
                        "-extfile",
                        "ext.cnf",
                    ])
            })
    }

    #[test]
    fn a_renewed_pair_moves_the_generation_and_a_half_written_one_does_not() {
        let d = std::env::temp_dir().join(format!("sluice-cert-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&d).unwrap();
        assert!(
            pki(&d),
            "openssl (which dev/kafka needs too) made no certificates in {}",
            d.display()
        );
        let d = d.as_path();
        std::fs::copy(d.join("a.pem"), d.join("client.pem")).unwrap();
        std::fs::copy(d.join("a.key"), d.join("client.key")).unwrap();
        let s = KafkaSettings::new("b:9093")
            .with([
                ("security.protocol", "SSL"),
                ("ssl.ca.location", d.join("ca.pem").to_str().unwrap()),
                ("ssl.certificate.location", d.join("client.pem").to_str().unwrap()),
                ("ssl.key.location", d.join("client.key").to_str().unwrap()),
            ])
            .unwrap();
        let watch = s.certificate.as_ref().unwrap();
        let look = || {
            watch.check();
            s.certificate_generation()
        };
        assert_eq!(look(), 0, "nothing changed");
        assert!(!s.renewed(0));
        // The certificate first, its key not yet: a pair that does not load is not taken.
        std::fs::copy(d.join("b.pem"), d.join("client.pem")).unwrap();
        assert_eq!(look(), 0, "a certificate without its key was taken");
        // Then the key: taken.
        std::fs::copy(d.join("b.key"), d.join("client.key")).unwrap();
        assert_eq!(look(), 1);
        assert!(s.renewed(0) && !s.renewed(1));
        // A clone shares the watch.
        std::fs::copy(d.join("a.pem"), d.join("client.pem")).unwrap();
        std::fs::copy(d.join("a.key"), d.join("client.key")).unwrap();
        assert_eq!(look(), 2);
        assert_eq!(s.clone().certificate_generation(), 2);
        // A file gone: kept.
        std::fs::remove_file(d.join("client.key")).unwrap();
        assert_eq!(look(), 2);
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn without_a_client_certificate_nothing_is_watched() {
        let s = KafkaSettings::new("b:9093")
            .with([("security.protocol", "SSL")])
            .unwrap();
        assert_eq!(s.certificate_generation(), 0);
        assert!(!s.renewed(0));
    }
}
