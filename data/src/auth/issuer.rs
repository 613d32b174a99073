//! One OpenID provider as Lethe reads it: its discovery document (read once, naming the issuer
//! configured), its keys, and bounded exchanges with its endpoints. The console's sign-in, the
//! access tokens of the API and `lethe login` all speak to their provider through it.
//!
//! The keys are read again when a token names a `kid` Lethe does not know and when they are more
//! than five minutes old (so a key the provider withdrew stops verifying), each at most once a
//! minute whether the reading worked or not; only one reading runs at a time, and a token whose
//! key is known never waits for it. Keys not read successfully for an hour verify nothing. A
//! discovery that failed is not tried again for ten seconds.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, header};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::decode_header;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use serde::Deserialize;
use serde_json::Value;

use super::oidc::OidcError;

/// The provider's keys are read at most this often, whatever `kid`s tokens name.
const KEYS_REFRESH: Duration = Duration::from_secs(60);
/// Keys this old are read again before they verify another token.
const KEYS_MAX_AGE: Duration = Duration::from_secs(300);
/// Keys that could not be read again for this long verify nothing.
const KEYS_TRUSTED: Duration = Duration::from_secs(3600);
/// A discovery that failed answers its failure this long before it is tried again.
const DISCOVERY_RETRY: Duration = Duration::from_secs(10);
/// How long Lethe waits for the provider, and how much of an answer it reads.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(10);
const PROVIDER_ANSWER_BYTES: usize = 1024 * 1024;

/// What the provider's discovery document says Lethe needs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Metadata {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub jwks_uri: String,
    #[serde(default)]
    pub end_session_endpoint: Option<String>,
    /// RFC 8628's endpoint, where the provider offers the device authorization grant.
    #[serde(default)]
    pub device_authorization_endpoint: Option<String>,
}

#[derive(Default)]
struct Keys {
    set: Vec<Jwk>,
    /// When they were last read successfully, and when a reading was last tried.
    read_at: Option<Instant>,
    tried_at: Option<Instant>,
}

/// A client's credentials, sent as `client_secret_basic`.
pub struct ClientSecret<'a> {
    pub id: &'a str,
    pub secret: &'a str,
}

pub struct Issuer {
    url: String,
    http: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    metadata: tokio::sync::OnceCell<Metadata>,
    /// The last failed discovery, answered again until [`DISCOVERY_RETRY`] has passed.
    discovery_failed: std::sync::Mutex<Option<(Instant, OidcError)>>,
    keys: std::sync::RwLock<Keys>,
    /// Held by the one reading of the keys under way.
    reading: tokio::sync::Mutex<()>,
}

impl Issuer {
    /// The provider whose issuer is `url`, reached over `tls`; nothing is read from it yet.
    pub fn new(url: &str, tls: &rustls::ClientConfig) -> Issuer {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Issuer {
            url: url.to_owned(),
            http: Client::builder(TokioExecutor::new()).build(connector),
            metadata: tokio::sync::OnceCell::new(),
            discovery_failed: std::sync::Mutex::new(None),
            keys: std::sync::RwLock::new(Keys::default()),
            reading: tokio::sync::Mutex::new(()),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The provider's metadata, read once; its `issuer` must be the one configured.
    pub async fn metadata(&self) -> Result<&Metadata, OidcError> {
        if let Some(metadata) = self.metadata.get() {
            return Ok(metadata);
        }
        self.metadata
            .get_or_try_init(|| async {
                let failed = self.discovery_failed.lock().ok().and_then(|f| f.clone());
                if let Some((at, error)) = failed
                    && at.elapsed() < DISCOVERY_RETRY
                {
                    return Err(error);
                }
                let read = self.discover().await;
                if let (Err(error), Ok(mut failed)) = (&read, self.discovery_failed.lock()) {
                    *failed = Some((Instant::now(), error.clone()));
                }
                read
            })
            .await
    }

    async fn discover(&self) -> Result<Metadata, OidcError> {
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.url.trim_end_matches('/')
        );
        let metadata: Metadata = serde_json::from_slice(&self.get(&url).await?)
            .map_err(|e| OidcError::Unavailable(format!("its discovery document: {e}")))?;
        if metadata.issuer != self.url {
            return Err(OidcError::Unavailable(format!(
                "its discovery document names the issuer {:?}, not {:?}",
                metadata.issuer, self.url
            )));
        }
        Ok(metadata)
    }

    /// The provider's key a token names by `kid` (or its only key, when the token names none),
    /// from keys read in the last five minutes where they can be (see the module's comment).
    pub async fn key_of(&self, token: &str) -> Result<Jwk, OidcError> {
        let header =
            decode_header(token).map_err(|_| OidcError::Invalid("it is not a JWT".into()))?;
        let jwks_uri = &self.metadata().await?.jwks_uri;
        let kid = header.kid.as_deref();
        let (found, fresh, tried_lately) = self.known(kid);
        if let Some(key) = found.as_ref().filter(|_| fresh) {
            return Ok(key.clone());
        }
        if !tried_lately {
            // One reading at a time: whoever waited for another's finds its keys.
            let _reading = self.reading.lock().await;
            if !self.known(kid).2 {
                self.read_keys(jwks_uri).await;
            }
        }
        match self.known(kid) {
            (Some(key), _, _) if self.trusted() => Ok(key),
            (Some(_), _, _) => Err(OidcError::Unavailable(
                "its keys could not be read for an hour".into(),
            )),
            (None, _, _) if self.trusted() => Err(OidcError::Invalid(
                "it names no key the provider publishes (or several match)".into(),
            )),
            (None, _, _) => Err(OidcError::Unavailable("its keys could not be read".into())),
        }
    }

    /// The one key `kid` names (the only key, without a `kid`), whether the keys are fresh, and
    /// whether a reading was tried in the last minute.
    fn known(&self, kid: Option<&str>) -> (Option<Jwk>, bool, bool) {
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        let matching: Vec<&Jwk> = keys
            .set
            .iter()
            .filter(|k| match (kid, &k.common.key_id) {
                (Some(wanted), Some(id)) => wanted == id,
                (Some(_), None) => false,
                (None, _) => true,
            })
            .collect();
        let key = match matching[..] {
            [key] => Some(key.clone()),
            _ => None,
        };
        let fresh = keys.read_at.is_some_and(|at| at.elapsed() < KEYS_MAX_AGE);
        let tried = keys.tried_at.is_some_and(|at| at.elapsed() < KEYS_REFRESH);
        (key, fresh, tried)
    }

    /// Whether the keys held were read successfully within the last hour.
    fn trusted(&self) -> bool {
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner());
        keys.read_at.is_some_and(|at| at.elapsed() < KEYS_TRUSTED)
    }

