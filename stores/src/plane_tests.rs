//! The data plane over real sockets, in front of a recording stand-in upstream, on a real SQLite
//! state store: every refusal is checked to have reached nothing upstream.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use lethe_policy::audit::AuditEntry;
use lethe_policy::{Action, ConsentGrant, RetentionPolicy, RetentionRule};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::auth::access::Tokens;
use crate::auth::{Claims, Role, Verifier, mint_hs256};
use crate::config::Config;
use crate::data::forward::{Route, Upstreams};
use crate::data::*;
use crate::state::Store;
use crate::testing::{fresh_sqlite_url, migrated};

const SECRET: &[u8] = b"data-plane-test-secret";
const COLLECTION: &str = "/chroma/api/v2/tenants/default_tenant/databases/default_database/collections/c0ffee00-0000-4000-8000-000000000001";

/// What the stand-in upstream received.
#[derive(Debug, Clone)]
struct Received {
    method: Method,
    uri: String,
    headers: HeaderMap,
    body: Bytes,
}

type Answer = fn(&Received) -> (StatusCode, String);

/// A stand-in upstream that records every request and answers with `answer`. It runs on a
/// runtime of its own, so that an answer may block (as a slow store would) without holding up
/// the test.
async fn upstream(answer: Answer) -> (SocketAddr, Arc<Mutex<Vec<Received>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    std::thread::spawn(move || {
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let log = Arc::clone(&log);
                        async move {
                            let (parts, body) = request.into_parts();
                            let body = body.collect().await.unwrap().to_bytes();
                            let received = Received {
                                method: parts.method,
                                uri: parts.uri.to_string(),
                                headers: parts.headers,
                                body,
                            };
                            let (status, text) = answer(&received);
                            log.lock().unwrap().push(received);
                            let mut response = Response::new(Full::new(Bytes::from(text)));
                            *response.status_mut() = status;
                            response.headers_mut().insert(
                                "content-type",
                                HeaderValue::from_static("application/json"),
                            );
                            response.headers_mut().insert(
                                "connection",
                                HeaderValue::from_static("keep-alive, x-upstream-hop"),
                            );
                            response
                                .headers_mut()
                                .insert("x-upstream-hop", HeaderValue::from_static("1"));
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        })
    });
    (addr, seen)
}

/// `{}` to everything, as Chroma answers writes; a `get` holds nothing.
fn ok_json(received: &Received) -> (StatusCode, String) {
    if received.uri.ends_with("/get") {
        return (
            StatusCode::OK,
            json!({"ids": [], "metadatas": []}).to_string(),
        );
    }
    (StatusCode::OK, "{}".into())
}

struct Plane {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Received>>>,
    store: Arc<dyn Store>,
}

fn audit() -> AuditEntry {
    AuditEntry {
        at: crate::now(),
        tenant: Some("acme".into()),
        actor: "test".into(),
        action: "test".into(),
        request_id: "r".into(),
        subject_ref: None,
        target: "test".into(),
        target_ref: None,
        result: "ok".into(),
        attempt: 1,
    }
}

async fn grant(store: &Arc<dyn Store>, subject: &str, actions: &[Action]) {
    let grant = ConsentGrant {
        id: format!("g-{subject}"),
        tenant: "acme".into(),
        subject: subject.into(),
        purpose: "personalization".into(),
        category: "preference".into(),
        actions: actions.iter().copied().collect(),
        granted_at: crate::now(),
        expires_at: None,
        revoked_at: None,
        policy_version: 1,
        source: "test".into(),
    };
    store.create_grant(&grant, audit()).await.unwrap();
}

