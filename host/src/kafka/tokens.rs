//! OAUTHBEARER for every rdkafka client of the process: the process's token source started
//! once ([`KafkaSettings::start_tokens`]), each client given the token now and every new one
//! (`rd_kafka_oauthbearer_set_token`) for as long as it lives ([`Authorized`]), whatever its
//! kind and whether or not it is polled.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::ConsumerContext;

use super::KafkaSettings;
use crate::oidc::token::{Token, TokenSource};

impl KafkaSettings {
    /// With OAUTHBEARER, fetches the process's first token (a provider that is not there is
    /// an error naming it) and keeps it fresh in every client made from here on; otherwise
    /// these settings as they are. Call once, on a tokio runtime, before making clients.
    pub async fn start_tokens(mut self) -> Result<KafkaSettings, String> {
        let Some(oauth) = self.security.oauth.clone() else {
            return Ok(self);
        };
        if self.tokens.is_some() {
            return Ok(self);
        }
        let source = TokenSource::start(oauth).await?;
        let tokens = Arc::new(Tokens {
            source: source.clone(),
            clients: Default::default(),
            next: Default::default(),
        });
        // Each new token to every client that holds one.
        let weak = Arc::downgrade(&tokens);
        let mut changes = source.subscribe();
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                let Some(tokens) = weak.upgrade() else { return };
                let token = changes.borrow_and_update().clone();
                tokens.hand_out(&token);
            }
        });
        self.tokens = Some(tokens);
        Ok(self)
    }

    /// The OAUTHBEARER token now (for connections that authenticate themselves), if the
    /// settings use one.
    pub fn token(&self) -> Option<Token> {
        self.tokens.as_ref().map(|t| t.source.token())
    }

    /// A broker refused the OAUTHBEARER token held: the source fetches a new one now.
    pub fn token_refused(&self) {
        if let Some(t) = &self.tokens {
            t.source.refused();
        }
    }

    /// How fetching tokens goes, with OAUTHBEARER.
    pub fn token_state(&self) -> Option<crate::oidc::token::TokenState> {
        self.tokens.as_ref().map(|t| t.source.state())
    }
}

/// A process's OAUTHBEARER tokens and the rdkafka clients holding them.
pub(super) struct Tokens {
    source: Arc<TokenSource>,
    /// The live clients, by registration: each is removed (under this lock) before its
    /// handle is destroyed, so a handle here is always alive.
    clients: Mutex<HashMap<u64, Handle>>,
    next: AtomicU64,
}

/// An rdkafka handle, alive while it is registered.
struct Handle(*mut rdkafka::bindings::rd_kafka_t);

// SAFETY: librdkafka's handles are thread-safe; `rd_kafka_oauthbearer_set_token` takes the
// handle's own lock. The pointer is only used while registered (see `Tokens::clients`).
unsafe impl Send for Handle {}

impl Tokens {
    /// Hands `token` to every registered client.
    fn hand_out(&self, token: &Token) {
        let clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        for handle in clients.values() {
            if let Err(e) = set_token(handle.0, token) {
                tracing::warn!("a Kafka client did not take the new OAuth token: {e}");
            }
        }
    }
}

/// Gives the client `rk` the token (librdkafka copies what it takes).
fn set_token(rk: *mut rdkafka::bindings::rd_kafka_t, token: &Token) -> Result<(), String> {
    use rdkafka::bindings as ffi;
    let value = std::ffi::CString::new(token.value.as_str()).map_err(|_| "a token with a NUL byte".to_string())?;
    let principal =
        std::ffi::CString::new(token.principal.as_str()).map_err(|_| "a principal with a NUL byte".to_string())?;
    let mut err = [0 as std::ffi::c_char; 512];
    // SAFETY: `rk` is a live handle (registered, see `Tokens`); the strings are NUL-terminated
    // and outlive the call, which copies them; no extensions; `err` is a buffer of its length.
    let code = unsafe {
        ffi::rd_kafka_oauthbearer_set_token(
            rk,
            value.as_ptr(),
            token.expires_ms(),
            principal.as_ptr(),
            std::ptr::null_mut(),
            0,
            err.as_mut_ptr(),
            err.len(),
        )
    };
    if code == ffi::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        Ok(())
    } else {
        // SAFETY: librdkafka wrote a NUL-terminated message into `err`.
        let text = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) };
        Err(text.to_string_lossy().into_owned())
    }
}

