//! The state store's purge jobs, the move from verification to completion, tombstones and
//! certificates.

use super::*;

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
    /// What the purge found and did, once the job is done.
    pub result: Option<serde_json::Value>,
    /// Until then, what its attempts found and deleted so far (`erasure::Tally`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub so_far: Option<serde_json::Value>,
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
    /// `tally` counts what this attempt and the earlier ones found and deleted, for the next.
    Failed {
        error: String,
        retry_at: Option<DateTime<Utc>>,
        tally: Option<serde_json::Value>,
    },
}

#[async_trait]
pub trait Purges: Send + Sync {
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

    /// Tombstones of erasures completed at or after `since`, oldest first.
    async fn tombstones_since(&self, since: DateTime<Utc>) -> Result<Vec<Tombstone>, StoreError>;

    /// The certificate kept for an erasure request, if one was issued.
    async fn certificate(&self, request_id: &str) -> Result<Option<String>, StoreError>;

    /// Keeps `document` as the request's certificate unless one is kept already; answers the one
    /// kept, which is never replaced.
    async fn keep_certificate(
        &self,
        request_id: &str,
        document: &str,
    ) -> Result<String, StoreError>;
}
