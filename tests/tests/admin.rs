//! The admin listener: probes and metrics for the kubelet and Prometheus, and nothing else.

use hyper::{Method, StatusCode};
use lethe_tests::*;
use serde_json::json;

async fn get(url: &str) -> (StatusCode, serde_json::Value) {
    call(Method::GET, url, "", None)
        .await
        .expect("the admin listener answers")
}

/// The value of the metric line that starts with `series` (name and labels, exactly).
fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn the_admin_listener_serves_probes_and_metrics_and_nothing_of_the_data() {
    let dir = temp_dir();
    let server = Server::start(&dir, &fresh_sqlite_url()).await;
    let admin = |path: &str| format!("http://{}{path}", server.admin);
    assert_eq!(get(&admin("/live")).await.0, StatusCode::OK);
    let (status, ready) = get(&admin("/ready")).await;
    assert_eq!(status, StatusCode::OK, "{ready}");
    assert_eq!(
        ready,
        json!({"status": "ready", "checks": {"state_store": "ok", "change_feed": "ok"}})
    );
    // Nothing that reads or changes data, whatever the caller brings.
    let admin_token = server.token("admin", "acme");
    for path in [
        "/v1/consents?subject=u1",
        "/v1/audit",
        "/console/sign-in",
        "/healthz",
        "/openapi.json",
    ] {
        let (status, _) = call(Method::GET, &admin(path), &admin_token, None)
            .await
            .unwrap();
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
    }
    let (status, _) = call(
        Method::POST,
        &admin("/v1/erasures"),
        &admin_token,
        Some(&json!({})),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Data-plane traffic: refused without a token, and forwarded to an upstream that is down.
    let data = |path: &str| format!("http://{}{path}", server.data);
    let (status, _) = call(Method::GET, &data("/chroma/api/v2/heartbeat"), "", None)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let agent = server.token("agent", "acme");
    let (status, _) = call(Method::GET, &data("/chroma/api/v2/heartbeat"), &agent, None)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let (status, filed) = call(
        Method::POST,
        &server.url("/v1/erasures"),
        &server.token("compliance", "acme"),
        Some(&json!({"subject": "u1", "ticket": "DSR-1", "reason": "art. 17"})),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::CREATED, "{filed}");

    let (status, metrics) = get(&admin("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    let metrics = metrics.as_str().expect("text").to_owned();
    let served = |status: u16, error: &str| {
        format!(
            "http_server_request_duration_seconds_count{{lethe_route=\"chroma\",http_request_method=\"GET\",http_response_status_code=\"{status}\",error_type=\"{error}\"}}"
        )
    };
    assert_eq!(
        value(&metrics, &served(401, "unauthenticated")),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        value(&metrics, &served(502, "upstream_unavailable")),
        Some(1.0),
        "{metrics}"
    );
    for (series, expected) in [
        (
            "http_client_request_duration_seconds_count{lethe_route=\"chroma\",http_response_status_code=\"\",error_type=\"unavailable\"}",
            1.0,
        ),
        ("lethe_open_connections{listener=\"data\"}", 0.0),
        ("lethe_state_store_up", 1.0),
        ("lethe_erasure_requests_overdue", 0.0),
        ("lethe_purge_oldest_due_seconds", 0.0),
    ] {
        assert_eq!(
            value(&metrics, series),
            Some(expected),
            "{series} in\n{metrics}"
        );
    }
    // One request filed: awaiting approval (two are required by default) or already flipped.
    let open: f64 = ["requested", "suppressed", "purging"]
        .iter()
        .filter_map(|state| {
            value(
                &metrics,
                &format!("lethe_erasure_requests{{state=\"{state}\"}}"),
            )
        })
        .sum();
    assert_eq!(open, 1.0, "{metrics}");
    for result in ["hit", "miss", "bypassed"] {
        let series = format!("lethe_policy_cache_lookups_total{{result=\"{result}\"}}");
        assert!(value(&metrics, &series).is_some(), "{series} in\n{metrics}");
    }
    // No subject, key or tenant reaches a label.
    assert!(
        !metrics.contains("u1") && !metrics.contains("acme"),
        "{metrics}"
    );
}

/// `/ready` fails, and says why, when the state store is gone; `/live` still answers.
#[tokio::test]
async fn ready_names_the_check_that_fails() {
    let url = fresh_postgres_database()
        .await
        .expect("a PostgreSQL test database");
    let server = Server::start(&temp_dir(), &url).await;
    let ready = format!("http://{}/ready", server.admin);
    assert_eq!(get(&ready).await.0, StatusCode::OK);
    let (base, name) = url.rsplit_once('/').expect("a database URL");
    execute_raw(
        &format!("{base}/postgres"),
        &format!("DROP DATABASE \"{name}\" WITH (FORCE)"),
    )
    .await
    .expect("drop the state database");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let body = loop {
        let (status, body) = get(&ready).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            break body;
        }
        assert!(std::time::Instant::now() < deadline, "still ready: {body}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(body["status"], "not_ready");
    assert_eq!(body["checks"]["state_store"], "unreachable", "{body}");
    let live = format!("http://{}/live", server.admin);
    assert_eq!(get(&live).await.0, StatusCode::OK);
}
