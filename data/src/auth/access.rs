//! Access tokens the organisation's OpenID provider issues for Lethe (`[auth.oidc]`), and the
//! choice, per token, between them and Lethe's own keys.
//!
//! A provider's token is verified by the provider's keys only (public-key algorithms, the key its
//! `kid` names), for the configured `aud`, within a bounded leeway on `exp` and `nbf`; its caller
//! acts as `<issuer>#<sub>`, the same person the console's sign-in makes, with the role and
//! tenant of their groups (the console's mapping) or of the claims the provider puts app roles in.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde_json::Value;

use super::issuer::Issuer;
use super::oidc::{Expected, OidcError, display, groups, roles, second_factor, verified_claims};
use super::{AuthError, Claims, Role, Verifier, revocable_id};
use crate::config::{AccessTokenConfig, GroupRole, OidcConfig};

/// Where a provider's token says who the caller is and may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolesFrom {
    /// The token's groups, mapped as the console maps them (compliance or admin).
    Groups {
        claim: String,
        mapping: Vec<GroupRole>,
    },
    /// Claims naming the tenant and the role (app roles).
    Claims { tenant: String, role: String },
}

/// How a provider's verified claims become Lethe's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    pub issuer: String,
    pub roles: RolesFrom,
    /// The `acr` that shows a second factor at this provider.
    pub mfa_acr: Option<String>,
}

/// The longest `sub` taken from a provider (Entra's and Okta's are well under it).
const MAX_SUBJECT_BYTES: usize = 255;

impl Reading {
    /// Lethe's claims of a provider's verified access token, or why it gives none.
    pub fn claims(&self, token: &Value) -> Result<Claims, AuthError> {
        let refused = |why: &str| AuthError::ProviderToken(why.to_owned());
        if token.get("nonce").is_some() {
            return Err(refused(
                "it carries a nonce: an ID token is no access token",
            ));
        }
        // In its one spelling, as Lethe's own tokens' actors: `<issuer>#<sub>` names one person
        // in the audit log, not one that merely looks like another.
        let subject = token["sub"]
            .as_str()
            .filter(|s| s.len() <= MAX_SUBJECT_BYTES)
            .filter(|s| lethe_policy::names::canonical(s, false).is_ok_and(|c| c == *s))
            .ok_or_else(|| refused("its sub is missing, too long, or not in one spelling"))?;
        let (tenant, role) = self.role(token)?;
        let canonical = lethe_policy::names::canonical_key(&tenant, false);
        if canonical.as_deref() != Ok(tenant.as_str()) {
            return Err(refused("its tenant is not a tenant's canonical name"));
        }
        Ok(Claims {
            sub: format!("{}#{subject}", self.issuer),
            tenant,
            role,
            subject: None,
            exp: token["exp"].as_u64().ok_or_else(|| refused("no exp"))?,
            jti: match &token["jti"] {
                Value::Null => None,
                Value::String(jti) if revocable_id(jti) => Some(jti.clone()),
                // One that could not be revoked as sent is refused, as in Lethe's own tokens.
                _ => return Err(refused("its jti cannot be revoked as sent")),
            },
            name: display(token),
            second_factor: second_factor(token, self.mfa_acr.as_deref()),
        })
    }

    /// The tenant and role the token gives: an admin role wherever one is given, else the one
    /// tenant's; roles in several tenants are refused (an access token acts in one).
    fn role(&self, token: &Value) -> Result<(String, Role), AuthError> {
        let no_role = |why: String| AuthError::NoRole(why);
        match &self.roles {
            RolesFrom::Groups { claim, mapping } => {
                let granted = roles(mapping, &groups(token, claim));
                if let Some(admin) = granted.iter().find(|(_, role)| *role == Role::Admin) {
                    return Ok(admin.clone());
                }
                match &granted[..] {
                    [one] => Ok(one.clone()),
                    [] => Err(no_role("none of its groups is mapped to a role".into())),
                    several => Err(no_role(format!(
                        "its groups give roles in {} tenants; an access token acts in one",
                        several.len()
                    ))),
                }
            }
            RolesFrom::Claims { tenant, role } => {
                let tenant = token[tenant.as_str()]
                    .as_str()
                    .ok_or_else(|| no_role(format!("no {tenant} claim names its tenant")))?;
                let named: Vec<&str> = match &token[role.as_str()] {
                    Value::String(one) => vec![one.as_str()],
                    Value::Array(list) => list.iter().filter_map(Value::as_str).collect(),
                    _ => Vec::new(),
                };
                let mut roles: Vec<Role> = named.iter().filter_map(|r| role_named(r)).collect();
                roles.sort_by_key(|r| *r as u8);
                roles.dedup();
                match roles[..] {
                    [one] => Ok((tenant.to_owned(), one)),
                    [] => Err(no_role(format!("its {role} claim names no Lethe role"))),
                    _ => Err(no_role(format!(
                        "its {role} claim names several Lethe roles"
                    ))),
                }
            }
        }
    }
}

