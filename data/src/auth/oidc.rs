//! Lethe as an OpenID Connect relying party of the console: an authorization code exchanged for
//! tokens, the ID token verified, a back-channel logout token verified, and a person's roles
//! taken from their groups. The console's sign-in flow is built on it.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::Jwk;
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};
use serde_json::Value;

use super::Role;
use super::issuer::{ClientSecret, Issuer};
use crate::config::{GroupRole, OidcConfig};

pub use super::issuer::Metadata;

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

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OidcError {
    #[error("the sign-in provider cannot be reached or answered unreadably: {0}")]
    Unavailable(String),
    #[error("the sign-in provider refused: {0}")]
    Refused(String),
    #[error("the ID token is not valid: {0}")]
    Invalid(String),
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
pub fn roles(mapping: &[GroupRole], groups: &[String]) -> Vec<(String, Role)> {
    let mut roles: Vec<(String, Role)> = Vec::new();
    for mapping in mapping.iter().filter(|m| groups.contains(&m.group)) {
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

/// Whom a token must be from and for.
pub(super) struct Expected<'a> {
    pub issuer: &'a str,
    pub audience: &'a str,
    /// Whether it was issued to this client (an ID token's `azp`); an access token's `azp` is the
    /// client that asked for it, not Lethe.
    pub to_client: bool,
}

impl<'a> Expected<'a> {
    fn id_token(config: &'a OidcConfig) -> Self {
        Expected {
            issuer: &config.issuer,
            audience: &config.client_id,
            to_client: true,
        }
    }
}

/// A token's claims once its signature (by an accepted algorithm, with the key it names), `iss`,
/// `aud` (and `azp`), and `exp`, `nbf` within `leeway` hold; `required` names the claims it must
/// carry (an `exp` it carries is checked either way).
pub(super) fn verified_claims(
    token: &str,
    key: &Jwk,
    expected: &Expected<'_>,
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
    validation.set_issuer(&[expected.issuer]);
    validation.set_audience(&[expected.audience]);
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
    if !expected.to_client {
        return Ok(claims);
    }
    match claims.get("azp").and_then(Value::as_str) {
        Some(azp) if azp != expected.audience => {
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
    let expected = Expected::id_token(config);
    let claims = verified_claims(token, key, &expected, leeway, &["exp", "iss", "aud", "sub"])?;
    let text = |name: &str| claims.get(name).and_then(Value::as_str).map(str::to_owned);
    if text("nonce").as_deref() != Some(nonce) {
        return Err(invalid("its nonce is not this sign-in's"));
    }
    let subject = text("sub")
        .filter(|s| !s.is_empty())
        .ok_or_else(|| invalid("no sub"))?;
    Ok(Person {
        second_factor: second_factor(&claims, config.mfa_acr.as_deref()),
        authenticated: claims["auth_time"].as_u64(),
        issuer: config.issuer.clone(),
        subject,
        display: display(&claims),
        groups: groups(&claims, &config.groups_claim),
        expires: claims["exp"].as_u64().ok_or_else(|| invalid("no exp"))?,
    })
}

/// The groups a token's `claim` lists (a list, or one name).
pub(super) fn groups(claims: &Value, claim: &str) -> Vec<String> {
    match &claims[claim] {
        Value::Array(list) => list
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        Value::String(one) => vec![one.clone()],
        _ => Vec::new(),
    }
}

/// Whether a token shows a second factor: an `amr` of `mfa`, `otp` or `hwk`, or the `acr` that
/// means one at this provider.
pub(super) fn second_factor(claims: &Value, mfa_acr: Option<&str>) -> bool {
    let amr = claims["amr"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let by_amr = amr
        .iter()
        .any(|m| matches!(m.as_str(), Some("mfa" | "otp" | "hwk")));
    by_amr || mfa_acr.is_some_and(|acr| claims["acr"].as_str() == Some(acr))
}

/// A person's name for people to read: their name, else e-mail, else user name.
pub(super) fn display(claims: &Value) -> Option<String> {
    ["name", "email", "preferred_username"]
        .iter()
        .find_map(|claim| claims[*claim].as_str())
        .map(str::to_owned)
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
    let claims = verified_claims(
        token,
        key,
        &Expected::id_token(config),
        leeway,
        &["iss", "aud"],
    )?;
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
    issuer: Issuer,
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
        Ok(Provider {
            config: config.clone(),
            secret,
            leeway,
            issuer: Issuer::new(&config.issuer, tls),
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
        self.issuer.metadata().await
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
        let client = ClientSecret {
            id: &self.config.client_id,
            secret: &self.secret,
        };
        let tokens = self
            .issuer
            .post(&metadata.token_endpoint, form, Some(client))
            .await?;
        let id_token = tokens["id_token"]
            .as_str()
            .ok_or_else(|| OidcError::Refused("no ID token in its answer".into()))?;
        let key = self.issuer.key_of(id_token).await?;
        verify_id_token(id_token, &key, &self.config, nonce, self.leeway)
    }

    /// Whom a back-channel logout token from the provider signs out.
    pub async fn signed_out(&self, logout_token: &str) -> Result<LoggedOut, OidcError> {
        let key = self.issuer.key_of(logout_token).await?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        verify_logout_token(logout_token, &key, &self.config, self.leeway, now)
    }

    /// Until when a logout token issued at `issued` could still pass: it is kept that long.
    pub fn logout_passes_until(&self, issued: u64) -> u64 {
        issued.saturating_add(LOGOUT_FRESH + 2 * self.leeway)
    }
}

#[cfg(test)]
pub(super) mod tests;
