use chrono::TimeDelta;
use proptest::prelude::*;

use super::*;
use crate::kit::fixtures::{self, code, now, scope, view};
use crate::kit::stamp::{EPOCH, EXPIRES_AT};

fn ns(labels: &[&str]) -> Vec<String> {
    labels.iter().map(|l| (*l).to_owned()).collect()
}

fn stamp(subject: &str, expires_in: i64) -> Stamp {
    Stamp {
        tenant: "acme".into(),
        subject: subject.into(),
        purpose: "personalization".into(),
        category: "preference".into(),
        layer: Layer::Raw,
        expires_at: now() + TimeDelta::seconds(expires_in),
        epoch: 0,
    }
}

fn read_ctx(bound: Option<&'static str>) -> ReadContext<'static> {
    ReadContext {
        tenant: "acme",
        store: "langgraph",
        bound_subject: bound,
        purpose: None,
    }
}

const T1: &str = "5d2c7e1a-8b3f-4a6d-9e0c-1f2a3b4c5d6e";

#[test]
fn endpoints_are_classified() {
    let t = || T1.to_owned();
    let cases = [
        (Method::GET, "/ok", Endpoint::PassThrough),
        (Method::POST, "/assistants/search", Endpoint::PassThrough),
        (
            Method::GET,
            "/assistants/agent/graph",
            Endpoint::PassThrough,
        ),
        (Method::POST, "/assistants", Endpoint::Admin),
        (Method::DELETE, "/assistants/a1", Endpoint::Admin),
        (Method::POST, "/threads", Endpoint::CreateThread),
        (Method::POST, "/threads/search", Endpoint::SearchThreads),
        (Method::POST, "/threads/count", Endpoint::CountThreads),
        (
            Method::GET,
            &*format!("/threads/{T1}"),
            Endpoint::ThreadRead { thread: t() },
        ),
        (
            Method::GET,
            &*format!("/threads/{T1}/state"),
            Endpoint::ThreadRead { thread: t() },
        ),
        (
            Method::POST,
            &*format!("/threads/{T1}/history"),
            Endpoint::ThreadRead { thread: t() },
        ),
        (
            Method::GET,
            &*format!("/threads/{T1}/runs/r1/join"),
            Endpoint::ThreadRead { thread: t() },
        ),
        (
            Method::PATCH,
            &*format!("/threads/{T1}"),
            Endpoint::ThreadWrite {
                thread: t(),
                patch: true,
            },
        ),
        (
            Method::POST,
            &*format!("/threads/{T1}/runs/wait"),
            Endpoint::ThreadWrite {
                thread: t(),
                patch: false,
            },
        ),
        (
            Method::POST,
            &*format!("/threads/{T1}/state"),
            Endpoint::ThreadWrite {
                thread: t(),
                patch: false,
            },
        ),
        (
            Method::DELETE,
            &*format!("/threads/{T1}"),
            Endpoint::DeleteThread { thread: t() },
        ),
        (Method::PUT, "/store/items", Endpoint::PutItem),
        (Method::GET, "/store/items", Endpoint::GetItem),
        (Method::DELETE, "/store/items", Endpoint::DeleteItem),
        (Method::POST, "/store/items/search", Endpoint::SearchItems),
        (Method::POST, "/store/namespaces", Endpoint::ListNamespaces),
        // Stateless runs keep nothing a thread holds; crons, copies, prunes and never-ending
        // streams are not governed.
        (Method::POST, "/runs/wait", Endpoint::Refused),
        (Method::POST, "/runs/crons", Endpoint::Refused),
        (
            Method::POST,
            &*format!("/threads/{T1}/copy"),
            Endpoint::Refused,
        ),
        (Method::POST, "/threads/prune", Endpoint::Refused),
        (
            Method::GET,
            &*format!("/threads/{T1}/stream"),
            Endpoint::Refused,
        ),
        (
            Method::GET,
            &*format!("/threads/{T1}/runs/r1/stream"),
            Endpoint::Refused,
        ),
        (Method::PUT, &*format!("/threads/{T1}"), Endpoint::Refused),
        (Method::GET, "/docs", Endpoint::Refused),
    ];
    for (method, path, want) in cases {
        assert_eq!(classify(&method, path), want, "{method} {path}");
    }
}

#[test]
fn thread_requests_need_the_canonical_thread_id() {
    let simple = T1.replace('-', "");
    for spelling in [
        T1.to_uppercase(),
        simple.clone(),
        format!("{{{T1}}}"),
        format!("urn:uuid:{T1}"),
        format!("{{{simple}}}"),
        format!(" {T1}"),
        "t1".to_owned(),
    ] {
        for (method, rest) in [
            (Method::GET, ""),
            (Method::PATCH, ""),
            (Method::DELETE, ""),
            (Method::GET, "/state"),
            (Method::POST, "/state"),
            (Method::POST, "/history"),
            (Method::POST, "/runs/wait"),
        ] {
            let path = format!("/threads/{spelling}{rest}");
            assert_eq!(
                classify(&method, &path),
                Endpoint::NonCanonical,
                "{method} {path}"
            );
        }
    }
}

#[test]
fn namespaces_are_placed_against_the_template() {
    let default = Namespace::default();
    let memories = Namespace::from_template(&ns(&["memories", "{tenant}", "{subject}"]));
    let cases = [
        (
            &default,
            ns(&["acme", "alice"]),
            Placement::Subject("alice".into()),
        ),
        (
            &default,
            ns(&["acme", "alice", "facts"]),
            Placement::Subject("alice".into()),
        ),
        (&default, ns(&["acme"]), Placement::Above),
        (&default, ns(&[]), Placement::Above),
        (&default, ns(&["other", "alice"]), Placement::Outside),
        (
            &memories,
            ns(&["memories", "acme", "bob"]),
            Placement::Subject("bob".into()),
        ),
        (
            &memories,
            ns(&["memories", "other", "bob"]),
            Placement::Outside,
        ),
        (&memories, ns(&["notes", "acme", "bob"]), Placement::Outside),
    ];
    for (template, labels, want) in cases {
        assert_eq!(template.place("acme", &labels), want, "{labels:?}");
    }
    assert_eq!(default.render("acme", "alice"), ns(&["acme", "alice"]));
    assert_eq!(
        memories.render("acme", "bob"),
        ns(&["memories", "acme", "bob"])
    );
}

#[test]
fn item_ids_round_trip_whatever_the_labels_hold() {
    for (namespace, key) in [
        (ns(&["acme", "alice"]), "k"),
        (ns(&["a.b", "\"q\"", ""]), "x,y"),
        (ns(&[]), "only"),
    ] {
        let id = item_id(&namespace, key);
        assert_eq!(parse_item_id(&id), Some((namespace, key.to_owned())));
    }
    assert_eq!(parse_item_id("not json"), None);
}

#[test]
fn a_thread_is_stamped_in_its_metadata() {
    let body = json!({"metadata": {"topic": "tea"}}).to_string();
    let planned = plan_thread(body.as_bytes(), &scope(Some("alice"))).unwrap();
    let (body, stamp) =
        stamp_item(planned, "metadata", "acme", &view(), Held::Nothing, now()).unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["metadata"]["topic"], "tea");
    assert_eq!(body["metadata"][SUBJECT], "alice");
    assert_eq!(body["metadata"][TENANT], "acme");
    assert_eq!(
        body["metadata"][EXPIRES_AT],
        json!(stamp.expires_at.timestamp())
    );
    assert_eq!(stamp.expires_at, now() + TimeDelta::days(30));
}

