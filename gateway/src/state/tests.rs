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

mod audit;
mod consent;
mod derivatives;
mod erasure;
mod forgetting;
mod lineage;

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
