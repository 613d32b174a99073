//! PostgreSQL databases governed in the database itself (`[[postgres]]`): Lethe installs the
//! rules ([`plan`]) and keeps the policy they read in step with its own. Each database has its
//! own lane: one task installs the rules (retrying while the database cannot be reached) and
//! then applies every policy change (grant, revocation, rules, flip) in order, so that a
//! database that is down holds back no other. The control plane answers a change once it is
//! applied everywhere ([`Governed::settled`]), or once the wait is over (the lag is then a
//! metric, and the change is retried until applied). A flip holds in a database only once no
//! transaction from before it is left there ([`flips`]).

mod flips;
pub mod plan;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lethe_policy::{Action, Layer, SubjectPolicy, SubjectStatus};
use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::sync::{Notify, mpsc};

use crate::config::{Config, GovernedDatabase};
use crate::state::{FeedEvent, PolicyChange, Store};

/// One governed database: its settings and Lethe's pool to it.
struct Database {
    config: GovernedDatabase,
    pool: PgPool,
    /// The tenants whose subject keys are case-insensitive.
    folding: lethe_policy::names::Folding,
}

/// How far one database has come.
struct Lane {
    name: String,
    /// Changes applied to it.
    applied: Arc<AtomicU64>,
    /// Whether the rules are installed and the policy copied (since this start).
    ready: Arc<AtomicBool>,
    work: mpsc::UnboundedSender<Work>,
}

/// Every governed database, and how far the policy applied to them has come.
pub struct Governed {
    /// Changes handed to the lanes.
    queued: AtomicU64,
    lanes: Vec<Lane>,
    progress: Arc<Notify>,
}

/// What a lane does next.
#[derive(Clone)]
enum Work {
    Change(PolicyChange),
    /// The change feed was lost and is back: changes of other replicas may have been missed, so
    /// the whole policy is copied again.
    CopyAll,
}

impl Governed {
    /// No governed database: every change is applied at once.
    pub fn none() -> Arc<Governed> {
        Arc::new(Governed {
            queued: AtomicU64::new(0),
            lanes: Vec::new(),
            progress: Arc::new(Notify::new()),
        })
    }

    /// Starts a lane per governed database: it connects, installs the rules and copies the
    /// whole policy (retrying until the database can be reached), then applies every change
    /// the store's feed announces; and a watcher that finds when each flip holds there. Only a
    /// URL that cannot be read is an error: an unreachable database lags, visibly.
    pub fn start(config: &Config, store: Arc<dyn Store>) -> Result<Arc<Governed>, String> {
        if config.postgres.is_empty() {
            return Ok(Governed::none());
        }
        let mut databases = Vec::new();
        for db in &config.postgres {
            let url = String::from_utf8(db.url.resolve()?)
                .map_err(|_| format!("[[postgres]] {}: url is not UTF-8", db.name))?;
            let pool = PgPoolOptions::new()
                .max_connections(4)
                .acquire_timeout(Duration::from_secs(5))
                .connect_lazy(&url)
                .map_err(|e| format!("[[postgres]] {}: url: {e}", db.name))?;
            databases.push(Database {
                config: db.clone(),
                pool,
                folding: config.folding(),
            });
        }
        let progress = Arc::new(Notify::new());
        let mut lanes = Vec::new();
        for db in databases {
            let (tx, rx) = mpsc::unbounded_channel::<Work>();
            let lane = Lane {
                name: db.config.name.clone(),
                applied: Arc::new(AtomicU64::new(0)),
                ready: Arc::new(AtomicBool::new(false)),
                work: tx,
            };
            let db = Arc::new(db);
            let applied_one = Arc::new(Notify::new());
            tokio::spawn(sweep(
                db.config.clone(),
                db.pool.clone(),
                config.erasure.sweep_interval.0,
            ));
            tokio::spawn(flips::watch(
                Arc::clone(&db),
                Arc::clone(&store),
                Arc::clone(&applied_one),
            ));
            tokio::spawn(run_lane(
                db,
                Arc::clone(&store),
                rx,
                Arc::clone(&lane.applied),
                Arc::clone(&lane.ready),
                Arc::clone(&progress),
                applied_one,
            ));
            lanes.push(lane);
        }
        let governed = Arc::new(Governed {
            queued: AtomicU64::new(0),
            lanes,
            progress,
        });
        // Subscribed before any lane copies the policy: a change during a copy is applied
        // again after it.
        let queue = Arc::clone(&governed);
        store.feed().on_event(move |event| {
            let work = match event {
                FeedEvent::Changed(change) => Work::Change(change.clone()),
                FeedEvent::Restored => Work::CopyAll,
                FeedEvent::Lost => return,
            };
            // Counted before it can be applied, so that no lane's `applied` passes `queued`.
            queue.queued.fetch_add(1, Ordering::SeqCst);
            for lane in &queue.lanes {
                // A lane's task only ends with the runtime.
                let _ = lane.work.send(work.clone());
            }
        });
        Ok(governed)
    }

