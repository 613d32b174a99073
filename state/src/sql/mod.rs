//! The SQL both backends share. The statements are written once, in the subset of SQL that
//! PostgreSQL and SQLite both accept (`$N` placeholders, `ON CONFLICT`); each backend supplies
//! how it opens a write transaction and how it locks the audit head. One file per concern, as
//! the state store's traits are split.

mod audit;
mod closure;
mod consent;
mod derivatives;
mod erasure;
mod flip;
mod lineage;
mod purge;
mod retention;
mod sessions;

pub(crate) use audit::audit_sql;
pub(crate) use closure::closure_sql;
pub(crate) use consent::consent_sql;
pub(crate) use derivatives::derivative_sql;
pub(crate) use erasure::erasure_sql;
pub(crate) use flip::flip_sql;
pub(crate) use lineage::lineage_sql;
pub(crate) use purge::purge_sql;
pub(crate) use retention::retention_sql;
pub(crate) use sessions::sessions_sql;

/// The columns of a consent grant, to start a `SELECT` with.
macro_rules! select_grants {
    () => {
        "SELECT id, tenant, subject, purpose, category, actions, \
            granted_at, expires_at, revoked_at, policy_version, source \
            FROM consent_grants "
    };
}
pub(crate) use select_grants;

/// The columns of a legal hold, to start a `SELECT` with.
macro_rules! select_holds {
    () => {
        "SELECT id, tenant, subject, reason, placed_at, placed_by, \
            released_at, released_by FROM legal_holds "
    };
}
pub(crate) use select_holds;

