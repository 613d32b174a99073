//! `[[postgres]]`: the PostgreSQL databases whose memory tables Lethe governs in the database.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Deserialize;

use super::routes::valid_name;
use super::values::{ConfigDuration, Secret};

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
    pub(super) fn problems(&self) -> Vec<String> {
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
    pub(super) fn problems(&self, tables: &[GovernedTable]) -> Vec<String> {
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
