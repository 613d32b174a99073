use chrono::TimeDelta;
use proptest::prelude::*;

use super::*;
use crate::kit::fixtures::{code, now, scope, stamp, view};
use crate::kit::stamp::{EXPIRES_AT, SUBJECT};

fn edit(kind: EditKind, body: Value) -> Result<Op, AdapterError> {
    parse_edit(kind, body.to_string().as_bytes(), Some("user_id"))
}

fn batch_of(body: Value) -> Result<Vec<Op>, AdapterError> {
    parse_batch(body.to_string().as_bytes(), &scope(None), Some("user_id"))
}

/// Points 1 (alice, expiring in 10 days), 2 (bob), 3 (carol, suppressed), 4 (dave, store only),
/// 5 (alice, expired).
fn before() -> Before {
    let soon = now() + TimeDelta::days(10);
    Before {
        visible: BTreeMap::from([
            (PointId::Number(1), stamp("alice", soon)),
            (PointId::Number(2), stamp("bob", soon)),
            (PointId::Number(3), stamp("carol", soon)),
            (PointId::Number(4), stamp("dave", soon)),
            (
                PointId::Number(5),
                stamp("alice", now() - TimeDelta::days(1)),
            ),
        ]),
        ..Before::default()
    }
}

fn build(
    ops: Vec<Op>,
    before: &Before,
    single: bool,
) -> Result<Result<Batch, NotFound>, AdapterError> {
    build_batch(
        ops,
        before,
        &scope(None),
        Some("user_id"),
        single,
        &view(),
        now(),
    )
}

fn built(ops: Vec<Op>, single: bool) -> Batch {
    build(ops, &before(), single).unwrap().unwrap()
}

#[test]
fn edits_that_touch_the_stamp_or_their_selection_are_refused_before_anything_is_read() {
    let cases = [
        (
            EditKind::SetPayload,
            json!({ "payload": { "lethe_subject": "bob" }, "points": [1] }),
        ),
        (
            EditKind::SetPayload,
            json!({ "payload": { "a": 1 }, "points": [1], "key": "lethe_tenant" }),
        ),
        (
            EditKind::SetPayload,
            json!({ "payload": { "a": 1 }, "points": [1], "key": "user_id" }),
        ),
        (
            EditKind::SetPayload,
            json!({ "payload": { "a": 1 }, "points": [1], "key": "user_id.name" }),
        ),
        (
            EditKind::SetPayload,
            json!({ "payload": { "a": 1 }, "points": [1], "filter": {} }),
        ),
        (EditKind::SetPayload, json!({ "payload": { "a": 1 } })),
        (
            EditKind::SetPayload,
            json!({ "payload": { "a": 1 }, "points": [1], "shard_key": "s" }),
        ),
        (
            EditKind::SetPayload,
            json!({ "payload": { "a": 1 }, "points": ["0E5A1C3B-7F2D-4E8A-9B6C-1D2E3F4A5B6C"] }),
        ),
        (
            EditKind::OverwritePayload,
            json!({ "payload": { "lethe_epoch": 9 }, "points": [1] }),
        ),
        (
            EditKind::OverwritePayload,
            json!({ "payload": { "a": 1 }, "points": [1], "key": "a" }),
        ),
        (
            EditKind::DeletePayload,
            json!({ "keys": ["lethe_expires_at"], "points": [1] }),
        ),
        (
            EditKind::DeletePayload,
            json!({ "keys": [1], "points": [1] }),
        ),
        (EditKind::ClearPayload, json!({ "points": [-1] })),
        (
            EditKind::UpdateVectors,
            json!({ "points": [{ "id": 1, "vector": [1.0], "payload": {} }] }),
        ),
        (
            EditKind::UpdateVectors,
            json!({ "points": [{ "id": 1, "vector": [1.0] }, { "id": 1, "vector": [2.0] }] }),
        ),
        (EditKind::DeleteVectors, json!({ "points": [1] })),
    ];
    for (kind, body) in cases {
        assert_eq!(
            edit(kind, body.clone()).map(|_| ()).map_err(code),
            Err("invalid"),
            "{kind:?} {body}"
        );
    }
}

