//! How a request moves, for both backends: a step of its state machine, the legal holds that
//! park it, the flip that suppresses its subject, and forgetting a completed subject's keys.
//! Expanded inside `impl_store!`, in its module: its imports, `Row`, `Tx` and shared helpers are
//! in scope.

/// Defines the functions that move a request of `$store`, over `$db`.
macro_rules! flip_sql {
    ($store:ty, $db:ty) => {
        /// Moves a request along the state machine; an illegal step is refused, never written.
        fn step(
            record: &mut ErasureRecord,
            event: ErasureEvent,
            at: DateTime<Utc>,
        ) -> Result<(), StoreError> {
            record.state = lethe_policy::erasure::transition(record.state, event)
                .map_err(|e| StoreError::Corrupt(e.to_string()))?;
            record.updated_at = at;
            Ok(())
        }

        async fn save_erasure(tx: &mut Tx, record: &ErasureRecord) -> Result<(), StoreError> {
            sqlx::query(
                "UPDATE erasure_requests SET state = $1, approvals = $2, \
                suppressed_at = $3, completed_at = $4, updated_at = $5, subject = $7, \
                aliases = $8 WHERE id = $6",
            )
            .bind(record.state.as_str())
            .bind(Json(&record.approvals))
            .bind(record.suppressed_at)
            .bind(record.completed_at)
            .bind(record.updated_at)
            .bind(&record.id)
            .bind(&record.subject)
            .bind(Json(&record.aliases))
            .execute(&mut **tx)
            .await?;
            Ok(())
        }

        /// Whether an active hold covers any key of the request.
        async fn held(
            tx: &mut Tx,
            record: &ErasureRecord,
            at: DateTime<Utc>,
        ) -> Result<bool, StoreError> {
            let sql = concat!(
                crate::sql::select_holds!(),
                "WHERE tenant = $1 AND released_at IS \
                NULL"
            );
            let rows = sqlx::query(sql)
                .bind(&record.tenant)
                .fetch_all(&mut **tx)
                .await?;
            let holds: Vec<LegalHold> = rows
                .iter()
                .map(hold_from_row)
                .map(|h| h.map(|h| h.hold))
                .collect::<Result<_, _>>()?;
            Ok(record
                .keys()
                .any(|key| lethe_policy::hold::is_held(&holds, &record.tenant, key, at)))
        }

        /// The flip, inside the caller's transaction: every key suppressed in a new epoch,
        /// everything derived from the subject's items (its closure) hidden, the request
        /// suppressed, its purge jobs released. Returns the changes to broadcast.
        /// Where governed databases must apply the flip too, the request is `propagating`
        /// until each has ([`Store::flip_applied`]), and says `suppressed` only then.
        async fn flip(
            tx: &mut Tx,
            subject_key: &std::sync::OnceLock<Vec<u8>>,
            record: &mut ErasureRecord,
            closure: Closure,
            governed: &[String],
            at: DateTime<Utc>,
        ) -> Result<Vec<PolicyChange>, StoreError> {
            let mut changes = Vec::new();
            for key in record.keys() {
                sqlx::query(
                    "INSERT INTO subjects (tenant, subject, status, epoch, created_at, \
                        updated_at) VALUES ($1, $2, 'suppressed', 1, $3, $3)
                        ON CONFLICT (tenant, subject) DO UPDATE SET status = \
                        'suppressed', epoch = subjects.epoch + 1, updated_at = $3",
                )
                .bind(&record.tenant)
                .bind(key)
                .bind(at)
                .execute(&mut **tx)
                .await?;
                changes.push(PolicyChange::of_subject(&record.tenant, key));
            }
            if governed.is_empty() {
                step(record, ErasureEvent::Suppress, at)?;
                record.suppressed_at = Some(at);
            } else {
                step(record, ErasureEvent::FlipPending, at)?;
                for database in governed {
                    sqlx::query(
                        "INSERT INTO erasure_flips (request_id, database) \
                        VALUES ($1, $2) ON CONFLICT (request_id, database) DO NOTHING",
                    )
                    .bind(&record.id)
                    .bind(database)
                    .execute(&mut **tx)
                    .await?;
                }
            }
            save_erasure(tx, record).await?;
            sqlx::query(
                "UPDATE purge_jobs SET state = 'pending', next_attempt_at = \
                $1, updated_at = $1 WHERE request_id = $2 AND state = 'waiting'",
            )
            .bind(at)
            .bind(&record.id)
            .execute(&mut **tx)
            .await?;
            if extend_closure(tx, subject_key, record, closure, at).await? {
                changes.push(PolicyChange::of_derivatives(&record.tenant));
            }
            Ok(changes)
        }

        /// Holds or flips a request that has just become authorised.
        async fn hold_or_flip(
            tx: &mut Tx,
            subject_key: &std::sync::OnceLock<Vec<u8>>,
            record: &mut ErasureRecord,
            closure: Closure,
            governed: &[String],
            at: DateTime<Utc>,
            audit: &AuditEntry,
        ) -> Result<Vec<PolicyChange>, StoreError> {
            if held(tx, record, at).await? {
                step(record, ErasureEvent::HoldPlaced, at)?;
                save_erasure(tx, record).await?;
                append_in(
                    tx,
                    subject_key,
                    AuditEntry {
                        action: "erasure.hold".into(),
                        target: "erasure".into(),
                        target_ref: Some(record.id.clone()),
                        ..audit.clone()
                    },
                )
                .await?;
                return Ok(Vec::new());
            }
            let changes = flip(tx, subject_key, record, closure, governed, at).await?;
            // `erasure.suppress` once the flip holds everywhere; until then it is on its way.
            let action = if record.state == ErasureState::Suppressed {
                "erasure.suppress"
            } else {
                "erasure.flip"
            };
            append_in(
                tx,
                subject_key,
                AuditEntry {
                    action: action.into(),
                    target: "erasure".into(),
                    target_ref: Some(record.id.clone()),
                    ..audit.clone()
                },
            )
            .await?;
            Ok(changes)
        }

        fn strictest(a: SubjectStatus, b: SubjectStatus) -> SubjectStatus {
            let rank = |s: SubjectStatus| match s {
                SubjectStatus::Active => 0,
                SubjectStatus::Suppressed => 1,
                SubjectStatus::Erased => 2,
            };
            if rank(b) > rank(a) { b } else { a }
        }

        /// The name the store keeps `subject` under once its erasure completed.
        fn forgotten_name(
            key: &std::sync::OnceLock<Vec<u8>>,
            tenant: &str,
            subject: &str,
        ) -> Result<String, StoreError> {
            let key = key.get().ok_or(StoreError::NoSubjectKey)?;
            Ok(lethe_policy::audit::forgotten(key, tenant, subject))
        }

        /// Forgets an erased subject's key, inside the completing transaction: every row that
        /// names it names its reference instead. Requests still running keep their keys until
        /// they complete: their purges need them.
        async fn forget(
            tx: &mut Tx,
            tenant: &str,
            key: &str,
            name: &str,
            at: DateTime<Utc>,
        ) -> Result<(), StoreError> {
            sqlx::query(
                "INSERT INTO subjects (tenant, subject, status, epoch, created_at, \
                    updated_at)
                    SELECT tenant, $3, 'erased', epoch, created_at, $4 FROM subjects \
                    WHERE tenant = $1 AND subject = $2
                    ON CONFLICT (tenant, subject) DO UPDATE SET status = 'erased', \
                    updated_at = $4,
                     epoch = CASE WHEN excluded.epoch > subjects.epoch THEN \
                     excluded.epoch ELSE subjects.epoch END",
            )
            .bind(tenant)
            .bind(key)
            .bind(name)
            .bind(at)
            .execute(&mut **tx)
            .await?;
            for table in ["consent_grants", "legal_holds", "items", "threads"] {
                let sql = sqlx::AssertSqlSafe(format!(
                    "UPDATE {table} SET subject = $3 \
                    WHERE tenant = $1 AND subject = $2"
                ));
                sqlx::query(sql)
                    .bind(tenant)
                    .bind(key)
                    .bind(name)
                    .execute(&mut **tx)
                    .await?;
            }
            let renamed = rename_items(tx, tenant, key, name).await?;
            rename_in_lineage(tx, tenant, &renamed).await?;
            forget_in_lineage(tx, tenant, key, name).await?;
            <$store>::forget_shared(tx, tenant, key, name).await?;
            sqlx::query(
                "UPDATE threads SET thread_id = REPLACE(thread_id, $2, $3) \
                WHERE tenant = $1 AND subject = $3",
            )
            .bind(tenant)
            .bind(key)
            .bind(name)
            .execute(&mut **tx)
            .await?;
            forget_processors(tx, tenant, key, name).await?;
            sqlx::query("DELETE FROM subjects WHERE tenant = $1 AND subject = $2")
                .bind(tenant)
                .bind(key)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }

        /// The store's own names of the subject's items may hold its key too (a LangGraph
        /// namespace, an id the client chose): those are renamed alike. A replay finds such items
        /// again by their stamps and namespaces, not by these ids. Answers the items renamed.
        async fn rename_items(
            tx: &mut Tx,
            tenant: &str,
            key: &str,
            name: &str,
        ) -> Result<Vec<(ItemKey, String)>, StoreError> {
            let rows = sqlx::query(
                "SELECT store, collection, item_id, source_ref, \
                parents FROM items WHERE tenant = $1 AND subject = $2",
            )
            .bind(tenant)
            .bind(name)
            .fetch_all(&mut **tx)
            .await?;
            let mut renamed = Vec::new();
            for row in &rows {
                let item_id: String = row.try_get("item_id")?;
                let source_ref: Option<String> = row.try_get("source_ref")?;
                let parents: Json<Vec<String>> = row.try_get("parents")?;
                let holds = |text: &str| text.contains(key);
                if !holds(&item_id)
                    && !source_ref.as_deref().is_some_and(holds)
                    && !parents.0.iter().any(|p| holds(p))
                {
                    continue;
                }
                let (store, collection): (String, String) =
                    (row.try_get("store")?, row.try_get("collection")?);
                sqlx::query(
                    "UPDATE items SET item_id = $4, source_ref = $5, parents = \
                    $6 WHERE store = $1 AND collection = $2 AND item_id = $3",
                )
                .bind(&store)
                .bind(&collection)
                .bind(&item_id)
                .bind(item_id.replace(key, name))
                .bind(source_ref.map(|r| r.replace(key, name)))
                .bind(Json(
                    parents
                        .0
                        .iter()
                        .map(|p| p.replace(key, name))
                        .collect::<Vec<_>>(),
                ))
                .execute(&mut **tx)
                .await?;
                if holds(&item_id) {
                    renamed.push((
                        ItemKey {
                            store,
                            collection,
                            item: item_id.clone(),
                        },
                        item_id.replace(key, name),
                    ));
                }
            }
            Ok(renamed)
        }

        /// The processors that received the subject's data, kept under her reference.
        async fn forget_processors(
            tx: &mut Tx,
            tenant: &str,
            key: &str,
            name: &str,
        ) -> Result<(), StoreError> {
            sqlx::query(
                "INSERT INTO processors (tenant, subject, processor, first_at, \
                    last_at)
                    SELECT tenant, $3, processor, first_at, last_at FROM processors \
                    WHERE tenant = $1 AND subject = $2
                    ON CONFLICT (tenant, subject, processor) DO UPDATE SET
                     first_at = CASE WHEN excluded.first_at < processors.first_at THEN \
                     excluded.first_at ELSE processors.first_at END,
                     last_at = CASE WHEN excluded.last_at > processors.last_at THEN \
                     excluded.last_at ELSE processors.last_at END",
            )
            .bind(tenant)
            .bind(key)
            .bind(name)
            .execute(&mut **tx)
            .await?;
            sqlx::query("DELETE FROM processors WHERE tenant = $1 AND subject = $2")
                .bind(tenant)
                .bind(key)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }

        /// Forgets every key of a completing request (see `forget`); the record then names the
        /// subject and its aliases by reference. Answers the changes to broadcast.
        async fn forget_request(
            tx: &mut Tx,
            subject_key: &std::sync::OnceLock<Vec<u8>>,
            record: &mut ErasureRecord,
            at: DateTime<Utc>,
        ) -> Result<Vec<PolicyChange>, StoreError> {
            let mut changes = Vec::new();
            let mut names = Vec::new();
            for key in record.keys() {
                let name = forgotten_name(subject_key, &record.tenant, key)?;
                forget(tx, &record.tenant, key, &name, at).await?;
                changes.push(PolicyChange::of_subject(&record.tenant, key));
                names.push(name);
            }
            let mut names = names.into_iter();
            record.subject = names.next().unwrap_or_default();
            record.aliases = names.collect();
            Ok(changes)
        }
    };
}
pub(crate) use flip_sql;
