//! The `lethe` binary end to end: serve, CLI verbs, audit verification, replicas, overrides.

use std::time::Duration;

use hyper::{Method, StatusCode};
use lethe_tests::*;
use serde_json::json;

fn grant(subject: &str) -> serde_json::Value {
    json!({"subject": subject, "purpose": "personalization", "category": "preference",
           "actions": ["store", "retrieve"], "source": "e2e", "policy_version": 1})
}

/// A fresh folder, the built-in default config, the embedded SQLite store: the CLI verbs work
/// through the running server, and `lethe audit verify` names a tampered row.
#[tokio::test]
async fn a_fresh_start_serves_consent_and_a_verifiable_audit_log() {
    let dir = temp_dir();
    let state = fresh_sqlite_url();
    let server = Server::start(&dir, &state).await;
    let url = server.url("");

    let consent = |args: &[&str]| {
        run(lethe(&dir)
            .args(["consent"])
            .args(args)
            .args(["--url", &url, "--state", &state, "--tenant", "acme"]))
    };
    let granted = consent(&[
        "grant",
        "--subject",
        "u1",
        "--purpose",
        "personalization",
        "--category",
        "preference",
        "--actions",
        "store,retrieve",
        "--source",
        "e2e",
    ]);
    assert!(granted.status.success(), "{}", stderr(&granted));
    let grant: serde_json::Value = serde_json::from_str(&stdout(&granted)).unwrap();
    let id = grant["id"].as_str().unwrap().to_owned();
    assert_eq!(grant["status"], "active");

    let listed = consent(&["list", "--subject", "u1"]);
    let listed: serde_json::Value = serde_json::from_str(&stdout(&listed)).unwrap();
    assert_eq!(listed["items"][0]["id"], id.as_str());

    assert!(consent(&["revoke", &id]).status.success());
    let again = consent(&["revoke", &id]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        stderr(&again).contains("already_revoked"),
        "{}",
        stderr(&again)
    );

    // The server and the CLI agree on the generated development secret.
    let token = server.token("compliance", "acme");
    let (status, view) = call(
        Method::GET,
        &server.url("/v1/subjects/acme/u1"),
        &token,
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        (status, view["grants"][0]["status"].as_str()),
        (StatusCode::OK, Some("revoked")),
        "{view}"
    );

    let verify = || run(lethe(&dir).args(["audit", "verify", "--state", &state]));
    let ok = verify();
    assert!(ok.status.success(), "{}", stderr(&ok));
    assert!(stdout(&ok).contains("intact: 2 events"), "{}", stdout(&ok));

    execute_raw(
        &state,
        "UPDATE audit_events SET actor = 'someone-else' WHERE seq = 2",
    )
    .await
    .unwrap();
    let broken = verify();
    assert_eq!(broken.status.code(), Some(1));
    assert!(
        stderr(&broken).contains("broken at row 2"),
        "{}",
        stderr(&broken)
    );
}

/// Each kind of tampering with one row is reported with that row's number by the binary.
#[tokio::test]
async fn audit_verify_names_an_edited_deleted_or_reordered_row() {
    let cases = [
        (
            "UPDATE audit_events SET action = 'consent.nothing' WHERE seq = 3",
            3,
        ),
        ("DELETE FROM audit_events WHERE seq = 4", 4),
        (
            "UPDATE audit_events SET seq = -1 WHERE seq = 2; UPDATE audit_events SET seq = 2 WHERE seq = 3; UPDATE audit_events SET seq = 3 WHERE seq = -1",
            2,
        ),
    ];
    for (tamper, row) in cases {
        let dir = temp_dir();
        let state = fresh_sqlite_url();
        let server = Server::start(&dir, &state).await;
        let token = server.token("compliance", "acme");
        for i in 0..5 {
            let (status, _) = call(
                Method::POST,
                &server.url("/v1/consents"),
                &token,
                Some(&grant(&format!("u{i}"))),
            )
            .await
            .unwrap();
            assert_eq!(status, StatusCode::CREATED);
        }
        execute_raw(&state, tamper).await.unwrap();
        let output = run(lethe(&dir).args(["audit", "verify", "--state", &state]));
        assert_eq!(output.status.code(), Some(1), "{tamper}");
        assert!(
            stderr(&output).contains(&format!("broken at row {row}")),
            "{tamper}: {}",
            stderr(&output)
        );
    }
}

