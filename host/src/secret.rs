//! The cluster secret: what tells a record, a group message or a request written by a
//! worker of this cluster from one written by anybody else with access to the same Kafka or
//! network (a tenant has Kafka credentials of its own). Workers sign with HMAC-SHA256 under
//! it; nothing is signed with anything else.
//!
//! ```
//! use sluice::secret::ClusterSecret;
//! let secret = ClusterSecret::new(b"a secret of at least sixteen bytes".to_vec()).unwrap();
//! let tag = secret.sign("registry record", &[b"t/orders", b"{...}"]);
//! assert!(secret.verify("registry record", &[b"t/orders", b"{...}"], &tag));
//! assert!(!secret.verify("registry record", &[b"t/orders", b"{forged}"], &tag));
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of a signature.
pub const TAG_BYTES: usize = 32;

/// The shortest secret accepted: 16 bytes (128 bits), as a key for HMAC-SHA256 should be.
pub const MIN_SECRET_BYTES: usize = 16;

/// The cluster secret. Its `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret(Arc<[u8]>);

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(…)")
    }
}

impl ClusterSecret {
    /// A secret of at least [`MIN_SECRET_BYTES`] bytes.
    pub fn new(bytes: Vec<u8>) -> Result<ClusterSecret, String> {
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(format!(
                "the cluster secret has {} bytes; it needs at least {MIN_SECRET_BYTES} (use a long random string, \
                 e.g. `openssl rand -hex 32`)",
                bytes.len()
            ));
        }
        Ok(ClusterSecret(bytes.into()))
    }

    fn mac(&self, purpose: &str, parts: &[&[u8]]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        // Length-prefixed, so no two different lists of parts sign alike.
        for part in std::iter::once(purpose.as_bytes()).chain(parts.iter().copied()) {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac
    }

    /// The signature of `parts` for `purpose` (a purpose keeps a signature made for one use
    /// from being accepted for another).
    pub fn sign(&self, purpose: &str, parts: &[&[u8]]) -> [u8; TAG_BYTES] {
        self.mac(purpose, parts).finalize().into_bytes().into()
    }

    /// Whether `tag` is the signature of `parts` for `purpose` (compared in constant time).
    pub fn verify(&self, purpose: &str, parts: &[&[u8]], tag: &[u8]) -> bool {
        self.mac(purpose, parts).verify_slice(tag).is_ok()
    }

    /// The value of the header with which a worker asks another worker for `method path`:
    /// `<unix seconds>.<hex signature>`, good for [`REQUEST_WINDOW`] and only for that
    /// request, so a captured one opens nothing else.
    pub fn request_token(&self, method: &str, path: &str) -> String {
        let now = unix_seconds();
        let tag = self.sign(
            "worker request",
            &[now.to_string().as_bytes(), method.as_bytes(), path.as_bytes()],
        );
        format!("{now}.{}", hex(&tag))
    }

    /// Whether `token` is a worker's [`request_token`](Self::request_token) for `method
    /// path`, made within [`REQUEST_WINDOW`] of now.
    pub fn verify_request(&self, token: &str, method: &str, path: &str) -> bool {
        let Some((time, tag)) = token.split_once('.') else {
            return false;
        };
        let (Ok(at), Some(tag)) = (time.parse::<u64>(), unhex(tag)) else {
            return false;
        };
        let now = unix_seconds();
        if at.abs_diff(now) > REQUEST_WINDOW.as_secs() {
            return false;
        }
        self.verify(
            "worker request",
            &[time.as_bytes(), method.as_bytes(), path.as_bytes()],
            &tag,
        )
    }
}

/// How long a worker's request token is good for (clocks of a cluster's machines agree
/// within this).
pub const REQUEST_WINDOW: Duration = Duration::from_secs(60);

/// The header a worker's request token travels in.
pub const WORKER_HEADER: &str = "x-sluice-worker";

fn unix_seconds() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of a hex string; none if it is not one.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> ClusterSecret {
        ClusterSecret::new(b"0123456789abcdef-and-more".to_vec()).unwrap()
    }

    #[test]
    fn a_signature_holds_only_for_its_purpose_parts_and_secret() {
        let s = secret();
        let tag = s.sign("a", &[b"x", b"y"]);
        assert!(s.verify("a", &[b"x", b"y"], &tag));
        assert!(!s.verify("b", &[b"x", b"y"], &tag), "another purpose");
        assert!(!s.verify("a", &[b"xy"], &tag), "the same bytes, cut otherwise");
        assert!(!s.verify("a", &[b"x", b"y"], &tag[..31]), "a shortened tag");
        let other = ClusterSecret::new(b"another secret, also long".to_vec()).unwrap();
        assert!(!other.verify("a", &[b"x", b"y"], &tag));
        assert!(ClusterSecret::new(b"short".to_vec())
            .unwrap_err()
            .contains("at least 16"));
        assert_eq!(format!("{s:?}"), "ClusterSecret(…)");
    }

    #[test]
    fn a_request_token_opens_only_its_request() {
        let s = secret();
        let token = s.request_token("GET", "/status");
        assert!(s.verify_request(&token, "GET", "/status"));
        assert!(!s.verify_request(&token, "GET", "/v1/topologies"));
        assert!(!s.verify_request(&token, "POST", "/status"));
        let old = format!("1000.{}", token.split_once('.').unwrap().1);
        assert!(!s.verify_request(&old, "GET", "/status"), "an old token");
        for junk in ["", "x", "1.zz", "é.é", "12345"] {
            assert!(!s.verify_request(junk, "GET", "/status"), "{junk:?}");
        }
    }

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        assert_eq!(unhex(&hex(&[0, 1, 254, 255])), Some(vec![0, 1, 254, 255]));
        for bad in ["abc", "zz", "éé", "0x"] {
            assert_eq!(unhex(bad), None, "{bad:?}");
        }
    }
}
