use hyper::Method;
use serde_json::{Value, json};

use super::*;

const ID: &str = "c0ffee00-0000-4000-8000-000000000001";

fn acme() -> Namespace {
    Namespace::of("acme")
}

fn db(name: &str) -> String {
    acme().physical(name).unwrap()
}

fn isolate(method: Method, path: &str) -> Result<Isolated, AdapterError> {
    request(&method, path, b"", &acme(), "home")
}

#[test]
fn every_database_a_path_names_is_the_callers_in_the_home_tenant() {
    let base = "/api/v2/tenants/default_tenant/databases";
    let mapped = |rest: &str| {
        format!(
            "/api/v2/tenants/home/databases/{}{rest}",
            db("default_database")
        )
    };
    for (method, path, want, shape, check) in [
        (
            Method::GET,
            format!("{base}/default_database"),
            mapped(""),
            Shape::Database,
            None,
        ),
        (
            Method::GET,
            format!("{base}/default_database/collections"),
            mapped("/collections"),
            Shape::Collections,
            None,
        ),
        (
            Method::POST,
            format!("{base}/default_database/collections"),
            mapped("/collections"),
            Shape::Collection,
            None,
        ),
        (
            Method::GET,
            format!("{base}/default_database/collections/notes"),
            mapped("/collections/notes"),
            Shape::Collection,
            None,
        ),
        (
            Method::DELETE,
            format!("{base}/default_database/collections/notes"),
            mapped("/collections/notes"),
            Shape::AsIs,
            None,
        ),
        (
            Method::GET,
            format!("{base}/default_database/collections_count"),
            mapped("/collections_count"),
            Shape::AsIs,
            None,
        ),
        (
            Method::PUT,
            format!("{base}/default_database/collections/{ID}"),
            mapped(&format!("/collections/{ID}")),
            Shape::AsIs,
            Some(ID),
        ),
        (
            Method::POST,
            format!("{base}/default_database/collections/{ID}/get"),
            mapped(&format!("/collections/{ID}/get")),
            Shape::AsIs,
            Some(ID),
        ),
        (
            Method::GET,
            format!("{base}/default_database/collections/{ID}/count"),
            mapped(&format!("/collections/{ID}/count")),
            Shape::AsIs,
            Some(ID),
        ),
        (
            Method::POST,
            format!("{base}/default_database/collections/{ID}/fork"),
            mapped(&format!("/collections/{ID}/fork")),
            Shape::Collection,
            Some(ID),
        ),
        (
            Method::GET,
            base.to_owned(),
            "/api/v2/tenants/home/databases".to_owned(),
            Shape::Databases,
            None,
        ),
        (
            Method::GET,
            "/api/v2/tenants/home".to_owned(),
            "/api/v2/tenants/home".to_owned(),
            Shape::Tenant,
            None,
        ),
        (
            Method::GET,
            "/api/v2/auth/identity".to_owned(),
            "/api/v2/auth/identity".to_owned(),
            Shape::Identity,
            None,
        ),
        (
            Method::GET,
            "/api/v2/heartbeat".to_owned(),
            "/api/v2/heartbeat".to_owned(),
            Shape::AsIs,
            None,
        ),
    ] {
        let isolated = isolate(method.clone(), &path).unwrap();
        assert_eq!(
            (
                isolated.path.as_str(),
                isolated.shape,
                isolated.check_id.as_deref()
            ),
            (want.as_str(), shape, check),
            "{method} {path}"
        );
    }
    let dropped = isolate(Method::DELETE, &format!("{base}/team_notes")).unwrap();
    assert_eq!((dropped.shape, dropped.drops_database), (Shape::AsIs, true));
    assert!(
        !isolate(Method::GET, &format!("{base}/team_notes"))
            .unwrap()
            .drops_database
    );
    // Another tenant's physical database is only a name in acme's namespace.
    let theirs = Namespace::of("globex")
        .physical("default_database")
        .unwrap();
    let isolated = isolate(
        Method::POST,
        &format!("{base}/{theirs}/collections/{ID}/get"),
    )
    .unwrap();
    assert_eq!(isolated.database, Some((theirs.clone(), db(&theirs))));
    for (method, path) in [
        (Method::POST, "/api/v2/tenants".to_owned()),
        (Method::PATCH, "/api/v2/tenants/default_tenant".to_owned()),
        (
            Method::GET,
            "/api/v2/tenants/other_tenant/databases".to_owned(),
        ),
        (Method::GET, format!("{base}/ab")),
        (Method::GET, format!("{base}/a..b")),
        (
            Method::PUT,
            format!("{base}/default_database/collections/{}", ID.to_uppercase()),
        ),
        (
            Method::POST,
            format!("{base}/default_database/collections/{{{ID}}}/get"),
        ),
    ] {
        assert!(isolate(method.clone(), &path).is_err(), "{method} {path}");
    }
}

