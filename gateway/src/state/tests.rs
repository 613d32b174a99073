//! One suite, run against both backends: every test below exists once for SQLite and once for
//! PostgreSQL (a fresh database on the local server).

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::{DateTime, Months, TimeDelta, Utc};
use lethe_policy::audit::{AuditEntry, subject_ref};
use lethe_policy::{
    Action, ConsentGrant, Layer, LegalHold, RetentionPolicy, RetentionRule, SubjectStatus,
};

use super::*;
use crate::now;
use crate::testing::{fresh_postgres_database, fresh_sqlite_url, migrated};

mod derivatives;

macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test] async fn $name() { super::$name(&crate::testing::migrated(&crate::testing::fresh_sqlite_url()).await).await })*
        }
        mod postgres {
            $(#[tokio::test] async fn $name() {
                let url = crate::testing::fresh_postgres_database().await.expect("create a PostgreSQL test database");
                super::$name(&crate::testing::migrated(&url).await).await
            })*
        }
    };
}

on_both_backends!(
    migrations_apply_once,
    a_completed_erasure_leaves_only_the_references,
    grants_are_created_listed_and_revoked_once,
    retention_rules_are_versioned,
    holds_are_placed_and_released_once,
    inventory_counts_live_lineage_per_store,
    marking_many_items_deleted_counts_each_live_row_once,
    generated_secrets_are_kept,
    audit_appends_form_one_chain_under_concurrency,
    an_approved_erasure_flips_its_keys_and_tells_every_cache,
    expired_and_revoked_items_are_found_for_the_sweeper_unless_held,
    erasure_requests_are_listed_a_page_at_a_time_and_summed_up,
    a_refused_request_keeps_its_reason_and_cancels_its_jobs,
    a_flip_is_suppressed_only_once_it_holds_in_every_governed_database,
    a_forged_kept_head_is_named,
);

/// The raw keys of the erased subject in the test below: distinct enough that no hash, id or
/// timestamp contains them by chance.
pub(crate) const ERASED_KEYS: [&str; 2] = ["subject-qx7", "subject-qx7-old"];

/// Files an erasure of `ERASED_KEYS` over a subject with a grant, a hold, lineage and a
/// provider, purges it and completes it; returns the completed record.
pub(crate) async fn erase_to_completion(store: &Arc<dyn Store>) -> ErasureRecord {
    use lethe_policy::ErasureState;
    let [key, alias] = ERASED_KEYS;
    store
        .create_grant(&grant("g1", key), audit("consent.grant", Some("g1")))
        .await
        .unwrap();
    store
        .create_grant(&grant("g2", "u2"), audit("consent.grant", Some("g2")))
        .await
        .unwrap();
    let at = now();
    let hold = HoldRecord {
        hold: LegalHold {
            id: "h1".into(),
            tenant: "acme".into(),
            subject: Some(key.into()),
            reason: "audit".into(),
            placed_at: at,
            released_at: None,
        },
        placed_by: "legal".into(),
        released_by: None,
    };
    store
        .place_hold(&hold, audit("hold.place", Some("h1")))
        .await
        .unwrap();
    store
        .release_hold("h1", at, "legal", audit("hold.release", Some("h1")))
        .await
        .unwrap();
    let item = |id: &str, subject: &str| lineage_row("chroma", "memories", id, subject);
    store
        .record_items(&[
            item("a", key),
            item("b", alias),
            item("c", "u2"),
            // The store's own name holds the key (a LangGraph namespace, a client's id).
            ItemRecord {
                source_ref: Some(format!("chat-{key}")),
                parents: vec![format!("{key}-m0")],
                ..item(&format!("[\"acme\",\"{key}\",\"facts\"]"), key)
            },
        ])
        .await
        .unwrap();
    // Lineage naming the key: an edge of its item (whose id holds the key) derived from
    // another subject's, and what the replicas share of its items in the window.
    let facts = ItemKey::new(
        "chroma",
        "memories",
        &format!("[\"acme\",\"{key}\",\"facts\"]"),
    );
    let other = ItemKey::new("chroma", "memories", "c");
    store
        .record_derived(&[Derived {
            tenant: "acme".into(),
            child: facts.clone(),
            edges: vec![Edge {
                child: facts.clone(),
                child_owner: key.into(),
                parent: other,
                parent_owner: "u2".into(),
                how: lethe_policy::How::Quote,
                at,
            }],
            replace: false,
        }])
        .await
        .unwrap();
    if let Some(shared) = store.shared_memory() {
        let shared_row = |what| Shared {
            tenant: "acme".into(),
            item: facts.clone(),
            owner: key.into(),
            answer: false,
            at,
            what,
        };
        shared
            .share(&[
                shared_row(Sharing::Trace("0af7651916cd43dd8448eb211c80319c".into())),
                shared_row(Sharing::Text {
                    digest: 7,
                    runs: vec![1, 2, 3],
                }),
            ])
            .await
            .unwrap();
    }
    let used = |subject: &str| ProcessorUse {
        tenant: "acme".into(),
        subject: subject.into(),
        processor: "openai".into(),
        first_at: at,
        last_at: at,
    };
    store
        .record_processors(&[used(key), used("u2")])
        .await
        .unwrap();
    let record = ErasureRecord {
        aliases: vec![alias.into()],
        ..crate::testing::erasure_request("er1", key, at)
    };
    store
        .create_erasure(
            &record,
            &["chroma:chroma".into()],
            audit("erasure.request", Some("er1")),
        )
        .await
        .unwrap();
    store
        .approve_erasure("er1", "dpo", 1, at, audit("erasure.approve", Some("er1")))
        .await
        .unwrap();
    let job = store
        .claim_purge_job("w", now(), now(), now() + TimeDelta::minutes(1))
        .await
        .unwrap()
        .expect("a due job");
    store
        .mark_items_deleted(
            "chroma",
            "memories",
            &[
                "a".into(),
                "b".into(),
                format!("[\"acme\",\"{key}\",\"facts\"]"),
            ],
            now(),
        )
        .await
        .unwrap();
    let done = store
        .finish_purge_job(
            &job.id,
            JobOutcome::Done(serde_json::json!({"deleted": 2})),
            now(),
            audit("purge", Some(&job.id)),
        )
        .await
        .unwrap();
    assert_eq!(done.state, ErasureState::Completed);
    done
}

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