#[test]
fn batches_name_known_operations_and_select_by_filter_only_first() {
    let refused = [
        json!({ "operations": [] }),
        json!({ "operations": [{ "upsert": { "points": [] }, "delete": { "points": [1] } }] }),
        json!({ "operations": [{ "snapshot": {} }] }),
        json!({ "operations": [{ "delete": { "points": [1] } }, { "clear_payload": { "filter": {} } }] }),
        json!({ "operations": [{ "set_payload": { "payload": { "lethe_subject": "x" }, "points": [1] } }] }),
        json!({ "operations": [{ "delete": { "points": [1] } }], "ordering": "strong" }),
    ];
    for body in refused {
        assert_eq!(
            batch_of(body.clone()).map(|_| ()).map_err(code),
            Err("invalid"),
            "{body}"
        );
    }
    let ops = batch_of(json!({ "operations": [
        { "delete": { "filter": { "must": [] } } },
        { "upsert": { "points": [{ "id": 9, "vector": [1.0], "payload": { "user_id": "alice" } }] } },
        { "delete_vectors": { "points": [9], "vector": ["bm25"] } },
    ] }))
    .unwrap();
    assert_eq!(ops.len(), 3);
    assert!(ops[0].filter().is_some());
    assert_eq!(ops[1].named_ids(), vec![PointId::Number(9)]);
}

/// The ids an operation selects, and the owner it requires of them (`None`: by id alone).
fn selects(operation: &Value) -> (Vec<Value>, Option<(Value, Value)>) {
    let (_, body) = operation.as_object().and_then(|o| o.iter().next()).unwrap();
    match body.get("filter") {
        Some(filter) => {
            let must = filter["must"].as_array().unwrap();
            let ids = must[0]["has_id"].as_array().unwrap().clone();
            (
                ids,
                Some((
                    must[1]["match"]["value"].clone(),
                    must[2]["match"]["value"].clone(),
                )),
            )
        }
        None => (body["points"].as_array().unwrap().clone(), None),
    }
}

#[test]
fn a_payload_edit_is_sent_to_each_owners_points_with_its_stamp() {
    let op = edit(
        EditKind::SetPayload,
        json!({ "payload": { "data": "new" }, "points": [1, 4] }),
    )
    .unwrap();
    let batch = built(vec![op], true);
    // One operation per stamp: alice's point, then dave's.
    assert_eq!(batch.ranges, vec![0..2]);
    let alice = &batch.operations[0]["set_payload"];
    assert_eq!(alice["payload"]["data"], json!("new"));
    assert_eq!(alice["payload"][SUBJECT], json!("alice"));
    // Retention counts from the first write: the stamp keeps its earlier expiry.
    assert_eq!(
        alice["payload"][EXPIRES_AT],
        json!((now() + TimeDelta::days(10)).timestamp())
    );
    // Sent only to the point while it still has the owner it was decided on.
    assert_eq!(
        selects(&batch.operations[0]),
        (vec![json!(1)], Some((json!("acme"), json!("alice"))))
    );
    assert_eq!(
        selects(&batch.operations[1]),
        (vec![json!(4)], Some((json!("acme"), json!("dave"))))
    );
    let subjects: Vec<&str> = batch
        .written
        .iter()
        .map(|(_, s)| s.subject.as_str())
        .collect();
    assert_eq!(subjects, vec!["alice", "dave"]);
}

