//! Consent grants: create, list by subject, revoke.

use std::collections::BTreeSet;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use lethe_policy::{Action, ConsentGrant, ConsentStatus};
use serde::{Deserialize, Serialize};

use super::error::{ApiError, not_found_as};
use super::extract::{ApiJson, ApiQuery, Caller};
use super::{ControlState, Problems};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantRequest {
    pub(crate) tenant: Option<String>,
    pub(crate) subject: String,
    pub(crate) purpose: String,
    pub(crate) category: String,
    pub(crate) actions: BTreeSet<Action>,
    pub(crate) expires_at: Option<DateTime<Utc>>,
    /// Where the consent was given (a form, a ticket), for the record.
    pub(crate) source: String,
    /// The version of the consent text the subject agreed to.
    pub(crate) policy_version: i64,
}

/// A grant as the API shows it: with its status now.
#[derive(Debug, Serialize)]
pub struct GrantView {
    #[serde(flatten)]
    pub(crate) grant: ConsentGrant,
    pub(crate) status: ConsentStatus,
}

impl GrantView {
    pub fn at(grant: ConsentGrant, now: DateTime<Utc>) -> Self {
        GrantView {
            status: grant.status(now),
            grant,
        }
    }
}

pub async fn grant(
    State(state): State<ControlState>,
    caller: Caller,
    ApiJson(req): ApiJson<GrantRequest>,
) -> Result<(StatusCode, Json<GrantView>), ApiError> {
    let grant = grant_as(&state, &caller, req).await?;
    let view = GrantView::at(grant, crate::now());
    Ok((StatusCode::CREATED, Json(view)))
}

/// A grant the caller makes (the API's and the console's).
pub(crate) async fn grant_as(
    state: &ControlState,
    caller: &Caller,
    mut req: GrantRequest,
) -> Result<ConsentGrant, ApiError> {
    let tenant = caller.tenant(req.tenant.as_deref())?.to_owned();
    let now = crate::now();
    let mut problems = Problems::default();
    let mut tenant = tenant;
    problems.name("tenant", &mut tenant);
    problems.key("subject", &mut req.subject, state.folding.folds(&tenant));
    problems.name("purpose", &mut req.purpose);
    problems.name("category", &mut req.category);
    problems.text("source", &req.source);
    problems.check(!req.actions.is_empty(), || {
        "actions: name at least one action".into()
    });
    problems.check(req.policy_version > 0, || {
        "policy_version: must be greater than zero".into()
    });
    problems.check(req.expires_at.is_none_or(|e| e > now), || {
        "expires_at: must be in the future".into()
    });
    problems.into_result()?;

    let grant = ConsentGrant {
        id: format!("cg_{}", uuid::Uuid::new_v4().simple()),
        tenant,
        subject: req.subject,
        purpose: req.purpose,
        category: req.category,
        actions: req.actions,
        granted_at: now,
        expires_at: req.expires_at,
        revoked_at: None,
        policy_version: req.policy_version,
        source: req.source,
    };
    let audit = caller.audit(
        &grant.tenant,
        "consent.grant",
        Some(&grant.subject),
        "consent",
        Some(&grant.id),
    );
    state.store.create_grant(&grant, audit).await?;
    Ok(grant)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    tenant: Option<String>,
    subject: String,
}

pub async fn list(
    State(state): State<ControlState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let tenant = caller.tenant(query.tenant.as_deref())?;
    let subject = state
        .folding
        .subject(tenant, &query.subject)
        .map_err(|e| ApiError::invalid(format!("subject: {e}")))?;
    let now = crate::now();
    let items: Vec<_> = state
        .store
        .grants(tenant, &subject)
        .await?
        .into_iter()
        .map(|g| GrantView::at(g, now))
        .collect();
    Ok(Json(serde_json::json!({ "items": items })))
}

pub async fn revoke(
    State(state): State<ControlState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<GrantView>, ApiError> {
    let revoked = revoke_as(&state, &caller, &id).await?;
    Ok(Json(GrantView::at(revoked, crate::now())))
}

/// A revocation by the caller (the API's and the console's).
pub(crate) async fn revoke_as(
    state: &ControlState,
    caller: &Caller,
    id: &str,
) -> Result<ConsentGrant, ApiError> {
    let found = state
        .store
        .grant(id)
        .await
        .map_err(not_found_as("consent grant"))?;
    if !caller.can_see(&found.tenant) {
        return Err(ApiError::not_found("consent grant"));
    }
    let now = crate::now();
    let audit = caller.audit(
        &found.tenant,
        "consent.revoke",
        Some(&found.subject),
        "consent",
        Some(id),
    );
    Ok(state.store.revoke_grant(id, now, audit).await?)
}
