//! The state store: consent, retention, holds, subjects, lineage, erasure, audit.
//!
//! One trait per concern ([`Consents`], [`Retention`], [`Erasures`], [`Purges`], [`Lineage`],
//! [`AuditLog`], [`Sessions`]), together the [`Store`], each in its own file with the types it
//! speaks in; two implementations with the same schema in meaning: SQLite (embedded default, one
//! file) and PostgreSQL (shared by many replicas), whose SQL is written once in `sql/`, one file
//! per concern. Every change is written in one transaction together with its audit event, so
//! nothing is ever half-applied or unaudited.

mod audit;
mod consent;
mod erasure;
pub mod feed;
mod lineage;
mod migrate;
mod postgres;
mod purge;
mod retention;
mod sessions;
mod sql;
mod sqlite;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, SubsecRound, Utc};
use lethe_policy::audit::{
    AuditEntry, AuditRecord, ChainBreak, ChainHead, ChainVerifier, Links, TenantChainVerifier,
};
use lethe_policy::{
    ConsentGrant, How, Layer, LegalHold, RetentionPolicy, SubjectPolicy, SubjectState,
};
use serde::Serialize;

pub use audit::*;
pub use consent::*;
pub use erasure::*;
pub use feed::{Feed, FeedEvent, PolicyChange};
pub use lineage::*;
pub use postgres::PgStore;
pub use purge::*;
pub use retention::*;
pub use sessions::*;
pub use sqlite::SqliteStore;

/// The current time at the precision both state stores keep (microseconds), so that what is
/// written, read back and hashed is the same instant.
pub fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(6)
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("the consent grant is already revoked")]
    AlreadyRevoked,
    #[error("the legal hold is already released")]
    AlreadyReleased,
    #[error("the deadline is already extended or has passed, or the request is closed")]
    NotExtendable,
    #[error("the subject is suppressed or erased")]
    SubjectNotActive,
    #[error("{0}")]
    NotDecidable(String),
    #[error("{0}")]
    Approval(#[from] lethe_policy::ApprovalError),
    #[error("{0}")]
    Transition(#[from] lethe_policy::IllegalTransition),
    #[error("the state store is unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    #[error("state store error: {0}")]
    Database(#[source] sqlx::Error),
    #[error("the state store holds data Lethe cannot read: {0}")]
    Corrupt(String),
    #[error("the state store was opened without the key of subject references")]
    NoSubjectKey,
    #[error("the audit chain's links are not keyed: run `lethe audit key-chain` once")]
    AuditUnkeyed,
    #[error("the audit chain's links were made with another audit key than this one")]
    WrongAuditKey,
    #[error("unsupported state store URL (expected sqlite://PATH or postgres://...): {0}")]
    UnsupportedUrl(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        use sqlx::Error as E;
        match e {
            E::RowNotFound => StoreError::NotFound,
            E::Io(_)
            | E::Tls(_)
            | E::PoolTimedOut
            | E::PoolClosed
            | E::WorkerCrashed
            | E::Protocol(_) => StoreError::Unavailable(e),
            E::ColumnDecode { .. }
            | E::Decode(_)
            | E::ColumnNotFound(_)
            | E::TypeNotFound { .. } => StoreError::Corrupt(e.to_string()),
            other => StoreError::Database(other),
        }
    }
}
#[async_trait]
pub trait Store:
    Consents + Retention + Erasures + Purges + Lineage + AuditLog + Sessions + Send + Sync + 'static
{
    /// `sqlite` or `postgres`.
    fn backend(&self) -> &'static str;

    /// Applies pending migrations; returns the versions it applied.
    async fn migrate(&self) -> Result<Vec<i64>, StoreError>;

    /// Which migrations the store has, against the ones this Lethe knows.
    async fn schema(&self) -> Result<Schema, StoreError>;

    async fn ping(&self) -> Result<(), StoreError>;

    /// Key material Lethe generated for itself: stores `fresh` under `name` unless a value is
    /// already there, and returns the stored value (so every replica ends up with the same key).
    async fn generated_secret(
        &self,
        name: &str,
        fresh: &[u8],
        at: DateTime<Utc>,
    ) -> Result<Vec<u8>, StoreError>;

    /// The key of subject references (the audit HMAC key). With it the store keeps an erased
    /// subject only as its reference and still knows it by its key; without it, lookups and
    /// completions fail. Set once, right after opening; a second key is ignored.
    fn use_subject_key(&self, key: &[u8]);

    /// Policy changes of this process and, on PostgreSQL, of every replica.
    fn feed(&self) -> &Arc<Feed>;
}

/// Where a store's schema stands: `applied` is the migration before the first one it lacks (or
/// its newest, when it lacks none of this Lethe's), `latest` the newest this Lethe knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schema {
    pub applied: i64,
    pub latest: i64,
}

/// The kinds of state store a URL can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateKind {
    /// `sqlite://PATH`, created if missing.
    Sqlite,
    /// `postgres://...` or `postgresql://...`.
    Postgres,
}

impl StateKind {
    /// The kind a state URL names; the one check both the configuration and `connect` use.
    pub fn of(url: &str) -> Option<StateKind> {
        if url.starts_with("sqlite://") {
            Some(StateKind::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(StateKind::Postgres)
        } else {
            None
        }
    }
}

/// Opens the store a URL names: `sqlite://PATH` (created if missing) or `postgres://...`.
pub async fn connect(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    match StateKind::of(url) {
        Some(StateKind::Sqlite) => Ok(Arc::new(SqliteStore::connect(url).await?)),
        Some(StateKind::Postgres) => Ok(Arc::new(PgStore::connect(url).await?)),
        None => Err(StoreError::UnsupportedUrl(url.to_owned())),
    }
}

#[cfg(test)]
pub(crate) mod tests;
