use std::time::Duration;

use super::*;

#[test]
fn overrides_win_over_the_file() {
    let mut config = Config::check(BUILT_IN).unwrap();
    let overrides = Overrides {
        data_listen: Some("127.0.0.1:9400".parse().unwrap()),
        control_listen: Some("127.0.0.1:9401".parse().unwrap()),
        admin_listen: Some("127.0.0.1:9402".parse().unwrap()),
        state_url: Some("postgres://localhost/lethe".into()),
    };
    config.apply(&overrides, |name| {
        (name == "LETHE_UPSTREAM_CHROMA").then(|| "http://127.0.0.1:18000".to_owned())
    });
    assert_eq!(config.data_plane.listen.port(), 9400);
    assert_eq!(config.control_plane.listen.port(), 9401);
    assert_eq!(config.admin.listen.port(), 9402);
    assert_eq!(config.state.url, "postgres://localhost/lethe");
    assert_eq!(config.routes[0].upstream, "http://127.0.0.1:18000");
    assert_eq!(
        config.routes[1].upstream, "http://127.0.0.1:2024",
        "other routes keep theirs"
    );
    assert_eq!(upstream_env_var("langgraph"), "LETHE_UPSTREAM_LANGGRAPH");
}

#[test]
fn durations() {
    let cases = [
        ("500ms", Ok(Duration::from_millis(500))),
        ("30s", Ok(Duration::from_secs(30))),
        ("5m", Ok(Duration::from_secs(300))),
        ("1h", Ok(Duration::from_secs(3600))),
    ];
    for (text, expected) in cases {
        assert_eq!(parse_duration(text), expected, "{text}");
    }
    for bad in ["0s", "30", "s", "1.5s", "-1s", "10d", ""] {
        assert!(parse_duration(bad).is_err(), "{bad} should be refused");
    }
}

#[test]
fn secrets_come_from_values_files_and_the_environment_and_never_print() {
    let dir = std::env::temp_dir().join(format!("lethe-secret-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("key");
    std::fs::write(&file, "s3cret\n").unwrap();
    assert_eq!(Secret::File(file).resolve().unwrap(), b"s3cret");
    assert_eq!(Secret::Value("v".into()).resolve().unwrap(), b"v");
    assert!(
        Secret::Env("LETHE_TEST_SURELY_UNSET_VARIABLE".into())
            .resolve()
            .unwrap_err()
            .contains("not set")
    );
    assert!(Secret::File(dir.join("missing")).resolve().is_err());
    assert!(!format!("{:?}", Secret::Value("hunter2".into())).contains("hunter2"));
}

#[test]
fn oidc_sign_in_problems_are_all_reported_and_token_sign_in_follows_it() {
    let text = r#"
        [control_plane]
        allow_token_sign_in = false
        "#;
    let problems = Config::check(text).unwrap_err().problems.join("\n");
    assert!(problems.contains("allow_token_sign_in"), "{problems}");
    let text = r#"
        [control_plane.oidc]
        issuer = "http://idp.example"
        client_id = ""
        client_secret = { value = "s" }
        redirect_url = "https://lethe.example/console/elsewhere"
        scopes = ["profile", "two words"]
        [[control_plane.oidc.roles]]
        group = "g"
        role = "agent"
        tenant = "acme"
        "#;
    let problems = Config::check(text).unwrap_err().problems.join("\n");
    for expected in [
        "oidc.issuer",
        "oidc.redirect_url",
        "oidc.client_id",
        "must include openid",
        "without spaces",
        "roles[0].role",
    ] {
        assert!(
            problems.contains(expected),
            "{expected} not in:\n{problems}"
        );
    }
    let good = r#"
        [control_plane.oidc]
        issuer = "https://idp.example"
        client_id = "lethe"
        client_secret = { env = "LETHE_OIDC_CLIENT_SECRET" }
        redirect_url = "https://lethe.example/console/oidc/callback"
        [[control_plane.oidc.roles]]
        group = "dpo"
        role = "compliance"
        tenant = "acme"
        "#;
    let config = Config::check(good).unwrap();
    assert!(
        !config.control_plane.token_sign_in(),
        "off by default with a provider"
    );
    assert!(Config::check("").unwrap().control_plane.token_sign_in());
    let both = good.replace(
        "[control_plane.oidc]",
        "[control_plane]\nallow_token_sign_in = true\n[control_plane.oidc]",
    );
    assert!(Config::check(&both).unwrap().control_plane.token_sign_in());
}

#[test]
fn access_token_problems_are_all_reported() {
    let console = r#"
        [control_plane.oidc]
        issuer = "https://idp.example"
        client_id = "lethe-console"
        client_secret = { value = "s" }
        redirect_url = "https://lethe.example/console/oidc/callback"
        [[control_plane.oidc.roles]]
        group = "dpo"
        role = "compliance"
        tenant = "acme"
        "#;
    let text = format!(
        r#"{console}
        [auth]
        leeway_seconds = 3600
        [auth.oidc]
        issuer = "http://idp.example/?x"
        audience = "lethe-console"
        tenant_claim = "tid"
        data_plane = true
        cli_client_id = " "
        cli_scopes = ["profile"]
        "#
    );
    let problems = Config::check(&text).unwrap_err().problems.join("\n");
    for expected in [
        "auth.leeway_seconds",
        "auth.oidc.issuer",
        "tenant_claim and role_claim go together",
        "auth.oidc.data_plane",
        "auth.oidc.cli_client_id",
        "auth.oidc.cli_scopes",
        "needs [control_plane.oidc] with the same issuer",
    ] {
        assert!(
            problems.contains(expected),
            "{expected} not in:\n{problems}"
        );
    }
    // The console's own client as the audience: its ID tokens would pass as access tokens.
    let text = format!(
        "{console}\n[auth.oidc]\nissuer = \"https://idp.example\"\naudience = \"lethe-console\"\n"
    );
    let problems = Config::check(&text).unwrap_err().problems.join("\n");
    assert!(problems.contains("auth.oidc.audience"), "{problems}");
    let text = format!(
        "{console}\n[auth.oidc]\nissuer = \"https://idp.example\"\naudience = \"lethe-cli\"\ncli_client_id = \"lethe-cli\"\n"
    );
    let problems = Config::check(&text).unwrap_err().problems.join("\n");
    assert!(problems.contains("auth.oidc.audience"), "{problems}");
    let good = format!(
        "{console}\n[auth.oidc]\nissuer = \"https://idp.example\"\naudience = \"api://lethe\"\ncli_client_id = \"lethe-cli\"\n"
    );
    let config = Config::check(&good).unwrap();
    let access = config.auth.oidc.unwrap();
    assert_eq!(
        access.cli_scopes,
        ["openid", "profile", "email", "offline_access"]
    );
    assert!(!access.data_plane);
    // App roles need no console: service accounts on the data plane.
    let agents = "[auth.oidc]\nissuer = \"https://idp.example\"\naudience = \"api://lethe\"\ntenant_claim = \"tid\"\nrole_claim = \"roles\"\ndata_plane = true\n";
    assert!(Config::check(agents).is_ok());
}
