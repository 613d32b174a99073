//! Helpers for tests that need a real state store. PostgreSQL tests get a fresh database each,
//! created on the server `LETHE_TEST_POSTGRES` names (default: the local one, trust auth).

use std::sync::Arc;

use crate::state::{self, Store};

pub fn postgres_admin_url() -> String {
    std::env::var("LETHE_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A new, empty PostgreSQL database; returns its URL.
pub async fn fresh_postgres_database() -> Result<String, sqlx::Error> {
    use sqlx::Connection as _;
    let admin = postgres_admin_url();
    let name = format!("lethe_test_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(&admin).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await?;
    let base = admin
        .rsplit_once('/')
        .map_or(admin.as_str(), |(base, _)| base);
    Ok(format!("{base}/{name}"))
}

/// A new SQLite file in a fresh temporary folder; returns its URL.
pub fn fresh_sqlite_url() -> String {
    let dir = std::env::temp_dir().join(format!("lethe-test-{}", uuid::Uuid::new_v4().simple()));
    format!("sqlite://{}/state.db", dir.display())
}

/// The key of subject references in tests.
pub const AUDIT_KEY: &[u8] = b"audit-key";

/// Connects to `url`, applies the migrations and gives the store the test [`AUDIT_KEY`].
pub async fn migrated(url: &str) -> Arc<dyn Store> {
    let store = state::connect(url)
        .await
        .expect("connect to the test state store");
    store.migrate().await.expect("migrate the test state store");
    store.use_subject_key(AUDIT_KEY);
    store
}

/// Runs statements on the database behind `url`, outside Lethe (to tamper with it in tests).
pub async fn execute_raw(url: &str, sql: &str) -> Result<u64, sqlx::Error> {
    use sqlx::Connection as _;
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    let affected = if url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(url).await?;
        sqlx::raw_sql(sql).execute(&mut conn).await?.rows_affected()
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await?;
        sqlx::raw_sql(sql).execute(&mut conn).await?.rows_affected()
    };
    Ok(affected)
}

/// An erasure request for `subject` of tenant `acme`, filed by `dpo` at `at`, not yet approved.
pub fn erasure_request(
    id: &str,
    subject: &str,
    at: chrono::DateTime<chrono::Utc>,
) -> state::ErasureRecord {
    state::ErasureRecord {
        id: id.into(),
        tenant: "acme".into(),
        subject: subject.into(),
        aliases: vec![],
        ticket: "DSR-7".into(),
        reason: "art. 17".into(),
        state: lethe_policy::ErasureState::Requested,
        requested_by: "dpo".into(),
        requested_at: at,
        deadline: state::deadline(at, 1),
        approvals: vec![],
        suppressed_at: None,
        completed_at: None,
        updated_at: at,
        extension: None,
        rejection: None,
    }
}

/// The subjects of one purge, known by key, in tests.
pub fn subjects(tenant: &str, keys: &[&str]) -> crate::purge::Subjects {
    crate::purge::Subjects::new(
        tenant,
        keys.iter().map(|k| (*k).to_owned()).collect(),
        Arc::from(AUDIT_KEY),
    )
}

/// A stand-in store that holds what lineage names and `extra` records lineage does not know;
/// it refuses to purge (the dry run's tests).
pub struct Holding {
    pub extra: u64,
}

#[async_trait::async_trait]
impl crate::purge::Connector for Holding {
    async fn purge(
        &self,
        _: &crate::purge::Subjects,
        _: &[(String, String)],
    ) -> Result<crate::purge::PurgeReport, crate::purge::ConnectorError> {
        Err(crate::purge::ConnectorError::Unavailable(
            "a dry run purges nothing".into(),
        ))
    }

    async fn count(
        &self,
        _: &crate::purge::Subjects,
        lineage: &[(String, String)],
    ) -> Result<u64, crate::purge::ConnectorError> {
        Ok(lineage.len() as u64 + self.extra)
    }
}

/// A lineage row: `subject`'s item `id` of tenant `acme` in `store`'s collection `c1`, a day
/// from its deadline.
pub fn item(store: &str, id: &str, subject: &str) -> state::ItemRecord {
    let now = crate::now();
    state::ItemRecord {
        store: store.into(),
        collection: "c1".into(),
        item_id: id.into(),
        tenant: "acme".into(),
        subject: subject.into(),
        purpose: "p".into(),
        category: "c".into(),
        layer: lethe_policy::Layer::Raw,
        created_at: now,
        expires_at: now + chrono::TimeDelta::days(1),
        epoch: 0,
        source_ref: None,
        parents: vec![],
    }
}
