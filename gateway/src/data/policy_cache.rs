//! Policy snapshots per (tenant, subject), retention rules per tenant and the items erasures'
//! closures hide per tenant, cached in moka and invalidated by the store's change feed. While the
//! feed is down the cache is bypassed and every decision reads the state store; when that fails
//! too, the request is refused.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use lethe_policy::{ItemRef, PolicyView, RetentionPolicy, SubjectPolicy};
use moka::sync::Cache;

use crate::store::{FeedEvent, PolicyChange, Store, StoreError};

pub struct PolicyCache {
    store: Arc<dyn Store>,
    subjects: Cache<(String, String), Arc<SubjectPolicy>>,
    retention: Cache<String, Arc<RetentionPolicy>>,
    hidden: Cache<String, Arc<Hidden>>,
    /// How long after its flip what a completed erasure hid still counts (`[lineage] window`).
    window: chrono::TimeDelta,
}

/// The items a tenant's erasures' closures hide: store -> collection -> ids.
#[derive(Debug, Default)]
pub struct Hidden(HashMap<String, HashMap<String, HashSet<String>>>);

impl Hidden {
    pub fn contains(&self, item: &ItemRef<'_>) -> bool {
        self.0
            .get(item.store)
            .and_then(|c| c.get(item.collection))
            .is_some_and(|ids| ids.contains(item.id))
    }

    /// Whether an item of `collection` whose id starts with `prefix` is hidden.
    pub fn holds_under(&self, store: &str, collection: &str, prefix: &str) -> bool {
        self.0
            .get(store)
            .and_then(|c| c.get(collection))
            .is_some_and(|ids| ids.iter().any(|id| id.starts_with(prefix)))
    }
}

impl PolicyCache {
    pub fn new(store: Arc<dyn Store>, capacity: u64, window: Duration) -> Arc<Self> {
        // Entries also age out, a backstop should a change notification ever be missed unnoticed.
        let ttl = Duration::from_secs(300);
        let cache = Arc::new(PolicyCache {
            subjects: Cache::builder()
                .max_capacity(capacity)
                .time_to_live(ttl)
                .build(),
            retention: Cache::builder()
                .max_capacity(10_000)
                .time_to_live(ttl)
                .build(),
            hidden: Cache::builder()
                .max_capacity(10_000)
                .time_to_live(ttl)
                .build(),
            window: chrono::TimeDelta::from_std(window).unwrap_or(chrono::TimeDelta::MAX),
            store: Arc::clone(&store),
        });
        let weak = Arc::downgrade(&cache);
        store.feed().on_event(move |event| {
            if let Some(cache) = weak.upgrade() {
                cache.apply(event);
            }
        });
        cache
    }

    fn apply(&self, event: &FeedEvent) {
        match event {
            FeedEvent::Changed(PolicyChange {
                tenant,
                derivatives: true,
                ..
            }) => self.hidden.invalidate(tenant),
            FeedEvent::Changed(PolicyChange {
                tenant,
                subject: Some(subject),
                ..
            }) => {
                self.subjects.invalidate(&(tenant.clone(), subject.clone()));
            }
            FeedEvent::Changed(PolicyChange {
                tenant,
                subject: None,
                ..
            }) => self.retention.invalidate(tenant),
            FeedEvent::Lost | FeedEvent::Restored => {
                self.subjects.invalidate_all();
                self.retention.invalidate_all();
                self.hidden.invalidate_all();
            }
        }
    }

    /// Reads through the cache. A value loaded while a change arrived is used for this request but
    /// not cached, so a racing invalidation can never be overwritten by older data.
    async fn cached<K, V, F>(
        &self,
        cache: &Cache<K, Arc<V>>,
        key: K,
        load: F,
    ) -> Result<Arc<V>, StoreError>
    where
        K: std::hash::Hash + Eq + Send + Sync + 'static,
        V: Send + Sync + 'static,
        F: std::future::Future<Output = Result<V, StoreError>>,
    {
        let feed = self.store.feed();
        if feed.is_healthy()
            && let Some(hit) = cache.get(&key)
        {
            return Ok(hit);
        }
        let seq = feed.seq();
        let loaded = Arc::new(load.await?);
        if feed.is_healthy() && feed.seq() == seq {
            cache.insert(key, Arc::clone(&loaded));
        }
        Ok(loaded)
    }

    pub async fn subject(
        &self,
        tenant: &str,
        subject: &str,
    ) -> Result<Arc<SubjectPolicy>, StoreError> {
        let key = (tenant.to_owned(), subject.to_owned());
        self.cached(
            &self.subjects,
            key,
            self.store.subject_policy(tenant, subject),
        )
        .await
    }

    pub async fn retention(&self, tenant: &str) -> Result<Arc<RetentionPolicy>, StoreError> {
        let load = async {
            Ok(self
                .store
                .retention(tenant)
                .await?
                .map(|v| v.policy)
                .unwrap_or_default())
        };
        self.cached(&self.retention, tenant.to_owned(), load).await
    }

    /// The items the tenant's erasures' closures hide now.
    pub async fn hidden(&self, tenant: &str) -> Result<Arc<Hidden>, StoreError> {
        let load = async {
            let since = crate::now() - self.window;
            let mut hidden = Hidden::default();
            for item in self.store.hidden_items(tenant, since).await? {
                hidden
                    .0
                    .entry(item.store)
                    .or_default()
                    .entry(item.collection)
                    .or_default()
                    .insert(item.item);
            }
            Ok(hidden)
        };
        self.cached(&self.hidden, tenant.to_owned(), load).await
    }

    /// The policy of `subjects` in `tenant`, for one decision.
    pub async fn view<'a>(
        &self,
        tenant: &str,
        subjects: impl IntoIterator<Item = &'a str>,
    ) -> Result<View, StoreError> {
        let mut loaded = HashMap::new();
        for subject in subjects {
            if !loaded.contains_key(subject) {
                loaded.insert(subject.to_owned(), self.subject(tenant, subject).await?);
            }
        }
        Ok(View {
            tenant: tenant.to_owned(),
            subjects: loaded,
            retention: self.retention(tenant).await?,
            hidden: self.hidden(tenant).await?,
        })
    }

    /// The policy of the subjects of `tenant` among `owners` (the `(tenant, subject)` stamps of a
    /// store's answer): what deciding that answer again needs. Other tenants' are not loaded.
    pub async fn view_of_owners(
        &self,
        tenant: &str,
        owners: &std::collections::BTreeSet<(String, String)>,
    ) -> Result<View, StoreError> {
        // Collected first: iterator adaptors held across the await would make the future not Send.
        let subjects: Vec<&str> = owners
            .iter()
            .filter(|(t, _)| t == tenant)
            .map(|(_, s)| s.as_str())
            .collect();
        self.view(tenant, subjects).await
    }
}

/// The slice of policy one request needs.
pub struct View {
    tenant: String,
    subjects: HashMap<String, Arc<SubjectPolicy>>,
    retention: Arc<RetentionPolicy>,
    hidden: Arc<Hidden>,
}

impl PolicyView for View {
    fn subject(&self, tenant: &str, subject: &str) -> Option<&SubjectPolicy> {
        (tenant == self.tenant)
            .then(|| self.subjects.get(subject).map(Arc::as_ref))
            .flatten()
    }
    fn retention(&self, tenant: &str) -> Option<&RetentionPolicy> {
        (tenant == self.tenant).then_some(self.retention.as_ref())
    }
    fn derivative_suppressed(&self, tenant: &str, item: &ItemRef<'_>) -> bool {
        tenant == self.tenant && self.hidden.contains(item)
    }
}

#[cfg(test)]
mod tests;
