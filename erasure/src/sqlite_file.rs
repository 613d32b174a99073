//! Purging SQLite files that reference another store's items, such as Mem0's `history.db`: it
//! has no user column, only the memory ids the vector store holds, so rows are deleted by the ids
//! lineage recorded for the subject there. `secure_delete` and `VACUUM` make the removal physical
//! (Mem0 keeps the memory text in the ADD and DELETE rows).

use std::str::FromStr;

use async_trait::async_trait;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, SqliteConnection};

use std::path::PathBuf;

use serde::Deserialize;

use super::{Target, TargetKind};
use crate::config::Config;
use crate::purge::{Connector, ConnectorError, Copy, Physical, PurgeReport, Subjects};

/// A SQLite file whose rows name items of another store, deleted by the ids lineage holds there.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqliteTarget {
    /// Names the target `sqlite:<name>`.
    pub name: String,
    pub path: PathBuf,
    pub table: String,
    /// The column holding the other store's item id (Mem0: `memory_id`).
    pub id_column: String,
    /// The route whose lineage holds those ids (Mem0 over Chroma: `chroma`).
    pub lineage_store: String,
}

/// `[[erasure.sqlite]]`: SQLite files that reference another store's items by id (Mem0's
/// `history.db`); each follows the lineage of the route it names.
pub const KIND: TargetKind = TargetKind {
    name: "sqlite",
    problems: |settings, config| read(settings, config).err().unwrap_or_default(),
    target: |settings, config| {
        let target = read(settings, config).map_err(|problems| problems.join("; "))?;
        Ok(Target {
            lineage_store: target.lineage_store.clone(),
            owns_lineage: false,
            connector: std::sync::Arc::new(SqliteFileConnector::new(target)),
        })
    },
};

fn read(settings: &toml::Table, config: &Config) -> Result<SqliteTarget, Vec<String>> {
    let target: SqliteTarget = crate::config::read_all(settings.clone())?;
    match config.routes.iter().any(|r| r.name == target.lineage_store) {
        true => Ok(target),
        false => Err(vec![format!(
            "lineage_store {:?} is not a route",
            target.lineage_store
        )]),
    }
}

pub struct SqliteFileConnector {
    target: SqliteTarget,
}

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl SqliteFileConnector {
    pub fn new(target: SqliteTarget) -> Self {
        SqliteFileConnector { target }
    }

    /// Runs `verb` (`SELECT count(*)` or `DELETE`) over the rows naming any of `ids`.
    /// The file, which must exist: a store Lethe purges is never created by it. `read_only`
    /// for a dry run.
    async fn open(&self, read_only: bool) -> Result<SqliteConnection, ConnectorError> {
        let name = &self.target.name;
        let options =
            SqliteConnectOptions::from_str(&format!("sqlite://{}", self.target.path.display()))
                .map_err(|e| ConnectorError::from_sqlx(name, &e))?
                .create_if_missing(false)
                .read_only(read_only);
        options.connect().await.map_err(|e| {
            ConnectorError::from_sqlx(
                &format!("{name}: cannot open {}", self.target.path.display()),
                &e,
            )
        })
    }

    async fn over_ids(
        &self,
        conn: &mut SqliteConnection,
        verb: &str,
        ids: &[String],
    ) -> Result<u64, ConnectorError> {
        let mut total = 0u64;
        for chunk in ids.chunks(500) {
            let placeholders = vec!["?"; chunk.len()].join(", ");
            let sql = format!(
                "{verb} FROM {} WHERE {} IN ({placeholders})",
                quote(&self.target.table),
                quote(&self.target.id_column)
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql.clone()));
            let mut scalar = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql));
            for id in chunk {
                query = query.bind(id.clone());
                scalar = scalar.bind(id.clone());
            }
            let n = if verb.starts_with("SELECT") {
                u64::try_from(
                    scalar
                        .fetch_one(&mut *conn)
                        .await
                        .map_err(|e| ConnectorError::from_sqlx(&self.target.name, &e))?,
                )
                .unwrap_or(0)
            } else {
                query
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| ConnectorError::from_sqlx(&self.target.name, &e))?
                    .rows_affected()
            };
            total += n;
        }
        Ok(total)
    }
}

