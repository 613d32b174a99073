//! The state store's lineage: items and their stamps, processors, derivative edges and decisions.

use super::*;

/// Lineage rows in passes that each name an id once, the n-th write of an id in the n-th pass:
/// applied pass after pass, they land as if applied one by one, in order.
pub(crate) fn in_passes(items: &[ItemRecord]) -> Vec<Vec<ItemRecord>> {
    let mut seen: std::collections::HashMap<(&str, &str, &str), usize> =
        std::collections::HashMap::new();
    let mut passes: Vec<Vec<ItemRecord>> = Vec::new();
    for item in items {
        let n = seen
            .entry((&item.store, &item.collection, &item.item_id))
            .or_insert(0);
        if passes.len() <= *n {
            passes.push(Vec::new());
        }
        passes[*n].push(item.clone());
        *n += 1;
    }
    passes
}

/// A lineage row: one stored item, whose it is, and what it was derived from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ItemRecord {
    pub store: String,
    pub collection: String,
    pub item_id: String,
    pub tenant: String,
    pub subject: String,
    pub purpose: String,
    pub category: String,
    pub layer: Layer,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub epoch: i64,
    pub source_ref: Option<String>,
    pub parents: Vec<String>,
}

/// An item where it is kept: the store (a route's name), the collection, the id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, serde::Deserialize)]
pub struct ItemKey {
    pub store: String,
    pub collection: String,
    pub item: String,
}

impl ItemKey {
    pub fn new(store: &str, collection: &str, item: &str) -> ItemKey {
        ItemKey {
            store: store.to_owned(),
            collection: collection.to_owned(),
            item: item.to_owned(),
        }
    }

    /// A stable, opaque reference to the item: an HMAC (with the audit `key`) of where it is
    /// kept, so that nobody without the key can confirm a guessed id (one may hold a subject's
    /// key) from a certificate.
    pub fn reference(&self, key: &[u8]) -> String {
        use hmac::{Hmac, KeyInit, Mac};
        // HMAC accepts keys of any length, so this never takes the error branch.
        let Ok(mut mac) = Hmac::<sha2::Sha256>::new_from_slice(key) else {
            return String::new();
        };
        for part in [&self.store, &self.collection, &self.item] {
            mac.update(part.as_bytes());
            mac.update(&[0]);
        }
        format!("dv_{}", &hex::encode(mac.finalize().into_bytes())[..24])
    }

    pub fn as_ref(&self) -> lethe_policy::ItemRef<'_> {
        lethe_policy::ItemRef {
            store: &self.store,
            collection: &self.collection,
            id: &self.item,
        }
    }
}

/// One edge of derivative lineage: `child` was derived from `parent`, each owned (stamped to)
/// the subject named when the edge was recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Edge {
    pub child: ItemKey,
    pub child_owner: String,
    pub parent: ItemKey,
    pub parent_owner: String,
    pub how: How,
    pub at: DateTime<Utc>,
}

/// What an item kept in `tenant` was derived from: its edges to its parents, which replace the
/// ones it had (a rewritten item derives from what its new content does) or, for an item that
/// grows (a thread), are added to them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    pub tenant: String,
    pub child: ItemKey,
    pub edges: Vec<Edge>,
    pub replace: bool,
}

/// How an erasure reaches what was derived from its subject's data (`[lineage]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Closure {
    /// Derivative lineage is off: an erasure reaches the subject's own items only.
    Off,
    /// Derivatives stamped to other subjects are hidden, then erased or released by a person.
    #[default]
    Review,
    /// Derivatives stamped to other subjects are hidden and erased with the subject's items.
    Erase,
}

/// What became of an item an erasure's closure reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Nothing is kept to decide on (a model's answer its provider did not store, an item
    /// deleted already, a store this request does not purge): it is hidden, and writes that
    /// would derive from it are refused, until the request completes and the window passes.
    Guard,
    /// Another subject's: a person erases or releases it.
    Undecided,
    Erase,
    /// Readable again for its own subject, its edges to the closure dropped.
    Release,
}

