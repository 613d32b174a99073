use chrono::TimeDelta;
use proptest::prelude::*;

use super::*;
use crate::data::records::RecordRefusal;
use crate::kit::fixtures::{self, now, scope, view};
use crate::kit::stamp::{CATEGORY, EPOCH, LAYER, PURPOSE, may_be_subjects};
use lethe_policy::Refusal;

const C1: &str = "5bef18a2-3c1e-4d6f-9a0b-7c8d9e0f1a2b";

#[test]
fn endpoints_are_classified() {
    let base = "/api/v2/tenants/default_tenant/databases/default_database/collections";
    let c1 = format!("{base}/{C1}");
    let cases = [
        (
            Method::GET,
            "/api/v2/heartbeat".to_owned(),
            Endpoint::PassThrough,
        ),
        (
            Method::GET,
            "/api/v2/auth/identity".to_owned(),
            Endpoint::PassThrough,
        ),
        (
            Method::GET,
            "/api/v2/tenants/default_tenant".to_owned(),
            Endpoint::PassThrough,
        ),
        (Method::POST, "/api/v2/tenants".to_owned(), Endpoint::Admin),
        (
            Method::GET,
            format!("{base}/memories"),
            Endpoint::PassThrough,
        ),
        (Method::POST, base.to_owned(), Endpoint::Admin),
        (Method::DELETE, format!("{base}/memories"), Endpoint::Admin),
        (
            Method::POST,
            format!("{c1}/add"),
            Endpoint::Write {
                collection: C1.into(),
                kind: WriteKind::Add,
            },
        ),
        (
            Method::POST,
            format!("{c1}/upsert"),
            Endpoint::Write {
                collection: C1.into(),
                kind: WriteKind::Upsert,
            },
        ),
        (
            Method::POST,
            format!("{c1}/update"),
            Endpoint::Write {
                collection: C1.into(),
                kind: WriteKind::Update,
            },
        ),
        (
            Method::POST,
            format!("{c1}/query"),
            Endpoint::Query {
                collection: C1.into(),
            },
        ),
        (
            Method::POST,
            format!("{c1}/get"),
            Endpoint::Get {
                collection: C1.into(),
            },
        ),
        (
            Method::GET,
            format!("{c1}/count"),
            Endpoint::Count {
                collection: C1.into(),
            },
        ),
        (
            Method::POST,
            format!("{c1}/delete"),
            Endpoint::Delete {
                collection: C1.into(),
            },
        ),
        (Method::POST, format!("{c1}/search"), Endpoint::Refused),
        (Method::GET, format!("{c1}/add"), Endpoint::Refused),
        (Method::POST, "/api/v2/reset".to_owned(), Endpoint::Refused),
        (
            Method::GET,
            "/api/v1/heartbeat".to_owned(),
            Endpoint::Refused,
        ),
        (Method::GET, "/".to_owned(), Endpoint::Refused),
    ];
    for (method, path, expected) in cases {
        assert_eq!(classify(&method, &path), expected, "{method} {path}");
    }
}

#[test]
fn record_operations_need_the_canonical_collection_id() {
    let base = "/api/v2/tenants/default_tenant/databases/default_database/collections";
    let simple = C1.replace('-', "");
    let spellings = [
        C1.to_uppercase(),
        simple.clone(),
        simple.to_uppercase(),
        format!("{{{C1}}}"),
        format!("urn:uuid:{C1}"),
        format!("%35{}", &C1[1..]),
        format!("{C1}%20"),
        "memories".to_owned(),
    ];
    for spelling in spellings {
        for (method, op) in [
            (Method::POST, "add"),
            (Method::POST, "get"),
            (Method::GET, "count"),
        ] {
            let path = format!("{base}/{spelling}/{op}");
            assert_eq!(classify(&method, &path), Endpoint::NonCanonical, "{path}");
        }
    }
    let unknown = format!("{base}/{}/search", C1.to_uppercase());
    assert_eq!(classify(&Method::POST, &unknown), Endpoint::Refused);
}

fn add_body(metadatas: Value) -> Vec<u8> {
    json!({"ids": ["a", "b"], "embeddings": [[0.1, 0.2], [0.3, 0.4]], "documents": ["likes tea", "likes jazz"], "metadatas": metadatas})
        .to_string()
        .into_bytes()
}

