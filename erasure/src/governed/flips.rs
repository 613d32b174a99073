//! When a flip holds in a governed database. The database's rules read the subject's state
//! without locking it, so a flip is applied at once and never waits behind the app's writes;
//! but a transaction that began before it may still hold a write decided on the old state, or a
//! snapshot (repeatable read, an open cursor) in which the subject is still readable. The flip
//! holds once the database has applied it and no such transaction of a role that can reach the
//! subject's tenant is left: they are given the database's `flip_grace` to finish, then their
//! sessions are ended (and prepared transactions rolled back). Until
//! then the request names the database as lagging; a role Lethe cannot see or signal leaves it
//! lagging, never announced.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lethe_policy::audit::AuditEntry;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Database;
use crate::state::{PendingFlip, Store};

/// How often pending flips are looked at while there are some.
const POLL: Duration = Duration::from_millis(25);
/// How long the watcher sleeps when no flip is pending and nothing woke it.
const IDLE: Duration = Duration::from_secs(1);

/// A flip seen applied in the database, with the database's clock then: every transaction that
/// began before that moment is suspect.
struct Applied {
    since: DateTime<Utc>,
    seen: Instant,
    /// Whether the grace is over (and the log told so).
    ended: bool,
}

/// Whether a role (an oid or a name) acts as one of `$1` (the roles that can reach the tenant):
/// logs in as one, is a member of one, or may `SET ROLE` to one. Superusers, members of
/// everything, are not governed (they bypass row security), nor is Lethe's own role.
const AN_APP_ROLE: &str = "EXISTS (SELECT 1 FROM unnest($1::text[]) lethe_role WHERE pg_catalog.pg_has_role({role}, lethe_role, 'MEMBER'))
   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = {oid} AND (r.rolsuper OR r.rolbypassrls OR r.rolname = current_user))";

/// The transactions of `$1`'s roles that began before `$2` and may still write or read with a
/// snapshot from before it: they hold a transaction id (wrote something) or a snapshot (a
/// statement running, repeatable read, an open cursor). A session whose state or start Lethe
/// may not see (no `pg_read_all_stats`, `track_activities` off) counts as one. Answers each
/// one's pid.
fn suspects() -> String {
    format!(
        "SELECT a.pid FROM pg_catalog.pg_stat_activity a
 WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
   AND (a.backend_type = 'client backend' OR a.backend_type IS NULL)
   AND {}
   AND (a.state IS NULL
        OR (a.state <> 'idle' AND (a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL)
            AND coalesce(a.xact_start, a.query_start, '-infinity') < $2))",
        AN_APP_ROLE
            .replace("{role}", "a.usesysid")
            .replace("{oid}", "a.usesysid")
    )
}

/// Every prepared transaction of `$1`'s roles: it may hold a write decided before the flip
/// (prepared after it or not), to be committed any time.
fn prepared() -> String {
    format!(
        "SELECT p.gid FROM pg_catalog.pg_prepared_xacts p
 WHERE p.database = current_database() AND {}",
        AN_APP_ROLE.replace("{role}", "p.owner").replace(
            "{oid}",
            "(SELECT oid FROM pg_catalog.pg_roles WHERE rolname = p.owner)"
        )
    )
}

/// Watches `db`'s pending flips until the runtime ends: woken when its lane applied a change,
/// and polling while flips are pending.
pub(super) async fn watch(db: Arc<Database>, store: Arc<dyn Store>, applied_one: Arc<Notify>) {
    let name = db.config.name.clone();
    let mut seen: HashMap<String, Applied> = HashMap::new();
    // Failures are told once and retried with a growing pause, not every poll.
    let mut failing = false;
    let mut backoff = POLL;
    loop {
        let looked = match store.pending_flips(&name).await {
            Ok(pending) => {
                seen.retain(|id, _| pending.iter().any(|f| &f.request_id == id));
                let mut result = Ok(pending.len());
                for flip in &pending {
                    if let Err(e) = step(&db, store.as_ref(), flip, &mut seen).await {
                        result = Err(e);
                    }
                }
                result
            }
            Err(e) => Err(e.to_string()),
        };
        let wait = match looked {
            Ok(pending) => {
                if failing {
                    tracing::info!(database = %name, "pending flips can be checked again");
                }
                failing = false;
                backoff = POLL;
                if pending == 0 { IDLE } else { POLL }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(database = %name, error = %e, "pending flips cannot be checked in a governed database; retrying");
                }
                failing = true;
                backoff = (backoff * 2).min(IDLE);
                backoff
            }
        };
        let _ = tokio::time::timeout(wait, applied_one.notified()).await;
    }
}

