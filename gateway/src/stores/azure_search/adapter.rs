//! The Azure AI Search adapter, pure (issue 26, being built): the stamp fields an index is created
//! with, and what Lethe sends Azure in place of a client's `$filter`. The client's filter is parsed and written again (`odata`), refused when
//! it reads Lethe's stamp fields (`lethe_*`: a client may not select by, or probe, another
//! owner's stamp), and ANDed, in parentheses, with the caller's scope and "not expired": whatever
//! the client wrote, Azure answers no document outside it.

use chrono::{DateTime, SecondsFormat, Utc};

use super::odata::{self, Literal, ODataError};
use crate::data::records::AdapterError;

/// Lethe's stamp fields on every document (filterable, never searchable). No field of a
/// client's, at any depth, may be named so.
pub const TENANT: &str = "lethe_tenant";
pub const SUBJECT: &str = "lethe_subject";
pub const EXPIRES_AT: &str = "lethe_expires_at";
const STAMP_PREFIX: &str = "lethe_";

/// The stamp fields an index is created with, and their types: filterable (the scope is a
/// filter on them), retrievable (answers are decided again on them), never searchable (no text
/// query or `search.ismatch` reaches them), sortable or facetable.
const STAMP_FIELDS: &[(&str, &str)] = &[
    (TENANT, "Edm.String"),
    (SUBJECT, "Edm.String"),
    ("lethe_purpose", "Edm.String"),
    ("lethe_category", "Edm.String"),
    ("lethe_layer", "Edm.String"),
    (EXPIRES_AT, "Edm.DateTimeOffset"),
    ("lethe_epoch", "Edm.Int64"),
];

/// A client's index definition with Lethe's stamp fields added; refused when it is not one, or
/// names a field (at any depth) as Lethe's own.
pub fn with_stamp_fields(
    mut definition: serde_json::Value,
) -> Result<serde_json::Value, AdapterError> {
    fn named_as_stamp(fields: &[serde_json::Value]) -> Option<String> {
        fields.iter().find_map(|f| {
            let name = f.get("name")?.as_str()?;
            match name.starts_with(STAMP_PREFIX) {
                true => Some(name.to_owned()),
                false => named_as_stamp(f.get("fields")?.as_array()?),
            }
        })
    }
    let fields = definition
        .get_mut("fields")
        .and_then(serde_json::Value::as_array_mut)
        .ok_or_else(|| AdapterError::Invalid("an index definition has fields".to_owned()))?;
    if let Some(name) = named_as_stamp(fields) {
        return Err(AdapterError::Invalid(format!(
            "field {name}: names beginning lethe_ are Lethe's stamp"
        )));
    }
    fields.extend(STAMP_FIELDS.iter().map(|(name, kind)| {
        serde_json::json!({
            "name": name, "type": kind, "key": false, "searchable": false, "filterable": true,
            "sortable": false, "facetable": false, "retrievable": true,
        })
    }));
    Ok(definition)
}

/// Whose documents a caller may be answered with.
#[derive(Debug, Clone, Copy)]
pub struct Reader<'a> {
    pub tenant: &'a str,
    /// The subject a bound token (or `X-Lethe-Subject`) names; none: any of the tenant's, each
    /// document decided again on its stamp.
    pub subject: Option<&'a str>,
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
    let deadline = now.to_rfc3339_opts(SecondsFormat::Secs, true);
    scope = format!("({scope}) and ({EXPIRES_AT} gt {deadline})");
    let Some(client) = client.filter(|c| !c.trim().is_empty()) else {
        return Ok(scope);
    };
    let parsed = odata::parse(client)?;
    if let Some(field) = parsed
        .fields()
        .into_iter()
        .find(|f| f.split('/').any(|part| part.starts_with(STAMP_PREFIX)))
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
        };
        assert_eq!(
            narrowed(None, service, now()).unwrap(),
            "(lethe_tenant eq 'ac''me') and (lethe_expires_at gt 2027-01-15T08:00:00Z)"
        );
    }

    #[test]
    fn an_index_is_created_with_the_stamp_fields_and_none_of_a_clients_own() {
        let definition = serde_json::json!({"name": "episodes", "fields": [
            {"name": "id", "type": "Edm.String", "key": true},
            {"name": "text", "type": "Edm.String", "searchable": true},
        ]});
        let stamped = with_stamp_fields(definition).unwrap();
        let fields = stamped["fields"].as_array().unwrap();
        assert_eq!(fields.len(), 2 + STAMP_FIELDS.len());
        for (name, kind) in STAMP_FIELDS {
            let field = fields.iter().find(|f| f["name"] == *name).unwrap();
            assert_eq!(field["type"], *kind);
            assert_eq!(
                (field["filterable"].as_bool(), field["searchable"].as_bool()),
                (Some(true), Some(false))
            );
        }
        for hostile in [
            serde_json::json!({"name": "x", "fields": [{"name": "lethe_subject", "type": "Edm.String"}]}),
            serde_json::json!({"name": "x", "fields": [{"name": "meta", "type": "Edm.ComplexType",
                "fields": [{"name": "lethe_tenant", "type": "Edm.String"}]}]}),
            serde_json::json!({"name": "x"}),
            serde_json::json!(["not", "an", "index"]),
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
