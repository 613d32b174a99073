use std::collections::BTreeMap;

use chrono::TimeDelta;
use serde_json::{Value, json};

use super::*;
use crate::azure_search::adapter::read_stamp;
use crate::kit::fixtures::{code, now, scope, stamp, view};

fn batch(actions: Value) -> Vec<u8> {
    json!({ "value": actions }).to_string().into_bytes()
}

fn plan(actions: Value, subject: Option<&'static str>) -> Result<PlannedBatch, AdapterError> {
    plan_batch(&batch(actions), "id", &scope(subject), None)
}

fn decide(
    actions: Value,
    subject: Option<&'static str>,
    held: &BTreeMap<String, Option<Stamp>>,
) -> Result<DecidedBatch, &'static str> {
    let planned = plan(actions, subject).map_err(code)?;
    decide_batch(planned, &scope(subject), &view(), held, now()).map_err(code)
}

fn sent(decided: &DecidedBatch) -> Vec<Value> {
    let body: Value = serde_json::from_slice(decided.body.as_ref().unwrap()).unwrap();
    body["value"].as_array().unwrap().clone()
}

#[test]
fn every_write_is_stamped_and_the_clients_stamp_fields_replaced() {
    let decided = decide(
        json!([
            {"@search.action": "upload", "id": "e1", "text": "likes tea", "lethe_tenant": "globex", "lethe_epoch": 9},
            {"@search.action": "mergeOrUpload", "id": "e2", "text": "green"},
            {"id": "e3", "text": "no action named: an upload"},
        ]),
        Some("alice"),
        &BTreeMap::new(),
    )
    .unwrap();
    let docs = sent(&decided);
    assert_eq!(docs.len(), 3);
    for doc in &docs {
        let stamp = read_stamp(doc).unwrap();
        assert_eq!(
            (stamp.tenant.as_str(), stamp.subject.as_str(), stamp.epoch),
            ("acme", "alice", 0)
        );
        assert_eq!(
            doc["lethe_expires_at"], "2027-02-14T08:00:00Z",
            "30 days, as an Edm.DateTimeOffset"
        );
    }
    assert_eq!(docs[2]["@search.action"], "upload");
    assert_eq!(decided.stamps.len(), 3);
    let (status, answer) = batch_answer(
        &decided.order,
        Some(&json!({"value": [
            {"key": "e3", "status": true, "errorMessage": null, "statusCode": 201},
            {"key": "e1", "status": true, "errorMessage": null, "statusCode": 201},
            {"key": "e2", "status": false, "errorMessage": "x", "statusCode": 422},
        ]})),
    )
    .unwrap();
    assert_eq!(status, 207);
    let keys: Vec<&str> = answer["value"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["e1", "e2", "e3"], "in the client's order");
}

#[test]
fn the_subject_comes_from_the_request_the_stamp_fields_or_the_subject_field() {
    let unbound = Scope {
        bound: false,
        ..scope(None)
    };
    let body = batch(json!([
        {"id": "e1", "user_id": "bob", "text": "x"},
        {"id": "e2", "lethe_subject": "alice", "lethe_expires_at": "2027-01-20T00:00:00Z"},
    ]));
    let planned = plan_batch(&body, "id", &unbound, Some("user_id")).unwrap();
    let subjects: Vec<&str> = planned.facts.iter().map(|f| f.subject.as_str()).collect();
    assert_eq!(subjects, ["bob", "alice"]);
    assert_eq!(
        planned.facts[1].requested_expires_at.unwrap().to_rfc3339(),
        "2027-01-20T00:00:00+00:00"
    );
    // A bound token's batch naming another subject, in either place, is a scope violation,
    // answered per action.
    for other in [
        json!({"id": "e1", "user_id": "bob"}),
        json!({"id": "e1", "lethe_subject": "bob"}),
    ] {
        let planned = plan_batch(
            &batch(json!([{"id": "e0"}, other])),
            "id",
            &scope(Some("alice")),
            Some("user_id"),
        );
        let refused = planned.unwrap().refused;
        assert_eq!(
            (refused[0].index, refused[0].refusal.code()),
            (1, "scope_violation")
        );
    }
    let missing = plan_batch(
        &batch(json!([{"id": "e1"}])),
        "id",
        &unbound,
        Some("user_id"),
    );
    assert_eq!(missing.map_err(code).unwrap_err(), "missing_scope");
}