#[test]
fn a_consented_write_is_stamped_record_by_record() {
    let planned = plan_write(
        &add_body(json!([{"topic": "drinks"}, null])),
        &scope(Some("alice")),
    )
    .unwrap();
    assert_eq!(
        planned.subjects().into_iter().collect::<Vec<_>>(),
        ["alice"]
    );
    let StampedWrite { body, stamps } = apply_write(
        planned,
        "acme",
        &view(),
        &BTreeMap::new(),
        WriteKind::Add,
        now(),
    )
    .unwrap();
    let body: Value = serde_json::from_slice(&body.unwrap()).unwrap();
    let expires = (now() + TimeDelta::days(30)).timestamp();
    assert_eq!(
        body["metadatas"][0],
        json!({"topic": "drinks", SUBJECT: "alice", TENANT: "acme", PURPOSE: "personalization", CATEGORY: "preference", EXPIRES_AT: expires, EPOCH: 0, LAYER: "raw", OWNER: "acme/alice"})
    );
    assert_eq!(
        body["metadatas"][1][SUBJECT], "alice",
        "a null metadata gets a stamp too"
    );
    assert_eq!(
        body["documents"],
        json!(["likes tea", "likes jazz"]),
        "content is untouched"
    );
    assert_eq!(stamps.len(), 2);
}

#[test]
fn records_may_carry_their_own_scope_when_the_request_does_not() {
    let unbound = Scope {
        tenant: "acme",
        subject: None,
        bound: false,
        purpose: None,
        category: None,
        fold: false,
    };
    let metas = json!([
        {SUBJECT: "alice", PURPOSE: "personalization", CATEGORY: "preference"},
        {SUBJECT: "bob", PURPOSE: "personalization", CATEGORY: "preference", EXPIRES_AT: now().timestamp() + 60},
    ]);
    let planned = plan_write(&add_body(metas), &unbound).unwrap();
    let body = apply_write(
        planned,
        "acme",
        &view(),
        &BTreeMap::new(),
        WriteKind::Add,
        now(),
    )
    .unwrap()
    .body;
    let body: Value = serde_json::from_slice(&body.unwrap()).unwrap();
    assert_eq!(body["metadatas"][1][SUBJECT], "bob");
    assert_eq!(
        (&body["metadatas"][0][OWNER], &body["metadatas"][1][OWNER]),
        (&json!("acme/alice"), &json!("acme/bob")),
        "each record's owner key follows its own stamp"
    );
    assert_eq!(
        body["metadatas"][1][EXPIRES_AT],
        now().timestamp() + 60,
        "a client may ask for an earlier expiry"
    );
}

#[test]
fn one_refused_record_refuses_the_write_with_reasons_and_no_content() {
    let unbound = Scope {
        tenant: "acme",
        subject: None,
        bound: false,
        purpose: Some("personalization"),
        category: Some("preference"),
        fold: false,
    };
    let cases = [
        (
            json!([{SUBJECT: "alice"}, {SUBJECT: "carol"}]),
            vec![(1, Refusal::SubjectSuppressed)],
        ),
        (
            json!([{SUBJECT: "zed"}, {SUBJECT: "alice"}]),
            vec![(0, Refusal::ConsentRequired)],
        ),
        (
            json!([{SUBJECT: "carol"}, {SUBJECT: "zed"}]),
            vec![
                (0, Refusal::SubjectSuppressed),
                (1, Refusal::ConsentRequired),
            ],
        ),
    ];
    for (metas, expected) in cases {
        let planned = plan_write(&add_body(metas.clone()), &unbound).unwrap();
        let err = apply_write(
            planned,
            "acme",
            &view(),
            &BTreeMap::new(),
            WriteKind::Upsert,
            now(),
        )
        .unwrap_err();
        let AdapterError::Refused(refusals) = &err else {
            panic!("{err:?}")
        };
        let got: Vec<_> = refusals.iter().map(|r| (r.index, r.refusal)).collect();
        assert_eq!(got, expected, "{metas}");
        assert!(
            !format!("{err:?}{err}").contains("likes"),
            "no content in refusals"
        );
    }
}

