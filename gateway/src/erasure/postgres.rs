//! Purging a subject from an agent app's own PostgreSQL tables (a pgvector `memories` table, a
//! `messages` table, ...): the configured statements, then the physical step — `REINDEX INDEX
//! CONCURRENTLY` (an HNSW index keeps deleted vectors until rebuilt) and `VACUUM` — reported apart,
//! with a warning when an inactive replication slot pins the WAL that still holds the old rows.

use async_trait::async_trait;
use sqlx::{Connection, PgConnection};

use super::{Connector, ConnectorError, PurgeReport};
use crate::config::PostgresTarget;

pub struct PostgresConnector {
    url: String,
    target: PostgresTarget,
}

impl PostgresConnector {
    pub fn new(url: String, target: PostgresTarget) -> Self {
        PostgresConnector { url, target }
    }

    /// Sum of the configured count statement over every key.
    async fn count(
        &self,
        conn: &mut PgConnection,
        tenant: &str,
        keys: &[String],
    ) -> Result<u64, ConnectorError> {
        let mut total = 0i64;
        for key in keys {
            let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(self.target.count.clone()))
                .bind(tenant)
                .bind(key)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| {
                    ConnectorError::from_sqlx(&format!("{}: count", self.target.name), &e)
                })?;
            total += n;
        }
        Ok(u64::try_from(total).unwrap_or(0))
    }

    /// Rebuilds indexes and vacuums tables; says what was done and what still holds old bytes.
    async fn physical(&self, conn: &mut PgConnection) -> String {
        let mut done = Vec::new();
        for index in &self.target.reindex {
            let sql = format!("REINDEX INDEX CONCURRENTLY {}", quote(index));
            match sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut *conn)
                .await
            {
                Ok(_) => done.push(format!("reindexed {index}")),
                Err(e) => done.push(format!("REINDEX {index} failed: {e}")),
            }
        }
        for table in &self.target.vacuum {
            let sql = format!("VACUUM {}", quote(table));
            match sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut *conn)
                .await
            {
                Ok(_) => done.push(format!("vacuumed {table}")),
                Err(e) => done.push(format!("VACUUM {table} failed: {e}")),
            }
        }
        done.push("the WAL keeps the deleted rows until its segments are recycled".to_owned());
        let slots: Result<Vec<String>, _> = sqlx::query_scalar(
            "SELECT slot_name::text FROM pg_replication_slots WHERE NOT active ORDER BY slot_name",
        )
        .fetch_all(&mut *conn)
        .await;
        if let Ok(slots) = slots
            && !slots.is_empty()
        {
            done.push(format!("WARNING: inactive replication slot(s) {} pin WAL that still holds the deleted rows", slots.join(", ")));
        }
        done.join("; ")
    }
}

