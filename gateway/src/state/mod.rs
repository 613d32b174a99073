//! The state store: consent, retention, holds, subjects, lineage, erasure, audit.
//!
//! One trait, two implementations with the same schema in meaning: SQLite (embedded default, one
//! file) and PostgreSQL (shared by many replicas). Every change is written in one transaction
//! together with its audit event, so nothing is ever half-applied or unaudited.

mod derivatives;
pub mod feed;
mod migrate;
mod postgres;
mod sql;
mod sqlite;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use lethe_policy::audit::{
    AuditEntry, AuditRecord, ChainBreak, ChainHead, ChainVerifier, Links, TenantChainVerifier,
};
use lethe_policy::{
    ConsentGrant, How, Layer, LegalHold, RetentionPolicy, SubjectPolicy, SubjectState,
};
use serde::Serialize;

pub use feed::{Feed, FeedEvent, PolicyChange};
pub use postgres::PgStore;
pub use sqlite::SqliteStore;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("the consent grant is already revoked")]
    AlreadyRevoked,
    #[error("the legal hold is already released")]
    AlreadyReleased,
    #[error("the deadline is already extended or has passed, or the request is closed")]
    NotExtendable,
    #[error("the subject is suppressed or erased")]
    SubjectNotActive,
    #[error("{0}")]
    NotDecidable(String),
    #[error("{0}")]
    Approval(#[from] lethe_policy::ApprovalError),
    #[error("{0}")]
    Transition(#[from] lethe_policy::IllegalTransition),
    #[error("the state store is unavailable: {0}")]
    Unavailable(#[source] sqlx::Error),
    #[error("state store error: {0}")]
    Database(#[source] sqlx::Error),
    #[error("the state store holds data Lethe cannot read: {0}")]
    Corrupt(String),
    #[error("the state store was opened without the key of subject references")]
    NoSubjectKey,
    #[error("the audit chain's links are not keyed: run `lethe audit key-chain` once")]
    AuditUnkeyed,
    #[error("the audit chain's links were made with another audit key than this one")]
    WrongAuditKey,
    #[error("unsupported state store URL (expected sqlite://PATH or postgres://...): {0}")]
    UnsupportedUrl(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        use sqlx::Error as E;
        match e {
            E::RowNotFound => StoreError::NotFound,
            E::Io(_)
            | E::Tls(_)
            | E::PoolTimedOut
            | E::PoolClosed
            | E::WorkerCrashed
            | E::Protocol(_) => StoreError::Unavailable(e),
            E::ColumnDecode { .. }
            | E::Decode(_)
            | E::ColumnNotFound(_)
            | E::TypeNotFound { .. } => StoreError::Corrupt(e.to_string()),
            other => StoreError::Database(other),
        }
    }
}

/// One version of a tenant's retention rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionVersion {
    pub version: i64,
    pub policy: RetentionPolicy,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
}

/// A legal hold and who placed and released it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HoldRecord {
    #[serde(flatten)]
    pub hold: LegalHold,
    pub placed_by: String,
    pub released_by: Option<String>,
}

/// Which of a tenant's erasure requests a list shows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErasureFilter {
    pub state: Option<lethe_policy::ErasureState>,
    /// Only open requests (neither completed nor rejected).
    pub open: bool,
    /// Only requests whose deadline falls in this window.
    pub due: Option<DueWindow>,
}

/// Requests whose deadline is at or after `from` and before `to`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DueWindow {
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
}

/// Open requests by state, overdue ones, and the latencies of recent ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErasureStats {
    pub open: BTreeMap<String, i64>,
    pub overdue: i64,
    /// Of the requests received in the window: from the request to the flip (ms), and to the
    /// completion (s), for those that got there.
    pub online_ms: Vec<i64>,
    pub completion_s: Vec<i64>,
}

/// An erasure request and where it stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErasureRecord {
    pub id: String,
    pub tenant: String,
    pub subject: String,
    /// Other keys of the same person; all are suppressed and purged together.
    pub aliases: Vec<String>,
    pub ticket: String,
    pub reason: String,
    pub state: lethe_policy::ErasureState,
    pub requested_by: String,
    pub requested_at: DateTime<Utc>,
    /// The statutory deadline, set at receipt and moved only by the extension.
    pub deadline: DateTime<Utc>,
    pub approvals: Vec<String>,
    pub suppressed_at: Option<DateTime<Utc>>,
    pub completed_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
    /// The statutory deadline's extension, once made.
    pub extension: Option<DeadlineExtension>,
    /// Why the request was refused, once it is.
    pub rejection: Option<Rejection>,
}

