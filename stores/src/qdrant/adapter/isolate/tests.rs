use serde_json::{Value, json};

use super::*;

fn acme() -> Namespace {
    Namespace::of("acme")
}

fn phys(name: &str) -> String {
    acme().physical(name).unwrap()
}

#[test]
fn every_collection_a_path_names_is_the_callers() {
    let ns = acme();
    for (path, want) in [
        (
            "/collections/memories",
            format!("/collections/{}", phys("memories")),
        ),
        (
            "/collections/memories/exists",
            format!("/collections/{}/exists", phys("memories")),
        ),
        (
            "/collections/m.v2/points/scroll",
            format!("/collections/{}/points/scroll", phys("m.v2")),
        ),
        (
            "/collections/memories/index",
            format!("/collections/{}/index", phys("memories")),
        ),
        ("/collections", "/collections".to_owned()),
        ("/aliases", "/aliases".to_owned()),
        ("/", "/".to_owned()),
    ] {
        assert_eq!(
            request(&Method::GET, path, b"", &ns).unwrap().0,
            want,
            "{path}"
        );
    }
    // Another tenant's physical name is just a name, in the caller's namespace.
    let theirs = Namespace::of("globex").physical("memories").unwrap();
    let (path, _) = request(
        &Method::POST,
        &format!("/collections/{theirs}/points/scroll"),
        b"",
        &ns,
    )
    .unwrap();
    assert_eq!(
        path,
        format!("/collections/{}/points/scroll", phys(&theirs))
    );
    for bad in [
        "/collections/a%2fb",
        "/collections/..",
        &format!("/collections/{}", "x".repeat(216)),
    ] {
        assert!(request(&Method::GET, bad, b"", &ns).is_err(), "{bad}");
    }
}

#[test]
fn a_search_looks_up_in_the_callers_collections_only() {
    let ns = acme();
    let body = json!({
        "query": {"recommend": {"positive": [1]}},
        "lookup_from": {"collection": "vectors", "vector": "v"},
        "prefetch": [{"lookup_from": {"collection": "other"}, "query": [0.1]}],
        "with_lookup": "docs",
        "filter": {"must": [{"key": "lookup_from", "match": {"value": "x"}}]},
    });
    let (_, mapped) = request(
        &Method::POST,
        "/collections/memories/points/query/groups",
        &serde_json::to_vec(&body).unwrap(),
        &ns,
    )
    .unwrap();
    let mapped: Value = serde_json::from_slice(&mapped.unwrap()).unwrap();
    assert_eq!(mapped["lookup_from"]["collection"], json!(phys("vectors")));
    assert_eq!(
        mapped["prefetch"][0]["lookup_from"]["collection"],
        json!(phys("other"))
    );
    assert_eq!(mapped["with_lookup"], json!(phys("docs")));
    assert_eq!(
        mapped["filter"], body["filter"],
        "a payload key named lookup_from is no lookup"
    );
    let batch = json!({"searches": [{"query": [0.1], "with_lookup": {"collection": "docs", "with_payload": true}}]});
    let (_, mapped) = request(
        &Method::POST,
        "/collections/memories/points/query/batch",
        &serde_json::to_vec(&batch).unwrap(),
        &ns,
    )
    .unwrap();
    let mapped: Value = serde_json::from_slice(&mapped.unwrap()).unwrap();
    assert_eq!(
        mapped["searches"][0]["with_lookup"]["collection"],
        json!(phys("docs"))
    );
    let forged = json!({"query": [0.1], "lookup_from": {"collection": "a/b"}});
    assert!(
        request(
            &Method::POST,
            "/collections/m/points/query",
            &serde_json::to_vec(&forged).unwrap(),
            &ns
        )
        .is_err()
    );
}

