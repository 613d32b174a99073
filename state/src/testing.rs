//! Helpers for tests that need a real state store. PostgreSQL tests get a fresh database each,
//! created on the server `LETHE_TEST_POSTGRES` names (default: the local one, trust auth).

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::TimeDelta;
use lethe_policy::audit::{AuditEntry, subject_ref};
use lethe_policy::{Action, ConsentGrant, Layer, LegalHold};

use crate::{
    Derived, Edge, ErasureRecord, HoldRecord, ItemKey, ItemRecord, JobOutcome, ProcessorUse,
    Shared, Sharing, Store, now,
};

pub fn postgres_admin_url() -> String {
    std::env::var("LETHE_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A new, empty PostgreSQL database; returns its URL.
pub async fn fresh_postgres_database() -> Result<String, sqlx::Error> {
    use sqlx::Connection as _;
    let admin = postgres_admin_url();
    let name = format!("lethe_test_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(&admin).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await?;
    let base = admin
        .rsplit_once('/')
        .map_or(admin.as_str(), |(base, _)| base);
    Ok(format!("{base}/{name}"))
}

/// A new SQLite file in a fresh temporary folder; returns its URL.
pub fn fresh_sqlite_url() -> String {
    let dir = std::env::temp_dir().join(format!("lethe-test-{}", uuid::Uuid::new_v4().simple()));
    format!("sqlite://{}/state.db", dir.display())
}

/// The key of subject references in tests.
pub const AUDIT_KEY: &[u8] = b"audit-key";

/// Connects to `url`, applies the migrations and gives the store the test [`AUDIT_KEY`].
pub async fn migrated(url: &str) -> Arc<dyn Store> {
    let store = crate::connect(url)
        .await
        .expect("connect to the test state store");
    store.migrate().await.expect("migrate the test state store");
    store.use_subject_key(AUDIT_KEY);
    store
}

/// Runs statements on the database behind `url`, outside Lethe (to tamper with it in tests).
pub async fn execute_raw(url: &str, sql: &str) -> Result<u64, sqlx::Error> {
    use sqlx::Connection as _;
    let sql = sqlx::AssertSqlSafe(sql.to_owned());
    let affected = if url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(url).await?;
        sqlx::raw_sql(sql).execute(&mut conn).await?.rows_affected()
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await?;
        sqlx::raw_sql(sql).execute(&mut conn).await?.rows_affected()
    };
    Ok(affected)
}

/// An erasure request for `subject` of tenant `acme`, filed by `dpo` at `at`, not yet approved.
pub fn erasure_request(
    id: &str,
    subject: &str,
    at: chrono::DateTime<chrono::Utc>,
) -> crate::ErasureRecord {
    crate::ErasureRecord {
        id: id.into(),
        tenant: "acme".into(),
        subject: subject.into(),
        aliases: vec![],
        ticket: "DSR-7".into(),
        reason: "art. 17".into(),
        state: lethe_policy::ErasureState::Requested,
        requested_by: "dpo".into(),
        requested_at: at,
        deadline: crate::deadline(at, 1),
        approvals: vec![],
        suppressed_at: None,
        completed_at: None,
        updated_at: at,
        extension: None,
        rejection: None,
    }
}

/// A lineage row: `subject`'s item `id` of tenant `acme` in `store`'s collection `c1`, a day
/// from its deadline.
pub fn item(store: &str, id: &str, subject: &str) -> crate::ItemRecord {
    let now = crate::now();
    crate::ItemRecord {
        store: store.into(),
        collection: "c1".into(),
        item_id: id.into(),
        tenant: "acme".into(),
        subject: subject.into(),
        purpose: "p".into(),
        category: "c".into(),
        layer: lethe_policy::Layer::Raw,
        created_at: now,
        expires_at: now + chrono::TimeDelta::days(1),
        epoch: 0,
        source_ref: None,
        parents: vec![],
    }
}

/// The raw keys of the erased subject in the test below: distinct enough that no hash, id or
/// timestamp contains them by chance.
pub const ERASED_KEYS: [&str; 2] = ["subject-qx7", "subject-qx7-old"];

/// Files an erasure of `ERASED_KEYS` over a subject with a grant, a hold, lineage and a
/// provider, purges it and completes it; returns the completed record.
pub async fn erase_to_completion(store: &Arc<dyn Store>) -> ErasureRecord {
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
        ..erasure_request("er1", key, at)
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

/// An audit event of tenant `acme` by `dpo@test`.
pub fn audit(action: &str, target_ref: Option<&str>) -> AuditEntry {
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
pub fn lineage_row(store: &str, collection: &str, id: &str, subject: &str) -> ItemRecord {
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

/// A grant of `store` and `retrieve` for personalization, 30 days long, of tenant `acme`.
pub fn grant(id: &str, subject: &str) -> ConsentGrant {
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
