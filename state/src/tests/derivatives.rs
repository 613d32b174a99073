//! Derivative lineage in the state store, on both backends: edges, the closure a flip hides,
//! decisions on it, and completion only once every derivative is decided and verified.

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::TimeDelta;
use lethe_policy::{ErasureState, How};

use super::{audit, lineage_row};
use crate::now;
use crate::*;

on_both_backends!(
    a_flip_hides_the_closure_and_waits_for_every_decision,
    another_subjects_derivatives_are_erased_by_policy_when_so_configured,
    the_dry_run_reaches_the_closure_and_records_nothing,
    a_rewritten_item_derives_from_its_new_parents_only,
);

fn key(store: &str, collection: &str, item: &str) -> ItemKey {
    ItemKey::new(store, collection, item)
}

/// `child` (of `child_owner`) derived from each of `parents` (item, owner, how).
fn derived(child: &ItemKey, child_owner: &str, parents: &[(&ItemKey, &str, How)]) -> Derived {
    Derived {
        tenant: "acme".into(),
        child: child.clone(),
        edges: parents
            .iter()
            .map(|(parent, owner, how)| Edge {
                child: child.clone(),
                child_owner: child_owner.into(),
                parent: (*parent).clone(),
                parent_owner: (*owner).into(),
                how: *how,
                at: now(),
            })
            .collect(),
        replace: true,
    }
}

struct Graph {
    a1: ItemKey,
    a2: ItemKey,
    s1: ItemKey,
    s2: ItemKey,
    answer: ItemKey,
    d1: ItemKey,
    e1: ItemKey,
    unrelated: ItemKey,
}

/// alice's memory `a1`; her own summary `a2` of it; bob's summary `s1` quoting it, carol's fact
/// `s2` from bob's summary (and bob's summary quoting carol's fact back: a cycle); a model's
/// answer the provider did not keep, from `a1`; erin's note in a store no purge reaches, quoting
/// the answer; dave's note from `a1`, deleted since; and bob's note quoting his own summary (in
/// the closure through it).
async fn graph(store: &Arc<dyn Store>) -> Graph {
    let g = Graph {
        a1: key("chroma", "memories", "a1"),
        a2: key("chroma", "memories", "a2"),
        s1: key("chroma", "memories", "s1"),
        s2: key("qdrant", "facts", "s2"),
        answer: key("openai", "answers", "chatcmpl-1"),
        d1: key("chroma", "memories", "d1"),
        e1: key("langgraph", "store", "e1"),
        unrelated: key("chroma", "memories", "b9"),
    };
    let row = |k: &ItemKey, subject: &str| lineage_row(&k.store, &k.collection, &k.item, subject);
    store
        .record_items(&[
            row(&g.a1, "alice"),
            row(&g.a2, "alice"),
            row(&g.s1, "bob"),
            row(&g.s2, "carol"),
            row(&g.d1, "dave"),
            row(&g.e1, "erin"),
            row(&g.unrelated, "bob"),
        ])
        .await
        .unwrap();
    store
        .mark_items_deleted("chroma", "memories", &["d1".into()], now())
        .await
        .unwrap();
    store
        .record_derived(&[
            derived(&g.a2, "alice", &[(&g.a1, "alice", How::Quote)]),
            derived(
                &g.s1,
                "bob",
                &[(&g.a1, "alice", How::Trace), (&g.s2, "carol", How::Quote)],
            ),
            derived(&g.s2, "carol", &[(&g.s1, "bob", How::Quote)]),
            derived(&g.answer, "bob", &[(&g.a1, "alice", How::Quote)]),
            derived(&g.e1, "erin", &[(&g.answer, "bob", How::Provider)]),
            derived(&g.d1, "dave", &[(&g.a1, "alice", How::Trace)]),
            derived(&g.unrelated, "bob", &[(&g.s1, "bob", How::Quote)]),
        ])
        .await
        .unwrap();
    g
}

const TARGETS: [&str; 3] = ["chroma:chroma", "qdrant:qdrant", "openai:openai"];