#[test]
fn alias_actions_are_rebuilt_in_the_callers_namespace() {
    let ns = acme();
    let body = json!({"actions": [
        {"create_alias": {"collection_name": "memories", "alias_name": "current"}},
        {"rename_alias": {"old_alias_name": "current", "new_alias_name": "latest"}},
        {"delete_alias": {"alias_name": "latest"}},
    ]});
    let (_, mapped) = request(
        &Method::POST,
        "/collections/aliases",
        &serde_json::to_vec(&body).unwrap(),
        &ns,
    )
    .unwrap();
    let mapped: Value = serde_json::from_slice(&mapped.unwrap()).unwrap();
    assert_eq!(
        mapped,
        json!({"actions": [
            {"create_alias": {"collection_name": phys("memories"), "alias_name": phys("current")}},
            {"rename_alias": {"old_alias_name": phys("current"), "new_alias_name": phys("latest")}},
            {"delete_alias": {"alias_name": phys("latest")}},
        ]})
    );
    for refused in [
        json!({"actions": [{"create_alias": {"collection_name": "m", "alias_name": "a"}, "delete_alias": {"alias_name": "x"}}]}),
        json!({"actions": [{"create_alias": {"collection_name": "m", "alias_name": "a", "extra": 1}}]}),
        json!({"actions": [{"create_alias": {"collection_name": "m"}}]}),
        json!({"actions": [{"drop_everything": {}}]}),
        json!({"actions": [], "timeout": 1}),
        json!({"actions": {}}),
    ] {
        assert!(
            request(
                &Method::POST,
                "/collections/aliases",
                &serde_json::to_vec(&refused).unwrap(),
                &ns
            )
            .is_err(),
            "{refused}"
        );
    }
    // Other methods there name a collection called `aliases`, in the caller's namespace.
    for method in [Method::GET, Method::PUT, Method::DELETE] {
        assert_eq!(
            request(&method, "/collections/aliases", b"{}", &ns)
                .unwrap()
                .0,
            format!("/collections/{}", phys("aliases")),
            "{method}"
        );
    }
}

#[test]
fn a_collection_is_not_made_from_another() {
    let ns = acme();
    let theirs = Namespace::of("globex").physical("memories").unwrap();
    let create =
        json!({"vectors": {"size": 4, "distance": "Cosine"}, "init_from": {"collection": theirs}});
    assert!(
        request(
            &Method::PUT,
            "/collections/copy",
            &serde_json::to_vec(&create).unwrap(),
            &ns
        )
        .is_err()
    );
    let plain = json!({"vectors": {"size": 4, "distance": "Cosine"}, "init_from": null});
    assert!(
        request(
            &Method::PUT,
            "/collections/fresh",
            &serde_json::to_vec(&plain).unwrap(),
            &ns
        )
        .is_ok()
    );
}

#[test]
fn answers_name_the_callers_collections_only() {
    let ns = acme();
    let theirs = Namespace::of("globex").physical("memories").unwrap();
    let listed = json!({"result": {"collections": [
        {"name": phys("memories")}, {"name": theirs}, {"name": "made-around-lethe"}, {"name": phys("notes")},
    ]}, "status": "ok"});
    let out: Value = serde_json::from_slice(
        &answer(
            &Method::GET,
            "/collections",
            true,
            &serde_json::to_vec(&listed).unwrap(),
            &ns,
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        out["result"]["collections"],
        json!([{"name": "memories"}, {"name": "notes"}])
    );
    let aliases = json!({"result": {"aliases": [
        {"alias_name": phys("current"), "collection_name": phys("memories")},
        {"alias_name": phys("sneaky"), "collection_name": theirs},
        {"alias_name": "x", "collection_name": phys("memories")},
    ]}});
    for path in ["/aliases", "/collections/memories/aliases"] {
        let out: Value = serde_json::from_slice(
            &answer(
                &Method::GET,
                path,
                true,
                &serde_json::to_vec(&aliases).unwrap(),
                &ns,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            out["result"]["aliases"],
            json!([{"alias_name": "current", "collection_name": "memories"}]),
            "{path}"
        );
    }
    let error = format!(
        "{{\"status\":{{\"error\":\"Not found: Collection `{}` doesn't exist!\"}}}}",
        phys("memories")
    );
    let out = answer(
        &Method::GET,
        "/collections/memories",
        false,
        error.as_bytes(),
        &ns,
    )
    .unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "{\"status\":{\"error\":\"Not found: Collection `memories` doesn't exist!\"}}"
    );
    assert_eq!(
        answer(
            &Method::POST,
            "/collections/memories/points/scroll",
            true,
            b"{}",
            &ns
        ),
        None
    );
    // A list that cannot be read shows nothing.
    for odd in [
        &b"not json"[..],
        br#"{"result": {"collections": {"name": "x"}}}"#,
        br#"{"result": null}"#,
    ] {
        let out: Value =
            serde_json::from_slice(&answer(&Method::GET, "/collections", true, odd, &ns).unwrap())
                .unwrap();
        assert_eq!(out["result"]["collections"], json!([]));
    }
}