#[test]
fn thread_creation_is_decided() {
    let create = |subject: Option<&'static str>, body: Value| {
        plan_thread(body.to_string().as_bytes(), &scope(subject))
            .and_then(|p| stamp_item(p, "metadata", "acme", &view(), Held::Nothing, now()))
            .map(|_| ())
            .map_err(code)
    };
    assert_eq!(create(Some("carol"), json!({})), Err("subject_suppressed"));
    assert_eq!(create(Some("erin"), json!({})), Err("consent_required"));
    assert_eq!(create(None, json!({})), Err("missing_scope"));
    assert_eq!(
        create(Some("alice"), json!({"metadata": {SUBJECT: "bob"}})),
        Err("scope_violation")
    );
    assert_eq!(create(None, json!({"metadata": {SUBJECT: "bob"}})), Ok(()));
    assert_eq!(
        create(Some("alice"), json!({"metadata": 3})),
        Err("invalid")
    );
    assert_eq!(
        create(Some("alice"), json!({"thread_id": 3})),
        Err("invalid")
    );
}

#[test]
fn a_store_item_put_is_decided_on_the_item_the_server_holds() {
    let put = || {
        plan_put(
            json!({"namespace": ["acme", "alice"], "key": "k", "value": {"fact": "tea"}})
                .to_string()
                .as_bytes(),
            &scope(Some("alice")),
            &Namespace::default(),
        )
        .unwrap()
    };
    let later = now() + chrono::TimeDelta::days(2);
    let own = fixtures::stamp("alice", later);
    let expired = fixtures::stamp("alice", now());
    let bobs = fixtures::stamp("bob", later);
    let decided = |held| {
        stamp_item(put(), "value", "acme", &view(), held, now())
            .map(|(_, s)| s.expires_at)
            .map_err(code)
    };
    assert_eq!(
        decided(Held::Stamped(&own)),
        Ok(later),
        "the first write's deadline stays"
    );
    assert_eq!(decided(Held::Stamped(&expired)), Err("expired"));
    assert_eq!(decided(Held::Stamped(&bobs)), Err("scope_violation"));
    assert_eq!(decided(Held::Unstamped), Err("unstamped_item"));
    assert_eq!(
        decided(Held::Nothing),
        Ok(now() + chrono::TimeDelta::days(30))
    );
    let answer = json!({"namespace": ["acme", "alice"], "key": "k", "value": {"fact": "tea"}});
    assert_eq!(held_item(&answer), Ok(Some(None)));
    assert_eq!(held_item(&Value::Null), Ok(None));
    assert_eq!(
        held_item(&json!([1])).map_err(code),
        Err("upstream_invalid")
    );
}

