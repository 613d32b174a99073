//! The state store's subjects and their consent grants.

use super::*;

#[async_trait]
pub trait Consents: Send + Sync {
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

    /// Every (tenant, subject) the store has a state for (a governed database's first copy).
    async fn known_subjects(&self) -> Result<Vec<(String, String)>, StoreError>;
}