/// Months a request's deadline may be extended by, once (GDPR art. 12(3): "by two further
/// months where necessary, taking into account the complexity and number of the requests").
pub const MAX_EXTENSION_MONTHS: u32 = 2;

/// Who extended a request's deadline, by how much, when and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadlineExtension {
    pub months: u32,
    pub reason: String,
    pub by: String,
    pub at: DateTime<Utc>,
}

/// Who refused a request before its flip, when and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rejection {
    pub reason: String,
    pub by: String,
    pub at: DateTime<Utc>,
}

impl ErasureRecord {
    /// The subject and its aliases.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.subject.as_str()).chain(self.aliases.iter().map(String::as_str))
    }
}

/// `months` after `at` (the last day of a shorter month when the day is past its end).
pub fn deadline(at: DateTime<Utc>, months: u32) -> DateTime<Utc> {
    at.checked_add_months(chrono::Months::new(months))
        .unwrap_or(at)
}

/// Where a request's flip stands in one governed database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GovernedFlip {
    pub database: String,
    /// When the flip was found to hold there (applied, no transaction from before it left);
    /// `None` while it does not.
    pub applied_at: Option<DateTime<Utc>>,
}

/// A flip still to hold in a governed database: whose keys, in which epoch at least.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingFlip {
    pub request_id: String,
    pub tenant: String,
    /// Each flipped key with the epoch the state store gave it; `None` for a key another
    /// request's completion forgot since (the governed databases keep nothing of it either).
    pub keys: Vec<(String, Option<i64>)>,
}

/// One store's share of an erasure: waiting for the flip, then pending, running, done or failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PurgeJob {
    pub id: String,
    pub request_id: String,
    pub target: String,
    pub state: String,
    pub attempts: i64,
    pub next_attempt_at: DateTime<Utc>,
    pub last_error: Option<String>,
    pub result: Option<serde_json::Value>,
    pub updated_at: DateTime<Utc>,
}

/// A completed erasure, kept so that it can be applied again to stores restored from a backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tombstone {
    pub request_id: String,
    pub tenant: String,
    pub subject: String,
    /// `{"keys": [...], "targets": [...]}`.
    pub scope: serde_json::Value,
    pub erased_at: DateTime<Utc>,
}