/// A data plane on a free port, its chroma route pointing at a recording upstream.
async fn plane_with(answer: Answer, verifier: Verifier, max_body: usize) -> Plane {
    let (upstream_addr, seen) = upstream(answer).await;
    let store = migrated(&fresh_sqlite_url()).await;
    let rules = RetentionPolicy {
        rules: vec![RetentionRule {
            purpose: "personalization".into(),
            category: "preference".into(),
            layer: None,
            max_age: "30d".parse().unwrap(),
            legal_end: None,
        }],
        purpose_ends: vec![],
    };
    store
        .replace_retention("acme", &rules, crate::now(), "test", audit())
        .await
        .unwrap();
    grant(&store, "u1", &[Action::Store, Action::Retrieve]).await;
    let config = Config::check(&format!(
        r#"
        [data_plane]
        max_body_bytes = {max_body}
        [[routes]]
        name = "chroma"
        prefix = "/chroma"
        upstream = "http://{upstream_addr}"
        adapter = "chroma"
        credential = {{ header = "x-chroma-token", value = {{ value = "upstream-secret" }} }}
        [[routes]]
        name = "openai"
        prefix = "/openai"
        upstream = "http://{upstream_addr}"
        adapter = "openai"
        "#
    ))
    .unwrap();
    let (state, _lineage) = DataState::build(
        &config,
        crate::routes(&config).unwrap(),
        Arc::clone(&store),
        Tokens::lethe(Arc::new(verifier)),
        Arc::from(&b"k"[..]),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = Limits {
        timeout: std::time::Duration::from_secs(5),
        max_concurrency: 64,
        ..Limits::default()
    };
    tokio::spawn(serve(listener, state, limits, None, std::future::pending()));
    Plane { addr, seen, store }
}

async fn plane(answer: Answer) -> Plane {
    plane_with(
        answer,
        Verifier::hs256(SECRET, "lethe", 0).unwrap(),
        1024 * 1024,
    )
    .await
}

fn token(role: Role, subject: Option<&str>) -> String {
    let claims = Claims {
        sub: "agent-app".into(),
        tenant: "acme".into(),
        role,
        subject: subject.map(str::to_owned),
        exp: jsonwebtoken::get_current_timestamp() + 600,
        jti: None,
        name: None,
        second_factor: false,
    };
    mint_hs256(SECRET, "lethe", &claims).unwrap()
}

impl Plane {
    async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> (StatusCode, HeaderMap, Value) {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr));
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let response = client
            .request(request.body(Full::new(body.into())).unwrap())
            .await
            .unwrap();
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
        (parts.status, parts.headers, value)
    }

    fn upstream_saw(&self) -> usize {
        self.seen.lock().unwrap().len()
    }
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn assert_refused(response: &(StatusCode, HeaderMap, Value), status: StatusCode, code: &str) {
    assert_eq!(response.0, status, "{}", response.2);
    assert_eq!(response.2["error"]["code"], code, "{}", response.2);
    assert!(
        response.2["error"]["request_id"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
}

#[tokio::test]
async fn bad_tokens_are_refused_before_anything_moves() {
    let p = plane(ok_json).await;
    let heartbeat = "/chroma/api/v2/heartbeat";
    assert_refused(
        &p.send(Method::GET, heartbeat, &[], "").await,
        StatusCode::UNAUTHORIZED,
        "unauthenticated",
    );
    let expired = mint_hs256(
        SECRET,
        "lethe",
        &Claims {
            exp: jsonwebtoken::get_current_timestamp() - 60,
            ..Claims {
                sub: "a".into(),
                tenant: "acme".into(),
                role: Role::Agent,
                subject: None,
                exp: 0,
                jti: None,
                name: None,
                second_factor: false,
            }
        },
    )
    .unwrap();
    let forged = mint_hs256(
        b"guess",
        "lethe",
        &Claims {
            sub: "a".into(),
            tenant: "acme".into(),
            role: Role::Admin,
            subject: None,
            exp: jsonwebtoken::get_current_timestamp() + 60,
            jti: None,
            name: None,
            second_factor: false,
        },
    )
    .unwrap();
    let none = format!(
        "{}.{}.",
        "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0",
        "eyJzdWIiOiJhIiwidGVuYW50IjoiYWNtZSIsInJvbGUiOiJhZG1pbiIsImlzcyI6ImxldGhlIiwiYXVkIjoibGV0aGUiLCJleHAiOjQxMDI0NDQ4MDB9"
    );
    for token in [expired, forged, none, "garbage".to_owned()] {
        assert_refused(
            &p.send(
                Method::GET,
                heartbeat,
                &[("authorization", &bearer(&token))],
                "",
            )
            .await,
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
        );
    }
    let compliance = token(Role::Compliance, None);
    assert_refused(
        &p.send(
            Method::GET,
            heartbeat,
            &[("authorization", &bearer(&compliance))],
            "",
        )
        .await,
        StatusCode::FORBIDDEN,
        "forbidden",
    );
    let bound = token(Role::Agent, Some("u1"));
    let contradicted = p
        .send(
            Method::GET,
            heartbeat,
            &[
                ("authorization", &bearer(&bound)),
                ("x-lethe-subject", "u2"),
            ],
            "",
        )
        .await;
    assert_refused(&contradicted, StatusCode::FORBIDDEN, "scope_violation");
    assert_eq!(p.upstream_saw(), 0);
}

#[tokio::test]
async fn an_hs256_token_is_refused_where_rs256_keys_are_configured() {
    let keys = crate::config::AuthConfig {
        keys: vec![crate::config::PublicKeyConfig {
            algorithm: crate::config::PublicKeyAlgorithm::RS256,
            pem: crate::config::Secret::File(
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../data/tests/fixtures/keys/rs256.pub.pem"
                )
                .into(),
            ),
            kid: None,
        }],
        ..Default::default()
    };
    let p = plane_with(ok_json, Verifier::public_keys(&keys).unwrap(), 1024).await;
    let hs = token(Role::Admin, None);
    let response = p
        .send(
            Method::GET,
            "/chroma/api/v2/heartbeat",
            &[("authorization", &bearer(&hs))],
            "",
        )
        .await;
    assert_refused(&response, StatusCode::UNAUTHORIZED, "unauthenticated");
    assert_eq!(p.upstream_saw(), 0);
}

#[tokio::test]
async fn forwarded_requests_carry_the_upstream_credential_not_the_clients() {
    let p = plane(ok_json).await;
    let agent = token(Role::Agent, Some("u1"));
    let headers = [
        ("authorization", bearer(&agent)),
        ("x-lethe-purpose", "personalization".into()),
        ("connection", "keep-alive, x-client-hop".into()),
        ("x-client-hop", "1".into()),
        ("x-trace", "t-1".into()),
        ("accept-encoding", "gzip".into()),
    ];
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (status, response_headers, _) = p
        .send(Method::GET, "/chroma/api/v2/heartbeat?x=1", &headers, "")
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        response_headers.get("x-upstream-hop").is_none(),
        "hop-by-hop headers of the answer are dropped"
    );
    assert!(response_headers.get("x-request-id").is_some());
    let seen = p.seen.lock().unwrap()[0].clone();
    assert_eq!(seen.uri, "/api/v2/heartbeat?x=1");
    assert_eq!(
        seen.headers.get("x-chroma-token").unwrap(),
        "upstream-secret"
    );
    assert!(
        seen.headers.get("authorization").is_none(),
        "the client's token never leaves Lethe"
    );
    assert!(seen.headers.get("x-lethe-purpose").is_none());
    assert!(seen.headers.get("x-client-hop").is_none());
    assert_eq!(seen.headers.get("x-trace").unwrap(), "t-1");
    assert_eq!(seen.headers.get("accept-encoding").unwrap(), "identity");
}

