//! Adapters: pure functions over a store's JSON that find the facts a decision needs, and
//! rewrite requests and responses to what the decision allows. No I/O here.

#[cfg(test)]
pub(crate) mod fixtures;
pub mod sse;
pub mod stamp;
pub mod text;
pub mod write;

use lethe_policy::Refusal;

/// Why an adapter could not accept a request or a response. Never carries stored content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterError {
    /// The client's body is not what this endpoint takes.
    #[error("{0}")]
    Invalid(String),
    /// A record names no subject, purpose or category, and the request supplies none.
    #[error("record {index} has no {what}; send X-Lethe-{header} or lethe_{what} in its metadata")]
    MissingScope {
        index: usize,
        what: &'static str,
        header: &'static str,
    },
    /// One or more records were refused; the whole request is refused with them.
    #[error("{} of the request's records were refused", .0.len())]
    Refused(Vec<RecordRefusal>),
    /// The upstream answered something Lethe cannot check; it is not passed on.
    #[error("the upstream's answer could not be checked: {0}")]
    UpstreamInvalid(String),
}

/// One refused record: its position in the request and why. Deliberately no id or content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRefusal {
    pub index: usize,
    pub refusal: Refusal,
}

/// What the request says about whose data it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope<'a> {
    pub tenant: &'a str,
    /// From the token's `subject` claim or `X-Lethe-Subject`.
    pub subject: Option<&'a str>,
    /// Whether the token itself is bound to that subject (then records may name no other).
    pub bound: bool,
    pub purpose: Option<&'a str>,
    pub category: Option<&'a str>,
    /// Whether the tenant's subject keys are case-insensitive (folded to their one spelling).
    pub fold: bool,
}
