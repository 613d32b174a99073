//! Lineage in the state store, on both backends: inventory, deleted items, what the sweeper finds,
//! item references.

use super::*;

on_both_backends!(
    inventory_counts_live_lineage_per_store,
    marking_many_items_deleted_counts_each_live_row_once,
    expired_and_revoked_items_are_found_for_the_sweeper_unless_held,
    writes_decided_before_a_withdrawal_expire_with_it_however_late_they_are_recorded,
);

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

/// The lineage writer records a batch after the writes it holds were answered: a withdrawal in
/// between must expire them as it expired those recorded before it, whichever commits first.
async fn writes_decided_before_a_withdrawal_expire_with_it_however_late_they_are_recorded(
    store: &Arc<dyn Store>,
) {
    let expired = |store: Arc<dyn Store>| async move {
        let mut ids: Vec<String> = (store.expired_items(now(), 1000).await.unwrap())
            .into_iter()
            .map(|i| i.item_id)
            .collect();
        ids.sort();
        ids
    };
    store
        .create_grant(&grant("g1", "u1"), audit("consent.grant", None))
        .await
        .unwrap();
    let decided = now();
    store
        .revoke_grant("g1", now(), audit("consent.revoke", None))
        .await
        .unwrap();
    let after = now() + TimeDelta::milliseconds(1);
    store
        .record_items(&[
            ItemRecord {
                created_at: decided,
                ..lineage_row("chroma", "c", "decided-before", "u1")
            },
            ItemRecord {
                created_at: after,
                ..lineage_row("chroma", "c", "decided-after", "u1")
            },
            ItemRecord {
                purpose: "training".into(),
                created_at: decided,
                ..lineage_row("chroma", "c", "other-purpose", "u1")
            },
        ])
        .await
        .unwrap();
    assert_eq!(
        expired(Arc::clone(store)).await,
        ["decided-before"],
        "decided without that consent, or for another purpose, a write keeps its own deadline"
    );

    // Racing: each subject's record and withdrawal sent together, in either order.
    let racing: Vec<String> = (0..40).map(|i| format!("r{i:02}")).collect();
    for subject in &racing {
        store
            .create_grant(
                &grant(&format!("g-{subject}"), subject),
                audit("consent.grant", None),
            )
            .await
            .unwrap();
    }
    let decided = now();
    let races = racing.iter().enumerate().map(|(i, subject)| {
        let store = Arc::clone(store);
        let row = ItemRecord {
            created_at: decided,
            ..lineage_row("chroma", "c", subject, subject)
        };
        tokio::spawn(async move {
            let record = store.record_items(std::slice::from_ref(&row));
            let grant = format!("g-{}", row.subject);
            let revoke = store.revoke_grant(&grant, now(), audit("consent.revoke", None));
            let (recorded, revoked) = if i % 2 == 0 {
                tokio::join!(record, revoke)
            } else {
                let (revoked, recorded) = tokio::join!(revoke, record);
                (recorded, revoked)
            };
            recorded.unwrap();
            revoked.unwrap();
        })
    });
    for race in races.collect::<Vec<_>>() {
        race.await.unwrap();
    }
    let found = expired(Arc::clone(store)).await;
    let missed: Vec<&String> = racing.iter().filter(|r| !found.contains(r)).collect();
    assert!(
        missed.is_empty(),
        "recorded past their withdrawal: {missed:?}"
    );
}
