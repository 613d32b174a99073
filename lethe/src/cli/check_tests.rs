//! The whole check of a configuration (its own shape and meaning, each store's settings, the
//! erasure targets), as `lethe check-config` and `lethe serve` run it.

use std::path::Path;

use lethe_data::config::*;

use super::check;

#[test]
fn the_built_in_default_is_the_documented_one() {
    let config = check(BUILT_IN).unwrap();
    assert_eq!(config.data_plane, DataPlaneConfig::default());
    assert_eq!(config.control_plane, ControlPlaneConfig::default());
    assert_eq!(config.state, StateConfig::default());
    assert_eq!(config.auth, AuthConfig::default());
    let routes: Vec<_> = config
        .routes
        .iter()
        .map(|r| {
            (
                r.name.as_str(),
                r.prefix.as_deref().unwrap_or(""),
                r.upstream.as_str(),
            )
        })
        .collect();
    assert_eq!(
        routes,
        [
            ("chroma", "/chroma", "http://127.0.0.1:8000"),
            ("langgraph", "/langgraph", "http://127.0.0.1:2024"),
            ("qdrant", "/qdrant", "http://127.0.0.1:6333")
        ]
    );
}

#[test]
fn every_example_config_is_valid() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            if let Err(e) = check(&text) {
                panic!("{}:\n{e}", path.display());
            }
            checked += 1;
        }
    }
    assert!(checked >= 2, "found only {checked} example configs");
}

#[test]
fn an_empty_file_means_all_defaults() {
    let config = check("").unwrap();
    assert_eq!(config.data_plane.listen.to_string(), "127.0.0.1:7400");
    assert!(config.routes.is_empty());
}

#[test]
fn shape_problems_are_all_reported_at_once() {
    let text = r#"
        [data_plane]
        listen = "127.0.0.1:7400"
        max_body_byte = 10

        [state]
        url = 5

        [colour]
        hue = "red"

        [[routes]]
        name = "chroma"
        prefix = "/chroma"
        upstream = "http://127.0.0.1:8000"
        adapter = "mongo"

        [[routes]]
        name = "ok"
        prefix = "/ok"
        upstream = "http://127.0.0.1:1"
        adapter = "chroma"
        extra = true
    "#;
    let problems = check(text).unwrap_err().problems;
    assert_eq!(problems.len(), 5, "{problems:#?}");
    let with_meaning = format!("{text}\n[control_plane]\nmax_body_bytes = 0\n");
    let problems = check(&with_meaning).unwrap_err().problems;
    assert_eq!(
        problems.len(),
        6,
        "problems of meaning are reported beside those of shape: {problems:#?}"
    );
    let joined = problems.join("\n");
    for needle in ["max_body_byte", "[state]", "colour", "mongo", "extra"] {
        assert!(
            joined.contains(needle),
            "no problem mentions {needle}:\n{joined}"
        );
    }
}

#[test]
fn meaning_problems_are_all_reported_at_once() {
    let text = r#"
        [data_plane]
        listen = "127.0.0.1:7000"
        max_body_bytes = 0
        [control_plane]
        listen = "127.0.0.1:7000"
        session_idle = "30s"
        session_max = "2000h"
        [state]
        url = "mysql://x"
        [auth]
        hs256_secret = { value = "dev" }
        jwks = "/etc/jwks.json"
        [[routes]]
        name = "Chroma!"
        prefix = "chroma/"
        upstream = "ftp://x"
        adapter = "chroma"
        credential = { header = "bad header", value = { env = "X" } }
        [[routes]]
        name = "Chroma!"
        prefix = "chroma/"
        upstream = "http://127.0.0.1:8000"
        adapter = "chroma"
        [[routes]]
        name = "vectors"
        prefix = "/vectors"
        upstream = "http://127.0.0.1:8000"
        adapter = "chroma"
        namespace = ["{subject}"]
        [[routes]]
        name = "graph"
        prefix = "/graph"
        upstream = "http://127.0.0.1:2024"
        adapter = "langgraph"
        retention_window = "30d"
        chroma_tenants = ["default_tenant"]
        [[routes]]
        name = "graph2"
        prefix = "/graph2"
        upstream = "http://127.0.0.1:2024"
        adapter = "langgraph"
        namespace = ["memories", "{tenant}"]
        [erasure]
        probes = ["{tenant}"]
        probe_min_similarity = 101
    "#;
    let problems = check(text).unwrap_err().problems;
    let joined = problems.join("\n");
    for needle in [
        "both 127.0.0.1:7000",
        "max_body_bytes",
        "mysql",
        "hs256_secret",
        "lowercase",
        "prefix must",
        "ftp://x",
        "bad header",
        "already has this name",
        "already has prefix",
        "[[routes]] #3 (vectors): unknown field `namespace`, expected `chroma_tenants`",
        "[[routes]] #5 (graph2): namespace must name {tenant} and {subject} exactly once each",
        "every probe must contain {subject}",
        "probe_min_similarity",
        "control_plane.session_idle: at least 1m",
        "control_plane.session_max: session_idle to 30 days",
        "[[routes]] #4 (graph): unknown field `retention_window`, expected `namespace`",
        "[[routes]] #4 (graph): unknown field `chroma_tenants`, expected `namespace`",
    ] {
        assert!(
            joined.contains(needle),
            "no problem mentions {needle:?}:\n{joined}"
        );
    }
}