#[test]
fn one_refused_action_refuses_the_batch_with_each_actions_index() {
    let held = BTreeMap::from([(
        "theirs".to_owned(),
        Some(stamp("bob", now() + TimeDelta::days(1))),
    )]);
    let planned = plan(
        json!([{"id": "mine", "text": "a"}, {"id": "theirs", "text": "b"}]),
        Some("alice"),
    )
    .unwrap();
    let keys = planned.keys();
    let Err(AdapterError::Refused(refused)) =
        decide_batch(planned, &scope(Some("alice")), &view(), &held, now())
    else {
        panic!("refused");
    };
    assert_eq!(
        (refused[0].index, refused[0].refusal.code()),
        (1, "scope_violation")
    );
    let answer = refused_answer(&keys, &refused);
    assert_eq!(answer["value"][0]["statusCode"], 400);
    assert_eq!(answer["value"][1]["statusCode"], 403);
    assert!(
        answer["value"][1]["errorMessage"]
            .as_str()
            .unwrap()
            .starts_with("lethe scope_violation")
    );
    // Never consented (erin), suppressed (carol): refused.
    assert_eq!(
        decide(json!([{"id": "e1"}]), Some("erin"), &BTreeMap::new()).unwrap_err(),
        "consent_required"
    );
    assert_eq!(
        decide(json!([{"id": "e1"}]), Some("carol"), &BTreeMap::new()).unwrap_err(),
        "subject_suppressed"
    );
}

#[test]
fn a_delete_reaches_only_the_callers_own_documents() {
    let later = now() + TimeDelta::days(1);
    let other_tenant = Stamp {
        tenant: "globex".into(),
        ..stamp("alice", later)
    };
    let held = BTreeMap::from([
        ("mine".to_owned(), Some(stamp("alice", later))),
        ("bobs".to_owned(), Some(stamp("bob", later))),
        ("globex".to_owned(), Some(other_tenant)),
        ("unstamped".to_owned(), None),
    ]);
    let deletes = json!([
        {"@search.action": "delete", "id": "mine"},
        {"@search.action": "delete", "id": "bobs"},
        {"@search.action": "delete", "id": "globex"},
        {"@search.action": "delete", "id": "unstamped"},
        {"@search.action": "delete", "id": "absent"},
    ]);
    let decided = decide(deletes.clone(), Some("alice"), &held).unwrap();
    assert_eq!(decided.deleted, ["mine"]);
    assert_eq!(
        sent(&decided),
        [json!({"@search.action": "delete", "id": "mine"})]
    );
    let (status, answer) = batch_answer(
        &decided.order,
        Some(&json!({"value": [{"key": "mine", "status": true, "errorMessage": null, "statusCode": 200}]})),
    )
    .unwrap();
    assert_eq!(
        status, 200,
        "the others answered as Azure answers a key it does not hold"
    );
    assert_eq!(answer["value"].as_array().unwrap().len(), 5);
    // A service of the tenant (no subject) reaches every subject of it, never another tenant.
    let service = Scope {
        subject: None,
        bound: false,
        ..scope(None)
    };
    let planned = plan_batch(&batch(deletes), "id", &service, None).unwrap();
    let decided = decide_batch(planned, &service, &view(), &held, now()).unwrap();
    assert_eq!(decided.deleted, ["mine", "bobs"]);
}

#[test]
fn malformed_batches_are_refused_whole() {
    let many: Vec<Value> = (0..1001).map(|i| json!({"id": format!("k{i}")})).collect();
    for bad in [
        json!([]),
        Value::Array(many),
        json!([{"id": "a'b"}]),
        json!([{"id": "_a"}]),
        json!([{"id": 7}]),
        json!([{"text": "no key"}]),
        json!([{"id": "a"}, {"id": "a"}]),
        json!([{"@search.action": "drop", "id": "a"}]),
        json!([{"@odata.type": "x", "id": "a"}]),
        json!([{"id": "a", "lethe_expires_at": "tomorrow"}]),
        json!(["not an action"]),
    ] {
        assert_eq!(
            plan(bad.clone(), Some("alice")).map_err(code).unwrap_err(),
            "invalid",
            "{bad}"
        );
    }
    assert!(
        plan_batch(
            b"{\"value\": [], \"x\": 1}",
            "id",
            &scope(Some("alice")),
            None
        )
        .is_err()
    );
    assert!(
        batch_answer(&[("k".into(), true)], Some(&json!({"value": []}))).is_err(),
        "Azure must answer every key sent"
    );
}

#[test]
fn an_overtaken_batch_answers_what_was_undone_as_refused() {
    let answer = json!({"value": [
        {"key": "a", "status": true, "errorMessage": null, "statusCode": 201},
        {"key": "b", "status": true, "errorMessage": null, "statusCode": 201},
    ]});
    let (status, answer) = overtaken(
        answer,
        &["b".to_owned()],
        "subject_suppressed",
        "the subject is under erasure",
    );
    assert_eq!(status, 207);
    assert_eq!(answer["value"][0]["statusCode"], 201);
    assert_eq!(answer["value"][1]["statusCode"], 403);
    assert!(
        answer["value"][1]["errorMessage"]
            .as_str()
            .unwrap()
            .starts_with("lethe subject_suppressed")
    );
}
