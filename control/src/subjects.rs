//! The subject view: what Lethe knows about one data subject, without any of its content.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use lethe_policy::SubjectStatus;
use serde::Serialize;

use super::ControlState;
use super::consents::GrantView;
use super::error::ApiError;
use super::extract::Caller;
use super::holds::HoldView;

/// What Lethe knows about a subject: its state, grants, holds, lineage per store, and the
/// providers that received its data.
#[derive(Debug, Serialize)]
pub struct SubjectView {
    pub(crate) tenant: String,
    pub(crate) subject: String,
    pub(crate) subject_ref: String,
    pub(crate) state: SubjectStatus,
    pub(crate) epoch: i64,
    pub(crate) held: bool,
    pub(crate) grants: Vec<GrantView>,
    pub(crate) legal_holds: Vec<HoldView>,
    /// Live lineage rows per store.
    pub(crate) inventory: BTreeMap<String, i64>,
    pub(crate) processors: Vec<Processor>,
}

/// A provider that received the subject's data through Lethe, first and last time.
#[derive(Debug, Serialize)]
pub struct Processor {
    pub(crate) processor: String,
    pub(crate) first_at: DateTime<Utc>,
    pub(crate) last_at: DateTime<Utc>,
}

pub async fn view(
    State(state): State<ControlState>,
    caller: Caller,
    Path((tenant, subject)): Path<(String, String)>,
) -> Result<Json<SubjectView>, ApiError> {
    Ok(Json(view_as(&state, &caller, &tenant, &subject).await?))
}

/// The subject's view, for the API and the console.
pub(crate) async fn view_as(
    state: &ControlState,
    caller: &Caller,
    tenant: &str,
    subject: &str,
) -> Result<SubjectView, ApiError> {
    let tenant = caller.tenant(Some(tenant))?;
    // Looked up by its one spelling: `Carol` is `carol` where the tenant's keys are folded.
    let subject = state
        .folding
        .subject(tenant, subject)
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
    let processors = store
        .processors(tenant, &subject)
        .await?
        .into_iter()
        .map(|p| Processor {
            processor: p.processor,
            first_at: p.first_at,
            last_at: p.last_at,
        })
        .collect();
    Ok(SubjectView {
        tenant: tenant.to_owned(),
        subject_ref: caller.subject_ref(tenant, &subject),
        subject,
        state: subject_state.status,
        epoch: subject_state.epoch,
        held: holds.iter().any(|h| h.active),
        grants,
        legal_holds: holds,
        inventory,
        processors,
    })
}
