//! The Azure AI Search adapter, pure: which endpoint a request is (`endpoint`), the stamp fields
//! an index is created with and every document carries, what Lethe sends Azure in place of a
//! client's `$filter`, how an indexing batch is decided and stamped (`write`), and how reads are
//! narrowed and their answers decided again (`read`).
//!
//! The client's filter is parsed and written again (`odata`), refused when it reads Lethe's
//! stamp fields (`lethe_*`: a client may not select by, or probe, another owner's stamp), and
//! ANDed, in parentheses, with the caller's scope and "not expired": whatever the client wrote,
//! Azure answers no document outside it.

pub mod endpoint;
pub mod read;
pub mod readable;
pub mod write;

use chrono::{DateTime, SecondsFormat, Utc};
use lethe_policy::Stamp;
use serde_json::{Map, Value, json};

use super::odata::{self, Literal, ODataError};
use crate::data::records::AdapterError;
use crate::kit::stamp::{CATEGORY, EPOCH, LAYER, PURPOSE, STAMP_KEYS, read_stamp_with};
pub use crate::kit::stamp::{EXPIRES_AT, SUBJECT, TENANT};

/// Every stamp field begins so. No field of a client's, at any depth, may.
pub const STAMP_PREFIX: &str = "lethe_";

/// Whether a field name (or a path's segment) is Lethe's.
pub fn is_stamp_field(name: &str) -> bool {
    name.starts_with(STAMP_PREFIX)
}

/// The stamp fields of a document, as an index created through Lethe types them (the deadline
/// an `Edm.DateTimeOffset` in UTC).
pub fn stamp_fields(stamp: &Stamp) -> Map<String, Value> {
    let mut fields = Map::new();
    fields.insert(TENANT.into(), json!(stamp.tenant));
    fields.insert(SUBJECT.into(), json!(stamp.subject));
    fields.insert(PURPOSE.into(), json!(stamp.purpose));
    fields.insert(CATEGORY.into(), json!(stamp.category));
    fields.insert(LAYER.into(), json!(stamp.layer.as_str()));
    fields.insert(EXPIRES_AT.into(), json!(date_time(stamp.expires_at)));
    fields.insert(EPOCH.into(), json!(stamp.epoch));
    fields
}

/// A date-time as Lethe writes it to Azure: UTC, whole seconds (as every store holds a deadline).
pub fn date_time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The stamp a document Azure answered carries, if it carries a whole one (its deadline an
/// `Edm.DateTimeOffset`).
pub fn read_stamp(doc: &Value) -> Option<Stamp> {
    read_stamp_with(doc, |at| {
        DateTime::parse_from_rfc3339(at.as_str()?)
            .ok()
            .map(|at| at.with_timezone(&Utc))
    })
}

/// Whether a document key is one Azure takes: letters, digits, `_`, `-` and `=`, not beginning
/// with `_`, at most 1 024 characters. Nothing else is passed on, or built into a filter.
pub fn canonical_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 1024
        && !key.starts_with('_')
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'='))
}

