//! An indexing batch (`docs/search.index`): every action read, each write decided on the stamp
//! Azure holds under its key and stamped, each delete kept to the caller's own documents, and
//! the answer in Azure's per-item shape. One refused action refuses the batch.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use lethe_policy::{Overwrite, PolicyView, Refusal, Stamp};
use serde_json::{Map, Value, json};

use super::{EXPIRES_AT, canonical_key, is_stamp_field, stamp_fields};
use crate::data::records::{AdapterError, RecordFacts, RecordRefusal, Scope};
use crate::kit::stamp::string_field;
use crate::kit::text::text_of_fields;
use crate::kit::write::{decide_records, record_facts};

/// The most actions Azure takes in one batch.
pub const MAX_ACTIONS: usize = 1000;

const ACTION: &str = "@search.action";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Upload,
    Merge,
    MergeOrUpload,
    Delete,
}

impl Kind {
    fn parse(name: &str) -> Option<Kind> {
        Some(match name {
            "upload" => Kind::Upload,
            "merge" => Kind::Merge,
            "mergeOrUpload" => Kind::MergeOrUpload,
            "delete" => Kind::Delete,
            _ => return None,
        })
    }
}

/// One action of a batch: its kind, key, and the document's own fields (the client's `lethe_*`
/// ones left out: Lethe writes the stamp).
#[derive(Debug, Clone, PartialEq)]
struct Action {
    kind: Kind,
    key: String,
    fields: Map<String, Value>,
}

/// A parsed batch, waiting for the policy of its subjects and the stamps Azure holds.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedBatch {
    key_field: String,
    actions: Vec<Action>,
    /// The facts of every writing action (`index`: its position in the batch; `id`: its key).
    pub facts: Vec<RecordFacts<String>>,
    /// The actions refused already for what they name (another subject than the token's, say):
    /// the batch is answered with them, per item, and nothing of it is sent.
    pub refused: Vec<RecordRefusal>,
}

impl PlannedBatch {
    /// Every key the batch names.
    pub fn keys(&self) -> Vec<String> {
        self.actions.iter().map(|a| a.key.clone()).collect()
    }

    pub fn subjects(&self) -> BTreeSet<&str> {
        self.facts.iter().map(|f| f.subject.as_str()).collect()
    }

    /// The text of each writing action's document (its `text_fields`, or every string), in the
    /// order of `facts`.
    pub fn texts(&self, text_fields: &[String]) -> Vec<String> {
        self.facts
            .iter()
            .map(|f| text_of_fields(Some(&self.actions[f.index].fields), text_fields))
            .collect()
    }
}

fn invalid(message: impl Into<String>) -> AdapterError {
    AdapterError::Invalid(message.into())
}

/// Parses `{"value": [{"@search.action": ..., <key>: ..., ...}]}`: at most [`MAX_ACTIONS`],
/// each key canonical and named once, and finds each write's subject, purpose and category (from
/// the request, else the document's `lethe_*` fields, else its `subject_field`).
pub fn plan_batch(
    body: &[u8],
    key_field: &str,
    scope: &Scope<'_>,
    subject_field: Option<&str>,
) -> Result<PlannedBatch, AdapterError> {
    let map = crate::kit::stamp::parse_object(body)?;
    if let Some(other) = map.keys().find(|k| k.as_str() != "value") {
        return Err(invalid(format!(
            "{other}: an indexing batch is {{\"value\": [actions]}}"
        )));
    }
    let Some(Value::Array(actions)) = map.get("value") else {
        return Err(invalid("value must be a list of actions"));
    };
    if actions.is_empty() || actions.len() > MAX_ACTIONS {
        return Err(invalid(format!(
            "a batch holds 1 to {MAX_ACTIONS} actions; it held {}",
            actions.len()
        )));
    }
    let mut planned = PlannedBatch {
        key_field: key_field.to_owned(),
        actions: Vec::with_capacity(actions.len()),
        facts: Vec::new(),
        refused: Vec::new(),
    };
    let mut seen = BTreeSet::new();
    for (index, action) in actions.iter().enumerate() {
        let Value::Object(doc) = action else {
            return Err(invalid(format!("value[{index}] must be an object")));
        };
        let kind = match doc.get(ACTION) {
            None => Kind::Upload,
            Some(Value::String(name)) => Kind::parse(name).ok_or_else(|| {
                invalid(format!(
                    "value[{index}]: {ACTION} is upload, merge, mergeOrUpload or delete"
                ))
            })?,
            Some(_) => return Err(invalid(format!("value[{index}]: {ACTION} is a string"))),
        };
        if let Some(other) = doc
            .keys()
            .find(|k| k.starts_with('@') && k.as_str() != ACTION)
        {
            return Err(invalid(format!(
                "value[{index}]: {other} is not passed through Lethe"
            )));
        }
        let key = match doc.get(key_field) {
            Some(Value::String(key)) if canonical_key(key) => key.clone(),
            _ => {
                return Err(invalid(format!(
                    "value[{index}]: the key {key_field} must be letters, digits, '_', '-' and '=' (not beginning with '_')"
                )));
            }
        };
        if !seen.insert(key.clone()) {
            return Err(invalid("a batch names each key once"));
        }
        let fields: Map<String, Value> = doc
            .iter()
            .filter(|(k, _)| !is_stamp_field(k) && k.as_str() != ACTION)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if kind != Kind::Delete {
            let meta = facts_fields(doc, index)?;
            let named = match subject_field {
                Some(field) => string_field(Some(doc), field, index)?,
                None => None,
            };
            match record_facts(index, key.clone(), scope, Some(&meta), named) {
                Ok(facts) => planned.facts.push(facts),
                Err(AdapterError::Refused(refused)) => planned.refused.extend(refused),
                Err(e) => return Err(e),
            }
        }
        planned.actions.push(Action { kind, key, fields });
    }
    Ok(planned)
}