#[tokio::test]
async fn a_write_is_stamped_with_an_exact_length_or_refused_without_reaching_the_store() {
    let p = plane(ok_json).await;
    let agent = token(Role::Agent, Some("u1"));
    let auth = bearer(&agent);
    let scoped = [
        ("authorization", auth.as_str()),
        ("x-lethe-purpose", "personalization"),
        ("x-lethe-category", "preference"),
        ("content-type", "application/json"),
    ];
    let add = format!("{COLLECTION}/add");
    let body = json!({"ids": ["m1"], "embeddings": [[0.5]], "documents": ["likes tea"], "metadatas": [{"k": 1}]}).to_string();
    let (status, _, _) = p.send(Method::POST, &add, &scoped, body.clone()).await;
    assert_eq!(status, StatusCode::OK);
    let (held, seen) = {
        let seen = p.seen.lock().unwrap();
        (seen[0].clone(), seen[1].clone())
    };
    assert!(
        held.uri.ends_with("/get"),
        "what the store holds is read first"
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&held.body).unwrap(),
        json!({"ids": ["m1"], "include": ["metadatas"]})
    );
    assert_eq!(
        (seen.method, seen.uri.as_str()),
        (Method::POST, &add["/chroma".len()..])
    );
    assert_eq!(
        seen.headers
            .get("content-length")
            .unwrap()
            .to_str()
            .unwrap(),
        seen.body.len().to_string()
    );
    let sent: Value = serde_json::from_slice(&seen.body).unwrap();
    assert_eq!(
        (
            sent["metadatas"][0]["lethe_subject"].as_str(),
            sent["metadatas"][0]["k"].as_i64()
        ),
        (Some("u1"), Some(1))
    );
    // Lineage follows, off the request path.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while p.store.inventory("acme", "u1").await.unwrap().get("chroma") != Some(&1) {
        assert!(
            std::time::Instant::now() < deadline,
            "lineage row not written"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    let other = token(Role::Agent, Some("u2"));
    let other_auth = bearer(&other);
    let unconsented = [
        ("authorization", other_auth.as_str()),
        ("x-lethe-purpose", "personalization"),
        ("x-lethe-category", "preference"),
    ];
    let refused = p.send(Method::POST, &add, &unconsented, body.clone()).await;
    assert_refused(&refused, StatusCode::FORBIDDEN, "consent_required");
    assert_eq!(
        refused.2["error"]["details"],
        json!([{"index": 0, "code": "consent_required"}])
    );
    assert!(
        !refused.2.to_string().contains("likes tea"),
        "no content echoed"
    );
    let missing = p
        .send(
            Method::POST,
            &add,
            &[("authorization", auth.as_str())],
            body,
        )
        .await;
    assert_refused(&missing, StatusCode::UNPROCESSABLE_ENTITY, "missing_scope");
    assert_eq!(
        p.upstream_saw(),
        2,
        "refused writes never reached the upstream"
    );
}