impl Tombstone {
    pub fn keys(&self) -> Vec<String> {
        self.scope["keys"]
            .as_array()
            .map(|k| {
                k.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// How a purge job ended this time.
#[derive(Debug, Clone, PartialEq)]
pub enum JobOutcome {
    /// The store holds nothing of the subject any more; `result` goes into the certificate.
    Done(serde_json::Value),
    /// Try again at `retry_at`, or, when `None`, give up: the request goes to `exception`.
    Failed {
        error: String,
        retry_at: Option<DateTime<Utc>>,
    },
}

/// A lineage row whose retention has run out (its deadline passed, or its consent was revoked):
/// where it is, and whose lineage says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredItem {
    pub store: String,
    pub collection: String,
    pub item_id: String,
    pub tenant: String,
    pub subject: String,
}

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
pub trait Store: Send + Sync + 'static {
    /// `sqlite` or `postgres`.
    fn backend(&self) -> &'static str;
    /// Applies pending migrations; returns the versions it applied.
    async fn migrate(&self) -> Result<Vec<i64>, StoreError>;
    async fn ping(&self) -> Result<(), StoreError>;

    /// Key material Lethe generated for itself: stores `fresh` under `name` unless a value is
    /// already there, and returns the stored value (so every replica ends up with the same key).
    async fn generated_secret(
        &self,
        name: &str,
        fresh: &[u8],
        at: DateTime<Utc>,
    ) -> Result<Vec<u8>, StoreError>;

    /// The key of subject references (the audit HMAC key). With it the store keeps an erased
    /// subject only as its reference and still knows it by its key; without it, lookups and
    /// completions fail. Set once, right after opening; a second key is ignored.
    fn use_subject_key(&self, key: &[u8]);

    /// Policy changes of this process and, on PostgreSQL, of every replica.
    fn feed(&self) -> &Arc<Feed>;

    /// What decisions need about one subject: state (active in epoch 0 when unknown) and grants.
    async fn subject_policy(
        &self,
        tenant: &str,
        subject: &str,
    ) -> Result<SubjectPolicy, StoreError>;

    async fn subject(
        &self,
        tenant: &str,
        subject: &str,
    ) -> Result<Option<SubjectState>, StoreError>;

    /// Creates the subject (active, epoch 0) if Lethe has not seen it; refuses a suppressed or
    /// erased subject.
    async fn create_grant(&self, grant: &ConsentGrant, audit: AuditEntry)
    -> Result<(), StoreError>;
    async fn grant(&self, id: &str) -> Result<ConsentGrant, StoreError>;
    /// Revokes a grant; when no other grant still covers storing that purpose and category, the
    /// subject's items kept for it expire now (the sweeper then purges them).
    async fn revoke_grant(
        &self,
        id: &str,
        at: DateTime<Utc>,
        audit: AuditEntry,
    ) -> Result<ConsentGrant, StoreError>;
    async fn grants(&self, tenant: &str, subject: &str) -> Result<Vec<ConsentGrant>, StoreError>;

    async fn retention(&self, tenant: &str) -> Result<Option<RetentionVersion>, StoreError>;
    /// Every (tenant, subject) the store has a state for (a governed database's first copy).
    async fn known_subjects(&self) -> Result<Vec<(String, String)>, StoreError>;
    /// Every tenant with retention rules.
    async fn retention_tenants(&self) -> Result<Vec<String>, StoreError>;
    /// Stores `policy` as the tenant's next version.
    async fn replace_retention(
        &self,
        tenant: &str,
        policy: &RetentionPolicy,
        at: DateTime<Utc>,
        actor: &str,
        audit: AuditEntry,
    ) -> Result<RetentionVersion, StoreError>;

    async fn place_hold(&self, hold: &HoldRecord, audit: AuditEntry) -> Result<(), StoreError>;
    async fn hold(&self, id: &str) -> Result<HoldRecord, StoreError>;
    /// Releases a hold; held erasures no other hold covers then continue (they are flipped).
    async fn release_hold(
        &self,
        id: &str,
        at: DateTime<Utc>,
        actor: &str,
        audit: AuditEntry,
    ) -> Result<HoldRecord, StoreError>;
    /// The tenant's holds; with a subject, those that can apply to it (tenant-wide and its own).
    async fn holds(
        &self,
        tenant: &str,
        subject: Option<&str>,
    ) -> Result<Vec<HoldRecord>, StoreError>;

    /// Files an erasure request with one waiting purge job per target, all in one transaction.
    async fn create_erasure(
        &self,
        request: &ErasureRecord,
        targets: &[String],
        audit: AuditEntry,
    ) -> Result<(), StoreError>;
    /// A page of a tenant's erasure requests, the newest first.
    async fn erasures(
        &self,
        tenant: &str,
        filter: &ErasureFilter,
        offset: u32,
        limit: u32,
    ) -> Result<Vec<ErasureRecord>, StoreError>;
    /// Where a tenant's requests stand: open ones by state, how many are still open with their
    /// deadline before `overdue_at`, and the latencies of those received since `since`.
    async fn erasure_stats(
        &self,
        tenant: &str,
        overdue_at: DateTime<Utc>,
        since: DateTime<Utc>,
    ) -> Result<ErasureStats, StoreError>;
    /// Refuses a request that is not flipped yet (`requested`, `held`): it is `rejected`, its
    /// purge jobs cancelled, with its event.
    async fn reject_erasure(
        &self,
        id: &str,
        rejection: &Rejection,
        audit: AuditEntry,
    ) -> Result<ErasureRecord, StoreError>;
    /// Extends a request's deadline by `extension.months`, once, while it is open and its
    /// deadline has not passed (at `extension.at`); the extension and its event are written
    /// together.
    async fn extend_erasure(
        &self,
        id: &str,
        extension: &DeadlineExtension,
        audit: AuditEntry,
    ) -> Result<ErasureRecord, StoreError>;
    async fn erasure(&self, id: &str) -> Result<ErasureRecord, StoreError>;
    async fn purge_jobs(&self, request_id: &str) -> Result<Vec<PurgeJob>, StoreError>;
    /// Records `actor`'s approval. Once the request is authorised it is held (an active legal
    /// hold covers one of its keys) or flipped: every key suppressed in a new epoch and the purge
    /// jobs released, in the same transaction; every cache hears of it before this returns.
    async fn approve_erasure(
        &self,
        id: &str,
        actor: &str,
        required: usize,
        at: DateTime<Utc>,
        audit: AuditEntry,
    ) -> Result<ErasureRecord, StoreError>;

    /// A person takes a request that ran out of attempts (`exception` -> `manual_review`,
    /// `ErasureEvent::Escalate`), or, having dealt with the cause, resumes it
    /// (`manual_review` -> `propagating`, `ErasureEvent::Resume`: the failed stores are tried
    /// again from their first attempt).
    async fn review_erasure(
        &self,
        id: &str,
        event: lethe_policy::ErasureEvent,
        at: DateTime<Utc>,
        audit: AuditEntry,
    ) -> Result<ErasureRecord, StoreError>;

    /// The governed databases every flip must hold in too (by name); set once, right after
    /// opening (unset: none, and a flip holds once the state store has it).
    fn use_governed(&self, databases: Vec<String>);
    /// Each governed database a request's flip must hold in, and since when it does.
    async fn governed_flips(&self, request_id: &str) -> Result<Vec<GovernedFlip>, StoreError>;
    /// The requests whose flip does not hold in `database` yet, with the keys it flipped.
    async fn pending_flips(&self, database: &str) -> Result<Vec<PendingFlip>, StoreError>;
    /// Records that a request's flip holds in `database` since `at`, with its event (from the
    /// `audit` template). Once it holds in every one, the request is `suppressed` then, and
    /// its purge may start. Recording it again changes nothing.
    async fn flip_applied(
        &self,
        request_id: &str,
        database: &str,
        at: DateTime<Utc>,
        audit: AuditEntry,
    ) -> Result<ErasureRecord, StoreError>;

    /// Claims the next due purge job (pending, retrying, or running with an expired lease) of a
    /// request suppressed at or before `settled`, for `worker` until `lease_until`; its request
    /// moves to `propagating`.
    async fn claim_purge_job(
        &self,
        worker: &str,
        now: DateTime<Utc>,
        settled: DateTime<Utc>,
        lease_until: DateTime<Utc>,
    ) -> Result<Option<PurgeJob>, StoreError>;
    /// Extends the lease of a job `worker` is still running; false when it is not its job any
    /// more.
    async fn renew_purge_job(
        &self,
        job_id: &str,
        worker: &str,
        lease_until: DateTime<Utc>,
    ) -> Result<bool, StoreError>;
    /// Records a job's outcome, with its audit event (`purge.done` / `purge.failed`, from the
    /// `audit` template) in the same transaction, and moves its request along. When every job is
    /// done the request is verified against lineage (no live row of its keys in the purged
    /// stores) and completed: keys marked erased, a tombstone kept.
    async fn finish_purge_job(
        &self,
        job_id: &str,
        outcome: JobOutcome,
        now: DateTime<Utc>,
        audit: AuditEntry,
    ) -> Result<ErasureRecord, StoreError>;
    /// Forgets the keys of erasures that completed while Lethe still kept them (a state store
    /// from an earlier version), as completion now does; answers how many requests it forgot.
    async fn forget_erased(&self, at: DateTime<Utc>) -> Result<u64, StoreError>;
    /// Live lineage rows whose retention has run out, not under any active legal hold, oldest
    /// first.
    async fn expired_items(
        &self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<ExpiredItem>, StoreError>;
    /// Tombstones of erasures completed at or after `since`, oldest first.
    async fn tombstones_since(&self, since: DateTime<Utc>) -> Result<Vec<Tombstone>, StoreError>;
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

    /// The certificate kept for an erasure request, if one was issued.
    async fn certificate(&self, request_id: &str) -> Result<Option<String>, StoreError>;
    /// Keeps `document` as the request's certificate unless one is kept already; answers the one
    /// kept, which is never replaced.
    async fn keep_certificate(
        &self,
        request_id: &str,
        document: &str,
    ) -> Result<String, StoreError>;

    /// Appends one event to the chain (for events that change nothing else).
    async fn append_audit(&self, entry: AuditEntry) -> Result<AuditRecord, StoreError>;
    /// Rows with `seq > after`, in order, at most `limit`; only one tenant's when `tenant` is set.
    async fn audit_page(
        &self,
        after: i64,
        limit: i64,
        tenant: Option<&str>,
    ) -> Result<Vec<AuditRecord>, StoreError>;
    /// A tenant's events naming any of `refs` (a request and its purge jobs), in order, at most
    /// `limit`.
    async fn audit_of(
        &self,
        tenant: &str,
        refs: &[String],
        limit: i64,
    ) -> Result<Vec<AuditRecord>, StoreError>;
    /// The head the store recorded with the last append: of the whole chain, or of one tenant's.
    async fn audit_head(&self, tenant: Option<&str>) -> Result<ChainHead, StoreError>;
    /// Seals a chain written before links were keyed again with the audit key, once: it is
    /// verified as it was written first (a broken one is left as it is: `Corrupt`), then every
    /// link and head is rewritten and an event naming the old head (`audit.chain_keyed`) is
    /// appended. Answers the old head when it keyed the chain.
    async fn key_audit_chain(&self, at: DateTime<Utc>) -> Result<Option<ChainHead>, StoreError>;
    /// Whether the chain's links are keyed, and the check of the key they are made with (see
    /// `lethe_policy::audit::key_check`), once the first keyed link was.
    async fn audit_keying(&self) -> Result<(bool, Option<String>), StoreError>;
    /// The head of every tenant's chain.
    async fn tenant_heads(&self) -> Result<Vec<(String, ChainHead)>, StoreError>;
    /// The position of the last head signed and kept, per chain (`""`: the whole chain).
    async fn last_signed_heads(&self) -> Result<BTreeMap<String, i64>, StoreError>;
    /// Keeps a signed head (once per chain and position).
    async fn keep_signed_head(&self, head: &SignedHead) -> Result<(), StoreError>;
    /// The signed heads of the whole chain (`None`) or of one tenant's, in order.
    async fn signed_heads(&self, tenant: Option<&str>) -> Result<Vec<SignedHead>, StoreError>;

    /// Keeps a new console session, and drops those that expired before it began.
    async fn create_session(&self, session: &ConsoleSession) -> Result<(), StoreError>;
    /// The session of an id's hash, if one is kept.
    async fn session(&self, id_hash: &str) -> Result<Option<ConsoleSession>, StoreError>;
    /// Records that a session was used at `at`.
    async fn touch_session(&self, id_hash: &str, at: DateTime<Utc>) -> Result<(), StoreError>;
    /// Ends a session (sign-out); whether one was kept.
    async fn end_session(&self, id_hash: &str) -> Result<bool, StoreError>;
    /// Revokes a token by its id, with its audit event; every cache hears of it before this
    /// returns. A token revoked already: `AlreadyRevoked`.
    async fn revoke_token(
        &self,
        jti: &str,
        at: DateTime<Utc>,
        by: &str,
        audit: AuditEntry,
    ) -> Result<(), StoreError>;
    /// Every revoked token id.
    async fn revoked_tokens(&self) -> Result<std::collections::HashSet<String>, StoreError>;
}

/// A console session, kept server-side: the cookie holds a random id, the store its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSession {
    pub id_hash: String,
    /// The claims of the token the person signed in with (JSON), never the token itself.
    pub claims: String,
    /// The session's CSRF token, which every form of it carries.
    pub csrf: String,
    pub created_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    /// The token's expiry, or sooner.
    pub expires_at: DateTime<Utc>,
}

/// The version of a chain whose links are keyed (`audit_chain.chain_version`; 1: plain SHA-256).
pub(crate) const KEYED_CHAIN: i32 = 2;

/// A head of the audit chain (or of a tenant's), signed with the certificates' key when it was
/// the head, and kept apart from the chain (and, printed by `lethe audit head`, anywhere else):
/// a chain that no longer holds it was cut or rewritten.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SignedHead {
    /// The tenant whose chain it is; `None`: the whole chain.
    pub tenant: Option<String>,
    pub seq: i64,
    pub hash: String,
    pub signed_at: DateTime<Utc>,
    pub signature: HeadSignature,
}

impl SignedHead {
    /// The position it names, as a verifier's anchor.
    pub fn anchor(&self) -> ChainHead {
        ChainHead {
            seq: self.seq,
            hash: self.hash.clone(),
        }
    }
}

/// An Ed25519 signature over a head's canonical JSON (`tenant`, `seq`, `hash`, `signed_at`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct HeadSignature {
    pub algorithm: String,
    pub public_key: String,
    pub value: String,
}