async fn file_and_approve(store: &Arc<dyn Store>, id: &str, subject: &str) -> ErasureRecord {
    let at = now();
    let targets: Vec<String> = TARGETS.map(str::to_owned).to_vec();
    store
        .create_erasure(
            &crate::testing::erasure_request(id, subject, at),
            &targets,
            audit("erasure.request", Some(id)),
        )
        .await
        .unwrap();
    store
        .approve_erasure(id, "dpo", 1, at, audit("erasure.approve", Some(id)))
        .await
        .unwrap()
}

fn by_item(derivatives: &[Derivative]) -> std::collections::BTreeMap<ItemKey, &Derivative> {
    derivatives.iter().map(|d| (d.item.clone(), d)).collect()
}

/// Runs every due job once, marking what each purge would: the subject's lineage rows in its
/// store deleted, and the derivatives decided for erasure there verified gone.
async fn purge_everything(store: &Arc<dyn Store>, id: &str) -> ErasureRecord {
    let mut last = store.erasure(id).await.unwrap();
    while let Some(job) = store
        .claim_purge_job("w", now(), now(), now() + TimeDelta::minutes(1))
        .await
        .unwrap()
    {
        let name = job.target.split_once(':').unwrap().1.to_owned();
        let keys: Vec<String> = last.keys().map(str::to_owned).collect();
        let items = store
            .lineage_items("acme", &name, &keys, false)
            .await
            .unwrap();
        for (collection, item) in items {
            store
                .mark_items_deleted(&name, &collection, &[item], now())
                .await
                .unwrap();
        }
        let erased: Vec<String> = store
            .derivatives(id)
            .await
            .unwrap()
            .into_iter()
            .filter(|d| d.item.store == name && d.decision == Decision::Erase)
            .map(|d| d.reference)
            .collect();
        store.derivatives_erased(id, &erased, now()).await.unwrap();
        last = store
            .finish_purge_job(
                &job.id,
                JobOutcome::Done(serde_json::json!({})),
                now(),
                audit("purge", Some(&job.id)),
            )
            .await
            .unwrap();
    }
    last
}

