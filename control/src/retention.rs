//! Retention rules: read the current version, replace it with a new one.

use axum::Json;
use axum::extract::State;
use chrono::{DateTime, Utc};
use lethe_policy::RetentionPolicy;
use serde::{Deserialize, Serialize};

use super::ControlState;
use super::error::ApiError;
use super::extract::{ApiJson, ApiQuery, Caller};
use crate::state::RetentionVersion;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantQuery {
    pub(crate) tenant: Option<String>,
}

/// A tenant's rules as the API shows them. Version 0, with no rules, until rules are first set
/// (and until then nothing can be written for the tenant).
#[derive(Debug, Serialize)]
pub struct RulesView {
    tenant: String,
    version: i64,
    #[serde(flatten)]
    policy: RetentionPolicy,
    created_at: Option<DateTime<Utc>>,
    created_by: Option<String>,
}

impl RulesView {
    fn new(tenant: &str, version: Option<RetentionVersion>) -> Self {
        let tenant = tenant.to_owned();
        match version {
            Some(v) => RulesView {
                tenant,
                version: v.version,
                policy: v.policy,
                created_at: Some(v.created_at),
                created_by: Some(v.created_by),
            },
            None => RulesView {
                tenant,
                version: 0,
                policy: RetentionPolicy::default(),
                created_at: None,
                created_by: None,
            },
        }
    }
}

pub async fn current(
    State(state): State<ControlState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<TenantQuery>,
) -> Result<Json<RulesView>, ApiError> {
    let tenant = caller.tenant(query.tenant.as_deref())?;
    Ok(Json(RulesView::new(
        tenant,
        state.store.retention(tenant).await?,
    )))
}

pub async fn replace(
    State(state): State<ControlState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<TenantQuery>,
    ApiJson(policy): ApiJson<RetentionPolicy>,
) -> Result<Json<RulesView>, ApiError> {
    let tenant = caller.tenant(query.tenant.as_deref())?;
    policy.validate().map_err(ApiError::validation)?;
    let audit = caller.audit(tenant, "retention.replace", None, "retention_rules", None);
    let version = state
        .store
        .replace_retention(tenant, &policy, crate::now(), &caller.claims.sub, audit)
        .await?;
    Ok(Json(RulesView::new(tenant, Some(version))))
}
