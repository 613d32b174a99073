//! The subject view: what Lethe knows about one data subject, without any of its content.

use axum::Json;
use axum::extract::{Path, State};
use serde_json::json;

use super::ControlState;
use super::consents::GrantView;
use super::error::ApiError;
use super::extract::Caller;
use super::holds::HoldView;

pub async fn view(
    State(state): State<ControlState>,
    caller: Caller,
    Path((tenant, subject)): Path<(String, String)>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let tenant = caller.tenant(Some(&tenant))?;
    // Looked up by its one spelling: `Carol` is `carol` where the tenant's keys are folded.
    let subject = state
        .folding
        .subject(tenant, &subject)
        .map_err(|e| ApiError::invalid(format!("subject: {e}")))?
        .into_owned();
    let store = &state.store;
    let Some(subject_state) = store.subject(tenant, &subject).await? else {
        return Err(ApiError::not_found("subject"));
    };
    let now = crate::now();
    let grants: Vec<_> = store
        .grants(tenant, &subject)
        .await?
        .into_iter()
        .map(|g| GrantView::at(g, now))
        .collect();
    let holds: Vec<_> = store
        .holds(tenant, Some(&subject))
        .await?
        .into_iter()
        .map(HoldView::now)
        .collect();
    let inventory = store.inventory(tenant, &subject).await?;
    // Which providers received this subject's data, first and last time.
    let processors: Vec<_> = store
        .processors(tenant, &subject)
        .await?
        .into_iter()
        .map(|p| json!({"processor": p.processor, "first_at": p.first_at, "last_at": p.last_at}))
        .collect();
    Ok(Json(json!({
        "tenant": tenant,
        "subject": subject,
        "subject_ref": caller.subject_ref(tenant, &subject),
        "state": subject_state.status,
        "epoch": subject_state.epoch,
        "held": holds.iter().any(|h| h.active),
        "grants": grants,
        "legal_holds": holds,
        "inventory": inventory,
        "processors": processors,
    })))
}
