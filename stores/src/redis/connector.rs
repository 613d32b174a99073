//! Purging a subject's keys from Redis: `SCAN MATCH` with the patterns, in every database of
//! every primary, and `UNLINK` of each key found that the patterns say is the subject's (the
//! first pattern that matches a key names its owner, as the route decides it: `acme:frank:notes:1`
//! is frank's, never the subject `frank:notes`'s); the keys lineage names for the sweeper. Never
//! `KEYS`: it blocks the server. It purges a Redis route's store, and the `[[erasure.redis]]`
//! deployments no route fronts.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;

use super::client::{Client, ClientError, Server};
use super::keys::{KeyRule, Pattern, owner};
use super::resp::{Proto, Reply};
use crate::erasure::{Target, TargetKind};
use crate::purge::{Connector, ConnectorError, Copy, Physical, PurgeReport, Subjects};
use crate::state::ExpiredItem;

/// How long one connection or one exchange with Redis may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A Redis deployment: every primary is scanned with every pattern.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisTarget {
    /// Names the target `redis:<name>`.
    pub name: String,
    /// `redis://` or `rediss://` (TLS, verified) `[user:password@]host:port[/db]` of every
    /// primary.
    pub urls: Vec<String>,
    /// Key patterns with `{tenant}` and `{subject}`, e.g. `{tenant}:{subject}:*`.
    pub patterns: Vec<String>,
}

impl RedisTarget {
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.urls.is_empty() {
            problems.push("urls: list every primary (redis:// or rediss://)".to_owned());
        }
        problems.extend(
            self.urls
                .iter()
                .filter_map(|url| Server::of_url(url, None).err())
                .map(|e| format!("urls: {e}")),
        );
        match key_patterns(&self.patterns) {
            Ok(patterns) if patterns.is_empty() => {
                problems.push("patterns: name at least one, e.g. {tenant}:{subject}:*".to_owned())
            }
            Ok(_) => {}
            Err(bad) => problems.extend(bad.into_iter().map(|e| format!("patterns: {e}"))),
        }
        problems
    }
}

/// Key patterns as a route's `[[routes.keys]]` are read, so that a key has one owner whichever
/// reads it; every bad one reported.
fn key_patterns(texts: &[String]) -> Result<Vec<Pattern>, Vec<String>> {
    let (patterns, bad): (Vec<_>, Vec<_>) = texts
        .iter()
        .map(|text| {
            Pattern::of(&KeyRule {
                pattern: text.clone(),
                purpose: String::new(),
                category: String::new(),
            })
        })
        .partition(Result::is_ok);
    match bad.is_empty() {
        true => Ok(patterns.into_iter().flatten().collect()),
        false => Err(bad.into_iter().filter_map(Result::err).collect()),
    }
}