#[test]
fn every_edit_keeps_the_stamp_and_reaches_only_the_decided_owner() {
    for (kind, body, sent) in [
        (
            EditKind::OverwritePayload,
            json!({ "payload": { "data": "x" }, "points": [1] }),
            vec!["overwrite_payload"],
        ),
        (
            EditKind::ClearPayload,
            json!({ "points": [1] }),
            vec!["overwrite_payload"],
        ),
        (
            EditKind::SetPayload,
            json!({ "payload": { "a": 1 }, "key": "meta", "points": [1] }),
            vec!["set_payload", "set_payload"],
        ),
        (
            EditKind::DeletePayload,
            json!({ "keys": ["data"], "points": [1] }),
            vec!["delete_payload", "set_payload"],
        ),
        (
            EditKind::DeleteVectors,
            json!({ "points": [1], "vector": ["bm25"] }),
            vec!["delete_vectors", "set_payload"],
        ),
    ] {
        let batch = built(vec![edit(kind, body).unwrap()], true);
        let names: Vec<&str> = batch
            .operations
            .iter()
            .map(|o| o.as_object().unwrap().keys().next().unwrap().as_str())
            .collect();
        assert_eq!(names, sent, "{kind:?}");
        for operation in &batch.operations {
            assert_eq!(
                selects(operation),
                (vec![json!(1)], Some((json!("acme"), json!("alice")))),
                "{kind:?}"
            );
        }
        let last = batch.operations.last().unwrap();
        let (_, written) = last.as_object().and_then(|o| o.iter().next()).unwrap();
        assert_eq!(written["payload"][SUBJECT], json!("alice"), "{kind:?}");
    }
    // A vector update carries the owner in its update_filter, beside the client's own.
    let op = edit(
        EditKind::UpdateVectors,
        json!({ "points": [{ "id": 1, "vector": [0.5] }], "update_filter": { "must": [{ "key": "v", "match": { "value": 1 } }] } }),
    )
    .unwrap();
    let batch = built(vec![op], true);
    let update = &batch.operations[0]["update_vectors"];
    assert_eq!(update["points"], json!([{ "id": 1, "vector": [0.5] }]));
    let must = update["update_filter"]["must"].as_array().unwrap();
    assert_eq!(
        must[0],
        json!({ "must": [{ "key": "v", "match": { "value": 1 } }] })
    );
    assert!(must.contains(&json!({ "key": SUBJECT, "match": { "value": "alice" } })));
    assert_eq!(
        batch.operations[1]["set_payload"]["payload"][SUBJECT],
        json!("alice")
    );
}

#[test]
fn edits_are_decided_as_writes_over_the_stamp() {
    let cases = [
        // Unreadable or missing points are not found, whatever the reason.
        (json!({ "payload": { "a": 1 }, "points": [7] }), "not_found"),
        (
            json!({ "payload": { "a": 1 }, "points": [1, 7] }),
            "not_found",
        ),
        (
            json!({ "payload": { "a": 1 }, "points": [3] }),
            "subject_suppressed",
        ),
        (json!({ "payload": { "a": 1 }, "points": [5] }), "expired"),
        // The payload key naming the subject must name the owner.
        (
            json!({ "payload": { "user_id": "bob" }, "points": [1] }),
            "scope_violation",
        ),
        (
            json!({ "payload": { "user_id": 7 }, "points": [1] }),
            "scope_violation",
        ),
        (
            json!({ "payload": { "user_id": "alice" }, "points": [1] }),
            "ok",
        ),
        // Dave may store, so his points may be edited.
        (json!({ "payload": { "a": 1 }, "points": [4] }), "ok"),
    ];
    for (body, want) in cases {
        let op = edit(EditKind::SetPayload, body.clone()).unwrap();
        let got = match build(vec![op], &before(), true) {
            Ok(Ok(_)) => "ok",
            Ok(Err(NotFound(_))) => "not_found",
            Err(e) => code(e),
        };
        assert_eq!(got, want, "{body}");
    }
    // Another purpose than the point's is another use: out of scope.
    let op = edit(EditKind::ClearPayload, json!({ "points": [1] })).unwrap();
    let other = Scope {
        purpose: Some("analytics"),
        ..scope(None)
    };
    let refused = build_batch(
        vec![op.clone()],
        &before(),
        &other,
        None,
        true,
        &view(),
        now(),
    );
    assert_eq!(refused.map(|_| ()).map_err(code), Err("scope_violation"));
    // A bound token edits only its own subject's points.
    let bob = build_batch(
        vec![op],
        &before(),
        &scope(Some("bob")),
        None,
        true,
        &view(),
        now(),
    );
    assert_eq!(bob.map(|_| ()).map_err(code), Err("scope_violation"));
}