    /// How many changes have been announced so far.
    pub fn queued(&self) -> u64 {
        self.queued.load(Ordering::SeqCst)
    }

    /// The most changes any governed database has still to apply.
    pub fn lag(&self) -> u64 {
        self.pending()
            .into_iter()
            .map(|(_, n)| n)
            .max()
            .unwrap_or(0)
    }

    /// Each governed database with the number of policy changes not yet applied to it.
    pub fn pending(&self) -> Vec<(&str, u64)> {
        let queued = self.queued.load(Ordering::SeqCst);
        self.lanes
            .iter()
            .map(|lane| {
                (
                    lane.name.as_str(),
                    queued.saturating_sub(lane.applied.load(Ordering::SeqCst)),
                )
            })
            .collect()
    }

    /// The governed databases whose rules are not installed (or policy not copied) since this
    /// start: they cannot be reached, and what they hold is governed by what they last had.
    pub fn not_ready(&self) -> Vec<&str> {
        self.lanes
            .iter()
            .filter(|lane| !lane.ready.load(Ordering::SeqCst))
            .map(|lane| lane.name.as_str())
            .collect()
    }

    fn applied_everywhere(&self, target: u64) -> bool {
        self.lanes
            .iter()
            .all(|lane| lane.applied.load(Ordering::SeqCst) >= target)
    }

    /// Waits until every change announced so far is applied to every governed database, at
    /// most `within`; whether it was.
    pub async fn settled(&self, within: Duration) -> bool {
        let target = self.queued.load(Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let notified = self.progress.notified();
            if self.applied_everywhere(target) {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.applied_everywhere(target);
            }
        }
    }
}