#[tokio::test]
async fn malformed_and_oversized_input_is_refused_cleanly() {
    let p = plane(ok_json).await;
    let agent = token(Role::Agent, Some("u1"));
    let auth = bearer(&agent);
    let scoped = [
        ("authorization", auth.as_str()),
        ("x-lethe-purpose", "personalization"),
        ("x-lethe-category", "preference"),
    ];
    let add = format!("{COLLECTION}/add");
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let nested_object = format!(
        "{{\"ids\": [\"a\"], \"metadatas\": [{}1{}]}}",
        "{\"a\":".repeat(5_000),
        "}".repeat(5_000)
    );
    let bodies = [
        "{\"ids\": [\"a\"",
        "not json at all",
        deep.as_str(),
        nested_object.as_str(),
        r#"{"ids": ["a", "b"], "documents": ["only one"]}"#,
        r#"{"ids": ["a"], "embeddings": [[1], [2], [3]]}"#,
    ];
    for body in bodies {
        let response = p.send(Method::POST, &add, &scoped, body.to_owned()).await;
        assert_refused(&response, StatusCode::BAD_REQUEST, "invalid_request");
    }
    let query = format!("{COLLECTION}/query");
    assert_refused(
        &p.send(Method::POST, &query, &scoped, "{\"where\": 5}")
            .await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    );
    for (method, path) in [
        (Method::POST, format!("{COLLECTION}/search")),
        (Method::POST, "/chroma/api/v2/reset".to_owned()),
        (Method::GET, "/chroma/api/v1/collections".to_owned()),
        (Method::POST, "/chroma/api/v2/tenants".to_owned()),
    ] {
        let response = p.send(method.clone(), &path, &scoped, "{}").await;
        assert!(
            matches!(response.0, StatusCode::NOT_FOUND | StatusCode::FORBIDDEN),
            "{method} {path}: {}",
            response.0
        );
    }
    assert_refused(
        &p.send(Method::GET, "/qdrant/collections", &scoped, "")
            .await,
        StatusCode::NOT_FOUND,
        "unknown_route",
    );
    assert_eq!(p.upstream_saw(), 0);
}

#[tokio::test]
async fn paths_the_store_would_read_another_way_are_refused() {
    let p = plane(ok_json).await;
    let auth = bearer(&token(Role::Admin, None));
    let headers = [("authorization", auth.as_str())];
    for path in [
        format!("{COLLECTION}/%67et"),
        COLLECTION.replace("c0ffee00", "%630ffee00"),
        format!("{COLLECTION}//get"),
        format!("{COLLECTION}/./get"),
        format!("{COLLECTION}/x/../get"),
        format!("{COLLECTION}/get/"),
        "/chroma/api/v2/tenants/%64efault_tenant".to_owned(),
    ] {
        let response = p.send(Method::POST, &path, &headers, "{}").await;
        assert_refused(&response, StatusCode::BAD_REQUEST, "invalid_request");
    }
    assert_eq!(p.upstream_saw(), 0);
}

/// A second copy of a header or a query parameter is refused before anything moves: a proxy in
/// front of Lethe, or the store behind it, might read the other one.
#[tokio::test]
async fn repeated_headers_and_query_parameters_are_refused() {
    let p = plane(ok_json).await;
    let auth = bearer(&token(Role::Agent, None));
    let other = bearer(&token(Role::Agent, Some("u2")));
    let get = format!("{COLLECTION}/get");
    let response = p
        .send(
            Method::POST,
            &get,
            &[
                ("authorization", auth.as_str()),
                ("authorization", other.as_str()),
            ],
            "{}",
        )
        .await;
    assert_refused(&response, StatusCode::UNAUTHORIZED, "unauthenticated");
    for header in ["x-lethe-subject", "x-lethe-purpose", "x-lethe-category"] {
        let response = p
            .send(
                Method::POST,
                &get,
                &[
                    ("authorization", auth.as_str()),
                    (header, "u1"),
                    (header, "u2"),
                ],
                "{}",
            )
            .await;
        assert_refused(&response, StatusCode::BAD_REQUEST, "invalid_request");
    }
    for query in ["?limit=1&limit=2", "?limit=1&%6Cimit=2", "?a&a"] {
        let response = p
            .send(
                Method::GET,
                &format!("/chroma/api/v2/tenants/default_tenant/databases/default_database/collections{query}"),
                &[("authorization", auth.as_str())],
                "",
            )
            .await;
        assert_refused(&response, StatusCode::BAD_REQUEST, "invalid_request");
    }
    assert_eq!(p.upstream_saw(), 0);
}

/// Answers a `get` with one record of u2's, stamped, under the id `theirs`.
fn holds_u2s_record(received: &Received) -> (StatusCode, String) {
    if received.uri.ends_with("/get") {
        let stamp = json!({"lethe_subject": "u2", "lethe_tenant": "acme", "lethe_purpose": "personalization",
            "lethe_category": "preference", "lethe_expires_at": 4_102_444_800i64, "lethe_epoch": 0});
        return (
            StatusCode::OK,
            json!({"ids": ["theirs"], "metadatas": [stamp]}).to_string(),
        );
    }
    (StatusCode::OK, "{}".into())
}