async fn a_flip_hides_the_closure_and_waits_for_every_decision(store: &Arc<dyn Store>) {
    let g = graph(store).await;
    let heard = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = Arc::clone(&heard);
    store.feed().on_event(move |e| {
        if let FeedEvent::Changed(c) = e {
            log.lock().unwrap().push(c.clone());
        }
    });
    let flipped = file_and_approve(store, "er1", "alice").await;
    assert_eq!(flipped.state, ErasureState::Suppressed);
    assert!(
        heard
            .lock()
            .unwrap()
            .contains(&PolicyChange::of_derivatives("acme")),
        "every cache heard of the closure before the approval returned"
    );

    let found = store.derivatives("er1").await.unwrap();
    let found_by = by_item(&found);
    let decision = |k: &ItemKey| found_by.get(k).map(|d| d.decision);
    assert_eq!(decision(&g.a2), Some(Decision::Erase), "her own: with her");
    assert!(found_by[&g.a2].own);
    assert_eq!(decision(&g.s1), Some(Decision::Undecided));
    assert_eq!(decision(&g.s2), Some(Decision::Undecided), "through bob's");
    assert_eq!(decision(&g.answer), Some(Decision::Guard), "not kept");
    assert_eq!(decision(&g.d1), Some(Decision::Guard), "deleted already");
    assert_eq!(
        decision(&g.e1),
        Some(Decision::Undecided),
        "no purge reaches it: a person releases it, never nobody"
    );
    assert_eq!(decision(&g.a1), None, "her own item is no derivative");
    assert_eq!(decision(&g.unrelated), Some(Decision::Undecided), "from s1");
    assert_eq!(found.len(), 7);
    assert_eq!(found_by[&g.s1].subject.as_deref(), Some("bob"));
    assert_eq!(found_by[&g.s1].how, [How::Trace, How::Quote]);
    assert_eq!(
        found_by[&g.s1].parents.iter().collect::<BTreeSet<_>>(),
        BTreeSet::from([&g.a1, &g.s2])
    );
    assert_eq!(found_by[&g.e1].how, [How::Provider]);

    let hidden = store
        .hidden_items("acme", now() - TimeDelta::minutes(15))
        .await
        .unwrap();
    assert_eq!(hidden.len(), 7);
    assert!(!hidden.contains(&g.a1), "hidden by her state already");
    assert!(
        store
            .hidden_items("globex", now() - TimeDelta::minutes(15))
            .await
            .unwrap()
            .is_empty()
    );

    // Every store purged: still waiting, for bob's, carol's and the unrelated note's decisions.
    let waiting = purge_everything(store, "er1").await;
    assert_eq!(waiting.state, ErasureState::Verifying);
    // A guard cannot be decided, nor an unknown item; a decision is erase or release.
    let decide = |refs: Vec<String>, decision| {
        let store = Arc::clone(store);
        async move {
            store
                .decide_derivatives(
                    "er1",
                    &refs,
                    decision,
                    "reviewed",
                    now(),
                    audit("erasure.decide", Some("er1")),
                )
                .await
        }
    };
    for (refs, decision) in [
        (
            vec![g.answer.reference(crate::testing::AUDIT_KEY)],
            Decision::Erase,
        ),
        (vec!["dv_nothing".to_owned()], Decision::Release),
        (
            vec![g.s1.reference(crate::testing::AUDIT_KEY)],
            Decision::Guard,
        ),
        // No purge of the request reaches it: it cannot be erased, only released.
        (
            vec![g.e1.reference(crate::testing::AUDIT_KEY)],
            Decision::Erase,
        ),
    ] {
        assert!(matches!(
            decide(refs, decision).await,
            Err(StoreError::NotDecidable(_))
        ));
    }
    let released = decide(
        vec![
            g.s1.reference(crate::testing::AUDIT_KEY),
            g.unrelated.reference(crate::testing::AUDIT_KEY),
            g.e1.reference(crate::testing::AUDIT_KEY),
        ],
        Decision::Release,
    )
    .await
    .unwrap();
    assert_eq!(
        released.state,
        ErasureState::Verifying,
        "carol's is undecided still"
    );
    let (parents, _) = store.edges_of("acme", &g.s1).await.unwrap();
    assert!(
        parents.is_empty(),
        "bob's summary no longer derives from alice's data: {parents:?}"
    );
    let hidden = store
        .hidden_items("acme", now() - TimeDelta::minutes(15))
        .await
        .unwrap();
    assert!(!hidden.contains(&g.s1) && hidden.contains(&g.s2));
    assert!(matches!(
        decide(
            vec![g.s1.reference(crate::testing::AUDIT_KEY)],
            Decision::Erase
        )
        .await,
        Err(StoreError::NotDecidable(_))
    ));

    // Carol's fact is erased: the request goes back to purge (every store: one may follow
    // another's ids), then completes.
    let erasing = decide(
        vec![g.s2.reference(crate::testing::AUDIT_KEY)],
        Decision::Erase,
    )
    .await
    .unwrap();
    assert_eq!(erasing.state, ErasureState::Propagating);
    let jobs = store.purge_jobs("er1").await.unwrap();
    assert!(jobs.iter().all(|j| j.state == "retrying"), "{jobs:?}");
    let done = purge_everything(store, "er1").await;
    assert_eq!(done.state, ErasureState::Completed);
    let found = store.derivatives("er1").await.unwrap();
    let found_by = by_item(&found);
    assert!(found_by[&g.s2].erased_at.is_some());
    assert_eq!(found_by[&g.s2].decided_by.as_deref(), Some("dpo@test"));
    assert_eq!(found_by[&g.s1].decision, Decision::Release);
    assert_eq!(found_by[&g.s1].reason.as_deref(), Some("reviewed"));
    // The erased subject is named by reference there too.
    let a2 = found_by.get(&g.a2).unwrap();
    assert!(
        a2.subject
            .as_deref()
            .is_some_and(|s| s.starts_with(lethe_policy::audit::FORGOTTEN))
    );
    let (_, children) = store.edges_of("acme", &g.a1).await.unwrap();
    assert!(
        !children.is_empty()
            && children
                .iter()
                .all(|e| e.parent_owner.starts_with(lethe_policy::audit::FORGOTTEN)),
        "{children:?}"
    );
    // What the completed request hid stays hidden for the window after its flip, then not.
    let recently = now() - TimeDelta::minutes(15);
    assert!(
        store
            .hidden_items("acme", recently)
            .await
            .unwrap()
            .contains(&g.answer)
    );
    let later = now() + TimeDelta::minutes(1);
    assert!(store.hidden_items("acme", later).await.unwrap().is_empty());
    // Each decision is in the audit log.
    let events = store.audit_of("acme", &["er1".into()], 100).await.unwrap();
    let decisions: Vec<&str> = events
        .iter()
        .map(|e| e.entry.action.as_str())
        .filter(|a| a.starts_with("erasure.derivative_"))
        .collect();
    assert_eq!(
        decisions,
        [
            "erasure.derivative_release",
            "erasure.derivative_release",
            "erasure.derivative_release",
            "erasure.derivative_erase"
        ]
    );
    assert!(
        events
            .iter()
            .any(|e| e.entry.action == "erasure.awaiting_review")
    );
}

