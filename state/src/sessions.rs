//! The state store's console sessions and revoked tokens.

use super::*;

/// A console session, kept server-side: the cookie holds a random id, the store its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleSession {
    pub id_hash: String,
    /// Who it is: the claims' `sub`.
    pub actor: String,
    /// The claims of the token the person signed in with (JSON), never the token itself.
    pub claims: String,
    /// The session's CSRF token, which every form of it carries.
    pub csrf: String,
    pub created_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    /// The token's expiry, or sooner.
    pub expires_at: DateTime<Utc>,
}

#[async_trait]
pub trait Sessions: Send + Sync {
    /// Keeps a new console session, and drops those that expired before it began.
    async fn create_session(&self, session: &ConsoleSession) -> Result<(), StoreError>;

    /// The session of an id's hash, if one is kept.
    async fn session(&self, id_hash: &str) -> Result<Option<ConsoleSession>, StoreError>;

    /// Records that a session was used at `at`.
    async fn touch_session(&self, id_hash: &str, at: DateTime<Utc>) -> Result<(), StoreError>;

    /// Ends a session (sign-out); whether one was kept.
    async fn end_session(&self, id_hash: &str) -> Result<bool, StoreError>;

    /// A sign-out by the person's sign-in provider (a back-channel logout token, `token_id` its
    /// `jti`, kept until `keep_until`): every session of `actor` begun before `before` ends, in
    /// one transaction with the token taken and its audit event; how many. A token taken
    /// already ends and writes nothing more: `None`, on every replica.
    async fn signed_out_by_provider(
        &self,
        actor: &str,
        before: DateTime<Utc>,
        token_id: &str,
        keep_until: DateTime<Utc>,
        audit: AuditEntry,
    ) -> Result<Option<u64>, StoreError>;

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
