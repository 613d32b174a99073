//! The SQL of what became of each item an erasure's closure reached (its derivatives), and of
//! forgetting a subject in lineage, for both backends. Expanded inside `impl_store!`, in its
//! module: its imports, `Row`, `Tx`, `Conn` and shared helpers are in scope.

/// Defines the functions over `$db` that keep an erasure's derivatives.
macro_rules! derivative_sql {
    ($db:ty) => {
        const DERIVATIVE_COLUMNS: &str = "ref, store, collection, item_id, subject, \
            own, how, parents, decision, decided_by, decided_at, reason, erased_at";

        fn derivative_from_row(row: &Row) -> Result<Derivative, StoreError> {
            let decision: String = row.try_get("decision")?;
            let how: Json<Vec<lethe_policy::How>> = row.try_get("how")?;
            let parents: Json<Vec<ItemKey>> = row.try_get("parents")?;
            Ok(Derivative {
                reference: row.try_get("ref")?,
                item: ItemKey {
                    store: row.try_get("store")?,
                    collection: row.try_get("collection")?,
                    item: row.try_get("item_id")?,
                },
                subject: row.try_get("subject")?,
                own: row.try_get("own")?,
                how: how.0,
                parents: parents.0,
                decision: Decision::parse(&decision).ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "derivative \
                    decision {decision:?}"
                    ))
                })?,
                decided_by: row.try_get("decided_by")?,
                decided_at: row.try_get("decided_at")?,
                reason: row.try_get("reason")?,
                erased_at: row.try_get("erased_at")?,
            })
        }

        async fn derivatives_in(
            c: &mut Conn,
            request_id: &str,
        ) -> Result<Vec<Derivative>, StoreError> {
            let sql = sqlx::AssertSqlSafe(format!(
                "SELECT {DERIVATIVE_COLUMNS} FROM \
                erasure_derivatives WHERE request_id = $1 ORDER BY store, collection, \
                item_id"
            ));
            let rows = sqlx::query(sql).bind(request_id).fetch_all(&mut *c).await?;
            rows.iter().map(derivative_from_row).collect()
        }

        /// Records what the request's closure reaches now and was not recorded before; answers
        /// whether anything was new (then every replica must hear of it).
        async fn extend_closure(
            tx: &mut Tx,
            subject_key: &std::sync::OnceLock<Vec<u8>>,
            record: &ErasureRecord,
            closure: Closure,
            at: DateTime<Utc>,
        ) -> Result<bool, StoreError> {
            if closure == Closure::Off {
                return Ok(false);
            }
            let targets = purge_targets_of(tx, &record.id).await?;
            let stores = target_stores(&targets);
            let keys: Vec<String> = record.keys().map(str::to_owned).collect();
            let found = closure_in(
                &mut **tx,
                subject_key,
                &record.tenant,
                &keys,
                &stores,
                closure,
                at,
            )
            .await?;
            let mut new = false;
            for d in &found {
                let inserted = sqlx::query(
                    "INSERT INTO erasure_derivatives (request_id, ref, tenant, store, \
                        collection, item_id, subject, own, how, parents, decision, \
                        decided_by, decided_at, reason, erased_at, found_at)
                        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, \
                        $13, $14, NULL, $15) ON CONFLICT (request_id, ref) DO NOTHING",
                )
                .bind(&record.id)
                .bind(&d.reference)
                .bind(&record.tenant)
                .bind(&d.item.store)
                .bind(&d.item.collection)
                .bind(&d.item.item)
                .bind(&d.subject)
                .bind(d.own)
                .bind(Json(&d.how))
                .bind(Json(&d.parents))
                .bind(d.decision.as_str())
                .bind(&d.decided_by)
                .bind(d.decided_at)
                .bind(&d.reason)
                .bind(at)
                .execute(&mut **tx)
                .await?
                .rows_affected();
                new |= inserted > 0;
            }
            Ok(new)
        }

        /// What derivatives leave to do before the request completes: the purge targets to run
        /// again while a derivative decided for erasure is not verified gone (every target: a
        /// store that follows another's ids purges with it), and how many are undecided.
        async fn derivatives_left(
            tx: &mut Tx,
            request_id: &str,
            targets: &[String],
        ) -> Result<(BTreeSet<String>, usize), StoreError> {
            let unerased: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM \
                erasure_derivatives WHERE request_id = $1 AND decision = 'erase' AND \
                erased_at IS NULL",
            )
            .bind(request_id)
            .fetch_one(&mut **tx)
            .await?;
            let unverified = if unerased > 0 {
                targets.iter().cloned().collect()
            } else {
                BTreeSet::new()
            };
            let undecided: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM \
                erasure_derivatives WHERE request_id = $1 AND decision = 'undecided'",
            )
            .bind(request_id)
            .fetch_one(&mut **tx)
            .await?;
            Ok((unverified, usize::try_from(undecided).unwrap_or(usize::MAX)))
        }

        /// Drops the edges from `item` to anything in the closure of `keys` (a released
        /// derivative no longer derives from the erased subject).
        async fn drop_closure_edges(
            tx: &mut Tx,
            tenant: &str,
            keys: &[String],
            item: &ItemKey,
        ) -> Result<(), StoreError> {
            for edge in closure_edges_in(&mut **tx, tenant, keys).await? {
                if edge.child != *item {
                    continue;
                }
                sqlx::query(
                    "DELETE FROM item_edges WHERE tenant = $1 AND child_store \
                    = $2 AND child_collection = $3 AND child_item = $4 AND \
                    parent_store = $5 AND parent_collection = $6 AND parent_item = $7",
                )
                .bind(tenant)
                .bind(&edge.child.store)
                .bind(&edge.child.collection)
                .bind(&edge.child.item)
                .bind(&edge.parent.store)
                .bind(&edge.parent.collection)
                .bind(&edge.parent.item)
                .execute(&mut **tx)
                .await?;
            }
            Ok(())
        }

        async fn hidden_items_in(
            c: &mut Conn,
            tenant: &str,
            since: DateTime<Utc>,
        ) -> Result<std::collections::HashSet<ItemKey>, StoreError> {
            let rows = sqlx::query(
                "SELECT d.store AS h_store, d.collection AS h_collection, d.item_id AS \
                    h_item FROM erasure_derivatives d
                    JOIN erasure_requests r ON r.id = d.request_id
                    WHERE d.tenant = $1 AND d.decision <> 'release' AND (r.state <> \
                    'completed' OR r.suppressed_at >= $2)",
            )
            .bind(tenant)
            .bind(since)
            .fetch_all(&mut *c)
            .await?;
            rows.iter().map(|r| item_of(r, "h_")).collect()
        }

        /// Inside the completing transaction: lineage of derivatives names the erased subject
        /// by reference too, as edges to and from its items do.
        async fn forget_in_lineage(
            tx: &mut Tx,
            tenant: &str,
            key: &str,
            name: &str,
        ) -> Result<(), StoreError> {
            for column in ["child_owner", "parent_owner"] {
                let sql = sqlx::AssertSqlSafe(format!(
                    "UPDATE item_edges SET {column} \
                    = $3 WHERE tenant = $1 AND {column} = $2"
                ));
                sqlx::query(sql)
                    .bind(tenant)
                    .bind(key)
                    .bind(name)
                    .execute(&mut **tx)
                    .await?;
            }
            sqlx::query(
                "UPDATE erasure_derivatives SET subject = $3 WHERE tenant = $1 \
                AND subject = $2",
            )
            .bind(tenant)
            .bind(key)
            .bind(name)
            .execute(&mut **tx)
            .await?;
            Ok(())
        }

        /// Items renamed as their owner's key is forgotten (`from` -> the new id): their edges
        /// and derivative rows follow, and so do the parents derivative rows name.
        async fn rename_in_lineage(
            tx: &mut Tx,
            tenant: &str,
            renamed: &[(ItemKey, String)],
        ) -> Result<(), StoreError> {
            if renamed.is_empty() {
                return Ok(());
            }
            for (from, to) in renamed {
                for side in ["child", "parent"] {
                    let sql = sqlx::AssertSqlSafe(format!(
                        "UPDATE item_edges SET {side}_item = $5 WHERE tenant = $1 AND \
                            {side}_store = $2 AND {side}_collection = $3 AND \
                            {side}_item = $4"
                    ));
                    sqlx::query(sql)
                        .bind(tenant)
                        .bind(&from.store)
                        .bind(&from.collection)
                        .bind(&from.item)
                        .bind(to)
                        .execute(&mut **tx)
                        .await?;
                }
                sqlx::query(
                    "UPDATE erasure_derivatives SET item_id = $5 WHERE tenant \
                    = $1 AND store = $2 AND collection = $3 AND item_id = $4",
                )
                .bind(tenant)
                .bind(&from.store)
                .bind(&from.collection)
                .bind(&from.item)
                .bind(to)
                .execute(&mut **tx)
                .await?;
            }
            let rows = sqlx::query(
                "SELECT request_id, ref, parents FROM \
                erasure_derivatives WHERE tenant = $1",
            )
            .bind(tenant)
            .fetch_all(&mut **tx)
            .await?;
            for row in &rows {
                let Json(mut parents): Json<Vec<ItemKey>> = row.try_get("parents")?;
                let mut changed = false;
                for parent in &mut parents {
                    if let Some((_, to)) = renamed.iter().find(|(from, _)| from == parent) {
                        parent.item = to.clone();
                        changed = true;
                    }
                }
                if changed {
                    sqlx::query(
                        "UPDATE erasure_derivatives SET parents = $3 WHERE \
                        request_id = $1 AND ref = $2",
                    )
                    .bind(row.try_get::<String, _>("request_id")?)
                    .bind(row.try_get::<String, _>("ref")?)
                    .bind(Json(&parents))
                    .execute(&mut **tx)
                    .await?;
                }
            }
            Ok(())
        }
    };
}
pub(crate) use derivative_sql;