#[test]
fn an_existing_thread_is_never_handed_out_by_a_create() {
    let create = |body: Value| {
        plan_thread(body.to_string().as_bytes(), &scope(Some("alice")))
            .map(|p| p.id)
            .map_err(code)
    };
    let id = "0b9a8a1e-6c1a-4b4e-9a55-6a1f2f0c1d2e";
    assert_eq!(create(json!({"thread_id": id})), Ok(Some(id.to_owned())));
    for other_spelling in [id.to_uppercase(), id.replace('-', ""), format!("{{{id}}}")] {
        assert_eq!(create(json!({"thread_id": other_spelling})), Err("invalid"));
    }
    assert_eq!(create(json!({"if_exists": "raise"})), Ok(None));
    assert_eq!(create(json!({"if_exists": "do_nothing"})), Err("invalid"));
    // The answer must be the thread asked for, carrying the stamp just written.
    let stamp = stamp("alice", 60);
    let mut metadata = Map::new();
    write_stamp(&mut metadata, &stamp);
    let answer = |thread: &str, metadata: &Map<String, Value>| {
        json!({"thread_id": thread, "metadata": metadata}).to_string()
    };
    let created = |body: String, requested: Option<&str>| {
        created_thread_id(body.as_bytes(), requested, &stamp).map_err(code)
    };
    assert_eq!(created(answer(id, &metadata), Some(id)), Ok(id.to_owned()));
    assert_eq!(created(answer(id, &metadata), None), Ok(id.to_owned()));
    assert_eq!(
        created(answer("other", &metadata), Some(id)),
        Err("scope_violation")
    );
    let mut someone_elses = metadata.clone();
    someone_elses.insert(SUBJECT.into(), json!("bob"));
    assert_eq!(
        created(answer(id, &someone_elses), Some(id)),
        Err("scope_violation")
    );
    assert_eq!(
        created(answer(id, &Map::new()), None),
        Err("scope_violation")
    );
    assert_eq!(created("[]".into(), None), Err("upstream_invalid"));
    assert_eq!(
        check_thread_write(br#"{"input": {"messages": [{"role": "user", "content": "hi"}]}}"#)
            .map_err(code),
        Ok("hi\nuser".to_owned()),
        "the text a run carries"
    );
    assert_eq!(
        check_thread_write(br#"{"webhook": "https://elsewhere.example"}"#).map_err(code),
        Err("invalid")
    );
}

#[test]
fn store_items_live_under_their_subjects_namespace() {
    let template = Namespace::default();
    let put = |subject: Option<&'static str>, namespace: &[&str], value: Value| {
        let body = json!({"namespace": namespace, "key": "k", "value": value}).to_string();
        plan_put(body.as_bytes(), &scope(subject), &template)
            .and_then(|p| stamp_item(p, "value", "acme", &view(), Held::Nothing, now()))
            .map(|(body, stamp)| (serde_json::from_slice::<Value>(&body).unwrap(), stamp))
            .map_err(code)
    };
    let (body, stamp) = put(None, &["acme", "alice", "facts"], json!({"text": "tea"})).unwrap();
    assert_eq!(stamp.subject, "alice");
    assert_eq!(body["value"][SUBJECT], "alice");
    assert_eq!(body["value"]["text"], "tea");
    let early = (now() + TimeDelta::hours(1)).timestamp();
    let (_, stamp) = put(
        Some("alice"),
        &["acme", "alice"],
        json!({EXPIRES_AT: early}),
    )
    .unwrap();
    assert_eq!(stamp.expires_at.timestamp(), early);
    assert_eq!(
        put(Some("bob"), &["acme", "alice"], json!({})).map(|_| ()),
        Err("scope_violation")
    );
    assert_eq!(
        put(None, &["acme", "alice"], json!({SUBJECT: "bob"})).map(|_| ()),
        Err("scope_violation")
    );
    assert_eq!(
        put(None, &["acme", "carol"], json!({})).map(|_| ()),
        Err("subject_suppressed")
    );
    assert_eq!(
        put(None, &["other", "alice"], json!({})).map(|_| ()),
        Err("invalid")
    );
    assert_eq!(put(None, &["acme"], json!({})).map(|_| ()), Err("invalid"));
    assert_eq!(
        put(None, &["acme", "alice"], json!("text")).map(|_| ()),
        Err("invalid")
    );
}

#[test]
fn writes_into_a_thread_follow_its_registration() {
    let write = |registered: Option<Stamp>, subject: Option<&'static str>| {
        decide_thread_write(registered.as_ref(), &scope(subject), &view(), now()).map(|_| ())
    };
    assert_eq!(write(Some(stamp("alice", 60)), Some("alice")), Ok(()));
    assert_eq!(write(Some(stamp("alice", 60)), None), Ok(()));
    assert_eq!(write(None, Some("alice")), Err(Refusal::UnstampedItem));
    assert_eq!(
        write(Some(stamp("alice", 60)), Some("bob")),
        Err(Refusal::ScopeViolation)
    );
    assert_eq!(
        write(Some(stamp("carol", 60)), None),
        Err(Refusal::SubjectSuppressed)
    );
    assert_eq!(write(Some(stamp("alice", -1)), None), Err(Refusal::Expired));
    assert_eq!(
        write(Some(stamp("erin", 60)), None),
        Err(Refusal::ConsentRequired)
    );
    let mut old_epoch = stamp("alice", 60);
    old_epoch.epoch = -1;
    assert_eq!(write(Some(old_epoch), None), Err(Refusal::StaleEpoch));
    let mut other_purpose = scope(None);
    other_purpose.purpose = Some("ads");
    assert_eq!(
        decide_thread_write(Some(&stamp("alice", 60)), &other_purpose, &view(), now()),
        Err(Refusal::ScopeViolation)
    );
}

