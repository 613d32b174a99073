//! Which Azure AI Search request a client sent, from its method and raw path, in both URL forms
//! (`/indexes('x')/docs('k')` as the SDK sends them, `/indexes/x/docs/k` as the REST reference
//! writes them). Every name is canonical before it is used: an index name, a document key.

use hyper::Method;
use percent_encoding::percent_decode_str;

use super::canonical_key;

/// The api-versions whose requests and answers the adapter reads (the SDK 12.0.0 sends
/// 2026-04-01).
pub const API_VERSIONS: [&str; 3] = ["2024-07-01", "2025-09-01", "2026-04-01"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `GET /indexes`.
    ListIndexes,
    /// `POST /indexes`.
    CreateIndex,
    /// `GET /indexes('x')`.
    GetIndex(String),
    /// `PUT /indexes('x')`: create or update.
    PutIndex(String),
    /// `DELETE /indexes('x')`: every tenant's documents would go with it.
    DeleteIndex,
    Docs(String, Docs),
    /// A name that is not canonical (an index name, a document key).
    NonCanonical,
    /// Anything else (indexers, skillsets, synonym maps, aliases, data sources, statistics,
    /// the analyzer): not passed through.
    Refused,
}

/// A request on an index's documents. `get`: sent as a GET with its parameters in the query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Docs {
    Index,
    Search { get: bool },
    Suggest { get: bool },
    Autocomplete { get: bool },
    Count,
    Lookup(String),
}