    /// Reads the keys again; a failed reading keeps the keys held (they stay trusted for an hour
    /// after they were read) and counts as tried.
    async fn read_keys(&self, jwks_uri: &str) {
        let read = self.get(jwks_uri).await.and_then(|bytes| {
            serde_json::from_slice::<JwkSet>(&bytes)
                .map_err(|e| OidcError::Unavailable(format!("its keys: {e}")))
        });
        let mut keys = self.keys.write().unwrap_or_else(|p| p.into_inner());
        keys.tried_at = Some(Instant::now());
        match read {
            Ok(set) => {
                keys.set = set.keys;
                keys.read_at = keys.tried_at;
            }
            Err(e) => tracing::warn!(error = %e, "the sign-in provider's keys could not be read"),
        }
    }

    pub async fn get(&self, url: &str) -> Result<Bytes, OidcError> {
        self.exchange(Method::GET, url, None, None).await
    }

    /// A form posted to one of the provider's endpoints, with the client's credentials where it
    /// has a secret (a public client names itself in the form).
    pub async fn post(
        &self,
        url: &str,
        form: String,
        client: Option<ClientSecret<'_>>,
    ) -> Result<Value, OidcError> {
        let answer = self.exchange(Method::POST, url, Some(form), client).await?;
        serde_json::from_slice(&answer)
            .map_err(|_| OidcError::Unavailable("its answer is not JSON".into()))
    }

    /// One request, its answer read whole; a provider's refusal (4xx) is `Refused` with its
    /// `error` code (`invalid_grant`, `authorization_pending`, ...), anything else unavailable.
    async fn exchange(
        &self,
        method: Method,
        url: &str,
        form: Option<String>,
        client: Option<ClientSecret<'_>>,
    ) -> Result<Bytes, OidcError> {
        let unavailable = |why: String| OidcError::Unavailable(why);
        let mut request = Request::builder()
            .method(method)
            .uri(url)
            .header(header::ACCEPT, "application/json");
        if form.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        }
        if let Some(client) = client {
            let user = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            let basic = STANDARD.encode(format!("{}:{}", user(client.id), user(client.secret)));
            request = request.header(header::AUTHORIZATION, format!("Basic {basic}"));
        }
        let request = request
            .body(Full::new(Bytes::from(form.unwrap_or_default())))
            .map_err(|_| unavailable(format!("{url} is not a URL")))?;
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| unavailable(e.to_string()))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), PROVIDER_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|_| unavailable("its answer was cut off or too large".into()))?
                .to_bytes();
            match status.as_u16() {
                200..=299 => Ok(body),
                400..=499 => {
                    let error: Value = serde_json::from_slice(&body).unwrap_or_default();
                    let code = error["error"].as_str().unwrap_or("no_error_code");
                    Err(OidcError::Refused(code.to_owned()))
                }
                _ => Err(unavailable(format!("it answered {status}"))),
            }
        };
        tokio::time::timeout(PROVIDER_TIMEOUT, exchange)
            .await
            .map_err(|_| unavailable("it did not answer in time".into()))?
    }
}

#[cfg(test)]
mod tests;
