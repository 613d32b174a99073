//! When a flip holds in a governed database. The database's rules read the subject's state
//! without locking it, so a flip is applied at once and never waits behind the app's writes;
//! but a transaction that began before it may still hold a write decided on the old state, or a
//! snapshot (repeatable read, an open cursor) in which the subject is still readable. The flip
//! holds once the database has applied it and no such transaction of a role that can reach the
//! subject's tenant is left: they are given the database's `flip_grace` to finish, then their
//! statements are cancelled and their idle sessions (and prepared transactions) ended. Until
//! then the request names the database as lagging; a role Lethe cannot see or signal leaves it
//! lagging, never announced.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lethe_policy::audit::AuditEntry;
use sqlx::Row as _;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::Database;
use crate::store::{PendingFlip, Store};

/// How often pending flips are looked at while there are some.
const POLL: Duration = Duration::from_millis(25);
/// How long the watcher sleeps when no flip is pending and nothing woke it.
const IDLE: Duration = Duration::from_secs(1);

/// A flip seen applied in the database, with the database's clock then: every transaction that
/// began before that moment is suspect.
struct Applied {
    since: DateTime<Utc>,
    seen: Instant,
    /// Whether the grace is over and the suspects were told to end.
    ended: bool,
}

/// The transactions of `roles` that began before `$2` and may still write or read with a
/// snapshot from before it: they hold a transaction id (wrote something) or a snapshot (a
/// statement running, repeatable read, an open cursor). A session whose state Lethe may not see
/// counts as one. Answers each one's pid and whether it is running a statement.
const SUSPECTS: &str =
    "SELECT pid, coalesce(state = 'active', false) AS active FROM pg_catalog.pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'
   AND usename = ANY($1)
   AND (state IS NULL
        OR (state <> 'idle' AND (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL)
            AND coalesce(xact_start, query_start) < $2))";

/// Prepared transactions of `roles` from before `$2`: committed later, they would land behind
/// the flip.
const PREPARED: &str = "SELECT gid FROM pg_catalog.pg_prepared_xacts
 WHERE database = current_database() AND owner = ANY($1) AND prepared < $2";

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
    let suspects = sqlx::query(SUSPECTS)
        .bind(&roles)
        .bind(applied.since)
        .fetch_all(&db.pool)
        .await
        .map_err(failed)?;
    let prepared: Vec<String> = sqlx::query_scalar(PREPARED)
        .bind(&roles)
        .bind(applied.since)
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
    if applied.seen.elapsed() < db.config.flip_grace.0 || applied.ended {
        return Ok(());
    }
    // The grace is over: what still runs is cancelled, what sits idle in its transaction is
    // ended (a cancel does not reach it), prepared transactions are rolled back.
    applied.ended = true;
    let mut refused = 0;
    for suspect in &suspects {
        let pid: i32 = suspect.try_get("pid").map_err(failed)?;
        let active: bool = suspect.try_get("active").map_err(failed)?;
        let signal = if active {
            "SELECT pg_catalog.pg_cancel_backend($1)"
        } else {
            "SELECT pg_catalog.pg_terminate_backend($1)"
        };
        if sqlx::query(signal)
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
    tracing::warn!(
        database = %db.config.name,
        request = %flip.request_id,
        ended = suspects.len() + prepared.len() - refused,
        refused,
        "transactions from before a flip outlived its grace and were ended"
    );
    if refused > 0 {
        tracing::warn!(database = %db.config.name, "Lethe's role may not end some transactions (it needs pg_signal_backend and pg_read_all_stats, or superuser): the flip waits for them to end on their own");
        // Told again at the next look, in case the role was granted meanwhile.
        applied.ended = false;
        applied.seen = Instant::now();
    }
    Ok(())
}

/// The database's clock at a moment it had applied the flip (every key inactive in an epoch at
/// least the state store's), or `None` while it has not.
async fn applied_since(
    db: &Database,
    flip: &PendingFlip,
) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    let (keys, epochs): (Vec<&str>, Vec<i64>) =
        flip.keys.iter().map(|(k, e)| (k.as_str(), *e)).unzip();
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
