//! The control plane driven through `oneshot`, on a real SQLite state store.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::*;
use crate::auth::{Claims, Role, Verifier, mint_hs256};
use crate::testing::{fresh_sqlite_url, migrated};

const SECRET: &[u8] = b"control-test-secret";

struct Harness {
    app: Router,
    store: Arc<dyn Store>,
    url: String,
}

async fn harness() -> Harness {
    harness_with(|_| {}).await
}

/// A harness whose state `change` adjusts first.
async fn harness_with(change: impl FnOnce(&mut ControlState)) -> Harness {
    let url = fresh_sqlite_url();
    let store = migrated(&url).await;
    let mut state = ControlState {
        store: Arc::clone(&store),
        tokens: Tokens::lethe(Arc::new(Verifier::hs256(SECRET, "lethe", 0).unwrap())),
        audit_key: Arc::from(crate::testing::AUDIT_KEY),
        metrics: Arc::default(),
        max_body_bytes: 64 * 1024,
        governed: crate::governed::Governed::none(),
        data: None,
        // Tenant `mail` keys its subjects by e-mail address, in any case.
        folding: lethe_policy::names::Folding::new(["mail".to_owned()]),
        revocations: crate::revocations::Revocations::new(Arc::clone(&store)),
        sign_ins: Arc::default(),
        oidc: None,
        token_sign_in: true,
        sessions: super::SessionLimits {
            idle: std::time::Duration::from_secs(600),
            max: std::time::Duration::from_secs(3600),
        },
        erasure: ErasureSettings {
            approvals_required: 2,
            approval_requires_mfa: false,
            targets: vec!["chroma:chroma".into()],
            certifier: Arc::new(crate::erasure::certificate::Certifier::new(
                crate::erasure::certificate::Signer::from_seed(&[1; 32]).unwrap(),
                Default::default(),
                Arc::from(crate::testing::AUDIT_KEY),
            )),
            deadline_months: 1,
            inventory: Arc::new(crate::erasure::Inventory::new(
                Arc::clone(&store),
                vec![(
                    "chroma:chroma".into(),
                    crate::erasure::Target::own(
                        "chroma",
                        Arc::new(crate::testing::Holding { extra: 1 }),
                    ),
                )],
                Arc::from(crate::testing::AUDIT_KEY),
                std::time::Duration::from_secs(5),
            )),
        },
    };
    change(&mut state);
    Harness {
        app: app(state),
        store,
        url,
    }
}

fn token(role: Role, tenant: &str) -> String {
    let claims = Claims {
        sub: format!("{role}@{tenant}"),
        tenant: tenant.into(),
        role,
        subject: None,
        exp: jsonwebtoken::get_current_timestamp() + 600,
        jti: None,
        name: None,
        second_factor: false,
    };
    mint_hs256(SECRET, "lethe", &claims).unwrap()
}

impl Harness {
    async fn send(
        &self,
        method: Method,
        uri: &str,
        token: Option<&str>,
        body: Option<Body>,
    ) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(uri);
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = match body {
            Some(body) => request
                .header(header::CONTENT_TYPE, "application/json")
                .body(body),
            None => request.body(Body::empty()),
        }
        .unwrap();
        let response = self.app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
        (status, value)
    }

    async fn as_dpo(&self, method: Method, uri: &str, body: Option<Value>) -> (StatusCode, Value) {
        let body = body.map(|b| Body::from(b.to_string()));
        self.send(method, uri, Some(&token(Role::Compliance, "acme")), body)
            .await
    }

    async fn audit_seq(&self) -> i64 {
        self.store.audit_head(None).await.unwrap().seq
    }
}

fn grant_body(subject: &str) -> Value {
    json!({
        "subject": subject,
        "purpose": "personalization",
        "category": "preference",
        "actions": ["store", "retrieve"],
        "source": "signup-form",
        "policy_version": 2,
    })
}

