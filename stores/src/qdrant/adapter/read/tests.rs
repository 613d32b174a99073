use chrono::TimeDelta;
use proptest::prelude::*;
use serde_json::Map;

use super::*;
use crate::kit::fixtures::{self, code, now, view};
use crate::kit::stamp::{EXPIRES_AT, SUBJECT, TENANT, write_stamp};
use crate::qdrant::adapter::subjects_in;

const U1: &str = "0e5a1c3b-7f2d-4e8a-9b6c-1d2e3f4a5b6c";
const QUERY: SearchShape = SearchShape {
    kind: SearchKind::Query,
    groups: false,
};

fn refs_of(
    shape: SearchShape,
    body: Value,
) -> Result<Vec<(Option<String>, PointId)>, &'static str> {
    narrow_search_body(body.to_string().as_bytes(), shape, "acme", None, now())
        .map(|(_, plan)| plan.refs)
        .map_err(code)
}

#[test]
fn every_point_a_search_names_is_collected_to_be_decided_first() {
    let here = |id: u64| (None, PointId::Number(id));
    let search = |kind| SearchShape {
        kind,
        groups: false,
    };
    let cases = [
        (QUERY, json!({ "query": 1 }), vec![here(1)]),
        (
            QUERY,
            json!({ "query": { "nearest": U1 } }),
            vec![(None, PointId::Uuid(U1.into()))],
        ),
        (
            QUERY,
            json!({ "query": { "recommend": { "positive": [1, [0.1]], "negative": [2] } } }),
            vec![here(1), here(2)],
        ),
        (
            QUERY,
            json!({ "query": { "discover": { "target": 3, "context": [{ "positive": 4, "negative": [0.2] }] } } }),
            vec![here(3), here(4)],
        ),
        (
            QUERY,
            json!({ "query": { "context": { "positive": 5, "negative": 6 } } }),
            vec![here(5), here(6)],
        ),
        (
            QUERY,
            json!({ "query": 7, "lookup_from": { "collection": "other", "vector": "v" } }),
            vec![(Some("other".into()), PointId::Number(7))],
        ),
        (
            QUERY,
            json!({ "prefetch": { "query": 8 }, "query": { "fusion": "rrf" } }),
            vec![here(8)],
        ),
        (
            QUERY,
            json!({ "query": { "order_by": "created_at" } }),
            vec![],
        ),
        (QUERY, json!({ "query": { "sample": "random" } }), vec![]),
        (
            QUERY,
            json!({ "prefetch": { "query": [0.1] }, "query": { "formula": { "sum": ["$score", 1] } } }),
            vec![],
        ),
        (
            search(SearchKind::Recommend),
            json!({ "positive": [9], "negative": [[0.1]], "limit": 3 }),
            vec![here(9)],
        ),
        (
            search(SearchKind::Discover),
            json!({ "target": 10, "context": [{ "positive": 11, "negative": 12 }], "limit": 3 }),
            vec![here(10), here(11), here(12)],
        ),
        (
            search(SearchKind::Search),
            json!({ "vector": { "name": "dense", "vector": [0.1] }, "limit": 3 }),
            vec![],
        ),
    ];
    for (shape, body, want) in cases {
        assert_eq!(refs_of(shape, body.clone()), Ok(want), "{body}");
    }
}

#[test]
fn what_a_search_cannot_be_decided_on_is_refused() {
    let groups = SearchShape {
        kind: SearchKind::Query,
        groups: true,
    };
    let cases = [
        (QUERY, json!({ "query": "1" })),
        (QUERY, json!({ "query": U1.to_uppercase() })),
        (
            QUERY,
            json!({ "query": { "text": "tea", "model": "bm25" } }),
        ),
        (
            QUERY,
            json!({ "query": [0.1], "lookup_from": { "collection": "../x" } }),
        ),
        (QUERY, json!({ "query": [0.1], "filter": "all" })),
        (QUERY, json!({ "query": [0.1], "shard_key": "a" })),
        (
            QUERY,
            json!({ "query": { "nearest": [0.1], "recommend": {} } }),
        ),
        (
            groups,
            json!({ "query": [0.1], "group_by": "k", "offset": 2 }),
        ),
        (
            groups,
            json!({ "query": [0.1], "group_by": "k", "with_lookup": "../x" }),
        ),
        (
            SearchShape {
                kind: SearchKind::Search,
                groups: false,
            },
            json!({ "vector": 1, "limit": 1 }),
        ),
    ];
    for (shape, body) in cases {
        assert_eq!(
            refs_of(shape, body.clone()).err(),
            Some("invalid"),
            "{body}"
        );
    }
}

