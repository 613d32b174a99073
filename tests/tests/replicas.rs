//! Three replicas on one PostgreSQL: an erasure approved on one is enforced by the data plane of
//! the other two. Prints the delay from the approval's answer to each other replica refusing.

use std::time::{Duration, Instant};

use hyper::{Method, StatusCode};
use lethe_tests::*;
use serde_json::json;

const ADD: &str = "/chroma/api/v2/tenants/default_tenant/databases/default_database/collections/c0ffee00-0000-4000-8000-000000000001/add";

/// A data-plane write for `subject`: forwarded (and failing at the absent upstream, 502) while the
/// subject is active, refused with 403 subject_suppressed once the replica knows of the flip.
async fn write(server: &Server, token: &str) -> (StatusCode, serde_json::Value) {
    let body = json!({"ids": ["m"], "embeddings": [[0.5]], "documents": ["d"],
                      "metadatas": [{"lethe_purpose": "personalization", "lethe_category": "preference"}]});
    call(
        Method::POST,
        &format!("http://{}{ADD}", server.data),
        token,
        Some(&body),
    )
    .await
    .unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::test]
async fn three_replicas_enforce_a_flip_made_on_one_of_them() {
    let state = fresh_postgres_database().await.unwrap();
    let dirs = [temp_dir(), temp_dir(), temp_dir()];
    let (a, b, c) = tokio::join!(
        Server::start(&dirs[0], &state),
        Server::start(&dirs[1], &state),
        Server::start(&dirs[2], &state)
    );
    let dpo = a.token("compliance", "acme");
    let rules = json!({"rules": [{"purpose": "personalization", "category": "preference", "max_age": "30d"}]});
    assert_eq!(
        call(
            Method::PUT,
            &a.url("/v1/retention-rules"),
            &dpo,
            Some(&rules)
        )
        .await
        .unwrap()
        .0,
        StatusCode::OK
    );

    let mut delays = Vec::new();
    for round in 0..15 {
        let subject = format!("s{round}");
        let grant = json!({"subject": subject, "purpose": "personalization", "category": "preference",
                           "actions": ["store", "retrieve"], "source": "e2e", "policy_version": 1});
        assert_eq!(
            call(Method::POST, &a.url("/v1/consents"), &dpo, Some(&grant))
                .await
                .unwrap()
                .0,
            StatusCode::CREATED
        );
        let agent = a.token_for("agent", "acme", Some(&subject));
        for replica in [&b, &c] {
            let (status, body) = write(replica, &agent).await;
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (StatusCode::BAD_GATEWAY, Some("upstream_unavailable")),
                "allowed before the flip"
            );
        }
        let filed = json!({"subject": subject, "ticket": "DSR", "reason": "test"});
        let (_, request) = call(Method::POST, &a.url("/v1/erasures"), &dpo, Some(&filed))
            .await
            .unwrap();
        let approve = a.url(&format!(
            "/v1/erasures/{}/approve",
            request["id"].as_str().unwrap()
        ));
        let (status, approved) = call(Method::POST, &approve, &dpo, None).await.unwrap();
        assert_eq!(
            (status, approved["state"].as_str()),
            (StatusCode::OK, Some("suppressed"))
        );
        let flipped = Instant::now();
        // Both other replicas are polled at once; the first refusal each gives marks when it knew.
        let until_refused = async |replica: &Server| {
            loop {
                let (status, body) = write(replica, &agent).await;
                if status == StatusCode::FORBIDDEN {
                    assert_eq!(body["error"]["code"], "subject_suppressed");
                    return flipped.elapsed();
                }
                assert!(
                    flipped.elapsed() < Duration::from_secs(5),
                    "a replica still accepts writes 5 s after the flip"
                );
            }
        };
        let (on_b, on_c) = tokio::join!(until_refused(&b), until_refused(&c));
        delays.extend([on_b, on_c]);
        assert_eq!(
            write(&a, &agent).await.0,
            StatusCode::FORBIDDEN,
            "and the replica that flipped"
        );
    }
    delays.sort();
    eprintln!(
        "flip seen by the other replicas' data planes over {} observations: p50 {:?}, p99 {:?} (one HTTP round trip of polling included)",
        delays.len(),
        percentile(&delays, 0.5),
        percentile(&delays, 0.99)
    );
}

/// A token revoked through one replica is refused by the other's data and control planes at once.
#[tokio::test]
async fn a_token_revoked_on_one_replica_is_refused_by_the_other() {
    let state = fresh_postgres_database().await.unwrap();
    let dirs = [temp_dir(), temp_dir()];
    let (a, b) = tokio::join!(
        Server::start(&dirs[0], &state),
        Server::start(&dirs[1], &state)
    );
    let agent = a.token("agent", "acme");
    let dpo = a.token("compliance", "acme");
    let claims: serde_json::Value =
        jsonwebtoken::dangerous::insecure_decode_claims(&agent).unwrap();
    let jti = claims["jti"]
        .as_str()
        .expect("lethe token gives every token an id");
    // Before: b takes the agent's token (the write goes on to be refused for its own reasons).
    assert_ne!(write(&b, &agent).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(
        call(Method::GET, &b.url("/v1/audit"), &dpo, None)
            .await
            .unwrap()
            .0,
        StatusCode::OK
    );
    let admin = a.token("admin", "acme");
    for token in [&agent, &dpo] {
        let claims: serde_json::Value =
            jsonwebtoken::dangerous::insecure_decode_claims(token).unwrap();
        let (status, body) = call(
            Method::POST,
            &a.url("/v1/tokens/revoke"),
            &admin,
            Some(&json!({ "jti": claims["jti"] })),
        )
        .await
        .unwrap();
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let answered = Instant::now();
    loop {
        let (status, body) = write(&b, &agent).await;
        if status == StatusCode::UNAUTHORIZED {
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("revoked"),
                "{body}"
            );
            break;
        }
        assert!(
            answered.elapsed() < Duration::from_secs(5),
            "b still takes the revoked token: {status}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "revoked token {jti} refused by the other replica {:?} after the answer",
        answered.elapsed()
    );
    // The second revocation reaches b on its own notification, a moment after the first, if
    // at all: waited for within the same bound.
    loop {
        let (status, _) = call(Method::GET, &b.url("/v1/audit"), &dpo, None)
            .await
            .unwrap();
        if status == StatusCode::UNAUTHORIZED {
            break;
        }
        assert_eq!(status, StatusCode::OK);
        assert!(
            answered.elapsed() < Duration::from_secs(5),
            "b's control plane still takes the revoked token"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