/// A schema-qualified identifier, quoted part by part.
fn quote(name: &str) -> String {
    name.split('.')
        .map(|part| format!("\"{}\"", part.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(".")
}

#[async_trait]
impl Connector for PostgresConnector {
    async fn purge(
        &self,
        tenant: &str,
        keys: &[String],
        _lineage: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        let name = &self.target.name;
        let failed = |what: &str| {
            let what = format!("{name}{what}");
            move |e: sqlx::Error| ConnectorError::from_sqlx(&what, &e)
        };
        let mut conn = PgConnection::connect(&self.url).await.map_err(failed(""))?;
        let before = self.count(&mut conn, tenant, keys).await?;
        let mut deleted = 0;
        // All statements for all keys in one transaction: a purge is never half-applied.
        let mut tx = conn.begin().await.map_err(failed(""))?;
        for key in keys {
            for statement in &self.target.delete {
                deleted += sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
                    .bind(tenant)
                    .bind(key)
                    .execute(&mut *tx)
                    .await
                    .map_err(failed(": delete"))?
                    .rows_affected();
            }
        }
        tx.commit().await.map_err(failed(""))?;
        let remaining = self.count(&mut conn, tenant, keys).await?;
        let physical = self.physical(&mut conn).await;
        Ok(PurgeReport {
            probe_hits: None,
            before,
            deleted,
            remaining,
            physical,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{execute_raw, fresh_postgres_database};

    #[tokio::test]
    async fn a_subjects_rows_go_and_everyone_elses_stay() {
        let url = fresh_postgres_database().await.unwrap();
        execute_raw(
            &url,
            "CREATE TABLE memories (tenant text, user_id text, fact text);
             CREATE INDEX memories_by_user ON memories (user_id);
             CREATE TABLE messages (tenant text, user_id text, body text);
             INSERT INTO memories SELECT 'acme', 'u' || (i % 3), 'fact ' || i FROM generate_series(1, 30) i;
             INSERT INTO messages SELECT 'acme', 'u' || (i % 3), 'message ' || i FROM generate_series(1, 12) i;
             INSERT INTO memories VALUES ('acme', 'u2-old', 'an alias row'), ('globex', 'u2', 'another tenant');",
        )
        .await
        .unwrap();
        let target = PostgresTarget {
            name: "app".into(),
            url: crate::config::Secret::Value(url.clone()),
            count: "SELECT (SELECT count(*) FROM memories WHERE tenant = $1 AND user_id = $2) + (SELECT count(*) FROM messages WHERE tenant = $1 AND user_id = $2)".into(),
            delete: vec![
                "DELETE FROM memories WHERE tenant = $1 AND user_id = $2".into(),
                "DELETE FROM messages WHERE tenant = $1 AND user_id = $2".into(),
            ],
            reindex: vec!["memories_by_user".into()],
            vacuum: vec!["memories".into(), "messages".into()],
        };
        let connector = PostgresConnector::new(url.clone(), target);
        let report = connector
            .purge("acme", &["u2".into(), "u2-old".into()], &[])
            .await
            .unwrap();
        assert_eq!(
            (report.before, report.deleted, report.remaining),
            (15, 15, 0),
            "{report:?}"
        );
        assert!(
            report.physical.contains("reindexed memories_by_user")
                && report.physical.contains("vacuumed messages"),
            "{}",
            report.physical
        );
        let others = execute_raw(&url, "DELETE FROM memories WHERE user_id IN ('u0', 'u1')")
            .await
            .unwrap();
        assert_eq!(others, 20, "other users keep every row");
        let globex = execute_raw(&url, "DELETE FROM memories WHERE tenant = 'globex'")
            .await
            .unwrap();
        assert_eq!(globex, 1, "other tenants too");
        // Idempotent: a second run finds nothing and fails nothing.
        let again = connector.purge("acme", &["u2".into()], &[]).await.unwrap();
        assert_eq!((again.before, again.deleted, again.remaining), (0, 0, 0));
    }

    #[tokio::test]
    async fn a_failing_statement_leaves_nothing_half_deleted() {
        let url = fresh_postgres_database().await.unwrap();
        execute_raw(&url, "CREATE TABLE memories (tenant text, user_id text); INSERT INTO memories VALUES ('acme', 'u1'), ('acme', 'u1');").await.unwrap();
        let target = PostgresTarget {
            name: "app".into(),
            url: crate::config::Secret::Value(url.clone()),
            count: "SELECT count(*) FROM memories WHERE tenant = $1 AND user_id = $2".into(),
            delete: vec![
                "DELETE FROM memories WHERE tenant = $1 AND user_id = $2".into(),
                "DELETE FROM missing_table WHERE $1 = $2".into(),
            ],
            reindex: vec![],
            vacuum: vec![],
        };
        let err = PostgresConnector::new(url.clone(), target)
            .purge("acme", &["u1".into()], &[])
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ConnectorError::Misconfigured(m) if m.contains("missing_table")),
            "a table that does not exist is a misconfiguration: {err}"
        );
        assert_eq!(
            execute_raw(&url, "DELETE FROM memories").await.unwrap(),
            2,
            "the first statement was rolled back"
        );
    }
}
