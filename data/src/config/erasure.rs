//! `[erasure]`: approvals, retries, the purge's timings, probes, backups and the `[[erasure.<kind>]]` targets.

use std::time::Duration;

use serde::Deserialize;

use super::values::{ConfigDuration, Secret, unknown_field};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ErasureConfig {
    /// 1 or 2 approvals, by different actors, before an erasure request is carried out.
    pub approvals_required: usize,
    /// Approving, releasing a legal hold and resuming a request after an exception need a second
    /// factor shown by the sign-in provider (a session signed in through it with one).
    pub approval_requires_mfa: bool,
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
            approval_requires_mfa: false,
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

impl ErasureConfig {
    pub(super) fn problems(&self) -> Vec<String> {
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

/// `[erasure]`: its own keys, and each array of tables it has no key of its own for as the
/// `[[erasure.<kind>]]` targets of that kind, which the kind reads (`stores::TARGET_KINDS`).
pub(super) fn erasure_section(value: toml::Value, problems: &mut Vec<String>) -> ErasureConfig {
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
