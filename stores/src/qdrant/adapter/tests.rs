use chrono::TimeDelta;
use proptest::prelude::*;

use super::*;
use crate::kit::fixtures::{self, code, now, scope, view};
use crate::qdrant::adapter::read::{SearchKind, SearchShape};

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
            Endpoint::Search {
                collection: c("mem0"),
                shape: SearchShape {
                    kind: SearchKind::Query,
                    groups: false,
                },
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
        // Every search API, single, batch and groups; the matrix and facets.
        (
            Method::POST,
            "/collections/mem0/points/query/batch".to_owned(),
            Endpoint::SearchBatch {
                collection: c("mem0"),
                shape: SearchShape {
                    kind: SearchKind::Query,
                    groups: false,
                },
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/query/groups".to_owned(),
            Endpoint::Search {
                collection: c("mem0"),
                shape: SearchShape {
                    kind: SearchKind::Query,
                    groups: true,
                },
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/search".to_owned(),
            Endpoint::Search {
                collection: c("mem0"),
                shape: SearchShape {
                    kind: SearchKind::Search,
                    groups: false,
                },
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/search/batch".to_owned(),
            Endpoint::SearchBatch {
                collection: c("mem0"),
                shape: SearchShape {
                    kind: SearchKind::Search,
                    groups: false,
                },
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/search/groups".to_owned(),
            Endpoint::Search {
                collection: c("mem0"),
                shape: SearchShape {
                    kind: SearchKind::Search,
                    groups: true,
                },
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/recommend".to_owned(),
            Endpoint::Search {
                collection: c("mem0"),
                shape: SearchShape {
                    kind: SearchKind::Recommend,
                    groups: false,
                },
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/recommend/batch".to_owned(),
            Endpoint::SearchBatch {
                collection: c("mem0"),
                shape: SearchShape {
                    kind: SearchKind::Recommend,
                    groups: false,
                },
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/recommend/groups".to_owned(),
            Endpoint::Search {
                collection: c("mem0"),
                shape: SearchShape {
                    kind: SearchKind::Recommend,
                    groups: true,
                },
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/discover".to_owned(),
            Endpoint::Search {
                collection: c("mem0"),
                shape: SearchShape {
                    kind: SearchKind::Discover,
                    groups: false,
                },
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/discover/batch".to_owned(),
            Endpoint::SearchBatch {
                collection: c("mem0"),
                shape: SearchShape {
                    kind: SearchKind::Discover,
                    groups: false,
                },
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/discover/groups".to_owned(),
            Endpoint::Refused,
        ),
        (
            Method::POST,
            "/collections/mem0/points/search/matrix/pairs".to_owned(),
            Endpoint::Matrix {
                collection: c("mem0"),
                pairs: true,
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/search/matrix/offsets".to_owned(),
            Endpoint::Matrix {
                collection: c("mem0"),
                pairs: false,
            },
        ),
        (
            Method::POST,
            "/collections/mem0/points/search/matrix/rows".to_owned(),
            Endpoint::Refused,
        ),
        (
            Method::POST,
            "/collections/mem0/facet".to_owned(),
            Endpoint::Facet {
                collection: c("mem0"),
            },
        ),
        // Snapshots, shards, cluster: never on the data plane.
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
    // Held points are replaced only while they are still alice's and alive in acme.
    assert_eq!(
        sent["update_filter"],
        json!({ "must": [
            { "key": TENANT, "match": { "value": "acme" } },
            { "key": EXPIRES_AT, "range": { "gt": now().timestamp() } },
            { "key": SUBJECT, "match": { "any": ["alice"] } },
        ] })
    );
    // The client's own conditional filter stays, whole, beside them.
    let own = json!({ "points": [{ "id": 1, "vector": [0.1], "payload": {} }], "update_filter": { "must": [{ "key": "v", "range": { "lt": 3 } }] } });
    let planned = plan_upsert(own.to_string().as_bytes(), &scope(Some("alice")), None).unwrap();
    let sent: Value = serde_json::from_slice(
        &apply_upsert(planned, "acme", &view(), &BTreeMap::new(), now())
            .unwrap()
            .body,
    )
    .unwrap();
    assert_eq!(
        sent["update_filter"]["must"][0],
        json!({ "must": [{ "key": "v", "range": { "lt": 3 } }] })
    );
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
        let _ = narrow_scroll_body(&bytes, "acme", None, now());
        let _ = parse_retrieve(&bytes);
        let _ = parse_delete(&bytes);
        let _ = parse_count(&bytes);
    }
}

#[test]
fn with_payload_keys_are_read_as_qdrant_reads_them() {
    let mut point = json!({ "id": 1, "payload": {
        "a.b": 1, "a": { "b": 2, "c": 3 }, "tags": [{ "t": "x", "u": 1 }], "data": "note",
        "lethe_subject": "alice",
    } });
    let wanted = PayloadWanted::of(
        Some(&json!(["\"a.b\"", "a.c", "tags[].t", "\"data\""])),
        PayloadWanted::None,
    )
    .unwrap();
    if let Value::Object(p) = &mut point {
        wanted.cut(p);
    }
    assert_eq!(
        point["payload"],
        json!({ "a.b": 1, "a": { "c": 3 }, "tags": [{ "t": "x" }], "data": "note" })
    );
    for keys in [
        json!(["a b"]),
        json!(["\"data"]),
        json!([""]),
        json!(["a.."]),
    ] {
        assert_eq!(
            PayloadWanted::of(Some(&keys), PayloadWanted::None)
                .map_err(code)
                .err(),
            Some("invalid"),
            "{keys}"
        );
    }
}