#[test]
fn scope_problems_are_caught_before_any_decision() {
    let bound = scope(Some("alice"));
    let other_subject = plan_write(&add_body(json!([{SUBJECT: "bob"}, null])), &bound);
    assert!(
        matches!(other_subject, Err(AdapterError::Refused(r)) if r[0].refusal == Refusal::ScopeViolation)
    );
    let other_purpose = plan_write(&add_body(json!([{PURPOSE: "training"}, null])), &bound);
    assert!(
        matches!(other_purpose, Err(AdapterError::Refused(r)) if r[0].refusal == Refusal::ScopeViolation)
    );
    let nobody = Scope {
        tenant: "acme",
        subject: None,
        bound: false,
        purpose: Some("p"),
        category: Some("c"),
        fold: false,
    };
    assert!(matches!(
        plan_write(&add_body(Value::Null), &nobody),
        Err(AdapterError::MissingScope {
            index: 0,
            what: "subject",
            ..
        })
    ));
}

#[test]
fn writes_are_decided_on_what_chroma_holds_under_their_ids() {
    let later = now() + TimeDelta::days(3);
    let bobs = BTreeMap::from([("b".to_owned(), Some(fixtures::stamp("bob", later)))]);
    let unstamped = BTreeMap::from([("b".to_owned(), None)]);
    let own = BTreeMap::from([("b".to_owned(), Some(fixtures::stamp("alice", later)))]);
    let own_expired = BTreeMap::from([("b".to_owned(), Some(fixtures::stamp("alice", now())))]);
    use WriteKind::*;
    let cases = [
        (
            "another subject's record",
            &bobs,
            Upsert,
            Refusal::ScopeViolation,
        ),
        (
            "another subject's record",
            &bobs,
            Update,
            Refusal::ScopeViolation,
        ),
        (
            "a record nobody can claim",
            &unstamped,
            Update,
            Refusal::UnstampedItem,
        ),
        ("an id that is taken", &own, Add, Refusal::AlreadyExists),
        ("an expired record", &own_expired, Upsert, Refusal::Expired),
    ];
    for (case, held, kind, refusal) in cases {
        let planned = plan_write(&add_body(Value::Null), &scope(Some("alice"))).unwrap();
        let err = apply_write(planned, "acme", &view(), held, kind, now()).unwrap_err();
        assert_eq!(
            err,
            AdapterError::Refused(vec![RecordRefusal { index: 1, refusal }]),
            "{case}"
        );
    }
    // The owner's upsert keeps the record's deadline.
    let planned = plan_write(&add_body(Value::Null), &scope(Some("alice"))).unwrap();
    let written = apply_write(planned, "acme", &view(), &own, Upsert, now()).unwrap();
    assert_eq!(written.stamps[1].1.expires_at, later);
    assert_eq!(written.stamps[0].1.expires_at, now() + TimeDelta::days(30));
}

#[test]
fn an_update_of_ids_chroma_does_not_hold_writes_nothing_for_them() {
    let held = BTreeMap::from([(
        "b".to_owned(),
        Some(fixtures::stamp("alice", now() + TimeDelta::days(3))),
    )]);
    let planned = plan_write(&add_body(Value::Null), &scope(Some("alice"))).unwrap();
    let written = apply_write(planned, "acme", &view(), &held, WriteKind::Update, now()).unwrap();
    let body: Value = serde_json::from_slice(&written.body.unwrap()).unwrap();
    assert_eq!(body["ids"], json!(["b"]));
    assert_eq!(body["documents"], json!(["likes jazz"]));
    assert_eq!(body["embeddings"], json!([[0.3, 0.4]]));
    assert_eq!(body["metadatas"][0][SUBJECT], "alice");
    assert_eq!(written.stamps.len(), 1, "lineage only for what is written");

    let planned = plan_write(&add_body(Value::Null), &scope(Some("alice"))).unwrap();
    let none = apply_write(
        planned,
        "acme",
        &view(),
        &BTreeMap::new(),
        WriteKind::Update,
        now(),
    );
    assert_eq!(none.map(|w| (w.body, w.stamps.len())), Ok((None, 0)));
}