#[test]
fn a_database_created_is_named_in_the_callers_namespace() {
    let isolated = request(
        &Method::POST,
        "/api/v2/tenants/default_tenant/databases",
        br#"{"name": "team_notes"}"#,
        &acme(),
        "home",
    )
    .unwrap();
    let body: Value = serde_json::from_slice(&isolated.body.unwrap()).unwrap();
    assert_eq!(body["name"], json!(db("team_notes")));
    assert!(
        request(
            &Method::POST,
            "/api/v2/tenants/default_tenant/databases",
            br#"{"name": "x"}"#,
            &acme(),
            "home"
        )
        .is_err()
    );
}

#[test]
fn answers_name_the_clients_tenant_and_databases_only() {
    let ns = acme();
    let theirs = Namespace::of("globex")
        .physical("default_database")
        .unwrap();
    let listed = isolate(Method::GET, "/api/v2/tenants/default_tenant/databases").unwrap();
    let databases = json!([
        {"id": "1", "name": db("default_database"), "tenant": "home"},
        {"id": "2", "name": theirs, "tenant": "home"},
        {"id": "3", "name": "made_around_lethe", "tenant": "home"},
        {"id": "4", "name": db("team_notes"), "tenant": "home"},
    ]);
    let body = serde_json::to_vec(&databases).unwrap();
    let out = |query| -> Value {
        serde_json::from_slice(&answer(&listed, true, &body, &ns, query).unwrap()).unwrap()
    };
    assert_eq!(
        out(None),
        json!([
            {"id": "1", "name": "default_database", "tenant": "default_tenant"},
            {"id": "4", "name": "team_notes", "tenant": "default_tenant"},
        ])
    );
    assert_eq!(
        out(Some("offset=1&limit=5")),
        json!([{"id": "4", "name": "team_notes", "tenant": "default_tenant"}])
    );
    let collections = isolate(
        Method::GET,
        "/api/v2/tenants/default_tenant/databases/default_database/collections",
    )
    .unwrap();
    let models =
        json!([{"id": ID, "name": "notes", "tenant": "home", "database": db("default_database")}]);
    let out: Value = serde_json::from_slice(
        &answer(
            &collections,
            true,
            &serde_json::to_vec(&models).unwrap(),
            &ns,
            None,
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        out,
        json!([{"id": ID, "name": "notes", "tenant": "default_tenant", "database": "default_database"}])
    );
    let error = format!(
        "{{\"error\":\"NotFoundError\",\"message\":\"Database [{}] not found\"}}",
        db("default_database")
    );
    assert_eq!(
        String::from_utf8(answer(&collections, false, error.as_bytes(), &ns, None).unwrap())
            .unwrap(),
        "{\"error\":\"NotFoundError\",\"message\":\"Database [default_database] not found\"}"
    );
    let tenant = isolate(Method::GET, "/api/v2/tenants/default_tenant").unwrap();
    let out: Value =
        serde_json::from_slice(&answer(&tenant, true, br#"{"name": "home"}"#, &ns, None).unwrap())
            .unwrap();
    assert_eq!(out, json!({"name": "default_tenant"}));
    let identity = isolate(Method::GET, "/api/v2/auth/identity").unwrap();
    let said =
        json!({"user_id": "u", "tenant": "home", "databases": [db("default_database"), "*"]});
    let out: Value = serde_json::from_slice(
        &answer(
            &identity,
            true,
            &serde_json::to_vec(&said).unwrap(),
            &ns,
            None,
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        out,
        json!({"user_id": "u", "tenant": "default_tenant", "databases": ["default_database"]})
    );
}

/// What cannot be read as the caller's is not passed on.
#[test]
fn unreadable_answers_show_nothing() {
    let ns = acme();
    let base = "/api/v2/tenants/default_tenant/databases";
    for (path, odd, shown) in [
        (base.to_owned(), &b"{\"a\": 1}"[..], json!([])),
        (base.to_owned(), b"not json", json!([])),
        (
            format!("{base}/default_database/collections"),
            br#"[{"id": "x"}, 7]"#,
            json!([]),
        ),
        (
            format!("{base}/default_database"),
            br#"{"name": "made_around_lethe"}"#,
            json!({"error": "LetheUnreadableAnswer"}),
        ),
        (
            format!("{base}/default_database/collections/notes"),
            b"[1]",
            json!({"error": "LetheUnreadableAnswer"}),
        ),
    ] {
        let isolated = isolate(Method::GET, &path).unwrap();
        let out: Value =
            serde_json::from_slice(&answer(&isolated, true, odd, &ns, None).unwrap()).unwrap();
        if shown.is_array() {
            assert_eq!(out, shown, "{path}");
        } else {
            assert_eq!(out["error"], shown["error"], "{path}");
        }
    }
}