/// Implements [`Store`](super::Store) for `$store` over database `$db`. `$store` must have
/// `pool: sqlx::Pool<$db>`, `async fn write_tx(&self)` and `const LOCK_AUDIT_HEAD: &str`.
macro_rules! impl_store {
    ($store:ty, $db:ty) => {
        mod shared_sql {
            use std::collections::{BTreeMap, BTreeSet};

            use async_trait::async_trait;
            use chrono::{DateTime, Utc};
            use lethe_policy::audit::{
                AuditEntry, AuditRecord, ChainHead, Links, TenantLink, seal,
            };
            use lethe_policy::progress::{
                Attempt, JobState, Verification, progress, verification_due,
            };
            use lethe_policy::{
                Action, ConsentGrant, ErasureEvent, ErasureState, LegalHold, RetentionPolicy,
                SubjectPolicy, SubjectState, SubjectStatus,
            };
            use sqlx::Row as _;
            use sqlx::types::Json;

            use super::*;
            use crate::{
                AuditLog, Closure, Consents, ConsoleSession, DeadlineExtension, Decision,
                Derivative, Derived, DueWindow, Edge, ErasureFilter, ErasureOverview,
                ErasureRecord, ErasureStats, Erasures, ExpiredItem, Feed, FeedEvent, GovernedFlip,
                HoldRecord, ItemKey, ItemRecord, JobOutcome, Lineage, MAX_EXTENSION_MONTHS,
                PendingFlip, PolicyChange, PurgeJob, Purges, Rejection, Retention,
                RetentionVersion, Schema, Sessions, SignedHead, Store, StoreError, Tombstone,
                deadline,
            };

            crate::sql::closure_sql!($db);
            crate::sql::derivative_sql!($db);
            crate::sql::flip_sql!($store, $db);

            type Row = <$db as sqlx::Database>::Row;
            type Tx = sqlx::Transaction<'static, $db>;

            /// Commits `tx` and tells every cache: first the other replicas (inside the
            /// transaction, so they hear of it only if it commits), then this process.
            async fn commit_change(
                store: &$store,
                tx: Tx,
                change: PolicyChange,
            ) -> Result<(), StoreError> {
                commit_changes(store, tx, vec![change]).await
            }

            async fn commit_changes(
                store: &$store,
                mut tx: Tx,
                changes: Vec<PolicyChange>,
            ) -> Result<(), StoreError> {
                for change in &changes {
                    <$store>::notify(&mut tx, change).await?;
                }
                tx.commit().await?;
                for change in changes {
                    store.feed.publish(FeedEvent::Changed(change));
                }
                Ok(())
            }

            fn status_of(text: &str) -> Result<SubjectStatus, StoreError> {
                SubjectStatus::parse(text).ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "unknown \
                    subject status {text:?}"
                    ))
                })
            }

            #[async_trait]
            impl Store for $store {
                fn backend(&self) -> &'static str {
                    <$store>::BACKEND
                }

                async fn schema(&self) -> Result<Schema, StoreError> {
                    let latest = <$store>::MIGRATIONS.last().map_or(0, |m| m.version);
                    let migrated: bool = sqlx::query_scalar(<$store>::MIGRATED)
                        .fetch_one(&self.pool)
                        .await?;
                    let have: Vec<i64> = if migrated {
                        sqlx::query_scalar("SELECT version FROM lethe_migrations")
                            .fetch_all(&self.pool)
                            .await?
                    } else {
                        Vec::new()
                    };
                    // A store lacking a migration is at the one before it, whatever came after.
                    let lacking = <$store>::MIGRATIONS
                        .iter()
                        .find(|m| !have.contains(&m.version));
                    let applied = match lacking {
                        Some(m) => m.version - 1,
                        None => have.iter().copied().max().unwrap_or(0),
                    };
                    Ok(Schema { applied, latest })
                }

                async fn migrate(&self) -> Result<Vec<i64>, StoreError> {
                    let applied = self.run_migrations().await?;
                    // Requests filed before deadlines were kept (migration 6) get the default
                    // month; looked for every time, so an interrupted start finishes the job.
                    let rows = sqlx::query(
                        "SELECT id, requested_at FROM \
                        erasure_requests WHERE due_at IS NULL",
                    )
                    .fetch_all(&self.pool)
                    .await?;
                    for row in &rows {
                        let requested: DateTime<Utc> = row.try_get("requested_at")?;
                        sqlx::query(
                            "UPDATE erasure_requests SET due_at = $1 WHERE id \
                            = $2",
                        )
                        .bind(deadline(requested, 1))
                        .bind(row.try_get::<String, _>("id")?)
                        .execute(&self.pool)
                        .await?;
                    }
                    Ok(applied)
                }

                async fn ping(&self) -> Result<(), StoreError> {
                    sqlx::query("SELECT 1").execute(&self.pool).await?;
                    Ok(())
                }

                async fn generated_secret(
                    &self,
                    name: &str,
                    fresh: &[u8],
                    at: DateTime<Utc>,
                ) -> Result<Vec<u8>, StoreError> {
                    sqlx::query(
                        "INSERT INTO generated_secrets (name, value, \
                        created_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING",
                    )
                    .bind(name)
                    .bind(fresh)
                    .bind(at)
                    .execute(&self.pool)
                    .await?;
                    Ok(sqlx::query_scalar(
                        "SELECT value FROM generated_secrets WHERE \
                        name = $1",
                    )
                    .bind(name)
                    .fetch_one(&self.pool)
                    .await?)
                }

                fn use_subject_key(&self, key: &[u8]) {
                    // The first key stays: a store is opened with one configuration.
                    let _ = self.subject_key.set(key.to_vec());
                }

                fn feed(&self) -> &std::sync::Arc<Feed> {
                    &self.feed
                }
            }

            crate::sql::consent_sql!($store, $db);
            crate::sql::retention_sql!($store, $db);
            crate::sql::erasure_sql!($store, $db);
            crate::sql::purge_sql!($store, $db);
            crate::sql::lineage_sql!($store, $db);
            crate::sql::audit_sql!($store, $db);
            crate::sql::sessions_sql!($store, $db);
        }
    };
}
pub(crate) use impl_store;
