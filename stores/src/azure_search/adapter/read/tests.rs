use chrono::TimeDelta;
use lethe_policy::ReadContext;
use serde_json::{Value, json};

use super::*;
use crate::azure_search::adapter::stamp_fields;
use crate::kit::fixtures::{code, now, stamp, view};

const ALICE: Reader<'static> = Reader {
    tenant: "acme",
    subject: Some("alice"),
    purpose: None,
};

fn ctx(subject: Option<&'static str>) -> ReadContext<'static> {
    ReadContext {
        tenant: "acme",
        store: "azure_search",
        bound_subject: subject,
        purpose: None,
    }
}

fn doc(key: &str, subject: &str, text: &str) -> Value {
    let mut doc = stamp_fields(&stamp(subject, now() + TimeDelta::days(1)));
    doc.insert("id".into(), json!(key));
    doc.insert("text".into(), json!(text));
    doc.insert("@search.score".into(), json!(1.0));
    Value::Object(doc)
}

fn plan(kind: Kind, body: Value) -> Result<Read, &'static str> {
    let Value::Object(body) = body else { panic!() };
    plan_read(kind, body, ALICE, now()).map_err(code)
}

fn sent(read: &Read) -> Value {
    serde_json::from_slice(&read.body("id", read.filter())).unwrap()
}

#[test]
fn a_search_is_narrowed_and_its_answer_decided_again_in_score_order() {
    let read = plan(
        Kind::Search,
        json!({"search": "tea", "filter": "n gt 1 or true", "select": "text", "top": 2}),
    )
    .unwrap();
    let body = sent(&read);
    assert_eq!(
        body["filter"],
        "((n gt 1) or (true)) and (((lethe_tenant eq 'acme') and (lethe_subject eq 'alice')) and (lethe_expires_at gt 2027-01-15T08:00:00Z))"
    );
    assert_eq!(
        body["select"],
        "text,id,lethe_subject,lethe_tenant,lethe_purpose,lethe_category,lethe_expires_at,lethe_epoch,lethe_layer"
    );
    assert!(!read.computes_over_documents());
    let answer = json!({"value": [doc("a1", "alice", "x"), doc("c1", "carol", "y"), doc("a2", "alice", "z")],
        "@odata.nextLink": "https://azure/indexes('e')/docs?skip=2",
        "@odata.context": "https://azure/indexes('e')/$metadata#docs(*)",
        "@search.nextPageParameters": {"search": "tea", "filter": "(whatever Azure was sent)", "skip": 2, "top": 2}});
    let decided = read
        .decide(answer, "episodes", "id", &view(), &ctx(None), now())
        .unwrap();
    assert_eq!(
        decided["value"],
        json!([{"@search.score": 1.0, "text": "x"}, {"@search.score": 1.0, "text": "z"}]),
        "carol (suppressed) dropped; the stamp and the key, not selected, cut"
    );
    assert!(decided.get("@odata.nextLink").is_none());
    assert!(decided.get("@odata.context").is_none());
    assert_eq!(
        decided["@search.nextPageParameters"],
        json!({"search": "tea", "filter": "n gt 1 or true", "select": "text", "top": 2, "skip": 2}),
        "the next page is the client's own request: sent again, it is narrowed again"
    );
}

#[test]
fn counts_facets_and_terms_are_computed_over_what_the_caller_may_see() {
    for body in [json!({"count": true}), json!({"facets": ["mood,count:5"]})] {
        assert!(plan(Kind::Search, body).unwrap().computes_over_documents());
    }
    let read = plan(
        Kind::Autocomplete,
        json!({"search": "te", "suggesterName": "sg"}),
    )
    .unwrap();
    assert!(read.computes_over_documents());
    let body: Value = serde_json::from_slice(&read.body("id", "readable eq 1")).unwrap();
    assert_eq!(
        body["filter"], "readable eq 1",
        "the filter given, not the client's"
    );
    assert!(body.get("select").is_none(), "autocomplete selects nothing");
}