#[tokio::test]
async fn a_write_is_decided_on_the_stamp_the_store_holds_and_claims_nothing_absent() {
    let p = plane(holds_u2s_record).await;
    let auth = bearer(&token(Role::Agent, Some("u1")));
    let scoped = [
        ("authorization", auth.as_str()),
        ("x-lethe-purpose", "personalization"),
        ("x-lethe-category", "preference"),
    ];
    let body = json!({"ids": ["theirs"], "metadatas": [{"k": 1}]}).to_string();
    for (op, code) in [
        ("update", "scope_violation"),
        ("upsert", "scope_violation"),
        ("add", "already_exists"),
    ] {
        let response = p
            .send(
                Method::POST,
                &format!("{COLLECTION}/{op}"),
                &scoped,
                body.clone(),
            )
            .await;
        let status = if op == "add" {
            StatusCode::CONFLICT
        } else {
            StatusCode::FORBIDDEN
        };
        assert_refused(&response, status, code);
    }
    let missing = json!({"ids": ["nobodys"], "metadatas": [{"k": 1}]}).to_string();
    let response = p
        .send(
            Method::POST,
            &format!("{COLLECTION}/update"),
            &scoped,
            missing,
        )
        .await;
    assert_eq!((response.0, response.2), (StatusCode::OK, json!({})));
    let seen = p.seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|r| r.uri.ends_with("/get")),
        "only reads of what the store holds reached it: {:?}",
        seen.iter().map(|r| &r.uri).collect::<Vec<_>>()
    );
    assert_eq!(seen.len(), 4);
}

/// A raw request declaring (or streaming) more than the limit is answered 413 without Lethe
/// reading the rest of it.
#[tokio::test]
async fn a_50_mb_body_is_refused_before_it_is_read() {
    let p = plane(ok_json).await;
    let agent = token(Role::Agent, Some("u1"));
    for chunked in [false, true] {
        let mut stream = tokio::net::TcpStream::connect(p.addr).await.unwrap();
        let length = if chunked {
            "transfer-encoding: chunked".to_owned()
        } else {
            format!("content-length: {}", 50 * 1024 * 1024)
        };
        let head = format!(
            "POST {COLLECTION}/add HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {agent}\r\n{length}\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let chunk = vec![b'x'; 64 * 1024];
        // Send a little more than the 1 MiB limit, then stop: Lethe must answer anyway.
        for _ in 0..20 {
            if chunked {
                let _ = stream
                    .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .await;
                let _ = stream.write_all(&chunk).await;
                let _ = stream.write_all(b"\r\n").await;
            } else {
                let _ = stream.write_all(&chunk).await;
            }
        }
        let mut answer = vec![0u8; 4096];
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), stream.read(&mut answer))
            .await
            .unwrap()
            .unwrap();
        let text = String::from_utf8_lossy(&answer[..n]);
        assert!(
            text.starts_with("HTTP/1.1 413"),
            "chunked={chunked}: {text}"
        );
        assert!(text.contains("body_too_large"));
    }
    assert_eq!(p.upstream_saw(), 0);
}

fn misaligned(_: &Received) -> (StatusCode, String) {
    (
        StatusCode::OK,
        json!({"ids": ["a", "b"], "documents": ["A"], "metadatas": [null, null]}).to_string(),
    )
}