/// Whether an index name is one Azure takes: lowercase letters, digits and `-`, beginning with a
/// letter or digit, at most 128 characters.
pub fn canonical_index(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The name inside `('...')` (percent-decoded: the SDK encodes a key whole), or after `/`.
fn named(rest: &str) -> Option<(Option<String>, &str)> {
    if let Some(quoted) = rest.strip_prefix("('") {
        let end = quoted.find("')")?;
        let name = percent_decode_str(&quoted[..end]).decode_utf8().ok()?;
        return Some((Some(name.into_owned()), &quoted[end + 2..]));
    }
    if let Some(plain) = rest.strip_prefix('/') {
        let end = plain.find('/').unwrap_or(plain.len());
        let name = percent_decode_str(&plain[..end]).decode_utf8().ok()?;
        return Some((Some(name.into_owned()), &plain[end..]));
    }
    Some((None, rest))
}

pub fn classify(method: &Method, path: &str) -> Endpoint {
    let Some(after) = path.strip_prefix("/indexes") else {
        return Endpoint::Refused;
    };
    let Some((index, rest)) = named(after) else {
        return Endpoint::NonCanonical;
    };
    let Some(index) = index else {
        return match (method, rest) {
            (&Method::GET, "") => Endpoint::ListIndexes,
            (&Method::POST, "") => Endpoint::CreateIndex,
            _ => Endpoint::Refused,
        };
    };
    if !canonical_index(&index) {
        return Endpoint::NonCanonical;
    }
    let docs = |op| Endpoint::Docs(index.clone(), op);
    let get = method == Method::GET;
    match (method, rest) {
        (&Method::GET, "") => return Endpoint::GetIndex(index),
        (&Method::PUT, "") => return Endpoint::PutIndex(index),
        (&Method::DELETE, "") => return Endpoint::DeleteIndex,
        (&Method::POST, "/docs/search.index" | "/docs/index") => return docs(Docs::Index),
        (&Method::POST, "/docs/search.post.search") => return docs(Docs::Search { get: false }),
        (&Method::GET, "/docs") => return docs(Docs::Search { get: true }),
        (&Method::POST, "/docs/search.post.suggest") => {
            return docs(Docs::Suggest { get: false });
        }
        (&Method::POST, "/docs/search.post.autocomplete") => {
            return docs(Docs::Autocomplete { get: false });
        }
        (&Method::GET | &Method::POST, "/docs/search") => return docs(Docs::Search { get }),
        (&Method::GET | &Method::POST, "/docs/suggest") => return docs(Docs::Suggest { get }),
        (&Method::GET | &Method::POST, "/docs/autocomplete") => {
            return docs(Docs::Autocomplete { get });
        }
        (&Method::GET, "/docs/$count") => return docs(Docs::Count),
        _ => {}
    }
    let Some(after_docs) = rest.strip_prefix("/docs") else {
        return Endpoint::Refused;
    };
    match (method, named(after_docs)) {
        (&Method::GET, Some((Some(key), ""))) if canonical_key(&key) => docs(Docs::Lookup(key)),
        (&Method::GET, _) => Endpoint::NonCanonical,
        _ => Endpoint::Refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_url_forms_name_the_same_endpoint() {
        let docs = |op| Endpoint::Docs("episodes".into(), op);
        let cases: &[(Method, &str, Endpoint)] = &[
            (Method::GET, "/indexes", Endpoint::ListIndexes),
            (Method::POST, "/indexes", Endpoint::CreateIndex),
            (
                Method::GET,
                "/indexes('episodes')",
                Endpoint::GetIndex("episodes".into()),
            ),
            (
                Method::PUT,
                "/indexes/episodes",
                Endpoint::PutIndex("episodes".into()),
            ),
            (
                Method::DELETE,
                "/indexes('episodes')",
                Endpoint::DeleteIndex,
            ),
            (
                Method::POST,
                "/indexes('episodes')/docs/search.index",
                docs(Docs::Index),
            ),
            (
                Method::POST,
                "/indexes/episodes/docs/index",
                docs(Docs::Index),
            ),
            (
                Method::POST,
                "/indexes('episodes')/docs/search.post.search",
                docs(Docs::Search { get: false }),
            ),
            (
                Method::GET,
                "/indexes/episodes/docs",
                docs(Docs::Search { get: true }),
            ),
            (
                Method::POST,
                "/indexes/episodes/docs/search",
                docs(Docs::Search { get: false }),
            ),
            (
                Method::GET,
                "/indexes/episodes/docs/suggest",
                docs(Docs::Suggest { get: true }),
            ),
            (
                Method::POST,
                "/indexes('episodes')/docs/search.post.autocomplete",
                docs(Docs::Autocomplete { get: false }),
            ),
            (
                Method::GET,
                "/indexes('episodes')/docs/$count",
                docs(Docs::Count),
            ),
            (
                Method::GET,
                "/indexes('episodes')/docs('ep-1%3D')",
                docs(Docs::Lookup("ep-1=".into())),
            ),
            (
                Method::GET,
                "/indexes/episodes/docs/ep-1",
                docs(Docs::Lookup("ep-1".into())),
            ),
        ];
        for (method, path, expected) in cases {
            assert_eq!(&classify(method, path), expected, "{method} {path}");
        }
    }

    #[test]
    fn other_apis_and_hostile_names_are_refused() {
        for (method, path) in [
            (Method::GET, "/indexers"),
            (Method::POST, "/indexers('x')/search.run"),
            (Method::GET, "/skillsets"),
            (Method::GET, "/synonymmaps"),
            (Method::GET, "/aliases"),
            (Method::GET, "/datasources"),
            (Method::GET, "/servicestats"),
            (Method::GET, "/indexes('episodes')/search.stats"),
            (Method::POST, "/indexes('episodes')/search.analyze"),
            (Method::DELETE, "/indexes('episodes')/docs('ep-1')"),
            (Method::PUT, "/indexes"),
        ] {
            assert_eq!(
                classify(&method, path),
                Endpoint::Refused,
                "{method} {path}"
            );
        }
        for (method, path) in [
            (Method::GET, "/indexes('Episodes')"),
            (Method::GET, "/indexes('ep'isodes')/docs/$count"),
            (Method::GET, "/indexes('episodes"),
            (Method::GET, "/indexes('episodes')/docs('a%27b')"),
            (Method::GET, "/indexes('episodes')/docs('_x')"),
            (Method::GET, "/indexes('episodes')/docs('a%2Fb')"),
            (Method::GET, "/indexes('episodes')/docs('%FF')"),
            (Method::GET, "/indexes/other%2F..%2Fx/docs"),
        ] {
            assert_eq!(
                classify(&method, path),
                Endpoint::NonCanonical,
                "{method} {path}"
            );
        }
    }
}
