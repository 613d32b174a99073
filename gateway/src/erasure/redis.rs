//! Purging a subject's keys from Redis: `SCAN MATCH` with the configured patterns and `UNLINK`,
//! on every configured primary. Never `KEYS`: it blocks the server.

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;

use super::{Connector, ConnectorError, PurgeReport};
use crate::config::RedisTarget;

pub struct RedisConnector {
    target: RedisTarget,
}

impl RedisConnector {
    pub fn new(target: RedisTarget) -> Self {
        RedisConnector { target }
    }
}

/// Escapes the glob characters of a value put into a `MATCH` pattern, so that a subject named
/// `u*` matches only itself.
fn glob_escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn patterns(target: &RedisTarget, tenant: &str, keys: &[String]) -> Vec<String> {
    keys.iter()
        .flat_map(|key| {
            target.patterns.iter().map(move |p| {
                p.replace("{tenant}", &glob_escape(tenant))
                    .replace("{subject}", &glob_escape(key))
            })
        })
        .collect()
}

async fn scan(
    con: &mut MultiplexedConnection,
    pattern: &str,
) -> Result<Vec<String>, redis::RedisError> {
    let mut found = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(con)
            .await?;
        found.extend(keys);
        if next == 0 {
            found.sort();
            found.dedup();
            return Ok(found);
        }
        cursor = next;
    }
}

/// One `CONFIG GET` value; `None` when the server does not answer it (CONFIG disabled).
async fn config_value(con: &mut MultiplexedConnection, name: &str) -> Option<String> {
    let pair: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(con)
        .await
        .ok()?;
    pair.get(1).cloned()
}

/// What the server keeps on disk, as far as it says.
async fn persistence(con: &mut MultiplexedConnection) -> String {
    let aof = config_value(con, "appendonly").await;
    let save = config_value(con, "save").await;
    match (aof.as_deref(), save.as_deref()) {
        (Some("no"), Some("")) => {
            "done: keys unlinked (memory freed in the background); the server keeps nothing on disk"
                .to_owned()
        }
        (None, _) | (_, None) => {
            "keys unlinked; the server does not say what it persists (CONFIG is disabled)"
                .to_owned()
        }
        _ => "pending: keys unlinked; RDB/AOF files keep them until the next snapshot or rewrite"
            .to_owned(),
    }
}

#[async_trait]
impl Connector for RedisConnector {
    async fn purge(
        &self,
        tenant: &str,
        keys: &[String],
        _lineage: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        let name = &self.target.name;
        let patterns = patterns(&self.target, tenant, keys);
        let mut report = PurgeReport {
            probe_hits: None,
            before: 0,
            deleted: 0,
            remaining: 0,
            physical: String::new(),
        };
        let mut physical = Vec::new();
        for url in &self.target.urls {
            let failed = |e: redis::RedisError| ConnectorError::from_redis(name, &e);
            let client = redis::Client::open(url.as_str()).map_err(failed)?;
            let mut con = client
                .get_multiplexed_async_connection()
                .await
                .map_err(failed)?;
            for pattern in &patterns {
                let found = scan(&mut con, pattern).await.map_err(failed)?;
                report.before += found.len() as u64;
                for batch in found.chunks(500) {
                    let n: u64 = redis::cmd("UNLINK")
                        .arg(batch)
                        .query_async(&mut con)
                        .await
                        .map_err(failed)?;
                    report.deleted += n;
                }
                report.remaining += scan(&mut con, pattern).await.map_err(failed)?.len() as u64;
            }
            physical.push(persistence(&mut con).await);
        }
        physical.dedup();
        report.physical = physical.join("; ");
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str = "redis://127.0.0.1:6379";

    async fn connection() -> MultiplexedConnection {
        redis::Client::open(URL)
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .expect("Redis on 127.0.0.1:6379")
    }

    #[test]
    fn glob_characters_in_names_match_only_themselves() {
        let target = RedisTarget {
            name: "c".into(),
            urls: vec![],
            patterns: vec!["{tenant}:{subject}:*".into()],
        };
        assert_eq!(
            patterns(&target, "acme", &["u*".into(), "a[1]".into()]),
            ["acme:u\\*:*", "acme:a\\[1\\]:*"]
        );
    }

    #[tokio::test]
    async fn a_subjects_keys_go_on_every_pattern_and_no_other_key_does() {
        let mut con = connection().await;
        let tenant = format!("t{}", uuid::Uuid::new_v4().simple());
        let set = |k: String| redis::cmd("SET").arg(k).arg("v").to_owned();
        let mut pipe = redis::pipe();
        for i in 0..1500 {
            pipe.add_command(set(format!("{tenant}:u1:session:{i}")));
        }
        for i in 0..40 {
            pipe.add_command(set(format!("{tenant}:u2:session:{i}")));
        }
        pipe.add_command(set(format!("{tenant}:u*:x")));
        pipe.add_command(set(format!("cache:{tenant}:u1")));
        pipe.add_command(set(format!("{tenant}:u1-old:profile")));
        pipe.query_async::<()>(&mut con).await.unwrap();

        let target = RedisTarget {
            name: "cache".into(),
            urls: vec![URL.into()],
            patterns: vec![
                "{tenant}:{subject}:*".into(),
                "cache:{tenant}:{subject}".into(),
            ],
        };
        let connector = RedisConnector::new(target.clone());
        let report = connector
            .purge(&tenant, &["u1".into(), "u1-old".into()], &[])
            .await
            .unwrap();
        assert_eq!(
            (report.before, report.deleted, report.remaining),
            (1502, 1502, 0),
            "{report:?}"
        );
        assert!(!report.physical.is_empty());
        assert_eq!(
            scan(&mut con, &format!("{tenant}:u2:*"))
                .await
                .unwrap()
                .len(),
            40,
            "another subject keeps every key"
        );
        assert_eq!(
            scan(&mut con, &format!("{tenant}:u\\**"))
                .await
                .unwrap()
                .len(),
            1,
            "a key with a glob character in it stays"
        );

        let starred = RedisConnector::new(target)
            .purge(&tenant, &["u*".into()], &[])
            .await
            .unwrap();
        assert_eq!(
            starred.deleted, 1,
            "a subject named u* removes only its own key"
        );
        assert_eq!(
            scan(&mut con, &format!("{tenant}:u2:*"))
                .await
                .unwrap()
                .len(),
            40
        );
        let leftovers = scan(&mut con, &format!("{tenant}:*")).await.unwrap();
        let _: u64 = redis::cmd("UNLINK")
            .arg(&leftovers)
            .query_async(&mut con)
            .await
            .unwrap();
    }
}
