//! Lethe as an OpenID Connect relying party: the provider's metadata (read once from its
//! discovery document), its keys (read again on a `kid` Lethe does not know, at most once a
//! minute), an authorization code exchanged for tokens, the ID token verified, and a person's
//! roles taken from their groups. The console's sign-in flow is built on it.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, header};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use serde::Deserialize;
use serde_json::Value;

use super::Role;
use crate::config::OidcConfig;

/// The ID token's algorithms Lethe accepts: the provider's public keys only, never a shared
/// secret (an HS256 token signed with a public key must not pass).
const ACCEPTED: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];
/// The provider's keys are read again at most this often, whatever `kid`s tokens name.
const KEYS_REFRESH: Duration = Duration::from_secs(60);
/// How long Lethe waits for the provider, and how much of an answer it reads.
const PROVIDER_TIMEOUT: Duration = Duration::from_secs(10);
const PROVIDER_ANSWER_BYTES: usize = 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OidcError {
    #[error("the sign-in provider cannot be reached or answered unreadably: {0}")]
    Unavailable(String),
    #[error("the sign-in provider refused: {0}")]
    Refused(String),
    #[error("the ID token is not valid: {0}")]
    Invalid(String),
}

/// What the provider's discovery document says Lethe needs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Metadata {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub jwks_uri: String,
    #[serde(default)]
    pub end_session_endpoint: Option<String>,
}

/// A person as the provider vouches for them in a verified ID token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    pub issuer: String,
    pub subject: String,
    /// Their name, else e-mail, else user name, for people to read; never who they are.
    pub display: Option<String>,
    pub groups: Vec<String>,
    /// When the ID token expires (seconds since the epoch).
    pub expires: u64,
    /// Whether the provider showed a second factor: an `amr` of `mfa`, `otp` or `hwk`, or the
    /// configured `mfa_acr`.
    pub second_factor: bool,
    /// When the person last authenticated at the provider (`auth_time`), if it says.
    pub authenticated: Option<u64>,
}

impl Person {
    /// Who acts, in the audit log and on approvals: the provider and its subject, which no name
    /// the person chooses can change.
    pub fn actor(&self) -> String {
        format!("{}#{}", self.issuer, self.subject)
    }
}

/// The role a person has in each tenant their groups map to, the higher one where two do.
pub fn roles(config: &OidcConfig, groups: &[String]) -> Vec<(String, Role)> {
    let mut roles: Vec<(String, Role)> = Vec::new();
    for mapping in config.roles.iter().filter(|m| groups.contains(&m.group)) {
        let role = match mapping.role.as_str() {
            "admin" => Role::Admin,
            _ => Role::Compliance,
        };
        match roles
            .iter_mut()
            .find(|(tenant, _)| *tenant == mapping.tenant)
        {
            Some((_, kept)) if *kept == Role::Compliance => *kept = role,
            Some(_) => {}
            None => roles.push((mapping.tenant.clone(), role)),
        }
    }
    roles.sort_by(|a, b| a.0.cmp(&b.0));
    roles
}

/// A PKCE code verifier's S256 challenge (RFC 7636).
pub fn challenge(verifier: &str) -> String {
    use sha2::Digest;
    URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier.as_bytes()))
}

/// The event a back-channel logout token carries (OpenID Connect Back-Channel Logout 1.0).
const LOGOUT_EVENT: &str = "http://schemas.openid.net/event/backchannel-logout";
/// How old a logout token may be (its `iat`, within the leeway): a provider sends it as the
/// person signs out, so an older one is a replay.
const LOGOUT_FRESH: u64 = 300;

fn invalid(why: &str) -> OidcError {
    OidcError::Invalid(why.to_owned())
}

