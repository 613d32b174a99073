//! A completed erasure leaves only references: no row and no file of either backend holds an erased
//! key.

use super::*;

on_both_backends!(a_completed_erasure_leaves_only_the_references,);

/// Once an erasure completes, the store knows the subject by reference only, and by that still
/// refuses it, lists its lineage for a replay, and keeps the other subject as it was.
async fn a_completed_erasure_leaves_only_the_references(store: &Arc<dyn Store>) {
    let record = erase_to_completion(store).await;
    let [key, alias] = ERASED_KEYS;
    let names: Vec<String> = ERASED_KEYS
        .iter()
        .map(|k| lethe_policy::audit::forgotten(crate::testing::AUDIT_KEY, "acme", k))
        .collect();
    assert_eq!(
        record.keys().collect::<Vec<_>>(),
        names.iter().map(String::as_str).collect::<Vec<_>>()
    );
    assert_eq!(
        store.erasure("er1").await.unwrap(),
        record,
        "what was answered is what was stored"
    );
    for k in [key, alias] {
        let state = store
            .subject("acme", k)
            .await
            .unwrap()
            .expect("known by reference");
        assert_eq!(
            (state.status, state.epoch),
            (SubjectStatus::Erased, 1),
            "{k}"
        );
        assert!(store.grants("acme", k).await.unwrap().is_empty());
        assert!(store.processors("acme", k).await.unwrap().is_empty());
    }
    assert_eq!(
        store
            .subject_policy("acme", key)
            .await
            .unwrap()
            .state
            .status,
        SubjectStatus::Erased
    );
    assert!(
        matches!(
            store
                .create_grant(&grant("g3", key), audit("consent.grant", Some("g3")))
                .await,
            Err(StoreError::SubjectNotActive)
        ),
        "a later grant for the erased subject is refused"
    );
    assert_eq!(
        store.subject("acme", key).await.unwrap().unwrap().status,
        SubjectStatus::Erased,
        "and creates no row under the key"
    );
    let tombstone = store
        .tombstones_since(now() - TimeDelta::hours(1))
        .await
        .unwrap();
    assert_eq!(tombstone[0].keys(), names);
    let lineage = store
        .lineage_items("acme", "chroma", &names, true)
        .await
        .unwrap();
    assert_eq!(lineage.len(), 3, "a replay finds the lineage by reference");
    assert!(
        lineage.iter().all(|(_, id)| !id.contains(key)),
        "an id holding the key holds the reference instead: {lineage:?}"
    );
    // Its lineage follows: the edge of the renamed item, owned by the reference.
    let facts = ItemKey::new(
        "chroma",
        "memories",
        &format!("[\"acme\",\"{}\",\"facts\"]", names[0]),
    );
    let (parents, _) = store.edges_of("acme", &facts).await.unwrap();
    let edges: Vec<(&str, &str)> = parents
        .iter()
        .map(|e| (e.child_owner.as_str(), e.parent.item.as_str()))
        .collect();
    assert_eq!(edges, [(names[0].as_str(), "c")]);
    // An edge a replica records late, naming the key still, names the reference.
    let late = ItemKey::new("chroma", "memories", "late");
    store
        .record_derived(&[Derived {
            tenant: "acme".into(),
            child: late.clone(),
            edges: vec![Edge {
                child: late.clone(),
                child_owner: "u2".into(),
                parent: facts.clone(),
                parent_owner: key.into(),
                how: lethe_policy::How::Trace,
                at: now(),
            }],
            replace: false,
        }])
        .await
        .unwrap();
    let (parents, _) = store.edges_of("acme", &late).await.unwrap();
    assert_eq!(
        parents
            .iter()
            .map(|e| e.parent_owner.as_str())
            .collect::<Vec<_>>(),
        [names[0].as_str()]
    );
    // The other subject is untouched.
    assert_eq!(store.grants("acme", "u2").await.unwrap().len(), 1);
    assert_eq!(
        store.inventory("acme", "u2").await.unwrap().get("chroma"),
        Some(&1)
    );
    assert_eq!(store.processors("acme", "u2").await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_sqlite_state_file_holds_no_raw_key_after_completion() {
    let url = fresh_sqlite_url();
    let store = migrated(&url).await;
    a_completed_erasure_leaves_only_the_references(&store).await;
    let path = url.trim_start_matches("sqlite://");
    // Every file of the database: the main file, its write-ahead log and shared memory.
    let dir = std::path::Path::new(path).parent().unwrap();
    let mut files = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        files += 1;
        assert!(
            !bytes
                .windows(ERASED_KEYS[0].len())
                .any(|w| w == ERASED_KEYS[0].as_bytes()),
            "a file of the state store still holds the raw key"
        );
    }
    assert!(files >= 1);
    assert!(
        std::fs::read(path).unwrap().windows(2).any(|w| w == b"u2"),
        "the scan would see a key (the other subject's is there)"
    );
}

/// A state store from before: an erasure completed while Lethe kept the key. The upgraded
/// Lethe forgets it once, and then knows the subject by reference only.
#[tokio::test]
async fn an_upgrade_forgets_the_keys_of_earlier_completions() {
    let url = fresh_sqlite_url();
    let store = migrated(&url).await;
    let key = "subject-before-upgrade";
    store
        .create_grant(&grant("g1", key), audit("consent.grant", Some("g1")))
        .await
        .unwrap();
    let record = crate::testing::erasure_request("er0", key, now());
    store
        .create_erasure(&record, &[], audit("erasure.request", Some("er0")))
        .await
        .unwrap();
    crate::testing::execute_raw(
        &url,
        &format!(
            "UPDATE erasure_requests SET state = 'completed' WHERE id = 'er0';
             UPDATE subjects SET status = 'erased', epoch = 1 WHERE subject = '{key}';
             INSERT INTO tombstones VALUES ('er0', 'acme', '{key}', '{{\"keys\": [\"{key}\"], \"targets\": [\"chroma:chroma\"]}}', '2026-01-01T00:00:00+00:00');"
        ),
    )
    .await
    .unwrap();
    assert_eq!(store.forget_erased(now()).await.unwrap(), 1);
    assert_eq!(store.forget_erased(now()).await.unwrap(), 0, "once");
    let name = lethe_policy::audit::forgotten(crate::testing::AUDIT_KEY, "acme", key);
    assert_eq!(store.erasure("er0").await.unwrap().subject, name);
    let tombstones = store
        .tombstones_since(now() - TimeDelta::days(3650))
        .await
        .unwrap();
    assert_eq!(tombstones[0].keys(), std::slice::from_ref(&name));
    assert_eq!(
        tombstones[0].scope["targets"],
        serde_json::json!(["chroma:chroma"])
    );
    assert_eq!(tombstones[0].subject, name);
    let state = store.subject("acme", key).await.unwrap().unwrap();
    assert_eq!((state.status, state.epoch), (SubjectStatus::Erased, 1));
    let path = url.trim_start_matches("sqlite://");
    let dir = std::path::Path::new(path).parent().unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        assert!(!bytes.windows(key.len()).any(|w| w == key.as_bytes()));
    }
}

#[tokio::test]
async fn no_row_of_a_postgres_state_store_holds_a_raw_key_after_completion() {
    let url = fresh_postgres_database()
        .await
        .expect("a PostgreSQL test database");
    let store = migrated(&url).await;
    a_completed_erasure_leaves_only_the_references(&store).await;
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    let mut holding = Vec::new();
    let mut seen_other = false;
    for table in &tables {
        let count = |needle: &str| {
            format!("SELECT count(*) FROM \"{table}\" t WHERE t::text LIKE '%{needle}%'")
        };
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count(ERASED_KEYS[0])))
            .fetch_one(&mut conn)
            .await
            .unwrap();
        if n > 0 {
            holding.push(table.clone());
        }
        let other: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count("u2")))
            .fetch_one(&mut conn)
            .await
            .unwrap();
        seen_other |= other > 0;
    }
    assert!(
        holding.is_empty(),
        "tables still holding the raw key: {holding:?}"
    );
    assert!(
        seen_other,
        "the scan would see a key (the other subject's is there)"
    );
    for table in ["item_edges", "lineage_traces", "lineage_texts"] {
        let sql = format!("SELECT count(*) FROM {table}");
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert!(n > 0, "{table} holds the renamed rows the scan looked at");
    }
}
