//! Erasure requests in the state store, on both backends: the flip, listing, refusal, deadlines,
//! governed databases.

use super::*;

on_both_backends!(
    an_approved_erasure_flips_its_keys_and_tells_every_cache,
    erasure_requests_are_listed_a_page_at_a_time_and_summed_up,
    a_refused_request_keeps_its_reason_and_cancels_its_jobs,
    a_flip_is_suppressed_only_once_it_holds_in_every_governed_database,
);

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
    let overview = (store.erasure_overview(now + TimeDelta::seconds(10)).await).unwrap();
    let jobs = store.purge_jobs("er1").await.unwrap().len() as i64;
    assert_eq!(
        overview.jobs,
        BTreeMap::from([("pending".to_owned(), jobs)])
    );
    assert!(
        (overview.oldest_due_seconds - 10.0).abs() < 1.0,
        "due since the flip: {overview:?}"
    );
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
    // The metrics' view, across tenants (globex's too); their jobs wait for approval.
    let overview = store.erasure_overview(at).await.unwrap();
    assert_eq!(
        (overview.open, overview.overdue, overview.jobs),
        (
            BTreeMap::from([("requested".to_owned(), 4)]),
            1,
            BTreeMap::from([("waiting".to_owned(), 4)])
        )
    );
    assert_eq!(overview.oldest_due_seconds, 0.0, "no job is due");
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
    assert_eq!(store.migrate().await.unwrap(), [6, 7, 8, 9, 10, 11]);
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
