//! Typed configuration. Unknown keys are refused; validation reports every problem at once.

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// The default configuration, also the built-in one when no file is found at the default path.
pub const DEFAULT_CONFIG_PATH: &str = "config/lethe.toml";
const BUILT_IN: &str = include_str!("../../config/lethe.toml");

/// The whole configuration. Parsed section by section (see [`Config::parse`]).
#[derive(Debug, Clone)]
pub struct Config {
    pub data_plane: DataPlaneConfig,
    pub control_plane: ControlPlaneConfig,
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

/// A PostgreSQL database of the agent app whose tables Lethe governs in the database: it
/// installs row-level security and stamping triggers (schema `lethe`) and keeps the policy they
/// read up to date, so that every client and every query shape is governed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GovernedDatabase {
    pub name: String,
    /// Lethe's own connection: the governed tables' owner, or a superuser.
    pub url: Secret,
    /// The role agent apps connect as (created by Lethe, never `BYPASSRLS`).
    pub app_role: String,
    /// Roles that see and write only one tenant's rows: tenant -> role.
    #[serde(default)]
    pub tenant_roles: std::collections::BTreeMap<String, String>,
    pub tables: Vec<GovernedTable>,
    /// How long a flip lets the app roles' transactions that began before it (they may still
    /// read or write the subject there) finish before it cancels them. Until they are gone
    /// the request names this database as lagging and is not `suppressed`.
    #[serde(default = "default_flip_grace")]
    pub flip_grace: ConfigDuration,
}

fn default_flip_grace() -> ConfigDuration {
    ConfigDuration(Duration::from_secs(1))
}

/// The longest grace a flip may give: a subject stays readable in open transactions that long.
const MAX_FLIP_GRACE: Duration = Duration::from_secs(60);

/// One governed table: SQL expressions over its row for the tenant, subject, purpose and
/// category each row is about; or, for a table whose rows carry no subject (LangGraph's
/// `checkpoint_blobs`), the governed table that owns each row by `key` (`thread_id`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GovernedTable {
    /// The table, optionally schema-qualified (`public.memories`).
    pub table: String,
    #[serde(default)]
    pub tenant: String,
    #[serde(default)]
    pub subject: String,
    #[serde(default)]
    pub purpose: String,
    #[serde(default)]
    pub category: String,
    /// The governed table whose row owns each of this one's (same `key` values).
    #[serde(default)]
    pub owner: Option<String>,
    /// The columns both tables share that link a row to its owner.
    #[serde(default)]
    pub key: Vec<String>,
}

/// An SQL identifier Lethe writes unquoted: lowercase letters, digits and `_`, not starting
/// with a digit, at most 63 bytes.
pub fn sql_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl GovernedDatabase {
    /// The table that owns a linked table's rows.
    pub fn owner_of(&self, table: &GovernedTable) -> Option<&GovernedTable> {
        let owner = table.owner.as_deref()?;
        self.tables.iter().find(|t| t.table == owner)
    }

    /// Every problem of the database's settings, each prefixed with where it is.
    fn problems(&self) -> Vec<String> {
        let at = format!("[[postgres]] {}", self.name);
        let mut problems = Vec::new();
        if !valid_name(&self.name) {
            problems.push(format!("{at}: name must be letters, digits, '-' or '_'"));
        }
        let mut distinct = BTreeSet::new();
        for role in std::iter::once(&self.app_role).chain(self.tenant_roles.values()) {
            if !distinct.insert(role) {
                problems.push(format!(
                    "{at}: role {role:?} is named twice (each app role serves one tenant, or every one)"
                ));
            }
        }
        for tenant in self.tenant_roles.keys() {
            if lethe_policy::names::canonical_key(tenant, false).as_deref() != Ok(tenant.as_str()) {
                problems.push(format!(
                    "{at}: tenant_roles: {tenant:?} is not a tenant's name"
                ));
            }
        }
        let roles = std::iter::once(&self.app_role).chain(self.tenant_roles.values());
        for role in roles {
            if !sql_identifier(role) || role.starts_with("pg_") {
                problems.push(format!(
                    "{at}: role {role:?} must be a lowercase SQL identifier (letters, digits, _), not pg_*"
                ));
            }
        }
        if self.tables.is_empty() {
            problems.push(format!("{at}: name at least one [[postgres.tables]]"));
        }
        if self.flip_grace.0 > MAX_FLIP_GRACE {
            problems.push(format!(
                "{at}: flip_grace must be at most {}s (the subject stays readable in open transactions that long)",
                MAX_FLIP_GRACE.as_secs()
            ));
        }
        let mut seen = BTreeSet::new();
        for table in &self.tables {
            if !seen.insert(table.table.as_str()) {
                problems.push(format!("{at}: table {} is named twice", table.table));
            }
            let among = &self.tables;
            problems.extend(
                table
                    .problems(among)
                    .into_iter()
                    .map(|p| format!("{at}: {p}")),
            );
        }
        problems
    }
}