#[tokio::test]
async fn an_answer_that_cannot_be_checked_is_not_passed_on() {
    let p = plane(misaligned).await;
    let agent = token(Role::Agent, Some("u1"));
    let response = p
        .send(
            Method::POST,
            &format!("{COLLECTION}/get"),
            &[("authorization", &bearer(&agent))],
            "{}",
        )
        .await;
    assert_refused(&response, StatusCode::BAD_GATEWAY, "upstream_invalid");
    assert!(!response.2.to_string().contains("\"A\""));
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_clear_502() {
    let p = plane(ok_json).await;
    let config = Config::check(
        r#"
        [[routes]]
        name = "chroma"
        prefix = "/chroma"
        upstream = "http://127.0.0.1:9"
        adapter = "chroma"
        "#,
    )
    .unwrap();
    let (state, _) = DataState::build(
        &config,
        crate::routes(&config).unwrap(),
        Arc::clone(&p.store),
        Tokens::lethe(Arc::new(Verifier::hs256(SECRET, "lethe", 0).unwrap())),
        Arc::from(&b"k"[..]),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(serve(
        listener,
        state,
        Limits {
            timeout: std::time::Duration::from_secs(5),
            max_concurrency: 8,
            ..Limits::default()
        },
        None,
        std::future::pending(),
    ));
    let down = Plane {
        addr,
        seen: Arc::default(),
        store: Arc::clone(&p.store),
    };
    let admin = token(Role::Admin, None);
    assert_refused(
        &down
            .send(
                Method::GET,
                "/chroma/api/v2/heartbeat",
                &[("authorization", &bearer(&admin))],
                "",
            )
            .await,
        StatusCode::BAD_GATEWAY,
        "upstream_unavailable",
    );
}

/// The store takes a write while a flip commits: the writer sees the flip once the store has
/// answered, deletes what it wrote and refuses, so nothing lands behind the purge.
#[tokio::test]
async fn a_write_overtaken_by_the_flip_is_undone() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    static ARRIVED: AtomicBool = AtomicBool::new(false);
    static FLIPPED: AtomicBool = AtomicBool::new(false);
    /// Holds the add until the flip has committed, as a slow store would.
    fn add_held_until_flipped(received: &Received) -> (StatusCode, String) {
        if received.uri.ends_with("/add") {
            ARRIVED.store(true, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(5);
            while !FLIPPED.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        ok_json(received)
    }
    let p = plane(add_held_until_flipped).await;
    let auth = bearer(&token(Role::Agent, Some("u1")));
    let scoped = [
        ("authorization", auth.as_str()),
        ("x-lethe-purpose", "personalization"),
        ("x-lethe-category", "preference"),
    ];
    let add = format!("{COLLECTION}/add");
    let body = json!({"ids": ["m1", "m2"], "embeddings": [[0.5], [0.6]]}).to_string();
    let flip = flip_once_arrived(&p.store, &ARRIVED, &FLIPPED);
    let (response, ()) = tokio::join!(p.send(Method::POST, &add, &scoped, body), flip);
    assert_refused(&response, StatusCode::FORBIDDEN, "subject_suppressed");
    let seen = p.seen.lock().unwrap().clone();
    let undo = seen.last().unwrap();
    assert!(undo.uri.ends_with("/delete"), "{}", undo.uri);
    let undone: Value = serde_json::from_slice(&undo.body).unwrap();
    assert_eq!(undone, json!({"ids": ["m1", "m2"]}));
}

/// Waits until the stand-in has the request, then suppresses u1 (an approved erasure) and lets
/// the stand-in answer.
async fn flip_once_arrived(
    store: &Arc<dyn Store>,
    arrived: &std::sync::atomic::AtomicBool,
    flipped: &std::sync::atomic::AtomicBool,
) {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};
    let deadline = Instant::now() + Duration::from_secs(5);
    while !arrived.load(Ordering::SeqCst) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let now = crate::now();
    let record = crate::testing::erasure_request("er1", "u1", now);
    store.create_erasure(&record, &[], audit()).await.unwrap();
    store
        .approve_erasure("er1", "dpo", 1, now, audit())
        .await
        .unwrap();
    flipped.store(true, Ordering::SeqCst);
}

/// A stored response the provider made while the flip committed is deleted there again, its
/// record marked deleted, and the request refused.
#[tokio::test]
async fn a_provider_object_made_while_the_flip_committed_is_deleted_again() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    static ARRIVED: AtomicBool = AtomicBool::new(false);
    static FLIPPED: AtomicBool = AtomicBool::new(false);
    fn provider(received: &Received) -> (StatusCode, String) {
        if received.method == Method::POST && received.uri == "/v1/responses" {
            ARRIVED.store(true, Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(5);
            while !FLIPPED.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            return (
                StatusCode::OK,
                json!({"id": "resp_1", "object": "response", "store": true}).to_string(),
            );
        }
        (
            StatusCode::OK,
            json!({"id": "resp_1", "deleted": true}).to_string(),
        )
    }
    let p = plane(provider).await;
    let keeps = ConsentGrant {
        id: "g-provider".into(),
        tenant: "acme".into(),
        subject: "u1".into(),
        purpose: "support".into(),
        category: "conversation".into(),
        actions: [Action::SendToProvider, Action::ProviderRetention]
            .into_iter()
            .collect(),
        granted_at: crate::now(),
        expires_at: None,
        revoked_at: None,
        policy_version: 1,
        source: "test".into(),
    };
    p.store.create_grant(&keeps, audit()).await.unwrap();
    let auth = bearer(&token(Role::Agent, Some("u1")));
    let scoped = [
        ("authorization", auth.as_str()),
        ("x-lethe-purpose", "support"),
        ("x-lethe-category", "conversation"),
    ];
    let body = json!({"model": "m", "input": "my address"}).to_string();
    let send = p.send(Method::POST, "/openai/v1/responses", &scoped, body);
    let (response, ()) = tokio::join!(send, flip_once_arrived(&p.store, &ARRIVED, &FLIPPED));
    assert_refused(&response, StatusCode::FORBIDDEN, "subject_suppressed");
    let seen = p.seen.lock().unwrap().clone();
    let undo = seen.last().unwrap();
    assert_eq!(
        (undo.method.clone(), undo.uri.as_str()),
        (Method::DELETE, "/v1/responses/resp_1")
    );
    let live = p
        .store
        .item_stamps("openai", "responses", &["resp_1".to_owned()])
        .await
        .unwrap();
    assert!(
        live.is_empty(),
        "recorded, then marked deleted with the undo"
    );
}

/// Fails as Starlette under uvicorn does (LangGraph's server, any ASGI upstream): a whole 500,
/// its length given or chunked, without `Connection: close`, and then the connection closed all
/// the same. Here the close waits until the next request has arrived on that connection, so a
/// pool that kept it loses that request every time rather than now and then. Requests without
/// `x-fail` are answered `{}`, keep-alive. Counts the connections it accepted.
async fn closes_after_its_500(chunked: bool) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while let Some(head) = read_head(&mut stream, &mut buf).await {
                    if !head.contains("\r\nx-fail: 1") {
                        let ok = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                        if stream.write_all(ok.as_bytes()).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let error = if chunked {
                        "HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n15\r\nInternal Server Error\r\n0\r\n\r\n"
                    } else {
                        "HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 21\r\n\r\nInternal Server Error"
                    };
                    let _ = stream.write_all(error.as_bytes()).await;
                    // Closed without a word once anything else arrives (or Lethe lets go of it).
                    let _ = tokio::time::timeout(
                        std::time::Duration::from_secs(2),
                        stream.read(&mut [0u8; 1]),
                    )
                    .await;
                    return;
                }
            });
        }
    });
    (addr, accepted)
}