/// Whether a field name is one Azure takes: a letter first, then letters, digits and `_`.
pub fn canonical_field(name: &str) -> bool {
    name.len() <= 128
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The filter that selects the documents under `keys` (canonical keys: no quote or comma can
/// reach it), in `key_field`.
pub fn keys_filter(key_field: &str, keys: &[String]) -> String {
    format!("search.in({key_field}, '{}', ',')", keys.join(","))
}

/// What Lethe reads of every document besides what the client asked for: its key and stamp.
pub fn stamp_select(key_field: &str) -> Vec<String> {
    std::iter::once(key_field.to_owned())
        .chain(STAMP_KEYS.iter().map(|k| (*k).to_owned()))
        .collect()
}

/// A client's index definition as the client sees it: Lethe's stamp fields left out (they are
/// added again to whatever definition it sends back).
pub fn without_stamp_fields(mut definition: Value) -> Value {
    if let Some(Value::Array(fields)) = definition.get_mut("fields") {
        fields.retain(|f| !f["name"].as_str().is_some_and(is_stamp_field));
    }
    definition
}

/// What Lethe needs of an index to serve it: its key field, and whether it was made with the
/// stamp fields and a filterable key (an index made around Lethe cannot be governed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexInfo {
    pub key: String,
    pub stamped: bool,
    /// Whether its subject field is facetable (an index made before Lethe counted by subject
    /// is not: what is computed over its documents is refused for a caller bound to no subject).
    pub subjects_facetable: bool,
}

/// An index definition Azure answered, read.
pub fn index_info(definition: &Value) -> Result<IndexInfo, AdapterError> {
    let fields = definition["fields"]
        .as_array()
        .ok_or_else(|| AdapterError::UpstreamInvalid("an index without fields".into()))?;
    let key = fields
        .iter()
        .find(|f| f["key"] == true)
        .ok_or_else(|| AdapterError::UpstreamInvalid("an index without a key field".into()))?;
    let name = key["name"]
        .as_str()
        .filter(|k| canonical_field(k))
        .ok_or_else(|| AdapterError::UpstreamInvalid("a key field without a name".into()))?;
    let stamped = key["filterable"] != false
        && STAMP_FIELDS
            .iter()
            .all(|(name, _)| fields.iter().any(|f| f["name"] == *name));
    let subjects_facetable = fields
        .iter()
        .any(|f| f["name"] == SUBJECT && f["facetable"] == true);
    Ok(IndexInfo {
        key: name.to_owned(),
        stamped,
        subjects_facetable,
    })
}

/// The stamp fields an index is created with, and their types: filterable (the scope is a
/// filter on them), retrievable (answers are decided again on them), never searchable (no text
/// query or `search.ismatch` reaches them) or sortable. Only the subject is facetable: Lethe
/// learns which subjects a scope holds from it (no client request may name a stamp field).
const STAMP_FIELDS: &[(&str, &str)] = &[
    (TENANT, "Edm.String"),
    (SUBJECT, "Edm.String"),
    (PURPOSE, "Edm.String"),
    (CATEGORY, "Edm.String"),
    (LAYER, "Edm.String"),
    (EXPIRES_AT, "Edm.DateTimeOffset"),
    (EPOCH, "Edm.Int64"),
];

/// A client's index definition with Lethe's stamp fields added, and its key field made
/// filterable (Lethe reads what Azure holds under a batch's keys, and leaves hidden documents
/// out by key); refused when it is not one, or names a `lethe_*` anything anywhere in it: a
/// field (at any depth), or a suggester's, a scoring profile's or a semantic configuration's
/// field (a suggester on `lethe_subject` would answer the stamp's values).
pub fn with_stamp_fields(
    mut definition: serde_json::Value,
) -> Result<serde_json::Value, AdapterError> {
    if let Some(name) = names_stamp(&definition) {
        return Err(AdapterError::Invalid(format!(
            "{name}: names beginning lethe_ are Lethe's stamp"
        )));
    }
    let fields = definition
        .get_mut("fields")
        .and_then(serde_json::Value::as_array_mut)
        .ok_or_else(|| AdapterError::Invalid("an index definition has fields".to_owned()))?;
    for field in fields.iter_mut().filter(|f| f["key"] == true) {
        field["filterable"] = json!(true);
    }
    fields.extend(STAMP_FIELDS.iter().map(|(name, kind)| {
        serde_json::json!({
            "name": name, "type": kind, "key": false, "searchable": false, "filterable": true,
            "sortable": false, "facetable": *name == SUBJECT, "retrievable": true,
        })
    }));
    Ok(definition)
}

/// The first key or text in `value`, at any depth, that names a stamp field. Iterative: a
/// client's nesting is bounded by the JSON parser, not by this stack.
fn names_stamp(value: &serde_json::Value) -> Option<String> {
    let mut pending = vec![value];
    while let Some(value) = pending.pop() {
        match value {
            serde_json::Value::String(text) if is_stamp_field(text) => return Some(text.clone()),
            serde_json::Value::Array(items) => pending.extend(items),
            serde_json::Value::Object(map) => {
                if let Some(key) = map.keys().find(|key| is_stamp_field(key)) {
                    return Some(key.clone());
                }
                pending.extend(map.values());
            }
            _ => {}
        }
    }
    None
}

/// Whose documents a caller may be answered with.
#[derive(Debug, Clone, Copy)]
pub struct Reader<'a> {
    pub tenant: &'a str,
    /// The subject a bound token (or `X-Lethe-Subject`) names; none: any of the tenant's, each
    /// document decided again on its stamp.
    pub subject: Option<&'a str>,
    /// The purpose the caller reads for (`X-Lethe-Purpose` or the route's), if it names one.
    pub purpose: Option<&'a str>,
}

