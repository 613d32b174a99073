//! What a request's records are to the data plane, whatever the store: whose data the request
//! says it is about ([`Scope`]), the facts of one record of a write ([`RecordFacts`]), and why
//! a store's adapter could not accept a request or an answer ([`AdapterError`]).

use chrono::{DateTime, Utc};
use lethe_policy::Layer;
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

/// One record of a write, with the facts its decision needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordFacts<Id> {
    pub index: usize,
    pub id: Id,
    pub subject: String,
    pub purpose: String,
    pub category: String,
    pub requested_expires_at: Option<DateTime<Utc>>,
    /// `derived` once the record is found to be made from other items (raw until then).
    pub layer: Layer,
}