#[test]
fn a_batch_follows_its_own_operations_and_refuses_whole() {
    let ops = batch_of(json!({ "operations": [
        { "upsert": { "points": [{ "id": 9, "vector": [1.0], "payload": { "lethe_subject": "alice" } }] } },
        { "set_payload": { "payload": { "data": "x" }, "points": [9] } },
        { "delete": { "points": [2, 7] } },
        { "delete": { "points": [] } },
    ] }))
    .unwrap();
    let batch = built(ops, false);
    assert_eq!(batch.ranges, vec![0..1, 1..2, 2..3, 3..3]);
    assert_eq!(batch.operations[2], json!({ "delete": { "points": [2] } }));
    assert_eq!(batch.deleted, vec![PointId::Number(2)]);
    // A point deleted earlier in the batch is gone for a later edit.
    let ops = batch_of(json!({ "operations": [
        { "delete": { "points": [1] } },
        { "clear_payload": { "points": [1] } },
    ] }))
    .unwrap();
    assert_eq!(
        build(ops, &before(), false).unwrap(),
        Err(NotFound(PointId::Number(1)))
    );
    // One refused operation refuses the batch, naming the operation.
    let ops = batch_of(json!({ "operations": [
        { "delete": { "points": [1] } },
        { "upsert": { "points": [{ "id": 2, "vector": [1.0], "payload": { "lethe_subject": "alice" } }] } },
    ] }))
    .unwrap();
    let mut held = before();
    held.held.insert(
        PointId::Number(2),
        Some(stamp("bob", now() + TimeDelta::days(10))),
    );
    match build(ops, &held, false) {
        Err(AdapterError::Refused(r)) => {
            assert_eq!(r.len(), 1);
            assert_eq!((r[0].index, r[0].refusal.code()), (1, "scope_violation"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_filter_selects_only_what_the_scope_found() {
    let ops = batch_of(json!({ "operations": [
        { "set_payload": { "payload": { "data": "x" }, "filter": { "must": [{ "key": "data", "match": { "value": "a" } }] } } },
    ] }))
    .unwrap();
    let mut found = before();
    found.selected = vec![(
        PointId::Number(1),
        stamp("alice", now() + TimeDelta::days(1)),
    )];
    let batch = build(ops, &found, false).unwrap().unwrap();
    assert_eq!(
        selects(&batch.operations[0]),
        (vec![json!(1)], Some((json!("acme"), json!("alice"))))
    );
    // Nothing selected: nothing sent, and a completed result answered.
    let ops = edit(
        EditKind::DeleteVectors,
        json!({ "filter": {}, "vector": ["x"] }),
    )
    .unwrap();
    let batch = build(vec![ops], &before(), true).unwrap().unwrap();
    assert!(batch.operations.is_empty());
    assert_eq!(
        batch_results(&json!({ "result": [] }), &batch.ranges).unwrap(),
        vec![nothing_done()]
    );
}

#[test]
fn results_are_mapped_back_to_the_clients_operations() {
    let answer = json!({ "result": [
        { "operation_id": 1, "status": "completed" },
        { "operation_id": 2, "status": "completed" },
        { "operation_id": 3, "status": "acknowledged" },
    ] });
    let mapped = batch_results(&answer, &[0..2, 2..2, 2..3]).unwrap();
    assert_eq!(mapped[0]["operation_id"], json!(2));
    assert_eq!(mapped[1], nothing_done());
    assert_eq!(mapped[2]["status"], json!("acknowledged"));
    assert_eq!(
        batch_results(&answer, &[0..2, 2..4]).map_err(code),
        Err("upstream_invalid")
    );
}

fn arb_op() -> impl Strategy<Value = Value> {
    let ids = proptest::collection::vec(0u64..8, 0..4);
    prop_oneof![
        ids.clone().prop_map(|ids| json!({ "delete": { "points": ids } })),
        ids.clone().prop_map(|ids| json!({ "clear_payload": { "points": ids } })),
        ids.clone()
            .prop_map(|ids| json!({ "set_payload": { "payload": { "data": "x" }, "points": ids } })),
        (0u64..8).prop_map(|id| json!({ "upsert": { "points": [{ "id": id, "vector": [1.0], "payload": { "lethe_subject": "alice" } }] } })),
    ]
}

proptest! {
    /// Whatever the batch, Lethe selects only points the caller could see (by id, and by the
    /// owner they were decided on) or that the batch itself wrote; every point edited carries its
    /// stamp again afterwards.
    #[test]
    fn a_batch_never_reaches_past_the_scope(ops in proptest::collection::vec(arb_op(), 1..6)) {
        let ops = batch_of(json!({ "operations": ops }));
        prop_assume!(ops.is_ok());
        let ops = ops.unwrap();
        let upserted: Vec<PointId> = ops.iter().filter(|o| matches!(o, Op::Upsert(_))).flat_map(Op::named_ids).collect();
        if let Ok(Ok(batch)) = build(ops, &before(), false) {
            let visible = before().visible;
            // Who holds each point as the operations run: the store's holder, then alice once
            // the batch upserted it.
            let mut owners: BTreeMap<PointId, String> =
                visible.iter().map(|(id, stamp)| (id.clone(), stamp.subject.clone())).collect();
            let mut stamped_again = Vec::new();
            for operation in &batch.operations {
                let (name, body) = operation.as_object().and_then(|o| o.iter().next()).unwrap();
                let named: Vec<Value> = match name.as_str() {
                    "upsert" => {
                        let ids: Vec<Value> = body["points"].as_array().unwrap().iter().map(|p| p["id"].clone()).collect();
                        for id in &ids {
                            owners.insert(PointId::parse(id).unwrap(), "alice".to_owned());
                        }
                        ids
                    }
                    _ => {
                        let (ids, owner) = selects(operation);
                        if let Some((_, subject)) = owner {
                            for id in &ids {
                                let id = PointId::parse(id).unwrap();
                                prop_assert_eq!(&json!(owners[&id]), &subject);
                            }
                        }
                        ids
                    }
                };
                for id in &named {
                    let id = PointId::parse(id).unwrap();
                    prop_assert!(visible.contains_key(&id) || upserted.contains(&id), "{id:?}");
                }
                if name == "upsert" || body["payload"].get(SUBJECT).is_some() {
                    stamped_again.extend(named);
                }
            }
            for (id, _) in &batch.written {
                prop_assert!(stamped_again.contains(&id.to_json()), "{id:?}");
            }
        }
    }
}

#[test]
fn an_edit_derives_from_the_text_it_writes_and_a_removal_from_nothing() {
    let fields = ["text".to_owned()];
    let cases = [
        (
            EditKind::SetPayload,
            json!({ "payload": { "text": "new words", "n": 1 }, "points": [1] }),
            Some("new words"),
        ),
        // Set under a key, the payload is not at the top: all of its text counts.
        (
            EditKind::SetPayload,
            json!({ "payload": { "note": "nested words" }, "points": [1], "key": "meta" }),
            Some("nested words"),
        ),
        (
            EditKind::OverwritePayload,
            json!({ "payload": { "text": "all new", "tag": "x" }, "filter": { "must": [] } }),
            Some("all new"),
        ),
        // New vectors carry no text, but may be made from what the trace read.
        (
            EditKind::UpdateVectors,
            json!({ "points": [{ "id": 1, "vector": [0.1, 0.2] }] }),
            Some(""),
        ),
        (
            EditKind::DeletePayload,
            json!({ "keys": ["text"], "points": [1] }),
            None,
        ),
        (EditKind::ClearPayload, json!({ "points": [1] }), None),
        (
            EditKind::DeleteVectors,
            json!({ "vector": [""], "points": [1] }),
            None,
        ),
    ];
    for (kind, body, wanted) in cases {
        let op = edit(kind, body.clone()).unwrap_or_else(|e| panic!("{body}: {e:?}"));
        let text = op.written_text(&fields).map(|(_, text)| text);
        assert_eq!(text.as_deref().map(str::trim), wanted, "{kind:?} {body}");
    }
}

/// Qdrant reads `"lethe_subject"` (quoted), `lethe_subject[]` and `"lethe_subject".x` as paths
/// under the stamp's `lethe_subject`: no spelling sets or removes under the stamp, or sets under
/// the subject's key, alone or in a batch; a path Qdrant would refuse is refused.
#[test]
fn every_spelling_of_a_path_under_the_stamp_is_refused() {
    let refused = [
        "\"lethe_subject\"",
        "\"lethe_tenant\"",
        "\"lethe_epoch\"",
        "\"lethe_purpose\"",
        "\"lethe_category\"",
        "\"lethe_expires_at\"",
        "\"lethe_layer\"",
        "\"lethe_subject\".x",
        "\"lethe_subject\"[]",
        "\"lethe_subject\"[0]",
        "\"lethe_subject\".\"a.b\"",
        "lethe_subject[]",
        "lethe_tenant[0].x",
        "\"lethe_\"",
        "\"lethe_other\"",
        // Paths Qdrant refuses.
        "",
        "\"lethe_subject",
        "\"lethe\\_subject\"",
        " lethe_subject",
        ".lethe_subject",
        "[0]",
        "a..b",
        "a[-1]",
    ];
    for key in refused {
        let cases = [
            (
                EditKind::SetPayload,
                json!({ "payload": { "a": 1 }, "points": [1], "key": key }),
            ),
            (
                EditKind::DeletePayload,
                json!({ "keys": ["data", key], "points": [1] }),
            ),
        ];
        for (kind, body) in cases {
            assert_eq!(
                edit(kind, body.clone()).map(|_| ()).map_err(code),
                Err("invalid"),
                "{kind:?} {body}"
            );
        }
        for operation in [
            json!({ "set_payload": { "payload": { "a": 1 }, "points": [1], "key": key } }),
            json!({ "delete_payload": { "keys": [key], "points": [1] } }),
        ] {
            let body = json!({ "operations": [operation] });
            assert_eq!(
                batch_of(body.clone()).map(|_| ()).map_err(code),
                Err("invalid"),
                "{body}"
            );
        }
    }
    // The subject's key (`user_id`), in any spelling, is set at the top of the payload only.
    for key in [
        "user_id",
        "\"user_id\"",
        "user_id[]",
        "user_id[0]",
        "\"user_id\".name",
        "user_id.name",
    ] {
        let body = json!({ "payload": { "a": 1 }, "points": [1], "key": key });
        assert_eq!(
            edit(EditKind::SetPayload, body.clone())
                .map(|_| ())
                .map_err(code),
            Err("invalid"),
            "{body}"
        );
    }
    // Below the top, or quoted into another top-level key, the stamp's names are the app's keys.
    for key in [
        "meta",
        "\"meta\"",
        "meta.lethe_subject",
        "meta.\"lethe_subject\"",
        "\"meta.lethe_subject\"",
        "\"a.b\"",
        "a[0].b",
        "user_idx",
        "\"user_id2\"",
    ] {
        let body = json!({ "payload": { "a": 1 }, "points": [1], "key": key });
        assert!(edit(EditKind::SetPayload, body.clone()).is_ok(), "{body}");
        let body = json!({ "keys": [key], "points": [1] });
        assert!(
            edit(EditKind::DeletePayload, body.clone()).is_ok(),
            "{body}"
        );
    }
}

proptest! {
    /// Whatever the spelling, a path whose top-level key (as Qdrant reads it) is Lethe's is
    /// refused, and so is one Qdrant would refuse; a set under the subject's key is refused too.
    #[test]
    fn no_spelling_of_a_path_reaches_the_stamp(
        key in r#"(lethe_[a-z_]{0,12}|"lethe_[a-z_]{0,12}"|user_id|"user_id"|[a-z]{1,4}|"[a-z._]{0,8}")(\.[a-z_]{1,5}|\."[a-z_.]{0,5}"|\[\]|\[[0-9]{1,2}\]){0,3}(\.|"|\[|\\| )?"#
    ) {
        let first = key_path::first_segment(&key);
        let set = edit(EditKind::SetPayload, json!({ "payload": { "a": 1 }, "points": [1], "key": key }));
        let delete = edit(EditKind::DeletePayload, json!({ "keys": [key], "points": [1] }));
        prop_assert_eq!(set.is_ok(), first.is_ok_and(|f| !f.starts_with("lethe_") && f != "user_id"));
        prop_assert_eq!(delete.is_ok(), first.is_ok_and(|f| !f.starts_with("lethe_")));
    }
}
