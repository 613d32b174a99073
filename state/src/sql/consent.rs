//! The SQL of subjects and their consent grants, for both backends. Expanded inside `impl_store!`,
//! in its module: its imports, `Row`, `Tx` and shared helpers are in scope.

/// Implements [`Consents`](crate::Consents) for `$store` over `$db`.
macro_rules! consent_sql {
    ($store:ty, $db:ty) => {
        fn grant_from_row(row: &Row) -> Result<ConsentGrant, StoreError> {
            let actions: Json<BTreeSet<Action>> = row.try_get("actions")?;
            Ok(ConsentGrant {
                id: row.try_get("id")?,
                tenant: row.try_get("tenant")?,
                subject: row.try_get("subject")?,
                purpose: row.try_get("purpose")?,
                category: row.try_get("category")?,
                actions: actions.0,
                granted_at: row.try_get("granted_at")?,
                expires_at: row.try_get("expires_at")?,
                revoked_at: row.try_get("revoked_at")?,
                policy_version: row.try_get("policy_version")?,
                source: row.try_get("source")?,
            })
        }

        #[async_trait]
        impl Consents for $store {
            async fn subject(
                &self,
                tenant: &str,
                subject: &str,
            ) -> Result<Option<SubjectState>, StoreError> {
                let name = forgotten_name(&self.subject_key, tenant, subject)?;
                let rows = sqlx::query(
                    "SELECT status, epoch FROM subjects WHERE \
                    tenant = $1 AND subject IN ($2, $3)",
                )
                .bind(tenant)
                .bind(subject)
                .bind(&name)
                .fetch_all(&self.pool)
                .await?;
                // Under its key, and under its reference once an erasure of it completed: the
                // stricter state and the later epoch decide.
                let mut state: Option<SubjectState> = None;
                for row in &rows {
                    let found = SubjectState {
                        status: status_of(&row.try_get::<String, _>("status")?)?,
                        epoch: row.try_get("epoch")?,
                    };
                    state = Some(match state {
                        None => found,
                        Some(seen) => SubjectState {
                            status: strictest(seen.status, found.status),
                            epoch: seen.epoch.max(found.epoch),
                        },
                    });
                }
                Ok(state)
            }

            async fn subject_policy(
                &self,
                tenant: &str,
                subject: &str,
            ) -> Result<SubjectPolicy, StoreError> {
                let state = self.subject(tenant, subject).await?.unwrap_or_default();
                let grants = self.grants(tenant, subject).await?;
                Ok(SubjectPolicy { state, grants })
            }

            async fn create_grant(
                &self,
                grant: &ConsentGrant,
                audit: AuditEntry,
            ) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                sqlx::query(
                    "INSERT INTO subjects (tenant, subject, status, epoch, created_at, \
                        updated_at)
                        VALUES ($1, $2, 'active', 0, $3, $3) ON CONFLICT (tenant, \
                        subject) DO NOTHING",
                )
                .bind(&grant.tenant)
                .bind(&grant.subject)
                .bind(grant.granted_at)
                .execute(&mut *tx)
                .await?;
                let name = forgotten_name(&self.subject_key, &grant.tenant, &grant.subject)?;
                let statuses: Vec<String> = sqlx::query_scalar(
                    "SELECT status FROM \
                    subjects WHERE tenant = $1 AND subject IN ($2, $3)",
                )
                .bind(&grant.tenant)
                .bind(&grant.subject)
                .bind(&name)
                .fetch_all(&mut *tx)
                .await?;
                for status in &statuses {
                    if status_of(status)? != SubjectStatus::Active {
                        return Err(StoreError::SubjectNotActive);
                    }
                }
                sqlx::query(
                    "INSERT INTO consent_grants (id, tenant, subject, purpose, \
                        category, actions, granted_at, expires_at, revoked_at, \
                        policy_version, source)
                        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                )
                .bind(&grant.id)
                .bind(&grant.tenant)
                .bind(&grant.subject)
                .bind(&grant.purpose)
                .bind(&grant.category)
                .bind(Json(&grant.actions))
                .bind(grant.granted_at)
                .bind(grant.expires_at)
                .bind(grant.revoked_at)
                .bind(grant.policy_version)
                .bind(&grant.source)
                .execute(&mut *tx)
                .await?;
                append_in(&mut tx, &self.subject_key, audit).await?;
                let change = PolicyChange::of_subject(&grant.tenant, &grant.subject);
                commit_change(self, tx, change).await
            }

            async fn grant(&self, id: &str) -> Result<ConsentGrant, StoreError> {
                let sql = concat!(crate::sql::select_grants!(), "WHERE id = $1");
                let row = sqlx::query(sql).bind(id).fetch_one(&self.pool).await?;
                grant_from_row(&row)
            }

            async fn revoke_grant(
                &self,
                id: &str,
                at: DateTime<Utc>,
                audit: AuditEntry,
            ) -> Result<ConsentGrant, StoreError> {
                let mut tx = self.write_tx().await?;
                let updated = sqlx::query(
                    "UPDATE consent_grants SET revoked_at = $1 \
                    WHERE id = $2 AND revoked_at IS NULL",
                )
                .bind(at)
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                let sql = concat!(crate::sql::select_grants!(), "WHERE id = $1");
                let grant = grant_from_row(&sqlx::query(sql).bind(id).fetch_one(&mut *tx).await?)?;
                if updated == 0 {
                    return Err(StoreError::AlreadyRevoked);
                }
                let sql = concat!(
                    crate::sql::select_grants!(),
                    "WHERE tenant = $1 AND subject = \
                    $2"
                );
                let rows = sqlx::query(sql)
                    .bind(&grant.tenant)
                    .bind(&grant.subject)
                    .fetch_all(&mut *tx)
                    .await?;
                let grants: Vec<ConsentGrant> =
                    rows.iter().map(grant_from_row).collect::<Result<_, _>>()?;
                let still_covered = lethe_policy::consent::coverage_end(
                    &grants,
                    &grant.purpose,
                    &grant.category,
                    Action::Store,
                    at,
                )
                .is_some();
                if !still_covered {
                    sqlx::query(
                        "UPDATE items SET expires_at = $1 WHERE tenant = $2 AND \
                            subject = $3 AND purpose = $4 AND category = $5
                            AND deleted_at IS NULL AND expires_at > $1",
                    )
                    .bind(at)
                    .bind(&grant.tenant)
                    .bind(&grant.subject)
                    .bind(&grant.purpose)
                    .bind(&grant.category)
                    .execute(&mut *tx)
                    .await?;
                }
                append_in(&mut tx, &self.subject_key, audit).await?;
                let change = PolicyChange::of_subject(&grant.tenant, &grant.subject);
                commit_change(self, tx, change).await?;
                Ok(grant)
            }

            async fn grants(
                &self,
                tenant: &str,
                subject: &str,
            ) -> Result<Vec<ConsentGrant>, StoreError> {
                let sql = concat!(
                    crate::sql::select_grants!(),
                    "WHERE tenant = $1 AND subject = \
                    $2 ORDER BY granted_at, id"
                );
                let rows = sqlx::query(sql)
                    .bind(tenant)
                    .bind(subject)
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter().map(grant_from_row).collect()
            }

            async fn known_subjects(&self) -> Result<Vec<(String, String)>, StoreError> {
                let rows = sqlx::query(
                    "SELECT tenant, subject FROM subjects ORDER BY \
                    tenant, subject",
                )
                .fetch_all(&self.pool)
                .await?;
                rows.iter()
                    .map(|row| Ok((row.try_get("tenant")?, row.try_get("subject")?)))
                    .collect()
            }
        }
    };
}
pub(crate) use consent_sql;