impl GovernedTable {
    /// The table's own problems; `tables`: every table of its database (an owner must be one).
    fn problems(&self, tables: &[GovernedTable]) -> Vec<String> {
        let mut problems = Vec::new();
        let parts: Vec<&str> = self.table.split('.').collect();
        if parts.len() > 2
            || !parts.iter().all(|p| sql_identifier(p))
            || (parts.len() == 2 && parts[0] == "lethe")
        {
            problems.push(format!(
                "table {:?} must be [schema.]name, lowercase SQL identifiers, not in schema lethe",
                self.table
            ));
        }
        let scope = [
            ("tenant", &self.tenant),
            ("subject", &self.subject),
            ("purpose", &self.purpose),
            ("category", &self.category),
        ];
        if let Some(owner) = &self.owner {
            if scope.iter().any(|(_, e)| !e.is_empty()) {
                problems.push(format!(
                "table {} takes its scope from {owner}: no tenant, subject, purpose or category of its own",
                self.table
            ));
            }
            if self.key.is_empty() || !self.key.iter().all(|k| sql_identifier(k)) {
                problems.push(format!(
                    "table {} needs key, the columns it shares with {owner} (SQL identifiers)",
                    self.table
                ));
            }
            if !tables
                .iter()
                .any(|t| &t.table == owner && t.owner.is_none())
            {
                problems.push(format!(
                "table {}: owner {owner} must be another governed table with a scope of its own",
                self.table
            ));
            }
            return problems;
        }
        if !self.key.is_empty() {
            problems.push(format!("table {}: key only goes with owner", self.table));
        }
        for (what, expr) in scope {
            // Written into Lethe's policies and triggers: one expression, nothing after it.
            if expr.trim().is_empty()
                || expr.contains(';')
                || expr.contains("--")
                || expr.contains("/*")
                || expr.contains('$')
            {
                problems.push(format!(
                    "table {} {what}: one SQL expression over the row (no ';', comments or '$')",
                    self.table
                ));
            }
        }
        problems
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ErasureConfig {
    /// 1 or 2 approvals, by different actors, before an erasure request is carried out.
    pub approvals_required: usize,
    /// Attempts per store before the request goes to `exception` (and a person looks).
    pub max_attempts: u32,
    /// The wait before the first retry; it doubles with every attempt.
    pub retry_backoff: ConfigDuration,
    /// The Ed25519 seed (32 bytes, hex) certificates are signed with. Unset: generated once and
    /// kept in the state store (`lethe certificate public-key` prints its public half).
    pub signing_key: Option<Secret>,
    /// How long each target's backups are kept: the certificate's final backup expiry.
    pub backups: Vec<BackupRetention>,
    /// The stores only erasure reaches, `[[erasure.<kind>]]` tables (PostgreSQL tables, Redis,
    /// SQLite files, ...): each kind reads its own keys (`stores::TARGET_KINDS`).
    #[serde(skip)]
    pub targets: Vec<ErasureTargetConfig>,
    /// How often the retention sweeper deletes expired (and revoked) items.
    pub sweep_interval: ConfigDuration,
    /// How long after the flip the purge waits, so that writes decided just before it (on any
    /// replica) have landed in their store and are purged with the rest.
    pub settle: ConfigDuration,
    /// How long a claimed purge job is a worker's; renewed while it runs, so a crashed worker's
    /// job is taken over after at most this long.
    pub job_lease: ConfigDuration,
    /// Verification probes built from the subject's known facts (its key and aliases, e.g. an
    /// email address): texts with `{subject}` and optionally `{tenant}`. After the purge, every
    /// Chroma collection is searched for documents containing them; a hit that is the subject's
    /// or has no owner fails verification. LangGraph stores with a search index are searched
    /// semantically with the same queries.
    pub probes: Vec<String>,
    /// The similarity (percent, 0-100) from which a semantic probe hit counts.
    pub probe_min_similarity: u8,
    /// The statutory deadline of a request, in months from its receipt (GDPR art. 12(3): one),
    /// which the console counts down.
    pub deadline_months: u32,
}

/// One `[[erasure.<kind>]]` table: a store only erasure reaches. Its target is `<kind>:<name>`.
#[derive(Debug, Clone, PartialEq)]
pub struct ErasureTargetConfig {
    pub kind: String,
    /// The table's `name` (empty when it has none, which its kind reports).
    pub name: String,
    /// Every key of the table, `name` included: the kind reads them.
    pub settings: toml::Table,
}

impl ErasureTargetConfig {
    pub fn target(&self) -> String {
        format!("{}:{}", self.kind, self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackupRetention {
    /// An erasure target, e.g. `chroma:chroma`.
    pub target: String,
    pub retention: lethe_policy::MaxAge,
}

impl Default for ErasureConfig {
    fn default() -> Self {
        ErasureConfig {
            approvals_required: 1,
            max_attempts: 8,
            retry_backoff: ConfigDuration(Duration::from_secs(1)),
            signing_key: None,
            backups: Vec::new(),
            targets: Vec::new(),
            sweep_interval: ConfigDuration(Duration::from_secs(60)),
            settle: ConfigDuration(Duration::from_secs(1)),
            job_lease: ConfigDuration(Duration::from_secs(60)),
            probes: Vec::new(),
            probe_min_similarity: 40,
            deadline_months: 1,
        }
    }
}

/// Derivative lineage: what traffic derives from what, learnt as it passes (`[lineage]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LineageConfig {
    /// Whether writes and prompts are checked for what they derive from (a trace that read
    /// items, quotes of served or written text, a model's answer). Off: every item is raw, and an
    /// erasure reaches only the subject's own items.
    pub derivatives: bool,
    /// How long what Lethe served or accepted is remembered: a write derives from what its trace
    /// read, or what it quotes, within this window; after a flip, writes that would re-derive
    /// the subject's data are refused for as long.
    pub window: ConfigDuration,
    /// How many consecutive normalised words make a quote (4 to 64); shorter overlaps never
    /// count.
    pub quote_words: usize,
    /// What an erasure does with derivatives stamped to other subjects.
    pub cross_subject: CrossSubject,
    /// The most distinct traces remembered (then the oldest are forgotten first).
    pub max_traces: usize,
    /// The most fingerprints (runs of words) remembered.
    pub max_fingerprints: usize,
    /// The most memory (bytes) both memories together may take.
    pub max_bytes: u64,
}

/// What happens to another subject's item derived from an erased subject's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CrossSubject {
    /// Hidden at the flip, then erased or released by a person; the request completes once all
    /// are decided.
    #[default]
    Review,
    /// Hidden at the flip and erased with the subject's own items.
    Erase,
}

impl Default for LineageConfig {
    fn default() -> Self {
        LineageConfig {
            derivatives: true,
            window: ConfigDuration(Duration::from_secs(15 * 60)),
            quote_words: 12,
            cross_subject: CrossSubject::Review,
            max_traces: 100_000,
            max_fingerprints: 1_000_000,
            max_bytes: 16 * 1024 * 1024,
        }
    }
}

impl LineageConfig {
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let window = self.window.0;
        if window < Duration::from_secs(60) || window > Duration::from_secs(24 * 3600) {
            problems.push("lineage.window: 1m to 24h".to_owned());
        }
        if !(4..=lethe_policy::derivation::MAX_QUOTE_WORDS).contains(&self.quote_words) {
            problems.push(format!(
                "lineage.quote_words: 4 to {} (fewer would make common phrases quotes)",
                lethe_policy::derivation::MAX_QUOTE_WORDS
            ));
        }
        if self.max_traces == 0 || self.max_fingerprints == 0 {
            problems.push(
                "lineage.max_traces and lineage.max_fingerprints: must be greater than zero"
                    .to_owned(),
            );
        }
        if self.max_bytes < 1024 * 1024 {
            problems.push("lineage.max_bytes: at least 1048576 (1 MiB)".to_owned());
        }
        problems
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
}

impl Default for ControlPlaneConfig {
    fn default() -> Self {
        ControlPlaneConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7401)),
            max_body_bytes: 1024 * 1024,
            session_idle: ConfigDuration(Duration::from_secs(30 * 60)),
            session_max: ConfigDuration(Duration::from_secs(12 * 3600)),
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

/// A data-plane route: its common keys, the kind of store behind it (`adapter = "..."`) and that
/// kind's own keys, which `stores::routes` reads into the route's store.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    /// `chroma`, `langgraph`, ...: names the route in logs and in `LETHE_UPSTREAM_<NAME>`.
    pub name: String,
    /// Path prefix on the data plane, e.g. `/chroma`: a store spoken to in HTTP.
    pub prefix: Option<String>,
    /// The route's own listener: a store spoken to in a protocol of its own (Redis).
    pub listen: Option<SocketAddr>,
    pub upstream: String,
    /// The upstream's own credential, sent on every forwarded request.
    pub credential: Option<CredentialConfig>,
    /// How long the upstream may take to answer (a whole answer, or the first byte of a
    /// stream); then `upstream_unavailable`. Erasure connectors use 30 s when it is unset.
    pub timeout: Option<ConfigDuration>,
    /// The purpose and category of requests that name none (`X-Lethe-Purpose`,
    /// `X-Lethe-Category`): for clients that cannot send Lethe's headers.
    pub purpose: Option<String>,
    pub category: Option<String>,
    /// The kind of store behind the route.
    pub adapter: String,
    /// Every key of the route but the common ones: the kind's own settings.
    pub settings: toml::Table,
}

/// The keys every route has, whatever its store.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommonRoute {
    name: String,
    prefix: Option<String>,
    listen: Option<SocketAddr>,
    upstream: String,
    credential: Option<CredentialConfig>,
    timeout: Option<ConfigDuration>,
    purpose: Option<String>,
    category: Option<String>,
}

/// A purpose or category as the control plane takes one: 1 to 200 bytes, no control characters,
/// no `/`.
fn valid_name(value: &str) -> bool {
    !value.trim().is_empty()
        && value.len() <= 200
        && !value.chars().any(|c| c.is_control() || c == '/')
}

impl RouteConfig {
    /// The erasure target that purges the route's store.
    pub fn erasure_target(&self) -> String {
        route_target(&self.adapter, &self.name)
    }