/// Whoever can write the state store cuts the last events off and moves the recorded heads back:
/// every remaining link is sound, but the chain no longer holds the heads signed earlier. Plain
/// `verify` catches it while the kept signed heads are there; once they are deleted too, a head
/// saved elsewhere (`lethe audit head`) still does, for the whole chain and for the tenant's.
#[tokio::test]
async fn a_cut_and_re_headed_audit_log_fails_against_its_signed_heads() {
    for delete_kept_heads in [false, true] {
        let dir = temp_dir();
        let state = fresh_sqlite_url();
        let server = Server::start(&dir, &state).await;
        let token = server.token("compliance", "acme");
        let grants = |range: std::ops::Range<usize>| {
            let (token, url) = (token.clone(), server.url("/v1/consents"));
            async move {
                for i in range {
                    let (status, _) =
                        call(Method::POST, &url, &token, Some(&grant(&format!("u{i}"))))
                            .await
                            .unwrap();
                    assert_eq!(status, StatusCode::CREATED);
                }
            }
        };
        grants(0..5).await;
        let saved = |args: &[&str], name: &str| {
            let printed = run(lethe(&dir)
                .args(["audit", "head", "--state", &state])
                .args(args));
            assert!(printed.status.success(), "{}", stderr(&printed));
            let head: serde_json::Value = serde_json::from_str(&stdout(&printed)).unwrap();
            let path = dir.join(name);
            std::fs::write(&path, stdout(&printed)).unwrap();
            (head, path)
        };
        let (whole, whole_file) = saved(&[], "head.json");
        let (acme, acme_file) = saved(&["--tenant", "acme"], "acme-head.json");
        assert_eq!(
            (whole["seq"].as_i64(), acme["seq"].as_i64()),
            (Some(5), Some(5))
        );
        assert_eq!(whole["signature"]["algorithm"], "Ed25519");
        grants(5..8).await;
        let verify = |args: &[&str]| {
            run(lethe(&dir)
                .args(["audit", "verify", "--state", &state])
                .args(args))
        };
        for args in [
            vec![],
            vec!["--head", whole_file.to_str().unwrap()],
            vec!["--tenant", "acme", "--head", acme_file.to_str().unwrap()],
        ] {
            let ok = verify(&args);
            assert!(ok.status.success(), "{args:?}: {}", stderr(&ok));
        }
        // A head of the tenant's chain is not one of the whole chain's.
        let wrong = verify(&["--head", acme_file.to_str().unwrap()]);
        assert_eq!(wrong.status.code(), Some(1), "{}", stdout(&wrong));

        // Rows 4 to 8 cut off, the heads moved back to row 3.
        let mut tamper = String::from(
            "DELETE FROM audit_events WHERE seq > 3;
             UPDATE audit_chain SET seq = 3, hash = (SELECT hash FROM audit_events WHERE seq = 3);
             UPDATE audit_tenant_heads SET seq = 3, hash = (SELECT tenant_hash FROM audit_events WHERE seq = 3);",
        );
        if delete_kept_heads {
            tamper.push_str("DELETE FROM audit_signed_heads;");
        }
        execute_raw(&state, &tamper).await.unwrap();
        let plain = verify(&[]);
        if delete_kept_heads {
            assert!(
                plain.status.success(),
                "nothing left in the store to tell: {}",
                stderr(&plain)
            );
        } else {
            assert_eq!(plain.status.code(), Some(1), "{}", stdout(&plain));
            assert!(stderr(&plain).contains("cut off"), "{}", stderr(&plain));
        }
        for args in [
            vec!["--head", whole_file.to_str().unwrap()],
            vec!["--tenant", "acme", "--head", acme_file.to_str().unwrap()],
        ] {
            let cut = verify(&args);
            assert_eq!(cut.status.code(), Some(1), "{args:?}: {}", stdout(&cut));
            assert!(
                stderr(&cut).contains("broken at row 4")
                    && stderr(&cut).contains("signed head names row 5"),
                "{args:?}: {}",
                stderr(&cut)
            );
        }
        // A head whose signature does not verify is refused as such.
        let forged = std::fs::read_to_string(&whole_file)
            .unwrap()
            .replace(whole["hash"].as_str().unwrap(), &"0".repeat(64));
        std::fs::write(&whole_file, forged).unwrap();
        let refused = verify(&["--head", whole_file.to_str().unwrap()]);
        assert_eq!(refused.status.code(), Some(1));
        assert!(
            stderr(&refused).contains("signature"),
            "{}",
            stderr(&refused)
        );
    }
}

