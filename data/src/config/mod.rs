//! Typed configuration. Unknown keys are refused; validation reports every problem at once.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;

mod auth;
mod erasure;
mod governed;
mod lineage;
mod oidc;
mod planes;
mod routes;
mod values;

pub use auth::{
    AccessTokenConfig, AuditConfig, AuthConfig, MAX_LEEWAY_SECONDS, PublicKeyAlgorithm,
    PublicKeyConfig,
};
pub use erasure::{BackupRetention, ErasureConfig, ErasureTargetConfig};
pub use governed::{GovernedDatabase, GovernedTable, sql_identifier};
pub use lineage::{CrossSubject, LineageConfig};
pub use oidc::{CALLBACK_PATH, GroupRole, OidcConfig};
pub use planes::{
    AdminConfig, ControlPlaneConfig, DataPlaneConfig, LogConfig, LogFormat, StateConfig, TlsConfig,
};
pub use routes::{CredentialConfig, RouteConfig, route_target, store_address, upstream_env_var};
pub use values::{ConfigDuration, Secret, parse_duration, read_all};

use erasure::erasure_section;

/// The default configuration, also the built-in one when no file is found at the default path.
pub const DEFAULT_CONFIG_PATH: &str = "config/lethe.toml";
/// The configuration `config/lethe.toml` ships with, used when no file is given or found.
pub const BUILT_IN: &str = include_str!("../../../config/lethe.toml");
/// The whole configuration. Parsed section by section (see [`Config::parse`]).
#[derive(Debug, Clone)]
pub struct Config {
    pub data_plane: DataPlaneConfig,
    pub control_plane: ControlPlaneConfig,
    pub admin: AdminConfig,
    pub log: LogConfig,
    pub state: StateConfig,
    pub auth: AuthConfig,
    pub audit: AuditConfig,
    pub erasure: ErasureConfig,
    pub lineage: LineageConfig,
    pub routes: Vec<RouteConfig>,
    /// PostgreSQL databases whose memory tables Lethe governs in the database itself.
    pub postgres: Vec<GovernedDatabase>,
    /// What is particular to a tenant (`[tenants.<name>]`).
    pub tenants: std::collections::BTreeMap<String, TenantConfig>,
}

/// A tenant's own settings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// `case_insensitive` (e-mail addresses): subject keys that differ only in case are one
    /// subject, kept in lower case.
    #[serde(default)]
    pub subject_keys: SubjectKeys,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubjectKeys {
    #[default]
    CaseSensitive,
    CaseInsensitive,
}

impl Config {
    /// Which tenants' subject keys are case-insensitive.
    pub fn folding(&self) -> lethe_policy::names::Folding {
        lethe_policy::names::Folding::new(
            self.tenants
                .iter()
                .filter(|(_, t)| t.subject_keys == SubjectKeys::CaseInsensitive)
                .map(|(name, _)| name.clone()),
        )
    }
}

impl Config {
    /// The stores an erasure purges: one target per route, per `[[erasure.<kind>]]` table and
    /// per governed database (`postgres:<name>`).
    pub fn erasure_targets(&self) -> Vec<String> {
        let routes = self.routes.iter().map(RouteConfig::erasure_target);
        let configured = self.erasure.targets.iter().map(ErasureTargetConfig::target);
        let governed = self.postgres.iter().map(|g| format!("postgres:{}", g.name));
        routes.chain(configured).chain(governed).collect()
    }
}

/// Deployment overrides from flags and environment variables; they win over the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub data_listen: Option<SocketAddr>,
    pub control_listen: Option<SocketAddr>,
    pub admin_listen: Option<SocketAddr>,
    pub state_url: Option<String>,
}

/// Every problem found, each on its own line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .problems.join("\n"))]
pub struct ConfigErrors {
    pub problems: Vec<String>,
}