/// One database's lane: the rules installed and the policy copied (retried until the database
/// takes them), then every change in order, each retried (with backoff) until applied.
async fn run_lane(
    db: Arc<Database>,
    store: Arc<dyn Store>,
    mut rx: mpsc::UnboundedReceiver<Work>,
    applied: Arc<AtomicU64>,
    ready: Arc<AtomicBool>,
    progress: Arc<Notify>,
    applied_one: Arc<Notify>,
) {
    let name = &db.config.name;
    let mut backoff = Duration::from_millis(100);
    loop {
        let first = match install(&db).await {
            Ok(()) => copy_all(&db, store.as_ref()).await,
            Err(e) => Err(format!("cannot install the rules: {e}")),
        };
        match first {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(database = %name, error = %e, "a governed database is not ready; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
    ready.store(true, Ordering::SeqCst);
    tracing::info!(database = %name, "governed database ready");
    applied_one.notify_one();
    while let Some(work) = rx.recv().await {
        let mut backoff = Duration::from_millis(100);
        loop {
            let result = match &work {
                Work::Change(change) => apply(&db, store.as_ref(), change).await,
                Work::CopyAll => copy_all(&db, store.as_ref()).await,
            };
            let Err(e) = result else { break };
            tracing::warn!(database = %name, error = %e, "a policy change could not be applied to a governed database; retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
        applied.fetch_add(1, Ordering::SeqCst);
        progress.notify_waiters();
        applied_one.notify_one();
    }
}

/// The retention sweep of a governed database: every `interval`, each table's expired rows (and
/// those whose `store` consent is gone) are deleted, unless a hold keeps them.
async fn sweep(db: GovernedDatabase, pool: PgPool, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        for table in &db.tables {
            match sqlx::query(sqlx::AssertSqlSafe(plan::sweep(table, db.owner_of(table))))
                .execute(&pool)
                .await
            {
                Ok(done) if done.rows_affected() > 0 => {
                    tracing::info!(database = %db.name, table = %table.table, deleted = done.rows_affected(), "expired rows swept");
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(database = %db.name, table = %table.table, error = %e, "the sweep of a governed table failed; retried next time")
                }
            }
        }
    }
}

/// Every problem of the governed tables against the live schemas: each table's expressions are
/// evaluated (`LIMIT 0`, nothing read), a linked table's key looked up in both tables.
pub async fn check_live(config: &Config) -> Vec<String> {
    let mut problems = Vec::new();
    for db in &config.postgres {
        let at = format!("[[postgres]] {}", db.name);
        let url = match db.url.resolve().map(String::from_utf8) {
            Ok(Ok(url)) => url,
            _ => {
                problems.push(format!("{at}: url cannot be read"));
                continue;
            }
        };
        let pool = match PgPoolOptions::new().max_connections(1).connect(&url).await {
            Ok(pool) => pool,
            Err(e) => {
                problems.push(format!("{at}: cannot connect: {e}"));
                continue;
            }
        };
        for table in &db.tables {
            let probes = match db.owner_of(table) {
                Some(owner) => {
                    let keys = table.key.join(", ");
                    vec![
                        format!("SELECT {keys} FROM {} LIMIT 0", table.table),
                        format!("SELECT {keys} FROM {} LIMIT 0", owner.table),
                    ]
                }
                None => vec![format!(
                    "SELECT ({})::text, ({})::text, ({})::text, ({})::text FROM {} LIMIT 0",
                    table.tenant, table.subject, table.purpose, table.category, table.table
                )],
            };
            for probe in probes {
                if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(probe)).execute(&pool).await {
                    problems.push(format!("{at}: table {}: {e}", table.table));
                }
            }
        }
    }
    problems
}

/// Installs (or upgrades) the rules in one transaction, one installer at a time.
async fn install(db: &Database) -> Result<(), sqlx::Error> {
    let mut tx = db.pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext('lethe.install'))")
        .execute(&mut *tx)
        .await?;
    // The plan is built from the operator's configuration, checked when it was loaded.
    for statement in plan::plan(&db.config, &db.folding) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await
}

/// The whole policy of every subject and tenant the state store knows.
async fn copy_all(db: &Database, store: &dyn Store) -> Result<(), String> {
    let subjects = store.known_subjects().await.map_err(|e| e.to_string())?;
    let tenants = store.retention_tenants().await.map_err(|e| e.to_string())?;
    for (tenant, subject) in subjects {
        apply(db, store, &PolicyChange::of_subject(&tenant, &subject)).await?;
    }
    for tenant in tenants {
        apply(db, store, &PolicyChange::of(&tenant, None)).await?;
    }
    Ok(())
}

/// One change: a subject's state and consent coverage, or a tenant's retention rules, read from
/// the state store and written whole in one transaction.
async fn apply(db: &Database, store: &dyn Store, change: &PolicyChange) -> Result<(), String> {
    // Lineage is not kept in the governed databases (their rows are not written through Lethe),
    // and tokens are not used there.
    if change.derivatives || change.revoked_token.is_some() {
        return Ok(());
    }
    let failed = |e: sqlx::Error| e.to_string();
    let mut tx = db.pool.begin().await.map_err(failed)?;
    match &change.subject {
        Some(subject) => {
            let policy = store
                .subject_policy(&change.tenant, subject)
                .await
                .map_err(|e| e.to_string())?;
            let holds = store
                .holds(&change.tenant, Some(subject))
                .await
                .map_err(|e| e.to_string())?;
            write_subject(&mut tx, &change.tenant, subject, &policy)
                .await
                .map_err(failed)?;
            let held = holds.iter().any(|h| {
                h.hold.subject.as_deref() == Some(subject) && h.hold.is_active(crate::now())
            });
            write_holds(&mut tx, &change.tenant, Some(subject), held)
                .await
                .map_err(failed)?;
        }
        None => {
            let held = store
                .holds(&change.tenant, None)
                .await
                .map_err(|e| e.to_string())?
                .iter()
                .any(|h| h.hold.subject.is_none() && h.hold.is_active(crate::now()));
            write_holds(&mut tx, &change.tenant, None, held)
                .await
                .map_err(failed)?;
            let retention = store
                .retention(&change.tenant)
                .await
                .map_err(|e| e.to_string())?
                .map(|v| v.policy)
                .unwrap_or_default();
            sqlx::query("DELETE FROM lethe.rules WHERE tenant = $1")
                .bind(&change.tenant)
                .execute(&mut *tx)
                .await
                .map_err(failed)?;
            sqlx::query("DELETE FROM lethe.purpose_ends WHERE tenant = $1")
                .bind(&change.tenant)
                .execute(&mut *tx)
                .await
                .map_err(failed)?;
            let mut scopes: Vec<(&str, &str)> = retention
                .rules
                .iter()
                .map(|r| (r.purpose.as_str(), r.category.as_str()))
                .collect();
            scopes.sort();
            scopes.dedup();
            for (purpose, category) in scopes {
                // The rule a raw record of this purpose and category is kept by.
                let Some(rule) = retention.rule_for(purpose, category, Layer::Raw) else {
                    continue;
                };
                sqlx::query("INSERT INTO lethe.rules (tenant, purpose, category, max_age_seconds, legal_end) VALUES ($1, $2, $3, $4, $5)")
                    .bind(&change.tenant)
                    .bind(purpose)
                    .bind(category)
                    .bind(rule.max_age.seconds())
                    .bind(rule.legal_end)
                    .execute(&mut *tx)
                    .await
                    .map_err(failed)?;
            }
            for end in &retention.purpose_ends {
                sqlx::query("INSERT INTO lethe.purpose_ends (tenant, purpose, ends_at) VALUES ($1, $2, $3) ON CONFLICT (tenant, purpose) DO UPDATE SET ends_at = least(lethe.purpose_ends.ends_at, excluded.ends_at)")
                    .bind(&change.tenant)
                    .bind(&end.purpose)
                    .bind(end.ends_at)
                    .execute(&mut *tx)
                    .await
                    .map_err(failed)?;
            }
        }
    }
    tx.commit().await.map_err(failed)
}

/// Whether a subject (or, with `None`, the whole tenant) is under an active hold.
async fn write_holds(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    tenant: &str,
    subject: Option<&str>,
    held: bool,
) -> Result<(), sqlx::Error> {
    sqlx::query("DELETE FROM lethe.holds WHERE tenant = $1 AND subject IS NOT DISTINCT FROM $2")
        .bind(tenant)
        .bind(subject)
        .execute(&mut **tx)
        .await?;
    if held {
        sqlx::query("INSERT INTO lethe.holds (tenant, subject) VALUES ($1, $2)")
            .bind(tenant)
            .bind(subject)
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// A subject's state and the consent its live grants give, per action. Once the subject's erasure completed
/// (Lethe then keeps only its reference) its rows go: without consent nothing of it can be written
/// or read, Lethe grants it none again, and the database keeps no copy of its key.
async fn write_subject(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    tenant: &str,
    subject: &str,
    policy: &SubjectPolicy,
) -> Result<(), sqlx::Error> {
    if policy.state.status == SubjectStatus::Erased {
        for table in ["lethe.subjects", "lethe.consents", "lethe.holds"] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM {table} WHERE tenant = $1 AND subject = $2"
            )))
            .bind(tenant)
            .bind(subject)
            .execute(&mut **tx)
            .await?;
        }
        return Ok(());
    }
    // Never back: another replica's lane may apply an older state after this one applied a
    // flip (epochs only grow, and a subject is suppressed in a new epoch); its consents are then
    // older too, and left as they are.
    let written = sqlx::query(
        "INSERT INTO lethe.subjects (tenant, subject, active, epoch) VALUES ($1, $2, $3, $4)
         ON CONFLICT (tenant, subject) DO UPDATE SET active = excluded.active, epoch = excluded.epoch
         WHERE (lethe.subjects.epoch, NOT lethe.subjects.active) <= (excluded.epoch, NOT excluded.active)",
    )
    .bind(tenant)
    .bind(subject)
    .bind(policy.state.is_active())
    .bind(policy.state.epoch)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    if written == 0 {
        return Ok(());
    }
    sqlx::query("DELETE FROM lethe.consents WHERE tenant = $1 AND subject = $2")
        .bind(tenant)
        .bind(subject)
        .execute(&mut **tx)
        .await?;
    for grant in policy.grants.iter().filter(|g| g.revoked_at.is_none()) {
        for action in [Action::Store, Action::Retrieve] {
            if !grant.actions.contains(&action) {
                continue;
            }
            sqlx::query("INSERT INTO lethe.consents (tenant, subject, purpose, category, action, ends_at) VALUES ($1, $2, $3, $4, $5, $6)")
                .bind(tenant)
                .bind(subject)
                .bind(&grant.purpose)
                .bind(&grant.category)
                .bind(action.as_str())
                .bind(grant.expires_at)
                .execute(&mut **tx)
                .await?;
        }
    }
    Ok(())
}