/// The head of the next request on `stream`, lowercased, taken out of `buf`; `None` at EOF.
/// (Lethe sends these GETs without a body.)
async fn read_head(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            buf.drain(..end + 4);
            return Some(head);
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// An upstream that closes its connection after a 500 without saying so does not cost the next
/// request a 502: the pooled connection that carried a 5xx is not used again.
#[tokio::test]
async fn an_upstream_500_does_not_cost_the_next_request_its_connection() {
    use std::sync::atomic::Ordering;
    for chunked in [false, true] {
        let (upstream_addr, connections) = closes_after_its_500(chunked).await;
        let store = migrated(&fresh_sqlite_url()).await;
        let config = Config::check(&format!(
            r#"
            [[routes]]
            name = "chroma"
            prefix = "/chroma"
            upstream = "http://{upstream_addr}"
            adapter = "chroma"
            "#
        ))
        .unwrap();
        let (state, _lineage) = DataState::build(
            &config,
            crate::routes(&config).unwrap(),
            Arc::clone(&store),
            Tokens::lethe(Arc::new(Verifier::hs256(SECRET, "lethe", 0).unwrap())),
            Arc::from(&b"k"[..]),
        )
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            timeout: std::time::Duration::from_secs(5),
            max_concurrency: 8,
            ..Limits::default()
        };
        tokio::spawn(serve(listener, state, limits, None, std::future::pending()));
        let p = Plane {
            addr,
            seen: Arc::default(),
            store,
        };
        let admin = bearer(&token(Role::Admin, None));
        let heartbeat = "/chroma/api/v2/heartbeat";
        let failed = p
            .send(
                Method::GET,
                heartbeat,
                &[("authorization", admin.as_str()), ("x-fail", "1")],
                "",
            )
            .await;
        assert_eq!(
            (failed.0, failed.2),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!("Internal Server Error")
            ),
            "chunked={chunked}: the upstream's own error is passed on"
        );
        let next = p
            .send(
                Method::GET,
                heartbeat,
                &[("authorization", admin.as_str())],
                "",
            )
            .await;
        assert_eq!(next.0, StatusCode::OK, "chunked={chunked}: {}", next.2);
        assert!(
            connections.load(Ordering::SeqCst) >= 2,
            "chunked={chunked}: the next request went over a fresh connection"
        );
    }
}

/// A store spoken to in a line protocol of its own: greets with the route's name, then echoes
/// each line, until the client leaves or Lethe stops (then it says so and closes).
#[derive(Debug)]
struct Echo;

impl route::RouteStore for Echo {
    fn kind(&self) -> &'static str {
        "echo"
    }

    fn serving(&self) -> route::Serving<'_> {
        route::Serving::Connections(self)
    }

    fn connector(
        &self,
        _: Route,
        _: Arc<Upstreams>,
        _: &crate::config::ErasureConfig,
        _: &Arc<[u8]>,
    ) -> Arc<dyn crate::purge::Connector> {
        Arc::new(crate::testing::Holding { extra: 0 })
    }
}

#[async_trait::async_trait]
impl route::ConnectionRoute for Echo {
    async fn serve(
        &self,
        route: &Route,
        _: &Arc<DataState>,
        connection: tokio::net::TcpStream,
        _: SocketAddr,
        _: route::Timeouts,
        mut stopping: tokio::sync::watch::Receiver<bool>,
    ) {
        use tokio::io::AsyncBufReadExt;
        let (read, mut write) = connection.into_split();
        let mut lines = tokio::io::BufReader::new(read).lines();
        let _ = write
            .write_all(format!("{}\n", route.name).as_bytes())
            .await;
        loop {
            tokio::select! {
                line = lines.next_line() => match line {
                    Ok(Some(line)) => {
                        let _ = write.write_all(format!("{line}\n").as_bytes()).await;
                    }
                    _ => return,
                },
                () = stopped(&mut stopping) => {
                    let _ = write.write_all(b"bye\n").await;
                    return;
                }
            }
        }
    }

    fn refusal(&self, why: &str) -> Vec<u8> {
        format!("refused: {why}\n").into_bytes()
    }
}

async fn stopped(stopping: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stopping.wait_for(|stop| *stop).await;
}

/// Reads one line from `stream` (a deadline, not a sleep: a stuck server fails the test).
async fn line_of(stream: &mut tokio::net::TcpStream) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(std::time::Duration::from_secs(5), async {
        loop {
            match stream.read(&mut byte).await {
                Ok(1) if byte[0] != b'\n' => line.push(byte[0]),
                _ => break,
            }
        }
    })
    .await
    .expect("a line within 5 s");
    String::from_utf8(line).unwrap()
}