/// A token's claims once its signature (by an accepted algorithm, with the key it names), `iss`,
/// `aud` (and `azp`), and `exp`, `nbf` within `leeway` hold; `required` names the claims it must
/// carry (an `exp` it carries is checked either way).
fn verified_claims(
    token: &str,
    key: &Jwk,
    config: &OidcConfig,
    leeway: u64,
    required: &[&str],
) -> Result<Value, OidcError> {
    let header = decode_header(token).map_err(|_| invalid("it is not a JWT"))?;
    if !ACCEPTED.contains(&header.alg) {
        return Err(invalid(
            "its algorithm is not one of the provider's public keys",
        ));
    }
    if key
        .common
        .key_algorithm
        .is_some_and(|a| a.to_string() != format!("{:?}", header.alg))
    {
        return Err(invalid("its algorithm is not its key's"));
    }
    let decoding =
        DecodingKey::from_jwk(key).map_err(|_| invalid("the provider's key is unusable"))?;
    let mut validation = Validation::new(header.alg);
    validation.set_issuer(&[&config.issuer]);
    validation.set_audience(&[&config.client_id]);
    validation.set_required_spec_claims(required);
    validation.validate_nbf = true;
    validation.leeway = leeway;
    let claims = decode::<Value>(token, &decoding, &validation)
        .map_err(|e| OidcError::Invalid(e.to_string()))?
        .claims;
    let audiences = match &claims["aud"] {
        Value::Array(list) => list.len(),
        _ => 1,
    };
    match claims.get("azp").and_then(Value::as_str) {
        Some(azp) if azp != config.client_id => {
            return Err(invalid("it was issued to another client (azp)"));
        }
        None if audiences > 1 => return Err(invalid("it names several audiences and no azp")),
        _ => {}
    }
    Ok(claims)
}

/// The checks of an ID token against the key it names: those of [`verified_claims`], with
/// `exp` and `sub` required, and the `nonce` the sign-in sent.
pub fn verify_id_token(
    token: &str,
    key: &Jwk,
    config: &OidcConfig,
    nonce: &str,
    leeway: u64,
) -> Result<Person, OidcError> {
    let claims = verified_claims(token, key, config, leeway, &["exp", "iss", "aud", "sub"])?;
    let text = |name: &str| claims.get(name).and_then(Value::as_str).map(str::to_owned);
    if text("nonce").as_deref() != Some(nonce) {
        return Err(invalid("its nonce is not this sign-in's"));
    }
    let subject = text("sub")
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid("no sub"))?;
    let groups = match &claims[config.groups_claim.as_str()] {
        Value::Array(list) => list
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        Value::String(one) => vec![one.clone()],
        _ => Vec::new(),
    };
    let amr = claims["amr"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let by_amr = amr
        .iter()
        .any(|m| matches!(m.as_str(), Some("mfa" | "otp" | "hwk")));
    let by_acr = config.mfa_acr.is_some() && config.mfa_acr == text("acr");
    Ok(Person {
        second_factor: by_amr || by_acr,
        authenticated: claims["auth_time"].as_u64(),
        issuer: config.issuer.clone(),
        subject,
        display: text("name")
            .or_else(|| text("email"))
            .or_else(|| text("preferred_username")),
        groups,
        expires: claims["exp"].as_u64().ok_or_else(|| invalid("no exp"))?,
    })
}

struct Keys {
    set: JwkSet,
    read_at: Option<Instant>,
}

/// Whom a back-channel logout token signs out, and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedOut {
    /// The actor of its `sub` (`<issuer>#<sub>`).
    pub actor: String,
    /// Its `iat`: sessions begun after it are not its to end.
    pub issued: u64,
    /// Its `jti`, by which a replay is known.
    pub id: String,
}