/// The item ids lineage names, each once.
fn ids_of(lineage: &[(String, String)]) -> Vec<String> {
    let mut ids: Vec<String> = lineage.iter().map(|(_, id)| id.clone()).collect();
    ids.sort();
    ids.dedup();
    ids
}

#[async_trait]
impl Connector for SqliteFileConnector {
    async fn count(
        &self,
        _subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<u64, ConnectorError> {
        let mut conn = self.open(true).await?;
        self.over_ids(&mut conn, "SELECT count(*)", &ids_of(lineage))
            .await
    }

    async fn purge(
        &self,
        subjects: &Subjects,
        lineage: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        let name = &self.target.name;
        let failed = |e: sqlx::Error| ConnectorError::from_sqlx(name, &e);
        let mut conn = self.open(false).await?;
        let ids = ids_of(lineage);
        sqlx::query("PRAGMA secure_delete = ON")
            .execute(&mut conn)
            .await
            .map_err(failed)?;
        let before = self.over_ids(&mut conn, "SELECT count(*)", &ids).await?;
        let deleted = self.over_ids(&mut conn, "DELETE", &ids).await?;
        let remaining = self.over_ids(&mut conn, "SELECT count(*)", &ids).await?;
        // Rewrite the file and empty a write-ahead log, so the old pages are gone from disk.
        let zeroed = "rows deleted with secure_delete (their pages zeroed)".to_owned();
        let physical = match sqlx::raw_sql("VACUUM; PRAGMA wal_checkpoint(TRUNCATE);")
            .execute(&mut conn)
            .await
        {
            Ok(_) => Physical::done([
                zeroed,
                "file rewritten by VACUUM, write-ahead log truncated".to_owned(),
            ]),
            Err(e) => Physical::done([zeroed]).with(Copy::unknown(
                &format!("{}-wal", self.target.path.display()),
                "pages of the deleted rows as they were before the delete",
                &format!("VACUUM failed ({e}), so the write-ahead log was not truncated"),
                "SQLite overwrites the log once it checkpoints it, which depends on later writes",
            )),
        };
        drop(conn);
        let mut physical = physical;
        let mut needles = ids;
        needles.extend(subjects.keys());
        self.verify(&mut physical, &needles);
        Ok(PurgeReport {
            probe_hits: None,
            before,
            deleted,
            remaining,
            physical,
        })
    }

    /// The rows of other subjects' items it follows (an erased derivative's): deleted by id,
    /// whoever lineage names (the file names no owner).
    async fn delete_items(
        &self,
        _collection: &str,
        items: &[crate::state::ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        let mut conn = self.open(false).await?;
        sqlx::query("PRAGMA secure_delete = ON")
            .execute(&mut conn)
            .await
            .map_err(|e| ConnectorError::from_sqlx(&self.target.name, &e))?;
        let ids: Vec<String> = items.iter().map(|i| i.item_id.clone()).collect();
        self.over_ids(&mut conn, "DELETE", &ids).await
    }

    async fn held_items(
        &self,
        _collection: &str,
        items: &[crate::state::ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        let mut conn = self.open(true).await?;
        let ids: Vec<String> = items.iter().map(|i| i.item_id.clone()).collect();
        self.over_ids(&mut conn, "SELECT count(*)", &ids).await
    }
}

impl SqliteFileConnector {
    /// The physical verification: the database file and its write-ahead log, read byte for
    /// byte after the purge, must hold none of the subject's item ids and keys.
    fn verify(&self, physical: &mut Physical, needles: &[String]) {
        let path = &self.target.path;
        let mut wal = path.clone().into_os_string();
        wal.push("-wal");
        for file in [path.clone(), wal.into()] {
            let shown = file.display().to_string();
            let bytes = match std::fs::read(&file) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    physical.verified.push(format!("{shown}: not read ({e})"));
                    continue;
                }
            };
            let found = needles
                .iter()
                .filter(|n| !n.is_empty() && contains(&bytes, n.as_bytes()))
                .count();
            physical.verified.push(format!(
                "{shown}: {} bytes searched for {} item ids and keys of the subject, {found} found",
                bytes.len(),
                needles.len()
            ));
            if found > 0 {
                physical.remaining.push(Copy::unknown(
                    &shown,
                    &format!("{found} of the subject's item ids and keys"),
                    "found in the file's bytes by the physical verification after the purge",
                    "SQLite overwrites the bytes only when later writes reuse their pages",
                ));
            }
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn mem0_history_rows_go_by_memory_id_and_their_text_leaves_the_file() {
        let dir =
            std::env::temp_dir().join(format!("lethe-mem0-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.db");
        let mut conn = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .unwrap()
            .create_if_missing(true)
            .connect()
            .await
            .unwrap();
        // Mem0's schema, with the rows an ADD and a DELETE leave behind.
        sqlx::raw_sql(
            "PRAGMA secure_delete = OFF;
             CREATE TABLE history (id TEXT PRIMARY KEY, memory_id TEXT, old_memory TEXT, new_memory TEXT, event TEXT,
                                   created_at DATETIME, updated_at DATETIME, is_deleted INTEGER, actor_id TEXT, role TEXT);
             INSERT INTO history VALUES ('h1', 'm1', NULL, 'likes green tea', 'ADD', NULL, NULL, 0, NULL, 'user');
             INSERT INTO history VALUES ('h2', 'm2', NULL, 'allergic to peanuts', 'ADD', NULL, NULL, 0, NULL, 'user');
             INSERT INTO history VALUES ('h3', 'm1', 'likes green tea', NULL, 'DELETE', NULL, NULL, 1, NULL, 'user');
             INSERT INTO history VALUES ('h4', 'm9', NULL, 'prefers window seats', 'ADD', NULL, NULL, 0, NULL, 'user');",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        drop(conn);
        let target = SqliteTarget {
            name: "mem0_history".into(),
            path: path.clone(),
            table: "history".into(),
            id_column: "memory_id".into(),
            lineage_store: "chroma".into(),
        };
        let lineage = [
            ("c".to_owned(), "m1".to_owned()),
            ("c".to_owned(), "m2".to_owned()),
        ];
        let connector = SqliteFileConnector::new(target);
        let subjects = crate::testing::subjects("acme", &["u1"]);
        assert_eq!(
            connector.count(&subjects, &lineage).await.unwrap(),
            3,
            "the dry run counts what the purge will find"
        );
        let report = connector.purge(&subjects, &lineage).await.unwrap();
        assert_eq!(
            (report.before, report.deleted, report.remaining),
            (3, 3, 0),
            "{report:?}"
        );
        assert_eq!(connector.count(&subjects, &lineage).await.unwrap(), 0);
        assert!(
            report.physical.remaining.is_empty(),
            "{:?}",
            report.physical
        );
        assert_eq!(report.physical.done.len(), 2);
        assert_eq!(report.physical.verified.len(), 1, "{:?}", report.physical);
        assert!(
            report.physical.verified[0]
                .ends_with("for 3 item ids and keys of the subject, 0 found"),
            "{:?}",
            report.physical
        );
        let bytes = std::fs::read(&path).unwrap();
        let contains = |needle: &str| bytes.windows(needle.len()).any(|w| w == needle.as_bytes());
        assert!(
            !contains("green tea") && !contains("peanuts"),
            "the text is gone from the file itself"
        );
        assert!(contains("window seats"), "another subject's memory stays");
    }

    #[test]
    fn what_the_verification_finds_in_the_files_is_a_remaining_copy() {
        let dir =
            std::env::temp_dir().join(format!("lethe-verify-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.db");
        std::fs::write(&path, b"....mem-7f....").unwrap();
        std::fs::write(dir.join("history.db-wal"), b"....u1-key....").unwrap();
        let connector = SqliteFileConnector::new(SqliteTarget {
            name: "h".into(),
            path: path.clone(),
            table: "history".into(),
            id_column: "memory_id".into(),
            lineage_store: "chroma".into(),
        });
        let mut physical = Physical::default();
        connector.verify(
            &mut physical,
            &["mem-7f".into(), "u1-key".into(), "other".into()],
        );
        assert_eq!(physical.verified.len(), 2, "the file and its log");
        let places: Vec<&str> = physical
            .remaining
            .iter()
            .map(|c| c.place.as_str())
            .collect();
        let wal = format!("{}-wal", path.display());
        assert_eq!(places, [path.display().to_string().as_str(), wal.as_str()]);
        assert!(
            physical
                .remaining
                .iter()
                .all(|c| c.holds.starts_with("1 of") && c.unknown.is_some())
        );
    }
}