/// Takes one pending flip a step further: seen applied, waited for, its suspects ended after
/// the grace, recorded as holding once none is left.
async fn step(
    db: &Database,
    store: &dyn Store,
    flip: &PendingFlip,
    seen: &mut HashMap<String, Applied>,
) -> Result<(), String> {
    let failed = |e: sqlx::Error| e.to_string();
    let applied = match seen.get_mut(&flip.request_id) {
        Some(applied) => applied,
        None => {
            let Some(since) = applied_since(db, flip).await.map_err(failed)? else {
                return Ok(());
            };
            seen.entry(flip.request_id.clone()).or_insert(Applied {
                since,
                seen: Instant::now(),
                ended: false,
            })
        }
    };
    let roles = roles_of(&db.config, &flip.tenant);
    let suspects: Vec<i32> = sqlx::query_scalar(sqlx::AssertSqlSafe(suspects()))
        .bind(&roles)
        .bind(applied.since)
        .fetch_all(&db.pool)
        .await
        .map_err(failed)?;
    let prepared: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(prepared()))
        .bind(&roles)
        .fetch_all(&db.pool)
        .await
        .map_err(failed)?;
    if suspects.is_empty() && prepared.is_empty() {
        let audit = AuditEntry {
            at: crate::now(),
            tenant: Some(flip.tenant.clone()),
            actor: "governed".into(),
            action: String::new(),
            request_id: flip.request_id.clone(),
            subject_ref: None,
            target: String::new(),
            target_ref: None,
            result: "ok".into(),
            attempt: 0,
        };
        let record = store
            .flip_applied(&flip.request_id, &db.config.name, crate::now(), audit)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(database = %db.config.name, request = %flip.request_id, state = %record.state, "the flip holds in a governed database");
        seen.remove(&flip.request_id);
        return Ok(());
    }
    if applied.seen.elapsed() < db.config.flip_grace.0 {
        return Ok(());
    }
    // The grace is over: what is left is ended, at every look until nothing is (a cancel can be
    // lost on a statement just ending, or caught by the client), and prepared transactions are
    // rolled back.
    let mut refused = 0;
    for pid in &suspects {
        if sqlx::query("SELECT pg_catalog.pg_terminate_backend($1)")
            .bind(pid)
            .execute(&db.pool)
            .await
            .is_err()
        {
            refused += 1;
        }
    }
    for gid in &prepared {
        let rollback: String =
            sqlx::query_scalar("SELECT format('ROLLBACK PREPARED %L', $1::text)")
                .bind(gid)
                .fetch_one(&db.pool)
                .await
                .map_err(failed)?;
        if sqlx::raw_sql(sqlx::AssertSqlSafe(rollback))
            .execute(&db.pool)
            .await
            .is_err()
        {
            refused += 1;
        }
    }
    if !applied.ended {
        applied.ended = true;
        tracing::warn!(
            database = %db.config.name,
            request = %flip.request_id,
            sessions = suspects.len(),
            prepared = prepared.len(),
            "transactions from before a flip outlived its grace: they are ended"
        );
        if refused > 0 {
            tracing::warn!(database = %db.config.name, "Lethe's role may not end some of them (it needs pg_signal_backend and pg_read_all_stats, or superuser): the flip waits for them to end on their own");
        }
    }
    Ok(())
}

/// The database's clock at a moment it had applied the flip (every key inactive in an epoch at
/// least the state store's), or `None` while it has not.
async fn applied_since(
    db: &Database,
    flip: &PendingFlip,
) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    // A key forgotten since (another request completed) has no policy rows there either.
    let (keys, epochs): (Vec<&str>, Vec<i64>) = flip
        .keys
        .iter()
        .filter_map(|(k, e)| e.map(|e| (k.as_str(), e)))
        .unzip();
    sqlx::query_scalar(
        "SELECT clock_timestamp() WHERE NOT EXISTS (
           SELECT 1 FROM unnest($2::text[], $3::bigint[]) AS k(subject, epoch)
            WHERE NOT EXISTS (SELECT 1 FROM lethe.subjects s
                               WHERE s.tenant = $1 AND s.subject = k.subject AND NOT s.active AND s.epoch >= k.epoch))",
    )
    .bind(&flip.tenant)
    .bind(&keys)
    .bind(&epochs)
    .fetch_optional(&db.pool)
    .await
}

/// The roles that can reach a tenant's rows: the app role, and the tenant's own.
fn roles_of(db: &crate::config::GovernedDatabase, tenant: &str) -> Vec<String> {
    std::iter::once(db.app_role.clone())
        .chain(db.tenant_roles.get(tenant).cloned())
        .collect()
}
