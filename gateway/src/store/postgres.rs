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
    /// Dropped with the store, which stops the listener.
    _stop_listener: oneshot::Sender<()>,
}

impl PgStore {
    const BACKEND: &'static str = "postgres";
    /// How a read inside a write transaction locks its row.
    const FOR_UPDATE: &'static str = " FOR UPDATE";
    /// How workers claim a job without waiting on one another.
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    /// Appends from every replica queue on this row lock; the chain cannot fork.
    const LOCK_AUDIT_HEAD: &'static str =
        "SELECT seq, hash FROM audit_head WHERE id = 1 FOR UPDATE";

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

    async fn run_migrations(&self) -> Result<Vec<i64>, StoreError> {
        // Replicas starting together take turns; the second finds the work done.
        run_migrations!(
            self.write_tx(),
            "SELECT pg_advisory_xact_lock(7400)",
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
