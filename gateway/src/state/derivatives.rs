//! The SQL of derivative lineage both backends share: edges, an erasure's closure (every item
//! reachable from the subject's items through edges, transitively) and what became of each item
//! it reached. Expanded inside `impl_store!`, over its database and transaction types.

/// Defines, in the calling module, the functions over `$db` that `impl_store!` uses for
/// derivatives. `Tx`, `Row`, `StoreError` and the store types must be in scope.
macro_rules! derivative_sql {
    ($db:ty) => {
        type Conn = <$db as sqlx::Database>::Connection;

        /// Binds `(store, collection, item_id)` = one of `items` into `select`, as an `OR` of
        /// conditions on the named columns (both backends accept it; row values differ).
        fn push_items(select: &mut sqlx::QueryBuilder<$db>, columns: [&str; 3], items: &[ItemKey]) {
            select.push("(");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    select.push(" OR ");
                }
                select.push(format!("({} = ", columns[0])).push_bind(item.store.clone());
                select.push(format!(" AND {} = ", columns[1])).push_bind(item.collection.clone());
                select.push(format!(" AND {} = ", columns[2])).push_bind(item.item.clone());
                select.push(")");
            }
            select.push(")");
        }

        /// The store a purge target (`kind:store`) reaches.
        fn target_store(target: &str) -> &str {
            target.split_once(':').map_or(target, |(_, store)| store)
        }

        /// The stores an erasure's purge targets reach.
        fn target_stores(targets: &[String]) -> BTreeSet<String> {
            targets.iter().map(|t| target_store(t).to_owned()).collect()
        }

        fn push_keys(select: &mut sqlx::QueryBuilder<$db>, keys: &[String]) {
            select.push("(");
            let mut list = select.separated(", ");
            for key in keys {
                list.push_bind(key.clone());
            }
            select.push(")");
        }

        fn item_of(row: &Row, prefix: &str) -> Result<ItemKey, StoreError> {
            Ok(ItemKey {
                store: row.try_get(format!("{prefix}store").as_str())?,
                collection: row.try_get(format!("{prefix}collection").as_str())?,
                item: row.try_get(format!("{prefix}item").as_str())?,
            })
        }

        fn edge_from_row(row: &Row) -> Result<Edge, StoreError> {
            let how: String = row.try_get("how")?;
            Ok(Edge {
                child: item_of(row, "child_")?,
                child_owner: row.try_get("child_owner")?,
                parent: item_of(row, "parent_")?,
                parent_owner: row.try_get("parent_owner")?,
                how: lethe_policy::How::parse(&how).ok_or_else(|| StoreError::Corrupt(format!("edge how {how:?}")))?,
                at: row.try_get("at")?,
            })
        }

        const EDGE_COLUMNS: &str = "child_store, child_collection, child_item, child_owner, parent_store, parent_collection, parent_item, parent_owner, how, at";

        /// Records each child's edges (replacing those it had, if so), inside the caller's
        /// transaction. An owner whose erasure completed meanwhile (a replica that had not yet
        /// heard of it) is written by its reference, as the completion renamed the rest.
        async fn record_derived_in(tx: &mut Tx, subject_key: &std::sync::OnceLock<Vec<u8>>, derived: &[Derived]) -> Result<(), StoreError> {
            let mut forgotten: std::collections::HashMap<(&str, &str), Option<String>> = std::collections::HashMap::new();
            for d in derived {
                for owner in d.edges.iter().flat_map(|e| [e.child_owner.as_str(), e.parent_owner.as_str()]) {
                    if forgotten.contains_key(&(d.tenant.as_str(), owner)) {
                        continue;
                    }
                    let name = forgotten_name(subject_key, &d.tenant, owner)?;
                    let erased: Option<String> = sqlx::query_scalar("SELECT subject FROM subjects WHERE tenant = $1 AND subject = $2 AND status = 'erased'")
                        .bind(&d.tenant)
                        .bind(&name)
                        .fetch_optional(&mut **tx)
                        .await?;
                    forgotten.insert((d.tenant.as_str(), owner), erased.filter(|n| n.as_str() != owner));
                }
            }
            let named = |tenant: &str, owner: &str| forgotten.get(&(tenant, owner)).cloned().flatten().unwrap_or_else(|| owner.to_owned());
            for d in derived.iter() {
                if d.replace {
                    sqlx::query("DELETE FROM item_edges WHERE tenant = $1 AND child_store = $2 AND child_collection = $3 AND child_item = $4")
                        .bind(&d.tenant)
                        .bind(&d.child.store)
                        .bind(&d.child.collection)
                        .bind(&d.child.item)
                        .execute(&mut **tx)
                        .await?;
                }
                for edge in &d.edges {
                    sqlx::query(
                        "INSERT INTO item_edges (tenant, child_store, child_collection, child_item, child_owner, parent_store, parent_collection, parent_item, parent_owner, how, at)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING",
                    )
                    .bind(&d.tenant)
                    .bind(&edge.child.store)
                    .bind(&edge.child.collection)
                    .bind(&edge.child.item)
                    .bind(named(&d.tenant, &edge.child_owner))
                    .bind(&edge.parent.store)
                    .bind(&edge.parent.collection)
                    .bind(&edge.parent.item)
                    .bind(named(&d.tenant, &edge.parent_owner))
                    .bind(edge.how.as_str())
                    .bind(edge.at)
                    .execute(&mut **tx)
                    .await?;
                }
            }
            Ok(())
        }

        /// The edges from the subject's items to other subjects' parents: what its items were
        /// derived from.
        async fn borrowed_in(c: &mut Conn, tenant: &str, subject: &str) -> Result<Vec<Edge>, StoreError> {
            let sql = sqlx::AssertSqlSafe(format!(
                "SELECT {EDGE_COLUMNS} FROM item_edges WHERE tenant = $1 AND child_owner = $2 AND parent_owner <> $2 ORDER BY at, child_item"
            ));
            let rows = sqlx::query(sql).bind(tenant).bind(subject).fetch_all(&mut *c).await?;
            rows.iter().map(edge_from_row).collect()
        }

        async fn edges_of_in(c: &mut Conn, tenant: &str, item: &ItemKey) -> Result<(Vec<Edge>, Vec<Edge>), StoreError> {
            let mut found = Vec::new();
            for side in ["child", "parent"] {
                let sql = sqlx::AssertSqlSafe(format!(
                    "SELECT {EDGE_COLUMNS} FROM item_edges WHERE tenant = $1 AND {side}_store = $2 AND {side}_collection = $3 AND {side}_item = $4 ORDER BY at, parent_item, child_item"
                ));
                let rows = sqlx::query(sql).bind(tenant).bind(&item.store).bind(&item.collection).bind(&item.item).fetch_all(&mut *c).await?;
                found.push(rows.iter().map(edge_from_row).collect::<Result<Vec<_>, _>>()?);
            }
            let children = found.pop().unwrap_or_default();
            let parents = found.pop().unwrap_or_default();
            Ok((parents, children))
        }

        /// Every edge inside the closure of `keys`: whose parent is the subjects' item or
        /// derived from one, transitively (a cycle is walked once).
        async fn closure_edges_in(c: &mut Conn, tenant: &str, keys: &[String]) -> Result<Vec<Edge>, StoreError> {
            let mut select = sqlx::QueryBuilder::<$db>::new(
                "WITH RECURSIVE reached (store, collection, item_id) AS (
                     SELECT store, collection, item_id FROM (
                         SELECT store, collection, item_id FROM items WHERE tenant = ",
            );
            select.push_bind(tenant.to_owned()).push(" AND subject IN ");
            push_keys(&mut select, keys);
            select.push(" UNION SELECT parent_store, parent_collection, parent_item FROM item_edges WHERE tenant = ");
            select.push_bind(tenant.to_owned()).push(" AND parent_owner IN ");
            push_keys(&mut select, keys);
            select.push(
                ") AS seeds
                 UNION
                     SELECT e.child_store, e.child_collection, e.child_item FROM item_edges e
                     JOIN reached r ON e.parent_store = r.store AND e.parent_collection = r.collection AND e.parent_item = r.item_id
                     WHERE e.tenant = ",
            );
            select.push_bind(tenant.to_owned());
            select.push(format!(
                ")
                 SELECT {} FROM item_edges e
                 JOIN reached r ON e.parent_store = r.store AND e.parent_collection = r.collection AND e.parent_item = r.item_id
                 WHERE e.tenant = ",
                EDGE_COLUMNS.split(", ").map(|c| format!("e.{c}")).collect::<Vec<_>>().join(", ")
            ));
            select.push_bind(tenant.to_owned());
            let rows = select.build().fetch_all(&mut *c).await?;
            rows.iter().map(edge_from_row).collect()
        }

        /// What the closure of `keys` reaches beyond their own items, each with the decision
        /// `closure` gives it: the subjects' own derivatives are erased with them; another
        /// subject's are undecided (or erased, by policy); what lineage keeps no live row of is
        /// only guarded, and so is the subjects' own where no purge of `stores` reaches (their
        /// stamp keeps it hidden). Another subject's where no purge reaches waits for a person,
        /// who can only release it: it is never kept, or shown again, silently.
        async fn closure_in(
            c: &mut Conn,
            subject_key: &std::sync::OnceLock<Vec<u8>>,
            tenant: &str,
            keys: &[String],
            stores: &BTreeSet<String>,
            closure: Closure,
            at: DateTime<Utc>,
        ) -> Result<Vec<Derivative>, StoreError> {
            if closure == Closure::Off || keys.is_empty() {
                return Ok(Vec::new());
            }
            // Every item derived from one inside the closure is a derivative, the subject's own
            // summaries of its items included.
            let edges = closure_edges_in(&mut *c, tenant, keys).await?;
            let mut nodes: BTreeMap<ItemKey, (BTreeSet<lethe_policy::How>, BTreeSet<ItemKey>)> = BTreeMap::new();
            for edge in edges {
                let node = nodes.entry(edge.child.clone()).or_default();
                node.0.insert(edge.how);
                node.1.insert(edge.parent.clone());
            }
            let listed: Vec<ItemKey> = nodes.keys().cloned().collect();
            let mut owners: BTreeMap<ItemKey, (String, bool)> = BTreeMap::new();
            for chunk in listed.chunks(300) {
                let mut select = sqlx::QueryBuilder::<$db>::new("SELECT store AS o_store, collection AS o_collection, item_id AS o_item, subject, deleted_at FROM items WHERE tenant = ");
                select.push_bind(tenant.to_owned()).push(" AND ");
                push_items(&mut select, ["store", "collection", "item_id"], chunk);
                for row in select.build().fetch_all(&mut *c).await? {
                    let deleted: Option<DateTime<Utc>> = row.try_get("deleted_at")?;
                    owners.insert(item_of(&row, "o_")?, (row.try_get("subject")?, deleted.is_none()));
                }
            }
            Ok(nodes
                .into_iter()
                .map(|(item, (how, parents))| {
                    let owner = owners.get(&item);
                    let own = owner.is_some_and(|(s, _)| keys.contains(s));
                    let live = owner.is_some_and(|(_, live)| *live);
                    let (decision, reason) = if !live {
                        (Decision::Guard, Some("lineage keeps no live item: nothing is left to delete".to_owned()))
                    } else if !stores.contains(&item.store) {
                        let reason = format!("no purge of this request reaches store {}", item.store);
                        (if own { Decision::Guard } else { Decision::Undecided }, Some(reason))
                    } else if own {
                        (Decision::Erase, Some("stamped to the subject: purged with its items".to_owned()))
                    } else if closure == Closure::Erase {
                        (Decision::Erase, Some("[lineage] cross_subject = \"erase\"".to_owned()))
                    } else {
                        (Decision::Undecided, None)
                    };
                    let by_policy = matches!(decision, Decision::Erase | Decision::Guard);
                    Derivative {
                        reference: item.reference(subject_key.get().map_or(&[][..], Vec::as_slice)),
                        subject: owner.map(|(s, _)| s.clone()),
                        own,
                        how: how.into_iter().collect(),
                        parents: parents.into_iter().collect(),
                        decision,
                        decided_by: by_policy.then(|| "lethe".to_owned()),
                        decided_at: by_policy.then_some(at),
                        reason,
                        erased_at: None,
                        item,
                    }
                })
                .collect())
        }

        const DERIVATIVE_COLUMNS: &str = "ref, store, collection, item_id, subject, own, how, parents, decision, decided_by, decided_at, reason, erased_at";

        fn derivative_from_row(row: &Row) -> Result<Derivative, StoreError> {
            let decision: String = row.try_get("decision")?;
            let how: Json<Vec<lethe_policy::How>> = row.try_get("how")?;
            let parents: Json<Vec<ItemKey>> = row.try_get("parents")?;
            Ok(Derivative {
                reference: row.try_get("ref")?,
                item: ItemKey { store: row.try_get("store")?, collection: row.try_get("collection")?, item: row.try_get("item_id")? },
                subject: row.try_get("subject")?,
                own: row.try_get("own")?,
                how: how.0,
                parents: parents.0,
                decision: Decision::parse(&decision).ok_or_else(|| StoreError::Corrupt(format!("derivative decision {decision:?}")))?,
                decided_by: row.try_get("decided_by")?,
                decided_at: row.try_get("decided_at")?,
                reason: row.try_get("reason")?,
                erased_at: row.try_get("erased_at")?,
            })
        }

        async fn derivatives_in(c: &mut Conn, request_id: &str) -> Result<Vec<Derivative>, StoreError> {
            let sql = sqlx::AssertSqlSafe(format!("SELECT {DERIVATIVE_COLUMNS} FROM erasure_derivatives WHERE request_id = $1 ORDER BY store, collection, item_id"));
            let rows = sqlx::query(sql).bind(request_id).fetch_all(&mut *c).await?;
            rows.iter().map(derivative_from_row).collect()
        }

        /// Records what the request's closure reaches now and was not recorded before; answers
        /// whether anything was new (then every replica must hear of it).
        async fn extend_closure(tx: &mut Tx, subject_key: &std::sync::OnceLock<Vec<u8>>, record: &ErasureRecord, closure: Closure, at: DateTime<Utc>) -> Result<bool, StoreError> {
            if closure == Closure::Off {
                return Ok(false);
            }
            let targets: Vec<String> = sqlx::query_scalar("SELECT target FROM purge_jobs WHERE request_id = $1 AND state <> 'cancelled'")
                .bind(&record.id)
                .fetch_all(&mut **tx)
                .await?;
            let stores = target_stores(&targets);
            let keys: Vec<String> = record.keys().map(str::to_owned).collect();
            let found = closure_in(&mut **tx, subject_key, &record.tenant, &keys, &stores, closure, at).await?;
            let mut new = false;
            for d in &found {
                let inserted = sqlx::query(
                    "INSERT INTO erasure_derivatives (request_id, ref, tenant, store, collection, item_id, subject, own, how, parents, decision, decided_by, decided_at, reason, erased_at, found_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, NULL, $15) ON CONFLICT (request_id, ref) DO NOTHING",
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
        async fn derivatives_left(tx: &mut Tx, request_id: &str, targets: &[String]) -> Result<(BTreeSet<String>, usize), StoreError> {
            let unerased: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM erasure_derivatives WHERE request_id = $1 AND decision = 'erase' AND erased_at IS NULL")
                .bind(request_id)
                .fetch_one(&mut **tx)
                .await?;
            let unverified = if unerased > 0 { targets.iter().cloned().collect() } else { BTreeSet::new() };
            let undecided: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM erasure_derivatives WHERE request_id = $1 AND decision = 'undecided'")
                .bind(request_id)
                .fetch_one(&mut **tx)
                .await?;
            Ok((unverified, usize::try_from(undecided).unwrap_or(usize::MAX)))
        }

        /// Drops the edges from `item` to anything in the closure of `keys` (a released
        /// derivative no longer derives from the erased subject).
        async fn drop_closure_edges(tx: &mut Tx, tenant: &str, keys: &[String], item: &ItemKey) -> Result<(), StoreError> {
            for edge in closure_edges_in(&mut **tx, tenant, keys).await? {
                if edge.child != *item {
                    continue;
                }
                sqlx::query("DELETE FROM item_edges WHERE tenant = $1 AND child_store = $2 AND child_collection = $3 AND child_item = $4 AND parent_store = $5 AND parent_collection = $6 AND parent_item = $7")
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

        async fn hidden_items_in(c: &mut Conn, tenant: &str, since: DateTime<Utc>) -> Result<std::collections::HashSet<ItemKey>, StoreError> {
            let rows = sqlx::query(
                "SELECT d.store AS h_store, d.collection AS h_collection, d.item_id AS h_item FROM erasure_derivatives d
                 JOIN erasure_requests r ON r.id = d.request_id
                 WHERE d.tenant = $1 AND d.decision <> 'release' AND (r.state <> 'completed' OR r.suppressed_at >= $2)",
            )
            .bind(tenant)
            .bind(since)
            .fetch_all(&mut *c)
            .await?;
            rows.iter().map(|r| item_of(r, "h_")).collect()
        }

        /// Inside the completing transaction: lineage of derivatives names the erased subject
        /// by reference too, as edges to and from its items do.
        async fn forget_in_lineage(tx: &mut Tx, tenant: &str, key: &str, name: &str) -> Result<(), StoreError> {
            for column in ["child_owner", "parent_owner"] {
                let sql = sqlx::AssertSqlSafe(format!("UPDATE item_edges SET {column} = $3 WHERE tenant = $1 AND {column} = $2"));
                sqlx::query(sql).bind(tenant).bind(key).bind(name).execute(&mut **tx).await?;
            }
            sqlx::query("UPDATE erasure_derivatives SET subject = $3 WHERE tenant = $1 AND subject = $2")
                .bind(tenant)
                .bind(key)
                .bind(name)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }

        /// Items renamed as their owner's key is forgotten (`from` -> the new id): their edges
        /// and derivative rows follow, and so do the parents derivative rows name.
        async fn rename_in_lineage(tx: &mut Tx, tenant: &str, renamed: &[(ItemKey, String)]) -> Result<(), StoreError> {
            if renamed.is_empty() {
                return Ok(());
            }
            for (from, to) in renamed {
                for side in ["child", "parent"] {
                    let sql = sqlx::AssertSqlSafe(format!(
                        "UPDATE item_edges SET {side}_item = $5 WHERE tenant = $1 AND {side}_store = $2 AND {side}_collection = $3 AND {side}_item = $4"
                    ));
                    sqlx::query(sql).bind(tenant).bind(&from.store).bind(&from.collection).bind(&from.item).bind(to).execute(&mut **tx).await?;
                }
                sqlx::query("UPDATE erasure_derivatives SET item_id = $5 WHERE tenant = $1 AND store = $2 AND collection = $3 AND item_id = $4")
                    .bind(tenant)
                    .bind(&from.store)
                    .bind(&from.collection)
                    .bind(&from.item)
                    .bind(to)
                    .execute(&mut **tx)
                    .await?;
            }
            let rows = sqlx::query("SELECT request_id, ref, parents FROM erasure_derivatives WHERE tenant = $1").bind(tenant).fetch_all(&mut **tx).await?;
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
                    sqlx::query("UPDATE erasure_derivatives SET parents = $3 WHERE request_id = $1 AND ref = $2")
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