/// The filter Azure is sent for a read by `reader` at `now`, given the client's own (if any).
pub fn narrowed(
    client: Option<&str>,
    reader: Reader<'_>,
    now: DateTime<Utc>,
) -> Result<String, ODataError> {
    let text = |value: &str| Literal::Str(value.to_owned()).to_string();
    let mut scope = format!("{TENANT} eq {}", text(reader.tenant));
    if let Some(subject) = reader.subject {
        scope = format!("({scope}) and ({SUBJECT} eq {})", text(subject));
    }
    if let Some(purpose) = reader.purpose {
        scope = format!("({scope}) and ({PURPOSE} eq {})", text(purpose));
    }
    let deadline = date_time(now);
    scope = format!("({scope}) and ({EXPIRES_AT} gt {deadline})");
    let Some(client) = client.filter(|c| !c.trim().is_empty()) else {
        return Ok(scope);
    };
    let parsed = odata::parse(client)?;
    if let Some(field) = parsed
        .fields()
        .into_iter()
        .find(|f| f.split('/').any(is_stamp_field))
    {
        return Err(ODataError(format!(
            "{field} is Lethe's stamp: filters may not read it"
        )));
    }
    Ok(format!("({parsed}) and ({scope})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn now() -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000, 0).unwrap()
    }

    const ALICE: Reader<'static> = Reader {
        tenant: "acme",
        subject: Some("alice"),
        purpose: None,
    };

    #[test]
    fn the_callers_scope_is_anded_whatever_the_client_wrote() {
        let scope = "((lethe_tenant eq 'acme') and (lethe_subject eq 'alice')) and (lethe_expires_at gt 2027-01-15T08:00:00Z)";
        let cases: &[(Option<&str>, String)] = &[
            (None, scope.to_owned()),
            (Some("  "), scope.to_owned()),
            (Some("n gt 1"), format!("(n gt 1) and ({scope})")),
            // Attempts to widen stay inside their own parentheses.
            (
                Some("n gt 1 or true"),
                format!("((n gt 1) or (true)) and ({scope})"),
            ),
            (
                Some("true or n gt 1"),
                format!("((true) or (n gt 1)) and ({scope})"),
            ),
            (
                Some("user eq 'x'' or lethe_tenant ne ''acme'"),
                format!("(user eq 'x'' or lethe_tenant ne ''acme') and ({scope})"),
            ),
        ];
        for (client, expected) in cases {
            assert_eq!(
                narrowed(*client, ALICE, now()).as_deref(),
                Ok(expected.as_str()),
                "{client:?}"
            );
            // What Azure is sent parses, and reads the scope.
            let sent = odata::parse(expected).unwrap();
            assert!(sent.fields().contains(&TENANT.to_owned()));
        }
        let service = Reader {
            tenant: "ac'me",
            subject: None,
            purpose: Some("support"),
        };
        assert_eq!(
            narrowed(None, service, now()).unwrap(),
            "((lethe_tenant eq 'ac''me') and (lethe_purpose eq 'support')) and (lethe_expires_at gt 2027-01-15T08:00:00Z)"
        );
    }

    #[test]
    fn an_index_is_created_with_the_stamp_fields_and_none_of_a_clients_own() {
        let definition = serde_json::json!({"name": "episodes", "fields": [
            {"name": "id", "type": "Edm.String", "key": true, "filterable": false},
            {"name": "text", "type": "Edm.String", "searchable": true},
        ]});
        let stamped = with_stamp_fields(definition).unwrap();
        let fields = stamped["fields"].as_array().unwrap();
        assert_eq!(fields.len(), 2 + STAMP_FIELDS.len());
        assert_eq!(fields[0]["filterable"], true, "the key is filtered on");
        assert_eq!(
            index_info(&stamped).unwrap(),
            IndexInfo {
                key: "id".into(),
                stamped: true,
                subjects_facetable: true,
            }
        );
        for (name, kind) in STAMP_FIELDS {
            let field = fields.iter().find(|f| f["name"] == *name).unwrap();
            assert_eq!(field["type"], *kind);
            assert_eq!(
                (field["filterable"].as_bool(), field["searchable"].as_bool()),
                (Some(true), Some(false))
            );
            assert_eq!(field["facetable"], *name == SUBJECT, "{name}");
        }
        for hostile in [
            serde_json::json!({"name": "x", "fields": [{"name": "lethe_subject", "type": "Edm.String"}]}),
            serde_json::json!({"name": "x", "fields": [{"name": "meta", "type": "Edm.ComplexType",
                "fields": [{"name": "lethe_tenant", "type": "Edm.String"}]}]}),
            serde_json::json!({"name": "x"}),
            serde_json::json!(["not", "an", "index"]),
            // Row 13: a suggester or a scoring profile on the stamp answers its values.
            serde_json::json!({"name": "x", "fields": [{"name": "id", "type": "Edm.String", "key": true}],
                "suggesters": [{"name": "s", "searchMode": "analyzingInfixMatching",
                    "sourceFields": ["lethe_subject"]}]}),
            serde_json::json!({"name": "x", "fields": [{"name": "id", "type": "Edm.String", "key": true}],
                "scoringProfiles": [{"name": "p", "text": {"weights": {"lethe_tenant": 5}}}]}),
            serde_json::json!({"name": "x", "fields": [{"name": "id", "type": "Edm.String", "key": true}],
                "scoringProfiles": [{"name": "p", "functions": [{"type": "freshness",
                    "fieldName": "lethe_expires_at", "boost": 2}]}]}),
        ] {
            assert!(with_stamp_fields(hostile.clone()).is_err(), "{hostile}");
        }
    }

    #[test]
    fn a_filter_that_reads_the_stamp_or_does_not_parse_is_refused() {
        for refused in [
            "lethe_tenant ne 'acme'",
            "n gt 1 or lethe_subject eq 'bob'",
            "search.ismatch('bob', 'lethe_subject')",
            "search.in(lethe_subject, 'alice,bob')",
            "lethe_expires_at gt 2000-01-01T00:00:00Z",
            "docs/any(d: d/lethe_subject eq 'bob')",
            "(n gt 1",
            "n gt 1)",
            "n gt 1) or (true",
            "user eq 'x",
            "user eq \"x\"",
        ] {
            assert!(narrowed(Some(refused), ALICE, now()).is_err(), "{refused}");
        }
    }
}
