//! The state store's retention rules, legal holds, and items past their deadline.

use super::*;

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

#[async_trait]
pub trait Retention: Send + Sync {
    async fn retention(&self, tenant: &str) -> Result<Option<RetentionVersion>, StoreError>;

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

    /// Live lineage rows whose retention has run out, not under any active legal hold, oldest
    /// first.
    async fn expired_items(
        &self,
        now: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<ExpiredItem>, StoreError>;
}