/// A data plane of the default configuration with no route of its own: what the listeners'
/// tests hand their connections to.
async fn without_routes() -> (Arc<DataState>, tokio::task::JoinHandle<()>) {
    let store = migrated(&fresh_sqlite_url()).await;
    DataState::build(
        &Config::check("").unwrap(),
        Vec::new(),
        store,
        Tokens::lethe(Arc::new(Verifier::hs256(SECRET, "lethe", 0).unwrap())),
        Arc::from(&b"k"[..]),
    )
    .unwrap()
}

#[tokio::test]
async fn a_route_with_a_listener_of_its_own_gets_each_connection_whole_until_lethe_stops() {
    let (state, _lineage) = without_routes().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let route = Route {
        name: "lines".into(),
        prefix: None,
        listen: Some(addr),
        upstream: "tcp://127.0.0.1:9".parse().unwrap(),
        credential: None,
        timeout: None,
        purpose: None,
        category: None,
        store: Arc::new(Echo),
    };
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let served = tokio::spawn(serve_connections(
        listener,
        route,
        state,
        stopping,
        Limits {
            timeout: std::time::Duration::from_secs(5),
            connections: admission::ConnectionLimits {
                max_connections: 8,
                max_connections_per_address: 2,
            },
            ..Limits::default()
        },
    ));
    let mut first = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut second = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert_eq!(line_of(&mut first).await, "lines");
    assert_eq!(line_of(&mut second).await, "lines");
    first.write_all(b"one\n").await.unwrap();
    second.write_all(b"two\n").await.unwrap();
    assert_eq!(line_of(&mut second).await, "two", "each connection its own");
    assert_eq!(line_of(&mut first).await, "one");
    // A third from the same address is told why, in the route's protocol, and closed.
    let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
    assert_eq!(
        line_of(&mut third).await,
        "refused: this address holds as many connections as one address may"
    );
    assert_eq!(third.read(&mut [0u8; 1]).await.unwrap(), 0, "and closed");

    stop.send(true).unwrap();
    assert_eq!(line_of(&mut first).await, "bye");
    assert_eq!(line_of(&mut second).await, "bye");
    tokio::time::timeout(std::time::Duration::from_secs(5), served)
        .await
        .expect("the listener ends once its connections have")
        .unwrap();
    let refused = tokio::net::TcpStream::connect(addr).await;
    assert!(refused.is_err(), "nothing listens after the stop");
}

/// The data plane's listener admits as many connections as it may, and tells the next one why
/// in HTTP, with the stable code, before it reads a byte of it.
#[tokio::test]
async fn a_connection_past_the_listeners_limit_is_answered_overloaded() {
    let (state, _lineage) = without_routes().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = Limits {
        connections: admission::ConnectionLimits {
            max_connections: 1,
            max_connections_per_address: 1,
        },
        ..Limits::default()
    };
    tokio::spawn(serve(listener, state, limits, None, std::future::pending()));
    // Of two connections, the one accepted second is refused; the other waits for a request.
    let mut first = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut second = tokio::net::TcpStream::connect(addr).await.unwrap();
    async fn answer_of(stream: &mut tokio::net::TcpStream) -> String {
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer).await;
        answer
    }
    let answer = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        tokio::select! {
            answer = answer_of(&mut first) => answer,
            answer = answer_of(&mut second) => answer,
        }
    })
    .await
    .expect("an answer within 5 s");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains(r#""code":"overloaded""#), "{answer}");
}

#[test]
fn routes_match_whole_path_segments() {
    let route = Route {
        name: "chroma".into(),
        prefix: Some("/chroma".into()),
        listen: None,
        upstream: "http://127.0.0.1:8000".parse().unwrap(),
        credential: None,
        timeout: None,
        purpose: None,
        category: None,
        store: (crate::chroma::KIND.settings)(toml::Table::new()).unwrap(),
    };
    assert_eq!(
        route.strip("/chroma/api/v2/heartbeat"),
        Some("/api/v2/heartbeat")
    );
    assert_eq!(route.strip("/chroma"), Some(""));
    assert_eq!(route.strip("/chromaX/api"), None);
    assert_eq!(route.strip("/other"), None);
}

/// An upstream's interim answer (101 Switching Protocols) is no answer: passed on, it would leave
/// the client's connection in a protocol Lethe does not speak.
#[tokio::test]
async fn an_upstreams_interim_answer_is_refused_as_invalid() {
    let p = plane(|_| (StatusCode::SWITCHING_PROTOCOLS, String::new())).await;
    let agent = token(Role::Agent, Some("u1"));
    let response = p
        .send(
            Method::GET,
            "/chroma/api/v2/heartbeat",
            &[("authorization", &bearer(&agent))],
            "",
        )
        .await;
    assert_refused(&response, StatusCode::BAD_GATEWAY, "upstream_invalid");
}
