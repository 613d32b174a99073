//! The SQL of derivative lineage's edges and an erasure's closure (every item reachable from
//! the subject's items through edges, transitively), for both backends. Expanded inside
//! `impl_store!`, in its module: its imports, `Row`, `Tx` and shared helpers are in scope.

/// Defines the functions over `$db` that read and write edges and find a closure.
macro_rules! closure_sql {
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
                select
                    .push(format!("({} = ", columns[0]))
                    .push_bind(item.store.clone());
                select
                    .push(format!(" AND {} = ", columns[1]))
                    .push_bind(item.collection.clone());
                select
                    .push(format!(" AND {} = ", columns[2]))
                    .push_bind(item.item.clone());
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
                how: lethe_policy::How::parse(&how).ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "edge \
                    how {how:?}"
                    ))
                })?,
                at: row.try_get("at")?,
            })
        }

        const EDGE_COLUMNS: &str = "child_store, child_collection, child_item, \
            child_owner, parent_store, parent_collection, parent_item, parent_owner, \
            how, at";

        /// Records each child's edges (replacing those it had, if so), inside the caller's
        /// transaction. An owner whose erasure completed meanwhile (a replica that had not yet
        /// heard of it) is written by its reference, as the completion renamed the rest.
        async fn record_derived_in(
            tx: &mut Tx,
            subject_key: &std::sync::OnceLock<Vec<u8>>,
            derived: &[Derived],
        ) -> Result<(), StoreError> {
            let mut forgotten: std::collections::HashMap<(&str, &str), Option<String>> =
                std::collections::HashMap::new();
            for d in derived {
                for owner in d
                    .edges
                    .iter()
                    .flat_map(|e| [e.child_owner.as_str(), e.parent_owner.as_str()])
                {
                    if forgotten.contains_key(&(d.tenant.as_str(), owner)) {
                        continue;
                    }
                    let name = forgotten_name(subject_key, &d.tenant, owner)?;
                    let erased: Option<String> = sqlx::query_scalar(
                        "SELECT subject \
                        FROM subjects WHERE tenant = $1 AND subject = $2 AND status = \
                        'erased'",
                    )
                    .bind(&d.tenant)
                    .bind(&name)
                    .fetch_optional(&mut **tx)
                    .await?;
                    forgotten.insert(
                        (d.tenant.as_str(), owner),
                        erased.filter(|n| n.as_str() != owner),
                    );
                }
            }
            let named = |tenant: &str, owner: &str| {
                forgotten
                    .get(&(tenant, owner))
                    .cloned()
                    .flatten()
                    .unwrap_or_else(|| owner.to_owned())
            };
            for d in derived.iter() {
                if d.replace {
                    sqlx::query(
                        "DELETE FROM item_edges WHERE tenant = $1 AND \
                        child_store = $2 AND child_collection = $3 AND child_item = $4",
                    )
                    .bind(&d.tenant)
                    .bind(&d.child.store)
                    .bind(&d.child.collection)
                    .bind(&d.child.item)
                    .execute(&mut **tx)
                    .await?;
                }
                for edge in &d.edges {
                    sqlx::query(
                        "INSERT INTO item_edges (tenant, child_store, \
                            child_collection, child_item, child_owner, parent_store, \
                            parent_collection, parent_item, parent_owner, how, at)
                            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON \
                            CONFLICT DO NOTHING",
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
        async fn borrowed_in(
            c: &mut Conn,
            tenant: &str,
            subject: &str,
        ) -> Result<Vec<Edge>, StoreError> {
            let sql = sqlx::AssertSqlSafe(format!(
                "SELECT {EDGE_COLUMNS} FROM item_edges WHERE tenant = $1 AND \
                    child_owner = $2 AND parent_owner <> $2 ORDER BY at, child_item"
            ));
            let rows = sqlx::query(sql)
                .bind(tenant)
                .bind(subject)
                .fetch_all(&mut *c)
                .await?;
            rows.iter().map(edge_from_row).collect()
        }

        async fn edges_of_in(
            c: &mut Conn,
            tenant: &str,
            item: &ItemKey,
        ) -> Result<(Vec<Edge>, Vec<Edge>), StoreError> {
            let mut found = Vec::new();
            for side in ["child", "parent"] {
                let sql = sqlx::AssertSqlSafe(format!(
                    "SELECT {EDGE_COLUMNS} FROM item_edges WHERE tenant = $1 AND \
                        {side}_store = $2 AND {side}_collection = $3 AND {side}_item = \
                        $4 ORDER BY at, parent_item, child_item"
                ));
                let rows = sqlx::query(sql)
                    .bind(tenant)
                    .bind(&item.store)
                    .bind(&item.collection)
                    .bind(&item.item)
                    .fetch_all(&mut *c)
                    .await?;
                found.push(
                    rows.iter()
                        .map(edge_from_row)
                        .collect::<Result<Vec<_>, _>>()?,
                );
            }
            let children = found.pop().unwrap_or_default();
            let parents = found.pop().unwrap_or_default();
            Ok((parents, children))
        }

        /// Every edge inside the closure of `keys`: whose parent is the subjects' item or
        /// derived from one, transitively (a cycle is walked once).
        async fn closure_edges_in(
            c: &mut Conn,
            tenant: &str,
            keys: &[String],
        ) -> Result<Vec<Edge>, StoreError> {
            let mut select = sqlx::QueryBuilder::<$db>::new(
                "WITH RECURSIVE reached (store, collection, item_id) AS (
                     SELECT store, collection, item_id FROM (
                         SELECT store, collection, item_id FROM items WHERE tenant = ",
            );
            select.push_bind(tenant.to_owned()).push(" AND subject IN ");
            push_keys(&mut select, keys);
            select.push(
                " UNION SELECT parent_store, parent_collection, parent_item \
                FROM item_edges WHERE tenant = ",
            );
            select
                .push_bind(tenant.to_owned())
                .push(" AND parent_owner IN ");
            push_keys(&mut select, keys);
            select.push(
                ") AS seeds
                    UNION
                     SELECT e.child_store, e.child_collection, e.child_item FROM \
                     item_edges e
                     JOIN reached r ON e.parent_store = r.store AND \
                     e.parent_collection = r.collection AND e.parent_item = r.item_id
                     WHERE e.tenant = ",
            );
            select.push_bind(tenant.to_owned());
            select.push(format!(
                ")
                    SELECT {} FROM item_edges e
                    JOIN reached r ON e.parent_store = r.store AND e.parent_collection \
                    = r.collection AND e.parent_item = r.item_id
                    WHERE e.tenant = ",
                EDGE_COLUMNS
                    .split(", ")
                    .map(|c| format!("e.{c}"))
                    .collect::<Vec<_>>()
                    .join(
                        ", \
                    "
                    )
            ));
            select.push_bind(tenant.to_owned());
            let rows = select.build().fetch_all(&mut *c).await?;
            rows.iter().map(edge_from_row).collect()
        }

        /// Whose each of `items` is, as lineage keeps it, and whether it is still live.
        async fn owners_in(
            c: &mut Conn,
            tenant: &str,
            items: &[ItemKey],
        ) -> Result<BTreeMap<ItemKey, (String, bool)>, StoreError> {
            let mut owners: BTreeMap<ItemKey, (String, bool)> = BTreeMap::new();
            for chunk in items.chunks(300) {
                let mut select = sqlx::QueryBuilder::<$db>::new(
                    "SELECT store AS \
                    o_store, collection AS o_collection, item_id AS o_item, subject, \
                    deleted_at FROM items WHERE tenant = ",
                );
                select.push_bind(tenant.to_owned()).push(" AND ");
                push_items(&mut select, ["store", "collection", "item_id"], chunk);
                for row in select.build().fetch_all(&mut *c).await? {
                    let deleted: Option<DateTime<Utc>> = row.try_get("deleted_at")?;
                    owners.insert(
                        item_of(&row, "o_")?,
                        (row.try_get("subject")?, deleted.is_none()),
                    );
                }
            }
            Ok(owners)
        }

        /// What is decided of a derivative in store `store` when the request is filed, and why.
        fn decided(
            live: bool,
            own: bool,
            store: &str,
            stores: &BTreeSet<String>,
            closure: Closure,
        ) -> (Decision, Option<String>) {
            if !live {
                let reason = "lineage keeps no live item: nothing is left to delete";
                (Decision::Guard, Some(reason.to_owned()))
            } else if !stores.contains(store) {
                let reason = format!("no purge of this request reaches store {store}");
                let decision = if own {
                    Decision::Guard
                } else {
                    Decision::Undecided
                };
                (decision, Some(reason))
            } else if own {
                let reason = "stamped to the subject: purged with its items";
                (Decision::Erase, Some(reason.to_owned()))
            } else if closure == Closure::Erase {
                let reason = "[lineage] cross_subject = \"erase\"";
                (Decision::Erase, Some(reason.to_owned()))
            } else {
                (Decision::Undecided, None)
            }
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
            let mut nodes: BTreeMap<ItemKey, (BTreeSet<lethe_policy::How>, BTreeSet<ItemKey>)> =
                BTreeMap::new();
            for edge in edges {
                let node = nodes.entry(edge.child.clone()).or_default();
                node.0.insert(edge.how);
                node.1.insert(edge.parent.clone());
            }
            let listed: Vec<ItemKey> = nodes.keys().cloned().collect();
            let owners = owners_in(&mut *c, tenant, &listed).await?;
            Ok(nodes
                .into_iter()
                .map(|(item, (how, parents))| {
                    let owner = owners.get(&item);
                    let own = owner.is_some_and(|(s, _)| keys.contains(s));
                    let live = owner.is_some_and(|(_, live)| *live);
                    let (decision, reason) = decided(live, own, &item.store, stores, closure);
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
    };
}
pub(crate) use closure_sql;
