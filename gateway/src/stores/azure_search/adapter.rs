//! The Azure AI Search adapter, pure (issue 26, being built): what Lethe sends Azure in place of
//! a client's `$filter`. The client's filter is parsed and written again (`odata`), refused when
//! it reads Lethe's stamp fields (`lethe_*`: a client may not select by, or probe, another
//! owner's stamp), and ANDed, in parentheses, with the caller's scope and "not expired": whatever
//! the client wrote, Azure answers no document outside it.

use chrono::{DateTime, SecondsFormat, Utc};

use super::odata::{self, Literal, ODataError};

/// Lethe's stamp fields on every document (filterable, never searchable). No field of a
/// client's, at any depth, may be named so.
pub const TENANT: &str = "lethe_tenant";
pub const SUBJECT: &str = "lethe_subject";
pub const EXPIRES_AT: &str = "lethe_expires_at";
const STAMP_PREFIX: &str = "lethe_";

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
