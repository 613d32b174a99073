//! Policy snapshots per (tenant, subject), retention rules per tenant and the items erasures'
//! closures hide per tenant, cached in moka and invalidated by the store's change feed. While the
//! feed is down the cache is bypassed and every decision reads the state store; when that fails
//! too, the request is refused.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lethe_policy::{ConsentStatus, ItemRef, PolicyView, RetentionPolicy, SubjectPolicy};
use moka::sync::Cache;

use crate::state::{FeedEvent, PolicyChange, Store, StoreError};

pub struct PolicyCache {
    store: Arc<dyn Store>,
    subjects: Cache<SubjectKey, Loaded<SubjectPolicy>>,
    retention: Cache<String, Loaded<RetentionPolicy>>,
    hidden: Cache<String, Loaded<Hidden>>,
    /// How long after its flip what a completed erasure hid still counts (`[lineage] window`).
    window: chrono::TimeDelta,
    /// Entries also age out, a backstop should a change notification ever be missed unnoticed:
    /// time is counted in bands of half the longest age, and an entry loaded two bands ago is
    /// loaded again. Checked when read rather than with moka's time to live, which keeps a
    /// second list node for each entry.
    started: Instant,
    band: Duration,
    /// Lookups answered from the cache, loaded from the store, and made while the feed was down
    /// (the cache bypassed), for the metrics.
    lookups: [AtomicU64; 3],
}

/// What the cache did for a lookup: its index in `lookups`, and its label.
const LOOKUPS: [&str; 3] = ["hit", "miss", "bypassed"];

/// How long a cached entry is used at most.
const MAX_AGE: Duration = Duration::from_secs(300);

/// A cached value, and the band of time it was loaded in.
struct Loaded<V> {
    value: Arc<V>,
    band: u64,
}

// Not derived: that would ask for `V: Clone`, and only the pointer is cloned.
impl<V> Clone for Loaded<V> {
    fn clone(&self) -> Self {
        Loaded {
            value: Arc::clone(&self.value),
            band: self.band,
        }
    }
}

/// A subject's place in the cache: the SHA-256 of its tenant and key, each length-prefixed. A
/// fixed 32 bytes (the cache holds up to 100 000 of them) whatever the names' lengths, with no
/// allocation of its own; two subjects share a key only through a SHA-256 collision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct SubjectKey([u8; 32]);

impl SubjectKey {
    fn new(tenant: &str, subject: &str) -> SubjectKey {
        use sha2::Digest;
        let mut digest = sha2::Sha256::new();
        for name in [tenant, subject] {
            digest.update((name.len() as u64).to_be_bytes());
            digest.update(name.as_bytes());
        }
        SubjectKey(digest.finalize().into())
    }
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

    /// The ids hidden in `collection` of `store`.
    pub fn ids(&self, store: &str, collection: &str) -> Vec<String> {
        self.0
            .get(store)
            .and_then(|c| c.get(collection))
            .map(|ids| ids.iter().cloned().collect())
            .unwrap_or_default()
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
        Self::aging(store, capacity, window, MAX_AGE)
    }

    /// A cache whose entries are used for `max_age` at most.
    fn aging(
        store: Arc<dyn Store>,
        capacity: u64,
        window: Duration,
        max_age: Duration,
    ) -> Arc<Self> {
        let cache = Arc::new(PolicyCache {
            subjects: Cache::new(capacity),
            retention: Cache::new(10_000),
            hidden: Cache::new(10_000),
            window: chrono::TimeDelta::from_std(window).unwrap_or(chrono::TimeDelta::MAX),
            started: Instant::now(),
            band: (max_age / 2).max(Duration::from_millis(1)),
            store: Arc::clone(&store),
            lookups: Default::default(),
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
                self.subjects.invalidate(&SubjectKey::new(tenant, subject));
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
        cache: &Cache<K, Loaded<V>>,
        key: K,
        load: F,
    ) -> Result<Arc<V>, StoreError>
    where
        K: std::hash::Hash + Eq + Send + Sync + 'static,
        V: Send + Sync + 'static,
        F: std::future::Future<Output = Result<Arc<V>, StoreError>>,
    {
        let feed = self.store.feed();
        let band = self.band();
        let healthy = feed.is_healthy();
        if healthy
            && let Some(hit) = cache.get(&key)
            && band.saturating_sub(hit.band) < 2
        {
            self.lookups[0].fetch_add(1, Ordering::Relaxed);
            return Ok(hit.value);
        }
        self.lookups[if healthy { 1 } else { 2 }].fetch_add(1, Ordering::Relaxed);
        let seq = feed.seq();
        let value = load.await?;
        if feed.is_healthy() && feed.seq() == seq {
            let loaded = Loaded {
                value: Arc::clone(&value),
                band,
            };
            cache.insert(key, loaded);
        }
        Ok(value)
    }

    /// The lookups so far, in Prometheus' text format.
    pub fn render(&self, out: &mut String) {
        out.push_str("# HELP lethe_policy_cache_lookups_total Policy lookups: answered from the cache (hit), loaded from the state store (miss), or loaded while the change feed was down (bypassed).\n# TYPE lethe_policy_cache_lookups_total counter\n");
        for (result, count) in LOOKUPS.iter().zip(&self.lookups) {
            let count = count.load(Ordering::Relaxed);
            out.push_str(&format!(
                "lethe_policy_cache_lookups_total{{result=\"{result}\"}} {count}\n"
            ));
        }
    }

    /// The band of time it is now (see `band`).
    fn band(&self) -> u64 {
        let band = self.started.elapsed().as_nanos() / self.band.as_nanos();
        u64::try_from(band).unwrap_or(u64::MAX)
    }

    /// A subject's policy, without the grants that were revoked or had expired when it was
    /// loaded (they never cover anything again). Every subject left with nothing (active, epoch
    /// 0, no grant) shares one value, so that a cache filled with names that were never granted
    /// anything holds only their keys.
    pub async fn subject(
        &self,
        tenant: &str,
        subject: &str,
    ) -> Result<Arc<SubjectPolicy>, StoreError> {
        static UNKNOWN: std::sync::LazyLock<Arc<SubjectPolicy>> =
            std::sync::LazyLock::new(Arc::default);
        let load = async {
            let mut policy = self.store.subject_policy(tenant, subject).await?;
            let now = crate::now();
            policy.grants.retain(|g| {
                matches!(
                    g.status(now),
                    ConsentStatus::Active | ConsentStatus::Pending
                )
            });
            Ok(if policy == **UNKNOWN {
                Arc::clone(&UNKNOWN)
            } else {
                Arc::new(policy)
            })
        };
        self.cached(&self.subjects, SubjectKey::new(tenant, subject), load)
            .await
    }

    pub async fn retention(&self, tenant: &str) -> Result<Arc<RetentionPolicy>, StoreError> {
        let load = async {
            Ok(Arc::new(
                self.store
                    .retention(tenant)
                    .await?
                    .map(|v| v.policy)
                    .unwrap_or_default(),
            ))
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
            Ok(Arc::new(hidden))
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

impl View {
    /// Whether it holds the policy of every one of `subjects` (of its tenant).
    pub fn holds<'a>(&self, mut subjects: impl Iterator<Item = &'a str>) -> bool {
        subjects.all(|subject| self.subjects.contains_key(subject))
    }

    /// The ids its tenant's erasures' closures hide in `collection` of `store`.
    pub fn hidden_ids(&self, store: &str, collection: &str) -> Vec<String> {
        self.hidden.ids(store, collection)
    }
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
