//! The SQL of lineage: items and their stamps, processors, derivative edges and decisions, for both
//! backends. Expanded inside `impl_store!`, in its module: its imports, `Row`, `Tx` and shared
//! helpers are in scope.

/// Implements [`Lineage`](crate::Lineage) for `$store` over `$db`.
macro_rules! lineage_sql {
    ($store:ty, $db:ty) => {
        /// Adds to `query` the condition that an item is one of `ids` in `collection` (the
        /// store is named before it; a caller sends a thousand ids at most).
        fn push_items_in(query: &mut sqlx::QueryBuilder<$db>, collection: &str, ids: &[String]) {
            query
                .push(" AND collection = ")
                .push_bind(collection.to_owned())
                .push(" AND item_id IN (");
            let mut list = query.separated(", ");
            for id in ids {
                list.push_bind(id.clone());
            }
            query.push(")");
        }

        /// `items` as they must be recorded once the consent withdrawals since they were
        /// decided are applied: a write decided before a withdrawal and recorded after it (the
        /// lineage writer batches) expires when the withdrawal came, as it would have had it
        /// been recorded first ([`withdrawn_since`](lethe_policy::consent::withdrawn_since)).
        /// The subjects' grants stay locked until the rows are in (SQLite's writer is alone),
        /// so that a withdrawal either came first and is seen here or waits and then sees them.
        async fn withdrawals_applied(
            tx: &mut Tx,
            items: &[ItemRecord],
        ) -> Result<Vec<ItemRecord>, StoreError> {
            let owners: BTreeSet<(&str, &str)> = items
                .iter()
                .map(|i| (i.tenant.as_str(), i.subject.as_str()))
                .collect();
            let owners: Vec<_> = owners.into_iter().collect();
            let mut grants: BTreeMap<(String, String), Vec<ConsentGrant>> = BTreeMap::new();
            for chunk in owners.chunks(400) {
                let mut select =
                    sqlx::QueryBuilder::<$db>::new(concat!(crate::sql::select_grants!(), "WHERE "));
                let mut either = select.separated(" OR ");
                for (tenant, subject) in chunk {
                    either
                        .push("(tenant = ")
                        .push_bind_unseparated((*tenant).to_owned())
                        .push_unseparated(" AND subject = ")
                        .push_bind_unseparated((*subject).to_owned())
                        .push_unseparated(")");
                }
                select.push(<$store>::FOR_SHARE);
                for row in select.build().fetch_all(&mut **tx).await? {
                    let grant = grant_from_row(&row)?;
                    grants
                        .entry((grant.tenant.clone(), grant.subject.clone()))
                        .or_default()
                        .push(grant);
                }
            }
            Ok(items
                .iter()
                .map(|item| {
                    let theirs = grants
                        .get(&(item.tenant.clone(), item.subject.clone()))
                        .map_or(&[][..], Vec::as_slice);
                    let withdrawn = lethe_policy::consent::withdrawn_since(
                        theirs,
                        &item.purpose,
                        &item.category,
                        item.created_at,
                    );
                    let mut item = item.clone();
                    if let Some(at) = withdrawn.filter(|at| *at < item.expires_at) {
                        item.expires_at = at;
                    }
                    item
                })
                .collect())
        }

        /// The erasure request `request_id`, locked, when its derivatives may be decided: flipped
        /// everywhere (a flip still on its way to a governed database cannot move the request
        /// on) and not final.
        async fn flipped_request(
            tx: &mut Tx,
            request_id: &str,
        ) -> Result<ErasureRecord, StoreError> {
            let record = locked_erasure(tx, request_id).await?;
            if !record.state.is_suppressed()
                || record.state.is_final()
                || record.suppressed_at.is_none()
            {
                return Err(StoreError::NotDecidable(format!(
                    "the request is {}: \
                    only a flipped, open request's derivatives are decided, once \
                    the flip holds everywhere",
                    record.state
                )));
            }
            Ok(record)
        }

        /// `reference`, one of the request's undecided derivatives, when `decision` can be
        /// taken on it: erased only where a purge of the request reaches.
        fn decidable<'k>(
            known: &'k [Derivative],
            purged: &BTreeSet<String>,
            reference: &str,
            decision: Decision,
        ) -> Result<&'k Derivative, StoreError> {
            let Some(derivative) = known.iter().find(|d| d.reference == reference) else {
                return Err(StoreError::NotDecidable(format!(
                    "{reference} is \
                    not a derivative of this request"
                )));
            };
            if derivative.decision != Decision::Undecided {
                return Err(StoreError::NotDecidable(format!(
                    "{reference} is \
                    not undecided: {}",
                    derivative.decision.as_str()
                )));
            }
            if decision == Decision::Erase && !purged.contains(&derivative.item.store) {
                return Err(StoreError::NotDecidable(format!(
                    "{reference} is in store {}, which no purge of this \
                        request reaches: it can only be released",
                    derivative.item.store
                )));
            }
            Ok(derivative)
        }

        #[async_trait]
        impl Lineage for $store {
            async fn lineage_items(
                &self,
                tenant: &str,
                store: &str,
                subjects: &[String],
                include_deleted: bool,
            ) -> Result<Vec<(String, String)>, StoreError> {
                let mut items = Vec::new();
                for subject in subjects {
                    let rows = sqlx::query(
                        "SELECT collection, item_id FROM items WHERE tenant = $1 AND \
                            store = $2 AND subject = $3 AND ($4 OR deleted_at IS NULL)",
                    )
                    .bind(tenant)
                    .bind(store)
                    .bind(subject)
                    .bind(include_deleted)
                    .fetch_all(&self.pool)
                    .await?;
                    for row in &rows {
                        items.push((row.try_get("collection")?, row.try_get("item_id")?));
                    }
                }
                Ok(items)
            }

            async fn record_processors(
                &self,
                uses: &[crate::ProcessorUse],
            ) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                for u in uses {
                    sqlx::query(
                        "INSERT INTO processors (tenant, subject, processor, first_at, \
                            last_at) VALUES ($1, $2, $3, $4, $5)
                            ON CONFLICT (tenant, subject, processor) DO UPDATE SET
                            first_at = CASE WHEN excluded.first_at < \
                            processors.first_at THEN excluded.first_at ELSE \
                            processors.first_at END,
                            last_at = CASE WHEN excluded.last_at > processors.last_at \
                            THEN excluded.last_at ELSE processors.last_at END",
                    )
                    .bind(&u.tenant)
                    .bind(&u.subject)
                    .bind(&u.processor)
                    .bind(u.first_at)
                    .bind(u.last_at)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn processors(
                &self,
                tenant: &str,
                subject: &str,
            ) -> Result<Vec<crate::ProcessorUse>, StoreError> {
                let rows = sqlx::query(
                    "SELECT processor, first_at, last_at FROM \
                    processors WHERE tenant = $1 AND subject = $2 ORDER BY processor",
                )
                .bind(tenant)
                .bind(subject)
                .fetch_all(&self.pool)
                .await?;
                rows.iter()
                    .map(|r| {
                        Ok(crate::ProcessorUse {
                            tenant: tenant.to_owned(),
                            subject: subject.to_owned(),
                            processor: r.try_get("processor")?,
                            first_at: r.try_get("first_at")?,
                            last_at: r.try_get("last_at")?,
                        })
                    })
                    .collect()
            }

            async fn record_items(&self, items: &[ItemRecord]) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                let items = &withdrawals_applied(&mut tx, items).await?;
                // One statement per 500 rows (13 parameters each, well under both databases'
                // limits).
                // A live row never changes owner: a store that kept the first writer's record
                // keeps the first writer's lineage. A deleted one is the index of nothing, and
                // an id the store holds again (written through Lethe, decided on what the
                // store held) is the new writer's.
                // One statement may not touch a row twice (PostgreSQL refuses it): the rows
                // are applied in passes, the n-th write of an id in the n-th, as if in order.
                for chunk in crate::in_passes(items)
                    .iter()
                    .flat_map(|pass| pass.chunks(500))
                {
                    let mut insert = sqlx::QueryBuilder::<$db>::new(
                        "INSERT INTO items (store, collection, item_id, tenant, \
                            subject, purpose, category, layer, created_at, expires_at, \
                            epoch, source_ref, parents, deleted_at) ",
                    );
                    insert.push_values(chunk, |mut row, item| {
                        row.push_bind(item.store.clone())
                            .push_bind(item.collection.clone())
                            .push_bind(item.item_id.clone())
                            .push_bind(item.tenant.clone())
                            .push_bind(item.subject.clone())
                            .push_bind(item.purpose.clone())
                            .push_bind(item.category.clone())
                            .push_bind(item.layer.as_str())
                            .push_bind(item.created_at)
                            .push_bind(item.expires_at)
                            .push_bind(item.epoch)
                            .push_bind(item.source_ref.clone())
                            .push_bind(Json(item.parents.clone()))
                            .push("NULL");
                    });
                    insert.push(
                        " ON CONFLICT (store, collection, item_id) DO UPDATE SET
                            tenant = excluded.tenant, subject = excluded.subject, \
                            purpose = excluded.purpose,
                            category = excluded.category, layer = excluded.layer, \
                            created_at = excluded.created_at,
                            expires_at = excluded.expires_at, epoch = excluded.epoch, \
                            source_ref = excluded.source_ref,
                            parents = excluded.parents, deleted_at = NULL
                            WHERE items.deleted_at IS NOT NULL
                            OR (items.tenant = excluded.tenant AND items.subject = \
                            excluded.subject)",
                    );
                    insert.build().execute(&mut *tx).await?;
                }
                tx.commit().await?;
                Ok(())
            }

            async fn item_owners(
                &self,
                store: &str,
                collection: &str,
                ids: &[String],
            ) -> Result<BTreeMap<String, (String, String)>, StoreError> {
                let mut owners = BTreeMap::new();
                for chunk in ids.chunks(1000) {
                    let mut select = sqlx::QueryBuilder::<$db>::new(
                        "SELECT item_id, \
                        tenant, subject FROM items WHERE store = ",
                    );
                    select.push_bind(store.to_owned());
                    push_items_in(&mut select, collection, chunk);
                    for row in select.build().fetch_all(&self.pool).await? {
                        owners.insert(
                            row.try_get("item_id")?,
                            (row.try_get("tenant")?, row.try_get("subject")?),
                        );
                    }
                }
                Ok(owners)
            }

            async fn item_stamps(
                &self,
                store: &str,
                collection: &str,
                ids: &[String],
            ) -> Result<BTreeMap<String, lethe_policy::Stamp>, StoreError> {
                let mut stamps = BTreeMap::new();
                for chunk in ids.chunks(1000) {
                    let mut select = sqlx::QueryBuilder::<$db>::new(
                        "SELECT item_id, tenant, subject, purpose, category, layer, \
                            expires_at, epoch FROM items WHERE deleted_at IS NULL AND \
                            store = ",
                    );
                    select.push_bind(store.to_owned());
                    push_items_in(&mut select, collection, chunk);
                    for row in select.build().fetch_all(&self.pool).await? {
                        let layer: String = row.try_get("layer")?;
                        let stamp = lethe_policy::Stamp {
                            tenant: row.try_get("tenant")?,
                            subject: row.try_get("subject")?,
                            purpose: row.try_get("purpose")?,
                            category: row.try_get("category")?,
                            layer: layer.parse().map_err(|e: String| StoreError::Corrupt(e))?,
                            expires_at: row.try_get("expires_at")?,
                            epoch: row.try_get("epoch")?,
                        };
                        stamps.insert(row.try_get("item_id")?, stamp);
                    }
                }
                Ok(stamps)
            }

            async fn mark_items_deleted(
                &self,
                store: &str,
                collection: &str,
                ids: &[String],
                at: DateTime<Utc>,
            ) -> Result<u64, StoreError> {
                // A thousand rows per statement, each chunk committed on its own: a purge of
                // 100 000 items neither holds the write lock for seconds nor makes 100 000
                // round trips. A mark is idempotent, so a crash between chunks loses nothing.
                let mut marked = 0;
                for chunk in ids.chunks(1000) {
                    let mut tx = self.write_tx().await?;
                    let mut update = sqlx::QueryBuilder::<$db>::new(
                        "UPDATE items SET \
                        deleted_at = ",
                    );
                    update
                        .push_bind(at)
                        .push(" WHERE deleted_at IS NULL AND store = ")
                        .push_bind(store.to_owned());
                    push_items_in(&mut update, collection, chunk);
                    marked += update.build().execute(&mut *tx).await?.rows_affected();
                    tx.commit().await?;
                }
                Ok(marked)
            }

            async fn inventory(
                &self,
                tenant: &str,
                subject: &str,
            ) -> Result<BTreeMap<String, i64>, StoreError> {
                let rows = sqlx::query(
                    "SELECT store, COUNT(*) AS n FROM (
                         SELECT store FROM items WHERE tenant = $1 AND subject = $2 \
                         AND deleted_at IS NULL
                         UNION ALL
                         SELECT store FROM threads WHERE tenant = $1 AND subject = $2 \
                         AND deleted_at IS NULL
                        ) AS live GROUP BY store ORDER BY store",
                )
                .bind(tenant)
                .bind(subject)
                .fetch_all(&self.pool)
                .await?;
                rows.iter()
                    .map(|r| Ok((r.try_get("store")?, r.try_get("n")?)))
                    .collect()
            }

            fn shared_memory(&self) -> Option<&dyn crate::SharedMemory> {
                <$store>::shared(self)
            }

            fn use_closure(&self, closure: Closure) {
                // The first stays: a store is opened with one configuration.
                let _ = self.closure.set(closure);
            }

            async fn record_derived(&self, derived: &[Derived]) -> Result<(), StoreError> {
                if derived.is_empty() {
                    return Ok(());
                }
                let mut tx = self.write_tx().await?;
                record_derived_in(&mut tx, &self.subject_key, derived).await?;
                tx.commit().await?;
                Ok(())
            }

            async fn edges_of(
                &self,
                tenant: &str,
                item: &ItemKey,
            ) -> Result<(Vec<Edge>, Vec<Edge>), StoreError> {
                let mut c = self.pool.acquire().await?;
                edges_of_in(&mut c, tenant, item).await
            }

            async fn borrowed(&self, tenant: &str, subject: &str) -> Result<Vec<Edge>, StoreError> {
                let mut c = self.pool.acquire().await?;
                borrowed_in(&mut c, tenant, subject).await
            }

            async fn hidden_items(
                &self,
                tenant: &str,
                since: DateTime<Utc>,
            ) -> Result<std::collections::HashSet<ItemKey>, StoreError> {
                let mut c = self.pool.acquire().await?;
                hidden_items_in(&mut c, tenant, since).await
            }

            async fn derivatives(&self, request_id: &str) -> Result<Vec<Derivative>, StoreError> {
                let mut c = self.pool.acquire().await?;
                derivatives_in(&mut c, request_id).await
            }

            async fn closure_of(
                &self,
                tenant: &str,
                keys: &[String],
                targets: &[String],
            ) -> Result<Vec<Derivative>, StoreError> {
                let mut c = self.pool.acquire().await?;
                closure_in(
                    &mut c,
                    &self.subject_key,
                    tenant,
                    keys,
                    &target_stores(targets),
                    self.closure(),
                    crate::now(),
                )
                .await
            }

            async fn decide_derivatives(
                &self,
                request_id: &str,
                refs: &[String],
                decision: Decision,
                reason: &str,
                at: DateTime<Utc>,
                audit: AuditEntry,
            ) -> Result<ErasureRecord, StoreError> {
                if !matches!(decision, Decision::Erase | Decision::Release) {
                    return Err(StoreError::NotDecidable(
                        "a derivative is erased or \
                        released"
                            .into(),
                    ));
                }
                let mut tx = self.write_tx().await?;
                let mut record = flipped_request(&mut tx, request_id).await?;
                let known = derivatives_in(&mut tx, request_id).await?;
                let keys: Vec<String> = record.keys().map(str::to_owned).collect();
                let targets = purge_targets_of(&mut tx, request_id).await?;
                let purged = target_stores(&targets);
                for reference in refs {
                    let derivative = decidable(&known, &purged, reference, decision)?;
                    sqlx::query(
                        "UPDATE erasure_derivatives SET decision = $3, \
                        decided_by = $4, decided_at = $5, reason = $6 WHERE request_id \
                        = $1 AND ref = $2",
                    )
                    .bind(request_id)
                    .bind(reference)
                    .bind(decision.as_str())
                    .bind(&audit.actor)
                    .bind(at)
                    .bind(reason)
                    .execute(&mut *tx)
                    .await?;
                    if decision == Decision::Release {
                        drop_closure_edges(&mut tx, &record.tenant, &keys, &derivative.item)
                            .await?;
                    }
                    let event = AuditEntry {
                        action: format!("erasure.derivative_{}", decision.as_str()),
                        target: format!("derivative/{reference}"),
                        target_ref: Some(request_id.to_owned()),
                        ..audit.clone()
                    };
                    append_in(&mut tx, &self.subject_key, event).await?;
                }
                let (mut changes, completed) = advance(
                    &mut tx,
                    &self.subject_key,
                    self.closure(),
                    &mut record,
                    at,
                    &audit,
                )
                .await?;
                changes.push(PolicyChange::of_derivatives(&record.tenant));
                commit_changes(self, tx, changes).await?;
                if completed {
                    scrubbed(self).await;
                }
                Ok(record)
            }

            async fn derivatives_erased(
                &self,
                request_id: &str,
                refs: &[String],
                at: DateTime<Utc>,
            ) -> Result<(), StoreError> {
                let mut tx = self.write_tx().await?;
                for reference in refs {
                    sqlx::query(
                        "UPDATE erasure_derivatives SET erased_at = $3 WHERE \
                        request_id = $1 AND ref = $2 AND erased_at IS NULL",
                    )
                    .bind(request_id)
                    .bind(reference)
                    .bind(at)
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
                Ok(())
            }
        }
    };
}
pub(crate) use lineage_sql;
