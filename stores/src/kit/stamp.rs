//! The stamp Lethe writes into every item it lets through (Chroma metadata, LangGraph thread
//! metadata and store values), and the request fields every adapter reads the same way.

use chrono::{DateTime, TimeZone, Utc};
use lethe_policy::{Layer, Refusal, Stamp};
use serde_json::{Map, Value, json};

use crate::data::records::{AdapterError, RecordRefusal};

pub const SUBJECT: &str = "lethe_subject";
pub const TENANT: &str = "lethe_tenant";
pub const PURPOSE: &str = "lethe_purpose";
pub const CATEGORY: &str = "lethe_category";
pub const EXPIRES_AT: &str = "lethe_expires_at";
pub const EPOCH: &str = "lethe_epoch";
/// `raw`, or `derived` for an item made from other items (absent: raw).
pub const LAYER: &str = "lethe_layer";
/// Every key of the stamp.
pub const STAMP_KEYS: [&str; 7] = [SUBJECT, TENANT, PURPOSE, CATEGORY, EXPIRES_AT, EPOCH, LAYER];
/// `tenant/subject` beside the stamp, where a store filters best on one selective key (Chroma):
/// an index for finding a subject's items, never what decides who owns one.
pub const OWNER: &str = "lethe_owner";

/// The [`OWNER`] value of a tenant's subject (neither may contain `/`: see
/// `lethe_policy::names::canonical_key`).
pub fn owner(tenant: &str, subject: &str) -> String {
    format!("{tenant}/{subject}")
}

/// A request body that must be a JSON object; an empty body is an empty object.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, AdapterError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(AdapterError::Invalid(
            "the body must be a JSON object".into(),
        )),
        Err(_) => Err(AdapterError::Invalid("the body is not valid JSON".into())),
    }
}

pub fn string_field<'a>(
    meta: Option<&'a Map<String, Value>>,
    key: &str,
    index: usize,
) -> Result<Option<&'a str>, AdapterError> {
    match meta.and_then(|m| m.get(key)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(AdapterError::Invalid(format!(
            "record {index}: {key} must be a string"
        ))),
    }
}

/// The earlier expiry a record asks for (`lethe_expires_at`, Unix seconds), if any.
pub fn requested_expiry(
    meta: Option<&Map<String, Value>>,
    index: usize,
) -> Result<Option<DateTime<Utc>>, AdapterError> {
    match meta.and_then(|m| m.get(EXPIRES_AT)) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_i64()
            .and_then(|s| Utc.timestamp_opt(s, 0).single())
            .map(Some)
            .ok_or_else(|| {
                AdapterError::Invalid(format!(
                    "record {index}: {EXPIRES_AT} must be a Unix time in seconds"
                ))
            }),
    }
}

/// Request-level and record-level values must agree; either may be absent.
pub fn agree(
    index: usize,
    request: Option<&str>,
    record: Option<&str>,
) -> Result<Option<String>, AdapterError> {
    match (request, record) {
        (Some(a), Some(b)) if a != b => Err(AdapterError::Refused(vec![RecordRefusal {
            index,
            refusal: Refusal::ScopeViolation,
        }])),
        (a, b) => Ok(a.or(b).map(str::to_owned)),
    }
}

pub fn write_stamp(meta: &mut Map<String, Value>, stamp: &Stamp) {
    meta.insert(SUBJECT.into(), json!(stamp.subject));
    meta.insert(TENANT.into(), json!(stamp.tenant));
    meta.insert(PURPOSE.into(), json!(stamp.purpose));
    meta.insert(CATEGORY.into(), json!(stamp.category));
    meta.insert(EXPIRES_AT.into(), json!(stamp.expires_at.timestamp()));
    meta.insert(EPOCH.into(), json!(stamp.epoch));
    meta.insert(LAYER.into(), json!(stamp.layer.as_str()));
}

/// The stamp in an item's metadata, if it carries a whole one (one written before layers were
/// stamped is raw).
pub fn read_stamp(meta: &Value) -> Option<Stamp> {
    read_stamp_with(meta, |at| Utc.timestamp_opt(at.as_i64()?, 0).single())
}

/// [`read_stamp`] of a store that holds the deadline in a type of its own, read by `deadline`.
pub fn read_stamp_with(
    meta: &Value,
    deadline: impl Fn(&Value) -> Option<DateTime<Utc>>,
) -> Option<Stamp> {
    let m = meta.as_object()?;
    let text = |k: &str| m.get(k)?.as_str().map(str::to_owned);
    let layer = match m.get(LAYER) {
        None => Layer::Raw,
        Some(layer) => layer.as_str()?.parse().ok()?,
    };
    Some(Stamp {
        tenant: text(TENANT)?,
        subject: text(SUBJECT)?,
        purpose: text(PURPOSE)?,
        category: text(CATEGORY)?,
        layer,
        expires_at: deadline(m.get(EXPIRES_AT)?)?,
        epoch: m.get(EPOCH)?.as_i64()?,
    })
}

/// Whether an item's stamp may be one of the subjects': it names one of them (in `tenant`, a
/// subject `is_one` accepts) as its owner, or names no owner at all (then a person must look, or
/// lineage's word stands).
pub fn may_be_subjects(meta: &Value, tenant: &str, is_one: impl Fn(&str) -> bool) -> bool {
    let owner = || Some((meta.get(TENANT)?.as_str()?, meta.get(SUBJECT)?.as_str()?));
    owner().is_none_or(|(t, s)| t == tenant && is_one(s))
}
