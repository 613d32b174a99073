//! Extractors: the authenticated caller, and JSON bodies whose rejections use the error shape.

use crate::error_shape::Code;
use std::sync::Arc;

use crate::state::ErasureRecord;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use lethe_policy::audit::{AuditEntry, subject_ref};
use serde::de::DeserializeOwned;

use super::ControlState;
use super::error::{ApiError, RequestId};
use crate::auth::{Claims, Role, bearer_token};

/// A verified compliance or admin caller.
#[derive(Debug, Clone)]
pub struct Caller {
    pub claims: Claims,
    pub request_id: String,
    audit_key: Arc<[u8]>,
}

impl Caller {
    /// The caller a token names, if it is a valid compliance or admin token, not revoked.
    pub async fn of_token(
        state: &ControlState,
        token: &str,
        parts: &Parts,
    ) -> Result<Caller, ApiError> {
        let claims = state.tokens.verify(token).await.map_err(|e| match e {
            crate::auth::AuthError::ProviderUnavailable(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                Code::ProviderUnavailable,
                e.to_string(),
            ),
            _ => ApiError::unauthenticated(e.to_string()),
        })?;
        Caller::of_claims(state, claims, parts).await
    }

    /// The caller of verified claims (a token's, or a console session's), if they are a
    /// compliance or admin person's and their token was not revoked.
    pub async fn of_claims(
        state: &ControlState,
        claims: Claims,
        parts: &Parts,
    ) -> Result<Caller, ApiError> {
        state
            .revocations
            .check(&claims)
            .await
            .map_err(|e| match e {
                crate::revocations::Refused::Revoked => ApiError::unauthenticated(e.to_string()),
                _ => ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Code::StateUnavailable,
                    "whether the token was revoked cannot be known",
                ),
            })?;
        if !matches!(claims.role, Role::Compliance | Role::Admin) {
            return Err(ApiError::forbidden(format!(
                "the {} role cannot use the control plane",
                claims.role
            )));
        }
        let request_id = parts
            .extensions
            .get::<RequestId>()
            .map(|r| r.0.clone())
            .unwrap_or_default();
        Ok(Caller {
            claims,
            request_id,
            audit_key: Arc::clone(&state.audit_key),
        })
    }

    /// The tenant the caller acts on: the one asked for, which a compliance token must match.
    pub fn tenant<'a>(&'a self, asked: Option<&'a str>) -> Result<&'a str, ApiError> {
        match asked {
            None => Ok(&self.claims.tenant),
            Some(t) if self.claims.role == Role::Admin || t == self.claims.tenant => Ok(t),
            Some(_) => Err(ApiError::forbidden("the token is for another tenant")),
        }
    }

    /// Objects of other tenants look absent to a compliance caller.
    pub fn can_see(&self, tenant: &str) -> bool {
        self.claims.role == Role::Admin || tenant == self.claims.tenant
    }

    pub fn subject_ref(&self, tenant: &str, subject: &str) -> String {
        subject_ref(&self.audit_key, tenant, subject)
    }

    /// An item's reference (see [`crate::state::ItemKey::reference`]).
    pub fn item_ref(&self, item: &crate::state::ItemKey) -> String {
        item.reference(&self.audit_key)
    }

    /// The audit event of a successful change made by this caller in `tenant`, about `subject`
    /// when it concerns one.
    pub fn audit(
        &self,
        tenant: &str,
        action: &str,
        subject: Option<&str>,
        target: &str,
        target_ref: Option<&str>,
    ) -> AuditEntry {
        AuditEntry {
            at: crate::now(),
            tenant: Some(tenant.to_owned()),
            actor: self.claims.sub.clone(),
            action: action.to_owned(),
            request_id: self.request_id.clone(),
            subject_ref: subject.map(|subject| self.subject_ref(tenant, subject)),
            target: target.to_owned(),
            target_ref: target_ref.map(str::to_owned),
            result: "ok".to_owned(),
            attempt: 1,
        }
    }

    /// Whether the caller may take a step `[erasure] approval_requires_mfa` guards: their sign-in
    /// showed a second factor, or none is required.
    pub fn second_factor(&self, state: &ControlState) -> Result<(), ApiError> {
        match state.erasure.approval_requires_mfa && !self.claims.second_factor {
            true => Err(ApiError::second_factor_required()),
            false => Ok(()),
        }
    }

    /// The audit event of `action` on the erasure request `record`.
    pub fn erasure_audit(&self, record: &ErasureRecord, action: &str) -> AuditEntry {
        let (tenant, subject) = (&record.tenant, Some(record.subject.as_str()));
        self.audit(tenant, action, subject, "erasure", Some(&record.id))
    }
}

impl FromRequestParts<ControlState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &ControlState) -> Result<Self, ApiError> {
        let token =
            bearer_token(&parts.headers).map_err(|e| ApiError::unauthenticated(e.to_string()))?;
        Caller::of_token(state, token, parts).await
    }
}

/// `Json<T>` whose rejections are [`ApiError`]s with stable codes.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

/// `Query<T>` whose rejections are [`ApiError`]s.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(ApiQuery(value)),
            Err(rejection) => Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                Code::InvalidRequest,
                rejection.body_text(),
            )),
        }
    }
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    match rejection {
        JsonRejection::JsonDataError(e) => ApiError::invalid(e.body_text()),
        JsonRejection::JsonSyntaxError(_) => ApiError::new(
            StatusCode::BAD_REQUEST,
            Code::InvalidJson,
            "the body is not valid JSON",
        ),
        JsonRejection::MissingJsonContentType(_) => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Code::UnsupportedMediaType,
            "send the body as application/json",
        ),
        other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            Code::BodyTooLarge,
            "the body is larger than the configured limit",
        ),
        other => ApiError::new(
            StatusCode::BAD_REQUEST,
            Code::InvalidRequest,
            other.body_text(),
        ),
    }
}