#[test]
fn what_cannot_work_is_refused_up_front() {
    let text = r#"
        [state]
        url = "sqlite:relative.db"
        [[routes]]
        name = "vectors"
        prefix = "/qdrant"
        upstream = "http://127.0.0.1:6333"
        adapter = "weaviate"
        [[routes]]
        name = "mem0"
        prefix = "/mem0"
        upstream = "http://127.0.0.1:6333"
        adapter = "qdrant"
        purpose = "a/b"
        subject_field = "lethe_subject"
        [[erasure.redis]]
        name = "cache"
        urls = ["rediss://cache.internal:port"]
        patterns = ["{tenant}:{subject}:*"]
    "#;
    let joined = check(text).unwrap_err().problems.join("\n");
    for needle in [
        "state.url: \"sqlite:relative.db\"",
        "[[routes]] #1 (vectors): adapter \"weaviate\": no such store (known: azure_search, chroma, langgraph, openai, otlp, qdrant, redis)",
        "[[erasure.redis]] #1 (cache): urls: rediss://cache.internal:port: the port is not a number",
        "[[routes]] #2 (mem0): purpose: must be 1 to 200 bytes without control characters or '/'",
        "[[routes]] #2 (mem0): subject_field \"lethe_subject\": name a payload key of the app's own",
    ] {
        assert!(
            joined.contains(needle),
            "no problem mentions {needle:?}:\n{joined}"
        );
    }
}

#[test]
fn syntax_errors_are_reported() {
    let problems = check("[data_plane\nlisten=").unwrap_err().problems;
    assert_eq!(problems.len(), 1);
}

#[test]
fn erasure_targets_follow_routes_and_configured_stores() {
    let config = check(
        r#"
        [erasure]
        approvals_required = 2
        [[erasure.postgres]]
        name = "app"
        url = { env = "APP_DATABASE_URL" }
        count = "SELECT 0"
        delete = ["DELETE FROM memories WHERE tenant = $1 AND user_id = $2"]
        [[erasure.redis]]
        name = "sessions"
        urls = ["redis://127.0.0.1:6379"]
        patterns = ["{tenant}:{subject}:*"]
        [[erasure.sqlite]]
        name = "mem0"
        path = "/data/history.db"
        table = "history"
        id_column = "memory_id"
        lineage_store = "chroma"
        [[erasure.backups]]
        target = "postgres:app"
        retention = "35d"
        [[routes]]
        name = "chroma"
        prefix = "/chroma"
        upstream = "http://127.0.0.1:8000"
        adapter = "chroma"
        "#,
    )
    .unwrap();
    assert_eq!(
        config.erasure_targets(),
        [
            "chroma:chroma",
            "postgres:app",
            "redis:sessions",
            "sqlite:mem0"
        ]
    );

    let problems = check(
        r#"
        [erasure]
        approvals_required = 3
        max_attempts = 0
        [[erasure.postgres]]
        name = "app"
        url = { value = "postgres://x" }
        count = " "
        delete = []
        [[erasure.redis]]
        name = "sessions"
        urls = ["http://x"]
        patterns = ["{tenant}:*"]
        [[erasure.sqlite]]
        name = "mem0"
        path = "/data/history.db"
        table = "history"
        id_column = "memory_id"
        lineage_store = "vectors"
        [[erasure.backups]]
        target = "redis:nowhere"
        retention = "35d"
        [[erasure.memcached]]
        name = "hot"
        "#,
    )
    .unwrap_err()
    .problems;
    let joined = problems.join("\n");
    for needle in [
        "approvals_required",
        "max_attempts",
        "count statement",
        "redis:nowhere",
        "http://x is not a redis:// or rediss:// URL",
        "{subject}",
        "\"vectors\" is not a route",
        "[[erasure.memcached]] #1 (hot): no store only erasure reaches is called \"memcached\" (known: postgres, redis, sqlite)",
    ] {
        assert!(
            joined.contains(needle),
            "no problem mentions {needle}: {joined}"
        );
    }
}

#[test]
fn governed_databases_are_checked_with_every_problem_at_once() {
    let text = r#"
[[postgres]]
name = "app"
url = { value = "postgres://localhost/app" }
app_role = "Lethe-App"
tenant_roles = { acme = "pg_acme" }

[[postgres.tables]]
table = "lethe.memories"
tenant = "tenant_id; DROP TABLE x"
subject = "user_id -- who"
purpose = "'personalization'"
category = "category"

[[postgres.tables]]
table = "lethe.memories"
tenant = "tenant_id"
subject = "user_id"
purpose = "$1"
category = "category"
"#;
    let problems = check(text).unwrap_err().problems;
    let count = |needle: &str| problems.iter().filter(|p| p.contains(needle)).count();
    assert_eq!(count("role \"Lethe-App\""), 1, "{problems:?}");
    assert_eq!(count("role \"pg_acme\""), 1, "{problems:?}");
    assert_eq!(count("not in schema lethe"), 2, "{problems:?}");
    assert_eq!(count("named twice"), 1, "{problems:?}");
    assert_eq!(count("one SQL expression over the row"), 3, "{problems:?}");
    let good = r#"
[[postgres]]
name = "app"
url = { value = "postgres://localhost/app" }
app_role = "lethe_app"

[[postgres.tables]]
table = "memories"
tenant = "tenant_id"
subject = "metadata->>'user_id'"
purpose = "'personalization'"
category = "category"
"#;
    let config = check(good).unwrap();
    assert_eq!(config.postgres[0].tables[0].subject, "metadata->>'user_id'");
}

