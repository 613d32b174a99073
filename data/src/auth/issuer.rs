//! One OpenID provider as Lethe reads it: its discovery document (read once, naming the issuer
//! configured), its keys (read again on a `kid` Lethe does not know, at most once a minute), and
//! bounded exchanges with its endpoints. The console's sign-in, the access tokens of the API and
//! `lethe login` all speak to their provider through it.

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

/// The provider's keys are read again at most this often, whatever `kid`s tokens name.
const KEYS_REFRESH: Duration = Duration::from_secs(60);
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

struct Keys {
    set: JwkSet,
    read_at: Option<Instant>,
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
    keys: tokio::sync::Mutex<Keys>,
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
            keys: tokio::sync::Mutex::new(Keys {
                set: JwkSet { keys: Vec::new() },
                read_at: None,
            }),
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The provider's metadata, read once; its `issuer` must be the one configured.
    pub async fn metadata(&self) -> Result<&Metadata, OidcError> {
        self.metadata
            .get_or_try_init(|| async {
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
            })
            .await
    }

    /// The provider's key a token names by `kid` (or its only key, when the token names none),
    /// reading the keys again when none matches and they were not read in the last minute.
    pub async fn key_of(&self, token: &str) -> Result<Jwk, OidcError> {
        let header =
            decode_header(token).map_err(|_| OidcError::Invalid("it is not a JWT".into()))?;
        let jwks_uri = &self.metadata().await?.jwks_uri;
        let mut keys = self.keys.lock().await;
        for attempt in 0..2 {
            let matching: Vec<&Jwk> = keys
                .set
                .keys
                .iter()
                .filter(|k| match (&header.kid, &k.common.key_id) {
                    (Some(wanted), Some(kid)) => wanted == kid,
                    (Some(_), None) => false,
                    (None, _) => true,
                })
                .collect();
            if let [key] = matching[..] {
                return Ok(key.clone());
            }
            let stale = keys.read_at.is_none_or(|at| at.elapsed() >= KEYS_REFRESH);
            if attempt == 1 || !stale {
                break;
            }
            let read = self.get(jwks_uri).await?;
            keys.set = serde_json::from_slice(&read)
                .map_err(|e| OidcError::Unavailable(format!("its keys: {e}")))?;
            keys.read_at = Some(Instant::now());
        }
        Err(OidcError::Invalid(
            "it names no key the provider publishes (or several match)".into(),
        ))
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
