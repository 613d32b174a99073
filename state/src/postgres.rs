//! PostgreSQL: the shared state store for many replicas. Policy changes reach the other replicas
//! through `NOTIFY lethe_policy`, sent inside the changing transaction.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use tokio::sync::oneshot;

use super::migrate::{POSTGRES, run_migrations};
use super::sql::impl_store;
use super::{Feed, FeedEvent, PolicyChange, StoreError};

const CHANNEL: &str = "lethe_policy";

pub struct PgStore {
    pool: PgPool,
    feed: Arc<Feed>,
    subject_key: std::sync::OnceLock<Vec<u8>>,
    closure: std::sync::OnceLock<super::Closure>,
    governed: std::sync::OnceLock<Vec<String>>,
    /// Dropped with the store, which stops the listener.
    _stop_listener: oneshot::Sender<()>,
}

impl PgStore {
    const BACKEND: &'static str = "postgres";
    /// The migrations this Lethe knows.
    const MIGRATIONS: &'static [crate::migrate::Migration] = POSTGRES;
    /// Whether migrations were ever applied.
    const MIGRATED: &'static str = "SELECT to_regclass('lethe_migrations') IS NOT NULL";
    /// How a read inside a write transaction locks its row.
    const FOR_UPDATE: &'static str = " FOR UPDATE";
    /// How a read inside a write transaction keeps its rows from changing until it commits.
    const FOR_SHARE: &'static str = " FOR SHARE";
    /// How workers claim a job without waiting on one another.
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    /// Appends from every replica queue on this row lock; the chain cannot fork.
    const LOCK_AUDIT_HEAD: &'static str =
        "SELECT seq, hash, chain_version, key_check FROM audit_chain WHERE id = 1 FOR UPDATE";