impl Decision {
    pub const ALL: [Decision; 4] = [
        Decision::Guard,
        Decision::Undecided,
        Decision::Erase,
        Decision::Release,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Guard => "guard",
            Decision::Undecided => "undecided",
            Decision::Erase => "erase",
            Decision::Release => "release",
        }
    }

    pub fn parse(s: &str) -> Option<Decision> {
        Decision::ALL.into_iter().find(|d| d.as_str() == s)
    }
}

/// An item an erasure's closure reached beyond the subject's own: derived from its data,
/// directly or through other derivatives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Derivative {
    /// [`ItemKey::reference`].
    pub reference: String,
    pub item: ItemKey,
    /// Whose it is, as lineage names it; `None` when lineage keeps no row of it.
    pub subject: Option<String>,
    /// Stamped to the subject (or an alias): purged with the subject's items.
    pub own: bool,
    /// How it was reached from its parents in the closure.
    pub how: Vec<How>,
    /// Its parents in the closure.
    pub parents: Vec<ItemKey>,
    pub decision: Decision,
    pub decided_by: Option<String>,
    pub decided_at: Option<DateTime<Utc>>,
    pub reason: Option<String>,
    /// When its store was verified not to hold it any more.
    pub erased_at: Option<DateTime<Utc>>,
}

/// What a replica remembers of the window and shares with the others (a PostgreSQL state
/// store): an item it served under a trace, or the fingerprints of a text it served or accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shared {
    pub tenant: String,
    pub item: ItemKey,
    pub owner: String,
    /// A model's answer.
    pub answer: bool,
    pub at: DateTime<Utc>,
    pub what: Sharing,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sharing {
    /// Served under this trace (hex).
    Trace(String),
    Text {
        digest: u64,
        runs: Vec<u64>,
    },
}

/// An item another replica remembered: read under the trace asked about, or holding some of the
/// runs asked about (`runs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recalled {
    pub item: ItemKey,
    pub owner: String,
    pub answer: bool,
    /// Empty: read under the trace.
    pub runs: Vec<u64>,
}

/// The window's memory the replicas of one state store share.
#[async_trait]
pub trait SharedMemory: Send + Sync {
    async fn share(&self, rows: &[Shared]) -> Result<(), StoreError>;
    /// Items of `tenant` remembered since `since`: served under `trace`, or holding one of
    /// `runs`.
    async fn recall(
        &self,
        tenant: &str,
        trace: Option<&str>,
        runs: &[u64],
        since: DateTime<Utc>,
    ) -> Result<Vec<Recalled>, StoreError>;
    /// Drops what was remembered before `before`; answers how many rows went.
    async fn forget_before(&self, before: DateTime<Utc>) -> Result<u64, StoreError>;
}

/// A model provider that received a subject's data, first and last time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcessorUse {
    pub tenant: String,
    pub subject: String,
    pub processor: String,
    pub first_at: DateTime<Utc>,
    pub last_at: DateTime<Utc>,
}

impl ItemRecord {
    /// The stamp the item was written with.
    pub fn stamp(&self) -> lethe_policy::Stamp {
        lethe_policy::Stamp {
            tenant: self.tenant.clone(),
            subject: self.subject.clone(),
            purpose: self.purpose.clone(),
            category: self.category.clone(),
            layer: self.layer,
            expires_at: self.expires_at,
            epoch: self.epoch,
        }
    }

    /// The lineage row of an item written through Lethe with `stamp`.
    pub fn stamped(
        store: &str,
        collection: &str,
        item_id: String,
        stamp: lethe_policy::Stamp,
        created_at: DateTime<Utc>,
        source_ref: Option<String>,
    ) -> ItemRecord {
        ItemRecord {
            store: store.to_owned(),
            collection: collection.to_owned(),
            item_id,
            tenant: stamp.tenant,
            subject: stamp.subject,
            purpose: stamp.purpose,
            category: stamp.category,
            layer: stamp.layer,
            created_at,
            expires_at: stamp.expires_at,
            epoch: stamp.epoch,
            source_ref,
            parents: Vec::new(),
        }
    }
}

#[async_trait]
pub trait Lineage: Send + Sync {
    /// Lineage rows of `subjects` in one store, (collection, item id): the live ones, or with
    /// `include_deleted` also those already marked deleted (a restored store has them back).
    async fn lineage_items(
        &self,
        tenant: &str,
        store: &str,
        subjects: &[String],
        include_deleted: bool,
    ) -> Result<Vec<(String, String)>, StoreError>;

