//! The admin listener (`[admin] listen`): `/live`, `/ready` and `/metrics` for the kubelet and
//! Prometheus, and nothing that reads or changes data, so it can be reached from outside the pod
//! without the console or the API.

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Map, Value, json};

use super::ControlState;

pub fn app(state: ControlState) -> Router {
    Router::new()
        .route("/live", get(live))
        .route("/ready", get(ready))
        .route("/metrics", get(super::ops::metrics))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found\n") })
        .with_state(state)
}

/// The process answers.
async fn live() -> Response {
    (StatusCode::OK, axum::Json(json!({ "status": "live" }))).into_response()
}

/// Ready to serve when the state store answers, every governed database took Lethe's rules and
/// the policy, and the change feed is alive (without it, a flip on another replica would reach
/// this one only when its cache ages out); the body says which check failed.
async fn ready(State(state): State<ControlState>) -> Response {
    let mut checks = Map::new();
    let store = state.store.ping().await.is_ok();
    checks.insert("state_store".into(), verdict(store, "unreachable"));
    let not_ready = state.governed.not_ready();
    for (database, _) in state.governed.pending() {
        let ok = !not_ready.contains(&database);
        checks.insert(
            format!("governed:{database}"),
            verdict(ok, "rules or policy not applied"),
        );
    }
    let feed = state.store.feed().is_healthy();
    checks.insert("change_feed".into(), verdict(feed, "down"));
    let ready = checks.values().all(|v| v == "ok");
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({ "status": if ready { "ready" } else { "not_ready" }, "checks": checks });
    (
        status,
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(body),
    )
        .into_response()
}

fn verdict(ok: bool, otherwise: &str) -> Value {
    Value::String(if ok { "ok" } else { otherwise }.to_owned())
}
