//! The audit log: page through it, verify the chain.

use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use serde_json::json;

use super::ControlState;
use super::error::ApiError;
use super::extract::{ApiQuery, Caller};
use crate::store::{ChainReport, verify_audit};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    #[serde(default)]
    after: i64,
    limit: Option<i64>,
}

const MAX_PAGE: i64 = 1000;

/// `{"items": [...], "next_cursor": SEQ | null}`; pass `next_cursor` as `after` for the next page.
pub async fn page(
    State(state): State<ControlState>,
    _caller: Caller,
    ApiQuery(query): ApiQuery<PageQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let limit = query.limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) || query.after < 0 {
        return Err(ApiError::invalid(format!(
            "limit must be 1..={MAX_PAGE} and after must not be negative"
        )));
    }
    let items = state.store.audit_page(query.after, limit).await?;
    let next = (items.len() as i64 == limit)
        .then(|| items.last().map(|r| r.seq))
        .flatten();
    Ok(Json(json!({ "items": items, "next_cursor": next })))
}

pub async fn verify(
    State(state): State<ControlState>,
    _caller: Caller,
) -> Result<Json<ChainReport>, ApiError> {
    Ok(Json(verify_audit(state.store.as_ref()).await?))
}