    /// Records that providers received subjects' data: the first time is kept, the last moved on.
    async fn record_processors(&self, uses: &[ProcessorUse]) -> Result<(), StoreError>;

    /// The providers that received a subject's data.
    async fn processors(
        &self,
        tenant: &str,
        subject: &str,
    ) -> Result<Vec<ProcessorUse>, StoreError>;

    /// Records lineage rows; a row for an item already known replaces it if it has the same owner.
    async fn record_items(&self, items: &[ItemRecord]) -> Result<(), StoreError>;

    /// The owner (tenant, subject) of each of `ids` that lineage knows, live or deleted.
    async fn item_owners(
        &self,
        store: &str,
        collection: &str,
        ids: &[String],
    ) -> Result<BTreeMap<String, (String, String)>, StoreError>;

    /// The stamps lineage holds for the live ones of `ids` (the thread registry).
    async fn item_stamps(
        &self,
        store: &str,
        collection: &str,
        ids: &[String],
    ) -> Result<BTreeMap<String, lethe_policy::Stamp>, StoreError>;

    /// Marks lineage rows deleted; returns how many were live.
    async fn mark_items_deleted(
        &self,
        store: &str,
        collection: &str,
        ids: &[String],
        at: DateTime<Utc>,
    ) -> Result<u64, StoreError>;

    /// Live lineage rows (items and threads) of a subject, counted per store.
    async fn inventory(
        &self,
        tenant: &str,
        subject: &str,
    ) -> Result<BTreeMap<String, i64>, StoreError>;

    /// What the replicas share of the window's memory: `None` where one process owns the store
    /// (SQLite) and its memory is all there is.
    fn shared_memory(&self) -> Option<&dyn SharedMemory>;

    /// How flips reach what was derived from their subjects; set once, right after opening
    /// (unset: [`Closure::Review`]).
    fn use_closure(&self, closure: Closure);

    /// Replaces what each of `derived` was derived from (its edges), in one transaction.
    async fn record_derived(&self, derived: &[Derived]) -> Result<(), StoreError>;

    /// The edges to an item's parents and those from its children, oldest first.
    async fn edges_of(
        &self,
        tenant: &str,
        item: &ItemKey,
    ) -> Result<(Vec<Edge>, Vec<Edge>), StoreError>;

    /// What the subject's items were derived from, of other subjects' (their edges).
    async fn borrowed(&self, tenant: &str, subject: &str) -> Result<Vec<Edge>, StoreError>;

    /// The items closures hide in `tenant`: of requests still open, and of requests flipped at
    /// or after `since` (for a window after a flip, what would derive from them is refused).
    async fn hidden_items(
        &self,
        tenant: &str,
        since: DateTime<Utc>,
    ) -> Result<std::collections::HashSet<ItemKey>, StoreError>;

    /// A request's derivatives, as its flip and its purge's later looks found them.
    async fn derivatives(&self, request_id: &str) -> Result<Vec<Derivative>, StoreError>;

    /// What a flip of `keys` would reach now, with the decision it would take, where
    /// `targets` are purged; nothing is recorded (the dry run).
    async fn closure_of(
        &self,
        tenant: &str,
        keys: &[String],
        targets: &[String],
    ) -> Result<Vec<Derivative>, StoreError>;

    /// A person's decision on undecided derivatives `refs` of a flipped request: erased, or
    /// released (readable again for their own subject, their edges to the closure dropped). One
    /// audit event each, from the `audit` template; the request moves on, and completes once
    /// nothing is left to do.
    async fn decide_derivatives(
        &self,
        request_id: &str,
        refs: &[String],
        decision: Decision,
        reason: &str,
        at: DateTime<Utc>,
        audit: AuditEntry,
    ) -> Result<ErasureRecord, StoreError>;

    /// Records that derivatives of a request were verified gone from their store.
    async fn derivatives_erased(
        &self,
        request_id: &str,
        refs: &[String],
        at: DateTime<Utc>,
    ) -> Result<(), StoreError>;
}
