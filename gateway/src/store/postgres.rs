//! PostgreSQL: the shared state store for many replicas.

use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};

use super::StoreError;
use super::migrate::{POSTGRES, run_migrations};
use super::sql::impl_store;

pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    const BACKEND: &'static str = "postgres";
    /// Appends from every replica queue on this row lock; the chain cannot fork.
    const LOCK_AUDIT_HEAD: &'static str =
        "SELECT seq, hash FROM audit_head WHERE id = 1 FOR UPDATE";

    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(5))
            .connect(url)
            .await?;
        Ok(PgStore { pool })
    }

    async fn write_tx(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
        Ok(self.pool.begin().await?)
    }

    async fn run_migrations(&self) -> Result<Vec<i64>, StoreError> {
        // Replicas starting together take turns; the second finds the work done.
        run_migrations!(
            self.write_tx(),
            "SELECT pg_advisory_xact_lock(7400)",
            POSTGRES
        )
    }
}

impl_store!(PgStore, sqlx::Postgres);