#[test]
fn held_stamps_are_read_by_id_whatever_the_order() {
    let answer = json!({
        "ids": ["b", "a", "c"],
        "metadatas": [null, {"topic": "x"}, {SUBJECT: "alice", TENANT: "acme", PURPOSE: "personalization",
            CATEGORY: "preference", EXPIRES_AT: 2_000_000_000i64, EPOCH: 1}],
        "documents": null, "embeddings": null, "uris": null, "data": null, "include": ["metadatas"]
    });
    let held = held_stamps(answer.to_string().as_bytes()).unwrap();
    assert_eq!(held["a"], None);
    assert_eq!(held["b"], None);
    assert_eq!(
        held["c"].as_ref().map(|s| (s.subject.as_str(), s.epoch)),
        Some(("alice", 1))
    );
    for bad in [
        json!({"ids": [1]}),
        json!({"metadatas": []}),
        json!({"ids": ["a"], "metadatas": []}),
    ] {
        assert!(held_stamps(bad.to_string().as_bytes()).is_err(), "{bad}");
    }
}

#[test]
fn malformed_writes_are_invalid() {
    let s = scope(Some("alice"));
    let bodies = [
        "not json",
        "[1, 2]",
        r#"{"ids": []}"#,
        r#"{"ids": [1]}"#,
        r#"{"ids": ["a", "b"], "documents": ["only one"]}"#,
        r#"{"ids": ["a"], "embeddings": [[1], [2]]}"#,
        r#"{"ids": ["a"], "metadatas": ["text"]}"#,
        r#"{"ids": ["a"], "metadatas": [{"lethe_subject": 7}]}"#,
        r#"{"ids": ["a"], "metadatas": [{"lethe_expires_at": "tomorrow"}]}"#,
        r#"{"ids": ["a"], "documents": "abc"}"#,
        r#"{"ids": ["a", "a"]}"#,
    ];
    for body in bodies {
        assert!(
            matches!(
                plan_write(body.as_bytes(), &s),
                Err(AdapterError::Invalid(_))
            ),
            "{body}"
        );
    }
}

fn stamped(subject: &str, expires: i64) -> Value {
    json!({SUBJECT: subject, TENANT: "acme", PURPOSE: "personalization", CATEGORY: "preference", EXPIRES_AT: expires, EPOCH: 0, "topic": "x"})
}

