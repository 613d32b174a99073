//! Purging a subject from an agent app's own PostgreSQL tables (a pgvector `memories` table, a
//! `messages` table, ...): the configured statements, then the physical step — `REINDEX INDEX
//! CONCURRENTLY` (an HNSW index keeps deleted vectors until rebuilt) and `VACUUM (ANALYZE)`
//! (statistics hold sampled values) — reported apart, with every place that still holds the
//! deleted rows (free space, the WAL, its archive, replication slots) and its date or reason.

use async_trait::async_trait;
use sqlx::{Connection, PgConnection};

use std::sync::Arc;

use serde::Deserialize;

use super::{Target, TargetKind};
use crate::config::Secret;
use crate::purge::{Connector, ConnectorError, Copy, Physical, PurgeReport, Subjects};

/// A PostgreSQL database of the agent app. Every statement takes `$1` = tenant, `$2` = subject
/// key, and runs once per key of the erasure (the subject and its aliases).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresTarget {
    /// Names the target `postgres:<name>`.
    pub name: String,
    pub url: Secret,
    /// Counts the subject's rows (one number), before and after.
    pub count: String,
    /// Deletes the subject's rows; all run in one transaction.
    pub delete: Vec<String>,
    /// Lists the subject keys the tables hold in a tenant (`$1`), one per row. A replay after a
    /// restore needs it: by then Lethe knows an erased subject only by its reference, and finds
    /// its key again among these.
    #[serde(default)]
    pub subjects: Option<String>,
    /// Indexes rebuilt with `REINDEX INDEX CONCURRENTLY` afterwards (HNSW keeps deleted vectors).
    #[serde(default)]
    pub reindex: Vec<String>,
    /// Tables vacuumed afterwards.
    #[serde(default)]
    pub vacuum: Vec<String>,
    /// Tables whose vector indexes (HNSW, IVFFlat) are found in the live schema and rebuilt
    /// with `REINDEX INDEX CONCURRENTLY` afterwards; set for governed databases, not configured.
    #[serde(skip)]
    pub vector_tables: Vec<String>,
}

impl PostgresTarget {
    fn problems(&self) -> Vec<String> {
        let statements_ok = !self.count.trim().is_empty()
            && !self.delete.is_empty()
            && self.delete.iter().all(|d| !d.trim().is_empty());
        match statements_ok {
            true => Vec::new(),
            false => vec!["needs a count statement and at least one delete statement".to_owned()],
        }
    }
}

/// `[[erasure.postgres]]`: the agent app's own PostgreSQL tables, purged with configured
/// statements.
pub const KIND: TargetKind = TargetKind {
    name: "postgres",
    problems: |settings, _| read(settings).err().unwrap_or_default(),
    target: |settings, _| {
        let target = read(settings).map_err(|problems| problems.join("; "))?;
        connected(target)
    },
};

fn read(settings: &toml::Table) -> Result<PostgresTarget, Vec<String>> {
    let target: PostgresTarget = crate::config::read_all(settings.clone())?;
    match target.problems() {
        problems if problems.is_empty() => Ok(target),
        problems => Err(problems),
    }
}

/// The purge target of a PostgreSQL database (configured, or governed), its URL resolved.
pub fn connected(target: PostgresTarget) -> Result<Target, String> {
    let url = target.url.resolve().map_err(|e| format!("url: {e}"))?;
    let url = String::from_utf8(url).map_err(|_| "url is not text".to_owned())?;
    let name = format!("postgres:{}", target.name);
    Ok(Target::own(
        &name,
        Arc::new(PostgresConnector::new(url, target)),
    ))
}

pub struct PostgresConnector {
    url: String,
    target: PostgresTarget,
}

impl PostgresConnector {
    pub fn new(url: String, target: PostgresTarget) -> Self {
        PostgresConnector { url, target }
    }

    async fn connect(&self) -> Result<PgConnection, ConnectorError> {
        PgConnection::connect(&self.url)
            .await
            .map_err(|e| ConnectorError::from_sqlx(&self.target.name, &e))
    }

