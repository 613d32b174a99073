//! The SQL of retention rules, legal holds, and items past their deadline, for both backends.
//! Expanded inside `impl_store!`, in its module: its imports, `Row`, `Tx` and shared helpers are in
//! scope.

/// Implements [`Retention`](crate::Retention) for `$store` over `$db`.
macro_rules! retention_sql {
    ($store:ty, $db:ty) => {
        fn hold_from_row(row: &Row) -> Result<HoldRecord, StoreError> {
            Ok(HoldRecord {
                hold: LegalHold {
                    id: row.try_get("id")?,
                    tenant: row.try_get("tenant")?,
                    subject: row.try_get("subject")?,
                    reason: row.try_get("reason")?,
                    placed_at: row.try_get("placed_at")?,
                    released_at: row.try_get("released_at")?,
                },
                placed_by: row.try_get("placed_by")?,
                released_by: row.try_get("released_by")?,
            })
        }

        #[async_trait]
        impl Retention for $store {
            async fn retention(
                &self,
                tenant: &str,
            ) -> Result<Option<RetentionVersion>, StoreError> {
                let row = sqlx::query(
                    "SELECT version, policy, created_at, created_by FROM \
                        retention_rule_sets
                        WHERE tenant = $1 ORDER BY version DESC LIMIT 1",
                )
                .bind(tenant)
                .fetch_optional(&self.pool)
                .await?;
                row.map(|row| {
                    let policy: Json<RetentionPolicy> = row.try_get("policy")?;
                    Ok(RetentionVersion {
                        version: row.try_get("version")?,
                        policy: policy.0,
                        created_at: row.try_get("created_at")?,
                        created_by: row.try_get("created_by")?,
                    })
                })
                .transpose()
            }

            async fn retention_tenants(&self) -> Result<Vec<String>, StoreError> {
                Ok(sqlx::query_scalar(
                    "SELECT DISTINCT tenant FROM retention_rule_sets \
                    ORDER BY tenant",
                )
                .fetch_all(&self.pool)
                .await?)
            }

            async fn replace_retention(
                &self,
                tenant: &str,
                policy: &RetentionPolicy,
                at: DateTime<Utc>,
                actor: &str,
                audit: AuditEntry,
            ) -> Result<RetentionVersion, StoreError> {
                let mut tx = self.write_tx().await?;
                let last: Option<i64> = sqlx::query_scalar(
                    "SELECT MAX(version) FROM \
                    retention_rule_sets WHERE tenant = $1",
                )
                .bind(tenant)
                .fetch_one(&mut *tx)
                .await?;
                let version = last.unwrap_or(0) + 1;
                sqlx::query(
                    "INSERT INTO retention_rule_sets (tenant, version, policy, \
                        created_at, created_by) VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(tenant)
                .bind(version)
                .bind(Json(policy))
                .bind(at)
                .bind(actor)
                .execute(&mut *tx)
                .await?;
                append_in(
                    &mut tx,
                    &self.subject_key,
                    AuditEntry {
                        target_ref: Some(version.to_string()),
                        ..audit
                    },
                )
                .await?;
                commit_change(self, tx, PolicyChange::of(tenant, None)).await?;
                Ok(RetentionVersion {
                    version,
                    policy: policy.clone(),
                    created_at: at,
                    created_by: actor.to_owned(),
                })
            }

            async fn place_hold(
                &self,
                hold: &HoldRecord,
                audit: AuditEntry,
            ) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                let h = &hold.hold;
                sqlx::query(
                    "INSERT INTO legal_holds (id, tenant, subject, reason, placed_at, \
                        placed_by, released_at, released_by)
                        VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(&h.id)
                .bind(&h.tenant)
                .bind(&h.subject)
                .bind(&h.reason)
                .bind(h.placed_at)
                .bind(&hold.placed_by)
                .bind(h.released_at)
                .bind(&hold.released_by)
                .execute(&mut *tx)
                .await?;
                append_in(&mut tx, &self.subject_key, audit).await?;
                // Governed databases keep held rows from their sweep.
                commit_change(self, tx, PolicyChange::of(&h.tenant, h.subject.as_deref())).await
            }

            async fn hold(&self, id: &str) -> Result<HoldRecord, StoreError> {
                let sql = concat!(crate::sql::select_holds!(), "WHERE id = $1");
                hold_from_row(&sqlx::query(sql).bind(id).fetch_one(&self.pool).await?)
            }

            async fn release_hold(
                &self,
                id: &str,
                at: DateTime<Utc>,
                actor: &str,
                audit: AuditEntry,
            ) -> Result<HoldRecord, StoreError> {
                let mut tx = self.write_tx().await?;
                let updated = sqlx::query(
                    "UPDATE legal_holds SET released_at = $1, \
                    released_by = $2 WHERE id = $3 AND released_at IS NULL",
                )
                .bind(at)
                .bind(actor)
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                let sql = concat!(crate::sql::select_holds!(), "WHERE id = $1");
                let hold = hold_from_row(&sqlx::query(sql).bind(id).fetch_one(&mut *tx).await?)?;
                if updated == 0 {
                    return Err(StoreError::AlreadyReleased);
                }
                append_in(&mut tx, &self.subject_key, audit.clone()).await?;
                // Held erasures this hold covered continue, unless another hold still covers them.
                let sql = sqlx::AssertSqlSafe(format!(
                    "SELECT {ERASURE_COLUMNS} FROM \
                    erasure_requests WHERE tenant = $1 AND state = 'held' ORDER BY \
                    requested_at"
                ));
                let rows = sqlx::query(sql)
                    .bind(&hold.hold.tenant)
                    .fetch_all(&mut *tx)
                    .await?;
                let mut changes = vec![PolicyChange::of(
                    &hold.hold.tenant,
                    hold.hold.subject.as_deref(),
                )];
                for row in &rows {
                    let mut record = erasure_from_row(row)?;
                    if held(&mut tx, &record, at).await? {
                        continue;
                    }
                    step(&mut record, ErasureEvent::HoldReleased, at)?;
                    let subject_ref = audit.subject_ref.clone();
                    let resumed = AuditEntry {
                        subject_ref,
                        ..audit.clone()
                    };
                    changes.extend(
                        hold_or_flip(
                            &mut tx,
                            &self.subject_key,
                            &mut record,
                            self.closure(),
                            self.governed(),
                            at,
                            &resumed,
                        )
                        .await?,
                    );
                }
                commit_changes(self, tx, changes).await?;
                Ok(hold)
            }

            async fn holds(
                &self,
                tenant: &str,
                subject: Option<&str>,
            ) -> Result<Vec<HoldRecord>, StoreError> {
                let sql = concat!(
                    crate::sql::select_holds!(),
                    "WHERE tenant = $1 AND ($2 IS NULL OR subject IS NULL OR subject = \
                        $2) ORDER BY placed_at, id"
                );
                let rows = sqlx::query(sql)
                    .bind(tenant)
                    .bind(subject)
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter().map(hold_from_row).collect()
            }

            async fn expired_items(
                &self,
                now: DateTime<Utc>,
                limit: i64,
            ) -> Result<Vec<ExpiredItem>, StoreError> {
                let rows = sqlx::query(
                    "SELECT store, collection, item_id, tenant, subject FROM items i
                        WHERE deleted_at IS NULL AND expires_at <= $1
                        AND NOT EXISTS (SELECT 1 FROM legal_holds h WHERE h.tenant = \
                        i.tenant AND h.released_at IS NULL
                                     AND (h.subject IS NULL OR h.subject = i.subject))
                        ORDER BY expires_at LIMIT $2",
                )
                .bind(now)
                .bind(limit)
                .fetch_all(&self.pool)
                .await?;
                rows.iter()
                    .map(|r| {
                        Ok(ExpiredItem {
                            store: r.try_get("store")?,
                            collection: r.try_get("collection")?,
                            item_id: r.try_get("item_id")?,
                            tenant: r.try_get("tenant")?,
                            subject: r.try_get("subject")?,
                        })
                    })
                    .collect()
            }
        }
    };
}
pub(crate) use retention_sql;
