//! What the writes of every record store share: the facts of one record, read from the request
//! and the record's own `lethe_*` fields, and the decision of all of a write's records at once.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use lethe_policy::{
    Action, Held, Layer, Overwrite, PolicyView, Refusal, Stamp, WriteFacts, decide_write_over,
};
use serde_json::{Map, Value};

use super::stamp::{CATEGORY, PURPOSE, SUBJECT, agree, requested_expiry, string_field};
use crate::data::records::{AdapterError, RecordFacts, RecordRefusal, Scope};

/// The facts of record `index`: subject, purpose and category from the request, else from the
/// record's `lethe_*` fields in `meta` (and, for the subject, from `named`: the value of a key of
/// the app's own that names it); where both say, they must agree. A record of a token bound to a
/// subject may name no other.
pub fn record_facts<Id>(
    index: usize,
    id: Id,
    scope: &Scope<'_>,
    meta: Option<&Map<String, Value>>,
    named: Option<&str>,
) -> Result<RecordFacts<Id>, AdapterError> {
    // What a record names is brought to its one spelling first: `carol` decomposed is `carol`.
    let canonical = |value: Option<&str>, what: &str, fold: bool| {
        value
            .map(|v| {
                lethe_policy::names::canonical_key(v, fold)
                    .map(std::borrow::Cow::into_owned)
                    .map_err(|e| AdapterError::Invalid(format!("record {index}: {what} {e}")))
            })
            .transpose()
    };
    let stamped = canonical(string_field(meta, SUBJECT, index)?, "subject", scope.fold)?;
    let named = canonical(named, "subject", scope.fold)?;
    let record_subject = agree(index, stamped.as_deref(), named.as_deref())?;
    let record_subject = record_subject.as_deref();
    if scope.bound && record_subject.is_some_and(|s| Some(s) != scope.subject) {
        return Err(AdapterError::Refused(vec![RecordRefusal {
            index,
            refusal: Refusal::ScopeViolation,
        }]));
    }
    let missing = |what, header| AdapterError::MissingScope {
        index,
        what,
        header,
    };
    Ok(RecordFacts {
        index,
        id,
        subject: agree(index, scope.subject, record_subject)?
            .ok_or_else(|| missing("subject", "Subject"))?,
        purpose: agree(
            index,
            scope.purpose,
            canonical(string_field(meta, PURPOSE, index)?, "purpose", false)?.as_deref(),
        )?
        .ok_or_else(|| missing("purpose", "Purpose"))?,
        category: agree(
            index,
            scope.category,
            canonical(string_field(meta, CATEGORY, index)?, "category", false)?.as_deref(),
        )?
        .ok_or_else(|| missing("category", "Category"))?,
        requested_expires_at: requested_expiry(meta, index)?,
        layer: Layer::Raw,
    })
}

/// Decides every record over what the store holds under its id (`held`; absent: free); one
/// refusal refuses them all. `None` for a record the write must leave out.
pub fn decide_records<Id: Ord>(
    records: &[RecordFacts<Id>],
    tenant: &str,
    view: &impl PolicyView,
    held: &BTreeMap<Id, Option<Stamp>>,
    overwrite: Overwrite,
    now: DateTime<Utc>,
) -> Result<Vec<Option<Stamp>>, AdapterError> {
    let mut refused = Vec::new();
    let mut decided = Vec::with_capacity(records.len());
    for r in records {
        let facts = WriteFacts {
            tenant,
            subject: &r.subject,
            purpose: &r.purpose,
            category: &r.category,
            layer: r.layer,
            action: Action::Store,
            authorised_epoch: None,
            requested_expires_at: r.requested_expires_at,
        };
        let on = Held::of(held.get(&r.id).map(Option::as_ref));
        match decide_write_over(view, &facts, on, overwrite, now) {
            Ok(stamp) => decided.push(stamp),
            Err(refusal) => refused.push(RecordRefusal {
                index: r.index,
                refusal,
            }),
        }
    }
    if refused.is_empty() {
        Ok(decided)
    } else {
        Err(AdapterError::Refused(refused))
    }
}
