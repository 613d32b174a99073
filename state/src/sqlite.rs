//! SQLite: the embedded default. One file, one writer at a time.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::StoreError;
use super::migrate::{SQLITE, run_migrations};
use super::sql::impl_store;

pub struct SqliteStore {
    pool: SqlitePool,
    /// One process owns the file, so the feed is in-process only and always healthy.
    feed: std::sync::Arc<super::Feed>,
    subject_key: std::sync::OnceLock<Vec<u8>>,
    closure: std::sync::OnceLock<super::Closure>,
    governed: std::sync::OnceLock<Vec<String>>,
}

impl SqliteStore {
    const BACKEND: &'static str = "sqlite";
    /// The migrations this Lethe knows.
    const MIGRATIONS: &'static [crate::migrate::Migration] = SQLITE;
    /// Whether migrations were ever applied.
    const MIGRATED: &'static str = "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'lethe_migrations')";
    /// How a read inside a write transaction locks its row: `BEGIN IMMEDIATE` already holds the
    /// database's write lock for the whole transaction.
    const FOR_UPDATE: &'static str = "";
    /// How a read inside a write transaction keeps its rows from changing (the write lock does).
    const FOR_SHARE: &'static str = "";
    /// How workers claim a job without waiting on one another (one writer at a time already).
    const SKIP_LOCKED: &'static str = "";
    /// The audit head, read under the transaction's write lock.
    const LOCK_AUDIT_HEAD: &'static str =
        "SELECT seq, hash, chain_version, key_check FROM audit_chain WHERE id = 1";

    /// Opens (and creates, with its folder) the database a `sqlite://PATH` URL names.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            // A forgotten subject key must not stay in a free page of the file.
            .pragma("secure_delete", "ON")
            .busy_timeout(Duration::from_secs(5));
        if let Some(dir) = options
            .get_filename()
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::Unavailable(sqlx::Error::Io(e)))?;
        }
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(options)
            .await?;
        Ok(SqliteStore {
            pool,
            feed: std::sync::Arc::new(super::Feed::new(true)),
            subject_key: std::sync::OnceLock::new(),
            closure: std::sync::OnceLock::new(),
            governed: std::sync::OnceLock::new(),
        })
    }

    /// Write transactions take the write lock up front, so two of them never deadlock upgrading.
    async fn write_tx(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, StoreError> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// Nothing to tell: no other process shares the database.
    async fn notify(
        _tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        _change: &super::PolicyChange,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    /// Once an erased subject's key is forgotten, no copy of it stays in the write-ahead log:
    /// its frames go into the database file (where secure_delete zeroed the old rows) and the
    /// log is truncated.
    async fn scrub(&self) -> Result<(), StoreError> {
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    fn shared(&self) -> Option<&dyn super::SharedMemory> {
        None
    }

    fn closure(&self) -> super::Closure {
        self.closure.get().copied().unwrap_or_default()
    }

    fn governed(&self) -> &[String] {
        self.governed.get().map_or(&[], Vec::as_slice)
    }

    /// Nothing to forget: one process keeps what it served in memory, not here.
    async fn forget_shared(
        _tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        _tenant: &str,
        _key: &str,
        _name: &str,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    async fn run_migrations(&self) -> Result<Vec<i64>, StoreError> {
        run_migrations!(self.write_tx(), "SELECT 1", SQLITE)
    }
}

impl_store!(SqliteStore, sqlx::Sqlite);
