//! Purging a subject's keys from Redis: `SCAN MATCH` with the patterns and `UNLINK`, on every
//! primary; the keys lineage names for the sweeper. Never `KEYS`: it blocks the server. It purges
//! a Redis route's store, and the `[[erasure.redis]]` deployments no route fronts.

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;

use serde::Deserialize;

use crate::erasure::{Target, TargetKind};
use crate::purge::{Connector, ConnectorError, Copy, Physical, PurgeReport, Subjects};
use crate::state::ExpiredItem;

/// A Redis deployment: every primary is scanned with every pattern.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisTarget {
    /// Names the target `redis:<name>`.
    pub name: String,
    /// `redis://host:port[/db]` of every primary.
    pub urls: Vec<String>,
    /// Key patterns with `{tenant}` and `{subject}`, e.g. `{tenant}:{subject}:*`.
    pub patterns: Vec<String>,
}

impl RedisTarget {
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.urls.is_empty() || self.urls.iter().any(|u| !u.starts_with("redis://")) {
            problems.push(
                "urls must list every primary as redis://host:port (rediss:// is not supported: Lethe's Redis client is built without TLS; reach a TLS primary through a local TLS tunnel)".to_owned(),
            );
        }
        if self.patterns.is_empty() || self.patterns.iter().any(|p| !p.contains("{subject}")) {
            problems.push(
                "every pattern must contain {subject}, or it would match other subjects' keys"
                    .to_owned(),
            );
        }
        problems
    }
}

/// `[[erasure.redis]]`: Redis deployments whose keys name the subject, that no route fronts.
pub const TARGET_KIND: TargetKind = TargetKind {
    name: "redis",
    problems: |settings, _| read(settings).err().unwrap_or_default(),
    target: |settings, _| {
        let target = read(settings).map_err(|problems| problems.join("; "))?;
        let name = format!("redis:{}", target.name);
        Ok(Target::own(
            &name,
            std::sync::Arc::new(RedisConnector::new(target)),
        ))
    },
};

fn read(settings: &toml::Table) -> Result<RedisTarget, Vec<String>> {
    let target: RedisTarget = crate::config::read_all(settings.clone())?;
    match target.problems() {
        problems if problems.is_empty() => Ok(target),
        problems => Err(problems),
    }
}

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

/// The owners a key may name under a pattern: for `{tenant}:{subject}:*`, every leading part of
/// what follows `acme:` in `acme:u1:3` (`u`, `u1`, `u1:`, ...), since a subject may hold the
/// separator.
fn candidates<'a>(pattern: &str, tenant: &str, key: &'a str) -> Vec<&'a str> {
    let Some((before, _)) = pattern.split_once("{subject}") else {
        return Vec::new();
    };
    let prefix = before.replace("{tenant}", tenant);
    let Some(rest) = key.strip_prefix(prefix.as_str()) else {
        return Vec::new();
    };
    rest.char_indices()
        .skip(1)
        .map(|(i, _)| &rest[..i])
        .chain(std::iter::once(rest))
        .filter(|c| !c.is_empty())
        .collect()
}