/// `[[erasure.redis]]`: Redis deployments whose keys name the subject, that no route fronts.
pub const TARGET_KIND: TargetKind = TargetKind {
    name: "redis",
    problems: |settings, _| read(settings).err().unwrap_or_default(),
    target: |settings, config| {
        let target = read(settings).map_err(|problems| problems.join("; "))?;
        let servers = target
            .urls
            .iter()
            .map(|url| Server::of_url(url, None))
            .collect::<Result<_, _>>()?;
        let tls = crate::data::forward::tls_of(config)?;
        let name = format!("redis:{}", target.name);
        let patterns = key_patterns(&target.patterns).map_err(|bad| bad.join("; "))?;
        let connector = RedisConnector::new(&target.name, servers, patterns, tls);
        Ok(Target::own(&name, Arc::new(connector)))
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
    name: String,
    servers: Vec<Server>,
    patterns: Vec<Pattern>,
    tls: Arc<rustls::ClientConfig>,
}

impl RedisConnector {
    pub fn new(
        name: &str,
        servers: Vec<Server>,
        patterns: Vec<Pattern>,
        tls: Arc<rustls::ClientConfig>,
    ) -> Self {
        RedisConnector {
            name: name.to_owned(),
            servers,
            patterns,
            tls,
        }
    }

    fn failed(&self, e: ClientError) -> ConnectorError {
        let message = format!("{}: {e}", self.name);
        match e {
            ClientError::Misconfigured(_) => ConnectorError::Misconfigured(message),
            ClientError::Unavailable(_) => ConnectorError::Unavailable(message),
        }
    }

    /// Every primary; none is a misconfiguration, never a purge that found nothing.
    fn servers(&self) -> Result<&[Server], ConnectorError> {
        match self.servers.is_empty() {
            true => Err(ConnectorError::Misconfigured(format!(
                "{}: no Redis server to reach",
                self.name
            ))),
            false => Ok(&self.servers),
        }
    }

    async fn connect(&self, server: &Server) -> Result<Client, ConnectorError> {
        Client::connect(server, &self.tls, Proto::Resp2, TIMEOUT)
            .await
            .map_err(|e| self.failed(e))
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

/// The `MATCH` pattern of each pattern for the subject `key` (`*` for any subject).
fn globs(patterns: &[Pattern], tenant: &str, key: Option<&str>) -> Vec<String> {
    let subject = key.map_or_else(|| "*".to_owned(), glob_escape);
    patterns
        .iter()
        .map(|p| {
            p.text
                .replace("{tenant}", &glob_escape(tenant))
                .replace("{subject}", &subject)
        })
        .collect()
}

/// The subjects' keys, those Lethe knows only by reference found again among the owners of the
/// keys the patterns could hold (every subject's, searched with `*` in its place).
async fn keys_of(
    con: &mut Client,
    patterns: &[Pattern],
    subjects: &Subjects,
) -> Result<Vec<String>, ClientError> {
    if !subjects.any_forgotten() {
        return Ok(subjects.keys());
    }
    let tenant = subjects.tenant();
    let mut owners = BTreeSet::new();
    for glob in globs(patterns, tenant, None) {
        for key in scan(con, &glob).await? {
            if let Some(o) = owner(patterns, &key).filter(|o| o.tenant == tenant) {
                owners.insert(o.subject.to_owned());
            }
        }
    }
    Ok(subjects
        .found_among(owners.iter().map(String::as_str))
        .keys())
}

/// The keys of the subjects `keys` in the connection's database: found by the patterns, and
/// kept only where the first pattern that matches names one of them as the owner.
async fn subjects_keys(
    con: &mut Client,
    patterns: &[Pattern],
    tenant: &str,
    keys: &[String],
) -> Result<Vec<String>, ClientError> {
    let mut found = BTreeSet::new();
    for key in keys {
        for glob in globs(patterns, tenant, Some(key)) {
            found.extend(scan(con, &glob).await?.into_iter().filter(|found| {
                owner(patterns, found).is_some_and(|o| o.tenant == tenant && o.subject == key)
            }));
        }
    }
    Ok(found.into_iter().collect())
}

/// The databases of the server that hold keys (`INFO keyspace`), the connection's own first.
async fn databases(con: &mut Client, own: u32) -> Result<Vec<u32>, ClientError> {
    let info = text(con.one(&[b"INFO", b"keyspace"]).await?).unwrap_or_default();
    let mut databases = vec![own];
    databases.extend(
        info.lines()
            .filter_map(|line| line.strip_prefix("db")?.split_once(':')?.0.parse().ok())
            .filter(|db: &u32| *db != own),
    );
    Ok(databases)
}

async fn scan(con: &mut Client, pattern: &str) -> Result<Vec<String>, ClientError> {
    let mut found = Vec::new();
    let mut cursor = b"0".to_vec();
    let unexpected =
        || ClientError::Unavailable("Redis' answer to SCAN is not a cursor and keys".to_owned());
    loop {
        let reply = con
            .one(&[
                b"SCAN",
                &cursor,
                b"MATCH",
                pattern.as_bytes(),
                b"COUNT",
                b"1000",
            ])
            .await?;
        let Reply::Array(mut parts) = reply else {
            return Err(unexpected());
        };
        let (Some(Reply::Array(keys)), Some(Reply::Bulk(next))) = (parts.pop(), parts.pop()) else {
            return Err(unexpected());
        };
        for key in keys {
            if let Reply::Bulk(key) = key {
                // Keys Lethe's patterns name are text; another key cannot be the subject's.
                found.extend(String::from_utf8(key).ok());
            }
        }
        if next == b"0" {
            found.sort();
            found.dedup();
            return Ok(found);
        }
        cursor = next;
    }
}

/// The text of a bulk or simple answer.
fn text(reply: Reply) -> Option<String> {
    match reply {
        Reply::Bulk(b) | Reply::Simple(b) => String::from_utf8(b).ok(),
        _ => None,
    }
}

/// One `CONFIG GET` value; `None` when the server does not answer it (CONFIG disabled).
async fn config_value(con: &mut Client, name: &str) -> Option<String> {
    match con.one(&[b"CONFIG", b"GET", name.as_bytes()]).await.ok()? {
        Reply::Array(pair) => pair.into_iter().nth(1).and_then(text),
        Reply::Map(pairs) => pairs.into_iter().next().and_then(|(_, v)| text(v)),
        _ => None,
    }
}

/// One field of `INFO <section>`.
async fn info_field(con: &mut Client, section: &str, field: &str) -> Result<String, ClientError> {
    let info = text(con.one(&[b"INFO", section.as_bytes()]).await?).unwrap_or_default();
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
async fn rewrite(con: &mut Client, r: &Rewrite<'_>) -> Result<(), String> {
    let done = async |con: &mut Client| -> Result<bool, String> {
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
    let started = async |con: &mut Client| -> Result<Option<u64>, String> {
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
        match con.one(&[r.command.as_bytes()]).await {
            Ok(_) => break,
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
async fn physical(con: &mut Client, server: &Server) -> Physical {
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

impl RedisConnector {
    /// The databases of `server` that hold keys, the connection's own first. When Lethe's user
    /// may not list them, its own only, and the others are a copy it cannot speak for.
    async fn databases(
        &self,
        con: &mut Client,
        server: &Server,
        unreached: &mut Vec<Copy>,
    ) -> Result<Vec<u32>, ConnectorError> {
        match databases(con, server.db()).await {
            Ok(databases) => Ok(databases),
            Err(ClientError::Misconfigured(e)) => {
                unreached.push(Copy::unknown(
                    &format!(
                        "redis:{} {server}: the databases but {}",
                        self.name,
                        server.db()
                    ),
                    "keys the patterns may name the subject in",
                    "Lethe's Redis user may not list the databases (INFO keyspace)",
                    &e,
                ));
                Ok(vec![server.db()])
            }
            Err(e) => Err(self.failed(e)),
        }
    }

    /// Moves the connection into database `db`; `false`, and a copy it cannot speak for, when
    /// Lethe's user may not.
    async fn enter(
        &self,
        con: &mut Client,
        server: &Server,
        db: u32,
        unreached: &mut Vec<Copy>,
    ) -> Result<bool, ConnectorError> {
        let db_text = db.to_string();
        match con.one(&[b"SELECT", db_text.as_bytes()]).await {
            Ok(_) => Ok(true),
            Err(ClientError::Misconfigured(e)) => {
                unreached.push(Copy::unknown(
                    &format!("redis:{} {server} database {db}", self.name),
                    "keys the patterns may name the subject in",
                    "Lethe's Redis user may not enter the database (SELECT)",
                    &e,
                ));
                Ok(false)
            }
            Err(e) => Err(self.failed(e)),
        }
    }

    /// The subjects' keys in the connection's database.
    async fn found(
        &self,
        con: &mut Client,
        subjects: &Subjects,
    ) -> Result<Vec<String>, ConnectorError> {
        let keys = keys_of(con, &self.patterns, subjects)
            .await
            .map_err(|e| self.failed(e))?;
        subjects_keys(con, &self.patterns, subjects.tenant(), &keys)
            .await
            .map_err(|e| self.failed(e))
    }

    /// `command` (`UNLINK`, `EXISTS`) on `keys` in batches; the sum of Redis' counts.
    async fn each_batch(
        &self,
        con: &mut Client,
        command: &str,
        keys: &[&str],
    ) -> Result<u64, ConnectorError> {
        let mut count = 0;
        for batch in keys.chunks(500) {
            let mut args = vec![command.as_bytes()];
            args.extend(batch.iter().map(|k| k.as_bytes()));
            match con.one(&args).await.map_err(|e| self.failed(e))? {
                Reply::Int(n) => count += n.max(0) as u64,
                _ => {
                    return Err(ConnectorError::Unavailable(format!(
                        "{}: Redis' answer to {command} is not a count",
                        self.name
                    )));
                }
            }
        }
        Ok(count)
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
        for server in self.servers()? {
            let mut con = self.connect(server).await?;
            for db in self.databases(&mut con, server, &mut Vec::new()).await? {
                if self.enter(&mut con, server, db, &mut Vec::new()).await? {
                    held += self.found(&mut con, subjects).await?.len() as u64;
                }
            }
        }
        Ok(held)
    }

    async fn purge(
        &self,
        subjects: &Subjects,
        _lineage: &[(String, String)],
    ) -> Result<PurgeReport, ConnectorError> {
        let mut report = PurgeReport::starting(Physical::default(), false);
        let mut unreached = Vec::new();
        for server in self.servers()? {
            let mut con = self.connect(server).await?;
            for db in self.databases(&mut con, server, &mut unreached).await? {
                if !self.enter(&mut con, server, db, &mut unreached).await? {
                    continue;
                }
                let found = self.found(&mut con, subjects).await?;
                report.before += found.len() as u64;
                let found: Vec<&str> = found.iter().map(String::as_str).collect();
                report.deleted += self.each_batch(&mut con, "UNLINK", &found).await?;
                // Scanned again, not only the keys found: one that appeared meanwhile (a write
                // around Lethe) remains too.
                report.remaining += self.found(&mut con, subjects).await?.len() as u64;
            }
            let server = physical(&mut con, server).await;
            report.physical.done.extend(server.done);
            report.physical.remaining.extend(server.remaining);
        }
        report.physical.remaining.extend(unreached);
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
    /// Redis' counts. Lineage is only an index: a key is reached only when the patterns say it
    /// is the item's subject's, as the route decided it when it wrote it.
    async fn each_key(&self, items: &[ExpiredItem], command: &str) -> Result<u64, ConnectorError> {
        let keys: Vec<&str> = items
            .iter()
            .filter(|i| {
                owner(&self.patterns, &i.item_id)
                    .is_some_and(|o| o.tenant == i.tenant && o.subject == i.subject)
            })
            .map(|i| i.item_id.as_str())
            .collect();
        let mut count = 0;
        for server in self.servers()? {
            let mut con = self.connect(server).await?;
            count += self.each_batch(&mut con, command, &keys).await?;
        }
        Ok(count)
    }
}

#[cfg(test)]
mod tests;
