//! `[auth]` (who signed the tokens) and `[audit]` (the chain's key and signing).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::values::{ConfigDuration, Secret};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub issuer: String,
    /// Development: the HS256 secret. When neither this nor public keys are set, Lethe uses
    /// `LETHE_JWT_SECRET`, or generates a secret and keeps it in the state store.
    pub hs256_secret: Option<Secret>,
    /// Production: public keys (RS256, ES256, EdDSA) in PEM.
    pub keys: Vec<PublicKeyConfig>,
    /// Production: a JWKS file.
    pub jwks: Option<PathBuf>,
    /// Tolerated clock skew when checking `exp`.
    pub leeway_seconds: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            issuer: "lethe".to_owned(),
            hs256_secret: None,
            keys: Vec::new(),
            jwks: None,
            leeway_seconds: 30,
        }
    }
}

impl AuthConfig {
    pub fn uses_public_keys(&self) -> bool {
        !self.keys.is_empty() || self.jwks.is_some()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum PublicKeyAlgorithm {
    RS256,
    ES256,
    EdDSA,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublicKeyConfig {
    pub algorithm: PublicKeyAlgorithm,
    pub pem: Secret,
    /// When set, only tokens whose header names this `kid` are checked against this key.
    pub kid: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// The key of `subject_ref = HMAC(key, tenant/subject)` and of the chain's links. When unset:
    /// `LETHE_AUDIT_KEY`, or a key generated and kept in the state store (then whoever can write
    /// the state store can read it too).
    pub hmac_key: Option<Secret>,
    /// How often the chain's head is signed and kept (besides at every certificate).
    pub sign_interval: ConfigDuration,
}

impl Default for AuditConfig {
    fn default() -> Self {
        AuditConfig {
            hmac_key: None,
            sign_interval: ConfigDuration(Duration::from_secs(3600)),
        }
    }
}

impl AuthConfig {
    pub(super) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.issuer.trim().is_empty() {
            problems.push("auth.issuer: must not be empty".to_owned());
        }
        if self.hs256_secret.is_some() && self.uses_public_keys() {
            problems.push(
                "auth: hs256_secret is for development and cannot be combined with public keys (keys, jwks)".to_owned(),
            );
        }
        problems
    }
}
