//! Who a data-plane request is from and whose data it is about.

use crate::error_shape::Code;
use std::sync::Arc;

use hyper::HeaderMap;
use hyper::StatusCode;

use super::error::DataError;
use crate::auth::{Claims, Role};

pub const SUBJECT_HEADER: &str = "x-lethe-subject";
pub const PURPOSE_HEADER: &str = "x-lethe-purpose";
pub const CATEGORY_HEADER: &str = "x-lethe-category";
pub const SOURCE_HEADER: &str = "x-lethe-source";
/// W3C Trace Context: OpenTelemetry's HTTP instrumentation sends it on its own.
pub const TRACEPARENT_HEADER: &str = "traceparent";

#[derive(Debug, Clone)]
pub struct RequestContext {
    pub request_id: String,
    pub claims: Arc<Claims>,
    /// The route's name: the store its items are kept in, as lineage names it.
    pub store: String,
    /// The token's `subject`, else `X-Lethe-Subject`.
    pub subject: Option<String>,
    /// Whether the token itself binds the subject.
    pub bound: bool,
    pub purpose: Option<String>,
    pub category: Option<String>,
    /// `X-Lethe-Source`, recorded with lineage.
    pub source: Option<String>,
    /// The W3C trace the request belongs to (`traceparent`), if it names a valid one.
    pub trace: Option<lethe_policy::TraceId>,
}

fn header(headers: &HeaderMap, name: &str) -> Result<Option<String>, DataError> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= 200 && !v.chars().any(char::is_control))
        .ok_or_else(|| {
            DataError::new(
                StatusCode::BAD_REQUEST,
                Code::InvalidRequest,
                format!("{name} must be 1 to 200 printable characters"),
            )
        })?;
    Ok(Some(text.to_owned()))
}

impl RequestContext {
    pub fn new(
        request_id: String,
        claims: Arc<Claims>,
        store: &str,
        headers: &HeaderMap,
    ) -> Result<Self, DataError> {
        if claims.role == Role::Compliance {
            return Err(DataError::new(
                StatusCode::FORBIDDEN,
                Code::Forbidden,
                "the compliance role does not use the data plane",
            ));
        }
        let asked = header(headers, SUBJECT_HEADER)?;
        let subject = match (&claims.subject, asked) {
            (Some(bound), Some(asked)) if *bound != asked => {
                return Err(DataError::new(
                    StatusCode::FORBIDDEN,
                    Code::ScopeViolation,
                    "X-Lethe-Subject contradicts the subject the token is bound to",
                ));
            }
            (Some(bound), _) => Some(bound.clone()),
            (None, asked) => asked,
        };
        Ok(RequestContext {
            request_id,
            store: store.to_owned(),
            bound: claims.subject.is_some(),
            subject,
            purpose: header(headers, PURPOSE_HEADER)?,
            category: header(headers, CATEGORY_HEADER)?,
            source: header(headers, SOURCE_HEADER)?,
            trace: headers
                .get(TRACEPARENT_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(lethe_policy::TraceId::from_traceparent),
            claims,
        })
    }

    pub fn tenant(&self) -> &str {
        &self.claims.tenant
    }

    /// Whose data a write is about, as the adapters take it.
    pub fn scope(&self) -> crate::adapters::Scope<'_> {
        crate::adapters::Scope {
            tenant: self.tenant(),
            subject: self.subject.as_deref(),
            bound: self.bound,
            purpose: self.purpose.as_deref(),
            category: self.category.as_deref(),
        }
    }

    /// Who is reading, as the read decision takes it.
    pub fn read_context(&self) -> lethe_policy::ReadContext<'_> {
        lethe_policy::ReadContext {
            tenant: self.tenant(),
            store: &self.store,
            bound_subject: self.subject.as_deref(),
            purpose: self.purpose.as_deref(),
        }
    }
}