/// The `lethe_*` fields of a document, as the kit reads a record's: its deadline, an
/// `Edm.DateTimeOffset` here, as Unix seconds.
fn facts_fields(
    doc: &Map<String, Value>,
    index: usize,
) -> Result<Map<String, Value>, AdapterError> {
    let mut meta: Map<String, Value> = doc
        .iter()
        .filter(|(k, _)| is_stamp_field(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(Value::String(at)) = meta.get(EXPIRES_AT) {
        let at = DateTime::parse_from_rfc3339(at).map_err(|_| {
            invalid(format!(
                "value[{index}]: {EXPIRES_AT} must be a date-time (2027-01-15T08:00:00Z)"
            ))
        })?;
        meta.insert(EXPIRES_AT.into(), json!(at.timestamp()));
    }
    Ok(meta)
}

/// A batch every action of which was allowed: what is sent to Azure, and what Lethe answers
/// itself.
#[derive(Debug, Clone, PartialEq)]
pub struct DecidedBatch {
    /// The batch Azure is sent (`None`: nothing to send).
    pub body: Option<Vec<u8>>,
    /// Each key written, with its stamp.
    pub stamps: Vec<(String, Stamp)>,
    /// Each key deleted.
    pub deleted: Vec<String>,
    /// Every key of the client's batch, in its order, and whether Azure is sent its action (a
    /// delete of a document that is not the caller's is not: it is answered as Azure answers a
    /// delete of a key it does not hold).
    pub order: Vec<(String, bool)>,
}

/// Decides every action: each write on what Azure holds under its key (`held`; absent: free),
/// each delete kept to the documents the caller's scope owns. One refusal refuses the batch.
pub fn decide_batch(
    planned: PlannedBatch,
    scope: &Scope<'_>,
    view: &impl PolicyView,
    held: &BTreeMap<String, Option<Stamp>>,
    now: DateTime<Utc>,
) -> Result<DecidedBatch, AdapterError> {
    let decided = decide_records(
        &planned.facts,
        scope.tenant,
        view,
        held,
        Overwrite::Allowed,
        now,
    )?;
    let mut stamp_of: BTreeMap<usize, Stamp> = BTreeMap::new();
    for (fact, stamp) in planned.facts.iter().zip(decided) {
        // An upload always writes (`Overwrite::Allowed`): none is left out.
        let stamp = stamp.ok_or(AdapterError::Refused(vec![RecordRefusal {
            index: fact.index,
            refusal: Refusal::AlreadyExists,
        }]))?;
        stamp_of.insert(fact.index, stamp);
    }
    let caller_owns = |key: &str| {
        held.get(key).and_then(Option::as_ref).is_some_and(|s| {
            s.tenant == scope.tenant && scope.subject.is_none_or(|subject| s.subject == subject)
        })
    };
    let mut sent = Vec::new();
    let mut batch = DecidedBatch {
        body: None,
        stamps: Vec::new(),
        deleted: Vec::new(),
        order: Vec::new(),
    };
    let key_field = planned.key_field;
    for (index, action) in planned.actions.into_iter().enumerate() {
        let Action {
            kind,
            key,
            mut fields,
        } = action;
        let name = match kind {
            Kind::Upload => "upload",
            Kind::Merge => "merge",
            Kind::MergeOrUpload => "mergeOrUpload",
            Kind::Delete => "delete",
        };
        if kind == Kind::Delete {
            let owned = caller_owns(&key);
            batch.order.push((key.clone(), owned));
            if owned {
                sent.push(json!({ ACTION: name, key_field.as_str(): key }));
                batch.deleted.push(key);
            }
            continue;
        }
        let Some(stamp) = stamp_of.remove(&index) else {
            continue;
        };
        fields.extend(stamp_fields(&stamp));
        fields.insert(ACTION.into(), json!(name));
        sent.push(Value::Object(fields));
        batch.order.push((key.clone(), true));
        batch.stamps.push((key, stamp));
    }
    if !sent.is_empty() {
        batch.body = Some(serde_json::to_vec(&json!({ "value": sent })).unwrap_or_default());
    }
    Ok(batch)
}

/// One action's result in Azure's shape.
fn item(key: &str, status: u16, message: Option<String>) -> Value {
    json!({ "key": key, "status": status < 300, "errorMessage": message, "statusCode": status })
}

/// Lethe's answer to an allowed batch: Azure's result of each action it was sent, and for each
/// it was not (a delete of a document that is not the caller's) the result Azure gives a delete
/// of a key it does not hold; 200 when every action succeeded, 207 otherwise.
pub fn batch_answer(
    order: &[(String, bool)],
    azure: Option<&Value>,
) -> Result<(u16, Value), AdapterError> {
    let mut results: BTreeMap<&str, &Value> = BTreeMap::new();
    for result in azure
        .map(|a| {
            a["value"]
                .as_array()
                .ok_or_else(|| AdapterError::UpstreamInvalid("a batch answer without value".into()))
        })
        .transpose()?
        .into_iter()
        .flatten()
    {
        let key = result["key"]
            .as_str()
            .ok_or_else(|| AdapterError::UpstreamInvalid("a result without its key".into()))?;
        results.insert(key, result);
    }
    let mut value = Vec::with_capacity(order.len());
    for (key, sent) in order {
        value.push(match (sent, results.get(key.as_str())) {
            (false, _) => item(key, 200, None),
            (true, Some(result)) => (*result).clone(),
            (true, None) => {
                return Err(AdapterError::UpstreamInvalid(
                    "a batch answer without a sent key".into(),
                ));
            }
        });
    }
    let all = value.iter().all(|v| v["status"] == true);
    Ok((if all { 200 } else { 207 }, json!({ "value": value })))
}

/// An allowed batch's answer once a flip overtook it in flight: the actions whose documents
/// were deleted again (`gone`) answered as refused with the flip's `code`; 207.
pub fn overtaken(mut answer: Value, gone: &[String], code: &str, message: &str) -> (u16, Value) {
    for result in answer["value"].as_array_mut().into_iter().flatten() {
        if let Some(key) = result["key"]
            .as_str()
            .filter(|k| gone.iter().any(|g| g == k))
        {
            *result = item(key, 403, Some(format!("lethe {code}: {message}")));
        }
    }
    let all = answer["value"]
        .as_array()
        .is_some_and(|v| v.iter().all(|r| r["status"] == true));
    (if all { 200 } else { 207 }, answer)
}

/// The answer to a refused batch, in Azure's per-item shape (its status 207): each refused
/// action with 403 and Lethe's code, every other one with 400, not indexed because of them.
pub fn refused_answer(keys: &[String], refused: &[RecordRefusal]) -> Value {
    let value: Vec<Value> = keys
        .iter()
        .enumerate()
        .map(
            |(index, key)| match refused.iter().find(|r| r.index == index) {
                Some(r) => item(
                    key,
                    403,
                    Some(format!(
                        "lethe {}: {} (action {index})",
                        r.refusal.code(),
                        r.refusal
                    )),
                ),
                None => item(
                    key,
                    400,
                    Some("lethe: not indexed; another action of the batch was refused".into()),
                ),
            },
        )
        .collect();
    json!({ "value": value })
}

#[cfg(test)]
mod tests;