impl HeadSignature {
    pub fn ed25519(public_key: String, value: String) -> HeadSignature {
        HeadSignature {
            algorithm: "Ed25519".into(),
            public_key,
            value,
        }
    }
}

/// The kinds of state store a URL can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateKind {
    /// `sqlite://PATH`, created if missing.
    Sqlite,
    /// `postgres://...` or `postgresql://...`.
    Postgres,
}

impl StateKind {
    /// The kind a state URL names; the one check both the configuration and `connect` use.
    pub fn of(url: &str) -> Option<StateKind> {
        if url.starts_with("sqlite://") {
            Some(StateKind::Sqlite)
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(StateKind::Postgres)
        } else {
            None
        }
    }
}

/// Opens the store a URL names: `sqlite://PATH` (created if missing) or `postgres://...`.
pub async fn connect(url: &str) -> Result<Arc<dyn Store>, StoreError> {
    match StateKind::of(url) {
        Some(StateKind::Sqlite) => Ok(Arc::new(SqliteStore::connect(url).await?)),
        Some(StateKind::Postgres) => Ok(Arc::new(PgStore::connect(url).await?)),
        None => Err(StoreError::UnsupportedUrl(url.to_owned())),
    }
}

/// Whether the audit chain is intact, reading it page by page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ChainReport {
    Intact {
        ok: bool,
        head: ChainHead,
    },
    Broken {
        ok: bool,
        first_bad_seq: i64,
        problem: ChainBreak,
        message: String,
    },
}