/// The subjects' keys, those Lethe knows only by reference found again among the keys the
/// patterns could hold (every subject's, searched with `*` in its place).
async fn keys_of(
    con: &mut MultiplexedConnection,
    target: &RedisTarget,
    subjects: &Subjects,
) -> Result<Vec<String>, redis::RedisError> {
    if !subjects.any_forgotten() {
        return Ok(subjects.keys());
    }
    let tenant = subjects.tenant();
    let mut owners = BTreeSet::new();
    for pattern in &target.patterns {
        let anyone = pattern
            .replace("{tenant}", &glob_escape(tenant))
            .replace("{subject}", "*");
        for key in scan(con, &anyone).await? {
            owners.extend(
                candidates(pattern, tenant, &key)
                    .into_iter()
                    .map(str::to_owned),
            );
        }
    }
    Ok(subjects
        .found_among(owners.iter().map(String::as_str))
        .keys())
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

/// One field of `INFO <section>`.
async fn info_field(
    con: &mut MultiplexedConnection,
    section: &str,
    field: &str,
) -> Result<String, redis::RedisError> {
    let info: String = redis::cmd("INFO").arg(section).query_async(con).await?;
    Ok(info
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_default()
        .trim()
        .to_owned())
}

/// How long Lethe waits for the server to finish rewriting its files.
const REWRITE_DEADLINE: Duration = Duration::from_secs(300);

/// A background rewrite of the server's files, and the `INFO persistence` fields that follow it.
struct Rewrite<'a> {
    /// `BGREWRITEAOF` or `BGSAVE`.
    command: &'a str,
    /// Non-zero while one runs or waits to run.
    in_progress: &'a [&'a str],
    /// How the last one ended.
    status: &'a str,
    /// How many have been started since the server started (Redis 7; counted when the child
    /// is forked): ours is done once it moved and none is in progress.
    started: &'a str,
}

