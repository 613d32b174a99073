//! Reads (`search`, `suggest`, `autocomplete`, `$count`, a lookup by key): the request narrowed
//! to the caller's scope, and every document of the answer decided again on its stamp.
//!
//! What Azure computes over many documents (`@odata.count`, `@search.facets`, autocomplete's
//! terms) cannot be decided document by document: for those, Azure is sent what the caller may
//! read as a filter ([`super::readable`]), so that it computes them over that alone.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use lethe_policy::{PolicyView, ReadContext, decide_read_item};
use serde_json::{Map, Value, json};

use super::{Reader, canonical_field, is_stamp_field, narrowed, read_stamp, stamp_select};
use crate::data::records::AdapterError;

/// The most documents one page of Lethe's own reads holds (Azure's `top` at most).
pub const PAGE: usize = 1000;
/// The furthest Azure pages with `skip`: a set larger than this and a page cannot be read
/// whole.
pub const MAX_SKIP: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Search,
    Suggest,
    Autocomplete,
}

impl Kind {
    /// The body keys each read takes through Lethe (Azure's own, less what Lethe cannot
    /// decide: semantic `answers` quote documents outside the page, `debug` explains scores).
    fn keys(self) -> &'static [&'static str] {
        match self {
            Kind::Search => &[
                "search",
                "filter",
                "select",
                "top",
                "skip",
                "count",
                "orderby",
                "searchFields",
                "searchMode",
                "queryType",
                "scoringProfile",
                "scoringParameters",
                "scoringStatistics",
                "sessionId",
                "facets",
                "highlight",
                "highlightPreTag",
                "highlightPostTag",
                "minimumCoverage",
                "vectorQueries",
                "vectorFilterMode",
                "semanticConfiguration",
                "semanticQuery",
                "semanticErrorHandling",
                "semanticMaxWaitInMilliseconds",
                "queryLanguage",
                "speller",
                "captions",
                "hybridSearch",
            ],
            Kind::Suggest => &[
                "search",
                "suggesterName",
                "filter",
                "select",
                "top",
                "fuzzy",
                "searchFields",
                "orderby",
                "highlightPreTag",
                "highlightPostTag",
                "minimumCoverage",
            ],
            Kind::Autocomplete => &[
                "search",
                "suggesterName",
                "autocompleteMode",
                "filter",
                "fuzzy",
                "searchFields",
                "top",
                "highlightPreTag",
                "highlightPostTag",
                "minimumCoverage",
            ],
        }
    }
}

fn invalid(message: impl Into<String>) -> AdapterError {
    AdapterError::Invalid(message.into())
}

/// The body a GET's query parameters stand for (its `api-version` aside), as the POST form
/// writes it: `$filter` is `filter`, `facet` a list of one, numbers and booleans typed.
pub fn body_of_query(kind: Kind, query: &str) -> Result<Map<String, Value>, AdapterError> {
    let mut body = Map::new();
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        let key = match name.as_ref() {
            "api-version" => continue,
            "facet" => "facets",
            other => other.strip_prefix('$').unwrap_or(other),
        };
        let typed = match key {
            "top" | "skip" => value
                .parse::<u64>()
                .map(|n| json!(n))
                .map_err(|_| invalid(format!("{name} must be a whole number")))?,
            "minimumCoverage" => value
                .parse::<f64>()
                .map(|n| json!(n))
                .map_err(|_| invalid(format!("{name} must be a number")))?,
            "count" | "fuzzy" => match value.as_ref() {
                "true" => json!(true),
                "false" => json!(false),
                _ => return Err(invalid(format!("{name} must be true or false"))),
            },
            "facets" => json!([value]),
            _ => json!(value),
        };
        if !kind.keys().contains(&key) {
            return Err(invalid(format!("{name} is not passed through Lethe")));
        }
        body.insert(key.to_owned(), typed);
    }
    Ok(body)
}

/// A read narrowed to the caller's scope, waiting for its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Read {
    kind: Kind,
    /// The request as the client sent it (what `@search.nextPageParameters` gives back).
    client: Map<String, Value>,
    /// The fields the client selected (`None`: every retrievable one, or the key for suggest).
    select: Option<Vec<String>>,
    /// The client's filter AND the caller's scope.
    filter: String,
}

/// The field names a comma list (`select`, `searchFields`, `highlight`, `orderby`'s clauses,
/// a vector query's `fields`) or a list of strings names.
fn names(value: &Value, what: &str) -> Result<Vec<String>, AdapterError> {
    let listed: Vec<String> = match value {
        Value::Null => Vec::new(),
        Value::String(s) => s.split(',').map(|n| n.trim().to_owned()).collect(),
        Value::Array(items) => items
            .iter()
            .map(|n| n.as_str().map(|n| n.trim().to_owned()))
            .collect::<Option<_>>()
            .ok_or_else(|| invalid(format!("{what} is a list of field names")))?,
        _ => return Err(invalid(format!("{what} is a list of field names"))),
    };
    Ok(listed.into_iter().filter(|n| !n.is_empty()).collect())
}

