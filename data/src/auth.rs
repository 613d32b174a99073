//! Token verification (and, for development, minting).
//!
//! Tokens are JWTs with `iss`, `aud = "lethe"`, `exp`, `sub` (the actor), `tenant`, `role` and an
//! optional `subject` that binds the token to one data subject. Development uses one HS256
//! secret; production uses public keys only (RS256, ES256, EdDSA from PEM or a JWKS file). The two
//! are never accepted together, and a key only ever verifies the algorithm it was configured for,
//! so neither `alg: none` nor algorithm confusion can pass.

use std::fmt;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use jsonwebtoken::{
    Algorithm, DecodingKey, EncodingKey, Header, Validation, decode, decode_header, encode,
};
use serde::{Deserialize, Serialize};

use crate::config::{AuthConfig, PublicKeyAlgorithm};

pub mod access;
pub mod issuer;
pub mod oidc;

pub const AUDIENCE: &str = "lethe";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// An agent app on the data plane.
    Agent,
    /// Compliance staff: consent, retention, holds, erasure, audit, within their tenant.
    Compliance,
    /// Everything, in every tenant.
    Admin,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Agent => "agent",
            Role::Compliance => "compliance",
            Role::Admin => "admin",
        })
    }
}

/// What Lethe takes from a verified token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The actor: who is calling (a service, a person).
    pub sub: String,
    pub tenant: String,
    pub role: Role,
    /// Binds the token to one data subject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    pub exp: u64,
    /// The token's id, by which it can be revoked before it expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
    /// A person's name for people to read (from their sign-in provider); never who acts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Whether the sign-in provider showed a second factor for this sign-in.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub second_factor: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no bearer token")]
    Missing,
    #[error("the token is malformed")]
    Malformed,
    #[error("the token's algorithm is not accepted here")]
    AlgorithmNotAccepted,
    #[error("the token's signature does not verify")]
    BadSignature,
    #[error("the token has expired")]
    Expired,
    #[error("the token's issuer or audience is wrong")]
    WrongIssuerOrAudience,
    #[error("the token lacks a required claim or has an invalid one")]
    BadClaims,
    #[error("the token must be sent once, in one header")]
    Repeated,
    #[error("the sign-in provider's token is not accepted: {0}")]
    ProviderToken(String),
    #[error("the sign-in provider's token gives no role here: {0}")]
    NoRole(String),
    #[error("the sign-in provider's keys cannot be read: {0}")]
    ProviderUnavailable(String),
    #[error("a token cannot act as a person of the sign-in provider; sign in through it")]
    PersonOfProvider,
}

impl From<jsonwebtoken::errors::Error> for AuthError {
    fn from(e: jsonwebtoken::errors::Error) -> Self {
        use jsonwebtoken::errors::ErrorKind as K;
        match e.kind() {
            K::ExpiredSignature => AuthError::Expired,
            K::InvalidSignature => AuthError::BadSignature,
            K::InvalidIssuer | K::InvalidAudience => AuthError::WrongIssuerOrAudience,
            K::InvalidAlgorithm | K::InvalidAlgorithmName => AuthError::AlgorithmNotAccepted,
            K::MissingRequiredClaim(_) | K::Json(_) | K::InvalidSubject | K::ImmatureSignature => {
                AuthError::BadClaims
            }
            _ => AuthError::Malformed,
        }
    }
}

/// The token of an `Authorization: Bearer ...` header, sent once: with two, a proxy in front of
/// Lethe might authorise the other.
pub fn bearer_token(headers: &hyper::HeaderMap) -> Result<&str, AuthError> {
    let mut sent = headers.get_all(hyper::header::AUTHORIZATION).iter();
    let first = sent.next();
    if sent.next().is_some() {
        return Err(AuthError::Repeated);
    }
    first
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .ok_or(AuthError::Missing)
}

struct Key {
    algorithm: Algorithm,
    kid: Option<String>,
    key: DecodingKey,
}

/// Verifies tokens against the configured keys.
pub struct Verifier {
    keys: Vec<Key>,
    issuer: String,
    leeway: u64,
}

impl Verifier {
    /// Development: one HS256 secret.
    pub fn hs256(secret: &[u8], issuer: &str, leeway: u64) -> Result<Self, String> {
        let key = DecodingKey::from_secret(secret).map_err(|e| format!("HS256 secret: {e}"))?;
        Ok(Verifier {
            keys: vec![Key {
                algorithm: Algorithm::HS256,
                kid: None,
                key,
            }],
            issuer: issuer.to_owned(),
            leeway,
        })
    }

    /// Production: the public keys and JWKS file of the config. Reports every bad key at once.
    pub fn public_keys(config: &AuthConfig) -> Result<Self, Vec<String>> {
        let mut keys = Vec::new();
        let mut problems = Vec::new();
        for (i, k) in config.keys.iter().enumerate() {
            let loaded = k.pem.resolve().and_then(|pem| {
                let key = match k.algorithm {
                    PublicKeyAlgorithm::RS256 => DecodingKey::from_rsa_pem(&pem),
                    PublicKeyAlgorithm::ES256 => DecodingKey::from_ec_pem(&pem),
                    PublicKeyAlgorithm::EdDSA => DecodingKey::from_ed_pem(&pem),
                };
                key.map_err(|e| format!("not a {:?} public key in PEM: {e}", k.algorithm))
            });
            match loaded {
                Ok(key) => keys.push(Key {
                    algorithm: algorithm_of(k.algorithm),
                    kid: k.kid.clone(),
                    key,
                }),
                Err(e) => problems.push(format!("auth.keys #{}: {e}", i + 1)),
            }
        }
        if let Some(path) = &config.jwks {
            match load_jwks(path) {
                Ok(mut loaded) => keys.append(&mut loaded),
                Err(e) => problems.push(format!("auth.jwks {}: {e}", path.display())),
            }
        }
        if keys.is_empty() && problems.is_empty() {
            problems.push("auth: no public key configured".to_owned());
        }
        if problems.is_empty() {
            Ok(Verifier {
                keys,
                issuer: config.issuer.clone(),
                leeway: config.leeway_seconds,
            })
        } else {
            Err(problems)
        }
    }