/// A chain marked unkeyed (as whoever can write the state store could mark it, to have a forged
/// history sealed with the key) is never sealed on its own: verify fails, the server takes no
/// change and will not start on it, and `lethe audit key-chain` refuses what does not verify as
/// plainly written.
#[tokio::test]
async fn a_chain_marked_unkeyed_is_neither_served_nor_sealed_again() {
    let dir = temp_dir();
    let state = fresh_sqlite_url();
    let server = Server::start(&dir, &state).await;
    let token = server.token("compliance", "acme");
    let (status, _) = call(
        Method::POST,
        &server.url("/v1/consents"),
        &token,
        Some(&grant("u1")),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::CREATED);
    execute_raw(&state, "UPDATE audit_chain SET chain_version = 1")
        .await
        .unwrap();
    let verify = run(lethe(&dir).args(["audit", "verify", "--state", &state]));
    assert_eq!(verify.status.code(), Some(1));
    assert!(stderr(&verify).contains("not keyed"), "{}", stderr(&verify));
    let (status, body) = call(
        Method::POST,
        &server.url("/v1/consents"),
        &token,
        Some(&grant("u2")),
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let mut second = lethe(&dir)
        .args(["serve", "--state", &state])
        .env("LETHE_CONTROL_LISTEN", format!("127.0.0.1:{}", free_port()))
        .env("LETHE_DATA_LISTEN", format!("127.0.0.1:{}", free_port()))
        .env("LETHE_ADMIN_LISTEN", format!("127.0.0.1:{}", free_port()))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(code) = second.try_wait().unwrap() {
            break code.code();
        }
        if std::time::Instant::now() > deadline {
            second.kill().unwrap();
            panic!("lethe serve started on an unkeyed chain");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(code, Some(2));
    let keyed = run(lethe(&dir).args(["audit", "key-chain", "--state", &state]));
    assert_eq!(keyed.status.code(), Some(2), "{}", stdout(&keyed));
    assert!(
        stderr(&keyed).contains("broken at row 1"),
        "{}",
        stderr(&keyed)
    );
}

/// Two replicas on one PostgreSQL database: concurrent changes through both form one chain, and
/// the generated development key is shared.
#[tokio::test]
async fn replicas_on_postgres_share_keys_and_one_audit_chain() {
    let state = fresh_postgres_database().await.unwrap();
    let (dir_a, dir_b) = (temp_dir(), temp_dir());
    let (a, b) = tokio::join!(Server::start(&dir_a, &state), Server::start(&dir_b, &state));
    let token = a.token("compliance", "acme");
    let mut writes = Vec::new();
    for i in 0..40 {
        let url = if i % 2 == 0 {
            a.url("/v1/consents")
        } else {
            b.url("/v1/consents")
        };
        let token = token.clone();
        writes.push(tokio::spawn(async move {
            call(Method::POST, &url, &token, Some(&grant(&format!("u{i}")))).await
        }));
    }
    for w in writes {
        let (status, body) = w.await.unwrap().unwrap();
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let (_, report) = call(Method::GET, &b.url("/v1/audit/verify"), &token, None)
        .await
        .unwrap();
    assert_eq!(
        (report["ok"].as_bool(), report["head"]["seq"].as_i64()),
        (Some(true), Some(40)),
        "{report}"
    );
    let output = run(lethe(&a.dir).args(["audit", "verify", "--state", &state]));
    assert!(output.status.success(), "{}", stderr(&output));
}

/// The environment variables of DESIGN.md's interface work like the flags.
#[tokio::test]
async fn environment_overrides_choose_listeners_and_state() {
    let dir = temp_dir();
    let port = free_port();
    let state_path = dir.join("elsewhere/state.db");
    let mut child = lethe(&dir)
        .arg("serve")
        .env("LETHE_CONTROL_LISTEN", format!("127.0.0.1:{port}"))
        .env("LETHE_DATA_LISTEN", format!("127.0.0.1:{}", free_port()))
        .env("LETHE_ADMIN_LISTEN", format!("127.0.0.1:{}", free_port()))
        .env(
            "LETHE_STATE_URL",
            format!("sqlite://{}", state_path.display()),
        )
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let ready = loop {
        if let Ok((status, body)) = call(
            Method::GET,
            &format!("http://127.0.0.1:{port}/readyz"),
            "",
            None,
        )
        .await
            && status.is_success()
        {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not ready on the port LETHE_CONTROL_LISTEN named"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(ready["state_store"], "sqlite");
    assert!(
        state_path.exists(),
        "the state store is where LETHE_STATE_URL put it"
    );
}

#[test]
fn check_config_accepts_every_example_and_reports_every_problem() {
    let dir = temp_dir();
    let examples: Vec<_> = std::fs::read_dir(workspace().join("config"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    assert!(examples.len() >= 2);
    let output = run(lethe(&dir).arg("check-config").args(&examples));
    assert!(
        output.status.success(),
        "{}{}",
        stdout(&output),
        stderr(&output)
    );

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[data_plane]\nmax_body_bytes = 0\nspeed = 3\n[state]\nurl = 'mysql://x'\n[[routes]]\nname='A'\nprefix='a'\nupstream='x'\nadapter='chroma'\n").unwrap();
    let output = run(lethe(&dir).arg("check-config").arg(&bad));
    assert_eq!(output.status.code(), Some(1));
    let problems = stdout(&output)
        .lines()
        .filter(|l| l.trim_start().starts_with("- "))
        .count();
    assert!(problems >= 2, "{}", stdout(&output));
}

/// `lethe erase`, `lethe erase --approve` and `lethe status` carry a request to the flip.
#[tokio::test]
async fn the_cli_files_approves_and_follows_an_erasure() {
    let dir = temp_dir();
    let state = fresh_sqlite_url();
    let server = Server::start(&dir, &state).await;
    let url = server.url("");
    let cli = |args: &[&str]| {
        run(lethe(&dir)
            .args(args)
            .args(["--url", &url, "--state", &state, "--tenant", "acme"]))
    };
    let filed = cli(&[
        "erase",
        "--subject",
        "u9",
        "--alias",
        "u9-old",
        "--ticket",
        "DSR-9",
        "--reason",
        "closure",
    ]);
    assert!(filed.status.success(), "{}", stderr(&filed));
    let filed: serde_json::Value = serde_json::from_str(&stdout(&filed)).unwrap();
    let id = filed["id"].as_str().unwrap();
    assert_eq!(filed["state"], "requested");
    let approved = cli(&["erase", "--approve", id]);
    assert!(approved.status.success(), "{}", stderr(&approved));
    let status = cli(&["status", id]);
    let status: serde_json::Value = serde_json::from_str(&stdout(&status)).unwrap();
    // Flipped; the purge worker may already be at it (there is no Chroma here, so it retries).
    let state = status["state"].as_str().unwrap();
    assert!(
        ["suppressed", "propagating", "retrying"].contains(&state),
        "{status}"
    );
    assert_eq!(status["aliases"], json!(["u9-old"]));
    assert!(status["suppressed_at"].is_string());
    assert!(status["online_latency_ms"].as_i64().is_some());
    let missing = cli(&["erase", "--subject", "u9"]);
    assert_eq!(
        missing.status.code(),
        Some(2),
        "ticket and reason are required"
    );
}

/// On PostgreSQL only `lethe migrate` changes the schema: `serve` and every verb refuse a schema
/// behind theirs and say what to run; `migrate` says nothing of what it skips.
#[tokio::test]
async fn only_lethe_migrate_changes_a_shared_schema() {
    let state = fresh_postgres_database().await.unwrap();
    let dir = temp_dir();
    for args in [
        vec!["serve", "--state", &state],
        vec![
            "token", "--role", "admin", "--tenant", "acme", "--state", &state,
        ],
        vec!["audit", "verify", "--state", &state],
    ] {
        let refused = run(lethe(&dir)
            .args(&args)
            .env("LETHE_CONTROL_LISTEN", format!("127.0.0.1:{}", free_port()))
            .env("LETHE_DATA_LISTEN", format!("127.0.0.1:{}", free_port()))
            .env("LETHE_ADMIN_LISTEN", format!("127.0.0.1:{}", free_port())));
        assert_eq!(refused.status.code(), Some(2), "{args:?}");
        assert!(
            stderr(&refused).contains("schema is at version 0")
                && stderr(&refused).contains("run `lethe migrate`"),
            "{args:?}: {}",
            stderr(&refused)
        );
    }
    let untouched = execute_raw(&state, "SELECT 1 FROM lethe_migrations").await;
    assert!(untouched.is_err(), "nothing but migrate creates the schema");
    for round in 0..2 {
        let migrated = run(lethe(&dir)
            .args(["migrate", "--state", &state])
            .env("LETHE_LOG", "info"));
        assert!(migrated.status.success(), "{}", stderr(&migrated));
        assert!(
            !stderr(&migrated).contains("already exists"),
            "round {round}: {}",
            stderr(&migrated)
        );
    }
    let token = run(lethe(&dir).args([
        "token", "--role", "admin", "--tenant", "acme", "--state", &state,
    ]));
    assert!(token.status.success(), "{}", stderr(&token));
}
