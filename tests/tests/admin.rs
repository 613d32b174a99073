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
    for series in [
        "lethe_lineage_rows_written_total",
        "lethe_lineage_batches_dropped_total",
        "lethe_lineage_queued_rows",
        "lethe_retention_swept_items_total",
    ] {
        assert!(value(&metrics, series).is_some(), "{series} in\n{metrics}");
    }
    // The sweeper's first pass runs at start.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (_, metrics) = get(&admin("/metrics")).await;
        let swept = value(
            metrics.as_str().unwrap(),
            "lethe_retention_sweeps_total{result=\"ok\"}",
        );
        if swept.is_some_and(|n| n >= 1.0) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no sweep counted");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
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

/// Off a terminal, logs are JSON, one event per line, with no colour codes and no subject; a
/// configured `[log] format = "text"` is plain text, still without colour codes.
#[tokio::test]
async fn logs_are_json_lines_off_a_terminal_and_never_carry_a_subject() {
    for format in ["json", "text"] {
        let dir = temp_dir();
        let log = dir.join("lethe.log");
        if format == "text" {
            let shipped = std::fs::read_to_string(workspace().join("config/lethe.toml")).unwrap();
            let text = shipped.replace("# format = \"json\"", "format = \"text\"");
            assert_ne!(text, shipped);
            std::fs::write(dir.join("lethe.toml"), text).unwrap();
        }
        let file = std::fs::File::create(&log).unwrap();
        let server = Server::start_with(&dir, &fresh_sqlite_url(), |command| {
            command
                .env("LETHE_LOG", "info")
                .stderr(file.try_clone().unwrap());
            if format == "text" {
                command.env("LETHE_CONFIG", dir.join("lethe.toml"));
            }
        })
        .await;
        let token = server.token_for("agent", "acme", Some("secret-subject-42"));
        let heartbeat = format!("http://{}/chroma/api/v2/heartbeat", server.data);
        let (status, _) = call(Method::GET, &heartbeat, &token, None).await.unwrap();
        assert_eq!(status, StatusCode::BAD_GATEWAY);
        drop(server);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(!text.contains("secret-subject-42"), "{text}");
        assert!(!text.contains('\u{1b}'), "colour codes in a file: {text}");
        let request = text
            .lines()
            .find(|line| line.contains("data request"))
            .unwrap_or_else(|| panic!("no data request logged: {text}"));
        if format == "json" {
            for line in text.lines() {
                let event: serde_json::Value = serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("not one JSON event per line ({e}): {line}"));
                assert!(
                    event["level"].is_string() && event["timestamp"].is_string(),
                    "{line}"
                );
            }
            let event: serde_json::Value = serde_json::from_str(request).unwrap();
            assert_eq!(event["route"], "chroma", "{event}");
            assert_eq!(event["status"], 502, "{event}");
            assert_eq!(event["error"], "upstream_unavailable", "{event}");
            assert!(
                event["request_id"].is_string() && event["micros"].is_u64(),
                "{event}"
            );
            assert!(
                event["subject_ref"].as_str().is_some_and(|r| r.len() == 16),
                "{event}"
            );
        } else {
            assert!(serde_json::from_str::<serde_json::Value>(request).is_err());
            assert!(
                request.contains("route=\"chroma\"") || request.contains("route=chroma"),
                "{request}"
            );
        }
    }
}

