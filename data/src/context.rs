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
    /// Whether the tenant's subject keys are case-insensitive.
    pub fold: bool,
    pub purpose: Option<String>,
    pub category: Option<String>,
    /// `X-Lethe-Source`, recorded with lineage.
    pub source: Option<String>,
    /// The W3C trace the request belongs to (`traceparent`), if it names a valid one.
    pub trace: Option<lethe_policy::TraceId>,
}

fn invalid(message: String) -> DataError {
    DataError::new(StatusCode::BAD_REQUEST, Code::InvalidRequest, message)
}

/// A header sent at most once: a second copy is refused, since a proxy in front of Lethe might
/// read the other one.
pub fn single<'h>(
    headers: &'h HeaderMap,
    name: &str,
) -> Result<Option<&'h hyper::header::HeaderValue>, DataError> {
    let mut values = headers.get_all(name).iter();
    let first = values.next();
    if values.next().is_some() {
        return Err(invalid(format!("{name} must be sent once")));
    }
    Ok(first)
}

/// A header naming a subject, a purpose or a category, in its one spelling (see
/// `lethe_policy::names`); `fold`: case folded (a tenant's case-insensitive subject keys).
fn name_header(headers: &HeaderMap, name: &str, fold: bool) -> Result<Option<String>, DataError> {
    let Some(value) = single(headers, name)? else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| invalid(format!("{name} must be printable text")))?;
    lethe_policy::names::canonical_key(text, fold)
        .map(|n| Some(n.into_owned()))
        .map_err(|e| invalid(format!("{name} {e}")))
}

/// A header of free text (the source of a write), at most 200 printable characters.
fn text_header(headers: &HeaderMap, name: &str) -> Result<Option<String>, DataError> {
    let Some(value) = single(headers, name)? else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .map(str::trim)
        .filter(|v| !v.is_empty() && v.len() <= 200 && !v.chars().any(char::is_control))
        .map(|v| Some(v.to_owned()))
        .ok_or_else(|| invalid(format!("{name} must be 1 to 200 printable characters")))
}

impl RequestContext {
    pub fn new(
        request_id: String,
        claims: Arc<Claims>,
        store: &str,
        headers: &HeaderMap,
        folding: &lethe_policy::names::Folding,
    ) -> Result<Self, DataError> {
        if claims.role == Role::Compliance {
            return Err(DataError::new(
                StatusCode::FORBIDDEN,
                Code::Forbidden,
                "the compliance role does not use the data plane",
            ));
        }
        let fold = folding.folds(&claims.tenant);
        let asked = name_header(headers, SUBJECT_HEADER, fold)?;
        // The token's subject is canonical already; a tenant whose keys are case-insensitive
        // folds it too.
        let bound = claims
            .subject
            .as_deref()
            .map(|s| {
                folding
                    .subject(&claims.tenant, s)
                    .map(std::borrow::Cow::into_owned)
            })
            .transpose()
            .map_err(|e| invalid(format!("the token's subject {e}")))?;
        let subject = match (&bound, asked) {
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
            fold,
            subject,
            purpose: name_header(headers, PURPOSE_HEADER, false)?,
            category: name_header(headers, CATEGORY_HEADER, false)?,
            source: text_header(headers, SOURCE_HEADER)?,
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
    pub fn scope(&self) -> crate::records::Scope<'_> {
        crate::records::Scope {
            tenant: self.tenant(),
            subject: self.subject.as_deref(),
            bound: self.bound,
            purpose: self.purpose.as_deref(),
            category: self.category.as_deref(),
            fold: self.fold,
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