#[test]
fn reads_are_narrowed_in_the_store() {
    let (body, plan) = narrow_read(
        br#"{"where": {"topic": "x"}, "include": ["documents"]}"#,
        C1,
        false,
        "acme",
        Some("alice"),
        now(),
    )
    .unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap();
    // A subject's read is found by its one selective owner key; the answer is decided again.
    assert_eq!(
        body["where"],
        json!({"$and": [{"topic": "x"}, {OWNER: {"$eq": "acme/alice"}}]})
    );
    assert_eq!(body["include"], json!(["documents", "metadatas"]));
    assert!(plan.strip_metadatas);
    let (body, plan) = narrow_read(b"{}", C1, true, "acme", None, now()).unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body["where"],
        json!({"$and": [{TENANT: {"$eq": "acme"}}, {EXPIRES_AT: {"$gt": now().timestamp()}}]}),
        "a read of no one subject stays within the tenant and its deadlines"
    );
    assert!(!plan.strip_metadatas && plan.nested);
    assert!(narrow_read(br#"{"where": [1]}"#, C1, false, "acme", None, now()).is_err());
}

#[test]
fn get_answers_lose_refused_records_and_stay_aligned() {
    let later = now().timestamp() + 3600;
    let response = json!({
        "ids": ["a", "c", "u", "e", "d", "b"],
        "documents": ["A", "C", "U", "E", "D", "B"],
        "embeddings": [[1], [2], [3], [4], [5], [6]],
        "metadatas": [stamped("alice", later), stamped("carol", later), {"topic": "unstamped"}, stamped("alice", now().timestamp()), stamped("dave", later), stamped("bob", later)],
        "include": ["documents", "embeddings", "metadatas"],
    });
    let ctx = ReadContext {
        tenant: "acme",
        store: "chroma",
        bound_subject: None,
        purpose: None,
    };
    let plan = ReadPlan {
        nested: false,
        strip_metadatas: false,
        ..ReadPlan::default()
    };
    let out = filter_read(response, &plan, &view(), &ctx, now()).unwrap();
    assert_eq!(out["ids"], json!(["a", "b"]));
    assert_eq!(out["documents"], json!(["A", "B"]));
    assert_eq!(out["embeddings"], json!([[1], [6]]));
    assert_eq!(out["metadatas"][1][SUBJECT], "bob");

    let bound = ReadContext {
        bound_subject: Some("bob"),
        ..ctx
    };
    let stripped = ReadPlan {
        nested: false,
        strip_metadatas: true,
        ..ReadPlan::default()
    };
    let response = json!({"ids": ["a", "b"], "metadatas": [stamped("alice", later), stamped("bob", later)], "include": ["metadatas"]});
    let mut out = filter_read(response, &stripped, &view(), &bound, now()).unwrap();
    strip_added(&mut out, &stripped);
    assert_eq!(
        (
            out["ids"].clone(),
            out["metadatas"].clone(),
            out["include"].clone()
        ),
        (json!(["b"]), Value::Null, json!([]))
    );
}

#[test]
fn query_answers_are_filtered_per_query() {
    let later = now().timestamp() + 3600;
    let response = json!({
        "ids": [["a", "c"], ["c", "b", "a"]],
        "distances": [[0.1, 0.2], [0.3, 0.4, 0.5]],
        "documents": [["A", "C"], ["C", "B", "A"]],
        "metadatas": [[stamped("alice", later), stamped("carol", later)], [stamped("carol", later), stamped("bob", later), stamped("alice", later)]],
        "embeddings": null,
    });
    let ctx = ReadContext {
        tenant: "acme",
        store: "chroma",
        bound_subject: None,
        purpose: None,
    };
    let plan = ReadPlan {
        nested: true,
        strip_metadatas: false,
        ..ReadPlan::default()
    };
    let out = filter_read(response, &plan, &view(), &ctx, now()).unwrap();
    assert_eq!(out["ids"], json!([["a"], ["b", "a"]]));
    assert_eq!(out["distances"], json!([[0.1], [0.4, 0.5]]));
    assert_eq!(out["documents"], json!([["A"], ["B", "A"]]));
    assert_eq!(out["embeddings"], Value::Null);
}

#[test]
fn misaligned_answers_are_not_passed_on() {
    let ctx = ReadContext {
        tenant: "acme",
        store: "chroma",
        bound_subject: None,
        purpose: None,
    };
    let flat = ReadPlan {
        nested: false,
        strip_metadatas: false,
        ..ReadPlan::default()
    };
    let nested = ReadPlan {
        nested: true,
        strip_metadatas: false,
        ..ReadPlan::default()
    };
    let cases = [
        (json!({"ids": ["a", "b"], "documents": ["A"]}), &flat),
        (json!({"documents": ["A"]}), &flat),
        (json!([1]), &flat),
        (json!({"ids": [["a"]], "documents": [["A", "B"]]}), &nested),
        (json!({"ids": [["a"]], "metadatas": ["x"]}), &nested),
    ];
    for (response, plan) in cases {
        assert!(
            matches!(
                filter_read(response.clone(), plan, &view(), &ctx, now()),
                Err(AdapterError::UpstreamInvalid(_))
            ),
            "{response}"
        );
    }
}

#[test]
fn deletes_are_scoped_through_a_get() {
    assert_eq!(
        parse_delete(br#"{"ids": ["a"]}"#).unwrap(),
        (Some(json!(["a"])), None)
    );
    assert!(parse_delete(b"{}").is_err());
    assert!(parse_delete(br#"{"where_document": {"$contains": "x"}}"#).is_err());
    let body: Value = serde_json::from_slice(&scoped_get(
        Some(json!(["a"])),
        Some(json!({"k": 1})),
        delete_conditions("acme", Some("alice")),
    ))
    .unwrap();
    assert_eq!(
        body,
        json!({"ids": ["a"], "where": {"$and": [{"k": 1}, {OWNER: {"$eq": "acme/alice"}}]}, "include": ["metadatas"]})
    );
    assert_eq!(
        delete_conditions("acme", None),
        [json!({TENANT: {"$eq": "acme"}})],
        "a delete of no one subject stays in the tenant, expired records included"
    );
    // The owner key found them; the stamp Chroma holds decides which may go.
    let found = json!({
        "ids": ["mine", "forged", "neighbours", "bare"],
        "metadatas": [
            {TENANT: "acme", SUBJECT: "alice", OWNER: "acme/alice"},
            {TENANT: "globex", SUBJECT: "alice", OWNER: "acme/alice"},
            {TENANT: "acme", SUBJECT: "bob", OWNER: "acme/alice"},
            null,
        ],
    })
    .to_string();
    assert_eq!(
        owned_ids(found.as_bytes(), "acme", Some("alice")).unwrap(),
        ["mine"]
    );
    assert_eq!(
        owned_ids(found.as_bytes(), "acme", None).unwrap(),
        ["mine", "neighbours"]
    );
    assert!(owned_ids(b"{}", "acme", None).is_err());
}

// ---- properties: arbitrary JSON never panics and never lets a suppressed subject through ----

fn arb_json() -> impl Strategy<Value = Value> {
    fixtures::arb_json(vec![
        "ids",
        "metadatas",
        "documents",
        "embeddings",
        "distances",
        SUBJECT,
        TENANT,
        PURPOSE,
        CATEGORY,
        EXPIRES_AT,
        EPOCH,
        "where",
        "include",
    ])
}

/// A well-formed answer mixing subjects, some suppressed, with arbitrary extra fields.
fn arb_answer() -> impl Strategy<Value = (Value, bool)> {
    let record = (
        proptest::sample::select(vec!["alice", "bob", "carol", "dave"]),
        -10i64..10,
        any::<bool>(),
    );
    (proptest::collection::vec(proptest::collection::vec(record, 0..6), 1..4), any::<bool>()).prop_map(|(queries, nested)| {
        let meta = |(s, dt, whole): &(&str, i64, bool)| {
            if *whole { stamped(s, now().timestamp() + dt * 600) } else { json!({SUBJECT: s}) }
        };
        let ids = |q: &Vec<(&str, i64, bool)>| q.iter().enumerate().map(|(i, (s, _, _))| json!(format!("{s}-{i}"))).collect::<Vec<_>>();
        if nested {
            let ids: Vec<Value> = queries.iter().map(|q| Value::Array(ids(q))).collect();
            let metas: Vec<Value> = queries.iter().map(|q| Value::Array(q.iter().map(meta).collect())).collect();
            (json!({"ids": ids, "metadatas": metas, "documents": ids}), true)
        } else {
            let q = &queries[0];
            (json!({"ids": ids(q), "metadatas": q.iter().map(meta).collect::<Vec<_>>(), "documents": ids(q)}), false)
        }
    })
}

proptest! {
    #[test]
    fn arbitrary_bodies_never_panic(body in arb_json(), nested in any::<bool>()) {
        let bytes = body.to_string().into_bytes();
        let _ = classify(&Method::POST, &body.to_string());
        if let Ok(planned) = plan_write(&bytes, &scope(Some("alice"))) {
            let _ = apply_write(planned, "acme", &view(), &BTreeMap::new(), WriteKind::Upsert, now());
        }
        let _ = narrow_read(&bytes, C1, nested, "acme", None, now());
        let _ = parse_delete(&bytes);
        let _ = owned_ids(&bytes, "acme", Some("alice"));
        let ctx = ReadContext { tenant: "acme", store: "chroma", bound_subject: None, purpose: None };
        if let Ok(out) = filter_read(body, &ReadPlan { nested, ..ReadPlan::default() }, &view(), &ctx, now()) {
            let text = out.to_string();
            prop_assert!(subjects_in(&out).iter().all(|(_, s)| s != "carol"), "{}", text);
        }
    }

    #[test]
    fn no_suppressed_or_unconsented_record_survives_a_read((answer, nested) in arb_answer(), bound in proptest::option::of(proptest::sample::select(vec!["alice", "bob"]))) {
        let ctx = ReadContext { tenant: "acme", store: "chroma", bound_subject: bound, purpose: None };
        let out = filter_read(answer, &ReadPlan { nested, ..ReadPlan::default() }, &view(), &ctx, now()).unwrap();
        let metas: Vec<Value> = match out["metadatas"].as_array() {
            Some(m) if nested => m.iter().flat_map(|q| q.as_array().cloned().unwrap_or_default()).collect(),
            Some(m) => m.clone(),
            None => vec![],
        };
        for meta in &metas {
            let stamp = read_stamp(meta);
            prop_assert!(stamp.is_some(), "unstamped record served: {}", meta);
            let stamp = stamp.unwrap();
            prop_assert!(stamp.subject == "alice" || stamp.subject == "bob", "{} served", stamp.subject);
            prop_assert!(stamp.expires_at > now());
            prop_assert!(bound.is_none_or(|b| b == stamp.subject));
        }
        // Alignment: documents were the ids, so they must still be.
        prop_assert_eq!(&out["ids"], &out["documents"]);
    }
}

#[test]
fn a_record_is_the_subjects_unless_its_stamp_names_another_owner() {
    let keys = ["u1".to_owned(), "u1-old".to_owned()];
    let is_one = |s: &str| keys.iter().any(|k| k == s);
    let owned = |t: &str, s: &str| json!({TENANT: t, SUBJECT: s});
    assert!(may_be_subjects(&owned("acme", "u1-old"), "acme", is_one));
    assert!(
        may_be_subjects(&json!({"topic": "tea"}), "acme", is_one),
        "no owner named"
    );
    assert!(may_be_subjects(&Value::Null, "acme", is_one));
    assert!(!may_be_subjects(&owned("acme", "u2"), "acme", is_one));
    assert!(!may_be_subjects(&owned("globex", "u1"), "acme", is_one));
    assert_eq!(
        stamped_by("acme", &keys),
        json!({"$and": [{TENANT: {"$eq": "acme"}}, {SUBJECT: {"$in": ["u1", "u1-old"]}}]})
    );
}

#[test]
fn a_record_a_closure_hides_is_dropped_and_what_is_served_is_named() {
    let later = now().timestamp() + 3600;
    let mut view = view();
    view.hidden
        .insert(("acme".into(), "chroma".into(), C1.into(), "b".into()));
    let ctx = ReadContext {
        tenant: "acme",
        store: "chroma",
        bound_subject: None,
        purpose: None,
    };
    let flat = ReadPlan {
        collection: C1.into(),
        ..ReadPlan::default()
    };
    let response = json!({"ids": ["a", "b"], "documents": ["A", "B"], "metadatas": [stamped("alice", later), stamped("bob", later)]});
    let out = filter_read(response, &flat, &view, &ctx, now()).unwrap();
    assert_eq!(out["ids"], json!(["a"]));
    let served_a = ServedRecord {
        id: "a".into(),
        owner: "alice".into(),
        document: "A".into(),
    };
    assert_eq!(served(&out, &flat), std::slice::from_ref(&served_a));
    // The same id in another collection is another item.
    let other = ReadPlan {
        collection: "c0ffee00-0000-4000-8000-000000000002".into(),
        ..ReadPlan::default()
    };
    let response = json!({"ids": ["b"], "metadatas": [stamped("bob", later)]});
    let out = filter_read(response, &other, &view, &ctx, now()).unwrap();
    assert_eq!(out["ids"], json!(["b"]));
    assert_eq!(
        served(&out, &other)[0].document,
        "",
        "no document asked for"
    );
    let nested = ReadPlan {
        nested: true,
        ..flat
    };
    let response = json!({"ids": [["b", "a"], ["a"]], "documents": [["B", "A"], ["A"]], "metadatas": [[stamped("bob", later), stamped("alice", later)], [stamped("alice", later)]]});
    let out = filter_read(response, &nested, &view, &ctx, now()).unwrap();
    assert_eq!(out["ids"], json!([["a"], ["a"]]));
    assert_eq!(served(&out, &nested), [served_a.clone(), served_a]);
}

#[test]
fn a_writes_documents_line_up_with_its_records() {
    let planned = plan_write(
        br#"{"ids": ["a", "b", "c"], "documents": ["first", null, "third"]}"#,
        &scope(Some("alice")),
    )
    .unwrap();
    assert_eq!(planned.documents(), ["first", "", "third"]);
    let planned = plan_write(br#"{"ids": ["a"]}"#, &scope(Some("alice"))).unwrap();
    assert_eq!(planned.documents(), [""]);
}