/// A client holding the process's OAUTHBEARER token: removed from the holders before the
/// client itself is dropped (fields drop in order). Derefs to the client.
pub struct Authorized<T> {
    registration: Option<Registration>,
    client: T,
    /// The client certificate's generation it was made at (see [`KafkaSettings::renewed`]).
    made: u64,
}

struct Registration {
    tokens: Arc<Tokens>,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut clients = self.tokens.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients.remove(&self.id);
    }
}

impl<T> std::ops::Deref for Authorized<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.client
    }
}

impl<T> std::ops::DerefMut for Authorized<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.client
    }
}

impl<T> Authorized<T> {
    /// Whether this client holds an OAUTHBEARER token of the process.
    pub fn holds_token(&self) -> bool {
        self.registration.is_some()
    }

    /// The client certificate's generation it was made at: with
    /// [`KafkaSettings::renewed`], whether it should be made again.
    pub fn made(&self) -> u64 {
        self.made
    }
}

/// An rdkafka client's native handle.
pub trait Native {
    fn native(&self) -> *mut rdkafka::bindings::rd_kafka_t;
}

impl<C: ConsumerContext> Native for rdkafka::consumer::BaseConsumer<C> {
    fn native(&self) -> *mut rdkafka::bindings::rd_kafka_t {
        use rdkafka::consumer::Consumer;
        self.client().native_ptr()
    }
}

impl<C: ConsumerContext + 'static> Native for rdkafka::consumer::StreamConsumer<C> {
    fn native(&self) -> *mut rdkafka::bindings::rd_kafka_t {
        use rdkafka::consumer::Consumer;
        self.client().native_ptr()
    }
}

impl<C: ClientContext + 'static> Native for rdkafka::producer::FutureProducer<C> {
    fn native(&self) -> *mut rdkafka::bindings::rd_kafka_t {
        use rdkafka::producer::Producer;
        self.client().native_ptr()
    }
}

impl<C: rdkafka::producer::ProducerContext> Native for rdkafka::producer::BaseProducer<C> {
    fn native(&self) -> *mut rdkafka::bindings::rd_kafka_t {
        use rdkafka::producer::Producer;
        self.client().native_ptr()
    }
}

impl<C: rdkafka::producer::ProducerContext + 'static> Native for rdkafka::producer::ThreadedProducer<C> {
    fn native(&self) -> *mut rdkafka::bindings::rd_kafka_t {
        use rdkafka::producer::Producer;
        self.client().native_ptr()
    }
}

impl<C: ClientContext> Native for rdkafka::admin::AdminClient<C> {
    fn native(&self) -> *mut rdkafka::bindings::rd_kafka_t {
        self.inner().native_ptr()
    }
}

/// Creating rdkafka clients that hold the process's OAUTHBEARER token when it has one.
pub trait Authorize {
    /// `T` from this configuration, with the token of `kafka` (whose [`KafkaSettings::client`]
    /// it was made from).
    fn authorized<T>(&self, kafka: &KafkaSettings) -> rdkafka::error::KafkaResult<Authorized<T>>
    where
        T: rdkafka::config::FromClientConfig + Native;

    /// As [`Self::authorized`], with a context.
    fn authorized_with<C, T>(&self, kafka: &KafkaSettings, context: C) -> rdkafka::error::KafkaResult<Authorized<T>>
    where
        C: ClientContext,
        T: rdkafka::config::FromClientConfigAndContext<C> + Native;
}