fn stamped(s: &str, days: i64) -> Value {
    let mut p = Map::new();
    write_stamp(&mut p, &fixtures::stamp(s, now() + TimeDelta::days(days)));
    p.insert("data".into(), json!(format!("{s}'s note")));
    Value::Object(p)
}

fn reader() -> ReadContext<'static> {
    ReadContext {
        tenant: "acme",
        store: "qdrant",
        bound_subject: None,
        purpose: None,
    }
}

#[test]
fn groups_keep_readable_hits_and_lookups_only() {
    let body = json!({ "query": [0.1], "group_by": "topic", "group_size": 2, "with_lookup": { "collection": "topics", "with_payload": ["title"] } });
    let (sent, plan) = narrow_search_body(
        body.to_string().as_bytes(),
        SearchShape {
            kind: SearchKind::Query,
            groups: true,
        },
        "acme",
        None,
        now(),
    )
    .unwrap();
    let sent: Value = serde_json::from_slice(&sent).unwrap();
    assert_eq!(
        sent["with_lookup"],
        json!({ "collection": "topics", "with_payload": true, "with_vectors": false })
    );
    let mut topic = stamped("alice", 1);
    topic["title"] = json!("tea");
    let answer = json!({ "result": { "groups": [
        { "id": "tea", "hits": [{ "id": 1, "payload": stamped("alice", 1) }, { "id": 2, "payload": stamped("carol", 1) }], "lookup": { "id": 1, "payload": topic } },
        { "id": "cake", "hits": [{ "id": 3, "payload": stamped("carol", 1) }], "lookup": { "id": 3, "payload": stamped("carol", 1) } },
        { "id": "rum", "hits": [{ "id": 4, "payload": stamped("alice", 1) }], "lookup": { "id": 4, "payload": stamped("bob", -1) } },
    ] } });
    let kept = decide_answer(answer, &plan, &view(), &reader(), now()).unwrap();
    let groups = kept["result"]["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "a group with no readable hit is gone");
    assert_eq!(groups[0]["hits"], json!([{ "id": 1 }]));
    assert_eq!(
        groups[0]["lookup"],
        json!({ "id": 1, "payload": { "title": "tea" } })
    );
    assert!(
        groups[1].get("lookup").is_none(),
        "an expired lookup is dropped"
    );
}

#[test]
fn older_batches_answer_lists_of_points() {
    let search = SearchShape {
        kind: SearchKind::Search,
        groups: false,
    };
    let body = json!({ "searches": [{ "vector": [0.1], "limit": 2, "with_payload": true }, { "vector": [0.2], "limit": 2 }] });
    let (_, plans) =
        narrow_search_batch_body(body.to_string().as_bytes(), search, "acme", None, now()).unwrap();
    let answer = json!({ "result": [
        [{ "id": 1, "payload": stamped("alice", 1) }, { "id": 2, "payload": stamped("carol", 1) }],
        [{ "id": 1, "payload": stamped("alice", 1) }],
    ] });
    let kept = decide_batch(answer, &plans, &view(), &reader(), now()).unwrap();
    assert_eq!(kept["result"][0].as_array().unwrap().len(), 1);
    assert_eq!(kept["result"][1], json!([{ "id": 1 }]));
}

#[test]
fn a_matrix_keeps_only_readable_points_and_reindexes_offsets() {
    let readable = std::collections::BTreeSet::from([PointId::Number(1), PointId::Number(3)]);
    let pairs = json!({ "result": { "pairs": [{ "a": 1, "b": 2, "score": 0.5 }, { "a": 1, "b": 3, "score": 0.9 }] } });
    assert_eq!(
        matrix_ids(&pairs),
        vec![PointId::Number(1), PointId::Number(2), PointId::Number(3)]
    );
    assert_eq!(
        keep_matrix(pairs, &readable).unwrap()["result"]["pairs"],
        json!([{ "a": 1, "b": 3, "score": 0.9 }])
    );
    let offsets = json!({ "result": { "ids": [1, 2, 3], "offsets_row": [0, 0, 1, 2], "offsets_col": [1, 2, 2, 0], "scores": [0.1, 0.2, 0.3, 0.4] } });
    assert_eq!(
        keep_matrix(offsets, &readable).unwrap()["result"],
        json!({ "ids": [1, 3], "offsets_row": [0, 1], "offsets_col": [1, 0], "scores": [0.2, 0.4] })
    );
    let narrowed: Value = serde_json::from_slice(
        &narrow_matrix_body(br#"{"sample": 10, "limit": 2}"#, "acme", None, now()).unwrap(),
    )
    .unwrap();
    assert!(
        narrowed["filter"]["must"]
            .as_array()
            .unwrap()
            .contains(&json!({ "key": TENANT, "match": { "value": "acme" } }))
    );
}

#[test]
fn facets_count_the_values_of_the_points_given() {
    let point = |v: Value| json!({ "id": 1, "payload": { "meta": { "topic": v } } });
    let points = [
        point(json!("tea")),
        point(json!(["tea", "cake", "tea"])),
        point(json!(7)),
        point(json!(null)),
    ];
    assert_eq!(
        facet_hits(&points, "meta.topic", 2),
        json!({ "hits": [{ "value": "tea", "count": 2 }, { "value": "cake", "count": 1 }] })
    );
    assert_eq!(
        parse_facet(br#"{"key": "k", "limit": 3, "exact": true}"#).unwrap(),
        ("k".into(), None, 3)
    );
    assert_eq!(
        parse_facet(br#"{"key": "k", "shard_key": "s"}"#)
            .map_err(code)
            .err(),
        Some("invalid")
    );
}

proptest! {
    #[test]
    fn arbitrary_searches_never_panic(body in fixtures::arb_json(vec!["query", "prefetch", "filter", "must", "nearest",
        "with_payload", "recommend", "positive", "negative", "target", "context", "lookup_from", "collection", "groups",
        "hits", "lookup", "with_lookup", "searches", "result", "points", "fusion"])) {
        let bytes = body.to_string().into_bytes();
        for kind in [SearchKind::Query, SearchKind::Search, SearchKind::Recommend, SearchKind::Discover] {
            for groups in [false, true] {
                let shape = SearchShape { kind, groups };
                let _ = narrow_search_body(&bytes, shape, "acme", None, now());
                let _ = narrow_search_batch_body(&bytes, shape, "acme", None, now());
            }
        }
        let _ = decide_answer(body.clone(), &ReadPlan { payload: PayloadWanted::All, lookup: Some(PayloadWanted::All), ..ReadPlan::default() }, &view(), &reader(), now());
        let _ = decide_batch(body.clone(), &[ReadPlan::default()], &view(), &reader(), now());
        let _ = keep_matrix(body.clone(), &Default::default());
        let _ = facet_hits(std::slice::from_ref(&body), "a.b", 3);
    }
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
        narrow_search_body(body.as_bytes(), QUERY, "acme", Some("alice"), now()).unwrap();
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
        store: "qdrant",
        bound_subject: None,
        purpose: None,
    };
    let plan = ReadPlan {
        payload: PayloadWanted::Keys(vec!["data".into()]),
        ..ReadPlan::default()
    };
    let kept = decide_answer(answer, &plan, &view(), &ctx, now()).unwrap();
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
    let none = ReadPlan::default();
    let kept = decide_answer(retrieved, &none, &view(), &ctx, now()).unwrap();
    assert_eq!(kept["result"], json!([{ "id": 1, "score": 1.0 }]));
}

#[test]
fn a_query_batch_is_narrowed_and_answered_query_by_query() {
    let body = json!({ "searches": [
        { "query": [0.1, 0.2], "limit": 2, "with_payload": true },
        { "query": [0.3, 0.4], "filter": { "must": [{ "key": "city", "match": { "value": "Oslo" } }] } },
    ] })
    .to_string();
    let (narrowed, plans) =
        narrow_search_batch_body(body.as_bytes(), QUERY, "acme", None, now()).unwrap();
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
        store: "qdrant",
        bound_subject: None,
        purpose: None,
    };
    let kept = decide_batch(answer.clone(), &plans, &view(), &ctx, now()).unwrap();
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
        decide_batch(answer, &plans[..1], &view(), &ctx, now())
            .map_err(code)
            .err(),
        Some("upstream_invalid")
    );
    assert_eq!(
        narrow_search_batch_body(
            br#"{"searches": [{"query": "1"}]}"#,
            QUERY,
            "acme",
            None,
            now()
        )
        .map_err(code)
        .err(),
        Some("invalid")
    );
}

#[test]
fn facet_keys_are_read_as_qdrant_reads_them() {
    let point = json!({ "id": 1, "payload": {
        "a.b": "quoted", "a": { "b": "nested" }, "t": [{ "k": "x" }, { "k": "y" }],
    } });
    let hits = |key: &str| facet_hits(std::slice::from_ref(&point), key, 10)["hits"].clone();
    assert_eq!(hits("\"a.b\""), json!([{ "value": "quoted", "count": 1 }]));
    assert_eq!(hits("a.b"), json!([{ "value": "nested", "count": 1 }]));
    assert_eq!(
        hits("t[].k"),
        json!([{ "value": "x", "count": 1 }, { "value": "y", "count": 1 }])
    );
    for key in ["a b", "\"a", "a..b", ""] {
        let body = json!({ "key": key }).to_string();
        assert_eq!(
            parse_facet(body.as_bytes()).map_err(code).err(),
            Some("invalid"),
            "{key:?}"
        );
    }
}
