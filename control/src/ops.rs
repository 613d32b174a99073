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
        state.metrics.render()
            + &governed_metrics(&state.governed)
            + &state
                .lineage
                .as_ref()
                .map(|m| m.render())
                .unwrap_or_default(),
    )
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