fn audit(action: &str, target_ref: Option<&str>) -> AuditEntry {
    AuditEntry {
        at: now(),
        tenant: Some("acme".into()),
        actor: "dpo@test".into(),
        action: action.into(),
        request_id: uuid::Uuid::new_v4().to_string(),
        subject_ref: Some(subject_ref(b"k", "acme", "u1")),
        target: "test".into(),
        target_ref: target_ref.map(str::to_owned),
        result: "ok".into(),
        attempt: 1,
    }
}

/// A lineage row of tenant `acme`, kept for personalization, expiring in a day.
fn lineage_row(store: &str, collection: &str, id: &str, subject: &str) -> ItemRecord {
    ItemRecord {
        store: store.into(),
        collection: collection.into(),
        item_id: id.into(),
        tenant: "acme".into(),
        subject: subject.into(),
        purpose: "personalization".into(),
        category: "preference".into(),
        layer: Layer::Raw,
        created_at: now(),
        expires_at: now() + TimeDelta::days(1),
        epoch: 0,
        source_ref: None,
        parents: vec![],
    }
}

fn grant(id: &str, subject: &str) -> ConsentGrant {
    ConsentGrant {
        id: id.into(),
        tenant: "acme".into(),
        subject: subject.into(),
        purpose: "personalization".into(),
        category: "preference".into(),
        actions: BTreeSet::from([Action::Store, Action::Retrieve]),
        granted_at: now(),
        expires_at: Some(now() + TimeDelta::days(30)),
        revoked_at: None,
        policy_version: 3,
        source: "signup-form".into(),
    }
}

async fn migrations_apply_once(store: &Arc<dyn Store>) {
    assert_eq!(store.migrate().await.unwrap(), Vec::<i64>::new());
    store.ping().await.unwrap();
    assert_eq!(store.audit_head(None).await.unwrap(), ChainHead::default());
}

async fn grants_are_created_listed_and_revoked_once(store: &Arc<dyn Store>) {
    let g = grant("g1", "u1");
    store
        .create_grant(&g, audit("consent.grant", Some("g1")))
        .await
        .unwrap();
    store
        .create_grant(&grant("g2", "u1"), audit("consent.grant", Some("g2")))
        .await
        .unwrap();
    store
        .create_grant(&grant("g3", "u2"), audit("consent.grant", Some("g3")))
        .await
        .unwrap();

    assert_eq!(
        store.grant("g1").await.unwrap(),
        g,
        "a grant reads back exactly as written"
    );
    let listed = store.grants("acme", "u1").await.unwrap();
    assert_eq!(
        listed.iter().map(|g| g.id.as_str()).collect::<Vec<_>>(),
        ["g1", "g2"]
    );
    assert!(store.grants("other", "u1").await.unwrap().is_empty());
    assert_eq!(
        store.subject("acme", "u1").await.unwrap(),
        Some(SubjectState {
            status: SubjectStatus::Active,
            epoch: 0
        })
    );
    assert_eq!(store.subject("acme", "nobody").await.unwrap(), None);

    let at = now();
    let revoked = store
        .revoke_grant("g1", at, audit("consent.revoke", Some("g1")))
        .await
        .unwrap();
    assert_eq!(revoked.revoked_at, Some(at));
    let head = store.audit_head(None).await.unwrap();
    assert!(matches!(
        store
            .revoke_grant("g1", now(), audit("consent.revoke", Some("g1")))
            .await,
        Err(StoreError::AlreadyRevoked)
    ));
    assert!(matches!(
        store
            .revoke_grant("nope", now(), audit("consent.revoke", None))
            .await,
        Err(StoreError::NotFound)
    ));
    assert_eq!(
        store.audit_head(None).await.unwrap(),
        head,
        "a refused change writes no audit event"
    );
    assert_eq!(
        store.grant("g1").await.unwrap().revoked_at,
        Some(at),
        "the first revocation stands"
    );

    let duplicate = store
        .create_grant(&g, audit("consent.grant", Some("g1")))
        .await;
    assert!(duplicate.is_err(), "ids are unique");
    assert_eq!(
        store.audit_head(None).await.unwrap(),
        head,
        "and the failed insert left no audit event"
    );
    assert_eq!(head.seq, 4);
}

async fn retention_rules_are_versioned(store: &Arc<dyn Store>) {
    assert_eq!(store.retention("acme").await.unwrap(), None);
    let policy = |age: &str| RetentionPolicy {
        rules: vec![RetentionRule {
            purpose: "personalization".into(),
            category: "preference".into(),
            layer: Some(Layer::Cache),
            max_age: age.parse().unwrap(),
            legal_end: None,
        }],
        purpose_ends: vec![],
    };
    let v1 = store
        .replace_retention(
            "acme",
            &policy("30d"),
            now(),
            "dpo",
            audit("retention.replace", None),
        )
        .await
        .unwrap();
    let v2 = store
        .replace_retention(
            "acme",
            &policy("7d"),
            now(),
            "dpo",
            audit("retention.replace", None),
        )
        .await
        .unwrap();
    assert_eq!((v1.version, v2.version), (1, 2));
    assert_eq!(store.retention("acme").await.unwrap(), Some(v2));
    let other = store
        .replace_retention(
            "globex",
            &policy("1d"),
            now(),
            "dpo",
            audit("retention.replace", None),
        )
        .await
        .unwrap();
    assert_eq!(other.version, 1, "versions count per tenant");
    let events = store.audit_page(0, 10, None).await.unwrap();
    assert_eq!(
        events[1].entry.target_ref.as_deref(),
        Some("2"),
        "the audit event names the version"
    );
}

async fn holds_are_placed_and_released_once(store: &Arc<dyn Store>) {
    let hold = |id: &str, subject: Option<&str>| HoldRecord {
        hold: LegalHold {
            id: id.into(),
            tenant: "acme".into(),
            subject: subject.map(str::to_owned),
            reason: "case 42".into(),
            placed_at: now(),
            released_at: None,
        },
        placed_by: "counsel".into(),
        released_by: None,
    };
    store
        .place_hold(&hold("h1", None), audit("hold.place", Some("h1")))
        .await
        .unwrap();
    store
        .place_hold(&hold("h2", Some("u1")), audit("hold.place", Some("h2")))
        .await
        .unwrap();
    store
        .place_hold(&hold("h3", Some("u2")), audit("hold.place", Some("h3")))
        .await
        .unwrap();
    let ids = |hs: Vec<HoldRecord>| hs.into_iter().map(|h| h.hold.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.holds("acme", Some("u1")).await.unwrap()),
        ["h1", "h2"]
    );
    assert_eq!(
        ids(store.holds("acme", None).await.unwrap()),
        ["h1", "h2", "h3"]
    );

    let released = store
        .release_hold("h2", now(), "counsel", audit("hold.release", Some("h2")))
        .await
        .unwrap();
    assert!(released.hold.released_at.is_some());
    assert_eq!(released.released_by.as_deref(), Some("counsel"));
    assert!(matches!(
        store
            .release_hold("h2", now(), "counsel", audit("hold.release", Some("h2")))
            .await,
        Err(StoreError::AlreadyReleased)
    ));
    assert_eq!(store.audit_head(None).await.unwrap().seq, 4);
}