    /// Sum of the configured count statement over every key.
    async fn rows_of(
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

    /// The subjects' keys: those Lethe knows only by reference are found again among the keys
    /// the configured `subjects` statement lists.
    async fn keys_of(
        &self,
        conn: &mut PgConnection,
        subjects: &Subjects,
    ) -> Result<Vec<String>, ConnectorError> {
        if !subjects.any_forgotten() {
            return Ok(subjects.keys());
        }
        let Some(statement) = &self.target.subjects else {
            return Err(ConnectorError::Misconfigured(format!(
                "{}: Lethe keeps only the reference of an erased subject; configure `subjects` (a statement listing the tables' subject keys) to find it again",
                self.target.name
            )));
        };
        let owners: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(statement.clone()))
            .bind(subjects.tenant())
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| {
                ConnectorError::from_sqlx(&format!("{}: subjects", self.target.name), &e)
            })?;
        Ok(subjects
            .found_among(owners.iter().map(String::as_str))
            .keys())
    }

    /// Rebuilds indexes, vacuums and analyzes tables (statistics hold sampled values), and
    /// names what still holds the deleted rows: free space in the tables' files and the WAL from
    /// the deletion's LSN on, with the date the server's settings give, or why none can be given.
    async fn physical(&self, conn: &mut PgConnection, deletion: &str, keys: &[String]) -> Physical {
        let mut physical = Physical::default();
        let mut indexes = self.target.reindex.clone();
        for table in &self.target.vector_tables {
            match vector_indexes(conn, table).await {
                Ok(found) => indexes.extend(found),
                Err(e) => physical.remaining.push(Copy::unknown(
                    &format!("the vector indexes of {table}"),
                    "entries and vectors of the deleted rows",
                    &format!("they could not be listed: {e}"),
                    "an index keeps deleted entries until it is rebuilt",
                )),
            }
        }
        for index in &indexes {
            let sql = format!("REINDEX INDEX CONCURRENTLY {}", quote(index));
            match sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut *conn)
                .await
            {
                Ok(_) => physical
                    .done
                    .push(format!("index {index} rebuilt without the deleted entries")),
                Err(e) => physical.remaining.push(Copy::unknown(
                    &format!("index {index}"),
                    "entries (and for HNSW, vectors) of the deleted rows",
                    &format!("REINDEX failed: {e}"),
                    "an index keeps deleted entries until it is rebuilt",
                )),
            }
        }
        for table in &self.target.vacuum {
            let sql = format!("VACUUM (ANALYZE) {}", quote(table));
            match sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
                .execute(&mut *conn)
                .await
            {
                Ok(_) => {
                    physical.done.push(format!("table {table} vacuumed and analyzed (its statistics no longer sample the deleted rows)"));
                    physical.remaining.push(Copy::unknown(
                        &format!("table {table}'s data files (free space)"),
                        "bytes of the deleted rows",
                        "VACUUM makes the space of dead rows reusable but does not overwrite it",
                        "the space is overwritten only when later rows need it",
                    ));
                }
                Err(e) => physical.remaining.push(Copy::unknown(
                    &format!("table {table} and its statistics (pg_statistic)"),
                    "the deleted rows, and values sampled from them",
                    &format!("VACUUM (ANALYZE) failed: {e}"),
                    "autovacuum reclaims and analyzes on its own schedule",
                )),
            }
        }
        if !self.target.vacuum.is_empty() {
            self.statistics(conn, keys, &mut physical).await;
        }
        if self.target.vacuum.is_empty() {
            physical.remaining.push(Copy::unknown(
                "the purged tables and their statistics (pg_statistic)",
                "the deleted rows as dead tuples, and values sampled from them",
                "no table is named in vacuum, so Lethe neither vacuums nor analyzes",
                "autovacuum's schedule; name the tables in vacuum",
            ));
        }
        physical.remaining.extend(wal(conn, deletion).await);
        physical
    }
}

/// The HNSW and IVFFlat indexes of a table (pgvector's, which keep deleted vectors until
/// rebuilt), schema-qualified.
async fn vector_indexes(conn: &mut PgConnection, table: &str) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT n.nspname || '.' || c.relname FROM pg_catalog.pg_index i
           JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
           JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
           JOIN pg_catalog.pg_am a ON a.oid = c.relam
          WHERE i.indrelid = $1::regclass AND a.amname IN ('hnsw', 'ivfflat')
          ORDER BY 1",
    )
    .bind(table)
    .fetch_all(&mut *conn)
    .await
}