impl Authorize for ClientConfig {
    fn authorized<T>(&self, kafka: &KafkaSettings) -> rdkafka::error::KafkaResult<Authorized<T>>
    where
        T: rdkafka::config::FromClientConfig + Native,
    {
        // Read before the client is made: a renewal meanwhile makes it again once more.
        let made = kafka.certificate_generation();
        kafka.authorize(T::from_config(self)?, made)
    }

    fn authorized_with<C, T>(&self, kafka: &KafkaSettings, context: C) -> rdkafka::error::KafkaResult<Authorized<T>>
    where
        C: ClientContext,
        T: rdkafka::config::FromClientConfigAndContext<C> + Native,
    {
        let made = kafka.certificate_generation();
        kafka.authorize(T::from_config_and_context(self, context)?, made)
    }
}

impl KafkaSettings {
    /// `client`, given the process's token now and every new one.
    fn authorize<T: Native>(&self, client: T, made: u64) -> rdkafka::error::KafkaResult<Authorized<T>> {
        if self.security.oauth.is_none() {
            return Ok(Authorized {
                registration: None,
                client,
                made,
            });
        }
        let Some(tokens) = &self.tokens else {
            return Err(rdkafka::error::KafkaError::ClientCreation(
                "kafka.sasl.mechanism = OAUTHBEARER, but this process fetches no tokens (KafkaSettings::start_tokens \
                 was not called)"
                    .into(),
            ));
        };
        let id = tokens.next.fetch_add(1, Ordering::Relaxed);
        let mut clients = tokens.clients.lock().unwrap_or_else(|p| p.into_inner());
        set_token(client.native(), &tokens.source.token()).map_err(rdkafka::error::KafkaError::ClientCreation)?;
        clients.insert(id, Handle(client.native()));
        drop(clients);
        Ok(Authorized {
            registration: Some(Registration {
                tokens: tokens.clone(),
                id,
            }),
            client,
            made,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kafka::{Mechanism, OAUTH_PROPERTIES};

    #[test]
    fn oauthbearer_is_read_and_its_properties_stay_with_the_host() {
        let s = KafkaSettings::new("b:9093")
            .with([
                ("security.protocol", "SASL_SSL"),
                ("sasl.mechanism", "oauthbearer"),
                ("sasl.oauthbearer.token.endpoint.url", "https://idp/token"),
                ("sasl.oauthbearer.client.id", "worker"),
                ("sasl.oauthbearer.client.secret", "s3cret"),
                ("sasl.oauthbearer.audience", "kafka"),
            ])
            .unwrap();
        let sasl = s.security().sasl.as_ref().unwrap();
        assert_eq!(
            (sasl.mechanism, sasl.username.as_str()),
            (Mechanism::OAuthBearer, "worker")
        );
        let oauth = s.security().oauth.as_ref().unwrap();
        assert_eq!(
            (oauth.endpoint.as_str(), oauth.audience.as_deref()),
            ("https://idp/token", Some("kafka"))
        );
        // librdkafka gets the mechanism, never the secret or the properties it does not know.
        let client = s.client();
        assert_eq!(client.get("sasl.mechanism"), Some("OAUTHBEARER"));
        for name in OAUTH_PROPERTIES {
            assert_eq!(client.get(name), None, "{name} reached librdkafka");
        }
        assert!(!format!("{s:?}").contains("s3cret"));
        // A client before the tokens are started is refused, naming why.
        let e = s
            .client()
            .authorized::<rdkafka::consumer::BaseConsumer>(&s)
            .err()
            .unwrap();
        assert!(e.to_string().contains("start_tokens"), "{e}");
        let e = KafkaSettings::new("b")
            .with([
                ("security.protocol", "SASL_PLAINTEXT"),
                ("sasl.mechanism", "OAUTHBEARER"),
            ])
            .unwrap_err();
        assert!(e.contains("token.endpoint.url") && e.contains("client.id"), "{e}");
    }
}