#[test]
fn suggest_reads_the_key_and_stamp_in_the_form_the_client_sent() {
    let read = plan(
        Kind::Suggest,
        json!({"search": "te", "suggesterName": "sg", "select": ["text"]}),
    )
    .unwrap();
    assert_eq!(sent(&read)["select"][0], "text");
    assert_eq!(sent(&read)["select"][1], "id");
    let read = plan(
        Kind::Suggest,
        json!({"search": "te", "suggesterName": "sg"}),
    )
    .unwrap();
    assert_eq!(
        sent(&read)["select"].as_str().unwrap().split(',').count(),
        8
    );
    let answer = json!({"value": [{"@search.text": "tea", "id": "a1", "lethe_tenant": "acme", "lethe_subject": "alice",
        "lethe_purpose": "personalization", "lethe_category": "preference", "lethe_expires_at": "2027-01-16T08:00:00Z", "lethe_epoch": 0}]});
    let decided = read
        .decide(
            answer,
            "episodes",
            "id",
            &view(),
            &ctx(Some("alice")),
            now(),
        )
        .unwrap();
    assert_eq!(
        decided["value"],
        json!([{"@search.text": "tea", "id": "a1"}]),
        "suggest answers the key by default"
    );
}

#[test]
fn a_request_naming_the_stamp_or_beyond_azures_keys_is_refused() {
    for body in [
        json!({"filter": "lethe_tenant ne 'acme'"}),
        json!({"filter": "search.ismatch('bob', 'lethe_subject')"}),
        json!({"filter": "(n gt 1"}),
        json!({"filter": "user eq 'x"}),
        json!({"filter": 7}),
        json!({"select": "text,lethe_subject"}),
        json!({"searchFields": "lethe_subject"}),
        json!({"orderby": "lethe_expires_at desc"}),
        json!({"orderby": "geo.distance(lethe_x, geography'POINT(0 0)')"}),
        json!({"facets": ["lethe_subject,count:50"]}),
        json!({"highlight": "text,lethe_subject"}),
        json!({"vectorQueries": [{"kind": "vector", "vector": [1.0], "fields": "lethe_v"}]}),
        json!({"vectorQueries": [{"kind": "vector", "vector": [1.0], "fields": "v", "filterOverride": "true"}]}),
        json!({"answers": "extractive"}),
        json!({"debug": "all"}),
        json!({"select": "te'xt"}),
    ] {
        assert_eq!(
            plan(Kind::Search, body.clone()).unwrap_err(),
            "invalid",
            "{body}"
        );
    }
    assert_eq!(
        plan(Kind::Suggest, json!({"count": true})).unwrap_err(),
        "invalid"
    );
}

#[test]
fn a_get_is_read_as_the_post_it_stands_for() {
    let body = body_of_query(
        Kind::Search,
        "api-version=2026-04-01&search=tea&%24filter=n%20gt%201&%24top=5&%24count=true&facet=mood",
    )
    .unwrap();
    assert_eq!(
        Value::Object(body),
        json!({"search": "tea", "filter": "n gt 1", "top": 5, "count": true, "facets": ["mood"]})
    );
    for bad in [
        "%24top=five",
        "%24count=yes",
        "answers=extractive",
        "suggesterName=sg",
    ] {
        assert!(body_of_query(Kind::Search, bad).is_err(), "{bad}");
    }
    assert!(body_of_query(Kind::Suggest, "search=te&suggesterName=sg&fuzzy=true").is_ok());
}

#[test]
fn a_lookup_reads_the_stamp_and_answers_only_what_was_selected() {
    let (sent, client) =
        lookup_select(Some("api-version=2026-04-01&%24select=text"), "id").unwrap();
    assert_eq!(
        sent.unwrap(),
        "text,id,lethe_subject,lethe_tenant,lethe_purpose,lethe_category,lethe_expires_at,lethe_epoch,lethe_layer"
    );
    let cut = cut_document(doc("a1", "alice", "x"), client.as_deref());
    assert_eq!(cut, json!({"@search.score": 1.0, "text": "x"}));
    assert_eq!(lookup_select(None, "id").unwrap(), (None, None));
    assert!(lookup_select(Some("%24select=lethe_subject"), "id").is_err());
    assert!(lookup_select(Some("%24expand=x"), "id").is_err());
    let whole = cut_document(doc("a1", "alice", "x"), None);
    assert!(
        whole
            .as_object()
            .unwrap()
            .keys()
            .all(|k| !k.starts_with("lethe_"))
    );
    assert_eq!(owners(&doc("a1", "alice", "x")).len(), 1);
}