fn role_named(name: &str) -> Option<Role> {
    match name {
        "agent" => Some(Role::Agent),
        "compliance" => Some(Role::Compliance),
        "admin" => Some(Role::Admin),
        _ => None,
    }
}

/// The provider's access tokens for Lethe.
pub struct AccessTokens {
    issuer: Issuer,
    audience: String,
    leeway: u64,
    reading: Reading,
}

impl AccessTokens {
    /// The access tokens of `config`, their roles mapped by the console's `console` mapping
    /// where they come from groups; nothing is read from the provider yet.
    pub fn new(
        config: &AccessTokenConfig,
        console: Option<&OidcConfig>,
        leeway: u64,
        tls: &rustls::ClientConfig,
    ) -> Self {
        let roles = match (&config.tenant_claim, &config.role_claim, console) {
            (Some(tenant), Some(role), _) => RolesFrom::Claims {
                tenant: tenant.clone(),
                role: role.clone(),
            },
            // The configuration is checked to have the console's mapping otherwise.
            (_, _, console) => RolesFrom::Groups {
                claim: console.map_or_else(|| "groups".to_owned(), |c| c.groups_claim.clone()),
                mapping: console.map(|c| c.roles.clone()).unwrap_or_default(),
            },
        };
        AccessTokens {
            issuer: Issuer::new(&config.issuer, tls),
            audience: config.audience.clone(),
            leeway,
            reading: Reading {
                issuer: config.issuer.clone(),
                roles,
                mfa_acr: console.and_then(|c| c.mfa_acr.clone()),
            },
        }
    }

    pub fn issuer(&self) -> &str {
        self.issuer.url()
    }

    pub async fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        let key = self.issuer.key_of(token).await.map_err(provider_error)?;
        let expected = Expected {
            issuer: self.issuer.url(),
            audience: &self.audience,
            to_client: false,
        };
        let required = ["exp", "iss", "aud", "sub"];
        let claims = verified_claims(token, &key, &expected, self.leeway, &required)
            .map_err(provider_error)?;
        self.reading.claims(&claims)
    }
}

fn provider_error(e: OidcError) -> AuthError {
    match e {
        OidcError::Unavailable(why) => AuthError::ProviderUnavailable(why),
        OidcError::Refused(why) | OidcError::Invalid(why) => AuthError::ProviderToken(why),
    }
}

/// Every token a plane takes: Lethe's own (development or deployment keys) and, where
/// configured, the organisation's provider's, told apart by the `iss` they claim (each then
/// verified by its own keys only).
#[derive(Clone)]
pub struct Tokens {
    lethe: Arc<Verifier>,
    provider: Option<Arc<AccessTokens>>,
    /// The issuers whose people act only through them: a Lethe token naming one of their people
    /// (`<issuer>#...`) is refused.
    people: Vec<String>,
}

impl Tokens {
    pub fn new(
        lethe: Arc<Verifier>,
        provider: Option<Arc<AccessTokens>>,
        people: Vec<String>,
    ) -> Self {
        Tokens {
            lethe,
            provider,
            people,
        }
    }

    /// Lethe's own tokens only.
    pub fn lethe(lethe: Arc<Verifier>) -> Self {
        Tokens::new(lethe, None, Vec::new())
    }

    pub async fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        if let Some(provider) = &self.provider
            && claimed_issuer(token).as_deref() == Some(provider.issuer())
        {
            return provider.verify(token).await;
        }
        let mut claims = self.lethe.verify(token)?;
        // Only the provider vouches for a person: Lethe's tokens neither show a second factor
        // nor carry a person's name, and cannot act as one of the provider's people.
        claims.second_factor = false;
        claims.name = None;
        if self
            .people
            .iter()
            .any(|issuer| claims.sub.starts_with(&format!("{issuer}#")))
        {
            return Err(AuthError::PersonOfProvider);
        }
        Ok(claims)
    }
}

/// The `iss` a JWT claims, unverified: it only chooses whose keys verify it.
fn claimed_issuer(token: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Issued {
        iss: Option<String>,
    }
    let payload = token.split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload).ok()?;
    serde_json::from_slice::<Issued>(&bytes).ok()?.iss
}

#[cfg(test)]
mod tests;