/// Starts a background rewrite and waits until the server reports it finished (its count moved
/// and none is in progress), and whether it went well. A server busy with another child process
/// refuses the command: it is asked again until the deadline.
async fn rewrite(con: &mut MultiplexedConnection, r: &Rewrite<'_>) -> Result<(), String> {
    let done = async |con: &mut MultiplexedConnection| -> Result<bool, String> {
        for field in r.in_progress {
            if info_field(con, "persistence", field)
                .await
                .map_err(|e| e.to_string())?
                != "0"
            {
                return Ok(false);
            }
        }
        Ok(true)
    };
    let started = async |con: &mut MultiplexedConnection| -> Result<Option<u64>, String> {
        Ok(info_field(con, "persistence", r.started)
            .await
            .map_err(|e| e.to_string())?
            .parse()
            .ok())
    };
    let deadline = tokio::time::Instant::now() + REWRITE_DEADLINE;
    let late = |what: &str| format!("{what} within {} s", REWRITE_DEADLINE.as_secs());
    // One already running holds the old contents: let it end, then start ours.
    while !done(con).await? {
        if tokio::time::Instant::now() > deadline {
            return Err(late("an earlier rewrite did not end"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = started(con).await?;
    loop {
        match redis::cmd(r.command).query_async::<()>(con).await {
            Ok(()) => break,
            // Another child (a rewrite just ending, a replica's sync) holds the server.
            Err(e) if e.to_string().contains("in progress") => {
                if tokio::time::Instant::now() > deadline {
                    return Err(format!("{} refused until the deadline: {e}", r.command));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("{} refused: {e}", r.command)),
        }
    }
    loop {
        let moved = match (before, started(con).await?) {
            (Some(before), Some(now)) => now > before,
            _ => true,
        };
        if moved && done(con).await? {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(late(&format!("{} did not finish", r.command)));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    match info_field(con, "persistence", r.status)
        .await
        .map_err(|e| e.to_string())?
        .as_str()
    {
        "ok" => Ok(()),
        other => Err(format!("{} ended with status {other:?}", r.command)),
    }
}

/// Once the keys are unlinked, the server's files are rewritten without them (the AOF, a fresh
/// RDB snapshot), so that nothing of the subject is left on its disk; what cannot be rewritten
/// is named.
async fn physical(con: &mut MultiplexedConnection, server: &str) -> Physical {
    let mut physical = Physical::done([format!("{server}: keys unlinked")]);
    let (Some(aof), Some(save)) = (
        config_value(con, "appendonly").await,
        config_value(con, "save").await,
    ) else {
        return physical.with(Copy::unknown(
            &format!("{server}: the server's persistence files"),
            "the subject's keys and values",
            "CONFIG is disabled, so Lethe cannot tell what the server keeps on disk",
            "unknown whether and when the server rewrites its files",
        ));
    };
    if aof == "yes" {
        let aof_rewrite = Rewrite {
            command: "BGREWRITEAOF",
            in_progress: &["aof_rewrite_in_progress", "aof_rewrite_scheduled"],
            status: "aof_last_bgrewrite_status",
            started: "aof_rewrites",
        };
        match rewrite(con, &aof_rewrite).await {
            Ok(()) => physical.done.push(format!("{server}: append-only file rewritten without the keys")),
            Err(why) => physical.remaining.push(Copy::unknown(
                &format!("{server}: the append-only file"),
                "every write of the subject's keys",
                &why,
                "the server rewrites it on its own only when it has grown (auto-aof-rewrite-percentage)",
            )),
        }
    }
    if !save.is_empty() {
        let snapshot = Rewrite {
            command: "BGSAVE",
            in_progress: &["rdb_bgsave_in_progress"],
            status: "rdb_last_bgsave_status",
            started: "rdb_saves",
        };
        match rewrite(con, &snapshot).await {
            Ok(()) => physical
                .done
                .push(format!("{server}: RDB snapshot taken without the keys")),
            Err(why) => physical.remaining.push(Copy::unknown(
                &format!("{server}: the RDB snapshot"),
                "the subject's keys and values at the last snapshot",
                &why,
                &format!("the server snapshots again on its own schedule (save {save})"),
            )),
        }
    }
    if aof != "yes" && save.is_empty() {
        physical
            .done
            .push(format!("{server}: the server keeps nothing on disk"));
    }
    let replicas = info_field(con, "replication", "connected_slaves")
        .await
        .unwrap_or_default();
    if !matches!(replicas.as_str(), "" | "0") {
        physical.remaining.push(Copy::unknown(
            &format!("{server}: the persistence files of its {replicas} replica(s)"),
            "the subject's keys and values, as the replicas persisted them",
            "replicas unlink the keys as they replicate, but rewrite their own files on their own schedule",
            "Lethe reaches primaries only",
        ));
    }
    physical
}

/// A Redis URL without its password, for reports.
fn server_of(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

impl RedisConnector {
    /// A connection to one server, and the patterns of the subjects' keys there.
    async fn patterns_at(
        &self,
        url: &str,
        subjects: &Subjects,
    ) -> Result<(MultiplexedConnection, Vec<String>), ConnectorError> {
        let failed = |e: redis::RedisError| ConnectorError::from_redis(&self.target.name, &e);
        let client = redis::Client::open(url).map_err(failed)?;
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .map_err(failed)?;
        let keys = keys_of(&mut con, &self.target, subjects)
            .await
            .map_err(failed)?;
        Ok((con, patterns(&self.target, subjects.tenant(), &keys)))
    }
}

#[async_trait]
impl Connector for RedisConnector {
    async fn count(
        &self,
        subjects: &Subjects,
        _lineage: &[(String, String)],
    ) -> Result<u64, ConnectorError> {
        let mut held = 0;
        for url in &self.target.urls {
            let (mut con, patterns) = self.patterns_at(url, subjects).await?;
            for pattern in &patterns {
                held += scan(&mut con, pattern)
                    .await
                    .map_err(|e| ConnectorError::from_redis(&self.target.name, &e))?
                    .len() as u64;
            }
        }
        Ok(held)
    }

    async fn purge(
        &self,
        subjects: &Subjects,
        _lineage: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        let name = &self.target.name;
        let mut report = PurgeReport {
            probe_hits: None,
            before: 0,
            deleted: 0,
            remaining: 0,
            physical: Physical::default(),
        };
        for url in &self.target.urls {
            let failed = |e: redis::RedisError| ConnectorError::from_redis(name, &e);
            let (mut con, patterns) = self.patterns_at(url, subjects).await?;
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
            let server = physical(&mut con, &server_of(url)).await;
            report.physical.done.extend(server.done);
            report.physical.remaining.extend(server.remaining);
        }
        Ok(report)
    }

    /// Unlinks the keys lineage names (the sweeper's: keys of a revoked consent, whose deadline
    /// was brought to now; Redis drops the others at their deadline itself).
    async fn delete_items(
        &self,
        _collection: &str,
        items: &[ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        self.each_key(items, "UNLINK").await
    }

    async fn held_items(
        &self,
        _collection: &str,
        items: &[ExpiredItem],
    ) -> Result<u64, ConnectorError> {
        self.each_key(items, "EXISTS").await
    }
}

impl RedisConnector {
    /// `command` (`UNLINK`, `EXISTS`) on the keys of `items`, on every primary; the sum of
    /// Redis' counts.
    async fn each_key(&self, items: &[ExpiredItem], command: &str) -> Result<u64, ConnectorError> {
        let keys: Vec<&str> = items.iter().map(|i| i.item_id.as_str()).collect();
        let mut count = 0;
        for url in &self.target.urls {
            let failed = |e: redis::RedisError| ConnectorError::from_redis(&self.target.name, &e);
            let mut con = redis::Client::open(url.as_str())
                .map_err(failed)?
                .get_multiplexed_async_connection()
                .await
                .map_err(failed)?;
            for batch in keys.chunks(500) {
                let n: u64 = redis::cmd(command)
                    .arg(batch)
                    .query_async(&mut con)
                    .await
                    .map_err(failed)?;
                count += n;
            }
        }
        Ok(count)
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

    #[test]
    fn a_key_names_its_owner_somewhere_after_the_patterns_prefix() {
        assert_eq!(
            candidates("{tenant}:{subject}:*", "acme", "acme:u1:3"),
            ["u", "u1", "u1:", "u1:3"]
        );
        assert_eq!(
            candidates("cache:{tenant}:{subject}", "acme", "cache:acme:u1"),
            ["u", "u1"]
        );
        assert!(candidates("{tenant}:{subject}:*", "acme", "globex:u1:3").is_empty());
        assert!(candidates("{tenant}:sessions", "acme", "acme:sessions").is_empty());
    }

    /// After a restore, a replay knows the subject only by reference: its keys are found again
    /// among those the patterns could hold, and no one else's go.
    #[tokio::test]
    async fn a_subject_known_only_by_reference_is_found_again_and_purged() {
        let mut con = connection().await;
        let tenant = format!("t{}", uuid::Uuid::new_v4().simple());
        let mut pipe = redis::pipe();
        for key in ["u1:a", "u1:b", "u2:a", "u10:a"] {
            pipe.add_command(
                redis::cmd("SET")
                    .arg(format!("{tenant}:{key}"))
                    .arg("v")
                    .to_owned(),
            );
        }
        pipe.add_command(
            redis::cmd("SET")
                .arg(format!("cache:{tenant}:u1"))
                .arg("v")
                .to_owned(),
        );
        pipe.query_async::<()>(&mut con).await.unwrap();
        let target = RedisTarget {
            name: "cache".into(),
            urls: vec![URL.into()],
            patterns: vec![
                "{tenant}:{subject}:*".into(),
                "cache:{tenant}:{subject}".into(),
            ],
        };
        let forgotten = lethe_policy::audit::forgotten(crate::testing::AUDIT_KEY, &tenant, "u1");
        let report = RedisConnector::new(target)
            .purge(&crate::testing::subjects(&tenant, &[&forgotten]), &[])
            .await
            .unwrap();
        assert_eq!(
            (report.before, report.deleted, report.remaining),
            (3, 3, 0),
            "{report:?}"
        );
        let mut left = scan(&mut con, &format!("{tenant}:*")).await.unwrap();
        left.sort();
        assert_eq!(left, [format!("{tenant}:u10:a"), format!("{tenant}:u2:a")]);
        let _: u64 = redis::cmd("UNLINK")
            .arg(&left)
            .query_async(&mut con)
            .await
            .unwrap();
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
        let subjects = crate::testing::subjects(&tenant, &["u1", "u1-old"]);
        assert_eq!(
            connector.count(&subjects, &[]).await.unwrap(),
            1502,
            "the dry run counts what the purge will find"
        );
        let report = connector.purge(&subjects, &[]).await.unwrap();
        assert_eq!(
            (report.before, report.deleted, report.remaining),
            (1502, 1502, 0),
            "{report:?}"
        );
        assert_eq!(connector.count(&subjects, &[]).await.unwrap(), 0);
        assert_eq!(
            report.physical.done,
            [
                "redis://127.0.0.1:6379: keys unlinked",
                "redis://127.0.0.1:6379: the server keeps nothing on disk"
            ],
            "the test server persists nothing (scripts/test starts it so)"
        );
        assert!(report.physical.remaining.is_empty());
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
            .purge(&crate::testing::subjects(&tenant, &["u*"]), &[])
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

    /// A Redis of the test's own that persists (AOF and RDB) into a fresh directory; stopped
    /// when dropped.
    struct Persisting {
        process: std::process::Child,
        dir: std::path::PathBuf,
        url: String,
    }

    impl Drop for Persisting {
        fn drop(&mut self) {
            let _ = self.process.kill();
            let _ = self.process.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    async fn persisting() -> Persisting {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir =
            std::env::temp_dir().join(format!("lethe-redis-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let process = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--appendonly",
                "yes",
                "--save",
                "3600 1",
            ])
            .arg("--dir")
            .arg(&dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server (scripts/test installs it)");
        let url = format!("redis://127.0.0.1:{port}");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(client) = redis::Client::open(url.as_str())
                && client.get_multiplexed_async_connection().await.is_ok()
            {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Persisting { process, dir, url }
    }

    /// Every byte the server keeps on disk, file by file.
    fn files_holding(dir: &std::path::Path, needle: &str) -> Vec<String> {
        let mut found = Vec::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(path) = todo.pop() {
            if path.is_dir() {
                todo.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            } else if std::fs::read(&path)
                .unwrap()
                .windows(needle.len())
                .any(|w| w == needle.as_bytes())
            {
                found.push(path.display().to_string());
            }
        }
        found
    }

    #[tokio::test]
    async fn with_persistence_on_the_purge_rewrites_the_files_without_the_subject() {
        let server = persisting().await;
        let mut con = redis::Client::open(server.url.as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        for (subject, secret) in [("u1", "u1-secret-value"), ("u2", "u2-kept-value")] {
            for i in 0..20 {
                redis::cmd("SET")
                    .arg(format!("acme:{subject}:{i}"))
                    .arg(secret)
                    .query_async::<()>(&mut con)
                    .await
                    .unwrap();
            }
        }
        redis::cmd("BGSAVE")
            .query_async::<()>(&mut con)
            .await
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while files_holding(&server.dir, "u1-secret-value").len() < 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the AOF and the snapshot hold the subject before the purge"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let target = RedisTarget {
            name: "cache".into(),
            urls: vec![server.url.clone()],
            patterns: vec!["{tenant}:{subject}:*".into()],
        };
        let report = RedisConnector::new(target)
            .purge(&crate::testing::subjects("acme", &["u1"]), &[])
            .await
            .unwrap();
        assert_eq!(
            (report.before, report.deleted, report.remaining),
            (20, 20, 0)
        );
        let done = report.physical.done.join("; ");
        assert!(
            done.contains("append-only file rewritten") && done.contains("RDB snapshot taken"),
            "{done}"
        );
        assert!(
            report.physical.remaining.is_empty(),
            "{:?}",
            report.physical.remaining
        );
        assert_eq!(
            files_holding(&server.dir, "u1-secret-value"),
            Vec::<String>::new(),
            "nothing of u1 on disk"
        );
        assert!(
            !files_holding(&server.dir, "u2-kept-value").is_empty(),
            "u2 is still persisted"
        );
    }
}