#[test]
fn patched_metadata_keeps_the_registered_stamp() {
    let body = json!({"metadata": {"topic": "x", SUBJECT: "bob", TENANT: "evil"}}).to_string();
    let out: Value =
        serde_json::from_slice(&restamp_patch(body.as_bytes(), &stamp("alice", 60)).unwrap())
            .unwrap();
    assert_eq!(out["metadata"][SUBJECT], "alice");
    assert_eq!(out["metadata"][TENANT], "acme");
    assert_eq!(out["metadata"]["topic"], "x");
}

#[test]
fn thread_searches_are_narrowed_and_judged_by_the_registry() {
    let narrowed = narrow_thread_search(
        json!({"metadata": {"topic": "x", TENANT: "other"}, "select": ["values"]})
            .to_string()
            .as_bytes(),
        "acme",
        Some("alice"),
    )
    .unwrap();
    assert_eq!(
        Value::Object(narrowed),
        json!({"metadata": {"topic": "x", TENANT: "acme", SUBJECT: "alice"}, "select": ["values", "thread_id"]})
    );
    let answer = json!([
        {"thread_id": "a", "values": {"m": 1}},
        {"thread_id": "b"},
        {"thread_id": "c"},
        {"thread_id": "unregistered"},
        {"thread_id": "old"},
    ]);
    let registered = BTreeMap::from([
        ("a".to_owned(), stamp("alice", 60)),
        ("b".to_owned(), stamp("bob", 60)),
        ("c".to_owned(), stamp("carol", 60)),
        ("old".to_owned(), stamp("alice", -1)),
    ]);
    let ids = |v: Value| thread_ids(&v).unwrap();
    let all = filter_threads(answer.clone(), &registered, &view(), &read_ctx(None), now()).unwrap();
    assert_eq!(ids(all), ["a", "b"]);
    let bound =
        filter_threads(answer, &registered, &view(), &read_ctx(Some("bob")), now()).unwrap();
    assert_eq!(ids(bound), ["b"]);
    let bad = filter_threads(
        json!({"a": 1}),
        &registered,
        &view(),
        &read_ctx(None),
        now(),
    );
    assert_eq!(bad.map_err(code), Err("upstream_invalid"));
    let bad = filter_threads(
        json!([{"id": 1}]),
        &registered,
        &view(),
        &read_ctx(None),
        now(),
    );
    assert_eq!(bad.map_err(code), Err("upstream_invalid"));
}