async fn another_subjects_derivatives_are_erased_by_policy_when_so_configured(
    store: &Arc<dyn Store>,
) {
    store.use_closure(Closure::Erase);
    let g = graph(store).await;
    file_and_approve(store, "er1", "alice").await;
    let found = store.derivatives("er1").await.unwrap();
    let found_by = by_item(&found);
    assert_eq!(found_by[&g.s1].decision, Decision::Erase);
    assert_eq!(found_by[&g.s1].decided_by.as_deref(), Some("lethe"));
    assert_eq!(found_by[&g.answer].decision, Decision::Guard);
    // Where no purge of the request reaches, policy cannot erase: a person releases it.
    assert_eq!(found_by[&g.e1].decision, Decision::Undecided);
    let waiting = purge_everything(store, "er1").await;
    assert_eq!(waiting.state, ErasureState::Verifying);
    let done = store
        .decide_derivatives(
            "er1",
            &[g.e1.reference(crate::testing::AUDIT_KEY)],
            Decision::Release,
            "kept where it is",
            now(),
            audit("erasure.decide", Some("er1")),
        )
        .await
        .unwrap();
    assert_eq!(done.state, ErasureState::Completed);
}

async fn the_dry_run_reaches_the_closure_and_records_nothing(store: &Arc<dyn Store>) {
    let g = graph(store).await;
    let targets: Vec<String> = TARGETS.map(str::to_owned).to_vec();
    let reached = store
        .closure_of("acme", &["alice".into()], &targets)
        .await
        .unwrap();
    let reached_by = by_item(&reached);
    assert_eq!(reached_by[&g.s1].decision, Decision::Undecided);
    assert_eq!(reached_by[&g.e1].decision, Decision::Undecided);
    assert_eq!(reached.len(), 7);
    // Bob's closure holds what derives from his items (his own among them), not alice's.
    let bobs = store
        .closure_of("acme", &["bob".into()], &targets)
        .await
        .unwrap();
    let own: BTreeSet<(&ItemKey, bool)> = bobs.iter().map(|d| (&d.item, d.own)).collect();
    assert_eq!(
        own,
        BTreeSet::from([
            (&g.s1, true),
            (&g.unrelated, true),
            (&g.s2, false),
            (&g.e1, false)
        ])
    );
    assert!(
        store
            .closure_of("globex", &["alice".into()], &targets)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .hidden_items("acme", now() - TimeDelta::days(1))
            .await
            .unwrap()
            .is_empty()
    );
}

async fn a_rewritten_item_derives_from_its_new_parents_only(store: &Arc<dyn Store>) {
    let a1 = key("chroma", "memories", "a1");
    let b1 = key("chroma", "memories", "b1");
    let c1 = key("chroma", "memories", "c1");
    store
        .record_derived(&[derived(&b1, "bob", &[(&a1, "alice", How::Quote)])])
        .await
        .unwrap();
    store
        .record_derived(&[derived(&b1, "bob", &[(&c1, "carol", How::Trace)])])
        .await
        .unwrap();
    let (parents, _) = store.edges_of("acme", &b1).await.unwrap();
    assert_eq!(
        parents
            .iter()
            .map(|e| (&e.parent, e.how))
            .collect::<Vec<_>>(),
        [(&c1, How::Trace)]
    );
    // Rewritten with nothing derived: no parent left.
    store
        .record_derived(&[derived(&b1, "bob", &[])])
        .await
        .unwrap();
    assert!(store.edges_of("acme", &b1).await.unwrap().0.is_empty());
    let (_, children) = store.edges_of("acme", &c1).await.unwrap();
    assert!(children.is_empty());
}
