//! The SQL of console sessions and revoked tokens, for both backends. Expanded inside
//! `impl_store!`, in its module: its imports, `Row`, `Tx` and shared helpers are in scope.

/// Implements [`Sessions`](crate::Sessions) for `$store` over `$db`.
macro_rules! sessions_sql {
    ($store:ty, $db:ty) => {
        #[async_trait]
        impl Sessions for $store {
            async fn create_session(&self, session: &ConsoleSession) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                sqlx::query("DELETE FROM console_sessions WHERE expires_at <= $1")
                    .bind(session.created_at)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(
                    "INSERT INTO console_sessions (id_hash, actor, claims, csrf, created_at, \
                        last_seen_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(&session.id_hash)
                .bind(&session.actor)
                .bind(&session.claims)
                .bind(&session.csrf)
                .bind(session.created_at)
                .bind(session.last_seen_at)
                .bind(session.expires_at)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn session(&self, id_hash: &str) -> Result<Option<ConsoleSession>, StoreError> {
                let row = sqlx::query(
                    "SELECT id_hash, actor, claims, csrf, created_at, \
                    last_seen_at, expires_at FROM console_sessions WHERE id_hash = $1",
                )
                .bind(id_hash)
                .fetch_optional(&self.pool)
                .await?;
                row.map(|row| {
                    Ok(ConsoleSession {
                        id_hash: row.try_get("id_hash")?,
                        actor: row.try_get("actor")?,
                        claims: row.try_get("claims")?,
                        csrf: row.try_get("csrf")?,
                        created_at: row.try_get("created_at")?,
                        last_seen_at: row.try_get("last_seen_at")?,
                        expires_at: row.try_get("expires_at")?,
                    })
                })
                .transpose()
            }

            async fn touch_session(
                &self,
                id_hash: &str,
                at: DateTime<Utc>,
            ) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                sqlx::query(
                    "UPDATE console_sessions SET last_seen_at = $2 WHERE \
                    id_hash = $1 AND last_seen_at < $2",
                )
                .bind(id_hash)
                .bind(at)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn end_session(&self, id_hash: &str) -> Result<bool, StoreError> {
                let mut tx = self.write_tx().await?;
                let ended = sqlx::query(
                    "DELETE FROM console_sessions WHERE id_hash = \
                    $1",
                )
                .bind(id_hash)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                tx.commit().await?;
                Ok(ended == 1)
            }

            async fn signed_out_by_provider(
                &self,
                actor: &str,
                before: DateTime<Utc>,
                token_id: &str,
                keep_until: DateTime<Utc>,
                audit: AuditEntry,
            ) -> Result<Option<u64>, StoreError> {
                let mut tx = self.write_tx().await?;
                sqlx::query("DELETE FROM logout_tokens WHERE until < $1")
                    .bind(crate::now())
                    .execute(&mut *tx)
                    .await?;
                let taken = sqlx::query(
                    "INSERT INTO logout_tokens (jti, until) VALUES ($1, $2) \
                    ON CONFLICT (jti) DO NOTHING",
                )
                .bind(token_id)
                .bind(keep_until)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if taken == 0 {
                    return Ok(None);
                }
                // Sessions from before actors were kept have none: no actor ends them.
                let ended = sqlx::query(
                    "DELETE FROM console_sessions WHERE actor = $1 AND actor <> '' \
                    AND created_at < $2",
                )
                .bind(actor)
                .bind(before)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                append_in(&mut tx, &self.subject_key, audit).await?;
                tx.commit().await?;
                Ok(Some(ended))
            }

            async fn revoke_token(
                &self,
                jti: &str,
                at: DateTime<Utc>,
                by: &str,
                audit: AuditEntry,
            ) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                let inserted = sqlx::query(
                    "INSERT INTO revoked_tokens (jti, \
                    revoked_at, revoked_by) VALUES ($1, $2, $3) ON CONFLICT (jti) DO \
                    NOTHING",
                )
                .bind(jti)
                .bind(at)
                .bind(by)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if inserted == 0 {
                    return Err(StoreError::AlreadyRevoked);
                }
                append_in(&mut tx, &self.subject_key, audit).await?;
                commit_change(self, tx, PolicyChange::of_revoked_token(jti)).await
            }

            async fn revoked_tokens(
                &self,
            ) -> Result<std::collections::HashSet<String>, StoreError> {
                Ok(sqlx::query_scalar("SELECT jti FROM revoked_tokens")
                    .fetch_all(&self.pool)
                    .await?
                    .into_iter()
                    .collect())
            }
        }
    };
}
pub(crate) use sessions_sql;
