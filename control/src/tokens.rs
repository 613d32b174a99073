//! Token revocation: a token (by its `jti`) is refused on both planes of every replica from the
//! moment its revocation is answered, and console sessions made with it end.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::json;

use super::ControlState;
use super::error::ApiError;
use super::extract::{ApiJson, Caller};
use crate::auth::Role;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevokeRequest {
    pub(crate) jti: String,
}

/// `POST /v1/tokens/revoke`: an admin's. A token's id names no tenant, so another tenant's
/// compliance staff could revoke anyone's; the event is the deployment's (no tenant).
pub async fn revoke(
    State(state): State<ControlState>,
    caller: Caller,
    ApiJson(req): ApiJson<RevokeRequest>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    if caller.claims.role != Role::Admin {
        return Err(ApiError::forbidden("only an admin revokes tokens"));
    }
    let jti = req.jti.as_str();
    if !crate::auth::revocable_id(jti) {
        return Err(ApiError::validation(vec![
            "jti: must be 1 to 200 bytes without control characters".into(),
        ]));
    }
    let now = crate::now();
    let mut audit = caller.audit("", "token.revoke", None, "token", Some(jti));
    audit.tenant = None;
    state
        .store
        .revoke_token(jti, now, &caller.claims.sub, audit)
        .await?;
    Ok((
        StatusCode::OK,
        Json(json!({ "jti": jti, "revoked_at": now, "revoked_by": caller.claims.sub })),
    ))
}
