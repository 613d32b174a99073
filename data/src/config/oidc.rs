//! `[control_plane.oidc]`: people sign in to the console through the organisation's OpenID
//! provider, and take their roles from its groups.

use serde::Deserialize;

use super::values::Secret;

/// The console's OpenID Connect client (authorization code flow, PKCE, confidential client).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcConfig {
    /// The issuer's URL: its metadata is read from `<issuer>/.well-known/openid-configuration`.
    pub issuer: String,
    /// What the sign-in page calls it ("Sign in with <name>").
    #[serde(default = "default_name")]
    pub name: String,
    pub client_id: String,
    pub client_secret: Secret,
    /// Where the provider sends people back: Lethe's `/console/oidc/callback`, as registered.
    pub redirect_url: String,
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
    /// The ID token's claim that lists the person's groups.
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
    /// Which groups give which role in which tenant; a person in none is refused.
    #[serde(default)]
    pub roles: Vec<GroupRole>,
    /// The `acr` that shows a second factor at this provider, asked for (`acr_values`) when a
    /// step needs one; without it, an `amr` of `mfa`, `otp` or `hwk` shows one.
    #[serde(default)]
    pub mfa_acr: Option<String>,
}

/// `[[control_plane.oidc.roles]]`: members of `group` are `role` in `tenant`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupRole {
    pub group: String,
    /// `compliance` or `admin`: a person signs in to the console, never as an agent.
    pub role: String,
    pub tenant: String,
}

/// The path of the callback every `redirect_url` must end with.
pub const CALLBACK_PATH: &str = "/console/oidc/callback";

fn default_name() -> String {
    "single sign-on".to_owned()
}

fn default_scopes() -> Vec<String> {
    ["openid", "profile", "email"].map(str::to_owned).to_vec()
}

fn default_groups_claim() -> String {
    "groups".to_owned()
}

/// Whether `url` is `https://`, or `http://` to this machine (a provider run for tests).
pub(super) fn secure_or_local(url: &str) -> bool {
    let local = [
        "http://127.0.0.1:",
        "http://127.0.0.1/",
        "http://localhost:",
        "http://localhost/",
        "http://[::1]:",
    ];
    url.starts_with("https://") || local.iter().any(|prefix| url.starts_with(prefix))
}

impl OidcConfig {
    pub(super) fn problems(&self) -> Vec<String> {
        let at = "control_plane.oidc";
        let mut problems = Vec::new();
        if !secure_or_local(&self.issuer) || self.issuer.contains(['?', '#']) {
            problems.push(format!(
                "{at}.issuer: an https:// URL without query or fragment (http:// only to this machine)"
            ));
        }
        if !secure_or_local(&self.redirect_url) || !self.redirect_url.ends_with(CALLBACK_PATH) {
            problems.push(format!(
                "{at}.redirect_url: an https:// URL (http:// only to this machine) ending in {CALLBACK_PATH}"
            ));
        }
        if self.client_id.trim().is_empty() {
            problems.push(format!("{at}.client_id: must not be empty"));
        }
        if !self.scopes.iter().any(|s| s == "openid") {
            problems.push(format!("{at}.scopes: must include openid"));
        }
        if self
            .scopes
            .iter()
            .any(|s| s.is_empty() || s.contains(char::is_whitespace))
        {
            problems.push(format!("{at}.scopes: one scope per entry, without spaces"));
        }
        if self.groups_claim.trim().is_empty() {
            problems.push(format!("{at}.groups_claim: must not be empty"));
        }
        if self.roles.is_empty() {
            problems.push(format!(
                "{at}.roles: at least one [[{at}.roles]] (group, role, tenant); nobody could sign in"
            ));
        }
        for (i, mapping) in self.roles.iter().enumerate() {
            if !matches!(mapping.role.as_str(), "compliance" | "admin") {
                problems.push(format!(
                    "{at}.roles[{i}].role: compliance or admin, not {:?}",
                    mapping.role
                ));
            }
            if mapping.group.is_empty() || mapping.tenant.is_empty() {
                problems.push(format!(
                    "{at}.roles[{i}]: group and tenant must not be empty"
                ));
            }
        }
        problems
    }
}
