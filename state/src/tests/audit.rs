//! The audit chain, on both backends: one chain under concurrency, tampering found, keying a chain
//! written before links were keyed, forged heads.

use super::*;

on_both_backends!(
    audit_appends_form_one_chain_under_concurrency,
    a_forged_kept_head_is_named,
);

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
    // Signing is a layer above the store (the certificate's signer): here a head is genuine
    // when its signature says so, which is all the store's verification asks of the predicate.
    let signed = |head: &ChainHead, value: &str| SignedHead {
        tenant: None,
        seq: head.seq,
        hash: head.hash.clone(),
        signed_at: now(),
        signature: HeadSignature::ed25519("k".repeat(64), value.to_owned()),
    };
    let head = store.audit_head(None).await.unwrap();
    store
        .keep_signed_head(&signed(&head, "genuine"))
        .await
        .unwrap();
    let genuine = |h: &SignedHead| h.signature.value == "genuine";
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
    let forged = signed(
        &ChainHead {
            seq: 1_000_000,
            hash: "f".repeat(64),
        },
        &"00".repeat(64),
    );
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