impl Config {
    /// Reads `path`, or the default path, or, when the default path does not exist, the built-in
    /// default; then applies the overrides and `LETHE_UPSTREAM_<NAME>`, and validates.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigErrors> {
        let text = match path {
            Some(path) => read(path)?,
            None if Path::new(DEFAULT_CONFIG_PATH).exists() => {
                read(Path::new(DEFAULT_CONFIG_PATH))?
            }
            None => BUILT_IN.to_owned(),
        };
        let (mut config, problems) = Config::parse(&text)?;
        config.apply(overrides, |name| std::env::var(name).ok());
        config.validated(problems)
    }

    /// Parses and validates a configuration text, reporting every problem.
    pub fn check(text: &str) -> Result<Config, ConfigErrors> {
        let (config, problems) = Config::parse(text)?;
        config.validated(problems)
    }

    /// The configuration a text describes and every problem of it (of shape and of meaning),
    /// for callers that check more (each route's store) before reporting them all; fails only
    /// on TOML syntax.
    pub fn checked(text: &str) -> Result<(Config, Vec<String>), ConfigErrors> {
        let (config, mut problems) = Config::parse(text)?;
        problems.extend(config.problems());
        Ok((config, problems))
    }

    /// Adds the problems of meaning to those of shape; a section that could not be read was
    /// replaced by its defaults, so its neighbours are still checked.
    fn validated(self, mut problems: Vec<String>) -> Result<Config, ConfigErrors> {
        problems.extend(self.problems());
        if problems.is_empty() {
            Ok(self)
        } else {
            Err(ConfigErrors { problems })
        }
    }

    /// Deserialises section by section, so that a mistake in one does not hide those in others.
    /// Fails only on TOML syntax; otherwise returns the config and the problems of shape.
    fn parse(text: &str) -> Result<(Config, Vec<String>), ConfigErrors> {
        let mut table: toml::Table = toml::from_str(text).map_err(|e| ConfigErrors {
            problems: vec![e.to_string().trim().to_owned()],
        })?;
        let mut problems = Vec::new();
        fn section<T: serde::de::DeserializeOwned + Default>(
            table: &mut toml::Table,
            key: &str,
            problems: &mut Vec<String>,
        ) -> T {
            match table.remove(key) {
                None => T::default(),
                Some(value) => T::deserialize(value).unwrap_or_else(|e| {
                    problems.push(format!("[{key}]: {}", e.to_string().trim()));
                    T::default()
                }),
            }
        }
        let data_plane = section(&mut table, "data_plane", &mut problems);
        let control_plane = section(&mut table, "control_plane", &mut problems);
        let admin = section(&mut table, "admin", &mut problems);
        let log = section(&mut table, "log", &mut problems);
        let state = section(&mut table, "state", &mut problems);
        let auth = section(&mut table, "auth", &mut problems);
        let audit = section(&mut table, "audit", &mut problems);
        let erasure = match table.remove("erasure") {
            None => ErasureConfig::default(),
            Some(value) => erasure_section(value, &mut problems),
        };
        let lineage = section(&mut table, "lineage", &mut problems);
        let postgres = section(&mut table, "postgres", &mut problems);
        let tenants = section(&mut table, "tenants", &mut problems);
        let mut routes = Vec::new();
        match table.remove("routes") {
            None => {}
            Some(toml::Value::Array(items)) => {
                for (i, item) in items.into_iter().enumerate() {
                    let name = item
                        .get("name")
                        .and_then(toml::Value::as_str)
                        .unwrap_or("?");
                    let at = format!("[[routes]] #{} ({name})", i + 1);
                    match RouteConfig::read(item) {
                        Ok(route) => routes.push(route),
                        Err(found) => {
                            problems.extend(found.into_iter().map(|p| format!("{at}: {p}")))
                        }
                    }
                }
            }
            Some(_) => problems.push("routes: must be an array of tables ([[routes]])".to_owned()),
        }
        for key in table.keys() {
            problems.push(format!(
                "unknown section `{key}` (expected data_plane, control_plane, admin, log, state, auth, audit, erasure, lineage, routes, postgres or tenants)"
            ));
        }
        Ok((
            Config {
                data_plane,
                control_plane,
                admin,
                log,
                state,
                auth,
                audit,
                erasure,
                lineage,
                routes,
                postgres,
                tenants,
            },
            problems,
        ))
    }

    fn apply(&mut self, overrides: &Overrides, env: impl Fn(&str) -> Option<String>) {
        if let Some(addr) = overrides.data_listen {
            self.data_plane.listen = addr;
        }
        if let Some(addr) = overrides.control_listen {
            self.control_plane.listen = addr;
        }
        if let Some(addr) = overrides.admin_listen {
            self.admin.listen = addr;
        }
        if let Some(url) = &overrides.state_url {
            self.state.url = url.clone();
        }
        for route in &mut self.routes {
            if let Some(url) = env(&upstream_env_var(&route.name)) {
                route.upstream = url;
            }
        }
    }

    /// Every problem of every section, then those between sections.
    pub(super) fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for database in &self.postgres {
            problems.extend(database.problems());
        }
        problems.extend(self.lineage.problems());
        problems.extend(self.data_plane.problems());
        problems.extend(self.control_plane.problems());
        if self.data_plane.listen == self.control_plane.listen {
            problems.push(format!(
                "data_plane.listen and control_plane.listen are both {}",
                self.data_plane.listen
            ));
        }
        for route in &self.routes {
            let taken = [
                ("data_plane.listen", self.data_plane.listen),
                ("control_plane.listen", self.control_plane.listen),
            ];
            if let Some((key, at)) = taken.iter().find(|(_, at)| route.listen == Some(*at)) {
                problems.push(format!("route {}: listen {at} is {key} too", route.name));
            }
        }
        problems.extend(self.state.problems());
        problems.extend(self.erasure.problems());
        let targets = self.erasure_targets();
        let mut seen = BTreeSet::new();
        for target in &targets {
            if !seen.insert(target) {
                problems.push(format!(
                    "erasure target {target} is named twice (by [[erasure.*]], [[routes]] or [[postgres]])"
                ));
            }
        }
        for backup in &self.erasure.backups {
            if !targets.contains(&backup.target) {
                problems.push(format!(
                    "erasure.backups: {} is not an erasure target (targets: {})",
                    backup.target,
                    targets.join(", ")
                ));
            }
        }
        problems.extend(self.auth.problems());
        problems.extend(self.access_token_problems());
        problems.extend(RouteConfig::problems_of(&self.routes));
        for tenant in self.tenants.keys() {
            if lethe_policy::names::canonical_key(tenant, false).as_deref() != Ok(tenant.as_str()) {
                problems.push(format!(
                    "[tenants.{tenant:?}]: a tenant's name must be its canonical form (NFC, no invisible characters, no edge whitespace, no '/')"
                ));
            }
        }
        problems
    }
}