    /// Connects, and starts listening for other replicas' changes; until the listener is up the
    /// feed reports unhealthy and caches are bypassed.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = PgConnectOptions::from_str(url)?;
        // A short acquire timeout: a request waiting on an unreachable store is refused soon.
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .acquire_timeout(Duration::from_secs(2))
            .connect_with(options.clone())
            .await?;
        let feed = Arc::new(Feed::new(false));
        let listener_pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(1))
            .connect_lazy_with(options.application_name("lethe-feed"));
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(listen(listener_pool, Arc::clone(&feed), stopped));
        Ok(PgStore {
            pool,
            feed,
            subject_key: std::sync::OnceLock::new(),
            closure: std::sync::OnceLock::new(),
            governed: std::sync::OnceLock::new(),
            _stop_listener: stop,
        })
    }

    async fn write_tx(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
        Ok(self.pool.begin().await?)
    }

    async fn notify(
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        change: &PolicyChange,
    ) -> Result<(), StoreError> {
        let payload =
            serde_json::to_string(change).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(CHANNEL)
            .bind(payload)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    /// Once an erased subject's key is forgotten, the old row versions that hold it are vacuumed
    /// away (the WAL keeps them until its segments are recycled).
    async fn scrub(&self) -> Result<(), StoreError> {
        sqlx::query("VACUUM subjects, consent_grants, legal_holds, items, threads, processors, erasure_requests")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    fn shared(&self) -> Option<&dyn super::SharedMemory> {
        Some(self)
    }

    fn closure(&self) -> super::Closure {
        self.closure.get().copied().unwrap_or_default()
    }

    fn governed(&self) -> &[String] {
        self.governed.get().map_or(&[], Vec::as_slice)
    }

    /// An erased subject's key in what the replicas share of the window: its reference instead,
    /// as everywhere else in the store (its rows still keep writes that would re-derive its data
    /// refused until they age out).
    async fn forget_shared(
        tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
        tenant: &str,
        key: &str,
        name: &str,
    ) -> Result<(), StoreError> {
        for table in ["lineage_traces", "lineage_texts"] {
            let sql = sqlx::AssertSqlSafe(format!(
                "UPDATE {table} SET owner = $3, item_id = REPLACE(item_id, $2, $3) WHERE tenant = $1 AND owner = $2"
            ));
            sqlx::query(sql)
                .bind(tenant)
                .bind(key)
                .bind(name)
                .execute(&mut **tx)
                .await?;
        }
        Ok(())
    }

    async fn run_migrations(&self) -> Result<Vec<i64>, StoreError> {
        // Replicas starting together take turns; the second finds the work done.
        run_migrations!(
            self.write_tx(),
            // The bookkeeping table's `IF NOT EXISTS` says so at NOTICE, once per migration.
            "SET LOCAL client_min_messages TO warning; SELECT pg_advisory_xact_lock(7400)",
            POSTGRES
        )
    }
}

/// Forwards other replicas' changes into the feed until the store is dropped. A lost connection
/// is reported at once (caches stop being trusted) and retried with backoff; the feed is restored
/// only once LISTEN is in place again.
async fn listen(pool: PgPool, feed: Arc<Feed>, mut stop: oneshot::Receiver<()>) {
    let mut backoff = Duration::from_millis(50);
    let mut listener: Option<PgListener> = None;
    loop {
        let Some(active) = listener.as_mut() else {
            match connect_listener(&pool).await {
                Ok(l) => {
                    listener = Some(l);
                    backoff = Duration::from_millis(50);
                    feed.publish(FeedEvent::Restored);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "policy change feed unavailable; deciding from the state store");
                    if feed.is_healthy() {
                        feed.publish(FeedEvent::Lost);
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = &mut stop => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
            continue;
        };
        let received = tokio::select! {
            received = active.try_recv() => received,
            _ = &mut stop => return,
        };
        match received {
            Ok(Some(notification)) => {
                match serde_json::from_str::<PolicyChange>(notification.payload()) {
                    Ok(change) => feed.publish(FeedEvent::Changed(change)),
                    Err(_) => tracing::warn!("ignoring a malformed policy change notification"),
                }
            }
            // The connection dropped: report it now, reconnect with a fresh listener.
            Ok(None) => {
                tracing::warn!("policy change feed lost; reconnecting");
                feed.publish(FeedEvent::Lost);
                listener = None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "policy change feed lost");
                feed.publish(FeedEvent::Lost);
                listener = None;
            }
        }
    }
}

async fn connect_listener(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    // Report a loss at once; reconnecting is the loop's job, so it can say when it is back.
    listener.eager_reconnect(false);
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

impl_store!(PgStore, sqlx::Postgres);

/// Fingerprints are kept as `BIGINT`: the same 64 bits, read as signed.
fn signed(runs: &[u64]) -> Vec<i64> {
    runs.iter()
        .map(|r| i64::from_ne_bytes(r.to_ne_bytes()))
        .collect()
}

fn unsigned(runs: &[i64]) -> Vec<u64> {
    runs.iter()
        .map(|r| u64::from_ne_bytes(r.to_ne_bytes()))
        .collect()
}

#[async_trait::async_trait]
impl super::SharedMemory for PgStore {
    async fn share(&self, rows: &[super::Shared]) -> Result<(), StoreError> {
        use super::Sharing;
        let traces: Vec<(&super::Shared, &String)> = rows
            .iter()
            .filter_map(|r| match &r.what {
                Sharing::Trace(trace) => Some((r, trace)),
                Sharing::Text { .. } => None,
            })
            .collect();
        let texts: Vec<(&super::Shared, u64, &Vec<u64>)> = rows
            .iter()
            .filter_map(|r| match &r.what {
                Sharing::Text { digest, runs } => Some((r, *digest, runs)),
                Sharing::Trace(_) => None,
            })
            .collect();
        let mut tx = self.pool.begin().await?;
        // One row per key in a statement (PostgreSQL refuses to update a row twice in one).
        let mut traces = traces;
        traces.sort_by(|a, b| (&a.0.tenant, a.1, &a.0.item).cmp(&(&b.0.tenant, b.1, &b.0.item)));
        traces.dedup_by(|a, b| (&a.0.tenant, a.1, &a.0.item) == (&b.0.tenant, b.1, &b.0.item));
        for chunk in traces.chunks(1000) {
            let mut insert = sqlx::QueryBuilder::<sqlx::Postgres>::new(
                "INSERT INTO lineage_traces (tenant, trace_id, store, collection, item_id, owner, answer, at) ",
            );
            insert.push_values(chunk, |mut row, (r, trace)| {
                row.push_bind(r.tenant.clone())
                    .push_bind((*trace).clone())
                    .push_bind(r.item.store.clone())
                    .push_bind(r.item.collection.clone())
                    .push_bind(r.item.item.clone())
                    .push_bind(r.owner.clone())
                    .push_bind(r.answer)
                    .push_bind(r.at);
            });
            // The owner stays: a row the completion of an erasure renamed keeps the reference.
            insert.push(" ON CONFLICT (tenant, trace_id, store, collection, item_id) DO UPDATE SET at = excluded.at");
            insert.build().execute(&mut *tx).await?;
        }
        let mut texts = texts;
        texts.sort_by(|a, b| (&a.0.tenant, &a.0.item, a.1).cmp(&(&b.0.tenant, &b.0.item, b.1)));
        texts.dedup_by(|a, b| (&a.0.tenant, &a.0.item, a.1) == (&b.0.tenant, &b.0.item, b.1));
        for chunk in texts.chunks(200) {
            let mut insert = sqlx::QueryBuilder::<sqlx::Postgres>::new(
                "INSERT INTO lineage_texts (tenant, store, collection, item_id, owner, answer, digest, runs, at) ",
            );
            insert.push_values(chunk, |mut row, (r, digest, runs)| {
                row.push_bind(r.tenant.clone())
                    .push_bind(r.item.store.clone())
                    .push_bind(r.item.collection.clone())
                    .push_bind(r.item.item.clone())
                    .push_bind(r.owner.clone())
                    .push_bind(r.answer)
                    .push_bind(signed(&[*digest])[0])
                    .push_bind(signed(runs))
                    .push_bind(r.at);
            });
            insert.push(" ON CONFLICT (tenant, store, collection, item_id, digest) DO UPDATE SET at = excluded.at");
            insert.build().execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn recall(
        &self,
        tenant: &str,
        trace: Option<&str>,
        runs: &[u64],
        since: chrono::DateTime<chrono::Utc>,
    ) -> Result<Vec<super::Recalled>, StoreError> {
        use sqlx::Row as _;
        let rows = sqlx::query(
            "SELECT store, collection, item_id, owner, answer, '{}'::bigint[] AS matched FROM lineage_traces
             WHERE tenant = $1 AND trace_id = $2 AND at >= $4
             UNION ALL
             SELECT store, collection, item_id, owner, answer,
                    ARRAY(SELECT unnest(runs) INTERSECT SELECT unnest($3::bigint[])) FROM lineage_texts
             WHERE tenant = $1 AND runs && $3::bigint[] AND at >= $4",
        )
        .bind(tenant)
        .bind(trace)
        .bind(signed(runs))
        .bind(since)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let matched: Vec<i64> = row.try_get("matched")?;
                Ok(super::Recalled {
                    item: super::ItemKey {
                        store: row.try_get("store")?,
                        collection: row.try_get("collection")?,
                        item: row.try_get("item_id")?,
                    },
                    owner: row.try_get("owner")?,
                    answer: row.try_get("answer")?,
                    runs: unsigned(&matched),
                })
            })
            .collect()
    }

    async fn forget_before(
        &self,
        before: chrono::DateTime<chrono::Utc>,
    ) -> Result<u64, StoreError> {
        let mut gone = 0;
        for table in ["lineage_traces", "lineage_texts"] {
            let sql = sqlx::AssertSqlSafe(format!("DELETE FROM {table} WHERE at < $1"));
            gone += sqlx::query(sql)
                .bind(before)
                .execute(&self.pool)
                .await?
                .rows_affected();
        }
        Ok(gone)
    }
}