    pub fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        let header = decode_header(token).map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::InvalidAlgorithmName => {
                AuthError::AlgorithmNotAccepted
            }
            _ => AuthError::Malformed,
        })?;
        let candidates = self
            .keys
            .iter()
            .filter(|k| k.algorithm == header.alg)
            .filter(|k| k.kid.is_none() || k.kid == header.kid);
        let mut last = AuthError::AlgorithmNotAccepted;
        for key in candidates {
            let mut validation = Validation::new(key.algorithm);
            validation.set_issuer(&[&self.issuer]);
            validation.set_audience(&[AUDIENCE]);
            validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
            validation.leeway = self.leeway;
            match decode::<Claims>(token, &key.key, &validation) {
                Ok(data) => return validate_claims(data.claims),
                // Another key of the same algorithm may still match.
                Err(e) => last = e.into(),
            }
        }
        Err(last)
    }
}

/// The actor, the tenant and a bound subject must each be in their one spelling already (see
/// `lethe_policy::names`): a token naming `dpo-a ` or a decomposed subject is refused, not read
/// as someone else. A tenant whose keys are case-insensitive folds the bound subject later.
fn validate_claims(claims: Claims) -> Result<Claims, AuthError> {
    use lethe_policy::names::{canonical, canonical_key};
    let is = |name: Result<std::borrow::Cow<'_, str>, _>, as_sent: &str| {
        name.is_ok_and(|n| n == as_sent)
    };
    let sound = is(canonical(&claims.sub, false), &claims.sub)
        && is(canonical_key(&claims.tenant, false), &claims.tenant)
        && claims
            .subject
            .as_deref()
            .is_none_or(|s| is(canonical_key(s, false), s))
        && claims.jti.as_deref().is_none_or(revocable_id);
    if sound {
        Ok(claims)
    } else {
        Err(AuthError::BadClaims)
    }
}

/// A token id that can be revoked as sent: 1 to 200 bytes, no control characters.
pub fn revocable_id(jti: &str) -> bool {
    !jti.is_empty() && jti.len() <= 200 && !jti.chars().any(char::is_control)
}

fn algorithm_of(algorithm: PublicKeyAlgorithm) -> Algorithm {
    match algorithm {
        PublicKeyAlgorithm::RS256 => Algorithm::RS256,
        PublicKeyAlgorithm::ES256 => Algorithm::ES256,
        PublicKeyAlgorithm::EdDSA => Algorithm::EdDSA,
    }
}

/// RSA keys verify RS256, P-256 keys ES256, Ed25519 keys EdDSA; anything else is refused.
fn load_jwks(path: &std::path::Path) -> Result<Vec<Key>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let set: JwkSet =
        serde_json::from_str(&text).map_err(|e| format!("not a JWKS document: {e}"))?;
    set.keys
        .iter()
        .enumerate()
        .map(|(i, jwk)| {
            let algorithm = match (&jwk.algorithm, jwk.common.key_algorithm) {
                (AlgorithmParameters::RSA(_), None | Some(KeyAlgorithm::RS256)) => Algorithm::RS256,
                (AlgorithmParameters::EllipticCurve(p), None | Some(KeyAlgorithm::ES256))
                    if p.curve == EllipticCurve::P256 =>
                {
                    Algorithm::ES256
                }
                (AlgorithmParameters::OctetKeyPair(p), None | Some(KeyAlgorithm::EdDSA))
                    if p.curve == EllipticCurve::Ed25519 =>
                {
                    Algorithm::EdDSA
                }
                _ => {
                    return Err(format!(
                        "key #{}: only RS256, ES256 (P-256) and EdDSA (Ed25519) keys are accepted",
                        i + 1
                    ));
                }
            };
            let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("key #{}: {e}", i + 1))?;
            Ok(Key {
                algorithm,
                kid: jwk.common.key_id.clone(),
                key,
            })
        })
        .collect()
}

/// What `lethe token` puts in a development token.
#[derive(Debug, Clone, Serialize)]
struct MintedClaims<'a> {
    iss: &'a str,
    aud: &'a str,
    iat: u64,
    #[serde(flatten)]
    claims: &'a Claims,
}

/// Signs `claims` with the development HS256 secret.
pub fn mint_hs256(secret: &[u8], issuer: &str, claims: &Claims) -> Result<String, String> {
    let minted = MintedClaims {
        iss: issuer,
        aud: AUDIENCE,
        iat: jsonwebtoken::get_current_timestamp(),
        claims,
    };
    let key = EncodingKey::from_secret(secret).map_err(|e| e.to_string())?;
    encode(&Header::new(Algorithm::HS256), &minted, &key).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