/// The checks of a back-channel logout token: [`verified_claims`]' with a `jti` and an `iat` at
/// most [`LOGOUT_FRESH`] seconds old at `now` (both within `leeway`), the logout event, and no
/// `nonce` (an ID token is no logout token). A token naming only a provider session (`sid`) is
/// refused: Lethe keeps people, not the provider's sessions.
pub fn verify_logout_token(
    token: &str,
    key: &Jwk,
    config: &OidcConfig,
    leeway: u64,
    now: u64,
) -> Result<LoggedOut, OidcError> {
    let claims = verified_claims(token, key, config, leeway, &["iss", "aud"])?;
    // Beyond jsonwebtoken's own spec claims: when it was issued, and its id.
    let id = claims["jti"].as_str().filter(|j| !j.is_empty());
    let (Some(issued), Some(id)) = (claims["iat"].as_u64(), id) else {
        return Err(invalid("it lacks iat or jti"));
    };
    if issued.saturating_add(LOGOUT_FRESH + leeway) < now || issued > now.saturating_add(leeway) {
        return Err(invalid("it was not issued in the last five minutes"));
    }
    if !claims["events"][LOGOUT_EVENT].is_object() {
        return Err(invalid("it carries no back-channel logout event"));
    }
    if claims.get("nonce").is_some() {
        return Err(invalid(
            "it carries a nonce: an ID token is no logout token",
        ));
    }
    let subject = claims["sub"].as_str().filter(|s| !s.is_empty());
    let subject = subject.ok_or_else(|| invalid("it names no sub"))?;
    Ok(LoggedOut {
        actor: format!("{}#{subject}", config.issuer),
        issued,
        id: id.to_owned(),
    })
}

/// The console's client of one OpenID provider.
pub struct Provider {
    config: OidcConfig,
    secret: String,
    leeway: u64,
    http: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    metadata: tokio::sync::OnceCell<Metadata>,
    keys: tokio::sync::Mutex<Keys>,
}

