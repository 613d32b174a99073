//! `[data_plane]`, `[control_plane]` and `[state]`: listeners, their limits, and the state store.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::oidc::OidcConfig;
use super::values::{ConfigDuration, Secret};

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataPlaneConfig {
    pub listen: SocketAddr,
    /// Certificates (PEM) trusted for `https://` upstreams besides Mozilla's roots: a private CA.
    pub upstream_ca: Option<Secret>,
    pub max_body_bytes: u64,
    pub request_timeout: ConfigDuration,
    pub max_concurrency: u32,
    /// The most connections one listener (the data plane's, each route's own) holds at once.
    pub max_connections: u32,
    /// The most of them one client address holds.
    pub max_connections_per_address: u32,
    /// A connection of a route with its own listener (Redis) must authenticate within this.
    pub auth_timeout: ConfigDuration,
    /// A connection waiting this long for its next request or command is closed (not while a
    /// subscription or a waiting command of its runs).
    pub idle_timeout: ConfigDuration,
    pub tls: Option<TlsConfig>,
}

impl Default for DataPlaneConfig {
    fn default() -> Self {
        DataPlaneConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7400)),
            upstream_ca: None,
            max_body_bytes: 10 * 1024 * 1024,
            request_timeout: ConfigDuration(Duration::from_secs(30)),
            max_concurrency: 1024,
            max_connections: 4096,
            max_connections_per_address: 256,
            auth_timeout: ConfigDuration(Duration::from_secs(10)),
            idle_timeout: ConfigDuration(Duration::from_secs(300)),
            tls: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControlPlaneConfig {
    pub listen: SocketAddr,
    pub max_body_bytes: u64,
    /// A console session unused this long ends.
    pub session_idle: ConfigDuration,
    /// A console session ends this long after sign-in at the latest (or when its token expires).
    pub session_max: ConfigDuration,
    /// Sign-in through the organisation's OpenID provider.
    pub oidc: Option<OidcConfig>,
    /// Whether the console's sign-in page also takes a pasted token: by default only when no
    /// OpenID provider is configured.
    pub allow_token_sign_in: Option<bool>,
    pub tls: Option<TlsConfig>,
}

impl Default for ControlPlaneConfig {
    fn default() -> Self {
        ControlPlaneConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7401)),
            max_body_bytes: 1024 * 1024,
            session_idle: ConfigDuration(Duration::from_secs(30 * 60)),
            session_max: ConfigDuration(Duration::from_secs(12 * 3600)),
            oidc: None,
            allow_token_sign_in: None,
            tls: None,
        }
    }
}

/// `[<listener>.tls]`: the listener speaks TLS 1.2 or 1.3 only, with this certificate chain and
/// key (PEM files, read again when they change) and, with `client_ca`, takes only clients whose
/// certificate that CA signed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    #[serde(default)]
    pub client_ca: Option<PathBuf>,
}

/// `[log]`: how log lines are written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `json` (one object per line) or `text`; by default JSON when the output is no terminal.
    pub format: Option<LogFormat>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Json,
    Text,
}

/// `[admin]`: the listener of probes and Prometheus (`/live`, `/ready`, `/metrics`), which
/// serves nothing that reads or changes data, so it can be opened to the kubelet and the scraper
/// without opening the console.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    pub tls: Option<TlsConfig>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7402)),
            tls: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateConfig {
    /// `sqlite://PATH` (relative to the working directory) or `postgres://...`.
    pub url: String,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            url: "sqlite://.lethe/state.db".to_owned(),
        }
    }
}

impl DataPlaneConfig {
    pub(super) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.max_body_bytes == 0 {
            problems.push("data_plane.max_body_bytes: must be greater than zero".to_owned());
        }
        for (key, value) in [
            ("max_concurrency", self.max_concurrency),
            ("max_connections", self.max_connections),
            (
                "max_connections_per_address",
                self.max_connections_per_address,
            ),
        ] {
            if value == 0 {
                problems.push(format!("data_plane.{key}: must be greater than zero"));
            }
        }
        if self.max_connections_per_address > self.max_connections {
            problems
                .push("data_plane.max_connections_per_address: at most max_connections".to_owned());
        }
        for (key, value) in [
            ("auth_timeout", self.auth_timeout),
            ("idle_timeout", self.idle_timeout),
        ] {
            if value.0 < Duration::from_secs(1) {
                problems.push(format!("data_plane.{key}: at least 1s"));
            }
        }
        problems
    }
}

impl ControlPlaneConfig {
    /// Whether the console takes a pasted token (see [`ControlPlaneConfig::allow_token_sign_in`]).
    pub fn token_sign_in(&self) -> bool {
        self.allow_token_sign_in.unwrap_or(self.oidc.is_none())
    }

    pub(super) fn problems(&self) -> Vec<String> {
        let mut problems = self
            .oidc
            .as_ref()
            .map(OidcConfig::problems)
            .unwrap_or_default();
        if self.oidc.is_none() && self.allow_token_sign_in == Some(false) {
            problems.push(
                "control_plane.allow_token_sign_in: false leaves no way into the console without [control_plane.oidc]".to_owned(),
            );
        }
        if self.max_body_bytes == 0 {
            problems.push("control_plane.max_body_bytes: must be greater than zero".to_owned());
        }
        if self.session_idle.0 < Duration::from_secs(60) {
            problems.push("control_plane.session_idle: at least 1m".to_owned());
        }
        let max = self.session_max.0;
        if max < self.session_idle.0 || max > Duration::from_secs(30 * 24 * 3600) {
            problems.push("control_plane.session_max: session_idle to 30 days".to_owned());
        }
        problems
    }
}

impl StateConfig {
    pub(super) fn problems(&self) -> Vec<String> {
        let url = &self.url;
        match crate::state::StateKind::of(url) {
            Some(_) => Vec::new(),
            None => vec![format!(
                "state.url: {url:?} is neither sqlite://PATH nor postgres://..."
            )],
        }
    }
}