fn item(subject: &str, expires_in: i64) -> Value {
    let mut value = Map::new();
    write_stamp(&mut value, &stamp(subject, expires_in));
    value.insert("text".into(), json!("x"));
    json!({"namespace": ["acme", subject], "key": "k", "value": value})
}

#[test]
fn store_reads_are_narrowed_and_filtered() {
    let narrowed: Value = serde_json::from_slice(
        &narrow_item_search(
            json!({"namespace_prefix": ["acme"], "filter": {"kind": "fact", TENANT: "other"}})
                .to_string()
                .as_bytes(),
            "acme",
            None,
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(narrowed["filter"], json!({"kind": "fact", TENANT: "acme"}));
    let answer = json!({"items": [item("alice", 60), item("carol", 60), item("bob", -5), {"value": {"text": "unstamped"}}]});
    assert_eq!(
        item_subjects(&answer),
        BTreeSet::from(["alice".to_owned(), "bob".to_owned(), "carol".to_owned()])
    );
    let kept = filter_items(answer, &view(), &read_ctx(None), now()).unwrap();
    assert_eq!(kept["items"].as_array().unwrap().len(), 1);
    assert_eq!(kept["items"][0]["value"][SUBJECT], "alice");
    assert_eq!(
        filter_item(item("alice", 60), &view(), &read_ctx(None), now())["key"],
        "k"
    );
    assert_eq!(
        filter_item(item("alice", 60), &view(), &read_ctx(Some("bob")), now()),
        Value::Null
    );
    assert_eq!(
        filter_item(item("carol", 60), &view(), &read_ctx(None), now()),
        Value::Null
    );
    assert_eq!(
        filter_item(Value::Null, &view(), &read_ctx(None), now()),
        Value::Null
    );
    assert_eq!(
        filter_items(json!([1]), &view(), &read_ctx(None), now()).map_err(code),
        Err("upstream_invalid")
    );
}

#[test]
fn item_requests_name_their_namespace_and_key() {
    assert_eq!(
        parse_item_query(Some("namespace=acme.alice.facts&key=k%201")).unwrap(),
        (
            ns(&["acme", "alice", "facts"]),
            "k 1".to_owned(),
            "namespace=acme.alice.facts&key=k+1".to_owned()
        )
    );
    // The server takes the last of a repeated parameter: refused rather than guessed at.
    for query in [
        "namespace=acme.alice&namespace=acme.bob&key=k",
        "namespace=acme.alice&key=k&key=j",
        "namespace=acme.alice&key=k&extra=1",
    ] {
        assert_eq!(
            parse_item_query(Some(query)).map_err(code),
            Err("invalid"),
            "{query}"
        );
    }
    assert_eq!(
        parse_item_query(Some("key=k")).map_err(code),
        Err("invalid")
    );
    assert_eq!(parse_item_query(None).map_err(code), Err("invalid"));
    assert_eq!(
        parse_item_delete(
            json!({"namespace": ["acme", "bob"], "key": "k"})
                .to_string()
                .as_bytes()
        )
        .unwrap(),
        (ns(&["acme", "bob"]), "k".to_owned())
    );
    assert_eq!(
        parse_item_delete(
            json!({"namespace": "acme.bob", "key": "k"})
                .to_string()
                .as_bytes()
        )
        .map_err(code),
        Err("invalid")
    );
}

#[test]
fn namespace_listings_hide_other_tenants_and_closed_subjects() {
    let answer = json!({"namespaces": [["acme"], ["acme", "alice", "facts"], ["acme", "carol"], ["other", "bob"], ["acme", "bob"]]});
    let template = Namespace::default();
    let open = |s: &str| namespace_open(&view(), "acme", s).is_ok();
    let all = filter_namespaces(
        namespaces_of(&answer, &template, "acme").unwrap(),
        None,
        open,
    );
    assert_eq!(
        all,
        json!({"namespaces": [["acme"], ["acme", "alice", "facts"], ["acme", "bob"]]})
    );
    let bound = filter_namespaces(
        namespaces_of(&answer, &template, "acme").unwrap(),
        Some("bob"),
        open,
    );
    assert_eq!(bound, json!({"namespaces": [["acme", "bob"]]}));
    assert_eq!(
        namespaces_of(&json!({"namespaces": [[1]]}), &template, "acme").map_err(code),
        Err("upstream_invalid")
    );
}

proptest! {
    #[test]
    fn arbitrary_bodies_never_panic_nor_serve_a_suppressed_subject(body in fixtures::arb_json(vec![
        "metadata", "value", "namespace", "namespace_prefix", "key", "items", "thread_id",
        "namespaces", "filter", "select", SUBJECT, TENANT, PURPOSE, CATEGORY, EXPIRES_AT, EPOCH,
    ])) {
        let bytes = body.to_string().into_bytes();
        let template = Namespace::default();
        if let Ok(planned) = plan_thread(&bytes, &scope(None)) {
            // A body may name carol; planning is not deciding, the stamp is refused.
            let for_carol = planned.subject == "carol";
            match stamp_item(planned, "metadata", "acme", &view(), Held::Nothing, now()) {
                Ok((_, stamp)) => prop_assert_ne!(stamp.subject.as_str(), "carol"),
                Err(refused) if for_carol => prop_assert_eq!(code(refused), "subject_suppressed"),
                Err(_) => {}
            }
        }
        if let Ok(planned) = plan_put(&bytes, &scope(None), &template) {
            let _ = stamp_item(planned, "value", "acme", &view(), Held::Nothing, now());
        }
        let _ = narrow_thread_search(&bytes, "acme", Some("alice"));
        let _ = narrow_item_search(&bytes, "acme", None);
        let _ = parse_item_delete(&bytes);
        let _ = restamp_patch(&bytes, &stamp("alice", 60));
        let _ = created_thread_id(&bytes, None, &stamp("alice", 60));
        let registered = BTreeMap::from([("alice".to_owned(), stamp("carol", 60))]);
        if let Ok(kept) = filter_threads(body.clone(), &registered, &view(), &read_ctx(None), now()) {
            prop_assert!(thread_ids(&kept).unwrap().is_empty());
        }
        if let Ok(kept) = filter_items(body.clone(), &view(), &read_ctx(None), now()) {
            prop_assert!(!item_subjects(&kept).contains("carol"), "{}", kept);
        }
        let single = filter_item(body.clone(), &view(), &read_ctx(None), now());
        prop_assert!(!item_subjects(&single).contains("carol"));
        if let Ok(placed) = namespaces_of(&body, &template, "acme") {
            let kept = filter_namespaces(placed, None, |s| namespace_open(&view(), "acme", s).is_ok());
            prop_assert!(!kept.to_string().contains("\"carol\""), "{}", kept);
        }
    }
}
