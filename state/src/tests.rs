//! One suite, run against both backends: every test below exists once for SQLite and once for
//! PostgreSQL (a fresh database on the local server).

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::{DateTime, Months, TimeDelta, Utc};
use lethe_policy::audit::AuditEntry;
use lethe_policy::{Layer, LegalHold, RetentionPolicy, RetentionRule, SubjectStatus};

use super::*;
use crate::now;
use crate::testing::{
    ERASED_KEYS, audit, erase_to_completion, fresh_postgres_database, fresh_sqlite_url, grant,
    lineage_row, migrated,
};

macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test] async fn $name() { super::$name(&crate::testing::migrated(&crate::testing::fresh_sqlite_url()).await).await })*
        }
        mod postgres {
            $(#[tokio::test] async fn $name() {
                let url = crate::testing::fresh_postgres_database().await.expect("create a PostgreSQL test database");
                super::$name(&crate::testing::migrated(&url).await).await
            })*
        }
    };
}

mod audit;
mod consent;
mod derivatives;
mod erasure;
mod forgetting;
mod lineage;
mod sessions;

/// A store is at the migration before the first one it lacks, whatever came after it; a newer
/// Lethe's migrations put it ahead.
#[tokio::test]
async fn a_store_lacking_a_migration_is_behind_and_one_with_newer_ones_ahead() {
    let urls = [
        crate::testing::fresh_sqlite_url(),
        fresh_postgres_database()
            .await
            .expect("a PostgreSQL test database"),
    ];
    for url in urls {
        let store = migrated(&url).await;
        let schema = store.schema().await.unwrap();
        assert_eq!(schema.applied, schema.latest, "{url}");
        crate::testing::execute_raw(&url, "DELETE FROM lethe_migrations WHERE version = 5")
            .await
            .unwrap();
        assert_eq!(store.schema().await.unwrap().applied, 4, "{url}");
        crate::testing::execute_raw(
            &url,
            "INSERT INTO lethe_migrations (version, name, applied_at) VALUES (5, 'back', 'now'), \
             (99, 'newer', 'now')",
        )
        .await
        .unwrap();
        assert_eq!(store.schema().await.unwrap().applied, 99, "{url}");
    }
}
