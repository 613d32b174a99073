//! Data-plane failures and their HTTP form. Every refusal is decided before anything reaches the
//! upstream or the client; none echoes a body.

use crate::error_shape::Code;
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use lethe_policy::Refusal;
use serde_json::{Value, json};

use crate::records::AdapterError;
use crate::state::StoreError;

#[derive(Debug, Clone, PartialEq)]
pub struct DataError {
    pub status: StatusCode,
    pub code: Code,
    pub message: String,
    pub details: Option<Value>,
    /// Seconds the client is asked to wait before retrying (`Retry-After`).
    pub retry_after: Option<u32>,
}

impl DataError {
    pub fn new(status: StatusCode, code: Code, message: impl Into<String>) -> Self {
        DataError {
            status,
            code,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// The same failure, telling the client to retry after `seconds`.
    pub fn retry_after(self, seconds: u32) -> Self {
        DataError {
            retry_after: Some(seconds),
            ..self
        }
    }

    pub fn unknown_endpoint() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            Code::UnknownEndpoint,
            "this endpoint is not passed through Lethe",
        )
    }

    pub fn upstream_unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_GATEWAY, Code::UpstreamUnavailable, message)
    }

    pub fn into_response(self, request_id: &str) -> Response<Full<Bytes>> {
        let body = crate::error_shape::error_body(
            self.code.as_str(),
            &self.message,
            request_id,
            self.details.as_ref(),
        );
        let mut response = json_response(self.status, &body);
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(hyper::header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

pub fn json_response(status: StatusCode, body: &Value) -> Response<Full<Bytes>> {
    // Written straight into bytes (`to_string` goes through the formatter); a `Value` always
    // serializes.
    let bytes = Bytes::from(serde_json::to_vec(body).unwrap_or_default());
    let mut response = Response::new(Full::new(bytes.clone()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    response
}

fn refusal_status(refusal: Refusal) -> StatusCode {
    match refusal {
        Refusal::StaleEpoch | Refusal::AlreadyExists | Refusal::DerivedFromErased => {
            StatusCode::CONFLICT
        }
        _ => StatusCode::FORBIDDEN,
    }
}

impl From<Refusal> for DataError {
    fn from(refusal: Refusal) -> Self {
        DataError::new(refusal_status(refusal), refusal.into(), refusal.to_string())
    }
}

impl From<AdapterError> for DataError {
    fn from(e: AdapterError) -> Self {
        match e {
            AdapterError::Invalid(message) => {
                DataError::new(StatusCode::BAD_REQUEST, Code::InvalidRequest, message)
            }
            AdapterError::MissingScope { .. } => DataError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                Code::MissingScope,
                e.to_string(),
            ),
            AdapterError::Refused(ref records) => {
                let first = records
                    .first()
                    .map_or(Refusal::ScopeViolation, |r| r.refusal);
                let details: Vec<Value> = records
                    .iter()
                    .map(|r| json!({ "index": r.index, "code": r.refusal.code() }))
                    .collect();
                DataError {
                    details: Some(Value::Array(details)),
                    ..DataError::new(refusal_status(first), first.into(), e.to_string())
                }
            }
            AdapterError::UpstreamInvalid(message) => {
                tracing::warn!(%message, "upstream answer refused");
                DataError::new(
                    StatusCode::BAD_GATEWAY,
                    Code::UpstreamInvalid,
                    "the upstream's answer could not be checked",
                )
            }
        }
    }
}

/// Whatever went wrong with the state store, the request is refused, not decided on stale data.
impl From<StoreError> for DataError {
    fn from(e: StoreError) -> Self {
        tracing::warn!(error = %e, "state store unavailable on the data plane");
        DataError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            Code::StateUnavailable,
            "the state store is unavailable",
        )
    }
}
