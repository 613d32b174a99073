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
    /// Tolerated clock skew when checking `exp` (and `nbf`), at most five minutes.
    pub leeway_seconds: u64,
    /// The organisation's OpenID provider's access tokens, taken beside Lethe's own.
    pub oidc: Option<AccessTokenConfig>,
}

/// `[auth.oidc]`: the control plane (and, with `data_plane`, the data plane) takes access tokens
/// the organisation's OpenID provider issues for Lethe, so a person acts through the API and the
/// CLI as the same `<issuer>#<sub>` they are in the console.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessTokenConfig {
    /// The provider's issuer URL (keys from its discovery document's `jwks_uri`).
    pub issuer: String,
    /// The `aud` the provider puts in tokens for Lethe (an API's identifier, never the
    /// console's client id: an ID token is no access token).
    pub audience: String,
    /// Whether the data plane takes them too (service accounts with `role_claim` = agent).
    #[serde(default)]
    pub data_plane: bool,
    /// For providers that issue app roles: the claims naming the caller's tenant and role
    /// (`agent`, `compliance` or `admin`). Without them, the groups of the token map to roles by
    /// `[[control_plane.oidc.roles]]`, as for the console.
    #[serde(default)]
    pub tenant_claim: Option<String>,
    #[serde(default)]
    pub role_claim: Option<String>,
    /// What `lethe login` signs in as: a public client registered at the provider for the CLI
    /// (device authorization grant, or a code flow to a loopback redirect).
    #[serde(default)]
    pub cli_client_id: Option<String>,
    /// The scopes `lethe login` asks for (with `offline_access` a refresh token keeps the CLI
    /// signed in).
    #[serde(default = "default_cli_scopes")]
    pub cli_scopes: Vec<String>,
    /// An RFC 8707 resource indicator `lethe login` sends, for providers that take one.
    #[serde(default)]
    pub resource: Option<String>,
}

fn default_cli_scopes() -> Vec<String> {
    ["openid", "profile", "email", "offline_access"]
        .map(str::to_owned)
        .to_vec()
}

/// The clock skew a token's times may have, at most.
pub const MAX_LEEWAY_SECONDS: u64 = 300;

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            issuer: "lethe".to_owned(),
            hs256_secret: None,
            keys: Vec::new(),
            jwks: None,
            leeway_seconds: 30,
            oidc: None,
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
        if self.leeway_seconds > MAX_LEEWAY_SECONDS {
            problems.push(format!(
                "auth.leeway_seconds: at most {MAX_LEEWAY_SECONDS} (a token's times are checked, not waived)"
            ));
        }
        if let Some(oidc) = &self.oidc {
            problems.extend(oidc.problems());
        }
        problems
    }
}

impl AccessTokenConfig {
    fn problems(&self) -> Vec<String> {
        let at = "auth.oidc";
        let mut problems = Vec::new();
        if !super::oidc::secure_or_local(&self.issuer) || self.issuer.contains(['?', '#']) {
            problems.push(format!(
                "{at}.issuer: an https:// URL without query or fragment (http:// only to this machine)"
            ));
        }
        if self.audience.trim().is_empty() {
            problems.push(format!("{at}.audience: must not be empty"));
        }
        if self.tenant_claim.is_some() != self.role_claim.is_some() {
            problems.push(format!(
                "{at}: tenant_claim and role_claim go together (or neither, for the group mapping)"
            ));
        }
        for (name, claim) in [
            ("tenant_claim", &self.tenant_claim),
            ("role_claim", &self.role_claim),
        ] {
            if claim.as_deref().is_some_and(|c| c.trim().is_empty()) {
                problems.push(format!("{at}.{name}: must not be empty"));
            }
        }
        if self.data_plane && self.role_claim.is_none() {
            problems.push(format!(
                "{at}.data_plane: service accounts take the agent role from role_claim and tenant_claim; the group mapping gives people compliance and admin only"
            ));
        }
        if self
            .cli_client_id
            .as_deref()
            .is_some_and(|c| c.trim().is_empty())
        {
            problems.push(format!("{at}.cli_client_id: must not be empty"));
        }
        if !self.cli_scopes.iter().any(|s| s == "openid")
            || self
                .cli_scopes
                .iter()
                .any(|s| s.is_empty() || s.contains(char::is_whitespace))
        {
            problems.push(format!(
                "{at}.cli_scopes: one scope per entry, without spaces, including openid"
            ));
        }
        problems
    }
}
