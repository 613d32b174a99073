//! The one error shape of the control plane, and the layer that renders it.
//!
//! Handlers return [`ApiError`]; it leaves its code and message in the response extensions, and
//! [`render_errors`] (the outermost layer) writes the JSON body with the request id. Responses
//! axum makes itself (unknown route, wrong method) get the same shape there.

use crate::error_shape::Code;
use axum::Json;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::state::StoreError;

const SECOND_FACTOR_REQUIRED: &str =
    "this step needs a second factor: sign in again through your sign-in provider with one";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: Code,
    pub message: String,
    pub details: Vec<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: Code, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            details: Vec::new(),
        }
    }
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, Code::Unauthenticated, message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, Code::Forbidden, message)
    }
    /// A step `[erasure] approval_requires_mfa` guards, by a caller whose sign-in showed no
    /// second factor.
    pub fn second_factor_required() -> Self {
        Self::forbidden(SECOND_FACTOR_REQUIRED)
    }
    pub fn is_second_factor_required(&self) -> bool {
        self.code == Code::Forbidden && self.message == SECOND_FACTOR_REQUIRED
    }
    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            Code::NotFound,
            format!("no such {what}"),
        )
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            Code::InvalidRequest,
            message,
        )
    }
    pub fn validation(problems: Vec<String>) -> Self {
        ApiError {
            details: problems,
            ..Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                Code::ValidationFailed,
                "the request has problems; see details",
            )
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => ApiError::not_found("object"),
            StoreError::AlreadyRevoked => {
                ApiError::new(StatusCode::CONFLICT, Code::AlreadyRevoked, e.to_string())
            }
            StoreError::AlreadyReleased => {
                ApiError::new(StatusCode::CONFLICT, Code::AlreadyReleased, e.to_string())
            }
            StoreError::NotExtendable => {
                ApiError::new(StatusCode::CONFLICT, Code::NotExtendable, e.to_string())
            }
            StoreError::Approval(refused) => {
                use lethe_policy::ApprovalError as A;
                let code = match refused {
                    A::AlreadyApproved => Code::AlreadyApproved,
                    A::NotAwaitingApproval => Code::NotAwaitingApproval,
                    A::ConfusableApprover => Code::ConfusableApprover,
                    A::RequesterCannotApprove => Code::RequesterCannotApprove,
                };
                ApiError::new(StatusCode::CONFLICT, code, e.to_string())
            }
            StoreError::Transition(_) => {
                ApiError::new(StatusCode::CONFLICT, Code::IllegalState, e.to_string())
            }
            StoreError::NotDecidable(_) => {
                ApiError::new(StatusCode::CONFLICT, Code::NotDecidable, e.to_string())
            }
            StoreError::SubjectNotActive => ApiError::new(
                StatusCode::CONFLICT,
                Code::SubjectSuppressed,
                "the subject is under erasure or erased",
            ),
            StoreError::Unavailable(_) => {
                tracing::warn!(error = %e, "state store unavailable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Code::StateUnavailable,
                    "the state store is unavailable",
                )
            }
            // Nothing is changed without its event, and the chain takes none: refused whole.
            StoreError::AuditUnkeyed | StoreError::WrongAuditKey => {
                tracing::error!(error = %e, "the audit chain takes no event");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Code::StateUnavailable,
                    "the audit log cannot take the change's event",
                )
            }
            StoreError::Database(_)
            | StoreError::Corrupt(_)
            | StoreError::NoSubjectKey
            | StoreError::UnsupportedUrl(_) => {
                tracing::error!(error = %e, "state store error");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    Code::Internal,
                    "internal error",
                )
            }
        }
    }
}

/// Maps a store's `NotFound` to a 404 that names what was missing.
pub fn not_found_as(what: &'static str) -> impl FnOnce(StoreError) -> ApiError {
    move |e| match e {
        StoreError::NotFound => ApiError::not_found(what),
        other => other.into(),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = self.status.into_response();
        response.extensions_mut().insert(self);
        response
    }
}

/// The request id: the caller's `x-request-id` when it is a sane token, else a new one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

fn caller_request_id(value: &HeaderValue) -> Option<String> {
    let text = value.to_str().ok()?;
    let sane = !text.is_empty()
        && text.len() <= 128
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    sane.then(|| text.to_owned())
}

/// Outermost layer: assigns the request id and gives every error response the JSON shape (but
/// the console's HTML pages).
pub async fn render_errors(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(caller_request_id)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    request.extensions_mut().insert(RequestId(id.clone()));
    let mut response = next.run(request).await;
    let status = response.status();
    let error = response.extensions_mut().remove::<ApiError>().or_else(|| {
        // JSON errors have the shape already; the console's pages explain themselves to people.
        let shaped = response
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| {
                v.as_bytes().starts_with(b"application/json")
                    || v.as_bytes().starts_with(b"text/html")
            });
        (status.is_client_error() || status.is_server_error())
            .then_some(())
            .filter(|()| !shaped)
            .map(|()| generic_error(status))
    });
    if let Some(error) = error {
        let details = (!error.details.is_empty()).then(|| json!(error.details));
        let body = crate::error_shape::error_body(
            error.code.as_str(),
            &error.message,
            &id,
            details.as_ref(),
        );
        let headers = std::mem::take(response.headers_mut());
        response = (error.status, Json(body)).into_response();
        for (name, value) in headers
            .iter()
            .filter(|(name, _)| *name == header::ALLOW || *name == header::WWW_AUTHENTICATE)
        {
            response.headers_mut().insert(name.clone(), value.clone());
        }
    }
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", value);
    }
    response
}

fn generic_error(status: StatusCode) -> ApiError {
    let code = match status {
        StatusCode::NOT_FOUND => Code::NotFound,
        StatusCode::METHOD_NOT_ALLOWED => Code::MethodNotAllowed,
        StatusCode::PAYLOAD_TOO_LARGE => Code::BodyTooLarge,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => Code::UnsupportedMediaType,
        StatusCode::REQUEST_TIMEOUT => Code::Timeout,
        s if s.is_client_error() => Code::InvalidRequest,
        _ => Code::Internal,
    };
    ApiError::new(status, code, status.canonical_reason().unwrap_or("error"))
}
