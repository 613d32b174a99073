//! Legal holds on a tenant or a subject: place, list, release.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use lethe_policy::LegalHold;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, not_found_as};
use super::extract::{ApiJson, ApiQuery, Caller};
use super::{ControlState, Problems};
use crate::state::HoldRecord;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlaceRequest {
    pub(crate) tenant: Option<String>,
    /// Absent: the hold covers the whole tenant.
    pub(crate) subject: Option<String>,
    pub(crate) reason: String,
}

#[derive(Debug, Serialize)]
pub struct HoldView {
    #[serde(flatten)]
    pub(crate) record: HoldRecord,
    pub(super) active: bool,
}

impl HoldView {
    pub fn now(record: HoldRecord) -> Self {
        HoldView {
            active: record.hold.is_active(crate::now()),
            record,
        }
    }
}

pub async fn place(
    State(state): State<ControlState>,
    caller: Caller,
    ApiJson(mut req): ApiJson<PlaceRequest>,
) -> Result<(StatusCode, Json<HoldView>), ApiError> {
    let mut tenant = caller.tenant(req.tenant.as_deref())?.to_owned();
    let mut problems = Problems::default();
    problems.name("tenant", &mut tenant);
    if let Some(subject) = &mut req.subject {
        problems.key("subject", subject, state.folding.folds(&tenant));
    }
    problems.text("reason", &req.reason);
    problems.into_result()?;
    let record = HoldRecord {
        hold: LegalHold {
            id: format!("lh_{}", uuid::Uuid::new_v4().simple()),
            tenant,
            subject: req.subject,
            reason: req.reason,
            placed_at: crate::now(),
            released_at: None,
        },
        placed_by: caller.claims.sub.clone(),
        released_by: None,
    };
    let h = &record.hold;
    let audit = caller.audit(
        &h.tenant,
        "hold.place",
        h.subject.as_deref(),
        "legal_hold",
        Some(&h.id),
    );
    state.store.place_hold(&record, audit).await?;
    Ok((StatusCode::CREATED, Json(HoldView::now(record))))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    tenant: Option<String>,
    subject: Option<String>,
}

pub async fn list(
    State(state): State<ControlState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let tenant = caller.tenant(query.tenant.as_deref())?;
    let subject = match &query.subject {
        Some(subject) => Some(
            state
                .folding
                .subject(tenant, subject)
                .map_err(|e| ApiError::invalid(format!("subject: {e}")))?,
        ),
        None => None,
    };
    let holds = state.store.holds(tenant, subject.as_deref()).await?;
    let items: Vec<_> = holds.into_iter().map(HoldView::now).collect();
    Ok(Json(serde_json::json!({ "items": items })))
}

pub async fn release(
    State(state): State<ControlState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<HoldView>, ApiError> {
    caller.second_factor(&state)?;
    let found = state
        .store
        .hold(&id)
        .await
        .map_err(not_found_as("legal hold"))?;
    let h = &found.hold;
    if !caller.can_see(&h.tenant) {
        return Err(ApiError::not_found("legal hold"));
    }
    let audit = caller.audit(
        &h.tenant,
        "hold.release",
        h.subject.as_deref(),
        "legal_hold",
        Some(&id),
    );
    let released = state
        .store
        .release_hold(&id, crate::now(), &caller.claims.sub, audit)
        .await?;
    Ok(Json(HoldView::now(released)))
}