impl PostgresConnector {
    /// ANALYZE replaced the statistics, but the rows it replaced stay in `pg_statistic`'s file
    /// (as dead versions, and after a plain VACUUM as free space): the catalog is rewritten with
    /// `VACUUM FULL` where the role may (a superuser's; the lock is brief, the table small). Then
    /// the physical verification: the statistics of the vacuumed tables, as `pg_stats` shows
    /// them, must name no key.
    async fn statistics(&self, conn: &mut PgConnection, keys: &[String], physical: &mut Physical) {
        match sqlx::raw_sql("VACUUM FULL pg_catalog.pg_statistic")
            .execute(&mut *conn)
            .await
        {
            Ok(_) => physical.done.push(
                "pg_statistic rewritten by VACUUM FULL (the replaced statistics are gone from its file)".into(),
            ),
            Err(e) => physical.remaining.push(Copy::unknown(
                "pg_statistic's data file (replaced statistics rows)",
                "values sampled from the deleted rows, in the statistics ANALYZE replaced",
                &format!("the catalog could not be rewritten: {e}"),
                "the bytes are overwritten only when later statistics need the space",
            )),
        }
        let tables: Vec<String> = self
            .target
            .vacuum
            .iter()
            .map(|t| t.rsplit('.').next().unwrap_or(t).to_owned())
            .collect();
        let patterns: Vec<String> = keys
            .iter()
            .map(|k| {
                format!(
                    "%{}%",
                    k.replace('\\', "\\\\")
                        .replace('%', "\\%")
                        .replace('_', "\\_")
                )
            })
            .collect();
        let found: Result<i64, sqlx::Error> = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stats WHERE tablename = ANY($1)
             AND concat_ws(' ', most_common_vals::text, histogram_bounds::text) LIKE ANY($2)",
        )
        .bind(&tables)
        .bind(&patterns)
        .fetch_one(&mut *conn)
        .await;
        let shown = tables.join(", ");
        match found {
            Ok(0) => physical.verified.push(format!(
                "pg_stats of {shown} searched for the subject's {} keys: none found",
                keys.len()
            )),
            Ok(n) => {
                physical.verified.push(format!(
                    "pg_stats of {shown} searched for the subject's {} keys: found in {n} columns",
                    keys.len()
                ));
                physical.remaining.push(Copy::unknown(
                    &format!("statistics of {shown} (pg_statistic)"),
                    &format!("a value equal to or containing one of the subject's keys, in {n} columns' sampled values (statistics do not tell tenants apart)"),
                    "found by the physical verification after ANALYZE",
                    "the next ANALYZE samples again; autovacuum decides when",
                ));
            }
            Err(e) => physical
                .verified
                .push(format!("pg_stats of {shown} not searched: {e}")),
        }
    }
}

/// A duration setting as the server shows it (`30s`, `5min`, `1h`, `1d`).
fn pg_interval(text: &str) -> Option<std::time::Duration> {
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().ok()?;
    let seconds = match unit {
        "ms" => return Some(std::time::Duration::from_millis(n)),
        "s" => n,
        "min" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        "d" => n.checked_mul(86_400)?,
        _ => return None,
    };
    Some(std::time::Duration::from_secs(seconds))
}

/// One server setting, as text.
async fn setting(conn: &mut PgConnection, name: &str) -> Option<String> {
    sqlx::query_scalar::<_, String>("SELECT current_setting($1)")
        .bind(name)
        .fetch_one(&mut *conn)
        .await
        .ok()
}