/// Every error has the one shape, with a stable code and the request id.
fn assert_error(response: &(StatusCode, Value), status: StatusCode, code: &str) {
    assert_eq!(response.0, status, "{}", response.1);
    assert_eq!(response.1["error"]["code"], code, "{}", response.1);
    assert!(response.1["error"]["message"].is_string());
    assert!(
        response.1["error"]["request_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty())
    );
}

#[tokio::test]
async fn health_and_readiness() {
    let h = harness().await;
    assert_eq!(
        h.send(Method::GET, "/healthz", None, None).await.0,
        StatusCode::OK
    );
    let (status, body) = h.send(Method::GET, "/readyz", None, None).await;
    assert_eq!(
        (status, body["state_store"].as_str()),
        (StatusCode::OK, Some("sqlite"))
    );
}

#[tokio::test]
async fn callers_must_hold_a_valid_control_token() {
    let h = harness().await;
    assert_error(
        &h.send(Method::GET, "/v1/consents?subject=u1", None, None)
            .await,
        StatusCode::UNAUTHORIZED,
        "unauthenticated",
    );
    assert_error(
        &h.send(
            Method::GET,
            "/v1/consents?subject=u1",
            Some("garbage"),
            None,
        )
        .await,
        StatusCode::UNAUTHORIZED,
        "unauthenticated",
    );
    let forged = mint_hs256(
        b"another-secret",
        "lethe",
        &Claims {
            sub: "x".into(),
            tenant: "acme".into(),
            role: Role::Admin,
            subject: None,
            exp: jsonwebtoken::get_current_timestamp() + 600,
            jti: None,
            name: None,
            second_factor: false,
        },
    )
    .unwrap();
    assert_error(
        &h.send(Method::GET, "/v1/consents?subject=u1", Some(&forged), None)
            .await,
        StatusCode::UNAUTHORIZED,
        "unauthenticated",
    );
    assert_error(
        &h.send(
            Method::GET,
            "/v1/consents?subject=u1",
            Some(&token(Role::Agent, "acme")),
            None,
        )
        .await,
        StatusCode::FORBIDDEN,
        "forbidden",
    );
}

#[tokio::test]
async fn consent_is_granted_listed_and_revoked_once_with_audit_events() {
    let h = harness().await;
    let (status, created) = h
        .as_dpo(Method::POST, "/v1/consents", Some(grant_body("u1")))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(
        (created["status"].as_str(), created["tenant"].as_str()),
        (Some("active"), Some("acme"))
    );

    let (_, listed) = h.as_dpo(Method::GET, "/v1/consents?subject=u1", None).await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 1);
    assert_eq!(listed["items"][0]["actions"], json!(["store", "retrieve"]));

    let (status, revoked) = h
        .as_dpo(Method::POST, &format!("/v1/consents/{id}/revoke"), None)
        .await;
    assert_eq!(
        (status, revoked["status"].as_str()),
        (StatusCode::OK, Some("revoked"))
    );
    let seq = h.audit_seq().await;
    assert_error(
        &h.as_dpo(Method::POST, &format!("/v1/consents/{id}/revoke"), None)
            .await,
        StatusCode::CONFLICT,
        "already_revoked",
    );
    assert_error(
        &h.as_dpo(Method::POST, "/v1/consents/cg_nope/revoke", None)
            .await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    assert_eq!(
        h.audit_seq().await,
        seq,
        "refused changes leave no audit event"
    );

    let events = h.store.audit_page(0, 10, None).await.unwrap();
    let actions: Vec<_> = events
        .iter()
        .map(|e| (e.entry.action.as_str(), e.entry.actor.as_str()))
        .collect();
    assert_eq!(
        actions,
        [
            ("consent.grant", "compliance@acme"),
            ("consent.revoke", "compliance@acme")
        ]
    );
    let subject_ref = events[0].entry.subject_ref.clone().unwrap();
    assert_eq!(subject_ref.len(), 64);
    assert_eq!(events[0].entry.target_ref.as_deref(), Some(id.as_str()));
}

#[tokio::test]
async fn tenants_are_kept_apart() {
    let h = harness().await;
    let (_, created) = h
        .as_dpo(Method::POST, "/v1/consents", Some(grant_body("u1")))
        .await;
    let id = created["id"].as_str().unwrap();
    let other = token(Role::Compliance, "globex");
    assert_error(
        &h.send(
            Method::GET,
            "/v1/consents?tenant=acme&subject=u1",
            Some(&other),
            None,
        )
        .await,
        StatusCode::FORBIDDEN,
        "forbidden",
    );
    assert_error(
        &h.send(
            Method::POST,
            &format!("/v1/consents/{id}/revoke"),
            Some(&other),
            None,
        )
        .await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    assert_error(
        &h.send(Method::GET, "/v1/subjects/acme/u1", Some(&other), None)
            .await,
        StatusCode::FORBIDDEN,
        "forbidden",
    );
    let (status, _) = h
        .send(
            Method::GET,
            "/v1/subjects/acme/u1",
            Some(&token(Role::Admin, "ops")),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "admins see every tenant");
}

#[tokio::test]
async fn bad_input_gets_a_stable_4xx_and_writes_nothing() {
    let h = harness().await;
    let dpo = token(Role::Compliance, "acme");
    let send_raw = |body: &'static str| {
        let h = &h;
        let dpo = dpo.clone();
        async move {
            h.send(
                Method::POST,
                "/v1/consents",
                Some(&dpo),
                Some(Body::from(body)),
            )
            .await
        }
    };
    assert_error(
        &send_raw("{\"subject\": ").await,
        StatusCode::BAD_REQUEST,
        "invalid_json",
    );
    let mut wrong_type = grant_body("u1");
    wrong_type["policy_version"] = json!("two");
    assert_error(
        &h.as_dpo(Method::POST, "/v1/consents", Some(wrong_type))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_request",
    );
    let mut unknown_field = grant_body("u1");
    unknown_field["colour"] = json!("red");
    assert_error(
        &h.as_dpo(Method::POST, "/v1/consents", Some(unknown_field))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_request",
    );
    let mut unknown_action = grant_body("u1");
    unknown_action["actions"] = json!(["store", "sell"]);
    assert_error(
        &h.as_dpo(Method::POST, "/v1/consents", Some(unknown_action))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_request",
    );

    let mut many = grant_body("a/b");
    many["actions"] = json!([]);
    many["expires_at"] = json!("2001-01-01T00:00:00Z");
    many["purpose"] = json!("");
    let response = h.as_dpo(Method::POST, "/v1/consents", Some(many)).await;
    assert_error(
        &response,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
    );
    assert_eq!(
        response.1["error"]["details"].as_array().unwrap().len(),
        4,
        "{}",
        response.1
    );

    let huge = format!("{{\"subject\": \"{}\"}}", "x".repeat(100 * 1024));
    assert_error(
        &h.send(
            Method::POST,
            "/v1/consents",
            Some(&dpo),
            Some(Body::from(huge)),
        )
        .await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
    );
    let no_type = Request::builder()
        .method(Method::POST)
        .uri("/v1/consents")
        .header(header::AUTHORIZATION, format!("Bearer {dpo}"))
        .body(Body::from(grant_body("u1").to_string()))
        .unwrap();
    assert_eq!(
        h.app.clone().oneshot(no_type).await.unwrap().status(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    assert_error(
        &h.as_dpo(Method::GET, "/v1/consents", None).await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    );

    assert_eq!(h.audit_seq().await, 0, "nothing was written");
    assert!(h.store.grants("acme", "u1").await.unwrap().is_empty());
    assert_eq!(h.store.subject("acme", "u1").await.unwrap(), None);
}

#[tokio::test]
async fn unknown_endpoints_and_methods_use_the_error_shape() {
    let h = harness().await;
    assert_error(
        &h.as_dpo(Method::GET, "/v1/nothing-here", None).await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    assert_error(
        &h.as_dpo(Method::DELETE, "/v1/consents", None).await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
}

#[tokio::test]
async fn retention_rules_are_replaced_as_new_versions_and_bad_rules_refused() {
    let h = harness().await;
    let (_, empty) = h.as_dpo(Method::GET, "/v1/retention-rules", None).await;
    assert_eq!(
        (
            empty["version"].as_i64(),
            empty["rules"].as_array().map(Vec::len)
        ),
        (Some(0), Some(0))
    );

    let rules = json!({"rules": [
        {"purpose": "personalization", "category": "preference", "max_age": "365d"},
        {"purpose": "personalization", "category": "preference", "layer": "cache", "max_age": "12h"},
    ], "purpose_ends": [{"purpose": "campaign", "ends_at": "2027-01-01T00:00:00Z"}]});
    let (status, v1) = h
        .as_dpo(Method::PUT, "/v1/retention-rules", Some(rules.clone()))
        .await;
    assert_eq!(
        (status, v1["version"].as_i64()),
        (StatusCode::OK, Some(1)),
        "{v1}"
    );
    assert_eq!(v1["rules"][1]["max_age"], "12h");
    assert_eq!(v1["created_by"], "compliance@acme");

    for (bad, code) in [
        (
            json!({"rules": [{"purpose": "p", "category": "c", "max_age": "0d"}]}),
            "invalid_request",
        ),
        (
            json!({"rules": [{"purpose": "p", "category": "c", "max_age": "-3d"}]}),
            "invalid_request",
        ),
        (
            json!({"rules": [{"purpose": "p", "category": "c", "max_age": "forever"}]}),
            "invalid_request",
        ),
        (
            json!({"rules": [{"purpose": "p", "category": "c", "max_age": "1d"}, {"purpose": "p", "category": "c", "max_age": "2d"}]}),
            "validation_failed",
        ),
    ] {
        assert_error(
            &h.as_dpo(Method::PUT, "/v1/retention-rules", Some(bad))
                .await,
            StatusCode::UNPROCESSABLE_ENTITY,
            code,
        );
    }
    let (_, current) = h.as_dpo(Method::GET, "/v1/retention-rules", None).await;
    assert_eq!(current["version"], 1, "refused versions were not stored");
    let (_, v2) = h
        .as_dpo(Method::PUT, "/v1/retention-rules", Some(rules))
        .await;
    assert_eq!(v2["version"], 2);
}

#[tokio::test]
async fn legal_holds_are_placed_listed_and_released_once() {
    let h = harness().await;
    let (status, hold) = h
        .as_dpo(
            Method::POST,
            "/v1/legal-holds",
            Some(json!({"subject": "u1", "reason": "case 42"})),
        )
        .await;
    assert_eq!(
        (status, hold["active"].as_bool()),
        (StatusCode::CREATED, Some(true)),
        "{hold}"
    );
    h.as_dpo(
        Method::POST,
        "/v1/legal-holds",
        Some(json!({"reason": "tenant-wide preservation"})),
    )
    .await;
    let (_, listed) = h
        .as_dpo(Method::GET, "/v1/legal-holds?subject=u1", None)
        .await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 2);

    let id = hold["id"].as_str().unwrap();
    let (status, released) = h
        .as_dpo(Method::POST, &format!("/v1/legal-holds/{id}/release"), None)
        .await;
    assert_eq!(
        (status, released["active"].as_bool()),
        (StatusCode::OK, Some(false))
    );
    assert_eq!(released["released_by"], "compliance@acme");
    assert_error(
        &h.as_dpo(Method::POST, &format!("/v1/legal-holds/{id}/release"), None)
            .await,
        StatusCode::CONFLICT,
        "already_released",
    );
    assert_error(
        &h.as_dpo(
            Method::POST,
            "/v1/legal-holds",
            Some(json!({"reason": " "})),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
    );
}

#[tokio::test]
async fn the_subject_view_shows_state_grants_holds_and_inventory() {
    let h = harness().await;
    assert_error(
        &h.as_dpo(Method::GET, "/v1/subjects/acme/u1", None).await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    h.as_dpo(Method::POST, "/v1/consents", Some(grant_body("u1")))
        .await;
    h.as_dpo(
        Method::POST,
        "/v1/legal-holds",
        Some(json!({"subject": "u1", "reason": "case 7"})),
    )
    .await;
    let item = |store: &str, id: &str| crate::state::ItemRecord {
        store: store.into(),
        collection: "memories".into(),
        item_id: id.into(),
        tenant: "acme".into(),
        subject: "u1".into(),
        purpose: "personalization".into(),
        category: "preference".into(),
        layer: lethe_policy::Layer::Raw,
        created_at: crate::now(),
        expires_at: crate::now() + chrono::TimeDelta::days(1),
        epoch: 0,
        source_ref: None,
        parents: vec![],
    };
    h.store
        .record_items(&[
            item("chroma", "a"),
            item("chroma", "b"),
            item("langgraph", "c"),
        ])
        .await
        .unwrap();

    let (status, view) = h.as_dpo(Method::GET, "/v1/subjects/acme/u1", None).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    assert_eq!(
        (
            view["state"].as_str(),
            view["epoch"].as_i64(),
            view["held"].as_bool()
        ),
        (Some("active"), Some(0), Some(true))
    );
    assert_eq!(view["grants"].as_array().unwrap().len(), 1);
    assert_eq!(view["inventory"], json!({"chroma": 2, "langgraph": 1}));
    assert_eq!(view["subject_ref"].as_str().unwrap().len(), 64);
}

#[tokio::test]
async fn the_audit_log_pages_and_verifies_and_tampering_shows() {
    let h = harness().await;
    for subject in ["u1", "u2", "u3"] {
        h.as_dpo(Method::POST, "/v1/consents", Some(grant_body(subject)))
            .await;
    }
    let (_, first) = h.as_dpo(Method::GET, "/v1/audit?limit=2", None).await;
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    assert_eq!(first["next_cursor"], 2);
    let (_, rest) = h
        .as_dpo(Method::GET, "/v1/audit?after=2&limit=2", None)
        .await;
    assert_eq!(
        (
            rest["items"][0]["seq"].as_i64(),
            rest["next_cursor"].is_null()
        ),
        (Some(3), true)
    );
    for e in first["items"].as_array().unwrap() {
        let text = e.to_string();
        assert!(
            !text.contains("\"u1\"") && !text.contains("signup-form"),
            "audit rows are content-free: {text}"
        );
    }
    assert_error(
        &h.as_dpo(Method::GET, "/v1/audit?limit=0", None).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_request",
    );

    let (_, intact) = h.as_dpo(Method::GET, "/v1/audit/verify", None).await;
    assert_eq!(
        (intact["ok"].as_bool(), intact["head"]["seq"].as_i64()),
        (Some(true), Some(3))
    );
    crate::testing::execute_raw(
        &h.url,
        "UPDATE audit_events SET result = 'denied' WHERE seq = 2",
    )
    .await
    .unwrap();
    let (_, broken) = h.as_dpo(Method::GET, "/v1/audit/verify", None).await;
    assert_eq!(
        (broken["ok"].as_bool(), broken["first_bad_seq"].as_i64()),
        (Some(false), Some(2)),
        "{broken}"
    );
}

#[tokio::test]
async fn a_compliance_token_reads_and_verifies_only_its_tenants_audit_events() {
    let h = harness().await;
    let globex = token(Role::Compliance, "globex");
    let admin = token(Role::Admin, "acme");
    for subject in ["u1", "u2"] {
        h.as_dpo(Method::POST, "/v1/consents", Some(grant_body(subject)))
            .await;
    }
    let body = Body::from(json!({"tenant": "globex", "subject": "g1", "purpose": "personalization",
        "category": "preference", "actions": ["store"], "source": "signup-form", "policy_version": 1}).to_string());
    let (status, _) = h
        .send(Method::POST, "/v1/consents", Some(&globex), Some(body))
        .await;
    assert_eq!(status, StatusCode::CREATED);

    let tenants = |page: &Value| -> Vec<String> {
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["tenant"].as_str().unwrap_or("-").to_owned())
            .collect()
    };
    let (_, own) = h.send(Method::GET, "/v1/audit", Some(&globex), None).await;
    assert_eq!(tenants(&own), ["globex"]);
    assert_eq!(own["items"][0]["tenant_chain"]["seq"], 1);
    let (_, acme) = h.as_dpo(Method::GET, "/v1/audit", None).await;
    assert_eq!(tenants(&acme), ["acme", "acme"]);
    assert_error(
        &h.send(Method::GET, "/v1/audit?tenant=acme", Some(&globex), None)
            .await,
        StatusCode::FORBIDDEN,
        "forbidden",
    );
    let (_, all) = h.send(Method::GET, "/v1/audit", Some(&admin), None).await;
    assert_eq!(tenants(&all), ["acme", "acme", "globex"]);
    let (_, one) = h
        .send(Method::GET, "/v1/audit?tenant=globex", Some(&admin), None)
        .await;
    assert_eq!(tenants(&one), ["globex"]);

    let (_, verified) = h
        .send(Method::GET, "/v1/audit/verify", Some(&globex), None)
        .await;
    assert_eq!(
        (verified["ok"].as_bool(), verified["head"]["seq"].as_i64()),
        (Some(true), Some(1)),
        "globex's own chain: {verified}"
    );
    assert_error(
        &h.send(
            Method::GET,
            "/v1/audit/verify?tenant=acme",
            Some(&globex),
            None,
        )
        .await,
        StatusCode::FORBIDDEN,
        "forbidden",
    );
    // acme's broken row is acme's: globex's chain still verifies, the whole chain does not.
    crate::testing::execute_raw(
        &h.url,
        "UPDATE audit_events SET result = 'denied' WHERE seq = 1",
    )
    .await
    .unwrap();
    let (_, verified) = h
        .send(Method::GET, "/v1/audit/verify", Some(&globex), None)
        .await;
    assert_eq!(verified["ok"], true, "{verified}");
    let (_, broken) = h.as_dpo(Method::GET, "/v1/audit/verify", None).await;
    assert_eq!(
        (broken["ok"].as_bool(), broken["first_bad_seq"].as_i64()),
        (Some(false), Some(1))
    );
    let (_, whole) = h
        .send(Method::GET, "/v1/audit/verify", Some(&admin), None)
        .await;
    assert_eq!(whole["ok"], false);
}

#[tokio::test]
async fn metrics_labels_are_bounded_whatever_the_requests() {
    let h = harness().await;
    for i in 0..50 {
        let method = Method::from_bytes(format!("INVENTED{i}").as_bytes()).unwrap();
        h.send(method, &format!("/nowhere/{i}"), None, None).await;
    }
    let (_, text) = h.send(Method::GET, "/metrics", None, None).await;
    let text = text.as_str().unwrap();
    assert!(!text.contains("INVENTED"), "{text}");
    assert!(!text.contains("/nowhere"), "{text}");
    let series = text
        .lines()
        .filter(|l| l.starts_with("lethe_control_requests_total{"))
        .count();
    assert!(
        series <= 2,
        "50 invented methods and paths made {series} series: {text}"
    );
}

#[tokio::test]
async fn metrics_count_requests_by_route_template() {
    let h = harness().await;
    h.as_dpo(Method::GET, "/v1/subjects/acme/very-secret-subject", None)
        .await;
    let (status, text) = h.send(Method::GET, "/metrics", None, None).await;
    let text = text.as_str().unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(text.contains(r#"lethe_control_requests_total{route="/v1/subjects/{tenant}/{subject}",method="GET",status="404"} 1"#), "{text}");
    assert!(!text.contains("very-secret-subject"));
}

/// Every operation the OpenAPI document lists is served (not 404 from the fallback, not 405).
#[tokio::test]
async fn the_openapi_document_matches_the_routes() {
    let h = harness().await;
    let (status, doc) = h.send(Method::GET, "/openapi.json", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        doc["openapi"].as_str().map(|v| v.starts_with("3.")),
        Some(true)
    );
    let paths = doc["paths"].as_object().unwrap();
    let mut operations = 0;
    for (path, item) in paths {
        for method in item.as_object().unwrap().keys() {
            let concrete = path
                .replace("{id}", "x")
                .replace("{tenant}", "acme")
                .replace("{subject}", "u1")
                .replace("{store}", "chroma")
                .replace("{collection}", "c1")
                .replace("{item}", "m1");
            let method: Method = method.to_uppercase().parse().unwrap();
            let body = (method == Method::POST || method == Method::PUT).then(|| json!({}));
            let (status, body) = h.as_dpo(method.clone(), &concrete, body).await;
            let unrouted = status == StatusCode::METHOD_NOT_ALLOWED
                || (status == StatusCode::NOT_FOUND
                    && body["error"]["message"] == "no such endpoint");
            assert!(!unrouted, "{method} {path} is documented but not served");
            operations += 1;
        }
    }
    assert_eq!(
        operations, 28,
        "the document and the router list the same 28 operations"
    );
}

fn token_as(role: Role, actor: &str) -> String {
    let claims = Claims {
        sub: actor.into(),
        tenant: "acme".into(),
        role,
        subject: None,
        exp: jsonwebtoken::get_current_timestamp() + 600,
        jti: None,
        name: None,
        second_factor: false,
    };
    mint_hs256(SECRET, "lethe", &claims).unwrap()
}

impl Harness {
    async fn as_actor(
        &self,
        actor: &str,
        method: Method,
        uri: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let body = body.map(|b| Body::from(b.to_string()));
        self.send(method, uri, Some(&token_as(Role::Compliance, actor)), body)
            .await
    }

    async fn subject_state(&self, subject: &str) -> (String, i64) {
        let state = self.store.subject("acme", subject).await.unwrap().unwrap();
        (state.status.as_str().to_owned(), state.epoch)
    }
}

fn erasure_body(subject: &str) -> Value {
    json!({"subject": subject, "aliases": [format!("{subject}@mail")], "ticket": "DSR-1", "reason": "art. 17 request"})
}

#[tokio::test]
async fn an_erasure_needs_two_different_approvers_then_flips_every_key() {
    let h = harness().await;
    h.as_dpo(Method::POST, "/v1/consents", Some(grant_body("u1")))
        .await;
    let (status, filed) = h
        .as_actor(
            "alice",
            Method::POST,
            "/v1/erasures",
            Some(erasure_body("u1")),
        )
        .await;
    assert_eq!(
        (status, filed["state"].as_str()),
        (StatusCode::CREATED, Some("requested")),
        "{filed}"
    );
    assert_eq!(filed["targets"][0]["target"], "chroma:chroma");
    assert_eq!(filed["targets"][0]["state"], "waiting");
    let id = filed["id"].as_str().unwrap();
    let approve = format!("/v1/erasures/{id}/approve");

    // The requester is not one of the two approvers, in any case or spacing.
    for requester in ["alice", "ALICE"] {
        assert_error(
            &h.as_actor(requester, Method::POST, &approve, None).await,
            StatusCode::CONFLICT,
            "requester_cannot_approve",
        );
    }
    let (_, once) = h.as_actor("bob", Method::POST, &approve, None).await;
    assert_eq!(
        (once["state"].as_str(), once["approvals"].clone()),
        (Some("requested"), json!(["bob"]))
    );
    assert_error(
        &h.as_actor("bob", Method::POST, &approve, None).await,
        StatusCode::CONFLICT,
        "already_approved",
    );
    // One person, two spellings: still one approval.
    for again in ["Bob", "BOB", "b ob"] {
        assert_error(
            &h.as_actor(again, Method::POST, &approve, None).await,
            StatusCode::CONFLICT,
            "confusable_approver",
        );
    }
    // An actor id with whitespace at its edge is not a canonical id: no token names it.
    assert_error(
        &h.as_actor("bob ", Method::POST, &approve, None).await,
        StatusCode::UNAUTHORIZED,
        "unauthenticated",
    );
    assert_eq!(
        h.subject_state("u1").await,
        ("active".into(), 0),
        "one approver alone changes nothing"
    );

    let (status, flipped) = h.as_actor("carol", Method::POST, &approve, None).await;
    assert_eq!(
        (status, flipped["state"].as_str()),
        (StatusCode::OK, Some("suppressed")),
        "{flipped}"
    );
    assert!(
        flipped["online_latency_ms"]
            .as_i64()
            .is_some_and(|ms| ms >= 0)
    );
    assert_eq!(
        flipped["targets"][0]["state"], "pending",
        "the purge is released by the flip"
    );
    assert_eq!(h.subject_state("u1").await, ("suppressed".into(), 1));
    assert_eq!(
        h.subject_state("u1@mail").await,
        ("suppressed".into(), 1),
        "aliases are flipped too"
    );
    assert_error(
        &h.as_actor("carol", Method::POST, &approve, None).await,
        StatusCode::CONFLICT,
        "not_awaiting_approval",
    );
    assert_error(
        &h.as_dpo(Method::POST, "/v1/consents", Some(grant_body("u1")))
            .await,
        StatusCode::CONFLICT,
        "subject_suppressed",
    );

    let (_, status_view) = h
        .as_dpo(Method::GET, &format!("/v1/erasures/{id}"), None)
        .await;
    assert_eq!(status_view["state"], "suppressed");
    let actions: Vec<String> = h
        .store
        .audit_page(0, 100, None)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.entry.action)
        .collect();
    assert!(
        actions.ends_with(&[
            "erasure.request".into(),
            "erasure.approve".into(),
            "erasure.approve".into(),
            "erasure.suppress".into()
        ]),
        "{actions:?}"
    );
}

#[tokio::test]
async fn a_legal_hold_parks_an_erasure_until_every_covering_hold_is_released() {
    let h = harness().await;
    let (_, subject_hold) = h
        .as_dpo(
            Method::POST,
            "/v1/legal-holds",
            Some(json!({"subject": "u1", "reason": "case 9"})),
        )
        .await;
    let (_, tenant_hold) = h
        .as_dpo(
            Method::POST,
            "/v1/legal-holds",
            Some(json!({"reason": "tenant preservation"})),
        )
        .await;
    let (_, filed) = h
        .as_actor(
            "alice",
            Method::POST,
            "/v1/erasures",
            Some(erasure_body("u1")),
        )
        .await;
    let id = filed["id"].as_str().unwrap();
    h.as_actor(
        "bob",
        Method::POST,
        &format!("/v1/erasures/{id}/approve"),
        None,
    )
    .await;
    let (_, held) = h
        .as_actor(
            "carol",
            Method::POST,
            &format!("/v1/erasures/{id}/approve"),
            None,
        )
        .await;
    assert_eq!(held["state"], "held", "{held}");
    assert_eq!(held["targets"][0]["state"], "waiting");
    assert!(
        h.store.subject("acme", "u1@mail").await.unwrap().is_none(),
        "nothing flipped while held"
    );

    let release =
        |hold: &Value| format!("/v1/legal-holds/{}/release", hold["id"].as_str().unwrap());
    h.as_dpo(Method::POST, &release(&subject_hold), None).await;
    let (_, still) = h
        .as_dpo(Method::GET, &format!("/v1/erasures/{id}"), None)
        .await;
    assert_eq!(
        still["state"], "held",
        "the tenant-wide hold still covers it"
    );

    h.as_dpo(Method::POST, &release(&tenant_hold), None).await;
    let (_, resumed) = h
        .as_dpo(Method::GET, &format!("/v1/erasures/{id}"), None)
        .await;
    assert_eq!(
        resumed["state"], "suppressed",
        "it continues by itself: {resumed}"
    );
    assert_eq!(resumed["targets"][0]["state"], "pending");
    assert_eq!(h.subject_state("u1").await, ("suppressed".into(), 1));
}

#[tokio::test]
async fn bad_erasure_requests_are_refused() {
    let h = harness().await;
    let response = h
        .as_dpo(
            Method::POST,
            "/v1/erasures",
            Some(json!({"subject": "u1", "aliases": ["u1"], "ticket": " ", "reason": ""})),
        )
        .await;
    assert_error(
        &response,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
    );
    assert_eq!(response.1["error"]["details"].as_array().unwrap().len(), 3);
    assert_error(
        &h.as_dpo(Method::POST, "/v1/erasures/er_nope/approve", None)
            .await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    let (_, filed) = h
        .as_dpo(Method::POST, "/v1/erasures", Some(erasure_body("u1")))
        .await;
    let other = token(Role::Compliance, "globex");
    let path = format!("/v1/erasures/{}", filed["id"].as_str().unwrap());
    assert_error(
        &h.send(Method::GET, &path, Some(&other), None).await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
}

/// Files an erasure of `subject` as the tenant's DPO; its id.
async fn filed(h: &Harness, subject: &str) -> String {
    let (status, filed) = h
        .as_dpo(Method::POST, "/v1/erasures", Some(erasure_body(subject)))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{filed}");
    filed["id"].as_str().unwrap().to_owned()
}

/// A console request: its status, headers and page.
async fn console(
    h: &Harness,
    method: Method,
    uri: &str,
    cookie: Option<&str>,
    form: Option<&str>,
) -> (StatusCode, axum::http::HeaderMap, String) {
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(cookie) = cookie {
        request = request.header(header::COOKIE, cookie);
    }
    let request = match form {
        Some(form) => request
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(form.to_owned())),
        None => request.body(Body::empty()),
    }
    .unwrap();
    let response = h.app.clone().oneshot(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&bytes).into(),
    )
}

/// The sign-in page's cookie and the CSRF token its form carries.
async fn sign_in_page(h: &Harness) -> (String, String) {
    let (status, headers, page) = console(h, Method::GET, "/console/sign-in", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let cookie = headers[header::SET_COOKIE].to_str().unwrap();
    (cookie.split(';').next().unwrap().to_owned(), csrf_in(&page))
}

/// Posts the sign-in form with `token`, as the sign-in page's form would.
async fn post_sign_in(h: &Harness, token: &str) -> (StatusCode, axum::http::HeaderMap, String) {
    let (cookie, csrf) = sign_in_page(h).await;
    let form = format!("csrf={csrf}&token={token}");
    console(
        h,
        Method::POST,
        "/console/sign-in",
        Some(&cookie),
        Some(&form),
    )
    .await
}

/// Signs in with `token`; the session cookie to send back.
async fn sign_in(h: &Harness, token: &str) -> String {
    let (status, headers, _) = post_sign_in(h, token).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let cookie = headers[header::SET_COOKIE].to_str().unwrap().to_owned();
    cookie.split(';').next().unwrap().to_owned()
}

/// The CSRF token a console page's forms carry.
fn csrf_in(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with a CSRF token")
        + 19;
    page[at..].split('"').next().unwrap().to_owned()
}

#[tokio::test]
async fn the_console_signs_in_compliance_and_admin_tokens_only_with_a_strict_cookie() {
    let h = harness().await;
    let (status, headers, _) = console(&h, Method::GET, "/console/requests", None, None).await;
    assert_eq!(
        (status, headers[header::LOCATION].to_str().unwrap()),
        (StatusCode::SEE_OTHER, "/console/sign-in")
    );
    let (status, _, page) = console(&h, Method::GET, "/console/sign-in", None, None).await;
    assert!(
        status == StatusCode::OK
            && page.contains("name=\"token\"")
            && page.contains("<label for=\"token\">")
    );
    for refused in [token(Role::Agent, "acme"), "not-a-token".to_owned()] {
        let (status, headers, page) = post_sign_in(&h, &refused).await;
        assert!(
            status == StatusCode::FORBIDDEN || status == StatusCode::UNAUTHORIZED,
            "{status}"
        );
        assert!(
            !headers
                .get_all(header::SET_COOKIE)
                .iter()
                .any(|c| c.to_str().unwrap().starts_with("lethe_console="))
                && page.contains("Not signed in"),
            "{page}"
        );
    }
    let (status, headers, _) = post_sign_in(&h, &token(Role::Compliance, "acme")).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let cookie = headers[header::SET_COOKIE].to_str().unwrap();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/console"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    assert!(!cookie.contains("Secure"), "served over plain HTTP here");
    let max_age: u64 = cookie.split("Max-Age=").nth(1).unwrap().parse().unwrap();
    assert!(
        (590..=600).contains(&max_age),
        "the session expires with the token: {cookie}"
    );
    let session = cookie.split(';').next().unwrap();
    let (status, _, page) =
        console(&h, Method::GET, "/console/requests", Some(session), None).await;
    assert!(
        status == StatusCode::OK && page.contains("No erasure requests here"),
        "{page}"
    );
}

#[tokio::test]
async fn the_console_shows_a_tenants_requests_only_and_refuses_forms_without_their_csrf_token() {
    let h = harness().await;
    h.as_dpo(Method::POST, "/v1/consents", Some(grant_body("u1")))
        .await;
    let id = filed(&h, "u1").await;
    let other = h
        .send(
            Method::POST,
            "/v1/erasures",
            Some(&token(Role::Compliance, "globex")),
            Some(Body::from(erasure_body("g1").to_string())),
        )
        .await;
    let other_id = other.1["id"].as_str().unwrap().to_owned();

    let session = sign_in(&h, &token_as(Role::Compliance, "dpo-b")).await;
    let (_, _, list) = console(&h, Method::GET, "/console/requests", Some(&session), None).await;
    assert!(list.contains(&id) && !list.contains(&other_id), "{list}");
    assert!(list.contains("days left"), "the deadline badge: {list}");
    assert!(
        list.contains("<dd>requested 1</dd><dt>Overdue</dt><dd>0</dd>"),
        "{list}"
    );
    for (filter, shown) in [
        ("state=requested", true),
        ("state=completed", false),
        ("due=overdue", false),
        ("due=", true),
    ] {
        let (_, _, filtered) = console(
            &h,
            Method::GET,
            &format!("/console/requests?{filter}"),
            Some(&session),
            None,
        )
        .await;
        assert_eq!(filtered.contains(&format!(">{id}</a>")), shown, "{filter}");
    }
    assert!(
        !list.contains("u1"),
        "the subject's key is never shown, only its reference"
    );
    let (status, _, _) = console(
        &h,
        Method::GET,
        &format!("/console/requests/{other_id}"),
        Some(&session),
        None,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another tenant's request does not exist here"
    );

    let page_uri = format!("/console/requests/{id}");
    let (_, _, page) = console(&h, Method::GET, &page_uri, Some(&session), None).await;
    assert!(
        page.contains("Approve the erasure") && page.contains("chroma:chroma"),
        "{page}"
    );
    assert!(
        page.contains("2 more approvals needed, by any compliance or admin person of acme"),
        "{page}"
    );
    let approve = format!("{page_uri}/approve");
    for forged in [None, Some("csrf=00"), Some("csrf=")] {
        let (status, _, refused) =
            console(&h, Method::POST, &approve, Some(&session), forged).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{forged:?}");
        assert!(refused.contains("Nothing was changed"));
    }
    let (_, still) = h
        .as_dpo(Method::GET, &format!("/v1/erasures/{id}"), None)
        .await;
    assert_eq!(
        still["approvals"],
        json!([]),
        "a refused form changes nothing"
    );
    // Another session's token does not pass for this one's.
    let other_session = sign_in(&h, &token_as(Role::Compliance, "bob")).await;
    let (_, _, bobs_page) = console(&h, Method::GET, &page_uri, Some(&other_session), None).await;
    let (status, _, _) = console(
        &h,
        Method::POST,
        &approve,
        Some(&session),
        Some(&format!("csrf={}", csrf_in(&bobs_page))),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let form = format!("csrf={}", csrf_in(&page));
    let (status, headers, _) =
        console(&h, Method::POST, &approve, Some(&session), Some(&form)).await;
    assert_eq!(
        (status, headers[header::LOCATION].to_str().unwrap()),
        (StatusCode::SEE_OTHER, page_uri.as_str())
    );
    let (_, approved) = h
        .as_dpo(Method::GET, &format!("/v1/erasures/{id}"), None)
        .await;
    assert_eq!(
        approved["approvals"].as_array().unwrap().len(),
        1,
        "{approved}"
    );
    let (_, _, page) = console(&h, Method::GET, &page_uri, Some(&session), None).await;
    assert!(
        page.contains("You approved this request; another person must approve it too."),
        "{page}"
    );
    assert!(
        page.contains("<h2>Timeline</h2>")
            && page.contains("erasure.request")
            && page.contains("erasure.approve"),
        "{page}"
    );

    // The audit trail of it all, content-free, verified, and exported whole.
    let (_, _, audit) = console(
        &h,
        Method::GET,
        "/console/audit?verify",
        Some(&session),
        None,
    )
    .await;
    assert!(
        audit.contains("is intact")
            && audit.contains("erasure.approve")
            && audit.contains("consent.grant"),
        "{audit}"
    );
    assert!(
        !audit.contains("u1@mail") && !audit.contains(">u1<"),
        "no key in the audit page"
    );
    let (status, headers, export) = console(
        &h,
        Method::GET,
        "/console/audit/export",
        Some(&session),
        None,
    )
    .await;
    assert_eq!(
        (status, headers[header::CONTENT_TYPE].to_str().unwrap()),
        (StatusCode::OK, "application/x-ndjson")
    );
    let (_, head) = h.as_dpo(Method::GET, "/v1/audit/verify", None).await;
    assert_eq!(
        export.lines().count() as u64,
        head["head"]["seq"].as_u64().unwrap(),
        "{head}"
    );

    let (status, headers, _) = console(
        &h,
        Method::POST,
        "/console/sign-out",
        Some(&session),
        Some(&form),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(
        headers[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
}

#[tokio::test]
async fn the_console_edits_rules_as_a_new_version_after_a_preview_and_places_and_releases_holds() {
    let h = harness().await;
    let rules = json!({"rules": [{"purpose": "personalization", "category": "preference", "max_age": "30d"}]});
    h.as_dpo(Method::PUT, "/v1/retention-rules", Some(rules))
        .await;
    let session = sign_in(&h, &token(Role::Compliance, "acme")).await;
    let (_, _, page) = console(&h, Method::GET, "/console/policy", Some(&session), None).await;
    assert!(
        page.contains("Version 1") && page.contains("personalization / preference / any layer"),
        "{page}"
    );
    let csrf = csrf_in(&page);
    let next = json!({"rules": [
        {"purpose": "personalization", "category": "preference", "max_age": "7d"},
        {"purpose": "support", "category": "conversation", "max_age": "90d"},
    ]})
    .to_string();
    let form = |extra: &str| {
        let encoded: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("csrf", &csrf)
            .append_pair("rules", &next)
            .finish();
        format!("{encoded}{extra}")
    };
    let (status, _, preview) = console(
        &h,
        Method::POST,
        "/console/policy/preview",
        Some(&session),
        Some(&form("")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(preview.contains("What version 2 changes"), "{preview}");
    assert!(preview.contains("<td>changed</td><td>personalization / preference / any layer</td><td>30d</td><td>7d</td>"), "{preview}");
    assert!(
        preview.contains("<td>added</td><td>support / conversation / any layer</td>"),
        "{preview}"
    );
    let (_, still) = h.as_dpo(Method::GET, "/v1/retention-rules", None).await;
    assert_eq!(still["version"], 1, "a preview changes nothing");
    let (status, _, _) = console(
        &h,
        Method::POST,
        "/console/policy",
        Some(&session),
        Some(&form("")),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (_, saved) = h.as_dpo(Method::GET, "/v1/retention-rules", None).await;
    assert_eq!(
        (
            saved["version"].as_i64(),
            saved["rules"].as_array().map(Vec::len)
        ),
        (Some(2), Some(2))
    );
    let bad = format!("csrf={csrf}&rules=%7B%22rules%22%3A%5B%7B%22purpose%22%3A%22p%22%7D%5D%7D");
    let (status, _, refused) = console(
        &h,
        Method::POST,
        "/console/policy/preview",
        Some(&session),
        Some(&bad),
    )
    .await;
    assert!(
        status.is_client_error() && refused.contains("Not changed"),
        "{status} {refused}"
    );

    let place = format!("csrf={csrf}&subject=u9&reason=litigation");
    let (status, _, _) = console(
        &h,
        Method::POST,
        "/console/holds/place",
        Some(&session),
        Some(&place),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (_, _, page) = console(&h, Method::GET, "/console/policy", Some(&session), None).await;
    assert!(
        page.contains("subject u9") && page.contains("litigation") && page.contains(">active<"),
        "{page}"
    );
    let at = page.find("name=\"hold\" value=\"").unwrap() + 19;
    let hold = page[at..].split('"').next().unwrap();
    let release = format!("csrf={csrf}&hold={hold}");
    let (status, _, _) = console(
        &h,
        Method::POST,
        "/console/holds/release",
        Some(&session),
        Some(&release),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (_, _, page) = console(&h, Method::GET, "/console/policy", Some(&session), None).await;
    assert!(page.contains(">released<"), "{page}");
}

#[tokio::test]
async fn behind_a_tls_proxy_the_session_cookie_is_secure() {
    let h = harness().await;
    let (sign_in_cookie, csrf) = sign_in_page(&h).await;
    let form = format!("csrf={csrf}&token={}", token(Role::Compliance, "acme"));
    let request = Request::builder()
        .method(Method::POST)
        .uri("/console/sign-in")
        .header(header::COOKIE, sign_in_cookie)
        .header("x-forwarded-proto", "https")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(form))
        .unwrap();
    let response = h.app.clone().oneshot(request).await.unwrap();
    let cookie = response.headers()[header::SET_COOKIE].to_str().unwrap();
    assert!(
        cookie.ends_with("; Secure") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
}

#[tokio::test]
async fn the_console_takes_a_failed_erasure_for_review_and_resumes_it() {
    use lethe_policy::audit::AuditEntry;
    let h = harness().await;
    h.as_dpo(Method::POST, "/v1/consents", Some(grant_body("u1")))
        .await;
    let id = filed(&h, "u1").await;
    for actor in ["alice", "bob"] {
        h.as_actor(
            actor,
            Method::POST,
            &format!("/v1/erasures/{id}/approve"),
            None,
        )
        .await;
    }
    // The store's purge gives up: the request goes to exception.
    let now = crate::now();
    let job = h
        .store
        .claim_purge_job("w", now, now, now + chrono::TimeDelta::minutes(1))
        .await
        .unwrap()
        .expect("a due job");
    let gave_up = AuditEntry {
        at: now,
        tenant: Some("acme".into()),
        actor: "worker".into(),
        action: "purge".into(),
        request_id: "r".into(),
        subject_ref: None,
        target: job.target.clone(),
        target_ref: Some(job.id.clone()),
        result: "failed".into(),
        attempt: 1,
    };
    h.store
        .finish_purge_job(
            &job.id,
            crate::state::JobOutcome::Failed {
                error: "chroma: unreachable".into(),
                retry_at: None,
                tally: None,
            },
            now,
            gave_up,
        )
        .await
        .unwrap();

    let session = sign_in(&h, &token(Role::Compliance, "acme")).await;
    let page_uri = format!("/console/requests/{id}");
    let (_, _, page) = console(&h, Method::GET, &page_uri, Some(&session), None).await;
    assert!(
        page.contains("exception")
            && page.contains("chroma: unreachable")
            && page.contains("Take it for review"),
        "{page}"
    );
    let form = format!("csrf={}", csrf_in(&page));
    let (status, _, _) = console(
        &h,
        Method::POST,
        &format!("{page_uri}/review"),
        Some(&session),
        Some(&form),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (_, _, page) = console(&h, Method::GET, &page_uri, Some(&session), None).await;
    assert!(
        page.contains("manual_review") && page.contains("Resume: purge the failed stores again"),
        "{page}"
    );
    let (status, _, _) = console(
        &h,
        Method::POST,
        &format!("{page_uri}/resume"),
        Some(&session),
        Some("csrf=0"),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "no resume without the CSRF token"
    );
    let (status, _, _) = console(
        &h,
        Method::POST,
        &format!("{page_uri}/resume"),
        Some(&session),
        Some(&form),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (_, resumed) = h
        .as_dpo(Method::GET, &format!("/v1/erasures/{id}"), None)
        .await;
    assert_eq!(resumed["state"], "propagating", "{resumed}");
}

#[tokio::test]
async fn an_erasures_deadline_is_extended_once_with_a_reason_before_it_passes() {
    let h = harness().await;
    let (_, filed) = h
        .as_dpo(Method::POST, "/v1/erasures", Some(erasure_body("u1")))
        .await;
    let id = filed["id"].as_str().unwrap().to_owned();
    let requested: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(filed["requested_at"].clone()).unwrap();
    let deadline = |view: &Value| -> chrono::DateTime<chrono::Utc> {
        serde_json::from_value(view["deadline"].clone()).unwrap()
    };
    assert_eq!(deadline(&filed), requested + chrono::Months::new(1));
    assert_eq!(filed["extension"], Value::Null);
    let extend = format!("/v1/erasures/{id}/extend");
    for refused in [
        json!({"months": 3, "reason": "too long"}),
        json!({"months": 0, "reason": "x"}),
        json!({"months": 2, "reason": " "}),
    ] {
        assert_error(
            &h.as_dpo(Method::POST, &extend, Some(refused)).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
        );
    }
    let reason = "complex: five stores and two processors";
    let elsewhere = h
        .send(
            Method::POST,
            &extend,
            Some(&token(Role::Compliance, "globex")),
            Some(Body::from(
                json!({"months": 2, "reason": reason}).to_string(),
            )),
        )
        .await;
    assert_error(&elsewhere, StatusCode::NOT_FOUND, "not_found");
    let (status, extended) = h
        .as_dpo(
            Method::POST,
            &extend,
            Some(json!({"months": 2, "reason": reason})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{extended}");
    assert_eq!(
        deadline(&extended),
        deadline(&filed) + chrono::Months::new(2)
    );
    assert_eq!(
        (
            extended["extension"]["months"].as_u64(),
            extended["extension"]["reason"].as_str()
        ),
        (Some(2), Some(reason))
    );
    assert_error(
        &h.as_dpo(
            Method::POST,
            &extend,
            Some(json!({"months": 1, "reason": reason})),
        )
        .await,
        StatusCode::CONFLICT,
        "not_extendable",
    );
    let (_, page) = h.as_dpo(Method::GET, "/v1/audit", None).await;
    let events: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert_eq!(
        events
            .iter()
            .filter(|a| **a == "erasure.extend_deadline")
            .count(),
        1,
        "one extension, one event: {events:?}"
    );
    assert!(
        !page.to_string().contains(reason),
        "the audit trail is content-free"
    );

    // A request past its deadline is overdue: an extension cannot hide that.
    let late = crate::testing::erasure_request(
        "er_late",
        "u2",
        crate::now() - chrono::TimeDelta::days(40),
    );
    h.store
        .create_erasure(&late, &["chroma:chroma".into()], audit_entry("er_late"))
        .await
        .unwrap();
    let refused = h
        .as_dpo(
            Method::POST,
            "/v1/erasures/er_late/extend",
            Some(json!({"months": 2, "reason": reason})),
        )
        .await;
    assert_error(&refused, StatusCode::CONFLICT, "not_extendable");
    assert!(
        refused.1["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the deadline passed")
    );

    // In the console: the form, refused without its CSRF token, then the extension shown.
    let (_, second) = h
        .as_dpo(Method::POST, "/v1/erasures", Some(erasure_body("u3")))
        .await;
    let second_uri = format!("/console/requests/{}", second["id"].as_str().unwrap());
    let session = sign_in(&h, &token(Role::Compliance, "acme")).await;
    let (_, _, page) = console(&h, Method::GET, &second_uri, Some(&session), None).await;
    assert!(
        page.contains("Extend the deadline") && page.contains("name=\"months\""),
        "{page}"
    );
    let form = "months=1&reason=two+processors+to+hear+from";
    let (status, _, _) = console(
        &h,
        Method::POST,
        &format!("{second_uri}/extend"),
        Some(&session),
        Some(form),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, _) = console(
        &h,
        Method::POST,
        &format!("{second_uri}/extend"),
        Some(&session),
        Some(&format!("csrf={}&{form}", csrf_in(&page))),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (_, _, page) = console(&h, Method::GET, &second_uri, Some(&session), None).await;
    assert!(
        page.contains("The deadline was extended by 1 month on")
            && page.contains("two processors to hear from")
            && !page.contains("name=\"months\""),
        "{page}"
    );
    let (_, _, overdue) = console(
        &h,
        Method::GET,
        "/console/requests?due=overdue",
        Some(&session),
        None,
    )
    .await;
    assert!(
        overdue.contains(">er_late</a>") && !overdue.contains(&format!(">{id}</a>")),
        "{overdue}"
    );
    assert!(overdue.contains("<dt>Overdue</dt><dd>1</dd>"), "{overdue}");
    let (_, _, list) = console(&h, Method::GET, "/console/requests", Some(&session), None).await;
    assert_eq!(list.matches("(extended)").count(), 2, "{list}");
}

#[tokio::test]
async fn the_dry_run_counts_every_store_before_an_erasure_is_filed() {
    let h = harness().await;
    h.as_dpo(Method::POST, "/v1/consents", Some(grant_body("u1")))
        .await;
    h.store
        .record_items(&[
            crate::testing::item("chroma", "a", "u1"),
            crate::testing::item("chroma", "b", "u1@mail"),
            crate::testing::item("chroma", "c", "u2"),
        ])
        .await
        .unwrap();
    let body = json!({"subject": "u1", "aliases": ["u1@mail"]});
    let (status, run) = h
        .as_dpo(Method::POST, "/v1/erasures/dry-run", Some(body.clone()))
        .await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(
        run["stores"],
        json!([{"target": "chroma:chroma", "lineage": 2, "held": 3}]),
        "lineage's two, and the store's own count (one more than lineage knows)"
    );
    assert_eq!(run["tenant"], "acme");
    assert!(
        !run.to_string().contains("u1"),
        "the answer names the subject by reference: {run}"
    );
    let elsewhere = h
        .send(
            Method::POST,
            "/v1/erasures/dry-run",
            Some(&token(Role::Compliance, "globex")),
            Some(Body::from(
                json!({"tenant": "acme", "subject": "u1"}).to_string(),
            )),
        )
        .await;
    assert_error(&elsewhere, StatusCode::FORBIDDEN, "forbidden");
    assert_error(
        &h.as_dpo(
            Method::POST,
            "/v1/erasures/dry-run",
            Some(json!({"subject": "u1", "aliases": ["u1"]})),
        )
        .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
    );
    let (_, audit) = h.as_dpo(Method::GET, "/v1/audit", None).await;
    let dry_runs = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "erasure.dry_run")
        .count();
    assert_eq!(dry_runs, 1, "the refused ones read nothing: {audit}");
    assert!(
        h.store
            .erasures("acme", &Default::default(), 0, 10)
            .await
            .unwrap()
            .is_empty(),
        "a dry run files nothing"
    );

    // In the console: whom, then the counts, then the ticket and reason.
    let session = sign_in(&h, &token(Role::Compliance, "acme")).await;
    let (_, _, subject) = console(
        &h,
        Method::GET,
        "/console/subjects?subject=u1",
        Some(&session),
        None,
    )
    .await;
    assert!(
        subject.contains("action=\"/console/requests/dry-run\""),
        "{subject}"
    );
    let whom = "tenant=acme&subject=u1&aliases=u1%40mail";
    let (status, _, _) = console(
        &h,
        Method::POST,
        "/console/requests/dry-run",
        Some(&session),
        Some(whom),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let csrf = csrf_in(&subject);
    let (status, _, page) = console(
        &h,
        Method::POST,
        "/console/requests/dry-run",
        Some(&session),
        Some(&format!("csrf={csrf}&{whom}")),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert!(
        page.contains("<tr><td>chroma:chroma</td><td>2</td><td>3</td></tr>")
            && page.contains("3 records held in all.")
            && page.contains("name=\"ticket\""),
        "{page}"
    );
    let (status, headers, _) = console(
        &h,
        Method::POST,
        "/console/requests",
        Some(&session),
        Some(&format!("csrf={csrf}&{whom}&ticket=DSR-9&reason=art.+17")),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let id = headers[header::LOCATION]
        .to_str()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap()
        .to_owned();
    let filed = h.store.erasure(&id).await.unwrap();
    assert_eq!(
        (
            filed.subject.as_str(),
            filed.aliases.as_slice(),
            filed.ticket.as_str()
        ),
        ("u1", &["u1@mail".to_owned()][..], "DSR-9")
    );
}

/// The event of a request the test files through the store itself.
fn audit_entry(id: &str) -> lethe_policy::audit::AuditEntry {
    lethe_policy::audit::AuditEntry {
        at: crate::now(),
        tenant: Some("acme".into()),
        actor: "dpo".into(),
        action: "erasure.request".into(),
        request_id: "test".into(),
        subject_ref: None,
        target: "erasure".into(),
        target_ref: Some(id.into()),
        result: "ok".into(),
        attempt: 1,
    }
}

#[tokio::test]
async fn a_request_is_refused_with_its_reason_only_before_its_flip() {
    let h = harness().await;
    let id = filed(&h, "u1").await;
    let reject = format!("/v1/erasures/{id}/reject");
    assert_error(
        &h.as_dpo(Method::POST, &reject, Some(json!({"reason": " "})))
            .await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
    );
    let elsewhere = h
        .send(
            Method::POST,
            &reject,
            Some(&token(Role::Compliance, "globex")),
            Some(Body::from(json!({"reason": "x"}).to_string())),
        )
        .await;
    assert_error(&elsewhere, StatusCode::NOT_FOUND, "not_found");
    let reason = "identity not confirmed after two requests";
    let (status, refused) = h
        .as_dpo(Method::POST, &reject, Some(json!({"reason": reason})))
        .await;
    assert_eq!(status, StatusCode::OK, "{refused}");
    assert_eq!(
        (
            refused["state"].as_str(),
            refused["rejection"]["reason"].as_str()
        ),
        (Some("rejected"), Some(reason))
    );
    assert_eq!(
        refused["targets"][0]["state"], "cancelled",
        "nothing was flipped, nothing is purged"
    );
    assert_error(
        &h.as_dpo(Method::POST, &reject, Some(json!({"reason": reason})))
            .await,
        StatusCode::CONFLICT,
        "illegal_state",
    );
    assert_error(
        &h.as_dpo(Method::POST, &format!("/v1/erasures/{id}/approve"), None)
            .await,
        StatusCode::CONFLICT,
        "not_awaiting_approval",
    );
    let (_, subject) = h.as_dpo(Method::GET, "/v1/subjects/acme/u1", None).await;
    assert_ne!(subject["state"], "suppressed", "{subject}");

    // Flipped, a request can no longer be refused: the subject stays unreadable.
    let flipped = filed(&h, "u2").await;
    for actor in ["alice", "bob"] {
        h.as_actor(
            actor,
            Method::POST,
            &format!("/v1/erasures/{flipped}/approve"),
            None,
        )
        .await;
    }
    assert_error(
        &h.as_dpo(
            Method::POST,
            &format!("/v1/erasures/{flipped}/reject"),
            Some(json!({"reason": reason})),
        )
        .await,
        StatusCode::CONFLICT,
        "illegal_state",
    );

    // In the console: the form, refused without its CSRF token, then the refusal shown.
    let (_, third) = h
        .as_dpo(Method::POST, "/v1/erasures", Some(erasure_body("u3")))
        .await;
    let uri = format!("/console/requests/{}", third["id"].as_str().unwrap());
    let session = sign_in(&h, &token(Role::Compliance, "acme")).await;
    let (_, _, page) = console(&h, Method::GET, &uri, Some(&session), None).await;
    assert!(page.contains("Refuse the request"), "{page}");
    let form = "reason=an+exemption+of+art.+17%283%29%28e%29";
    let (status, _, _) = console(
        &h,
        Method::POST,
        &format!("{uri}/reject"),
        Some(&session),
        Some(form),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let signed = format!("csrf={}&{form}", csrf_in(&page));
    let (status, _, _) = console(
        &h,
        Method::POST,
        &format!("{uri}/reject"),
        Some(&session),
        Some(&signed),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let (_, _, page) = console(&h, Method::GET, &uri, Some(&session), None).await;
    assert!(
        page.contains("an exemption of art. 17(3)(e)")
            && page.contains("aria-current=\"step\">rejected")
            && !page.contains("Refuse the request")
            && !page.contains("Approve the erasure"),
        "{page}"
    );
}

#[tokio::test]
async fn a_subjects_page_places_and_releases_its_holds_and_comes_back_to_itself_only() {
    let h = harness().await;
    h.as_dpo(Method::POST, "/v1/consents", Some(grant_body("u1")))
        .await;
    let session = sign_in(&h, &token(Role::Compliance, "acme")).await;
    let uri = "/console/subjects?subject=u1";
    let (_, _, page) = console(&h, Method::GET, uri, Some(&session), None).await;
    assert!(
        page.contains("Legal holds covering this subject") && page.contains("No legal holds."),
        "{page}"
    );
    let csrf = csrf_in(&page);
    let place = |back: &str| {
        form_urlencoded::Serializer::new(String::new())
            .append_pair("csrf", &csrf)
            .append_pair("back", back)
            .append_pair("subject", "u1")
            .append_pair("reason", "litigation 12")
            .finish()
    };
    let (status, headers, _) = console(
        &h,
        Method::POST,
        "/console/holds/place",
        Some(&session),
        Some(&place("subject")),
    )
    .await;
    assert_eq!(
        (status, headers[header::LOCATION].to_str().unwrap()),
        (StatusCode::SEE_OTHER, uri)
    );
    let (_, view) = h.as_dpo(Method::GET, "/v1/subjects/acme/u1", None).await;
    assert_eq!(view["held"], true, "{view}");
    let (_, _, page) = console(&h, Method::GET, uri, Some(&session), None).await;
    assert!(
        page.contains("litigation 12") && page.contains(">active<"),
        "{page}"
    );
    // Anywhere else the form says to go, it goes back to the policy page.
    let (_, headers, _) = console(
        &h,
        Method::POST,
        "/console/holds/place",
        Some(&session),
        Some(&place("https://elsewhere.example")),
    )
    .await;
    assert_eq!(headers[header::LOCATION], "/console/policy");
    let at = page.find("name=\"hold\" value=\"").unwrap() + 19;
    let hold = page[at..].split('"').next().unwrap();
    let release = format!("csrf={csrf}&back=subject&subject=u1&hold={hold}");
    let (status, headers, _) = console(
        &h,
        Method::POST,
        "/console/holds/release",
        Some(&session),
        Some(&release),
    )
    .await;
    assert_eq!(
        (status, headers[header::LOCATION].to_str().unwrap()),
        (StatusCode::SEE_OTHER, uri)
    );
    let (_, _, page) = console(&h, Method::GET, uri, Some(&session), None).await;
    assert!(page.contains(">released<"), "{page}");
}

/// alice's memory `a1`, bob's summary `s1` quoting it, and bob's note `b2` derived from
/// nothing of hers.
async fn derived_lineage(h: &Harness) {
    use crate::state::{Derived, Edge, ItemKey};
    let row = |id: &str, subject: &str| crate::state::ItemRecord {
        store: "chroma".into(),
        collection: "c1".into(),
        item_id: id.into(),
        tenant: "acme".into(),
        subject: subject.into(),
        purpose: "personalization".into(),
        category: "preference".into(),
        layer: lethe_policy::Layer::Raw,
        created_at: crate::now(),
        expires_at: crate::now() + chrono::TimeDelta::days(1),
        epoch: 0,
        source_ref: None,
        parents: vec![],
    };
    h.store
        .record_items(&[row("a1", "alice"), row("s1", "bob"), row("b2", "bob")])
        .await
        .unwrap();
    let child = ItemKey::new("chroma", "c1", "s1");
    h.store
        .record_derived(&[Derived {
            tenant: "acme".into(),
            child: child.clone(),
            edges: vec![Edge {
                child,
                child_owner: "bob".into(),
                parent: ItemKey::new("chroma", "c1", "a1"),
                parent_owner: "alice".into(),
                how: lethe_policy::How::Quote,
                at: crate::now(),
            }],
            replace: true,
        }])
        .await
        .unwrap();
}

#[tokio::test]
async fn an_erasures_derivatives_are_listed_and_decided_by_a_person_of_its_tenant() {
    let h = harness().await;
    derived_lineage(&h).await;
    // The dry run counts what the flip would hide.
    let (status, dry) = h
        .as_dpo(
            Method::POST,
            "/v1/erasures/dry-run",
            Some(json!({"subject": "alice"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    assert_eq!(
        dry["derivatives"],
        json!([{"store": "chroma", "own": 0, "other": 1, "guarded": 0}])
    );
    let id = filed(&h, "alice").await;
    for actor in ["dpo-a", "dpo-b"] {
        h.as_actor(
            actor,
            Method::POST,
            &format!("/v1/erasures/{id}/approve"),
            None,
        )
        .await;
    }
    let (status, listed) = h
        .as_dpo(Method::GET, &format!("/v1/erasures/{id}/derivatives"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let derivatives = listed["derivatives"].as_array().unwrap();
    assert_eq!(derivatives.len(), 1, "{listed}");
    let s1 = &derivatives[0];
    let s1_ref = s1["ref"].as_str().unwrap().to_owned();
    assert_eq!(
        (
            &s1["store"],
            &s1["collection"],
            &s1["item"],
            &s1["decision"]
        ),
        (
            &json!("chroma"),
            &json!("c1"),
            &json!("s1"),
            &json!("undecided")
        )
    );
    assert_eq!(
        s1["subject_ref"],
        json!(lethe_policy::audit::subject_ref(
            crate::testing::AUDIT_KEY,
            "acme",
            "bob"
        ))
    );
    assert_eq!(s1["how"], json!(["quote"]));
    assert_eq!(s1["parents"][0]["item"], "a1");
    assert!(!listed.to_string().contains("\"bob\""), "no raw subject");
    let (_, status_view) = h
        .as_dpo(Method::GET, &format!("/v1/erasures/{id}"), None)
        .await;
    assert_eq!(status_view["derivatives"], json!({"undecided": 1}));

    // Another tenant sees neither the request nor its derivatives, and cannot decide them.
    let globex = token(Role::Compliance, "globex");
    let decide = format!("/v1/erasures/{id}/derivatives/decide");
    let body = json!({"refs": [s1_ref], "decision": "release", "reason": "not hers"});
    let other = h
        .send(
            Method::POST,
            &decide,
            Some(&globex),
            Some(Body::from(body.to_string())),
        )
        .await;
    assert_error(&other, StatusCode::NOT_FOUND, "not_found");
    let other = h
        .send(
            Method::GET,
            &format!("/v1/erasures/{id}/derivatives"),
            Some(&globex),
            None,
        )
        .await;
    assert_error(&other, StatusCode::NOT_FOUND, "not_found");
    // Bad decisions are refused whole, and change nothing.
    for (bad, status, code) in [
        (
            json!({"refs": [], "decision": "erase", "reason": "x"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
        ),
        (
            json!({"refs": [s1_ref, s1_ref], "decision": "erase", "reason": "x"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
        ),
        (
            json!({"refs": [s1_ref], "decision": "guard", "reason": "x"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "validation_failed",
        ),
        (
            json!({"refs": ["dv_unknown"], "decision": "erase", "reason": "x"}),
            StatusCode::CONFLICT,
            "not_decidable",
        ),
    ] {
        let answer = h.as_dpo(Method::POST, &decide, Some(bad)).await;
        assert_error(&answer, status, code);
    }
    let (status, decided) = h.as_dpo(Method::POST, &decide, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    assert_eq!(decided["derivatives"], json!({"release": 1}));
    let again = h
        .as_dpo(
            Method::POST,
            &decide,
            Some(json!({"refs": [s1_ref], "decision": "erase", "reason": "changed my mind"})),
        )
        .await;
    assert_error(&again, StatusCode::CONFLICT, "not_decidable");
    let (_, listed) = h
        .as_dpo(Method::GET, &format!("/v1/erasures/{id}/derivatives"), None)
        .await;
    assert_eq!(listed["derivatives"][0]["decided_by"], "compliance@acme");
    assert_eq!(listed["derivatives"][0]["reason"], "not hers");
}

#[tokio::test]
async fn an_items_lineage_is_shown_to_its_tenant_only() {
    let h = harness().await;
    derived_lineage(&h).await;
    let (status, lineage) = h
        .as_dpo(Method::GET, "/v1/lineage/chroma/c1/s1", None)
        .await;
    assert_eq!(status, StatusCode::OK, "{lineage}");
    assert_eq!(lineage["parents"][0]["item"], "a1");
    assert_eq!(lineage["parents"][0]["how"], "quote");
    assert_eq!(
        lineage["parents"][0]["subject_ref"],
        json!(lethe_policy::audit::subject_ref(
            crate::testing::AUDIT_KEY,
            "acme",
            "alice"
        ))
    );
    assert_eq!(lineage["children"], json!([]));
    let (_, a1) = h
        .as_dpo(Method::GET, "/v1/lineage/chroma/c1/a1", None)
        .await;
    assert_eq!(a1["children"][0]["item"], "s1");
    // An item with no edges but lineage of the tenant has an empty lineage; one the tenant does
    // not have is not found, for the tenant's own and for another's token alike.
    let (status, b2) = h
        .as_dpo(Method::GET, "/v1/lineage/chroma/c1/b2", None)
        .await;
    assert_eq!((status, &b2["parents"]), (StatusCode::OK, &json!([])));
    let missing = h
        .as_dpo(Method::GET, "/v1/lineage/chroma/c1/zz", None)
        .await;
    assert_error(&missing, StatusCode::NOT_FOUND, "not_found");
    let globex = token(Role::Compliance, "globex");
    let other = h
        .send(Method::GET, "/v1/lineage/chroma/c1/s1", Some(&globex), None)
        .await;
    assert_error(&other, StatusCode::NOT_FOUND, "not_found");
    let forbidden = h
        .send(
            Method::GET,
            "/v1/lineage/chroma/c1/s1?tenant=acme",
            Some(&globex),
            None,
        )
        .await;
    assert_error(&forbidden, StatusCode::FORBIDDEN, "forbidden");
    // An item id holding slashes (a conversation's item) is one path, its slashes its own.
    let item = crate::state::ItemKey::new("openai", "conversation_items", "conv_1/msg_2");
    h.store
        .record_derived(&[crate::state::Derived {
            tenant: "acme".into(),
            child: item.clone(),
            edges: vec![crate::state::Edge {
                child: item,
                child_owner: "bob".into(),
                parent: crate::state::ItemKey::new("chroma", "c1", "a1"),
                parent_owner: "alice".into(),
                how: lethe_policy::How::Quote,
                at: crate::now(),
            }],
            replace: false,
        }])
        .await
        .unwrap();
    let (status, body) = h
        .as_dpo(
            Method::GET,
            "/v1/lineage/openai/conversation_items/conv_1/msg_2",
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["parents"][0]["item"], "a1");
    let (status, _) = h
        .as_dpo(
            Method::GET,
            "/v1/lineage/openai/conversation_items/conv_1",
            None,
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a prefix of the id is not the item"
    );
}

#[tokio::test]
async fn the_console_shows_what_derives_from_a_subject_and_takes_a_decision_on_it() {
    let h = harness().await;
    derived_lineage(&h).await;
    for subject in ["alice", "bob"] {
        h.as_dpo(Method::POST, "/v1/consents", Some(grant_body(subject)))
            .await;
    }
    let session = sign_in(&h, &token(Role::Compliance, "acme")).await;
    // Alice's page names bob's summary as derived from her data; bob's, what his derives from.
    let (_, _, alices) = console(
        &h,
        Method::GET,
        "/console/subjects?subject=alice",
        Some(&session),
        None,
    )
    .await;
    assert!(
        alices.contains("Derived from this subject's data"),
        "{alices}"
    );
    assert!(
        alices.contains("<code>s1</code>") && alices.contains("quote"),
        "{alices}"
    );
    let (_, _, bobs) = console(
        &h,
        Method::GET,
        "/console/subjects?subject=bob",
        Some(&session),
        None,
    )
    .await;
    assert!(
        bobs.contains("<code>s1</code> (chroma)</td><td><code>a1</code>"),
        "{bobs}"
    );

    let id = filed(&h, "alice").await;
    for actor in ["dpo-a", "dpo-b"] {
        h.as_actor(
            actor,
            Method::POST,
            &format!("/v1/erasures/{id}/approve"),
            None,
        )
        .await;
    }
    let page_uri = format!("/console/requests/{id}");
    let (_, _, page) = console(&h, Method::GET, &page_uri, Some(&session), None).await;
    let (_, listed) = h
        .as_dpo(Method::GET, &format!("/v1/erasures/{id}/derivatives"), None)
        .await;
    let s1 = listed["derivatives"][0]["ref"].as_str().unwrap().to_owned();
    assert!(
        page.contains("<h2>Derivatives</h2>")
            && page.contains(&format!("value=\"{s1}\""))
            && page.contains("undecided"),
        "{page}"
    );
    let decide = format!("{page_uri}/derivatives");
    let form =
        |csrf: &str| format!("csrf={csrf}&refs={s1}&decision=release&reason=bob%27s+own+words");
    let (status, _, _) = console(&h, Method::POST, &decide, Some(&session), Some(&form("0"))).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "no decision without the CSRF token"
    );
    let (_, listed) = h
        .as_dpo(Method::GET, &format!("/v1/erasures/{id}/derivatives"), None)
        .await;
    assert_eq!(listed["derivatives"][0]["decision"], "undecided");
    let (status, headers, _) = console(
        &h,
        Method::POST,
        &decide,
        Some(&session),
        Some(&form(&csrf_in(&page))),
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers[header::LOCATION].to_str().unwrap(), page_uri);
    let (_, _, page) = console(&h, Method::GET, &page_uri, Some(&session), None).await;
    assert!(
        page.contains("release (by compliance@acme: bob&#39;s own words)"),
        "{page}"
    );
    // Another tenant's person cannot decide it.
    let other = sign_in(&h, &token(Role::Compliance, "globex")).await;
    let (_, _, other_page) =
        console(&h, Method::GET, "/console/requests", Some(&other), None).await;
    let (status, _, _) = console(
        &h,
        Method::POST,
        &decide,
        Some(&other),
        Some(&form(&csrf_in(&other_page))),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// Sign-out ends the session: its cookie and CSRF token are worth nothing after it, on the
/// console and on `/v1` (a console cookie is no bearer token). An idle session ends too, and one
/// whose token is revoked; the revoked token is refused on `/v1` as well.
#[tokio::test]
async fn a_console_session_ends_at_sign_out_when_idle_and_when_its_token_is_revoked() {
    let h = harness().await;
    let jti = format!("jti-{}", uuid::Uuid::new_v4());
    let token = mint_hs256(
        SECRET,
        "lethe",
        &Claims {
            sub: "dpo-a".into(),
            tenant: "acme".into(),
            role: Role::Compliance,
            subject: None,
            exp: jsonwebtoken::get_current_timestamp() + 600,
            jti: Some(jti.clone()),
            name: None,
            second_factor: false,
        },
    )
    .unwrap();
    let session = sign_in(&h, &token).await;
    let (status, headers, page) =
        console(&h, Method::GET, "/console/requests", Some(&session), None).await;
    assert_eq!(status, StatusCode::OK);
    for (name, value) in [
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
    ] {
        assert_eq!(headers[name], value, "{name}");
    }
    assert!(
        headers["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("frame-ancestors 'none'")
    );
    let csrf = csrf_in(&page);
    let id = session.split_once('=').unwrap().1;
    assert!(
        !token.contains(id) && !id.contains('.'),
        "the cookie holds a random id, not the token"
    );
    let (status, _) = h.send(Method::GET, "/v1/audit", Some(id), None).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a session id is no bearer token"
    );

    let sign_out = format!("csrf={csrf}");
    let (status, headers, _) = console(
        &h,
        Method::POST,
        "/console/sign-out",
        Some(&session),
        Some(&sign_out),
    )
    .await;
    assert_eq!(
        (status, headers[header::LOCATION].to_str().unwrap()),
        (StatusCode::SEE_OTHER, "/console/sign-in")
    );
    // The old cookie and CSRF token, sent again: the session is gone.
    let (status, headers, _) =
        console(&h, Method::GET, "/console/requests", Some(&session), None).await;
    assert_eq!(
        (status, headers[header::LOCATION].to_str().unwrap()),
        (StatusCode::SEE_OTHER, "/console/sign-in?ended=gone")
    );
    let hold = format!("csrf={csrf}&subject=u1&reason=litigation");
    let (status, headers, _) = console(
        &h,
        Method::POST,
        "/console/holds/place",
        Some(&session),
        Some(&hold),
    )
    .await;
    assert_eq!(
        (status, headers[header::LOCATION].to_str().unwrap()),
        (StatusCode::SEE_OTHER, "/console/sign-in?ended=gone")
    );
    let (_, holds) = h.as_dpo(Method::GET, "/v1/legal-holds", None).await;
    assert_eq!(holds["items"], json!([]), "no hold was placed");

    // Unused longer than the idle timeout (10 minutes here): over.
    let session = sign_in(&h, &token).await;
    crate::testing::execute_raw(
        &h.url,
        &format!(
            "UPDATE console_sessions SET last_seen_at = '{}'",
            (crate::now() - chrono::TimeDelta::minutes(11)).to_rfc3339()
        ),
    )
    .await
    .unwrap();
    let (_, headers, _) = console(&h, Method::GET, "/console/requests", Some(&session), None).await;
    assert_eq!(headers[header::LOCATION], "/console/sign-in?ended=idle");
    let (_, _, page) = console(&h, Method::GET, "/console/sign-in?ended=idle", None, None).await;
    assert!(page.contains("after 10 minutes unused"), "{page}");

    // Past its token's expiry, which came before session_max: it says the sign-in expired.
    let session = sign_in(&h, &token).await;
    crate::testing::execute_raw(
        &h.url,
        &format!(
            "UPDATE console_sessions SET expires_at = '{}'",
            (crate::now() - chrono::TimeDelta::seconds(1)).to_rfc3339()
        ),
    )
    .await
    .unwrap();
    let (_, headers, _) = console(&h, Method::GET, "/console/requests", Some(&session), None).await;
    assert_eq!(headers[header::LOCATION], "/console/sign-in?ended=sign-in");
    let (_, _, page) = console(
        &h,
        Method::GET,
        "/console/sign-in?ended=sign-in",
        None,
        None,
    )
    .await;
    assert!(page.contains("when your sign-in expired"), "{page}");

    // The token revoked: its session ends and the token is refused everywhere.
    let session = sign_in(&h, &token).await;
    let revoke = json!({ "jti": jti }).to_string();
    let (status, refused) = h
        .send(
            Method::POST,
            "/v1/tokens/revoke",
            Some(&token),
            Some(Body::from(revoke.clone())),
        )
        .await;
    assert_eq!(
        (status, refused["error"]["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    let admin = token_as(Role::Admin, "ops");
    let (status, revoked) = h
        .send(
            Method::POST,
            "/v1/tokens/revoke",
            Some(&admin),
            Some(Body::from(revoke.clone())),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{revoked}");
    let (status, again) = h
        .send(
            Method::POST,
            "/v1/tokens/revoke",
            Some(&admin),
            Some(Body::from(revoke)),
        )
        .await;
    assert_eq!(
        (status, again["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("already_revoked"))
    );
    let (status, _) = h.send(Method::GET, "/v1/audit", Some(&token), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (_, headers, _) = console(&h, Method::GET, "/console/requests", Some(&session), None).await;
    assert_eq!(headers[header::LOCATION], "/console/sign-in?ended=revoked");
    let (status, _, page) = post_sign_in(&h, &token).await;
    assert!(
        status == StatusCode::UNAUTHORIZED && page.contains("revoked"),
        "{page}"
    );
}

/// The sign-in form is refused without the sign-in page's own CSRF token (a form posted from
/// another site), and an address that keeps failing is turned away for a while.
#[tokio::test]
async fn sign_in_needs_its_pages_csrf_token_and_failures_are_limited() {
    let h = harness().await;
    let good = token_as(Role::Compliance, "dpo-a");
    let (cookie, csrf) = sign_in_page(&h).await;
    for (cookie, form) in [
        (None, format!("token={good}")),
        (None, format!("csrf={csrf}&token={good}")),
        (Some(cookie.as_str()), format!("token={good}")),
        (Some(cookie.as_str()), format!("csrf=00&token={good}")),
    ] {
        let (status, headers, _) =
            console(&h, Method::POST, "/console/sign-in", cookie, Some(&form)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{cookie:?} {form}");
        assert!(
            headers
                .get_all(header::SET_COOKIE)
                .iter()
                .all(|c| !c.to_str().unwrap().starts_with("lethe_console="))
        );
    }
    for _ in 0..5 {
        let (status, _, _) = post_sign_in(&h, "not-a-token").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    let (status, _, page) = post_sign_in(&h, &good).await;
    assert!(
        status == StatusCode::TOO_MANY_REQUESTS && page.contains("Too many failed sign-ins"),
        "{status}"
    );
}

/// A token is no sign-in through the provider: it shows no second factor whatever it claims,
/// and cannot act as one of the provider's people (`<issuer>#<subject>`).
#[tokio::test]
async fn a_token_neither_shows_a_second_factor_nor_acts_as_a_person_of_the_provider() {
    let config = crate::config::OidcConfig {
        issuer: "https://idp.example".into(),
        name: "IdP".into(),
        client_id: "lethe".into(),
        client_secret: crate::config::Secret::Value("s".into()),
        redirect_url: "https://lethe.example/console/oidc/callback".into(),
        scopes: vec!["openid".into()],
        groups_claim: "groups".into(),
        roles: Vec::new(),
        mfa_acr: None,
    };
    let tls = crate::data::forward::tls_client(None).unwrap();
    let provider = crate::auth::oidc::Provider::new(&config, 0, &tls).unwrap();
    let h = harness_with(|state| {
        state.erasure.approval_requires_mfa = true;
        state.oidc = Some(Arc::new(provider));
        state.tokens = Tokens::new(
            Arc::new(Verifier::hs256(SECRET, "lethe", 0).unwrap()),
            None,
            vec!["https://idp.example".into()],
        );
    })
    .await;
    let minted = |sub: &str, second_factor: bool| {
        let claims = Claims {
            sub: sub.into(),
            tenant: "acme".into(),
            role: Role::Compliance,
            subject: None,
            exp: jsonwebtoken::get_current_timestamp() + 600,
            jti: None,
            name: Some("Alice Dupont".into()),
            second_factor,
        };
        mint_hs256(SECRET, "lethe", &claims).unwrap()
    };
    let filed = json!({"subject": "u1", "ticket": "DSR-1", "reason": "art. 17"}).to_string();
    let requester = minted("dpo-a", false);
    let (status, record) = h
        .send(
            Method::POST,
            "/v1/erasures",
            Some(&requester),
            Some(Body::from(filed)),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{record}");
    let approve = format!("/v1/erasures/{}/approve", record["id"].as_str().unwrap());
    let (status, refused) = h
        .send(Method::POST, &approve, Some(&minted("dpo-b", true)), None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("second factor")
    );
    let (status, refused) = h
        .send(
            Method::POST,
            &approve,
            Some(&minted("https://idp.example#alice", true)),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{refused}");
    let status_uri = approve.trim_end_matches("/approve");
    let (_, now) = h
        .send(Method::GET, status_uri, Some(&requester), None)
        .await;
    assert_eq!(now["approvals"], json!([]));
}
