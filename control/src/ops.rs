//! Health, readiness, metrics and the OpenAPI document.

use crate::error_shape::Code;
use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use serde_json::json;

use super::ControlState;
use super::error::ApiError;

/// The OpenAPI document of the control plane, kept in the repository beside the code.
pub const OPENAPI: &str = include_str!("../openapi.json");

/// The document as served: [`OPENAPI`] with the consent actions of the policy crate, the one
/// list of them.
pub(crate) static SERVED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let mut doc: serde_json::Value =
        serde_json::from_str(OPENAPI).expect("openapi.json is JSON (checked by tests)");
    doc["components"]["schemas"]["Action"]["enum"] = json!(
        lethe_policy::Action::ALL
            .iter()
            .map(|a| a.as_str())
            .collect::<Vec<_>>()
    );
    doc.to_string()
});

pub async fn healthz() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// Ready when the state store answers.
pub async fn readyz(
    State(state): State<ControlState>,
) -> Result<Json<serde_json::Value>, ApiError> {
    state.store.ping().await.map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Code::StateUnavailable,
            "the state store is unavailable",
        )
    })?;
    Ok(Json(
        json!({ "status": "ready", "state_store": state.store.backend() }),
    ))
}

pub async fn metrics(State(state): State<ControlState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render_metrics(&state).await,
    )
}

/// Every metric of the process: the control plane's requests, the governed databases, the data
/// plane's, and where erasure requests and purge jobs stand (read from the state store at each
/// scrape; `lethe_state_store_up` says whether it could be).
pub async fn render_metrics(state: &ControlState) -> String {
    let mut out = state.metrics.render();
    out.push_str(&governed_metrics(&state.governed));
    if let Some(data) = &state.data {
        data.render_metrics(&mut out);
    }
    let overview = state.store.erasure_overview(crate::now()).await;
    out.push_str(&erasure_metrics(overview.as_ref().ok()));
    out
}

/// Open requests by state and overdue, unfinished purge jobs by state and the oldest due one's
/// wait; no tenant is named.
fn erasure_metrics(overview: Option<&crate::state::ErasureOverview>) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "# HELP lethe_state_store_up Whether the state store answered this scrape.\n# TYPE lethe_state_store_up gauge\nlethe_state_store_up {}\n",
        u8::from(overview.is_some())
    );
    let Some(overview) = overview else {
        return out;
    };
    let open = lethe_policy::ErasureState::ALL.map(|s| s.as_str());
    let open = open
        .iter()
        .filter(|s| !matches!(**s, "completed" | "rejected"));
    by_state(
        &mut out,
        "lethe_erasure_requests",
        "Open erasure requests, by state.",
        open,
        &overview.open,
    );
    let _ = write!(
        out,
        "# HELP lethe_erasure_requests_overdue Open erasure requests past their deadline.\n# TYPE lethe_erasure_requests_overdue gauge\nlethe_erasure_requests_overdue {}\n",
        overview.overdue
    );
    let unfinished = lethe_policy::progress::JobState::ALL.map(|s| s.as_str());
    let unfinished = unfinished.iter().filter(|s| **s != "done");
    by_state(
        &mut out,
        "lethe_purge_jobs",
        "Purge jobs not done, by state.",
        unfinished,
        &overview.jobs,
    );
    let _ = write!(
        out,
        "# HELP lethe_purge_oldest_due_seconds How long the longest-waiting due purge job has waited.\n# TYPE lethe_purge_oldest_due_seconds gauge\nlethe_purge_oldest_due_seconds {}\n",
        overview.oldest_due_seconds
    );
    out
}

/// A gauge per state, every state of `states` named (0 where none is counted).
fn by_state<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    states: impl Iterator<Item = &'a &'static str>,
    counts: &std::collections::BTreeMap<String, i64>,
) {
    use std::fmt::Write as _;
    let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n");
    for state in states {
        let count = counts.get(*state).copied().unwrap_or(0);
        let _ = writeln!(out, "{name}{{state=\"{state}\"}} {count}");
    }
}

pub async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        SERVED.as_str(),
    )
}

/// The policy changes each governed database has yet to take, and whether it is reached.
fn governed_metrics(governed: &crate::governed::Governed) -> String {
    use std::fmt::Write as _;
    let mut out = String::from(
        "# HELP lethe_governed_pending_changes Policy changes not yet applied to a governed PostgreSQL database.\n# TYPE lethe_governed_pending_changes gauge\n",
    );
    for (database, pending) in governed.pending() {
        let _ = writeln!(
            out,
            "lethe_governed_pending_changes{{database=\"{database}\"}} {pending}"
        );
    }
    out.push_str("# HELP lethe_governed_ready Whether Lethe installed its rules in a governed PostgreSQL database and copied the policy since it started (0: it cannot reach it).\n# TYPE lethe_governed_ready gauge\n");
    let not_ready = governed.not_ready();
    for (database, _) in governed.pending() {
        let ready = u8::from(!not_ready.contains(&database));
        let _ = writeln!(
            out,
            "lethe_governed_ready{{database=\"{database}\"}} {ready}"
        );
    }
    out
}