/// The WAL that holds the deleted rows: from the deletion's LSN on, in `pg_wal` until the server
/// removes or overwrites the segments, and wherever archiving and replication slots keep them.
async fn wal(conn: &mut PgConnection, deletion: &str) -> Vec<Copy> {
    let place = format!("pg_wal (segments from LSN {deletion})");
    let holds = "the deleted rows, as written and as deleted";
    let mut copies = Vec::new();
    if setting(conn, "archive_mode")
        .await
        .is_some_and(|m| m != "off")
    {
        copies.push(Copy::unknown(
            "the WAL archive (archive_command)",
            holds,
            "every WAL segment is archived",
            "the archive keeps segments as long as its own retention says; give this target a backup retention",
        ));
    }
    let slots: Vec<String> = sqlx::query_scalar(
        "SELECT slot_name::text FROM pg_replication_slots
         WHERE restart_lsn IS NULL OR restart_lsn <= $1::pg_lsn ORDER BY slot_name",
    )
    .bind(deletion)
    .fetch_all(&mut *conn)
    .await
    .unwrap_or_default();
    if !slots.is_empty() {
        copies.push(Copy::unknown(
            &place,
            holds,
            &format!(
                "replication slot(s) {} hold WAL from before the deletion",
                slots.join(", ")
            ),
            "the segments stay until every slot has moved past the deletion",
        ));
        return copies;
    }
    let recycle = setting(conn, "wal_recycle")
        .await
        .unwrap_or_else(|| "on".into());
    let keep = setting(conn, "wal_keep_size")
        .await
        .unwrap_or_else(|| "?".into());
    let timeout = setting(conn, "checkpoint_timeout").await;
    let seconds = timeout.as_deref().and_then(pg_interval);
    copies.push(match (recycle.as_str(), keep.as_str(), seconds) {
        // Segments before the last checkpoint's redo point go at the next one; two checkpoint
        // intervals cover both.
        ("off", "0", Some(interval)) => Copy::until(
            &place,
            holds,
            "the segments are removed once two checkpoints have passed the deletion",
            crate::now() + chrono::TimeDelta::from_std(interval * 2).unwrap_or(chrono::TimeDelta::MAX),
        ),
        ("off", _, _) => Copy::unknown(
            &place,
            holds,
            &format!("wal_keep_size = {keep} keeps segments"),
            "until that much newer WAL has been written",
        ),
        _ => Copy::unknown(
            &place,
            holds,
            "PostgreSQL recycles old segments by renaming them (wal_recycle = on): their bytes stay until new WAL overwrites them",
            "depends on how much WAL the server writes afterwards",
        ),
    });
    copies
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
    async fn count(
        &self,
        subjects: &Subjects,
        _lineage: &[(String, String)],
    ) -> Result<u64, ConnectorError> {
        let mut conn = self.connect().await?;
        // The configured statements run read-only here: a dry run changes nothing, whatever
        // they say.
        let mut tx = conn
            .begin()
            .await
            .map_err(|e| ConnectorError::from_sqlx(&self.target.name, &e))?;
        sqlx::query("SET TRANSACTION READ ONLY")
            .execute(&mut *tx)
            .await
            .map_err(|e| ConnectorError::from_sqlx(&self.target.name, &e))?;
        let keys = self.keys_of(&mut tx, subjects).await?;
        self.rows_of(&mut tx, subjects.tenant(), &keys).await
    }

    async fn purge(
        &self,
        subjects: &Subjects,
        _lineage: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        let name = &self.target.name;
        let failed = |what: &str| {
            let what = format!("{name}{what}");
            move |e: sqlx::Error| ConnectorError::from_sqlx(&what, &e)
        };
        let mut conn = self.connect().await?;
        let tenant = subjects.tenant();
        let keys = &self.keys_of(&mut conn, subjects).await?;
        let before = self.rows_of(&mut conn, tenant, keys).await?;
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
        let deletion: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&mut conn)
            .await
            .map_err(failed(": current WAL position"))?;
        let remaining = self.rows_of(&mut conn, tenant, keys).await?;
        let physical = self.physical(&mut conn, &deletion, keys).await;
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

    #[test]
    fn duration_settings_read_as_the_server_shows_them() {
        assert_eq!(
            pg_interval("5min"),
            Some(std::time::Duration::from_secs(300))
        );
        assert_eq!(pg_interval("30s"), Some(std::time::Duration::from_secs(30)));
        assert_eq!(
            pg_interval("1d"),
            Some(std::time::Duration::from_secs(86_400))
        );
        assert_eq!(pg_interval("soon"), None);
    }

    /// Even a count statement that deletes (a data-modifying CTE) changes nothing in a dry run.
    #[tokio::test]
    async fn the_dry_run_is_read_only_whatever_the_count_statement_says() {
        let url = fresh_postgres_database().await.unwrap();
        execute_raw(
            &url,
            "CREATE TABLE memories (tenant text, user_id text); INSERT INTO memories VALUES ('acme', 'u1'), ('acme', 'u1');",
        )
        .await
        .unwrap();
        let target = PostgresTarget {
            name: "app".into(),
            url: crate::config::Secret::Value(url.clone()),
            count: "WITH gone AS (DELETE FROM memories WHERE tenant = $1 AND user_id = $2 RETURNING 1) SELECT count(*) FROM gone".into(),
            delete: vec![],
            subjects: None,
            reindex: vec![],
            vacuum: vec![],
            vector_tables: vec![],
        };
        let counted = PostgresConnector::new(url.clone(), target)
            .count(&crate::testing::subjects("acme", &["u1"]), &[])
            .await;
        assert!(counted.is_err(), "{counted:?}");
        let left = execute_raw(&url, "UPDATE memories SET user_id = user_id")
            .await
            .unwrap();
        assert_eq!(left, 2, "both rows are still there");
    }

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
            subjects: None,
            reindex: vec!["memories_by_user".into()],
            vacuum: vec!["memories".into(), "messages".into()],
            vector_tables: vec![],
        };
        execute_raw(&url, "ANALYZE memories").await.unwrap();
        let sampled_before: String = {
            use sqlx::Connection as _;
            let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
            sqlx::query_scalar("SELECT most_common_vals::text FROM pg_stats WHERE tablename = 'memories' AND attname = 'user_id'")
                .fetch_one(&mut conn)
                .await
                .unwrap()
        };
        assert!(sampled_before.contains("u2"), "{sampled_before}");
        let connector = PostgresConnector::new(url.clone(), target);
        let subjects = crate::testing::subjects("acme", &["u2", "u2-old"]);
        assert_eq!(
            connector.count(&subjects, &[]).await.unwrap(),
            15,
            "the dry run counts what the purge will find"
        );
        let report = connector.purge(&subjects, &[]).await.unwrap();
        assert_eq!(
            (report.before, report.deleted, report.remaining),
            (15, 15, 0),
            "{report:?}"
        );
        assert_eq!(connector.count(&subjects, &[]).await.unwrap(), 0);
        let done = report.physical.done.join("; ");
        assert!(
            done.contains("index memories_by_user rebuilt")
                && done.contains("table messages vacuumed and analyzed")
                && done.contains("pg_statistic rewritten by VACUUM FULL"),
            "{done}"
        );
        assert_eq!(
            report.physical.verified,
            ["pg_stats of memories, messages searched for the subject's 2 keys: none found"],
            "the statistics held the key before: {sampled_before}"
        );
        let places: Vec<&str> = report
            .physical
            .remaining
            .iter()
            .map(|c| c.place.as_str())
            .collect();
        assert!(
            places
                .iter()
                .any(|p| p.starts_with("pg_wal (segments from LSN ")),
            "{places:?}"
        );
        assert!(
            report
                .physical
                .remaining
                .iter()
                .all(|c| c.until.is_some() != c.unknown.is_some()),
            "every copy has a date or a reason: {:?}",
            report.physical.remaining
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
        let again = connector
            .purge(&crate::testing::subjects("acme", &["u2"]), &[])
            .await
            .unwrap();
        assert_eq!((again.before, again.deleted, again.remaining), (0, 0, 0));
    }

    /// A replay knows an erased subject by reference only: without a `subjects` statement its
    /// key cannot be found again, and the target says so instead of counting nothing.
    #[tokio::test]
    async fn a_subject_known_only_by_reference_needs_the_subjects_statement() {
        let url = fresh_postgres_database().await.unwrap();
        execute_raw(&url, "CREATE TABLE memories (tenant text, user_id text); INSERT INTO memories VALUES ('acme', 'u1'), ('acme', 'u1'), ('acme', 'u2');").await.unwrap();
        let target = |subjects: Option<&str>| PostgresTarget {
            name: "app".into(),
            url: crate::config::Secret::Value(url.clone()),
            count: "SELECT count(*) FROM memories WHERE tenant = $1 AND user_id = $2".into(),
            delete: vec!["DELETE FROM memories WHERE tenant = $1 AND user_id = $2".into()],
            subjects: subjects.map(str::to_owned),
            reindex: vec![],
            vacuum: vec![],
            vector_tables: vec![],
        };
        let forgotten = lethe_policy::audit::forgotten(crate::testing::AUDIT_KEY, "acme", "u1");
        let erased = crate::testing::subjects("acme", &[&forgotten]);
        let refused = PostgresConnector::new(url.clone(), target(None))
            .purge(&erased, &[])
            .await
            .unwrap_err();
        assert!(
            matches!(refused, ConnectorError::Misconfigured(ref m) if m.contains("configure `subjects`")),
            "{refused}"
        );
        let report = PostgresConnector::new(
            url.clone(),
            target(Some(
                "SELECT DISTINCT user_id FROM memories WHERE tenant = $1",
            )),
        )
        .purge(&erased, &[])
        .await
        .unwrap();
        assert_eq!((report.before, report.deleted, report.remaining), (2, 2, 0));
        let rows = execute_raw(&url, "DELETE FROM memories WHERE user_id = 'u2'")
            .await
            .unwrap();
        assert_eq!(rows, 1, "the other subject's row stayed");
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
            subjects: None,
            reindex: vec![],
            vacuum: vec![],
            vector_tables: vec![],
        };
        let err = PostgresConnector::new(url.clone(), target)
            .purge(&crate::testing::subjects("acme", &["u1"]), &[])
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
