//! The SQL of erasure requests (filing, approval, refusal, extension, listing, the flip in
//! governed databases), for both backends. Expanded inside `impl_store!`, in its module: its
//! imports, `Row`, `Tx` and shared helpers are in scope.

/// Implements [`Erasures`](crate::Erasures) for `$store` over `$db`.
macro_rules! erasure_sql {
    ($store:ty, $db:ty) => {
        const ERASURE_COLUMNS: &str = "id, tenant, subject, aliases, ticket, reason, \
            state, requested_by, requested_at, due_at, approvals, suppressed_at, \
            completed_at, updated_at, extended_months, extension_reason, extended_by, \
            extended_at, rejection_reason, rejected_by, rejected_at";

        /// Adds to `select` the condition that a request's deadline falls in `due`.
        fn push_due(select: &mut sqlx::QueryBuilder<$db>, due: &DueWindow) {
            if let Some(from) = due.from {
                select.push(" AND due_at >= ").push_bind(from);
            }
            if let Some(to) = due.to {
                select.push(" AND due_at < ").push_bind(to);
            }
        }

        /// The request `id`, locked until `tx` ends (`FOR UPDATE` on PostgreSQL; SQLite's one
        /// writer holds the whole store already).
        async fn locked_erasure(tx: &mut Tx, id: &str) -> Result<ErasureRecord, StoreError> {
            let sql = sqlx::AssertSqlSafe(format!(
                "SELECT {ERASURE_COLUMNS} FROM erasure_requests WHERE id = $1{}",
                <$store>::FOR_UPDATE
            ));
            erasure_from_row(&sqlx::query(sql).bind(id).fetch_one(&mut **tx).await?)
        }

        fn erasure_from_row(row: &Row) -> Result<ErasureRecord, StoreError> {
            let state: String = row.try_get("state")?;
            let aliases: Json<Vec<String>> = row.try_get("aliases")?;
            let approvals: Json<Vec<String>> = row.try_get("approvals")?;
            Ok(ErasureRecord {
                id: row.try_get("id")?,
                tenant: row.try_get("tenant")?,
                subject: row.try_get("subject")?,
                aliases: aliases.0,
                ticket: row.try_get("ticket")?,
                reason: row.try_get("reason")?,
                state: ErasureState::parse(&state).ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "unknown \
                    erasure state {state:?}"
                    ))
                })?,
                requested_by: row.try_get("requested_by")?,
                requested_at: row.try_get("requested_at")?,
                deadline: row.try_get("due_at")?,
                approvals: approvals.0,
                suppressed_at: row.try_get("suppressed_at")?,
                completed_at: row.try_get("completed_at")?,
                updated_at: row.try_get("updated_at")?,
                extension: extension_from_row(row)?,
                rejection: rejection_from_row(row)?,
            })
        }

        fn rejection_from_row(row: &Row) -> Result<Option<Rejection>, StoreError> {
            let reason: Option<String> = row.try_get("rejection_reason")?;
            let by: Option<String> = row.try_get("rejected_by")?;
            let at: Option<DateTime<Utc>> = row.try_get("rejected_at")?;
            Ok(match (reason, by, at) {
                (Some(reason), Some(by), Some(at)) => Some(Rejection { reason, by, at }),
                (None, None, None) => None,
                _ => {
                    return Err(StoreError::Corrupt(
                        "a rejection without its reason, \
                    author or date"
                            .into(),
                    ))
                }
            })
        }

        fn extension_from_row(row: &Row) -> Result<Option<DeadlineExtension>, StoreError> {
            let months: i32 = row.try_get("extended_months")?;
            let Ok(months @ 1..) = u32::try_from(months) else {
                return Ok(None);
            };
            let (Some(reason), Some(by), Some(at)) = (
                row.try_get("extension_reason")?,
                row.try_get("extended_by")?,
                row.try_get("extended_at")?,
            ) else {
                return Err(StoreError::Corrupt(
                    "an extended deadline without its \
                    reason, author or date"
                        .into(),
                ));
            };
            Ok(Some(DeadlineExtension {
                months,
                reason,
                by,
                at,
            }))
        }

        #[async_trait]
        impl Erasures for $store {
            async fn create_erasure(
                &self,
                request: &ErasureRecord,
                targets: &[String],
                audit: AuditEntry,
            ) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                sqlx::query(
                    "INSERT INTO erasure_requests (id, tenant, subject, aliases, \
                        ticket, reason, state, requested_by, requested_at, approvals, \
                        suppressed_at, completed_at, updated_at, due_at)
                        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
                        $13, $14)",
                )
                .bind(&request.id)
                .bind(&request.tenant)
                .bind(&request.subject)
                .bind(Json(&request.aliases))
                .bind(&request.ticket)
                .bind(&request.reason)
                .bind(request.state.as_str())
                .bind(&request.requested_by)
                .bind(request.requested_at)
                .bind(Json(&request.approvals))
                .bind(request.suppressed_at)
                .bind(request.completed_at)
                .bind(request.updated_at)
                .bind(request.deadline)
                .execute(&mut *tx)
                .await?;
                for target in targets {
                    sqlx::query(
                        "INSERT INTO purge_jobs (id, request_id, target, state, \
                            attempts, next_attempt_at, updated_at) VALUES ($1, $2, $3, \
                            'waiting', 0, $4, $4)",
                    )
                    .bind(format!("pj_{}", uuid::Uuid::new_v4().simple()))
                    .bind(&request.id)
                    .bind(target)
                    .bind(request.requested_at)
                    .execute(&mut *tx)
                    .await?;
                }
                append_in(&mut tx, &self.subject_key, audit).await?;
                tx.commit().await?;
                Ok(())
            }

            async fn erasures(
                &self,
                tenant: &str,
                filter: &ErasureFilter,
                offset: u32,
                limit: u32,
            ) -> Result<Vec<ErasureRecord>, StoreError> {
                let mut select = sqlx::QueryBuilder::<$db>::new(format!(
                    "SELECT \
                    {ERASURE_COLUMNS} FROM erasure_requests WHERE tenant = "
                ));
                select.push_bind(tenant.to_owned());
                if let Some(state) = filter.state {
                    select.push(" AND state = ").push_bind(state.to_string());
                }
                if filter.open {
                    select.push(" AND state NOT IN ('completed', 'rejected')");
                }
                if let Some(due) = &filter.due {
                    push_due(&mut select, due);
                }
                select
                    .push(" ORDER BY requested_at DESC, id DESC LIMIT ")
                    .push_bind(i64::from(limit));
                select.push(" OFFSET ").push_bind(i64::from(offset));
                let rows = select.build().fetch_all(&self.pool).await?;
                rows.iter().map(erasure_from_row).collect()
            }

            async fn erasure_overview(
                &self,
                now: DateTime<Utc>,
            ) -> Result<ErasureOverview, StoreError> {
                let mut overview = ErasureOverview::default();
                for (sql, counts) in [
                    (
                        "SELECT state, count(*) AS n FROM erasure_requests WHERE state NOT IN \
                        ('completed', 'rejected') GROUP BY state",
                        &mut overview.open,
                    ),
                    (
                        "SELECT state, count(*) AS n FROM purge_jobs WHERE state NOT IN \
                        ('done', 'cancelled') GROUP BY state",
                        &mut overview.jobs,
                    ),
                ] {
                    for row in &sqlx::query(sql).fetch_all(&self.pool).await? {
                        counts.insert(row.try_get("state")?, row.try_get("n")?);
                    }
                }
                overview.overdue = sqlx::query_scalar(
                    "SELECT count(*) FROM erasure_requests WHERE state NOT IN ('completed', \
                    'rejected') AND due_at < $1",
                )
                .bind(now)
                .fetch_one(&self.pool)
                .await?;
                let oldest: Option<DateTime<Utc>> = sqlx::query_scalar(
                    "SELECT next_attempt_at FROM purge_jobs WHERE state IN ('pending', \
                    'retrying') ORDER BY next_attempt_at LIMIT 1",
                )
                .fetch_optional(&self.pool)
                .await?;
                overview.oldest_due_seconds = oldest.map_or(0.0, |due| {
                    (now - due).num_milliseconds().max(0) as f64 / 1000.0
                });
                Ok(overview)
            }

            async fn erasure_stats(
                &self,
                tenant: &str,
                overdue_at: DateTime<Utc>,
                since: DateTime<Utc>,
            ) -> Result<ErasureStats, StoreError> {
                let mut stats = ErasureStats::default();
                let rows = sqlx::query(
                    "SELECT state, count(*) AS n FROM \
                    erasure_requests WHERE tenant = $1 AND state NOT IN ('completed', \
                    'rejected') GROUP BY state",
                )
                .bind(tenant)
                .fetch_all(&self.pool)
                .await?;
                for row in &rows {
                    stats.open.insert(row.try_get("state")?, row.try_get("n")?);
                }
                stats.overdue = sqlx::query_scalar(
                    "SELECT count(*) FROM \
                    erasure_requests WHERE tenant = $1 AND state NOT IN ('completed', \
                    'rejected') AND due_at < $2",
                )
                .bind(tenant)
                .bind(overdue_at)
                .fetch_one(&self.pool)
                .await?;
                let rows = sqlx::query(
                    "SELECT requested_at, suppressed_at, \
                    completed_at FROM erasure_requests WHERE tenant = $1 AND \
                    requested_at >= $2 AND suppressed_at IS NOT NULL",
                )
                .bind(tenant)
                .bind(since)
                .fetch_all(&self.pool)
                .await?;
                for row in &rows {
                    let requested: DateTime<Utc> = row.try_get("requested_at")?;
                    let suppressed: Option<DateTime<Utc>> = row.try_get("suppressed_at")?;
                    let completed: Option<DateTime<Utc>> = row.try_get("completed_at")?;
                    stats
                        .online_ms
                        .extend(suppressed.map(|at| (at - requested).num_milliseconds()));
                    stats
                        .completion_s
                        .extend(completed.map(|at| (at - requested).num_seconds()));
                }
                Ok(stats)
            }

            async fn reject_erasure(
                &self,
                id: &str,
                rejection: &Rejection,
                audit: AuditEntry,
            ) -> Result<ErasureRecord, StoreError> {
                let mut tx = self.write_tx().await?;
                let mut record = locked_erasure(&mut tx, id).await?;
                // Refused once flipped: a suppressed subject is never made readable again.
                record.state =
                    lethe_policy::erasure::transition(record.state, ErasureEvent::Reject)?;
                record.updated_at = rejection.at;
                save_erasure(&mut tx, &record).await?;
                sqlx::query(
                    "UPDATE erasure_requests SET rejection_reason = $1, \
                    rejected_by = $2, rejected_at = $3 WHERE id = $4",
                )
                .bind(&rejection.reason)
                .bind(&rejection.by)
                .bind(rejection.at)
                .bind(id)
                .execute(&mut *tx)
                .await?;
                // Nothing was flipped, so nothing is purged: the jobs end here.
                sqlx::query(
                    "UPDATE purge_jobs SET state = 'cancelled', updated_at = \
                    $1 WHERE request_id = $2 AND state = 'waiting'",
                )
                .bind(rejection.at)
                .bind(id)
                .execute(&mut *tx)
                .await?;
                append_in(&mut tx, &self.subject_key, audit).await?;
                tx.commit().await?;
                record.rejection = Some(rejection.clone());
                Ok(record)
            }

            async fn extend_erasure(
                &self,
                id: &str,
                extension: &DeadlineExtension,
                audit: AuditEntry,
            ) -> Result<ErasureRecord, StoreError> {
                let mut tx = self.write_tx().await?;
                let mut record = locked_erasure(&mut tx, id).await?;
                // Once, while the request is open and within its first deadline.
                if record.extension.is_some()
                    || record.state.is_final()
                    || record.deadline <= extension.at
                    || !(1..=MAX_EXTENSION_MONTHS).contains(&extension.months)
                {
                    return Err(StoreError::NotExtendable);
                }
                record.deadline = deadline(record.deadline, extension.months);
                record.extension = Some(extension.clone());
                record.updated_at = extension.at;
                sqlx::query(
                    "UPDATE erasure_requests SET due_at = $1, extended_months \
                    = $2, extension_reason = $3, extended_by = $4, extended_at = $5, \
                    updated_at = $5 WHERE id = $6",
                )
                .bind(record.deadline)
                .bind(extension.months as i32)
                .bind(&extension.reason)
                .bind(&extension.by)
                .bind(extension.at)
                .bind(id)
                .execute(&mut *tx)
                .await?;
                append_in(&mut tx, &self.subject_key, audit).await?;
                tx.commit().await?;
                Ok(record)
            }

            async fn erasure(&self, id: &str) -> Result<ErasureRecord, StoreError> {
                let sql = sqlx::AssertSqlSafe(format!(
                    "SELECT {ERASURE_COLUMNS} FROM \
                    erasure_requests WHERE id = $1"
                ));
                erasure_from_row(&sqlx::query(sql).bind(id).fetch_one(&self.pool).await?)
            }

            async fn purge_jobs(&self, request_id: &str) -> Result<Vec<PurgeJob>, StoreError> {
                let rows = sqlx::query(
                    "SELECT id, request_id, target, state, attempts, next_attempt_at, \
                        last_error, result, updated_at
                        FROM purge_jobs WHERE request_id = $1 ORDER BY target",
                )
                .bind(request_id)
                .fetch_all(&self.pool)
                .await?;
                rows.iter()
                    .map(|row| {
                        // One column: a done job's result, or a running one's tally.
                        let stored: Option<Json<serde_json::Value>> = row.try_get("result")?;
                        let state: String = row.try_get("state")?;
                        let (result, so_far) = match state == "done" {
                            true => (stored.map(|r| r.0), None),
                            false => (None, stored.map(|r| r.0)),
                        };
                        Ok(PurgeJob {
                            id: row.try_get("id")?,
                            request_id: row.try_get("request_id")?,
                            target: row.try_get("target")?,
                            state,
                            attempts: row.try_get("attempts")?,
                            next_attempt_at: row.try_get("next_attempt_at")?,
                            last_error: row.try_get("last_error")?,
                            result,
                            so_far,
                            updated_at: row.try_get("updated_at")?,
                        })
                    })
                    .collect()
            }

            async fn approve_erasure(
                &self,
                id: &str,
                actor: &str,
                required: usize,
                at: DateTime<Utc>,
                audit: AuditEntry,
            ) -> Result<ErasureRecord, StoreError> {
                let mut tx = self.write_tx().await?;
                let mut record = locked_erasure(&mut tx, id).await?;
                let authorised = lethe_policy::erasure::approve(
                    record.state,
                    &mut record.approvals,
                    actor,
                    &record.requested_by,
                    required,
                )?;
                record.updated_at = at;
                save_erasure(&mut tx, &record).await?;
                append_in(&mut tx, &self.subject_key, audit.clone()).await?;
                let mut changes = Vec::new();
                if authorised {
                    step(&mut record, ErasureEvent::Authorize, at)?;
                    changes = hold_or_flip(
                        &mut tx,
                        &self.subject_key,
                        &mut record,
                        self.closure(),
                        self.governed(),
                        at,
                        &audit,
                    )
                    .await?;
                }
                commit_changes(self, tx, changes).await?;
                Ok(record)
            }

            async fn review_erasure(
                &self,
                id: &str,
                event: ErasureEvent,
                at: DateTime<Utc>,
                audit: AuditEntry,
            ) -> Result<ErasureRecord, StoreError> {
                let mut tx = self.write_tx().await?;
                let mut record = locked_erasure(&mut tx, id).await?;
                let to = match event {
                    ErasureEvent::Escalate | ErasureEvent::Resume => {
                        lethe_policy::erasure::transition(record.state, event)?
                    }
                    other => {
                        return Err(lethe_policy::IllegalTransition {
                            from: record.state,
                            event: other,
                        }
                        .into());
                    }
                };
                record.state = to;
                record.updated_at = at;
                if event == ErasureEvent::Resume {
                    sqlx::query(
                        "UPDATE purge_jobs SET state = 'pending', attempts = \
                        0, next_attempt_at = $1, updated_at = $1 WHERE request_id = $2 \
                        AND state = 'exception'",
                    )
                    .bind(at)
                    .bind(id)
                    .execute(&mut *tx)
                    .await?;
                }
                save_erasure(&mut tx, &record).await?;
                append_in(&mut tx, &self.subject_key, audit).await?;
                tx.commit().await?;
                Ok(record)
            }

            fn use_governed(&self, databases: Vec<String>) {
                // The first stays: a store is opened with one configuration.
                let _ = self.governed.set(databases);
            }

            async fn governed_flips(
                &self,
                request_id: &str,
            ) -> Result<Vec<GovernedFlip>, StoreError> {
                let rows = sqlx::query(
                    "SELECT database, applied_at FROM erasure_flips \
                    WHERE request_id = $1 ORDER BY database",
                )
                .bind(request_id)
                .fetch_all(&self.pool)
                .await?;
                rows.iter()
                    .map(|row| {
                        Ok(GovernedFlip {
                            database: row.try_get("database")?,
                            applied_at: row.try_get("applied_at")?,
                        })
                    })
                    .collect()
            }

            async fn pending_flips(&self, database: &str) -> Result<Vec<PendingFlip>, StoreError> {
                let sql = sqlx::AssertSqlSafe(format!(
                    "SELECT {ERASURE_COLUMNS} FROM erasure_requests r WHERE EXISTS \
                        (SELECT 1 FROM erasure_flips f WHERE f.request_id = r.id AND \
                        f.database = $1 AND f.applied_at IS NULL) ORDER BY \
                        requested_at"
                ));
                let rows = sqlx::query(sql)
                    .bind(database)
                    .fetch_all(&self.pool)
                    .await?;
                let mut pending = Vec::with_capacity(rows.len());
                for row in &rows {
                    let record = erasure_from_row(row)?;
                    let mut keys = Vec::new();
                    for key in record.keys() {
                        // A key another request's completion forgot meanwhile has no state.
                        let epoch: Option<i64> = sqlx::query_scalar(
                            "SELECT epoch FROM \
                            subjects WHERE tenant = $1 AND subject = $2",
                        )
                        .bind(&record.tenant)
                        .bind(key)
                        .fetch_optional(&self.pool)
                        .await?;
                        keys.push((key.to_owned(), epoch));
                    }
                    pending.push(PendingFlip {
                        request_id: record.id,
                        tenant: record.tenant,
                        keys,
                    });
                }
                Ok(pending)
            }

            async fn flip_applied(
                &self,
                request_id: &str,
                database: &str,
                at: DateTime<Utc>,
                audit: AuditEntry,
            ) -> Result<ErasureRecord, StoreError> {
                let mut tx = self.write_tx().await?;
                let mut record = locked_erasure(&mut tx, request_id).await?;
                let applied = sqlx::query(
                    "UPDATE erasure_flips SET applied_at = $3 \
                    WHERE request_id = $1 AND database = $2 AND applied_at IS NULL",
                )
                .bind(request_id)
                .bind(database)
                .bind(at)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if applied == 0 {
                    return Ok(record);
                }
                let target = |action: &str, target: &str, target_ref: &str| AuditEntry {
                    action: action.into(),
                    target: target.into(),
                    target_ref: Some(target_ref.to_owned()),
                    at,
                    ..audit.clone()
                };
                append_in(
                    &mut tx,
                    &self.subject_key,
                    target("governed.flip_applied", "postgres", database),
                )
                .await?;
                let left: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM erasure_flips \
                    WHERE request_id = $1 AND applied_at IS NULL",
                )
                .bind(request_id)
                .fetch_one(&mut *tx)
                .await?;
                if left == 0
                    && record.state == ErasureState::Propagating
                    && record.suppressed_at.is_none()
                {
                    step(&mut record, ErasureEvent::FlipApplied, at)?;
                    record.suppressed_at = Some(at);
                    save_erasure(&mut tx, &record).await?;
                    append_in(
                        &mut tx,
                        &self.subject_key,
                        target("erasure.suppress", "erasure", request_id),
                    )
                    .await?;
                }
                tx.commit().await?;
                Ok(record)
            }
        }
    };
}
pub(crate) use erasure_sql;
