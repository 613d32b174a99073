//! The SQL of purge jobs, the move from verification to completion, tombstones and certificates,
//! for both backends. Expanded inside `impl_store!`, in its module: its imports, `Row`, `Tx` and
//! shared helpers are in scope.

/// Implements [`Purges`](crate::Purges) for `$store` over `$db`.
macro_rules! purge_sql {
    ($store:ty, $db:ty) => {
        /// The request's purge jobs that count (not cancelled): each target and its state.
        async fn purge_jobs_of(
            tx: &mut Tx,
            request_id: &str,
        ) -> Result<Vec<(String, JobState)>, StoreError> {
            let rows = sqlx::query(
                "SELECT target, state FROM purge_jobs WHERE \
                request_id = $1 AND state <> 'cancelled'",
            )
            .bind(request_id)
            .fetch_all(&mut **tx)
            .await?;
            rows.iter()
                .map(|r| {
                    let state: String = r.try_get("state")?;
                    let state = JobState::parse(&state).ok_or_else(|| {
                        StoreError::Corrupt(format!(
                            "purge \
                        job state {state:?}"
                        ))
                    })?;
                    Ok((r.try_get("target")?, state))
                })
                .collect::<Result<_, StoreError>>()
        }

        /// The targets the request's purge jobs that count (not cancelled) reach.
        async fn purge_targets_of(
            tx: &mut Tx,
            request_id: &str,
        ) -> Result<Vec<String>, StoreError> {
            Ok(sqlx::query_scalar(
                "SELECT target FROM purge_jobs WHERE request_id = $1 AND state <> 'cancelled'",
            )
            .bind(request_id)
            .fetch_all(&mut **tx)
            .await?)
        }

        /// What a completed erasure leaves: which keys it erased, in which targets, and when.
        async fn tombstone(
            tx: &mut Tx,
            record: &ErasureRecord,
            jobs: &[(String, JobState)],
            now: DateTime<Utc>,
        ) -> Result<(), StoreError> {
            let keys: Vec<String> = record.keys().map(str::to_owned).collect();
            let targets = jobs.iter().map(|(t, _)| t.clone()).collect();
            let scope = BTreeMap::from([("keys", keys), ("targets", targets)]);
            sqlx::query(
                "INSERT INTO tombstones (request_id, tenant, subject, \
                scope, erased_at) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(&record.id)
            .bind(&record.tenant)
            .bind(&record.subject)
            .bind(Json(scope))
            .bind(now)
            .execute(&mut **tx)
            .await?;
            Ok(())
        }

        /// Moves a request on from where its purge jobs and its derivatives stand, inside the
        /// caller's transaction: once every job is done, what the closure reaches now is
        /// recorded and verification looks for the subject's live lineage rows and for
        /// derivatives decided for erasure but not verified gone, in every purged store; a
        /// clean request whose derivatives are all decided completes (its keys forgotten, a
        /// tombstone kept). Answers the changes to broadcast and whether it completed.
        async fn advance(
            tx: &mut Tx,
            subject_key: &std::sync::OnceLock<Vec<u8>>,
            closure: Closure,
            record: &mut ErasureRecord,
            now: DateTime<Utc>,
            audit: &AuditEntry,
        ) -> Result<(Vec<PolicyChange>, bool), StoreError> {
            let jobs = purge_jobs_of(tx, &record.id).await?;
            let mut changes = Vec::new();
            let mut found = Verification::default();
            if verification_due(&jobs) {
                // A write that landed after the flip on a replica slow to hear of it may have
                // derived from the subject since: the closure is looked at again.
                if extend_closure(tx, subject_key, record, closure, now).await? {
                    changes.push(PolicyChange::of_derivatives(&record.tenant));
                }
                for (target, _) in &jobs {
                    let store_name = target_store(target);
                    for key in record.keys() {
                        let live: i64 = sqlx::query_scalar(
                            "SELECT COUNT(*) FROM items \
                            WHERE tenant = $1 AND subject = $2 AND store = $3 AND \
                            deleted_at IS NULL",
                        )
                        .bind(&record.tenant)
                        .bind(key)
                        .bind(store_name)
                        .fetch_one(&mut **tx)
                        .await?;
                        if live > 0 {
                            found.unverified.insert(target.clone());
                        }
                    }
                }
                let targets: Vec<String> = jobs.iter().map(|(t, _)| t.clone()).collect();
                let (unverified, undecided) = derivatives_left(tx, &record.id, &targets).await?;
                found.unverified.extend(unverified);
                found.undecided = undecided;
            }
            let next = progress(record.state, &jobs, &found)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            for event in &next.events {
                step(record, *event, now)?;
            }
            if next.completed() {
                record.completed_at = Some(now);
                // From here on the store knows the subject only by its reference.
                changes.extend(forget_request(tx, subject_key, record, now).await?);
                tombstone(tx, record, &jobs, now).await?;
            }
            for target in &next.rerun {
                sqlx::query(
                    "UPDATE purge_jobs SET state = $1, next_attempt_at = $2, \
                    updated_at = $2 WHERE request_id = $3 AND target = $4",
                )
                .bind(JobState::Retrying.as_str())
                .bind(now)
                .bind(&record.id)
                .bind(target)
                .execute(&mut **tx)
                .await?;
            }
            for action in &next.audit {
                let event = AuditEntry {
                    action: (*action).into(),
                    target: "erasure".into(),
                    target_ref: Some(record.id.clone()),
                    ..audit.clone()
                };
                append_in(tx, subject_key, event).await?;
            }
            save_erasure(tx, record).await?;
            Ok((changes, next.completed()))
        }

        /// After a completion: the erased keys' old row versions are scrubbed from the files.
        async fn scrubbed(store: &$store) {
            if let Err(e) = store.scrub().await {
                let why = "the erased keys may stay in the files until the next scrub";
                tracing::warn!(error = tracing::field::display(&e), "{why}");
            }
        }

        #[async_trait]
        impl Purges for $store {
            async fn claim_purge_job(
                &self,
                worker: &str,
                now: DateTime<Utc>,
                settled: DateTime<Utc>,
                lease_until: DateTime<Utc>,
            ) -> Result<Option<PurgeJob>, StoreError> {
                let mut tx = self.write_tx().await?;
                let sql = sqlx::AssertSqlSafe(format!(
                    "SELECT id, request_id FROM purge_jobs j
                        WHERE ((state IN ('pending', 'retrying') AND next_attempt_at \
                        <= $1) OR (state = 'running' AND claimed_until < $1))
                        AND EXISTS (SELECT 1 FROM erasure_requests r WHERE r.id = \
                        j.request_id AND r.suppressed_at <= $2)
                        ORDER BY next_attempt_at LIMIT 1{}",
                    <$store>::SKIP_LOCKED
                ));
                let Some(row) = sqlx::query(sql)
                    .bind(now)
                    .bind(settled)
                    .fetch_optional(&mut *tx)
                    .await?
                else {
                    return Ok(None);
                };
                let (job_id, request_id): (String, String) =
                    (row.try_get("id")?, row.try_get("request_id")?);
                sqlx::query(
                    "UPDATE purge_jobs SET state = 'running', claimed_by = $1, \
                    claimed_until = $2, attempts = attempts + 1, updated_at = $3 WHERE \
                    id = $4",
                )
                .bind(worker)
                .bind(lease_until)
                .bind(now)
                .bind(&job_id)
                .execute(&mut *tx)
                .await?;
                let mut record = locked_erasure(&mut tx, &request_id).await?;
                let event = match record.state {
                    ErasureState::Suppressed => Some(ErasureEvent::PurgeStarted),
                    ErasureState::Retrying => Some(ErasureEvent::RetryStarted),
                    _ => None,
                };
                let mut changes = Vec::new();
                if let Some(event) = event {
                    // The settle period is over: writes that overtook the flip on a slow
                    // replica have landed, and what they derived from the subject is found.
                    if record.state == ErasureState::Suppressed
                        && extend_closure(&mut tx, &self.subject_key, &record, self.closure(), now)
                            .await?
                    {
                        changes.push(PolicyChange::of_derivatives(&record.tenant));
                    }
                    step(&mut record, event, now)?;
                    save_erasure(&mut tx, &record).await?;
                }
                commit_changes(self, tx, changes).await?;
                Ok(self
                    .purge_jobs(&request_id)
                    .await?
                    .into_iter()
                    .find(|j| j.id == job_id))
            }

            async fn renew_purge_job(
                &self,
                job_id: &str,
                worker: &str,
                lease_until: DateTime<Utc>,
            ) -> Result<bool, StoreError> {
                let mut tx = self.write_tx().await?;
                let renewed = sqlx::query(
                    "UPDATE purge_jobs SET claimed_until = $1 \
                    WHERE id = $2 AND claimed_by = $3 AND state = 'running'",
                )
                .bind(lease_until)
                .bind(job_id)
                .bind(worker)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                tx.commit().await?;
                Ok(renewed == 1)
            }

            async fn finish_purge_job(
                &self,
                job_id: &str,
                outcome: JobOutcome,
                now: DateTime<Utc>,
                audit: AuditEntry,
            ) -> Result<ErasureRecord, StoreError> {
                let mut tx = self.write_tx().await?;
                let request_id: String = sqlx::query_scalar(
                    "SELECT request_id FROM \
                    purge_jobs WHERE id = $1",
                )
                .bind(job_id)
                .fetch_one(&mut *tx)
                .await?;
                let mut record = locked_erasure(&mut tx, &request_id).await?;
                let (attempt, result, error, next) = match &outcome {
                    JobOutcome::Done(result) => {
                        (Attempt::Done, Some(Json(result.clone())), None, now)
                    }
                    JobOutcome::Failed {
                        error,
                        retry_at,
                        tally,
                    } => (
                        Attempt::Failed {
                            again: retry_at.is_some(),
                        },
                        tally.clone().map(Json),
                        Some(error.clone()),
                        retry_at.unwrap_or(now),
                    ),
                };
                let (action, outcome_result) = match attempt {
                    Attempt::Done => ("purge.done", "ok"),
                    Attempt::Failed { .. } => ("purge.failed", "failed"),
                };
                append_in(
                    &mut tx,
                    &self.subject_key,
                    AuditEntry {
                        action: action.into(),
                        result: outcome_result.into(),
                        ..audit.clone()
                    },
                )
                .await?;
                sqlx::query(
                    "UPDATE purge_jobs SET state = $1, result = $2, last_error = $3, \
                        next_attempt_at = $4, claimed_by = NULL, claimed_until = NULL, \
                        updated_at = $5 WHERE id = $6",
                )
                .bind(JobState::after(attempt).as_str())
                .bind(result)
                .bind(error)
                .bind(next)
                .bind(now)
                .bind(job_id)
                .execute(&mut *tx)
                .await?;
                let (changes, completed) = advance(
                    &mut tx,
                    &self.subject_key,
                    self.closure(),
                    &mut record,
                    now,
                    &audit,
                )
                .await?;
                commit_changes(self, tx, changes).await?;
                if completed {
                    scrubbed(self).await;
                }
                Ok(record)
            }

            async fn forget_erased(&self, at: DateTime<Utc>) -> Result<u64, StoreError> {
                let ids: Vec<String> = sqlx::query_scalar(
                    "SELECT id FROM \
                    erasure_requests WHERE state = 'completed' AND subject NOT LIKE \
                    'ref/%' ORDER BY id",
                )
                .fetch_all(&self.pool)
                .await?;
                for id in &ids {
                    let mut tx = self.write_tx().await?;
                    let sql = sqlx::AssertSqlSafe(format!(
                        "SELECT {ERASURE_COLUMNS} \
                        FROM erasure_requests WHERE id = $1{}",
                        <$store>::FOR_UPDATE
                    ));
                    let mut record =
                        erasure_from_row(&sqlx::query(sql).bind(id).fetch_one(&mut *tx).await?)?;
                    if record.subject.starts_with(lethe_policy::audit::FORGOTTEN) {
                        continue;
                    }
                    let changes =
                        forget_request(&mut tx, &self.subject_key, &mut record, at).await?;
                    save_erasure(&mut tx, &record).await?;
                    let scope: Option<Json<serde_json::Value>> = sqlx::query_scalar(
                        "SELECT \
                        scope FROM tombstones WHERE request_id = $1",
                    )
                    .bind(id)
                    .fetch_optional(&mut *tx)
                    .await?;
                    if let Some(Json(mut scope)) = scope {
                        scope["keys"] = serde_json::Value::from(record.keys().collect::<Vec<_>>());
                        sqlx::query(
                            "UPDATE tombstones SET subject = $2, scope = $3 \
                            WHERE request_id = $1",
                        )
                        .bind(id)
                        .bind(&record.subject)
                        .bind(Json(scope))
                        .execute(&mut *tx)
                        .await?;
                    }
                    commit_changes(self, tx, changes).await?;
                }
                if !ids.is_empty() {
                    self.scrub().await?;
                }
                Ok(ids.len() as u64)
            }

            async fn tombstones_since(
                &self,
                since: DateTime<Utc>,
            ) -> Result<Vec<Tombstone>, StoreError> {
                let rows = sqlx::query(
                    "SELECT request_id, tenant, subject, scope, \
                    erased_at FROM tombstones WHERE erased_at >= $1 ORDER BY \
                    erased_at, request_id",
                )
                .bind(since)
                .fetch_all(&self.pool)
                .await?;
                rows.iter()
                    .map(|row| {
                        let scope: Json<serde_json::Value> = row.try_get("scope")?;
                        Ok(Tombstone {
                            request_id: row.try_get("request_id")?,
                            tenant: row.try_get("tenant")?,
                            subject: row.try_get("subject")?,
                            scope: scope.0,
                            erased_at: row.try_get("erased_at")?,
                        })
                    })
                    .collect()
            }

            async fn certificate(&self, request_id: &str) -> Result<Option<String>, StoreError> {
                Ok(sqlx::query_scalar(
                    "SELECT document FROM certificates WHERE \
                    request_id = $1",
                )
                .bind(request_id)
                .fetch_optional(&self.pool)
                .await?)
            }

            async fn keep_certificate(
                &self,
                request_id: &str,
                document: &str,
            ) -> Result<String, StoreError> {
                let mut tx = self.write_tx().await?;
                sqlx::query(
                    "INSERT INTO certificates (request_id, document) VALUES \
                    ($1, $2) ON CONFLICT (request_id) DO NOTHING",
                )
                .bind(request_id)
                .bind(document)
                .execute(&mut *tx)
                .await?;
                let kept: String = sqlx::query_scalar(
                    "SELECT document FROM \
                    certificates WHERE request_id = $1",
                )
                .bind(request_id)
                .fetch_one(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(kept)
            }
        }
    };
}
pub(crate) use purge_sql;