impl Config {
    /// `[auth.oidc]` against the console's provider: roles from groups need its mapping, and
    /// an ID token for the console must not pass as an access token.
    fn access_token_problems(&self) -> Vec<String> {
        let Some(access) = &self.auth.oidc else {
            return Vec::new();
        };
        let console = self.control_plane.oidc.as_ref();
        let mut problems = Vec::new();
        if access.role_claim.is_none() && console.is_none_or(|c| c.issuer != access.issuer) {
            problems.push(
                "auth.oidc: without role_claim and tenant_claim, roles come from [[control_plane.oidc.roles]], which needs [control_plane.oidc] with the same issuer".to_owned(),
            );
        }
        let console_client = console.filter(|c| c.issuer == access.issuer);
        let clients = [
            console_client.map(|c| c.client_id.as_str()),
            access.cli_client_id.as_deref(),
        ];
        if clients.contains(&Some(access.audience.as_str())) {
            problems.push(
                "auth.oidc.audience: must not be the console's or the CLI's client id (their ID tokens would pass as access tokens)".to_owned(),
            );
        }
        problems
    }
}

fn read(path: &Path) -> Result<String, ConfigErrors> {
    std::fs::read_to_string(path).map_err(|e| ConfigErrors {
        problems: vec![format!("cannot read {}: {e}", path.display())],
    })
}

#[cfg(test)]
mod tests;