/// Verifies the whole chain (`tenant` unset) or one tenant's chain, up to its recorded head,
/// with `key` (the audit key): it must be keyed with that key, and still hold every head signed
/// and kept for it (each of them `genuine`, when that can be told: signed with the certificates'
/// key) and `saved` (a head saved elsewhere, or carried by a certificate) if one is given.
pub async fn verify_audit(
    store: &dyn Store,
    key: &[u8],
    genuine: Option<&(dyn Fn(&SignedHead) -> bool + Sync)>,
    tenant: Option<&str>,
    saved: Option<&ChainHead>,
) -> Result<ChainReport, StoreError> {
    const PAGE: i64 = 1000;
    let broken = |problem: ChainBreak| ChainReport::Broken {
        ok: false,
        first_bad_seq: problem.seq(),
        message: problem.to_string(),
        problem,
    };
    let (keyed, check) = store.audit_keying().await?;
    if !keyed {
        return Ok(broken(ChainBreak::Unkeyed));
    }
    if check.is_some_and(|c| c != lethe_policy::audit::key_check(key)) {
        return Ok(broken(ChainBreak::WrongKey));
    }
    // Read before the head: a head signed meanwhile is never past the head read after it.
    let kept = store.signed_heads(tenant).await?;
    if let Some(genuine) = genuine
        && let Some(forged) = kept.iter().find(|h| !genuine(h))
    {
        return Ok(broken(ChainBreak::ForgedHead { seq: forged.seq }));
    }
    let anchors: Vec<ChainHead> = kept
        .iter()
        .map(SignedHead::anchor)
        .chain(saved.cloned())
        .collect();
    let recorded = store.audit_head(tenant).await?;
    let links = Links::Keyed(key);
    let mut whole = ChainVerifier::new(links).anchored(anchors.clone());
    let mut own = tenant.map(|t| TenantChainVerifier::new(links, t).anchored(anchors));
    // Events appended while it reads lie past the recorded head: not this verification's.
    let recorded_at = |r: &AuditRecord| match (tenant, &r.tenant_chain) {
        (Some(_), Some(link)) => link.seq <= recorded.seq,
        (Some(_), None) => false,
        (None, _) => r.seq <= recorded.seq,
    };
    let mut after = 0;
    let outcome = loop {
        let page = store.audit_page(after, PAGE, tenant).await?;
        let Some(last) = page.last() else {
            break match own {
                Some(own) => own.finish(&recorded),
                None => whole.finish(&recorded),
            };
        };
        after = last.seq;
        let within: Vec<&AuditRecord> = page.iter().filter(|r| recorded_at(r)).collect();
        let checked = within.iter().try_for_each(|r| match own.as_mut() {
            Some(own) => own.push(r),
            None => whole.push(r),
        });
        if let Err(e) = checked {
            break Err(e);
        }
        if within.len() < page.len() {
            break match own {
                Some(own) => own.finish(&recorded),
                None => whole.finish(&recorded),
            };
        }
    };
    Ok(match outcome {
        Ok(head) => ChainReport::Intact { ok: true, head },
        Err(problem) => broken(problem),
    })
}

#[cfg(test)]
pub(crate) mod tests;