async fn inventory_counts_live_lineage_per_store(store: &Arc<dyn Store>) {
    let item = |store: &str, id: &str, subject: &str| ItemRecord {
        source_ref: Some("chat-1".into()),
        parents: vec!["p1".into()],
        ..lineage_row(store, "memories", id, subject)
    };
    store
        .record_items(&[
            item("chroma", "a", "u1"),
            item("chroma", "b", "u1"),
            item("redis", "c", "u1"),
            item("chroma", "d", "u2"),
        ])
        .await
        .unwrap();
    store
        .record_items(&[item("chroma", "a", "u1")])
        .await
        .unwrap();
    store
        .record_items(&[item("chroma", "a", "u2")])
        .await
        .unwrap();
    // One batch may write an id twice (a Qdrant batch upserts a point, then edits it): as if in
    // order, so the second write of another subject's live row changes nothing.
    store
        .record_items(&[
            item("chroma", "e", "u1"),
            item("chroma", "e", "u1"),
            item("chroma", "e", "u2"),
        ])
        .await
        .unwrap();
    let ids = ["a".to_owned(), "d".to_owned(), "zz".to_owned()];
    let owners = store.item_owners("chroma", "memories", &ids).await.unwrap();
    let owner = |s: &str| ("acme".to_owned(), s.to_owned());
    assert_eq!(
        owners,
        BTreeMap::from([("a".to_owned(), owner("u1")), ("d".to_owned(), owner("u2"))]),
        "a live row never changes owner"
    );
    let counts = store.inventory("acme", "u1").await.unwrap();
    assert_eq!(
        counts,
        BTreeMap::from([("chroma".to_owned(), 3), ("redis".to_owned(), 1)])
    );
    // Once deleted, the id is free: the next writer's row replaces it.
    store
        .mark_items_deleted("chroma", "memories", &["d".to_owned()], now())
        .await
        .unwrap();
    store
        .record_items(&[item("chroma", "d", "u1")])
        .await
        .unwrap();
    let owners = store.item_owners("chroma", "memories", &ids).await.unwrap();
    assert_eq!(owners.get("d"), Some(&owner("u1")));
    assert!(store.inventory("acme", "u3").await.unwrap().is_empty());
}

/// A purge marks every item it deleted, often many thousands (marked a chunk at a time): each
/// live row once, nothing of another collection, and a second mark finds none live.
async fn marking_many_items_deleted_counts_each_live_row_once(store: &Arc<dyn Store>) {
    let ids: Vec<String> = (0..2500).map(|i| format!("m{i}")).collect();
    let rows: Vec<ItemRecord> = ids
        .iter()
        .map(|id| lineage_row("chroma", "memories", id, "u1"))
        .chain([lineage_row("chroma", "other", "m7", "u1")])
        .collect();
    store.record_items(&rows).await.unwrap();
    let mut asked = ids.clone();
    asked.push("never-written".into());
    let marked = store
        .mark_items_deleted("chroma", "memories", &asked, now())
        .await
        .unwrap();
    assert_eq!(marked, 2500);
    let again = store
        .mark_items_deleted("chroma", "memories", &ids, now())
        .await
        .unwrap();
    assert_eq!(again, 0, "a row already marked is not counted again");
    assert_eq!(
        store.inventory("acme", "u1").await.unwrap(),
        BTreeMap::from([("chroma".to_owned(), 1)]),
        "only the other collection's row is live"
    );
}

async fn generated_secrets_are_kept(store: &Arc<dyn Store>) {
    let first = store
        .generated_secret("jwt", b"first", now())
        .await
        .unwrap();
    let second = store
        .generated_secret("jwt", b"second", now())
        .await
        .unwrap();
    assert_eq!(
        (first.as_slice(), second.as_slice()),
        (&b"first"[..], &b"first"[..])
    );
}