/// Refuses a request naming Lethe's stamp where a field goes: no client sorts, facets,
/// highlights, searches or selects by another owner's stamp.
fn no_stamp_named(body: &Map<String, Value>) -> Result<(), AdapterError> {
    let mut named: Vec<String> = Vec::new();
    for key in ["select", "searchFields", "highlight", "orderby"] {
        if let Some(value) = body.get(key) {
            named.extend(names(value, key)?);
        }
    }
    if let Some(facets) = body.get("facets") {
        for facet in facets
            .as_array()
            .ok_or_else(|| invalid("facets is a list of facet expressions"))?
        {
            let facet = facet
                .as_str()
                .ok_or_else(|| invalid("facets is a list of facet expressions"))?;
            named.push(facet.split(',').next().unwrap_or_default().to_owned());
        }
    }
    for query in body
        .get("vectorQueries")
        .map(|q| {
            q.as_array()
                .ok_or_else(|| invalid("vectorQueries is a list"))
        })
        .transpose()?
        .into_iter()
        .flatten()
    {
        if query.get("filterOverride").is_some() {
            return Err(invalid(
                "vectorQueries: filterOverride is not passed through Lethe (the request's filter applies to every query)",
            ));
        }
        named.extend(names(
            query.get("fields").unwrap_or(&Value::Null),
            "fields",
        )?);
    }
    // An `orderby` clause or a name with more than a field (`geo.distance(...)`, `desc`):
    // every identifier in it counts.
    let stamp = named
        .iter()
        .flat_map(|n| n.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
        .find(|part| is_stamp_field(part));
    match stamp {
        Some(field) => Err(invalid(format!(
            "{field} is Lethe's stamp: a request may not name it"
        ))),
        None => Ok(()),
    }
}

/// Reads a client's request (a POST body, or the body of a GET's query) and narrows it.
pub fn plan_read(
    kind: Kind,
    client: Map<String, Value>,
    reader: Reader<'_>,
    now: DateTime<Utc>,
) -> Result<Read, AdapterError> {
    if let Some(other) = client.keys().find(|k| !kind.keys().contains(&k.as_str())) {
        return Err(invalid(format!("{other} is not passed through Lethe")));
    }
    no_stamp_named(&client)?;
    let filter = match client.get("filter") {
        None | Some(Value::Null) => None,
        Some(Value::String(filter)) => Some(filter.as_str()),
        Some(_) => return Err(invalid("filter is an OData expression")),
    };
    let filter = narrowed(filter, reader, now).map_err(|e| invalid(format!("filter: {}", e.0)))?;
    let select = match client.get("select") {
        None | Some(Value::Null) => None,
        Some(value) => Some(names(value, "select")?),
    }
    .filter(|s| !s.iter().any(|n| n == "*"));
    if let Some(bad) = select.iter().flatten().find(|n| !canonical_field(n)) {
        return Err(invalid(format!("select: {bad:?} is not a field name")));
    }
    Ok(Read {
        kind,
        client,
        select,
        filter,
    })
}

impl Read {
    /// Whether Azure computes something over many documents here (a count, facets, terms):
    /// then the documents the caller may not see are left out by key first.
    pub fn computes_over_documents(&self) -> bool {
        self.kind == Kind::Autocomplete
            || self.client.get("count") == Some(&json!(true))
            || self
                .client
                .get("facets")
                .and_then(Value::as_array)
                .is_some_and(|f| !f.is_empty())
    }

    /// The filter of the caller's scope (and the client's own filter).
    pub fn filter(&self) -> &str {
        &self.filter
    }

    /// The body Azure is sent: `filter` (the narrowed one, or for what is computed over
    /// documents what the caller may read of it), and the key and stamp of every document
    /// selected beside what the client asked for.
    pub fn body(&self, key_field: &str, filter: &str) -> Vec<u8> {
        let mut body = self.client.clone();
        body.insert("filter".into(), json!(filter));
        if self.kind != Kind::Autocomplete {
            let mut select = self.select.clone().unwrap_or_else(|| match self.kind {
                Kind::Suggest => vec![key_field.to_owned()],
                _ => Vec::new(),
            });
            if !select.is_empty() || self.kind == Kind::Suggest {
                select = with_stamp(select, key_field);
                // In the form the client sent it (suggest's list in the SDK, search's string).
                let listed = match self.client.get("select") {
                    Some(Value::Array(_)) => json!(select),
                    _ => json!(select.join(",")),
                };
                body.insert("select".into(), listed);
            }
        }
        serde_json::to_vec(&body).unwrap_or_default()
    }

    /// Azure's answer with every document the caller may not see dropped (`@search.score`
    /// order kept), what the client did not select cut away, the next page given as the
    /// client's own request, and no link to Azure (`@odata.nextLink`, `@odata.context`).
    pub fn decide(
        &self,
        mut answer: Value,
        index: &str,
        key_field: &str,
        view: &impl PolicyView,
        ctx: &ReadContext<'_>,
        now: DateTime<Utc>,
    ) -> Result<Value, AdapterError> {
        let Some(map) = answer.as_object_mut() else {
            return Err(AdapterError::UpstreamInvalid("not an object".into()));
        };
        // Azure's own address is not the client's to learn.
        map.remove("@odata.nextLink");
        map.remove("@odata.context");
        if let Some(next) = map.remove("@search.nextPageParameters") {
            let mut again = self.client.clone();
            for key in ["skip", "top"] {
                match next.get(key) {
                    Some(v) => again.insert(key.into(), v.clone()),
                    None => again.remove(key),
                };
            }
            map.insert("@search.nextPageParameters".into(), Value::Object(again));
        }
        if self.kind == Kind::Autocomplete {
            return Ok(answer);
        }
        let Some(Value::Array(docs)) = map.get_mut("value") else {
            return Err(AdapterError::UpstreamInvalid("value missing".into()));
        };
        docs.retain(|doc| readable(doc, index, key_field, view, ctx, now));
        let keep_key = self
            .select
            .as_ref()
            .is_none_or(|s| s.iter().any(|n| n == key_field));
        for doc in docs.iter_mut() {
            if let Value::Object(doc) = doc {
                doc.retain(|k, _| !is_stamp_field(k) && (keep_key || k != key_field));
            }
        }
        Ok(answer)
    }
}

/// Whether the caller may see a document Azure answered (its stamp decides, unless an
/// erasure's closure hides it).
pub fn readable(
    doc: &Value,
    index: &str,
    key_field: &str,
    view: &impl PolicyView,
    ctx: &ReadContext<'_>,
    now: DateTime<Utc>,
) -> bool {
    let key = doc[key_field].as_str().unwrap_or_default();
    decide_read_item(view, ctx, index, key, read_stamp(doc).as_ref(), now).is_ok()
}

/// The `(tenant, subject)` of every stamped document of an answer (`value`, or one document).
pub fn owners(answer: &Value) -> BTreeSet<(String, String)> {
    let docs = match answer.get("value") {
        Some(Value::Array(docs)) => docs.iter().collect(),
        _ => vec![answer],
    };
    docs.into_iter()
        .filter_map(read_stamp)
        .map(|s| (s.tenant, s.subject))
        .collect()
}

/// A lookup's `$select` (the key and stamp added to what the client asked for), and what the
/// client asked for (`None`: every retrievable field).
pub fn lookup_select(
    query: Option<&str>,
    key_field: &str,
) -> Result<(Option<String>, Option<Vec<String>>), AdapterError> {
    let mut select = None;
    for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match name.as_ref() {
            "api-version" => {}
            "$select" => select = Some(names(&json!(value), "$select")?),
            other => return Err(invalid(format!("{other} is not passed through Lethe"))),
        }
    }
    let select = select.filter(|s| !s.iter().any(|n| n == "*"));
    let Some(select) = select else {
        return Ok((None, None));
    };
    if let Some(bad) = select
        .iter()
        .find(|n| !canonical_field(n) || is_stamp_field(n))
    {
        return Err(invalid(format!(
            "$select: {bad:?} is not a field of the client's"
        )));
    }
    let sent = with_stamp(select.clone(), key_field).join(",");
    Ok((Some(sent), Some(select)))
}

/// A selection with the key and stamp added, each field once.
fn with_stamp(mut select: Vec<String>, key_field: &str) -> Vec<String> {
    for field in stamp_select(key_field) {
        if !select.contains(&field) {
            select.push(field);
        }
    }
    select
}

/// A looked-up document cut to what the client selected (never the stamp).
pub fn cut_document(mut doc: Value, select: Option<&[String]>) -> Value {
    if let Value::Object(map) = &mut doc {
        map.retain(|k, _| {
            !is_stamp_field(k)
                && k != "@odata.context"
                && select.is_none_or(|s| s.iter().any(|n| n == k) || k.starts_with('@'))
        });
    }
    doc
}

#[cfg(test)]
mod tests;