#[test]
fn the_statutory_deadline_is_one_to_three_months() {
    for (months, ok) in [(0, false), (1, true), (3, true), (4, false)] {
        let text = format!("[erasure]\ndeadline_months = {months}\n");
        assert_eq!(check(&text).is_ok(), ok, "{months}");
    }
}

#[test]
fn routes_to_one_store_agree_on_whether_tenants_share_its_collections() {
    let routes = |other: &str, isolation: &str| {
        format!(
            r#"
            [[routes]]
            name = "shared"
            prefix = "/qdrant"
            upstream = "http://127.0.0.1:6333"
            adapter = "qdrant"
            [[routes]]
            name = "own"
            prefix = "/mine"
            upstream = "{other}"
            adapter = "qdrant"
            isolation = "{isolation}"
            "#
        )
    };
    assert!(check(&routes("http://127.0.0.1:6333", "shared")).is_ok());
    // One store however its address is spelled.
    for same in [
        "http://127.0.0.1:6333",
        "HTTP://LOCALHOST:6333/",
        "http://[::1]:6333",
        "http://127.0.0.2:6333",
    ] {
        let joined = check(&routes(same, "collection_per_tenant"))
            .unwrap_err()
            .problems
            .join("\n");
        assert!(
            joined.contains(
                "[[routes]] #2 (own): route shared has the same upstream and another isolation"
            ),
            "{same}: {joined}"
        );
    }
    assert!(check(&routes("http://127.0.0.1:6334", "collection_per_tenant")).is_ok());
    assert!(
        check(&routes("http://127.0.0.1:6333", "per_tenant")).is_err(),
        "an unknown isolation"
    );
}

#[test]
fn a_misspelled_erasure_key_is_refused_not_taken_for_a_store() {
    for text in [
        "[erasure]\napproval_required = 2\n",
        "[erasure]\nprobe = [\"{subject}\"]\n",
        "[erasure]\nsweep = []\n",
    ] {
        let joined = check(text).unwrap_err().problems.join("\n");
        assert!(
            joined.contains("[erasure]: unknown field"),
            "{text}: {joined}"
        );
    }
}

#[test]
fn a_route_is_reached_the_way_its_store_speaks() {
    let text = r#"
        [data_plane]
        listen = "127.0.0.1:7400"
        [[routes]]
        name = "both"
        prefix = "/both"
        listen = "127.0.0.1:7600"
        upstream = "http://127.0.0.1:8000"
        adapter = "chroma"
        [[routes]]
        name = "neither"
        upstream = "http://127.0.0.1:8001"
        adapter = "chroma"
        [[routes]]
        name = "own"
        listen = "127.0.0.1:7600"
        upstream = "http://127.0.0.1:8002"
        adapter = "qdrant"
        [[routes]]
        name = "taken"
        listen = "127.0.0.1:7400"
        upstream = "http://127.0.0.1:8003"
        adapter = "langgraph"
        [[routes]]
        name = "cache"
        prefix = "/cache"
        upstream = "redis://127.0.0.1:6379"
        adapter = "chroma"
        [[routes]]
        name = "sessions"
        listen = "127.0.0.1:7601"
        upstream = "rediss://:secret@127.0.0.1:6379/x"
        adapter = "redis"
        keys = [{ pattern = "{tenant}:{subject}:*", purpose = "support", category = "conversation" }]
    "#;
    let joined = check(text).unwrap_err().problems.join("\n");
    for needle in [
        "[[routes]] #1 (both): prefix (HTTP on the data plane) or listen (a listener of its own), not both",
        "[[routes]] #2 (neither): prefix or listen: say where clients reach the route",
        "[[routes]] #3 (own): another route already listens on 127.0.0.1:7600",
        "[[routes]] #3 (own): qdrant is reached by prefix, not listen",
        "[[routes]] #3 (own): prefix: missing; qdrant is reached by it",
        "route taken: listen 127.0.0.1:7400 is data_plane.listen too",
        "[[routes]] #5 (cache): upstream \"redis://127.0.0.1:6379\": chroma speaks http, https",
        "[[routes]] #6 (sessions): upstream: rediss://127.0.0.1:6379/x: the database \"x\" is not a number",
    ] {
        assert!(
            joined.contains(needle),
            "no problem mentions {needle:?}:\n{joined}"
        );
    }
}