    /// Reads one `[[routes]]` table: the common keys, `adapter`, and the rest kept as the kind's
    /// settings; every problem of the common keys at once.
    fn read(item: toml::Value) -> Result<RouteConfig, Vec<String>> {
        let toml::Value::Table(mut table) = item else {
            return Err(vec!["must be a table".to_owned()]);
        };
        let mut common = toml::Table::new();
        for key in [
            "name",
            "prefix",
            "listen",
            "upstream",
            "credential",
            "timeout",
            "purpose",
            "category",
        ] {
            if let Some(value) = table.remove(key) {
                common.insert(key.to_owned(), value);
            }
        }
        let common = CommonRoute::deserialize(toml::Value::Table(common))
            .map_err(|e| e.to_string().trim().to_owned());
        let adapter = match table.remove("adapter") {
            Some(toml::Value::String(name)) => Ok(name),
            _ => Err("adapter: missing; name the kind of store behind the route".to_owned()),
        };
        match (common, adapter) {
            (Ok(c), Ok(adapter)) => Ok(RouteConfig {
                name: c.name,
                prefix: c.prefix,
                listen: c.listen,
                upstream: c.upstream,
                credential: c.credential,
                timeout: c.timeout,
                purpose: c.purpose,
                category: c.category,
                adapter,
                settings: table,
            }),
            (common, adapter) => Err(common.err().into_iter().chain(adapter.err()).collect()),
        }
    }
}

/// The erasure target of a route: `<kind>:<route name>`.
pub fn route_target(kind: &str, route: &str) -> String {
    format!("{kind}:{route}")
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialConfig {
    pub header: String,
    pub value: Secret,
}

/// Where a secret comes from: `{ env = "NAME" }`, `{ file = "PATH" }` or `{ value = "..." }`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Secret {
    Env(String),
    File(PathBuf),
    Value(String),
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Secret::Env(name) => write!(f, "Secret::Env({name:?})"),
            Secret::File(path) => write!(f, "Secret::File({path:?})"),
            Secret::Value(_) => f.write_str("Secret::Value(<redacted>)"),
        }
    }
}

