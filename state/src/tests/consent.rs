//! Consent grants, retention rules, legal holds, migrations and generated secrets, on both
//! backends.

use super::*;

on_both_backends!(
    migrations_apply_once,
    grants_are_created_listed_and_revoked_once,
    retention_rules_are_versioned,
    holds_are_placed_and_released_once,
    generated_secrets_are_kept,
);

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
