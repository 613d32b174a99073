//! The audit log: page through it, verify the chain. A compliance caller reads and verifies its
//! own tenant's events (its tenant's chain); an admin reads the whole log, or one tenant's.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde_json::json;

use super::ControlState;
use super::error::ApiError;
use super::extract::{ApiQuery, Caller};
use crate::auth::Role;
use crate::state::{ChainReport, verify_audit};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    #[serde(default)]
    after: i64,
    limit: Option<i64>,
    tenant: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyQuery {
    tenant: Option<String>,
}

const MAX_PAGE: i64 = 1000;

/// Whose events a caller asks for: `None` is the whole log, which only an admin may read; a
/// compliance caller always gets its own tenant's, and another tenant's is forbidden.
fn scope<'a>(caller: &'a Caller, asked: Option<&'a str>) -> Result<Option<&'a str>, ApiError> {
    if caller.claims.role == Role::Admin && asked.is_none() {
        return Ok(None);
    }
    caller.tenant(asked).map(Some)
}

/// `{"items": [...], "next_cursor": SEQ | null}`; pass `next_cursor` as `after` for the next page.
pub async fn page(
    State(state): State<ControlState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let tenant = scope(&caller, query.tenant.as_deref())?;
    let limit = query.limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) || query.after < 0 {
        return Err(ApiError::invalid(format!(
            "limit must be 1..={MAX_PAGE} and after must not be negative"
        )));
    }
    let items = state.store.audit_page(query.after, limit, tenant).await?;
    let next = (items.len() as i64 == limit)
        .then(|| items.last().map(|r| r.seq))
        .flatten();
    Ok(Json(json!({ "items": items, "next_cursor": next })))
}

pub async fn verify(
    State(state): State<ControlState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<VerifyQuery>,
) -> Result<Json<ChainReport>, ApiError> {
    let tenant = scope(&caller, query.tenant.as_deref())?;
    Ok(Json(
        verify_audit(
            state.store.as_ref(),
            &state.audit_key,
            Some(&|h| state.erasure.certifier.genuine(h)),
            tenant,
            None,
        )
        .await?,
    ))
}