/// Many writers append at once; the chain must come out whole, with no gap and no fork.
async fn audit_appends_form_one_chain_under_concurrency(store: &Arc<dyn Store>) {
    const WRITERS: usize = 8;
    const EACH: usize = 25;
    let tasks: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = Arc::clone(store);
            tokio::spawn(async move {
                // Writers of two tenants and of none: three chains in one.
                let tenant = [Some("acme"), Some("globex"), None][w % 3].map(str::to_owned);
                for i in 0..EACH {
                    let entry = AuditEntry {
                        tenant: tenant.clone(),
                        ..audit("test.append", Some(&format!("{w}-{i}")))
                    };
                    store.append_audit(entry).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let report = verify_audit(store.as_ref(), crate::testing::AUDIT_KEY, None, None, None)
        .await
        .unwrap();
    let ChainReport::Intact { head, .. } = report else {
        panic!("chain broken: {report:?}")
    };
    assert_eq!(head.seq, (WRITERS * EACH) as i64);
    let rows = store.audit_page(0, 1000, None).await.unwrap();
    let refs: BTreeSet<_> = rows
        .iter()
        .filter_map(|r| r.entry.target_ref.clone())
        .collect();
    assert_eq!(
        refs.len(),
        WRITERS * EACH,
        "every append landed exactly once"
    );
    for (tenant, writers) in [("acme", 3), ("globex", 3)] {
        let report = verify_audit(
            store.as_ref(),
            crate::testing::AUDIT_KEY,
            None,
            Some(tenant),
            None,
        )
        .await
        .unwrap();
        let ChainReport::Intact { head, .. } = report else {
            panic!("{tenant}'s chain broken: {report:?}")
        };
        assert_eq!(head.seq, (writers * EACH) as i64, "{tenant}");
        let own = store.audit_page(0, 1000, Some(tenant)).await.unwrap();
        assert_eq!(own.len(), writers * EACH);
        assert!(
            own.iter()
                .all(|r| r.entry.tenant.as_deref() == Some(tenant))
        );
    }
}

/// A tenant's chain notices its rows being moved, removed or rewritten, without reading any
/// other tenant's rows.
#[tokio::test]
async fn a_tenants_chain_notices_tampering_with_its_rows() {
    let tampers = [
        (
            "UPDATE audit_events SET tenant = 'initech' WHERE seq = 3",
            2,
        ),
        ("DELETE FROM audit_events WHERE seq = 5", 3),
        ("UPDATE audit_events SET actor = 'mallory' WHERE seq = 1", 1),
    ];
    for (tamper, first_bad) in tampers {
        for url in [fresh_sqlite_url(), fresh_postgres_database().await.unwrap()] {
            let store = migrated(&url).await;
            // acme's events at seq 1, 3, 5 (its chain's 1, 2, 3); globex's at 2 and 4.
            for i in 0..5 {
                let tenant = if i % 2 == 0 { "acme" } else { "globex" };
                let entry = AuditEntry {
                    tenant: Some(tenant.into()),
                    ..audit("test.append", Some(&i.to_string()))
                };
                store.append_audit(entry).await.unwrap();
            }
            crate::testing::execute_raw(&url, tamper).await.unwrap();
            match verify_audit(
                store.as_ref(),
                crate::testing::AUDIT_KEY,
                None,
                Some("acme"),
                None,
            )
            .await
            .unwrap()
            {
                ChainReport::Broken { first_bad_seq, .. } => {
                    assert_eq!(first_bad_seq, first_bad, "{tamper} on {url}")
                }
                intact => panic!("{tamper} on {url} went unnoticed: {intact:?}"),
            }
            assert!(
                matches!(
                    verify_audit(
                        store.as_ref(),
                        crate::testing::AUDIT_KEY,
                        None,
                        Some("globex"),
                        None
                    )
                    .await
                    .unwrap(),
                    ChainReport::Intact { .. }
                ),
                "globex's chain is not acme's business: {tamper}"
            );
        }
    }
}

/// Editing, deleting, reordering or cutting off one row is reported with that row's number.
#[tokio::test]
async fn tampering_is_reported_with_the_row_number() {
    let tampers = [
        ("UPDATE audit_events SET actor = 'mallory' WHERE seq = 3", 3),
        ("DELETE FROM audit_events WHERE seq = 2", 2),
        (
            "UPDATE audit_events SET seq = -2 WHERE seq = 2; UPDATE audit_events SET seq = 2 WHERE seq = 4; UPDATE audit_events SET seq = 4 WHERE seq = -2",
            2,
        ),
        ("DELETE FROM audit_events WHERE seq = 5", 5),
    ];
    for (tamper, first_bad) in tampers {
        for url in [fresh_sqlite_url(), fresh_postgres_database().await.unwrap()] {
            let store = migrated(&url).await;
            for i in 0..5 {
                store
                    .append_audit(audit("test.append", Some(&i.to_string())))
                    .await
                    .unwrap();
            }
            assert!(matches!(
                verify_audit(store.as_ref(), crate::testing::AUDIT_KEY, None, None, None)
                    .await
                    .unwrap(),
                ChainReport::Intact { .. }
            ));
            crate::testing::execute_raw(&url, tamper).await.unwrap();
            match verify_audit(store.as_ref(), crate::testing::AUDIT_KEY, None, None, None)
                .await
                .unwrap()
            {
                ChainReport::Broken { first_bad_seq, .. } => {
                    assert_eq!(first_bad_seq, first_bad, "{tamper} on {url}")
                }
                intact => panic!("{tamper} on {url} went unnoticed: {intact:?}"),
            }
        }
    }
}

async fn an_approved_erasure_flips_its_keys_and_tells_every_cache(store: &Arc<dyn Store>) {
    use lethe_policy::ErasureState;
    store
        .create_grant(&grant("g1", "u1"), audit("consent.grant", Some("g1")))
        .await
        .unwrap();
    let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&heard);
    store.feed().on_event(move |e| {
        if let FeedEvent::Changed(c) = e {
            log.lock().unwrap().push(c.subject.clone());
        }
    });
    let now = now();
    let record = ErasureRecord {
        aliases: vec!["u1-old".into()],
        ..crate::testing::erasure_request("er1", "u1", now)
    };
    store
        .create_erasure(
            &record,
            &["chroma:chroma".into()],
            audit("erasure.request", Some("er1")),
        )
        .await
        .unwrap();
    assert_eq!(store.purge_jobs("er1").await.unwrap()[0].state, "waiting");
    let flipped = store
        .approve_erasure("er1", "dpo", 1, now, audit("erasure.approve", Some("er1")))
        .await
        .unwrap();
    assert_eq!(
        (flipped.state, flipped.suppressed_at),
        (ErasureState::Suppressed, Some(now))
    );
    assert_eq!(
        store.erasure("er1").await.unwrap(),
        flipped,
        "what was answered is what was stored"
    );
    for key in ["u1", "u1-old"] {
        let state = store.subject("acme", key).await.unwrap().unwrap();
        assert_eq!(
            (state.status, state.epoch),
            (SubjectStatus::Suppressed, 1),
            "{key}"
        );
    }
    let heard = heard.lock().unwrap().clone();
    for key in ["u1", "u1-old"] {
        // On PostgreSQL the replica's own NOTIFY echoes back later too; what counts is that the
        // local event was delivered before approve returned.
        assert!(
            heard.contains(&Some(key.to_owned())),
            "caches heard of {key} before approve returned: {heard:?}"
        );
    }
    assert_eq!(store.purge_jobs("er1").await.unwrap()[0].state, "pending");
    assert!(matches!(
        store
            .approve_erasure(
                "er1",
                "other",
                1,
                now,
                audit("erasure.approve", Some("er1"))
            )
            .await,
        Err(StoreError::Approval(
            lethe_policy::ApprovalError::NotAwaitingApproval
        ))
    ));
}

async fn expired_and_revoked_items_are_found_for_the_sweeper_unless_held(store: &Arc<dyn Store>) {
    let t0 = now();
    let item = |id: &str, subject: &str, purpose: &str, expires: chrono::DateTime<chrono::Utc>| {
        ItemRecord {
            purpose: purpose.into(),
            created_at: t0,
            expires_at: expires,
            ..lineage_row("chroma", "c", id, subject)
        }
    };
    let past = t0 - TimeDelta::seconds(5);
    let future = t0 + TimeDelta::days(5);
    store
        .record_items(&[
            item("old", "u1", "personalization", past),
            item("fresh", "u1", "personalization", future),
            item("held", "u2", "personalization", past),
            item("other-purpose", "u1", "training", future),
        ])
        .await
        .unwrap();
    let hold = HoldRecord {
        hold: LegalHold {
            id: "h".into(),
            tenant: "acme".into(),
            subject: Some("u2".into()),
            reason: "case".into(),
            placed_at: t0,
            released_at: None,
        },
        placed_by: "counsel".into(),
        released_by: None,
    };
    store
        .place_hold(&hold, audit("hold.place", Some("h")))
        .await
        .unwrap();
    let ids = |found: Vec<ExpiredItem>| {
        found
            .into_iter()
            .map(|item| {
                assert_eq!(item.tenant, "acme", "lineage says whose it is");
                item.item_id
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(store.expired_items(t0, 100).await.unwrap()),
        ["old"],
        "the held subject's expired item stays"
    );

    // Two grants cover (personalization, preference): revoking one keeps the items; the last expires them.
    store
        .create_grant(&grant("g1", "u1"), audit("consent.grant", None))
        .await
        .unwrap();
    store
        .create_grant(&grant("g2", "u1"), audit("consent.grant", None))
        .await
        .unwrap();
    store
        .revoke_grant("g1", now(), audit("consent.revoke", None))
        .await
        .unwrap();
    assert_eq!(ids(store.expired_items(now(), 100).await.unwrap()), ["old"]);
    store
        .revoke_grant("g2", now(), audit("consent.revoke", None))
        .await
        .unwrap();
    let mut found = ids(store.expired_items(now(), 100).await.unwrap());
    found.sort();
    assert_eq!(
        found,
        ["fresh", "old"],
        "items of the revoked purpose expire; other purposes keep theirs"
    );
}

async fn erasure_requests_are_listed_a_page_at_a_time_and_summed_up(store: &Arc<dyn Store>) {
    use lethe_policy::ErasureState;
    let at = now();
    for (id, days_ago, tenant) in [
        ("er-a", 40, "acme"),
        ("er-b", 3, "acme"),
        ("er-c", 1, "acme"),
        ("er-g", 1, "globex"),
    ] {
        let record = ErasureRecord {
            tenant: tenant.into(),
            ..crate::testing::erasure_request(
                id,
                &format!("{id}-subject"),
                at - TimeDelta::days(days_ago),
            )
        };
        store
            .create_erasure(
                &record,
                &["chroma:chroma".into()],
                audit("erasure.request", Some(id)),
            )
            .await
            .unwrap();
    }
    let ids = |records: Vec<ErasureRecord>| records.into_iter().map(|r| r.id).collect::<Vec<_>>();
    let all = ErasureFilter::default();
    assert_eq!(
        ids(store.erasures("acme", &all, 0, 10).await.unwrap()),
        ["er-c", "er-b", "er-a"]
    );
    assert_eq!(
        ids(store.erasures("acme", &all, 1, 1).await.unwrap()),
        ["er-b"],
        "the second page of one"
    );
    let completed = ErasureFilter {
        state: Some(ErasureState::Completed),
        ..ErasureFilter::default()
    };
    assert!(
        store
            .erasures("acme", &completed, 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let month_ago = at - TimeDelta::days(30);
    let past_due = DueWindow {
        from: None,
        to: Some(at),
    };
    let overdue = ErasureFilter {
        open: true,
        due: Some(past_due),
        ..ErasureFilter::default()
    };
    assert_eq!(
        ids(store.erasures("acme", &overdue, 0, 10).await.unwrap()),
        ["er-a"]
    );
    let stats = store.erasure_stats("acme", at, month_ago).await.unwrap();
    assert_eq!(
        (stats.open, stats.overdue),
        (BTreeMap::from([("requested".to_owned(), 3)]), 1)
    );
    assert!(
        stats.online_ms.is_empty() && stats.completion_s.is_empty(),
        "none flipped yet"
    );
    // Extended by two months, a request falls due two months later; once, and never after its
    // deadline passed: the overdue one stays overdue.
    let extension = |months| DeadlineExtension {
        months,
        reason: "complex: five stores, two processors".into(),
        by: "dpo".into(),
        at,
    };
    let extend = |id: &'static str, months| {
        let extension = extension(months);
        async move {
            store
                .extend_erasure(id, &extension, audit("erasure.extend_deadline", Some(id)))
                .await
        }
    };
    let before = store.erasure("er-b").await.unwrap().deadline;
    let extended = extend("er-b", 2).await.unwrap();
    assert_eq!(
        (extended.extension.clone(), extended.deadline),
        (Some(extension(2)), before + Months::new(2))
    );
    assert_eq!(store.erasure("er-b").await.unwrap(), extended);
    for (id, months, why) in [
        ("er-b", 1, "extended already"),
        ("er-a", 1, "past its deadline"),
        ("er-c", 3, "beyond two months"),
        ("er-c", 0, "by nothing"),
    ] {
        assert!(
            matches!(extend(id, months).await, Err(StoreError::NotExtendable)),
            "{why}"
        );
    }
    assert!(extend("er-nope", 1).await.is_err());
    let in_three_months = ErasureFilter {
        due: Some(DueWindow {
            from: Some(at + TimeDelta::days(80)),
            to: Some(at + TimeDelta::days(100)),
        }),
        ..ErasureFilter::default()
    };
    assert_eq!(
        ids(store
            .erasures("acme", &in_three_months, 0, 10)
            .await
            .unwrap()),
        ["er-b"]
    );
    assert_eq!(
        store
            .erasure_stats("acme", at, month_ago)
            .await
            .unwrap()
            .overdue,
        1
    );
    // At the end of a month the deadline is the month's last day, and the filters agree with it.
    let utc = |text: &str| text.parse::<DateTime<Utc>>().unwrap();
    for (id, received) in [
        ("er-jan31", "2025-01-31T10:00:00Z"),
        ("er-feb28", "2025-02-28T10:00:00Z"),
    ] {
        let record = ErasureRecord {
            tenant: "initech".into(),
            ..crate::testing::erasure_request(id, id, utc(received))
        };
        store
            .create_erasure(&record, &[], audit("erasure.request", Some(id)))
            .await
            .unwrap();
    }
    let overdue_at = |when: &str| {
        let due = ErasureFilter {
            open: true,
            due: Some(DueWindow {
                from: None,
                to: Some(utc(when)),
            }),
            ..ErasureFilter::default()
        };
        async move { ids(store.erasures("initech", &due, 0, 10).await.unwrap()) }
    };
    assert!(overdue_at("2025-02-28T09:00:00Z").await.is_empty());
    assert_eq!(overdue_at("2025-02-28T11:00:00Z").await, ["er-jan31"]);
    assert_eq!(
        overdue_at("2025-03-29T09:00:00Z").await,
        ["er-feb28", "er-jan31"],
        "due on 28 March, overdue the next day"
    );
    // The timeline of a request: the tenant's events naming it (the test audits them all as
    // acme's; another tenant's would not be found).
    let events = store
        .audit_of("acme", &["er-a".to_owned()], 10)
        .await
        .unwrap();
    let named: Vec<_> = events
        .iter()
        .map(|e| (e.entry.action.as_str(), e.entry.target_ref.as_deref()))
        .collect();
    assert_eq!(
        named,
        [("erasure.request", Some("er-a"))],
        "its refused extension wrote nothing"
    );
    assert!(
        store
            .audit_of("globex", &["er-a".to_owned()], 10)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn a_refused_request_keeps_its_reason_and_cancels_its_jobs(store: &Arc<dyn Store>) {
    let at = now();
    let record = crate::testing::erasure_request("er1", "u1", at);
    store
        .create_erasure(
            &record,
            &["chroma:chroma".into()],
            audit("erasure.request", Some("er1")),
        )
        .await
        .unwrap();
    let rejection = Rejection {
        reason: "identity not confirmed".into(),
        by: "dpo".into(),
        at,
    };
    let refused = store
        .reject_erasure("er1", &rejection, audit("erasure.reject", Some("er1")))
        .await
        .unwrap();
    assert_eq!(
        (refused.state, refused.rejection.as_ref()),
        (lethe_policy::ErasureState::Rejected, Some(&rejection))
    );
    assert_eq!(store.erasure("er1").await.unwrap(), refused, "as stored");
    assert_eq!(store.purge_jobs("er1").await.unwrap()[0].state, "cancelled");
    assert!(matches!(
        store
            .reject_erasure("er1", &rejection, audit("erasure.reject", Some("er1")))
            .await,
        Err(StoreError::Transition(_))
    ));
}

/// A state store as migration 5 left it, with a request filed then; the given migration list's
/// sixth migration has not run.
async fn before_deadlines_were_kept(
    url: &str,
    migrations: &[migrate::Migration],
) -> Arc<dyn Store> {
    let store = connect(url).await.unwrap();
    let mut sql = format!("{};\n", migrate::BOOKKEEPING);
    for m in &migrations[..5] {
        sql.push_str(m.sql);
        sql.push_str(&format!(
            ";\nINSERT INTO lethe_migrations (version, name, applied_at) VALUES ({}, '{}', 'then');\n",
            m.version, m.name
        ));
    }
    sql.push_str("INSERT INTO erasure_requests (id, tenant, subject, aliases, ticket, reason, state, requested_by, requested_at, approvals, updated_at) VALUES ('er_old', 'acme', 'u1', '[]', 'DSR-1', 'art. 17', 'requested', 'dpo', '2025-01-31T10:00:00+00:00', '[]', '2025-01-31T10:00:00+00:00')");
    crate::testing::execute_raw(url, &sql).await.unwrap();
    store
}

/// Requests filed before deadlines were kept get the default month, to the month's last day.
async fn the_deadline_of_an_earlier_request_is_its_default_month(store: Arc<dyn Store>) {
    assert_eq!(store.migrate().await.unwrap(), [6, 7, 8, 9, 10]);
    let old = store.erasure("er_old").await.unwrap();
    assert_eq!(
        old.deadline,
        "2025-02-28T10:00:00Z".parse::<DateTime<Utc>>().unwrap()
    );
    assert_eq!(old.extension, None);
}

#[tokio::test]
async fn sqlite_requests_filed_before_deadlines_were_kept_get_the_default_month() {
    let url = crate::testing::fresh_sqlite_url();
    let store = before_deadlines_were_kept(&url, migrate::SQLITE).await;
    the_deadline_of_an_earlier_request_is_its_default_month(store).await;
}

#[tokio::test]
async fn postgres_requests_filed_before_deadlines_were_kept_get_the_default_month() {
    let url = crate::testing::fresh_postgres_database().await.unwrap();
    let store = before_deadlines_were_kept(&url, migrate::POSTGRES).await;
    the_deadline_of_an_earlier_request_is_its_default_month(store).await;
}

/// A chain written before links were keyed (chain version 1, plain SHA-256 links, as an earlier
/// Lethe wrote them): events of two tenants and of none. Written row by row, as no Lethe of now
/// appends to such a chain.
async fn written_before_links_were_keyed(url: &str) -> Arc<dyn Store> {
    use lethe_policy::audit::{Links, seal};
    let store = migrated(url).await;
    let mut head = ChainHead::default();
    let mut tenant_heads = std::collections::BTreeMap::<String, ChainHead>::new();
    let mut sql = String::from("UPDATE audit_chain SET chain_version = 1;\n");
    let text = |v: Option<&str>| v.map_or("NULL".to_owned(), |v| format!("'{v}'"));
    for (i, tenant) in [Some("acme"), Some("globex"), None, Some("acme")]
        .into_iter()
        .enumerate()
    {
        let entry = AuditEntry {
            tenant: tenant.map(str::to_owned),
            ..audit("consent.grant", Some(&format!("g{i}")))
        };
        let tenant_head = tenant
            .and_then(|t| tenant_heads.get(t))
            .cloned()
            .unwrap_or_default();
        let r = seal(Links::Unkeyed, &head, &tenant_head, entry);
        let link = r.tenant_chain.clone();
        sql.push_str(&format!(
            "INSERT INTO audit_events (seq, at, tenant, actor, action, request_id, subject_ref, target, target_ref, result, attempt, prev_hash, hash, tenant_seq, tenant_prev_hash, tenant_hash) VALUES ({}, '{}', {}, '{}', '{}', '{}', {}, '{}', {}, '{}', {}, '{}', '{}', {}, {}, {});\n",
            r.seq, r.entry.at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true), text(tenant), r.entry.actor, r.entry.action,
            r.entry.request_id, text(r.entry.subject_ref.as_deref()), r.entry.target, text(r.entry.target_ref.as_deref()),
            r.entry.result, r.entry.attempt, r.prev_hash, r.hash,
            link.as_ref().map_or("NULL".to_owned(), |l| l.seq.to_string()),
            text(link.as_ref().map(|l| l.prev_hash.as_str())),
            text(link.as_ref().map(|l| l.hash.as_str())),
        ));
        if let (Some(t), Some(link)) = (tenant, link) {
            tenant_heads.insert(
                t.to_owned(),
                ChainHead {
                    seq: link.seq,
                    hash: link.hash,
                },
            );
        }
        head = ChainHead {
            seq: r.seq,
            hash: r.hash,
        };
    }
    for (t, h) in &tenant_heads {
        sql.push_str(&format!(
            "INSERT INTO audit_tenant_heads (tenant, seq, hash) VALUES ('{t}', {}, '{}');\n",
            h.seq, h.hash
        ));
    }
    sql.push_str(&format!(
        "UPDATE audit_chain SET seq = {}, hash = '{}' WHERE id = 1;",
        head.seq, head.hash
    ));
    crate::testing::execute_raw(url, &sql).await.unwrap();
    assert!(!store.audit_keying().await.unwrap().0);
    store
}

/// Verified as written, then sealed again with the key: the same events, other links, a new
/// event naming the old head; whole and tenant chains verify with the key, not without it.
async fn an_unkeyed_chain_is_verified_then_sealed_again_with_the_key(url: &str) {
    let store = written_before_links_were_keyed(url).await;
    let before = store.audit_page(0, 100, None).await.unwrap();
    let old = store
        .key_audit_chain(now())
        .await
        .unwrap()
        .expect("keyed now");
    assert_eq!((old.seq, old.hash.as_str()), (4, before[3].hash.as_str()));
    assert!(store.audit_keying().await.unwrap().0);
    assert_eq!(store.key_audit_chain(now()).await.unwrap(), None, "once");
    let after = store.audit_page(0, 100, None).await.unwrap();
    assert_eq!(after.len(), 5);
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a.entry, b.entry, "the events are the same");
        assert_ne!(a.hash, b.hash, "their links are keyed");
    }
    let keyed = &after[4].entry;
    assert_eq!(
        (keyed.action.as_str(), keyed.target_ref.clone()),
        ("audit.chain_keyed", Some(format!("4:{}", old.hash)))
    );
    for tenant in [None, Some("acme"), Some("globex")] {
        let report = verify_audit(
            store.as_ref(),
            crate::testing::AUDIT_KEY,
            None,
            tenant,
            None,
        )
        .await
        .unwrap();
        assert!(
            matches!(report, ChainReport::Intact { .. }),
            "{tenant:?}: {report:?}"
        );
        let other = verify_audit(store.as_ref(), b"another key", None, tenant, None)
            .await
            .unwrap();
        assert!(matches!(other, ChainReport::Broken { .. }), "{tenant:?}");
    }
    store
        .append_audit(audit("consent.grant", Some("g9")))
        .await
        .unwrap();
    let report = verify_audit(store.as_ref(), crate::testing::AUDIT_KEY, None, None, None)
        .await
        .unwrap();
    assert!(matches!(
        report,
        ChainReport::Intact {
            head: ChainHead { seq: 6, .. },
            ..
        }
    ));
    // A head certified before the chain was keyed still verifies: the row keeps its old link.
    let verify_with = |saved: ChainHead| {
        let store = Arc::clone(&store);
        async move {
            verify_audit(
                store.as_ref(),
                crate::testing::AUDIT_KEY,
                None,
                None,
                Some(&saved),
            )
            .await
            .unwrap()
        }
    };
    let certified = ChainHead {
        seq: 3,
        hash: before[2].hash.clone(),
    };
    assert!(matches!(
        verify_with(certified).await,
        ChainReport::Intact { .. }
    ));
    let other = ChainHead {
        seq: 3,
        hash: "0".repeat(64),
    };
    assert!(matches!(
        verify_with(other).await,
        ChainReport::Broken {
            problem: ChainBreak::Rewritten { seq: 3 },
            ..
        }
    ));
    // Another key neither appends nor verifies.
    store.use_subject_key(b"ignored: the first key stays");
    let (_, check) = store.audit_keying().await.unwrap();
    assert_eq!(
        check,
        Some(lethe_policy::audit::key_check(crate::testing::AUDIT_KEY))
    );
    assert!(matches!(
        verify_audit(store.as_ref(), b"another key", None, None, None)
            .await
            .unwrap(),
        ChainReport::Broken {
            problem: ChainBreak::WrongKey,
            ..
        }
    ));
    // Marked unkeyed again (by whoever can write the store): it is not sealed again on its own,
    // and nothing verifies or appends.
    crate::testing::execute_raw(url, "UPDATE audit_chain SET chain_version = 1")
        .await
        .unwrap();
    assert!(matches!(
        verify_audit(store.as_ref(), crate::testing::AUDIT_KEY, None, None, None)
            .await
            .unwrap(),
        ChainReport::Broken {
            problem: ChainBreak::Unkeyed,
            ..
        }
    ));
    assert!(matches!(
        store
            .append_audit(audit("consent.grant", Some("g10")))
            .await,
        Err(StoreError::AuditUnkeyed)
    ));
}

/// A signed head kept in the store that does not verify (forged by whoever can write the store)
/// is reported as such, not taken for a cut.
async fn a_forged_kept_head_is_named(store: &Arc<dyn Store>) {
    store
        .append_audit(audit("consent.grant", Some("g1")))
        .await
        .unwrap();
    let signer = crate::erasure::certificate::Signer::from_seed(&[3; 32]).unwrap();
    let head = store.audit_head(None).await.unwrap();
    store
        .keep_signed_head(&signer.sign_head(None, &head, now()))
        .await
        .unwrap();
    let genuine = |h: &SignedHead| {
        crate::erasure::certificate::verify_head(h, &signer.public_key_hex()).is_ok()
    };
    let report = verify_audit(
        store.as_ref(),
        crate::testing::AUDIT_KEY,
        Some(&genuine),
        None,
        None,
    )
    .await
    .unwrap();
    assert!(matches!(report, ChainReport::Intact { .. }), "{report:?}");
    let mut forged = signer.sign_head(
        None,
        &ChainHead {
            seq: 1_000_000,
            hash: "f".repeat(64),
        },
        now(),
    );
    forged.signature.value = "00".repeat(64);
    store.keep_signed_head(&forged).await.unwrap();
    let report = verify_audit(
        store.as_ref(),
        crate::testing::AUDIT_KEY,
        Some(&genuine),
        None,
        None,
    )
    .await
    .unwrap();
    assert!(
        matches!(
            report,
            ChainReport::Broken {
                problem: ChainBreak::ForgedHead { seq: 1_000_000 },
                ..
            }
        ),
        "{report:?}"
    );
    // A head signed and kept is read back byte for byte: its signature still verifies.
    assert!(
        store
            .signed_heads(None)
            .await
            .unwrap()
            .iter()
            .filter(|h| h.seq == head.seq)
            .all(genuine)
    );
}

/// A broken chain is not sealed over: it stays as written, and its break stays visible.
async fn a_broken_unkeyed_chain_is_left_as_it_was_written(url: &str) {
    let store = written_before_links_were_keyed(url).await;
    crate::testing::execute_raw(
        url,
        "UPDATE audit_events SET actor = 'mallory' WHERE seq = 2",
    )
    .await
    .unwrap();
    match store.key_audit_chain(now()).await {
        Err(StoreError::Corrupt(why)) => assert!(why.contains("broken at row 2"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(!store.audit_keying().await.unwrap().0);
    let report = verify_audit(store.as_ref(), crate::testing::AUDIT_KEY, None, None, None)
        .await
        .unwrap();
    assert!(
        matches!(
            report,
            ChainReport::Broken {
                problem: ChainBreak::Unkeyed,
                ..
            }
        ),
        "{report:?}"
    );
    // Nothing more is written to it: no change, since each is written with its event.
    assert!(matches!(
        store.append_audit(audit("consent.grant", Some("g9"))).await,
        Err(StoreError::AuditUnkeyed)
    ));
}

#[tokio::test]
async fn sqlite_chains_written_before_links_were_keyed() {
    an_unkeyed_chain_is_verified_then_sealed_again_with_the_key(&crate::testing::fresh_sqlite_url()).await;
    a_broken_unkeyed_chain_is_left_as_it_was_written(&crate::testing::fresh_sqlite_url()).await;
}

#[tokio::test]
async fn postgres_chains_written_before_links_were_keyed() {
    let fresh = || async { crate::testing::fresh_postgres_database().await.unwrap() };
    an_unkeyed_chain_is_verified_then_sealed_again_with_the_key(&fresh().await).await;
    a_broken_unkeyed_chain_is_left_as_it_was_written(&fresh().await).await;
}

#[test]
fn an_items_reference_cannot_be_recomputed_without_the_audit_key() {
    let item = ItemKey::new(
        "langgraph",
        "store",
        "[\"acme\",\"alice@example.com\",\"facts\"]",
    );
    let reference = item.reference(b"audit-key");
    assert!(
        reference.starts_with("dv_") && reference.len() == 27,
        "{reference}"
    );
    assert_eq!(reference, item.reference(b"audit-key"), "stable");
    assert_ne!(reference, item.reference(b"a guess of the key"));
    assert_ne!(
        reference,
        ItemKey::new(
            "langgraph",
            "store",
            "[\"acme\",\"bob@example.com\",\"facts\"]"
        )
        .reference(b"audit-key")
    );
}

/// With governed databases, the flip commits in the state store at once (the subject is
/// suppressed for every replica) but the request says `propagating`, naming the databases the
/// flip does not hold in yet; its purge cannot start before it holds in the last one, and then
/// its online latency runs to that moment.
async fn a_flip_is_suppressed_only_once_it_holds_in_every_governed_database(
    store: &Arc<dyn Store>,
) {
    use lethe_policy::ErasureState;
    store.use_governed(vec!["app".into(), "langgraph".into()]);
    store
        .create_grant(&grant("g1", "u1"), audit("consent.grant", Some("g1")))
        .await
        .unwrap();
    let at = now();
    let record = ErasureRecord {
        aliases: vec!["u1-old".into()],
        ..crate::testing::erasure_request("er1", "u1", at)
    };
    store
        .create_erasure(
            &record,
            &["postgres:app".into()],
            audit("erasure.request", Some("er1")),
        )
        .await
        .unwrap();
    let flipped = store
        .approve_erasure("er1", "dpo", 1, at, audit("erasure.approve", Some("er1")))
        .await
        .unwrap();
    assert_eq!(
        (flipped.state, flipped.suppressed_at),
        (ErasureState::Propagating, None)
    );
    assert_eq!(
        store.subject("acme", "u1").await.unwrap().unwrap().status,
        SubjectStatus::Suppressed,
        "the state store's own flip is not held back"
    );
    let pending = |db: &'static str| async move { store.pending_flips(db).await.unwrap() };
    for db in ["app", "langgraph"] {
        let flips = pending(db).await;
        assert_eq!(flips.len(), 1, "{db}");
        assert_eq!(flips[0].request_id, "er1");
        assert_eq!(
            flips[0].keys,
            [("u1".to_owned(), Some(1)), ("u1-old".to_owned(), Some(1))]
        );
    }
    let later = |ms| at + TimeDelta::milliseconds(ms);
    assert!(
        store
            .claim_purge_job("w", later(10_000), later(10_000), later(70_000))
            .await
            .unwrap()
            .is_none(),
        "no purge before the flip holds everywhere"
    );

    let first = store
        .flip_applied("er1", "app", later(40), audit("", None))
        .await
        .unwrap();
    assert_eq!(
        (first.state, first.suppressed_at),
        (ErasureState::Propagating, None)
    );
    assert!(pending("app").await.is_empty());
    assert_eq!(pending("langgraph").await.len(), 1);
    let again = store
        .flip_applied("er1", "app", later(50), audit("", None))
        .await
        .unwrap();
    assert_eq!(again, first, "recorded once");

    let held = store
        .flip_applied("er1", "langgraph", later(90), audit("", None))
        .await
        .unwrap();
    assert_eq!(
        (held.state, held.suppressed_at),
        (ErasureState::Suppressed, Some(later(90)))
    );
    assert_eq!(store.erasure("er1").await.unwrap(), held);
    let flips = store.governed_flips("er1").await.unwrap();
    assert_eq!(
        flips,
        [
            GovernedFlip {
                database: "app".into(),
                applied_at: Some(later(40))
            },
            GovernedFlip {
                database: "langgraph".into(),
                applied_at: Some(later(90))
            },
        ]
    );
    let actions: Vec<String> = store
        .audit_page(0, 100, None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| {
            format!(
                "{} {}",
                r.entry.action,
                r.entry.target_ref.unwrap_or_default()
            )
        })
        .collect();
    assert!(
        actions.ends_with(&[
            "erasure.flip er1".to_owned(),
            "governed.flip_applied app".to_owned(),
            "governed.flip_applied langgraph".to_owned(),
            "erasure.suppress er1".to_owned(),
        ]),
        "{actions:?}"
    );
    let job = store
        .claim_purge_job("w", later(10_000), later(10_000), later(70_000))
        .await
        .unwrap();
    assert!(
        job.is_some(),
        "the purge starts once the flip holds everywhere"
    );
    assert_eq!(
        store.erasure("er1").await.unwrap().state,
        ErasureState::Propagating
    );
}