impl Provider {
    /// A client of `config`'s provider over `tls`; nothing is read from it yet.
    pub fn new(
        config: &OidcConfig,
        leeway: u64,
        tls: &rustls::ClientConfig,
    ) -> Result<Provider, String> {
        let secret = config.client_secret.resolve()?;
        let secret = String::from_utf8(secret)
            .map_err(|_| "control_plane.oidc.client_secret: not UTF-8".to_owned())?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls.clone())
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Provider {
            config: config.clone(),
            secret,
            leeway,
            http: Client::builder(TokioExecutor::new()).build(connector),
            metadata: tokio::sync::OnceCell::new(),
            keys: tokio::sync::Mutex::new(Keys {
                set: JwkSet { keys: Vec::new() },
                read_at: None,
            }),
        })
    }

    pub fn config(&self) -> &OidcConfig {
        &self.config
    }

    /// The clock skew tolerated in the provider's times (seconds).
    pub fn leeway(&self) -> u64 {
        self.leeway
    }

    /// The provider's metadata, read once; its `issuer` must be the one configured.
    pub async fn metadata(&self) -> Result<&Metadata, OidcError> {
        self.metadata
            .get_or_try_init(|| async {
                let url = format!(
                    "{}/.well-known/openid-configuration",
                    self.config.issuer.trim_end_matches('/')
                );
                let metadata: Metadata = serde_json::from_slice(
                    &self.read(Method::GET, &url, None).await?,
                )
                .map_err(|e| OidcError::Unavailable(format!("its discovery document: {e}")))?;
                if metadata.issuer != self.config.issuer {
                    return Err(OidcError::Unavailable(format!(
                        "its discovery document names the issuer {:?}, not {:?}",
                        metadata.issuer, self.config.issuer
                    )));
                }
                Ok(metadata)
            })
            .await
    }

    /// Where the browser is sent to sign in: the code flow with PKCE (S256), `state` and `nonce`;
    /// for a `step_up`, a fresh sign-in (`max_age=0`, `prompt=login`) asking for the second factor
    /// (`acr_values`, when `mfa_acr` names it).
    pub fn authorization_url(
        &self,
        metadata: &Metadata,
        state: &str,
        nonce: &str,
        verifier: &str,
        step_up: bool,
    ) -> String {
        let mut query = form_urlencoded::Serializer::new(String::new());
        if step_up {
            query
                .append_pair("max_age", "0")
                .append_pair("prompt", "login");
            if let Some(acr) = &self.config.mfa_acr {
                query.append_pair("acr_values", acr);
            }
        }
        let query = query
            .append_pair("response_type", "code")
            .append_pair("client_id", &self.config.client_id)
            .append_pair("redirect_uri", &self.config.redirect_url)
            .append_pair("scope", &self.config.scopes.join(" "))
            .append_pair("state", state)
            .append_pair("nonce", nonce)
            .append_pair("code_challenge", &challenge(verifier))
            .append_pair("code_challenge_method", "S256")
            .finish();
        let joiner = if metadata.authorization_endpoint.contains('?') {
            '&'
        } else {
            '?'
        };
        format!("{}{joiner}{query}", metadata.authorization_endpoint)
    }

    /// The person an authorization code stands for: the code exchanged (with the PKCE verifier
    /// and the client's secret) and the ID token verified against the sign-in's `nonce`.
    pub async fn sign_in(
        &self,
        code: &str,
        verifier: &str,
        nonce: &str,
    ) -> Result<Person, OidcError> {
        let metadata = self.metadata().await?;
        let form = form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "authorization_code")
            .append_pair("code", code)
            .append_pair("redirect_uri", &self.config.redirect_url)
            .append_pair("code_verifier", verifier)
            .finish();
        let answer = self
            .read(Method::POST, &metadata.token_endpoint, Some(form))
            .await?;
        let tokens: Value = serde_json::from_slice(&answer)
            .map_err(|_| OidcError::Unavailable("its token answer is not JSON".into()))?;
        let id_token = tokens["id_token"]
            .as_str()
            .ok_or_else(|| OidcError::Refused("no ID token in its answer".into()))?;
        let key = self.key_of(id_token, &metadata.jwks_uri).await?;
        verify_id_token(id_token, &key, &self.config, nonce, self.leeway)
    }

    /// Whom a back-channel logout token from the provider signs out.
    pub async fn signed_out(&self, logout_token: &str) -> Result<LoggedOut, OidcError> {
        let metadata = self.metadata().await?;
        let key = self.key_of(logout_token, &metadata.jwks_uri).await?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        verify_logout_token(logout_token, &key, &self.config, self.leeway, now)
    }

    /// Until when a logout token issued at `issued` could still pass: it is kept that long.
    pub fn logout_passes_until(&self, issued: u64) -> u64 {
        issued.saturating_add(LOGOUT_FRESH + 2 * self.leeway)
    }

    /// The provider's key a token names by `kid` (or its only key of the token's algorithm),
    /// reading the keys again when none matches and they were not read in the last minute.
    async fn key_of(&self, token: &str, jwks_uri: &str) -> Result<Jwk, OidcError> {
        let header =
            decode_header(token).map_err(|_| OidcError::Invalid("it is not a JWT".into()))?;
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
            let read = self.read(Method::GET, jwks_uri, None).await?;
            keys.set = serde_json::from_slice(&read)
                .map_err(|e| OidcError::Unavailable(format!("its keys: {e}")))?;
            keys.read_at = Some(Instant::now());
        }
        Err(OidcError::Invalid(
            "it names no key the provider publishes (or several match)".into(),
        ))
    }

    /// A GET, or a POST of a form with the client's credentials (`client_secret_basic`), read
    /// whole; a provider's refusal (4xx) is `Refused` with its `error`, anything else unavailable.
    async fn read(
        &self,
        method: Method,
        url: &str,
        form: Option<String>,
    ) -> Result<Bytes, OidcError> {
        let unavailable = |why: String| OidcError::Unavailable(why);
        let mut request = Request::builder()
            .method(method)
            .uri(url)
            .header(header::ACCEPT, "application/json");
        if form.is_some() {
            let user = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            let basic = STANDARD.encode(format!(
                "{}:{}",
                user(&self.config.client_id),
                user(&self.secret)
            ));
            request = request
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .header(header::AUTHORIZATION, format!("Basic {basic}"));
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
                    let code = error["error"].as_str().unwrap_or("no error code");
                    Err(OidcError::Refused(format!("{status} {code}")))
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
