//! The state store's erasure requests: filing, approval, holds, the flip (here and in governed
//! databases), refusal and extension.

use super::*;

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

/// Every tenant's requests and purge jobs at one time, for the metrics (no tenant is named).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ErasureOverview {
    /// Open requests by state.
    pub open: BTreeMap<String, i64>,
    /// Open requests past their deadline.
    pub overdue: i64,
    /// Purge jobs not done (nor cancelled), by state.
    pub jobs: BTreeMap<String, i64>,
    /// How long the longest-waiting due job (pending or retrying) has been due, in seconds.
    pub oldest_due_seconds: f64,
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

#[async_trait]
pub trait Erasures: Send + Sync {
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

    /// Every tenant's open requests by state and how many are past their deadline at `now`, and
    /// the unfinished purge jobs by state with how long the oldest due one has waited.
    async fn erasure_overview(&self, now: DateTime<Utc>) -> Result<ErasureOverview, StoreError>;

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
}
