use chrono::TimeDelta;
use proptest::prelude::*;

use super::*;
use crate::adapters::fixtures::{self, code, now, scope, view};

const U1: &str = "0e5a1c3b-7f2d-4e8a-9b6c-1d2e3f4a5b6c";

#[test]
fn endpoints_are_classified() {
    let c = |name: &str| name.to_owned();
    let cases = [
        (Method::GET, "/".to_owned(), Endpoint::PassThrough),
        (Method::GET, "/readyz".to_owned(), Endpoint::PassThrough),
        (
            Method::GET,
            "/collections".to_owned(),
            Endpoint::PassThrough,
        ),
        (
            Method::GET,
            "/collections/mem0".to_owned(),
            Endpoint::PassThrough,
        ),
        (
            Method::GET,
            "/collections/mem0/exists".to_owned(),
            Endpoint::PassThrough,
        ),
        (
            Method::PUT,
            "/collections/mem0".to_owned(),
            Endpoint::CreateCollection {
                collection: c("mem0"),
            },
        ),
        (
            Method::PATCH,
            "/collections/mem0".to_owned(),
            Endpoint::Admin,
        ),
        (
            Method::DELETE,
            "/collections/mem0".to_owned(),
            Endpoint::Admin,
        ),
        (
            Method::PUT,
            "/collections/mem0/index".to_owned(),
            Endpoint::Admin,
        ),
        (
            Method::POST,
            "/collections/aliases".to_owned(),
            Endpoint::Admin,
        ),
        (
            Method::PUT,
            "/collections/mem0/points".to_owned(),
            Endpoint::Upsert {
                collection: c("mem0"),
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points".to_owned(),
            Endpoint::Retrieve {
                collection: c("mem0"),
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/query".to_owned(),
            Endpoint::Query {
                collection: c("mem0"),
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/scroll".to_owned(),
            Endpoint::Scroll {
                collection: c("mem0"),
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/count".to_owned(),
            Endpoint::Count {
                collection: c("mem0"),
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/delete".to_owned(),
            Endpoint::Delete {
                collection: c("mem0"),
            },
        ),
        (
            Method::GET,
            format!("/collections/mem0/points/{U1}"),
            Endpoint::GetPoint {
                collection: c("mem0"),
                id: PointId::Uuid(U1.into()),
            },
        ),
        (
            Method::GET,
            "/collections/mem0/points/42".to_owned(),
            Endpoint::GetPoint {
                collection: c("mem0"),
                id: PointId::Number(42),
            },
        ),
        // Spellings Qdrant takes for the same point.
        (
            Method::GET,
            format!("/collections/mem0/points/{}", U1.to_uppercase()),
            Endpoint::NonCanonical,
        ),
        (
            Method::GET,
            format!("/collections/mem0/points/urn:uuid:{U1}"),
            Endpoint::NonCanonical,
        ),
        (
            Method::PUT,
            "/collections/mem 0/points".to_owned(),
            Endpoint::NonCanonical,
        ),
        (
            Method::PUT,
            "/collections/../points".to_owned(),
            Endpoint::NonCanonical,
        ),
        // Payload and vector edits, and batches.
        (
            Method::POST,
            "/collections/mem0/points/payload".to_owned(),
            Endpoint::Edit {
                collection: c("mem0"),
                kind: EditKind::SetPayload,
            },
        ),
        (
            Method::PUT,
            "/collections/mem0/points/payload".to_owned(),
            Endpoint::Edit {
                collection: c("mem0"),
                kind: EditKind::OverwritePayload,
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/payload/delete".to_owned(),
            Endpoint::Edit {
                collection: c("mem0"),
                kind: EditKind::DeletePayload,
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/payload/clear".to_owned(),
            Endpoint::Edit {
                collection: c("mem0"),
                kind: EditKind::ClearPayload,
            },
        ),
        (
            Method::PUT,
            "/collections/mem0/points/vectors".to_owned(),
            Endpoint::Edit {
                collection: c("mem0"),
                kind: EditKind::UpdateVectors,
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/vectors/delete".to_owned(),
            Endpoint::Edit {
                collection: c("mem0"),
                kind: EditKind::DeleteVectors,
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/vectors/clear".to_owned(),
            Endpoint::Refused,
        ),
        (
            Method::POST,
            "/collections/mem0/points/batch".to_owned(),
            Endpoint::Batch {
                collection: c("mem0"),
            },
        ),
        // Not governed yet, so refused: facets, old routes.
        (
            Method::POST,
            "/collections/mem0/points/search".to_owned(),
            Endpoint::Refused,
        ),
        (
            Method::POST,
            "/collections/mem0/points/query/batch".to_owned(),
            Endpoint::QueryBatch {
                collection: c("mem0"),
            },
        ),
        (
            Method::POST,
            "/collections/mem0/facet".to_owned(),
            Endpoint::Refused,
        ),
        (
            Method::POST,
            "/collections/mem0/snapshots".to_owned(),
            Endpoint::Refused,
        ),
        (Method::GET, "/cluster".to_owned(), Endpoint::Refused),
    ];
    for (method, path, want) in cases {
        assert_eq!(classify(&method, &path), want, "{method} {path}");
    }
}

#[test]
fn only_canonical_point_ids_pass() {
    assert_eq!(PointId::parse(&json!(7)), Some(PointId::Number(7)));
    assert_eq!(PointId::parse(&json!(U1)), Some(PointId::Uuid(U1.into())));
    for bad in [
        json!(-1),
        json!(1.5),
        json!("42"),
        json!(U1.to_uppercase()),
        json!(U1.replace('-', "")),
        json!(format!("{{{U1}}}")),
        json!(format!("urn:uuid:{U1}")),
        json!(null),
    ] {
        assert_eq!(PointId::parse(&bad), None, "{bad}");
    }
    assert_eq!(PointId::from_key("7"), Some(PointId::Number(7)));
    assert_eq!(
        PointId::from_key(&PointId::Uuid(U1.into()).key()),
        Some(PointId::Uuid(U1.into()))
    );
}

fn upsert(points: Value) -> Vec<u8> {
    json!({ "points": points }).to_string().into_bytes()
}

#[test]
fn an_upsert_is_decided_point_by_point_and_stamped() {
    let body = upsert(json!([
        { "id": 1, "vector": [0.1, 0.2], "payload": { "data": "likes tea" } },
        { "id": U1, "vector": [0.3, 0.4] },
    ]));
    let planned = plan_upsert(&body, &scope(Some("alice")), None).unwrap();
    check_upsert(&planned, "acme", &view(), now()).unwrap();
    let stamped = apply_upsert(planned, "acme", &view(), &BTreeMap::new(), now()).unwrap();
    let sent: Value = serde_json::from_slice(&stamped.body).unwrap();
    for point in sent["points"].as_array().unwrap() {
        let stamp = read_stamp(&point["payload"]).expect("stamped");
        assert_eq!(
            (stamp.tenant.as_str(), stamp.subject.as_str()),
            ("acme", "alice")
        );
        assert_eq!(stamp.expires_at, now() + TimeDelta::days(30));
    }
    assert_eq!(
        sent["points"][0]["payload"]["data"], "likes tea",
        "the client's payload stays"
    );
    assert_eq!(stamped.stamps.len(), 2);
}

/// What Qdrant holds under the ids of a write.
type HeldPoints = BTreeMap<PointId, Option<Stamp>>;

/// A refused upsert: what it is, its body, the caller's subject, what Qdrant holds, the code.
type RefusedCase = (
    &'static str,
    Vec<u8>,
    Option<&'static str>,
    HeldPoints,
    &'static str,
);

#[test]
fn an_upsert_refuses_what_the_policy_or_the_store_forbids() {
    let one = |payload: Value| upsert(json!([{ "id": 1, "vector": [0.1], "payload": payload }]));
    let refusal = |body: Vec<u8>, s: Option<&'static str>, held: HeldPoints| {
        let planned = plan_upsert(&body, &scope(s), None)?;
        check_upsert(&planned, "acme", &view(), now())?;
        apply_upsert(planned, "acme", &view(), &held, now()).map(|_| ())
    };
    let free = BTreeMap::new;
    let cases: [RefusedCase; 9] = [
        (
            "suppressed subject",
            one(json!({})),
            Some("carol"),
            free(),
            "subject_suppressed",
        ),
        (
            "no consent",
            one(json!({})),
            Some("erin"),
            free(),
            "consent_required",
        ),
        (
            "bound token names another subject",
            one(json!({ SUBJECT: "bob" })),
            Some("alice"),
            free(),
            "scope_violation",
        ),
        (
            "no subject at all",
            one(json!({})),
            None,
            free(),
            "missing_scope",
        ),
        (
            "another subject's point",
            one(json!({})),
            Some("alice"),
            BTreeMap::from([(
                PointId::Number(1),
                Some(fixtures::stamp("bob", now() + TimeDelta::days(1))),
            )]),
            "scope_violation",
        ),
        (
            "an unstamped point",
            one(json!({})),
            Some("alice"),
            BTreeMap::from([(PointId::Number(1), None)]),
            "unstamped_item",
        ),
        (
            "an expired point",
            one(json!({})),
            Some("alice"),
            BTreeMap::from([(
                PointId::Number(1),
                Some(fixtures::stamp("alice", now() - TimeDelta::days(1))),
            )]),
            "expired",
        ),
        (
            "a non-canonical id",
            upsert(json!([{ "id": U1.to_uppercase(), "vector": [0.1] }])),
            Some("alice"),
            free(),
            "invalid",
        ),
        (
            "one id twice",
            upsert(json!([{ "id": 1, "vector": [0.1] }, { "id": 1, "vector": [0.2] }])),
            Some("alice"),
            free(),
            "invalid",
        ),
    ];
    for (what, body, subject, held, want) in cases {
        assert_eq!(
            refusal(body, subject, held).map_err(code),
            Err(want),
            "{what}"
        );
    }
    let columnar = json!({ "batch": { "ids": [1], "vectors": [[0.1]] } }).to_string();
    assert_eq!(
        plan_upsert(columnar.as_bytes(), &scope(Some("alice")), None)
            .map_err(code)
            .err(),
        Some("invalid")
    );
    let unknown = json!({ "points": [{ "id": 1, "vector": [0.1] }], "shard_key": "a" }).to_string();
    assert_eq!(
        plan_upsert(unknown.as_bytes(), &scope(Some("alice")), None)
            .map_err(code)
            .err(),
        Some("invalid")
    );
}

#[test]
fn a_subject_field_names_the_subject_a_bound_token_still_decides() {
    let body = upsert(
        json!([{ "id": 1, "vector": [0.1], "payload": { "user_id": "alice", "data": "x" } }]),
    );
    let unbound = Scope {
        subject: None,
        bound: false,
        ..scope(None)
    };
    let planned = plan_upsert(&body, &unbound, Some("user_id")).unwrap();
    assert_eq!(planned.facts[0].subject, "alice");
    assert_eq!(
        plan_upsert(&body, &unbound, None).map_err(code).err(),
        Some("missing_scope"),
        "no field, no subject"
    );
    assert_eq!(
        plan_upsert(&body, &scope(Some("bob")), Some("user_id"))
            .map_err(code)
            .err(),
        Some("scope_violation")
    );
    let both = upsert(
        json!([{ "id": 1, "vector": [0.1], "payload": { "user_id": "alice", SUBJECT: "bob" } }]),
    );
    assert_eq!(
        plan_upsert(&both, &unbound, Some("user_id"))
            .map_err(code)
            .err(),
        Some("scope_violation")
    );
}

#[test]
fn a_point_of_ones_own_is_rewritten_with_its_earlier_deadline() {
    let held = BTreeMap::from([(
        PointId::Number(1),
        Some(fixtures::stamp("alice", now() + TimeDelta::days(2))),
    )]);
    let body = upsert(json!([{ "id": 1, "vector": [0.1] }]));
    let planned = plan_upsert(&body, &scope(Some("alice")), None).unwrap();
    let stamped = apply_upsert(planned, "acme", &view(), &held, now()).unwrap();
    assert_eq!(
        stamped.stamps[0].1.expires_at,
        now() + TimeDelta::days(2),
        "never later than before"
    );
}

#[test]
fn a_query_is_narrowed_at_the_top_and_in_every_prefetch() {
    let body = json!({
        "prefetch": [{ "query": [0.1, 0.2], "filter": { "should": [{ "key": "city", "match": { "value": "Berlin" } }] }, "limit": 10 }],
        "query": { "fusion": "rrf" },
        "limit": 3,
    })
    .to_string();
    let (narrowed, plan) =
        narrow_query_body(body.as_bytes(), "acme", Some("alice"), now()).unwrap();
    let sent: Value = serde_json::from_slice(&narrowed).unwrap();
    let scope = json!([
        { "key": TENANT, "match": { "value": "acme" } },
        { "key": SUBJECT, "match": { "value": "alice" } },
        { "key": EXPIRES_AT, "range": { "gt": now().timestamp() } },
    ]);
    assert_eq!(sent["filter"], json!({ "must": scope }));
    let inner = &sent["prefetch"][0]["filter"]["must"];
    assert_eq!(
        inner[0],
        json!({ "should": [{ "key": "city", "match": { "value": "Berlin" } }] }),
        "the client's filter, whole"
    );
    assert_eq!(
        inner.as_array().unwrap()[1..],
        scope.as_array().unwrap()[..]
    );
    assert_eq!(sent["with_payload"], true, "Lethe reads the stamps");
    assert_eq!(
        plan.payload,
        PayloadWanted::None,
        "and gives back no payload, as asked"
    );
}

#[test]
fn a_query_may_not_name_a_point_or_another_collection() {
    for body in [
        json!({ "query": 1 }),
        json!({ "query": { "nearest": U1 } }),
        json!({ "query": { "recommend": { "positive": [1] } } }),
        json!({ "query": [0.1], "lookup_from": { "collection": "other" } }),
        json!({ "prefetch": { "query": 7 }, "query": { "fusion": "rrf" } }),
        json!({ "query": [0.1], "filter": "all" }),
    ] {
        let text = body.to_string();
        assert_eq!(
            narrow_query_body(text.as_bytes(), "acme", None, now())
                .map_err(code)
                .err(),
            Some("invalid"),
            "{body}"
        );
    }
}

#[test]
fn answers_keep_only_readable_points_cut_to_the_payload_asked_for() {
    let point = |id: u64, payload: Value| json!({ "id": id, "score": 1.0, "payload": payload });
    let stamped = |s: &str, days: i64| {
        let mut p = Map::new();
        write_stamp(&mut p, &fixtures::stamp(s, now() + TimeDelta::days(days)));
        p.insert("data".into(), json!(format!("{s}'s note")));
        Value::Object(p)
    };
    let mut other_tenant = stamped("alice", 1);
    other_tenant[TENANT] = json!("globex");
    let answer = json!({ "result": { "points": [
        point(1, stamped("alice", 1)),
        point(2, stamped("carol", 1)),
        point(3, stamped("alice", -1)),
        point(4, json!({ "data": "unstamped" })),
        point(5, other_tenant),
        point(6, stamped("dave", 1)),
    ] }, "status": "ok" });
    let ctx = ReadContext {
        tenant: "acme",
        bound_subject: None,
        purpose: None,
    };
    let plan = ReadPlan {
        payload: PayloadWanted::Keys(vec!["data".into()]),
    };
    let kept = filter_points(answer, &plan, &view(), &ctx, now()).unwrap();
    let points = kept["result"]["points"].as_array().unwrap();
    assert_eq!(
        points
            .iter()
            .map(|p| p["id"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [1]
    );
    assert_eq!(points[0]["payload"], json!({ "data": "alice's note" }));
    let retrieved = json!({ "result": [point(1, stamped("alice", 1))] });
    let none = ReadPlan {
        payload: PayloadWanted::None,
    };
    let kept = filter_points(retrieved, &none, &view(), &ctx, now()).unwrap();
    assert_eq!(kept["result"], json!([{ "id": 1, "score": 1.0 }]));
}

#[test]
fn a_query_batch_is_narrowed_and_answered_query_by_query() {
    let body = json!({ "searches": [
        { "query": [0.1, 0.2], "limit": 2, "with_payload": true },
        { "query": [0.3, 0.4], "filter": { "must": [{ "key": "city", "match": { "value": "Oslo" } }] } },
    ] })
    .to_string();
    let (narrowed, plans) = narrow_query_batch_body(body.as_bytes(), "acme", None, now()).unwrap();
    let sent: Value = serde_json::from_slice(&narrowed).unwrap();
    for search in sent["searches"].as_array().unwrap() {
        assert!(
            search["filter"]["must"]
                .as_array()
                .unwrap()
                .contains(&json!({ "key": TENANT, "match": { "value": "acme" } }))
        );
        assert_eq!(search["with_payload"], true);
    }
    assert_eq!(
        plans.iter().map(|p| p.payload.clone()).collect::<Vec<_>>(),
        [PayloadWanted::All, PayloadWanted::None]
    );
    let mut alice = Map::new();
    write_stamp(
        &mut alice,
        &fixtures::stamp("alice", now() + TimeDelta::days(1)),
    );
    let mut carol = Map::new();
    write_stamp(
        &mut carol,
        &fixtures::stamp("carol", now() + TimeDelta::days(1)),
    );
    let answer = json!({ "result": [
        { "points": [{ "id": 1, "payload": alice.clone() }, { "id": 2, "payload": carol }] },
        { "points": [{ "id": 1, "payload": alice }] },
    ] });
    assert_eq!(
        subjects_in(&answer).len(),
        2,
        "the policy of every subject in every answer is loaded"
    );
    let ctx = ReadContext {
        tenant: "acme",
        bound_subject: None,
        purpose: None,
    };
    let kept = filter_batch(answer.clone(), &plans, &view(), &ctx, now()).unwrap();
    assert_eq!(
        kept["result"][0]["points"].as_array().unwrap().len(),
        1,
        "the suppressed subject's point goes"
    );
    assert_eq!(
        kept["result"][1]["points"],
        json!([{ "id": 1 }]),
        "no payload where none was asked"
    );
    assert_eq!(
        filter_batch(answer, &plans[..1], &view(), &ctx, now())
            .map_err(code)
            .err(),
        Some("upstream_invalid")
    );
    assert_eq!(
        narrow_query_batch_body(br#"{"searches": [{"query": 1}]}"#, "acme", None, now())
            .map_err(code)
            .err(),
        Some("invalid")
    );
}

#[test]
fn a_delete_names_points_or_a_filter_never_both() {
    assert_eq!(
        parse_delete(br#"{"points": [1, 2]}"#).unwrap().0,
        Some(vec![PointId::Number(1), PointId::Number(2)])
    );
    assert!(
        parse_delete(br#"{"filter": {"must": []}}"#)
            .unwrap()
            .1
            .is_some()
    );
    for body in [
        r#"{"points": [1], "filter": {}}"#,
        r#"{}"#,
        r#"{"points": ["X"]}"#,
    ] {
        assert_eq!(
            parse_delete(body.as_bytes()).map_err(code).err(),
            Some("invalid"),
            "{body}"
        );
    }
}

#[test]
fn a_retrieval_becomes_a_scroll_within_the_scope() {
    let (ids, payload, _) = parse_retrieve(br#"{"ids": [2, 1, 2], "with_payload": true}"#).unwrap();
    assert_eq!(ids, [PointId::Number(1), PointId::Number(2)]);
    assert_eq!(payload, PayloadWanted::All);
    let body = scoped_scroll(
        Selection {
            ids: Some(&ids),
            filter: None,
        },
        "acme",
        Some("alice"),
        Some(now()),
        2,
        None,
        &json!(false),
    )
    .unwrap();
    let sent: Value = serde_json::from_slice(&body).unwrap();
    let must = sent["filter"]["must"].as_array().unwrap();
    assert!(must.contains(&json!({ "has_id": [1, 2] })));
    assert!(must.contains(&json!({ "key": SUBJECT, "match": { "value": "alice" } })));
}

proptest! {
    #[test]
    fn arbitrary_bodies_never_panic(body in fixtures::arb_json(vec!["points", "id", "payload", "vector", "query", "prefetch",
        "filter", "must", "should", "nearest", "with_payload", "ids", "lethe_subject", "fusion"])) {
        let bytes = body.to_string().into_bytes();
        let _ = plan_upsert(&bytes, &scope(Some("alice")), Some("user_id"));
        let _ = narrow_query_body(&bytes, "acme", None, now());
        let _ = narrow_scroll_body(&bytes, "acme", None, now());
        let _ = parse_retrieve(&bytes);
        let _ = parse_delete(&bytes);
        let _ = parse_count(&bytes);
        let _ = narrow_query_batch_body(&bytes, "acme", None, now());
        let ctx = ReadContext { tenant: "acme", bound_subject: None, purpose: None };
        let _ = filter_points(body, &ReadPlan { payload: PayloadWanted::All }, &view(), &ctx, now());
    }
}