impl Secret {
    /// The secret's bytes; a trailing newline in a file is not part of it.
    pub fn resolve(&self) -> Result<Vec<u8>, String> {
        match self {
            Secret::Env(name) => std::env::var(name)
                .map(String::into_bytes)
                .map_err(|_| format!("environment variable {name} is not set")),
            Secret::File(path) => std::fs::read(path)
                .map(|mut bytes| {
                    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                        bytes.pop();
                    }
                    bytes
                })
                .map_err(|e| format!("cannot read {}: {e}", path.display())),
            Secret::Value(value) => Ok(value.clone().into_bytes()),
        }
    }
}

/// A duration written `500ms`, `30s`, `5m` or `1h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigDuration(pub Duration);

impl<'de> Deserialize<'de> for ConfigDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text)
            .map(ConfigDuration)
            .map_err(serde::de::Error::custom)
    }
}

/// One spelling of an upstream's address, so that two routes to one store are seen as one:
/// scheme and host in lowercase, the port written, every loopback name as one, no trailing `/`.
/// (Two DNS names of one host are not found out.)
pub fn store_address(upstream: &str) -> String {
    let Ok(uri) = upstream.parse::<hyper::Uri>() else {
        return upstream.to_owned();
    };
    let scheme = uri.scheme_str().unwrap_or("http").to_ascii_lowercase();
    let host = uri
        .host()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    let host = if loopback { "loopback" } else { &host };
    let port = uri
        .port_u16()
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    format!(
        "{scheme}://{host}:{port}{}",
        uri.path().trim_end_matches('/')
    )
}

pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration like 500ms, 30s, 5m or 1h");
    let split = text.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let duration = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(bad()),
    };
    if duration.is_zero() {
        Err(format!("{text:?}: must be greater than zero"))
    } else {
        Ok(duration)
    }
}

/// Deployment overrides from flags and environment variables; they win over the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub data_listen: Option<SocketAddr>,
    pub control_listen: Option<SocketAddr>,
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
                "unknown section `{key}` (expected data_plane, control_plane, state, auth, audit, erasure, lineage, routes, postgres or tenants)"
            ));
        }
        Ok((
            Config {
                data_plane,
                control_plane,
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
    fn problems(&self) -> Vec<String> {
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

impl DataPlaneConfig {
    fn problems(&self) -> Vec<String> {
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
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
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
    fn problems(&self) -> Vec<String> {
        let url = &self.url;
        match crate::state::StateKind::of(url) {
            Some(_) => Vec::new(),
            None => vec![format!(
                "state.url: {url:?} is neither sqlite://PATH nor postgres://..."
            )],
        }
    }
}

impl AuthConfig {
    fn problems(&self) -> Vec<String> {
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

impl ErasureConfig {
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.probes.iter().any(|p| !p.contains("{subject}")) {
            problems.push("erasure.probes: every probe must contain {subject}".to_owned());
        }
        if self.probe_min_similarity > 100 {
            problems.push("erasure.probe_min_similarity: a percentage, 0 to 100".to_owned());
        }
        if !(1..=3).contains(&self.deadline_months) {
            problems
                .push("erasure.deadline_months: 1 to 3 (one month, extendable by two)".to_owned());
        }
        if self.max_attempts == 0 {
            problems.push("erasure.max_attempts: must be at least 1".to_owned());
        }
        if !(1..=2).contains(&self.approvals_required) {
            problems.push("erasure.approvals_required: must be 1 or 2".to_owned());
        }
        problems
    }
}

impl RouteConfig {
    /// The problems of each route's common keys, and between routes (names, prefixes, listeners).
    fn problems_of(routes: &[RouteConfig]) -> Vec<String> {
        let mut problems = Vec::new();
        let mut names = BTreeSet::new();
        let mut prefixes = BTreeSet::new();
        let mut listeners = BTreeSet::new();
        for (i, route) in routes.iter().enumerate() {
            let at = format!("[[routes]] #{} ({})", i + 1, route.name);
            if !names.insert(&route.name) {
                problems.push(format!("{at}: another route already has this name"));
            }
            if let Some(prefix) = &route.prefix
                && !prefixes.insert(prefix)
            {
                problems.push(format!("{at}: another route already has prefix {prefix}"));
            }
            if let Some(listen) = route.listen
                && !listeners.insert(listen)
            {
                problems.push(format!("{at}: another route already listens on {listen}"));
            }
            problems.extend(route.problems().into_iter().map(|p| format!("{at}: {p}")));
        }
        problems
    }

    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let name_ok = !self.name.is_empty()
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !name_ok {
            problems.push("name must be lowercase letters, digits and _".to_owned());
        }
        match (&self.prefix, self.listen) {
            (Some(_), Some(_)) => problems.push(
                "prefix (HTTP on the data plane) or listen (a listener of its own), not both"
                    .to_owned(),
            ),
            (None, None) => problems.push(
                "prefix or listen: say where clients reach the route (as its store needs)"
                    .to_owned(),
            ),
            (Some(prefix), None) => {
                let prefix_ok = prefix.len() > 1
                    && prefix.starts_with('/')
                    && !prefix.ends_with('/')
                    && !prefix.contains("//");
                if !prefix_ok {
                    problems
                        .push("prefix must look like /name (leading /, no trailing /)".to_owned());
                }
            }
            (None, Some(_)) => {}
        }
        for (key, value) in [("purpose", &self.purpose), ("category", &self.category)] {
            if value.as_deref().is_some_and(|v| !valid_name(v)) {
                problems.push(format!(
                    "{key}: must be 1 to 200 bytes without control characters or '/'"
                ));
            }
        }
        if !is_url(&self.upstream) {
            problems.push(format!(
                "upstream {:?} is not a URL with a host",
                self.upstream
            ));
        }
        if let Some(credential) = &self.credential
            && hyper::header::HeaderName::from_bytes(credential.header.as_bytes()).is_err()
        {
            problems.push(format!(
                "credential.header {:?} is not a header name",
                credential.header
            ));
        }
        problems
    }
}

/// `[erasure]`: its own keys, and each array of tables it has no key of its own for as the
/// `[[erasure.<kind>]]` targets of that kind, which the kind reads (`stores::TARGET_KINDS`).
fn erasure_section(value: toml::Value, problems: &mut Vec<String>) -> ErasureConfig {
    let toml::Value::Table(mut table) = value else {
        problems.push("[erasure]: must be a table".to_owned());
        return ErasureConfig::default();
    };
    let mut targets = Vec::new();
    loop {
        let read = ErasureConfig::deserialize(toml::Value::Table(table.clone()));
        let message = match read {
            Ok(erasure) => return ErasureConfig { targets, ..erasure },
            Err(e) => e.to_string().trim().to_owned(),
        };
        let kind = unknown_field(&message).filter(|key| {
            matches!(table.get(key), Some(toml::Value::Array(items))
                if !items.is_empty() && items.iter().all(toml::Value::is_table))
        });
        let Some(toml::Value::Array(items)) = kind.as_ref().and_then(|k| table.remove(k)) else {
            problems.push(format!("[erasure]: {message}"));
            return ErasureConfig {
                targets,
                ..ErasureConfig::default()
            };
        };
        for item in items {
            if let toml::Value::Table(settings) = item {
                let name = settings.get("name").and_then(toml::Value::as_str);
                targets.push(ErasureTargetConfig {
                    kind: kind.clone().unwrap_or_default(),
                    name: name.unwrap_or_default().to_owned(),
                    settings,
                });
            }
        }
    }
}

/// The key serde names in an "unknown field" error.
fn unknown_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    Some(rest.split_once('`')?.0.to_owned())
}

/// Deserialises `T` from a table of keys, reporting every unknown key (serde stops at the
/// first: each is taken out and the rest read again) and then the first other problem.
pub fn read_all<T: serde::de::DeserializeOwned>(mut keys: toml::Table) -> Result<T, Vec<String>> {
    let mut problems = Vec::new();
    loop {
        match T::deserialize(toml::Value::Table(keys.clone())) {
            Ok(read) if problems.is_empty() => return Ok(read),
            Ok(_) => return Err(problems),
            Err(e) => {
                let message = e.to_string().trim().to_owned();
                let unknown = unknown_field(&message);
                problems.push(message);
                match unknown {
                    Some(field) if keys.remove(&field).is_some() => {}
                    _ => return Err(problems),
                }
            }
        }
    }
}

/// A URL with a scheme and a host (which schemes a route may use is its store's to say).
fn is_url(text: &str) -> bool {
    text.parse::<hyper::Uri>()
        .is_ok_and(|uri| uri.scheme().is_some() && uri.host().is_some_and(|h| !h.is_empty()))
}

/// `LETHE_UPSTREAM_<NAME>`: overrides the upstream URL of the route named `name`.
pub fn upstream_env_var(name: &str) -> String {
    format!("LETHE_UPSTREAM_{}", name.to_ascii_uppercase())
}

fn read(path: &Path) -> Result<String, ConfigErrors> {
    std::fs::read_to_string(path).map_err(|e| ConfigErrors {
        problems: vec![format!("cannot read {}: {e}", path.display())],
    })
}

#[cfg(test)]
mod tests;