/// A purge that fails is logged at WARN while it retries and at ERROR once it gives up, so an
/// alert on the level finds a request that needs a person.
#[tokio::test]
async fn a_purge_that_gives_up_is_logged_as_an_error() {
    let dir = temp_dir();
    let shipped = std::fs::read_to_string(workspace().join("config/lethe.toml")).unwrap();
    let config = shipped
        .replace("max_attempts = 8 ", "max_attempts = 2 ")
        .replace("retry_backoff = \"1s\"", "retry_backoff = \"50ms\"")
        .replace("settle = \"1s\"", "settle = \"50ms\"");
    assert_ne!(config, shipped);
    std::fs::write(dir.join("lethe.toml"), config).unwrap();
    let log = dir.join("lethe.log");
    let file = std::fs::File::create(&log).unwrap();
    let state = fresh_sqlite_url();
    let server = Server::start_with(&dir, &state, |command| {
        command
            .env("LETHE_LOG", "info")
            .env("LETHE_CONFIG", dir.join("lethe.toml"))
            .stderr(file.try_clone().unwrap());
    })
    .await;
    let url = server.url("");
    let cli = |args: &[&str]| {
        run(lethe(&dir)
            .env("LETHE_CONFIG", dir.join("lethe.toml"))
            .args(args)
            .args(["--url", &url, "--state", &state, "--tenant", "acme"]))
    };
    let filed = cli(&[
        "erase",
        "--subject",
        "u9",
        "--ticket",
        "DSR-9",
        "--reason",
        "r",
    ]);
    assert!(filed.status.success(), "{}", stderr(&filed));
    let filed: serde_json::Value = serde_json::from_str(&stdout(&filed)).unwrap();
    let approved = cli(&["erase", "--approve", filed["id"].as_str().unwrap()]);
    assert!(approved.status.success(), "{}", stderr(&approved));
    // Every store of the shipped configuration is unreachable here: each job retries once,
    // then gives up.
    let events = |level: &str, message: &str| {
        let text = std::fs::read_to_string(&log).unwrap();
        text.lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|e| {
                e["level"] == level
                    && e["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with(message))
            })
            .count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while events("ERROR", "purge gave up") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            std::fs::read_to_string(&log).unwrap()
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(events("WARN", "purge attempt failed; retrying") >= 1);
    assert_eq!(events("INFO", "purge job finished"), 0, "no job finished");
}

/// The control and admin listeners bound their connections: a request head not sent in time
/// closes the connection, one address holds at most 256 of them, and they are counted.
#[tokio::test]
async fn the_control_and_admin_listeners_bound_their_connections() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = Server::start(&temp_dir(), &fresh_sqlite_url()).await;
    // Half a request head: closed once the head's deadline (30 s) passes, not held for ever.
    let mut halves = Vec::new();
    for address in [server.control, server.admin] {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        stream
            .write_all(b"GET /live HTTP/1.1\r\nhost: x\r\n")
            .await
            .unwrap();
        halves.push(stream);
    }
    // Each address's share: counted, and the 257th connection is told the listener is full.
    let mut held = Vec::new();
    for _ in 0..200 {
        held.push(tokio::net::TcpStream::connect(server.admin).await.unwrap());
    }
    let (_, metrics) = get(&format!("http://{}/metrics", server.admin)).await;
    let open = value(
        metrics.as_str().unwrap(),
        "lethe_open_connections{listener=\"admin\"}",
    );
    assert!(open.is_some_and(|n| n >= 201.0), "{metrics}");
    for _ in 0..55 {
        held.push(tokio::net::TcpStream::connect(server.admin).await.unwrap());
    }
    let mut refused = tokio::net::TcpStream::connect(server.admin).await.unwrap();
    let mut answer = String::new();
    refused.read_to_string(&mut answer).await.unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 503") && answer.contains("overloaded"),
        "{answer}"
    );
    drop(held);
    let started = std::time::Instant::now();
    for mut half in halves {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(45),
            half.read_to_end(&mut rest),
        )
        .await;
        assert!(read.is_ok(), "a half-sent head held past its deadline");
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(45));
}

/// Out of file descriptors, a listener neither spins nor floods the log: failed accepts are
/// retried after a pause and said at most once a second.
#[tokio::test]
async fn running_out_of_file_descriptors_neither_spins_nor_floods_the_log() {
    let dir = temp_dir();
    let log = dir.join("lethe.log");
    let file = std::fs::File::create(&log).unwrap();
    // A shell lowers the limits before it becomes `lethe serve` (which raises its soft limit to
    // the hard one, so both are lowered).
    let server = Server::start_with(&dir, &fresh_sqlite_url(), |command| {
        let program = command.get_program().to_owned();
        *command = std::process::Command::new("sh");
        command
            .current_dir(&dir)
            .env("LETHE_UPSTREAM_CHROMA", "http://127.0.0.1:9")
            .env("LETHE_LOG", "warn")
            .env_remove("LETHE_CONFIG")
            .stderr(file.try_clone().unwrap())
            .args(["-c", "ulimit -n 96 && exec \"$0\" \"$@\""])
            .arg(program);
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..150 {
        match tokio::net::TcpStream::connect(server.data).await {
            Ok(stream) => held.push(stream),
            Err(_) => break,
        }
    }
    let failures = || {
        let text = std::fs::read_to_string(&log).unwrap();
        text.lines().filter(|l| l.contains("accept failed")).count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while failures() == 0 {
        assert!(std::time::Instant::now() < deadline, "no accept failed");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The rate over three seconds once accepts fail: at most about one line a second (the
    // previous code wrote thousands).
    let first = failures();
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let said = failures() - first;
    assert!(said <= 5, "{said} more lines in 3 s");
    drop(held);
    // Descriptors back, it serves again.
    let (status, _) = get(&format!("http://{}/live", server.admin)).await;
    assert_eq!(status, StatusCode::OK);
}
